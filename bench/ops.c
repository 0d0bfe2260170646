/* ops.c -- op throughput against the physical baselines, in one run:
 *   - cpu backend add and sum over 64 MiB, as a fraction of memcpy bandwidth
 *     measured in the same process (add moves 3 buffers' worth, sum 1);
 *   - cat of two 32 MiB f32 tensors along dim 0 and dim 1 and tril of a 4096^2 f32,
 *     cpu backend against the ref backend (the single-threaded kernel cpu ran before
 *     it had its own), as fractions of memcpy (all count bytes read + written);
 *   - 2048^2 sgemm through the daemon (upload once, matmul, sync) against a
 *     direct OpenBLAS call in this process;
 *   - pipelined relu(4) (fire-and-forget, released in batches as it goes, one sync at
 *     the end) in a fresh session and in one holding 200k live tensors, in ops/s
 *     against the 1M ops/s target (issue 11): the handle table at scale.
 *
 *   - 1024^2 sgemm the same way (issue 11's table row).
 * RESULT lines (bench/summary.py): sgemm.N (daemon time / local time), c.pipelined and
 * c.pipelined_200k (ops/s).
 *
 *   bench/ops ENDPOINT [pipelined] [--quick]   (a running tensordd; cpu:0 is used;
 *       `pipelined`: only the pipelined rows; --quick: one repetition of the sgemm and
 *       pipelined rows, fewer ops, no in-process cpu/ref rows: a smoke run)
 * Blocks of repetitions separated by idle gaps, medians reported: OpenBLAS
 * threads spin after a call and would steal the other core from the daemon. */
#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "bench.h"
#include "tensordd.h"

#define REPS 9
#define PAR 2 /* threads for the parallel memcpy baseline (the cpu backend's count here) */

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} copy_part;

static void *copy_part_run(void *arg)
{
    copy_part *p = arg;
    memcpy(p->dst, p->src, p->n);
    return NULL;
}

/* memcpy split over PAR threads: the machine's copy bandwidth with every core on it. */
static void par_memcpy(void *dst, const void *src, size_t n)
{
    pthread_t th[PAR];
    copy_part parts[PAR];
    size_t chunk = (n / PAR + 63) & ~(size_t)63;
    for (int i = 0; i < PAR; i++) {
        size_t lo = (size_t)i * chunk < n ? (size_t)i * chunk : n;
        size_t hi = lo + chunk < n ? lo + chunk : n;
        parts[i] = (copy_part){(char *)dst + lo, (const char *)src + lo, hi - lo};
        pthread_create(&th[i], NULL, copy_part_run, &parts[i]);
    }
    for (int i = 0; i < PAR; i++)
        pthread_join(th[i], NULL);
}

static tdd_storage *host_storage(size_t nbytes)
{
    tdd_storage *st = calloc(1, sizeof *st);
    if (posix_memalign(&st->data, 64, nbytes))
        exit(1);
    memset(st->data, 1, nbytes);
    st->nbytes = nbytes;
    atomic_init(&st->refs, 1);
    return st;
}

static void vec(tdd_tensor *t, tdd_storage *st, int64_t n)
{
    memset(t, 0, sizeof *t);
    t->dtype = TD_F32;
    t->ndim = 1;
    t->shape[0] = n;
    t->strides[0] = 1;
    t->st = st;
}

/* Prepares a call of op name on in[0..n_in) with attrs (exits when it cannot);
 * od[0] describes the output, which the caller provides in call->out[0]. */
static void prepare(const char *name, const tdd_tensor *const *in, int n_in, const td_attr *attrs,
                    size_t nattrs, tdd_opargs *args, tdd_outdesc *od, tdd_opcall *call)
{
    const tdd_opdef *def = tdd_op_find(name);
    tdd_opreq req = {.attrs = {attrs, nattrs}};
    int n_out = 0;
    td_error err;
    if (!def || tdd_op_prepare(def->op, in, n_in, &req, INT64_MAX, args, od, &n_out, &err)) {
        fprintf(stderr, "bench: %s: cannot prepare\n", name);
        exit(1);
    }
    *call = (tdd_opcall){.op = def->op, .args = args, .n_in = n_in, .n_out = 1};
    for (int k = 0; k < n_in; k++)
        call->in[k] = in[k];
}

/* Seconds for one execution of call on backend be (median of reps, at most REPS). */
static double time_call(const tdd_backend *be, void *ctx, const tdd_opcall *call, int reps)
{
    double t[REPS];
    if (reps > REPS)
        reps = REPS;
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        if (be->execute(ctx, 0, call))
            exit(1);
        t[r] = bench_now() - t0;
    }
    return bench_median(t, reps);
}

