#!/usr/bin/env python3
"""gen_wire_keys.py -- every field's key, from proto/tensordd.proto, for the fast wire codec.

    tools/gen_wire_keys.py PROTO --c OUT.h --py OUT.py [--protoc PROTOC]

protoc reads the .proto (as for protobuf-c's and protobuf's own code; its descriptor set is
read here without the protobuf runtime) and this writes, for
every field of every message, its number and its key ((number << 3) | wire type, as a varint
on the wire):
  - a C header (build/gen/tensordd_keys.h): TD_FIELD_<MSG>_<FIELD> (the number),
    TD_KEY_<MSG>_<FIELD> (the key's value; _UNPACKED too for a packed repeated scalar, whose
    elements may also come one by one), and X-macro lists of every message and field for
    the tests that hold these to protobuf-c;
  - a Python module (build/python/tensordd/_wire_keys.py): K_<MSG>_<FIELD>, the key's
    encoded bytes, and FIELDS, the same list.
Message and field names are upper-cased the way protobuf-c names them (TensorInfo ->
TENSOR_INFO, DTypeMismatch -> DTYPE_MISMATCH). A field added to the .proto gets its key here
and nowhere else; the codecs that do not use it need no edit.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

VARINT, I64, LEN, I32 = 0, 1, 2, 5
# google/protobuf/descriptor.proto's FieldDescriptorProto.Type, by number -> wire type
WIRE_TYPE = {1: I64, 2: I32, 3: VARINT, 4: VARINT, 5: VARINT, 6: I64, 7: I32, 8: VARINT,
             9: LEN, 10: 3, 11: LEN, 12: LEN, 13: VARINT, 14: VARINT, 15: I32, 16: I64,
             17: VARINT, 18: VARINT}
LABEL_REPEATED = 3


# protoc's descriptor set is read here by hand, not with the protobuf runtime: a package
# build (pip's isolated environment) has protoc but not google.protobuf. Only the fields
# used below are kept (google/protobuf/descriptor.proto's numbers).
def _records(buf: bytes):
    """(field number, value) of each field of a protobuf message: ints or bytes."""
    i = 0
    while i < len(buf):
        key, i = _get_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == VARINT:
            v, i = _get_varint(buf, i)
        elif wt == LEN:
            n, i = _get_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == I64:
            v, i = buf[i:i + 8], i + 8
        elif wt == I32:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt} in a descriptor")
        yield num, v


def _get_varint(buf: bytes, i: int):
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, i


class Field:
    def __init__(self, buf: bytes):
        self.name, self.number, self.label, self.type = "", 0, 1, 0
        self.oneof_index, self.proto3_optional, self.packed = None, False, None
        for num, v in _records(buf):
            if num == 1:
                self.name = v.decode()
            elif num == 3:
                self.number = v
            elif num == 4:
                self.label = v
            elif num == 5:
                self.type = v
            elif num == 8:  # FieldOptions
                for onum, ov in _records(v):
                    if onum == 2:
                        self.packed = bool(ov)
            elif num == 9:
                self.oneof_index = v
            elif num == 17:
                self.proto3_optional = bool(v)


class Message:
    def __init__(self, buf: bytes):
        self.name, self.field, self.nested_type = "", [], []
        for num, v in _records(buf):
            if num == 1:
                self.name = v.decode()
            elif num == 2:
                self.field.append(Field(v))
            elif num == 3:
                self.nested_type.append(Message(v))


class File:
    def __init__(self, buf: bytes):
        self.package, self.syntax, self.message_type = "", "proto2", []
        for num, v in _records(buf):
            if num == 2:
                self.package = v.decode()
            elif num == 4:
                self.message_type.append(Message(v))
            elif num == 12:
                self.syntax = v.decode()
WIRE_NAME = {VARINT: "varint", I64: "64-bit", LEN: "length-delimited", I32: "32-bit"}


def upper(name: str) -> str:
    """protobuf-c's spelling of a CamelCase or snake_case name, upper-cased."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_proto(proto: str, protoc: str) -> File:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "set.pb")
        subprocess.run([protoc, f"-I{os.path.dirname(os.path.abspath(proto))}",
                        f"--descriptor_set_out={out}", os.path.abspath(proto)], check=True)
        with open(out, "rb") as f:
            files = [File(v) for num, v in _records(f.read()) if num == 1]
    return files[0]


def fields(fd: descriptor_pb2.FileDescriptorProto):
    """{message: [(field, number, key, unpacked key or None, wire type, how, outside a oneof)]}"""
    proto3 = fd.syntax == "proto3"

    def walk(msgs, prefix: str):
        for m in msgs:
            mname = prefix + m.name
            yield mname, None
            for f in m.field:
                wt = WIRE_TYPE[f.type]
                repeated = f.label == LABEL_REPEATED
                packed = repeated and wt != LEN and (f.packed if f.packed is not None else proto3)
                key = (f.number << 3) | (LEN if packed else wt)
                unpacked = (f.number << 3) | wt if packed else None
                plain = f.oneof_index is None or f.proto3_optional
                yield mname, (f.name, f.number, key, unpacked, LEN if packed else wt,
                              ("repeated " if repeated else "") + ("packed " if packed else ""),
                              plain)
            yield from walk(m.nested_type, mname)

    out: dict[str, list] = {}
    for mname, f in walk(fd.message_type, ""):
        out.setdefault(mname, [])
        if f:
            out[mname].append(f)
    return out


