// kernels.cu -- device code of the cuda backend: strided elementwise ops (every dtype, from
// elementwise.h), copies and casts, reductions and row ops (softmax, cumsum) in f32/f64/int64,
// indexing (gather, scatter_add, index_select, embedding, one_hot), losses, layer_norm,
// dropout, pools, im2col, the GEMMs sgemm lacks, fills and random draws. C entry points in
// kernels.h.
//
// Kept small on purpose (nvcc time on a 2-core builder): the op is a runtime switch inside
// one kernel per shape of work, and only the bandwidth-bound hot paths (contiguous
// add/sub/mul/div) are specialised by template. All loops are grid-stride with 64-bit
// indices, so any launch covers any size.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels.h"

// n floating-point operations by this thread: counted in the emulator's per-launch profile
// (TDD_EMU_PROFILE, tools/gpu_report.py), nothing on a GPU.
#ifdef TDC_EMU
#define TDC_FLOPS(n) ::tdc_emu::flops(n)
#else
#define TDC_FLOPS(n) ((void)0)
#endif

namespace
{

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill the device a few times over,
// no more (each thread then loops).
int grid_for(const tdc_dev *d, int64_t n)
{
    int64_t want = (n + kThreads - 1) / kThreads;
    int64_t cap = (int64_t)(d->sms > 0 ? d->sms : 1) * 32;
    if (want < 1)
        want = 1;
    return (int)(want < cap ? want : cap);
}

// Threads for a block that strides over n items: whole warps, at most kThreads (short rows
// and reductions get a small block rather than 256 mostly idle threads).
int block_for(int64_t n)
{
    return n >= kThreads ? kThreads : n < 32 ? 32 : (int)((n + 31) / 32 * 32);
}

__device__ __forceinline__ int64_t gtid()
{
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t gstride()
{
    return (int64_t)gridDim.x * blockDim.x;
}

// Element offsets of C-order element i for the first NOPS operands (one div/mod per dim,
// shared by all operands).
template <int NOPS>
__device__ __forceinline__ void offsets(const tdc_layout &l, int64_t i, int64_t *off)
{
    for (int k = 0; k < NOPS; k++)
        off[k] = 0;
    for (int d = l.ndim - 1; d >= 0; d--) {
        int64_t n = l.shape[d], q = i / n, r = i - q * n;
        for (int k = 0; k < NOPS; k++)
            off[k] += r * l.strides[k][d];
        i = q;
    }
}

// Offset of flat index i over shape/stride lists of n dims.
__device__ __forceinline__ int64_t flat_offset(const int64_t *shape, const int64_t *stride, int n,
                                               int64_t i)
{
    int64_t off = 0;
    for (int d = n - 1; d >= 0; d--) {
        int64_t q = i / shape[d];
        off += (i - q * shape[d]) * stride[d];
        i = q;
    }
    return off;
}

// ------------------------------------------------------------------ elementwise

// The expressions of elementwise.h, in R (float, or double for f64); comparisons give 0/1.
template <typename R> __device__ __forceinline__ R bin_t(int op, R x, R y, R alpha)
{
    switch (op) {
#define TDC_BIN_F(e, rule, fexpr, im, iexpr)                                                       \
    case TDD_OP_##e:                                                                               \
        return (R)(fexpr);
        TDD_BINARY_OPS(TDD_EW_SKIP, TDC_BIN_F)
#undef TDC_BIN_F
    default:
        return (R)0;
    }
}

template <typename R> __device__ __forceinline__ R un_t(int op, R x, R p0, R p1, int v)
{
    switch (op) {
#define TDC_UN_F(e, rule, fexpr, im, iexpr)                                                        \
    case TDD_OP_##e:                                                                               \
        return (R)(fexpr);
        TDD_UNARY_OPS(TDD_EW_SKIP, TDC_UN_F)
#undef TDC_UN_F
    default:
        return (R)0;
    }
}

__device__ __forceinline__ float bin_f(int op, float x, float y, float alpha)
{
    return bin_t<float>(op, x, y, alpha);
}

__device__ __forceinline__ float un_f(int op, float x, float p0, float p1, int v)
{
    return un_t<float>(op, x, p0, p1, v);
}

// The integer expressions (IMODE INT/ICHK) in int64 with wrapping U; err: a refused value.
__device__ __forceinline__ int64_t bin_i(int op, int64_t x, int64_t y, uint64_t alpha, int &err)
{
    typedef uint64_t U;
    switch (op) {
#define TDC_BIN_I(e, rule, fexpr, im, iexpr)                                                       \
    case TDD_OP_##e:                                                                               \
        return (int64_t)(iexpr);
        TDD_BINARY_OPS(TDD_EW_SKIP, TDC_BIN_I)
#undef TDC_BIN_I
    default:
        return 0;
    }
}

__device__ __forceinline__ int64_t un_i(int op, int64_t x, int64_t lo, int64_t hi)
{
    typedef uint64_t U;
    switch (op) {
#define TDC_UN_I(e, rule, fexpr, im, iexpr)                                                        \
    case TDD_OP_##e:                                                                               \
        return (int64_t)(iexpr);
        TDD_UNARY_OPS(TDD_EW_SKIP, TDC_UN_I)
#undef TDC_UN_I
    default:
        return 0;
    }
}

template <typename Y> __device__ __forceinline__ void store4(Y *y, int64_t v, float4 r);
template <> __device__ __forceinline__ void store4<float>(float *y, int64_t v, float4 r)
{
    reinterpret_cast<float4 *>(y)[v] = r;
}
template <> __device__ __forceinline__ void store4<uint8_t>(uint8_t *y, int64_t v, float4 r)
{
    reinterpret_cast<uchar4 *>(y)[v] = make_uchar4((uint8_t)(r.x != 0.0f), (uint8_t)(r.y != 0.0f),
                                                   (uint8_t)(r.z != 0.0f), (uint8_t)(r.w != 0.0f));
}

template <typename Y> __device__ __forceinline__ Y conv(float v)
{
    return (Y)v;
}
template <> __device__ __forceinline__ uint8_t conv<uint8_t>(float v)
{
    return v != 0.0f;
}

// Dense operands. OP >= 0 fixes the op at compile time (the bandwidth-critical ones);
// OP < 0 switches on op at run time. vec: all pointers 16-byte aligned -> 4 per load.
template <int OP, typename Y>
__global__ void bin_contig(int op, int64_t n, Y *y, const float *a, const float *b, float scalar,
                           float alpha, int vec)
{
    const int o = OP >= 0 ? OP : op;
    int64_t start = 0;
    if (vec) {
        int64_t n4 = n / 4;
        const float4 *a4 = reinterpret_cast<const float4 *>(a);
        const float4 *b4 = reinterpret_cast<const float4 *>(b);
        for (int64_t v = gtid(); v < n4; v += gstride()) {
            float4 x = a4[v], w = b ? b4[v] : make_float4(scalar, scalar, scalar, scalar);
            float4 r = make_float4(bin_f(o, x.x, w.x, alpha), bin_f(o, x.y, w.y, alpha),
                                   bin_f(o, x.z, w.z, alpha), bin_f(o, x.w, w.w, alpha));
            store4<Y>(y, v, r);
        }
        start = n4 * 4;
    }
    for (int64_t i = start + gtid(); i < n; i += gstride())
        y[i] = conv<Y>(bin_f(o, a[i], b ? b[i] : scalar, alpha));
}

template <typename Y>
__global__ void bin_strided(int op, __grid_constant__ const tdc_layout l, Y *y, const float *a,
                            const float *b, float scalar, float alpha)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[3];
        offsets<3>(l, i, off);
        y[off[0]] = conv<Y>(bin_f(op, a[off[1]], b ? b[off[2]] : scalar, alpha));
    }
}

template <typename Y>
__global__ void un_kernel(int op, __grid_constant__ const tdc_layout l, Y *y, const float *x,
                          float p0, float p1, int v)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[2] = {i, i};
        if (!l.contig)
            offsets<2>(l, i, off);
        y[off[0]] = conv<Y>(un_f(op, x[off[1]], p0, p1, v));
    }
}

template <typename T>
__global__ void copy_kernel(__grid_constant__ const tdc_layout l, T *y, const T *x)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[2] = {i, i};
        if (!l.contig)
            offsets<2>(l, i, off);
        y[off[0]] = x[off[1]];
    }
}

// dtype numbers are td_dtype's (tensordd.h): 1 f32, 2 f64, 3 f16, 4 bf16, 5 i32, 6 i64, 7 bool,
// 8 u8, 9 i8, 10 i16.
__device__ __forceinline__ bool dt_is_float(int dt)
{
    return dt >= 1 && dt <= 4;
}

__device__ __forceinline__ double load_f(const void *p, int dt, int64_t i)
{
    switch (dt) {
    case 1:
        return ((const float *)p)[i];
    case 2:
        return ((const double *)p)[i];
    case 3:
        return __half2float(((const __half *)p)[i]);
    case 4:
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case 5:
        return ((const int32_t *)p)[i];
    case 6:
        return (double)((const int64_t *)p)[i];
    case 8:
        return ((const uint8_t *)p)[i];
    case 9:
        return ((const int8_t *)p)[i];
    case 10:
        return ((const int16_t *)p)[i];
    default:
        return ((const uint8_t *)p)[i] ? 1.0 : 0.0;
    }
}

__device__ __forceinline__ int64_t load_i(const void *p, int dt, int64_t i)
{
    if (dt == 5)
        return ((const int32_t *)p)[i];
    if (dt == 6)
        return ((const int64_t *)p)[i];
    if (dt == 7)
        return ((const uint8_t *)p)[i] != 0;
    if (dt == 8)
        return ((const uint8_t *)p)[i];
    if (dt == 9)
        return ((const int8_t *)p)[i];
    if (dt == 10)
        return ((const int16_t *)p)[i];
    double v = load_f(p, dt, i); // saturate, NaN -> 0, as the host backends do
    if (v != v)
        return 0;
    if (v >= 9223372036854775807.0)
        return INT64_MAX;
    if (v <= -9223372036854775808.0)
        return INT64_MIN;
    return (int64_t)v;
}

__global__ void cast_kernel(__grid_constant__ const tdc_layout l, void *y, int ydt, const void *x,
                            int xdt)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[2] = {i, i};
        if (!l.contig)
            offsets<2>(l, i, off);
        int64_t yo = off[0], xo = off[1];
        switch (ydt) {
        case 1:
            ((float *)y)[yo] = (float)load_f(x, xdt, xo);
            break;
        case 2:
            ((double *)y)[yo] = load_f(x, xdt, xo);
            break;
        case 3: // through f32, as the host conversion does
            ((__half *)y)[yo] = __float2half_rn((float)load_f(x, xdt, xo));
            break;
        case 4:
            ((__nv_bfloat16 *)y)[yo] = __float2bfloat16_rn((float)load_f(x, xdt, xo));
            break;
        case 5: // wraps after saturating to 64 bits, like a C cast of the int64
            ((int32_t *)y)[yo] = (int32_t)(uint32_t)(uint64_t)load_i(x, xdt, xo);
            break;
        case 6:
            ((int64_t *)y)[yo] = load_i(x, xdt, xo);
            break;
        case 8: // the narrow integers wrap too
            ((uint8_t *)y)[yo] = (uint8_t)(uint64_t)load_i(x, xdt, xo);
            break;
        case 9:
            ((int8_t *)y)[yo] = (int8_t)(uint8_t)(uint64_t)load_i(x, xdt, xo);
            break;
        case 10:
            ((int16_t *)y)[yo] = (int16_t)(uint16_t)(uint64_t)load_i(x, xdt, xo);
            break;
        default:
            ((uint8_t *)y)[yo] =
                dt_is_float(xdt) ? load_f(x, xdt, xo) != 0.0 : load_i(x, xdt, xo) != 0;
            break;
        }
    }
}

// A computed value stored as dt: floats rounded once, integers saturated (float) or wrapped
// (int64 to int32), bool nonzero.
__device__ __forceinline__ void store_f(void *y, int dt, int64_t i, double v)
{
    switch (dt) {
    case 1:
        ((float *)y)[i] = (float)v;
        break;
    case 2:
        ((double *)y)[i] = v;
        break;
    case 3:
        ((__half *)y)[i] = __float2half_rn((float)v);
        break;
    case 4:
        ((__nv_bfloat16 *)y)[i] = __float2bfloat16_rn((float)v);
        break;
    case 5:
    case 6:
    case 8:
    case 9:
    case 10: {
        int64_t n = v != v                        ? 0
                    : v >= 9223372036854775807.0  ? INT64_MAX
                    : v <= -9223372036854775808.0 ? INT64_MIN
                                                  : (int64_t)v;
        if (dt == 5)
            ((int32_t *)y)[i] = (int32_t)(uint32_t)(uint64_t)n;
        else if (dt == 6)
            ((int64_t *)y)[i] = n;
        else if (dt == 8)
            ((uint8_t *)y)[i] = (uint8_t)(uint64_t)n;
        else if (dt == 9)
            ((int8_t *)y)[i] = (int8_t)(uint8_t)(uint64_t)n;
        else
            ((int16_t *)y)[i] = (int16_t)(uint16_t)(uint64_t)n;
        break;
    }
    default:
        ((uint8_t *)y)[i] = v != 0.0;
        break;
    }
}

