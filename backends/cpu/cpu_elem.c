/* cpu_elem.c -- threaded, vectorisable elementwise kernels (f32/f64, integers,
 * bool; f16/bf16 through the f32 ones in blocks), copies and fills. Every kernel
 * is a run function for the strided iterator: it gets one run of the innermost
 * dimension with per-operand strides, and keeps a unit-stride (and a
 * broadcast-scalar) path the compiler vectorises. */
#include <stdint.h>
#include <string.h>
#include <tgmath.h>

#include "cpu.h"
#include "dtype.h"

typedef struct {
    char *y;
    const char *a, *b, *c;
    const tdd_opargs *g;
    double s[2];    /* float unary parameters p0, p1 */
    int64_t alpha;  /* integer add/sub */
    int64_t lo, hi; /* integer clamp's bounds */
    uint64_t pat;   /* masked_fill's value as the output dtype's bits */
} ew_ctx;

/* Binary: EXPR in x (from a) and y (from b), output type OT (operand 0 is the output). */
#define BIN_FN(NAME, T, OT, EXPR)                                                                  \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        OT *restrict out = (OT *)(void *)c->y + off[0];                                            \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const T *restrict b = (const T *)(const void *)c->b + off[2];                              \
        const T alpha = (T)c->g->f[1];                                                             \
        (void)alpha;                                                                               \
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {                                              \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i], y = b[i];                                                        \
                out[i] = (OT)(EXPR);                                                               \
            }                                                                                      \
        } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {                                       \
            const T y = b[0];                                                                      \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i];                                                                  \
                out[i] = (OT)(EXPR);                                                               \
            }                                                                                      \
        } else if (st[0] == 1 && st[1] == 0 && st[2] == 1) {                                       \
            const T x = a[0];                                                                      \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T y = b[i];                                                                  \
                out[i] = (OT)(EXPR);                                                               \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const T x = a[i * st[1]], y = b[i * st[2]];                                        \
                out[i * st[0]] = (OT)(EXPR);                                                       \
            }                                                                                      \
        }                                                                                          \
    }

/* Unary: EXPR in x, output type OT; p0, p1 are the op's parameters, V its variant (a
 * constant, so gelu's two forms are two loops, not a select in one). */
#define UN_FN(NAME, T, OT, V, EXPR)                                                                \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        OT *restrict out = (OT *)(void *)c->y + off[0];                                            \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const T p0 = (T)c->s[0], p1 = (T)c->s[1];                                                  \
        const int v = V;                                                                           \
        (void)p0;                                                                                  \
        (void)p1;                                                                                  \
        (void)v;                                                                                   \
        if (st[0] == 1 && st[1] == 1) {                                                            \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i];                                                                  \
                out[i] = (OT)(EXPR);                                                               \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const T x = a[i * st[1]];                                                          \
                out[i * st[0]] = (OT)(EXPR);                                                       \
            }                                                                                      \
        }                                                                                          \
    }

/* The output type of a rule (elementwise.h's RULE column) for compute type T. */
#define OT_SAME(T) T
#define OT_SAMEB(T) T
#define OT_FLOAT(T) T
#define OT_FONLY(T) T
#define OT_BOOL(T) uint8_t

/* Float kernels, one per row and compute type (R is the type the expressions name);
 * tables by op, [variant][op] for the unary ones. */
