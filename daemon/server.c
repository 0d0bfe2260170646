/* server.c -- the transport: listeners bound (tcp://, tls://, unix://, fd://) and checked
 * for exposure, the server started, reloaded and shut down. A connection's reads, writes,
 * passed fds, TLS, life and watchdog are in server_*.c. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "reply.h"
#include "resume.h"
#include "server_impl.h"

struct tdd_server_state srv;

static bool is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a);
}

/* HOST:PORT of a tcp:// or tls:// endpoint into ss: 0, or a libuv error code with why[]
 * filled when the code alone would not say it. */
static int parse_hostport(const char *hostport, struct sockaddr_storage *ss, long *portp, char *why,
                          size_t wn)
{
    char host[128];
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || !colon[1])
        return UV_EINVAL;
    size_t hl = (size_t)(colon - hostport);
    if (hl >= sizeof host)
        return UV_EINVAL;
    memcpy(host, hostport, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return UV_EINVAL;
    *portp = port;
    if (host[0] == '[') {
        if (hl < 2 || host[hl - 1] != ']')
            return UV_EINVAL;
        host[hl - 1] = 0;
        return uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss);
    }
    int rc = uv_ip4_addr(strcmp(host, "localhost") == 0 ? "127.0.0.1" : host, (int)port,
                         (struct sockaddr_in *)ss);
    if (rc)
        snprintf(why, wn, "'%s' is not an IP address (nor localhost)", host);
    return rc;
}

/* A listener beyond loopback needs TLS or a token, unless --insecure. */
static int check_exposure(const struct sockaddr_storage *ss, bool tls, char *why, size_t wn)
{
    if (is_loopback(ss) || tdd_cfg.token_len || tls || tdd_cfg.insecure)
        return 0;
    snprintf(why, wn,
             "a listener beyond loopback needs TLS (tls://, --tls-cert, --tls-key) or "
             "a token (--token-file): anyone who can reach it could read the tensors "
             "and run code on this machine's devices (--insecure overrides)");
    return UV_EACCES;
}

/* --unix-group as a gid ((gid_t)-1 when unset): 0, or UV_EINVAL with why[]. */
static int unix_group_gid(gid_t *gid, char *why, size_t wn)
{
    *gid = (gid_t)-1;
    if (!tdd_cfg.unix_group[0])
        return 0;
    struct group *g = getgrnam(tdd_cfg.unix_group);
    char *end;
    unsigned long n = strtoul(tdd_cfg.unix_group, &end, 10);
    if (g)
        *gid = g->gr_gid;
    else if (!*end && end != tdd_cfg.unix_group)
        *gid = (gid_t)n;
    else {
        snprintf(why, wn, "--unix-group %s: no such group", tdd_cfg.unix_group);
        return UV_EINVAL;
    }
    return 0;
}

/* Each listen_* returns 0 or a libuv error code, with why[] saying what went wrong
 * in words when the code alone would not (tdd_server_start prints both). */
static int listen_tcp(listener *l, const char *hostport, char *why, size_t wn)
{
    struct sockaddr_storage ss;
    long port = 0;
    int prc = parse_hostport(hostport, &ss, &port, why, wn);
    if (prc)
        return prc;
    bool v6 = ss.ss_family == AF_INET6;
    if ((prc = check_exposure(&ss, l->tls, why, wn)))
        return prc;
    l->bare = !is_loopback(&ss) && !l->tls; /* SIGHUP may not take its token away */
    if (l->bare && !tdd_cfg.token_len)
        tdd_warn("INSECURE: listening on %s without TLS or a token (--insecure): anyone who "
                 "can reach it can read every tensor and run code on this machine's devices",
                 hostport);
    uv_tcp_init(srv.loop, &l->h.tcp);
    l->h.handle.data = l;
    int rc = uv_tcp_bind(&l->h.tcp, (struct sockaddr *)&ss, 0);
    if (!rc)
        rc = uv_listen(&l->h.stream, 511, srv_on_connection);
    if (rc) {
        if (rc == UV_EACCES && port < 1024)
            snprintf(why, wn, "%s (ports below 1024 need root or CAP_NET_BIND_SERVICE)",
                     uv_strerror(rc));
        l->open = true; /* initialised: closed by close_listeners */
        return rc;
    }
    l->open = true;
    int n = sizeof ss;
    uv_tcp_getsockname(&l->h.tcp, (struct sockaddr *)&ss, &n);
    char ip[64];
    const char *scheme = l->tls ? "tls" : "tcp";
    if (v6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
        snprintf(l->endpoint, sizeof l->endpoint, "%s://[%s]:%d", scheme, ip,
                 ntohs(((struct sockaddr_in6 *)&ss)->sin6_port));
    } else {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
        snprintf(l->endpoint, sizeof l->endpoint, "%s://%s:%d", scheme, ip,
                 ntohs(((struct sockaddr_in *)&ss)->sin_port));
    }
    return 0;
}

