/* wire.c -- the one place where a td_error becomes a protobuf Error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#include "pbwire.h"
#include "tensordd_keys.h"
#include "utf8.h"

void tdd_wire_device(Tensordd__V1__Device *out, char *backend_buf, size_t len, const tdd_device *d)
{
    tensordd__v1__device__init(out);
    snprintf(backend_buf, len, "%s", d->be->name);
    out->backend = backend_buf;
    out->ordinal = (uint32_t)d->ordinal;
}

static void wire_td_device(Tensordd__V1__Device *out, char *buf, size_t len, const td_device *d)
{
    tensordd__v1__device__init(out);
    td_utf8_copy(buf, len, d->backend);
    out->backend = buf;
    out->ordinal = d->ordinal;
}

Tensordd__V1__Error *tdd_wire_error_fill(tdd_wire_error *w, const td_error *err,
                                         uint64_t request_id)
{
    Tensordd__V1__Error *e = &w->e;
    tensordd__v1__error__init(e);
    e->code = (Tensordd__V1__ErrorCode)(-err->code);
    /* Messages quote what the client sent (an op's name, an attribute): cut on a
     * character, never inside one, and with invalid bytes replaced. */
    td_utf8_copy(w->msg, sizeof w->msg, err->message[0] ? err->message : td_strerror(err->code));
    e->message = w->msg;
    e->request_id = err->request_id ? err->request_id : request_id;
    switch (err->detail_kind) {
    case TD_DETAIL_NONE:
        break;
    case TD_DETAIL_DEVICES:
        tensordd__v1__device_mismatch__init(&w->dm);
        wire_td_device(&w->d[0], w->b0, sizeof w->b0, &err->detail.devices.target);
        wire_td_device(&w->d[1], w->b1, sizeof w->b1, &err->detail.devices.grad);
        w->dm.target = &w->d[0];
        w->dm.grad = &w->d[1];
        w->dm.target_index = err->detail.devices.target_index;
        w->dm.grad_index = err->detail.devices.grad_index;
        if (err->code == TD_EBACKEND_MISMATCH) {
            e->detail_case = TENSORDD__V1__ERROR__DETAIL_BACKEND_MISMATCH;
            e->backend_mismatch = &w->dm;
        } else {
            e->detail_case = TENSORDD__V1__ERROR__DETAIL_DEVICE_MISMATCH;
            e->device_mismatch = &w->dm;
        }
        break;
    case TD_DETAIL_DTYPES:
        tensordd__v1__dtype_mismatch__init(&w->dtm);
        w->dtm.target = (Tensordd__V1__DType)err->detail.dtypes.target;
        w->dtm.grad = (Tensordd__V1__DType)err->detail.dtypes.grad;
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_DTYPE_MISMATCH;
        e->dtype_mismatch = &w->dtm;
        break;
    case TD_DETAIL_SHAPES: {
        tensordd__v1__shape_mismatch__init(&w->sm);
        int en = err->detail.shapes.expected_ndim, gn = err->detail.shapes.got_ndim;
        en = en < 0 ? 0 : en > TD_MAX_NDIM ? TD_MAX_NDIM : en;
        gn = gn < 0 ? 0 : gn > TD_MAX_NDIM ? TD_MAX_NDIM : gn;
        memcpy(w->shapes[0], err->detail.shapes.expected, (size_t)en * sizeof(int64_t));
        memcpy(w->shapes[1], err->detail.shapes.got, (size_t)gn * sizeof(int64_t));
        w->sm.n_expected = (size_t)en;
        w->sm.expected = w->shapes[0];
        w->sm.n_got = (size_t)gn;
        w->sm.got = w->shapes[1];
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_SHAPE_MISMATCH;
        e->shape_mismatch = &w->sm;
        break;
    }
    case TD_DETAIL_HANDLE:
        tensordd__v1__unknown_handle__init(&w->uh);
        w->uh.handle = err->detail.handle.handle;
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_UNKNOWN_HANDLE;
        e->unknown_handle = &w->uh;
        break;
    case TD_DETAIL_HANDLE_KIND:
        tensordd__v1__wrong_handle_kind__init(&w->whk);
        w->whk.handle = err->detail.handle_kind.handle;
        w->whk.expected = (Tensordd__V1__HandleKind)err->detail.handle_kind.expected;
        w->whk.got = (Tensordd__V1__HandleKind)err->detail.handle_kind.got;
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_WRONG_HANDLE_KIND;
        e->wrong_handle_kind = &w->whk;
        break;
    case TD_DETAIL_POISONED:
        tensordd__v1__poisoned__init(&w->po);
        w->po.handle = err->detail.poisoned.handle;
        w->po.origin_request = err->detail.poisoned.origin_request;
        w->po.origin_code = (Tensordd__V1__ErrorCode)(-err->detail.poisoned.origin_code);
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_POISONED;
        e->poisoned = &w->po;
        break;
    case TD_DETAIL_RESOURCE:
        tensordd__v1__resource_exhausted__init(&w->re);
        td_utf8_copy(w->res, sizeof w->res, err->detail.resource.resource);
        w->re.resource = w->res;
        w->re.requested = err->detail.resource.requested;
        w->re.available = err->detail.resource.available;
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_RESOURCE_EXHAUSTED;
        e->resource_exhausted = &w->re;
        break;
    case TD_DETAIL_VERSION:
        tensordd__v1__version_mismatch__init(&w->vm);
        w->vm.server_min = err->detail.version.server_min;
        w->vm.server_max = err->detail.version.server_max;
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_VERSION_MISMATCH;
        e->version_mismatch = &w->vm;
        break;
    case TD_DETAIL_ARGUMENT:
        tensordd__v1__invalid_argument__init(&w->ia);
        td_utf8_copy(w->arg, sizeof w->arg, err->detail.argument.argument);
        w->ia.argument = w->arg;
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_INVALID_ARGUMENT;
        e->invalid_argument = &w->ia;
        break;
    }
    return e;
}

