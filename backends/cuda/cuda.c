/* cuda.c -- the cuda backend's devices: opening them, streams (slots), memory and the
 * allocation table, host copies, errors, and the backend table; cuda_exec.c turns validated
 * op calls into kernels.cu launches and cuBLAS GEMMs.
 *
 * Streams. Each session issues its work on a device on a stream of its own (a slot: the
 * stream, its cuBLAS handle and launch parameters), made at the session's first call there
 * and destroyed when the session ends; past cuda_streams slots, sessions share them round
 * robin (one issues at a time on a shared slot). Slot 0 is the device's own stream: memory
 * allocated outside any session, and what an ended session's stream hands on. So two
 * sessions' kernels may overlap on the GPU while each session's own order holds, and the
 * daemon gives the device several lanes. Everything of a call (kernels, cuBLAS, copies,
 * stream-ordered allocation and free of scratch) is on the caller's slot.
 *
 * Memory crosses streams through the allocation table: each block remembers the slot that
 * last issued work on it. A call on another slot first waits (an event recorded on that
 * slot) for everything it issued, and becomes the block's last user; the free is issued on
 * the last user's stream, so the stream-ordered allocator reuses the block for anyone only
 * after every user's work on it. Host order between the users is the daemon's (an op's
 * inputs are issued before it). No device-wide synchronisation anywhere except the host
 * copies, which wait for their bytes on their own stream. execute() enqueues and returns; a
 * fault inside a kernel surfaces at the next copy or synchronize as DEVICE_UNAVAILABLE.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"

cuda_blas_api cuda_blas;

#ifndef TDD_CUDA_LIBDIR
#define TDD_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

/* POSIX's way to turn dlsym's object pointer into a function pointer. */
#define BLAS_SYM(field, name) (*(void **)(&cuda_blas.field) = dlsym(cuda_blas.lib, name))

static int blas_load(char *why, size_t why_len)
{
    if (cuda_blas.lib)
        return 0;
#ifdef TDC_EMU
    /* `make emu`: the emulator's cuBLAS on OpenBLAS (backends/cuda/emu/runtime.cpp). */
    (void)why;
    (void)why_len;
    cuda_blas.lib = &cuda_blas;
    cuda_blas.create = tdc_emu_cublas_create;
    cuda_blas.destroy = tdc_emu_cublas_destroy;
    cuda_blas.set_stream = tdc_emu_cublas_set_stream;
    cuda_blas.sgemm = tdc_emu_cublas_sgemm;
    cuda_blas.sgemm_strided_batched = tdc_emu_cublas_sgemm_strided_batched;
    cuda_blas.status_string = tdc_emu_cublas_status_string;
    cuda_blas.set_math_mode = tdc_emu_cublas_set_math_mode;
    cuda_blas.gemm_ex = tdc_emu_cublas_gemm_ex;
    cuda_blas.gemm_strided_batched_ex = tdc_emu_cublas_gemm_strided_batched_ex;
    return 0;
#endif
    static const char *const paths[] = {"libcublas.so.13", TDD_CUDA_LIBDIR "/libcublas.so.13",
                                        "libcublas.so", TDD_CUDA_LIBDIR "/libcublas.so"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0] && !cuda_blas.lib; i++)
        cuda_blas.lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!cuda_blas.lib) {
        snprintf(why, why_len, "cuBLAS not found: %s", dlerror());
        return -1;
    }
    if (!BLAS_SYM(create, "cublasCreate_v2") || !BLAS_SYM(destroy, "cublasDestroy_v2") ||
        !BLAS_SYM(set_stream, "cublasSetStream_v2") || !BLAS_SYM(sgemm, "cublasSgemm_v2") ||
        !BLAS_SYM(sgemm_strided_batched, "cublasSgemmStridedBatched") ||
        !BLAS_SYM(status_string, "cublasGetStatusString") ||
        !BLAS_SYM(set_math_mode, "cublasSetMathMode") || !BLAS_SYM(gemm_ex, "cublasGemmEx") ||
        !BLAS_SYM(gemm_strided_batched_ex, "cublasGemmStridedBatchedEx")) {
        snprintf(why, why_len, "cuBLAS lacks a symbol: %s", dlerror());
        dlclose(cuda_blas.lib);
        cuda_blas.lib = NULL;
        return -1;
    }
    return 0;
}

