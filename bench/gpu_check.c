/* gpu_check.c -- run on a GPU machine by bench/gpu_check.sh: compares every op the cuda
 * backend claims against ref:0 through a running daemon, then measures remote sgemm and
 * elementwise add on cuda:0 against a direct cuBLAS call and cudaMemcpy in this process.
 *
 *   gpu_check ENDPOINT [--quick]
 *
 * Exit status: 0 all compared ops agree, 1 some disagree, 2 no cuda:0 or no daemon. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The toolkit's headers test macros that C leaves undefined (-Wundef). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#pragma GCC diagnostic pop

#include "bench.h"
#include "tensordd.h"

/* ------------------------------------------------------------------ cases */

/* How an input's values are drawn: the op's domain, and ties for comparisons. */
enum { D_ANY, D_POS, D_BOOL, D_SMALLINT, D_NEAR1 };

typedef struct {
    int ndim;
    int64_t shape[4];
    td_dtype dt;
    int dist;
} in_spec;

typedef struct {
    const char *op;
    const char *label;
    int nin;
    in_spec in[3];
    int nattr;
    td_attr attr[4];
    double rtol;
    bool transpose0; /* pass input 0 through transpose(0, 1): strided kernels */
} check_case;

#define AI(nm, v)                                                                                  \
    {                                                                                              \
        .name = nm, .kind = TD_ATTR_INT, .i = v                                                    \
    }
#define AF(nm, v)                                                                                  \
    {                                                                                              \
        .name = nm, .kind = TD_ATTR_FLOAT, .f = v                                                  \
    }
#define AB(nm, v)                                                                                  \
    {                                                                                              \
        .name = nm, .kind = TD_ATTR_BOOL, .b = v                                                   \
    }
#define AS(nm, v)                                                                                  \
    {                                                                                              \
        .name = nm, .kind = TD_ATTR_STR, .s = v                                                    \
    }
#define AL2(nm, a, b)                                                                              \
    {                                                                                              \
        .name = nm, .kind = TD_ATTR_INTS, .ints = (const int64_t[]){a, b}, .n = 2                  \
    }
#define AL1(nm, a)                                                                                 \
    {                                                                                              \
        .name = nm, .kind = TD_ATTR_INTS, .ints = (const int64_t[]){a}, .n = 1                     \
    }

#define F(...)                                                                                     \
    {                                                                                              \
        (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}, TD_F32, D_ANY    \
    }
#define FD(d, ...)                                                                                 \
    {                                                                                              \
        (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}, TD_F32, d        \
    }
#define BOOL(...)                                                                                  \
    {                                                                                              \
        (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}, TD_BOOL, D_BOOL  \
    }

#define BIN(name)                                                                                  \
    {                                                                                              \
        name, name, 2, {F(64, 33), F(64, 33)}, 0, {{0}}, 1e-5, false                               \
    }
#define UN(name, dist)                                                                             \
    {                                                                                              \
        name, name, 1, {FD(dist, 97, 41)}, 0, {{0}}, 1e-4, false                                   \
    }
#define CMP(name)                                                                                  \
    {                                                                                              \
        name, name, 2, {FD(D_SMALLINT, 64, 33), FD(D_SMALLINT, 33)}, 0, {{0}}, 0, false            \
    }

