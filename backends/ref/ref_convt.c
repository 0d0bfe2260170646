/* ref_convt.c -- the reference conv_transpose2d, in gather form: each output element sums
 * the inputs whose strided, dilated kernel taps land on it (in double). */
#include "ref.h"

/* The storage offset of (n, c, h, w) in a [N, C, H, W] or [C, H, W] tensor. */
static int64_t at_nchw(const tdd_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w)
{
    int b = t->ndim == 4;
    return t->offset + (b ? n * t->strides[0] : 0) + c * t->strides[b] + h * t->strides[b + 1] +
           w * t->strides[b + 2];
}

int ref_conv_transpose2d(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    const tdd_tensor *x = c->in[0], *w = c->in[1], *bias = (g->flags & 4u) ? c->in[2] : NULL;
    tdd_tensor *y = c->out[0];
    int nd = x->ndim;
    int64_t N = nd == 4 ? x->shape[0] : 1, Ci = x->shape[nd - 3];
    int64_t H = x->shape[nd - 2], W = x->shape[nd - 1], Ho = y->shape[nd - 2],
            Wo = y->shape[nd - 1];
    int64_t G = g->i[0], Cig = Ci / G, Cog = w->shape[1], Co = Cog * G;
    int64_t KH = w->shape[2], KW = w->shape[3];
    const int64_t *st = g->ints[0], *pd = g->ints[1], *dl = g->ints[2];
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < Co; oc++)
            for (int64_t oh = 0; oh < Ho; oh++)
                for (int64_t ow = 0; ow < Wo; ow++) {
                    int64_t grp = oc / Cog, ocl = oc % Cog;
                    double acc = bias ? ref_getf(bias, ref_index(bias, oc)) : 0.0;
                    for (int64_t kh = 0; kh < KH; kh++) {
                        int64_t th = oh + pd[0] - kh * dl[0];
                        if (th < 0 || th % st[0] != 0 || th / st[0] >= H)
                            continue;
                        for (int64_t kw = 0; kw < KW; kw++) {
                            int64_t tw = ow + pd[1] - kw * dl[1];
                            if (tw < 0 || tw % st[1] != 0 || tw / st[1] >= W)
                                continue;
                            for (int64_t icl = 0; icl < Cig; icl++) {
                                int64_t ic = grp * Cig + icl;
                                acc += ref_getf(x, at_nchw(x, n, ic, th / st[0], tw / st[1])) *
                                       ref_getf(w, at_nchw(w, ic, ocl, kh, kw));
                            }
                        }
                    }
                    ref_setf(y, at_nchw(y, n, oc, oh, ow), acc);
                }
    return 0;
}
