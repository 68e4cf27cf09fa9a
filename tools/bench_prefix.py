#!/usr/bin/env python3
"""tools/bench_prefix.py: the seed's regime on this machine (issue 27): many sessions decoding over long prepared
prefixes, closed loop, the three KV modes under ONE GPU budget, at several concurrencies and two context lengths.

Each (context, concurrency, mode) point is one `dhs-replay --prefixes N --prefix-tokens L ...` run on a fresh node
(tools/replay/closed_loop.h): N prefixes of L tokens computed once each (the preparation, timed apart), then
`sessions_per_c * C` sessions (prefix + a distinct suffix + a fixed number of output tokens) in a closed loop at C,
with C request slots. The budget is one for every point: `resident_sessions` resident histories of the LONGEST
context (from `dhsctl plan`'s resident bytes per session), so resident stops fitting at about that many sessions at
the longest context and later at the shorter one. Per point: sessions admitted (memd's peak), output tokens/s, TPOT
p50/p99, allocation-wait share of TTFT, the census, reclaims, repopulated pages, host bytes recovered per output
token, and each as a ratio to resident at the same point (same run order: modes interleaved within a point).
Exactness: every run writes --outputs; a sample of sessions (every `sample_every`-th) is compared token for token
and logits digest for digest against resident's run of the same point.

The knee: per context, the lowest C at which resident admitted fewer than C sessions, against the planner's figure
for the same budget (`dhsctl plan --preset P --context L --hbm-bytes B --json`: resident sessions per GPU).

With --speculation (at the first context length; --spec-concurrency: only at those C): adaptive mode again with
speculation (synthetic proposer at corruption 0.1, block K = 4) under a
block schedule and under the online width, reporting N_spec / N_base (sessions) against TPOT_spec / TPOT_base per C
(brief §6: speculation pays where N_spec / N_base > TPOT_spec / TPOT_base).

Usage: tools/bench_prefix.py [--replay build/tools/replay/dhs-replay] [--dhsctl build/tools/dhsctl/dhsctl]
          [--preset bench-wide] [--prefixes 2] [--contexts 1024,4096] [--concurrency 1,4,8,16,32,64]
          [--sessions-per-c 2] [--suffix-tokens 16] [--output-tokens 16] [--resident-sessions 4] [--hbm-budget B]
          [--link-model pcie5] [--speculation] [--sample-every 2] [--json OUT] [--append]
`measure()` is the benchmark as a function (tools/perf_report.py calls it); its result is what --json writes. With
--append and an existing --json file, points already there are kept and not run again (a long sweep in pieces).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MODES = ("resident", "hisparse", "adaptive")
SPEC_CONFIGS = {  # name -> dhs-replay words (adaptive mode)
    "schedule": ["--speculate", "synthetic", "--spec-corruption", "0.1", "--block", "4", "--block-schedule",
                 "1:4,9:3,33:2"],
    "online": ["--speculate", "synthetic", "--spec-corruption", "0.1", "--block", "4", "--block-schedule", "online"],
}


def plan(dhsctl, preset, context, budget=None, slots=None):
    """`dhsctl plan --json` for `context` tokens (and a budget: sessions per GPU)."""
    name = preset if ":" in preset else f"workerd:{preset}"  # the worker's preset of that name (dhsctl plan --help)
    cmd = [dhsctl, "plan", "--preset", name, "--context", str(context), "--json"]
    if budget:
        cmd += ["--hbm-bytes", str(budget)]
    if slots:
        cmd += ["--slots", str(slots)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench_prefix: {' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def read_outputs(path):
    try:
        with open(path) as f:
            return {r["trace_index"]: r for r in map(json.loads, filter(None, f.read().splitlines()))}
    except OSError:
        return {}


def one_run(args, tmp, context, c, mode, budget, extra=(), tag=""):
    """One dhs-replay run; returns its figures (outputs in TMP/NAME.outputs, the worker's log in TMP/NAME.run)."""
    name = f"L{context}-C{c}-{mode}{tag}"
    out, outputs = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".outputs")
    run_dir = os.path.join(tmp, name + ".run")
    os.makedirs(run_dir, exist_ok=True)
    os.chmod(run_dir, 0o700)  # dhs-replay refuses a run directory open to group or others
    sessions = max(args.prefixes, args.sessions_per_c * c)
    cmd = [args.replay, "--mode", mode, "--preset", args.preset, "--prefixes", str(args.prefixes), "--prefix-tokens",
           str(context), "--suffix-tokens", str(args.suffix_tokens), "--session-output-tokens", str(args.output_tokens),
           "--sessions", str(sessions), "--concurrency", str(c), "--slots", str(max(c, 1)), "--hbm-budget", str(budget),
           "--idle-timeout-ms", "600000", "--json", out, "--outputs", outputs, "--run-dir", run_dir, *extra]
    if args.link_model != "off":
        cmd += ["--link-model", args.link_model]
    env = dict(os.environ, DHS_STEP_PROFILE="1")  # the worker's step-time split (workerd/model/step_profile.h)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode not in (0, 1) or not os.path.exists(out):
        sys.stderr.write(proc.stderr[-3000:])
        return {"error": f"{name}: dhs-replay exited {proc.returncode}"}
    with open(out) as f:
        r = json.load(f)
    fig = figures(r)
    fig["step_profile"] = step_profile(os.path.join(run_dir, "workerd.log"))
    return fig


