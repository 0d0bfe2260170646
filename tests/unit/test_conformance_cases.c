/* test_conformance_cases.c -- the conformance case table (every op x dtypes x
 * shapes: broadcasting, 0-size, 1-element, non-contiguous, large) and the
 * runner that executes a case on ref and another backend and compares. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "dtype.h"
#include "test_conformance.h"

#define F "sd"    /* float dtypes run natively on cpu */
#define FA "sdhb" /* every float dtype */
#define NUM                                                                                        \
    "sdhbiluc"                                                                                     \
    "w" /* every numeric dtype */
#define ALL                                                                                        \
    "sdhbilouc"                                                                                    \
    "w"
#define SNUM "sdhbilcw" /* the dtypes that hold a negative value */

const conf_case conf_cases[] = {
    /* binary: broadcasting edge cases, scalar forms, 0-size, 1-element, large */
    {"add", {"x:3,4", "x:3,4"}, "", ALL, 1},
    {"add", {"x:2,1,4", "x:3,1"}, "alpha=2", NUM, 1},
    {"add", {"x:", "x:5"}, "", F, 1},
    {"add", {"x:0,3", "x:3"}, "", F, 1},
    {"add", {"x:1", "x:1"}, "", F, 1},
    {"add", {"x:1000,1000", "x:1000"}, "", F, 1},
    {"add", {"x:4,5S", "x:5E"}, "", F, 1},
    {"add", {"x:3,4"}, "other=2.5;alpha=3", NUM, 1},
    {"add", {"x:3,4"}, "other=2", "il", 1},
    {"sub", {"x:3,4", "x:4"}, "alpha=0.5", FA, 1},
    {"sub", {"x:3,4"}, "other=1.5", NUM, 1},
    {"mul", {"x:3,1,5", "x:4,1"}, "", ALL, 1},
    {"mul", {"x:70000"}, "other=3", NUM, 1},
    {"div", {"x:3,4", "p:3,4"}, "", NUM, 1},
    {"div", {"x:5,6"}, "other=4", NUM, 1},
    /* integer/bool inputs of float compute on cpu: converted, then the float kernel
     * (cpu_via_cast): threaded, broadcast, strided (variant 1), scalar forms */
    {"div", {"x:300,200", "p:300,1"}, "", "ilo", 1},
    {"div", {"x:300,200S"}, "other=3", "il", 1},
    {"add", {"x:300,200", "f:200"}, "alpha=2", "ilo", 1},
    {"pow", {"p:3,4", "x:3,4"}, "", FA, 2},
    {"pow", {"p:6"}, "other=2", FA, 1},
    {"pow", {"x:6"}, "other=3", "il", 1},
    {"maximum", {"x:3,4", "x:1,4"}, "", ALL, 1},
    {"minimum", {"x:3,4", "x:3,1"}, "", ALL, 1},
    {"remainder", {"x:3,4", "p:3,4"}, "", NUM, 1},
    {"remainder", {"x:8"}, "other=-1.5", F, 1},
    {"remainder", {"x:300,200"}, "other=2.5", "il", 1}, /* integers, float compute */
    {"eq", {"x:3,4", "x:3,4"}, "", ALL, 1},
    {"ne", {"x:3,4", "x:4"}, "", ALL, 1},
    {"lt", {"x:3,4", "x:4"}, "", NUM, 1},
    {"le", {"x:3,4"}, "other=0.5", NUM, 1},
    {"le", {"x:300,200"}, "other=0.5", "ilo", 1}, /* integers, float compute */
    {"gt", {"x:2,3,4", "x:3,1"}, "", NUM, 1},
    {"ge", {"x:3,4"}, "other=0", NUM, 1},
    {"logical_and", {"x:3,4", "x:3,4"}, "", ALL, 1},
    {"logical_or", {"x:3,4", "x:4"}, "", ALL, 1},
    {"logical_xor", {"x:3,4", "x:3,4"}, "", ALL, 1},
    {"atan2", {"x:3,4", "x:4"}, "", ALL, 1},
    {"atan2", {"x:2,1,4", "x:3,1S"}, "", FA, 1},
    {"atan2", {"x:3,4"}, "other=-1.5", NUM, 1},
    {"atan2", {"x:0,3", "x:3"}, "", F, 1},
    {"atan2", {"x:300,200", "x:300,200T"}, "", "sdilo", 1},
    {"where", {"b:3,4", "x:3,4", "x:4"}, "", ALL, 1},
    {"where", {"b:3,1", "x:1,4", "x:3,4"}, "", F, 1},
    {"masked_fill", {"x:3,4", "b:4"}, "value=-1.5", SNUM, 1},
    {"masked_fill", {"x:4", "b:3,4"}, "value=2", NUM, 1},  /* the mask broadcasts the input */
    {"masked_fill", {"x:3,1", "b:1,4", "x:"}, "", ALL, 1}, /* a 0-d value tensor */
    {"masked_fill", {"x:4,5T", "b:5", "x:"}, "", F, 1},
    {"relu_backward", {"x:3,4", "x:3,4"}, "", NUM, 1},
    /* unary */
    {"neg", {"x:3,4"}, "", NUM, 1},
    {"abs", {"x:3,4"}, "", NUM, 1},
    {"sign", {"x:3,4"}, "", NUM, 1},
    {"exp", {"x:3,4"}, "", NUM, 1},
    {"exp", {"x:300000"}, "", F, 1},
    {"log", {"p:3,4"}, "", NUM, 1},
    {"log1p", {"p:3,4"}, "", FA, 1},
    {"expm1", {"x:3,4"}, "", FA, 1},
    {"sqrt", {"p:3,4"}, "", NUM, 1},
    {"rsqrt", {"p:3,4"}, "", FA, 1},
    {"sin", {"x:3,4"}, "", FA, 1},
    {"cos", {"x:3,4"}, "", FA, 1},
    {"tanh", {"x:3,4"}, "", FA, 1},
    {"sigmoid", {"x:3,4"}, "", NUM, 1},
    {"exp", {"x:300,200"}, "", "ilo", 1},
    {"sqrt", {"p:300,200T"}, "", "ilo", 1},
    {"log1p", {"p:3,4"}, "", "ilo", 1},
    {"expm1", {"x:3,4"}, "", "ilo", 1},
    {"rsqrt", {"p:3,4"}, "", "ilo", 1},
    {"sin", {"x:3,4"}, "", "ilo", 1},
    {"cos", {"x:3,4"}, "", "ilo", 1},
    {"tanh", {"x:3,4"}, "", "ilo", 1},
    {"reciprocal", {"p:3,4"}, "", "ilo", 1},
    {"relu", {"x:3,4"}, "", NUM, 1},
    {"relu", {"x:0"}, "", F, 1},
    {"leaky_relu", {"x:3,4"}, "negative_slope=0.2", FA, 1},
    {"gelu", {"x:3,4"}, "", FA, 1},
    {"gelu", {"x:3,4"}, "approximate='tanh'", FA, 1},
    {"silu", {"x:3,4"}, "", FA, 1},
    {"softplus", {"x:3,4"}, "beta=2;threshold=1", FA, 1},
    {"clamp", {"x:3,4"}, "min=-0.5;max=0.7", FA, 1},
    {"clamp", {"x:3,4"}, "min=-1", "il", 1},
    {"clamp", {"x:300,200"}, "min=-1.5;max=2.5", "il", 1},
    {"floor", {"x:3,4"}, "", NUM, 1},
    {"ceil", {"x:3,4"}, "", NUM, 1},
    {"round", {"x:3,4"}, "", NUM, 1},
    {"reciprocal", {"p:3,4"}, "", FA, 1},
    {"square", {"x:3,4"}, "", NUM, 1},
    {"logical_not", {"x:3,4"}, "", ALL, 1},
    /* integer and bool kernels at threaded sizes, broadcast and scalar forms */
    {"add", {"x:300,200", "x:200"}, "alpha=3", "ilo", 1},
    {"sub", {"x:300,200"}, "other=7;alpha=2", "il", 1},
    {"mul", {"x:300,200", "x:300,1"}, "", "ilo", 1},
    {"maximum", {"x:300,200"}, "other=1", "il", 1},
    {"lt", {"x:300,200", "x:300,1"}, "", "ilo", 1},
    {"logical_xor", {"x:300,200", "x:200"}, "", ALL, 1},
    {"where", {"b:300,200", "x:300,200", "x:200"}, "", ALL, 1},
    {"masked_fill", {"x:300,200", "b:200"}, "value=3", ALL, 1},
    {"clamp", {"x:300,200"}, "min=-2;max=3", "il", 1},
    {"abs", {"x:300,200"}, "", "il", 1},
    {"logical_not", {"x:300,200"}, "", ALL, 1},
    /* f16/bf16 through the f32 kernels in blocks, at threaded sizes: broadcast,
     * scalar, strided and mixed-with-f32 operands, lines longer than a block */
    {"add", {"x:300,200", "x:200"}, "alpha=0.3", "hb", 1},
    {"add", {"x:300,200", "f:300,1"}, "", "hb", 1},
    {"sub", {"x:300,200S", "x:300,1"}, "", "hb", 1},
    {"mul", {"x:300,200"}, "other=1.7", "hb", 1},
    {"div", {"x:300,200", "p:300,200T"}, "", "hb", 1},
    {"pow", {"p:300,200", "x:200"}, "", "hb", 2},
    {"maximum", {"x:300,200", "x:300,1"}, "", "hb", 1},
    {"remainder", {"x:300,200"}, "other=-1.5", "hb", 1},
    {"lt", {"x:300,200", "x:200"}, "", "hb", 1},
    {"logical_and", {"x:300,200", "x:300,200"}, "", "hb", 1},
    {"relu_backward", {"x:300,200", "x:300,200T"}, "", "hb", 1},
    {"exp", {"x:300,200T"}, "", "hb", 1},
    {"gelu", {"x:300,200"}, "approximate='tanh'", "hb", 1},
    {"silu", {"x:70000"}, "", "hb", 1},
    {"clamp", {"x:300,200S"}, "min=-0.5;max=0.7", "hb", 1},
    {"round", {"x:300,200"}, "", "hb", 1},
    {"softmax", {"x:300,200"}, "dim=1", "hb", 1},
    {"softmax", {"x:5000"}, "dim=0", "hb", 1},
    {"log_softmax", {"x:300,200"}, "dim=0", "hb", 1},
    {"cumsum", {"x:300,200"}, "dim=1", "hb", 1},
    /* reductions */
    {"sum", {"x:3,4,5"}, "", NUM, 1},
    {"sum", {"x:3,4,5"}, "dim=1", NUM, 1},
    {"sum", {"x:3,4,5"}, "dim=[0,2];keepdim=true", NUM, 1},
    {"sum", {"x:0,4"}, "dim=0", F, 1},
    {"sum", {"x:1000,1000"}, "", F, 10},
    {"sum", {"x:1000,1000"}, "dim=0", F, 10},
    {"sum", {"x:"}, "", F, 1},
    {"mean", {"x:3,4,5"}, "dim=-1", FA, 1},
    {"mean", {"x:300,500"}, "", F, 10},
    {"amax", {"x:3,4,5"}, "dim=[1,2]", ALL, 1},
    {"amin", {"x:3,4,5"}, "dim=0;keepdim=true", NUM, 1},
    {"argmax", {"x:3,4,5"}, "dim=1", NUM, 1},
    {"argmax", {"x:3,4,5"}, "", NUM, 1},
    {"argmin", {"x:3,4,5"}, "dim=2;keepdim=true", NUM, 1},
    {"argmax", {"x:200000"}, "", F, 1},
    {"argmax", {"x:200000"}, "", "ilhb", 1},
    {"argmin", {"x:300,400"}, "dim=0", "il", 1},
    {"sum", {"x:500,300"}, "", "ilohb", 10},
    {"sum", {"x:500,300"}, "dim=1", "ilo", 1},
    {"amax", {"x:500,300"}, "dim=0", "ilo", 1},
    {"prod", {"x:300,200"}, "dim=0", "il", 1},
    {"var", {"x:3,4,5"}, "dim=1", FA, 1},
    {"var", {"x:3,4,5"}, "correction=0", FA, 1},
    {"std", {"x:6,7"}, "dim=0", FA, 1},
    {"logsumexp", {"x:3,4,5"}, "dim=2", FA, 1},
    {"logsumexp", {"x:3,4,5"}, "dim=2", "ilo", 1},
    {"logsumexp", {"x:300,200"}, "dim=0", "il", 1},
    {"prod", {"x:3,4"}, "dim=1", NUM, 1},
    {"sum_to", {"x:2,3,4"}, "shape=[3,1]", NUM, 1},
    {"sum_to", {"x:64,10"}, "shape=[10]", F, 1},
    {"cumsum", {"x:3,4,5"}, "dim=1", NUM, 1},
    {"cumsum", {"x:10000"}, "dim=0", F, 10},
    {"softmax", {"x:4,10"}, "dim=1", FA, 1},
    {"softmax", {"x:3,4,5"}, "dim=0", F, 1},
    {"log_softmax", {"x:4,10"}, "dim=-1", FA, 1},
    {"log_softmax", {"x:5000,10"}, "dim=1", F, 1},
    /* linear algebra (PyTorch's matmul rules) */
    {"matmul", {"x:5,7", "x:7,3"}, "", "sdil", 30},
    {"matmul", {"x:7", "x:7"}, "", F, 30},
    {"matmul", {"x:7", "x:7,4"}, "", F, 30},
    {"matmul", {"x:5,7", "x:7"}, "", F, 30},
    {"matmul", {"x:2,3,5,7", "x:7,4"}, "", F, 30},
    {"matmul", {"x:2,1,5,7", "x:3,7,4"}, "", F, 30},
    {"matmul", {"x:5,0", "x:0,3"}, "", F, 1},
    {"matmul", {"x:5,7E", "x:7,3"}, "", F, 30},
    {"matmul", {"x:200,300", "x:300,100"}, "", F, 100},
    {"bmm", {"x:3,5,7", "x:3,7,4"}, "", FA, 30},
    {"linear", {"x:8,5", "x:3,5", "x:3"}, "", F, 30},
    {"linear", {"x:2,8,5", "x:3,5"}, "", F, 30},
    {"linear", {"x:5", "x:5"}, "", F, 30},
    /* views and copies */
    {"transpose", {"x:3,4"}, "dim0=0;dim1=1", ALL, 1},
    {"permute", {"x:2,3,4"}, "dims=[2,0,1]", ALL, 1},
    {"reshape", {"x:3,4"}, "shape=[2,-1]", ALL, 1},
    {"reshape", {"x:3,4T"}, "shape=[12]", ALL, 1},
    {"view", {"x:3,4C"}, "shape=[4,3]", F, 1},
    {"flatten", {"x:2,3,4"}, "start_dim=1", ALL, 1},
    {"flatten", {"x:2,3,4T"}, "", F, 1},
    {"squeeze", {"x:3,1,4"}, "", ALL, 1},
    {"unsqueeze", {"x:3,4"}, "dim=1", ALL, 1},
    {"expand", {"x:3,1"}, "shape=[2,3,4]", ALL, 1},
    {"slice", {"x:6,5"}, "dim=1;start=1;stop=-1;step=2", ALL, 1},
    {"contiguous", {"x:3,4T"}, "", ALL, 1},
    {"contiguous", {"x:3,4"}, "", F, 1},
    {"detach", {"x:3,4T"}, "", ALL, 1},
    {"split", {"x:7,3"}, "split_size=3", ALL, 1},
    {"split", {"x:7,3"}, "split_sizes=[2,5]", F, 1},
    {"chunk", {"x:3,7"}, "chunks=3;dim=1", ALL, 1},
    {"clone", {"x:3,4S"}, "", ALL, 1},
    {"cast", {"x:3,4"}, "dtype='float64'", ALL, 1},
    {"cast", {"x:3,4"}, "dtype='float32'", ALL, 1},
    {"cast", {"x:3,4"}, "dtype='int32'", ALL, 1},
    {"cast", {"x:3,4"}, "dtype='bool'", ALL, 1},
    {"cast", {"x:3,4"}, "dtype='bfloat16'", ALL, 0}, /* rounded to nearest even: exact */
    {"cast", {"x:3,4"}, "dtype='float16'", ALL, 0},
    {"cast", {"x:3,4"}, "dtype='int64'", ALL, 1},
    /* every dtype pair at threaded sizes, contiguous and strided (variant 1 transposes) */
    {"cast", {"x:300,200"}, "dtype='float32'", ALL, 1},
    {"cast", {"x:300,200S"}, "dtype='float64'", ALL, 1},
    {"cast", {"x:300,200"}, "dtype='float16'", ALL, 0},
    {"cast", {"x:300,200T"}, "dtype='bfloat16'", ALL, 0},
    {"cast", {"x:300,200"}, "dtype='int32'", ALL, 1},
    {"cast", {"x:300,200S"}, "dtype='int64'", ALL, 1},
    {"cast", {"x:300,200"}, "dtype='bool'", ALL, 1},
    {"cast", {"b:300,200"}, "dtype='float32'", "", 1},
    {"cast", {"i1000:300,200T"}, "dtype='float32'", "", 1},
    /* joins and indexing */
    {"cat", {"x:2,3", "x:4,3", "x:0,3"}, "dim=0", ALL, 1},
    {"cat", {"x:2,3", "x:2,2"}, "dim=1", F, 1},
    {"stack", {"x:2,3", "x:2,3"}, "dim=1", ALL, 1},
    /* cat/stack on cpu (cpu_index.c): contiguous blocks and strided inputs (variant 1),
     * negative dims, one input, 0-size, 0-dim, mixed dtypes (promoted: ref), threaded */
    {"cat", {"x:2,3,4", "x:2,5,4", "x:2,1,4S"}, "dim=-2", ALL, 1},
    {"cat", {"x:3,4"}, "dim=1", ALL, 1},
    {"cat", {"x:0,3", "x:0,3"}, "dim=0", F, 1},
    {"cat", {"x:3,0", "x:3,2"}, "dim=1", ALL, 1},
    {"cat", {"x:3,4", "f:3,4"}, "dim=0", "dhbilo", 1},
    {"cat", {"x:300,200", "x:300,100", "x:300,1E"}, "dim=1", ALL, 1},
    {"cat", {"x:300,200", "x:100,200T"}, "dim=0", ALL, 1},
    {"cat", {"x:70000", "x:5"}, "dim=-1", "sdo", 1},
    {"stack", {"x:", "x:", "x:"}, "dim=0", ALL, 1},
    {"stack", {"x:2,3,4", "x:2,3,4S"}, "dim=-1", ALL, 1},
    {"stack", {"x:3,4"}, "dim=0", F, 1},
    {"stack", {"x:0,4", "x:0,4"}, "dim=1", F, 1},
    {"stack", {"x:300,200", "x:300,200", "x:300,200T"}, "dim=1", ALL, 1},
    {"gather", {"x:4,5", "i4:4,3"}, "dim=0", ALL, 1},
    {"gather", {"x:", "i1:3"}, "dim=0", ALL, 1}, /* a 0-d input, a 1-D index */
    {"gather", {"x:", "i1:"}, "dim=-1", ALL, 1},
    {"scatter_add", {"x:4,5", "i4:3,5", "x:3,5"}, "dim=0", NUM, 1},
    {"index_select", {"x:4,5", "i5:3"}, "dim=1", ALL, 1},
    {"one_hot", {"i6:3,4"}, "num_classes=6", "", 1},
    {"one_hot", {"i10:300,200"}, "num_classes=10", "", 1},
    {"one_hot", {"i10:300,200T"}, "num_classes=10", "", 1},
    {"embedding", {"i10:3,4", "x:10,6"}, "", FA, 1},
    /* embedding_bag: o<n>:<k> is k offsets into n indices (0 first, never decreasing) */
    {"embedding_bag", {"i10:12", "x:10,6", "o12:4"}, "mode='sum'", F, 1},
    {"embedding_bag", {"i10:12", "x:10,6", "o12:5"}, "include_last_offset=true", F, 1},
    {"embedding_bag", {"i10:12", "x:10,6", "o12:4"}, "padding_idx=3", F, 1},
    {"embedding_bag", {"i10:12", "x:10,6", "o12:4", "x:12"}, "mode='sum';padding_idx=-2", F, 1},
    {"embedding_bag", {"i10:12", "x:10,6", "o12:4"}, "mode='max'", F, 1},
    {"embedding_bag", {"i10:0", "x:10,6", "o0:3"}, "mode='mean'", F, 1}, /* empty bags */
    {"embedding_bag_backward", {"x:4,6", "i10:12", "o12:4", "x:10,6"}, "mode='mean'", F, 1},
    {"embedding_bag_backward", {"x:4,6", "i10:12", "o12:4", "x:10,6"}, "mode='max'", F, 1},
    /* multinomial: the same draws (tdd_opreq.seed) on every backend */
    {"multinomial", {"p:5,7"}, "num_samples=4", F, 0},
    {"multinomial", {"p:7"}, "num_samples=7", F, 0},
    {"multinomial", {"p:3,7"}, "num_samples=9;replacement=true", F, 0},
    {"tril", {"x:4,5"}, "diagonal=1", ALL, 1},
    {"triu", {"x:2,4,5"}, "diagonal=-1", ALL, 1},
    {"pad", {"x:3,4"}, "pad=[1,2,0,1];value=0.5", ALL, 1},
    /* tril/triu/pad on cpu (cpu_index.c): batched, diagonals past either edge, wide and
     * tall, strided (variant 1), 0-size, threaded; pad: negative (cropping), every dim,
     * rows wholly outside, a value that integers truncate, 0-dim */
    {"tril", {"x:3,5,4"}, "diagonal=-2", ALL, 1},
    {"tril", {"x:4,5"}, "diagonal=7", F, 1},
    {"tril", {"x:4,5"}, "diagonal=-9", F, 1},
    {"triu", {"x:5,3"}, "diagonal=1", ALL, 1},
    {"triu", {"x:2,0,3"}, "", F, 1},
    {"tril", {"x:2,300,200"}, "", ALL, 1},
    {"triu", {"x:300,300S"}, "diagonal=3", ALL, 1},
    {"pad", {"x:2,3,4"}, "pad=[-1,2,1,-1,1,0];value=-2.5", SNUM "o", 1},
    {"pad", {"x:3,4"}, "pad=[0,0,-3,1]", F, 1},
    {"pad", {"x:3,4"}, "pad=[-4,1]", F, 1},
    {"pad", {"x:5"}, "pad=[2,3];value=1.75", ALL, 1},
    {"pad", {"x:"}, "pad=[]", F, 1},
    {"pad", {"x:300,200"}, "pad=[3,-5,2,2];value=7", ALL, 1},
    {"pad", {"x:4,300,60"}, "pad=[0,0,0,0,1,1]", "so", 1},
    /* NN */
    {"cross_entropy", {"x:8,10", "i10:8"}, "", FA, 1},
    {"cross_entropy", {"x:8,10", "i10:8"}, "reduction='sum';label_smoothing=0.1", F, 1},
    {"cross_entropy", {"x:8,10", "i10:8"}, "reduction='none';ignore_index=3", F, 1},
    {"cross_entropy", {"x:10", "i10:"}, "", F, 1},
    {"nll_loss", {"x:8,10", "i10:8"}, "", FA, 1},
    {"mse_loss", {"x:4,5", "x:4,5"}, "", FA, 1},
    {"mse_loss", {"x:4,5", "x:4,5"}, "reduction='none'", F, 1},
    {"binary_cross_entropy_with_logits", {"x:4,5", "x:4,5"}, "reduction='sum'", FA, 1},
    {"layer_norm", {"x:4,6", "x:6", "x:6"}, "normalized_shape=[6]", FA, 2},
    {"layer_norm", {"x:2,3,4"}, "normalized_shape=[3,4];eps=0.001", F, 2},
    {"dropout", {"x:8,9"}, "p=0.3", FA, 1},
    {"dropout", {"x:8,9"}, "p=0.3;train=false", F, 1},
    /* dropout on cpu (cpu_index.c): the same draws as ref, strided (variant 1), threaded,
     * p at both ends, 0-size. Exact (tol 0) where the wire suite (which cannot give cpu
     * and ref one seed) holds training outputs to x/(1-p) from the unrounded input */
    {"dropout", {"x:300,200"}, "p=0.5", FA, 1},
    {"dropout", {"x:300,200S"}, "p=0.1", FA, 1},
    {"dropout", {"x:70000"}, "p=0.9;train=false", FA, 0},
    {"dropout", {"x:3,4"}, "p=1.0", FA, 0},
    {"dropout", {"x:3,4"}, "p=0.0", FA, 1},
    {"dropout", {"x:0,4"}, "p=0.5", F, 1},
    {"conv2d", {"x:2,3,7,6", "x:4,3,3,2", "x:4"}, "stride=[2,1];padding=1", F, 30},
    {"conv2d", {"x:2,4,5,5", "x:6,2,3,3"}, "groups=2;dilation=2;padding=2", F, 30},
    {"max_pool2d", {"x:2,3,7,6"}, "kernel_size=3;stride=2;padding=1", FA, 1},
    {"max_pool2d", {"x:3,6,6"}, "kernel_size=2;return_indices=true;ceil_mode=true", F, 1},
    {"avg_pool2d", {"x:2,3,7,6"}, "kernel_size=3;stride=2;padding=1", FA, 1},
    {"avg_pool2d", {"x:2,3,7,6"}, "kernel_size=2;padding=1;count_include_pad=false", F, 1},
    /* NN at sizes the cpu kernels thread (im2col rows, planes, rows, lines) */
    {"conv2d", {"x:2,16,20,20", "x:32,16,3,3", "x:32"}, "padding=1", F, 100},
    {"conv2d", {"x:2,8,9,9", "x:8,2,3,3"}, "groups=4;dilation=[2,1];stride=2;padding=[2,1]", F, 30},
    {"conv2d", {"x:2,6,5,5", "x:4,6,1,1", "x:4"}, "", F, 30},
    {"conv2d", {"x:3,5,5", "x:4,3,3,3"}, "padding=1;stride=[1,2]", F, 30},
    {"conv2d", {"x:2,3,5,6", "x:4,3,2,4", "x:4"}, "padding='same'", FA, 30}, /* even spans */
    {"conv2d", {"x:1,4,6,5", "x:4,2,3,2"}, "padding='same';dilation=[2,1];groups=2", F, 30},
    {"conv2d", {"x:2,3,5,6", "x:4,3,3,2"}, "padding='valid';stride=2", F, 30},
    {"conv2d", {"x:2,4,6,6", "x:6,2,3,3", "x:6"}, "groups=2;padding=1", "hb", 30},
    {"max_pool2d", {"x:2,3,8,8"}, "kernel_size=2;return_indices=true", "hb", 1},
    {"matmul", {"x:2,5,7", "x:7,3"}, "", "hb", 30},
    {"linear", {"x:8,5", "x:3,5", "x:3"}, "", "hb", 30},
    {"max_pool2d", {"x:4,16,32,32"}, "kernel_size=3;stride=2;padding=1;return_indices=true", F, 1},
    {"max_pool2d", {"x:2,3,9,9"}, "kernel_size=2;dilation=2;stride=1", F, 1},
    {"avg_pool2d", {"x:4,16,32,32"}, "kernel_size=2", F, 1},
    /* cpu_pool.c's paths: the 2x2 stride-2 loop (odd sizes, threads), the general loop
     * (ceil_mode's partial windows, padding, dilation, stride != kernel, an empty dilated
     * window), avg's clipped windows; variant 1's transposed input takes the general loop */
    {"max_pool2d", {"x:2,3,9,11"}, "kernel_size=2;return_indices=true", F, 1},
    {"max_pool2d", {"x:4,16,64,64"}, "kernel_size=2;return_indices=true", F, 1},
    {"max_pool2d", {"x:2,3,9,11"}, "kernel_size=2;ceil_mode=true;return_indices=true", F, 1},
    {"max_pool2d",
     {"x:2,3,10,9"},
     "kernel_size=[3,2];stride=[1,3];padding=1;dilation=[2,1];ceil_mode=true;return_indices=true",
     F,
     1},
    {"max_pool2d", {"x:1,2,2,2"}, "kernel_size=2;padding=1;dilation=3;return_indices=true", F, 1},
    {"avg_pool2d",
     {"x:2,3,10,9"},
     "kernel_size=[3,2];stride=[2,3];padding=1;ceil_mode=true;count_include_pad=false",
     F,
     1},
    {"avg_pool2d", {"x:4,16,64,64"}, "kernel_size=3;stride=2;padding=1", F, 1},
    /* cpu_nn.c's conv2d: samples in one GEMM (bias, groups), more samples than one block,
     * im2col transposed (an output narrower than the kernel, as weight gradients) */
    {"conv2d", {"x:5,6,9,8", "x:6,2,3,2", "x:6"}, "groups=3;stride=[2,1];padding=[1,0]", F, 30},
    {"conv2d", {"x:7,32,24,24", "x:4,32,3,3", "x:4"}, "padding=1", F, 100},
    {"conv2d", {"x:3,4,12,12", "x:5,4,10,10", "x:5"}, "padding=1", F, 100},
    {"conv2d", {"x:2,3,13,12", "x:4,3,4,5"}, "dilation=2;stride=[2,3];padding=[2,1]", F, 30},
    {"layer_norm", {"x:512,128", "x:128", "x:128"}, "normalized_shape=[128]", F, 2},
    {"cross_entropy", {"x:4096,10", "i10:4096"}, "label_smoothing=0.2", F, 10},
    {"nll_loss", {"x:4096,10", "i10:4096"}, "reduction='sum';ignore_index=2", F, 10},
    {"mse_loss", {"x:300,200", "x:300,200"}, "", F, 10},
    {"binary_cross_entropy_with_logits", {"x:300,200", "x:300,200"}, "reduction='none'", F, 1},
    {"embedding", {"i1000:64,64", "x:1000,32"}, "", F, 1},
    {"index_select", {"x:300,200", "i300:150"}, "dim=0", ALL, 1},
    {"gather", {"x:300,200", "i200:300,150"}, "dim=1", F, 1},
    {"scatter_add", {"x:300,200", "i300:250,200", "x:250,200"}, "dim=0", F, 1},
    /* creation */
    {"full", {NULL}, "shape=[3,4];value=1.5", NUM, 1},
    {"zeros", {NULL}, "shape=[3,0]", ALL, 1},
    {"ones", {NULL}, "shape=[100000]", ALL, 1},
    {"arange", {NULL}, "end=10", "", 1},
    {"arange", {NULL}, "start=1;end=2.5;step=0.25", "sd", 1},
    {"linspace", {NULL}, "start=-1;end=1;steps=7", FA, 1},
    {"eye", {NULL}, "n=3;m=4", ALL, 1},
    {"rand", {NULL}, "shape=[70000]", FA, 1},
    {"randn", {NULL}, "shape=[5,7]", FA, 1},
    {"randint", {NULL}, "low=-3;high=9;shape=[40]", "il", 1},
    /* the argument forms PyTorch accepts (kept last: a row's data is seeded by its
     * index, so rows added above would change the data of every row below) */
    {"clamp", {"x:3,4", "x:4", "x:3,1"}, "", NUM, 1}, /* tensor bounds */
    {"clamp", {"x:3,4", "x:"}, "", NUM, 1},
    {"clamp", {"x:4", "x:2,4", "x:4S"}, "", F, 1},
    {"pad", {"x:2,3,5"}, "pad=[2,3];mode='reflect'", ALL, 1}, /* modes that read the input */
    {"pad", {"x:1,2,4,5T"}, "pad=[1,2,3,0];mode='replicate'", ALL, 1},
    {"pad", {"x:1,1,3,4,3"}, "pad=[1,1,2,0,0,2];mode='circular'", ALL, 1},
    {"pad", {"x:3,4,5"}, "pad=[-1,2,1,3];mode='reflect'", F, 1},
    {"pad", {"x:1,2,5,6"}, "pad=[-2,3,1,-1];mode='circular'", F, 1},
    {"cross_entropy", {"x:2,4,3,2", "i4:2,3,2"}, "", FA, 1}, /* [N, C, d...] */
    {"cross_entropy", {"x:3,5,4T", "i5:3,4", "p:5"}, "reduction='sum';label_smoothing=0.2", FA, 1},
    {"cross_entropy", {"x:6,4", "i4:6", "p:4"}, "ignore_index=2", F, 1}, /* weights */
    {"cross_entropy", {"x:2,3,4", "p:2,3,4"}, "reduction='none'", F, 1}, /* soft targets */
    {"cross_entropy", {"x:4,5", "p:4,5", "p:5"}, "label_smoothing=0.1", FA, 1},
    {"nll_loss", {"x:2,4,3", "i4:2,3", "p:4"}, "reduction='none'", F, 1},
    {"nll_loss", {"x:5,3", "i3:5", "p:3"}, "ignore_index=0", FA, 1},
    {"sort", {"x:3,5"}, "", ALL, 1},
    {"max", {"x:3,5"}, "dim=1", ALL, 1},
    {"min", {"x:4,3,2T"}, "dim=0;keepdim=true", ALL, 1},
    {"group_norm", {"x:2,6,3,2", "x:6", "x:6"}, "num_groups=3", FA, 4},
    {"group_norm", {"x:3,4,5T"}, "num_groups=2;eps=0.001", F, 4},
    {"batch_norm", {"x:4,3,2,2", "x:3C", "p:3C", "x:3"}, "training=true;momentum=0.2", FA, 4},
    {"batch_norm", {"x:3,4,5T", "x:4", "p:4", "x:4"}, "eps=0.001", FA, 4},
    {"batch_norm", {"x:5,3"}, "training=true", F, 4},
    {"batch_norm", {"x:8,3,10,10", "x:3C", "p:3C"}, "training=true", F, 4}, /* whole blocks */
    {"conv1d", {"x:2,4,9", "x:6,2,3", "x:6"}, "stride=2;padding=1;dilation=2;groups=2", FA, 4},
    {"conv1d", {"x:3,7T", "x:2,3,4"}, "padding='same'", F, 4},
    {"conv_transpose2d", {"x:2,4,3,5", "x:4,3,3,2", "x:3"}, "stride=2;padding=[1,0]", FA, 4},
    {"conv_transpose2d", {"x:1,2,3,4", "x:2,3,2,2"}, "stride=2;output_padding=1", F, 4},
    {"conv_transpose2d", {"x:4,3,3T", "x:4,2,3,3"}, "stride=[1,2];groups=2;dilation=2", F, 4},
    {"conv_transpose2d", {"x:2,4,3,3", "x:4,2,3,3", "x:4"}, "groups=2;dilation=2", F, 4},
    {"adaptive_avg_pool2d", {"x:2,3,7,5"}, "output_size=[3,2]", FA, 4},
    {"adaptive_avg_pool2d", {"x:3,4,4T"}, "output_size=1", F, 4},
    {"adaptive_avg_pool2d", {"x:1,2,3,3"}, "output_size=[5,4]", F, 4},
    {"max_pool1d", {"x:2,3,11"}, "kernel_size=3;stride=2;padding=1;return_indices=true", FA, 1},
    {"max_pool1d", {"x:3,10T"}, "kernel_size=[2];dilation=2;ceil_mode=true", F, 1},
    {"avg_pool1d", {"x:2,3,11"}, "kernel_size=3;stride=2;padding=1;ceil_mode=true", FA, 1},
    {"avg_pool1d", {"x:4,9T"}, "kernel_size=4;padding=2;count_include_pad=false", F, 1},
    {"max_pool2d_backward", {"x:2,3,5,4", "x:2,3,9,8"}, "kernel_size=3;stride=2;padding=1", FA, 1},
    {"max_pool2d_backward",
     {"x:3,3,3", "x:3,7,7"},
     "kernel_size=2;dilation=2;ceil_mode=true;return_indices=true",
     F,
     1},
    {"pixel_shuffle", {"x:2,12,3,4"}, "upscale_factor=2", ALL, 1},
    {"pixel_shuffle", {"x:2,3,9,2,3T"}, "upscale_factor=3", F, 1},
    {"pixel_unshuffle", {"x:2,3,6,4"}, "downscale_factor=2", ALL, 1},
    {"pixel_unshuffle", {"x:3,4,6T"}, "downscale_factor=1", F, 1},
    {"addmm", {"x:3", "x:2,4", "x:4,3"}, "beta=0.5;alpha=2", FA, 4},
    {"addmm", {"x:2,3", "x:2,4", "x:4,3T"}, "beta=2;alpha=3", "il", 1},
    {"baddbmm", {"x:3,1", "x:2,3,4", "x:2,4,3"}, "", FA, 4},
    {"sort", {"x:4,3,2T"}, "dim=1;descending=true", ALL, 1},
    {"argsort", {"x:2,6"}, "dim=0", ALL, 1},
    {"argsort", {"x:7"}, "descending=true", NUM, 1},
    {"topk", {"x:4,6"}, "k=3", ALL, 1},
    {"topk", {"x:5,3,2"}, "k=2;dim=0;largest=false", NUM, 1},
    {"topk", {"x:"}, "k=1", F, 1},
    /* scaled_dot_product_attention: batch dims that broadcast, L != S, bool and added masks,
     * strided operands, causal, scale, dropout (the same draws on every backend) */
    {"scaled_dot_product_attention", {"x:2,3,4", "x:2,5,4", "x:2,5,3"}, "", FA, 4},
    {"scaled_dot_product_attention", {"x:2,1,3,4", "x:1,2,5,4", "x:5,3T", "b:3,5"}, "", FA, 4},
    {"scaled_dot_product_attention", {"x:2,4,3", "x:6,3T", "x:6,2", "x:4,6"}, "scale=0.5", F, 4},
    {"scaled_dot_product_attention", {"x:3,6,4", "x:3,6,4", "x:3,6,5"}, "is_causal=true", FA, 4},
    {"scaled_dot_product_attention", {"x:2,6,4", "x:2,7,4", "x:2,7,4"}, "dropout_p=0.3", F, 4},
    /* interpolate: nearest and (bi)linear, align_corners, strided (scale_factor, a float list the
     * table's attributes cannot write: test_attention.py) */
    {"interpolate", {"x:2,3,4,5"}, "size=[7,3]", FA, 4},
    {"interpolate", {"x:1,2,5,4T"}, "size=[7,3]", F, 4},
    {"interpolate", {"x:2,3,5"}, "size=8;mode='linear'", FA, 4},
    {"interpolate", {"x:2,2,4,5"}, "size=[7,9];mode='bilinear'", FA, 4},
    {"interpolate", {"x:1,3,4,3"}, "size=[6,7];mode='bilinear';align_corners=true", F, 4},
    {"interpolate", {"x:1,2,3,4T"}, "size=[6,8];mode='bilinear'", F, 4},
};
const int conf_ncases = (int)(sizeof conf_cases / sizeof conf_cases[0]);

