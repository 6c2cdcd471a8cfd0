#!/usr/bin/env bash
# Packs this machine's build for a GPU machine, so a device call spends its minutes on the GPU and
# not on compiling: the stripped fsdptrain and the gpu tests' binaries (nccl_test, fsdp_worker,
# packed_cuda_test, float8_cuda_test) and host_adamw_bench go to third_party/prebuilt/, with the Arrow
# and Parquet libraries fsdptrain links (from this venv's pyarrow, xz-packed in lib/arrow.tar.xz: that
# machine's pyarrow may be another version). What a device call carries is third_party/device/
# (about 26 MB: the device tool sends at most 64 MiB): all of that xz-packed, the runtime libraries
# of third_party/bundle (scripts/bundle-deps.sh) and the peers' wheels; scripts/gpu-session.sh
# unpacks it there on its first PREBUILT=1 run. They load
# LibTorch, NCCL and CUDA from that machine's torch, which must be this build's wheel
# (torch==2.11.0+cu130, as the device tool's machines have it); scripts/gpu-session.sh uses them
# when PREBUILT=1, and builds there otherwise.
# Usage: scripts/prebuilt.sh   (after scripts/setup.sh; env BUILD_DIR, default build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
DEST=third_party/prebuilt
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target fsdptrain nccl_test fsdp_worker packed_cuda_test float8_cuda_test host_adamw_bench
rm -rf "$DEST"
mkdir -p "$DEST/bin"
for b in apps/fsdptrain/fsdptrain tests/nccl_test tests/fsdp_worker tests/packed_cuda_test tests/float8_cuda_test \
  tests/host_adamw_bench; do
  strip -o "$DEST/bin/$(basename "$b")" "$BUILD_DIR/$b"
done
# The Arrow libraries the binary needs, by the names it needs them (libarrow.so.2600, ...).
arrow=$(.venv/bin/python -c 'import os, pyarrow; print(os.path.dirname(pyarrow.__file__))')
mapfile -t needed < <(readelf -d "$DEST/bin/fsdptrain" | sed -n 's/.*Shared library: \[\(lib\(arrow\|parquet\)[^]]*\)\]/\1/p')
if [ "${#needed[@]}" -gt 0 ]; then
  mkdir -p "$DEST/lib"
  tar -C "$arrow" -cf - "${needed[@]}" | xz -T"${JOBS:-2}" -6 > "$DEST/lib/arrow.tar.xz"
fi
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- lib apps tests || echo ' plus uncommitted changes')"
  echo "torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
} > "$DEST/BUILT_FROM"
# What a device call carries: third_party/device/ (git-ignored).
DEVICE=third_party/device
rm -rf "$DEVICE"
mkdir -p "$DEVICE"
tar -C "$DEST" -cf - . | xz -T"${JOBS:-2}" -6 > "$DEVICE/prebuilt.tar.xz"
libs=third_party/bundle/usr/lib/x86_64-linux-gnu
if compgen -G "$libs/*.so.*" > /dev/null; then  # the shared libraries alone, not headers or archives
  (cd "$libs" && tar -cf - $(ls | grep -E '\.so\.[0-9]') | xz -T"${JOBS:-2}" -6) > "$DEVICE/bundle-libs.tar.xz"
else
  echo "prebuilt: no $libs (run scripts/bundle-deps.sh): the device machine must have yaml-cpp, PCRE2 and libunistring" >&2
fi
[ -d third_party/bundle/wheels ] && cp -r third_party/bundle/wheels "$DEVICE/wheels"
du -sh "$DEST" "$DEVICE"
cat "$DEST/BUILT_FROM"
