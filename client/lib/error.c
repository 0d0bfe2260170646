/* error.c -- the one place where wire Errors and local failures become a td_error. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "td_error_set.h"

int td__fail(td_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    td_error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    snprintf(dst, cap, "%s", src ? src : "");
}

void td__device_from_pb(const Tensordd__V1__Device *d, td_device *out)
{
    memset(out, 0, sizeof *out);
    if (d) {
        copy_str(out->backend, sizeof out->backend, d->backend);
        out->ordinal = d->ordinal;
    }
}

/* Wire codes are positive ErrorCode numbers; anything we do not know (a newer
 * daemon) is reported as INTERNAL rather than as a code the caller can't name. */
static int code_from_pb(int pb)
{
    if (pb >= 1 && pb < TD_ERRNO_COUNT)
        return -pb;
    return TD_EINTERNAL;
}

static int shape_copy(int64_t *dst, const int64_t *src, size_t n)
{
    size_t k = n < TD_MAX_NDIM ? n : TD_MAX_NDIM;
    for (size_t i = 0; i < k; i++)
        dst[i] = src[i];
    return (int)n; /* the true rank, even if more than we could keep */
}

int td__from_pb(const Tensordd__V1__Error *e, td_error *err)
{
    int code = code_from_pb((int)e->code);
    if (!err)
        return code;
    td_error_set(err, code, "%s", e->message && e->message[0] ? e->message : td_strerror(code));
    err->request_id = e->request_id;

    switch (e->detail_case) {
    case TENSORDD__V1__ERROR__DETAIL_BACKEND_MISMATCH:
    case TENSORDD__V1__ERROR__DETAIL_DEVICE_MISMATCH: {
        const Tensordd__V1__DeviceMismatch *m =
            e->detail_case == TENSORDD__V1__ERROR__DETAIL_BACKEND_MISMATCH ? e->backend_mismatch
                                                                           : e->device_mismatch;
        if (!m)
            break;
        err->detail_kind = TD_DETAIL_DEVICES;
        td__device_from_pb(m->target, &err->detail.devices.target);
        td__device_from_pb(m->grad, &err->detail.devices.grad);
        err->detail.devices.target_index = m->target_index;
        err->detail.devices.grad_index = m->grad_index;
        break;
    }
    case TENSORDD__V1__ERROR__DETAIL_DTYPE_MISMATCH:
        if (!e->dtype_mismatch)
            break;
        err->detail_kind = TD_DETAIL_DTYPES;
        err->detail.dtypes.target = (td_dtype)e->dtype_mismatch->target;
        err->detail.dtypes.grad = (td_dtype)e->dtype_mismatch->grad;
        break;
    case TENSORDD__V1__ERROR__DETAIL_SHAPE_MISMATCH: {
        const Tensordd__V1__ShapeMismatch *m = e->shape_mismatch;
        if (!m)
            break;
        err->detail_kind = TD_DETAIL_SHAPES;
        err->detail.shapes.expected_ndim =
            shape_copy(err->detail.shapes.expected, m->expected, m->n_expected);
        err->detail.shapes.got_ndim = shape_copy(err->detail.shapes.got, m->got, m->n_got);
        break;
    }
    case TENSORDD__V1__ERROR__DETAIL_UNKNOWN_HANDLE:
        if (!e->unknown_handle)
            break;
        err->detail_kind = TD_DETAIL_HANDLE;
        err->detail.handle.handle = e->unknown_handle->handle;
        break;
    case TENSORDD__V1__ERROR__DETAIL_WRONG_HANDLE_KIND:
        if (!e->wrong_handle_kind)
            break;
        err->detail_kind = TD_DETAIL_HANDLE_KIND;
        err->detail.handle_kind.handle = e->wrong_handle_kind->handle;
        err->detail.handle_kind.expected = (td_handle_kind)e->wrong_handle_kind->expected;
        err->detail.handle_kind.got = (td_handle_kind)e->wrong_handle_kind->got;
        break;
    case TENSORDD__V1__ERROR__DETAIL_POISONED:
        if (!e->poisoned)
            break;
        err->detail_kind = TD_DETAIL_POISONED;
        err->detail.poisoned.handle = e->poisoned->handle;
        err->detail.poisoned.origin_request = e->poisoned->origin_request;
        err->detail.poisoned.origin_code = code_from_pb((int)e->poisoned->origin_code);
        break;
    case TENSORDD__V1__ERROR__DETAIL_RESOURCE_EXHAUSTED:
        if (!e->resource_exhausted)
            break;
        err->detail_kind = TD_DETAIL_RESOURCE;
        copy_str(err->detail.resource.resource, sizeof err->detail.resource.resource,
                 e->resource_exhausted->resource);
        err->detail.resource.requested = e->resource_exhausted->requested;
        err->detail.resource.available = e->resource_exhausted->available;
        break;
    case TENSORDD__V1__ERROR__DETAIL_VERSION_MISMATCH:
        if (!e->version_mismatch)
            break;
        err->detail_kind = TD_DETAIL_VERSION;
        err->detail.version.server_min = e->version_mismatch->server_min;
        err->detail.version.server_max = e->version_mismatch->server_max;
        break;
    case TENSORDD__V1__ERROR__DETAIL_INVALID_ARGUMENT:
        if (!e->invalid_argument)
            break;
        err->detail_kind = TD_DETAIL_ARGUMENT;
        copy_str(err->detail.argument.argument, sizeof err->detail.argument.argument,
                 e->invalid_argument->argument);
        break;
    case TENSORDD__V1__ERROR__DETAIL__NOT_SET:
    default:
        break;
    }
    return code;
}
