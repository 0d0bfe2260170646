/* frame.h -- the 16-byte frame header shared by the daemon and the clients.
 *
 *   bytes 0..3   magic+version: 'T' 'D' 'D' <version>  (little-endian u32 0x01444454)
 *   bytes 4..7   protobuf message length (u32, little-endian)
 *   bytes 8..15  raw payload length (u64, little-endian)
 *
 * Limits are checked on the header alone, before anything is allocated.
 */
#ifndef TD_FRAME_H
#define TD_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define TD_FRAME_HEADER_SIZE 16
#define TD_FRAME_VERSION 1u
#define TD_FRAME_MAGIC (0x00444454u | (TD_FRAME_VERSION << 24)) /* "TDD\x01" */

typedef struct {
    uint32_t msg_len;
    uint64_t payload_len;
} td_frame_header;

typedef struct {
    uint32_t max_msg;     /* largest protobuf message accepted */
    uint64_t max_payload; /* largest raw payload accepted */
} td_frame_limits;

/* Writes the 16 header bytes. */
void td_frame_encode(uint8_t out[TD_FRAME_HEADER_SIZE], uint32_t msg_len, uint64_t payload_len);

/* Decodes and checks a header. Returns 0, TD_EPROTOCOL_ERROR (bad magic or
 * version) or TD_EFRAME_TOO_LARGE (a length over the limits). */
int td_frame_decode(const uint8_t in[TD_FRAME_HEADER_SIZE], const td_frame_limits *lim,
                    td_frame_header *out);

/* Incremental parser for the header+message part of a frame (the payload is
 * left to the caller, who knows where it should land). Feed it bytes; it
 * reports how many it consumed and whether a header+message is complete. */
typedef enum {
    TD_FRAME_NEED_MORE = 0, /* consumed everything given, frame incomplete */
    TD_FRAME_READY = 1      /* header+message complete: read hdr, msg */
} td_frame_state;

typedef struct {
    td_frame_limits lim;
    uint8_t hbuf[TD_FRAME_HEADER_SIZE];
    size_t hgot;
    td_frame_header hdr;
    uint8_t *msg; /* points into caller bytes when contiguous, else into own */
    uint8_t *own; /* owned buffer for messages split across reads */
    size_t own_cap;
    size_t mgot;
    int in_msg;
} td_frame_parser;

void td_frame_parser_init(td_frame_parser *p, const td_frame_limits *lim);
void td_frame_parser_free(td_frame_parser *p);
/* Consumes from buf[0..len). Returns TD_FRAME_READY / TD_FRAME_NEED_MORE
 * (>= 0) or a negative TD_E* error; *used is set to the bytes consumed.
 * After READY, p->hdr and p->msg (msg_len bytes) are valid until the next
 * call; the next call starts a new frame. */
int td_frame_feed(td_frame_parser *p, const uint8_t *buf, size_t len, size_t *used);

#endif