#define R float
#define BIN_f32(e, rule, fexpr, im, iexpr) BIN_FN(bin_##e##_f32, float, OT_##rule(float), fexpr)
#define UN_f32(e, rule, fexpr, im, iexpr)                                                          \
    UN_FN(un0_##e##_f32, float, OT_##rule(float), 0, fexpr)                                        \
    UN_FN(un1_##e##_f32, float, OT_##rule(float), 1, fexpr)
TDD_BINARY_OPS(TDD_EW_SKIP, BIN_f32)
TDD_UNARY_OPS(TDD_EW_SKIP, UN_f32)
#undef R
#define R double
#define BIN_f64(e, rule, fexpr, im, iexpr) BIN_FN(bin_##e##_f64, double, OT_##rule(double), fexpr)
#define UN_f64(e, rule, fexpr, im, iexpr)                                                          \
    UN_FN(un0_##e##_f64, double, OT_##rule(double), 0, fexpr)                                      \
    UN_FN(un1_##e##_f64, double, OT_##rule(double), 1, fexpr)
TDD_BINARY_OPS(TDD_EW_SKIP, BIN_f64)
TDD_UNARY_OPS(TDD_EW_SKIP, UN_f64)
#undef R

#define BIN_AT_f32(e, rule, fexpr, im, iexpr) [TDD_OP_##e] = bin_##e##_f32,
#define BIN_AT_f64(e, rule, fexpr, im, iexpr) [TDD_OP_##e] = bin_##e##_f64,
#define UN0_AT_f32(e, rule, fexpr, im, iexpr) [TDD_OP_##e] = un0_##e##_f32,
#define UN1_AT_f32(e, rule, fexpr, im, iexpr) [TDD_OP_##e] = un1_##e##_f32,
#define UN0_AT_f64(e, rule, fexpr, im, iexpr) [TDD_OP_##e] = un0_##e##_f64,
#define UN1_AT_f64(e, rule, fexpr, im, iexpr) [TDD_OP_##e] = un1_##e##_f64,
static const tdd_iter_fn fns_f32[2][TDD_OP_COUNT] = {
    {TDD_BINARY_OPS(TDD_EW_SKIP, BIN_AT_f32) TDD_UNARY_OPS(TDD_EW_SKIP, UN0_AT_f32)},
    {TDD_BINARY_OPS(TDD_EW_SKIP, BIN_AT_f32) TDD_UNARY_OPS(TDD_EW_SKIP, UN1_AT_f32)}};
static const tdd_iter_fn fns_f64[2][TDD_OP_COUNT] = {
    {TDD_BINARY_OPS(TDD_EW_SKIP, BIN_AT_f64) TDD_UNARY_OPS(TDD_EW_SKIP, UN0_AT_f64)},
    {TDD_BINARY_OPS(TDD_EW_SKIP, BIN_AT_f64) TDD_UNARY_OPS(TDD_EW_SKIP, UN1_AT_f64)}};

/* Integer and bool kernels of the rows whose integer form is exact (IMODE INT): arithmetic
 * in the unsigned type U wraps like the hardware (and the reference's int64 math truncated
 * to the dtype) without C's signed-overflow UB; comparisons stay signed. CVT narrows a
 * result to T (bool: nonzero is true); a bool-output rule stores 0/1. */
#define IBIN_FN(NAME, T, UT, OT, EXPR)                                                             \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        OT *restrict out = (OT *)(void *)c->y + off[0];                                            \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const T *restrict b = (const T *)(const void *)c->b + off[2];                              \
        const UT alpha = (UT)(uint64_t)c->alpha;                                                   \
        (void)alpha;                                                                               \
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {                                              \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i], y = b[i];                                                        \
                out[i] = EXPR;                                                                     \
            }                                                                                      \
        } else if (st[0] == 1 && st[1] == 1 && st[2] == 0) {                                       \
            const T y = b[0];                                                                      \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i];                                                                  \
                out[i] = EXPR;                                                                     \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const T x = a[i * st[1]], y = b[i * st[2]];                                        \
                out[i * st[0]] = EXPR;                                                             \
            }                                                                                      \
        }                                                                                          \
    }

#define IUN_FN(NAME, T, OT, EXPR)                                                                  \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        OT *restrict out = (OT *)(void *)c->y + off[0];                                            \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const int64_t lo = c->lo, hi = c->hi;                                                      \
        (void)lo;                                                                                  \
        (void)hi;                                                                                  \
        if (st[0] == 1 && st[1] == 1) {                                                            \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++)                                    \
            {                                                                                      \
                const T x = a[i];                                                                  \
                out[i] = EXPR;                                                                     \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                const T x = a[i * st[1]];                                                          \
                out[i * st[0]] = EXPR;                                                             \
            }                                                                                      \
        }                                                                                          \
    }

