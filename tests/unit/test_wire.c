/* test_wire.c -- the fast codec (proto/wirecodec.h) against protobuf-c.
 *
 * The daemon (daemon/wire.c) encodes the Ok and TensorInfo replies and decodes small ops'
 * requests with it; libtensordd (client/lib/wire.c) packs the same requests and glances at
 * replies. Each must agree with protobuf-c (tensordd.pb-c.c, generated from
 * proto/tensordd.proto) byte for byte, or, for the decoders, decline:
 *
 *   - encoders: the same bytes as protobuf-c's pack of the same message;
 *   - daemon decoder: NULL, or the message protobuf-c unpacks from the same
 *     bytes (never a message where protobuf-c fails, never a different one);
 *   - client glance: 0, or protobuf-c decodes the same id and a non-error body;
 *   - the field numbers and types the hand code hard-codes are still those
 *     of the .proto.
 *
 * Inputs are random (a fixed seed per test, so a failure replays), valid
 * messages, then the same mutated: bits flipped, bytes changed, inserted,
 * deleted, truncated, junk appended, and re-encodings protobuf-c also reads
 * (varints and keys padded to non-minimal length, fields repeated, swapped,
 * packed arrays sent unpacked or empty). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../client/lib/internal.h" /* the client library's private header */
#include "conn.h"
#include "pbwire.h"
#include "tensordd_keys.h"
#include "wire.h"
#include "wirecodec.h"

Suite *wire_suite(void);

/* ---------------------------------------------------------------- random inputs */

static uint64_t rng_state;

static void rng_seed(uint64_t s)
{
    rng_state = s ? s : 1;
}

