#!/usr/bin/env python3
"""tools/bench_prefix.py: the seed's regime on this machine (issue 27): many sessions decoding over long prepared
prefixes, closed loop, the three KV modes under ONE GPU budget, at several concurrencies and two context lengths.

Each (context, mode) is one `dhs-replay --prefixes N --prefix-tokens L --sweep C1,C2,... --slots max(C)` run on ONE
node (tools/replay/closed_loop.h, PrefixSweepSharesNode): N prefixes of L tokens are computed once, at the first C
(the preparation, timed apart); at every later C the preparation imports them from the worker's row cache (seconds),
so a long context is prepared once per mode instead of once per point. Each point: `sessions_per_c * C` sessions
(prefix + a distinct suffix + a fixed number of output tokens) in a closed loop at C, on a node of max(C) request
slots; its measured window holds its own sessions only (counters subtracted, the step profile split at the window's
bounds). The budget is one for every point: `resident_sessions` resident histories of the LONGEST context (from
`dhsctl plan`'s resident bytes per session), so resident stops fitting at about that many sessions at the longest
context and later at the shorter one. Per point: sessions admitted (memd's peak), output tokens/s, TPOT p50/p99,
allocation-wait share of TTFT, the census, reclaims, repopulated pages, host bytes recovered per output token, and
each as a ratio to resident at the same point (the three modes' sweeps run one after another per context).
Exactness: every point writes --outputs (OUT.c<C>); a sample of sessions (every `sample_every`-th) is compared token
for token and logits digest for digest against resident's run of the same point.

The knee: per context, the lowest C at which resident admitted fewer than C sessions, against the planner's figure
for the same budget (`dhsctl plan --preset P --context L --hbm-bytes B --json`: resident sessions per GPU).

With --speculation (at --spec-context, default the first context length, with --spec-output-tokens and its own
budget --spec-hbm-budget / --spec-resident-sessions, default the main budget; --spec-concurrency: only at those C):
resident and plain adaptive at those settings ("resident+base", "adaptive+base"), then adaptive with speculation
(synthetic proposer at corruption 0.1, block K = 4) under a block schedule and under the online width, reporting
N_spec / N_base (sessions) against TPOT_spec / TPOT_base per C (brief §6: speculation pays where
N_spec / N_base > TPOT_spec / TPOT_base). adaptive+base and every speculative point are checked exact against
resident+base (`exact_sample`), a speculative point also against adaptive+base (`exact_vs_adaptive`).

Usage: tools/bench_prefix.py [--replay build/tools/replay/dhs-replay] [--dhsctl build/tools/dhsctl/dhsctl]
          [--preset bench-wide] [--prefixes 2] [--contexts 1024,4096] [--concurrency 1,4,8,16,32,64]
          [--sessions-per-c 2] [--suffix-tokens 16] [--output-tokens 16] [--resident-sessions 4] [--hbm-budget B]
          [--link-model pcie5] [--speculation] [--spec-context L] [--spec-output-tokens N]
          [--spec-resident-sessions R | --spec-hbm-budget B] [--sample-every 2] [--repeats 1] [--json OUT] [--append]
--repeats R runs every sweep R times, round after round (the modes one after another within a round): a point's
ratios to resident are taken within its round, then summarised as the median over rounds with [min, max]; the
other figures are the median round's (--json keeps every round's points in "rounds", the summary in "points").
`measure()` is the benchmark as a function (tools/perf_report.py calls it); its result is what --json writes. With
--append and an existing --json file of the same settings, the sweeps already there without a failed point are kept
and not run again (a long measurement in pieces).
Failures: a sweep that fails part-way keeps the points it finished (reported with their figures); its other points,
and any point where a session was not served, are marked FAILED (with the sweep's run directory, which is kept and
named, not deleted), dhs-replay's stderr is shown, and the command exits 1 naming each. `exact` is `ref` for the
reference (resident) and `n/a` where no session was compared, which also exits 1 (NOT CHECKED). Bad arguments are
argparse errors (exit 2). Ctrl-C stops the running dhs-replay (it stops its node, so memd drops its pool) before
anything is deleted; exit 130.
"""
import argparse
import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dhs_vocabulary import MODEL_PRESETS, WORKER_MODES  # noqa: E402

