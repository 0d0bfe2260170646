/* test_conformance.h -- the conformance harness shared by the Check suite
 * (test_conformance.c) and the op-coverage generator (tools/opcoverage.c):
 * the case table and a runner that executes one case on two backends. */
#ifndef TDD_TEST_CONFORMANCE_H
#define TDD_TEST_CONFORMANCE_H

#include "backend.h"

/* One row of the table. inputs: "<kind>:<shape>[layout]" where kind is
 * x (random data of the case dtype), p (positive data of the case dtype),
 * i<N> (int64 in [0, N)), b (bool), f (float32) and shape is "2,3" ("" for
 * 0-dim); layout T stores the last two dims swapped, S every other element,
 * E gives dim 0 stride 0, C stays contiguous in every variant. attrs: "name=value;..." with [1,2] int lists,
 * 'text' strings, 1.5 floats, true/false, else ints. dtypes: letters
 * s=f32 d=f64 h=f16 b=bf16 i=i32 l=i64 o=bool; "" = the op's creation
 * default. tol scales the dtype's tolerance. */
typedef struct {
    const char *op;
    const char *inputs[4];
    const char *attrs;
    const char *dtypes;
    double tol;
} conf_case;

extern const conf_case conf_cases[];
extern const int conf_ncases;

typedef struct {
    const tdd_backend *be;
    void *ctx;
} conf_backend;

/* Result of running one case for one dtype and layout variant. */
typedef struct {
    int prep_rc;            /* tdd_op_prepare's code */
    int rc[2];              /* execute codes per backend */
    int supported[2];       /* be->supports said yes */
    int native;             /* cpu ran it with its own kernels */
    int64_t bad;            /* elements out of tolerance (first output mismatch) */
    double worst;           /* largest |diff| / (atol + rtol |ref|) */
    char msg[256];
} conf_result;

/* variant 0: layouts as written; 1: every input of ndim >= 2 transposed, 1-D strided. */
void conf_run(const conf_case *c, td_dtype dt, int variant, conf_backend *ref,
              conf_backend *other, bool execute, conf_result *res);

td_dtype conf_dtype_of(char letter);

#endif
