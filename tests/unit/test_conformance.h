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
 * E gives dim 0 stride 0, C stays contiguous in every variant. attrs: "name=value;..." with [1,2]
 * int lists, 'text' strings, 1.5 floats, true/false, else ints. dtypes: letters s=f32 d=f64 h=f16
 * b=bf16 i=i32 l=i64 o=bool; "" = the op's creation default. tol scales the dtype's tolerance. */
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
    int prep_rc;      /* tdd_op_prepare's code */
    int rc[2];        /* execute codes per backend */
    int supported[2]; /* be->supports said yes */
    int native;       /* cpu ran it with its own kernels */
    int64_t bad;      /* elements out of tolerance (first output mismatch) */
    double worst;     /* largest |diff| / (atol + rtol |ref|) */
    char msg[256];
    td_error prep_err; /* tdd_op_prepare's error when prep_rc != 0 */
} conf_result;

/* variant 0: layouts as written; 1: every input of ndim >= 2 transposed, 1-D strided. */
void conf_run(const conf_case *c, td_dtype dt, int variant, conf_backend *ref, conf_backend *other,
              bool execute, conf_result *res);

/* conf_run with attrs (n_attrs of them) in place of the case's own and outputs bounded
 * by max_numel: the generated attribute-extreme cases. */
void conf_run_attrs(const conf_case *c, td_dtype dt, int variant, conf_backend *ref,
                    conf_backend *other, bool execute, const td_attr *attrs, size_t n_attrs,
                    int64_t max_numel, conf_result *res);

td_dtype conf_dtype_of(char letter);

/* ---- the pieces of conf_run that other harnesses reuse (the wire suite in
 * tests/integration/test_ops_wire.c runs the same table through the daemon) */

/* A case's attribute string as td_attr; the attributes point into the set. */
#define CONF_MAX_ATTRS 12
typedef struct {
    td_attr a[CONF_MAX_ATTRS];
    int64_t ints[CONF_MAX_ATTRS][16];
    char names[CONF_MAX_ATTRS][32], strs[CONF_MAX_ATTRS][32];
    size_t n;
} conf_attrs;

void conf_parse_attrs(const char *s, conf_attrs *as);

/* One input of a case for one dtype: its dtype, logical shape, the layout
 * letter (0 when none; variant 1 fills in T or S) and its numel values in C
 * order of the logical shape: ivals for index inputs (i<N>), vals otherwise. */
typedef struct {
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    char layout;
    int64_t numel;
    double *vals;
    int64_t *ivals; /* NULL unless an index input */
} conf_input;

/* Builds the inputs of case c for dtype dt exactly as conf_run does (same
 * seed per case, so the same values); returns how many (0..4). Free them with
 * conf_inputs_free. */
int conf_inputs(const conf_case *c, td_dtype dt, int variant, conf_input in[4]);
void conf_inputs_free(conf_input in[4], int n);

/* The tolerance of dtype dt scaled by a case's tol (0 and 0: exact). */
void conf_tolerances(td_dtype dt, double tol, double *rtol, double *atol);

/* Elements of other that differ from ref (same shape) beyond tol, as conf_run
 * counts them; the first is described in msg, *worst grows to the largest
 * |diff| / (atol + rtol |ref|). */
int64_t conf_compare(const tdd_tensor *ref, const tdd_tensor *other, double tol, double *worst,
                     char *msg, size_t len);

#endif
