/* tdd_err.c -- the daemon's error builders (tdd_err.h): the td_error a failure returns,
 * with its typed detail. */
#include "tdd_err.h"
#include "td_error_set.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int tdd_err_set(td_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, code, fmt, ap);
        va_end(ap);
    }
    return code;
}

int tdd_err_shape(td_error *err, const int64_t *expected, int en, const int64_t *got, int gn,
                  const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, TD_ESHAPE_MISMATCH, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_SHAPES;
        err->detail.shapes.expected_ndim = en;
        err->detail.shapes.got_ndim = gn;
        if (en > 0)
            memcpy(err->detail.shapes.expected, expected, (size_t)en * sizeof *expected);
        if (gn > 0)
            memcpy(err->detail.shapes.got, got, (size_t)gn * sizeof *got);
    }
    return TD_ESHAPE_MISMATCH;
}

int tdd_err_arg(td_error *err, const char *argument, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, TD_EINVALID_ARGUMENT, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_ARGUMENT;
        snprintf(err->detail.argument.argument, sizeof err->detail.argument.argument, "%s",
                 argument);
    }
    return TD_EINVALID_ARGUMENT;
}

int tdd_err_resource(td_error *err, const char *resource, uint64_t requested, uint64_t available,
                     const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, TD_ERESOURCE_EXHAUSTED, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_RESOURCE;
        snprintf(err->detail.resource.resource, sizeof err->detail.resource.resource, "%s",
                 resource);
        err->detail.resource.requested = requested;
        err->detail.resource.available = available;
    }
    return TD_ERESOURCE_EXHAUSTED;
}

int tdd_err_dtypes(td_error *err, td_dtype expected, td_dtype got, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, TD_EDTYPE_MISMATCH, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_DTYPES;
        err->detail.dtypes.target = expected;
        err->detail.dtypes.grad = got;
    }
    return TD_EDTYPE_MISMATCH;
}
