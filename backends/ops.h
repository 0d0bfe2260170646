/* ops.h -- the op table: names, arities, kinds, and the shape/attribute rules
 * every backend relies on.
 *
 * An op's facts are columns of tables indexed by op (docs/adding-an-op.md counts the edits):
 * this table (name, arity, kind; views are the kind VIEW, never listed again), the attribute
 * schema (ops_schema.c), the composite column (ops.c, tdd_op_composite: the op run as other
 * ops on every backend), the kernel tables of cpu and cuda (cpu_kernels in cpu/cpu.c,
 * cuda_kernels in cuda/cuda_exec.c), the backward as a call of one op (the schema's grad) and
 * the daemon's backward rows (bw_rows in daemon/autograd_fn.c: formula, saves the output,
 * shape-only).
 *
 * Adding an elementwise op: a row in backends/elementwise.h (its name, arity, dtype rule
 * and scalar expression, which ref, cpu and the CUDA kernels all expand), its schema entry
 * (below), its backward formula (daemon/autograd_fn.c, and its bw_rows row when it saves the
 * output or needs only shapes); the conformance suite generates its cases on every dtype and
 * backend from the table (generated_elementwise).
 *
 * Adding any other op (the recipe): a TDD_OPS line (opcodes.h), its entry in the attribute
 * schema (tdd_op_schema in ops_schema.c: inputs and every attribute; an op without one fails
 * tests/unit/test_attr_schema.c), a case in tdd_op_prepare (ops.c and ops_*.c), then either
 * an entry in the composite column (ops.c: it runs as other ops; no backend edit, as
 * max_pool1d/avg_pool1d) or its kernels: ref (ref/, the oracle: the conformance table holds
 * the others to it), cpu (cpu/ and a cpu_kernels row in cpu/cpu.c: when it runs, its kernel;
 * no row: the documented fallback to the ref kernel), cuda (kernels.cu and a cuda_kernels row; no
 * row: UNSUPPORTED_OP on cuda, as docs/ops.md shows); its backward (daemon/autograd_fn.c); rows in
 * the conformance table (tests/unit/test_conformance_cases.c); make docs.
 *
 * Conventions shared by the ops:
 *  - dims may be negative (counted from the end), as in PyTorch;
 *  - binary elementwise ops broadcast (numpy rules) and promote dtypes as
 *    PyTorch does (bool < integer < floating; a 0-dim tensor or a scalar only
 *    raises the category). Their scalar form is one input plus the attribute
 *    "other" (float, int or bool attr; an int "other" keeps integer tensors
 *    integral). add/sub also take "alpha" (x + alpha*other);
 *  - creation ops have no inputs: dtype from tdd_opreq.dtype (or attribute
 *    "dtype", a numpy name such as "float32"), shape from attribute "shape";
 *    random ops draw from tdd_opreq.seed (same seed -> same values, on ref and cpu);
 *  - reductions take "dim" (int or int list; absent = all dims) and "keepdim";
 *  - "reduction" is "mean" (default), "sum" or "none".
 *
 * Attributes: each op's, with type, default and bounds, are data in tdd_op_schema
 * (ops_schema.c), below as tdd_opschema; docs/ops.md lists them (make docs). Adding an attribute
 * to an op: its row in the op's schema array, then the read in its prepare rule
 * (tdd_p_int & co., ops_args.h); test_attr_schema.c fails when the two disagree.
 */
#ifndef TDD_OPS_H
#define TDD_OPS_H

#include "opcodes.h"
#include "tdd_err.h"
#include "tensor.h"

typedef struct {
    tdd_op op;
    const char *name;
    int min_inputs, max_inputs;
    tdd_opkind kind;
} tdd_opdef;

extern const tdd_opdef tdd_opdefs[TDD_OP_COUNT];

/* The attribute schema: every attribute each op accepts, as data (backends/ops_schema.c,
 * tdd_op_schema). tdd_op_prepare checks a request's attributes against it before any
 * op rule runs: an attribute the op does not accept, one of the wrong type, or one named
 * twice is INVALID_ARGUMENT naming it (and the attributes the op accepts). The types say
 * what the prepare code's readers (ops_args.h) accept: */
