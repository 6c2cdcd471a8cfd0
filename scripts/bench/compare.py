"""The trainers users would pick, side by side in one call: the same Llama shapes, batch, steps,
tokens, optimizer and learning rate for every row, each row's log, result and losses kept, the host
recorded around each row, and verdicts against the best peer of the same call.

Rows (--only picks them and their order; GPU-only rows are skipped on --cpu with a line saying so):
  fsdptrain                 fsdptrain launch with the YAML (Accelerate's keys)
  fsdptrain-float8          the same with --set engine.float8=tensorwise (GPU only)
  fsdptrain-float8-rowwise  the same with --set engine.float8=rowwise (GPU only)
  fsdptrain-offload         the same with --set fsdp_config.fsdp_offload_params=true
  compiled                  one process, no FSDP: transformers + torch.compile on every layer, bf16
                            autocast over fp32 weights, fused AdamW (compiled_train.py); the fair peer
                            of fsdptrain at one rank; skipped at a world size above 1
  fsdp2                     fully_shard, eager (fsdp2_train.py)
  fsdp2-compile             fully_shard, torch.compile on every decoder layer
  fsdp2-offload             fully_shard, eager, CPUOffloadPolicy(pin_memory=True)
  torchtitan                TorchTitan 0.3's own Llama 3 model, its activation checkpointing,
                            per-block compile and FSDP2 functions (torchtitan_train.py)
  torchtitan-float8         the same with torchao's tensorwise float8 and float8 all-gather (GPU only)
  liger                     accelerate launch, transformers + Liger's kernels (GPU only)
  accelerate                accelerate launch with the same YAML, transformers loop
Each row's speed is measured against fsdptrain's (fsdp2-offload against fsdptrain-offload,
torchtitan-float8 against fsdptrain-float8). torchtitan, torchtitan-float8 and liger need the wheels
scripts/bundle-deps.sh bundles (scripts/gpu-session.sh installs them); where a peer is not installed
its row says so.

Shapes (--shape; an explicit --model-config, --sequence-length or --micro-batch-size wins):
  1b  configs/models/llama-1b (tied embeddings), sequence 2048, micro batch 2, 30 steps (5 warm-up);
      rows fsdptrain,compiled,torchtitan,fsdp2-compile,liger,accelerate
  8b  Llama 3.1 8B's widths (configs/models/llama3.1-8b) with --layers N of its 32 layers, sequence
      8192, micro batch 1, full activation checkpointing in every trainer (fsdptrain and Accelerate
      through the YAML's fsdp_activation_checkpointing; the Python rows every layer recomputed, as
      TorchTitan's "full" mode), 10 steps (3 warm-up); rows fsdptrain,torchtitan,fsdptrain-float8,
      torchtitan-float8,fsdp2-compile,fsdptrain-float8-rowwise. N defaults to as many layers as fit
      the GPU with full AdamW state at 18 bytes a parameter (fp32 weights, gradients and two moments,
      and a bf16 copy) beside a 24 GiB headroom: the loss head's logits at sequence 8192 over 128,256
      classes (bf16 logits, their fp32 copy, its log-softmax and gradients: about 15 GB in the Python
      rows' cross-entropy), the checkpointed layer inputs and one layer's recompute (about 5 GB), the
      CUDA context and the allocator's slack (about 4 GB). On a 141 GiB H200 that is 26 or 27 layers.
      The config the rows train is written to the out-dir (model-config.json).
  moe Qwen3-30B-A3B's widths (configs/models/qwen3-30b-a3b: 128 experts of 768, top 8, hidden 2048)
      with 4 of its 48 layers (--layers N), sequence 2048, micro batch 2, 20 steps (5 warm-up); rows
      fsdptrain,accelerate,fsdp2 (transformers' Qwen3MoeForCausalLM in the Python rows). MFU counts the
      active experts only; fsdptrain's row names its experts' load at the last step.

Timing: every trainer is timed the same way, one host synchronisation a step: the Python rows read
the loss (loss.item()) at the end of each step; fsdptrain runs with logging.interval=1, so each of its
steps reads the device, and its per-step times come from its metrics file. The first --warmup steps
are left out; tokens/s per device is the tokens of a step over the median step time over the ranks.
Every row steps AdamW (betas 0.9, 0.95, weight decay 0.1, gradients clipped at norm 1) at the constant
--lr (fsdptrain: optimizer.lr and schedule.type=constant without warmup; its weight decay skips the
norms' weights, the Python rows' does not).

MFU: 6 N' + the attention products, per token, over the dense bf16 peak (--peak-tflops, 989 by
default: H100/H200 SXM). N' leaves out the input embedding unless it is tied (TorchTitan's count).
"full" counts attention as TorchTitan and PaLM do, 12 L H D T a token; "causal" half of that, what a
causal kernel computes. The verdicts use full, as TorchTitan's published MFU and this project's
earlier figures do. Activation checkpointing's recompute is not counted (as TorchTitan).

Losses: every row trains the same uniform random tokens, which hold nothing to learn, so each loss
sits near ln V. At init the final norm's output has unit RMS, so each logit is N(0, s2) with s2 =
(the head's weight std)^2 x hidden: s2 = initializer_range^2 x hidden for fsdptrain and the
transformers rows (HF's init), 0.9733 for TorchTitan (std 1/sqrt(hidden) truncated at 3 std), and a
step's loss is ln V + s2/2 on average. On the same tokens, two inits' step losses still differ by a
sampling error of sqrt((s2_a + s2_b) / n) (n tokens of the reporting rank; each token's target logit is
N(0, s2)). A row is flagged DIVERGES when, against its reference (fsdptrain; torchtitan for
torchtitan-float8 where torchtitan ran):
  - a loss is not finite;
  - same init (the fsdptrain rows against fsdptrain, torchtitan-float8 against torchtitan): any step
    differs by more than --loss-tolerance (0.02, bf16 noise: the gpu tests measured bf16 against fp32
    losses of one run within 2.4e-4 relative, 0.003 at a loss of 12; 0.02 leaves a run's drift over
    tens of steps, and is far below what a different learning rate, a missing clip or a different
    loss moves in 10 steps, tenths);
  - another init: the first step differs from the reference's by more than 0.02 + 3 sampling errors
    after the expected offset (s2_row - s2_ref) / 2, or the last step by more than that plus the
    offset's size (training flattens the logits, closing the offset);
  - fsdptrain itself: its first loss is off ln V + s2/2 by more than 0.02 + 3 sqrt(s2 / n).

Host: host.md records lscpu, the library versions (torch, transformers, accelerate, torchtitan,
liger-kernel, torchao, triton) and fsdptrain --version, and before and after each row the load
average, the CPU steal over the row (from /proc/stat) and the GPU's clocks (SM, memory),
temperature and power (nvidia-smi; skipped without one); results.json holds the same.

Verdicts: fsdptrain against the best peer of the call (the highest tokens/s among the rows of the same
kind that are not fsdptrain's: bf16, float8, CPU offload), then the targets: at --shape 1b tokens/s
>= 1.15x the best peer, MFU >= 45 % at micro batch 2 (52 % at 4) and peak memory <= the best peer's;
at --shape 8b tokens/s >= 1.1x TorchTitan compiled in the same call (where it did not run: MFU >=
1.1x its published 39.0 %), float8 tensorwise >= 1.2x fsdptrain's bf16 with its losses within bf16
noise of fsdptrain's at every step; with the offload rows, an offloaded step within 2.5x of the step
without offload and no slower than FSDP2's offload. At 8b TorchTitan's published per-GPU figures
(Llama 3.1 8B, 8 H100s, sequence 8192: 5,762 tokens/s eager, 6,667 compiled, 8,532 compiled +
float8) are printed beside the table with their MFU: compare MFU, as this model has N of 32 layers.

Output (--out-dir, rewritten after every row, so a call cut short keeps the rows that ran): results.md
and results.json with a dated copy named after the device to commit (2026-11-28-h200.md), host.md,
model-config.json, bench.yaml, and each row's log (<row>.log) and result (<row>.json; fsdptrain's
metrics <row>.jsonl and its resolved config runs/<row>/run.json). --row-timeout bounds each row, --budget-s the whole call (a row that would start with
less than 20 s left is skipped). Exits 1 when a row failed or timed out; skipped rows do not fail it.
On CPU (--cpu, a check that the rows run; the numbers mean nothing) Accelerate does not apply FSDP:
its row says so. Where no GPU is visible it refuses at once unless given --cpu.

    python scripts/bench/compare.py                        # the ~1B Llama, sequence 2048, bf16, GPUs
    python scripts/bench/compare.py --shape 8b             # Llama 3.1 8B's layers, as many as fit
    python scripts/bench/compare.py --cpu --model-config configs/models/tiny/config.json \
        --sequence-length 32 --micro-batch-size 2 --steps 4 --warmup 1 --world-size 1 \
        --only fsdptrain,compiled,torchtitan,fsdp2,accelerate                    # a CPU check
    python scripts/bench/compare.py --only fsdptrain,fsdptrain-offload,fsdp2,fsdp2-offload  # offload
"""
import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "scripts/bench")

