/* ops.c -- the op table, attribute and error helpers, dtype promotion, and
 * tdd_op_prepare with the elementwise and reduction rules (views, indexing,
 * NN and creation rules live in ops_shape.c and ops_nn.c). */
#include "ops.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "ops_impl.h"
#include "td_error_set.h"

const tdd_opdef tdd_opdefs[TDD_OP_COUNT] = {
#define TDD__OP_DEF(e, nm, lo, hi, kind) [TDD_OP_##e] = {TDD_OP_##e, nm, lo, hi, TDD_KIND_##kind},
    TDD_OPS(TDD__OP_DEF)
#undef TDD__OP_DEF
};

/* ------------------------------------------------------------------ attribute schema */

/* One attribute: A(name, type, default, bounds) optional, R(name, type, bounds) required;
 * AX/RX: the same, left out of the conformance generator's extremes. */
#define A(nm, ty, def, bnd)                                                                        \
    {                                                                                              \
        nm, TDD_AT_##ty, false, def, bnd, false                                                    \
    }
#define R(nm, ty, bnd)                                                                             \
    {                                                                                              \
        nm, TDD_AT_##ty, true, NULL, bnd, false                                                    \
    }
#define AX(nm, ty, def, bnd)                                                                       \
    {                                                                                              \
        nm, TDD_AT_##ty, false, def, bnd, true                                                     \
    }
#define DTYPE_NAMES                                                                                \
    "float32|float|float64|double|float16|half|bfloat16|int32|int|int64|long|bool|uint8|int8|"     \
    "int16|short"
/* creation ops: the dtype as a numpy name, when the request's dtype field is not set */
#define DTYPE_ATTR(def) AX("dtype", STR, def, DTYPE_NAMES)
#define REDUCTION_ATTR A("reduction", STR, "\"mean\"", "mean|sum|none")

static const tdd_attrdef s_add[] = {
    A("other", NUM, "(the second input)", "required without a second input"),
    A("alpha", NUM, "1", "an int for integral inputs")};
static const tdd_attrdef s_binary[] = {
    A("other", NUM, "(the second input)", "required without a second input")};
static const tdd_attrdef s_masked_fill[] = {A(
    "value", NUM, "(the third input)", "required without a value tensor; fits the input's dtype")};
static const tdd_attrdef s_leaky_relu[] = {A("negative_slope", NUM, "0.01", NULL)};
static const tdd_attrdef s_gelu[] = {A("approximate", STR, "\"none\"", "none|tanh")};
static const tdd_attrdef s_softplus[] = {A("beta", NUM, "1", "!= 0"),
                                         A("threshold", NUM, "20", NULL)};
static const tdd_attrdef s_clamp[] = {
    A("min", NUM, "(none; at least one of min, max)", "not with tensor bounds"),
    A("max", NUM, "(none; at least one of min, max)", "not with tensor bounds")};
static const tdd_attrdef s_reduce[] = {A("dim", INT_OR_INTS, "all dims", "each in [-ndim, ndim)"),
                                       A("keepdim", BOOL, "false", NULL)};
static const tdd_attrdef s_varstd[] = {
    A("dim", INT_OR_INTS, "all dims", "each in [-ndim, ndim)"), A("keepdim", BOOL, "false", NULL),
    A("unbiased", BOOL, "true", NULL), A("correction", NUM, "1 (0 when unbiased=false)", NULL)};
static const tdd_attrdef s_argmax[] = {A("dim", INT, "flattened", "[-ndim, ndim)"),
                                       A("keepdim", BOOL, "false", NULL)};
static const tdd_attrdef s_dim_req[] = {R("dim", INT, "[-ndim, ndim)")};
static const tdd_attrdef s_max_dim[] = {R("dim", INT, "[-ndim, ndim) (no dim: amax/amin)"),
                                        A("keepdim", BOOL, "false", NULL)};
static const tdd_attrdef s_sum_to[] = {R("shape", INTS, "the input broadcasts from it")};
static const tdd_attrdef s_transpose[] = {R("dim0", INT, "[-ndim, ndim)"),
                                          R("dim1", INT, "[-ndim, ndim)")};
static const tdd_attrdef s_permute[] = {R("dims", INTS, "a permutation of the dims")};
static const tdd_attrdef s_shape[] = {R("shape", INTS, "one -1 allowed; same element count")};
static const tdd_attrdef s_flatten[] = {A("start_dim", INT, "0", "[-ndim, ndim)"),
                                        A("end_dim", INT, "-1", ">= start_dim")};
static const tdd_attrdef s_squeeze[] = {
    A("dim", INT_OR_INTS, "every size-1 dim", "each in [-ndim, ndim)")};
static const tdd_attrdef s_unsqueeze[] = {R("dim", INT, "[-ndim-1, ndim]")};
static const tdd_attrdef s_expand[] = {R("shape", INTS, "-1 keeps a dim")};
static const tdd_attrdef s_slice[] = {
    A("dim", INT, "0", "[-ndim, ndim)"), A("start", INT, "0", "clamped to the dim"),
    A("stop", INT, "the dim's size", "clamped to the dim"), A("step", INT, "1", ">= 1")};
static const tdd_attrdef s_split[] = {
    A("split_size", INT_OR_INTS, "(required unless split_sizes)",
      ">= 1, or sizes summing to the dim"),
    AX("split_sizes", INTS, "(required unless split_size)", "sizes summing to the dim"),
    A("dim", INT, "0", "[-ndim, ndim)")};
static const tdd_attrdef s_chunk[] = {R("chunks", INT, ">= 1"),
                                      A("dim", INT, "0", "[-ndim, ndim)")};
static const tdd_attrdef s_cast[] = {
    AX("dtype", STR, "(required: this or the request's dtype field)", DTYPE_NAMES)};
static const tdd_attrdef s_cat[] = {A("dim", INT, "0", "[-ndim, ndim) (stack: [-ndim-1, ndim])")};
static const tdd_attrdef s_one_hot[] = {R("num_classes", INT, ">= 1")};
static const tdd_attrdef s_embedding_bag[] = {
    A("mode", STR, "\"mean\"", "sum|mean|max"),
    AX("padding_idx", INT, "none", "[-num, num): its entries are left out (of the mean too)"),
    A("include_last_offset", BOOL, "false", "offsets has bags + 1 entries, the last one n")};
static const tdd_attrdef s_multinomial[] = {
    R("num_samples", INT, ">= 1; at most the categories without replacement"),
    A("replacement", BOOL, "false", NULL)};
static const tdd_attrdef s_diagonal[] = {A("diagonal", INT, "0", NULL)};
static const tdd_attrdef s_pad[] = {
    R("pad", INTS, "pairs, last dim first (left, right, top, bottom, ...)"),
    A("mode", STR, "\"constant\"",
      "constant|reflect|replicate|circular (these pad the last 1-3 dims of a (batched) input)"),
    A("value", NUM, "0", "fits the input's dtype; mode constant only")};
static const tdd_attrdef s_sort[] = {A("dim", INT, "-1", "[-ndim, ndim)"),
                                     A("descending", BOOL, "false", NULL),
                                     A("stable", BOOL, "false", "every sort here is stable")};
static const tdd_attrdef s_topk[] = {
    R("k", INT, "[0, the dim's size]"), A("dim", INT, "-1", "[-ndim, ndim)"),
    A("largest", BOOL, "true", NULL), A("sorted", BOOL, "true", "the k come sorted either way")};
static const tdd_attrdef s_addmm[] = {A("beta", NUM, "1", "an int for integral inputs"),
                                      A("alpha", NUM, "1", "an int for integral inputs")};
static const tdd_attrdef s_adaptive[] = {R("output_size", INT_OR_INTS, ">= 1; an int or (h, w)")};
static const tdd_attrdef s_group_norm[] = {R("num_groups", INT, ">= 1, divides the channels"),
                                           A("eps", NUM, "1e-5", NULL)};
static const tdd_attrdef s_batch_norm[] = {
    A("training", BOOL, "false", "true: the batch's statistics (and the running ones updated)"),
    A("momentum", NUM, "0.1", "the running stats' update factor"), A("eps", NUM, "1e-5", NULL)};
static const tdd_attrdef s_cross_entropy[] = {REDUCTION_ATTR, A("ignore_index", INT, "-100", NULL),
                                              A("label_smoothing", NUM, "0", "[0, 1]")};
static const tdd_attrdef s_nll_loss[] = {REDUCTION_ATTR, A("ignore_index", INT, "-100", NULL)};
static const tdd_attrdef s_loss[] = {REDUCTION_ATTR};
static const tdd_attrdef s_layer_norm[] = {R("normalized_shape", INTS, "the input's trailing dims"),
                                           A("eps", NUM, "1e-5", NULL)};
static const tdd_attrdef s_dropout[] = {A("p", NUM, "0.5", "[0, 1]"),
                                        A("train", BOOL, "true", NULL)};
