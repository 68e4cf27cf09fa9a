#!/usr/bin/env python3
"""The cluster tier end to end (issue 26, memd side): real redis-server, real nodes (dhs-node: memd + one hisparse
workerd each, its own run directory), dhs-replay --connect to each node's worker.

The conversation trace of replay_prefix_sharing_test (15 first turns, then their follow-up turns; lengths x 0.03).
  1. node A (sharing on, --cluster-store redis://127.0.0.1:PORT) serves the trace: its confirmed shared prefix pages
     are published (dhsctl status --json: cluster.published > 0, shed 0, store up);
  2. node B (its own run directory and pool, same store) serves the same trace: pages imported from the cluster tier
     (cluster.hits > 0, cluster.imported > 0, misses counted) and every request's tokens and logits digests equal
     node A's (hisparse with sharing equals resident: replay_prefix_sharing_test), and equal to a resident run;
  3. a value corrupted in the store (every published value's payload byte flipped through redis-cli): node C serves
     the trace exact, no corrupted value imported (only session pages C itself published during the pass, found by
     its follow-up turns), the misses counted as bad_value (checksum_mismatch);
  4. redis SIGKILLed: node D serves the trace exact, misses counted (unavailable / store_down), nothing imported;
     redis restarted empty on the same port: the tier comes back up (a probe) and node D serves the trace again, exact;
  5. redis SIGSTOPped: node E serves the trace exact (each lookup costs at most the deadline, then backoff), misses
     counted (timeout / store_down); SIGCONT at the end;
  7. (before 6) two nodes publishing the same pages at once: both exact, the store holds each page once; a node of
     another geometry (p = 8) finds nothing (another key space: absent misses), exact; a node of the same geometry
     imports, exact; a node of the same geometry but another model (seed 2) finds nothing (absent misses);
  6. a 3-master Redis Cluster with a replica each: node F publishes (keys on every master), a master is SIGKILLed and
     its replica takes over, node G (the dead master its first seed) imports pages, exact.
After every pass the node's host pool holds only cached shared pages (no request, nothing leaked, pinned, shared or
being written; allocated + reusable = the pool: dhsctl status). Every node is stopped with SIGTERM (exit 0).
Usage: cluster_tier_test.py DHS_NODE DHS_REPLAY DHSCTL"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from proc_util import wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "..", "tools", "replay", "data", "mooncake_conversation_head200.jsonl")
PAIRS = 15
N = 2 * PAIRS

CONFIG = """
[node]
run_dir = "{run_dir}"

[memd]
host_pool_bytes = "{pool}"
log_level = "info"
prefix_sharing = "on"
cluster_store = "{store}"
cluster_lookup_timeout_ms = 200

[[worker]]
gpu = 0
preset = "glm5-like"
seed = {seed}
page_rows = {page_rows}
slots = 4
hbm_budget_bytes = "64MiB"
device = "cpu"
mode = "hisparse"
memd_timeout_ms = 5000
"""


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_port():
    """A free loopback port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        p = free_port()
        if p + 10000 < 65536:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p + 10000))
                return p
            except OSError:
                pass
    raise RuntimeError("no free port pair")


