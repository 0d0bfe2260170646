/* chunk.h -- a large kernel run as pieces: views of its output and inputs along one
 * output dim, each piece the same kernel on its rows, so that a lane can run other
 * sessions' work between pieces (exec_op.c). */
#ifndef TDD_CHUNK_H
#define TDD_CHUNK_H

#include <stdbool.h>
#include <stdint.h>

#include "ops.h"

/* How a call splits. Only splits where every output element is computed by the same
 * arithmetic as in the whole call are planned: rows of a GEMM's output (and of A) with
 * the same K loop, samples of a conv2d, runs of an elementwise op. */
typedef struct {
    int dim;           /* the output dim split (of the 1-D view when flat) */
    int64_t len, rows; /* that dim's size; rows per piece (the last takes the rest) */
    int pieces;        /* 1: run whole */
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

/* Plans c (on a host-memory device) in pieces of about elems output elements when its
 * output has more than elems (0: never); returns the number of pieces, 1 when whole.
 * blas: the device's GEMMs (matmul, conv) go through OpenBLAS, which is split only on
 * its tile grid (chunk.c says why). */
int tdd_chunk_plan_make(const tdd_opcall *c, int64_t elems, bool blas, tdd_chunk_plan *p);
/* Piece k of c under p. */
void tdd_chunk_piece_make(const tdd_chunk_plan *p, const tdd_opcall *c, int k, tdd_chunk_piece *pc);

#endif
