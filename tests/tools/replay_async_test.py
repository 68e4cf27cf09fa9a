#!/usr/bin/env python3
"""dhs-replay on the CPU device's asynchronous mode (issue 28): copies complete and reads end device steps after the
calls that started them (workerd --async-device SEED), so the hierarchy's ordering rules are exercised end to end as
on a GPU: a page memd retires before the worker's ReadersDone, a ReadersDone sent before the reads ended, or a
staging arena written while its readers still read, is a read hazard that ends the worker with its description, and
a wait that cannot end fails within 10 s naming what it waits for. One run: the bundled trace slice (50 requests,
lengths x0.03, concurrency 4) in adaptive mode under the default reclaiming budget, with speculative rounds
(--speculate synthetic --block 4 --spec-corruption 0.3: unions beyond the hot cache go through staging arenas) and
one worker kill point (decode:30, so the node is supervised and its host ledger runs), --check-exact against the
resident run (also on the asynchronous device). Asserts: every request served, outputs bit-identical, no request
failed, host_rows_lost 0 and host_pages_unconfirmed 0 (every page below the tail window confirmed) with host pages
checked, no worker crash (worker_crashes 0, one restart: the kill point's; a supervised node would otherwise hide a
hazard's abort behind a restart), and the run reclaimed. On failure, prints the tail of each workerd log (where a hazard is described).
Usage: replay_async_test.py DHS_REPLAY"""
import glob
import json
import os
import subprocess
import sys
import tempfile

ARGS = ["--requests", "50", "--length-scale", "0.03", "--concurrency", "4", "--check-exact",
        "--async-device", "7", "--speculate", "synthetic", "--block", "4", "--spec-corruption", "0.3",
        "--hot-rows", "20", "--hbm-budget", "4500000", "--kill-worker-at", "decode:30", "--fault-seed", "28"]


def main() -> int:
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        run_dir = os.path.join(tmp, "run")
        os.makedirs(run_dir, mode=0o700)
        cmd = [exe] + ARGS + ["--json", out, "--run-dir", run_dir]
        print("$ dhs-replay", " ".join(cmd[1:]), flush=True)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
            rc, stdout, err = proc.returncode, proc.stdout, proc.stderr.replace("\r", "\n")
        except subprocess.TimeoutExpired as e:
            rc, stdout, err = "timeout (240 s)", (e.stdout or b"").decode(errors="replace"), ""
        sys.stdout.write(stdout)
        report = json.load(open(out)) if os.path.exists(out) else {}
        failures = []
        if rc != 0:
            failures.append(f"dhs-replay exited {rc}:\n{err[-3000:]}")
        for key, want in {"requests_served": 50, "requests_failed": 0, "exact_match": True, "host_rows_lost": 0,
                          "host_pages_unconfirmed": 0, "worker_crashes": 0, "worker_restarts": 1,
                          "complete": True}.items():
            if report.get(key) != want:
                failures.append(f"{key} = {report.get(key)!r}, want {want!r}")
        if report.get("host_pages_checked", 0) < 1:
            failures.append("no host page was checked: host_rows_lost == 0 proves nothing")
        if report.get("reclaims", 0) < 1:
            failures.append("no reclaim happened: the ordering rules of reclaim were not exercised")
        if failures:
            for log in sorted(glob.glob(os.path.join(run_dir, "workerd*.log"))):
                with open(log, errors="replace") as f:
                    lines = [l for l in f.read().splitlines() if "hazard" in l or "error" in l or "critical" in l]
                print(f"--- {os.path.basename(log)} (hazards and errors, last 20):")
                print("\n".join(lines[-20:]))
        for f in failures:
            print("FAIL:", f)
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