# name: (kind, extra arguments, why it needs a GPU or None). kind: fsdptrain (its --set keys), a
# Python script, or accelerate (accelerate launch hf_accelerate_train.py).
FLOAT8_GPU = "float8 products need a GPU of compute capability 8.9 or up"
ROWS = {
    "fsdptrain": ("fsdptrain", {}, None),
    "fsdptrain-float8": ("fsdptrain", {"engine.float8": "tensorwise"}, FLOAT8_GPU),
    "fsdptrain-float8-rowwise": ("fsdptrain", {"engine.float8": "rowwise"}, FLOAT8_GPU),
    "fsdptrain-offload": ("fsdptrain", {"fsdp_config.fsdp_offload_params": "true"}, None),
    "compiled": ("compiled_train.py", [], None),
    "fsdp2": ("fsdp2_train.py", [], None),
    "fsdp2-compile": ("fsdp2_train.py", ["--compile"], None),
    "fsdp2-offload": ("fsdp2_train.py", ["--offload"], None),
    "torchtitan": ("torchtitan_train.py", [], None),
    "torchtitan-float8": ("torchtitan_train.py", ["--float8"], FLOAT8_GPU),
    "liger": ("accelerate", ["--liger"], "Liger's kernels are Triton, GPU only"),
    "accelerate": ("accelerate", [], None),
}
# The Python package a peer row needs beyond torch, transformers and accelerate.
PEER_PACKAGES = {"torchtitan": "torchtitan", "torchtitan-float8": "torchtitan", "liger": "liger_kernel"}
SHAPES = {
    "1b": dict(model_config="configs/models/llama-1b/config.json", sequence_length=2048, micro_batch_size=2,
               steps=30, warmup=5, checkpointing=False,
               rows="fsdptrain,compiled,torchtitan,fsdp2-compile,liger,accelerate"),
    "8b": dict(model_config="configs/models/llama3.1-8b/config.json", sequence_length=8192, micro_batch_size=1,
               steps=10, warmup=3, checkpointing=True,
               rows="fsdptrain,torchtitan,fsdptrain-float8,torchtitan-float8,fsdp2-compile,fsdptrain-float8-rowwise"),
    "moe": dict(model_config="configs/models/qwen3-30b-a3b/config.json", sequence_length=2048, micro_batch_size=2,
                steps=20, warmup=5, checkpointing=False, layers=4, rows="fsdptrain,accelerate,fsdp2"),
}
BYTES_PER_PARAM = 18  # fp32 weights, gradients, AdamW's two moments, and a bf16 copy
HEADROOM_GIB = 24  # the loss head at sequence 8192, checkpointed activations, CUDA context, slack
# TorchTitan's published Llama 3.1 8B per-GPU tokens/s, 8 H100s, sequence 8192 (its 2024-12 benchmark).
TORCHTITAN_8B = (("eager", 5762), ("torch.compile", 6667), ("torch.compile + float8", 8532))
BF16_TOLERANCE = 0.02
TRUNC3_VAR = 0.9733  # the variance of N(0, 1) truncated at +-3 standard deviations


