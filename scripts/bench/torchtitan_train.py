"""TorchTitan 0.3.0, the fastest pure-PyTorch trainer, on our shapes and data: its own Llama 3 model
(torchtitan.models.llama3) set up the way its parallelize_llama sets it up, trained with our plain
loop (common.run_steps) and the same AdamW as fsdp2_train.py, writing every step's time and loss as
JSON (rank 0; common.write_result).

  model      Llama3Model from its Config, its layers from the builder TorchTitan's own flavors call
             (torchtitan.models.llama3._build_llama3_layers: fused wqkv, its complex-number rotary
             with Llama 3 scaling) at our config's widths, untied or tied as the config says (tied as
             its "1B"), and its init (init_states: embeddings N(0, 1), the head's std 1/sqrt(hidden)
             truncated at 3 std, depth-scaled output projections) after torch.manual_seed(0), on the
             device before the parallel steps. TorchTitan builds on the meta device and initializes
             after sharding; torchao's Float8Linear, which replaces its Linear, has no TorchTitan
             init, so the weights come first here (at one rank the memory is the same).
             Attention: TorchTitan's ScaledDotProductAttention module (causal; cuDNN, then flash,
             then math). Its default for language models, FlexAttention, masks documents from
             per-token positions our tokens lack, and autotunes its kernels when compiled (minutes).
  parallel   what parallelize_llama calls for FSDP without tensor or context parallel, in its order:
             FullAC(...).apply (with --activation-checkpointing: every block recomputed, its "full"
             mode), apply_compile (torch.compile on every block, fullgraph), apply_fsdp_to_decoder
             (fully_shard on every block and the root, bf16 parameters, fp32 reduction, no gradient
             division). parallelize_llama itself is not called: it takes its mesh from
             ParallelDims.build_mesh, whose device TorchTitan fixes to CUDA at import; this script
             gives apply_fsdp_to_decoder a 1-D "fsdp" mesh of its own instead.
  loss       our cross-entropy in fp32 over the logits; divided by the world size for backward, since
             apply_fsdp_to_decoder sums the gradients (TorchTitan divides by the global token count).
  --float8   torchao's float8 training, tensorwise (dynamic per-tensor scales) with the weights
             all-gathered in float8 and their scales precomputed after each optimizer step
             (precompute_float8_dynamic_scale_for_fsdp), on every linear of the blocks (never the
             head): torchao.float8.convert_to_float8_training, before the parallel steps, as
             TorchTitan's converters run. TorchTitan 0.3's own Float8LinearConverter offers rowwise
             recipes only. GPUs of compute capability 8.9 and up; on CPU the row is skipped.

On CPU (Gloo, --cpu) it runs one process only: the undivided gradients reduce with
ReduceOp.PREMUL_SUM, which Gloo lacks. On torch 2.11: torchtitan 0.3.0 imports
torch.distributed.fsdp.DataParallelMeshDims, which torch 2.11 lacks; torchtitan passes it on only
with its full-DTensor backend, which this script does not use, so a stand-in name is set before the
import when torch lacks it (the row's name says so). Any other failure to import ends the row with
one line (skipped: ...) naming the exception.

    python scripts/bench/torchtitan_train.py --model-config configs/models/llama-1b/config.json \
        --data tokens.bin --steps 30 --micro-batch-size 2 --sequence-length 2048 --out tt.json   # --float8
"""
import argparse
import importlib
import json
import os
from importlib.metadata import version
from types import SimpleNamespace

import torch
import torch.distributed as dist

from common import add_common_args, cross_entropy, peak_memory, run_steps, skip, spawn, write_result


def import_torchtitan():
    """The torchtitan modules this script uses, and a note when torch needed the stand-in name."""
    import torch.distributed.fsdp as fsdp

    note = ""
    if not hasattr(fsdp, "DataParallelMeshDims"):
        class DataParallelMeshDims:  # the stand-in the docstring explains
            pass
        fsdp.DataParallelMeshDims = DataParallelMeshDims
        note = f", with a stand-in for DataParallelMeshDims (torch {torch.__version__} lacks it)"
    import torchtitan.models.llama3 as llama3
    from torchtitan.config import CompileConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC
    from torchtitan.distributed.compile import apply_compile
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention

    return SimpleNamespace(llama3=llama3, CompileConfig=CompileConfig, ParallelDims=ParallelDims, FullAC=FullAC,
                           apply_compile=apply_compile, apply_fsdp_to_decoder=apply_fsdp_to_decoder,
                           ComplexRoPE=ComplexRoPE, Embedding=Embedding, Linear=Linear, RMSNorm=RMSNorm,
                           SDPA=ScaledDotProductAttention), note