def check_names(msgs) -> None:
    """Two fields (or a field and a message) upper-cased alike would define one macro twice."""
    seen: dict[str, str] = {}
    for mname, fl in msgs.items():
        for name in [None] + [f[0] for f in fl]:
            n = upper(mname) + ("_" + upper(name) if name else "")
            what = mname + ("." + name if name else "")
            if n in seen:
                sys.exit(f"gen_wire_keys: {what} and {seen[n]} would both be named {n}")
            seen[n] = what


def c_header(src: str, fd, msgs) -> str:
    pbc_prefix = "__".join(p for p in fd.package.split(".")) + "__" if fd.package else ""
    lines = [f"/* tensordd_keys.h -- generated by tools/gen_wire_keys.py from {src}: do not edit.",
             " * Every field's number (TD_FIELD_*) and key (TD_KEY_*: (number << 3) | wire type,",
             " * written as a varint; TD_KEY_LEN_* its length in bytes); per message, its count of",
             " * fields (TD_NFIELDS_*) and of those outside a oneof (TD_NPLAIN_*). */",
             "#ifndef TD_TENSORDD_KEYS_H", "#define TD_TENSORDD_KEYS_H", ""]
    for mname, fl in msgs.items():
        M = upper(mname)
        lines.append(f"/* {mname} */")
        for name, number, key, unpacked, wt, how, _ in fl:
            F = f"{M}_{upper(name)}"
            lines.append(f"#define TD_FIELD_{F} {number}u")
            lines.append(f"#define TD_KEY_{F} 0x{key:02x}u /* {how}{WIRE_NAME[wt]} */")
            lines.append(f"#define TD_KEY_LEN_{F} {len(varint(key))}u")
            if unpacked is not None:
                lines.append(f"#define TD_KEY_{F}_UNPACKED 0x{unpacked:02x}u /* one element */")
        lines.append(f"#define TD_NFIELDS_{M} {len(fl)}u")
        lines.append(f"#define TD_NPLAIN_{M} {sum(1 for f in fl if f[6])}u /* outside a oneof */")
        lines.append("")
    lines.append("/* TD_DESC_<MSG>: the name of protobuf-c's descriptor of each message. */")
    for mname in msgs:
        lines.append(f"#define TD_DESC_{upper(mname)} {pbc_prefix.lower()}{upper(mname).lower()}__descriptor")
    lines.append("")
    lines.append("/* X(MSG, descriptor): every message, with protobuf-c's descriptor's name. */")
    lines.append("#define TD_PB_MESSAGES(X) \\")
    for mname in msgs:
        lines.append(f"    X({upper(mname)}, {pbc_prefix.lower()}{upper(mname).lower()}__descriptor) \\")
    lines.append("")
    lines.append("/* X(MSG, FIELD, \"field\", number, key, wire type): every field. */")
    lines.append("#define TD_PB_FIELDS(X) \\")
    for mname, fl in msgs.items():
        for name, number, key, _, wt, _, _ in fl:
            lines.append(f"    X({upper(mname)}, {upper(name)}, \"{name}\", {number}u, 0x{key:02x}u, {wt}u) \\")
    lines.append("")
    lines.append("#endif")
    return "\n".join(lines) + "\n"


def py_module(src: str, msgs) -> str:
    lines = [f'"""_wire_keys -- generated by tools/gen_wire_keys.py from {src}: do not edit.',
             "",
             "K_<MESSAGE>_<FIELD>: the field's key as the bytes that begin it on the wire",
             "((number << 3) | wire type, a varint); FIELDS: (message, field, number, key bytes).",
             '"""', ""]
    table = []
    for mname, fl in msgs.items():
        M = upper(mname)
        for name, number, key, unpacked, wt, how, _ in fl:
            F = f"{M}_{upper(name)}"
            enc = "".join(f"\\x{b:02x}" for b in varint(key))
            lines.append(f'K_{F} = b"{enc}"  # {mname}.{name} = {number}, {how}{WIRE_NAME[wt]}')
            if unpacked is not None:
                uenc = "".join(f"\\x{b:02x}" for b in varint(unpacked))
                lines.append(f'K_{F}_UNPACKED = b"{uenc}"')
            table.append(f'    ("{mname}", "{name}", {number}, K_{F}),')
    lines.append("")
    lines.append("FIELDS = (")
    lines.extend(table)
    lines.append(")")
    return "\n".join(lines) + "\n"


def write_if_changed(path: str, text: str) -> None:
    """Leaves an unchanged output's time alone, so what includes it is not rebuilt."""
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("proto")
    ap.add_argument("--c", dest="c_out")
    ap.add_argument("--py", dest="py_out")
    ap.add_argument("--protoc", default="protoc")
    a = ap.parse_args()
    fd = read_proto(a.proto, a.protoc)
    msgs = fields(fd)
    check_names(msgs)
    src = os.path.basename(a.proto)
    if a.c_out:
        write_if_changed(a.c_out, c_header(src, fd, msgs))
    if a.py_out:
        write_if_changed(a.py_out, py_module(src, msgs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