def layer_parameters(c, layer):
    """(decoder layer `layer`'s parameters, those a token passes through): a mixture of experts'
    sparse layer (Qwen3-MoE's keys) holds every expert and a token uses num_experts_per_tok of them."""
    C, F = c["hidden_size"], c["intermediate_size"]
    H, K = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    D = c.get("head_dim") or C // H
    attention = C * H * D + 2 * C * K * D + H * D * C + 2 * C
    E = c.get("num_experts") or c.get("num_local_experts") or 0
    step = c.get("decoder_sparse_step") or 1
    if E and (layer + 1) % step == 0 and layer not in (c.get("mlp_only_layers") or []):
        expert = 3 * C * (c.get("moe_intermediate_size") or F)
        return attention + C * E + E * expert, attention + C * E + c["num_experts_per_tok"] * expert
    return attention + 3 * C * F, attention + 3 * C * F


def flops_per_token(c, seq_len, causal=False):
    """6 N' + 12 L H D T (PaLM / torchtitan; causal: 6 L H D T): N' leaves out the input embedding
    unless it is tied, and counts a mixture of experts' active experts only."""
    L, C, V = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    H = c["num_attention_heads"]
    D = c.get("head_dim") or C // H
    n = sum(layer_parameters(c, l)[1] for l in range(L)) + C + V * C  # layers, final norm, head (or the tied embedding)
    return 6 * n + (6 if causal else 12) * L * H * D * seq_len


def parameters(c):
    """(the decoder layers' parameters, the parameters outside the layers)."""
    C, V = c["hidden_size"], c["vocab_size"]
    layers = sum(layer_parameters(c, l)[0] for l in range(c["num_hidden_layers"]))
    return layers, C + V * C * (1 if c.get("tie_word_embeddings") else 2)


