/* wirecodec.h -- the fast codec of the hot messages, both directions in one place: the
 * requests small calls send (Request{id, want_reply, op | release | sync | download}) and
 * the replies they get (Response{id, ok | tensor}). Plain C on plain structs (no protobuf-c,
 * no Python), header-only, so that the daemon (daemon/wire.c), libtensordd
 * (client/lib/wire.c) and the Python client's accelerator (_speedups.c) compile the same
 * code; each of them only moves its own objects into and out of these structs.
 *
 * The keys come from tensordd_keys.h, generated from proto/tensordd.proto. The encoders write
 * exactly the bytes protobuf writes for the same message (proto3: a field at its default
 * value is left out; repeated scalars packed; fields in number order). The decoders accept
 * only the plain forms named below, each field at most once; for anything else (another
 * body, a field they do not know -- one the .proto gained later, say --, bytes protobuf
 * would reject) they decline, and the caller leaves the message to protobuf(-c), whose
 * verdict stands. tests/unit/test_wire.c and tests/python/test_wire_codec.py hold them to
 * protobuf-c and protobuf on random messages of every type. */
#ifndef TD_WIRECODEC_H
#define TD_WIRECODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pbwire.h"
#include "tensordd_keys.h"

/* ---------------------------------------------------------------- messages */

/* Device{backend, ordinal} (inside an Op: present when has_device). */
typedef struct {
    const char *backend;
    size_t backend_len;
    uint32_t ordinal;
} td_wire_device;

/* Op{op, inputs, outputs, attrs, device, dtype, requires_grad}. The encoder writes attrs as
 * they are (Op.attrs fields, keys included, encoded by the caller); the decoder declines an Op
 * with attrs or a device (left to protobuf-c) and copies name (NUL-terminated) and the
 * handles into the caller's memory. */
typedef struct {
    const char *name;
    size_t name_len;
    const uint64_t *inputs, *outputs;
    size_t n_inputs, n_outputs;
    const uint8_t *attrs;
    size_t attrs_len;
    bool has_device;
    td_wire_device device;
    int32_t dtype; /* an enum: a negative one takes 10 bytes */
    bool requires_grad;
} td_wire_op;

/* A Request: body is the oneof's field number (TD_FIELD_REQUEST_OP, _RELEASE, _SYNC,
 * _DOWNLOAD; protobuf-c's body_case has the same values), 0 for none. The encoder reads id,
 * want_reply, body and that body's fields only (op, handles or handle). */
typedef struct {
    uint64_t id;
    bool want_reply;
    uint32_t body;
    td_wire_op op;           /* Op */
    const uint64_t *handles; /* Release.handles */
    size_t n_handles;
    uint64_t handle; /* Download.handle */
    /* td_wire_request_size's sizes, for td_wire_request_put */
    size_t z_in, z_out, z_dev, z_body;
} td_wire_request;

/* TensorInfo{handle, dtype, shape, device, requires_grad}: a reply's tensor. */
typedef struct {
    uint64_t handle;
    int32_t dtype;
    const int64_t *shape; /* encoder: ndim values; decoder: into the caller's shape_buf */
    int ndim;
    td_wire_device device;
    bool requires_grad;
} td_wire_tensor;

/* Where a decoder puts what it copies (the daemon's ProtobufCAllocator has this form). */
typedef struct {
    void *(*alloc)(void *data, size_t n);
    void *data;
} td_wire_alloc;

/* ---------------------------------------------------------------- encoding */

/* A length-delimited field's size: key + length + bytes. */
static inline size_t td_wire_ld(size_t keylen, size_t len)
{
    return keylen + td_pb_varint_len(len) + len;
}

static inline size_t td_wire_packed_len(const uint64_t *a, size_t n)
{
    size_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += td_pb_varint_len(a[i]);
    return s;
}

/* A packed repeated uint64 field (nothing when empty); len is td_wire_packed_len's. */
static inline uint8_t *td_wire_put_packed(uint8_t *p, uint32_t key, const uint64_t *a, size_t n,
                                          size_t len)
{
    if (!n)
        return p;
    p = td_pb_put_key(p, key);
    p = td_pb_put_varint(p, len);
    for (size_t i = 0; i < n; i++)
        p = td_pb_put_varint(p, a[i]);
    return p;
}

