#!/usr/bin/env bash
# An offline bundle for a machine with no package manager or network (a cluster node, the lent GPU
# machine), in third_party/bundle/ (git-ignored); carry that folder there.
#   debs    fsdptrain's Debian dependencies (yaml-cpp, CLI11, nlohmann-json, doctest, PCRE2, libunistring,
#           zlib, zstd): their .deb packages downloaded with apt-get (no root needed) and unpacked
#           under third_party/bundle/, where CMake looks first (cmake/FsdpDependencies.cmake); there,
#           configure against the torch the machine already has:
#             cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')"
#   wheels  the benchmark's peers (scripts/bench/compare.py's torchtitan, torchtitan-float8 and liger
#           rows) as Python wheels in third_party/bundle/wheels/, for CPython 3.12 on x86-64 Linux
#           (the GPU machine's): torchtitan 0.3.0 and what its modules the benchmark imports need
#           that the machine lacks (spmd_types 0.2.3, tyro and tyro's docstring-parser and typeguard;
#           not its data, checkpoint or logging dependencies: torchdata, datasets, wandb are not
#           imported there), liger-kernel 0.8.5 and torchao 0.18.0. scripts/gpu-session.sh installs
#           them with pip install --no-index --no-deps --target into a temporary folder on PYTHONPATH.
# Usage: scripts/bundle-deps.sh [all|debs|wheels]   (default all; each part replaces only its own files)
# Environment: PYTHON (python3), whose pip downloads the wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=third_party/bundle
part=${1:-all}
case $part in all | debs | wheels) ;; *) echo "usage: scripts/bundle-deps.sh [all|debs|wheels]" >&2; exit 2 ;; esac
work=$(mktemp -d)
chmod 755 "$work"  # apt-get download writes as its _apt user
trap 'rm -rf "$work"' EXIT

if [ "$part" != wheels ]; then
  packages=(libyaml-cpp-dev libcli11-dev nlohmann-json3-dev doctest-dev libpcre2-dev libpcre2-8-0 libunistring-dev
    libunistring2 zlib1g-dev libzstd-dev libzstd1)
  # The shared library libyaml-cpp-dev's libyaml-cpp.so points into (libyaml-cpp0.7 on Debian 12).
  runtime=$(apt-cache depends libyaml-cpp-dev | sed -n 's/^ *Depends: \(libyaml-cpp[0-9.]*\)$/\1/p' | head -1)
  if [[ -z "$runtime" ]]; then
    echo "bundle-deps: cannot find the yaml-cpp runtime package (apt-cache depends libyaml-cpp-dev); run apt-get update" >&2
    exit 1
  fi
  packages+=("$runtime")
  mkdir -p "$work/debs"
  chmod 755 "$work/debs"
  (cd "$work/debs" && apt-get download "${packages[@]}")
  mkdir -p "$dest"
  find "$dest" -mindepth 1 -maxdepth 1 ! -name wheels -exec rm -rf {} +
  for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$dest"
    echo "bundle-deps: $(basename "$deb")"
  done
  echo "bundle-deps: unpacked ${#packages[@]} packages into $dest ($(du -sh --exclude=wheels "$dest" | cut -f1)); CMake finds them there"
fi

if [ "$part" != debs ]; then
  PYTHON=${PYTHON:-python3}
  wheels=(torchtitan==0.3.0 spmd_types==0.2.3 tyro==1.0.17 docstring-parser==0.18.0 typeguard==4.6.1
          liger-kernel==0.8.5 torchao==0.18.0)
  if ! "$PYTHON" -m pip --version > /dev/null 2>&1; then
    echo "bundle-deps: $PYTHON has no pip; set PYTHON to a Python with pip (e.g. .venv/bin/python)" >&2
    exit 1
  fi
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work/wheels" \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux2014_x86_64 \
    --platform any "${wheels[@]}"
  rm -rf "$dest/wheels"
  mkdir -p "$dest"
  mv "$work/wheels" "$dest/wheels"
  for wheel in "$dest"/wheels/*.whl; do echo "bundle-deps: $(basename "$wheel")"; done
  echo "bundle-deps: ${#wheels[@]} wheels in $dest/wheels ($(du -sh "$dest/wheels" | cut -f1)); scripts/gpu-session.sh installs them"
fi
