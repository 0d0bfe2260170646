/* session_req.c -- a session's own requests: Hello (the token, the version, a resumed
 * session), Sync and Goodbye (rows of dispatch.c's table). */
#include <stdio.h>
#include <string.h>

#include "exec_op.h"
#include "handlers.h"
#include "log.h"
#include "resume.h"
#include "stats.h"
#include "tls.h"
#include "utf8.h"

typedef Tensordd__V1__Request Request;

static char server_note[256];

void tdd_hello_set_note(const char *note)
{
    snprintf(server_note, sizeof server_note, "%s", note);
}

/* ---------------------------------------------------------------- hello */

/* Compares the offered token with the configured one in time that depends only
 * on the configured length, so the comparison leaks nothing about the token. */
static bool token_matches(const char *offered)
{
    size_t n = offered ? strlen(offered) : 0;
    unsigned diff = (unsigned)(n ^ tdd_cfg.token_len);
    for (size_t i = 0; i < tdd_cfg.token_len; i++)
        diff |= (unsigned)(uint8_t)(i < n ? offered[i] : 0) ^ (uint8_t)tdd_cfg.token[i];
    return diff == 0;
}

int tdd_h_hello(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    Tensordd__V1__Hello *h = req->hello;
    td_error err;
    if (c->hello_done) {
        tdd_err_set(&err, TD_EPROTOCOL_ERROR, "Hello sent twice");
        tdd_answer_error(r, &err);
        return TDD_DISPATCH_CLOSE;
    }
    if (h->min_version > TD_PROTOCOL_VERSION || h->max_version < TD_PROTOCOL_VERSION) {
        tdd_err_set(&err, TD_EVERSION_MISMATCH,
                    "client speaks protocol %u..%u, this daemon speaks %u..%u", h->min_version,
                    h->max_version, TD_PROTOCOL_VERSION, TD_PROTOCOL_VERSION);
        err.detail_kind = TD_DETAIL_VERSION;
        err.detail.version.server_min = TD_PROTOCOL_VERSION;
        err.detail.version.server_max = TD_PROTOCOL_VERSION;
        tdd_answer_error(r, &err);
        return TDD_DISPATCH_CLOSE;
    }
    if (tdd_cfg.token_len && !token_matches(h->token)) {
        tdd_err_set(&err, TD_EUNAUTHENTICATED, "this daemon requires a valid token in Hello");
        char name[64];
        td_utf8_copy(name, sizeof name, h->client_name);
        tdd_stats.auth_failures++;
        tdd_info("connection %llu: authentication failed (bad or missing token): peer %s, "
                 "client '%s'; closing it",
                 (unsigned long long)c->s->id, c->s->peer, name);
        tdd_answer_error(r, &err);
        return TDD_DISPATCH_CLOSE;
    }
    /* Resume: the session the token names replaces the one made for this connection,
     * under the same TLS client certificate (its fingerprint: the token was checked above,
     * as for any Hello). */
    const char *identity = c->tls ? tdd_tls_peer_id(c->tls) : "";
    tdd_session *held = NULL;
    if (h->resume_token.len) {
        held = tdd_resume_take(h->resume_token.data, h->resume_token.len, identity, tdd_conn_drop,
                               &err);
        if (!held) {
            tdd_info("connection %llu: resume refused (%s)", (unsigned long long)c->s->id,
                     err.message);
            tdd_answer_error(r, &err);
            return TDD_DISPATCH_CLOSE;
        }
    }
    if (tdd_conn_admit(c, &err)) { /* (a resume frees the held slot it takes first) */
        if (held) {
            tdd_resume_release(held);
            tdd_session_close(held);
        }
        tdd_answer_error(r, &err);
        return TDD_DISPATCH_CLOSE;
    }
    if (held) {
        snprintf(held->peer, sizeof held->peer, "%s", c->s->peer);
        tdd_session_close(c->s);
        c->s = held;
        held->conn = c;
        tdd_log_set_ctx((tdd_log_ctx){held->id, held->id}, NULL);
        tdd_info("session %llu resumed: peer %s, client '%s', last request applied %llu",
                 (unsigned long long)held->id, held->peer, held->client_name,
                 (unsigned long long)held->resume->last_applied);
    } else {
        /* Echoed to every client in Stats: valid UTF-8, cut on a character. */
        td_utf8_copy(c->s->client_name, sizeof c->s->client_name, h->client_name);
        tdd_stats.sessions_opened++;
        tdd_log_set_ctx((tdd_log_ctx){c->s->id, c->s->id}, NULL); /* a session from here on */
        tdd_info("session %llu opened: peer %s, client '%s'", (unsigned long long)c->s->id,
                 c->s->peer, c->s->client_name);
        tdd_resume_enable(c->s, h->resume_window, identity);
    }
    /* Newer forms a client may use with this daemon (docs/protocol.md, section 7). */
    static char *features[] = {
        (char *)"pipelined_steps", /* Backward.pipelined, OptimizerStep.pipelined */
        (char *)"memfd",           /* Upload.payload_fd, Download.as_fd (Unix sockets) */
        (char *)"transfer",        /* TransferAccept, TransferSend, TransferPush */
        (char *)"create_graph",    /* Backward.create_graph and Backward.inputs */
    };
    Tensordd__V1__HelloReply hr = TENSORDD__V1__HELLO_REPLY__INIT;
    hr.version = TD_PROTOCOL_VERSION;
    hr.n_features = sizeof features / sizeof features[0];
    hr.features = features;
    hr.server = (char *)"tensordd " TDD_VERSION;
    hr.session_id = c->s->id;
    hr.note = server_note;
    if (c->s->resume) {
        hr.resume_token.data = c->s->resume->token;
        hr.resume_token.len = sizeof c->s->resume->token;
        hr.resume_window = c->s->resume->window_s;
        hr.resumed = held != NULL;
        hr.last_applied = c->s->resume->last_applied;
    }
    Tensordd__V1__Response resp = TENSORDD__V1__RESPONSE__INIT;
    resp.id = req->id;
    resp.body_case = TENSORDD__V1__RESPONSE__BODY_HELLO;
    resp.hello = &hr;
    tdd_conn_send(c, &resp, NULL, 0, NULL);
    if (held) /* the answer the client missed, the request the old connection waited on */
        tdd_resume_attach(c, h->last_received);
    return TDD_DISPATCH_DONE;
}

