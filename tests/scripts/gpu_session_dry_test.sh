#!/usr/bin/env bash
# scripts/gpu-session.sh's dry run: the GPU session's steps (gpu tests, the benchmark at the 1B and 8B
# shapes, profile) on CPU at tiny shapes, then the steps a session runs only by name (features,
# bench-offload, host), so the script that a lent GPU runs once cannot rot in between.
# Passes when each exits 0, every result file it promises exists and is not empty, the benchmark's
# rows either ran or were skipped for a reason a CPU has (GPU-only rows; TorchTitan where its wheels
# are not installed), and no row's losses are flagged as diverging from fsdptrain's.
# Usage: tests/scripts/gpu_session_dry_test.sh [FSDPTRAIN] [PYTHON]
#   (default: build/apps/fsdptrain/fsdptrain and .venv/bin/python of this checkout)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
fsdptrain=$(realpath "${1:-$root/build/apps/fsdptrain/fsdptrain}")
python=${2:-$root/.venv/bin/python}
build_dir=$(cd "$(dirname "$fsdptrain")/../.." && pwd)
out=$(mktemp -d /tmp/gpu_session_dry_test.XXXXXX)
trap 'rm -rf "$out"' EXIT

failed=0
fail() { echo "FAIL: $*"; failed=1; }
t0=$SECONDS
for run in "session --dry" features bench-offload host; do
  rc=0
  # shellcheck disable=SC2086  # $run is a mode and its flag
  OUT=$out FSDPTRAIN=$fsdptrain BUILD_DIR=$build_dir PYTHON=$python PREBUILT=0 DRY=1 \
    bash "$root/scripts/gpu-session.sh" $run > "$out/${run%% *}.out" 2>&1 || rc=$?
  echo "gpu-session.sh $run: exit $rc at $((SECONDS - t0)) s"
  [ "$rc" = 0 ] || fail "gpu-session.sh $run exited $rc (its output: ${run%% *}.out, last lines below)"
done
cat "$out/session.md" 2>/dev/null || true

for f in gpu.txt session.md tests.log bench.log bench8b.log profile.log profile-summary.md profile-summary.json \
         bench/results.md bench/results.json bench/host.md bench/model-config.json bench/bench.yaml \
         bench/fsdptrain.log bench/fsdptrain.jsonl bench/compiled.log bench/compiled.json \
         bench/fsdp2-compile.log bench/fsdp2-compile.json bench/accelerate.log bench/accelerate.json \
         bench8b/results.md bench8b/results.json bench8b/host.md bench8b/fsdptrain.jsonl bench8b/fsdp2-compile.json \
         bench-offload/results.md feature-matrix.md host-adamw.md \
         features/ac.log features/mb4.log features/offload.log features/accum4.log features/offload_accum4.log \
         features/lora.log features/ckpt_full.log features/ckpt_sharded.log features/resume.log \
         features/generate.log features/chat.log; do
  [ -s "$out/$f" ] || fail "$f is missing or empty"
done
grep -Eq 'failed|timed out|skipped' "$out/session.md" && fail "a step did not succeed (session.md above)"

# The benchmark: every row in its table or skipped for a reason a CPU has, none flagged.
for table in bench/results.md bench8b/results.md bench-offload/results.md; do
  [ -f "$out/$table" ] || continue
  grep -E '^- [a-z0-9-]+: (failed|timed out)' "$out/$table" && fail "$table: a row failed"
  grep -E '^- [a-z0-9-]+: skipped' "$out/$table" | grep -Ev "GPU only|compute capability 8.9|torchtitan is not installed" &&
    fail "$table: a row skipped without a CPU's reason"
  grep -q 'DIVERGES' "$out/$table" && fail "$table: a row's losses diverge from fsdptrain's"
done
for row in fsdptrain compiled fsdp2-compile accelerate; do
  grep -q "^| $row: " "$out/bench/results.md" || fail "bench/results.md has no $row row"
done
grep -q '^- liger: skipped: ' "$out/bench/results.md" || fail "bench/results.md does not say why liger was skipped"
for row in fsdptrain fsdp2-compile; do
  grep -q "^| $row: " "$out/bench8b/results.md" || fail "bench8b/results.md has no $row row"
done
grep -q 'activation_checkpointing": true' "$out/bench8b/results.json" || fail "bench8b did not checkpoint activations"
grep -q '^- fsdptrain-float8: skipped: ' "$out/bench8b/results.md" || fail "bench8b does not say why float8 was skipped"
grep -q "TorchTitan's published Llama 3.1 8B" "$out/bench8b/results.md" || fail "bench8b has no published anchors"
grep -q '^| torch | ' "$out/bench/host.md" || fail "bench/host.md has no versions"
grep -q '^| fsdptrain | ' "$out/bench/host.md" || fail "bench/host.md has no line for the fsdptrain row"

# The feature table (gpu-session.sh features).
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
  for f in session features bench-offload host; do
    echo "--- gpu-session.sh ${f}'s output (last 40 lines)"
    tail -40 "$out/$f.out" 2>/dev/null || true
  done
  for f in bench/results.md bench8b/results.md feature-matrix.md; do
    [ -f "$out/$f" ] && { echo "--- $f"; cat "$out/$f"; }
  done
  exit 1
fi
cat "$out/bench/results.md" "$out/bench8b/results.md" "$out/feature-matrix.md"
echo "PASS"
