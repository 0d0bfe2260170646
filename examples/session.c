/* session.c -- a small fixed session through libtensordd: upload, matmul,
 * relu, sum, download, print; then a deliberate mistake, answered typed.
 *
 *   build/examples/session tcp://127.0.0.1:7070 */
#include <stdio.h>
#include <stdlib.h>

#include "tensordd.h"

static int fail(const char *what, const td_error *err)
{
    fprintf(stderr, "session: %s: %s: %s (request %llu)\n", what, td_err_name(err->code),
            err->message, (unsigned long long)err->request_id);
    return 1;
}

int main(int argc, char **argv)
{
    const char *ep = argc > 1 ? argv[1] : "tcp://127.0.0.1:7070";
    td_client *c;
    td_error err;
    if (td_connect(ep, NULL, &c, &err))
        return fail("connect", &err);
    printf("connected to %s (session %llu)%s%s\n", ep, (unsigned long long)td_session_id(c),
           td_server_note(c)[0] ? ": " : "", td_server_note(c));

    td_device_info devs[16];
    size_t nd;
    if (td_list_devices(c, devs, 16, &nd, &err))
        return fail("devices", &err);
    printf("devices:");
    for (size_t i = 0; i < nd && i < 16; i++)
        printf(" %s:%u", devs[i].device.backend, devs[i].device.ordinal);
    printf("\n");

    /* x (2x3) @ w (3x2), relu, sum */
    float x[6] = {1, -2, 3, -4, 5, -6}, w[6] = {0.5f, -1, 1, 0.25f, -0.5f, 2};
    int64_t xs[2] = {2, 3}, ws[2] = {3, 2};
    td_handle hx, hw;
    if (td_upload(c, NULL, TD_F32, 2, xs, x, 0, &hx, &err) ||
        td_upload(c, NULL, TD_F32, 2, ws, w, 0, &hw, &err))
        return fail("upload", &err);
    td_handle in[2] = {hx, hw};
    td_handle y = td_op1(c, "matmul", in, 2, NULL, &err);
    td_handle r = td_op1(c, "relu", &y, 1, NULL, &err);
    td_handle s = td_op1(c, "sum", &r, 1, NULL, &err);
    float yr[4], total;
    if (td_download(c, r, yr, sizeof yr, NULL, &err) ||
        td_download(c, s, &total, sizeof total, NULL, &err))
        return fail("download", &err);
    printf("relu(x @ w) = [[%g, %g], [%g, %g]]   sum = %g\n", yr[0], yr[1], yr[2], yr[3], total);

    /* Check against the same arithmetic done here. */
    float expect = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            float v = 0;
            for (int k = 0; k < 3; k++)
                v += x[i * 3 + k] * w[k * 2 + j];
            expect += v > 0 ? v : 0;
        }
    if (total != expect) {
        fprintf(stderr, "session: sum %g, expected %g\n", total, expect);
        return 1;
    }

    /* A mistake: (2x3) @ (2x3). The op returns at once; the typed error comes at sync. */
    td_handle bad[2] = {hx, hx};
    td_op1(c, "matmul", bad, 2, NULL, &err);
    if (td_sync(c, &err) != TD_ESHAPE_MISMATCH) {
        fprintf(stderr, "session: expected SHAPE_MISMATCH at sync\n");
        return 1;
    }
    printf("typed error, as expected: %s (request %llu): %s\n", td_err_name(err.code),
           (unsigned long long)err.request_id, err.message);
    if (td_sync(c, &err))
        return fail("sync after the error", &err);
    printf("session still usable after the error\n");
    td_close(c);
    return 0;
}