static const tdd_attrdef s_sdpa[] = {
    A("dropout_p", NUM, "0", "[0, 1]; draws from the session's random stream"),
    A("is_causal", BOOL, "false", "not with attn_mask"), AX("scale", NUM, "1/sqrt(E)", "finite")};
static const tdd_attrdef s_interp[] = {
    A("size", INT_OR_INTS, "(from scale_factor)", ">= 1 each; one per spatial dim"),
    A("scale_factor", FLOATS, "(from size)", "> 0, one per spatial dim; not with size"),
    A("mode", STR, "\"nearest\"", "nearest|linear (3-D)|bilinear (4-D)"),
    A("align_corners", BOOL, "false", "linear modes only")};
static const tdd_attrdef s_conv2d[] = {
    A("stride", INT_OR_INTS, "1", ">= 1; an int or (h, w)"),
    A("padding", INTS_OR_STR, "0", ">= 0; an int, (h, w), \"same\" (stride 1) or \"valid\""),
    A("dilation", INT_OR_INTS, "1", ">= 1; an int or (h, w)"),
    A("groups", INT, "1", "divides the channels")};
static const tdd_attrdef s_conv1d[] = {
    A("stride", INT_OR_INTS, "1", ">= 1; an int or (l,)"),
    A("padding", INTS_OR_STR, "0", ">= 0; an int, (l,), \"same\" (stride 1) or \"valid\""),
    A("dilation", INT_OR_INTS, "1", ">= 1; an int or (l,)"),
    A("groups", INT, "1", "divides the channels")};
static const tdd_attrdef s_conv_transpose2d[] = {
    A("stride", INT_OR_INTS, "1", ">= 1; an int or (h, w)"),
    A("padding", INT_OR_INTS, "0", ">= 0; an int or (h, w)"),
    A("output_padding", INT_OR_INTS, "0", "smaller than stride or dilation; an int or (h, w)"),
    A("groups", INT, "1", "divides the channels"),
    A("dilation", INT_OR_INTS, "1", ">= 1; an int or (h, w)")};
static const tdd_attrdef s_max_pool2d[] = {
    R("kernel_size", INT_OR_INTS, ">= 1; an int or (h, w)"),
    A("stride", INT_OR_INTS, "kernel_size", ">= 1; an int or (h, w)"),
    A("padding", INT_OR_INTS, "0", "<= kernel_size / 2"),
    A("dilation", INT_OR_INTS, "1", ">= 1; an int or (h, w)"),
    A("ceil_mode", BOOL, "false", NULL),
    AX("return_indices", BOOL, "false", "true adds an int64 output (flat index into H*W)")};
static const tdd_attrdef s_avg_pool2d[] = {
    R("kernel_size", INT_OR_INTS, ">= 1; an int or (h, w)"),
    A("stride", INT_OR_INTS, "kernel_size", ">= 1; an int or (h, w)"),
    A("padding", INT_OR_INTS, "0", "<= kernel_size / 2"), A("ceil_mode", BOOL, "false", NULL),
    A("count_include_pad", BOOL, "true", NULL)};
static const tdd_attrdef s_full[] = {
    R("shape", INTS, ">= 0 each"),
    R("value", NUM, "fits the dtype"),
    DTYPE_ATTR("int64 for an int value, bool for a bool, else float32"),
};
static const tdd_attrdef s_create_shape[] = {R("shape", INTS, ">= 0 each"), DTYPE_ATTR("float32")};
static const tdd_attrdef s_arange[] = {
    A("start", NUM, "0", "finite"),
    R("end", NUM, "finite"),
    A("step", NUM, "1", "finite, != 0"),
    DTYPE_ATTR("int64 when start, end and step are ints, else float32"),
};
static const tdd_attrdef s_linspace[] = {A("start", NUM, "0", NULL), A("end", NUM, "0", NULL),
                                         R("steps", INT, ">= 0"), DTYPE_ATTR("float32")};
static const tdd_attrdef s_eye[] = {R("n", INT, ">= 0"), A("m", INT, "n", ">= 0"),
                                    DTYPE_ATTR("float32")};
static const tdd_attrdef s_randint[] = {A("low", INT, "0", "< high"), R("high", INT, "> low"),
                                        R("shape", INTS, ">= 0 each"), DTYPE_ATTR("int64")};

#define S(in, arr)                                                                                 \
    {                                                                                              \
        in, arr, (int)(sizeof arr / sizeof arr[0]), NULL                                           \
    }
#define S_ORD(in, arr, ord)                                                                        \
    {                                                                                              \
        in, arr, (int)(sizeof arr / sizeof arr[0]), ord                                            \
    }
#define S_NONE(in)                                                                                 \
    {                                                                                              \
        in, NULL, 0, NULL                                                                          \
    }
#define BIN_IN "input, other (optional: the attribute other instead)"
#define RED_IN "input"

