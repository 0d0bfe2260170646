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
    /* Value checks read at the next synchronising point (cuda_checks.h): kernels that check
     * values set (*flags)[*flags_taken] (then advanced), the ring made on the stream at the
     * first such kernel. flags NULL, the ring full or not made: they synchronise. */
    int **flags;
    int *flags_taken;
    int flags_cap;
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
/* Elementwise ops of the op table on any dtypes (operands y, a, b in the layout; b NULL: the
 * scalar form or a unary op). Inputs are converted to the compute dtype cdt and the result to
 * ydt: float compute (f32, and f16/bf16 widened) in float, f64 in double, integer and bool
 * compute dtypes in int64 with the op's integer expression (wrapping, narrowed on store). */
typedef struct {
    int ydt, adt, bdt; /* td_dtype numbers (bdt unused without b) */
    int cdt;
    int variant;  /* gelu's approximate */
    double f[2];  /* binary: other (scalar form), alpha; unary: p0, p1 */
    int64_t n[2]; /* the same as exact integers (clamp's lo, hi) */
} tdc_ewargs;
/* *bad: set when an integer expression refused a value (negative power, division by zero),
 * when the check ran synchronously (see tdc_dev's flags). */
cudaError_t tdc_ew(const tdc_dev *d, tdd_op op, const tdc_layout *l, void *y, const void *a,
                   const void *b, const tdc_ewargs *g, int *bad);
/* where(cond, a, b) and masked_fill(x, mask) on elsize-byte elements of one dtype: operands
 * y, cond/mask (bool), a/x[, b]; masked_fill writes the bit pattern bits. */
/* pad in mode 1 reflect, 2 replicate, 3 circular (tdd_pad_src): y over yshape and x at their
 * strides (elements; the pointers at element 0). */
typedef struct {
    int ndim, mode;
    int64_t numel;
    int64_t yshape[TDC_MAX_DIMS], ystrides[TDC_MAX_DIMS];
    int64_t xshape[TDC_MAX_DIMS], xstrides[TDC_MAX_DIMS];
    int64_t before[TDC_MAX_DIMS], keep_start[TDC_MAX_DIMS], keep_len[TDC_MAX_DIMS]; /* tdd_pad_at */
} tdc_padmode;
cudaError_t tdc_pad_mode(const tdc_dev *d, const tdc_padmode *p, void *y, const void *x,
                         int elsize);
/* sort/argsort/topk over dense x [outer, L, inner] (dtype dt, elsize bytes): element l of a
 * line goes to position rank (tdd_sort_before) when rank < K: y (NULL: argsort) and idx
 * [outer, K, inner]. */
cudaError_t tdc_sort(const tdc_dev *d, const void *x, int dt, int elsize, int64_t outer, int64_t L,
                     int64_t inner, int64_t K, int descending, void *y, int64_t *idx);
/* adaptive_avg_pool2d over planes of dense [H, W] into [Ho, Wo] (dt f32 or f64) */
cudaError_t tdc_adaptive_avg_pool2d(const tdc_dev *d, int dt, const void *x, void *y,
                                    int64_t planes, int64_t H, int64_t W, int64_t Ho, int64_t Wo);
/* scaled_dot_product_attention (tdd_opargs of ops.h): operands q, k, v, mask at element 0;
 * strides in elements, batch dims (0: broadcast) then the last two; y dense [rows, Ev]. */
typedef struct {
    int nb, mask, causal; /* mask: 0 none, 1 bool bytes, 2 added (dt) */
    int64_t rows, L, S, E, Ev;
    int64_t bshape[TDC_MAX_DIMS];
    int64_t bst[4][TDC_MAX_DIMS]; /* q, k, v, mask */
    int64_t rst[4][2];            /* q (L, E), k (S, E), v (S, Ev), mask (L, S) */
    double scale, p;
    uint64_t seed;
} tdc_sdpa_args;
cudaError_t tdc_sdpa(const tdc_dev *d, const tdc_sdpa_args *a, int dt, const void *q, const void *k,
                     const void *v, const void *m, void *y);
/* interpolate over dense planes [H, W] into [Ho, Wo] (nd 1: H = Ho = 1); dt f32 or f64;
 * mode, align, sh, sw as tdd_opargs (ops.h) */
