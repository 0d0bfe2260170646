/* client.c -- libtensordd's connection: sockets, the coalescing write buffer, and framed reads. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define RBUF_INITIAL (64u * 1024u)
/* Payloads are received in slices this big so the progress callback ticks. */
#define PAYLOAD_SLICE (4u << 20)

/* Once the stream is out of step (a timeout mid-frame, garbage, a close) no
 * later reply could be trusted: every call from now on fails with this code. */
static int kill_stream(td_client *c, td_error *err, int code, const char *what)
{
    if (!c->dead)
        c->dead = code;
    return td__fail(err, code, "%s", what);
}

/* Waits until fd is ready for ev; 0, or TD_ETIMEOUT / TD_EIO. */
static int wait_fd(td_client *c, short ev)
{
    struct pollfd p = {.fd = c->fd, .events = ev};
    for (;;) {
        int n = poll(&p, 1, c->timeout_ms > 0 ? c->timeout_ms : -1);
        if (n > 0)
            return 0;
        if (n == 0)
            return TD_ETIMEOUT;
        if (errno != EINTR)
            return TD_EIO;
    }
}

/* recv_wait's results besides recv's own. */
#define RECV_TIMEOUT TD__RECV_TIMEOUT
#define RECV_POLL_FAILED TD__RECV_POLL_FAILED
#define RECV_TLS_FAILED TD__RECV_TLS_FAILED