td_dtype conf_dtype_of(char l)
{
    switch (l) {
    case 's':
        return TD_F32;
    case 'd':
        return TD_F64;
    case 'h':
        return TD_F16;
    case 'b':
        return TD_BF16;
    case 'i':
        return TD_I32;
    case 'l':
        return TD_I64;
    case 'o':
        return TD_BOOL;
    case 'u':
        return TD_U8;
    case 'c':
        return TD_I8;
    case 'w':
        return TD_I16;
    default:
        return TD_DTYPE_INVALID;
    }
}

/* ------------------------------------------------------------------ parsing */

static int parse_shape(const char *s, int64_t *shape)
{
    int n = 0;
    while (*s && *s != 'T' && *s != 'S' && *s != 'E' && *s != 'C') {
        shape[n++] = strtoll(s, (char **)&s, 10);
        if (*s == ',')
            s++;
    }
    return n;
}

void conf_parse_attrs(const char *s, conf_attrs *as)
{
    memset(as, 0, sizeof *as);
    while (s && *s && as->n < CONF_MAX_ATTRS) {
        size_t k = as->n++;
        td_attr *a = &as->a[k];
        const char *eq = strchr(s, '=');
        snprintf(as->names[k], sizeof as->names[k], "%.*s", (int)(eq - s), s);
        a->name = as->names[k];
        const char *v = eq + 1, *end = strchr(v, ';');
        size_t len = end ? (size_t)(end - v) : strlen(v);
        if (*v == '[') {
            a->kind = TD_ATTR_INTS;
            a->ints = as->ints[k];
            const char *q = v + 1;
            while (*q != ']') {
                as->ints[k][a->n++] = strtoll(q, (char **)&q, 10);
                if (*q == ',')
                    q++;
            }
        } else if (*v == '\'') {
            a->kind = TD_ATTR_STR;
            snprintf(as->strs[k], sizeof as->strs[k], "%.*s", (int)len - 2, v + 1);
            a->s = as->strs[k];
        } else if (strncmp(v, "true", 4) == 0 || strncmp(v, "false", 5) == 0) {
            a->kind = TD_ATTR_BOOL;
            a->b = *v == 't';
        } else if (memchr(v, '.', len) || memchr(v, 'e', len)) {
            a->kind = TD_ATTR_FLOAT;
            a->f = strtod(v, NULL);
        } else {
            a->kind = TD_ATTR_INT;
            a->i = strtoll(v, NULL, 10);
        }
        s = end ? end + 1 : NULL;
    }
}

