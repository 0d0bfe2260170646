/* dispatch.c -- the request table: one row per request type, and the checks every
 * request shares done once around its handler (as redis's processCommand): Hello
 * first, payloads only where the row allows one, synchronising requests wait for
 * the session's queued work and report its pending error first, and a request that
 * failed binds every new id it names to a poisoned placeholder of its kind. */
#include "dispatch.h"

#include "graph.h"
#include "group.h"
#include "handlers.h"
#include "log.h"
#include "stats.h"
#include "transfer.h"

typedef Tensordd__V1__Request Request;

enum {
    /* Waits for the session's queued work, then answers its pending error, if any,
     * instead of running (the request fails with it). */
    REQ_SYNC = 1u << 0,
    /* Always gets exactly one reply; the others only when they ask (want_reply). */
    REQ_ANSWERED = 1u << 1,
    /* May carry a raw payload after the message. */
    REQ_PAYLOAD = 1u << 2,
    /* Accepted before Hello. */
    REQ_BEFORE_HELLO = 1u << 3,
    /* The connection closes after it, whatever its answer. */
    REQ_CLOSES = 1u << 4,
    /* While a graph is recorded: recorded (replayed later), or only run (a read). Any
     * other request fails then and breaks the recording. */
    REQ_RECORDED = 1u << 5,
    REQ_READ = 1u << 6,
};

/* Fills ids with the handles a request names as new (at most TDD_MAX_OP_OUTPUTS). */
typedef size_t (*new_ids_fn)(const Request *req, uint64_t *ids);
/* Calls fn on the field of each handle a request reads, in place (a replay puts its
 * inputs there). */
typedef void (*read_ids_fn)(Request *req, tdd_id_fn fn, void *arg);

typedef struct {
    int (*handler)(tdd_req *r);
    unsigned flags;
    td_handle_kind creates; /* the kind of the handles new_ids names */
    new_ids_fn new_ids;     /* NULL: the request names no new handle */
    read_ids_fn read_ids;   /* NULL: the request reads no handle */
} request_row;

/* A request that names one new handle: its field. */
#define ONE_ID(fn, body, field)                                                                    \
    static size_t fn(const Request *req, uint64_t *ids)                                            \
    {                                                                                              \
        ids[0] = req->body->field;                                                                 \
        return 1;                                                                                  \
    }

ONE_ID(ids_upload, upload, handle)

static size_t ids_op(const Request *req, uint64_t *ids)
{
    size_t n = 0;
    for (size_t i = 0; i < req->op->n_outputs && i < TDD_MAX_OP_OUTPUTS; i++)
        ids[n++] = req->op->outputs[i];
    return n;
}

ONE_ID(ids_to_device, to_device, output)
ONE_ID(ids_backward, backward, grads)
ONE_ID(ids_grad, grad, output)
ONE_ID(ids_grad_remove, grad_remove, output)
ONE_ID(ids_optimizer_create, optimizer_create, handle)
ONE_ID(ids_graph_end, graph_end, graph)
ONE_ID(ids_group_create, group_create, group)
ONE_ID(ids_all_gather, all_gather, output)

/* The handles a request reads: one field, or a repeated one's elements. */
#define READS_1(fn, body, field)                                                                   \
    static void fn(Request *req, tdd_id_fn f, void *arg)                                           \
    {                                                                                              \
        f(&req->body->field, arg);                                                                 \
    }
#define EACH(body, field)                                                                          \
    do {                                                                                           \
        for (size_t i_ = 0; i_ < req->body->n_##field; i_++)                                       \
            f(&req->body->field[i_], arg);                                                         \
    } while (0)

READS_1(reads_download, download, handle)
READS_1(reads_to_device, to_device, input)
READS_1(reads_describe, describe, handle)
READS_1(reads_optimizer_state, optimizer_state, optimizer)
READS_1(reads_group_connect, group_connect, group)
READS_1(reads_transfer_send, transfer_send, tensor)

static void reads_op(Request *req, tdd_id_fn f, void *arg)
{
    EACH(op, inputs);
}

/* (grad_output 0, ones like the loss, is no handle: f sees it and leaves it) */
static void reads_backward(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->backward->loss, arg);
    f(&req->backward->grad_output, arg);
    EACH(backward, inputs);
}

