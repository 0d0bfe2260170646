/* server.h -- what the connection offers beyond conn.h: replies already encoded. */
#ifndef TDD_SERVER_H
#define TDD_SERVER_H

#include "conn.h"

/* Sends one frame whose Response message is msg[0..mlen) (for instance from
 * wire.h's encoders), as tdd_conn_send would send the same message. */
void tdd_conn_send_encoded(tdd_conn *c, const uint8_t *msg, size_t mlen, const void *payload,
                           uint64_t plen, tdd_storage *hold);

#endif
