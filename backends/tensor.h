/* tensor.h -- strided tensor views over refcounted device storage. */
#ifndef TDD_TENSOR_H
#define TDD_TENSOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensordd.h"

struct tdd_device;

/* Memory on one device. Shared by every view of it; freed when refs drops to 0. */
typedef struct tdd_storage {
    atomic_long refs;
    void *data;
    size_t nbytes;
    struct tdd_device *dev;
    /* Bumped by every in-place update of the data (optimizer steps), through whichever
     * view: every view of the storage shares it, as torch's version counter is shared by
     * a tensor's views, so autodiff refuses a saved view whose base was updated since.
     * Loop thread only. */
    uint64_t version;
} tdd_storage;

/* A view: dtype, shape and element strides over a storage, starting at offset
 * elements in. Strides may be 0 (expand) and need not be C order (permute). */
typedef struct tdd_tensor {
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    int64_t strides[TD_MAX_NDIM];
    int64_t offset;
    tdd_storage *st;
} tdd_tensor;

int64_t tdd_numel(const tdd_tensor *t);
bool tdd_is_contiguous(const tdd_tensor *t);
/* Fills C-order strides for t's shape. */
void tdd_set_contiguous(tdd_tensor *t);
/* Address of element 0 of the view. */
static inline void *tdd_data(const tdd_tensor *t)
{
    return (char *)t->st->data + (size_t)t->offset * td_dtype_size(t->dtype);
}
/* numel of a shape; -1 if a dim is negative or its extent (0-size dims counted as 1)
 * exceeds max. */
int64_t tdd_shape_numel(const int64_t *shape, int ndim, int64_t max);
/* a*b into *out unless it overflows. */
bool tdd_mul_overflows(uint64_t a, uint64_t b, uint64_t *out);
bool tdd_same_shape(const tdd_tensor *a, const tdd_tensor *b);
/* Copies host view src into dst as C-order contiguous bytes (any dtype). */
void tdd_copy_contiguous(const tdd_tensor *src, void *dst);

#endif