__device__ __forceinline__ void store_i(void *y, int dt, int64_t i, int64_t v)
{
    switch (dt) {
    case 5:
        ((int32_t *)y)[i] = (int32_t)(uint32_t)(uint64_t)v;
        break;
    case 6:
        ((int64_t *)y)[i] = v;
        break;
    case 7:
        ((uint8_t *)y)[i] = v != 0;
        break;
    case 8:
        ((uint8_t *)y)[i] = (uint8_t)(uint64_t)v;
        break;
    case 9:
        ((int8_t *)y)[i] = (int8_t)(uint8_t)(uint64_t)v;
        break;
    case 10:
        ((int16_t *)y)[i] = (int16_t)(uint16_t)(uint64_t)v;
        break;
    default:
        store_f(y, dt, i, (double)v);
        break;
    }
}

// Elementwise ops on any dtypes, computed in R (float or double): inputs converted, the
// result rounded once into y's dtype.
template <typename R>
__global__ void ew_float(int op, int arity, __grid_constant__ const tdc_layout l, void *y,
                         const void *a, const void *b, __grid_constant__ const tdc_ewargs g)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[3] = {i, i, i};
        if (!l.contig)
            offsets<3>(l, i, off);
        R x = (R)load_f(a, g.adt, off[1]), r;
        if (arity == 2)
            r = bin_t<R>(op, x, b ? (R)load_f(b, g.bdt, off[2]) : (R)g.f[0], (R)g.f[1]);
        else
            r = un_t<R>(op, x, (R)g.f[0], (R)g.f[1], g.variant);
        store_f(y, g.ydt, off[0], (double)r);
    }
}

// The same in int64 for integer and bool compute dtypes.
__global__ void ew_int(int op, int arity, __grid_constant__ const tdc_layout l, void *y,
                       const void *a, const void *b, __grid_constant__ const tdc_ewargs g, int *bad)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[3] = {i, i, i};
        if (!l.contig)
            offsets<3>(l, i, off);
        int64_t x = load_i(a, g.adt, off[1]), r;
        int err = 0;
        if (arity == 2)
            r = bin_i(op, x, b ? load_i(b, g.bdt, off[2]) : g.n[0], (uint64_t)g.n[1], err);
        else
            r = un_i(op, x, g.n[0], g.n[1]);
        if (err && bad)
            atomicExch(bad, 1); // several threads may: atomically
        store_i(y, g.ydt, off[0], r);
    }
}

// where (operands y, cond, a, b) and masked_fill (operands y, mask, x; b NULL: the value v).
template <typename T>
__global__ void select_kernel(__grid_constant__ const tdc_layout l, T *y, const uint8_t *c,
                              const T *a, const T *b, T v)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[4] = {i, i, i, i};
        if (!l.contig)
            offsets<4>(l, i, off);
        y[off[0]] = b ? (c[off[1]] ? a[off[2]] : b[off[3]]) : (c[off[1]] ? v : a[off[2]]);
    }
}

// ------------------------------------------------------------------ indexing

__device__ __forceinline__ int64_t view_offset(const tdc_view &v, const int64_t *idx)
{
    int64_t off = 0;
    for (int d = 0; d < v.ndim; d++)
        off += idx[d] * v.strides[d];
    return off;
}

// C-order index of flat i over shape (n dims).
__device__ __forceinline__ void unravel(int64_t i, const int64_t *shape, int n, int64_t *idx)
{
    for (int d = n - 1; d >= 0; d--) {
        int64_t q = i / shape[d];
        idx[d] = i - q * shape[d];
        i = q;
    }
}

template <typename T>
__global__ void index_kernel(int mode, int dim, __grid_constant__ const tdc_view y, T *yp,
                             __grid_constant__ const tdc_view a, const T *ap,
                             __grid_constant__ const tdc_view ix, const void *ixp, int64_t n,
                             int *bad)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        int64_t idx[TDC_MAX_DIMS];
        unravel(i, y.shape, y.ndim, idx);
        int64_t k, size, ao = 0;
        if (mode == TDC_EMBEDDING) {
            int64_t row = i / a.shape[1];
            k = load_i(ixp, ix.dt, flat_offset(ix.shape, ix.strides, ix.ndim, row));
            size = a.shape[0];
            ao = k * a.strides[0] + idx[y.ndim - 1] * a.strides[1];
        } else {
            int64_t io = mode == TDC_GATHER  ? view_offset(ix, idx)
                         : ix.ndim && a.ndim ? idx[dim] * ix.strides[0]
                                             : 0;
            k = load_i(ixp, ix.dt, io);
            size = a.ndim ? a.shape[dim] : 1;
            for (int d = 0; d < a.ndim; d++)
                ao += (d == dim ? k : idx[d]) * a.strides[d];
        }
        if (k < 0 || k >= size) {
            atomicExch(bad, 1); // several threads may: atomically
            continue;
        }
        yp[view_offset(y, idx)] = ap[ao];
    }
}

__global__ void scatter_add_kernel(int dim, __grid_constant__ const tdc_view y, void *yp,
                                   __grid_constant__ const tdc_view ix, const void *ixp,
                                   __grid_constant__ const tdc_view src, const void *sp, int64_t n,
                                   int *bad)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        int64_t idx[TDC_MAX_DIMS];
        unravel(i, ix.shape, ix.ndim, idx);
        int64_t k = load_i(ixp, ix.dt, view_offset(ix, idx));
        int64_t size = y.ndim ? y.shape[dim] : 1;
        if (k < 0 || k >= size) {
            atomicExch(bad, 1); // several threads may: atomically
            continue;
        }
        int64_t so = view_offset(src, idx), yo = 0;
        for (int d = 0; d < y.ndim; d++)
            yo += (d == dim ? k : idx[d]) * y.strides[d];
        switch (y.dt) {
        case 1:
            atomicAdd((float *)yp + yo, ((const float *)sp)[so]);
            break;
        case 2:
            atomicAdd((double *)yp + yo, ((const double *)sp)[so]);
            break;
        case 5:
            atomicAdd((int *)yp + yo, ((const int *)sp)[so]);
            break;
        case 6:
            atomicAdd((unsigned long long *)yp + yo, (unsigned long long)((const int64_t *)sp)[so]);
            break;
        default: // bool: a sum of truths is true when any is
            if (((const uint8_t *)sp)[so])
                ((uint8_t *)yp)[yo] = 1;
            break;
        }
    }
}

__global__ void one_hot_kernel(__grid_constant__ const tdc_view x, const void *xp, int64_t *y,
                               int64_t classes, int64_t n, int *bad)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        int64_t r = i / classes;
        int64_t k = load_i(xp, x.dt, flat_offset(x.shape, x.strides, x.ndim, r));
        if (k < 0 || k >= classes)
            atomicExch(bad, 1); // several threads may: atomically
        y[i] = k == i - r * classes;
    }
}

template <typename T> __global__ void fill_kernel(T *y, int64_t n, T v)
{
    for (int64_t i = gtid(); i < n; i += gstride())
        y[i] = v;
}

template <typename T> __global__ void arange_f_kernel(T *y, int64_t n, double start, double step)
{
    for (int64_t i = gtid(); i < n; i += gstride())
        y[i] = (T)(start + (double)i * step);
}

template <typename T> __global__ void linspace_f_kernel(T *y, int64_t n, double start, double end)
{
    double step = n > 1 ? (end - start) / (double)(n - 1) : 0.0;
    // Counting from both ends keeps the last value exactly end, as PyTorch.
    for (int64_t i = gtid(); i < n; i += gstride())
        y[i] =
            (T)(i < n / 2 || n == 1 ? start + step * (double)i : end - step * (double)(n - 1 - i));
}

__global__ void arange_i64_kernel(int64_t *y, int64_t n, int64_t start, int64_t step)
{
    for (int64_t i = gtid(); i < n; i += gstride())
        y[i] = start + i * step;
}

template <typename T> __global__ void eye_kernel(T *y, int64_t rows, int64_t cols, T one)
{
    for (int64_t i = gtid(); i < rows * cols; i += gstride())
        y[i] = (i / cols == i % cols) ? one : (T)0;
}

// sort/argsort/topk: one thread per element counts the line's elements that sort before it
// (stable; O(L) each) and writes itself at that rank when it is below K.
template <typename U>
__global__ void sort_kernel(const U *x, int dt, int64_t outer, int64_t L, int64_t inner, int64_t K,
                            int desc, U *y, int64_t *idx)
{
    const int64_t n = outer * L * inner;
    const bool fl = dt_is_float(dt);
    for (int64_t e = gtid(); e < n; e += gstride()) {
        int64_t i = e % inner, l = (e / inner) % L, o = e / (inner * L);
        int64_t base = o * L * inner + i, rank = 0;
        if (fl) {
            double v = load_f(x, dt, e);
            for (int64_t q = 0; q < L; q++)
                rank += tdd_sort_before(load_f(x, dt, base + q * inner), q, v, l, desc);
        } else {
            int64_t v = load_i(x, dt, e);
            for (int64_t q = 0; q < L; q++)
                rank += tdd_sort_before_i(load_i(x, dt, base + q * inner), q, v, l, desc);
        }
        if (rank < K) {
            int64_t at = o * K * inner + rank * inner + i;
            if (y)
                y[at] = x[e];
            idx[at] = l;
        }
    }
}

// group_norm: a thread per (sample, group), two passes in double, then the normalised values.
__global__ void group_norm_kernel(int dt, const void *x, void *y, const void *w, const void *b,
                                  int64_t N, int64_t C, int64_t S, int64_t G, double eps)
{
    const int64_t Cg = C / G, M = Cg * S;
    for (int64_t r = gtid(); r < N * G; r += gstride()) {
        int64_t first = r * M;
        double s = 0.0, ss = 0.0;
        for (int64_t j = 0; j < M; j++)
            s += load_f(x, dt, first + j);
        double mean = M ? s / (double)M : 0.0;
        for (int64_t j = 0; j < M; j++) {
            double dv = load_f(x, dt, first + j) - mean;
            ss += dv * dv;
        }
        double rstd = 1.0 / sqrt((M ? ss / (double)M : 0.0) + eps);
        for (int64_t j = 0; j < M; j++) {
            int64_t ch = (r % G) * Cg + j / S;
            double v = (load_f(x, dt, first + j) - mean) * rstd;
            if (w)
                v *= load_f(w, dt, ch);
            if (b)
                v += load_f(b, dt, ch);
            store_f(y, dt, first + j, v);
        }
    }
}

// conv_transpose2d on dense operands: a thread per output element, gathering the inputs whose
// strided, dilated kernel taps land on it (in double).
__global__ void conv_transpose2d_kernel(int dt, const void *x, const void *w, const void *b,
                                        void *y, tdc_convt_args a)
{
    const int64_t total = a.N * a.Co * a.Ho * a.Wo, Cog = a.Co / a.G, Cig = a.Ci / a.G;
    for (int64_t o = gtid(); o < total; o += gstride()) {
        int64_t ow = o % a.Wo, oh = (o / a.Wo) % a.Ho, oc = (o / (a.Wo * a.Ho)) % a.Co;
        int64_t n = o / (a.Wo * a.Ho * a.Co), grp = oc / Cog, ocl = oc % Cog;
        double acc = b ? load_f(b, dt, oc) : 0.0;
        for (int64_t kh = 0; kh < a.KH; kh++) {
            int64_t th = oh + a.ph - kh * a.dh;
            if (th < 0 || th % a.sh != 0 || th / a.sh >= a.H)
                continue;
            for (int64_t kw = 0; kw < a.KW; kw++) {
                int64_t tw = ow + a.pw - kw * a.dw;
                if (tw < 0 || tw % a.sw != 0 || tw / a.sw >= a.W)
                    continue;
                for (int64_t icl = 0; icl < Cig; icl++) {
                    int64_t ic = grp * Cig + icl;
                    acc += load_f(x, dt, ((n * a.Ci + ic) * a.H + th / a.sh) * a.W + tw / a.sw) *
                           load_f(w, dt, ((ic * Cog + ocl) * a.KH + kh) * a.KW + kw);
                }
            }
        }
        store_f(y, dt, o, acc);
    }
}

// adaptive_avg_pool2d: a thread per output, its window's mean in double.
__global__ void adaptive_avg_kernel(int dt, const void *x, void *y, int64_t planes, int64_t H,
                                    int64_t W, int64_t Ho, int64_t Wo)
{
    const int64_t n = planes * Ho * Wo;
    for (int64_t e = gtid(); e < n; e += gstride()) {
        int64_t ow = e % Wo, oh = (e / Wo) % Ho, pl = e / (Wo * Ho), h0, h1, w0, w1;
        tdd_adaptive_window(oh, Ho, H, &h0, &h1);
        tdd_adaptive_window(ow, Wo, W, &w0, &w1);
        double s = 0.0;
        for (int64_t h = h0; h < h1; h++)
            for (int64_t w = w0; w < w1; w++)
                s += load_f(x, dt, pl * H * W + h * W + w);
        store_f(y, dt, e, s / (double)((h1 - h0) * (w1 - w0)));
    }
}

template <typename T>
__global__ void pad_mode_kernel(__grid_constant__ const tdc_padmode p, T *y, const T *x)
{
    for (int64_t i = gtid(); i < p.numel; i += gstride()) {
        int64_t r = i, off = 0, yoff = 0;
        for (int d = p.ndim - 1; d >= 0; d--) {
            int64_t o = r % p.yshape[d];
            r /= p.yshape[d];
            yoff += o * p.ystrides[d];
            off += tdd_pad_at(p.mode, o, p.before[d], p.xshape[d], p.keep_start[d], p.keep_len[d]) *
                   p.xstrides[d];
        }
        y[yoff] = x[off];
    }
}