static inline uint8_t *td_wire_put_string(uint8_t *p, uint32_t key, const char *s, size_t n)
{
    if (!n)
        return p;
    p = td_pb_put_key(p, key);
    p = td_pb_put_varint(p, n);
    memcpy(p, s, n);
    return p + n;
}

static inline uint8_t *td_wire_put_uint(uint8_t *p, uint32_t key, uint64_t v)
{
    if (!v)
        return p;
    p = td_pb_put_key(p, key);
    return td_pb_put_varint(p, v);
}

static inline uint8_t *td_wire_put_bool(uint8_t *p, uint32_t key, bool v)
{
    if (!v)
        return p;
    p = td_pb_put_key(p, key);
    *p++ = 1;
    return p;
}

static inline size_t td_wire_uint_len(size_t keylen, uint64_t v)
{
    return v ? keylen + td_pb_varint_len(v) : 0;
}

static inline size_t td_wire_device_len(const td_wire_device *d)
{
    return (d->backend_len ? td_wire_ld(TD_KEY_LEN_DEVICE_BACKEND, d->backend_len) : 0) +
           td_wire_uint_len(TD_KEY_LEN_DEVICE_ORDINAL, d->ordinal);
}

static inline uint8_t *td_wire_put_device(uint8_t *p, uint32_t key, const td_wire_device *d,
                                          size_t len)
{
    p = td_pb_put_key(p, key);
    p = td_pb_put_varint(p, len);
    p = td_wire_put_string(p, TD_KEY_DEVICE_BACKEND, d->backend, d->backend_len);
    return td_wire_put_uint(p, TD_KEY_DEVICE_ORDINAL, d->ordinal);
}

/* The packed size of r, its sub-messages' sizes kept in r for td_wire_request_put; 0 when
 * r's body is not one this codec encodes. */
static inline size_t td_wire_request_size(td_wire_request *r)
{
    size_t keylen;
    switch (r->body) {
    case TD_FIELD_REQUEST_OP: {
        const td_wire_op *op = &r->op;
        r->z_in = td_wire_packed_len(op->inputs, op->n_inputs);
        r->z_out = td_wire_packed_len(op->outputs, op->n_outputs);
        r->z_body = (op->name_len ? td_wire_ld(TD_KEY_LEN_OP_OP, op->name_len) : 0) +
                    (op->n_inputs ? td_wire_ld(TD_KEY_LEN_OP_INPUTS, r->z_in) : 0) +
                    (op->n_outputs ? td_wire_ld(TD_KEY_LEN_OP_OUTPUTS, r->z_out) : 0) +
                    op->attrs_len +
                    td_wire_uint_len(TD_KEY_LEN_OP_DTYPE, (uint64_t)(int64_t)op->dtype) +
                    (op->requires_grad ? TD_KEY_LEN_OP_REQUIRES_GRAD + 1 : 0);
        if (op->has_device) {
            r->z_dev = td_wire_device_len(&op->device);
            r->z_body += td_wire_ld(TD_KEY_LEN_OP_DEVICE, r->z_dev);
        }
        keylen = TD_KEY_LEN_REQUEST_OP;
        break;
    }
    case TD_FIELD_REQUEST_RELEASE:
        r->z_in = td_wire_packed_len(r->handles, r->n_handles);
        r->z_body = r->n_handles ? td_wire_ld(TD_KEY_LEN_RELEASE_HANDLES, r->z_in) : 0;
        keylen = TD_KEY_LEN_REQUEST_RELEASE;
        break;
    case TD_FIELD_REQUEST_SYNC:
        r->z_body = 0;
        keylen = TD_KEY_LEN_REQUEST_SYNC;
        break;
    case TD_FIELD_REQUEST_DOWNLOAD:
        r->z_body = td_wire_uint_len(TD_KEY_LEN_DOWNLOAD_HANDLE, r->handle);
        keylen = TD_KEY_LEN_REQUEST_DOWNLOAD;
        break;
    default:
        return 0;
    }
    return td_wire_uint_len(TD_KEY_LEN_REQUEST_ID, r->id) +
           (r->want_reply ? TD_KEY_LEN_REQUEST_WANT_REPLY + 1 : 0) + td_wire_ld(keylen, r->z_body);
}

