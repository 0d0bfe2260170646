/* test_ops_wire.c -- integration: every op of the conformance table, for each of its dtypes,
 * run by name through libtensordd on cpu:0 and on ref:0 of the shared daemon, the outputs
 * downloaded and compared within the conformance suite's tolerances (exact for ints/bools). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/test_conformance.h"
#include "dtype.h"
#include "itest.h"

/* Backend 0 is the oracle, as in the in-process conformance suite. */
static const char *const wire_devs[2] = {"ref:0", "cpu:0"};

/* Handles a run made (inputs, the views that give them their layout, outputs),
 * released together when the run ends so the daemon's memory stays flat. */
typedef struct {
    td_client *c;
    td_handle made[96];
    size_t nmade;
} wire_run;

static void keep(wire_run *w, td_handle h)
{
    if (h && w->nmade < sizeof w->made / sizeof w->made[0])
        w->made[w->nmade++] = h;
}

static void release_all(wire_run *w)
{
    td_error e;
    if (w->nmade)
        td_release(w->c, w->made, w->nmade, &e);
    w->nmade = 0;
}

/* Element strides of in's layout as the daemon will see it after put_input's views:
 * only view/reshape's "can this be a view" rule depends on them. */
static void meta_of(const conf_input *in, tdd_tensor *t)
{
    memset(t, 0, sizeof *t);
    t->dtype = in->dtype;
    t->ndim = in->ndim;
    memcpy(t->shape, in->shape, sizeof t->shape);
    tdd_set_contiguous(t);
    int nd = in->ndim;
    if (in->layout == 'T' && nd >= 2) { /* stored [.., n-1, n-2]: batch strides unchanged */
        t->strides[nd - 1] = in->shape[nd - 2];
        t->strides[nd - 2] = 1;
    } else if (in->layout == 'S' && nd >= 1) {
        for (int d = 0; d < nd; d++)
            t->strides[d] *= 2;
    } else if (in->layout == 'E' && nd >= 1) {
        t->strides[0] = 0;
    }
}

/* One attribute-only op on h (a view), kept for release; 0 on failure. */
static td_handle view_op(wire_run *w, const char *op, td_handle h, const td_attr *attrs,
                         size_t nattrs, td_error *e)
{
    td_op_opts o = {.attrs = attrs, .nattrs = nattrs};
    td_handle out = 0;
    if (td_op(w->c, op, &h, 1, &o, &out, 1, e) != 0)
        return 0;
    keep(w, out);
    return out;
}

/* The strided view reads back as the logical values: a permutation mistake here would
 * feed both backends the same wrong data and go unseen by the comparison. */
static bool layout_reads_back(wire_run *w, td_handle h, const conf_input *in, td_error *e)
{
    size_t esz = td_dtype_size(in->dtype), nbytes = (size_t)in->numel * esz;
    char *want = calloc((size_t)in->numel + 1, esz), *got = calloc((size_t)in->numel + 1, esz);
    ck_assert(want && got);
    for (int64_t i = 0; i < in->numel; i++) {
        if (in->ivals)
            tdd_store_i(want, in->dtype, i, in->ivals[i]);
        else
            tdd_store_f(want, in->dtype, i, in->vals[i]);
    }
    bool ok = td_download(w->c, h, got, nbytes, NULL, e) == 0;
    if (ok && memcmp(want, got, nbytes) != 0) {
        snprintf(e->message, sizeof e->message, "layout %c view does not read back as uploaded",
                 in->layout);
        e->code = TD_EINTERNAL;
        ok = false;
    }
    free(want);
    free(got);
    return ok;
}

/* Uploads input `in` to dev with its layout: T is uploaded with the last two dims
 * swapped and transposed in the daemon, S with the last dim doubled and sliced with
 * step 2, E as one row unsqueezed and expanded, so kernels get the same strided views
 * the in-process suite builds. Returns the handle, 0 on failure (e filled). */
