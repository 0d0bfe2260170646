/* cpu.c -- the fast CPU backend: OpenBLAS GEMM (matmul, conv2d), vectorisable loops for
 * float, integer and bool dtypes threaded on the backend's own teams (cpu_threads.c),
 * f16/bf16 through f32; storage from a caching allocator (pool.h).
 * Calls it has no fast kernel for run on the reference kernels, single-threaded;
 * tdd_cpu_native (the kernel table, cpu_kernels) says which, and docs/ops.md shows it. This file is
 * the dispatch and the backend table; the kernels are cpu_*.c, their shared helpers cpu_kit.c. */
#include <cblas.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu.h"
#include "cpu_shm.h"
#include "dtype.h"
#include "pool.h"
#include "ref/ref.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CPU_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define CPU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#define CPU_ASAN 1
#else
#define CPU_POISON(p, n) ((void)(p), (void)(n))
#define CPU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* pthread OpenBLAS: stops its server threads (driver/others/blas_server.c). */
extern int blas_thread_shutdown_(void) __attribute__((weak));

typedef struct {
    int ndev;
    int threads;
    /* One caching allocator for every cpu:N: they share the host's memory, and a block
     * freed on one serves the next request on any. */
    tdd_pool *pool;
    /* Blocks in memfds (cpu_shm.h), for the sessions that take downloads as fds. */
    tdd_pool *shm_pool;
} cpu_ctx;

typedef struct {
    float *f;
    void *h;
    td_dtype dt;
} half_ctx;

static void half_to_f32_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const half_ctx *x = vc;
    cpu_half_to_f32((const uint16_t *)x->h + off[1], st[1], x->f + off[0], st[0], n, x->dt);
}

static void f32_to_half_run(void *vc, int64_t n, const int64_t *off, const int64_t *st)
{
    const half_ctx *x = vc;
    cpu_f32_to_half(x->f + off[1], st[1], (uint16_t *)x->h + off[0], st[0], n, x->dt);
}

/* Runs an f32 kernel on a call with f16/bf16 operands: every 16-bit float input is
 * converted into a contiguous f32 copy, outputs are computed in f32 and rounded
 * back once (the reference computes in double and rounds once too). */
int cpu_via_f32(const tdd_opcall *c, int nt, int (*run)(const tdd_opcall *, int))
{
    tdd_opcall fc = *c;
    tdd_opargs fa = *c->args;
    tdd_tensor tin[TDD_MAX_OP_INPUTS], tout[TDD_MAX_OP_OUTPUTS];
    tdd_storage sin[TDD_MAX_OP_INPUTS], sout[TDD_MAX_OP_OUTPUTS];
    float *bufs[TDD_MAX_OP_INPUTS + TDD_MAX_OP_OUTPUTS] = {0};
    int nb = 0, rc = 0;
    fc.args = &fa;
    if (cpu_is_half(fa.dtype))
        fa.dtype = TD_F32;
    if (cpu_is_half(fa.cdtype))
        fa.cdtype = TD_F32;
    for (int k = 0; k < c->n_in + c->n_out && !rc; k++) {
        bool out = k >= c->n_in;
        const tdd_tensor *t = out ? c->out[k - c->n_in] : c->in[k];
        if (!cpu_is_half(t->dtype))
            continue;
        tdd_tensor *f = out ? &tout[k - c->n_in] : &tin[k];
        tdd_storage *st = out ? &sout[k - c->n_in] : &sin[k];
        *f = *t;
        f->dtype = TD_F32;
        f->offset = 0;
        tdd_set_contiguous(f);
        int64_t n = tdd_numel(t);
        memset(st, 0, sizeof *st);
        st->data = bufs[nb++] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        st->nbytes = (size_t)n * sizeof(float);
        f->st = st;
        if (!st->data) {
            rc = TD_ERESOURCE_EXHAUSTED;
            break;
        }
        if (out) {
            fc.out[k - c->n_in] = f;
            continue;
        }
        half_ctx x = {st->data, t->st->data, t->dtype};
        const tdd_tensor *ops[2] = {f, t};
        tdd_iter it;
        tdd_iter_tensors(&it, t->shape, t->ndim, 2, ops);
        cpu_par_iter(&it, half_to_f32_run, &x, nt);
        fc.in[k] = f;
    }
    if (!rc)
        rc = run(&fc, nt);
    for (int k = 0; k < c->n_out && !rc; k++) {
        tdd_tensor *t = c->out[k];
        if (!cpu_is_half(t->dtype))
            continue;
        half_ctx x = {tout[k].st->data, t->st->data, t->dtype};
        const tdd_tensor *ops[2] = {t, &tout[k]};
        tdd_iter it;
        tdd_iter_tensors(&it, t->shape, t->ndim, 2, ops);
        cpu_par_iter(&it, f32_to_half_run, &x, nt);
    }
    for (int k = 0; k < nb; k++)
        free(bufs[k]);
    return rc;
}

