/* calls.c -- libtensordd's API calls: each builds one Request and reads its Response. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"

#define REQ(var, field, CASE, body)                                                                \
    Tensordd__V1__Request var = TENSORDD__V1__REQUEST__INIT;                                       \
    var.body_case = TENSORDD__V1__REQUEST__BODY_##CASE;                                            \
    var.field = (body)

static const td_device default_device = {.backend = "cpu", .ordinal = 0};

static void device_to_pb(const td_device *d, Tensordd__V1__Device *out)
{
    tensordd__v1__device__init(out);
    out->backend = (char *)(uintptr_t)d->backend;
    out->ordinal = d->ordinal;
}

static int check_client(td_client *c, td_error *err)
{
    return c ? 0 : td__fail(err, TD_EINVALID_ARGUMENT, "no client");
}

/* A synchronising request whose answer carries nothing but Ok. */
static int call_ok(td_client *c, Tensordd__V1__Request *req, td_error *err)
{
    td__reply r;
    int rc = td__call_ex(c, req, NULL, 0, &r, 1, err);
    if (rc)
        return rc;
    uint64_t pl = r.payload_len;
    td__reply_free(&r);
    if (pl && (rc = td__drain(c, pl, err)) != 0)
        return rc;
    return td__take_early(c, err);
}

static int unexpected(td_client *c, td__reply *r, const char *what, td_error *err)
{
    int body = r->msg ? (int)r->msg->body_case : -1;
    td__reply_free(r);
    if (!c->dead)
        c->dead = TD_EPROTOCOL_ERROR;
    return td__fail(err, TD_EPROTOCOL_ERROR, "daemon answered %s with response body %d", what,
                    body);
}

/* ---------------------------------------------------------------- session */

int td_connect(const char *endpoint, const td_connect_opts *opts, td_client **out, td_error *err)
{
    return td_connect_tls(endpoint, opts, NULL, out, err);
}

static char *dup_or_null(const char *s, int *fail)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *fail = 1;
    return d;
}

/* What a reconnection needs (resume): the endpoint, the Hello's token and name, the TLS
 * options. */
static int keep_for_resume(td_client *c, const char *endpoint, const td_connect_opts *opts,
                           const td_tls_opts *tls, td_error *err)
{
    int fail = 0;
    c->endpoint = dup_or_null(endpoint, &fail);
    c->token = dup_or_null(opts && opts->token ? opts->token : "", &fail);
    c->client_name =
        dup_or_null(opts && opts->client_name ? opts->client_name : "libtensordd", &fail);
    if (tls) {
        c->has_tls = 1;
        c->tls_opts = *tls;
        c->tls_opts.ca_file = c->tls_ca = dup_or_null(tls->ca_file, &fail);
        c->tls_opts.cert_file = c->tls_cert = dup_or_null(tls->cert_file, &fail);
        c->tls_opts.key_file = c->tls_key = dup_or_null(tls->key_file, &fail);
    }
    return fail ? td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory") : 0;
}

int td_connect_tls(const char *endpoint, const td_connect_opts *opts, const td_tls_opts *tls,
                   td_client **out, td_error *err)
{
    return td_connect_resume(endpoint, opts, tls, 0, out, err);
}

