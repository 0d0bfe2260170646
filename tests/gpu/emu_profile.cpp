// emu_profile.cpp -- the CUDA emulator's per-launch profile (TDD_EMU_PROFILE, runtime.cpp)
// held to counts worked out by hand for small kernels compiled as kernels.cu is
// (instrumented): a contiguous f32 add of n elements reads 8n and writes 4n bytes in as few
// 32-byte sectors as hold them (100% coalesced); a read at a 128-byte stride takes a sector
// per lane (4 of 32 needed: 12.5%); a broadcast read is one sector; shared-memory words at
// a stride of 2 and of 32 words take 2 and 32 wavefronts (bank conflicts) where one would
// do; TDC_FLOPS-style counts and a cuBLAS GEMM's 2mnk FLOPs land in the record. Built and
// run by `make test-emu`.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "emu/emu_cublas.h"

#include "emu_check.h"

__global__ void add(const float *a, const float *b, float *y, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        y[i] = a[i] + b[i];
}

// float4 at a time (the host compiler may load the fields one by one: a GPU loads 16 bytes).
__global__ void add4(const float4 *a, const float4 *b, float4 *y, int n4)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n4) {
        float4 x = a[i], w = b[i];
        y[i] = make_float4(x.x + w.x, x.y + w.y, x.z + w.z, x.w + w.w);
    }
}

// Thread i reads x[i * stride].
__global__ void gather_strided(const float *x, float *y, int n, int stride)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        y[i] = x[(size_t)i * stride];
}

__global__ void broadcast(const float *x, float *y)
{
    y[threadIdx.x] = x[0];
}

// One warp: each lane stores and loads the shared word at lane * stride.
__global__ void shared_stride(int *out, int stride)
{
    __shared__ int s[32 * 32];
    int t = (int)threadIdx.x;
    s[t * stride] = t;
    __syncthreads();
    out[t] = s[t * stride];
}

__global__ void count_flops(float *y)
{
    tdc_emu::flops(3);
    y[threadIdx.x] = 0.0f;
}

// The field key of the JSON line rec (0 when absent).
static unsigned long long field(const std::string &rec, const char *key)
{
    std::string k = std::string("\"") + key + "\": ";
    size_t at = rec.find(k);
    return at == std::string::npos ? 0 : strtoull(rec.c_str() + at + k.size(), nullptr, 10);
}

// The profile's lines so far, for the kernel named name (its last launch).
static std::string record(const char *path, const char *name)
{
    FILE *f = fopen(path, "r");
    std::string last;
    char line[4096];
    std::string want = std::string("\"kernel\": \"") + name + "\"";
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, want.c_str()))
            last = line;
    if (f)
        fclose(f);
    return last;
}

