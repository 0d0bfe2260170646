/* td_attr.h -- an op's attributes as a client sends them and the backends read them
 * (tensordd.h includes it). */
#ifndef TD_ATTR_H
#define TD_ATTR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    TD_ATTR_INT = 1,
    TD_ATTR_FLOAT,
    TD_ATTR_BOOL,
    TD_ATTR_INTS,
    TD_ATTR_FLOATS,
    TD_ATTR_STR
} td_attr_kind;

typedef struct {
    const char *name;
    td_attr_kind kind;
    int64_t i;
    double f;
    int b;
    const int64_t *ints;
    const double *floats;
    size_t n; /* length of ints/floats */
    const char *s;
} td_attr;

#ifdef __cplusplus
}
#endif

#endif