static td_handle put_input(wire_run *w, const td_device *dev, const conf_input *in, td_error *e)
{
    int nd = in->ndim;
    char lay = in->layout;
    if ((lay == 'T' && nd < 2) || (lay != 'T' && lay != 'S' && lay != 'E') || nd < 1)
        lay = 0;
    int64_t sshape[TD_MAX_NDIM];
    memcpy(sshape, in->shape, sizeof sshape);
    int snd = nd;
    int64_t R = nd >= 2 ? in->shape[nd - 2] : 1, C = nd >= 1 ? in->shape[nd - 1] : 1;
    int64_t scount = in->numel;
    if (lay == 'T') {
        sshape[nd - 2] = C;
        sshape[nd - 1] = R;
    } else if (lay == 'S') {
        sshape[nd - 1] = 2 * C;
        scount = 2 * in->numel;
    } else if (lay == 'E') {
        snd = nd - 1;
        memmove(sshape, sshape + 1, (size_t)snd * sizeof *sshape);
        scount = in->shape[0] ? in->numel / in->shape[0] : 0;
    }
    size_t esz = td_dtype_size(in->dtype);
    void *buf = calloc((size_t)scount + 1, esz);
    ck_assert_ptr_nonnull(buf);
    int64_t lim = lay == 'E' ? scount : in->numel; /* E: row 0 is what every row shows */
    for (int64_t i = 0; i < lim; i++) {
        int64_t pos = i;
        if (lay == 'T') {
            int64_t b = i / (R * C), r = (i / C) % R, col = i % C;
            pos = b * R * C + col * R + r;
        } else if (lay == 'S') {
            pos = (i / C) * 2 * C + (i % C) * 2;
        }
        if (in->ivals)
            tdd_store_i(buf, in->dtype, pos, in->ivals[i]);
        else
            tdd_store_f(buf, in->dtype, pos, in->vals[i]);
    }
    td_handle h = 0;
    int rc = td_upload(w->c, dev, in->dtype, snd, sshape, buf, 0, &h, e);
    free(buf);
    if (rc)
        return 0;
    keep(w, h);
    if (lay == 'T') {
        td_attr a[2] = {td_attr_int("dim0", nd - 2), td_attr_int("dim1", nd - 1)};
        h = view_op(w, "transpose", h, a, 2, e);
    } else if (lay == 'S') {
        td_attr a[2] = {td_attr_int("dim", nd - 1), td_attr_int("step", 2)};
        h = view_op(w, "slice", h, a, 2, e);
    }
    if (h && (lay == 'T' || lay == 'S') && !layout_reads_back(w, h, in, e))
        return 0;
    else if (lay == 'E') {
        td_attr u = td_attr_int("dim", 0);
        td_attr x = td_attr_ints("shape", in->shape, (size_t)nd);
        h = view_op(w, "unsqueeze", h, &u, 1, e);
        if (h)
            h = view_op(w, "expand", h, &x, 1, e);
    }
    return h;
}

/* Random ops draw from the session's stream, one value per op, so cpu and ref never
 * get the same seed over the wire (the in-process suite compares them seed for seed);
 * here their outputs are held to what the distribution must satisfy instead. */
static bool is_random(const conf_case *cs, const conf_attrs *as)
{
    if (!strcmp(cs->op, "rand") || !strcmp(cs->op, "randn") || !strcmp(cs->op, "randint") ||
        !strcmp(cs->op, "multinomial"))
        return true;
    if (!strcmp(cs->op, "scaled_dot_product_attention")) {
        for (size_t k = 0; k < as->n; k++)
            if (!strcmp(as->a[k].name, "dropout_p"))
                return (as->a[k].kind == TD_ATTR_FLOAT ? as->a[k].f : (double)as->a[k].i) > 0;
        return false;
    }
    if (strcmp(cs->op, "dropout") != 0)
        return false;
    for (size_t k = 0; k < as->n; k++)
        if (!strcmp(as->a[k].name, "train") && !as->a[k].b)
            return false;
    return true;
}

static double attr_f(const conf_attrs *as, const char *name, double def)
{
    for (size_t k = 0; k < as->n; k++)
        if (!strcmp(as->a[k].name, name))
            return as->a[k].kind == TD_ATTR_FLOAT ? as->a[k].f : (double)as->a[k].i;
    return def;
}

