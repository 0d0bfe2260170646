#!/usr/bin/env bash
# add_field.sh -- a field added to the .proto's hot messages needs no codec edit: in a scratch
# directory, the .proto gains Op.priority, TensorInfo.stream and Request.trace; everything
# generated from it (protobuf-c, protobuf, tools/gen_wire_keys.py) is made again; the fast
# codec (proto/wirecodec.h) and its users' sources, untouched, are compiled against it (the
# daemon's daemon/wire.c, libtensordd's client/lib/wire.c, the Python accelerator
# _speedups.c, and the pure-Python _codec.py), once as the old peer (the .proto as it is) and
# once as the new one. Then the peers talk, both ways, through files:
#   - a plain message (no new field set) takes the fast codec on both sides;
#   - a message that sets a new field is left to protobuf(-c) by the new peer's codec, and
#     the old peer's fast decoders decline it, its protobuf(-c) reads it, the new field
#     skipped as unknown, the rest as sent.
#   tests/wire/add_field.sh            (from the repository's root; needs no build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-/usr/bin/python3}
CC=${CC:-cc}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/tdd-addfield.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cd "$root"
codec_sources=(proto/wirecodec.h proto/pbwire.h daemon/wire.c daemon/wire.h client/lib/wire.c
               client/python/tensordd/_speedups.c client/python/tensordd/_codec.py)
before=$(cat "${codec_sources[@]}" | sha256sum)

# 1. The .proto as it is (old) and with three new fields (new).
for peer in old new; do mkdir -p "$scratch/$peer/proto" "$scratch/$peer/gen" "$scratch/$peer/py"; done
cp proto/tensordd.proto "$scratch/old/proto/"
"$PY" - proto/tensordd.proto "$scratch/new/proto/tensordd.proto" <<'PYEOF'
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

# 2. Everything generated from each, again.
pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for peer in old new; do
    d=$scratch/$peer
    protoc-c --c_out="$d/gen" -I"$d/proto" "$d/proto/tensordd.proto"
    cp -r client/python/tensordd "$d/py/"
    rm -f "$d/py/tensordd/"_speedups*.so "$d/py/tensordd/tensordd_pb2.py" "$d/py/tensordd/_wire_keys.py"
    protoc --python_out="$d/py/tensordd" -I"$d/proto" "$d/proto/tensordd.proto"
    "$PY" tools/gen_wire_keys.py "$d/proto/tensordd.proto" --c "$d/gen/tensordd_keys.h" \
        --py "$d/py/tensordd/_wire_keys.py"
done

# 3. The new fields' keys are generated (and only in the new peer's header).
grep -q '^#define TD_KEY_OP_PRIORITY 0x40u' "$scratch/new/gen/tensordd_keys.h"
grep -q '^#define TD_KEY_TENSOR_INFO_STREAM 0x40u' "$scratch/new/gen/tensordd_keys.h"
grep -q '^#define TD_KEY_REQUEST_TRACE 0x18u' "$scratch/new/gen/tensordd_keys.h"
grep -q '^K_OP_PRIORITY = b"\\x40"' "$scratch/new/py/tensordd/_wire_keys.py"
! grep -q 'TD_KEY_OP_PRIORITY' "$scratch/old/gen/tensordd_keys.h"

# 4. The C peers: the codec's users, unchanged, against each peer's protobuf-c and keys.
cat >"$scratch/peer.c" <<'CEOF'
/* One peer (old: the .proto as it is; new: with the added fields, TD_FIELD_OP_PRIORITY):
 *   peer write DIR   writes what its client and daemon send
 *   peer read DIR    reads what the other peer wrote, with its own codec and protobuf-c */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* the client library's private header */
#include "conn.h"
#include "wire.h"

#ifdef TD_FIELD_OP_PRIORITY
#define PEER "new"
#else
#define PEER "old"
#endif

static int fails;
#define EXPECT(c, ...)                                                                             \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "add-field (" PEER "): " __VA_ARGS__);                                \
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

static void put(const char *dir, const char *name, const uint8_t *b, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f)) {
        perror(path);
        exit(2);
    }
}

/* The file's bytes (0 and no bytes when the other peer did not write it). */
static size_t get(const char *dir, const char *name, uint8_t *b, size_t cap)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    size_t n = fread(b, 1, cap, f);
    fclose(f);
    return n;
}

static uint64_t ins[2] = {7, 300}, outs[1] = {9};

static void request(Tensordd__V1__Request *req, Tensordd__V1__Op *op)
{
    tensordd__v1__op__init(op);
    op->op = "add";
    op->n_inputs = 2;
    op->inputs = ins;
    op->n_outputs = 1;
    op->outputs = outs;
    tensordd__v1__request__init(req);
    req->id = 5;
    req->body_case = TENSORDD__V1__REQUEST__BODY_OP;
    req->op = op;
}

/* What this peer's client sends: the request as the client library frames it (the fast codec,
 * else protobuf-c). */
