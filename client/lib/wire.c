/* wire.c -- libtensordd's side of the fast codec (proto/wirecodec.h, shared with the daemon
 * and the Python client): the requests an op, a release, a download or a sync sends go from
 * protobuf-c's structs into the codec's, and replies whose body the caller does not read are
 * glanced at.
 *
 * protobuf-c sizes a message by walking its descriptors, then walks them again
 * to write it (and sizes every sub-message once more on the way); unpacking a
 * reply mallocs each sub-message, string and array and frees them one by one.
 * For a small op with a reply that was most of the client's instructions.
 * The codec writes exactly the bytes protobuf-c writes for the same message; what it does not
 * cover (an Op with attrs, a field it does not know) is left to protobuf-c. */
#include <string.h>

#include "internal.h"

/* The fields this file writes, per message (a oneof's members are its body switch's). A
 * field the .proto gains later is not written here: a message that sets one is left to
 * protobuf-c, checked only once the message has more fields than these (a constant). */
static const uint32_t req_written[] = {TD_FIELD_REQUEST_ID, TD_FIELD_REQUEST_WANT_REPLY};
static const uint32_t op_written[] = {
    TD_FIELD_OP_OP,     TD_FIELD_OP_INPUTS, TD_FIELD_OP_OUTPUTS,      TD_FIELD_OP_ATTRS,
    TD_FIELD_OP_DEVICE, TD_FIELD_OP_DTYPE,  TD_FIELD_OP_REQUIRES_GRAD};
static const uint32_t dev_written[] = {TD_FIELD_DEVICE_BACKEND, TD_FIELD_DEVICE_ORDINAL};
static const uint32_t rel_written[] = {TD_FIELD_RELEASE_HANDLES};
static const uint32_t dl_written[] = {TD_FIELD_DOWNLOAD_HANDLE};
#define N_WRITTEN(a) (sizeof(a) / sizeof(a)[0])

/* Whether every field of m outside written[] (and outside a oneof) is at its default,
 * which proto3 leaves out of the bytes. */
static int others_default(const ProtobufCMessage *m, const uint32_t *written, size_t n)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        size_t k = 0;
        while (k < n && written[k] != f->id)
            k++;
        if (k < n || (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        const char *base = (const char *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            if (*(const size_t *)(const void *)(base + f->quantifier_offset))
                return 0;
            continue;
        }
        if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
            *(const protobuf_c_boolean *)(const void *)(base + f->quantifier_offset))
            return 0;
        const void *v = base + f->offset;
        switch (f->type) {
        case PROTOBUF_C_TYPE_STRING: {
            const char *str = *(char *const *)v;
            if (str && *str)
                return 0;
            break;
        }
        case PROTOBUF_C_TYPE_MESSAGE:
            if (*(void *const *)v)
                return 0;
            break;
        case PROTOBUF_C_TYPE_BYTES:
            if (((const ProtobufCBinaryData *)v)->len)
                return 0;
            break;
        default: { /* a scalar, 1 to 8 bytes: zero when unset */
            size_t size =
                f->type == PROTOBUF_C_TYPE_BOOL ? sizeof(protobuf_c_boolean)
                : f->type == PROTOBUF_C_TYPE_INT64 || f->type == PROTOBUF_C_TYPE_UINT64 ||
                        f->type == PROTOBUF_C_TYPE_SINT64 || f->type == PROTOBUF_C_TYPE_FIXED64 ||
                        f->type == PROTOBUF_C_TYPE_SFIXED64 || f->type == PROTOBUF_C_TYPE_DOUBLE
                    ? 8
                    : 4;
            static const unsigned char zero[8];
            if (memcmp(v, zero, size))
                return 0;
        }
        }
    }
    return 1;
}

/* others_default, only for a message with fields (outside a oneof) this file does not know:
 * nplain is a constant. */
#define KNOWN_ONLY(m, nplain, written)                                                             \
    ((nplain) <= N_WRITTEN(written) || others_default(&(m)->base, written, N_WRITTEN(written)))

/* Moves req into the codec's struct (the fields its body needs); 0 when req is not one the codec
 * encodes (a body it does not write, an Op with attrs, a field it does not know set). */
static int to_wire(const Tensordd__V1__Request *req, td_wire_request *w)
{
    if (req->base.n_unknown_fields || !KNOWN_ONLY(req, TD_NPLAIN_REQUEST, req_written))
        return 0;
    w->id = req->id;
    w->want_reply = req->want_reply;
    switch (req->body_case) {
    case TENSORDD__V1__REQUEST__BODY_OP: {
        const Tensordd__V1__Op *op = req->op;
        if (!op || op->n_attrs || op->base.n_unknown_fields ||
            !KNOWN_ONLY(op, TD_NPLAIN_OP, op_written))
            return 0;
        w->body = TD_FIELD_REQUEST_OP;
        td_wire_op_clear(&w->op);
        w->op.name = op->op;
        w->op.name_len = op->op ? strlen(op->op) : 0;
        w->op.inputs = op->inputs;
        w->op.n_inputs = op->n_inputs;
        w->op.outputs = op->outputs;
        w->op.n_outputs = op->n_outputs;
        if (op->device) {
            const Tensordd__V1__Device *d = op->device;
            if (d->base.n_unknown_fields || !KNOWN_ONLY(d, TD_NPLAIN_DEVICE, dev_written))
                return 0;
            w->op.has_device = true;
            w->op.device.backend = d->backend;
            w->op.device.backend_len = d->backend ? strlen(d->backend) : 0;
            w->op.device.ordinal = d->ordinal;
        }
        w->op.dtype = (int32_t)op->dtype;
        w->op.requires_grad = op->requires_grad != 0;
        return 1;
    }
    case TENSORDD__V1__REQUEST__BODY_RELEASE: {
        const Tensordd__V1__Release *r = req->release;
        if (!r || r->base.n_unknown_fields || !KNOWN_ONLY(r, TD_NPLAIN_RELEASE, rel_written))
            return 0;
        w->body = TD_FIELD_REQUEST_RELEASE;
        w->handles = r->handles;
        w->n_handles = r->n_handles;
        return 1;
    }
    case TENSORDD__V1__REQUEST__BODY_DOWNLOAD: {
        const Tensordd__V1__Download *d = req->download;
        if (!d || d->base.n_unknown_fields || !KNOWN_ONLY(d, TD_NPLAIN_DOWNLOAD, dl_written))
            return 0;
        w->body = TD_FIELD_REQUEST_DOWNLOAD;
        w->handle = d->handle;
        return 1;
    }
    case TENSORDD__V1__REQUEST__BODY_SYNC:
        w->body = TD_FIELD_REQUEST_SYNC;
        return req->sync && !req->sync->base.n_unknown_fields &&
               (TD_NPLAIN_SYNC == 0 || others_default(&req->sync->base, NULL, 0));
    default:
        return 0;
    }
}

size_t td__request_fast_size(const Tensordd__V1__Request *req, td__req_sizes *z)
{
    return to_wire(req, &z->w) ? td_wire_request_size(&z->w) : 0;
}

size_t td__request_fast_pack(const Tensordd__V1__Request *req, const td__req_sizes *z, uint8_t *out)
{
    (void)req; /* (z holds it, moved by td__request_fast_size) */
    return (size_t)(td_wire_request_put(out, &z->w) - out);
}

/* ---------------------------------------------------------------- replies */

int td__glance_response(const uint8_t *msg, size_t len, uint64_t *id, int *body_case)
{
    td_wire_tensor t;
    uint32_t body = td_wire_response_get(msg, len, id, &t, NULL, -1);
    *body_case = (int)body;
    return body != 0;
}
