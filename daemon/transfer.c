/* transfer.c -- daemon-to-daemon transfers: a tensor goes from a source daemon to a target
 * daemon over the source's own connection, never through the client.
 *
 * The target issues a capability (TransferAccept): 16 bytes from getrandom, bound to one
 * new handle of the issuing session, its dtype, shape and device, and expiring after
 * --transfer-window. The client hands it, with the target's endpoint and token, to the
 * source (TransferSend): the source resolves and connects with libuv (on the loop, never
 * blocking it), over TLS for a tls:// endpoint, says Hello with the token as any client
 * would (the target needs no second way in: a capability alone opens nothing, and a
 * token alone binds nothing), and sends TransferPush, whose payload the target's
 * transport lands straight in the new tensor's storage. The handle is bound only once
 * every byte is there; a push that breaks off binds nothing and leaves the issuing
 * session a pending IO error. A capability is spent by its first push, whatever the
 * outcome: a second one is INVALID_ARGUMENT, one past its window TIMEOUT. The
 * TransferSend stays blocked (the source's session reads nothing else) until the
 * target's answer, which it passes on. */
#include "transfer.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "cidr.h"
#include "config.h"
#include "handlers.h"
#include "log.h"
#include "stats.h"
#include "tls.h"

typedef Tensordd__V1__Request Request;

#define CAP_LEN 16
#define PUSH_CHUNK (4u << 20)       /* plaintext bytes per write on plain TCP */
#define PUSH_TLS_CHUNK (256u << 10) /* plaintext encrypted per write */
#define REPLY_MAX (64u << 10)       /* the target's answers: Hello's reply, Ok or an Error */
#define PUSH_INFLIGHT 2
#define WATCH_MS 250

static uint64_t now_ms(void)
{
    return uv_now(uv_default_loop());
}

/* ---------------------------------------------------------------- the target's side */

typedef struct cap {
    uint8_t key[CAP_LEN];
    tdd_session *s; /* the issuer (a reference) */
    uint64_t handle, req_id;
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    tdd_device *dev;
    uint64_t nbytes;
    uint64_t expires_ms;
    bool used;
    struct cap *next;
} cap;

/* Every capability issued and not yet forgotten: a spent or expired one is kept until a
 * window past its expiry, so that a replay is told as one, unless its room is needed
 * (--max-transfers); a session's are forgotten once it ended. */
static cap *caps;
static uint32_t ncaps;

static void cap_free(cap *k)
{
    tdd_session_unref(k->s);
    free(k);
}

static void sweep(void)
{
    uint64_t now = now_ms(), keep = (uint64_t)tdd_cfg.transfer_window_s * 1000;
    for (cap **pp = &caps; *pp;) {
        cap *k = *pp;
        if (now > k->expires_ms + keep || k->s->closed) {
            *pp = k->next;
            ncaps--;
            cap_free(k);
        } else
            pp = &k->next;
    }
}

static bool outstanding(const cap *k, uint64_t now)
{
    return !k->used && now <= k->expires_ms;
}

/* Room for one more capability, of session s: RESOURCE_EXHAUSTED when s holds
 * --max-session-transfers outstanding, or the daemon --max-transfers (the oldest spent or
 * expired one is forgotten to make room: a replay of it is then told as a capability this
 * daemon does not know). */
static int cap_room(const tdd_session *s, td_error *err)
{
    sweep();
    uint64_t now = now_ms();
    uint32_t mine = 0;
    cap **oldest_done = NULL;
    for (cap **pp = &caps; *pp; pp = &(*pp)->next) {
        if ((*pp)->s == s && outstanding(*pp, now))
            mine++;
        if (!outstanding(*pp, now))
            oldest_done = pp; /* (newest first: the last one found is the oldest) */
    }
    if (mine >= tdd_cfg.max_session_transfers)
        return tdd_err_resource(err, "session transfer capabilities", 1, 0,
                                "this session holds %u transfer capabilities outstanding "
                                "(--max-session-transfers)",
                                mine);
    if (ncaps >= tdd_cfg.max_transfers && oldest_done) {
        cap *k = *oldest_done;
        *oldest_done = k->next;
        ncaps--;
        cap_free(k);
    }
    if (ncaps >= tdd_cfg.max_transfers)
        return tdd_err_resource(err, "transfer capabilities", 1, 0,
                                "%u transfer capabilities outstanding (--max-transfers)", ncaps);
    return 0;
}

/* The capability whose key is key: every entry is compared in full, so the time taken
 * says nothing about how much of a guess matched. */
