#!/usr/bin/env python3
"""tools/bench_cluster.py: issue 26's measurement ("Measure and report"): the Mooncake conversation trace on several
nodes of this machine (`dhs-replay --nodes N --route R`), node-local only (each memd's host tier of shared prefix
pages, issue 24) against the cluster tier on Redis (`--cluster-store local`: dhs-replay starts one redis-server, every
memd gets `--cluster-store`), back to back, in ONE invocation on the same build and settings.

The runs (hisparse, `--prefix-sharing on`, closed loop at --concurrency, every run `--check-exact`: tokens and logits
digests equal to ONE resident node's): round-robin on each of --nodes (default 1, 2, 4), then `session` and `prefix`
routing (--routes) on --route-nodes nodes (default 2); each once without and once with the cluster tier. Reported per
run: block lookups by tier as rates (worker row cache, host tier, cluster tier, miss = computed), prefill tokens saved,
the cluster tier's pages (looked up, found, imported, published) and bytes/s to and from Redis, TTFT p50/p99, output
tokens/s, exact. The cluster tier's pages are copied into a node's host pool and granted as host pages, so the
worker counts their blocks as host hits; the cluster column is those blocks, estimated from memd's imported pages (a
page of p rows covers p / T blocks of T tokens, at most the run's host hits), and the host column the rest. A 1-node
run with the store reports its node as `multi_node.per_node[0]` (issue 26 review); a report of a dhs-replay from
before that (`multi_node` null with one node) gives "n/a". The memds' misses by reason (`cluster_misses`: timeouts,
a down store, ...) and the memd restarts the report saw are summed over the nodes too.

The UPPER BOUNDS, computed here from the trace alone with tools/bench_prefix_sharing.py's upper_bound() (the same
blocks and page granularity as issue 24's): any node (a block is reusable when any earlier request, on any node, had
its whole chain: what a cluster tier that keeps everything allows), and node-local (a block is reusable only when an
earlier request ON THE SAME NODE had it: the repeats that land on the same node), for round-robin on each N
(request k to node k mod N) and for each run's actual routing (dhs-replay's `multi_node.routing`).

Usage: tools/bench_cluster.py [--replay build/tools/replay/dhs-replay] [--trace FILE] [--requests 800]
          [--length-scale 0.015625] [--concurrency 4] [--preset dsv4flash-like] [--mode hisparse] [--nodes 1,2,4]
          [--routes session,prefix] [--route-nodes 2] [--store local] [--chat-conversations 9] [--chat-turns 4]
          [--chat-output-length 4096] [--chat-length-scale 0.0625] [--chat-concurrency 3]
          [--chat-lookup-timeout-ms 100] [--json OUT]
The chat part (issue 26, sessions): `chat_trace()` conversations of several turns with long answers, replayed with
`--chat-turns` on 2 nodes round-robin (consecutive turns on different nodes), node-local only against the cluster
tier with a longer lookup deadline; reported: prefill tokens saved and the pages imported by a session key.
`measure()` is the benchmark as a function (tools/perf_report.py calls it, section `cluster`); its result is what
--json writes. Exit 1 when a run was not exact or left a request unfinished.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_prefix_sharing as bps  # noqa: E402  (the upper bound, the trace's scaling)

HERE = os.path.dirname(os.path.abspath(__file__))
MOONCAKE = os.path.join(HERE, "replay", "data", "mooncake_conversation_head1000.jsonl")
BOUND_KEYS = ("blocks", "blocks_seen", "prefill_tokens", "tokens_seen", "blocks_page_bound", "tokens_page_bound")
# Mooncake's published gain of its store against node-local caching on the conversation trace (effective request
# capacity under SLOs, GPU fleet, full lengths): what the report compares against, not measured here.
MOONCAKE_GAIN = (0.59, 4.98)


# ------------------------------------------------------------------------------------------------ the upper bounds

def node_local_bound(requests, block_tokens, node_of, page_rows=bps.HOST_PAGE_ROWS):
    """The upper bound when a block is reusable only on the node that had it: bench_prefix_sharing.upper_bound() over
    each node's requests (in submission order), summed. `requests`: [(input_tokens, hash_ids)] in submission order;
    `node_of[i]`: the node of request i. Returns upper_bound()'s fields (shares recomputed from the sums) and `nodes`
    (distinct nodes)."""
    per = {}
    for i, r in enumerate(requests):
        per.setdefault(node_of[i], []).append(r)
    parts = [bps.upper_bound(reqs, block_tokens, page_rows=page_rows) for reqs in per.values()]
    out = {k: sum(p[k] for p in parts) for k in BOUND_KEYS}
    out.update(block_tokens=int(block_tokens), page_rows=int(page_rows), nodes=len(per),
               block_share=out["blocks_seen"] / out["blocks"] if out["blocks"] else 0.0,
               token_share=out["tokens_seen"] / out["prefill_tokens"] if out["prefill_tokens"] else 0.0,
               page_block_share=out["blocks_page_bound"] / out["blocks"] if out["blocks"] else 0.0)
    return out


def round_robin(n_requests, nodes):
    """dhs-replay's round-robin: request k to node k mod N (tools/replay/router.h)."""
    return [k % nodes for k in range(n_requests)]


