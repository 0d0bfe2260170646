/* graph.c -- graphs: a session's requests recorded once (GraphBegin .. GraphEnd) and
 * replayed with new inputs (Replay), so that a training step is one message.
 *
 * A recording is the packed requests as they came, each also run as usual. A replay
 * unpacks them one at a time, puts the replay's inputs in place of GraphBegin's, and
 * hands each to dispatch's own path (tdd_dispatch_replayed) with the session quiet: the
 * checks, handlers, poisoning and first-error rule are those of requests sent one by
 * one, only nothing is answered. A synchronising request of the graph (Backward,
 * OptimizerStep) blocks the replay, as it would block the connection, until the
 * session's queued work is done; the replay resumes where it stopped. */
#include "graph.h"

#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "dispatch.h"
#include "log.h"

typedef Tensordd__V1__Request Request;

typedef struct {
    uint8_t *msg;
    size_t len;
} recorded;

/* What a replay's input must match. */
typedef struct {
    uint64_t id;
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    const tdd_device *dev;
} graph_input;

typedef struct tdd_graph {
    long refs;
    /* What the graph keeps (itself, its inputs, its requests and their table) is charged
     * to its session's memory account (--session-memory) while it lives. */
    tdd_account *acct;
    uint64_t charged;
    recorded *reqs;
    size_t n, cap, bytes;
    graph_input *in;
    size_t nin;
    bool broken; /* a request that cannot be recorded came: GraphEnd fails with err */
    td_error err;
    /* The replay in progress (the connection blocked inside it), or none. */
    size_t at;
    uint64_t *with; /* its inputs, in place of in[i].id */
    uint64_t req_id;
    Request *cur;     /* the request being replayed, kept across a BLOCK */
    bool cur_first;   /* cur has not been dispatched yet */
    bool cur_blocked; /* cur's handler ran and waits for the work it queued */
} tdd_graph;

static void replay_end(tdd_graph *g)
{
    if (g->cur)
        tensordd__v1__request__free_unpacked(g->cur, NULL);
    g->cur = NULL;
    free(g->with);
    g->with = NULL;
}

static void graph_unref(void *obj)
{
    tdd_graph *g = obj;
    if (--g->refs > 0)
        return;
    replay_end(g);
    for (size_t i = 0; i < g->n; i++)
        free(g->reqs[i].msg);
    free(g->reqs);
    free(g->in);
    tdd_account_credit(g->acct, g->charged);
    tdd_account_unref(g->acct);
    free(g);
}

static int graph_charge(tdd_graph *g, uint64_t nbytes, td_error *err)
{
    int rc = tdd_account_charge(g->acct, nbytes, err);
    if (!rc)
        g->charged += nbytes;
    return rc;
}

void tdd_graph_break(tdd_session *s, const td_error *err)
{
    tdd_graph *g = s->capture;
    if (g && !g->broken) {
        g->broken = true;
        g->err = *err;
    }
}

void tdd_graph_record(tdd_session *s, const Request *req)
{
    tdd_graph *g = s->capture;
    if (g->broken)
        return;
    size_t len = tensordd__v1__request__get_packed_size(req);
    if (g->bytes + len > tdd_cfg.max_graph_bytes) {
        td_error err;
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED,
                    "the graph's requests exceed --max-graph-bytes (%llu bytes)",
                    (unsigned long long)tdd_cfg.max_graph_bytes);
        tdd_graph_break(s, &err);
        return;
    }
    td_error err;
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 32;
        if (graph_charge(g, (cap - g->cap) * sizeof(recorded), &err))
            goto refused;
        recorded *r = realloc(g->reqs, cap * sizeof *r);
        if (!r) {
            g->charged -= (cap - g->cap) * sizeof(recorded);
            tdd_account_credit(g->acct, (cap - g->cap) * sizeof(recorded));
            goto oom;
        }
        g->reqs = r;
        g->cap = cap;
    }
    /* the request as kept: its bytes and the allocator's header and rounding */
    uint64_t cost = (uint64_t)len + 16;
    if (graph_charge(g, cost, &err))
        goto refused;
    uint8_t *msg = malloc(len ? len : 1);
    if (!msg) {
        g->charged -= cost;
        tdd_account_credit(g->acct, cost);
        goto oom;
    }
    tensordd__v1__request__pack(req, msg);
    g->reqs[g->n++] = (recorded){msg, len};
    g->bytes += len;
    return;
