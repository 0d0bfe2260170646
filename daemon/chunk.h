/* chunk.h -- a large kernel run as pieces: views of its output and inputs along one
 * output dim, each piece the same kernel on its rows, so that a lane can run other
 * sessions' work between pieces (exec_op.c). */
#ifndef TDD_CHUNK_H
#define TDD_CHUNK_H

#include <stdbool.h>
#include <stdint.h>

#include "ops.h"

/* How a call splits: rows of a GEMM's output (and of A) with the same K loop, samples of
 * a conv2d, runs of an elementwise op. The plan is a function of the call's shapes and the
 * configuration only, so a request's pieces, and its bits, never depend on the load. */
typedef struct {
    int dim;           /* the output dim split (of the 1-D view when flat) */
    int64_t len, rows; /* that dim's size; rows of the smallest piece (pieces start at multiples) */
    bool flat;         /* dense elementwise: every operand seen as 1-D */
    int arg;           /* which argument holds the split size (CHUNK_ARG_*) */
    int8_t in_dim[TDD_MAX_OP_INPUTS]; /* input k's dim along the split, -1: read whole */
} tdd_chunk_plan;

/* One piece as a call of its own. */
typedef struct {
    tdd_opcall call;
    tdd_opargs args;
    tdd_tensor in[TDD_MAX_OP_INPUTS], out;
} tdd_chunk_piece;

/* Whether c (on a host-memory device) runs in pieces of about elems output elements:
 * when its output has more than elems (0: never) and it splits.
 * blas: the device's GEMMs go through a BLAS, whose pieces are whole blocks of 64 rows
 * (thinner ones cost more than they give: chunk.c). */
bool tdd_chunk_plan_make(const tdd_opcall *c, int64_t elems, bool blas, tdd_chunk_plan *p);
/* Where the piece starting at row lo (a multiple of p->rows) ends: p->rows further, or the
 * end of the dim when less than p->rows would be left. */
int64_t tdd_chunk_piece_end(const tdd_chunk_plan *p, int64_t lo);
/* The piece of c covering rows [lo, hi) of the split dim. */
void tdd_chunk_piece_make(const tdd_chunk_plan *p, const tdd_opcall *c, int64_t lo, int64_t hi,
                          tdd_chunk_piece *pc);

#endif
