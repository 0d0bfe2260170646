/* exec_op.c -- the one path work takes from a session to a device worker:
 * validate on the loop, allocate outputs, queue, run, complete on the loop. */
#include "exec_op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunk.h"
#include "log.h"
#include "stats.h"

/* What every session task carries: the session, the request it answers, and
 * the verdict of running it. */
typedef struct {
    tdd_task base;
    tdd_session *s;
    uint64_t req_id;
    bool want_reply;
    int rc;
    td_error err;
} session_task;

static void session_task_begin(session_task *t, tdd_session *s, uint64_t req_id, bool want_reply)
{
    t->s = s;
    t->req_id = req_id;
    t->want_reply = want_reply;
    tdd_session_ref(s);
    s->inflight++;
}

static tdd_task_done_fn task_done_hook;

void tdd_exec_op_set_done(tdd_task_done_fn fn)
{
    task_done_hook = fn;
}

/* The loop side of every completion: the requester's hook reports it (and wakes the
 * connection unless finishing inline: the connection is the caller, mid-request). */
static void session_task_finish_ex(session_task *t, tdd_value *reply_value, bool kick)
{
    tdd_session *s = t->s;
    s->inflight--;
    if (task_done_hook)
        task_done_hook(s, t->req_id, t->want_reply, t->rc, &t->err, reply_value, kick);
    tdd_session_unref(s);
}

static void session_task_finish(session_task *t, tdd_value *reply_value)
{
    session_task_finish_ex(t, reply_value, true);
}

/* Whether the producers of in[] on other queues have run (a lane runs a task once they
 * have: tdd_task.ready). */
static bool inputs_reached(const tdd_task *self, tdd_value *const *in, int n_in)
{
    for (int i = 0; i < n_in; i++)
        if (in[i]->fq && in[i]->fq != self->q && !tdd_queue_reached(in[i]->fq, in[i]->fseq))
            return false;
    return true;
}

/* Waits for producers on other queues, then reports the first poisoned input. */
static int inputs_ready(tdd_task *self, tdd_value *const *in, int n_in, td_error *err)
{
    for (int i = 0; i < n_in; i++)
        if (in[i]->fq && in[i]->fq != self->q)
            tdd_queue_wait(in[i]->fq, in[i]->fseq);
    for (int i = 0; i < n_in; i++)
        if (tdd_value_poisoned(in[i]))
            return tdd_err_poisoned(err, in[i]);
    return 0;
}

static void poison_outputs(tdd_value *const *out, int n_out, int rc, const td_error *err,
                           uint64_t req_id)
{
    for (int i = 0; i < n_out; i++) {
        if (rc == TD_EPOISONED)
            tdd_value_poison(out[i], err->detail.poisoned.origin_code,
                             err->detail.poisoned.origin_request);
        else
            tdd_value_poison(out[i], rc, req_id);
    }
}

/* ---------------------------------------------------------------- ops */

typedef struct {
    session_task st;
    tdd_device *dev;
    tdd_op op;
    tdd_opargs args;
    bool run_kernel;
    int n_in, n_out;
    uint64_t t0; /* submitted (uv_hrtime), for the op latency histogram */
    tdd_value *in[TDD_MAX_OP_INPUTS], *out[TDD_MAX_OP_OUTPUTS];
    /* the producers of the inputs it writes in place (their readiness now names this op) */
    struct {
        tdd_queue *q;
        uint64_t seq;
    } was[2];
    int n_was;
    /* a large kernel's pieces (chunk.h): the next starts at row (0: not begun) */
    tdd_chunk_plan plan;
    int64_t row;
} op_task;

static bool op_ready(tdd_task *t)
{
    op_task *ot = (op_task *)t;
    if (ot->row > 0)
        return true; /* a chunked kernel under way */
    for (int k = 0; k < ot->n_was; k++)
        if (ot->was[k].q && ot->was[k].q != t->q &&
            !tdd_queue_reached(ot->was[k].q, ot->was[k].seq))
            return false;
    return inputs_reached(t, ot->in, ot->n_in);
}

/* Runs the kernel; a large one on a host-memory device in pieces (chunk.h), handing the
 * lane to other sessions' work between two pieces (t->more) when some is waiting. The
 * pieces are the same whether or not anyone waits (their size is --chunk-elems, fixed by
 * the kernel's shape): waiting sessions decide only when the lane changes hands, never
 * what the kernel computes, so a session's bits do not depend on its neighbours. */