static cap *cap_find(const uint8_t *key)
{
    cap *found = NULL;
    for (cap *k = caps; k; k = k->next) {
        unsigned diff = 0;
        for (int i = 0; i < CAP_LEN; i++)
            diff |= (unsigned)(k->key[i] ^ key[i]);
        if (!diff)
            found = k;
    }
    return found;
}

int tdd_h_transfer_accept(tdd_req *r)
{
    tdd_session *s = r->c->s;
    const Tensordd__V1__TransferAccept *ta = r->req->transfer_accept;
    td_error err;
    int rc = tdd_handle_check_new(s, ta->handle, &err);
    if (!rc)
        tdd_handle_unreserve(s, ta->handle); /* checked now, bound when the bytes arrive */
    if (!rc && (ta->dtype <= 0 || ta->dtype >= (int)TD_DTYPE_COUNT))
        rc = tdd_err_arg(&err, "dtype", "unknown dtype %d", (int)ta->dtype);
    if (!rc && ta->n_shape > TD_MAX_NDIM)
        rc = tdd_err_arg(&err, "shape", "%zu dims, at most %d", ta->n_shape, TD_MAX_NDIM);
    int64_t numel = 0;
    if (!rc && (numel = tdd_shape_numel(ta->shape, (int)ta->n_shape, tdd_cfg.max_numel)) < 0)
        rc = tdd_err_arg(&err, "shape", "negative or too large (limit %lld elements)",
                         (long long)tdd_cfg.max_numel);
    uint64_t nbytes = (uint64_t)numel * td_dtype_size((td_dtype)ta->dtype);
    if (!rc && nbytes > tdd_cfg.max_payload)
        rc = tdd_err_arg(&err, "shape", "%llu bytes, over --max-payload %llu",
                         (unsigned long long)nbytes, (unsigned long long)tdd_cfg.max_payload);
    tdd_device *dev = NULL;
    if (!rc && !(dev = tdd_resolve_device(ta->device, &err)))
        rc = err.code;
    if (!rc && !dev->be->host_memory)
        rc = tdd_err_set(&err, TD_EUNSUPPORTED_OP,
                         "a transfer lands in a host-memory device (cpu, ref), not %s:%d; move "
                         "it there afterwards",
                         dev->be->name, dev->ordinal);
    if (!rc)
        rc = cap_room(s, &err);
    cap *k = NULL;
    if (!rc && !(k = calloc(1, sizeof *k)))
        rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    if (!rc && getrandom(k->key, CAP_LEN, 0) != CAP_LEN)
        rc = tdd_err_set(&err, TD_EINTERNAL, "no random bytes for a capability");
    if (rc) {
        free(k);
        return tdd_answer_error(r, &err);
    }
    k->s = s;
    tdd_session_ref(s);
    k->handle = ta->handle;
    k->req_id = r->req->id;
    k->dtype = (td_dtype)ta->dtype;
    k->ndim = (int)ta->n_shape;
    if (ta->n_shape)
        memcpy(k->shape, ta->shape, ta->n_shape * sizeof(int64_t));
    k->dev = dev;
    k->nbytes = nbytes;
    k->expires_ms = now_ms() + (uint64_t)tdd_cfg.transfer_window_s * 1000;
    k->next = caps;
    caps = k;
    ncaps++;
    Tensordd__V1__Response resp = TENSORDD__V1__RESPONSE__INIT;
    Tensordd__V1__TransferCapability tc = TENSORDD__V1__TRANSFER_CAPABILITY__INIT;
    resp.id = r->req->id;
    resp.body_case = TENSORDD__V1__RESPONSE__BODY_TRANSFER_CAPABILITY;
    resp.transfer_capability = &tc;
    tc.capability.len = CAP_LEN;
    tc.capability.data = k->key;
    tc.expires_ms = tdd_cfg.transfer_window_s * 1000;
    tc.nbytes = nbytes;
    tdd_conn_send(r->c, &resp, NULL, 0, NULL);
    return TDD_DISPATCH_DONE;
}

typedef struct {
    tdd_session *s; /* the issuer (a reference) */
    uint64_t handle, accept_req, push_req;
    tdd_value *v;
} landing;

/* A bool tensor holds 0 or 1 in each byte, as an Upload's must. */
static int bool_bad(const tdd_value *v, td_error *err)
{
    if (v->t.dtype != TD_BOOL)
        return 0;
    const uint8_t *b = tdd_data(&v->t);
    size_t n = (size_t)tdd_numel(&v->t);
    for (size_t i = 0; i < n; i++)
        if (b[i] > 1)
            return tdd_err_arg(err, "payload",
                               "bool payload byte %zu is %u: bool tensors hold 0 or 1", i,
                               (unsigned)b[i]);
    return 0;
}