/* What is at a Unix socket's path: 0 nothing (or a stale socket, removed), else an
 * error with why[] filled: a live daemon answers there, or it is not a socket. */
static int unix_path_free(const char *path, char *why, size_t wn)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : uv_translate_sys_error(errno);
    if (!S_ISSOCK(sb.st_mode)) {
        snprintf(why, wn, "the path exists and is not a socket (not removing it)");
        return UV_EEXIST;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return uv_translate_sys_error(errno);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : errno;
    close(fd);
    if (rc == ECONNREFUSED) {
        /* Nobody listens: a stale socket from an earlier run. */
        if (unlink(path) != 0 && errno != ENOENT)
            return uv_translate_sys_error(errno);
        tdd_info("removed stale socket %s (nothing was listening on it)", path);
        return 0;
    }
    if (rc == 0 || rc == EAGAIN || rc == EINPROGRESS) {
        snprintf(why, wn,
                 "another process is listening on it (a running tensordd?); stop it, or "
                 "choose another path");
        return UV_EADDRINUSE;
    }
    return uv_translate_sys_error(rc);
}

static int listen_unix(listener *l, const char *path, char *why, size_t wn)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (!path[0] || strlen(path) >= sizeof l->unix_path || strlen(path) >= sizeof sa.sun_path) {
        snprintf(why, wn, "expected unix:///PATH with a path of 1 to %zu bytes",
                 sizeof sa.sun_path - 1);
        return UV_EINVAL;
    }
    gid_t gid;
    int rc = unix_group_gid(&gid, why, wn);
    if (rc)
        return rc;
    rc = unix_path_free(path, why, wn);
    if (rc)
        return rc;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return uv_translate_sys_error(errno);
    /* Created 0600 (never wider, even for a moment), then given its mode and group. */
    mode_t old = umask(0177);
    rc = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : errno;
    umask(old);
    if (rc) {
        close(fd);
        if (rc == ENOENT || rc == ENOTDIR)
            snprintf(why, wn, "%s (the directory does not exist)", strerror(rc));
        return uv_translate_sys_error(rc);
    }
    struct stat sb;
    if ((gid != (gid_t)-1 && chown(path, (uid_t)-1, gid) != 0) ||
        chmod(path, (mode_t)tdd_cfg.unix_mode) != 0 || stat(path, &sb) != 0) {
        rc = errno;
        if (gid != (gid_t)-1)
            snprintf(why, wn, "setting group %s and mode %04o: %s", tdd_cfg.unix_group,
                     tdd_cfg.unix_mode, strerror(rc));
        close(fd);
        unlink(path);
        return uv_translate_sys_error(rc);
    }
    uv_pipe_init(srv.loop, &l->h.pipe, 0);
    l->h.handle.data = l;
    l->open = true;
    rc = uv_pipe_open(&l->h.pipe, fd);
    if (rc)
        close(fd);
    else
        rc = uv_listen(&l->h.stream, 511, srv_on_connection);
    if (rc) {
        unlink(path);
        return rc;
    }
    /* Removed at exit only while it is still ours (not another daemon's since). */
    l->unix_dev = sb.st_dev;
    l->unix_ino = sb.st_ino;
    snprintf(l->unix_path, sizeof l->unix_path, "%s", path);
    snprintf(l->endpoint, sizeof l->endpoint, "unix://%s", path);
    return 0;
}