/* The distribution checks of a random op's output t (one backend); 0 or a message. */
static int check_random(const conf_case *cs, const conf_attrs *as, const conf_input *in,
                        const tdd_tensor *t, double tol, char *msg, size_t len)
{
    int64_t n = tdd_numel(t);
    const void *d = t->st->data;
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = tdd_load_f(d, t->dtype, i);
        sum += v;
        sq += v * v;
    }
    double mean = n ? sum / (double)n : 0, var = n ? sq / (double)n - mean * mean : 0;
    if (!strcmp(cs->op, "rand")) {
        for (int64_t i = 0; i < n; i++) {
            double v = tdd_load_f(d, t->dtype, i);
            if (!(v >= 0 && v <= 1)) /* a half dtype may round up to 1 */
                return snprintf(msg, len, "element %lld = %g outside [0, 1]", (long long)i, v);
        }
        /* 6 standard errors of U(0,1)'s mean */
        if (fabs(mean - 0.5) > 6 * sqrt(1.0 / 12 / (double)n))
            return snprintf(msg, len, "mean %g of %lld uniforms", mean, (long long)n);
    } else if (!strcmp(cs->op, "randn")) {
        if (fabs(mean) > 6 / sqrt((double)n) || var < 0.3 || var > 3)
            return snprintf(msg, len, "mean %g, variance %g of %lld normals", mean, var,
                            (long long)n);
    } else if (!strcmp(cs->op, "randint")) {
        int64_t lo = (int64_t)attr_f(as, "low", 0), hi = (int64_t)attr_f(as, "high", 0);
        int64_t first = n ? tdd_load_i(d, t->dtype, 0) : 0;
        bool varied = false;
        for (int64_t i = 0; i < n; i++) {
            int64_t v = tdd_load_i(d, t->dtype, i);
            if (v < lo || v >= hi)
                return snprintf(msg, len, "element %lld = %lld outside [%lld, %lld)", (long long)i,
                                (long long)v, (long long)lo, (long long)hi);
            varied |= v != first;
        }
        if (n > 8 && !varied)
            return snprintf(msg, len, "all %lld values equal %lld", (long long)n, (long long)first);
    } else if (!strcmp(cs->op, "multinomial")) {
        /* each draw a category of its row; without replacement, no category twice */
        int64_t ncat = in->shape[in->ndim - 1], rows = in->ndim == 2 ? in->shape[0] : 1;
        int64_t k = rows ? n / rows : 0;
        bool repl = false;
        for (size_t a = 0; a < as->n; a++)
            if (!strcmp(as->a[a].name, "replacement"))
                repl = as->a[a].b;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < k; i++) {
                int64_t v = tdd_load_i(d, t->dtype, r * k + i);
                if (v < 0 || v >= ncat)
                    return snprintf(msg, len, "row %lld draw %lld = %lld outside [0, %lld)",
                                    (long long)r, (long long)i, (long long)v, (long long)ncat);
                if (in->vals[r * ncat + v] == 0)
                    return snprintf(msg, len, "row %lld drew category %lld of weight 0",
                                    (long long)r, (long long)v);
                for (int64_t j = 0; !repl && j < i; j++)
                    if (tdd_load_i(d, t->dtype, r * k + j) == v)
                        return snprintf(msg, len, "row %lld drew %lld twice without replacement",
                                        (long long)r, (long long)v);
            }
    } else if (!strcmp(cs->op, "scaled_dot_product_attention")) {
        /* out = (softmax(q k^T s) * keep / (1 - p)) v: the kept weights of a row sum to at
         * most 1 / (1 - p), so |out| <= max |v| / (1 - p) */
        const conf_input *v = &in[2];
        double p = attr_f(as, "dropout_p", 0), vmax = 0, rtol, atol;
        conf_tolerances(t->dtype, tol, &rtol, &atol);
        for (int64_t i = 0; i < v->numel; i++)
            vmax = fmax(vmax, fabs(v->vals[i]));
        double bound = vmax / (1 - p);
        for (int64_t i = 0; i < n; i++) {
            double o = tdd_load_f(d, t->dtype, i);
            if (!isfinite(o) || fabs(o) > bound + atol + rtol * bound)
                return snprintf(msg, len, "element %lld = %.9g beyond max|v|/(1-p) = %.9g",
                                (long long)i, o, bound);
        }
    } else { /* dropout in training: each element 0 or x / (1 - p) */
        double p = attr_f(as, "p", 0.5), rtol, atol;
        conf_tolerances(t->dtype, tol, &rtol, &atol);
        int64_t zeros = 0;
        for (int64_t i = 0; i < n; i++) {
            double v = tdd_load_f(d, t->dtype, i), x = in->vals[i] / (1 - p);
            if (v == 0) {
                zeros++;
                continue;
            }
            if (fabs(v - x) > atol + rtol * fabs(x))
                return snprintf(msg, len, "element %lld = %.9g, neither 0 nor x/(1-p) = %.9g",
                                (long long)i, v, x);
        }
        /* 6 standard deviations of the binomial count of dropped elements */
        double sd = sqrt((double)n * p * (1 - p));
        if (fabs((double)zeros - (double)n * p) > 6 * sd + 1)
            return snprintf(msg, len, "%lld of %lld dropped at p = %g", (long long)zeros,
                            (long long)n, p);
    }
    return 0;
}