/* ------------------------------------------------------------------ data */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static double rnd_unit(void)
{
    return (double)(rnd() >> 11) * 0x1.0p-53;
}

/* A tensor on one backend, built from a spec; storage owned by the harness. */
typedef struct {
    tdd_tensor t;
    tdd_storage st;
    conf_backend *be;
} htensor;

static int make_tensor(htensor *h, conf_backend *be, td_dtype dt, const int64_t *shape, int nd,
                       char layout, const double *vals, const int64_t *ivals)
{
    memset(h, 0, sizeof *h);
    h->be = be;
    tdd_tensor *t = &h->t;
    t->dtype = dt;
    t->ndim = nd;
    memcpy(t->shape, shape, (size_t)nd * sizeof *shape);
    int64_t n = tdd_numel(t), cap;
    /* strides for the layout; cap = storage elements needed */
    if (layout == 'T' && nd >= 2) {
        /* stored as [..., n-1, n-2] contiguous, viewed with the last two swapped */
        tdd_tensor s = *t;
        s.shape[nd - 1] = shape[nd - 2];
        s.shape[nd - 2] = shape[nd - 1];
        tdd_set_contiguous(&s);
        memcpy(t->strides, s.strides, sizeof t->strides);
        t->strides[nd - 1] = s.strides[nd - 2];
        t->strides[nd - 2] = s.strides[nd - 1];
        cap = n;
    } else if (layout == 'S' && nd >= 1) {
        tdd_tensor s = *t;
        s.shape[nd - 1] *= 2;
        tdd_set_contiguous(&s);
        memcpy(t->strides, s.strides, sizeof t->strides);
        t->strides[nd - 1] = 2;
        cap = 2 * n;
    } else if (layout == 'E' && nd >= 1) {
        tdd_set_contiguous(t);
        t->strides[0] = 0;
        cap = shape[0] ? n / shape[0] : 0;
    } else {
        tdd_set_contiguous(t);
        cap = n;
    }
    t->offset = 3; /* never start at element 0: offsets must be honoured */
    size_t esz = td_dtype_size(dt), nbytes = (size_t)(cap + 3) * esz;
    h->st.data = be->be->alloc(be->ctx, 0, nbytes);
    h->st.nbytes = nbytes;
    atomic_init(&h->st.refs, 1);
    t->st = &h->st;
    if (!h->st.data)
        return -1;
    /* Device memory (cuda, sim) is filled through a host buffer, as the daemon does. */
    void *dev = h->st.data, *host = be->be->host_memory ? dev : malloc(nbytes ? nbytes : 1);
    if (!host)
        return -1;
    h->st.data = host;
    memset(h->st.data, 0x7f, nbytes);
    int64_t idx[TD_MAX_NDIM];
    for (int64_t i = 0; i < n; i++) {
        int64_t off = t->offset, r = i;
        for (int d = nd - 1; d >= 0; d--) {
            idx[d] = r % shape[d];
            r /= shape[d];
            off += idx[d] * t->strides[d];
        }
        if (ivals)
            tdd_store_i(h->st.data, dt, off, ivals[i]);
        else if (vals)
            tdd_store_f(h->st.data, dt, off, vals[i]);
    }
    h->st.data = dev;
    if (host != dev) {
        int rc = be->be->from_host(be->ctx, 0, dev, host, nbytes);
        free(host);
        return rc;
    }
    return 0;
}

