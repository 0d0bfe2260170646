/* new_client.c -- today's extensible C interface: connect options by name (a token read
 * from a file), every session through td_stats_sessions (also with the smaller record of
 * an older header), string and float-list attributes (tests/python/client/test_c_abi.py). */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "tensordd.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            fprintf(stderr, "%s: %s\n", #call, err.message);                                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    td_error err;
    td_options *o = td_options_new();
    if (!o)
        return 1;
    if (td_options_set(o, "no_such_option", "x", &err) != TD_EINVALID_ARGUMENT ||
        !strstr(err.message, "no_such_option"))
        return fprintf(stderr, "an unknown option was taken\n"), 1;
    if (td_options_set_int(o, "token_file", 3, &err) != TD_EINVALID_ARGUMENT)
        return fprintf(stderr, "a string option took an integer\n"), 1;
    CHECK(td_options_set(o, "token_file", argv[2], &err));
    CHECK(td_options_set(o, "client_name", "new-client", &err));
    CHECK(td_options_set_int(o, "timeout_ms", 10000, &err));
    td_client *c;
    CHECK(td_connect_with(argv[1], o, &c, &err));
    td_options_free(o);

    size_t n = 0;
    td_session_info all[8];
    CHECK(td_stats_sessions(c, all, 8, sizeof all[0], &n, &err));
    int found = 0;
    for (size_t i = 0; i < n && i < 8; i++)
        found |= strcmp(all[i].client_name, "new-client") == 0 && all[i].memory_limit == 1u << 30;
    if (!found)
        return fprintf(stderr, "td_stats_sessions: no new-client with its 1G quota\n"), 1;
    /* a caller compiled when the record ended before memory_limit: nothing written past it */
    unsigned char small[2][offsetof(td_session_info, memory_limit) + 8];
    memset(small, 0xAB, sizeof small);
    size_t old = offsetof(td_session_info, memory_limit);
    CHECK(td_stats_sessions(c, (td_session_info *)(void *)small, 1, old, &n, &err));
    if (small[0][old] != 0xAB || small[1][0] != 0xAB)
        return fprintf(stderr, "td_stats_sessions wrote past the caller's entry\n"), 1;

    /* attributes: a string (mse_loss's reduction) and a float list (interpolate's
     * scale_factor) */
    float x[4] = {1, 2, 3, 4}, y[4] = {1, 1, 1, 1}, out[8];
    int64_t shape[2] = {2, 2}, shape3[3] = {1, 1, 4};
    td_handle hx, hy, hz, hx3, hi;
    CHECK(td_upload(c, NULL, TD_F32, 2, shape, x, 0, &hx, &err));
    CHECK(td_upload(c, NULL, TD_F32, 2, shape, y, 0, &hy, &err));
    td_attr red = td_attr_str("reduction", "sum");
    td_op_opts oo = {.attrs = &red, .nattrs = 1};
    td_handle in[2] = {hx, hy};
    CHECK(td_op(c, "mse_loss", in, 2, &oo, &hz, 1, &err));
    CHECK(td_download(c, hz, out, sizeof out, NULL, &err));
    if (out[0] != 14.0f)
        return fprintf(stderr, "mse_loss through td_attr_str: %g\n", out[0]), 1;
    double sf[1] = {2.0};
    td_attr scale = td_attr_floats("scale_factor", sf, 1);
    td_op_opts oi = {.attrs = &scale, .nattrs = 1};
    CHECK(td_upload(c, NULL, TD_F32, 3, shape3, x, 0, &hx3, &err));
    CHECK(td_op(c, "interpolate", &hx3, 1, &oi, &hi, 1, &err));
    CHECK(td_download(c, hi, out, sizeof out, NULL, &err));
    if (out[0] != 1.0f || out[1] != 1.0f || out[7] != 4.0f)
        return fprintf(stderr, "interpolate through td_attr_floats: %g %g %g\n", out[0], out[1],
                       out[7]),
               1;
    printf("new client: %zu session(s)\n", n);
    td_close(c);
    return 0;
}
