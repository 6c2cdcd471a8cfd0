"""What the benchmark's Python trainers share: their command line, the token shard they read (the
llm.c .bin fsdptrain reads), which windows a rank takes each step, and starting W processes."""
import os
import socket

import numpy as np
import torch.multiprocessing as mp


def add_common_args(ap):
    ap.add_argument("--model-config", required=True)
    ap.add_argument("--data", required=True, help="llm.c token shard (.bin)")
    ap.add_argument("--out", required=True, help="JSON file for the measurements (rank 0)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timings")
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--lr", type=float, default=3e-4)


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


def spawn(worker, args, world_size):
    """worker(rank, args, port) in world_size processes, with a free port for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args, port), nprocs=world_size, join=True)
