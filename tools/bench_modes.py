#!/usr/bin/env python3
"""tools/bench_modes.py: throughput and TPOT of the three KV modes (resident, hisparse, adaptive) at several
concurrencies under ONE GPU memory budget, in one run, printed as ratios to resident (issue 5's benchmark).

Each (mode, concurrency) point is one dhs-replay closed-loop run on a fresh node over the same trace slice, budget and
model. With --repeat R every mode is run R times, the modes interleaved (repeat 1: resident, hisparse, adaptive;
repeat 2: hisparse, adaptive, resident; ...), so that drift in the machine's load hits them alike; a ratio to resident
is taken within one repeat (same load) and the median over repeats is printed with its range.

Also printed per point (medians): sessions admitted (memd's peak), host share of the census (selected rows recovered
from host), allocation wait as a share of TTFT, reclaims. Expected shape: adaptive within a few percent of resident
while every resident history fits, ahead of resident once it no longer does (more sessions admitted), and ahead of
hisparse where a host recovery costs more than a direct read (over PCIe; on this CPU both are memcpy's).

The default model preset is bench-wide: the weights (109 MiB) exceed the CPU's caches, so one decode step streams
them once for the whole batch, as a GPU decode does; more admitted sessions then mean more tokens per step.

Usage: tools/bench_modes.py [--replay build/tools/replay/dhs-replay] [--requests 8] [--length-scale 0.1]
                            [--concurrency 1,4,8] [--hbm-budget 9000000] [--repeat 3] [--preset bench-wide]
                            [--trace FILE] [--link-model off|pcie5] [--json OUT]

`measure()` is the benchmark as a function (tools/perf_report.py calls it); its result is what --json writes.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from bench_common import figures, run_replay
from dhs_vocabulary import MODEL_PRESETS, WORKER_MODES

MODES = WORKER_MODES  # resident, hisparse, adaptive (workerd owns them: tools/dhs_vocabulary.py)


def run(args, mode, rep, tmp):
    """One sweep of `mode` over the concurrencies: {concurrency: figures}."""
    options = ["--mode", mode, "--requests", str(args.requests), "--length-scale", str(args.length_scale),
               "--sweep", args.concurrency, "--preset", args.preset]
    if args.hbm_budget:
        options += ["--hbm-budget", str(args.hbm_budget)]
    if args.trace:
        options += ["--trace", args.trace]
    if args.link_model and args.link_model != "off":
        options += ["--link-model", args.link_model]
    report = run_replay(args.replay, options, os.path.join(tmp, f"{mode}-{rep}.json"),
                        f"bench_modes: {mode} run {rep + 1}", allow_unserved=True)
    return {p["settings"]["concurrency"]: dict(figures(p), budget=p["settings"].get("hbm_budget_bytes"),
                                               link_model=p["settings"].get("link_model"))
            for p in report}


def ratio(a, b):
    return a / b if a and b and a == a and b == b else float("nan")


def summary(values):
    """median, min, max of the finite values (NaN when none)."""
    v = [x for x in values if x == x]
    return (statistics.median(v), min(v), max(v)) if v else (float("nan"),) * 3


def measure(args, log=sys.stderr):
    """Runs every mode `args.repeat` times (interleaved) and returns the result --json writes: the settings and one
    point per (concurrency, mode) with medians, ratios to resident (median/min/max over repeats) and the runs.

    `args` has the attributes of the command line (replay, requests, length_scale, concurrency, hbm_budget, repeat,
    preset, trace, link_model). Raises SystemExit when a run fails other than by leaving requests unserved.
    """
    runs = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeat):
            order = MODES[rep % len(MODES):] + MODES[:rep % len(MODES)]
            for mode in order:
                runs[mode].append(run(args, mode, rep, tmp))
                print(f"bench_modes: {mode} run {rep + 1}/{args.repeat} done", file=log, flush=True)
    conc = sorted(runs["resident"][0].keys())
    first = runs["resident"][0][conc[0]]
    rows = []
    for c in conc:
        for mode in MODES:
            pts = [r[c] for r in runs[mode]]
            base = [r[c] for r in runs["resident"]]
            med = {k: summary([p[k] for p in pts])[0] for k in pts[0] if k not in ("budget", "link_model")}
            tps = summary([ratio(p["output_tokens_per_s"], b["output_tokens_per_s"]) for p, b in zip(pts, base)])
            tpot = summary([ratio(p["tpot_p50_ms"], b["tpot_p50_ms"]) for p, b in zip(pts, base)])
            rows.append({"concurrency": c, "mode": mode, "median": med,
                         "throughput_vs_resident": {"median": tps[0], "min": tps[1], "max": tps[2]},
                         "tpot_vs_resident": {"median": tpot[0], "min": tpot[1], "max": tpot[2]},
                         "runs": pts})
    return {"preset": args.preset, "requests": args.requests, "length_scale": args.length_scale,
            "trace": args.trace or None, "hbm_budget_bytes": first["budget"], "link_model": first["link_model"],
            "repeat": args.repeat, "points": rows}


def print_table(result):
    """The medians and ratio ranges of `measure()`'s result, one line per (concurrency, mode)."""
    print(f"bench_modes: preset {result['preset']}, {result['requests']} requests, length scale "
          f"{result['length_scale']}, GPU KV budget {result['hbm_budget_bytes']} bytes, link model "
          f"{(result['link_model'] or {}).get('model', 'off')}, {result['repeat']} run(s) per mode "
          f"(medians; ratio ranges over runs)")
    print(f"{'C':>3} {'mode':<9} {'served':>6} {'sessions':>8} {'tok/s':>7} {'TPOT p50':>9} {'host':>6} "
          f"{'alloc wait':>10} {'reclaims':>8} {'tok/s vs res':>20} {'TPOT vs res':>20}")
    for row in result["points"]:
        med, tps, tpot = row["median"], row["throughput_vs_resident"], row["tpot_vs_resident"]
        print(f"{row['concurrency']:>3} {row['mode']:<9} {med['served']:>6.0f} {med['sessions']:>8.0f} "
              f"{med['output_tokens_per_s']:>7.2f} {med['tpot_p50_ms']:>9.2f} {med['census_host']:>6.3f} "
              f"{med['allocation_wait_share']:>10.3f} {med['reclaims']:>8.0f} "
              f"{tps['median']:>8.3f} [{tps['min']:.2f},{tps['max']:.2f}] "
              f"{tpot['median']:>8.3f} [{tpot['min']:.2f},{tpot['max']:.2f}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", default="build/tools/replay/dhs-replay")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--length-scale", type=float, default=0.1)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--hbm-budget", default="9000000",
                    help="GPU KV budget, bytes; the default lets every resident history fit at C <= 4 but not at "
                         "C = 8 (8 requests of the bundled slice, bench-wide); '' = dhs-replay's default for the slice")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--preset", default="bench-wide", choices=MODEL_PRESETS,
                    help="model preset; bench-wide (default) streams 109 MiB of weights per step like a GPU decode, so "
                         "batching more sessions raises throughput; dsv4flash-like fits in cache and does not")
    ap.add_argument("--trace", default="", help="trace file (default: dhs-replay's bundled Mooncake slice)")
    ap.add_argument("--link-model", default="off", choices=("off", "pcie5"),
                    help="host-device link model of the CPU backend (docs/link_model.md)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    result = measure(args)
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