def bounds(rows, scale, node_counts):
    """{block_tokens, any_node, round_robin: {N: node-local bound}} for trace rows scaled by `scale`."""
    t, reqs = bps.scaled_requests(rows, scale)
    return {"block_tokens": t, "any_node": bps.upper_bound(reqs, t),
            "round_robin": {str(n): node_local_bound(reqs, t, round_robin(len(reqs), n)) for n in node_counts}}


def routed_bound(rows, scale, routing):
    """The node-local bound of a run's actual routing (`multi_node.routing`: {trace_index, node} per request, in
    submission order); None when the routing does not name every request."""
    t, reqs = bps.scaled_requests(rows, scale)
    order = [r["trace_index"] for r in routing]
    if sorted(order) != list(range(len(reqs))):
        return None
    return node_local_bound([reqs[i] for i in order], t, [r["node"] for r in routing])


# ----------------------------------------------------------------------------------------------------- the runs

def _sum(values):
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _sum_reasons(maps):
    """Reason -> count maps added up (None entries skipped); None when every entry is None."""
    out, any_map = {}, False
    for m in maps:
        if m is None:
            continue
        any_map = True
        for k, v in m.items():
            out[k] = out.get(k, 0) + v
    return out if any_map else None


def figures(r, store=None, page_rows=bps.HOST_PAGE_ROWS):
    """The figures of one dhs-replay JSON report (several nodes or one); `store`: the run's --cluster-store (a 1-node
    report names none: its cluster figures are then unknown, None)."""
    nan = float("nan")
    f = bps.figures(r)
    m = r.get("multi_node") or {}
    nodes = m.get("per_node") or []
    clusters = [n.get("cluster") for n in nodes]
    cl = {k: _sum(c.get(k) if c else None for c in clusters)
          for k in ("lookups", "hits", "imported", "session_imported", "published")}
    f.update({"nodes": m.get("nodes", 1), "route": m.get("route", "round-robin"),
              "cluster_store": m.get("cluster_store") or store, "cluster_counters": m.get("cluster_counters"),
              "sessions": m.get("sessions"), "next_turns": m.get("next_turns"),
              "kv_settle_timeouts": (m.get("kv_events") or {}).get("settle_timeouts"),
              "cluster_pages": cl,
              # Issue 26 review: why lookups missed (reason -> pages, summed over nodes) and the memd restarts seen.
              "cluster_misses": _sum_reasons(c.get("misses") if c else None for c in clusters),
              "memd_restarts_seen": _sum(c.get("memd_restarts_seen") if c else None for c in clusters),
              "store_bytes_out": _sum(n.get("store_bytes_out") for n in nodes),
              "store_bytes_in": _sum(n.get("store_bytes_in") for n in nodes),
              "store_bytes_out_per_s": _sum(n.get("store_bytes_out_per_s") for n in nodes),
              "store_bytes_in_per_s": _sum(n.get("store_bytes_in_per_s") for n in nodes),
              "per_node_requests": [n.get("requests") for n in nodes],
              "routing": [{"trace_index": x["trace_index"], "node": x["node"]} for x in (m.get("routing") or [])]})
    # The cluster tier's blocks: its imported pages are granted as host pages (counted as host hits by the worker).
    t = f.get("block_tokens") or 0
    hh = f["hits_host"]
    if cl["imported"] is None or not t:
        f["hits_cluster"] = None if f.get("cluster_store") else 0
    else:
        f["hits_cluster"] = min(hh, cl["imported"] * (page_rows // t) if page_rows >= t else cl["imported"])
    f["hits_host_local"] = hh - (f["hits_cluster"] or 0)
    lookups = f["lookups"]
    f["hit_rate_cluster"] = f["hits_cluster"] / lookups if lookups and f["hits_cluster"] is not None else nan
    f["hit_rate_host_local"] = f["hits_host_local"] / lookups if lookups else nan
    return f


def replay(args, tmp, tag, options, log, store=None):
    """One dhs-replay run with --json; returns its figures ("error" when it failed; "command", "wall_s")."""
    out = os.path.join(tmp, tag + ".json")
    cmd = [args.replay, *options, "--json", out]
    print(f"bench_cluster: {tag}: {' '.join(cmd[1:])}", file=log, flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - start
    report = {}
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    fig = figures(report, store) if report else {}
    fig["wall_s"] = wall
    fig["command"] = "dhs-replay " + " ".join(o for o in options if not o.startswith("/"))
    if proc.returncode != 0:
        fig["error"] = f"dhs-replay exited {proc.returncode}: {proc.stderr.strip()[-600:]}"
        sys.stderr.write(proc.stderr[-3000:])
    print(f"bench_cluster: {tag}: {wall:.0f} s, served {fig.get('served')}/{fig.get('total')}, exact "
          f"{fig.get('exact_match')}, hits worker/host/cluster {fig.get('hits_worker')}/{fig.get('hits_host_local')}/"
          f"{fig.get('hits_cluster')} of {fig.get('lookups')}, saved {fig.get('prefill_tokens_saved')}, "
          f"{fig.get('output_tokens_per_s', float('nan')):.2f} tok/s", file=log, flush=True)
    return fig


def chat_trace(path, rows, conversations, turns, output_length, new_tokens=2048, block=512):
    """Writes a conversation trace for `dhs-replay --chat-turns` (the chat part): `conversations` conversations (the
    first rows of the Mooncake slice, each its turn 0) of `turns` turns each, turn-major (every turn 0, then every turn
    1, ...: with round-robin on 2 nodes and an odd count, a conversation's consecutive turns land on different nodes).
    Every turn's `output_length` is `output_length` (long answers: the history a session key adds past the chain).
    Turn t >= 1: input = turn t-1's input + output + `new_tokens` (what --chat-turns sends at least: the previous
    prompt, its answer, new tokens), hash ids = turn t-1's complete blocks (floor(input / block)) then new ids to
    ceil(input / block): its chain extends the previous turn's, so tools/replay/sessions.h derives one session per
    conversation. Returns the trace's rows."""
    out = []
    fresh = 10**12
    for t in range(turns):
        for k in range(conversations):
            if t == 0:
                r = rows[k]
                row = {"timestamp": 0, "input_length": r["input_length"], "output_length": output_length,
                       "hash_ids": list(r["hash_ids"])}
            else:
                prev = out[(t - 1) * conversations + k]
                n = prev["input_length"] + output_length + new_tokens
                ids = prev["hash_ids"][:prev["input_length"] // block]
                while len(ids) < -(-n // block):
                    fresh += 1
                    ids.append(fresh)
                row = {"timestamp": 0, "input_length": n, "output_length": output_length, "hash_ids": ids}
            out.append(row)
    with open(path, "w") as f:
        for row in out:
            f.write(json.dumps(row) + "\n")
    return out


def measure_chat(args, tmp, log):
    """The chat part: a conversation's next turns on another node (`dhs-replay --chat-turns`, 2 nodes round-robin),
    node-local only against the cluster tier, where a next turn finds the previous turn's history pages by its session
    key (docs/cluster_tier.md "Sessions"): the figures of both runs and their ratios; None when not asked
    (chat_conversations 0)."""
    conv = int(getattr(args, "chat_conversations", 0) or 0)
    if conv <= 0:
        return None
    turns, out_len = int(args.chat_turns), int(args.chat_output_length)
    rows = bps.read_trace(MOONCAKE, conv)
    path = os.path.join(tmp, "chat.jsonl")
    chat_trace(path, rows, conv, turns, out_len)
    n = conv * turns
    opts = ["--trace", path, "--requests", str(n), "--length-scale", str(args.chat_length_scale), "--concurrency",
            str(args.chat_concurrency), "--preset", args.preset, "--mode", args.mode, "--prefix-sharing", "on",
            "--check-exact", "--idle-timeout-ms", "600000", "--chat-turns", "--nodes", "2", "--route", "round-robin"]
    local = replay(args, tmp, "chat-local", opts, log)
    cluster = replay(args, tmp, "chat-cluster", opts + ["--cluster-store", args.store, "--cluster-lookup-timeout-ms",
                                                         str(args.chat_lookup_timeout_ms)], log, store=args.store)
    for side in (local, cluster):
        side.pop("routing", None)
    return {"conversations": conv, "turns": turns, "requests": n, "output_length": out_len,
            "length_scale": args.chat_length_scale, "concurrency": args.chat_concurrency, "nodes": 2,
            "route": "round-robin", "lookup_timeout_ms": args.chat_lookup_timeout_ms, "local": local,
            "cluster": cluster,
            "cluster_vs_local": {k: bps.ratio(cluster.get(k), local.get(k)) for k in (
                "prefill_tokens_saved", "ttft_p50_ms", "ttft_p99_ms", "output_tokens_per_s")}}


def plan(node_counts, routes, route_nodes):
    """The (nodes, route) configurations in run order: round-robin on each N, then each route on route_nodes."""
    return [(n, "round-robin") for n in node_counts] + [(route_nodes, r) for r in routes]


def clean(fig):
    return "error" not in fig and fig.get("exact_match") is True and fig.get("served") == fig.get("total") \
        and fig.get("failed") == 0


def measure(args, log=sys.stderr):
    """Runs every configuration without and with the cluster tier and returns the result --json writes:
    {settings..., bounds, configs[] {nodes, route, local, cluster, routed_bound_local, routed_bound_cluster,
    cluster_vs_local}, all_exact, wall_s}."""
    node_counts = [int(x) for x in str(args.nodes).split(",") if x]
    routes = [x for x in str(args.routes).split(",") if x]
    trace = getattr(args, "trace", "") or MOONCAKE
    rows = bps.read_trace(trace, args.requests)
    result = {"trace": os.path.relpath(trace, os.path.dirname(HERE)), "requests": len(rows),
              "length_scale": args.length_scale, "concurrency": args.concurrency, "preset": args.preset,
              "mode": args.mode, "store": args.store, "nodes": node_counts, "routes": routes,
              "route_nodes": args.route_nodes, "mooncake_gain": list(MOONCAKE_GAIN),
              "bounds": bounds(rows, args.length_scale, sorted(set(node_counts + [args.route_nodes]))),
              "configs": []}
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        base = ["--trace", trace, "--requests", str(args.requests), "--length-scale", str(args.length_scale),
                "--concurrency", str(args.concurrency), "--preset", args.preset, "--mode", args.mode,
                "--prefix-sharing", "on", "--check-exact", "--idle-timeout-ms", "600000"]
        for n, route in plan(node_counts, routes, args.route_nodes):
            opts = base + ["--nodes", str(n), "--route", route]
            tag = f"n{n}-{route}"
            local = replay(args, tmp, tag + "-local", opts, log)
            cluster = replay(args, tmp, tag + "-cluster", opts + ["--cluster-store", args.store], log,
                             store=args.store)
            c = {"nodes": n, "route": route, "local": local, "cluster": cluster}
            for side in ("local", "cluster"):
                routing = c[side].get("routing") or (
                    [{"trace_index": i, "node": 0} for i in range(len(rows))] if n == 1 and clean(c[side]) else None)
                c["routed_bound_" + side] = routed_bound(rows, args.length_scale, routing) if routing else None
                c[side].pop("routing", None)  # one entry per request: kept out of the saved figures
            c["cluster_vs_local"] = {k: bps.ratio(cluster.get(k), local.get(k)) for k in (
                "prefill_tokens_saved", "ttft_p50_ms", "ttft_p99_ms", "output_tokens_per_s")}
            result["configs"].append(c)
        result["chat"] = measure_chat(args, tmp, log)
    result["wall_s"] = time.monotonic() - start
    result["all_exact"] = all(clean(c[s]) for c in result["configs"] for s in ("local", "cluster")) and (
        result["chat"] is None or all(clean(result["chat"][s]) for s in ("local", "cluster")))
    return result


# -------------------------------------------------------------------------------------------------------- output

def print_table(result):
    pct, fmt = bps.pct, bps.fmt
    b = result["bounds"]
    a = b["any_node"]
    print(f"bench_cluster: {result['requests']} requests x {result['length_scale']}, {result['wall_s']:.0f} s in all")
    print(f"upper bound, any node: {pct(a['block_share'])} of blocks ({pct(a['page_block_share'])} at page "
          f"granularity); node-local round-robin: " + ", ".join(
              f"{n} nodes {pct(x['block_share'])} ({pct(x['page_block_share'])})" for n, x in b["round_robin"].items()))
    for c in result["configs"]:
        for side in ("local", "cluster"):
            r = c[side]
            print(f"  {c['nodes']} {c['route']:<11} {side:<7} {r.get('served')}/{r.get('total')} exact "
                  f"{r.get('exact_match')} worker {pct(r.get('hit_rate_worker'))} host {pct(r.get('hit_rate_host_local'))}"
                  f" cluster {pct(r.get('hit_rate_cluster'))} miss {pct(r.get('miss_rate'))} saved "
                  f"{r.get('prefill_tokens_saved')} out {fmt(r.get('store_bytes_out_per_s'), 0)} B/s in "
                  f"{fmt(r.get('store_bytes_in_per_s'), 0)} B/s TTFT {fmt(r.get('ttft_p50_ms'), 1)}/"
                  f"{fmt(r.get('ttft_p99_ms'), 1)} ms {fmt(r.get('output_tokens_per_s'))} tok/s"
                  + (f"  ERROR {r['error'][:200]}" if "error" in r else ""))
    ch = result.get("chat")
    if ch:
        print(f"chat turns: {ch['conversations']} conversations x {ch['turns']} turns, answers of "
              f"{ch['output_length']} x {ch['length_scale']} tokens, 2 nodes round-robin:")
        for side in ("local", "cluster"):
            r = ch[side]
            cp = r.get("cluster_pages") or {}
            timeouts = (r.get("cluster_misses") or {}).get("timeout")
            print(f"  {side:<7} {r.get('served')}/{r.get('total')} exact {r.get('exact_match')} saved "
                  f"{r.get('prefill_tokens_saved')} pages imported {cp.get('imported')} (by session key "
                  f"{cp.get('session_imported')}) of {cp.get('lookups')} looked up, {timeouts} timed out TTFT {fmt(r.get('ttft_p50_ms'), 1)}/{fmt(r.get('ttft_p99_ms'), 1)} ms "
                  f"{fmt(r.get('output_tokens_per_s'))} tok/s" + (f"  ERROR {r['error'][:200]}" if "error" in r else ""))
    print(f"all exact and finished: {result['all_exact']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replay", default="build/tools/replay/dhs-replay")
    ap.add_argument("--trace", default=MOONCAKE, help="a Mooncake trace (default the bundled 1000-request slice)")
    ap.add_argument("--requests", type=int, default=800)
    ap.add_argument("--length-scale", type=float, default=0.015625)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--preset", default="dsv4flash-like")
    ap.add_argument("--mode", default="hisparse", choices=bps.SHARING_MODES)
    ap.add_argument("--nodes", default="1,2,4", help="node counts of the round-robin runs")
    ap.add_argument("--routes", default="session,prefix", help="the other routes, on --route-nodes nodes")
    ap.add_argument("--route-nodes", type=int, default=2)
    ap.add_argument("--store", default="local", help="dhs-replay --cluster-store of the cluster-tier runs")
    ap.add_argument("--chat-conversations", type=int, default=9,
                    help="the chat part: conversations (odd: consecutive turns alternate nodes; 0: no chat part)")
    ap.add_argument("--chat-turns", type=int, default=4)
    ap.add_argument("--chat-output-length", type=int, default=4096, help="every turn's trace output length")
    ap.add_argument("--chat-length-scale", type=float, default=0.0625)
    ap.add_argument("--chat-concurrency", type=int, default=3)
    ap.add_argument("--chat-lookup-timeout-ms", type=int, default=100,
                    help="memd's cluster lookup deadline in the chat part (a loaded machine times out at 5 ms)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    result = measure(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print_table(result)
    return 0 if result["all_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
