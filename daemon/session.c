/* session.c -- sessions, handle tables and values. Loop thread only. */
#include "session.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pool.h"
#include "td_error_set.h"

tdd_session *tdd_sessions;
uint64_t tdd_nsessions;
static uint64_t next_session_id = 1;
static tdd_obj_free_fn free_fns[TD_HANDLE_GROUP + 1];
static uint64_t values_alive;

uint64_t tdd_values_alive(void)
{
    return values_alive;
}

/* Freed values kept for reuse (values live on the loop thread only): a pipelined op makes
 * one and its release frees one, and their malloc and free were a tenth of a tiny op's
 * time in the daemon. */
#define VALUE_CACHE 256
static tdd_value *value_cache[VALUE_CACHE];
static int value_cached;

tdd_value *tdd_value_new(tdd_device *dev)
{
    tdd_value *v;
    if (value_cached > 0) {
        v = value_cache[--value_cached];
        memset(v, 0, sizeof *v);
    } else if (!(v = calloc(1, sizeof *v))) {
        return NULL;
    }
    v->refs = 1;
    v->dev = dev;
    values_alive++;
    atomic_init(&v->poison, 0);
    return v;
}

void tdd_value_ref(tdd_value *v)
{
    v->refs++;
}

static tdd_session_hooks hooks;

void tdd_session_set_hooks(const tdd_session_hooks *h)
{
    hooks = *h;
}

static tdd_session_write_fn write_fn;

void tdd_session_on_write(tdd_session_write_fn fn)
{
    write_fn = fn;
}

void tdd_session_before_write(tdd_session *s, const tdd_storage *st)
{
    if (write_fn && s->resume)
        write_fn(s, st);
}

static tdd_session_close_fn close_fns[TDD_SESSION_CLOSE_FNS];
static int n_close_fns;

void tdd_session_on_close(tdd_session_close_fn fn)
{
    for (int i = 0; i < n_close_fns; i++)
        if (close_fns[i] == fn)
            return;
    if (n_close_fns < TDD_SESSION_CLOSE_FNS)
        close_fns[n_close_fns++] = fn;
}

void tdd_value_unref(tdd_value *v)
{
    if (!v || --v->refs > 0)
        return;
    if (v->grad_fn && hooks.value_free)
        hooks.value_free(v); /* drops its reference on the graph */
    tdd_storage_unref(v->t.st);
    values_alive--;
    if (value_cached < VALUE_CACHE)
        value_cache[value_cached++] = v;
    else
        free(v);
}

void tdd_value_poison(tdd_value *v, int code, uint64_t origin_req)
{
    v->poison_req = origin_req;
    atomic_store_explicit(&v->poison, code, memory_order_release);
}

int tdd_value_poisoned(const tdd_value *v)
{
    return atomic_load_explicit(&v->poison, memory_order_acquire);
}

void tdd_handle_set_free_fn(td_handle_kind kind, tdd_obj_free_fn fn)
{
    free_fns[kind] = fn;
}

/* ---------------------------------------------------------------- memory back */

/* Freed handles and sessions go back to the caching pools and glibc's free lists, where a
 * client that releases 10^5 handles would leave ~50 MB the daemon never uses again (the
 * pools keep small blocks until they sit idle, which a busy daemon never does, and the
 * heap's free pages stay mapped). So the loop keeps an estimate of the bookkeeping its
 * sessions hold (tdd_handle_cost per handle, SESSION_COST per session) and its peak since
 * the last trim: when the estimate has fallen --trim-released below that peak, every pool
 * is asked to release what it keeps and the heap its free pages (tdd_pool_trim_all: on
 * the pools' own threads, the loop never waits), TRIM_QUIET_MS after the last release of
 * the burst (each release until the next bind moves it on), so the burst's tail goes too.
 * A steady loop that binds as many handles as it releases never triggers it. Loop thread
 * only. */
#define SESSION_COST (16u << 10) /* a session and its connection's buffers, idle */
#define TRIM_QUIET_MS 100
static uint64_t held_est, held_peak;
static bool trim_armed; /* a trim is asked for; releases until the next bind move it on */

