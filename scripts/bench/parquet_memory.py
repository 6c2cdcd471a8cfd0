"""Host memory while reading Parquet does not grow with the file: `fsdptrain tokenize` reads a
--small-mb and a --large-mb Parquet file of prompt/completion records (row groups of --rows-per-group
rows, as datasets' to_parquet and the Hub's files hold them), and the same records as JSONL, and
each process's peak resident memory (the kernel's ru_maxrss of that child) is printed with the
difference between the sizes. The tokenizer is the fine-tuning example's (a small byte-level BPE
made by scripts/examples/make_finetune_example.py), so the time goes to reading, not encoding.

  python scripts/bench/parquet_memory.py --fsdptrain build/apps/fsdptrain/fsdptrain [--large-mb 3000]

(3,000 MB of these words are about 1 GB of Parquet on disk.)
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = ("the lantern kettle bicycle teapot umbrella violin satchel compass anchor mitten ladder trumpet "
         "lighthouse scarf wagon feather is teal amber crimson violet olive silver indigo coral what color "
         "does have question answer tell me of a an which").split()


def records(rng, n):
    for _ in range(n):
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40))) + "?\n"
        completion = " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 400))) + "."
        yield prompt, completion


def write(folder, megabytes, rows_per_group, seed=0):
    """The same records as Parquet and as JSONL, about `megabytes` of text."""
    rng = random.Random(seed)
    parquet, jsonl = f"{folder}/data_{megabytes:g}mb.parquet", f"{folder}/data_{megabytes:g}mb.jsonl"
    schema = pa.schema([("prompt", pa.string()), ("completion", pa.string())])
    size = 0
    with pq.ParquetWriter(parquet, schema) as w, open(jsonl, "w") as j:
        while size < megabytes * 1e6:
            batch = list(records(rng, rows_per_group))
            size += sum(len(p) + len(c) for p, c in batch)
            w.write_table(pa.table({"prompt": [p for p, _ in batch], "completion": [c for _, c in batch]},
                                   schema=schema))
            j.writelines(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in batch)
    return parquet, jsonl, size


def peak(fsdptrain, tokenizer, path, out):
    """Peak resident memory (bytes) and seconds of one `fsdptrain tokenize`."""
    start = time.time()
    p = subprocess.Popen([fsdptrain, "tokenize", "--tokenizer", tokenizer, "--input", path, "--output", out,
                          "--jobs", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"tokenize {path} failed: {p.stderr.read().decode()}")
    shutil.rmtree(out)
    return usage.ru_maxrss * 1024, time.time() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--small-mb", type=float, default=10)
    ap.add_argument("--large-mb", type=float, default=3000)
    ap.add_argument("--rows-per-group", type=int, default=10000)
    ap.add_argument("--formats", default="Parquet,JSONL", help="which to measure (Parquet, JSONL or both)")
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR", "/tmp")) as d:
        subprocess.run([sys.executable, f"{root}/scripts/examples/make_finetune_example.py", "--out", f"{d}/ex"],
                       check=True, capture_output=True)
        rows = []
        for mb in (a.small_mb, a.large_mb):
            parquet, jsonl, text = write(d, mb, a.rows_per_group)
            for kind, path in (("Parquet", parquet), ("JSONL", jsonl)):
                if kind not in a.formats.split(","):
                    continue
                rss, seconds = peak(a.fsdptrain, f"{d}/ex/model", path, f"{d}/out")
                rows.append((kind, mb, os.path.getsize(path), rss, seconds))
                print(f"{kind:8s} {os.path.getsize(path) / 1e6:8.1f} MB on disk ({text / 1e6:.0f} MB of text): "
                      f"peak resident memory {rss / 2**20:7.1f} MiB, {seconds:.1f} s", flush=True)
            os.remove(parquet)
            os.remove(jsonl)
    for kind in a.formats.split(","):
        small, large = [r for r in rows if r[0] == kind]
        print(f"{kind}: {(large[3] - small[3]) / 2**20:+.1f} MiB of peak memory for "
              f"{(large[2] - small[2]) / 1e6:.0f} MB more file")


if __name__ == "__main__":
    main()