/* A host copy of h's whole storage viewed like h (h itself when host memory). */
static bool host_view(const htensor *h, tdd_tensor *out, tdd_storage *st)
{
    *out = h->t;
    if (h->be->be->host_memory)
        return true;
    *st = h->st;
    st->data = malloc(h->st.nbytes ? h->st.nbytes : 1);
    if (!st->data || h->be->be->to_host(h->be->ctx, 0, st->data, h->st.data, h->st.nbytes)) {
        free(st->data);
        st->data = NULL;
        return false;
    }
    out->st = st;
    return true;
}

static void free_tensor(htensor *h)
{
    if (h->st.data)
        h->be->be->free(h->be->ctx, 0, h->st.data, h->st.nbytes);
    h->st.data = NULL;
}

/* ------------------------------------------------------------------ compare */

/* Every float tolerance from the dtype's machine epsilon (the gap above 1.0, ldexp(1, -m)
 * for m mantissa bits), times the ulps allowed: f16 and bf16 results are computed in f32 and
 * rounded once, so a backend doing the same is within one ulp of ref (relative eps; absolute
 * eps near zero); f32 allows 17 ulps and f64 4504 (sums in another order, libm's last bits).
 * A case's tol scales these (0: bit-exact, as the casts to f16 and bf16 are). */