template <typename T>
__global__ void tri_kernel(__grid_constant__ const tdc_layout l, T *y, const T *x, int64_t rows,
                           int64_t cols, int64_t diag, int upper)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[2] = {i, i};
        if (!l.contig)
            offsets<2>(l, i, off);
        int64_t col = i % cols, row = (i / cols) % rows;
        bool keep = upper ? col - row >= diag : col - row <= diag;
        y[off[0]] = keep ? x[off[1]] : (T)0;
    }
}

// The same arithmetic as tdd_rng_u64 (backends/dtype.h), so a seed draws the same tensor on
// every backend.
__device__ __forceinline__ uint64_t rng_u64(uint64_t seed, uint64_t i)
{
    uint64_t z = seed * 0xd1342543de82ef95ull + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void random_kernel(int kind, void *y, int dt, int64_t n, uint64_t seed, int64_t lo,
                              uint64_t range)
{
    for (int64_t i = gtid(); i < n; i += gstride()) {
        uint64_t k = (uint64_t)i;
        if (kind == TDC_RAND) { // 24 bits for f32 (a cast never rounds up to 1), 53 for f64
            if (dt == 2)
                ((double *)y)[i] = (double)(rng_u64(seed, k) >> 11) * 0x1.0p-53;
            else
                ((float *)y)[i] = (float)((double)(rng_u64(seed, k) >> 40) * 0x1.0p-24);
        } else if (kind == TDC_RANDN) {
            double u1 = (double)(rng_u64(seed, 2 * k) >> 11) * 0x1.0p-53;
            double u2 = (double)(rng_u64(seed, 2 * k + 1) >> 11) * 0x1.0p-53;
            double v = sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
            if (dt == 2)
                ((double *)y)[i] = v;
            else
                ((float *)y)[i] = (float)v;
        } else {
            int64_t v = (int64_t)((uint64_t)lo + rng_u64(seed, k) % range);
            if (dt == 5)
                ((int32_t *)y)[i] = (int32_t)v;
            else
                ((int64_t *)y)[i] = v;
        }
    }
}

// ------------------------------------------------------------------ reductions

// The reductions run in T: float (f32, f16/bf16 widened), double (f64), or int64 (integer
// and bool inputs widened; sums and products wrap as the host backends' do).
template <typename T> struct num;
template <> struct num<float> {
    static constexpr bool fp = true;
    __device__ static float lowest()
    {
        return -INFINITY;
    }
    __device__ static float highest()
    {
        return INFINITY;
    }
};
template <> struct num<double> {
    static constexpr bool fp = true;
    __device__ static double lowest()
    {
        return -INFINITY;
    }
    __device__ static double highest()
    {
        return INFINITY;
    }
};
template <> struct num<int64_t> {
    static constexpr bool fp = false;
    __device__ static int64_t lowest()
    {
        return INT64_MIN;
    }
    __device__ static int64_t highest()
    {
        return INT64_MAX;
    }
};

__device__ __forceinline__ float m_exp(float v)
{
    return expf(v);
}
__device__ __forceinline__ double m_exp(double v)
{
    return exp(v);
}
__device__ __forceinline__ float m_log(float v)
{
    return logf(v);
}
__device__ __forceinline__ double m_log(double v)
{
    return log(v);
}
__device__ __forceinline__ float m_sqrt(float v)
{
    return sqrtf(v);
}
__device__ __forceinline__ double m_sqrt(double v)
{
    return sqrt(v);
}

template <typename T> __device__ __forceinline__ T r_init(int comb)
{
    switch (comb) {
    case TDC_R_PROD:
        return (T)1;
    case TDC_R_MAX:
        return num<T>::lowest();
    case TDC_R_MIN:
        return num<T>::highest();
    default:
        return (T)0;
    }
}

template <typename T> __device__ __forceinline__ T r_comb(int comb, T a, T b)
{
    switch (comb) {
    case TDC_R_PROD:
        if constexpr (num<T>::fp)
            return a * b;
        else // wrapping
            return (T)((uint64_t)a * (uint64_t)b);
    case TDC_R_MAX: // NaN wins, as PyTorch's amax
        return (a != a || b != b) ? a + b : (a > b ? a : b);
    case TDC_R_MIN:
        return (a != a || b != b) ? a + b : (a < b ? a : b);
    default:
        if constexpr (num<T>::fp)
            return a + b;
        else
            return (T)((uint64_t)a + (uint64_t)b);
    }
}

// An infinite max would make x - max NaN; logsumexp then shifts by 0 instead.
template <typename T> __device__ __forceinline__ T shift_of(T aux)
{
    return isinf(aux) ? (T)0 : aux;
}

template <typename T> __device__ __forceinline__ T r_map(int map, T x, T aux)
{
    if constexpr (num<T>::fp) {
        switch (map) {
        case TDC_M_EXP_SUB_AUX:
            return m_exp(x - shift_of(aux));
        case TDC_M_SQDEV_AUX: {
            T t = x - aux;
            return t * t;
        }
        default:
            return x;
        }
    } else {
        (void)map;
        (void)aux;
        return x;
    }
}

template <typename T> __device__ __forceinline__ T r_finish(int fin, T v, T aux, double scale)
{
    if constexpr (num<T>::fp) {
        switch (fin) {
        case TDC_F_LOG_ADD_AUX:
            return m_log(v) + shift_of(aux);
        case TDC_F_SQRT_SCALE:
            return m_sqrt(v * (T)scale);
        default:
            return v * (T)scale;
        }
    } else { // integer reductions are sums, products and extrema: nothing to finish
        (void)fin;
        (void)aux;
        (void)scale;
        return v;
    }
}

template <typename T> __device__ __forceinline__ T warp_reduce(int comb, T v)
{
    for (int s = 16; s > 0; s >>= 1)
        v = r_comb(comb, v, __shfl_xor_sync(0xffffffffu, v, s));
    return v;
}

// Every thread of the block gets the result.
template <typename T> __device__ T block_reduce(int comb, T v)
{
    __shared__ T sh[32];
    __shared__ T result;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_reduce(comb, v);
    __syncthreads(); // sh and result may still be read from a previous call
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nw ? sh[lane] : r_init<T>(comb);
        v = warp_reduce(comb, v);
        if (lane == 0)
            result = v;
    }
    __syncthreads();
    return result;
}

// batch_norm: a block per channel of dense [N, C, S], its threads striding the channel's N*S
// elements (sums in double, block_reduce); training: the batch's statistics, the running ones
// (rm, rv, or NULL) updated in place by thread 0 as torch's (unbiased variance).
__global__ void batch_norm_kernel(int dt, const void *x, void *y, void *rm, void *rv, const void *w,
                                  const void *b, int64_t N, int64_t C, int64_t S, int train,
                                  double momentum, double eps)
{
    const int64_t M = N * S;
    for (int64_t ch = blockIdx.x; ch < C; ch += gridDim.x) {
        double mean, var;
        if (train) {
            double s = 0.0, ss = 0.0;
            for (int64_t j = threadIdx.x; j < M; j += blockDim.x)
                s += load_f(x, dt, ((j / S) * C + ch) * S + j % S);
            mean = M ? block_reduce(TDC_R_SUM, s) / (double)M : 0.0;
            for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
                double dv = load_f(x, dt, ((j / S) * C + ch) * S + j % S) - mean;
                ss += dv * dv;
            }
            var = M ? block_reduce(TDC_R_SUM, ss) / (double)M : 0.0;
            if (rm && M > 0 && threadIdx.x == 0) {
                double unb = M > 1 ? var * (double)M / (double)(M - 1) : var;
                store_f(rm, dt, ch, (1.0 - momentum) * load_f(rm, dt, ch) + momentum * mean);
                store_f(rv, dt, ch, (1.0 - momentum) * load_f(rv, dt, ch) + momentum * unb);
            }
        } else {
            mean = load_f(rm, dt, ch);
            var = load_f(rv, dt, ch);
        }
        double rstd = 1.0 / sqrt(var + eps);
        double scale = w ? rstd * load_f(w, dt, ch) : rstd, shift = b ? load_f(b, dt, ch) : 0.0;
        for (int64_t j = threadIdx.x; j < M; j += blockDim.x) {
            int64_t o = ((j / S) * C + ch) * S + j % S;
            store_f(y, dt, o, (load_f(x, dt, o) - mean) * scale + shift);
        }
    }
}

// One block per (output, split) work item: threads stride the split's share of the reduced
// elements (coalesced when the innermost reduced dim is dense). With nsplit > 1 it writes
// partials for reduce_partials; otherwise the finished value.
template <typename T>
__global__ void reduce_block(__grid_constant__ const tdc_reduce_layout l, const T *x, T *out,
                             int comb, int map, int fin, const T *aux, double scale, int nsplit,
                             int64_t chunk)
{
    int64_t items = l.nout * nsplit;
    for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
        int64_t o = w / nsplit, s = w - o * nsplit;
        int64_t base = flat_offset(l.kshape, l.kstride, l.nk, o);
        T a = aux ? aux[o] : (T)0;
        T acc = r_init<T>(comb);
        int64_t lo = s * chunk, hi = lo + chunk < l.nred ? lo + chunk : l.nred;
        for (int64_t r = lo + threadIdx.x; r < hi; r += blockDim.x)
            acc = r_comb(comb, acc,
                         r_map(map, x[base + flat_offset(l.rshape, l.rstride, l.nr, r)], a));
        acc = block_reduce(comb, acc);
        if (threadIdx.x == 0)
            out[w] = nsplit > 1 ? acc : r_finish(fin, acc, a, scale);
    }
}

// One warp per output combines its nsplit partials and finishes.
template <typename T>
__global__ void reduce_partials(const T *part, int nsplit, int64_t nout, T *y, int comb, int fin,
                                const T *aux, double scale)
{
    int64_t warps = gstride() / 32;
    int lane = threadIdx.x & 31;
    for (int64_t o = gtid() / 32; o < nout; o += warps) {
        T acc = r_init<T>(comb);
        for (int s = lane; s < nsplit; s += 32)
            acc = r_comb(comb, acc, part[o * nsplit + s]);
        acc = warp_reduce(comb, acc);
        if (lane == 0)
            y[o] = r_finish(fin, acc, aux ? aux[o] : (T)0, scale);
    }
}

// Short reductions (nred <= 32) over a dense innermost dim: each warp takes 32 / seg outputs,
// seg (a power of two >= nred) lanes each, lane r of a segment reading element r, so a warp
// reads neighbouring rows as one contiguous run (a thread per output would read a row per
// lane, a sector per lane); segments combine by shuffles within themselves.
template <typename T>
__global__ void reduce_warp(__grid_constant__ const tdc_reduce_layout l, const T *x, T *y, int comb,
                            int map, int fin, const T *aux, double scale, int seg)
{
    const int64_t per = 32 / seg, warps = gstride() / 32;
    const int lane = threadIdx.x & 31, r = lane % seg;
    for (int64_t o0 = gtid() / 32 * per; o0 < l.nout; o0 += warps * per) { // warp-uniform
        const int64_t o = o0 + lane / seg;
        const bool in = o < l.nout;
        T a = in && aux ? aux[o] : (T)0;
        T acc = r_init<T>(comb);
        if (in && r < l.nred)
            acc = r_map(map,
                        x[flat_offset(l.kshape, l.kstride, l.nk, o) +
                          flat_offset(l.rshape, l.rstride, l.nr, r)],
                        a);
        for (int s = seg / 2; s > 0; s >>= 1)
            acc = r_comb(comb, acc, __shfl_xor_sync(0xffffffffu, acc, s));
        if (in && r == 0)
            y[o] = r_finish(fin, acc, a, scale);
    }
}

// Reductions over outer dims whose kept innermost dim is dense, with too few outputs for a
// thread each (a bias gradient: [N, C] summed over N): a block of 32 x kColRows threads per
// 32 neighbouring outputs, threadIdx.x over the outputs (a warp reads a contiguous run of
// each reduced row), threadIdx.y striding the reduced elements, combined in shared memory.
constexpr int kColRows = 16;

template <typename T>
__global__ void reduce_cols(__grid_constant__ const tdc_reduce_layout l, const T *x, T *y, int comb,
                            int map, int fin, const T *aux, double scale)
{
    __shared__ T sh[kColRows][33];
    const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    for (int64_t o0 = (int64_t)blockIdx.x * 32; o0 < l.nout; o0 += (int64_t)gridDim.x * 32) {
        const int64_t o = o0 + tx;
        const bool in = o < l.nout;
        const int64_t base = in ? flat_offset(l.kshape, l.kstride, l.nk, o) : 0;
        const T a = in && aux ? aux[o] : (T)0;
        T acc = r_init<T>(comb);
        if (in)
            for (int64_t r = ty; r < l.nred; r += blockDim.y)
                acc = r_comb(comb, acc,
                             r_map(map, x[base + flat_offset(l.rshape, l.rstride, l.nr, r)], a));
        sh[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && in) {
            for (int k = 1; k < (int)blockDim.y; k++)
                acc = r_comb(comb, acc, sh[k][tx]);
            y[o] = r_finish(fin, acc, a, scale);
        }
        __syncthreads(); // sh is read: the next tile may overwrite it
    }
}