static int matmul_nt(const tdd_opcall *c, int nt)
{
    (void)nt; /* OpenBLAS runs its own threads */
    return cpu_matmul(c);
}

static bool is_f(td_dtype dt)
{
    return dt == TD_F32 || dt == TD_F64;
}

/* All inputs of dtype dt? */
static bool inputs_are(const tdd_opcall *c, int from, int to, td_dtype dt)
{
    for (int i = from; i < to && i < c->n_in; i++)
        if (c->in[i]->dtype != dt)
            return false;
    return true;
}

static bool is_i(td_dtype dt)
{
    return dt == TD_I32 || dt == TD_I64;
}

/* The scalar form's integer "other" fits the compute dtype, so truncating it to the
 * integer kernels' width changes nothing (the reference computes in int64). */
static bool scalar_fits(const tdd_opargs *g)
{
    if (!g->scalar_form || g->cdtype == TD_I64)
        return true;
    if (g->cdtype == TD_I32)
        return g->n[0] >= INT32_MIN && g->n[0] <= INT32_MAX;
    return g->cdtype != TD_BOOL || g->n[0] == 0 || g->n[0] == 1;
}

/* Inputs [from, to) the f32 kernels take through conversion (cpu_elem.c): compute
 * dtype f16/bf16 with every input of it, or f32 with f32 and f16/bf16 inputs
 * (widening is exact, as the reference's is). */
static bool via_f32(const tdd_opcall *c, int from, int to)
{
    td_dtype ct = c->args->cdtype;
    if (cpu_is_half(ct))
        return inputs_are(c, from, to, ct);
    if (ct != TD_F32)
        return false;
    for (int i = from; i < to && i < c->n_in; i++)
        if (c->in[i]->dtype != TD_F32 && !cpu_is_half(c->in[i]->dtype))
            return false;
    return true;
}

/* An op of elementwise.h's tables: the float kernels for f32/f64 (f16/bf16 through them), the
 * integer ones for rows with an exact integer form (IMODE INT), integer inputs of a float
 * compute dtype converted first. */
static bool ew_native(const tdd_opcall *c, int arity)
{
    const tdd_opargs *g = c->args;
    td_dtype ct = g->cdtype;
    bool ints = tdd_ew_imode(c->op) == TDD_EWI_INT && (is_i(ct) || ct == TD_BOOL);
    if (arity == 1)
        return ((tdd_dtype_is_float(ct) || ints) && c->in[0]->dtype == ct) ||
               cpu_ints_to_float(c); /* exp of an integer tensor: f32 */
    return ((is_f(ct) || ints) && inputs_are(c, 0, 2, ct) && scalar_fits(g)) || via_f32(c, 0, 2) ||
           cpu_ints_to_float(c); /* integer inputs, float compute: converted first */
}

/* ------------------------------------------------------------------ the kernel table */

/* When an op's fast kernel runs (the rest: the reference's kernels, documented in docs/ops.md).
 * The small integer dtypes and the elementwise and view ops are decided before these. */
static bool any_dtype(const tdd_opcall *c)
{
    (void)c;
    return true;
}

static bool float_in(const tdd_opcall *c)
{
    return tdd_dtype_is_float(c->in[0]->dtype);
}

static bool float_or_ints_in(const tdd_opcall *c) /* integer inputs converted first */
{
    return tdd_dtype_is_float(c->in[0]->dtype) || cpu_ints_to_float(c);
}

static bool float_out(const tdd_opcall *c)
{
    return is_f(c->args->dtype);
}

static bool where_native(const tdd_opcall *c) /* a select: any dtype */
{
    return inputs_are(c, 1, 3, c->args->cdtype);
}

static bool masked_fill_native(const tdd_opcall *c) /* the value as a tensor: the reference */
{
    return c->in[0]->dtype == c->args->cdtype && c->n_in == 2;
}

static bool one_hot_native(const tdd_opcall *c) /* output i64 (ops_shape.c), row by row */
{
    return tdd_is_contiguous(c->out[0]) && c->out[0]->dtype == TD_I64 &&
           (c->in[0]->dtype == TD_I64 || c->in[0]->dtype == TD_I32);
}