/* Seconds for one call of op on the cpu backend (median of REPS). */
static double time_op(void *ctx, const char *name, tdd_tensor *a, tdd_tensor *b, tdd_tensor *out)
{
    const tdd_tensor *in[2] = {a, b};
    tdd_opargs args;
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    tdd_opcall call;
    prepare(name, in, b ? 2 : 1, NULL, 0, &args, od, &call);
    call.out[0] = out;
    return time_call(&tdd_backend_cpu, ctx, &call, REPS);
}

static void bench_elementwise(void)
{
    tdd_backend_config cfg = {.cpu_devices = 1};
    void *ctx;
    char why[128];
    tdd_backend_cpu.init(&cfg, &ctx, why, sizeof why);
    size_t nbytes = 64u << 20;
    int64_t n = (int64_t)(nbytes / 4);
    tdd_storage *sa = host_storage(nbytes), *sb = host_storage(nbytes), *so = host_storage(nbytes);
    tdd_storage *ss = host_storage(64);
    tdd_tensor a, b, o, s;
    vec(&a, sa, n);
    vec(&b, sb, n);
    vec(&o, so, n);
    memset(&s, 0, sizeof s);
    s.dtype = TD_F32;
    s.st = ss;

    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        memcpy(so->data, sa->data, nbytes);
        t[r] = bench_now() - t0;
    }
    double memcpy_bw = 2.0 * (double)nbytes / bench_median(t, REPS); /* read + write */
    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        par_memcpy(so->data, sa->data, nbytes);
        t[r] = bench_now() - t0;
    }
    double pmemcpy_bw = 2.0 * (double)nbytes / bench_median(t, REPS);
    double add_bw = 3.0 * (double)nbytes / time_op(ctx, "add", &a, &b, &o);
    double sum_bw = (double)nbytes / time_op(ctx, "sum", &a, NULL, &s);
    printf("cpu backend, 64 MiB f32 (median of %d)\n", REPS);
    printf("  memcpy, 1 thread      %6.2f GB/s (bytes read + written)\n", memcpy_bw / 1e9);
    printf("  memcpy, %d threads     %6.2f GB/s\n", PAR, pmemcpy_bw / 1e9);
    printf("  add                   %6.2f GB/s   %.2f of 1-thread memcpy, %.2f of %d-thread\n",
           add_bw / 1e9, add_bw / memcpy_bw, add_bw / pmemcpy_bw, PAR);
    printf("  sum                   %6.2f GB/s   %.2f of 1-thread memcpy, %.2f of %d-thread\n",
           sum_bw / 1e9, sum_bw / memcpy_bw, sum_bw / pmemcpy_bw, PAR);
    tdd_backend_cpu.shutdown(ctx);
}

/* Seconds for one call of op on backend be (median of reps): inputs in[0..n_in),
 * attributes attrs, one output allocated here from the prepared description. */
static double time_backend_op(const tdd_backend *be, void *ctx, const char *name,
                              const tdd_tensor *const *in, int n_in, const td_attr *attrs,
                              size_t nattrs, int reps)
{
    tdd_opargs args;
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    tdd_opcall call;
    prepare(name, in, n_in, attrs, nattrs, &args, od, &call);
    tdd_tensor out;
    memset(&out, 0, sizeof out);
    out.dtype = od[0].dtype;
    out.ndim = od[0].ndim;
    memcpy(out.shape, od[0].shape, sizeof out.shape);
    tdd_set_contiguous(&out);
    out.st = host_storage((size_t)tdd_numel(&out) * td_dtype_size(out.dtype));
    call.out[0] = &out;
    double t = time_call(be, ctx, &call, reps);
    free(out.st->data);
    free(out.st);
    return t;
}

