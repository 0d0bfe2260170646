/* cpu_blas.c -- matmul, bmm and linear through OpenBLAS (sgemm/dgemm): batch
 * dims that fold into M become one GEMM, other batches loop; operands whose
 * strides BLAS cannot take are packed first. */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* Can a rows x cols matrix with strides (rs, cs) go to row-major BLAS as is? */
static bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs, bool *trans,
                        int64_t *ld)
{
    if (rows == 1 && cs == 1) {
        *trans = false;
        *ld = cols > 0 ? cols : 1;
        return true;
    }
    if (rows == 1 && cs >= 1) { /* one row read as a column of the transpose */
        *trans = true;
        *ld = cs;
        return true;
    }
    if ((cs == 1 || cols == 1) && rs >= cols && rs >= 1) {
        *trans = false;
        *ld = rs;
        return true;
    }
    if ((rs == 1 || rows == 1) && cs >= rows && cs >= 1) {
        *trans = true;
        *ld = cs;
        return true;
    }
    return false;
}

/* OpenBLAS runs single-threaded (cpu_init): its idle threads spin in
 * sched_yield for milliseconds after every call, which on a small machine
 * takes the cores from the client and from other sessions' small ops. Large
 * GEMMs are split here over OpenMP threads instead, which sleep soon. */
int tdd_cpu_gemm_threads = 1;

/* Below this many flops one thread is faster than waking a team. */
#define GEMM_PAR_FLOPS (8.0 * 1024 * 1024)

static void gemm_call(bool f64, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                      const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C,
                      int64_t ldc)
{
    enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    if (f64)
        cblas_dgemm(CblasRowMajor, TA, TB, (blasint)M, (blasint)N, (blasint)K, alpha,
                    (const double *)A, (blasint)lda, (const double *)B, (blasint)ldb, beta,
                    (double *)C, (blasint)ldc);
    else
        cblas_sgemm(CblasRowMajor, TA, TB, (blasint)M, (blasint)N, (blasint)K, (float)alpha,
                    (const float *)A, (blasint)lda, (const float *)B, (blasint)ldb, (float)beta,
                    (float *)C, (blasint)ldc);
}

typedef struct {
    bool f64, ta, tb;
    int64_t M, N, K;
    double alpha;
    const void *A;
    int64_t lda;
    const void *B;
    int64_t ldb;
    double beta;
    void *C;
    int64_t ldc;
} gemm_job;

/* Where thread p's block starts, on a 64-row (or column) grid (whole blocks for BLAS's
 * tiles). The blocks are a function of the shape and nt (--threads) only: a BLAS may sum an
 * element of C in an order that depends on its call's shape, so the thread count is one of
 * the settings that may change bits, and nothing else about the run may. */
static int64_t part_start(int64_t total, int p, int nt)
{
    return p >= nt ? total : total * p / nt / 64 * 64;
}

static void gemm_part(void *arg, int p, int nt)
{
    const gemm_job *j = arg;
    size_t esz = j->f64 ? 8 : 4;
    bool by_rows = j->M >= j->N;
    int64_t total = by_rows ? j->M : j->N;
    int64_t lo = part_start(total, p, nt), hi = part_start(total, p + 1, nt);
    if (hi <= lo)
        return;
    if (by_rows)
        gemm_call(j->f64, j->ta, j->tb, hi - lo, j->N, j->K, j->alpha,
                  (const char *)j->A + (size_t)(j->ta ? lo : lo * j->lda) * esz, j->lda, j->B,
                  j->ldb, j->beta, (char *)j->C + (size_t)(lo * j->ldc) * esz, j->ldc);
    else
        gemm_call(j->f64, j->ta, j->tb, j->M, hi - lo, j->K, j->alpha, j->A, j->lda,
                  (const char *)j->B + (size_t)(j->tb ? lo * j->ldb : lo) * esz, j->ldb, j->beta,
                  (char *)j->C + (size_t)lo * esz, j->ldc);
}

void cpu_gemm(bool f64, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
              const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C,
              int64_t ldc)
{
    int nt = tdd_cpu_gemm_threads;
    if (nt <= 1 || 2.0 * (double)M * (double)N * (double)K < GEMM_PAR_FLOPS) {
        gemm_call(f64, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* Row blocks of C (and A), or column blocks of C (and B): whichever is longer. */
    gemm_job j = {f64, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
    cpu_parallel(nt, gemm_part, &j);
}

typedef struct {
    const tdd_opcall *c;
    tdd_tensor a, b, y;
    int nb;
    int64_t M, K, N;
    bool f64;
    double beta;
} mm_ctx;

/* Copies a rows x cols strided matrix into dst (row-major). */
static void pack(const void *src, int64_t off, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                 void *dst, bool f64)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t s = off + i * rs + j * cs;
            if (f64)
                ((double *)dst)[i * cols + j] = ((const double *)src)[s];
            else
                ((float *)dst)[i * cols + j] = ((const float *)src)[s];
        }
}

/* One GEMM: y[yo] (M x N, contiguous) = a[ao] (M x K) @ b[bo] (K x N) + beta*y. */
static int gemm1(const mm_ctx *m, int64_t M, int64_t ao, int64_t ars, int64_t bo, int64_t yo)
{
    int64_t K = m->K, N = m->N, nb = m->nb;
    int64_t acs = m->a.strides[nb + 1], brs = m->b.strides[nb], bcs = m->b.strides[nb + 1];
    bool ta, tb;
    int64_t lda, ldb;
    void *pa = NULL, *pb = NULL;
    size_t esz = m->f64 ? 8 : 4;
    const char *A = (const char *)m->a.st->data + (size_t)ao * esz;
    const char *B = (const char *)m->b.st->data + (size_t)bo * esz;
    char *Y = (char *)m->y.st->data + (size_t)yo * esz;
    if (!blas_layout(M, K, ars, acs, &ta, &lda)) {
        if (!(pa = malloc((size_t)(M * K) * esz)))
            return TD_ERESOURCE_EXHAUSTED;
        pack(m->a.st->data, ao, M, K, ars, acs, pa, m->f64);
        A = pa;
        ta = false;
        lda = K;
    }
    if (!blas_layout(K, N, brs, bcs, &tb, &ldb)) {
        if (!(pb = malloc((size_t)(K * N) * esz))) {
            free(pa);
            return TD_ERESOURCE_EXHAUSTED;
        }
        pack(m->b.st->data, bo, K, N, brs, bcs, pb, m->f64);
        B = pb;
        tb = false;
        ldb = N;
    }
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || lda > INT_MAX || ldb > INT_MAX) {
        free(pa);
        free(pb);
        return TD_EUNSUPPORTED_OP; /* beyond OpenBLAS's 32-bit sizes */
    }
    cpu_gemm(m->f64, ta, tb, M, N, K, 1.0, A, lda, B, ldb, m->beta, Y, N > 0 ? N : 1);
    free(pa);
    free(pb);
    return 0;
}

