/* fuzz_session.c -- structure-aware fuzz target: the input is a program of session
 * requests, each well formed (uploads, ops and views, backward, grad, grad_replace,
 * optimizer create and step, releases, downloads, syncs, stats, graphs recorded and
 * replayed), played over one
 * connection against an in-process daemon whose work runs on ref:0 and cpu:0. Where
 * fuzz_frame.c feeds the daemon bytes, this one reaches the engine: the bytes choose
 * requests, operands among the live handles, shapes, attributes and payloads.
 *
 * The client keeps a model of the session and checks, after every synchronising
 * request: every request that asked for an answer got exactly one, by id, before the
 * synchronising one's; a Stats reply counts exactly the handles the model holds (every
 * new id a request named is bound, the failed ones to placeholders, until released;
 * not counted once a graph was replayed, which binds again what its requests bound);
 * the daemon never closes the connection. A marker byte after a Sync loses the connection
 * and resumes the session on a new one (its handles, graphs and counts the same). Graphs
 * replay a request or two per turn of the daemon's loop (--replay-slice), at a few queued
 * (--max-inflight). At the end the session says Goodbye and the
 * daemon must hold no session, no memory and no tensor. A broken invariant aborts.
 * Built as a corpus replayer for `make test` (TDD_FUZZ_REPLAY) and as a libFuzzer
 * target for `make fuzz FUZZ_TARGET=session`. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "harness.h"
#include "tensordd.pb-c.h"

typedef Tensordd__V1__Request Request;
typedef Tensordd__V1__Response Response;

static void tune(tdd_config *c)
{
    c->cpu_devices = 1;
    c->device_lanes = 2;
    c->memory_cap = 256u << 20;
    /* A replay yields after every request or two, and waits at a few queued: the paths
     * a long replay takes (server.c's yields) on every graph the programs replay. */
    c->replay_slice = 64;
    c->max_inflight = 4;
}

/* ---------------------------------------------------------------- the program's bytes */

typedef struct {
    const uint8_t *p;
    size_t n;
} input;

static unsigned take(input *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static bool more(const input *in)
{
    return in->n > 0;
}

/* ---------------------------------------------------------------- the client's model */

enum { KIND_TENSOR = 1, KIND_GRADS, KIND_OPTIM, KIND_GRAPH };
#define MAX_HANDLES 256
#define MAX_EXPECT 1024

typedef struct {
    int fd;
    uint64_t next_req, next_id;
    uint64_t ids[MAX_HANDLES];
    int kinds[MAX_HANDLES];
    int n; /* handles bound in the daemon, by the model */
    uint64_t expect[MAX_EXPECT];
    int nexpect;       /* answers owed */
    bool replayed;     /* a Replay rebinds what its graph bound: handles no longer counted */
    uint8_t token[16]; /* the session's resume token (Hello asks for a window) */
    size_t token_len;
    int resumes;
    input in;
} client;

static _Noreturn void broken(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_session: invariant broken: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

static void model_bind(client *c, uint64_t id, int kind)
{
    if (c->n < MAX_HANDLES) {
        c->ids[c->n] = id;
        c->kinds[c->n++] = kind;
    }
}

/* A handle of the kind (most of the time), any handle, or an id never bound. */
static uint64_t pick(client *c, int kind)
{
    unsigned b = take(&c->in);
    if (b % 16 == 15 || !c->n)
        return b % 4 ? c->next_id + b : (uint64_t)b; /* unknown */
    for (int k = 0; k < c->n; k++) {
        int i = (int)((b + (unsigned)k) % (unsigned)c->n);
        if (c->kinds[i] == kind || b % 16 == 14)
            return c->ids[i];
    }
    return c->ids[b % (unsigned)c->n];
}

/* ---------------------------------------------------------------- wire */

static bool send_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0)
            return false;
        b += w;
        n -= (size_t)w;
    }
    return true;
}