static void landed(tdd_conn *c, void *arg, int status)
{
    landing *l = arg;
    td_error err;
    if (status) { /* the source's connection closed mid-payload */
        tdd_err_set(
            &err, TD_EIO,
            "the transfer into #%llu broke off: the source daemon's connection closed "
            "before all %llu bytes arrived; nothing was bound",
            (unsigned long long)l->handle,
            (unsigned long long)(tdd_numel(&l->v->t) * (int64_t)td_dtype_size(l->v->t.dtype)));
        err.request_id = l->accept_req;
        tdd_count_error(err.code);
        if (!l->s->closed)
            tdd_session_fail(l->s, &err);
    } else if (l->s->closed) { /* (its capabilities are forgotten with it) */
        tdd_err_arg(&err, "capability",
                    "the session that accepted the transfer ended before the bytes arrived; "
                    "nothing was bound");
        err.request_id = l->push_req;
        tdd_count_error(err.code);
        tdd_conn_send_error(c, l->push_req, &err);
    } else if (bool_bad(l->v, &err)) { /* a pusher is a client: its bytes are checked */
        err.request_id = l->push_req;
        tdd_count_error(err.code);
        tdd_conn_send_error(c, l->push_req, &err);
    } else if (tdd_handle_check_new(l->s, l->handle, &err)) {
        err.request_id = l->push_req;
        tdd_count_error(err.code);
        tdd_conn_send_error(c, l->push_req, &err);
    } else {
        tdd_handle_add(l->s, l->handle, TD_HANDLE_TENSOR, l->v);
        l->v = NULL;
        tdd_conn_send_ok(c, l->push_req);
    }
    tdd_value_unref(l->v);
    tdd_session_unref(l->s);
    free(l);
}

int tdd_h_transfer_push(tdd_req *r)
{
    tdd_conn *c = r->c;
    const Tensordd__V1__TransferPush *tp = r->req->transfer_push;
    td_error err;
    int rc = 0;
    cap *k = NULL;
    sweep();
    if (tp->capability.len != CAP_LEN || !(k = cap_find(tp->capability.data)))
        rc = tdd_err_arg(&err, "capability", "not a capability this daemon issued (or forgotten)");
    else if (k->used)
        rc = tdd_err_arg(&err, "capability", "the capability was used already (replayed)");
    else if (now_ms() > k->expires_ms)
        rc = tdd_err_set(&err, TD_ETIMEOUT,
                         "the capability expired %llu ms ago (--transfer-window %us)",
                         (unsigned long long)(now_ms() - k->expires_ms), tdd_cfg.transfer_window_s);
    if (k && !rc)
        k->used = true; /* spent, whatever follows */
    /* (sweep forgot an ended session's capabilities already: belt and braces) */
    if (!rc && k->s->closed)
        rc = tdd_err_arg(&err, "capability", "the session that accepted the transfer has ended");
    if (!rc && r->payload_len != k->nbytes)
        rc = tdd_err_arg(&err, "payload", "payload has %llu bytes, the capability is for %llu",
                         (unsigned long long)r->payload_len, (unsigned long long)k->nbytes);
    tdd_value *v = NULL;
    landing *l = NULL;
    if (!rc) {
        v = tdd_value_new(k->dev);
        l = calloc(1, sizeof *l);
        if (!v || !l)
            rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    }
    if (!rc) {
        v->t.dtype = k->dtype;
        v->t.ndim = k->ndim;
        if (k->ndim)
            memcpy(v->t.shape, k->shape, (size_t)k->ndim * sizeof(int64_t));
        tdd_set_contiguous(&v->t);
        /* charged to the issuer: the tensor becomes its */
        if (!(v->t.st = tdd_storage_alloc(k->dev, (size_t)k->nbytes, k->s->acct, k->s->id, &err)))
            rc = TD_ERESOURCE_EXHAUSTED;
    }
    if (rc) {
        tdd_value_unref(v);
        free(l);
        tdd_answer_error(r, &err);
        c->pdst = NULL; /* the payload is read and dropped */
        c->pdone = NULL;
        return TDD_DISPATCH_PAYLOAD;
    }
    l->s = k->s;
    tdd_session_ref(k->s);
    l->handle = k->handle;
    l->accept_req = k->req_id;
    l->push_req = r->req->id;
    l->v = v;
    c->pdst = tdd_data(&v->t);
    c->pdone = landed;
    c->parg = l;
    return TDD_DISPATCH_PAYLOAD;
}