/* recv that keeps the file descriptors that came with the bytes (td_download_fd). */
static ssize_t recv_fds(td_client *c, void *buf, size_t len)
{
    union {
        char b[CMSG_SPACE(8 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
    ssize_t k = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *cm = k >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (c->nrfds < (int)(sizeof c->rfds / sizeof c->rfds[0]))
                c->rfds[c->nrfds++] = fd;
            else
                close(fd);
        }
    }
    return k;
}

/* Receives into buf, sleeping in recv(2) itself: one system call per reply
 * instead of three (a MSG_DONTWAIT recv that finds nothing, poll, recv again).
 * The per-wait timeout is the socket's SO_RCVTIMEO (td__set_timeout), so a
 * timed-out wait reads as EAGAIN. Returns recv's result (-1 with errno),
 * RECV_TIMEOUT or RECV_POLL_FAILED. */
ssize_t td__recv_raw(td_client *c, void *buf, size_t len)
{
    for (;;) {
        ssize_t k = c->want_fds ? recv_fds(c, buf, len) : recv(c->fd, buf, len, 0);
        if (k >= 0 || errno == EINTR)
            return k;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return k;
        if (c->timeout_ms > 0)
            return RECV_TIMEOUT;
        /* No timeout set, so the socket should not say EAGAIN; wait the old way. */
        int rc = wait_fd(c, POLLIN);
        if (rc)
            return rc == TD_ETIMEOUT ? RECV_TIMEOUT : RECV_POLL_FAILED;
    }
}

/* The same through TLS on a tls:// connection (decrypted into buf). */
static ssize_t recv_wait(td_client *c, void *buf, size_t len)
{
    return c->tls ? td__tls_recv(c, buf, len) : td__recv_raw(c, buf, len);
}

void td__set_timeout(td_client *c, int timeout_ms)
{
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : 0;
    if (c->fd < 0)
        return;
    struct timeval tv = {.tv_sec = c->timeout_ms / 1000, .tv_usec = (c->timeout_ms % 1000) * 1000};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* ---------------------------------------------------------------- connect */

static int connect_fd(int fd, const struct sockaddr *sa, socklen_t len, int timeout_ms)
{
    if (timeout_ms <= 0)
        return connect(fd, sa, len) == 0 ? 0 : -errno;
    /* Non-blocking connect so a black-holed address honours the timeout. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    int rc = 0;
    if (connect(fd, sa, len) != 0) {
        if (errno != EINPROGRESS) {
            rc = -errno;
        } else {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int n;
            do
                n = poll(&p, 1, timeout_ms);
            while (n < 0 && errno == EINTR);
            if (n == 0) {
                rc = -ETIMEDOUT;
            } else {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
                    rc = -errno;
                else
                    rc = -soerr;
            }
        }
    }
    if (fcntl(fd, F_SETFL, fl) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

static int open_unix(td_client *c, const char *path, td_error *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (!path[0] || strlen(path) >= sizeof sa.sun_path)
        return td__fail(err, TD_EINVALID_ARGUMENT, "bad unix socket path '%s'", path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return td__fail(err, TD_EIO, "socket: %s", strerror(errno));
    int rc = connect_fd(fd, (const struct sockaddr *)&sa, sizeof sa, c->timeout_ms);
    if (rc != 0) {
        close(fd);
        return td__fail(err, rc == -ETIMEDOUT ? TD_ETIMEOUT : TD_EIO, "connect unix://%s: %s", path,
                        strerror(-rc));
    }
    c->fd = fd;
    return 0;
}

static int open_tcp(td_client *c, const char *hostport, td_error *err)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || !colon[1] || (size_t)(colon - hostport) >= sizeof host)
        return td__fail(err, TD_EINVALID_ARGUMENT, "endpoint needs tcp://HOST:PORT, got '%s'",
                        hostport);
    size_t hl = (size_t)(colon - hostport);
    memcpy(host, hostport, hl);
    host[hl] = 0;
    /* [::1]:7070 */
    char *h = host;
    if (h[0] == '[' && hl >= 2 && h[hl - 1] == ']') {
        h[hl - 1] = 0;
        h++;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(h, colon + 1, &hints, &res);
    if (gai != 0)
        return td__fail(err, TD_EINVALID_ARGUMENT, "cannot resolve '%s': %s", hostport,
                        gai_strerror(gai));
    int last = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        int rc = connect_fd(fd, ai->ai_addr, ai->ai_addrlen, c->timeout_ms);
        if (rc == 0) {
            /* Small requests must leave at once: we coalesce ourselves. */
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            c->fd = fd;
            freeaddrinfo(res);
            return 0;
        }
        last = -rc;
        close(fd);
    }
    freeaddrinfo(res);
    return td__fail(err, last == ETIMEDOUT ? TD_ETIMEOUT : TD_EIO, "connect tcp://%s: %s", hostport,
                    strerror(last));
}

void td__close_stream(td_client *c)
{
    td__tls_free(c);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

static int open_tls(td_client *c, const char *endpoint, const td_tls_opts *opts, td_error *err)
{
    int rc = open_tcp(c, endpoint + 6, err);
    if (rc)
        return rc;
    /* the host as the certificate must name it: [::1]:7070 -> ::1 */
    char host[256];
    const char *hp = endpoint + 6, *colon = strrchr(hp, ':');
    size_t hl = (size_t)(colon - hp);
    if (hl >= 2 && hp[0] == '[' && hp[hl - 1] == ']') {
        hp++;
        hl -= 2;
    }
    snprintf(host, sizeof host, "%.*s", (int)hl, hp);
    td__set_timeout(c, c->timeout_ms); /* the handshake's waits are bounded too */
    rc = td__tls_start(c, endpoint, host, opts, err);
    if (rc)
        td__close_stream(c);
    return rc;
}

int td__open(td_client *c, const char *endpoint, const td_tls_opts *opts, td_error *err)
{
    if (!endpoint)
        return td__fail(err, TD_EINVALID_ARGUMENT, "no endpoint");
    if (opts && strncmp(endpoint, "tls://", 6) != 0)
        return td__fail(err, TD_EINVALID_ARGUMENT,
                        "TLS options given for '%s', not a tls:// "
                        "endpoint",
                        endpoint);
    if (strncmp(endpoint, "tcp://", 6) == 0)
        return open_tcp(c, endpoint + 6, err);
    if (strncmp(endpoint, "tls://", 6) == 0)
        return open_tls(c, endpoint, opts, err);
    if (strncmp(endpoint, "unix://", 7) == 0)
        return open_unix(c, endpoint + 7, err);
    return td__fail(err, TD_EINVALID_ARGUMENT,
                    "endpoint must be tcp://HOST:PORT, tls://HOST:PORT or unix:///PATH");
}

/* ---------------------------------------------------------------- writing */

static int wreserve(td_client *c, size_t more, td_error *err)
{
    if (more > SIZE_MAX - c->wlen)
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "request too large");
    size_t need = c->wlen + more;
    if (need <= c->wcap)
        return 0;
    size_t cap = c->wcap ? c->wcap : 64 * 1024;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *n = realloc(c->wbuf, cap);
    if (!n)
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory for the write buffer");
    c->wbuf = n;
    c->wcap = cap;
    return 0;
}

/* Sends every byte of iov[0..n) (modified in place). Bytes past the first
 * `skip` count as payload for the progress callback. */
static int sendv_raw(td_client *c, struct iovec *iov, int n, size_t skip, uint64_t payload_total,
                     td_error *err)
{
    uint64_t sent = 0;
    while (n > 0) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        /* MSG_NOSIGNAL: a daemon that hung up must give us an error, not SIGPIPE. */
        ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int rc = wait_fd(c, POLLOUT);
                if (rc == TD_ETIMEOUT)
                    return kill_stream(c, err, TD_ETIMEOUT, "timed out sending to the daemon");
                if (rc)
                    return kill_stream(c, err, TD_EIO, "poll failed while sending");
                continue;
            }
            if (errno == EPIPE || errno == ECONNRESET)
                return kill_stream(c, err, TD_ECLOSED, "the daemon closed the connection");
            return kill_stream(c, err, TD_EIO, strerror(errno));
        }
        sent += (uint64_t)k;
        size_t left = (size_t)k;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + left;
            iov->iov_len -= left;
        }
        if (c->progress && payload_total && sent > skip)
            c->progress(c->progress_arg, sent - skip, payload_total);
    }
    return 0;
}

