/* tdd_err.h -- the daemon's error builders: a td_error with its code, a printf-style message
 * and, where the code has one, its typed detail; each returns the code. Every layer uses them
 * (the daemon, the op table and the backends), so they sit at the bottom, in common/. */
#ifndef TDD_ERR_H
#define TDD_ERR_H

#include <stdint.h>

#include "td_dtype.h"
#include "td_error.h"

int tdd_err_set(td_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tdd_err_shape(td_error *err, const int64_t *expected, int en, const int64_t *got, int gn,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
int tdd_err_arg(td_error *err, const char *argument, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tdd_err_dtypes(td_error *err, td_dtype expected, td_dtype got, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* RESOURCE_EXHAUSTED naming the resource (a quota or cap) and what was asked and left. */
int tdd_err_resource(td_error *err, const char *resource, uint64_t requested, uint64_t available,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
