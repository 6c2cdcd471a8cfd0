"""Where a profiled step's time goes, from a trace `fsdptrain launch --profile` wrote.

    python scripts/bench/trace_summary.py profile/rank0.steps-3-4.json [--top 15] [--json OUT.json]

Prints, per traced step (the mean over the window):
  - on a GPU: the time the GPU was busy (the union of its kernels and copies) against the wall time,
    the idle gaps where it waited for the host (the longest ones, with the host range they fall in),
    the time in each kind of kernel (matmul, attention, NCCL, norm/rotary/SwiGLU and other
    elementwise, loss, optimizer, copies), the top kernels by total time, and the GPU time by what
    launched it (fsdptrain's named range, the outermost host op, the kernel);
  - everywhere: the matrix products by their inputs' dtypes (the trace's "Input type"), with the GPU
    time each kind took; the host ops by self time (summed over threads: on CPU, which ops the step's time
    went to) and the host time in each of fsdptrain's named ranges (step, forward/backward
    micro-batch, fsdp gather/reduce, optimizer, ...).
"""
import argparse
import collections
import json
import re
import sys

# Kernel kinds, first match wins (names of cuBLAS/CUTLASS/cuDNN/flash/NCCL/ATen kernels).
KINDS = [
    ("NCCL", r"nccl"),
    ("attention", r"flash|fmha|attention|sdpa|cudnn.*(mha|sdp)"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|matmul|sm\d+_.*(tensorop|hmma)|cublas"),
    ("loss", r"cross_entropy|log_softmax|softmax|nll_loss"),
    ("optimizer", r"adam|_foreach|multi_tensor"),
    ("copy", r"memcpy|memset|copy_kernel|direct_copy|Memcpy|Memset"),
    ("reduction", r"reduce_kernel|sum_kernel|norm_kernel"),
    ("elementwise (norm, rotary, SwiGLU, casts)", r"elementwise|vectorized|unrolled|silu|mul_|add_|pow|rsqrt|cat"),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def gaps(intervals, lo, hi):
    """Idle stretches of the device inside [lo, hi] (microseconds), longest first."""
    out, cursor = [], lo
    for s, e in sorted(intervals):
        if s > cursor:
            out.append((cursor, s))
        cursor = max(cursor, e)
    if hi > cursor:
        out.append((cursor, hi))
    return sorted(out, key=lambda g: g[0] - g[1])


def op_self_times(events):
    """Each host op's self time (its duration less the ops it called, on the same thread) and calls:
    on CPU, where the step's time goes op by op. Nested user ranges are not subtracted."""
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and "dur" in e:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    self_us, calls = collections.defaultdict(float), collections.defaultdict(int)
    for ops in by_thread.values():
        ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in ops:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                self_us[stack[-1]["name"]] -= e["dur"]
            self_us[e["name"]] += e["dur"]
            calls[e["name"]] += 1
            stack.append(e)
    return self_us, calls


def enclosing(spans, ts, pick):
    """The span of (start, end, name) in `spans` that holds ts, by `pick` (min or max on the length)."""
    holding = [sp for sp in spans if sp[0] <= ts <= sp[1]]
    return pick(holding, key=lambda sp: sp[1] - sp[0])[2] if holding else None


def by_scope(events, device, n, top):
    """GPU time by what launched each kernel: the innermost named range on the launching thread
    (fsdp gather/reduce, optimizer, grad norm, forward; the autograd thread's launches have none and
    count as the backward) and the outermost host op there (aten::addmm, autograd's node)."""
    launches = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = (e.get("tid"), e["ts"])
    ranges, ops = collections.defaultdict(list), collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        span = (e["ts"], e["ts"] + e["dur"], e["name"])
        if e.get("cat") == "user_annotation" and not re.fullmatch(r"(step \d+|ProfilerStep#\d+)", e["name"]):
            ranges[e.get("tid")].append(span)
        elif e.get("cat") == "cpu_op":
            ops[e.get("tid")].append(span)
    scopes, rows = collections.defaultdict(float), collections.defaultdict(lambda: [0.0, 0])
    for e in device:
        launch = launches.get(e.get("args", {}).get("correlation"))
        tid, ts = launch if launch else (None, None)
        if launch is None:
            scope = "launched before the trace began"
        else:
            scope = enclosing(ranges[tid], ts, min)
            scope = re.sub(r"model\.layers\.\d+", "model.layers.N", scope) if scope else "backward (no named range)"
        op = (enclosing(ops[tid], ts, max) if launch else None) or "-"
        scopes[scope] += e["dur"]
        row = rows[(scope, op, e["name"][:80])]
        row[0] += e["dur"]
        row[1] += 1
    return ({k: v / n / 1e3 for k, v in sorted(scopes.items(), key=lambda kv: -kv[1])},
            [{"scope": k[0], "op": k[1], "kernel": k[2], "ms_per_step": v[0] / n / 1e3, "calls_per_step": v[1] / n}
             for k, v in sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]])


# Matrix products as the trace names their host ops (ATen's, oneDNN's on the CPU).
PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "mkldnn::_linear_pointwise")


