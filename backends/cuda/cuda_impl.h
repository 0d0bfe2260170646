/* cuda_impl.h -- what the cuda backend's two halves share: the device, stream and allocation
 * records (cuda.c makes and tears them down) and the calls the execution half (cuda_exec.c)
 * issues through. Private to backends/cuda. */
#ifndef TDD_CUDA_IMPL_H
#define TDD_CUDA_IMPL_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cublas_abi.h"
#include "cuda_checks.h"
#include "cuda_optim.h"
#include "dtype.h"
#include "iter.h"
#include "kernels.h"
#include "td_error_set.h"
#ifdef TDC_EMU
#include "emu/emu_cublas.h"
#endif

/* cuBLAS is opened when a GPU is found, not linked: its initialisers alone cost
 * about 150 MiB of RSS in a daemon that has no GPU to use it with. The pointer
 * types are checked against cublas_v2.h wherever it is installed (cublas_abi.h). */
typedef struct {
    void *lib;
    tdd_cublas_create_fn *create;
    tdd_cublas_destroy_fn *destroy;
    tdd_cublas_set_stream_fn *set_stream;
    tdd_cublas_sgemm_fn *sgemm;
    tdd_cublas_sgemm_strided_batched_fn *sgemm_strided_batched;
    tdd_cublas_status_string_fn *status_string;
    tdd_cublas_set_math_mode_fn *set_math_mode;
    tdd_cublas_gemm_ex_fn *gemm_ex;
    tdd_cublas_gemm_strided_batched_ex_fn *gemm_strided_batched_ex;
} cuda_blas_api;

extern cuda_blas_api cuda_blas;

/* A stream and what issues on it. */
typedef struct cuda_slot {
    struct cuda_dev *dev;
    int idx;
    cudaStream_t stream; /* NULL: not made (a session slot nobody uses) */
    cublasHandle_t blas;
    tdc_dev kd;
    tdc_checks checks;     /* kernels' value checks, read at the next sync (cuda_checks.h) */
    int sessions;          /* sessions issuing on it (session slots); under the device's lock */
    pthread_mutex_t issue; /* the sessions sharing it issue one call at a time */
} cuda_slot;

/* A live allocation: the slot that last issued work on it (open addressing on base). */
typedef struct {
    uintptr_t base; /* 0: empty */
    size_t size;
    int last;
} mem_rec;

typedef struct {
    uint64_t session;
    int slot;
} sess_rec;

typedef struct cuda_dev {
    int id;               /* CUDA device number (ordinals skip devices that failed to open) */
    pthread_mutex_t lock; /* slots' sessions and streams, sessions, the allocation table */
    cuda_slot *slots;     /* [0]: the device's own stream; [1..nslots): sessions' */
    int nslots;
    unsigned rr; /* the next shared slot */
    sess_rec *sess;
    size_t nsess, sess_cap;
    mem_rec *mem;
    size_t nmem, mem_cap; /* a power of two */
    uint64_t mem_total;
    char name[160];
    int ord;            /* the daemon's ordinal: "cuda:<ord>" */
    atomic_int claimed; /* the first sticky error's call writes why, then sets failed */
    atomic_int failed;  /* a sticky error took the device out of service */
    char why[96];       /* which error, in which call */
} cuda_dev;

typedef struct {
    int n;
    cuda_dev dev[];
} cuda_ctx;

/* The device of ordinal (NULL when out of range). */
cuda_dev *cuda_dev_of(void *ctx, int ordinal);

/* The slot this thread issues on during a call (NULL between calls). */
extern _Thread_local cuda_slot *cuda_cur_slot;
/* The slot of the call in progress on dv (the device's own outside calls). */
cuda_slot *cuda_slot_now(cuda_dev *dv);

/* What the last failed call on this thread saw (error_message(), alloc_error()). */
#define CUDA_LAST_ERR 192
extern _Thread_local char cuda_last_err[CUDA_LAST_ERR];

/* DEVICE_UNAVAILABLE when a sticky error took dv out of service, else 0. */
int cuda_dev_failed(const cuda_dev *dv);
/* A CUDA error as a TD_E* code (cuda.c says which mark the device failed). */
int cuda_rc(cuda_dev *dv, cudaError_t e, const char *what);
/* A cuBLAS status as a TD_E* code. */
int cuda_blas_rc(cublasStatus_t s);
/* Orders sl's next work on the block holding [p, p + n) after its last user's. */
int cuda_mem_use(cuda_dev *dv, cuda_slot *sl, const void *p, size_t n);
/* Binds this thread to the calling session's slot on dv for one call, and lets it go. */
cuda_slot *cuda_call_begin(cuda_dev *dv);
void cuda_call_end(cuda_slot *sl);

/* The execution half (cuda_exec.c): what runs here, and running it. */
int cuda_supports(void *ctx, const tdd_opcall *c);
int cuda_execute(void *ctx, int ordinal, const tdd_opcall *c);

#endif