/* Writes r (sized by td_wire_request_size first); returns the end of what it wrote. */
static inline uint8_t *td_wire_request_put(uint8_t *p, const td_wire_request *r)
{
    p = td_wire_put_uint(p, TD_KEY_REQUEST_ID, r->id);
    p = td_wire_put_bool(p, TD_KEY_REQUEST_WANT_REPLY, r->want_reply);
    switch (r->body) {
    case TD_FIELD_REQUEST_OP: {
        const td_wire_op *op = &r->op;
        p = td_pb_put_key(p, TD_KEY_REQUEST_OP);
        p = td_pb_put_varint(p, r->z_body);
        p = td_wire_put_string(p, TD_KEY_OP_OP, op->name, op->name_len);
        p = td_wire_put_packed(p, TD_KEY_OP_INPUTS, op->inputs, op->n_inputs, r->z_in);
        p = td_wire_put_packed(p, TD_KEY_OP_OUTPUTS, op->outputs, op->n_outputs, r->z_out);
        if (op->attrs_len) {
            memcpy(p, op->attrs, op->attrs_len);
            p += op->attrs_len;
        }
        if (op->has_device)
            p = td_wire_put_device(p, TD_KEY_OP_DEVICE, &op->device, r->z_dev);
        p = td_wire_put_uint(p, TD_KEY_OP_DTYPE, (uint64_t)(int64_t)op->dtype);
        return td_wire_put_bool(p, TD_KEY_OP_REQUIRES_GRAD, op->requires_grad);
    }
    case TD_FIELD_REQUEST_RELEASE:
        p = td_pb_put_key(p, TD_KEY_REQUEST_RELEASE);
        p = td_pb_put_varint(p, r->z_body);
        return td_wire_put_packed(p, TD_KEY_RELEASE_HANDLES, r->handles, r->n_handles, r->z_in);
    case TD_FIELD_REQUEST_SYNC:
        p = td_pb_put_key(p, TD_KEY_REQUEST_SYNC);
        *p++ = 0;
        return p;
    case TD_FIELD_REQUEST_DOWNLOAD:
        p = td_pb_put_key(p, TD_KEY_REQUEST_DOWNLOAD);
        p = td_pb_put_varint(p, r->z_body);
        return td_wire_put_uint(p, TD_KEY_DOWNLOAD_HANDLE, r->handle);
    default:
        return p;
    }
}

/* The reply's shape field's size. */
static inline size_t td_wire_shape_len(const td_wire_tensor *t)
{
    size_t n = 0;
    for (int i = 0; i < t->ndim; i++)
        n += td_pb_varint_len((uint64_t)t->shape[i]);
    return n;
}

/* The largest reply td_wire_response_tensor writes for a backend name of backend_len bytes and
 * ndim dimensions. */
#define TD_WIRE_TENSOR_MAX(backend_len, ndim) (64 + (backend_len) + 10 * (size_t)(ndim))

/* Response{id, ok {}}; returns the end of what it wrote (at most 13 bytes). */
static inline uint8_t *td_wire_response_ok(uint8_t *p, uint64_t id)
{
    p = td_wire_put_uint(p, TD_KEY_RESPONSE_ID, id);
    p = td_pb_put_key(p, TD_KEY_RESPONSE_OK);
    *p++ = 0;
    return p;
}

/* Response{id, tensor: TensorInfo{...}} (the device always present, as the daemon sends it);
 * returns the end of what it wrote (at most TD_WIRE_TENSOR_MAX). */
