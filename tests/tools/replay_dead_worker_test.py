#!/usr/bin/env python3
"""dhs-replay notices a dead or hung worker in seconds, not after its 120 s idle timeout (issue 12). dhs-replay starts
its node in a private run directory; once it printed that the replay starts (its connection to the worker is up), the
worker is (1) SIGKILLed: its connection closes at once; (2) SIGSTOPped: it stops answering the ZMTP heartbeats. Each
time dhs-replay must exit 1 with "the worker at ... went away" on stderr. The 60 s bound only keeps a broken build from
hanging the suite (the idle timeout would take 120 s); the assertion is on the error.
Usage: replay_dead_worker_test.py DHS_REPLAY"""
import os
import signal
import subprocess
import sys
import tempfile
import threading

from proc_util import pids_naming


def worker_pid(run_dir: str) -> int:
    pids = pids_naming(run_dir, program="workerd")
    return pids[0] if pids else 0


def check(replay: str, sig: int) -> list:
    name = signal.Signals(sig).name
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        proc = subprocess.Popen([replay, "--requests", "40", "--run-dir", run_dir],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = []
        started = threading.Event()

        def read():
            for line in proc.stderr:
                lines.append(line)
                if " requests, mode " in line:
                    started.set()
            started.set()  # stderr closed: dhs-replay exited

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        pid = 0
        try:
            if not started.wait(120) or proc.poll() is not None:
                return [f"{name}: the replay did not start (rc {proc.poll()}): {''.join(lines)}"]
            pid = worker_pid(run_dir)
            if pid == 0:
                return [f"{name}: no workerd found for {run_dir}"]
            os.kill(pid, sig)
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                return [f"{name}: dhs-replay still running 60 s after the worker was signalled"]
            reader.join(10)
            err = "".join(lines)
            failures = []
            if rc != 1:
                failures.append(f"{name}: dhs-replay exited {rc}, want 1")
            if "the worker at ipc://" not in err or "went away" not in err:
                failures.append(f"{name}: no 'worker ... went away' error in:\n{err}")
            print(f"{name}: " + "".join(l for l in lines if "went away" in l).strip())
            return failures
        finally:
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main() -> int:
    replay = sys.argv[1]
    failures = check(replay, signal.SIGKILL) + check(replay, signal.SIGSTOP)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