static int op_kernel(op_task *ot, tdd_task *t)
{
    tdd_opcall call = {.op = ot->op, .args = &ot->args, .n_in = ot->n_in, .n_out = ot->n_out};
    for (int i = 0; i < ot->n_in; i++)
        call.in[i] = &ot->in[i]->t;
    for (int i = 0; i < ot->n_out; i++)
        call.out[i] = &ot->out[i]->t;
    const tdd_device *dev = ot->dev;
    const tdd_backend *be = dev->be;
    if (ot->row == 0) {
        int rc = be->supports ? be->supports(dev->ctx, &call) : 0;
        if (rc || !be->host_memory ||
            !tdd_chunk_plan_make(&call, (int64_t)tdd_cfg.chunk_elems, strcmp(be->name, "ref") != 0,
                                 &ot->plan))
            return rc ? rc : be->execute(dev->ctx, dev->ordinal, &call);
    }
    for (;;) {
        tdd_chunk_piece pc;
        int64_t hi = tdd_chunk_piece_end(&ot->plan, ot->row);
        tdd_chunk_piece_make(&ot->plan, &call, ot->row, hi, &pc);
        int rc = be->execute(dev->ctx, dev->ordinal, &pc.call);
        ot->row = hi;
        if (rc || hi == ot->plan.len)
            return rc;
        if (tdd_task_contended(t)) {
            t->more = true;
            return 0;
        }
    }
}

static void op_run(tdd_task *t)
{
    op_task *ot = (op_task *)t;
    session_task *st = &ot->st;
    if (ot->row == 0) {
        for (int k = 0; k < ot->n_was; k++)
            if (ot->was[k].q && ot->was[k].q != t->q)
                tdd_queue_wait(ot->was[k].q, ot->was[k].seq);
        st->rc = inputs_ready(t, ot->in, ot->n_in, &st->err);
    }
    if (!st->rc && ot->run_kernel) {
        const tdd_backend *be = ot->dev->be;
        tdd_backend_session = st->s->id; /* the backend issues it as the session's work */
        int rc = op_kernel(ot, t);
        tdd_backend_session = 0;
        if (t->more)
            return;
        if (rc) {
            char why[192] = ""; /* what the device reported, e.g. the CUDA error's name */
            if (be->error_message)
                be->error_message(ot->dev->ctx, ot->dev->ordinal, rc, why, sizeof why);
            st->rc = tdd_err_set(&st->err, rc, "%s on %s: %s", tdd_opdefs[ot->op].name,
                                 ot->dev->label, why[0] ? why : td_strerror(rc));
        }
    }
    if (st->rc)
        poison_outputs(ot->out, ot->n_out, st->rc, &st->err, st->req_id);
}

/* Op tasks are over 1 KiB (the error and the validated arguments ride along):
 * from malloc each one was a large-bin request that first consolidated the
 * fast bins, on every small op. A few freed ones are kept for the next ops.
 * Loop thread only (tasks are made and released there). */
#define OP_TASK_CACHE 16
static op_task *op_task_cache[OP_TASK_CACHE];
static int op_task_cached;

static op_task *op_task_new(void)
{
    if (op_task_cached == 0)
        return calloc(1, sizeof(op_task));
    op_task *ot = op_task_cache[--op_task_cached];
    memset(ot, 0, sizeof *ot);
    return ot;
}

static void op_task_free(op_task *ot)
{
    if (op_task_cached < OP_TASK_CACHE)
        op_task_cache[op_task_cached++] = ot;
    else
        free(ot);
}

static void op_release(op_task *ot)
{
    for (int i = 0; i < ot->n_in; i++)
        tdd_value_unref(ot->in[i]);
    for (int i = 0; i < ot->n_out; i++)
        tdd_value_unref(ot->out[i]);
    op_task_free(ot);
}

static void op_done(tdd_task *t)
{
    op_task *ot = (op_task *)t;
    tdd_count_op(ot->op, ot->st.rc, uv_hrtime() - ot->t0);
    session_task_finish(&ot->st, ot->out[0]);
    op_release(ot);
}

/* Ops this small run on the loop thread when their device has nothing queued:
 * handing a few tens of microseconds of work to a worker costs two thread
 * wake-ups each way (a futex and the completion pipe), which is a small op's
 * whole budget and most of a small model's training step. Order is kept: the
 * session's lane is empty and every input is ready. The work is counted in
 * element passes (elements read and written); a linear-algebra op adds its
 * multiply-adds at 1/32 each, an NN op (conv, losses, norms) counts 16 per
 * element; more than --inline-work goes to the device's worker. */