class Redis:
    def __init__(self, tmp, port, name="redis", cluster=False):
        self.dir, self.port, self.proc, self.cluster = os.path.join(tmp, name), port, None, cluster
        os.makedirs(self.dir, exist_ok=True)

    def start(self):
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
                "--appendonly", "no", "--protected-mode", "no"]
        if self.cluster:  # as tests/common/redis_test_util.h's cluster nodes
            args += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(self.dir, "nodes.conf"),
                     "--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
                     "--repl-diskless-sync-delay", "0"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_until(lambda: self.cli("PING").strip() == "PONG", 10):
            raise RuntimeError("redis-server did not answer PING")

    def cli(self, *args, raw=False):
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args], capture_output=True,
                           timeout=10)
        return r.stdout if raw else r.stdout.decode(errors="replace")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Node:
    def __init__(self, exe, tmp, name, port, pool="64MiB", store=None, page_rows=16, seed=1):
        self.run_dir = os.path.join(tmp, name)
        self.config = os.path.join(tmp, name + ".toml")
        self.out = os.path.join(tmp, name + ".out")
        with open(self.config, "w") as f:
            f.write(CONFIG.format(run_dir=self.run_dir, pool=pool, store=store or f"redis://127.0.0.1:{port}",
                                  page_rows=page_rows, seed=seed))
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen([exe, "--config", self.config], stdout=out, stderr=subprocess.STDOUT)
        if not wait_until(lambda: "node ready (1 workers)" in read(self.out) or self.proc.poll() is not None, 120):
            raise RuntimeError(f"{name}: not ready: {read(self.out)[-2000:]}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"{name}: exited {self.proc.returncode}: {read(self.out)[-2000:]}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return -9
        return self.proc.returncode


def start_cluster(tmp, masters=3, replicas=1):
    """A Redis Cluster of `masters` masters with a replica each (redis-cli --cluster create), every node in its own
    directory; ready when every node sees cluster_state:ok."""
    nodes = []
    for i in range(masters * (1 + replicas)):
        r = Redis(tmp, free_cluster_port(), f"cluster{i}", cluster=True)
        r.start()
        nodes.append(r)
    out = subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{r.port}" for r in nodes],
                          "--cluster-replicas", str(replicas), "--cluster-yes"], capture_output=True, text=True,
                         timeout=60).stdout
    if "All 16384 slots covered" not in out:
        raise RuntimeError(f"redis-cli --cluster create: {out[-1000:]}")
    if not wait_until(lambda: all("cluster_state:ok" in r.cli("CLUSTER", "INFO") for r in nodes), 30):
        raise RuntimeError("the cluster is not ok")
    return nodes


def conversation_trace(tmp):
    rows = []
    with open(TRACE) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) == PAIRS:
                break
    firsts, follow_ups = [], []
    for k, r in enumerate(rows):
        own = [10**12 + 100 * k + j for j in range(8)]
        a = {"timestamp": r["timestamp"], "input_length": r["input_length"], "output_length": r["output_length"],
             "hash_ids": r["hash_ids"] + own}
        firsts.append(a)
        follow_ups.append(dict(a, input_length=r["input_length"] + 4 * 512,
                               hash_ids=r["hash_ids"] + [2 * 10**12 + 100 * k + j for j in range(4)] +
                               [3 * 10**12 + 100 * k + j for j in range(8)]))
    path = os.path.join(tmp, "conversation.jsonl")
    with open(path, "w") as f:
        for row in firsts + follow_ups:
            f.write(json.dumps(row) + "\n")
    return path