static bool gather_native(const tdd_opcall *c) /* a 0-d input with a 1-D index: the reference */
{
    return c->in[0]->ndim > 0 || c->in[1]->ndim == 0;
}

static bool class_loss_native(const tdd_opcall *c)
{ /* [N, C] or [C] rows; weights, soft targets, [N, C, d...]: the reference */
    return tdd_dtype_is_float(c->in[0]->dtype) && c->in[0]->ndim <= 2 && !c->args->flags;
}

static bool batch_norm_native(const tdd_opcall *c) /* a dense input (cpu_norm.c) */
{
    return tdd_dtype_is_float(c->in[0]->dtype) && tdd_is_contiguous(c->in[0]);
}

static bool convt_native(const tdd_opcall *c) /* dense input and weight (cpu_convt.c) */
{
    return tdd_dtype_is_float(c->in[0]->dtype) && tdd_is_contiguous(c->in[0]) &&
           tdd_is_contiguous(c->in[1]);
}

static bool join_native(const tdd_opcall *c) /* mixed dtypes convert (the reference does) */
{
    return inputs_are(c, 0, c->n_in, c->out[0]->dtype);
}

static bool contiguous_out(const tdd_opcall *c) /* rows of a C-contiguous output */
{
    return tdd_is_contiguous(c->out[0]);
}

static bool pad_native(const tdd_opcall *c) /* mode constant; the others: the reference */
{
    return tdd_is_contiguous(c->out[0]) && c->args->i[0] == 0;
}

static bool dropout_native(const tdd_opcall *c) /* the reference's draws: bit-identical */
{
    return tdd_dtype_is_float(c->in[0]->dtype) && tdd_is_contiguous(c->out[0]);
}

/* cpu's kernel table, indexed by op: when the fast kernel runs (native; NULL: never, the
 * reference's kernel runs), and for the index and nn kinds the kernel (the other kinds
 * dispatch by kind: cpu_execute) and whether f16/bf16 inputs go through f32 copies (widen). */
typedef struct {
    bool (*native)(const tdd_opcall *c);
    int (*run)(const tdd_opcall *c, int nt);
    bool widen;
} cpu_kernel;

