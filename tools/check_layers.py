#!/usr/bin/env python3
"""check_layers.py -- calls and includes only go down, in daemon/, backends/, client/ and below.

    tools/check_layers.py [--root DIR] OBJDIR      (OBJDIR holds daemon/*.o, e.g. build/obj)

tools/layers.txt orders every C source and header of daemon/, backends/, client/, proto/,
common/ and include/ into layers, highest first, grouped in stacks (client, daemon,
backends, base). A file may
  - call a function (or use an object) defined in a file of its own layer or of a lower
    layer of its own stack, or of a stack its stack uses; checked on the built objects (nm);
  - include a header of the same layers; checked on the sources' #include "..." lines.
Anything else is an upward (or sideways) dependency and fails, and so does a circle of
calls or includes between files of different layers. Files with no layer fail too, so a
new file is placed on purpose.
"""
from __future__ import annotations

import argparse
import fnmatch
import glob
import os
import re
import subprocess
import sys

SOURCE_DIRS = ("daemon", "backends", "client/lib", "client/tdctl", "client/python/tensordd",
               "proto", "common", "include")
SOURCE_EXT = (".c", ".h", ".cc", ".cu", ".cpp")
# Where "#include "x.h"" is looked for after the includer's own directory (the Makefile's -I).
INCLUDE_PATH = ("include", "proto", "common", "backends", "daemon")
# Objects the Makefile always builds; the cuda backend and the Python accelerator are
# checked when their objects are there.
REQUIRED_OBJ_DIRS = ("daemon", "backends", "backends/ref", "backends/cpu", "client/lib",
                     "client/tdctl", "proto", "common")


class Layers:
    def __init__(self, path: str, root: str):
        self.stack_order: list[str] = []
        self.uses: dict[str, set[str]] = {}
        self.layer_stack: dict[str, str] = {}
        self.layer_rank: dict[str, int] = {}
        self.exact: dict[str, str] = {}
        self.globs: list[tuple[str, str]] = []
        stack = None
        rank = 0
        with open(path) as f:
            name = None
            for lineno, raw in enumerate(f, 1):
                line = raw.split("#", 1)[0].strip()
                if not line:
                    continue
                words = line.split()
                if raw[0] in " \t":  # a continuation: more files of the layer above
                    if name is None:
                        sys.exit(f"{path}:{lineno}: a continuation line with no layer above")
                    self._add(path, lineno, name, words)
                    continue
                if words[0] == "stack":
                    stack, name = words[1], None
                    if len(words) > 2 and words[2] != "uses":
                        sys.exit(f"{path}:{lineno}: 'stack NAME [uses STACK...]'")
                    self.stack_order.append(stack)
                    self.uses[stack] = set(words[3:])
                    continue
                if stack is None:
                    sys.exit(f"{path}:{lineno}: a layer before any 'stack' line")
                name = words[0]
                if name in self.layer_rank:
                    sys.exit(f"{path}:{lineno}: layer {name} named twice")
                rank += 1
                self.layer_rank[name] = rank
                self.layer_stack[name] = stack
                self._add(path, lineno, name, words[1:])
        for s, used in self.uses.items():
            for u in used:
                if u not in self.uses:
                    sys.exit(f"{path}: stack {s} uses {u}, which is not a stack")
        self.root = root

    def _add(self, path: str, lineno: int, name: str, pats: list[str]) -> None:
        for p in pats:
            if any(c in p for c in "*?["):
                self.globs.append((p, name))
            elif p in self.exact:
                sys.exit(f"{path}:{lineno}: {p} is in two layers")
            else:
                self.exact[p] = name

    def layer_of(self, rel: str) -> str | None:
        """A file's layer: named exactly; else a pattern's (the first, highest, that
        matches); else, for a header, its .c's."""
        if rel in self.exact:
            return self.exact[rel]
        for pat, name in self.globs:
            if fnmatch.fnmatchcase(rel, pat):
                return name
        stem, ext = os.path.splitext(rel)
        if ext == ".h":
            for cext in (".c", ".cc", ".cu"):
                if stem + cext in self.exact:
                    return self.exact[stem + cext]
        return None

    def allowed(self, a: str, b: str) -> bool:
        """May a file of layer a depend on one of layer b?"""
        sa, sb = self.layer_stack[a], self.layer_stack[b]
        if sa == sb:
            return self.layer_rank[b] >= self.layer_rank[a]
        return sb in self.uses[sa]

    def describe(self, layer: str) -> str:
        return f"{self.layer_stack[layer]}/{layer}"


