#!/usr/bin/env python3
"""tests/tools/perf_report_test.py: tools/perf_report.py renders docs/performance.md from saved figures
(`--from-json`, no benchmark runs): table values equal the input's figures, ratios to resident are taken within a
repeat and their median is shown, the fit point and the met / not met verdicts follow the figures, the plots are
PNG files the document links, and hand-written text outside the generated block is kept.

Usage: perf_report_test.py PATH/TO/tools/perf_report.py   (exit 0 = pass)
"""
import copy
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = None  # set from argv
NAN = float("nan")


def run_figures(served, sessions, tps, tpot, host=0.0):
    """One replay's figures as tools/bench_common.figures() makes them."""
    return {"served": served, "sessions": sessions, "reclaims": 0, "repopulated_pages": 0, "census_direct": 1 - host,
            "census_hot": 0.0, "census_host": host, "allocation_wait_share": 0.0, "ttft_p50_ms": 100.0,
            "ttft_p99_ms": 200.0, "tpot_p50_ms": tpot, "output_tokens_per_s": tps}


def points(spec):
    """spec: {(C, mode): [(sessions, tok/s, tpot, host) per repeat]} -> bench_modes points (runs only matter)."""
    return [{"concurrency": c, "mode": m, "runs": [run_figures(4, s, t, p, h) for s, t, p, h in runs]}
            for (c, m), runs in spec.items()]


# Three repeats. C = 1: every history fits (resident admits 1 of 1); C = 4: resident admits 2 of 4.
MODES_SPEC = {
    (1, "resident"): [(1, 10.0, 50.0, 0.0), (1, 20.0, 50.0, 0.0), (1, 30.0, 50.0, 0.0)],
    (1, "hisparse"): [(1, 10.0, 55.0, 0.4), (1, 19.0, 55.0, 0.4), (1, 33.0, 55.0, 0.4)],
    (1, "adaptive"): [(1, 9.8, 51.0, 0.0), (1, 19.6, 51.0, 0.0), (1, 29.7, 51.0, 0.0)],
    (4, "resident"): [(2, 10.0, 60.0, 0.0), (2, 10.0, 60.0, 0.0), (2, 10.0, 60.0, 0.0)],
    (4, "hisparse"): [(4, 12.0, 70.0, 0.4), (4, 11.0, 70.0, 0.4), (4, 13.0, 70.0, 0.4)],
    (4, "adaptive"): [(4, 13.0, 65.0, 0.02), (4, 12.0, 65.0, 0.02), (4, 12.0, 65.0, 0.02)],
}


def canned():
    link = {"model": "pcie5", "host_to_device_gb_per_s": 55.0, "device_to_host_gb_per_s": 55.0, "latency_us": 5.0}
    return {
        "meta": {"command": "python3 tools/perf_report.py --quick", "date": "2026-11-30 12:00 UTC", "nproc": 2,
                 "cpu": "Test CPU 9000", "commit": "0123abcd", "size": "quick"},
        "planner": {
            "glm5-like": {"resident_bytes_per_session": 5000, "hierarchical_bytes_per_session": 400,
                          "hierarchical_with_drafter_bytes_per_session": 450, "resident_over_hierarchical": 12.5,
                          "context_tokens": 100000},
            "dsv4flash-like": {"resident_bytes_per_session": 3000, "hierarchical_bytes_per_session": 1000,
                               "hierarchical_with_drafter_bytes_per_session": 1100,
                               "resident_over_hierarchical": 3.0, "context_tokens": 100000}},
        "micro": {
            "repetitions": 3,
            "host_recovery": [
                {"rows": 1, "recovery_vs_memcpy": 0.1, "recovery_vs_memcpy_cpu": 0.5, "recovery_GBps": 1.0,
                 "memcpy_GBps": 10.0, "recovery_ns_per_step": 400.0},
                {"rows": 2048, "recovery_vs_memcpy": 0.75, "recovery_vs_memcpy_cpu": 0.7, "recovery_GBps": 15.0,
                 "memcpy_GBps": 20.0, "recovery_ns_per_step": 60000.0}],
            "admission": [{"admitted": 100, "decisions_per_s": 200000.0},
                          {"admitted": 1000, "decisions_per_s": 150000.0}],
            "grant_rtt": [{"capacity_pages": 4096, "p50_us": 40.0, "p99_us": 80.0, "p999_us": 150.0},
                          {"capacity_pages": 65536, "p50_us": 70.0, "p99_us": 120.0, "p999_us": 900.0}]},
        "modes": {"preset": "bench-wide", "requests": 4, "length_scale": 0.05, "trace": None,
                  "hbm_budget_bytes": 1500000, "link_model": link, "repeat": 3, "points": points(MODES_SPEC)},
        "long_context": {"error": "bench_modes: resident run 1 failed (exit 2)"},
        "speculation": {"mode": "adaptive", "preset": "bench-wide", "requests": 3, "length_scale": 0.05,
                        "hbm_budget_bytes": 1500000, "block": 4, "link_model": "pcie5", "distill_texts": 0,
                        "repeat": 1, "points": [spec_point(1, "off", 1, 20.0, 10.0, 1.0, 1.0, 1.0),
                                                spec_point(1, "fixed", 1, 30.0, 8.0, 1.0, 1.5, 0.8, 1.25),
                                                spec_point(3, "off", 3, 40.0, 12.0, 1.0, 1.0, 1.0),
                                                spec_point(3, "fixed", 2, 25.0, 13.0, 0.667, 0.625, 1.08, 3.1)]},
    }


def spec_point(c, config, sessions, tpot, tps, n_ratio, tpot_ratio, tps_ratio, acceptance=float("nan")):
    """One row of tools/bench_speculation.py's --json result (its medians and ratios to off, as measure() makes them)."""
    med = {"sessions": sessions, "acceptance_length": acceptance, "tpot_p50_ms": tpot, "output_tokens_per_s": tps,
           "tokens_per_s_wo_proposer": tps}

    def rel(x):
        return {"median": x, "min": x, "max": x}
    return {"concurrency": c, "config": config, "median": med, "sessions_vs_off": rel(n_ratio),
            "tpot_vs_off": rel(tpot_ratio), "throughput_vs_off": rel(tps_ratio), "runs": [med]}


def prefix_canned():
    """tools/bench_prefix.py's result for one context (1024), C = 1 and 4, run through its own analyse()."""
    sys.path.insert(0, os.path.dirname(SCRIPT))
    import bench_prefix

    def run(sessions, tps, p50, p99, host=0.0, spec=None):
        r = {"served": sessions * 2 if sessions > 1 else 2, "total": 8, "sessions": sessions, "output_tokens": 100,
             "output_tokens_per_s": tps, "tpot_p50_ms": p50, "tpot_p99_ms": p99, "ttft_p50_ms": 50.0,
             "allocation_wait_share": 0.1, "census_direct": 1 - host, "census_hot": 0.0, "census_host": host,
             "reclaims": 1, "repopulated_pages": 2, "host_bytes_per_token": 576.0, "preparation_s": 3.0,
             "in_flight_max": sessions, "in_flight_mean": sessions * 0.9, "elapsed_s": 5.0,
             "prefix_blocks_computed": 0, "preparation_blocks_computed": 4, "speculate": spec or "off",
             "acceptance_length_mean": 2.0 if spec else None,
             "step_profile": {"steps": 10, "queries": 40, "wall_ms": 90, "model_ms": 50, "index_topk_ms": 20,
                              "fetch_ms": 10, "append_ms": 5, "release_ms": 1, "outside_ms": 3}}
        r["served"] = 8
        return r

    pts = []
    for c, res, his, ada in ((1, (1, 10.0, 10.0, 11.0), (1, 9.0, 11.0, 12.0), (1, 9.9, 10.1, 11.0)),
                             (4, (2, 20.0, 10.0, 15.0), (4, 29.0, 12.5, 21.0), (4, 30.0, 12.0, 20.0))):
        for mode, v in (("resident", res), ("hisparse", his), ("adaptive", ada)):
            pts.append({"context": 1024, "concurrency": c, "mode": mode, "run": run(*v, host=0.3 if mode != "resident"
                                                                                     else 0.0),
                        "exact_sample": {"compared": 4, "differ": 0}})
    pts.append({"context": 1024, "concurrency": 4, "mode": "adaptive+online", "run": run(4, 27.0, 15.0, 25.0,
                                                                                         spec="synthetic"),
                "exact_sample": {"compared": 4, "differ": 0}})
    pts[-1]["run"].update(proposer_s=2.0, block_width={"4": 3, "2": 1})  # 2 of its 5 s in the proposer
    result = {"preset": "bench-wide", "prefixes": 2, "contexts": [1024], "concurrency": [1, 4], "sessions_per_c": 2,
              "suffix_tokens": 16, "output_tokens": 16, "hbm_budget_bytes": 1000000, "resident_sessions_sized": 2,
              "link_model": "pcie5", "sample_every": 2, "points": pts,
              "planner": {"1024": {"sessions_per_gpu": {"resident": 3, "hierarchical": 9},
                                   "resident_bytes_per_session": 300000, "hierarchical_bytes_per_session": 100000}}}
    return bench_prefix.analyse(result)


