#!/usr/bin/env python3
"""tests/tools/bench_cluster_test.py: tools/bench_cluster.py (issue 26's measurement): the node-local upper bound
(a block reusable only when an earlier request ON THE SAME NODE had its chain) against the any-node bound, on
hand-made traces whose answers are worked out below by hand, and the figures taken from a canned dhs-replay report
(the cluster tier's blocks out of the host hits, the per-node sums, null when memd reported nothing).

Usage: bench_cluster_test.py PATH/TO/tools/bench_cluster.py   (exit 0 = pass)
"""
import importlib.util
import math
import sys
import unittest

bench = None  # the module, loaded from argv[1]


class NodeLocalBound(unittest.TestCase):
    # T = 10 tokens a block, 20-token requests: 2 complete blocks each. Chains: A (1), (1,2); B (1), (1,3);
    # C = A again; D = B again.
    REQS = [(20, [1, 2]), (20, [1, 3]), (20, [1, 2]), (20, [1, 3])]

    def test_one_node_equals_the_any_node_bound(self):
        # Any node: A 0 seen; B (1) seen; C both; D both: 0 + 1 + 2 + 2 = 5 of 8.
        any_node = bench.bps.upper_bound(self.REQS, 10)
        self.assertEqual((any_node["blocks"], any_node["blocks_seen"]), (8, 5))
        one = bench.node_local_bound(self.REQS, 10, bench.round_robin(4, 1))
        self.assertEqual((one["blocks"], one["blocks_seen"], one["nodes"]), (8, 5, 1))
        self.assertAlmostEqual(one["block_share"], 5 / 8)

    def test_round_robin_reaches_only_repeats_on_the_same_node(self):
        # 2 nodes round-robin: node 0 gets A, C (C sees both: 2), node 1 gets B, D (D sees both: 2): 4 of 8; B's
        # block (1), seen on node 0, is not reachable on node 1.
        two = bench.node_local_bound(self.REQS, 10, bench.round_robin(4, 2))
        self.assertEqual((two["blocks"], two["blocks_seen"], two["nodes"]), (8, 4, 2))
        self.assertEqual((two["prefill_tokens"], two["tokens_seen"]), (80, 40))
        self.assertAlmostEqual(two["token_share"], 0.5)
        # 4 nodes: every request alone on its node: nothing reusable.
        four = bench.node_local_bound(self.REQS, 10, bench.round_robin(4, 4))
        self.assertEqual((four["blocks_seen"], four["nodes"]), (0, 4))
        # A routing that puts A and B on node 0 and C, D on node 1: node 0 B sees (1): 1; node 1: C 0, D (1): 1.
        other = bench.node_local_bound(self.REQS, 10, [0, 0, 1, 1])
        self.assertEqual(other["blocks_seen"], 2)

    def test_page_granularity_sums_over_nodes(self):
        # p = 16 rows: 40-token requests of 4 blocks. Node 0: A, A again (4 seen, pages min(40 // 16, 39 // 16) = 2,
        # covering min(4, 32 // 10) = 3 blocks, 32 tokens); node 1: B, B again likewise. Round-robin on 2 nodes with
        # A, B, A, B: 3 + 3 blocks at page granularity, 64 tokens.
        reqs = [(40, [1, 2, 3, 4]), (40, [5, 6, 7, 8]), (40, [1, 2, 3, 4]), (40, [5, 6, 7, 8])]
        b = bench.node_local_bound(reqs, 10, bench.round_robin(4, 2), page_rows=16)
        self.assertEqual((b["blocks_seen"], b["blocks_page_bound"], b["tokens_page_bound"]), (8, 6, 64))
        self.assertAlmostEqual(b["page_block_share"], 6 / 16)

    def test_bounds_and_routed_bound_from_trace_rows(self):
        # Rows at length scale 0.5 (T = 256): A 1024 -> 512 tokens (2 blocks), then A's next turn (768 tokens,
        # 3 complete blocks, ids 1, 2, 3), then A again.
        rows = [{"input_length": 1024, "hash_ids": [1, 2]}, {"input_length": 1536, "hash_ids": [1, 2, 3]},
                {"input_length": 1024, "hash_ids": [1, 2]}]
        b = bench.bounds(rows, 0.5, [1, 2])
        self.assertEqual(b["block_tokens"], 256)
        # Any node: 0 + 2 + 2 = 4 of 7. Round-robin on 2: node 0 rows 0, 2 (2 seen), node 1 row 1 (0): 2 of 7.
        self.assertEqual((b["any_node"]["blocks"], b["any_node"]["blocks_seen"]), (7, 4))
        self.assertEqual(b["round_robin"]["1"]["blocks_seen"], 4)
        self.assertEqual(b["round_robin"]["2"]["blocks_seen"], 2)
        # All three on node 1 in trace order (session routing): 0 + 2 + 2 = 4, as on one node.
        same = [{"trace_index": i, "node": 1} for i in range(3)]
        self.assertEqual(bench.routed_bound(rows, 0.5, same)["blocks_seen"], 4)
        split = [{"trace_index": 0, "node": 0}, {"trace_index": 2, "node": 1}, {"trace_index": 1, "node": 1}]
        # node 0: row 0 alone (0); node 1: row 2 (0) then row 1 ((1), (1,2) seen: 2): 2.
        self.assertEqual(bench.routed_bound(rows, 0.5, split)["blocks_seen"], 2)
        # A routing that does not name every request gives no bound.
        self.assertIsNone(bench.routed_bound(rows, 0.5, same[:2]))


