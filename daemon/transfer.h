/* transfer.h -- daemon-to-daemon transfers: the capabilities a target issues, the pushes a
 * source makes on its own outbound connection, and the pushed bytes landing in the target. */
#ifndef TDD_TRANSFER_H
#define TDD_TRANSFER_H

#include "reply.h"

/* To the target: a one-time capability for one new tensor of this session. */
int tdd_h_transfer_accept(tdd_req *r);
/* To the source: push a tensor to another daemon (synchronising: answered once it landed). */
int tdd_h_transfer_send(tdd_req *r);
/* From a source daemon: the bytes, landing in the capability's tensor. */
int tdd_h_transfer_push(tdd_req *r);

#endif
