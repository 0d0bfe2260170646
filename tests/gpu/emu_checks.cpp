// emu_checks.cpp -- the CUDA emulator's memory checks (backends/cuda/emu/runtime.cpp) held to
// what they promise, with small kernels compiled as kernels.cu is (instrumented): a store
// one element past an allocation's exact end faults although it lands in the allocation's
// 16-byte slack (memcheck), and in race mode (TDD_EMU_CHECK=1, set here) a plain += by
// many threads to one word faults while atomicAdd does not (global races, between blocks
// and within one), shared memory read before the barrier that orders it faults
// (racecheck), a load of memory nothing wrote faults until a memset writes it (initcheck);
// TDD_EMU_SMS sets the multiprocessor count. Each fault is sticky: each case has a device
// of its own. Built and run by `make test-emu`.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "emu_check.h"

__global__ void fill_upto(float *y, int n, int inclusive)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n || (inclusive && i == n))
        y[i] = 1.0f;
}

__global__ void count_plain(float *total)
{
    *total += 1.0f; // every thread: a race
}

__global__ void count_atomic(float *total)
{
    atomicAdd(total, 1.0f);
}

// Thread t reads what thread t - 1 wrote in shared memory, with or without the barrier.
__global__ void neighbour(int *out, int barrier)
{
    __shared__ int s[64];
    int t = (int)threadIdx.x;
    s[t] = t;
    if (barrier)
        __syncthreads();
    out[t] = t > 0 ? s[t - 1] : -1;
}

__global__ void copy(const float *x, float *y, int n)
{
    int i = (int)threadIdx.x;
    if (i < n)
        y[i] = x[i];
}

// Synchronises device d and returns its error (a kernel's fault shows here, sticky).
static cudaError_t sync_on(int d)
{
    cudaSetDevice(d);
    return cudaDeviceSynchronize();
}

int main()
{
    setenv("TDD_EMU_CHECK", "1", 1);
    setenv("TDD_EMU_SMS", "132", 1);
    tdc_emu_configure(9, 16ull << 20);
    int n = 0, sms = 0;
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 9, "%d devices", n);
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess &&
              sms == 132,
          "%d SMs", sms);
    float h[8] = {0};

    // ---- memcheck: 5 floats (20 bytes, 32 with the slack); i <= n writes byte 20
    cudaSetDevice(0);
    float *y;
    CHECK(cudaMalloc((void **)&y, 5 * sizeof(float)) == cudaSuccess, "malloc");
    tdc_launch(1, 32, 0, nullptr, fill_upto)(y, 5, 0);
    CHECK(sync_on(0) == cudaSuccess, "in bounds");
    tdc_launch(1, 32, 0, nullptr, fill_upto)(y, 5, 1);
    CHECK(sync_on(0) == cudaErrorIllegalAddress, "one past the exact end: %s",
          cudaGetErrorName(sync_on(0)));

    // ---- racecheck, global memory: 2 blocks of 64 threads adding to one float
    for (int atomic = 0; atomic < 2; atomic++) {
        int d = 1 + atomic;
        cudaSetDevice(d);
        float *t;
        CHECK(cudaMalloc((void **)&t, sizeof(float)) == cudaSuccess, "malloc");
        cudaMemset(t, 0, sizeof(float));
        if (atomic)
            tdc_launch(2, 64, 0, nullptr, count_atomic)(t);
        else
            tdc_launch(2, 64, 0, nullptr, count_plain)(t);
        cudaError_t e = sync_on(d);
        if (atomic) {
            CHECK(e == cudaSuccess, "atomicAdd: %s", cudaGetErrorName(e));
            cudaMemcpy(h, t, sizeof(float), cudaMemcpyDeviceToHost);
            CHECK(h[0] == 128.0f, "atomicAdd total %g", h[0]);
        } else {
            CHECK(e == cudaErrorLaunchFailure, "plain +=: %s", cudaGetErrorName(e));
        }
    }
    // one block: the race is between threads with no barrier
    cudaSetDevice(3);
    float *t1;
    cudaMalloc((void **)&t1, sizeof(float));
    cudaMemset(t1, 0, sizeof(float));
    tdc_launch(1, 2, 0, nullptr, count_plain)(t1);
    CHECK(sync_on(3) == cudaErrorLaunchFailure, "two threads' +=");
    // two blocks of one thread: nothing orders blocks
    cudaSetDevice(8);
    float *t2;
    cudaMalloc((void **)&t2, sizeof(float));
    cudaMemset(t2, 0, sizeof(float));
    tdc_launch(2, 1, 0, nullptr, count_plain)(t2);
    CHECK(sync_on(8) == cudaErrorLaunchFailure, "two blocks' +=");

    // ---- racecheck, shared memory
    for (int barrier = 0; barrier < 2; barrier++) {
        int d = 4 + barrier;
        cudaSetDevice(d);
        int *out;
        cudaMalloc((void **)&out, 64 * sizeof(int));
        tdc_launch(1, 64, 0, nullptr, neighbour)(out, barrier);
        cudaError_t e = sync_on(d);
        CHECK(barrier ? e == cudaSuccess : e == cudaErrorLaunchFailure, "barrier %d: %s", barrier,
              cudaGetErrorName(e));
    }

    // ---- initcheck: a load of fresh memory, then of memory a memset wrote
    for (int written = 0; written < 2; written++) {
        int d = 6 + written;
        cudaSetDevice(d);
        float *x, *z;
        cudaMalloc((void **)&x, 8 * sizeof(float));
        cudaMalloc((void **)&z, 8 * sizeof(float));
        if (written)
            cudaMemset(x, 0, 8 * sizeof(float));
        tdc_launch(1, 8, 0, nullptr, copy)(x, z, 8);
        cudaError_t e = sync_on(d);
        CHECK(written ? e == cudaSuccess : e == cudaErrorLaunchFailure, "written %d: %s", written,
              cudaGetErrorName(e));
    }

    printf("emulator memory checks: %d checks, %d failing\n", checks, failures);
    return failures ? 1 : 0;
}
