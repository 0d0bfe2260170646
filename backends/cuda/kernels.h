/* kernels.h -- the C boundary between cuda.c (vtable, cuBLAS) and kernels.cu (device code).
 *
 * Plain structs and our own op codes only: nvcc compiles C++ and must never see the
 * daemon's C11 headers (tensor.h uses <stdatomic.h>). Every function enqueues work on
 * the device's stream and returns at once; a cudaError_t other than cudaSuccess is a
 * launch or allocation failure, and kernel faults surface at the next stream sync. */
#ifndef TDD_CUDA_KERNELS_H
#define TDD_CUDA_KERNELS_H

#include <stdint.h>

#include "opcodes.h"

/* The toolkit's headers test macros that C leaves undefined (-Wundef). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <cuda_runtime_api.h>
#pragma GCC diagnostic pop

/* kernel<<<grid, block, shmem, stream>>>(args) is written tdc_launch(grid, block, shmem, stream,
 * kernel)(args) in kernels.cu: the same launch under nvcc, and a call into the emulator's
 * scheduler where the host compiler builds the device code (`make emu`, backends/cuda/emu/,
 * whose cuda_runtime.h defines it first). */
#if defined(__CUDACC__) && !defined(tdc_launch)
#define tdc_launch(grid, block, shmem, stream, ...) __VA_ARGS__<<<grid, block, shmem, stream>>>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define TDC_MAX_DIMS 8
#define TDC_MAX_OPS 4

/* What a launch needs to know about its device. */
typedef struct {
    cudaStream_t stream;
    int sms; /* multiprocessors: sizes grid-stride launches */
} tdc_dev;

/* Up to TDC_MAX_OPS operands walked together over one shape in C order; operand 0 is
 * the output. Strides in elements (0 = broadcast); pointers already point at element 0.
 * contig: every operand is dense in C order, so the kernels skip index arithmetic. */
typedef struct {
    int ndim; /* >= 1 */
    int contig;
    int64_t numel;
    int64_t shape[TDC_MAX_DIMS];
    int64_t strides[TDC_MAX_OPS][TDC_MAX_DIMS];
} tdc_layout;

/* Elementwise ops are the op table's (opcodes.h, plain C): tdc_binary takes the ops of
 * TDD_BINARY_OPS, tdc_unary those of TDD_UNARY_OPS, on f32; a BOOL rule writes bool bytes. */
/* y = a op b (b == NULL: the scalar form, b = scalar); alpha scales b in add/sub. */
cudaError_t tdc_binary(const tdc_dev *d, tdd_op op, const tdc_layout *l, void *y, const float *a,
                       const float *b, float scalar, float alpha);
/* p0, p1 and variant as elementwise.h's expressions name them (tdd_opargs f[0], f[1], i[0]). */
cudaError_t tdc_unary(const tdc_dev *d, tdd_op op, const tdc_layout *l, void *y, const float *x,
                      float p0, float p1, int variant);
/* where(cond, a, b): operands y, cond (bool bytes), a, b. */
cudaError_t tdc_where(const tdc_dev *d, const tdc_layout *l, float *y, const uint8_t *cond,
                      const float *a, const float *b);
/* masked_fill: operands y, x, mask. */
cudaError_t tdc_masked_fill(const tdc_dev *d, const tdc_layout *l, float *y, const float *x,
                            const uint8_t *mask, float value);

/* Element copy between two layouts of elsize-byte elements (1, 2, 4 or 8): operands y, x. */
cudaError_t tdc_copy(const tdc_dev *d, const tdc_layout *l, void *y, const void *x, int elsize);
/* Conversion between dtypes (td_dtype numbers); float->int saturates, NaN -> 0. */
cudaError_t tdc_cast(const tdc_dev *d, const tdc_layout *l, void *y, int ydt, const void *x,
                     int xdt);
