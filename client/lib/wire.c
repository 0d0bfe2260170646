/* wire.c -- libtensordd's hand-written protobuf for the messages of small
 * calls: the requests an op, a release or a sync sends, and a glance at
 * replies whose body the caller does not read.
 *
 * protobuf-c sizes a message by walking its descriptors, then walks them again
 * to write it (and sizes every sub-message once more on the way); unpacking a
 * reply mallocs each sub-message, string and array and frees them one by one.
 * For a small op with a reply that was most of the client's instructions.
 * The encoder writes exactly the bytes protobuf-c writes for the same message
 * (proto3: fields at their default value are left out; repeated scalars are
 * packed); what it does not cover is left to protobuf-c. */
#include <string.h>

#include "internal.h"
#include "pbwire.h"

/* A length-delimited field's size: key + length + bytes. */
static size_t ld(size_t keylen, size_t len)
{
    return keylen + td_pb_varint_len(len) + len;
}

static size_t packed_len(const uint64_t *a, size_t n)
{
    size_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += td_pb_varint_len(a[i]);
    return s;
}

static uint8_t *put_packed(uint8_t *p, uint8_t key, const uint64_t *a, size_t n, size_t len)
{
    if (!n)
        return p;
    *p++ = key;
    p = td_pb_put_varint(p, len);
    for (size_t i = 0; i < n; i++)
        p = td_pb_put_varint(p, a[i]);
    return p;
}

/* Field keys, (number << 3) | wire type, from proto/tensordd.proto. */
enum {
    K_REQ_ID = 0x08,
    K_REQ_WANT_REPLY = 0x10,
    K_REQ_OP = 0x72,      /* 14 */
    K_REQ_RELEASE = 0x7a, /* 15 */
    K_OP_NAME = 0x0a,
    K_OP_INPUTS = 0x12,
    K_OP_OUTPUTS = 0x1a,
    K_OP_DEVICE = 0x2a,
    K_OP_DTYPE = 0x30,
    K_OP_REQUIRES_GRAD = 0x38,
    K_DEV_BACKEND = 0x0a,
    K_DEV_ORDINAL = 0x10,
    K_RELEASE_HANDLES = 0x0a,
};
/* Sync = 17 takes a two-byte key. */
static const uint8_t K_REQ_SYNC[2] = {0x8a, 0x01};

typedef struct {
    size_t name, in, out, dev, backend, body;
} op_sizes;

static size_t device_len(const Tensordd__V1__Device *d, size_t *backend)
{
    *backend = d->backend ? strlen(d->backend) : 0;
    return (*backend ? ld(1, *backend) : 0) + (d->ordinal ? 1 + td_pb_varint_len(d->ordinal) : 0);
}

/* Sizes the body into z->body; 0 when the request is not one this file encodes. */
static int body_len(const Tensordd__V1__Request *req, op_sizes *z)
{
    switch (req->body_case) {
    case TENSORDD__V1__REQUEST__BODY_OP: {
        const Tensordd__V1__Op *op = req->op;
        if (!op || op->n_attrs || op->base.n_unknown_fields)
            return 0;
        z->name = op->op ? strlen(op->op) : 0;
        z->in = packed_len(op->inputs, op->n_inputs);
        z->out = packed_len(op->outputs, op->n_outputs);
        size_t n = (z->name ? ld(1, z->name) : 0) + (op->n_inputs ? ld(1, z->in) : 0) +
                   (op->n_outputs ? ld(1, z->out) : 0);
        if (op->device) {
            if (op->device->base.n_unknown_fields)
                return 0;
            z->dev = device_len(op->device, &z->backend);
            n += ld(1, z->dev);
        }
        /* an enum is an int32: a negative one takes 10 bytes */
        if (op->dtype)
            n += 1 + td_pb_varint_len((uint64_t)(int64_t)(int32_t)op->dtype);
        if (op->requires_grad)
            n += 2;
        z->body = n;
        return 1;
    }
    case TENSORDD__V1__REQUEST__BODY_RELEASE: {
        const Tensordd__V1__Release *r = req->release;
        if (!r || r->base.n_unknown_fields)
            return 0;
        z->in = packed_len(r->handles, r->n_handles);
        z->body = r->n_handles ? ld(1, z->in) : 0;
        return 1;
    }
    case TENSORDD__V1__REQUEST__BODY_SYNC:
        z->body = 0;
        return req->sync && !req->sync->base.n_unknown_fields;
    default:
        return 0;
    }
}

size_t td__request_fast_size(const Tensordd__V1__Request *req, td__req_sizes *zs)
{
    /* zs is the caller's uninitialised scratch, zeroed just below */
    /* cppcheck-suppress ctuuninitvar */
    op_sizes *z = (op_sizes *)zs->z;
    _Static_assert(sizeof(op_sizes) <= sizeof zs->z, "td__req_sizes too small");
    memset(z, 0, sizeof *z);
    if (req->base.n_unknown_fields || !body_len(req, z))
        return 0;
    size_t keylen = req->body_case == TENSORDD__V1__REQUEST__BODY_SYNC ? 2 : 1;
    return (req->id ? 1 + td_pb_varint_len(req->id) : 0) + (req->want_reply ? 2 : 0) +
           ld(keylen, z->body);
}

