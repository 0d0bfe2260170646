/* reply.c -- answers to requests: errors, Ok and tensor replies, and the end of queued
 * work, written through the transport's operations (handed down by the server). */
#include "reply.h"

#include <stdlib.h>

#include "exec_op.h"
#include "resume.h"
#include "stats.h"
#include "wire.h"

static tdd_transport transport;

/* A resumable session whose connection is gone (held): an answer due now is kept for the
 * client to get on its next connection (resume.c) instead of being dropped. */
static void keep_detached(tdd_session *s, uint64_t req_id, int rc, const td_error *err,
                          const tdd_value *v)
{
    uint8_t small[TDD_WIRE_SMALL_MAX];
    if (rc) {
        size_t n;
        uint8_t *msg = tdd_wire_error_packed(req_id, err, &n);
        if (!msg)
            return;
        tdd_resume_keep(s, req_id, msg, n, NULL, 0, NULL);
        free(msg);
    } else if (v) {
        tdd_resume_keep(s, req_id, small, tdd_wire_tensor(small, req_id, v), NULL, 0, NULL);
    } else {
        tdd_resume_keep(s, req_id, small, tdd_wire_ok(small, req_id), NULL, 0, NULL);
    }
}

void tdd_reply_done(tdd_session *s, uint64_t req_id, bool want_reply, int rc, td_error *err,
                    const tdd_value *reply_value, bool kick)
{
    tdd_conn *c = s->closed ? NULL : s->conn;
    if (!c && !s->closed && s->resume && want_reply) {
        if (rc) {
            err->request_id = req_id;
            tdd_count_error(err->code);
        }
        keep_detached(s, req_id, rc, err, reply_value);
        return;
    }
    if (rc) {
        err->request_id = req_id;
        tdd_count_error(err->code);
        if (want_reply && c)
            tdd_conn_send_error(c, req_id, err);
        else if (!s->closed)
            tdd_session_fail(s, err);
    } else if (want_reply && c) {
        if (reply_value)
            tdd_send_tensor(c, req_id, reply_value, NULL, 0, NULL);
        else
            tdd_conn_send_ok(c, req_id);
    }
    if (c && kick)
        transport.kick(c);
}

void tdd_reply_init(const tdd_transport *t)
{
    transport = *t;
    tdd_exec_op_set_done(tdd_reply_done);
}

static void note_failure(tdd_req *r, const td_error *err)
{
    if (!r->failed) {
        r->err = *err;
        r->failed = true;
    }
}

int tdd_answer_error(tdd_req *r, td_error *err)
{
    const Tensordd__V1__Request *req = r->req;
    err->request_id = req->id;
    tdd_count_error(err->code);
    note_failure(r, err);
    if ((req->want_reply || r->answered) && !(r->c->s && r->c->s->quiet))
        tdd_conn_send_error(r->c, req->id, err);
    else
        tdd_session_fail(r->c->s, err);
    return TDD_DISPATCH_DONE;
}

void tdd_answer_ok(tdd_req *r)
{
    if (r->req->want_reply || r->answered)
        tdd_conn_send_ok(r->c, r->req->id);
}

int tdd_report_pending(tdd_req *r)
{
    tdd_session *s = r->c->s;
    if (!s->has_err)
        return 0;
    note_failure(r, &s->err); /* the request it answers fails with it */
    if (s->quiet)
        return 1; /* a replayed request: the error stays pending for the client */
    s->has_err = false;
    tdd_conn_send_error(r->c, r->req->id, &s->err);
    return 1;
}

/* A resumable session keeps a copy of its last answer (HelloReply aside). */
static void keep_packed(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                        tdd_storage *hold)
{
    if (!c->s || !c->s->resume || !r->id || r->body_case == TENSORDD__V1__RESPONSE__BODY_HELLO)
        return;
    size_t n = protobuf_c_message_get_packed_size(&r->base);
    uint8_t *msg = malloc(n ? n : 1);
    if (!msg)
        return;
    protobuf_c_message_pack(&r->base, msg);
    tdd_resume_keep(c->s, r->id, msg, n, payload, plen, hold);
    free(msg);
}

void tdd_conn_send(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                   tdd_storage *hold)
{
    if (c->s && c->s->quiet)
        return; /* a replayed request's answer */
    keep_packed(c, r, payload, plen, hold);
    transport.send(c, r, payload, plen, hold);
}

void tdd_conn_send_error(tdd_conn *c, uint64_t id, const td_error *err)
{
    if (c->s && c->s->quiet)
        return;
    tdd_wire_error w;
    Tensordd__V1__Response r = TENSORDD__V1__RESPONSE__INIT;
    r.id = id;
    r.body_case = TENSORDD__V1__RESPONSE__BODY_ERROR;
    r.error = tdd_wire_error_fill(&w, err, id);
    keep_packed(c, &r, NULL, 0, NULL);
    transport.send(c, &r, NULL, 0, NULL);
}

void tdd_conn_send_ok(tdd_conn *c, uint64_t id)
{
    if (c->s && c->s->quiet)
        return;
    uint8_t msg[16];
    size_t mlen = tdd_wire_ok(msg, id);
    if (c->s && c->s->resume)
        tdd_resume_keep(c->s, id, msg, mlen, NULL, 0, NULL);
    transport.send_encoded(c, msg, mlen, NULL, 0, NULL);
}

void tdd_send_tensor(tdd_conn *c, uint64_t req_id, const tdd_value *v, const void *payload,
                     uint64_t plen, tdd_storage *hold)
{
    if (c->s && c->s->quiet)
        return;
    uint8_t msg[TDD_WIRE_SMALL_MAX];
    size_t mlen = tdd_wire_tensor(msg, req_id, v);
    if (c->s && c->s->resume)
        tdd_resume_keep(c->s, req_id, msg, mlen, payload, plen, hold);
    transport.send_encoded(c, msg, mlen, payload, plen, hold);
}

/* A tensor answer to a held session (no connection): kept for the client's return. */
void tdd_keep_tensor(tdd_session *s, uint64_t req_id, const tdd_value *v, const void *payload,
                     uint64_t plen, tdd_storage *hold)
{
    uint8_t msg[TDD_WIRE_SMALL_MAX];
    tdd_resume_keep(s, req_id, msg, tdd_wire_tensor(msg, req_id, v), payload, plen, hold);
}

void tdd_conn_send_frame(tdd_conn *c, const uint8_t *msg, size_t mlen, const void *payload,
                         uint64_t plen, tdd_storage *hold)
{
    transport.send_encoded(c, msg, mlen, payload, plen, hold);
}

void tdd_conn_drop(tdd_conn *c)
{
    transport.drop(c);
}

void tdd_conn_pause(tdd_conn *c)
{
    transport.pause(c);
}

void tdd_conn_resume(tdd_conn *c)
{
    transport.resume(c);
}

int tdd_conn_admit(tdd_conn *c, td_error *err)
{
    return transport.admit(c, err);
}
