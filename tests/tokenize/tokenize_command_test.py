"""`fsdptrain tokenize` against the Python `tokenizers` package: the shards hold, in input order,
each document's ids (with the tokenizer's BOS template) followed by EOS, split at --shard_size;
the llm.c reader reads them back; bad input names the file and line and leaves nothing behind."""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def make_model(d, texts):
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
                                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    t.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=700, special_tokens=special,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                     special_tokens=[("<|begin_of_text|>", 0)])
    os.makedirs(os.path.join(d, "model"))
    t.save(os.path.join(d, "model", "tokenizer.json"))
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}},
              open(os.path.join(d, "model", "tokenizer_config.json"), "w"))
    return t


def read_shard(path):
    data = open(path, "rb").read()
    magic, _, count = struct.unpack("<3i", data[:12])
    width = {20240520: 2, 20240801: 4}[magic]
    assert len(data) == 1024 + count * width, (path, len(data), count)
    return list(struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data[1024:]))


def run(fsdptrain, *args):
    return subprocess.run([fsdptrain, "tokenize", *args], capture_output=True, text=True, timeout=300)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    readme = open(os.path.join(a.source, "README.md"), encoding="utf-8").read()
    lines = [l for l in readme.splitlines() if l.strip()]
    with tempfile.TemporaryDirectory() as d:
        tok = make_model(d, lines)
        jsonl = os.path.join(d, "docs.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            for i, l in enumerate(lines):
                f.write(json.dumps({"body": l, "n": i}, ensure_ascii=False) + "\n")
                if i % 50 == 0:
                    f.write("\n")  # blank lines are skipped
        text = os.path.join(d, "notes.txt")
        open(text, "w", encoding="utf-8").write("你好 — a whole file is one document 😀\n")
        out = os.path.join(d, "shards")
        r = run(a.fsdptrain, "--tokenizer", os.path.join(d, "model"), "--input", jsonl, text, "--output", out,
                "--field", "body", "--shard_size", "5K", "--jobs", "3")
        assert r.returncode == 0, r.stderr
        eos = tok.token_to_id("<|end_of_text|>")
        want = []
        for doc in lines + [open(text, encoding="utf-8").read()]:
            want += tok.encode(doc).ids + [eos]
        shards = sorted(f for f in os.listdir(out))
        got = [i for s in shards for i in read_shard(os.path.join(out, s))]
        assert got == want, "shard ids differ from tokenizers'"
        assert len(shards) == (len(want) + 4999) // 5000, shards
        assert all(len(read_shard(os.path.join(out, s))) == 5000 for s in shards[:-1])
        assert f"tokenized {len(lines) + 1} documents" in r.stdout and f"into {len(want)} tokens" in r.stdout, r.stdout
        print(f"tokenize: {len(lines) + 1} documents, {len(want)} tokens in {len(shards)} shards equal tokenizers' ids")

        # Bad input: a line without the field, named with its line; nothing is left behind.
        bad = os.path.join(d, "bad.jsonl")
        open(bad, "w").write('{"body": "ok"}\n{"text": "wrong field"}\n')
        out2 = os.path.join(d, "bad_out")
        r = run(a.fsdptrain, "--tokenizer", os.path.join(d, "model"), "--input", bad, "--output", out2, "--field", "body")
        assert r.returncode == 2 and f'{bad}:2: no string field "body"' in r.stderr, r.stderr
        assert not os.path.exists(out2) and not os.path.exists(out2 + ".partial")
        # An existing output, a compressed input, a folder without tokenizer.json.
        r = run(a.fsdptrain, "--tokenizer", os.path.join(d, "model"), "--input", jsonl, "--output", out)
        assert r.returncode == 2 and "already exists" in r.stderr, r.stderr
        gz = os.path.join(d, "x.jsonl.gz")
        open(gz, "wb").write(b"\x1f\x8b")
        r = run(a.fsdptrain, "--tokenizer", os.path.join(d, "model"), "--input", gz, "--output", out2)
        assert r.returncode == 2 and "is compressed; decompress it first" in r.stderr, r.stderr
        r = run(a.fsdptrain, "--tokenizer", d, "--input", jsonl, "--output", out2)
        assert r.returncode == 2 and "has no tokenizer.json" in r.stderr, r.stderr
    print("tokenize_command_test: ok")


if __name__ == "__main__":
    sys.exit(main())