int td__send_raw(td_client *c, const void *buf, size_t len, td_error *err)
{
    struct iovec iov = {.iov_base = (void *)(uintptr_t)buf, .iov_len = len};
    return sendv_raw(c, &iov, 1, 0, 0, err);
}

/* The same through TLS on a tls:// connection: encrypted a slice at a time. */
static int sendv_all(td_client *c, struct iovec *iov, int n, size_t skip, uint64_t payload_total,
                     td_error *err)
{
    if (!c->tls)
        return sendv_raw(c, iov, n, skip, payload_total, err);
    uint64_t sent = 0;
    for (int i = 0; i < n; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        while (left) {
            size_t k = left < (1u << 20) ? left : (1u << 20);
            int rc = td__tls_send(c, p, k, err);
            if (rc)
                return rc;
            p += k;
            left -= k;
            sent += k;
            if (c->progress && payload_total && sent > skip)
                c->progress(c->progress_arg, sent - skip, payload_total);
        }
    }
    return 0;
}

/* Sends the write buffer, then (optionally) a payload from the caller's memory,
 * in one writev-style call sequence. */
static int flush_with(td_client *c, const void *payload, uint64_t plen, td_error *err)
{
    if (c->dead)
        return td__fail(err, c->dead, "connection unusable after an earlier failure (%s)",
                        td_err_name(c->dead));
    if (!c->wlen && !plen)
        return 0;
    struct iovec iov[2];
    int n = 0;
    size_t head = c->wlen;
    if (c->wlen)
        iov[n++] = (struct iovec){.iov_base = c->wbuf, .iov_len = c->wlen};
    if (plen) {
        if (plen > SIZE_MAX)
            return td__fail(err, TD_ERESOURCE_EXHAUSTED, "payload too large");
        iov[n++] = (struct iovec){.iov_base = (void *)(uintptr_t)payload, .iov_len = (size_t)plen};
    }
    c->wlen = 0; /* even on failure: the stream is dead then anyway */
    return sendv_all(c, iov, n, head, plen, err);
}

/* ---------------------------------------------------------------- resume journal */

