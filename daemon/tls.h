/* tls.h -- TLS for the daemon's connections, over memory BIOs: the transport moves
 * ciphertext with libuv and hands it here; nothing here touches a socket. */
#ifndef TDD_TLS_H
#define TDD_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct tdd_tls_ctx tdd_tls_ctx;
typedef struct tdd_tls tdd_tls;

/* tdd_tls_read's results besides a byte count. */
#define TDD_TLS_WANT 0     /* needs more ciphertext from the peer */
#define TDD_TLS_EOF (-1)   /* the peer closed the TLS session (close_notify) */
#define TDD_TLS_ERROR (-2) /* a failure: tdd_tls_why says what */

/* A server context: certificate chain and key (PEM files), and with client_ca (a PEM
 * file of CA certificates; NULL or "": none) every client must present a certificate
 * signed by one of them. TLS 1.2 and 1.3 only, forward-secret AEAD ciphers. NULL on
 * failure, with why[] naming the file and OpenSSL's reason. */
tdd_tls_ctx *tdd_tls_ctx_new(const char *cert, const char *key, const char *client_ca, char *why,
                             size_t wn);
void tdd_tls_ctx_free(tdd_tls_ctx *x);

/* One connection's TLS session (server side). NULL when out of memory. */
tdd_tls *tdd_tls_new(tdd_tls_ctx *x);
void tdd_tls_free(tdd_tls *t);

/* Ciphertext received from the peer; 0, or -1 when out of memory. */
int tdd_tls_feed(tdd_tls *t, const void *data, size_t len);
/* Whether ciphertext or decrypted bytes wait to be read with tdd_tls_read. */
bool tdd_tls_has_input(const tdd_tls *t);
/* Decrypts into buf: a byte count > 0, or TDD_TLS_WANT, TDD_TLS_EOF, TDD_TLS_ERROR. The
 * handshake runs inside it (its answers wait in tdd_tls_out_pending). */
ssize_t tdd_tls_read(tdd_tls *t, void *buf, size_t len);
/* Encrypts len bytes (after the handshake): 0, or -1 on failure. */
int tdd_tls_write(tdd_tls *t, const void *buf, size_t len);
/* Ciphertext waiting to be sent, and taking up to cap bytes of it. */
size_t tdd_tls_out_pending(const tdd_tls *t);
size_t tdd_tls_out_take(tdd_tls *t, void *buf, size_t cap);
/* Queues a close_notify (tdd_tls_out_pending then holds it). */
void tdd_tls_close_notify(tdd_tls *t);
bool tdd_tls_handshake_done(const tdd_tls *t);
/* The last failure in words; the peer's identity (the client certificate's subject,
 * or "" without one); the protocol version and cipher once the handshake is done. */
const char *tdd_tls_why(const tdd_tls *t);
const char *tdd_tls_peer(tdd_tls *t);
/* The client certificate as an identity: "sha256:" and the hex SHA-256 of all of it
 * (DER), or "" without one. Two certificates differ here whatever part differs (the
 * subject past any length, the issuer, the key, the serial). */
const char *tdd_tls_peer_id(tdd_tls *t);
const char *tdd_tls_version(const tdd_tls *t);

/* The client side, for this daemon's own outbound connections (transfer.c): a context
 * that checks servers against the CA certificates in ca (PEM; NULL or "": the system's)
 * and, with cert and key, presents that certificate when a server asks for one. NULL on
 * failure, with why[]. */
tdd_tls_ctx *tdd_tls_client_ctx_new(const char *ca, const char *cert, const char *key, char *why,
                                    size_t wn);
/* A client session to host (its certificate must name it: an IP address or a DNS name). */
tdd_tls *tdd_tls_client_new(tdd_tls_ctx *x, const char *host);
/* Drives the client handshake: 1 done, 0 wants more ciphertext (what to send waits in
 * tdd_tls_out_pending), -1 failed (tdd_tls_why). */
int tdd_tls_handshake(tdd_tls *t);

#endif
