#!/usr/bin/env python3
"""Sessions across nodes, the lookup (issue 26): a session's next turn imports the previous turn's history pages from
the store on another node instead of prefilling them. Real redis-server, three dhs-node nodes (A and B: hisparse,
prefix sharing, --cluster-store on one redis; R: resident, the exactness reference), and session_turn_client (one
request with explicit prompt bytes and a session id; the worker derives the prefix chain of the prompt's complete
blocks of 64 tokens).

  1. node A serves turn 1 of session 7: prompt P1 (300 bytes); it publishes its confirmed prefix pages (the 4
     complete blocks: 256 / 16 = 16 pages) under their prefix keys and, at its Complete, its other complete history
     pages (fed tokens = 300 + 40 - 1 = 339: floor(339 / 16) = 21 pages, pages 16..20) under the session key;
  2. node B (its own run dir and pool, same store) serves turn 2 of the same session: P2 = P1 + turn 1's 40 output
     tokens + 60 new bytes (400). Its chain covers 6 blocks (24 pages); pages 0..15 come by their prefix keys, pages
     16..20 (which turn 1 held beyond ITS chain) by their session keys: B's memd imports 21 pages, of which
     floor(339 / 16) - 16 = 5 session pages (dhsctl status --json cluster.session_imported), and turn 2's tokens and
     logits digests equal R's for P2 (turn 1's equal R's for P1);
  2b. session 8 with blocks of 256 tokens (a new prompt Q1 of 300 bytes on A, then Q2 = Q1 + its output + 60 bytes on
     B): both chains are one block (pages 0..15), so B asks pages 16..24 by their session addresses (after the chain)
     and imports 16 prefix + 5 session pages, exact;
  3. redis SIGKILLed before turn 2 on node C (fresh, same store address): C prefills, exact, nothing imported, misses
     counted.
After each turn the node's host pool holds only cached shared pages (nothing leaked); every node stops at SIGTERM
(exit 0); no /dev/shm segment is left.
Usage: cluster_session_turns_test.py DHS_NODE DHSCTL SESSION_TURN_CLIENT"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import cluster_tier_test as ct
from proc_util import pool_segments_naming, wait_until

P, T = 16, 64                    # page rows, prefix block tokens
LEN1, NEW1, ADD2, NEW2 = 300, 40, 60, 24
SESSION = 7


def turn(client, node, prompt, tag, tmp, session=SESSION, block=T):
    path, out = os.path.join(tmp, tag + ".prompt"), os.path.join(tmp, tag + ".json")
    with open(path, "wb") as f:
        f.write(bytes(prompt))
    new = NEW1 if tag.startswith("t1") else NEW2
    r = subprocess.run([client, f"ipc://{node.run_dir}/worker-0.sock", str(session), str(new), str(block), path, out],
                       capture_output=True, text=True, timeout=400)
    res = {}
    if os.path.exists(out):
        with open(out) as f:
            res = json.load(f)
    print(f"{tag}: rc {r.returncode}, {len(res.get('tokens', []))} tokens {res.get('error', '')} {r.stderr[-500:]}",
          flush=True)
    return r.returncode, res


def main():
    node_exe, dhsctl, client = sys.argv[1], sys.argv[2], sys.argv[3]
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        print("SKIP: redis-server / redis-cli not installed")
        return 77
    failures, nodes = [], []
    rng = random.Random(26)
    p1 = [rng.randrange(256) for _ in range(LEN1)]
    with tempfile.TemporaryDirectory(prefix="dhs-session-turns-") as tmp:
        tmp_dir = os.path.realpath(tmp)  # the nodes' pools name their run directories under it
        port = ct.free_port()
        redis = ct.Redis(tmp, port)
        redis.start()
        try:
            config = ct.CONFIG
            ct.CONFIG = config.replace('mode = "hisparse"', 'mode = "resident"').replace(
                'cluster_store = "{store}"\n', "").replace('prefix_sharing = "on"\n', "").replace(
                "cluster_lookup_timeout_ms = 200\n", "")  # memd refuses a lookup deadline without a store
            try:
                ref = ct.Node(node_exe, tmp, "r", port)
            finally:
                ct.CONFIG = config
            nodes.append(ref)
            a = ct.Node(node_exe, tmp, "a", port)
            nodes.append(a)

            rc, t1 = turn(client, a, p1, "t1-a", tmp)
            rc_r, t1_ref = turn(client, ref, p1, "t1-ref", tmp)
            if rc != 0 or rc_r != 0 or len(t1.get("tokens", [])) != NEW1:
                failures.append(f"turn 1: rc {rc} / {rc_r}, {len(t1.get('tokens', []))} tokens")
            elif t1["tokens"] != t1_ref["tokens"] or t1["logits_digests"] != t1_ref["logits_digests"]:
                failures.append("turn 1 on A differs from the resident run")
            ct.pool_clean(failures, "A", dhsctl, a)
            wait_until(lambda: ct.cluster_stats(dhsctl, a).get("queue_depth", 1) == 0, 10)
            ca = ct.cluster_stats(dhsctl, a)
            keys = [k for k in redis.cli("KEYS", "dhs1:*").split() if k]
            session_keys = sorted(k for k in keys if ":s:" in k)
            fed1 = LEN1 + NEW1 - 1
            prefix_pages = (LEN1 // T) * T // P                 # 16: turn 1's chain
            want_session = fed1 // P - prefix_pages             # 21 - 16 = 5
            print(f"node A: published {ca.get('published')}: {len(keys) - len(session_keys)} prefix, "
                  f"{len(session_keys)} session keys", flush=True)
            if len(keys) - len(session_keys) != prefix_pages or len(session_keys) != want_session:
                failures.append(f"A published {len(keys) - len(session_keys)} prefix pages (want {prefix_pages}) and "
                                f"{len(session_keys)} session pages (want {want_session})")
            pages = sorted(int(k.rsplit(":", 1)[1]) for k in session_keys)
            if pages != list(range(prefix_pages, prefix_pages + want_session)):
                failures.append(f"A's session pages {pages}")

            p2 = p1 + t1.get("tokens", []) + [rng.randrange(256) for _ in range(ADD2)]
            config = ct.CONFIG
            ct.CONFIG = config.replace('log_level = "info"\n', 'log_level = "info"\nmetrics_address = "127.0.0.1:0"\n')
            try:
                b = ct.Node(node_exe, tmp, "b", port)
            finally:
                ct.CONFIG = config
            nodes.append(b)
            rc, t2 = turn(client, b, p2, "t2-b", tmp)
            rc_r, t2_ref = turn(client, ref, p2, "t2-ref", tmp)
            cb = ct.cluster_stats(dhsctl, b)
            print(f"FIGURE session turn: node B imported {cb.get('imported')} pages ({cb.get('session_imported')} by "
                  f"their session key, want {want_session}; {cb.get('imported', 0) - cb.get('session_imported', 0)} "
                  f"prefix pages, want {prefix_pages}), looked up {cb.get('lookups')} ({cb.get('session_lookups')} "
                  f"session keys), misses {cb.get('misses')}", flush=True)
            if rc != 0 or rc_r != 0 or len(t2.get("tokens", [])) != NEW2:
                failures.append(f"turn 2: rc {rc} / {rc_r}, {len(t2.get('tokens', []))} tokens")
            elif t2["tokens"] != t2_ref["tokens"] or t2["logits_digests"] != t2_ref["logits_digests"]:
                failures.append("turn 2 on B differs from the resident run")
            if cb.get("session_imported") != want_session or cb.get("imported") != prefix_pages + want_session or \
                    cb.get("session_hits") != want_session:
                failures.append(f"B: imported {cb.get('imported')}, session_imported {cb.get('session_imported')}, "
                                f"session_hits {cb.get('session_hits')}; want {prefix_pages + want_session} and "
                                f"{want_session}")
            ct.pool_clean(failures, "B", dhsctl, b)
            text = subprocess.run([dhsctl, "--run-dir", b.run_dir, "status"], capture_output=True, text=True,
                                  timeout=30).stdout
            if f"cluster tier sessions: {cb.get('session_lookups')} pages looked up, {want_session} hits, " \
               f"{want_session} imported" not in text:
                failures.append(f"B: dhsctl status has no sessions line: {text[-600:]}")
            metrics = ""
            try:
                with open(os.path.join(b.run_dir, "memd.metrics")) as f:
                    address = f.read().strip()
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
                    metrics = resp.read().decode()
            except OSError as e:
                failures.append(f"B: GET /metrics: {e}")
            if f"dhs_memd_cluster_session_imported_total {want_session}" not in metrics or \
                    "# HELP dhs_memd_cluster_session_imported_total" not in metrics:
                failures.append("B: Prometheus has no dhs_memd_cluster_session_imported_total "
                                f"{want_session}: {[l for l in metrics.splitlines() if 'session' in l][:6]}")

            # Session 8 with blocks of 256 tokens: both turns' chains are one block (pages 0..15); turn 2's pages 16..20
            # are asked by their session addresses (after the chain), not as a chain page's alternate.
            q1 = [rng.randrange(256) for _ in range(LEN1)]
            before_keys = set(k for k in redis.cli("KEYS", "dhs1:*").split() if k)
            rc, u1 = turn(client, a, q1, "t1-a-256", tmp, session=8, block=256)
            rc_r, u1_ref = turn(client, ref, q1, "t1-ref-256", tmp, session=8, block=256)
            if rc != 0 or rc_r != 0 or u1.get("tokens") != u1_ref.get("tokens") or \
                    u1.get("logits_digests") != u1_ref.get("logits_digests"):
                failures.append(f"session 8 turn 1: rc {rc} / {rc_r} or differs from the resident run")
            wait_until(lambda: ct.cluster_stats(dhsctl, a).get("queue_depth", 1) == 0, 10)
            new_keys = set(k for k in redis.cli("KEYS", "dhs1:*").split() if k) - before_keys
            new_session = sum(":s:" in k for k in new_keys)
            if len(new_keys) - new_session != 16 or new_session != want_session:
                failures.append(f"session 8: A published {len(new_keys) - new_session} prefix and {new_session} "
                                f"session pages, want 16 and {want_session}")
            q2 = q1 + u1.get("tokens", []) + [rng.randrange(256) for _ in range(ADD2)]
            rc, u2 = turn(client, b, q2, "t2-b-256", tmp, session=8, block=256)
            rc_r, u2_ref = turn(client, ref, q2, "t2-ref-256", tmp, session=8, block=256)
            cb2 = ct.cluster_stats(dhsctl, b)
            got = (cb2.get("imported", 0) - cb.get("imported", 0),
                   cb2.get("session_imported", 0) - cb.get("session_imported", 0))
            print(f"FIGURE session turn (blocks of 256): node B imported {got[0]} pages, {got[1]} by their session "
                  f"address (want 21 and {want_session})", flush=True)
            if rc != 0 or rc_r != 0 or u2.get("tokens") != u2_ref.get("tokens") or \
                    u2.get("logits_digests") != u2_ref.get("logits_digests") or len(u2.get("tokens", [])) != NEW2:
                failures.append(f"session 8 turn 2 on B: rc {rc} / {rc_r} or differs from the resident run")
            if got != (16 + want_session, want_session):
                failures.append(f"session 8 turn 2 on B: imported {got}, want {(16 + want_session, want_session)}")
            ct.pool_clean(failures, "B (256)", dhsctl, b)

            # The store killed before turn 2 on a fresh node: prefilled, exact, nothing imported.
            redis.kill()
            c = ct.Node(node_exe, tmp, "c", port)
            nodes.append(c)
            rc, t2c = turn(client, c, p2, "t2-c", tmp)
            cc = ct.cluster_stats(dhsctl, c)
            print(f"store down: node C imported {cc.get('imported')}, misses {cc.get('misses')}", flush=True)
            if rc != 0 or t2c.get("tokens") != t2_ref.get("tokens") or \
                    t2c.get("logits_digests") != t2_ref.get("logits_digests"):
                failures.append(f"C (store down): rc {rc}, output differs from the resident run")
            if cc.get("imported") != 0 or ct.misses(cc, "unavailable", "store_down", "timeout") == 0:
                failures.append(f"C (store down): imported {cc.get('imported')}, misses {cc.get('misses')}")
            ct.pool_clean(failures, "C", dhsctl, c)
            for n in nodes:
                if n.stop() != 0:
                    failures.append(f"{n.run_dir}: exit at SIGTERM not 0")
        finally:
            for n in nodes:
                if n.proc.poll() is None:
                    n.proc.kill()
                    n.proc.wait()
            redis.kill()
    left = pool_segments_naming(tmp_dir)  # this test's pools only (a shared machine runs other memds)
    if left:
        failures.append(f"/dev/shm segments left: {sorted(left)}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