static inline uint8_t *td_wire_response_tensor(uint8_t *p, uint64_t id, const td_wire_tensor *t)
{
    size_t dlen = td_wire_device_len(&t->device), slen = td_wire_shape_len(t);
    uint64_t dtype = (uint64_t)(int64_t)t->dtype;
    size_t tlen = td_wire_uint_len(TD_KEY_LEN_TENSOR_INFO_HANDLE, t->handle) +
                  td_wire_uint_len(TD_KEY_LEN_TENSOR_INFO_DTYPE, dtype) +
                  (slen ? td_wire_ld(TD_KEY_LEN_TENSOR_INFO_SHAPE, slen) : 0) +
                  td_wire_ld(TD_KEY_LEN_TENSOR_INFO_DEVICE, dlen) +
                  (t->requires_grad ? TD_KEY_LEN_TENSOR_INFO_REQUIRES_GRAD + 1 : 0);
    p = td_wire_put_uint(p, TD_KEY_RESPONSE_ID, id);
    p = td_pb_put_key(p, TD_KEY_RESPONSE_TENSOR);
    p = td_pb_put_varint(p, tlen);
    p = td_wire_put_uint(p, TD_KEY_TENSOR_INFO_HANDLE, t->handle);
    p = td_wire_put_uint(p, TD_KEY_TENSOR_INFO_DTYPE, dtype);
    if (slen) {
        p = td_pb_put_key(p, TD_KEY_TENSOR_INFO_SHAPE);
        p = td_pb_put_varint(p, slen);
        for (int i = 0; i < t->ndim; i++)
            p = td_pb_put_varint(p, (uint64_t)t->shape[i]);
    }
    p = td_wire_put_device(p, TD_KEY_TENSOR_INFO_DEVICE, &t->device, dlen);
    return td_wire_put_bool(p, TD_KEY_TENSOR_INFO_REQUIRES_GRAD, t->requires_grad);
}

/* ---------------------------------------------------------------- decoding */

/* A field seen once more than protobuf allows this codec (a bit per field number < 64). */
static inline bool td_wire_seen(uint64_t *seen, uint64_t key)
{
    uint64_t bit = (uint64_t)1 << ((key >> 3) & 63);
    if (*seen & bit)
        return true;
    *seen |= bit;
    return false;
}

/* An int32 (an enum): a negative one is sign-extended to 64 bits on the wire (10 bytes); a
 * value between is not one protobuf writes, and is left to it. */
static inline bool td_wire_int32(uint64_t v, int32_t *out)
{
    if (v > INT32_MAX && v < (uint64_t)(int64_t)INT32_MIN)
        return false;
    *out = (int32_t)(int64_t)v;
    return true;
}

/* A non-empty packed repeated uint64 field, copied into al's memory. */
static inline bool td_wire_get_packed(const td_pb_reader *f, const td_wire_alloc *al, size_t *n_out,
                                      const uint64_t **out)
{
    size_t n = 0;
    for (const uint8_t *q = f->p; q < f->end; q++)
        n += *q < 0x80;
    if (!n || f->end[-1] >= 0x80)
        return false;
    uint64_t *a = al->alloc(al->data, n * sizeof *a);
    if (!a)
        return false;
    td_pb_reader r = *f;
    for (size_t i = 0; i < n; i++)
        if (!td_pb_get_varint(&r, &a[i]))
            return false;
    if (r.p != r.end)
        return false;
    *n_out = n;
    *out = a;
    return true;
}

/* An Op with every field at its default. */
static inline void td_wire_op_clear(td_wire_op *op)
{
    op->name = NULL;
    op->name_len = 0;
    op->inputs = op->outputs = NULL;
    op->n_inputs = op->n_outputs = 0;
    op->attrs = NULL;
    op->attrs_len = 0;
    op->has_device = false;
    op->device.backend = NULL;
    op->device.backend_len = 0;
    op->device.ordinal = 0;
    op->dtype = 0;
    op->requires_grad = false;
}