static size_t client_pack(const Tensordd__V1__Request *req, uint8_t *out, int *fast)
{
    td__req_sizes z;
    size_t n = td__request_fast_size(req, &z);
    *fast = n != 0;
    return n ? td__request_fast_pack(req, &z, out) : tensordd__v1__request__pack(req, out);
}

static void write_side(const char *dir)
{
    Tensordd__V1__Request req;
    Tensordd__V1__Op op;
    request(&req, &op);
    uint8_t buf[256], ref[256];
    int fast;
    size_t n = client_pack(&req, buf, &fast);
    size_t rn = tensordd__v1__request__pack(&req, ref);
    EXPECT(fast && n == rn && !memcmp(buf, ref, n), "the client's plain request is not fast");
    put(dir, "req_plain", buf, n);
#ifdef TD_FIELD_OP_PRIORITY
    op.priority = 3;
    req.trace = 77;
    n = client_pack(&req, buf, &fast);
    EXPECT(!fast, "the client's codec wrote a request with a new field set");
    put(dir, "req_new", buf, n);
#endif
    /* the daemon's TensorInfo reply (the fast codec), and one with a new field set */
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
    size_t rl = tdd_wire_tensor(rsp, 5, &v);
    put(dir, "rsp_plain", rsp, rl);
#ifdef TD_FIELD_OP_PRIORITY
    Tensordd__V1__Response *u = tensordd__v1__response__unpack(NULL, rl, rsp);
    EXPECT(u && u->tensor && u->tensor->stream == 0, "the daemon's TensorInfo does not read back");
    if (u) {
        u->tensor->stream = 12;
        n = tensordd__v1__response__pack(u, buf);
        put(dir, "rsp_new", buf, n);
        tensordd__v1__response__free_unpacked(u, NULL);
    }
#endif
}

