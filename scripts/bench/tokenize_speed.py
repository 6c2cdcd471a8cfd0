"""Tokens/s of `fsdptrain tokenize` against the Python `tokenizers` package's batch encoding
(encode_batch, which uses every core) on the same corpus, tokenizer and cores, in one run.

A Llama 3-style tokenizer (ByteLevel BPE with Llama 3's split regex, vocabulary --vocab) is trained
here on the corpus: fsdptrain's own sources and README, repeated to --mb megabytes as one JSONL
document per source file. fsdptrain's time includes reading the JSONL and writing the shards.

  python scripts/bench/tokenize_speed.py --fsdptrain build/apps/fsdptrain/fsdptrain [--mb 50]
"""
import argparse
import glob
import json
import os
import re
import subprocess
import tempfile
import time

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--vocab", type=int, default=8000)
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    files = sorted(glob.glob(os.path.join(root, "lib", "*", "*.*")) + [os.path.join(root, "README.md")])
    docs = [open(f, encoding="utf-8").read() for f in files]
    corpus, size = [], 0
    while size < a.mb * 1e6:
        for d in docs:
            corpus.append(d)
            size += len(d.encode("utf-8"))
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|end_of_text|>"],
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "model")
        os.makedirs(model)
        t.save(os.path.join(model, "tokenizer.json"))
        json.dump({"eos_token": "<|end_of_text|>"}, open(os.path.join(model, "tokenizer_config.json"), "w"))
        jsonl = os.path.join(d, "corpus.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            for doc in corpus:
                f.write(json.dumps({"text": doc}) + "\n")
        start = time.perf_counter()
        ref = sum(len(e.ids) + 1 for e in t.encode_batch(corpus))
        ref_s = time.perf_counter() - start
        start = time.perf_counter()
        out = subprocess.run([a.fsdptrain, "tokenize", "--tokenizer", model, "--input", jsonl, "--output",
                              os.path.join(d, "shards")], capture_output=True, text=True, check=True)
        ours_s = time.perf_counter() - start
        ours = int(re.search(r"into (\d+) tokens", out.stdout).group(1))
    assert ours == ref, (ours, ref)
    print(f"corpus {size / 1e6:.1f} MB, {ref} tokens, vocabulary {a.vocab}, {cores} cores")
    print(f"tokenizers encode_batch: {ref / ref_s / 1e6:.2f} M tokens/s ({ref_s:.2f} s)")
    print(f"fsdptrain tokenize:      {ours / ours_s / 1e6:.2f} M tokens/s ({ours_s:.2f} s, with file reading and writing)")
    print(f"ratio fsdptrain / tokenizers: {ref_s / ours_s:.2f}x")


if __name__ == "__main__":
    main()
