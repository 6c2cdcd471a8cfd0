"""Decoding speed of `fsdptrain generate` against transformers' generate, side by side in one run:
the same model (the configs/models shape, random weights made and saved by transformers), the same
prompt and the same number of new tokens, greedy, fp32, on the same device and threads. It also
checks the two chose the same tokens.

Tokens/s is new tokens over the whole call (prompt prefill included) for both. The model has no
EOS id, so both generate exactly --new tokens.

  python scripts/bench/generate_speed.py --fsdptrain build/apps/fsdptrain/fsdptrain \
      [--model-config configs/models/llama-125m/config.json] [--new 128] [--device cpu]
"""
import argparse
import json
import os
import re
import subprocess
import tempfile
import time

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PROMPT = "FSDP2 shards every parameter of a decoder layer over the ranks, and gathers it"


def make_folder(config_path, folder, source):
    config = transformers.AutoConfig.from_pretrained(os.path.dirname(os.path.abspath(config_path)))
    config.eos_token_id = None
    config.bos_token_id = None
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = None
    model.save_pretrained(folder)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(open(os.path.join(source, "README.md")).read().splitlines(),
                            trainers.BpeTrainer(vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(folder, "tokenizer.json"))
    return model.eval(), tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--model-config", default="configs/models/llama-125m/config.json")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    source = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as d:
        model, tok = make_folder(a.model_config, d, source)
        prompts = os.path.join(d, "prompts.jsonl")
        open(prompts, "w").write(json.dumps({"prompt": PROMPT}) + "\n")
        out = os.path.join(d, "out.jsonl")
        r = subprocess.run([a.fsdptrain, "generate", "--model", d, "--prompts", prompts, "--output", out,
                            "--max_new_tokens", str(a.new), "--device", a.device],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        ours_ids = json.loads(open(out).read())["completion_ids"]
        m = re.search(r"(\d+) new tokens in ([0-9.]+) (ms|s)", r.stderr)
        ours_s = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
        model = model.to(a.device)
        ids = torch.tensor([tok.encode(PROMPT).ids], device=a.device)
        with torch.no_grad():
            model.generate(ids, do_sample=False, max_new_tokens=4)  # warm-up
            start = time.perf_counter()
            theirs = model.generate(ids, do_sample=False, max_new_tokens=a.new, min_new_tokens=a.new)
            if a.device == "cuda":
                torch.cuda.synchronize()
            theirs_s = time.perf_counter() - start
        theirs_ids = theirs[0, ids.shape[1]:].tolist()
        n = sum(p.numel() for p in model.parameters())
        print(f"model: {a.model_config} ({n / 1e6:.1f}M parameters), prompt {ids.shape[1]} tokens, {a.new} new tokens, "
              f"greedy, fp32, {a.device}, {torch.get_num_threads()} threads")
        print(f"fsdptrain generate: {len(ours_ids) / ours_s:8.1f} tokens/s ({ours_s:.2f} s)")
        print(f"transformers:       {len(theirs_ids) / theirs_s:8.1f} tokens/s ({theirs_s:.2f} s)")
        print(f"ratio: {(len(ours_ids) / ours_s) / (len(theirs_ids) / theirs_s):.2f}x; "
              f"the same tokens: {ours_ids == theirs_ids}")


if __name__ == "__main__":
    main()
