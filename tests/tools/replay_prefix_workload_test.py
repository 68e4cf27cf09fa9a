#!/usr/bin/env python3
"""The closed loop over prepared prefixes (issue 27; tools/replay/closed_loop.h), end to end with real nodes.

dhs-replay --prefixes 2 --prefix-tokens 256 --prefix-block-tokens 64: 2 prefixes of 4 blocks, 8 sessions of
prefix + 8 suffix tokens + 16 output tokens, closed loop at C = 4, in each of the three modes under one budget.
Asserts, per mode:
- every session served; the report's prefix_workload echoes the settings (8 sessions, C = 4);
- the prefix rows were computed once per prefix: 2 * 4 = 8 blocks computed in the preparation, none in the measured
  window, and 8 sessions * 4 blocks = 32 imported there (the worker's prefix_blocks counters);
- the closed loop kept C sessions in flight: in_flight_max == 4 and the mean in flight (Little's law) above 2;
- exactness against resident on a sample of sessions (every other one): tokens and per-token logits digests equal.
And the prepared path against plain prefill: the same requests written as a Mooncake trace (same hash ids, same rows,
block 64 through --length-scale 0.125) and replayed by prefill in resident mode give the same tokens and digests for
every session: the imported prefix is the prefix the tokens would have computed.
And a sweep on one node (--sweep 1,2 --sessions-per-c 2, adaptive): the prefixes computed at the first point only
(8 blocks computed, 0 imported), the second point's preparation imports all 8 and computes none; each point's
sessions (max(2, 2 x C): 2 and 4) and outputs in OUT.c1 / OUT.c2, equal to the resident run's for the same rows.
And sessions admitted count the measured window only: 4 prefixes prepared 4 at once, then C = 1 admits 1 (not 4).
And speculation over the prepared prefixes (adaptive, --speculate synthetic, corruption 0, K = 4): the synthetic
proposer starts each session from the prefix in the worker's row cache, so every session speculates from its first
decode step: 4 rounds of widths 4, 4, 4, 3 for its 15 tokens after the first, every proposal accepted (8 x 4 = 32
rounds, 8 x 11 = 88 proposals); without the copy it would first catch up 264 tokens 64 a round. Exact against
resident.
Usage: replay_prefix_workload_test.py DHS_REPLAY"""
import json
import os
import subprocess
import sys
import tempfile

PREFIXES, PREFIX_TOKENS, BLOCK, SUFFIX, OUTPUT, SESSIONS, C = 2, 256, 64, 8, 16, 8, 4
BUDGET = "48MB"  # every resident history fits at C = 4 (so resident keeps C in flight too)


def replay(exe, tmp, tag, extra):
    out, outputs = os.path.join(tmp, f"{tag}.json"), os.path.join(tmp, f"{tag}.outputs")
    cmd = [exe, "--concurrency", str(C), "--hbm-budget", BUDGET, "--json", out, "--outputs", outputs] + extra
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"FAIL: dhs-replay {tag} exited {proc.returncode}")
    with open(out) as f:
        report = json.load(f)
    with open(outputs) as f:
        rows = {r["trace_index"]: r for r in map(json.loads, filter(None, f.read().splitlines()))}
    return report, rows


