#!/usr/bin/env bash
# The fine-tuning example, one command (from any directory; it works in the repository's runs/finetune):
#   1. makes a small Llama-shaped Hugging Face folder with transformers and a tokenizer trained on
#      the data, and a JSONL of prompt/completion records (make_finetune_example.py; once),
#   2. fine-tunes it with `fsdptrain launch --config configs/finetune.yaml` on 2 CPU workers,
#   3. shows what it learned: `fsdptrain generate` completes four of the training prompts.
# Needs scripts/setup.sh to have run (the build and the virtual environment).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
FSDPTRAIN=./build/apps/fsdptrain/fsdptrain
[ -x "$FSDPTRAIN" ] && [ -x "$PY" ] || { echo "finetune.sh: run bash scripts/setup.sh first" >&2; exit 1; }
[ -f runs/finetune/model/config.json ] ||
  "$PY" scripts/examples/make_finetune_example.py --out runs/finetune 2>/dev/null | grep -v '^$'  # (the trainer's blank lines)
rm -rf runs/finetune/run  # an earlier run's folder (a new run refuses to mix with it)
"$FSDPTRAIN" launch --config configs/finetune.yaml "$@"
# 3. What it learned: fsdptrain generate on the export (which carries the tokenizer), greedy.
python3 -c 'import json,sys; [print(json.dumps({"prompt": json.loads(l)["prompt"]})) for l in sys.stdin.readlines()[:4]]' \
  < runs/finetune/train.jsonl > runs/finetune/prompts.jsonl
"$FSDPTRAIN" generate --model runs/finetune/run/export/step-300 --prompts runs/finetune/prompts.jsonl --max_new_tokens 16
"$FSDPTRAIN" generate --model runs/finetune/run/export/step-300 --prompt $'Q: What color is the lantern?\nA:' --max_new_tokens 16