/* A device whose kernels' value checks the session has not read yet (cuda: indices in
 * range, read at a synchronising point rather than after each kernel): synchronize() on
 * the session's worker reads them, and a refused one becomes the session's error. */
typedef struct {
    tdd_session *s;
    tdd_device *dev;
    char why[192];
} checks_read;

static int checks_read_run(void *arg)
{
    checks_read *k = arg;
    int rc = k->dev->be->synchronize(k->dev->ctx, k->dev->ordinal);
    if (rc && k->dev->be->error_message)
        k->dev->be->error_message(k->dev->ctx, k->dev->ordinal, rc, k->why, sizeof k->why);
    return rc;
}

static void checks_read_done(void *arg, int rc)
{
    checks_read *k = arg;
    if (rc) {
        td_error err;
        tdd_err_set(&err, rc, "%s", k->why[0] ? k->why : td_strerror(rc));
        tdd_session_fail(k->s, &err);
    }
    tdd_session_unref(k->s);
    free(k);
}

/* Queues the reads of the devices with unread checks; the number queued. */
static int checks_read_submit(tdd_session *s)
{
    int queued = 0;
    for (int i = 0; i < tdd_device_count(); i++) {
        tdd_device *dev = tdd_device_get(i);
        const tdd_backend *be = dev->be;
        if (!be->checks_pending || !be->synchronize ||
            !be->checks_pending(dev->ctx, dev->ordinal, s->id))
            continue;
        checks_read *k = calloc(1, sizeof *k);
        if (!k)
            continue; /* read by the next download instead */
        k->s = s;
        k->dev = dev;
        tdd_session_ref(s);
        if (tdd_submit_work(s, dev, checks_read_run, checks_read_done, k)) {
            tdd_session_unref(s);
            free(k);
            continue;
        }
        queued++;
    }
    return queued;
}

/* Sync and Goodbye: the generic path waited for the session's queued work and reported
 * its pending error, if any. A Sync first has the devices read the value checks of the
 * work it waited for, and answers with what they found; then the Ok. A client may leave
 * on a failure it has not seen yet: Goodbye tells it first. */
int tdd_h_sync(tdd_req *r)
{
    tdd_session *s = r->c->s;
    if (s && s->checks_req && s->checks_req == r->req->id) { /* the reads are done */
        s->checks_req = 0;
        if (!tdd_report_pending(r))
            tdd_conn_send_ok(r->c, r->req->id);
        return TDD_DISPATCH_DONE;
    }
    if (s && r->req->body_case == TENSORDD__V1__REQUEST__BODY_SYNC && r->req->id &&
        checks_read_submit(s) > 0) {
        s->checks_req = r->req->id;
        return TDD_DISPATCH_BLOCK;
    }
    tdd_conn_send_ok(r->c, r->req->id);
    return TDD_DISPATCH_DONE;
}

int tdd_h_goodbye(tdd_req *r)
{
    tdd_conn_send_ok(r->c, r->req->id);
    return TDD_DISPATCH_CLOSE;
}
