/* ops.h -- the op table: names, arities, and the shape/attribute rules every
 * backend relies on. Adding an op (the recipe): a TDD_OPS line here, a case
 * in tdd_op_prepare (ops.c), a ref kernel (ref/ref.c), a cpu kernel
 * (cpu/cpu.c). The kernels' switches have no default, so the compiler names
 * any backend that forgot an op. */
#ifndef TDD_OPS_H
#define TDD_OPS_H

#include "tensor.h"

#define TDD_MAX_OP_INPUTS 8
#define TDD_MAX_OP_OUTPUTS 8

/* X(ENUM, "name", min_inputs, max_inputs) -- names are PyTorch's. */
#define TDD_OPS(X)                                                                                 \
    X(ADD, "add", 2, 2)                                                                            \
    X(SUB, "sub", 2, 2)                                                                            \
    X(MUL, "mul", 2, 2)                                                                            \
    X(DIV, "div", 2, 2)                                                                            \
    X(MATMUL, "matmul", 2, 2)                                                                      \
    X(SUM, "sum", 1, 1)                                                                            \
    X(RELU, "relu", 1, 1)

typedef enum {
#define TDD__OP_ENUM(e, name, lo, hi) TDD_OP_##e,
    TDD_OPS(TDD__OP_ENUM)
#undef TDD__OP_ENUM
        TDD_OP_COUNT
} tdd_op;

typedef struct {
    tdd_op op;
    const char *name;
    int min_inputs, max_inputs;
} tdd_opdef;

extern const tdd_opdef tdd_opdefs[TDD_OP_COUNT];

/* The op named name, or NULL. */
const tdd_opdef *tdd_op_find(const char *name);

/* Attributes as the client sent them (td_attr from tensordd.h). */
typedef struct {
    const td_attr *a;
    size_t n;
} tdd_attrs;

const td_attr *tdd_attr_get(const tdd_attrs *as, const char *name);

/* Validated, normalised parameters handed to the kernels. Filled by
 * tdd_op_prepare; kernels never see raw client input. */
typedef struct tdd_opargs {
    td_dtype dtype; /* output dtype */
    double scalar[4];
    int64_t i[4];
    uint32_t dims_mask; /* reductions: bit d set = reduce dim d */
    bool keepdim;
    int64_t ints[4][TD_MAX_NDIM];
    uint64_t seed;
} tdd_opargs;

/* What the daemon passes to tdd_op_prepare. */
typedef struct {
    tdd_attrs attrs;
    td_dtype dtype;   /* requested dtype (creation ops, cast); 0 = default */
    uint64_t seed;    /* per-session RNG stream value for random ops */
} tdd_opreq;

/* One output description: dtype and shape; view != 0 means the output is a
 * view of input view_of sharing its storage with the given strides/offset. */
typedef struct {
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    bool view;
    int view_of;
    int64_t strides[TD_MAX_NDIM];
    int64_t offset;
} tdd_outdesc;

/* Checks inputs' metadata (dtypes, shapes) and attributes; fills args and
 * out[0..*n_out). On failure returns a TD_E* code and fills err with a
 * message and typed detail (SHAPE_MISMATCH with both shapes,
 * INVALID_ARGUMENT naming the attribute, ...). Device agreement between
 * inputs is checked by the caller. max_numel bounds every output. */
int tdd_op_prepare(tdd_op op, const tdd_tensor *const *in, int n_in, const tdd_opreq *req,
                   int64_t max_numel, tdd_opargs *args, tdd_outdesc *out, int *n_out,
                   td_error *err);

/* One op ready to run: validated arguments, inputs and allocated outputs. */
typedef struct tdd_opcall {
    tdd_op op;
    const tdd_opargs *args;
    int n_in, n_out;
    const tdd_tensor *in[TDD_MAX_OP_INPUTS];
    tdd_tensor *out[TDD_MAX_OP_OUTPUTS];
} tdd_opcall;

/* Helpers for error filling (printf-style message). */
int tdd_err_set(td_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tdd_err_shape(td_error *err, const int64_t *expected, int en, const int64_t *got, int gn,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
int tdd_err_arg(td_error *err, const char *argument, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