MODES = WORKER_MODES  # resident, hisparse, adaptive (workerd owns them: tools/dhs_vocabulary.py)
SPEC_CONFIGS = {  # name -> dhs-replay words (adaptive mode)
    "schedule": ["--speculate", "synthetic", "--spec-corruption", "0.1", "--block", "4", "--block-schedule",
                 "1:4,9:3,33:2"],
    "online": ["--speculate", "synthetic", "--spec-corruption", "0.1", "--block", "4", "--block-schedule", "online"],
}

SPEC_BASE = "adaptive+base"        # plain adaptive at the speculation's settings: the base of N_spec / N_base
SPEC_RESIDENT = "resident+base"    # resident at the speculation's settings: the exactness reference of the above


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


def pool_segment(run_dir):
    """/dev/shm path of the host pool segment memd creates for `run_dir` (memd/pool_segment.h: "dhs-pool-" + the
    first 16 hex digits of the SHA-256 of the canonical run directory)."""
    digest = hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:16]
    return os.path.join("/dev/shm", "dhs-pool-" + digest)


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM when bench_prefix dies (prctl PR_SET_PDEATHSIG), as dhs-replay's own
    children do with it; best effort (no libc: nothing)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def run_child(cmd, env=None, run_dir=None, grace_s=60):
    """subprocess.run(cmd, capture_output=True, text=True) for dhs-replay, stopped cleanly on Ctrl-C. The child runs in
    its own session, so a terminal's Ctrl-C reaches bench_prefix only (not memd and workerd at once: memd stopped
    while its workers still held requests keeps its pool segment for a successor). On KeyboardInterrupt the child
    gets SIGINT (dhs-replay stops its node: workerd first, which ends its requests, then memd, which then drops its
    pool) and up to `grace_s` seconds before SIGKILL; a pool segment of `run_dir` still there afterwards (memd killed,
    or it kept the pool) is removed, since the run is abandoned and its directory goes next; then the
    KeyboardInterrupt goes on."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=_die_with_parent)
    try:
        out, err = proc.communicate()
    except KeyboardInterrupt:
        try:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=grace_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            proc.wait()
        if run_dir and os.path.exists(pool_segment(run_dir)):
            try:
                os.remove(pool_segment(run_dir))
            except OSError:
                pass
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def one_sweep(args, tmp, context, concs, mode, budget, extra=(), tag="", output_tokens=None):
    """One dhs-replay sweep on ONE node (tools/replay/closed_loop.h PrefixSweepSharesNode): the prefixes are computed
    at the first C and imported from the worker's row cache at the others. Returns {C: figures} (each point's outputs
    in TMP/NAME.outputs.c<C>, the worker's log in TMP/NAME.run/workerd.log, its step profile split per point by the
    point's measured window). The points dhs-replay finished keep their figures; a point with an "error" is a failed
    one: no report (the sweep stopped before it or at it), a partial report (`complete` false) or a session not served
    (served < total; its figures kept beside the error). A failed point names the sweep's run directory (`run_dir`,
    kept by measure()); dhs-replay's stderr is shown whenever it exited non-zero."""
    name = f"L{context}-{mode}{tag}"
    out, outputs = os.path.join(tmp, name + ".json"), os.path.join(tmp, name + ".outputs")
    run_dir = os.path.join(tmp, name + ".run")
    os.makedirs(run_dir, exist_ok=True)
    os.chmod(run_dir, 0o700)  # dhs-replay refuses a run directory open to group or others
    if os.path.exists(out):
        os.remove(out)
    # Each point: max(N, sessions_per_c x C) sessions (--sessions-per-c); C slots at most (--slots max C).
    cmd = [args.replay, "--mode", mode, "--preset", args.preset, "--prefixes", str(args.prefixes), "--prefix-tokens",
           str(context), "--suffix-tokens", str(args.suffix_tokens), "--session-output-tokens",
           str(output_tokens or args.output_tokens),
           "--sessions-per-c", str(args.sessions_per_c), "--sweep", ",".join(map(str, concs)), "--slots",
           str(max(concs)), "--hbm-budget", str(budget),
           "--idle-timeout-ms", "600000", "--json", out, "--outputs", outputs, "--run-dir", run_dir, *extra]
    if args.link_model != "off":
        cmd += ["--link-model", args.link_model]
    env = dict(os.environ, DHS_STEP_PROFILE="1")  # the worker's step-time split (workerd/model/step_profile.h)
    proc = run_child(cmd, env=env, run_dir=run_dir)
    reports = []
    if os.path.exists(out):
        try:
            with open(out) as f:
                reports = json.load(f)
        except ValueError as e:
            sys.stderr.write(f"bench_prefix: {out}: {e}\n")
    if proc.returncode != 0 or not reports:
        sys.stderr.write(proc.stderr[-3000:])
    log_path = os.path.join(run_dir, "workerd.log")
    profile = read_step_profile(log_path)
    mixed, loop = read_step_profile(log_path, "mixed"), read_step_profile(log_path, "loop")
    figs = {}
    for r in reports:
        fig = figures(r)
        w = r.get("prefix_workload") or {}
        fig["step_profile"] = window_profile(profile, w.get("window_begin_ms"), w.get("window_end_ms"))
        # The admission's split (issue 27): the mixed steps (the suffixes' prefill) and the loop's prepared-prefix
        # imports and residency polls inside the window.
        fig["mixed_profile"] = window_profile(mixed, w.get("window_begin_ms"), w.get("window_end_ms"))
        fig["loop_profile"] = window_profile(loop, w.get("window_begin_ms"), w.get("window_end_ms"))
        c = int(r["settings"]["concurrency"])
        if r.get("complete") is False:
            fig["error"] = f"{name}: the run failed at C = {c} (dhs-replay exited {proc.returncode}; a partial report)"
        elif fig["served"] != fig["total"]:
            fig["error"] = f"{name}: C = {c}: {fig['served']} of {fig['total']} sessions served"
        figs[c] = fig
    for c in concs:
        figs.setdefault(c, {"error": f"{name}: dhs-replay exited {proc.returncode} before C = {c}"})
    for fig in figs.values():
        if "error" in fig:
            fig["run_dir"] = run_dir
    return figs


