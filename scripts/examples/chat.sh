#!/usr/bin/env bash
# The chat fine-tuning example, one command (from any directory; it works in the repository's runs/chat):
#   1. makes a small Qwen2-shaped instruct-style Hugging Face folder with transformers (ChatML chat
#      template, a tokenizer trained on the data) and a JSONL of two-turn conversations
#      (make_chat_example.py; once),
#   2. shows how the first conversation renders and which characters the loss counts
#      (`fsdptrain chat-template`),
#   3. fine-tunes it with `fsdptrain launch --config configs/chat.yaml` on 2 CPU workers,
#   4. chats with the result: `fsdptrain generate --chat`.
# Needs scripts/setup.sh to have run (the build and the virtual environment).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
FSDPTRAIN=./build/apps/fsdptrain/fsdptrain
[ -x "$FSDPTRAIN" ] && [ -x "$PY" ] || { echo "chat.sh: run bash scripts/setup.sh first" >&2; exit 1; }
[ -f runs/chat/model/config.json ] ||
  "$PY" scripts/examples/make_chat_example.py --out runs/chat 2>/dev/null | grep -v '^$'
head -1 runs/chat/train.jsonl > runs/chat/first.jsonl
"$FSDPTRAIN" chat-template runs/chat/first.jsonl --tokenizer runs/chat/model
rm -rf runs/chat/run  # an earlier run's folder (a new run refuses to mix with it)
"$FSDPTRAIN" launch --config configs/chat.yaml "$@"
"$FSDPTRAIN" generate --model runs/chat/run/export/step-200 --chat --prompt 'What color is the violin?' --max_new_tokens 16