/* Op{op (non-empty), inputs, outputs, dtype, requires_grad}: no attrs, no device. */
static inline bool td_wire_get_op(td_pb_reader r, const td_wire_alloc *al, td_wire_op *op)
{
    uint64_t seen = 0;
    while (r.p < r.end) {
        uint64_t key, v;
        td_pb_reader f;
        if (!td_pb_get_key(&r, &key) || key > 0xff || td_wire_seen(&seen, key))
            return false;
        switch (key) {
        case TD_KEY_OP_OP: {
            if (!td_pb_get_bytes(&r, &f) || f.p == f.end)
                return false;
            size_t n = (size_t)(f.end - f.p);
            char *s = al->alloc(al->data, n + 1);
            if (!s)
                return false;
            memcpy(s, f.p, n);
            s[n] = 0;
            op->name = s;
            op->name_len = n;
            break;
        }
        case TD_KEY_OP_INPUTS:
            if (!td_pb_get_bytes(&r, &f) || !td_wire_get_packed(&f, al, &op->n_inputs, &op->inputs))
                return false;
            break;
        case TD_KEY_OP_OUTPUTS:
            if (!td_pb_get_bytes(&r, &f) ||
                !td_wire_get_packed(&f, al, &op->n_outputs, &op->outputs))
                return false;
            break;
        case TD_KEY_OP_DTYPE:
            if (!td_pb_get_varint(&r, &v) || !td_wire_int32(v, &op->dtype))
                return false;
            break;
        case TD_KEY_OP_REQUIRES_GRAD:
            if (!td_pb_get_varint(&r, &v) || v > 1)
                return false;
            op->requires_grad = v != 0;
            break;
        default: /* attrs, device, anything else: protobuf's decoder */
            return false;
        }
    }
    return true;
}

/* Request{id, want_reply, op (td_wire_get_op's) | release{handles (non-empty)} | sync{}} into
 * *r (id, want_reply, body, op, handles); false for anything else. (Fields are set one by one:
 * zeroing the whole struct costs a string store that took as long as decoding the message.) */
static inline bool td_wire_request_get(const uint8_t *msg, size_t len, const td_wire_alloc *al,
                                       td_wire_request *r)
{
    td_pb_reader m = {msg, msg + len};
    r->id = 0;
    r->want_reply = false;
    r->body = 0;
    td_wire_op_clear(&r->op);
    r->handles = NULL;
    r->n_handles = 0;
    uint64_t seen = 0;
    while (m.p < m.end) {
        uint64_t key, v;
        td_pb_reader f, h;
        if (!td_pb_get_key(&m, &key))
            return false;
        switch (key) {
        case TD_KEY_REQUEST_ID:
            if (td_wire_seen(&seen, key) || !td_pb_get_varint(&m, &v))
                return false;
            r->id = v;
            break;
        case TD_KEY_REQUEST_WANT_REPLY:
            if (td_wire_seen(&seen, key) || !td_pb_get_varint(&m, &v) || v > 1)
                return false;
            r->want_reply = v != 0;
            break;
        case TD_KEY_REQUEST_OP:
            if (r->body || !td_pb_get_bytes(&m, &f) || !td_wire_get_op(f, al, &r->op))
                return false;
            r->body = TD_FIELD_REQUEST_OP;
            break;
        case TD_KEY_REQUEST_RELEASE:
            if (r->body || !td_pb_get_bytes(&m, &f) || !td_pb_get_key(&f, &key) ||
                key != TD_KEY_RELEASE_HANDLES || !td_pb_get_bytes(&f, &h) || f.p != f.end ||
                !td_wire_get_packed(&h, al, &r->n_handles, &r->handles))
                return false;
            r->body = TD_FIELD_REQUEST_RELEASE;
            break;
        case TD_KEY_REQUEST_SYNC:
            if (r->body || !td_pb_get_bytes(&m, &f) || f.p != f.end)
                return false;
            r->body = TD_FIELD_REQUEST_SYNC;
            break;
        default: /* any other field: protobuf's decoder */
            return false;
        }
    }
    return true;
}

/* Device{backend, ordinal}: backend points into the message (not checked as UTF-8). */
static inline bool td_wire_get_device(td_pb_reader r, td_wire_device *d)
{
    uint64_t seen = 0;
    while (r.p < r.end) {
        uint64_t key, v;
        td_pb_reader f;
        if (!td_pb_get_key(&r, &key) || td_wire_seen(&seen, key))
            return false;
        if (key == TD_KEY_DEVICE_BACKEND) {
            if (!td_pb_get_bytes(&r, &f))
                return false;
            d->backend = (const char *)f.p;
            d->backend_len = (size_t)(f.end - f.p);
        } else if (key == TD_KEY_DEVICE_ORDINAL) {
            if (!td_pb_get_varint(&r, &v))
                return false;
            d->ordinal = (uint32_t)v; /* uint32: protobuf keeps the low 32 bits */
        } else {
            return false;
        }
    }
    return true;
}

