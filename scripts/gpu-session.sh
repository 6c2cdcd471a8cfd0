#!/usr/bin/env bash
# Everything a GPU machine is for. One GPU session is ONE call of the device tool (10 minutes at
# most; give it 560 s or more): `session`, the default, runs the steps below in order, each bounded by
# `timeout` inside a total budget (SESSION_BUDGET_S, 530 s), and writes each result under $OUT (or
# ./gpu-results) as it finishes; $OUT/session.md says how each step ended. With PREBUILT=1 it runs
# the binaries scripts/prebuilt.sh packed: carry third_party/device (about 26 MB; the device tool
# sends at most 64 MiB), which holds them, the Debian libraries of scripts/bundle-deps.sh and the
# benchmark peers' wheels (installed here with pip --no-index --no-deps --target into a temporary
# folder put on PYTHONPATH), unpacked on the first run:
#   scripts/bundle-deps.sh && scripts/prebuilt.sh      # here, then one device call of
#   PREBUILT=1 OUT=/tmp/g scripts/gpu-session.sh; tar -czf $OUT/all.tgz -C /tmp/g .   # carry third_party/device
# (only 8 files come back from a call: tar the results). Without PREBUILT=1 a step builds first
# (carry third_party/bundle) unless the build is already there.
#   scripts/gpu-session.sh [session]   in one call, in this order (at most, of 530 s):
#     1. tests      the gpu-labelled tests; a test that skips on a machine whose nvidia-smi sees a
#                   GPU fails                                             -> tests.log     85 s
#     2. bench      scripts/bench/compare.py at the ~1B shape, 12 steps (4 warm-up): fsdptrain,
#                   compiled, torchtitan, fsdp2-compile, liger, accelerate, each row within 75 s
#                   -> bench/ (results, host.md, every row's log and result), bench.log   205 s
#     3. bench8b    compare.py --shape 8b: Llama 3.1 8B's layers, as many as fit, sequence 8192,
#                   8 steps (3 warm-up): fsdptrain, torchtitan, fsdptrain-float8, torchtitan-float8,
#                   fsdp2-compile, fsdptrain-float8-rowwise, each within 100 s -> bench8b/   200 s
#     4. profile    steps 4-5 traced and summarized -> profile.log, profile-summary.{md,json} 40 s
#   Each fsdptrain 1B run starts in about 20 s on an H200, a Python peer in 20-40 s and torch.compile
#   adds 30-60 s: a row the step's time no longer reaches is listed as skipped in its table, and the
#   rows before it are written already.
#   scripts/gpu-session.sh session --dry   (or DRY=1) the same steps on CPU at tiny shapes, the GPU-only
#                   rows (liger, the float8 ones) skipped with a line saying so and the compiled rows
#                   compiled with aot_eager (no Inductor C++ builds), so that a CPU test
#                   (tests/scripts/gpu_session_dry_test.sh) keeps this script working; the gpu tests
#                   skip themselves there
#   One step alone (by name; the first three are not in the default session):
#   scripts/gpu-session.sh features       fsdptrain's features at the 1B shape, a few steps each: activation
#                                         checkpointing, micro batch 4, offload, LoRA, a FULL checkpoint with
#                                         the export, `generate --device cuda` from it, SHARDED checkpoints and
#                                         their resume, packed chat data, gradient accumulation 4 without and
#                                         with offload -> feature-matrix.md, features/*.log
#                                         (FEATURES="ckpt_sharded resume": those rows alone)
#   scripts/gpu-session.sh bench-offload  fsdptrain-offload and fsdp2-offload, few steps -> bench-offload/
#   scripts/gpu-session.sh host           the host side of CPU offload at the 1B shape's 1.24B parameters:
#                                         the gradient norm and AdamW beside a plain copy of the same bytes
#                                         (tests/optim/host_adamw_bench.cpp) -> host-adamw.md
#   scripts/gpu-session.sh build          build offline against the machine's torch, run the gpu-labelled
#                                         tests (`tests` is the same; with PREBUILT=1 nothing is built)
#   scripts/gpu-session.sh bench          the side-by-side benchmark on the ~1B Llama (compare.py's defaults)
#   scripts/gpu-session.sh bench8b        the same at the 8B shape (compare.py --shape 8b)
#   scripts/gpu-session.sh benchmoe       the same at Qwen3-30B-A3B's widths, 4 layers (compare.py --shape moe:
#                                         fsdptrain, accelerate, fsdp2; fsdptrain's experts' load) -> benchmoe/
#   scripts/gpu-session.sh profile        trace steps 4-5 of fsdptrain on the ~1B Llama (bf16, sequence 2048)
#                                         and summarize where the time goes (scripts/bench/trace_summary.py)
# Extra arguments go to compare.py (bench, bench8b), or are --set overrides (profile), e.g.
# train.micro_batch_size=4. Every session step exits non-zero when it fails; `session` exits non-zero
# when any step did.
# Environment: OUT, BUILD_DIR (build-offline; dry: build), FSDPTRAIN (the binary), PYTHON (python3;
# dry: .venv/bin/python where it exists), SESSION_BUDGET_S, SCRATCH_DIR (where checkpoints go: /tmp).
set -euo pipefail
SELF=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.."
mode=${1:-session}
[ $# -gt 0 ] && shift
if [ "$mode" = session ] && [ "${1:-}" = --dry ]; then
  export DRY=1
  shift
fi
export DRY=${DRY:-0}
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export OUT
if [ "$DRY" = 1 ]; then
  export BUILD_DIR=${BUILD_DIR:-build}
  [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PYTHON=$PWD/.venv/bin/python
else
  export BUILD_DIR=${BUILD_DIR:-build-offline}
fi
export PYTHON=${PYTHON:-python3}
FSDPTRAIN=${FSDPTRAIN:-$BUILD_DIR/apps/fsdptrain/fsdptrain}
child=${GPU_SESSION_CHILD:-0}  # a step that `session` started: the machine was described already
SCRATCH=()  # scratch folders (checkpoints, token files), removed at exit, also when `timeout` ends a step
trap 'rm -rf "${SCRATCH[@]}"' EXIT
trap 'exit 143' TERM

if [ "${PREBUILT:-0}" = 1 ] && [ ! -x third_party/prebuilt/bin/fsdptrain ] && [ -f third_party/device/prebuilt.tar.xz ]; then
  # What scripts/prebuilt.sh packed for the device call (carried as third_party/device), unpacked once.
  mkdir -p third_party/prebuilt third_party/bundle/usr/lib/x86_64-linux-gnu
  tar -xJf third_party/device/prebuilt.tar.xz -C third_party/prebuilt
  [ -f third_party/device/bundle-libs.tar.xz ] &&
    tar -xJf third_party/device/bundle-libs.tar.xz -C third_party/bundle/usr/lib/x86_64-linux-gnu
  [ -d third_party/device/wheels ] && [ ! -d third_party/bundle/wheels ] &&
    cp -r third_party/device/wheels third_party/bundle/wheels
fi
if [ "${PREBUILT:-0}" = 1 ]; then
  # This machine's torch provides LibTorch, CUDA and NCCL; the bundle the Debian libraries.
  TORCH_DIR=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  export LD_LIBRARY_PATH=$TORCH_DIR/lib:$TORCH_DIR/../nvidia/nccl/lib:$TORCH_DIR/../nvidia/cu13/lib:/usr/local/cuda/lib64:$PWD/third_party/bundle/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  FSDPTRAIN=third_party/prebuilt/bin/fsdptrain
  if [ -f third_party/prebuilt/lib/arrow.tar.xz ]; then  # the Arrow libraries fsdptrain was linked with
    ARROW_LIB=${TMPDIR:-/tmp}/fsdptrain-prebuilt-lib-$(cksum < third_party/prebuilt/lib/arrow.tar.xz | cut -d' ' -f1)
    [ -d "$ARROW_LIB" ] || "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      third_party/prebuilt/lib/arrow.tar.xz "$ARROW_LIB"
    export LD_LIBRARY_PATH=$ARROW_LIB:$LD_LIBRARY_PATH
  fi
  [ "$child" = 1 ] || cat third_party/prebuilt/BUILT_FROM | tee "$OUT/prebuilt.txt"
fi
case $FSDPTRAIN in /*) ;; *) FSDPTRAIN=$PWD/$FSDPTRAIN ;; esac
export FSDPTRAIN

# The benchmark's rows (compare.py skips the GPU-only ones on CPU, saying so): the ~1B shape, then
# the 8B shape ordered so that its verdicts' rows (fsdptrain, TorchTitan compiled, float8 tensorwise)
# come first when the step's time runs short.
BENCH_ROWS=fsdptrain,compiled,torchtitan,fsdp2-compile,liger,accelerate
BENCH8B_ROWS=fsdptrain,torchtitan,fsdptrain-float8,torchtitan-float8,fsdp2-compile,fsdptrain-float8-rowwise
# The shapes: the ~1B Llama in bf16 on one GPU, or (dry) a tiny Llama, on 2 CPU workers for the
# features and on one for the benchmark (its compiled row runs one process). The dry features' model
# has a vocabulary of 512 so that the chat tokenizer's 259 ids fit.
if [ "$DRY" = 1 ]; then
  MODEL=configs/models/tiny/config.json SEQ=64 MB=2 STEPS=4 OFFLOAD_STEPS=2 DEVICE=cpu HOST_PARAMS=2000000
  LAUNCH=(--set use_cpu=true --num_processes 2 --mixed_precision no)
  TINY=(--cpu --model-config configs/models/tiny/config.json --world-size 1)
  BENCH=("${TINY[@]}" --sequence-length 32 --micro-batch-size 2 --row-timeout 150)
  BENCH8B=("${TINY[@]}" --sequence-length 64 --micro-batch-size 1 --row-timeout 150)
  BENCHMOE=(--model-config configs/models/tiny-moe/config.json --cpu --world-size 1 --sequence-length 32
            --micro-batch-size 2 --steps 4 --warmup 1 --row-timeout 150)
  BENCH_STEPS=(--steps 4 --warmup 1) BENCH8B_STEPS=(--steps 3 --warmup 1) OFFLOAD_BENCH_STEPS=(--steps 2 --warmup 1)
  export FSDPTRAIN_BENCH_COMPILE_BACKEND=aot_eager  # scripts/bench/common.py: no Inductor C++ builds on CPU
else
  # HOST_PARAMS: the ~1B Llama's parameter count (configs/models/llama-1b, tied embeddings)
  MODEL=configs/models/llama-1b/config.json SEQ=2048 MB=2 STEPS=6 OFFLOAD_STEPS=3 DEVICE=cuda HOST_PARAMS=1235814400
  LAUNCH=(--set use_cpu=false --num_processes 1 --mixed_precision bf16)
  BENCH=(--row-timeout 75) BENCH8B=(--row-timeout 100) BENCHMOE=(--row-timeout 100)
  BENCH_STEPS=(--steps 12 --warmup 4) BENCH8B_STEPS=(--steps 8 --warmup 3) OFFLOAD_BENCH_STEPS=(--steps 3 --warmup 1)
fi
# Within a session, a step's compare.py starts no row 10 s before the step's limit (STEP_LIMIT_S).
if [ -n "${STEP_LIMIT_S:-}" ]; then
  BENCH+=(--budget-s $((STEP_LIMIT_S - 10)))
  BENCH8B+=(--budget-s $((STEP_LIMIT_S - 10)))
fi

describe_machine() {
  if [ "$DRY" = 1 ]; then
    echo "dry run on CPU ($(nproc) cores)" | tee "$OUT/gpu.txt"
  else
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt" || true
  fi
}

machine_name() {
  if [ "$DRY" = 1 ]; then echo "CPU ($(nproc) cores)"; else
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo "an unknown GPU"; fi
}

ensure_built() {
  if [ ! -x "$FSDPTRAIN" ]; then
    if [ "$DRY" = 1 ]; then
      echo "gpu-session: $FSDPTRAIN is not built (the dry run builds nothing; run scripts/setup.sh)" >&2
      return 1
    fi
    FSDP_NO_TESTS=1 scripts/build-offline.sh 2>&1 | tail -20 | tee "$OUT/build.log"
  fi
  [ "$child" = 1 ] || "$FSDPTRAIN" --version | tee -a "$OUT/gpu.txt"
}

# True where nvidia-smi sees a GPU: there a gpu test that skips (exit 77, or "skipped" in its
# output) did not test what it is for, and fails.
gpu_visible() {
  command -v nvidia-smi > /dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# ctest -L gpu, or its tests by hand for the prebuilt binaries (ctest's files name this machine's
# paths); with a GPU visible, a skipped test fails.
gpu_tests() {
  local log
  log=$(mktemp)
  SCRATCH+=("$log")
  if [ "${PREBUILT:-0}" != 1 ]; then
    (cd "$BUILD_DIR" && ctest -L gpu --output-on-failure --timeout 600) 2>&1 | tee "$log" || return 1
    if gpu_visible && grep -q '\*\*\*Skipped' "$log"; then
      echo "gpu-session: a gpu test skipped on a machine whose nvidia-smi sees a GPU (above): failed"
      return 1
    fi
    return
  fi
  local bin=third_party/prebuilt/bin failed=0
  gpu_test() {  # name command...
    local name=$1 rc=0
    shift
    "$@" > "$log" 2>&1 || rc=$?
    cat "$log"
    if grep -qi skipped "$log" || [ $rc = 77 ]; then
      if gpu_visible; then
        echo "$name: FAILED: skipped (exit $rc) on a machine whose nvidia-smi sees a GPU"
        failed=1
      else
        echo "$name: skipped, no GPU here (exit $rc)"
      fi
    elif [ $rc = 0 ]; then
      echo "$name: passed"
    else
      echo "$name: FAILED (exit $rc)"
      failed=1
    fi
  }
  gpu_test nccl_test "$bin/nccl_test"
  gpu_test fsdp_product_cuda "$bin/fsdp_worker" product-cuda
  gpu_test packed_cuda_test "$bin/packed_cuda_test"
  gpu_test float8_cuda_test "$bin/float8_cuda_test"
  gpu_test gpu_train_test "$PYTHON" tests/train/gpu_train_test.py --fsdptrain "$FSDPTRAIN" --source "$PWD"
  return $failed
}

# The benchmark peers' wheels (scripts/bundle-deps.sh wheels) installed into a folder named after
# their checksum, once a machine, and put on PYTHONPATH; without them compare.py's torchtitan and
# liger rows say they are not installed.
install_peer_wheels() {
  local wheels=third_party/bundle/wheels
  if ! compgen -G "$wheels/*.whl" > /dev/null; then
    echo "gpu-session: no wheels in $wheels (scripts/bundle-deps.sh wheels): the torchtitan and liger rows" \
      "will be skipped"
    return
  fi
  local site
  site=${TMPDIR:-/tmp}/fsdptrain-peers-$(cat "$wheels"/*.whl | cksum | cut -d' ' -f1)
  if [ ! -d "$site" ]; then
    rm -rf "$site.tmp"  # what an install cut short left
    "$PYTHON" -m pip install --quiet --no-index --no-deps --target "$site.tmp" "$wheels"/*.whl
    mv "$site.tmp" "$site"
  fi
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
}

# The host side of CPU offload over HOST_PARAMS fp32 parameters (about 60 GB of host memory at the
# 1B shape: parameters, gradients and AdamW's moments, and the copy's source and destination).
host_adamw() {
  local bin=$BUILD_DIR/tests/host_adamw_bench
  [ "${PREBUILT:-0}" = 1 ] && bin=third_party/prebuilt/bin/host_adamw_bench
  { echo "$(machine_name), a host of $(nproc) cores:"; "$bin" "$HOST_PARAMS" 3; } | tee "$OUT/host-adamw.md"
}

# An llm.c token shard of COUNT uniform tokens over MODEL's vocabulary.
write_tokens() {  # path count model_config
  "$PYTHON" -c "
import sys; sys.path.insert(0, 'scripts/bench'); import compare, json
compare.write_tokens(sys.argv[1], int(sys.argv[2]), json.load(open(sys.argv[3]))['vocab_size'], 0)" "$@"
}

# The inputs of the features step in DIR: tokens.bin, a byte-level BPE tokenizer with ChatML
# special tokens and template (tokenizer/), chat.jsonl (TRL's messages format) and, dry, the model.
make_feature_inputs() {  # dir
  local dir=$1
  if [ "$DRY" = 1 ]; then
    mkdir -p "$dir/model"
    "$PYTHON" -c "
import json, sys; c = json.load(open('configs/models/tiny/config.json')); c['vocab_size'] = 512
json.dump(c, open(sys.argv[1], 'w'), indent=1)" "$dir/model/config.json"
    MODEL=$dir/model/config.json
  fi
  write_tokens "$dir/tokens.bin" $((4 * STEPS * 4 * SEQ + SEQ + 1)) "$MODEL"
  "$PYTHON" - "$dir" <<'EOF'
import json, os, random, sys
d = sys.argv[1]
# GPT-2's byte-to-unicode table: the 256 byte tokens of a ByteLevel BPE with no merges.
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): i for i, c in enumerate(sorted(cs, key=lambda c: bs[cs.index(c)]))}
special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
added = [{"id": 256 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for i, s in enumerate(special)]
vocab.update({s: 256 + i for i, s in enumerate(special)})
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
       "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                 "vocab": vocab, "merges": []}}
template = ("{%- for message in messages %}"
            "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
os.makedirs(os.path.join(d, "tokenizer"), exist_ok=True)
json.dump(tok, open(os.path.join(d, "tokenizer", "tokenizer.json"), "w"))
json.dump({"eos_token": "<|im_end|>", "bos_token": None, "chat_template": template,
           "tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(d, "tokenizer", "tokenizer_config.json"), "w"))
rng = random.Random(0)
objects = ["lantern", "kettle", "bicycle", "teapot", "umbrella", "violin", "satchel", "compass"]
colors = ["teal", "amber", "crimson", "violet", "olive", "silver", "indigo", "coral"]
with open(os.path.join(d, "chat.jsonl"), "w") as f:
    for _ in range(1000):
        a, b = rng.sample(objects, 2)
        f.write(json.dumps({"messages": [
            {"role": "system", "content": "You answer in one sentence."},
            {"role": "user", "content": f"What color is the {a}?"},
            {"role": "assistant", "content": f"The {a} is {rng.choice(colors)}."},
            {"role": "user", "content": f"And the {b}?"},
            {"role": "assistant", "content": f"The {b} is {rng.choice(colors)}."}]}) + "\n")
EOF
}

# One row of feature-matrix.md from a feature's log and metrics (the last logged step).
feature_row() {  # name what rc log metrics
  "$PYTHON" - "$@" >> "$OUT/feature-matrix.md" <<'EOF'
import json, os, re, sys
name, what, rc, log, metrics = sys.argv[1:6]
text = open(log, errors="replace").read() if os.path.exists(log) else ""
notes = []
# Every save: the first pays for pinning the staging buffer on a GPU, the later ones reuse it.
saves = re.findall(r"\[ckpt\] saved \S+ \((.*?)\) in ([0-9.]+ s); training waited ([0-9.]+ s)", text)
if saves:
    notes.append(f"saved ({saves[0][0]}) " + ", then ".join(f"in {s[1]}, training waited {s[2]}" for s in saves))
for pattern, say in ((r"\[train\] model: .*; built in ([0-9.]+ s)", lambda m: f"built in {m[1]}"),
                     (r"\[train\] offload: AdamW on the host took ([0-9.]+ ms) an update .*?\(([0-9.]+ GB/s)",
                      lambda m: f"host AdamW {m[1]} an update at {m[2]}"),
                     (r"\[ckpt\] loaded \S+ \(.*?\) in ([0-9.]+ s)", lambda m: f"loaded in {m[1]}"),
                     (r"\[train\] peak host memory per rank: (.*?) before loading, (.*?) after",
                      lambda m: f"peak host memory {m[1]} before loading, {m[2]} after"),
                     (r"\[train\] exported a Hugging Face folder (?:\(\w+\) )?to \S+ in ([0-9.]+ s)", lambda m: f"exported in {m[1]}"),
                     (r"\[generate\] (\d+) new tokens .*? in ([0-9.]+ s): ([0-9.]+) tokens/s",
                      lambda m: f"{m[1]} new tokens in {m[2]}")):
    m = re.search(pattern, text)
    if m:
        notes.append(say(m))
if rc != "0":
    errors = [l for l in text.splitlines() if "error" in l.lower()] or text.splitlines()[-1:] or [""]
    notes.append(("TIMED OUT" if rc in ("124", "137") else f"FAILED (exit {rc})") + ": " + errors[-1][:160])
rows = [json.loads(l) for l in open(metrics) if '"step_time_s"' in l] if os.path.exists(metrics) else []
cells = ["-"] * 6
if rows:
    r = rows[-1]
    cells = [str(r["step"]), f"{1000 * r['step_time_s']:.1f}", f"{r['tokens_per_s']:,.0f}",
             f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else "n/a",
             f"{r['peak_memory_bytes'] / 2**30:.2f}", f"{r['loss']:.4f}"]
m = re.search(r"\[generate\] \d+ new tokens .*?: ([0-9.]+) tokens/s", text)
if m:
    cells[2] = f"{float(m[1]):,.1f}"
note = "; ".join(notes).replace("|", "\\|")
print(f"| {name} | {what} | " + " | ".join(cells) + f" | {note} |")
EOF
}

features() {
  local scratch
  scratch=$(mktemp -d "${SCRATCH_DIR:-/tmp}/gpu-session-features.XXXXXX")
  SCRATCH+=("$scratch")
  make_feature_inputs "$scratch"
  local per=${FEATURE_TIMEOUT_S:-$([ "$DRY" = 1 ] && echo 60 || echo 120)} failed=0
  mkdir -p "$OUT/features"
  {
    echo "fsdptrain's features at $MODEL, sequence $SEQ, micro batch $MB unless named, ${LAUNCH[*]}, $(machine_name)."
    echo "Each row is the last logged step of a short run ($STEPS steps; offload $OFFLOAD_STEPS; resume $STEPS more); checkpoint rows include the save in their last step. \"built\": the model's build, from the log."
    echo
    echo "| feature | what | last step | step ms | tokens/s | MFU | peak GiB | loss | notes |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
  } > "$OUT/feature-matrix.md"
  feature() {  # name what steps [key=value...]
    local name=$1 what=$2 steps=$3 rc=0
    shift 3
    [ -z "${FEATURES:-}" ] || [[ " $FEATURES " == *" $name "* ]] || return 0
    local sets=(--set "model.config=$MODEL" --set "data.path=$scratch/tokens.bin" --set data.eval_fraction=0
                --set train.eval_interval=0 --set "train.steps=$steps" --set "train.micro_batch_size=$MB"
                --set "train.sequence_length=$SEQ" --set schedule.warmup_steps=0 --set logging.interval=1
                --set "logging.metrics_file=$scratch/$name.jsonl" --set logging.tensorboard_dir=
                --set "train.output_dir=$scratch/run-$name" --set checkpoint.dir=none --set checkpoint.export_dir=none)
    for s in "$@"; do sets+=(--set "$s"); done
    echo "== $name: $what"
    timeout -k 10 "$per" "$FSDPTRAIN" launch --config configs/quickstart.yaml --distributed_type FSDP \
      --main_process_port 0 "${LAUNCH[@]}" "${sets[@]}" > "$OUT/features/$name.log" 2>&1 || rc=$?
    feature_row "$name" "$what" "$rc" "$OUT/features/$name.log" "$scratch/$name.jsonl"
    tail -1 "$OUT/feature-matrix.md"
    [ "$rc" = 0 ] || failed=1
  }
  local ck=$scratch/checkpoints
  feature ac "fsdp_activation_checkpointing" "$STEPS" fsdp_config.fsdp_activation_checkpointing=true
  feature mb4 "micro batch 4" "$STEPS" train.micro_batch_size=4
  feature offload "fsdp_offload_params" "$OFFLOAD_STEPS" fsdp_config.fsdp_offload_params=true
  feature lora "LoRA r 16, all-linear" "$STEPS" lora.r=16 lora.alpha=32 lora.target_modules=all-linear
  feature ckpt_full "FULL_STATE_DICT save and the Hugging Face export" "$STEPS" \
    fsdp_config.fsdp_state_dict_type=FULL_STATE_DICT "checkpoint.dir=$ck-full" "checkpoint.export_dir=$scratch/export"
  rm -rf "$ck-full"
  if [ -z "${FEATURES:-}" ] || [[ " $FEATURES " == *" generate "* ]]; then
    local rc=0
    echo "== generate: fsdptrain generate --device $DEVICE from the export"
    timeout -k 10 "$per" "$FSDPTRAIN" generate --model "$scratch/export/step-$STEPS" --tokenizer "$scratch/tokenizer" \
      --device "$DEVICE" --prompt "What color is the kettle?" --max_new_tokens 64 \
      > "$OUT/features/generate.log" 2>&1 || rc=$?
    feature_row generate "generate --device $DEVICE from the export, 64 new tokens, greedy" "$rc" \
      "$OUT/features/generate.log" /nonexistent
    tail -1 "$OUT/feature-matrix.md"
    [ "$rc" = 0 ] || failed=1
  fi
  rm -rf "$scratch/export"
  # keep 1: the second save replaces the first, so the resume's own saves have room (at the 1B
  # shape a SHARDED checkpoint is 13.9 GiB, and two of them left a 64 GiB disk too full)
  feature ckpt_sharded "SHARDED_STATE_DICT saves at steps $((STEPS / 2)) and $STEPS" "$STEPS" \
    fsdp_config.fsdp_state_dict_type=SHARDED_STATE_DICT "checkpoint.dir=$ck-sharded" "checkpoint.interval=$((STEPS / 2))" \
    checkpoint.keep=1
  feature resume "resume the SHARDED checkpoint, $STEPS steps more" $((2 * STEPS)) \
    fsdp_config.fsdp_state_dict_type=SHARDED_STATE_DICT "checkpoint.dir=$ck-sharded" checkpoint.resume=latest \
    checkpoint.keep=1
  rm -rf "$ck-sharded"
  feature chat "packed conversations (masked packing, assistant-only loss)" "$STEPS" \
    "data.path=$scratch/chat.jsonl" "data.tokenizer=$scratch/tokenizer"
  # Offload's cost per update is the host's AdamW: over more tokens an update (accumulation) it
  # weighs less; the first row is the second's baseline (last: the rows above come first
  # when the session's budget is short).
  feature accum4 "gradient accumulation 4" "$OFFLOAD_STEPS" train.gradient_accumulation_steps=4
  feature offload_accum4 "fsdp_offload_params, gradient accumulation 4" "$OFFLOAD_STEPS" \
    fsdp_config.fsdp_offload_params=true train.gradient_accumulation_steps=4
  return $failed
}

profile() {
  local sets data
  data=$(mktemp -d "${SCRATCH_DIR:-/tmp}/gpu-session-profile.XXXXXX")
  SCRATCH+=("$data")
  local model=$MODEL seq=$SEQ
  [ "$DRY" = 1 ] && seq=64
  for s in "$@"; do case "$s" in model.config=*) model=${s#model.config=} ;; esac; done
  write_tokens "$data/tokens.bin" $((8 * 4 * seq + seq + 1)) "$model"
  sets=(--set "model.config=$model" --set "data.path=$data/tokens.bin"
        --set data.eval_fraction=0 --set train.eval_interval=0 --set train.steps=6 --set train.micro_batch_size=2
        --set "train.sequence_length=$seq" --set schedule.warmup_steps=0 --set logging.interval=1000
        --set logging.profile_steps=4,5 --set "logging.profile_dir=$OUT/profile" --set checkpoint.export_dir=none
        --set checkpoint.dir=none --set logging.metrics_file= --set logging.tensorboard_dir=
        --set "train.output_dir=$data/run")
  for s in "$@"; do sets+=(--set "$s"); done
  "$FSDPTRAIN" launch --config configs/quickstart.yaml --distributed_type FSDP --main_process_port 0 \
    "${LAUNCH[@]}" "${sets[@]}" 2>&1 | tail -30 | tee "$OUT/profile.log"
  "$PYTHON" scripts/bench/trace_summary.py "$OUT/profile/rank0.steps-4-5.json" --json "$OUT/profile-summary.json" \
    | tee "$OUT/profile-summary.md"
}

# The whole session: each step a child of this script under `timeout`, at most CAP seconds and
# never into the RESERVE seconds kept for the steps after it (both scaled by SESSION_BUDGET_S / 530);
# a step the budget no longer reaches is skipped (and counts as failed).
session() {
  local budget=${SESSION_BUDGET_S:-530} failed=0
  local deadline=$((SECONDS + budget))
  describe_machine
  ensure_built
  { echo "gpu-session $([ "$DRY" = 1 ] && echo 'session --dry' || echo session) on $(machine_name), budget $budget s"; echo
    echo "| step | result | seconds | limit s |"; echo "| --- | --- | ---: | ---: |"; } > "$OUT/session.md"
  step() {  # name cap reserve mode [args...]
    local name=$1 cap=$2 reserve=$3 rc=0 t0=$SECONDS result
    shift 3
    cap=$((cap * budget / 530)) reserve=$((reserve * budget / 530))  # the caps are for 530 s
    local limit=$((deadline - SECONDS - reserve))
    [ "$limit" -gt "$cap" ] && limit=$cap
    echo "=== $name (limit ${limit} s)"
    if [ "$limit" -lt 5 ]; then
      echo "| $name | skipped: the budget is spent | 0 | $limit |" >> "$OUT/session.md"
      failed=1
      return
    fi
    GPU_SESSION_CHILD=1 STEP_LIMIT_S=$limit timeout -k 15 "$limit" bash "$SELF" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
    case $rc in
      0) result=ok ;;
      124 | 137) result="timed out" ;;
      *) result="failed (exit $rc)" ;;
    esac
    [ "$rc" = 0 ] || failed=1
    echo "| $name | $result | $((SECONDS - t0)) | $limit |" >> "$OUT/session.md"
    echo "$name: $result in $((SECONDS - t0)) s"
  }
  step tests 85 445 tests
  step bench 205 240 bench --only "$BENCH_ROWS" "${BENCH_STEPS[@]}"
  step bench8b 200 40 bench8b --only "$BENCH8B_ROWS" "${BENCH8B_STEPS[@]}"
  step profile 40 0 profile
  echo
  cat "$OUT/session.md"
  for table in bench/results.md bench8b/results.md; do
    [ -f "$OUT/$table" ] && { echo; cat "$OUT/$table"; }
  done
  return $failed
}

[ "$child" = 1 ] || [ "$mode" = session ] || describe_machine
case "$mode" in
  session)
    session
    ;;
  build | tests)
    ensure_built
    gpu_tests 2>&1 | tee "$OUT/gpu-tests.log"
    ;;
  bench)
    ensure_built
    install_peer_wheels
    "$PYTHON" scripts/bench/compare.py --fsdptrain "$FSDPTRAIN" --out-dir "$OUT/bench" "${BENCH[@]}" "$@"
    ;;
  bench8b)
    ensure_built
    install_peer_wheels
    "$PYTHON" scripts/bench/compare.py --shape 8b --fsdptrain "$FSDPTRAIN" --out-dir "$OUT/bench8b" "${BENCH8B[@]}" "$@"
    ;;
  benchmoe)
    ensure_built
    "$PYTHON" scripts/bench/compare.py --shape moe --fsdptrain "$FSDPTRAIN" --out-dir "$OUT/benchmoe" "${BENCHMOE[@]}" "$@"
    ;;
  bench-offload)
    ensure_built
    "$PYTHON" scripts/bench/compare.py --fsdptrain "$FSDPTRAIN" --out-dir "$OUT/bench-offload" "${BENCH[@]}" \
      --only fsdptrain-offload,fsdp2-offload "${OFFLOAD_BENCH_STEPS[@]}" "$@"
    ;;
  host)
    host_adamw
    ;;
  features)
    ensure_built
    features
    ;;
  profile)
    ensure_built
    profile "$@"
    ;;
  *)
    echo "usage: [PREBUILT=1] [DRY=1] scripts/gpu-session.sh" \
      "[session [--dry]|build|tests|bench|bench8b|profile|features|bench-offload|host] [args]" >&2
    exit 2
    ;;
esac