const tdd_opschema tdd_op_schema[TDD_OP_COUNT] = {
    [TDD_OP_ADD] = S(BIN_IN, s_add),
    [TDD_OP_SUB] = S(BIN_IN, s_add),
    [TDD_OP_MUL] = S(BIN_IN, s_binary),
    [TDD_OP_DIV] = S(BIN_IN, s_binary),
    [TDD_OP_POW] = S(BIN_IN, s_binary),
    [TDD_OP_MAXIMUM] = S(BIN_IN, s_binary),
    [TDD_OP_MINIMUM] = S(BIN_IN, s_binary),
    [TDD_OP_REMAINDER] = S(BIN_IN, s_binary),
    [TDD_OP_EQ] = S(BIN_IN, s_binary),
    [TDD_OP_NE] = S(BIN_IN, s_binary),
    [TDD_OP_LT] = S(BIN_IN, s_binary),
    [TDD_OP_LE] = S(BIN_IN, s_binary),
    [TDD_OP_GT] = S(BIN_IN, s_binary),
    [TDD_OP_GE] = S(BIN_IN, s_binary),
    [TDD_OP_LOGICAL_AND] = S(BIN_IN, s_binary),
    [TDD_OP_LOGICAL_OR] = S(BIN_IN, s_binary),
    [TDD_OP_LOGICAL_XOR] = S(BIN_IN, s_binary),
    [TDD_OP_ATAN2] = S(BIN_IN, s_binary),
    [TDD_OP_WHERE] = S_NONE("condition (bool), input, other"),
    [TDD_OP_MASKED_FILL] = S("input, mask (bool; broadcasts with the input), value (optional: 0-d, "
                             "instead of the attribute)",
                             s_masked_fill),
    [TDD_OP_RELU_BACKWARD] = S_NONE("grad, input"),
    [TDD_OP_NEG] = S_NONE("input"),
    [TDD_OP_ABS] = S_NONE("input"),
    [TDD_OP_SIGN] = S_NONE("input"),
    [TDD_OP_EXP] = S_NONE("input"),
    [TDD_OP_LOG] = S_NONE("input"),
    [TDD_OP_LOG1P] = S_NONE("input"),
    [TDD_OP_EXPM1] = S_NONE("input"),
    [TDD_OP_SQRT] = S_NONE("input"),
    [TDD_OP_RSQRT] = S_NONE("input"),
    [TDD_OP_SIN] = S_NONE("input"),
    [TDD_OP_COS] = S_NONE("input"),
    [TDD_OP_TANH] = S_NONE("input"),
    [TDD_OP_SIGMOID] = S_NONE("input"),
    [TDD_OP_RELU] = S_NONE("input"),
    [TDD_OP_LEAKY_RELU] = S("input", s_leaky_relu),
    [TDD_OP_GELU] = S("input", s_gelu),
    [TDD_OP_SILU] = S_NONE("input"),
    [TDD_OP_SOFTPLUS] = S("input", s_softplus),
    [TDD_OP_CLAMP] =
        S_ORD("input, min (optional tensor), max (optional tensor; with min)", s_clamp, "min<=max"),
    [TDD_OP_FLOOR] = S_NONE("input"),
    [TDD_OP_CEIL] = S_NONE("input"),
    [TDD_OP_ROUND] = S_NONE("input"),
    [TDD_OP_RECIPROCAL] = S_NONE("input"),
    [TDD_OP_SQUARE] = S_NONE("input"),
    [TDD_OP_LOGICAL_NOT] = S_NONE("input"),
    [TDD_OP_SUM] = S(RED_IN, s_reduce),
    [TDD_OP_MEAN] = S(RED_IN, s_reduce),
    [TDD_OP_AMAX] = S(RED_IN, s_reduce),
    [TDD_OP_AMIN] = S(RED_IN, s_reduce),
    [TDD_OP_ARGMAX] = S(RED_IN, s_argmax),
    [TDD_OP_ARGMIN] = S(RED_IN, s_argmax),
    [TDD_OP_MAX] = S("input (outputs: values, int64 indices)", s_max_dim),
    [TDD_OP_MIN] = S("input (outputs: values, int64 indices)", s_max_dim),
    [TDD_OP_VAR] = S(RED_IN, s_varstd),
    [TDD_OP_STD] = S(RED_IN, s_varstd),
    [TDD_OP_LOGSUMEXP] = S(RED_IN, s_reduce),
    [TDD_OP_PROD] = S(RED_IN, s_reduce),
    [TDD_OP_SUM_TO] = S(RED_IN, s_sum_to),
    [TDD_OP_CUMSUM] = S(RED_IN, s_dim_req),
    [TDD_OP_SOFTMAX] = S(RED_IN, s_dim_req),
    [TDD_OP_LOG_SOFTMAX] = S(RED_IN, s_dim_req),
    [TDD_OP_MATMUL] = S_NONE("input, other"),
    [TDD_OP_BMM] = S_NONE("input [B, N, M], other [B, M, P]"),
    [TDD_OP_LINEAR] = S_NONE("input, weight [out, in], bias [out] (optional)"),
    [TDD_OP_ADDMM] = S("input (broadcasts to [N, P]), mat1 [N, M], mat2 [M, P]", s_addmm),
    [TDD_OP_BADDBMM] =
        S("input (broadcasts to [B, N, P]), batch1 [B, N, M], batch2 [B, M, P]", s_addmm),
    [TDD_OP_TRANSPOSE] = S("input", s_transpose),
    [TDD_OP_PERMUTE] = S("input", s_permute),
    [TDD_OP_RESHAPE] = S("input", s_shape),
    [TDD_OP_VIEW] = S("input", s_shape),
    [TDD_OP_FLATTEN] = S("input", s_flatten),
    [TDD_OP_SQUEEZE] = S("input", s_squeeze),
    [TDD_OP_UNSQUEEZE] = S("input", s_unsqueeze),
    [TDD_OP_EXPAND] = S("input", s_expand),
    [TDD_OP_SLICE] = S_ORD("input", s_slice, "start<=stop"),
    [TDD_OP_CONTIGUOUS] = S_NONE("input"),
    [TDD_OP_DETACH] = S_NONE("input"),
    [TDD_OP_SPLIT] = S("input", s_split),
    [TDD_OP_CHUNK] = S("input", s_chunk),
    [TDD_OP_CLONE] = S_NONE("input"),
    [TDD_OP_CAST] = S("input", s_cast),
    [TDD_OP_CAT] = S("tensors (1 to 16)", s_cat),
    [TDD_OP_STACK] = S("tensors (1 to 16)", s_cat),
    [TDD_OP_GATHER] = S("input, index (int64)", s_dim_req),
    [TDD_OP_SCATTER_ADD] = S("input, index (int64), src", s_dim_req),
    [TDD_OP_INDEX_SELECT] = S("input, index (int64, 1-D)", s_dim_req),
    [TDD_OP_ONE_HOT] = S("index (int64)", s_one_hot),
    [TDD_OP_EMBEDDING] = S_NONE("indices (int64), weight [num, dim]"),
    [TDD_OP_EMBEDDING_BAG] = S("input [n] (int64/int32), weight [num, dim], offsets [bags] (bags "
                               "+ 1 with include_last_offset), per_sample_weights [n] (optional, "
                               "mode sum)",
                               s_embedding_bag),
    [TDD_OP_EMBEDDING_BAG_BACKWARD] = S(
        "grad [bags, dim], input, offsets, weight, per_sample_weights (optional): embedding_bag's "
        "weight gradient [num, dim]",
        s_embedding_bag),
    [TDD_OP_MULTINOMIAL] = S("input [C] or [R, C]: non-negative weights, each row's sum > 0; "
                             "int64 [k] or [R, k] drawn from the session's random stream",
                             s_multinomial),
    [TDD_OP_TRIL] = S("input (>= 2-D)", s_diagonal),
    [TDD_OP_TRIU] = S("input (>= 2-D)", s_diagonal),
    [TDD_OP_PAD] = S("input", s_pad),
    [TDD_OP_SORT] = S("input (outputs: values, int64 indices)", s_sort),
    [TDD_OP_ARGSORT] = S("input (output: int64 indices)", s_sort),
    [TDD_OP_TOPK] = S("input (outputs: values, int64 indices)", s_topk),
    [TDD_OP_CROSS_ENTROPY] =
        S("input [N, C, d...] or [C], target (int64 [N, d...] or []; or class probabilities "
          "shaped as the input), weight [C] (optional)",
          s_cross_entropy),
    [TDD_OP_NLL_LOSS] = S("logp [N, C, d...] or [C], target (int64) [N, d...] or [], "
                          "weight [C] (optional)",
                          s_nll_loss),
    [TDD_OP_MSE_LOSS] = S("input, target", s_loss),
    [TDD_OP_BCE_WITH_LOGITS] = S("input, target", s_loss),
    [TDD_OP_LAYER_NORM] = S("input, weight (optional), bias (optional)", s_layer_norm),
    [TDD_OP_GROUP_NORM] =
        S("input [N, C, *], weight [C] (optional), bias [C] (optional, with weight)", s_group_norm),
    [TDD_OP_BATCH_NORM] = S("input [N, C, *], running_mean [C], running_var [C] (optional: "
                            "training), weight [C] (optional), bias [C] (optional, with weight)",
                            s_batch_norm),
    [TDD_OP_DROPOUT] = S("input", s_dropout),
    [TDD_OP_SDPA] = S("query [..., L, E], key [..., S, E], value [..., S, Ev], attn_mask "
                      "(optional: bool, True attends, or added; broadcasts to [..., L, S])",
                      s_sdpa),
    [TDD_OP_INTERPOLATE] = S("input [N, C, W] or [N, C, H, W]", s_interp),
    [TDD_OP_CONV2D] =
        S("input [N, C, H, W] or [C, H, W], weight [O, C/groups, kh, kw], bias [O] (optional)",
          s_conv2d),
    [TDD_OP_CONV1D] =
        S("input [N, C, L] or [C, L], weight [O, C/groups, k], bias [O] (optional)", s_conv1d),
    [TDD_OP_CONV_TRANSPOSE2D] = S("input [N, C, H, W] or [C, H, W], weight [C, O/groups, kh, "
                                  "kw], bias [O] (optional)",
                                  s_conv_transpose2d),
    [TDD_OP_MAX_POOL2D] = S("input [N, C, H, W] or [C, H, W]", s_max_pool2d),
    [TDD_OP_AVG_POOL2D] = S("input [N, C, H, W] or [C, H, W]", s_avg_pool2d),
    [TDD_OP_ADAPTIVE_AVG_POOL2D] = S("input [N, C, H, W] or [C, H, W]", s_adaptive),
    [TDD_OP_FULL] = S("", s_full),
    [TDD_OP_ZEROS] = S("", s_create_shape),
    [TDD_OP_ONES] = S("", s_create_shape),
    [TDD_OP_ARANGE] = S("", s_arange),
    [TDD_OP_LINSPACE] = S("", s_linspace),
    [TDD_OP_EYE] = S("", s_eye),
    [TDD_OP_RAND] = S("", s_create_shape),
    [TDD_OP_RANDN] = S("", s_create_shape),
    [TDD_OP_RANDINT] = S_ORD("", s_randint, "low<=high"),
};
#undef A
#undef R
#undef AX
#undef DTYPE_ATTR
#undef DTYPE_NAMES
#undef REDUCTION_ATTR
#undef S
#undef S_ORD
#undef S_NONE
#undef BIN_IN
#undef RED_IN

void (*tdd_attr_read_hook)(tdd_op op, const char *name);

const tdd_attrdef *tdd_op_attr(tdd_op op, const char *name)
{
    if ((unsigned)op >= TDD_OP_COUNT || !name)
        return NULL;
    const tdd_opschema *s = &tdd_op_schema[op];
    for (int i = 0; i < s->n_attrs; i++)
        if (strcmp(s->attrs[i].name, name) == 0)
            return &s->attrs[i];
    return NULL;
}

const char *tdd_attrtype_name(tdd_attrtype t)
{
    switch (t) {
    case TDD_AT_INT:
        return "an int";
    case TDD_AT_NUM:
        return "a number";
    case TDD_AT_BOOL:
        return "a bool";
    case TDD_AT_INT_OR_INTS:
        return "an int or an int list";
    case TDD_AT_INTS:
        return "an int list";
    case TDD_AT_FLOATS:
        return "a float list";
    case TDD_AT_STR:
        return "a string";
    case TDD_AT_INTS_OR_STR:
        return "an int, an int list or a string";
    }
    return "?";
}

/* Name lookup is on every op request: a hash of the name into a table built
 * once (a linear strcmp scan over ~100 names showed in profiles). */
#define OP_SLOTS 512 /* a power of two, > 2x TDD_OP_COUNT */
_Static_assert(OP_SLOTS > 2 * TDD_OP_COUNT, "op name table too small");

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    while (*s)
        h = (h ^ (uint8_t)*s++) * 16777619u;
    return h;
}