static bool recv_all(int fd, void *p, size_t n)
{
    uint8_t *b = p;
    while (n) {
        ssize_t r = recv(fd, b, n, 0);
        if (r <= 0)
            return false;
        b += r;
        n -= (size_t)r;
    }
    return true;
}

/* Sends req (ids assigned here) with an optional payload; records the answer owed. */
static void send_req(client *c, Request *req, const void *payload, size_t plen, bool answered)
{
    req->id = ++c->next_req;
    size_t len = tensordd__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(TD_FRAME_HEADER_SIZE + len);
    td_frame_encode(buf, (uint32_t)len, plen);
    tensordd__v1__request__pack(req, buf + TD_FRAME_HEADER_SIZE);
    bool ok = send_all(c->fd, buf, TD_FRAME_HEADER_SIZE + len) &&
              (!plen || send_all(c->fd, payload, plen));
    free(buf);
    if (!ok)
        broken("the daemon closed the connection (request #%llu)", (unsigned long long)req->id);
    if (getenv("TDD_FUZZ_TRACE"))
        fprintf(stderr, "fuzz_session: #%llu %s%s\n", (unsigned long long)req->id,
                protobuf_c_message_descriptor_get_field(&tensordd__v1__request__descriptor,
                                                        (unsigned)req->body_case)
                    ->name,
                answered || req->want_reply ? " (answer owed)" : "");
    if ((answered || req->want_reply) && c->nexpect < MAX_EXPECT)
        c->expect[c->nexpect++] = req->id;
}

/* Reads answers until the one to id; every answer must be owed. Returns it (caller frees). */
static Response *await(client *c, uint64_t id)
{
    td_frame_limits lim = {.max_msg = 1u << 26, .max_payload = 1ull << 32};
    for (;;) {
        uint8_t h[TD_FRAME_HEADER_SIZE];
        td_frame_header hdr;
        if (!recv_all(c->fd, h, sizeof h) || td_frame_decode(h, &lim, &hdr))
            broken("no well-formed answer to request #%llu", (unsigned long long)id);
        uint8_t *msg = malloc(hdr.msg_len ? hdr.msg_len : 1);
        if (!recv_all(c->fd, msg, hdr.msg_len))
            broken("answer cut short");
        Response *r = tensordd__v1__response__unpack(NULL, hdr.msg_len, msg);
        free(msg);
        if (!r)
            broken("an answer that does not decode");
        for (uint64_t left = hdr.payload_len; left;) {
            uint8_t sink[65536];
            size_t k = left < sizeof sink ? (size_t)left : sizeof sink;
            if (!recv_all(c->fd, sink, k))
                broken("payload cut short");
            left -= k;
        }
        if (getenv("TDD_FUZZ_TRACE"))
            fprintf(stderr, "fuzz_session:   answer #%llu (%s%s)\n", (unsigned long long)r->id,
                    r->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR ? "error: " : "ok",
                    r->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR ? r->error->message : "");
        if (r->id == 0)
            broken("the daemon ended the session: %s",
                   r->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR ? r->error->message : "?");
        int at = -1;
        for (int i = 0; i < c->nexpect; i++)
            if (c->expect[i] == r->id)
                at = i;
        if (at < 0)
            broken("an answer to request #%llu, which was not owed one", (unsigned long long)r->id);
        c->expect[at] = c->expect[--c->nexpect];
        if (r->id == id) {
            if (c->nexpect)
                broken("request #%llu answered before #%llu, sent earlier", (unsigned long long)id,
                       (unsigned long long)c->expect[0]);
            return r;
        }
        tensordd__v1__response__free_unpacked(r, NULL);
    }
}

static void sync_point(client *c, Request *req)
{
    send_req(c, req, NULL, 0, true);
    tensordd__v1__response__free_unpacked(await(c, req->id), NULL);
}

/* ---------------------------------------------------------------- requests */

static Tensordd__V1__Device dev_ref = {PROTOBUF_C_MESSAGE_INIT(&tensordd__v1__device__descriptor),
                                       (char *)"ref", 0};