/* Keeps a copy of the frame of request id until a response shows the daemon applied it. */
static int journal_add(td_client *c, uint64_t id, const uint8_t *frame, size_t len, td_error *err)
{
    if (!c->resume_window_s || c->recovering || !id)
        return 0;
    if (c->jn == c->jentcap) {
        size_t cap = c->jentcap ? 2 * c->jentcap : 64;
        struct td__jent *e = realloc(c->jent, cap * sizeof *e);
        if (!e)
            return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory for the resume journal");
        c->jent = e;
        c->jentcap = cap;
    }
    if (len > c->jcap - c->jlen) {
        size_t cap = c->jcap ? c->jcap : 64 * 1024;
        while (cap - c->jlen < len)
            cap *= 2;
        uint8_t *b = realloc(c->jbuf, cap);
        if (!b)
            return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory for the resume journal");
        c->jbuf = b;
        c->jcap = cap;
    }
    c->jent[c->jn++] = (struct td__jent){id, c->jlen};
    memcpy(c->jbuf + c->jlen, frame, len);
    c->jlen += len;
    return 0;
}

/* A response to request id: the daemon applied every request up to it. */
static void journal_ack(td_client *c, uint64_t id)
{
    size_t k = 0;
    while (k < c->jn && c->jent[k].id <= id)
        k++;
    if (!k)
        return;
    size_t off = k < c->jn ? c->jent[k].off : c->jlen;
    memmove(c->jbuf, c->jbuf + off, c->jlen - off);
    c->jlen -= off;
    for (size_t i = k; i < c->jn; i++)
        c->jent[i - k] = (struct td__jent){c->jent[i].id, c->jent[i].off - off};
    c->jn -= k;
}

int td__resumable(const td_client *c, int rc)
{
    return c->resume_window_s && !c->recovering && (rc == TD_ECLOSED || rc == TD_EIO);
}

/* Appends one frame (header + packed request [+ inline payload]). */
static int append_frame(td_client *c, const Tensordd__V1__Request *req, const void *payload,
                        uint64_t plen, int inline_payload, td_error *err)
{
    td__req_sizes z;
    size_t mlen = td__request_fast_size(req, &z);
    int fast = mlen != 0;
    if (!fast)
        mlen = tensordd__v1__request__get_packed_size(req);
    if (mlen > UINT32_MAX)
        return td__fail(err, TD_EINVALID_ARGUMENT, "request message too large");
    size_t extra = inline_payload ? (size_t)plen : 0;
    int rc = wreserve(c, TD_FRAME_HEADER_SIZE + mlen + extra, err);
    if (rc)
        return rc;
    uint8_t *p = c->wbuf + c->wlen;
    td_frame_encode(p, (uint32_t)mlen, plen);
    if (fast)
        td__request_fast_pack(req, &z, p + TD_FRAME_HEADER_SIZE);
    else
        tensordd__v1__request__pack(req, p + TD_FRAME_HEADER_SIZE);
    if (extra)
        memcpy(p + TD_FRAME_HEADER_SIZE + mlen, payload, extra);
    c->wlen += TD_FRAME_HEADER_SIZE + mlen + extra;
    return journal_add(c, req->id, p, TD_FRAME_HEADER_SIZE + mlen + extra, err);
}

/* Released handles ride in one Release placed before the next request, so
 * order is kept: nothing sent later can refer to them. */
static int emit_releases(td_client *c, td_error *err)
{
    if (!c->nrel || c->capturing) /* a recorded Release would free what the client holds */
        return 0;
    Tensordd__V1__Release rel = TENSORDD__V1__RELEASE__INIT;
    rel.n_handles = c->nrel;
    rel.handles = c->rel;
    Tensordd__V1__Request req = TENSORDD__V1__REQUEST__INIT;
    req.id = c->next_request++;
    req.body_case = TENSORDD__V1__REQUEST__BODY_RELEASE;
    req.release = &rel;
    int rc = append_frame(c, &req, NULL, 0, 0, err);
    if (rc == 0)
        c->nrel = 0;
    return rc;
}

int td__flush(td_client *c, td_error *err)
{
    int rc = emit_releases(c, err);
    if (!rc)
        rc = flush_with(c, NULL, 0, err);
    return rc && td__resumable(c, rc) ? td__resume(c, err) : rc;
}

/* ---------------------------------------------------------------- reading */

