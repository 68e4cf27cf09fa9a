#!/usr/bin/env python3
"""dhs-replay's fault injection (issue 11), short version for CI (tools/chaos.sh is the long one). dhs-replay starts
and supervises its own node and replays the bundled trace slice (tools/replay/data, the repo's copy):
  1. kill points: the 1st..4th worker starts SIGKILL themselves at prefill:3, decode:40, backup:2 and populate:1
     (workerd --fault-kill-at) in adaptive mode under the default, reclaiming GPU budget; --check-exact;
  2. timed kills: SIGKILL of the worker every ~1 s (uniform, seed printed), adaptive, --check-exact;
  3. a flipped byte of a backed-up host page (--corrupt-host-page-for-test, hisparse) must count in host_rows_lost;
  4. memd SIGKILLed (--restart-memd-every): restarted and counted; every request is still served, exactly, none
     failed, and the worker is never restarted (it survives and says its re-Hello to the new memd).
1 and 2: every request served, outputs bit-identical to the resident run, host_rows_lost == 0 with host pages
checked, worker_restarts == the kills; 1 runs in a given --run-dir: the fault run's logs (workerd.log, memd.log) stay
intact beside the reference run's (workerd.reference.log, memd.reference.log). Each run has its own temporary
directory; every wait is bounded.
Usage: replay_faults_test.py DHS_REPLAY"""
import json
import os
import subprocess
import sys
import tempfile

SLICE = ["--requests", "50", "--length-scale", "0.03", "--concurrency", "4"]
KILL_POINTS = ["prefill:3", "decode:40", "backup:2", "populate:1"]