static const check_case cases[] = {
    BIN("add"),
    BIN("sub"),
    BIN("mul"),
    BIN("maximum"),
    BIN("minimum"),
    {"add", "add bcast alpha", 2, {F(7, 64, 33), F(33)}, 1, {AF("alpha", 2.5)}, 1e-5, false},
    {"add", "add scalar", 1, {F(64, 33)}, 1, {AF("other", 1.5)}, 1e-5, false},
    {"sub", "sub strided", 2, {F(33, 64), F(64, 33)}, 0, {{0}}, 1e-5, true},
    {"div", "div", 2, {F(64, 33), FD(D_POS, 64, 33)}, 0, {{0}}, 1e-5, false},
    {"pow", "pow", 2, {FD(D_POS, 64, 33), F(64, 33)}, 0, {{0}}, 1e-4, false},
    {"remainder", "remainder", 2, {F(64, 33), FD(D_POS, 64, 33)}, 0, {{0}}, 1e-4, false},
    {"mul", "mul 1M", 2, {F(1024, 1024), F(1024, 1024)}, 0, {{0}}, 1e-6, false},
    CMP("eq"),
    CMP("ne"),
    CMP("lt"),
    CMP("le"),
    CMP("gt"),
    CMP("ge"),
    CMP("logical_and"),
    CMP("logical_or"),
    CMP("logical_xor"),
    {"relu_backward", "relu_backward", 2, {F(64, 33), F(64, 33)}, 0, {{0}}, 0, false},
    {"where", "where", 3, {BOOL(64, 1), F(64, 33), F(33)}, 0, {{0}}, 0, false},
    {"masked_fill", "masked_fill", 2, {F(64, 33), BOOL(33)}, 1, {AF("value", -7.0)}, 0, false},
    UN("neg", D_ANY),
    UN("abs", D_ANY),
    UN("sign", D_SMALLINT),
    UN("exp", D_ANY),
    UN("log", D_POS),
    UN("log1p", D_POS),
    UN("expm1", D_ANY),
    UN("sqrt", D_POS),
    UN("rsqrt", D_POS),
    UN("sin", D_ANY),
    UN("cos", D_ANY),
    UN("tanh", D_ANY),
    UN("sigmoid", D_ANY),
    UN("relu", D_ANY),
    UN("gelu", D_ANY),
    UN("silu", D_ANY),
    UN("floor", D_ANY),
    UN("ceil", D_ANY),
    UN("round", D_ANY),
    UN("reciprocal", D_POS),
    UN("square", D_ANY),
    UN("logical_not", D_SMALLINT),
    {"leaky_relu", "leaky_relu", 1, {F(97, 41)}, 1, {AF("negative_slope", 0.2)}, 1e-6, false},
    {"gelu", "gelu tanh", 1, {F(97, 41)}, 1, {AS("approximate", "tanh")}, 1e-4, false},
    {"softplus",
     "softplus",
     1,
     {F(97, 41)},
     2,
     {AF("beta", 2.0), AF("threshold", 3.0)},
     1e-4,
     false},
    {"clamp", "clamp", 1, {F(97, 41)}, 2, {AF("min", -0.5), AF("max", 0.75)}, 0, false},
    {"exp", "exp strided", 1, {F(41, 97)}, 0, {{0}}, 1e-5, true},
    {"sum", "sum all", 1, {F(300, 77)}, 0, {{0}}, 1e-4, false},
    {"sum", "sum 4M (split)", 1, {F(4194304)}, 0, {{0}}, 1e-3, false},
    {"sum", "sum dim1", 1, {F(300, 77)}, 1, {AI("dim", 1)}, 1e-4, false},
    {"sum", "sum dim0 (column)", 1, {F(4096, 1100)}, 1, {AI("dim", 0)}, 1e-4, false},
    {"sum", "sum strided", 1, {F(77, 300)}, 1, {AI("dim", 1)}, 1e-4, true},
    {"mean",
     "mean dims02 keep",
     1,
     {F(8, 30, 17)},
     2,
     {AL2("dim", 0, 2), AB("keepdim", 1)},
     1e-4,
     false},
    {"amax", "amax dim1", 1, {F(300, 77)}, 1, {AI("dim", 1)}, 0, false},
    {"amin", "amin all", 1, {F(300, 77)}, 0, {{0}}, 0, false},
    {"prod", "prod dim1", 1, {FD(D_NEAR1, 300, 77)}, 1, {AI("dim", 1)}, 1e-4, false},
    {"var", "var dim1", 1, {F(300, 77)}, 1, {AI("dim", 1)}, 1e-4, false},
    {"std", "std all", 1, {F(300, 77)}, 0, {{0}}, 1e-4, false},
    {"logsumexp", "logsumexp dim1", 1, {F(300, 77)}, 1, {AI("dim", 1)}, 1e-5, false},
    {"argmax", "argmax dim1", 1, {F(300, 77)}, 1, {AI("dim", 1)}, 0, false},
    {"argmin", "argmin all", 1, {F(300, 77)}, 0, {{0}}, 0, false},
    {"sum_to", "sum_to", 1, {F(6, 40, 33)}, 1, {AL2("shape", 1, 33)}, 1e-4, false},
    {"cumsum", "cumsum dim1", 1, {F(50, 300)}, 1, {AI("dim", 1)}, 1e-4, false},
    {"cumsum", "cumsum dim0", 1, {F(50, 300)}, 1, {AI("dim", 0)}, 1e-4, false},
    {"softmax", "softmax dim-1", 1, {F(64, 1000)}, 1, {AI("dim", -1)}, 1e-5, false},
    {"softmax", "softmax dim0", 1, {F(64, 30)}, 1, {AI("dim", 0)}, 1e-5, false},
    {"log_softmax", "log_softmax dim1", 1, {F(64, 10)}, 1, {AI("dim", 1)}, 1e-5, false},
    {"matmul", "matmul 2d", 2, {F(128, 64), F(64, 96)}, 0, {{0}}, 1e-4, false},
    {"matmul", "matmul a^T", 2, {F(64, 128), F(64, 96)}, 0, {{0}}, 1e-4, true},
    {"matmul", "matmul batch bcast", 2, {F(3, 1, 32, 16), F(4, 16, 8)}, 0, {{0}}, 1e-4, false},
    {"matmul", "matmul 1d@2d", 2, {F(16), F(16, 8)}, 0, {{0}}, 1e-4, false},
    {"bmm", "bmm", 2, {F(5, 32, 16), F(5, 16, 24)}, 0, {{0}}, 1e-4, false},
    {"linear", "linear bias", 3, {F(10, 32), F(20, 32), F(20)}, 0, {{0}}, 1e-4, false},
    {"contiguous", "contiguous of ^T", 1, {F(30, 20)}, 0, {{0}}, 0, true},
    {"clone", "clone", 1, {F(30, 20)}, 0, {{0}}, 0, false},
    {"reshape", "reshape of ^T", 1, {F(30, 20)}, 1, {AL2("shape", 600, 1)}, 0, true},
    {"cat", "cat dim1", 3, {F(30, 2), F(30, 7), F(30, 1)}, 1, {AI("dim", 1)}, 0, false},
    {"stack", "stack dim1", 2, {F(30, 20), F(30, 20)}, 1, {AI("dim", 1)}, 0, false},
    {"pad",
     "pad (crop + grow)",
     1,
     {F(30, 20)},
     2,
     {AL2("pad", -2, 3), AF("value", 9.0)},
     0,
     false},
    {"tril", "tril", 1, {F(30, 20)}, 1, {AI("diagonal", -1)}, 0, true},
    {"triu", "triu", 1, {F(4, 30, 20)}, 1, {AI("diagonal", 2)}, 0, false},
    {"full", "full", 0, {{0}}, 2, {AL2("shape", 5, 7), AF("value", 3.25)}, 0, false},
    {"zeros", "zeros", 0, {{0}}, 1, {AL1("shape", 9)}, 0, false},
    {"ones", "ones", 0, {{0}}, 1, {AL2("shape", 2, 3)}, 0, false},
    {"arange",
     "arange",
     0,
     {{0}},
     3,
     {AF("start", 1.0), AF("end", 10.0), AF("step", 0.5)},
     0,
     false},
    {"linspace",
     "linspace",
     0,
     {{0}},
     3,
     {AF("start", -1.0), AF("end", 1.0), AI("steps", 17)},
     1e-6,
     false},
    {"eye", "eye", 0, {{0}}, 2, {AI("n", 5), AI("m", 7)}, 0, false},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* Casts get a dtype rather than attributes. */
typedef struct {
    td_dtype from, to;
} cast_case;
static const cast_case casts[] = {{TD_F32, TD_I32},  {TD_F32, TD_I64},  {TD_F32, TD_F16},
                                  {TD_F32, TD_BF16}, {TD_F32, TD_BOOL}, {TD_F32, TD_F64}};

/* ------------------------------------------------------------------ helpers */

static uint64_t rng = 0x9e3779b97f4a7c15u;

static double urand(void)
{
    rng = rng * 6364136223846793005u + 1442695040888963407u;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static float draw(int dist)
{
    switch (dist) {
    case D_POS:
        return (float)(0.1 + 1.9 * urand());
    case D_SMALLINT:
        return (float)((int)(urand() * 5.0) - 2);
    case D_NEAR1:
        return (float)(0.9 + 0.2 * urand());
    default:
        return (float)(4.0 * urand() - 2.0);
    }
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

static td_device dev_ref, dev_cuda, dev_cpu;

/* A downloaded result. */
typedef struct {
    td_tensor_info info;
    void *data;
    size_t bytes;
} result;

/* Fetches h (any device) to the host: cuda tensors go through cpu:0, which works whether or
 * not the daemon downloads from device memory directly. */
static int fetch(td_client *c, td_handle h, bool on_gpu, result *r, td_error *err)
{
    td_handle src = h;
    int rc;
    if (on_gpu && (rc = td_to_device(c, h, &dev_cpu, &src, err)))
        return rc;
    if ((rc = td_describe(c, src, &r->info, err)))
        return rc;
    r->bytes = (size_t)numel_of(r->info.ndim, r->info.shape) * td_dtype_size(r->info.dtype);
    r->data = malloc(r->bytes ? r->bytes : 1);
    rc = td_download(c, src, r->data, r->bytes, &r->info, err);
    if (on_gpu)
        td_release(c, &src, 1, NULL);
    return rc;
}

/* Runs one case on dev (inputs uploaded to ref:0 and copied over); *r gets the output. */
static int run_on(td_client *c, const check_case *k, td_dtype cast_to, const td_device *dev,
                  void *const *host, result *r, td_error *err)
{
    td_handle in[3] = {0}, tmp[6];
    int ntmp = 0, rc = 0;
    bool gpu = dev == &dev_cuda;
    for (int i = 0; i < k->nin && !rc; i++) {
        const in_spec *s = &k->in[i];
        rc = td_upload(c, &dev_ref, s->dt, s->ndim, s->shape, host[i], 0, &in[i], err);
        if (!rc)
            tmp[ntmp++] = in[i];
        if (!rc && gpu) {
            rc = td_to_device(c, in[i], &dev_cuda, &in[i], err);
            if (!rc)
                tmp[ntmp++] = in[i];
        }
    }
    if (!rc && k->transpose0) {
        td_attr ta[2] = {td_attr_int("dim0", 0), td_attr_int("dim1", 1)};
        td_op_opts to = {.attrs = ta, .nattrs = 2};
        rc = td_op(c, "transpose", &in[0], 1, &to, &in[0], 1, err);
        if (!rc)
            tmp[ntmp++] = in[0];
    }
    td_handle out = 0;
    if (!rc) {
        /* only creation ops take a device; the others run where their inputs live */
        td_op_opts o = {.device = k->nin ? NULL : dev,
                        .dtype = cast_to,
                        .attrs = k->attr,
                        .nattrs = (size_t)k->nattr};
        rc = td_op(c, k->op, in, (size_t)k->nin, &o, &out, 1, err);
    }
    if (!rc)
        rc = td_sync(c, err);
    if (!rc)
        rc = fetch(c, out, gpu, r, err);
    if (out)
        td_release(c, &out, 1, NULL);
    td_release(c, tmp, (size_t)ntmp, NULL);
    if (rc)
        td_sync(c, NULL); /* drain the session's error so the next case starts clean */
    return rc;
}

/* Largest |g - r| / (atol + rtol |r|) over f32 outputs; bytes must match exactly otherwise. */
static int compare(const result *g, const result *r, double rtol, char *why, size_t len)
{
    if (g->info.dtype != r->info.dtype || g->info.ndim != r->info.ndim ||
        memcmp(g->info.shape, r->info.shape, (size_t)g->info.ndim * sizeof(int64_t)) != 0) {
        snprintf(why, len, "dtype/shape differ (%s vs %s)", td_dtype_name(g->info.dtype),
                 td_dtype_name(r->info.dtype));
        return -1;
    }
    if (g->info.dtype != TD_F32) {
        if (memcmp(g->data, r->data, g->bytes) == 0)
            return 0;
        snprintf(why, len, "%s bytes differ", td_dtype_name(g->info.dtype));
        return -1;
    }
    const float *a = g->data, *b = r->data;
    size_t n = g->bytes / sizeof(float), worst = 0;
    double worst_q = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) && isnan(b[i]))
            continue;
        double q = fabs((double)a[i] - (double)b[i]) / (1e-6 + rtol * fabs((double)b[i]));
        if (isnan(a[i]) != isnan(b[i]) || q > worst_q) {
            worst_q = isnan(a[i]) != isnan(b[i]) ? INFINITY : q;
            worst = i;
        }
    }
    if (worst_q <= 1.0)
        return 0;
    snprintf(why, len, "element %zu: cuda %.9g vs ref %.9g", worst, (double)a[worst],
             (double)b[worst]);
    return -1;
}