static Tensordd__V1__Device dev_cpu = {PROTOBUF_C_MESSAGE_INIT(&tensordd__v1__device__descriptor),
                                       (char *)"cpu", 0};

static void do_upload(client *c)
{
    static const Tensordd__V1__DType dts[] = {
        TENSORDD__V1__DTYPE__DTYPE_F32, TENSORDD__V1__DTYPE__DTYPE_F32,
        TENSORDD__V1__DTYPE__DTYPE_I64, TENSORDD__V1__DTYPE__DTYPE_BOOL};
    static const size_t isz[] = {4, 4, 8, 1};
    unsigned b = take(&c->in);
    int64_t shape[3];
    size_t nd = b % 4 == 3 ? 0 : 1 + b % 3, numel = 1;
    for (size_t i = 0; i < nd; i++) {
        shape[i] = (int64_t)(take(&c->in) % 5);
        numel *= (size_t)shape[i];
    }
    unsigned d = (b >> 2) % 4;
    size_t plen = numel * isz[d];
    uint8_t *payload = calloc(plen ? plen : 1, 1);
    for (size_t i = 0; i < plen && more(&c->in); i++)
        payload[i] = (uint8_t)take(&c->in);
    if (dts[d] == TENSORDD__V1__DTYPE__DTYPE_BOOL)
        for (size_t i = 0; i < plen; i++)
            payload[i] &= 1;
    Tensordd__V1__Upload up = TENSORDD__V1__UPLOAD__INIT;
    up.handle = ++c->next_id;
    up.dtype = dts[d];
    up.shape = shape;
    up.n_shape = nd;
    up.device = b & 0x40 ? &dev_cpu : &dev_ref;
    up.requires_grad = (b & 0x80) && d < 2;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_UPLOAD;
    req.upload = &up;
    req.want_reply = take(&c->in) & 1;
    send_req(c, &req, payload, plen, false);
    free(payload);
    model_bind(c, up.handle, KIND_TENSOR);
}

/* Ops and views with their arities; attributes come from the input. */
static const struct {
    const char *name;
    int nin;
} ops[] = {{"relu", 1},        {"neg", 1},           {"exp", 1},      {"tanh", 1},
           {"sigmoid", 1},     {"sum", 1},           {"mean", 1},     {"add", 2},
           {"mul", 2},         {"sub", 2},           {"div", 2},      {"matmul", 2},
           {"reshape", 1},     {"transpose", 1},     {"permute", 1},  {"expand", 1},
           {"slice", 1},       {"unsqueeze", 1},     {"squeeze", 1},  {"softmax", 1},
           {"log_softmax", 1}, {"cross_entropy", 2}, {"mse_loss", 2}, {"where", 3},
           {"cat", 2},         {"clone", 1},         {"detach", 1},   {"max", 1},
           {"gather", 2},      {"masked_fill", 2},   {"pow", 2},      {"to", 1}};
#define NOPS (sizeof ops / sizeof ops[0])