int td_connect_resume(const char *endpoint, const td_connect_opts *opts, const td_tls_opts *tls,
                      unsigned resume_window_s, td_client **out, td_error *err)
{
    if (!out)
        return td__fail(err, TD_EINVALID_ARGUMENT, "no output pointer");
    *out = NULL;
    td_client *c = calloc(1, sizeof *c);
    if (!c)
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
    c->fd = -1;
    c->next_handle = 1;
    c->next_request = 1;
    c->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 0;
    int rc = td__open(c, endpoint, tls, err);
    if (rc) {
        free(c);
        return rc;
    }
    td__set_timeout(c, c->timeout_ms);

    Tensordd__V1__Hello hello = TENSORDD__V1__HELLO__INIT;
    hello.min_version = TD_PROTOCOL_VERSION;
    hello.max_version = TD_PROTOCOL_VERSION;
    hello.token = (char *)(uintptr_t)(opts && opts->token ? opts->token : "");
    hello.client_name =
        (char *)(uintptr_t)(opts && opts->client_name ? opts->client_name : "libtensordd");
    hello.resume_window = resume_window_s;
    REQ(req, hello, HELLO, &hello);
    td__reply r;
    rc = resume_window_s ? keep_for_resume(c, endpoint, opts, tls, err) : 0;
    if (!rc)
        rc = td__call(c, &req, NULL, 0, &r, err);
    if (rc == 0) {
        if (r.msg->body_case != TENSORDD__V1__RESPONSE__BODY_HELLO || !r.msg->hello) {
            rc = unexpected(c, &r, "Hello", err);
        } else if (r.msg->hello->version != TD_PROTOCOL_VERSION) {
            rc =
                td__fail(err, TD_EVERSION_MISMATCH, "daemon chose protocol version %u, we speak %d",
                         r.msg->hello->version, TD_PROTOCOL_VERSION);
            td__reply_free(&r);
        } else {
            const Tensordd__V1__HelloReply *hr = r.msg->hello;
            c->session_id = hr->session_id;
            snprintf(c->note, sizeof c->note, "%s", hr->note ? hr->note : "");
            if (resume_window_s && hr->resume_window &&
                hr->resume_token.len == sizeof c->resume_token) {
                c->resume_window_s = hr->resume_window;
                memcpy(c->resume_token, hr->resume_token.data, sizeof c->resume_token);
            }
            td__reply_free(&r);
        }
    }
    if (rc) {
        c->dead = rc; /* no Goodbye on a session that never opened */
        td_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void td_close(td_client *c)
{
    if (!c)
        return;
    if (!c->dead && c->fd >= 0) {
        /* Bounded: closing must not hang on a daemon that stopped answering. */
        if (c->timeout_ms == 0 || c->timeout_ms > 5000)
            td__set_timeout(c, 5000);
        Tensordd__V1__Goodbye bye = TENSORDD__V1__GOODBYE__INIT;
        REQ(req, goodbye, GOODBYE, &bye);
        td__reply r;
        if (td__call(c, &req, NULL, 0, &r, NULL) == 0)
            td__reply_free(&r);
    }
    td__close_stream(c);
    for (int i = 0; i < c->nrfds; i++)
        close(c->rfds[i]);
    free(c->wbuf);
    free(c->rbuf);
    free(c->rel);
    free(c->jbuf);
    free(c->jent);
    free(c->endpoint);
    free(c->token);
    free(c->client_name);
    free(c->tls_ca);
    free(c->tls_cert);
    free(c->tls_key);
    free(c);
}

unsigned td_resume_count(const td_client *c)
{
    return c ? c->resumes : 0;
}

const char *td_server_note(const td_client *c)
{
    return c ? c->note : "";
}

uint64_t td_session_id(const td_client *c)
{
    return c ? c->session_id : 0;
}

uint64_t td_last_request_id(const td_client *c)
{
    return c && c->next_request > 1 ? c->next_request - 1 : 0;
}

void td_set_progress(td_client *c, td_progress_fn fn, void *arg)
{
    if (!c)
        return;
    c->progress = fn;
    c->progress_arg = arg;
}

int td_flush(td_client *c, td_error *err)
{
    int rc = check_client(c, err);
    return rc ? rc : td__flush(c, err);
}

int td_sync(td_client *c, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__Sync s = TENSORDD__V1__SYNC__INIT;
    REQ(req, sync, SYNC, &s);
    return call_ok(c, &req, err);
}

int td_ping(td_client *c, td_error *err)
{
    return td_sync(c, err);
}

int td_release(td_client *c, const td_handle *hs, size_t n, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if (!hs[i])
            continue;
        if (c->nrel == c->relcap) {
            size_t cap = c->relcap ? c->relcap * 2 : 256;
            uint64_t *p = realloc(c->rel, cap * sizeof *p);
            if (!p)
                return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
            c->rel = p;
            c->relcap = cap;
        }
        c->rel[c->nrel++] = hs[i];
    }
    if (c->nrel >= TD__RELEASE_BATCH)
        return td__flush(c, err);
    return 0;
}

/* ---------------------------------------------------------------- devices */

int td_device_parse(const char *text, td_device *out)
{
    if (!text || !out)
        return TD_EINVALID_ARGUMENT;
    memset(out, 0, sizeof *out);
    size_t n = 0;
    while (text[n] && text[n] != ':') {
        char ch = text[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_'))
            return TD_EINVALID_ARGUMENT;
        n++;
    }
    if (n == 0 || n >= sizeof out->backend)
        return TD_EINVALID_ARGUMENT;
    memcpy(out->backend, text, n);
    if (!text[n])
        return 0; /* "ref" means ref:0 */
    const char *p = text + n + 1;
    if (!*p)
        return TD_EINVALID_ARGUMENT;
    uint64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return TD_EINVALID_ARGUMENT;
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > UINT32_MAX)
            return TD_EINVALID_ARGUMENT;
    }
    out->ordinal = (uint32_t)v;
    return 0;
}

void td_device_format(const td_device *d, char *buf, size_t len)
{
    if (buf && len)
        snprintf(buf, len, "%s:%u", d ? d->backend : "?", d ? d->ordinal : 0);
}

int td_list_devices(td_client *c, td_device_info *out, size_t cap, size_t *n, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__ListDevices ld = TENSORDD__V1__LIST_DEVICES__INIT;
    REQ(req, list_devices, LIST_DEVICES, &ld);
    td__reply r;
    if ((rc = td__call(c, &req, NULL, 0, &r, err)) != 0)
        return rc;
    if (r.msg->body_case != TENSORDD__V1__RESPONSE__BODY_DEVICES || !r.msg->devices ||
        r.payload_len)
        return unexpected(c, &r, "ListDevices", err);
    const Tensordd__V1__ListDevicesReply *d = r.msg->devices;
    for (size_t i = 0; i < d->n_devices && i < cap; i++) {
        memset(&out[i], 0, sizeof out[i]);
        td__device_from_pb(d->devices[i]->device, &out[i].device);
        snprintf(out[i].name, sizeof out[i].name, "%s",
                 d->devices[i]->name ? d->devices[i]->name : "");
        out[i].memory_total = d->devices[i]->memory_total;
        out[i].memory_used = d->devices[i]->memory_used;
        out[i].failed = d->devices[i]->failed;
        snprintf(out[i].status, sizeof out[i].status, "%s",
                 d->devices[i]->status ? d->devices[i]->status : "");
    }
    if (n)
        *n = d->n_devices;
    td__reply_free(&r);
    return td__take_early(c, err);
}

/* ---------------------------------------------------------------- tensors */

/* numel * itemsize with every multiplication checked; -1 on bad input. */
static int tensor_bytes(td_dtype dt, int ndim, const int64_t *shape, uint64_t *out)
{
    uint64_t b = td_dtype_size(dt);
    if (!b || ndim < 0 || ndim > TD_MAX_NDIM || (ndim > 0 && !shape))
        return -1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d && b > UINT64_MAX / d)
            return -1;
        b *= d;
    }
    *out = b;
    return 0;
}

static void info_from_pb(const Tensordd__V1__TensorInfo *t, td_tensor_info *info)
{
    memset(info, 0, sizeof *info);
    info->dtype = (unsigned)t->dtype < TD_DTYPE_COUNT ? (td_dtype)t->dtype : TD_DTYPE_INVALID;
    info->ndim = (int)(t->n_shape < TD_MAX_NDIM ? t->n_shape : TD_MAX_NDIM);
    for (int i = 0; i < info->ndim; i++)
        info->shape[i] = t->shape[i];
    td__device_from_pb(t->device, &info->device);
    info->requires_grad = t->requires_grad ? 1 : 0;
}

/* An Upload of a new handle (taken from c) with what td_upload and td_upload_fd share;
 * dev holds the device message up points to. */