cudaError_t tdc_interpolate(const tdc_dev *d, int dt, const void *x, void *y, int64_t planes,
                            int64_t H, int64_t W, int64_t Ho, int64_t Wo, int nd, int mode,
                            int align, double sh, double sw);
/* group_norm over dense [N, C, S] (dt f32 or f64) in G groups; w, b [C] or NULL */
/* conv_transpose2d's sizes: x [N, Ci, H, W], w [Ci, Co/G, KH, KW], y [N, Co, Ho, Wo] */
typedef struct {
    int64_t N, Ci, H, W, Co, Ho, Wo, KH, KW, G, sh, sw, ph, pw, dh, dw;
} tdc_convt_args;
/* conv_transpose2d on dense operands (dt f32 or f64); b [Co] or NULL */
cudaError_t tdc_conv_transpose2d(const tdc_dev *d, int dt, const void *x, const void *w,
                                 const void *b, void *y, const tdc_convt_args *a);
/* batch_norm over dense [N, C, S] of any float dt; rm, rv [C] (NULL: none), read in eval and
 * updated in place when training; w, b [C] or NULL */
cudaError_t tdc_batch_norm(const tdc_dev *d, int dt, const void *x, void *y, void *rm, void *rv,
                           const void *w, const void *b, int64_t N, int64_t C, int64_t S, int train,
                           double momentum, double eps);
cudaError_t tdc_group_norm(const tdc_dev *d, int dt, const void *x, void *y, const void *w,
                           const void *b, int64_t N, int64_t C, int64_t S, int64_t G, double eps);
cudaError_t tdc_select(const tdc_dev *d, const tdc_layout *l, void *y, const uint8_t *cond,
                       const void *a, const void *b, int elsize, uint64_t bits);

/* A strided view of one operand (element strides, pointer at element 0). */
typedef struct {
    int ndim, dt;
    int64_t shape[TDC_MAX_DIMS], strides[TDC_MAX_DIMS];
} tdc_view;

/* Index moves of elements of any dtype (elsize bytes); *bad: an index out of range.
 *   gather: y[i] = a[i with dim -> ix[i]] over ix's shape (y's)
 *   index_select: y[i] = a[i with dim -> ix[i[dim]]]
 *   embedding: y[r, j] = a[ix[r], j] (a the [V, D] weight, dim unused) */
typedef enum { TDC_GATHER, TDC_INDEX_SELECT, TDC_EMBEDDING } tdc_index_mode;
cudaError_t tdc_index(const tdc_dev *d, tdc_index_mode mode, int dim, const tdc_view *y, void *yp,
                      const tdc_view *a, const void *ap, const tdc_view *ix, const void *ixp,
                      int elsize, int *bad);
/* scatter_add's second half: y[i with dim -> ix[i]] += src[i] over ix's shape (y already holds
 * the input), atomically; bool ORs. */
cudaError_t tdc_scatter_add(const tdc_dev *d, int dim, const tdc_view *y, void *yp,
                            const tdc_view *ix, const void *ixp, const tdc_view *src,
                            const void *srcp, int *bad);
/* one_hot: y (dense int64, n*classes) from integer x. */
cudaError_t tdc_one_hot(const tdc_dev *d, const tdc_view *x, const void *xp, int64_t *y,
                        int64_t classes, int *bad);

/* cross_entropy (logits) / nll_loss (log-probabilities) over the rows of x ([N, C] as a view;
 * [C] is one row), integer targets t[N]: reduction 0 none (y[N]), 1 mean, 2 sum (y scalar).
 * f32 or f64 (x's dt); *bad: a target out of range that is not ignore_index. */
/* cross_entropy / nll_loss over N * S rows: row n * S + s of x at n * rs + s * ss, its C
 * classes at stride cs; index targets (tdt) at n * trs + s * tss, soft targets (probs: x's
 * dtype) at x's offsets; w (NULL: none) [C] dense. x, w, y f32 or f64 (dt). */
typedef struct {
    int is_ce, probs;
    int64_t N, S, C;
    int64_t rs, ss, cs, trs, tss;
    int64_t ignore;
    double eps;
} tdc_closs;
cudaError_t tdc_class_loss(const tdc_dev *d, const tdc_closs *p, int dt, const void *xp,
                           const void *tp, int tdt, const void *wp, void *y, int reduction,
                           int *bad);

