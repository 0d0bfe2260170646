#!/usr/bin/env bash
# add_field.sh -- a field added to the .proto's hot messages needs no edit to any hand-written
# codec: in a scratch directory, the .proto gains Op.priority, TensorInfo.stream and
# Request.trace; the generated code (protobuf-c, protobuf, tools/gen_wire_keys.py) is made
# again from it; the codecs' sources, untouched, are compiled against it (daemon/wire.c,
# client/lib/wire.c, the Python accelerator), and each of them, with the pure-Python
# _codec.py, must encode what the new protobuf reads, and decline (leave to protobuf) a
# message that sets a new field, decoding the others as before.
#   tests/wire/add_field.sh            (from the repository's root; needs no build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-/usr/bin/python3}
CC=${CC:-cc}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/tdd-addfield.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cd "$root"
before=$(cat daemon/wire.c client/lib/wire.c client/python/tensordd/_speedups.c \
    client/python/tensordd/_codec.py | sha256sum)

# 1. The .proto with three new fields.
mkdir -p "$scratch/proto" "$scratch/gen" "$scratch/py"
"$PY" - proto/tensordd.proto "$scratch/proto/tensordd.proto" <<'PYEOF'
import re, sys
src = open(sys.argv[1]).read()
def add(text, message, field):
    m = re.search(r"^message %s \{\n" % message, text, re.M)
    assert m, message
    return text[:m.end()] + "  " + field + "\n" + text[m.end():]
src = add(src, "Op", "uint32 priority = 8;")
src = add(src, "TensorInfo", "uint64 stream = 8;")
src = add(src, "Request", "uint64 trace = 3;")
open(sys.argv[2], "w").write(src)
PYEOF

# 2. Everything generated from it, again.
protoc-c --c_out="$scratch/gen" -I"$scratch/proto" "$scratch/proto/tensordd.proto"
cp -r client/python/tensordd "$scratch/py/"
rm -f "$scratch/py/tensordd/"_speedups*.so
protoc --python_out="$scratch/py/tensordd" -I"$scratch/proto" "$scratch/proto/tensordd.proto"
"$PY" tools/gen_wire_keys.py "$scratch/proto/tensordd.proto" --c "$scratch/gen/tensordd_keys.h" \
    --py "$scratch/py/tensordd/_wire_keys.py"

# 3. The new fields' keys are generated.
grep -q '^#define TD_KEY_OP_PRIORITY 0x40u' "$scratch/gen/tensordd_keys.h"
grep -q '^#define TD_KEY_TENSOR_INFO_STREAM 0x40u' "$scratch/gen/tensordd_keys.h"
grep -q '^#define TD_KEY_REQUEST_TRACE 0x18u' "$scratch/gen/tensordd_keys.h"
grep -q '^K_OP_PRIORITY = b"\\x40"' "$scratch/py/tensordd/_wire_keys.py"

# 4. The C codecs, unchanged, against the new protobuf-c.
cflags=(-std=c11 -O1 -D_GNU_SOURCE -Wall -Wextra -Werror -I"$scratch/gen" -Iinclude -Iproto -Icommon
        -Ibackends -Idaemon $(pkg-config --cflags libuv libprotobuf-c 2>/dev/null))
cat >"$scratch/check.c" <<'CEOF'
/* The hand codecs on messages with and without the new fields, against protobuf-c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* the client library's private header */
#include "conn.h"
#include "wire.h"

static int fails;
#define EXPECT(c, ...)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "add-field: " __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                                   \
            fails++;                                                                               \
        }                                                                                          \
    } while (0)

static unsigned char arena[1 << 16];
static size_t used;
static void *alloc(void *d, size_t n)
{
    (void)d;
    n = (n + 15) & ~(size_t)15;
    if (used + n > sizeof arena)
        return NULL;
    used += n;
    return arena + used - n;
}
static void nofree(void *d, void *p)
{
    (void)d;
    (void)p;
}

