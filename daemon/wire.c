/* wire.c -- the one place where a td_error becomes a protobuf Error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#include "utf8.h"
#include "wirecodec.h"

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

/* The codec itself is proto/wirecodec.h's, shared with libtensordd and the Python client;
 * here the daemon's objects go into and out of its structs. */

size_t tdd_wire_ok(uint8_t *out, uint64_t id)
{
    return (size_t)(td_wire_response_ok(out, id) - out);
}

size_t tdd_wire_tensor(uint8_t *out, uint64_t id, const tdd_value *v)
{
    /* The device, as tdd_wire_device writes it: the backend name cut to 15 bytes. */
    const char *be = v->dev->be->name;
    td_wire_tensor t = {
        .handle = v->handle,
        .dtype = (int32_t)v->t.dtype,
        .shape = v->t.shape,
        .ndim = v->t.ndim < 0             ? 0
                : v->t.ndim > TD_MAX_NDIM ? TD_MAX_NDIM
                                          : v->t.ndim,
        .device = {.backend = be,
                   .backend_len = strnlen(be, 15),
                   .ordinal = (uint32_t)v->dev->ordinal},
        .requires_grad = v->requires_grad,
    };
    _Static_assert(TD_WIRE_TENSOR_MAX(15, TD_MAX_NDIM) <= TDD_WIRE_SMALL_MAX,
                   "TDD_WIRE_SMALL_MAX too small for a TensorInfo");
    return (size_t)(td_wire_response_tensor(out, id, &t) - out);
}

/* ---------------------------------------------------------------- small requests */

static void set_ops(Tensordd__V1__Op *op, const td_wire_op *w)
{
    tensordd__v1__op__init(op);
    if (w->name) /* (else protobuf-c's empty string, as init leaves it) */
        op->op = (char *)(uintptr_t)w->name;
    op->n_inputs = w->n_inputs;
    op->inputs = (uint64_t *)(uintptr_t)w->inputs;
    op->n_outputs = w->n_outputs;
    op->outputs = (uint64_t *)(uintptr_t)w->outputs;
    op->dtype = (Tensordd__V1__DType)w->dtype;
    op->requires_grad = w->requires_grad;
}

Tensordd__V1__Request *tdd_wire_request_fast(const uint8_t *msg, size_t len, ProtobufCAllocator *al)
{
    td_wire_alloc wa = {al->alloc, al->allocator_data};
    td_wire_request w;
    if (!td_wire_request_get(msg, len, &wa, &w))
        return NULL;
    Tensordd__V1__Request *req = al->alloc(al->allocator_data, sizeof *req);
    if (!req)
        return NULL;
    tensordd__v1__request__init(req);
    req->id = w.id;
    req->want_reply = w.want_reply;
    switch (w.body) {
    case TD_FIELD_REQUEST_OP:
        req->op = al->alloc(al->allocator_data, sizeof *req->op);
        if (!req->op)
            return NULL;
        set_ops(req->op, &w.op);
        req->body_case = TENSORDD__V1__REQUEST__BODY_OP;
        break;
    case TD_FIELD_REQUEST_RELEASE:
        req->release = al->alloc(al->allocator_data, sizeof *req->release);
        if (!req->release)
            return NULL;
        tensordd__v1__release__init(req->release);
        req->release->n_handles = w.n_handles;
        req->release->handles = (uint64_t *)(uintptr_t)w.handles;
        req->body_case = TENSORDD__V1__REQUEST__BODY_RELEASE;
        break;
    case TD_FIELD_REQUEST_SYNC:
        req->sync = al->alloc(al->allocator_data, sizeof *req->sync);
        if (!req->sync)
            return NULL;
        tensordd__v1__sync__init(req->sync);
        req->body_case = TENSORDD__V1__REQUEST__BODY_SYNC;
        break;
    default: /* (a Request without a body: as protobuf-c decodes it) */
        break;
    }
    return req;
}