def model_config(tt, c, seq_len):
    """TorchTitan's Llama3Model.Config at the widths of a transformers config.json `c`."""
    llama3 = tt.llama3
    C, H, V = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    scaling = c.get("rope_scaling") or {}
    rope = tt.ComplexRoPE.Config(dim=C // H, max_seq_len=seq_len, theta=c.get("rope_theta", 10000.0))
    if scaling.get("rope_type") == "llama3":
        rope.scaling = "llama"
        rope.scaling_factor = scaling["factor"]
        rope.low_freq_factor = scaling["low_freq_factor"]
        rope.high_freq_factor = scaling["high_freq_factor"]
        rope.original_max_position_embeddings = scaling["original_max_position_embeddings"]
    layers = llama3._build_llama3_layers(n_layers=c["num_hidden_layers"], dim=C, n_heads=H,
                                         n_kv_heads=c.get("num_key_value_heads", H),
                                         hidden_dim=c["intermediate_size"], rope=rope, attn_backend="flex")
    eps = c.get("rms_norm_eps", 1e-5)
    for layer in layers:
        layer.attention.inner_attention = tt.SDPA.Config()
        layer.attention_norm.eps = layer.ffn_norm.eps = eps
    tied = c.get("tie_word_embeddings", False)
    embedding_init = llama3._EMBEDDING_SKIP_INIT if tied else llama3._EMBEDDING_INIT
    return llama3.Llama3Model.Config(
        dim=C, vocab_size=V, enable_weight_tying=tied, layers=layers,
        tok_embeddings=tt.Embedding.Config(num_embeddings=V, embedding_dim=C, param_init=embedding_init),
        norm=tt.RMSNorm.Config(normalized_shape=C, eps=eps, param_init=llama3._NORM_INIT),
        lm_head=tt.Linear.Config(in_features=C, out_features=V, param_init=llama3._output_linear_init(C)))


def worker(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cuda = torch.cuda.is_available() and not args.cpu
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.world_size)
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    from torch.distributed.device_mesh import init_device_mesh

    tt, note = import_torchtitan()
    W = args.world_size
    c = json.load(open(args.model_config))
    torch.manual_seed(0)
    with torch.device(device):
        model = model_config(tt, c, args.sequence_length).build()
        with torch.no_grad():
            model.init_states()
    if args.float8:
        from torchao.float8 import (Float8LinearConfig, convert_to_float8_training,
                                    precompute_float8_dynamic_scale_for_fsdp)

        def in_blocks(module, fqn):  # _scaled_mm needs both dims in multiples of 16
            return fqn.startswith("layers.") and module.in_features % 16 == 0 and module.out_features % 16 == 0
        convert_to_float8_training(model, module_filter_fn=in_blocks,
                                   config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
    if args.activation_checkpointing:
        tt.FullAC.Config().build(dump_folder="").apply(model)
    parallel_dims = tt.ParallelDims(dp_replicate=1, dp_shard=W, cp=1, tp=1, pp=1, ep=1, world_size=W,
                                       spmd_backend="partial_dtensor")
    tt.apply_compile(model, compile_config=tt.CompileConfig(enable=True, components=["model"]),
                        parallel_dims=parallel_dims)
    mesh = init_device_mesh(device.type, (W,), mesh_dim_names=("fsdp",))
    bf16 = args.mixed_precision == "bf16"
    tt.apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16 if bf16 else torch.float32,
                                reduce_dtype=torch.float32, pp_enabled=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)

    def step(x):
        loss = cross_entropy(model(x[:, :-1]), x)
        (loss / W).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.float8:  # the next all-gather's float8 scales, one pass over all weights
            precompute_float8_dynamic_scale_for_fsdp(model)
        return loss

    B, T = args.micro_batch_size, args.sequence_length
    times, losses = run_steps(args, step, rank, W, device, reports=rank == 0)
    if rank == 0:
        name = f"TorchTitan {version('torchtitan')} Llama 3 + torch.compile"
        name += " + float8 tensorwise" if args.float8 else ""
        name += " + full AC" if args.activation_checkpointing else ""
        write_result(args.out, name + note, times, losses, B * T * W, W, peak_memory(device))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--mixed-precision", choices=["bf16", "no"], default="bf16")
    ap.add_argument("--float8", action="store_true", help="torchao's tensorwise float8 training (GPU only)")
    ap.add_argument("--cpu", action="store_true", help="CPU over Gloo even where a GPU exists")
    args = ap.parse_args()
    c = json.load(open(args.model_config))
    if c.get("head_dim", c["hidden_size"] // c["num_attention_heads"]) != c["hidden_size"] // c["num_attention_heads"]:
        skip(f"torchtitan: {args.model_config} has head_dim {c['head_dim']}, not hidden_size / heads, which "
             "TorchTitan's Llama 3 builder assumes")
    cuda = torch.cuda.is_available() and not args.cpu
    if not cuda and args.world_size > 1:
        skip("torchtitan: apply_fsdp_to_decoder's undivided gradients reduce with ReduceOp.PREMUL_SUM, which "
             "Gloo lacks: on CPU it runs one process (--world-size 1)")
    if args.float8 and not (cuda and torch.cuda.get_device_capability() >= (8, 9)):
        skip("torchtitan-float8: float8 products need a GPU of compute capability 8.9 or up"
             + ("" if cuda else "; this run is on the CPU"))
    try:  # in this process first, so that a failure is one line rather than a worker's traceback
        import_torchtitan()
        if args.float8:
            importlib.import_module("torchao.float8")
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("torch."):
            skip(f"torchtitan: {e.name} is not installed here; scripts/bundle-deps.sh wheels bundles it and "
                 "scripts/gpu-session.sh installs it")
        skip(f"torchtitan does not import with torch {torch.__version__}: {type(e).__name__}: {e}")
    except Exception as e:  # any other failure to import on this torch is the row's one line
        skip(f"torchtitan does not import with torch {torch.__version__}: {type(e).__name__}: {e}")
    spawn(worker, args, args.world_size)


if __name__ == "__main__":
    main()