static const tdd_opdef *op_slots[OP_SLOTS];
static pthread_once_t op_slots_once = PTHREAD_ONCE_INIT;

static void op_slots_build(void)
{
    for (int i = 0; i < TDD_OP_COUNT; i++) {
        uint32_t j = name_hash(tdd_opdefs[i].name) & (OP_SLOTS - 1);
        while (op_slots[j])
            j = (j + 1) & (OP_SLOTS - 1);
        op_slots[j] = &tdd_opdefs[i];
    }
}

const tdd_opdef *tdd_op_find(const char *name)
{
    if (!name)
        return NULL;
    pthread_once(&op_slots_once, op_slots_build);
    for (uint32_t j = name_hash(name) & (OP_SLOTS - 1); op_slots[j]; j = (j + 1) & (OP_SLOTS - 1))
        if (strcmp(op_slots[j]->name, name) == 0)
            return op_slots[j];
    return NULL;
}

const td_attr *tdd_attr_get(const tdd_attrs *as, const char *name)
{
    for (size_t i = 0; i < as->n; i++)
        if (as->a[i].name && strcmp(as->a[i].name, name) == 0)
            return &as->a[i];
    return NULL;
}

const td_attr *tdd_p_get(const tdd_prep *p, const char *name)
{
    if (tdd_attr_read_hook)
        tdd_attr_read_hook(p->op, name);
    return tdd_attr_get(&p->req->attrs, name);
}

/* ------------------------------------------------------------------ errors */

int tdd_err_set(td_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, code, fmt, ap);
        va_end(ap);
    }
    return code;
}

int tdd_err_shape(td_error *err, const int64_t *expected, int en, const int64_t *got, int gn,
                  const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, TD_ESHAPE_MISMATCH, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_SHAPES;
        err->detail.shapes.expected_ndim = en;
        err->detail.shapes.got_ndim = gn;
        if (en > 0)
            memcpy(err->detail.shapes.expected, expected, (size_t)en * sizeof *expected);
        if (gn > 0)
            memcpy(err->detail.shapes.got, got, (size_t)gn * sizeof *got);
    }
    return TD_ESHAPE_MISMATCH;
}

int tdd_err_arg(td_error *err, const char *argument, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, TD_EINVALID_ARGUMENT, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_ARGUMENT;
        snprintf(err->detail.argument.argument, sizeof err->detail.argument.argument, "%s",
                 argument);
    }
    return TD_EINVALID_ARGUMENT;
}

int tdd_err_resource(td_error *err, const char *resource, uint64_t requested, uint64_t available,
                     const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, TD_ERESOURCE_EXHAUSTED, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_RESOURCE;
        snprintf(err->detail.resource.resource, sizeof err->detail.resource.resource, "%s",
                 resource);
        err->detail.resource.requested = requested;
        err->detail.resource.available = available;
    }
    return TD_ERESOURCE_EXHAUSTED;
}

int tdd_err_dtypes(td_error *err, td_dtype expected, td_dtype got, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        td_error_vset(err, TD_EDTYPE_MISMATCH, fmt, ap);
        va_end(ap);
        err->detail_kind = TD_DETAIL_DTYPES;
        err->detail.dtypes.target = expected;
        err->detail.dtypes.grad = got;
    }
    return TD_EDTYPE_MISMATCH;
}

/* ------------------------------------------------------------------ attributes */

static const char *kind_name(td_attr_kind k)
{
    switch (k) {
    case TD_ATTR_INT:
        return "int";
    case TD_ATTR_FLOAT:
        return "float";
    case TD_ATTR_BOOL:
        return "bool";
    case TD_ATTR_INTS:
        return "int list";
    case TD_ATTR_FLOATS:
        return "float list";
    case TD_ATTR_STR:
        return "string";
    }
    return "unknown";
}

static int wrong_kind(const tdd_prep *p, const td_attr *a, const char *want)
{
    return tdd_err_arg(p->err, a->name, "%s: attribute %s must be %s, got %s", p->name, a->name,
                       want, kind_name(a->kind));
}

int tdd_p_missing(const tdd_prep *p, const char *name)
{
    return tdd_err_arg(p->err, name, "%s: attribute %s is required", p->name, name);
}

int tdd_p_int(const tdd_prep *p, const char *name, int64_t def, int64_t *v)
{
    const td_attr *a = tdd_p_get(p, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_INT)
        *v = a->i;
    else if (a->kind == TD_ATTR_BOOL)
        *v = a->b != 0;
    else if (a->kind == TD_ATTR_INTS && a->n == 1 && a->ints)
        *v = a->ints[0];
    else
        return wrong_kind(p, a, "an int");
    return 0;
}

int tdd_p_float(const tdd_prep *p, const char *name, double def, double *v)
{
    const td_attr *a = tdd_p_get(p, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_FLOAT)
        *v = a->f;
    else if (a->kind == TD_ATTR_INT)
        *v = (double)a->i;
    else if (a->kind == TD_ATTR_BOOL)
        *v = a->b != 0;
    else
        return wrong_kind(p, a, "a number");
    return 0;
}

int tdd_p_bool(const tdd_prep *p, const char *name, bool def, bool *v)
{
    const td_attr *a = tdd_p_get(p, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_BOOL)
        *v = a->b != 0;
    else if (a->kind == TD_ATTR_INT)
        *v = a->i != 0;
    else
        return wrong_kind(p, a, "a bool");
    return 0;
}

int tdd_p_str(const tdd_prep *p, const char *name, const char *def, const char **v)
{
    const td_attr *a = tdd_p_get(p, name);
    *v = def;
    if (!a)
        return 0;
    if (a->kind != TD_ATTR_STR || !a->s)
        return wrong_kind(p, a, "a string");
    *v = a->s;
    return 0;
}

int tdd_p_ints(const tdd_prep *p, const char *name, int64_t *v, int max, int *n)
{
    const td_attr *a = tdd_p_get(p, name);
    *n = -1;
    if (!a)
        return 0;
    if (a->kind == TD_ATTR_INT) {
        v[0] = a->i;
        *n = 1;
        return 0;
    }
    if (a->kind != TD_ATTR_INTS || (a->n && !a->ints))
        return wrong_kind(p, a, "an int list");
    if (a->n > (size_t)max)
        return tdd_err_arg(p->err, name, "%s: attribute %s has %zu entries, at most %d allowed",
                           p->name, name, a->n, max);
    for (size_t i = 0; i < a->n; i++)
        v[i] = a->ints[i];
    *n = (int)a->n;
    return 0;
}

int tdd_p_dim(const tdd_prep *p, const char *attr, int64_t d, int ndim, int *out)
{
    int64_t n = ndim > 0 ? ndim : 1;
    if (d < -n || d >= n)
        return tdd_err_arg(p->err, attr, "%s: %s %lld out of range for a %d-D tensor", p->name,
                           attr, (long long)d, ndim);
    *out = (int)(d < 0 ? d + n : d);
    return 0;
}

int tdd_p_bcast(const tdd_prep *p, const int64_t *a, int an, const int64_t *b, int bn, int64_t *o,
                int *on)
{
    int n = an > bn ? an : bn;
    for (int d = 0; d < n; d++) {
        int ad = d - (n - an), bd = d - (n - bn);
        int64_t x = ad < 0 ? 1 : a[ad], y = bd < 0 ? 1 : b[bd];
        if (x != y && x != 1 && y != 1)
            return tdd_err_shape(p->err, a, an, b, bn,
                                 "%s: shapes cannot broadcast (dim %d: %lld vs %lld)", p->name, d,
                                 (long long)x, (long long)y);
        o[d] = x == 1 ? y : x;
    }
    *on = n;
    return 0;
}

void tdd_p_out(tdd_prep *p, int k, td_dtype dt, const int64_t *shape, int ndim)
{
    tdd_outdesc *o = &p->out[k];
    memset(o, 0, sizeof *o);
    o->dtype = dt;
    o->ndim = ndim;
    if (ndim > 0)
        memcpy(o->shape, shape, (size_t)ndim * sizeof *shape);
    if (k + 1 > *p->n_out)
        *p->n_out = k + 1;
}

void tdd_p_view(tdd_prep *p, int k, int src, const int64_t *shape, const int64_t *strides, int ndim,
                int64_t offset)
{
    tdd_p_out(p, k, p->in[src]->dtype, shape, ndim);
    tdd_outdesc *o = &p->out[k];
    o->view = true;
    o->view_of = src;
    if (ndim > 0)
        memcpy(o->strides, strides, (size_t)ndim * sizeof *strides);
    o->offset = offset;
    p->args->out_view = true;
}

int tdd_p_unsupported(const tdd_prep *p, td_dtype dt)
{
    return tdd_err_set(p->err, TD_EUNSUPPORTED_DTYPE, "%s: dtype %s is not supported", p->name,
                       td_dtype_name(dt));
}