def read_step_profile(log_path, kind="decode"):
    """The worker's cumulative `step profile: KIND ... at_ms T` lines (workerd/model/step_profile.h; decode: steps in
    which every request of the batch fed one token; mixed: the other steps; loop: the worker's loop outside steps,
    prepared-prefix imports and residency polls) as a list of {field: number}, in log order."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [l for l in f if l.startswith(f"step profile: {kind} ")]
    except OSError:
        return []
    out = []
    for line in lines:
        words = line.split()[3:]
        try:
            out.append({k: float(v) for k, v in zip(words[::2], words[1::2])})
        except ValueError:
            continue
    return out


def window_profile(lines, begin_ms, end_ms):
    """The decode-step totals of the steps that ended inside [begin_ms, end_ms] (the cumulative line at the end minus
    the one before the window); None without lines or bounds."""
    if not lines or begin_ms is None or end_ms is None:
        return None
    before = [l for l in lines if l.get("at_ms", 0) < begin_ms]
    upto = [l for l in lines if l.get("at_ms", 0) <= end_ms]
    if not upto:
        return None
    a, b = (before[-1] if before else {}), upto[-1]
    return {k: v - a.get(k, 0.0) for k, v in b.items() if k != "at_ms"}


def step_profile(log_path):
    """The worker's last cumulative decode line as {field: number}; None when the log has none."""
    lines = read_step_profile(log_path)
    return lines[-1] if lines else None


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
        "proposer_s": r.get("proposer_s") or 0.0, "block_width": r.get("block_width") or {},
    }


def exact_sample(outputs, reference, every):
    """(sessions compared, sessions that differ) over every `every`-th session row present in the reference."""
    rows = sorted(reference)[::max(1, every)]
    bad = [i for i in rows if i not in outputs or not outputs[i]["served"] or
           outputs[i]["tokens"] != reference[i]["tokens"] or
           outputs[i]["logits_digests"] != reference[i]["logits_digests"] or not reference[i]["tokens"]]
    return len(rows), len(bad)


def round_tag(rnd):
    """The file-name tag of round `rnd` (0-based) of --repeats: none for the first, so one round names files as before."""
    return f".r{rnd}" if rnd else ""