// One thread per output: for short reductions, and for reductions over an outer dim where
// neighbouring threads then read neighbouring elements.
template <typename T>
__global__ void reduce_thread(__grid_constant__ const tdc_reduce_layout l, const T *x, T *y,
                              int comb, int map, int fin, const T *aux, double scale)
{
    for (int64_t o = gtid(); o < l.nout; o += gstride()) {
        int64_t base = flat_offset(l.kshape, l.kstride, l.nk, o);
        T a = aux ? aux[o] : (T)0;
        T acc = r_init<T>(comb);
        for (int64_t r = 0; r < l.nred; r++)
            acc = r_comb(comb, acc,
                         r_map(map, x[base + flat_offset(l.rshape, l.rstride, l.nr, r)], a));
        y[o] = r_finish(fin, acc, a, scale);
    }
}

// Is (v, i) preferred to (w, j)? NaN first, then the larger (or smaller), then the lower index.
template <typename T>
__device__ __forceinline__ bool arg_better(T v, int64_t i, T w, int64_t j, int is_max)
{
    bool vn = v != v, wn = w != w;
    if (vn || wn)
        return vn && (!wn || i < j);
    if (v == w)
        return i < j;
    return is_max ? v > w : v < w;
}

// One block per output (argmax/argmin are not split yet: a full reduction of a huge tensor
// runs on one multiprocessor).
template <typename T>
__global__ void argreduce_block(__grid_constant__ const tdc_reduce_layout l, const T *x, int64_t *y,
                                int is_max)
{
    __shared__ T sv[32];
    __shared__ int64_t si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int64_t o = blockIdx.x; o < l.nout; o += gridDim.x) {
        int64_t base = flat_offset(l.kshape, l.kstride, l.nk, o);
        T bv = (T)0;
        int64_t bi = -1; // -1: nothing seen yet
        for (int64_t r = threadIdx.x; r < l.nred; r += blockDim.x) {
            T v = x[base + flat_offset(l.rshape, l.rstride, l.nr, r)];
            if (bi < 0 || arg_better(v, r, bv, bi, is_max)) {
                bv = v;
                bi = r;
            }
        }
        for (int s = 16; s > 0; s >>= 1) {
            T ov = __shfl_xor_sync(0xffffffffu, bv, s);
            int64_t oi = __shfl_xor_sync(0xffffffffu, bi, s);
            if (oi >= 0 && (bi < 0 || arg_better(ov, oi, bv, bi, is_max))) {
                bv = ov;
                bi = oi;
            }
        }
        __syncthreads();
        if (lane == 0) {
            sv[warp] = bv;
            si[warp] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int k = 1; k < nw; k++)
                if (si[k] >= 0 && (bi < 0 || arg_better(sv[k], si[k], bv, bi, is_max))) {
                    bv = sv[k];
                    bi = si[k];
                }
            y[o] = bi < 0 ? 0 : bi;
        }
    }
}

template <typename T>
__global__ void argreduce_thread(__grid_constant__ const tdc_reduce_layout l, const T *x,
                                 int64_t *y, int is_max)
{
    for (int64_t o = gtid(); o < l.nout; o += gstride()) {
        int64_t base = flat_offset(l.kshape, l.kstride, l.nk, o);
        T bv = x[base];
        int64_t bi = 0;
        for (int64_t r = 1; r < l.nred; r++) {
            T v = x[base + flat_offset(l.rshape, l.rstride, l.nr, r)];
            if (arg_better(v, r, bv, bi, is_max)) {
                bv = v;
                bi = r;
            }
        }
        y[o] = bi;
    }
}

// ------------------------------------------------------------------ row ops

// One block per row: max, sum of exp, then the write (three passes over the row; the
// second and third hit L2 for rows that fit).
template <typename T>
__global__ void softmax_rows(__grid_constant__ const tdc_rows_layout l, T *y, const T *x,
                             int log_out)
{
    for (int64_t row = blockIdx.x; row < l.nrows; row += gridDim.x) {
        int64_t xo = flat_offset(l.kshape, l.kstride, l.nk, row);
        int64_t yo = flat_offset(l.kshape, l.ostride, l.nk, row);
        T m = (T)-INFINITY;
        for (int64_t j = threadIdx.x; j < l.n; j += blockDim.x)
            m = r_comb(TDC_R_MAX, m, x[xo + j * l.xs]);
        m = block_reduce(TDC_R_MAX, m);
        T s = (T)0;
        for (int64_t j = threadIdx.x; j < l.n; j += blockDim.x)
            s += m_exp(x[xo + j * l.xs] - m);
        s = block_reduce(TDC_R_SUM, s);
        T ls = m_log(s);
        for (int64_t j = threadIdx.x; j < l.n; j += blockDim.x) {
            T v = x[xo + j * l.xs] - m;
            y[yo + j * l.ys] = log_out ? v - ls : m_exp(v) / s;
        }
    }
}

// cross_entropy / nll_loss: one block per row of x (row = n * S + s at n * rs + s * ss, its C
// classes at stride cs). Each row's loss goes to v[row] and, for the reductions, its weight
// (1 unweighted; 0 ignored) to cnt[row]. Soft targets (probs) are read at x's offsets.
template <typename T>
__global__ void class_loss_rows(__grid_constant__ const tdc_closs p, const T *x, const void *t,
                                int tdt, const T *w, T *v, T *cnt, int *bad)
{
    const int64_t R = p.N * p.S, C = p.C, cs = p.cs;
    const T eps = (T)p.eps;
    for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {
        int64_t n = row / p.S, si = row % p.S;
        const T *xr = x + n * p.rs + si * p.ss;
        T loss = (T)0, counted = (T)0;
        int64_t cls = p.probs ? 0 : load_i(t, tdt, n * p.trs + si * p.tss);
        if (!p.probs && cls != p.ignore && (cls < 0 || cls >= C)) { // the same for the block
            if (threadIdx.x == 0)
                atomicExch(bad, 1); // several threads may: atomically
        } else if (p.probs || cls != p.ignore) {
            T wt = w && !p.probs ? w[cls] : (T)1;
            counted = wt;
            if (p.is_ce) {
                T m = -INFINITY;
                for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
                    m = r_comb(TDC_R_MAX, m, xr[j * cs]);
                m = shift_of(block_reduce(TDC_R_MAX, m));
                T s = (T)0;
                for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
                    s += m_exp(xr[j * cs] - m);
                T lse = m_log(block_reduce(TDC_R_SUM, s)) + m;
                if (p.probs) { // sum_j w_j q_j (lse - x_j), q smoothed
                    const T *tr = (const T *)t + n * p.rs + si * p.ss;
                    T a = (T)0;
                    for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
                        a += (w ? w[j] : (T)1) * (((T)1 - eps) * tr[j * cs] + eps / (T)C) *
                             (lse - xr[j * cs]);
                    loss = block_reduce(TDC_R_SUM, a);
                } else {
                    loss = wt * (lse - xr[cls * cs]);
                    if (eps > (T)0) { // + eps/C sum_j w_j (lse - x_j)
                        T sm = (T)0;
                        for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
                            sm += (w ? w[j] : (T)1) * (lse - xr[j * cs]);
                        sm = block_reduce(TDC_R_SUM, sm);
                        loss = ((T)1 - eps) * loss + eps * sm / (T)C;
                    }
                }
            } else {
                loss = -wt * xr[cls * cs];
            }
        }
        if (threadIdx.x == 0) {
            v[row] = loss;
            if (cnt)
                cnt[row] = counted;
        }
    }
}

// The reductions of class_loss_rows' output: one block; mean divides by the rows counted.
template <typename T>
__global__ void class_loss_total(int64_t N, const T *v, const T *cnt, T *y, int mean)
{
    T s = (T)0, c = (T)0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
        s += v[i];
        c += cnt[i];
    }
    s = block_reduce(TDC_R_SUM, s);
    c = block_reduce(TDC_R_SUM, c);
    if (threadIdx.x == 0)
        *y = mean ? s / c : s;
}

// One warp per row: 32-element tiles scanned with shuffles, carrying the running total.
template <typename T>
__global__ void cumsum_rows(__grid_constant__ const tdc_rows_layout l, T *y, const T *x)
{
    int64_t warps = gstride() / 32;
    int lane = threadIdx.x & 31;
    for (int64_t row = gtid() / 32; row < l.nrows; row += warps) {
        int64_t xo = flat_offset(l.kshape, l.kstride, l.nk, row);
        int64_t yo = flat_offset(l.kshape, l.ostride, l.nk, row);
        T carry = (T)0;
        for (int64_t j0 = 0; j0 < l.n; j0 += 32) {
            int64_t j = j0 + lane;
            T v = j < l.n ? x[xo + j * l.xs] : (T)0;
            for (int s = 1; s < 32; s <<= 1) {
                T t = __shfl_up_sync(0xffffffffu, v, s);
                if (lane >= s)
                    v += t;
            }
            v += carry;
            if (j < l.n)
                y[yo + j * l.ys] = v;
            carry = __shfl_sync(0xffffffffu, v, 31);
        }
    }
}

// ------------------------------------------------------------------ nn

// dropout (train): x kept with probability 1 - p and scaled by 1 / (1 - p), from draw i of
// the session's stream (tdd_rng_uniform: 53 bits), as ref and cpu draw it; any float dtype.
__global__ void dropout_kernel(__grid_constant__ const tdc_layout l, void *y, int ydt,
                               const void *x, double p, uint64_t seed)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[2] = {i, i};
        if (!l.contig)
            offsets<2>(l, i, off);
        double u = (double)(rng_u64(seed, (uint64_t)i) >> 11) * 0x1.0p-53;
        double v = p < 1.0 && u >= p ? load_f(x, ydt, off[1]) / (1.0 - p) : 0.0;
        store_f(y, ydt, off[0], v);
    }
}

// scaled_dot_product_attention: a block per query row, the keys in tiles of kSdpaTile. Each
// key's score is computed once per row: a warp per key, its lanes over E (coalesced along
// the row), summed by shuffles, into shared memory with the mask and the dropout draw (as
// ref's); then every thread runs the softmax's running max and sum over the tile (the same
// values in every thread) and accumulates its columns of v (up to kSdpaVec per thread, one
// pass per blockDim * kSdpaVec columns). Work L*S*(E + Ev) per head, no [L, S] buffer.
constexpr int kSdpaThreads = 128, kSdpaTile = 32, kSdpaVec = 8;

__global__ void __launch_bounds__(kSdpaThreads)
    sdpa_kernel(__grid_constant__ const tdc_sdpa_args a, int dt, const void *q, const void *k,
                const void *v, const void *m, void *y)
{
    __shared__ double sc[kSdpaTile], dm[kSdpaTile];
    const int tid = (int)threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = (int)(blockDim.x >> 5);
    const int64_t chunk = (int64_t)blockDim.x * kSdpaVec;
    const double keep = a.p < 1.0 ? 1.0 / (1.0 - a.p) : 0.0;
    for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
        int64_t i = r % a.L, rest = r / a.L;
        int64_t off[4] = {0, 0, 0, 0};
        for (int d = a.nb - 1; d >= 0; d--) {
            int64_t b = rest % a.bshape[d];
            rest /= a.bshape[d];
            for (int o = 0; o < 4; o++)
                off[o] += b * a.bst[o][d];
        }
        const int64_t qo = off[0] + i * a.rst[0][0];
        const int64_t jend = a.causal ? (i + 1 < a.S ? i + 1 : a.S) : a.S;
        for (int64_t e0 = 0; e0 < a.Ev; e0 += chunk) {
            double mx = -INFINITY, z = 0.0, acc[kSdpaVec];
            for (int u = 0; u < kSdpaVec; u++)
                acc[u] = 0.0;
            for (int64_t j0 = 0; j0 < jend; j0 += kSdpaTile) {
                const int nt = (int)(jend - j0 < kSdpaTile ? jend - j0 : kSdpaTile);
                for (int t = warp; t < nt; t += nw) { // warp-uniform: every lane shuffles
                    const int64_t j = j0 + t, ko = off[1] + j * a.rst[1][0];
                    double s = 0.0;
                    for (int64_t c = lane; c < a.E; c += 32) {
                        s += load_f(q, dt, qo + c * a.rst[0][1]) *
                             load_f(k, dt, ko + c * a.rst[1][1]);
                        TDC_FLOPS(2);
                    }
                    for (int o = 16; o > 0; o >>= 1)
                        s += __shfl_xor_sync(0xffffffffu, s, o);
                    if (lane == 0) {
                        const int64_t mo = off[3] + i * a.rst[3][0] + j * a.rst[3][1];
                        s *= a.scale;
                        if (a.mask == 1 && !((const uint8_t *)m)[mo])
                            s = -INFINITY; // not attended: skipped below
                        else if (a.mask == 2)
                            s += load_f(m, dt, mo);
                        double d = 1.0;
                        if (a.p > 0.0) {
                            double u = (double)(rng_u64(a.seed, (uint64_t)(r * a.S + j)) >> 11) *
                                       0x1.0p-53;
                            d = u >= a.p ? keep : 0.0;
                        }
                        sc[t] = s;
                        dm[t] = d;
                    }
                }
                __syncthreads();
                for (int t = 0; t < nt; t++) {
                    const double s = sc[t];
                    if (s == -INFINITY)
                        continue;
                    if (s > mx) {
                        double f = exp(mx - s);
                        z *= f;
                        for (int u = 0; u < kSdpaVec; u++)
                            acc[u] *= f;
                        mx = s;
                    }
                    double w = exp(s - mx);
                    z += w;
                    w *= dm[t];
                    const int64_t vo = off[2] + (j0 + t) * a.rst[2][0];
                    for (int u = 0; u < kSdpaVec; u++) {
                        const int64_t e = e0 + tid + (int64_t)u * blockDim.x;
                        if (e < a.Ev) {
                            acc[u] += w * load_f(v, dt, vo + e * a.rst[2][1]);
                            TDC_FLOPS(2);
                        }
                    }
                }
                __syncthreads(); // the tile's scores are read: the next may overwrite them
            }
            // nothing attended: 0 / 0, NaN as softmax over -inf; no keys at all: an empty sum
            for (int u = 0; u < kSdpaVec; u++) {
                const int64_t e = e0 + tid + (int64_t)u * blockDim.x;
                if (e < a.Ev)
                    store_f(y, dt, r * a.Ev + e, a.S ? acc[u] / z : 0.0);
            }
        }
    }
}

