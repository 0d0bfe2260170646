/* chunk.c -- a large kernel's pieces (chunk.h): which ops split, along which dim, and
 * the views each piece runs on. A kernel's pieces are a function of its shape and the
 * daemon's configuration (--chunk-elems, and the device's kind) only, never of what other
 * sessions do: a lane hands the turn to another session between two pieces, but the same
 * request always runs as the same pieces, so its bits never depend on the load
 * (tests/python/scheduling/test_determinism.py). Splitting along the rows of a GEMM changes no sum
 * in exact arithmetic, but a BLAS may sum an element of C in an order that depends on the
 * call's shape (OpenBLAS's Haswell kernels do at any split, its SkylakeX ones off a
 * 64 grid): so a chunked GEMM's bits may differ from the same GEMM run whole, and the
 * piece size is one of the settings that may change bits (README, "The daemon"). */
#include "chunk.h"

#include <string.h>

enum { CHUNK_ARG_NONE, CHUNK_ARG_M, CHUNK_ARG_BATCH };

/* A GEMM piece on a BLAS-backed device has whole blocks of this many rows: a GEMM
 * repacks a whole operand per call, so thin pieces cost (a 2048^3 sgemm in 64-row
 * pieces took 1.2-1.6x the whole call's CPU time, in 256-row ones 1.02-1.05x). */
#define BLAS_ROWS 64
/* A flat piece starts at a multiple of this many elements, so the vectorised and the
 * remainder loops of a kernel see each element where the whole call's do (an
 * elementwise op's pieces are bit-identical to the whole kernel: each element is computed
 * alone). */
#define FLAT_ALIGN 64

static bool dense(const tdd_tensor *t)
{
    return tdd_is_contiguous(t);
}

/* The first dim of out (below limit) of size above 1, when every earlier dim has size 1
 * (a slice there is contiguous); -1 if none. */
static int lead_dim(const tdd_tensor *out, int limit)
{
    for (int d = 0; d < limit; d++)
        if (out->shape[d] > 1)
            return d;
    return -1;
}

/* Input t's dim aligned (right to left, as broadcasting aligns) with output dim d when
 * it runs along it, else -1 (t is broadcast there, or lacks it). */
static int8_t aligned(const tdd_tensor *t, const tdd_tensor *out, int d)
{
    int a = d - (out->ndim - t->ndim);
    return (int8_t)(a >= 0 && t->shape[a] == out->shape[d] ? a : -1);
}

static bool plan_gemm(const tdd_opcall *c, tdd_chunk_plan *p)
{
    const tdd_tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    if ((c->args->flags & 3u) || x->ndim < 2 || w->ndim < 2 || y->ndim < 2)
        return false; /* a vector operand: no row dim to split */
    int d = lead_dim(y, y->ndim - 1);
    if (d < 0)
        return false;
    p->dim = d;
    p->arg = d == y->ndim - 2 ? CHUNK_ARG_M : CHUNK_ARG_BATCH;
    for (int k = 0; k < c->n_in; k++)
        p->in_dim[k] = -1;
    p->in_dim[0] = aligned(x, y, d);
    if (p->arg == CHUNK_ARG_BATCH && c->op != TDD_OP_LINEAR)
        p->in_dim[1] = aligned(w, y, d); /* (at M, w's aligned dim is its K) */
    if (c->n_in > 2)
        p->in_dim[2] = aligned(c->in[2], y, d); /* linear's bias */
    return true;
}

static bool plan_conv(const tdd_opcall *c, tdd_chunk_plan *p)
{
    const tdd_tensor *y = c->out[0];
    if (c->in[0]->ndim != 4 || y->ndim != 4 || y->shape[0] < 2)
        return false; /* unbatched */
    p->dim = 0;
    p->arg = CHUNK_ARG_NONE;
    for (int k = 0; k < c->n_in; k++)
        p->in_dim[k] = -1;
    p->in_dim[0] = 0;
    return true;
}