def table_row(doc, first_cells):
    """The cells of the first Markdown table row whose leading cells equal first_cells."""
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[:len(first_cells)] == list(first_cells):
            return cells
    raise AssertionError(f"no table row starting with {first_cells}")


def target(doc, words):
    """(measured, verdict) of the targets-table row whose target text contains `words`."""
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and words in cells[0]:
            return cells[1], cells[2].strip("*")
    raise AssertionError(f"no target row with {words!r}")


class PerfReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def render(self, fig, doc_text=None):
        src = os.path.join(self.dir, "figures.json")
        with open(src, "w") as f:
            json.dump(fig, f)
        out = os.path.join(self.dir, "docs", "performance.md")
        if doc_text is not None:
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "w") as f:
                f.write(doc_text)
        proc = subprocess.run([sys.executable, SCRIPT, "--from-json", src, "--out", out, "--plots",
                               os.path.join(self.dir, "docs", "perf")], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(out) as f:
            return f.read()

    def test_table_values_and_ratios(self):
        doc = self.render(canned())
        # C = 1 resident: tok/s median of 10, 20, 30.
        self.assertEqual(table_row(doc, ["1", "resident"])[3:6], ["1", "20.00", "1.000"])
        # adaptive / resident within each repeat: 0.98, 0.98, 0.99 -> median 0.98, range [0.98, 0.99].
        row = table_row(doc, ["1", "adaptive"])
        self.assertEqual(row[4:8], ["19.60", "0.980 [0.98, 0.99]", "51.00", "1.020"])
        # hisparse: 1.0, 0.95, 1.1 -> 1.0 [0.95, 1.10]; census host 0.4.
        row = table_row(doc, ["1", "hisparse"])
        self.assertEqual(row[5], "1.000 [0.95, 1.10]")
        self.assertEqual(row[8], "0.600 / 0.000 / 0.400")
        # C = 4 adaptive: 1.3, 1.2, 1.2 -> 1.2 [1.20, 1.30]; sessions 4 vs resident 2.
        row = table_row(doc, ["4", "adaptive"])
        self.assertEqual(row[3], "4")
        self.assertEqual(row[5], "1.200 [1.20, 1.30]")
        self.assertEqual(table_row(doc, ["4", "resident"])[3], "2")

    def test_fit_point_and_per_token_cost(self):
        doc = self.render(canned())
        self.assertIn("**Resident histories stop fitting at C = 4**: resident admitted 2 sessions", doc)
        self.assertIn("sessions ratio adaptive / resident 2.00x", doc)
        # adaptive / hisparse at C = 4 within a repeat: 13/12, 12/11, 12/13 -> median 13/12 = 1.083.
        self.assertIn("(adaptive / hisparse 1.083 [0.92, 1.09]x)", doc)
        # Equal batch only at C = 1: TPOT 55 / 50 -> +10.0 %, 51 / 50 -> +2.0 %.
        self.assertIn("C = 1 (1 sessions each): TPOT p50 resident 50.00 ms, hisparse 55.00 ms (+10.0% per token", doc)
        self.assertIn("adaptive 51.00 ms (+2.0%", doc)
        self.assertNotIn("C = 4 (", doc)

    def test_verdicts(self):
        doc = self.render(canned())
        self.assertEqual(target(doc, "within 3%"), ("short contexts C=1: 0.980x", "met"))
        self.assertEqual(target(doc, "sessions > resident"),
                         ("short contexts C=4: sessions 4 vs 2, tokens/s 1.200x", "met"))
        self.assertEqual(target(doc, "sessions >= hisparse"),
                         ("short contexts C=4: sessions 4 vs 4, tokens/s 1.083x", "met"))
        self.assertEqual(target(doc, "glm5-like"), ("12.50x (dhsctl plan)", "met"))
        self.assertEqual(target(doc, "host recovery")[1], "not met")
        self.assertTrue(target(doc, "host recovery")[0].startswith("0.750"))
        self.assertEqual(target(doc, "admission"), ("150.0k/s", "met"))
        self.assertEqual(target(doc, "p99 at most 100"),
                         ("4096 pages: p99 80.0 µs; 65536 pages: p99 120.0 µs", "not met"))
        self.assertIn("FAILED: bench_modes: resident run 1 failed (exit 2)", doc)

    def test_verdicts_follow_the_figures(self):
        fig = canned()
        spec = copy.deepcopy(MODES_SPEC)
        spec[(1, "adaptive")] = [(1, 9.6, 51.0, 0.0), (1, 19.2, 51.0, 0.0), (1, 28.8, 51.0, 0.0)]  # 0.96
        spec[(4, "adaptive")] = [(4, 11.0, 65.0, 0.0), (4, 10.0, 65.0, 0.0), (4, 10.5, 65.0, 0.0)]
        fig["modes"]["points"] = points(spec)
        fig["planner"]["glm5-like"]["hierarchical_bytes_per_session"] = 625  # 8x
        fig["micro"]["host_recovery"][1]["recovery_vs_memcpy"] = 0.85
        fig["micro"]["admission"] = {"error": "memd_bench_admission exited -6: CHECK failed"}
        fig["micro"]["grant_rtt"][1]["p99_us"] = 99.0
        doc = self.render(fig)
        self.assertEqual(target(doc, "within 3%"), ("short contexts C=1: 0.960x", "not met"))
        # adaptive / resident 1.1, 1.0, 1.05 -> 1.05 (> 1, sessions 4 > 2); / hisparse 11/12, 10/11, 10.5/13 < 1.
        self.assertEqual(target(doc, "sessions > resident")[1], "met")
        self.assertEqual(target(doc, "sessions >= hisparse")[1], "not met")
        self.assertEqual(target(doc, "glm5-like"), ("8.00x (dhsctl plan)", "not met"))
        self.assertEqual(target(doc, "host recovery")[1], "met")
        self.assertEqual(target(doc, "admission"),
                         ("benchmark failed: memd_bench_admission exited -6: CHECK failed", "not measured"))
        self.assertEqual(target(doc, "p99 at most 100")[1], "met")

    def test_planner_and_meta(self):
        doc = self.render(canned())
        self.assertEqual(table_row(doc, ["glm5-like"]), ["glm5-like", "100000", "5000", "400", "450", "12.50x"])
        self.assertEqual(table_row(doc, ["dsv4flash-like"])[5], "3.00x")
        self.assertIn("Generated by `python3 tools/perf_report.py --quick` on 2026-11-30 12:00 UTC", doc)
        self.assertIn("2 CPUs, Test CPU 9000; git commit 0123abcd", doc)
        self.assertIn("2048 rows per step: 0.750 (15.00 vs 20.00 GB/s; 60.0 µs per step)", doc)

    def test_speculation_section(self):
        """The speculation table shows the saved medians and ratios; `pays` is N_spec/N_base > TPOT_spec/TPOT_base
        (brief §6): no at C = 1 (1.000 vs 1.500), yes at C = 3 (0.667 vs 0.625)."""
        doc = self.render(canned())
        self.assertIn("## With and without speculation under one budget", doc)
        self.assertEqual(table_row(doc, ["1", "off"]),
                         ["1", "off", "1", "-", "20.00", "10.00", "10.00", "1.000", "1.000", "1.000", ""])
        self.assertEqual(table_row(doc, ["1", "fixed"]),
                         ["1", "fixed", "1", "1.25", "30.00", "8.00", "8.00", "1.000", "1.500", "0.800", "no"])
        self.assertEqual(table_row(doc, ["3", "fixed"]),
                         ["3", "fixed", "2", "3.10", "25.00", "13.00", "13.00", "0.667", "0.625", "1.080", "yes"])
        self.assertIn("GPU KV budget 1500000 bytes, block K = 4, link model pcie5", doc)
        self.assertIn("`fixed`: the built-in drafter", doc)
        self.assertNotIn("`synthetic-C`", doc)  # no synthetic configuration ran: not described
        fig = canned()
        fig["speculation"] = {"error": "bench_speculation: fixed run 1 failed (exit 2)"}
        self.assertIn("FAILED: bench_speculation: fixed run 1 failed (exit 2)", self.render(fig))

    def test_prefix_section(self):
        """Issue 27's section: per-context table rows with the saved figures and ratios to resident, the knee found
        from resident's sessions (the lowest C where it admitted fewer than C) beside the planner's figures, the
        speculation rows (`pays` = N_spec/N_base > TPOT_spec/TPOT_base), the step split per decode step, two plots."""
        fig = canned()
        fig["prefix"] = prefix_canned()
        full = self.render(fig)
        self.assertIn("## The seed's regime: closed loop over prepared prefixes (issue 27)", full)
        doc = full[full.index("## The seed's regime"):]  # the mode sections above have rows starting "| 4 | adaptive"
        row = table_row(doc, ["4", "adaptive"])
        # served, sessions, tok/s, tok/s vs res (30 / 20), sessions vs res (4 / 2), TPOT p50, p99, TPOT vs res (12/10)
        self.assertEqual(row[2:10], ["8/8", "4", "30.00", "1.500", "2.00", "12.00", "20.00", "1.200"])
        self.assertEqual(row[-1], "4/4")  # exact sample
        self.assertEqual(table_row(doc, ["4", "resident"])[-1], "ref")  # the reference, not compared with itself
        self.assertIn("Knee at 1024 tokens: resident admitted fewer sessions than C first at C = 4 (most resident "
                      "sessions at once: 2)", doc)
        self.assertIn("resident 3 sessions, hierarchical 9 (bytes per session: resident 300000, hierarchical 100000)",
                      doc)
        spec = table_row(doc, ["1024", "4", "online"])
        # ... and without the proposer's 2 of 5 s: 1.25 x 3 / 5 = 0.75 < N ratio 1.0: pays; widths by K
        self.assertEqual(spec[3:], ["4", "1.000", "1.250", "0.900", "2.00", "no", "0.750", "yes", "2:1 4:3", "4/4",
                                    "n/a"])
        split = table_row(doc, ["1024", "4", "adaptive"])
        self.assertEqual(split[3:], ["10", "4.0", "5.00", "2.00", "1.00", "0.50", "0.10", "0.30"])
        for name in ("prefix_throughput", "prefix_census"):
            with open(os.path.join(self.dir, "docs", "perf", name + ".png"), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            self.assertIn(f"(perf/{name}.png)", full)

    def test_prefix_rounds(self):
        """bench_prefix --repeats: each ratio is taken against resident of the SAME round and reported as the median
        over rounds with [min, max]; the other figures are the median round's (for resident: the median tokens/s);
        exact samples add up over rounds. Three rounds at C = 4: resident 20 / 40 / 10 tok/s, adaptive 30 / 20 / 12:
        ratios 1.5 / 0.5 / 1.2, median 1.2 (a mean would give 1.067; round 1's resident for every round 1.0)."""
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import bench_prefix
        speeds = {(4, "resident"): (20.0, 40.0, 10.0), (4, "adaptive"): (30.0, 20.0, 12.0)}
        rounds = []
        for rnd in range(3):
            for p in prefix_canned()["rounds"]:
                q = {k: v for k, v in p.items() if k not in ("vs_resident", "vs_adaptive")}
                q["run"], q["round"] = dict(p["run"]), rnd
                if (q["concurrency"], q["mode"]) in speeds:
                    q["run"]["output_tokens_per_s"] = speeds[(q["concurrency"], q["mode"])][rnd]
                rounds.append(q)
        result = prefix_canned()
        result.update(rounds=rounds, repeats=3)
        del result["points"]
        bench_prefix.analyse(result)
        point = {(p["concurrency"], p["mode"]): p for p in result["points"]}
        ada, res = point[(4, "adaptive")], point[(4, "resident")]
        self.assertEqual(ada["rounds"], 3)
        self.assertAlmostEqual(ada["vs_resident"]["output_tokens_per_s"], 1.2)
        self.assertEqual(ada["vs_resident_range"]["output_tokens_per_s"], [0.5, 1.5])
        self.assertEqual((ada["round"], ada["run"]["output_tokens_per_s"]), (2, 12.0))  # the median round
        self.assertEqual((res["round"], res["run"]["output_tokens_per_s"]), (0, 20.0))  # resident: median tokens/s
        self.assertEqual(ada["exact_sample"], {"compared": 12, "differ": 0})
        self.assertEqual(len(result["points"]), 7)  # one per (context, C, mode) whatever the rounds
        # The plot's tokens/s ratio is the tables' (median of per-round ratios 1.2, bars [0.5, 1.5]), not the median
        # rounds' tokens/s set against each other (adaptive's 12 / resident's 20 = 0.6).
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import perf_report
        self.assertEqual(perf_report.prefix_ratio_series(result, 1024, "adaptive", "output_tokens_per_s"),
                         ([1, 4], [ada1 := point[(1, "adaptive")]["vs_resident"]["output_tokens_per_s"], 1.2],
                          [[ada1, ada1], [0.5, 1.5]]))
        self.assertEqual(perf_report.prefix_ratio_series(result, 1024, "resident", "output_tokens_per_s")[1], [1.0, 1.0])
        # a figure without a ratio: the median over rounds of each round's own figure (resident 20 / 40 / 10 -> 20)
        self.assertEqual(perf_report.prefix_series(result, 1024, "resident", "output_tokens_per_s")[1:],
                         ([10.0, 20.0], [[10.0, 10.0], [10.0, 40.0]]))
        fig = canned()
        fig["prefix"] = result
        doc = self.render(fig)
        doc = doc[doc.index("## The seed's regime"):]
        row = table_row(doc, ["4", "adaptive"])
        self.assertEqual(row[4:6], ["12.00", "1.200 [0.50, 1.50]"])
        self.assertEqual(row[-1], "12/12")
        self.assertEqual(table_row(doc, ["4", "resident"])[5], "1.000")  # resident against itself: no range
        self.assertIn("3 rounds, each running every sweep once", doc)
        # median / span skip NaN and None; nothing finite: NaN
        self.assertEqual(bench_prefix.median([float("nan"), 3.0, None, 1.0]), 2.0)
        self.assertEqual(bench_prefix.span([float("nan"), 3.0, None, 1.0]), [1.0, 3.0])
        self.assertNotEqual(bench_prefix.median([]), bench_prefix.median([]))

    def test_prefix_measure_rounds_and_append(self):
        """bench_prefix.measure's round loop with a stand-in sweep: --repeats 2 runs every (context, mode) sweep once
        per round (round 2's files tagged .r1); --append with the saved file measures nothing again, --repeats 1
        keeps both saved rounds, --repeats 3 runs round 3 only; --repeats 0 is refused."""
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import bench_prefix
        from types import SimpleNamespace
        calls = []

        def sweep(args, tmp, context, concs, mode, budget, extra=(), tag="", output_tokens=None):
            calls.append((context, mode, tag))
            return {c: {"served": 2, "total": 2, "sessions": c, "output_tokens_per_s": 10.0 + len(calls),
                        "tpot_p50_ms": 5.0, "tpot_p99_ms": 6.0} for c in concs}
        saved_sweep, saved_plan = bench_prefix.one_sweep, bench_prefix.plan
        bench_prefix.one_sweep = sweep
        bench_prefix.plan = lambda *a, **k: {"resident_bytes_per_session": 1000, "sessions_per_gpu": {}}
        try:
            def args(repeats):
                return SimpleNamespace(dhsctl="x", replay="x", preset="bench-wide", prefixes=1, contexts="1024",
                                       concurrency="1,4", sessions_per_c=2, suffix_tokens=16, output_tokens=8,
                                       resident_sessions=2, hbm_budget="", link_model="pcie5", speculation=False,
                                       sample_every=2, repeats=repeats, json=os.path.join(self.dir, "s.json"),
                                       append=True, work_dir=os.path.join(self.dir, "runs"))
            result = bench_prefix.measure(args(2), log=io.StringIO())
            self.assertEqual(sorted(calls), sorted((1024, m, t) for m in bench_prefix.MODES for t in ("", ".r1")))
            self.assertEqual(len(result["rounds"]), 12)
            self.assertEqual(result["points"][0]["rounds"], 2)
            del calls[:]
            result = bench_prefix.measure(args(2), log=io.StringIO(), saved=copy.deepcopy(result))
            self.assertEqual(calls, [])
            result = bench_prefix.measure(args(1), log=io.StringIO(), saved=copy.deepcopy(result))
            self.assertEqual((calls, len(result["rounds"]), result["repeats"]), ([], 12, 2))
            result = bench_prefix.measure(args(3), log=io.StringIO(), saved=copy.deepcopy(result))
            self.assertEqual(sorted(calls), sorted((1024, m, ".r2") for m in bench_prefix.MODES))
            self.assertEqual(len(result["rounds"]), 18)
            with self.assertRaises(SystemExit):
                bench_prefix.measure(args(0), log=io.StringIO())
        finally:
            bench_prefix.one_sweep, bench_prefix.plan = saved_sweep, saved_plan

    def test_prefix_spec_exact_against_resident(self):
        """check_exact: a speculative point's exact_sample comes from resident at the speculation's settings
        (L<ctx>-resident-base.outputs.c<C>), its exact_vs_adaptive from plain adaptive's; adaptive+base is compared with
        resident too; a differing output is counted. Here adaptive+base differs from resident in session 2 (tokens)
        and the online run in session 0 (a logits digest), the schedule run equals resident everywhere."""
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import bench_prefix

        def write(name, rows):
            with open(os.path.join(self.dir, f"L256-{name}.outputs.c4"), "w") as f:
                for i, (tokens, digests) in enumerate(rows):
                    f.write(json.dumps({"trace_index": i, "served": True, "tokens": tokens,
                                        "logits_digests": digests}) + "\n")
        ref = [([1, 2], ["a", "b"]), ([3, 4], ["c", "d"]), ([5, 6], ["e", "f"]), ([7, 8], ["g", "h"])]
        write("resident-base", ref)
        write("adaptive-base", [r if i != 2 else ([5, 9], r[1]) for i, r in enumerate(ref)])
        write("adaptive-online", [r if i != 0 else (r[0], ["a", "x"]) for i, r in enumerate(ref)])
        write("adaptive-schedule", ref)

        def check(mode, every=2):
            point = {"context": 256, "concurrency": 4, "mode": mode, "round": 0}
            bench_prefix.check_exact(point, self.dir, every)
            return point.get("exact_sample"), point.get("exact_vs_adaptive")
        self.assertEqual(check("adaptive+schedule"), ({"compared": 2, "differ": 0}, {"compared": 2, "differ": 1}))
        self.assertEqual(check("adaptive+online"), ({"compared": 2, "differ": 1}, {"compared": 2, "differ": 2}))
        self.assertEqual(check("adaptive+online", 3), ({"compared": 2, "differ": 1}, {"compared": 2, "differ": 1}))
        self.assertEqual(check("adaptive+schedule", 3), ({"compared": 2, "differ": 0}, {"compared": 2, "differ": 0}))
        self.assertEqual(check("adaptive+base"), ({"compared": 2, "differ": 1}, None))
        self.assertEqual(check("resident+base"), (None, None))  # the reference itself
        write("resident", ref)  # the main sweep's reference: never compared with itself (a saved count is dropped)
        point = {"context": 256, "concurrency": 4, "mode": "resident", "round": 0,
                 "exact_sample": {"compared": 2, "differ": 0}}
        bench_prefix.check_exact(point, self.dir, 2)
        self.assertNotIn("exact_sample", point)
        os.remove(os.path.join(self.dir, "L256-resident-base.outputs.c4"))
        self.assertEqual(check("adaptive+schedule"), (None, {"compared": 2, "differ": 1}))  # no resident run: none
        # Summed over rounds into the summary point; the speculation table shows both.
        result = prefix_canned()
        rounds = [dict(p) for p in result["rounds"]]
        for rnd in (0, 1):
            rounds.append({"context": 1024, "concurrency": 4, "mode": "adaptive+base", "round": rnd,
                           "run": dict(result["rounds"][5]["run"]), "exact_sample": {"compared": 2, "differ": 0}})
            rounds.append({"context": 1024, "concurrency": 4, "mode": "resident+base", "round": rnd,
                           "run": dict(result["rounds"][3]["run"])})
        for p in rounds:
            if p["mode"] == "adaptive+online":
                p.update(exact_sample={"compared": 2, "differ": 1}, exact_vs_adaptive={"compared": 2, "differ": 0})
                rounds.append(dict(p, round=1, exact_sample={"compared": 2, "differ": 0}))
                break
        for rnd in (0, 1):  # a configuration that verified no speculative round: no verdict
            rounds.append({"context": 1024, "concurrency": 4, "mode": "adaptive+schedule", "round": rnd,
                           "run": dict(result["rounds"][5]["run"], sessions=3, block_width={}, proposer_s=0.0)})
        result.update(rounds=rounds, spec_context=1024, spec_output_tokens=32, spec_hbm_budget_bytes=777,
                      spec_planner={"sessions_per_gpu": {"resident": 2, "hierarchical": 5}})
        del result["points"]
        bench_prefix.analyse(result)
        online = next(p for p in result["points"] if p["mode"] == "adaptive+online")
        self.assertEqual((online["exact_sample"], online["exact_vs_adaptive"]),
                         ({"compared": 4, "differ": 1}, {"compared": 4, "differ": 0}))
        fig = canned()
        fig["prefix"] = result
        doc = self.render(fig)
        doc = doc[doc.index("### With speculation"):]
        self.assertIn("GPU KV budget 777 bytes (planner without a drafter's share: resident 2, hierarchical 5 sessions)",
                      doc)
        self.assertEqual(table_row(doc, ["1024", "4", "online"])[-2:], ["3/4", "4/4"])
        # N 3 / 4 < TPOT 1.0, but no round was verified: "no round", not "yes" / "no"
        self.assertEqual(table_row(doc, ["1024", "4", "schedule"])[3:12],
                         ["3", "0.750", "1.000", "1.000", "n/a", "no round", "1.000", "no round", "none"])
        self.assertEqual(table_row(doc, ["1024", "4", "adaptive+base"])[3:], ["4", "12.00", "30.00", "4/4"])
        self.assertEqual(table_row(doc, ["1024", "4", "resident+base"])[-1], "(reference)")
        # the main table keeps the three modes only
        main = doc.split("### With speculation")[0]
        self.assertNotIn("| 4 | adaptive+base |", main)

    def test_prefix_measure_spec_budget(self):
        """measure with --speculation: resident and plain adaptive run at the speculation's context, output length and
        budget (--spec-resident-sessions R: R x the planner's resident bytes at that context), before the speculative
        runs; the main sweeps keep the main budget."""
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import bench_prefix
        from types import SimpleNamespace
        calls = []

        def sweep(args, tmp, context, concs, mode, budget, extra=(), tag="", output_tokens=None):
            calls.append((context, mode, tag, budget, output_tokens))
            return {c: {"served": 2, "total": 2, "sessions": c, "output_tokens_per_s": 10.0, "tpot_p50_ms": 5.0,
                        "tpot_p99_ms": 6.0, "elapsed_s": 1.0} for c in concs}

        def plan(dhsctl, preset, context, budget=None, slots=None):
            return {"resident_bytes_per_session": context * 10, "sessions_per_gpu": {}}
        saved_sweep, saved_plan = bench_prefix.one_sweep, bench_prefix.plan
        bench_prefix.one_sweep, bench_prefix.plan = sweep, plan
        try:
            args = SimpleNamespace(dhsctl="x", replay="x", preset="bench-wide", prefixes=1, contexts="1024",
                                   concurrency="1,4", sessions_per_c=2, suffix_tokens=16, output_tokens=8,
                                   resident_sessions=2, hbm_budget="", link_model="pcie5", speculation=True,
                                   spec_concurrency="4", spec_context=512, spec_output_tokens=48,
                                   spec_resident_sessions=1.5, spec_hbm_budget="", sample_every=2, repeats=1,
                                   json="", append=False)
            result = bench_prefix.measure(args, log=io.StringIO())
            main = 2 * (1024 + 16 + 8) * 10
            spec = int(1.5 * (512 + 16 + 48) * 10)
            self.assertEqual(calls, [(1024, m, "", main, None) for m in bench_prefix.MODES] +
                             [(512, "resident", "-base", spec, 48), (512, "adaptive", "-base", spec, 48),
                              (512, "adaptive", "-schedule", spec, 48), (512, "adaptive", "-online", spec, 48)])
            self.assertEqual((result["hbm_budget_bytes"], result["spec_hbm_budget_bytes"]), (main, spec))
            del calls[:]
            args.spec_hbm_budget = "999"
            bench_prefix.measure(args, log=io.StringIO())
            self.assertEqual({b for c, m, t, b, o in calls if c == 512}, {999})
        finally:
            bench_prefix.one_sweep, bench_prefix.plan = saved_sweep, saved_plan

    def test_prefix_sharing_section(self):
        """Issue 24's section: the upper bound of each workload, one row per (mode, sharing) with the hits by tier and
        their rates, the on/off ratio row (host bytes per session 1000 / 4000 = 0.25), on == off, the fault runs."""
        def run(lookups, hw, hh, saved, shared, mean, peak, held, alloc, p50, p99, tps):
            return {"served": 10, "total": 10, "failed": 0, "exact_match": True, "lookups": lookups,
                    "hits_worker": hw, "hits_host": hh, "misses": lookups - hw - hh, "hit_rate_worker": hw / lookups,
                    "hit_rate_host": hh / lookups, "miss_rate": (lookups - hw - hh) / lookups,
                    "prefill_tokens_saved": saved, "host_pages_shared": shared, "host_bytes_per_session_mean": mean,
                    "host_bytes_per_session_peak": peak, "host_pages_peak_held": held,
                    "host_pages_peak_allocated": alloc, "ttft_p50_ms": p50, "ttft_p99_ms": p99,
                    "output_tokens_per_s": tps, "reclaims": 2, "worker_restarts": 2, "requests_resumed": 3,
                    "host_rows_lost": 0, "host_pages_unconfirmed": 0}
        off = run(200, 0, 0, 0, 0, 4000.0, 8000.0, 40, 40, 100.0, 300.0, 20.0)
        on = run(200, 10, 30, 500, 12, 1000.0, 2000.0, 10, 30, 80.0, 240.0, 22.0)
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import bench_prefix_sharing as bps
        pair = {"mode": "hisparse", "off": off, "on": on,
                "on_vs_off": {k: bps.ratio(on[k], off[k]) for k in bps.RATIO_KEYS},
                "on_equals_off": {"compared": 10, "differ": 0}}
        fig = canned()
        fig["prefix_sharing"] = {
            "length_scale": 0.02, "requests": 200, "concurrency": 4, "preset": "dsv4flash-like", "modes": ["hisparse"],
            "trace": "tools/replay/data/mooncake_conversation_head200.jsonl", "kill_points": ["prefill:3", "decode:40"],
            "synthetic": {"prefixes": 4, "prefix_tokens": 1024, "suffix_tokens": 16, "output_tokens": 16,
                          "sessions": 32, "concurrency": 8},
            "workloads": [{"name": "mooncake", "pairs": [pair],
                           "bound": bps.upper_bound([(20, [1, 2]), (20, [1, 3])], 10)}],
            "faults": {"reclaims": dict(on), "kills": dict(on)}, "all_exact": True, "wall_s": 600.0}
        full = self.render(fig)
        self.assertIn("## Prefix sharing: the content-addressed host tier (issue 24)", full)
        doc = full[full.index("## Prefix sharing"):]
        self.assertIn("`python3 tools/perf_report.py --sections prefix_sharing`", doc)
        # (1), (1,2) new; (1) seen, (1,3) new: 1 of 4 blocks, 10 of 40 tokens.
        self.assertIn("1 of 4 complete 10-token blocks (25.0%) have a whole chain that appeared in an earlier request: "
                      "10 of 40 prefill tokens (25.0%). At host-page granularity (64-row pages wholly inside the seen "
                      "blocks and before the request's last input token: what memd can share and the worker import): "
                      "0 blocks (0.0%), 0 prefill tokens.", doc)
        self.assertEqual(table_row(doc, ["hisparse", "on"])[2:],
                         ["10/10", "yes", "200", "10 (5.0%)", "30 (15.0%)", "160 (80.0%)", "500", "12", "1000",
                          "2000", "10", "30", "80.0", "240.0", "22.00"])
        self.assertEqual(table_row(doc, ["hisparse", "**on / off**"])[10:],
                         ["**0.250**", "**0.250**", "0.250", "0.750", "0.800", "0.800", "1.100"])
        self.assertIn("hisparse 10/10.", doc)
        self.assertIn("2 worker restarts, 3 requests resumed, host rows lost 0", doc)
        self.assertIn("All runs exact with every request finished: **yes**.", doc)
        self.assertLess(full.index("## Prefix sharing"), full.index("## Microbenchmarks"))

    def test_cluster_section(self):
        """Issue 26's section: the upper bounds from the trace (any node; node-local round-robin), one row per
        (configuration, tier) with the hits by tier, the cluster pages and bytes/s, the ratio lines."""
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import bench_cluster as bc
        # Length scale 0.5: T = 256. Rows: A (2 blocks), A's next turn (3 complete: ids 1, 2, 3), A again.
        # Any node: 0 + 2 + 2 = 4 of 7 blocks, 1024 of 512 + 768 + 512 = 1792 tokens; round-robin on 2 nodes:
        # node 0 rows 0, 2 (2 seen), node 1 row 1 (0): 2 of 7, 512 tokens. Page granularity (64 rows in 256-token
        # blocks): the 4 seen blocks hold 16 pages, but the worker imports only pages before the last input token:
        # row 1: min(512 // 64, 767 // 64) = 8 pages, 2 blocks; row 2: min(8, 511 // 64 = 7) = 7 pages, 1 block.
        rows = [{"input_length": 1024, "hash_ids": [1, 2]}, {"input_length": 1536, "hash_ids": [1, 2, 3]},
                {"input_length": 1024, "hash_ids": [1, 2]}]
        bounds = bc.bounds(rows, 0.5, [1, 2])

        def run(hw, hl, hc, lookups, saved, cluster_pages, out_s, in_s, tps):
            return {"served": 3, "total": 3, "failed": 0, "exact_match": True, "lookups": lookups,
                    "hits_worker": hw, "hits_host_local": hl, "hits_cluster": hc,
                    "misses": lookups - hw - hl - (hc or 0), "hit_rate_worker": hw / lookups,
                    "hit_rate_host_local": hl / lookups,
                    "hit_rate_cluster": hc / lookups if hc is not None else float("nan"),
                    "miss_rate": (lookups - hw - hl - (hc or 0)) / lookups, "prefill_tokens_saved": saved,
                    "cluster_pages": cluster_pages, "store_bytes_out_per_s": out_s, "store_bytes_in_per_s": in_s,
                    "ttft_p50_ms": 100.0, "ttft_p99_ms": 200.0, "output_tokens_per_s": tps, "sessions": 1,
                    "next_turns": 2}
        none = {"lookups": None, "hits": None, "imported": None, "published": None}
        loc = run(0, 1, 0, 8, 256, none, None, None, 10.0)
        clu = run(0, 1, 2, 8, 768, {"lookups": 10, "hits": 2, "imported": 2, "published": 6}, 2000.0, 500.0, 12.0)
        routed = bc.node_local_bound([(512, [1, 2]), (768, [1, 2, 3]), (512, [1, 2])], 256, [0, 1, 0])
        config = {"nodes": 2, "route": "round-robin", "local": loc, "cluster": clu, "routed_bound_local": routed,
                  "routed_bound_cluster": routed,
                  "cluster_vs_local": {"prefill_tokens_saved": 3.0, "ttft_p50_ms": 1.0, "ttft_p99_ms": 1.0,
                                       "output_tokens_per_s": 1.2}}
        one = dict(config, nodes=1, local=dict(loc), cluster=dict(loc, hits_cluster=None,
                                                                    hit_rate_cluster=float("nan")))
        chat = {"conversations": 3, "turns": 2, "requests": 6, "output_length": 512, "length_scale": 0.0625,
                "concurrency": 3, "nodes": 2, "route": "round-robin", "lookup_timeout_ms": 100,
                "local": dict(loc, prefill_tokens_saved=832),
                "cluster": dict(clu, prefill_tokens_saved=1472,
                                cluster_pages={"lookups": 12, "hits": 10, "imported": 10, "session_imported": 3,
                                               "published": 30}),
                "cluster_vs_local": {"prefill_tokens_saved": 1472 / 832, "ttft_p50_ms": 0.5, "ttft_p99_ms": 1.0,
                                     "output_tokens_per_s": 1.25}}
        fig = canned()
        fig["cluster"] = {"chat": chat, "trace": "tools/replay/data/mooncake_conversation_head1000.jsonl", "requests": 3,
                          "length_scale": 0.5, "concurrency": 2, "preset": "dsv4flash-like", "mode": "hisparse",
                          "store": "local", "nodes": [1, 2], "routes": [], "route_nodes": 2,
                          "mooncake_gain": [0.59, 4.98], "bounds": bounds, "configs": [one, config],
                          "all_exact": True, "wall_s": 120.0}
        full = self.render(fig)
        self.assertIn("## Past one node: the cluster tier on Redis (issue 26)", full)
        doc = full[full.index("## Past one node"):]
        self.assertIn("`python3 tools/perf_report.py --sections cluster`", doc)
        self.assertIn("256-token blocks, 1792 prefill tokens", doc)
        self.assertEqual(table_row(doc, ["any earlier request, on any node (a cluster tier keeping everything)"])[1:],
                         ["4 / 7", "57.1%", "1024", "57.1%", "3 (42.9%)", "960 (53.6%)"])
        self.assertEqual(table_row(doc, ["node-local, 2 nodes round-robin (repeats on the same node)"])[1:],
                         ["2 / 7", "28.6%", "512", "28.6%", "1 (14.3%)", "448 (25.0%)"])
        self.assertEqual(table_row(doc, ["2", "round-robin", "cluster (Redis)"])[3:],
                         ["3/3", "yes", "8", "0 (0.0%)", "1 (12.5%)", "2 (25.0%)", "5 (62.5%)", "768", "42.9%",
                          "28.6% of blocks (14.3% at page granularity)", "10 / 2 / 2 / 6", "2000", "500", "100.0",
                          "200.0", "12.00"])
        self.assertEqual(table_row(doc, ["2", "round-robin", "node-local"])[7:11],
                         ["1 (12.5%)", "0 (0.0%)", "7 (87.5%)", "256"])
        self.assertEqual(table_row(doc, ["2", "round-robin", "node-local"])[13:16], ["n/a / n/a / n/a / n/a", "n/a",
                                                                                     "n/a"])
        self.assertEqual(table_row(doc, ["1", "round-robin", "cluster (Redis)"])[8], "n/a")  # one node: not reported
        self.assertIn("- 2 nodes, round-robin: prefill tokens saved 256 -> 768 (x 3.00), TTFT p50 x 1.000, p99 x "
                      "1.000, tokens/s x 1.200; sessions 1 (2 next turns).", doc)
        self.assertIn("### Chat turns across nodes: session pages", doc)
        self.assertEqual(table_row(doc, ["cluster (Redis)", "3/3"])[2:],
                         ["yes", "1472", "10", "3", "100.0", "200.0", "12.00"])
        self.assertEqual(table_row(doc, ["node-local", "3/3"])[3:6], ["832", "n/a", "n/a"])
        self.assertIn("Cluster tier against node-local: prefill tokens saved x 1.77, TTFT p50 x 0.500", doc)
        self.assertIn("All runs exact with every request finished: **yes**.", doc)
        self.assertLess(full.index("## Prefix sharing"), full.index("## Past one node"))
        self.assertLess(full.index("## Past one node"), full.index("## Microbenchmarks"))

    def test_prefix_step_profile_per_window(self):
        """bench_prefix splits the worker's cumulative decode lines per sweep point: the line at the window's end
        minus the last one before its start (at_ms: the step's end on CLOCK_MONOTONIC, as dhs-replay's window)."""
        sys.path.insert(0, os.path.dirname(SCRIPT))
        import bench_prefix
        log = os.path.join(self.dir, "workerd.log")
        with open(log, "w") as f:
            for steps, fetch, at in ((1, 2.0, 100.0), (3, 5.0, 200.0), (4, 9.0, 310.0), (10, 30.0, 400.0)):
                f.write(f"step profile: decode steps {steps} queries {steps * 2} wall_ms {steps * 10} model_ms 1 "
                        f"index_topk_ms 0 fetch_ms {fetch} append_ms 0 release_ms 0 outside_ms 0 at_ms {at}\n")
                f.write(f"step profile: mixed steps 1 queries 9 wall_ms 5 at_ms {at + 1}\n")
        lines = bench_prefix.read_step_profile(log)
        self.assertEqual([l["steps"] for l in lines], [1, 3, 4, 10])
        # window [150, 350]: the steps that ended at 200 and 310 (cumulative 4 minus 1 before it)
        w = bench_prefix.window_profile(lines, 150.0, 350.0)
        self.assertEqual((w["steps"], w["queries"], w["wall_ms"], w["fetch_ms"]), (3, 6, 30, 7.0))
        self.assertNotIn("at_ms", w)
        w = bench_prefix.window_profile(lines, 0.0, 150.0)  # before any earlier line: from zero
        self.assertEqual((w["steps"], w["fetch_ms"]), (1, 2.0))
        self.assertIsNone(bench_prefix.window_profile(lines, 10.0, 50.0))  # no step ended by the window's end
        self.assertIsNone(bench_prefix.window_profile([], 0.0, 1.0))
        # the other kinds of line: mixed steps and the loop's admission split, each windowed alike
        with open(log, "a") as f:
            f.write("step profile: loop import_chunks 2 import_ms 4 import_append_ms 3 import_keys_ms 1 poll_ms 0.5 "
                    "at_ms 120\n")
            f.write("step profile: loop import_chunks 6 import_ms 10 import_append_ms 7 import_keys_ms 2 poll_ms 0.7 "
                    "at_ms 300\n")
        loop = bench_prefix.read_step_profile(log, "loop")
        self.assertEqual(len(loop), 2)
        self.assertEqual(bench_prefix.window_profile(loop, 150.0, 350.0),
                         {"import_chunks": 4, "import_ms": 6, "import_append_ms": 4, "import_keys_ms": 1,
                          "poll_ms": 0.7 - 0.5})
        self.assertEqual(len(bench_prefix.read_step_profile(log, "mixed")), 4)
        self.assertEqual(len(bench_prefix.read_step_profile(log)), len(lines))  # decode lines only, as before

    def test_plots_written_and_linked(self):
        doc = self.render(canned())
        for name in ("throughput", "sessions", "tokens_vs_resident", "census", "speculation"):
            path = os.path.join(self.dir, "docs", "perf", name + ".png")
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", path)
            self.assertIn(f"]({os.path.join('perf', name + '.png')})", doc)

    def test_hand_written_text_kept(self):
        begin = "<!-- generated by tools/perf_report.py: begin -->"
        end = "<!-- generated by tools/perf_report.py: end -->"
        before = "# Performance\n\nHand-written intro.\n\n"
        after = "\n\n## Introspection at scale\n\nAnother engineer's section.\n"
        doc = self.render(canned(), before + begin + "\nstale figures\n" + end + after)
        self.assertTrue(doc.startswith(before + begin))
        self.assertTrue(doc.endswith(end + after))
        self.assertNotIn("stale figures", doc)
        self.assertEqual(self.render(canned()), doc)  # rendering again changes nothing
        self.assertEqual(doc.count(begin), 1)

    def test_programs_missing(self):
        """Every program missing (a build directory that does not exist): each failure is reported, the document is
        still written, every verdict is "not measured" (nothing is called met without a figure)."""
        out = os.path.join(self.dir, "p.md")
        proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--build", os.path.join(self.dir, "no-build"),
                               "--out", out], capture_output=True, text=True, cwd=self.dir)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(out) as f:
            doc = f.read()
        self.assertIn("cannot run", proc.stderr)
        verdicts = [target(doc, w)[1] for w in ("within 3%", "sessions > resident", "sessions >= hisparse",
                                                "glm5-like", "host recovery", "admission", "p99 at most 100")]
        self.assertEqual(verdicts, ["not measured"] * 7)
        # planner (its section and the memory target), both mode sections, the three microbenchmark programs,
        # speculation, the prepared-prefix closed loop (issue 27), prefix sharing (issue 24), several nodes (issue 26)
        self.assertEqual(doc.count("FAILED: "), 11)
        with open(os.path.join(self.dir, "perf", "figures.json")) as f:
            saved = json.load(f)
        self.assertEqual(sorted(saved), ["cluster", "long_context", "meta", "micro", "modes", "planner", "prefix",
                                         "prefix_sharing", "speculation"])

    def test_sections_measures_only_those(self):
        """--sections planner with no programs: the planner section is measured again (and fails, no build), every
        other section keeps its saved figures, and the meta lists the partial run."""
        plots = os.path.join(self.dir, "perf")
        os.makedirs(plots)
        fig = canned()
        with open(os.path.join(plots, "figures.json"), "w") as f:
            json.dump(fig, f)
        out = os.path.join(self.dir, "p.md")
        proc = subprocess.run([sys.executable, SCRIPT, "--sections", "planner", "--build",
                               os.path.join(self.dir, "no-build"), "--out", out], capture_output=True, text=True,
                              cwd=self.dir)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(plots, "figures.json")) as f:
            saved = json.load(f)
        self.assertIn("error", saved["planner"])
        for name in ("micro", "modes", "long_context", "speculation"):  # as text: NaN (no acceptance for off)
            self.assertEqual(json.dumps(saved[name], sort_keys=True), json.dumps(fig[name], sort_keys=True))
        self.assertEqual(saved["meta"]["date"], fig["meta"]["date"])
        self.assertEqual([r["sections"] for r in saved["meta"]["partial_runs"]], [["planner"]])
        with open(out) as f:
            self.assertIn("): planner.", f.read())
        bad = subprocess.run([sys.executable, SCRIPT, "--sections", "planner,nope", "--out", out],
                             capture_output=True, text=True, cwd=self.dir)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("unknown nope", bad.stderr)

    def test_unreadable_figures(self):
        bad = os.path.join(self.dir, "bad.json")
        with open(bad, "w") as f:
            f.write("{not json")
        proc = subprocess.run([sys.executable, SCRIPT, "--from-json", bad, "--out", os.path.join(self.dir, "p.md"),
                               "--plots", os.path.join(self.dir, "perf")], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2)
        self.assertIn(f"cannot read {bad}", proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "p.md")))


