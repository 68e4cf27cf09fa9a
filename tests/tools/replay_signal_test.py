#!/usr/bin/env python3
"""dhs-replay must not leave the memd and workerd it starts behind when it is stopped (tools/replay/main.cc,
node_launcher.cc). (1) SIGTERM once both sockets are up: dhs-replay stops the node and exits 143. (2) SIGKILL:
nothing in dhs-replay runs, the children stop on their parent-death signal (PR_SET_PDEATHSIG). Each waits for the
node's sockets, reads the pids of the processes whose command line names the run directory from /proc, signals
dhs-replay and polls with a deadline until those pids are gone (an ordering check, not a timing one).
Usage: replay_signal_test.py DHS_REPLAY"""
import os
import signal
import subprocess
import sys
import tempfile

from proc_util import gone, pids_naming, wait_until










def check(replay: str, sig: int, want_rc: int) -> list:
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        proc = subprocess.Popen([replay, "--requests", "4", "--length-scale", "0.02", "--run-dir", run_dir],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            up = wait_until(lambda: os.path.exists(os.path.join(run_dir, "memd.sock")) and
                            os.path.exists(os.path.join(run_dir, "worker-0.sock")), 60)
            if not up or proc.poll() is not None:
                return [f"{signal.Signals(sig).name}: the node did not come up (rc {proc.poll()})"]
            pids = pids_naming(run_dir, exclude=proc.pid)
            if len(pids) != 2:
                failures.append(f"{signal.Signals(sig).name}: expected memd and workerd, found pids {pids}")
            proc.send_signal(sig)
            rc = proc.wait(timeout=30)
            if rc != want_rc:
                failures.append(f"{signal.Signals(sig).name}: dhs-replay exited {rc}, want {want_rc}")
            if not wait_until(lambda: all(gone(p) for p in pids), 15):
                failures.append(f"{signal.Signals(sig).name}: node processes still running: "
                                f"{[p for p in pids if not gone(p)]}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for p in pids_naming(run_dir, exclude=proc.pid):  # never leave them behind, whatever failed
                os.kill(p, signal.SIGKILL)
    return failures


def main() -> int:
    replay = sys.argv[1]
    failures = check(replay, signal.SIGTERM, 143) + check(replay, signal.SIGKILL, -signal.SIGKILL)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
