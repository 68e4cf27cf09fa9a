#!/usr/bin/env python3
"""dhs-replay --nodes 2 end to end (issue 26): two real nodes (memd + workerd each) started by dhs-replay, the requests
routed round-robin, by session and by prefix (the nodes' KV event streams), outputs compared with ONE resident node
(--check-exact), a worker killed on each node mid-run (kill points), and the redis-server dhs-replay starts for --cluster-store stopped at the end.

The trace (hand-made, Mooncake JSONL, length scale 0.125: the 512-token block becomes T = 64 tokens, one host page of
workerd's 64 rows): three conversations X, Y, Z with ids of their own, every turn's last block partial (input
nb * 512 + 200 tokens -> nb * 64 + 25: nb complete blocks + 1 partial id):
  row 0 X turn 0 (4 complete blocks), row 1 Y turn 0 (4), row 2 Z turn 0 (4),
  row 3 X turn 1 (6: X's 4 + 2 new), row 4 Y turn 1 (6), row 5 Z turn 1 (6),
  row 6 X turn 2 (8: X turn 1's 6 + 2 new), row 7 Y turn 2 (8).
Sessions (tools/replay/sessions.h): rows 0, 3, 6 = session 0; 1, 4, 7 = session 1; 2, 5 = session 2.
Closed loop at C = 1 (each request submitted after the previous ended), hisparse, --prefix-sharing on. Worked out:
  round-robin: nodes 0 1 0 1 0 1 0 1;
  session:     new sessions round-robin (X -> 0, Y -> 1, Z -> 0), turns follow: nodes 0 1 0 0 1 0 0 1;
  prefix:      the turns 0 miss (no node holds a block; loads all 0, ties rotate: 0, 1, 0), every later turn is a
               prefix hit on its previous turn's node (only that node holds its blocks): nodes 0 1 0 0 1 0 0 1, and
               reasons miss miss miss hit hit hit hit hit, with 1 <= matched blocks <= the previous turn's complete
               blocks.
The host-tier hits follow from the routes (EXPECTED_HOST_HITS): under session and prefix routing every next turn finds
its conversation's blocks on its node; under round-robin rows 3, 4, 5 land on the other node (miss) and only rows 6, 7
find their turn 0 there.
Usage: replay_nodes_test.py DHS_REPLAY"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import signal  # noqa: F401 (subprocess.signal)
import time

from proc_util import pool_segments_naming

ROWS = [("X", 0, 4), ("Y", 0, 4), ("Z", 0, 4), ("X", 1, 6), ("Y", 1, 6), ("Z", 1, 6), ("X", 2, 8), ("Y", 2, 8)]
BASE_ID = {"X": 1000, "Y": 2000, "Z": 3000}
SESSIONS = [0, 1, 2, 0, 1, 2, 0, 1]
TURNS = [0, 0, 0, 1, 1, 1, 2, 2]
# Host-tier hits in blocks (every complete block is one 64-row page): session / prefix: rows 3, 4, 5 import their turn
# 0's 4 blocks, rows 6, 7 their turn 1's 6: 4 * 3 + 6 * 2 = 24; round-robin: only rows 6 and 7 (on their turn 0's node)
# import turn 0's 4 blocks: 8.
EXPECTED_HOST_HITS = {"round-robin": 8, "session": 24, "prefix": 24}
EXPECTED_NODES = {"round-robin": [0, 1, 0, 1, 0, 1, 0, 1], "session": [0, 1, 0, 0, 1, 0, 0, 1],
                  "prefix": [0, 1, 0, 0, 1, 0, 0, 1]}


def trace(tmp, mult=1):
    """The trace of ROWS, each conversation's blocks `mult` times as many (mult 8 at length scale 1/64: the same
    tokens as mult 1 at 1/8, in T = 8-token blocks, 8 per 64-row page)."""
    path = os.path.join(tmp, f"conversations{mult}.jsonl")
    with open(path, "w") as f:
        for k, (conv, turn, nb) in enumerate(ROWS):
            nb *= mult
            ids = [BASE_ID[conv] + b for b in range(nb)] + [BASE_ID[conv] + 500 + turn]  # + the partial block's id
            f.write(json.dumps({"timestamp": k, "input_length": nb * 512 + 200, "output_length": 96,
                                "hash_ids": ids}) + "\n")
    return path


def shm(tmp=None):
    """memd host-pool segments in /dev/shm whose header names a run directory under `tmp` (the test's runs: dhs-replay
    runs with TMPDIR=tmp; other processes on the machine have segments of their own)."""
    return pool_segments_naming(tmp)


def replay(exe, tmp, tag, args, timeout=600):
    out = os.path.join(tmp, tag + ".json")
    cmd = [exe, *args, "--json", out]
    print("$", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, TMPDIR=tmp))
    print(proc.stdout, end="", flush=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
    report = {}
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    return proc.returncode, report, proc.stderr


def host_hits(report):
    return sum(n["hits_blocks"]["host"] for n in report["multi_node"]["per_node"])


def check_routed(failures, route, report, store=None, mult=1):
    m = report.get("multi_node")
    if not m:
        failures.append(f"{route}: no multi_node section")
        return
    routing = sorted(m["routing"], key=lambda r: r["trace_index"])
    nodes = [r["node"] for r in routing]
    if nodes != EXPECTED_NODES[route]:
        failures.append(f"{route}: nodes {nodes}, expected {EXPECTED_NODES[route]}")
    if [r["session"] for r in routing] != SESSIONS or [r["turn"] for r in routing] != TURNS:
        failures.append(f"{route}: sessions {[r['session'] for r in routing]} turns {[r['turn'] for r in routing]}")
    if m["sessions"] != 3 or m["next_turns"] != 5 or m["nodes"] != 2 or m["route"] != route:
        failures.append(f"{route}: sessions {m['sessions']}, next turns {m['next_turns']}, nodes {m['nodes']}")
    per = m["per_node"]
    for n in (0, 1):
        want = nodes.count(n)
        if per[n]["requests"] != want or per[n]["requests_served"] != want:
            failures.append(f"{route}: node {n} has {per[n]['requests']} requests, expected {want}")
    if sum(p["output_tokens"] for p in per) != report["output_tokens"]:
        failures.append(f"{route}: per-node output tokens do not add up to {report['output_tokens']}")
    if store is None and any(p["cluster"] is not None for p in per):
        failures.append(f"{route}: cluster figures reported without a cluster tier")
    if route == "prefix":
        reasons = [r["reason"] for r in routing]
        want = ["prefix_miss"] * 3 + ["prefix_hit"] * 5
        if reasons != want:
            failures.append(f"{route}: reasons {reasons}, expected {want}")
        for r in routing[3:]:
            parent_blocks = ROWS[r["trace_index"] - 3][2] * mult
            if not 1 <= r["matched_blocks"] <= parent_blocks:
                failures.append(f"{route}: row {r['trace_index']} matched {r['matched_blocks']} blocks")
        if m["kv_events"]["seen"] < 1 or m["kv_events"]["settle_timeouts"] != 0:
            failures.append(f"{route}: KV events {m['kv_events']}")


def redis_alive(port):
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"redis-server") and str(port).encode() in cmd:
            return True
    return False


def check_cluster_store(failures, exe, tmp, base, store):
    """dhs-replay starts the store, hands its address to every memd (memd's cluster tier), and stops it at the end
    whatever happened; the run is exact and the nodes publish to and import from the store."""
    rc, report, err = replay(exe, tmp, "store-" + store, base + ["--route", "round-robin", "--cluster-store", store])
    m = re.search(r"cluster store \S+ at redis://([0-9.:,]+) \((\S+)\)", err)
    if not m:
        failures.append(f"--cluster-store {store}: no 'cluster store ... at redis://...' line (rc {rc})")
        return
    for kept in re.findall(r"run director(?:y|ies) kept: ([^)]+)\)", err):  # a failed start keeps its logs
        for d in kept.split(", "):
            shutil.rmtree(d, ignore_errors=True)
    ports = [a.split(":")[1] for a in m.group(1).split(",")]
    if len(ports) != (1 if store == "local" else 6):
        failures.append(f"--cluster-store {store}: {len(ports)} servers")
    time.sleep(0.2)
    for p in ports:
        if redis_alive(p):
            failures.append(f"--cluster-store {store}: redis-server on port {p} still running after dhs-replay ended")
    if os.path.exists(m.group(2)):
        failures.append(f"--cluster-store {store}: its directory {m.group(2)} was left behind")
    if shm(tmp):
        failures.append(f"--cluster-store {store}: /dev/shm leftovers {sorted(shm(tmp))}")
    if rc != 0:
        failures.append(f"--cluster-store {store}: dhs-replay exited {rc}: {err[-600:]}")
    else:  # round-robin's next turns can find their blocks in the store
        if report.get("exact_match") is not True or report["multi_node"]["cluster_endpoint"] is None:
            failures.append(f"--cluster-store {store}: exact {report.get('exact_match')}")
        check_routed(failures, "round-robin", report, store)
        per = report["multi_node"]["per_node"]
        published = sum((p["cluster"] or {}).get("published", 0) for p in per)
        print(f"  --cluster-store {store}: host hits {host_hits(report)} (node-local only: "
              f"{EXPECTED_HOST_HITS['round-robin']}), published {published} pages, cluster "
              f"{[p['cluster'] for p in per]}", flush=True)
        if any(p["cluster"] is None for p in per) or published < 1:
            failures.append(f"--cluster-store {store}: cluster figures {[p['cluster'] for p in per]}")
        if host_hits(report) < EXPECTED_HOST_HITS["round-robin"]:
            failures.append(f"--cluster-store {store}: host hits {host_hits(report)} below node-local only's")


def check_new_run_dir_with_a_local_store(failures, exe, tmp, base):
    """--run-dir NEW with --cluster-store local: NEW is created 0700 before the Redis directory inside it (creating
    RUN_DIR/redis first made NEW 0755, which the nodes' run directory check then refused), the run is exact, and
    RUN_DIR/redis is kept."""
    new = os.path.join(tmp, "fresh", "run")
    rc, report, err = replay(exe, tmp, "new-run-dir", base + ["--route", "round-robin", "--cluster-store", "local",
                                                              "--run-dir", new])
    if rc != 0 or report.get("exact_match") is not True:
        failures.append(f"--run-dir NEW with a local store: rc {rc}, exact {report.get('exact_match')}: {err[-600:]}")
        return
    mode = os.stat(new).st_mode & 0o777
    if mode != 0o700 or not os.path.isdir(os.path.join(new, "redis")):
        failures.append(f"--run-dir NEW: mode {oct(mode)}, redis/ kept {os.path.isdir(os.path.join(new, 'redis'))}")


def check_one_node_store(failures, exe, tmp, base):
    """Issue 26 review (F4): one node with --cluster-store reports its cluster figures as multi_node.per_node[0]
    (multi_node was null with one node), with memd's miss reasons and its store's health."""
    one = [a if a != "2" or base[i - 1] != "--nodes" else "1" for i, a in enumerate(base)]
    rc, report, _ = replay(exe, tmp, "one-node-store", one + ["--cluster-store", "local"])
    m = report.get("multi_node") or {}
    per = m.get("per_node") or [{}]
    c = per[0].get("cluster") or {}
    print(f"  one node, --cluster-store local: {c}", flush=True)
    if rc != 0 or m.get("nodes") != 1 or len(per) != 1 or per[0].get("requests") != len(ROWS):
        failures.append(f"one node with a store: rc {rc}, multi_node nodes {m.get('nodes')}, per_node {per}")
    elif (m.get("cluster_counters") != "measured" or c.get("published", 0) < 1 or c.get("health") != "up"
          or c.get("reachable") != "yes"
          or "absent" not in (c.get("misses") or {}) or c.get("memd_restarts_seen") != 0):
        failures.append(f"one node with a store: cluster {c}, counters {m.get('cluster_counters')}")


def redis_with_dir(fragment):
    """pids of redis-server processes working in a directory under `fragment` (--dir: redis chdirs there; its command
    line is retitled once it runs)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if comm.startswith("redis-server") and cwd.startswith(fragment):
            out.append(int(pid))
    return out


def check_sigint_while_the_cluster_starts(failures, exe, tmp, base):
    """SIGINT while dhs-replay builds its 3-master cluster (6 servers and redis-cli --cluster create take seconds; the
    signal is handled when the start ended): exit 130, its Redis directory removed, no redis-server of it left."""
    run_parent = os.path.join(tmp, "sigint")
    os.makedirs(run_parent)
    env = dict(os.environ, TMPDIR=run_parent)
    proc = subprocess.Popen([exe, *base, "--route", "session", "--cluster-store", "local-cluster"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 20
    started = 0
    while time.time() < deadline and started == 0:  # the first server is up
        started = len(redis_with_dir(run_parent))
        time.sleep(0.05)
    proc.send_signal(subprocess.signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    if started == 0:
        failures.append("SIGINT: no redis-server was seen starting")
    if proc.returncode != 130:
        failures.append(f"SIGINT: exit {proc.returncode}, expected 130: {err[-500:]}")
    deadline = time.time() + 5
    while time.time() < deadline and redis_with_dir(run_parent):
        time.sleep(0.1)
    if redis_with_dir(run_parent):
        failures.append(f"SIGINT: redis-server left running: {redis_with_dir(run_parent)}")
    left = [d for d in os.listdir(run_parent) if d.startswith("dhs-replay-redis-")]
    if left:
        failures.append(f"SIGINT: Redis directory left behind: {left}")
    print(f"  SIGINT while the cluster started ({started} servers up): exit {proc.returncode}", flush=True)


def free_port():
    import socket
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def redis_keyspace(cli):
    """Redis's INFO stats keyspace_hits / keyspace_misses: keys GET / MGET found / did not find."""
    info = subprocess.run(cli + ["info", "stats"], capture_output=True, text=True).stdout
    return {k: int(v) for k, v in re.findall(r"^(keyspace_hits|keyspace_misses):(\d+)", info, re.M)}


def check_cluster_counters(failures, what, report, keyspace, restarted):
    """The per-node cluster counters of `report` (summed) against what Redis counted in the same run (`keyspace`:
    keyspace_hits / keyspace_misses). A lookup that timed out in memd still reached Redis (counted there, a `timeout`
    miss in memd, found or not); a page memd found was found by Redis. With memd restarts (`restarted`) the counts of a
    memd after its last sample are lost: at least half must remain, and the restarts seen are at most the restarts."""
    per = (report.get("multi_node") or {}).get("per_node") or []
    cl = [p.get("cluster") or {} for p in per]
    lookups, hits = sum(c.get("lookups", 0) for c in cl), sum(c.get("hits", 0) for c in cl)
    timeouts = sum((c.get("misses") or {}).get("timeout", 0) for c in cl)
    seen = sum(c.get("memd_restarts_seen", 0) for c in cl)
    asked = keyspace.get("keyspace_hits", 0) + keyspace.get("keyspace_misses", 0)
    found = keyspace.get("keyspace_hits", 0)
    print(f"  {what}: memds looked up {lookups} pages ({timeouts} timed out), found {hits}; Redis answered {asked} "
          f"keys, found {found}; memd restarts {report.get('memd_restarts')}, seen {seen}; "
          f"misses {[c.get('misses') for c in cl]}", flush=True)
    if not cl or any(not c for c in cl):
        failures.append(f"{what}: cluster figures {cl}")
        return
    if restarted:
        ok = asked // 2 <= lookups <= asked + timeouts and hits <= found and 1 <= seen <= report.get("memd_restarts", 0)
    else:
        ok = asked <= lookups <= asked + timeouts and hits <= found <= hits + timeouts and seen == 0
    if not ok:
        failures.append(f"{what}: cluster counters lookups {lookups} (timeouts {timeouts}), hits {hits}, restarts seen "
                        f"{seen} against Redis's {asked} keys asked, {found} found, memd restarts "
                        f"{report.get('memd_restarts')}")


def check_nodes_killed_while_publishing(failures, exe, tmp):
    """Issue 26's fault "a node killed while publishing": 2 nodes publish to one redis-server (started here) while
    their memds (the publishers) are SIGKILLed about every second, their workers about every 3 s (supervised
    restarts; at least one memd kill is required, the run lasting several seconds): every request
    finishes exact, no host row lost, no host pool left in /dev/shm, the store holds pages; then 2 fresh nodes without faults replay the same
    requests against that store: they import pages the killed nodes published (checked values: a torn or wrong one
    would be a counted miss, never a row) and are exact."""
    port, sdir = free_port(), os.path.join(tmp, "redis-killed")
    os.makedirs(sdir)
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", sdir], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        cli = ["redis-cli", "-p", str(port)]
        for _ in range(100):
            if subprocess.run(cli + ["ping"], capture_output=True, text=True).stdout.strip() == "PONG":
                break
            time.sleep(0.05)
        data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "replay", "data",
                            "mooncake_conversation_head1000.jsonl")
        run = ["--trace", data, "--requests", "80", "--length-scale", "0.015625", "--mode", "hisparse",
               "--concurrency", "4", "--prefix-sharing", "on", "--nodes", "2", "--route", "round-robin",
               "--cluster-store", f"redis://127.0.0.1:{port}", "--check-exact"]
        rc, report, _ = replay(exe, tmp, "killed-publishing", run + ["--restart-memd-every", "1",
                                                                     "--kill-worker-every", "3", "--fault-seed", "7"])
        got = {k: report.get(k) for k in ("exact_match", "requests_served", "requests_failed", "host_rows_lost")}
        want = {"exact_match": True, "requests_served": 80, "requests_failed": 0, "host_rows_lost": 0}
        if rc != 0 or got != want or not report.get("memd_restarts"):  # the workers' kills: as they fall
            failures.append(f"nodes killed while publishing: rc {rc}, {got}, memd restarts "
                            f"{report.get('memd_restarts')}, worker restarts {report.get('worker_restarts')}")
        if shm(tmp):  # issue 26 review: a node stopped while its memd was dead (restart backoff) left its pool
            failures.append(f"nodes killed while publishing: /dev/shm leftovers {sorted(shm(tmp))}")
        # Issue 26 review (F3): the per-node cluster counters are the run's, across memd restarts, not the last memd's:
        # Redis counted every key the memds asked (keyspace hits + misses); the report must account for most of them
        # (what a memd counted after its last sample, at most one 200 ms sample period before its kill, is lost) and
        # never for more (a restart counted twice would add a memd's counts again).
        ks = redis_keyspace(cli)
        check_cluster_counters(failures, "nodes killed while publishing", report, ks, restarted=True)
        keys = int(subprocess.run(cli + ["dbsize"], capture_output=True, text=True).stdout.strip() or 0)
        rc, report, _ = replay(exe, tmp, "after-killed-publishing", run)
        imported = sum((n.get("cluster") or {}).get("imported", 0) for n in report.get("multi_node", {}).get(
            "per_node", []))
        print(f"  killed while publishing: {keys} pages in the store; fresh nodes imported {imported}", flush=True)
        if keys < 1 or rc != 0 or report.get("exact_match") is not True or imported < 1:
            failures.append(f"after nodes killed while publishing: {keys} keys, rc {rc}, exact "
                            f"{report.get('exact_match')}, imported {imported}")
        # No fault: the memds' counters are Redis's, key for key (the last sample follows the last admission).
        after = redis_keyspace(cli)
        check_cluster_counters(failures, "after nodes killed while publishing", report,
                               {k: after[k] - ks[k] for k in after}, restarted=False)
    finally:
        server.kill()
        server.wait()


def main():
    exe = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        base = ["--trace", trace(tmp), "--requests", str(len(ROWS)), "--length-scale", "0.125", "--mode", "hisparse",
                "--concurrency", "1", "--prefix-sharing", "on", "--nodes", "2", "--check-exact"]
        hits = {}
        for route in ("round-robin", "session", "prefix"):
            rc, report, _ = replay(exe, tmp, route, base + ["--route", route])
            if rc != 0 or report.get("exact_match") is not True or report.get("requests_served") != len(ROWS):
                failures.append(f"{route}: rc {rc}, exact {report.get('exact_match')}, served "
                                f"{report.get('requests_served')}")
                continue
            check_routed(failures, route, report)
            hits[route] = host_hits(report)
            if report["prefix"]["hits_host"] != hits[route]:
                failures.append(f"{route}: overall host hits {report['prefix']['hits_host']} != per-node sum")
            if shm(tmp):
                failures.append(f"{route}: /dev/shm leftovers {sorted(shm(tmp))}")
        print(f"host hits (blocks) by route: {hits}", flush=True)
        # Blocks smaller than a page (T = 8 tokens, 64-row pages, as the 1/64-scaled Mooncake trace): memd announces
        # only every 8th block (the one holding a page's last row), never c_0. The same routes and hits as above, and
        # no next turn waits out kv_settle_ms for an announcement that never comes.
        small = ["--trace", trace(tmp, 8), "--requests", str(len(ROWS)), "--length-scale", "0.015625", "--mode",
                 "hisparse", "--concurrency", "1", "--prefix-sharing", "on", "--nodes", "2", "--route", "prefix"]
        rc, report, _ = replay(exe, tmp, "prefix-small-blocks", small)
        if rc != 0 or report.get("requests_served") != len(ROWS):
            failures.append(f"prefix, 8-token blocks: rc {rc}, served {report.get('requests_served')}")
        else:
            check_routed(failures, "prefix", report, mult=8)
            if host_hits(report) != 8 * EXPECTED_HOST_HITS["prefix"]:
                failures.append(f"prefix, 8-token blocks: host hits {host_hits(report)}, expected "
                                f"{8 * EXPECTED_HOST_HITS['prefix']}")
        # Each node's first worker kills itself at its 5th decode step (--kill-worker-at: the k-th start of a node's
        # worker gets the k-th point): both are restarted, each resumes its one request in flight (C = 1 per node at
        # most), the routes are session routing's, the outputs exact and no host row lost.
        rc, report, _ = replay(exe, tmp, "kill", base + ["--route", "session", "--kill-worker-at", "decode:5"])
        if rc != 0 or report.get("exact_match") is not True:
            failures.append(f"kill: rc {rc}, exact {report.get('exact_match')}")
        else:
            check_routed(failures, "session", report)
            got = {k: report.get(k) for k in ("worker_restarts", "kill_points_armed", "requests_resumed",
                                              "host_rows_lost", "requests_served")}
            want = {"worker_restarts": 2, "kill_points_armed": 2, "requests_resumed": 2, "host_rows_lost": 0,
                    "requests_served": len(ROWS)}
            if got != want:
                failures.append(f"kill: {got}, expected {want}")
        if hits != EXPECTED_HOST_HITS:
            failures.append(f"host hits {hits}, expected {EXPECTED_HOST_HITS}")
        for store in ("local", "local-cluster"):
            check_cluster_store(failures, exe, tmp, base, store)
        check_new_run_dir_with_a_local_store(failures, exe, tmp, base)
        check_one_node_store(failures, exe, tmp, base)
        check_sigint_while_the_cluster_starts(failures, exe, tmp, base)
        check_nodes_killed_while_publishing(failures, exe, tmp)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
