#!/usr/bin/env python3
"""dhs-replay passes memd's cache limits (issue 24): --prefix-tenant-quota-pages limits the host pages a tenant stores
in memd's shared tier, and --prefix-eviction reaches memd (a real memd + workerd started by dhs-replay).

The trace (hand-made, Mooncake JSONL, length scale 0.125: the 512-token block becomes T = 64 tokens = one host page of
p = 64 rows, workerd's default): four requests in a closed loop at C = 1 (each after the previous one ended, its host
copies confirmed), hisparse, sharing on:
  row 0: chain A (8 ids) + 1 partial block: 4176 -> 522 tokens = 8 complete blocks + 10 tokens: 8 shareable pages;
  row 1: row 0 again: its 8 blocks are in host (8 pages wholly before its last input token: (522 - 1) // 64 = 8);
  row 2: chain B (8 other ids), the same length;
  row 3: row 0 again.
Without a quota memd stores every page once: A's 8 and B's 8 = 16 shared pages; rows 1 and 3 import all 8 blocks of A:
hits_host = 16. With a quota of Q = 3 pages for the (default) tenant: row 0 stores its first 3 pages (the 4th is
refused: no cached page of the tenant to give up), row 1 imports those 3 (hits 3) and stores nothing more; row 2 (chain
B) stores 3 pages by evicting the tenant's 3 cached A pages; row 3 finds none of A (hits 0) and stores 3 again in place
of B's: hits_host = 3, host_pages_shared = 3 at the end. The tokens are exact either way (--check-exact).
Usage: replay_prefix_limits_test.py DHS_REPLAY"""
import json
import os
import subprocess
import sys
import tempfile

Q = 3


def trace(tmp):
    a = [7000 + b for b in range(9)]  # 9 ids: ceil(522 / 64) = 9 kept, the 9th block partial
    b = [8000 + b for b in range(9)]
    rows = [a, a, b, a]
    path = os.path.join(tmp, "limits.jsonl")
    with open(path, "w") as f:
        for k, ids in enumerate(rows):
            f.write(json.dumps({"timestamp": k, "input_length": 4176, "output_length": 16, "hash_ids": ids}) + "\n")
    return path


def replay(exe, tmp, tag, args):
    out = os.path.join(tmp, tag + ".json")
    cmd = [exe, *args, "--json", out]
    print("$", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(proc.stdout, end="", flush=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
    report = {}
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    return proc.returncode, report, proc.stdout


def main():
    exe = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        base = ["--trace", trace(tmp), "--requests", "4", "--length-scale", "0.125", "--mode", "hisparse",
                "--concurrency", "1", "--prefix-sharing", "on", "--check-exact"]
        rc, free, _ = replay(exe, tmp, "no-quota", base)
        rc2, quota, text = replay(exe, tmp, "quota", base + ["--prefix-tenant-quota-pages", str(Q),
                                                              "--prefix-eviction", "fifo"])
        for tag, code, r in (("no quota", rc, free), ("quota", rc2, quota)):
            if code != 0 or r.get("requests_served") != 4 or r.get("exact_match") is not True:
                failures.append(f"{tag}: exit {code}, served {r.get('requests_served')}, exact {r.get('exact_match')}")
        if not failures:
            got = [(r["host_pages_shared"], r["prefix"]["hits_host"], r["prefix"]["lookups"]) for r in (free, quota)]
            # lookups: 4 requests x 8 complete blocks either way.
            if got != [(16, 16, 32), (Q, Q, 32)]:
                failures.append(f"(host_pages_shared, hits_host, lookups) without / with quota {Q}: {got}, want "
                                f"[(16, 16, 32), ({Q}, {Q}, 32)]")
            s = quota.get("settings") or {}
            if (s.get("prefix_tenant_quota_pages"), s.get("prefix_eviction")) != (Q, "fifo"):
                failures.append(f"settings: {s.get('prefix_tenant_quota_pages')}, {s.get('prefix_eviction')}")
            if f"(eviction fifo, tenant quota {Q} pages)" not in text:
                failures.append("the text report does not name the limits")
        # Refused before anything starts: exit 2, a clear message.
        for args, want in ((["--prefix-tenant-quota-pages", "4"], "needs --prefix-sharing on"),
                           (["--prefix-eviction", "lru", "--connect", "ipc:///nonexistent/w.sock"], "not to --connect")):
            proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
            if proc.returncode != 2 or want not in proc.stderr:
                failures.append(f"{args}: exit {proc.returncode}, stderr {proc.stderr.strip()[:200]!r}")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print(f"OK: a tenant quota of {Q} pages holds memd's shared pages and host hits to {Q}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
