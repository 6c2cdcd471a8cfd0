#!/usr/bin/env bash
# Sets up and builds (scripts/setup.sh), checks function lengths and include cycles (scripts/), then
# runs the tests: `unit` and `dist` labels by default
# (`gpu` tests skip themselves without a GPU). Extra arguments go to ctest, e.g. -L unit or -R config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/function-lengths.sh .venv/bin/python
.venv/bin/python scripts/include-cycles.py
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
if [ $# -eq 0 ]; then set -- -L 'unit|dist|gpu'; fi
# As many tests at once as cores, at most 8 unless CTEST_PARALLEL_LEVEL says otherwise: one test
# alone keeps about 1.2 of 2 cores busy, most of its time spent starting processes (Python's
# imports, LibTorch's operator registry) and in ranks waiting on each other.
cores=$(nproc)
jobs=${CTEST_PARALLEL_LEVEL:-$((cores < 8 ? cores : 8))}
# Each test's processes get its share of the cores: LibTorch's OpenMP threads (in fsdptrain's
# workers, which take the launcher's value, and in the Python peers) spin while they wait, so jobs
# tests of `cores` threads each would take turns on the cores. Measured here alone (2 cores),
# families_finetune_test: 152 s of CPU with 2 threads, 127 with 1.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / jobs > 0 ? cores / jobs : 1))}
ctest --output-on-failure --timeout 600 -j "$jobs" "$@"
