/* tls.c -- libtensordd's tls:// endpoints: OpenSSL over memory BIOs on the connection's
 * socket. Ciphertext goes out through client.c's sends (MSG_NOSIGNAL: a daemon that hung
 * up is an error, never a SIGPIPE in the application) and comes in through its receives
 * (the per-call timeout holds); plaintext is decrypted straight into the caller's
 * buffer, so a download streams into its destination. */
#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CIPHER_IN (64u * 1024u)  /* ciphertext received per recv(2) */
#define PLAIN_OUT (256u * 1024u) /* plaintext encrypted per send */

struct td__tls {
    SSL_CTX *ctx;
    SSL *ssl;
    BIO *rbio, *wbio;
    uint8_t *in;  /* ciphertext read buffer */
    uint8_t *out; /* ciphertext to send */
    size_t outcap;
    char endpoint[280];
};

/* What a TLS failure means to the caller: the daemon's certificate did not verify, or
 * ours was refused (UNAUTHENTICATED); the other side does not speak TLS, or anything
 * else (PROTOCOL_ERROR). Sets c->tls_code and c->tls_why. */
static int classify(td_client *c, unsigned long e, const char *when)
{
    struct td__tls *t = c->tls;
    int reason = ERR_GET_REASON(e);
    char r[160] = "unknown reason";
    if (e) {
        ERR_error_string_n(e, r, sizeof r);
        const char *p = strstr(r, "::");
        if (p)
            memmove(r, p + 2, strlen(p + 2) + 1);
    }
    ERR_clear_error();
    long vr = SSL_get_verify_result(t->ssl);
    if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        c->tls_code = TD_EUNAUTHENTICATED;
        snprintf(c->tls_why, sizeof c->tls_why, "TLS: the daemon at %s failed verification: %s",
                 t->endpoint, vr != X509_V_OK ? X509_verify_cert_error_string(vr) : r);
    } else if (reason == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED ||
               reason == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE ||
               reason == SSL_R_TLSV1_ALERT_UNKNOWN_CA ||
               reason == SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN ||
               reason == SSL_R_TLSV1_ALERT_ACCESS_DENIED ||
               reason == SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED ||
               reason == SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED ||
               reason == SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE) {
        c->tls_code = TD_EUNAUTHENTICATED;
        snprintf(c->tls_why, sizeof c->tls_why,
                 "TLS: the daemon at %s refused this client's certificate (or its absence): %s",
                 t->endpoint, r);
    } else if (reason == SSL_R_WRONG_VERSION_NUMBER ||
               reason == SSL_R_UNEXPECTED_EOF_WHILE_READING ||
               reason == SSL_R_PACKET_LENGTH_TOO_LONG) {
        c->tls_code = TD_EPROTOCOL_ERROR;
        snprintf(c->tls_why, sizeof c->tls_why,
                 "TLS %s with %s failed (%s): is it a TLS listener? A plaintext tcp:// listener "
                 "closes TLS connections",
                 when, t->endpoint, r);
    } else {
        c->tls_code = TD_EPROTOCOL_ERROR;
        snprintf(c->tls_why, sizeof c->tls_why, "TLS %s with %s failed: %s", when, t->endpoint, r);
    }
    return TD__RECV_TLS_FAILED;
}

/* Sends the ciphertext OpenSSL has written. 0, or a TD_E* code (err filled). */
static int flush_out(td_client *c, td_error *err)
{
    struct td__tls *t = c->tls;
    for (;;) {
        size_t n = BIO_ctrl_pending(t->wbio);
        if (!n)
            return 0;
        if (n > t->outcap) {
            uint8_t *b = realloc(t->out, n);
            if (!b)
                return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory for TLS output");
            t->out = b;
            t->outcap = n;
        }
        size_t got = 0;
        if (BIO_read_ex(t->wbio, t->out, n, &got) != 1)
            return 0;
        int rc = td__send_raw(c, t->out, got, err);
        if (rc)
            return rc;
    }
}

/* Receives ciphertext into the TLS session: > 0, or a recv_wait result (0 at EOF). */
static ssize_t pull_in(td_client *c)
{
    struct td__tls *t = c->tls;
    ssize_t k = td__recv_raw(c, t->in, CIPHER_IN);
    if (k > 0 && BIO_write(t->rbio, t->in, (int)k) != (int)k) {
        c->tls_code = TD_ERESOURCE_EXHAUSTED;
        snprintf(c->tls_why, sizeof c->tls_why, "out of memory buffering TLS input");
        return TD__RECV_TLS_FAILED;
    }
    return k;
}

ssize_t td__tls_recv(td_client *c, void *buf, size_t len)
{
    struct td__tls *t = c->tls;
    for (;;) {
        size_t got = 0;
        ERR_clear_error();
        if (SSL_read_ex(t->ssl, buf, len, &got) == 1)
            return (ssize_t)got;
        int e = SSL_get_error(t->ssl, 0);
        if (e == SSL_ERROR_ZERO_RETURN)
            return 0;
        if (e != SSL_ERROR_WANT_READ)
            return classify(c, ERR_get_error(), "read");
        ssize_t k = pull_in(c);
        if (k <= 0)
            return k;
    }
}

