#!/usr/bin/env python3
"""tools/bench_modes.py: throughput and TPOT of the three KV modes (resident, hisparse, adaptive) at several
concurrencies under ONE GPU memory budget, in one run, printed as ratios to resident (issue 5's benchmark).

Each (mode, concurrency) point is one dhs-replay run on a fresh node over the same trace slice. The budget is the
replay's default for the slice (printed) unless --hbm-budget is given. Expected shape: adaptive within a few percent
of resident while every resident history fits, and ahead of both once it no longer does.

The default model preset is bench-wide: the weights (109 MiB) exceed the CPU's caches, so one decode step streams
them once for the whole batch, as a GPU decode does; more admitted sessions then mean more tokens per step.

Usage: tools/bench_modes.py [--replay build/tools/replay/dhs-replay] [--requests 16] [--length-scale 0.1]
                            [--concurrency 1,4,8] [--hbm-budget BYTES] [--preset bench-wide] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MODES = ("resident", "hisparse", "adaptive")


def run(args, mode, tmp):
    out = os.path.join(tmp, f"{mode}.json")
    cmd = [args.replay, "--mode", mode, "--requests", str(args.requests), "--length-scale", str(args.length_scale),
           "--sweep", args.concurrency, "--preset", args.preset, "--json", out]
    if args.hbm_budget:
        cmd += ["--hbm-budget", args.hbm_budget]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    # Exit 1 with a report: some request was not served (e.g. resident mode cannot fit it): keep the figures.
    if proc.returncode != 0 and not (proc.returncode == 1 and os.path.exists(out)):
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"bench_modes: {mode} run failed (exit {proc.returncode})")
    with open(out) as f:
        return {p["settings"]["concurrency"]: p for p in json.load(f)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", default="build/tools/replay/dhs-replay")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--length-scale", type=float, default=0.1)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--hbm-budget", default="")
    ap.add_argument("--preset", default="bench-wide",
                    help="model preset; bench-wide (default) streams 109 MiB of weights per step like a GPU decode, so "
                         "batching more sessions raises throughput; dsv4flash-like fits in cache and does not")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {mode: run(args, mode, tmp) for mode in MODES}
    conc = sorted(results["resident"].keys())
    budget = results["resident"][conc[0]]["settings"].get("hbm_budget_bytes")
    print(f"bench_modes: preset {args.preset}, {args.requests} requests, length scale {args.length_scale}, "
          f"GPU KV budget {budget} bytes")
    print(f"{'C':>3} {'mode':<9} {'served':>6} {'tok/s':>8} {'TPOT p50 ms':>12} {'TTFT p50 ms':>12} {'sessions':>8} "
          f"{'tok/s vs res':>12} {'TPOT vs res':>11}")
    rows = []
    for c in conc:
        base = results["resident"][c]
        for mode in MODES:
            r = results[mode][c]
            tps, tpot = r["output_tokens_per_s"], (r["tpot_ms"] or {}).get("p50")
            btpot = (base["tpot_ms"] or {}).get("p50")
            ratio_tps = tps / base["output_tokens_per_s"] if base["output_tokens_per_s"] else float("nan")
            ratio_tpot = tpot / btpot if tpot and btpot else float("nan")
            print(f"{c:>3} {mode:<9} {r['requests_served']:>6} {tps:>8.1f} {tpot or float('nan'):>12.2f} "
                  f"{(r['ttft_ms'] or {}).get('p50', float('nan')):>12.1f} {r['sessions_admitted_max']:>8} "
                  f"{ratio_tps:>12.3f} {ratio_tpot:>11.3f}")
            rows.append({"concurrency": c, "mode": mode, "output_tokens_per_s": tps, "tpot_p50_ms": tpot,
                         "throughput_vs_resident": ratio_tps, "tpot_vs_resident": ratio_tpot,
                         "sessions_admitted_max": r["sessions_admitted_max"],
                         "requests_served": r["requests_served"]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "hbm_budget_bytes": budget, "points": rows}, f, indent=2)


if __name__ == "__main__":
    main()
