"""python/examples/vs_workerd.py: issue 25's measurement "the Python example's tokens/s against workerd's on the same
requests", both figures from one run.

1. The numpy example engine (sparse_decode.py: its decode loop on libdhs pools, memd started by
   tests/libdhs/with_memd.py) serves the first N requests of the bundled Mooncake slice, scaled to its toy
   (requests_of_trace: prompts of 20..96 tokens, 4..12 output tokens); its line "libdhs loop: X tokens/s" is taken.
2. The same N requests (the same prompt and output lengths, each request's hash_ids kept) are written as a Mooncake
   JSONL trace and replayed by dhs-replay against a node it starts (memd + workerd with the built-in model,
   --length-scale 1, adaptive mode, --slots 2 as the example's worker, closed loop with every request in flight;
   the example submits each request once the earlier ones are granted, and with 2 slots the rest wait for a slot in
   both); its report's output_tokens_per_s is taken.

What is the same: the requests (token counts), the serving mode, the 2 slots and the load (two requests decoding,
the others waiting). What is not, and cannot be through dhs-replay: the model and its KV shape. workerd runs its built-in
--preset (default dsv4flash-like: 8 layers over 3 sources of 288-byte rows, 5 selections per token of k + window = 20,
p = 64); the example is its own toy (2 sources of 64-byte rows, one selection of k = 8 per token, p = 16), with a GPU
budget of 12 pages that forces reclaims. The figures say what an engine written in Python over the C ABI gets
end to end against the project's C++ worker, not the cost of the API alone (that is tests/libdhs/libdhs_bench.cc).

Usage: vs_workerd.py --memd build/memd/memd --dhs-replay build/tools/replay/dhs-replay [--requests 4]
Exit 0 when both ran (the example's outputs equal its resident loop, the replay served every request); 1 otherwise;
77 when numpy is missing."""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TRACE = os.path.join(ROOT, "tools", "replay", "data", "mooncake_conversation_head200.jsonl")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--memd", required=True)
    ap.add_argument("--dhs-replay", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--preset", default="dsv4flash-like")
    ap.add_argument("--python", default="/usr/bin/python3", help="a python3 with numpy")
    a = ap.parse_args()

    # 1. The example engine through libdhs (host page of its shape: p * (S * d_KV + L_idx * d_idx) = 2304 bytes).
    ex = subprocess.run([a.python, os.path.join(ROOT, "tests", "libdhs", "with_memd.py"), a.memd, "2304", "512", "--",
                         a.python, os.path.join(HERE, "sparse_decode.py"), "--run-dir", "@RUN_DIR@", "--requests",
                         str(a.requests)], capture_output=True, text=True, timeout=600)
    print(ex.stdout, end="")
    if ex.returncode == 77:
        return 77
    m = re.search(r"libdhs loop: ([0-9.]+) tokens/s; resident numpy loop: ([0-9.]+) tokens/s", ex.stdout)
    if ex.returncode != 0 or m is None:
        print(f"vs_workerd: the example failed (exit {ex.returncode}):\n{ex.stderr}", file=sys.stderr)
        return 1
    example_tps, resident_tps = float(m.group(1)), float(m.group(2))

    # 2. The same requests through workerd (dhs-replay starts memd + workerd).
    sys.path.insert(0, HERE)
    import sparse_decode  # noqa: E402 (numpy is there: the example ran)
    reqs = sparse_decode.requests_of_trace(TRACE, a.requests)
    tmp = tempfile.mkdtemp(prefix="dhs-vs-", dir="/tmp")
    try:
        trace = os.path.join(tmp, "trace.jsonl")
        with open(TRACE) as src, open(trace, "w") as out:
            for (prompt, n_out), line in zip(reqs, src):
                r = json.loads(line)
                out.write(json.dumps({"timestamp": 0, "input_length": len(prompt), "output_length": n_out,
                                      "hash_ids": r["hash_ids"][:1]}) + "\n")
        report = os.path.join(tmp, "report.json")
        cmd = [a.dhs_replay, "--trace", trace, "--requests", str(a.requests), "--length-scale", "1",
               "--concurrency", str(a.requests), "--mode", "adaptive", "--slots", "2", "--preset", a.preset,
               "--run-dir", os.path.join(tmp, "node"), "--json", report]
        rp = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if rp.returncode != 0 or not os.path.exists(report):
            print(f"vs_workerd: dhs-replay failed (exit {rp.returncode}):\n{rp.stdout}\n{rp.stderr}", file=sys.stderr)
            return 1
        rep = json.load(open(report))
    finally:
        subprocess.run(["rm", "-rf", tmp])
    served, tokens = rep.get("requests_served"), rep.get("output_tokens")
    workerd_tps = float(rep["output_tokens_per_s"])
    want = sum(n for _, n in reqs)
    print(f"requests: {[(len(p), n) for p, n in reqs]} (prompt tokens, output tokens); {want} output tokens")
    print(f"python example on libdhs: {example_tps:.1f} tokens/s (its resident numpy loop: {resident_tps:.1f})")
    print(f"workerd ({a.preset}, dhs-replay): {workerd_tps:.1f} tokens/s ({served} requests, {tokens} tokens, "
          f"elapsed {rep.get('elapsed_s', 0):.2f} s)")
    print(f"ratio python/workerd: {example_tps / workerd_tps:.2f}")
    if served != a.requests or tokens != want:
        print("vs_workerd: the replay did not serve every request in full", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
