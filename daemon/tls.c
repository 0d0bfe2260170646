/* tls.c -- OpenSSL over memory BIOs (tls.h): the transport feeds ciphertext in and
 * takes ciphertext out; plaintext goes straight to and from the caller's buffers. */
#include "tls.h"

#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tdd_tls_ctx {
    SSL_CTX *ctx;
};

struct tdd_tls {
    SSL *ssl;
    BIO *rbio, *wbio; /* ciphertext in (from the peer), out (to the peer) */
    char why[256];
    char peer[192];   /* the client certificate's subject, for the log (may be cut) */
    char peer_id[80]; /* "sha256:" and the hex SHA-256 of the whole certificate (DER) */
};

/* OpenSSL's first queued error in words, after what (the queue is emptied). */
static void openssl_why(char *buf, size_t n, const char *what)
{
    unsigned long e = ERR_get_error();
    char r[200] = "unknown reason";
    if (e)
        ERR_error_string_n(e, r, sizeof r);
    /* "error:0A000086:SSL routines::certificate verify failed": keep what follows the codes */
    const char *p = strstr(r, "::");
    p = p ? p + 2 : r;
    snprintf(buf, n, "%s%s%s", what, what[0] ? ": " : "", p);
    ERR_clear_error();
}

tdd_tls_ctx *tdd_tls_ctx_new(const char *cert, const char *key, const char *client_ca, char *why,
                             size_t wn)
{
    char what[600];
    tdd_tls_ctx *x = calloc(1, sizeof *x);
    SSL_CTX *ctx = x ? SSL_CTX_new(TLS_server_method()) : NULL;
    if (!ctx) {
        free(x);
        openssl_why(why, wn, "cannot create a TLS context");
        return NULL;
    }
    x->ctx = ctx;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* TLS 1.2 with forward-secret AEAD suites only; 1.3's suites are all of that kind. */
    SSL_CTX_set_cipher_list(ctx, "ECDHE+AESGCM:ECDHE+CHACHA20");
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_COMPRESSION);
    /* Clients connect once per session: no tickets to issue or keep. */
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        snprintf(what, sizeof what, "--tls-cert %s", cert);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        snprintf(what, sizeof what, "--tls-key %s", key);
        goto fail;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(what, sizeof what, "--tls-key %s does not match --tls-cert %s", key, cert);
        goto fail;
    }
    if (client_ca && client_ca[0]) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(client_ca);
        if (!names || SSL_CTX_load_verify_locations(ctx, client_ca, NULL) != 1) {
            sk_X509_NAME_pop_free(names, X509_NAME_free);
            snprintf(what, sizeof what, "--tls-client-ca %s", client_ca);
            goto fail;
        }
        SSL_CTX_set_client_CA_list(ctx, names);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    return x;
fail:
    openssl_why(why, wn, what);
    tdd_tls_ctx_free(x);
    return NULL;
}

void tdd_tls_ctx_free(tdd_tls_ctx *x)
{
    if (!x)
        return;
    SSL_CTX_free(x->ctx);
    free(x);
}

tdd_tls *tdd_tls_new(tdd_tls_ctx *x)
{
    tdd_tls *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->ssl = SSL_new(x->ctx);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (!t->ssl || !t->rbio || !t->wbio) {
        BIO_free(t->rbio);
        BIO_free(t->wbio);
        SSL_free(t->ssl);
        free(t);
        ERR_clear_error();
        return NULL;
    }
    /* An empty memory BIO reads as "retry later", never as end of file. */
    BIO_set_mem_eof_return(t->rbio, -1);
    SSL_set_bio(t->ssl, t->rbio, t->wbio); /* the SSL owns both now */
    SSL_set_accept_state(t->ssl);
    return t;
}

void tdd_tls_free(tdd_tls *t)
{
    if (!t)
        return;
    SSL_free(t->ssl);
    free(t);
}

int tdd_tls_feed(tdd_tls *t, const void *data, size_t len)
{
    while (len) {
        int n = len > INT_MAX ? INT_MAX : (int)len;
        int k = BIO_write(t->rbio, data, n);
        if (k <= 0) {
            snprintf(t->why, sizeof t->why, "out of memory buffering TLS input");
            return -1;
        }
        data = (const char *)data + k;
        len -= (size_t)k;
    }
    return 0;
}

bool tdd_tls_has_input(const tdd_tls *t)
{
    return SSL_has_pending(t->ssl) || BIO_ctrl_pending(t->rbio) > 0;
}

ssize_t tdd_tls_read(tdd_tls *t, void *buf, size_t len)
{
    size_t got = 0;
    ERR_clear_error();
    if (SSL_read_ex(t->ssl, buf, len, &got) == 1)
        return (ssize_t)got;
    int e = SSL_get_error(t->ssl, 0);
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE: /* memory BIOs take every write: not seen in practice */
        return TDD_TLS_WANT;
    case SSL_ERROR_ZERO_RETURN:
        return TDD_TLS_EOF;
    default: {
        long vr = SSL_get_verify_result(t->ssl);
        if (vr != X509_V_OK && ERR_peek_error() != 0 && !SSL_is_init_finished(t->ssl)) {
            char r[160];
            openssl_why(r, sizeof r, "");
            snprintf(t->why, sizeof t->why, "%s (client certificate: %s)", r,
                     X509_verify_cert_error_string(vr));
        } else
            openssl_why(t->why, sizeof t->why, "");
        return TDD_TLS_ERROR;
    }
    }
}

