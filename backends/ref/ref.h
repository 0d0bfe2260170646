/* ref.h -- private to the reference backend, plus tdd_ref_run, through which
 * other host-memory backends run an op they have no fast kernel for. */
#ifndef TDD_REF_H
#define TDD_REF_H

#include "backend.h"
#include "dtype.h"

/* Runs one validated call with the reference kernels (host memory). */
int tdd_ref_run(const tdd_opcall *c);

/* The oracle walks tensors by index arithmetic on purpose instead of using
 * the fast kernels' iterator (iter.h), so the conformance suite also checks
 * that iterator. */

/* idx = the multi-index of C-order element i of shape. */
void ref_unravel(int64_t i, const int64_t *shape, int ndim, int64_t *idx);
/* Storage offset of t at multi-index idx of an ndim-D shape that t
 * broadcasts to (right-aligned; t's size-1 dims stay at 0). */
int64_t ref_at(const tdd_tensor *t, const int64_t *idx, int ndim);
/* Storage offset of C-order element i of t. */
int64_t ref_index(const tdd_tensor *t, int64_t i);

static inline double ref_getf(const tdd_tensor *t, int64_t off)
{
    return tdd_load_f(t->st->data, t->dtype, off);
}
static inline int64_t ref_geti(const tdd_tensor *t, int64_t off)
{
    return tdd_load_i(t->st->data, t->dtype, off);
}
static inline void ref_setf(tdd_tensor *t, int64_t off, double v)
{
    tdd_store_f(t->st->data, t->dtype, off, v);
}
static inline void ref_seti(tdd_tensor *t, int64_t off, int64_t v)
{
    tdd_store_i(t->st->data, t->dtype, off, v);
}
/* v rounded to dtype dt's precision (inputs are cast to the compute dtype first). */
double ref_round(td_dtype dt, double v);

/* Line j of t along dim d: base offset; *step is the stride along d. */
int64_t ref_line(const tdd_tensor *t, int d, int64_t j, int64_t *step);

int ref_elementwise(const tdd_opcall *c); /* ref_elem.c: binary, unary, where, ... */
int ref_copy(const tdd_opcall *c);        /* ref_elem.c: clone, cast, reshape copies */
int ref_create(const tdd_opcall *c);      /* ref_elem.c */
int ref_reduce(const tdd_opcall *c);      /* ref_reduce.c: reductions, scans, softmax */
int ref_loss(const tdd_opcall *c);        /* ref_reduce.c */
int ref_matmul(const tdd_opcall *c);      /* ref_nn.c */
int ref_index_op(const tdd_opcall *c);    /* ref_nn.c: cat ... pad */
int ref_nn(const tdd_opcall *c);          /* ref_nn.c: layer_norm, dropout, conv, pools */
int ref_bag_op(const tdd_opcall *c);      /* ref_bag.c: embedding_bag (+ backward), multinomial */
int ref_batch_norm(const tdd_opcall *c);  /* ref_norm.c */
int ref_conv_transpose2d(const tdd_opcall *c); /* ref_convt.c */

#endif
