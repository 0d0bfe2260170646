"""procstat.py -- what the benchmarks read of a process from /proc."""


def faults(pid):
    """pid's page faults so far (minor + major, /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[7]) + int(fields[9])
    except (OSError, IndexError, ValueError, TypeError):
        return None
