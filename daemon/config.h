/* config.h -- every limit of the daemon, each with a safe default. */
#ifndef TDD_CONFIG_H
#define TDD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensordd.h"

#define TDD_MAX_LISTEN 16
/* --version and HelloReply.server: the project's one version (tensordd.h). */
#define TDD_VERSION TD_VERSION_STRING
/* Read when it exists and no --config is given. */
#define TDD_CONFIG_DEFAULT "/etc/tensordd/tensordd.conf"

typedef struct tdd_config {
    const char *listen[TDD_MAX_LISTEN];
    int nlisten;
    int cpu_devices;          /* logical cpu devices cpu:0..N-1 */
    int threads;              /* cpu backend threads; 0 = cores */
    int device_lanes;         /* worker queues per host-memory device; sessions spread */
    int worker_nice;          /* the device workers' nice value above the loop thread's */
    int sim_devices;          /* simulated discrete devices sim:0..N-1 (tests) */
    int emu_gpus;             /* emulated CUDA devices (`make emu` build; 0 = none) */
    uint64_t emu_gpu_memory;  /* their memory each */
    int emu_sms;              /* their multiprocessors each */
    int cuda_streams;         /* CUDA streams per GPU for sessions; more share them */
    uint32_t cuda_tf32;       /* float32 GEMMs in TF32 on the tensor cores */
    uint32_t max_msg;         /* largest protobuf request */
    uint64_t max_payload;     /* largest raw payload */
    uint64_t max_graph_bytes; /* a recorded graph's requests, packed */
    uint64_t replay_slice;    /* a Replay's recorded requests (packed bytes) per loop turn */
    int64_t max_numel;        /* largest tensor, in elements */
    uint64_t max_handles;     /* live handles per session */
    uint64_t max_id_runs;     /* runs of consecutive ids a session may have bound */
    uint64_t session_memory;  /* bytes per session; 0 = only the global cap */
    uint64_t memory_cap;      /* bytes for the whole daemon; 0 = physical memory */
    uint64_t pool_cap;        /* free bytes each device's caching allocator keeps; 0 = none */
    uint32_t pool_trim_s;     /* release them after this long unused; 0 = never */
    /* bookkeeping bytes released by handles and sessions (net of new ones) past which the
     * pools' caches and the heap's free pages go back to the system; 0 = never */
    uint64_t trim_released;
    uint32_t max_inflight;    /* queued requests per session before reading pauses */
    uint32_t max_sessions;    /* concurrent sessions */
    uint32_t idle_timeout_s;  /* close a session silent this long; 0 = never */
    uint32_t hello_timeout_s; /* close a connection that has not completed Hello; 0 = never */
    /* the longest a session whose connection dropped is held for resume; 0 = off */
    uint32_t max_resume_window_s;
    uint32_t max_handshakes;  /* connections still before Hello (the oldest is dropped) */
    uint32_t write_timeout_s; /* close a connection whose writes make no progress; 0 = never */
    uint32_t poll_us;         /* after a request, poll this long before blocking; 0 = never */
    uint32_t poll_min_cpus;   /* ... only on machines with at least this many online CPUs */
    uint32_t inline_work;     /* ops up to this much work run on the loop thread (exec_op.c) */
    uint32_t chunk_elems;     /* kernels with larger outputs run in pieces (chunk.c); 0 = off */
    uint32_t chunk_growth;    /* ignored (pieces have one size, so bits never depend on load) */
    uint64_t
        max_write_queue; /* reply bytes (with their bookkeeping) queued before reading pauses */
    /* same-host zero copy (memfd.c): the fds a Unix-socket connection may have sent and
     * not had taken (0: no fd passing), and the uploaded memfds kept open daemon-wide */
    uint32_t max_conn_fds;
    uint32_t max_memfd_keep;
    /* ... and host storage in memfds, handed to downloads sealed (backends/cpu/cpu_shm.h):
     * the smallest tensor made so for a session that takes fds (0: none), the most blocks */
    uint64_t memfd_storage_min;
    uint32_t max_memfd_storage;
    uint32_t shutdown_grace_s;
    /* the metrics endpoint: HTTP connections served at once, and their idle timeout */
    uint32_t metrics_max_conns;
    uint32_t metrics_timeout_s;
    char token[256]; /* required in Hello when non-empty (--token-file) */
    size_t token_len;
    char token_file[512];    /* where it came from */
    char config_file[512];   /* the config file read, or "" */
    char metrics_listen[64]; /* HOST:PORT of the metrics endpoint; "" = off */
    uint32_t unix_mode;      /* permission bits of unix:// sockets (--unix-mode) */
    char unix_group[64];     /* their group, a name or number; "" = the daemon's */
    char tls_cert[512];      /* tls:// listeners: certificate chain (PEM) */
    char tls_key[512];       /* and its private key (PEM) */
    char tls_client_ca[512]; /* CA certificates clients must be signed by; "" = no mTLS */
    uint32_t insecure;       /* allow a listener beyond loopback with neither TLS nor token */
    bool listen_default;     /* no listen was configured: listen[0] is the default */
    int log_level;           /* --log-level (TDD_LOG_*), applied to log.c after parsing */
    bool log_json;           /* --log-format json */
    /* process groups (group.c) */
    char group_store_dir[512];   /* rendezvous directories live under it; "" = groups off */
    char group_address[64];      /* the address peers reach this daemon's Gloo on */
    uint32_t group_timeout_s;    /* rendezvous and each collective */
    uint32_t group_max_ranks;    /* a group's world size */
    uint32_t group_max_inflight; /* group requests waiting on their peers, daemon-wide */
    uint64_t group_bucket_bytes; /* largest bucket an all-reduce packs tensors into */
    /* daemon-to-daemon transfers (transfer.c) */
    uint32_t transfer_window_s;     /* a capability's life */
    uint32_t transfer_timeout_s;    /* an outbound push that makes no progress fails */
    uint32_t max_transfers;         /* capabilities outstanding, daemon-wide */
    uint32_t max_session_transfers; /* capabilities outstanding, per session */
    char transfer_ca[512];          /* CAs a source checks tls:// targets against; "" = system */
    char transfer_peers[1024];      /* addresses a push may reach (cidr.h); "" = none */
} tdd_config;