static void reads_grad(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->grad->grads, arg);
    f(&req->grad->tensor, arg);
}

static void reads_grad_remove(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->grad_remove->grads, arg);
    f(&req->grad_remove->tensor, arg);
}

static void reads_grad_replace(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->grad_replace->grads, arg);
    f(&req->grad_replace->tensor, arg);
    f(&req->grad_replace->grad, arg);
}

static void reads_optimizer_create(Request *req, tdd_id_fn f, void *arg)
{
    EACH(optimizer_create, params);
}

static void reads_optimizer_step(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->optimizer_step->optimizer, arg);
    f(&req->optimizer_step->grads, arg);
}

static void reads_optimizer_load_state(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->optimizer_load_state->optimizer, arg);
    EACH(optimizer_load_state, buffers);
}

static void reads_graph_begin(Request *req, tdd_id_fn f, void *arg)
{
    EACH(graph_begin, inputs);
}

static void reads_graph_end(Request *req, tdd_id_fn f, void *arg)
{
    EACH(graph_end, inputs);
}

static void reads_replay(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->replay->graph, arg);
    EACH(replay, inputs);
}

static void reads_all_reduce(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->all_reduce->group, arg);
    EACH(all_reduce, tensors);
    f(&req->all_reduce->grads, arg);
}

static void reads_broadcast(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->broadcast->group, arg);
    EACH(broadcast, tensors);
}

static void reads_all_gather(Request *req, tdd_id_fn f, void *arg)
{
    f(&req->all_gather->group, arg);
    f(&req->all_gather->tensor, arg);
}

#define ROW(body) [TENSORDD__V1__REQUEST__BODY_##body]
#define SYNC (REQ_SYNC | REQ_ANSWERED)
#define REC REQ_RECORDED