/* ---------------------------------------------------------------- the source's side */

enum { P_RESOLVE, P_CONNECT, P_HANDSHAKE, P_HELLO, P_PUSH, P_DONE };

typedef struct push {
    tdd_session *s; /* a reference; s->inflight counts this push until it is decided */
    uint64_t req_id;
    tdd_value *v;        /* the tensor (a reference) */
    const uint8_t *data; /* its bytes: its storage, or tmp */
    uint8_t *tmp;        /* a contiguous copy of a strided tensor */
    uint64_t nbytes, sent;
    char endpoint[300], host[256], port[8];
    bool tls;
    char token[1024];
    uint8_t cap[CAP_LEN];
    int state;
    uint64_t queued; /* payload bytes handed to the socket (sent: written) */
    int writing;     /* payload chunks being written (PUSH_INFLIGHT at most) */
    uint64_t moved_ms;
    uv_getaddrinfo_t gai;
    uv_connect_t conn_req;
    uv_tcp_t tcp;
    uv_timer_t timer;
    int open; /* libuv handles and requests not yet called back */
    tdd_tls *t;
    uint8_t rbuf[64 * 1024]; /* what the socket gave (ciphertext under TLS) */
    uint8_t *reply;          /* the target's answers, plaintext, until a frame is whole */
    size_t reply_len;
    bool resolving;      /* the getaddrinfo request is out */
    bool in_handler;     /* being set up inside TransferSend: a verdict needs no wake-up */
    bool decided, taken; /* the verdict is in; the handler has answered with it */
    int rc;
    td_error err;
    struct push *next;
} push;

static push *pushes;
static tdd_tls_ctx *client_tls;

typedef struct {
    uv_write_t w;
    push *p;
    bool chunk; /* a payload chunk: the next follows when it is written */
    size_t len;
    max_align_t bytes[];
} push_write;