static const cpu_kernel cpu_kernels[TDD_OP_COUNT] = {
    [TDD_OP_WHERE] = {where_native},
    [TDD_OP_MASKED_FILL] = {masked_fill_native},
    /* every dtype the op accepts: float, integer or bool runs */
    [TDD_OP_SUM] = {any_dtype},
    [TDD_OP_AMAX] = {any_dtype},
    [TDD_OP_AMIN] = {any_dtype},
    [TDD_OP_ARGMAX] = {any_dtype},
    [TDD_OP_ARGMIN] = {any_dtype},
    [TDD_OP_PROD] = {any_dtype},
    [TDD_OP_SUM_TO] = {any_dtype},
    [TDD_OP_MEAN] = {float_or_ints_in},
    [TDD_OP_VAR] = {float_or_ints_in},
    [TDD_OP_STD] = {float_or_ints_in},
    [TDD_OP_LOGSUMEXP] = {float_or_ints_in},
    /* f16/bf16 lines widened to f32 (cpu_reduce.c) */
    [TDD_OP_CUMSUM] = {float_in},
    [TDD_OP_SOFTMAX] = {float_in},
    [TDD_OP_LOG_SOFTMAX] = {float_in},
    /* f16/bf16 convert to f32 for sgemm */
    [TDD_OP_MATMUL] = {float_in},
    [TDD_OP_BMM] = {float_in},
    [TDD_OP_LINEAR] = {float_in},
    [TDD_OP_FULL] = {float_out},
    [TDD_OP_ZEROS] = {float_out},
    [TDD_OP_ONES] = {float_out},
    [TDD_OP_RAND] = {float_out},
    [TDD_OP_RANDN] = {float_out},
    /* copies move bytes of any dtype; casts: every pair converts as ref does (cpu_cast.c;
     * same-dtype too: ref round-trips floats through double/f32, which rewrites NaN payloads
     * that a byte copy would keep) */
    [TDD_OP_CLONE] = {any_dtype, cpu_copy},
    [TDD_OP_CAST] = {any_dtype, cpu_cast},
    [TDD_OP_ONE_HOT] = {one_hot_native, cpu_one_hot},
    [TDD_OP_CAT] = {join_native, cpu_index},
    [TDD_OP_STACK] = {join_native, cpu_index},
    [TDD_OP_TRIL] = {contiguous_out, cpu_index},
    [TDD_OP_TRIU] = {contiguous_out, cpu_index},
    [TDD_OP_PAD] = {pad_native, cpu_index},
    [TDD_OP_DROPOUT] = {dropout_native, cpu_index},
    /* in double from any float dtype: never via f32 copies */
    [TDD_OP_BATCH_NORM] = {batch_norm_native, cpu_batch_norm},
    [TDD_OP_GATHER] = {gather_native, cpu_gather, true},
    [TDD_OP_SCATTER_ADD] = {gather_native, cpu_scatter_add, true},
    /* index moves copy elements of any dtype */
    [TDD_OP_INDEX_SELECT] = {any_dtype, cpu_gather, true},
    [TDD_OP_EMBEDDING] = {any_dtype, cpu_gather, true},
    [TDD_OP_CROSS_ENTROPY] = {class_loss_native, cpu_class_loss, true},
    [TDD_OP_NLL_LOSS] = {class_loss_native, cpu_class_loss, true},
    /* rows worked in double */
    [TDD_OP_MSE_LOSS] = {float_in, cpu_pointwise_loss, true},
    [TDD_OP_BCE_WITH_LOGITS] = {float_in, cpu_pointwise_loss, true},
    [TDD_OP_LAYER_NORM] = {float_in, cpu_layer_norm, true},
    [TDD_OP_CONV_TRANSPOSE2D] = {convt_native, cpu_conv_transpose2d, true},
    [TDD_OP_CONV2D] = {float_in, cpu_conv2d, true},
    [TDD_OP_MAX_POOL2D] = {float_in, cpu_pool2d, true},
    [TDD_OP_AVG_POOL2D] = {float_in, cpu_pool2d, true},
    [TDD_OP_MAX_POOL2D_BACKWARD] = {float_in, cpu_max_pool2d_backward, true},
    /* element moves of any dtype */
    [TDD_OP_PIXEL_SHUFFLE] = {any_dtype, cpu_pixel_shuffle},
    [TDD_OP_PIXEL_UNSHUFFLE] = {any_dtype, cpu_pixel_shuffle},
    /* composites (ops.h): their parts run here; native says so in docs/ops.md */
    [TDD_OP_CONV1D] = {float_in},
    [TDD_OP_MAX_POOL1D] = {float_in},
    [TDD_OP_AVG_POOL1D] = {float_in},
    /* rows in double as the reference's (cpu_attn.c) */
    [TDD_OP_SDPA] = {float_in, cpu_sdpa, true},
    /* arange, linspace, eye, randint, embedding_bag, multinomial: the reference's */
};

bool tdd_cpu_native(const tdd_opcall *c)
{
    const tdd_opargs *g = c->args;
    if ((unsigned)c->op >= TDD_OP_COUNT)
        return false;
    int arity = tdd_ew_arity(c->op);
    /* uint8, int8, int16 anywhere: the reference's kernels (documented in docs/ops.md) */
    for (int k = 0; k < c->n_in; k++)
        if (tdd_dtype_is_small_int(c->in[k]->dtype))
            return false;
    for (int k = 0; k < c->n_out; k++)
        if (tdd_dtype_is_small_int(c->out[k]->dtype))
            return false;
    if (tdd_dtype_is_small_int(g->cdtype))
        return false;
    if (c->op == TDD_OP_CLAMP && c->n_in > 1)
        return false; /* tensor bounds: maximum, then minimum (the composite column, ops.h), each
                       * asked here on its own */
    if (arity)
        return ew_native(c, arity);
    if (tdd_opdefs[c->op].kind == TDD_KIND_VIEW)
        return true; /* views do nothing; their copies move bytes of any dtype */
    bool (*native)(const tdd_opcall *) = cpu_kernels[c->op].native;
    return native && native(c);
}

/* The pool's raw allocator. Blocks of 4 MiB and more are mappings of their own on 2 MiB
 * pages (an upload into fresh memory otherwise spends as long taking 4 KiB page faults as
 * it does copying: bench/transfer), unmapped when the pool releases them, so the memory
 * goes back to the system at once; smaller ones come from malloc, 64-byte aligned for
 * vector loads. The pool reuses both, so a steady loop maps nothing and faults nothing. */