typedef struct {
    const mm_ctx *m;
    int rc;
} batch_ctx;

static void batch_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    batch_ctx *b = vc;
    for (int64_t i = 0; i < n && !b->rc; i++)
        b->rc = gemm1(b->m, b->m->M, off[1] + i * st[1], b->m->a.strides[b->m->nb],
                      off[2] + i * st[2], off[0] + i * st[0]);
}

/* y = bias broadcast (linear), so the GEMMs can add onto it with beta = 1. */
static void fill_bias(const tdd_opcall *c, bool f64)
{
    tdd_tensor *y = c->out[0];
    const tdd_tensor *bias = c->in[2];
    int64_t n = tdd_numel(y), idx[TD_MAX_NDIM], st[TD_MAX_NDIM];
    tdd_bcast_strides(bias, y->shape, y->ndim, st);
    /* Row by row: the bias offset of a row's start costs divisions, its elements
     * one stride each (a per-element index was 15% of a small MLP step's time). */
    int last = y->ndim - 1;
    int64_t cols = y->ndim ? y->shape[last] : 1, cs = y->ndim ? st[last] : 0;
    size_t esz = f64 ? 8 : 4;
    char *out = (char *)y->st->data + (size_t)y->offset * esz;
    const char *src = (const char *)bias->st->data;
    for (int64_t i = 0; cols > 0 && i < n; i += cols) {
        int64_t r = i / cols, off = bias->offset;
        for (int d = last - 1; d >= 0; d--) {
            idx[d] = r % y->shape[d];
            r /= y->shape[d];
            off += idx[d] * st[d];
        }
        if (cs == 1) {
            memcpy(out + (size_t)i * esz, src + (size_t)off * esz, (size_t)cols * esz);
        } else if (f64) {
            for (int64_t j = 0; j < cols; j++)
                ((double *)out)[i + j] = ((const double *)src)[off + j * cs];
        } else {
            for (int64_t j = 0; j < cols; j++)
                ((float *)out)[i + j] = ((const float *)src)[off + j * cs];
        }
    }
}

int cpu_matmul(const tdd_opcall *c)
{
    mm_ctx m = {.c = c, .f64 = c->in[0]->dtype == TD_F64};
    tdd_matmul_views(c, &m.a, &m.b, &m.y);
    m.nb = (int)c->args->i[3];
    m.M = c->args->i[0];
    m.K = c->args->i[1];
    m.N = c->args->i[2];
    int nb = m.nb;
    int64_t n = tdd_numel(&m.y);
    if (n == 0)
        return 0;
    if (c->args->flags & 4u) {
        fill_bias(c, m.f64);
        m.beta = 1.0;
    } else if (m.K == 0) {
        memset((char *)m.y.st->data + (size_t)m.y.offset * (m.f64 ? 8 : 4), 0,
               (size_t)n * (m.f64 ? 8 : 4));
        return 0;
    }
    if (m.K == 0)
        return 0;
    /* Fold the batch into M when b is shared by every batch and a's batch dims step
     * through memory like extra rows. */
    bool fold = true, have = false;
    int64_t rows = 1, rs = m.K;
    for (int d = nb; d >= 0 && fold; d--) {
        int64_t size = d == nb ? m.M : m.a.shape[d], stride = m.a.strides[d];
        if (d < nb && m.b.strides[d] != 0 && m.b.shape[d] != 1)
            fold = false;
        else if (size == 1)
            continue;
        else if (!have) {
            rs = stride;
            rows = size;
            have = true;
        } else if (stride == rs * rows) {
            rows *= size;
        } else {
            fold = false;
        }
    }
    if (fold && (rs != 0 || rows == 1))
        return gemm1(&m, rows, m.a.offset, rs, m.b.offset, m.y.offset);
    /* Loop over the batch: y, a, b base offsets from an iteration over batch dims. */
    int64_t st[3][TD_MAX_NDIM], base[3] = {m.y.offset, m.a.offset, m.b.offset};
    for (int d = 0; d < nb; d++) {
        st[0][d] = m.y.strides[d];
        st[1][d] = m.a.strides[d];
        st[2][d] = m.b.strides[d];
    }
    tdd_iter it;
    tdd_iter_init(&it, 3, m.y.shape, nb, (const int64_t(*)[TD_MAX_NDIM])st, base);
    batch_ctx b = {&m, 0};
    tdd_iter_range(&it, 0, it.numel, batch_run, &b);
    return b.rc;
}
