#!/usr/bin/env python3
"""fuzz/seeds.py: writes the hand-made seeds of fuzz/corpus/ (message sequences in each target's record format, small
safetensors files, trace lines). The tiny model seeds come from fuzz/make_seeds.cc. Run from the repository root."""
import json
import os
import struct

def put(target, name, data):
    os.makedirs(f"fuzz/corpus/{target}", exist_ok=True)
    with open(f"fuzz/corpus/{target}/seed-{name}", "wb") as f:
        f.write(bytes(data))

# ---- memd (fuzz/memd_fuzz.cc): config byte, then records [peer][kind][fields] ----
HELLO = [0, 0, 0, 16, 16, 1, 2]           # worker/0: gpu 0, M 16, p 16, page bytes = memd's, 2 slots
HELLO1 = [1, 0, 1, 8, 16, 1, 1]            # worker/1: gpu 1, M 8
def admit(req, gpu=0, required=2, rows=64, complete=3, peer=0):
    return [peer, 1, req, gpu, required, rows, complete, 1, 1]
def complete(req, peer=0):
    return [peer, 6, req, 0]
put("memd", "hello-admit-complete", [0] + HELLO + admit(1) + complete(1))
put("memd", "reclaim-flow", [0] + HELLO + admit(1, required=4, complete=8, rows=160) + admit(2, required=10) +
    [0, 2, 1, 1, 0, 0, 1, 0] +          # BackupComplete order 1, every page, ok
    [0, 4, 1, 1, 0, 0] +                # ReadersDone order 1
    [0, 3, 1, 0, 2, 0, 1, 1, 0, 0, 0, 1, 1] +  # HostCopyWritten request 1, history pages 0 1
    [0, 5, 2, 0, 1, 0, 0, 1] +          # ReadyPublish order 2, every page, ok
    complete(2) + complete(1))
put("memd", "two-gpus-introspect", [0x15] + HELLO + HELLO1 + admit(1) + admit(2, gpu=1, peer=1) + admit(3, gpu=1) +
    [2, 7, 0, 0, 0, 0] + [2, 7, 3, 1, 0, 1] + [2, 7, 4, 0, 1, 0] + [0, 8] + [0] * 9 + [0, 9] + [0] * 8 +
    complete(2, peer=1) + complete(1))
put("memd", "bad-messages", [0] + HELLO + [0, 210, 1, 0, 2, 64, 3, 1, 1, 1, 5, 0, 7, 0] + [0, 250, 4, 0, 1, 2, 3, 4] +
    [0, 10, 1, 3, 5] + [0, 2, 0, 1, 0, 0, 1, 0] + complete(9))

# ---- worker (fuzz/worker_fuzz.cc): mode byte, then records [kind][fields] ----
def submit(req, n=20, max_new=4):
    return [0, req, n] + [(7 * i + req) % 256 for i in range(n)] + [1, max_new - 1, 1, 1]
GRANT_FIRST = [40, 0, 1, 0, 0]     # grant admits[0]: slot 0, nothing kept
ITER4 = [170, 3]
put("worker", "adaptive-serve", [2] + submit(1) + GRANT_FIRST + ITER4 * 6)
put("worker", "hisparse-two", [1] + submit(1, 30) + submit(2, 10) + GRANT_FIRST + [40, 1, 1, 1, 0] + ITER4 * 6)
put("worker", "resident", [0] + submit(3) + GRANT_FIRST + ITER4 * 4)
put("worker", "orders", [2] + submit(1, 40, 6) + [40, 0, 1, 0, 2] + ITER4 * 2 +
    [83, 1, 1, 2, 0, 1, 0] + [150] + ITER4 + [85, 2, 1, 1, 3, 0, 1, 0] + ITER4 * 3 + [86, 1, 0])

# ---- safetensors: hand-made small files (tiny models: fuzz/make_seeds.cc) ----
def st(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data
put("safetensors", "one-f32", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8))
put("safetensors", "dtypes", st({"__metadata__": {"k": "v"},
                                 "b": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [0, 4]},
                                 "c": {"dtype": "I8", "shape": [], "data_offsets": [4, 5]},
                                 "d": {"dtype": "BOOL", "shape": [0], "data_offsets": [5, 5]}}, b"\1" * 5))
put("safetensors", "empty-header", st({}))

# ---- trace (fuzz/trace_fuzz.cc): selector byte (0 mooncake, 1 azure, 2 timestamp), scale byte, then the text ----
def head(path, n):
    with open(path, "rb") as f:
        return b"".join(f.readlines()[:n])
put("trace", "mooncake", b"\0\3" + head("tools/replay/data/mooncake_conversation_head200.jsonl", 4))
put("trace", "azure", b"\1\3" + head("tools/replay/data/azure_llm_conv_2023_head200.csv", 4))
put("trace", "timestamp", b"\2\0" + b"2023-11-16 18:17:03.9799600")
put("trace", "timestamp-offset", b"\2\0" + b"2023-11-16 18:17:03.5+01:30")

# ---- node_config (fuzz/node_config_fuzz.cc): the TOML text of a dhs-node configuration ----
NODE = b"""[node]
run_dir = "/tmp/dhs-fuzz"
[memd]
host_pool_bytes = "16MiB"
reserve_pages = 2
reclaim_policy = "oldest-first"
[[worker]]
gpu = 0
preset = "glm5-like"
page_rows = 16
hbm_budget_bytes = "4MiB"
slots = 4
[[worker]]
gpu = 1
mode = "resident"
device = "cpu"
extra_args = ["--link-model", "pcie4"]
[supervise]
backoff_initial_ms = 100
backoff_max_ms = 1600
max_restarts = 3
restart_workers_with_memd = false
"""
put("node_config", "good", NODE)
put("node_config", "weights-page-bytes", NODE.replace(b'preset = "glm5-like"', b'weights = "/w.safetensors"')
    .replace(b"reserve_pages = 2", b"page_bytes = 64512"))
put("node_config", "duplicate-gpu", NODE.replace(b"gpu = 1", b"gpu = 0"))
put("node_config", "bad-types", NODE.replace(b"slots = 4", b'slots = "4"').replace(b"gpu = 1", b"gpu = -1"))
put("node_config", "inline-tables", b'node = { run_dir = "/r" }\nmemd = { host_pool_pages = 8 }\n'
    b'worker = [ { gpu = 3, page_rows = 8 }, { gpu = 4 } ]\n')
put("node_config", "syntax", b"[node]\nrun_dir = \"/r\"\n[[worker]\ngpu = = 1\n")
put("node_config", "size", b"64MiB")