int tdd_tls_write(tdd_tls *t, const void *buf, size_t len)
{
    ERR_clear_error();
    size_t done = 0;
    if (SSL_write_ex(t->ssl, buf, len, &done) == 1 && done == len)
        return 0;
    openssl_why(t->why, sizeof t->why, "encrypting");
    return -1;
}

size_t tdd_tls_out_pending(const tdd_tls *t)
{
    return BIO_ctrl_pending(t->wbio);
}

size_t tdd_tls_out_take(tdd_tls *t, void *buf, size_t cap)
{
    size_t got = 0;
    if (cap && BIO_read_ex(t->wbio, buf, cap, &got) != 1)
        return 0;
    return got;
}

void tdd_tls_close_notify(tdd_tls *t)
{
    ERR_clear_error();
    if (SSL_is_init_finished(t->ssl))
        SSL_shutdown(t->ssl);
    ERR_clear_error();
}

bool tdd_tls_handshake_done(const tdd_tls *t)
{
    return SSL_is_init_finished(t->ssl);
}

const char *tdd_tls_why(const tdd_tls *t)
{
    return t->why[0] ? t->why : "unknown TLS failure";
}

const char *tdd_tls_peer(tdd_tls *t)
{
    if (t->peer[0] || !SSL_is_init_finished(t->ssl))
        return t->peer;
    X509 *x = SSL_get_peer_certificate(t->ssl);
    if (x) {
        X509_NAME_oneline(X509_get_subject_name(x), t->peer, sizeof t->peer);
        X509_free(x);
    }
    return t->peer;
}

const char *tdd_tls_peer_id(tdd_tls *t)
{
    if (t->peer_id[0] || !SSL_is_init_finished(t->ssl))
        return t->peer_id;
    X509 *x = SSL_get_peer_certificate(t->ssl);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (x && X509_digest(x, EVP_sha256(), md, &n) == 1 && n * 2 + 8 <= sizeof t->peer_id) {
        int k = snprintf(t->peer_id, sizeof t->peer_id, "sha256:");
        for (unsigned int i = 0; i < n; i++)
            k += snprintf(t->peer_id + k, sizeof t->peer_id - (size_t)k, "%02x", md[i]);
    }
    X509_free(x);
    ERR_clear_error();
    return t->peer_id;
}

const char *tdd_tls_version(const tdd_tls *t)
{
    return SSL_get_version(t->ssl);
}

/* ---------------------------------------------------------------- client side */

tdd_tls_ctx *tdd_tls_client_ctx_new(const char *ca, const char *cert, const char *key, char *why,
                                    size_t wn)
{
    char what[600] = "";
    tdd_tls_ctx *x = calloc(1, sizeof *x);
    SSL_CTX *ctx = x ? SSL_CTX_new(TLS_client_method()) : NULL;
    if (!ctx) {
        free(x);
        openssl_why(why, wn, "cannot create a TLS client context");
        return NULL;
    }
    x->ctx = ctx;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_cipher_list(ctx, "ECDHE+AESGCM:ECDHE+CHACHA20");
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (ca && ca[0] ? SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1
                    : SSL_CTX_set_default_verify_paths(ctx) != 1) {
        snprintf(what, sizeof what, "--transfer-ca %s", ca && ca[0] ? ca : "(the system's)");
        goto fail;
    }
    /* A target that asks for a client certificate gets this daemon's own. */
    if (cert && cert[0] && key && key[0] &&
        (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1 ||
         SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)) {
        snprintf(what, sizeof what, "--tls-cert %s / --tls-key %s", cert, key);
        goto fail;
    }
    return x;
fail:
    openssl_why(why, wn, what);
    tdd_tls_ctx_free(x);
    return NULL;
}

tdd_tls *tdd_tls_client_new(tdd_tls_ctx *x, const char *host)
{
    tdd_tls *t = tdd_tls_new(x);
    if (!t)
        return NULL;
    SSL_set_connect_state(t->ssl);
    /* The target's certificate must name the host the client gave: an address as an IP
     * SAN, a name as a DNS SAN (and as SNI). */
    X509_VERIFY_PARAM *vp = SSL_get0_param(t->ssl);
    X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    int ok = X509_VERIFY_PARAM_set1_ip_asc(vp, host) == 1;
    if (!ok)
        ok = SSL_set_tlsext_host_name(t->ssl, host) == 1 && SSL_set1_host(t->ssl, host) == 1;
    if (!ok) {
        tdd_tls_free(t);
        ERR_clear_error();
        return NULL;
    }
    return t;
}

int tdd_tls_handshake(tdd_tls *t)
{
    ERR_clear_error();
    int r = SSL_do_handshake(t->ssl);
    if (r == 1)
        return 1;
    int e = SSL_get_error(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
        return 0;
    long vr = SSL_get_verify_result(t->ssl);
    if (vr != X509_V_OK) {
        snprintf(t->why, sizeof t->why, "the target's certificate: %s",
                 X509_verify_cert_error_string(vr));
        ERR_clear_error();
    } else
        openssl_why(t->why, sizeof t->why, "handshake");
    return -1;
}
