/* graph.h -- recorded request sequences (GraphBegin, GraphEnd, Replay). */
#ifndef TDD_GRAPH_H
#define TDD_GRAPH_H

#include "reply.h"

int tdd_h_graph_begin(tdd_req *r);
int tdd_h_graph_end(tdd_req *r);
int tdd_h_replay(tdd_req *r);

/* While s records a graph: appends req (dispatch.c, before its handler runs). */
void tdd_graph_record(tdd_session *s, const Tensordd__V1__Request *req);
/* A request that cannot be recorded arrived: the recording fails with err at GraphEnd. */
void tdd_graph_break(tdd_session *s, const td_error *err);

#endif
