/* autograd_impl.h -- private to autograd*.c and optim.c: graph nodes, the
 * Gradients map, and the small op-builder the backward formulas are written in. */
#ifndef TDD_AUTOGRAD_IMPL_H
#define TDD_AUTOGRAD_IMPL_H

#include "autograd.h"
#include "exec_op.h"

/* What a node remembers about each input: enough metadata to shape the
 * gradient even after the saved tensors are freed, and the edge to follow. */
typedef struct {
    tdd_value *v;        /* saved input (ref), NULL when the formula needs no data */
    struct tdd_node *fn; /* the input's grad_fn (ref), NULL for leaves */
    int fn_out;          /* which output of fn the input is */
    tdd_value *leaf;     /* a tracked leaf (ref): the Gradients key */
    bool needs_grad;
    uint64_t version; /* v's storage version when saved: in-place updates since are errors */
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    tdd_device *dev;
} tdd_node_in;

typedef struct {
    uintptr_t id;     /* the output value's address: identifies it, never dereferenced */
    uintptr_t st;     /* its storage's address and offset: identify its aliases (a gradient */
    int64_t off;      /* read back through Grad, a saved output in a create_graph pass) */
    tdd_value *alias; /* saved output (own value sharing the storage), or NULL */
    uint64_t version; /* the output's storage version when recorded (as for inputs) */
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_NDIM];
    tdd_value *grad; /* backward scratch: the accumulated gradient (ref) */
} tdd_node_out;

typedef struct tdd_node {
    long refs;
    uint64_t seq;   /* creation order; a node's inputs' nodes were made before it */
    uint64_t visit; /* backward scratch: stamp of the pass that reached it */
    tdd_op op;
    bool to_device;   /* a ToDevice: the gradient is copied back */
    bool freed;       /* backward ran without retain_graph: saved tensors are gone */
    uint32_t capture; /* backward scratch: the outputs that are a grad-of pass's inputs */
    tdd_opargs args;
    int64_t ex[2 * TD_MAX_NDIM]; /* attributes the formula needs beyond args, normalised */
    /* the forward's attributes as sent, kept for an op whose backward is a call of another op
     * (its schema's grad): that call gets them (one allocation, counted in bytes) */
    td_attr *attrs;
    size_t n_attrs;
    int n_in, n_out;
    int cap_in, cap_out; /* as reserved (tdd_autograd_reserve) */
    tdd_node_in *in;     /* cap_in entries, in the same allocation */
    tdd_node_out *out;   /* cap_out entries, likewise */
    tdd_account *acct;   /* charged with bytes: a graph is memory the client caused */
    uint64_t bytes;
    struct tdd_node *free_next; /* deferred-free list */
} tdd_node;

void tdd_node_unref(tdd_node *n);

/* The Gradients object: tracked leaf -> gradient. */
typedef struct tdd_grad_entry {
    tdd_value *leaf; /* ref; the key is its address */
    tdd_value *grad; /* ref */
    UT_hash_handle hh;
} tdd_grad_entry;

typedef struct {
    tdd_grad_entry *map;
    tdd_account *acct; /* each entry is charged to the session that made it */
} tdd_grads;

tdd_grad_entry *tdd_grads_find(tdd_grads *g, const tdd_value *leaf);
/* Removes and frees one entry. */
void tdd_grads_drop(tdd_grads *g, tdd_grad_entry *e);
/* Sets leaf's gradient to grad (takes a new reference on both); a new entry is
 * charged to the session's memory (RESOURCE_EXHAUSTED in err when it is full). */
int tdd_grads_set(tdd_grads *g, tdd_value *leaf, tdd_value *grad, td_error *err);
/* A backward pass's options beyond the loss and its seed. */
typedef struct {
    bool retain_graph;
    /* The pass records itself (its ops become graph nodes, whatever the grad mode), so
     * the gradients it returns can be differentiated again. */
    bool create_graph;
    /* Only these tensors' gradients (leaves or not; torch.autograd.grad's inputs), and only
     * the part of the graph leading to them; n_inputs 0: every tracked leaf reached. */
    tdd_value *const *inputs;
    size_t n_inputs;
} tdd_backward_opts;