size_t td__request_fast_pack(const Tensordd__V1__Request *req, const td__req_sizes *zs,
                             uint8_t *out)
{
    const op_sizes *z = (const op_sizes *)zs->z;
    uint8_t *p = out;
    if (req->id) {
        *p++ = K_REQ_ID;
        p = td_pb_put_varint(p, req->id);
    }
    if (req->want_reply) {
        *p++ = K_REQ_WANT_REPLY;
        *p++ = 1;
    }
    switch (req->body_case) {
    case TENSORDD__V1__REQUEST__BODY_OP: {
        const Tensordd__V1__Op *op = req->op;
        *p++ = K_REQ_OP;
        p = td_pb_put_varint(p, z->body);
        if (z->name) {
            *p++ = K_OP_NAME;
            p = td_pb_put_varint(p, z->name);
            memcpy(p, op->op, z->name);
            p += z->name;
        }
        p = put_packed(p, K_OP_INPUTS, op->inputs, op->n_inputs, z->in);
        p = put_packed(p, K_OP_OUTPUTS, op->outputs, op->n_outputs, z->out);
        if (op->device) {
            *p++ = K_OP_DEVICE;
            p = td_pb_put_varint(p, z->dev);
            if (z->backend) {
                *p++ = K_DEV_BACKEND;
                p = td_pb_put_varint(p, z->backend);
                memcpy(p, op->device->backend, z->backend);
                p += z->backend;
            }
            if (op->device->ordinal) {
                *p++ = K_DEV_ORDINAL;
                p = td_pb_put_varint(p, op->device->ordinal);
            }
        }
        if (op->dtype) {
            *p++ = K_OP_DTYPE;
            p = td_pb_put_varint(p, (uint64_t)(int64_t)(int32_t)op->dtype);
        }
        if (op->requires_grad) {
            *p++ = K_OP_REQUIRES_GRAD;
            *p++ = 1;
        }
        break;
    }
    case TENSORDD__V1__REQUEST__BODY_RELEASE:
        *p++ = K_REQ_RELEASE;
        p = td_pb_put_varint(p, z->body);
        p = put_packed(p, K_RELEASE_HANDLES, req->release->handles, req->release->n_handles, z->in);
        break;
    default: /* Sync */
        *p++ = K_REQ_SYNC[0];
        *p++ = K_REQ_SYNC[1];
        *p++ = 0;
        break;
    }
    return (size_t)(p - out);
}

/* ---------------------------------------------------------------- replies */

/* A run of varints filling f exactly. */
static int varints(td_pb_reader f)
{
    uint64_t v;
    while (f.p < f.end)
        if (!td_pb_get_varint(&f, &v))
            return 0;
    return 1;
}

/* Device: backend (string), ordinal (uint32). */
static int check_device(td_pb_reader r)
{
    uint64_t key, v;
    td_pb_reader f;
    while (r.p < r.end) {
        if (!td_pb_get_key(&r, &key))
            return 0;
        if (key == 0x0a ? !td_pb_get_bytes(&r, &f) : key == 0x10 ? !td_pb_get_varint(&r, &v) : 1)
            return 0;
    }
    return 1;
}

/* TensorInfo: handle, dtype, shape (packed or not), device, requires_grad. */
static int check_tensor_info(td_pb_reader r)
{
    uint64_t key, v;
    td_pb_reader f;
    while (r.p < r.end) {
        if (!td_pb_get_key(&r, &key))
            return 0;
        switch (key) {
        case 0x08: /* handle */
        case 0x10: /* dtype */
        case 0x18: /* shape, one unpacked element */
        case 0x28: /* requires_grad */
            if (!td_pb_get_varint(&r, &v))
                return 0;
            break;
        case 0x1a: /* shape, packed */
            if (!td_pb_get_bytes(&r, &f) || !varints(f))
                return 0;
            break;
        case 0x22: /* device */
            if (!td_pb_get_bytes(&r, &f) || !check_device(f))
                return 0;
            break;
        default:
            return 0;
        }
    }
    return 1;
}

int td__glance_response(const uint8_t *msg, size_t len, uint64_t *id, int *body_case)
{
    td_pb_reader r = {msg, msg + len};
    uint64_t key, v;
    td_pb_reader body = {NULL, NULL};
    *id = 0;
    *body_case = TENSORDD__V1__RESPONSE__BODY__NOT_SET;
    while (r.p < r.end) {
        if (!td_pb_get_key(&r, &key))
            return 0;
        if (key == 0x08) {
            if (!td_pb_get_varint(&r, &v))
                return 0;
            *id = v;
        } else if (key == 0x5a || key == 0x72) { /* ok = 11, tensor = 14 */
            if (*body_case || !td_pb_get_bytes(&r, &body))
                return 0;
            *body_case = (int)(key >> 3);
        } else {
            return 0; /* an error, another body, an unknown field: decode it properly */
        }
    }
    if (*body_case == TENSORDD__V1__RESPONSE__BODY_OK)
        return body.p == body.end;
    if (*body_case == TENSORDD__V1__RESPONSE__BODY_TENSOR)
        return check_tensor_info(body);
    return 0;
}
