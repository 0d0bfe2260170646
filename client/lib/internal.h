/* internal.h -- libtensordd's private state and helpers; never installed, never seen by clients. */
#ifndef TD_CLIENT_INTERNAL_H
#define TD_CLIENT_INTERNAL_H

#include <stdint.h>
#include <sys/types.h>

#include "frame.h"
#include "tensordd.h"
#include "tensordd.pb-c.h"
#include "wirecodec.h"

/* Fire-and-forget requests pile up in the write buffer until a blocking call
 * or this many bytes: one send for many small frames. */
#define TD__FLUSH_AT (256u * 1024u)
/* Upload payloads below this are copied into the write buffer (cheaper than a
 * separate send); larger ones go out straight from the caller's memory. */
#define TD__INLINE_PAYLOAD (64u * 1024u)
/* The largest response message (protobuf part) we accept from a server. */
#define TD__MAX_RESPONSE_MSG (64u << 20)
/* Released handles are sent as one Release once this many are pending. */
#define TD__RELEASE_BATCH 4096u

struct td_client {
    int fd;
    int timeout_ms; /* per wait for the socket; 0: forever */
    int dead;       /* TD_E* once the byte stream can no longer be trusted */
    uint64_t next_handle, next_request;

    uint8_t *wbuf; /* encoded frames not yet sent */
    size_t wlen, wcap;

    uint64_t *rel; /* handles released but not yet sent */
    size_t nrel, relcap;
    int capturing;          /* a graph is being recorded: releases wait (td_graph_begin) */
    uint64_t capture_first; /* the first handle id the recording's requests bind */

    uint8_t *rbuf; /* bytes received but not yet consumed: rbuf[rpos..rlen) */
    size_t rpos, rlen, rcap;

    td_error early; /* first error from a response we were not waiting for */
    int has_early;

    uint64_t session_id;
    char note[256];

    td_progress_fn progress;
    void *progress_arg;

    struct td__tls *tls; /* tls:// endpoints (tls.c); NULL on plain TCP and Unix sockets */
    int tls_code;        /* the last TLS failure: a TD_E* code and what it was */
    char tls_why[400];

    /* Resume (td_connect_resume; docs/protocol.md, section 7): the window the daemon
     * granted (0: off) and the session's token; what a reconnection needs; the journal,
     * every frame sent or queued that the daemon is not known to have applied (jbuf, one
     * entry per frame: its request id and where it starts); the last response received
     * whole, and the one whose payload the caller is reading. */
    uint32_t resume_window_s;
    uint8_t resume_token[16];
    char *endpoint, *token, *client_name, *tls_ca, *tls_cert, *tls_key;
    td_tls_opts tls_opts;
    int has_tls;
    uint8_t *jbuf;
    size_t jlen, jcap;
    struct td__jent {
        uint64_t id;
        size_t off;
    } * jent;
    size_t jn, jentcap;
    uint64_t last_received, cur_id, payload_left;
    int recovering;
    unsigned resumes;

    /* Same-host zero copy (td_download_fd): while want_fds, reads keep the file
     * descriptors the daemon sends, oldest first. */
    int want_fds;
    int rfds[8];
    int nrfds;
};

/* Resume: reconnections tried after a lost connection, and the first wait between two
 * (doubled each time, at most a second, all within the window). */
#define TD__RESUME_TRIES 8
#define TD__RESUME_BACKOFF_MS 50
/* A lost connection (CLOSED, IO) on a resumable client: reconnects, resumes the session
 * and sends again what the daemon had not applied; 0, or TD_ECONNECTION_LOST (or the
 * daemon's refusal) with the client dead. */
int td__resume(td_client *c, td_error *err);
int td__resumable(const td_client *c, int rc);

/* A response matched to its request; payload_len bytes of raw payload still
 * sit on the socket and the caller must read or drain them. */