int main(void)
{
    uint64_t ins[2] = {7, 300}, outs[1] = {9};
    Tensordd__V1__Op op = TENSORDD__V1__OP__INIT;
    op.op = "add";
    op.n_inputs = 2;
    op.inputs = ins;
    op.n_outputs = 1;
    op.outputs = outs;
    Tensordd__V1__Request req = TENSORDD__V1__REQUEST__INIT;
    req.id = 5;
    req.body_case = TENSORDD__V1__REQUEST__BODY_OP;
    req.op = &op;
    ProtobufCAllocator al = {.alloc = alloc, .free = nofree};
    for (int set = 0; set < 3; set++) {
        op.priority = set == 1 ? 3 : 0;
        req.trace = set == 2 ? 77 : 0;
        uint8_t ref[256], out[256];
        size_t n = tensordd__v1__request__pack(&req, ref);
        td__req_sizes z;
        size_t fn = td__request_fast_size(&req, &z);
        if (set)
            EXPECT(fn == 0, "the client packer wrote a request with a new field set (%d)", set);
        else
            EXPECT(fn == n && td__request_fast_pack(&req, &z, out) == n && !memcmp(out, ref, n),
                   "the client packer's request differs from protobuf-c's");
        used = 0;
        Tensordd__V1__Request *d = tdd_wire_request_fast(ref, n, &al);
        if (set) {
            EXPECT(d == NULL, "the daemon's decoder took a request with a new field (%d)", set);
        } else {
            EXPECT(d && d->id == 5 && d->op && d->op->n_inputs == 2 && d->op->inputs[1] == 300 &&
                       !strcmp(d->op->op, "add") && d->op->priority == 0,
                   "the daemon's decoder lost the plain request");
        }
    }
    /* a TensorInfo reply: the daemon's encoder, then the client's glance, with and without
     * the new field */
    tdd_backend be;
    memset(&be, 0, sizeof be);
    be.name = "cpu";
    tdd_device dev;
    memset(&dev, 0, sizeof dev);
    dev.be = &be;
    tdd_value v;
    memset(&v, 0, sizeof v);
    v.dev = &dev;
    v.handle = 9;
    v.t.dtype = TD_F32;
    v.t.ndim = 1;
    v.t.shape[0] = 4;
    uint8_t rsp[TDD_WIRE_SMALL_MAX];
    size_t rn = tdd_wire_tensor(rsp, 5, &v);
    Tensordd__V1__Response *u = tensordd__v1__response__unpack(NULL, rn, rsp);
    EXPECT(u && u->tensor && u->tensor->handle == 9 && u->tensor->stream == 0,
           "the daemon's TensorInfo does not read back");
    uint64_t id;
    int body;
    EXPECT(td__glance_response(rsp, rn, &id, &body) == 1 && id == 5, "glance declined it");
    if (u) {
        u->tensor->stream = 12;
        uint8_t buf[256];
        size_t bn = tensordd__v1__response__pack(u, buf);
        EXPECT(td__glance_response(buf, bn, &id, &body) == 0,
               "the glance took a TensorInfo with a new field");
        tensordd__v1__response__free_unpacked(u, NULL);
    }
    if (!fails)
        printf("add-field: C codecs: a new field is left to protobuf-c, the rest as before\n");
    return fails != 0;
}
CEOF
for src in daemon/wire.c client/lib/wire.c proto/utf8.c common/errors.c common/tdd_err.c; do
    $CC "${cflags[@]}" -c "$src" -o "$scratch/$(echo "$src" | tr / _).o"
done
$CC "${cflags[@]}" -c "$scratch/gen/tensordd.pb-c.c" -o "$scratch/pbc.o" -Wno-error
$CC "${cflags[@]}" -Iclient/lib "$scratch/check.c" "$scratch"/*.o \
    $(pkg-config --libs libprotobuf-c) -o "$scratch/check"
"$scratch/check"

# 5. The Python client, unchanged, on the new modules: the accelerator compiled from its
# source against the new header (when Python's headers are there), and the pure Python.
pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [[ -f $pyinc/Python.h ]]; then
    $CC -std=c11 -O1 -fPIC -shared -Wall -Wextra -Werror -isystem "$pyinc" -I"$scratch/gen" \
        client/python/tensordd/_speedups.c -o "$scratch/py/tensordd/_speedups$suffix"
fi
for pure in 0 1; do
    TENSORDD_PURE=$pure PYTHONPATH="$scratch/py" "$PY" - "$pure" <<'PYEOF'
import sys
from tensordd import _codec, _wire_keys, tensordd_pb2 as pb
assert _wire_keys.K_OP_PRIORITY == b"\x40" and _wire_keys.K_REQUEST_TRACE == b"\x18"
assert _codec.ACCELERATED == (sys.argv[1] == "0" and _codec.parse_tensor_reply is not None)
req = pb.Request.FromString(_codec.frame_op(5, "add", [7, 300], 9)[16:])
assert (req.id, req.op.op, list(req.op.inputs), list(req.op.outputs), req.op.priority) == \
    (5, "add", [7, 300], [9], 0), req
rel = pb.Request.FromString(_codec.frame_release(6, [1, 2])[16:])
assert list(rel.release.handles) == [1, 2] and rel.trace == 0
bw = pb.Request.FromString(_codec.frame_backward(7, 3, 4)[16:])
assert (bw.backward.loss, bw.backward.grads, bw.backward.pipelined) == (3, 4, True)
st = pb.Request.FromString(_codec.frame_optimizer_step(8, 5, 4)[16:])
assert (st.optimizer_step.optimizer, st.optimizer_step.grads, st.optimizer_step.pipelined) == \
    (5, 4, True)
if _codec.parse_tensor_reply is not None:
    r = pb.Response(id=5, tensor=pb.TensorInfo(handle=9, dtype=1, shape=[4],
                                               device=pb.Device(backend="cpu")))
    assert _codec.parse_tensor_reply(r.SerializeToString()) == (5, 9, 1, (4,), "cpu", 0, False)
    r.tensor.stream = 12
    assert _codec.parse_tensor_reply(r.SerializeToString()) is None
print("add-field: Python codec (%s): a new field is left to protobuf, the rest as before"
      % ("accelerated" if _codec.ACCELERATED else "pure"))
PYEOF
done

after=$(cat daemon/wire.c client/lib/wire.c client/python/tensordd/_speedups.c \
    client/python/tensordd/_codec.py | sha256sum)
[[ $before == "$after" ]] || { echo "add-field: a codec's source changed" >&2; exit 1; }
echo "add-field: three new fields, no codec edited"