/* dropout in training: operands y, x of float dtype dt (td_dtype number), draw i of stream
 * seed per C-order element i (backends/dtype.h's tdd_rng_uniform). */
cudaError_t tdc_dropout(const tdc_dev *d, const tdc_layout *l, void *y, int dt, const void *x,
                        double p, uint64_t seed);
/* layer_norm over rows of D dense elements of f32 or f64 (dt); w, b NULL when absent. */
cudaError_t tdc_layer_norm(const tdc_dev *d, int dt, int64_t rows, int64_t D, const void *x,
                           void *y, const void *w, const void *b, double eps);

/* A 2-D window over dense [N, C, H, W] (pools, conv2d's im2col): output Ho x Wo. */
typedef struct {
    int64_t N, C, H, W, Ho, Wo;
    int64_t k[2], stride[2], pad[2], dil[2];
    int is_max, include_pad;
} tdc_pool;
/* max_pool2d (arg: the flat h * W + w of each max, or NULL) / avg_pool2d, f32 or f64 (dt);
 * y dense [N, C, Ho, Wo]. */
cudaError_t tdc_pool2d(const tdc_dev *d, const tdc_pool *p, const void *x, void *y, int64_t *arg,
                       int dt);
/* pixel_shuffle (down 0) / pixel_unshuffle (down 1) by r: y dense [B, C, H, W] (the output's
 * dims), x the dense input; elements of es bytes moved (tdd_pixel_src). */
cudaError_t tdc_pixel_shuffle(const tdc_dev *d, int down, int64_t r, int64_t B, int64_t C,
                              int64_t H, int64_t W, const void *x, void *y, int es);
/* max_pool2d_backward: gx dense [N, C, H, W] from go [N, C, Ho, Wo] and the input x. */
cudaError_t tdc_max_pool2d_backward(const tdc_dev *d, const tdc_pool *p, const void *go,
                                    const void *x, void *gx, int dt);
/* col[n][(ic * kh + i) * kw + j][oh * Wo + ow] for input channels g*Cg .. (g+1)*Cg - 1. */
cudaError_t tdc_im2col(const tdc_dev *d, const tdc_pool *p, const float *x, float *col, int64_t Cg,
                       int64_t g);
/* mse_loss (bce 0) / binary_cross_entropy_with_logits (bce 1) per element, f32 or f64 (dt):
 * operands v, x, t. */
cudaError_t tdc_pointwise_loss(const tdc_dev *d, int bce, int dt, const tdc_layout *l, void *v,
                               const void *x, const void *t);

/* y = (accumulate ? y : 0) + a b over nb batch dims (y's shape; a size-1 batch dim of a or b
 * broadcasts), [M, K] x [K, N], for the dtypes cuBLAS's sgemm does not take: f64 in double,
 * integers in wrapping int64 (a, b, y of any dtypes, converted). */
cudaError_t tdc_gemm(const tdc_dev *d, const tdc_view *y, void *yp, const tdc_view *a,
                     const void *ap, const tdc_view *b, const void *bp, int nb, int64_t M,
                     int64_t N, int64_t K, int accumulate);
/* conv2d of dense f64 [N, C, H, W] by [O, Cg, kh, kw] (groups O / Og), bias NULL or [O]. */
cudaError_t tdc_conv2d_f64(const tdc_dev *d, const tdc_pool *p, const double *x, const double *w,
                           const double *bias, double *y, int64_t O, int64_t Cg, int64_t Og);

/* Element copy between two layouts of elsize-byte elements (1, 2, 4 or 8): operands y, x. */
cudaError_t tdc_copy(const tdc_dev *d, const tdc_layout *l, void *y, const void *x, int elsize);
/* Conversion between dtypes (td_dtype numbers); float->int saturates, NaN -> 0. */
cudaError_t tdc_cast(const tdc_dev *d, const tdc_layout *l, void *y, int ydt, const void *x,
                     int xdt);
/* Fills n contiguous elsize-byte elements with the bit pattern in the low bytes of bits. */
cudaError_t tdc_fill(const tdc_dev *d, void *y, int64_t n, int elsize, uint64_t bits);
/* y[i] = start + i*step (f32 or f64: dt); linspace passes end and n so the second half counts down.
 */
