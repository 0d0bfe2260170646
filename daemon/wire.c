/* wire.c -- the one place where a td_error becomes a protobuf Error. */
#include <stdio.h>
#include <string.h>

#include "wire.h"

#include "conn.h"

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
    snprintf(buf, len, "%s", d->backend);
    out->backend = buf;
    out->ordinal = d->ordinal;
}

Tensordd__V1__Error *tdd_wire_error_fill(tdd_wire_error *w, const td_error *err,
                                         uint64_t request_id)
{
    Tensordd__V1__Error *e = &w->e;
    tensordd__v1__error__init(e);
    e->code = (Tensordd__V1__ErrorCode)(-err->code);
    snprintf(w->msg, sizeof w->msg, "%s", err->message[0] ? err->message : td_strerror(err->code));
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
        snprintf(w->res, sizeof w->res, "%s", err->detail.resource.resource);
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
        snprintf(w->arg, sizeof w->arg, "%s", err->detail.argument.argument);
        w->ia.argument = w->arg;
        e->detail_case = TENSORDD__V1__ERROR__DETAIL_INVALID_ARGUMENT;
        e->invalid_argument = &w->ia;
        break;
    }
    return e;
}

/* ---------------------------------------------------------------- small replies */

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Response field numbers (proto/tensordd.proto) as keys: (field << 3) | wire type. */
#define KEY_RESPONSE_ID 0x08     /* 1, varint */
#define KEY_RESPONSE_OK 0x5a     /* 11, length-delimited */
#define KEY_RESPONSE_TENSOR 0x72 /* 14, length-delimited */
#define KEY_TI_HANDLE 0x08       /* TensorInfo.handle = 1 */
#define KEY_TI_DTYPE 0x10        /* TensorInfo.dtype = 2 */
#define KEY_TI_SHAPE 0x1a        /* TensorInfo.shape = 3, packed */
#define KEY_TI_DEVICE 0x22       /* TensorInfo.device = 4 */
#define KEY_TI_REQUIRES_GRAD 0x28
#define KEY_DEV_BACKEND 0x0a /* Device.backend = 1 */
#define KEY_DEV_ORDINAL 0x10 /* Device.ordinal = 2 */

static uint8_t *put_id(uint8_t *p, uint64_t id)
{
    if (!id)
        return p;
    *p++ = KEY_RESPONSE_ID;
    return put_varint(p, id);
}

size_t tdd_wire_ok(uint8_t *out, uint64_t id)
{
    uint8_t *p = put_id(out, id);
    *p++ = KEY_RESPONSE_OK;
    *p++ = 0;
    return (size_t)(p - out);
}

size_t tdd_wire_tensor(uint8_t *out, uint64_t id, const tdd_value *v)
{
    /* The device, as tdd_wire_device writes it: the backend name cut to 15 bytes. */
    const char *be = v->dev->be->name;
    size_t blen = strnlen(be, 15);
    uint32_t ordinal = (uint32_t)v->dev->ordinal;
    size_t dlen = (blen ? 1 + 1 + blen : 0) + (ordinal ? 1 + varint_len(ordinal) : 0);

    int ndim = v->t.ndim < 0 ? 0 : v->t.ndim > TD_MAX_NDIM ? TD_MAX_NDIM : v->t.ndim;
    size_t slen = 0;
    for (int i = 0; i < ndim; i++)
        slen += varint_len((uint64_t)v->t.shape[i]);
    int64_t dtype = (int64_t)v->t.dtype; /* an enum: negative values take 10 bytes */

    size_t tlen = (v->handle ? 1 + varint_len(v->handle) : 0) +
                  (dtype ? 1 + varint_len((uint64_t)dtype) : 0) +
                  (slen ? 1 + varint_len(slen) + slen : 0) + 1 + varint_len(dlen) + dlen +
                  (v->requires_grad ? 2 : 0);

    uint8_t *p = put_id(out, id);
    *p++ = KEY_RESPONSE_TENSOR;
    p = put_varint(p, tlen);
    if (v->handle) {
        *p++ = KEY_TI_HANDLE;
        p = put_varint(p, v->handle);
    }
    if (dtype) {
        *p++ = KEY_TI_DTYPE;
        p = put_varint(p, (uint64_t)dtype);
    }
    if (slen) {
        *p++ = KEY_TI_SHAPE;
        p = put_varint(p, slen);
        for (int i = 0; i < ndim; i++)
            p = put_varint(p, (uint64_t)v->t.shape[i]);
    }
    *p++ = KEY_TI_DEVICE;
    p = put_varint(p, dlen);
    if (blen) {
        *p++ = KEY_DEV_BACKEND;
        *p++ = (uint8_t)blen;
        memcpy(p, be, blen);
        p += blen;
    }
    if (ordinal) {
        *p++ = KEY_DEV_ORDINAL;
        p = put_varint(p, ordinal);
    }
    if (v->requires_grad) {
        *p++ = KEY_TI_REQUIRES_GRAD;
        *p++ = 1;
    }
    return (size_t)(p - out);
}