/* Removes a Unix socket this daemon created, if the path still names it. */
static void unlink_own(listener *l)
{
    struct stat sb;
    if (l->unix_path[0] && lstat(l->unix_path, &sb) == 0 && sb.st_dev == l->unix_dev &&
        sb.st_ino == l->unix_ino)
        unlink(l->unix_path);
    l->unix_path[0] = 0;
}

/* fd://N: a listening socket systemd passed (socket activation). Its endpoint names
 * what it is; the socket file belongs to systemd and is never removed here. A TCP one
 * beyond loopback needs a token, as --listen's. */
static int listen_fd(listener *l, const char *num, char *why, size_t wn)
{
    char *end;
    long fd = strtol(num, &end, 10);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int type = 0, acc = 0;
    socklen_t tl = sizeof type, al = sizeof acc;
    if (*end || end == num || fd < 3 || fd > 1024 ||
        getsockname((int)fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 ||
        getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) != 0 || type != SOCK_STREAM ||
        !acc) {
        snprintf(why, wn, "not a listening stream socket");
        return UV_EINVAL;
    }
    int rc;
    if (ss.ss_family == AF_UNIX) {
        uv_pipe_init(srv.loop, &l->h.pipe, 0);
        l->open = true;
        rc = uv_pipe_open(&l->h.pipe, (int)fd);
        snprintf(l->endpoint, sizeof l->endpoint, "unix://%s",
                 ((struct sockaddr_un *)&ss)->sun_path);
    } else if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) {
        l->bare = !is_loopback(&ss);
        if (l->bare && !tdd_cfg.token_len) {
            snprintf(why, wn, "a listener beyond loopback needs a token (--token-file)");
            return UV_EACCES;
        }
        uv_tcp_init(srv.loop, &l->h.tcp);
        l->open = true;
        rc = uv_tcp_open(&l->h.tcp, (uv_os_sock_t)fd);
        char ip[64];
        int port;
        if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
            snprintf(l->endpoint, sizeof l->endpoint, "tcp://[%s]:%d", ip, port);
        } else {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
            snprintf(l->endpoint, sizeof l->endpoint, "tcp://%s:%d", ip, port);
        }
    } else {
        snprintf(why, wn, "socket family %d is neither unix nor tcp", ss.ss_family);
        return UV_EINVAL;
    }
    l->h.handle.data = l;
    if (!rc)
        rc = uv_listen(&l->h.stream, 511, srv_on_connection);
    return rc;
}

/* A failed start: the listeners opened so far are closed and their sockets removed. */
static void close_listeners(void)
{
    for (int i = 0; i <= srv.nlisteners && i < TDD_MAX_LISTEN; i++) {
        listener *l = &srv.listeners[i];
        unlink_own(l);
        if (l->open && !uv_is_closing(&l->h.handle))
            uv_close(&l->h.handle, NULL);
    }
    uv_run(srv.loop, UV_RUN_NOWAIT);
}

/* What would stop tdd_server_start before it binds anything, checked without binding:
 * the TLS files (loaded, the key matched to the certificate), each endpoint's form,
 * the rule that a listener beyond loopback needs TLS or a token, a Unix socket's path
 * and --unix-group. 0, or -1 with why[] naming the setting and what is wrong; *ctx (when
 * not NULL) gets the TLS context, NULL without tls:// listeners. */
