#!/usr/bin/env bash
# Everything a GPU machine is for, in steps that each fit one 10-minute call of the device tool
# (carry third_party/bundle from scripts/bundle-deps.sh; results land under $OUT, or ./gpu-results).
# A call may land on a fresh machine, so each step builds first unless the build is already there,
# or with PREBUILT=1 uses the binaries scripts/prebuilt.sh packed (carry third_party/prebuilt too):
#   scripts/gpu-session.sh build     build offline against the machine's torch, run the gpu-labelled tests
#                                    (`tests` is the same; with PREBUILT=1 nothing is built)
#   scripts/gpu-session.sh bench     the side-by-side benchmark (scripts/bench/compare.py) on the ~1B Llama
#   scripts/gpu-session.sh profile   trace steps 4-5 of fsdptrain on the ~1B Llama (bf16, sequence 2048)
#                                    and summarize where the time goes (scripts/bench/trace_summary.py)
# Extra arguments go to compare.py (bench), or are --set overrides (profile), e.g. train.micro_batch_size=4.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export BUILD_DIR=${BUILD_DIR:-build-offline}
FSDPTRAIN=$BUILD_DIR/apps/fsdptrain/fsdptrain
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt" || true

if [ "${PREBUILT:-0}" = 1 ]; then
  # This machine's torch provides LibTorch, CUDA and NCCL; the bundle the Debian libraries.
  TORCH_DIR=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  export LD_LIBRARY_PATH=$TORCH_DIR/lib:$TORCH_DIR/../nvidia/nccl/lib:$TORCH_DIR/../nvidia/cu13/lib:/usr/local/cuda/lib64:$PWD/third_party/bundle/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  FSDPTRAIN=third_party/prebuilt/bin/fsdptrain
  cat third_party/prebuilt/BUILT_FROM | tee "$OUT/prebuilt.txt"
fi

ensure_built() {
  if [ ! -x "$FSDPTRAIN" ]; then
    FSDP_NO_TESTS=1 scripts/build-offline.sh 2>&1 | tail -20 | tee "$OUT/build.log"
  fi
  "$FSDPTRAIN" --version | tee -a "$OUT/gpu.txt"
}

# ctest -L gpu, or its three tests by hand for the prebuilt binaries (ctest's files name this
# machine's paths).
gpu_tests() {
  if [ "${PREBUILT:-0}" != 1 ]; then
    (cd "$BUILD_DIR" && ctest -L gpu --output-on-failure --timeout 600)
    return
  fi
  local bin=third_party/prebuilt/bin failed=0 rc
  set +e
  "$bin/nccl_test"; rc=$?; [ $rc = 0 ] || [ $rc = 77 ] || failed=1; echo "nccl_test: exit $rc"
  "$bin/fsdp_worker" product-cuda; rc=$?; [ $rc = 0 ] || failed=1; echo "fsdp_product_cuda: exit $rc"
  python3 tests/train/gpu_train_test.py --fsdptrain "$FSDPTRAIN" --source "$PWD"; rc=$?
  [ $rc = 0 ] || failed=1; echo "gpu_train_test: exit $rc"
  set -e
  return $failed
}

case "${1:-}" in
  build|tests)
    ensure_built
    gpu_tests 2>&1 | tee "$OUT/gpu-tests.log"
    ;;
  bench)
    shift
    ensure_built
    python3 scripts/bench/compare.py --fsdptrain "$FSDPTRAIN" --out-dir "$OUT/bench" "$@"
    ;;
  profile)
    shift
    ensure_built
    MODEL=configs/models/llama-1b/config.json
    for s in "$@"; do case "$s" in model.config=*) MODEL=${s#model.config=} ;; esac; done
    DATA=$(mktemp -d)
    python3 -c "
import sys; sys.path.insert(0, 'scripts/bench'); import compare, json
c = json.load(open('$MODEL'))
compare.write_tokens('$DATA/tokens.bin', 8 * 4 * 2048 + 2049, c['vocab_size'], 0)"
    sets=(--set "model.config=$MODEL" --set "data.path=$DATA/tokens.bin"
          --set data.eval_fraction=0 --set train.steps=6 --set train.micro_batch_size=2
          --set train.sequence_length=2048 --set schedule.warmup_steps=0 --set logging.interval=1000
          --set logging.profile_steps=4,5 --set "logging.profile_dir=$OUT/profile" --set checkpoint.export_dir=
          --set logging.metrics_file= --set logging.tensorboard_dir= --set "train.output_dir=$OUT/run")
    for s in "$@"; do sets+=(--set "$s"); done
    "$FSDPTRAIN" launch --config configs/quickstart.yaml --set use_cpu=false --distributed_type FSDP \
      --num_processes 1 --mixed_precision bf16 --main_process_port 0 "${sets[@]}" 2>&1 | tail -30 | tee "$OUT/profile.log"
    python3 scripts/bench/trace_summary.py "$OUT/profile/rank0.steps-4-5.json" --json "$OUT/profile-summary.json" \
      | tee "$OUT/profile-summary.md"
    ;;
  *)
    echo "usage: [PREBUILT=1] scripts/gpu-session.sh build|bench|profile [args]" >&2
    exit 2
    ;;
esac