typedef struct {
    Tensordd__V1__Response *msg; /* NULL when td__call_ex was told body_only */
    uint64_t payload_len;
    int body_case; /* the Response's body, even when msg is NULL */
} td__reply;

/* client.c: the byte stream */
int td__open(td_client *c, const char *endpoint, const td_tls_opts *tls, td_error *err);
/* Closes the socket and frees the TLS session, if any. */
void td__close_stream(td_client *c);
/* The socket itself, under TLS too (tls.c moves ciphertext with them): td__recv_raw
 * returns recv's result (-1 with errno) or a TD__RECV_* code; td__send_raw sends every
 * byte or fails with a TD_E* code (err filled, the stream marked dead). */
#define TD__RECV_TIMEOUT (-2)
#define TD__RECV_POLL_FAILED (-3)
#define TD__RECV_TLS_FAILED (-4) /* c->tls_code and c->tls_why say what */
ssize_t td__recv_raw(td_client *c, void *buf, size_t len);
int td__send_raw(td_client *c, const void *buf, size_t len, td_error *err);

/* tls.c: the TLS handshake on the connected socket (host: the name or address the
 * daemon's certificate must show); receiving decrypted bytes (as td__recv_raw);
 * sending encrypted ones (as td__send_raw); freeing it. */
int td__tls_start(td_client *c, const char *endpoint, const char *host, const td_tls_opts *opts,
                  td_error *err);
ssize_t td__tls_recv(td_client *c, void *buf, size_t len);
int td__tls_send(td_client *c, const void *buf, size_t len, td_error *err);
void td__tls_free(td_client *c);
/* Assigns req->id, appends the frame (payload straight from the caller's
 * memory when large) and, when reply is non-NULL, flushes and waits for the
 * response with that id. reply->msg must then be freed with td__reply_free. */
int td__call(td_client *c, Tensordd__V1__Request *req, const void *payload, uint64_t payload_len,
             td__reply *reply, td_error *err);
/* The same; body_only: the caller needs no more than whether the request
 * succeeded, so a reply that is not an error is not decoded (reply->msg stays
 * NULL; reply->body_case and payload_len are set). */
int td__call_ex(td_client *c, Tensordd__V1__Request *req, const void *payload, uint64_t payload_len,
                td__reply *reply, int body_only, td_error *err);
int td__flush(td_client *c, td_error *err);
/* Sets the per-wait timeout (0: forever) and the socket's receive timeout to match. */
void td__set_timeout(td_client *c, int timeout_ms);
int td__read_payload(td_client *c, void *dst, uint64_t len, td_error *err);
int td__drain(td_client *c, uint64_t len, td_error *err);
void td__reply_free(td__reply *r);
/* An error from an earlier request's answer (one we were not waiting for),
 * reported by the next synchronising call that would otherwise succeed. */
int td__take_early(td_client *c, td_error *err);

/* wire.c: the fast codec (proto/wirecodec.h) for small calls. td__request_fast_size
 * returns the packed size of req, or 0 when req is not one it encodes (an
 * Op with attrs, say: protobuf-c packs those); td__request_fast_pack then
 * writes exactly the bytes protobuf-c would. */
typedef struct {
    td_wire_request w;
} td__req_sizes;
size_t td__request_fast_size(const Tensordd__V1__Request *req, td__req_sizes *z);
size_t td__request_fast_pack(const Tensordd__V1__Request *req, const td__req_sizes *z,
                             uint8_t *out);
/* Reads a Response's id and body without decoding it: 1 when it is an Ok or a
 * well-formed TensorInfo (what a caller that only needs success can skip),
 * 0 for anything else (an Error above all), which must be unpacked. */
int td__glance_response(const uint8_t *msg, size_t len, uint64_t *id, int *body_case);

/* error.c: every conversion into td_error */
int td__fail(td_error *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int td__from_pb(const Tensordd__V1__Error *e, td_error *err);
void td__device_from_pb(const Tensordd__V1__Device *d, td_device *out);

#endif
