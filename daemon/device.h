/* device.h -- the devices the daemon serves, their storage and memory accounting. */
#ifndef TDD_DEVICE_H
#define TDD_DEVICE_H

#include "backend.h"
#include "config.h"

struct tdd_queue;
struct tdd_lane;

#define TDD_MAX_LANES 64

typedef struct tdd_device {
    const tdd_backend *be;
    void *ctx;
    int ordinal;    /* within the backend */
    int index;      /* within the daemon */
    char label[24]; /* "cpu:0" */
    char name[64];
    uint64_t in_use, peak; /* bytes; loop thread only */
    /* The device's workers: a session's work runs on lane (session id % nlanes), in
     * submission order, in a queue of its own that the lane serves in turn with its other
     * sessions' (exec.h); other lanes run beside it. One lane where the backend's kernels
     * must not overlap. */
    struct tdd_lane *lanes[TDD_MAX_LANES];
    int nlanes;
} tdd_device;

/* The queue that orders the work of the session with this id on d. Loop thread. */
struct tdd_queue *tdd_device_lane(const tdd_device *d, uint64_t session_id);

/* Who pays for an allocation: a session's quota (limit 0 = none) and the
 * daemon's cap. Refcounted because storage can outlive its session briefly
 * (a task still running when the client hung up). Loop thread only. */
typedef struct tdd_account {
    long refs;
    uint64_t in_use, limit;
    /* Host storage of this many bytes and more is made in memfds (the session takes
     * downloads as fds, which then hand it over without a copy); 0: never. */
    uint64_t shm_min;
} tdd_account;

/* Initialises every backend; fills note with a line for clients (e.g. no GPU). */
int tdd_devices_init(const tdd_config *cfg, char *note, size_t note_len);
void tdd_devices_shutdown(void);
/* The session ended: backends drop what they kept for it (a CUDA stream). */
void tdd_devices_session_end(uint64_t session_id);
int tdd_device_count(void);
tdd_device *tdd_device_get(int i);
/* A session's default device (cpu:0). */
tdd_device *tdd_default_device(void);
/* The device, or NULL; *backend_known says whether the backend exists at all. */
tdd_device *tdd_device_find(const char *backend, uint32_t ordinal, int *backend_known);

/* Allocates nbytes on dev charged to acct (may be NULL), for the session with id session,
 * whose work uses it first (a cuda device orders the block on that session's stream; 0: the
 * device's own). On failure returns NULL with RESOURCE_EXHAUSTED in err. Loop thread only. */
tdd_storage *tdd_storage_alloc(tdd_device *dev, size_t nbytes, tdd_account *acct, uint64_t session,
                               td_error *err);
/* Storage over memory the caller owns (a mapping of a client's memfd), charged to acct as
 * tdd_storage_alloc charges; release(arg) gives the memory back when the last reference
 * goes, on whichever thread drops it. The caller keeps data and arg on failure. */
typedef void (*tdd_storage_release)(void *arg);
tdd_storage *tdd_storage_adopt(tdd_device *dev, void *data, size_t nbytes, tdd_account *acct,
                               tdd_storage_release release, void *arg, td_error *err);
/* The arg st was adopted with when its release is release, else NULL. */
void *tdd_storage_adopted(const tdd_storage *st, tdd_storage_release release);
void tdd_storage_ref(tdd_storage *st);
void tdd_storage_unref(tdd_storage *st);

void tdd_account_unref(tdd_account *a);
/* Charges nbytes of memory a client caused (storage, autodiff graph nodes, bookkeeping) to
 * acct (may be NULL) and the daemon's cap: RESOURCE_EXHAUSTED in err when over either.
 * Whatever outlives the session holds its own reference on acct. Loop thread only. */
int tdd_account_charge(tdd_account *acct, uint64_t nbytes, td_error *err);
void tdd_account_credit(tdd_account *acct, uint64_t nbytes);
uint64_t tdd_memory_in_use(void);

#endif