/* Reads whatever is available (at least one byte) into rbuf. */
static int fill(td_client *c, td_error *err)
{
    if (c->rpos == c->rlen)
        c->rpos = c->rlen = 0;
    if (c->rlen == c->rcap && c->rpos) {
        /* compact before growing */
        memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
    }
    for (;;) {
        ssize_t k = recv_wait(c, c->rbuf + c->rlen, c->rcap - c->rlen);
        if (k > 0) {
            c->rlen += (size_t)k;
            return 0;
        }
        if (k == 0)
            return kill_stream(c, err, TD_ECLOSED, "the daemon closed the connection");
        if (k == RECV_TIMEOUT)
            return kill_stream(c, err, TD_ETIMEOUT, "timed out waiting for the daemon");
        if (k == RECV_POLL_FAILED)
            return kill_stream(c, err, TD_EIO, "poll failed while receiving");
        if (k == RECV_TLS_FAILED)
            return kill_stream(c, err, c->tls_code, c->tls_why);
        if (errno == EINTR)
            continue;
        if (errno == ECONNRESET)
            return kill_stream(c, err, TD_ECLOSED, "connection reset by the daemon");
        return kill_stream(c, err, TD_EIO, strerror(errno));
    }
}

/* Makes n contiguous bytes available at rbuf+rpos. */
static int need(td_client *c, size_t n, td_error *err)
{
    if (c->rcap - c->rpos < n) {
        if (c->rpos)
            memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
        c->rlen -= c->rpos;
        c->rpos = 0;
        size_t want = n < RBUF_INITIAL ? RBUF_INITIAL : n;
        if (c->rcap < want) {
            uint8_t *b = realloc(c->rbuf, want);
            if (!b)
                return kill_stream(c, err, TD_ERESOURCE_EXHAUSTED, "out of memory for a reply");
            c->rbuf = b;
            c->rcap = want;
        }
    }
    while (c->rlen - c->rpos < n) {
        int rc = fill(c, err);
        if (rc)
            return rc;
    }
    return 0;
}

/* A response rid arrived (its message read; plen payload bytes follow): the daemon
 * applied every request up to rid; the caller reads the payload of its own (mine). */
static void note_response(td_client *c, uint64_t rid, uint64_t plen, int mine)
{
    if (!c->resume_window_s || c->recovering || !rid)
        return;
    journal_ack(c, rid);
    if (plen && mine) {
        c->cur_id = rid;
        c->payload_left = plen;
    } else if (!plen) {
        c->last_received = rid;
    }
}

static void payload_read(td_client *c, uint64_t n)
{
    if (!c->payload_left)
        return;
    c->payload_left -= n < c->payload_left ? n : c->payload_left;
    if (!c->payload_left)
        c->last_received = c->cur_id;
}

static int read_payload_raw(td_client *c, void *dst, uint64_t len, td_error *err);
static int drain_raw(td_client *c, uint64_t len, td_error *err);
static int wait_for(td_client *c, uint64_t id, int body_only, td__reply *out, td_error *err);

/* After a resume in the middle of the payload the caller reads: the daemon sends the
 * whole answer again; its head is read and what was read before this call skipped. */
static int payload_resync(td_client *c, uint64_t left_before, td_error *err)
{
    uint64_t id = c->cur_id;
    td__reply r;
    int rc = wait_for(c, id, 1, &r, err);
    if (rc)
        return rc;
    td__reply_free(&r);
    if (r.payload_len < left_before) {
        c->dead = TD_ECONNECTION_LOST;
        return td__fail(err, TD_ECONNECTION_LOST,
                        "resumed, the daemon sent another answer than the one cut off");
    }
    rc = drain_raw(c, r.payload_len - left_before, err);
    c->payload_left = left_before;
    return rc;
}

/* Reads len payload bytes into dst (NULL: drops them); where the connection is lost in
 * the middle, resumes the session (when it can) and reads the answer again. */
static int take_payload(td_client *c, void *dst, uint64_t len, td_error *err)
{
    uint64_t before = c->payload_left;
    for (;;) {
        int rc = dst ? read_payload_raw(c, dst, len, err) : drain_raw(c, len, err);
        if (!rc) {
            payload_read(c, len);
            return 0;
        }
        if (!td__resumable(c, rc) || !before)
            return rc;
        while ((rc = td__resume(c, err)) == 0 && (rc = payload_resync(c, before, err)) != 0 &&
               td__resumable(c, rc))
            ;
        if (rc)
            return rc;
    }
}