_Thread_local uint64_t tdd_backend_session;

cuda_dev *cuda_dev_of(void *ctx, int ordinal)
{
    cuda_ctx *c = ctx;
    return c && ordinal >= 0 && ordinal < c->n ? &c->dev[ordinal] : NULL;
}

/* The slot this thread issues on during a call (NULL between calls). */
_Thread_local cuda_slot *cuda_cur_slot;

/* The slot of the call in progress on dv (the device's own outside calls). */
cuda_slot *cuda_slot_now(cuda_dev *dv)
{
    return cuda_cur_slot && cuda_cur_slot->dev == dv ? cuda_cur_slot : &dv->slots[0];
}

/* What the last failed call on this thread saw (error_message(), alloc_error()). */
_Thread_local char cuda_last_err[CUDA_LAST_ERR];
static _Thread_local cudaError_t last_alloc_error;

/* A device a sticky error took out of service answers DEVICE_UNAVAILABLE to new work. */
int cuda_dev_failed(const cuda_dev *dv)
{
    if (!atomic_load(&dv->failed))
        return 0;
    snprintf(cuda_last_err, sizeof cuda_last_err, "cuda:%d is out of service after %s", dv->ord,
             dv->why);
    return TD_EDEVICE_UNAVAILABLE;
}

/* A CUDA error as a TD_E* code: out of memory is RESOURCE_EXHAUSTED, anything else a
 * DEVICE_ERROR naming the error (cudaGetErrorName). Faults that leave the context unusable
 * (sticky errors) also mark the device failed: the call that saw the fault is its
 * DEVICE_ERROR, later work DEVICE_UNAVAILABLE. Printed, because nothing else will say
 * which call saw them. */
int cuda_rc(cuda_dev *dv, cudaError_t e, const char *what)
{
    switch (e) {
    case cudaSuccess:
        return 0;
    case cudaErrorMemoryAllocation:
        (void)cudaGetLastError(); /* not sticky: clear it so the next call starts clean */
        snprintf(cuda_last_err, sizeof cuda_last_err, "%s: %s", what, cudaGetErrorName(e));
        return TD_ERESOURCE_EXHAUSTED;
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorHardwareStackError:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
        fprintf(stderr, "cuda:%d: %s: %s (%s)\n", dv ? dv->id : -1, what, cudaGetErrorName(e),
                cudaGetErrorString(e));
        if (dv && cuda_dev_failed(dv))
            return TD_EDEVICE_UNAVAILABLE; /* an earlier call saw the fault */
        if (dv && atomic_exchange(&dv->claimed, 1) == 0) {
            snprintf(dv->why, sizeof dv->why, "%s in %s", cudaGetErrorName(e), what);
            atomic_store(&dv->failed, 1);
            fprintf(stderr, "cuda:%d: marked failed: %s\n", dv->ord, dv->why);
        }
        snprintf(cuda_last_err, sizeof cuda_last_err, "%s: %s (%s); the device is out of service",
                 what, cudaGetErrorName(e), cudaGetErrorString(e));
        return TD_EDEVICE_ERROR;
    default:
        (void)cudaGetLastError();
        fprintf(stderr, "cuda:%d: %s: %s (%s)\n", dv ? dv->id : -1, what, cudaGetErrorName(e),
                cudaGetErrorString(e));
        snprintf(cuda_last_err, sizeof cuda_last_err, "%s: %s (%s)", what, cudaGetErrorName(e),
                 cudaGetErrorString(e));
        return TD_EDEVICE_ERROR;
    }
}

int cuda_blas_rc(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return 0;
    case CUBLAS_STATUS_ALLOC_FAILED:
        return TD_ERESOURCE_EXHAUSTED;
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return TD_EUNSUPPORTED_OP;
    default:
        fprintf(stderr, "cuda: cuBLAS: %s\n", cuda_blas.status_string(s));
        snprintf(cuda_last_err, sizeof cuda_last_err, "cuBLAS: %s", cuda_blas.status_string(s));
        return TD_EDEVICE_ERROR;
    }
}