extern tdd_config tdd_cfg;

void tdd_config_defaults(tdd_config *c);
/* Defaults, then the config file, the environment and the command line, each
 * overriding the one before (config.c's table): 0 to run, 1 when --help or --version
 * was answered (exit 0), 2 after a one-line message on a bad flag, 3 after messages
 * naming file, line and key (or variable) of a bad setting (exit 1), 4 when
 * --check-config asks for the settings to be checked as a start would check them
 * (main.c) and then printed (tdd_config_print). */
int tdd_config_from_args(tdd_config *c, int argc, char **argv);
/* The effective configuration, itself a valid config file, on stdout. */
void tdd_config_print(const tdd_config *c);

/* SIGHUP: the file, the environment and the flags tdd_config_from_args read, read
 * again into next (listen endpoints are not: they keep running). 0, or -1 after
 * messages on stderr naming what is wrong; nothing global changes either way. */
int tdd_config_reread(tdd_config *next);
/* Copies into cur the settings of next that may change while the daemon runs (the
 * option table's reload column: logging, token, TLS files, quotas of new sessions)
 * and sets the log level and format. Names what changed in done[] and what differs but
 * takes a restart in restart[] (comma-separated, "" when none). */
void tdd_config_update(tdd_config *cur, const tdd_config *next, char *done, size_t dn,
                       char *restart, size_t rn);
/* Sets log.c's level and format from c. */
void tdd_config_apply_log(const tdd_config *c);

#endif
