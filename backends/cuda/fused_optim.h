/* fused_optim.h -- the C boundary of fused_optim.cu: one optimizer step of many parameters
 * in one kernel launch (torch's fused/foreach optimizers, multi-tensor apply).
 *
 * Plain structs, as kernels.h: the update is optim.c's host loop for SGD (momentum,
 * dampening, Nesterov), Adam and AdamW (amsgrad), element for element in the parameter's
 * dtype with the same scalars rounded once, each product and sum rounded on its own (no
 * contraction into FMAs), so the bits equal the cpu backend's step. */
#ifndef TDD_CUDA_FUSED_OPTIM_H
#define TDD_CUDA_FUSED_OPTIM_H

#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int kind; /* 0 SGD, 1 Adam, 2 AdamW (optim.h's opt_kind) */
    int nesterov, maximize, amsgrad;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
} tdc_fused_hyper;

/* One parameter: dense p, g and state buffers of n elements (b[k] NULL where the kind keeps
 * none; bit k of fresh: b[k] holds nothing yet, read as the first step reads it). */
typedef struct {
    void *p;
    const void *g;
    void *b[3];
    int64_t n;
    unsigned fresh;
    double step_size, bc2s; /* Adam(W): lr / (1 - beta1^step), sqrt(1 - beta2^step) */
} tdc_fused_param;

/* The step of n parameters of dtype dt (1 f32, 2 f64) in one launch on d's stream; the
 * table travels to the device with it (stream-ordered scratch). */
cudaError_t tdc_fused_optim(const tdc_dev *d, int dt, const tdc_fused_hyper *h,
                            const tdc_fused_param *ps, int n);

#ifdef __cplusplus
}
#endif
#endif
