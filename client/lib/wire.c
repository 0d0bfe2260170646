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
#include "tensordd_keys.h"

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

static uint8_t *put_packed(uint8_t *p, uint32_t key, const uint64_t *a, size_t n, size_t len)
{
    if (!n)
        return p;
    p = td_pb_put_key(p, key);
    p = td_pb_put_varint(p, len);
    for (size_t i = 0; i < n; i++)
        p = td_pb_put_varint(p, a[i]);
    return p;
}

typedef struct {
    size_t name, in, out, dev, backend, body;
} op_sizes;

/* The fields this file writes, per message (a oneof's members are its body switch's). A
 * field the .proto gains later is not written here: a message that sets one is left to
 * protobuf-c, checked only once the message has more fields than these (a constant). */
static const uint32_t req_written[] = {TD_FIELD_REQUEST_ID, TD_FIELD_REQUEST_WANT_REPLY};
static const uint32_t op_written[] = {
    TD_FIELD_OP_OP,     TD_FIELD_OP_INPUTS, TD_FIELD_OP_OUTPUTS,      TD_FIELD_OP_ATTRS,
    TD_FIELD_OP_DEVICE, TD_FIELD_OP_DTYPE,  TD_FIELD_OP_REQUIRES_GRAD};
static const uint32_t dev_written[] = {TD_FIELD_DEVICE_BACKEND, TD_FIELD_DEVICE_ORDINAL};
static const uint32_t rel_written[] = {TD_FIELD_RELEASE_HANDLES};
#define N_WRITTEN(a) (sizeof(a) / sizeof(a)[0])

/* Whether every field of m outside written[] (and outside a oneof) is at its default,
 * which proto3 leaves out of the bytes. */
static int others_default(const ProtobufCMessage *m, const uint32_t *written, size_t n)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        size_t k = 0;
        while (k < n && written[k] != f->id)
            k++;
        if (k < n || (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        const char *base = (const char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            if (*(const size_t *)(const void *)(base + f->quantifier_offset))
                return 0;
            continue;
        }
        if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
            *(const protobuf_c_boolean *)(const void *)(base + f->quantifier_offset))
            return 0;
        const void *v = base + f->offset;
        switch (f->type) {
        case PROTOBUF_C_TYPE_STRING: {
            const char *str = *(char *const *)v;
            if (str && *str)
                return 0;
            break;
        }
        case PROTOBUF_C_TYPE_MESSAGE:
            if (*(void *const *)v)
                return 0;
            break;
        case PROTOBUF_C_TYPE_BYTES:
            if (((const ProtobufCBinaryData *)v)->len)
                return 0;
            break;
        default: { /* a scalar, 1 to 8 bytes: zero when unset */
            size_t size =
                f->type == PROTOBUF_C_TYPE_BOOL ? sizeof(protobuf_c_boolean)
                : f->type == PROTOBUF_C_TYPE_INT64 || f->type == PROTOBUF_C_TYPE_UINT64 ||
                        f->type == PROTOBUF_C_TYPE_SINT64 || f->type == PROTOBUF_C_TYPE_FIXED64 ||
                        f->type == PROTOBUF_C_TYPE_SFIXED64 || f->type == PROTOBUF_C_TYPE_DOUBLE
                    ? 8
                    : 4;
            static const unsigned char zero[8];
            if (memcmp(v, zero, size))
                return 0;
        }
        }
    }
    return 1;
}

/* others_default, only for a message with fields (outside a oneof) this file does not know:
 * nplain is a constant. */
#define KNOWN_ONLY(m, nplain, written)                                                             \
    ((nplain) <= N_WRITTEN(written) || others_default(&(m)->base, written, N_WRITTEN(written)))

static size_t device_len(const Tensordd__V1__Device *d, size_t *backend)
{
    *backend = d->backend ? strlen(d->backend) : 0;
    return (*backend ? ld(TD_KEY_LEN_DEVICE_BACKEND, *backend) : 0) +
           (d->ordinal ? TD_KEY_LEN_DEVICE_ORDINAL + td_pb_varint_len(d->ordinal) : 0);
}