static void describe_inputs(const conf_case *cs, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = 0;
    for (int k = 0; k < 4 && cs->inputs[k] && o < len; k++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", k ? " " : "", cs->inputs[k]);
}

/* Runs case cs for dtype dt and layout variant (0: as written; 1: every input of
 * ndim >= 2 transposed, 1-D strided) on both devices and compares; true when it matches.
 * Every failure is described on stderr with the op, dtype, inputs and first mismatch. */
static bool run_case(td_client *c, const conf_case *cs, td_dtype dt, int variant)
{
    const tdd_opdef *def = tdd_op_find(cs->op);
    ck_assert_ptr_nonnull(def);
    wire_run w = {.c = c};
    conf_input in[4];
    int n_in = conf_inputs(cs, dt, variant, in);
    conf_attrs as;
    conf_parse_attrs(cs->attrs, &as);
    bool creation = def->kind == TDD_KIND_CREATE;
    char what[256] = "", ins[128];
    bool ok = false;
    void *host[2][TDD_MAX_OP_OUTPUTS];
    memset(host, 0, sizeof host);

    /* The op table's own shape rule says how many outputs to ask for and what they
     * must look like; the daemon's answers are held to it. */
    tdd_tensor meta[4];
    const tdd_tensor *mp[4];
    for (int k = 0; k < n_in; k++) {
        meta_of(&in[k], &meta[k]);
        mp[k] = &meta[k];
    }
    tdd_opreq req = {.attrs = {as.a, as.n}, .dtype = creation ? dt : TD_DTYPE_INVALID};
    tdd_opargs args;
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    int n_out = 0;
    td_error e;
    int rc = tdd_op_prepare(def->op, mp, n_in, &req, (int64_t)1 << 40, &args, od, &n_out, &e);
    if (rc) {
        snprintf(what, sizeof what, "the op table rejects the case: %s: %.180s", td_err_name(rc),
                 e.message);
        goto out;
    }

    td_handle outs[2][TDD_MAX_OP_OUTPUTS];
    for (int b = 0; b < 2; b++) {
        td_device dev = it_dev(wire_devs[b]);
        td_handle hin[4] = {0};
        for (int k = 0; k < n_in; k++)
            if (!(hin[k] = put_input(&w, &dev, &in[k], &e))) {
                snprintf(what, sizeof what, "%s: input %d: %s: %.180s", wire_devs[b], k,
                         td_err_name(e.code), e.message);
                goto out;
            }
        td_op_opts o = {.device = creation ? &dev : NULL,
                        .dtype = creation ? dt : TD_DTYPE_INVALID,
                        .attrs = as.a,
                        .nattrs = as.n,
                        .want_reply = 1};
        rc = td_op(c, cs->op, hin, (size_t)n_in, &o, outs[b], (size_t)n_out, &e);
        if (rc) {
            snprintf(what, sizeof what, "%s: op: %s: %.200s", wire_devs[b], td_err_name(rc),
                     e.message);
            goto out;
        }
        for (int k = 0; k < n_out; k++)
            keep(&w, outs[b][k]);
        for (int k = 0; k < n_out; k++) {
            td_tensor_info info;
            int64_t numel = 1;
            for (int d = 0; d < od[k].ndim; d++)
                numel *= od[k].shape[d];
            size_t nbytes = (size_t)numel * td_dtype_size(od[k].dtype);
            host[b][k] = malloc(nbytes + 1);
            ck_assert_ptr_nonnull(host[b][k]);
            rc = td_download(c, outs[b][k], host[b][k], nbytes, &info, &e);
            if (rc) {
                snprintf(what, sizeof what, "%s: download of output %d: %s: %.180s", wire_devs[b],
                         k, td_err_name(rc), e.message);
                goto out;
            }
            bool same = info.dtype == od[k].dtype && info.ndim == od[k].ndim &&
                        !memcmp(info.shape, od[k].shape, (size_t)od[k].ndim * sizeof(int64_t)) &&
                        !strcmp(info.device.backend, dev.backend);
            if (!same) {
                snprintf(what, sizeof what,
                         "%s: output %d is %s %dd on %s; the op table says %s %dd", wire_devs[b], k,
                         td_dtype_name(info.dtype), info.ndim, info.device.backend,
                         td_dtype_name(od[k].dtype), od[k].ndim);
                goto out;
            }
        }
    }

    /* Compare output by output, ref first, as conf_run does in-process. */
    bool random = is_random(cs, &as);
    for (int k = 0; k < n_out; k++) {
        tdd_storage st[2];
        tdd_tensor t[2];
        for (int b = 0; b < 2; b++) {
            memset(&st[b], 0, sizeof st[b]);
            st[b].data = host[b][k];
            memset(&t[b], 0, sizeof t[b]);
            t[b].dtype = od[k].dtype;
            t[b].ndim = od[k].ndim;
            memcpy(t[b].shape, od[k].shape, sizeof t[b].shape);
            tdd_set_contiguous(&t[b]);
            t[b].st = &st[b];
        }
        char m[200] = "";
        if (random) {
            for (int b = 0; b < 2; b++)
                if (check_random(cs, &as, &in[0], &t[b], cs->tol, m, sizeof m)) {
                    snprintf(what, sizeof what, "%s: output %d: %s", wire_devs[b], k, m);
                    goto out;
                }
            continue;
        }
        double worst = 0;
        int64_t bad = conf_compare(&t[0], &t[1], cs->tol, &worst, m, sizeof m);
        if (bad) {
            snprintf(what, sizeof what, "output %d: %lld of %lld differ; first %s", k,
                     (long long)bad, (long long)tdd_numel(&t[0]), m);
            goto out;
        }
    }
    ok = true;
out:
    if (!ok) {
        describe_inputs(cs, ins, sizeof ins);
        fprintf(stderr, "ops-wire: FAIL %s [%s] %s variant %d inputs {%s}: %s\n", cs->op, cs->attrs,
                creation && dt == TD_DTYPE_INVALID ? "(default dtype)" : td_dtype_name(dt), variant,
                ins, what);
        td_sync(c, &e); /* take the session's pending error so the next run starts clean */
    }
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < TDD_MAX_OP_OUTPUTS; k++)
            free(host[b][k]);
    release_all(&w);
    conf_inputs_free(in, n_in);
    return ok;
}