def step_profile(log_path):
    """The worker's last cumulative `step profile: decode ...` line (workerd/model/step_profile.h: steps in which every
    request of the batch fed one token) as {field: number}; None when the log has none."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [l for l in f if l.startswith("step profile: decode ")]
    except OSError:
        return None
    if not lines:
        return None
    words = lines[-1].split()[3:]
    return {k: float(v) for k, v in zip(words[::2], words[1::2])}


def figures(r):
    """The figures of one report (NaN where not measured)."""
    nan = float("nan")
    census = r.get("census") or {}
    w = r.get("prefix_workload") or {}
    tokens = r.get("output_tokens") or 0
    return {
        "served": r["requests_served"], "total": r["requests_total"], "sessions": r["sessions_admitted_max"],
        "output_tokens": tokens, "output_tokens_per_s": r["output_tokens_per_s"],
        "tpot_p50_ms": (r.get("tpot_ms") or {}).get("p50", nan),
        "tpot_p99_ms": (r.get("tpot_ms") or {}).get("p99", nan),
        "ttft_p50_ms": (r.get("ttft_ms") or {}).get("p50", nan),
        "allocation_wait_share": r["allocation_wait_share"] if r.get("allocation_wait_share") is not None else nan,
        "census_direct": census.get("direct", nan), "census_hot": census.get("hot", nan),
        "census_host": census.get("host", nan), "reclaims": r["reclaims"], "repopulated_pages": r["repopulated_pages"],
        "host_bytes_per_token": (r.get("host_bytes_recovered", 0) / tokens) if tokens else nan,
        "preparation_s": w.get("preparation_s", nan), "in_flight_max": w.get("in_flight_max", nan),
        "in_flight_mean": w.get("in_flight_mean", nan), "elapsed_s": r["elapsed_s"],
        "prefix_blocks_computed": (r.get("prefix_blocks") or {}).get("computed"),
        "preparation_blocks_computed": w.get("preparation_blocks_computed"),
        "speculate": r.get("speculate", "off"), "acceptance_length_mean": r.get("acceptance_length_mean"),
    }


def exact_sample(outputs, reference, every):
    """(sessions compared, sessions that differ) over every `every`-th session row present in the reference."""
    rows = sorted(reference)[::max(1, every)]
    bad = [i for i in rows if i not in outputs or not outputs[i]["served"] or
           outputs[i]["tokens"] != reference[i]["tokens"] or
           outputs[i]["logits_digests"] != reference[i]["logits_digests"] or not reference[i]["tokens"]]
    return len(rows), len(bad)


def check_exact(point, work, every):
    """Sets point["exact_sample"] from the runs' --outputs in `work` (this point's against resident's, same context
    and C); leaves it as it is when either file is missing."""
    def path(mode):
        base, _, spec = mode.partition("+")
        return os.path.join(work, f"L{point['context']}-C{point['concurrency']}-{base}{'-' + spec if spec else ''}"
                                  ".outputs")
    if not (os.path.exists(path(point["mode"])) and os.path.exists(path("resident"))):
        return
    n, bad = exact_sample(read_outputs(path(point["mode"])), read_outputs(path("resident")), every)
    point["exact_sample"] = {"compared": n, "differ": bad}


RATIO_KEYS = ("sessions", "output_tokens_per_s", "tpot_p50_ms", "tpot_p99_ms", "allocation_wait_share",
              "census_host", "reclaims", "repopulated_pages", "host_bytes_per_token")


def ratio(a, b):
    try:
        return a / b if a == a and b == b and b else float("nan")
    except TypeError:
        return float("nan")


def measure(args, log=sys.stderr, saved=None):
    """Runs every (context, C, mode) point (and the speculation points) and returns the result --json writes."""
    contexts = [int(x) for x in str(args.contexts).split(",") if x]
    conc = [int(x) for x in str(args.concurrency).split(",") if x]
    longest = max(contexts) + args.suffix_tokens + args.output_tokens
    resident_bytes = plan(args.dhsctl, args.preset, longest)["resident_bytes_per_session"]
    budget = int(args.hbm_budget) if args.hbm_budget else int(args.resident_sessions * resident_bytes)
    result = dict(saved or {})
    result.update({"preset": args.preset, "prefixes": args.prefixes, "contexts": contexts, "concurrency": conc,
                   "sessions_per_c": args.sessions_per_c, "suffix_tokens": args.suffix_tokens,
                   "output_tokens": args.output_tokens, "hbm_budget_bytes": budget,
                   "resident_sessions_sized": args.resident_sessions, "link_model": args.link_model,
                   "sample_every": args.sample_every})
    points = {(p["context"], p["concurrency"], p["mode"]): p for p in result.get("points", [])}
    # Outputs of every run stay beside --json (so a later --append compares against resident's saved outputs).
    keep = args.json and getattr(args, "append", False)
    tmp_dir = None if keep else tempfile.TemporaryDirectory()
    work = (getattr(args, "work_dir", "") or args.json + ".runs") if keep else tmp_dir.name
    os.makedirs(work, exist_ok=True)
    try:
        for context in contexts:
            for c in conc:
                configs = [(m, m, ()) for m in MODES]
                spec_c = [int(x) for x in str(getattr(args, "spec_concurrency", "") or "").split(",") if x]
                if args.speculation and context == contexts[0] and (not spec_c or c in spec_c):
                    configs += [(f"adaptive+{n}", "adaptive", tuple(w)) for n, w in SPEC_CONFIGS.items()]
                for name, mode, extra in configs:
                    if (context, c, name) in points and "error" not in points[(context, c, name)]["run"]:
                        continue  # measured by an earlier piece of the sweep (--append)
                    fig = one_run(args, work, context, c, mode, budget, extra,
                                  "" if name == mode else "-" + name.split("+")[1])
                    points[(context, c, name)] = {"context": context, "concurrency": c, "mode": name, "run": fig}
                    print(f"bench_prefix: L={context} C={c} {name}: "
                          f"{fig.get('output_tokens_per_s', float('nan')):.2f} tok/s, sessions {fig.get('sessions')}",
                          file=log, flush=True)
                    check_exact(points[(context, c, name)], work, args.sample_every)
                    result["points"] = list(points.values())
                    if args.json:  # a long sweep keeps what it measured
                        save(result, args.json)
        for p in points.values():  # again at the end: a resident run measured after its point (a later piece)
            check_exact(p, work, args.sample_every)
    finally:
        if tmp_dir:
            tmp_dir.cleanup()
    result["points"] = sorted(points.values(), key=lambda p: (p["context"], p["concurrency"], p["mode"]))
    result["planner"] = {str(L): plan(args.dhsctl, args.preset, L + args.suffix_tokens + args.output_tokens, budget,
                                      max(conc)) for L in contexts}
    analyse(result)
    return result


def analyse(result):
    """Adds ratios to resident (and speculation ratios to plain adaptive) to every point, and the knee per context."""
    by = {(p["context"], p["concurrency"], p["mode"]): p for p in result["points"]}
    for p in result["points"]:
        base = by.get((p["context"], p["concurrency"], "resident"))
        if base and "error" not in p["run"] and "error" not in base["run"]:
            p["vs_resident"] = {k: ratio(p["run"].get(k), base["run"].get(k)) for k in RATIO_KEYS}
        plain = by.get((p["context"], p["concurrency"], "adaptive"))
        if p["mode"].startswith("adaptive+") and plain and "error" not in p["run"] and "error" not in plain["run"]:
            p["vs_adaptive"] = {"n_ratio": ratio(p["run"]["sessions"], plain["run"]["sessions"]),
                                "tpot_ratio": ratio(p["run"]["tpot_p50_ms"], plain["run"]["tpot_p50_ms"]),
                                "tps_ratio": ratio(p["run"]["output_tokens_per_s"],
                                                   plain["run"]["output_tokens_per_s"])}
            v = p["vs_adaptive"]
            v["pays"] = v["n_ratio"] > v["tpot_ratio"] if v["n_ratio"] == v["n_ratio"] else None
    knees = {}
    for L in result["contexts"]:
        res = sorted((p["concurrency"], p["run"].get("sessions", 0)) for p in result["points"]
                     if p["context"] == L and p["mode"] == "resident" and "error" not in p["run"])
        knee = next((c for c, s in res if s < c), None)
        planner = (result.get("planner") or {}).get(str(L)) or {}
        sessions = planner.get("sessions_per_gpu") or {}
        knees[str(L)] = {"measured_knee": knee,
                         "resident_max_sessions": max((s for _, s in res), default=None),
                         "planner": {"resident_sessions": sessions.get("resident"),
                                     "hierarchical_sessions": sessions.get("hierarchical"),
                                     "resident_bytes_per_session": planner.get("resident_bytes_per_session"),
                                     "hierarchical_bytes_per_session": planner.get("hierarchical_bytes_per_session")}}
    result["knees"] = knees
    return result


def save(result, path):
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def fmt(x, nd=2):
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and x == x else "n/a"


def print_table(result):
    print(f"bench_prefix: preset {result['preset']}, {result['prefixes']} prefixes, contexts {result['contexts']}, "
          f"budget {result['hbm_budget_bytes']} bytes, link model {result['link_model']}")
    print(f"{'L':>6} {'C':>3} {'mode':<18} {'served':>7} {'sess':>4} {'tok/s':>7} {'p50':>7} {'p99':>7} {'host':>6} "
          f"{'wait':>6} {'recl':>5} {'repop':>5} {'B/tok':>8} {'tok/s x':>7} {'sess x':>6} {'exact':>6}")
    for p in result["points"]:
        r, v = p["run"], p.get("vs_resident", {})
        if "error" in r:
            print(f"{p['context']:>6} {p['concurrency']:>3} {p['mode']:<18} FAILED {r['error']}")
            continue
        e = p.get("exact_sample", {})
        print(f"{p['context']:>6} {p['concurrency']:>3} {p['mode']:<18} {r['served']:>3}/{r['total']:<3} "
              f"{r['sessions']:>4} {fmt(r['output_tokens_per_s']):>7} {fmt(r['tpot_p50_ms']):>7} "
              f"{fmt(r['tpot_p99_ms']):>7} {fmt(r['census_host'], 3):>6} {fmt(r['allocation_wait_share'], 3):>6} "
              f"{r['reclaims']:>5} {r['repopulated_pages']:>5} {fmt(r['host_bytes_per_token'], 0):>8} "
              f"{fmt(v.get('output_tokens_per_s'), 3):>7} {fmt(v.get('sessions')):>6} "
              f"{e.get('compared', 0) - e.get('differ', 0)}/{e.get('compared', 0):<4}")
    for L, k in result.get("knees", {}).items():
        print(f"knee at L={L}: measured {k['measured_knee']}, planner {k['planner']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", default="build/tools/replay/dhs-replay")
    ap.add_argument("--dhsctl", default="build/tools/dhsctl/dhsctl")
    ap.add_argument("--preset", default="bench-wide")
    ap.add_argument("--prefixes", type=int, default=2)
    ap.add_argument("--contexts", default="1024,4096", help="prefix lengths L, tokens (comma-separated)")
    ap.add_argument("--concurrency", default="1,4,8,16,32,64")
    ap.add_argument("--sessions-per-c", type=int, default=2, help="sessions per run = max(prefixes, this x C)")
    ap.add_argument("--suffix-tokens", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--resident-sessions", type=float, default=4,
                    help="size the budget so resident holds this many histories of the longest context")
    ap.add_argument("--hbm-budget", default="", help="GPU KV budget, bytes (overrides --resident-sessions)")
    ap.add_argument("--link-model", default="pcie5", choices=("off", "pcie5"))
    ap.add_argument("--speculation", action="store_true",
                    help="also adaptive with speculation (schedule, online), at the first context length")
    ap.add_argument("--spec-concurrency", default="", help="with --speculation: only at these C (default every C)")
    ap.add_argument("--sample-every", type=int, default=2, help="exactness: every N-th session against resident")
    ap.add_argument("--json", default="")
    ap.add_argument("--append", action="store_true", help="keep the points of an existing --json; run the others")
    ap.add_argument("--work-dir", default="", help="with --append: the runs' outputs and logs (default JSON.runs)")
    args = ap.parse_args()
    saved = None
    if args.append and args.json and os.path.exists(args.json):
        with open(args.json) as f:
            saved = json.load(f)
    result = measure(args, saved=saved)
    if args.json:
        save(result, args.json)
    print_table(result)
    bad = sum(p.get("exact_sample", {}).get("differ", 0) for p in result["points"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
