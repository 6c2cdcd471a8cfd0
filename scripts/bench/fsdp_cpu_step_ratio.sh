#!/usr/bin/env bash
# Step time of sharded training at W=2 (two CPU workers over Gloo) against one unsharded process
# doing the same work (the same global batch), measured in one run. Prints one line with the ratio.
# Usage: scripts/bench/fsdp_cpu_step_ratio.sh [STEPS] [WORLD_SIZE]   (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
steps="${1:-30}"
world="${2:-2}"
exec ./build/apps/fsdptrain/fsdptrain launch --cpu --distributed_type MULTI_CPU --num_processes "$world" \
  --main_process_port 0 -- ./build/tests/fsdp_worker bench "$steps"