def products_by_dtype(events, device, n):
    """Each product op by its inputs' dtypes (the trace's "Input type", which fsdptrain's --profile
    records): calls per step, and on a GPU the kernel time its launches took (a kernel counts for the
    innermost product op on the thread that launched it)."""
    launches = {e["args"]["correlation"]: (e.get("tid"), e["ts"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    spans, rows = collections.defaultdict(list), collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("name") in PRODUCTS and "dur" in e:
            types = e.get("args", {}).get("Input type", [])  # the tensors' dtypes; not the scalars' types
            types = [t for t in types if t and t != "Scalar" and not t.endswith("List")]
            key = (e["name"], ", ".join(types) or "unrecorded")
            spans[e.get("tid")].append((e["ts"], e["ts"] + e["dur"], key))
            rows[key][0] += 1
    for e in device:
        launch = launches.get(e.get("args", {}).get("correlation"))
        key = enclosing(spans[launch[0]], launch[1], min) if launch else None
        if key:
            rows[key][1] += e["dur"]
    return [{"op": k[0], "input_types": k[1], "calls_per_step": v[0] / n, "gpu_ms_per_step": v[1] / n / 1e3}
            for k, v in sorted(rows.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))]


def summarize(events, top):
    steps = [e for e in events if e.get("cat") == "user_annotation" and re.fullmatch(r"step \d+", e.get("name", ""))]
    if not steps:
        raise SystemExit("no 'step N' range in the trace: is it one fsdptrain --profile wrote?")
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    n = len(steps)
    device = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    ranges = collections.defaultdict(float)
    for e in events:
        if e.get("cat") == "user_annotation" and "dur" in e:
            ranges[re.sub(r"\d+", "N", e["name"]) if e["name"].startswith("step ") else e["name"]] += e["dur"]
    self_us, calls = op_self_times(events)
    window = [e for e in device if e["ts"] >= lo]
    out = {"steps": n, "wall_ms_per_step": (hi - lo) / n / 1e3,
           "host_ranges_ms_per_step": {k: v / n / 1e3 for k, v in sorted(ranges.items(), key=lambda kv: -kv[1])},
           "host_ops_ms_per_step": sum(self_us.values()) / n / 1e3,
           "top_host_ops": [{"name": k, "self_ms_per_step": v / n / 1e3, "calls_per_step": calls[k] / n}
                            for k, v in sorted(self_us.items(), key=lambda kv: -kv[1])[:top]],
           "products_by_dtype": products_by_dtype(events, window, n)}
    if device:
        # The window a step's work ran in on the GPU: from the first kernel after the first step began
        # to the last kernel (the host runs ahead, so the GPU's window ends later than the host's).
        first = min((e["ts"] for e in device if e["ts"] >= lo), default=lo)
        last = max(e["ts"] + e["dur"] for e in device)
        intervals = [(e["ts"], e["ts"] + e["dur"]) for e in device]
        # Busy is the window less its idle gaps. Kernels the step before queued, still running when
        # the trace began, start before `first`: they count neither as busy time nor in the kinds.
        idle = gaps(intervals, first, last)
        busy = (last - first) - sum(b - a for a, b in idle)
        kinds, kernels = collections.defaultdict(float), collections.defaultdict(lambda: [0.0, 0])
        for e in (e for e in device if e["ts"] >= first):
            kinds[kind_of(e["name"])] += e["dur"]
            kernels[e["name"]][0] += e["dur"]
            kernels[e["name"]][1] += 1
        out.update({
            "gpu_window_ms_per_step": (last - first) / n / 1e3,
            "gpu_busy_fraction": busy / (last - first) if last > first else 0.0,
            "kinds_ms_per_step": {k: v / n / 1e3 for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "top_kernels": [{"name": k[:120], "ms_per_step": v[0] / n / 1e3, "calls_per_step": v[1] / n}
                            for k, v in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]],
            "longest_gaps_ms": [round((b - a) / 1e3, 3) for a, b in idle[:top]],
        })
        out["gpu_ms_by_scope"], out["top_launches"] = by_scope(events, [e for e in device if e["ts"] >= first], n,
                                                               top * 2)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json", help="also write the summary here")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    s = summarize(events, args.top)
    print(f"{args.trace}: {s['steps']} step(s), {s['wall_ms_per_step']:.2f} ms per step on the host")
    if "gpu_busy_fraction" in s:
        print(f"GPU: {s['gpu_window_ms_per_step']:.2f} ms per step, busy {100 * s['gpu_busy_fraction']:.1f}% "
              f"(idle gaps, longest first, ms: {s['longest_gaps_ms'][:8]})")
        print("\n| kernel kind | ms per step |\n| --- | --- |")
        for k, v in s["kinds_ms_per_step"].items():
            print(f"| {k} | {v:.3f} |")
        print("\n| top kernels | ms per step | calls per step |\n| --- | --- | --- |")
        for k in s["top_kernels"]:
            print(f"| `{k['name']}` | {k['ms_per_step']:.3f} | {k['calls_per_step']:.0f} |")
        print("\n| GPU time by the range that launched it | ms per step |\n| --- | --- |")
        for k, v in list(s["gpu_ms_by_scope"].items())[:args.top]:
            print(f"| {k} | {v:.3f} |")
        print("\n| range | host op | kernel | ms per step | calls per step |\n| --- | --- | --- | --- | --- |")
        for r in s["top_launches"]:
            print(f"| {r['scope']} | `{r['op']}` | `{r['kernel']}` | {r['ms_per_step']:.3f} | {r['calls_per_step']:.0f} |")
    else:
        print("no GPU kernels in the trace (a CPU run): host ops and ranges only")
    if s["products_by_dtype"]:
        print("\n| product | input dtypes | calls per step | GPU ms per step |\n| --- | --- | --- | --- |")
        for r in s["products_by_dtype"][:args.top]:
            print(f"| `{r['op']}` | {r['input_types']} | {r['calls_per_step']:.0f} | {r['gpu_ms_per_step']:.3f} |")
    if s["top_host_ops"]:
        print(f"\nhost ops, self time summed over threads: {s['host_ops_ms_per_step']:.1f} ms per step")
        print("| host op | self ms per step | calls per step |\n| --- | --- | --- |")
        for k in s["top_host_ops"]:
            print(f"| `{k['name']}` | {k['self_ms_per_step']:.1f} | {k['calls_per_step']:.0f} |")
    print("\n| host range | ms per step |\n| --- | --- |")
    for k, v in list(s["host_ranges_ms_per_step"].items())[:args.top * 2]:
        print(f"| {k} | {v:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(s, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
