/* multi.c -- one client over several daemons (td_multi_*): a session per daemon, device
 * names "ALIAS/cpu:0" or "ENDPOINT/cpu:0", tensors moved daemon to daemon. Built on the
 * public calls only (td_connect_tls, td_transfer_accept/send, td_to_device). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "td_error_set.h"
#include "tensordd.h"

struct td_multi_member {
    td_client *client;
    char *endpoint; /* where this client reaches the daemon */
    char *alias;    /* NULL: none */
    char *peer;     /* where the other daemons reach it */
};

struct td_multi {
    size_t n;
    struct td_multi_member *m;
    char *token; /* passed to each move's target */
};

static const td_device cpu0 = {.backend = "cpu", .ordinal = 0};

/* An INVALID_ARGUMENT naming the argument (detail TD_DETAIL_ARGUMENT). */
static int bad_arg(td_error *err, const char *argument, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int bad_arg(td_error *err, const char *argument, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    td_error_vset(err, TD_EINVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    if (err) {
        err->detail_kind = TD_DETAIL_ARGUMENT;
        snprintf(err->detail.argument.argument, sizeof err->detail.argument.argument, "%s",
                 argument);
    }
    return TD_EINVALID_ARGUMENT;
}

static char *dup_str(const char *s)
{
    size_t len = strlen(s) + 1;
    char *d = malloc(len);
    if (d)
        memcpy(d, s, len);
    return d;
}

static int is_host(const td_device *d)
{
    return strcmp(d->backend, "cpu") == 0 || strcmp(d->backend, "ref") == 0;
}

static const char *name_of(const struct td_multi_member *mm)
{
    return mm->alias ? mm->alias : mm->endpoint;
}

/* The member named by name[0..len) (an alias or an endpoint), or NULL. */
static struct td_multi_member *lookup(const td_multi *m, const char *name, size_t len)
{
    for (size_t i = 0; i < m->n; i++) {
        struct td_multi_member *mm = &m->m[i];
        if ((mm->alias && strlen(mm->alias) == len && memcmp(mm->alias, name, len) == 0) ||
            (strlen(mm->endpoint) == len && memcmp(mm->endpoint, name, len) == 0))
            return mm;
    }
    return NULL;
}

static struct td_multi_member *member_of(const td_multi *m, const td_client *c)
{
    for (size_t i = 0; m && c && i < m->n; i++)
        if (m->m[i].client == c)
            return &m->m[i];
    return NULL;
}

/* "a, b, tcp://...": every name the set answers to, for messages. */
static void list_names(const td_multi *m, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < m->n && len < cap; i++) {
        const char *names[2] = {m->m[i].alias, m->m[i].endpoint};
        for (int k = 0; k < 2 && len < cap; k++) {
            if (!names[k])
                continue;
            int w = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", names[k]);
            if (w < 0)
                return;
            len += (size_t)w;
        }
    }
}

static int unknown_daemon(const td_multi *m, const char *argument, const char *name, size_t len,
                          td_error *err)
{
    char names[160];
    list_names(m, names, sizeof names);
    return bad_arg(err, argument, "no daemon '%.*s' in this client (aliases and endpoints: %s)",
                   (int)(len > 64 ? 64 : len), name, names);
}

/* ---------------------------------------------------------------- open, close */

static void free_members(td_multi *m)
{
    for (size_t i = 0; i < m->n; i++) {
        td_close(m->m[i].client);
        free(m->m[i].endpoint);
        free(m->m[i].alias);
        free(m->m[i].peer);
    }
    free(m->m);
    free(m->token);
    free(m);
}

void td_multi_close(td_multi *m)
{
    if (m)
        free_members(m);
}

/* Aliases and endpoints: present, well formed, no two equal. */
static int check_names(const char *const *endpoints, const char *const *aliases, size_t n,
                       td_error *err)
{
    for (size_t i = 0; i < n; i++) {
        if (!endpoints[i] || !endpoints[i][0])
            return bad_arg(err, "endpoints", "endpoint %zu is missing or empty", i);
        const char *a = aliases ? aliases[i] : NULL;
        if (a && (!a[0] || strchr(a, '/') || strchr(a, ':')))
            return bad_arg(err, "aliases", "alias '%.64s' (of %.64s) is empty or holds '/' or ':'",
                           a, endpoints[i]);
    }
    for (size_t i = 0; i < n; i++) {
        const char *mine[2] = {endpoints[i], aliases ? aliases[i] : NULL};
        for (size_t j = 0; j <= i; j++) {
            const char *theirs[2] = {endpoints[j], aliases ? aliases[j] : NULL};
            for (int p = 0; p < 2; p++)
                for (int q = 0; q < 2; q++) {
                    if (j == i && q <= p)
                        continue; /* a name against itself */
                    if (mine[p] && theirs[q] && strcmp(mine[p], theirs[q]) == 0)
                        return bad_arg(err, "aliases", "'%.64s' names two daemons", mine[p]);
                }
        }
    }
    return 0;
}

int td_multi_connect(const char *const *endpoints, const char *const *aliases,
                     const char *const *peer_endpoints, size_t n, const td_connect_opts *opts,
                     const td_tls_opts *tls, td_multi **out, td_error *err)
{
    if (!out)
        return bad_arg(err, "out", "no output pointer");
    *out = NULL;
    if (!endpoints || n == 0)
        return bad_arg(err, "endpoints", "no endpoints");
    int rc = check_names(endpoints, aliases, n, err);
    if (rc)
        return rc;
    td_multi *m = calloc(1, sizeof *m);
    if (!m || !(m->m = calloc(n, sizeof *m->m)) ||
        !(m->token = dup_str(opts && opts->token ? opts->token : ""))) {
        if (m)
            free(m->m);
        free(m);
        return td_error_set(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
    }
    for (size_t i = 0; i < n; i++, m->n++) {
        struct td_multi_member *mm = &m->m[i];
        const char *alias = aliases ? aliases[i] : NULL;
        const char *peer = peer_endpoints && peer_endpoints[i] ? peer_endpoints[i] : endpoints[i];
        mm->endpoint = dup_str(endpoints[i]);
        mm->alias = alias ? dup_str(alias) : NULL;
        mm->peer = dup_str(peer);
        if (!mm->endpoint || (alias && !mm->alias) || !mm->peer) {
            m->n++; /* frees what this member holds */
            free_members(m);
            return td_error_set(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
        }
        int is_tls = strncmp(endpoints[i], "tls://", 6) == 0;
        td_error e;
        rc = td_connect_tls(endpoints[i], opts, is_tls ? tls : NULL, &mm->client, &e);
        if (rc) {
            m->n++;
            free_members(m);
            if (err) {
                *err = e;
                char msg[sizeof e.message];
                snprintf(msg, sizeof msg, "%s", e.message);
                snprintf(err->message, sizeof err->message, "%.96s: %.150s", endpoints[i], msg);
            }
            return rc;
        }
    }
    *out = m;
    return 0;
}

/* ---------------------------------------------------------------- names */

size_t td_multi_count(const td_multi *m)
{
    return m ? m->n : 0;
}

td_client *td_multi_at(const td_multi *m, size_t i)
{
    return m && i < m->n ? m->m[i].client : NULL;
}

int td_multi_client(const td_multi *m, const char *name, td_client **out, td_error *err)
{
    if (out)
        *out = NULL;
    if (!m || !name)
        return bad_arg(err, "name", "no client or no name");
    struct td_multi_member *mm = lookup(m, name, strlen(name));
    if (!mm)
        return unknown_daemon(m, "name", name, strlen(name), err);
    if (out)
        *out = mm->client;
    return 0;
}

const char *td_multi_name(const td_multi *m, const td_client *c)
{
    const struct td_multi_member *mm = member_of(m, c);
    return mm ? name_of(mm) : NULL;
}

static int resolve(const td_multi *m, const char *device_name, struct td_multi_member **mm,
                   td_device *dev, td_error *err)
{
    if (!m || !device_name)
        return bad_arg(err, "device", "no client or no device name");
    const char *slash = strrchr(device_name, '/');
    if (!slash || slash == device_name)
        return bad_arg(err, "device",
                       "device '%.96s' names no daemon: write ALIAS/DEVICE or ENDPOINT/DEVICE "
                       "(\"a/cpu:0\")",
                       device_name);
    size_t len = (size_t)(slash - device_name);
    *mm = lookup(m, device_name, len);
    if (!*mm)
        return unknown_daemon(m, "device", device_name, len, err);
    if (td_device_parse(slash + 1, dev) != 0)
        return bad_arg(err, "device",
                       "device '%.96s': '%.32s' is not a device (cpu:0, cuda:1, ref)", device_name,
                       slash + 1);
    return 0;
}

int td_multi_resolve(const td_multi *m, const char *device_name, td_client **client, td_device *dev,
                     td_error *err)
{
    struct td_multi_member *mm = NULL;
    td_device d;
    int rc = resolve(m, device_name, &mm, &d, err);
    if (client)
        *client = rc ? NULL : mm->client;
    if (dev && !rc)
        *dev = d;
    return rc;
}

int td_multi_check_same(const td_multi *m, const char *a, const char *b, td_error *err)
{
    struct td_multi_member *ma = NULL, *mb = NULL;
    td_device da, db;
    int rc = resolve(m, a, &ma, &da, err);
    if (!rc)
        rc = resolve(m, b, &mb, &db, err);
    if (rc)
        return rc;
    if (ma == mb && strcmp(da.backend, db.backend) == 0 && da.ordinal == db.ordinal)
        return 0;
    char sa[40], sb[40];
    td_device_format(&da, sa, sizeof sa);
    td_device_format(&db, sb, sizeof sb);
    td_error_set(
        err, TD_EDEVICE_MISMATCH, "%.96s/%s and %.96s/%s: %s", name_of(ma), sa, name_of(mb), sb,
        ma != mb ? "two daemons; move one with td_multi_move" : "two devices of one daemon");
    if (err) {
        err->detail_kind = TD_DETAIL_DEVICES;
        err->detail.devices.target = da;
        err->detail.devices.grad = db;
        err->detail.devices.target_index = 0;
        err->detail.devices.grad_index = 1;
    }
    return TD_EDEVICE_MISMATCH;
}

/* ---------------------------------------------------------------- moves */

int td_multi_move(td_multi *m, td_client *src, td_handle h, const char *to_device, td_handle *out,
                  td_error *err)
{
    if (out)
        *out = 0;
    struct td_multi_member *from = member_of(m, src), *to = NULL;
    if (!from)
        return bad_arg(err, "src", "the source session is not one of this client's");
    td_device dev;
    int rc = resolve(m, to_device, &to, &dev, err);
    if (rc)
        return rc;
    if (to == from)
        return td_to_device(src, h, &dev, out, err);

    td_tensor_info info;
    if ((rc = td_describe(src, h, &info, err)) != 0)
        return rc;
    td_handle sent = h, staged = 0, landed = 0;
    if (!is_host(&info.device)) { /* a push reads host memory */
        if ((rc = td_to_device(src, h, &cpu0, &staged, err)) != 0)
            return rc;
        sent = staged;
    }
    const td_device *land = is_host(&dev) ? &dev : &cpu0;
    uint8_t cap[TD_CAPABILITY_SIZE];
    rc = td_transfer_accept(to->client, land, info.dtype, info.ndim, info.shape, cap, &landed, err);
    if (rc == 0)
        rc = td_transfer_send(src, sent, to->peer, m->token, cap, err);
    if (staged) {
        td_error ignored;
        td_release(src, &staged, 1, &ignored);
    }
    if (rc)
        return rc;
    if (land == &dev) {
        if (out)
            *out = landed;
        return 0;
    }
    td_handle moved = 0;
    rc = td_to_device(to->client, landed, &dev, &moved, err);
    td_error ignored;
    td_release(to->client, &landed, 1, &ignored);
    if (rc == 0 && out)
        *out = moved;
    return rc;
}

int td_multi_sync(td_multi *m, td_error *err)
{
    if (!m)
        return bad_arg(err, "m", "no client");
    int first = 0;
    for (size_t i = 0; i < m->n; i++) {
        td_error e;
        int rc = td_sync(m->m[i].client, &e);
        if (rc && !first) {
            first = rc;
            if (err)
                *err = e;
        }
    }
    return first;
}
