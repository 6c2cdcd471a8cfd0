"""What the benchmark's Python trainers share: their command line, the token shard they read (the
llm.c .bin fsdptrain reads), which windows a rank takes each step, the transformers model they
build, the step loop that times every trainer the same way, the result file compare.py reads, and
starting W processes.

A trainer that cannot run here (a GPU-only kernel on CPU, a peer package that is not installed, a
peer that does not import on this torch) prints one line "skipped: <why>" and exits SKIP_EXIT (77,
ctest's "skipped"); compare.py lists the row as skipped with that line, and fails only on rows that
ran and failed."""
import json
import os
import resource
import socket
import sys
import time

import numpy as np
import torch
import torch.multiprocessing as mp

SKIP_EXIT = 77


def add_common_args(ap):
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--data", required=True, help="llm.c token shard (.bin)")
    ap.add_argument("--out", required=True, help="JSON file for the measurements (rank 0)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--activation-checkpointing", action="store_true",
                    help="recompute every decoder layer in backward (full per-layer checkpointing, as "
                         "TorchTitan's 'full' mode)")


def skip(reason):
    """Ends a trainer that cannot run here: one line saying why, then SKIP_EXIT."""
    print(f"skipped: {reason}", flush=True)
    sys.exit(SKIP_EXIT)


# llm.c's shard header (lib/data/token_shard.h): magic -> (the version llm.c writes with it, token type).
SHARD_FORMATS = {20240520: (1, np.uint16), 20240801: (7, np.uint32)}


def read_tokens(path):
    """The tokens of an llm.c shard, memory-mapped; refuses the headers fsdptrain refuses."""
    header = np.fromfile(path, dtype="<i4", count=256)
    if len(header) < 256 or int(header[0]) not in SHARD_FORMATS:
        raise ValueError(f"{path}: not an llm.c token shard (no 1024-byte header with magic 20240520 or 20240801)")
    magic, version, count = (int(v) for v in header[:3])
    want, dtype = SHARD_FORMATS[magic]
    if version != want:
        raise ValueError(f"{path}: version {version} with magic {magic}; llm.c writes version {want} there")
    dtype = np.dtype(dtype).newbyteorder("<")
    if os.path.getsize(path) != 1024 + count * dtype.itemsize:
        raise ValueError(f"{path}: the header says {count} tokens of {dtype.itemsize} bytes, but the file has "
                         f"{os.path.getsize(path) - 1024} bytes after the header")
    return np.memmap(path, dtype=dtype, mode="r", offset=1024, shape=(count,))


def batch(tokens, step, rank, world, micro_batch, seq_len):
    """(B, T + 1) int64: rank r's windows of step s, consecutive over the job as fsdptrain's data."""
    windows = (len(tokens) - 1) // seq_len
    rows = [((step * world + rank) * micro_batch + i) % windows for i in range(micro_batch)]
    return np.stack([tokens[r * seq_len:r * seq_len + seq_len + 1].astype(np.int64) for r in rows])


def hf_llama(model_config, device):
    """transformers' causal LM of a config.json (its model_type: LlamaForCausalLM, or Qwen3MoeForCausalLM
    for compare.py's moe shape) with fp32 weights, SDPA attention and no KV cache, built on `device`
    after torch.manual_seed(0): every transformers row starts from the same weights on a given device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    values = json.load(open(model_config))
    config = AutoConfig.for_model(values.pop("model_type", "llama"), **values)
    config.use_cache = False
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


def compile_backend():
    """torch.compile's backend for the compiled rows: Inductor, or (a dry run on CPU,
    scripts/gpu-session.sh session --dry) aot_eager: the same graph capture and autograd tracing
    without Inductor's C++ builds, which a GPU never runs."""
    return os.environ.get("FSDPTRAIN_BENCH_COMPILE_BACKEND", "inductor")


def compiled_name():
    """How a row names torch.compile: with its backend where that is not Inductor."""
    backend = compile_backend()
    return "torch.compile" + ("" if backend == "inductor" else f" ({backend})")


def wrap_layers(model, checkpoint, compile):
    """Full activation checkpointing (torch's checkpoint_wrapper, which TorchTitan's 'full' mode
    applies), then torch.compile, on every decoder layer of a transformers Llama, in TorchTitan's
    order; fully_shard, where a trainer applies it, comes after. Returns the layers."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    backend = compile_backend()
    layers = model.model.layers
    for i in range(len(layers)):
        if checkpoint:
            layers[i] = checkpoint_wrapper(layers[i])
        if compile:
            layers[i].compile(backend=backend)
    return list(layers)


def cross_entropy(logits, x):
    """The mean next-token loss of (B, T, V) logits over (B, T + 1) tokens, in fp32."""
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))


def run_steps(args, step, rank, world, device, reports):
    """Trains args.steps steps, timing each the same way for every trainer: the step's tokens are read
    and moved to `device`, step(x) runs forward, backward and the optimizer on them ((B, T + 1)
    int64) and returns the loss, and loss.item() is the step's one host synchronisation. Returns each
    step's seconds and loss (this rank's tokens); the reporting rank prints every step."""
    tokens = read_tokens(args.data)
    B, T, S = args.micro_batch_size, args.sequence_length, args.steps
    times, losses = [], []
    for s in range(S):
        t0 = time.perf_counter()
        x = torch.from_numpy(batch(tokens, s, rank, world, B, T)).to(device)
        losses.append(step(x).item())  # waits for the step
        times.append(time.perf_counter() - t0)
        if reports:
            print(f"step {s + 1}/{S}: loss {losses[-1]:.4f}, {times[-1] * 1000:.0f} ms", flush=True)
    return times, losses


def peak_memory(device):
    """The GPU allocator's peak; on CPU this process's peak resident set (VmHWM, as fsdptrain reports it)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_result(path, name, times, losses, tokens_per_step, world, peak):
    """The file compare.py reads: every step's seconds and loss (warm-up steps included), the tokens
    one step trains over all ranks, the world size and the peak memory of the reporting rank."""
    with open(path, "w") as f:
        json.dump({"name": name, "step_times_s": times, "losses": losses, "tokens_per_step": tokens_per_step,
                   "world_size": world, "peak_memory_bytes": peak}, f, indent=1)


def spawn(worker, args, world_size):
    """worker(rank, args, port) in world_size processes, with a free port for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=world_size, join=True)