/* cat and tril, which the cpu backend ran on the reference kernels until cpu_index.c. */
static void bench_index(void)
{
    tdd_backend_config cfg = {.cpu_devices = 1};
    void *cpu, *ref;
    char why[128];
    tdd_backend_cpu.init(&cfg, &cpu, why, sizeof why);
    tdd_backend_ref.init(&cfg, &ref, why, sizeof why);
    size_t half = 32u << 20, nbytes = 2 * half; /* two 32 MiB inputs, one 64 MiB output */
    tdd_storage *s0 = host_storage(half), *s1 = host_storage(half), *sm = host_storage(nbytes),
                *so = host_storage(nbytes);
    double t[REPS];
    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        memcpy(so->data, sm->data, nbytes);
        t[r] = bench_now() - t0;
    }
    double memcpy_bw = 2.0 * (double)nbytes / bench_median(t, REPS);
    for (int r = 0; r < REPS; r++) {
        double t0 = bench_now();
        par_memcpy(so->data, sm->data, nbytes);
        t[r] = bench_now() - t0;
    }
    double pmemcpy_bw = 2.0 * (double)nbytes / bench_median(t, REPS);
    free(so->data);
    free(so);

    tdd_tensor a, b, m; /* a, b: [2048, 4096] f32 (32 MiB each); m: [4096, 4096] */
    vec(&a, s0, (int64_t)(half / 4));
    vec(&b, s1, (int64_t)(half / 4));
    vec(&m, sm, (int64_t)(nbytes / 4));
    a.ndim = b.ndim = m.ndim = 2;
    a.shape[0] = b.shape[0] = 2048;
    m.shape[0] = a.shape[1] = b.shape[1] = m.shape[1] = 4096;
    tdd_set_contiguous(&a);
    tdd_set_contiguous(&b);
    tdd_set_contiguous(&m);
    const tdd_tensor *cat_in[2] = {&a, &b}, *tri_in[1] = {&m};
    td_attr dim0 = {.name = "dim", .kind = TD_ATTR_INT, .i = 0};
    td_attr dim1 = {.name = "dim", .kind = TD_ATTR_INT, .i = 1};
    struct {
        const char *label, *op;
        const tdd_tensor *const *in;
        int n_in;
        const td_attr *attr;
    } cases[] = {
        {"cat dim=0 (2x 32 MiB)", "cat", cat_in, 2, &dim0},
        {"cat dim=1 (2x 32 MiB)", "cat", cat_in, 2, &dim1},
        {"tril 4096x4096", "tril", tri_in, 1, NULL},
    };
    printf("cpu backend vs ref kernels, f32, 64 MiB out (median of %d cpu, 3 ref)\n", REPS);
    printf("  memcpy, 1 thread      %6.2f GB/s (bytes read + written)\n", memcpy_bw / 1e9);
    printf("  memcpy, %d threads     %6.2f GB/s\n", PAR, pmemcpy_bw / 1e9);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t na = cases[k].attr ? 1 : 0;
        double tc = time_backend_op(&tdd_backend_cpu, cpu, cases[k].op, cases[k].in, cases[k].n_in,
                                    cases[k].attr, na, REPS);
        double tr = time_backend_op(&tdd_backend_ref, ref, cases[k].op, cases[k].in, cases[k].n_in,
                                    cases[k].attr, na, 3);
        double bc = 2.0 * (double)nbytes / tc, br = 2.0 * (double)nbytes / tr;
        printf("  %-22s cpu %6.2f GB/s (%.2f of 1-thread memcpy, %.2f of %d-thread)   "
               "ref %6.3f GB/s (%.3f of 1-thread memcpy)   %.0fx\n",
               cases[k].label, bc / 1e9, bc / memcpy_bw, bc / pmemcpy_bw, PAR, br / 1e9,
               br / memcpy_bw, tr / tc);
    }
    tdd_backend_cpu.shutdown(cpu);
    tdd_backend_ref.shutdown(ref);
    tdd_storage *ss[3] = {s0, s1, sm};
    for (int k = 0; k < 3; k++) {
        free(ss[k]->data);
        free(ss[k]);
    }
}

static void bench_sgemm(const char *ep, int N, int reps)
{
    size_t nn = (size_t)N * (size_t)N, nbytes = nn * sizeof(float);
    float *a = malloc(nbytes), *b = malloc(nbytes), *c = malloc(nbytes);
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 17) * 0.01f;
        b[i] = (float)(i % 13) * 0.02f;
    }
    double flops = 2.0 * N * N * N;
    double tl[REPS], tr[REPS];
    reps = reps < 1 ? 1 : reps > REPS ? REPS : reps;
    /* The baseline is OpenBLAS as a user would call it: all cores (the cpu backend set it
     * to one thread when bench_elementwise initialised it in this process). */
    openblas_set_num_threads((int)sysconf(_SC_NPROCESSORS_ONLN));
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N, 0.0f, c,
                    N);
        tl[r] = bench_now() - t0;
    }
    usleep(200000); /* let OpenBLAS's threads stop spinning before the daemon needs the cores */

    td_client *cl;
    td_error err;
    if (td_connect(ep, NULL, &cl, &err)) {
        fprintf(stderr, "bench: connect: %s\n", err.message);
        exit(3);
    }
    int64_t shape[2] = {N, N};
    td_handle ha, hb;
    td_upload(cl, NULL, TD_F32, 2, shape, a, 0, &ha, &err);
    td_upload(cl, NULL, TD_F32, 2, shape, b, 0, &hb, &err);
    td_sync(cl, &err);
    td_handle in[2] = {ha, hb};
    for (int r = 0; r < reps; r++) {
        double t0 = bench_now();
        td_handle h = td_op1(cl, "matmul", in, 2, NULL, &err);
        if (td_sync(cl, &err)) {
            fprintf(stderr, "bench: matmul: %s\n", err.message);
            exit(1);
        }
        tr[r] = bench_now() - t0;
        td_release(cl, &h, 1, &err);
    }
    td_release(cl, in, 2, &err);
    td_close(cl);
    double ml = bench_median(tl, reps), mr = bench_median(tr, reps);
    double gl = flops / ml / 1e9, gr = flops / mr / 1e9;
    printf("sgemm %dx%d (median of %d; upload once, then matmul + sync)\n", N, N, reps);
    printf("  local OpenBLAS  %7.1f GFLOP/s  %8.2f ms\n", gl, ml * 1e3);
    printf("  tensordd cpu:0  %7.1f GFLOP/s  %8.2f ms   speed ratio %.2f, time ratio %.2f\n", gr,
           mr * 1e3, gr / gl, mr / ml);
    printf("RESULT sgemm.%d %.4f -\n", N, mr / ml);
    free(a);
    free(b);
    free(c);
}

