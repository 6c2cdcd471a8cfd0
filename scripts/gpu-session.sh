#!/usr/bin/env bash
# Everything a GPU machine is for, in two steps that each fit one 10-minute call of the device tool
# (carry third_party/bundle from scripts/bundle-deps.sh; results land under $OUT, or ./gpu-results):
#   scripts/gpu-session.sh build   build offline against the machine's torch, run the gpu-labelled tests
#   scripts/gpu-session.sh bench   the side-by-side benchmark (scripts/bench/compare.py) on the ~1B Llama
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export BUILD_DIR=${BUILD_DIR:-build-offline}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt" || true
case "${1:-}" in
  build)
    FSDP_NO_TESTS=1 scripts/build-offline.sh 2>&1 | tail -20 | tee "$OUT/build.log"
    (cd "$BUILD_DIR" && ctest -L gpu --output-on-failure --timeout 600) 2>&1 | tee "$OUT/gpu-tests.log"
    ;;
  bench)
    shift
    python3 scripts/bench/compare.py --fsdptrain "$BUILD_DIR/apps/fsdptrain/fsdptrain" --out-dir "$OUT/bench" "$@"
    ;;
  *)
    echo "usage: scripts/gpu-session.sh build|bench [compare.py args]" >&2
    exit 2
    ;;
esac
