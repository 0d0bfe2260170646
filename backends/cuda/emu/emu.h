/* emu.h -- the CUDA runtime API as the emulated build sees it (`make emu`).
 *
 * backends/cuda is compiled by the host compilers against backends/cuda/emu/include, whose
 * cuda_runtime_api.h and cuda_runtime.h land here: the types, enums and functions that
 * cuda.c and kernels.cu use, with the toolkit's names and values, implemented by
 * runtime.cpp over host memory. Plain C (cuda.c is C11 with -Wpedantic); the device side
 * (threadIdx, __syncthreads, shuffles, the launch macro) is emu_device.h, C++ only.
 *
 * What the emulated devices are, and the fault injection, is set by tdc_emu_configure()
 * (the daemon's --emu-gpus and --emu-gpu-memory) or the environment:
 *   TDD_EMU_GPUS=N           devices when nothing configured them (default 0: no device)
 *   TDD_EMU_GPU_MEMORY=BYTES memory per device (default 1 GiB)
 *   TDD_EMU_SEED=N           seed of the fibers' resume order at barriers (default 1)
 *   TDD_EMU_FAIL_ALLOC=N     the Nth device allocation of the process fails (out of memory)
 *   TDD_EMU_STICKY_LAUNCH=N  the Nth kernel launch of the process raises a sticky error
 *                            (cudaErrorIllegalAddress) on its device, as a faulting kernel
 *                            does: every later call on that device fails with it
 *   TDD_EMU_TRACE=1          one line on stderr per kernel launch (name, grid, block,
 *                            device, stream id; 0 is the legacy stream) and per stream made
 *                            or destroyed
 *   TDD_EMU_DEFER=1          deferred streams: the work of created streams runs only when
 *                            something forces it (runtime.cpp says what), so streams run out
 *                            of order wherever CUDA lets them: a missing event or a free
 *                            reused too early shows as a wrong value or an illegal address
 *   TDD_EMU_DEFER=2          the same, but each device's first stream (the daemon's device
 *                            stream) runs its work at once: work issued there that should
 *                            wait for a session's deferred stream (a free on the wrong
 *                            stream) runs before it
 *   TDD_EMU_DEFER_STREAM=ID  only the stream with this id is deferred (ids count the
 *                            streams made, from 1: in the daemon, one per device at start,
 *                            then one per session slot as sessions first use a device)
 *   TDD_EMU_DEFER_DEPTH=N    a deferred stream runs its queue past N items (default 1024)
 *   TDD_EMU_SMS=N            multiprocessors each device reports (default 2; the daemon's
 *                            --emu-sms), which sizes the backend's grids
 *   TDD_EMU_CHECK=1          race mode (runtime.cpp's memory checks): fibers interleave at
 *                            every global and shared memory access in the seeded order,
 *                            unordered conflicting accesses of one launch (racecheck) and
 *                            loads of memory nothing wrote (initcheck) are kernel faults.
 *                            Accesses outside an allocation's exact size (memcheck) are
 *                            faults in every mode.
 *   TDD_EMU_PROFILE=PATH     one JSON line per kernel launch (and cuBLAS GEMM) appended to
 *                            PATH: global bytes read and written, 32-byte sectors per warp
 *                            request against the fewest possible (coalescing), the launch's
 *                            distinct bytes, shared-memory bank wavefronts, FLOPs
 *                            (runtime.cpp's profile section; tools/gpu_report.py reads it);
 *                            and one line per host wait ({"sync": "cudaStreamSynchronize",
 *                            "device": N}), counted by the tests of deferred value checks */
#ifndef TDC_EMU_H
#define TDC_EMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The toolkit's numbers (driver_types.h), so logs read the same as on a GPU. */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorDevicesUnavailable = 46,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorECCUncorrectable = 214,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchTimeout = 702,
    cudaErrorHardwareStackError = 714,
    cudaErrorIllegalInstruction = 715,
    cudaErrorMisalignedAddress = 716,
    cudaErrorInvalidPc = 718,
    cudaErrorLaunchFailure = 719,
    cudaErrorUnknown = 999
} cudaError_t;

typedef struct tdc_emu_stream *cudaStream_t;
typedef struct tdc_emu_event *cudaEvent_t;
typedef struct tdc_emu_pool *cudaMemPool_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMemoryPoolsSupported = 115 };
enum cudaMemPoolAttr { cudaMemPoolAttrReleaseThreshold = 4 };

#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

/* The fields the backend reads (the real struct has many more). */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    int warpSize;
    int maxThreadsPerBlock;
    size_t sharedMemPerBlock;
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value);

cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);

cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemset(void *p, int value, size_t n);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* ---- the emulator's own controls */

/* Devices and memory per device (0: keep the environment's or the default). Call before
 * the first runtime call; later calls are ignored. */
void tdc_emu_configure(int gpus, uint64_t memory_per_gpu);
/* Multiprocessors each device reports (0: keep TDD_EMU_SMS or the default 2); before the
 * first runtime call. */
void tdc_emu_configure_sms(int sms);
/* Bytes allocated on device now (tests compare it with a baseline). */
uint64_t tdc_emu_bytes_in_use(int device);
/* Raises a sticky error on device (as a faulting kernel would). */
void tdc_emu_raise_sticky(int device, cudaError_t e);
/* Streams created from now on are deferred (on != 0) or run their work at once. */
void tdc_emu_defer_streams(int on);
/* Streams created and not destroyed on device; streams created in all. */
int tdc_emu_streams_live(int device);
long tdc_emu_streams_created(void);

#ifdef __cplusplus
}
#endif
#endif
