/* server_arena.c -- the arena a connection's requests are unpacked into: one bump
 * region reset per request instead of protobuf-c's malloc per field. */
#include <stdlib.h>

#include "server_impl.h"
#include "wire.h"

/* protobuf-c allocates every submessage, string and repeated field of a
 * request separately and frees them one by one: on pipelined small ops that
 * was a sixth of the daemon's time (malloc, free, free_unpacked), and it
 * interleaved short-lived blocks with long-lived values, fragmenting the
 * heap. A request's pieces are instead carved from one per-connection
 * region; what does not fit is malloc'ed and chained, and the region grows
 * to hold it next time (up to ARENA_MAX). */
#define ARENA_MIN 4096
#define ARENA_MAX (64 * 1024)

typedef struct arena_blk {
    struct arena_blk *next;
    max_align_t data[];
} arena_blk;

struct tdd_arena {
    unsigned char *base;
    size_t cap, used;
    size_t spilled; /* bytes that did not fit since the last reset */
    arena_blk *big;
};

static void *arena_alloc(void *ctx, size_t size)
{
    struct tdd_arena *a = ctx;
    size_t al = _Alignof(max_align_t);
    size = (size + al - 1) & ~(al - 1);
    if (size <= a->cap - a->used) {
        void *p = a->base + a->used;
        a->used += size;
        return p;
    }
    arena_blk *b = malloc(sizeof *b + size);
    if (!b)
        return NULL;
    b->next = a->big;
    a->big = b;
    a->spilled += size;
    return b->data;
}

static void arena_free(void *ctx, void *p)
{
    (void)ctx; /* everything goes at the next reset */
    (void)p;
}

static void arena_reset(struct tdd_arena *a)
{
    while (a->big) {
        arena_blk *b = a->big;
        a->big = b->next;
        free(b);
    }
    size_t want = a->used + a->spilled;
    if (a->spilled && want <= ARENA_MAX) {
        unsigned char *nb = malloc(want);
        if (nb) {
            free(a->base);
            a->base = nb;
            a->cap = want;
        }
    }
    a->used = a->spilled = 0;
}

void srv_arena_destroy(struct tdd_arena *a)
{
    if (!a)
        return;
    arena_reset(a);
    free(a->base);
    free(a);
}

struct tdd_arena *srv_arena_new(void)
{
    struct tdd_arena *a = calloc(1, sizeof *a);
    if (a && !(a->base = malloc(ARENA_MIN))) {
        free(a);
        return NULL;
    }
    if (a)
        a->cap = ARENA_MIN;
    return a;
}

Tensordd__V1__Request *srv_request_unpack(tdd_conn *c, size_t len, const uint8_t *msg)
{
    if (c->arena_req || !c->arena)
        return tensordd__v1__request__unpack(NULL, len, msg);
    arena_reset(c->arena);
    ProtobufCAllocator al = {.alloc = arena_alloc, .free = arena_free, .allocator_data = c->arena};
    /* Small ops' requests first by hand (protobuf-c's generic walk was a third of
     * the daemon's instructions per small op); anything else as before. */
    c->arena_req = tdd_wire_request_fast(msg, len, &al);
    if (!c->arena_req) {
        arena_reset(c->arena);
        c->arena_req = tensordd__v1__request__unpack(&al, len, msg);
    }
    return c->arena_req;
}

void srv_request_free(tdd_conn *c, Tensordd__V1__Request *req)
{
    if (req && req == c->arena_req)
        c->arena_req = NULL;
    else
        tensordd__v1__request__free_unpacked(req, NULL);
}