#define CVT_i32(v) ((int32_t)(v))
#define CVT_i64(v) ((int64_t)(v))
#define CVT_b8(v) ((uint8_t)((v) != 0))
/* The stored value by rule: bool outputs are 0/1 already. */
#define ICVT_SAME(S, e) CVT_##S(e)
#define ICVT_SAMEB(S, e) CVT_##S(e)
#define ICVT_FLOAT(S, e) CVT_##S(e)
#define ICVT_FONLY(S, e) CVT_##S(e)
#define ICVT_BOOL(S, e) ((uint8_t)(e))
/* Only the exact rows (IMODE INT) get integer kernels. */
#define IBIN_INT(e, rule, iexpr, S, T, UT)                                                         \
    IBIN_FN(ibin_##e##_##S, T, UT, OT_##rule(T), ICVT_##rule(S, iexpr))
#define IBIN_ICHK(e, rule, iexpr, S, T, UT)
#define IBIN_NONE(e, rule, iexpr, S, T, UT)
#define IUN_INT(e, rule, iexpr, S, T) IUN_FN(iun_##e##_##S, T, OT_##rule(T), ICVT_##rule(S, iexpr))
#define IUN_ICHK(e, rule, iexpr, S, T)
#define IUN_NONE(e, rule, iexpr, S, T)
#define IAT_INT(e, x) [TDD_OP_##e] = x,
#define IAT_ICHK(e, x)
#define IAT_NONE(e, x)

#define U uint32_t
#define IBIN_i32(e, rule, fexpr, im, iexpr) IBIN_##im(e, rule, iexpr, i32, int32_t, uint32_t)
#define IUN_i32(e, rule, fexpr, im, iexpr) IUN_##im(e, rule, iexpr, i32, int32_t)
TDD_BINARY_OPS(TDD_EW_SKIP, IBIN_i32)
TDD_UNARY_OPS(TDD_EW_SKIP, IUN_i32)
#undef U
#define U uint64_t
#define IBIN_i64(e, rule, fexpr, im, iexpr) IBIN_##im(e, rule, iexpr, i64, int64_t, uint64_t)
#define IUN_i64(e, rule, fexpr, im, iexpr) IUN_##im(e, rule, iexpr, i64, int64_t)
#define IBIN_b8(e, rule, fexpr, im, iexpr) IBIN_##im(e, rule, iexpr, b8, uint8_t, uint64_t)
/* bool takes only the unary rows with a bool output (prepare refuses the others) */
#define IUN_b8_SAME(e, im, iexpr)
#define IUN_b8_SAMEB(e, im, iexpr) IUN_##im(e, SAMEB, iexpr, b8, uint8_t)
#define IUN_b8_FLOAT(e, im, iexpr)
#define IUN_b8_FONLY(e, im, iexpr)
#define IUN_b8_BOOL(e, im, iexpr) IUN_##im(e, BOOL, iexpr, b8, uint8_t)
#define IUN_b8(e, rule, fexpr, im, iexpr) IUN_b8_##rule(e, im, iexpr)
TDD_BINARY_OPS(TDD_EW_SKIP, IBIN_i64)
TDD_UNARY_OPS(TDD_EW_SKIP, IUN_i64)
TDD_BINARY_OPS(TDD_EW_SKIP, IBIN_b8)
TDD_UNARY_OPS(TDD_EW_SKIP, IUN_b8)
#undef U

#define IBIN_AT_i32(e, rule, fexpr, im, iexpr) IAT_##im(e, ibin_##e##_i32)
#define IBIN_AT_i64(e, rule, fexpr, im, iexpr) IAT_##im(e, ibin_##e##_i64)
#define IBIN_AT_b8(e, rule, fexpr, im, iexpr) IAT_##im(e, ibin_##e##_b8)
#define IUN_AT_i32(e, rule, fexpr, im, iexpr) IAT_##im(e, iun_##e##_i32)
#define IUN_AT_i64(e, rule, fexpr, im, iexpr) IAT_##im(e, iun_##e##_i64)
#define IUN_AT_b8_SAME(e, im)
#define IUN_AT_b8_SAMEB(e, im) IAT_##im(e, iun_##e##_b8)
#define IUN_AT_b8_FLOAT(e, im)
#define IUN_AT_b8_FONLY(e, im)
#define IUN_AT_b8_BOOL(e, im) IAT_##im(e, iun_##e##_b8)
#define IUN_AT_b8(e, rule, fexpr, im, iexpr) IUN_AT_b8_##rule(e, im)
static const tdd_iter_fn fns_i32[TDD_OP_COUNT] = {TDD_BINARY_OPS(TDD_EW_SKIP, IBIN_AT_i32)
                                                      TDD_UNARY_OPS(TDD_EW_SKIP, IUN_AT_i32)};
static const tdd_iter_fn fns_i64[TDD_OP_COUNT] = {TDD_BINARY_OPS(TDD_EW_SKIP, IBIN_AT_i64)
                                                      TDD_UNARY_OPS(TDD_EW_SKIP, IUN_AT_i64)};
static const tdd_iter_fn fns_b8[TDD_OP_COUNT] = {TDD_BINARY_OPS(TDD_EW_SKIP, IBIN_AT_b8)
                                                     TDD_UNARY_OPS(TDD_EW_SKIP, IUN_AT_b8)};

/* where and masked_fill select elements without arithmetic, so one kernel per
 * element size serves every dtype. */
#define WHERE_FN(NAME, T)                                                                          \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        T *restrict y = (T *)(void *)c->y + off[0];                                                \
        const uint8_t *restrict m = (const uint8_t *)c->a + off[1];                                \
        const T *restrict a = (const T *)(const void *)c->b + off[2];                              \
        const T *restrict b = (const T *)(const void *)c->c + off[3];                              \
        if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {                                \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = m[i] ? a[i] : b[i];         \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                y[i * st[0]] = m[i * st[1]] ? a[i * st[2]] : b[i * st[3]];                         \
        }                                                                                          \
    }
