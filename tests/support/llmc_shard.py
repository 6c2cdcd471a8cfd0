"""llm.c token shards for the Python tests (the format lib/data/token_shard.h owns): a 256-int32
header (magic 20240520 for uint16 tokens, 20240801 for uint32; version; count), then the tokens."""
import struct

import numpy as np


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