// interpolate over dense planes: a thread per output element, its sources by tdd_interp_src
// (opcodes.h, as ref's); dt f32 or f64 (f16/bf16 widened).
__global__ void interp_kernel(int dt, const void *x, void *y, int64_t planes, int64_t H, int64_t W,
                              int64_t Ho, int64_t Wo, int nd, int mode, int align, double sh,
                              double sw)
{
    const int dbl = dt == 2;
    for (int64_t e = gtid(); e < planes * Ho * Wo; e += gstride()) {
        int64_t ow = e % Wo, oh = (e / Wo) % Ho, p = e / (Wo * Ho);
        int64_t h0 = 0, h1 = 0, w0, w1;
        double lh = 0.0, lw;
        if (nd == 2)
            tdd_interp_src(mode, align, dbl, sh, oh, H, Ho, &h0, &h1, &lh);
        tdd_interp_src(mode, align, dbl, sw, ow, W, Wo, &w0, &w1, &lw);
        const int64_t r0 = (p * H + h0) * W, r1 = (p * H + h1) * W;
        double v = load_f(x, dt, r0 + w0);
        if (mode == 1) {
            double top = (1.0 - lw) * v + lw * load_f(x, dt, r0 + w1);
            double bot = (1.0 - lw) * load_f(x, dt, r1 + w0) + lw * load_f(x, dt, r1 + w1);
            v = nd == 2 ? (1.0 - lh) * top + lh * bot : top;
        }
        store_f(y, dt, e, v);
    }
}

// layer_norm over dense rows of D: one block per row, mean then the squared deviations (two
// passes, as var), then the write with the optional weight and bias.
template <typename T>
__global__ void layer_norm_rows(int64_t rows, int64_t D, const T *x, T *y, const T *w, const T *b,
                                T eps)
{
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const T *xr = x + row * D;
        T s = (T)0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
            s += xr[j];
        T mean = block_reduce(TDC_R_SUM, s) / (T)D;
        T ss = (T)0;
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            T t = xr[j] - mean;
            ss += t * t;
        }
        T rstd = (T)1 / m_sqrt(block_reduce(TDC_R_SUM, ss) / (T)D + eps);
        for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
            T v = (xr[j] - mean) * rstd;
            if (w)
                v *= w[j];
            if (b)
                v += b[j];
            y[row * D + j] = v;
        }
    }
}

// max_pool2d / avg_pool2d on dense [N, C, H, W]: one thread per output element.
template <typename T>
__global__ void pool_kernel(__grid_constant__ const tdc_pool p, const T *x, T *y, int64_t *arg)
{
    int64_t n = p.N * p.C * p.Ho * p.Wo;
    for (int64_t e = gtid(); e < n; e += gstride()) {
        int64_t ow = e % p.Wo, oh = (e / p.Wo) % p.Ho, nc = e / (p.Wo * p.Ho);
        const T *xp = x + nc * p.H * p.W;
        int64_t h0 = oh * p.stride[0] - p.pad[0], w0 = ow * p.stride[1] - p.pad[1];
        if (p.is_max) {
            T best = (T)-INFINITY;
            int64_t at = -1;
            for (int64_t i = 0; i < p.k[0]; i++)
                for (int64_t j = 0; j < p.k[1]; j++) {
                    int64_t h = h0 + i * p.dil[0], w = w0 + j * p.dil[1];
                    if (h < 0 || h >= p.H || w < 0 || w >= p.W)
                        continue;
                    T v = xp[h * p.W + w];
                    if (at < 0 || v > best || (v != v && best == best)) {
                        best = v;
                        at = h * p.W + w;
                    }
                }
            y[e] = best;
            if (arg)
                arg[e] = at;
        } else {
            // the window clipped to the padded input; the divisor counts the padding unless
            // count_include_pad is off
            int64_t hs = h0 + p.k[0] < p.H + p.pad[0] ? h0 + p.k[0] : p.H + p.pad[0];
            int64_t ws = w0 + p.k[1] < p.W + p.pad[1] ? w0 + p.k[1] : p.W + p.pad[1];
            int64_t pool = (hs - h0) * (ws - w0);
            int64_t ha = h0 < 0 ? 0 : h0, wa = w0 < 0 ? 0 : w0;
            int64_t hb = hs < p.H ? hs : p.H, wb = ws < p.W ? ws : p.W;
            T s = 0;
            for (int64_t h = ha; h < hb; h++)
                for (int64_t w = wa; w < wb; w++)
                    s += xp[h * p.W + w];
            int64_t div = p.include_pad ? pool : (hb - ha) * (wb - wa);
            y[e] = s / (T)div;
        }
    }
}

// conv2d's im2col for group g: col[n][(ic * kh + i) * kw + j][oh * Wo + ow] from dense x.
__global__ void im2col_kernel(__grid_constant__ const tdc_pool p, const float *x, float *col,
                              int64_t Cg, int64_t g)
{
    int64_t K = Cg * p.k[0] * p.k[1], P = p.Ho * p.Wo, n = p.N * K * P;
    for (int64_t e = gtid(); e < n; e += gstride()) {
        int64_t q = e % P, r = (e / P) % K, b = e / (P * K);
        int64_t ow = q % p.Wo, oh = q / p.Wo;
        int64_t j = r % p.k[1], i = (r / p.k[1]) % p.k[0], ic = r / (p.k[0] * p.k[1]);
        int64_t h = oh * p.stride[0] - p.pad[0] + i * p.dil[0];
        int64_t w = ow * p.stride[1] - p.pad[1] + j * p.dil[1];
        bool in = h >= 0 && h < p.H && w >= 0 && w < p.W;
        col[e] = in ? x[((b * p.C + g * Cg + ic) * p.H + h) * p.W + w] : 0.0f;
    }
}

// mse_loss / binary_cross_entropy_with_logits elementwise: operands v, x, t.
template <typename T>
__global__ void pointwise_loss(int bce, __grid_constant__ const tdc_layout l, T *v, const T *x,
                               const T *t)
{
    for (int64_t i = gtid(); i < l.numel; i += gstride()) {
        int64_t off[3] = {i, i, i};
        if (!l.contig)
            offsets<3>(l, i, off);
        T a = x[off[1]], b = t[off[2]];
        v[off[0]] =
            bce ? (a > (T)0 ? a : (T)0) - a * b + log1p(m_exp(-fabs(a))) : (a - b) * (a - b);
    }
}

// GEMMs cuBLAS has no S-gemm for (f64, integers): one thread per output element over the batch
// (nb batch dims of y; a size-1 batch dim of a or b broadcasts), y = (acc ? y : 0) + a b.
// Integers accumulate in wrapping int64 and narrow on store.
template <typename T>
__global__ void gemm_naive(__grid_constant__ const tdc_view y, void *yp,
                           __grid_constant__ const tdc_view a, const void *ap,
                           __grid_constant__ const tdc_view b, const void *bp, int nb, int64_t M,
                           int64_t N, int64_t K, int acc, int64_t total)
{
    for (int64_t e = gtid(); e < total; e += gstride()) {
        int64_t n = e % N, m = (e / N) % M, r = e / (M * N);
        int64_t yo = 0, ao = 0, bo = 0;
        for (int d = nb - 1; d >= 0; d--) {
            int64_t i = r % y.shape[d];
            r /= y.shape[d];
            yo += i * y.strides[d];
            ao += a.shape[d] == 1 ? 0 : i * a.strides[d];
            bo += b.shape[d] == 1 ? 0 : i * b.strides[d];
        }
        ao += m * a.strides[nb];
        bo += n * b.strides[nb + 1];
        yo += m * y.strides[nb] + n * y.strides[nb + 1];
        T s = (T)0;
        for (int64_t k = 0; k < K; k++) {
            int64_t ak = ao + k * a.strides[nb + 1], bk = bo + k * b.strides[nb];
            if constexpr (num<T>::fp)
                s += (T)load_f(ap, a.dt, ak) * (T)load_f(bp, b.dt, bk);
            else
                s = (T)((uint64_t)s +
                        (uint64_t)load_i(ap, a.dt, ak) * (uint64_t)load_i(bp, b.dt, bk));
        }
        if constexpr (num<T>::fp)
            store_f(yp, y.dt, yo, (double)((acc ? (T)load_f(yp, y.dt, yo) : (T)0) + s));
        else
            store_i(yp, y.dt, yo,
                    (int64_t)((uint64_t)(acc ? load_i(yp, y.dt, yo) : 0) + (uint64_t)s));
    }
}

// conv2d directly (f64): one thread per output, as the reference sums it.
__global__ void conv_direct(__grid_constant__ const tdc_pool p, const double *x, const double *w,
                            const double *bias, double *y, int64_t O, int64_t Cg, int64_t Og)
{
    int64_t n = p.N * O * p.Ho * p.Wo;
    for (int64_t e = gtid(); e < n; e += gstride()) {
        int64_t ow = e % p.Wo, oh = (e / p.Wo) % p.Ho, oc = (e / (p.Wo * p.Ho)) % O;
        int64_t b = e / (p.Wo * p.Ho * O), grp = oc / Og;
        double s = bias ? bias[oc] : 0.0;
        for (int64_t ic = 0; ic < Cg; ic++)
            for (int64_t i = 0; i < p.k[0]; i++)
                for (int64_t j = 0; j < p.k[1]; j++) {
                    int64_t h = oh * p.stride[0] - p.pad[0] + i * p.dil[0];
                    int64_t ww = ow * p.stride[1] - p.pad[1] + j * p.dil[1];
                    if (h < 0 || h >= p.H || ww < 0 || ww >= p.W)
                        continue;
                    s += x[((b * p.C + grp * Cg + ic) * p.H + h) * p.W + ww] *
                         w[((oc * Cg + ic) * p.k[0] + i) * p.k[1] + j];
                }
        y[e] = s;
    }
}

bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

cudaError_t launched()
{
    return cudaGetLastError();
}

} // namespace

// ------------------------------------------------------------------ entry points

extern "C" cudaError_t tdc_binary(const tdc_dev *d, tdd_op op, const tdc_layout *l, void *y,
                                  const float *a, const float *b, float scalar, float alpha)
{
    if (l->numel == 0)
        return cudaSuccess;
    int g = grid_for(d, l->contig ? (l->numel + 3) / 4 : l->numel);
    cudaStream_t s = d->stream;
    bool boolean = tdd_ew_rule(op) == TDD_EW_BOOL;
    if (l->contig) {
        int vec = aligned16(y) && aligned16(a) && (!b || aligned16(b)) &&
                  (!boolean || ((uintptr_t)y & 3u) == 0);
        if (boolean)
            tdc_launch(g, kThreads, 0, s, bin_contig<-1, uint8_t>)(op, l->numel, (uint8_t *)y, a, b,
                                                                   scalar, alpha, vec);
        else if (op == TDD_OP_ADD)
            tdc_launch(g, kThreads, 0, s, bin_contig<TDD_OP_ADD, float>)(op, l->numel, (float *)y,
                                                                         a, b, scalar, alpha, vec);
        else if (op == TDD_OP_SUB)
            tdc_launch(g, kThreads, 0, s, bin_contig<TDD_OP_SUB, float>)(op, l->numel, (float *)y,
                                                                         a, b, scalar, alpha, vec);
        else if (op == TDD_OP_MUL)
            tdc_launch(g, kThreads, 0, s, bin_contig<TDD_OP_MUL, float>)(op, l->numel, (float *)y,
                                                                         a, b, scalar, alpha, vec);
        else if (op == TDD_OP_DIV)
            tdc_launch(g, kThreads, 0, s, bin_contig<TDD_OP_DIV, float>)(op, l->numel, (float *)y,
                                                                         a, b, scalar, alpha, vec);
        else
            tdc_launch(g, kThreads, 0, s, bin_contig<-1, float>)(op, l->numel, (float *)y, a, b,
                                                                 scalar, alpha, vec);
    } else if (boolean) {
        tdc_launch(g, kThreads, 0, s, bin_strided<uint8_t>)(op, *l, (uint8_t *)y, a, b, scalar,
                                                            alpha);
    } else {
        tdc_launch(g, kThreads, 0, s, bin_strided<float>)(op, *l, (float *)y, a, b, scalar, alpha);
    }
    return launched();
}

