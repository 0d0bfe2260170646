/* fuzz_session.c -- structure-aware fuzz target: the input is a program of session
 * requests, each well formed (uploads, ops and views, backward, grad, grad_replace,
 * optimizer create and step, releases, downloads, syncs, stats, graphs recorded and
 * replayed, transfers, process groups), played over one
 * connection against an in-process daemon whose work runs on ref:0 and cpu:0. Where
 * fuzz_frame.c feeds the daemon bytes, this one reaches the engine: the bytes choose
 * requests, operands among the live handles, shapes, attributes and payloads.
 *
 * The client keeps a model of the session and checks, after every synchronising
 * request: every request that asked for an answer got exactly one, by id, before the
 * synchronising one's; a Stats reply counts exactly the handles the model holds (every
 * new id a request named is bound, the failed ones to placeholders, until released;
 * not counted once a graph was replayed, which binds again what its requests bound;
 * under a session-memory quota a placeholder may find no room, and the model asks which
 * ids the daemon knows: never more than it named); the daemon never closes the
 * connection. Marker bytes after a Sync open the rest: 0xA5 loses the connection and
 * resumes the session on a new one (its handles, graphs and counts the same); 0xA6 a
 * transfer (TransferAccept; TransferSend to the daemon itself, where the push lands in
 * this session, to a closed loopback port, to an address --transfer-peers refuses, over
 * TLS to a plain listener); 0xA7 a process group (GroupCreate through the store or by
 * exchange, GroupConnect, AllReduce; a rank whose peers never come answers TIMEOUT after
 * --group-timeout); 0xA8 a TransferSend or GroupCreate in flight as the connection
 * drops, answered on the resumed one; 0xA9 (MODE_EXPIRE) one in flight at the end, the
 * session held and left to expire. A first byte 0xF5 sets the mode with the second
 * (--session-memory, so that GraphEnd meets RESOURCE_EXHAUSTED; MODE_EXPIRE). Graphs
 * replay a request or two per turn of the daemon's loop (--replay-slice), at a few queued
 * (--max-inflight). At the end the session says Goodbye (or is left to expire) and the
 * daemon must hold no session, no memory and no tensor. A broken invariant aborts.
 * Built as a corpus replayer for `make test` (TDD_FUZZ_REPLAY) and as a libFuzzer
 * target for `make fuzz-session`; tests/fuzz/make_corpus.py writes its seed programs. */
#include <arpa/inet.h>
#include <ftw.h>
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

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* The group store goes with the process (a rendezvous cut short leaves keys in it). */
static void remove_store(void)
{
    if (tdd_cfg.group_store_dir[0])
        nftw(tdd_cfg.group_store_dir, remove_one, 8, FTW_DEPTH | FTW_PHYS);
}

static void tune(tdd_config *c)
{
    c->cpu_devices = 1;
    c->device_lanes = 2;
    c->memory_cap = 256u << 20;
    /* A replay yields after every request or two, and waits at a few queued: the paths
     * a long replay takes (server_read.c's yields) on every graph the programs replay. */
    c->replay_slice = 64;
    c->max_inflight = 4;
    /* Pushes may reach loopback only: the daemon itself (a real target: the push lands in
     * the issuing session), or a port nobody listens on. Groups rendezvous in a private
     * store, and a rank that never comes times out in a second. */
    snprintf(c->transfer_peers, sizeof c->transfer_peers, "127.0.0.1/32");
    c->transfer_timeout_s = 1;
    c->transfer_window_s = 2;
    char dir[] = "/tmp/tdd-fuzz-groups-XXXXXX";
    if (mkdtemp(dir)) {
        snprintf(c->group_store_dir, sizeof c->group_store_dir, "%s", dir);
        atexit(remove_store);
    }
    c->group_timeout_s = 1;
}

/* A loopback port that takes connections (the kernel's backlog) and never answers: a
 * push there waits for the Hello's answer until --transfer-timeout. Drained before
 * each input. */
static int silent_fd = -1, silent_port;

