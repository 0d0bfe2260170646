/* cuda_optim.h -- the fused optimizer step of the cuda backend (cuda_optim.c). */
#ifndef TDD_CUDA_OPTIM_H
#define TDD_CUDA_OPTIM_H

#include "backend.h"
#include "kernels.h"

/* Whether the fused step takes kind (tdd_fused_hyper) on dtype dt. */
bool tdc_optim_fused(int kind, td_dtype dt);
/* The step of the n parameters (dense, on kd's device) on kd's stream: one launch per
 * dtype among them. */
cudaError_t tdc_optim_group(const tdc_dev *kd, const tdd_fused_hyper *h, const tdd_fused_param *ps,
                            size_t n);

#endif
