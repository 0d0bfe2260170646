/* autograd.c -- autodiff in the daemon (first slice: grad mode; the graph lands next). */
#include "autograd.h"

void tdd_autograd_init(void)
{
}

void tdd_autograd_record(tdd_session *s, tdd_op op, const tdd_opargs *args,
                         tdd_value *const *in, int n_in, tdd_value *const *out, int n_out)
{
    (void)s;
    (void)op;
    (void)args;
    (void)in;
    (void)n_in;
    for (int i = 0; i < n_out; i++)
        out[i]->requires_grad = true;
}

void tdd_autograd_record_to_device(tdd_session *s, tdd_value *in, tdd_value *out)
{
    (void)s;
    (void)in;
    out->requires_grad = true;
}

void tdd_autograd_session_free(tdd_session *s)
{
    (void)s;
}

int tdd_autograd_dispatch(tdd_conn *c, Tensordd__V1__Request *req)
{
    td_error err;
    if (req->body_case == TENSORDD__V1__REQUEST__BODY_SET_GRAD_MODE) {
        c->s->grad_enabled = req->set_grad_mode->enabled;
        if (req->want_reply)
            tdd_conn_send_ok(c, req->id);
        return TDD_DISPATCH_DONE;
    }
    tdd_err_set(&err, TD_EUNSUPPORTED_OP, "autodiff requests are not served yet");
    err.request_id = req->id;
    tdd_conn_send_error(c, req->id, &err);
    return TDD_DISPATCH_DONE;
}
