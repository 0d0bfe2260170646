/* test_dispatch.c -- the request table's handle columns (daemon/dispatch.c): every
 * uint64 field of every request body is a handle the request names as new, a handle it
 * reads, or one of the few fields named below that are neither. A replay substitutes its
 * inputs where the read column says, and rebinds what the new column says: a handle
 * field the table forgot would be replayed with the recorded handle. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

Suite *dispatch_suite(void);

typedef Tensordd__V1__Request Request;

/* uint64 fields of request bodies that are no handle the request reads or names new. */
static const char *const not_handles[] = {
    "hello.last_received",          /* a byte count (resume) */
    "upload.fd_offset",             /* an offset into the passed fd */
    "download.fd_min_bytes",        /* a size */
    "release.handles",              /* released, not read: a replay drops its inputs' */
    "optimizer_state.first_output", /* a run of new ids, bound all or none (no placeholders) */
    "transfer_accept.handle",       /* bound when another daemon's push arrives */
};

static bool is_exempt(const char *body, const char *field)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", body, field);
    for (size_t i = 0; i < sizeof not_handles / sizeof not_handles[0]; i++)
        if (!strcmp(name, not_handles[i]))
            return true;
    return false;
}

/* Each handle field's value: SENTINEL + 16 * field index + element (two per repeated). */
#define SENTINEL 1000000u
#define MOVED (1ull << 60) /* what the read callback adds: a replay's rewrite */

typedef struct {
    uint64_t got[64];
    size_t n;
} seen;

static void saw_read(uint64_t *id, void *arg)
{
    seen *s = arg;
    if (s->n < sizeof s->got / sizeof s->got[0])
        s->got[s->n++] = *id;
    *id += MOVED;
}

static bool has(const uint64_t *v, size_t n, uint64_t x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

START_TEST(test_every_handle_field_is_new_or_read)
{
    const ProtobufCMessageDescriptor *rd = &tensordd__v1__request__descriptor;
    int bodies = 0, handles = 0;
    for (unsigned b = 0; b < rd->n_fields; b++) {
        const ProtobufCFieldDescriptor *bf = &rd->fields[b];
        if (!(bf->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            continue;
        const ProtobufCMessageDescriptor *md = bf->descriptor;
        ProtobufCMessage *msg = calloc(1, md->sizeof_message);
        ck_assert_ptr_nonnull(msg);
        md->message_init(msg);
        uint64_t *arrays[32] = {0};
        for (unsigned k = 0; k < md->n_fields; k++) {
            const ProtobufCFieldDescriptor *f = &md->fields[k];
            if (f->type != PROTOBUF_C_TYPE_UINT64)
                continue;
            uint64_t v = SENTINEL + 16u * k;
            if (f->label == PROTOBUF_C_LABEL_REPEATED) {
                ck_assert_uint_lt(k, 32);
                arrays[k] = malloc(2 * sizeof(uint64_t));
                arrays[k][0] = v;
                arrays[k][1] = v + 1;
                *(size_t *)((char *)msg + f->quantifier_offset) = 2;
                *(uint64_t **)((char *)msg + f->offset) = arrays[k];
            } else {
                *(uint64_t *)((char *)msg + f->offset) = v;
            }
        }
        Request req = TENSORDD__V1__REQUEST__INIT;
        req.body_case = (Tensordd__V1__Request__BodyCase)bf->id;
        *(ProtobufCMessage **)((char *)&req + bf->offset) = msg;

        uint64_t fresh[TDD_MAX_OP_OUTPUTS];
        size_t nfresh = tdd_dispatch_new_ids(&req, fresh);
        seen reads = {.n = 0};
        tdd_dispatch_read_ids(&req, saw_read, &reads);

        for (unsigned k = 0; k < md->n_fields; k++) {
            const ProtobufCFieldDescriptor *f = &md->fields[k];
            if (f->type != PROTOBUF_C_TYPE_UINT64)
                continue;
            bool rep = f->label == PROTOBUF_C_LABEL_REPEATED;
            for (unsigned e = 0; e < (rep ? 2u : 1u); e++) {
                uint64_t v = SENTINEL + 16u * k + e;
                uint64_t now = rep ? arrays[k][e] : *(uint64_t *)((char *)msg + f->offset);
                bool is_new = has(fresh, nfresh, v), is_read = has(reads.got, reads.n, v);
                if (is_exempt(bf->name, f->name)) {
                    ck_assert_msg(!is_new && !is_read, "%s.%s is listed as no handle", bf->name,
                                  f->name);
                    continue;
                }
                handles++;
                ck_assert_msg(is_new != is_read,
                              "%s.%s[%u]: the request table names it %s (a handle field is "
                              "new or read: give its row's new_ids or read_ids column it)",
                              bf->name, f->name, e,
                              is_new ? "new and read" : "neither new nor read");
                /* a read is rewritten where it lies, as a replay's substitution does */
                ck_assert_msg(now == (is_read ? v + MOVED : v), "%s.%s[%u] not rewritten in place",
                              bf->name, f->name, e);
            }
        }
        for (size_t i = 0; i < reads.n; i++) /* nothing read but the body's own fields */
            ck_assert_uint_ge(reads.got[i], SENTINEL);
        for (unsigned k = 0; k < 32; k++)
            free(arrays[k]);
        free(msg);
        bodies++;
    }
    ck_assert_int_ge(bodies, 30);
    ck_assert_int_ge(handles, 30);
}
END_TEST

Suite *dispatch_suite(void)
{
    Suite *s = suite_create("dispatch");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, test_every_handle_field_is_new_or_read);
    suite_add_tcase(s, tc);
    return s;
}
