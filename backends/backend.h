/* backend.h -- the table of functions every backend fills (the ggml pattern).
 *
 * A backend never aborts on client input: kernels receive only validated
 * calls (tdd_op_prepare ran first) and return TD_E* codes for anything they
 * cannot do. Optional slots may be NULL; daemon/device.c supplies defaults. */
#ifndef TDD_BACKEND_H
#define TDD_BACKEND_H

#include "ops.h"

typedef struct {
    int cpu_devices;         /* logical cpu devices to expose */
    int threads;             /* worker threads for the cpu backend; 0 = cores */
    int sim_devices;         /* simulated discrete devices (tests); 0 = none */
    int emu_gpus;            /* emulated CUDA devices (`make emu` build only); 0 = none */
    uint64_t emu_gpu_memory; /* bytes each (0: the emulator's default) */
    int emu_sms;             /* multiprocessors each reports (0: the emulator's default) */
    uint32_t shm_blocks;     /* host storage blocks in memfds at most (cpu/cpu_shm.h) */
    int cuda_streams;        /* CUDA streams per GPU for sessions (0: the backend's default) */
    bool cuda_tf32;          /* float32 GEMMs in TF32 (cuBLAS's tensor-op math) */
} tdd_backend_config;

/* The session whose work this thread issues now (0: none): the daemon sets it around a
 * session's allocations and tasks, so a backend with streams (cuda) can put each session's
 * work on a stream of its own without every call carrying it. */
extern _Thread_local uint64_t tdd_backend_session;

/* One optimizer step of a group of parameters in one go (optim.c's update rules, the
 * backend's fused kernel): SGD (kind 0), Adam (1), AdamW (2). */
typedef struct {
    int kind;
    bool nesterov, maximize, amsgrad;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
} tdd_fused_hyper;

typedef struct {
    const tdd_tensor *p, *g;  /* dense, one dtype */
    const tdd_tensor *buf[3]; /* the kind's state (NULL where it keeps none), dense */
    int64_t step;             /* the parameter's step count after this one */
    unsigned fresh;           /* bit k: buf[k] holds nothing yet */
} tdd_fused_param;

typedef struct tdd_backend {
    const char *name; /* "ref", "cpu", "cuda" */
    /* Storage is host memory: uploads land and downloads leave directly. */
    bool host_memory;
    /* Creates the context; returns the number of devices (>= 0; 0 means the
     * backend is built but has nothing to serve, e.g. no GPU driver) or a
     * negative TD_E* code. why (may be NULL) gets a line for the log. */
    int (*init)(const tdd_backend_config *cfg, void **ctx, char *why, size_t why_len);
    void (*shutdown)(void *ctx);
    void (*device_name)(void *ctx, int ordinal, char *buf, size_t len);
    /* optional: total memory in bytes (0 unknown) */
    uint64_t (*memory_total)(void *ctx, int ordinal);
    void *(*alloc)(void *ctx, int ordinal, size_t nbytes);
    void (*free)(void *ctx, int ordinal, void *p, size_t nbytes);
    /* optional: like alloc, but host memory a memfd holds, which a download to a client on
     * the same host can hand over sealed without a copy (cpu/cpu_shm.h); freed by free.
     * NULL: not here (alloc then serves). */
    void *(*alloc_shared)(void *ctx, int ordinal, size_t nbytes);
    /* optional when host_memory */
    int (*from_host)(void *ctx, int ordinal, void *dst, const void *src, size_t n);
    int (*to_host)(void *ctx, int ordinal, void *dst, const void *src, size_t n);
    /* 0, TD_EUNSUPPORTED_OP or TD_EUNSUPPORTED_DTYPE. optional: all supported */
    int (*supports)(void *ctx, const tdd_opcall *call);
    /* Runs one call on the device's worker thread. */
    int (*execute)(void *ctx, int ordinal, const tdd_opcall *call);
    /* optional: wait for the calling session's queued device work (tdd_backend_session);
     * a value check its kernels refused since the last read is its INVALID_ARGUMENT */
    int (*synchronize)(void *ctx, int ordinal);
    /* optional: whether session issued work whose value checks (indices in range) are not
     * read yet; a synchronising request (Sync) then calls synchronize() on the session's
     * worker first. Any thread; makes nothing. NULL: checks are never deferred. */
    bool (*checks_pending)(void *ctx, int ordinal, uint64_t session);
    /* optional: after alloc() returned NULL, on the thread that called it: fills err and
     * returns its code -- RESOURCE_EXHAUSTED naming the resource ("cuda:N memory"), the
     * requested and the free bytes, or DEVICE_UNAVAILABLE on a failed device. */
    int (*alloc_error)(void *ctx, int ordinal, size_t nbytes, td_error *err);
    /* optional: after a call returned rc != 0, on the thread that made it: a line naming
     * what the device reported (the CUDA error's name: "launch: cudaErrorIllegalAddress
     * (...)"); "" when nothing. */
    void (*error_message)(void *ctx, int ordinal, int rc, char *buf, size_t len);
    /* optional: 0 while the device serves; nonzero when a fault (a sticky CUDA error) took
     * it out of service, why (len > 0) saying which. */
    int (*device_status)(void *ctx, int ordinal, char *why, size_t len);
    /* optional: the session with this id ended (its tasks are done); what the backend kept
     * for it (a stream) goes. Its storage may live on. A backend that has it orders each
     * session's work itself, so the daemon gives its devices several lanes. */
    void (*session_end)(void *ctx, uint64_t session);
    /* optional: whether optim_step takes parameters of dtype dt for kind (tdd_fused_hyper). */
    bool (*optim_fused)(void *ctx, int ordinal, int kind, td_dtype dt);
    /* optional: one step of n parameters on the device, as the calling session's work
     * (torch's fused optimizers: one launch per dtype); 0 or a TD_E* code. */
    int (*optim_step)(void *ctx, int ordinal, const tdd_fused_hyper *h, const tdd_fused_param *ps,
                      size_t n);
} tdd_backend;

extern const tdd_backend tdd_backend_ref;
extern const tdd_backend tdd_backend_cpu;
extern const tdd_backend tdd_backend_cuda;
extern const tdd_backend tdd_backend_sim;

#endif