def replay(exe: str, args: list, tmp: str, name: str) -> tuple:
    out = os.path.join(tmp, name + ".json")
    cmd = [exe] + SLICE + args + ["--json", out]
    print("$", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    err = proc.stderr.replace("\r", "\n")
    seed = [l for l in err.splitlines() if "fault seed" in l]
    print("  " + (seed[0] if seed else "no seed line"))
    summary = [l for l in proc.stdout.splitlines() if "faults (seed" in l or "exact match" in l]
    print("\n".join("  " + l.strip() for l in summary), flush=True)
    report = json.load(open(out)) if os.path.exists(out) else {}
    return proc.returncode, report, err


def expect(failures: list, name: str, report: dict, key: str, want) -> None:
    if report.get(key) != want:
        failures.append(f"{name}: {key} = {report.get(key)!r}, want {want!r}")


def check_clean(failures: list, name: str, rc: int, report: dict, err: str) -> None:
    if rc != 0:
        failures.append(f"{name}: dhs-replay exited {rc}:\n{err[-3000:]}")
        return
    for key, want in {"requests_served": 50, "requests_failed": 0, "exact_match": True, "host_rows_lost": 0,
                      "host_pages_unconfirmed": 0, "complete": True}.items():
        expect(failures, name, report, key, want)
    if report.get("host_pages_checked", 0) < 1:
        failures.append(f"{name}: no host page was checked: host_rows_lost == 0 proves nothing")
    if report.get("requests_resumed", 0) < 1:
        failures.append(f"{name}: no request was resumed")


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def kill_points(exe: str, tmp: str, failures: list) -> None:
    run_dir = os.path.join(tmp, "rd")  # a given --run-dir: --check-exact's two runs share it
    args = ["--check-exact", "--fault-seed", "11", "--run-dir", run_dir]
    for k in KILL_POINTS:
        args += ["--kill-worker-at", k]
    rc, report, err = replay(exe, args, tmp, "points")
    check_clean(failures, "kill points", rc, report, err)
    # The fault run's logs stay intact after the resident reference run (its own memd.reference.log and
    # workerd.reference.log): every armed worker's kill line, appended across the restarts, is still there.
    fault_log = read(os.path.join(run_dir, "workerd.log"))
    for k in KILL_POINTS:
        if f"fault injection: SIGKILL at {k}" not in fault_log:
            failures.append(f"kill points: {run_dir}/workerd.log lacks the kill at {k} (overwritten by the "
                            f"reference run?):\n{fault_log[-1500:]}")
    # The reference run's own logs exist (the daemons log at warn: a clean resident run may leave them empty) and hold
    # nothing of the fault run.
    for name in ["workerd.reference.log", "memd.log", "memd.reference.log"]:
        if not os.path.isfile(os.path.join(run_dir, name)):
            failures.append(f"kill points: {run_dir}/{name} missing")
    if "fault injection" in read(os.path.join(run_dir, "workerd.reference.log")):
        failures.append(f"kill points: {run_dir}/workerd.reference.log holds the fault run's lines")
    expect(failures, "kill points", report, "worker_restarts", len(KILL_POINTS))
    expect(failures, "kill points", report, "kill_points_armed", len(KILL_POINTS))
    expect(failures, "kill points", report, "worker_kills", 0)
    for k in KILL_POINTS:  # the only SIGKILL of each armed worker is its own kill point
        if f"worker exited (signal SIGKILL (9)), armed with --fault-kill-at {k}" not in err:
            failures.append(f"kill points: the worker armed with {k} did not die by SIGKILL")
    if report.get("reclaims", 0) < 1 or report.get("repopulated_pages", 0) < 1:
        failures.append("kill points: no reclaim or population: the budget did not put the node under pressure")


def timed_kills(exe: str, tmp: str, failures: list) -> None:
    args = ["--check-exact", "--kill-worker-every", "1", "--fault-distribution", "uniform", "--fault-seed", "5"]
    rc, report, err = replay(exe, args, tmp, "timed")
    check_clean(failures, "timed kills", rc, report, err)
    if report.get("worker_kills", 0) < 1:
        failures.append(f"timed kills: worker_kills = {report.get('worker_kills')!r}, want >= 1")
    expect(failures, "timed kills", report, "worker_restarts", report.get("worker_kills"))
    samples = (report.get("recovery_us") or {}).get("samples") or []
    if not samples or min(samples) <= 0:
        failures.append(f"timed kills: recovery samples {samples!r}, want positive ones")


def corruption(exe: str, tmp: str, failures: list) -> None:
    args = ["--mode", "hisparse", "--kill-worker-every", "1", "--fault-distribution", "uniform", "--fault-seed", "5",
            "--corrupt-host-page-for-test"]
    rc, report, err = replay(exe, args, tmp, "corrupt")
    if "TEST ONLY: flipped byte 0 of host page" not in err:
        failures.append(f"corruption: no byte was flipped (rc {rc}):\n{err[-2000:]}")
    if report.get("host_rows_lost", 0) <= 0:
        failures.append(f"corruption: host_rows_lost = {report.get('host_rows_lost')!r}, want > 0")


def memd_restart(exe: str, tmp: str, failures: list) -> None:
    """memd SIGKILLed and restarted under a live replay: the new memd adopts the host pool and the records, the worker
    survives (the same process keeps serving from its GPU and says its re-Hello with a report to the new memd, issue
    11): no worker restart, every request is served, exactly, none failed."""
    args = ["--restart-memd-every", "1.5", "--fault-distribution", "uniform", "--fault-seed", "3", "--check-exact"]
    rc, report, err = replay(exe, args, tmp, "memd")
    if rc != 0 or not report:
        failures.append(f"memd restart: dhs-replay exited {rc}:\n{err[-3000:]}")
        return
    if report.get("memd_restarts", 0) < 1:
        failures.append(f"memd restart: memd_restarts = {report.get('memd_restarts')!r}, want >= 1")
    expect(failures, "memd restart", report, "requests_served", 50)
    expect(failures, "memd restart", report, "requests_failed", 0)
    expect(failures, "memd restart", report, "exact_match", True)
    expect(failures, "memd restart", report, "worker_restarts", 0)
    expect(failures, "memd restart", report, "host_rows_lost", 0)
    if report.get("host_pages_checked", 0) <= 0:
        failures.append(f"memd restart: host_pages_checked = {report.get('host_pages_checked')!r}, want > 0")
    print(f"  memd restart: host_rows_lost {report.get('host_rows_lost')} of {report.get('host_pages_checked')} pages")


def main() -> int:
    exe = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        kill_points(exe, tmp, failures)
        timed_kills(exe, tmp, failures)
        corruption(exe, tmp, failures)
        memd_restart(exe, tmp, failures)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
