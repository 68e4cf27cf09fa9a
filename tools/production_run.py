#!/usr/bin/env python3
"""tools/production_run.py: a node at production-like sizes under dhs-node, on this machine (issue 22; a long run, not
in CI; README "Long runs").

What it does, in order, with every process in a private temporary directory (removed at the end unless --keep):
1. Weights of the seed's shapes: `dhs-gen-weights --preset glm5-like` with its top-k set to --top-k (2048, brief §8:
   glm5-like k = 2048) in the file's config; the node's workers get hot rows B = --hot-rows (4096) and a tail of
   --tail-rows (64) rows per slot and source.
2. The reference: a node under dhs-node in resident mode (everything on the "GPU"), the long-context slice replayed
   with `dhs-replay --connect ... --outputs ref.jsonl` (no faults).
3. The run under test: a node under dhs-node in adaptive (--mode) mode with a multi-GB KV budget (--budget, 6e9 bytes), the
   same slice with `--reattach-timeout-ms`, while this script SIGKILLs the worker (--worker-kills times) and memd
   (--memd-kills times) at spaced moments. Before each kill it records the confirmed host copies of every request
   memd holds (`dhsctl --json request ID`: host_copies) and digests those host pages in the mapped pool; after the
   kill (worker: once memd shows the GPU fenced; memd: once the new memd answers) every recorded page of a request
   memd still holds must be there with the same bytes; the others are host rows lost.
4. Prints: start-up (dhs-node start to "node ready", the worker's "prepared in N ms"), requests served, exact (every
   request's tokens and logits digests equal to the resident reference), kills survived, time to recover per kill
   (worker: SIGKILL to "node ready again"; memd: SIGKILL to the new memd listing the GPU up), host rows lost (pages
   checked), the worker's resident memory.

Usage: tools/production_run.py [--build DIR] [--budget BYTES] [--hot-rows B] [--top-k K] [--tail-rows T]
         [--requests N] [--length-scale X] [--concurrency C] [--slots N] [--worker-kills N] [--memd-kills N]
         [--kill-every-s S] [--prefill-chunk N] [--keep]
Exit status: 0 every request served, exact, every kill survived and no host row lost; 1 otherwise.
"""
import argparse
import hashlib
import json
import mmap
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dhs_vocabulary import MODEL_PRESETS, WORKER_MODES  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"production_run: {msg}", flush=True)


def wait_until(pred, timeout_s, what, step=0.05):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


def seed_weights(build, preset, seed, top_k, out):
    """dhs-gen-weights' file with the config's top_k replaced (safetensors: u64 header length, JSON header whose
    __metadata__.config is the model config as a JSON string, then the tensors at offsets relative to the header's
    end, so a longer header moves nothing)."""
    base = out + ".base"
    subprocess.run([os.path.join(build, "tools/gen_weights/dhs-gen-weights"), "--preset", preset, "--seed", str(seed),
                    "--out", base], check=True, stdout=subprocess.DEVNULL)
    with open(base, "rb") as f:
        data = f.read()
    n = struct.unpack_from("<Q", data, 0)[0]
    header = json.loads(data[8:8 + n])
    config = json.loads(header["__metadata__"]["config"])
    config["top_k"] = top_k
    header["__metadata__"]["config"] = json.dumps(config)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data[8 + n:])
    os.remove(base)
    return config


def host_page_bytes(build, preset, page_rows, tmp):
    """The memd page size of `preset` at `page_rows`, from `dhs-node --check` (it derives it as the workers do)."""
    path = os.path.join(tmp, "check.toml")
    with open(path, "w") as f:
        f.write(f'[node]\nrun_dir = "{tmp}/check"\n[memd]\nhost_pool_bytes = "1GiB"\n'
                f'[[worker]]\ngpu = 0\npreset = "{preset}"\npage_rows = {page_rows}\nhbm_budget_bytes = "1GiB"\n')
    out = subprocess.run([os.path.join(build, "tools/node/dhs-node"), "--config", path, "--check"], check=True,
                         capture_output=True, text=True).stdout
    return int(re.search(r"--page-bytes (\d+)", out).group(1))


