/* handlers.c -- the core requests' handlers: Hello, devices, Stats, Upload, Download,
 * Describe, Op, ToDevice, Release, Sync, Goodbye (rows of dispatch.c's table). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd.h"
#include "dtype.h"
#include "exec.h"
#include "exec_op.h"
#include "handlers.h"
#include "log.h"
#include "memfd.h"
#include "ops.h"
#include "resume.h"
#include "stats.h"
#include "tls.h"
#include "utf8.h"
#include "wire.h"

typedef Tensordd__V1__Request Request;

static char server_note[256];

void tdd_hello_set_note(const char *note)
{
    snprintf(server_note, sizeof server_note, "%s", note);
}

tdd_device *tdd_resolve_device(const Tensordd__V1__Device *d, td_error *err)
{
    if (!d || !d->backend || !d->backend[0])
        return tdd_default_device();
    int known = 0;
    tdd_device *dev = tdd_device_find(d->backend, d->ordinal, &known);
    if (!dev) {
        if (known)
            tdd_err_set(err, TD_EDEVICE_UNAVAILABLE, "device %s:%u is not served here", d->backend,
                        d->ordinal);
        else
            tdd_err_arg(err, "device", "unknown backend '%.32s'", d->backend);
    }
    return dev;
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

/* ---------------------------------------------------------------- devices, stats */