def replay(exe, tmp, tag, args):
    out, outputs = os.path.join(tmp, f"{tag}.json"), os.path.join(tmp, f"{tag}.outputs")
    cmd = [exe, *args, "--json", out, "--outputs", outputs]
    print("$", " ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    report, rows = {}, {}
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    if os.path.exists(outputs):
        with open(outputs) as f:
            rows = {r["trace_index"]: r for r in map(json.loads, filter(None, f.read().splitlines()))}
    print(f"  rc {proc.returncode}: served {report.get('requests_served')}/{N}, failed {report.get('requests_failed')},"
          f" {time.monotonic() - t0:.1f} s", flush=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
    return proc.returncode, report, rows


def cluster_stats(dhsctl, node):
    r = subprocess.run([dhsctl, "--run-dir", node.run_dir, "--json", "status"], capture_output=True, text=True,
                       timeout=30)
    try:
        return json.loads(r.stdout).get("cluster") or {}
    except json.JSONDecodeError:
        return {}


def pool_clean(failures, tag, dhsctl, node):
    """After every request ended: the host pool holds only cached shared pages (none leaked, none pinned, nothing
    shared or being written), and allocated + reusable = the pool."""
    def check():
        r = subprocess.run([dhsctl, "--run-dir", node.run_dir, "--json", "status"], capture_output=True, text=True,
                           timeout=30)
        try:
            st = json.loads(r.stdout)
        except json.JSONDecodeError:
            return f"dhsctl status: {r.stdout[-300:]} {r.stderr[-300:]}"
        h, p = st.get("host") or {}, st.get("prefix") or {}
        if st.get("requests") != 0 or h.get("allocated") != p.get("cached_pages") or h.get("pinned") != 0 or \
                p.get("shared_pages") != 0 or p.get("writing_pages") != 0 or \
                h.get("allocated", 0) + h.get("reusable", 0) + h.get("freed_pinned", 0) != h.get("pages"):
            return f"requests {st.get('requests')}, host {h}, prefix pages shared {p.get('shared_pages')} cached " \
                   f"{p.get('cached_pages')} writing {p.get('writing_pages')}"
        return None
    why = None
    if not wait_until(lambda: check() is None, 10):
        why = check()
    if why:
        failures.append(f"{tag}: host pool not clean: {why}")


def misses(c, *reasons):
    return sum((c.get("misses") or {}).get(r, 0) for r in reasons)


def same_outputs(failures, tag, rows, ref):
    if len(rows) != N:
        failures.append(f"{tag}: {len(rows)} output rows, want {N}")
        return
    for i, r in rows.items():
        a = ref.get(i)
        if a is None or not r.get("served") or r["tokens"] != a["tokens"] or \
                r["logits_digests"] != a["logits_digests"] or not r["tokens"]:
            failures.append(f"{tag}: request {i} differs from the reference")
            return


def main():
    node_exe, replay_exe, dhsctl = sys.argv[1], sys.argv[2], sys.argv[3]
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        print("SKIP: redis-server / redis-cli not installed")
        return 77
    failures, nodes, servers = [], [], []
    with tempfile.TemporaryDirectory(prefix="dhs-cluster-tier-") as tmp:
        port = free_port()
        redis = Redis(tmp, port)
        redis.start()
        conv = conversation_trace(tmp)
        slice_ = ["--trace", conv, "--requests", str(N), "--length-scale", "0.03", "--preset", "glm5-like"]
        try:
            # The reference: a resident node dhs-replay starts itself (no cluster tier).
            rc, _, resident = replay(replay_exe, tmp, "resident", slice_ + ["--mode", "resident",
                                                                          "--run-dir", os.path.join(tmp, "ref")])
            if rc != 0:
                failures.append(f"resident reference: rc {rc}")

            def serve(tag, node, extra=()):
                rc, report, rows = replay(replay_exe, tmp, tag, slice_ + ["--connect",
                                                                          f"ipc://{node.run_dir}/worker-0.sock",
                                                                          *extra])
                if rc != 0 or report.get("requests_served") != N or report.get("requests_failed") != 0:
                    failures.append(f"{tag}: rc {rc}, served {report.get('requests_served')}, failed "
                                    f"{report.get('requests_failed')}")
                same_outputs(failures, tag, rows, resident)
                pool_clean(failures, tag, dhsctl, node)
                return report, rows

            # 1. node A publishes.
            a = Node(node_exe, tmp, "a", port)
            nodes.append(a)
            serve("a", a)
            wait_until(lambda: cluster_stats(dhsctl, a).get("queue_depth", 1) == 0, 10)
            ca = cluster_stats(dhsctl, a)
            print("node A cluster:", json.dumps(ca), flush=True)
            keys = [k for k in redis.cli("KEYS", "dhs1:*").split() if k]
            if ca.get("health") != "up" or ca.get("published", 0) <= 0 or sum((ca.get("shed") or {}).values()):
                failures.append(f"A: published {ca.get('published')}, health {ca.get('health')}, shed {ca.get('shed')}")
            if ca.get("reachable") != "yes":
                failures.append(f"A: reachable {ca.get('reachable')!r}, want 'yes' (the store answered)")
            if len(keys) != ca.get("published"):
                failures.append(f"A: {len(keys)} keys in the store, {ca.get('published')} published")

            # 2. node B imports.
            b = Node(node_exe, tmp, "b", port)
            nodes.append(b)
            serve("b", b)
            cb = cluster_stats(dhsctl, b)
            print("node B cluster:", json.dumps(cb), flush=True)
            if cb.get("hits", 0) <= 0 or cb.get("imported", 0) <= 0 or cb.get("hit_bytes", 0) <= 0:
                failures.append(f"B: nothing imported from the cluster tier: {cb}")
            # (timeouts are possible on a loaded machine: counted misses, the pages computed; not a failure)
            if misses(cb, "bad_value", "unavailable", "store_error", "no_room", "no_geometry"):
                failures.append(f"B: unexpected misses {cb.get('misses')}")
            # Per request: memd's timeline notes the pages its admission imported from the cluster tier.
            per_request = 0
            for cid in range(0, N + 2):
                r = subprocess.run([dhsctl, "--run-dir", b.run_dir, "--json", "request", "--client", str(cid)],
                                   capture_output=True, text=True, timeout=30)
                try:
                    doc = json.loads(r.stdout)
                except json.JSONDecodeError:
                    continue
                for t in doc.get("timelines", []):
                    for e in t.get("events", []):
                        if e.get("event") == "admitted" and "imported from the cluster tier" in e.get("detail", ""):
                            per_request += e.get("pages", 0)
            if per_request != cb.get("imported"):
                failures.append(f"B: the requests' timelines name {per_request} pages from the cluster tier, memd "
                                f"counted {cb.get('imported')}")
            print(f"FIGURE two nodes: A published {ca.get('published')} pages ({ca.get('published_bytes')} bytes); "
                  f"B looked up {cb.get('lookups')}, hit {cb.get('hits')} ({cb.get('hit_bytes')} bytes), imported "
                  f"{cb.get('imported')}", flush=True)
            for n in (a, b):
                nodes.remove(n)
                if n.stop() != 0:
                    failures.append(f"{n.run_dir}: dhs-node did not exit 0 at SIGTERM: {read(n.out)[-1500:]}")

            # 3. every value corrupted in the store: a payload byte flipped (the value's last byte).
            corrupted = 0
            for k in keys:
                v = redis.cli("GET", k, raw=True)
                if v.endswith(b"\n"):
                    v = v[:-1]
                if len(v) < 100:
                    continue
                v = v[:-1] + bytes([v[-1] ^ 0xFF])
                subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port), "-x", "SET", k], input=v,
                               capture_output=True, timeout=10)
                corrupted += 1
            c = Node(node_exe, tmp, "c", port)
            nodes.append(c)
            serve("c", c)
            cc = cluster_stats(dhsctl, c)
            print("node C cluster:", json.dumps(cc), flush=True)
            # No corrupted value is imported: no prefix page at all. Session pages C published itself during the pass
            # (a first turn's history, over the corrupted value under the same key) are found by its follow-up turns
            # (issue 26, sessions): those are the only imports.
            if corrupted == 0 or cc.get("imported", 0) != cc.get("session_imported", 0) or \
                    cc.get("session_imported", 0) > cc.get("published", 0) or misses(cc, "bad_value") <= 0 or \
                    (cc.get("bad_values") or {}).get("checksum_mismatch", 0) <= 0:
                failures.append(f"C: {corrupted} values corrupted, but {cc}")
            nodes.remove(c)
            if c.stop() != 0:
                failures.append(f"C: dhs-node did not exit 0 at SIGTERM: {read(c.out)[-1500:]}")

            # 4. redis killed: misses, exact; restarted empty: published again, nothing old found.
            redis.cli("FLUSHALL")
            d = Node(node_exe, tmp, "d", port)
            nodes.append(d)
            redis.kill()
            # Idle (nothing served yet), memd's sender PINGs the store every second: reachable turns "no" by itself.
            if not wait_until(lambda: cluster_stats(dhsctl, d).get("reachable") == "no", 6):
                failures.append(f"D: an idle memd still says reachable {cluster_stats(dhsctl, d).get('reachable')!r} "
                                "after the store was killed")
            serve("d-killed", d)
            cd = cluster_stats(dhsctl, d)
            print("node D cluster (store killed):", json.dumps(cd), flush=True)
            if cd.get("imported", 0) != 0 or misses(cd, "unavailable", "store_down", "timeout") <= 0:
                failures.append(f"D (store killed): {cd}")
            if cd.get("reachable") != "no":  # its latest contact (a lookup or a batch) got no answer
                failures.append(f"D (store killed): reachable {cd.get('reachable')!r}, want 'no'")
            redis.start()
            # The publisher finds the store again (a probe), and the node serves on, exact.
            if not wait_until(lambda: cluster_stats(dhsctl, d).get("reachable") == "yes", 6):
                failures.append(f"D: the store restarted, but reachable stays {cluster_stats(dhsctl, d).get('reachable')!r}")
            if not wait_until(lambda: cluster_stats(dhsctl, d).get("health") == "up", 15):
                failures.append(f"D: the store restarted, but the tier stays {cluster_stats(dhsctl, d).get('health')}")
            serve("d-restarted", d)
            nodes.remove(d)
            if d.stop() != 0:
                failures.append(f"D: dhs-node did not exit 0 at SIGTERM: {read(d.out)[-1500:]}")

            # 5. redis SIGSTOPped: every request finishes exact, misses counted.
            e = Node(node_exe, tmp, "e", port)
            nodes.append(e)
            os.kill(redis.proc.pid, signal.SIGSTOP)
            try:
                serve("e-stopped", e)
                ce = cluster_stats(dhsctl, e)
                print("node E cluster (store stopped):", json.dumps(ce), flush=True)
                if ce.get("imported", 0) != 0 or misses(ce, "timeout", "store_down") <= 0:
                    failures.append(f"E (store stopped): {ce}")
            finally:
                os.kill(redis.proc.pid, signal.SIGCONT)
            nodes.remove(e)
            if e.stop() != 0:
                failures.append(f"E: dhs-node did not exit 0 at SIGTERM: {read(e.out)[-1500:]}")

            # 7. two nodes publishing the same pages at once (on an emptied store), then a node of another geometry
            # (p = 8: another key space, nothing found, exact) and one of the same geometry (imports, exact).
            redis.cli("FLUSHALL")
            p_node, q_node = Node(node_exe, tmp, "p", port), Node(node_exe, tmp, "q", port)
            nodes.extend([p_node, q_node])
            results = {}
            threads = [threading.Thread(target=lambda n=n, t=t: results.__setitem__(t, serve(t, n)))
                       for n, t in ((p_node, "p"), (q_node, "q"))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wait_until(lambda: all(cluster_stats(dhsctl, n).get("queue_depth", 1) == 0 for n in (p_node, q_node)), 10)
            cp, cq = cluster_stats(dhsctl, p_node), cluster_stats(dhsctl, q_node)
            # Prefix pages only (the finished turns' session pages are looked up too, counted apart: session_imported).
            keys = [k for k in redis.cli("KEYS", "dhs1:*:p:*").split() if k]
            print(f"FIGURE two nodes at once: P published {cp.get('published')}, Q {cq.get('published')}, imported "
                  f"{cp.get('imported')} / {cq.get('imported')}; {len(keys)} keys in the store", flush=True)
            if cp.get("published", 0) + cq.get("published", 0) < len(keys) or not keys:
                failures.append(f"P, Q: published {cp.get('published')} + {cq.get('published')}, {len(keys)} keys")
            r_node = Node(node_exe, tmp, "r", port, page_rows=8)
            nodes.append(r_node)
            serve("r", r_node)
            cr = cluster_stats(dhsctl, r_node)
            print("node R cluster (p = 8):", json.dumps(cr), flush=True)
            # Nothing of the other geometry is found: every lookup is absent but the session pages R published itself
            # during the pass (its first turns' history, found by its follow-ups).
            if cr.get("imported", 0) != cr.get("session_imported", 0) or cr.get("lookups", 0) <= 0 or \
                    cr.get("hits", 0) != cr.get("session_hits", 0) or \
                    misses(cr, "absent") != cr.get("lookups", 0) - cr.get("hits", 0):
                failures.append(f"R (another geometry): {cr}")
            # Same geometry, another model (other weights: seed 2): its Hello's model fingerprint is another key
            # space, so nothing P and Q published is imported (without it, every page would be: wrong rows).
            m_node = Node(node_exe, tmp, "m", port, seed=2)
            nodes.append(m_node)
            rc, report, _ = replay(replay_exe, tmp, "m", slice_ + ["--connect", f"ipc://{m_node.run_dir}/worker-0.sock"])
            if rc != 0 or report.get("requests_served") != N or report.get("requests_failed") != 0:
                failures.append(f"m: rc {rc}, served {report.get('requests_served')}")
            pool_clean(failures, "m", dhsctl, m_node)
            cm = cluster_stats(dhsctl, m_node)
            print("node M cluster (another model):", json.dumps(cm), flush=True)
            # (but the session pages M published itself during the pass, found by its follow-ups: as R above)
            if cm.get("imported", 0) != cm.get("session_imported", 0) or cm.get("lookups", 0) <= 0 or \
                    cm.get("hits", 0) != cm.get("session_hits", 0) or \
                    misses(cm, "absent") != cm.get("lookups", 0) - cm.get("hits", 0):
                failures.append(f"M (another model): {cm}")
            s_node = Node(node_exe, tmp, "s", port)
            nodes.append(s_node)
            serve("s", s_node)
            cs = cluster_stats(dhsctl, s_node)
            # Every page P and Q published is found (a loaded machine may time a lookup out: counted, not a failure).
            # (Prefix pages: the session pages P and Q published are imported too, counted apart.)
            prefix_imported = cs.get("imported", 0) - cs.get("session_imported", 0)
            if prefix_imported <= 0 or prefix_imported > len(keys) or \
                    prefix_imported + misses(cs, "timeout", "store_down") < len(keys):
                failures.append(f"S: imported {cs.get('imported')} of the {len(keys)} pages P and Q stored: {cs}")
            print(f"FIGURE after two publishers: S imported {cs.get('imported')} of {cs.get('lookups')} looked up",
                  flush=True)
            for n in (p_node, q_node, r_node, m_node, s_node):
                nodes.remove(n)
                if n.stop() != 0:
                    failures.append(f"{n.run_dir}: dhs-node did not exit 0 at SIGTERM: {read(n.out)[-1500:]}")

            # 6. a 3-master Redis Cluster (a replica each): node F publishes through the slot routing, a master is
            # SIGKILLed (its replica takes over), node G imports what is left, exact.
            cluster = start_cluster(tmp)
            servers.extend(cluster)
            seeds = ",".join(f"127.0.0.1:{r.port}" for r in cluster[:3])
            f_node = Node(node_exe, tmp, "f", 0, store=seeds)
            nodes.append(f_node)
            serve("f", f_node)
            wait_until(lambda: cluster_stats(dhsctl, f_node).get("queue_depth", 1) == 0, 10)
            cf = cluster_stats(dhsctl, f_node)
            per_master = [int(r.cli("DBSIZE").strip() or 0) for r in cluster[:3]]
            print("node F cluster:", json.dumps(cf), "keys per master", per_master, flush=True)
            if cf.get("published", 0) <= 0 or sum(per_master) != cf.get("published") or min(per_master) == 0:
                failures.append(f"F: published {cf.get('published')}, keys per master {per_master}")
            time.sleep(1)  # the replicas catch up (asynchronous replication)
            victim = cluster[0]
            victim_id = victim.cli("CLUSTER", "MYID").strip()
            victim.kill()

            def failed_over():  # the others saw it fail, and a replica took its slots (cluster_state ok again)
                seen = [l for l in cluster[1].cli("CLUSTER", "NODES").splitlines() if l.startswith(victim_id)]
                return seen and "fail" in seen[0].split()[2] and "fail?" not in seen[0].split()[2] and \
                    all("cluster_state:ok" in r.cli("CLUSTER", "INFO") for r in cluster[1:])
            if not wait_until(failed_over, 30):
                failures.append("the cluster did not fail over from a master's death within 30 s")
            g_node = Node(node_exe, tmp, "g", 0, store=seeds)  # the dead master is the first seed
            nodes.append(g_node)
            serve("g", g_node)
            cg = cluster_stats(dhsctl, g_node)
            print("node G cluster (a master killed):", json.dumps(cg), flush=True)
            if cg.get("imported", 0) <= 0 or misses(cg, "bad_value", "store_error"):
                failures.append(f"G: {cg}")
            print(f"FIGURE 3-master cluster, a master killed: F published {cf.get('published')} pages (keys per "
                  f"master {per_master}); G imported {cg.get('imported')} of {cg.get('lookups')} looked up, misses "
                  f"{ {k: v for k, v in (cg.get('misses') or {}).items() if v} }", flush=True)
            for n in (f_node, g_node):
                nodes.remove(n)
                if n.stop() != 0:
                    failures.append(f"{n.run_dir}: dhs-node did not exit 0 at SIGTERM: {read(n.out)[-1500:]}")
        finally:
            for n in nodes:
                n.stop()
            redis.kill()
            for r in servers:
                r.kill()
        if failures:
            for n in "abcdefgpqrs":
                log = read(os.path.join(tmp, n, "memd.log"))
                if log:
                    print(f"---- {n}/memd.log ----\n" + log[-2500:])
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