static const request_row rows[] = {
    ROW(HELLO) = {tdd_h_hello, REQ_ANSWERED | REQ_BEFORE_HELLO, TD_HANDLE_NONE, NULL},
    ROW(LIST_DEVICES) = {tdd_h_list_devices, REQ_ANSWERED | REQ_READ, TD_HANDLE_NONE, NULL},
    ROW(UPLOAD) = {tdd_h_upload, REQ_PAYLOAD, TD_HANDLE_TENSOR, ids_upload},
    ROW(DOWNLOAD) = {tdd_h_download, SYNC | REQ_READ, TD_HANDLE_NONE, NULL, reads_download},
    ROW(OP) = {tdd_h_op, REC, TD_HANDLE_TENSOR, ids_op, reads_op},
    ROW(RELEASE) = {tdd_h_release, REC, TD_HANDLE_NONE, NULL},
    ROW(TO_DEVICE) = {tdd_h_to_device, REC, TD_HANDLE_TENSOR, ids_to_device, reads_to_device},
    ROW(SYNC) = {tdd_h_sync, SYNC | REQ_READ, TD_HANDLE_NONE, NULL},
    ROW(STATS) = {tdd_h_stats, REQ_ANSWERED | REQ_READ, TD_HANDLE_NONE, NULL},
    ROW(LIST_OPS) = {tdd_h_list_ops, REQ_ANSWERED | REQ_READ, TD_HANDLE_NONE, NULL},
    ROW(DESCRIBE) = {tdd_h_describe, REQ_ANSWERED | REQ_READ, TD_HANDLE_NONE, NULL, reads_describe},
    ROW(BACKWARD) = {tdd_h_backward, SYNC | REC, TD_HANDLE_GRADIENTS, ids_backward, reads_backward},
    ROW(GRAD) = {tdd_h_grad, SYNC | REC, TD_HANDLE_TENSOR, ids_grad, reads_grad},
    ROW(GRAD_REMOVE) = {tdd_h_grad_remove, SYNC | REC, TD_HANDLE_TENSOR, ids_grad_remove,
                        reads_grad_remove},
    ROW(GRAD_REPLACE) = {tdd_h_grad_replace, SYNC | REC, TD_HANDLE_NONE, NULL, reads_grad_replace},
    ROW(SET_GRAD_MODE) = {tdd_h_set_grad_mode, REC, TD_HANDLE_NONE, NULL},
    ROW(OPTIMIZER_CREATE) = {tdd_h_optimizer_create, 0, TD_HANDLE_OPTIMIZER, ids_optimizer_create,
                             reads_optimizer_create},
    ROW(OPTIMIZER_STEP) = {tdd_h_optimizer_step, SYNC | REC, TD_HANDLE_NONE, NULL,
                           reads_optimizer_step},
    ROW(GOODBYE) = {tdd_h_goodbye, SYNC | REQ_CLOSES, TD_HANDLE_NONE, NULL},
    /* OptimizerState binds its new ids all or none, and is answered: no placeholders. */
    ROW(OPTIMIZER_STATE) = {tdd_h_optimizer_state, SYNC, TD_HANDLE_NONE, NULL,
                            reads_optimizer_state},
    ROW(OPTIMIZER_LOAD_STATE) = {tdd_h_optimizer_load_state, SYNC, TD_HANDLE_NONE, NULL,
                                 reads_optimizer_load_state},
    ROW(GRAPH_BEGIN) = {tdd_h_graph_begin, 0, TD_HANDLE_NONE, NULL, reads_graph_begin},
    /* GraphEnd waits for the recorded work itself (a failure in it fails the graph) and
     * ends the recording whatever the verdict. */
    ROW(GRAPH_END) = {tdd_h_graph_end, REQ_ANSWERED | REQ_READ, TD_HANDLE_GRAPH, ids_graph_end,
                      reads_graph_end},
    ROW(REPLAY) = {tdd_h_replay, 0, TD_HANDLE_NONE, NULL, reads_replay},
    /* Process groups (group.c): each queues one job on the group's device and blocks until
     * it ran (every rank joined, or the collective finished), then answers its verdict. */
    ROW(GROUP_CREATE) = {tdd_h_group_create, SYNC, TD_HANDLE_GROUP, ids_group_create},
    ROW(ALL_REDUCE) = {tdd_h_all_reduce, SYNC, TD_HANDLE_NONE, NULL, reads_all_reduce},
    ROW(BROADCAST) = {tdd_h_broadcast, SYNC, TD_HANDLE_NONE, NULL, reads_broadcast},
    ROW(ALL_GATHER) = {tdd_h_all_gather, SYNC, TD_HANDLE_TENSOR, ids_all_gather, reads_all_gather},
    ROW(GROUP_CONNECT) = {tdd_h_group_connect, SYNC, TD_HANDLE_NONE, NULL, reads_group_connect},
    /* Daemon-to-daemon transfers (transfer.c): TransferSend blocks until its push is
     * decided; TransferPush comes from another daemon, its payload the tensor's bytes. */
    ROW(TRANSFER_ACCEPT) = {tdd_h_transfer_accept, REQ_ANSWERED, TD_HANDLE_NONE, NULL},
    ROW(TRANSFER_SEND) = {tdd_h_transfer_send, SYNC, TD_HANDLE_NONE, NULL, reads_transfer_send},
    ROW(TRANSFER_PUSH) = {tdd_h_transfer_push, REQ_ANSWERED | REQ_PAYLOAD, TD_HANDLE_NONE, NULL},
};

/* The body's field name ("graph_begin"), for messages. */
static const char *row_name(const Request *req)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(
        &tensordd__v1__request__descriptor, (unsigned)req->body_case);
    return f ? f->name : "an unknown request";
}