static td_dtype dtype_by_name(const char *s)
{
    static const struct {
        const char *name;
        td_dtype dt;
    } names[] = {{"float32", TD_F32}, {"float", TD_F32}, {"float64", TD_F64},   {"double", TD_F64},
                 {"float16", TD_F16}, {"half", TD_F16},  {"bfloat16", TD_BF16}, {"int32", TD_I32},
                 {"int", TD_I32},     {"int64", TD_I64}, {"long", TD_I64},      {"bool", TD_BOOL},
                 {"uint8", TD_U8},    {"int8", TD_I8},   {"int16", TD_I16},     {"short", TD_I16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(names[i].name, s) == 0)
            return names[i].dt;
    return TD_DTYPE_INVALID;
}

int tdd_p_dtype(const tdd_prep *p, td_dtype def, td_dtype *out)
{
    *out = def;
    if (p->req->dtype != TD_DTYPE_INVALID) {
        if ((unsigned)p->req->dtype >= TD_DTYPE_COUNT)
            return tdd_err_arg(p->err, "dtype", "%s: unknown dtype %d", p->name,
                               (int)p->req->dtype);
        *out = p->req->dtype;
        return 0;
    }
    const char *s;
    int rc = tdd_p_str(p, "dtype", NULL, &s);
    if (rc || !s)
        return rc;
    *out = dtype_by_name(s);
    if (*out == TD_DTYPE_INVALID)
        return tdd_err_arg(p->err, "dtype", "%s: unknown dtype \"%s\"", p->name, s);
    return 0;
}

int tdd_p_shape(const tdd_prep *p, const char *name, int64_t *shape, int *ndim)
{
    int rc = tdd_p_ints(p, name, shape, TD_MAX_NDIM, ndim);
    if (rc)
        return rc;
    if (*ndim < 0)
        return tdd_p_missing(p, name);
    for (int d = 0; d < *ndim; d++)
        if (shape[d] < 0)
            return tdd_err_arg(p->err, name, "%s: %s[%d] = %lld is negative", p->name, name, d,
                               (long long)shape[d]);
    return 0;
}

int tdd_p_fits(const tdd_prep *p, const td_attr *a, td_dtype dt)
{
    if (!a || dt == TD_BOOL || (a->kind != TD_ATTR_INT && a->kind != TD_ATTR_FLOAT))
        return 0; /* bool holds anything (nonzero is true), as PyTorch's fill */
    if (tdd_dtype_is_float(dt)) {
        double lim = dt == TD_F16    ? 65504.0
                     : dt == TD_BF16 ? 0x1.fep127
                     : dt == TD_F32  ? FLT_MAX
                                     : DBL_MAX;
        if (a->kind == TD_ATTR_FLOAT && isfinite(a->f) && fabs(a->f) > lim)
            return tdd_err_arg(p->err, a->name, "%s: %s = %g does not fit in %s", p->name, a->name,
                               a->f, td_dtype_name(dt));
        return 0;
    }
    int64_t lo, hi;
    tdd_int_range(dt, &lo, &hi);
    if (a->kind == TD_ATTR_INT) {
        if (a->i < lo || a->i > hi)
            return tdd_err_arg(p->err, a->name, "%s: %s = %lld does not fit in %s", p->name,
                               a->name, (long long)a->i, td_dtype_name(dt));
        return 0;
    }
    /* [lo, hi] as doubles: lo is exact; hi + 1 is a power of two, exact too */
    if (!(a->f >= (double)lo && (dt != TD_I64 ? a->f <= (double)hi : a->f < -(double)lo)))
        return tdd_err_arg(p->err, a->name, "%s: %s = %g does not fit in %s", p->name, a->name,
                           a->f, td_dtype_name(dt));
    return 0;
}

/* ------------------------------------------------------------------ promotion */

static int fl_rank(td_dtype d)
{
    return d == TD_F64 ? 3 : d == TD_F32 ? 2 : 1; /* f16 and bf16 */
}

static int int_rank(td_dtype d)
{
    return d == TD_I64 ? 4 : d == TD_I32 ? 3 : d == TD_I16 ? 2 : 1; /* int8 */
}

void tdd_int_range(td_dtype dt, int64_t *lo, int64_t *hi)
{
    switch (dt) {
    case TD_U8:
        *lo = 0, *hi = UINT8_MAX;
        return;
    case TD_I8:
        *lo = INT8_MIN, *hi = INT8_MAX;
        return;
    case TD_I16:
        *lo = INT16_MIN, *hi = INT16_MAX;
        return;
    case TD_I32:
        *lo = INT32_MIN, *hi = INT32_MAX;
        return;
    case TD_BOOL:
        *lo = 0, *hi = 1;
        return;
    default:
        *lo = INT64_MIN, *hi = INT64_MAX;
        return;
    }
}

td_dtype tdd_promote(td_dtype a, td_dtype b)
{
    if (a == b || b == TD_DTYPE_INVALID)
        return a;
    if (a == TD_DTYPE_INVALID)
        return b;
    bool fa = tdd_dtype_is_float(a), fb = tdd_dtype_is_float(b);
    if (fa && fb) {
        if (fl_rank(a) == 1 && fl_rank(b) == 1)
            return TD_F32; /* f16 with bf16: neither holds the other */
        return fl_rank(a) >= fl_rank(b) ? a : b;
    }
    if (fa)
        return a;
    if (fb)
        return b;
    if (a == TD_BOOL || b == TD_BOOL)
        return a == TD_BOOL ? b : a;
    if (a == TD_U8 || b == TD_U8) { /* uint8 with int8 needs int16; the wider signed hold it */
        td_dtype o = a == TD_U8 ? b : a;
        return o == TD_I8 ? TD_I16 : o;
    }
    return int_rank(a) >= int_rank(b) ? a : b;
}

/* PyTorch's combine_categories: the lower-priority group (0-dim tensors,
 * then scalars) only matters when it is of a higher category. */
static td_dtype combine(td_dtype higher, td_dtype lower)
{
    if (higher == TD_DTYPE_INVALID)
        return lower;
    if (lower == TD_DTYPE_INVALID || tdd_dtype_is_float(higher))
        return higher;
    if (higher == TD_BOOL || tdd_dtype_is_float(lower))
        return tdd_promote(higher, lower);
    return higher;
}

static td_dtype result_type(const tdd_tensor *const *ts, int n, td_dtype scalar)
{
    td_dtype dim = TD_DTYPE_INVALID, zero = TD_DTYPE_INVALID;
    for (int i = 0; i < n; i++) {
        if (ts[i]->ndim > 0)
            dim = tdd_promote(dim, ts[i]->dtype);
        else
            zero = tdd_promote(zero, ts[i]->dtype);
    }
    return combine(dim, combine(zero, scalar));
}

/* ------------------------------------------------------------------ elementwise */

/* The output dtype of an elementwise op from its compute dtype *ct (the RULE column of
 * elementwise.h); a dtype the rule refuses is UNSUPPORTED_DTYPE. */
static int ew_out_dtype(tdd_prep *p, td_dtype *ct, td_dtype *out)
{
    bool fl = tdd_dtype_is_float(*ct);
    *out = *ct;
    switch (tdd_ew_rule(p->op)) {
    case TDD_EW_SAME:
        return *ct == TD_BOOL ? tdd_p_unsupported(p, *ct) : 0;
    case TDD_EW_SAMEB:
        return 0;
    case TDD_EW_FLOAT:
        if (!fl)
            *ct = *out = TD_F32; /* true division; integers take the default float dtype */
        return 0;
    case TDD_EW_FONLY:
        return fl ? 0 : tdd_p_unsupported(p, *ct);
    case TDD_EW_BOOL:
        *out = TD_BOOL;
        return 0;
    case TDD_EW_NONE:
        break;
    }
    return tdd_err_set(p->err, TD_EINTERNAL, "%s: not an elementwise expression", p->name);
}

static int prep_binary(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0];
    int64_t shape[TD_MAX_NDIM];
    int ndim, rc;
    td_dtype ct;
    if (p->n_in == 2) {
        rc = tdd_p_bcast(p, a->shape, a->ndim, p->in[1]->shape, p->in[1]->ndim, shape, &ndim);
        if (rc)
            return rc;
        ct = result_type(p->in, 2, TD_DTYPE_INVALID);
    } else {
        const td_attr *o = tdd_p_get(p, "other");
        if (!o)
            return tdd_err_arg(p->err, "other", "%s: needs a second input or the attribute other",
                               p->name);
        td_dtype st;
        if (o->kind == TD_ATTR_FLOAT) {
            st = TD_F32; /* a Python float scalar takes the default dtype */
            g->f[0] = o->f;
            g->n[0] = tdd_sat_i64(o->f);
        } else if (o->kind == TD_ATTR_INT) {
            st = TD_I64;
            g->f[0] = (double)o->i;
            g->n[0] = o->i;
        } else if (o->kind == TD_ATTR_BOOL) {
            st = TD_BOOL;
            g->f[0] = o->b != 0;
            g->n[0] = o->b != 0;
        } else {
            return tdd_err_arg(p->err, "other", "%s: other must be a number, got %s", p->name,
                               kind_name(o->kind));
        }
        g->scalar_form = true;
        ndim = a->ndim;
        memcpy(shape, a->shape, sizeof shape);
        ct = result_type(p->in, 1, st);
    }
    g->f[1] = 1.0;
    g->n[1] = 1;
    /* only add and sub take alpha (the schema check refuses it elsewhere) */
    const td_attr *al = p->op == TDD_OP_ADD || p->op == TDD_OP_SUB ? tdd_p_get(p, "alpha") : NULL;
    if (al) {
        if (al->kind == TD_ATTR_INT) {
            g->f[1] = (double)al->i;
            g->n[1] = al->i;
        } else if (al->kind == TD_ATTR_FLOAT) {
            if (!tdd_dtype_is_float(ct))
                return tdd_err_arg(p->err, "alpha",
                                   "%s: alpha must be an integer for integral inputs", p->name);
            g->f[1] = al->f;
        } else {
            return wrong_kind(p, al, "a number");
        }
    }
    td_dtype out;
    if ((rc = ew_out_dtype(p, &ct, &out)))
        return rc;
    g->cdtype = ct;
    g->dtype = out;
    tdd_p_out(p, 0, out, shape, ndim);
    return 0;
}

