/* cuda_optim.c -- the cuda backend's fused optimizer step: a group of parameters as one
 * fused_optim.cu launch per dtype, with the step's scalars rounded as optim.c's host loop
 * rounds them (cuda.c binds the call to the session's stream first). */
#include "cuda_optim.h"

#include <math.h>
#include <stdlib.h>

#include "fused_optim.h"

bool tdc_optim_fused(int kind, td_dtype dt)
{
    return kind >= 0 && kind <= 2 && (dt == TD_F32 || dt == TD_F64);
}

cudaError_t tdc_optim_group(const tdc_dev *kd, const tdd_fused_hyper *h, const tdd_fused_param *ps,
                            size_t n)
{
    if (n > INT32_MAX)
        return cudaErrorInvalidValue;
    tdc_fused_param *tab = malloc(sizeof *tab * (n ? n : 1));
    if (!tab)
        return cudaErrorMemoryAllocation;
    tdc_fused_hyper kh = {.kind = h->kind,
                          .nesterov = h->nesterov,
                          .maximize = h->maximize,
                          .amsgrad = h->amsgrad,
                          .lr = h->lr,
                          .momentum = h->momentum,
                          .dampening = h->dampening,
                          .weight_decay = h->weight_decay,
                          .beta1 = h->beta1,
                          .beta2 = h->beta2,
                          .eps = h->eps};
    cudaError_t e = cudaSuccess;
    static const td_dtype dts[] = {TD_F32, TD_F64};
    for (size_t d = 0; d < 2 && e == cudaSuccess; d++) {
        int m = 0;
        for (size_t i = 0; i < n; i++) {
            const tdd_fused_param *q = &ps[i];
            if (q->p->dtype != dts[d])
                continue;
            tdc_fused_param *t = &tab[m++];
            t->p = tdd_data(q->p);
            t->g = tdd_data(q->g);
            for (int k = 0; k < 3; k++)
                t->b[k] = q->buf[k] ? tdd_data(q->buf[k]) : NULL;
            t->n = tdd_numel(q->p);
            t->fresh = q->fresh;
            /* optim.c's loop: (T)(lr / bc1) and (T)sqrt(bc2), from doubles */
            t->step_size = h->lr / (1.0 - pow(h->beta1, (double)q->step));
            t->bc2s = sqrt(1.0 - pow(h->beta2, (double)q->step));
        }
        if (m)
            e = tdc_fused_optim(kd, dts[d] == TD_F32 ? 1 : 2, &kh, tab, m);
    }
    free(tab);
    return e;
}