cudaError_t tdc_arange_f(const tdc_dev *d, int dt, void *y, int64_t n, double start, double step);
cudaError_t tdc_linspace_f(const tdc_dev *d, int dt, void *y, int64_t n, double start, double end);
cudaError_t tdc_arange_i64(const tdc_dev *d, int64_t *y, int64_t n, int64_t start, int64_t step);
/* rows x cols identity (C order), any element size. */
cudaError_t tdc_eye(const tdc_dev *d, void *y, int64_t rows, int64_t cols, int elsize,
                    uint64_t one);

/* tril (upper = 0) / triu (upper = 1) over the last two dims (rows x cols) of a C-order
 * output: operands y, x; elements off the kept triangle become 0. */
cudaError_t tdc_tri(const tdc_dev *d, const tdc_layout *l, void *y, const void *x, int elsize,
                    int64_t rows, int64_t cols, int64_t diagonal, int upper);

/* The counter-based draws of backends/dtype.h, value i of stream seed: uniform [0, 1) with
 * 24 bits (f32) or 53 (f64), standard normal (f32, f64), or lo + u % range (i64, i32); dt the
 * output's td_dtype number. */
typedef enum { TDC_RAND, TDC_RANDN, TDC_RANDINT } tdc_random;
cudaError_t tdc_random_fill(const tdc_dev *d, tdc_random kind, void *y, int dt, int64_t n,
                            uint64_t seed, int64_t lo, uint64_t range);

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

/* dt (td_dtype number) of x, y and aux: 1 f32, 2 f64, 6 int64 (integer inputs widened by the
 * caller; sums and products wrap, the float maps and finishes do not apply). */
cudaError_t tdc_reduce(const tdc_dev *d, const tdc_reduce_layout *l, int dt, void *y, const void *x,
                       tdc_combine comb, tdc_map map, tdc_finish fin, const void *aux,
                       double scale);
/* Index of the max (is_max) or min over the reduced dims (C-order flat index there);
 * NaN wins, ties go to the first index, as PyTorch. x of dt as tdc_reduce's. */
cudaError_t tdc_argreduce(const tdc_dev *d, const tdc_reduce_layout *l, int dt, int64_t *y,
                          const void *x, int is_max);

/* Row ops along one dim: rows are the kept dims' elements (kstride for x, ostride for y),
 * each row n elements at stride xs (x) and ys (y). */
typedef struct {
    int nk;
    int64_t nrows, n, xs, ys;
    int64_t kshape[TDC_MAX_DIMS], kstride[TDC_MAX_DIMS], ostride[TDC_MAX_DIMS];
} tdc_rows_layout;

typedef enum { TDC_SOFTMAX, TDC_LOG_SOFTMAX, TDC_CUMSUM } tdc_rowop;
/* dt as tdc_reduce's (softmax and log_softmax: f32, f64). */
cudaError_t tdc_rows(const tdc_dev *d, tdc_rowop op, const tdc_rows_layout *l, int dt, void *y,
                     const void *x);

/* embedding_bag (bw 0: y [B, D]) or its backward (bw 1: gy [B, D] in, y [num, D] the
 * weight's gradient, zeroed by the caller); psw/gy NULL when absent. mode 0 sum, 1 mean,
 * 2 max; pad -1: none. *bad: an index or offset out of PyTorch's rules. f32/f64. */
typedef struct {
    int64_t B, pad;
    int mode, last;
} tdc_bag;
cudaError_t tdc_embedding_bag(const tdc_dev *d, int bw, const tdc_bag *g, const tdc_view *ix,
                              const void *ixp, const tdc_view *off, const void *offp,
                              const tdc_view *w, const void *wp, const tdc_view *psw,
                              const void *pswp, const tdc_view *gy, const void *gyp,
                              const tdc_view *y, void *yp, int *bad);
/* multinomial of R rows of C weights (x f32/f64) into y [R, k] (dense int64), the draws of
 * ref_bag.c from seed; *bad: a row the reference refuses. */
cudaError_t tdc_multinomial(const tdc_dev *d, const tdc_view *x, const void *xp, int64_t *y,
                            int64_t R, int64_t C, int64_t k, int repl, uint64_t seed, int *bad);

#ifdef __cplusplus
}
#endif
#endif