def check_exact(point, work, every):
    """Sets point["exact_sample"] from the runs' --outputs in `work` (this point's against resident's, same context,
    C and round); leaves it as it is when either file is missing."""
    def path(mode):
        base, _, spec = mode.partition("+")
        return os.path.join(work, f"L{point['context']}-{base}{'-' + spec if spec else ''}"
                                  f"{round_tag(point.get('round', 0))}.outputs.c{point['concurrency']}")
    # A speculative point and its plain base ("adaptive+base") against resident at the speculation's own settings
    # ("resident+base": its context, output length, budget and sessions); a speculative point also against its plain
    # base (`exact_vs_adaptive`). The main sweep's points against resident of the same point.
    if is_reference(point["mode"]):  # resident is the reference: compared with itself it would count as exact
        point.pop("exact_sample", None)
        return
    ref = path(SPEC_RESIDENT if "+" in point["mode"] else "resident")
    if os.path.exists(path(point["mode"])) and os.path.exists(ref):
        n, bad = exact_sample(read_outputs(path(point["mode"])), read_outputs(ref), every)
        point["exact_sample"] = {"compared": n, "differ": bad}
    if "+" in point["mode"] and point["mode"] != SPEC_BASE and os.path.exists(path(point["mode"])) \
            and os.path.exists(path(SPEC_BASE)):
        n, bad = exact_sample(read_outputs(path(point["mode"])), read_outputs(path(SPEC_BASE)), every)
        point["exact_vs_adaptive"] = {"compared": n, "differ": bad}


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
    same = saved and all(saved.get(k) == v for k, v in (
        ("preset", args.preset), ("prefixes", args.prefixes), ("hbm_budget_bytes", budget),
        ("suffix_tokens", args.suffix_tokens), ("output_tokens", args.output_tokens),
        ("sessions_per_c", args.sessions_per_c), ("link_model", args.link_model), ("sample_every", args.sample_every)))
    result = dict(saved or {}) if same else {}  # saved points of other settings are measured again, not mixed in
    result.update({"preset": args.preset, "prefixes": args.prefixes, "contexts": contexts, "concurrency": conc,
                   "sessions_per_c": args.sessions_per_c, "suffix_tokens": args.suffix_tokens,
                   "output_tokens": args.output_tokens, "hbm_budget_bytes": budget,
                   "resident_sessions_sized": args.resident_sessions, "link_model": args.link_model,
                   "sample_every": args.sample_every})
    repeats = int(getattr(args, "repeats", 1))
    if repeats < 1:
        raise SystemExit(f"bench_prefix: --repeats must be at least 1 (got {repeats})")
    spec_ctx = int(getattr(args, "spec_context", 0) or contexts[0])
    spec_out = int(getattr(args, "spec_output_tokens", 0) or args.output_tokens)
    # Speculation's own budget (--spec-hbm-budget, or --spec-resident-sessions resident histories of the speculation's
    # context): a budget that binds at the speculation's context, so that N_spec / N_base measures its memory cost.
    spec_budget = budget
    if getattr(args, "spec_hbm_budget", ""):
        spec_budget = int(args.spec_hbm_budget)
    elif getattr(args, "spec_resident_sessions", 0):
        spec_budget = int(float(args.spec_resident_sessions) * plan(
            args.dhsctl, args.preset, spec_ctx + args.suffix_tokens + spec_out)["resident_bytes_per_session"])
    spec_same = same and saved.get("spec_context") == spec_ctx and saved.get("spec_output_tokens") == spec_out and \
        saved.get("spec_hbm_budget_bytes", budget) == spec_budget
    # Every round's points (a file of one round, written before --repeats, kept its rounds in "points"). Saved rounds
    # beyond --repeats are kept, never dropped: --repeats is the number of rounds to have at least.
    points = {(p["context"], p["concurrency"], p["mode"], p.get("round", 0)): dict(p, round=p.get("round", 0))
              for p in result.get("rounds", result.get("points", []))
              if ("+" not in p["mode"] and p["context"] in contexts) or
              (args.speculation and "+" in p["mode"] and spec_same)}
    result["repeats"] = repeats = max([repeats] + [p["round"] + 1 for p in points.values()])
    # Outputs of every run stay beside --json (so a later --append compares against resident's saved outputs).
    keep = args.json and getattr(args, "append", False)
    tmp_dir = None if keep else tempfile.mkdtemp(prefix="bench_prefix-")  # removed at the end unless a run failed
    work = (getattr(args, "work_dir", "") or args.json + ".runs") if keep else tmp_dir
    os.makedirs(work, exist_ok=True)
    spec_c = [int(x) for x in str(getattr(args, "spec_concurrency", "") or "").split(",") if x] or conc
    # Speculation at its own context and output length (the synthetic proposer starts a session from its prepared
    # prefix, copied from the worker's row cache, then catches up its own tokens 64 a round before it proposes: a
    # few output tokens leave few rounds to verify), against plain adaptive at the same settings ("adaptive+base"),
    # each checked exact against resident at those settings ("resident+base").
    result.update({"spec_context": spec_ctx, "spec_output_tokens": spec_out, "spec_hbm_budget_bytes": spec_budget})
    try:
        for rnd in range(repeats):  # a round: every sweep once, so a round's ratios compare runs minutes apart only
            for context in contexts + ([spec_ctx] if args.speculation and spec_ctx not in contexts else []):
                configs = [(m, m, (), conc, None, budget) for m in MODES] if context in contexts else []
                if args.speculation and context == spec_ctx:
                    configs += [(SPEC_RESIDENT, "resident", (), spec_c, spec_out, spec_budget),
                                (SPEC_BASE, "adaptive", (), spec_c, spec_out, spec_budget)]
                    configs += [(f"adaptive+{n}", "adaptive", tuple(w), spec_c, spec_out, spec_budget)
                                for n, w in SPEC_CONFIGS.items()]
                for name, mode, extra, cs, out_tokens, sweep_budget in configs:
                    todo = [c for c in cs if (context, c, name, rnd) not in points
                            or "error" in points[(context, c, name, rnd)]["run"]]
                    if not todo:
                        continue  # measured by an earlier piece of the sweep (--append)
                    # The whole sweep again (one node, prepared once): its points are measured together.
                    figs = one_sweep(args, work, context, cs, mode, sweep_budget, extra,
                                     ("" if name == mode else "-" + name.split("+")[1]) + round_tag(rnd), out_tokens)
                    for c in cs:
                        fig = figs[c]
                        points[(context, c, name, rnd)] = {"context": context, "concurrency": c, "mode": name,
                                                           "round": rnd, "run": fig}
                        print(f"bench_prefix: L={context} C={c} {name}"
                              f"{f' round {rnd + 1}/{repeats}' if repeats > 1 else ''}: "
                              f"{fig.get('output_tokens_per_s', float('nan')):.2f} tok/s, sessions {fig.get('sessions')}, "
                              f"prep {fig.get('preparation_s', float('nan')):.1f} s", file=log, flush=True)
                    for c in cs:
                        check_exact(points[(context, c, name, rnd)], work, args.sample_every)
                    result["rounds"] = list(points.values())
                    result.pop("points", None)
                    if args.json:  # a long sweep keeps what it measured
                        save(result, args.json)
        for p in points.values():  # again at the end: a resident run measured after its point (a later piece)
            check_exact(p, work, args.sample_every)
    finally:
        if tmp_dir:  # a failed run's directory (its logs, dhs-replay kept it) is kept for reading, and named
            failed = sorted({p["run"]["run_dir"] for p in points.values() if "run_dir" in p["run"]})
            if failed:
                print(f"bench_prefix: kept {tmp_dir}: the run directories of the failed sweeps: {', '.join(failed)}",
                      file=log, flush=True)
            else:
                shutil.rmtree(tmp_dir, ignore_errors=True)
    result["rounds"] = sorted(points.values(), key=lambda p: (p["context"], p["concurrency"], p["mode"], p["round"]))
    result["planner"] = {str(L): plan(args.dhsctl, args.preset, L + args.suffix_tokens + args.output_tokens, budget,
                                      max(conc)) for L in contexts}
    if args.speculation:  # the planner at the speculation's context and budget (without a drafter's share)
        result["spec_planner"] = plan(args.dhsctl, args.preset, spec_ctx + args.suffix_tokens + spec_out, spec_budget,
                                      max(spec_c))
    analyse(result)
    return result