static int n_ok, n_fail, n_skip;

static void check_one(td_client *c, const check_case *k, td_dtype cast_to, const char *label)
{
    void *host[3] = {0};
    for (int i = 0; i < k->nin; i++) {
        const in_spec *s = &k->in[i];
        int64_t n = numel_of(s->ndim, s->shape);
        if (s->dt == TD_BOOL) {
            uint8_t *p = malloc((size_t)n + 1);
            for (int64_t j = 0; j < n; j++)
                p[j] = urand() < 0.5;
            host[i] = p;
        } else {
            float *p = malloc((size_t)n * sizeof(float) + 1);
            for (int64_t j = 0; j < n; j++)
                p[j] = draw(s->dist);
            host[i] = p;
        }
    }
    result rr = {0}, gr = {0};
    td_error err;
    char why[200] = "";
    int rc = run_on(c, k, cast_to, &dev_ref, host, &rr, &err);
    if (rc) {
        printf("  %-24s skip  ref: %s (%s)\n", label, td_err_name(rc), err.message);
        n_skip++;
    } else if ((rc = run_on(c, k, cast_to, &dev_cuda, host, &gr, &err))) {
        bool lacks = rc == TD_EUNSUPPORTED_OP || rc == TD_EUNSUPPORTED_DTYPE;
        printf("  %-24s %s  cuda: %s (%s)\n", label, lacks ? "skip" : "FAIL", td_err_name(rc),
               err.message);
        if (lacks)
            n_skip++;
        else
            n_fail++;
    } else if (compare(&gr, &rr, k->rtol, why, sizeof why)) {
        printf("  %-24s FAIL  %s\n", label, why);
        n_fail++;
    } else {
        printf("  %-24s ok\n", label);
        n_ok++;
    }
    free(rr.data);
    free(gr.data);
    for (int i = 0; i < k->nin; i++)
        free(host[i]);
}

