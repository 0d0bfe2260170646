/* group.c -- process groups: daemons that form a group (GroupCreate) and run collectives
 * on their sessions' tensors (AllReduce, Broadcast, AllGather) through Gloo.
 *
 * A group is a session handle. Its rendezvous and every collective wait for the other
 * ranks, which may take up to --group-timeout (or never come): that waiting runs on a
 * thread of its own (tdd_submit_detached), never on the loop nor on a device's worker
 * lane, which other sessions share. The request is synchronising, starts one job and
 * stays blocked until the job is done; the handler is then called again and answers with
 * the job's verdict, as OptimizerStep does. At most --group-max-inflight jobs run at
 * once. Before moving data each collective exchanges a small signature (op, root, count,
 * dtypes and shapes) with an allgather, so ranks that disagree all fail with a typed
 * error and the group stays usable. A rank that dies or misses --group-timeout makes
 * Gloo throw: every other rank gets TIMEOUT and the group is broken from then on (later
 * collectives: TIMEOUT at once). The sessions go on.
 *
 * On a device whose memory the host cannot touch (cuda, sim) the same Gloo collectives
 * run on host buffers: once every rank has arrived (the signatures agree, on the job's
 * thread) the job moves to the device's worker, which copies the tensors out in
 * bucket-sized pieces, runs the collective and copies the result back (run_staged). NCCL,
 * the fast path for cuda devices, is not used yet; nccl.c's probe says what is there. */
#include "group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd_impl.h" /* the Gradients map an all-reduce reads and updates */
#include "config.h"
#include "exec_op.h"
#include "gloo_shim.h"
#include "log.h"
#include "nccl.h"

typedef Tensordd__V1__Request Request;

enum { JOB_CREATE = 1, JOB_ALLREDUCE, JOB_BROADCAST, JOB_ALLGATHER, JOB_PREPARE, JOB_CONNECT };
enum { SIG_KIND, SIG_OP, SIG_ROOT, SIG_N, SIG_NUMEL, SIG_SHAPES, SIG_DTYPES, SIG_LEN };

typedef struct {
    tdd_value *src;  /* read (ref) */
    tdd_value *dst;  /* written (ref): src itself (in place) or a new contiguous value */
    tdd_value *leaf; /* the parameter whose gradient dst becomes (ref), or NULL */
} job_item;

typedef struct group_job {
    struct tdd_group *g; /* holds a reference until the job is done */
    int kind;
    /* GroupCreate */
    char dir[sizeof tdd_cfg.group_store_dir + 72];
    tdd_gloo *gl;
    void *blob; /* JOB_PREPARE: this rank's addresses (malloc'd) */
    size_t blob_len;
    void **peers; /* JOB_CONNECT: every rank's addresses, copied from the request */
    size_t *peer_lens;
    int g_size;
    /* collectives */
    job_item *it;
    size_t n;
    int op; /* ReduceOp */
    int root;
    tdd_value *out;    /* AllGather's (ref) */
    bool wrote;        /* data moved: in-place tensors may hold partial results on failure */
    bool astray;       /* a staging copy failed: the other ranks went on without this one */
    tdd_account *acct; /* charged with the host memory the job takes (its bucket) */
    uint64_t charged;
    /* Where it runs: on its own thread (the session's work on the group's device up to
     * wait_seq of wait_q first), or, a staged collective's data once every rank has
     * arrived, on the device's lane (on_lane; to_lane: it goes there next). */
    struct tdd_queue *wait_q;
    uint64_t wait_seq;
    bool to_lane, on_lane;
    tdd_session *s; /* the session that started it (held by its running task) */
    /* the verdict, from the worker */
    int rc;
    td_error err;
} group_job;

typedef struct tdd_group {
    long refs;
    tdd_gloo *gl;   /* NULL until the rendezvous succeeded (or, exchange, was prepared) */
    bool exchange;  /* addresses through the client: GroupConnect connects */
    bool connected; /* collectives may run */
    tdd_device *dev;
    char name[72];
    int rank, size;
    bool broken; /* the rendezvous failed or a rank was lost: broke says how */
    td_error broke;
    /* The request the connection is blocked on (its job queued or done), and its job
     * once done, until the handler answers. */
    bool pending;
    uint64_t pending_req;
    group_job *done;
    uint64_t session;              /* the session that holds it */
    struct tdd_group *prev, *next; /* every live group of the daemon (loop thread) */
} tdd_group;

static tdd_group *live_groups;
static uint32_t jobs_inflight; /* on threads of their own (--group-max-inflight) */

/* ---------------------------------------------------------------- lifetimes */

static void job_free(group_job *j)
{
    for (size_t i = 0; i < j->n; i++) {
        if (j->it[i].dst != j->it[i].src)
            tdd_value_unref(j->it[i].dst);
        tdd_value_unref(j->it[i].src);
        if (j->it[i].leaf)
            tdd_value_unref(j->it[i].leaf);
    }
    free(j->it);
    if (j->acct) {
        tdd_account_credit(j->acct, j->charged);
        tdd_account_unref(j->acct);
    }
    if (j->out)
        tdd_value_unref(j->out);
    if (j->gl)
        tdd_gloo_free(j->gl);
    free(j->blob);
    if (j->peers)
        for (int r = 0; r < j->g_size; r++)
            free(j->peers[r]);
    free(j->peers);
    free(j->peer_lens);
    free(j);
}

static void group_unref(void *obj)
{
    tdd_group *g = obj;
    if (--g->refs > 0)
        return;
    if (g->done)
        job_free(g->done);
    if (g->gl)
        tdd_gloo_free(g->gl);
    if (g->prev)
        g->prev->next = g->next;
    else if (live_groups == g)
        live_groups = g->next;
    if (g->next)
        g->next->prev = g->prev;
    free(g);
}

static void register_kind(void)
{
    static bool registered;
    if (!registered) {
        tdd_handle_set_free_fn(TD_HANDLE_GROUP, group_unref);
        registered = true;
    }
}

/* ---------------------------------------------------------------- the worker's side */

static tdd_gloo_dtype gloo_dtype(td_dtype dt)
{
    switch (dt) {
    case TD_F64:
        return TDD_GLOO_F64;
    case TD_I32:
        return TDD_GLOO_I32;
    case TD_I64:
        return TDD_GLOO_I64;
    default:
        return TDD_GLOO_F32;
    }
}