def median(xs):
    """The median of the finite values of xs (NaN when there is none)."""
    xs = sorted(x for x in xs if isinstance(x, (int, float)) and x == x)
    if not xs:
        return float("nan")
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def span(xs):
    """[min, max] of the finite values of xs ([NaN, NaN] when there is none)."""
    xs = [x for x in xs if isinstance(x, (int, float)) and x == x]
    return [min(xs), max(xs)] if xs else [float("nan"), float("nan")]


def round_ratios(rounds):
    """Adds to every round's point its ratios to resident (and a speculative point's to plain adaptive) of the SAME
    round: runs minutes apart, not the rounds' other runs."""
    by = {(p["context"], p["concurrency"], p["mode"], p.get("round", 0)): p for p in rounds}
    for p in rounds:
        rnd = p.get("round", 0)
        base = by.get((p["context"], p["concurrency"], "resident", rnd))
        if base and "+" not in p["mode"] and "error" not in p["run"] and "error" not in base["run"]:
            p["vs_resident"] = {k: ratio(p["run"].get(k), base["run"].get(k)) for k in RATIO_KEYS}
        plain = by.get((p["context"], p["concurrency"], SPEC_BASE, rnd)) or \
            by.get((p["context"], p["concurrency"], "adaptive", rnd))
        if p["mode"].startswith("adaptive+") and p["mode"] != SPEC_BASE and plain and "error" not in p["run"] \
                and "error" not in plain["run"]:
            p["vs_adaptive"] = {"n_ratio": ratio(p["run"]["sessions"], plain["run"]["sessions"]),
                                "tpot_ratio": ratio(p["run"]["tpot_p50_ms"], plain["run"]["tpot_p50_ms"]),
                                "tps_ratio": ratio(p["run"]["output_tokens_per_s"],
                                                   plain["run"]["output_tokens_per_s"])}
            v = p["vs_adaptive"]
            # The synthetic proposer runs the target model to make its proposals (a stand-in for a drafter that
            # accepts): its time is in the window. Without it (the worker's loop is serial: the window less the
            # proposer's seconds), TPOT_spec scales by (elapsed - proposer) / elapsed.
            el, prop = p["run"].get("elapsed_s") or 0.0, p["run"].get("proposer_s") or 0.0
            v["tpot_ratio_ex_proposer"] = (v["tpot_ratio"] * (el - prop) / el) if el > prop >= 0 else float("nan")