WHERE_FN(where_u8, uint8_t)
WHERE_FN(where_u16, uint16_t)
WHERE_FN(where_u32, uint32_t)
WHERE_FN(where_u64, uint64_t)

/* masked_fill: y = mask ? value : x (operands y, x, mask); value is the fill's bits. */
#define FILL_FN(NAME, T)                                                                           \
    static void NAME(void *vc, int64_t n, const int64_t *off, const int64_t *st)                   \
    {                                                                                              \
        const ew_ctx *c = vc;                                                                      \
        T *restrict y = (T *)(void *)c->y + off[0];                                                \
        const T *restrict a = (const T *)(const void *)c->a + off[1];                              \
        const uint8_t *restrict m = (const uint8_t *)c->b + off[2];                                \
        T v;                                                                                       \
        memcpy(&v, &c->pat, sizeof v);                                                             \
        if (st[0] == 1 && st[1] == 1 && st[2] == 1) {                                              \
            _Pragma("omp simd") for (int64_t i = 0; i < n; i++) y[i] = m[i] ? v : a[i];            \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                y[i * st[0]] = m[i * st[2]] ? v : a[i * st[1]];                                    \
        }                                                                                          \
    }
FILL_FN(mfill_u8, uint8_t)
FILL_FN(mfill_u16, uint16_t)
FILL_FN(mfill_u32, uint32_t)
FILL_FN(mfill_u64, uint64_t)

