/* test_handles.c -- integration: the handle table at scale (pipelined ops with
 * 200k live handles). 200k tensors, each holding its own index, a third of them released,
 * 100k more bound behind them: every sampled live handle still names its own tensor (read
 * back, and through an op), every released one is UNKNOWN_HANDLE, and the session's handle
 * count is exact throughout. Oracle: the index each tensor was uploaded with. */
#include <stdlib.h>

#include "itest.h"

#define FIRST 200000
#define MORE 100000
#define SAMPLES 400

static uint64_t own_handles(td_client *c)
{
    td_stats st;
    td_error e;
    ck_assert_int_eq(td_sync(c, &e), 0);
    ck_assert_int_eq(td_stats_get(c, &st, &e), 0);
    for (size_t i = 0; i < st.nsessions && i < 64; i++)
        if (st.session_list[i].session_id == td_session_id(c))
            return st.session_list[i].handles;
    ck_abort_msg("own session not listed");
    return 0;
}

static void upload_range(td_client *c, td_handle *hs, int from, int to)
{
    td_device cpu = it_dev("cpu:0");
    int64_t shape[1] = {1};
    td_error e;
    for (int i = from; i < to; i++) {
        float v = (float)i;
        ck_assert_int_eq(td_upload(c, &cpu, TD_F32, 1, shape, &v, 0, &hs[i], &e), 0);
    }
}

/* Index i's handle, downloaded (live) or refused (released). */
static void check_one(td_client *c, const td_handle *hs, int i, int released)
{
    float got = -1;
    td_error e;
    int rc = td_download(c, hs[i], &got, sizeof got, NULL, &e);
    if (released) {
        ck_assert_msg(rc == TD_EUNKNOWN_HANDLE, "released #%d: %s", i, td_err_name(rc));
        return;
    }
    ck_assert_msg(rc == 0, "live #%d: %s: %s", i, td_err_name(rc), e.message);
    ck_assert_float_eq(got, (float)i);
}

START_TEST(test_200k_live_handles)
{
    td_client *c = it_client("handles-200k");
    td_error e;
    td_handle *hs = calloc(FIRST + MORE, sizeof *hs);
    ck_assert_ptr_nonnull(hs);
    uint64_t base = own_handles(c);
    upload_range(c, hs, 0, FIRST);
    ck_assert_uint_eq(own_handles(c), base + FIRST);

    /* Release every third: tombstones spread over the whole table. */
    td_handle *gone = malloc((FIRST / 3 + 1) * sizeof *gone);
    ck_assert_ptr_nonnull(gone);
    size_t ngone = 0;
    for (int i = 0; i < FIRST; i += 3)
        gone[ngone++] = hs[i];
    ck_assert_int_eq(td_release(c, gone, ngone, &e), 0);
    ck_assert_uint_eq(own_handles(c), base + FIRST - ngone);

    /* 100k more ids bound behind the holes, then pipelined ops over live ones. */
    upload_range(c, hs, FIRST, FIRST + MORE);
    ck_assert_uint_eq(own_handles(c), base + FIRST + MORE - ngone);
    uint64_t seed = 0x5eed;
    int idx[SAMPLES];
    td_handle sum[SAMPLES];
    for (int k = 0; k < SAMPLES; k++) {
        int i;
        do
            i = (int)(it_rand(&seed) % (FIRST + MORE));
        while (i < FIRST && i % 3 == 0);
        idx[k] = i;
        td_handle in[2] = {hs[i], hs[i]};
        sum[k] = td_op1(c, "add", in, 2, NULL, &e);
        ck_assert_uint_ne(sum[k], 0);
    }
    for (int k = 0; k < SAMPLES; k++) {
        float got = -1;
        ck_assert_int_eq(td_download(c, sum[k], &got, sizeof got, NULL, &e), 0);
        ck_assert_float_eq(got, 2.0f * (float)idx[k]);
    }
    ck_assert_int_eq(td_release(c, sum, SAMPLES, &e), 0);

    /* Direct reads: live and released ids, at random and at the edges. */
    for (int k = 0; k < SAMPLES; k++) {
        int i = (int)(it_rand(&seed) % (FIRST + MORE));
        check_one(c, hs, i, i < FIRST && i % 3 == 0);
    }
    check_one(c, hs, 0, 1);
    check_one(c, hs, 1, 0);
    check_one(c, hs, FIRST - 1, (FIRST - 1) % 3 == 0);
    check_one(c, hs, FIRST, 0);
    check_one(c, hs, FIRST + MORE - 1, 0);

    /* Everything released: the count is back where it started. */
    ngone = 0;
    td_handle *live = malloc((FIRST + MORE) * sizeof *live);
    ck_assert_ptr_nonnull(live);
    for (int i = 0; i < FIRST + MORE; i++)
        if (i >= FIRST || i % 3)
            live[ngone++] = hs[i];
    ck_assert_int_eq(td_release(c, live, ngone, &e), 0);
    ck_assert_uint_eq(own_handles(c), base);
    check_one(c, hs, 1, 1);
    free(live);
    free(gone);
    free(hs);
    td_close(c);
}
END_TEST

Suite *it_handles_suite(void)
{
    Suite *s = suite_create("handles");
    TCase *tc = tcase_create("at scale");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_200k_live_handles);
    suite_add_tcase(s, tc);
    return s;
}
