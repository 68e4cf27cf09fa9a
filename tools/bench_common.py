"""tools/bench_common.py: what the benchmark scripts (bench_modes.py, bench_reclaim_policy.py) share: one dhs-replay
run read back as its JSON report, and the scalar figures they compare.

Not a benchmark itself; imported from the scripts' own folder.
"""
import json
import os
import subprocess
import sys


def run_replay(replay, options, out, label, allow_unserved=False):
    """Runs `replay` with `options` (a list of command-line words) plus `--json out` and returns the parsed report.

    Exit 1 with a report written means some request was not served (e.g. resident mode cannot fit it): with
    allow_unserved the figures are kept. Any other failure prints the tail of stderr and exits naming `label`.
    """
    proc = subprocess.run([replay, *options, "--json", out], capture_output=True, text=True)
    if proc.returncode != 0 and not (allow_unserved and proc.returncode == 1 and os.path.exists(out)):
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"{label} failed (exit {proc.returncode})")
    with open(out) as f:
        return json.load(f)


def _share(r, kind):
    """The census share `kind` (direct / hot / host) of a report; NaN when no row was selected."""
    share = (r["census"] or {}).get(kind)
    return share if share is not None else float("nan")


def figures(r):
    """The scalar figures of one replay report (a point of a sweep or a single run); NaN where not measured."""
    nan = float("nan")
    return {
        "served": r["requests_served"],
        "sessions": r["sessions_admitted_max"],
        "reclaims": r["reclaims"],
        "repopulated_pages": r["repopulated_pages"],
        "census_direct": _share(r, "direct"),
        "census_hot": _share(r, "hot"),
        "census_host": _share(r, "host"),
        "allocation_wait_share": r["allocation_wait_share"] if r["allocation_wait_share"] is not None else nan,
        "ttft_p50_ms": (r["ttft_ms"] or {}).get("p50", nan),
        "ttft_p99_ms": (r["ttft_ms"] or {}).get("p99", nan),
        "tpot_p50_ms": (r["tpot_ms"] or {}).get("p50", nan),
        "output_tokens_per_s": r["output_tokens_per_s"],
    }
