#!/usr/bin/env python3
"""Fails when files of lib/ include each other in a cycle.

A unit is a header and its .cpp (lib/dist/store.h + lib/dist/store.cpp); a private X_impl.h belongs
to X. Unit A depends on unit B when a file of A includes a header of B. Every strongly connected
group of more than one unit is a cycle: it is printed with the includes that close it.
Usage: scripts/include-cycles.py [ROOT]   (ROOT defaults to the repository)
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def unit_of(path):
    stem = os.path.splitext(path)[0]
    return stem[:-5] if stem.endswith("_impl") else stem


def graph(lib):
    edges, why = {}, {}
    for folder, _, files in os.walk(lib):
        for f in files:
            if not f.endswith((".h", ".cpp", ".inc")):
                continue
            path = os.path.relpath(os.path.join(folder, f), lib)
            src = unit_of(path)
            edges.setdefault(src, set())
            for inc in INCLUDE.findall(open(os.path.join(folder, f), encoding="utf-8", errors="replace").read()):
                if not os.path.exists(os.path.join(lib, inc)):
                    continue  # a system or third-party header
                dst = unit_of(inc)
                if dst != src:
                    edges[src].add(dst)
                    why.setdefault((src, dst), f"{path} includes {inc}")
    return edges, why


def cycles(edges):
    """Tarjan's strongly connected components, iteratively; those of two or more units."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    edges, why = graph(os.path.join(root, "lib"))
    found = cycles(edges)
    if not found:
        print(f"[lint] no include cycle between the {len(edges)} units of lib/")
        return 0
    print("[lint] error: files of lib/ include each other in a cycle; move what both need into a third file:",
          file=sys.stderr)
    for group in found:
        members = set(group)
        print("  " + " <-> ".join(group), file=sys.stderr)
        for (a, b), text in sorted(why.items()):
            if a in members and b in members:
                print(f"    {text}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
