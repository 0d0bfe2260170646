#!/usr/bin/env python3
"""check_abi.py -- libtensordd's exported interface against its committed record.

    check_abi.py --lib libtensordd.so --symbols tools/abi/libtensordd.symbols \
                 --map client/lib/libtensordd.map [--sizes "size td_error 704" output file] \
                 HEADER...

Fails (exit 1, one line per finding) when:
  - the library exports a symbol that is not a public td_ function (protobuf-c's
    tensordd__v1__*, the internal td__* helpers, anything else);
  - its soname differs from the record's (a bump must update the record);
  - a symbol of the record is not exported (removed or renamed: an incompatible
    change, which needs a soname bump), or an exported one is not in the record;
  - the functions the headers declare, the version script's list and the record differ;
  - a public struct's size, or a public constant's value, differs from the record's.
"""
import argparse
import re
import subprocess
import sys


def header_functions(paths):
    names = set()
    for p in paths:
        text = open(p, encoding="utf-8").read()
        text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
        text = re.sub(r"//[^\n]*", " ", text)
        text = re.sub(r"^\s*#.*?(?<!\\)$", " ", text, flags=re.M | re.S)
        # a declaration: a type word (or *) then the name then '(' -- not "(*name)(", a typedef
        for m in re.finditer(r"[\w*]\s+\**\s*(td_[a-z0-9_]+)\s*\(", text):
            if not m.group(1).startswith("td__"):
                names.add(m.group(1))
    return names


def map_globals(path):
    text = re.sub(r"/\*.*?\*/", " ", open(path, encoding="utf-8").read(), flags=re.S)
    m = re.search(r"global:(.*?)local:", text, flags=re.S)
    if not m:
        sys.exit("check_abi: %s has no global:/local: sections" % path)
    return {t.strip() for t in m.group(1).split(";") if t.strip()}


def record(path):
    soname, syms, sizes, compat = None, set(), {}, set()
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        w = line.split()
        if w[0] == "soname" and len(w) == 2:
            soname = w[1]
        elif w[0] == "compat" and len(w) == 2:
            compat.add(w[1])
            syms.add(w[1])
        elif w[0] in ("size", "value") and len(w) == 3:
            sizes[(w[0], w[1])] = int(w[2])
        elif len(w) == 1:
            syms.add(w[0])
        else:
            sys.exit("check_abi: %s: cannot read line %r" % (path, line))
    return soname, syms, sizes, compat


def exported(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", lib], check=True,
                         capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        w = line.split()
        if len(w) >= 3:
            names.add(w[2].split("@", 1)[0])
    return names


def soname_of(lib):
    out = subprocess.run(["readelf", "-d", lib], check=True, capture_output=True,
                         text=True).stdout
    m = re.search(r"\(SONAME\).*\[(.*)\]", out)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--symbols", required=True)
    ap.add_argument("--map", required=True)
    ap.add_argument("--sizes", help="output of tools/abi/sizes.c")
    ap.add_argument("headers", nargs="+")
    a = ap.parse_args()

    bad = []
    soname, rec, rec_sizes, compat = record(a.symbols)
    exp = exported(a.lib)
    decl = header_functions(a.headers)
    mapped = map_globals(a.map)

    for s in sorted(exp):
        if s in compat:
            if s in decl:
                bad.append("%s is recorded as compat (exported for old programs only) but a "
                           "header declares it" % s)
            continue
        if not s.startswith("td_") or s.startswith("td__") or s not in decl:
            bad.append("exported but not a public td_ function of the headers: %s" % s)
    have = soname_of(a.lib)
    if have != soname:
        bad.append("soname is %s, the record (%s) says %s: update the record's soname line "
                   "with the bump" % (have, a.symbols, soname))
    for s in sorted(rec - exp):
        bad.append("%s is in the record but not exported: removing or renaming a symbol is "
                   "an incompatible change; bump TD_SOVERSION and the record together" % s)
    for s in sorted((exp - rec) & decl):
        bad.append("%s is exported but not in the record %s: add it (a compatible addition)"
                   % (s, a.symbols))
    for s in sorted(decl - mapped):
        bad.append("%s is declared in the headers but not in %s (it would be hidden)" % (s, a.map))
    for s in sorted(compat - mapped):
        bad.append("%s is recorded as compat but not in %s (it would disappear)" % (s, a.map))
    for s in sorted(mapped - decl - compat):
        bad.append("%s is in %s but no header declares it" % (s, a.map))
    if a.sizes:
        got = {}
        for line in open(a.sizes, encoding="utf-8"):
            w = line.split()
            if len(w) == 3 and w[0] in ("size", "value"):
                got[(w[0], w[1])] = int(w[2])
        for key in sorted(set(got) | set(rec_sizes)):
            kind, name = key
            if got.get(key) == rec_sizes.get(key):
                continue
            if kind == "size":
                bad.append("struct %s is %s bytes, the record says %s: a changed public struct "
                           "is an incompatible change (bump TD_SOVERSION and the record)"
                           % (name, got.get(key), rec_sizes.get(key)))
            elif key not in rec_sizes:
                bad.append("%s = %s is not in the record: add the line 'value %s %s' (a new "
                           "constant is a compatible addition)" % (name, got[key], name, got[key]))
            else:
                bad.append("%s is %s, the record says %s: a renumbered or removed constant is "
                           "an incompatible change (bump TD_SOVERSION and the record)"
                           % (name, got.get(key), rec_sizes[key]))
    for b in bad:
        print("abi: " + b, file=sys.stderr)
    if bad:
        return 1
    print("abi: %s exports the %d td_ functions of the record%s" %
          (soname, len(exp), ", public struct sizes and constants unchanged" if a.sizes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
