/* cpu.h -- private to the cpu backend. */
#ifndef TDD_CPU_H
#define TDD_CPU_H

#include "backend.h"
#include "iter.h"

/* Below this many elements a loop runs on one thread: waking the team costs more. */
#define CPU_PAR_MIN 32768

/* True if the cpu backend runs this call with its own threaded kernels;
 * false if it hands it to the reference kernels (tdd_ref_run). Used by
 * execute and by the op-coverage table. */
bool tdd_cpu_native(const tdd_opcall *c);

/* Runs fn over every run of it, split across nt threads when large. */
void cpu_par_iter(const tdd_iter *it, tdd_iter_fn fn, void *ctx, int nt);

int cpu_elementwise(const tdd_opcall *c, int nt); /* cpu_elem.c */
int cpu_copy(const tdd_opcall *c, int nt);        /* cpu_elem.c */
int cpu_create(const tdd_opcall *c, int nt);      /* cpu_elem.c */
int cpu_reduce(const tdd_opcall *c, int nt);      /* cpu_reduce.c */
int cpu_lines(const tdd_opcall *c, int nt);       /* cpu_reduce.c: cumsum, softmax */
int cpu_matmul(const tdd_opcall *c);              /* cpu_blas.c */

#endif