extern "C" cudaError_t tdc_unary(const tdc_dev *d, tdd_op op, const tdc_layout *l, void *y,
                                 const float *x, float p0, float p1, int variant)
{
    if (l->numel == 0)
        return cudaSuccess;
    int g = grid_for(d, l->numel);
    if (tdd_ew_rule(op) == TDD_EW_BOOL)
        tdc_launch(g, kThreads, 0, d->stream, un_kernel<uint8_t>)(op, *l, (uint8_t *)y, x, p0, p1,
                                                                  variant);
    else
        tdc_launch(g, kThreads, 0, d->stream, un_kernel<float>)(op, *l, (float *)y, x, p0, p1,
                                                                variant);
    return launched();
}

/* Runs launch with a value of the unsigned type elsize bytes wide (1, 2, 4 or 8): the
 * kernels that only move bits are instantiated once per width. */
template <typename F> static cudaError_t by_width(int elsize, F launch)
{
    switch (elsize) {
    case 1:
        launch(uint8_t{});
        break;
    case 2:
        launch(uint16_t{});
        break;
    case 4:
        launch(uint32_t{});
        break;
    case 8:
        launch(uint64_t{});
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return launched();
}

extern "C" cudaError_t tdc_copy(const tdc_dev *d, const tdc_layout *l, void *y, const void *x,
                                int elsize)
{
    if (l->numel == 0)
        return cudaSuccess;
    if (l->contig)
        return cudaMemcpyAsync(y, x, (size_t)l->numel * (size_t)elsize, cudaMemcpyDeviceToDevice,
                               d->stream);
    int g = grid_for(d, l->numel);
    cudaStream_t s = d->stream;
    return by_width(elsize, [&](auto w) {
        using T = decltype(w);
        tdc_launch(g, kThreads, 0, s, copy_kernel<T>)(*l, (T *)y, (const T *)x);
    });
}

extern "C" cudaError_t tdc_cast(const tdc_dev *d, const tdc_layout *l, void *y, int ydt,
                                const void *x, int xdt)
{
    if (l->numel == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, l->numel), kThreads, 0, d->stream, cast_kernel)(*l, y, ydt, x, xdt);
    return launched();
}

extern "C" cudaError_t tdc_fill(const tdc_dev *d, void *y, int64_t n, int elsize, uint64_t bits)
{
    if (n == 0)
        return cudaSuccess;
    int g = grid_for(d, n);
    cudaStream_t s = d->stream;
    return by_width(elsize, [&](auto w) {
        using T = decltype(w);
        tdc_launch(g, kThreads, 0, s, fill_kernel<T>)((T *)y, n, (T)bits);
    });
}

extern "C" cudaError_t tdc_arange_f(const tdc_dev *d, int dt, void *y, int64_t n, double start,
                                    double step)
{
    if (n == 0)
        return cudaSuccess;
    if (dt == 2)
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream, arange_f_kernel<double>)((double *)y, n,
                                                                                    start, step);
    else
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream, arange_f_kernel<float>)((float *)y, n,
                                                                                   start, step);
    return launched();
}

extern "C" cudaError_t tdc_linspace_f(const tdc_dev *d, int dt, void *y, int64_t n, double start,
                                      double end)
{
    if (n == 0)
        return cudaSuccess;
    if (dt == 2)
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream,
                   linspace_f_kernel<double>)((double *)y, n, start, end);
    else
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream, linspace_f_kernel<float>)((float *)y, n,
                                                                                     start, end);
    return launched();
}

extern "C" cudaError_t tdc_arange_i64(const tdc_dev *d, int64_t *y, int64_t n, int64_t start,
                                      int64_t step)
{
    if (n == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, n), kThreads, 0, d->stream, arange_i64_kernel)(y, n, start, step);
    return launched();
}

extern "C" cudaError_t tdc_eye(const tdc_dev *d, void *y, int64_t rows, int64_t cols, int elsize,
                               uint64_t one)
{
    if (rows == 0 || cols == 0)
        return cudaSuccess;
    int g = grid_for(d, rows * cols);
    cudaStream_t s = d->stream;
    return by_width(elsize, [&](auto w) {
        using T = decltype(w);
        tdc_launch(g, kThreads, 0, s, eye_kernel<T>)((T *)y, rows, cols, (T)one);
    });
}

extern "C" cudaError_t tdc_conv_transpose2d(const tdc_dev *d, int dt, const void *x, const void *w,
                                            const void *b, void *y, const tdc_convt_args *a)
{
    int64_t total = a->N * a->Co * a->Ho * a->Wo;
    if (total == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, total), kThreads, 0, d->stream, conv_transpose2d_kernel)(dt, x, w, b, y,
                                                                                    *a);
    return launched();
}

extern "C" cudaError_t tdc_batch_norm(const tdc_dev *d, int dt, const void *x, void *y, void *rm,
                                      void *rv, const void *w, const void *b, int64_t N, int64_t C,
                                      int64_t S, int train, double momentum, double eps)
{
    if (C == 0)
        return cudaSuccess;
    int grid = (int)(C < 65535 * 8 ? C : 65535 * 8);
    tdc_launch(grid, block_for(N * S), 0, d->stream, batch_norm_kernel)(dt, x, y, rm, rv, w, b, N,
                                                                        C, S, train, momentum, eps);
    return launched();
}

extern "C" cudaError_t tdc_group_norm(const tdc_dev *d, int dt, const void *x, void *y,
                                      const void *w, const void *b, int64_t N, int64_t C, int64_t S,
                                      int64_t G, double eps)
{
    if (N * G == 0 || S == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, N * G), kThreads, 0, d->stream, group_norm_kernel)(dt, x, y, w, b, N, C,
                                                                              S, G, eps);
    return launched();
}

extern "C" cudaError_t tdc_adaptive_avg_pool2d(const tdc_dev *d, int dt, const void *x, void *y,
                                               int64_t planes, int64_t H, int64_t W, int64_t Ho,
                                               int64_t Wo)
{
    int64_t n = planes * Ho * Wo;
    if (n == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, n), kThreads, 0, d->stream, adaptive_avg_kernel)(dt, x, y, planes, H, W,
                                                                            Ho, Wo);
    return launched();
}

extern "C" cudaError_t tdc_sort(const tdc_dev *d, const void *x, int dt, int elsize, int64_t outer,
                                int64_t L, int64_t inner, int64_t K, int descending, void *y,
                                int64_t *idx)
{
    int64_t n = outer * L * inner;
    if (n == 0 || K == 0)
        return cudaSuccess;
    int g = grid_for(d, n);
    cudaStream_t s = d->stream;
    return by_width(elsize, [&](auto w) {
        using T = decltype(w);
        tdc_launch(g, kThreads, 0, s, sort_kernel<T>)((const T *)x, dt, outer, L, inner, K,
                                                      descending, (T *)y, idx);
    });
}

extern "C" cudaError_t tdc_pad_mode(const tdc_dev *d, const tdc_padmode *p, void *y, const void *x,
                                    int elsize)
{
    if (p->numel == 0)
        return cudaSuccess;
    int g = grid_for(d, p->numel);
    cudaStream_t s = d->stream;
    return by_width(elsize, [&](auto w) {
        using T = decltype(w);
        tdc_launch(g, kThreads, 0, s, pad_mode_kernel<T>)(*p, (T *)y, (const T *)x);
    });
}

extern "C" cudaError_t tdc_tri(const tdc_dev *d, const tdc_layout *l, void *y, const void *x,
                               int elsize, int64_t rows, int64_t cols, int64_t diagonal, int upper)
{
    if (l->numel == 0)
        return cudaSuccess;
    int g = grid_for(d, l->numel);
    cudaStream_t s = d->stream;
    return by_width(elsize, [&](auto w) {
        using T = decltype(w);
        tdc_launch(g, kThreads, 0, s, tri_kernel<T>)(*l, (T *)y, (const T *)x, rows, cols, diagonal,
                                                     upper);
    });
}

extern "C" cudaError_t tdc_random_fill(const tdc_dev *d, tdc_random kind, void *y, int dt,
                                       int64_t n, uint64_t seed, int64_t lo, uint64_t range)
{
    if (n == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, n), kThreads, 0, d->stream, random_kernel)(kind, y, dt, n, seed, lo,
                                                                      range);
    return launched();
}

// Thread per output when the reduction is short, or when it runs over an outer dim while
// the kept dims are dense (a block per output would read a column, one sector per element).
static bool thread_per_output(const tdc_reduce_layout *l)
{
    if (l->nred <= 32)
        return true;
    return l->rstride[l->nr - 1] != 1 && l->kstride[l->nk - 1] == 1 && l->nout >= 1024;
}

template <typename T>
static cudaError_t reduce_t(const tdc_dev *d, const tdc_reduce_layout *l, T *y, const T *x,
                            int comb, int map, int fin, const T *aux, double scale)
{
    cudaStream_t s = d->stream;
    if (l->nred <= 32 && l->nr > 0 && l->rstride[l->nr - 1] == 1) {
        int seg = 1;
        while (seg < l->nred)
            seg *= 2;
        tdc_launch(grid_for(d, (l->nout * seg + 31) / 32 * 32), kThreads, 0, s,
                   reduce_warp<T>)(*l, x, y, comb, map, fin, aux, scale, seg);
        return launched();
    }
    // (under 32 outputs lanes idle: only while one block's 512 threads suffice for nred)
    if (l->nout < 1024 && (l->nout >= 32 || l->nred <= 65536) && l->nr > 0 && l->nk > 0 &&
        l->rstride[l->nr - 1] != 1 && l->kstride[l->nk - 1] == 1) {
        int64_t tiles = (l->nout + 31) / 32, cap = (int64_t)(d->sms > 0 ? d->sms : 1) * 8;
        tdc_launch((int)(tiles < cap ? tiles : cap), dim3(32, kColRows), 0, s,
                   reduce_cols<T>)(*l, x, y, comb, map, fin, aux, scale);
        return launched();
    }
    if (thread_per_output(l)) {
        tdc_launch(grid_for(d, l->nout), kThreads, 0, s, reduce_thread<T>)(*l, x, y, comb, map, fin,
                                                                           aux, scale);
        return launched();
    }
    // Few outputs over many elements: split each reduction so every SM gets blocks.
    int64_t target = (int64_t)(d->sms > 0 ? d->sms : 1) * 4;
    int64_t nsplit = 1;
    if (l->nout < target) {
        nsplit = (target + l->nout - 1) / l->nout;
        int64_t most = (l->nred + kThreads * 8 - 1) / (kThreads * 8); // >= 8 loads per thread
        if (nsplit > most)
            nsplit = most;
        if (nsplit > 1024)
            nsplit = 1024;
        if (nsplit < 1)
            nsplit = 1;
    }
    int64_t chunk = (l->nred + nsplit - 1) / nsplit;
    int64_t items = l->nout * nsplit;
    int grid = (int)(items < 65535 * 8 ? items : 65535 * 8);
    int threads = block_for(chunk);
    if (nsplit == 1) {
        tdc_launch(grid, threads, 0, s, reduce_block<T>)(*l, x, y, comb, map, fin, aux, scale, 1,
                                                         chunk);
        return launched();
    }
    T *part = nullptr;
    cudaError_t e = cudaMallocAsync((void **)&part, (size_t)items * sizeof(T), s);
    if (e != cudaSuccess)
        return e;
    tdc_launch(grid, threads, 0, s, reduce_block<T>)(*l, x, part, comb, map, fin, aux, scale,
                                                     (int)nsplit, chunk);
    e = launched();
    if (e == cudaSuccess) {
        tdc_launch(grid_for(d, l->nout * 32), kThreads, 0, s,
                   reduce_partials<T>)(part, (int)nsplit, l->nout, y, comb, fin, aux, scale);
        e = launched();
    }
    cudaError_t f = cudaFreeAsync(part, s);
    return e != cudaSuccess ? e : f;
}

extern "C" cudaError_t tdc_reduce(const tdc_dev *d, const tdc_reduce_layout *l, int dt, void *y,
                                  const void *x, tdc_combine comb, tdc_map map, tdc_finish fin,
                                  const void *aux, double scale)
{
    if (l->nout == 0)
        return cudaSuccess;
    switch (dt) {
    case 1:
        return reduce_t(d, l, (float *)y, (const float *)x, comb, map, fin, (const float *)aux,
                        scale);
    case 2:
        return reduce_t(d, l, (double *)y, (const double *)x, comb, map, fin, (const double *)aux,
                        scale);
    case 6:
        return reduce_t(d, l, (int64_t *)y, (const int64_t *)x, comb, map, fin,
                        (const int64_t *)aux, scale);
    default:
        return cudaErrorInvalidValue;
    }
}

template <typename T>
static cudaError_t argreduce_t(const tdc_dev *d, const tdc_reduce_layout *l, int64_t *y, const T *x,
                               int is_max)
{
    if (thread_per_output(l)) {
        tdc_launch(grid_for(d, l->nout), kThreads, 0, d->stream, argreduce_thread<T>)(*l, x, y,
                                                                                      is_max);
    } else {
        int grid = (int)(l->nout < 65535 * 8 ? l->nout : 65535 * 8);
        tdc_launch(grid, block_for(l->nred), 0, d->stream, argreduce_block<T>)(*l, x, y, is_max);
    }
    return launched();
}

extern "C" cudaError_t tdc_argreduce(const tdc_dev *d, const tdc_reduce_layout *l, int dt,
                                     int64_t *y, const void *x, int is_max)
{
    if (l->nout == 0)
        return cudaSuccess;
    switch (dt) {
    case 1:
        return argreduce_t(d, l, y, (const float *)x, is_max);
    case 2:
        return argreduce_t(d, l, y, (const double *)x, is_max);
    case 6:
        return argreduce_t(d, l, y, (const int64_t *)x, is_max);
    default:
        return cudaErrorInvalidValue;
    }
}

