"""PyTorch FSDP2 reference: what fsdptrain's built-in trainer computes, written with torch's own
fully_shard and Hugging Face transformers' LlamaForCausalLM (or the folder's own family: Mistral,
Qwen2, Qwen3), on CPU over Gloo.

It reads the same inputs as a fsdptrain run (a Hugging Face folder to start from, an llm.c token
shard) and reproduces the trainer's choices: the held-out split and the loader's order (Fisher-Yates
over SplitMix64, lib/data/dataset.h), rank r reading the r-th block of micro_batch_size sequences of
each step; the loss as the mean over the global batch's tokens; AdamW with weight decay on
parameters of two or more dimensions only; global-norm clipping; linear warmup then cosine (or
linear, or constant) decay to lr * min_lr_ratio (lib/optim/schedule.h).

    python scripts/reference/fsdp2_llama.py --model HF_DIR --data TOKENS.bin --steps 20 \
        --world-size 2 --micro-batch-size 4 --sequence-length 32 --out losses.json

writes {"losses": [...], "grad_norms": [...]} (one per step, as fsdptrain's metrics file reports them).

With --tp N the model is first split by PyTorch's own tensor parallel (DTensor's parallelize_module
over the mesh's "tp" dimension, the plan TorchTitan uses for Llama: ColwiseParallel q/k/v and
gate/up, RowwiseParallel o and down with sequence-parallel outputs, SequenceParallel norms (Qwen3's
q/k norms over the head dimension), a vocabulary-split embedding and head, loss_parallel), then
fully_shard over the "dp" dimension: the mesh (dp, tp), tp innermost, as fsdptrain's
parallelism_config_tp_size. The ranks of one tp group read the same batch.

With --adapter PEFT_DIR the model is PEFT's PeftModel over that adapter (is_trainable: its LoRA
matrices and modules_to_save train, the rest is frozen), as fsdptrain's lora.init starts from it;
--save-adapter DIR writes the trained adapter's tensors; --dump-gradients DIR writes each step's
full gradients (before clipping) as DIR/step-N.safetensors under fsdptrain's names, as
fsdptrain's engine.dump_gradients does.

With --serve (alone) it reads requests on standard input and runs each in a forked child, importing
torch, transformers and PEFT once for all of them (see serve(); tests/support/reference_server.py
is its client).
"""
import argparse
import contextlib
import io
import json
import math
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MASK = (1 << 64) - 1


def splitmix64(state):
    """Yields SplitMix64 outputs from `state` (the loader's seed * 1000003 + epoch)."""
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        yield z ^ (z >> 31)


def permutation(count, seed, epoch):
    order = list(range(count))
    rng = splitmix64((seed * 1000003 + epoch) & MASK)
    for i in range(count - 1, 0, -1):
        j = next(rng) % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def read_llmc_shard(path):
    header = np.fromfile(path, dtype=np.int32, count=256)
    magic, count = int(header[0]), int(header[2])
    dtype = {20240520: np.uint16, 20240801: np.uint32}[magic]
    return np.fromfile(path, dtype=dtype, offset=256 * 4, count=count).astype(np.int64)


def learning_rate(args, step):
    if args.warmup_steps > 0 and step <= args.warmup_steps:
        return args.lr * step / args.warmup_steps
    min_lr = args.lr * args.min_lr_ratio
    p = min(max((step - args.warmup_steps) / max(1, args.steps - args.warmup_steps), 0.0), 1.0)
    if args.schedule == "cosine":
        return min_lr + (args.lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))
    if args.schedule == "linear":
        return args.lr - (args.lr - min_lr) * p
    return args.lr


def our_name(name):
    """PEFT's parameter name as fsdptrain names it: no wrapper prefix, no adapter name, the trained
    copy of a module to save under the module's own name."""
    name = name.removeprefix("base_model.model.")
    return name.replace(".modules_to_save.default", "").replace(".default.", ".")


def dump_gradients(model, folder, step, rank):
    from safetensors.torch import save_file
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[our_name(name)] = g.detach().clone().contiguous()
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
        save_file(grads, os.path.join(folder, f"step-{step}.safetensors"))