/* The kernel for c's op in compute dtype ct (NULL: none). */
static tdd_iter_fn elem_fn(const tdd_opcall *c, td_dtype ct)
{
    size_t esz = td_dtype_size(c->out[0]->dtype);
    if (c->op == TDD_OP_WHERE)
        return esz == 1 ? where_u8 : esz == 2 ? where_u16 : esz == 4 ? where_u32 : where_u64;
    if (c->op == TDD_OP_MASKED_FILL)
        return esz == 1 ? mfill_u8 : esz == 2 ? mfill_u16 : esz == 4 ? mfill_u32 : mfill_u64;
    int v = c->args->i[0] != 0 && tdd_ew_arity(c->op) == 1; /* gelu's tanh form */
    switch (ct) {
    case TD_F32:
        return fns_f32[v][c->op];
    case TD_F64:
        return fns_f64[v][c->op];
    case TD_I32:
        return fns_i32[c->op];
    case TD_I64:
        return fns_i64[c->op];
    case TD_BOOL:
        return fns_b8[c->op];
    default:
        return NULL;
    }
}

/* f16/bf16 operands run the f32 kernels a block at a time: half inputs are
 * widened into this thread's f32 buffers, the kernel sees them at unit stride (a
 * broadcast operand keeps stride 0 and is widened once), and a half output is
 * rounded back once from f32. f32 inputs and a bool output pass through. Binary
 * ops, relu_backward and unary ops have at most three operands. */
#define HALF_OPS 3

typedef struct {
    tdd_iter_fn f32fn;
    ew_ctx x; /* the f32 kernel's context; operand pointers are set per block */
    int nops;
    td_dtype dt[HALF_OPS];    /* operand k's storage dtype (0 is the output) */
    char *y;                  /* the output's data */
    const char *in[HALF_OPS]; /* inputs' data (in[0] unused) */
} half_ew;

static _Thread_local float half_buf[HALF_OPS][CPU_HALF_BLOCK];

static void ew_input(ew_ctx *x, int k, const char *p)
{
    if (k == 1)
        x->a = p;
    else
        x->b = p;
}

static void half_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const half_ew *h = vc;
    float(*buf)[CPU_HALF_BLOCK] = half_buf;
    for (int64_t i0 = 0; i0 < n; i0 += CPU_HALF_BLOCK) {
        int64_t m = n - i0 < CPU_HALF_BLOCK ? n - i0 : CPU_HALF_BLOCK;
        ew_ctx x = h->x;
        int64_t boff[HALF_OPS], bst[HALF_OPS];
        bool yh = cpu_is_half(h->dt[0]);
        x.y = yh ? (char *)buf[0] : h->y;
        boff[0] = yh ? 0 : off[0] + i0 * st[0];
        bst[0] = yh ? 1 : st[0];
        for (int k = 1; k < h->nops; k++) {
            int64_t o = off[k] + i0 * st[k];
            if (!cpu_is_half(h->dt[k])) {
                ew_input(&x, k, h->in[k]);
                boff[k] = o;
                bst[k] = st[k];
                continue;
            }
            ew_input(&x, k, (const char *)buf[k]);
            boff[k] = 0;
            bst[k] = st[k] != 0;
            cpu_half_to_f32((const uint16_t *)(const void *)h->in[k] + o, st[k], buf[k], 1,
                            st[k] ? m : 1, h->dt[k]);
        }
        h->f32fn(&x, m, boff, bst);
        if (yh)
            cpu_f32_to_half(buf[0], 1, (uint16_t *)(void *)h->y + off[0] + i0 * st[0], st[0], m,
                            h->dt[0]);
    }
}

