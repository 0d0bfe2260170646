/* pbwire.h -- the protobuf wire-format primitives the daemon's and the client's
 * hand-written codecs for small messages share (daemon/wire.c, client/lib/wire.c):
 * varints out, and varints, keys and length-delimited fields in, with the limits
 * protobuf-c applies, so that what these accept protobuf-c accepts too
 * (tests/unit/test_wire.c holds both codecs to protobuf-c). The keys themselves are
 * generated from the .proto (tensordd_keys.h, tools/gen_wire_keys.py). */
#ifndef TD_PBWIRE_H
#define TD_PBWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline size_t td_pb_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline uint8_t *td_pb_put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* A key (tensordd_keys.h's TD_KEY_*, a constant): one byte for fields 1-15, more after. */
static inline uint8_t *td_pb_put_key(uint8_t *p, uint32_t key)
{
    if (key < 0x80) {
        *p++ = (uint8_t)key;
        return p;
    }
    return td_pb_put_varint(p, key);
}

/* Bytes being read: [p, end). */
typedef struct {
    const uint8_t *p, *end;
} td_pb_reader;

/* A varint of at most max bytes whose value fits 64 bits; false otherwise. */
static inline bool td_pb_get_varint_max(td_pb_reader *r, uint64_t *out, int max)
{
    uint64_t v = 0;
    for (int i = 0; i < max; i++) {
        if (r->p == r->end)
            return false;
        uint8_t b = *r->p++;
        if (i == 9 && b > 1)
            return false;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (b < 0x80) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* A value: at most 10 bytes. */
static inline bool td_pb_get_varint(td_pb_reader *r, uint64_t *out)
{
    return td_pb_get_varint_max(r, out, 10);
}

/* A key or a length: protobuf-c reads these in at most 5 bytes and rejects the
 * message when one takes more (a value may take 10). */
static inline bool td_pb_get_key(td_pb_reader *r, uint64_t *out)
{
    return td_pb_get_varint_max(r, out, 5);
}

/* A length-delimited field's bytes, wholly inside the message. */
static inline bool td_pb_get_bytes(td_pb_reader *r, td_pb_reader *out)
{
    uint64_t len;
    if (!td_pb_get_key(r, &len) || len > (uint64_t)(r->end - r->p))
        return false;
    out->p = r->p;
    out->end = r->p + len;
    r->p += len;
    return true;
}

#endif