static void held_more(uint64_t n)
{
    held_est += n;
    trim_armed = false;
    if (held_est > held_peak)
        held_peak = held_est;
}

static void held_less(uint64_t n)
{
    held_est = held_est > n ? held_est - n : 0;
    if (tdd_cfg.trim_released && held_peak - held_est >= tdd_cfg.trim_released) {
        held_peak = held_est;
        trim_armed = true;
    }
    if (trim_armed)
        tdd_pool_trim_all(TRIM_QUIET_MS);
}

tdd_session *tdd_session_new(struct tdd_conn *conn)
{
    tdd_session *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->acct = calloc(1, sizeof *s->acct);
    if (!s->acct) {
        free(s);
        return NULL;
    }
    s->acct->refs = 1;
    s->acct->limit = tdd_cfg.session_memory;
    s->max_handles = tdd_cfg.max_handles;
    s->max_id_runs = tdd_cfg.max_id_runs;
    s->id = next_session_id++;
    s->refs = 1;
    s->conn = conn;
    s->grad_enabled = true;
    s->rng = 0x9E3779B97F4A7C15ull * s->id;
    s->next = tdd_sessions;
    if (tdd_sessions)
        tdd_sessions->prev = s;
    tdd_sessions = s;
    tdd_nsessions++;
    held_more(SESSION_COST);
    return s;
}

/* ---------------------------------------------------------------- ids ever bound */

typedef struct tdd_id_run {
    uint64_t lo, hi;
} tdd_id_run;

/* The first run with hi >= id (n_id_runs when none). */
static size_t run_at(const tdd_session *s, uint64_t id)
{
    size_t lo = 0, hi = s->n_id_runs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->id_runs[mid].hi < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Where id stands among the runs: bound before, next to a run, or alone. */
typedef enum { ID_BOUND, ID_JOINS_RUN, ID_ALONE } id_place;

static id_place id_where(const tdd_session *s, uint64_t id)
{
    size_t i = run_at(s, id);
    if (i < s->n_id_runs && s->id_runs[i].lo <= id)
        return ID_BOUND;
    if ((i < s->n_id_runs && s->id_runs[i].lo == id + 1) ||
        (i > 0 && s->id_runs[i - 1].hi + 1 == id))
        return ID_JOINS_RUN;
    return ID_ALONE;
}

/* Room for one more run, charged to the session's memory account. */
static int id_runs_grow(tdd_session *s, td_error *err)
{
    if (s->n_id_runs < s->cap_id_runs)
        return 0;
    if (s->n_id_runs >= s->max_id_runs)
        return tdd_err_resource(err, "handle id runs", 1, 0,
                                "this session's handle ids are scattered over %zu runs of "
                                "consecutive ids, the limit (--max-id-runs): count ids up instead",
                                s->n_id_runs);
    size_t cap = s->cap_id_runs ? 2 * s->cap_id_runs : 4;
    if (cap > s->max_id_runs)
        cap = (size_t)s->max_id_runs;
    uint64_t more = (cap - s->cap_id_runs) * sizeof(tdd_id_run);
    int rc = tdd_account_charge(s->acct, more, err);
    if (rc)
        return rc;
    tdd_id_run *r = realloc(s->id_runs, cap * sizeof *r);
    if (!r) {
        tdd_account_credit(s->acct, more);
        return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED, "out of host memory");
    }
    s->id_runs = r;
    s->cap_id_runs = cap;
    return 0;
}

