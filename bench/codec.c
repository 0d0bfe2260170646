/* codec.c -- CPU time per message of the hand-written wire codecs, in process (no socket):
 * the daemon's decoder of a small op request and encoder of a TensorInfo reply, the client
 * library's packer of that request and glance at that reply, and protobuf-c doing the same
 * for scale. Each row is the median over ROUNDS rounds of N calls, in process CPU time.
 *   build/bench/codec [N [ROUNDS]]       (make bench-codec) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../client/lib/internal.h" /* the client library's private codec */
#include "conn.h"
#include "wire.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned char arena[4096];
static size_t arena_used;

static void *arena_alloc(void *data, size_t n)
{
    (void)data;
    n = (n + 15) & ~(size_t)15;
    if (arena_used + n > sizeof arena)
        return NULL;
    void *p = arena + arena_used;
    arena_used += n;
    return p;
}

static void arena_free(void *data, void *p)
{
    (void)data;
    (void)p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static volatile uint64_t sink;

enum { MAX_ROUNDS = 64 };

#define ROW(name, body)                                                                            \
    do {                                                                                           \
        double t[MAX_ROUNDS];                                                                      \
        for (int r = 0; r < rounds; r++) {                                                         \
            double t0 = cpu_now();                                                                 \
            for (long i = 0; i < n; i++) {                                                         \
                body;                                                                              \
            }                                                                                      \
            t[r] = (cpu_now() - t0) / (double)n * 1e9;                                             \
        }                                                                                          \
        qsort(t, (size_t)rounds, sizeof t[0], cmp_double);                                         \
        printf("%-34s %8.1f ns  (min %.1f, max %.1f)\n", name, t[rounds / 2], t[0],                \
               t[rounds - 1]);                                                                     \
    } while (0)

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 7;
    if (n < 1 || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "usage: %s [N>0 [ROUNDS 1..%d]]\n", argv[0], MAX_ROUNDS);
        return 2;
    }

    /* A binary op with one output, as a pipelined training step sends them. */
    uint64_t ins[2] = {1000001, 1000002}, outs[1] = {1000003};
    Tensordd__V1__Op op = TENSORDD__V1__OP__INIT;
    op.op = "add";
    op.n_inputs = 2;
    op.inputs = ins;
    op.n_outputs = 1;
    op.outputs = outs;
    Tensordd__V1__Request req = TENSORDD__V1__REQUEST__INIT;
    req.id = 123456;
    req.body_case = TENSORDD__V1__REQUEST__BODY_OP;
    req.op = &op;
    uint8_t msg[256];
    size_t len = tensordd__v1__request__pack(&req, msg);

    /* A 2-d f32 tensor's reply. */
    tdd_backend be;
    memset(&be, 0, sizeof be);
    be.name = "cpu";
    tdd_device dev;
    memset(&dev, 0, sizeof dev);
    dev.be = &be;
    tdd_value v;
    memset(&v, 0, sizeof v);
    v.dev = &dev;
    v.handle = 1000003;
    v.t.dtype = TD_F32;
    v.t.ndim = 2;
    v.t.shape[0] = 64;
    v.t.shape[1] = 128;
    uint8_t rsp[TDD_WIRE_SMALL_MAX];
    size_t rlen = tdd_wire_tensor(rsp, 123456, &v);

    ProtobufCAllocator al = {.alloc = arena_alloc, .free = arena_free};
    printf("codec: %ld calls x %d rounds, median ns per call (process CPU time)\n", n, rounds);
    ROW("daemon decode op (hand)", {
        arena_used = 0;
        Tensordd__V1__Request *q = tdd_wire_request_fast(msg, len, &al);
        sink += q->op->n_inputs;
    });
    ROW("daemon decode op (protobuf-c)", {
        arena_used = 0;
        Tensordd__V1__Request *q = tensordd__v1__request__unpack(&al, len, msg);
        sink += q->op->n_inputs;
    });
    ROW("daemon encode tensor reply (hand)", { sink += tdd_wire_tensor(rsp, (uint64_t)i, &v); });
    ROW("client pack op (hand)", {
        td__req_sizes z;
        req.id = (uint64_t)i;
        size_t s = td__request_fast_size(&req, &z);
        sink += td__request_fast_pack(&req, &z, msg) + s;
    });
    ROW("client pack op (protobuf-c)", {
        req.id = (uint64_t)i;
        sink += tensordd__v1__request__pack(&req, msg);
    });
    ROW("client glance tensor reply (hand)", {
        uint64_t id;
        int body;
        sink += (uint64_t)td__glance_response(rsp, rlen, &id, &body) + id;
    });
    return 0;
}