static const request_row *row_of(const Request *req)
{
    size_t b = (size_t)req->body_case;
    return b < sizeof rows / sizeof rows[0] && rows[b].handler ? &rows[b] : NULL;
}

int tdd_dispatch_check_table(void)
{
    const ProtobufCMessageDescriptor *d = &tensordd__v1__request__descriptor;
    int missing = 0;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        if (f->id >= sizeof rows / sizeof rows[0] || !rows[f->id].handler) {
            tdd_error("request table: no row for Request.%s (field %u)", f->name, f->id);
            missing++;
        }
    }
    return missing ? -1 : 0;
}

/* A Backward or OptimizerStep sent pipelined: synchronising on the daemon's side (it
 * waits for the session's queued work and does not run after a pending error), but
 * answered by nothing, as a replay's requests are: its failure, or the pending error
 * it met, stays the session's pending error for the client's next synchronising
 * request, and its new ids are bound poisoned. A training step then costs the client
 * one write and one read (the loss), not a round trip per request. */
static bool pipelined(const Request *req)
{
    if (req->body_case == TENSORDD__V1__REQUEST__BODY_BACKWARD)
        return req->backward && req->backward->pipelined;
    if (req->body_case == TENSORDD__V1__REQUEST__BODY_OPTIMIZER_STEP)
        return req->optimizer_step && req->optimizer_step->pipelined;
    return false;
}

/* The connection closes: the error is told now, whether or not the request wanted a
 * reply (a pending error would never be read). */
static int refuse(tdd_conn *c, const Request *req, const char *why)
{
    td_error err;
    tdd_err_set(&err, TD_EPROTOCOL_ERROR, "%s", why);
    tdd_count_error(err.code);
    tdd_conn_send_error(c, req->id, &err);
    return TDD_DISPATCH_CLOSE;
}

/* After a failed request: placeholders for the new ids it left unbound, so the client's
 * Release of each succeeds and a use says POISONED naming the origin. */
static void bind_failed(tdd_conn *c, const request_row *row, const Request *req,
                        const td_error *err)
{
    uint64_t ids[TDD_MAX_OP_OUTPUTS];
    size_t n = row->new_ids ? row->new_ids(req, ids) : 0;
    for (size_t i = 0; i < n && c->s && !c->s->closed; i++)
        tdd_handle_bind_failed(c->s, ids[i], row->creates, err);
}

int tdd_dispatch(tdd_conn *c, Request *req, uint64_t payload_len)
{
    const request_row *row = row_of(req);
    if (payload_len && !(row && (row->flags & REQ_PAYLOAD)))
        return refuse(c, req, "only Upload carries a payload");
    if (!c->hello_done && !(row && (row->flags & REQ_BEFORE_HELLO)))
        return refuse(c, req, "the first request must be Hello");
    tdd_req r = {.c = c, .req = req, .payload_len = payload_len, .answered = true};
    if (!row) {
        td_error err;
        tdd_err_set(&err, TD_EPROTOCOL_ERROR, "request without a known body");
        return tdd_answer_error(&r, &err);
    }
    bool quiet = (row->flags & REQ_SYNC) && c->s && !c->s->quiet && pipelined(req);
    r.answered = !quiet && (row->flags & REQ_ANSWERED) != 0;
    if (quiet)
        c->s->quiet = true; /* (cleared again below, whatever the path) */
    int rc;
    /* Hello and Goodbye keep their meaning while recording (a second Hello is a protocol
     * error; Goodbye ends the session, recording and all). */
    if (c->s && c->s->capture &&
        !(row->flags & (REQ_RECORDED | REQ_READ | REQ_CLOSES | REQ_BEFORE_HELLO))) {
        td_error err;
        tdd_err_arg(&err, "request", "%s cannot be recorded in a graph (GraphEnd first)",
                    row_name(req));
        tdd_graph_break(c->s, &err);
        rc = tdd_answer_error(&r, &err);
        if (payload_len) { /* an Upload's bytes are read and dropped */
            c->pdst = NULL;
            c->pdone = NULL;
            rc = TDD_DISPATCH_PAYLOAD;
        }
        goto done;
    }
    if ((row->flags & REQ_SYNC) && !c->blocked_ran) {
        if (c->s->inflight) {
            if (quiet)
                c->s->quiet = false;
            return TDD_DISPATCH_BLOCK;
        }
        if (tdd_report_pending(&r)) { /* quiet: it stays pending, the request fails */
            rc = (row->flags & REQ_CLOSES) ? TDD_DISPATCH_CLOSE : TDD_DISPATCH_DONE;
            goto done;
        }
    }
    /* A handler that queued work and returned BLOCK is called again, once that work is
     * done, to answer (an OptimizerStep): the checks above are not repeated. */
    if (!c->blocked_ran && c->s && c->s->capture && (row->flags & REQ_RECORDED))
        tdd_graph_record(c->s, req);
    c->blocked_ran = false;
    rc = row->handler(&r);
    if (rc == TDD_DISPATCH_BLOCK) {
        if (quiet && c->s)
            c->s->quiet = false;
        c->blocked_ran = true;
        return rc;
    }
done:
    if (r.failed)
        bind_failed(c, row, req, &r.err);
    if (quiet && c->s)
        c->s->quiet = false;
    return rc;
}