refused: /* the session's memory cannot hold the graph: GraphEnd fails with why */
    tdd_graph_break(s, &err);
    return;
oom:
    tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory recording the graph");
    tdd_graph_break(s, &err);
}

int tdd_h_graph_begin(tdd_req *r)
{
    static bool registered;
    if (!registered) {
        tdd_handle_set_free_fn(TD_HANDLE_GRAPH, graph_unref);
        registered = true;
    }
    tdd_session *s = r->c->s;
    const Tensordd__V1__GraphBegin *gb = r->req->graph_begin;
    td_error err;
    if (s->capture) {
        tdd_err_arg(&err, "graph_begin", "a graph is being recorded already (GraphEnd first)");
        return tdd_answer_error(r, &err);
    }
    tdd_graph *g = calloc(1, sizeof *g);
    graph_input *in = calloc(gb->n_inputs ? gb->n_inputs : 1, sizeof *in);
    if (!g || !in) {
        free(g);
        free(in);
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    for (size_t i = 0; i < gb->n_inputs; i++) {
        tdd_value *v;
        int rc = tdd_value_get(s, gb->inputs[i], &v, &err);
        if (rc) {
            free(in);
            free(g);
            return tdd_answer_error(r, &err);
        }
        in[i] = (graph_input){
            .id = gb->inputs[i], .dtype = v->t.dtype, .ndim = v->t.ndim, .dev = v->dev};
        memcpy(in[i].shape, v->t.shape, sizeof in[i].shape);
    }
    g->refs = 1;
    g->in = in;
    g->nin = gb->n_inputs;
    g->acct = s->acct;
    s->acct->refs++; /* a graph may outlive its session briefly (a replay's reference) */
    if (graph_charge(g, sizeof *g + (gb->n_inputs ? gb->n_inputs : 1) * sizeof *in, &err)) {
        graph_unref(g);
        return tdd_answer_error(r, &err);
    }
    s->capture = g;
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}

static int cmp_id(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The ids g's recorded requests name as new handles, sorted (*n of them; NULL with *n 0
 * when there are none or memory runs out: then nothing is refused for it). */
static uint64_t *graph_new_ids(const tdd_graph *g, size_t *n)
{
    uint64_t *all = NULL;
    size_t k = 0, cap = 0;
    for (size_t i = 0; i < g->n; i++) {
        Request *q = tensordd__v1__request__unpack(NULL, g->reqs[i].len, g->reqs[i].msg);
        if (!q)
            continue;
        uint64_t ids[TDD_MAX_OP_OUTPUTS];
        size_t m = tdd_dispatch_new_ids(q, ids);
        tensordd__v1__request__free_unpacked(q, NULL);
        if (k + m > cap) {
            size_t ncap = cap ? 2 * cap : 64;
            while (ncap < k + m)
                ncap *= 2;
            uint64_t *na = realloc(all, ncap * sizeof *na);
            if (!na)
                break;
            all = na;
            cap = ncap;
        }
        memcpy(all + k, ids, m * sizeof *ids);
        k += m;
    }
    if (k)
        qsort(all, k, sizeof *all, cmp_id);
    *n = k;
    return all;
}

/* GraphEnd's inputs, after GraphBegin's: each a live tensor the graph did not bind, named
 * once. */
static int add_inputs(tdd_session *s, tdd_graph *g, const Tensordd__V1__GraphEnd *ge, td_error *err)
{
    if (!ge->n_inputs)
        return 0;
    size_t nin = g->nin + ge->n_inputs;
    if (graph_charge(g, ge->n_inputs * sizeof *g->in, err))
        return err->code;
    graph_input *in = realloc(g->in, nin * sizeof *in);
    if (!in)
        return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    g->in = in;
    size_t nnew;
    uint64_t *bound = graph_new_ids(g, &nnew);
    int rc = 0;
    for (size_t i = 0; i < ge->n_inputs && !rc; i++) {
        uint64_t id = ge->inputs[i];
        tdd_value *v;
        if ((rc = tdd_value_get(s, id, &v, err)))
            break;
        for (size_t k = 0; k < g->nin && !rc; k++)
            if (g->in[k].id == id)
                rc = tdd_err_arg(err, "inputs", "handle %llu is an input of the graph already",
                                 (unsigned long long)id);
        if (!rc && nnew && bsearch(&id, bound, nnew, sizeof *bound, cmp_id))
            rc = tdd_err_arg(err, "inputs",
                             "handle %llu is bound by the graph's own requests (an input is "
                             "a tensor live before GraphBegin)",
                             (unsigned long long)id);
        if (rc)
            break;
        in[g->nin] = (graph_input){.id = id, .dtype = v->t.dtype, .ndim = v->t.ndim, .dev = v->dev};
        memcpy(in[g->nin].shape, v->t.shape, sizeof in[g->nin].shape);
        g->nin++;
    }
    free(bound);
    return rc;
}

int tdd_h_graph_end(tdd_req *r)
{
    tdd_session *s = r->c->s;
    const Tensordd__V1__GraphEnd *ge = r->req->graph_end;
    td_error err;
    /* Synchronising (docs/protocol.md), handled here rather than by the generic path,
     * which would skip this handler on a pending error and leave the recording on. */
    if (s->inflight)
        return TDD_DISPATCH_BLOCK;
    tdd_graph *g = s->capture;
    s->capture = NULL;
    /* The session's pending error first: a refused request put its own there. */
    if (!tdd_report_pending(r)) {
        int rc;
        if (!g)
            rc = tdd_err_arg(&err, "graph_end", "no graph is being recorded (GraphBegin first)");
        else if (g->broken) {
            err = g->err;
            rc = err.code;
        } else if (!(rc = add_inputs(s, g, ge, &err)))
            rc = tdd_handle_check_new(s, ge->graph, &err);
        if (rc)
            tdd_answer_error(r, &err);
    }
    if (r->failed) {
        if (g)
            graph_unref(g);
        return TDD_DISPATCH_DONE; /* the generic path binds a failed placeholder */
    }
    tdd_handle_add(s, ge->graph, TD_HANDLE_GRAPH, g);
    tdd_debug("session %llu: graph #%llu recorded, %zu requests, %zu inputs",
              (unsigned long long)s->id, (unsigned long long)ge->graph, g->n, g->nin);
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}

static void remap(uint64_t *id, void *arg)
{
    const tdd_graph *g = arg;
    for (size_t i = 0; i < g->nin; i++)
        if (*id == g->in[i].id) {
            *id = g->with[i];
            return;
        }
}

static bool is_input(const tdd_graph *g, uint64_t id)
{
    for (size_t i = 0; i < g->nin; i++)
        if (id == g->in[i].id)
            return true;
    return false;
}

/* The replay's inputs in place of the recorded ones, wherever the request table says a
 * request reads a handle. A recorded Release of an input is dropped: the replay's inputs
 * remain the client's. */
static void substitute(tdd_graph *g, Request *q)
{
    tdd_dispatch_read_ids(q, remap, g);
    if (q->body_case == TENSORDD__V1__REQUEST__BODY_RELEASE) {
        size_t k = 0;
        for (size_t i = 0; i < q->release->n_handles; i++)
            if (!is_input(g, q->release->handles[i]))
                q->release->handles[k++] = q->release->handles[i];
        q->release->n_handles = k;
    }
}

/* Every input present, a tensor, and like the recorded one. */
static int check_inputs(tdd_session *s, const tdd_graph *g, const Tensordd__V1__Replay *rp,
                        td_error *err)
{
    if (rp->n_inputs != g->nin)
        return tdd_err_arg(err, "inputs", "the graph was recorded with %zu input(s), %zu given",
                           g->nin, rp->n_inputs);
    for (size_t i = 0; i < g->nin; i++) {
        tdd_value *v;
        int rc = tdd_value_get(s, rp->inputs[i], &v, err);
        if (rc)
            return rc;
        const graph_input *w = &g->in[i];
        /* typed details: the recorded input is the target, the replay's the one offered */
        if (v->t.dtype != w->dtype)
            return tdd_err_dtypes(err, w->dtype, v->t.dtype,
                                  "replay input %zu is %s, the graph was recorded with %s", i,
                                  td_dtype_name(v->t.dtype), td_dtype_name(w->dtype));
        if (v->t.ndim != w->ndim ||
            memcmp(v->t.shape, w->shape, (size_t)w->ndim * sizeof w->shape[0]))
            return tdd_err_shape(err, w->shape, w->ndim, v->t.shape, v->t.ndim,
                                 "replay input %zu has another shape than the graph's input", i);
        if (v->dev != w->dev)
            return tdd_err_devices(
                err, v->dev->be == w->dev->be ? TD_EDEVICE_MISMATCH : TD_EBACKEND_MISMATCH, w->dev,
                v->dev, (uint32_t)i, (uint32_t)i,
                "replay input %zu is on %s, the graph's input was on %s", i, v->dev->label,
                w->dev->label);
    }
    return 0;
}

int tdd_h_replay(tdd_req *r)
{
    tdd_conn *c = r->c;
    tdd_session *s = c->s;
    tdd_graph *g = s->replaying;
    if (!g) { /* its first call (a later one resumes a blocked replay) */
        const Tensordd__V1__Replay *rp = r->req->replay;
        td_error err;
        int rc = tdd_handle_get(s, rp->graph, TD_HANDLE_GRAPH, (void **)&g, &err);
        if (!rc)
            rc = check_inputs(s, g, rp, &err);
        if (!rc && !(g->with = malloc((g->nin ? g->nin : 1) * sizeof *g->with)))
            rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        if (rc)
            return tdd_answer_error(r, &err);
        if (g->nin) /* rp->inputs is NULL when there are none */
            memcpy(g->with, rp->inputs, g->nin * sizeof *g->with);
        g->refs++;
        g->at = 0;
        g->req_id = r->req->id;
        s->replaying = g;
    }
    int rc = TDD_DISPATCH_DONE;
    uint64_t spent = 0; /* recorded bytes run in this turn of the loop */
    s->quiet = true;
    while (g->at < g->n) {
        /* A replay is charged as the requests it expands into would be: at most
         * --replay-slice of them per turn of the loop, and none while the session has
         * --max-inflight queued (the server calls it again then). */
        if (!g->cur && (spent >= tdd_cfg.replay_slice || s->inflight >= tdd_cfg.max_inflight)) {
            rc = TDD_DISPATCH_YIELD;
            break;
        }
        if (!g->cur) {
            spent += g->reqs[g->at].len + 16;
            const recorded *q = &g->reqs[g->at];
            g->cur = tensordd__v1__request__unpack(NULL, q->len, q->msg);
            if (!g->cur) { /* it was packed here: cannot happen short of memory */
                g->at++;
                continue;
            }
            substitute(g, g->cur);
            g->cur->id = g->req_id; /* errors name the Replay */
            g->cur->want_reply = false;
            g->cur_first = true;
            g->cur_blocked = false;
        }
        c->blocked_ran = g->cur_blocked;
        rc = tdd_dispatch_replayed(c, g->cur, g->cur_first);
        g->cur_first = false;
        g->cur_blocked = c->blocked_ran;
        if (rc == TDD_DISPATCH_BLOCK || s->closed)
            break;
        tensordd__v1__request__free_unpacked(g->cur, NULL);
        g->cur = NULL;
        g->at++;
    }
    s->quiet = false;
    if ((rc == TDD_DISPATCH_BLOCK || rc == TDD_DISPATCH_YIELD) && !s->closed)
        return rc;
    s->replaying = NULL;
    replay_end(g);
    graph_unref(g);
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}