uint8_t *tdd_wire_error_packed(uint64_t id, const td_error *err, size_t *n)
{
    tdd_wire_error w;
    Tensordd__V1__Response r = TENSORDD__V1__RESPONSE__INIT;
    r.id = id;
    r.body_case = TENSORDD__V1__RESPONSE__BODY_ERROR;
    r.error = tdd_wire_error_fill(&w, err, id);
    *n = protobuf_c_message_get_packed_size(&r.base);
    uint8_t *msg = malloc(*n ? *n : 1);
    if (msg)
        protobuf_c_message_pack(&r.base, msg);
    return msg;
}

/* ---------------------------------------------------------------- small replies */

static uint8_t *put_id(uint8_t *p, uint64_t id)
{
    if (!id)
        return p;
    p = td_pb_put_key(p, TD_KEY_RESPONSE_ID);
    return td_pb_put_varint(p, id);
}

size_t tdd_wire_ok(uint8_t *out, uint64_t id)
{
    uint8_t *p = put_id(out, id);
    p = td_pb_put_key(p, TD_KEY_RESPONSE_OK);
    *p++ = 0;
    return (size_t)(p - out);
}

size_t tdd_wire_tensor(uint8_t *out, uint64_t id, const tdd_value *v)
{
    /* The device, as tdd_wire_device writes it: the backend name cut to 15 bytes. */
    const char *be = v->dev->be->name;
    size_t blen = strnlen(be, 15);
    uint32_t ordinal = (uint32_t)v->dev->ordinal;
    size_t dlen = (blen ? TD_KEY_LEN_DEVICE_BACKEND + 1 + blen : 0) +
                  (ordinal ? TD_KEY_LEN_DEVICE_ORDINAL + td_pb_varint_len(ordinal) : 0);

    int ndim = v->t.ndim < 0 ? 0 : v->t.ndim > TD_MAX_NDIM ? TD_MAX_NDIM : v->t.ndim;
    size_t slen = 0;
    for (int i = 0; i < ndim; i++)
        slen += td_pb_varint_len((uint64_t)v->t.shape[i]);
    int64_t dtype = (int32_t)v->t.dtype; /* an enum: negative values take 10 bytes */

    size_t tlen = (v->handle ? TD_KEY_LEN_TENSOR_INFO_HANDLE + td_pb_varint_len(v->handle) : 0) +
                  (dtype ? TD_KEY_LEN_TENSOR_INFO_DTYPE + td_pb_varint_len((uint64_t)dtype) : 0) +
                  (slen ? TD_KEY_LEN_TENSOR_INFO_SHAPE + td_pb_varint_len(slen) + slen : 0) +
                  TD_KEY_LEN_TENSOR_INFO_DEVICE + td_pb_varint_len(dlen) + dlen +
                  (v->requires_grad ? TD_KEY_LEN_TENSOR_INFO_REQUIRES_GRAD + 1 : 0);

    uint8_t *p = put_id(out, id);
    p = td_pb_put_key(p, TD_KEY_RESPONSE_TENSOR);
    p = td_pb_put_varint(p, tlen);
    if (v->handle) {
        p = td_pb_put_key(p, TD_KEY_TENSOR_INFO_HANDLE);
        p = td_pb_put_varint(p, v->handle);
    }
    if (dtype) {
        p = td_pb_put_key(p, TD_KEY_TENSOR_INFO_DTYPE);
        p = td_pb_put_varint(p, (uint64_t)dtype);
    }
    if (slen) {
        p = td_pb_put_key(p, TD_KEY_TENSOR_INFO_SHAPE);
        p = td_pb_put_varint(p, slen);
        for (int i = 0; i < ndim; i++)
            p = td_pb_put_varint(p, (uint64_t)v->t.shape[i]);
    }
    p = td_pb_put_key(p, TD_KEY_TENSOR_INFO_DEVICE);
    p = td_pb_put_varint(p, dlen);
    if (blen) {
        p = td_pb_put_key(p, TD_KEY_DEVICE_BACKEND);
        *p++ = (uint8_t)blen;
        memcpy(p, be, blen);
        p += blen;
    }
    if (ordinal) {
        p = td_pb_put_key(p, TD_KEY_DEVICE_ORDINAL);
        p = td_pb_put_varint(p, ordinal);
    }
    if (v->requires_grad) {
        p = td_pb_put_key(p, TD_KEY_TENSOR_INFO_REQUIRES_GRAD);
        *p++ = 1;
    }
    return (size_t)(p - out);
}

