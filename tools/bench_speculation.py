#!/usr/bin/env python3
"""tools/bench_speculation.py: speculative decoding against plain decoding at several concurrencies under ONE GPU memory
budget, in one run (issue 13's benchmark; brief §6 "When speculation pays").

Each (configuration, concurrency) point is one dhs-replay closed-loop run on a fresh node (adaptive mode by default)
over the same trace slice, budget and model. Configurations (interleaved per repeat, so that drift in the machine's
load hits them alike; ratios to `off` are taken within one repeat):
- `off`: plain decoding (the baseline: N_base sessions admitted, TPOT_base);
- `fixed`: the built-in drafter (dhs-gen-weights --drafter, generated and optionally distilled here) proposing K - 1
  tokens per round; its ring and the staging arenas are required GPU memory declared to memd, so fewer sessions may be
  admitted under the budget (N_spec);
- `synthetic-C` (BENCHMARKS ONLY): the target's own greedy continuation corrupted with probability C, so that acceptance
  can be swept. Its proposer runs the target itself (K - 1 target steps per round, on the CPU); that time is NOT a
  drafter's cost, so its tokens/s is also given with the proposer's time taken out (`tok/s w/o proposer`).

Printed per point (medians over repeats): sessions admitted (memd's peak), acceptance length (accepted proposals + 1
per round), TPOT p50, output tokens/s, and against `off`: N_spec / N_base, TPOT_spec / TPOT_base, and the throughput
ratio. Speculation pays where throughput rises, i.e. where N_spec / N_base > TPOT_spec / TPOT_base (brief §6).

Usage: tools/bench_speculation.py [--replay build/tools/replay/dhs-replay]
         [--gen-weights build/tools/gen_weights/dhs-gen-weights] [--mode adaptive] [--preset bench-wide]
         [--requests 8] [--length-scale 0.1] [--concurrency 1,4,8] [--hbm-budget 9000000] [--repeat 2] [--block 4]
         [--configs off,fixed,synthetic-0.1,synthetic-0.5] [--distill-texts 0] [--link-model pcie5] [--json OUT]
Exit status: 0 printed; 2 bad command line; SystemExit naming the run that failed otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import figures, run_replay  # noqa: E402
from bench_modes import ratio, summary  # noqa: E402
from dhs_vocabulary import MODEL_PRESETS, WORKER_MODES  # noqa: E402


def spec_figures(p):
    """figures() plus the speculation fields of one report point."""
    f = figures(p)
    nan = float("nan")
    f["acceptance_length"] = p.get("acceptance_length_mean") if p.get("acceptance_length_mean") is not None else nan
    f["rounds"] = p.get("rounds", 0)
    f["proposer_s"] = p.get("proposer_s", 0.0) or 0.0
    f["draft_ring_bytes"] = p.get("draft_ring_bytes", 0) or 0
    f["staging_bytes"] = p.get("staging_bytes", 0) or 0
    f["output_tokens"] = p.get("output_tokens", 0) or 0
    tps = f["output_tokens_per_s"]
    # Tokens/s with the proposer's time taken out (only meaningful for the synthetic proposer, which runs the target).
    wall = f["output_tokens"] / tps if tps else nan
    f["tokens_per_s_wo_proposer"] = (f["output_tokens"] / (wall - f["proposer_s"])
                                     if tps and wall > f["proposer_s"] else nan)
    return f


def config_options(name, args, drafter):
    if name == "off":
        return ["--speculate", "off"]
    if name == "fixed":
        return ["--speculate", "fixed", "--block", str(args.block), "--drafter-weights", drafter]
    if name.startswith("synthetic-"):
        return ["--speculate", "synthetic", "--block", str(args.block), "--spec-corruption", name.split("-", 1)[1]]
    raise SystemExit(f"bench_speculation: unknown configuration {name!r}")


def run(args, name, rep, tmp, drafter):
    options = ["--mode", args.mode, "--requests", str(args.requests), "--length-scale", str(args.length_scale),
               "--sweep", args.concurrency, "--preset", args.preset, *config_options(name, args, drafter)]
    if args.hbm_budget:
        options += ["--hbm-budget", str(args.hbm_budget)]
    if args.link_model != "off":
        options += ["--link-model", args.link_model]
    report = run_replay(args.replay, options, os.path.join(tmp, f"{name}-{rep}.json"),
                        f"bench_speculation: {name} run {rep + 1}", allow_unserved=True)
    return {p["settings"]["concurrency"]: dict(spec_figures(p), budget=p["settings"].get("hbm_budget_bytes"))
            for p in report}


def make_drafter(args, tmp):
    path = os.path.join(tmp, "drafter.safetensors")
    cmd = [args.gen_weights, "--drafter", "--preset", args.preset, "--seed", "7", "--out", path,
           "--k-max", str(max(args.block, 2))]
    if args.distill_texts:
        cmd += ["--distill-texts", str(args.distill_texts), "--target-seed", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-2000:])
        raise SystemExit(f"bench_speculation: {' '.join(cmd)} failed (exit {proc.returncode})")
    return path


def measure(args, log=sys.stderr):
    """Every configuration `args.repeat` times (interleaved); the result --json writes."""
    configs = [c for c in args.configs.split(",") if c]
    if "off" not in configs:
        raise SystemExit("bench_speculation: --configs must include off (the baseline)")
    runs = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as tmp:
        drafter = make_drafter(args, tmp) if "fixed" in configs else ""
        for rep in range(args.repeat):
            order = configs[rep % len(configs):] + configs[:rep % len(configs)]
            for name in order:
                runs[name].append(run(args, name, rep, tmp, drafter))
                print(f"bench_speculation: {name} run {rep + 1}/{args.repeat} done", file=log, flush=True)
    conc = sorted(runs["off"][0].keys())
    rows = []
    for c in conc:
        for name in configs:
            pts, base = [r[c] for r in runs[name]], [r[c] for r in runs["off"]]
            med = {k: summary([p[k] for p in pts])[0] for k in pts[0] if k != "budget"}

            def rel(key):
                s = summary([ratio(p[key], b[key]) for p, b in zip(pts, base)])
                return {"median": s[0], "min": s[1], "max": s[2]}
            rows.append({"concurrency": c, "config": name, "median": med, "sessions_vs_off": rel("sessions"),
                         "tpot_vs_off": rel("tpot_p50_ms"), "throughput_vs_off": rel("output_tokens_per_s"),
                         "runs": pts})
    return {"mode": args.mode, "preset": args.preset, "requests": args.requests, "length_scale": args.length_scale,
            "hbm_budget_bytes": runs["off"][0][conc[0]]["budget"], "block": args.block,
            "link_model": args.link_model, "distill_texts": args.distill_texts, "repeat": args.repeat,
            "points": rows}


def row_ratios(row):
    """(N_spec/N_base, TPOT_spec/TPOT_base, tok/s vs off, pays) of one point; pays is '' for off (brief §6)."""
    n, t, x = row["sessions_vs_off"]["median"], row["tpot_vs_off"]["median"], row["throughput_vs_off"]["median"]
    return n, t, x, "" if row["config"] == "off" else ("yes" if n > t else "no")


def print_table(result):
    print(f"bench_speculation: {result['mode']} mode, preset {result['preset']}, {result['requests']} requests, "
          f"length scale {result['length_scale']}, GPU KV budget {result['hbm_budget_bytes']} bytes, block "
          f"K = {result['block']}, link model {result['link_model']}, {result['repeat']} run(s) per configuration "
          f"(medians; ratios to off within a repeat)")
    print(f"{'C':>3} {'config':<15} {'sessions':>8} {'acc.len':>7} {'TPOT p50':>9} {'tok/s':>7} "
          f"{'w/o prop.':>9} {'N/N_base':>8} {'TPOT/base':>9} {'tok/s/base':>10} pays")
    for row in result["points"]:
        m = row["median"]
        n, t, x, pays = row_ratios(row)
        print(f"{row['concurrency']:>3} {row['config']:<15} {m['sessions']:>8.0f} {m['acceptance_length']:>7.2f} "
              f"{m['tpot_p50_ms']:>9.2f} {m['output_tokens_per_s']:>7.2f} {m['tokens_per_s_wo_proposer']:>9.2f} "
              f"{n:>8.3f} {t:>9.3f} {x:>10.3f} {pays}")


def markdown_table(result):
    """The table of print_table as Markdown rows (tools/perf_report.py's speculation section)."""
    lines = ["| C | config | sessions | acceptance length | TPOT p50 ms | tok/s | tok/s w/o proposer | N_spec/N_base | "
             "TPOT_spec/TPOT_base | tok/s vs off | pays |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["points"]:
        m = row["median"]
        n, t, x, pays = row_ratios(row)
        acc = "-" if row["config"] == "off" else f"{m['acceptance_length']:.2f}"
        lines.append(f"| {row['concurrency']} | {row['config']} | {m['sessions']:.0f} | {acc} | {m['tpot_p50_ms']:.2f} | "
                     f"{m['output_tokens_per_s']:.2f} | {m['tokens_per_s_wo_proposer']:.2f} | {n:.3f} | {t:.3f} | "
                     f"{x:.3f} | {pays} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", default="build/tools/replay/dhs-replay")
    ap.add_argument("--gen-weights", default="build/tools/gen_weights/dhs-gen-weights")
    ap.add_argument("--mode", default="adaptive", choices=WORKER_MODES)
    ap.add_argument("--preset", default="bench-wide", choices=MODEL_PRESETS)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--length-scale", type=float, default=0.1)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--hbm-budget", default="9000000", help="GPU KV budget, bytes ('' = dhs-replay's default)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--block", type=int, default=4,
                    help="K: target queries per round, anchor included, in [2, 64] (workerd's --block is [1, 64])")
    ap.add_argument("--configs", default="off,fixed,synthetic-0.1,synthetic-0.5")
    ap.add_argument("--distill-texts", type=int, default=0,
                    help="fit the drafter's output layers on this many target texts first (slow for bench-wide)")
    ap.add_argument("--link-model", default="pcie5", choices=("off", "pcie5"))
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.repeat < 1 or not 2 <= args.block <= 64:
        ap.error("--repeat must be >= 1 and --block in [2, 64]")
    result = measure(args)
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
