/* data_req.c -- tensor bytes in and out: Upload and Download over the socket, through
 * a host staging buffer for device memory, or as a memfd on the same host (rows of
 * dispatch.c's table). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "exec_op.h"
#include "handlers.h"
#include "memfd.h"
#include "resume.h"
#include "stats.h"
#include "wire.h"

typedef Tensordd__V1__Request Request;

/* ---- staging: device memory the socket cannot read or write directly (cuda),
 * and strided host views, go through a host buffer filled on the device's worker
 * so that the loop thread never copies tensor data. */

typedef struct {
    tdd_session *s;
    tdd_value *v;
    tdd_storage *host; /* host staging buffer, accounted to the session */
    uint64_t req_id;
    bool want_reply;
    int rc;
    char why[192]; /* what the device said of a failed copy (error_message) */
} staged;

static staged *staged_new(tdd_session *s, tdd_value *v, size_t nbytes, uint64_t req_id,
                          td_error *err)
{
    staged *st = calloc(1, sizeof *st);
    if (!st) {
        tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return NULL;
    }
    st->host = tdd_storage_alloc(tdd_default_device(), nbytes, s->acct, s->id, err);
    if (!st->host) {
        free(st);
        return NULL;
    }
    st->s = s;
    tdd_session_ref(s);
    st->v = v;
    tdd_value_ref(v);
    st->req_id = req_id;
    return st;
}

static void staged_free(staged *st)
{
    tdd_storage_unref(st->host);
    tdd_value_unref(st->v);
    tdd_session_unref(st->s);
    free(st);
}

/* Worker: device (or strided host view) -> contiguous host bytes. */
static int staged_to_host(void *arg)
{
    staged *st = arg;
    tdd_value *v = st->v;
    if (tdd_value_poisoned(v))
        return st->rc = TD_EPOISONED;
    if (v->dev->be->host_memory)
        tdd_copy_contiguous(&v->t, st->host->data);
    else
        st->rc = v->dev->be->to_host(v->dev->ctx, v->dev->ordinal, st->host->data, tdd_data(&v->t),
                                     st->host->nbytes);
    if (st->rc && st->rc != TD_EPOISONED && v->dev->be->error_message)
        v->dev->be->error_message(v->dev->ctx, v->dev->ordinal, st->rc, st->why, sizeof st->why);
    return st->rc;
}

/* Loop: answer the Download from the staging buffer, then let frames flow again. */
static void staged_download_done(void *arg, int rc)
{
    staged *st = arg;
    tdd_session *s = st->s;
    tdd_conn *c = s->closed ? NULL : s->conn;
    bool held = !c && !s->closed && s->resume; /* the answer is kept for the client's return */
    if (c || held) {
        td_error err;
        if (rc == TD_EPOISONED)
            tdd_err_poisoned(&err, st->v);
        else if (rc)
            tdd_err_set(&err, rc, "download from %s: %s", st->v->dev->label,
                        st->why[0] ? st->why : td_strerror(rc));
        if (rc)
            tdd_reply_done(s, st->req_id, true, rc, &err, NULL, false);
        else if (c)
            tdd_send_tensor(c, st->req_id, st->v, st->host->data, st->host->nbytes, st->host);
        else
            tdd_keep_tensor(s, st->req_id, st->v, st->host->data, st->host->nbytes, st->host);
        if (c)
            tdd_conn_resume(c);
    }
    staged_free(st);
}

static int staged_download(tdd_req *r, tdd_value *v, uint64_t nbytes)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    td_error err;
    tdd_session *s = c->s;
    tdd_value *src = v, *dense = NULL;
    if (!v->dev->be->host_memory && !tdd_is_contiguous(&v->t)) {
        /* The device lays the view out densely first; the copy out follows in queue order. */
        tdd_opreq oreq = {.dtype = TD_DTYPE_INVALID};
        int n_out = 1;
        if (tdd_submit_op(s, req->id, false, TDD_OP_CONTIGUOUS, &oreq, &v, 1, NULL, &dense, &n_out,
                          NULL, &err))
            return tdd_answer_error(r, &err);
        src = dense;
    }
    staged *st = staged_new(s, src, (size_t)nbytes, req->id, &err);
    if (dense)
        tdd_value_unref(dense);
    if (!st)
        return tdd_answer_error(r, &err);
    st->v->handle = v->handle;
    tdd_conn_pause(c); /* later requests wait for this reply */
    if (tdd_submit_work(s, src->dev, staged_to_host, staged_download_done, st)) {
        tdd_conn_resume(c);
        staged_free(st);
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    return TDD_DISPATCH_DONE;
}