static int validate(const tdd_config *cfg, tdd_tls_ctx **ctx, char *why, size_t wn)
{
    bool want_tls = false;
    for (int i = 0; i < cfg->nlisten; i++)
        want_tls |= strncmp(cfg->listen[i], "tls://", 6) == 0;
    bool have_cert = cfg->tls_cert[0] || cfg->tls_key[0] || cfg->tls_client_ca[0];
    tdd_tls_ctx *x = NULL;
    if (want_tls || have_cert) {
        char w[700] = "";
        if (!want_tls)
            snprintf(w, sizeof w,
                     "--tls-cert, --tls-key and --tls-client-ca apply to "
                     "tls:// srv.listeners, and none is configured");
        else if (!cfg->tls_cert[0] || !cfg->tls_key[0])
            snprintf(w, sizeof w, "a tls:// listener needs --tls-cert and --tls-key");
        else
            x = tdd_tls_ctx_new(cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca, w, sizeof w);
        if (!x) {
            snprintf(why, wn, "cannot start TLS: %s", w);
            return -1;
        }
    }
    for (int i = 0; i < cfg->nlisten; i++) {
        const char *ep = cfg->listen[i];
        char w[400] = "";
        int rc = 0;
        if (strncmp(ep, "tcp://", 6) == 0 || strncmp(ep, "tls://", 6) == 0) {
            struct sockaddr_storage ss;
            long port;
            rc = parse_hostport(ep + 6, &ss, &port, w, sizeof w);
            if (!rc)
                rc = check_exposure(&ss, ep[1] == 'l', w, sizeof w);
        } else if (strncmp(ep, "unix://", 7) == 0) {
            gid_t gid;
            if (!ep[7] || strlen(ep + 7) >= sizeof(((struct sockaddr_un *)0)->sun_path))
                rc = UV_EINVAL; /* listen_unix says how long it may be */
            else
                rc = unix_group_gid(&gid, w, sizeof w);
        } else if (strncmp(ep, "fd://", 5) != 0) { /* fd:// is checked when systemd passes it */
            rc = UV_EINVAL;
        }
        if (rc) {
            if (rc == UV_EINVAL && !w[0] && strncmp(ep, "unix://", 7) == 0)
                snprintf(w, sizeof w, "expected unix:///PATH with a path of 1 to %zu bytes",
                         sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
            snprintf(why, wn, "cannot listen on %s: %s", ep,
                     w[0]              ? w
                     : rc == UV_EINVAL ? "expected tcp://HOST:PORT, tls://HOST:PORT or unix:///PATH"
                                       : uv_strerror(rc));
            tdd_tls_ctx_free(x);
            return -1;
        }
    }
    if (ctx)
        *ctx = x;
    else
        tdd_tls_ctx_free(x);
    return 0;
}

int tdd_server_check(const tdd_config *cfg, char *why, size_t wn)
{
    return validate(cfg, NULL, why, wn);
}

int tdd_server_start(uv_loop_t *lp, const tdd_config *cfg, tdd_request_fn on_req)
{
    static const tdd_transport transport = {.send = srv_conn_send,
                                            .send_encoded = srv_conn_send_encoded,
                                            .pause = srv_conn_pause,
                                            .resume = srv_conn_resume,
                                            .kick = srv_conn_kick,
                                            .admit = srv_conn_admit,
                                            .drop = srv_conn_close};
    srv.loop = lp;
    tdd_resume_init(lp);
    srv.on_request = on_req;
    tdd_reply_init(&transport);
    char bad[1200];
    if (validate(cfg, &srv.tls_ctx, bad, sizeof bad)) { /* the same as --check-config's */
        tdd_error("%s", bad);
        return UV_EINVAL;
    }
    uv_timer_init(srv.loop, &srv.trim_timer);
    uv_unref((uv_handle_t *)&srv.trim_timer); /* keeps nothing running */
    srv.trim_armed = true;
    for (int i = 0; i < cfg->nlisten; i++) {
        listener *l = &srv.listeners[srv.nlisteners];
        const char *ep = cfg->listen[i];
        char why[400] = "";
        int rc;
        l->tls = strncmp(ep, "tls://", 6) == 0;
        if (strncmp(ep, "tcp://", 6) == 0 || l->tls)
            rc = listen_tcp(l, ep + 6, why, sizeof why);
        else if (strncmp(ep, "unix://", 7) == 0)
            rc = listen_unix(l, ep + 7, why, sizeof why);
        else if (strncmp(ep, "fd://", 5) == 0)
            rc = listen_fd(l, ep + 5, why, sizeof why);
        else
            rc = UV_EINVAL;
        if (rc) {
            tdd_error("cannot listen on %s: %s", ep,
                      why[0] ? why
                      : rc == UV_EINVAL
                          ? "expected tcp://HOST:PORT, tls://HOST:PORT or unix:///PATH"
                          : uv_strerror(rc));
            close_listeners();
            return rc;
        }
        srv.nlisteners++;
    }
    /* Announced once every listener is up, so a script that saw the first line may use
     * any of them. stdout's line is for scripts (port 0); the log's has a time and a
     * level (and is the only one when stdout is the journal too). */
    for (int i = 0; i < srv.nlisteners; i++) {
        const char *ep = cfg->listen[i];
        if (!tdd_log_is_journal(STDOUT_FILENO))
            printf("listening on %s\n", srv.listeners[i].endpoint);
        if (strncmp(ep, "fd://", 5))
            tdd_info("listening on %s", srv.listeners[i].endpoint);
        else
            tdd_info("listening on %s (%s from systemd)", srv.listeners[i].endpoint, ep);
    }
    fflush(stdout);
    return 0;
}

int tdd_server_reload_tls(const tdd_config *cfg, char *why, size_t wn)
{
    if (!srv.tls_ctx)
        return 1;
    if (!cfg->tls_cert[0] || !cfg->tls_key[0]) {
        snprintf(why, wn, "a tls:// listener needs --tls-cert and --tls-key");
        return -1;
    }
    tdd_tls_ctx *x = tdd_tls_ctx_new(cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca, why, wn);
    if (!x)
        return -1;
    tdd_tls_ctx_free(srv.tls_ctx); /* open connections hold a reference to its SSL_CTX */
    srv.tls_ctx = x;
    return 0;
}

bool tdd_server_needs_token(void)
{
    for (int i = 0; i < srv.nlisteners; i++)
        if (srv.listeners[i].bare)
            return true;
    return false;
}

uint32_t tdd_server_admitted(void)
{
    return srv.n_admitted;
}

const char *tdd_server_refusal(void)
{
    if (srv.shutting_down)
        return "shutting down";
    if (srv.nlisteners == 0)
        return "not listening";
    if (srv_at_session_limit())
        return tdd_resume_held() ? "at --max-sessions (counting sessions held for resume)"
                                 : "at --max-sessions";
    return NULL;
}

bool tdd_server_accepting(void)
{
    return tdd_server_refusal() == NULL;
}

const char *tdd_server_endpoint(int i)
{
    return i >= 0 && i < srv.nlisteners ? srv.listeners[i].endpoint : NULL;
}

void tdd_server_shutdown(void)
{
    if (srv.shutting_down)
        return;
    srv.shutting_down = true;
    if (srv.trim_armed) {
        srv.trim_armed = false;
        uv_close((uv_handle_t *)&srv.trim_timer, NULL);
    }
    if (!srv.conns)
        srv_yield_close();
    tdd_info("shutting down: %llu session(s) open", (unsigned long long)tdd_nsessions);
    tdd_resume_drop_all(); /* held sessions have no connection to say goodbye on */
    for (int i = 0; i < srv.nlisteners; i++) {
        if (srv.listeners[i].unix_path[0])
            unlink_own(&srv.listeners[i]);
        if (!srv.conns && !uv_is_closing(&srv.listeners[i].h.handle))
            uv_close(&srv.listeners[i].h.handle, NULL);
        else if (!uv_is_closing(&srv.listeners[i].h.handle))
            uv_read_stop(&srv.listeners[i].h.stream); /* no-op for listeners; closed below */
    }
    for (int i = 0; i < srv.nlisteners; i++)
        if (!uv_is_closing(&srv.listeners[i].h.handle))
            uv_close(&srv.listeners[i].h.handle, NULL);
    tdd_conn *c = srv.conns;
    while (c) {
        tdd_conn *next = c->next;
        c->draining = true;
        if (!c->in_payload) {
            if (c->reading)
                uv_read_stop(&c->h.stream);
            c->reading = false;
        }
        srv_conn_kick(c);
        c = next;
    }
}