/* Remembers a newly bound id (best effort: without room it is not remembered). */
static void id_remember(tdd_session *s, uint64_t id)
{
    if (id_where(s, id) == ID_BOUND)
        return; /* bound again by a graph's replay */
    size_t i = run_at(s, id), n = s->n_id_runs;
    tdd_id_run *r = s->id_runs;
    bool joins_prev = i > 0 && r[i - 1].hi + 1 == id;
    bool joins_next = i < n && r[i].lo == id + 1;
    if (joins_prev && joins_next) {
        r[i - 1].hi = r[i].hi;
        memmove(r + i, r + i + 1, (n - i - 1) * sizeof *r);
        s->n_id_runs--;
    } else if (joins_prev) {
        r[i - 1].hi = id;
    } else if (joins_next) {
        r[i].lo = id;
    } else if (!id_runs_grow(s, NULL)) {
        r = s->id_runs;
        memmove(r + i + 1, r + i, (n - i) * sizeof *r);
        r[i] = (tdd_id_run){id, id};
        s->n_id_runs++;
    }
}

static void id_runs_free(tdd_session *s)
{
    if (s->cap_id_runs)
        tdd_account_credit(s->acct, s->cap_id_runs * sizeof(tdd_id_run));
    free(s->id_runs);
    s->id_runs = NULL;
    s->n_id_runs = s->cap_id_runs = 0;
}

/* ---------------------------------------------------------------- handles */

static void free_obj(td_handle_kind kind, bool poisoned, void *obj)
{
    if (kind == TD_HANDLE_TENSOR || poisoned)
        tdd_value_unref(obj);
    else if (free_fns[kind])
        free_fns[kind](obj);
}

void tdd_session_close(tdd_session *s)
{
    for (int i = 0; i < n_close_fns; i++)
        close_fns[i](s);
    tdd_handle_table t = s->handles;
    s->handles = (tdd_handle_table){0}; /* freeing an object must not find the table half-gone */
    uint64_t charged = s->n_reserved;
    s->n_reserved = 0;
    for (size_t i = 0; i < t.cap; i++)
        if (t.slots[i].id) {
            charged += t.slots[i].charged;
            free_obj(t.slots[i].kind, t.slots[i].poisoned, t.slots[i].obj);
        }
    free(t.slots);
    /* a recording or replay in progress holds a reference on its graph */
    if (s->capture && free_fns[TD_HANDLE_GRAPH])
        free_fns[TD_HANDLE_GRAPH](s->capture);
    if (s->replaying && free_fns[TD_HANDLE_GRAPH])
        free_fns[TD_HANDLE_GRAPH](s->replaying);
    s->capture = s->replaying = NULL;
    tdd_account_credit(s->acct, charged * tdd_handle_cost());
    held_less(t.n * tdd_handle_cost() + SESSION_COST);
    s->nhandles = 0;
    id_runs_free(s);
    s->closed = true;
    s->conn = NULL;
    if (s->prev)
        s->prev->next = s->next;
    else
        tdd_sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    tdd_nsessions--;
    tdd_session_unref(s);
}

void tdd_session_ref(tdd_session *s)
{
    s->refs++;
}

void tdd_session_unref(tdd_session *s)
{
    if (--s->refs > 0)
        return;
    if (hooks.session_free)
        hooks.session_free(s);
    tdd_devices_session_end(s->id);
    tdd_account_unref(s->acct);
    free(s);
}

void tdd_session_fail(tdd_session *s, const td_error *err)
{
    if (!s->has_err) {
        s->err = *err;
        s->has_err = true;
    }
}

/* Ids come in runs of consecutive numbers (a pipelined client names a fresh
 * output per op and reads the previous ones), so a run of HANDLE_GROUP ids
 * shares one home block and sits in adjacent slots: the next id's probe and
 * its neighbours' lookups hit cache lines already loaded, where a hash of
 * the whole id put every fresh id on a cache miss (91% of the lookup's time
 * with 10^5 live handles). Blocks are placed by splitmix64's finaliser of
 * id / HANDLE_GROUP, so ids that are not consecutive spread as before. */
#define HANDLE_GROUP 16 /* a power of two; the table's minimum capacity is a multiple */
#define TABLE_MIN 64

static size_t slot_of(uint64_t id, size_t cap)
{
    uint64_t g = id / HANDLE_GROUP;
    g = (g ^ (g >> 30)) * 0xbf58476d1ce4e5b9ull;
    g = (g ^ (g >> 27)) * 0x94d049bb133111ebull;
    g ^= g >> 31;
    return (size_t)(g * HANDLE_GROUP + id % HANDLE_GROUP) & (cap - 1);
}

