/* cublas_abi.h -- the slice of cuBLAS's C ABI the cuda backend calls through dlopen.
 *
 * cuBLAS is opened at run time, never linked, so building the backend needs only nvcc and
 * the CUDA runtime's headers. A toolkit installed without cuBLAS's headers (seen on a CI
 * machine: nvcc and cudart present, cublas_v2.h absent) still builds the daemon; the
 * declarations below stand in for the header there. Where cublas_v2.h is present
 * (TDD_HAVE_CUBLAS_H, set by the Makefile's probe) it is included instead and every
 * function pointer type below is checked against its prototype, so a signature change in
 * a new toolkit fails the build rather than a GEMM. */
#ifndef TDD_CUBLAS_ABI_H
#define TDD_CUBLAS_ABI_H

/* The toolkit's headers test macros that C leaves undefined (-Wundef). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <cuda_runtime_api.h>
#if defined(TDD_HAVE_CUBLAS_H) && TDD_HAVE_CUBLAS_H
#include <cublas_v2.h>
#endif
#pragma GCC diagnostic pop

#if !(defined(TDD_HAVE_CUBLAS_H) && TDD_HAVE_CUBLAS_H)
/* Values and layouts from cuBLAS's documented C API (cublas_api.h, CUDA 12 and 13). */
typedef struct cublasContext *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
#ifdef TDC_EMU
/* (library_types.h's, which the emulated build has no toolkit for) */
typedef enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
#else
#include <library_types.h>
#endif
#endif

typedef cublasStatus_t tdd_cublas_create_fn(cublasHandle_t *handle);
typedef cublasStatus_t tdd_cublas_destroy_fn(cublasHandle_t handle);
typedef cublasStatus_t tdd_cublas_set_stream_fn(cublasHandle_t handle, cudaStream_t stream);
typedef cublasStatus_t tdd_cublas_sgemm_fn(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const float *alpha, const float *a, int lda,
                                           const float *b, int ldb, const float *beta, float *c,
                                           int ldc);
typedef cublasStatus_t tdd_cublas_sgemm_strided_batched_fn(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const float *alpha, const float *a, int lda, long long stride_a, const float *b, int ldb,
    long long stride_b, const float *beta, float *c, int ldc, long long stride_c, int batch);
typedef const char *tdd_cublas_status_string_fn(cublasStatus_t status);
typedef cublasStatus_t tdd_cublas_set_math_mode_fn(cublasHandle_t handle, cublasMath_t mode);
/* f16/bf16 operands with f32 accumulation (computeType CUBLAS_COMPUTE_32F), alpha and beta
 * floats. */
typedef cublasStatus_t tdd_cublas_gemm_ex_fn(cublasHandle_t handle, cublasOperation_t transa,
                                             cublasOperation_t transb, int m, int n, int k,
                                             const void *alpha, const void *a, cudaDataType atype,
                                             int lda, const void *b, cudaDataType btype, int ldb,
                                             const void *beta, void *c, cudaDataType ctype, int ldc,
                                             cublasComputeType_t compute, cublasGemmAlgo_t algo);
typedef cublasStatus_t tdd_cublas_gemm_strided_batched_ex_fn(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *a, cudaDataType atype, int lda, long long stride_a,
    const void *b, cudaDataType btype, int ldb, long long stride_b, const void *beta, void *c,
    cudaDataType ctype, int ldc, long long stride_c, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t algo);

#if defined(TDD_HAVE_CUBLAS_H) && TDD_HAVE_CUBLAS_H
#define TDD_CUBLAS_SAME(fn, type)                                                                  \
    _Static_assert(__builtin_types_compatible_p(__typeof__(fn) *, type *),                         \
                   #fn " no longer matches " #type)
TDD_CUBLAS_SAME(cublasCreate_v2, tdd_cublas_create_fn);
TDD_CUBLAS_SAME(cublasDestroy_v2, tdd_cublas_destroy_fn);
TDD_CUBLAS_SAME(cublasSetStream_v2, tdd_cublas_set_stream_fn);
TDD_CUBLAS_SAME(cublasSgemm_v2, tdd_cublas_sgemm_fn);
TDD_CUBLAS_SAME(cublasSgemmStridedBatched, tdd_cublas_sgemm_strided_batched_fn);
TDD_CUBLAS_SAME(cublasGetStatusString, tdd_cublas_status_string_fn);
TDD_CUBLAS_SAME(cublasSetMathMode, tdd_cublas_set_math_mode_fn);
TDD_CUBLAS_SAME(cublasGemmEx, tdd_cublas_gemm_ex_fn);
TDD_CUBLAS_SAME(cublasGemmStridedBatchedEx, tdd_cublas_gemm_strided_batched_ex_fn);
#undef TDD_CUBLAS_SAME
#endif

#endif
