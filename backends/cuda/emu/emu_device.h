// emu_device.h -- the device side of CUDA for the emulated build (C++ only): what kernels.cu
// uses from the toolkit's headers, executed on the host by runtime.cpp.
//
// Execution model. A launch (tdc_launch, which is `kernel<<<...>>>` under nvcc) runs the
// grid's blocks one after another on the calling host thread. Each block's threads are
// cooperative fibers: a thread runs until it reaches __syncthreads, a warp shuffle or vote,
// or its end, and nothing else interleaves them. __syncthreads holds a fiber until every
// live thread of the block has arrived; a warp operation holds it until every lane its mask
// names has arrived, then exchanges the values with CUDA's semantics (32-lane warps, the
// width argument, out-of-range lanes keep their own value). Between those points the fibers
// run in a seeded random order (TDD_EMU_SEED), drawn afresh each time a barrier or warp
// operation releases them: a kernel that relies on lane order without a barrier computes
// garbage here as it would on a GPU. A barrier or shuffle nobody can complete (a
// __syncthreads in divergent code, a mask naming a lane that has exited) is a kernel fault:
// the device takes a sticky cudaErrorLaunchFailure and the emulator says why on stderr.
//
// __shared__ variables are static thread_local: one copy per host thread, so the fibers of
// the block running on that thread share it, as a block shares shared memory. Atomics are
// plain read-modify-writes: fibers never switch inside one. kernels.cu is compiled with
// -fsanitize=thread's instrumentation, whose hooks runtime.cpp defines: every load and
// store is held to its allocation's exact bounds, and in race mode (TDD_EMU_CHECK) fibers
// also switch at memory accesses and races and uninitialised loads fault.
#ifndef TDC_EMU_DEVICE_H
#define TDC_EMU_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "emu.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __grid_constant__
#define __restrict__ __restrict
#define __shared__ static thread_local
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz)
    {
    }
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z)
    {
    }
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(4) uchar4 {
    unsigned char x, y, z, w;
};
inline float2 make_float2(float x, float y)
{
    return float2{x, y};
}
inline float4 make_float4(float x, float y, float z, float w)
{
    return float4{x, y, z, w};
}
inline uchar4 make_uchar4(unsigned char x, unsigned char y, unsigned char z, unsigned char w)
{
    return uchar4{x, y, z, w};
}

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace tdc_emu
{
enum warp_kind { W_IDX, W_UP, W_DOWN, W_XOR, W_BALLOT, W_ANY, W_ALL, W_SYNC };
void syncthreads();
// An atomic's access of n bytes at p (bounds and initcheck; no race check).
void atomic_access(const void *p, size_t n);
// n floating-point operations by this thread, counted in the launch's profile record
// (TDD_EMU_PROFILE; kernels.cu's TDC_FLOPS).
void flops(uint64_t n);
uint64_t warp_op(int kind, unsigned mask, uint64_t value, int param, int width);

template <class T> T shfl(int kind, unsigned mask, T v, int param, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a word");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = warp_op(kind, mask, bits, param, width);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

typedef void (*thread_body)(void *);
// Runs body(arg) as every thread of every block, in the stream's order (at once, or later on
// a deferred stream: TDD_EMU_DEFER), then release(arg); the result is also the thread's last
// error (the launch's own checks: a kernel's fault shows at a later call).
cudaError_t launch(dim3 grid, dim3 block, size_t shmem, cudaStream_t s, const char *name,
                   thread_body body, void *arg, void (*release)(void *));

template <class... P> struct launcher {
    dim3 grid, block;
    size_t shmem;
    cudaStream_t stream;
    const char *name;
    void (*kernel)(P...);
    template <class... A> void operator()(A &&...a) const
    {
        static_assert(sizeof...(A) == sizeof...(P), "kernel argument count");
        // The arguments as the kernel's parameter types, once, as a launch copies them.
        // On the heap: a deferred stream runs the kernel after this returns.
        struct pack {
            void (*k)(P...);
            std::tuple<typename std::decay<P>::type...> args;
        } *pk =
            new pack{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...)};
        launch(
            grid, block, shmem, stream, name,
            [](void *p) {
                pack *q = static_cast<pack *>(p);
                std::apply(q->k, q->args);
            },
            pk, [](void *p) { delete static_cast<pack *>(p); });
    }
};

template <class... P>
launcher<P...> make_launcher(dim3 g, dim3 b, size_t shmem, cudaStream_t s, const char *name,
                             void (*k)(P...))
{
    return launcher<P...>{g, b, shmem, s, name, k};
}
} // namespace tdc_emu