/* Sizes the body into z->body; 0 when the request is not one this file encodes. */
static int body_len(const Tensordd__V1__Request *req, op_sizes *z)
{
    switch (req->body_case) {
    case TENSORDD__V1__REQUEST__BODY_OP: {
        const Tensordd__V1__Op *op = req->op;
        if (!op || op->n_attrs || op->base.n_unknown_fields ||
            !KNOWN_ONLY(op, TD_NPLAIN_OP, op_written))
            return 0;
        z->name = op->op ? strlen(op->op) : 0;
        z->in = packed_len(op->inputs, op->n_inputs);
        z->out = packed_len(op->outputs, op->n_outputs);
        size_t n = (z->name ? ld(TD_KEY_LEN_OP_OP, z->name) : 0) +
                   (op->n_inputs ? ld(TD_KEY_LEN_OP_INPUTS, z->in) : 0) +
                   (op->n_outputs ? ld(TD_KEY_LEN_OP_OUTPUTS, z->out) : 0);
        if (op->device) {
            if (op->device->base.n_unknown_fields ||
                !KNOWN_ONLY(op->device, TD_NPLAIN_DEVICE, dev_written))
                return 0;
            z->dev = device_len(op->device, &z->backend);
            n += ld(TD_KEY_LEN_OP_DEVICE, z->dev);
        }
        /* an enum is an int32: a negative one takes 10 bytes */
        if (op->dtype)
            n += TD_KEY_LEN_OP_DTYPE + td_pb_varint_len((uint64_t)(int64_t)(int32_t)op->dtype);
        if (op->requires_grad)
            n += TD_KEY_LEN_OP_REQUIRES_GRAD + 1;
        z->body = n;
        return 1;
    }
    case TENSORDD__V1__REQUEST__BODY_RELEASE: {
        const Tensordd__V1__Release *r = req->release;
        if (!r || r->base.n_unknown_fields || !KNOWN_ONLY(r, TD_NPLAIN_RELEASE, rel_written))
            return 0;
        z->in = packed_len(r->handles, r->n_handles);
        z->body = r->n_handles ? ld(TD_KEY_LEN_RELEASE_HANDLES, z->in) : 0;
        return 1;
    }
    case TENSORDD__V1__REQUEST__BODY_SYNC:
        z->body = 0;
        return req->sync && !req->sync->base.n_unknown_fields &&
               (TD_NPLAIN_SYNC == 0 || others_default(&req->sync->base, NULL, 0));
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
    if (req->base.n_unknown_fields || !KNOWN_ONLY(req, TD_NPLAIN_REQUEST, req_written) ||
        !body_len(req, z))
        return 0;
    size_t keylen = req->body_case == TENSORDD__V1__REQUEST__BODY_OP ? TD_KEY_LEN_REQUEST_OP
                    : req->body_case == TENSORDD__V1__REQUEST__BODY_RELEASE
                        ? TD_KEY_LEN_REQUEST_RELEASE
                        : TD_KEY_LEN_REQUEST_SYNC;
    return (req->id ? TD_KEY_LEN_REQUEST_ID + td_pb_varint_len(req->id) : 0) +
           (req->want_reply ? TD_KEY_LEN_REQUEST_WANT_REPLY + 1 : 0) + ld(keylen, z->body);
}

size_t td__request_fast_pack(const Tensordd__V1__Request *req, const td__req_sizes *zs,
                             uint8_t *out)
{
    const op_sizes *z = (const op_sizes *)zs->z;
    uint8_t *p = out;
    if (req->id) {
        p = td_pb_put_key(p, TD_KEY_REQUEST_ID);
        p = td_pb_put_varint(p, req->id);
    }
    if (req->want_reply) {
        p = td_pb_put_key(p, TD_KEY_REQUEST_WANT_REPLY);
        *p++ = 1;
    }
    switch (req->body_case) {
    case TENSORDD__V1__REQUEST__BODY_OP: {
        const Tensordd__V1__Op *op = req->op;
        p = td_pb_put_key(p, TD_KEY_REQUEST_OP);
        p = td_pb_put_varint(p, z->body);
        if (z->name) {
            p = td_pb_put_key(p, TD_KEY_OP_OP);
            p = td_pb_put_varint(p, z->name);
            memcpy(p, op->op, z->name);
            p += z->name;
        }
        p = put_packed(p, TD_KEY_OP_INPUTS, op->inputs, op->n_inputs, z->in);
        p = put_packed(p, TD_KEY_OP_OUTPUTS, op->outputs, op->n_outputs, z->out);
        if (op->device) {
            p = td_pb_put_key(p, TD_KEY_OP_DEVICE);
            p = td_pb_put_varint(p, z->dev);
            if (z->backend) {
                p = td_pb_put_key(p, TD_KEY_DEVICE_BACKEND);
                p = td_pb_put_varint(p, z->backend);
                memcpy(p, op->device->backend, z->backend);
                p += z->backend;
            }
            if (op->device->ordinal) {
                p = td_pb_put_key(p, TD_KEY_DEVICE_ORDINAL);
                p = td_pb_put_varint(p, op->device->ordinal);
            }
        }
        if (op->dtype) {
            p = td_pb_put_key(p, TD_KEY_OP_DTYPE);
            p = td_pb_put_varint(p, (uint64_t)(int64_t)(int32_t)op->dtype);
        }
        if (op->requires_grad) {
            p = td_pb_put_key(p, TD_KEY_OP_REQUIRES_GRAD);
            *p++ = 1;
        }
        break;
    }
    case TENSORDD__V1__REQUEST__BODY_RELEASE:
        p = td_pb_put_key(p, TD_KEY_REQUEST_RELEASE);
        p = td_pb_put_varint(p, z->body);
        p = put_packed(p, TD_KEY_RELEASE_HANDLES, req->release->handles, req->release->n_handles,
                       z->in);
        break;
    default: /* Sync */
        p = td_pb_put_key(p, TD_KEY_REQUEST_SYNC);
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
        if (key == TD_KEY_DEVICE_BACKEND   ? !td_pb_get_bytes(&r, &f)
            : key == TD_KEY_DEVICE_ORDINAL ? !td_pb_get_varint(&r, &v)
                                           : 1)
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
        case TD_KEY_TENSOR_INFO_HANDLE:
        case TD_KEY_TENSOR_INFO_DTYPE:
        case TD_KEY_TENSOR_INFO_SHAPE_UNPACKED: /* one element */
        case TD_KEY_TENSOR_INFO_REQUIRES_GRAD:
            if (!td_pb_get_varint(&r, &v))
                return 0;
            break;
        case TD_KEY_TENSOR_INFO_SHAPE: /* packed */
            if (!td_pb_get_bytes(&r, &f) || !varints(f))
                return 0;
            break;
        case TD_KEY_TENSOR_INFO_DEVICE:
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
        if (key == TD_KEY_RESPONSE_ID) {
            if (!td_pb_get_varint(&r, &v))
                return 0;
            *id = v;
        } else if (key == TD_KEY_RESPONSE_OK || key == TD_KEY_RESPONSE_TENSOR) {
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
