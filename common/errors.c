/* errors.c -- names and messages of the TD_E* codes, expanded from TD_ERRNO_MAP; the
 * one td_error builder; dtype names and sizes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "td_dtype.h"
#include "td_error.h"
#include "td_error_set.h"

const char *td_err_name(int code)
{
    switch (code) {
    case 0:
        return "OK";
#define XX(name, num, msg)                                                                         \
    case -(num):                                                                                   \
        return #name;
        TD_ERRNO_MAP(XX)
#undef XX
    }
    return "UNKNOWN";
}

const char *td_strerror(int code)
{
    switch (code) {
    case 0:
        return "success";
#define XX(name, num, msg)                                                                         \
    case -(num):                                                                                   \
        return msg;
        TD_ERRNO_MAP(XX)
#undef XX
    }
    return "unknown error";
}

static const struct {
    const char *name;
    size_t size;
} dtypes[TD_DTYPE_COUNT] = {
    [TD_DTYPE_INVALID] = {"invalid", 0},
    [TD_F32] = {"float32", 4},
    [TD_F64] = {"float64", 8},
    [TD_F16] = {"float16", 2},
    [TD_BF16] = {"bfloat16", 2},
    [TD_I32] = {"int32", 4},
    [TD_I64] = {"int64", 8},
    [TD_BOOL] = {"bool", 1},
    [TD_U8] = {"uint8", 1},
    [TD_I8] = {"int8", 1},
    [TD_I16] = {"int16", 2},
};

const char *td_dtype_name(td_dtype dt)
{
    return (unsigned)dt < TD_DTYPE_COUNT ? dtypes[dt].name : "invalid";
}

size_t td_dtype_size(td_dtype dt)
{
    return (unsigned)dt < TD_DTYPE_COUNT ? dtypes[dt].size : 0;
}

int td_error_vset(td_error *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        memset(err, 0, sizeof *err);
        err->code = code;
        vsnprintf(err->message, sizeof err->message, fmt, ap);
    }
    return code;
}

int td_error_set(td_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    td_error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}