STUB_REPLAY = r'''#!PYTHON
"""A stand-in dhs-replay for bench_prefix's tests: writes --json / --outputs for the --sweep points as STUB_PLAN says
per mode: "ok" (every point), "fail-after-1" (the first point, then exit 1 before the others), "unserved" (the last
point serves one session less, exit 1, as dhs-replay does), "no-outputs" (every point, empty --outputs), "wait" (touches STUB_MARK.started, waits for SIGINT,
then after 0.3 s writes whether its run directory still exists to STUB_MARK.stopped and exits 130), "wait-keep"
(as "wait", and it leaves a /dev/shm pool segment named for its run directory behind, as a memd that kept its pool)."""
import json, os, signal, sys, time
a = sys.argv[1:]
arg = lambda k: a[a.index(k) + 1]
mode, concs = arg("--mode"), [int(c) for c in arg("--sweep").split(",")]
plan = json.loads(os.environ["STUB_PLAN"]).get(mode, "ok")
run_dir = arg("--run-dir")
if plan in ("wait", "wait-keep"):
    mark = os.environ["STUB_MARK"]
    if plan == "wait-keep":
        import hashlib
        seg = "/dev/shm/dhs-pool-" + hashlib.sha256(os.path.realpath(run_dir).encode()).hexdigest()[:16]
        open(seg, "w").close()
        with open(mark + ".segment", "w") as f:
            f.write(seg)
    def stop(*_):
        time.sleep(0.3)
        with open(mark + ".stopped", "w") as f:
            f.write("run dir there" if os.path.isdir(run_dir) else "run dir gone")
        sys.exit(130)
    signal.signal(signal.SIGINT, stop)
    open(mark + ".started", "w").close()
    while True:
        time.sleep(0.05)
reports = []
for i, c in enumerate(concs):
    if plan == "fail-after-1" and i == 1:
        sys.stderr.write("dhs-replay: run failed: stub worker went away\n")
        sys.exit(1)
    n = 2 * c
    served = n - 1 if plan == "unserved" and i == len(concs) - 1 else n
    reports.append({"requests_served": served, "requests_total": n, "sessions_admitted_max": c, "complete": True,
                    "output_tokens": 8 * served, "output_tokens_per_s": 10.0 * c, "tpot_ms": {"p50": 5.0, "p99": 6.0},
                    "ttft_ms": {"p50": 1.0}, "allocation_wait_share": 0.0, "census": None, "reclaims": 0,
                    "repopulated_pages": 0, "elapsed_s": 1.0, "settings": {"concurrency": c},
                    "prefix_workload": {"preparation_s": 0.1, "in_flight_max": c, "in_flight_mean": c}})
    with open(arg("--outputs") + f".c{c}", "w") as f:
        for row in range(1, n + 1 if plan != "no-outputs" else 1):
            f.write(json.dumps({"trace_index": row, "served": row <= served, "tokens": [row], "logits_digests": [row]})
                    + "\n")
    with open(arg("--json"), "w") as f:
        json.dump(reports, f)
if plan == "unserved":
    sys.stderr.write("dhs-replay: 1 request not served (stub)\n")
    sys.exit(1)
'''

