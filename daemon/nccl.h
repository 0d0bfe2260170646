/* nccl.h -- NCCL, loaded at run time for process groups on cuda devices (group.c). */
#ifndef TDD_NCCL_H
#define TDD_NCCL_H

#include <stddef.h>

/* Loads NCCL (libnccl.so.2, the CUDA toolkit's; nothing of it is needed to build) and
 * checks what it needs to run: a CUDA driver. 0 when collectives on cuda devices can run;
 * else a TD_E* code with why[] naming NCCL and what is missing. The outcome of the first
 * call is kept (loop thread). */
int tdd_nccl_load(char *why, size_t wn);

#endif
