/* emu_cublas.h -- the cuBLAS calls of cublas_abi.h as the emulated build provides them
 * (runtime.cpp, on OpenBLAS): cuda.c takes these in place of dlopen'ing libcublas. Declared
 * through cublas_abi.h's function types, so the signatures cannot drift apart. */
#ifndef TDC_EMU_CUBLAS_H
#define TDC_EMU_CUBLAS_H

#include "../cublas_abi.h"

#ifdef __cplusplus
extern "C" {
#endif
tdd_cublas_create_fn tdc_emu_cublas_create;
tdd_cublas_destroy_fn tdc_emu_cublas_destroy;
tdd_cublas_set_stream_fn tdc_emu_cublas_set_stream;
tdd_cublas_sgemm_fn tdc_emu_cublas_sgemm;
tdd_cublas_sgemm_strided_batched_fn tdc_emu_cublas_sgemm_strided_batched;
tdd_cublas_status_string_fn tdc_emu_cublas_status_string;
tdd_cublas_set_math_mode_fn tdc_emu_cublas_set_math_mode;
tdd_cublas_gemm_ex_fn tdc_emu_cublas_gemm_ex;
tdd_cublas_gemm_strided_batched_ex_fn tdc_emu_cublas_gemm_strided_batched_ex;
#ifdef __cplusplus
}
#endif
#endif