static void *cpu_raw_alloc(void *ctx, size_t n)
{
    (void)ctx;
    void *p = NULL;
    if (n >= TDD_POOL_LARGE) { /* n is a multiple of 2 MiB (the pool's size classes) */
        size_t map = n + TDD_POOL_HUGE;
        char *m = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return NULL;
        uintptr_t a = ((uintptr_t)m + TDD_POOL_HUGE - 1) & ~(uintptr_t)(TDD_POOL_HUGE - 1);
        size_t head = (size_t)(a - (uintptr_t)m), tail = map - head - n;
        if (head)
            munmap(m, head);
        if (tail)
            munmap((char *)a + n, tail);
        (void)madvise((void *)a, n, MADV_HUGEPAGE); /* a hint: without THP it changes nothing */
        return (void *)a;
    }
    if (posix_memalign(&p, 64, n))
        return NULL;
    return p;
}

/* Unpoisons a block before it goes back to the system. A mapping's shadow is released
 * rather than written (zero pages read as addressable): writing it would keep n/8
 * bytes resident per block after the block itself is gone. */
static void cpu_release_poison(void *p, size_t n)
{
#ifdef CPU_ASAN
    if (n >= TDD_POOL_LARGE) {
        size_t scale, off;
        __asan_get_shadow_mapping(&scale, &off);
        uintptr_t sh = ((uintptr_t)p >> scale) + off;
        size_t len = n >> scale, pg = (size_t)sysconf(_SC_PAGESIZE);
        if (sh % pg == 0 && len % pg == 0 && madvise((void *)sh, len, MADV_DONTNEED) == 0)
            return;
    }
#endif
    CPU_UNPOISON(p, n);
}

static void cpu_raw_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    cpu_release_poison(p, n);
    if (n >= TDD_POOL_LARGE)
        munmap(p, n);
    else
        free(p);
}

static void cpu_raw_trimmed(void *ctx)
{
    (void)ctx;
#ifdef __GLIBC__
    malloc_trim(0); /* the small blocks' pages back to the system too */
#endif
}

static void *shm_raw_alloc(void *ctx, size_t n)
{
    (void)ctx;
    return tdd_shm_alloc(n);
}

static void shm_raw_free(void *ctx, void *p, size_t n)
{
    (void)ctx;
    cpu_release_poison(p, n);
    tdd_shm_free(p, n);
}

static uint64_t cpu_memory_total(void *ctx, int ordinal)
{
    (void)ctx;
    (void)ordinal;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

static int cpu_init(const tdd_backend_config *cfg, void **ctx, char *why, size_t why_len)
{
    (void)why;
    (void)why_len;
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return TD_ERESOURCE_EXHAUSTED;
    c->ndev = cfg && cfg->cpu_devices > 0 ? cfg->cpu_devices : 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    c->threads = cfg && cfg->threads > 0 ? cfg->threads : (cores > 0 ? (int)cores : 1);
    /* OpenBLAS single-threaded; cpu_gemm splits large GEMMs itself (see cpu_blas.c). Its
     * thread pool, started when the library loaded, is then never given work, but was seen
     * spinning after kernels (3-4 ms of CPU per op in some runs): stopped, where the
     * library exports the call (a pthread OpenBLAS; weak, so any OpenBLAS links). */
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_)
        blas_thread_shutdown_();
    tdd_cpu_gemm_threads = c->threads;
    tdd_shm_max_blocks = cfg ? cfg->shm_blocks : 0;
    tdd_pool_config pc = tdd_pool_defaults;
    if (!pc.limit)
        pc.limit = cpu_memory_total(c, 0);
    tdd_pool_raw raw = {.alloc = cpu_raw_alloc, .free = cpu_raw_free, .trimmed = cpu_raw_trimmed};
    c->pool = tdd_pool_new(&raw, &pc);
    tdd_pool_raw shm_raw = {.alloc = shm_raw_alloc, .free = shm_raw_free};
    c->shm_pool = c->pool ? tdd_pool_new(&shm_raw, &pc) : NULL;
    if (!c->shm_pool) {
        tdd_pool_destroy(c->pool);
        free(c);
        return TD_ERESOURCE_EXHAUSTED;
    }
    *ctx = c;
    return c->ndev;
}

static void cpu_shutdown(void *ctx)
{
    cpu_ctx *c = ctx;
    tdd_pool_stats st;
    tdd_pool_stats shm;
    tdd_pool_get_stats(c->pool, &st);
    tdd_pool_get_stats(c->shm_pool, &shm);
    if (st.live || shm.live) { /* tensors outlive the devices (freed on the way out) */
        tdd_pool_trim(c->pool, 0);
        tdd_pool_trim(c->shm_pool, 0);
        return;
    }
    tdd_pool_destroy(c->pool);
    tdd_pool_destroy(c->shm_pool);
    free(ctx);
}

