#!/usr/bin/env bash
# An offline bundle of fsdptrain's Debian dependencies (yaml-cpp, CLI11, nlohmann-json, doctest, PCRE2,
# libunistring, zlib, zstd):
# downloads their .deb packages with apt-get (no root needed) and unpacks them under
# third_party/bundle/ (git-ignored), where CMake looks first (cmake/FsdpDependencies.cmake). Run it
# on a machine with Debian's package manager, then copy or carry third_party/bundle to a cluster
# node or GPU machine that has no package manager or network; there, configure against the torch
# it already has:
#   cmake -S . -B build -G Ninja -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')"
# Usage: scripts/bundle-deps.sh   (re-running replaces the bundle)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=third_party/bundle
packages=(libyaml-cpp-dev libcli11-dev nlohmann-json3-dev doctest-dev libpcre2-dev libpcre2-8-0 libunistring-dev
  libunistring2 zlib1g-dev libzstd-dev libzstd1)
# The shared library libyaml-cpp-dev's libyaml-cpp.so points into (libyaml-cpp0.7 on Debian 12).
runtime=$(apt-cache depends libyaml-cpp-dev | sed -n 's/^ *Depends: \(libyaml-cpp[0-9.]*\)$/\1/p' | head -1)
if [[ -z "$runtime" ]]; then
  echo "bundle-deps: cannot find the yaml-cpp runtime package (apt-cache depends libyaml-cpp-dev); run apt-get update" >&2
  exit 1
fi
packages+=("$runtime")
work=$(mktemp -d)
chmod 755 "$work"  # apt-get download writes as its _apt user
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}")
rm -rf "$dest"
mkdir -p "$dest"
for deb in "$work"/*.deb; do
  dpkg-deb -x "$deb" "$dest"
  echo "bundle-deps: $(basename "$deb")"
done
echo "bundle-deps: unpacked ${#packages[@]} packages into $dest ($(du -sh "$dest" | cut -f1)); CMake finds them there"
