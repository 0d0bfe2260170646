/* td_error_set.h -- the one builder of a td_error, for the code that makes errors (the
 * daemon, the backends, libtensordd); not installed: programs read a td_error, they do
 * not build one. (libtensordd.so.0 still exports both functions for programs linked
 * before they left td_error.h; tools/abi/libtensordd.symbols lists them as compat.) */
#ifndef TD_ERROR_SET_H
#define TD_ERROR_SET_H

#include <stdarg.h>

#include "td_error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* common/errors.c: code and a printf-style message,
 * the detail cleared; returns code. err may be NULL. */
int td_error_set(td_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int td_error_vset(td_error *err, int code, const char *fmt, va_list ap)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 0)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif
