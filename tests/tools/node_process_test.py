#!/usr/bin/env python3
"""dhs-node with real processes (tools/node, issue 11 "The node launcher"), in a private temporary directory:
(1) a bad configuration exits 2 naming the key; (2) a node of two CPU workers (glm5-like preset) comes up: "node
ready", memd's log shows each worker's pid registered; (3) dhs-replay --connect serves 3 requests on worker 0 (the
attach documented in docs/operations.md); (4) SIGKILL of worker 0: dhs-node restarts it, the new pid registers with
memd (epoch 2) and "node ready again" follows; (4b) SIGKILL of memd: memd restarted on the same host-pool segment
(named by the run directory), the workers keep running (the same pids) and say their re-Hello to the new memd; (4c)
SIGSTOP of memd (hung): dhs-node's liveness probes go unanswered, it SIGKILLs memd after memd_liveness_timeout_ms and
restarts it, the workers again survive with their re-Hello; (5) SIGTERM of dhs-node: workers stop before memd, exit 0, no child
left, no socket and no /dev/shm segment of the node left; (6) SIGKILL of dhs-node: its children stop on their
parent-death signal and clean up. Prints start-to-ready and kill-to-ready-again times from the node's log. Waits
poll the node's output or /proc with a deadline (orderings, not timings). Readiness notification (when built with
libsystemd, SYSTEMD=1): under a NOTIFY_SOCKET
dhs-node sends READY=1 for "node ready" and each "node ready again" and STOPPING=1, and its children none (they do not
inherit the socket); memd and workerd started from `dhs-node --check`'s command lines each send READY=1 themselves.
Usage: node_process_test.py DHS_NODE DHS_REPLAY SYSTEMD"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

from proc_util import gone, wait_until

CONFIG = """
[node]
run_dir = "{run_dir}"

[memd]
host_pool_bytes = "16MiB"
log_level = "info"
worker_timeout_ms = 6000

[[worker]]
gpu = 0
preset = "glm5-like"
page_rows = 16
slots = 4
hbm_budget_bytes = "4MiB"
device = "cpu"
memd_timeout_ms = 5000

[[worker]]
gpu = 1
preset = "glm5-like"
page_rows = 16
slots = 2
hbm_budget_bytes = "2MiB"
device = "cpu"
mode = "resident"
memd_timeout_ms = 5000

