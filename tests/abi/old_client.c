/* old_client.c -- a program built against libtensordd 0.9.0's headers (tests/abi/include-0.9.0,
 * saved as they were before connect options became extensible): td_connect_opts, td_stats
 * and td_error_set (then declared) as it used them. Linked against today's library it must
 * still run a session (tests/python/client/test_c_abi.py). */
#include <stdio.h>
#include <string.h>

#include "tensordd.h"

int main(int argc, char **argv)
{
    td_connect_opts o = {
        .token = argc > 2 ? argv[2] : NULL, .client_name = "old-client", .timeout_ms = 10000};
    td_client *c;
    td_error err;
    if (td_connect(argv[1], &o, &c, &err)) {
        fprintf(stderr, "connect: %s\n", err.message);
        return 1;
    }
    float x[4] = {1, 2, 3, 4}, out = 0;
    int64_t shape[1] = {4};
    td_handle h, s;
    td_op_opts oo = {0};
    if (td_upload(c, NULL, TD_F32, 1, shape, x, 0, &h, &err) ||
        td_op(c, "sum", &h, 1, &oo, &s, 1, &err) ||
        td_download(c, s, &out, sizeof out, NULL, &err)) {
        fprintf(stderr, "session: %s\n", err.message);
        return 1;
    }
    static td_stats st;
    if (td_stats_get(c, &st, &err) || st.nsessions < 1) {
        fprintf(stderr, "stats: %s\n", err.message);
        return 1;
    }
    td_error mine;
    if (td_error_set(&mine, TD_EINVALID_ARGUMENT, "built by %s", "an old program") !=
            TD_EINVALID_ARGUMENT ||
        strcmp(mine.message, "built by an old program")) {
        fprintf(stderr, "td_error_set\n");
        return 1;
    }
    printf("old client: sum %g, library %s\n", out, td_version_string());
    td_close(c);
    return out == 10.0f ? 0 : 1;
}
