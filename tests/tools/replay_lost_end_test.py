#!/usr/bin/env python3
"""A finished request's end must survive the worker's death (the "lost end" of tools/chaos.sh run 4, populate seed
1004; workerd/README.md "Restart: a finished request's end"), with real processes: dhs-replay starts memd and workerd,
replays the bundled trace slice and re-attaches after each kill.

The interleaving is forced with the test-only kill point `complete` (common/fault_point.h): a worker armed with
`--fault-kill-at complete:N` keeps every final TokenChunk back (as if still queued in the process when it dies: the
client outbox, or ZeroMQ's send queue, which its I/O thread writes out independently of the memd socket's) and
SIGKILLs itself when memd acknowledges its N-th Complete (memd released the request: it is no longer an interrupted
request to resume). Its clients hold some tokens of those requests but not their end; they re-attach to the restarted
worker, which must still serve each of them (before the fix: `Attach` NOT_FOUND, the request "rejected").
  1. complete:1 then complete:2: the second start dies with the first's kept outputs claimed by re-attached clients
     whose final chunks it also kept back (an Attach answered, then a second death); the third start serves them.
  2. complete:3: three finished requests' ends die with the first start (the client's four requests in flight: the
     armed worker holds their ends, so it reaches its third Complete); the second start serves them.
(An armed start reaches its N-th Complete only with N requests it completes itself: its held ends stop the closed-loop
client's new submits, and the outputs it hands out by Attach are not completed again.)
Each: every request served, exactly (--check-exact), none failed or resubmitted (before the fix: the clients' Attach
got NOT_FOUND, "rejected", or resubmitted when they held no token), the kills counted, each armed worker's log line.
Each run has its own temporary directory; every wait is bounded.
Usage: replay_lost_end_test.py DHS_REPLAY"""
import json
import os
import subprocess
import sys
import tempfile

SLICE = ["--requests", "50", "--length-scale", "0.03", "--concurrency", "4"]


def replay(exe: str, kills: list, seed: int, tmp: str, name: str) -> list:
    failures = []
    out = os.path.join(tmp, name + ".json")
    run_dir = os.path.join(tmp, name)
    cmd = [exe] + SLICE + ["--check-exact", "--fault-seed", str(seed), "--run-dir", run_dir, "--json", out]
    for k in kills:
        cmd += ["--kill-worker-at", k]
    print("$", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    err = proc.stderr.replace("\r", "\n")
    summary = [l for l in proc.stdout.splitlines() if "faults (seed" in l or "exact match" in l]
    print("\n".join("  " + l.strip() for l in summary), flush=True)
    report = json.load(open(out)) if os.path.exists(out) else {}
    if proc.returncode != 0 or not report:
        lost = [l for l in err.splitlines() if "not a resumed request" in l or "rejected" in l]
        return [f"{name}: dhs-replay exited {proc.returncode}; {len(lost)} lines of lost ends, first: "
                f"{lost[:3]!r}\n{err[-2500:]}"]
    for key, want in {"requests_served": 50, "requests_failed": 0, "exact_match": True, "complete": True,
                      "worker_restarts": len(kills), "kill_points_armed": len(kills),
                      "requests_resubmitted": 0}.items():
        if report.get(key) != want:
            failures.append(f"{name}: {key} = {report.get(key)!r}, want {want!r}")
    log = ""
    try:
        with open(os.path.join(run_dir, "workerd.log"), errors="replace") as f:
            log = f.read()
    except OSError:
        pass
    for k in kills:
        if f"fault injection: SIGKILL at {k}" not in log:
            failures.append(f"{name}: workerd.log lacks the kill at {k}")
    return failures


def main() -> int:
    exe = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        failures += replay(exe, ["complete:1", "complete:2"], 21, tmp, "twice")
        failures += replay(exe, ["complete:3"], 22, tmp, "three")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
