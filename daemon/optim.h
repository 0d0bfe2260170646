/* optim.h -- the optimizer engine (optim.c): SGD, Adam, AdamW, RMSprop and Adagrad state
 * per parameter and the update itself; the requests that drive it are in optim_req.c. */
#ifndef TDD_OPTIM_H
#define TDD_OPTIM_H

#include "autograd_impl.h"

typedef enum { OPT_SGD, OPT_ADAM, OPT_ADAMW, OPT_RMSPROP, OPT_ADAGRAD } opt_kind;

typedef struct {
    opt_kind kind;
    double lr, momentum, dampening, weight_decay, beta1, beta2, eps;
    double alpha;              /* RMSprop: smoothing of square_avg */
    double lr_decay, init_acc; /* Adagrad: lr / (1 + (step - 1) * lr_decay); sum's start */
    bool nesterov, maximize;
    bool amsgrad;  /* Adam(W): normalise by the largest exp_avg_sq so far */
    bool centered; /* RMSprop: subtract the squared mean gradient (grad_avg) */
    bool foreach;  /* update with queued ops (any backend) rather than a host loop */
} opt_hyper;

typedef struct {
    tdd_value *p;      /* ref */
    tdd_value *buf[3]; /* SGD: momentum; Adam: exp_avg, exp_avg_sq (, max_exp_avg_sq with
                        * amsgrad); RMSprop: square_avg, momentum_buffer (momentum > 0),
                        * grad_avg (centered); Adagrad: sum. NULL until a step needs it */
    int64_t step;
    unsigned fresh; /* bit k: buf[k] holds nothing yet (allocated, its first update not queued) */
} opt_param;

typedef struct {
    opt_hyper h;
    size_t n;
    opt_param *ps;
    tdd_account *acct; /* charged with bytes: the parameter list is memory the client caused */
    uint64_t bytes;
} tdd_optim;

/* The buffers (bit k: buf[k]) a step with options h keeps per parameter. */
unsigned tdd_optim_kept(const opt_hyper *h);

/* An optimizer for n_params parameters (none added yet), its bookkeeping charged to the
 * session; NULL with err set (RESOURCE_EXHAUSTED) when it cannot be. */
tdd_optim *tdd_optim_new(tdd_session *s, size_t n_params, td_error *err);
/* Appends parameter p (takes a reference). */
void tdd_optim_add_param(tdd_optim *o, tdd_value *p);
void tdd_optim_free(tdd_optim *o);
/* One step of o with the gradients in grads, every check done before anything is
 * queued (a failed step changes no parameter). Returns a negative TD_E* (err set),
 * 0 when every update has run (a failed queued op is the session's pending error),
 * or 1 when updates are queued: their verdict is in ag->step_failed/step_err once the
 * session's work is done. */
int tdd_optim_step_run(tdd_session *s, tdd_ag_session *ag, uint64_t req_id, tdd_optim *o,
                       tdd_grads *grads, td_error *err);

#endif
