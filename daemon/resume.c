/* resume.c -- sessions held across a dropped connection, their tokens, the last answer
 * kept for a client that missed it, and the window's timer (resume.h). */
#include "resume.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "log.h"
#include "reply.h"
#include "wire.h"

static uv_loop_t *loop;
static tdd_resume *all; /* every resumable session, held or attached */
static uint32_t n_held;

void tdd_resume_init(uv_loop_t *l)
{
    loop = l;
    tdd_session_on_write(tdd_resume_before_write);
}

uint32_t tdd_resume_held(void)
{
    return n_held;
}

void tdd_resume_enable(tdd_session *s, uint32_t window_s, const char *identity)
{
    if (s->resume || !window_s || !tdd_cfg.max_resume_window_s || !loop)
        return;
    tdd_resume *r = calloc(1, sizeof *r);
    if (!r)
        return;
    if (getrandom(r->token, sizeof r->token, 0) != (ssize_t)sizeof r->token) {
        tdd_warn("session %llu: no random bytes for a resume token; not resumable",
                 (unsigned long long)s->id);
        free(r);
        return;
    }
    r->s = s;
    r->window_s = window_s < tdd_cfg.max_resume_window_s ? window_s : tdd_cfg.max_resume_window_s;
    snprintf(r->identity, sizeof r->identity, "%s", identity ? identity : "");
    r->next = all;
    if (all)
        all->prev = r;
    all = r;
    s->resume = r;
}

void tdd_resume_applied(tdd_session *s, uint64_t id)
{
    if (s && s->resume && id > s->resume->last_applied)
        s->resume->last_applied = id;
}

void tdd_resume_upload_handle(tdd_session *s, uint64_t handle)
{
    if (s && s->resume)
        s->resume->upload_handle = handle;
}

void tdd_resume_payload_begin(tdd_session *s, uint64_t id)
{
    if (s && s->resume)
        s->resume->upload_req = id;
}

void tdd_resume_payload_done(tdd_session *s)
{
    if (!s || !s->resume || !s->resume->upload_req)
        return;
    tdd_resume_applied(s, s->resume->upload_req);
    s->resume->upload_req = s->resume->upload_handle = 0;
}

static void drop_kept(tdd_resume *r)
{
    free(r->kept_msg);
    tdd_storage_unref(r->kept_hold);
    r->kept_msg = NULL;
    r->kept_hold = NULL;
    r->kept_len = 0;
    r->kept_payload = NULL;
    r->kept_plen = 0;
    r->kept_id = 0;
}

void tdd_resume_keep(tdd_session *s, uint64_t id, const uint8_t *msg, size_t mlen,
                     const void *payload, uint64_t plen, tdd_storage *hold)
{
    if (!s || !s->resume || !id)
        return;
    tdd_resume *r = s->resume;
    uint8_t *copy = malloc(mlen ? mlen : 1);
    if (!copy)
        return; /* (a client that misses this answer then cannot resume the call) */
    memcpy(copy, msg, mlen);
    if (hold)
        tdd_storage_ref(hold);
    drop_kept(r);
    r->kept_id = id;
    r->kept_msg = copy;
    r->kept_len = mlen;
    r->kept_payload = payload;
    r->kept_plen = plen;
    r->kept_hold = hold;
}

/* The kept answer in place of one that cannot be kept: an error for its request. */
static void keep_error(tdd_resume *r, td_error *err)
{
    uint64_t id = r->kept_id;
    drop_kept(r);
    err->request_id = id;
    size_t n;
    uint8_t *msg = tdd_wire_error_packed(id, err, &n);
    if (!msg)
        return;
    r->kept_id = id;
    r->kept_msg = msg;
    r->kept_len = n;
}

void tdd_resume_before_write(tdd_session *s, const tdd_storage *st)
{
    tdd_resume *r = s ? s->resume : NULL;
    if (!r || !r->kept_hold || (st && st != r->kept_hold))
        return;
    /* Only the kept answer holds it: nothing can write it any more. */
    if (atomic_load(&r->kept_hold->refs) == 1)
        return;
    td_error err;
    tdd_storage *copy = NULL;
    if (r->kept_plen)
        copy = tdd_storage_alloc(tdd_default_device(), (size_t)r->kept_plen, s->acct, s->id, &err);
    if (r->kept_plen && !copy) {
        tdd_warn("session %llu: the answer to request %llu (%llu bytes) cannot be kept for "
                 "resume: %s",
                 (unsigned long long)s->id, (unsigned long long)r->kept_id,
                 (unsigned long long)r->kept_plen, err.message);
        keep_error(r, &err);
        return;
    }
    if (copy)
        memcpy(copy->data, r->kept_payload, (size_t)r->kept_plen);
    tdd_storage_unref(r->kept_hold);
    r->kept_hold = copy;
    r->kept_payload = copy ? copy->data : NULL;
}

static void timer_closed(uv_handle_t *h)
{
    free(h);
}

static void unhold(tdd_resume *r)
{
    if (r->held)
        n_held--;
    r->held = false;
    if (r->timer) {
        uv_timer_stop(r->timer);
        uv_close((uv_handle_t *)r->timer, timer_closed);
        r->timer = NULL;
    }
}