int td__read_payload(td_client *c, void *dst, uint64_t len, td_error *err)
{
    return take_payload(c, dst, len, err);
}

int td__drain(td_client *c, uint64_t len, td_error *err)
{
    return take_payload(c, NULL, len, err);
}

static int read_payload_raw(td_client *c, void *dst, uint64_t len, td_error *err)
{
    uint8_t *out = dst;
    uint64_t got = 0;
    /* What already arrived with the message is copied (at most a buffer's
     * worth); the bulk goes from the socket straight into dst. */
    size_t have = c->rlen - c->rpos;
    if (have) {
        size_t take = have < len ? have : (size_t)len;
        memcpy(out, c->rbuf + c->rpos, take);
        c->rpos += take;
        got = take;
    }
    while (got < len) {
        uint64_t want = len - got;
        size_t slice = want < PAYLOAD_SLICE ? (size_t)want : PAYLOAD_SLICE;
        ssize_t k = recv_wait(c, out + got, slice);
        if (k > 0) {
            got += (uint64_t)k;
            if (c->progress)
                c->progress(c->progress_arg, got, len);
            continue;
        }
        if (k == 0)
            return kill_stream(c, err, TD_ECLOSED, "the daemon closed the connection mid-payload");
        if (k == RECV_TIMEOUT)
            return kill_stream(c, err, TD_ETIMEOUT, "timed out receiving a payload");
        if (k == RECV_POLL_FAILED)
            return kill_stream(c, err, TD_EIO, "poll failed while receiving");
        if (k == RECV_TLS_FAILED)
            return kill_stream(c, err, c->tls_code, c->tls_why);
        if (errno == EINTR)
            continue;
        return kill_stream(c, err, errno == ECONNRESET ? TD_ECLOSED : TD_EIO, strerror(errno));
    }
    return 0;
}

static int drain_raw(td_client *c, uint64_t len, td_error *err)
{
    while (len) {
        if (c->rpos == c->rlen) {
            int rc = fill(c, err);
            if (rc)
                return rc;
        }
        size_t have = c->rlen - c->rpos;
        size_t take = have < len ? have : (size_t)len;
        c->rpos += take;
        len -= take;
    }
    return 0;
}

void td__reply_free(td__reply *r)
{
    if (r->msg)
        tensordd__v1__response__free_unpacked(r->msg, NULL);
    r->msg = NULL;
}

/* Reads responses until the one with id `id`. Others are answers to earlier
 * requests: their first error is kept for the next synchronising call. */
