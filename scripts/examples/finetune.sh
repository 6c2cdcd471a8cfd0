#!/usr/bin/env bash
# The fine-tuning example, one command (from any directory; it works in the repository's runs/finetune):
#   1. makes a small Llama-shaped Hugging Face folder with transformers and a tokenizer trained on
#      the data, and a JSONL of prompt/completion records (make_finetune_example.py; once),
#   2. fine-tunes it with `fsdptrain launch --config configs/finetune.yaml` on 2 CPU workers,
#   3. shows what it learned: transformers' greedy completions from the exported folder.
# Needs scripts/setup.sh to have run (the build and the virtual environment).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
FSDPTRAIN=./build/apps/fsdptrain/fsdptrain
[ -x "$FSDPTRAIN" ] && [ -x "$PY" ] || { echo "finetune.sh: run bash scripts/setup.sh first" >&2; exit 1; }
[ -f runs/finetune/model/config.json ] ||
  "$PY" scripts/examples/make_finetune_example.py --out runs/finetune 2>/dev/null | grep -v '^$'  # (the trainer's blank lines)
rm -rf runs/finetune/export  # an earlier run's (a run refuses to export over one)
"$FSDPTRAIN" launch --config configs/finetune.yaml "$@"
"$PY" - <<'PY' 2>/dev/null
import glob, json, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder = sorted(glob.glob("runs/finetune/export/step-*"), key=lambda p: int(p.rsplit("-", 1)[1]))[-1]
tok = AutoTokenizer.from_pretrained("runs/finetune/model")
model = AutoModelForCausalLM.from_pretrained(folder).eval()
rows = [json.loads(l) for l in open("runs/finetune/train.jsonl")][:4]
print(f"completions of {folder} (greedy, transformers):")
for r in rows:
    ids = tok(r["prompt"], return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    print(f"  {json.dumps(r['prompt'])} -> {json.dumps(text)}  (trained on {json.dumps(r['completion'])})")
PY