/* ------------------------------------------------------------------ devices */

static int streams_per_device = 8; /* cuda_streams: slots for sessions per device */
static bool gemm_tf32;             /* cuda_tf32: f32 GEMMs in TF32 (each handle's math mode) */

static void slot_close(cuda_slot *sl)
{
    if (sl->stream)
        (void)cudaStreamSynchronize(sl->stream);
    if (sl->stream)
        tdc_checks_close(&sl->checks, &sl->kd, sl->stream);
    if (sl->blas)
        cuda_blas.destroy(sl->blas);
    if (sl->stream)
        (void)cudaStreamDestroy(sl->stream);
    (void)cudaGetLastError();
    sl->blas = NULL;
    sl->stream = NULL;
}

/* Makes sl's stream and cuBLAS handle (on the current device). */
static int slot_open(cuda_slot *sl, int sms, char *why, size_t why_len)
{
    cudaError_t e = cudaStreamCreateWithFlags(&sl->stream, cudaStreamNonBlocking);
    if (e) {
        snprintf(why, why_len, "cudaStreamCreate: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        sl->stream = NULL;
        return -1;
    }
    cublasStatus_t s = cuda_blas.create(&sl->blas);
    if (s != CUBLAS_STATUS_SUCCESS)
        sl->blas = NULL;
    else
        s = cuda_blas.set_stream(sl->blas, sl->stream);
    if (s == CUBLAS_STATUS_SUCCESS && gemm_tf32)
        s = cuda_blas.set_math_mode(sl->blas, CUBLAS_TF32_TENSOR_OP_MATH);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, why_len, "cuBLAS: %s", cuda_blas.status_string(s));
        slot_close(sl);
        return -1;
    }
    sl->kd.stream = sl->stream;
    sl->kd.sms = sms;
    tdc_checks_open(&sl->checks, &sl->kd);
    return 0;
}

static void dev_close(cuda_dev *dv)
{
    if (!dv->slots)
        return;
    if (cudaSetDevice(dv->id) == cudaSuccess)
        for (int i = dv->nslots - 1; i >= 0; i--)
            slot_close(&dv->slots[i]);
    for (int i = 0; i < dv->nslots; i++)
        pthread_mutex_destroy(&dv->slots[i].issue);
    pthread_mutex_destroy(&dv->lock);
    free(dv->slots);
    free(dv->sess);
    free(dv->mem);
    dv->slots = NULL;
}

static int dev_open(cuda_dev *dv, int id, char *why, size_t why_len)
{
    memset(dv, 0, sizeof *dv);
    dv->id = id;
    struct cudaDeviceProp p;
    int pools = 0;
    cudaError_t e = cudaSetDevice(id);
    if (!e)
        e = cudaGetDeviceProperties(&p, id);
    if (!e)
        e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, id);
    if (e) {
        snprintf(why, why_len, "device %d: %s", id, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return -1;
    }
    if (!pools) {
        /* Storage lifetime rests on stream-ordered free (see the top of this file). */
        snprintf(why, why_len, "device %d (%s): no stream-ordered allocator", id, p.name);
        return -1;
    }
    /* Keep freed blocks in the pool: by default it shrinks at every synchronisation and
     * the next allocation pays cudaMalloc's price again. */
    cudaMemPool_t pool;
    uint64_t keep = UINT64_MAX;
    if (!cudaDeviceGetDefaultMemPool(&pool, id))
        (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    dv->nslots = 1 + streams_per_device;
    dv->slots = calloc((size_t)dv->nslots, sizeof *dv->slots);
    dv->mem_cap = 1024;
    dv->mem = calloc(dv->mem_cap, sizeof *dv->mem);
    if (!dv->slots || !dv->mem) {
        free(dv->slots);
        free(dv->mem);
        dv->slots = NULL;
        snprintf(why, why_len, "device %d: out of host memory", id);
        return -1;
    }
    pthread_mutex_init(&dv->lock, NULL);
    for (int i = 0; i < dv->nslots; i++) {
        dv->slots[i].dev = dv;
        dv->slots[i].idx = i;
        pthread_mutex_init(&dv->slots[i].issue, NULL);
    }
    char sw[128];
    if (slot_open(&dv->slots[0], p.multiProcessorCount, sw, sizeof sw)) {
        snprintf(why, why_len, "device %d: %s", id, sw);
        dev_close(dv);
        return -1;
    }
    dv->mem_total = (uint64_t)p.totalGlobalMem;
    snprintf(dv->name, sizeof dv->name, "%.96s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major,
             p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024));
    return 0;
}

