/* ops_schema.c -- the op table (tdd_opdefs: names, arities, kinds), every op's attribute
 * schema (tdd_op_schema) and the lookups by name. Data below ops.c's dispatch and the
 * rules (ops_*.c), which read it. */
#include "ops.h"

#include <pthread.h>
#include <string.h>

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
static const tdd_attrdef s_pixel_shuffle[] = {R("upscale_factor", INT, ">= 1")};
static const tdd_attrdef s_pixel_unshuffle[] = {R("downscale_factor", INT, ">= 1")};
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
static const tdd_attrdef s_max_pool1d[] = {
    R("kernel_size", INT_OR_INTS, ">= 1; an int or (l,)"),
    A("stride", INT_OR_INTS, "kernel_size", ">= 1; an int or (l,)"),
    A("padding", INT_OR_INTS, "0", "<= kernel_size / 2; an int or (l,)"),
    A("dilation", INT_OR_INTS, "1", ">= 1; an int or (l,)"),
    A("ceil_mode", BOOL, "false", NULL),
    AX("return_indices", BOOL, "false", "true adds an int64 output (index into L)")};
static const tdd_attrdef s_avg_pool1d[] = {
    R("kernel_size", INT_OR_INTS, ">= 1; an int or (l,)"),
    A("stride", INT_OR_INTS, "kernel_size", ">= 1; an int or (l,)"),
    A("padding", INT_OR_INTS, "0", "<= kernel_size / 2; an int or (l,)"),
    A("ceil_mode", BOOL, "false", NULL), A("count_include_pad", BOOL, "true", NULL)};
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
#define S_OUT(in, arr, n, with)                                                                    \
    {                                                                                              \
        in, arr, (int)(sizeof arr / sizeof arr[0]), NULL, n, with                                  \
    }
#define S_GRAD(in, arr, n, with, grad)                                                             \
    {                                                                                              \
        in, arr, (int)(sizeof arr / sizeof arr[0]), NULL, n, with, grad                            \
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
    [TDD_OP_MAX] = S_OUT("input (outputs: values, int64 indices)", s_max_dim, 2, NULL),
    [TDD_OP_MIN] = S_OUT("input (outputs: values, int64 indices)", s_max_dim, 2, NULL),
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
    [TDD_OP_SPLIT] = S_OUT("input (outputs: one per piece)", s_split, TDD_OUTPUTS_PIECES, NULL),
    [TDD_OP_CHUNK] = S_OUT("input (outputs: one per piece)", s_chunk, TDD_OUTPUTS_PIECES, NULL),
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
    [TDD_OP_SORT] = S_OUT("input (outputs: values, int64 indices)", s_sort, 2, NULL),
    [TDD_OP_ARGSORT] = S("input (output: int64 indices)", s_sort),
    [TDD_OP_TOPK] = S_OUT("input (outputs: values, int64 indices)", s_topk, 2, NULL),
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
    [TDD_OP_MAX_POOL2D] =
        S_GRAD("input [N, C, H, W] or [C, H, W] (outputs: values, and int64 "
               "indices with return_indices)",
               s_max_pool2d, 1, "return_indices", "max_pool2d_backward(grad, in0)"),
    [TDD_OP_AVG_POOL2D] = S("input [N, C, H, W] or [C, H, W]", s_avg_pool2d),
    [TDD_OP_ADAPTIVE_AVG_POOL2D] = S("input [N, C, H, W] or [C, H, W]", s_adaptive),
    [TDD_OP_MAX_POOL1D] = S_OUT("input [N, C, L] or [C, L] (outputs: values, and int64 indices "
                                "with return_indices)",
                                s_max_pool1d, 1, "return_indices"),
    [TDD_OP_AVG_POOL1D] = S("input [N, C, L] or [C, L]", s_avg_pool1d),
    [TDD_OP_PIXEL_SHUFFLE] = S_GRAD("input [*, C * upscale_factor^2, H, W]", s_pixel_shuffle, 0,
                                    NULL, "pixel_unshuffle(grad; downscale_factor=upscale_factor)"),
    [TDD_OP_PIXEL_UNSHUFFLE] =
        S_GRAD("input [*, C, H * downscale_factor, W * downscale_factor]", s_pixel_unshuffle, 0,
               NULL, "pixel_shuffle(grad; upscale_factor=downscale_factor)"),
    [TDD_OP_MAX_POOL2D_BACKWARD] = S("grad_output (max_pool2d's output shape), input [N, C, H, W] "
                                     "or [C, H, W]",
                                     s_max_pool2d),
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

int tdd_op_num_outputs(tdd_op op, const td_attr *attrs, size_t n_attrs)
{
    if ((unsigned)op >= TDD_OP_COUNT)
        return 0;
    const tdd_opschema *s = &tdd_op_schema[op];
    if (s->n_outputs == TDD_OUTPUTS_PIECES)
        return 0;
    int n = s->n_outputs ? s->n_outputs : 1;
    for (size_t i = 0; s->outputs_with && i < n_attrs; i++)
        if (attrs[i].name && strcmp(attrs[i].name, s->outputs_with) == 0 &&
            ((attrs[i].kind == TD_ATTR_BOOL && attrs[i].b) ||
             (attrs[i].kind == TD_ATTR_INT && attrs[i].i)))
            return n + 1;
    return n;
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
