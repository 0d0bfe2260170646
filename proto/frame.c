/* frame.c -- frame header codec and the incremental header+message parser. */
#include "frame.h"

#include <stdlib.h>
#include <string.h>

#include "tensordd.h"

/* Payloads are little-endian (docs/protocol.md) and the daemon and libtensordd move tensor
 * memory as it is: a big-endian build would answer with swapped bytes. Refused here, in the
 * one file both link. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tensordd needs a little-endian host: payloads are sent as tensor memory is laid out"
#endif

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void td_frame_encode(uint8_t out[TD_FRAME_HEADER_SIZE], uint32_t msg_len, uint64_t payload_len)
{
    put_u32(out, TD_FRAME_MAGIC);
    put_u32(out + 4, msg_len);
    put_u64(out + 8, payload_len);
}

int td_frame_decode(const uint8_t in[TD_FRAME_HEADER_SIZE], const td_frame_limits *lim,
                    td_frame_header *out)
{
    if (get_u32(in) != TD_FRAME_MAGIC)
        return TD_EPROTOCOL_ERROR;
    out->msg_len = get_u32(in + 4);
    out->payload_len = get_u64(in + 8);
    if (out->msg_len == 0)
        return TD_EPROTOCOL_ERROR; /* every frame carries a Request/Response */
    if (out->msg_len > lim->max_msg || out->payload_len > lim->max_payload)
        return TD_EFRAME_TOO_LARGE;
    return 0;
}

void td_frame_parser_init(td_frame_parser *p, const td_frame_limits *lim)
{
    memset(p, 0, sizeof *p);
    p->lim = *lim;
}

void td_frame_parser_free(td_frame_parser *p)
{
    free(p->own);
    p->own = NULL;
    p->own_cap = 0;
}

int td_frame_feed(td_frame_parser *p, const uint8_t *buf, size_t len, size_t *used)
{
    size_t off = 0;
    *used = 0;
    if (!p->in_msg) {
        size_t take = TD_FRAME_HEADER_SIZE - p->hgot;
        if (take > len)
            take = len;
        memcpy(p->hbuf + p->hgot, buf, take);
        p->hgot += take;
        off += take;
        if (p->hgot < TD_FRAME_HEADER_SIZE) {
            *used = off;
            return TD_FRAME_NEED_MORE;
        }
        int rc = td_frame_decode(p->hbuf, &p->lim, &p->hdr);
        if (rc < 0) {
            *used = off;
            return rc;
        }
        p->in_msg = 1;
        p->mgot = 0;
        /* Whole message already in the caller's bytes: point at it, no copy. */
        if (len - off >= p->hdr.msg_len) {
            p->msg = (uint8_t *)(uintptr_t)(buf + off);
            off += p->hdr.msg_len;
            p->hgot = 0;
            p->in_msg = 0;
            *used = off;
            return TD_FRAME_READY;
        }
        if (p->own_cap < p->hdr.msg_len) {
            uint8_t *n = realloc(p->own, p->hdr.msg_len);
            if (!n) {
                *used = off;
                return TD_ERESOURCE_EXHAUSTED;
            }
            p->own = n;
            p->own_cap = p->hdr.msg_len;
        }
    }
    size_t take = p->hdr.msg_len - p->mgot;
    if (take > len - off)
        take = len - off;
    memcpy(p->own + p->mgot, buf + off, take);
    p->mgot += take;
    off += take;
    *used = off;
    if (p->mgot < p->hdr.msg_len)
        return TD_FRAME_NEED_MORE;
    p->msg = p->own;
    p->hgot = 0;
    p->in_msg = 0;
    return TD_FRAME_READY;
}
