/* wire.c -- the one place where a td_error becomes a protobuf Error. */
#include <stdio.h>
#include <string.h>

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