/* ------------------------------------------------------------------ streams */

/* Work issued on `to` from now on runs after everything issued on `from` so far. Under the
 * device's lock (from's stream stays). */
static int stream_after(cuda_dev *dv, cuda_slot *from, cuda_slot *to)
{
    if (from == to || !from->stream)
        return 0;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e)
        return cuda_rc(dv, e, "cudaEventCreate");
    e = cudaEventRecord(ev, from->stream);
    if (!e)
        e = cudaStreamWaitEvent(to->stream, ev, 0);
    (void)cudaEventDestroy(ev); /* the wait keeps what it needs */
    return cuda_rc(dv, e, "cross-stream event");
}

static size_t mem_home(const cuda_dev *dv, uintptr_t base)
{
    uint64_t h = (uint64_t)(base >> 4) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 20) & (dv->mem_cap - 1);
}

static mem_rec *mem_find(cuda_dev *dv, uintptr_t base)
{
    for (size_t i = mem_home(dv, base);; i = (i + 1) & (dv->mem_cap - 1)) {
        if (dv->mem[i].base == base)
            return &dv->mem[i];
        if (!dv->mem[i].base)
            return NULL;
    }
}

/* The allocation holding [p, p + n): its base exactly, else a walk of the table (copies of
 * views that start inside their storage). NULL: memory this backend did not hand out. */
static mem_rec *mem_holding(cuda_dev *dv, const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    mem_rec *r = mem_find(dv, a);
    if (r)
        return r;
    for (size_t i = 0; i < dv->mem_cap; i++)
        if (dv->mem[i].base && a >= dv->mem[i].base && a - dv->mem[i].base < dv->mem[i].size &&
            n <= dv->mem[i].size - (a - dv->mem[i].base))
            return &dv->mem[i];
    return NULL;
}

static bool mem_insert(cuda_dev *dv, uintptr_t base, size_t size, int slot)
{
    if (2 * (dv->nmem + 1) > dv->mem_cap) {
        size_t old_cap = dv->mem_cap;
        mem_rec *old = dv->mem, *grown = calloc(2 * old_cap, sizeof *grown);
        if (!grown)
            return false;
        dv->mem = grown;
        dv->mem_cap = 2 * old_cap;
        dv->nmem = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].base)
                (void)mem_insert(dv, old[i].base, old[i].size, old[i].last);
        free(old);
    }
    size_t i = mem_home(dv, base);
    while (dv->mem[i].base)
        i = (i + 1) & (dv->mem_cap - 1);
    dv->mem[i] = (mem_rec){.base = base, .size = size, .last = slot};
    dv->nmem++;
    return true;
}

/* Removes r, moving back the entries of its probe run that would no longer be found. */
static void mem_erase(cuda_dev *dv, mem_rec *r)
{
    size_t mask = dv->mem_cap - 1, i = (size_t)(r - dv->mem), j = i;
    dv->mem[i].base = 0;
    for (;;) {
        j = (j + 1) & mask;
        if (!dv->mem[j].base)
            break;
        size_t h = mem_home(dv, dv->mem[j].base);
        /* j stays where it is when its home lies cyclically in (i, j] */
        if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
            continue;
        dv->mem[i] = dv->mem[j];
        dv->mem[j].base = 0;
        i = j;
    }
    dv->nmem--;
}

/* The slot of session on dv, made at its first use there (slot 0 for no session, or when a
 * stream cannot be made: the device's own stream is as correct, only shared). */