static bool plan_elementwise(const tdd_opcall *c, tdd_chunk_plan *p)
{
    const tdd_tensor *y = c->out[0];
    p->arg = CHUNK_ARG_NONE;
    p->flat = dense(y);
    for (int k = 0; k < c->n_in && p->flat; k++) {
        const tdd_tensor *t = c->in[k];
        p->flat = tdd_numel(t) == 1 || (dense(t) && tdd_same_shape(t, y));
    }
    if (p->flat) {
        p->dim = 0;
        for (int k = 0; k < c->n_in; k++)
            p->in_dim[k] = (int8_t)(tdd_numel(c->in[k]) == 1 ? -1 : 0);
        return true;
    }
    int d = lead_dim(y, y->ndim);
    if (d < 0)
        return false;
    p->dim = d;
    for (int k = 0; k < c->n_in; k++)
        p->in_dim[k] = aligned(c->in[k], y, d);
    return true;
}

bool tdd_chunk_plan_make(const tdd_opcall *c, int64_t elems, bool blas, tdd_chunk_plan *p)
{
    memset(p, 0, sizeof *p);
    const tdd_tensor *y = c->out[0];
    int64_t n = tdd_numel(y);
    if (elems <= 0 || c->n_out != 1 || n <= elems || c->args->inplace_in || !dense(y))
        return false;
    bool ok, gemm = false;
    switch (tdd_opdefs[c->op].kind) {
    case TDD_KIND_BINARY:
    case TDD_KIND_UNARY:
    case TDD_KIND_ELEMENT:
        ok = plan_elementwise(c, p);
        break;
    default:
        gemm = c->op == TDD_OP_MATMUL || c->op == TDD_OP_BMM || c->op == TDD_OP_LINEAR;
        ok = gemm ? plan_gemm(c, p) : c->op == TDD_OP_CONV2D && plan_conv(c, p);
        break;
    }
    if (!ok)
        return false;
    p->len = p->flat ? n : y->shape[p->dim];
    int64_t row = n / p->len; /* elements per row of the split dim */
    int64_t rows = elems / row;
    if (p->flat)
        rows = (rows + FLAT_ALIGN - 1) / FLAT_ALIGN * FLAT_ALIGN;
    if (gemm && blas && p->arg == CHUNK_ARG_M)
        rows = (rows + BLAS_ROWS - 1) / BLAS_ROWS * BLAS_ROWS;
    if (rows < 1)
        rows = 1;
    p->rows = rows;
    return p->len / rows >= 2; /* the last piece takes the remainder */
}

int64_t tdd_chunk_piece_end(const tdd_chunk_plan *p, int64_t lo)
{
    return p->len - lo - p->rows < p->rows ? p->len : lo + p->rows;
}

static void slice(tdd_tensor *t, int dim, int64_t lo, int64_t hi)
{
    t->offset += lo * t->strides[dim];
    t->shape[dim] = hi - lo;
}

static void flatten(tdd_tensor *t)
{
    if (tdd_numel(t) == 1) {
        t->ndim = 0; /* broadcast against the piece */
        return;
    }
    int64_t n = tdd_numel(t);
    t->ndim = 1;
    t->shape[0] = n;
    t->strides[0] = 1;
}

void tdd_chunk_piece_make(const tdd_chunk_plan *p, const tdd_opcall *c, int64_t lo, int64_t hi,
                          tdd_chunk_piece *pc)
{
    pc->call = *c;
    pc->args = *c->args;
    pc->call.args = &pc->args;
    pc->out = *c->out[0];
    pc->call.out[0] = &pc->out;
    if (p->flat)
        flatten(&pc->out);
    slice(&pc->out, p->dim, lo, hi);
    for (int i = 0; i < c->n_in; i++) {
        pc->in[i] = *c->in[i];
        pc->call.in[i] = &pc->in[i];
        if (p->flat)
            flatten(&pc->in[i]);
        if (p->in_dim[i] >= 0)
            slice(&pc->in[i], p->in_dim[i], lo, hi);
    }
    if (p->arg == CHUNK_ARG_M)
        pc->args.i[0] = hi - lo;
    else if (p->arg == CHUNK_ARG_BATCH)
        pc->args.ints[0][p->dim] = hi - lo;
}