/* ---------------------------------------------------------------- small requests */

/* A non-empty packed repeated uint64 field (uint64_t array from al). */
static bool get_packed_u64(const td_pb_reader *f, ProtobufCAllocator *al, size_t *n_out,
                           uint64_t **out)
{
    size_t n = 0;
    for (const uint8_t *q = f->p; q < f->end; q++)
        n += *q < 0x80;
    if (!n || f->end[-1] >= 0x80)
        return false;
    uint64_t *a = al->alloc(al->allocator_data, n * sizeof *a);
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

static bool decode_op(td_pb_reader r, ProtobufCAllocator *al, Tensordd__V1__Op **out)
{
    Tensordd__V1__Op *op = al->alloc(al->allocator_data, sizeof *op);
    if (!op)
        return false;
    tensordd__v1__op__init(op);
    unsigned seen = 0;
    while (r.p < r.end) {
        uint64_t key, v;
        td_pb_reader f;
        if (!td_pb_get_key(&r, &key) || key > 0xff || (seen & (1u << (key >> 3))))
            return false;
        seen |= 1u << (key >> 3);
        switch (key) {
        case TD_KEY_OP_OP: {
            if (!td_pb_get_bytes(&r, &f) || f.p == f.end)
                return false;
            size_t n = (size_t)(f.end - f.p);
            char *s = al->alloc(al->allocator_data, n + 1);
            if (!s)
                return false;
            memcpy(s, f.p, n);
            s[n] = 0;
            op->op = s;
            break;
        }
        case TD_KEY_OP_INPUTS:
            if (!td_pb_get_bytes(&r, &f) || !get_packed_u64(&f, al, &op->n_inputs, &op->inputs))
                return false;
            break;
        case TD_KEY_OP_OUTPUTS:
            if (!td_pb_get_bytes(&r, &f) || !get_packed_u64(&f, al, &op->n_outputs, &op->outputs))
                return false;
            break;
        case TD_KEY_OP_DTYPE:
            if (!td_pb_get_varint(&r, &v) || v > INT32_MAX)
                return false;
            op->dtype = (Tensordd__V1__DType)v;
            break;
        case TD_KEY_OP_REQUIRES_GRAD:
            if (!td_pb_get_varint(&r, &v) || v > 1)
                return false;
            op->requires_grad = (protobuf_c_boolean)v;
            break;
        default: /* attrs, device, anything else: protobuf-c's decoder */
            return false;
        }
    }
    *out = op;
    return true;
}

Tensordd__V1__Request *tdd_wire_request_fast(const uint8_t *msg, size_t len, ProtobufCAllocator *al)
{
    td_pb_reader r = {msg, msg + len};
    Tensordd__V1__Request *req = al->alloc(al->allocator_data, sizeof *req);
    if (!req)
        return NULL;
    tensordd__v1__request__init(req);
    bool has_id = false, has_want = false;
    while (r.p < r.end) {
        uint64_t key, v;
        td_pb_reader f;
        if (!td_pb_get_key(&r, &key))
            return NULL;
        switch (key) {
        case TD_KEY_REQUEST_ID:
            if (has_id || !td_pb_get_varint(&r, &v))
                return NULL;
            req->id = v;
            has_id = true;
            break;
        case TD_KEY_REQUEST_WANT_REPLY:
            if (has_want || !td_pb_get_varint(&r, &v) || v > 1)
                return NULL;
            req->want_reply = (protobuf_c_boolean)v;
            has_want = true;
            break;
        case TD_KEY_REQUEST_OP:
            if (req->body_case || !td_pb_get_bytes(&r, &f) || !decode_op(f, al, &req->op))
                return NULL;
            req->body_case = TENSORDD__V1__REQUEST__BODY_OP;
            break;
        case TD_KEY_REQUEST_RELEASE: {
            if (req->body_case || !td_pb_get_bytes(&r, &f))
                return NULL;
            Tensordd__V1__Release *rl = al->alloc(al->allocator_data, sizeof *rl);
            if (!rl)
                return NULL;
            tensordd__v1__release__init(rl);
            td_pb_reader h;
            if (!td_pb_get_key(&f, &key) || key != TD_KEY_RELEASE_HANDLES ||
                !td_pb_get_bytes(&f, &h) || f.p != f.end ||
                !get_packed_u64(&h, al, &rl->n_handles, &rl->handles))
                return NULL;
            req->release = rl;
            req->body_case = TENSORDD__V1__REQUEST__BODY_RELEASE;
            break;
        }
        case TD_KEY_REQUEST_SYNC: {
            if (req->body_case || !td_pb_get_bytes(&r, &f) || f.p != f.end)
                return NULL;
            Tensordd__V1__Sync *sy = al->alloc(al->allocator_data, sizeof *sy);
            if (!sy)
                return NULL;
            tensordd__v1__sync__init(sy);
            req->sync = sy;
            req->body_case = TENSORDD__V1__REQUEST__BODY_SYNC;
            break;
        }
        default: /* any other field: protobuf-c's decoder */
            return NULL;
        }
    }
    return req;
}