static void do_op(client *c)
{
    unsigned which = take(&c->in) % NOPS;
    uint64_t in[3];
    for (int i = 0; i < ops[which].nin; i++)
        in[i] = pick(c, KIND_TENSOR);
    uint64_t out = ++c->next_id;
    Tensordd__V1__Attr attrs[3], *ap[3];
    Tensordd__V1__IntList il = TENSORDD__V1__INT_LIST__INIT;
    int64_t ints[3];
    size_t na = take(&c->in) % 3;
    static const char *names[] = {"dim", "shape", "dims",    "dim0",  "dim1",     "start",
                                  "end", "value", "keepdim", "dtype", "exponent", "reduction"};
    for (size_t i = 0; i < na; i++) {
        Tensordd__V1__Attr a = TENSORDD__V1__ATTR__INIT;
        unsigned k = take(&c->in);
        a.name = (char *)names[k % (sizeof names / sizeof names[0])];
        switch ((k >> 4) % 4) {
        case 0:
            a.value_case = TENSORDD__V1__ATTR__VALUE_I;
            a.i = (int64_t)(take(&c->in) % 7) - 3;
            break;
        case 1:
            a.value_case = TENSORDD__V1__ATTR__VALUE_F;
            a.f = (double)((int)take(&c->in) - 128) / 16.0;
            break;
        case 2:
            a.value_case = TENSORDD__V1__ATTR__VALUE_B;
            a.b = take(&c->in) & 1;
            break;
        default:
            il.n_v = take(&c->in) % 4;
            for (size_t j = 0; j < il.n_v; j++)
                ints[j] = (int64_t)(take(&c->in) % 6) - 1;
            il.v = ints;
            a.value_case = TENSORDD__V1__ATTR__VALUE_INTS;
            a.ints = &il;
        }
        attrs[i] = a;
        ap[i] = &attrs[i];
    }
    Tensordd__V1__Op op = TENSORDD__V1__OP__INIT;
    op.op = (char *)ops[which].name;
    op.inputs = in;
    op.n_inputs = (size_t)ops[which].nin;
    op.outputs = &out;
    op.n_outputs = 1;
    op.attrs = ap;
    op.n_attrs = na;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_OP;
    req.op = &op;
    req.want_reply = take(&c->in) & 1;
    send_req(c, &req, NULL, 0, false);
    model_bind(c, out, KIND_TENSOR);
}

static void do_backward(client *c)
{
    Tensordd__V1__Backward bw = TENSORDD__V1__BACKWARD__INIT;
    bw.loss = pick(c, KIND_TENSOR);
    bw.grad_output = take(&c->in) & 1 ? pick(c, KIND_TENSOR) : 0;
    bw.retain_graph = take(&c->in) & 1;
    bw.grads = ++c->next_id;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_BACKWARD;
    req.backward = &bw;
    sync_point(c, &req);
    model_bind(c, bw.grads, KIND_GRADS);
}

static void do_grad(client *c)
{
    Tensordd__V1__Grad g = TENSORDD__V1__GRAD__INIT;
    g.grads = pick(c, KIND_GRADS);
    g.tensor = pick(c, KIND_TENSOR);
    g.output = ++c->next_id;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_GRAD;
    req.grad = &g;
    sync_point(c, &req);
    model_bind(c, g.output, KIND_TENSOR);
}

static void do_grad_replace(client *c)
{
    Tensordd__V1__GradReplace g = TENSORDD__V1__GRAD_REPLACE__INIT;
    g.grads = pick(c, KIND_GRADS);
    g.tensor = pick(c, KIND_TENSOR);
    g.grad = pick(c, KIND_TENSOR);
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_GRAD_REPLACE;
    req.grad_replace = &g;
    sync_point(c, &req);
}

static void do_optimizer(client *c)
{
    unsigned b = take(&c->in);
    if (b & 1) {
        Tensordd__V1__OptimizerStep st = TENSORDD__V1__OPTIMIZER_STEP__INIT;
        st.optimizer = pick(c, KIND_OPTIM);
        st.grads = pick(c, KIND_GRADS);
        Request req = TENSORDD__V1__REQUEST__INIT;
        req.body_case = TENSORDD__V1__REQUEST__BODY_OPTIMIZER_STEP;
        req.optimizer_step = &st;
        sync_point(c, &req);
        return;
    }
    static const char *kinds[] = {"sgd", "adam", "adamw", "nadam"};
    uint64_t params[4];
    size_t np = take(&c->in) % 4;
    for (size_t i = 0; i < np; i++)
        params[i] = pick(c, KIND_TENSOR);
    Tensordd__V1__Attr lr = TENSORDD__V1__ATTR__INIT, *lrp = &lr;
    lr.name = (char *)"lr";
    lr.value_case = TENSORDD__V1__ATTR__VALUE_F;
    lr.f = (double)take(&c->in) / 256.0;
    Tensordd__V1__OptimizerCreate oc = TENSORDD__V1__OPTIMIZER_CREATE__INIT;
    oc.handle = ++c->next_id;
    oc.kind = (char *)kinds[(b >> 1) % 4];
    oc.params = params;
    oc.n_params = np;
    oc.attrs = &lrp;
    oc.n_attrs = (b >> 3) & 1;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_OPTIMIZER_CREATE;
    req.optimizer_create = &oc;
    req.want_reply = (b >> 4) & 1;
    send_req(c, &req, NULL, 0, false);
    model_bind(c, oc.handle, KIND_OPTIM);
}