static void upload_init(td_client *c, Tensordd__V1__Upload *up, Tensordd__V1__Device *dev,
                        const td_device *device, td_dtype dtype, int ndim, const int64_t *shape,
                        int requires_grad)
{
    device_to_pb(device ? device : &default_device, dev);
    tensordd__v1__upload__init(up);
    up->handle = c->next_handle++;
    up->dtype = (Tensordd__V1__DType)dtype;
    up->n_shape = (size_t)ndim;
    up->shape = (int64_t *)(uintptr_t)shape;
    up->device = dev;
    up->requires_grad = requires_grad ? 1 : 0;
}

int td_upload(td_client *c, const td_device *device, td_dtype dtype, int ndim, const int64_t *shape,
              const void *data, int requires_grad, td_handle *out, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    uint64_t bytes;
    if (tensor_bytes(dtype, ndim, shape, &bytes) != 0)
        return td__fail(err, TD_EINVALID_ARGUMENT, "bad dtype (%d) or shape (ndim %d)", (int)dtype,
                        ndim);
    if (bytes && !data)
        return td__fail(err, TD_EINVALID_ARGUMENT, "no data for a %llu-byte tensor",
                        (unsigned long long)bytes);
    Tensordd__V1__Device dev;
    Tensordd__V1__Upload up;
    upload_init(c, &up, &dev, device, dtype, ndim, shape, requires_grad);
    REQ(req, upload, UPLOAD, &up);
    rc = td__call(c, &req, data, bytes, NULL, err);
    if (rc == 0 && out)
        *out = up.handle;
    return rc;
}

int td_download(td_client *c, td_handle h, void *buf, size_t cap, td_tensor_info *info,
                td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__Download dl = TENSORDD__V1__DOWNLOAD__INIT;
    dl.handle = h;
    REQ(req, download, DOWNLOAD, &dl);
    td__reply r;
    if ((rc = td__call(c, &req, NULL, 0, &r, err)) != 0)
        return rc;
    if (r.msg->body_case != TENSORDD__V1__RESPONSE__BODY_TENSOR || !r.msg->tensor)
        return unexpected(c, &r, "Download", err);
    td_tensor_info ti;
    info_from_pb(r.msg->tensor, &ti);
    uint64_t want = 0, pl = r.payload_len;
    int shape_ok = r.msg->tensor->n_shape <= TD_MAX_NDIM &&
                   tensor_bytes(ti.dtype, ti.ndim, ti.shape, &want) == 0;
    td__reply_free(&r);
    if (!shape_ok || want != pl) {
        rc = td__drain(c, pl, err);
        return rc ? rc
                  : td__fail(err, TD_EPROTOCOL_ERROR,
                             "download payload is %llu bytes, tensor info says %llu",
                             (unsigned long long)pl, (unsigned long long)want);
    }
    if (pl > cap) {
        /* Keep the stream in step, then tell the caller what it needs. */
        rc = td__drain(c, pl, err);
        return rc ? rc
                  : td__fail(err, TD_EINVALID_ARGUMENT,
                             "tensor is %llu bytes, the buffer holds %zu", (unsigned long long)pl,
                             cap);
    }
    if ((rc = td__read_payload(c, buf, pl, err)) != 0)
        return rc;
    if (info)
        *info = ti;
    return td__take_early(c, err);
}

int td_upload_fd(td_client *c, const td_device *device, td_dtype dtype, int ndim,
                 const int64_t *shape, int fd, uint64_t offset, int requires_grad, td_handle *out,
                 td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    uint64_t bytes;
    if (tensor_bytes(dtype, ndim, shape, &bytes) != 0)
        return td__fail(err, TD_EINVALID_ARGUMENT, "bad dtype (%d) or shape (ndim %d)", (int)dtype,
                        ndim);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (c->tls || getsockname(c->fd, (struct sockaddr *)&ss, &sl) != 0 || ss.ss_family != AF_UNIX)
        return td__fail(err, TD_EINVALID_ARGUMENT,
                        "file descriptors cannot cross a TCP or TLS connection: connect to the "
                        "daemon's unix:// socket");
    if (c->resume_window_s)
        return td__fail(err, TD_EINVALID_ARGUMENT,
                        "a resumable session cannot send a file descriptor again");
    Tensordd__V1__Device dev;
    Tensordd__V1__Upload up;
    upload_init(c, &up, &dev, device, dtype, ndim, shape, requires_grad);
    up.payload_fd = 1;
    up.fd_offset = offset;
    REQ(req, upload, UPLOAD, &up);
    req.id = c->next_request++;
    /* What is queued goes first; then this frame alone, the fd on its first byte. */
    if ((rc = td__flush(c, err)) != 0)
        return rc;
    size_t mlen = tensordd__v1__request__get_packed_size(&req);
    uint8_t *frame = malloc(TD_FRAME_HEADER_SIZE + mlen);
    if (!frame)
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
    td_frame_encode(frame, (uint32_t)mlen, 0);
    tensordd__v1__request__pack(&req, frame + TD_FRAME_HEADER_SIZE);
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = frame, .iov_len = TD_FRAME_HEADER_SIZE + mlen};
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    ssize_t k;
    do
        k = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
    while (k < 0 && errno == EINTR);
    if (k < 0) {
        int e = errno;
        free(frame);
        c->dead = TD_EIO;
        return td__fail(err, TD_EIO, "sending an fd to the daemon: %s", strerror(e));
    }
    if ((size_t)k < iov.iov_len)
        rc = td__send_raw(c, frame + k, iov.iov_len - (size_t)k, err);
    free(frame);
    if (rc == 0 && out)
        *out = up.handle;
    return rc;
}