template <typename T>
static cudaError_t rows_t(const tdc_dev *d, tdc_rowop op, const tdc_rows_layout *l, T *y,
                          const T *x)
{
    cudaStream_t s = d->stream;
    if (op == TDC_CUMSUM) {
        tdc_launch(grid_for(d, l->nrows * 32), kThreads, 0, s, cumsum_rows<T>)(*l, y, x);
    } else if constexpr (num<T>::fp) {
        int grid = (int)(l->nrows < 65535 * 8 ? l->nrows : 65535 * 8);
        tdc_launch(grid, block_for(l->n), 0, s, softmax_rows<T>)(*l, y, x, op == TDC_LOG_SOFTMAX);
    } else {
        return cudaErrorInvalidValue;
    }
    return launched();
}

extern "C" cudaError_t tdc_rows(const tdc_dev *d, tdc_rowop op, const tdc_rows_layout *l, int dt,
                                void *y, const void *x)
{
    if (l->nrows == 0 || l->n == 0)
        return cudaSuccess;
    switch (dt) {
    case 1:
        return rows_t(d, op, l, (float *)y, (const float *)x);
    case 2:
        return rows_t(d, op, l, (double *)y, (const double *)x);
    case 6:
        return rows_t(d, op, l, (int64_t *)y, (const int64_t *)x);
    default:
        return cudaErrorInvalidValue;
    }
}

// An error flag in device memory for kernels that check values (indices, integer powers).
// Where the slot keeps a ring of them (tdc_dev's flags, cuda_checks.h) the kernel takes the
// next entry and nothing waits: the ring is read at the next synchronising point. Without
// one, or with the ring full, a fresh flag is zeroed on the stream and read back after the
// kernel (this synchronises the stream, as a PyTorch index check would if it were typed
// rather than a device assert).
static cudaError_t flag_new(const tdc_dev *d, int **flag)
{
    cudaError_t e = cudaMallocAsync((void **)flag, sizeof(int), d->stream);
    if (e == cudaSuccess)
        e = cudaMemsetAsync(*flag, 0, sizeof(int), d->stream);
    return e;
}

static cudaError_t flag_read(const tdc_dev *d, int *flag, cudaError_t e, int *bad)
{
    int h = 0;
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(&h, flag, sizeof h, cudaMemcpyDeviceToHost, d->stream);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(d->stream);
    cudaError_t f = cudaFreeAsync(flag, d->stream);
    *bad = h != 0;
    return e != cudaSuccess ? e : f;
}

// n items of work (none: nothing runs) whose kernels set an error flag: launch(flag)
// issues them and returns its error; *bad says whether a synchronous flag was set.
template <typename F> static cudaError_t with_flag(const tdc_dev *d, int64_t n, int *bad, F launch)
{
    *bad = 0;
    if (n == 0)
        return cudaSuccess;
    if (d->flags && !*d->flags && d->flags_cap > 0) { // the slot's first check: its ring
        size_t bytes = sizeof(int) * (size_t)d->flags_cap;
        if (cudaMallocAsync((void **)d->flags, bytes, d->stream) != cudaSuccess ||
            cudaMemsetAsync(*d->flags, 0, bytes, d->stream) != cudaSuccess) {
            if (*d->flags)
                (void)cudaFreeAsync(*d->flags, d->stream);
            *d->flags = nullptr;
            (void)cudaGetLastError(); // no ring: this check and the next synchronise
        }
    }
    if (d->flags && *d->flags && *d->flags_taken < d->flags_cap)
        return launch(*d->flags + (*d->flags_taken)++);
    int *flag = nullptr;
    cudaError_t e = flag_new(d, &flag);
    if (e != cudaSuccess)
        return e;
    return flag_read(d, flag, launch(flag), bad);
}

extern "C" cudaError_t tdc_ew(const tdc_dev *d, tdd_op op, const tdc_layout *l, void *y,
                              const void *a, const void *b, const tdc_ewargs *g, int *bad)
{
    *bad = 0;
    if (l->numel == 0)
        return cudaSuccess;
    int arity = tdd_ew_arity(op), grid = grid_for(d, l->numel);
    cudaStream_t s = d->stream;
    if (g->cdt >= 1 && g->cdt <= 4) {
        if (g->cdt == 2)
            tdc_launch(grid, kThreads, 0, s, ew_float<double>)(op, arity, *l, y, a, b, *g);
        else
            tdc_launch(grid, kThreads, 0, s, ew_float<float>)(op, arity, *l, y, a, b, *g);
        return launched();
    }
    if (tdd_ew_imode(op) != TDD_EWI_ICHK) {
        tdc_launch(grid, kThreads, 0, s, ew_int)(op, arity, *l, y, a, b, *g, nullptr);
        return launched();
    }
    return with_flag(d, l->numel, bad, [&](int *flag) {
        tdc_launch(grid, kThreads, 0, s, ew_int)(op, arity, *l, y, a, b, *g, flag);
        return launched();
    });
}

extern "C" cudaError_t tdc_select(const tdc_dev *d, const tdc_layout *l, void *y,
                                  const uint8_t *cond, const void *a, const void *b, int elsize,
                                  uint64_t bits)
{
    if (l->numel == 0)
        return cudaSuccess;
    int g = grid_for(d, l->numel);
    cudaStream_t s = d->stream;
    return by_width(elsize, [&](auto w) {
        using T = decltype(w);
        tdc_launch(g, kThreads, 0, s, select_kernel<T>)(*l, (T *)y, cond, (const T *)a,
                                                        (const T *)b, (T)bits);
    });
}

static int64_t view_numel(const tdc_view *v)
{
    int64_t n = 1;
    for (int k = 0; k < v->ndim; k++)
        n *= v->shape[k];
    return n;
}

extern "C" cudaError_t tdc_index(const tdc_dev *d, tdc_index_mode mode, int dim, const tdc_view *y,
                                 void *yp, const tdc_view *a, const void *ap, const tdc_view *ix,
                                 const void *ixp, int elsize, int *bad)
{
    int64_t n = view_numel(y);
    int g = grid_for(d, n);
    cudaStream_t s = d->stream;
    return with_flag(d, n, bad, [&](int *flag) {
        return by_width(elsize, [&](auto w) {
            using T = decltype(w);
            tdc_launch(g, kThreads, 0, s, index_kernel<T>)(mode, dim, *y, (T *)yp, *a,
                                                           (const T *)ap, *ix, ixp, n, flag);
        });
    });
}

extern "C" cudaError_t tdc_scatter_add(const tdc_dev *d, int dim, const tdc_view *y, void *yp,
                                       const tdc_view *ix, const void *ixp, const tdc_view *src,
                                       const void *srcp, int *bad)
{
    int64_t n = view_numel(ix);
    return with_flag(d, n, bad, [&](int *flag) {
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream,
                   scatter_add_kernel)(dim, *y, yp, *ix, ixp, *src, srcp, n, flag);
        return launched();
    });
}

extern "C" cudaError_t tdc_one_hot(const tdc_dev *d, const tdc_view *x, const void *xp, int64_t *y,
                                   int64_t classes, int *bad)
{
    int64_t n = view_numel(x) * classes;
    return with_flag(d, n, bad, [&](int *flag) {
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream, one_hot_kernel)(*x, xp, y, classes, n,
                                                                           flag);
        return launched();
    });
}

template <typename T>
static cudaError_t class_loss_t(const tdc_dev *d, const tdc_closs *p, const T *xp, const void *tp,
                                int tdt, const T *wp, T *y, int reduction, int *flag)
{
    int64_t N = p->N * p->S, C = p->C;
    cudaStream_t s = d->stream;
    T *scratch = nullptr;
    cudaError_t e = cudaSuccess;
    if (reduction != 0 && N > 0)
        e = cudaMallocAsync((void **)&scratch, (size_t)N * 2 * sizeof(T), s);
    if (e == cudaSuccess && N > 0) {
        int grid = (int)(N < 65535 * 8 ? N : 65535 * 8);
        T *v = reduction ? scratch : y, *cnt = reduction ? scratch + N : nullptr;
        tdc_launch(grid, block_for(C), 0, s, class_loss_rows<T>)(*p, xp, tp, tdt, wp, v, cnt, flag);
        e = launched();
    }
    if (e == cudaSuccess && reduction != 0) {
        if (N > 0)
            tdc_launch(1, kThreads, 0, s, class_loss_total<T>)(N, scratch, scratch + N, y,
                                                               reduction == 1);
        else // no rows: the sum is 0, the mean 0/0
            tdc_launch(1, 1, 0, s, fill_kernel<T>)(y, 1, reduction == 1 ? (T)NAN : (T)0);
        e = launched();
    }
    if (scratch)
        cudaFreeAsync(scratch, s);
    return e;
}

extern "C" cudaError_t tdc_class_loss(const tdc_dev *d, const tdc_closs *p, int dt, const void *xp,
                                      const void *tp, int tdt, const void *wp, void *y,
                                      int reduction, int *bad)
{
    return with_flag(d, 1, bad, [&](int *flag) {
        if (dt == 2)
            return class_loss_t(d, p, (const double *)xp, tp, tdt, (const double *)wp, (double *)y,
                                reduction, flag);
        return class_loss_t(d, p, (const float *)xp, tp, tdt, (const float *)wp, (float *)y,
                            reduction, flag);
    });
}

extern "C" cudaError_t tdc_dropout(const tdc_dev *d, const tdc_layout *l, void *y, int dt,
                                   const void *x, double p, uint64_t seed)
{
    if (l->numel == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, l->numel), kThreads, 0, d->stream, dropout_kernel)(*l, y, dt, x, p,
                                                                              seed);
    return launched();
}

extern "C" cudaError_t tdc_sdpa(const tdc_dev *d, const tdc_sdpa_args *a, int dt, const void *q,
                                const void *k, const void *v, const void *m, void *y)
{
    if (a->rows * a->Ev == 0)
        return cudaSuccess;
    const int64_t cap = (int64_t)(d->sms > 0 ? d->sms : 1) * 32;
    tdc_launch((int)(a->rows < cap ? a->rows : cap), kSdpaThreads, 0, d->stream,
               sdpa_kernel)(*a, dt, q, k, v, m, y);
    return launched();
}

extern "C" cudaError_t tdc_interpolate(const tdc_dev *d, int dt, const void *x, void *y,
                                       int64_t planes, int64_t H, int64_t W, int64_t Ho, int64_t Wo,
                                       int nd, int mode, int align, double sh, double sw)
{
    if (planes * Ho * Wo == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, planes * Ho * Wo), kThreads, 0, d->stream,
               interp_kernel)(dt, x, y, planes, H, W, Ho, Wo, nd, mode, align, sh, sw);
    return launched();
}

extern "C" cudaError_t tdc_layer_norm(const tdc_dev *d, int dt, int64_t rows, int64_t D,
                                      const void *x, void *y, const void *w, const void *b,
                                      double eps)
{
    if (rows == 0 || D == 0)
        return cudaSuccess;
    int grid = (int)(rows < 65535 * 8 ? rows : 65535 * 8);
    if (dt == 2)
        tdc_launch(grid, block_for(D), 0, d->stream, layer_norm_rows<double>)(
            rows, D, (const double *)x, (double *)y, (const double *)w, (const double *)b, eps);
    else
        tdc_launch(grid, block_for(D), 0, d->stream, layer_norm_rows<float>)(
            rows, D, (const float *)x, (float *)y, (const float *)w, (const float *)b, (float)eps);
    return launched();
}

extern "C" cudaError_t tdc_pool2d(const tdc_dev *d, const tdc_pool *p, const void *x, void *y,
                                  int64_t *arg, int dt)
{
    int64_t n = p->N * p->C * p->Ho * p->Wo;
    if (n == 0)
        return cudaSuccess;
    if (dt == 2)
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream,
                   pool_kernel<double>)(*p, (const double *)x, (double *)y, arg);
    else
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream, pool_kernel<float>)(*p, (const float *)x,
                                                                               (float *)y, arg);
    return launched();
}

extern "C" cudaError_t tdc_im2col(const tdc_dev *d, const tdc_pool *p, const float *x, float *col,
                                  int64_t Cg, int64_t g)
{
    int64_t n = p->N * Cg * p->k[0] * p->k[1] * p->Ho * p->Wo;
    if (n == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, n), kThreads, 0, d->stream, im2col_kernel)(*p, x, col, Cg, g);
    return launched();
}

extern "C" cudaError_t tdc_pointwise_loss(const tdc_dev *d, int bce, int dt, const tdc_layout *l,
                                          void *v, const void *x, const void *t)
{
    if (l->numel == 0)
        return cudaSuccess;
    int g = grid_for(d, l->numel);
    if (dt == 2)
        tdc_launch(g, kThreads, 0, d->stream, pointwise_loss<double>)(
            bce, *l, (double *)v, (const double *)x, (const double *)t);
    else
        tdc_launch(g, kThreads, 0, d->stream,
                   pointwise_loss<float>)(bce, *l, (float *)v, (const float *)x, (const float *)t);
    return launched();
}