/* ------------------------------------------------------------------ benchmarks */

#define CUDA_OK(x)                                                                                 \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                               \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* Waits until everything before it on cuda:0 has run: a reduction of h copied to the host
 * depends on h, and the copy synchronises the device's stream. */
static int fence(td_client *c, td_handle h, td_error *err)
{
    td_handle s = td_op1(c, "sum", &h, 1, NULL, err);
    if (!s)
        return err->code ? err->code : TD_EINTERNAL;
    result r = {0};
    int rc = fetch(c, s, true, &r, err);
    free(r.data);
    td_release(c, &s, 1, NULL);
    return rc;
}

static td_handle upload_gpu(td_client *c, int64_t rows, int64_t cols, const float *data,
                            td_error *err)
{
    int64_t shape[2] = {rows, cols};
    td_handle h, g;
    if (td_upload(c, &dev_cpu, TD_F32, 2, shape, data, 0, &h, err) ||
        td_to_device(c, h, &dev_cuda, &g, err))
        return 0;
    td_release(c, &h, 1, NULL);
    return g;
}

/* n x n sgemm: remote (matmul on cuda:0) vs cuBLAS here; blocks of reps, medians. */
static void bench_sgemm(td_client *c, int n, int blocks, int reps)
{
    size_t nn = (size_t)n * (size_t)n;
    float *h = malloc(nn * sizeof(float));
    for (size_t i = 0; i < nn; i++)
        h[i] = draw(D_ANY);
    double flop = 2.0 * (double)n * (double)n * (double)n * reps;
    double remote[16], direct[16];

    /* direct */
    float *dA, *dB, *dC;
    CUDA_OK(cudaMalloc((void **)&dA, nn * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&dB, nn * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&dC, nn * sizeof(float)));
    CUDA_OK(cudaMemcpy(dA, h, nn * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dB, h, nn * sizeof(float), cudaMemcpyHostToDevice));
    cublasHandle_t blas;
    if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        exit(2);
    }
    const float one = 1.0f, zero = 0.0f;
    for (int b = -1; b < blocks; b++) { /* block -1 warms up */
        double t0 = bench_now();
        for (int r = 0; r < reps; r++)
            cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, dB, n, dA, n, &zero, dC, n);
        CUDA_OK(cudaDeviceSynchronize());
        if (b >= 0)
            direct[b] = flop / (bench_now() - t0) * 1e-9;
    }
    cublasDestroy(blas);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);

    /* remote */
    td_error err;
    td_handle A = upload_gpu(c, n, n, h, &err), B = A ? upload_gpu(c, n, n, h, &err) : 0;
    td_handle ab[2] = {A, B};
    if (!A || !B || td_sync(c, &err)) {
        printf("  sgemm %d: remote setup failed: %s\n", n, err.message);
        free(h);
        return;
    }
    for (int b = -1; b < blocks; b++) {
        double t0 = bench_now();
        td_handle last = 0;
        for (int r = 0; r < reps; r++) {
            td_handle y = td_op1(c, "matmul", ab, 2, NULL, &err);
            if (last)
                td_release(c, &last, 1, NULL);
            last = y;
        }
        int rc = fence(c, last, &err);
        td_release(c, &last, 1, NULL);
        if (rc) {
            printf("  sgemm %d: remote failed: %s\n", n, err.message);
            free(h);
            return;
        }
        if (b >= 0)
            remote[b] = flop / (bench_now() - t0) * 1e-9;
    }
    td_release(c, ab, 2, NULL);
    double rm = bench_median(remote, blocks), dm = bench_median(direct, blocks);
    printf("  sgemm %dx%d: remote %.0f GFLOP/s, direct cuBLAS %.0f GFLOP/s, ratio %.3f "
           "(target >= 0.9)\n",
           n, n, rm, dm, rm / dm);
    free(h);
}