static void silent_listen(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof sa;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    silent_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (silent_fd < 0 || bind(silent_fd, (struct sockaddr *)&sa, sizeof sa) ||
        listen(silent_fd, 64) || getsockname(silent_fd, (struct sockaddr *)&sa, &len)) {
        fprintf(stderr, "fuzz_session: no silent listener\n");
        exit(1);
    }
    silent_port = ntohs(sa.sin_port);
}

static void silent_drain(void)
{
    for (int fd; (fd = accept(silent_fd, NULL, NULL)) >= 0;)
        close(fd);
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

enum { KIND_TENSOR = 1, KIND_GRADS, KIND_OPTIM, KIND_GRAPH, KIND_GROUP };
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
    uint64_t last_recv; /* the id of the last answer received whole */
    /* the last request's frame, to send again after a resume that had not read it */
    uint8_t *frame;
    size_t frame_len;
    /* capabilities this session issued (TransferAccept): a push that the daemon answers
     * Ok binds their handle, a failed one binds nothing */
    struct {
        uint8_t key[16];
        uint64_t handle;
    } caps[4];
    int ncaps;
    /* the addresses a GroupCreate (exchange) answered, for a GroupConnect */
    uint8_t addr[2][64];
    size_t addr_len[2];
    size_t naddr;
    unsigned mode; /* the input's first byte, when a mode byte (fuzz_mode) */
    input in;
} client;

/* An input whose first byte is 0xF5 sets a mode with its second byte: bits 0-1 the
 * session's memory (--session-memory: none, 2, 16 or 128 KiB, so that uploads, ops and the
 * graphs recorded meet RESOURCE_EXHAUSTED), bit 2 a resume window of 1 s and an end that
 * drops the connection instead of Goodbye, a request possibly in flight: the held
 * session is left to expire. */
#define MODE_QUOTA(m) ((m)&3u)
#define MODE_EXPIRE 4u

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
    free(c->frame);
    c->frame = plen ? NULL : buf; /* (only payload-less requests are sent again) */
    c->frame_len = plen ? 0 : TD_FRAME_HEADER_SIZE + len;
    if (plen)
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
        if (r->id > c->last_recv)
            c->last_recv = r->id;
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

/* Under a session-memory quota the placeholder of a failed request's new id takes memory
 * too, and is not bound when the account cannot hold it (the id's uses then answer
 * UNKNOWN_HANDLE): the model cannot tell which, so it asks. Each handle it holds is
 * Described (after a Sync: nothing in flight), and those the daemon does not know are
 * dropped from the model. Returns how many were. */
static int requery(client *c)
{
    int dropped = 0;
    for (int i = 0; i < c->n;) {
        Tensordd__V1__Describe d = TENSORDD__V1__DESCRIBE__INIT;
        d.handle = c->ids[i];
        Request req = TENSORDD__V1__REQUEST__INIT;
        req.body_case = TENSORDD__V1__REQUEST__BODY_DESCRIBE;
        req.describe = &d;
        send_req(c, &req, NULL, 0, true);
        Response *r = await(c, req.id);
        bool unknown = r->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR &&
                       r->error->code == TENSORDD__V1__ERROR_CODE__UNKNOWN_HANDLE;
        tensordd__v1__response__free_unpacked(r, NULL);
        if (unknown) {
            c->ids[i] = c->ids[c->n - 1];
            c->kinds[i] = c->kinds[c->n - 1];
            c->n--;
            dropped++;
        } else
            i++;
    }
    return dropped;
}

/* Stats is answered on the loop in request order: every request before it has been
 * dispatched, so every new id it named is bound (or released). Under a quota, fewer may
 * be (requery); never more. */
