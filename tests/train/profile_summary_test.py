"""scripts/bench/trace_summary.py reads what `fsdptrain launch --profile` writes, and its GPU
accounting (busy fraction, idle gaps, kernel kinds, products by input dtype) is right on a trace
whose answer is known.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts/bench"))
import trace_summary  # noqa: E402


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    return 0 if ok else 1


def synthetic(before=()):
    """Two steps of 1000 us on the host; GPU kernels busy 600 of the 1000 us from 100 to 1100, after
    the kernels `before` the window (the step before's, still running when the trace began)."""
    ev = list(before) + [{"ph": "X", "cat": "user_annotation", "name": "step 3", "ts": 0, "dur": 500},
          {"ph": "X", "cat": "user_annotation", "name": "step 4", "ts": 500, "dur": 500},
          {"ph": "X", "cat": "user_annotation", "name": "optimizer", "ts": 400, "dur": 50},
          # Launches: the first gemm outside any named range (the autograd thread's), the second
          # inside the optimizer's range under aten::_fused_adamw_; the others' launches are not in
          # the trace (queued before it began).
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 50, "dur": 5, "tid": 2,
           "args": {"correlation": 1}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::_fused_adamw_", "ts": 410, "dur": 30, "tid": 1},
          # The first gemm's host op, with the input dtypes --profile records.
          {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 45, "dur": 20, "tid": 2,
           "args": {"Input type": ["c10::BFloat16", "c10::BFloat16"], "Input Dims": [[8, 4], [4, 8]]}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 420, "dur": 5, "tid": 1,
           "args": {"correlation": 2}},
          {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": 100, "dur": 300, "args": {"correlation": 1}},
          {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "ts": 350, "dur": 100,  # overlaps: +50
           "args": {"correlation": 2}},
          {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "ts": 600, "dur": 150, "args": {"correlation": 3}},
          {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather", "ts": 1000, "dur": 100}]
    for e in ev:
        if e.get("cat") == "user_annotation":
            e["tid"] = 1
    return trace_summary.summarize(ev, top=5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    args = ap.parse_args()
    failures = 0
    s = synthetic()
    failures += check(abs(s["gpu_busy_fraction"] - 0.6) < 1e-9, f"busy fraction 0.6: {s['gpu_busy_fraction']}")
    failures += check(s["longest_gaps_ms"][:2] == [0.25, 0.15], f"gaps 250 and 150 us: {s['longest_gaps_ms']}")
    kinds = s["kinds_ms_per_step"]
    failures += check(abs(kinds["matmul"] - 0.2) < 1e-9 and abs(kinds["attention"] - 0.075) < 1e-9
                      and abs(kinds["NCCL"] - 0.05) < 1e-9, f"kinds per step: {kinds}")
    failures += check(s["top_kernels"][0]["calls_per_step"] == 1.0, "two gemm calls over two steps")
    scopes = s["gpu_ms_by_scope"]
    failures += check(scopes == {"backward (no named range)": 0.15, "launched before the trace began": 0.125,
                                 "optimizer": 0.05}, f"GPU time by the range that launched it: {scopes}")
    failures += check(any(r["scope"] == "optimizer" and r["op"] == "aten::_fused_adamw_" for r in s["top_launches"]),
                      f"the optimizer's gemm under its host op: {s['top_launches']}")
    failures += check(s["products_by_dtype"] == [{"op": "aten::mm", "input_types": "c10::BFloat16, c10::BFloat16",
                                                  "calls_per_step": 0.5, "gpu_ms_per_step": 0.15}],
                      f"the products by input dtype, with the GPU time their launches took: {s['products_by_dtype']}")
    early = synthetic([{"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "ts": -300, "dur": 250}])
    failures += check(abs(early["gpu_busy_fraction"] - 0.6) < 1e-9 and early["kinds_ms_per_step"] == kinds,
                      f"a kernel from before the window counts neither as busy nor in the kinds: {early}")

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [args.fsdptrain, "launch", "--config", os.path.join(ROOT, "configs/quickstart.yaml"),
               "--main_process_port", "0", "--num_processes", "1", "--set", "train.steps=5",
               "--set", "train.sequence_length=32", "--set", "logging.metrics_file=",
               "--set", "logging.tensorboard_dir=", "--set", "checkpoint.export_dir=",
               "--set", "logging.profile_steps=2,3", "--set", f"logging.profile_dir={tmp}/p",
               "--set", f"train.output_dir={tmp}/run"]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        failures += check(r.returncode == 0, "fsdptrain --profile ran" + ("" if r.returncode == 0 else r.stderr[-2000:]))
        out = os.path.join(tmp, "summary.json")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/bench/trace_summary.py"),
                            f"{tmp}/p/rank0.steps-2-3.json", "--json", out], capture_output=True, text=True)
        print(r.stdout[-1500:], r.stderr[-1500:])
        failures += check(r.returncode == 0, "trace_summary read the trace")
        if r.returncode == 0:
            got = json.load(open(out))
            ranges = got["host_ranges_ms_per_step"]
            failures += check(got["steps"] == 2 and "gpu_busy_fraction" not in got, "2 steps, no GPU part on CPU")
            failures += check(all(k in ranges for k in ("step N", "forward micro-batch 0", "optimizer")),
                              "the host ranges are there")
            failures += check(0 < ranges["optimizer"] < ranges["step N"] <= got["wall_ms_per_step"] * 1.001,
                              "each range within its step")
            # --profile records each op's input dtypes: the quickstart's fp32 products say so.
            products = got["products_by_dtype"]
            failures += check(any(r["input_types"].startswith("float, float") for r in products) and
                              all(r["input_types"] != "unrecorded" for r in products),
                              f"the trace says which products ran in which dtype: {products}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
