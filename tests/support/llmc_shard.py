"""llm.c token shards for the Python tests (the format lib/data/token_shard.h owns): a 256-int32
header (magic 20240520 for uint16 tokens, 20240801 for uint32; version; count), then the tokens."""
import struct

import numpy as np


def synthetic_corpus(documents=200, seed=0):
    """Byte tokens of `documents` made-up documents, each after a 256 (a separator beyond the bytes):
    phrases of a made-up vocabulary, learnable as text is, and the same whatever the source tree holds,
    so that a test's bounds, measured on it, stay measured (a test trained on lib/*.cpp saw its data
    change with every edit, and a mixture of experts' routing with it)."""
    rng = np.random.default_rng(seed)
    words = [bytes(rng.integers(97, 123, int(rng.integers(2, 9))).tolist()) for _ in range(300)]
    phrases = [b" ".join(words[i] for i in rng.integers(0, 300, int(rng.integers(3, 12)))) for _ in range(400)]
    tokens = []
    for _ in range(documents):
        tokens.append(256)
        for i in rng.integers(0, 400, int(rng.integers(20, 60))):
            tokens.extend(phrases[i] + b". ")
    return tokens


def write_shard(path, tokens):
    """A uint16 shard of `tokens`."""
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def read_shard(path):
    """The shard's tokens as a list, after checking its length against the header's count."""
    data = open(path, "rb").read()
    magic, _, count = struct.unpack("<3i", data[:12])
    width = {20240520: 2, 20240801: 4}[magic]
    assert len(data) == 1024 + count * width, (path, len(data), count)
    return list(struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data[1024:]))