static void check_stats(client *c)
{
    for (int pass = 0;; pass++) {
        Tensordd__V1__Stats st = TENSORDD__V1__STATS__INIT;
        Request req = TENSORDD__V1__REQUEST__INIT;
        req.body_case = TENSORDD__V1__REQUEST__BODY_STATS;
        req.stats = &st;
        send_req(c, &req, NULL, 0, true);
        Response *r = await(c, req.id);
        if (r->body_case != TENSORDD__V1__RESPONSE__BODY_STATS)
            broken("Stats not answered with StatsReply");
        uint64_t held = r->stats->handles;
        tensordd__v1__response__free_unpacked(r, NULL);
        if (c->replayed || held == (uint64_t)c->n)
            return;
        if (pass || !MODE_QUOTA(c->mode) || held > (uint64_t)c->n || !requery(c))
            broken("the daemon holds %llu handles, the session bound %d%s",
                   (unsigned long long)held, c->n, pass ? " (after asking)" : "");
    }
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

/* Hello, resumable (a window the session never reaches: it ends with Goodbye, or in
 * MODE_EXPIRE a second, which it is left to run out); with c->token_len, it resumes that
 * session instead, having received the answers up to c->last_recv. Returns the daemon's
 * last_applied on a resume. */
static uint64_t hello(client *c)
{
    Tensordd__V1__Hello h = TENSORDD__V1__HELLO__INIT;
    h.min_version = 1;
    h.max_version = 1;
    h.client_name = (char *)"fuzz_session";
    h.resume_window = c->mode & MODE_EXPIRE ? 1 : 30;
    bool resuming = c->token_len > 0;
    if (resuming) {
        h.resume_token.data = c->token;
        h.resume_token.len = c->token_len;
        h.last_received = c->last_recv;
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
    uint64_t applied = r->hello->last_applied;
    tensordd__v1__response__free_unpacked(r, NULL);
    return applied;
}

/* The connection is lost between two requests: the session is held (or still attached,
 * when the daemon has not seen the close yet: the token takes it over); a new connection
 * resumes it and the program goes on there. Every answer was received, or one is owed:
 * the last request's, in flight (a TransferSend or GroupCreate the daemon may still be
 * working on). The daemon then hands that request to the new connection and answers it
 * there (or sends its kept answer again); one it never read (last_applied short of it)
 * is sent again, with its id. false when the session is not resumable (nothing done). */
static bool lose_and_resume(client *c)
{
    if (!c->token_len || c->resumes >= 4)
        return false;
    c->resumes++;
    uint64_t owed = c->nexpect ? c->expect[0] : 0;
    uint8_t *frame = c->frame;
    size_t frame_len = c->frame_len;
    c->frame = NULL;
    c->nexpect = 0; /* (HelloReply comes first) */
    close(c->fd);
    c->fd = connect_daemon();
    uint64_t applied = hello(c);
    if (owed) {
        if (applied < owed && (!frame || !send_all(c->fd, frame, frame_len)))
            broken("cannot send request #%llu again", (unsigned long long)owed);
        c->expect[c->nexpect++] = owed;
    }
    free(frame);
    return true;
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

/* ---------------------------------------------------------------- transfers, groups */

/* TransferAccept, after a Sync (answered at once, on the loop: no answer owed before it):
 * a capability for a new handle, bound only once a push lands. */
static void do_accept(client *c)
{
    static const Tensordd__V1__DType dts[] = {
        TENSORDD__V1__DTYPE__DTYPE_F32, TENSORDD__V1__DTYPE__DTYPE_I64,
        TENSORDD__V1__DTYPE__DTYPE_BOOL, (Tensordd__V1__DType)99};
    static Tensordd__V1__Device dev_cuda = {
        PROTOBUF_C_MESSAGE_INIT(&tensordd__v1__device__descriptor), (char *)"cuda", 0};
    do_sync(c);
    unsigned b = take(&c->in);
    int64_t shape[2] = {(int64_t)(take(&c->in) % 5), (int64_t)(b >> 6) - 1};
    Tensordd__V1__TransferAccept ta = TENSORDD__V1__TRANSFER_ACCEPT__INIT;
    ta.handle = b % 16 == 15 && c->n ? c->ids[0] : ++c->next_id; /* (a bound one: refused) */
    ta.dtype = dts[(b >> 2) % 4];
    ta.shape = shape;
    ta.n_shape = b & 0x20 ? 2 : 1;
    ta.device = (b >> 4) % 4 == 3 ? &dev_cuda : (b >> 4) % 2 ? &dev_cpu : &dev_ref;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_TRANSFER_ACCEPT;
    req.transfer_accept = &ta;
    send_req(c, &req, NULL, 0, true);
    Response *r = await(c, req.id);
    if (r->body_case == TENSORDD__V1__RESPONSE__BODY_TRANSFER_CAPABILITY &&
        r->transfer_capability->capability.len == 16) {
        int at = c->ncaps < 4 ? c->ncaps++ : (int)(b % 4);
        memcpy(c->caps[at].key, r->transfer_capability->capability.data, 16);
        c->caps[at].handle = ta.handle;
    }
    tensordd__v1__response__free_unpacked(r, NULL);
}

/* TransferSend of a tensor to the daemon itself (the push lands in this session), to a
 * loopback port that accepts and never answers (the push fails after --transfer-timeout,
 * long enough for the connection to drop meanwhile), to one nobody listens on, to an address
 * --transfer-peers refuses, over TLS to a plain listener, or to a malformed endpoint; with one of
 * the session's capabilities, a made-up one, or one of the wrong length. Answered (sync) unless
 * in_flight: then the answer is owed and the caller loses the connection before it comes. Returns
 * the handle an Ok binds (0: none). */
static uint64_t send_transfer(client *c, bool in_flight)
{
    unsigned b = take(&c->in);
    char ep[64];
    switch (b % 8) {
    case 0:
    case 1:
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", fz_port);
        break;
    case 2:
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", silent_port);
        break;
    case 3:
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:1");
        break;
    case 4:
        snprintf(ep, sizeof ep, "tcp://[::1]:%d", fz_port);
        break;
    case 5:
        snprintf(ep, sizeof ep, "tls://127.0.0.1:%d", fz_port);
        break;
    case 6:
        snprintf(ep, sizeof ep, "127.0.0.1:%d", fz_port);
        break;
    default:
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:x");
    }
    uint8_t made_up[16];
    memset(made_up, (int)b, sizeof made_up);
    Tensordd__V1__TransferSend ts = TENSORDD__V1__TRANSFER_SEND__INIT;
    ts.tensor = pick(c, KIND_TENSOR);
    ts.endpoint = ep;
    ts.token = (char *)((b >> 3) % 8 == 7 ? "bad\x01token" : (b >> 3) % 8 == 6 ? "x" : "");
    uint64_t lands = 0;
    unsigned k = (b >> 6) % 4;
    if (k < 3 && c->ncaps) {
        int i = (int)(take(&c->in) % (unsigned)c->ncaps);
        ts.capability.data = c->caps[i].key;
        ts.capability.len = 16;
        if (b % 8 < 2)
            lands = c->caps[i].handle;
    } else {
        ts.capability.data = made_up;
        ts.capability.len = k == 3 ? 16 : 5;
    }
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_TRANSFER_SEND;
    req.transfer_send = &ts;
    send_req(c, &req, NULL, 0, true);
    if (in_flight)
        return lands;
    Response *r = await(c, req.id);
    bool ok = r->body_case == TENSORDD__V1__RESPONSE__BODY_OK;
    tensordd__v1__response__free_unpacked(r, NULL);
    return ok ? lands : 0;
}

/* A pushed capability is spent: a second push with it is refused, and binds nothing. */
static void bound_by_push(client *c, uint64_t handle)
{
    if (!handle)
        return;
    model_bind(c, handle, KIND_TENSOR);
    for (int i = 0; i < c->ncaps; i++)
        if (c->caps[i].handle == handle)
            c->caps[i].handle = 0;
}

/* GroupCreate: through the store (one rank of 1, 2 or 3: the others never come, and it
 * answers TIMEOUT after --group-timeout) or exchanging addresses; bad names, ranks and
 * devices. Binds its id either way (a failed one to a placeholder). Answered unless
 * in_flight. */
static void send_group_create(client *c, bool in_flight)
{
    static const char *names[] = {"fz0", "fz1", "bad name", ""};
    unsigned b = take(&c->in);
    Tensordd__V1__GroupCreate gc = TENSORDD__V1__GROUP_CREATE__INIT;
    gc.group = ++c->next_id;
    gc.name = (char *)names[b % 4];
    unsigned w = (b >> 2) % 8; /* (mostly one rank: the others' wait takes a second) */
    gc.world_size = w == 0 ? 0 : w < 6 ? 1 : w - 4; /* 0: refused */
    gc.rank = (b >> 5) % 2;
    gc.exchange = (b >> 6) & 1;
    gc.device = b >> 7 ? &dev_cpu : &dev_ref;
    Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_GROUP_CREATE;
    req.group_create = &gc;
    send_req(c, &req, NULL, 0, true);
    if (getenv("TDD_FUZZ_TRACE"))
        fprintf(stderr, "fuzz_session:   group '%s' rank %u of %u%s\n", gc.name, gc.rank,
                gc.world_size, gc.exchange ? ", exchange" : "");
    model_bind(c, gc.group, KIND_GROUP);
    if (in_flight)
        return;
    Response *r = await(c, req.id);
    if (r->body_case == TENSORDD__V1__RESPONSE__BODY_GROUP_ADDRESS) {
        c->naddr = r->group_address->n_addresses < 2 ? r->group_address->n_addresses : 2;
        for (size_t i = 0; i < c->naddr; i++) {
            size_t n = r->group_address->addresses[i].len;
            c->addr_len[i] = n < sizeof c->addr[i] ? n : sizeof c->addr[i];
            if (c->addr_len[i])
                memcpy(c->addr[i], r->group_address->addresses[i].data, c->addr_len[i]);
        }
    }
    tensordd__v1__response__free_unpacked(r, NULL);
}

/* GroupConnect with the addresses the last exchange answered (a peer's own, or made up),
 * or AllReduce, Broadcast or AllGather on a group; each answered. */
static void do_group(client *c)
{
    unsigned b = take(&c->in);
    if (b % 4 < 2) {
        send_group_create(c, false);
        return;
    }
    Request req = TENSORDD__V1__REQUEST__INIT;
    if (b % 4 == 2) {
        ProtobufCBinaryData addrs[3];
        size_t n = (b >> 2) % 4;
        for (size_t i = 0; i < n; i++) {
            addrs[i].data = c->addr[i % 2];
            addrs[i].len = i < c->naddr && !((b >> 4) & 1) ? c->addr_len[i] : (b >> 5) % 8;
        }
        Tensordd__V1__GroupConnect gc = TENSORDD__V1__GROUP_CONNECT__INIT;
        gc.group = pick(c, KIND_GROUP);
        gc.addresses = addrs;
        gc.n_addresses = n;
        req.body_case = TENSORDD__V1__REQUEST__BODY_GROUP_CONNECT;
        req.group_connect = &gc;
        sync_point(c, &req);
        return;
    }
    uint64_t t = pick(c, KIND_TENSOR), g = pick(c, KIND_GROUP);
    switch ((b >> 5) % 4) {
    case 2: {
        Tensordd__V1__Broadcast bc = TENSORDD__V1__BROADCAST__INIT;
        bc.group = g;
        bc.root = (b >> 2) % 3;
        bc.tensors = &t;
        bc.n_tensors = (b >> 4) & 1;
        req.body_case = TENSORDD__V1__REQUEST__BODY_BROADCAST;
        req.broadcast = &bc;
        sync_point(c, &req);
        return;
    }
    case 3: {
        Tensordd__V1__AllGather ag = TENSORDD__V1__ALL_GATHER__INIT;
        ag.group = g;
        ag.tensor = t;
        ag.output = ++c->next_id;
        req.body_case = TENSORDD__V1__REQUEST__BODY_ALL_GATHER;
        req.all_gather = &ag;
        sync_point(c, &req);
        model_bind(c, ag.output, KIND_TENSOR);
        return;
    }
    default: {
        Tensordd__V1__AllReduce ar = TENSORDD__V1__ALL_REDUCE__INIT;
        ar.group = g;
        ar.op = (Tensordd__V1__ReduceOp)((b >> 2) % 4);
        ar.tensors = &t;
        ar.n_tensors = (b >> 4) & 1;
        req.body_case = TENSORDD__V1__REQUEST__BODY_ALL_REDUCE;
        req.all_reduce = &ar;
        sync_point(c, &req);
    }
    }
}

static void do_transfer(client *c)
{
    if (take(&c->in) % 2)
        do_accept(c);
    else
        bound_by_push(c, send_transfer(c, false));
}

/* After a Sync, a TransferSend or GroupCreate is sent and the connection lost before its
 * answer; the session resumes on a new connection, where the answer comes. */
static void held_in_flight(client *c)
{
    do_sync(c);
    if (!c->token_len || c->resumes >= 4)
        return;
    uint64_t lands = 0;
    bool transfer = take(&c->in) % 2;
    if (transfer)
        lands = send_transfer(c, true);
    else
        send_group_create(c, true);
    uint64_t id = c->next_req;
    lose_and_resume(c);
    Response *r = await(c, id);
    if (transfer && r->body_case == TENSORDD__V1__RESPONSE__BODY_OK)
        bound_by_push(c, lands);
    tensordd__v1__response__free_unpacked(r, NULL);
}

typedef struct {
    input in;
    unsigned mode;
    atomic_int done;
} job;

static void *run_client(void *arg)
{
    job *j = arg;
    client c = {.in = j->in, .mode = j->mode};
    c.fd = connect_daemon();
    hello(&c);
    bool stop = false;
    for (int steps = 0; more(&c.in) && steps < 200 && !stop; steps++) {
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
            /* (a marker byte, peeked: the programs without one read as before) */
            switch (c.in.n ? c.in.p[0] : 0) {
            case 0xA5:
                take(&c.in);
                lose_and_resume(&c);
                check_stats(&c);
                break;
            case 0xA6:
                take(&c.in);
                do_transfer(&c);
                check_stats(&c);
                break;
            case 0xA7:
                take(&c.in);
                do_group(&c);
                check_stats(&c);
                break;
            case 0xA8:
                take(&c.in);
                held_in_flight(&c);
                check_stats(&c);
                break;
            case 0xA9: /* MODE_EXPIRE: the end, a request in flight, no Goodbye */
                if (!(c.mode & MODE_EXPIRE))
                    break;
                take(&c.in);
                if (take(&c.in) % 2)
                    send_transfer(&c, true);
                else
                    send_group_create(&c, true);
                stop = true;
                break;
            }
        }
    }
    if (!stop) {
        do_sync(&c);
        check_stats(&c);
        if (c.nexpect)
            broken("%d answers never came", c.nexpect);
        if (!(c.mode & MODE_EXPIRE))
            goodbye(&c);
    }
    close(c.fd);
    free(c.frame);
    atomic_store(&j->done, 1);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_start("fuzz_session", tune);
    if (silent_fd < 0)
        silent_listen();
    silent_drain();
    job j = {.in = {data, size}};
    if (size >= 2 && data[0] == 0xF5) { /* a marker, then the mode byte */
        j.mode = data[1];
        j.in.p += 2;
        j.in.n -= 2;
    }
    static const uint64_t quota[] = {0, 2u << 10, 16u << 10, 128u << 10};
    tdd_cfg.session_memory = quota[MODE_QUOTA(j.mode)]; /* (read as a session begins) */
    fz_run("fuzz_session", run_client, &j, &j.done);
    return 0;
}

#ifdef TDD_FUZZ_REPLAY
int main(int argc, char **argv)
{
    return fz_replay(argc, argv, "fuzz_session");
}
#endif
