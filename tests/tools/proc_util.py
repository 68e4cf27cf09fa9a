"""tests/tools/proc_util.py: what the process tests of tests/tools share: polling with a deadline and finding the
processes of a node in /proc (by a run directory named on their command line)."""
import os
import time


def wait_until(pred, seconds: float) -> bool:
    """Polls pred every 50 ms until it is true or `seconds` passed; returns its last value."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def gone(pid: int) -> bool:
    """True when pid no longer runs: no such process, or a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def pids_naming(run_dir: str, program: str = "", exclude: int = -1) -> list:
    """Live processes whose command line has `run_dir` as one argument (and whose program's base name is `program`
    when given), other than `exclude`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if run_dir.encode() not in args or (program and os.path.basename(args[0]) != program.encode()):
            continue
        if not gone(int(entry)):
            pids.append(int(entry))
    return pids


def pool_segments_naming(path_fragment=None) -> set:
    """Names of the /dev/shm segments whose first 4 KiB hold `path_fragment` (a memd host pool's header keeps its
    canonical run directory: a test's own pools, not other processes' on a shared machine); None: every segment."""
    out = set()
    for name in os.listdir("/dev/shm"):
        try:
            with open(os.path.join("/dev/shm", name), "rb") as f:
                head = f.read(4096)
        except OSError:
            continue
        if path_fragment is None or path_fragment.encode() in head:
            out.add(name)
    return out
