// emu_selftest.cpp -- the CUDA emulator (backends/cuda/emu) held to CUDA's semantics with
// small kernels of its own: shuffles (idx, up, down, xor, width), votes, __syncthreads
// with shared memory, the seeded random resume order, atomics, launch-configuration and
// allocation errors, copy-kind checks, deadlock and exited-lane faults (sticky, per
// device), streams and events (order per stream, deferred streams out of order unless an
// event orders them, a free on the wrong stream faulting its late user), half/bfloat16
// rounding. Built and run by `make test-emu` (emulated build only).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "emu_check.h"

__global__ void shuffles(int *out)
{
    int t = (int)threadIdx.x, lane = t & 31, v = t * 10;
    int *o = out + t * 8;
    o[0] = __shfl_sync(0xffffffffu, v, 3);
    o[1] = __shfl_up_sync(0xffffffffu, v, 2);
    o[2] = __shfl_down_sync(0xffffffffu, v, 5);
    o[3] = __shfl_xor_sync(0xffffffffu, v, 1);
    o[4] = __shfl_sync(0xffffffffu, v, lane + 1, 8);
    o[5] = __shfl_down_sync(0xffffffffu, v, 3, 16);
    o[6] = (int)__ballot_sync(0xffffffffu, lane % 3 == 0);
    o[7] = __any_sync(0xffffffffu, lane == 7) + 2 * __all_sync(0xffffffffu, lane < 31);
}

// Thread t reads what thread t - 1 wrote, with or without the barrier between.
__global__ void neighbour(int *out, int k, int barrier)
{
    __shared__ int s[256];
    int t = (int)threadIdx.x;
    s[t] = k * 1000 + t;
    if (barrier)
        __syncthreads();
    out[t] = t > 0 ? s[t - 1] : k * 1000 - 1;
}

