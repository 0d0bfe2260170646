/* wire.h -- hand-written encoders for the replies every small request gets.
 *
 * protobuf-c packs through a generic walk of its descriptors, once to size a
 * message and again to write it (sub-messages are sized twice): for the Ok
 * and TensorInfo replies of small ops that walk, a device name copied with
 * snprintf, and two mallocs for the frame were more instructions than the op.
 * These write the same bytes protobuf-c writes for the same message (proto3:
 * fields at their default value are left out; packed repeated scalars). */
#ifndef TDD_WIRE_H
#define TDD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "session.h"
#include "tensordd.pb-c.h"

/* Large enough for every message below (TensorInfo: at most ~130 bytes). */
#define TDD_WIRE_SMALL_MAX 192

/* Response { id, ok {} }; returns its length. */
size_t tdd_wire_ok(uint8_t *out, uint64_t id);

/* Response { id, tensor: TensorInfo of v } as tdd_send_tensor describes it;
 * returns its length (at most TDD_WIRE_SMALL_MAX). */
size_t tdd_wire_tensor(uint8_t *out, uint64_t id, const tdd_value *v);

/* Decodes the requests small ops send most (an Op without attrs or device,
 * a Release, a Sync) straight into al's memory, as protobuf-c would decode
 * them; NULL for anything else, malformed or not, which is then left to
 * protobuf-c (tensordd__v1__request__unpack), whose verdict stands. */
Tensordd__V1__Request *tdd_wire_request_fast(const uint8_t *msg, size_t len,
                                             ProtobufCAllocator *al);

/* wire.c: td_error -> protobuf Error, in one place. The buffer owns every
 * sub-message the Error points to. */
typedef struct {
    Tensordd__V1__Error e;
    Tensordd__V1__DeviceMismatch dm;
    Tensordd__V1__Device d[2];
    Tensordd__V1__DTypeMismatch dtm;
    Tensordd__V1__ShapeMismatch sm;
    Tensordd__V1__UnknownHandle uh;
    Tensordd__V1__WrongHandleKind whk;
    Tensordd__V1__Poisoned po;
    Tensordd__V1__ResourceExhausted re;
    Tensordd__V1__VersionMismatch vm;
    Tensordd__V1__InvalidArgument ia;
    char msg[256], arg[32], res[32], b0[16], b1[16];
    int64_t shapes[2][TD_MAX_NDIM];
} tdd_wire_error;

Tensordd__V1__Error *tdd_wire_error_fill(tdd_wire_error *w, const td_error *err,
                                         uint64_t request_id);
/* A whole error Response for request id, packed into a malloc'd buffer of *n bytes (kept
 * for resume); NULL when out of memory. */
uint8_t *tdd_wire_error_packed(uint64_t id, const td_error *err, size_t *n);
void tdd_wire_device(Tensordd__V1__Device *out, char *backend_buf, size_t len, const tdd_device *d);

#endif
