"""One command, three trainers, the same Llama shapes, batch, steps and tokens, in one invocation:

  1. fsdptrain (the built-in trainer, `fsdptrain launch`);
  2. `accelerate launch` with the same YAML running a minimal transformers LlamaForCausalLM loop
     (scripts/bench/hf_accelerate_train.py);
  3. PyTorch FSDP2 (fully_shard) in Python, eager and with torch.compile (scripts/bench/fsdp2_train.py).

Prints a markdown table of tokens/s per device, MFU, peak device memory and step-time spread, with
each figure against fsdptrain's, and writes it with the raw numbers to --out-dir (results.json,
results.md). Synthetic tokens (uniform over the vocabulary, seeded) in an llm.c shard all three read.
On CPU (--cpu, a check that the three run) Accelerate does not apply FSDP: its row says so.

Rows (--only picks them; the default is the first four):
  fsdptrain          fsdptrain launch with the YAML
  accelerate         accelerate launch, transformers loop
  fsdp2              fully_shard, eager
  fsdp2-compile      fully_shard, torch.compile on every decoder layer
  fsdptrain-offload  fsdptrain with --set fsdp_config.fsdp_offload_params=true
  fsdp2-offload      fully_shard, eager, CPUOffloadPolicy(pin_memory=True) (fsdp2_train.py --offload)
The two offload rows keep the sharded parameters, gradients and AdamW's state in host memory and
step AdamW there; each -offload row is measured against fsdptrain-offload, the others against
fsdptrain. Their peak memory is the GPU's, as for the others; the host memory they use is not in it.
On CPU the offload rows only check that they run: everything is on the host already.

    python scripts/bench/compare.py                       # the ~1B Llama, sequence 2048, bf16, GPUs
    python scripts/bench/compare.py --cpu --model-config configs/models/tiny/config.json \
        --sequence-length 64 --micro-batch-size 4 --steps 8 --warmup 2 --world-size 2   # a CPU check
    python scripts/bench/compare.py --only fsdptrain,fsdptrain-offload,fsdp2,fsdp2-offload  # offload
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = ("fsdptrain", "accelerate", "fsdp2", "fsdp2-compile", "fsdptrain-offload", "fsdp2-offload")
DEFAULT_ROWS = "fsdptrain,accelerate,fsdp2,fsdp2-compile"


def flops_per_token(c, seq_len):
    """6 N' + 12 L H D T (PaLM / torchtitan): N' leaves out the input embedding unless it is tied."""
    L, C, F, V = c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, K = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    D = c.get("head_dim") or C // H
    per_layer = C * H * D + 2 * C * K * D + H * D * C + 3 * C * F + 2 * C
    n = L * per_layer + C + V * C  # layers, final norm, head (or the tied embedding)
    return 6 * n + 12 * L * H * D * seq_len


# llm.c's token shard, as lib/data/token_shard.h reads it: 256 little-endian int32 (magic, version,
# token count, then zeros), then the tokens. Each magic goes with one version and one token width.
SHARD_UINT16 = (20240520, 1, np.uint16)  # vocabularies up to 65,536 (GPT-2's 50,257)
SHARD_UINT32 = (20240801, 7, np.uint32)  # larger ones (Llama 3's 128,256)


def write_tokens(path, count, vocab, seed):
    """An llm.c shard of `count` tokens drawn uniformly from [0, vocab), seeded; uint16 where they fit,
    as `fsdptrain tokenize` chooses (vocab <= 65,536), uint32 otherwise."""
    if not 0 <= count <= np.iinfo(np.int32).max:
        raise ValueError(f"write_tokens: {count} tokens do not fit the header's int32 count")
    magic, version, dtype = SHARD_UINT16 if vocab <= 65536 else SHARD_UINT32
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, count
    tokens = np.random.default_rng(seed).integers(0, vocab, size=count, dtype=dtype)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.dtype(dtype).newbyteorder("<"), copy=False).tobytes())


def write_accelerate_yaml(path, world, cpu, mixed_precision):
    with open(path, "w") as f:
        f.write(f"""compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: {"'no'" if mixed_precision == "no" else mixed_precision}