void tdd_dispatch_read_ids(Request *req, tdd_id_fn fn, void *arg)
{
    const request_row *row = row_of(req);
    if (row && row->read_ids)
        row->read_ids(req, fn, arg);
}

typedef struct {
    uint64_t id;
    bool found;
} id_search;

static void find_id(uint64_t *id, void *arg)
{
    id_search *q = arg;
    q->found |= *id == q->id;
}

/* Whether req reads the handle id. */
static bool reads(Request *req, uint64_t id)
{
    id_search q = {id, false};
    tdd_dispatch_read_ids(req, find_id, &q);
    return q.found;
}

size_t tdd_dispatch_new_ids(const Request *req, uint64_t *ids)
{
    const request_row *row = row_of(req);
    return row && row->new_ids ? row->new_ids(req, ids) : 0;
}

int tdd_dispatch_replayed(tdd_conn *c, Request *req, bool first)
{
    const request_row *row = row_of(req);
    tdd_session *s = c->s;
    if (!row || !(row->flags & REQ_RECORDED)) /* a recording holds no other kind */
        return TDD_DISPATCH_DONE;
    tdd_req r = {.c = c, .req = req};
    /* The client's handles name the latest replay's values: the ids the graph's run
     * before bound are released, and may be bound again. */
    uint64_t ids[TDD_MAX_OP_OUTPUTS];
    size_t n = row->new_ids ? row->new_ids(req, ids) : 0;
    for (size_t i = 0; first && i < n; i++) {
        td_error ignored;
        /* (one the request also reads, a replay's input given the graph's own output,
         * stays bound until the new value is: tdd_handle_check_new allows it) */
        if (tdd_handle_find(s, ids[i]) && !reads(req, ids[i]))
            tdd_handle_release(s, ids[i], &ignored);
    }
    int rc = TDD_DISPATCH_BLOCK;
    if ((row->flags & REQ_SYNC) && !c->blocked_ran) {
        if (s->inflight)
            return rc;
        if (tdd_report_pending(&r)) { /* quiet: the error stays the session's */
            rc = TDD_DISPATCH_DONE;
            goto done;
        }
    }
    s->rebind = ids;
    s->n_rebind = n;
    c->blocked_ran = false;
    rc = row->handler(&r);
    s->n_rebind = 0;
    if (rc == TDD_DISPATCH_BLOCK) {
        c->blocked_ran = true;
        return rc;
    }
done:
    if (r.failed) {
        s->rebind = ids; /* the failed binds take the same ids */
        s->n_rebind = n;
        bind_failed(c, row, req, &r.err);
        s->n_rebind = 0;
    }
    return rc;
}
