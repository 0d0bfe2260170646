/* device.c -- backend registry, device table, storage allocation and accounting. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "exec.h"
#include "log.h"
#include "pool.h"

#define TDD_MAX_DEVICES 64

/* The backends this build serves, in listing order. */
static const tdd_backend *const backends[] = {&tdd_backend_cpu, &tdd_backend_ref, &tdd_backend_cuda,
                                              &tdd_backend_sim};
#define NBACKENDS (sizeof backends / sizeof backends[0])

static void *contexts[NBACKENDS];
static int counts[NBACKENDS];
static tdd_device devices[TDD_MAX_DEVICES];
static int ndevices;
static uint64_t global_in_use;

/* Storage plus who pays for it. */
typedef struct {
    tdd_storage st;
    tdd_account *acct;
    /* Memory the backend did not allocate (tdd_storage_adopt): given back through this. */
    tdd_storage_release release;
    void *release_arg;
} dstorage;

int tdd_devices_init(const tdd_config *cfg, char *note, size_t note_len)
{
    tdd_backend_config bc = {.cpu_devices = cfg->cpu_devices,
                             .threads = cfg->threads,
                             .sim_devices = cfg->sim_devices,
                             .emu_gpus = cfg->emu_gpus,
                             .emu_gpu_memory = cfg->emu_gpu_memory,
                             .emu_sms = cfg->emu_sms,
                             .shm_blocks = cfg->max_memfd_storage,
                             .cuda_streams = cfg->cuda_streams,
                             .cuda_tf32 = cfg->cuda_tf32 != 0};
    /* every device's caching allocator (pool.h) starts from these */
    tdd_pool_defaults = (tdd_pool_config){.cap = cfg->pool_cap,
                                          .limit = cfg->memory_cap,
                                          .trim_after_ms = cfg->pool_trim_s * 1000u,
                                          .trim_thread = true};
    note[0] = 0;
    for (size_t b = 0; b < NBACKENDS; b++) {
        char why[256] = "";
        int n = backends[b]->init(&bc, &contexts[b], why, sizeof why);
        if (n < 0) {
            tdd_warn("backend %s failed to start: %s %s", backends[b]->name, td_strerror(n), why);
            n = 0;
        }
        if (n == 0 && strcmp(backends[b]->name, "cuda") == 0) {
            tdd_info("cuda: no GPU available (%s); serving CPU backends only", why);
            snprintf(note, note_len, "no GPU available (%s): serving CPU backends only", why);
        }
        counts[b] = n;
        for (int o = 0; o < n && ndevices < TDD_MAX_DEVICES; o++) {
            tdd_device *d = &devices[ndevices];
            d->be = backends[b];
            d->ctx = contexts[b];
            d->ordinal = o;
            d->index = ndevices;
            snprintf(d->label, sizeof d->label, "%s:%d", d->be->name, o);
            d->be->device_name(d->ctx, o, d->name, sizeof d->name);
            /* Host-memory kernels (cpu, ref) are plain functions of their operands and
             * may overlap, as may sessions' streams (cuda: session_end); sim keeps one lane. */
            d->nlanes = d->be->host_memory || d->be->session_end ? cfg->device_lanes : 1;
            if (d->nlanes < 1 || d->nlanes > TDD_MAX_LANES)
                d->nlanes = 1;
            for (int l = 0; l < d->nlanes; l++) {
                char name[32];
                snprintf(name, sizeof name, "%s/%d", d->label, l);
                d->lanes[l] = tdd_lane_new(name, d->be->host_memory, cfg->worker_nice);
                if (!d->lanes[l])
                    return TD_ERESOURCE_EXHAUSTED;
            }
            tdd_info("device %s: %s", d->label, d->name);
            ndevices++;
        }
    }
    return 0;
}

tdd_queue *tdd_device_lane(const tdd_device *d, uint64_t session_id)
{
    return tdd_lane_queue(d->lanes[session_id % (uint64_t)d->nlanes], session_id);
}

void tdd_devices_session_end(uint64_t session_id)
{
    for (size_t b = 0; b < NBACKENDS; b++)
        if (backends[b]->session_end && contexts[b])
            backends[b]->session_end(contexts[b], session_id);
}

void tdd_devices_shutdown(void)
{
    for (int i = 0; i < ndevices; i++)
        for (int l = 0; l < devices[i].nlanes; l++)
            tdd_lane_free(devices[i].lanes[l]);
    for (size_t b = 0; b < NBACKENDS; b++)
        if (backends[b]->shutdown && contexts[b])
            backends[b]->shutdown(contexts[b]);
    ndevices = 0;
}

int tdd_device_count(void)
{
    return ndevices;
}

tdd_device *tdd_default_device(void)
{
    return tdd_device_get(0);
}

tdd_device *tdd_device_get(int i)
{
    return i >= 0 && i < ndevices ? &devices[i] : NULL;
}

tdd_device *tdd_device_find(const char *backend, uint32_t ordinal, int *backend_known)
{
    int known = 0;
    for (size_t b = 0; b < NBACKENDS; b++)
        if (strcmp(backends[b]->name, backend) == 0)
            known = 1;
    if (backend_known)
        *backend_known = known;
    for (int i = 0; i < ndevices; i++)
        if ((uint32_t)devices[i].ordinal == ordinal && strcmp(devices[i].be->name, backend) == 0)
            return &devices[i];
    return NULL;
}

