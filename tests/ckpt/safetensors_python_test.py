"""Golden reference: the `safetensors` Python package reads what fsdptrain writes, and fsdptrain reads
what it writes (values, dtypes, shapes), with transformers' expectation of __metadata__ format=pt."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        ours = os.path.join(tmp, "ours.safetensors")
        subprocess.run([args.tool, "write", ours], check=True)
        loaded = load_file(ours)
        with safe_open(ours, framework="pt") as f:
            if f.metadata() != {"format": "pt"}:
                print(f"FAIL metadata {f.metadata()}")
                failures += 1
        base = torch.arange(24, dtype=torch.float64).view(2, 3, 4) - 7
        expected = {name: base.to(dtype) for name, dtype in DTYPES.items()}
        expected["u8"] = (base + 7).to(torch.uint8)
        expected["bool"] = base > 0
        expected["scalar"] = torch.tensor(3.5, dtype=torch.float32)
        for name, want in expected.items():
            got = loaded.get(name)
            if got is None or got.dtype != want.dtype or got.shape != want.shape or not torch.equal(got, want):
                print(f"FAIL safetensors reads fsdptrain's {name}: {got!r} != {want!r}")
                failures += 1

        theirs = os.path.join(tmp, "theirs.safetensors")
        gen = torch.Generator().manual_seed(0)
        written = {name: (torch.randn(3, 5, generator=gen) * 10).to(dtype) for name, dtype in DTYPES.items()}
        written["empty"] = torch.zeros(0, 4)
        written["bool"] = torch.tensor([True, False, True])
        save_file(written, theirs, metadata={"format": "pt"})
        out = subprocess.run([args.tool, "dump", theirs], check=True, capture_output=True, text=True).stdout
        dump = json.loads(out)
        names = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                 torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.bool: "BOOL"}
        for name, t in written.items():
            d, shape, total = dump.get(name, [None, None, None])
            want_sum = t.to(torch.float64).sum().item()
            if d != names[t.dtype] or shape != list(t.shape) or abs(total - want_sum) > 1e-9 * max(1.0, abs(want_sum)):
                print(f"FAIL fsdptrain reads safetensors' {name}: {dump.get(name)} vs {names[t.dtype]} {list(t.shape)} {want_sum}")
                failures += 1
    print(f"safetensors interop: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