int cpu_elementwise(const tdd_opcall *c, int nt)
{
    const tdd_opargs *g = c->args;
    tdd_tensor *y = c->out[0];
    td_dtype ct = g->cdtype;
    bool fl = tdd_dtype_is_float(ct);
    ew_ctx x = {.y = y->st->data, .g = g};
    const tdd_tensor *ops[4] = {y};
    int nops = 1 + c->n_in;
    tdd_iter it;
    tdd_tensor scalar; /* the scalar form's "other" as a 0-dim operand */
    uint64_t spat = 0; /* its value in the compute dtype */
    bool half = false; /* some operand is f16/bf16: the f32 kernel on converted blocks */
    for (int i = 0; i < c->n_in; i++)
        ops[1 + i] = c->in[i];
    if (c->op != TDD_OP_WHERE && c->op != TDD_OP_MASKED_FILL) /* these only move bits */
        for (int k = 0; k < nops; k++)
            half = half || cpu_is_half(ops[k]->dtype);
    tdd_iter_fn fn = elem_fn(c, half ? TD_F32 : ct);
    x.alpha = g->n[1];
    if (c->op == TDD_OP_MASKED_FILL) {
        if (tdd_dtype_is_float(y->dtype))
            tdd_store_f(&x.pat, y->dtype, 0, g->f[0]);
        else
            tdd_store_i(&x.pat, y->dtype, 0, g->n[0]);
    } else if (tdd_ew_arity(c->op) == 1) {
        x.s[0] = g->f[0];
        x.s[1] = g->f[1];
        x.lo = g->n[0];
        x.hi = g->n[1];
    } else if (g->scalar_form) {
        if (fl)
            tdd_store_f(&spat, ct, 0, g->f[0]);
        else
            tdd_store_i(&spat, ct, 0, g->n[0]);
        memset(&scalar, 0, sizeof scalar);
        scalar.dtype = ct;
        ops[nops++] = &scalar;
    }
    if (!fn)
        return TD_EINTERNAL;
    tdd_iter_tensors(&it, y->shape, y->ndim, nops, ops);
    x.a = nops > 1 ? ops[1]->st ? ops[1]->st->data : NULL : NULL;
    x.b = nops > 2 ? (ops[2] == &scalar ? (const char *)&spat : ops[2]->st->data) : NULL;
    x.c = nops > 3 ? ops[3]->st->data : NULL;
    if (!half) {
        cpu_par_iter(&it, fn, &x, nt);
        return 0;
    }
    if (nops > HALF_OPS)
        return TD_EINTERNAL; /* tdd_cpu_native sends no such call */
    /* The reference rounds alpha to the compute dtype, as it does the operands. */
    tdd_opargs ga = *g;
    if (cpu_is_half(ct)) {
        uint16_t a16;
        tdd_store_f(&a16, ct, 0, g->f[1]);
        ga.f[1] = tdd_load_f(&a16, ct, 0);
    }
    x.g = &ga;
    half_ew h = {.f32fn = fn, .x = x, .nops = nops, .y = x.y, .in = {NULL, x.a, x.b}};
    for (int k = 0; k < nops; k++)
        h.dt[k] = ops[k]->dtype;
    cpu_par_iter(&it, half_run, &h, nt);
    return 0;
}

/* ---------------------------------------------------------------- copies */

typedef struct {
    char *y;
    const char *a;
    size_t esz;
    td_dtype from, to;
} cp_ctx;

static void copy_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cp_ctx *c = vc;
    char *y = c->y + (size_t)off[0] * c->esz;
    const char *a = c->a + (size_t)off[1] * c->esz;
    if (st[0] == 1 && st[1] == 1) {
        memcpy(y, a, (size_t)n * c->esz);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        memcpy(y + (size_t)(i * st[0]) * c->esz, a + (size_t)(i * st[1]) * c->esz, c->esz);
}

static void f32_to_f64_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cp_ctx *c = vc;
    double *y = (double *)(void *)c->y + off[0];
    const float *a = (const float *)(const void *)c->a + off[1];
    for (int64_t i = 0; i < n; i++)
        y[i * st[0]] = a[i * st[1]];
}

static void f64_to_f32_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cp_ctx *c = vc;
    float *y = (float *)(void *)c->y + off[0];
    const double *a = (const double *)(const void *)c->a + off[1];
    for (int64_t i = 0; i < n; i++)
        y[i * st[0]] = (float)a[i * st[1]];
}