static void push_maybe_free(push *p)
{
    if (p->open || !p->taken)
        return;
    for (push **pp = &pushes; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    tdd_value_unref(p->v);
    tdd_session_unref(p->s);
    tdd_tls_free(p->t);
    free(p->tmp);
    free(p->reply);
    free(p);
}

static void handle_closed(uv_handle_t *h)
{
    push *p = h->data;
    p->open--;
    push_maybe_free(p);
}

/* The verdict: the connection goes, and the blocked TransferSend is called again. */
static void decide(push *p, int rc, const td_error *err)
{
    if (p->decided)
        return;
    p->decided = true;
    p->state = P_DONE;
    p->rc = rc;
    if (rc)
        p->err = *err;
    if (p->tcp.data && !uv_is_closing((uv_handle_t *)&p->tcp))
        uv_close((uv_handle_t *)&p->tcp, handle_closed);
    if (!uv_is_closing((uv_handle_t *)&p->timer))
        uv_close((uv_handle_t *)&p->timer, handle_closed);
    if (p->resolving)
        uv_cancel((uv_req_t *)&p->gai);
    tdd_session *s = p->s;
    s->inflight--;
    if (s->closed) { /* nobody waits for it */
        p->taken = true;
        push_maybe_free(p);
        return;
    }
    if (!p->in_handler)
        tdd_reply_done(s, 0, false, 0, NULL, NULL, true);
}

static void fail(push *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void fail(push *p, int code, const char *fmt, ...)
{
    if (p->decided)
        return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    td_error err;
    tdd_err_set(&err, code, "push to %s: %s", p->endpoint, msg);
    decide(p, code, &err);
}

static void send_next_chunk(push *p);

static void after_write(uv_write_t *w, int status)
{
    push_write *pw = (push_write *)w;
    push *p = pw->p;
    p->open--;
    if (status == 0) {
        p->moved_ms = now_ms();
        if (pw->chunk)
            p->sent += pw->len;
    }
    bool chunk = pw->chunk;
    free(pw);
    if (status < 0 && status != UV_ECANCELED)
        fail(p, TD_EIO, "the target's connection failed after %llu of %llu bytes: %s",
             (unsigned long long)p->sent, (unsigned long long)p->nbytes, uv_strerror(status));
    if (chunk)
        p->writing--;
    if (p->decided) {
        push_maybe_free(p);
        return;
    }
    if (chunk)
        send_next_chunk(p);
}

/* Queues bytes for the socket: copied (owned) or, on plain TCP, written from where they
 * are (a payload chunk). Under TLS they are encrypted first. 0, or -1 (p decided). */
static int out(push *p, const void *buf, size_t len, bool chunk)
{
    const void *src = buf;
    size_t n = len;
    if (p->t) {
        if (len && tdd_tls_write(p->t, buf, len)) {
            fail(p, TD_EIO, "TLS: %s", tdd_tls_why(p->t));
            return -1;
        }
        n = tdd_tls_out_pending(p->t);
        src = NULL;
    }
    bool copy = p->t || !chunk;
    push_write *pw = malloc(sizeof *pw + (copy ? n : 0));
    if (!pw) {
        fail(p, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return -1;
    }
    pw->p = p;
    pw->chunk = chunk;
    pw->len = len;
    if (p->t)
        n = tdd_tls_out_take(p->t, pw->bytes, n);
    else if (copy)
        memcpy(pw->bytes, src, n);
    uv_buf_t b = uv_buf_init(copy ? (char *)pw->bytes : (char *)(uintptr_t)src, (unsigned)n);
    if (n == 0 && !chunk) {
        free(pw);
        return 0;
    }
    int e = uv_write(&pw->w, (uv_stream_t *)&p->tcp, &b, 1, after_write);
    if (e) {
        free(pw);
        fail(p, TD_EIO, "writing: %s", uv_strerror(e));
        return -1;
    }
    p->open++;
    return 0;
}

static void send_next_chunk(push *p)
{
    /* Two chunks queued, so the socket has the next while the loop hears of the last.
     * When all are written, the target's answer decides. */
    while (!p->decided && p->state == P_PUSH && p->writing < PUSH_INFLIGHT &&
           p->queued < p->nbytes) {
        uint64_t n = p->nbytes - p->queued, cap_n = p->t ? PUSH_TLS_CHUNK : PUSH_CHUNK;
        if (n > cap_n)
            n = cap_n;
        p->writing++;
        p->queued += n;
        if (out(p, p->data + p->queued - n, (size_t)n, true))
            return;
    }
}

static int send_frame(push *p, Request *req, uint64_t plen)
{
    size_t mlen = tensordd__v1__request__get_packed_size(req);
    uint8_t *f = malloc(TD_FRAME_HEADER_SIZE + mlen);
    if (!f) {
        fail(p, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return -1;
    }
    td_frame_encode(f, (uint32_t)mlen, plen);
    tensordd__v1__request__pack(req, f + TD_FRAME_HEADER_SIZE);
    int rc = out(p, f, TD_FRAME_HEADER_SIZE + mlen, false);
    free(f);
    return rc;
}

static void send_hello(push *p)
{
    Request req = TENSORDD__V1__REQUEST__INIT;
    Tensordd__V1__Hello h = TENSORDD__V1__HELLO__INIT;
    req.id = 1;
    req.body_case = TENSORDD__V1__REQUEST__BODY_HELLO;
    req.hello = &h;
    h.min_version = h.max_version = TD_PROTOCOL_VERSION;
    h.token = p->token;
    h.client_name = (char *)"tensordd transfer";
    p->state = P_HELLO;
    send_frame(p, &req, 0);
}

static void send_push(push *p)
{
    Request req = TENSORDD__V1__REQUEST__INIT;
    Tensordd__V1__TransferPush tp = TENSORDD__V1__TRANSFER_PUSH__INIT;
    req.id = 2;
    req.want_reply = true;
    req.body_case = TENSORDD__V1__REQUEST__BODY_TRANSFER_PUSH;
    req.transfer_push = &tp;
    tp.capability.len = CAP_LEN;
    tp.capability.data = p->cap;
    p->state = P_PUSH;
    if (send_frame(p, &req, p->nbytes) == 0)
        send_next_chunk(p);
}

/* One whole answer of the target. */
static void on_answer(push *p, const Tensordd__V1__Response *resp)
{
    if (resp->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR) {
        const Tensordd__V1__Error *e = resp->error;
        int code = -(int)e->code;
        if (code >= 0 || code <= -TD_ERRNO_COUNT)
            code = TD_EPROTOCOL_ERROR;
        if (p->decided)
            return;
        td_error err;
        if (code == TD_EINVALID_ARGUMENT &&
            e->detail_case == TENSORDD__V1__ERROR__DETAIL_INVALID_ARGUMENT && e->invalid_argument)
            tdd_err_arg(&err, e->invalid_argument->argument ? e->invalid_argument->argument : "",
                        "push to %s: the target answered: %s", p->endpoint,
                        e->message ? e->message : "");
        else
            tdd_err_set(&err, code, "push to %s: the target answered: %s", p->endpoint,
                        e->message ? e->message : "");
        decide(p, code, &err);
        return;
    }
    if (p->state == P_HELLO && resp->body_case == TENSORDD__V1__RESPONSE__BODY_HELLO) {
        send_push(p);
        return;
    }
    if (p->state == P_PUSH && resp->body_case == TENSORDD__V1__RESPONSE__BODY_OK && resp->id == 2 &&
        p->sent == p->nbytes) {
        tdd_debug("pushed %llu bytes to %s", (unsigned long long)p->nbytes, p->endpoint);
        decide(p, 0, NULL);
        return;
    }
    fail(p, TD_EPROTOCOL_ERROR, "an unexpected answer (body %d) from the target",
         (int)resp->body_case);
}

/* Plaintext from the target: whole frames are answered. */
static void on_plain(push *p, const uint8_t *buf, size_t n)
{
    if (p->reply_len + n > REPLY_MAX) {
        fail(p, TD_EPROTOCOL_ERROR, "the target's answer is over %u bytes", REPLY_MAX);
        return;
    }
    if (!p->reply && !(p->reply = malloc(REPLY_MAX))) {
        fail(p, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return;
    }
    memcpy(p->reply + p->reply_len, buf, n);
    p->reply_len += n;
    while (!p->decided && p->reply_len >= TD_FRAME_HEADER_SIZE) {
        td_frame_limits lim = {REPLY_MAX, 0};
        td_frame_header h;
        if (td_frame_decode(p->reply, &lim, &h)) {
            fail(p, TD_EPROTOCOL_ERROR, "a bad frame from the target");
            return;
        }
        size_t whole = TD_FRAME_HEADER_SIZE + h.msg_len;
        if (p->reply_len < whole)
            return;
        Tensordd__V1__Response *resp =
            tensordd__v1__response__unpack(NULL, h.msg_len, p->reply + TD_FRAME_HEADER_SIZE);
        if (!resp) {
            fail(p, TD_EPROTOCOL_ERROR, "an undecodable answer from the target");
            return;
        }
        on_answer(p, resp);
        tensordd__v1__response__free_unpacked(resp, NULL);
        memmove(p->reply, p->reply + whole, p->reply_len - whole);
        p->reply_len -= whole;
    }
}

static void tls_progress(push *p)
{
    if (p->state == P_HANDSHAKE) {
        int h = tdd_tls_handshake(p->t);
        if (h < 0) {
            fail(p, TD_EUNAUTHENTICATED, "TLS: %s", tdd_tls_why(p->t));
            return;
        }
        if (out(p, NULL, 0, false))
            return;
        if (h == 0)
            return;
        send_hello(p);
    }
    uint8_t plain[16 * 1024];
    while (!p->decided) {
        ssize_t k = tdd_tls_read(p->t, plain, sizeof plain);
        if (k > 0) {
            on_plain(p, plain, (size_t)k);
            continue;
        }
        if (k == TDD_TLS_EOF)
            fail(p, TD_EIO, "the target closed the TLS session after %llu of %llu bytes",
                 (unsigned long long)p->sent, (unsigned long long)p->nbytes);
        else if (k == TDD_TLS_ERROR)
            fail(p, TD_EIO, "TLS: %s", tdd_tls_why(p->t));
        break;
    }
    if (!p->decided && tdd_tls_out_pending(p->t))
        out(p, NULL, 0, false);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    push *p = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)p->rbuf, sizeof p->rbuf);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    push *p = st->data;
    (void)buf;
    if (p->decided || nread == 0)
        return;
    if (nread < 0) {
        fail(p, TD_EIO, "the target's connection %s after %llu of %llu bytes",
             nread == UV_EOF ? "closed" : uv_strerror((int)nread), (unsigned long long)p->sent,
             (unsigned long long)p->nbytes);
        return;
    }
    p->moved_ms = now_ms();
    if (!p->t) {
        on_plain(p, p->rbuf, (size_t)nread);
        return;
    }
    if (tdd_tls_feed(p->t, p->rbuf, (size_t)nread)) {
        fail(p, TD_ERESOURCE_EXHAUSTED, "TLS: %s", tdd_tls_why(p->t));
        return;
    }
    tls_progress(p);
}

static void on_connect(uv_connect_t *req, int status)
{
    push *p = req->data;
    p->open--;
    if (p->decided) {
        push_maybe_free(p);
        return;
    }
    if (status < 0) {
        fail(p, TD_EIO, "cannot connect: %s", uv_strerror(status));
        return;
    }
    p->moved_ms = now_ms();
    uv_tcp_nodelay(&p->tcp, 1);
    int e = uv_read_start((uv_stream_t *)&p->tcp, on_alloc, on_read);
    if (e) {
        fail(p, TD_EIO, "cannot read: %s", uv_strerror(e));
        return;
    }
    if (!p->t) {
        send_hello(p);
        return;
    }
    p->state = P_HANDSHAKE;
    tls_progress(p);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    push *p = req->data;
    p->open--;
    p->resolving = false;
    if (p->decided || status < 0) {
        if (!p->decided)
            fail(p, TD_EIO, "cannot resolve %s: %s", p->host, uv_strerror(status));
        uv_freeaddrinfo(res);
        push_maybe_free(p);
        return;
    }
    if (!tdd_cidr_match(tdd_cfg.transfer_peers, res->ai_addr)) {
        char addr[64] = "?";
        uv_ip_name(res->ai_addr, addr, sizeof addr);
        fail(p, TD_EINVALID_ARGUMENT, "%s (%s) is not among --transfer-peers", p->host, addr);
        uv_freeaddrinfo(res);
        push_maybe_free(p);
        return;
    }
    p->moved_ms = now_ms();
    p->state = P_CONNECT;
    int e = uv_tcp_init(uv_default_loop(), &p->tcp);
    if (!e) {
        p->tcp.data = p;
        p->open++; /* closed by decide */
        p->conn_req.data = p;
        e = uv_tcp_connect(&p->conn_req, &p->tcp, res->ai_addr, on_connect);
        if (!e)
            p->open++;
    }
    uv_freeaddrinfo(res);
    if (e)
        fail(p, TD_EIO, "cannot connect: %s", uv_strerror(e));
}

static void on_watch(uv_timer_t *t)
{
    push *p = t->data;
    uint64_t limit = (uint64_t)tdd_cfg.transfer_timeout_s * 1000;
    if (!p->decided && now_ms() - p->moved_ms > limit)
        fail(p, TD_ETIMEOUT, "no progress for %us (--transfer-timeout) after %llu of %llu bytes",
             tdd_cfg.transfer_timeout_s, (unsigned long long)p->sent,
             (unsigned long long)p->nbytes);
}

/* "tcp://HOST:PORT", "tls://HOST:PORT" ("[v6]:PORT" too) into p's host, port and tls. */
static int parse_endpoint(push *p, const char *ep, td_error *err)
{
    const char *rest;
    if (!strncmp(ep, "tcp://", 6))
        rest = ep + 6;
    else if (!strncmp(ep, "tls://", 6)) {
        rest = ep + 6;
        p->tls = true;
    } else
        return tdd_err_arg(err, "endpoint", "not tcp://HOST:PORT or tls://HOST:PORT: '%.64s'", ep);
    const char *colon = strrchr(rest, ':');
    const char *h = rest, *he = colon;
    if (*rest == '[') {
        const char *close = strchr(rest, ']');
        if (!close || close + 1 != colon)
            return tdd_err_arg(err, "endpoint", "a bad [address]: '%.64s'", ep);
        h = rest + 1;
        he = close;
    }
    size_t hl = colon ? (size_t)(he - h) : 0, pl = colon ? strlen(colon + 1) : 0;
    if (!colon || !hl || hl >= sizeof p->host || !pl || pl >= sizeof p->port ||
        strspn(colon + 1, "0123456789") != pl)
        return tdd_err_arg(err, "endpoint", "not HOST:PORT: '%.64s'", ep);
    memcpy(p->host, h, hl);
    p->host[hl] = 0;
    memcpy(p->port, colon + 1, pl + 1);
    snprintf(p->endpoint, sizeof p->endpoint, "%s", ep);
    return 0;
}

static push *find_push(tdd_session *s, uint64_t req_id)
{
    for (push *p = pushes; p; p = p->next)
        if (p->s == s && p->req_id == req_id && !p->taken)
            return p;
    return NULL;
}

/* s ends: a push decided while no request of s could collect its verdict (its session
 * held for resume, whose window then ran out) is freed with its tensor; one not yet
 * decided is freed by decide, which finds s closed. */
static void session_closed(tdd_session *s)
{
    for (push *p = pushes, *next; p; p = next) {
        next = p->next;
        if (p->s == s && p->decided && !p->taken) {
            p->taken = true;
            push_maybe_free(p);
        }
    }
}

/* The answer to TransferSend, once its push is decided. */
static int answer(tdd_req *r, push *p)
{
    p->taken = true;
    int rc = p->rc;
    td_error err = p->err;
    push_maybe_free(p);
    if (rc)
        return tdd_answer_error(r, &err);
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}

int tdd_h_transfer_send(tdd_req *r)
{
    tdd_session *s = r->c->s;
    const Tensordd__V1__TransferSend *ts = r->req->transfer_send;
    tdd_session_on_close(session_closed);
    push *p = find_push(s, r->req->id);
    if (p)
        return p->decided ? answer(r, p) : TDD_DISPATCH_BLOCK;
    td_error err;
    if (!tdd_cidr_any(tdd_cfg.transfer_peers)) {
        tdd_err_set(&err, TD_EUNSUPPORTED_OP,
                    "pushes to other daemons are off on this daemon (start it with "
                    "--transfer-peers naming the addresses they may reach)");
        return tdd_answer_error(r, &err);
    }
    tdd_value *v;
    if (tdd_value_get(s, ts->tensor, &v, &err))
        return tdd_answer_error(r, &err);
    if (tdd_value_poisoned(v)) {
        tdd_err_poisoned(&err, v);
        return tdd_answer_error(r, &err);
    }
    if (!v->dev->be->host_memory) {
        tdd_err_set(&err, TD_EUNSUPPORTED_OP,
                    "a transfer is pushed from a host-memory device (cpu, ref), not %s:%d; move "
                    "it there first",
                    v->dev->be->name, v->dev->ordinal);
        return tdd_answer_error(r, &err);
    }
    if (ts->capability.len != CAP_LEN) {
        tdd_err_arg(&err, "capability", "%zu bytes, a capability has %d", ts->capability.len,
                    CAP_LEN);
        return tdd_answer_error(r, &err);
    }
    if (!ts->token || strlen(ts->token) >= sizeof p->token) {
        tdd_err_arg(&err, "token", "longer than %zu bytes", sizeof p->token - 1);
        return tdd_answer_error(r, &err);
    }
    /* The token goes out before the target has shown it speaks tensordd: no byte of it may
     * mean something to a line-based service (a daemon's token is one line of text). */
    for (const char *t = ts->token; *t; t++)
        if ((unsigned char)*t < 0x20 || *t == 0x7f) {
            tdd_err_arg(&err, "token", "byte %zu is a control character (0x%02x)",
                        (size_t)(t - ts->token), (unsigned)(unsigned char)*t);
            return tdd_answer_error(r, &err);
        }
    if (!(p = calloc(1, sizeof *p))) {
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    if (parse_endpoint(p, ts->endpoint ? ts->endpoint : "", &err)) {
        free(p);
        return tdd_answer_error(r, &err);
    }
    if (p->tls && !client_tls) {
        char why[300];
        if (!(client_tls = tdd_tls_client_ctx_new(tdd_cfg.transfer_ca, tdd_cfg.tls_cert,
                                                  tdd_cfg.tls_key, why, sizeof why))) {
            free(p);
            tdd_err_set(&err, TD_EIO, "no TLS for the push: %s", why);
            return tdd_answer_error(r, &err);
        }
    }
    if (p->tls && !(p->t = tdd_tls_client_new(client_tls, p->host))) {
        free(p);
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of memory for a TLS session");
        return tdd_answer_error(r, &err);
    }
    p->nbytes = (uint64_t)tdd_numel(&v->t) * td_dtype_size(v->t.dtype);
    if (tdd_is_contiguous(&v->t))
        p->data = tdd_data(&v->t);
    else if (!(p->tmp = malloc(p->nbytes ? (size_t)p->nbytes : 1))) {
        tdd_tls_free(p->t);
        free(p);
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory for a contiguous copy");
        return tdd_answer_error(r, &err);
    } else {
        tdd_copy_contiguous(&v->t, p->tmp);
        p->data = p->tmp;
    }
    memcpy(p->token, ts->token, strlen(ts->token) + 1);
    memcpy(p->cap, ts->capability.data, CAP_LEN);
    p->s = s;
    tdd_session_ref(s);
    p->v = v;
    tdd_value_ref(v);
    p->req_id = r->req->id;
    p->moved_ms = now_ms();
    p->next = pushes;
    pushes = p;
    s->inflight++; /* the session's connection waits for it as for queued work */
    p->in_handler = true;
    uv_loop_t *loop = uv_default_loop();
    uv_timer_init(loop, &p->timer);
    p->timer.data = p;
    p->open++;
    uv_timer_start(&p->timer, on_watch, WATCH_MS, WATCH_MS);
    p->gai.data = p;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    int e = uv_getaddrinfo(loop, &p->gai, on_resolved, p->host, p->port, &hints);
    if (e)
        fail(p, TD_EIO, "cannot resolve %s: %s", p->host, uv_strerror(e));
    else {
        p->open++;
        p->resolving = true;
    }
    p->in_handler = false;
    return p->decided ? answer(r, p) : TDD_DISPATCH_BLOCK;
}