static uint64_t rnd(void)
{
    uint64_t x = rng_state; /* xorshift64 */
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static uint64_t below(uint64_t n)
{
    return n ? rnd() % n : 0;
}

/* A value that exercises every varint length: 0, small, each 7-bit boundary,
 * full 64-bit, and "negative" (near 2^64, ten bytes). */
static uint64_t rv(void)
{
    switch (below(7)) {
    case 0:
        return 0;
    case 1:
        return below(200);
    case 2:
        return below(100000);
    case 3: {
        unsigned b = 7 * (1 + (unsigned)below(9)); /* 7..63 */
        return (1ull << b) - 1 + below(3);         /* 2^b - 1, 2^b, 2^b + 1 */
    }
    case 4:
        return rnd();
    case 5:
        return (uint64_t) - (int64_t)below(50);
    default: {
        uint64_t v = rnd(); /* apart: the order of two calls in one expression is unspecified */
        return v >> below(64);
    }
    }
}

/* A string of n bytes, none NUL (C strings): printable or any byte. */
static void rand_str(char *s, size_t n)
{
    int printable = (int)below(2);
    for (size_t i = 0; i < n; i++)
        s[i] = printable ? (char)('a' + below(26)) : (char)(1 + below(255));
    s[n] = 0;
}

/* A string length: mostly short, sometimes past one (127) and two (16383) length bytes. */
static size_t rand_len(void)
{
    switch (below(8)) {
    case 0:
        return 0;
    case 1:
        return 120 + below(20);
    case 2:
        return below(3) ? below(400) : 16380 + below(10);
    default:
        return below(20);
    }
}

/* ---------------------------------------------------------------- protobuf-c helpers */

/* A bump allocator like the daemon's connection arena. */
static uint8_t *arena;
static size_t arena_used, arena_cap = 1u << 20;
static long arena_fail_after = -1; /* allocations before one fails; -1: never */

static void *arena_alloc(void *ctx, size_t n)
{
    (void)ctx;
    if (arena_fail_after == 0)
        return NULL;
    if (arena_fail_after > 0)
        arena_fail_after--;
    n = (n + 15) & ~(size_t)15;
    if (arena_used + n > arena_cap)
        return NULL;
    void *p = arena + arena_used;
    arena_used += n;
    return p;
}

static void arena_free(void *ctx, void *p)
{
    (void)ctx;
    (void)p;
}

/* Appends to a growable buffer. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void w_reserve(wbuf *w, size_t more)
{
    if (w->n + more <= w->cap)
        return;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->n + more)
        cap *= 2;
    w->p = realloc(w->p, cap);
    ck_assert_ptr_nonnull(w->p);
    w->cap = cap;
}

static void w_bytes(wbuf *w, const void *b, size_t n)
{
    w_reserve(w, n);
    if (n)
        memcpy(w->p + w->n, b, n);
    w->n += n;
}

static void w_byte(wbuf *w, uint8_t b)
{
    w_bytes(w, &b, 1);
}

/* v as a varint of its minimal length plus pad bytes (pad 0: canonical). */
static void w_varint(wbuf *w, uint64_t v, size_t pad)
{
    while (v >= 0x80) {
        w_byte(w, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    if (!pad) {
        w_byte(w, (uint8_t)v);
        return;
    }
    w_byte(w, (uint8_t)(v | 0x80));
    for (size_t i = 1; i < pad; i++)
        w_byte(w, 0x80);
    w_byte(w, 0);
}

static size_t vlen(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* ---------------------------------------------------------------- re-encoding */

/* What the re-encoder knows of the schema: which length-delimited fields are
 * messages (to recurse into) or packed varints (to pad or unpack). */
enum { MT_OTHER, MT_REQUEST, MT_OP, MT_RELEASE, MT_DEVICE, MT_ATTR, MT_RESPONSE, MT_TI, MT_INTS };
enum { F_RAW, F_SUB, F_PACKED };
static const struct {
    int msg, field, kind, sub;
} schema[] = {
    {MT_REQUEST, 10, F_SUB, MT_OTHER},
    {MT_REQUEST, 13, F_SUB, MT_OTHER},
    {MT_REQUEST, 14, F_SUB, MT_OP},
    {MT_REQUEST, 15, F_SUB, MT_RELEASE},
    {MT_REQUEST, 17, F_SUB, MT_OTHER},
    {MT_OP, 2, F_PACKED, 0},
    {MT_OP, 3, F_PACKED, 0},
    {MT_OP, 4, F_SUB, MT_ATTR},
    {MT_OP, 5, F_SUB, MT_DEVICE},
    {MT_RELEASE, 1, F_PACKED, 0},
    {MT_ATTR, 5, F_SUB, MT_INTS},
    {MT_INTS, 1, F_PACKED, 0},
    {MT_RESPONSE, 10, F_SUB, MT_OTHER},
    {MT_RESPONSE, 11, F_SUB, MT_OTHER},
    {MT_RESPONSE, 14, F_SUB, MT_TI},
    {MT_TI, 3, F_PACKED, 0},
    {MT_TI, 4, F_SUB, MT_DEVICE},
};

static int field_kind(int msg, uint64_t field, int *sub)
{
    for (size_t i = 0; i < sizeof schema / sizeof schema[0]; i++)
        if (schema[i].msg == msg && (uint64_t)schema[i].field == field) {
            *sub = schema[i].sub;
            return schema[i].kind;
        }
    return F_RAW;
}

typedef struct {
    int pad, dup, swap, unpack, empty; /* per-mille chances */
} remix;

static int chance(int per_mille)
{
    return below(1000) < (uint64_t)per_mille;
}

/* Padding for a varint: most stay minimal; padded ones reach 5 (the longest
 * key protobuf-c reads), 10 (the longest varint) and 11 bytes (too long). */
static size_t pad_for(const remix *m, uint64_t v)
{
    if (!chance(m->pad))
        return 0;
    size_t min = vlen(v);
    return min >= 11 ? 0 : 1 + (size_t)below(11 - min);
}

/* A raw varint reader for canonical input; false at anything else. */
static int rd_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (int i = 0; i < 10 && *p < end; i++) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (b < 0x80) {
            *out = v;
            return 1;
        }
    }
    return 0;
}

typedef struct {
    uint64_t key, v; /* v: the value of a varint field */
    const uint8_t *b;
    size_t n; /* a length-delimited or fixed field's bytes */
} field;

static void reencode(wbuf *out, int msg, const uint8_t *p, size_t len, const remix *m);

static void emit_field(wbuf *out, int msg, const field *f, const remix *m)
{
    uint64_t num = f->key >> 3, wt = f->key & 7;
    int sub = MT_OTHER, kind = field_kind(msg, num, &sub);
    if (wt == 2 && kind == F_PACKED && chance(m->unpack)) {
        /* packed as separate varint fields (protobuf-c reads both forms) */
        const uint8_t *q = f->b, *end = f->b + f->n;
        uint64_t v;
        while (q < end && rd_varint(&q, end, &v)) {
            w_varint(out, num << 3, pad_for(m, num << 3));
            w_varint(out, v, pad_for(m, v));
        }
        return;
    }
    w_varint(out, f->key, pad_for(m, f->key));
    if (wt == 0) {
        w_varint(out, f->v, pad_for(m, f->v));
    } else if (wt == 2) {
        wbuf in = {0};
        if (kind == F_SUB) {
            reencode(&in, sub, f->b, f->n, m);
        } else if (kind == F_PACKED) {
            const uint8_t *q = f->b, *end = f->b + f->n;
            uint64_t v;
            while (q < end && rd_varint(&q, end, &v))
                w_varint(&in, v, pad_for(m, v));
        } else {
            w_bytes(&in, f->b, f->n);
        }
        w_varint(out, in.n, pad_for(m, in.n));
        w_bytes(out, in.p, in.n);
        free(in.p);
    } else {
        w_bytes(out, f->b, f->n);
    }
}

/* Writes the message at p again, field by field, remixed by m. */
static void reencode(wbuf *out, int msg, const uint8_t *p, size_t len, const remix *m)
{
    enum { MAXF = 64 };
    field fs[MAXF];
    size_t nf = 0;
    const uint8_t *q = p, *end = p + len;
    while (q < end) {
        field f = {0};
        if (nf == MAXF || !rd_varint(&q, end, &f.key))
            goto raw;
        uint64_t wt = f.key & 7;
        if (wt == 0) {
            if (!rd_varint(&q, end, &f.v))
                goto raw;
        } else if (wt == 2) {
            uint64_t n;
            if (!rd_varint(&q, end, &n) || n > (uint64_t)(end - q))
                goto raw;
            f.b = q;
            f.n = (size_t)n;
            q += n;
        } else if (wt == 1 || wt == 5) {
            f.n = wt == 1 ? 8 : 4;
            if (f.n > (size_t)(end - q))
                goto raw;
            f.b = q;
            q += f.n;
        } else {
            goto raw;
        }
        fs[nf++] = f;
    }
    if (nf >= 2 && chance(m->swap)) {
        size_t i = (size_t)below(nf - 1);
        field t = fs[i];
        fs[i] = fs[i + 1];
        fs[i + 1] = t;
    }
    for (size_t i = 0; i < nf; i++) {
        emit_field(out, msg, &fs[i], m);
        if (chance(m->dup))
            emit_field(out, msg, &fs[i], m);
    }
    if (chance(m->empty)) {
        /* an empty packed field, where the schema has one */
        int sub;
        for (uint64_t n = 1; n < 8; n++)
            if (field_kind(msg, n, &sub) == F_PACKED) {
                w_varint(out, (n << 3) | 2, 0);
                w_byte(out, 0);
                break;
            }
    }
    return;
raw:
    w_bytes(out, p, len); /* not canonical protobuf: left as it is */
}

/* One mutation of buf (length *n, room for cap): bit flip, byte set, insert,
 * delete, truncate, junk appended, a span repeated, or a re-encoding. */
static void mutate(uint8_t *buf, size_t *n, size_t cap, int msg)
{
    size_t len = *n;
    switch (below(9)) {
    case 0:
        if (len) {
            size_t at = (size_t)below(len);
            buf[at] ^= (uint8_t)(1u << below(8));
        }
        break;
    case 1:
        if (len) {
            static const uint8_t interesting[] = {0x00, 0x01, 0x02, 0x08, 0x0a, 0x10, 0x12,
                                                  0x1a, 0x22, 0x28, 0x30, 0x38, 0x5a, 0x72,
                                                  0x7a, 0x7f, 0x80, 0x8a, 0xff};
            size_t at = (size_t)below(len);
            buf[at] = below(2) ? interesting[below(sizeof interesting)] : (uint8_t)rnd();
        }
        break;
    case 2:
        if (len + 1 <= cap) {
            size_t at = (size_t)below(len + 1);
            memmove(buf + at + 1, buf + at, len - at);
            buf[at] = (uint8_t)rnd();
            len++;
        }
        break;
    case 3:
        if (len) {
            size_t at = (size_t)below(len);
            memmove(buf + at, buf + at + 1, len - at - 1);
            len--;
        }
        break;
    case 4:
        len = (size_t)below(len + 1);
        break;
    case 5:
        for (size_t k = 1 + (size_t)below(4); k && len < cap; k--)
            buf[len++] = (uint8_t)rnd();
        break;
    case 6:
        if (len) {
            size_t a = (size_t)below(len), b = a + 1 + (size_t)below(len - a);
            if (len + (b - a) <= cap) {
                memmove(buf + b + (b - a), buf + b, len - b);
                memcpy(buf + b, buf + a, b - a);
                len += b - a;
            }
        }
        break;
    default: {
        remix m; /* one by one: an initializer list's order is unspecified */
        m.pad = below(2) ? 100 : 20;
        m.dup = (int)below(3) * 50;
        m.swap = (int)below(3) * 300;
        m.unpack = (int)below(2) * 500;
        m.empty = below(4) == 0 ? 500 : 0;
        wbuf w = {0};
        reencode(&w, msg, buf, len, &m);
        if (w.n <= cap) {
            if (w.n)
                memcpy(buf, w.p, w.n);
            len = w.n;
        }
        free(w.p);
        break;
    }
    }
    *n = len;
}

/* ---------------------------------------------------------------- field numbers */

typedef struct {
    const ProtobufCMessageDescriptor *d;
    const char *name;
    unsigned number;
    ProtobufCType type;
    ProtobufCLabel label;
    int packed;
} field_expect;

/* Every field the hand code reads or writes, as daemon/wire.c and
 * client/lib/wire.c spell its key. A change to one of these in the .proto
 * must change those files too. */
START_TEST(test_field_numbers)
{
    const ProtobufCMessageDescriptor *rsp = &tensordd__v1__response__descriptor,
                                     *ti = &tensordd__v1__tensor_info__descriptor,
                                     *dev = &tensordd__v1__device__descriptor,
                                     *req = &tensordd__v1__request__descriptor,
                                     *op = &tensordd__v1__op__descriptor,
                                     *rel = &tensordd__v1__release__descriptor;
    const ProtobufCLabel one = PROTOBUF_C_LABEL_NONE, rep = PROTOBUF_C_LABEL_REPEATED;
    const field_expect ex[] = {
        {rsp, "id", 1, PROTOBUF_C_TYPE_UINT64, one, 0},
        {rsp, "error", 10, PROTOBUF_C_TYPE_MESSAGE, one, 0},
        {rsp, "ok", 11, PROTOBUF_C_TYPE_MESSAGE, one, 0},
        {rsp, "tensor", 14, PROTOBUF_C_TYPE_MESSAGE, one, 0},
        {ti, "handle", 1, PROTOBUF_C_TYPE_UINT64, one, 0},
        {ti, "dtype", 2, PROTOBUF_C_TYPE_ENUM, one, 0},
        {ti, "shape", 3, PROTOBUF_C_TYPE_INT64, rep, 1},
        {ti, "device", 4, PROTOBUF_C_TYPE_MESSAGE, one, 0},
        {ti, "requires_grad", 5, PROTOBUF_C_TYPE_BOOL, one, 0},
        {ti, "payload_fd", 6, PROTOBUF_C_TYPE_BOOL, one, 0},
        {ti, "fd_offset", 7, PROTOBUF_C_TYPE_UINT64, one, 0},
        {dev, "backend", 1, PROTOBUF_C_TYPE_STRING, one, 0},
        {dev, "ordinal", 2, PROTOBUF_C_TYPE_UINT32, one, 0},
        {req, "id", 1, PROTOBUF_C_TYPE_UINT64, one, 0},
        {req, "want_reply", 2, PROTOBUF_C_TYPE_BOOL, one, 0},
        {req, "op", 14, PROTOBUF_C_TYPE_MESSAGE, one, 0},
        {req, "release", 15, PROTOBUF_C_TYPE_MESSAGE, one, 0},
        {req, "sync", 17, PROTOBUF_C_TYPE_MESSAGE, one, 0},
        {op, "op", 1, PROTOBUF_C_TYPE_STRING, one, 0},
        {op, "inputs", 2, PROTOBUF_C_TYPE_UINT64, rep, 1},
        {op, "outputs", 3, PROTOBUF_C_TYPE_UINT64, rep, 1},
        {op, "attrs", 4, PROTOBUF_C_TYPE_MESSAGE, rep, 0},
        {op, "device", 5, PROTOBUF_C_TYPE_MESSAGE, one, 0},
        {op, "dtype", 6, PROTOBUF_C_TYPE_ENUM, one, 0},
        {op, "requires_grad", 7, PROTOBUF_C_TYPE_BOOL, one, 0},
        {rel, "handles", 1, PROTOBUF_C_TYPE_UINT64, rep, 1},
    };
    for (size_t i = 0; i < sizeof ex / sizeof ex[0]; i++) {
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(ex[i].d, ex[i].name);
        ck_assert_msg(f != NULL, "%s.%s is gone from the .proto", ex[i].d->name, ex[i].name);
        ck_assert_msg(f->id == ex[i].number && f->type == ex[i].type,
                      "%s.%s is field %u of type %d in the .proto; the hand code in "
                      "daemon/wire.c and client/lib/wire.c assumes %u of type %d",
                      ex[i].d->name, ex[i].name, f->id, (int)f->type, ex[i].number,
                      (int)ex[i].type);
        /* proto3 optional fields read as LABEL_NONE; others must not change label */
        ck_assert_msg(f->label == ex[i].label, "%s.%s changed label", ex[i].d->name, ex[i].name);
        ck_assert_msg(!!(f->flags & PROTOBUF_C_FIELD_FLAG_PACKED) == ex[i].packed,
                      "%s.%s changed packing", ex[i].d->name, ex[i].name);
    }
    /* The hand code writes every field of these: a new one would be dropped. (TensorInfo's
     * payload_fd and fd_offset are set only in a Download as_fd answer, which data_req.c
     * packs with protobuf-c; the TensorInfos tdd_wire_tensor writes leave both at their
     * defaults, which proto3 does not write.) */
    ck_assert_msg(ti->n_fields == 7, "TensorInfo has a new field: update tdd_wire_tensor");
    ck_assert_msg(dev->n_fields == 2, "Device has a new field: update both wire.c");
    ck_assert_msg(op->n_fields == 7, "Op has a new field: update client/lib/wire.c");
    ck_assert_msg(rel->n_fields == 1, "Release has a new field: update both wire.c");
    ck_assert_uint_eq(tensordd__v1__sync__descriptor.n_fields, 0);
    ck_assert_uint_eq(tensordd__v1__ok__descriptor.n_fields, 0);
    /* ... and every field of Request and Response outside their oneof */
    size_t plain = 0;
    for (unsigned i = 0; i < req->n_fields; i++)
        plain += !(req->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF);
    ck_assert_msg(plain == 2, "Request has a new field outside its body: update both wire.c");
    plain = 0;
    for (unsigned i = 0; i < rsp->n_fields; i++)
        plain += !(rsp->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF);
    ck_assert_msg(plain == 1, "Response has a new field outside its body: update both wire.c");
    /* The body cases the glance returns are the field numbers. */
    ck_assert_int_eq(TENSORDD__V1__RESPONSE__BODY_OK, 11);
    ck_assert_int_eq(TENSORDD__V1__RESPONSE__BODY_TENSOR, 14);
}
END_TEST

/* ---------------------------------------------------------------- 1. daemon encoders */

enum { N_ENC = 20000, N_REQ = 20000, N_CLI = 20000, N_RSP = 20000 };

static void expect_same_bytes(const uint8_t *a, size_t an, const uint8_t *b, size_t bn,
                              const char *what, int it)
{
    if (an == bn && !memcmp(a, b, an))
        return;
    char hex[2][512];
    for (int k = 0; k < 2; k++) {
        const uint8_t *p = k ? b : a;
        size_t n = k ? bn : an, o = 0;
        for (size_t i = 0; i < n && o + 4 < sizeof hex[k]; i++)
            o += (size_t)snprintf(hex[k] + o, sizeof hex[k] - o, "%02x ", p[i]);
        hex[k][o] = 0;
    }
    ck_abort_msg(
        "%s, case %d: protobuf-c wrote %zu bytes, the hand code %zu\n  pbc:  %s\n  hand: %s", what,
        it, an, bn, hex[0], hex[1]);
}

START_TEST(test_encoders)
{
    rng_seed(0x5eed0001);
    uint8_t *out = malloc(TDD_WIRE_SMALL_MAX); /* exact: ASan sees any overrun */
    uint8_t ref[1024];
    ck_assert_ptr_nonnull(out);
    for (int it = 0; it < N_ENC; it++) {
        uint64_t id = rv();

        /* Ok */
        Tensordd__V1__Ok ok = TENSORDD__V1__OK__INIT;
        Tensordd__V1__Response r = TENSORDD__V1__RESPONSE__INIT;
        r.id = id;
        r.body_case = TENSORDD__V1__RESPONSE__BODY_OK;
        r.ok = &ok;
        size_t rn = tensordd__v1__response__pack(&r, ref);
        size_t n = tdd_wire_ok(out, id);
        expect_same_bytes(ref, rn, out, n, "tdd_wire_ok", it);

        /* TensorInfo */
        static const char *const fixed[] = {"cpu",
                                            "ref",
                                            "cuda",
                                            "sim",
                                            "",
                                            "x",
                                            "abcdefghijklmn",
                                            "abcdefghijklmno",
                                            "abcdefghijklmnop"};
        char name[48];
        if (below(2))
            snprintf(name, sizeof name, "%s", fixed[below(sizeof fixed / sizeof fixed[0])]);
        else
            rand_str(name, (size_t)below(sizeof name));
        tdd_backend be;
        memset(&be, 0, sizeof be);
        be.name = name;
        tdd_device dev;
        memset(&dev, 0, sizeof dev);
        dev.be = &be;
        switch (below(4)) {
        case 0:
        case 1:
            dev.ordinal = 0;
            break;
        case 2:
            dev.ordinal = (int)below(300);
            break;
        default:
            dev.ordinal = (int)(uint32_t)rnd(); /* up to INT_MAX, and negative */
        }
        tdd_value v;
        memset(&v, 0, sizeof v);
        v.dev = &dev;
        v.handle = rv();
        v.t.dtype = (td_dtype)(below(4) == 0   ? 0
                               : below(8) == 0 ? (int)(int32_t)rnd() /* any enum value */
                                               : (int)below(TD_DTYPE_COUNT));
        v.t.ndim = below(16) == 0 ? (int)below(24) - 8 /* out of range: clamped */
                                  : (int)below(TD_MAX_NDIM + 1);
        for (int i = 0; i < TD_MAX_NDIM; i++)
            v.t.shape[i] = (int64_t)rv();
        v.requires_grad = below(2);

        /* The reference: the TensorInfo protobuf-c would pack, its device as
         * tdd_wire_device writes it for ListDevices (backend cut to 15 bytes). */
        Tensordd__V1__Device d;
        char b[16];
        tdd_wire_device(&d, b, sizeof b, &dev);
        ck_assert_uint_eq(strlen(d.backend), strlen(name) < 15 ? strlen(name) : 15);
        ck_assert(!strncmp(d.backend, name, 15));
        Tensordd__V1__TensorInfo ti = TENSORDD__V1__TENSOR_INFO__INIT;
        ti.handle = v.handle;
        ti.dtype = (Tensordd__V1__DType)v.t.dtype;
        ti.n_shape = (size_t)(v.t.ndim < 0 ? 0 : v.t.ndim > TD_MAX_NDIM ? TD_MAX_NDIM : v.t.ndim);
        ti.shape = v.t.shape;
        ti.device = &d;
        ti.requires_grad = v.requires_grad;
        r.body_case = TENSORDD__V1__RESPONSE__BODY_TENSOR;
        r.tensor = &ti;
        rn = tensordd__v1__response__pack(&r, ref);
        ck_assert_uint_eq(rn, tensordd__v1__response__get_packed_size(&r));
        n = tdd_wire_tensor(out, id, &v);
        ck_assert_uint_le(n, TDD_WIRE_SMALL_MAX);
        expect_same_bytes(ref, rn, out, n, "tdd_wire_tensor", it);
    }
    free(out);
}
END_TEST

/* The largest TensorInfo fits TDD_WIRE_SMALL_MAX. */
START_TEST(test_encoder_largest)
{
    uint8_t *out = malloc(TDD_WIRE_SMALL_MAX), ref[1024];
    ck_assert_ptr_nonnull(out);
    tdd_backend be;
    memset(&be, 0, sizeof be);
    be.name = "a-backend-name-longer-than-fifteen-bytes";
    tdd_device dev;
    memset(&dev, 0, sizeof dev);
    dev.be = &be;
    dev.ordinal = -1;
    tdd_value v;
    memset(&v, 0, sizeof v);
    v.dev = &dev;
    v.handle = UINT64_MAX;
    v.t.dtype = (td_dtype)-1;
    v.t.ndim = TD_MAX_NDIM;
    for (int i = 0; i < TD_MAX_NDIM; i++)
        v.t.shape[i] = -1;
    v.requires_grad = true;
    size_t n = tdd_wire_tensor(out, UINT64_MAX, &v);
    ck_assert_uint_le(n, TDD_WIRE_SMALL_MAX);

    Tensordd__V1__Device d;
    char b[16];
    tdd_wire_device(&d, b, sizeof b, &dev);
    Tensordd__V1__TensorInfo ti = TENSORDD__V1__TENSOR_INFO__INIT;
    ti.handle = v.handle;
    ti.dtype = (Tensordd__V1__DType)-1;
    ti.n_shape = TD_MAX_NDIM;
    ti.shape = v.t.shape;
    ti.device = &d;
    ti.requires_grad = 1;
    Tensordd__V1__Response r = TENSORDD__V1__RESPONSE__INIT;
    r.id = UINT64_MAX;
    r.body_case = TENSORDD__V1__RESPONSE__BODY_TENSOR;
    r.tensor = &ti;
    size_t rn = tensordd__v1__response__pack(&r, ref);
    expect_same_bytes(ref, rn, out, n, "tdd_wire_tensor (largest)", 0);
    free(out);
}
END_TEST

/* ---------------------------------------------------------------- random requests */

/* Storage for one random request (pointers into it). */
typedef struct {
    Tensordd__V1__Request req;
    Tensordd__V1__Op op;
    Tensordd__V1__Release rl;
    Tensordd__V1__Sync sy;
    Tensordd__V1__Download dl;
    Tensordd__V1__Describe ds;
    Tensordd__V1__Hello he;
    Tensordd__V1__Device dev;
    Tensordd__V1__Attr at[2], *atp[2];
    Tensordd__V1__IntList il;
    ProtobufCMessageUnknownField uf;
    uint8_t uf_data[1];
    char name[16400], backend[48];
    uint64_t ins[8], outs[4], hs[700];
    int64_t ints[4];
    int kind; /* 0 op, 1 release, 2 sync, 3 other */
} rand_req;

static void make_request(rand_req *q, int allow_unknown)
{
    memset(q, 0, sizeof *q);
    tensordd__v1__request__init(&q->req);
    q->req.id = rv();
    q->req.want_reply = below(2) ? 0 : below(8) ? 1 : (protobuf_c_boolean)(2 + below(5));
    q->kind = (int)below(4);
    switch (q->kind) {
    case 0: {
        Tensordd__V1__Op *op = &q->op;
        tensordd__v1__op__init(op);
        rand_str(q->name, rand_len());
        op->op = below(16) ? q->name : NULL;
        op->n_inputs = (size_t)below(9);
        for (size_t i = 0; i < op->n_inputs; i++)
            q->ins[i] = rv();
        op->inputs = q->ins;
        op->n_outputs = (size_t)below(5);
        for (size_t i = 0; i < op->n_outputs; i++)
            q->outs[i] = rv();
        op->outputs = q->outs;
        op->dtype = (Tensordd__V1__DType)(below(2)   ? 0
                                          : below(4) ? (int)below(12)
                                                     : (int)(int32_t)rnd());
        op->requires_grad = below(3) ? 0 : below(4) ? 1 : (protobuf_c_boolean)(2 + below(5));
        if (below(6) == 0) {
            tensordd__v1__device__init(&q->dev);
            rand_str(q->backend, (size_t)below(3) ? (size_t)below(6) : (size_t)below(40));
            q->dev.backend = below(8) ? q->backend : NULL;
            q->dev.ordinal = below(2) ? 0 : (uint32_t)rv();
            op->device = &q->dev;
        }
        if (below(6) == 0) {
            op->n_attrs = 1 + (size_t)below(2);
            for (size_t i = 0; i < op->n_attrs; i++) {
                tensordd__v1__attr__init(&q->at[i]);
                q->at[i].name = i ? "dims" : "dim";
                if (i) {
                    tensordd__v1__int_list__init(&q->il);
                    q->il.n_v = (size_t)below(4);
                    for (size_t k = 0; k < q->il.n_v; k++)
                        q->ints[k] = (int64_t)rv();
                    q->il.v = q->ints;
                    q->at[i].value_case = TENSORDD__V1__ATTR__VALUE_INTS;
                    q->at[i].ints = &q->il;
                } else {
                    q->at[i].value_case = TENSORDD__V1__ATTR__VALUE_I;
                    q->at[i].i = (int64_t)rv();
                }
                q->atp[i] = &q->at[i];
            }
            op->attrs = q->atp;
        }
        q->req.body_case = TENSORDD__V1__REQUEST__BODY_OP;
        q->req.op = op;
        break;
    }
    case 1:
        tensordd__v1__release__init(&q->rl);
        q->rl.n_handles = below(8) ? (size_t)below(20) : (size_t)below(700);
        for (size_t i = 0; i < q->rl.n_handles; i++)
            q->hs[i] = rv();
        q->rl.handles = q->hs;
        q->req.body_case = TENSORDD__V1__REQUEST__BODY_RELEASE;
        q->req.release = &q->rl;
        break;
    case 2:
        tensordd__v1__sync__init(&q->sy);
        q->req.body_case = TENSORDD__V1__REQUEST__BODY_SYNC;
        q->req.sync = &q->sy;
        break;
    default:
        switch (below(4)) {
        case 0:
            break; /* no body */
        case 1:
            tensordd__v1__download__init(&q->dl);
            q->dl.handle = rv();
            q->req.body_case = TENSORDD__V1__REQUEST__BODY_DOWNLOAD;
            q->req.download = &q->dl;
            break;
        case 2:
            tensordd__v1__describe__init(&q->ds);
            q->ds.handle = rv();
            q->req.body_case = TENSORDD__V1__REQUEST__BODY_DESCRIBE;
            q->req.describe = &q->ds;
            break;
        default:
            tensordd__v1__hello__init(&q->he);
            q->he.min_version = (uint32_t)below(3);
            q->he.max_version = (uint32_t)below(3);
            q->he.client_name = "test";
            q->req.body_case = TENSORDD__V1__REQUEST__BODY_HELLO;
            q->req.hello = &q->he;
        }
    }
    if (allow_unknown && below(32) == 0) {
        /* an unknown field somewhere: the client packer must leave it to protobuf-c */
        q->uf.tag = 100 + (uint32_t)below(100);
        q->uf.wire_type = PROTOBUF_C_WIRE_TYPE_VARINT;
        q->uf.len = 1;
        q->uf.data = q->uf_data;
        ProtobufCMessage *m = &q->req.base;
        if (q->kind == 0 && below(2))
            m = &q->op.base;
        else if (q->kind == 1 && below(2))
            m = &q->rl.base;
        else if (q->kind == 2 && below(2))
            m = &q->sy.base;
        else if (q->kind == 0 && q->op.device && below(2))
            m = &q->dev.base;
        m->n_unknown_fields = 1;
        m->unknown_fields = &q->uf;
    }
}

/* ---------------------------------------------------------------- 2. daemon decoder */

static int same_u64(size_t na, const uint64_t *a, size_t nb, const uint64_t *b)
{
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* f (the hand decoder's) and g (protobuf-c's) are the same message; the hand
 * decoder only ever returns Op (no attrs, no device), Release, Sync or no body. */
static const char *differ(const Tensordd__V1__Request *f, const Tensordd__V1__Request *g)
{
    if (f->base.descriptor != &tensordd__v1__request__descriptor)
        return "descriptor";
    if (f->id != g->id)
        return "id";
    if (f->want_reply != g->want_reply)
        return "want_reply";
    if (f->body_case != g->body_case)
        return "body_case";
    if (f->base.n_unknown_fields || g->base.n_unknown_fields)
        return "unknown fields";
    switch (f->body_case) {
    case TENSORDD__V1__REQUEST__BODY__NOT_SET:
        return NULL;
    case TENSORDD__V1__REQUEST__BODY_OP: {
        const Tensordd__V1__Op *x = f->op, *y = g->op;
        if (!x || x->base.descriptor != &tensordd__v1__op__descriptor)
            return "op descriptor";
        if (!x->op || !y->op || strcmp(x->op, y->op))
            return "op.op";
        if (!same_u64(x->n_inputs, x->inputs, y->n_inputs, y->inputs))
            return "op.inputs";
        if (!same_u64(x->n_outputs, x->outputs, y->n_outputs, y->outputs))
            return "op.outputs";
        if (x->n_attrs || y->n_attrs)
            return "op.attrs";
        if (x->device || y->device)
            return "op.device";
        if (x->dtype != y->dtype)
            return "op.dtype";
        if (x->requires_grad != y->requires_grad)
            return "op.requires_grad";
        if (x->base.n_unknown_fields || y->base.n_unknown_fields)
            return "op unknown fields";
        return NULL;
    }
    case TENSORDD__V1__REQUEST__BODY_RELEASE:
        if (!f->release || f->release->base.descriptor != &tensordd__v1__release__descriptor)
            return "release descriptor";
        if (!same_u64(f->release->n_handles, f->release->handles, g->release->n_handles,
                      g->release->handles))
            return "release.handles";
        if (g->release->base.n_unknown_fields)
            return "release unknown fields";
        return NULL;
    case TENSORDD__V1__REQUEST__BODY_SYNC:
        if (!f->sync || f->sync->base.descriptor != &tensordd__v1__sync__descriptor)
            return "sync descriptor";
        if (g->sync->base.n_unknown_fields)
            return "sync unknown fields";
        return NULL;
    default:
        return "a body the hand decoder never decodes";
    }
}

typedef struct {
    long fast, declined, pbc_ok;
} dec_counts;

/* Decodes buf both ways; fails the test if the hand decoder accepts what
 * protobuf-c rejects or decodes something else. Returns whether it accepted. */
static int check_decode(const uint8_t *buf, size_t len, const char *what, int it, dec_counts *c)
{
    uint8_t *copy = malloc(len ? len : 1); /* exact size: ASan sees any overread */
    ck_assert_ptr_nonnull(copy);
    if (len)
        memcpy(copy, buf, len);
    ProtobufCAllocator al = {.alloc = arena_alloc, .free = arena_free};
    arena_used = 0;
    Tensordd__V1__Request *f = tdd_wire_request_fast(copy, len, &al);
    Tensordd__V1__Request *g = tensordd__v1__request__unpack(NULL, len, copy);
    const char *why = f ? (g ? differ(f, g) : "protobuf-c rejects it") : NULL;
    if (why) {
        char hex[600];
        size_t o = 0;
        for (size_t i = 0; i < len && o + 4 < sizeof hex; i++)
            o += (size_t)snprintf(hex + o, sizeof hex - o, "%02x ", copy[i]);
        hex[o] = 0;
        ck_abort_msg("tdd_wire_request_fast, %s case %d: accepted %zu bytes, but %s:\n  %s", what,
                     it, len, why, hex);
    }
    c->fast += f != NULL;
    c->declined += f == NULL;
    c->pbc_ok += g != NULL;
    if (g)
        tensordd__v1__request__free_unpacked(g, NULL);
    free(copy);
    return f != NULL;
}

START_TEST(test_request_decoder)
{
    rng_seed(0x5eed0002);
    arena = malloc(arena_cap);
    ck_assert_ptr_nonnull(arena);
    rand_req *q = malloc(sizeof *q);
    size_t cap = 1u << 16;
    uint8_t *buf = malloc(cap);
    ck_assert_ptr_nonnull(q);
    ck_assert_ptr_nonnull(buf);
    dec_counts valid = {0}, mutated = {0};
    for (int it = 0; it < N_REQ; it++) {
        make_request(q, 0);
        size_t n = tensordd__v1__request__pack(&q->req, buf);
        int fast = check_decode(buf, n, "valid", it, &valid);
        /* what small ops send must take the fast path (else it silently slows) */
        int small = (q->kind == 0 && !q->op.n_attrs && !q->op.device && (int)q->op.dtype >= 0) ||
                    (q->kind == 1 && q->rl.n_handles) || q->kind == 2;
        ck_assert_msg(!small || fast, "valid case %d (kind %d) declined", it, q->kind);
        for (int m = 0; m < 4; m++) {
            size_t len = tensordd__v1__request__pack(&q->req, buf);
            for (int k = 1 + (int)below(3); k; k--)
                mutate(buf, &len, cap, MT_REQUEST);
            check_decode(buf, len, "mutated", it, &mutated);
        }
    }
    ck_assert_int_eq(valid.pbc_ok, N_REQ);
    fprintf(stderr,
            "wire: request decoder: %ld of %d valid requests decoded by hand; of %ld mutated, "
            "%ld decoded by hand, %ld by protobuf-c; all equal\n",
            valid.fast, N_REQ, mutated.fast + mutated.declined, mutated.fast, mutated.pbc_ok);
    /* Fully random bytes, biased toward the keys the decoder knows. */
    dec_counts junk = {0};
    for (int it = 0; it < N_REQ; it++) {
        static const uint8_t keys[] = {0x08, 0x10, 0x72, 0x7a, 0x8a, 0x01, 0x0a, 0x12,
                                       0x1a, 0x30, 0x38, 0x00, 0x02, 0x80, 0xff};
        size_t len = (size_t)below(40);
        for (size_t i = 0; i < len; i++)
            buf[i] = below(2) ? keys[below(sizeof keys)] : (uint8_t)rnd();
        check_decode(buf, len, "random", it, &junk);
    }
    free(buf);
    free(q);
    free(arena);
    arena = NULL;
}
END_TEST

/* Varints and keys at and past the lengths protobuf-c reads (a key of at most
 * 5 bytes, a value of at most 10, its 10th byte 0 or 1). */
START_TEST(test_request_decoder_overlong)
{
    arena = malloc(arena_cap);
    ck_assert_ptr_nonnull(arena);
    dec_counts c = {0};
    int it = 0;
    for (size_t kpad = 0; kpad <= 6; kpad++)
        for (size_t vpad = 0; vpad <= 10; vpad++) {
            /* Request { id: 5 } with padded key and value */
            wbuf w = {0};
            w_varint(&w, 0x08, kpad);
            w_varint(&w, 5, vpad);
            check_decode(w.p, w.n, "overlong id", it++, &c);
            /* Release { handles: [7] } with padded keys and lengths */
            wbuf in = {0}, rl = {0};
            w_varint(&in, 7, vpad);
            w_varint(&rl, 0x0a, kpad);
            w_varint(&rl, in.n, vpad);
            w_bytes(&rl, in.p, in.n);
            w.n = 0;
            w_varint(&w, 0x7a, kpad);
            w_varint(&w, rl.n, vpad);
            w_bytes(&w, rl.p, rl.n);
            check_decode(w.p, w.n, "overlong release", it++, &c);
            /* Sync {} and Op { op: "a", requires_grad: 1 } */
            w.n = 0;
            w_varint(&w, (17 << 3) | 2, kpad);
            w_varint(&w, 0, vpad);
            check_decode(w.p, w.n, "overlong sync", it++, &c);
            w.n = 0;
            wbuf op = {0};
            w_varint(&op, 0x0a, kpad);
            w_varint(&op, 1, vpad);
            w_byte(&op, 'a');
            w_varint(&op, 0x38, kpad);
            w_varint(&op, 1, vpad);
            w_varint(&w, 0x72, 0);
            w_varint(&w, op.n, 0);
            w_bytes(&w, op.p, op.n);
            check_decode(w.p, w.n, "overlong op", it++, &c);
            free(op.p);
            free(in.p);
            free(rl.p);
            free(w.p);
        }
    /* 10-byte values whose last byte carries more than bit 63 */
    for (unsigned last = 0; last < 0x80; last++) {
        uint8_t b[12] = {0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80};
        b[10] = (uint8_t)last;
        check_decode(b, 11, "10-byte id", it++, &c);
    }
    /* canonical messages with nothing but the minimal encodings still take the fast path */
    ck_assert_int_gt(c.fast, 0);
    free(arena);
    arena = NULL;
}
END_TEST

/* An allocator that runs out: NULL, no crash, whatever the point. */
START_TEST(test_request_decoder_no_memory)
{
    rng_seed(0x5eed0003);
    arena = malloc(arena_cap);
    ck_assert_ptr_nonnull(arena);
    rand_req *q = malloc(sizeof *q);
    uint8_t *buf = malloc(1u << 16);
    ck_assert_ptr_nonnull(q);
    ck_assert_ptr_nonnull(buf);
    ProtobufCAllocator al = {.alloc = arena_alloc, .free = arena_free};
    for (int it = 0; it < 2000; it++) {
        make_request(q, 0);
        size_t n = tensordd__v1__request__pack(&q->req, buf);
        long allocs = 0;
        arena_used = 0;
        arena_fail_after = -1;
        if (!tdd_wire_request_fast(buf, n, &al))
            continue;
        allocs = (long)below(6);
        arena_used = 0;
        arena_fail_after = allocs;
        Tensordd__V1__Request *f = tdd_wire_request_fast(buf, n, &al);
        arena_fail_after = -1;
        if (f) { /* it needed no more than it was given */
            Tensordd__V1__Request *g = tensordd__v1__request__unpack(NULL, n, buf);
            ck_assert_ptr_nonnull(g);
            ck_assert_ptr_null(differ(f, g));
            tensordd__v1__request__free_unpacked(g, NULL);
        }
    }
    free(buf);
    free(q);
    free(arena);
    arena = NULL;
}
END_TEST

/* ---------------------------------------------------------------- 3. client packer */

START_TEST(test_client_packer)
{
    rng_seed(0x5eed0004);
    rand_req *q = malloc(sizeof *q);
    uint8_t *ref = malloc(1u << 16);
    ck_assert_ptr_nonnull(q);
    ck_assert_ptr_nonnull(ref);
    long fast = 0, slow = 0;
    for (int it = 0; it < N_CLI; it++) {
        make_request(q, 1);
        size_t rn = tensordd__v1__request__pack(&q->req, ref);
        ck_assert_uint_eq(rn, tensordd__v1__request__get_packed_size(&q->req));
        td__req_sizes z;
        size_t n = td__request_fast_size(&q->req, &z);
        int unknown = q->req.base.n_unknown_fields || q->op.base.n_unknown_fields ||
                      q->rl.base.n_unknown_fields || q->sy.base.n_unknown_fields ||
                      q->dev.base.n_unknown_fields;
        int ours = (q->kind == 0 && !q->op.n_attrs) || q->kind == 1 || q->kind == 2 ||
                   q->req.body_case == TENSORDD__V1__REQUEST__BODY_DOWNLOAD;
        if (!n) {
            ck_assert_msg(!ours || unknown, "case %d (kind %d): left to protobuf-c", it, q->kind);
            slow++;
            continue;
        }
        ck_assert_msg(ours && !unknown, "case %d (kind %d): packed by hand", it, q->kind);
        fast++;
        uint8_t *out = malloc(n); /* exact: ASan sees any overrun */
        ck_assert_ptr_nonnull(out);
        size_t wn = td__request_fast_pack(&q->req, &z, out);
        ck_assert_uint_eq(wn, n);
        expect_same_bytes(ref, rn, out, wn, "td__request_fast_pack", it);
        free(out);
    }
    fprintf(stderr, "wire: client packer: %ld requests byte-identical, %ld left to protobuf-c\n",
            fast, slow);
    free(ref);
    free(q);
}
END_TEST

/* ---------------------------------------------------------------- 4. client reply glance */

typedef struct {
    Tensordd__V1__Response r;
    Tensordd__V1__Ok ok;
    Tensordd__V1__TensorInfo ti;
    Tensordd__V1__Device d;
    Tensordd__V1__Error e;
    Tensordd__V1__UnknownHandle uh;
    Tensordd__V1__HelloReply hr;
    int64_t shape[TD_MAX_NDIM + 4];
    char backend[48];
    int kind; /* 0 ok, 1 tensor, 2 error, 3 other */
} rand_rsp;

static void make_response(rand_rsp *s)
{
    memset(s, 0, sizeof *s);
    tensordd__v1__response__init(&s->r);
    s->r.id = rv();
    s->kind = (int)below(4);
    switch (s->kind) {
    case 0:
        tensordd__v1__ok__init(&s->ok);
        s->r.body_case = TENSORDD__V1__RESPONSE__BODY_OK;
        s->r.ok = &s->ok;
        break;
    case 1:
        tensordd__v1__tensor_info__init(&s->ti);
        s->ti.handle = rv();
        s->ti.dtype = (Tensordd__V1__DType)(below(4) ? (int)below(8) : (int)(int32_t)rnd());
        s->ti.n_shape = (size_t)below(TD_MAX_NDIM + 5);
        for (size_t i = 0; i < s->ti.n_shape; i++)
            s->shape[i] = (int64_t)rv();
        s->ti.shape = s->shape;
        if (below(5)) {
            tensordd__v1__device__init(&s->d);
            rand_str(s->backend, (size_t)below(20));
            s->d.backend = s->backend;
            s->d.ordinal = below(2) ? 0 : (uint32_t)rv();
            s->ti.device = &s->d;
        }
        s->ti.requires_grad = (protobuf_c_boolean)below(2);
        s->r.body_case = TENSORDD__V1__RESPONSE__BODY_TENSOR;
        s->r.tensor = &s->ti;
        break;
    case 2:
        tensordd__v1__error__init(&s->e);
        s->e.code = (Tensordd__V1__ErrorCode)(1 + below(22));
        s->e.message = "bad";
        s->e.request_id = rv();
        if (below(2)) {
            tensordd__v1__unknown_handle__init(&s->uh);
            s->uh.handle = rv();
            s->e.detail_case = TENSORDD__V1__ERROR__DETAIL_UNKNOWN_HANDLE;
            s->e.unknown_handle = &s->uh;
        }
        s->r.body_case = TENSORDD__V1__RESPONSE__BODY_ERROR;
        s->r.error = &s->e;
        break;
    default:
        if (below(2)) {
            tensordd__v1__hello_reply__init(&s->hr);
            s->hr.version = 1;
            s->hr.server = "tensordd";
            s->r.body_case = TENSORDD__V1__RESPONSE__BODY_HELLO;
            s->r.hello = &s->hr;
        }
    }
}

START_TEST(test_client_glance)
{
    rng_seed(0x5eed0005);
    rand_rsp *s = malloc(sizeof *s);
    size_t cap = 1u << 12;
    uint8_t *buf = malloc(cap);
    ck_assert_ptr_nonnull(s);
    ck_assert_ptr_nonnull(buf);
    long glanced = 0, total = 0;
    for (int it = 0; it < N_RSP; it++) {
        make_response(s);
        for (int m = 0; m < 4; m++) {
            size_t len = tensordd__v1__response__pack(&s->r, buf);
            for (int k = m ? 1 + (int)below(3) : 0; k; k--)
                mutate(buf, &len, cap, MT_RESPONSE);
            uint8_t *copy = malloc(len ? len : 1);
            ck_assert_ptr_nonnull(copy);
            if (len)
                memcpy(copy, buf, len);
            uint64_t id;
            int body;
            int g = td__glance_response(copy, len, &id, &body);
            Tensordd__V1__Response *u = tensordd__v1__response__unpack(NULL, len, copy);
            total++;
            if (g) {
                glanced++;
                ck_assert_msg(u != NULL, "glance case %d/%d: accepted what protobuf-c rejects", it,
                              m);
                ck_assert_msg(u->id == id, "glance case %d/%d: id %llu, protobuf-c %llu", it, m,
                              (unsigned long long)id, (unsigned long long)u->id);
                ck_assert_msg(
                    (int)u->body_case == body && (body == TENSORDD__V1__RESPONSE__BODY_OK ||
                                                  body == TENSORDD__V1__RESPONSE__BODY_TENSOR),
                    "glance case %d/%d: body %d, protobuf-c %d", it, m, body, (int)u->body_case);
            } else if (m == 0) {
                /* an Ok or TensorInfo reply as the daemon sends them is glanced at */
                ck_assert_msg(s->kind >= 2, "glance declined valid case %d (kind %d)", it, s->kind);
            }
            if (u)
                tensordd__v1__response__free_unpacked(u, NULL);
            free(copy);
        }
    }
    fprintf(stderr,
            "wire: client glance: %ld of %ld replies (valid and mutated) accepted, each one "
            "protobuf-c decodes to the same id and an Ok or TensorInfo\n",
            glanced, total);
    free(buf);
    free(s);
}
END_TEST

/* ---------------------------------------------------------------- every message */

/* Every field's key in tensordd_keys.h (generated from the .proto, which the hand codecs take
 * their keys from) is the one protobuf-c's descriptor gives, and every field of every message
 * has one. */
static unsigned wire_type_of(const ProtobufCFieldDescriptor *f)
{
    if (f->label == PROTOBUF_C_LABEL_REPEATED && (f->flags & PROTOBUF_C_FIELD_FLAG_PACKED))
        return 2;
    switch (f->type) {
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE:
        return 2;
    case PROTOBUF_C_TYPE_DOUBLE:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return 1;
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return 5;
    default:
        return 0;
    }
}

START_TEST(test_generated_keys)
{
    static const struct {
        const ProtobufCMessageDescriptor *d;
        const char *field;
        unsigned number, key, wire_type, key_len;
    } keys[] = {
#define KEY_ROW(M, F, name, number, key, wt)                                                       \
    {&TD_DESC_##M, name, number, key, wt, TD_KEY_LEN_##M##_##F},
        TD_PB_FIELDS(KEY_ROW)
#undef KEY_ROW
    };
    size_t n = sizeof keys / sizeof keys[0];
    for (size_t i = 0; i < n; i++) {
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(keys[i].d, keys[i].field);
        ck_assert_msg(f != NULL, "%s.%s: generated, not in protobuf-c", keys[i].d->name,
                      keys[i].field);
        unsigned want = (f->id << 3) | wire_type_of(f);
        ck_assert_msg(keys[i].number == f->id && keys[i].key == want &&
                          keys[i].wire_type == wire_type_of(f),
                      "%s.%s: generated field %u key 0x%x, protobuf-c field %u key 0x%x",
                      keys[i].d->name, keys[i].field, keys[i].number, keys[i].key, f->id, want);
        uint8_t b[8];
        ck_assert_uint_eq(keys[i].key_len, (unsigned)(td_pb_put_key(b, keys[i].key) - b));
    }
    /* ... and none is missing: as many rows as fields, message by message. */
    const ProtobufCMessageDescriptor *msgs[] = {
#define MSG_ROW(M, desc) &desc,
        TD_PB_MESSAGES(MSG_ROW)
#undef MSG_ROW
    };
    size_t total = 0;
    for (size_t m = 0; m < sizeof msgs / sizeof msgs[0]; m++) {
        size_t rows = 0;
        for (size_t i = 0; i < n; i++)
            rows += keys[i].d == msgs[m];
        ck_assert_msg(rows == msgs[m]->n_fields, "%s: %zu generated keys, %u fields", msgs[m]->name,
                      rows, msgs[m]->n_fields);
        total += rows;
    }
    ck_assert_uint_eq(total, n);
}
END_TEST

/* Random messages of any type, from protobuf-c's descriptors: each field set or not (one
 * member per oneof), repeated ones 0-3 long, nested messages to a depth of 3. Memory from a
 * bump pool of its own (the decoders under test use the arena). */
static uint8_t *gen_pool;
static size_t gen_used, gen_cap = 1u << 22;
static unsigned gen_seen[64]; /* per message type (TD_PB_MESSAGES order): how many filled */
static const ProtobufCMessageDescriptor *const gen_msgs[] = {
#define GEN_ROW(M, desc) &desc,
    TD_PB_MESSAGES(GEN_ROW)
#undef GEN_ROW
};

static void *gen_alloc(size_t n)
{
    n = (n + 15) & ~(size_t)15;
    ck_assert_msg(gen_used + n <= gen_cap, "random message pool exhausted");
    void *p = gen_pool + gen_used;
    gen_used += n;
    memset(p, 0, n);
    return p;
}

static void gen_message(ProtobufCMessage *m, const ProtobufCMessageDescriptor *d, int depth);

/* One value of f's type at v. */
static int gen_value(const ProtobufCFieldDescriptor *f, void *v, int depth)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: {
        uint32_t x = (uint32_t)rv();
        memcpy(v, &x, 4);
        return 1;
    }
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *e = f->descriptor;
        int x = below(8) ? e->values[below(e->n_values)].value : (int)(int32_t)rnd();
        memcpy(v, &x, sizeof x);
        return 1;
    }
    case PROTOBUF_C_TYPE_BOOL:
        *(protobuf_c_boolean *)v = (protobuf_c_boolean)below(2);
        return 1;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: {
        uint64_t x = rv();
        memcpy(v, &x, 8);
        return 1;
    }
    case PROTOBUF_C_TYPE_FLOAT: {
        float x = (float)(int64_t)rv() / 7.0f;
        memcpy(v, &x, 4);
        return 1;
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double x = (double)(int64_t)rv() / 7.0;
        memcpy(v, &x, 8);
        return 1;
    }
    case PROTOBUF_C_TYPE_STRING: {
        size_t n = below(4) ? below(20) : rand_len();
        char *s = gen_alloc(n + 1);
        rand_str(s, n);
        *(char **)v = s;
        return 1;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = v;
        b->len = below(24);
        b->data = gen_alloc(b->len + 1);
        for (size_t i = 0; i < b->len; i++)
            b->data[i] = (uint8_t)rnd();
        return 1;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        if (depth >= 3)
            return 0;
        const ProtobufCMessageDescriptor *sd = f->descriptor;
        ProtobufCMessage *sub = gen_alloc(sd->sizeof_message);
        gen_message(sub, sd, depth + 1);
        *(ProtobufCMessage **)v = sub;
        return 1;
    }
    default:
        return 0;
    }
}

static size_t value_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
        return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default:
        return 4;
    }
}

