/* opcodes.h -- the op table's enumeration and per-op columns, plain C that nvcc compiles too
 * (cuda/kernels.h includes it; ops.h adds the C11 side: tensors, attributes, prepare).
 *
 * The elementwise rows live in elementwise.h (TDD_BINARY_OPS, TDD_UNARY_OPS) with their
 * scalar expressions; TDD_OPS splices them in. */
#ifndef TDD_OPCODES_H
#define TDD_OPCODES_H

#include "elementwise.h"

#define TDD_MAX_OP_INPUTS 16
#define TDD_MAX_OP_OUTPUTS 16

/* What an op is, for grouping (docs, tests) and for the kernels' dispatch. */
typedef enum {
    TDD_KIND_BINARY,  /* broadcasting elementwise, 2 inputs or 1 + "other" */
    TDD_KIND_UNARY,   /* elementwise, one input */
    TDD_KIND_ELEMENT, /* other elementwise (where, masked_fill, relu_backward) */
    TDD_KIND_REDUCE,  /* reductions, scans, softmax */
    TDD_KIND_LINALG,
    TDD_KIND_VIEW,  /* strided views (a copy only when no view is possible) */
    TDD_KIND_INDEX, /* copies, joins, indexing */
    TDD_KIND_NN,
    TDD_KIND_CREATE,
} tdd_opkind;