static uint64_t memory_cap(void)
{
    static uint64_t cap;
    if (!cap) {
        cap = tdd_cfg.memory_cap;
        if (!cap) {
            long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
            cap = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : UINT64_MAX;
        }
    }
    return cap;
}

static int exhausted(td_error *err, const char *what, uint64_t requested, uint64_t available)
{
    return tdd_err_resource(err, what, requested, available,
                            "%s: %llu bytes requested, %llu available", what,
                            (unsigned long long)requested, (unsigned long long)available);
}

int tdd_account_charge(tdd_account *acct, uint64_t nbytes, td_error *err)
{
    uint64_t cap = memory_cap();
    if (nbytes > cap - global_in_use)
        return exhausted(err, "daemon memory", nbytes, cap - global_in_use);
    if (acct && acct->limit && nbytes > acct->limit - acct->in_use)
        return exhausted(err, "session memory", nbytes, acct->limit - acct->in_use);
    if (acct)
        acct->in_use += nbytes;
    global_in_use += nbytes;
    return 0;
}

void tdd_account_credit(tdd_account *acct, uint64_t nbytes)
{
    global_in_use -= nbytes;
    if (acct)
        acct->in_use -= nbytes;
}

/* A storage record charged to acct (NULL: the charge or the record failed, err set). */
static dstorage *dstorage_new(size_t nbytes, tdd_account *acct, td_error *err)
{
    if (tdd_account_charge(acct, nbytes, err))
        return NULL;
    dstorage *ds = calloc(1, sizeof *ds);
    if (!ds) {
        tdd_account_credit(acct, nbytes);
        exhausted(err, "host memory", nbytes, 0);
    }
    return ds;
}

/* ds holds data: it counts on dev, and keeps its account alive. */
static tdd_storage *dstorage_bind(dstorage *ds, tdd_device *dev, void *data, size_t nbytes,
                                  tdd_account *acct)
{
    atomic_init(&ds->st.refs, 1);
    ds->st.data = data;
    ds->st.nbytes = nbytes;
    ds->st.dev = dev;
    ds->acct = acct;
    if (acct)
        acct->refs++; /* storage may outlive its session (queued tasks, other holders) */
    dev->in_use += nbytes;
    if (dev->in_use > dev->peak)
        dev->peak = dev->in_use;
    return &ds->st;
}

tdd_storage *tdd_storage_alloc(tdd_device *dev, size_t nbytes, tdd_account *acct, uint64_t session,
                               td_error *err)
{
    dstorage *ds = dstorage_new(nbytes, acct, err);
    if (!ds)
        return NULL;
    void *data = NULL;
    if (acct && acct->shm_min && nbytes >= acct->shm_min && dev->be->alloc_shared)
        data = dev->be->alloc_shared(dev->ctx, dev->ordinal, nbytes);
    if (!data) {
        uint64_t was = tdd_backend_session; /* (an inline task may have set it) */
        tdd_backend_session = session;
        data = dev->be->alloc(dev->ctx, dev->ordinal, nbytes);
        tdd_backend_session = was;
    }
    if (!data) {
        free(ds);
        tdd_account_credit(acct, nbytes);
        if (dev->be->alloc_error) /* out of device memory, or a failed device */
            dev->be->alloc_error(dev->ctx, dev->ordinal, nbytes, err);
        else
            exhausted(err, dev->label, nbytes, 0);
        return NULL;
    }
    return dstorage_bind(ds, dev, data, nbytes, acct);
}

tdd_storage *tdd_storage_adopt(tdd_device *dev, void *data, size_t nbytes, tdd_account *acct,
                               tdd_storage_release release, void *arg, td_error *err)
{
    dstorage *ds = dstorage_new(nbytes, acct, err);
    if (!ds)
        return NULL;
    ds->release = release;
    ds->release_arg = arg;
    return dstorage_bind(ds, dev, data, nbytes, acct);
}

void *tdd_storage_adopted(const tdd_storage *st, tdd_storage_release release)
{
    const dstorage *ds = (const dstorage *)st;
    return st && ds->release == release ? ds->release_arg : NULL;
}

void tdd_storage_ref(tdd_storage *st)
{
    atomic_fetch_add(&st->refs, 1);
}

void tdd_storage_unref(tdd_storage *st)
{
    if (!st || atomic_fetch_sub(&st->refs, 1) != 1)
        return;
    dstorage *ds = (dstorage *)st;
    tdd_device *dev = st->dev;
    if (ds->release)
        ds->release(ds->release_arg);
    else
        dev->be->free(dev->ctx, dev->ordinal, st->data, st->nbytes);
    dev->in_use -= st->nbytes;
    tdd_account_credit(ds->acct, st->nbytes);
    tdd_account_unref(ds->acct);
    free(ds);
}

void tdd_account_unref(tdd_account *a)
{
    if (a && --a->refs == 0)
        free(a);
}

uint64_t tdd_memory_in_use(void)
{
    return global_in_use;
}