static int prep_element(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    int64_t shape[TD_MAX_NDIM];
    int ndim, rc;
    switch (p->op) {
    case TDD_OP_WHERE: {
        const tdd_tensor *c = p->in[0];
        if (c->dtype != TD_BOOL)
            return tdd_err_dtypes(p->err, TD_BOOL, c->dtype,
                                  "where: condition must be bool, got %s", td_dtype_name(c->dtype));
        int64_t s2[TD_MAX_NDIM];
        int n2;
        rc = tdd_p_bcast(p, c->shape, c->ndim, p->in[1]->shape, p->in[1]->ndim, s2, &n2);
        if (!rc)
            rc = tdd_p_bcast(p, s2, n2, p->in[2]->shape, p->in[2]->ndim, shape, &ndim);
        if (rc)
            return rc;
        g->dtype = g->cdtype = result_type(p->in + 1, 2, TD_DTYPE_INVALID);
        break;
    }
    case TDD_OP_MASKED_FILL: {
        const tdd_tensor *x = p->in[0], *m = p->in[1];
        if (m->dtype != TD_BOOL)
            return tdd_err_dtypes(p->err, TD_BOOL, m->dtype,
                                  "masked_fill: mask must be bool, got %s",
                                  td_dtype_name(m->dtype));
        /* PyTorch's out-of-place form: input and mask broadcast together */
        rc = tdd_p_bcast(p, x->shape, x->ndim, m->shape, m->ndim, shape, &ndim);
        if (rc)
            return rc;
        const td_attr *v = tdd_p_get(p, "value");
        if (p->n_in == 3) { /* the value as a 0-d tensor, converted to the input's dtype */
            const tdd_tensor *vt = p->in[2];
            if (v)
                return tdd_err_arg(p->err, "value",
                                   "masked_fill: value is given both as an input and an attribute");
            if (vt->ndim != 0)
                return tdd_err_shape(p->err, NULL, 0, vt->shape, vt->ndim,
                                     "masked_fill: a value tensor must be 0-d, got %d-D", vt->ndim);
            g->dtype = g->cdtype = x->dtype;
            break;
        }
        if (!v)
            return tdd_p_missing(p, "value");
        if ((rc = tdd_p_float(p, "value", 0, &g->f[0])) || (rc = tdd_p_fits(p, v, x->dtype)))
            return rc;
        g->n[0] = v->kind == TD_ATTR_INT ? v->i : tdd_sat_i64(g->f[0]);
        if (x->dtype == TD_BOOL)
            g->n[0] = g->f[0] != 0.0; /* nonzero (NaN too) is true */
        g->dtype = g->cdtype = x->dtype;
        break;
    }
    case TDD_OP_RELU_BACKWARD:
        rc = tdd_p_bcast(p, p->in[0]->shape, p->in[0]->ndim, p->in[1]->shape, p->in[1]->ndim, shape,
                         &ndim);
        if (rc)
            return rc;
        g->dtype = g->cdtype = result_type(p->in, 2, TD_DTYPE_INVALID);
        if (g->dtype == TD_BOOL)
            return tdd_p_unsupported(p, g->dtype);
        break;
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not an elementwise op", p->name);
    }
    tdd_p_out(p, 0, g->dtype, shape, ndim);
    return 0;
}

/* clamp(input, min[, max]) with tensor bounds (PyTorch's Tensor overload): the three
 * broadcast and promote together; the kernels run minimum(maximum(input, min), max)
 * (tdd_clamp_by_tensors). */
static int prep_clamp_tensors(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    int64_t shape[TD_MAX_NDIM], s2[TD_MAX_NDIM];
    int ndim = p->in[0]->ndim, n2, rc;
    const char *both = tdd_p_get(p, "min") ? "min" : tdd_p_get(p, "max") ? "max" : NULL;
    if (both)
        return tdd_err_arg(p->err, both, "clamp: bounds are given both as inputs and attributes");
    memcpy(shape, p->in[0]->shape, sizeof shape);
    for (int k = 1; k < p->n_in; k++) {
        rc = tdd_p_bcast(p, shape, ndim, p->in[k]->shape, p->in[k]->ndim, s2, &n2);
        if (rc)
            return rc;
        memcpy(shape, s2, sizeof shape);
        ndim = n2;
    }
    td_dtype ct = result_type(p->in, p->n_in, TD_DTYPE_INVALID);
    if (ct == TD_BOOL)
        return tdd_p_unsupported(p, ct);
    g->dtype = g->cdtype = ct;
    g->flags = p->n_in == 3 ? 3u : 1u;
    tdd_p_out(p, 0, ct, shape, ndim);
    return 0;
}

int tdd_max_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal)
{
    bool mx = c->op == TDD_OP_MAX;
    tdd_opargs a = *c->args;
    tdd_opcall s = *c;
    s.args = &a;
    s.n_out = 1;
    s.op = mx ? TDD_OP_AMAX : TDD_OP_AMIN;
    a.dtype = a.cdtype = c->in[0]->dtype;
    int rc = run(ctx, ordinal, &s);
    if (rc)
        return rc;
    s.op = mx ? TDD_OP_ARGMAX : TDD_OP_ARGMIN;
    s.out[0] = c->out[1];
    a.dtype = TD_I64;
    if (c->in[0]->dtype == TD_BOOL) { /* argmax takes no bool: its uint8 bytes order the same */
        tdd_tensor u = *c->in[0];
        u.dtype = TD_U8;
        s.in[0] = &u;
        a.cdtype = TD_U8;
        return run(ctx, ordinal, &s);
    }
    return run(ctx, ordinal, &s);
}

int tdd_addmm_by_parts(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal)
{
    const tdd_opargs *g = c->args;
    tdd_opcall s = *c;
    s.op = c->op == TDD_OP_ADDMM ? TDD_OP_MATMUL : TDD_OP_BMM;
    s.n_in = 2;
    s.in[0] = c->in[1];
    s.in[1] = c->in[2];
    int rc = run(ctx, ordinal, &s); /* the product, into the output */
    tdd_opargs e;
    memset(&e, 0, sizeof e);
    e.dtype = e.cdtype = g->dtype;
    e.f[1] = 1.0;
    e.n[1] = 1;
    s.args = &e;
    s.in[0] = c->out[0];
    if (!rc && (g->f[3] != 1.0 || g->n[3] != 1)) { /* times alpha, in place */
        e.scalar_form = true;
        e.f[0] = g->f[3];
        e.n[0] = g->n[3];
        s.op = TDD_OP_MUL;
        s.n_in = 1;
        rc = run(ctx, ordinal, &s);
        e.scalar_form = false;
        e.f[0] = 0;
        e.n[0] = 0;
    }
    if (!rc && (g->f[2] != 0.0 || g->n[2] != 0)) { /* + beta * input (beta 0: input unread) */
        e.f[1] = g->f[2];
        e.n[1] = g->n[2];
        s.op = TDD_OP_ADD;
        s.n_in = 2;
        s.in[1] = c->in[0];
        rc = run(ctx, ordinal, &s);
    }
    return rc;
}