int td_download_fd(td_client *c, td_handle h, int *fd, uint64_t *offset, td_tensor_info *info,
                   td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    *fd = -1;
    *offset = 0;
    Tensordd__V1__Download dl = TENSORDD__V1__DOWNLOAD__INIT;
    dl.handle = h;
    dl.as_fd = 1;
    REQ(req, download, DOWNLOAD, &dl);
    td__reply r;
    c->want_fds++;
    rc = td__call(c, &req, NULL, 0, &r, err);
    c->want_fds--;
    if (rc)
        return rc;
    if (r.msg->body_case != TENSORDD__V1__RESPONSE__BODY_TENSOR || !r.msg->tensor)
        return unexpected(c, &r, "Download", err);
    td_tensor_info ti;
    info_from_pb(r.msg->tensor, &ti);
    int as_fd = r.msg->tensor->payload_fd;
    uint64_t at = r.msg->tensor->fd_offset, want = 0, pl = r.payload_len;
    int shape_ok = r.msg->tensor->n_shape <= TD_MAX_NDIM &&
                   tensor_bytes(ti.dtype, ti.ndim, ti.shape, &want) == 0;
    td__reply_free(&r);
    if (!shape_ok || (!as_fd && want != pl) || (as_fd && pl)) {
        rc = td__drain(c, pl, err);
        return rc ? rc
                  : td__fail(err, TD_EPROTOCOL_ERROR,
                             "download answer does not match its "
                             "tensor info");
    }
    if (as_fd) {
        if (!c->nrfds) {
            c->dead = TD_EPROTOCOL_ERROR;
            return td__fail(err, TD_EPROTOCOL_ERROR,
                            "the answer said payload_fd but no file descriptor came with it");
        }
        *fd = c->rfds[0];
        memmove(c->rfds, c->rfds + 1, (size_t)(--c->nrfds) * sizeof c->rfds[0]);
        *offset = at;
    } else {
        /* The daemon sent the bytes (device memory, a strided view): into a sealed memfd. */
        int m = memfd_create("tensordd-download", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        void *p = m >= 0 && ftruncate(m, (off_t)pl) == 0 && pl
                      ? mmap(NULL, (size_t)pl, PROT_READ | PROT_WRITE, MAP_SHARED, m, 0)
                      : NULL;
        if (m < 0 || (pl && (p == NULL || p == MAP_FAILED))) {
            int e = errno;
            if (m >= 0)
                close(m);
            rc = td__drain(c, pl, err);
            return rc ? rc : td__fail(err, TD_EIO, "a memfd for the download: %s", strerror(e));
        }
        rc = td__read_payload(c, p, pl, err);
        if (pl)
            munmap(p, (size_t)pl);
        if (rc == 0 && fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0)
            rc = td__fail(err, TD_EIO, "sealing the download's memfd: %s", strerror(errno));
        if (rc) {
            close(m);
            return rc;
        }
        *fd = m;
    }
    if (info)
        *info = ti;
    return td__take_early(c, err);
}

int td_describe(td_client *c, td_handle h, td_tensor_info *info, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__Describe d = TENSORDD__V1__DESCRIBE__INIT;
    d.handle = h;
    REQ(req, describe, DESCRIBE, &d);
    td__reply r;
    if ((rc = td__call(c, &req, NULL, 0, &r, err)) != 0)
        return rc;
    if (r.msg->body_case != TENSORDD__V1__RESPONSE__BODY_TENSOR || !r.msg->tensor)
        return unexpected(c, &r, "Describe", err);
    if (info)
        info_from_pb(r.msg->tensor, info);
    uint64_t pl = r.payload_len;
    td__reply_free(&r);
    if (pl && (rc = td__drain(c, pl, err)) != 0)
        return rc;
    return td__take_early(c, err);
}

/* ---------------------------------------------------------------- ops */

td_attr td_attr_int(const char *name, int64_t v)
{
    return (td_attr){.name = name, .kind = TD_ATTR_INT, .i = v};
}

td_attr td_attr_float(const char *name, double v)
{
    return (td_attr){.name = name, .kind = TD_ATTR_FLOAT, .f = v};
}

td_attr td_attr_bool(const char *name, int v)
{
    return (td_attr){.name = name, .kind = TD_ATTR_BOOL, .b = v};
}

td_attr td_attr_ints(const char *name, const int64_t *v, size_t n)
{
    return (td_attr){.name = name, .kind = TD_ATTR_INTS, .ints = v, .n = n};
}

td_attr td_attr_floats(const char *name, const double *v, size_t n)
{
    return (td_attr){.name = name, .kind = TD_ATTR_FLOATS, .floats = v, .n = n};
}

td_attr td_attr_str(const char *name, const char *v)
{
    return (td_attr){.name = name, .kind = TD_ATTR_STR, .s = v};
}

/* Protobuf views of a caller's attrs: one allocation, pointing into theirs. */
typedef struct {
    Tensordd__V1__Attr **ptrs;
    Tensordd__V1__Attr *attrs;
    Tensordd__V1__IntList *ilists;
    Tensordd__V1__FloatList *flists;
} attr_block;

static int attrs_to_pb(const td_attr *a, size_t n, attr_block *b, td_error *err)
{
    memset(b, 0, sizeof *b);
    if (!n)
        return 0;
    if (!a)
        return td__fail(err, TD_EINVALID_ARGUMENT, "nattrs without attrs");
    b->ptrs = calloc(n, sizeof *b->ptrs);
    b->attrs = calloc(n, sizeof *b->attrs);
    b->ilists = calloc(n, sizeof *b->ilists);
    b->flists = calloc(n, sizeof *b->flists);
    if (!b->ptrs || !b->attrs || !b->ilists || !b->flists)
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < n; i++) {
        Tensordd__V1__Attr *p = &b->attrs[i];
        tensordd__v1__attr__init(p);
        if (!a[i].name)
            return td__fail(err, TD_EINVALID_ARGUMENT, "attribute %zu has no name", i);
        p->name = (char *)(uintptr_t)a[i].name;
        switch (a[i].kind) {
        case TD_ATTR_INT:
            p->value_case = TENSORDD__V1__ATTR__VALUE_I;
            p->i = a[i].i;
            break;
        case TD_ATTR_FLOAT:
            p->value_case = TENSORDD__V1__ATTR__VALUE_F;
            p->f = a[i].f;
            break;
        case TD_ATTR_BOOL:
            p->value_case = TENSORDD__V1__ATTR__VALUE_B;
            p->b = a[i].b ? 1 : 0;
            break;
        case TD_ATTR_INTS:
            tensordd__v1__int_list__init(&b->ilists[i]);
            b->ilists[i].n_v = a[i].n;
            b->ilists[i].v = (int64_t *)(uintptr_t)a[i].ints;
            p->value_case = TENSORDD__V1__ATTR__VALUE_INTS;
            p->ints = &b->ilists[i];
            break;
        case TD_ATTR_FLOATS:
            tensordd__v1__float_list__init(&b->flists[i]);
            b->flists[i].n_v = a[i].n;
            b->flists[i].v = (double *)(uintptr_t)a[i].floats;
            p->value_case = TENSORDD__V1__ATTR__VALUE_FLOATS;
            p->floats = &b->flists[i];
            break;
        case TD_ATTR_STR:
            p->value_case = TENSORDD__V1__ATTR__VALUE_S;
            p->s = (char *)(uintptr_t)(a[i].s ? a[i].s : "");
            break;
        default:
            return td__fail(err, TD_EINVALID_ARGUMENT, "attribute '%s' has an unknown kind %d",
                            a[i].name, (int)a[i].kind);
        }
        if ((a[i].kind == TD_ATTR_INTS && a[i].n && !a[i].ints) ||
            (a[i].kind == TD_ATTR_FLOATS && a[i].n && !a[i].floats))
            return td__fail(err, TD_EINVALID_ARGUMENT, "attribute '%s' has no values", a[i].name);
        b->ptrs[i] = p;
    }
    return 0;
}