static void do_release(client *c)
{
    unsigned b = take(&c->in);
    uint64_t ids[2];
    size_t n = 0;
    if (b % 4 == 3) { /* an id that is not bound: an error, and nothing released */
        ids[n++] = c->next_id + 1 + b;
    } else if (c->n) {
        int i = (int)(take(&c->in) % (unsigned)c->n);
        ids[n++] = c->ids[i];
        c->ids[i] = c->ids[c->n - 1];
        c->kinds[i] = c->kinds[c->n - 1];
        c->n--;
    }
    Tensordd__V1__Release rel = TENSORDD__V1__RELEASE__INIT;
    rel.handles = ids;
    rel.n_handles = n;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_RELEASE;
    req.release = &rel;
    req.want_reply = (b >> 2) & 1;
    send_req(c, &req, NULL, 0, false);
}

static void do_download(client *c)
{
    Tensordd__V1__Download dl = TENSORDD__V1__DOWNLOAD__INIT;
    dl.handle = pick(c, KIND_TENSOR);
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_DOWNLOAD;
    req.download = &dl;
    sync_point(c, &req);
}

/* GraphBegin (inputs among the tensors), GraphEnd (binds a graph), Replay. */
static void do_graph(client *c)
{
    unsigned b = take(&c->in);
    uint64_t in[2];
    size_t n = (b >> 2) % 3;
    for (size_t i = 0; i < n; i++)
        in[i] = pick(c, KIND_TENSOR);
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.want_reply = (b >> 4) & 1;
    if (b % 3 == 0) {
        Tensordd__V1__GraphBegin gb = TENSORDD__V1__GRAPH_BEGIN__INIT;
        gb.inputs = in;
        gb.n_inputs = n;
        req.body_case = TENSORDD__V1__REQUEST__BODY_GRAPH_BEGIN;
        req.graph_begin = &gb;
        send_req(c, &req, NULL, 0, false);
    } else if (b % 3 == 1) {
        Tensordd__V1__GraphEnd ge = TENSORDD__V1__GRAPH_END__INIT;
        ge.graph = ++c->next_id;
        req.body_case = TENSORDD__V1__REQUEST__BODY_GRAPH_END;
        req.graph_end = &ge;
        sync_point(c, &req);
        model_bind(c, ge.graph, KIND_GRAPH);
    } else {
        Tensordd__V1__Replay rp = TENSORDD__V1__REPLAY__INIT;
        rp.graph = pick(c, KIND_GRAPH);
        rp.inputs = in;
        rp.n_inputs = n;
        req.body_case = TENSORDD__V1__REQUEST__BODY_REPLAY;
        req.replay = &rp;
        send_req(c, &req, NULL, 0, false);
        c->replayed = true;
    }
}

static void do_sync(client *c)
{
    Tensordd__V1__Sync sy = TENSORDD__V1__SYNC__INIT;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_SYNC;
    req.sync = &sy;
    sync_point(c, &req);
}

/* Stats is answered on the loop in request order: every request before it has been
 * dispatched, so every new id it named is bound (or released). */
static void check_stats(client *c)
{
    Tensordd__V1__Stats st = TENSORDD__V1__STATS__INIT;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_STATS;
    req.stats = &st;
    send_req(c, &req, NULL, 0, true);
    Response *r = await(c, req.id);
    if (r->body_case != TENSORDD__V1__RESPONSE__BODY_STATS)
        broken("Stats not answered with StatsReply");
    if (!c->replayed && r->stats->handles != (uint64_t)c->n)
        broken("the daemon holds %llu handles, the session bound %d",
               (unsigned long long)r->stats->handles, c->n);
    tensordd__v1__response__free_unpacked(r, NULL);
}