def layers_that_fit(c, device_bytes):
    """How many decoder layers train on one device of `device_bytes` with full AdamW state."""
    layers, outside = parameters(c)
    layer = layers / c["num_hidden_layers"]
    room = device_bytes - HEADROOM_GIB * 2**30 - BYTES_PER_PARAM * outside
    return max(1, int(room // (BYTES_PER_PARAM * layer)))


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


def write_accelerate_yaml(path, world, cpu, mixed_precision, checkpointing, layer_class="LlamaDecoderLayer"):
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
  fsdp_transformer_layer_cls_to_wrap: {layer_class}
  fsdp_reshard_after_forward: true
  fsdp_activation_checkpointing: {"true" if checkpointing else "false"}
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_cpu_ram_efficient_loading: false
""")


# --- the host around each row ---

GPU_FIELDS = "name,clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,utilization.gpu,memory.used"


def gpu_state():
    """nvidia-smi's reading of the first GPU (GPU_FIELDS), or None without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return {"error": "nvidia-smi did not answer in 30 s"}
    if r.returncode != 0 or not r.stdout.strip():
        return {"error": (r.stdout + r.stderr).strip()[:200]}
    return dict(zip(GPU_FIELDS.split(","), (v.strip() for v in r.stdout.splitlines()[0].split(","))))


def cpu_ticks():
    """/proc/stat's aggregate CPU line: user, nice, system, idle, iowait, irq, softirq, steal (ticks)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


def snapshot():
    return {"time": time.time(), "loadavg": list(os.getloadavg()), "cpu_ticks": cpu_ticks(), "gpu": gpu_state()}


def steal_percent(before, after):
    """The share of CPU time the hypervisor took between two snapshots (None without a steal column,
    or over less than a second of CPU time, 100 ticks)."""
    d = [b - a for a, b in zip(before["cpu_ticks"], after["cpu_ticks"])]
    return 100.0 * d[7] / sum(d) if len(d) == 8 and sum(d) >= 100 else None


def versions(fsdptrain):
    out = {"python": sys.version.split()[0]}
    for name in ("torch", "transformers", "accelerate", "torchtitan", "liger-kernel", "torchao", "triton"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    try:
        r = subprocess.run([fsdptrain, "--version"], capture_output=True, text=True, timeout=60)
        out["fsdptrain"] = (r.stdout + r.stderr).strip() or f"exit {r.returncode}"
    except OSError as e:
        out["fsdptrain"] = f"not run: {e}"
    return out


def gpus():
    """(how many GPUs torch sees, the first one's name, its memory in bytes), asked in a process of its
    own so that this one, which outlives every row, holds no CUDA context on the GPU the rows measure."""
    probe = ("import torch; n = torch.cuda.device_count(); p = torch.cuda.get_device_properties(0) if n else None; "
             "print(n); print(p.name if n else ''); print(p.total_memory if n else 0)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    count, name, memory = out.splitlines()[-3:]
    return int(count), name, int(memory)


def lscpu():
    """lscpu's description of the host, less its list of CPU vulnerabilities."""
    if not shutil.which("lscpu"):
        return "lscpu: not found"
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return "\n".join(l for l in out.splitlines() if not l.startswith("Vulnerability"))


# --- running a row ---

class Runner:
    """Runs each row's command in its own process group, its output into its log as it goes, within
    --row-timeout and what --budget-s leaves; a TERM to compare.py ends the running row first."""

    def __init__(self, row_timeout, budget):
        self.row_timeout, self.deadline, self.child = row_timeout, time.time() + budget if budget else None, None

    def left(self):
        return None if self.deadline is None else self.deadline - time.time()

    def run(self, label, cmd, log):
        """(status, reason, seconds): status ok, failed, timed out or skipped (exit 77, or no budget)."""
        limits = [t for t in (self.row_timeout or None, self.left()) if t is not None]
        timeout = min(limits) if limits else None
        if timeout is not None and timeout < 20:
            return "skipped", f"{timeout:.0f} s of --budget-s left", 0.0
        print(f"== {label}: {' '.join(cmd)}", flush=True)
        t0 = time.time()
        with open(log, "w") as out:
            try:
                self.child = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True)
            except OSError as e:
                print(f"   cannot start {cmd[0]}: {e}", flush=True)
                return "failed", f"cannot start {cmd[0]}: {e.strerror} (build it, or pass its path)", 0.0
            try:
                rc = self.child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.stop()
                self.child.wait()
                rc = None
            self.child = None
        seconds = time.time() - t0
        text = open(log, errors="replace").read()
        lines = text.splitlines()
        print(f"   {'timed out' if rc is None else f'exit {rc}'} in {seconds:.0f} s (log: {log})", flush=True)
        if rc is None:
            return "timed out", f"timed out after {timeout:.0f} s", seconds
        skipped = [l[len("skipped: "):] for l in lines if l.startswith("skipped: ")]
        if rc == 77 and skipped:
            print("   skipped: " + skipped[-1])
            return "skipped", skipped[-1], seconds
        if rc != 0:
            print("\n".join(lines[-15:]))
            errors = skipped or [l for l in lines if re.search(r"error|exception", l, re.I)] or lines[-1:] or [""]
            return "failed", f"exit {rc}: {errors[-1].strip()[:240]}", seconds
        reporters = sum(l.startswith("step 1/") for l in lines)
        if reporters > 1:  # each would write the same results file, and one could cut into the other
            return "failed", f"{reporters} processes reported step 1, where only rank 0 should: not used", seconds
        return "ok", "", seconds

    def stop(self):
        """TERM to the running row's process group, then KILL to what is left of it 5 s later. Never
        waits on the child (a TERM handler may interrupt a wait that holds its lock)."""
        if self.child is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.child.pid, sig)
            except ProcessLookupError:
                return
            for _ in range(50):
                if self.child.poll() is not None:
                    return
                time.sleep(0.1)


# --- measurements ---

def summarize(r, warmup, fpt_full, fpt_causal, peak_flops):
    """Adds tokens/s per device, MFU (full and causal) and the step-time spread over the timed steps."""
    timed = r["step_times_s"][warmup:] or r["step_times_s"]
    median = statistics.median(timed)
    tps = r["tokens_per_step"] / median / r["world_size"]
    r.update(tokens_per_s_per_device=tps, step_time_median_s=median, step_time_min_s=min(timed),
             step_time_max_s=max(timed), timed_steps=len(timed),
             mfu=fpt_full * tps / peak_flops if peak_flops else None,
             mfu_causal=fpt_causal * tps / peak_flops if peak_flops else None)
    return r


def read_fsdptrain(metrics, tokens_per_step, world, sets):
    """An fsdptrain row's measurements from its metrics file (a line a step, logging.interval=1)."""
    lines = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l]
    # A mixture of experts: the last step's tokens per expert, max and min over the mean.
    load = lines[-1].get("expert_load") if lines else None
    shown = (f", experts' load max {max(load) / (sum(load) / len(load)):.2f} min {min(load) / (sum(load) / len(load)):.2f}"
             f" of mean" if load and sum(load) > 0 else "")
    return {"name": "fsdptrain" + "".join(f", {k}={v}" for k, v in sets.items()) + shown,
            "step_times_s": [l["step_time_s"] for l in lines], "losses": [l["loss"] for l in lines],
            "tokens_per_step": tokens_per_step, "world_size": world,
            "peak_memory_bytes": max((l["peak_memory_bytes"] for l in lines), default=0)}


def logit_variance(row, c):
    """s2, the variance of each logit at init (see the docstring's Losses)."""
    return TRUNC3_VAR if row.startswith("torchtitan") else c.get("initializer_range", 0.02) ** 2 * c["hidden_size"]


def init_family(row):
    return "torchtitan" if row.startswith("torchtitan") else "fsdptrain" if row.startswith("fsdptrain") else "hf"