int main()
{
    char path[] = "/tmp/emu_profile_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return 2;
    close(fd);
    setenv("TDD_EMU_PROFILE", path, 1);
    tdc_emu_configure(1, 64ull << 20);
    cudaSetDevice(0);

    // ---- f32 add of n = 1000: 31 full warps (4 sectors each) and one of 8 lanes (1 sector)
    const int n = 1000;
    float *a, *b, *y;
    CHECK(cudaMalloc((void **)&a, n * sizeof(float)) == cudaSuccess, "malloc");
    cudaMalloc((void **)&b, n * sizeof(float));
    cudaMalloc((void **)&y, 32 * n * sizeof(float));
    cudaMemset(a, 0, n * sizeof(float));
    cudaMemset(b, 0, n * sizeof(float));
    tdc_launch(4, 256, 0, nullptr, add)(a, b, y, n);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "add");
    std::string r = record(path, "add");
    CHECK(!r.empty(), "no record for add in %s", path);
    CHECK(field(r, "read_bytes") == 8ull * n && field(r, "write_bytes") == 4ull * n, "%s",
          r.c_str());
    CHECK(field(r, "read_unique") == 8ull * n && field(r, "write_unique") == 4ull * n, "%s",
          r.c_str());
    CHECK(field(r, "read_sectors") == 2 * (31 * 4 + 1) && field(r, "write_sectors") == 31 * 4 + 1,
          "%s", r.c_str());
    CHECK(field(r, "read_ideal_sectors") == field(r, "read_sectors") &&
              field(r, "write_ideal_sectors") == field(r, "write_sectors"),
          "%s", r.c_str());
    CHECK(field(r, "read_requests") == 2 * 32 && field(r, "write_requests") == 32, "%s", r.c_str());
    CHECK(field(r, "flops") == 0 && field(r, "shared_requests") == 0, "%s", r.c_str());

    // ---- the same on allocations of 1004 floats (4016 bytes: the emulator's start is 16
    // bytes off a sector), counted as at cudaMalloc's 256-byte alignment
    float *a2, *b2;
    cudaMalloc((void **)&a2, 1004 * sizeof(float));
    cudaMalloc((void **)&b2, 1004 * sizeof(float));
    cudaMemset(a2, 0, 1004 * sizeof(float));
    cudaMemset(b2, 0, 1004 * sizeof(float));
    tdc_launch(4, 256, 0, nullptr, add)(a2, b2, y, n);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "add");
    r = record(path, "add");
    CHECK(field(r, "read_sectors") == 2 * (31 * 4 + 1) &&
              field(r, "read_ideal_sectors") == field(r, "read_sectors"),
          "%s", r.c_str());

    // ---- the same as float4: 250 lanes, 8 requests (7 warps of 512 bytes, one of 416) each
    tdc_launch(1, 256, 0, nullptr, add4)((const float4 *)a, (const float4 *)b, (float4 *)y, 250);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "add4");
    r = record(path, "add4");
    CHECK(field(r, "read_bytes") == 8ull * n && field(r, "write_bytes") == 4ull * n, "%s",
          r.c_str());
    CHECK(field(r, "read_sectors") == 250 && field(r, "read_ideal_sectors") == 250 &&
              field(r, "write_sectors") == 125 && field(r, "write_ideal_sectors") == 125,
          "%s", r.c_str());
    CHECK(field(r, "read_requests") == 2 * 8 && field(r, "write_requests") == 8, "%s", r.c_str());

    // ---- every 32nd float of a (128 bytes apart): a sector per lane, 4 would hold the bytes
    float *x;
    cudaMalloc((void **)&x, 32 * 64 * sizeof(float));
    cudaMemset(x, 0, 32 * 64 * sizeof(float));
    tdc_launch(1, 64, 0, nullptr, gather_strided)(x, y, 64, 32);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "gather");
    r = record(path, "gather_strided");
    CHECK(field(r, "read_bytes") == 64 * 4 && field(r, "read_sectors") == 64 &&
              field(r, "read_ideal_sectors") == 8 && field(r, "read_unique") == 64 * 4,
          "%s", r.c_str());
    CHECK(field(r, "write_sectors") == 8 && field(r, "write_ideal_sectors") == 8, "%s", r.c_str());

    // ---- 64 threads reading one float: 2 requests of 1 sector, 4 distinct bytes
    tdc_launch(1, 64, 0, nullptr, broadcast)(x, y);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "broadcast");
    r = record(path, "broadcast");
    CHECK(field(r, "read_bytes") == 64 * 4 && field(r, "read_sectors") == 2 &&
              field(r, "read_ideal_sectors") == 2 && field(r, "read_unique") == 4,
          "%s", r.c_str());

    // ---- shared memory: stride 1 (no conflict), 2 (2-way), 32 (32-way); a store and a load
    int *o;
    cudaMalloc((void **)&o, 32 * sizeof(int));
    const int strides[3] = {1, 2, 32};
    for (int stride : strides) {
        tdc_launch(1, 32, 0, nullptr, shared_stride)(o, stride);
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "shared");
        r = record(path, "shared_stride");
        CHECK(field(r, "shared_requests") == 2 && field(r, "shared_bytes") == 2 * 32 * 4 &&
                  field(r, "shared_wavefronts") == 2ull * (unsigned)stride &&
                  field(r, "shared_ideal_wavefronts") == 2,
              "stride %d: %s", stride, r.c_str());
        CHECK(field(r, "write_bytes") == 32 * 4 && field(r, "read_bytes") == 0, "%s", r.c_str());
    }

    // ---- FLOPs a kernel counts: 3 by each of 2 x 32 threads
    tdc_launch(2, 32, 0, nullptr, count_flops)(y);
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "flops");
    r = record(path, "count_flops");
    CHECK(field(r, "flops") == 3 * 64, "%s", r.c_str());

    // ---- a GEMM (cuBLAS on the host): 2mnk FLOPs, its operands' bytes
    cublasHandle_t h;
    CHECK(tdc_emu_cublas_create(&h) == CUBLAS_STATUS_SUCCESS, "cublas");
    float one = 1.0f, zero = 0.0f;
    int m = 8, nn = 4, k = 16;
    CHECK(tdc_emu_cublas_sgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, nn, k, &one, x, m, x, k, &zero, y,
                               m) == CUBLAS_STATUS_SUCCESS,
          "sgemm");
    cudaDeviceSynchronize();
    r = record(path, "cublasSgemm");
    CHECK(field(r, "flops") == 2ull * m * nn * k &&
              field(r, "read_bytes") == 4ull * (m * k + k * nn) &&
              field(r, "write_bytes") == 4ull * m * nn,
          "%s", r.c_str());
    tdc_emu_cublas_destroy(h);

    unlink(path);
    printf("emu_profile: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
