/* fuzz_frame.c -- fuzz target for the daemon's whole request path: bytes from
 * a client go through framing, protobuf decoding, dispatch, validation and
 * the device workers of an in-process daemon. Built as a corpus replayer for
 * `make test` (TDD_FUZZ_REPLAY) and as a libFuzzer target for `make fuzz`.
 * The daemon must answer or close, never crash, and end every session. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

static void tune(tdd_config *c)
{
    c->cpu_devices = 2;
    c->max_msg = 1u << 20;
    c->max_payload = 64u << 20; /* keep a fuzzed upload from eating the machine */
    c->memory_cap = 512u << 20;
}

typedef struct {
    const uint8_t *data;
    size_t size;
    atomic_int done; /* set by the client thread, polled by the loop's */
} client_job;

/* The client side: send everything, half-close, read until the daemon closes. */
static void *client(void *arg)
{
    client_job *j = arg;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)fz_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        size_t off = 0;
        while (off < j->size) {
            ssize_t n = send(fd, j->data + off, j->size - off, MSG_NOSIGNAL);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        shutdown(fd, SHUT_WR);
        char buf[65536];
        struct timeval tv = {.tv_sec = 10};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        while (recv(fd, buf, sizeof buf, 0) > 0)
            ;
    }
    if (fd >= 0)
        close(fd);
    atomic_store(&j->done, 1);
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_start("fuzz", tune);
    client_job j = {.data = data, .size = size};
    fz_run("fuzz", client, &j, &j.done);
    return 0;
}

#ifdef TDD_FUZZ_REPLAY
int main(int argc, char **argv)
{
    return fz_replay(argc, argv, "fuzz");
}
#endif