/* One test per op of backends/ops.h: every case of the table naming it, each dtype.
 * An op without a case fails here, so a new op cannot skip the wire. */
START_TEST(test_op_over_wire)
{
    const tdd_opdef *def = &tdd_opdefs[_i];
    td_client *c = it_client("ops-wire");
    int ncases = 0, runs = 0, failed = 0;
    char passed[16] = "";
    size_t np = 0;
    for (int i = 0; i < conf_ncases; i++) {
        const conf_case *cs = &conf_cases[i];
        if (strcmp(cs->op, def->name) != 0)
            continue;
        ncases++;
        const char *dts = cs->dtypes[0] ? cs->dtypes : "-"; /* "-": the op's default */
        for (const char *l = dts; *l; l++) {
            td_dtype dt = *l == '-' ? TD_DTYPE_INVALID : conf_dtype_of(*l);
            int bad = 0;
            for (int variant = 0; variant < 2; variant++, runs++)
                bad += !run_case(c, cs, dt, variant);
            failed += bad;
            if (!bad && !strchr(passed, *l) && np + 1 < sizeof passed)
                passed[np++] = *l;
        }
    }
    td_close(c);
    ck_assert_msg(ncases > 0, "op %s has no case in tests/unit/test_conformance_cases.c",
                  def->name);
    if (getenv("OPS_WIRE_VERBOSE"))
        printf("ops-wire: %-34s %2d cases, %3d runs, %d failed; dtypes passing: %s\n", def->name,
               ncases, runs, failed, passed);
    ck_assert_msg(failed == 0,
                  "%s: %d of %d case x dtype x layout runs over the wire differ (see stderr)",
                  def->name, failed, runs);
}
END_TEST

/* A case naming an op the table lacks would otherwise never run. */
START_TEST(test_every_case_names_an_op)
{
    for (int i = 0; i < conf_ncases; i++)
        ck_assert_msg(tdd_op_find(conf_cases[i].op) != NULL,
                      "conformance case %d names unknown op '%s'", i, conf_cases[i].op);
}
END_TEST

Suite *it_ops_wire_suite(void)
{
    Suite *s = suite_create("ops-wire");
    TCase *tc = tcase_create("cpu vs ref");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_every_case_names_an_op);
    tcase_add_loop_test(tc, test_op_over_wire, 0, TDD_OP_COUNT);
    suite_add_tcase(s, tc);
    return s;
}