/* A bool payload holds only bytes 0 and 1 (kernels and clients read them as bool):
 * otherwise the tensor is poisoned with INVALID_ARGUMENT, told to the client now when it
 * wants a reply, else kept as the session's pending error. Returns nonzero then. */
static int bool_payload_bad(tdd_conn *c, tdd_value *v, const uint8_t *bytes, size_t n,
                            uint64_t req_id, bool want_reply)
{
    if (v->t.dtype != TD_BOOL)
        return 0;
    size_t i = 0;
    while (i < n && bytes[i] <= 1)
        i++;
    if (i == n)
        return 0;
    td_error err;
    tdd_err_arg(&err, "payload", "bool payload byte %zu is %u: bool tensors hold 0 or 1", i,
                (unsigned)bytes[i]);
    err.request_id = req_id;
    tdd_value_poison(v, TD_EINVALID_ARGUMENT, req_id);
    tdd_count_error(err.code);
    if (want_reply)
        tdd_conn_send_error(c, req_id, &err);
    else if (c->s)
        tdd_session_fail(c->s, &err);
    return 1;
}

/* Worker: host bytes -> device memory. A failure poisons the tensor. */
static int staged_from_host(void *arg)
{
    staged *st = arg;
    tdd_value *v = st->v;
    st->rc = v->dev->be->from_host(v->dev->ctx, v->dev->ordinal, tdd_data(&v->t), st->host->data,
                                   st->host->nbytes);
    if (st->rc)
        tdd_value_poison(v, st->rc, st->req_id);
    return st->rc;
}

static void staged_upload_done(void *arg, int rc)
{
    staged *st = arg;
    td_error err;
    if (rc)
        tdd_err_set(&err, rc, "upload to %s: %s", st->v->dev->label, td_strerror(rc));
    tdd_reply_done(st->s, st->req_id, st->want_reply, rc, &err, NULL, false);
    staged_free(st);
}

/* The payload has landed in the staging buffer: queue the copy to the device. */
static void staged_upload_landed(tdd_conn *c, void *arg, int status)
{
    staged *st = arg;
    tdd_value *v = st->v;
    if (!status && c->s &&
        bool_payload_bad(c, v, st->host->data, st->host->nbytes, st->req_id, st->want_reply)) {
        staged_free(st);
        return;
    }
    if (status || tdd_submit_work(st->s, v->dev, staged_from_host, staged_upload_done, st)) {
        tdd_value_poison(v, status ? status : TD_ERESOURCE_EXHAUSTED, st->req_id);
        staged_free(st);
        return;
    }
    /* Readers on other queues wait for the copy; the session's lane orders it. */
    v->fq = tdd_device_lane(v->dev, st->s->id);
    v->fseq = tdd_queue_next_seq(v->fq) - 1;
}

/* ---------------------------------------------------------------- same-host zero copy */

/* A client's sealed memfd as a tensor's storage (memfd.h says what is checked): mapped
 * copy-on-write and charged as tdd_storage_alloc charges. Takes *fd (set to -1) whatever
 * the outcome. A 0-byte tensor maps nothing: the fd is checked, closed, and the storage
 * allocated as any other. */
static void memfd_release(void *arg)
{
    tdd_memfd_map_free(arg);
}

static tdd_storage *memfd_storage(tdd_device *dev, int *fd, uint64_t offset, uint64_t nbytes,
                                  tdd_account *acct, td_error *err)
{
    int f = *fd;
    *fd = -1;
    tdd_storage *st = NULL;
    if (nbytes == 0) {
        if (!tdd_memfd_check(f, offset, 0, err))
            st = tdd_storage_alloc(dev, 0, acct, 0, err);
        close(f);
        return st;
    }
    tdd_memfd_map *m = tdd_memfd_map_new(f, offset, nbytes, err);
    if (!m) {
        close(f);
        return NULL;
    }
    st = tdd_storage_adopt(dev, m->data, (size_t)nbytes, acct, memfd_release, m, err);
    if (!st)
        tdd_memfd_map_free(m);
    return st;
}