/* The backward pass from loss, seeded with go (ones when NULL): a new Gradients object
 * holding the tracked leaves' gradients (or the inputs'), as queued ops (*out), or a TD_E*
 * code with err set. The request's checks are the caller's (loss tracked, go fits it,
 * inputs tracked). */
int tdd_autograd_backward(tdd_session *s, uint64_t req_id, tdd_value *loss, tdd_value *go,
                          const tdd_backward_opts *o, tdd_grads **out, td_error *err);

/* A value sharing v's storage and readiness, with no autodiff history. */
tdd_value *tdd_value_alias(const tdd_value *v);
/* The same keeping v's history (grad_fn, requires_grad): a gradient made by a create_graph
 * pass, handed to the client, stays differentiable. */
tdd_value *tdd_value_alias_tracked(const tdd_value *v);

/* ---------------------------------------------------------------- op builder */

/* One backward pass in progress: where ops are queued, and the first error.
 * Every value the builder makes is kept in tmp and released when the pass
 * (or the node's formula) is done; callers take their own references. */
typedef struct {
    tdd_session *s;
    uint64_t req_id;
    bool create_graph; /* the ops queued are recorded (tdd_backward_opts) */
    int rc;
    td_error err;
    tdd_value **tmp;
    size_t ntmp, captmp;
} tdd_bw;

/* Queues op on inputs (NULL entries end the list early is an error); returns a
 * borrowed value (owned by bw->tmp), or NULL once bw has failed. */
tdd_value *tdd_bw_op(tdd_bw *b, tdd_op op, tdd_value *const *in, int n_in, const td_attr *attrs,
                     size_t nattrs, td_dtype dtype, tdd_device *dev);
/* The same for ops with several outputs: fills out[0..n_out) (borrowed). */
int tdd_bw_op_n(tdd_bw *b, tdd_op op, tdd_value *const *in, int n_in, const td_attr *attrs,
                size_t nattrs, tdd_value **out, int n_out);
void tdd_bw_keep(tdd_bw *b, tdd_value *v);   /* hands one reference to bw->tmp */
void tdd_bw_release(tdd_bw *b, size_t keep); /* drops tmp entries past keep */
int tdd_bw_fail(tdd_bw *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Computes the gradients of node n's inputs from the gradients of its
 * outputs (n->out[k].grad, never NULL here). gin[i] is set (borrowed from
 * b->tmp) for inputs with needs_grad, in any broadcast-compatible shape and
 * any float dtype: the caller reduces (sum_to) and casts to the input's.
 * Returns 0, or bw's error. */
int tdd_backward_formula(tdd_bw *b, tdd_node *n, tdd_value **gin);
/* Whether op has a backward formula; and which tensors it saves. */
bool tdd_formula_exists(tdd_op op);
/* 0 when prog (an op schema's grad, ops.h) is a call the backward can make; else -1 and why. */
int tdd_grad_program_check(const char *prog, char *why, size_t len);
bool tdd_formula_saves_inputs(tdd_op op);
bool tdd_formula_saves_output(tdd_op op);
/* An input of an op that saves its inputs which the formula never reads, for these args. */
bool tdd_formula_skips_input(tdd_op op, const tdd_opargs *args, int i);
/* Fills n->ex from the request's attributes at record time (views' dims). */
void tdd_formula_note_attrs(tdd_node *n, const tdd_attrs *attrs);

/* ---------------------------------------------------------------- optim.c */

/* Gives optimizer handles their free function. */
void tdd_optim_init(void);

/* Per-session autodiff state (s->autograd). */
typedef struct {
    /* An OptimizerStep whose updates are queued: its reply waits for them. */
    bool step_active;
    uint64_t step_req;
    bool step_failed;
    td_error step_err;
} tdd_ag_session;

tdd_ag_session *tdd_ag_state(tdd_session *s);

#endif