tdd_handle *tdd_handle_find(tdd_session *s, uint64_t id)
{
    tdd_handle_table *t = &s->handles;
    if (!t->cap || id == 0)
        return NULL;
    for (size_t i = slot_of(id, t->cap);; i = (i + 1) & (t->cap - 1)) {
        if (t->slots[i].id == id)
            return &t->slots[i];
        if (t->slots[i].id == 0)
            return NULL;
    }
}

/* Rehashes into cap slots (a power of two, over twice t->n). */
static int table_resize(tdd_handle_table *t, size_t cap)
{
    tdd_handle *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return TD_ERESOURCE_EXHAUSTED;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].id)
            continue;
        size_t j = slot_of(t->slots[i].id, cap);
        while (slots[j].id)
            j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* Inserts an entry whose id is absent; keeps the load under one half. */
static int table_put(tdd_handle_table *t, const tdd_handle *e)
{
    if (2 * (t->n + 1) > t->cap && table_resize(t, t->cap ? 2 * t->cap : TABLE_MIN))
        return TD_ERESOURCE_EXHAUSTED;
    size_t i = slot_of(e->id, t->cap);
    while (t->slots[i].id)
        i = (i + 1) & (t->cap - 1);
    t->slots[i] = *e;
    t->n++;
    return 0;
}

/* Removes the entry at h and closes the gap (backward shift: no tombstones). A table
 * left under an eighth full halves (to under a quarter: a client that binds and releases
 * around one size does not rehash back and forth), so a session that released most of its
 * handles gives their slots back. Entries move: no pointer into the table survives. */
static void table_remove(tdd_handle_table *t, tdd_handle *h)
{
    size_t mask = t->cap - 1, i = (size_t)(h - t->slots);
    for (size_t j = (i + 1) & mask; t->slots[j].id; j = (j + 1) & mask) {
        size_t home = slot_of(t->slots[j].id, t->cap);
        /* j's entry may move into the hole at i if its home is not in (i, j]. */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].id = 0;
    t->slots[i].poisoned = false;
    t->slots[i].obj = NULL;
    t->n--;
    if (t->cap > TABLE_MIN && 8 * t->n < t->cap)
        (void)table_resize(t, t->cap / 2); /* out of memory: it stays as large, still right */
}

int tdd_err_unknown_handle(td_error *err, uint64_t id)
{
    tdd_err_set(err, TD_EUNKNOWN_HANDLE, "handle %llu is not known to this session",
                (unsigned long long)id);
    if (err) {
        err->detail_kind = TD_DETAIL_HANDLE;
        err->detail.handle.handle = id;
    }
    return TD_EUNKNOWN_HANDLE;
}

static const char *kind_name(td_handle_kind k)
{
    switch (k) {
    case TD_HANDLE_TENSOR:
        return "tensor";
    case TD_HANDLE_GRADIENTS:
        return "gradients";
    case TD_HANDLE_OPTIMIZER:
        return "optimizer";
    case TD_HANDLE_GRAPH:
        return "graph";
    case TD_HANDLE_GROUP:
        return "group";
    case TD_HANDLE_NONE:
        break;
    }
    return "none";
}

/* UNKNOWN_HANDLE, saying whether the id was released or never bound. */
static int unknown_handle(const tdd_session *s, td_error *err, uint64_t id)
{
    int rc = tdd_err_unknown_handle(err, id);
    if (err && id_where(s, id) == ID_BOUND)
        snprintf(err->message, sizeof err->message,
                 "handle %llu was released earlier in this session", (unsigned long long)id);
    return rc;
}