static int wait_for(td_client *c, uint64_t id, int body_only, td__reply *out, td_error *err)
{
    static const td_frame_limits lim = {.max_msg = TD__MAX_RESPONSE_MSG, .max_payload = UINT64_MAX};
    out->msg = NULL;
    out->payload_len = 0;
    out->body_case = TENSORDD__V1__RESPONSE__BODY__NOT_SET;
    for (;;) {
        int rc = need(c, TD_FRAME_HEADER_SIZE, err);
        if (rc && td__resumable(c, rc)) {
            if ((rc = td__resume(c, err)) != 0)
                return rc;
            continue;
        }
        if (rc) {
            /* The daemon may have said why before it hung up. */
            if (rc == TD_ECLOSED && c->has_early) {
                if (err)
                    *err = c->early;
                c->has_early = 0;
                return c->early.code;
            }
            return rc;
        }
        td_frame_header h;
        rc = td_frame_decode(c->rbuf + c->rpos, &lim, &h);
        if (rc)
            return kill_stream(c, err, TD_EPROTOCOL_ERROR, "bad frame header from the daemon");
        c->rpos += TD_FRAME_HEADER_SIZE;
        rc = need(c, h.msg_len, err);
        if (rc && td__resumable(c, rc)) {
            if ((rc = td__resume(c, err)) != 0)
                return rc;
            continue;
        }
        if (rc)
            return rc;
        uint64_t rid;
        int body;
        if (body_only && td__glance_response(c->rbuf + c->rpos, h.msg_len, &rid, &body)) {
            /* Not an error: nothing in it is needed (nor, if it answers an
             * earlier request, kept). */
            c->rpos += h.msg_len;
            note_response(c, rid, h.payload_len, rid == id);
            if (rid == id) {
                out->payload_len = h.payload_len;
                out->body_case = body;
                return 0;
            }
            rc = drain_raw(c, h.payload_len, err);
            if (rc && td__resumable(c, rc)) {
                if ((rc = td__resume(c, err)) != 0)
                    return rc;
                continue;
            }
            if (rc)
                return rc;
            continue;
        }
        Tensordd__V1__Response *r =
            tensordd__v1__response__unpack(NULL, h.msg_len, c->rbuf + c->rpos);
        c->rpos += h.msg_len;
        if (!r)
            return kill_stream(c, err, TD_EPROTOCOL_ERROR, "undecodable response from the daemon");
        note_response(c, r->id, h.payload_len, r->id == id);
        if (r->id == id) {
            out->msg = r;
            out->payload_len = h.payload_len;
            out->body_case = (int)r->body_case;
            return 0;
        }
        if (r->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR && r->error && !c->has_early) {
            td__from_pb(r->error, &c->early);
            if (!c->early.request_id)
                c->early.request_id = r->id;
            c->has_early = 1;
        }
        tensordd__v1__response__free_unpacked(r, NULL);
        rc = drain_raw(c, h.payload_len, err);
        if (rc && td__resumable(c, rc)) {
            if ((rc = td__resume(c, err)) != 0)
                return rc;
            continue;
        }
        if (rc)
            return rc;
    }
}

int td__call(td_client *c, Tensordd__V1__Request *req, const void *payload, uint64_t payload_len,
             td__reply *reply, td_error *err)
{
    return td__call_ex(c, req, payload, payload_len, reply, 0, err);
}

int td__call_ex(td_client *c, Tensordd__V1__Request *req, const void *payload, uint64_t payload_len,
                td__reply *reply, int body_only, td_error *err)
{
    if (c->dead)
        return td__fail(err, c->dead, "connection unusable after an earlier failure (%s)",
                        td_err_name(c->dead));
    int rc = emit_releases(c, err);
    if (rc)
        return rc;
    req->id = c->next_request++;
    if (reply)
        req->want_reply = 1;
    /* (resumable: into the write buffer, so the journal keeps a copy to send again) */
    int inl = payload_len <= TD__INLINE_PAYLOAD || c->resume_window_s;
    rc = append_frame(c, req, payload, payload_len, inl, err);
    if (rc)
        return rc;
    if (!inl) {
        /* The caller may free its buffer when we return: send it now. */
        rc = flush_with(c, payload, payload_len, err);
    } else if (reply || c->wlen >= TD__FLUSH_AT) {
        rc = flush_with(c, NULL, 0, err);
    }
    if (rc && td__resumable(c, rc))
        rc = td__resume(c, err); /* (the journal holds this request: it is sent again) */
    if (rc || !reply)
        return rc;
    rc = wait_for(c, req->id, body_only, reply, err);
    if (rc)
        return rc;
    if (reply->msg && reply->msg->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR &&
        reply->msg->error) {
        td_error le;
        rc = td__from_pb(reply->msg->error, &le);
        if (!le.request_id)
            le.request_id = req->id;
        /* Already told (say, an unsolicited answer to the same request): once is enough. */
        if (c->has_early && c->early.request_id == le.request_id)
            c->has_early = 0;
        if (err)
            *err = le;
        uint64_t pl = reply->payload_len;
        td__reply_free(reply);
        int drc = td__drain(c, pl, NULL);
        return drc ? drc : rc;
    }
    return 0;
}

int td__take_early(td_client *c, td_error *err)
{
    if (!c->has_early)
        return 0;
    c->has_early = 0;
    if (err)
        *err = c->early;
    return c->early.code;
}