def loss_check(r, by, c, n, tol):
    """'ok' or 'DIVERGES: why', by the docstring's rule, against the row's reference."""
    losses = r["losses"]
    bad = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    if bad:
        return f"DIVERGES: not finite at step {bad[0] + 1}"
    s2 = logit_variance(r["row"], c)
    if r["row"] == "fsdptrain":
        want, allowed = math.log(c["vocab_size"]) + s2 / 2, tol + 3 * math.sqrt(s2 / n)
        if abs(losses[0] - want) > allowed:
            return f"DIVERGES: first loss {losses[0]:.4f}, ln V + s2/2 is {want:.4f} (allowed {allowed:.3f})"
        return "ok"
    ref = by.get("torchtitan") if r["row"] == "torchtitan-float8" and "torchtitan" in by else by.get("fsdptrain")
    if ref is None or not ref["losses"]:
        return "n/a (no reference)"
    if init_family(ref["row"]) == init_family(r["row"]):
        steps = min(len(losses), len(ref["losses"]))
        worst = max(range(steps), key=lambda i: abs(losses[i] - ref["losses"][i]))
        d = losses[worst] - ref["losses"][worst]
        if abs(d) > tol:
            return f"DIVERGES: step {worst + 1} {d:+.4f} from {ref['row']}'s (same init; allowed {tol})"
        return f"ok (every step within {abs(d):.4f} of {ref['row']}'s)"
    ref_s2 = logit_variance(ref["row"], c)
    offset, allowed = (s2 - ref_s2) / 2, tol + 3 * math.sqrt((s2 + ref_s2) / n)
    first, last = losses[0] - ref["losses"][0], losses[-1] - ref["losses"][-1]
    if abs(first - offset) > allowed:
        return (f"DIVERGES: first loss {first:+.4f} from {ref['row']}'s, the inits put it at {offset:+.4f} "
                f"(allowed {allowed:.3f})")
    if abs(last) > allowed + abs(offset):
        return f"DIVERGES: last loss {last:+.4f} from {ref['row']}'s (allowed {allowed + abs(offset):.3f})"
    return "ok"


def kind(row):
    return "offload" if row.endswith("-offload") else "float8" if "float8" in row else "bf16"


def reference(row, by):
    """The fsdptrain row a row is measured against: for a peer, fsdptrain's row of the same kind where
    it ran; for fsdptrain's own rows, and otherwise, fsdptrain."""
    want = "fsdptrain"
    if not row.startswith("fsdptrain"):
        want = {"offload": "fsdptrain-offload", "float8": "fsdptrain-float8"}.get(kind(row), "fsdptrain")
    return by.get(want) or by.get("fsdptrain")


def verdicts(results, shape, B, tol):
    """The targets, each met or not, from this call's rows that ran."""
    by = {r["row"]: r for r in results if r["status"] == "ok"}

    def line(what, ok, value):
        return f"- {'met' if ok else 'NOT met'}: {what} ({value})"

    def speed(a, b):
        return a["tokens_per_s_per_device"] / b["tokens_per_s_per_device"]

    out = []
    for k, mine in (("bf16", "fsdptrain"), ("float8", "fsdptrain-float8"), ("offload", "fsdptrain-offload")):
        peers = [r for r in by.values() if kind(r["row"]) == k and not r["row"].startswith("fsdptrain")]
        if mine in by and peers:
            best = max(peers, key=lambda r: r["tokens_per_s_per_device"])
            out.append(f"- {mine} against the best {k} peer of this call, {best['row']}: "
                       f"{speed(by[mine], best):.2f}x its tokens/s")
    base, offload = by.get("fsdptrain"), by.get("fsdptrain-offload")
    peers = [r for r in by.values() if kind(r["row"]) == "bf16" and r["row"] != "fsdptrain"]
    best = max(peers, key=lambda r: r["tokens_per_s_per_device"]) if peers else None
    if shape == "1b" and base is not None:
        if best is not None:
            ratio = speed(base, best)
            out.append(line(f"tokens/s >= 1.15x the best peer's ({best['row']})", ratio >= 1.15, f"{ratio:.2f}x"))
            mem = base["peak_memory_bytes"] / best["peak_memory_bytes"]
            out.append(line(f"peak memory <= the best peer's ({best['row']})", mem <= 1.0, f"{mem:.2f}x"))
        want = {2: 0.45, 4: 0.52}.get(B)
        if want is not None and base["mfu"] is not None:
            out.append(line(f"MFU >= {100 * want:.0f} % at micro batch {B} (full attention count)", base["mfu"] >= want,
                            f"{100 * base['mfu']:.1f} %"))
    if shape == "8b" and base is not None:
        if "torchtitan" in by:
            ratio = speed(base, by["torchtitan"])
            out.append(line("tokens/s >= 1.1x TorchTitan compiled's in this call", ratio >= 1.1, f"{ratio:.2f}x"))
        elif base["mfu"] is not None:
            published = TORCHTITAN_8B[1][1] * ANCHOR_FLOPS / 989e12
            out.append(line(f"MFU >= 1.1x TorchTitan compiled's published {100 * published:.1f} % (it did not "
                            "run here)", base["mfu"] >= 1.1 * published, f"{100 * base['mfu']:.1f} %"))
        if "fsdptrain-float8" in by:
            f8 = by["fsdptrain-float8"]
            ratio = speed(f8, base)
            out.append(line("float8 tensorwise tokens/s >= 1.2x fsdptrain's bf16", ratio >= 1.2, f"{ratio:.2f}x"))
            out.append(line(f"float8 tensorwise losses within bf16 noise ({tol}) of fsdptrain's at every step",
                            f8["loss_check"].startswith("ok"), f8["loss_check"]))
    if offload is not None:
        if base is not None:
            ratio = speed(base, offload)
            out.append(line("offloaded step <= 2.5x the step without offload", ratio <= 2.5, f"{ratio:.2f}x"))
        if "fsdp2-offload" in by:
            ratio = speed(offload, by["fsdp2-offload"])
            out.append(line("offloaded tokens/s >= 1.0x fsdp2-offload's", ratio >= 1.0, f"{ratio:.2f}x"))
    return out or ["- targets: fsdptrain did not run"]