int cpu_copy(const tdd_opcall *c, int nt)
{
    if (c->args->out_view)
        return 0; /* the daemon made the output a view: nothing to compute */
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    /* Reshape copies keep C order, so walk both as flat sequences of their own shapes:
     * iterate y's shape with a viewed through a's own C-order index. When shapes differ
     * (reshape), make the input contiguous-order-compatible by iterating a's shape. */
    cp_ctx x = {.y = y->st->data,
                .a = a->st->data,
                .esz = td_dtype_size(a->dtype),
                .from = a->dtype,
                .to = y->dtype};
    tdd_iter it;
    tdd_tensor yv = *y;
    /* y is contiguous: view it with a's shape (same numel, same C order). */
    yv.ndim = a->ndim;
    memcpy(yv.shape, a->shape, sizeof yv.shape);
    tdd_set_contiguous(&yv);
    const tdd_tensor *ops[2] = {&yv, a};
    tdd_iter_tensors(&it, a->shape, a->ndim, 2, ops);
    tdd_iter_fn fn = copy_run;
    if (a->dtype == TD_F32 && y->dtype == TD_F64)
        fn = f32_to_f64_run;
    else if (a->dtype == TD_F64 && y->dtype == TD_F32)
        fn = f64_to_f32_run;
    cpu_par_iter(&it, fn, &x, nt);
    return 0;
}

/* ---------------------------------------------------------------- creation */

typedef struct {
    char *y;
    const tdd_opargs *g;
    tdd_op op;
    bool f64;
} cr_ctx;

static void create_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cr_ctx *c = vc;
    (void)st; /* outputs of creation ops are contiguous: one run covers them */
    int64_t i0 = off[0] - 0;
    if (c->op != TDD_OP_RAND && c->op != TDD_OP_RANDN) { /* a constant: a plain fill */
        if (c->f64) {
            double *y = (double *)(void *)c->y + off[0], v = c->g->f[0];
            for (int64_t i = 0; i < n; i++)
                y[i] = v;
        } else {
            float *y = (float *)(void *)c->y + off[0], v = (float)c->g->f[0];
            for (int64_t i = 0; i < n; i++)
                y[i] = v;
        }
        return;
    }
    if (c->f64) {
        double *y = (double *)(void *)c->y + off[0];
        for (int64_t i = 0; i < n; i++) {
            uint64_t k = (uint64_t)(i0 + i);
            y[i] = c->op == TDD_OP_RAND    ? tdd_rng_uniform(c->g->seed, k)
                   : c->op == TDD_OP_RANDN ? tdd_rng_normal(c->g->seed, k)
                                           : c->g->f[0];
        }
    } else {
        float *y = (float *)(void *)c->y + off[0];
        for (int64_t i = 0; i < n; i++) {
            uint64_t k = (uint64_t)(i0 + i);
            y[i] = (float)(c->op == TDD_OP_RAND    ? tdd_rng_uniform24(c->g->seed, k)
                           : c->op == TDD_OP_RANDN ? tdd_rng_normal(c->g->seed, k)
                                                   : c->g->f[0]);
        }
    }
}

int cpu_create(const tdd_opcall *c, int nt)
{
    tdd_tensor *y = c->out[0];
    cr_ctx x = {.y = y->st->data, .g = c->args, .op = c->op, .f64 = y->dtype == TD_F64};
    /* Iterate element indices 0..n of a contiguous output whose offset is y->offset;
     * the random draw is keyed by the element index, so offset it back. */
    tdd_tensor flat = *y;
    flat.offset = 0;
    tdd_iter it;
    const tdd_tensor *ops[1] = {&flat};
    tdd_iter_tensors(&it, y->shape, y->ndim, 1, ops);
    x.y = (char *)y->st->data + (size_t)y->offset * td_dtype_size(y->dtype);
    cpu_par_iter(&it, create_run, &x, nt);
    return 0;
}