typedef enum {
    TDD_AT_INT,         /* an int (a bool, or a one-element int list, also reads as one) */
    TDD_AT_NUM,         /* a number: float, int or bool */
    TDD_AT_BOOL,        /* a bool (an int reads as one: nonzero is true) */
    TDD_AT_INT_OR_INTS, /* an int or an int list (sum's dim, conv2d's stride) */
    TDD_AT_INTS,        /* an int list ("shape", "dims"; a single int is a list of one) */
    TDD_AT_FLOATS,      /* a float list */
    TDD_AT_STR,         /* a string */
    TDD_AT_INTS_OR_STR, /* an int, an int list or a string (conv2d's padding="same") */
} tdd_attrtype;

typedef struct {
    const char *name;
    tdd_attrtype type;
    bool required;      /* absent -> INVALID_ARGUMENT "attribute X is required" (from prepare) */
    const char *def;    /* the default when absent, as documented (NULL when required) */
    const char *bounds; /* the values prepare accepts, as documented (NULL: any of the type) */
    /* scalar attributes (INT, NUM, BOOL, INT_OR_INTS) are tried at their extremes by the
     * conformance generator (tests/unit/test_conformance.c) unless this is set */
    bool no_extremes;
} tdd_attrdef;

typedef struct {
    const char *inputs; /* the op's inputs, as documented ("" for creation ops) */
    const tdd_attrdef *attrs;
    int n_attrs;
    /* ordered scalar pairs the op expects, space-separated "a<=b" (clamp's "min<=max"):
     * the conformance generator also tries each reversed. NULL: none. */
    const char *ordered;
    /* its outputs: how many (0 reads as 1; TDD_OUTPUTS_PIECES: one per piece, known only
     * from the inputs: split, chunk), and an attribute that, given as true, adds one
     * (max_pool2d's "return_indices"); ListOps sends both, so clients need no list */
    int n_outputs;
    const char *outputs_with;
    /* the backward formula (the gradient of input 0) as a call of one op of the table, which a
     * client may also send: "max_pool2d_backward(grad, in0)". Its arguments: grad (output
     * 0's gradient), inK (input K), outK (output K); what backward saves is read off them.
     * The call gets the forward's attributes, after "; new=old" renames them. NULL: the
     * daemon's formula (daemon/autograd_fn.c). */
    const char *grad;
} tdd_opschema;

#define TDD_OUTPUTS_PIECES (-1)

/* How many outputs op makes with these attributes, from its schema; 0 when that depends
 * on the inputs (split, chunk). tdd_op_prepare's count agrees (test_conformance.c). */
int tdd_op_num_outputs(tdd_op op, const td_attr *attrs, size_t n_attrs);

/* Indexed by op; every op has an entry (inputs != NULL; test_optable.c holds it). */
extern const tdd_opschema tdd_op_schema[TDD_OP_COUNT];

/* The schema entry of attribute name for op, or NULL when op does not accept it. */
const tdd_attrdef *tdd_op_attr(tdd_op op, const char *name);

/* The name of an attribute type, as error messages and docs write it ("int or int list"). */
const char *tdd_attrtype_name(tdd_attrtype t);
/* The name of an op kind, as docs/ops.md and ListOps write it ("binary", "reduction"). */
const char *tdd_opkind_name(tdd_opkind k);

/* Debug hook for tests (tests/unit/test_optable.c): when set, called with every attribute
 * name the prepare code reads (present or not). NULL in the daemon. Not thread-safe to
 * change while ops run. */
extern void (*tdd_attr_read_hook)(tdd_op op, const char *name);

/* The op named name, or NULL. */
const tdd_opdef *tdd_op_find(const char *name);

/* Attributes as the client sent them (td_attr from tensordd.h). */
typedef struct {
    const td_attr *a;
    size_t n;
} tdd_attrs;

