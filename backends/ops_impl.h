/* ops_impl.h -- the shape rules' families, which tdd_op_prepare (ops.c) dispatches to;
 * their helpers are in ops_args.h. */
#ifndef TDD_OPS_IMPL_H
#define TDD_OPS_IMPL_H

#include "ops_args.h"

int tdd_prep_shape(tdd_prep *p);  /* ops_shape.c: views, copies, joins, indexing */
int tdd_prep_nn(tdd_prep *p);     /* ops_nn.c: linalg, NN ops, losses */
int tdd_prep_create(tdd_prep *p); /* ops_nn.c: creation ops */
int tdd_prep_bag(tdd_prep *p);    /* ops_bag.c: embedding_bag (and backward), multinomial */

#endif
