/* cpu_cast.c -- cast between any two dtypes, and one_hot, threaded.
 *
 * cast converts each element exactly as the reference does (ref_copy):
 * integer and bool sources are read as int64 and stored as tdd_store_i stores
 * (i32 wraps, bool tests != 0, floats go through double, so i64 -> f32 rounds
 * twice just as ref does); float sources are read as double and stored as
 * tdd_store_f stores (ints saturate with NaN -> 0, then i32 wraps; bool tests
 * != 0.0 so NaN is true; f16/bf16 round from f32). One loop per dtype pair,
 * with the conversion written out, lets the compiler vectorise the contiguous
 * runs instead of switching on both dtypes for every element. */
#include <stdatomic.h>
#include <string.h>

#include "cpu.h"
#include "dtype.h"

/* Storage type of each dtype (b8 is bool: stdbool.h makes `bool` a macro). */
#define T_f32 float
#define T_f64 double
#define T_f16 uint16_t
#define T_bf16 uint16_t
#define T_i32 int32_t
#define T_i64 int64_t
#define T_b8 uint8_t

#define E_f32 TD_F32
#define E_f64 TD_F64
#define E_f16 TD_F16
#define E_bf16 TD_BF16
#define E_i32 TD_I32
#define E_i64 TD_I64
#define E_b8 TD_BOOL

/* How ref reads a source: F (as double, tdd_load_f) or I (as int64, tdd_load_i). */
#define K_f32 F
#define K_f64 F
#define K_f16 F
#define K_bf16 F
#define K_i32 I
#define K_i64 I
#define K_b8 I

/* ref widens f32 to double and back, which sets the quiet bit of a signalling
 * NaN; the compiler folds that round trip away here, so quiet it explicitly. */
static inline float quiet_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u |= (u & 0x7fffffffu) > 0x7f800000u ? 0x400000u : 0u;
    memcpy(&f, &u, sizeof f);
    return f;
}

#define LD_f32(x) ((double)quiet_f32(x))
#define LD_f64(x) (x)
#define LD_f16(x) ((double)quiet_f32(tdd_f16_to_f32(x)))
#define LD_bf16(x) ((double)quiet_f32(tdd_bf16_to_f32(x)))
#define LD_i32(x) ((int64_t)(x))
#define LD_i64(x) (x)
#define LD_b8(x) ((int64_t)((x) != 0))

/* ST_<kind>_<dst>: tdd_store_f (kind F, v double) or tdd_store_i (kind I, v int64). */
#define ST_F_f32(v) ((float)(v))
#define ST_I_f32(v) ((float)(double)(v))
#define ST_F_f64(v) (v)
#define ST_I_f64(v) ((double)(v))
#define ST_F_f16(v) tdd_f32_to_f16((float)(v))
#define ST_I_f16(v) tdd_f32_to_f16((float)(double)(v))
#define ST_F_bf16(v) tdd_f32_to_bf16((float)(v))
#define ST_I_bf16(v) tdd_f32_to_bf16((float)(double)(v))
#define ST_F_b8(v) ((uint8_t)((v) != 0.0))
#define ST_I_b8(v) ((uint8_t)((v) != 0))
#define ST_F_i32(v) ((int32_t)(uint32_t)(uint64_t)tdd_sat_i64(v))
#define ST_I_i32(v) ((int32_t)(uint32_t)(uint64_t)(v))
#define ST_F_i64(v) tdd_sat_i64(v)
#define ST_I_i64(v) (v)

/* Indirection so K_<src> expands to F or I before it is pasted. */
#define ST(K, D, v) ST2(K, D, v)
#define ST2(K, D, v) ST_##K##_##D(v)

typedef void (*cast_fn)(const void *a, int64_t as, void *y, int64_t ys, int64_t n);