#define INLINE_MAC_SHARE 32
#define INLINE_NN_WEIGHT 16

static bool can_run_inline(const op_task *ot)
{
    if (!ot->dev->be->host_memory || !tdd_cfg.inline_work)
        return false;
    int64_t work = 0, k = 1;
    for (int i = 0; i < ot->n_in; i++) {
        const tdd_tensor *t = &ot->in[i]->t;
        work += tdd_numel(t);
        if (t->ndim >= 1 && t->shape[t->ndim - 1] > k)
            k = t->shape[t->ndim - 1];
    }
    for (int i = 0; i < ot->n_out; i++)
        work += tdd_numel(&ot->out[i]->t);
    tdd_opkind kind = tdd_opdefs[ot->op].kind;
    if (kind == TDD_KIND_NN)
        work *= INLINE_NN_WEIGHT;
    else if (kind == TDD_KIND_LINALG) /* k: the largest last dimension, at least the inner one */
        work += tdd_numel(&ot->out[0]->t) / INLINE_MAC_SHARE * k;
    if (work > (int64_t)tdd_cfg.inline_work)
        return false;
    for (int i = 0; i < ot->n_in; i++)
        if (ot->in[i]->fq && !tdd_queue_reached(ot->in[i]->fq, ot->in[i]->fseq))
            return false;
    return tdd_queue_idle(tdd_device_lane(ot->dev, ot->st.s->id));
}

int tdd_check_same_device(tdd_value *const *in, int n_in, td_error *err)
{
    for (int i = 1; i < n_in; i++) {
        if (in[i]->dev == in[0]->dev)
            continue;
        bool same_backend = in[i]->dev->be == in[0]->dev->be;
        int code = same_backend ? TD_EDEVICE_MISMATCH : TD_EBACKEND_MISMATCH;
        return tdd_err_devices(err, code, in[0]->dev, in[i]->dev, 0, (uint32_t)i,
                               "input 0 is on %s but input %d is on %s", in[0]->dev->label, i,
                               in[i]->dev->label);
    }
    return 0;
}

int tdd_submit_op(tdd_session *s, uint64_t req_id, bool want_reply, tdd_op op, const tdd_opreq *req,
                  tdd_value *const *in, int n_in, tdd_device *dev, tdd_value **out, int *n_out,
                  tdd_opargs *args_out, td_error *err)
{
    return tdd_submit_op_named(s, req_id, want_reply, op, req, in, n_in, dev, NULL, out, n_out,
                               args_out, err);
}