# Llama 3.1 8B's 32 layers at sequence 8192, full attention count: TorchTitan's published figures' FLOPs.
ANCHOR_FLOPS = flops_per_token(json.load(open(os.path.join(ROOT, SHAPES["8b"]["model_config"]))), 8192)


def render(results, header, shape, B, tol, cpu):
    gib = 1024.0 ** 3
    rows = [*header, "",
            "| trainer | tokens/s per device | fsdptrain vs it | MFU full / causal | peak memory | step median "
            "(min-max) | loss first → last | losses |",
            "| --- | ---: | ---: | ---: | ---: | --- | --- | --- |"]
    by = {r["row"]: r for r in results if r["status"] == "ok"}
    for r in by.values():
        ref = reference(r["row"], by)
        vs = f"{ref['tokens_per_s_per_device'] / r['tokens_per_s_per_device']:.2f}x" if ref else "n/a"
        mfu = (f"{100 * r['mfu']:.1f} / {100 * r['mfu_causal']:.1f} %" if r["mfu"] is not None else "n/a")
        rows.append(f"| {r['row']}: {r['name']} | {r['tokens_per_s_per_device']:,.0f} | {vs} | {mfu} | "
                    f"{r['peak_memory_bytes'] / gib:.2f} GiB | {1000 * r['step_time_median_s']:.1f} ms "
                    f"({1000 * r['step_time_min_s']:.1f}-{1000 * r['step_time_max_s']:.1f}) | "
                    f"{r['losses'][0]:.4f} → {r['losses'][-1]:.4f} | {r['loss_check']} |")
    others = [r for r in results if r["status"] != "ok"]
    if others:
        rows += ["", "Rows that did not run:"] + [f"- {r['row']}: {r['status']}: {r['reason']}" for r in others]
    rows += ["", "fsdptrain vs it: the reference's tokens/s over the row's (fsdptrain-offload for the offload "
             "rows, fsdptrain-float8 for the float8 peers, fsdptrain otherwise). MFU: full counts attention "
             "as TorchTitan (12 L H D T a token), causal half of it; the verdicts use full"
             + ("; float8 rows against the bf16 peak." if any(kind(r) == "float8" for r in by) else ".")
             + f" Losses: compare.py's docstring (same init: every step within {tol}; other inits: first and "
             "last step within sampling error of the inits' offset)."]
    if shape == "8b":
        rows += ["", "TorchTitan's published Llama 3.1 8B per GPU (8 H100s, sequence 8192, 2024-12), MFU with "
                 "this table's count at 32 layers:"]
        rows += [f"- {what}: {tps:,} tokens/s, MFU {100 * tps * ANCHOR_FLOPS / 989e12:.1f} %"
                 + (" (of the bf16 peak)" if "float8" in what else "") for what, tps in TORCHTITAN_8B]
    if cpu:
        rows += ["", "On CPU these rows only check that each trainer runs; the numbers compare nothing."]
    rows += ["", *verdicts(results, shape, B, tol)]
    return "\n".join(rows)


def render_host(host, results):
    out = ["# The host of this call", "", f"{host['date']}; `lscpu`:", "", "```", host["lscpu"], "```", "",
           "| package | version |", "| --- | --- |"]
    out += [f"| {k} | {v} |" for k, v in host["versions"].items()]
    out += ["", "Around each row: load average (1, 5, 15 min), the CPU steal during the row (/proc/stat), "
            "the GPU (SM / memory MHz of max SM, °C, W).", "",
            "| row | seconds | load before | load after | steal | GPU before | GPU after |",
            "| --- | ---: | --- | --- | ---: | --- | --- |"]

    def gpu(g):
        if g is None:
            return "no nvidia-smi"
        if "error" in g:
            return g["error"]
        return (f"{g['clocks.sm']} / {g['clocks.mem']} of {g['clocks.max.sm']} MHz, {g['temperature.gpu']} °C, "
                f"{g['power.draw']} W")
    for r in results:
        b, a = r.get("host_before"), r.get("host_after")
        if b is None:
            continue
        steal = r.get("cpu_steal_percent")
        out.append(f"| {r['row']} | {r['wall_s']:.0f} | {' '.join(f'{v:.2f}' for v in b['loadavg'])} | "
                   f"{' '.join(f'{v:.2f}' for v in a['loadavg'])} | "
                   f"{'n/a' if steal is None else f'{steal:.2f} %'} | {gpu(b['gpu'])} | {gpu(a['gpu'])} |")
    return "\n".join(out) + "\n"


def skip_reason(name, cpu, world):
    """Why a row cannot run in this call, or None."""
    needs_gpu = ROWS[name][2]
    if needs_gpu and cpu:
        return f"{needs_gpu}; this run is on the CPU"
    if name == "compiled" and world > 1:
        return f"one process without FSDP; this call runs {world} processes"
    if name in PEER_PACKAGES and importlib.util.find_spec(PEER_PACKAGES[name]) is None:
        return (f"{PEER_PACKAGES[name]} is not installed here (scripts/bundle-deps.sh wheels bundles it, "
                "scripts/gpu-session.sh installs it)")
    return None


