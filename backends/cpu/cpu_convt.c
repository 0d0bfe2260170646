/* cpu_convt.c -- conv_transpose2d on the cpu backend: per image and group, one gemm makes
 * the columns (w_g^T x_g: [Co/G * kh * kw, H * W]), then col2im adds each column entry into
 * the output position its tap lands on (each entry of a tap's column to a distinct position,
 * the taps in order: a column's in-range run found once per tap, no bounds test per entry).
 * Dense
 * f32/f64 operands (f16/bf16 through f32 copies); anything else runs on the reference. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "ref/ref.h"

typedef struct {
    int64_t N, Ci, H, W, Co, Ho, Wo, KH, KW, G, sh, sw, ph, pw, dh, dw;
} convt_geom;

/* clang-format off */
#define CONVT_FN(NAME, T, F64)                                                                     \
    static int NAME(const tdd_opcall *c, const convt_geom *q)                                      \
    {                                                                                              \
        const int64_t Cig = q->Ci / q->G, Cog = q->Co / q->G, KK = q->KH * q->KW;                  \
        const int64_t L = q->H * q->W, Lo = q->Ho * q->Wo, R = Cog * KK;                           \
        const int64_t H = q->H, W = q->W, Ho = q->Ho, Wo = q->Wo, KW = q->KW, sh = q->sh;          \
        const int64_t sw = q->sw, ph = q->ph, pw = q->pw, dh = q->dh, dw = q->dw;                  \
        T *col = malloc((size_t)(R * L) * sizeof(T));                                              \
        if (!col)                                                                                  \
            return TD_ERESOURCE_EXHAUSTED;                                                         \
        const T *X = (const T *)tdd_data(c->in[0]), *Wt = (const T *)tdd_data(c->in[1]);          \
        const T *bias = (c->args->flags & 4u) ? (const T *)tdd_data(c->in[2]) : NULL;              \
        int64_t bs = bias ? c->in[2]->strides[0] : 0;                                              \
        T *Y = (T *)tdd_data(c->out[0]);                                                           \
        for (int64_t n = 0; n < q->N; n++)                                                         \
            for (int64_t gr = 0; gr < q->G; gr++) {                                                \
                cpu_gemm(F64, true, false, R, L, Cig, 1.0, Wt + gr * Cig * R, R,                   \
                         X + (n * q->Ci + gr * Cig) * L, L, 0.0, col, L);                          \
                T *yg = Y + (n * q->Co + gr * Cog) * Lo;                                           \
                for (int64_t ocl = 0; ocl < Cog; ocl++) {                                          \
                    T *yp = yg + ocl * Lo;                                                         \
                    T bv = bias ? bias[(gr * Cog + ocl) * bs] : (T)0;                              \
                    for (int64_t e = 0; e < Lo; e++)                                               \
                        yp[e] = bv;                                                                \
                    for (int64_t k = 0; k < KK; k++) {                                             \
                        const T *cr = col + (ocl * KK + k) * L;                                    \
                        const int64_t kh = k / KW, off = k % KW * dw - pw;                         \
                        /* the columns iw whose tap lands in the row: ow = iw * sw + off */        \
                        const int64_t lo = off >= 0 ? 0 : (-off + sw - 1) / sw;                    \
                        int64_t hi = Wo - 1 - off >= 0 ? (Wo - 1 - off) / sw + 1 : 0;              \
                        hi = hi < W ? hi : W;                                                      \
                        for (int64_t ih = 0; ih < H; ih++) {                                       \
                            const int64_t oh = ih * sh - ph + kh * dh;                             \
                            if (oh < 0 || oh >= Ho)                                                \
                                continue;                                                          \
                            T *restrict yr = yp + oh * Wo;                                         \
                            const T *restrict cw = cr + ih * W;                                    \
                            if (sw == 1)                                                           \
                                for (int64_t iw = lo; iw < hi; iw++)                               \
                                    yr[iw + off] += cw[iw];                                        \
                            else                                                                   \
                                for (int64_t iw = lo; iw < hi; iw++)                               \
                                    yr[iw * sw + off] += cw[iw];                                   \
                        }                                                                          \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        free(col);                                                                                 \
        return 0;                                                                                  \
    }
CONVT_FN(convt_f32, float, false)
CONVT_FN(convt_f64, double, true)
/* clang-format on */

int cpu_conv_transpose2d(const tdd_opcall *c, int nt)
{
    const tdd_tensor *x = c->in[0], *w = c->in[1], *y = c->out[0];
    const tdd_opargs *g = c->args;
    int nd = x->ndim;
    convt_geom q = {nd == 4 ? x->shape[0] : 1,
                    x->shape[nd - 3],
                    x->shape[nd - 2],
                    x->shape[nd - 1],
                    y->shape[nd - 3],
                    y->shape[nd - 2],
                    y->shape[nd - 1],
                    w->shape[2],
                    w->shape[3],
                    g->i[0],
                    g->ints[0][0],
                    g->ints[0][1],
                    g->ints[1][0],
                    g->ints[1][1],
                    g->ints[2][0],
                    g->ints[2][1]};
    int64_t R = q.Co / q.G * q.KH * q.KW, L = q.H * q.W, Cig = q.Ci / q.G;
    if (tdd_numel(y) == 0)
        return 0;
    /* beyond OpenBLAS's 32-bit sizes, or nothing to multiply: the reference loops */
    if (R == 0 || L == 0 || Cig == 0 || R > INT_MAX || L > INT_MAX || Cig > INT_MAX)
        return tdd_ref_run(c);
    (void)nt; /* the gemm is threaded; col2im stays on this thread: an OpenMP team for it,
               * right after OpenBLAS's threads, took [8, 32, 16, 16] from 1.5 ms to 82 ms */
    return x->dtype == TD_F64 ? convt_f64(c, &q) : convt_f32(c, &q);
}