[supervise]
backoff_initial_ms = 100
stop_grace_ms = 5000
liveness_probe_ms = 200
memd_liveness_timeout_ms = 1000
"""


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""






def started_pids(out: str, name: str) -> list:
    return [int(p) for p in re.findall(rf"started {name} \(pid (\d+)\)", out)]


def bad_config(node: str, tmp: str) -> list:
    path = os.path.join(tmp, "bad.toml")
    with open(path, "w") as f:
        f.write(CONFIG.format(run_dir=os.path.join(tmp, "bad-run")).replace("slots = 2", "slots = 0"))
    r = subprocess.run([node, "--config", path], capture_output=True, text=True, timeout=30)
    failures = []
    if r.returncode != 2 or "worker[1].slots: 0 is out of range" not in r.stderr:
        failures.append(f"bad config: rc {r.returncode}, stderr {r.stderr!r}")
    if os.path.exists(os.path.join(tmp, "bad-run")):
        failures.append("bad config: the run directory was created")
    return failures


def notify_socket(tmp: str, name: str):
    """A datagram socket standing in for systemd's NOTIFY_SOCKET; returns (socket, path)."""
    path = os.path.join(tmp, name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    return sock, path


def notifications(sock) -> list:
    msgs = []
    while True:
        try:
            msgs.append(sock.recv(4096).decode())
        except BlockingIOError:
            return msgs


def daemons_notify(node: str, tmp: str, config: str) -> list:
    """memd and workerd, started by hand from `dhs-node --check`'s command lines, each send READY=1."""
    check = subprocess.run([node, "--config", config, "--check"], capture_output=True, text=True, timeout=30)
    lines = check.stdout.split("\n")
    if check.returncode != 0 or len(lines) < 2 or "--page-bytes" not in lines[0]:
        return [f"dhs-node --check: rc {check.returncode}, {check.stdout!r} {check.stderr!r}"]
    failures, procs = [], []
    try:
        for name, line in (("memd", lines[0]), ("workerd", lines[1])):
            sock, path = notify_socket(tmp, name + ".notify")
            env = dict(os.environ, NOTIFY_SOCKET=path)
            procs.append(subprocess.Popen(line.split(), env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            got = []
            if not wait_until(lambda: got.extend(notifications(sock)) or any("READY=1" in m for m in got), 60):
                failures.append(f"{name} sent no READY=1 (got {got})")
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
    return failures


def node_killed(node: str, tmp: str) -> list:
    """SIGKILL of dhs-node: memd and the workers get SIGTERM from the kernel and stop cleanly."""
    run_dir = os.path.join(tmp, "killed")
    config = os.path.join(tmp, "killed.toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(run_dir=run_dir))
    out_path = os.path.join(tmp, "killed.out")
    with open(out_path, "w") as out:
        proc = subprocess.Popen([node, "--config", config], stdout=out, stderr=subprocess.STDOUT)
    if not wait_until(lambda: "node ready (2 workers)" in read(out_path), 120):
        proc.kill()
        proc.wait()
        return ["SIGKILL of dhs-node: the node never became ready"]
    out = read(out_path)
    children = started_pids(out, "memd") + started_pids(out, "worker gpu 0") + started_pids(out, "worker gpu 1")
    seg = re.search(r"host pool /dev/shm/(\S+):", read(os.path.join(run_dir, "memd.log")))
    proc.kill()
    proc.wait()
    failures = []
    if not wait_until(lambda: all(gone(p) for p in children), 30):
        failures.append(f"SIGKILL of dhs-node: children {children} still running after 30 s")
    if seg and not wait_until(lambda: not os.path.exists("/dev/shm/" + seg.group(1)), 10):
        failures.append(f"SIGKILL of dhs-node: /dev/shm/{seg.group(1)} left")
    return failures


def wait_for_re_hellos(run_dir: str, gpu: int, pid: int, count: int) -> bool:
    """True once memd.log holds `count` re-Hellos of worker `pid` of `gpu` ("survived a memd restart"), within 20 s.
    "node ready again" is dhs-node's word that the new memd answers its probe; each surviving worker's re-Hello
    reaches that memd on the worker's own reconnect, after it (so the log is polled, not read once)."""
    pattern = rf"worker of GPU {gpu} \(pid {pid}\) survived a memd restart"
    return wait_until(lambda: len(re.findall(pattern, read(os.path.join(run_dir, "memd.log")))) == count, 20)


def memd_killed(proc, out_path: str, run_dir: str, old_segment: str) -> list:
    """SIGKILL of memd: restarted after its backoff; the workers (restart_workers_with_memd off, the default) keep
    running, the SAME processes, and each says its re-Hello to the new memd ("survived a memd restart"), keeping its
    epoch; "node ready again"."""
    out = read(out_path)
    memd_pid = started_pids(out, "memd")[0]
    workers = {g: started_pids(out, f"worker gpu {g}") for g in (0, 1)}
    os.kill(memd_pid, signal.SIGKILL)
    if not wait_until(lambda: read(out_path).count("node ready again") == 2, 60):
        return ["no second 'node ready again' within 60 s of SIGKILL of memd"]
    out = read(out_path)
    failures = []
    memds = started_pids(out, "memd")
    if len(memds) != 2 or gone(memds[1]):
        failures.append(f"memd not restarted once: {memds}")
    for g in (0, 1):
        now = started_pids(out, f"worker gpu {g}")
        if now != workers[g] or gone(now[-1]):
            failures.append(f"worker gpu {g} was restarted with memd (its process should survive): {workers[g]} -> {now}")
        elif not wait_for_re_hellos(run_dir, g, now[-1], 1):
            failures.append(f"worker gpu {g} (pid {now[-1]}) did not say its re-Hello to the new memd")
    memd_log = read(os.path.join(run_dir, "memd.log"))
    # The restarted memd took the dead one's segment over (named by the run directory, docs/operations.md "memd
    # restart: what survives"): the same segment, and no other one of this node.
    segs = re.findall(r"host pool /dev/shm/(\S+):", memd_log)
    if not old_segment or len(segs) != 2 or "/dev/shm/" + segs[1] != old_segment or not os.path.exists(old_segment):
        failures.append(f"the restarted memd did not take over the dead one's segment {old_segment}: {segs}")
    return failures


def memd_hung(out_path: str, run_dir: str) -> list:
    """SIGSTOP of memd: no liveness probe answers; dhs-node SIGKILLs it after memd_liveness_timeout_ms (1 s here, well
    under the workers' memd_timeout_ms of 5 s, so the workers see its connection close, not a silence) and restarts
    it; the same worker processes say their re-Hello to the third memd; "node ready again"."""
    out = read(out_path)
    memd_pid = started_pids(out, "memd")[-1]
    workers = {g: started_pids(out, f"worker gpu {g}") for g in (0, 1)}
    os.kill(memd_pid, signal.SIGSTOP)
    if not wait_until(lambda: read(out_path).count("node ready again") == 3, 60):
        os.kill(memd_pid, signal.SIGKILL)
        return ["no third 'node ready again' within 60 s of SIGSTOP of memd"]
    out = read(out_path)
    failures = []
    if not re.search(r"memd answered no probe for \d+ ms \(hung\): SIGKILL", out):
        failures.append("dhs-node did not log the hung memd's SIGKILL")
    memds = started_pids(out, "memd")
    if len(memds) != 3 or not gone(memd_pid) or gone(memds[-1]):
        failures.append(f"the hung memd {memd_pid} was not killed and replaced once: {memds}")
    for g in (0, 1):
        now = started_pids(out, f"worker gpu {g}")
        if now != workers[g] or gone(now[-1]):
            failures.append(f"worker gpu {g} did not survive the hung memd: {workers[g]} -> {now}")
        elif not wait_for_re_hellos(run_dir, g, now[-1], 2):
            failures.append(f"worker gpu {g} (pid {now[-1]}) did not say its re-Hello to the third memd")
    return failures


def stamp(out: str, text: str, after: int = 0) -> float:
    """Seconds of the day of the first log line holding `text` at or after offset `after`."""
    at = out.find(text, after)
    line = out[out.rfind("\n", 0, at) + 1:at]
    h, m, sec = re.search(r"(\d\d):(\d\d):(\d\d\.\d+)\]", line).groups()
    return int(h) * 3600 + int(m) * 60 + float(sec)


def main() -> int:
    node, replay, systemd = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    failures = []
    with tempfile.TemporaryDirectory(prefix="dhs-node-test-") as tmp:
        failures += bad_config(node, tmp)
        run_dir = os.path.join(tmp, "run")
        config = os.path.join(tmp, "node.toml")
        with open(config, "w") as f:
            f.write(CONFIG.format(run_dir=run_dir))
        if systemd:
            by_hand = os.path.join(tmp, "by-hand.toml")
            with open(by_hand, "w") as f:
                f.write(CONFIG.format(run_dir=os.path.join(tmp, "by-hand")))
            failures += daemons_notify(node, tmp, by_hand)
        notify, notify_path = notify_socket(tmp, "node.notify")
        out_path = os.path.join(tmp, "node.out")
        with open(out_path, "w") as out:
            proc = subprocess.Popen([node, "--config", config], stdout=out, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, NOTIFY_SOCKET=notify_path))
        try:
            failures += scenario(proc, out_path, run_dir, replay, tmp)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        failures += node_killed(node, tmp)
        msgs = notifications(notify)
        ready = [m for m in msgs if "READY=1" in m]
        want_ready = ["node ready (2 workers)"] + ["node ready again (2 workers)"] * 3  # worker, memd killed, hung
        if systemd and ([m.split("STATUS=dhs-node: ")[-1] for m in ready] != want_ready or
                        sum("STOPPING=1" in m for m in msgs) != 1):
            failures.append(f"notifications to NOTIFY_SOCKET: {msgs}, want READY=1 for {want_ready} and one STOPPING=1")
        if not systemd and msgs:
            failures.append(f"built without libsystemd but notified: {msgs}")
        if failures:
            print("---- dhs-node output ----\n" + read(out_path))
            print("---- memd.log ----\n" + read(os.path.join(run_dir, "memd.log"))[-3000:])
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def scenario(proc, out_path: str, run_dir: str, replay: str, tmp: str) -> list:
    memd_log = os.path.join(run_dir, "memd.log")
    if not wait_until(lambda: "node ready (2 workers)" in read(out_path), 120):
        return ["no 'node ready (2 workers)' within 120 s"]
    out = read(out_path)
    memd_pid = started_pids(out, "memd")[0]
    w0, w1 = started_pids(out, "worker gpu 0")[0], started_pids(out, "worker gpu 1")[0]
    failures = []
    for gpu, pid in ((0, w0), (1, w1)):
        if f"worker of GPU {gpu} (pid {pid}," not in read(memd_log):
            failures.append(f"memd did not log GPU {gpu}'s worker pid {pid} registered before 'node ready'")
    seg = re.search(r"host pool /dev/shm/(\S+):", read(memd_log))
    segment = "/dev/shm/" + seg.group(1) if seg else None
    if segment is None or not os.path.exists(segment):
        failures.append(f"host-pool segment not found ({segment})")

    report = os.path.join(tmp, "replay.json")
    r = subprocess.run([replay, "--connect", f"ipc://{run_dir}/worker-0.sock", "--preset", "glm5-like",
                        "--requests", "3", "--length-scale", "0.02", "--json", report],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or not json.loads(read(report) or "{}").get("complete"):
        failures.append(f"dhs-replay --connect: rc {r.returncode}, {r.stderr[-500:]!r}")

    os.kill(w0, signal.SIGKILL)
    if not wait_until(lambda: "node ready again" in read(out_path), 60):
        return failures + ["no 'node ready again' within 60 s of SIGKILL of worker gpu 0"]
    out = read(out_path)
    restarted = started_pids(out, "worker gpu 0")
    if len(restarted) != 2 or restarted[1] == w0 or gone(restarted[1]):
        failures.append(f"worker gpu 0 not restarted once with a new live pid: {restarted}")
    elif not re.search(rf"worker of GPU 0 \(pid {restarted[1]}, [^)]*\) registered: .* epoch 2", read(memd_log)):
        failures.append(f"the restarted worker (pid {restarted[1]}) did not register with memd as epoch 2")
    if not gone(w0):
        failures.append(f"the killed worker {w0} is still there")
    if started_pids(out, "worker gpu 1") != [w1] or started_pids(out, "memd") != [memd_pid]:
        failures.append("memd or worker gpu 1 was restarted though only worker gpu 0 died")

    up = stamp(out, "node ready (") - stamp(out, "started memd")
    again = stamp(out, "node ready again") - stamp(out, "worker gpu 0 (pid")
    print(f"figures: start -> node ready {up:.3f} s; "
          f"worker SIGKILL -> node ready again {again:.3f} s (backoff 0.100 s)")
    failures += memd_killed(proc, out_path, run_dir, segment)
    failures += memd_hung(out_path, run_dir)
    out = read(out_path)
    children = started_pids(out, "memd")[-1:] + started_pids(out, "worker gpu 0")[-1:] + \
        started_pids(out, "worker gpu 1")[-1:]
    seg = re.findall(r"host pool /dev/shm/(\S+):", read(memd_log))
    segment = "/dev/shm/" + seg[-1] if seg else None
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        return failures + ["dhs-node did not exit within 60 s of SIGTERM"]
    if rc != 0:
        failures.append(f"dhs-node exit code {rc} after SIGTERM, want 0")
    out = read(out_path)
    if "stopped cleanly" not in out:
        failures.append("no 'stopped cleanly'")
    memd_term = out.rfind("SIGTERM memd")
    for gpu in (0, 1):
        exited = out.rfind(f"worker gpu {gpu} (pid")
        if memd_term < 0 or exited < 0 or exited > memd_term:
            failures.append(f"memd was not stopped after worker gpu {gpu} exited")
    for pid in children:
        if not gone(pid):
            failures.append(f"child {pid} still running after dhs-node exited")
    if segment and os.path.exists(segment):
        failures.append(f"{segment} left in /dev/shm")
    left = [n for n in os.listdir(run_dir) if n.endswith(".sock")]
    if left:
        failures.append(f"sockets left in the run directory: {left}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
