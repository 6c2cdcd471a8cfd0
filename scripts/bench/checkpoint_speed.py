"""Checkpoint save and load throughput of fsdptrain beside `dd`'s, for the same bytes on the same
disk, in one run.

Per case (model config, world size, SHARDED_STATE_DICT and FULL_STATE_DICT), on CPU:
  1. `fsdptrain launch` trains 2 steps and saves a checkpoint after each (checkpoint.interval 1);
     its lines "[ckpt] saved DIR (...) in X s; training waited Y s" give each save's time (from the
     start of the save to the folder renamed into place, fsynced) and how long the training loop was
     blocked; both are shown, and save/dd is the first's. The staging buffer every save copies into
     is reserved before step 1 (the line "[ckpt] ... reserved for saves on rank 0 (X s)"): its time
     is shown beside them, since on a virtual machine whose host backs memory as it is first
     touched that is most of what a first save would otherwise pay;
  2. a second launch resumes from the last (checkpoint.resume=latest, nothing left to train); its
     line "[ckpt] loaded DIR (...) in Z s" gives the load time;
  3. the checkpoint folder's bytes (every file in it), then dd writing as many through the page
     cache, `dd if=/dev/zero of=<checkpoint.dir>/dd.bin bs=16M count=ceil(bytes/16M) conv=fsync`,
     and past it (oflag=direct, as fsdptrain's SHARDED saves write where the file system allows),
     and reading that file both ways (`dd if=<it> of=/dev/null bs=16M`, and with iflag=direct).
save/dd and load/dd divide by the faster of dd's two ways. Reads come from the disk: before
fsdptrain's load and before dd's buffered read the files' pages are dropped from the page cache
(posix_fadvise DONTNEED after a sync; no root needed). With --warm they are not, and both read what
their write left in the page cache (memory-bound reads, not the disk's; and unequal once training's
own memory pushed a checkpoint out of the cache). SHARDED saves write one file per rank at once;
FULL saves are written by rank 0 alone, or by every rank into the same files when all run on one
machine; dd is one writer. GB is 1e9 bytes.

Prints a markdown table and, with --json PATH, writes the numbers there.

Shapes: the default is the ~125M Llama (configs/models/llama-125m) on 2 ranks. configs/models has
no ~350M Llama; the largest shape that fits a 2-core, 24 GiB machine at 2 ranks is the ~0.5B
Qwen2.5 (configs/models/qwen2.5-0.5b, 494M parameters: 16 B/param of fp32 parameters, gradients
and AdamW's two states is 7.9 GB over both ranks, plus each writer's host copy of its part while
saving; the trainer reported a peak of 8.0 GiB per rank, 16 GiB of the 24). The ~1B Llama
(configs/models/llama-1b, 1.24B parameters: 19.8 GB before the save's copies) does not fit.
The data are synthetic tokens (an llm.c shard written here), so any vocabulary works.

    .venv/bin/python scripts/bench/checkpoint_speed.py [--model-config configs/models/qwen2.5-0.5b/config.json]
        [--type FULL_STATE_DICT] [--set fsdp_config.fsdp_cpu_ram_efficient_loading=false] [--world-size 2] [--fsdptrain build/apps/fsdptrain/fsdptrain] [--dir /tmp] [--json results.json]
"""
import argparse
import array
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
BLOCK = 16 * 1024 * 1024
# lib/ckpt/checkpointer.cpp, with util's format_seconds ("%.2f s" under 1 s, "%.1f s" under 100 s)
SAVED = re.compile(r"\[ckpt\] saved (\S+) \((.*?)\) in ([0-9.]+) s; training waited ([0-9.]+) s")
RESERVED = re.compile(r"\[ckpt\] .* of (?:pinned )?host memory reserved for saves on rank 0 \(([0-9.]+) s\)")
LOADED = re.compile(r"\[ckpt\] loaded (\S+) \((.*?)\) in ([0-9.]+) s")
DD = re.compile(r"^(\d+) bytes .* copied, ([0-9.eE+-]+) s", re.M)