static cuda_slot *slot_for(cuda_dev *dv, uint64_t session)
{
    if (!session)
        return &dv->slots[0];
    pthread_mutex_lock(&dv->lock);
    cuda_slot *sl = NULL;
    for (size_t i = 0; i < dv->nsess && !sl; i++)
        if (dv->sess[i].session == session)
            sl = &dv->slots[dv->sess[i].slot];
    if (sl) {
        pthread_mutex_unlock(&dv->lock);
        return sl;
    }
    if (dv->nsess == dv->sess_cap) {
        size_t cap = dv->sess_cap ? 2 * dv->sess_cap : 16;
        sess_rec *grown = realloc(dv->sess, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&dv->lock);
            return &dv->slots[0];
        }
        dv->sess = grown;
        dv->sess_cap = cap;
    }
    for (int i = 1; i < dv->nslots && !sl; i++)
        if (dv->slots[i].sessions == 0)
            sl = &dv->slots[i];
    if (!sl) /* every slot taken: share them round robin */
        sl = &dv->slots[1 + (int)(dv->rr++ % (unsigned)(dv->nslots - 1))];
    if (!sl->stream) {
        char why[128];
        if (cudaSetDevice(dv->id) || slot_open(sl, dv->slots[0].kd.sms, why, sizeof why)) {
            (void)cudaGetLastError();
            pthread_mutex_unlock(&dv->lock);
            return &dv->slots[0];
        }
    }
    sl->sessions++;
    dv->sess[dv->nsess++] = (sess_rec){.session = session, .slot = sl->idx};
    pthread_mutex_unlock(&dv->lock);
    return sl;
}

/* The session ended: its slot goes when no other session issues on it. The device's own
 * stream waits for the slot's work and takes over as the last user of its blocks. */
static void cuda_session_end(void *ctx, uint64_t session)
{
    cuda_ctx *c = ctx;
    for (int d = 0; c && d < c->n; d++) {
        cuda_dev *dv = &c->dev[d];
        pthread_mutex_lock(&dv->lock);
        for (size_t i = 0; i < dv->nsess; i++) {
            if (dv->sess[i].session != session)
                continue;
            cuda_slot *sl = &dv->slots[dv->sess[i].slot];
            dv->sess[i] = dv->sess[--dv->nsess];
            if (--sl->sessions == 0 && cudaSetDevice(dv->id) == cudaSuccess) {
                (void)stream_after(dv, sl, &dv->slots[0]);
                tdc_checks_close(&sl->checks, &sl->kd, dv->slots[0].stream);
                for (size_t k = 0; k < dv->mem_cap; k++)
                    if (dv->mem[k].base && dv->mem[k].last == sl->idx)
                        dv->mem[k].last = 0;
                if (sl->blas)
                    cuda_blas.destroy(sl->blas);
                (void)cudaStreamDestroy(sl->stream); /* its queued work still completes */
                (void)cudaGetLastError();
                sl->blas = NULL;
                sl->stream = NULL;
            }
            break;
        }
        pthread_mutex_unlock(&dv->lock);
    }
}

/* Orders sl's next work on the block holding [p, p + n) after its last user's. */
int cuda_mem_use(cuda_dev *dv, cuda_slot *sl, const void *p, size_t n)
{
    if (!p)
        return 0;
    int rc = 0;
    pthread_mutex_lock(&dv->lock);
    mem_rec *r = mem_holding(dv, p, n ? n : 1);
    if (r && r->last != sl->idx) {
        rc = stream_after(dv, &dv->slots[r->last], sl);
        if (!rc)
            r->last = sl->idx;
    }
    pthread_mutex_unlock(&dv->lock);
    return rc;
}

/* Binds this thread to session's slot on dv for one call (cuda_cur_slot; the slot's issue lock). */
cuda_slot *cuda_call_begin(cuda_dev *dv)
{
    cuda_slot *sl = slot_for(dv, tdd_backend_session);
    pthread_mutex_lock(&sl->issue);
    cuda_cur_slot = sl;
    return sl;
}

void cuda_call_end(cuda_slot *sl)
{
    cuda_cur_slot = NULL;
    pthread_mutex_unlock(&sl->issue);
}