int tdd_handle_get(tdd_session *s, uint64_t id, td_handle_kind kind, void **obj, td_error *err)
{
    tdd_handle *h = tdd_handle_find(s, id);
    if (!h)
        return unknown_handle(s, err, id);
    if (h->kind != kind) {
        tdd_err_set(err, TD_EWRONG_HANDLE_KIND, "handle %llu is a %s handle, expected a %s handle",
                    (unsigned long long)id, kind_name(h->kind), kind_name(kind));
        if (err) {
            err->detail_kind = TD_DETAIL_HANDLE_KIND;
            err->detail.handle_kind.handle = id;
            err->detail.handle_kind.expected = kind;
            err->detail.handle_kind.got = h->kind;
        }
        return TD_EWRONG_HANDLE_KIND;
    }
    if (h->poisoned)
        return tdd_err_poisoned(err, h->obj);
    *obj = h->obj;
    return 0;
}

int tdd_value_get(tdd_session *s, uint64_t id, tdd_value **v, td_error *err)
{
    return tdd_handle_get(s, id, TD_HANDLE_TENSOR, (void **)v, err);
}

/* ---------------------------------------------------------------- per-handle bookkeeping */

/* What glibc's malloc takes for a request of n bytes: an 8-byte header, 16-byte granules,
 * 32 bytes at least. */
static uint64_t malloc_chunk(size_t n)
{
    size_t c = (n + 8 + 15) & ~(size_t)15;
    return c < 32 ? 32 : c;
}

/* The smallest device allocation as the host pays for it: cpu's 64 bytes at 64-byte
 * alignment (posix_memalign: the chunk, its header and alignment slack). */
#define MIN_ALLOC_COST 128
/* The handle table stays under half full and doubles: 2 to 4 slots per live handle. */
#define SLOTS_PER_HANDLE 4

uint64_t tdd_handle_cost(void)
{
    /* The storage header is device.c's (a tdd_storage and its account pointer). */
    return malloc_chunk(sizeof(tdd_value)) + malloc_chunk(sizeof(tdd_storage) + sizeof(void *)) +
           MIN_ALLOC_COST + SLOTS_PER_HANDLE * sizeof(tdd_handle);
}

static size_t reserved_at(const tdd_session *s, uint64_t id)
{
    size_t i = 0;
    while (i < s->n_reserved && s->reserved[i] != id)
        i++;
    return i;
}

/* Drops reservation i (its charge stays with the caller: bound, or to be credited). */
static void reserved_drop(tdd_session *s, size_t i)
{
    s->reserved[i] = s->reserved[--s->n_reserved];
}

void tdd_handle_unreserve(tdd_session *s, uint64_t id)
{
    size_t i = reserved_at(s, id);
    if (i == s->n_reserved)
        return;
    reserved_drop(s, i);
    tdd_account_credit(s->acct, tdd_handle_cost());
}

/* Charges id's bookkeeping until it is bound (once per id). A request checks at most
 * TDD_MAX_OP_OUTPUTS ids and binds or gives back each; reservations left behind by a
 * request that failed between check and bind (out of memory) are given back when the
 * list fills, oldest first. */
static int reserve(tdd_session *s, uint64_t id, td_error *err)
{
    if (reserved_at(s, id) < s->n_reserved)
        return 0;
    int rc = tdd_account_charge(s->acct, tdd_handle_cost(), err);
    if (rc)
        return rc;
    size_t cap = sizeof s->reserved / sizeof s->reserved[0];
    if (s->n_reserved == cap) {
        memmove(s->reserved, s->reserved + 1, (cap - 1) * sizeof s->reserved[0]);
        s->n_reserved--;
        tdd_account_credit(s->acct, tdd_handle_cost());
    }
    s->reserved[s->n_reserved++] = id;
    return 0;
}

/* Whether id is one the request being replayed binds again. */
static bool rebinding(const tdd_session *s, uint64_t id)
{
    for (size_t i = 0; i < s->n_rebind; i++)
        if (s->rebind[i] == id)
            return true;
    return false;
}