int tdd_submit_op_named(tdd_session *s, uint64_t req_id, bool want_reply, tdd_op op,
                        const tdd_opreq *req, tdd_value *const *in, int n_in, tdd_device *dev,
                        const uint64_t *out_ids, tdd_value **out, int *n_out, tdd_opargs *args_out,
                        td_error *err)
{
    if (n_in > TDD_MAX_OP_INPUTS)
        return tdd_err_arg(err, "inputs", "at most %d inputs", TDD_MAX_OP_INPUTS);
    for (int i = 0; i < n_in; i++)
        if (tdd_value_poisoned(in[i]))
            return tdd_err_poisoned(err, in[i]);
    int rc = tdd_check_same_device(in, n_in, err);
    if (rc)
        return rc;
    if (n_in > 0)
        dev = in[0]->dev;
    if (!dev)
        return tdd_err_set(err, TD_EDEVICE_UNAVAILABLE, "no device to run on");

    op_task *ot = op_task_new();
    if (!ot)
        return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    const tdd_tensor *tin[TDD_MAX_OP_INPUTS];
    for (int i = 0; i < n_in; i++)
        tin[i] = &in[i]->t;
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    int nout = 0;
    rc = tdd_op_prepare(op, tin, n_in, req, tdd_cfg.max_numel, &ot->args, od, &nout, err);
    if (!rc && (nout < 1 || nout > TDD_MAX_OP_OUTPUTS))
        rc =
            tdd_err_set(err, TD_EINTERNAL, "op %s described %d outputs", tdd_opdefs[op].name, nout);
    if (!rc && *n_out && *n_out != nout)
        rc = tdd_err_arg(err, "outputs", "%s produces %d output(s), %d handle(s) given",
                         tdd_opdefs[op].name, nout, *n_out);
    if (rc) {
        op_task_free(ot);
        return rc;
    }
    ot->dev = dev;
    ot->op = op;
    ot->n_in = n_in;
    ot->n_out = nout;
    for (int i = 0; i < nout && !rc; i++) {
        tdd_value *v = tdd_value_new(dev);
        if (!v) {
            rc = tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
            break;
        }
        ot->out[i] = v;
        v->handle = out_ids ? out_ids[i] : 0;
        v->t.dtype = od[i].dtype;
        v->t.ndim = od[i].ndim;
        memcpy(v->t.shape, od[i].shape, sizeof v->t.shape);
        if (od[i].view) {
            const tdd_tensor *base = &in[od[i].view_of]->t;
            memcpy(v->t.strides, od[i].strides, sizeof v->t.strides);
            v->t.offset = od[i].offset;
            v->t.st = base->st;
            tdd_storage_ref(base->st);
        } else {
            ot->run_kernel = true;
            tdd_set_contiguous(&v->t);
            size_t nbytes = (size_t)tdd_shape_numel(v->t.shape, v->t.ndim, tdd_cfg.max_numel) *
                            td_dtype_size(v->t.dtype);
            v->t.st = tdd_storage_alloc(dev, nbytes, s->acct, s->id, err);
            if (!v->t.st)
                rc = TD_ERESOURCE_EXHAUSTED;
        }
    }
    if (rc) {
        for (int i = 0; i < nout; i++)
            tdd_value_unref(ot->out[i]);
        op_task_free(ot);
        return rc;
    }
    for (int i = 0; i < n_in; i++) {
        ot->in[i] = in[i];
        tdd_value_ref(in[i]);
    }
    tdd_queue *lane = tdd_device_lane(dev, s->id);
    uint64_t seq = tdd_queue_next_seq(lane);
    for (int i = 0; i < nout; i++) {
        ot->out[i]->fq = lane;
        ot->out[i]->fseq = seq;
        tdd_value_ref(ot->out[i]);
        out[i] = ot->out[i];
    }
    *n_out = nout;
    if (args_out)
        *args_out = ot->args;
    /* inputs the kernel writes (batch_norm's running stats): an in-place update, counted as
     * the optimizers' are (autodiff refuses a backward through what it saved before), and
     * their readers wait for this op */
    for (int i = 0; i < n_in; i++)
        if (ot->args.inplace_in & (1u << i)) {
            in[i]->t.st->version++;
            tdd_session_before_write(s, in[i]->t.st); /* a kept answer's bytes stay as sent */
        }
    session_task_begin(&ot->st, s, req_id, want_reply);
    ot->st.base.run = op_run;
    ot->st.base.done = op_done;
    ot->st.base.ready = op_ready;
    /* a host kernel: it waits on nothing that op_ready has not seen run */
    ot->st.base.quick = dev->be->host_memory;
    ot->t0 = uv_hrtime();
    if (can_run_inline(ot)) {
        for (int i = 0; i < nout; i++)
            ot->out[i]->fq = NULL; /* ready now */
        op_run(&ot->st.base);
        tdd_count_op(ot->op, ot->st.rc, uv_hrtime() - ot->t0);
        session_task_finish_ex(&ot->st, ot->out[0], false);
        op_release(ot);
        return 0;
    }
    for (int i = 0; i < n_in; i++)
        if ((ot->args.inplace_in & (1u << i)) && ot->n_was < 2) {
            ot->was[ot->n_was].q = in[i]->fq;
            ot->was[ot->n_was++].seq = in[i]->fseq;
            in[i]->fq = lane;
            in[i]->fseq = seq;
        }
    tdd_queue_submit(lane, &ot->st.base);
    return 0;
}