/* Why an Upload with payload_fd has no fd to take (0 when it has one). */
static int memfd_upload_fd_check(tdd_conn *c, uint64_t plen, int nfd, td_error *err)
{
    if (!c->fd_passing)
        return tdd_err_arg(err, "payload_fd", "%s",
                           c->h.handle.type == UV_NAMED_PIPE
                               ? "this daemon takes no file descriptors (--max-conn-fds 0)"
                               : "file descriptors cannot cross a TCP or TLS connection: "
                                 "connect to the daemon's unix:// socket");
    if (plen)
        return tdd_err_arg(err, "payload_fd",
                           "an Upload with payload_fd carries no payload (this one has %llu "
                           "bytes)",
                           (unsigned long long)plen);
    if (nfd == 0)
        return tdd_err_arg(err, "payload_fd", "no file descriptor came with this Upload");
    if (nfd > 1)
        return tdd_err_arg(err, "payload_fd",
                           "%d file descriptors came with this Upload; it takes one", nfd);
    return 0;
}

/* The Download answer whose bytes are in memfd fd from offset on (taken). */
static void memfd_send_reply(tdd_conn *c, uint64_t id, const tdd_value *v, int fd, uint64_t offset)
{
    Tensordd__V1__Response resp = TENSORDD__V1__RESPONSE__INIT;
    Tensordd__V1__TensorInfo ti = TENSORDD__V1__TENSOR_INFO__INIT;
    Tensordd__V1__Device d = TENSORDD__V1__DEVICE__INIT;
    char be[32];
    tdd_wire_device(&d, be, sizeof be, v->dev);
    ti.handle = v->handle;
    ti.dtype = (Tensordd__V1__DType)v->t.dtype;
    ti.n_shape = (size_t)v->t.ndim;
    ti.shape = (int64_t *)(uintptr_t)v->t.shape;
    ti.device = &d;
    ti.requires_grad = v->requires_grad;
    ti.payload_fd = true;
    ti.fd_offset = offset;
    resp.id = id;
    resp.body_case = TENSORDD__V1__RESPONSE__BODY_TENSOR;
    resp.tensor = &ti;
    uint8_t msg[512]; /* TensorInfo: a handful of varints and at most TD_MAX_NDIM dims */
    size_t n = protobuf_c_message_get_packed_size(&resp.base);
    if (n > sizeof msg) {
        close(fd);
        return;
    }
    protobuf_c_message_pack(&resp.base, msg);
    c->send_fd(c, msg, n, fd);
}

typedef struct {
    tdd_session *s;
    tdd_value *v;
    uint64_t req_id;
    int fd;
    uint64_t offset;
    td_error err;
} memfd_copy;

/* Worker: the storage's own memfd sealed, or the tensor's bytes copied into a new one. */
static int memfd_copy_work(void *arg)
{
    memfd_copy *j = arg;
    if (tdd_value_poisoned(j->v))
        return TD_EPOISONED;
    size_t n = (size_t)tdd_numel(&j->v->t) * td_dtype_size(j->v->t.dtype);
    j->fd = tdd_memfd_export(n ? tdd_data(&j->v->t) : "", n, &j->offset, &j->err);
    return j->fd < 0 ? j->fd : 0;
}

static void memfd_copy_done(void *arg, int rc)
{
    memfd_copy *j = arg;
    tdd_session *s = j->s;
    tdd_conn *c = s->closed ? NULL : s->conn;
    if (c) {
        if (rc == TD_EPOISONED)
            tdd_err_poisoned(&j->err, j->v);
        if (rc)
            tdd_reply_done(s, j->req_id, true, rc, &j->err, NULL, false);
        else
            memfd_send_reply(c, j->req_id, j->v, j->fd, j->offset);
        tdd_conn_resume(c);
    } else if (!rc) {
        close(j->fd);
    }
    tdd_value_unref(j->v);
    tdd_session_unref(s);
    free(j);
}

/* The session passes memfds: its large host tensors are made in memfds from now on, so
 * that their downloads need no copy (--memfd-storage-min). */
static void memfd_session(tdd_session *s)
{
    if (s->acct)
        s->acct->shm_min = tdd_cfg.memfd_storage_min;
}

/* Download with as_fd: the storage itself when it is a client's memfd the daemon has not
 * written to (no copy), else, on the tensor's worker, the storage's own memfd sealed when
 * it was made in one (no copy: memfd_session), else a sealed copy (one copy). -1:
 * not here (a tensor in device memory, a strided view, one under fd_min_bytes): the answer
 * carries the bytes as a payload, as without as_fd. */