def tensor_parallel(model, tp_mesh):
    """DTensor tensor parallel with sequence parallel over tp_mesh (Llama, Mistral, Qwen2, Qwen3)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    # The embedding's sum over the ranks stays whole (Replicate), so transformers' positions and masks
    # see the whole sequence; the first layer takes its sequence block.
    parallelize_module(model, tp_mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "model.layers.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                             use_local_output=True),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for layer in model.model.layers:
        plan = {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        }
        if hasattr(layer.self_attn, "q_norm"):  # Qwen3: each rank normalizes its own heads (dim 2)
            plan["self_attn.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["self_attn.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        parallelize_module(layer, tp_mesh, plan)


def balance_routers(model, coeff):
    """Auxiliary-loss-free balancing as TorchTitan runs it, on transformers' Qwen3-MoE routers: each
    router chooses its top k by softmax + a per-expert bias (its weights stay the softmax's) and
    counts the rows each expert receives; step() (before the optimizer's) sums the counts over the
    ranks and moves each bias by coeff x sign(mean - count), centred. Returns step()."""
    import types
    import torch.nn.functional as F
    routers = [m for m in model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]
    assert routers, "--load-balance-coeff needs a Qwen3-MoE model"

    def forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(hidden_states, self.weight)
        probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
        index = torch.topk(probs + self.selection_bias, self.top_k, dim=-1).indices
        top = probs.gather(-1, index)
        if self.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        with torch.no_grad():
            self.routed += torch.bincount(index.reshape(-1), minlength=self.num_experts).float()
        return logits, top.to(logits.dtype), index

    for r in routers:
        r.selection_bias = torch.zeros(r.num_experts, dtype=torch.float32)
        r.routed = torch.zeros(r.num_experts, dtype=torch.float32)
        r.forward = types.MethodType(forward, r)

    def step():
        counts = torch.stack([r.routed for r in routers])
        dist.all_reduce(counts)
        for r, c in zip(routers, counts):
            delta = coeff * torch.sign(c.mean() - c)
            r.selection_bias += delta - delta.mean()
            r.routed.zero_()
        return counts.sum(0).tolist()
    return step


def worker(rank, args, port):
    # The first thing this forked rank does: take ATen's thread pool over on this thread. A pool the
    # parent made is marked stale by fork and replaced by whichever thread asks for it first; when
    # that was two of autograd's threads at once, one got none and the rank aborted ("Invalid thread
    # pool!": 5 of 50 runs under --serve, whose ranks are forked twice; none of 40 with this line).
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.world_size)
    torch.manual_seed(0)
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(args.model)
    # Gemma 4's and GLM-4.5's have no router_aux_loss_coef.
    moe = hasattr(config, "router_aux_loss_coef") or getattr(config, "enable_moe_block", False) or \
        hasattr(config, "n_routed_experts")
    # A mixture of experts: transformers' own loop over the experts (its grouped products take no float64).
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype), attn_implementation="sdpa",
                                                 **({"experts_implementation": "eager"} if moe else {}))
    hf = model
    if args.adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, args.adapter, is_trainable=True)
    balance = balance_routers(hf, args.load_balance_coeff) if args.load_balance_coeff > 0 else None
    loads = []
    reshard = {"true": True, "false": False}.get(args.reshard_after_forward)
    if reshard is None:
        reshard = int(args.reshard_after_forward)  # partial resharding: stay sharded over N ranks
    dp_mesh = None
    if args.tp > 1:
        from torch.distributed.device_mesh import init_device_mesh
        shard = args.world_size // args.tp // args.dp_replicate
        mesh = init_device_mesh("cpu", (args.dp_replicate, shard, args.tp),
                                mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
        tensor_parallel(hf, mesh["tp"])
        # HSDP over (dp_replicate, dp_shard) when there are replicas: the 3-D case.
        dp_mesh = mesh["dp_replicate", "dp_shard"] if args.dp_replicate > 1 else mesh["dp_shard"]
    for layer in hf.model.layers:
        fully_shard(layer, reshard_after_forward=reshard, mesh=dp_mesh)
    fully_shard(model, reshard_after_forward=reshard, mesh=dp_mesh)
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, foreach=False)

    tokens = read_llmc_shard(args.data)
    T, B, W = args.sequence_length, args.micro_batch_size, args.world_size // args.tp
    data_rank = rank // args.tp  # the tp ranks of one group read the same batch
    sequences = (len(tokens) - 1) // T
    held_out = max(1, int(sequences * args.eval_fraction)) if args.eval_fraction > 0 else 0
    train_count = sequences - held_out
    epoch, offset = 0, 0
    order = permutation(train_count, args.seed, epoch)
    losses, grad_norms = [], []
    for step in range(1, args.steps + 1):
        if offset + B * W > train_count:
            epoch, offset = epoch + 1, 0
            order = permutation(train_count, args.seed, epoch)
        rows = [order[offset + data_rank * B + i] for i in range(B)]
        offset += B * W
        windows = np.stack([tokens[s * T:s * T + T + 1] for s in rows])
        x, y = torch.from_numpy(windows[:, :-1]), torch.from_numpy(windows[:, 1:])
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args, step)
        if args.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel
            with loss_parallel():
                logits = model(input_ids=x, use_cache=False).logits
                loss_sum = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                                             reduction="sum")
                (loss_sum / (B * T)).backward()
            total = loss_sum.detach().full_tensor().clone()
        else:
            out = model(input_ids=x)
            logits = out.logits
            loss_sum = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                                         reduction="sum")
            # Each rank's mean over its tokens; fully_shard averages the gradients over the ranks. A
            # mixture of experts with output_router_logits adds its auxiliary loss, as transformers'
            # own loss does (the logged loss stays the cross-entropy).
            objective = loss_sum / (B * T)
            if getattr(out, "aux_loss", None) is not None:
                objective = objective + hf.config.router_aux_loss_coef * out.aux_loss
            objective.backward()
            total = loss_sum.detach().clone()
        dist.all_reduce(total)
        total /= args.tp  # a tp group's ranks computed the same loss
        if args.dump_gradients:
            dump_gradients(model, args.dump_gradients, step, rank)
        norm = torch.nn.utils.clip_grad_norm_(trainable, args.grad_clip if args.grad_clip > 0 else float("inf"))
        grad_norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
        if balance:
            loads.append(balance())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total.item() / (B * T * W))
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.6f}", flush=True)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "grad_norms": grad_norms, **({"expert_loads": loads} if loads else {})}, f)
    if args.save_adapter:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            from peft import get_peft_model_state_dict
            from safetensors.torch import save_file
            os.makedirs(args.save_adapter, exist_ok=True)
            adapter = get_peft_model_state_dict(model, state_dict=full)
            save_file({k: v.contiguous() for k, v in adapter.items()},
                      os.path.join(args.save_adapter, "adapter_model.safetensors"), metadata={"format": "pt"})
    # Every rank leaves together: a rank tearing Gloo down while another still works aborted it
    # ("terminate called without an active exception") about one run in ten.
    dist.barrier()
    dist.destroy_process_group()
    # Even so, rank 1 aborted the same way once more (CI, 2026-11-24) after its last step: in the
    # interpreter's exit, as c10d's C++ objects are destroyed after rank 0's store has gone. The work
    # is done and written, so leave without running those destructors.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="Hugging Face folder with the initial weights")
    ap.add_argument("--data", required=True, help="llm.c token shard (.bin)")
    ap.add_argument("--out", required=True, help="JSON file for the losses")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--sequence-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-fraction", type=float, default=0.05)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--schedule", choices=["cosine", "linear", "constant"], default="cosine")
    ap.add_argument("--warmup-steps", type=int, default=10)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--reshard-after-forward", default="true",
                    help="fully_shard's reshard_after_forward: true, false, or N ranks (partial resharding)")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor parallel size: DTensor's parallelize_module over the mesh's innermost dimension")
    ap.add_argument("--dp-replicate", type=int, default=1, help="with --tp: HSDP replicas (the 3-D mesh)")
    ap.add_argument("--adapter", help="a PEFT LoRA folder to train (PeftModel.from_pretrained, is_trainable)")
    ap.add_argument("--save-adapter", help="write the trained adapter's tensors here (adapter_model.safetensors)")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                    help="float64: the same training in double precision, a measure of float32's rounding")
    ap.add_argument("--load-balance-coeff", type=float, default=0.0,
                    help="auxiliary-loss-free balancing of Qwen3-MoE's routers (TorchTitan's load_balance_coeff)")
    ap.add_argument("--dump-gradients", help="write each step's full gradients here (step-N.safetensors)")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    torch.set_num_threads(1)
    preload(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Forked, the ranks share the modules imported above instead of each importing torch's and
    # transformers' Python again (about 5 s of one core a rank; W = 8 spent more on that than on
    # training). No torch kernel has run in this process, so no thread pool is forked half-made.
    mp.start_processes(worker, args=(args, port), nprocs=args.world_size, join=True, start_method="fork")


def preload(args):
    """Imports what every rank uses (transformers, the folder's model class, FSDP, DTensor's tensor
    parallel, PEFT with an adapter) once, before the ranks are forked."""
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
    MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(args.model))]  # the lookup imports its module
    if args.adapter:
        import peft  # noqa: F401


def serve():
    """--serve: runs one training per request from a process that imports torch, transformers and
    PEFT once. Each line on standard input is a JSON object {"argv": [...], "output": FILE}; the
    training runs as `fsdp2_llama.py ARGV` would, in a child forked for it, its standard output and
    error written to FILE, and its exit status comes back as a line {"returncode": N}. A test that
    runs many references pays the imports (about 6 s of one core) once instead of once each.
    End of input ends the server."""
    # Answers go to a copy of standard output; anything else the server prints (a library's notice
    # at import) goes to standard error, where it cannot be taken for an answer.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        request = json.loads(line)
        try:  # the imports this request's model needs stay in the server for the next one
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                preload(parser().parse_args(request["argv"]))
        except (SystemExit, Exception):  # noqa: BLE001 - the child reports the same error in its output
            pass
        pid = os.fork()
        if pid == 0:
            answers.close()  # this child and its ranks hold no end of the answers' pipe
            code = 1
            try:
                fd = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                main(request["argv"])
                code = 0
            except SystemExit as e:  # as the interpreter exits: a code, or a message and 1
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - reported in the output, as an uncaught error would be
                import traceback
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=answers, flush=True)


if __name__ == "__main__":
    serve() if sys.argv[1:] == ["--serve"] else main()
