/* query_req.c -- the questions a client asks: ListDevices, Stats, ListOps and Describe
 * (rows of dispatch.c's table). */
#include <stdlib.h>

#include "handlers.h"
#include "stats.h"
#include "wire.h"

typedef Tensordd__V1__Request Request;

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

/* ---------------------------------------------------------------- describe */

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