const td_attr *tdd_attr_get(const tdd_attrs *as, const char *name);

/* Reduction modes of the losses. */
enum { TDD_RED_NONE = 0, TDD_RED_MEAN = 1, TDD_RED_SUM = 2 };

/* Validated, normalised parameters handed to the kernels. Filled by
 * tdd_op_prepare; kernels never see raw client input. Per op:
 *  binary: cdtype compute dtype, scalar_form, f[0] other, f[1] alpha (n[0], n[1] exact ints)
 *  unary: f[0..1] parameters (negative_slope; beta, threshold; min, max), flags bit 0/1 =
 *      has min/max, i[0] gelu approximate (1 = tanh)
 *  reductions: dims_mask, keepdim, i[0] correction, i[1] reduced element count;
 *      cumsum/softmax/argmax with one dim: i[0] dim (argmax i[0] = -1: flattened)
 *  matmul/bmm/linear: i[0] M, i[1] K, i[2] N, i[3] batch ndim, ints[0] batch shape,
 *      flags bit 0/1 = a/b was 1-D, bit 2 = linear has bias; addmm/baddbmm: the same for
 *      the product, f[2], f[3] beta, alpha (n[2], n[3] as ints)
 *  views: out_view (the output is a view: kernels do nothing); a copy otherwise
 *  cat/stack/gather/scatter_add/index_select/split/chunk/tril/triu: i[0] dim or diagonal
 *  sort/argsort/topk: i[0] dim, i[1] descending (topk: largest), i[2] how many of each line
 *      are written (the dim's size; topk: k)
 *  one_hot: i[0] classes   pad: ints[0] per-dim before-pad, f[0] value, i[0] mode (0 constant,
 *      1 reflect, 2 replicate, 3 circular; circular: ints[1], ints[2] the kept input range's
 *      start and length, tdd_pad_at)
 *  losses: i[0] reduction, i[1] ignore_index, f[0] label_smoothing; cross_entropy/nll_loss:
 *      i[2] S (the product of the dims after the class dim 1), flags bit 0 weight (input 2),
 *      bit 1 class-probability targets
 *  layer_norm: i[0] number of normalised dims, f[0] eps, flags bit 0/1 weight/bias
 *  dropout: f[0] p, i[0] train   conv2d/pools: ints[0] stride, ints[1] padding (ints[1][2..3]:
 *      conv2d padding="same"'s one more row/column at the bottom/right of an even span),
 *      ints[2] dilation, ints[3] kernel (pools), i[0] groups, i[1] ceil_mode,
 *      i[2] count_include_pad, flags bit 2 = bias
 *  max_pool2d_backward: max_pool2d's (inputs grad_output, input)
 *  pixel_shuffle/pixel_unshuffle: i[0] the factor (tdd_pixel_src)
 *  adaptive_avg_pool2d: ints[3] the output size (h, w)
 *  group_norm: i[0] groups, f[0] eps, flags bit 0/1 weight/bias
 *  conv1d: conv2d's, for the input seen as [N, C, 1, L] (tdd_conv1d_by_parts)
 *  max_pool1d/avg_pool1d: max_pool2d's/avg_pool2d's, for the input seen as [N, C, 1, L]
 *      (tdd_pool1d_by_parts)
 *  conv_transpose2d: ints[0] stride, ints[1] padding, ints[2] dilation, ints[3] output_padding,
 *      i[0] groups, flags bit 2 = bias
 *  scaled_dot_product_attention: f[0] dropout_p, f[1] scale, i[0] is_causal, i[1] mask (0 none,
 *      1 bool, 2 added), i[2..5] L, S, E, Ev, i[6] batch ndim, ints[0] the batch shape; the
 *      dropout draw of weight (b, l, s) is tdd_rng_uniform(seed, its C-order index in
 *      [batch..., L, S]), as dropout's over that shape
 *  batch_norm: inputs input, running_mean, running_var, weight, bias (the last four
 *      optional, in that order); i[0] training, f[0] eps, f[1] momentum, flags bit 0/1/2
 *      running stats/weight/bias; training with running stats updates inputs 1, 2 in place
 *      (inplace_in)
 *  interpolate: i[0] mode (0 nearest, 1 linear/bilinear), i[1] align_corners, i[2] spatial
 *      dims (1 or 2), ints[0] the output's spatial sizes, f[0..1] each dim's scale as
 *      tdd_interp_src takes it (PyTorch's: in/out, 1/scale_factor, or (in-1)/(out-1))
 *  creation: f[0..2] value/start/end/step, n[0..2] exact ints, i[0..1] eye n, m */
