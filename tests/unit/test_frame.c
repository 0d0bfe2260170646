/* test_frame.c -- the frame codec: partial headers, byte-at-a-time delivery,
 * several frames in one read, oversize and garbage. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "tensordd.h"

Suite *frame_suite(void);

static const td_frame_limits lim = {.max_msg = 1024, .max_payload = 1u << 20};

/* A frame with a message of mlen bytes (pattern i*7) and no payload bytes. */
static size_t build(uint8_t *out, uint32_t mlen, uint64_t plen, uint8_t seed)
{
    td_frame_encode(out, mlen, plen);
    for (uint32_t i = 0; i < mlen; i++)
        out[TD_FRAME_HEADER_SIZE + i] = (uint8_t)(seed + i * 7);
    return TD_FRAME_HEADER_SIZE + mlen;
}

START_TEST(test_roundtrip_header)
{
    uint8_t h[TD_FRAME_HEADER_SIZE];
    td_frame_encode(h, 300, 123456789012ull);
    td_frame_header hdr;
    td_frame_limits big = {.max_msg = 1000, .max_payload = UINT64_MAX};
    ck_assert_int_eq(td_frame_decode(h, &big, &hdr), 0);
    ck_assert_uint_eq(hdr.msg_len, 300);
    ck_assert_uint_eq(hdr.payload_len, 123456789012ull);
    /* little-endian on the wire, whatever the host */
    ck_assert_uint_eq(h[0], 'T');
    ck_assert_uint_eq(h[1], 'D');
    ck_assert_uint_eq(h[2], 'D');
    ck_assert_uint_eq(h[3], TD_FRAME_VERSION);
    ck_assert_uint_eq(h[4], 300 & 0xff);
    ck_assert_uint_eq(h[5], 300 >> 8);
}
END_TEST

START_TEST(test_byte_at_a_time)
{
    uint8_t buf[256];
    size_t n = build(buf, 100, 0, 3);
    td_frame_parser p;
    td_frame_parser_init(&p, &lim);
    for (size_t i = 0; i < n; i++) {
        size_t used;
        int rc = td_frame_feed(&p, buf + i, 1, &used);
        ck_assert_uint_eq(used, 1);
        if (i + 1 < n) {
            ck_assert_int_eq(rc, TD_FRAME_NEED_MORE);
        } else {
            ck_assert_int_eq(rc, TD_FRAME_READY);
            ck_assert_uint_eq(p.hdr.msg_len, 100);
            ck_assert_mem_eq(p.msg, buf + TD_FRAME_HEADER_SIZE, 100);
        }
    }
    td_frame_parser_free(&p);
}
END_TEST

START_TEST(test_partial_header_then_rest)
{
    uint8_t buf[256];
    size_t n = build(buf, 40, 5, 9);
    td_frame_parser p;
    td_frame_parser_init(&p, &lim);
    size_t used;
    ck_assert_int_eq(td_frame_feed(&p, buf, 7, &used), TD_FRAME_NEED_MORE);
    ck_assert_uint_eq(used, 7);
    ck_assert_int_eq(td_frame_feed(&p, buf + 7, n - 7, &used), TD_FRAME_READY);
    ck_assert_uint_eq(used, n - 7);
    ck_assert_uint_eq(p.hdr.payload_len, 5);
    ck_assert_mem_eq(p.msg, buf + TD_FRAME_HEADER_SIZE, 40);
    td_frame_parser_free(&p);
}
END_TEST

START_TEST(test_two_frames_one_read)
{
    uint8_t buf[512];
    size_t n1 = build(buf, 30, 0, 1);
    size_t n2 = build(buf + n1, 50, 0, 2);
    td_frame_parser p;
    td_frame_parser_init(&p, &lim);
    size_t used, off = 0;
    ck_assert_int_eq(td_frame_feed(&p, buf, n1 + n2, &used), TD_FRAME_READY);
    ck_assert_uint_eq(used, n1); /* stops at the frame's end: the rest is the next frame */
    ck_assert_uint_eq(p.hdr.msg_len, 30);
    ck_assert_mem_eq(p.msg, buf + TD_FRAME_HEADER_SIZE, 30);
    off += used;
    ck_assert_int_eq(td_frame_feed(&p, buf + off, n1 + n2 - off, &used), TD_FRAME_READY);
    ck_assert_uint_eq(p.hdr.msg_len, 50);
    ck_assert_mem_eq(p.msg, buf + n1 + TD_FRAME_HEADER_SIZE, 50);
    ck_assert_uint_eq(off + used, n1 + n2);
    td_frame_parser_free(&p);
}
END_TEST

