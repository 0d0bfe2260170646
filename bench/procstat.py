"""procstat.py -- the benchmarks' daemons: starting one, and what they read of it from /proc."""

import os
import re
import subprocess
import time


def faults(pid):
    """pid's page faults so far (minor + major, /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[7]) + int(fields[9])
    except (OSError, IndexError, ValueError, TypeError):
        return None


def rss(pid):
    """pid's resident set in bytes (/proc/PID/status VmRSS), or 0."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def start_daemon(build, *args, timeout=30):
    """BUILD/tensordd on an ephemeral loopback port with args; returns (process, port) once it
    listens. The caller terminates it."""
    p = subprocess.Popen([os.path.join(build, "tensordd"), "--listen", "tcp://127.0.0.1:0",
                          "--log-level", "warn", *args], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        m = re.search(r"listening on tcp://127\.0\.0\.1:(\d+)", line)
        if m:
            return p, int(m.group(1))
        if not line and p.poll() is not None:
            break
    p.kill()
    p.wait()
    raise SystemExit(f"{build}/tensordd did not start")