static int pipe_ops = 400000;
#define PIPE_LIVE 200000
#define PIPE_BATCH 1024 /* outputs released per Release request */

/* ops/s of pipe_ops pipelined relu(4) in session c, each batch of outputs released. */
static double pipelined_rate(td_client *c, td_handle x)
{
    static td_handle ys[PIPE_BATCH];
    td_error err;
    double t0 = bench_now();
    for (int i = 0; i < pipe_ops; i += PIPE_BATCH) {
        for (int k = 0; k < PIPE_BATCH; k++)
            ys[k] = td_op1(c, "relu", &x, 1, NULL, &err);
        td_release(c, ys, PIPE_BATCH, &err);
    }
    if (td_sync(c, &err)) {
        fprintf(stderr, "bench: pipelined relu: %s\n", err.message);
        exit(1);
    }
    return pipe_ops / (bench_now() - t0);
}

static void bench_pipelined(const char *ep, int reps)
{
    double rate[2][REPS];
    reps = reps < 1 ? 1 : reps > REPS ? REPS : reps;
    for (int live = 0; live < 2; live++) {
        td_client *c;
        td_error err;
        if (bench_connect(ep, &c, &err)) {
            fprintf(stderr, "bench: %s\n", err.message);
            exit(1);
        }
        float v[4] = {-1, 2, -3, 4};
        int64_t shape[1] = {4};
        td_handle x = 0;
        td_upload(c, NULL, TD_F32, 1, shape, v, 0, &x, &err);
        td_handle *held = NULL;
        if (live) { /* 200k live tensors first (views of x: no memory of their own) */
            held = malloc(PIPE_LIVE * sizeof *held);
            if (!held)
                exit(1);
            for (int i = 0; i < PIPE_LIVE; i++)
                held[i] = td_op1(c, "detach", &x, 1, NULL, &err);
        }
        if (td_sync(c, &err)) {
            fprintf(stderr, "bench: pipelined setup: %s\n", err.message);
            exit(1);
        }
        for (int r = 0; r < reps; r++) {
            usleep(100000);
            rate[live][r] = pipelined_rate(c, x);
        }
        if (held) {
            td_release(c, held, PIPE_LIVE, &err);
            free(held);
        }
        td_close(c);
    }
    double r0 = bench_median(rate[0], reps), r1 = bench_median(rate[1], reps);
    printf("pipelined relu(4), %d ops released in batches of %d (median of %d)\n", pipe_ops,
           PIPE_BATCH, reps);
    printf("  fresh session        %9.0f ops/s   %.2fx the 1M ops/s target\n", r0, r0 / 1e6);
    printf("  %dk live handles    %9.0f ops/s   %.2fx the 1M ops/s target, %.2fx fresh\n",
           PIPE_LIVE / 1000, r1, r1 / 1e6, r1 / r0);
    printf("RESULT c.pipelined %.0f -\nRESULT c.pipelined_200k %.0f >=1000000\n", r0, r1);
}

int main(int argc, char **argv)
{
    int only_pipelined = 0, quick = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "pipelined") == 0)
            only_pipelined = 1;
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else
            argc = 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: ops ENDPOINT [pipelined] [--quick]\n");
        return 2;
    }
    if (quick)
        pipe_ops = 4 * PIPE_BATCH;
    if (!only_pipelined) {
        if (!quick) {
            bench_elementwise();
            bench_index();
            usleep(200000);
        }
        bench_sgemm(argv[1], 2048, quick ? 1 : REPS);
        usleep(200000);
        bench_sgemm(argv[1], 1024, quick ? 1 : REPS);
        usleep(200000);
    }
    bench_pipelined(argv[1], quick ? 1 : REPS / 3);
    return 0;
}
