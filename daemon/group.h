/* group.h -- process groups across daemons (GroupCreate) and their collectives
 * (AllReduce, Broadcast, AllGather), run by Gloo (gloo_shim.h) on a device's worker. */
#ifndef TDD_GROUP_H
#define TDD_GROUP_H

#include "reply.h"

int tdd_h_group_create(tdd_req *r);
int tdd_h_group_connect(tdd_req *r);
int tdd_h_all_reduce(tdd_req *r);
int tdd_h_broadcast(tdd_req *r);
int tdd_h_all_gather(tdd_req *r);

#endif
