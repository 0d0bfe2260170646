/* iter.h -- the strided-iteration helper every fast kernel uses: walks up to
 * TDD_ITER_MAX_OPS strided operands over one shape in C order, handing the
 * kernel runs along the innermost dimension (after merging dimensions that
 * are contiguous in every operand, so contiguous tensors become one run). */
#ifndef TDD_ITER_H
#define TDD_ITER_H

#include "ops.h"

#define TDD_ITER_MAX_OPS 4

typedef struct {
    int nops, ndim; /* ndim >= 1 after coalescing */
    int64_t numel;
    int64_t shape[TD_MAX_NDIM];
    int64_t strides[TDD_ITER_MAX_OPS][TD_MAX_NDIM]; /* in elements */
    int64_t base[TDD_ITER_MAX_OPS];                 /* element offset of element 0 */
} tdd_iter;

/* One run of n elements: off[k] is operand k's element offset of the run's
 * first element, stride[k] its step along the run. */
typedef void (*tdd_iter_fn)(void *ctx, int64_t n, const int64_t *off, const int64_t *stride);

/* Strides of t seen at shape[ndim] under numpy broadcasting (right-aligned;
 * 0 where t has size 1 or lacks the dimension). */
void tdd_bcast_strides(const tdd_tensor *t, const int64_t *shape, int ndim, int64_t *strides);

/* Iteration over shape[ndim] of operands with the given strides and bases. */
void tdd_iter_init(tdd_iter *it, int nops, const int64_t *shape, int ndim,
                   const int64_t (*strides)[TD_MAX_NDIM], const int64_t *base);

/* Operands are tensors broadcast to shape (operand 0 usually the output). */
void tdd_iter_tensors(tdd_iter *it, const int64_t *shape, int ndim, int nops,
                      const tdd_tensor *const *ts);

/* Calls fn for every run covering elements [lo, hi) of the C-order iteration. */
void tdd_iter_range(const tdd_iter *it, int64_t lo, int64_t hi, tdd_iter_fn fn, void *ctx);

/* Splits t's dims into kept (mask bit clear) and reduced (bit set) groups:
 * kept/red receive shapes and t's strides for each group. */
void tdd_split_dims(const tdd_tensor *t, uint32_t mask, int *nkept, int64_t *kshape,
                    int64_t *kstrides, int *nred, int64_t *rshape, int64_t *rstrides);

/* Matmul operands as 2+nb dimensional views [batch.., M, K] @ [batch.., K, N]
 * -> [batch.., M, N], batch dims broadcast (stride 0), 1-D operands given a
 * unit dimension; valid for matmul, bmm and linear (W seen transposed). */
void tdd_matmul_views(const tdd_opcall *c, tdd_tensor *a, tdd_tensor *b, tdd_tensor *y);

#endif