num_machines: 1
num_processes: {world}
use_cpu: {"true" if cpu else "false"}
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_cpu_ram_efficient_loading: false
""")


def run(label, cmd, log):
    print(f"== {label}: {' '.join(cmd)}", flush=True)
    t = time.time()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    with open(log, "w") as f:
        f.write(r.stdout + "\n" + r.stderr)
    print(f"   exit {r.returncode} in {time.time() - t:.0f} s (log: {log})", flush=True)
    if r.returncode != 0:
        print("\n".join((r.stdout + r.stderr).splitlines()[-15:]))
        return False
    reporters = sum(line.startswith("step 1/") for line in r.stdout.splitlines())
    if reporters > 1:  # each would write the same results file, and one could cut into the other
        print(f"   {label}: {reporters} processes reported step 1, where only rank 0 should: its results are not used")
        return False
    return True


def summarize(row, name, step_times, tokens_per_step, world, peak, fpt, peak_flops):
    median = statistics.median(step_times)
    tps = tokens_per_step / median / world
    return {"row": row, "name": name, "tokens_per_s_per_device": tps,
            "mfu": fpt * tps / peak_flops if peak_flops else None, "peak_memory_bytes": peak, "step_time_median_s": median, "step_time_min_s": min(step_times),
            "step_time_max_s": max(step_times), "timed_steps": len(step_times)}


def baseline(results, row):
    """The fsdptrain result a row is measured against: fsdptrain-offload for an -offload row, else fsdptrain."""
    want = "fsdptrain-offload" if row.endswith("-offload") else "fsdptrain"
    return next((r for r in results if r["row"] == want), None)


def target_rows(results):
    """The GPU step's targets, each met or not, from one run's figures: fsdptrain against the compiled
    peer and Accelerate, its MFU and peak memory; with CPU offload, its step against fsdptrain's
    without offload (within 2.5x) and against FSDP2's offload (no slower)."""
    by = {r["row"]: r for r in results}
    base, offload = by.get("fsdptrain"), by.get("fsdptrain-offload")
    if base is None and offload is None:
        return ["targets: fsdptrain did not run"]

    def row(what, ok, value):
        return f"- {'met' if ok else 'NOT met'}: {what} ({value})"

    def speed(a, b):
        return a["tokens_per_s_per_device"] / b["tokens_per_s_per_device"]
    out = []
    if base is not None:
        for name, want in (("fsdp2-compile", 1.0), ("accelerate", 1.15)):
            if name in by:
                ratio = speed(base, by[name])
                out.append(row(f"tokens/s >= {want}x {name}'s", ratio >= want, f"{ratio:.2f}x"))
        if by.get("fsdp2-compile", {}).get("peak_memory_bytes"):
            ratio = base["peak_memory_bytes"] / by["fsdp2-compile"]["peak_memory_bytes"]
            out.append(row("peak memory <= fsdp2-compile's", ratio <= 1.0, f"{ratio:.2f}x"))
        if base["mfu"] is not None:
            out.append(row("MFU >= 40 % of the dense bf16 peak", base["mfu"] >= 0.4, f"{100 * base['mfu']:.1f} %"))
    if offload is not None:
        if base is not None:
            ratio = speed(base, offload)
            out.append(row("offloaded step <= 2.5x the step without offload", ratio <= 2.5, f"{ratio:.2f}x"))
        if "fsdp2-offload" in by:
            ratio = speed(offload, by["fsdp2-offload"])
            out.append(row("offloaded tokens/s >= 1.0x fsdp2-offload's", ratio >= 1.0, f"{ratio:.2f}x"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-config", default="configs/models/llama-1b/config.json")
    ap.add_argument("--sequence-length", type=int, default=2048)
    ap.add_argument("--micro-batch-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timings")
    ap.add_argument("--world-size", type=int, default=0, help="processes (default: the GPUs, or 2 with --cpu)")
    ap.add_argument("--mixed-precision", choices=["bf16", "no"], default=None, help="default: bf16 (no with --cpu)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="per device, for MFU (default: 989 on GPU)")
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--fsdptrain", default=os.path.join(ROOT, "build/apps/fsdptrain/fsdptrain"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench-results"))
    ap.add_argument("--only", default=DEFAULT_ROWS,
                    help=f"comma-separated rows, of {', '.join(ROWS)} (default: {DEFAULT_ROWS}); the -offload "
                         "rows keep shards, gradients and AdamW on the host, each against fsdptrain-offload")
    args = ap.parse_args()
    only = args.only.split(",")
    unknown = [name for name in only if name not in ROWS]
    if unknown:
        ap.error(f"--only: unknown row(s) {', '.join(unknown)}; the rows are {', '.join(ROWS)}")
    import torch

    if not args.cpu and torch.cuda.device_count() == 0:
        sys.exit("compare.py: no GPU here, and the default shapes (the ~1B Llama at sequence 2048) would train on "
                 "the CPU until memory runs out. On a GPU machine run it as is; to check the harness on CPU, pass "
                 "--cpu with small shapes: --cpu --model-config configs/models/tiny/config.json "
                 "--sequence-length 32 --micro-batch-size 2 --steps 4 --warmup 1")
    world = args.world_size or (2 if args.cpu else max(1, torch.cuda.device_count()))
    mixed = args.mixed_precision or ("no" if args.cpu else "bf16")
    peak_flops = (args.peak_tflops if args.peak_tflops is not None else (0 if args.cpu else 989)) * 1e12
    os.makedirs(args.out_dir, exist_ok=True)
    config = json.load(open(os.path.join(ROOT, args.model_config)))
    B, T, S = args.micro_batch_size, args.sequence_length, args.steps
    fpt = flops_per_token(config, T)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data, yaml = os.path.join(tmp, "tokens.bin"), os.path.join(tmp, "bench.yaml")
        write_tokens(data, S * B * T * world + T + 1, config["vocab_size"], 0)
        write_accelerate_yaml(yaml, world, args.cpu, mixed)
        common = ["--model-config", args.model_config, "--data", data, "--steps", str(S), "--warmup", str(args.warmup),
                  "--micro-batch-size", str(B), "--sequence-length", str(T)]

        for name, extra in (("fsdptrain", {}), ("fsdptrain-offload", {"fsdp_config.fsdp_offload_params": "true"})):
            if name not in only:
                continue
            metrics = os.path.join(tmp, name + ".jsonl")
            sets = {"model.config": args.model_config, "data.path": data, "data.eval_fraction": "0",
                    "train.steps": S, "train.micro_batch_size": B, "train.sequence_length": T,
                    "schedule.warmup_steps": 0, "logging.metrics_file": metrics,
                    "checkpoint.dir": "none", "checkpoint.export_dir": "none",  # timing only: save nothing
                    # Each logged step reads the device (the others never wait for it): log every
                    # `warmup` steps, so each timed line is the mean step time of that many steps.
                    "logging.interval": max(1, args.warmup)} | extra
            cmd = [args.fsdptrain, "launch", "--config", yaml, "--main_process_port", "0"]
            for k, v in sets.items():
                cmd += ["--set", f"{k}={v}"]
            if run(name, cmd, os.path.join(args.out_dir, name + ".log")):
                lines = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l]
                timed = [l for l in lines if l["step"] > args.warmup] or lines
                label = "fsdptrain" + (" + CPU offload" if extra else "")
                results.append(summarize(name, label, [l["step_time_s"] for l in timed], B * T * world, world,
                                         max(l["peak_memory_bytes"] for l in lines), fpt,
                                         peak_flops))
        scripts = []
        if "accelerate" in only:
            accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
            scripts.append(("accelerate", [accelerate, "launch", "--config_file", yaml,
                                           os.path.join(ROOT, "scripts/bench/hf_accelerate_train.py")]))
        for name, extra in (("fsdp2", []), ("fsdp2-compile", ["--compile"]), ("fsdp2-offload", ["--offload"])):
            if name in only:
                scripts.append((name, [sys.executable, os.path.join(ROOT, "scripts/bench/fsdp2_train.py"),
                                       "--world-size", str(world), "--mixed-precision", mixed] + extra +
                                (["--cpu"] if args.cpu else [])))
        for name, cmd in scripts:
            out = os.path.join(tmp, name + ".json")
            if run(name, cmd + common + ["--out", out], os.path.join(args.out_dir, name + ".log")):
                r = json.load(open(out))
                results.append(summarize(name, r["name"], r["step_times_s"], r["tokens_per_step"], r["world_size"],
                                         r["peak_memory_bytes"], fpt, peak_flops))

    gib = 1024.0 ** 3
    rows = [f"Llama {args.model_config}, sequence {T}, micro batch {B} x {world} process(es), {mixed}, {S} steps "
            f"({args.warmup} warm-up steps not timed), {'CPU' if args.cpu else torch.cuda.get_device_name(0)}", "",
            "| trainer | tokens/s per device | fsdptrain vs it | MFU | peak memory | fsdptrain's / its | "
            "step time median (min-max) |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        base = baseline(results, r["row"])
        # n/a where the fsdptrain row it is measured against did not run
        speed = f"{base['tokens_per_s_per_device'] / r['tokens_per_s_per_device']:.2f}x" if base else "n/a"
        mem = f"{base['peak_memory_bytes'] / r['peak_memory_bytes']:.2f}" if base and r["peak_memory_bytes"] else "n/a"
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a"
        rows.append(f"| {r['name']} | {r['tokens_per_s_per_device']:,.0f} | {speed} | {mfu} | "
                    f"{r['peak_memory_bytes'] / gib:.2f} GiB | {mem} | {1000 * r['step_time_median_s']:.1f} ms "
                    f"({1000 * r['step_time_min_s']:.1f}-{1000 * r['step_time_max_s']:.1f}) |")
    if any(r["row"].endswith("-offload") for r in results):
        rows += ["", "The CPU-offload rows are measured against fsdptrain + CPU offload, the others against fsdptrain"
                 + (" (on CPU the offload rows only check that they run)." if args.cpu else ".")]
    rows += ["", *target_rows(results)]
    table = "\n".join(rows)
    print("\n" + table)
    device = "cpu" if args.cpu else torch.cuda.get_device_name(0)
    # results.*, and a dated copy named after the device to commit (bench-results/2026-11-23-h100.md)
    stem = time.strftime("%Y-%m-%d") + "-" + re.sub(r"[^a-z0-9]+", "-", device.lower().replace("nvidia", "")).strip("-")
    for name in ("results", stem):
        with open(os.path.join(args.out_dir, name + ".md"), "w") as f:
            f.write(table + "\n")
        with open(os.path.join(args.out_dir, name + ".json"), "w") as f:
            json.dump({"settings": vars(args) | {"world_size": world, "mixed_precision": mixed, "device": device,
                                                 "flops_per_token": fpt}, "results": results}, f, indent=2)
    return 0 if len(results) == len(only) else 1


if __name__ == "__main__":
    sys.exit(main())