static int cuda_init(const tdd_backend_config *cfg, void **ctxp, char *why, size_t why_len)
{
    if (cfg && cfg->cuda_streams > 0)
        streams_per_device = cfg->cuda_streams;
    gemm_tf32 = cfg && cfg->cuda_tf32;
#ifdef TDC_EMU
    tdc_emu_configure(cfg ? cfg->emu_gpus : 0, cfg ? cfg->emu_gpu_memory : 0);
    tdc_emu_configure_sms(cfg ? cfg->emu_sms : 0);
#else
    if (cfg && cfg->emu_gpus > 0)
        fprintf(stderr, "tensordd: --emu-gpus: emulated GPUs are the `make emu` build's "
                        "(build/emu/tensordd); ignored here\n");
#endif
    char scratch[256];
    if (!why) {
        why = scratch;
        why_len = sizeof scratch;
    }
    *ctxp = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* No driver, or no device: the daemon serves the CPU backends. The runtime reports
         * a missing driver as an old one; say which it was (cudart has already tried to
         * load libcuda, so RTLD_NOLOAD only asks whether that worked). */
        void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (e == cudaErrorInsufficientDriver && !drv)
            snprintf(why, why_len, "cudaGetDeviceCount: no CUDA driver (libcuda.so.1 not found)");
        else
            snprintf(why, why_len, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        if (drv)
            dlclose(drv);
        (void)cudaGetLastError();
        return 0;
    }
    if (n <= 0) {
        snprintf(why, why_len, "cudaGetDeviceCount: no CUDA device");
        return 0;
    }
    if (blas_load(why, why_len))
        return 0; /* GPUs without cuBLAS: serve the CPU backends, and say why */
    cuda_ctx *c = calloc(1, sizeof *c + (size_t)n * sizeof(cuda_dev));
    if (!c)
        return TD_ERESOURCE_EXHAUSTED;
    for (int id = 0; id < n; id++)
        if (dev_open(&c->dev[c->n], id, why, why_len) == 0) {
            c->dev[c->n].ord = c->n;
            c->n++;
        }
    if (c->n == 0) {
        free(c);
        return 0; /* why says what the last device lacked */
    }
    *ctxp = c;
    return c->n;
}

static void cuda_shutdown(void *ctx)
{
    cuda_ctx *c = ctx;
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        dev_close(&c->dev[i]);
    free(c);
}

static void cuda_device_name(void *ctx, int ordinal, char *buf, size_t len)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    snprintf(buf, len, "%s", dv ? dv->name : "unknown CUDA device");
}

static uint64_t cuda_memory_total(void *ctx, int ordinal)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    return dv ? dv->mem_total : 0;
}

/* ------------------------------------------------------------------ memory */

static void *cuda_alloc(void *ctx, int ordinal, size_t nbytes)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    void *p = NULL;
    last_alloc_error = cudaErrorInvalidDevice;
    if (!dv || cuda_dev_failed(dv))
        return NULL;
    cudaError_t e = cudaSetDevice(dv->id);
    /* Stream-ordered: usable by the session's work issued after this (other slots wait for
     * this one through the table before their first use). */
    cuda_slot *sl = e ? NULL : slot_for(dv, tdd_backend_session);
    if (!e)
        e = cudaMallocAsync(&p, nbytes ? nbytes : 1, sl->stream);
    last_alloc_error = e;
    if (e) {
        (void)cuda_rc(dv, e, "cudaMallocAsync"); /* a sticky error marks the device failed */
        return NULL;
    }
    pthread_mutex_lock(&dv->lock);
    bool kept = mem_insert(dv, (uintptr_t)p, nbytes ? nbytes : 1, sl->idx);
    pthread_mutex_unlock(&dv->lock);
    if (!kept) {
        (void)cudaFreeAsync(p, sl->stream);
        last_alloc_error = cudaErrorMemoryAllocation;
        snprintf(cuda_last_err, sizeof cuda_last_err, "no host memory for the allocation table");
        return NULL;
    }
    return p;
}