/* add of two n-element f32 tensors on cuda:0 (3 n floats moved) vs cudaMemcpy D2D (2 n). */
static void bench_add(td_client *c, int64_t n, int blocks, int reps)
{
    double remote[16], direct[16];
    size_t bytes = (size_t)n * sizeof(float);
    void *dx, *dy;
    CUDA_OK(cudaMalloc(&dx, bytes));
    CUDA_OK(cudaMalloc(&dy, bytes));
    CUDA_OK(cudaMemset(dx, 0, bytes));
    for (int b = -1; b < blocks; b++) {
        double t0 = bench_now();
        for (int r = 0; r < reps; r++)
            CUDA_OK(cudaMemcpy(dy, dx, bytes, cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaDeviceSynchronize());
        if (b >= 0)
            direct[b] = 2.0 * (double)bytes * reps / (bench_now() - t0) * 1e-9;
    }
    cudaFree(dx);
    cudaFree(dy);

    td_error err;
    td_attr fa[2] = {td_attr_ints("shape", &n, 1), td_attr_float("value", 1.0)};
    td_op_opts fo = {.device = &dev_cuda, .attrs = fa, .nattrs = 2};
    td_handle ab[2];
    ab[0] = td_op1(c, "full", NULL, 0, &fo, &err);
    fa[1] = td_attr_float("value", 2.0);
    ab[1] = td_op1(c, "full", NULL, 0, &fo, &err);
    if (!ab[0] || !ab[1] || td_sync(c, &err)) {
        printf("  add: remote setup failed: %s\n", err.message);
        return;
    }
    for (int b = -1; b < blocks; b++) {
        double t0 = bench_now();
        td_handle last = 0;
        for (int r = 0; r < reps; r++) {
            td_handle y = td_op1(c, "add", ab, 2, NULL, &err);
            if (last)
                td_release(c, &last, 1, NULL);
            last = y;
        }
        int rc = fence(c, last, &err);
        td_release(c, &last, 1, NULL);
        if (rc) {
            printf("  add: remote failed: %s\n", err.message);
            return;
        }
        if (b >= 0)
            remote[b] = 3.0 * (double)bytes * reps / (bench_now() - t0) * 1e-9;
    }
    td_release(c, ab, 2, NULL);
    double rm = bench_median(remote, blocks), dm = bench_median(direct, blocks);
    printf("  add %lld f32: remote %.0f GB/s, cudaMemcpy D2D %.0f GB/s, ratio %.3f "
           "(target: >= 80%% of HBM bandwidth)\n",
           (long long)n, rm, dm, rm / dm);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: gpu_check ENDPOINT [--quick]\n");
        return 2;
    }
    bool quick = argc > 2 && strcmp(argv[2], "--quick") == 0;
    td_device_parse("ref:0", &dev_ref);
    td_device_parse("cuda:0", &dev_cuda);
    td_device_parse("cpu:0", &dev_cpu);
    td_client *c;
    td_error err;
    if (td_connect(argv[1], NULL, &c, &err)) {
        fprintf(stderr, "gpu_check: connect %s: %s\n", argv[1], err.message);
        return 2;
    }
    td_device_info devs[16];
    size_t nd = 0;
    bool have_cuda = false;
    if (td_list_devices(c, devs, 16, &nd, &err) == 0)
        for (size_t i = 0; i < nd && i < 16; i++) {
            char b[32];
            td_device_format(&devs[i].device, b, sizeof b);
            printf("device %s: %s\n", b, devs[i].name);
            have_cuda |= strcmp(b, "cuda:0") == 0;
        }
    if (!have_cuda) {
        printf("gpu_check: the daemon serves no cuda:0 (%s)\n", td_server_note(c));
        td_close(c);
        return 2;
    }

    printf("correctness, cuda:0 vs ref:0:\n");
    for (size_t i = 0; i < NCASES; i++)
        check_one(c, &cases[i], TD_DTYPE_INVALID, cases[i].label);
    for (size_t i = 0; i < sizeof casts / sizeof casts[0]; i++) {
        check_case k = {"cast", "cast", 1, {F(97, 41)}, 0, {{0}}, 0, false};
        k.in[0].dt = casts[i].from;
        char label[48];
        snprintf(label, sizeof label, "cast %s->%s", td_dtype_name(casts[i].from),
                 td_dtype_name(casts[i].to));
        check_one(c, &k, casts[i].to, label);
    }
    printf("  %d ok, %d FAIL, %d skipped\n", n_ok, n_fail, n_skip);

    printf("performance (medians of blocks):\n");
    int blocks = quick ? 3 : 7;
    bench_sgemm(c, 4096, blocks, quick ? 5 : 20);
    bench_add(c, (int64_t)1 << 26, blocks, quick ? 10 : 50);
    td_close(c);
    return n_fail ? 1 : 0;
}
