"""Regression: scripts/bench/compare.py's write_tokens wrote magic 20240801 with version 1 for
vocabularies over 65,535, a header llm.c never writes, and fsdptrain refused the file ("version 1
with magic 20240801; llm.c writes version 7 there"), so the benchmark could not run the ~1B Llama
(vocabulary 128,256). The header is read here byte by byte, apart from compare.py and common.py,
against llm.c's constants: 256 little-endian int32 (magic, version, token count, zeros), then the
tokens, (20240520, 1) with uint16 tokens or (20240801, 7) with uint32.

    python tests/bench/compare_tokens_test.py      # exit 0 when every check passes
"""
import os
import struct
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))

import numpy as np  # noqa: E402

import common  # noqa: E402
import compare  # noqa: E402

# (vocab, magic, version, token type); 65,536 is the largest vocabulary whose ids fit uint16.
CASES = [(128256, 20240801, 7, "<u4"), (32000, 20240520, 1, "<u2"), (65536, 20240520, 1, "<u2"),
         (65537, 20240801, 7, "<u4"), (257, 20240520, 1, "<u2")]
COUNT = 4099  # odd, so a wrong token width cannot match the file size by chance


def check_shard(path, vocab, magic, version, dtype, failures):
    def expect(ok, what):
        if not ok:
            failures.append(f"vocab {vocab}: {what}")

    with open(path, "rb") as f:
        raw = f.read()
    width = np.dtype(dtype).itemsize
    expect(len(raw) == 1024 + COUNT * width,
           f"file is {len(raw)} bytes, want 1024 + {COUNT} x {width} = {1024 + COUNT * width}")
    header = struct.unpack("<256i", raw[:1024])
    expect(header[0] == magic, f"magic {header[0]}, want {magic}")
    expect(header[1] == version, f"version {header[1]} with magic {header[0]}, want {version}")
    expect(header[2] == COUNT, f"token count {header[2]}, want {COUNT}")
    expect(not any(header[3:]), "header words 3-255 are not all zero")
    tokens = np.frombuffer(raw[1024:1024 + COUNT * width], dtype=dtype)
    expect(len(tokens) == COUNT, f"{len(tokens)} tokens after the header, want {COUNT}")
    if len(tokens):
        expect(int(tokens.max()) < vocab, f"token {int(tokens.max())} is outside the vocabulary")
        # Uniform over the vocabulary: the top half is used too (it is where a truncated width shows).
        expect(int(tokens.max()) >= vocab // 2, f"largest token {int(tokens.max())}, none in the upper half")
    # The same seed gives the same tokens; the Python peers read back what was written.
    again = os.path.join(os.path.dirname(path), "again.bin")
    compare.write_tokens(again, COUNT, vocab, 7)
    expect(open(again, "rb").read() == raw, "the same seed wrote a different file")
    try:
        read = common.read_tokens(path)
    except ValueError as e:
        return expect(False, f"common.read_tokens refused the file: {e}")
    expect(read.dtype == np.dtype(dtype) and np.array_equal(read, tokens),
           f"common.read_tokens gave {read.dtype} tokens, or other values, than the file holds")


def check_refusals(tmp, failures):
    """common.read_tokens refuses the header fsdptrain refuses: the old (20240801, 1)."""
    path = os.path.join(tmp, "old.bin")
    header = np.zeros(256, dtype="<i4")
    header[:3] = 20240801, 1, 3
    with open(path, "wb") as f:
        f.write(header.tobytes() + np.arange(3, dtype="<u4").tobytes())
    try:
        common.read_tokens(path)
        failures.append("common.read_tokens read a shard with magic 20240801 and version 1")
    except ValueError as e:
        if "version 1 with magic 20240801" not in str(e):
            failures.append(f"common.read_tokens refused (20240801, 1) with an unexpected message: {e}")


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for vocab, magic, version, dtype in CASES:
            path = os.path.join(tmp, f"tokens-{vocab}.bin")
            compare.write_tokens(path, COUNT, vocab, 7)
            check_shard(path, vocab, magic, version, dtype, failures)
        check_refusals(tmp, failures)
    for f in failures:
        print("FAILED:", f)
    print(f"compare_tokens_test: {len(CASES)} vocabularies, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