def pays(v):
    """brief §6: speculation pays where N_spec / N_base > TPOT_spec / TPOT_base (None when unknown)."""
    v["pays"] = v["n_ratio"] > v["tpot_ratio"] if v["n_ratio"] == v["n_ratio"] else None
    t = v.get("tpot_ratio_ex_proposer", float("nan"))
    v["pays_ex_proposer"] = (v["n_ratio"] > t) if t == t and v["n_ratio"] == v["n_ratio"] else None
    return v


def summarize(rounds):
    """One point per (context, C, mode) over its rounds: ratios are the median of the rounds' own ratios, with
    [min, max] in `vs_resident_range`; `run` (every other figure) is the median round's (the round whose tokens/s ratio
    to resident, or tokens/s where there is none, is the median); `exact_sample` (and `exact_vs_adaptive`) sums the
    rounds'; `rounds` counts the
    rounds that ran without an error. One round gives that round's point unchanged."""
    groups = {}
    for p in rounds:
        groups.setdefault((p["context"], p["concurrency"], p["mode"]), []).append(p)
    points = []
    for key, group in sorted(groups.items()):
        ok = [p for p in group if "error" not in p["run"]]
        if not ok:
            points.append(dict(group[0], rounds=0))
            continue
        # The median round: by the ratio to resident where every round has one, else (resident itself, a failed
        # resident) by tokens/s; the lower middle of an even count.
        ratios = [(p.get("vs_resident") or {}).get("output_tokens_per_s") for p in ok]
        by_ratio = key[2] != "resident" and all(v is not None and v == v for v in ratios)

        def rank(p):
            v = p["vs_resident"]["output_tokens_per_s"] if by_ratio else p["run"].get("output_tokens_per_s")
            return v if v is not None and v == v else float("-inf")
        rep = sorted(ok, key=rank)[(len(ok) - 1) // 2]
        point = {"context": key[0], "concurrency": key[1], "mode": key[2], "round": rep.get("round", 0),
                 "run": rep["run"], "rounds": len(ok)}
        with_ratio = [p["vs_resident"] for p in ok if p.get("vs_resident")]
        if with_ratio:
            point["vs_resident"] = {k: median(v.get(k) for v in with_ratio) for k in RATIO_KEYS}
            point["vs_resident_range"] = {k: span([v.get(k) for v in with_ratio]) for k in RATIO_KEYS}
        spec = [p["vs_adaptive"] for p in ok if p.get("vs_adaptive")]
        if spec:
            point["vs_adaptive"] = pays({k: median(v.get(k) for v in spec)
                                         for k in ("n_ratio", "tpot_ratio", "tps_ratio", "tpot_ratio_ex_proposer")})
        for field in ("exact_sample", "exact_vs_adaptive"):
            exact = [p[field] for p in group if p.get(field)]
            if exact:
                point[field] = {"compared": sum(e["compared"] for e in exact),
                                "differ": sum(e["differ"] for e in exact)}
        points.append(point)
    return points


def analyse(result):
    """Adds ratios to resident (and speculation ratios to plain adaptive) to every round's point, the summary points
    over the rounds (`points`, see summarize) and the knee per context. A result without `rounds` (one round, written
    before --repeats) has its rounds in `points`."""
    rounds = result.get("rounds")
    if rounds is None:
        rounds = result["rounds"] = result.get("points", [])
    round_ratios(rounds)
    result["points"] = summarize(rounds)
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


def is_reference(mode):
    """Whether a point of `mode` is an exactness reference (resident, and resident at the speculation's settings)."""
    return mode in ("resident", SPEC_RESIDENT)


def exact_cell(point, field="exact_sample"):
    """The `exact` column: "ref" for a reference, "n/a" where no session was compared (not exact: unknown), else
    equal/compared."""
    if field == "exact_sample" and is_reference(point["mode"]):
        return "ref"
    e = point.get(field) or {}
    if not e.get("compared"):
        return "n/a"
    return f"{e['compared'] - e['differ']}/{e['compared']}"


def unchecked(points):
    """The points that were measured but not shown exact: no reference, and no session compared against one."""
    return [p for p in points if not is_reference(p["mode"]) and "error" not in p["run"]
            and not (p.get("exact_sample") or {}).get("compared")]


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
        print(f"{p['context']:>6} {p['concurrency']:>3} {p['mode']:<18} {r['served']:>3}/{r['total']:<3} "
              f"{r['sessions']:>4} {fmt(r['output_tokens_per_s']):>7} {fmt(r['tpot_p50_ms']):>7} "
              f"{fmt(r['tpot_p99_ms']):>7} {fmt(r['census_host'], 3):>6} {fmt(r['allocation_wait_share'], 3):>6} "
              f"{r['reclaims']:>5} {r['repopulated_pages']:>5} {fmt(r['host_bytes_per_token'], 0):>8} "
              f"{fmt(v.get('output_tokens_per_s'), 3):>7} {fmt(v.get('sessions')):>6} "
              f"{exact_cell(p):<6}")
    for L, k in result.get("knees", {}).items():
        print(f"knee at L={L}: measured {k['measured_knee']}, planner {k['planner']}")


def int_at_least(text, low):
    """An integer >= low from `text`, else argparse.ArgumentTypeError."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"{v} is not >= {low}")
    return v


def positive_int(text):
    """argparse type: an integer >= 1."""
    return int_at_least(text, 1)


def nonnegative_int(text):
    """argparse type: an integer >= 0 (0: the option's default)."""
    return int_at_least(text, 0)


def nonnegative_float(text):
    """argparse type: a finite number >= 0 (0: the option's default)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"{v} is not a finite number >= 0")
    return v


def positive_int_list(text):
    """argparse type: comma-separated integers >= 1 (at least one), kept as the text measure() splits."""
    words = [w for w in str(text).split(",") if w.strip()]
    if not words:
        raise argparse.ArgumentTypeError("no value given")
    for w in words:
        positive_int(w.strip())
    return ",".join(w.strip() for w in words)


def optional_positive_int_list(text):
    """argparse type: empty (the default) or as positive_int_list."""
    return positive_int_list(text) if str(text).strip() else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", default="build/tools/replay/dhs-replay")
    ap.add_argument("--dhsctl", default="build/tools/dhsctl/dhsctl")
    ap.add_argument("--preset", default="bench-wide", choices=MODEL_PRESETS)
    ap.add_argument("--prefixes", type=positive_int, default=2)
    ap.add_argument("--contexts", type=positive_int_list, default="1024,4096",
                    help="prefix lengths L, tokens (comma-separated)")
    ap.add_argument("--concurrency", type=positive_int_list, default="1,4,8,16,32,64")
    ap.add_argument("--sessions-per-c", type=positive_int, default=2,
                    help="sessions per run = max(prefixes, this x C)")
    ap.add_argument("--suffix-tokens", type=positive_int, default=16)
    ap.add_argument("--output-tokens", type=positive_int, default=16)
    ap.add_argument("--resident-sessions", type=float, default=4,
                    help="size the budget so resident holds this many histories of the longest context")
    ap.add_argument("--hbm-budget", default="", help="GPU KV budget, bytes (overrides --resident-sessions)")
    ap.add_argument("--link-model", default="pcie5", choices=("off", "pcie5"))
    ap.add_argument("--speculation", action="store_true",
                    help="also adaptive with speculation (schedule, online), at the first context length")
    ap.add_argument("--spec-concurrency", type=optional_positive_int_list, default="", help="with --speculation: only at these C (default every C)")
    ap.add_argument("--spec-context", type=nonnegative_int, default=0, help="with --speculation: its prefix length (default the "
                    "first context)")
    ap.add_argument("--spec-output-tokens", type=nonnegative_int, default=0, help="with --speculation: output tokens per session "
                    "(default --output-tokens)")
    ap.add_argument("--spec-resident-sessions", type=nonnegative_float, default=0,
                    help="with --speculation: size its budget so resident holds this many histories of the "
                         "speculation's context (default: the main budget)")
    ap.add_argument("--spec-hbm-budget", default="", help="with --speculation: its GPU KV budget, bytes (overrides "
                    "--spec-resident-sessions)")
    ap.add_argument("--sample-every", type=positive_int, default=2, help="exactness: every N-th session against resident")
    ap.add_argument("--repeats", type=positive_int, default=1,
                    help="rounds: every sweep this many times, a round after another; ratios are taken within a round "
                         "and reported as the median over rounds with [min, max]")
    ap.add_argument("--json", default="")
    ap.add_argument("--append", action="store_true", help="keep the points of an existing --json; run the others")
    ap.add_argument("--work-dir", default="", help="with --append: the runs' outputs and logs (default JSON.runs)")
    args = ap.parse_args()
    for flag, path in (("--replay", args.replay), ("--dhsctl", args.dhsctl)):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            ap.error(f"{flag} {path}: no such executable (build it first: ninja -C build, or give its path)")
    saved = None
    if args.append and args.json and os.path.exists(args.json):
        with open(args.json) as f:
            saved = json.load(f)
    try:
        result = measure(args, saved=saved)
    except KeyboardInterrupt:  # run_child stopped the running dhs-replay (and its node) first
        print("\nbench_prefix: interrupted (the running dhs-replay was stopped; --json holds the sweeps finished "
              "before)", file=sys.stderr)
        return 130
    if args.json:
        save(result, args.json)
    print_table(result)
    bad = sum(p.get(f, {}).get("differ", 0) for p in result["points"] for f in ("exact_sample", "exact_vs_adaptive"))
    failed = [p for p in result["rounds"] if "error" in p["run"]]
    for p in failed:
        print(f"bench_prefix: FAILED L={p['context']} C={p['concurrency']} {p['mode']} round {p['round'] + 1}: "
              f"{p['run']['error']}", file=sys.stderr)
    not_checked = unchecked(result["points"])  # a comparison of 0 sessions is not "exact"
    for p in not_checked:
        print(f"bench_prefix: NOT CHECKED L={p['context']} C={p['concurrency']} {p['mode']}: no session compared "
              "with the reference", file=sys.stderr)
    return 1 if bad or failed or not_checked else 0


if __name__ == "__main__":
    sys.exit(main())