int tdd_submit_assign(tdd_session *s, uint64_t req_id, tdd_value *dst, tdd_value *src,
                      td_error *err)
{
    if (tdd_value_poisoned(src))
        return tdd_err_poisoned(err, src);
    if (tdd_value_poisoned(dst))
        return tdd_err_poisoned(err, dst);
    if (src->dev != dst->dev || src->t.dtype != dst->t.dtype || !tdd_same_shape(&src->t, &dst->t) ||
        !dst->t.st || !tdd_is_contiguous(&dst->t))
        return tdd_err_set(err, TD_EINTERNAL, "in-place copy into handle %llu: %s",
                           (unsigned long long)dst->handle,
                           src->dev != dst->dev          ? "another device"
                           : !dst->t.st                  ? "no storage"
                           : !tdd_is_contiguous(&dst->t) ? "not contiguous"
                                                         : "another dtype or shape");
    op_task *ot = op_task_new();
    if (!ot)
        return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    /* clone's kernel (every backend has it: a strided copy on the device) with the
     * destination's own tensor as the output. */
    const tdd_tensor *tin[1] = {&src->t};
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    int nout = 0;
    tdd_opreq oreq = {.dtype = TD_DTYPE_INVALID};
    int rc =
        tdd_op_prepare(TDD_OP_CLONE, tin, 1, &oreq, tdd_cfg.max_numel, &ot->args, od, &nout, err);
    if (rc) {
        op_task_free(ot);
        return rc;
    }
    tdd_device *dev = dst->dev;
    ot->dev = dev;
    ot->op = TDD_OP_CLONE;
    ot->run_kernel = true;
    ot->n_in = 1;
    ot->n_out = 1;
    ot->in[0] = src;
    tdd_value_ref(src);
    ot->out[0] = dst;
    tdd_value_ref(dst);
    tdd_queue *lane = tdd_device_lane(dev, s->id);
    dst->fq = lane;
    dst->fseq = tdd_queue_next_seq(lane);
    tdd_session_before_write(s, dst->t.st);
    session_task_begin(&ot->st, s, req_id, false);
    ot->st.base.run = op_run;
    ot->st.base.done = op_done;
    ot->st.base.ready = op_ready;
    ot->st.base.quick = dev->be->host_memory;
    ot->t0 = uv_hrtime();
    if (can_run_inline(ot)) {
        dst->fq = NULL; /* ready now */
        op_run(&ot->st.base);
        tdd_count_op(ot->op, ot->st.rc, uv_hrtime() - ot->t0);
        session_task_finish_ex(&ot->st, NULL, false);
        op_release(ot);
        return 0;
    }
    tdd_queue_submit(lane, &ot->st.base);
    return 0;
}

/* ---------------------------------------------------------------- copies */

typedef struct {
    session_task st;
    tdd_value *src, *dst;
} copy_task;

static void copy_run(tdd_task *t)
{
    copy_task *ct = (copy_task *)t;
    session_task *st = &ct->st;
    tdd_backend_session = st->s->id;
    st->rc = inputs_ready(t, &ct->src, 1, &st->err);
    if (!st->rc) {
        const tdd_tensor *s = &ct->src->t;
        tdd_tensor *d = &ct->dst->t;
        const tdd_device *sd = ct->src->dev, *dd = ct->dst->dev;
        size_t n = d->st->nbytes;
        int rc = 0;
        void *staging = NULL;
        if (sd->be->host_memory && dd->be->host_memory) {
            tdd_copy_contiguous(s, tdd_data(d));
        } else if (sd->be->host_memory) {
            staging = tdd_is_contiguous(s) ? NULL : malloc(n ? n : 1);
            if (staging)
                tdd_copy_contiguous(s, staging);
            rc = dd->be->from_host(dd->ctx, dd->ordinal, tdd_data(d),
                                   staging ? staging : tdd_data(s), n);
        } else if (!tdd_is_contiguous(s)) {
            rc = TD_EUNSUPPORTED_OP; /* device-side gather arrives with the cuda op set */
        } else if (dd->be->host_memory) {
            rc = sd->be->to_host(sd->ctx, sd->ordinal, tdd_data(d), tdd_data(s), n);
        } else {
            staging = malloc(n ? n : 1);
            rc = staging ? sd->be->to_host(sd->ctx, sd->ordinal, staging, tdd_data(s), n)
                         : TD_ERESOURCE_EXHAUSTED;
            if (!rc)
                rc = dd->be->from_host(dd->ctx, dd->ordinal, tdd_data(d), staging, n);
        }
        free(staging);
        if (rc)
            st->rc = tdd_err_set(&st->err, rc, "copy %s -> %s: %s", sd->label, dd->label,
                                 td_strerror(rc));
    }
    if (st->rc)
        poison_outputs(&ct->dst, 1, st->rc, &st->err, st->req_id);
    tdd_backend_session = 0;
}

static bool copy_ready(tdd_task *t)
{
    return inputs_reached(t, &((copy_task *)t)->src, 1);
}

