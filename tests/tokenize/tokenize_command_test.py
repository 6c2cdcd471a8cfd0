"""`fsdptrain tokenize` against the Python `tokenizers` package: the shards hold, in input order,
each document's ids (with the tokenizer's BOS template) followed by EOS, split at --shard_size;
gzip and zstd inputs give the same shards; prompt/completion records give masks that count only
the completions and EOS; a vocabulary beyond uint16 gives uint32 shards; bad input names the file
and line and leaves nothing behind."""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from llmc_shard import read_shard  # noqa: E402

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


def shard_ids(out):
    return [i for s in sorted(f for f in os.listdir(out) if f.endswith(".bin")) for i in read_shard(os.path.join(out, s))]


def shard_masks(out):
    return b"".join(open(os.path.join(out, f), "rb").read() for f in sorted(os.listdir(out)) if f.endswith(".mask"))


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
        shards = sorted(f for f in os.listdir(out) if f.endswith(".bin"))
        got = shard_ids(out)
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
        open(gz, "wb").write(gzip.compress(open(jsonl, "rb").read())[:-20])
        r = run(a.fsdptrain, "--tokenizer", os.path.join(d, "model"), "--input", gz, "--output", out2, "--field", "body")
        assert r.returncode == 2 and gz in r.stderr and "truncated" in r.stderr, r.stderr
        assert not os.path.exists(out2) and not os.path.exists(out2 + ".partial")
        r = run(a.fsdptrain, "--tokenizer", d, "--input", jsonl, "--output", out2)
        assert r.returncode == 2 and "has no tokenizer.json" in r.stderr, r.stderr
        check_compressed(a.fsdptrain, d, jsonl, lines, tok)
        check_prompt_completion(a.fsdptrain, d, tok)
        check_uint32(a.fsdptrain, d, tok)
    print("tokenize_command_test: ok")


def check_compressed(fsdptrain, d, jsonl, lines, tok):
    """The same documents gzip- and zstd-compressed give the same shards."""
    import zstandard
    raw = open(jsonl, "rb").read()
    open(jsonl + ".gz", "wb").write(gzip.compress(raw))
    open(jsonl + ".zst", "wb").write(zstandard.ZstdCompressor().compress(raw))
    eos = tok.token_to_id("<|end_of_text|>")
    want = [i for l in lines for i in tok.encode(l).ids + [eos]]
    for ext in (".gz", ".zst"):
        out = os.path.join(d, "compressed" + ext)
        r = run(fsdptrain, "--tokenizer", os.path.join(d, "model"), "--input", jsonl + ext, "--output", out,
                "--field", "body")
        assert r.returncode == 0, r.stderr
        assert shard_ids(out) == want, ext
    print(f"tokenize: .jsonl.gz and .jsonl.zst give the same {len(want)} ids")


def check_prompt_completion(fsdptrain, d, tok):
    """Prompt/completion records: prompt ids (with BOS) + completion ids + EOS; the mask counts
    the completion and EOS only (bit 0) and marks each record's first token (bit 1); the longest
    prompt is reported with its line."""
    eos = tok.token_to_id("<|end_of_text|>")
    pairs = [("Question: what is fsdptrain?\nAnswer:", " a launcher"), ("Say hi:", " hi there 😀"),
             ("A much longer prompt that goes on for a while, about FSDP2 and shards:", " ok")]
    path = os.path.join(d, "pairs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for p, c in pairs:
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    out = os.path.join(d, "pairs_out")
    r = run(fsdptrain, "--tokenizer", os.path.join(d, "model"), "--input", path, "--output", out, "--shard_size", "20")
    assert r.returncode == 0, r.stderr
    ids, mask = [], []
    for p, c in pairs:
        prompt = tok.encode(p).ids
        completion = tok.encode(c, add_special_tokens=False).ids
        ids += prompt + completion + [eos]
        mask += [2] + [0] * (len(prompt) - 1) + [1] * (len(completion) + 1)
    assert shard_ids(out) == ids
    assert list(shard_masks(out)) == mask, (list(shard_masks(out)), mask)
    longest = max(len(tok.encode(p).ids) for p, _ in pairs)
    assert f"the longest prompt is {longest} tokens ({path}:3)" in r.stdout, r.stdout
    meta = json.load(open(os.path.join(out, "tokenize.json")))
    assert meta["longest_prompt"] == {"tokens": longest, "file": path, "line": 3}, meta
    # A record of the other kind in a file of pairs is named with its line.
    bad = os.path.join(d, "mixed.jsonl")
    open(bad, "w").write('{"prompt": "a", "completion": "b"}\n{"text": "c"}\n')
    r = run(fsdptrain, "--tokenizer", os.path.join(d, "model"), "--input", bad, "--output", os.path.join(d, "m"))
    assert r.returncode == 2 and f"{bad}:2: a document in a string field, but the file's first record is a " \
        "prompt/completion pair" in r.stderr, r.stderr
    print(f"tokenize: {len(pairs)} prompt/completion pairs, ids and masks equal tokenizers'")


def check_uint32(fsdptrain, d, tok):
    """A vocabulary past 65536 ids gives uint32 shards holding ids above 65535."""
    big = Tokenizer.from_str(tok.to_str())
    big.add_special_tokens([f"<extra_{i}>" for i in range(66000)])
    os.makedirs(os.path.join(d, "big"))
    big.save(os.path.join(d, "big", "tokenizer.json"))
    text = os.path.join(d, "big.txt")
    open(text, "w").write("hello <extra_65999> world <extra_3>")
    out = os.path.join(d, "big_out")
    r = run(fsdptrain, "--tokenizer", os.path.join(d, "big", "tokenizer.json"), "--input", text, "--output", out,
            "--eos", "<extra_0>")
    assert r.returncode == 0, r.stderr
    want = big.encode(open(text).read()).ids + [big.token_to_id("<extra_0>")]
    assert max(want) > 65535 and shard_ids(out) == want, (want, shard_ids(out))
    assert "of uint32" in r.stdout, r.stdout
    print(f"tokenize: a {big.get_vocab_size()}-id vocabulary gives uint32 shards")


if __name__ == "__main__":
    sys.exit(main())
