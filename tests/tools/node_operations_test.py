#!/usr/bin/env python3
"""dhs-node's operations with real processes (issue 22, "Production sizes and operations"), each in a private
temporary directory:
(1) fail fast: a worker with a bad flag ends the node at once (exit 1, one start, no restart loop) with the worker's
    own error among the log lines dhs-node prints; a memd whose metrics address is bad does the same;
(2) --check runs each child's own --check-config: a bad worker flag, a bad metrics address and a host pool larger
    than /dev/shm each fail --check (exit 2) naming the child and its problem; a good configuration passes;
(3) run directory: an unwritable one gets a clear message before anything starts (as root: made immutable with
    chattr +i, skipped where that is not possible); a memd started by hand on it makes dhs-node refuse; a second
    dhs-node on the run directory of a live one refuses (exit 1, the live node's pid named) without writing into the
    live node's logs, and --check of that configuration names the live node too;
(4) worker liveness: SIGSTOP of a ready worker: dhs-node SIGKILLs it once no probe found it alive for the bound
    (--worker-liveness-timeout-ms, overriding the file's 0), restarts it, "node ready again", and the GPU serves
    again (dhs-replay);
(5) SIGKILL of dhs-node while requests decode: the workers end them ("worker stopping") and memd (its parent-death
    signal is SIGUSR1) waits for their Completes, so memd keeps nothing: the host-pool segment is removed and the next
    node on the run directory resumes no request.
Waits poll output or /proc with a deadline (orderings, not timings); the figures printed are measured, not asserted.
Usage: node_operations_test.py DHS_NODE DHS_REPLAY"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from proc_util import gone, pids_naming, wait_until

CONFIG = """
[node]
run_dir = "{run_dir}"

[memd]
host_pool_bytes = "{pool}"
log_level = "info"
worker_timeout_ms = 6000
{memd_extra}

[[worker]]
gpu = 0
preset = "glm5-like"
page_rows = 16
slots = 4
hbm_budget_bytes = "4MiB"
device = "cpu"
memd_timeout_ms = 5000
{worker_extra}