static void attrs_free(attr_block *b)
{
    free(b->ptrs);
    free(b->attrs);
    free(b->ilists);
    free(b->flists);
}

int td_op(td_client *c, const char *name, const td_handle *inputs, size_t n_in,
          const td_op_opts *opts, td_handle *outputs, size_t n_out, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if (!name || !name[0])
        return td__fail(err, TD_EINVALID_ARGUMENT, "no op name");
    if ((n_in && !inputs) || (n_out && !outputs))
        return td__fail(err, TD_EINVALID_ARGUMENT, "missing inputs or outputs array");
    attr_block ab;
    if ((rc = attrs_to_pb(opts ? opts->attrs : NULL, opts ? opts->nattrs : 0, &ab, err)) != 0) {
        attrs_free(&ab);
        return rc;
    }
    for (size_t i = 0; i < n_out; i++)
        outputs[i] = c->next_handle++;
    Tensordd__V1__Device dev;
    Tensordd__V1__Op op = TENSORDD__V1__OP__INIT;
    op.op = (char *)(uintptr_t)name;
    op.n_inputs = n_in;
    op.inputs = (uint64_t *)(uintptr_t)inputs;
    op.n_outputs = n_out;
    op.outputs = outputs;
    op.n_attrs = opts ? opts->nattrs : 0;
    op.attrs = ab.ptrs;
    if (opts && opts->device) {
        device_to_pb(opts->device, &dev);
        op.device = &dev;
    }
    op.dtype = (Tensordd__V1__DType)(opts ? opts->dtype : TD_DTYPE_INVALID);
    op.requires_grad = opts && opts->requires_grad ? 1 : 0;
    REQ(req, op, OP, &op);
    if (opts && opts->want_reply) {
        rc = call_ok(c, &req, err);
    } else {
        rc = td__call(c, &req, NULL, 0, NULL, err);
    }
    attrs_free(&ab);
    return rc;
}

td_handle td_op1(td_client *c, const char *name, const td_handle *inputs, size_t n_in,
                 const td_op_opts *opts, td_error *err)
{
    td_handle out = 0;
    if (td_op(c, name, inputs, n_in, opts, &out, 1, err) != 0)
        return 0;
    return out;
}

int td_to_device(td_client *c, td_handle h, const td_device *device, td_handle *out, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if (!device)
        return td__fail(err, TD_EINVALID_ARGUMENT, "no device");
    Tensordd__V1__Device dev;
    device_to_pb(device, &dev);
    Tensordd__V1__ToDevice td = TENSORDD__V1__TO_DEVICE__INIT;
    td.input = h;
    td.output = c->next_handle++;
    td.device = &dev;
    REQ(req, to_device, TO_DEVICE, &td);
    rc = td__call(c, &req, NULL, 0, NULL, err);
    if (rc == 0 && out)
        *out = td.output;
    return rc;
}

/* ---------------------------------------------------------------- stats */

/* One Stats round trip: the reply (to free with td__reply_free) and its body. */
static int stats_call(td_client *c, td__reply *r, const Tensordd__V1__StatsReply **s, td_error *err)
{
    Tensordd__V1__Stats st = TENSORDD__V1__STATS__INIT;
    REQ(req, stats, STATS, &st);
    int rc = td__call(c, &req, NULL, 0, r, err);
    if (rc)
        return rc;
    if (r->msg->body_case != TENSORDD__V1__RESPONSE__BODY_STATS || !r->msg->stats || r->payload_len)
        return unexpected(c, r, "Stats", err);
    *s = r->msg->stats;
    return 0;
}

static void session_info_from_pb(const Tensordd__V1__SessionInfo *si, td_session_info *e)
{
    memset(e, 0, sizeof *e);
    e->session_id = si->session_id;
    e->handles = si->handles;
    e->bytes_in_use = si->bytes_in_use;
    e->requests = si->requests;
    e->memory_limit = si->memory_limit;
    snprintf(e->peer, sizeof e->peer, "%s", si->peer ? si->peer : "");
    snprintf(e->client_name, sizeof e->client_name, "%s", si->client_name ? si->client_name : "");
}