void tdd_resume_release(tdd_session *s)
{
    tdd_resume *r = s ? s->resume : NULL;
    if (!r)
        return;
    unhold(r);
    drop_kept(r);
    if (r->blocked)
        tensordd__v1__request__free_unpacked(r->blocked, NULL);
    if (r->prev)
        r->prev->next = r->next;
    else
        all = r->next;
    if (r->next)
        r->next->prev = r->prev;
    s->resume = NULL;
    free(r);
}

static void on_expire(uv_timer_t *t)
{
    tdd_session *s = t->data;
    tdd_log_ctx prev;
    tdd_log_set_ctx((tdd_log_ctx){s->id, s->id}, &prev);
    tdd_info("session %llu: resume window of %us ran out; freeing it", (unsigned long long)s->id,
             s->resume->window_s);
    tdd_log_set_ctx(prev, NULL);
    tdd_resume_release(s);
    tdd_session_close(s);
}

/* A private copy of a request (c's may live in its connection's arena). */
static Tensordd__V1__Request *request_copy(const Tensordd__V1__Request *req)
{
    size_t n = tensordd__v1__request__get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return NULL;
    tensordd__v1__request__pack(req, buf);
    Tensordd__V1__Request *copy = tensordd__v1__request__unpack(NULL, n, buf);
    free(buf);
    return copy;
}

bool tdd_resume_hold(tdd_conn *c)
{
    tdd_session *s = c->s;
    tdd_resume *r = s ? s->resume : NULL;
    if (!r || r->held)
        return false;
    uv_timer_t *t = malloc(sizeof *t);
    Tensordd__V1__Request *blocked = NULL;
    if (!t || (c->blocked && !(blocked = request_copy(c->blocked)))) {
        free(t);
        tdd_warn("session %llu: out of memory holding it for resume; freeing it",
                 (unsigned long long)s->id);
        return false;
    }
    /* An Upload cut before its payload landed was not applied: the client sends it again,
     * naming the same id, which must be free. */
    if (r->upload_req) {
        tdd_handle_forget(s, r->upload_handle);
        r->upload_req = r->upload_handle = 0;
    }
    r->blocked = blocked;
    r->blocked_ran = blocked && c->blocked_ran;
    s->conn = NULL;
    r->held = true;
    n_held++;
    uv_timer_init(loop, t);
    t->data = s;
    r->timer = t;
    uv_timer_start(t, on_expire, (uint64_t)r->window_s * 1000u, 0);
    return true;
}

static bool same_token(const uint8_t *a, const uint8_t *b)
{
    unsigned diff = 0;
    for (size_t i = 0; i < TDD_RESUME_TOKEN_LEN; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

tdd_session *tdd_resume_take(const uint8_t *token, size_t len, const char *identity,
                             void (*drop)(tdd_conn *c), td_error *err)
{
    tdd_resume *found = NULL;
    /* Every entry is compared, in constant time each: the time says nothing of which
     * bytes matched. */
    for (tdd_resume *r = all; r; r = r->next)
        if (len == TDD_RESUME_TOKEN_LEN && same_token(r->token, token) && !found)
            found = r;
    if (!found) {
        tdd_err_set(err, TD_ECONNECTION_LOST,
                    "no session is held for this resume token (its window ran out, or it "
                    "never existed)");
        return NULL;
    }
    if (strcmp(found->identity, identity ? identity : "") != 0) {
        tdd_err_set(err, TD_EUNAUTHENTICATED,
                    "this resume token belongs to a session opened with another TLS client "
                    "identity");
        return NULL;
    }
    tdd_session *s = found->s;
    if (!found->held && s->conn && !s->conn->closing && drop) {
        /* The old connection is dead, whether or not it knows: closing it holds the
         * session (or, short of memory, frees it: the reference keeps s readable). */
        tdd_session_ref(s);
        drop(s->conn);
        bool held = !s->closed && s->resume && s->resume->held;
        tdd_session_unref(s);
        if (!held) {
            tdd_err_set(err, TD_ECONNECTION_LOST, "the session could not be taken over");
            return NULL;
        }
    }
    if (!s->resume || !s->resume->held) {
        tdd_err_set(err, TD_ECONNECTION_LOST, "the session is closing");
        return NULL;
    }
    unhold(s->resume);
    return s;
}

void tdd_resume_attach(tdd_conn *c, uint64_t last_received)
{
    tdd_session *s = c->s;
    tdd_resume *r = s->resume;
    if (!r)
        return;
    if (r->kept_msg && r->kept_id > last_received) {
        tdd_debug("session %llu: sending the answer to request %llu again",
                  (unsigned long long)s->id, (unsigned long long)r->kept_id);
        tdd_conn_send_frame(c, r->kept_msg, r->kept_len, r->kept_payload, r->kept_plen,
                            r->kept_hold);
    }
    if (r->blocked) {
        c->blocked = r->blocked;
        c->blocked_ran = r->blocked_ran;
        r->blocked = NULL;
        r->blocked_ran = false;
    }
}

void tdd_resume_drop_all(void)
{
    tdd_resume *r = all;
    while (r) {
        tdd_resume *next = r->next;
        if (r->held) {
            tdd_session *s = r->s;
            tdd_resume_release(s);
            tdd_session_close(s);
        }
        r = next;
    }
}