static void copy_done(tdd_task *t)
{
    copy_task *ct = (copy_task *)t;
    session_task_finish(&ct->st, ct->dst);
    tdd_value_unref(ct->src);
    tdd_value_unref(ct->dst);
    free(ct);
}

tdd_value *tdd_value_alloc(tdd_session *s, tdd_device *dev, td_dtype dt, int ndim,
                           const int64_t *shape, td_error *err)
{
    tdd_value *v = tdd_value_new(dev);
    if (!v) {
        tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
        return NULL;
    }
    v->t.dtype = dt;
    v->t.ndim = ndim;
    memcpy(v->t.shape, shape, (size_t)ndim * sizeof shape[0]);
    tdd_set_contiguous(&v->t);
    size_t nbytes = (size_t)tdd_numel(&v->t) * td_dtype_size(dt);
    v->t.st = tdd_storage_alloc(dev, nbytes, s->acct, s->id, err);
    if (!v->t.st) {
        tdd_value_unref(v);
        return NULL;
    }
    return v;
}

int tdd_submit_copy(tdd_session *s, uint64_t req_id, tdd_value *src, tdd_device *dst,
                    tdd_value **out, td_error *err)
{
    if (tdd_value_poisoned(src))
        return tdd_err_poisoned(err, src);
    copy_task *ct = calloc(1, sizeof *ct);
    if (!ct)
        return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    tdd_value *v = tdd_value_alloc(s, dst, src->t.dtype, src->t.ndim, src->t.shape, err);
    if (!v) {
        free(ct);
        return err->code;
    }
    /* the session's lane on the source orders the read after its producer */
    tdd_queue *q = tdd_device_lane(src->dev, s->id);
    v->fq = q;
    v->fseq = tdd_queue_next_seq(q);
    ct->src = src;
    tdd_value_ref(src);
    ct->dst = v;
    tdd_value_ref(v);
    *out = v;
    session_task_begin(&ct->st, s, req_id, false);
    ct->st.base.run = copy_run;
    ct->st.base.done = copy_done;
    ct->st.base.ready = copy_ready;
    tdd_queue_submit(q, &ct->st.base);
    return 0;
}

/* ---------------------------------------------------------------- generic work */

typedef struct {
    session_task st;
    tdd_work_fn fn;
    tdd_work_done_fn done;
    void *arg;
} work_task;

static void work_run(tdd_task *t)
{
    work_task *wt = (work_task *)t;
    tdd_backend_session = wt->st.s->id;
    wt->st.rc = wt->fn(wt->arg);
    tdd_backend_session = 0;
    if (wt->st.rc)
        tdd_err_set(&wt->st.err, wt->st.rc, "%s", td_strerror(wt->st.rc));
}

static void work_done(tdd_task *t)
{
    work_task *wt = (work_task *)t;
    int rc = wt->st.rc;
    wt->st.rc = 0; /* the callback reports; the session records nothing by itself */
    wt->done(wt->arg, rc);
    session_task_finish(&wt->st, NULL);
    free(wt);
}

int tdd_submit_work(tdd_session *s, tdd_device *dev, tdd_work_fn fn, tdd_work_done_fn done,
                    void *arg)
{
    work_task *wt = calloc(1, sizeof *wt);
    if (!wt)
        return TD_ERESOURCE_EXHAUSTED;
    wt->fn = fn;
    wt->done = done;
    wt->arg = arg;
    tdd_session_before_write(s, NULL); /* what fn writes is not known here */
    session_task_begin(&wt->st, s, 0, false);
    wt->st.base.run = work_run;
    wt->st.base.done = work_done;
    tdd_queue_submit(tdd_device_lane(dev, s->id), &wt->st.base);
    return 0;
}

int tdd_submit_detached(tdd_session *s, tdd_work_fn fn, tdd_work_done_fn done, void *arg)
{
    work_task *wt = calloc(1, sizeof *wt);
    if (!wt)
        return TD_ERESOURCE_EXHAUSTED;
    wt->fn = fn;
    wt->done = done;
    wt->arg = arg;
    session_task_begin(&wt->st, s, 0, false);
    wt->st.base.run = work_run;
    wt->st.base.done = work_done;
    if (tdd_exec_detached(&wt->st.base, tdd_cfg.worker_nice)) {
        wt->st.s->inflight--;
        tdd_session_unref(wt->st.s);
        free(wt);
        return TD_ERESOURCE_EXHAUSTED;
    }
    return 0;
}
