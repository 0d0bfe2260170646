/* server_fds.c -- fds a same-host peer passes with its bytes (SCM_RIGHTS): matched
 * to the request they came with, stray ones refused. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "server_impl.h"

/* Takes the fds libuv received with the bytes [from, to) of the stream into c->fds.
 * libuv hands a received fd out only into a handle (uv_accept): a pipe handle takes it,
 * the daemon keeps a duplicate, and closing the handle closes the original. More than
 * --max-conn-fds waiting is a protocol error. Returns 0, or -1 when c was failed. */
int srv_take_fds(tdd_conn *c, uint64_t from, uint64_t to)
{
    bool over = false;
    while (uv_pipe_pending_count(&c->h.pipe) > 0) {
        uv_pipe_t *p = malloc(sizeof *p);
        if (!p || uv_pipe_init(srv.loop, p, 0) != 0) {
            free(p);
            srv_fail_protocol(c, TD_ERESOURCE_EXHAUSTED, "out of memory taking a file descriptor");
            return -1;
        }
        int fd = -1;
        uv_os_fd_t ofd = -1;
        if (uv_accept(&c->h.stream, (uv_stream_t *)p) == 0 &&
            uv_fileno((uv_handle_t *)p, &ofd) == 0)
            fd = fcntl(ofd, F_DUPFD_CLOEXEC, 3);
        uv_close((uv_handle_t *)p, srv_free_handle);
        if (ofd >= 0 && ofd <= STDERR_FILENO) /* (libuv leaves fds 0..2 open on close) */
            close(ofd);
        if (fd < 0)
            continue;
        if (c->nfds >= (int)tdd_cfg.max_conn_fds) {
            close(fd);
            over = true;
            continue;
        }
        c->fds[c->nfds++] = (struct tdd_conn_fd){fd, from, to};
    }
    if (over) {
        char why[160];
        snprintf(why, sizeof why,
                 "more than %u file descriptors sent and not yet taken by a request "
                 "(--max-conn-fds)",
                 tdd_cfg.max_conn_fds);
        srv_fail_protocol(c, TD_EPROTOCOL_ERROR, why);
        return -1;
    }
    return 0;
}

void srv_drop_fds(tdd_conn *c, int n)
{
    if (n <= 0)
        return;
    for (int i = 0; i < n; i++)
        close(c->fds[i].fd);
    memmove(c->fds, c->fds + n, (size_t)(c->nfds - n) * sizeof c->fds[0]);
    c->nfds -= n;
}

/* At a frame boundary at stream byte at: an fd that arrived with bytes before it was
 * taken by no request of its own read (a request that takes none, or an extra one).
 * Returns -1 when the connection was failed for it. */
int srv_check_stray_fds(tdd_conn *c, uint64_t at)
{
    if (!c->nfds || c->fds[0].to > at)
        return 0;
    int n = 0;
    while (n < c->nfds && c->fds[n].to <= at)
        n++;
    srv_drop_fds(c, n);
    srv_fail_protocol(c, TD_EPROTOCOL_ERROR,
                      "a file descriptor came with a request that takes none (only an Upload "
                      "with payload_fd does, one each); it was closed");
    return -1;
}

/* Whether an fd came with the read holding the first byte of the frame at [at, end)
 * and with no later frame's: that read ended within the frame (the kernel ends a read
 * with the data an fd came with), so this frame is the one it was sent with. */
bool srv_fd_is_for(const tdd_conn *c, uint64_t at, uint64_t end)
{
    for (int i = 0; i < c->nfds; i++)
        if (c->fds[i].from <= at && at < c->fds[i].to && c->fds[i].to <= end)
            return true;
    return false;
}

/* An Upload with payload_fd starting at stream byte at takes the fds that arrived with
 * the read holding its first byte: c->req_fd, the others closed (the handler refuses
 * the Upload when req_nfds is not 1). */
void srv_claim_fds(tdd_conn *c, uint64_t at)
{
    int i = 0;
    while (i < c->nfds && !(c->fds[i].from <= at && at < c->fds[i].to))
        i++;
    int n = 0;
    while (i + n < c->nfds && c->fds[i + n].from <= at && at < c->fds[i + n].to)
        n++;
    if (!n)
        return;
    c->req_fd = c->fds[i].fd;
    c->req_nfds = n;
    for (int k = 1; k < n; k++)
        close(c->fds[i + k].fd);
    memmove(c->fds + i, c->fds + i + n, (size_t)(c->nfds - i - n) * sizeof c->fds[0]);
    c->nfds -= n;
}
