/* resume.h -- sessions that survive a dropped connection (docs/protocol.md, "Resume").
 *
 * A session whose Hello asked for a resume window gets a random 128-bit token. When its
 * connection drops (anything but Goodbye, a protocol failure or the daemon's shutdown)
 * the session is held, with its handles, graph and optimizer state, for the window: work
 * already queued completes, answers go nowhere (the last one is kept). A Hello that
 * presents the token within the window, with the same TLS client identity, takes the
 * session over: it learns the id of the last request the daemon applied, gets the last
 * answer again if it says it did not receive it, and a synchronising request the old
 * connection was waiting on is answered on the new one. Past the window the session is
 * freed as if its connection had just closed. Loop thread only. */
#ifndef TDD_RESUME_H
#define TDD_RESUME_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "conn.h"

#define TDD_RESUME_TOKEN_LEN 16

typedef struct tdd_resume {
    tdd_session *s;
    uint8_t token[TDD_RESUME_TOKEN_LEN];
    uint32_t window_s;
    char identity[256]; /* the TLS client certificate at Hello (tdd_tls_peer_id; "" without) */
    uint64_t last_applied;
    /* An Upload whose payload is being read: applied once it has landed; a drop before
     * that unbinds its handle (the client sends it again). */
    uint64_t upload_req, upload_handle;
    /* The last answer sent (or due while no connection was attached): its message, and
     * its payload as a reference to the storage holding it. */
    uint64_t kept_id;
    uint8_t *kept_msg;
    size_t kept_len;
    const void *kept_payload;
    uint64_t kept_plen;
    tdd_storage *kept_hold;
    /* Held: no connection, the timer runs; the synchronising request the old connection
     * was blocked on (a copy), and whether its handler ran already. */
    bool held;
    uv_timer_t *timer;
    Tensordd__V1__Request *blocked;
    bool blocked_ran;
    struct tdd_resume *prev, *next; /* every resumable session */
} tdd_resume;

/* The loop timers run on (the server's, at start). */
void tdd_resume_init(uv_loop_t *loop);
/* Hello asked for window_s seconds: makes s resumable (capped at --max-resume-window;
 * 0, or the option at 0, leaves it as it was). identity: the TLS client's, or "". */
void tdd_resume_enable(tdd_session *s, uint32_t window_s, const char *identity);
/* Request id was handled (its work queued or done). Hello does not count. */
void tdd_resume_applied(tdd_session *s, uint64_t id);
/* The Upload being handled binds handle (0: none of its own); its payload follows. */
void tdd_resume_upload_handle(tdd_session *s, uint64_t handle);
/* Request id's payload is to be read / has landed. */
void tdd_resume_payload_begin(tdd_session *s, uint64_t id);
void tdd_resume_payload_done(tdd_session *s);
/* Keeps the answer to id (a copy of msg; payload by reference, hold referenced), in
 * place of the one kept before. No-op unless s is resumable and id is not 0. */
void tdd_resume_keep(tdd_session *s, uint64_t id, const uint8_t *msg, size_t mlen,
                     const void *payload, uint64_t plen, tdd_storage *hold);
/* Work is about to be queued for s that may write st (NULL: any storage): when the kept
 * answer's payload is st's bytes by reference, they are copied first (charged to s), so
 * that an answer, once made, never changes when it is sent again. Short of memory the
 * kept answer becomes a RESOURCE_EXHAUSTED error for its request. */
void tdd_resume_before_write(tdd_session *s, const tdd_storage *st);
/* c's connection is gone: holds its session for its window when it is resumable (true),
 * else false (the caller frees it). Takes a copy of c's blocked request. */
bool tdd_resume_hold(tdd_conn *c);
/* The session the token names, taken out of the held set (its timer stopped), or NULL
 * with err set: no such session (expired, or never: CONNECTION_LOST), or another TLS
 * identity (UNAUTHENTICATED). A session still attached to a connection that has not
 * noticed it is dead is detached first (drop closes that connection). */
tdd_session *tdd_resume_take(const uint8_t *token, size_t len, const char *identity,
                             void (*drop)(tdd_conn *c), td_error *err);
/* After the HelloReply on c (whose session is now s): sends the kept answer again if the
 * client has not received it, and hands c the request the old connection was blocked on
 * (the caller kicks c). */
void tdd_resume_attach(tdd_conn *c, uint64_t last_received);
/* Frees s's resume state (before tdd_session_close). */
void tdd_resume_release(tdd_session *s);
/* Sessions held without a connection (they count against --max-sessions). */
uint32_t tdd_resume_held(void);
/* The daemon shuts down: every held session is freed. */
void tdd_resume_drop_all(void);

#endif