def row_command(name, run, out):
    """The command line of a row writing its measurements to `out`; `run` holds the call's settings."""
    how, extra, _ = ROWS[name]
    if how == "fsdptrain":
        sets = {"model.config": run["model_config"], "data.path": run["data"], "data.eval_fraction": "0",
                "train.steps": run["steps"], "train.micro_batch_size": run["B"], "train.sequence_length": run["T"],
                "optimizer.lr": run["lr"], "schedule.type": "constant", "schedule.warmup_steps": 0,
                "logging.metrics_file": out, "logging.interval": 1,  # each step reads the device
                "train.output_dir": os.path.join(os.path.dirname(out), "runs", name),  # its run.json
                "logging.tensorboard_dir": "",  # timing only: no event files,
                "checkpoint.dir": "none", "checkpoint.export_dir": "none"} | extra  # and no checkpoints
        cmd = [run["fsdptrain"], "launch", "--config", run["yaml"], "--main_process_port", "0"]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        return cmd
    common = ["--model-config", run["model_config"], "--data", run["data"], "--steps", str(run["steps"]),
              "--lr", str(run["lr"]), "--micro-batch-size", str(run["B"]), "--sequence-length", str(run["T"]),
              "--out", out]
    if how == "accelerate":  # activation checkpointing and mixed precision come from the YAML
        accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
        return [accelerate, "launch", "--config_file", run["yaml"], os.path.join(BENCH, "hf_accelerate_train.py"),
                *extra, *common]
    cmd = [sys.executable, os.path.join(BENCH, how), *extra, *common, "--mixed-precision", run["mixed"]]
    cmd += ["--cpu"] if run["cpu"] else []
    cmd += [] if how == "compiled_train.py" else ["--world-size", str(run["world"])]
    return cmd + (["--activation-checkpointing"] if run["activation_checkpointing"] else [])