def run_json(exe, args, out, failures, what):
    """dhs-replay with `args` writing its report to `out`: the report, or None with a failure naming `what` (its
    stderr's tail printed) when it exited non-zero."""
    proc = subprocess.run([exe, *args, "--json", out], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        failures.append(f"{what}: dhs-replay exited {proc.returncode}")
        return None
    with open(out) as f:
        return json.load(f)


def workload_args(mode):
    return ["--mode", mode, "--prefixes", str(PREFIXES), "--prefix-tokens", str(PREFIX_TOKENS),
            "--prefix-block-tokens", str(BLOCK), "--suffix-tokens", str(SUFFIX), "--session-output-tokens", str(OUTPUT),
            "--sessions", str(SESSIONS)]


def check_mode(mode, report, rows):
    failures = []
    w = report.get("prefix_workload") or {}
    blocks = PREFIX_TOKENS // BLOCK
    want = {"prefixes": PREFIXES, "prefix_tokens": PREFIX_TOKENS, "block_tokens": BLOCK, "sessions": SESSIONS,
            "concurrency": C, "preparation_blocks_computed": PREFIXES * blocks, "preparation_blocks_imported": 0,
            "in_flight_max": C}
    failures += [f"{mode}: prefix_workload.{k} = {w.get(k)}, want {v}" for k, v in want.items() if w.get(k) != v]
    if not w.get("in_flight_mean", 0) > C / 2:
        failures.append(f"{mode}: in_flight_mean {w.get('in_flight_mean')} not above {C / 2}")
    got = report.get("prefix_blocks") or {}
    if got != {"imported": SESSIONS * blocks, "computed": 0}:
        failures.append(f"{mode}: measured prefix_blocks {got}, want imported {SESSIONS * blocks}, computed 0")
    if report.get("requests_served") != SESSIONS or report.get("requests_total") != SESSIONS:
        failures.append(f"{mode}: served {report.get('requests_served')}/{report.get('requests_total')}")
    if report.get("prefill") != "prepared-prefix":
        failures.append(f"{mode}: prefill {report.get('prefill')!r}")
    if report.get("output_tokens") != SESSIONS * OUTPUT:
        failures.append(f"{mode}: output_tokens {report.get('output_tokens')}, want {SESSIONS * OUTPUT}")
    if sorted(rows) != list(range(PREFIXES, PREFIXES + SESSIONS)):
        failures.append(f"{mode}: session rows {sorted(rows)}")
    return failures


def same(a, b):
    return a["served"] and b["served"] and a["tokens"] == b["tokens"] and a["logits_digests"] == b["logits_digests"] \
        and len(a["tokens"]) == OUTPUT and len(a["logits_digests"]) == OUTPUT


def main():
    exe = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = {m: replay(exe, tmp, m, workload_args(m)) for m in ("resident", "hisparse", "adaptive")}
        for mode, (report, rows) in runs.items():
            failures += check_mode(mode, report, rows)
        res_rows = runs["resident"][1]
        sample = list(range(PREFIXES, PREFIXES + SESSIONS, 2))
        for mode in ("hisparse", "adaptive"):
            rows = runs[mode][1]
            failures += [f"{mode}: session row {i} differs from resident" for i in sample
                         if i not in rows or i not in res_rows or not same(rows[i], res_rows[i])]
        # The same requests as a trace, served by plain prefill: rows 0..N-1 the preparation, then the sessions.
        trace = os.path.join(tmp, "workload.jsonl")
        scale = BLOCK / 512  # Mooncake's 512-token block scaled to BLOCK; the lengths below scale back to the
        # workload's
        with open(trace, "w") as f:
            for row in range(PREFIXES + SESSIONS):
                prefix = row if row < PREFIXES else (row - PREFIXES) % PREFIXES
                ids = [(prefix + 1) * 2**32 + b for b in range(PREFIX_TOKENS // BLOCK)]
                out = 1 if row < PREFIXES else OUTPUT
                f.write(json.dumps({"timestamp": 0, "input_length": round((PREFIX_TOKENS + SUFFIX) / scale),
                                    "output_length": round(out / scale), "hash_ids": ids}) + "\n")
        _, plain = replay(exe, tmp, "prefill", ["--mode", "resident", "--trace", trace, "--requests",
                                                str(PREFIXES + SESSIONS), "--length-scale", str(scale)])
        failures += [f"prefill: session row {i} differs from the prepared-prefix resident run"
                     for i in range(PREFIXES, PREFIXES + SESSIONS)
                     if i not in plain or i not in res_rows or not same(plain[i], res_rows[i])]
        # A sweep on one node: prepared once, at the first point.
        out, outputs = os.path.join(tmp, "sweep.json"), os.path.join(tmp, "sweep.outputs")
        args = workload_args("adaptive")
        del args[args.index("--sessions"):args.index("--sessions") + 2]  # per point: --sessions-per-c
        points = run_json(exe, [*args, "--sweep", "1,2", "--sessions-per-c", "2", "--slots", "2", "--hbm-budget", BUDGET,
                                "--outputs", outputs], out, failures, "sweep")
        if points is not None:
            blocks = PREFIXES * (PREFIX_TOKENS // BLOCK)
            got = [(p["settings"]["concurrency"], p["prefix_workload"]["sessions"],
                    p["prefix_workload"]["preparation_blocks_computed"],
                    p["prefix_workload"]["preparation_blocks_imported"], p["requests_served"]) for p in points]
            if got != [(1, 2, blocks, 0, 2), (2, 4, 0, blocks, 4)]:
                failures.append(f"sweep points (C, sessions, prep computed, prep imported, served) {got}")
            for c, n in ((1, 2), (2, 4)):
                try:
                    with open(f"{outputs}.c{c}") as f:
                        rows = {r["trace_index"]: r for r in map(json.loads, filter(None, f.read().splitlines()))}
                except OSError as e:
                    failures.append(f"sweep: {e}")
                    continue
                if sorted(rows) != list(range(PREFIXES, PREFIXES + n)):
                    failures.append(f"sweep C={c}: rows {sorted(rows)}")
                failures += [f"sweep C={c}: row {i} differs from the resident run" for i in rows
                             if i not in res_rows or not same(rows[i], res_rows[i])]
            w = [p["prefix_workload"] for p in points]
            if not (0 < w[0]["window_begin_ms"] < w[0]["window_end_ms"] <= w[1]["window_begin_ms"]
                    < w[1]["window_end_ms"]):
                failures.append(f"sweep windows not in order: {[(x['window_begin_ms'], x['window_end_ms']) for x in w]}")
        # Sessions admitted are the window's (review D1): 4 prefixes prepared 4 at once (--slots 4), then C = 1: memd's
        # peak since the client connected is 4, the window's is 1.
        out = os.path.join(tmp, "c1.json")
        report = run_json(exe, ["--mode", "adaptive", "--prefixes", "4", "--prefix-tokens", str(PREFIX_TOKENS),
                                "--prefix-block-tokens", str(BLOCK), "--sessions", "4", "--concurrency", "1", "--slots",
                                "4", "--hbm-budget", BUDGET], out, failures, "C = 1 over 4 prefixes")
        if report is not None:
            got = (report.get("sessions_admitted_max"), (report.get("prefix_workload") or {}).get("in_flight_max"),
                   report.get("requests_served"))
            if got != (1, 1, 4):
                failures.append(f"C = 1 over 4 prefixes: (sessions_admitted_max, in_flight_max, served) {got}, "
                                "want (1, 1, 4): the window admits one session at a time")
        # Speculation over the prepared prefixes: the proposer starts from the copied prefix (issue 27).
        out, outputs = os.path.join(tmp, "spec.json"), os.path.join(tmp, "spec.outputs")
        report = run_json(exe, [*workload_args("adaptive"), "--concurrency", str(C), "--hbm-budget", BUDGET,
                                "--speculate", "synthetic", "--spec-corruption", "0", "--block", "4", "--outputs",
                                outputs], out, failures, "speculation")
        if report is not None:
            want_rounds = SESSIONS * 4  # K_r = min(4, tokens left): 4, 4, 4, 3 after the first token
            got = (report.get("rounds"), report.get("proposals"), report.get("block_width"))
            want = (want_rounds, {"verified": SESSIONS * 11, "accepted": SESSIONS * 11}, {"4": SESSIONS * 3, "3": SESSIONS})
            if got != want:
                failures.append(f"speculation over prepared prefixes: (rounds, proposals, block widths) {got}, want "
                                f"{want}: every session speculates from its first decode step")
            with open(outputs) as f:
                rows = {r["trace_index"]: r for r in map(json.loads, filter(None, f.read().splitlines()))}
            failures += [f"speculation: session row {i} differs from resident" for i in range(PREFIXES, PREFIXES + SESSIONS)
                         if i not in rows or i not in res_rows or not same(rows[i], res_rows[i])]
        # The workload's settings are checked: a prefix not a multiple of the block is refused with exit 2.
        bad = subprocess.run([exe, "--prefixes", "1", "--prefix-tokens", "100", "--prefix-block-tokens", "64"],
                             capture_output=True, text=True, timeout=60)
        if bad.returncode != 2 or "--prefix-tokens" not in bad.stderr:
            failures.append(f"--prefix-tokens 100 with block 64: exit {bad.returncode}, stderr {bad.stderr!r}")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("OK: prepared-prefix closed loop in three modes (computed once per prefix, C in flight, exact)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
