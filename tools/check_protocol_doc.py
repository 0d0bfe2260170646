#!/usr/bin/env python3
"""check_protocol_doc.py PROTO SPEC -- the protocol spec and the .proto name the same things.

Fails (exit 1, one line per finding) unless:
  - every message of PROTO is named in SPEC (in backticks);
  - every request (a field of Request's body oneof, e.g. grad_remove -> GradRemove) has a
    "### " heading naming it and a row in the spec's request table;
  - every ErrorCode value has a row "| `NAME` | number |" in the spec's error table, with
    the proto's number;
  - every DType value (but DTYPE_INVALID) has a row in the payload dtype table;
and, the other way round, unless every name SPEC writes in backticks outside code blocks
exists in PROTO: a CamelCase name is a message, an enum or a request; an UPPER_CASE name
is an enum value; `Message.field` is a field of that message.
"""
import re
import sys


def parse_proto(text):
    text = re.sub(r"//[^\n]*", "", text)
    messages, enums, fields = set(), {}, {}
    # enums: name -> {value: number}
    for m in re.finditer(r"\benum\s+(\w+)\s*\{(.*?)\}", text, flags=re.S):
        enums[m.group(1)] = {v: int(n) for v, n in re.findall(r"(\w+)\s*=\s*(\d+)\s*;", m.group(2))}
    # messages (one level: the proto has no nested messages), with their fields
    for m in re.finditer(r"\bmessage\s+(\w+)\s*\{", text):
        name = m.group(1)
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[m.end():i - 1]
        messages.add(name)
        fields[name] = dict(
            (f, t) for t, f in re.findall(r"(?:repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*\d+\s*;", body))
        fields[name].update((o, "oneof") for o in re.findall(r"\boneof\s+(\w+)", body))
    req = text[text.index("message Request"):]
    oneof = re.search(r"oneof\s+body\s*\{(.*?)\}", req, flags=re.S).group(1)
    requests = [(f, t) for t, f in re.findall(r"(\w+)\s+(\w+)\s*=\s*\d+\s*;", oneof)]
    return messages, enums, fields, requests


def camel(field):
    return "".join(w.capitalize() for w in field.split("_"))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    proto_path, spec_path = sys.argv[1:]
    messages, enums, fields, requests = parse_proto(open(proto_path, encoding="utf-8").read())
    spec = open(spec_path, encoding="utf-8").read()
    prose = re.sub(r"^```.*?^```", "", spec, flags=re.S | re.M)
    named = set(re.findall(r"`([^`\n]+)`", prose))
    headings = [h for h in re.findall(r"^###\s+(.*)$", spec, flags=re.M)]
    rows = re.findall(r"^\|\s*`(\w+)`[^|]*\|\s*([^|]*?)\s*\|", spec, flags=re.M)
    row_names = {n for n, _ in rows}
    values = {v: e for e, vals in enums.items() for v in vals}
    request_names = {camel(f) for f, _ in requests}
    bad = []

    for m in sorted(messages):
        if m not in named:
            bad.append("message %s is not named in the spec" % m)
    for f, _ in requests:
        r = camel(f)
        if not any(re.search(r"`%s`" % r, h) for h in headings):
            bad.append("request %s (Request.%s) has no '### `%s`' section" % (r, f, r))
        if r not in row_names:
            bad.append("request %s has no row in the request table" % r)
    for code, num in sorted(enums.get("ErrorCode", {}).items(), key=lambda kv: kv[1]):
        got = [n for name, n in rows if name == code]
        if not got:
            bad.append("error code %s has no row '| `%s` | %d | ...' in the error table"
                       % (code, code, num))
        elif str(num) not in got:
            bad.append("error code %s is %d in the proto, the spec's row says %s"
                       % (code, num, got[0] or "nothing"))
    for dt in sorted(v for v in enums.get("DType", {}) if v != "DTYPE_INVALID"):
        if dt not in row_names:
            bad.append("dtype %s has no row '| `%s` | itemsize | element |' in the payload "
                       "dtype table" % (dt, dt))

    for n in sorted(named):
        if re.fullmatch(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*", n):
            if n not in messages and n not in enums and n not in request_names:
                bad.append("the spec names `%s`, which is no message, enum or request of the "
                           "proto" % n)
        elif re.fullmatch(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[A-Z]{2,}", n):
            if n not in values:
                bad.append("the spec names `%s`, which is no enum value of the proto" % n)
        else:
            m = re.fullmatch(r"([A-Z]\w*)\.(\w+)", n)
            if m and m.group(1) in fields and m.group(2) not in fields[m.group(1)]:
                bad.append("the spec names `%s`, but %s has no field %s"
                           % (n, m.group(1), m.group(2)))
            elif m and m.group(1) not in fields:
                bad.append("the spec names `%s`, but the proto has no message %s"
                           % (n, m.group(1)))

    for b in bad:
        print("protocol doc: " + b, file=sys.stderr)
    if bad:
        return 1
    print("protocol doc: %s names the proto's %d messages, %d requests and %d error codes, "
          "and nothing the proto lacks" % (spec_path, len(messages), len(requests),
                                           len(enums.get("ErrorCode", {}))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