static void dtype_tolerances(td_dtype dt, double *rtol, double *atol)
{
    double eps = 0, r = 0, a = 0; /* epsilon, relative and absolute ulps */
    switch (dt) {
    case TD_F32:
        eps = ldexp(1, -23), r = 17, a = 8.5;
        break;
    case TD_F64:
        eps = ldexp(1, -52), r = 4504, a = 451;
        break;
    case TD_F16:
        eps = ldexp(1, -10), r = a = 1;
        break;
    case TD_BF16:
        eps = ldexp(1, -7), r = a = 1;
        break;
    case TD_I32:
    case TD_I64:
    case TD_BOOL:
    case TD_U8:
    case TD_I8:
    case TD_I16:
    case TD_DTYPE_INVALID:
    case TD_DTYPE_COUNT:
        *rtol = *atol = 0;
        return;
    }
    *rtol = r * eps;
    *atol = a * eps;
}

void conf_tolerances(td_dtype dt, double tol, double *rtol, double *atol)
{
    dtype_tolerances(dt, rtol, atol);
    *rtol *= tol;
    *atol *= tol;
}

int64_t conf_compare(const tdd_tensor *r, const tdd_tensor *o, double tol, double *worst, char *msg,
                     size_t len)
{
    double rtol, atol;
    conf_tolerances(r->dtype, tol, &rtol, &atol);
    int64_t n = tdd_numel(r), bad = 0, idx[TD_MAX_NDIM];
    bool fl = tdd_dtype_is_float(r->dtype);
    for (int64_t i = 0; i < n; i++) {
        int64_t ro = r->offset, oo = o->offset, rem = i;
        for (int d = r->ndim - 1; d >= 0; d--) {
            idx[d] = rem % r->shape[d];
            rem /= r->shape[d];
            ro += idx[d] * r->strides[d];
            oo += idx[d] * o->strides[d];
        }
        bool ok;
        double a = 0, b = 0, q = 0;
        if (fl) {
            a = tdd_load_f(r->st->data, r->dtype, ro);
            b = tdd_load_f(o->st->data, o->dtype, oo);
            if (a != a || b != b)
                ok = (a != a) && (b != b);
            else if (isinf(a) || isinf(b))
                ok = a == b;
            else {
                q = fabs(a - b) / (atol + rtol * fabs(a));
                ok = fabs(a - b) <= atol + rtol * fabs(a);
            }
        } else {
            int64_t x = tdd_load_i(r->st->data, r->dtype, ro),
                    y = tdd_load_i(o->st->data, o->dtype, oo);
            ok = x == y;
            a = (double)x;
            b = (double)y;
        }
        if (q > *worst)
            *worst = q;
        if (!ok) {
            if (!bad)
                snprintf(msg, len, "element %lld: ref %.17g, other %.17g", (long long)i, a, b);
            bad++;
        }
    }
    return bad;
}