/* Sets field f of m (a oneof member: makes it the oneof's case). */
static void gen_field(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, int depth)
{
    char *base = (char *)m;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t n = f->type == PROTOBUF_C_TYPE_MESSAGE && depth >= 3 ? 0 : below(4);
        char *a = n ? gen_alloc(n * value_size(f)) : NULL;
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            k += (size_t)gen_value(f, a + k * value_size(f), depth);
        *(size_t *)(void *)(base + f->quantifier_offset) = k;
        *(void **)(void *)(base + f->offset) = k ? a : NULL;
        return;
    }
    if (!gen_value(f, base + f->offset, depth))
        return;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        *(uint32_t *)(void *)(base + f->quantifier_offset) = f->id;
    else if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
        *(protobuf_c_boolean *)(void *)(base + f->quantifier_offset) = 1;
}

static void gen_message(ProtobufCMessage *m, const ProtobufCMessageDescriptor *d, int depth)
{
    protobuf_c_message_init(d, m);
    for (size_t i = 0; i < sizeof gen_msgs / sizeof gen_msgs[0]; i++)
        if (gen_msgs[i] == d)
            gen_seen[i]++;
    for (unsigned i = 0; i < d->n_fields; i++)
        if (below(2))
            gen_field(m, &d->fields[i], depth); /* a later oneof member replaces an earlier */
}