int tdd_handle_check_new(tdd_session *s, uint64_t id, td_error *err)
{
    if (id == 0)
        return tdd_err_arg(err, "handle", "handle id 0 is reserved");
    bool live = tdd_handle_find(s, id) != NULL;
    id_place where = id_where(s, id);
    bool rebind = rebinding(s, id);
    /* A replayed request may bind again an id it also reads (graph.c): still bound
     * here, its old value is dropped when the new one is bound. */
    if ((live && !rebind) || (where == ID_BOUND && !rebind)) {
        tdd_err_set(err, TD_EHANDLE_IN_USE,
                    live ? "handle %llu is already in use"
                         : "handle %llu was bound and released earlier in this session: handle "
                           "ids are never reused within a session",
                    (unsigned long long)id);
        if (err) {
            err->detail_kind = TD_DETAIL_HANDLE;
            err->detail.handle.handle = id;
        }
        return TD_EHANDLE_IN_USE;
    }
    if (!live && s->nhandles >= s->max_handles)
        return tdd_err_resource(err, "handles", 1, 0, "session holds %llu handles, the limit",
                                (unsigned long long)s->nhandles);
    if (where == ID_ALONE) {
        int rc = id_runs_grow(s, err);
        if (rc)
            return rc;
    }
    return reserve(s, id, err);
}

/* Notes id as declined (see session.h): extends the newest run or starts one, forgetting
 * the oldest when the array is full. */
static void declined_note(tdd_session *s, uint64_t id)
{
    size_t n = s->n_declined;
    if (n && s->declined[n - 1][1] + 1 == id) {
        s->declined[n - 1][1] = id;
        return;
    }
    if (n == TDD_DECLINED_RUNS) {
        memmove(s->declined[0], s->declined[1], (n - 1) * sizeof s->declined[0]);
        n--;
    }
    s->declined[n][0] = s->declined[n][1] = id;
    s->n_declined = n + 1;
}

/* Whether id is a declined id; it no longer is after (a second Release says UNKNOWN_HANDLE,
 * except for an id inside a run, which is not split). */
static bool declined_take(tdd_session *s, uint64_t id)
{
    for (size_t i = 0; i < s->n_declined; i++) {
        uint64_t *r = s->declined[i];
        if (id < r[0] || id > r[1])
            continue;
        if (r[0] == r[1]) {
            memmove(s->declined[i], s->declined[i + 1],
                    (s->n_declined - i - 1) * sizeof s->declined[0]);
            s->n_declined--;
        } else if (id == r[0]) {
            r[0]++;
        } else if (id == r[1]) {
            r[1]--;
        }
        return true;
    }
    return false;
}

static void handle_put(tdd_session *s, uint64_t id, td_handle_kind kind, bool poisoned, void *obj)
{
    if (s->n_rebind && rebinding(s, id) && tdd_handle_find(s, id)) {
        td_error ignored; /* the previous replay's value, read by this request: dropped now */
        tdd_handle_release(s, id, &ignored);
    }
    /* The charge reserved when id was checked moves to the entry; without one (not
     * checked) it is charged now, and an entry the account cannot hold stays uncharged. */
    size_t r = reserved_at(s, id);
    bool charged = r < s->n_reserved;
    if (charged)
        reserved_drop(s, r);
    else
        charged = tdd_account_charge(s->acct, tdd_handle_cost(), NULL) == 0;
    tdd_handle h = {.id = id, .kind = kind, .charged = charged, .poisoned = poisoned, .obj = obj};
    if (table_put(&s->handles, &h)) {
        /* Cannot record it: drop the object; uses of the id say UNKNOWN_HANDLE. */
        if (charged)
            tdd_account_credit(s->acct, tdd_handle_cost());
        free_obj(kind, poisoned, obj);
        return;
    }
    if (kind == TD_HANDLE_TENSOR || poisoned)
        ((tdd_value *)obj)->handle = id;
    s->nhandles++;
    held_more(tdd_handle_cost());
    id_remember(s, id);
}

void tdd_handle_add(tdd_session *s, uint64_t id, td_handle_kind kind, void *obj)
{
    handle_put(s, id, kind, false, obj);
}