/* Fills n contiguous elsize-byte elements with the bit pattern in the low bytes of bits. */
cudaError_t tdc_fill(const tdc_dev *d, void *y, int64_t n, int elsize, uint64_t bits);
/* y[i] = start + i*step (f32); linspace passes end and n so the second half counts down. */
cudaError_t tdc_arange_f32(const tdc_dev *d, float *y, int64_t n, double start, double step);
cudaError_t tdc_linspace_f32(const tdc_dev *d, float *y, int64_t n, double start, double end);
cudaError_t tdc_arange_i64(const tdc_dev *d, int64_t *y, int64_t n, int64_t start, int64_t step);
/* rows x cols identity (C order), any element size. */
cudaError_t tdc_eye(const tdc_dev *d, void *y, int64_t rows, int64_t cols, int elsize,
                    uint64_t one);

/* tril (upper = 0) / triu (upper = 1) over the last two dims (rows x cols) of a C-order
 * output: operands y, x; elements off the kept triangle become 0. */
cudaError_t tdc_tri(const tdc_dev *d, const tdc_layout *l, void *y, const void *x, int elsize,
                    int64_t rows, int64_t cols, int64_t diagonal, int upper);

/* The counter-based draws of backends/dtype.h, value i of stream seed: uniform [0, 1) with
 * 24 bits (f32), standard normal (f32), or lo + u % range (i64). */
typedef enum { TDC_RAND, TDC_RANDN, TDC_RANDINT } tdc_random;
cudaError_t tdc_random_fill(const tdc_dev *d, tdc_random kind, void *y, int64_t n, uint64_t seed,
                            int64_t lo, uint64_t range);

/* A reduction: the input split into kept dims (one output each, outputs contiguous in C
 * order of the kept dims) and reduced dims. */
typedef struct {
    int nk, nr; /* >= 1 each (a size-1 dim stands in for none) */
    int64_t nout, nred;
    int64_t kshape[TDC_MAX_DIMS], kstride[TDC_MAX_DIMS];
    int64_t rshape[TDC_MAX_DIMS], rstride[TDC_MAX_DIMS];
} tdc_reduce_layout;

typedef enum { TDC_R_SUM, TDC_R_PROD, TDC_R_MAX, TDC_R_MIN } tdc_combine;
/* What each element becomes before combining; aux holds one float per output. */
typedef enum { TDC_M_ID, TDC_M_EXP_SUB_AUX, TDC_M_SQDEV_AUX } tdc_map;
/* What the combined value becomes: scale*v, log(v)+aux, sqrt(scale*v). */
typedef enum { TDC_F_SCALE, TDC_F_LOG_ADD_AUX, TDC_F_SQRT_SCALE } tdc_finish;

cudaError_t tdc_reduce(const tdc_dev *d, const tdc_reduce_layout *l, float *y, const float *x,
                       tdc_combine comb, tdc_map map, tdc_finish fin, const float *aux,
                       float scale);
/* Index of the max (is_max) or min over the reduced dims (C-order flat index there);
 * NaN wins, ties go to the first index, as PyTorch. */
cudaError_t tdc_argreduce(const tdc_dev *d, const tdc_reduce_layout *l, int64_t *y, const float *x,
                          int is_max);

/* Row ops along one dim: rows are the kept dims' elements (kstride for x, ostride for y),
 * each row n elements at stride xs (x) and ys (y). */
typedef struct {
    int nk;
    int64_t nrows, n, xs, ys;
    int64_t kshape[TDC_MAX_DIMS], kstride[TDC_MAX_DIMS], ostride[TDC_MAX_DIMS];
} tdc_rows_layout;

typedef enum { TDC_SOFTMAX, TDC_LOG_SOFTMAX, TDC_CUMSUM } tdc_rowop;
cudaError_t tdc_rows(const tdc_dev *d, tdc_rowop op, const tdc_rows_layout *l, float *y,
                     const float *x);

#ifdef __cplusplus
}
#endif
#endif