static void read_side(const char *dir)
{
    ProtobufCAllocator al = {.alloc = alloc, .free = nofree};
    uint8_t buf[256];
    size_t n = get(dir, "req_plain", buf, sizeof buf);
    used = 0;
    Tensordd__V1__Request *d = n ? tdd_wire_request_fast(buf, n, &al) : NULL;
    EXPECT(d && d->id == 5 && d->op && d->op->n_inputs == 2 && d->op->inputs[1] == 300 &&
               d->op->outputs[0] == 9 && !strcmp(d->op->op, "add"),
           "the daemon's fast decoder did not take the other peer's plain request");
    if ((n = get(dir, "req_new", buf, sizeof buf)) != 0) { /* from a newer client */
        used = 0;
        EXPECT(tdd_wire_request_fast(buf, n, &al) == NULL,
               "the daemon's fast decoder took a request with a field it does not know");
        Tensordd__V1__Request *u = tensordd__v1__request__unpack(NULL, n, buf);
        EXPECT(u && u->id == 5 && u->op && u->op->n_inputs == 2 && u->op->inputs[1] == 300 &&
                   !strcmp(u->op->op, "add") && u->base.n_unknown_fields == 1 &&
                   u->op->base.n_unknown_fields == 1,
               "protobuf-c did not read the newer request, its new fields skipped");
        if (u)
            tensordd__v1__request__free_unpacked(u, NULL);
    }
    uint64_t id;
    int body;
    n = get(dir, "rsp_plain", buf, sizeof buf);
    EXPECT(n && td__glance_response(buf, n, &id, &body) == 1 && id == 5 &&
               body == TENSORDD__V1__RESPONSE__BODY_TENSOR,
           "the client's glance declined the other peer's plain reply");
    if ((n = get(dir, "rsp_new", buf, sizeof buf)) != 0) { /* from a newer daemon */
        EXPECT(td__glance_response(buf, n, &id, &body) == 0,
               "the client's glance took a reply with a field it does not know");
        Tensordd__V1__Response *u = tensordd__v1__response__unpack(NULL, n, buf);
        EXPECT(u && u->id == 5 && u->tensor && u->tensor->handle == 9 &&
                   u->tensor->n_shape == 1 && u->tensor->base.n_unknown_fields == 1,
               "protobuf-c did not read the newer reply, its new field skipped");
        if (u)
            tensordd__v1__response__free_unpacked(u, NULL);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    if (!strcmp(argv[1], "write"))
        write_side(argv[2]);
    else
        read_side(argv[2]);
    if (!fails)
        printf("add-field: C, %s peer %s: as expected\n", PEER,
               !strcmp(argv[1], "write") ? "wrote" : "read the other's messages");
    return fails != 0;
}
CEOF
for peer in old new; do
    d=$scratch/$peer
    cflags=(-std=c11 -O1 -D_GNU_SOURCE -Wall -Wextra -Werror -I"$d/gen" -Iinclude -Iproto -Icommon
            -Ibackends -Idaemon -Iclient/lib $(pkg-config --cflags libuv libprotobuf-c 2>/dev/null))
    for src in daemon/wire.c client/lib/wire.c proto/utf8.c common/errors.c common/tdd_err.c; do
        $CC "${cflags[@]}" -c "$src" -o "$d/$(echo "$src" | tr / _).o"
    done
    $CC "${cflags[@]}" -c "$d/gen/tensordd.pb-c.c" -o "$d/pbc.o" -Wno-error
    $CC "${cflags[@]}" "$scratch/peer.c" "$d"/*.o $(pkg-config --libs libprotobuf-c) -o "$d/peer"
    mkdir -p "$d/sent"
    "$d/peer" write "$d/sent"
done
"$scratch/old/peer" read "$scratch/new/sent" # an old daemon and client, a newer peer
"$scratch/new/peer" read "$scratch/old/sent" # a new daemon and client, an older peer

# 5. The Python peers: the accelerator compiled from its source against each header (when
# Python's headers are there), and the pure Python; the new one's messages read by the old.
for peer in old new; do
    if [[ -f $pyinc/Python.h ]]; then
        $CC -std=c11 -O1 -fPIC -shared -Wall -Wextra -Werror -isystem "$pyinc" \
            -I"$scratch/$peer/gen" -Iproto client/python/tensordd/_speedups.c \
            -o "$scratch/$peer/py/tensordd/_speedups$suffix"
    fi
done
for pure in 0 1; do
    TENSORDD_PURE=$pure PYTHONPATH="$scratch/new/py" "$PY" - "$pure" "$scratch/new/py.sent" <<'PYEOF'
import pickle, sys
from tensordd import _codec, _wire_keys, tensordd_pb2 as pb
assert _wire_keys.K_OP_PRIORITY == b"\x40" and _wire_keys.K_REQUEST_TRACE == b"\x18"
assert _codec.ACCELERATED == (sys.argv[1] == "0" and _codec.parse_tensor_reply is not None)
op = _codec.frame_op(5, "add", [7, 300], 9)[16:]
req = pb.Request.FromString(op)
assert (req.id, req.op.op, list(req.op.inputs), list(req.op.outputs), req.op.priority) == \
    (5, "add", [7, 300], [9], 0), req
rel = pb.Request.FromString(_codec.frame_release(6, [1, 2])[16:])
assert list(rel.release.handles) == [1, 2] and rel.trace == 0
bw = pb.Request.FromString(_codec.frame_backward(7, 3, 4)[16:])
assert (bw.backward.loss, bw.backward.grads, bw.backward.pipelined) == (3, 4, True)
st = pb.Request.FromString(_codec.frame_optimizer_step(8, 5, 4)[16:])
assert (st.optimizer_step.optimizer, st.optimizer_step.grads, st.optimizer_step.pipelined) == \
    (5, 4, True)
r = pb.Response(id=5, tensor=pb.TensorInfo(handle=9, dtype=1, shape=[4],
                                           device=pb.Device(backend="cpu")))
plain = r.SerializeToString()
r.tensor.stream = 12
newer = r.SerializeToString()
if _codec.parse_tensor_reply is not None:
    assert _codec.parse_tensor_reply(plain) == (5, 9, 1, (4,), "cpu", 0, False)
    assert _codec.parse_tensor_reply(newer) is None
req.op.priority = 3
req.trace = 77
pickle.dump({"op": op, "op_new": req.SerializeToString(), "plain": plain, "newer": newer},
            open(sys.argv[2], "wb"))
print("add-field: Python, new peer (%s): a new field is left to protobuf, the rest as before"
      % ("accelerated" if _codec.ACCELERATED else "pure"))
PYEOF
    TENSORDD_PURE=$pure PYTHONPATH="$scratch/old/py" "$PY" - "$scratch/new/py.sent" <<'PYEOF'
import pickle, sys
from tensordd import _codec, _wire_keys, tensordd_pb2 as pb
assert not hasattr(_wire_keys, "K_OP_PRIORITY")
sent = pickle.load(open(sys.argv[1], "rb"))
assert sent["op"] == _codec.frame_op(5, "add", [7, 300], 9)[16:]  # the same bytes, old or new
req = pb.Request.FromString(sent["op_new"])  # a newer client's request: its new fields skipped
assert (req.id, req.op.op, list(req.op.inputs), list(req.op.outputs)) == (5, "add", [7, 300], [9])
if _codec.parse_tensor_reply is not None:
    assert _codec.parse_tensor_reply(sent["plain"]) == (5, 9, 1, (4,), "cpu", 0, False)
    assert _codec.parse_tensor_reply(sent["newer"]) is None  # a newer daemon's: protobuf's
t = pb.Response.FromString(sent["newer"]).tensor
assert (t.handle, t.dtype, list(t.shape), t.device.backend) == (9, 1, [4], "cpu")
print("add-field: Python, old peer (%s) read the new peer's messages"
      % ("accelerated" if _codec.ACCELERATED else "pure"))
PYEOF
done

after=$(cat "${codec_sources[@]}" | sha256sum)
[[ $before == "$after" ]] || { echo "add-field: a codec's source changed" >&2; exit 1; }
echo "add-field: three new fields, no codec edited; old and new peers read each other"