def write_tokens(path, count, vocab):
    """An llm.c token shard (lib/data/token_shard.h) of `count` uniform tokens, as
    scripts/bench/compare.py writes it: uint16 up to a vocabulary of 65,536, uint32 above."""
    magic, version, code = (20240520, 1, "H") if vocab <= 65536 else (20240801, 7, "I")
    header = array.array("i", [magic, version, count] + [0] * 253)
    rng = random.Random(0)
    tokens = array.array(code, (rng.randrange(vocab) for _ in range(count)))
    if sys.byteorder == "big":
        header.byteswap()
        tokens.byteswap()
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def launch(args, model, world, sets, log):
    """One `fsdptrain launch` on CPU; returns its output (stdout and stderr), raising on failure."""
    cmd = [args.fsdptrain, "launch", "--config", os.path.join(ROOT, "configs/quickstart.yaml"),
           "--main_process_port", "0", "--num_processes", str(world)]
    base = {"model.config": model, "data.path": args.tokens, "data.eval_fraction": 0,
            "train.micro_batch_size": 1, "train.sequence_length": 128,
            "train.eval_interval": 0, "train.eval_batches": 1, "logging.interval": 1,
            "checkpoint.export_dir": ""}
    for k, v in (base | sets | dict(s.split("=", 1) for s in args.set)).items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n" + r.stdout)
    if r.returncode != 0:
        tail = "\n".join(r.stdout.splitlines()[-15:])
        raise RuntimeError(f"fsdptrain exited {r.returncode}:\n{tail}")
    return r.stdout, time.monotonic() - t0


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def dd(src, dst, extra):
    """Runs dd; returns (bytes, seconds) as dd reports them."""
    r = subprocess.run(["dd", f"if={src}", f"of={dst}", f"bs={BLOCK // (1024 * 1024)}M"] + extra,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ | {"LC_ALL": "C"})
    m = DD.search(r.stderr)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"dd {src} -> {dst} failed (exit {r.returncode}): {r.stderr.strip()}")
    return int(m.group(1)), float(m.group(2))


def evict(path):
    """Drops `path`'s pages (a file, or every file under a folder) from the page cache, so the next read
    comes from the disk. Needs no root: posix_fadvise on clean pages (os.sync() first makes them clean)."""
    os.sync()
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure(args, model, world, kind, scratch, logs):
    tag = f"{os.path.basename(os.path.dirname(model))}-w{world}-{kind.split('_')[0].lower()}"
    ckpt = os.path.join(scratch, tag, "checkpoints")
    common = {"fsdp_config.fsdp_state_dict_type": kind, "checkpoint.dir": ckpt, "train.steps": 2,
              "checkpoint.interval": 1, "checkpoint.keep": 1}
    out, save_wall = launch(args, model, world, common | {"train.output_dir": os.path.join(scratch, tag, "run-save")},
                            logs and os.path.join(logs, tag + "-save.log"))
    saves = SAVED.findall(out)
    if len(saves) != 2:
        raise RuntimeError(f"{tag}: {len(saves)} '[ckpt] saved' lines, not 2:\n" + "\n".join(out.splitlines()[-15:]))
    reserved = RESERVED.search(out)
    if not reserved:
        raise RuntimeError(f"{tag}: no '[ckpt] ... reserved for saves' line:\n" + "\n".join(out.splitlines()[-15:]))
    folder = saves[-1][0]
    size = folder_bytes(folder)
    if not args.warm:
        evict(folder)
    out, load_wall = launch(args, model, world, common | {"checkpoint.resume": "latest",
                                                          "train.output_dir": os.path.join(scratch, tag, "run-load")},
                            logs and os.path.join(logs, tag + "-load.log"))
    loaded = LOADED.search(out)
    if not loaded:
        raise RuntimeError(f"{tag}: no '[ckpt] loaded' line:\n" + "\n".join(out.splitlines()[-15:]))
    blob = os.path.join(ckpt, "dd.bin")
    count = f"count={math.ceil(size / BLOCK)}"
    w_bytes, w_s = dd("/dev/zero", blob, [count, "conv=fsync"])
    if not args.warm:
        evict(blob)
    r_bytes, r_s = dd(blob, "/dev/null", [])
    os.remove(blob)
    wd_bytes, wd_s = dd("/dev/zero", blob, [count, "oflag=direct", "conv=fsync"])
    rd_bytes, rd_s = dd(blob, "/dev/null", ["iflag=direct"])
    shutil.rmtree(os.path.join(scratch, tag))
    (save_s, waited_s), (next_s, next_waited_s) = [(float(x[2]), float(x[3])) for x in saves]
    load_s = float(loaded.group(3))
    gb = 1e9
    dd_write = max(w_bytes / w_s, wd_bytes / wd_s) / gb
    dd_read = max(r_bytes / r_s, rd_bytes / rd_s) / gb
    return {"model_config": model, "world_size": world, "state_dict_type": kind, "checkpoint_bytes": size,
            "save_detail": saves[0][1], "save_s": save_s, "training_waited_s": waited_s,
            "reserve_s": float(reserved.group(1)), "next_save_s": next_s, "next_training_waited_s": next_waited_s, "load_s": load_s,
            "save_gb_per_s": size / save_s / gb if save_s else None,
            "load_gb_per_s": size / load_s / gb if load_s else None,
            "dd_write_bytes": w_bytes, "dd_write_s": w_s, "dd_write_gb_per_s": w_bytes / w_s / gb,
            "dd_direct_write_s": wd_s, "dd_direct_write_gb_per_s": wd_bytes / wd_s / gb,
            "dd_read_bytes": r_bytes, "dd_read_s": r_s, "dd_read_gb_per_s": r_bytes / r_s / gb,
            "dd_direct_read_s": rd_s, "dd_direct_read_gb_per_s": rd_bytes / rd_s / gb,
            "save_over_dd": size / save_s / gb / dd_write if save_s else None,
            "load_over_dd": size / load_s / gb / dd_read if load_s else None,
            "save_launch_wall_s": round(save_wall, 2), "load_launch_wall_s": round(load_wall, 2)}