static void cpu_device_name(void *ctx, int ordinal, char *buf, size_t len)
{
    cpu_ctx *c = ctx;
    (void)ordinal;
    snprintf(buf, len, "CPU (OpenBLAS, %d threads)", c->threads);
}

/* Under AddressSanitizer a block in the pool is poisoned, and a block handed out is
 * poisoned past the bytes asked for: reuse does not hide a use after free or an overrun. */
static void *cpu_alloc(void *ctx, int ordinal, size_t nbytes)
{
    (void)ordinal;
    void *p = tdd_pool_alloc(((cpu_ctx *)ctx)->pool, nbytes);
    if (p) {
        CPU_UNPOISON(p, tdd_pool_block_size(nbytes));
        CPU_POISON((char *)p + nbytes, tdd_pool_block_size(nbytes) - nbytes);
    }
    return p;
}

/* Storage in a memfd (cpu_shm.h): a download as an fd then seals it instead of copying. */
static void *cpu_alloc_shared(void *ctx, int ordinal, size_t nbytes)
{
    (void)ordinal;
    if (nbytes < TDD_POOL_LARGE)
        return NULL;
    void *p = tdd_pool_alloc(((cpu_ctx *)ctx)->shm_pool, nbytes);
    if (p) {
        CPU_UNPOISON(p, tdd_pool_block_size(nbytes));
        CPU_POISON((char *)p + nbytes, tdd_pool_block_size(nbytes) - nbytes);
    }
    return p;
}

static void cpu_free(void *ctx, int ordinal, void *p, size_t nbytes)
{
    (void)ordinal;
    cpu_ctx *c = ctx;
    if (p)
        CPU_POISON(p, tdd_pool_block_size(nbytes));
    bool sealed = false;
    if (p && nbytes >= TDD_POOL_LARGE && tdd_shm_is_block(p, &sealed)) {
        if (sealed) /* its file is a client's now: never written again, never reused */
            tdd_pool_release(c->shm_pool, p, nbytes);
        else
            tdd_pool_free(c->shm_pool, p, nbytes);
        return;
    }
    tdd_pool_free(c->pool, p, nbytes);
}

static int cpu_execute(void *ctx, int ordinal, const tdd_opcall *c)
{
    cpu_ctx *cc = ctx;
    int nt = cc ? cc->threads : 1;
    tdd_composite_fn parts = tdd_op_composite(c); /* run as other ops (ops.h) */
    if (parts)
        return parts(c, cpu_execute, ctx, ordinal);
    (void)ordinal;
    if (!tdd_cpu_native(c))
        return tdd_ref_run(c);
    switch (tdd_opdefs[c->op].kind) {
    case TDD_KIND_BINARY:
    case TDD_KIND_UNARY:
    case TDD_KIND_ELEMENT:
        return cpu_ints_to_float(c) ? cpu_via_cast(c, nt, cpu_elementwise) : cpu_elementwise(c, nt);
    case TDD_KIND_REDUCE:
        if (c->op == TDD_OP_CUMSUM || c->op == TDD_OP_SOFTMAX || c->op == TDD_OP_LOG_SOFTMAX)
            return cpu_lines(c, nt);
        return cpu_ints_to_float(c) ? cpu_via_cast(c, nt, cpu_reduce) : cpu_reduce(c, nt);
    case TDD_KIND_LINALG:
        return cpu_is_half(c->in[0]->dtype) ? cpu_via_f32(c, nt, matmul_nt) : cpu_matmul(c);
    case TDD_KIND_VIEW:
        return cpu_copy(c, nt);
    case TDD_KIND_CREATE: /* arange, linspace, eye, randint: no fast kernel (not native) */
        return cpu_create(c, nt);
    case TDD_KIND_INDEX:
    case TDD_KIND_NN:
        break;
    }
    const cpu_kernel *k = &cpu_kernels[c->op]; /* native: the table has its kernel */
    return k->widen && cpu_is_half(c->in[0]->dtype) ? cpu_via_f32(c, nt, k->run) : k->run(c, nt);
}

const tdd_backend tdd_backend_cpu = {
    .name = "cpu",
    .host_memory = true,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .device_name = cpu_device_name,
    .memory_total = cpu_memory_total,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_shared = cpu_alloc_shared,
    .execute = cpu_execute,
};