/* X(ENUM, "name", min_inputs, max_inputs, kind) -- names are PyTorch's. */
#define TDD_OPS(X)                                                                                 \
    TDD_BINARY_OPS(X, TDD_EW_SKIP)                                                                 \
    X(WHERE, "where", 3, 3, ELEMENT)                                                               \
    X(MASKED_FILL, "masked_fill", 2, 3, ELEMENT)                                                   \
    TDD_UNARY_OPS(X, TDD_EW_SKIP)                                                                  \
    X(SUM, "sum", 1, 1, REDUCE)                                                                    \
    X(MEAN, "mean", 1, 1, REDUCE)                                                                  \
    X(AMAX, "amax", 1, 1, REDUCE)                                                                  \
    X(AMIN, "amin", 1, 1, REDUCE)                                                                  \
    X(ARGMAX, "argmax", 1, 1, REDUCE)                                                              \
    X(ARGMIN, "argmin", 1, 1, REDUCE)                                                              \
    X(MAX, "max", 1, 1, REDUCE)                                                                    \
    X(MIN, "min", 1, 1, REDUCE)                                                                    \
    X(VAR, "var", 1, 1, REDUCE)                                                                    \
    X(STD, "std", 1, 1, REDUCE)                                                                    \
    X(LOGSUMEXP, "logsumexp", 1, 1, REDUCE)                                                        \
    X(PROD, "prod", 1, 1, REDUCE)                                                                  \
    X(SUM_TO, "sum_to", 1, 1, REDUCE)                                                              \
    X(CUMSUM, "cumsum", 1, 1, REDUCE)                                                              \
    X(SOFTMAX, "softmax", 1, 1, REDUCE)                                                            \
    X(LOG_SOFTMAX, "log_softmax", 1, 1, REDUCE)                                                    \
    X(MATMUL, "matmul", 2, 2, LINALG)                                                              \
    X(BMM, "bmm", 2, 2, LINALG)                                                                    \
    X(LINEAR, "linear", 2, 3, LINALG)                                                              \
    X(ADDMM, "addmm", 3, 3, LINALG)                                                                \
    X(BADDBMM, "baddbmm", 3, 3, LINALG)                                                            \
    X(TRANSPOSE, "transpose", 1, 1, VIEW)                                                          \
    X(PERMUTE, "permute", 1, 1, VIEW)                                                              \
    X(RESHAPE, "reshape", 1, 1, VIEW)                                                              \
    X(VIEW, "view", 1, 1, VIEW)                                                                    \
    X(FLATTEN, "flatten", 1, 1, VIEW)                                                              \
    X(SQUEEZE, "squeeze", 1, 1, VIEW)                                                              \
    X(UNSQUEEZE, "unsqueeze", 1, 1, VIEW)                                                          \
    X(EXPAND, "expand", 1, 1, VIEW)                                                                \
    X(SLICE, "slice", 1, 1, VIEW)                                                                  \
    X(CONTIGUOUS, "contiguous", 1, 1, VIEW)                                                        \
    X(DETACH, "detach", 1, 1, VIEW)                                                                \
    X(SPLIT, "split", 1, 1, VIEW)                                                                  \
    X(CHUNK, "chunk", 1, 1, VIEW)                                                                  \
    X(CLONE, "clone", 1, 1, INDEX)                                                                 \
    X(CAST, "cast", 1, 1, INDEX)                                                                   \
    X(CAT, "cat", 1, TDD_MAX_OP_INPUTS, INDEX)                                                     \
    X(STACK, "stack", 1, TDD_MAX_OP_INPUTS, INDEX)                                                 \
    X(GATHER, "gather", 2, 2, INDEX)                                                               \
    X(SCATTER_ADD, "scatter_add", 3, 3, INDEX)                                                     \
    X(INDEX_SELECT, "index_select", 2, 2, INDEX)                                                   \
    X(ONE_HOT, "one_hot", 1, 1, INDEX)                                                             \
    X(EMBEDDING, "embedding", 2, 2, INDEX)                                                         \
    X(EMBEDDING_BAG, "embedding_bag", 3, 4, NN)                                                    \
    X(EMBEDDING_BAG_BACKWARD, "embedding_bag_backward", 4, 5, NN)                                  \
    X(MULTINOMIAL, "multinomial", 1, 1, NN)                                                        \
    X(TRIL, "tril", 1, 1, INDEX)                                                                   \
    X(TRIU, "triu", 1, 1, INDEX)                                                                   \
    X(PAD, "pad", 1, 1, INDEX)                                                                     \
    X(SORT, "sort", 1, 1, INDEX)                                                                   \
    X(ARGSORT, "argsort", 1, 1, INDEX)                                                             \
    X(TOPK, "topk", 1, 1, INDEX)                                                                   \
    X(CROSS_ENTROPY, "cross_entropy", 2, 3, NN)                                                    \
    X(NLL_LOSS, "nll_loss", 2, 3, NN)                                                              \
    X(MSE_LOSS, "mse_loss", 2, 2, NN)                                                              \
    X(BCE_WITH_LOGITS, "binary_cross_entropy_with_logits", 2, 2, NN)                               \
    X(LAYER_NORM, "layer_norm", 1, 3, NN)                                                          \
    X(GROUP_NORM, "group_norm", 1, 3, NN)                                                          \
    X(BATCH_NORM, "batch_norm", 1, 5, NN)                                                          \
    X(DROPOUT, "dropout", 1, 1, NN)                                                                \
    X(SDPA, "scaled_dot_product_attention", 3, 4, NN)                                              \
    X(INTERPOLATE, "interpolate", 1, 1, NN)                                                        \
    X(CONV2D, "conv2d", 2, 3, NN)                                                                  \
    X(CONV1D, "conv1d", 2, 3, NN)                                                                  \
    X(CONV_TRANSPOSE2D, "conv_transpose2d", 2, 3, NN)                                              \
    X(MAX_POOL2D, "max_pool2d", 1, 1, NN)                                                          \
    X(AVG_POOL2D, "avg_pool2d", 1, 1, NN)                                                          \
    X(ADAPTIVE_AVG_POOL2D, "adaptive_avg_pool2d", 1, 1, NN)                                        \
    X(MAX_POOL1D, "max_pool1d", 1, 1, NN)                                                          \
    X(AVG_POOL1D, "avg_pool1d", 1, 1, NN)                                                          \
    X(MAX_POOL2D_BACKWARD, "max_pool2d_backward", 2, 2, NN)                                        \
    X(PIXEL_SHUFFLE, "pixel_shuffle", 1, 1, NN)                                                    \
    X(PIXEL_UNSHUFFLE, "pixel_unshuffle", 1, 1, NN)                                                \
    X(FULL, "full", 0, 0, CREATE)                                                                  \
    X(ZEROS, "zeros", 0, 0, CREATE)                                                                \
    X(ONES, "ones", 0, 0, CREATE)                                                                  \
    X(ARANGE, "arange", 0, 0, CREATE)                                                              \
    X(LINSPACE, "linspace", 0, 0, CREATE)                                                          \
    X(EYE, "eye", 0, 0, CREATE)                                                                    \
    X(RAND, "rand", 0, 0, CREATE)                                                                  \
    X(RANDN, "randn", 0, 0, CREATE)                                                                \
    X(RANDINT, "randint", 0, 0, CREATE)