class Figures(unittest.TestCase):
    def report(self, cluster):
        node = lambda i, c: {"node": i, "requests": 2, "hits_blocks": {}, "cluster": c,
                             "store_bytes_out": 1000 * (i + 1) if c else None,
                             "store_bytes_in": 500 * (i + 1) if c else None,
                             "store_bytes_out_per_s": 100.0 * (i + 1) if c else None,
                             "store_bytes_in_per_s": 50.0 * (i + 1) if c else None}
        c0 = {"lookups": 4, "hits": 2, "imported": 2, "session_imported": 1, "published": 3,
              "misses": {"absent": 1, "timeout": 1}, "memd_restarts_seen": 2} if cluster else None
        c1 = {"lookups": 6, "hits": 1, "imported": 1, "session_imported": 0, "published": 5,
              "misses": {"absent": 2, "timeout": 3, "store_down": 0}, "memd_restarts_seen": 0} if cluster else None
        return {"requests_served": 4, "requests_total": 4, "requests_failed": 0, "exact_match": True,
                "trace": {"block_tokens": 8}, "prefix": {"lookups": 100, "hits_host": 30, "hits_worker": 0},
                "prefill_tokens_saved": 240, "output_tokens_per_s": 10.0, "ttft_ms": {"p50": 5.0, "p99": 9.0},
                "multi_node": {"nodes": 2, "route": "session", "cluster_store": "local" if cluster else None,
                               "cluster_counters": "measured" if cluster else "not reported by memd",
                               "sessions": 3, "next_turns": 1, "kv_events": {"settle_timeouts": 0},
                               "per_node": [node(0, c0), node(1, c1)],
                               "routing": [{"trace_index": i, "node": i % 2, "session": i, "turn": 0,
                                            "reason": "session_new", "matched_blocks": 0} for i in range(4)]}}

    def test_cluster_blocks_come_out_of_the_host_hits(self):
        f = bench.figures(self.report(True))
        # 3 pages imported (2 + 1) of 64 rows = 8 blocks of 8 tokens each: 24 of the 30 host-hit blocks.
        self.assertEqual(f["cluster_pages"], {"lookups": 10, "hits": 3, "imported": 3, "session_imported": 1,
                                              "published": 8})
        self.assertEqual((f["hits_cluster"], f["hits_host_local"], f["misses"]), (24, 6, 70))
        self.assertAlmostEqual(f["hit_rate_cluster"], 0.24)
        self.assertAlmostEqual(f["hit_rate_host_local"], 0.06)
        self.assertEqual((f["store_bytes_out"], f["store_bytes_in"]), (3000, 1500))
        self.assertEqual((f["store_bytes_out_per_s"], f["store_bytes_in_per_s"]), (300.0, 150.0))
        self.assertEqual((f["nodes"], f["route"], f["sessions"]), (2, "session", 3))
        # Issue 26 review: the miss reasons and memd restarts seen, summed over the nodes.
        self.assertEqual(f["cluster_misses"], {"absent": 3, "timeout": 4, "store_down": 0})
        self.assertEqual(f["memd_restarts_seen"], 2)
        self.assertEqual([r["node"] for r in f["routing"]], [0, 1, 0, 1])

    def test_cluster_blocks_never_exceed_the_host_hits(self):
        r = self.report(True)
        r["prefix"]["hits_host"] = 10
        f = bench.figures(r)
        self.assertEqual((f["hits_cluster"], f["hits_host_local"]), (10, 0))

    def test_no_cluster_tier_gives_zero_and_null_bytes(self):
        f = bench.figures(self.report(False))
        self.assertEqual((f["hits_cluster"], f["hits_host_local"]), (0, 30))
        self.assertIsNone(f["store_bytes_out_per_s"])
        self.assertEqual(f["cluster_pages"]["imported"], None)
        self.assertIsNone(f["cluster_misses"])
        self.assertIsNone(f["memd_restarts_seen"])

    def test_one_node_with_a_store_is_measured(self):
        # Issue 26 review: a 1-node run with --cluster-store reports its node as multi_node.per_node[0].
        r = self.report(True)
        m = r["multi_node"]
        m["nodes"], m["route"], m["per_node"] = 1, "round-robin", m["per_node"][1:]
        m["per_node"][0]["node"] = 0
        f = bench.figures(r, store="local")
        self.assertEqual(f["nodes"], 1)
        # 1 page imported of 64 rows = 8 blocks of 8 tokens: 8 of the 30 host hits.
        self.assertEqual((f["hits_cluster"], f["hits_host_local"]), (8, 22))
        self.assertEqual(f["cluster_pages"]["lookups"], 6)
        self.assertEqual(f["cluster_misses"]["timeout"], 3)

    def test_one_node_with_a_store_reports_no_cluster_counters(self):
        # A report from before the 1-node per_node (multi_node null with one node): the run's store (given by the
        # caller) makes the cluster column unknown (None, rate NaN), never a 0 that was not measured; without a
        # store it is 0.
        r = self.report(True)
        r["multi_node"] = None
        f = bench.figures(r, store="local")
        self.assertEqual(f["nodes"], 1)
        self.assertIsNone(f["hits_cluster"])
        self.assertTrue(math.isnan(f["hit_rate_cluster"]))
        self.assertEqual(f["hits_host_local"], 30)
        self.assertEqual(bench.figures(r)["hits_cluster"], 0)
        # Several nodes, a store, but memd reported no counters: unknown too.
        r2 = self.report(True)
        for n in r2["multi_node"]["per_node"]:
            n["cluster"] = None
        self.assertIsNone(bench.figures(r2)["hits_cluster"])

    def test_chat_trace(self):
        # Two conversations (rows A: 1100 tokens, ids 0, 1, 2; B: 600, ids 0, 3) x 3 turns, answers of 100, 2048 new
        # tokens a turn, 512-token blocks. Turn-major: A0 B0 A1 B1 A2 B2. A1: 1100 + 100 + 2048 = 3248 tokens, A0's
        # 2 complete blocks (0, 1) then new ids to ceil(3248 / 512) = 7 ids; A2: 3248 + 2148 = 5396, A1's 6 complete
        # blocks then 5 new (11 ids). B1: 600 + 2148 = 2748, B0's 1 complete block (0) then 5 new (6 ids).
        import json
        import os
        import tempfile
        rows = [{"input_length": 1100, "output_length": 7, "hash_ids": [0, 1, 2]},
                {"input_length": 600, "output_length": 9, "hash_ids": [0, 3]}]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "chat.jsonl")
            out = bench.chat_trace(path, rows, 2, 3, 100)
            with open(path) as f:
                written = [json.loads(line) for line in f]
        self.assertEqual(written, out)
        self.assertEqual([r["input_length"] for r in out], [1100, 600, 3248, 2748, 5396, 4896])
        self.assertEqual([r["output_length"] for r in out], [100] * 6)
        self.assertEqual([len(r["hash_ids"]) for r in out], [3, 2, 7, 6, 11, 10])
        self.assertEqual(out[2]["hash_ids"][:2], [0, 1])
        self.assertEqual(out[4]["hash_ids"][:6], out[2]["hash_ids"][:6])
        self.assertEqual(out[3]["hash_ids"][:1], [0])
        self.assertEqual(out[5]["hash_ids"][:5], out[3]["hash_ids"][:5])
        # The ids a turn appends are new: never one another conversation or turn appended (no other chain extends it).
        appended = [i for t in range(2, 6) for i in out[t]["hash_ids"][out[t - 2]["input_length"] // 512:]]
        self.assertEqual(len(appended), 5 + 5 + 5 + 5)
        self.assertEqual(len(set(appended)), len(appended))
        self.assertTrue(all(i >= 10**12 for i in appended))

    def test_plan(self):
        self.assertEqual(bench.plan([1, 2, 4], ["session", "prefix"], 2),
                         [(1, "round-robin"), (2, "round-robin"), (4, "round-robin"), (2, "session"),
                          (2, "prefix")])


if __name__ == "__main__":
    spec = importlib.util.spec_from_file_location("bench_cluster", sys.argv.pop(1))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    unittest.main()