/* A Request or Response whose body is field `body` (filled at random), the rest random too. */
static ProtobufCMessage *gen_with_body(const ProtobufCMessageDescriptor *d,
                                       const ProtobufCFieldDescriptor *body)
{
    ProtobufCMessage *m = gen_alloc(d->sizeof_message);
    gen_message(m, d, 0);
    gen_field(m, body, 0);
    return m;
}

/* The codec's reply encoders (the daemon's) on a random Response's id and Ok or TensorInfo:
 * the bytes protobuf-c packs for the same fields (the device always written, as the daemon
 * does). 0 for another body. */
static int check_reply_encoder(const Tensordd__V1__Response *r, uint8_t *out, uint8_t *ref, int it)
{
    Tensordd__V1__Response m = TENSORDD__V1__RESPONSE__INIT;
    Tensordd__V1__Ok ok = TENSORDD__V1__OK__INIT;
    Tensordd__V1__TensorInfo ti = TENSORDD__V1__TENSOR_INFO__INIT;
    Tensordd__V1__Device dev = TENSORDD__V1__DEVICE__INIT;
    m.id = r->id;
    uint8_t *e;
    if (r->body_case == TENSORDD__V1__RESPONSE__BODY_OK) {
        m.body_case = TENSORDD__V1__RESPONSE__BODY_OK;
        m.ok = &ok;
        e = td_wire_response_ok(out, r->id);
    } else if (r->body_case == TENSORDD__V1__RESPONSE__BODY_TENSOR) {
        const Tensordd__V1__TensorInfo *t = r->tensor;
        const char *be = t->device && t->device->backend ? t->device->backend : "";
        td_wire_tensor w = {
            .handle = t->handle,
            .dtype = (int32_t)t->dtype,
            .shape = t->shape,
            .ndim = (int)t->n_shape,
            .device = {be, strlen(be), t->device ? t->device->ordinal : 0},
            .requires_grad = t->requires_grad != 0,
        };
        e = td_wire_response_tensor(out, r->id, &w);
        ti.handle = t->handle;
        ti.dtype = t->dtype;
        ti.n_shape = t->n_shape;
        ti.shape = t->shape;
        dev.backend = (char *)(uintptr_t)be;
        dev.ordinal = w.device.ordinal;
        ti.device = &dev;
        ti.requires_grad = t->requires_grad;
        m.body_case = TENSORDD__V1__RESPONSE__BODY_TENSOR;
        m.tensor = &ti;
    } else {
        return 0;
    }
    size_t n = tensordd__v1__response__pack(&m, ref);
    expect_same_bytes(ref, n, out, (size_t)(e - out), "reply encoder", it);
    return 1;
}