[supervise]
backoff_initial_ms = 100
stop_grace_ms = 5000
liveness_probe_ms = 200
worker_liveness_timeout_ms = {liveness}
"""

LIVENESS_MS = 2000


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def write_config(tmp: str, name: str, pool="16MiB", memd_extra="", worker_extra="", liveness=LIVENESS_MS,
                 run_dir=None) -> tuple:
    run_dir = run_dir or os.path.join(tmp, name + "-run")
    path = os.path.join(tmp, name + ".toml")
    with open(path, "w") as f:
        f.write(CONFIG.format(run_dir=run_dir, pool=pool, memd_extra=memd_extra, worker_extra=worker_extra,
                              liveness=liveness))
    return path, run_dir


def started_pids(out: str, name: str) -> list:
    return [int(p) for p in re.findall(rf"started {name} \(pid (\d+)\)", out)]


def stamp(out: str, text: str, after: int = 0) -> float:
    """Seconds of the day of the first log line holding `text` at or after offset `after`."""
    at = out.find(text, after)
    line = out[out.rfind("\n", 0, at) + 1:at]
    h, m, sec = re.search(r"(\d\d):(\d\d):(\d\d\.\d+)\]", line).groups()
    return int(h) * 3600 + int(m) * 60 + float(sec)


class Node:
    """A dhs-node process with its output in a file; stop() kills what is left."""

    def __init__(self, node: str, config: str, out_path: str, args=()):
        self.out_path = out_path
        with open(out_path, "w") as out:
            self.proc = subprocess.Popen([node, "--config", config, *args], stdout=out, stderr=subprocess.STDOUT)

    def out(self) -> str:
        return read(self.out_path)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def fail_fast(node: str, tmp: str) -> list:
    failures = []
    cases = [
        ("bad-flag", dict(worker_extra='extra_args = ["--no-such-flag"]'), "worker gpu 0",
         "--no-such-flag"),
        ("bad-metrics", dict(memd_extra='metrics_address = "no-port-here"'), "memd", "no-port-here"),
    ]
    for name, kw, child, said in cases:
        config, run_dir = write_config(tmp, name, **kw)
        n = Node(node, config, os.path.join(tmp, name + ".out"))
        try:
            rc = n.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            n.proc.kill()
            n.proc.wait()
            failures.append(f"{name}: dhs-node still running 60 s after a child failed at its start")
            continue
        out = n.out()
        if rc != 1:
            failures.append(f"{name}: exit code {rc}, want 1")
        if f"{child} exited (exit code" not in out or "before it was ever ready" not in out:
            failures.append(f"{name}: no 'before it was ever ready' naming {child}")
        if not re.search(rf"{child} \| .*{re.escape(said)}", out):
            failures.append(f"{name}: {child}'s own error ({said!r}) not among the log lines dhs-node printed")
        if len(started_pids(out, child)) != 1:
            failures.append(f"{name}: {child} started {len(started_pids(out, child))} times, want once")
        if pids_naming(run_dir):
            failures.append(f"{name}: processes left on {run_dir}: {pids_naming(run_dir)}")
        if failures:
            print(f"---- {name} output ----\n{out}")
    return failures


def check(node: str, tmp: str) -> list:
    failures = []
    good, good_run = write_config(tmp, "check-good")
    r = subprocess.run([node, "--config", good, "--check"], capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or len(r.stdout.strip().split("\n")) != 2:
        failures.append(f"--check of a good configuration: rc {r.returncode}, {r.stdout!r} {r.stderr!r}")
    if os.path.exists(good_run):
        failures.append("--check created the run directory")
    # A metrics address that binds (the example configuration's): memd --check-config binds it for a moment and exits
    # (it hung when its server was stopped before it ran: cpp-httplib's stop() is a no-op until then).
    metrics, _ = write_config(tmp, "check-metrics-ok", memd_extra='metrics_address = "127.0.0.1:0"')
    for attempt in range(5):
        try:
            r = subprocess.run([node, "--config", metrics, "--check"], capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            failures.append(f"--check with metrics_address 127.0.0.1:0 hung (attempt {attempt})")
            subprocess.run(["pkill", "-KILL", "-f", "memd.*--check-config"], capture_output=True)
            break
        if r.returncode != 0:
            failures.append(f"--check with metrics_address 127.0.0.1:0: rc {r.returncode}, {r.stderr!r}")
            break
    cases = [
        ("check-flag", dict(worker_extra='extra_args = ["--no-such-flag"]'), "worker gpu 0", "--no-such-flag"),
        ("check-metrics", dict(memd_extra='metrics_address = "no-port-here"'), "memd", "no-port-here"),
        ("check-pool", dict(pool="16TiB"), "memd", "/dev/shm has only"),
        ("check-slots", dict(worker_extra='extra_args = ["--slots", "0"]'), "worker gpu 0", "--slots"),
    ]
    for name, kw, child, said in cases:
        config, _ = write_config(tmp, name, **kw)
        r = subprocess.run([node, "--config", config, "--check"], capture_output=True, text=True, timeout=120)
        if r.returncode != 2 or f"{child}'s own check" not in r.stderr or said not in r.stderr:
            failures.append(f"--check {name}: rc {r.returncode}, want 2 naming {child} and {said!r}: {r.stderr!r}")
    return failures


def run_dir_checks(node: str, replay: str, tmp: str) -> list:
    failures = []
    # An unwritable run directory: said so, nothing started. As root, write permission is not enforced, so the
    # directory is also made immutable where the filesystem allows (chattr +i); else the case is skipped.
    config, run_dir = write_config(tmp, "readonly")
    os.mkdir(run_dir, 0o500)
    unwritable = os.geteuid() != 0 or subprocess.run(["chattr", "+i", run_dir], capture_output=True).returncode == 0
    try:
        if unwritable:
            n = Node(node, config, os.path.join(tmp, "readonly.out"))
            rc = n.proc.wait(timeout=60)
            out = n.out()
            if rc != 1 or f"run directory {run_dir} is not writable" not in out or "started memd" in out:
                failures.append(f"read-only run directory: rc {rc}, output {out!r}")
            r = subprocess.run([node, "--config", config, "--check"], capture_output=True, text=True, timeout=120)
            if r.returncode != 2 or "is not writable" not in r.stderr:
                failures.append(f"--check of a read-only run directory: rc {r.returncode}, {r.stderr!r}")
        else:
            print("skipped: the read-only run directory (root, and chattr +i not possible here)")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", run_dir], capture_output=True)

    # A memd started by hand on the run directory (from --check's command line): dhs-node refuses before starting.
    config, run_dir = write_config(tmp, "by-hand")
    r = subprocess.run([node, "--config", config, "--check"], capture_output=True, text=True, timeout=120)
    memd_line = r.stdout.split("\n")[0].split()
    by_hand = subprocess.Popen(memd_line, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_until(lambda: "requests" in dhsctl_status(run_dir), 60):
            failures.append("by hand: memd did not start")
        else:
            n = Node(node, config, os.path.join(tmp, "by-hand.out"))
            rc = n.proc.wait(timeout=60)
            out = n.out()
            if rc != 1 or f"a live memd serves {run_dir}/memd.sock" not in out or "started memd" in out:
                failures.append(f"dhs-node on a run directory with a live memd: rc {rc}, output {out!r}")
    finally:
        by_hand.send_signal(signal.SIGTERM)
        by_hand.wait(timeout=30)

    # A second dhs-node on the run directory of a live one.
    config, run_dir = write_config(tmp, "busy")
    first = Node(node, config, os.path.join(tmp, "busy1.out"))
    try:
        if not wait_until(lambda: "node ready (1 workers)" in first.out(), 120):
            return failures + ["busy: the first node never became ready"]
        logs = {name: read(os.path.join(run_dir, name)) for name in ("memd.log", "worker-0.log")}
        second = Node(node, config, os.path.join(tmp, "busy2.out"))
        rc = second.proc.wait(timeout=60)
        out = second.out()
        if rc != 1 or f"in use by another dhs-node (pid {first.proc.pid}" not in out or "started" in out:
            failures.append(f"second dhs-node on a live run directory: rc {rc}, output {out!r}")
        r = subprocess.run([node, "--config", config, "--check"], capture_output=True, text=True, timeout=120)
        if r.returncode != 2 or f"in use by another dhs-node (pid {first.proc.pid}" not in r.stderr:
            failures.append(f"--check on a live run directory: rc {r.returncode}, {r.stderr!r}")
        for name, before in logs.items():
            now = read(os.path.join(run_dir, name))
            # The live node may log on; the second node must not have added its children's lines.
            started = "memd: serving" if name == "memd.log" else "serving at"
            if not now.startswith(before) or now.count(started) != 1:
                failures.append(f"the live node's {name} was written by the second dhs-node or its --check")
        if first.proc.poll() is not None:
            failures.append("the first node died")
    finally:
        first.stop()
    return failures


def worker_liveness(node: str, replay: str, tmp: str) -> list:
    # The watch is off in the file (0) and on by the flag, which overrides it.
    config, run_dir = write_config(tmp, "liveness", liveness=0)
    n = Node(node, config, os.path.join(tmp, "liveness.out"), ["--worker-liveness-timeout-ms", str(LIVENESS_MS)])
    failures = []
    try:
        if not wait_until(lambda: "node ready (1 workers)" in n.out(), 120):
            return ["liveness: the node never became ready"]
        worker = started_pids(n.out(), "worker gpu 0")[0]
        memd = started_pids(n.out(), "memd")[0]
        stopped_at = time.monotonic()
        os.kill(worker, signal.SIGSTOP)
        if not wait_until(lambda: "node ready again" in n.out(), 60):
            os.kill(worker, signal.SIGKILL)
            return ["liveness: no 'node ready again' within 60 s of SIGSTOP of the worker"]
        ready_again = time.monotonic() - stopped_at
        out = n.out()
        if not re.search(r"worker gpu 0 answered no probe \(or memd held its GPU fenced\) for \d+ ms \(hung\): SIGKILL",
                         out):
            failures.append("liveness: dhs-node did not log the hung worker's SIGKILL")
        if not wait_until(lambda: gone(worker), 10):
            failures.append(f"liveness: the stopped worker {worker} is still there")
        workers = started_pids(out, "worker gpu 0")
        if len(workers) != 2 or gone(workers[1]):
            failures.append(f"liveness: worker gpu 0 not restarted once: {workers}")
        if started_pids(out, "memd") != [memd]:
            failures.append("liveness: memd was restarted")
        m = re.search(r"answered no probe \(or memd held its GPU fenced\) for (\d+) ms", out)
        silent = int(m.group(1)) if m else -1
        # Killed on the probe grid once the bound passed: after at least the bound, and no later than a few probes
        # (every 200 ms, each waiting up to 250 ms) after it.
        if m and not LIVENESS_MS <= silent <= LIVENESS_MS + 3000:
            failures.append(f"liveness: killed after {silent} ms of silence, not within [{LIVENESS_MS}, "
                            f"{LIVENESS_MS + 3000}]")
        report = os.path.join(tmp, "liveness.json")
        r = subprocess.run([replay, "--connect", f"ipc://{run_dir}/worker-0.sock", "--preset", "glm5-like",
                            "--requests", "2", "--length-scale", "0.02", "--json", report],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0 or not json.loads(read(report) or "{}").get("complete"):
            failures.append(f"liveness: the GPU does not serve again: rc {r.returncode}, {r.stderr[-500:]!r}")
        print(f"figures: worker SIGSTOP -> SIGKILL after {silent} ms without an answer (bound {LIVENESS_MS} ms, "
              f"probe every 200 ms); SIGSTOP -> node ready again {ready_again:.3f} s")
        if failures:
            print("---- liveness output ----\n" + out)
    finally:
        n.stop()
    return failures


def node_killed_mid_request(node: str, replay: str, tmp: str) -> list:
    config, run_dir = write_config(tmp, "killed")
    n = Node(node, config, os.path.join(tmp, "killed.out"))
    failures = []
    try:
        if not wait_until(lambda: "node ready (1 workers)" in n.out(), 120):
            return ["kill -9: the node never became ready"]
        children = pids_naming(run_dir, exclude=n.proc.pid)
        seg = re.search(r"host pool /dev/shm/(\S+):", read(os.path.join(run_dir, "memd.log")))
        segment = "/dev/shm/" + seg.group(1) if seg else None
        memd_log = os.path.join(run_dir, "memd.log")
        replay_out = os.path.join(tmp, "killed-replay.out")
        with open(replay_out, "w") as out:
            client = subprocess.Popen([replay, "--connect", f"ipc://{run_dir}/worker-0.sock", "--preset", "glm5-like",
                                       "--requests", "4", "--concurrency", "4", "--length-scale", "0.3"],
                                      stdout=out, stderr=subprocess.STDOUT)
        # Requests hold host pages (memd's records) once they were admitted.
        admitted = wait_until(lambda: re.search(r"\d+ requests", dhsctl_status(run_dir)) is not None and
                              int(re.search(r"(\d+) requests", dhsctl_status(run_dir)).group(1)) > 0, 120)
        if not admitted:
            client.kill()
            client.wait()
            return ["kill -9: no request admitted within 120 s"]
        n.proc.kill()
        n.proc.wait()
        try:
            client.wait(timeout=120)
        except subprocess.TimeoutExpired:
            client.kill()
            client.wait()
        if not wait_until(lambda: all(gone(p) for p in children), 30):
            failures.append(f"kill -9: children {children} still running after 30 s")
        told = read(replay_out)
        # dhs-replay prints no per-request error; the worker logs how many requests it ended with "worker stopping"
        # (each a final chunk to its client and a Complete to memd).
        ended = re.search(r'gpu 0 stopping: (\d+) unfinished requests ended \("worker stopping"\)',
                          read(os.path.join(run_dir, "worker-0.log")))
        if not ended or int(ended.group(1)) == 0 or "failed 0)" in told:
            failures.append(f"kill -9: no request was ended with 'worker stopping': client {told[-800:]!r}")
        log = read(memd_log)
        if "SIGUSR1 (the node stops)" not in log:
            failures.append("kill -9: memd did not get its parent-death signal SIGUSR1")
        if "kept for the next memd" in log:
            failures.append("kill -9: memd kept requests the workers had ended ('kept for the next memd')")
        if segment and os.path.exists(segment):
            failures.append(f"kill -9: {segment} left (requests kept for the next memd)")
        # The next node on the run directory resumes nothing.
        worker_log = os.path.join(run_dir, "worker-0.log")
        before = len(read(worker_log))
        again = Node(node, config, os.path.join(tmp, "killed-again.out"))
        try:
            if not wait_until(lambda: "node ready (1 workers)" in again.out(), 120):
                failures.append("kill -9: the next node never became ready")
            resumed = re.findall(r"interrupted request \d+ .*resumes", read(worker_log)[before:])
            if resumed:
                failures.append(f"kill -9: the next node resumed requests its clients were told ended: {resumed}")
        finally:
            again.stop()
        if failures:
            print("---- memd.log ----\n" + read(memd_log)[-4000:])
            print("---- client ----\n" + told[-2000:])
            print("---- worker-0.log ----\n" + read(os.path.join(run_dir, "worker-0.log"))[-3000:])
    finally:
        if n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait()
    return failures


DHSCTL = None


def dhsctl_status(run_dir: str) -> str:
    r = subprocess.run([DHSCTL, "--run-dir", run_dir, "status"], capture_output=True, text=True, timeout=30)
    return r.stdout


def main() -> int:
    global DHSCTL
    node, replay, DHSCTL = sys.argv[1], sys.argv[2], sys.argv[3]
    only = sys.argv[4].split(",") if len(sys.argv) > 4 else None
    failures = []
    steps = [("fail_fast", lambda tmp: fail_fast(node, tmp)), ("check", lambda tmp: check(node, tmp)),
             ("run_dir", lambda tmp: run_dir_checks(node, replay, tmp)),
             ("liveness", lambda tmp: worker_liveness(node, replay, tmp)),
             ("killed", lambda tmp: node_killed_mid_request(node, replay, tmp))]
    with tempfile.TemporaryDirectory(prefix="dhs-node-ops-") as tmp:
        for name, step in steps:
            if only and name not in only:
                continue
            t0 = time.monotonic()
            got = step(tmp)
            print(f"{name}: {'FAIL' if got else 'ok'} ({time.monotonic() - t0:.1f} s)")
            failures += got
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