int td_stats_get(td_client *c, td_stats *out, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if (!out)
        return td__fail(err, TD_EINVALID_ARGUMENT, "no output");
    td__reply r;
    const Tensordd__V1__StatsReply *s;
    if ((rc = stats_call(c, &r, &s, err)) != 0)
        return rc;
    memset(out, 0, sizeof *out);
    out->sessions = s->sessions;
    out->handles = s->handles;
    out->bytes_received = s->bytes_received;
    out->bytes_sent = s->bytes_sent;
    out->requests = s->requests;
    out->tensors_alive = s->tensors_alive;
    out->uptime_ms = s->uptime_ms;
    for (size_t i = 0; i < s->n_errors; i++) {
        int code = (int)s->errors[i]->code;
        if (code > 0 && code < TD_STATS_ERRORS)
            out->errors[code] += s->errors[i]->count;
    }
    size_t maxdev = sizeof out->memory / sizeof out->memory[0];
    out->ndevices = s->n_memory < maxdev ? s->n_memory : maxdev;
    for (size_t i = 0; i < out->ndevices; i++) {
        td__device_from_pb(s->memory[i]->device, &out->memory[i].device);
        out->memory[i].bytes_in_use = s->memory[i]->bytes_in_use;
        out->memory[i].peak_bytes = s->memory[i]->peak_bytes;
    }
    size_t maxs = sizeof out->session_list / sizeof out->session_list[0];
    out->nsessions = s->n_session_list;
    for (size_t i = 0; i < s->n_session_list && i < maxs; i++) {
        td_session_info e;
        session_info_from_pb(s->session_list[i], &e);
        out->session_list[i].session_id = e.session_id;
        out->session_list[i].handles = e.handles;
        out->session_list[i].bytes_in_use = e.bytes_in_use;
        out->session_list[i].requests = e.requests;
        memcpy(out->session_list[i].peer, e.peer, sizeof e.peer);
        memcpy(out->session_list[i].client_name, e.client_name, sizeof e.client_name);
    }
    td__reply_free(&r);
    return td__take_early(c, err);
}

int td_stats_sessions(td_client *c, td_session_info *out, size_t cap, size_t entry_size, size_t *n,
                      td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if (!n || (cap && !out) || (cap && entry_size == 0))
        return td__fail(err, TD_EINVALID_ARGUMENT, "no output, or an entry size of 0");
    td__reply r;
    const Tensordd__V1__StatsReply *s;
    if ((rc = stats_call(c, &r, &s, err)) != 0)
        return rc;
    *n = s->n_session_list;
    size_t take = entry_size < sizeof(td_session_info) ? entry_size : sizeof(td_session_info);
    for (size_t i = 0; i < s->n_session_list && i < cap; i++) {
        td_session_info e;
        session_info_from_pb(s->session_list[i], &e);
        /* a caller built with a smaller (older) record gets its prefix, at its stride */
        memcpy((char *)out + i * entry_size, &e, take);
    }
    td__reply_free(&r);
    return td__take_early(c, err);
}

/* ---------------------------------------------------------------- autodiff */

int td_backward(td_client *c, td_handle loss, td_handle grad_output, int retain_graph,
                td_handle *grads, td_error *err)
{
    return td_backward_ex(c, loss, grad_output, retain_graph ? TD_BACKWARD_RETAIN_GRAPH : 0u, NULL,
                          0, grads, err);
}

int td_backward_ex(td_client *c, td_handle loss, td_handle grad_output, unsigned flags,
                   const td_handle *inputs, size_t n_inputs, td_handle *grads, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if (flags &
        ~(unsigned)(TD_BACKWARD_RETAIN_GRAPH | TD_BACKWARD_CREATE_GRAPH | TD_BACKWARD_PIPELINED))
        return td__fail(err, TD_EINVALID_ARGUMENT, "td_backward_ex: unknown flags 0x%x", flags);
    if (n_inputs && !inputs)
        return td__fail(err, TD_EINVALID_ARGUMENT, "td_backward_ex: %zu inputs but no array",
                        n_inputs);
    Tensordd__V1__Backward b = TENSORDD__V1__BACKWARD__INIT;
    b.loss = loss;
    b.grad_output = grad_output;
    b.retain_graph = (flags & TD_BACKWARD_RETAIN_GRAPH) ? 1 : 0;
    b.create_graph = (flags & TD_BACKWARD_CREATE_GRAPH) ? 1 : 0;
    b.n_inputs = n_inputs;
    b.inputs = (uint64_t *)(uintptr_t)inputs; /* protobuf-c's field is not const; not written */
    b.grads = c->next_handle++;
    b.pipelined = (flags & TD_BACKWARD_PIPELINED) ? 1 : 0;
    REQ(req, backward, BACKWARD, &b);
    /* pipelined: not answered; a failure is the session's pending error */
    rc = b.pipelined ? td__call(c, &req, NULL, 0, NULL, err) : call_ok(c, &req, err);
    if (rc == 0 && grads)
        *grads = b.grads;
    return rc;
}

static int grad_call(td_client *c, int remove, td_handle grads, td_handle t, td_handle *out,
                     td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__Grad g = TENSORDD__V1__GRAD__INIT;
    g.grads = grads;
    g.tensor = t;
    g.output = c->next_handle++;
    Tensordd__V1__Request req = TENSORDD__V1__REQUEST__INIT;
    if (remove) {
        req.body_case = TENSORDD__V1__REQUEST__BODY_GRAD_REMOVE;
        req.grad_remove = &g;
    } else {
        req.body_case = TENSORDD__V1__REQUEST__BODY_GRAD;
        req.grad = &g;
    }
    rc = call_ok(c, &req, err);
    if (rc == 0 && out)
        *out = g.output;
    return rc;
}

int td_grad(td_client *c, td_handle grads, td_handle t, td_handle *out, td_error *err)
{
    return grad_call(c, 0, grads, t, out, err);
}

int td_grad_remove(td_client *c, td_handle grads, td_handle t, td_handle *out, td_error *err)
{
    return grad_call(c, 1, grads, t, out, err);
}

int td_grad_replace(td_client *c, td_handle grads, td_handle t, td_handle g, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__GradReplace gr = TENSORDD__V1__GRAD_REPLACE__INIT;
    gr.grads = grads;
    gr.tensor = t;
    gr.grad = g;
    REQ(req, grad_replace, GRAD_REPLACE, &gr);
    return call_ok(c, &req, err);
}

int td_set_grad_enabled(td_client *c, int enabled, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__SetGradMode m = TENSORDD__V1__SET_GRAD_MODE__INIT;
    m.enabled = enabled ? 1 : 0;
    REQ(req, set_grad_mode, SET_GRAD_MODE, &m);
    return td__call(c, &req, NULL, 0, NULL, err);
}

