"""fsdptrain's tokenizer against the Python `tokenizers` package: the same ids and the same decoded
text for every document of a corpus with Unicode (CJK, emoji, combining marks, RTL), code,
whitespace runs, digits, special-token strings and invalid UTF-8, on tokenizers trained here in the
styles of Llama 3 (ByteLevel BPE, split regex, ignore_merges), Qwen2 (NFC, single digits), GPT-2
(ByteLevel's own regex) and Llama 2 / Mistral (SentencePiece-style BPE with byte fallback, through
Prepend/Replace or Metaspace). Unsupported components are refused naming them."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]


def corpus(source):
    docs = []
    for root in ("lib", "README.md"):
        path = os.path.join(source, root)
        files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
        for f in sorted(files)[:60]:
            docs.append(open(f, encoding="utf-8").read())
    docs += [
        "héllo wörld, naïve café: e\u0301 and \u00e9 (combining vs precomposed), Å\u030a",
        "你好世界，这是一个测试。日本語のテキスト、한국어 텍스트",
        "emoji 😀😃🙈 family 👨‍👩‍👧 flags 🇫🇷 and skin 👍🏽",
        "مرحبا بالعالم — שלום עולם (RTL) ‏mixed‎ text",
        "  leading, trailing   \t\ttabs\n\n\nnew lines  \r\n windows\u00a0nbsp\u2003em space  ",
        "digits 1 12 123 1234 12345 3.14159 -42 1e-5 0x1F ١٢٣ ½",
        "def f(x):\n    return x ** 2  # comment\n\tif (a && b) { c++; }\n",
        "it's I'M they'RE we've he'll she'd 'S",
        "special <|begin_of_text|> inside <|eot_id|>text<|end_of_text|> and <s> </s> <unk>",
        "a" * 300 + " " + "xyz" * 100,
        "",
        " ",
        "\n",
    ]
    raw = [d.encode("utf-8") for d in docs]
    # Invalid UTF-8: a lone continuation byte, a truncated sequence, an overlong form, a surrogate.
    raw += [b"bad \x80 byte", b"cut \xe4\xbd", b"overlong \xc0\xaf and \xed\xa0\x80 surrogate", b"\xff\xfe tail"]
    return raw


def byte_level(pattern, nfc, vocab, train, post):
    t = Tokenizer(models.BPE(ignore_merges=True))
    if nfc:
        t.normalizer = normalizers.NFC()
    if pattern is None:  # GPT-2: ByteLevel's own regex
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(train, trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if post:
        t.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", t.token_to_id("<|begin_of_text|>"))])])
    return t


def line_pairs(text):
    """Each line of `text` with the next (every boundary between lines falls inside a pair)."""
    lines = text.splitlines(keepends=True)
    return ["".join(lines[i:i + 2]) for i in range(max(1, len(lines) - 1))]


def sentencepiece(metaspace, train):
    t = Tokenizer(models.BPE(byte_fallback=True, fuse_unk=True, unk_token="<unk>"))
    if metaspace:  # newer conversions
        t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"]
    # Without a pre-tokenizer that splits, each training text is one word, and the trainer rescans a
    # word each time a merge touches it: whole files took 22 s a tokenizer. Pairs of lines take a few
    # seconds, and merges still span a newline (tokens such as "}\n▁▁" and ";\n▁▁▁▁").
    pairs = [pair for text in train for pair in line_pairs(text)]
    t.train_from_iterator(pairs, trainers.BpeTrainer(vocab_size=900, special_tokens=specials +
                                                     [f"<0x{i:02X}>" for i in range(256)], limit_alphabet=120))
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
    return t


def save_as_llama2(t, path):
    """As Llama 2's file: the byte tokens live in the vocabulary, only <unk> <s> </s> are added tokens."""
    t.save(path)
    j = json.load(open(path, encoding="utf-8"))
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in ("<unk>", "<s>", "</s>")]
    json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False)