int tdd_h_list_devices(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    int n = tdd_device_count();
    Tensordd__V1__DeviceInfo *infos = calloc((size_t)n + 1, sizeof *infos);
    Tensordd__V1__DeviceInfo **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    Tensordd__V1__Device *devs = calloc((size_t)n + 1, sizeof *devs);
    char(*names)[16] = calloc((size_t)n + 1, sizeof *names);
    char(*whys)[96] = calloc((size_t)n + 1, sizeof *whys);
    if (!infos || !ptrs || !devs || !names || !whys) {
        free(infos), free(ptrs), free(devs), free(names), free(whys);
        td_error err;
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    for (int i = 0; i < n; i++) {
        tdd_device *d = tdd_device_get(i);
        tensordd__v1__device_info__init(&infos[i]);
        tdd_wire_device(&devs[i], names[i], sizeof names[i], d);
        infos[i].device = &devs[i];
        infos[i].name = d->name;
        infos[i].memory_total = d->be->memory_total ? d->be->memory_total(d->ctx, d->ordinal) : 0;
        infos[i].memory_used = d->in_use;
        /* a fault (a sticky CUDA error) took the device out of service */
        if (d->be->device_status &&
            d->be->device_status(d->ctx, d->ordinal, whys[i], sizeof whys[i])) {
            infos[i].failed = true;
            infos[i].status = whys[i];
        }
        ptrs[i] = &infos[i];
    }
    Tensordd__V1__ListDevicesReply lr = TENSORDD__V1__LIST_DEVICES_REPLY__INIT;
    lr.n_devices = (size_t)n;
    lr.devices = ptrs;
    Tensordd__V1__Response resp = TENSORDD__V1__RESPONSE__INIT;
    resp.id = req->id;
    resp.body_case = TENSORDD__V1__RESPONSE__BODY_DEVICES;
    resp.devices = &lr;
    tdd_conn_send(c, &resp, NULL, 0, NULL);
    free(infos), free(ptrs), free(devs), free(names), free(whys);
    return TDD_DISPATCH_DONE;
}

int tdd_h_stats(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    Tensordd__V1__StatsReply sr = TENSORDD__V1__STATS_REPLY__INIT;
    sr.sessions = tdd_nsessions;
    uint64_t handles = 0;
    size_t ns = 0;
    for (tdd_session *s = tdd_sessions; s; s = s->next) {
        handles += s->nhandles;
        ns++;
    }
    sr.handles = handles;
    sr.bytes_received = tdd_stats.bytes_received;
    sr.bytes_sent = tdd_stats.bytes_sent;
    sr.requests = tdd_stats.requests;
    sr.uptime_ms = uv_now(uv_default_loop()) - tdd_stats.start_ms;
    sr.tensors_alive = tdd_values_alive();
    sr.tasks_pending = tdd_exec_pending();

    Tensordd__V1__ErrorCount ec[TD_ERRNO_COUNT], *ecp[TD_ERRNO_COUNT];
    size_t nec = 0;
    for (int i = 1; i < TD_ERRNO_COUNT; i++) {
        if (!tdd_stats.errors[i])
            continue;
        tensordd__v1__error_count__init(&ec[nec]);
        ec[nec].code = (Tensordd__V1__ErrorCode)i;
        ec[nec].count = tdd_stats.errors[i];
        ecp[nec] = &ec[nec];
        nec++;
    }
    sr.n_errors = nec;
    sr.errors = ecp;

    int nd = tdd_device_count();
    Tensordd__V1__DeviceMemory *dm = calloc((size_t)nd + 1, sizeof *dm);
    Tensordd__V1__DeviceMemory **dmp = calloc((size_t)nd + 1, sizeof *dmp);
    Tensordd__V1__Device *devs = calloc((size_t)nd + 1, sizeof *devs);
    char(*names)[16] = calloc((size_t)nd + 1, sizeof *names);
    Tensordd__V1__SessionInfo *si = calloc(ns + 1, sizeof *si);
    Tensordd__V1__SessionInfo **sip = calloc(ns + 1, sizeof *sip);
    if (dm && dmp && devs && names && si && sip) {
        for (int i = 0; i < nd; i++) {
            tdd_device *d = tdd_device_get(i);
            tensordd__v1__device_memory__init(&dm[i]);
            tdd_wire_device(&devs[i], names[i], sizeof names[i], d);
            dm[i].device = &devs[i];
            dm[i].bytes_in_use = d->in_use;
            dm[i].peak_bytes = d->peak;
            dmp[i] = &dm[i];
        }
        sr.n_memory = (size_t)nd;
        sr.memory = dmp;
        size_t k = 0;
        for (tdd_session *s = tdd_sessions; s; s = s->next, k++) {
            tensordd__v1__session_info__init(&si[k]);
            si[k].session_id = s->id;
            si[k].peer = s->peer;
            si[k].client_name = s->client_name;
            si[k].handles = s->nhandles;
            si[k].bytes_in_use = s->acct->in_use;
            si[k].requests = s->requests;
            si[k].memory_limit = s->acct->limit;
            sip[k] = &si[k];
        }
        sr.n_session_list = k;
        sr.session_list = sip;
    }
    Tensordd__V1__Response resp = TENSORDD__V1__RESPONSE__INIT;
    resp.id = req->id;
    resp.body_case = TENSORDD__V1__RESPONSE__BODY_STATS;
    resp.stats = &sr;
    tdd_conn_send(c, &resp, NULL, 0, NULL);
    free(dm), free(dmp), free(devs), free(names), free(si), free(sip);
    return TDD_DISPATCH_DONE;
}

/* ---------------------------------------------------------------- list ops */

int tdd_h_list_ops(tdd_req *r)
{
    tdd_conn *c = r->c;
    size_t nattrs = 0;
    for (int op = 0; op < TDD_OP_COUNT; op++)
        nattrs += (size_t)tdd_op_schema[op].n_attrs;
    Tensordd__V1__OpSchema *os = calloc(TDD_OP_COUNT, sizeof *os);
    Tensordd__V1__OpSchema **osp = calloc(TDD_OP_COUNT, sizeof *osp);
    Tensordd__V1__AttrSchema *as = calloc(nattrs + 1, sizeof *as);
    Tensordd__V1__AttrSchema **asp = calloc(nattrs + 1, sizeof *asp);
    if (!os || !osp || !as || !asp) {
        free(os), free(osp), free(as), free(asp);
        td_error err;
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of memory listing the ops");
        tdd_answer_error(r, &err);
        return TDD_DISPATCH_DONE;
    }
    size_t k = 0;
    for (int op = 0; op < TDD_OP_COUNT; op++) {
        const tdd_opdef *d = &tdd_opdefs[op];
        const tdd_opschema *sc = &tdd_op_schema[op];
        tensordd__v1__op_schema__init(&os[op]);
        os[op].name = (char *)(uintptr_t)d->name;
        os[op].kind = (char *)(uintptr_t)tdd_opkind_name(d->kind);
        os[op].inputs = (char *)(uintptr_t)(sc->inputs ? sc->inputs : "");
        os[op].min_inputs = (uint32_t)d->min_inputs;
        os[op].max_inputs = (uint32_t)d->max_inputs;
        os[op].num_outputs = (uint32_t)tdd_op_num_outputs((tdd_op)op, NULL, 0);
        os[op].outputs_with = (char *)(uintptr_t)(sc->outputs_with ? sc->outputs_with : "");
        os[op].attrs = &asp[k];
        for (int i = 0; i < sc->n_attrs; i++, k++) {
            const tdd_attrdef *a = &sc->attrs[i];
            tensordd__v1__attr_schema__init(&as[k]);
            as[k].name = (char *)(uintptr_t)a->name;
            as[k].type = (char *)(uintptr_t)tdd_attrtype_name(a->type);
            as[k].required = a->required;
            as[k].default_value = (char *)(uintptr_t)(a->def ? a->def : "");
            as[k].bounds = (char *)(uintptr_t)(a->bounds ? a->bounds : "");
            asp[k] = &as[k];
        }
        os[op].n_attrs = (size_t)sc->n_attrs;
        osp[op] = &os[op];
    }
    Tensordd__V1__ListOpsReply lr = TENSORDD__V1__LIST_OPS_REPLY__INIT;
    lr.n_ops = TDD_OP_COUNT;
    lr.ops = osp;
    Tensordd__V1__Response resp = TENSORDD__V1__RESPONSE__INIT;
    resp.id = r->req->id;
    resp.body_case = TENSORDD__V1__RESPONSE__BODY_OPS;
    resp.ops = &lr;
    tdd_conn_send(c, &resp, NULL, 0, NULL);
    free(os), free(osp), free(as), free(asp);
    return TDD_DISPATCH_DONE;
}

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

int tdd_h_describe(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    td_error err;
    tdd_value *v;
    if (tdd_value_get(c->s, req->describe->handle, &v, &err))
        return tdd_answer_error(r, &err);
    if (tdd_value_poisoned(v)) {
        tdd_err_poisoned(&err, v);
        return tdd_answer_error(r, &err);
    }
    tdd_send_tensor(c, req->id, v, NULL, 0, NULL);
    return TDD_DISPATCH_DONE;
}

/* ---------------------------------------------------------------- ops */

static int convert_attrs(const Tensordd__V1__Op *op, td_attr *out, td_error *err)
{
    for (size_t i = 0; i < op->n_attrs; i++) {
        const Tensordd__V1__Attr *a = op->attrs[i];
        td_attr *t = &out[i];
        memset(t, 0, sizeof *t);
        t->name = a->name;
        switch (a->value_case) {
        case TENSORDD__V1__ATTR__VALUE_I:
            t->kind = TD_ATTR_INT;
            t->i = a->i;
            t->f = (double)a->i;
            break;
        case TENSORDD__V1__ATTR__VALUE_F:
            t->kind = TD_ATTR_FLOAT;
            t->f = a->f;
            break;
        case TENSORDD__V1__ATTR__VALUE_B:
            t->kind = TD_ATTR_BOOL;
            t->b = a->b;
            t->i = a->b;
            break;
        case TENSORDD__V1__ATTR__VALUE_INTS:
            t->kind = TD_ATTR_INTS;
            t->ints = a->ints->v;
            t->n = a->ints->n_v;
            break;
        case TENSORDD__V1__ATTR__VALUE_FLOATS:
            t->kind = TD_ATTR_FLOATS;
            t->floats = a->floats->v;
            t->n = a->floats->n_v;
            break;
        case TENSORDD__V1__ATTR__VALUE_S:
            t->kind = TD_ATTR_STR;
            t->s = a->s;
            break;
        case TENSORDD__V1__ATTR__VALUE__NOT_SET:
        default:
            return tdd_err_arg(err, a->name && a->name[0] ? a->name : "attrs",
                               "attribute '%.64s' has no value", a->name ? a->name : "");
        }
    }
    return 0;
}

#define TDD_MAX_ATTRS 32

int tdd_h_op(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    Tensordd__V1__Op *op = req->op;
    tdd_session *s = c->s;
    td_error err;
    int rc = 0;
    tdd_value *in[TDD_MAX_OP_INPUTS];
    tdd_value *out[TDD_MAX_OP_OUTPUTS];
    td_attr attrs[TDD_MAX_ATTRS];
    tdd_opargs args;
    int n_out = (int)op->n_outputs;

    if (op->n_outputs == 0 || op->n_outputs > TDD_MAX_OP_OUTPUTS)
        rc = tdd_err_arg(&err, "outputs", "%zu output handles; 1..%d expected", op->n_outputs,
                         TDD_MAX_OP_OUTPUTS);
    for (size_t i = 0; !rc && i < op->n_outputs; i++) {
        rc = tdd_handle_check_new(s, op->outputs[i], &err);
        for (size_t j = 0; !rc && j < i; j++)
            if (op->outputs[j] == op->outputs[i])
                rc = tdd_err_arg(&err, "outputs", "output handle %llu named twice",
                                 (unsigned long long)op->outputs[i]);
    }
    const tdd_opdef *def = NULL;
    if (!rc && !(def = tdd_op_find(op->op)))
        rc = tdd_err_set(&err, TD_EUNSUPPORTED_OP, "unknown op '%.64s'", op->op);
    if (!rc && op->n_inputs > TDD_MAX_OP_INPUTS)
        rc = tdd_err_arg(&err, "inputs", "%zu inputs; at most %d", op->n_inputs, TDD_MAX_OP_INPUTS);
    for (size_t i = 0; !rc && i < op->n_inputs; i++)
        rc = tdd_value_get(s, op->inputs[i], &in[i], &err);
    if (!rc && op->n_attrs > TDD_MAX_ATTRS)
        rc = tdd_err_arg(&err, "attrs", "%zu attributes; at most %d", op->n_attrs, TDD_MAX_ATTRS);
    if (!rc)
        rc = convert_attrs(op, attrs, &err);
    tdd_device *dev = NULL;
    if (!rc && op->n_inputs == 0 && !(dev = tdd_resolve_device(op->device, &err)))
        rc = err.code;
    if (!rc && (op->dtype < 0 || op->dtype >= (int)TD_DTYPE_COUNT))
        rc = tdd_err_arg(&err, "dtype", "unknown dtype %d", (int)op->dtype);
    tdd_opreq oreq = {
        .attrs = {.a = attrs, .n = op->n_attrs}, .dtype = (td_dtype)op->dtype, .seed = s->rng};
    if (!rc && op->requires_grad && op->n_inputs == 0) {
        /* As Upload: only floating-point tensors can require grad. Told before anything
         * is queued; the output dtypes come from prepare (cheap: there are no inputs). */
        tdd_opargs pa;
        tdd_outdesc pod[TDD_MAX_OP_OUTPUTS];
        int pn = 0;
        rc = tdd_op_prepare(def->op, NULL, 0, &oreq, tdd_cfg.max_numel, &pa, pod, &pn, &err);
        for (int i = 0; !rc && i < pn; i++) {
            td_dtype odt = pod[i].dtype;
            if (!tdd_dtype_is_float(odt))
                rc = tdd_err_arg(&err, "requires_grad",
                                 "%s: only floating-point tensors can require grad, not %s",
                                 def->name, td_dtype_name(odt));
        }
    }
    struct tdd_node *node = NULL; /* the autodiff record, reserved before anything runs */
    if (!rc && tdd_autograd_tracks(s, def->op, in, (int)op->n_inputs) &&
        !(node = tdd_autograd_reserve(s, (int)op->n_inputs, n_out, &err)))
        rc = err.code;
    if (!rc) {
        s->rng = s->rng * 6364136223846793005ull + 1442695040888963407ull;
        rc = tdd_submit_op_named(s, req->id, req->want_reply, def->op, &oreq, in, (int)op->n_inputs,
                                 dev, op->outputs, out, &n_out, &args, &err);
    }
    if (rc) {
        tdd_autograd_unreserve(node);
        return tdd_answer_error(r, &err); /* binds the outputs to placeholders */
    }
    for (int i = 0; i < n_out; i++) {
        if (op->requires_grad && op->n_inputs == 0)
            out[i]->requires_grad = true;
        tdd_handle_add(s, op->outputs[i], TD_HANDLE_TENSOR, out[i]);
    }
    if (node)
        tdd_autograd_record(node, def->op, &args, &oreq.attrs, in, (int)op->n_inputs, out, n_out);
    return TDD_DISPATCH_DONE;
}

int tdd_h_to_device(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    Tensordd__V1__ToDevice *td = req->to_device;
    tdd_session *s = c->s;
    td_error err;
    tdd_value *v = NULL, *out = NULL;
    tdd_device *dev = NULL;
    struct tdd_node *node = NULL;
    int rc = tdd_handle_check_new(s, td->output, &err);
    if (!rc)
        rc = tdd_value_get(s, td->input, &v, &err);
    if (!rc && !(dev = tdd_resolve_device(td->device, &err)))
        rc = err.code;
    if (!rc && s->grad_enabled && v->requires_grad && !(node = tdd_autograd_reserve(s, 1, 1, &err)))
        rc = err.code;
    if (!rc)
        rc = tdd_submit_copy(s, req->id, v, dev, &out, &err);
    if (rc) {
        tdd_autograd_unreserve(node);
        return tdd_answer_error(r, &err); /* binds the output to a placeholder */
    }
    tdd_handle_add(s, td->output, TD_HANDLE_TENSOR, out);
    if (node)
        tdd_autograd_record_to_device(node, v, out);
    tdd_answer_ok(r); /* queued; errors of the copy surface at the next sync */
    return TDD_DISPATCH_DONE;
}

int tdd_h_release(tdd_req *r)
{
    tdd_conn *c = r->c;
    Request *req = r->req;
    Tensordd__V1__Release *rl = req->release;
    td_error err, first;
    bool failed = false;
    for (size_t i = 0; i < rl->n_handles; i++) {
        if (tdd_handle_release(c->s, rl->handles[i], &err) && !failed) {
            first = err;
            failed = true;
        }
    }
    if (failed)
        return tdd_answer_error(r, &first);
    tdd_answer_ok(r);
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