def run_row(name, run, runner, out_dir):
    """Runs one row and returns its result: status, reason, the host around it, its measurements."""
    how, extra, _ = ROWS[name]
    log = os.path.join(out_dir, name + ".log")
    out = os.path.join(out_dir, name + (".jsonl" if how == "fsdptrain" else ".json"))
    if os.path.exists(out):
        os.remove(out)
    # This call's own run folder for the row (train.output_dir): an earlier call's finished run there
    # would be refused as a run to continue, so it goes with the row's other outputs.
    shutil.rmtree(os.path.join(out_dir, "runs", name), ignore_errors=True)
    before = snapshot()
    status, reason, seconds = runner.run(name, row_command(name, run, out), log)
    after = snapshot()
    r = {"row": name, "status": status, "reason": reason, "wall_s": seconds, "host_before": before,
         "host_after": after, "cpu_steal_percent": steal_percent(before, after)}
    if status != "ok":
        return r
    if not os.path.exists(out) or os.path.getsize(out) == 0:
        return r | {"status": "failed", "reason": f"exit 0 but no result in {out}"}
    tokens_per_step = run["B"] * run["T"] * run["world"]
    measured = (read_fsdptrain(out, tokens_per_step, run["world"], extra) if how == "fsdptrain"
                else json.load(open(out)))
    if not measured["step_times_s"]:
        return r | {"status": "failed", "reason": f"no steps in {out}"}
    return summarize(r | measured, run["warmup"], run["fpt"], run["fpt_causal"], run["peak_flops"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--model-config", help="default: the shape's")
    ap.add_argument("--layers", type=int, default=0,
                    help="decoder layers (num_hidden_layers); --shape 8b's default: as many as fit the GPU")
    ap.add_argument("--sequence-length", type=int, help="default: the shape's")
    ap.add_argument("--micro-batch-size", type=int, help="default: the shape's")
    ap.add_argument("--steps", type=int, help="default: the shape's")
    ap.add_argument("--warmup", type=int, help="steps left out of the timings (default: the shape's)")
    ap.add_argument("--world-size", type=int, default=0, help="processes (default: the GPUs, or 2 with --cpu)")
    ap.add_argument("--mixed-precision", choices=["bf16", "no"], default=None, help="default: bf16 (no with --cpu)")
    ap.add_argument("--lr", type=float, default=3e-4, help="AdamW's constant learning rate, every row")
    ap.add_argument("--peak-tflops", type=float, default=None, help="per device, for MFU (default: 989 on GPU)")
    ap.add_argument("--loss-tolerance", type=float, default=BF16_TOLERANCE, help="bf16 noise in a step's loss")
    ap.add_argument("--row-timeout", type=float, default=0, help="seconds for one row (0: none)")
    ap.add_argument("--budget-s", type=float, default=0, help="seconds for the whole call (0: none)")
    ap.add_argument("--cpu", action="store_true", help="train on the CPU: a check that the rows run, small shapes")
    ap.add_argument("--fsdptrain", default=os.path.join(ROOT, "build/apps/fsdptrain/fsdptrain"))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "bench-results"))
    ap.add_argument("--only", help=f"comma-separated rows, in the order they run, of {', '.join(ROWS)} "
                                   "(default: the shape's)")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    only = (args.only or shape["rows"]).split(",")
    unknown = [name for name in only if name not in ROWS]
    if unknown:
        ap.error(f"--only: unknown row(s) {', '.join(unknown)}; the rows are {', '.join(ROWS)}")
    gpu_count, gpu_name, gpu_memory = gpus()
    if not args.cpu and gpu_count == 0:
        sys.exit("compare.py: no GPU here, and the default shapes (the ~1B Llama at sequence 2048) would train on "
                 "the CPU until memory runs out. On a GPU machine run it as is; to check the harness on CPU, pass "
                 "--cpu with small shapes: --cpu --model-config configs/models/tiny/config.json "
                 "--sequence-length 32 --micro-batch-size 2 --steps 4 --warmup 1")
    os.makedirs(args.out_dir, exist_ok=True)
    out_dir = os.path.abspath(args.out_dir)
    config = json.load(open(os.path.join(ROOT, args.model_config or shape["model_config"])))
    layers = args.layers or (0 if args.model_config else shape.get("layers", 0))
    if not layers and args.shape == "8b" and not args.cpu:
        layers = layers_that_fit(config, gpu_memory)
        print(f"compare.py: {layers} of the config's {config['num_hidden_layers']} layers fit {gpu_memory / 2**30:.1f} "
              f"GiB at {BYTES_PER_PARAM} bytes a parameter beside {HEADROOM_GIB} GiB of headroom (--layers N to "
              "choose)", flush=True)
    if layers:
        config["num_hidden_layers"] = layers
    run = {"B": args.micro_batch_size or shape["micro_batch_size"],
           "T": args.sequence_length or shape["sequence_length"],
           "steps": args.steps or shape["steps"], "warmup": shape["warmup"] if args.warmup is None else args.warmup,
           "world": args.world_size or (2 if args.cpu else gpu_count),
           "mixed": args.mixed_precision or ("no" if args.cpu else "bf16"), "lr": args.lr, "cpu": args.cpu,
           "activation_checkpointing": shape["checkpointing"], "fsdptrain": args.fsdptrain,
           "model_config": os.path.join(out_dir, "model-config.json"), "yaml": os.path.join(out_dir, "bench.yaml"),
           "peak_flops": (args.peak_tflops if args.peak_tflops is not None else (0 if args.cpu else 989)) * 1e12}
    B, T, S, world = run["B"], run["T"], run["steps"], run["world"]
    run["fpt"], run["fpt_causal"] = flops_per_token(config, T), flops_per_token(config, T, causal=True)
    with open(run["model_config"], "w") as f:
        json.dump(config, f, indent=1)
    # The decoder layer's class, as transformers names it (Qwen3MoeForCausalLM's Qwen3MoeDecoderLayer).
    layer_class = (config.get("architectures") or ["LlamaForCausalLM"])[0].replace("ForCausalLM", "DecoderLayer")
    write_accelerate_yaml(run["yaml"], world, args.cpu, run["mixed"], run["activation_checkpointing"], layer_class)
    layers_params, outside = parameters(config)
    n_params = layers_params + outside
    device = "cpu" if args.cpu else gpu_name
    experts = config.get("num_experts") or config.get("num_local_experts")
    header = [f"{(config.get('architectures') or ['LlamaForCausalLM'])[0]} {args.model_config or shape['model_config']} "
              f"({config['num_hidden_layers']} layers, {n_params / 1e9:.2f}B parameters"
              + (f", top {config['num_experts_per_tok']} of {experts} experts" if experts else "") + f"), sequence {T}, micro batch {B} x {world} process(es), "
              f"{run['mixed']}" + (", full activation checkpointing" if run["activation_checkpointing"] else "")
              + f", AdamW lr {args.lr} constant, {S} steps ({run['warmup']} warm-up not timed), {device}; "
              f"one host synchronisation a step in every row; ln V = {math.log(config['vocab_size']):.4f}"]
    host = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "lscpu": lscpu(), "versions": versions(args.fsdptrain)}
    stem = time.strftime("%Y-%m-%d") + "-" + re.sub(r"[^a-z0-9]+", "-", device.lower().replace("nvidia", "")).strip("-")
    settings = vars(args) | run | {"device": device, "layers": config["num_hidden_layers"], "parameters": n_params}
    results, current = [], [None]

    def write():
        """results.{md,json}, the dated copy and host.md, as they stand."""
        by = {r["row"]: r for r in results if r["status"] == "ok"}
        for r in by.values():
            r["loss_check"] = loss_check(r, by, config, B * T, args.loss_tolerance)
        table = render(results, header, args.shape, B, args.loss_tolerance, args.cpu)
        for name in ("results", stem):
            with open(os.path.join(out_dir, name + ".md"), "w") as f:
                f.write(table + "\n")
            with open(os.path.join(out_dir, name + ".json"), "w") as f:
                json.dump({"settings": settings, "host": host, "results": results}, f, indent=1)
        with open(os.path.join(out_dir, "host.md"), "w") as f:
            f.write(render_host(host, results))
        return table

    runner = Runner(args.row_timeout, args.budget_s)

    def on_term(signum, frame):  # the session step's timeout: end the row, keep what ran
        runner.stop()
        if current[0] is not None and current[0] not in (r["row"] for r in results):
            results.append({"row": current[0], "status": "timed out", "reason": "compare.py was stopped during it"})
        write()
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    with tempfile.TemporaryDirectory() as tmp:
        run["data"] = os.path.join(tmp, "tokens.bin")
        write_tokens(run["data"], S * B * T * world + T + 1, config["vocab_size"], 0)
        for name in only:
            current[0] = name
            reason = skip_reason(name, args.cpu, world)
            if reason:
                print(f"== {name}: skipped: {reason}", flush=True)
                results.append({"row": name, "status": "skipped", "reason": reason})
            else:
                results.append(run_row(name, run, runner, out_dir))
            write()
        current[0] = None
    print("\n" + write())
    return 1 if any(r["status"] in ("failed", "timed out") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