STUB_DHSCTL = r'''#!PYTHON
import json
print(json.dumps({"resident_bytes_per_session": 1000, "hierarchical_bytes_per_session": 500,
                  "sessions_per_gpu": {"resident": 2, "hierarchical": 4}}))
'''


class BenchPrefixCommandTest(unittest.TestCase):
    """tools/bench_prefix.py as a command, against stand-in dhs-replay / dhsctl programs (issue 27 review D5-D9)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.bench = os.path.join(os.path.dirname(SCRIPT), "bench_prefix.py")
        self.replay, self.dhsctl = os.path.join(self.dir, "replay"), os.path.join(self.dir, "dhsctl")
        for path, text in ((self.replay, STUB_REPLAY), (self.dhsctl, STUB_DHSCTL)):
            with open(path, "w") as f:
                f.write(text.replace("PYTHON", sys.executable, 1))
            os.chmod(path, 0o755)

    def tearDown(self):
        self.tmp.cleanup()

    def bench_cmd(self, *extra):
        return [sys.executable, self.bench, "--replay", self.replay, "--dhsctl", self.dhsctl, "--prefixes", "1",
                "--contexts", "64", "--concurrency", "1,4", "--link-model", "off", *extra]

    def run_bench(self, plan, *extra):
        env = dict(os.environ, STUB_PLAN=json.dumps(plan), TMPDIR=self.dir)
        return subprocess.run(self.bench_cmd(*extra), capture_output=True, text=True, env=env, timeout=60)

    def kept_dirs(self):
        return [d for d in os.listdir(self.dir) if d.startswith("bench_prefix-")]

    def test_all_ok_exact_and_reference(self):
        """Every point served and compared: exit 0; resident's `exact` is `ref`, the others' equal/compared; the
        temporary directory is removed."""
        proc = self.run_bench({})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        rows = {tuple(l.split()[:3]): l.split() for l in proc.stdout.splitlines() if l.strip().startswith("64 ")}
        self.assertEqual(rows[("64", "4", "resident")][-1], "ref")
        self.assertEqual(rows[("64", "4", "adaptive")][-1], "4/4")  # every 2nd of 8 sessions
        self.assertEqual(self.kept_dirs(), [])

    def test_failed_sweep_keeps_finished_points_and_its_run_dir(self):
        """adaptive fails after C = 1 (no report for C = 4), hisparse serves one session less at C = 4: the finished
        points are reported with their figures, the failed ones marked, dhs-replay's stderr shown (exit code 1 too),
        the command exits 1 naming each failed point, and the failed runs' directory is kept and named."""
        proc = self.run_bench({"adaptive": "fail-after-1", "hisparse": "unserved"})
        self.assertEqual(proc.returncode, 1, proc.stderr)
        rows = {tuple(l.split()[:3]): l for l in proc.stdout.splitlines() if l.strip().startswith("64 ")}
        self.assertIn("1/1", rows[("64", "1", "adaptive")])  # C = 1 measured before the failure: kept, compared
        self.assertNotIn("FAILED", rows[("64", "1", "adaptive")])
        self.assertIn("FAILED", rows[("64", "4", "adaptive")])
        self.assertIn("FAILED", rows[("64", "4", "hisparse")])
        self.assertIn("7 of 8 sessions served", rows[("64", "4", "hisparse")])
        self.assertIn("stub worker went away", proc.stderr)
        self.assertIn("1 request not served (stub)", proc.stderr)  # exit code 1: stderr shown as well
        self.assertIn("FAILED L=64 C=4 adaptive", proc.stderr)
        self.assertIn("FAILED L=64 C=4 hisparse", proc.stderr)
        kept = self.kept_dirs()
        self.assertEqual(len(kept), 1, proc.stderr)
        self.assertIn(f"kept {os.path.join(self.dir, kept[0])}", proc.stderr)
        self.assertTrue(os.path.isdir(os.path.join(self.dir, kept[0], "L64-adaptive.run")))

    def test_a_comparison_of_no_session_is_not_exact(self):
        """resident's outputs hold no session: the others compare 0 sessions, shown `n/a` (not "0/0"), and the
        command exits 1 naming them NOT CHECKED."""
        proc = self.run_bench({"resident": "no-outputs"})
        self.assertEqual(proc.returncode, 1, proc.stderr)
        rows = {tuple(l.split()[:3]): l.split() for l in proc.stdout.splitlines() if l.strip().startswith("64 ")}
        self.assertEqual(rows[("64", "4", "adaptive")][-1], "n/a")
        self.assertEqual(rows[("64", "4", "resident")][-1], "ref")
        self.assertIn("NOT CHECKED L=64 C=4 adaptive", proc.stderr)

    def test_bad_command_lines_are_argparse_errors(self):
        for extra, words in ((["--concurrency", "0"], "--concurrency"), (["--concurrency", "x"], "--concurrency"),
                             (["--prefixes", "0"], "--prefixes"), (["--contexts", ""], "--contexts"),
                             (["--replay", os.path.join(self.dir, "none")], "--replay"),
                             (["--dhsctl", os.path.join(self.dir, "none")], "--dhsctl")):
            proc = self.run_bench({}, *extra)
            self.assertEqual(proc.returncode, 2, (extra, proc.stderr))
            self.assertIn("error:", proc.stderr)
            self.assertIn(words, proc.stderr)
            self.assertNotIn("Traceback", proc.stderr)

    def start_bench_until_the_stub_runs(self, plan):
        """bench_prefix started with the stub's `plan` for the resident run; returns (process, mark path) once the
        stub dhs-replay has started (mark + ".started")."""
        import time
        mark = os.path.join(self.dir, "mark")
        env = dict(os.environ, STUB_PLAN=json.dumps({"resident": plan}), STUB_MARK=mark, TMPDIR=self.dir)
        proc = subprocess.Popen(self.bench_cmd(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 30
        while not os.path.exists(mark + ".started") and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        return proc, mark

    def test_sigint_stops_the_child_before_the_run_dir_goes(self):
        """Ctrl-C (SIGINT to bench_prefix): the running dhs-replay gets SIGINT and is waited for while its run
        directory still exists (so memd can drop its pool), then bench_prefix exits 130 without a traceback."""
        import signal
        proc, mark = self.start_bench_until_the_stub_runs("wait")
        self.assertTrue(os.path.exists(mark + ".started"))
        proc.send_signal(signal.SIGINT)  # to bench_prefix only: it must pass it on
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 130, err)
        self.assertNotIn("Traceback", err)
        self.assertIn("interrupted", err)
        with open(mark + ".stopped") as f:
            self.assertEqual(f.read(), "run dir there")

    def test_sigint_removes_a_pool_segment_the_stopped_run_left(self):
        """A pool segment of the interrupted run's directory still there once dhs-replay exited (memd killed, or it
        kept its pool) is removed: the run is abandoned and its directory goes next."""
        import signal
        proc, mark = self.start_bench_until_the_stub_runs("wait-keep")
        with open(mark + ".segment") as f:
            segment = f.read()
        try:
            self.assertTrue(os.path.exists(segment))
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
            self.assertEqual(proc.returncode, 130, err)
            self.assertFalse(os.path.exists(segment))
        finally:
            if os.path.exists(segment):
                os.remove(segment)


if __name__ == "__main__":
    SCRIPT = os.path.abspath(sys.argv.pop(1))
    unittest.main()