int tdd_clamp_by_tensors(const tdd_opcall *c, tdd_run_fn run, void *ctx, int ordinal)
{
    tdd_opargs a = *c->args;
    a.scalar_form = false;
    a.flags = 0;
    a.f[1] = 1.0;
    a.n[1] = 1;
    tdd_opcall s = *c;
    s.args = &a;
    s.op = TDD_OP_MAXIMUM;
    s.n_in = 2;
    int rc = run(ctx, ordinal, &s);
    if (rc || c->n_in < 3)
        return rc;
    s.op = TDD_OP_MINIMUM; /* in place: each element reads only its own */
    s.in[0] = c->out[0];
    s.in[1] = c->in[2];
    return run(ctx, ordinal, &s);
}

static int prep_unary(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0];
    td_dtype dt = a->dtype, ct = dt, out;
    bool fl = tdd_dtype_is_float(dt);
    int rc = ew_out_dtype(p, &ct, &out);
    if (rc)
        return rc;
    switch (p->op) { /* the attributes, for the ops that take any */
    case TDD_OP_LEAKY_RELU:
        rc = tdd_p_float(p, "negative_slope", 0.01, &g->f[0]);
        break;
    case TDD_OP_GELU: {
        const char *s;
        if ((rc = tdd_p_str(p, "approximate", "none", &s)))
            return rc;
        if (strcmp(s, "none") == 0)
            g->i[0] = 0;
        else if (strcmp(s, "tanh") == 0)
            g->i[0] = 1;
        else
            return tdd_err_arg(p->err, "approximate",
                               "gelu: approximate must be \"none\" or \"tanh\", got \"%s\"", s);
        break;
    }
    case TDD_OP_SOFTPLUS:
        if ((rc = tdd_p_float(p, "beta", 1.0, &g->f[0])))
            return rc;
        if ((rc = tdd_p_float(p, "threshold", 20.0, &g->f[1])))
            return rc;
        if (g->f[0] == 0.0)
            return tdd_err_arg(p->err, "beta", "softplus: beta must not be 0");
        break;
    case TDD_OP_CLAMP: {
        const td_attr *mn = tdd_p_get(p, "min");
        const td_attr *mx = tdd_p_get(p, "max");
        if (!mn && !mx)
            return tdd_err_arg(p->err, "min", "clamp: at least one of min and max is required");
        if (mn) {
            if ((rc = tdd_p_float(p, "min", 0, &g->f[0])))
                return rc;
            g->n[0] = mn->kind == TD_ATTR_INT ? mn->i : tdd_sat_i64(g->f[0]);
            g->flags |= 1u;
            if (!fl && mn->kind == TD_ATTR_FLOAT)
                out = TD_F32;
        }
        if (mx) {
            if ((rc = tdd_p_float(p, "max", 0, &g->f[1])))
                return rc;
            g->n[1] = mx->kind == TD_ATTR_INT ? mx->i : tdd_sat_i64(g->f[1]);
            g->flags |= 2u;
            if (!fl && mx->kind == TD_ATTR_FLOAT)
                out = TD_F32;
        }
        /* PyTorch: min(max(x, min), max) -- min > max gives max; a NaN bound gives NaN
         * (the kernels' rule); a bound the output dtype cannot hold is refused */
        if ((rc = tdd_p_fits(p, mn, out)) || (rc = tdd_p_fits(p, mx, out)))
            return rc;
        /* an absent bound is the infinite one: the kernels' expression takes both */
        if (!mn) {
            g->f[0] = -INFINITY;
            g->n[0] = INT64_MIN;
        }
        if (!mx) {
            g->f[1] = INFINITY;
            g->n[1] = INT64_MAX;
        }
        break;
    }
    default:
        break;
    }
    if (rc)
        return rc;
    g->dtype = out;
    g->cdtype = out == TD_BOOL ? dt : out;
    tdd_p_out(p, 0, out, a->shape, a->ndim);
    return 0;
}

/* ------------------------------------------------------------------ reductions */

/* Reads "dim" (absent or empty = all dims) into a mask. */
static int reduce_mask(tdd_prep *p, const tdd_tensor *a, uint32_t *mask)
{
    int64_t dims[TD_MAX_NDIM];
    int n, rc = tdd_p_ints(p, "dim", dims, TD_MAX_NDIM, &n);
    if (rc)
        return rc;
    if (n <= 0) {
        *mask = (uint32_t)((1u << a->ndim) - 1u);
        return 0;
    }
    *mask = 0;
    for (int k = 0; k < n; k++) {
        int d;
        if ((rc = tdd_p_dim(p, "dim", dims[k], a->ndim, &d)))
            return rc;
        if (a->ndim == 0)
            continue; /* a 0-dim tensor reduces over its one element */
        if (*mask & (1u << d))
            return tdd_err_arg(p->err, "dim", "%s: dim %d appears twice", p->name, d);
        *mask |= 1u << d;
    }
    return 0;
}

/* Output shape of reducing a over mask. */
static void reduce_shape(const tdd_tensor *a, uint32_t mask, bool keepdim, int64_t *shape,
                         int *ndim, int64_t *count)
{
    *ndim = 0;
    *count = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (mask & (1u << d)) {
            *count *= a->shape[d];
            if (keepdim)
                shape[(*ndim)++] = 1;
        } else {
            shape[(*ndim)++] = a->shape[d];
        }
    }
}

static int prep_reduce(tdd_prep *p)
{
    tdd_opargs *g = p->args;
    const tdd_tensor *a = p->in[0];
    td_dtype dt = a->dtype, out = dt;
    bool fl = tdd_dtype_is_float(dt);
    int64_t shape[TD_MAX_NDIM], count;
    int ndim, rc;
    bool keepdim = false;
    /* cumsum, softmax, log_softmax and sum_to take no keepdim */
    if (p->op != TDD_OP_CUMSUM && p->op != TDD_OP_SOFTMAX && p->op != TDD_OP_LOG_SOFTMAX &&
        p->op != TDD_OP_SUM_TO && (rc = tdd_p_bool(p, "keepdim", false, &keepdim)))
        return rc;
    g->keepdim = keepdim;
    switch (p->op) {
    case TDD_OP_CUMSUM:
    case TDD_OP_SOFTMAX:
    case TDD_OP_LOG_SOFTMAX: {
        int64_t dv;
        int d;
        if (!tdd_p_get(p, "dim"))
            return tdd_p_missing(p, "dim");
        if ((rc = tdd_p_int(p, "dim", 0, &dv)) || (rc = tdd_p_dim(p, "dim", dv, a->ndim, &d)))
            return rc;
        g->i[0] = d;
        if (p->op == TDD_OP_CUMSUM) {
            if (!fl)
                out = TD_I64;
        } else if (!fl) {
            return tdd_p_unsupported(p, dt);
        }
        g->dtype = out;
        tdd_p_out(p, 0, out, a->shape, a->ndim);
        return 0;
    }
    case TDD_OP_SUM_TO: {
        int64_t ts[TD_MAX_NDIM];
        int tn;
        if ((rc = tdd_p_shape(p, "shape", ts, &tn)))
            return rc;
        if (tn > a->ndim)
            return tdd_err_shape(p->err, ts, tn, a->shape, a->ndim,
                                 "sum_to: target has more dims than the input");
        uint32_t mask = 0;
        int lead = a->ndim - tn;
        for (int d = 0; d < a->ndim; d++) {
            if (d < lead) {
                mask |= 1u << d;
                continue;
            }
            int64_t t = ts[d - lead];
            if (t == a->shape[d])
                continue;
            if (t != 1)
                return tdd_err_shape(p->err, ts, tn, a->shape, a->ndim,
                                     "sum_to: input does not broadcast from the target shape");
            mask |= 1u << d;
        }
        g->dims_mask = mask;
        g->dtype = g->cdtype = dt;
        tdd_p_out(p, 0, dt, ts, tn);
        return 0;
    }
    case TDD_OP_MAX: /* max/min(dim): amax/amin and argmax/argmin together */
    case TDD_OP_MIN:
        if (!tdd_p_get(p, "dim"))
            return tdd_p_missing(p, "dim");
        /* fall through */
    case TDD_OP_ARGMAX:
    case TDD_OP_ARGMIN: {
        bool two = p->op == TDD_OP_MAX || p->op == TDD_OP_MIN;
        if (dt == TD_BOOL && !two)
            return tdd_p_unsupported(p, dt);
        const td_attr *da = tdd_p_get(p, "dim");
        if (!da) {
            g->dims_mask = (uint32_t)((1u << a->ndim) - 1u);
            g->i[0] = -1;
        } else {
            int64_t dv;
            int d;
            if ((rc = tdd_p_int(p, "dim", 0, &dv)) || (rc = tdd_p_dim(p, "dim", dv, a->ndim, &d)))
                return rc;
            g->dims_mask = a->ndim ? 1u << d : 0;
            g->i[0] = d;
        }
        reduce_shape(a, g->dims_mask, keepdim, shape, &ndim, &count);
        if (count == 0)
            return tdd_err_arg(p->err, "dim", "%s: cannot reduce over a zero-size dimension",
                               p->name);
        g->i[1] = count;
        g->dtype = two ? dt : TD_I64;
        g->cdtype = dt;
        tdd_p_out(p, 0, g->dtype, shape, ndim);
        if (two)
            tdd_p_out(p, 1, TD_I64, shape, ndim);
        return 0;
    }
    case TDD_OP_SUM:
    case TDD_OP_PROD:
        if (!fl)
            out = TD_I64;
        break;
    case TDD_OP_MEAN:
    case TDD_OP_VAR:
    case TDD_OP_STD:
        if (!fl)
            return tdd_p_unsupported(p, dt);
        break;
    case TDD_OP_LOGSUMEXP:
        if (!fl)
            out = TD_F32;
        break;
    case TDD_OP_AMAX:
    case TDD_OP_AMIN:
        break;
    default:
        return tdd_err_set(p->err, TD_EINTERNAL, "%s: not a reduction", p->name);
    }
    if ((rc = reduce_mask(p, a, &g->dims_mask)))
        return rc;
    reduce_shape(a, g->dims_mask, keepdim, shape, &ndim, &count);
    if ((p->op == TDD_OP_AMAX || p->op == TDD_OP_AMIN) && count == 0)
        return tdd_err_arg(p->err, "dim", "%s: cannot reduce over a zero-size dimension", p->name);
    if (p->op == TDD_OP_VAR || p->op == TDD_OP_STD) {
        bool unbiased;
        if ((rc = tdd_p_bool(p, "unbiased", true, &unbiased)) ||
            (rc = tdd_p_float(p, "correction", unbiased ? 1.0 : 0.0, &g->f[0])))
            return rc;
    }
    g->i[1] = count;
    g->dtype = out;
    g->cdtype = out;
    tdd_p_out(p, 0, out, shape, ndim);
    return 0;
}