extern "C" cudaError_t tdc_gemm(const tdc_dev *d, const tdc_view *y, void *yp, const tdc_view *a,
                                const void *ap, const tdc_view *b, const void *bp, int nb,
                                int64_t M, int64_t N, int64_t K, int accumulate)
{
    int64_t total = M * N;
    for (int k = 0; k < nb; k++)
        total *= y->shape[k];
    if (total == 0)
        return cudaSuccess;
    int g = grid_for(d, total);
    if (y->dt == 1 || y->dt == 2)
        tdc_launch(g, kThreads, 0, d->stream, gemm_naive<double>)(*y, yp, *a, ap, *b, bp, nb, M, N,
                                                                  K, accumulate, total);
    else
        tdc_launch(g, kThreads, 0, d->stream, gemm_naive<int64_t>)(*y, yp, *a, ap, *b, bp, nb, M, N,
                                                                   K, accumulate, total);
    return launched();
}

extern "C" cudaError_t tdc_conv2d_f64(const tdc_dev *d, const tdc_pool *p, const double *x,
                                      const double *w, const double *bias, double *y, int64_t O,
                                      int64_t Cg, int64_t Og)
{
    int64_t n = p->N * O * p->Ho * p->Wo;
    if (n == 0)
        return cudaSuccess;
    tdc_launch(grid_for(d, n), kThreads, 0, d->stream, conv_direct)(*p, x, w, bias, y, O, Cg, Og);
    return launched();
}

// ------------------------------------------------------------------ embedding_bag, multinomial
// (the reference's loops, ref_bag.c, one thread per output element or row)

// Bag b's entries [lo, hi) of n, false when the offsets break PyTorch's rules.
__device__ __forceinline__ bool bag_range(const tdc_view &off, const void *op, int64_t b, int64_t B,
                                          int last, int64_t n, int64_t *lo, int64_t *hi)
{
    *lo = load_i(op, off.dt, b * off.strides[0]);
    *hi = b + 1 < B || last ? load_i(op, off.dt, (b + 1) * off.strides[0]) : n;
    return !((b == 0 && *lo != 0) || *lo < 0 || *hi < *lo || *hi > n);
}

// One thread per (bag, column): the forward's output, or (bw) the column's share of the
// weight's gradient added atomically (bags share rows).
__global__ void embedding_bag_kernel(int bw, __grid_constant__ const tdc_bag g,
                                     __grid_constant__ const tdc_view ix, const void *ixp,
                                     __grid_constant__ const tdc_view off, const void *offp,
                                     __grid_constant__ const tdc_view w, const void *wp,
                                     __grid_constant__ const tdc_view psw, const void *pswp,
                                     __grid_constant__ const tdc_view gy, const void *gyp,
                                     __grid_constant__ const tdc_view y, void *yp, int *bad)
{
    int64_t D = w.shape[1], num = w.shape[0], n = ix.shape[0];
    for (int64_t i = gtid(); i < g.B * D; i += gstride()) {
        int64_t b = i / D, d = i - b * D, lo, hi;
        if (!bag_range(off, offp, b, g.B, g.last, n, &lo, &hi)) {
            atomicExch(bad, 1); // several threads may: atomically
            continue;
        }
        double acc = g.mode == 2 ? -INFINITY : 0.0;
        int64_t cnt = 0, arg = -1;
        bool ok = true;
        for (int64_t j = lo; j < hi; j++) {
            int64_t k = load_i(ixp, ix.dt, j * ix.strides[0]);
            if (k < 0 || k >= num) {
                ok = false;
                break;
            }
            if (k == g.pad)
                continue;
            double v = load_f(wp, w.dt, k * w.strides[0] + d * w.strides[1]);
            if (pswp)
                v *= load_f(pswp, psw.dt, j * psw.strides[0]);
            if (g.mode == 2) {
                if (arg < 0 || v > acc || (v != v && acc == acc)) {
                    acc = v;
                    arg = k;
                }
            } else {
                acc += v;
            }
            cnt++;
        }
        if (!ok) {
            atomicExch(bad, 1); // several threads may: atomically
            continue;
        }
        if (!bw) {
            double v = cnt == 0 ? 0.0 : g.mode == 1 ? acc / (double)cnt : acc;
            store_f(yp, y.dt, b * y.strides[0] + d * y.strides[1], v);
            continue;
        }
        double gv = load_f(gyp, gy.dt, b * gy.strides[0] + d * gy.strides[1]);
        double scale = g.mode == 1 && cnt > 0 ? 1.0 / (double)cnt : 1.0;
        for (int64_t j = lo; j < hi; j++) {
            int64_t k = load_i(ixp, ix.dt, j * ix.strides[0]);
            if (k == g.pad || (g.mode == 2 && k != arg))
                continue;
            double s = g.mode == 2
                           ? gv
                           : gv * scale * (pswp ? load_f(pswp, psw.dt, j * psw.strides[0]) : 1.0);
            int64_t yo = k * y.strides[0] + d * y.strides[1];
            if (y.dt == 2)
                atomicAdd((double *)yp + yo, s);
            else
                atomicAdd((float *)yp + yo, (float)s);
            if (g.mode == 2)
                break; /* the max's one entry */
        }
    }
}

// One thread per row: the reference's draws (ref_bag.c) in the same order.
__global__ void multinomial_kernel(__grid_constant__ const tdc_view x, const void *xp, int64_t *y,
                                   int64_t R, int64_t C, int64_t k, int repl, uint64_t seed,
                                   int *bad)
{
    for (int64_t r = gtid(); r < R; r += gstride()) {
        double total = 0.0;
        int64_t nz = 0;
        bool ok = true;
        for (int64_t i = 0; i < C; i++) {
            double p = load_f(xp, x.dt, flat_offset(x.shape, x.strides, x.ndim, r * C + i));
            if (!(p >= 0.0) || p == INFINITY)
                ok = false;
            total += p;
            nz += p > 0.0;
        }
        if (!ok || !(total > 0.0) || total == INFINITY || (!repl && nz < k)) {
            atomicExch(bad, 1); // several threads may: atomically
            continue;
        }
        double prev = INFINITY;
        int64_t prev_i = -1;
        for (int64_t s = 0; s < k; s++) {
            int64_t pick = -1;
            if (repl) {
                double u = (double)(rng_u64(seed, (uint64_t)(r * k + s)) >> 11) * 0x1.0p-53 * total;
                double acc = 0.0;
                for (int64_t i = 0; i < C && pick < 0; i++) {
                    double p = load_f(xp, x.dt, flat_offset(x.shape, x.strides, x.ndim, r * C + i));
                    if (p <= 0.0)
                        continue;
                    acc += p;
                    if (u < acc)
                        pick = i;
                    prev_i = i;
                }
                if (pick < 0)
                    pick = prev_i;
            } else {
                double best = -INFINITY;
                for (int64_t i = 0; i < C; i++) {
                    double p = load_f(xp, x.dt, flat_offset(x.shape, x.strides, x.ndim, r * C + i));
                    if (p <= 0.0)
                        continue;
                    double u = (double)(rng_u64(seed, (uint64_t)(r * C + i)) >> 11) * 0x1.0p-53;
                    double key = log(1.0 - u) / p;
                    bool after = key < prev || (key == prev && i > prev_i);
                    if (after && (pick < 0 || key > best)) {
                        best = key;
                        pick = i;
                    }
                }
                prev = best;
                prev_i = pick;
            }
            y[r * k + s] = pick;
        }
    }
}

extern "C" cudaError_t tdc_embedding_bag(const tdc_dev *d, int bw, const tdc_bag *g,
                                         const tdc_view *ix, const void *ixp, const tdc_view *off,
                                         const void *offp, const tdc_view *w, const void *wp,
                                         const tdc_view *psw, const void *pswp, const tdc_view *gy,
                                         const void *gyp, const tdc_view *y, void *yp, int *bad)
{
    int64_t n = g->B * w->shape[1];
    return with_flag(d, n, bad, [&](int *flag) {
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream, embedding_bag_kernel)(
            bw, *g, *ix, ixp, *off, offp, *w, wp, *psw, pswp, *gy, gyp, *y, yp, flag);
        return launched();
    });
}

extern "C" cudaError_t tdc_multinomial(const tdc_dev *d, const tdc_view *x, const void *xp,
                                       int64_t *y, int64_t R, int64_t C, int64_t k, int repl,
                                       uint64_t seed, int *bad)
{
    return with_flag(d, R, bad, [&](int *flag) {
        tdc_launch(grid_for(d, R), kThreads, 0, d->stream, multinomial_kernel)(*x, xp, y, R, C, k,
                                                                               repl, seed, flag);
        return launched();
    });
}

// max_pool2d_backward on dense [N, C, H, W]: a thread per input element sums the gradients of
// the windows whose maximum it is (the forward's choice, asked again), in the windows' order:
// the reference's order, so the sums round as its do. No atomics: deterministic.
template <typename T>
__global__ void max_pool_backward_kernel(__grid_constant__ const tdc_pool p, const T *go,
                                         const T *x, T *gx)
{
    int64_t n = p.N * p.C * p.H * p.W;
    for (int64_t e = gtid(); e < n; e += gstride()) {
        int64_t w = e % p.W, h = (e / p.W) % p.H, nc = e / (p.W * p.H);
        const T *xp = x + nc * p.H * p.W;
        const T *gp = go + nc * p.Ho * p.Wo;
        int64_t lo[2], hi[2], at = h * p.W + w, pos[2] = {h, w}, out[2] = {p.Ho, p.Wo};
        for (int k = 0; k < 2; k++) { // windows o with o * stride - pad <= pos <= that + span
            int64_t first = pos[k] + p.pad[k] - (p.k[k] - 1) * p.dil[k];
            lo[k] = first <= 0 ? 0 : (first + p.stride[k] - 1) / p.stride[k];
            hi[k] = (pos[k] + p.pad[k]) / p.stride[k];
            if (hi[k] > out[k] - 1)
                hi[k] = out[k] - 1;
        }
        T s = 0;
        for (int64_t oh = lo[0]; oh <= hi[0]; oh++) {
            int64_t h0 = oh * p.stride[0] - p.pad[0];
            if ((h - h0) % p.dil[0] != 0)
                continue;
            for (int64_t ow = lo[1]; ow <= hi[1]; ow++) {
                int64_t w0 = ow * p.stride[1] - p.pad[1];
                if ((w - w0) % p.dil[1] != 0)
                    continue;
                T best = (T)-INFINITY;
                int64_t arg = -1;
                for (int64_t i = 0; i < p.k[0]; i++)
                    for (int64_t j = 0; j < p.k[1]; j++) {
                        int64_t hh = h0 + i * p.dil[0], ww = w0 + j * p.dil[1];
                        if (hh < 0 || hh >= p.H || ww < 0 || ww >= p.W)
                            continue;
                        T v = xp[hh * p.W + ww];
                        if (arg < 0 || v > best || (v != v && best == best)) {
                            best = v;
                            arg = hh * p.W + ww;
                        }
                    }
                if (arg == at)
                    s += gp[oh * p.Wo + ow];
            }
        }
        gx[e] = s;
    }
}

extern "C" cudaError_t tdc_max_pool2d_backward(const tdc_dev *d, const tdc_pool *p, const void *go,
                                               const void *x, void *gx, int dt)
{
    int64_t n = p->N * p->C * p->H * p->W;
    if (n == 0)
        return cudaSuccess;
    if (dt == 2)
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream, max_pool_backward_kernel<double>)(
            *p, (const double *)go, (const double *)x, (double *)gx);
    else
        tdc_launch(grid_for(d, n), kThreads, 0, d->stream, max_pool_backward_kernel<float>)(
            *p, (const float *)go, (const float *)x, (float *)gx);
    return launched();
}

// pixel_shuffle / pixel_unshuffle: a thread per output element, its input element's bytes.
template <typename T>
__global__ void pixel_shuffle_kernel(int down, int64_t r, int64_t n, int64_t C, int64_t H,
                                     int64_t W, const T *x, T *y)
{
    for (int64_t e = gtid(); e < n; e += gstride()) {
        int64_t w = e % W, h = e / W % H, c = e / (W * H) % C, b = e / (W * H * C), ic, ih, iw;
        tdd_pixel_src(down, r, c, h, w, &ic, &ih, &iw);
        int64_t iC = down ? C / (r * r) : C * r * r, iH = down ? H * r : H / r,
                iW = down ? W * r : W / r;
        y[e] = x[((b * iC + ic) * iH + ih) * iW + iw];
    }
}

extern "C" cudaError_t tdc_pixel_shuffle(const tdc_dev *d, int down, int64_t r, int64_t B,
                                         int64_t C, int64_t H, int64_t W, const void *x, void *y,
                                         int es)
{
    int64_t n = B * C * H * W;
    if (n == 0)
        return cudaSuccess;
    int g = grid_for(d, n);
    if (es == 8)
        tdc_launch(g, kThreads, 0, d->stream, pixel_shuffle_kernel<uint64_t>)(
            down, r, n, C, H, W, (const uint64_t *)x, (uint64_t *)y);
    else if (es == 4)
        tdc_launch(g, kThreads, 0, d->stream, pixel_shuffle_kernel<uint32_t>)(
            down, r, n, C, H, W, (const uint32_t *)x, (uint32_t *)y);
    else if (es == 2)
        tdc_launch(g, kThreads, 0, d->stream, pixel_shuffle_kernel<uint16_t>)(
            down, r, n, C, H, W, (const uint16_t *)x, (uint16_t *)y);
    else
        tdc_launch(g, kThreads, 0, d->stream, pixel_shuffle_kernel<uint8_t>)(
            down, r, n, C, H, W, (const uint8_t *)x, (uint8_t *)y);
    return launched();
}