START_TEST(test_message_split_across_reads)
{
    uint8_t buf[512];
    size_t n = build(buf, 200, 0, 5);
    td_frame_parser p;
    td_frame_parser_init(&p, &lim);
    size_t used;
    ck_assert_int_eq(td_frame_feed(&p, buf, 100, &used), TD_FRAME_NEED_MORE);
    ck_assert_int_eq(td_frame_feed(&p, buf + 100, 50, &used), TD_FRAME_NEED_MORE);
    ck_assert_int_eq(td_frame_feed(&p, buf + 150, n - 150, &used), TD_FRAME_READY);
    ck_assert_mem_eq(p.msg, buf + TD_FRAME_HEADER_SIZE, 200);
    td_frame_parser_free(&p);
}
END_TEST

START_TEST(test_oversize)
{
    uint8_t h[TD_FRAME_HEADER_SIZE];
    td_frame_parser p;
    size_t used;
    td_frame_encode(h, 1025, 0); /* message over max_msg */
    td_frame_parser_init(&p, &lim);
    ck_assert_int_eq(td_frame_feed(&p, h, sizeof h, &used), TD_EFRAME_TOO_LARGE);
    td_frame_parser_free(&p);
    td_frame_encode(h, 10, (1u << 20) + 1); /* payload over max_payload */
    td_frame_parser_init(&p, &lim);
    ck_assert_int_eq(td_frame_feed(&p, h, sizeof h, &used), TD_EFRAME_TOO_LARGE);
    /* nothing was allocated for the refused message */
    ck_assert_ptr_null(p.own);
    td_frame_parser_free(&p);
    td_frame_encode(h, UINT32_MAX, UINT64_MAX);
    td_frame_header hdr;
    ck_assert_int_eq(td_frame_decode(h, &lim, &hdr), TD_EFRAME_TOO_LARGE);
}
END_TEST

START_TEST(test_garbage)
{
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    td_frame_parser p;
    td_frame_parser_init(&p, &lim);
    size_t used;
    ck_assert_int_eq(td_frame_feed(&p, junk, sizeof junk, &used), TD_EPROTOCOL_ERROR);
    td_frame_parser_free(&p);
    /* right magic, wrong version */
    uint8_t h[TD_FRAME_HEADER_SIZE];
    td_frame_encode(h, 10, 0);
    h[3] = 2;
    td_frame_header hdr;
    ck_assert_int_eq(td_frame_decode(h, &lim, &hdr), TD_EPROTOCOL_ERROR);
    /* an empty message is not a request */
    td_frame_encode(h, 0, 0);
    ck_assert_int_eq(td_frame_decode(h, &lim, &hdr), TD_EPROTOCOL_ERROR);
}
END_TEST

/* Random chunking of many frames always yields the same messages. */
START_TEST(test_random_chunks)
{
    enum { NF = 50 };
    uint8_t *buf = malloc(NF * (TD_FRAME_HEADER_SIZE + 300));
    size_t lens[NF], total = 0;
    unsigned seed = 12345;
    for (int f = 0; f < NF; f++) {
        seed = seed * 1103515245u + 12345u;
        lens[f] = 1 + (seed >> 16) % 300;
        total += build(buf + total, (uint32_t)lens[f], 0, (uint8_t)f);
    }
    td_frame_parser p;
    td_frame_parser_init(&p, &lim);
    size_t off = 0;
    int got = 0;
    size_t pos_of_frame = 0;
    while (off < total) {
        seed = seed * 1103515245u + 12345u;
        size_t chunk = 1 + (seed >> 16) % 97;
        if (chunk > total - off)
            chunk = total - off;
        size_t c = 0;
        while (c < chunk) {
            size_t used;
            int rc = td_frame_feed(&p, buf + off + c, chunk - c, &used);
            ck_assert_int_ge(rc, 0);
            c += used;
            if (rc == TD_FRAME_READY) {
                ck_assert_uint_eq(p.hdr.msg_len, lens[got]);
                ck_assert_mem_eq(p.msg, buf + pos_of_frame + TD_FRAME_HEADER_SIZE, lens[got]);
                pos_of_frame += TD_FRAME_HEADER_SIZE + lens[got];
                got++;
            }
        }
        off += chunk;
    }
    ck_assert_int_eq(got, NF);
    td_frame_parser_free(&p);
    free(buf);
}
END_TEST

Suite *frame_suite(void)
{
    Suite *s = suite_create("frame");
    TCase *tc = tcase_create("codec");
    tcase_add_test(tc, test_roundtrip_header);
    tcase_add_test(tc, test_byte_at_a_time);
    tcase_add_test(tc, test_partial_header_then_rest);
    tcase_add_test(tc, test_two_frames_one_read);
    tcase_add_test(tc, test_message_split_across_reads);
    tcase_add_test(tc, test_oversize);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_random_chunks);
    suite_add_tcase(s, tc);
    return s;
}
