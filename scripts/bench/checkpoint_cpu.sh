#!/usr/bin/env bash
# Checkpoint save and load times, and every rank's peak host memory, for a model (default: the
# ~125M Llama) trained one step by W CPU workers: SHARDED_STATE_DICT and FULL_STATE_DICT saves and
# resumes, and fine-tuning from a Hugging Face folder with and without cpu_ram_efficient_loading.
# Prints the trainer's own [ckpt]/[train] lines for each case.
# Usage: scripts/bench/checkpoint_cpu.sh [MODEL_CONFIG] [WORLD_SIZE]   (after scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
model="${1:-configs/models/llama-125m/config.json}"
world="${2:-2}"
out="$(mktemp -d /tmp/fsdptrain_ckpt_bench.XXXXXX)"
trap 'rm -rf "$out"' EXIT
runs=0
run() {  # label, then --set overrides; each run its own run folder (train.output_dir)
  local label="$1"
  shift
  echo "== $label"
  runs=$((runs + 1))
  local sets=(--set "train.output_dir=$out/run$runs")
  for s in "$@"; do sets+=(--set "$s"); done
  ./build/apps/fsdptrain/fsdptrain launch --config configs/quickstart.yaml --main_process_port 0 \
    --num_processes "$world" --set "model.config=$model" --set train.micro_batch_size=1 \
    --set train.sequence_length=128 --set train.eval_interval=0 --set train.eval_batches=1 \
    --set logging.interval=1 --set checkpoint.export_dir= "${sets[@]}" 2>&1 |
    grep -E '\[ckpt\]|peak host memory|exported|loaded' | sed 's/^\[rank 0\] //'
}
for type in SHARDED_STATE_DICT FULL_STATE_DICT; do
  run "$type: train 1 step, save" "fsdp_config.fsdp_state_dict_type=$type" "checkpoint.dir=$out/$type" \
    train.steps=1 "checkpoint.export_dir=$out/hf_$type"
  for efficient in true false; do
    run "$type: resume (cpu_ram_efficient_loading: $efficient)" "fsdp_config.fsdp_state_dict_type=$type" \
      "checkpoint.dir=$out/$type" checkpoint.resume=latest train.steps=1 \
      "fsdp_config.fsdp_cpu_ram_efficient_loading=$efficient"
  done
done
for efficient in true false; do
  run "Hugging Face folder, cpu_ram_efficient_loading: $efficient" "model.config=" \
    "model.pretrained=$out/hf_SHARDED_STATE_DICT/step-1" train.steps=1 \
    "fsdp_config.fsdp_cpu_ram_efficient_loading=$efficient"
done
