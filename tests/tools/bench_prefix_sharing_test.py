#!/usr/bin/env python3
"""tests/tools/bench_prefix_sharing_test.py: the upper bound of tools/bench_prefix_sharing.py (issue 24's
measurement): the share of complete prefix blocks (and prefill tokens) whose whole chain appeared in an earlier
request, on tiny hand-made traces whose answers are worked out below by hand.

Usage: bench_prefix_sharing_test.py PATH/TO/tools/bench_prefix_sharing.py   (exit 0 = pass)
"""
import importlib.util
import sys
import unittest

bench = None  # the module, loaded from argv[1]


class ScaleLength(unittest.TestCase):
    def test_rounds_half_away_from_zero_like_std_round(self):
        # 1021 * 0.5 = 510.5: std::round gives 511 (Python's round() would give 510); 1023 * 0.5 = 511.5 -> 512
        # (truncation would give 511); never below 1.
        self.assertEqual(bench.scale_length(1021, 0.5), 511)
        self.assertEqual(bench.scale_length(1023, 0.5), 512)
        self.assertEqual(bench.scale_length(512, 0.02), 10)  # 10.24
        self.assertEqual(bench.scale_length(3, 0.01), 1)


class UpperBound(unittest.TestCase):
    # Five Mooncake-like rows at length scale 0.5: block T = 256 tokens.
    ROWS = [
        {"input_length": 1024, "hash_ids": [1, 2]},        # A: 512 tokens, 2 complete blocks: (1), (1,2) new
        {"input_length": 1500, "hash_ids": [1, 2, 3]},     # B: 750 tokens, 2 complete: (1), (1,2) seen; block 2
                                                           #    (id 3) is partial: not named
        {"input_length": 2048, "hash_ids": [1, 5, 6, 7]},  # C: 1024 tokens, 4 complete: (1) seen, (1,5), (1,5,6),
                                                           #    (1,5,6,7) new
        {"input_length": 2560, "hash_ids": [9, 5]},        # D: 1280 tokens, 5 complete: (9), (9,5) new (id 5 after
                                                           #    another block: another chain), blocks 2-4 private
        {"input_length": 1023, "hash_ids": [1, 5, 6]},     # E: 511.5 -> 512 tokens, ids kept ceil(512/256) = 2:
                                                           #    (1), (1,5) seen
    ]

    def test_hand_made_trace(self):
        t, reqs = bench.scaled_requests(self.ROWS, 0.5)
        self.assertEqual(t, 256)
        self.assertEqual(reqs[1], (750, [1, 2, 3]))  # ceil(750 / 256) = 3 ids kept
        self.assertEqual(reqs[4], (512, [1, 5]))     # the third id dropped: it would start at token 512
        b = bench.upper_bound(reqs, t)
        # blocks 2 + 2 + 4 + 5 + 2 = 15; seen 0 + 2 + 1 + 0 + 2 = 5; prefill 512 + 750 + 1024 + 1280 + 512 = 4078.
        self.assertEqual(b["blocks"], 15)
        self.assertEqual(b["blocks_seen"], 5)
        self.assertAlmostEqual(b["block_share"], 5 / 15)
        self.assertEqual(b["prefill_tokens"], 4078)
        self.assertEqual(b["tokens_seen"], 5 * 256)
        self.assertAlmostEqual(b["token_share"], 1280 / 4078)

    def test_order_matters_and_private_blocks_never_repeat(self):
        # The same two requests the other way round: B first names (1), (1,2) new; A then sees both.
        t, reqs = bench.scaled_requests([self.ROWS[1], self.ROWS[0]], 0.5)
        self.assertEqual(bench.upper_bound(reqs, t)["blocks_seen"], 2)
        # No hash ids: every complete block is the request's own, equal lengths or not.
        b = bench.upper_bound([(10, []), (10, []), (12, [])], 5)
        self.assertEqual((b["blocks"], b["blocks_seen"]), (6, 0))

    def test_counted_from_counts_later_requests_only(self):
        reqs = [(20, [1, 2]), (20, [1, 2]), (20, [1, 3])]  # T = 10: 2 blocks each
        b = bench.upper_bound(reqs, 10, counted_from=1)
        # Counted: request 1 ((1), (1,2) seen in request 0) and request 2 ((1) seen, (1,3) new).
        self.assertEqual((b["blocks"], b["blocks_seen"], b["prefill_tokens"]), (4, 3, 40))

    def test_page_granular_bound(self):
        # T = 10 tokens a block, p = 16 rows a page. A names 4 new blocks. B: 3 blocks seen (its 4th id differs):
        # pages min(30 // 16, 44 // 16) = 1, covering min(3, 16 // 10) = 1 block, 16 tokens. C (A's chain, 41 tokens):
        # 4 seen, pages min(40 // 16, 40 // 16) = 2, min(4, 32 // 10) = 3 blocks, 32 tokens. D: 33 tokens, 3 complete
        # blocks (the 4th id kept, its block partial): 3 seen, pages min(30 // 16, 32 // 16) = 1: 1 block, 16 tokens.
        reqs = [(40, [1, 2, 3, 4]), (45, [1, 2, 3, 9]), (41, [1, 2, 3, 4]), (33, [1, 2, 3, 4])]
        b = bench.upper_bound(reqs, 10, page_rows=16)
        self.assertEqual((b["blocks"], b["blocks_seen"]), (4 + 4 + 4 + 3, 0 + 3 + 4 + 3))
        self.assertEqual((b["blocks_page_bound"], b["tokens_page_bound"]), (1 + 3 + 1, 16 + 32 + 16))
        self.assertAlmostEqual(b["page_block_share"], 5 / 15)
        # The last input token's page is never imported: 32 tokens of 8-token blocks, all 4 seen, 2 pages of 16 rows
        # inside them, but only (32 - 1) // 16 = 1 wholly before the last token: 2 blocks, 16 tokens.
        b = bench.upper_bound([(32, [1, 2, 3, 4]), (32, [1, 2, 3, 4])], 8, page_rows=16)
        self.assertEqual((b["blocks_seen"], b["blocks_page_bound"], b["tokens_page_bound"]), (4, 2, 16))

    def test_synthetic_workload(self):
        # --prefixes 2 --prefix-tokens 1024 --suffix-tokens 16, 3 sessions: block min(512, 1024) = 512; the
        # preparation computes both prefixes; each session has 1040 // 512 = 2 complete blocks, both its prefix's
        # (session i = prefix i mod 2): 6 of 6 seen, 6 * 512 = 3072 of 3 * 1040 = 3120 prefill tokens.
        b = bench.synthetic_bound(2, 1024, 16, 3)
        self.assertEqual((b["block_tokens"], b["blocks"], b["blocks_seen"]), (512, 6, 6))
        self.assertEqual((b["prefill_tokens"], b["tokens_seen"]), (3120, 3072))
        # A suffix of a whole block adds a private complete block per session: 9 blocks, 6 seen.
        b = bench.synthetic_bound(2, 1024, 512, 3)
        self.assertEqual((b["blocks"], b["blocks_seen"]), (9, 6))
        self.assertEqual(bench.prefix_hash_id(0, 3), (1 << 32) + 3)


if __name__ == "__main__":
    spec = importlib.util.spec_from_file_location("bench_prefix_sharing", sys.argv.pop(1))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    unittest.main()