/* ------------------------------------------------------------------ schema check */

/* Whether an attribute of kind k is read by the reader of type t (ops_impl.h's readers). */
static bool type_accepts(tdd_attrtype t, const td_attr *a)
{
    switch (t) {
    case TDD_AT_INT:
        return a->kind == TD_ATTR_INT || a->kind == TD_ATTR_BOOL ||
               (a->kind == TD_ATTR_INTS && a->n == 1 && a->ints);
    case TDD_AT_NUM:
        return a->kind == TD_ATTR_FLOAT || a->kind == TD_ATTR_INT || a->kind == TD_ATTR_BOOL;
    case TDD_AT_BOOL:
        return a->kind == TD_ATTR_BOOL || a->kind == TD_ATTR_INT;
    case TDD_AT_INT_OR_INTS:
    case TDD_AT_INTS:
        return a->kind == TD_ATTR_INT || (a->kind == TD_ATTR_INTS && (a->n == 0 || a->ints));
    case TDD_AT_FLOATS:
        return a->kind == TD_ATTR_FLOATS && (a->n == 0 || a->floats);
    case TDD_AT_STR:
        return a->kind == TD_ATTR_STR && a->s;
    case TDD_AT_INTS_OR_STR:
        return a->kind == TD_ATTR_INT || (a->kind == TD_ATTR_INTS && (a->n == 0 || a->ints)) ||
               (a->kind == TD_ATTR_STR && a->s);
    }
    return false;
}

/* "a, b, c" (or "none") into buf. */
static void accepted_names(tdd_op op, char *buf, size_t len)
{
    const tdd_opschema *s = &tdd_op_schema[op];
    size_t at = 0;
    buf[0] = 0;
    if (s->n_attrs == 0)
        snprintf(buf, len, "none");
    for (int i = 0; i < s->n_attrs && at < len; i++) {
        int w = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", s->attrs[i].name);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

/* Every attribute of the request against the op's schema, before any op rule runs: an
 * attribute the op does not take, one of a type its reader would refuse, or one named
 * twice is INVALID_ARGUMENT naming it. */
static int check_attrs(const tdd_prep *p)
{
    const tdd_attrs *as = &p->req->attrs;
    if (as->n && !as->a)
        return tdd_err_arg(p->err, "attrs", "%s: malformed attribute list", p->name);
    for (size_t i = 0; i < as->n; i++) {
        const td_attr *a = &as->a[i];
        if (!a->name || !a->name[0])
            return tdd_err_arg(p->err, "attrs", "%s: attribute %zu has no name", p->name, i);
        const tdd_attrdef *d = tdd_op_attr(p->op, a->name);
        if (!d) {
            char acc[200];
            accepted_names(p->op, acc, sizeof acc);
            return tdd_err_arg(p->err, a->name, "%s takes no attribute '%.64s' (accepts: %s)",
                               p->name, a->name, acc);
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(as->a[j].name, a->name) == 0)
                return tdd_err_arg(p->err, a->name, "%s: attribute '%.64s' is given twice", p->name,
                                   a->name);
        if (!type_accepts(d->type, a))
            return tdd_err_arg(p->err, a->name, "%s: attribute '%s' must be %s, got %s", p->name,
                               d->name, tdd_attrtype_name(d->type), kind_name(a->kind));
    }
    return 0;
}

/* ------------------------------------------------------------------ dispatch */

int tdd_op_prepare(tdd_op op, const tdd_tensor *const *in, int n_in, const tdd_opreq *req,
                   int64_t max_numel, tdd_opargs *args, tdd_outdesc *out, int *n_out, td_error *err)
{
    memset(args, 0, sizeof *args);
    *n_out = 0;
    if ((unsigned)op >= TDD_OP_COUNT)
        return tdd_err_set(err, TD_EUNSUPPORTED_OP, "no such op (%d)", (int)op);
    const tdd_opdef *d = &tdd_opdefs[op];
    if (n_in < d->min_inputs || n_in > d->max_inputs) {
        if (d->min_inputs == d->max_inputs)
            return tdd_err_set(err, TD_EINVALID_ARGUMENT, "%s takes %d input(s), got %d", d->name,
                               d->min_inputs, n_in);
        return tdd_err_set(err, TD_EINVALID_ARGUMENT, "%s takes %d to %d inputs, got %d", d->name,
                           d->min_inputs, d->max_inputs, n_in);
    }
    for (int i = 0; i < n_in; i++) {
        const tdd_tensor *t = in[i];
        if (!t || t->dtype <= TD_DTYPE_INVALID || t->dtype >= TD_DTYPE_COUNT || t->ndim < 0 ||
            t->ndim > TD_MAX_NDIM)
            return tdd_err_set(err, TD_EINVALID_ARGUMENT, "%s: input %d is malformed", d->name, i);
    }
    static const tdd_opreq noreq;
    tdd_prep p = {.op = op,
                  .name = d->name,
                  .in = in,
                  .n_in = n_in,
                  .req = req ? req : &noreq,
                  .args = args,
                  .out = out,
                  .n_out = n_out,
                  .max_numel = max_numel,
                  .err = err};
    args->seed = p.req->seed;
    args->dtype = n_in > 0 ? in[0]->dtype : TD_F32;
    args->cdtype = args->dtype;
    int rc = check_attrs(&p);
    if (rc)
        return rc;
    switch (d->kind) {
    case TDD_KIND_BINARY:
        rc = prep_binary(&p);
        break;
    case TDD_KIND_UNARY:
        rc = op == TDD_OP_CLAMP && n_in > 1 ? prep_clamp_tensors(&p) : prep_unary(&p);
        break;
    case TDD_KIND_ELEMENT:
        rc = prep_element(&p);
        break;
    case TDD_KIND_REDUCE:
        rc = prep_reduce(&p);
        break;
    case TDD_KIND_VIEW:
    case TDD_KIND_INDEX:
        rc = tdd_prep_shape(&p);
        break;
    case TDD_KIND_LINALG:
    case TDD_KIND_NN:
        rc = tdd_prep_nn(&p);
        break;
    case TDD_KIND_CREATE:
        rc = tdd_prep_create(&p);
        break;
    }
    if (rc)
        return rc;
    for (int i = 0; i < *n_out; i++)
        if (tdd_shape_numel(out[i].shape, out[i].ndim, max_numel) < 0)
            return tdd_err_set(err, TD_ERESOURCE_EXHAUSTED,
                               "%s: output %d has more than %lld elements", d->name, i,
                               (long long)max_numel);
    return 0;
}

const char *tdd_opkind_name(tdd_opkind k)
{
    switch (k) {
    case TDD_KIND_BINARY:
        return "binary";
    case TDD_KIND_UNARY:
        return "unary";
    case TDD_KIND_ELEMENT:
        return "elementwise";
    case TDD_KIND_REDUCE:
        return "reduction";
    case TDD_KIND_LINALG:
        return "linalg";
    case TDD_KIND_VIEW:
        return "view";
    case TDD_KIND_INDEX:
        return "indexing";
    case TDD_KIND_NN:
        return "nn";
    case TDD_KIND_CREATE:
        return "creation";
    }
    return "?";
}
