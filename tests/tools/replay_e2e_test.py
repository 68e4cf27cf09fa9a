#!/usr/bin/env python3
"""End-to-end replay (issue 5): dhs-replay starts a real node (memd + workerd) and replays a 50-request slice of the
bundled Mooncake trace in adaptive mode under a GPU budget that forces reclaims, then replays it again in resident
mode (--check-exact). Asserts every request is served in both, and that tokens and per-token logits digests are
bit-identical (brief §7). Usage: replay_e2e_test.py DHS_REPLAY"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    replay = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        cmd = [replay, "--requests", "50", "--length-scale", "0.03", "--concurrency", "4",
               "--check-exact", "--json", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr[-4000:])
        if proc.returncode != 0:
            print(f"FAIL: dhs-replay exited {proc.returncode}")
            return 1
        with open(out) as f:
            report = json.load(f)
    failures = []
    expect = {"requests_total": 50, "requests_served": 50, "mode": "adaptive", "exact_match": True}
    for key, want in expect.items():
        if report.get(key) != want:
            failures.append(f"{key} = {report.get(key)!r}, want {want!r}")
    census = report.get("census") or {}
    total = sum(census.get(k, 0) for k in ("direct", "hot", "host"))
    if abs(total - 1.0) > 1e-9:
        failures.append(f"census shares sum to {total}, want 1")
    # The default budget is sized so that adaptive mode must reclaim and repopulate (brief §4).
    if report.get("reclaims", 0) < 1 or report.get("repopulated_pages", 0) < 1:
        failures.append(f"reclaims {report.get('reclaims')}, repopulated pages {report.get('repopulated_pages')}: "
                        "the run did not exercise reclaim and population")
    # Requests were served with memd reachable: some session was admitted, however short the run (memd is sampled
    # at each first token and end, and a request streaming tokens counts as admitted).
    if report.get("sessions_admitted_max", 0) < 1:
        failures.append(f"sessions_admitted_max = {report.get('sessions_admitted_max')!r}, want >= 1")
    if report.get("complete") is not True:
        failures.append(f"complete = {report.get('complete')!r}, want True")
    if report.get("output_tokens", 0) <= 0:
        failures.append("no output tokens")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