// A block-wide tree sum through shared memory; one atomicAdd per block into total.
__global__ void block_sum(const int *x, int *sums, int *total)
{
    __shared__ int s[128];
    int t = (int)threadIdx.x;
    s[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    for (int h = (int)blockDim.x / 2; h > 0; h >>= 1) {
        if (t < h)
            s[t] += s[t + h];
        __syncthreads();
    }
    if (t == 0) {
        sums[blockIdx.x] = s[0];
        atomicAdd(total, s[0]);
    }
}

__global__ void ids(int *out)
{
    int b = (int)(blockIdx.y * gridDim.x + blockIdx.x);
    int t = (int)((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x);
    out[b * (int)(blockDim.x * blockDim.y * blockDim.z) + t] = b * 1000 + t;
}

// Lane 0 waits at a shuffle for lanes that wait at a barrier for it.
__global__ void deadlock(int *out)
{
    int v = (int)threadIdx.x;
    if ((threadIdx.x & 31) == 0)
        v = __shfl_sync(0xffffffffu, v, 1);
    __syncthreads();
    out[threadIdx.x] = v;
}

__global__ void exited_lane(int *out)
{
    if ((threadIdx.x & 31) >= 16)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void fill(int *out, int v)
{
    out[threadIdx.x] = v;
}

__global__ void add_one(int *out)
{
    out[threadIdx.x] += 1;
}

__global__ void copy_ints(int *dst, const int *src)
{
    dst[threadIdx.x] = src[threadIdx.x];
}

// The first of n ints, when they all equal it; -1 otherwise.
static int same(const int *h, int n)
{
    for (int i = 1; i < n; i++)
        if (h[i] != h[0])
            return -1;
    return h[0];
}

static bool differs_from_sequential(const int *h, int k)
{
    for (int t = 1; t < 256; t++)
        if (h[t] != k * 1000 + t - 1)
            return true;
    return false;
}

int main()
{
    tdc_emu_configure(4, 64ull << 20);
    int n = 0;
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 4, "%d devices", n);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess, "stream");

    // ---- shuffles and votes over 64 threads (two warps)
    int *d_out, h[2048];
    CHECK(cudaMalloc((void **)&d_out, sizeof h) == cudaSuccess, "malloc");
    tdc_launch(1, 64, 0, s, shuffles)(d_out);
    CHECK(cudaGetLastError() == cudaSuccess, "shuffles launch");
    cudaMemcpy(h, d_out, 64 * 8 * sizeof(int), cudaMemcpyDeviceToHost);
    for (int t = 0; t < 64; t++) {
        int lane = t & 31, base = t - lane, *o = h + t * 8;
        unsigned ballot = 0;
        for (int l = 0; l < 32; l += 3)
            ballot |= 1u << l;
        CHECK(o[0] == (base + 3) * 10, "t %d idx %d", t, o[0]);
        CHECK(o[1] == (lane >= 2 ? t - 2 : t) * 10, "t %d up %d", t, o[1]);
        CHECK(o[2] == (lane + 5 < 32 ? t + 5 : t) * 10, "t %d down %d", t, o[2]);
        CHECK(o[3] == (t ^ 1) * 10, "t %d xor %d", t, o[3]);
        CHECK(o[4] == (base + (lane & ~7) + ((lane + 1) & 7)) * 10, "t %d idx/8 %d", t, o[4]);
        CHECK(o[5] == ((lane & 15) + 3 < 16 ? t + 3 : t) * 10, "t %d down/16 %d", t, o[5]);
        CHECK((unsigned)o[6] == ballot, "t %d ballot %x", t, (unsigned)o[6]);
        CHECK(o[7] == 1, "t %d any/all %d", t, o[7]);
    }

    // ---- the resume order: without the barrier some thread reads a stale neighbour
    for (int barrier = 0; barrier < 2; barrier++) {
        bool stale = false;
        for (int k = 1; k <= 4; k++) {
            tdc_launch(1, 256, 0, s, neighbour)(d_out, k, barrier);
            cudaMemcpy(h, d_out, 256 * sizeof(int), cudaMemcpyDeviceToHost);
            stale |= differs_from_sequential(h, k);
        }
        if (barrier)
            CHECK(!stale, "with __syncthreads every thread sees its neighbour's write");
        else
            CHECK(stale, "without __syncthreads the random order shows a stale read");
    }

    // ---- shared memory per block, barriers in a loop, atomics across blocks
    int hx[512], *d_x, *d_sums, *d_total, sums[4], total = 0;
    for (int i = 0; i < 512; i++)
        hx[i] = i % 7 - 3;
    cudaMalloc((void **)&d_x, sizeof hx);
    cudaMalloc((void **)&d_sums, sizeof sums);
    cudaMalloc((void **)&d_total, sizeof total);
    cudaMemcpyAsync(d_x, hx, sizeof hx, cudaMemcpyHostToDevice, s);
    cudaMemsetAsync(d_total, 0, sizeof total, s);
    tdc_launch(4, 128, 0, s, block_sum)(d_x, d_sums, d_total);
    cudaMemcpyAsync(sums, d_sums, sizeof sums, cudaMemcpyDeviceToHost, s);
    cudaMemcpyAsync(&total, d_total, sizeof total, cudaMemcpyDeviceToHost, s);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    int want_total = 0;
    for (int b = 0; b < 4; b++) {
        int w = 0;
        for (int i = 0; i < 128; i++)
            w += hx[b * 128 + i];
        CHECK(sums[b] == w, "block %d sum %d, want %d", b, sums[b], w);
        want_total += w;
    }
    CHECK(total == want_total, "atomic total %d, want %d", total, want_total);

    // ---- 2-D grids and 3-D blocks
    tdc_launch(dim3(3, 2), dim3(4, 2, 2), 0, s, ids)(d_out);
    cudaMemcpy(h, d_out, 6 * 16 * sizeof(int), cudaMemcpyDeviceToHost);
    for (int i = 0; i < 96; i++)
        CHECK(h[i] == (i / 16) * 1000 + i % 16, "ids[%d] = %d", i, h[i]);

    // ---- errors that are not sticky
    tdc_launch(1, 2048, 0, s, ids)(d_out);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "block of 2048 threads");
    void *big = nullptr;
    CHECK(cudaMalloc(&big, 65ull << 20) == cudaErrorMemoryAllocation, "past the device memory");
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "last error");
    CHECK(cudaGetLastError() == cudaSuccess, "cleared");
    CHECK(cudaMemcpy(h, hx, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
          "host destination for a host-to-device copy");
    (void)cudaGetLastError();

    // ---- streams and events, on deferred streams (work runs only when forced)
    {
        long made = tdc_emu_streams_created();
        tdc_emu_defer_streams(1);
        cudaStream_t a, b;
        CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess, "stream a");
        CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess, "stream b");
        tdc_emu_defer_streams(0);
        CHECK(tdc_emu_streams_created() == made + 2, "two more streams made");
        CHECK(tdc_emu_streams_live(0) == 3, "%d streams live on device 0", tdc_emu_streams_live(0));
        int *dx, *dy, hs[256];
        cudaMalloc((void **)&dx, sizeof hs);
        cudaMalloc((void **)&dy, sizeof hs);
        // in order on one stream, run when forced
        tdc_launch(1, 256, 0, a, fill)(dx, 7);
        tdc_launch(1, 256, 0, a, add_one)(dx);
        CHECK(cudaStreamQuery(a) == cudaErrorNotReady, "deferred work is pending");
        CHECK(cudaMemcpyAsync(hs, dx, sizeof hs, cudaMemcpyDeviceToHost, a) == cudaSuccess, "d2h");
        CHECK(same(hs, 256) == 8, "fill then add_one on one stream: %d", same(hs, 256));
        CHECK(cudaStreamQuery(a) == cudaSuccess, "a drained by its download");
        // no event: b's copy reads x before a's pending fill runs
        tdc_launch(1, 256, 0, a, fill)(dx, 5);
        tdc_launch(1, 256, 0, b, copy_ints)(dy, dx);
        cudaMemcpyAsync(hs, dy, sizeof hs, cudaMemcpyDeviceToHost, b);
        CHECK(same(hs, 256) == 8, "without an event b reads the stale 8, not %d", same(hs, 256));
        CHECK(cudaStreamSynchronize(a) == cudaSuccess, "a");
        // an event orders b's copy after a's fill
        cudaEvent_t ev;
        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        tdc_launch(1, 256, 0, a, fill)(dx, 9);
        cudaEventRecord(ev, a);
        tdc_launch(1, 256, 0, a, fill)(dx, 11); // after the record: b must not wait for it
        CHECK(cudaEventQuery(ev) == cudaErrorNotReady, "event pending");
        cudaStreamWaitEvent(b, ev, 0);
        cudaEventDestroy(ev); // the wait keeps the record
        tdc_launch(1, 256, 0, b, copy_ints)(dy, dx);
        cudaMemcpyAsync(hs, dy, sizeof hs, cudaMemcpyDeviceToHost, b);
        CHECK(same(hs, 256) == 9, "after the event b reads 9, not %d", same(hs, 256));
        CHECK(cudaStreamQuery(a) == cudaErrorNotReady, "the work after the record still pends");
        // pageable host memory is staged at the call
        int v = 21;
        for (int i = 0; i < 256; i++)
            hs[i] = v;
        cudaMemcpyAsync(dx, hs, sizeof hs, cudaMemcpyHostToDevice, a);
        for (int i = 0; i < 256; i++)
            hs[i] = 0;
        cudaMemcpyAsync(hs, dx, sizeof hs, cudaMemcpyDeviceToHost, a);
        CHECK(same(hs, 256) == 21, "staged upload: %d", same(hs, 256));
        // destroying a stream runs its queued work
        tdc_launch(1, 256, 0, a, fill)(dx, 13);
        CHECK(cudaStreamDestroy(a) == cudaSuccess, "destroy a");
        cudaMemcpy(hs, dx, sizeof hs, cudaMemcpyDeviceToHost);
        CHECK(same(hs, 256) == 13, "a's last fill ran at its destruction: %d", same(hs, 256));
        CHECK(cudaStreamDestroy(b) == cudaSuccess, "destroy b");
        CHECK(tdc_emu_streams_live(0) == 1, "%d live", tdc_emu_streams_live(0));
        cudaFree(dx);
        cudaFree(dy);

        // device 3: a free ordered on the user's stream is safe; on another stream the
        // block goes while the user's kernel still pends, and that kernel faults
        cudaSetDevice(3);
        tdc_emu_defer_streams(1);
        cudaStream_t u, w;
        cudaStreamCreateWithFlags(&u, cudaStreamNonBlocking);
        cudaStreamCreateWithFlags(&w, cudaStreamNonBlocking);
        tdc_emu_defer_streams(0);
        int *z;
        cudaMallocAsync((void **)&z, sizeof hs, u);
        tdc_launch(1, 256, 0, u, fill)(z, 1);
        CHECK(cudaFreeAsync(z, u) == cudaSuccess, "free on the user's stream");
        CHECK(cudaStreamSynchronize(u) == cudaSuccess, "ran in order");
        cudaMallocAsync((void **)&z, sizeof hs, u);
        tdc_launch(1, 256, 0, u, fill)(z, 2);
        CHECK(cudaFreeAsync(z, w) == cudaSuccess, "free on another stream");
        CHECK(cudaStreamSynchronize(w) == cudaSuccess, "the free ran first");
        CHECK(cudaStreamSynchronize(u) == cudaErrorIllegalAddress,
              "the late user faults on the freed block");
        cudaSetDevice(0);
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "device 0 unaffected");
    }

    // ---- faults: sticky on their device only
    cudaSetDevice(1);
    int *d1;
    cudaMalloc((void **)&d1, 4096);
    tdc_launch(1, 64, 0, nullptr, deadlock)(d1);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure, "deadlock is a launch failure");
    CHECK(cudaMemcpy(h, d1, 4, cudaMemcpyDeviceToHost) == cudaErrorLaunchFailure, "sticky");
    cudaSetDevice(2);
    int *d2;
    cudaMalloc((void **)&d2, 4096);
    tdc_launch(1, 32, 0, nullptr, exited_lane)(d2);
    CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure, "shuffle naming an exited lane");
    cudaSetDevice(0);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "device 0 unaffected");
    tdc_launch(1, 64, 0, s, shuffles)(d_out);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "device 0 still runs kernels");

    // ---- half and bfloat16 rounding
    CHECK(__float2half_rn(65504.0f).bits == 0x7bff, "max half");
    CHECK(__float2half_rn(65520.0f).bits == 0x7c00, "rounds to inf");
    CHECK(__float2half_rn(3e-8f).bits == 0x0001, "to the smallest subnormal");
    CHECK(__float2half_rn(1.0f + 1.0f / 2048).bits == 0x3c00, "tie to even (down)");
    CHECK(__float2half_rn(1.0f + 3.0f / 2048).bits == 0x3c02, "tie to even (up)");
    CHECK(__half2float(__half{0x0001}) == 5.9604644775390625e-8f, "subnormal back");
    CHECK(__float2bfloat16_rn(1.00390625f).bits == 0x3f80, "bf16 tie to even");
    CHECK(__float2bfloat16_rn(1.01171875f).bits == 0x3f82, "bf16 tie to even (up)");
    CHECK(__bfloat162float(__nv_bfloat16{0xc0a0}) == -5.0f, "bf16 back");

    printf("emulator self-test: %d checks, %d failing\n", checks, failures);
    return failures ? 1 : 0;
}