/* ------------------------------------------------------------------ inputs */

int conf_inputs(const conf_case *c, td_dtype dt, int variant, conf_input in[4])
{
    int n_in = 0;
    memset(in, 0, 4 * sizeof *in);
    rng_state = 0x9e3779b97f4a7c15u ^ (uint64_t)(c - conf_cases) * 7919u;
    for (int k = 0; k < 4 && c->inputs[k]; k++, n_in++) {
        const char *spec = c->inputs[k], *colon = strchr(spec, ':');
        conf_input *ci = &in[k];
        int64_t *shape = ci->shape;
        int nd = ci->ndim = parse_shape(colon + 1, shape);
        const char *lay = colon + 1 + strspn(colon + 1, "0123456789,");
        char layout = *lay;
        if (variant == 1 && !layout)
            layout = nd >= 2 ? 'T' : 'S';
        ci->layout = layout;
        int64_t n = 1;
        for (int d = 0; d < nd; d++)
            n *= shape[d];
        ci->numel = n;
        td_dtype idt = dt;
        double *vals = calloc((size_t)n + 1, sizeof *vals);
        int64_t *ivals = NULL;
        bool pos = spec[0] == 'p';
        if (spec[0] == 'i') {
            int64_t lim = strtoll(spec + 1, NULL, 10);
            idt = TD_I64;
            ivals = calloc((size_t)n + 1, sizeof *ivals);
            for (int64_t i = 0; i < n; i++)
                ivals[i] = (int64_t)(rnd() % (uint64_t)lim);
        } else if (spec[0] == 'o') { /* offsets into lim indices: 0, then sorted draws */
            int64_t lim = strtoll(spec + 1, NULL, 10);
            idt = TD_I64;
            ivals = calloc((size_t)n + 1, sizeof *ivals);
            for (int64_t i = 1; i < n; i++)
                ivals[i] = (int64_t)(rnd() % (uint64_t)(lim + 1));
            for (int64_t i = 1; i < n; i++) /* insertion sort: a handful of offsets */
                for (int64_t j = i; j > 1 && ivals[j - 1] > ivals[j]; j--) {
                    int64_t t = ivals[j];
                    ivals[j] = ivals[j - 1];
                    ivals[j - 1] = t;
                }
        } else if (spec[0] == 'b') {
            idt = TD_BOOL;
            for (int64_t i = 0; i < n; i++)
                vals[i] = (double)(rnd() & 1);
        } else {
            if (spec[0] == 'f')
                idt = TD_F32;
            for (int64_t i = 0; i < n; i++) {
                if (idt == TD_BOOL)
                    vals[i] = (double)(rnd() & 1);
                else if (!tdd_dtype_is_float(idt))
                    vals[i] = pos ? (double)(1 + rnd() % 5) : (double)((int)(rnd() % 11) - 5);
                else
                    vals[i] = pos ? 0.1 + 2.9 * rnd_unit() : -2.0 + 4.0 * rnd_unit();
            }
        }
        ci->dtype = idt;
        ci->vals = vals;
        ci->ivals = ivals;
    }
    return n_in;
}