// kernel<<<grid, block, shmem, stream>>>(args) is tdc_launch(grid, block, shmem, stream,
// kernel)(args) in kernels.cu; kernels.h gives it the <<<>>> meaning under nvcc.
#define tdc_launch(grid, block, shmem, stream, ...)                                                \
    ::tdc_emu::make_launcher(grid, block, shmem, stream, #__VA_ARGS__, __VA_ARGS__)

inline void __syncthreads()
{
    tdc_emu::syncthreads();
}
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    (void)tdc_emu::warp_op(tdc_emu::W_SYNC, mask, 0, 0, 32);
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    return tdc_emu::shfl(tdc_emu::W_IDX, mask, v, src, width);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return tdc_emu::shfl(tdc_emu::W_UP, mask, v, (int)delta, width);
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    return tdc_emu::shfl(tdc_emu::W_DOWN, mask, v, (int)delta, width);
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return tdc_emu::shfl(tdc_emu::W_XOR, mask, v, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int pred)
{
    return (unsigned)tdc_emu::warp_op(tdc_emu::W_BALLOT, mask, pred != 0, 0, 32);
}
inline int __any_sync(unsigned mask, int pred)
{
    return (int)tdc_emu::warp_op(tdc_emu::W_ANY, mask, pred != 0, 0, 32);
}
inline int __all_sync(unsigned mask, int pred)
{
    return (int)tdc_emu::warp_op(tdc_emu::W_ALL, mask, pred != 0, 0, 32);
}

// Atomics: fibers never switch inside these, so a plain read-modify-write is atomic. Their
// own loads and stores are not instrumented (the race detector exempts atomics): they are
// checked against the allocation's bounds by atomic_access, which may let another thread
// run first in race mode.
#define TDC_EMU_ATOMIC template <class T> __attribute__((no_sanitize("thread"))) inline T
TDC_EMU_ATOMIC atomicAdd(T *p, T v)
{
    tdc_emu::atomic_access(p, sizeof *p);
    T old = *p;
    *p = old + v;
    return old;
}
TDC_EMU_ATOMIC atomicSub(T *p, T v)
{
    tdc_emu::atomic_access(p, sizeof *p);
    T old = *p;
    *p = old - v;
    return old;
}
TDC_EMU_ATOMIC atomicMax(T *p, T v)
{
    tdc_emu::atomic_access(p, sizeof *p);
    T old = *p;
    *p = old < v ? v : old;
    return old;
}
TDC_EMU_ATOMIC atomicMin(T *p, T v)
{
    tdc_emu::atomic_access(p, sizeof *p);
    T old = *p;
    *p = v < old ? v : old;
    return old;
}
TDC_EMU_ATOMIC atomicExch(T *p, T v)
{
    tdc_emu::atomic_access(p, sizeof *p);
    T old = *p;
    *p = v;
    return old;
}
TDC_EMU_ATOMIC atomicCAS(T *p, T cmp, T v)
{
    tdc_emu::atomic_access(p, sizeof *p);
    T old = *p;
    if (old == cmp)
        *p = v;
    return old;
}
TDC_EMU_ATOMIC atomicAnd(T *p, T v)
{
    tdc_emu::atomic_access(p, sizeof *p);
    T old = *p;
    *p = old & v;
    return old;
}
TDC_EMU_ATOMIC atomicOr(T *p, T v)
{
    tdc_emu::atomic_access(p, sizeof *p);
    T old = *p;
    *p = old | v;
    return old;
}
#undef TDC_EMU_ATOMIC

// ---- half and bfloat16 (cuda_fp16.h, cuda_bf16.h): storage and round-to-nearest-even
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

inline float __half2float(__half h)
{
    uint32_t s = (uint32_t)(h.bits & 0x8000u) << 16, e = (h.bits >> 10) & 0x1fu,
             m = h.bits & 0x3ffu, b;
    if (e == 0) { // zero or subnormal: m * 2^-24
        float v = (float)m * (1.0f / 16777216.0f);
        return s ? -v : v;
    }
    b = e == 31 ? s | 0x7f800000u | (m << 13) : s | ((e + 112u) << 23) | (m << 13);
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

inline __half __float2half_rn(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu, h;
    if (ax >= 0x7f800000u) {
        h = ax > 0x7f800000u ? 0x7e00u : 0x7c00u;
    } else if (ax >= 0x477ff000u) { // rounds past 65504
        h = 0x7c00u;
    } else if (ax < 0x38800000u) { // below 2^-14: a subnormal, m = round(|f| * 2^24)
        float a;
        memcpy(&a, &ax, sizeof a);
        h = (uint32_t)lrintf(a * 16777216.0f);
    } else {
        uint32_t m = ax & 0x7fffffu, rest = m & 0x1fffu;
        h = (((ax >> 23) - 112u) << 10) | (m >> 13);
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
            h++;
    }
    return __half{(uint16_t)(sign | h)};
}
inline __half __float2half(float f)
{
    return __float2half_rn(f);
}

inline float __bfloat162float(__nv_bfloat16 v)
{
    uint32_t b = (uint32_t)v.bits << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return __nv_bfloat16{(uint16_t)((x >> 16) | 0x40u)};
    x += 0x7fffu + ((x >> 16) & 1u);
    return __nv_bfloat16{(uint16_t)(x >> 16)};
}
// Toward zero (truncation), as the toolkit's.
inline __nv_bfloat16 __float2bfloat16_rz(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return __nv_bfloat16{(uint16_t)((x >> 16) | 0x40u)};
    return __nv_bfloat16{(uint16_t)(x >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f)
{
    return __float2bfloat16_rn(f);
}

#endif