static int connect_daemon(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fz_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa))
        broken("cannot connect to the in-process daemon");
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1; /* small requests then a wait for the answer: no Nagle delay */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Hello, resumable (a window the session never reaches: it ends with Goodbye); with
 * c->token_len, it resumes that session instead, having received every answer. */
static void hello(client *c)
{
    Tensordd__V1__Hello h = TENSORDD__V1__HELLO__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.client_name = (char *)"fuzz_session";
    h.resume_window = 30;
    bool resuming = c->token_len > 0;
    if (resuming) {
        h.resume_token.data = c->token;
        h.resume_token.len = c->token_len;
        h.last_received = c->next_req;
    }
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_HELLO;
    req.hello = &h;
    send_req(c, &req, NULL, 0, true);
    Response *r = await(c, req.id);
    if (r->body_case != TENSORDD__V1__RESPONSE__BODY_HELLO)
        broken("Hello not answered with HelloReply: %s",
               r->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR ? r->error->message : "?");
    if (resuming && !r->hello->resumed)
        broken("the session was not resumed");
    if (!resuming && r->hello->resume_token.len == sizeof c->token) {
        memcpy(c->token, r->hello->resume_token.data, sizeof c->token);
        c->token_len = sizeof c->token;
    }
    tensordd__v1__response__free_unpacked(r, NULL);
}

/* The connection is lost between two requests, every answer received: the session is
 * held (or still attached, when the daemon has not seen the close yet: the token takes
 * it over); a new connection resumes it and the program goes on there. */
static void lose_and_resume(client *c)
{
    if (!c->token_len || c->resumes >= 4)
        return;
    c->resumes++;
    close(c->fd);
    c->fd = connect_daemon();
    hello(c);
}

/* A resumable session ends with Goodbye (a plain close would hold it for its window). */
static void goodbye(client *c)
{
    Tensordd__V1__Goodbye gb = TENSORDD__V1__GOODBYE__INIT;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_GOODBYE;
    req.goodbye = &gb;
    sync_point(c, &req);
}

typedef struct {
    input in;
    atomic_int done;
} job;

static void *run_client(void *arg)
{
    job *j = arg;
    client c = {.in = j->in};
    c.fd = connect_daemon();
    hello(&c);
    for (int steps = 0; more(&c.in) && steps < 200; steps++) {
        switch (take(&c.in) % 13) {
        case 0:
        case 1:
            do_upload(&c);
            break;
        case 2:
        case 3:
        case 4:
            do_op(&c);
            break;
        case 5:
            do_backward(&c);
            break;
        case 6:
            do_grad(&c);
            break;
        case 7:
            do_grad_replace(&c);
            break;
        case 8:
            do_optimizer(&c);
            break;
        case 9:
            do_release(&c);
            break;
        case 10:
            do_download(&c);
            break;
        case 11:
            do_graph(&c);
            break;
        default:
            do_sync(&c);
            check_stats(&c);
            /* (a marker byte, peeked: the programs without it read as before) */
            if (c.in.n && c.in.p[0] == 0xA5) {
                take(&c.in);
                lose_and_resume(&c);
                check_stats(&c);
            }
        }
    }
    do_sync(&c);
    check_stats(&c);
    if (c.nexpect)
        broken("%d answers never came", c.nexpect);
    goodbye(&c);
    close(c.fd);
    atomic_store(&j->done, 1);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_start("fuzz_session", tune);
    job j = {.in = {data, size}};
    fz_run("fuzz_session", run_client, &j, &j.done);
    return 0;
}

#ifdef TDD_FUZZ_REPLAY
int main(int argc, char **argv)
{
    return fz_replay(argc, argv, "fuzz_session");
}
#endif
