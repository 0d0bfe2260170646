/* cpu.h -- private to the cpu backend. */
#ifndef TDD_CPU_H
#define TDD_CPU_H

#include "backend.h"
#include "iter.h"

/* Below this many elements a loop runs on one thread: waking the team costs more. */
#define CPU_PAR_MIN 32768

/* True if the cpu backend runs this call with its own threaded kernels;
 * false if it hands it to the reference kernels (tdd_ref_run). Used by
 * execute and by the op-coverage table. */
bool tdd_cpu_native(const tdd_opcall *c);

/* Runs fn(ctx, t, n) for t = 0..n-1, each on its own thread (the caller runs t = 0) on
 * the calling thread's team (cpu_threads.c), whose threads sleep between jobs. Nested
 * calls, and n <= 1, run every t in turn on the caller. */
typedef void (*cpu_par_fn)(void *ctx, int t, int n);
void cpu_parallel(int n, cpu_par_fn fn, void *ctx);
/* [lo, hi) of n items: part t of nt, sizes differing by at most one (the first n % nt
 * parts get one more). */
void cpu_split(int64_t n, int t, int nt, int64_t *lo, int64_t *hi);
/* Kernels that keep a partial result per thread use at most this many threads. */
#define CPU_MAX_PARTS 256

/* Runs fn over every run of it, split across nt threads when large. */
void cpu_par_iter(const tdd_iter *it, tdd_iter_fn fn, void *ctx, int nt);
/* The same, when each element costs about work/numel units (lines, rows). */
void cpu_par_iter_n(const tdd_iter *it, tdd_iter_fn fn, void *ctx, int nt, int64_t work);

/* Element conversion for kernels that work in double whatever the float dtype:
 * n elements from storage offset off with stride st (unit stride vectorises). */
void cpu_load_strided(const void *data, td_dtype dt, int64_t off, int64_t st, int64_t n,
                      double *dst);
void cpu_store_strided(void *data, td_dtype dt, int64_t off, int64_t st, int64_t n,
                       const double *src);
/* 16-bit floats (dt: f16 or bf16) to f32 and back, rounding to nearest even:
 * bit-identical to dtype.h's conversions, vectorised at unit strides. */
static inline bool cpu_is_half(td_dtype dt)
{
    return dt == TD_F16 || dt == TD_BF16;
}
void cpu_half_to_f32(const uint16_t *h, int64_t hs, float *f, int64_t fs, int64_t n, td_dtype dt);
void cpu_f32_to_half(const float *f, int64_t fs, uint16_t *h, int64_t hs, int64_t n, td_dtype dt);
/* Elements a half-precision kernel converts at a time, in per-thread f32 buffers:
 * small enough that a block's operands stay in L1/L2 between conversion and use. */
#define CPU_HALF_BLOCK 4096

/* C-order elements [lo, hi) of t, any layout. */
void cpu_load_tensor(const tdd_tensor *t, int64_t lo, int64_t hi, double *dst);
/* n elements into contiguous t from C-order element lo. */
void cpu_store_contig(tdd_tensor *t, int64_t lo, int64_t n, const double *src);
/* scaled_dot_product_attention (cpu_attn.c) */
int cpu_sdpa(const tdd_opcall *c, int nt);

int cpu_elementwise(const tdd_opcall *c, int nt); /* cpu_elem.c */
int cpu_copy(const tdd_opcall *c, int nt);        /* cpu_elem.c */
int cpu_create(const tdd_opcall *c, int nt);      /* cpu_elem.c */
int cpu_cast(const tdd_opcall *c, int nt);        /* cpu_cast.c: any dtype pair */
int cpu_one_hot(const tdd_opcall *c, int nt);     /* cpu_cast.c */
int cpu_reduce(const tdd_opcall *c, int nt);      /* cpu_reduce.c */
int cpu_lines(const tdd_opcall *c, int nt);       /* cpu_reduce.c: cumsum, softmax */
int cpu_matmul(const tdd_opcall *c);              /* cpu_blas.c */
/* Row-major C = alpha*op(A)@op(B) + beta*C, split over tdd_cpu_gemm_threads when large. */
void cpu_gemm(bool f64, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
              const void *A, int64_t lda, const void *B, int64_t ldb, double beta, void *C,
              int64_t ldc);
extern int tdd_cpu_gemm_threads;
/* cpu_nn.c: conv2d, layer_norm, the losses, the index moves (f32/f64; f16/bf16 via f32) */
int cpu_conv2d(const tdd_opcall *c, int nt);
int cpu_layer_norm(const tdd_opcall *c, int nt);
int cpu_class_loss(const tdd_opcall *c, int nt);     /* cross_entropy, nll_loss */
int cpu_pointwise_loss(const tdd_opcall *c, int nt); /* mse_loss, bce_with_logits */
int cpu_gather(const tdd_opcall *c, int nt);         /* gather, index_select, embedding */
int cpu_scatter_add(const tdd_opcall *c, int nt);
/* cpu_pool.c: max_pool2d and avg_pool2d of f32/f64 (f16/bf16 via f32), any strides */
int cpu_pool2d(const tdd_opcall *c, int nt);
int cpu_max_pool2d_backward(const tdd_opcall *c, int nt);
/* cpu_norm.c: batch_norm of a dense input, any float dtype (the running stats in place) */
int cpu_batch_norm(const tdd_opcall *c, int nt);
/* cpu_convt.c: conv_transpose2d of dense f32/f64 operands (gemm, then col2im) */
int cpu_conv_transpose2d(const tdd_opcall *c, int nt);
/* cpu_index.c: cat, stack, tril, triu, pad (byte moves, any dtype), dropout */
int cpu_index(const tdd_opcall *c, int nt);
int cpu_pixel_shuffle(const tdd_opcall *c, int nt); /* pixel_shuffle, pixel_unshuffle */
/* A binary/unary op or logsumexp computing in f32/f64 with integer or bool inputs (the
 * rest of that dtype): cpu_via_cast converts them to it and runs the float kernel. */
bool cpu_ints_to_float(const tdd_opcall *c);
int cpu_via_cast(const tdd_opcall *c, int nt, int (*run)(const tdd_opcall *, int));
/* Runs an f32 kernel on a call whose float operands are f16/bf16 (cpu.c). */
int cpu_via_f32(const tdd_opcall *c, int nt, int (*run)(const tdd_opcall *, int));

#endif