typedef enum {
#define TDD__OP_ENUM(e, name, lo, hi, kind) TDD_OP_##e,
    TDD_OPS(TDD__OP_ENUM)
#undef TDD__OP_ENUM
        TDD_OP_COUNT
} tdd_op;

/* sort/argsort/topk's order: whether a sorts before b (value, then position: stable), NaN
 * last ascending and first descending, as PyTorch's. */
TDD_HD int tdd_sort_before(double a, int64_t ia, double b, int64_t ib, int descending)
{
    int an = a != a, bn = b != b;
    if (an || bn) {
        if (an && bn)
            return ia < ib;
        return descending ? an : bn; /* NaN is the largest */
    }
    if (a == b)
        return ia < ib;
    return descending ? a > b : a < b;
}

/* The same on integers (exact beyond 2^53). */
TDD_HD int tdd_sort_before_i(int64_t a, int64_t ia, int64_t b, int64_t ib, int descending)
{
    if (a == b)
        return ia < ib;
    return descending ? a > b : a < b;
}

/* adaptive pooling's window over n inputs for output i of m: [*lo, *hi), PyTorch's */
TDD_HD void tdd_adaptive_window(int64_t i, int64_t m, int64_t n, int64_t *lo, int64_t *hi)
{
    *lo = i * n / m;
    *hi = ((i + 1) * n + m - 1) / m;
}

/* interpolate's source along one dim for output index o (in and out the dim's sizes, scale the
 * ratio tdd_opargs holds), as PyTorch's CPU kernels compute it: mode 0 nearest (*i1 = *i0,
 * *l1 = 0; float math), 1 linear (the two neighbours and the second's weight; float math, or
 * double for f64 inputs). Sources are >= 0, so the casts truncate as floor. */
TDD_HD void tdd_interp_src(int mode, int align_corners, int dbl, double scale, int64_t o,
                           int64_t in, int64_t out, int64_t *i0, int64_t *i1, double *l1)
{
    if (mode == 0) {
        int64_t k = out == in ? o : out == 2 * in ? o >> 1 : (int64_t)((float)o * (float)scale);
        *i0 = *i1 = k < in - 1 ? k : in - 1;
        *l1 = 0.0;
        return;
    }
    double src;
    if (dbl) {
        src = align_corners ? scale * (double)o : scale * ((double)o + 0.5) - 0.5;
    } else {
        float s = (float)scale, t = align_corners ? s * (float)o : s * ((float)o + 0.5f) - 0.5f;
        src = (double)t;
    }
    if (src < 0.0)
        src = 0.0;
    int64_t k = (int64_t)src;
    double l = src - (double)k;
    *i0 = k;
    *i1 = k < in - 1 ? k + 1 : k;
    *l1 = l < 0.0 ? 0.0 : l > 1.0 ? 1.0 : l;
}

/* pixel_shuffle (down 0) / pixel_unshuffle (down 1) by factor r: the input's (channel, row,
 * column) that the output's (c, h, w) reads, within one sample; the three kernels ask it. */
