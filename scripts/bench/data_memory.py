"""A worker's memory does not grow with the dataset: the tiny model trains for a few steps on 2
CPU ranks, once on --small-mb of llm.c shards and once on --large-mb, and the peak resident memory
each rank reports (logging.metrics_file's peak_memory_bytes, rank 0, and `[train]` lines) is
compared. Shards are read in place with pread, so the difference stays far below the data's size.

  python scripts/bench/data_memory.py --fsdptrain build/apps/fsdptrain/fsdptrain [--large-mb 3000]
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np


def write_shards(folder, megabytes, files=3):
    os.makedirs(folder)
    tokens = int(megabytes * 1e6 / 2)
    rng = np.random.default_rng(0)
    for k in range(files):
        n = tokens // files
        header = np.zeros(256, dtype=np.int32)
        header[:3] = [20240520, 1, n]
        with open(os.path.join(folder, f"part_{k:03d}.bin"), "wb") as f:
            f.write(header.tobytes())
            for start in range(0, n, 1 << 26):  # 128 MB at a time
                f.write(rng.integers(0, 257, size=min(1 << 26, n - start), dtype=np.uint16).tobytes())
    return tokens // files * files


def peak(fsdptrain, source, folder, out):
    metrics = os.path.join(out, os.path.basename(folder) + ".jsonl")
    subprocess.run([fsdptrain, "launch", "--config", os.path.join(source, "configs", "quickstart.yaml"),
                    "--main_process_port", "0", "--set", f"data.path={folder}/part_*.bin", "--set", "train.steps=20",
                    "--set", "logging.interval=1", "--set", f"logging.metrics_file={metrics}",
                    "--set", "data.eval_fraction=0", "--set", "checkpoint.export_dir=",
                    "--set", "train.output_dir=" + os.path.join(out, "run_" + os.path.basename(folder))],
                   check=True, capture_output=True,
                   text=True)
    return max(json.loads(l)["peak_memory_bytes"] for l in open(metrics) if "peak_memory_bytes" in l)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--small-mb", type=float, default=3)
    ap.add_argument("--large-mb", type=float, default=3000)
    a = ap.parse_args()
    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as d:
        rows = []
        for mb in (a.small_mb, a.large_mb):
            folder = os.path.join(d, f"data_{int(mb)}mb")
            tokens = write_shards(folder, mb)
            rows.append((mb, tokens, peak(a.fsdptrain, source, folder, d)))
    for mb, tokens, p in rows:
        print(f"{mb:8.0f} MB of shards ({tokens} tokens): rank 0 peak resident memory {p / 2**20:.1f} MiB")
    diff = (rows[1][2] - rows[0][2]) / 2**20
    print(f"difference: {diff:.1f} MiB for {rows[1][0] - rows[0][0]:.0f} MB more data (W = 2)")


if __name__ == "__main__":
    main()
