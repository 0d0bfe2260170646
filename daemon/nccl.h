/* nccl.h -- a probe for NCCL, for the log of process groups on cuda devices (group.c). */
#ifndef TDD_NCCL_H
#define TDD_NCCL_H

#include <stdbool.h>
#include <stddef.h>

/* Loads NCCL (libnccl.so.2, the CUDA toolkit's; nothing of it is needed to build) and looks
 * for a CUDA driver: true when both are here. why[] gets a line naming NCCL, what was found
 * or is missing, and that NCCL is not used (collectives on cuda devices are staged through
 * host memory over Gloo). The outcome of the first call is kept (loop thread). */
bool tdd_nccl_probe(char *why, size_t wn);

#endif