void conf_inputs_free(conf_input in[4], int n)
{
    for (int k = 0; k < n; k++) {
        free(in[k].vals);
        free(in[k].ivals);
        in[k].vals = NULL;
        in[k].ivals = NULL;
    }
}

/* ------------------------------------------------------------------ runner */

void conf_run(const conf_case *c, td_dtype dt, int variant, conf_backend *ref, conf_backend *other,
              bool execute, conf_result *res)
{
    conf_attrs as;
    conf_parse_attrs(c->attrs, &as);
    conf_run_attrs(c, dt, variant, ref, other, execute, as.a, as.n, (int64_t)1 << 40, res);
}

void conf_run_attrs(const conf_case *c, td_dtype dt, int variant, conf_backend *ref,
                    conf_backend *other, bool execute, const td_attr *attrs, size_t n_attrs,
                    int64_t max_numel, conf_result *res)
{
    memset(res, 0, sizeof *res);
    const tdd_opdef *def = tdd_op_find(c->op);
    if (!def) {
        res->prep_rc = TD_EUNSUPPORTED_OP;
        snprintf(res->msg, sizeof res->msg, "no op named %s", c->op);
        return;
    }
    conf_backend *bes[2] = {ref, other};
    htensor in[2][4];
    htensor out[2][TDD_MAX_OP_OUTPUTS];
    int n_in = 0;
    memset(in, 0, sizeof in);
    memset(out, 0, sizeof out);
    conf_input spec[4];
    n_in = conf_inputs(c, dt, variant, spec);
    for (int k = 0; k < n_in; k++)
        for (int b = 0; b < 2; b++)
            if (bes[b])
                make_tensor(&in[b][k], bes[b], spec[k].dtype, spec[k].shape, spec[k].ndim,
                            spec[k].layout, spec[k].vals, spec[k].ivals);
    conf_inputs_free(spec, n_in);
    tdd_opreq req = {
        .attrs = {attrs, n_attrs}, .dtype = def->kind == TDD_KIND_CREATE ? dt : 0, .seed = 12345};
    if (def->kind == TDD_KIND_CREATE && dt == TD_DTYPE_INVALID)
        req.dtype = TD_DTYPE_INVALID;
    const tdd_tensor *tin[2][4];
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < n_in; k++)
            tin[b][k] = &in[b][k].t;
    tdd_opargs args;
    tdd_outdesc od[TDD_MAX_OP_OUTPUTS];
    int n_out = 0;
    td_error err;
    res->prep_rc = tdd_op_prepare(def->op, tin[0], n_in, &req, max_numel, &args, od, &n_out, &err);
    if (res->prep_rc) {
        res->prep_err = err;
        snprintf(res->msg, sizeof res->msg, "prepare: %.200s", err.message);
        goto done;
    }
    /* the output count ListOps tells clients is the one prepare makes */
    int want_out = tdd_op_num_outputs(def->op, attrs, n_attrs);
    if (want_out && want_out != n_out) {
        res->prep_rc = TD_EINTERNAL;
        snprintf(res->msg, sizeof res->msg, "prepare made %d outputs, the schema says %d", n_out,
                 want_out);
        goto done;
    }
    for (int b = 0; b < 2; b++) {
        if (!bes[b])
            continue;
        tdd_opcall call = {.op = def->op, .args = &args, .n_in = n_in, .n_out = n_out};
        for (int k = 0; k < n_in; k++)
            call.in[k] = tin[b][k];
        for (int k = 0; k < n_out; k++) {
            htensor *h = &out[b][k];
            if (od[k].view) {
                memset(h, 0, sizeof *h);
                h->t = in[b][od[k].view_of].t;
                h->t.ndim = od[k].ndim;
                memcpy(h->t.shape, od[k].shape, sizeof h->t.shape);
                memcpy(h->t.strides, od[k].strides, sizeof h->t.strides);
                h->t.offset = od[k].offset;
                h->t.dtype = od[k].dtype;
            } else {
                make_tensor(h, bes[b], od[k].dtype, od[k].shape, od[k].ndim, 0, NULL, NULL);
                h->t.offset = 3;
            }
            call.out[k] = &h->t;
        }
        int sup = bes[b]->be->supports ? bes[b]->be->supports(bes[b]->ctx, &call) : 0;
        res->supported[b] = sup == 0;
        if (b == 1 && strcmp(bes[b]->be->name, "cpu") == 0)
            res->native = tdd_cpu_native(&call);
        if (execute && sup == 0)
            res->rc[b] = bes[b]->be->execute(bes[b]->ctx, 0, &call);
        /* A device backend reports a kernel's refused values (an index out of range) at the
         * next synchronising point, as the daemon's Sync and downloads do: ask it here. */
        if (execute && sup == 0 && res->rc[b] == 0 && !bes[b]->be->host_memory &&
            bes[b]->be->synchronize)
            res->rc[b] = bes[b]->be->synchronize(bes[b]->ctx, 0);
    }
    if (execute && other && res->rc[0] == 0 && res->rc[1] == 0 && res->supported[1]) {
        for (int k = 0; k < n_out && !res->bad; k++) {
            tdd_tensor other_t;
            tdd_storage other_st = {0};
            const htensor *oh = &out[1][k];
            if (od[k].view) /* a view's storage is its input's */
                oh = &in[1][od[k].view_of];
            if (!host_view(oh, &other_t, &other_st)) {
                snprintf(res->msg, sizeof res->msg, "output %d: copy to host failed", k);
                res->bad = 1;
                break;
            }
            if (od[k].view)
                other_t = out[1][k].t, other_t.st = other_st.data ? &other_st : other_t.st;
            res->bad = conf_compare(&out[0][k].t, &other_t, c->tol, &res->worst, res->msg,
                                    sizeof res->msg);
            free(other_st.data);
            if (res->bad) {
                char tmp[sizeof res->msg];
                memcpy(tmp, res->msg, sizeof tmp);
                snprintf(res->msg, sizeof res->msg, "output %d: %lld bad; first %.180s", k,
                         (long long)res->bad, tmp);
            }
        }
    } else if (execute && res->rc[0] != res->rc[1] && res->supported[1]) {
        snprintf(res->msg, sizeof res->msg, "execute codes differ: ref %d, other %d", res->rc[0],
                 res->rc[1]);
        res->bad = 1;
    }
done:
    for (int b = 0; b < 2; b++) {
        for (int k = 0; k < n_in; k++)
            if (bes[b])
                free_tensor(&in[b][k]);
        for (int k = 0; k < TDD_MAX_OP_OUTPUTS; k++)
            if (out[b][k].be)
                free_tensor(&out[b][k]);
    }
}