enum { N_EVERY = 300 };

/* Every Request body and every Response body (and so, nested, every message of the .proto)
 * through each hand-written codec: random, then mutated; each codec either declines or agrees
 * with protobuf-c (check_decode for the daemon's decoder, the same bytes for the client's
 * packer, the same id and body for the client's glance). */
START_TEST(test_every_message)
{
    rng_seed(0x5eed0007);
    arena = malloc(arena_cap);
    gen_pool = malloc(gen_cap);
    size_t cap = 1u << 16;
    uint8_t *buf = malloc(cap), *ref = malloc(cap);
    ck_assert_ptr_nonnull(arena);
    ck_assert_ptr_nonnull(gen_pool);
    ck_assert_ptr_nonnull(buf);
    ck_assert_ptr_nonnull(ref);
    memset(gen_seen, 0, sizeof gen_seen);
    ck_assert_uint_le(sizeof gen_msgs / sizeof gen_msgs[0], sizeof gen_seen / sizeof gen_seen[0]);
    dec_counts c = {0, 0, 0};
    long packed = 0, glanced = 0, bodies = 0, encoded = 0;

    const ProtobufCMessageDescriptor *rq = &tensordd__v1__request__descriptor;
    for (unsigned b = 0; b < rq->n_fields; b++) {
        const ProtobufCFieldDescriptor *body = &rq->fields[b];
        if (!(body->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        bodies++;
        for (int it = 0; it < N_EVERY; it++) {
            gen_used = 0;
            Tensordd__V1__Request *req = (Tensordd__V1__Request *)gen_with_body(rq, body);
            ck_assert_uint_lt(protobuf_c_message_get_packed_size(&req->base), cap);
            size_t len = tensordd__v1__request__pack(req, buf);
            /* the client's packer: declines, or writes protobuf-c's bytes */
            td__req_sizes z;
            size_t fn = td__request_fast_size(req, &z);
            if (fn) {
                packed++;
                ck_assert_uint_le(fn, cap);
                size_t w = td__request_fast_pack(req, &z, ref);
                expect_same_bytes(buf, len, ref, w, body->name, it);
            }
            /* the daemon's decoder, on it and on mutations of it */
            check_decode(buf, len, body->name, it, &c);
            for (int k = 1 + (int)below(3); k; k--)
                mutate(buf, &len, cap, MT_REQUEST);
            check_decode(buf, len, body->name, it, &c);
        }
    }

    const ProtobufCMessageDescriptor *rs = &tensordd__v1__response__descriptor;
    for (unsigned b = 0; b < rs->n_fields; b++) {
        const ProtobufCFieldDescriptor *body = &rs->fields[b];
        if (!(body->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        bodies++;
        for (int it = 0; it < N_EVERY; it++) {
            gen_used = 0;
            ProtobufCMessage *rsp = gen_with_body(rs, body);
            ck_assert_uint_lt(protobuf_c_message_get_packed_size(rsp), cap);
            encoded += check_reply_encoder((const Tensordd__V1__Response *)rsp, buf, ref, it);
            size_t len = protobuf_c_message_pack(rsp, buf);
            for (int m = 0; m < 2; m++) {
                for (int k = m ? 1 + (int)below(3) : 0; k; k--)
                    mutate(buf, &len, cap, MT_RESPONSE);
                uint8_t *copy = malloc(len ? len : 1); /* exact: ASan sees any overread */
                ck_assert_ptr_nonnull(copy);
                if (len)
                    memcpy(copy, buf, len);
                uint64_t id;
                int got;
                int g = td__glance_response(copy, len, &id, &got);
                Tensordd__V1__Response *u = tensordd__v1__response__unpack(NULL, len, copy);
                if (g) {
                    glanced++;
                    ck_assert_msg(u != NULL,
                                  "glance, %s case %d/%d: accepted what protobuf-c "
                                  "rejects",
                                  body->name, it, m);
                    ck_assert_msg(u->id == id && (int)u->body_case == got &&
                                      (got == TENSORDD__V1__RESPONSE__BODY_OK ||
                                       got == TENSORDD__V1__RESPONSE__BODY_TENSOR),
                                  "glance, %s case %d/%d: id %llu body %d, protobuf-c %llu %d",
                                  body->name, it, m, (unsigned long long)id, got,
                                  (unsigned long long)u->id, (int)u->body_case);
                }
                if (u)
                    tensordd__v1__response__free_unpacked(u, NULL);
                free(copy);
            }
        }
    }
    /* every message of the .proto was among them */
    for (size_t i = 0; i < sizeof gen_msgs / sizeof gen_msgs[0]; i++)
        ck_assert_msg(gen_seen[i] > 0,
                      "%s never generated: not reachable from a Request or a "
                      "Response body?",
                      gen_msgs[i]->name);
    fprintf(stderr,
            "wire: every message: %ld bodies, %zu message types; client packer wrote %ld, the "
            "daemon's decoder accepted %ld of %ld, the client's glance %ld, the reply encoder "
            "wrote %ld; all as protobuf-c\n",
            bodies, sizeof gen_msgs / sizeof gen_msgs[0], packed, c.fast, c.fast + c.declined,
            glanced, encoded);
    free(buf);
    free(ref);
    free(gen_pool);
    free(arena);
    arena = NULL;
}
END_TEST

Suite *wire_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *tc = tcase_create("protobuf-c");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_field_numbers);
    tcase_add_test(tc, test_encoders);
    tcase_add_test(tc, test_encoder_largest);
    tcase_add_test(tc, test_request_decoder);
    tcase_add_test(tc, test_request_decoder_overlong);
    tcase_add_test(tc, test_request_decoder_no_memory);
    tcase_add_test(tc, test_client_packer);
    tcase_add_test(tc, test_client_glance);
    tcase_add_test(tc, test_generated_keys);
    tcase_add_test(tc, test_every_message);
    suite_add_tcase(s, tc);
    return s;
}