TDD_HD void tdd_pixel_src(int down, int64_t r, int64_t c, int64_t h, int64_t w, int64_t *ic,
                          int64_t *ih, int64_t *iw)
{
    if (!down) { /* [C r^2, H, W] -> [C, H r, W r] */
        *ic = c * r * r + (h % r) * r + w % r;
        *ih = h / r;
        *iw = w / r;
    } else { /* [C, H r, W r] -> [C r^2, H, W] */
        int64_t k = c % (r * r);
        *ic = c / (r * r);
        *ih = h * r + k / r;
        *iw = w * r + k % r;
    }
}

/* pad's source index for position k (counted from the input's start) of a dim of size n > 0,
 * in mode 1 reflect, 2 replicate, 3 circular (tdd_op_prepare keeps reflect within one
 * reflection). */
TDD_HD int64_t tdd_pad_src(int mode, int64_t k, int64_t n)
{
    if (mode == 1) {
        if (k < 0)
            k = -k;
        return k >= n ? 2 * (n - 1) - k : k;
    }
    if (mode == 2)
        return k < 0 ? 0 : k >= n ? n - 1 : k;
    k %= n;
    return k < 0 ? k + n : k;
}

/* pad's source index for output position o of a dim: before the dim's left padding; for
 * circular, PyTorch's crop first: s the first input index kept, m how many are (tdd_opargs
 * ints[1], ints[2]; a negative padding crops). */
TDD_HD int64_t tdd_pad_at(int mode, int64_t o, int64_t before, int64_t n, int64_t s, int64_t m)
{
    return mode == 3 ? s + tdd_pad_src(3, o - before - s, m) : tdd_pad_src(mode, o - before, n);
}

/* The RULE column of elementwise.h (TDD_EW_NONE: not an elementwise expression op). */
typedef enum {
    TDD_EW_NONE,
    TDD_EW_SAME,
    TDD_EW_SAMEB,
    TDD_EW_FLOAT,
    TDD_EW_FONLY,
    TDD_EW_BOOL,
} tdd_ewrule;

/* The IMODE column. */
typedef enum { TDD_EWI_NONE, TDD_EWI_INT, TDD_EWI_ICHK } tdd_ewimode;

/* Operands of op's expression: 2 (TDD_BINARY_OPS), 1 (TDD_UNARY_OPS), 0 (no expression). */
TDD_HD int tdd_ew_arity(int op)
{
    switch (op) {
#define TDD__EW_A2(e, rule, f, im, i)                                                              \
    case TDD_OP_##e:                                                                               \
        return 2;
#define TDD__EW_A1(e, rule, f, im, i)                                                              \
    case TDD_OP_##e:                                                                               \
        return 1;
        TDD_BINARY_OPS(TDD_EW_SKIP, TDD__EW_A2)
        TDD_UNARY_OPS(TDD_EW_SKIP, TDD__EW_A1)
#undef TDD__EW_A2
#undef TDD__EW_A1
    default:
        return 0;
    }
}

TDD_HD tdd_ewrule tdd_ew_rule(int op)
{
    switch (op) {
#define TDD__EW_RULE(e, rule, f, im, i)                                                            \
    case TDD_OP_##e:                                                                               \
        return TDD_EW_##rule;
        TDD_BINARY_OPS(TDD_EW_SKIP, TDD__EW_RULE)
        TDD_UNARY_OPS(TDD_EW_SKIP, TDD__EW_RULE)
#undef TDD__EW_RULE
    default:
        return TDD_EW_NONE;
    }
}

TDD_HD tdd_ewimode tdd_ew_imode(int op)
{
    switch (op) {
#define TDD__EW_IMODE(e, rule, f, im, i)                                                           \
    case TDD_OP_##e:                                                                               \
        return TDD_EWI_##im;
        TDD_BINARY_OPS(TDD_EW_SKIP, TDD__EW_IMODE)
        TDD_UNARY_OPS(TDD_EW_SKIP, TDD__EW_IMODE)
#undef TDD__EW_IMODE
    default:
        return TDD_EWI_NONE;
    }
}

#endif