int td__tls_send(td_client *c, const void *buf, size_t len, td_error *err)
{
    struct td__tls *t = c->tls;
    const uint8_t *p = buf;
    while (len) {
        size_t n = len < PLAIN_OUT ? len : PLAIN_OUT, done = 0;
        ERR_clear_error();
        if (SSL_write_ex(t->ssl, p, n, &done) != 1 || done != n) {
            classify(c, ERR_get_error(), "write");
            if (!c->dead)
                c->dead = c->tls_code;
            return td__fail(err, c->tls_code, "%s", c->tls_why);
        }
        int rc = flush_out(c, err);
        if (rc)
            return rc;
        p += n;
        len -= n;
    }
    return 0;
}

static int tls_setup_fail(td_client *c, td_error *err, const char *what, const char *file)
{
    char r[160] = "unknown reason";
    unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, r, sizeof r);
    const char *p = strstr(r, "::");
    ERR_clear_error();
    (void)c;
    return td__fail(err, TD_EINVALID_ARGUMENT, "TLS: %s %s: %s", what, file, p ? p + 2 : r);
}

int td__tls_start(td_client *c, const char *endpoint, const char *host, const td_tls_opts *o,
                  td_error *err)
{
    struct td__tls *t = calloc(1, sizeof *t);
    if (!t)
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory");
    c->tls = t;
    snprintf(t->endpoint, sizeof t->endpoint, "%s", endpoint);
    t->in = malloc(CIPHER_IN);
    t->ctx = SSL_CTX_new(TLS_client_method());
    if (!t->in || !t->ctx)
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory for TLS");
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
    SSL_CTX_set_cipher_list(t->ctx, "ECDHE+AESGCM:ECDHE+CHACHA20");
    SSL_CTX_set_options(t->ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    const char *ca = o ? o->ca_file : NULL;
    int verify = !(o && o->no_verify);
    if (verify) {
        if (ca && ca[0] ? SSL_CTX_load_verify_locations(t->ctx, ca, NULL) != 1
                        : SSL_CTX_set_default_verify_paths(t->ctx) != 1)
            return tls_setup_fail(c, err, "cannot load the CA file", ca ? ca : "(system)");
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
    } else {
        SSL_CTX_set_verify(t->ctx, SSL_VERIFY_NONE, NULL);
    }
    const char *cert = o ? o->cert_file : NULL, *key = o ? o->key_file : NULL;
    if (cert && cert[0]) {
        if (SSL_CTX_use_certificate_chain_file(t->ctx, cert) != 1)
            return tls_setup_fail(c, err, "cannot load the client certificate", cert);
        if (SSL_CTX_use_PrivateKey_file(t->ctx, key && key[0] ? key : cert, SSL_FILETYPE_PEM) != 1)
            return tls_setup_fail(c, err, "cannot load the client key", key && key[0] ? key : cert);
    } else if (key && key[0]) {
        return td__fail(err, TD_EINVALID_ARGUMENT, "TLS: a client key needs its certificate");
    }
    t->ssl = SSL_new(t->ctx);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (!t->ssl || !t->rbio || !t->wbio) {
        BIO_free(t->rbio);
        BIO_free(t->wbio);
        t->rbio = t->wbio = NULL;
        return td__fail(err, TD_ERESOURCE_EXHAUSTED, "out of memory for TLS");
    }
    BIO_set_mem_eof_return(t->rbio, -1);
    SSL_set_bio(t->ssl, t->rbio, t->wbio);
    SSL_set_connect_state(t->ssl);
    /* The name checked against the certificate: an IP address or a DNS name (also
     * sent as SNI). */
    if (verify) {
        X509_VERIFY_PARAM *vp = SSL_get0_param(t->ssl);
        if (X509_VERIFY_PARAM_set1_ip_asc(vp, host) != 1) {
            SSL_set_tlsext_host_name(t->ssl, host);
            if (SSL_set1_host(t->ssl, host) != 1)
                return td__fail(err, TD_EINVALID_ARGUMENT, "TLS: bad host name '%s'", host);
        }
    }
    ERR_clear_error();
    for (;;) {
        int r = SSL_do_handshake(t->ssl);
        int rc = flush_out(c, err);
        if (rc)
            return rc == TD_ECLOSED ? td__fail(err, TD_EPROTOCOL_ERROR,
                                               "the daemon at %s closed the connection during "
                                               "the TLS handshake: is it a TLS listener?",
                                               endpoint)
                                    : rc;
        if (r == 1)
            return 0;
        int e = SSL_get_error(t->ssl, r);
        if (e != SSL_ERROR_WANT_READ) {
            classify(c, ERR_get_error(), "handshake");
            return td__fail(err, c->tls_code, "%s", c->tls_why);
        }
        ssize_t k = pull_in(c);
        if (k > 0)
            continue;
        if (k == 0 || (k == -1 && errno == ECONNRESET))
            return td__fail(err, TD_EPROTOCOL_ERROR,
                            "TLS handshake with %s failed: the daemon closed the connection: is "
                            "it a TLS listener? A plaintext tcp:// listener closes TLS "
                            "connections",
                            endpoint);
        if (k == TD__RECV_TIMEOUT)
            return td__fail(err, TD_ETIMEOUT, "TLS handshake with %s timed out", endpoint);
        if (k == TD__RECV_TLS_FAILED)
            return td__fail(err, c->tls_code, "%s", c->tls_why);
        return td__fail(err, TD_EIO, "TLS handshake with %s: %s", endpoint, strerror(errno));
    }
}

void td__tls_free(td_client *c)
{
    struct td__tls *t = c->tls;
    if (!t)
        return;
    SSL_free(t->ssl); /* and its BIOs */
    SSL_CTX_free(t->ctx);
    free(t->in);
    free(t->out);
    free(t);
    c->tls = NULL;
}
