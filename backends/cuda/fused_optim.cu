// fused_optim.cu -- an optimizer step of many parameters in one launch (fused_optim.h).
//
// The parameters' elements are cut in chunks of kChunk; a table of the parameters and the
// chunks goes to the device with the launch, and each block walks chunks (grid-stride).
// The arithmetic is optim.c's TDD_OPTIM_LOOP for SGD and Adam(W), operation for operation;
// on the GPU each product and sum is rounded on its own (__fmul_rn, __fadd_rn: nvcc would
// contract them into FMAs), so the bits are the host loop's.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fused_optim.h"

namespace
{

constexpr int kThreads = 256;
constexpr int64_t kChunk = 8192;

struct chunk {
    int param;
    int64_t start;
};

#if defined(__CUDACC__) && !defined(TDC_EMU)
__device__ __forceinline__ float mul(float a, float b)
{
    return __fmul_rn(a, b);
}
__device__ __forceinline__ float add(float a, float b)
{
    return __fadd_rn(a, b);
}
__device__ __forceinline__ double mul(double a, double b)
{
    return __dmul_rn(a, b);
}
__device__ __forceinline__ double add(double a, double b)
{
    return __dadd_rn(a, b);
}
#else
template <typename T> inline T mul(T a, T b)
{
    return a * b;
}
template <typename T> inline T add(T a, T b)
{
    return a + b;
}
#endif

__device__ __forceinline__ float root(float x)
{
    return sqrtf(x);
}
__device__ __forceinline__ double root(double x)
{
    return sqrt(x);
}

template <typename T>
__global__ void fused_step(tdc_fused_hyper h, const tdc_fused_param *ps, const chunk *cs,
                           int64_t nchunks)
{
    const T wd = (T)h.weight_decay, lr = (T)h.lr, mom = (T)h.momentum,
            damp = (T)(1.0 - h.dampening), b1 = (T)h.beta1, b2 = (T)h.beta2,
            ob1 = (T)(1.0 - h.beta1), ob2 = (T)(1.0 - h.beta2), eps = (T)h.eps,
            decay = (T)(1.0 - h.lr * h.weight_decay);
    for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
        const tdc_fused_param &q = ps[cs[c].param];
        T *P = (T *)q.p, *S0 = (T *)q.b[0], *S1 = (T *)q.b[1], *S2 = (T *)q.b[2];
        const T *G = (const T *)q.g;
        bool f0 = q.fresh & 1u, f1 = q.fresh & 2u, f2 = q.fresh & 4u;
        int64_t end = cs[c].start + kChunk < q.n ? cs[c].start + kChunk : q.n;
        const T step_size = (T)q.step_size, bc2s = (T)q.bc2s;
        for (int64_t i = cs[c].start + threadIdx.x; i < end; i += blockDim.x) {
            T gi = G[i], p = P[i];
            if (h.maximize)
                gi = -gi;
            if (h.kind == 0) { // SGD
                if (h.weight_decay != 0.0)
                    gi = add(gi, mul(wd, p));
                if (h.momentum != 0.0) {
                    T buf = f0 ? gi : add(mul(S0[i], mom), mul(damp, gi));
                    S0[i] = buf;
                    gi = h.nesterov ? add(gi, mul(mom, buf)) : buf;
                }
                P[i] = add(p, mul(-lr, gi));
                continue;
            }
            if (h.kind == 2) // AdamW decays the parameter
                p = mul(p, decay);
            else if (h.weight_decay != 0.0)
                gi = add(gi, mul(wd, p));
            T m = f0 ? (T)0 : S0[i], v = f1 ? (T)0 : S1[i];
            m = add(mul(m, b1), mul(ob1, gi));
            v = add(mul(v, b2), mul(ob2, mul(gi, gi)));
            S0[i] = m;
            S1[i] = v;
            if (h.amsgrad) { // torch.maximum (NaN propagates); max(0, v) is v
                T mx = f2 ? v : S2[i];
                v = mx > v || mx != mx ? mx : v;
                S2[i] = v;
            }
            T denom = add((T)(root(v) / bc2s), eps);
            P[i] = add(p, mul(-step_size, m / denom));
        }
    }
}

} // namespace

extern "C" cudaError_t tdc_fused_optim(const tdc_dev *d, int dt, const tdc_fused_hyper *h,
                                       const tdc_fused_param *ps, int n)
{
    if (dt != 1 && dt != 2)
        return cudaErrorInvalidValue;
    int64_t nchunks = 0;
    for (int i = 0; i < n; i++)
        nchunks += (ps[i].n + kChunk - 1) / kChunk;
    if (nchunks == 0)
        return cudaSuccess;
    size_t tbytes = sizeof(tdc_fused_param) * (size_t)n, at = (tbytes + 15) / 16 * 16,
           bytes = at + sizeof(chunk) * (size_t)nchunks;
    char *host = (char *)malloc(bytes);
    if (!host)
        return cudaErrorMemoryAllocation;
    memcpy(host, ps, tbytes);
    chunk *cs = (chunk *)(host + at);
    int64_t k = 0;
    for (int i = 0; i < n; i++)
        for (int64_t s = 0; s < ps[i].n; s += kChunk)
            cs[k++] = chunk{i, s};
    void *dev = nullptr;
    cudaError_t e = cudaMallocAsync(&dev, bytes, d->stream);
    if (e == cudaSuccess) // pageable: staged before the call returns, host may go
        e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, d->stream);
    free(host);
    if (e == cudaSuccess) {
        int64_t cap = (int64_t)(d->sms > 0 ? d->sms : 1) * 8;
        int grid = (int)(nchunks < cap ? nchunks : cap);
        const tdc_fused_param *tp = (const tdc_fused_param *)dev;
        const chunk *tc = (const chunk *)((char *)dev + at);
        if (dt == 1)
            tdc_launch(grid, kThreads, 0, d->stream, fused_step<float>)(*h, tp, tc, nchunks);
        else
            tdc_launch(grid, kThreads, 0, d->stream, fused_step<double>)(*h, tp, tc, nchunks);
        e = cudaGetLastError();
    }
    if (dev) {
        cudaError_t f = cudaFreeAsync(dev, d->stream);
        if (e == cudaSuccess)
            e = f;
    }
    return e;
}