def trace_contexts(trace, requests, scale):
    with open(trace) as f:
        rows = [json.loads(line) for line, _ in zip(f, range(requests))]
    r = lambda x: max(1, int(x * scale + 0.5))
    return [r(row["input_length"]) + r(row["output_length"]) for row in rows]


class Node:
    """A node under dhs-node: its configuration, process, log and children."""

    def __init__(self, a, tmp, name, mode, weights, page_bytes, host_pool_bytes, max_context):
        self.run_dir = os.path.join(tmp, name)
        self.log_path = os.path.join(tmp, name + ".node.log")
        self.build = a.build
        conf = os.path.join(tmp, name + ".toml")
        prefill = f"prefill_chunk = {a.prefill_chunk}\n" if a.prefill_chunk else ""
        with open(conf, "w") as f:
            f.write(f"""[node]
run_dir = "{self.run_dir}"

[memd]
host_pool_bytes = {host_pool_bytes}
page_bytes = {page_bytes}
log_level = "info"

[[worker]]
gpu = 0
mode = "{mode}"
device = "cpu"
weights = "{weights}"
hbm_budget_bytes = {a.budget}
hot_rows = {a.hot_rows}
tail_rows = {a.tail_rows}
page_rows = {a.page_rows}
slots = {a.slots}
max_context = {max_context}
{prefill}log_level = "info"

[supervise]
backoff_initial_ms = 100
backoff_max_ms = 2000
max_restarts = 100
start_timeout_ms = 600000
""")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([os.path.join(a.build, "tools/node/dhs-node"), "--config", conf],
                                     stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)

    def text(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def ready_count(self):
        return len(re.findall(r"dhs-node: node ready", self.text()))

    def wait_ready(self, count, timeout_s):
        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"dhs-node exited {self.proc.returncode}:\n{self.text()[-3000:]}")
            return self.ready_count() >= count
        wait_until(ready, timeout_s, f"'node ready' #{count} in {self.log_path}")

    def child(self, exe):
        """The pid of dhs-node's child running `exe` (memd or workerd), or None."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                if ppid == self.proc.pid and os.path.basename(os.readlink(f"/proc/{pid}/exe")) == exe:
                    return int(pid)
            except (OSError, ValueError):
                continue
        return None

    def dhsctl(self, *args):
        r = subprocess.run([os.path.join(self.build, "tools/dhsctl/dhsctl"), "--run-dir", self.run_dir, "--json",
                            "--timeout-ms", "2000", *args], capture_output=True, text=True)
        if r.returncode != 0:
            return None
        try:
            return json.loads(r.stdout)
        except ValueError:
            return None

    def gpu0_up(self):
        gpus = self.dhsctl("gpus")
        return bool(gpus) and any(g.get("gpu") == 0 and g.get("up") for g in gpus)

    def gpu0_fenced(self):
        gpus = self.dhsctl("gpus")
        return bool(gpus) and any(g.get("gpu") == 0 and not g.get("up", True) for g in gpus)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class HostLedger:
    """The confirmed host copies of the requests memd holds, digested in the mapped pool, checked after a fault."""

    def __init__(self, node):
        self.node = node
        self.recorded = {}  # request -> {history page: digest}
        self.checked = self.lost = 0

    def _pool(self):
        pid = self.node.child("memd")
        if pid is None:
            return None
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                path = line.split()[-1]
                if path.startswith("/dev/shm/dhs-pool-"):
                    return path
        return None

    def _copies(self, states):
        """request -> {history page: host page} of the requests memd lists in one of `states`."""
        listed = self.node.dhsctl("requests") or []
        out = {}
        for r in listed:
            if r.get("state") not in states:
                continue
            view = self.node.dhsctl("request", str(r["request"]))
            if view and "host_copies" in view:
                out[r["request"]] = {page: host for page, host in view["host_copies"]}
        return out

    def _digests(self, copies):
        path = self._pool()
        if path is None:
            return {}
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            page_bytes, _, _, pages_offset = struct.unpack_from("<QQQQ", m, 16)
            out = {}
            for req, pages in copies.items():
                out[req] = {p: hashlib.blake2b(m[pages_offset + h * page_bytes:pages_offset + (h + 1) * page_bytes],
                                               digest_size=16).digest() for p, h in pages.items()}
            m.close()
        return out

    def record(self):
        self.recorded = self._digests(self._copies({"admitted", "interrupted", "queued"}))

    def check(self, states):
        """Every recorded page of a request memd still lists in `states` must be held with the same bytes."""
        now = self._digests(self._copies(states))
        lost = 0
        for req, pages in now.items():
            for page, digest in self.recorded.get(req, {}).items():
                self.checked += 1
                if pages.get(page) != digest:
                    lost += 1
        self.lost += lost
        return lost


def compare(run_path, ref_path):
    if not os.path.exists(run_path):
        return False, "the run wrote no outputs (it failed)"
    load = lambda p: {r["trace_index"]: r for r in map(json.loads, open(p))}
    run, ref = load(run_path), load(ref_path)
    for i, want in sorted(ref.items()):
        got = run.get(i)
        if got is None or not got["served"] or not want["served"]:
            return False, f"request {i} not served in both runs"
        if got["tokens"] != want["tokens"]:
            return False, f"request {i}: tokens differ"
        if len(got["logits_digests"]) != len(got["tokens"]) or got["logits_digests"] != want["logits_digests"]:
            return False, f"request {i}: logits digests differ or are missing"
    return True, ""


def replay(a, node, outputs, json_out, log_path, reattach):
    cmd = [os.path.join(a.build, "tools/replay/dhs-replay"), "--connect", f"ipc://{node.run_dir}/worker-0.sock",
           "--requests", str(a.requests), "--length-scale", str(a.length_scale), "--concurrency", str(a.concurrency),
           "--outputs", outputs, "--json", json_out, "--idle-timeout-ms", str(a.idle_timeout_s * 1000)]
    if reattach:
        cmd += ["--reattach-timeout-ms", "600000"]
    return subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT)


def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--budget", type=int, default=6_000_000_000, help="KV budget of the worker, bytes")
    p.add_argument("--hot-rows", type=int, default=4096, help="B (the seed: 4096)")
    p.add_argument("--top-k", type=int, default=2048, help="k (the seed: 2048)")
    p.add_argument("--tail-rows", type=int, default=64, help="tail rows per slot and source (the seed: 64)")
    p.add_argument("--page-rows", type=int, default=64)
    p.add_argument("--preset", default="glm5-like", choices=MODEL_PRESETS)
    p.add_argument("--mode", default="adaptive", choices=[m for m in WORKER_MODES if m != "resident"],
                   help="the run under test (hisparse backs every page up: the most host pages to check)")
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--length-scale", type=float, default=0.5, help="of the bundled Mooncake slice")
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--worker-kills", type=int, default=2)
    p.add_argument("--memd-kills", type=int, default=1)
    p.add_argument("--kill-every-s", type=float, default=20, help="seconds between kills (the first after the first)")
    p.add_argument("--prefill-chunk", type=int, default=0, help="workerd --prefill-chunk (0 = its default)")
    p.add_argument("--idle-timeout-s", type=int, default=1800,
                   help="dhs-replay --idle-timeout-ms / 1000: a prefill at k = 2048 on the CPU backend sends no event "
                        "for minutes")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    return a


def run_reference(a, tmp, nodes, weights, page_bytes, host_pool, max_context):
    """2. The resident reference run: ref.jsonl holds its outputs."""
    ref_args = argparse.Namespace(**vars(a))
    ref = Node(ref_args, tmp, "ref", "resident", weights, page_bytes, host_pool, max_context)
    nodes.append(ref)
    ref.wait_ready(1, 600)
    t0 = time.monotonic()
    r = replay(a, ref, os.path.join(tmp, "ref.jsonl"), os.path.join(tmp, "ref.json"), os.path.join(tmp, "ref.out"),
               False)
    if r.wait() != 0:
        raise RuntimeError("the resident reference run failed:\n" + open(os.path.join(tmp, "ref.out")).read()[-3000:])
    log(f"resident reference: {a.requests} requests in {time.monotonic() - t0:.0f} s")
    ref.stop()


def kill_order(a):
    """The kills of the run, worker kills spread between the memd kills."""
    kills = ["worker"] * a.worker_kills + ["memd"] * a.memd_kills
    return [kills[i] for i in sorted(range(len(kills)), key=lambda i: (i % max(1, a.worker_kills), i))]


def kill_and_recover(node, ledger, what):
    """SIGKILL of the worker or memd of `node`; waits for its recovery and checks the host ledger (its lost
    pages are summed in ledger.lost). Returns the seconds to recover."""
    wait_until(lambda: node.child("workerd") and node.child("memd"), 600, "both children of dhs-node")
    ledger.record()
    pid = node.child("memd" if what == "memd" else "workerd")
    readies = node.ready_count()
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    if what == "worker":
        wait_until(node.gpu0_fenced, 60, "memd to fence GPU 0")
        lost = ledger.check({"interrupted"})
        node.wait_ready(readies + 1, 600)
    else:
        wait_until(lambda: node.child("memd") not in (None, pid) and node.gpu0_up(), 600, "a new memd with GPU 0 up")
        lost = ledger.check({"admitted", "interrupted", "queued"})
    took = time.monotonic() - killed
    log(f"SIGKILL {what} (pid {pid}): recovered in {took:.2f} s; host pages lost {lost}")
    return took


def run_with_kills(a, node, run):
    """3. The kills while the replay runs. Returns (recoveries, survived, ledger, worker RSS max in bytes)."""
    ledger = HostLedger(node)
    recoveries, survived, rss_max = [], {"worker": 0, "memd": 0}, 0
    for what in kill_order(a):
        deadline = time.monotonic() + a.kill_every_s
        while time.monotonic() < deadline and run.poll() is None:
            rss_max = max(rss_max, rss(node.child("workerd") or 0))
            time.sleep(0.5)
        if run.poll() is not None:
            log(f"the replay ended before the {what} kill")
            break
        recoveries.append((what, kill_and_recover(node, ledger, what)))
        survived[what] += 1
    while run.poll() is None:
        rss_max = max(rss_max, rss(node.child("workerd") or 0))
        time.sleep(0.5)
    return recoveries, survived, ledger, rss_max


def print_table(a, f):
    """The figures of the run as a Markdown table; `f` holds them (see run_under_test)."""
    contexts = f["contexts"]
    print()
    print("| figure | value |")
    print("|---|---|")
    print(f"| shapes | {a.mode}, {a.preset} weights with k = {a.top_k}, B = {a.hot_rows}, tail {a.tail_rows}, "
          f"p = {a.page_rows}, N = {a.slots}, budget {a.budget} B, host pool {f['host_pool']} B |")
    print(f"| slice | {a.requests} Mooncake requests x{a.length_scale}: contexts {min(contexts)}..{max(contexts)} "
          f"tokens, concurrency {a.concurrency} |")
    print(f"| start-up | node ready {f['ready_s']:.1f} s after dhs-node started; worker prepared in "
          f"{f['prepared']} ms after HelloReply |")
    print(f"| requests served | {f['served']}/{a.requests} in {f['elapsed']:.0f} s "
          f"({f['output_tokens']} output tokens) |")
    print(f"| exact (tokens and logits digests vs resident) | {'yes' if f['exact'] else 'no: ' + f['why']} |")
    print(f"| kills survived | worker {f['survived']['worker']}/{a.worker_kills}, memd {f['survived']['memd']}/"
          f"{a.memd_kills}; dhs-node {'still up' if f['still_up'] else 'exited'} |")
    print("| time to recover | " + ", ".join(f"{w} {t:.2f} s" for w, t in f["recoveries"]) + " |")
    print(f"| host rows lost | {f['lost'] * a.page_rows} ({f['lost']} of {f['checked']} recorded host pages "
          f"checked) |")
    print(f"| worker resident memory, max | {f['rss_max'] >> 20} MiB (budget {a.budget >> 20} MiB) |")


def run_under_test(a, tmp, nodes, weights, page_bytes, host_pool, max_context, contexts):
    """3. The run under test with its kills, compared with the reference. Returns True when it passed."""
    node = Node(a, tmp, "run", a.mode, weights, page_bytes, host_pool, max_context)
    nodes.append(node)
    node.wait_ready(1, 600)
    ready_s = time.monotonic() - node.started
    worker_log = os.path.join(node.run_dir, "worker-0.log")
    prepared = re.findall(r"prepared in (\d+) ms", open(worker_log, errors="replace").read())
    prepared = prepared[0] if prepared else "?"
    log(f"node ready {ready_s:.1f} s after dhs-node started (worker prepared in {prepared} "
        f"ms after memd's HelloReply); worker resident memory {rss(node.child('workerd')) >> 20} MiB")
    t0 = time.monotonic()
    run = replay(a, node, os.path.join(tmp, "run.jsonl"), os.path.join(tmp, "run.json"),
                 os.path.join(tmp, "run.out"), True)
    recoveries, survived, ledger, rss_max = run_with_kills(a, node, run)
    elapsed = time.monotonic() - t0
    report = json.load(open(os.path.join(tmp, "run.json"))) if os.path.exists(os.path.join(tmp, "run.json")) else {}
    exact, why = compare(os.path.join(tmp, "run.jsonl"), os.path.join(tmp, "ref.jsonl"))
    f = dict(contexts=contexts, host_pool=host_pool, ready_s=ready_s, prepared=prepared,
             served=report.get("requests_served", 0), elapsed=elapsed, output_tokens=report.get("output_tokens", 0),
             exact=exact, why=why, survived=survived, still_up=node.proc.poll() is None, recoveries=recoveries,
             lost=ledger.lost, checked=ledger.checked, rss_max=rss_max)
    print_table(a, f)
    return (f["served"] == a.requests and exact and ledger.lost == 0 and f["still_up"] and
            survived["worker"] == a.worker_kills and survived["memd"] == a.memd_kills)


def main():
    a = parse_args()
    tmp = tempfile.mkdtemp(prefix="dhs-prod-", dir="/tmp")
    log(f"directory {tmp}")
    trace = os.path.join(ROOT, "tools/replay/data/mooncake_conversation_head200.jsonl")
    contexts = trace_contexts(trace, a.requests, a.length_scale)
    weights = os.path.join(tmp, "seed.safetensors")
    config = seed_weights(a.build, a.preset, 1, a.top_k, weights)
    page_bytes = host_page_bytes(a.build, a.preset, a.page_rows, tmp)
    pages = sum(-(-c // a.page_rows) + 2 for c in contexts)  # every context page of every request, at once
    host_pool = max(pages * page_bytes * 2, 256 << 20)
    max_context = max(contexts) + 64
    log(f"shapes: {a.preset} (top_k {config['top_k']}), B = {a.hot_rows}, tail {a.tail_rows}, p = {a.page_rows}, "
        f"budget {a.budget} bytes, host pool {host_pool} bytes ({page_bytes}-byte pages); {a.requests} requests, "
        f"contexts {min(contexts)}..{max(contexts)} tokens (sum {sum(contexts)})")
    ok = True
    nodes = []
    try:
        run_reference(a, tmp, nodes, weights, page_bytes, host_pool, max_context)
        ok = run_under_test(a, tmp, nodes, weights, page_bytes, host_pool, max_context, contexts)
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as e:
        log(f"FAILED: {e}")
        ok = False
        a.keep = True
    finally:
        for n in nodes:
            n.stop()
        if a.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