def sources(root: str) -> list[str]:
    out = []
    for d in SOURCE_DIRS:
        for path in glob.glob(os.path.join(root, d, "**", "*"), recursive=True):
            if path.endswith(SOURCE_EXT) and os.path.isfile(path):
                out.append(os.path.relpath(path, root))
    return sorted(set(out))


INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes(root: str, rel: str, known: set[str]) -> list[tuple[str, int]]:
    """The project headers rel includes, with their line numbers (generated and system
    headers are not ours to order)."""
    with open(os.path.join(root, rel), errors="replace") as f:
        text = f.read()
    out = []
    for m in INCLUDE_RE.finditer(text):
        name = m.group(1)
        line = text.count("\n", 0, m.start()) + 1
        for base in (os.path.dirname(rel),) + INCLUDE_PATH:
            cand = os.path.normpath(os.path.join(base, name))
            if cand in known:
                out.append((cand, line))
                break
    return out


def nm_symbols(objs: list[str]) -> dict[str, tuple[list[str], list[str]]]:
    """Each object's defined and undefined global symbols, from one nm run."""
    out: dict[str, tuple[list[str], list[str]]] = {o: ([], []) for o in objs}
    if not objs:
        return out
    res = subprocess.run(["nm", "-A", *objs], capture_output=True, text=True, check=True)
    for line in res.stdout.splitlines():
        cut = line.find(".o:") + 2  # "OBJ:ADDR TYPE NAME"
        obj, rest = line[:cut], line[cut + 1:]
        if obj not in out:
            continue
        parts = rest.split()
        if len(parts) == 3 and parts[1] in "TDBRCVWGS":
            out[obj][0].append(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            out[obj][1].append(parts[1])
    return out


def object_of(objdir: str, rel: str) -> str:
    stem, ext = os.path.splitext(rel)
    if ext == ".c":
        return os.path.join(objdir, stem + ".o")
    return os.path.join(objdir, rel + ".o")  # gloo_shim.cc.o, kernels.cu.o


def cross_layer_circles(edges: dict[str, set[str]], layer: dict[str, str]) -> list[list[str]]:
    """Strongly connected groups of files (Tarjan, iterative) that span more than one layer."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len({layer[c] for c in comp}) > 1:
                        out.append(sorted(comp))
    return out


def report_circles(edges, unit_edges, layer, known, layers) -> None:
    """The circles the lint allows: inside one layer, and across layers once each header is
    counted as its .c (a header kept in a lower layer because it declares that layer's
    helpers too hides such a circle from the check)."""
    def show(comp):
        return ", ".join(f"{c} ({layers.describe(layer[c])})" for c in comp)

    for comp in cross_layer_circles(unit_edges, {u: u for u in unit_edges}):
        print(f"check-layers: a circle inside {layers.describe(layer[comp[0]])}: {show(comp)}")

    def with_c(rel):
        stem, ext = os.path.splitext(rel)
        if ext == ".h":
            for cext in (".c", ".cc", ".cu"):
                if stem + cext in known:
                    return stem + cext
        return rel

    merged = {}
    for a, bs in edges.items():
        ua = with_c(a)
        merged.setdefault(ua, set())
        merged[ua] |= {with_c(b) for b in bs if with_c(b) != ua}
    for comp in cross_layer_circles(merged, {u: layer[u] for u in merged}):
        hidden = sorted({h for h in known if h.endswith(".h") and with_c(h) in comp
                         and with_c(h) != h and layer[h] != layer[with_c(h)]})
        print(f"check-layers: a circle across layers once {', '.join(hidden)} count as their"
              f" .c: {show(comp)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("objdir", nargs="?", default="build/obj")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--layers", help="the layers file (default ROOT/tools/layers.txt)")
    ap.add_argument("--circles", action="store_true",
                    help="also list, without failing, the circles left inside one layer, and "
                         "those a header placed below its .c hides (counted as its .c's)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    layers = Layers(args.layers or os.path.join(root, "tools", "layers.txt"), root)

    files = sources(root)
    known = set(files)
    layer: dict[str, str] = {}
    errors: list[str] = []
    for rel in files:
        name = layers.layer_of(rel)
        if name is None:
            errors.append(f"{rel} has no layer in tools/layers.txt")
        else:
            layer[rel] = name
    if errors:
        for e in errors:
            print("check-layers:", e, file=sys.stderr)
        return 1

    # Edges between files (a .c/.cc/.cu's calls; any file's includes), for the circles.
    edges: dict[str, set[str]] = {f: set() for f in files}
    upward = 0

    for rel in files:
        for inc, line in includes(root, rel, known):
            edges[rel].add(inc)
            if not layers.allowed(layer[rel], layer[inc]):
                print(f"check-layers: {rel}:{line} ({layers.describe(layer[rel])}) includes {inc}"
                      f" ({layers.describe(layer[inc])}, not below it)", file=sys.stderr)
                upward += 1

    objects = {}
    for rel in files:
        if rel.endswith(".h") or rel.startswith("client/python/"):
            continue
        obj = object_of(args.objdir, rel)
        if os.path.isfile(obj):
            objects[rel] = obj
        elif os.path.dirname(rel) in REQUIRED_OBJ_DIRS and rel.endswith(".c") and \
                not rel.startswith("backends/cuda/"):
            print(f"check-layers: {obj} not built (build first)", file=sys.stderr)
            return 2
    definer: dict[str, str] = {}
    undefined: dict[str, list[str]] = {}
    syms = nm_symbols(list(objects.values()))
    for rel, obj in objects.items():
        d, u = syms[obj]
        for sym in d:
            definer.setdefault(sym, rel)
        undefined[rel] = u
    for rel, syms in sorted(undefined.items()):
        for sym in syms:
            g = definer.get(sym)
            if g is None or g == rel:
                continue
            edges[rel].add(g)
            if not layers.allowed(layer[rel], layer[g]):
                print(f"check-layers: {rel} ({layers.describe(layer[rel])}) calls {sym}, defined"
                      f" in {g} ({layers.describe(layer[g])}, not below it)", file=sys.stderr)
                upward += 1

    # A header and its .c in one layer are one file for circles (a .c that includes its own
    # header while the header's users call the .c is no circle); a header placed in a lower
    # layer (it declares the helpers below its .c too) stands alone.
    def unit(rel: str) -> str:
        stem, ext = os.path.splitext(rel)
        if ext == ".h":
            for cext in (".c", ".cc", ".cu"):
                if stem + cext in known and layer[stem + cext] == layer[rel]:
                    return stem + cext
        return rel

    unit_edges: dict[str, set[str]] = {}
    for a, bs in edges.items():
        ua = unit(a)
        unit_edges.setdefault(ua, set())
        for b in bs:
            if unit(b) != ua:
                unit_edges[ua].add(unit(b))
    circles = cross_layer_circles(unit_edges, {u: layer[u] for u in unit_edges})
    if args.circles:
        report_circles(edges, unit_edges, layer, known, layers)
    for comp in circles:
        print("check-layers: a circle across layers: " +
              ", ".join(f"{c} ({layers.describe(layer[c])})" for c in comp), file=sys.stderr)

    if upward or circles:
        print(f"check-layers: {upward} upward dependenc{'y' if upward == 1 else 'ies'},"
              f" {len(circles)} circle(s) across layers; layers are in tools/layers.txt",
              file=sys.stderr)
        return 1
    nstack = len(layers.stack_order)
    print(f"check-layers: {len(files)} files ({len(objects)} objects) in {len(layers.layer_rank)}"
          f" layers of {nstack} stacks; every call and include goes down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