def table(results, scratch_fs, warm):
    reads = ("Reads follow the writes, so both read from the page cache." if warm else
             "Both reads come from the disk (the files' pages dropped from the page cache first).")
    rows = [f"fsdptrain checkpoints against dd on the same disk ({scratch_fs}); CPU, 2 training steps with a save "
            f"after each, sequence 128, micro batch 1. {reads} dd's columns are through the page cache / past it "
            "(direct); save/dd and load/dd divide by the faster, and save/dd is the first save's. GB = 1e9 bytes.", "",
            "| model | ranks | type | size GB | reserve s | save s (first / next) | save GB/s | dd write GB/s | save/dd "
            "| training waited s (first / next) | load s | load GB/s | dd read GB/s | load/dd |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    f = lambda x: f"{x:.2f}" if x is not None else "n/a"  # noqa: E731
    for r in results:
        rows.append(f"| {os.path.basename(os.path.dirname(r['model_config']))} | {r['world_size']} | "
                    f"{r['state_dict_type'].split('_')[0]} | {r['checkpoint_bytes'] / 1e9:.2f} | {r['reserve_s']:.2f} | "
                    f"{r['save_s']:.2f} / {r['next_save_s']:.2f} | {f(r['save_gb_per_s'])} | "
                    f"{r['dd_write_gb_per_s']:.2f} / {r['dd_direct_write_gb_per_s']:.2f} | {f(r['save_over_dd'])} | "
                    f"{r['training_waited_s']:.2f} / {r['next_training_waited_s']:.2f} | "
                    f"{r['load_s']:.2f} | {f(r['load_gb_per_s'])} | "
                    f"{r['dd_read_gb_per_s']:.2f} / {r['dd_direct_read_gb_per_s']:.2f} | {f(r['load_over_dd'])} |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-config", action="append", help="repeatable (default: the ~125M Llama)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--fsdptrain", default=os.path.join(ROOT, "build/apps/fsdptrain/fsdptrain"))
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="where the checkpoints and dd's file go (a scratch folder is made and removed inside)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--warm", action="store_true", help="read from the page cache (no eviction before the reads)")
    ap.add_argument("--logs", help="keep each launch's output in this folder")
    ap.add_argument("--type", choices=TYPES, action="append", help="only this fsdp_state_dict_type (repeatable)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config value for every launch (repeatable), as fsdptrain's --set")
    args = ap.parse_args()
    args.fsdptrain = os.path.abspath(args.fsdptrain)
    models = args.model_config or ["configs/models/llama-125m/config.json"]
    scratch = tempfile.mkdtemp(prefix="fsdptrain_ckpt_speed.", dir=args.dir)
    fs = subprocess.run(["df", "--output=source,fstype", scratch], capture_output=True, text=True).stdout.split()
    fs_name = " ".join(fs[-2:]) if len(fs) >= 2 else scratch
    args.tokens = os.path.join(scratch, "tokens.bin")  # rewritten per model (its vocabulary)
    logs = args.logs
    if logs:
        os.makedirs(logs, exist_ok=True)
    results, failed = [], []
    try:
        for model in models:
            write_tokens(args.tokens, 64 * 128 + 1, json.load(open(os.path.join(ROOT, model)))["vocab_size"])
            for kind in args.type or TYPES:
                print(f"== {model}, {args.world_size} ranks, {kind}", file=sys.stderr, flush=True)
                try:
                    results.append(measure(args, model, args.world_size, kind, scratch, logs))
                except RuntimeError as e:
                    failed.append(str(e))
                    print(e, file=sys.stderr)
        text = table(results, fs_name, args.warm)
        print(text)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"filesystem": fs_name, "block_bytes": BLOCK, "results": results, "failed": failed},
                          f, indent=2)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
