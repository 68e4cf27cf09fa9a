#!/usr/bin/env python3
"""End-to-end replay (issue 5): dhs-replay starts a real node (memd + workerd) and replays a 50-request slice of the
bundled Mooncake trace in adaptive mode under a GPU budget that forces reclaims, then replays it again in resident
mode (--check-exact). Asserts every request is served in both, and that tokens and per-token logits digests are
bit-identical (brief §7). Then the same with speculative decoding (--speculate synthetic, issue 13) in the adaptive
run against a plain resident reference: still bit-identical, and the speculation figures are consistent. Then with
the built-in drafter (--speculate fixed --drafter-weights FILE made by dhs-gen-weights --drafter): bit-identical,
rounds > 0, and draft_ring_bytes = N * R_d * bytes per row, computed here from the file's own config
(R_d = p * ceil((W + K_max + p - 1) / p), brief §6; a row holds K and V of every layer and head, f32). Both
speculative runs report staging_bytes = χ * N * K_max * k * d_KV (brief §6 "Staging"; χ = 4, brief §8's default).
Usage: replay_e2e_test.py DHS_REPLAY DHS_GEN_WEIGHTS"""
import json
import os
import struct
import subprocess
import sys
import tempfile


def run(replay: str, extra: list) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        cmd = [replay, "--requests", "50", "--length-scale", "0.03", "--concurrency", "4",
               "--check-exact", "--json", out] + extra
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        sys.stdout.write(proc.stdout)
        sys.stderr.write(proc.stderr[-4000:])
        if proc.returncode != 0:
            print(f"FAIL: dhs-replay {' '.join(extra)} exited {proc.returncode}")
            return {}
        with open(out) as f:
            return json.load(f)


# The staging reservation the worker declares to memd: χ * N * K_max * k * d_KV with χ = 4 (workerd --staging-arenas default,
# brief §8), N = 8 (dhs-replay's --slots default), K_max = --block 4, and dsv4flash-like's k = 16 and d_KV = 288 bytes
# (brief §8's table; workerd/model/config.cc): 589,824 bytes.
STAGING_BYTES = 4 * 8 * 4 * 16 * 288


def check_speculation(report: dict, mode: str = "synthetic", ring_bytes: int = 0) -> list:
    failures = []
    if report.get("speculate") != mode:
        failures.append(f"speculate = {report.get('speculate')!r}, want {mode!r}")
    rounds = report.get("rounds", 0)
    widths = report.get("block_width") or {}
    proposals = report.get("proposals") or {}
    mean = report.get("acceptance_length_mean")
    if rounds < 1 or mean is None:
        return failures + [f"rounds = {rounds}, acceptance_length_mean = {mean}: no speculative round"]
    if sum(widths.values()) != rounds or any(int(k) < 2 or int(k) > 4 for k in widths):
        failures.append(f"block_width {widths} does not count {rounds} rounds of 2..4 queries")
    # Each round emits its accepted proposals + 1 tokens; proposals verified = sum of (K_r - 1).
    if abs(mean * rounds - (proposals.get("accepted", -1) + rounds)) > 1e-6:
        failures.append(f"acceptance_length_mean {mean} x {rounds} rounds != accepted {proposals} + rounds")
    if proposals.get("verified") != sum((int(k) - 1) * n for k, n in widths.items()):
        failures.append(f"proposals verified {proposals.get('verified')} != sum of (K - 1) over {widths}")
    if report.get("staging_bytes") != STAGING_BYTES:
        failures.append(f"staging_bytes = {report.get('staging_bytes')}, want {STAGING_BYTES}")
    if report.get("draft_ring_bytes") != ring_bytes:
        failures.append(f"draft_ring_bytes = {report.get('draft_ring_bytes')}, want {ring_bytes}")
    return failures


def drafter_config(path: str) -> dict:
    """The drafter's config from its safetensors header (__metadata__ "config", a JSON text)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return json.loads(header["__metadata__"]["config"])


def drafter_run(replay: str, gen_weights: str) -> list:
    slots, page_rows, block = 8, 64, 4  # dhs-replay's --slots and workerd's --page-rows defaults; --block below
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "drafter.safetensors")
        subprocess.run([gen_weights, "--drafter", "--preset", "dsv4flash-like", "--seed", "3", "--out", path],
                       check=True, timeout=120)
        c = drafter_config(path)
        ring_rows = page_rows * -(-(c["window"] + block + page_rows - 1) // page_rows)
        row_bytes = 4 * c["n_layers"] * 2 * c["n_heads"] * c["head_dim"]
        spec = run(replay, ["--speculate", "fixed", "--block", str(block), "--drafter-weights", path])
    if not spec:
        return ["drafter run: no report"]
    failures = check_speculation(spec, "fixed", slots * ring_rows * row_bytes)
    for key, want in {"requests_served": 50, "mode": "adaptive", "exact_match": True}.items():
        if spec.get(key) != want:
            failures.append(f"{key} = {spec.get(key)!r}, want {want!r}")
    print(f"drafter run: rounds {spec.get('rounds')}, acceptance_length_mean {spec.get('acceptance_length_mean')}, "
          f"draft_ring_bytes {spec.get('draft_ring_bytes')} (N {slots} x R_d {ring_rows} x {row_bytes} B), "
          f"staging_bytes {spec.get('staging_bytes')}")
    return [f"drafter run: {f}" for f in failures]


def main() -> int:
    replay = sys.argv[1]
    failures = []
    report = run(replay, [])
    spec = run(replay, ["--speculate", "synthetic", "--block", "4", "--spec-corruption", "0.3"])
    if not report or not spec:
        return 1
    failures += [f"speculative run: {f}" for f in check_speculation(spec)]
    failures += drafter_run(replay, sys.argv[2])
    for key, want in {"requests_served": 50, "mode": "adaptive", "exact_match": True}.items():
        if spec.get(key) != want:
            failures.append(f"speculative run: {key} = {spec.get(key)!r}, want {want!r}")
    if spec.get("reclaims", 0) < 1:
        failures.append("speculative run: no reclaim happened")
    expect = {"requests_total": 50, "requests_served": 50, "mode": "adaptive", "exact_match": True}
    for key, want in expect.items():
        if report.get(key) != want:
            failures.append(f"{key} = {report.get(key)!r}, want {want!r}")
    census = report.get("census") or {}
    total = sum(census.get(k, 0) for k in ("direct", "hot", "host"))
    if abs(total - 1.0) > 1e-9:
        failures.append(f"census shares sum to {total}, want 1")
    # The default budget is sized so that adaptive mode must reclaim and repopulate (brief §4).
    if report.get("reclaims", 0) < 1 or report.get("repopulated_pages", 0) < 1:
        failures.append(f"reclaims {report.get('reclaims')}, repopulated pages {report.get('repopulated_pages')}: "
                        "the run did not exercise reclaim and population")
    # Requests were served with memd reachable: some session was admitted, however short the run (memd is sampled
    # at each first token and end, and a request streaming tokens counts as admitted).
    if report.get("sessions_admitted_max", 0) < 1:
        failures.append(f"sessions_admitted_max = {report.get('sessions_admitted_max')!r}, want >= 1")
    if report.get("complete") is not True:
        failures.append(f"complete = {report.get('complete')!r}, want True")
    if report.get("output_tokens", 0) <= 0:
        failures.append("no output tokens")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
