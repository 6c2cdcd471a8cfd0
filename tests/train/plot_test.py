"""`fsdptrain plot` draws what it reads: rendered by librsvg (rsvg-convert), the picture has each
run's color inside the plot area, the legend names every run, and the curve's points sit where the
steps and losses put them. Bad metrics files are refused naming the file and line.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zlib


def read_png(path):
    """(width, height, bytes per pixel, rows) of an 8-bit RGB or RGBA PNG, as rsvg-convert writes it."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6), f"expected 8-bit RGB or RGBA, got depth {depth} color type {color}"
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows = zlib.decompress(idat), width * bpp, []
    prev = bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def count_color(rows, bpp, box, rgb, tol=40):
    x0, y0, x1, y1 = box
    n = 0
    for y in range(y0, y1):
        row = rows[y]
        for x in range(x0, x1):
            r, g, b = row[bpp * x], row[bpp * x + 1], row[bpp * x + 2]
            if abs(r - rgb[0]) + abs(g - rgb[1]) + abs(b - rgb[2]) < tol:
                n += 1
    return n


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdptrain", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(f"{tmp}/baseline")
        with open(f"{tmp}/baseline/metrics.jsonl", "w") as f:
            for s in range(1, 101, 10):
                f.write(json.dumps({"step": s, "loss": 5.0 / (1 + s / 20)}) + "\n")
            f.write(json.dumps({"step": 50, "eval_loss": 2.0}) + "\n")
            f.write(json.dumps({"step": 91, "loss": 1.5}) + "\n")  # logged again (a resume): the last wins
        with open(f"{tmp}/wider.jsonl", "w") as f:
            for s in range(1, 101, 10):
                f.write(json.dumps({"step": s, "loss": 4.0 / (1 + s / 10)}) + "\n")
        svg = f"{tmp}/loss.svg"
        r = subprocess.run([args.fsdptrain, "plot", f"{tmp}/baseline/metrics.jsonl", f"{tmp}/wider.jsonl", "-o", svg],
                           capture_output=True, text=True)
        failures += check(r.returncode == 0 and "2 runs" in r.stdout, f"plot writes the SVG ({r.stdout}{r.stderr})")
        root = ET.parse(svg).getroot()
        ns = "{http://www.w3.org/2000/svg}"
        texts = [t.text for t in root.iter(ns + "text")]
        failures += check("baseline (train)" in texts and "wider (train)" in texts and "baseline (held-out)" in texts,
                          "the legend names each run and the held-out curve")
        lines = [p for p in root.iter(ns + "polyline")]
        failures += check(len(lines) == 3, f"three curves (got {len(lines)})")
        points = [tuple(map(float, p.split(","))) for p in lines[0].get("points").split()]
        xs, ys = [x for x, _ in points], [y for _, y in points]
        failures += check(xs == sorted(xs) and len(points) == 10, "steps run left to right, one point each")
        failures += check(ys[0] == min(ys) and ys[1] < ys[2] < ys[3],
                          "a falling loss runs downwards (SVG's y grows downwards)")
        failures += check(ys[-1] < ys[-2], "the step logged twice kept its last value (1.5, above step 81's)")
        png = f"{tmp}/loss.png"
        subprocess.run(["rsvg-convert", "-o", png, svg], check=True)
        width, height, bpp, rows = read_png(png)
        area = (71, 46, width - 201, height - 56)
        blue, red = count_color(rows, bpp, area, (0x1f, 0x77, 0xb4)), count_color(rows, bpp, area, (0xd6, 0x27, 0x28))
        failures += check(width == 860 and height == 500, f"an 860x500 picture (got {width}x{height})")
        failures += check(blue > 200 and red > 200, f"both runs' curves are drawn in the plot area ({blue}, {red} px)")
        r = subprocess.run([args.fsdptrain, "plot", "--log", f"{tmp}/wider.jsonl", "-o", f"{tmp}/log.svg"],
                           capture_output=True, text=True)
        labels = [t.text for t in ET.parse(f"{tmp}/log.svg").getroot().iter(ns + "text")]
        failures += check(r.returncode == 0 and "loss (log scale)" in labels and "1" in labels,
                          "--log draws a log axis with round ticks")
        with open(f"{tmp}/bad.jsonl", "w") as f:
            f.write('{"step": 1, "loss": 2}\nnot json\n')
        r = subprocess.run([args.fsdptrain, "plot", f"{tmp}/bad.jsonl", "-o", f"{tmp}/bad.svg"],
                           capture_output=True, text=True)
        failures += check(r.returncode == 2 and "bad.jsonl:2: not valid JSON" in r.stderr and
                          not os.path.exists(f"{tmp}/bad.svg"), f"a bad line is refused naming it ({r.stderr.strip()})")
    print(f"{failures} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
