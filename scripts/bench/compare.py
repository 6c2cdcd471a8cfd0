"""One command, three trainers, the same Llama shapes, batch, steps and tokens, in one invocation:

  1. fsdptrain (the built-in trainer, `fsdptrain launch`);
  2. `accelerate launch` with the same YAML running a minimal transformers LlamaForCausalLM loop
     (scripts/bench/hf_accelerate_train.py);
  3. PyTorch FSDP2 (fully_shard) in Python, eager and with torch.compile (scripts/bench/fsdp2_train.py).

Prints a markdown table of tokens/s per device, MFU, peak device memory and step-time spread, with
each figure against fsdptrain's, and writes it with the raw numbers to --out-dir (results.json,
results.md). Synthetic tokens (uniform over the vocabulary, seeded) in an llm.c shard all three read.
On CPU (--cpu, a check that the three run) Accelerate does not apply FSDP: its row says so.

    python scripts/bench/compare.py                       # the ~1B Llama, sequence 2048, bf16, GPUs
    python scripts/bench/compare.py --cpu --model-config configs/models/tiny/config.json \
        --sequence-length 64 --micro-batch-size 4 --steps 8 --warmup 2 --world-size 2   # a CPU check
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


def flops_per_token(c, seq_len):
    """6 N' + 12 L H D T (PaLM / torchtitan): N' leaves out the input embedding unless it is tied."""
    L, C, F, V = c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, K = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    D = c.get("head_dim") or C // H
    per_layer = C * H * D + 2 * C * K * D + H * D * C + 3 * C * F + 2 * C
    n = L * per_layer + C + V * C  # layers, final norm, head (or the tied embedding)
    return 6 * n + 12 * L * H * D * seq_len


def write_tokens(path, count, vocab, seed):
    rng = np.random.default_rng(seed)
    header = np.zeros(256, dtype=np.int32)
    big = vocab > 65535
    header[0], header[1], header[2] = (20240801 if big else 20240520), 1, count
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, vocab, size=count, dtype=np.uint32 if big else np.uint16).tobytes())


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


def summarize(name, step_times, tokens_per_step, world, peak, fpt, peak_flops):
    median = statistics.median(step_times)
    tps = tokens_per_step / median / world
    return {"name": name, "tokens_per_s_per_device": tps, "mfu": fpt * tps / peak_flops if peak_flops else None,
            "peak_memory_bytes": peak, "step_time_median_s": median, "step_time_min_s": min(step_times),
            "step_time_max_s": max(step_times), "timed_steps": len(step_times)}


def target_rows(results):
    """Issue 13's targets, each met or not, from one run's figures (fsdptrain against the others)."""
    def find(test):
        return next((r for r in results if test(r["name"])), None)
    base = find(lambda n: n == "fsdptrain")
    if base is None:
        return ["targets: fsdptrain did not run"]
    by = {"accelerate": find(lambda n: n.startswith("accelerate")), "fsdp2-compile": find(lambda n: "compile" in n)}
    by = {k: v for k, v in by.items() if v is not None}

    def row(what, ok, value):
        return f"- {'met' if ok else 'NOT met'}: {what} ({value})"
    out = []
    for name, want in (("accelerate", 1.15), ("fsdp2-compile", 1.0)):
        if name in by:
            ratio = base["tokens_per_s_per_device"] / by[name]["tokens_per_s_per_device"]
            out.append(row(f"tokens/s >= {want}x {name}'s", ratio >= want, f"{ratio:.2f}x"))
    if "accelerate" in by and by["accelerate"]["peak_memory_bytes"]:
        ratio = base["peak_memory_bytes"] / by["accelerate"]["peak_memory_bytes"]
        out.append(row("peak memory <= 0.9x accelerate's", ratio <= 0.9, f"{ratio:.2f}x"))
    if base["mfu"] is not None:
        out.append(row("MFU >= 50 % of the dense bf16 peak", base["mfu"] >= 0.5, f"{100 * base['mfu']:.1f} %"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    ap.add_argument("--only", default="fsdptrain,accelerate,fsdp2,fsdp2-compile")
    args = ap.parse_args()
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
    only = args.only.split(",")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data, yaml = os.path.join(tmp, "tokens.bin"), os.path.join(tmp, "bench.yaml")
        write_tokens(data, S * B * T * world + T + 1, config["vocab_size"], 0)
        write_accelerate_yaml(yaml, world, args.cpu, mixed)
        common = ["--model-config", args.model_config, "--data", data, "--steps", str(S), "--warmup", str(args.warmup),
                  "--micro-batch-size", str(B), "--sequence-length", str(T)]

        if "fsdptrain" in only:
            metrics = os.path.join(tmp, "fsdptrain.jsonl")
            sets = {"model.config": args.model_config, "data.path": data, "data.eval_fraction": "0",
                    "train.steps": S, "train.micro_batch_size": B, "train.sequence_length": T,
                    "schedule.warmup_steps": 0, "logging.metrics_file": metrics,
                    "checkpoint.dir": "none", "checkpoint.export_dir": "none",  # timing only: save nothing
                    # Each logged step reads the device (the others never wait for it): log every
                    # `warmup` steps, so each timed line is the mean step time of that many steps.
                    "logging.interval": max(1, args.warmup)}
            cmd = [args.fsdptrain, "launch", "--config", yaml, "--main_process_port", "0"]
            for k, v in sets.items():
                cmd += ["--set", f"{k}={v}"]
            if run("fsdptrain", cmd, os.path.join(args.out_dir, "fsdptrain.log")):
                lines = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l]
                timed = [l for l in lines if l["step"] > args.warmup] or lines
                results.append(summarize("fsdptrain", [l["step_time_s"] for l in timed], B * T * world, world,
                                         max(l["peak_memory_bytes"] for l in lines), fpt,
                                         peak_flops))
        scripts = []
        if "accelerate" in only:
            accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
            scripts.append(("accelerate", [accelerate, "launch", "--config_file", yaml,
                                           os.path.join(ROOT, "scripts/bench/hf_accelerate_train.py")]))
        for name, extra in (("fsdp2", []), ("fsdp2-compile", ["--compile"])):
            if name in only:
                scripts.append((name, [sys.executable, os.path.join(ROOT, "scripts/bench/fsdp2_train.py"),
                                       "--world-size", str(world), "--mixed-precision", mixed] + extra +
                                (["--cpu"] if args.cpu else [])))
        for name, cmd in scripts:
            out = os.path.join(tmp, name + ".json")
            if run(name, cmd + common + ["--out", out], os.path.join(args.out_dir, name + ".log")):
                r = json.load(open(out))
                results.append(summarize(r["name"], r["step_times_s"], r["tokens_per_step"], r["world_size"],
                                         r["peak_memory_bytes"], fpt, peak_flops))

    base = next((r for r in results if r["name"] == "fsdptrain"), None)
    gib = 1024.0 ** 3
    rows = [f"Llama {args.model_config}, sequence {T}, micro batch {B} x {world} process(es), {mixed}, {S} steps "
            f"({args.warmup} warm-up steps not timed), {'CPU' if args.cpu else torch.cuda.get_device_name(0)}", "",
            "| trainer | tokens/s per device | fsdptrain vs it | MFU | peak memory | fsdptrain's / its | "
            "step time median (min-max) |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        speed = base["tokens_per_s_per_device"] / r["tokens_per_s_per_device"] if base else float("nan")
        mem = base["peak_memory_bytes"] / r["peak_memory_bytes"] if base and r["peak_memory_bytes"] else float("nan")
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a"
        rows.append(f"| {r['name']} | {r['tokens_per_s_per_device']:,.0f} | {speed:.2f}x | {mfu} | "
                    f"{r['peak_memory_bytes'] / gib:.2f} GiB | {mem:.2f} | {1000 * r['step_time_median_s']:.1f} ms "
                    f"({1000 * r['step_time_min_s']:.1f}-{1000 * r['step_time_max_s']:.1f}) |")
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
