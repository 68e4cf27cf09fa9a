#!/usr/bin/env python3
"""tools/bench_reclaim_policy.py: compares memd's reclaim-order policies (oldest-first, newest-first, largest-first;
brief §4, issue 3) on the same trace replay in adaptive mode, so that the default is chosen by measurement.

Each (policy, repeat) is one dhs-replay run on a fresh node over the same slice, budget and schedule. Printed per
policy (mean over repeats): reclaims (victim requests), repopulated pages, host share of the census (rows the victims
later had to recover from host), allocation wait as a share of TTFT, TTFT p50/p99, TPOT p50 and output tokens/s.
Counts are what the policy changes directly; times are noisy on a shared machine, so compare them within one run.

Usage: tools/bench_reclaim_policy.py [--replay build/tools/replay/dhs-replay] [--requests 50] [--length-scale 0.1]
                                     [--concurrency 8] [--repeat 2] [--hbm-budget BYTES] [--json OUT]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from bench_common import figures, run_replay
from dhs_vocabulary import RECLAIM_POLICIES

POLICIES = RECLAIM_POLICIES  # memd owns them (tools/dhs_vocabulary.py)


def run(args, policy, rep, tmp):
    options = ["--mode", "adaptive", "--reclaim-policy", policy, "--requests", str(args.requests),
               "--length-scale", str(args.length_scale), "--concurrency", str(args.concurrency)]
    if args.hbm_budget:
        options += ["--hbm-budget", args.hbm_budget]
    return run_replay(args.replay, options, os.path.join(tmp, f"{policy}-{rep}.json"),
                      f"bench_reclaim_policy: {policy} run {rep}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", default="build/tools/replay/dhs-replay")
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--length-scale", type=float, default=0.1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--hbm-budget", default="")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    runs = {p: [] for p in POLICIES}
    with tempfile.TemporaryDirectory() as tmp:
        # Interleave policies across repeats so that drift in machine load hits all of them alike.
        for rep in range(args.repeat):
            for p in POLICIES:
                runs[p].append(figures(run(args, p, rep, tmp)))
                print(f"bench_reclaim_policy: {p} run {rep + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    keys = list(runs[POLICIES[0]][0].keys())
    mean = {p: {k: statistics.fmean(x[k] for x in runs[p]) for k in keys} for p in POLICIES}
    print(f"bench_reclaim_policy: adaptive, {args.requests} requests, length scale {args.length_scale}, "
          f"concurrency {args.concurrency}, {args.repeat} run(s) per policy (means)")
    print(f"{'policy':<14} {'served':>6} {'reclaims':>8} {'repop pages':>11} {'host share':>10} {'alloc wait':>10} "
          f"{'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} {'tok/s':>7}")
    for p in POLICIES:
        m = mean[p]
        print(f"{p:<14} {m['served']:>6.1f} {m['reclaims']:>8.1f} {m['repopulated_pages']:>11.1f} "
              f"{m['census_host']:>10.3f} {m['allocation_wait_share']:>10.3f} {m['ttft_p50_ms']:>9.1f} "
              f"{m['ttft_p99_ms']:>9.1f} {m['tpot_p50_ms']:>9.2f} {m['output_tokens_per_s']:>7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": vars(args), "runs": runs, "means": mean}, f, indent=2)


if __name__ == "__main__":
    main()
