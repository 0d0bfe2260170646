/* ops_args.h -- the helpers every tdd_op_prepare file (ops*.c) shares, defined in
 * ops_args.c: what one prepare call works on, attribute readers that name the attribute
 * on error, dim normalisation, broadcasting and output descriptions. */
#ifndef TDD_OPS_ARGS_H
#define TDD_OPS_ARGS_H

#include "ops.h"

/* Everything one tdd_op_prepare call works on. */
typedef struct {
    tdd_op op;
    const char *name;
    const tdd_tensor *const *in;
    int n_in;
    const tdd_opreq *req;
    tdd_opargs *args;
    tdd_outdesc *out;
    int *n_out;
    int64_t max_numel;
    td_error *err;
} tdd_prep;

/* The attribute name as the request gave it, or NULL; every attribute the prepare code
 * reads goes through here (tdd_attr_read_hook sees it). */
const td_attr *tdd_p_get(const tdd_prep *p, const char *name);
/* Attribute readers: absent -> *v = def and 0; present with a wrong kind or
 * value -> INVALID_ARGUMENT naming the attribute. */
int tdd_p_int(const tdd_prep *p, const char *name, int64_t def, int64_t *v);
int tdd_p_float(const tdd_prep *p, const char *name, double def, double *v);
int tdd_p_bool(const tdd_prep *p, const char *name, bool def, bool *v);
int tdd_p_str(const tdd_prep *p, const char *name, const char *def, const char **v);
/* Int list (a single int counts as a list of one); *n = -1 when absent. */
int tdd_p_ints(const tdd_prep *p, const char *name, int64_t *v, int max, int *n);
/* A required attribute that is absent. */
int tdd_p_missing(const tdd_prep *p, const char *name);
/* Wraps a possibly negative dim into [0, ndim) (0-dim tensors accept 0 and -1). */
int tdd_p_dim(const tdd_prep *p, const char *attr, int64_t d, int ndim, int *out);
/* numpy broadcast of two shapes; SHAPE_MISMATCH naming both. */
int tdd_p_bcast(const tdd_prep *p, const int64_t *a, int an, const int64_t *b, int bn, int64_t *o,
                int *on);
/* A non-view output (the daemon allocates it contiguous). */
void tdd_p_out(tdd_prep *p, int k, td_dtype dt, const int64_t *shape, int ndim);
/* A view output of input src. */
void tdd_p_view(tdd_prep *p, int k, int src, const int64_t *shape, const int64_t *strides, int ndim,
                int64_t offset);
/* The dtype asked for (req->dtype, else attribute "dtype"), else def. */
int tdd_p_dtype(const tdd_prep *p, td_dtype def, td_dtype *out);
int tdd_p_unsupported(const tdd_prep *p, td_dtype dt);
/* "shape" attribute checked to be non-negative and within ndim. */
int tdd_p_shape(const tdd_prep *p, const char *name, int64_t *shape, int *ndim);
/* A number attribute a (NULL: nothing to check) that is to be stored in dtype dt, checked
 * as PyTorch checks a fill value: integer dtypes refuse NaN, +-Inf and values past their
 * range, float dtypes a finite value past their largest, bool takes anything.
 * INVALID_ARGUMENT naming the attribute. */
int tdd_p_fits(const tdd_prep *p, const td_attr *a, td_dtype dt);
/* An attribute kind's name ("an int", ...), and INVALID_ARGUMENT for attribute a of the wrong
 * kind (want: what it must be). */
const char *tdd_attr_kind_name(td_attr_kind k);
int tdd_p_wrong_kind(const tdd_prep *p, const td_attr *a, const char *want);

#endif
