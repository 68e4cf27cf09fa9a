#!/usr/bin/env python3
"""tools/bench_prefix_sharing.py: issue 24's measurement ("Measure and report"): memd's content-addressed host tier of
shared prefix pages, `--prefix-sharing on` against `off`, in ONE invocation, back to back on the same build and
settings, on two workloads:

- the Mooncake conversation trace (tools/replay/data/mooncake_conversation_head200.jsonl, all 200 requests, lengths
  scaled by --length-scale so that a run takes minutes on a 2-core machine), closed loop at --concurrency;
- the synthetic workload the project's benchmarks use (dhs-replay has no synthetic trace FILE; the closest is the
  closed loop over prepared prefixes of tools/bench_prefix.py, issue 27: `--prefixes N --prefix-tokens L`,
  tools/replay/closed_loop.h, whose preparation and session traces are generated): N prefixes, M sessions.

Per workload and mode (hisparse; adaptive too with --modes hisparse,adaptive): one run with sharing off, one with it
on, each `--check-exact` (tokens and logits digests equal to a resident run of the same requests) and `--outputs`
(sharing on and off also compared with each other). Reported per run: host bytes per session (mean, peak), peak host
pages (held by sessions; allocated including cached prefix pages), prefix lookups by tier (worker row cache, host
tier, miss = computed) as rates, prefill tokens saved, TTFT p50/p99, output tokens/s; and on/off ratios.

The UPPER BOUND each workload allows, computed here from the trace alone (not from the C++): the blocks whose whole
chain appeared in an earlier request (so that a node keeping every block once could import them), and their prefill
tokens, as fractions of all complete blocks and of all prefill tokens. The blocks are those the worker names
(workerd/prefix_chain.h): block b of a request holds its input tokens [b*T, (b+1)*T), only complete blocks
((b+1)*T <= input tokens), T = the trace's 512-token block scaled like the lengths (tools/replay/trace.cc ScaleLengths:
round half away from zero, at least 1; hash ids beyond ceil(input / T) dropped). The tokens of a block covered by a
hash id depend on that id only, the others on the request's own trace row (common/prompt_tokens.h), so two blocks have
the same chain exactly when the requests' hash ids agree up to that block and the block is covered by them. Also the
same bound at host-page granularity: memd shares a page (p = 64 rows, workerd's default) only when it lies wholly
inside complete blocks of the chain, and the worker imports only pages wholly before the request's last input token
(workerd/prefix_import.cc), so a block seen before counts there only when such a page covers it.

Exactness beyond the pairs: one run with forced reclaims (adaptive under dhs-replay's default GPU budget, sharing on)
and one with worker kills (hisparse, sharing on, dhs-replay's kill points --kill-worker-at prefill:P decode:D) on the
Mooncake trace, each --check-exact, every request finished (fault injection is not allowed with --prefixes).

Usage: tools/bench_prefix_sharing.py [--replay build/tools/replay/dhs-replay] [--length-scale 0.0625] [--requests 200]
          [--concurrency 4] [--modes hisparse,adaptive] [--prefixes 4] [--prefix-tokens 4096] [--suffix-tokens 16]
          [--output-tokens 32] [--sessions 64] [--synthetic-concurrency 16] [--no-faults] [--json OUT]
`measure()` is the benchmark as a function (tools/perf_report.py calls it, section `prefix_sharing`); its result is
what --json writes. Exit 1 when a run was not exact or left a request unfinished.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dhs_vocabulary import WORKER_MODES  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MOONCAKE = os.path.join(HERE, "replay", "data", "mooncake_conversation_head200.jsonl")
HOST_PAGE_ROWS = 64  # rows of a host page: workerd's default p (workerd/geometry.h), which dhs-replay's worker uses
MOONCAKE_BLOCK_TOKENS = 512  # tokens per Mooncake hash block (tools/replay/trace.cc; the trace's README)
SHARING_MODES = tuple(m for m in WORKER_MODES if m != "resident")  # the modes with a host tier
KILL_POINTS = ("prefill:3", "decode:40")  # the worker kill points of the fault run (dhs-replay --kill-worker-at)


# ------------------------------------------------------------------------------------------------ the upper bound

def scale_length(n, scale):
    """tools/replay/trace.cc ScaleLengths: round(n * scale) half away from zero (C++ std::round), at least 1."""
    x = float(n) * float(scale)
    return max(1, int(math.floor(x + 0.5)))


def scaled_requests(rows, scale, block_tokens=MOONCAKE_BLOCK_TOKENS):
    """(T, [(input_tokens, hash_ids)]) of trace rows ({input_length, hash_ids}) after scaling by `scale` as dhs-replay
    does: T = the scaled block, each input scaled, hash ids beyond ceil(input / T) dropped."""
    t = scale_length(block_tokens, scale)
    out = []
    for r in rows:
        n = scale_length(r["input_length"], scale)
        ids = list(r.get("hash_ids") or [])[: -(-n // t)]
        out.append((n, ids))
    return t, out


def upper_bound(requests, block_tokens, counted_from=0, page_rows=HOST_PAGE_ROWS):
    """The share of prefix reuse a workload allows: the complete blocks (of `block_tokens` tokens) of requests
    counted_from.. whose whole chain appeared in an earlier request (any earlier one, counted or not).

    `requests`: [(input_tokens, hash_ids)] in submission order; block b of a request is complete when
    (b + 1) * T <= input_tokens; its chain is the request's hash ids 0..b when b < len(hash_ids) (tokens follow from
    the ids), else the request's own (private tokens: never seen before). The blocks seen are a prefix of the request's
    (a chain seen implies its shorter chains seen). Returns {block_tokens, blocks, blocks_seen, block_share,
    prefill_tokens, tokens_seen, token_share} (prefill_tokens: the counted requests' input tokens; tokens_seen =
    blocks_seen * T) and the same bound at host-page granularity, `page_rows` rows a page (workerd's p): memd shares
    the pages wholly inside the seen blocks (floor(k * T / p) of k blocks seen) and the worker imports those wholly
    before the request's last input token ((n - 1) // p pages, workerd/prefix_import.cc), covering
    min(k, floor(pages * p / T)) blocks: {page_rows, blocks_page_bound, tokens_page_bound (pages * p rows: prefill
    tokens saved), page_block_share}.
    """
    t, p = int(block_tokens), int(page_rows)
    seen = set()
    blocks = blocks_seen = prefill = page_blocks = page_tokens = 0
    for i, (n, ids) in enumerate(requests):
        complete = n // t
        counted = i >= counted_from
        k = 0  # leading blocks seen in an earlier request
        for b in range(min(complete, len(ids))):
            chain = tuple(ids[: b + 1])
            if chain in seen:
                k = b + 1
            else:
                seen.add(chain)
        if counted:
            blocks += complete
            prefill += n
            blocks_seen += k
            pages = min(k * t // p, (n - 1) // p)
            page_blocks += min(k, pages * p // t)
            page_tokens += pages * p
    return {"block_tokens": t, "blocks": blocks, "blocks_seen": blocks_seen,
            "block_share": blocks_seen / blocks if blocks else 0.0, "prefill_tokens": prefill,
            "tokens_seen": blocks_seen * t, "token_share": blocks_seen * t / prefill if prefill else 0.0,
            "page_rows": p, "blocks_page_bound": page_blocks, "tokens_page_bound": page_tokens,
            "page_block_share": page_blocks / blocks if blocks else 0.0}


def read_trace(path, n):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) == n:
                break
    return rows


def mooncake_bound(path, requests, scale):
    t, reqs = scaled_requests(read_trace(path, requests), scale)
    return upper_bound(reqs, t)


def prefix_hash_id(prefix, block):
    """tools/replay/closed_loop.h PrefixHashId: (p + 1) * 2^32 + b."""
    return (prefix + 1) * (1 << 32) + block


def synthetic_bound(prefixes, prefix_tokens, suffix_tokens, sessions, block_tokens=0):
    """The --prefixes workload (tools/replay/closed_loop.h): the preparation (request p = prefix p + S own tokens)
    then the measured sessions (session i = prefix i mod N + S own tokens); the bound counts the sessions only (the
    report's window)."""
    b = block_tokens or min(512, prefix_tokens)
    chain = [[prefix_hash_id(p, k) for k in range(prefix_tokens // b)] for p in range(prefixes)]
    reqs = [(prefix_tokens + suffix_tokens, chain[p]) for p in range(prefixes)]
    reqs += [(prefix_tokens + suffix_tokens, chain[i % prefixes]) for i in range(sessions)]
    return upper_bound(reqs, b, counted_from=prefixes)


# ----------------------------------------------------------------------------------------------------- the runs

def read_outputs(path):
    try:
        with open(path) as f:
            return {r["trace_index"]: r for r in map(json.loads, filter(None, f.read().splitlines()))}
    except OSError:
        return {}


def replay(args, tmp, tag, options, log):
    """One dhs-replay run with --json and --outputs; returns (figures, outputs). A failed run gives figures with
    "error" (and what its report said, when it wrote one)."""
    out, outputs = os.path.join(tmp, tag + ".json"), os.path.join(tmp, tag + ".outputs")
    cmd = [args.replay, *options, "--json", out, "--outputs", outputs]
    print(f"bench_prefix_sharing: {tag}: {' '.join(cmd[1:])}", file=log, flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    report = {}
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    fig = figures(report) if report else {}
    fig["wall_s"] = wall
    fig["command"] = "dhs-replay " + " ".join(options)
    if proc.returncode != 0:
        fig["error"] = f"dhs-replay exited {proc.returncode}: {proc.stderr.strip()[-600:]}"
        sys.stderr.write(proc.stderr[-3000:])
    print(f"bench_prefix_sharing: {tag}: {wall:.0f} s, served {fig.get('served')}/{fig.get('total')}, exact "
          f"{fig.get('exact_match')}, hits worker/host {fig.get('hits_worker')}/{fig.get('hits_host')} of "
          f"{fig.get('lookups')}, {fig.get('output_tokens_per_s', float('nan')):.2f} tok/s", file=log, flush=True)
    return fig, read_outputs(outputs)


def figures(r):
    """The figures of one dhs-replay JSON report."""
    nan = float("nan")
    p = r.get("prefix") or {}
    lookups, hw, hh = p.get("lookups", 0), p.get("hits_worker", 0), p.get("hits_host", 0)
    miss = max(0, lookups - hw - hh)
    rate = (lambda n: n / lookups if lookups else nan)
    hb = r.get("host_bytes_per_session") or {}
    hp = r.get("host_pages_peak") or {}
    return {
        "served": r.get("requests_served"), "total": r.get("requests_total"), "failed": r.get("requests_failed"),
        "exact_match": r.get("exact_match"), "elapsed_s": r.get("elapsed_s"),
        "output_tokens": r.get("output_tokens"), "output_tokens_per_s": r.get("output_tokens_per_s", nan),
        "ttft_p50_ms": (r.get("ttft_ms") or {}).get("p50", nan), "ttft_p99_ms": (r.get("ttft_ms") or {}).get("p99", nan),
        "lookups": lookups, "hits_worker": hw, "hits_host": hh, "misses": miss,
        "hit_rate_worker": rate(hw), "hit_rate_host": rate(hh), "miss_rate": rate(miss),
        "prefill_tokens_saved": r.get("prefill_tokens_saved", 0), "host_pages_shared": r.get("host_pages_shared", 0),
        "host_bytes_per_session_mean": hb.get("mean", nan), "host_bytes_per_session_peak": hb.get("peak", nan),
        "host_pages_peak_held": hp.get("held"), "host_pages_peak_allocated": hp.get("allocated"),
        "reclaims": r.get("reclaims", 0), "sessions": r.get("sessions_admitted_max"),
        "worker_restarts": r.get("worker_restarts", 0), "requests_resumed": r.get("requests_resumed", 0),
        "host_rows_lost": r.get("host_rows_lost", 0), "host_pages_unconfirmed": r.get("host_pages_unconfirmed", 0),
        "worker_crashes": r.get("worker_crashes", 0),
        "hbm_budget_bytes": (r.get("settings") or {}).get("hbm_budget_bytes"),
        "block_tokens": ((r.get("trace") or {}).get("block_tokens")
                         or ((r.get("prefix_workload") or {}).get("block_tokens"))),
    }


def same_outputs(a, b):
    """Trace rows whose tokens or logits digests differ between two --outputs files (or are missing/unserved)."""
    rows = sorted(set(a) | set(b))
    return [i for i in rows if i not in a or i not in b or not a[i].get("served") or not b[i].get("served")
            or a[i]["tokens"] != b[i]["tokens"] or a[i]["logits_digests"] != b[i]["logits_digests"]]


RATIO_KEYS = ("host_bytes_per_session_mean", "host_bytes_per_session_peak", "host_pages_peak_held",
              "host_pages_peak_allocated", "ttft_p50_ms", "ttft_p99_ms", "output_tokens_per_s", "prefill_tokens_saved")


def ratio(a, b):
    try:
        return a / b if a is not None and b and a == a and b == b else float("nan")
    except TypeError:
        return float("nan")


def clean(fig, faults=False):
    """Whether a run is exact and finished every request (and, with faults, lost no host row)."""
    ok = "error" not in fig and fig.get("exact_match") is True and fig.get("served") == fig.get("total") \
        and fig.get("failed") == 0
    if faults:
        ok = ok and fig.get("host_rows_lost") == 0 and fig.get("host_pages_unconfirmed") == 0 \
            and fig.get("worker_crashes") == 0 and fig.get("worker_restarts", 0) >= 1
    return ok


def pair(args, tmp, workload, mode, base, log):
    """Sharing off then on, back to back: {mode, off, on, on_vs_off, on_equals_off}."""
    off, off_rows = replay(args, tmp, f"{workload}-{mode}-off", base + ["--mode", mode, "--check-exact"], log)
    on, on_rows = replay(args, tmp, f"{workload}-{mode}-on",
                         base + ["--mode", mode, "--check-exact", "--prefix-sharing", "on"], log)
    diff = same_outputs(off_rows, on_rows)
    return {"mode": mode, "off": off, "on": on, "on_vs_off": {k: ratio(on.get(k), off.get(k)) for k in RATIO_KEYS},
            "on_equals_off": {"compared": len(set(off_rows) | set(on_rows)), "differ": len(diff)}}


def measure(args, log=sys.stderr):
    """Runs both workloads (and the fault runs) and returns the result --json writes."""
    modes = [m for m in str(args.modes).split(",") if m]
    trace = getattr(args, "trace", "") or MOONCAKE
    result = {"length_scale": args.length_scale, "requests": args.requests, "concurrency": args.concurrency,
              "preset": args.preset, "modes": modes, "trace": os.path.relpath(trace, os.path.dirname(HERE)),
              "synthetic": {"prefixes": args.prefixes, "prefix_tokens": args.prefix_tokens,
                            "suffix_tokens": args.suffix_tokens, "output_tokens": args.output_tokens,
                            "sessions": args.sessions, "concurrency": args.synthetic_concurrency},
              "kill_points": list(KILL_POINTS), "workloads": []}
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        moon = ["--trace", trace, "--requests", str(args.requests), "--length-scale", str(args.length_scale),
                "--concurrency", str(args.concurrency), "--preset", args.preset, "--idle-timeout-ms", "600000"]
        wl = {"name": "mooncake", "bound": mooncake_bound(trace, args.requests, args.length_scale), "pairs": []}
        for mode in modes:
            wl["pairs"].append(pair(args, tmp, "mooncake", mode, moon, log))
        result["workloads"].append(wl)
        syn = ["--prefixes", str(args.prefixes), "--prefix-tokens", str(args.prefix_tokens), "--suffix-tokens",
               str(args.suffix_tokens), "--session-output-tokens", str(args.output_tokens), "--sessions",
               str(args.sessions), "--concurrency", str(args.synthetic_concurrency), "--slots",
               str(max(8, args.synthetic_concurrency)), "--preset", args.preset, "--idle-timeout-ms", "600000"]
        wl = {"name": "synthetic", "bound": synthetic_bound(args.prefixes, args.prefix_tokens, args.suffix_tokens,
                                                            args.sessions), "pairs": []}
        for mode in modes:
            wl["pairs"].append(pair(args, tmp, "synthetic", mode, syn, log))
        result["workloads"].append(wl)
        # Exactness under forced reclaims (adaptive, dhs-replay's default budget) and worker kills (hisparse).
        faults = {}
        if not args.no_faults:
            # The adaptive pair's sharing-on run when it reclaimed; else a run of its own under dhs-replay's default
            # budget, halved until a run reclaims (at most twice).
            reclaim = next((p["on"] for p in result["workloads"][0]["pairs"] if p["mode"] == "adaptive"), None)
            budget = None
            for attempt in range(3):
                if reclaim is not None and (reclaim.get("reclaims", 0) > 0 or "error" in reclaim):
                    break
                if reclaim is not None and reclaim.get("hbm_budget_bytes"):
                    budget = int(reclaim["hbm_budget_bytes"]) // 2
                extra = ["--hbm-budget", str(budget)] if budget else []
                reclaim, _ = replay(args, tmp, f"mooncake-adaptive-reclaims-{attempt}",
                                    moon + ["--mode", "adaptive", "--check-exact", "--prefix-sharing", "on", *extra],
                                    log)
            faults["reclaims"] = reclaim
            kill_args = [w for k in KILL_POINTS for w in ("--kill-worker-at", k)]
            faults["kills"], _ = replay(args, tmp, "mooncake-hisparse-kills",
                                        moon + ["--mode", "hisparse", "--check-exact", "--prefix-sharing", "on",
                                                "--fault-seed", "7", *kill_args], log)
        result["faults"] = faults
    result["wall_s"] = time.monotonic() - start
    runs = [r for w in result["workloads"] for p in w["pairs"] for r in (p["off"], p["on"])]
    result["all_exact"] = all(clean(r) for r in runs) and all(
        p["on_equals_off"]["differ"] == 0 for w in result["workloads"] for p in w["pairs"]) and \
        (not faults or (clean(faults["reclaims"]) and faults["reclaims"].get("reclaims", 0) > 0
                        and clean(faults["kills"], faults=True)))
    return result


# -------------------------------------------------------------------------------------------------------- output

def fmt(x, nd=2):
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and x == x else "n/a"


def pct(x):
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) and x == x else "n/a"


def print_table(result):
    print(f"bench_prefix_sharing: preset {result['preset']}, {result['wall_s']:.0f} s in all")
    for w in result["workloads"]:
        b = w["bound"]
        print(f"{w['name']}: upper bound {b['blocks_seen']}/{b['blocks']} blocks ({pct(b['block_share'])}), "
              f"{b['tokens_seen']}/{b['prefill_tokens']} prefill tokens ({pct(b['token_share'])}), block "
              f"{b['block_tokens']} tokens; at {b['page_rows']}-row page granularity {b['blocks_page_bound']} blocks "
              f"({pct(b['page_block_share'])}), {b['tokens_page_bound']} prefill tokens")
        print(f"  {'mode':<9} {'sharing':<7} {'served':>7} {'exact':>5} {'worker':>7} {'host':>7} {'miss':>7} "
              f"{'saved':>7} {'shared':>6} {'B/sess mean':>11} {'peak':>9} {'pages held':>10} {'alloc':>6} "
              f"{'TTFT p50':>8} {'p99':>8} {'tok/s':>7}")
        for p in w["pairs"]:
            for s in ("off", "on"):
                r = p[s]
                print(f"  {p['mode']:<9} {s:<7} {r.get('served')}/{r.get('total')!s:<3} "
                      f"{str(r.get('exact_match')):>5} {pct(r.get('hit_rate_worker')):>7} "
                      f"{pct(r.get('hit_rate_host')):>7} {pct(r.get('miss_rate')):>7} "
                      f"{r.get('prefill_tokens_saved')!s:>7} {r.get('host_pages_shared')!s:>6} "
                      f"{fmt(r.get('host_bytes_per_session_mean'), 0):>11} "
                      f"{fmt(r.get('host_bytes_per_session_peak'), 0):>9} {r.get('host_pages_peak_held')!s:>10} "
                      f"{r.get('host_pages_peak_allocated')!s:>6} {fmt(r.get('ttft_p50_ms'), 1):>8} "
                      f"{fmt(r.get('ttft_p99_ms'), 1):>8} {fmt(r.get('output_tokens_per_s')):>7}"
                      + (f"  ERROR {r['error'][:200]}" if "error" in r else ""))
            v = p["on_vs_off"]
            print(f"  {p['mode']:<9} on/off  " + ", ".join(f"{k} {fmt(v[k], 3)}" for k in RATIO_KEYS) +
                  f"; outputs on == off: {p['on_equals_off']['compared'] - p['on_equals_off']['differ']}/"
                  f"{p['on_equals_off']['compared']}")
    for name, r in (result.get("faults") or {}).items():
        print(f"faults/{name}: served {r.get('served')}/{r.get('total')}, exact {r.get('exact_match')}, reclaims "
              f"{r.get('reclaims')}, worker restarts {r.get('worker_restarts')}, resumed {r.get('requests_resumed')}, "
              f"host rows lost {r.get('host_rows_lost')}" + (f"  ERROR {r['error'][:200]}" if "error" in r else ""))
    print(f"all exact and finished: {result['all_exact']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", default="build/tools/replay/dhs-replay")
    ap.add_argument("--trace", default=MOONCAKE, help="the Mooncake trace (default the bundled 200-request slice)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--length-scale", type=float, default=0.0625)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--preset", default="dsv4flash-like")
    ap.add_argument("--modes", default="hisparse,adaptive", help=f"comma-separated subset of {','.join(SHARING_MODES)}")
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--prefix-tokens", type=int, default=4096)
    ap.add_argument("--suffix-tokens", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--synthetic-concurrency", type=int, default=16)
    ap.add_argument("--no-faults", action="store_true", help="skip the reclaim and worker-kill runs")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if bad := [m for m in args.modes.split(",") if m not in SHARING_MODES]:
        ap.error(f"--modes: unknown {','.join(bad)}")
    result = measure(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print_table(result)
    return 0 if result["all_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