/* ---------------------------------------------------------------- resume */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* On the fresh connection: Hello with the resume token; *applied, the id of the last
 * request the daemon applied. */
static int resume_hello(td_client *c, uint64_t *applied, td_error *err)
{
    Tensordd__V1__Hello hello = TENSORDD__V1__HELLO__INIT;
    hello.min_version = TD_PROTOCOL_VERSION;
    hello.max_version = TD_PROTOCOL_VERSION;
    hello.token = c->token;
    hello.client_name = c->client_name;
    hello.resume_window = c->resume_window_s;
    hello.resume_token.data = c->resume_token;
    hello.resume_token.len = sizeof c->resume_token;
    hello.last_received = c->last_received;
    Tensordd__V1__Request req = TENSORDD__V1__REQUEST__INIT;
    req.body_case = TENSORDD__V1__REQUEST__BODY_HELLO;
    req.hello = &hello;
    req.id = c->next_request++;
    size_t mlen = tensordd__v1__request__get_packed_size(&req);
    uint8_t *frame = malloc(TD_FRAME_HEADER_SIZE + mlen);
    if (!frame)
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
    td_frame_encode(frame, (uint32_t)mlen, 0);
    tensordd__v1__request__pack(&req, frame + TD_FRAME_HEADER_SIZE);
    int rc = td__send_raw(c, frame, TD_FRAME_HEADER_SIZE + mlen, err);
    free(frame);
    if (rc)
        return rc;
    td__reply r;
    if ((rc = wait_for(c, req.id, 0, &r, err)) != 0)
        return rc;
    const Tensordd__V1__Response *m = r.msg;
    if (m->body_case == TENSORDD__V1__RESPONSE__BODY_ERROR && m->error)
        rc = td__from_pb(m->error, err);
    else if (m->body_case != TENSORDD__V1__RESPONSE__BODY_HELLO || !m->hello || !m->hello->resumed)
        rc = td__fail(err, TD_ECONNECTION_LOST, "the daemon did not resume the session");
    else
        *applied = m->hello->last_applied;
    uint64_t pl = r.payload_len;
    td__reply_free(&r);
    if (!rc && pl)
        rc = drain_raw(c, pl, err);
    return rc;
}

int td__resume(td_client *c, td_error *err)
{
    c->recovering = 1;
    uint64_t deadline = now_ms() + (uint64_t)c->resume_window_s * 1000u;
    unsigned delay = TD__RESUME_BACKOFF_MS;
    td_error e = {0};
    int rc = TD_ECONNECTION_LOST;
    for (int i = 0; i < TD__RESUME_TRIES; i++) {
        td__close_stream(c);
        c->rpos = c->rlen = 0;
        c->wlen = 0; /* (every queued frame is in the journal) */
        c->dead = 0;
        uint64_t applied = 0;
        rc = td__open(c, c->endpoint, c->has_tls ? &c->tls_opts : NULL, &e);
        if (!rc) {
            td__set_timeout(c, c->timeout_ms);
            rc = resume_hello(c, &applied, &e);
        }
        if (!rc) {
            journal_ack(c, applied);
            if (c->jlen)
                rc = td__send_raw(c, c->jbuf, c->jlen, &e);
        }
        if (!rc) {
            c->recovering = 0;
            c->resumes++;
            return 0;
        }
        if (rc != TD_ECLOSED && rc != TD_EIO && rc != TD_ETIMEOUT)
            break; /* the daemon refused: no such session, another identity, ... */
        if (now_ms() + delay > deadline)
            break;
        struct timespec ts = {.tv_sec = delay / 1000, .tv_nsec = (long)(delay % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        delay = delay * 2 > 1000 ? 1000 : delay * 2;
    }
    c->recovering = 0;
    td__close_stream(c);
    if (rc != TD_ECLOSED && rc != TD_EIO && rc != TD_ETIMEOUT) {
        c->dead = rc;
        if (err)
            *err = e;
        return rc;
    }
    c->dead = TD_ECONNECTION_LOST;
    return td__fail(err, TD_ECONNECTION_LOST,
                    "the connection was lost and could not be resumed within the session's "
                    "window (%s)",
                    e.message);
}
