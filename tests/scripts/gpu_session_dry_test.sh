#!/usr/bin/env bash
# scripts/gpu-session.sh's dry run: the GPU session's steps (gpu tests, benchmark, host AdamW, feature table,
# profile) on CPU at tiny shapes, so the script that a lent GPU runs once cannot rot in between.
# Passes when the session exits 0 and every result file it promises exists and is not empty.
# Usage: tests/scripts/gpu_session_dry_test.sh [FSDPTRAIN] [PYTHON]
#   (default: build/apps/fsdptrain/fsdptrain and .venv/bin/python of this checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
fsdptrain=$(realpath "${1:-$root/build/apps/fsdptrain/fsdptrain}")
python=${2:-$root/.venv/bin/python}
build_dir=$(cd "$(dirname "$fsdptrain")/../.." && pwd)
out=$(mktemp -d /tmp/gpu_session_dry_test.XXXXXX)
trap 'rm -rf "$out"' EXIT

rc=0
t0=$SECONDS
OUT=$out FSDPTRAIN=$fsdptrain BUILD_DIR=$build_dir PYTHON=$python PREBUILT=0 \
  bash "$root/scripts/gpu-session.sh" session --dry > "$out/session.out" 2>&1 || rc=$?
echo "gpu-session.sh session --dry: exit $rc in $((SECONDS - t0)) s"
cat "$out/session.md" 2>/dev/null || true

failed=0
fail() { echo "FAIL: $*"; failed=1; }
[ "$rc" = 0 ] || fail "the dry session exited $rc"
for f in gpu.txt session.md tests.log bench.log bench/results.md bench/results.json \
         bench-offload.log bench-offload/results.md host.log host-adamw.md features.log feature-matrix.md \
         features/ac.log features/mb4.log features/offload.log features/accum4.log features/offload_accum4.log \
         features/lora.log \
         features/ckpt_full.log features/ckpt_sharded.log features/resume.log \
         features/generate.log features/chat.log profile.log profile-summary.md profile-summary.json; do
  [ -s "$out/$f" ] || fail "$f is missing or empty"
done
grep -Eq 'failed|timed out|skipped' "$out/session.md" && fail "a step did not succeed (session.md above)"
rows=$(grep -c '^| [a-z_0-9]* | ' "$out/feature-matrix.md" || true)
[ "$rows" = 12 ] || fail "feature-matrix.md has $((rows - 1)) feature rows, expected 11"
grep -Eq 'FAILED|TIMED OUT' "$out/feature-matrix.md" && fail "a feature failed"
grep -q 'saved .*SHARDED_STATE_DICT' "$out/feature-matrix.md" || fail "no SHARDED save in the feature table"
grep -q 'loaded in' "$out/feature-matrix.md" || fail "the resume row did not load the checkpoint"
grep -q '^| resume | .*peak host memory .* before loading, .* after' "$out/feature-matrix.md" ||
  fail "the resume row does not say what the load did to host memory"
grep -q 'new tokens in' "$out/feature-matrix.md" || fail "the generate row has no speed"
grep -q 'exported in' "$out/feature-matrix.md" || fail "the ckpt_full row did not export"
grep -q '^| offload | .*host AdamW [0-9.]* ms an update at [0-9.]* GB/s' "$out/feature-matrix.md" ||
  fail "the offload row does not say what the host's AdamW cost"
grep -q 'built in' "$out/feature-matrix.md" || fail "no row says how long the model took to build"
if [ "$failed" != 0 ]; then
  echo "--- the session's output (last 60 lines)"
  tail -60 "$out/session.out"
  [ -f "$out/feature-matrix.md" ] && cat "$out/feature-matrix.md"
  exit 1
fi
cat "$out/feature-matrix.md"
echo "PASS"
