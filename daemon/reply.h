/* reply.h -- answers to requests: the request being handled, its error or Ok, tensor
 * replies, the end of queued work, and the transport operations, handed down once by
 * the server as hooks (replies never call up into the transport by name). */
#ifndef TDD_REPLY_H
#define TDD_REPLY_H

#include "conn.h"

/* What the server does for the layers below it (tdd_reply_init). */
typedef struct {
    void (*send)(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                 tdd_storage *hold);
    /* One frame whose Response message is msg[0..mlen) (wire.h's encoders). */
    void (*send_encoded)(tdd_conn *c, const uint8_t *msg, size_t mlen, const void *payload,
                         uint64_t plen, tdd_storage *hold);
    void (*pause)(tdd_conn *c);
    void (*resume)(tdd_conn *c);
    void (*kick)(tdd_conn *c);
    int (*admit)(tdd_conn *c, td_error *err);
    void (*drop)(tdd_conn *c); /* closes c now, as if its peer had gone (resume.c) */
} tdd_transport;

/* The server's operations; also makes replies the end of every session task. */
void tdd_reply_init(const tdd_transport *t);

/* One request while it is handled: the generic path (dispatch.c) fills it, the handler
 * answers through it, and a failure is kept in it for the generic path to finish. */
typedef struct tdd_req {
    tdd_conn *c;
    Tensordd__V1__Request *req;
    uint64_t payload_len;
    bool answered; /* always gets a reply (synchronising requests), else only on want_reply */
    bool failed;   /* the request failed with err */
    td_error err;
} tdd_req;

/* The one place a failed request's error goes: to the client now (requests always
 * answered, want_reply) or into the session's pending error. Returns TDD_DISPATCH_DONE. */
int tdd_answer_error(tdd_req *r, td_error *err);
/* Ok, when the request is answered. */
void tdd_answer_ok(tdd_req *r);
/* Reports and clears the session's first pending error as r's answer; 1 if there was one. */
int tdd_report_pending(tdd_req *r);

/* The end of queued work for request req_id of session s (the completion every session
 * task reports through, tdd_exec_op_set_done): a failure (rc, err) is counted and told
 * now when the request wants a reply, else kept as the session's pending error; success
 * is answered (reply's TensorInfo, or Ok) when wanted. kick: the connection may go on
 * (not when the work ran inline, inside the request that queued it). */
void tdd_reply_done(tdd_session *s, uint64_t req_id, bool want_reply, int rc, td_error *err,
                    const tdd_value *reply, bool kick);

/* Frames to the client, through the transport. */
void tdd_conn_send(tdd_conn *c, Tensordd__V1__Response *r, const void *payload, uint64_t plen,
                   tdd_storage *hold);
void tdd_conn_send_error(tdd_conn *c, uint64_t id, const td_error *err);
void tdd_conn_send_ok(tdd_conn *c, uint64_t id);
/* Replies with v's TensorInfo (and a payload for downloads). */
void tdd_send_tensor(tdd_conn *c, uint64_t req_id, const tdd_value *v, const void *payload,
                     uint64_t plen, tdd_storage *hold);
/* One frame whose Response message is msg[0..mlen), as it is (nothing kept for resume:
 * resume.c's own resend). */
void tdd_conn_send_frame(tdd_conn *c, const uint8_t *msg, size_t mlen, const void *payload,
                         uint64_t plen, tdd_storage *hold);
/* Closes c now (the transport's drop). */
void tdd_conn_drop(tdd_conn *c);
/* The same for a held session (resume.c), whose connection is gone: the answer is kept
 * for the client's next connection. */
void tdd_keep_tensor(tdd_session *s, uint64_t req_id, const tdd_value *v, const void *payload,
                     uint64_t plen, tdd_storage *hold);
/* Pauses frame processing until tdd_conn_resume (one call each). */
void tdd_conn_pause(tdd_conn *c);
void tdd_conn_resume(tdd_conn *c);
/* Hello succeeded: the connection becomes a session, counted against --max-sessions,
 * and gets the full frame limits. A negative TD_E* (err set) when the daemon serves its
 * limit of sessions. */
int tdd_conn_admit(tdd_conn *c, td_error *err);

#endif