/* One shape value: kept while there is room (max_dims < 0: counted only, no limit). */
static inline bool td_wire_shape_add(td_wire_tensor *t, int64_t *buf, int max_dims, uint64_t v)
{
    if (max_dims >= 0) {
        if (t->ndim == max_dims)
            return false;
        buf[t->ndim] = (int64_t)v;
    }
    t->ndim++;
    return true;
}

/* TensorInfo{handle, dtype, shape (packed or not), device, requires_grad}. */
static inline bool td_wire_get_tensor(td_pb_reader r, td_wire_tensor *t, int64_t *shape_buf,
                                      int max_dims)
{
    uint64_t seen = 0;
    t->handle = 0;
    t->dtype = 0;
    t->shape = shape_buf;
    t->ndim = 0;
    t->device.backend = "";
    t->device.backend_len = 0;
    t->device.ordinal = 0;
    t->requires_grad = false;
    while (r.p < r.end) {
        uint64_t key, v;
        td_pb_reader f;
        if (!td_pb_get_key(&r, &key))
            return false;
        switch (key) {
        case TD_KEY_TENSOR_INFO_HANDLE:
        case TD_KEY_TENSOR_INFO_DTYPE:
        case TD_KEY_TENSOR_INFO_REQUIRES_GRAD:
            if (td_wire_seen(&seen, key) || !td_pb_get_varint(&r, &v))
                return false;
            if (key == TD_KEY_TENSOR_INFO_HANDLE) {
                t->handle = v;
            } else if (key == TD_KEY_TENSOR_INFO_DTYPE) {
                if (!td_wire_int32(v, &t->dtype))
                    return false;
            } else {
                t->requires_grad = v != 0;
            }
            break;
        case TD_KEY_TENSOR_INFO_SHAPE_UNPACKED: /* one value */
            if (!td_pb_get_varint(&r, &v) || !td_wire_shape_add(t, shape_buf, max_dims, v))
                return false;
            break;
        case TD_KEY_TENSOR_INFO_SHAPE: /* packed values */
            if (!td_pb_get_bytes(&r, &f))
                return false;
            while (f.p < f.end)
                if (!td_pb_get_varint(&f, &v) || !td_wire_shape_add(t, shape_buf, max_dims, v))
                    return false;
            break;
        case TD_KEY_TENSOR_INFO_DEVICE:
            if (td_wire_seen(&seen, key) || !td_pb_get_bytes(&r, &f) ||
                !td_wire_get_device(f, &t->device))
                return false;
            break;
        default:
            return false;
        }
    }
    return true;
}

/* Response{id, ok {} | tensor TensorInfo}: the body's field number (TD_FIELD_RESPONSE_OK or
 * _TENSOR; protobuf-c's body_case), id and, for a tensor, *t (every field set; its shape in
 * shape_buf, at most max_dims values, or only counted when max_dims < 0); 0 for anything
 * else (an Error above all), which must be decoded by protobuf. */
static inline uint32_t td_wire_response_get(const uint8_t *msg, size_t len, uint64_t *id,
                                            td_wire_tensor *t, int64_t *shape_buf, int max_dims)
{
    td_pb_reader m = {msg, msg + len}, body = {NULL, NULL};
    uint32_t which = 0;
    uint64_t seen = 0;
    *id = 0;
    while (m.p < m.end) {
        uint64_t key;
        if (!td_pb_get_key(&m, &key))
            return 0;
        if (key == TD_KEY_RESPONSE_ID) {
            if (td_wire_seen(&seen, key) || !td_pb_get_varint(&m, id))
                return 0;
        } else if (key == TD_KEY_RESPONSE_OK || key == TD_KEY_RESPONSE_TENSOR) {
            if (which || !td_pb_get_bytes(&m, &body))
                return 0;
            which = (uint32_t)(key >> 3);
        } else {
            return 0; /* an error, another body, an unknown field */
        }
    }
    if (which == TD_FIELD_RESPONSE_OK)
        return body.p == body.end ? which : 0;
    if (which == TD_FIELD_RESPONSE_TENSOR)
        return td_wire_get_tensor(body, t, shape_buf, max_dims) ? which : 0;
    return 0;
}

#endif
