#!/usr/bin/env bash
# Builds fsdptrain where there is no package manager and no network (a cluster node, the GPU
# machine), against the LibTorch of the python3 that already has torch and the NCCL that torch
# loads (its nvidia-nccl package). Needs: third_party/bundle from scripts/bundle-deps.sh (copied or
# carried here), cmake, a C++17 compiler, ninja or make, and nvcc for a CUDA torch (found on PATH,
# in $CUDA_HOME or /usr/local/cuda). Then runs the tests unless told otherwise.
# Usage: scripts/build-offline.sh [ctest args...]   env: PYTHON (python3), BUILD_DIR (build-offline),
#        FSDP_NO_TESTS=1 to build only
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUILD_DIR=${BUILD_DIR:-build-offline}
if [ ! -d third_party/bundle/usr ]; then
  echo "build-offline: third_party/bundle is missing; run scripts/bundle-deps.sh on a Debian machine and copy third_party/bundle here" >&2
  exit 1
fi
TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
CUDA_ARGS=()
NVCC=$(command -v nvcc || true)
for c in "${CUDA_HOME:-}/bin/nvcc" /usr/local/cuda/bin/nvcc; do [ -z "$NVCC" ] && [ -x "$c" ] && NVCC=$c; done
if [ -n "$NVCC" ]; then
  CUDA_ARGS=(-DCMAKE_CUDA_COMPILER="$NVCC" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$NVCC")")")
fi
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
echo "build-offline: torch $("$PY" -c 'import torch;print(torch.__version__, "CUDA", torch.version.cuda)'), nvcc ${NVCC:-none}"
cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  -DFSDP_PYTHON="$(command -v "$PY")" "${CUDA_ARGS[@]}"
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "build-offline: done: $BUILD_DIR/apps/fsdptrain/fsdptrain"
if [ "${FSDP_NO_TESTS:-0}" != 1 ]; then
  cd "$BUILD_DIR"
  if [ $# -eq 0 ]; then set -- -L 'unit|dist|gpu'; fi
  ctest --output-on-failure --timeout 600 "$@"
fi
