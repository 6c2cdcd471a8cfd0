"""PyTorch FSDP2 as TorchTitan sets it up: transformers' LlamaForCausalLM with fully_shard on every
decoder layer and the root, bf16 parameters with fp32 reduction (MixedPrecisionPolicy), fused AdamW,
optionally torch.compile on every layer. Trains on the token shard fsdptrain reads, with the same
batch, and writes its measurements as JSON (rank 0).

--offload adds CPUOffloadPolicy(pin_memory=True), as fsdptrain's fsdp_config.fsdp_offload_params:
the sharded parameters, their gradients and AdamW's state live in pinned host memory, each unit's
shard is copied to the GPU for its all-gather and its reduced gradient back, and AdamW steps on the
CPU (LibTorch's fused CPU AdamW kernel, the one fsdptrain's offload calls). As TorchTitan does with
offload, the process group is NCCL for CUDA tensors and Gloo for CPU ones, since gradient clipping
all-reduces the norm of the host gradients. On CPU (--cpu) the shards are on the host already and
pinning needs CUDA: there it runs unpinned, to check that the row runs, and measures nothing of offload.

    python scripts/bench/fsdp2_train.py --model-config configs/models/llama-1b/config.json \
        --data tokens.bin --steps 30 --warmup 5 --micro-batch-size 2 --sequence-length 2048 \
        --world-size 1 --compile --out fsdp2.json   # or --offload
"""
import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist

from common import add_common_args, batch, read_tokens, spawn


def worker(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available() and not args.cpu
    backend = ("cuda:nccl,cpu:gloo" if args.offload else "nccl") if cuda else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=args.world_size)
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**json.load(open(args.model_config)))
    config.use_cache = False
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    bf16 = args.mixed_precision == "bf16"
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32,
                                     reduce_dtype=torch.float32)
    offload_policy = CPUOffloadPolicy(pin_memory=cuda) if args.offload else OffloadPolicy()
    for i, layer in enumerate(model.model.layers):
        if args.compile:
            layer.compile()
        fully_shard(layer, mp_policy=mp_policy, offload_policy=offload_policy)
    fully_shard(model, mp_policy=mp_policy, offload_policy=offload_policy)
    # With offload the shards are CPU tensors, so this is the fused CPU kernel (as fsdptrain's offload).
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=cuda or args.offload)

    tokens = read_tokens(args.data)
    B, T, W = args.micro_batch_size, args.sequence_length, args.world_size
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x = torch.from_numpy(batch(tokens, step, rank, W, B, T)).to(device)
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        times.append(time.perf_counter() - t0)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step + 1}/{args.steps}: loss {value:.4f}, {times[-1] * 1000:.0f} ms", flush=True)
    timed = times[args.warmup:] or times
    # The GPU allocator's peak; on CPU this rank's peak resident set (VmHWM, as fsdptrain reports it).
    peak = torch.cuda.max_memory_allocated(device) if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if rank == 0:
        with open(args.out, "w") as f:
            name = "torch FSDP2" + (" + torch.compile" if args.compile else " (eager)")
            if args.offload:
                name += " + CPU offload" if cuda else " + CPUOffloadPolicy (on CPU: unpinned, a check only)"
            json.dump({"name": name,
                       "step_times_s": timed, "tokens_per_step": B * T * W, "world_size": W,
                       "peak_memory_bytes": peak, "last_loss": value}, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    add_common_args(ap)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--mixed-precision", choices=["bf16", "no"], default="bf16")
    ap.add_argument("--compile", action="store_true", help="torch.compile every decoder layer")
    ap.add_argument("--cpu", action="store_true", help="CPU over Gloo even where a GPU exists")
    ap.add_argument("--offload", action="store_true",
                    help="CPUOffloadPolicy(pin_memory=True): shards, gradients and AdamW's step on the host "
                         "(on CPU: unpinned, a check that it runs)")
    args = ap.parse_args()
    spawn(worker, args, args.world_size)


if __name__ == "__main__":
    main()