int td_optimizer_create(td_client *c, const char *kind, const td_handle *params, size_t n,
                        const td_attr *attrs, size_t nattrs, td_handle *out, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if (!kind || (n && !params))
        return td__fail(err, TD_EINVALID_ARGUMENT, "optimizer needs a kind and its params");
    attr_block ab;
    if ((rc = attrs_to_pb(attrs, nattrs, &ab, err)) != 0) {
        attrs_free(&ab);
        return rc;
    }
    Tensordd__V1__OptimizerCreate oc = TENSORDD__V1__OPTIMIZER_CREATE__INIT;
    oc.handle = c->next_handle++;
    oc.kind = (char *)(uintptr_t)kind;
    oc.n_params = n;
    oc.params = (uint64_t *)(uintptr_t)params;
    oc.n_attrs = nattrs;
    oc.attrs = ab.ptrs;
    REQ(req, optimizer_create, OPTIMIZER_CREATE, &oc);
    rc = td__call(c, &req, NULL, 0, NULL, err);
    attrs_free(&ab);
    if (rc == 0 && out)
        *out = oc.handle;
    return rc;
}

int td_optimizer_step(td_client *c, td_handle optimizer, td_handle grads, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__OptimizerStep s = TENSORDD__V1__OPTIMIZER_STEP__INIT;
    s.optimizer = optimizer;
    s.grads = grads;
    REQ(req, optimizer_step, OPTIMIZER_STEP, &s);
    return call_ok(c, &req, err);
}

int td_optimizer_step_attrs(td_client *c, td_handle optimizer, td_handle grads,
                            const td_attr *attrs, size_t nattrs, td_error *err)
{
    return td_optimizer_step_ex(c, optimizer, grads, attrs, nattrs, 0, err);
}

int td_optimizer_step_ex(td_client *c, td_handle optimizer, td_handle grads, const td_attr *attrs,
                         size_t nattrs, unsigned flags, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if (flags & ~(unsigned)TD_STEP_PIPELINED)
        return td__fail(err, TD_EINVALID_ARGUMENT, "td_optimizer_step_ex: unknown flags 0x%x",
                        flags);
    if (nattrs && !attrs)
        return td__fail(err, TD_EINVALID_ARGUMENT, "attrs is NULL with nattrs %zu", nattrs);
    attr_block ab;
    if ((rc = attrs_to_pb(attrs, nattrs, &ab, err)) != 0) {
        attrs_free(&ab);
        return rc;
    }
    Tensordd__V1__OptimizerStep s = TENSORDD__V1__OPTIMIZER_STEP__INIT;
    s.optimizer = optimizer;
    s.grads = grads;
    s.n_attrs = nattrs;
    s.attrs = ab.ptrs;
    s.pipelined = (flags & TD_STEP_PIPELINED) ? 1 : 0;
    REQ(req, optimizer_step, OPTIMIZER_STEP, &s);
    rc = s.pipelined ? td__call(c, &req, NULL, 0, NULL, err) : call_ok(c, &req, err);
    attrs_free(&ab);
    return rc;
}

int td_optimizer_state(td_client *c, td_handle optimizer, size_t n, int64_t *steps, td_handle *bufs,
                       td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if ((n && (!steps || !bufs)) || n > SIZE_MAX / 3)
        return td__fail(err, TD_EINVALID_ARGUMENT, "optimizer state: no output arrays");
    Tensordd__V1__OptimizerState os = TENSORDD__V1__OPTIMIZER_STATE__INIT;
    os.optimizer = optimizer;
    os.first_output = c->next_handle;
    c->next_handle += 3 * (uint64_t)n; /* the daemon binds those it has buffers for */
    REQ(req, optimizer_state, OPTIMIZER_STATE, &os);
    td__reply r;
    if ((rc = td__call(c, &req, NULL, 0, &r, err)) != 0)
        return rc;
    const Tensordd__V1__OptimizerStateReply *sr = r.msg->optimizer_state;
    if (r.msg->body_case != TENSORDD__V1__RESPONSE__BODY_OPTIMIZER_STATE || !sr || r.payload_len ||
        sr->n_steps != sr->n_buffers)
        return unexpected(c, &r, "OptimizerState", err);
    if (sr->n_steps != n) {
        /* The handles bound are the client's to release. */
        for (size_t i = 0; i < sr->n_buffers; i++)
            for (unsigned k = 0; k < 3; k++)
                if (sr->buffers[i] & (1u << k)) {
                    td_handle h = os.first_output + 3 * i + k;
                    td_error ignored;
                    td_release(c, &h, 1, &ignored);
                }
        rc = td__fail(err, TD_EINVALID_ARGUMENT, "the optimizer has %zu parameters, not %zu",
                      sr->n_steps, n);
        td__reply_free(&r);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        steps[i] = sr->steps[i];
        for (unsigned k = 0; k < 3; k++)
            bufs[3 * i + k] = sr->buffers[i] & (1u << k) ? os.first_output + 3 * i + k : 0;
    }
    td__reply_free(&r);
    return td__take_early(c, err);
}

int td_optimizer_load_state(td_client *c, td_handle optimizer, size_t n, const int64_t *steps,
                            const td_handle *bufs, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if ((n && (!steps || !bufs)) || n > SIZE_MAX / 3)
        return td__fail(err, TD_EINVALID_ARGUMENT, "optimizer state: no input arrays");
    Tensordd__V1__OptimizerLoadState ls = TENSORDD__V1__OPTIMIZER_LOAD_STATE__INIT;
    ls.optimizer = optimizer;
    ls.n_steps = n;
    ls.steps = (int64_t *)(uintptr_t)steps;
    ls.n_buffers = 3 * n;
    ls.buffers = (uint64_t *)(uintptr_t)bufs;
    REQ(req, optimizer_load_state, OPTIMIZER_LOAD_STATE, &ls);
    return call_ok(c, &req, err);
}

/* ---------------------------------------------------------------- graphs */

