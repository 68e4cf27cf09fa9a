#!/usr/bin/env python3
"""SIGTERM at any moment ends memd (and workerd) cleanly (issue 22: memd once aborted at SIGTERM with an uncaught
zmq::error_t, EINTR, from its router's socket monitor).

Each iteration starts memd (and in most a workerd) in a fresh run directory and sends SIGTERM at a moment drawn from a
seeded RNG, in one of three scenarios:
  memd        memd alone, 0-150 ms after its SIGTERM handler is installed: during its start (socket, host pool, core)
              or while it serves;
  node        memd and a registered workerd: the worker gets SIGTERM 0-300 ms after it registered, memd 0-50 ms later
              (while the worker is shutting down and closing its connection);
  memd-first  memd and a registered workerd: memd gets SIGTERM 0-200 ms after the worker registered (memd stops with
              a live connection), then the worker (memd gone: it is away).
Every process must exit 0 with its clean-stop line (memd: "memd: stopped cleanly"; workerd: "workerd: gpu 0 stopping
(... tokens generated)"), and nothing of the run directory may be left: no memd.sock, no /dev/shm/dhs-pool-<h>.
A SIGTERM is sent only once the process's handler is installed (SigCgt in /proc/PID/status): no program can take a
signal before that (the kernel's default action would kill it; systemd counts that as a clean stop too).

Usage: sigterm_loop_test.py MEMD WORKERD [--iterations N] [--seed S]
The suite runs a short version (meson test sigterm_loop); the long run: --iterations 200 (docs/operations.md)."""
import argparse
import hashlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from proc_util import wait_until

PAGE_ROWS = 16
# glm5-like at p = 16: 16 x (7 sources x 576 B + 2 indexers x 128 B) (docs/operations.md, --page-bytes).
PAGE_BYTES = PAGE_ROWS * (7 * 576 + 2 * 128)


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def handler_installed(pid: int) -> bool:
    """Whether process `pid` catches SIGTERM (its SigCgt mask in /proc/PID/status)."""
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)) != 0
    return False


def segment_of(run_dir: str) -> str:
    """memd's host-pool segment of `run_dir` (memd/pool_segment.h: the SHA-256 of the canonical run directory)."""
    return "dhs-pool-" + hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:16]


class Proc:
    def __init__(self, args: list, log: str):
        self.log = log
        with open(log, "w") as out:
            self.p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def term(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)

    def wait(self, seconds: float = 30) -> int:
        try:
            return self.p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return -999

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def iteration(memd: str, workerd: str, tmp: str, i: int, rng: random.Random, scenario: str) -> list:
    run_dir = os.path.join(tmp, f"run{i}")
    memd_log, worker_log = os.path.join(tmp, f"memd{i}.log"), os.path.join(tmp, f"workerd{i}.log")
    failures, procs = [], []
    where = f"iteration {i} ({scenario})"
    try:
        m = Proc([memd, "--run-dir", run_dir, "--page-bytes", str(PAGE_BYTES), "--host-pool-bytes", "8MiB",
                  "--log-level", "info"], memd_log)
        procs.append(m)
        if not wait_until(lambda: handler_installed(m.p.pid) or m.p.poll() is not None, 30):
            return [f"{where}: memd never installed its SIGTERM handler"]
        w = None
        if scenario != "memd":
            if not wait_until(lambda: os.path.exists(os.path.join(run_dir, "memd.sock")), 30):
                return [f"{where}: memd did not serve: {read(memd_log)[-2000:]}"]
            w = Proc([workerd, "--run-dir", run_dir, "--gpu", "0", "--preset", "glm5-like", "--page-rows",
                      str(PAGE_ROWS), "--slots", "2", "--hbm-budget", str(2 << 20), "--device", "cpu", "--log-level",
                      "info"], worker_log)
            procs.append(w)
            if not wait_until(lambda: "worker of GPU 0 (pid" in read(memd_log) or w.p.poll() is not None, 60):
                return [f"{where}: the worker did not register: {read(worker_log)[-2000:]}"]
        if scenario == "memd":
            time.sleep(rng.uniform(0, 0.150))
            m.term()
        elif scenario == "node":
            time.sleep(rng.uniform(0, 0.300))
            w.term()
            time.sleep(rng.uniform(0, 0.050))
            m.term()
        else:  # memd-first
            time.sleep(rng.uniform(0, 0.200))
            m.term()
            rc = m.wait()
            time.sleep(rng.uniform(0, 0.100))
            w.term()
        rc = m.wait()
        if rc != 0 or "memd: stopped cleanly" not in read(memd_log):
            failures.append(f"{where}: memd exited {rc}: {read(memd_log)[-2000:]}")
        if w is not None:
            wrc = w.wait()
            if wrc != 0 or "workerd: gpu 0 stopping (" not in read(worker_log):
                failures.append(f"{where}: workerd exited {wrc}: {read(worker_log)[-2000:]}")
        if os.path.exists(os.path.join(run_dir, "memd.sock")):
            failures.append(f"{where}: memd.sock left behind")
        if os.path.exists("/dev/shm/" + segment_of(run_dir)):
            failures.append(f"{where}: /dev/shm/{segment_of(run_dir)} left behind")
    finally:
        for p in procs:
            p.kill()
        seg = "/dev/shm/" + segment_of(run_dir) if os.path.isdir(run_dir) else ""
        if seg and os.path.exists(seg):
            os.remove(seg)
    return failures


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("memd")
    ap.add_argument("workerd")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--seed", type=int, default=22)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    scenarios = ["memd", "node", "memd-first"]
    failures, counts = [], {s: 0 for s in scenarios}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dhs-sigterm-") as tmp:
        for i in range(args.iterations):
            scenario = scenarios[i % 3] if i < 3 else rng.choice(scenarios)  # each at least once
            counts[scenario] += 1
            failures += iteration(args.memd, args.workerd, tmp, i, rng, scenario)
    print(f"sigterm_loop: {args.iterations} iterations (seed {args.seed}: {counts}) in "
          f"{time.monotonic() - start:.1f} s, {len(failures)} failures")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
