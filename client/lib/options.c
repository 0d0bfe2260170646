/* options.c -- td_options: connect options by name, so that adding one changes no struct
 * a program was compiled with (td_connect_opts and td_tls_opts are frozen). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { OPT_STR, OPT_INT };

/* One row per option: its name, kind and where td_options keeps it. */
#define TD__OPTIONS(X)                                                                             \
    X(token, OPT_STR)                                                                              \
    X(token_file, OPT_STR)                                                                         \
    X(client_name, OPT_STR)                                                                        \
    X(ca_file, OPT_STR)                                                                            \
    X(cert_file, OPT_STR)                                                                          \
    X(key_file, OPT_STR)                                                                           \
    X(timeout_ms, OPT_INT)                                                                         \
    X(no_verify, OPT_INT)                                                                          \
    X(resume_window_s, OPT_INT)

enum {
#define TD__ENUM(name, kind) KEY_##name,
    TD__OPTIONS(TD__ENUM)
#undef TD__ENUM
        KEY_COUNT
};

static const struct {
    const char *name;
    int kind;
} keys[KEY_COUNT] = {
#define TD__ROW(name, kind) [KEY_##name] = {#name, kind},
    TD__OPTIONS(TD__ROW)
#undef TD__ROW
};

struct td_options {
    char *str[KEY_COUNT];
    int64_t num[KEY_COUNT];
};

td_options *td_options_new(void)
{
    return calloc(1, sizeof(td_options));
}

void td_options_free(td_options *o)
{
    if (!o)
        return;
    for (int k = 0; k < KEY_COUNT; k++)
        free(o->str[k]);
    free(o);
}

static int find(const char *name, int kind, td_error *err)
{
    for (int k = 0; k < KEY_COUNT; k++)
        if (name && strcmp(keys[k].name, name) == 0) {
            if (keys[k].kind != kind)
                return td__fail(err, TD_EINVALID_ARGUMENT, "connect option '%s' takes %s", name,
                                keys[k].kind == OPT_STR ? "a string (td_options_set)"
                                                        : "an integer (td_options_set_int)");
            return k;
        }
    return td__fail(err, TD_EINVALID_ARGUMENT,
                    "unknown connect option '%.64s' (this libtensordd is %s)", name ? name : "",
                    td_version_string());
}

int td_options_set(td_options *o, const char *name, const char *value, td_error *err)
{
    if (!o)
        return td__fail(err, TD_EINVALID_ARGUMENT, "no options");
    int k = find(name, OPT_STR, err);
    if (k < 0)
        return k;
    char *v = NULL;
    if (value && !(v = strdup(value)))
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
    free(o->str[k]);
    o->str[k] = v;
    return 0;
}

int td_options_set_int(td_options *o, const char *name, int64_t value, td_error *err)
{
    if (!o)
        return td__fail(err, TD_EINVALID_ARGUMENT, "no options");
    int k = find(name, OPT_INT, err);
    if (k < 0)
        return k;
    if (value < 0 || value > INT32_MAX)
        return td__fail(err, TD_EINVALID_ARGUMENT, "connect option '%s': %lld is out of range",
                        name, (long long)value);
    o->num[k] = value;
    return 0;
}

/* The token file's first line (as the daemon reads its own). */
static int read_token(const char *path, char *buf, size_t n, td_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return td__fail(err, TD_EINVALID_ARGUMENT, "cannot read token file %.200s", path);
    if (!fgets(buf, (int)n, f))
        buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\r\n")] = 0;
    if (!buf[0])
        return td__fail(err, TD_EINVALID_ARGUMENT,
                        "token file %.200s has no token on its first line", path);
    return 0;
}

int td_connect_with(const char *endpoint, const td_options *o, td_client **out, td_error *err)
{
    static const td_options none;
    if (!o)
        o = &none;
    char token[1024];
    td_connect_opts co = {.token = o->str[KEY_token],
                          .client_name = o->str[KEY_client_name],
                          .timeout_ms = (int)o->num[KEY_timeout_ms]};
    if (o->str[KEY_token_file]) {
        int rc = read_token(o->str[KEY_token_file], token, sizeof token, err);
        if (rc)
            return rc;
        co.token = token;
    }
    td_tls_opts tls = {.ca_file = o->str[KEY_ca_file],
                       .cert_file = o->str[KEY_cert_file],
                       .key_file = o->str[KEY_key_file],
                       .no_verify = (int)o->num[KEY_no_verify]};
    int any_tls = tls.ca_file || tls.cert_file || tls.key_file || tls.no_verify;
    return td_connect_resume(endpoint, &co, any_tls ? &tls : NULL,
                             (unsigned)o->num[KEY_resume_window_s], out, err);
}
