/* cuda_checks.h -- value checks of kernels (indices and classes in range, integer powers)
 * read back at the next synchronising point instead of after each kernel.
 *
 * Each stream slot keeps a ring of device ints, zero between reads. A kernel that checks
 * values gets the next entry (kernels.cu's with_flag, through tdc_dev) and sets it when a
 * value is refused; the call that issued it names the entry after its op and session.
 * Issuing costs no synchronisation: the ring is copied back (and zeroed) on the stream by
 * the next download or synchronize of the slot, which waits for the stream anyway, and a
 * set entry becomes that request's INVALID_ARGUMENT, naming the op. Entries of another
 * session sharing the slot are kept for that session's own next synchronising request.
 * A full ring makes checks synchronous again (with_flag falls back) until the next read. */
#ifndef TDD_CUDA_CHECKS_H
#define TDD_CUDA_CHECKS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"
#include "opcodes.h"

#define TDC_CHECKS_CAP 256  /* entries between two reads before checks synchronise again */
#define TDC_CHECKS_FOUND 16 /* refused checks kept for sessions that did not read them yet */

typedef struct {
    uint64_t session;
    tdd_op op;
} tdc_check_owner;

typedef struct {
    int *dev;  /* TDC_CHECKS_CAP device ints (NULL: not made yet) */
    int taken; /* entries issued since the last read (kernels.cu advances it) */
    int named; /* entries [0, named) have an owner */
    int host[TDC_CHECKS_CAP];
    tdc_check_owner owner[TDC_CHECKS_CAP];
    tdc_check_owner found[TDC_CHECKS_FOUND]; /* refused, not yet told */
    int nfound;
    atomic_int unread; /* taken + nfound, for checks_pending() from any thread */
} tdc_checks;

/* Points kd at the ring, which the slot's first checking kernel makes on its stream (a
 * slot that never checks a value holds no device memory for it; one whose ring cannot be
 * made checks synchronously). */
void tdc_checks_open(tdc_checks *k, tdc_dev *kd);
/* Frees the ring on stream after (ordered after the slot's work); what was unread goes. */
void tdc_checks_close(tdc_checks *k, tdc_dev *kd, cudaStream_t after);
/* The entries issued since the last call belong to session's op. */
void tdc_checks_name(tdc_checks *k, uint64_t session, tdd_op op);
/* Copies the ring back and zeroes it on stream s, then waits for s: the stream
 * synchronisation of a download or a synchronize, with the checks read on the way. */
cudaError_t tdc_checks_sync(tdc_checks *k, cudaStream_t s);
/* After a sync: the first refused check of session, removed (false: none). */
bool tdc_checks_take(tdc_checks *k, uint64_t session, tdd_op *op);
/* Whether checks of the slot wait to be read (any session's: a shared slot's are read
 * together). */
bool tdc_checks_unread(const tdc_checks *k);

#endif