#define CAST_FN(S, D)                                                                              \
    static void cast_##S##_##D(const void *av, int64_t as, void *yv, int64_t ys, int64_t n)        \
    {                                                                                              \
        const T_##S *restrict a = av;                                                              \
        T_##D *restrict y = yv;                                                                    \
        if (as == 1 && ys == 1) {                                                                  \
            for (int64_t i = 0; i < n; i++)                                                        \
                y[i] = ST(K_##S, D, LD_##S(a[i]));                                                 \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++)                                                        \
                y[i * ys] = ST(K_##S, D, LD_##S(a[i * as]));                                       \
        }                                                                                          \
    }

#define EACH_DST(M, S) M(S, f32) M(S, f64) M(S, f16) M(S, bf16) M(S, i32) M(S, i64) M(S, b8)
#define EACH_PAIR(M)                                                                               \
    EACH_DST(M, f32)                                                                               \
    EACH_DST(M, f64)                                                                               \
    EACH_DST(M, f16)                                                                               \
    EACH_DST(M, bf16)                                                                              \
    EACH_DST(M, i32)                                                                               \
    EACH_DST(M, i64)                                                                               \
    EACH_DST(M, b8)

EACH_PAIR(CAST_FN)

#define CAST_ENTRY(S, D) [E_##S][E_##D] = cast_##S##_##D,
static const cast_fn cast_table[TD_DTYPE_COUNT][TD_DTYPE_COUNT] = {EACH_PAIR(CAST_ENTRY)};

typedef struct {
    cast_fn fn;
    char *y;
    const char *a;
    size_t ysz, asz;
} cast_ctx;

static void cast_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const cast_ctx *c = vc;
    void *y = c->y + (size_t)off[0] * c->ysz;
    const void *a = c->a + (size_t)off[1] * c->asz;
    /* Not cpu_half_to_f32 and friends: they differ from ref on NaN payloads. */
    c->fn(a, st[1], y, st[0], n);
}

int cpu_cast(const tdd_opcall *c, int nt)
{
    if (c->args->out_view)
        return 0; /* the daemon made the output a view: nothing to compute */
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    cast_ctx x = {.fn = cast_table[a->dtype][y->dtype],
                  .y = y->st->data,
                  .a = a->st->data,
                  .ysz = td_dtype_size(y->dtype),
                  .asz = td_dtype_size(a->dtype)};
    if (!x.fn)
        return TD_EINTERNAL; /* tdd_cpu_native sends only the seven dtypes */
    const tdd_tensor *ops[2] = {y, a};
    tdd_iter it;
    tdd_iter_tensors(&it, y->shape, y->ndim, 2, ops);
    cpu_par_iter(&it, cast_run, &x, nt);
    return 0;
}

/* ---------------------------------------------------------------- one_hot */

typedef struct {
    const void *idx;
    td_dtype dt;
    int64_t *y; /* contiguous [rows, C] */
    int64_t C, row;
    bool bad;
} oh_ctx;

/* Rows are visited in C order of the index, so a cursor gives each run's row. */
static void one_hot_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    oh_ctx *c = vc;
    for (int64_t i = 0; i < n; i++, c->row++) {
        int64_t k = tdd_load_i(c->idx, c->dt, off[0] + i * st[0]);
        int64_t *r = c->y + c->row * c->C;
        memset(r, 0, (size_t)c->C * sizeof *r);
        if (k < 0 || k >= c->C)
            c->bad = true; /* ref's error; the rest is still written, which is harmless */
        else
            r[k] = 1;
    }
}

typedef struct {
    const tdd_iter *it;
    const oh_ctx *proto;
    int64_t rows;
    _Atomic int bad;
} oh_job;

static void one_hot_part(void *arg, int t, int nt)
{
    oh_job *j = arg;
    oh_ctx x = *j->proto;
    int64_t lo, hi;
    cpu_split(j->rows, t, nt, &lo, &hi);
    x.row = lo;
    tdd_iter_range(j->it, lo, hi, one_hot_run, &x);
    if (x.bad)
        atomic_store(&j->bad, 1);
}

int cpu_one_hot(const tdd_opcall *c, int nt)
{
    const tdd_tensor *a = c->in[0];
    tdd_tensor *y = c->out[0];
    int64_t C = c->args->i[0], rows = tdd_numel(a);
    if (y->dtype != TD_I64 || !tdd_is_contiguous(y) || C <= 0)
        return TD_EINTERNAL; /* tdd_cpu_native sends no such call */
    tdd_iter it;
    const tdd_tensor *ops[1] = {a};
    tdd_iter_tensors(&it, a->shape, a->ndim, 1, ops);
    oh_ctx proto = {.idx = a->st->data, .dt = a->dtype, .y = (int64_t *)tdd_data(y), .C = C};
    if (rows * C < CPU_PAR_MIN || nt <= 1 || rows <= 1) {
        tdd_iter_range(&it, 0, rows, one_hot_run, &proto);
        return proto.bad ? TD_EINVALID_ARGUMENT : 0;
    }
    if (rows < nt)
        nt = (int)rows;
    oh_job jb = {&it, &proto, rows, 0};
    cpu_parallel(nt, one_hot_part, &jb);
    return atomic_load(&jb.bad) ? TD_EINVALID_ARGUMENT : 0;
}