static int fail(group_job *j, int code, const char *msg)
{
    j->rc = tdd_err_set(&j->err, code, "process group '%s': %s", j->g->name, msg);
    return j->rc;
}

static const char *kind_word(int64_t k)
{
    return k == JOB_ALLREDUCE ? "AllReduce" : k == JOB_BROADCAST ? "Broadcast" : "AllGather";
}

/* Every rank's signature of the call; the first rank that disagrees with this one fails
 * the call on every rank (each sees the disagreement), before any data moves. */
static int check_signatures(group_job *j)
{
    tdd_group *g = j->g;
    int64_t sig[SIG_LEN] = {0};
    sig[SIG_KIND] = j->kind;
    sig[SIG_OP] = j->op;
    sig[SIG_ROOT] = j->root;
    sig[SIG_N] = (int64_t)j->n;
    const uint64_t prime = UINT64_C(1099511628211); /* FNV-1a */
    uint64_t hs = UINT64_C(1469598103934665603), hd = hs;
    for (size_t i = 0; i < j->n; i++) {
        const tdd_tensor *t = &j->it[i].src->t;
        sig[SIG_NUMEL] += tdd_numel(t);
        hd = (hd ^ (uint64_t)t->dtype) * prime;
        hs = (hs ^ (uint64_t)t->ndim) * prime;
        for (int d = 0; d < t->ndim; d++)
            hs = (hs ^ (uint64_t)t->shape[d]) * prime;
    }
    sig[SIG_SHAPES] = (int64_t)hs;
    sig[SIG_DTYPES] = (int64_t)hd;
    int64_t *all = malloc((size_t)g->size * sizeof sig);
    if (!all)
        return fail(j, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    char msg[200] = "";
    int rc = tdd_gloo_allgather(g->gl, sig, all, sizeof sig, msg, sizeof msg);
    if (rc) {
        free(all);
        return fail(j, rc, msg);
    }
    for (int r = 0; r < g->size && !j->rc; r++) {
        const int64_t *o = all + (size_t)r * SIG_LEN;
        if (!memcmp(o, sig, sizeof sig))
            continue;
        char why[200];
        int code = TD_EINVALID_ARGUMENT;
        if (o[SIG_KIND] != sig[SIG_KIND])
            snprintf(why, sizeof why, "rank %d called %s while rank %d called %s", r,
                     kind_word(o[SIG_KIND]), g->rank, kind_word(sig[SIG_KIND]));
        else if (o[SIG_OP] != sig[SIG_OP] || o[SIG_ROOT] != sig[SIG_ROOT])
            snprintf(why, sizeof why,
                     "rank %d called %s with op %lld root %lld, rank %d with op %lld root %lld", r,
                     kind_word(sig[SIG_KIND]), (long long)o[SIG_OP], (long long)o[SIG_ROOT],
                     g->rank, (long long)sig[SIG_OP], (long long)sig[SIG_ROOT]);
        else if (o[SIG_N] != sig[SIG_N] || o[SIG_NUMEL] != sig[SIG_NUMEL] ||
                 o[SIG_SHAPES] != sig[SIG_SHAPES]) {
            code = TD_ESHAPE_MISMATCH;
            snprintf(why, sizeof why,
                     "rank %d gave %lld tensor(s) of %lld elements, rank %d %lld tensor(s) of "
                     "%lld elements (or other shapes)",
                     r, (long long)o[SIG_N], (long long)o[SIG_NUMEL], g->rank,
                     (long long)sig[SIG_N], (long long)sig[SIG_NUMEL]);
        } else {
            code = TD_EDTYPE_MISMATCH;
            snprintf(why, sizeof why, "rank %d's tensors have other dtypes than rank %d's", r,
                     g->rank);
        }
        fail(j, code, why);
    }
    free(all);
    return j->rc;
}

/* Divides the sum by the world size, in the tensor's dtype (REDUCE_AVG: floats only). */
static void divide(void *buf, size_t count, td_dtype dt, int size)
{
    if (dt == TD_F32) {
        float *p = buf, d = (float)size;
        for (size_t i = 0; i < count; i++)
            p[i] /= d;
    } else if (dt == TD_F64) {
        double *p = buf, d = (double)size;
        for (size_t i = 0; i < count; i++)
            p[i] /= d;
    }
}

static int collective(group_job *j, void *buf, size_t count, td_dtype dt)
{
    char msg[200] = "";
    int rc;
    if (j->kind == JOB_BROADCAST) {
        rc = tdd_gloo_broadcast(j->g->gl, buf, count * td_dtype_size(dt), j->root, msg, sizeof msg);
    } else {
        tdd_gloo_op op = j->op == TENSORDD__V1__REDUCE_OP__REDUCE_MAX ? TDD_GLOO_MAX : TDD_GLOO_SUM;
        rc = tdd_gloo_allreduce(j->g->gl, buf, count, gloo_dtype(dt), op, msg, sizeof msg);
        if (!rc && j->op == TENSORDD__V1__REDUCE_OP__REDUCE_AVG)
            divide(buf, count, dt, j->g->size);
    }
    return rc ? fail(j, rc, msg) : 0;
}

/* The items in buckets: runs of one dtype packed into at most --group-bucket-bytes, one
 * collective call each; an item alone in its bucket is used where it lies. */
static int run_buckets(group_job *j)
{
    size_t cap = (size_t)tdd_cfg.group_bucket_bytes;
    uint8_t *bucket = NULL;
    for (size_t i = 0; i < j->n && !j->rc;) {
        td_dtype dt = j->it[i].dst->t.dtype;
        size_t es = td_dtype_size(dt), bytes = 0, k = i;
        while (k < j->n && j->it[k].dst->t.dtype == dt) {
            size_t b = (size_t)tdd_numel(&j->it[k].dst->t) * es;
            if (k > i && bytes + b > cap)
                break;
            bytes += b;
            k++;
        }
        if (k == i + 1) {
            collective(j, tdd_data(&j->it[i].dst->t), bytes / es, dt);
        } else if (!bucket && !(bucket = malloc(cap))) {
            fail(j, TD_ERESOURCE_EXHAUSTED, "out of host memory for a bucket");
        } else {
            size_t o = 0;
            for (size_t m = i; m < k; m++) {
                size_t b = (size_t)tdd_numel(&j->it[m].dst->t) * es;
                if (b) /* (an empty tensor may have no data pointer) */
                    memcpy(bucket + o, tdd_data(&j->it[m].dst->t), b);
                o += b;
            }
            if (!collective(j, bucket, bytes / es, dt)) {
                o = 0;
                for (size_t m = i; m < k; m++) {
                    size_t b = (size_t)tdd_numel(&j->it[m].dst->t) * es;
                    if (b)
                        memcpy(tdd_data(&j->it[m].dst->t), bucket + o, b);
                    o += b;
                }
            }
        }
        i = k;
    }
    free(bucket);
    return j->rc;
}

/* ---------------------------------------------------------------- staged (cuda, sim)
 *
 * A device whose memory the host cannot touch: each collective runs on host buffers. On
 * the device's worker, in order with the session's other work there, pieces of the
 * tensors are copied to a host bucket of at most --group-bucket-bytes, the same Gloo
 * collective runs on it, and the result is copied back. Pieces are cut the same way on
 * every rank (the signatures agree), so the ranks make the same calls. */

static int stage(group_job *j, bool to_host, void *dst, const void *src, size_t n)
{
    const tdd_device *d = j->g->dev;
    int rc = to_host ? d->be->to_host(d->ctx, d->ordinal, dst, src, n)
                     : d->be->from_host(d->ctx, d->ordinal, dst, src, n);
    if (!rc)
        return 0;
    j->astray = true;
    char what[200] = "";
    if (d->be->error_message)
        d->be->error_message(d->ctx, d->ordinal, rc, what, sizeof what);
    j->rc = tdd_err_set(&j->err, rc, "process group '%s': copy %s %s: %s", j->g->name,
                        to_host ? "from" : "to", d->label, what[0] ? what : td_strerror(rc));
    return j->rc;
}

static size_t item_bytes(const tdd_value *v)
{
    return (size_t)tdd_numel(&v->t) * td_dtype_size(v->t.dtype);
}

/* The host bytes a staged AllGather of nbytes a rank takes per piece, and its whole
 * host buffer (the piece and every rank's piece). */
static size_t gather_piece(size_t nbytes, size_t es, int size, size_t *host)
{
    size_t cap = (size_t)tdd_cfg.group_bucket_bytes;
    size_t piece = cap / ((size_t)size + 1) / es * es;
    if (piece < es)
        piece = es;
    if (piece > nbytes)
        piece = nbytes;
    *host = piece * ((size_t)size + 1);
    return piece;
}

/* The host bucket a staged AllReduce or Broadcast of total bytes takes. */
static size_t staged_bucket(uint64_t total)
{
    return (size_t)(total < tdd_cfg.group_bucket_bytes ? total : tdd_cfg.group_bucket_bytes);
}

static int run_staged(group_job *j)
{
    size_t total = 0;
    for (size_t i = 0; i < j->n; i++)
        total += item_bytes(j->it[i].src);
    if (!total)
        return 0;
    /* (at least one element of any dtype: a run of empty tensors moves on too) */
    size_t cap = staged_bucket(total) < 8 ? 8 : staged_bucket(total);
    uint8_t *bucket = malloc(cap);
    if (!bucket)
        return fail(j, TD_ERESOURCE_EXHAUSTED, "out of host memory for a bucket");
    size_t i = 0, off = 0; /* the next piece: item i from byte off */
    while (i < j->n && !j->rc) {
        td_dtype dt = j->it[i].dst->t.dtype;
        size_t es = td_dtype_size(dt), room = cap / es * es, used = 0;
        size_t i0 = i, off0 = off;
        while (i < j->n && j->it[i].dst->t.dtype == dt && used < room && !j->rc) {
            size_t nb = item_bytes(j->it[i].src), take = nb - off;
            if (take > room - used)
                take = room - used;
            if (take)
                stage(j, true, bucket + used, (const uint8_t *)tdd_data(&j->it[i].src->t) + off,
                      take);
            used += take;
            off += take;
            if (off == nb)
                i++, off = 0;
        }
        if (j->rc || !used || collective(j, bucket, used / es, dt))
            continue;
        for (size_t k = i0, o = off0, u = 0; u < used && !j->rc;) {
            size_t nb = item_bytes(j->it[k].dst), take = nb - o;
            if (take > used - u)
                take = used - u;
            if (take)
                stage(j, false, (uint8_t *)tdd_data(&j->it[k].dst->t) + o, bucket + u, take);
            u += take;
            o += take;
            if (o == nb)
                k++, o = 0;
        }
    }
    free(bucket);
    return j->rc;
}

static int gather_staged(group_job *j)
{
    tdd_group *g = j->g;
    const tdd_tensor *t = &j->it[0].src->t;
    size_t es = td_dtype_size(t->dtype), nbytes = (size_t)tdd_numel(t) * es, host;
    size_t piece = gather_piece(nbytes, es, g->size, &host);
    if (!nbytes)
        return 0;
    uint8_t *in = malloc(host);
    if (!in)
        return fail(j, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    uint8_t *all = in + piece, *out = tdd_data(&j->out->t);
    const uint8_t *src = tdd_data(t);
    for (size_t off = 0; off < nbytes && !j->rc; off += piece) {
        size_t take = nbytes - off < piece ? nbytes - off : piece;
        char msg[200] = "";
        if (stage(j, true, in, src + off, take))
            break;
        int rc = tdd_gloo_allgather(g->gl, in, all, take, msg, sizeof msg);
        if (rc) {
            fail(j, rc, msg);
            break;
        }
        for (int r = 0; r < g->size && !j->rc; r++)
            stage(j, false, out + (size_t)r * nbytes + off, all + (size_t)r * take, take);
    }
    free(in);
    return j->rc;
}

static void job_done(void *arg, int rc);

/* The data of a collective whose ranks have all arrived (the signatures agreed). */
static int move_data(group_job *j)
{
    tdd_group *g = j->g;
    j->wrote = true;
    if (!g->dev->be->host_memory)
        return j->kind == JOB_ALLGATHER ? gather_staged(j) : run_staged(j);
    if (j->kind == JOB_ALLGATHER) {
        const tdd_tensor *t = &j->it[0].src->t;
        size_t nbytes = (size_t)tdd_numel(t) * td_dtype_size(t->dtype);
        void *in = tdd_data(t), *tmp = NULL;
        if (!tdd_is_contiguous(t)) {
            if (!(tmp = malloc(nbytes ? nbytes : 1)))
                return fail(j, TD_ERESOURCE_EXHAUSTED, "out of host memory");
            tdd_copy_contiguous(t, tmp);
            in = tmp;
        }
        char msg[200] = "";
        int rc = tdd_gloo_allgather(g->gl, in, tdd_data(&j->out->t), nbytes, msg, sizeof msg);
        free(tmp);
        return rc ? fail(j, rc, msg) : 0;
    }
    for (size_t i = 0; i < j->n; i++) /* gradients: into their new contiguous values */
        if (j->it[i].dst != j->it[i].src)
            tdd_copy_contiguous(&j->it[i].src->t, tdd_data(&j->it[i].dst->t));
    return run_buckets(j);
}

/* The rendezvous: GroupCreate (through the store, or this rank's addresses) and
 * GroupConnect. */
static int rendezvous(group_job *j)
{
    tdd_group *g = j->g;
    char msg[200] = "";
    int code = 0;
    const char *addr = tdd_cfg.group_address[0] ? tdd_cfg.group_address : "127.0.0.1";
    long timeout_ms = (long)tdd_cfg.group_timeout_s * 1000;
    if (j->kind == JOB_PREPARE)
        j->gl = tdd_gloo_prepare(addr, g->rank, g->size, timeout_ms, &j->blob, &j->blob_len, &code,
                                 msg, sizeof msg);
    else if (j->kind == JOB_CONNECT)
        code = tdd_gloo_finish(g->gl, (const void *const *)j->peers, j->peer_lens, msg, sizeof msg);
    else
        j->gl =
            tdd_gloo_connect(addr, j->dir, g->rank, g->size, timeout_ms, &code, msg, sizeof msg);
    if (code)
        j->rc = tdd_err_set(&j->err, code, "process group '%s', rank %d of %d: %s", g->name,
                            g->rank, g->size, msg);
    return j->rc;
}

/* On the job's own thread (or, on_lane, on the device's worker). */
static int job_run(void *arg)
{
    group_job *j = arg;
    if (j->on_lane)
        return move_data(j);
    if (j->wait_q) /* the session's work it reads (a view laid out densely) */
        tdd_queue_wait(j->wait_q, j->wait_seq);
    if (j->kind == JOB_CREATE || j->kind == JOB_PREPARE || j->kind == JOB_CONNECT)
        return rendezvous(j);
    if (check_signatures(j))
        return j->rc;
    if (!j->g->dev->be->host_memory) { /* the copies run on the device's worker */
        j->to_lane = true;
        return 0;
    }
    return move_data(j);
}

/* Every rank has arrived: a staged collective's data moves on the device's worker, in
 * order with the session's work there. false when it could not be queued (j failed). */
static bool job_to_lane(group_job *j)
{
    j->to_lane = false;
    j->on_lane = true;
    tdd_queue *lane = tdd_device_lane(j->g->dev, j->s->id);
    uint64_t seq = tdd_queue_next_seq(lane);
    j->g->refs++;
    if (tdd_submit_work(j->s, j->g->dev, job_run, job_done, j)) {
        j->g->refs--;
        j->astray = true; /* the other ranks go on without this one */
        fail(j, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return false;
    }
    for (size_t i = 0; i < j->n; i++) {
        j->it[i].dst->fq = lane;
        j->it[i].dst->fseq = seq;
    }
    if (j->out) {
        j->out->fq = lane;
        j->out->fseq = seq;
    }
    return true;
}

/* On the loop, once the job ran. */
static void job_done(void *arg, int rc)
{
    group_job *j = arg;
    tdd_group *g = j->g;
    (void)rc;
    if (!j->on_lane)
        jobs_inflight--;
    if (j->to_lane && !j->rc && job_to_lane(j)) {
        group_unref(g); /* the lane's task took a reference of its own */
        return;
    }
    if (j->kind == JOB_CREATE || j->kind == JOB_PREPARE) {
        if (j->gl) {
            g->gl = j->gl;
            j->gl = NULL;
            g->connected = j->kind == JOB_CREATE;
        } else {
            g->broken = true;
            g->broke = j->err;
        }
    } else if (j->kind == JOB_CONNECT) { /* half-made connections cannot be trusted */
        g->connected = !j->rc;
        if (j->rc) {
            g->broken = true;
            g->broke = j->err;
        }
    } else if (j->rc == TD_ETIMEOUT || j->astray) {
        /* Gloo lost a rank, or this rank fell out of step with the others (a staging copy
         * failed while they went on): the group cannot go on */
        g->broken = true;
        g->broke = j->err;
    }
    if (j->rc && j->wrote && j->kind != JOB_ALLGATHER) /* in place: partial results */
        for (size_t i = 0; i < j->n; i++)
            if (j->it[i].dst == j->it[i].src)
                tdd_value_poison(j->it[i].dst, j->rc, g->pending_req);
    g->done = j;
    j->g = NULL;
    group_unref(g); /* the job's reference; the last one frees the job too */
}

/* ---------------------------------------------------------------- requests */

/* RESOURCE_EXHAUSTED when --group-max-inflight jobs are running already. */
static int inflight_full(td_error *err)
{
    if (jobs_inflight < tdd_cfg.group_max_inflight)
        return 0;
    return tdd_err_resource(err, "process-group requests", 1, 0,
                            "%u process-group requests are waiting for their peers already "
                            "(--group-max-inflight)",
                            jobs_inflight);
}

/* Starts j on a thread of its own, after the session's work queued on the device (a
 * group's request is synchronising: the connection sends nothing more meanwhile). */
static int job_start(tdd_session *s, tdd_group *g, group_job *j)
{
    tdd_queue *lane = tdd_device_lane(g->dev, s->id);
    j->wait_q = lane;
    j->wait_seq = tdd_queue_next_seq(lane) - 1;
    j->s = s;
    j->g = g;
    g->refs++;
    if (tdd_submit_detached(s, job_run, job_done, j)) {
        g->refs--;
        return TD_ERESOURCE_EXHAUSTED;
    }
    jobs_inflight++;
    return 0;
}

/* A fresh stamp for tdd_value.mark (duplicates found in O(1) each), in a range of its own:
 * optim_req.c counts its stamps up from 1. */
static uint64_t next_mark(void)
{
    static uint64_t stamp;
    return (UINT64_C(1) << 63) | ++stamp;
}

static int valid_name(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static tdd_device *group_device(const Tensordd__V1__Device *d, td_error *err)
{
    tdd_device *dev;
    if (!d || !d->backend || !d->backend[0]) {
        dev = tdd_default_device();
    } else {
        int known = 0;
        dev = tdd_device_find(d->backend, d->ordinal, &known);
        if (!dev) {
            if (known)
                tdd_err_set(err, TD_EDEVICE_UNAVAILABLE, "device %s:%u is not served here",
                            d->backend, d->ordinal);
            else
                tdd_err_arg(err, "device", "unknown backend '%.32s'", d->backend);
            return NULL;
        }
    }
    if (!dev->be->host_memory && (!dev->be->to_host || !dev->be->from_host)) {
        tdd_err_set(err, TD_EUNSUPPORTED_OP,
                    "collectives run on host-memory devices and on devices with copies to "
                    "and from the host, not %s",
                    dev->label);
        return NULL;
    }
    return dev;
}

/* The retry of a request whose job is done: the job, taken from the group. */
static group_job *take_done(tdd_group *g, uint64_t req_id)
{
    if (!g->pending || g->pending_req != req_id)
        return NULL;
    group_job *j = g->done;
    g->done = NULL;
    g->pending = false;
    return j;
}

/* GroupCreate's answer with exchange: the blob of tdd_gloo_prepare (a 4-byte length and
 * the bytes, per rank) as GroupAddressReply.addresses. Consumes j. */
static int answer_addresses(tdd_req *r, const tdd_group *g, group_job *j)
{
    ProtobufCBinaryData *a = calloc((size_t)g->size, sizeof *a);
    const uint8_t *p = j->blob, *end = p + j->blob_len;
    for (int k = 0; a && k < g->size; k++) {
        uint32_t n = 0;
        if ((size_t)(end - p) >= sizeof n)
            memcpy(&n, p, sizeof n);
        p += (size_t)(end - p) >= sizeof n ? sizeof n : (size_t)(end - p);
        a[k].len = n <= (size_t)(end - p) ? n : (size_t)(end - p);
        a[k].data = (uint8_t *)p;
        p += a[k].len;
    }
    if (!a) {
        job_free(j);
        td_error err;
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    Tensordd__V1__GroupAddressReply ga = TENSORDD__V1__GROUP_ADDRESS_REPLY__INIT;
    ga.n_addresses = (size_t)g->size;
    ga.addresses = a;
    Tensordd__V1__Response resp = TENSORDD__V1__RESPONSE__INIT;
    resp.id = r->req->id;
    resp.body_case = TENSORDD__V1__RESPONSE__BODY_GROUP_ADDRESS;
    resp.group_address = &ga;
    tdd_conn_send(r->c, &resp, NULL, 0, NULL);
    free(a);
    job_free(j);
    return TDD_DISPATCH_DONE;
}

/* The log's line for a group that can run collectives, naming the path they take. */
static void log_formed(uint64_t session, const tdd_group *g)
{
    char how[460] = "";
    if (!g->dev->be->host_memory) { /* cuda, sim */
        char nccl[400] = "";
        if (strcmp(g->dev->be->name, "cuda") == 0)
            tdd_nccl_probe(nccl, sizeof nccl);
        snprintf(how, sizeof how, "; collectives staged through host memory over Gloo%s%s%s",
                 nccl[0] ? " (" : "", nccl, nccl[0] ? ")" : "");
    }
    tdd_info("session %llu: group '%s' formed, rank %d of %d on %s%s", (unsigned long long)session,
             g->name, g->rank, g->size, g->dev->label, how);
}

int tdd_h_group_create(tdd_req *r)
{
    register_kind();
    tdd_session *s = r->c->s;
    const Tensordd__V1__GroupCreate *gc = r->req->group_create;
    td_error err;
    tdd_handle *h = tdd_handle_find(s, gc->group);
    if (h && h->kind == TD_HANDLE_GROUP && !h->poisoned) {
        tdd_group *g = h->obj;
        group_job *j = take_done(g, r->req->id);
        if (j) { /* the rendezvous ran */
            if (g->broken) {
                job_free(j);
                return tdd_answer_error(r, &g->broke);
            }
            if (g->exchange) /* this rank's addresses, for GroupConnect */
                return answer_addresses(r, g, j);
            job_free(j);
            log_formed(s->id, g);
            tdd_answer_ok(r);
            return TDD_DISPATCH_DONE;
        }
    }
    tdd_device *dev = NULL;
    int rc = 0;
    if (!tdd_cfg.group_store_dir[0] && !gc->exchange)
        rc = tdd_err_set(&err, TD_EUNSUPPORTED_OP,
                         "process groups through a store are off on this daemon (start it "
                         "with --group-store-dir, or exchange the addresses: "
                         "GroupCreate.exchange)");
    else if (!valid_name(gc->name))
        rc = tdd_err_arg(&err, "name",
                         "a group name is 1 to 64 characters of [A-Za-z0-9._-], got '%.64s'",
                         gc->name ? gc->name : "");
    else if (gc->world_size == 0 || gc->world_size > tdd_cfg.group_max_ranks)
        rc = tdd_err_arg(&err, "world_size",
                         "world_size must be 1 to %u (--group-max-ranks), got %u",
                         tdd_cfg.group_max_ranks, gc->world_size);
    else if (gc->rank >= gc->world_size)
        rc = tdd_err_arg(&err, "rank", "rank %u is out of range for world_size %u", gc->rank,
                         gc->world_size);
    else if (!(dev = group_device(gc->device, &err)))
        rc = err.code;
    else
        rc = inflight_full(&err);
    /* One rank of a group per daemon (the docs' rule; a group's ranks are its daemons). */
    for (const tdd_group *o = live_groups; !rc && o; o = o->next)
        if (strcmp(o->name, gc->name) == 0)
            rc = tdd_err_arg(&err, "name",
                             "group '%s' already has rank %d on this daemon (session %llu): "
                             "one rank of a group per daemon",
                             o->name, o->rank, (unsigned long long)o->session);
    if (!rc)
        rc = tdd_handle_check_new(s, gc->group, &err);
    if (rc)
        return tdd_answer_error(r, &err);
    tdd_group *g = calloc(1, sizeof *g);
    group_job *j = calloc(1, sizeof *j);
    if (!g || !j) {
        free(g);
        free(j);
        tdd_handle_unreserve(s, gc->group);
        tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return tdd_answer_error(r, &err);
    }
    g->refs = 1; /* the handle's (job_start takes the job's) */
    g->session = s->id;
    g->next = live_groups;
    if (live_groups)
        live_groups->prev = g;
    live_groups = g;
    g->dev = dev;
    g->rank = (int)gc->rank;
    g->size = (int)gc->world_size;
    snprintf(g->name, sizeof g->name, "%s", gc->name);
    g->pending = true;
    g->pending_req = r->req->id;
    g->exchange = gc->exchange;
    j->kind = gc->exchange ? JOB_PREPARE : JOB_CREATE;
    snprintf(j->dir, sizeof j->dir, "%s/%s", tdd_cfg.group_store_dir, g->name);
    tdd_handle_add(s, gc->group, TD_HANDLE_GROUP, g);
    if (job_start(s, g, j)) {
        free(j);
        g->pending = false;
        g->broken = true;
        tdd_err_set(&g->broke, TD_ERESOURCE_EXHAUSTED, "out of threads for a process group");
        return tdd_answer_error(r, &g->broke);
    }
    return TDD_DISPATCH_BLOCK;
}

/* The group, or a typed error; *retry the finished job when this is the handler's second
 * call for the request. */
static int group_for(tdd_req *r, uint64_t id, tdd_group **out, group_job **retry, td_error *err)
{
    register_kind();
    tdd_group *g;
    int rc = tdd_handle_get(r->c->s, id, TD_HANDLE_GROUP, (void **)&g, err);
    if (rc)
        return rc;
    *out = g;
    if ((*retry = take_done(g, r->req->id)))
        return 0;
    if (g->broken)
        return tdd_err_set(err, g->broke.code, "this process group is broken: %s",
                           g->broke.message);
    if (!g->connected && r->req->body_case != TENSORDD__V1__REQUEST__BODY_GROUP_CONNECT)
        return tdd_err_arg(err, "group", "process group '%s' is not connected yet (GroupConnect)",
                           g->name);
    return 0;
}

/* A tensor a collective of g may use. */
static int check_tensor(tdd_session *s, const tdd_group *g, uint64_t id, bool in_place,
                        tdd_value **out, td_error *err)
{
    tdd_value *v;
    int rc = tdd_value_get(s, id, &v, err);
    if (rc)
        return rc;
    if (tdd_value_poisoned(v))
        return tdd_err_poisoned(err, v);
    if (v->dev != g->dev)
        return tdd_err_devices(
            err, v->dev->be == g->dev->be ? TD_EDEVICE_MISMATCH : TD_EBACKEND_MISMATCH, g->dev,
            v->dev, 0, 0, "process group '%s' is on %s, tensor %llu on %s", g->name, g->dev->label,
            (unsigned long long)id, v->dev->label);
    if (in_place && !tdd_is_contiguous(&v->t))
        return tdd_err_arg(err, "tensors",
                           "tensor %llu is not contiguous (a collective writes it in place)",
                           (unsigned long long)id);
    *out = v;
    return 0;
}

static int reducible(const tdd_value *v, int op, uint64_t id, td_error *err)
{
    td_dtype dt = v->t.dtype;
    bool fl = dt == TD_F32 || dt == TD_F64;
    if (!fl && dt != TD_I32 && dt != TD_I64)
        return tdd_err_set(err, TD_EUNSUPPORTED_DTYPE,
                           "all-reduce takes float32, float64, int32 and int64; tensor %llu is %s",
                           (unsigned long long)id, td_dtype_name(dt));
    if (!fl && op == TENSORDD__V1__REDUCE_OP__REDUCE_AVG)
        return tdd_err_set(err, TD_EUNSUPPORTED_DTYPE,
                           "an average needs a floating-point dtype; tensor %llu is %s",
                           (unsigned long long)id, td_dtype_name(dt));
    return 0;
}

/* On a device the host cannot read, a strided view is first laid out densely on the
 * device (an op queued before the collective, on the same lane): *v becomes that value,
 * *dense too (the caller's reference, to drop). A view on a host-memory device is read
 * where it lies. */
static int dense_on_device(tdd_req *r, tdd_value **v, tdd_value **dense, td_error *err)
{
    *dense = NULL;
    if ((*v)->dev->be->host_memory || tdd_is_contiguous(&(*v)->t))
        return 0;
    tdd_opreq oreq = {.dtype = TD_DTYPE_INVALID};
    int n_out = 1;
    int rc = tdd_submit_op(r->c->s, r->req->id, false, TDD_OP_CONTIGUOUS, &oreq, v, 1, NULL, dense,
                           &n_out, NULL, err);
    if (!rc)
        *v = *dense;
    return rc;
}

static group_job *job_new(int kind, size_t n, td_error *err)
{
    group_job *j = calloc(1, sizeof *j);
    if (j && !(j->it = calloc(n ? n : 1, sizeof *j->it))) {
        free(j);
        j = NULL;
    }
    if (!j)
        tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    else
        j->kind = kind;
    return j;
}

static void job_add(group_job *j, tdd_value *src, tdd_value *dst, tdd_value *leaf)
{
    tdd_value_ref(src);
    if (dst != src)
        tdd_value_ref(dst); /* new values come with the reference the job keeps */
    if (leaf)
        tdd_value_ref(leaf);
    j->it[j->n++] = (job_item){src, dst, leaf};
}

/* Starts j; the tensors it writes in place are the session's again once it is answered. */
static int job_submit(tdd_req *r, tdd_group *g, group_job *j, td_error *err)
{
    tdd_session *s = r->c->s;
    if (inflight_full(err)) {
        job_free(j);
        return err->code;
    }
    /* The host memory the worker will take beyond the tensors: a bucket when tensors are
     * packed, a contiguous copy of a gathered view. */
    uint64_t need = 0, total = 0;
    size_t need_host = 0;
    for (size_t i = 0; i < j->n; i++)
        total += (uint64_t)tdd_numel(&j->it[i].src->t) * td_dtype_size(j->it[i].src->t.dtype);
    if (!g->dev->be->host_memory && j->kind == JOB_ALLGATHER)
        gather_piece((size_t)total, td_dtype_size(j->it[0].src->t.dtype), g->size, &need_host);
    else if (!g->dev->be->host_memory && j->kind != JOB_CONNECT)
        need = staged_bucket(total);
    else if (j->kind == JOB_ALLGATHER)
        need = tdd_is_contiguous(&j->it[0].src->t) ? 0 : total;
    else if (j->n > 1)
        need = total < tdd_cfg.group_bucket_bytes ? total : tdd_cfg.group_bucket_bytes;
    if (need_host)
        need = need_host;
    if (need && tdd_account_charge(s->acct, need, err)) {
        job_free(j);
        return err->code;
    }
    if (need) {
        j->acct = s->acct;
        j->acct->refs++; /* the job may outlive its session */
        j->charged = need;
    }
    if (job_start(s, g, j)) {
        job_free(j);
        return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of threads for a process group");
    }
    for (size_t i = 0; i < j->n; i++) {
        tdd_value *v = j->it[i].dst;
        if (v == j->it[i].src && j->kind != JOB_ALLGATHER)
            v->t.st->version++; /* an in-place update, as autodiff counts them */
    }
    g->pending = true;
    g->pending_req = r->req->id;
    return 0;
}

/* The answer to a collective's second call: its verdict. */
static int answer_job(tdd_req *r, group_job *j)
{
    if (j->rc) {
        td_error err = j->err;
        job_free(j);
        return tdd_answer_error(r, &err);
    }
    job_free(j);
    tdd_answer_ok(r);
    return TDD_DISPATCH_DONE;
}

int tdd_h_all_reduce(tdd_req *r)
{
    tdd_session *s = r->c->s;
    const Tensordd__V1__AllReduce *ar = r->req->all_reduce;
    td_error err;
    tdd_group *g;
    group_job *j = NULL;
    int rc = group_for(r, ar->group, &g, &j, &err);
    if (rc)
        return tdd_answer_error(r, &err);
    if (j) {
        tdd_grads *gr = NULL;
        if (!j->rc && ar->grads &&
            !tdd_handle_get(s, ar->grads, TD_HANDLE_GRADIENTS, (void **)&gr, &err))
            for (size_t i = 0; i < j->n && !j->rc; i++)
                if (tdd_grads_set(gr, j->it[i].leaf, j->it[i].dst, &err))
                    j->rc = err.code, j->err = err;
        return answer_job(r, j);
    }
    tdd_grads *gr = NULL;
    if (ar->op != TENSORDD__V1__REDUCE_OP__REDUCE_SUM &&
        ar->op != TENSORDD__V1__REDUCE_OP__REDUCE_AVG &&
        ar->op != TENSORDD__V1__REDUCE_OP__REDUCE_MAX)
        rc = tdd_err_arg(&err, "op", "unknown reduce op %d (sum 0, avg 1, max 2)", (int)ar->op);
    else if (ar->n_tensors == 0)
        rc = tdd_err_arg(&err, "tensors", "AllReduce names no tensor");
    else if (ar->grads)
        rc = tdd_handle_get(s, ar->grads, TD_HANDLE_GRADIENTS, (void **)&gr, &err);
    if (rc)
        return tdd_answer_error(r, &err);
    if (!(j = job_new(JOB_ALLREDUCE, ar->n_tensors, &err)))
        return tdd_answer_error(r, &err);
    j->op = (int)ar->op;
    uint64_t mark = next_mark();
    for (size_t i = 0; i < ar->n_tensors && !rc; i++) {
        uint64_t id = ar->tensors[i];
        tdd_value *v = NULL, *src = NULL, *dst = NULL, *dense = NULL;
        if (!gr) {
            rc = check_tensor(s, g, id, true, &v, &err);
            src = dst = v;
        } else {
            rc = tdd_value_get(s, id, &v, &err);
            tdd_grad_entry *e = rc ? NULL : tdd_grads_find(gr, v);
            if (!rc && !e)
                rc = tdd_err_arg(&err, "tensors", "tensor %llu has no gradient in gradients %llu",
                                 (unsigned long long)id, (unsigned long long)ar->grads);
            if (!rc && tdd_value_poisoned(e->grad))
                rc = tdd_err_poisoned(&err, e->grad);
            if (!rc && e->grad->dev != g->dev)
                rc = tdd_err_devices(&err, TD_EDEVICE_MISMATCH, g->dev, e->grad->dev, 0, 0,
                                     "process group '%s' is on %s, the gradient of %llu on %s",
                                     g->name, g->dev->label, (unsigned long long)id,
                                     e->grad->dev->label);
            if (!rc) {
                src = e->grad;
                dst = tdd_value_alloc(s, g->dev, src->t.dtype, src->t.ndim, src->t.shape, &err);
                if (!dst)
                    rc = err.code;
                else
                    rc = dense_on_device(r, &src, &dense, &err);
            }
        }
        if (!rc && v->mark == mark)
            rc = tdd_err_arg(&err, "tensors", "tensor %llu is named twice", (unsigned long long)id);
        if (!rc)
            rc = reducible(src, j->op, id, &err);
        if (!rc) {
            v->mark = mark;
            job_add(j, src, dst, gr ? v : NULL);
        }
        if (dst && dst != src)
            tdd_value_unref(dst); /* the job holds it now, or nobody */
        if (dense)
            tdd_value_unref(dense);
    }
    if (!rc)
        rc = job_submit(r, g, j, &err);
    else
        job_free(j);
    return rc ? tdd_answer_error(r, &err) : TDD_DISPATCH_BLOCK;
}

int tdd_h_broadcast(tdd_req *r)
{
    tdd_session *s = r->c->s;
    const Tensordd__V1__Broadcast *bc = r->req->broadcast;
    td_error err;
    tdd_group *g;
    group_job *j = NULL;
    int rc = group_for(r, bc->group, &g, &j, &err);
    if (rc)
        return tdd_answer_error(r, &err);
    if (j)
        return answer_job(r, j);
    if (bc->root >= (uint32_t)g->size)
        rc = tdd_err_arg(&err, "root", "root %u is out of range for world_size %d", bc->root,
                         g->size);
    else if (bc->n_tensors == 0)
        rc = tdd_err_arg(&err, "tensors", "Broadcast names no tensor");
    else if (!(j = job_new(JOB_BROADCAST, bc->n_tensors, &err)))
        rc = err.code;
    if (rc)
        return tdd_answer_error(r, &err);
    j->root = (int)bc->root;
    uint64_t mark = next_mark();
    for (size_t i = 0; i < bc->n_tensors && !rc; i++) {
        tdd_value *v = NULL;
        rc = check_tensor(s, g, bc->tensors[i], true, &v, &err);
        if (!rc && v->mark == mark)
            rc = tdd_err_arg(&err, "tensors", "tensor %llu is named twice",
                             (unsigned long long)bc->tensors[i]);
        if (!rc) {
            v->mark = mark;
            job_add(j, v, v, NULL);
        }
    }
    if (!rc)
        rc = job_submit(r, g, j, &err);
    else
        job_free(j);
    return rc ? tdd_answer_error(r, &err) : TDD_DISPATCH_BLOCK;
}

int tdd_h_all_gather(tdd_req *r)
{
    tdd_session *s = r->c->s;
    const Tensordd__V1__AllGather *ag = r->req->all_gather;
    td_error err;
    tdd_group *g;
    group_job *j = NULL;
    int rc = group_for(r, ag->group, &g, &j, &err);
    if (rc)
        return tdd_answer_error(r, &err);
    if (j) {
        if (j->rc) {
            tdd_handle_unreserve(s, ag->output);
            return answer_job(r, j);
        }
        tdd_value_ref(j->out);
        tdd_handle_add(s, ag->output, TD_HANDLE_TENSOR, j->out);
        return answer_job(r, j);
    }
    tdd_value *v = NULL;
    rc = check_tensor(s, g, ag->tensor, false, &v, &err);
    if (!rc && v->t.ndim + 1 > TD_MAX_NDIM)
        rc = tdd_err_arg(&err, "tensor", "the gathered tensor would have more than %d dimensions",
                         TD_MAX_NDIM);
    if (!rc && (int64_t)g->size > tdd_cfg.max_numel / (tdd_numel(&v->t) ? tdd_numel(&v->t) : 1))
        rc = tdd_err_arg(&err, "tensor", "the gathered tensor would exceed %lld elements",
                         (long long)tdd_cfg.max_numel);
    if (!rc)
        rc = tdd_handle_check_new(s, ag->output, &err);
    if (rc)
        return tdd_answer_error(r, &err);
    int64_t shape[TD_MAX_NDIM];
    shape[0] = g->size;
    memcpy(shape + 1, v->t.shape, (size_t)v->t.ndim * sizeof shape[0]);
    tdd_value *out = tdd_value_alloc(s, g->dev, v->t.dtype, v->t.ndim + 1, shape, &err);
    tdd_value *dense = NULL;
    if (!out || dense_on_device(r, &v, &dense, &err) || !(j = job_new(JOB_ALLGATHER, 1, &err))) {
        if (out)
            tdd_value_unref(out);
        if (dense)
            tdd_value_unref(dense);
        tdd_handle_unreserve(s, ag->output);
        return tdd_answer_error(r, &err);
    }
    job_add(j, v, v, NULL);
    if (dense)
        tdd_value_unref(dense); /* the job holds it */
    j->out = out;
    if (job_submit(r, g, j, &err)) {
        tdd_handle_unreserve(s, ag->output);
        return tdd_answer_error(r, &err);
    }
    return TDD_DISPATCH_BLOCK;
}

int tdd_h_group_connect(tdd_req *r)
{
    const Tensordd__V1__GroupConnect *gc = r->req->group_connect;
    td_error err;
    tdd_group *g;
    group_job *j = NULL;
    int rc = group_for(r, gc->group, &g, &j, &err);
    if (rc)
        return tdd_answer_error(r, &err);
    if (j) {
        if (!j->rc)
            log_formed(r->c->s->id, g);
        return answer_job(r, j);
    }
    size_t most = 256; /* a Gloo TCP address is well under it */
    if (!g->exchange || g->connected)
        rc = tdd_err_arg(&err, "group", "process group '%s' %s", g->name,
                         g->exchange ? "is connected already"
                                     : "was formed through the store (no GroupConnect)");
    else if (gc->n_addresses != (size_t)g->size)
        rc = tdd_err_arg(&err, "addresses", "%zu address(es) for a group of %d", gc->n_addresses,
                         g->size);
    for (size_t i = 0; !rc && i < gc->n_addresses; i++)
        if (gc->addresses[i].len > most)
            rc = tdd_err_arg(&err, "addresses",
                             "rank %zu's address for this rank is %zu bytes, at most %zu", i,
                             gc->addresses[i].len, most);
    if (!rc && !(j = job_new(JOB_CONNECT, 0, &err)))
        rc = err.code;
    if (!rc) {
        j->g_size = g->size;
        j->peers = calloc((size_t)g->size, sizeof *j->peers);
        j->peer_lens = calloc((size_t)g->size, sizeof *j->peer_lens);
        for (int i = 0; j->peers && j->peer_lens && i < g->size; i++) {
            size_t n = gc->addresses[i].len;
            if (!(j->peers[i] = malloc(n ? n : 1)))
                break;
            if (n) /* (an empty entry's data may be NULL) */
                memcpy(j->peers[i], gc->addresses[i].data, n);
            j->peer_lens[i] = n;
        }
        if (!j->peers || !j->peer_lens || !j->peers[g->size - 1]) {
            job_free(j);
            rc = tdd_err_set(&err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        }
    }
    if (!rc)
        rc = job_submit(r, g, j, &err);
    return rc ? tdd_answer_error(r, &err) : TDD_DISPATCH_BLOCK;
}