/* Why cuda_alloc just failed on this thread, as a typed error. */
static int cuda_alloc_error(void *ctx, int ordinal, size_t nbytes, td_error *err)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    if (!dv)
        return td_error_set(err, TD_EINTERNAL, "cuda:%d: no such device", ordinal);
    int rc = cuda_dev_failed(dv);
    if (rc)
        return td_error_set(err, rc, "%s", cuda_last_err);
    if (last_alloc_error != cudaErrorMemoryAllocation)
        return td_error_set(err, TD_EDEVICE_ERROR, "cuda:%d: %s", ordinal, cuda_last_err);
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(dv->id) || cudaMemGetInfo(&free_b, &total_b))
        (void)cudaGetLastError(); /* free stays 0: unknown */
    char res[32];
    snprintf(res, sizeof res, "cuda:%d memory", ordinal);
    return tdd_err_resource(err, res, nbytes, free_b,
                            "%s: %zu bytes requested, %zu free (of %zu): %s", res, nbytes, free_b,
                            total_b, cudaGetErrorName(last_alloc_error));
}

static void cuda_error_message(void *ctx, int ordinal, int rc, char *buf, size_t len)
{
    (void)ctx, (void)ordinal, (void)rc;
    snprintf(buf, len, "%s", cuda_last_err);
}

static int cuda_device_status(void *ctx, int ordinal, char *why, size_t len)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    if (!dv || !atomic_load(&dv->failed))
        return 0;
    if (len)
        snprintf(why, len, "%s", dv->why);
    return TD_EDEVICE_UNAVAILABLE;
}

static void cuda_free(void *ctx, int ordinal, void *p, size_t nbytes)
{
    (void)nbytes;
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    if (!dv || !p || cudaSetDevice(dv->id) != cudaSuccess)
        return;
    /* On the last user's stream: after every kernel already enqueued there, which itself
     * waited for the users before it. */
    pthread_mutex_lock(&dv->lock);
    mem_rec *r = mem_find(dv, (uintptr_t)p);
    cuda_slot *sl = &dv->slots[r ? r->last : 0];
    if (r)
        mem_erase(dv, r);
    cuda_rc(dv, cudaFreeAsync(p, sl->stream), "cudaFreeAsync");
    pthread_mutex_unlock(&dv->lock);
}

/* After a read of sl's checks: the calling session's first refused one, as the op itself
 * answered when its check synchronised. */
static int checks_refused(cuda_dev *dv, cuda_slot *sl)
{
    tdd_op op;
    if (!tdc_checks_take(&sl->checks, tdd_backend_session, &op))
        return 0;
    snprintf(cuda_last_err, sizeof cuda_last_err,
             "%s on cuda:%d refused a value (an index or class out of range, or an integer "
             "power or division it cannot take), found at this synchronising point",
             op < TDD_OP_COUNT ? tdd_opdefs[op].name : "an op", dv->ord);
    return TD_EINVALID_ARGUMENT;
}

static int cuda_copy_host(void *ctx, int ordinal, void *dst, const void *src, size_t n,
                          enum cudaMemcpyKind kind)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    if (!dv)
        return TD_EINTERNAL;
    cuda_last_err[0] = 0;
    int rc = cuda_dev_failed(dv);
    if (rc || n == 0)
        return rc;
    if ((rc = cuda_rc(dv, cudaSetDevice(dv->id), "cudaSetDevice")))
        return rc;
    cuda_slot *sl = cuda_call_begin(dv);
    rc = cuda_mem_use(dv, sl, kind == cudaMemcpyHostToDevice ? dst : src, n);
    cudaError_t e = cudaSuccess;
    if (!rc)
        e = cudaMemcpyAsync(dst, src, n, kind, sl->stream);
    /* The host buffer belongs to the caller once we return. A download is where the
     * session learns of its refused value checks; an upload leaves them for it. */
    if (!rc && !e)
        e = kind == cudaMemcpyDeviceToHost ? tdc_checks_sync(&sl->checks, sl->stream)
                                           : cudaStreamSynchronize(sl->stream);
    if (!rc)
        rc = cuda_rc(dv, e, kind == cudaMemcpyHostToDevice ? "upload" : "download");
    if (!rc && kind == cudaMemcpyDeviceToHost)
        rc = checks_refused(dv, sl);
    cuda_call_end(sl);
    return rc;
}