void tdd_handle_bind_failed(tdd_session *s, uint64_t id, td_handle_kind kind, const td_error *err)
{
    if (kind == TD_HANDLE_NONE)
        return;
    int rc = tdd_handle_check_new(s, id, NULL);
    if (rc == TD_ERESOURCE_EXHAUSTED)
        declined_note(s, id); /* no room: nothing bound; its Release is answered Ok */
    if (rc)
        return; /* not a new id (its own error says so), or no room */
    tdd_value *v = tdd_value_new(tdd_default_device());
    if (!v) {
        tdd_handle_unreserve(s, id);
        declined_note(s, id);
        return;
    }
    int code = err->code;
    uint64_t origin = err->request_id;
    if (code == TD_EPOISONED && err->detail_kind == TD_DETAIL_POISONED) {
        code = err->detail.poisoned.origin_code;
        origin = err->detail.poisoned.origin_request;
    }
    tdd_value_poison(v, code, origin);
    /* A tensor placeholder is a plain poisoned value (ops propagate its poison); the
     * other kinds are marked on the entry, and their lookups answer POISONED. */
    handle_put(s, id, kind, kind != TD_HANDLE_TENSOR, v);
}

int tdd_handle_release(tdd_session *s, uint64_t id, td_error *err)
{
    tdd_handle *h = tdd_handle_find(s, id);
    if (!h && declined_take(s, id))
        return 0; /* a failed request's id that had no room for a placeholder */
    if (!h)
        return unknown_handle(s, err, id);
    td_handle_kind kind = h->kind;
    bool poisoned = h->poisoned;
    void *obj = h->obj;
    if (h->charged)
        tdd_account_credit(s->acct, tdd_handle_cost());
    table_remove(&s->handles, h);
    s->nhandles--;
    free_obj(kind, poisoned, obj); /* last: freeing may release other handles' objects */
    held_less(tdd_handle_cost());
    return 0;
}

void tdd_handle_forget(tdd_session *s, uint64_t id)
{
    td_error ignored;
    if (!id || tdd_handle_release(s, id, &ignored))
        return;
    size_t i = run_at(s, id);
    if (i >= s->n_id_runs || s->id_runs[i].lo > id)
        return;
    tdd_id_run *r = &s->id_runs[i];
    if (r->lo == r->hi) {
        memmove(r, r + 1, (s->n_id_runs - i - 1) * sizeof *r);
        s->n_id_runs--;
    } else if (r->hi == id) {
        r->hi--;
    } else if (r->lo == id) {
        r->lo++;
    } else if (!id_runs_grow(s, NULL)) { /* split the run around id */
        r = &s->id_runs[i];
        memmove(r + 1, r, (s->n_id_runs - i) * sizeof *r);
        r[1].lo = id + 1;
        r[0].hi = id - 1;
        s->n_id_runs++;
    }
}

int tdd_err_poisoned(td_error *err, const tdd_value *v)
{
    int origin = tdd_value_poisoned(v);
    tdd_err_set(err, TD_EPOISONED, "handle %llu was produced by failed request %llu (%s)",
                (unsigned long long)v->handle, (unsigned long long)v->poison_req,
                td_err_name(origin));
    if (err) {
        err->detail_kind = TD_DETAIL_POISONED;
        err->detail.poisoned.handle = v->handle;
        err->detail.poisoned.origin_request = v->poison_req;
        err->detail.poisoned.origin_code = origin;
    }
    return TD_EPOISONED;
}

static void fill_device(td_device *out, const tdd_device *d)
{
    snprintf(out->backend, sizeof out->backend, "%s", d->be->name);
    out->ordinal = (uint32_t)d->ordinal;
}

int tdd_err_devices(td_error *err, int code, const tdd_device *target, const tdd_device *grad,
                    uint32_t ti, uint32_t gi, const char *fmt, ...)
{
    if (!err)
        return code;
    va_list ap;
    va_start(ap, fmt);
    td_error_vset(err, code, fmt, ap);
    va_end(ap);
    err->detail_kind = TD_DETAIL_DEVICES;
    fill_device(&err->detail.devices.target, target);
    fill_device(&err->detail.devices.grad, grad);
    err->detail.devices.target_index = ti;
    err->detail.devices.grad_index = gi;
    return code;
}