int td_graph_begin(td_client *c, const td_handle *inputs, size_t n, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    if (c->capturing)
        return td__fail(err, TD_EINVALID_ARGUMENT, "a graph is being recorded already");
    rc = td__flush(c, err); /* releases due go out before the recording starts */
    if (rc)
        return rc;
    Tensordd__V1__GraphBegin gb = TENSORDD__V1__GRAPH_BEGIN__INIT;
    gb.inputs = (uint64_t *)inputs;
    gb.n_inputs = n;
    REQ(req, graph_begin, GRAPH_BEGIN, &gb);
    rc = td__call(c, &req, NULL, 0, NULL, err);
    if (!rc) {
        c->capturing = 1;
        c->capture_first = c->next_handle;
    }
    return rc;
}

int td_graph_end(td_client *c, td_handle *graph, td_error *err)
{
    return td_graph_end_with(c, graph, NULL, 0, err);
}

int td_graph_end_with(td_client *c, td_handle *graph, const td_handle *inputs, size_t n,
                      td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    /* The releases held back: those of handles the recording bound go out before GraphEnd,
     * recorded (each replay frees again what it bound and the client dropped); those of
     * handles from before it after it (recorded, a replay would release them again). */
    size_t total = c->nrel, k = 0;
    for (size_t i = 0; i < total; i++)
        if (c->rel[i] >= c->capture_first) {
            uint64_t h = c->rel[i];
            c->rel[i] = c->rel[k];
            c->rel[k++] = h;
        }
    c->nrel = k;
    c->capturing = 0;
    rc = td__flush(c, err);
    memmove(c->rel, c->rel + k, (total - k) * sizeof *c->rel);
    c->nrel = total - k;
    if (rc)
        return rc;
    c->capturing = 1;
    Tensordd__V1__GraphEnd ge = TENSORDD__V1__GRAPH_END__INIT;
    ge.graph = c->next_handle++;
    ge.inputs = (uint64_t *)inputs;
    ge.n_inputs = n;
    REQ(req, graph_end, GRAPH_END, &ge);
    rc = call_ok(c, &req, err);
    c->capturing = 0;
    if (rc) {
        td_handle h = ge.graph; /* bound to a failed placeholder */
        td_release(c, &h, 1, NULL);
        ge.graph = 0;
    }
    if (graph)
        *graph = ge.graph;
    return rc;
}

int td_replay(td_client *c, td_handle graph, const td_handle *inputs, size_t n, td_error *err)
{
    int rc = check_client(c, err);
    if (rc)
        return rc;
    Tensordd__V1__Replay rp = TENSORDD__V1__REPLAY__INIT;
    rp.graph = graph;
    rp.inputs = (uint64_t *)inputs;
    rp.n_inputs = n;
    REQ(req, replay, REPLAY, &rp);
    return td__call(c, &req, NULL, 0, NULL, err);
}

/* ---------------------------------------------------------------- daemon to daemon */

int td_transfer_accept(td_client *target, const td_device *device, td_dtype dtype, int ndim,
                       const int64_t *shape, uint8_t capability[TD_CAPABILITY_SIZE], td_handle *out,
                       td_error *err)
{
    int rc = check_client(target, err);
    if (rc)
        return rc;
    uint64_t bytes;
    if (!capability || tensor_bytes(dtype, ndim, shape, &bytes) != 0)
        return td__fail(err, TD_EINVALID_ARGUMENT,
                        "bad dtype (%d), shape (ndim %d) or no "
                        "capability buffer",
                        (int)dtype, ndim);
    Tensordd__V1__Device dev;
    device_to_pb(device ? device : &default_device, &dev);
    Tensordd__V1__TransferAccept ta = TENSORDD__V1__TRANSFER_ACCEPT__INIT;
    ta.handle = target->next_handle++;
    ta.dtype = (Tensordd__V1__DType)dtype;
    ta.n_shape = (size_t)ndim;
    ta.shape = (int64_t *)(uintptr_t)shape;
    ta.device = &dev;
    REQ(req, transfer_accept, TRANSFER_ACCEPT, &ta);
    td__reply r;
    if ((rc = td__call(target, &req, NULL, 0, &r, err)) != 0)
        return rc;
    const Tensordd__V1__TransferCapability *tc = r.msg->transfer_capability;
    if (r.msg->body_case != TENSORDD__V1__RESPONSE__BODY_TRANSFER_CAPABILITY || !tc ||
        tc->capability.len != TD_CAPABILITY_SIZE || r.payload_len)
        return unexpected(target, &r, "TransferAccept", err);
    memcpy(capability, tc->capability.data, TD_CAPABILITY_SIZE);
    td__reply_free(&r);
    if (out)
        *out = ta.handle;
    return td__take_early(target, err);
}

int td_transfer_send(td_client *source, td_handle h, const char *endpoint, const char *token,
                     const uint8_t capability[TD_CAPABILITY_SIZE], td_error *err)
{
    int rc = check_client(source, err);
    if (rc)
        return rc;
    if (!endpoint || !capability)
        return td__fail(err, TD_EINVALID_ARGUMENT, "no endpoint or capability");
    Tensordd__V1__TransferSend ts = TENSORDD__V1__TRANSFER_SEND__INIT;
    ts.tensor = h;
    ts.endpoint = (char *)(uintptr_t)endpoint;
    ts.token = (char *)(uintptr_t)(token ? token : "");
    ts.capability.len = TD_CAPABILITY_SIZE;
    ts.capability.data = (uint8_t *)(uintptr_t)capability;
    REQ(req, transfer_send, TRANSFER_SEND, &ts);
    return call_ok(source, &req, err);
}

int td_transfer(td_client *source, td_handle h, td_client *target, const char *endpoint,
                const char *token, const td_device *device, td_handle *out, td_error *err)
{
    td_tensor_info info;
    uint8_t cap[TD_CAPABILITY_SIZE];
    td_handle landed = 0;
    int rc = td_describe(source, h, &info, err);
    if (rc == 0)
        rc = td_transfer_accept(target, device, info.dtype, info.ndim, info.shape, cap, &landed,
                                err);
    if (rc == 0)
        rc = td_transfer_send(source, h, endpoint, token, cap, err);
    if (rc == 0 && out)
        *out = landed;
    return rc;
}
