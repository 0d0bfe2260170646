/* npy.h -- reading and writing numpy .npy files for tdctl (memory-mapped, C order only). */
#ifndef TDCTL_NPY_H
#define TDCTL_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "tensordd.h"

typedef struct {
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    uint64_t nbytes; /* numel * itemsize */
    size_t data_off; /* where the array starts in the file */
    void *map;       /* the whole file, mapped */
    size_t map_len;
    const void *data; /* map + data_off */
} npy_array;

/* Parses an .npy header (v1, v2 or v3) from the first len bytes of a file.
 * On failure writes a one-line reason into why and returns -1. */
int npy_parse_header(const uint8_t *buf, size_t len, npy_array *out, char *why, size_t whylen);

/* Maps path read-only and parses it. */
int npy_open(const char *path, npy_array *out, char *why, size_t whylen);
void npy_close(npy_array *a);

/* Builds a v1 header whose length (magic included) is a multiple of 64.
 * Returns its length, or 0 (why set) if the dtype has no .npy form. */
size_t npy_make_header(td_dtype dt, int ndim, const int64_t *shape, char *out, size_t cap,
                       char *why, size_t whylen);

#endif