static int memfd_download(tdd_req *r, tdd_value *v, uint64_t nbytes)
{
    tdd_conn *c = r->c;
    tdd_session *s = c->s;
    td_error err;
    if (!c->fd_passing) {
        tdd_err_arg(&err, "as_fd", "%s",
                    c->h.handle.type == UV_NAMED_PIPE
                        ? "this daemon passes no file descriptors (--max-conn-fds 0)"
                        : "file descriptors cannot cross a TCP or TLS connection: connect to "
                          "the daemon's unix:// socket");
        return tdd_answer_error(r, &err);
    }
    if (s->resume) {
        tdd_err_arg(&err, "as_fd",
                    "a resumable session's answers are kept to be sent again, and a file "
                    "descriptor cannot be: download without as_fd");
        return tdd_answer_error(r, &err);
    }
    memfd_session(s);
    if (!v->dev->be->host_memory || !tdd_is_contiguous(&v->t) ||
        nbytes < r->req->download->fd_min_bytes)
        return -1;
    tdd_memfd_map *m = tdd_storage_adopted(v->t.st, memfd_release);
    if (m && m->fd >= 0 && nbytes && tdd_memfd_map_clean(m)) {
        int fd = fcntl(m->fd, F_DUPFD_CLOEXEC, 3);
        if (fd >= 0) {
            uint64_t at = m->offset + (uint64_t)((char *)tdd_data(&v->t) - (char *)m->data);
            memfd_send_reply(c, r->req->id, v, fd, at);
            return TDD_DISPATCH_DONE;
        }
    }
    memfd_copy *j = calloc(1, sizeof *j);
    if (!j) {
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    j->s = s;
    tdd_session_ref(s);
    j->v = v;
    tdd_value_ref(v);
    j->req_id = r->req->id;
    j->fd = -1;
    tdd_conn_pause(c); /* later requests wait for this reply */
    if (tdd_submit_work(s, v->dev, memfd_copy_work, memfd_copy_done, j)) {
        tdd_conn_resume(c);
        tdd_value_unref(v);
        tdd_session_unref(s);
        free(j);
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    return TDD_DISPATCH_DONE;
}

/* ---------------------------------------------------------------- upload */

typedef struct {
    tdd_value *v;
    uint64_t req_id;
    bool want_reply;
} upload_ctx;

static void upload_landed(tdd_conn *c, void *arg, int status)
{
    upload_ctx *u = arg;
    if (status == 0 && c->s &&
        !bool_payload_bad(c, u->v, tdd_data(&u->v->t), (size_t)tdd_numel(&u->v->t), u->req_id,
                          u->want_reply) &&
        u->want_reply)
        tdd_conn_send_ok(c, u->req_id);
    tdd_value_unref(u->v);
    free(u);
}

int tdd_h_upload(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    uint64_t plen = r->payload_len;
    Tensordd__V1__Upload *up = req->upload;
    tdd_session *s = c->s;
    td_error err;
    /* payload_fd: the fd that came with this frame is the handler's (closed on every path) */
    int fd = up->payload_fd && c->req_nfds ? c->req_fd : -1;
    int nfd = up->payload_fd ? c->req_nfds : 0;
    if (up->payload_fd)
        c->req_nfds = 0;
    int rc = tdd_handle_check_new(s, up->handle, &err);
    tdd_resume_upload_handle(s, rc ? 0 : up->handle); /* bound by this request, if it fails */
    tdd_device *dev = NULL;
    int64_t numel = 0;
    size_t isz = td_dtype_size((td_dtype)up->dtype);
    if (!rc && (up->dtype <= 0 || up->dtype >= (int)TD_DTYPE_COUNT))
        rc = tdd_err_arg(&err, "dtype", "unknown dtype %d", (int)up->dtype);
    if (!rc && up->n_shape > TD_MAX_NDIM)
        rc = tdd_err_arg(&err, "shape", "%zu dims, at most %d", up->n_shape, TD_MAX_NDIM);
    if (!rc) {
        numel = tdd_shape_numel(up->shape, (int)up->n_shape, tdd_cfg.max_numel);
        if (numel < 0)
            rc = tdd_err_arg(&err, "shape", "negative or too large (limit %lld elements)",
                             (long long)tdd_cfg.max_numel);
    }
    if (!rc && up->payload_fd)
        rc = memfd_upload_fd_check(c, plen, nfd, &err);
    if (!rc && !up->payload_fd && (uint64_t)numel * isz != plen)
        rc = tdd_err_arg(&err, "payload", "payload has %llu bytes, shape and dtype need %llu",
                         (unsigned long long)plen, (unsigned long long)((uint64_t)numel * isz));
    td_dtype udt = (td_dtype)up->dtype;
    if (!rc && up->requires_grad && !tdd_dtype_is_float(udt))
        rc = tdd_err_arg(&err, "requires_grad", "only floating-point tensors can require grad");
    if (!rc && !(dev = tdd_resolve_device(up->device, &err)))
        rc = err.code;
    tdd_value *v = NULL;
    upload_ctx *u = NULL;
    if (!rc) {
        v = tdd_value_new(dev);
        u = calloc(1, sizeof *u);
        if (!v || !u)
            rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    }
    if (!rc) {
        v->t.dtype = (td_dtype)up->dtype;
        v->t.ndim = (int)up->n_shape;
        if (up->n_shape) /* a scalar has no shape array at all */
            memcpy(v->t.shape, up->shape, up->n_shape * sizeof(int64_t));
        tdd_set_contiguous(&v->t);
        v->requires_grad = up->requires_grad;
        uint64_t nbytes = (uint64_t)numel * isz;
        if (up->payload_fd)
            memfd_session(s);
        if (up->payload_fd && dev->be->host_memory) /* the client's memfd is the storage */
            v->t.st = memfd_storage(dev, &fd, up->fd_offset, nbytes, s->acct, &err);
        else
            v->t.st = tdd_storage_alloc(dev, (size_t)nbytes, s->acct, s->id, &err);
        if (!v->t.st)
            rc = err.code;
    }
    staged *stg = NULL;
    if (!rc && !dev->be->host_memory && up->payload_fd) {
        /* Device memory: one copy from the mapping of the client's memfd, on the worker. */
        stg = staged_new(s, v, 0, req->id, &err);
        tdd_storage *host = stg ? memfd_storage(tdd_default_device(), &fd, up->fd_offset,
                                                (uint64_t)numel * isz, s->acct, &err)
                                : NULL;
        if (host) {
            tdd_storage_unref(stg->host);
            stg->host = host;
        } else if (stg) {
            staged_free(stg);
            stg = NULL;
        }
        if (!stg)
            rc = err.code;
    } else if (!rc && !dev->be->host_memory &&
               !(stg = staged_new(s, v, (size_t)plen, req->id, &err)))
        rc = err.code;
    if (fd >= 0) {
        close(fd);
        fd = -1;
    }
    if (rc) {
        tdd_value_unref(v);
        free(u);
        tdd_answer_error(r, &err); /* binds up->handle to a placeholder (failed_binds) */
        c->pdst = NULL;            /* the payload is read and dropped */
        c->pdone = NULL;
        return TDD_DISPATCH_PAYLOAD;
    }
    tdd_handle_add(s, up->handle, TD_HANDLE_TENSOR, v);
    if (up->payload_fd) { /* no payload: the bytes are in place already */
        if (stg) {
            free(u);
            stg->want_reply = req->want_reply;
            staged_upload_landed(c, stg, 0);
            return TDD_DISPATCH_DONE;
        }
        tdd_value_ref(v);
        u->v = v;
        u->req_id = req->id;
        u->want_reply = req->want_reply;
        upload_landed(c, u, 0);
        return TDD_DISPATCH_DONE;
    }
    if (stg) {
        /* Device memory: the payload lands in host staging, a worker copies it over. */
        free(u);
        stg->want_reply = req->want_reply;
        c->pdst = stg->host->data;
        c->pdone = staged_upload_landed;
        c->parg = stg;
        return TDD_DISPATCH_PAYLOAD;
    }
    tdd_value_ref(v);
    u->v = v;
    u->req_id = req->id;
    u->want_reply = req->want_reply;
    c->pdst = tdd_data(&v->t);
    c->pdone = upload_landed;
    c->parg = u;
    return TDD_DISPATCH_PAYLOAD;
}

/* ---------------------------------------------------------------- download, describe */

/* (The session's first error came first, in the generic path: when it is what poisoned
 * v, the client got the root cause with its typed detail, not just POISONED.) */
int tdd_h_download(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    td_error err;
    tdd_value *v;
    if (tdd_value_get(c->s, req->download->handle, &v, &err))
        return tdd_answer_error(r, &err);
    if (tdd_value_poisoned(v)) {
        tdd_err_poisoned(&err, v);
        return tdd_answer_error(r, &err);
    }
    uint64_t nbytes = (uint64_t)tdd_numel(&v->t) * td_dtype_size(v->t.dtype);
    if (req->download->as_fd) {
        int rc = memfd_download(r, v, nbytes);
        if (rc >= 0)
            return rc;
    }
    if (v->dev->be->host_memory && tdd_is_contiguous(&v->t)) {
        /* Straight from the tensor's memory: no staging copy. */
        tdd_send_tensor(c, req->id, v, tdd_data(&v->t), nbytes, v->t.st);
        return TDD_DISPATCH_DONE;
    }
    return staged_download(r, v, nbytes);
}