def check(tool, path, docs):
    ref = Tokenizer.from_file(path)
    hex_lines = "".join(d.hex() + "\n" for d in docs)
    out = subprocess.run([tool, path], input=hex_lines, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"tokenize_tool failed on {path}: {out.stderr}")
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(got) == len(docs), (len(got), len(docs))
    tokens = offsets = 0
    for i, (d, g) in enumerate(zip(docs, got)):
        text = d.decode("utf-8", errors="replace")
        want = ref.encode(text).ids
        tokens += len(want)
        if g["ids"] != want:
            k = next((k for k, (a, b) in enumerate(zip(g["ids"], want)) if a != b), min(len(g["ids"]), len(want)))
            raise SystemExit(f"{os.path.basename(path)}: document {i} ({text[:60]!r}...): ids differ at {k}: "
                             f"ours {g['ids'][max(0, k - 3):k + 5]} tokenizers {want[max(0, k - 3):k + 5]}")
        if "offsets" in g:  # valid UTF-8: each token's span, as tokenizers' offsets give it
            ref_offsets = [list(o) for o in ref.encode(text, add_special_tokens=False).offsets]
            if g["offsets"] != ref_offsets:
                k = next(k for k, (a, b) in enumerate(zip(g["offsets"], ref_offsets)) if a != b)
                raise SystemExit(f"{os.path.basename(path)}: document {i}: offsets differ at token {k}: ours "
                                 f"{g['offsets'][max(0, k - 2):k + 3]} tokenizers {ref_offsets[max(0, k - 2):k + 3]} "
                                 f"({text[max(0, ref_offsets[k][0] - 10):ref_offsets[k][1] + 10]!r})")
            offsets += len(ref_offsets)
        want_text = ref.decode(want)
        if g["decoded"] != want_text:
            raise SystemExit(f"{os.path.basename(path)}: document {i}: decoded text differs:\n"
                             f"ours      {g['decoded'][:200]!r}\ntokenizers {want_text[:200]!r}")
    print(f"{os.path.basename(path)}: {len(docs)} documents, {sum(len(d) for d in docs)} bytes, {tokens} tokens: "
          f"ids and decoded text equal; the offsets of {offsets} tokens equal")


def check_refused(tool, d, base, edit, words):
    j = json.load(open(base, encoding="utf-8"))
    edit(j)
    path = os.path.join(d, "refused.json")
    json.dump(j, open(path, "w", encoding="utf-8"))
    out = subprocess.run([tool, path], input="", capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr)
    for w in words:
        assert w in out.stderr, (w, out.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    docs = corpus(a.source)
    train = [d.decode("utf-8", errors="replace") for d in docs] * 2
    with tempfile.TemporaryDirectory() as d:
        cases = {
            "llama3.json": byte_level(LLAMA3, False, 1200, train, True),
            "qwen2.json": byte_level(QWEN2, True, 1000, train, False),
            "gpt2.json": byte_level(None, False, 800, train, False),
        }
        for name, t in cases.items():
            t.save(os.path.join(d, name))
        save_as_llama2(sentencepiece(False, train), os.path.join(d, "llama2.json"))
        save_as_llama2(sentencepiece(True, train), os.path.join(d, "mistral.json"))
        for name in ["llama3.json", "qwen2.json", "gpt2.json", "llama2.json", "mistral.json"]:
            check(a.tool, os.path.join(d, name), docs)
        base = os.path.join(d, "llama3.json")
        check_refused(a.tool, d, base, lambda j: j.update(model={**j["model"], "type": "WordPiece"}),
                      ["model WordPiece is not supported"])
        check_refused(a.tool, d, base, lambda j: j.update(normalizer={"type": "Lowercase"}),
                      ["normalizer Lowercase is not supported"])
        check_refused(a.tool, d, base, lambda j: j.update(pre_tokenizer={"type": "Digits", "individual_digits": True}),
                      ["pre_tokenizer Digits is not supported"])
        check_refused(a.tool, d, base, lambda j: j["model"].update(dropout=0.1), ["BPE dropout 0.1 is not supported"])
        check_refused(a.tool, d, base, lambda j: j.update(post_processor={"type": "BertProcessing"}),
                      ["post_processor BertProcessing is not supported"])
        # A byte-level BPE trained without the byte alphabet cannot spell a character it never saw:
        # tokenizers drops it without a word; fsdptrain names it instead of training on less text.
        narrow = Tokenizer(models.BPE())
        narrow.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        narrow.decoder = decoders.ByteLevel()
        narrow.train_from_iterator(["ab ba ab"], trainers.BpeTrainer(vocab_size=50))
        narrow_path = os.path.join(d, "narrow.json")
        narrow.save(narrow_path)
        assert narrow.decode(narrow.encode("a\u20acb").ids) == "ab"  # the euro sign vanished
        out = subprocess.run([a.tool, narrow_path], input="a\u20acb".encode().hex() + "\n", capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2, (out.returncode, out.stderr)
        assert "the tokenizer has no token for the character \"\u20ac\" (U+20AC) at byte 1 of the text" in out.stderr, \
            out.stderr
        print("narrow.json: a character outside the vocabulary is named:", out.stderr.strip()[:120], "...")
        missing = subprocess.run([a.tool, d], input="", capture_output=True, text=True, timeout=60)
        assert missing.returncode == 2 and "has no tokenizer.json" in missing.stderr, missing.stderr
    print("tokenizer_python_test: ok")


if __name__ == "__main__":
    sys.exit(main())