static int cuda_from_host(void *ctx, int ordinal, void *dst, const void *src, size_t n)
{
    return cuda_copy_host(ctx, ordinal, dst, src, n, cudaMemcpyHostToDevice);
}

static int cuda_to_host(void *ctx, int ordinal, void *dst, const void *src, size_t n)
{
    return cuda_copy_host(ctx, ordinal, dst, src, n, cudaMemcpyDeviceToHost);
}

static int cuda_synchronize(void *ctx, int ordinal)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    if (!dv)
        return TD_EINTERNAL;
    cuda_last_err[0] = 0;
    int rc = cuda_dev_failed(dv);
    if (rc || (rc = cuda_rc(dv, cudaSetDevice(dv->id), "cudaSetDevice")))
        return rc;
    cuda_slot *sl = cuda_call_begin(dv);
    rc = cuda_rc(dv, tdc_checks_sync(&sl->checks, sl->stream), "synchronize");
    if (!rc)
        rc = checks_refused(dv, sl);
    cuda_call_end(sl);
    return rc;
}

/* Whether the session's slot on dv holds value checks not read yet (the daemon's
 * synchronising requests then synchronize() first). Makes no slot. */
static bool cuda_checks_pending(void *ctx, int ordinal, uint64_t session)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    if (!dv || atomic_load(&dv->failed))
        return false;
    bool pending = false;
    pthread_mutex_lock(&dv->lock);
    for (size_t i = 0; i < dv->nsess; i++)
        if (dv->sess[i].session == session)
            pending = tdc_checks_unread(&dv->slots[dv->sess[i].slot].checks);
    if (!session)
        pending = tdc_checks_unread(&dv->slots[0].checks);
    pthread_mutex_unlock(&dv->lock);
    return pending;
}

/* The fused optimizer step (cuda_optim.c) as one call of the session: its tensors wait for
 * their last users on other slots first. */
static bool cuda_optim_fused(void *ctx, int ordinal, int kind, td_dtype dt)
{
    (void)ctx, (void)ordinal;
    return tdc_optim_fused(kind, dt);
}

static int cuda_optim_step(void *ctx, int ordinal, const tdd_fused_hyper *h,
                           const tdd_fused_param *ps, size_t n)
{
    cuda_dev *dv = cuda_dev_of(ctx, ordinal);
    if (!dv)
        return TD_EINTERNAL;
    cuda_last_err[0] = 0;
    int rc = cuda_dev_failed(dv);
    if (rc || (rc = cuda_rc(dv, cudaSetDevice(dv->id), "cudaSetDevice")))
        return rc;
    cuda_slot *sl = cuda_call_begin(dv);
    for (size_t i = 0; i < n && !rc; i++)
        for (int k = 0; k < 5 && !rc; k++) {
            const tdd_tensor *t = k == 0 ? ps[i].p : k == 1 ? ps[i].g : ps[i].buf[k - 2];
            if (t && t->st)
                rc = cuda_mem_use(dv, sl, t->st->data, t->st->nbytes);
        }
    if (!rc)
        rc = cuda_rc(dv, tdc_optim_group(&sl->kd, h, ps, n), "optimizer step");
    cuda_call_end(sl);
    return rc;
}

const tdd_backend tdd_backend_cuda = {
    .name = "cuda",
    .host_memory = false,
    .init = cuda_init,
    .shutdown = cuda_shutdown,
    .device_name = cuda_device_name,
    .memory_total = cuda_memory_total,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .from_host = cuda_from_host,
    .to_host = cuda_to_host,
    .supports = cuda_supports,
    .execute = cuda_execute,
    .synchronize = cuda_synchronize,
    .checks_pending = cuda_checks_pending,
    .optim_fused = cuda_optim_fused,
    .optim_step = cuda_optim_step,
    .session_end = cuda_session_end,
    .alloc_error = cuda_alloc_error,
    .error_message = cuda_error_message,
    .device_status = cuda_device_status,
};