typedef struct tdd_opargs {
    td_dtype dtype;  /* output dtype */
    td_dtype cdtype; /* dtype the kernel computes in (binary ops: promoted inputs) */
    bool scalar_form;
    bool out_view;
    bool keepdim;
    uint32_t flags;
    uint32_t dims_mask; /* reductions: bit d set = reduce dim d */
    double f[4];
    int64_t n[4];
    int64_t i[8];
    int64_t ints[4][TD_MAX_NDIM];
    uint64_t seed;
    /* bit k: the kernel also writes input k in place (dense; batch_norm's running stats):
     * the daemon counts it as an in-place update of that input and orders its readers */
    uint32_t inplace_in;
} tdd_opargs;

/* What the daemon passes to tdd_op_prepare. */
typedef struct {
    tdd_attrs attrs;
    td_dtype dtype; /* requested dtype (creation ops, cast); 0 = default */
    uint64_t seed;  /* per-session RNG stream value for random ops */
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
 * out[0..*n_out) (out has room for TDD_MAX_OP_OUTPUTS). On failure returns a
 * TD_E* code and fills err with a message and typed detail (SHAPE_MISMATCH
 * with both shapes, INVALID_ARGUMENT naming the attribute, ...). Device
 * agreement between inputs is checked by the caller. max_numel bounds every
 * output. Data-dependent checks (class and index values in range) are made
 * by the kernels, which return TD_EINVALID_ARGUMENT. */
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

/* clamp with tensor bounds (inputs input, min[, max]) as the backends run it: maximum into
 * the output, then minimum in place, each through run (a backend's execute). */
typedef int (*tdd_run_fn)(void *ctx, int ordinal, const tdd_opcall *c);
int tdd_clamp_by_tensors(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal);
/* max/min(dim) as the backends run them: amax/amin into output 0, argmax/argmin into 1. */
int tdd_max_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal);
/* addmm/baddbmm as the backends run them: matmul/bmm into the output, times alpha, plus
 * beta * input (tdd_opargs f[2], f[3]: beta, alpha; n[2], n[3] the same as exact ints). */
int tdd_addmm_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal);
/* conv1d as the backends run it: conv2d on [N, C, 1, L] views (the arguments are conv2d's). */
int tdd_conv1d_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal);
/* max_pool1d/avg_pool1d as the backends run them: max_pool2d/avg_pool2d on [N, C, 1, L] views
 * (the arguments are the 2-D pool's). */
int tdd_pool1d_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal);

/* The op table's composite column: how call c runs as other ops of the table (one of the
 * by_parts helpers above), or NULL when the backend's own kernel runs it. Every backend's
 * execute asks first and passes itself as run, so a composite op needs no backend edit;
 * supports() answers for a composite as for its parts (the parts are asked again as they
 * run). */
typedef int (*tdd_composite_fn)(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal);
tdd_composite_fn tdd_op_composite(const tdd_opcall *c);

/* tdd_err_set & co., the error builders every layer uses: common/tdd_err.h. */

/* The values integer dtype dt holds (bool: 0, 1; int64 and the floats: int64's). */
void tdd_int_range(td_dtype dt, int64_t *lo, int64_t *hi);

/* PyTorch's type promotion of two dtypes (bool < ints < floats; uint8+int8 = int16;
 * f16+bf16 = f32). */
td_dtype tdd_promote(td_dtype a, td_dtype b);

#endif
