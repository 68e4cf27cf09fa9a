#!/usr/bin/env python3
"""dhs-replay against a real node (memd + one workerd started from `dhs-node --check`'s command lines, glm5-like on
the CPU) for issue 22:
(1) --request-timeout-ms 1: every request's timeout fires, dhs-replay cancels it (Cancel) and the worker ends it with
    CANCELLED and releases it: the JSON report counts each request once under end reason "timeout" with the worker's
    reason in `failures`, dhs-replay exits 1 naming them, the worker logged each cancel, and memd (`dhsctl --json
    gpus`, `requests`) holds no request and no slot afterwards; the worker serves on (the next run is served).
(2) the worker's serving socket over TCP (`workerd --listen tcp://:PORT`, CURVE): dhs-replay --connect tcp://...
    --curve-server-key RUN/serving-curve.pub serves every request; without the key file dhs-replay refuses to start
    (exit 2); the same requests over ipc:// produce the same output token counts.
(3) SIGTERM of the worker under a --connect run (24 requests, stopped after 3 s): dhs-replay reports the worker
    *stopped* (not "went away") and the partial report keeps each request's end reason (worker_stopping for those
    it ended, worker_gone for those it never answered).
Usage: replay_cancel_test.py DHS_NODE DHS_REPLAY DHSCTL"""
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

from proc_util import wait_until

CONFIG = """
[node]
run_dir = "{run_dir}"

[memd]
host_pool_bytes = "32MiB"
log_level = "warn"

[[worker]]
gpu = 0
preset = "glm5-like"
page_rows = 16
slots = 2
hbm_budget_bytes = "4MiB"
device = "cpu"
log_level = "info"
extra_args = ["--listen", "tcp://:{port}"]
"""


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def replay(binary: str, args: list, tmp: str, name: str, timeout: float = 240):
    out = os.path.join(tmp, name + ".json")
    r = subprocess.run([binary, "--requests", "4", "--concurrency", "2", "--json", out] + args,
                       capture_output=True, text=True, timeout=timeout)
    report = json.loads(read(out)) if os.path.exists(out) else None
    return r, report


def dhsctl_json(dhsctl: str, run_dir: str, verb: str):
    r = subprocess.run([dhsctl, "--run-dir", run_dir, "--json", verb], capture_output=True, text=True, timeout=30)
    return json.loads(r.stdout) if r.returncode == 0 else None


def main() -> int:
    node, replay_bin, dhsctl = sys.argv[1], sys.argv[2], sys.argv[3]
    failures = []
    with tempfile.TemporaryDirectory(prefix="dhs-cancel-") as tmp:
        run_dir = os.path.join(tmp, "run")
        port = free_port()
        config = os.path.join(tmp, "node.toml")
        with open(config, "w") as f:
            f.write(CONFIG.format(run_dir=run_dir, port=port))
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        # The command lines come first on stdout (the checks that follow are dhs-node's business, not this test's).
        check = subprocess.run([node, "--config", config, "--check"], capture_output=True, text=True, timeout=60)
        lines = [l for l in check.stdout.split("\n") if l.strip()]
        if len(lines) < 2:
            print(f"dhs-node --check: rc {check.returncode} {check.stdout!r} {check.stderr!r}")
            return 1
        procs = []
        logs = {}
        try:
            for name, line in (("memd", lines[0]), ("workerd", lines[1])):
                logs[name] = os.path.join(tmp, name + ".log")
                with open(logs[name], "w") as log:
                    procs.append(subprocess.Popen(shlex.split(line), stdout=log, stderr=subprocess.STDOUT))
                sock = os.path.join(run_dir, "memd.sock" if name == "memd" else "worker-0.sock")
                if not wait_until(lambda: os.path.exists(sock), 60):
                    print(f"{name} did not come up:\n{read(logs[name])}")
                    return 1
            ipc = "ipc://" + os.path.join(run_dir, "worker-0.sock")
            tcp = f"tcp://127.0.0.1:{port}"
            key = os.path.join(run_dir, "serving-curve.pub")
            wait_until(lambda: os.path.exists(key), 30)

            # (1) every request times out: cancelled, released by the worker and memd.
            r, report = replay(replay_bin, ["--connect", ipc, "--request-timeout-ms", "1"], tmp, "timeout")
            if r.returncode != 1 or report is None:
                failures.append(f"timeout run: rc {r.returncode}, report {report is not None}: {r.stderr}")
            else:
                if report["end_reasons"] != {"timeout": 4}:
                    failures.append(f"timeout run: end reasons {report['end_reasons']}, want 4 timeouts")
                for f in report["failures"]:
                    if f["end_reason"] != "timeout" or "cancelled: timeout after 1 ms" not in f["error"]:
                        failures.append(f"timeout run: failure entry {f}")
                if "not served (timeout)" not in r.stderr:
                    failures.append(f"timeout run: stderr names no timeout:\n{r.stderr}")
            released = wait_until(lambda: (dhsctl_json(dhsctl, run_dir, "requests") == [] and
                                           (dhsctl_json(dhsctl, run_dir, "gpus") or [{}])[0].get("slots_used") == 0),
                                  30)
            if not released:
                failures.append(f"memd still holds cancelled requests: {dhsctl_json(dhsctl, run_dir, 'requests')} "
                                f"{dhsctl_json(dhsctl, run_dir, 'gpus')}")
            cancels = read(logs["workerd"]).count("cancelled by its client")
            if cancels != 4:
                failures.append(f"the worker logged {cancels} cancels, want 4")
            print(f"timeout run: ends {report and report['end_reasons']}, worker cancels {cancels}, "
                  f"memd released {released}")

            # (2) TCP with CURVE, the same requests as over ipc.
            r_ipc, rep_ipc = replay(replay_bin, ["--connect", ipc], tmp, "ipc")
            r_tcp, rep_tcp = replay(replay_bin, ["--connect", tcp, "--curve-server-key", key], tmp, "tcp")
            if r_ipc.returncode != 0 or r_tcp.returncode != 0:
                failures.append(f"ipc rc {r_ipc.returncode} / tcp rc {r_tcp.returncode}:\n{r_ipc.stderr}\n{r_tcp.stderr}")
            elif rep_tcp["requests_served"] != 4 or rep_tcp["output_tokens"] != rep_ipc["output_tokens"]:
                failures.append(f"tcp served {rep_tcp['requests_served']}, {rep_tcp['output_tokens']} tokens; ipc "
                                f"{rep_ipc['output_tokens']}")
            else:
                print(f"tcp: 4 served, {rep_tcp['output_tokens']} tokens (ipc {rep_ipc['output_tokens']}), "
                      f"TPOT ms p50 {rep_tcp['tpot_ms']['p50']}")
                if not (rep_tcp["tpot_ms"]["p50"] or 0) > 0:
                    failures.append(f"tcp: TPOT p50 {rep_tcp['tpot_ms']['p50']}: not measured from the stamps")
            nokey = subprocess.run([replay_bin, "--connect", tcp], capture_output=True, text=True, timeout=30)
            if nokey.returncode != 2 or "--curve-server-key" not in nokey.stderr:
                failures.append(f"tcp without a key: rc {nokey.returncode}: {nokey.stderr}")

            # (3) SIGTERM of the worker mid-run: "stopped", every request's reason in the report.
            out = os.path.join(tmp, "stop.json")
            proc = subprocess.Popen([replay_bin, "--connect", ipc, "--requests", "24", "--concurrency", "2",
                                     "--json", out],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            time.sleep(3)
            if proc.poll() is not None:
                failures.append(f"stop run: the replay ended (rc {proc.returncode}) before the worker was stopped")
            procs[1].send_signal(signal.SIGTERM)
            procs[1].wait(timeout=60)
            _, err = proc.communicate(timeout=60)
            report = json.loads(read(out)) if os.path.exists(out) else None
            if proc.returncode != 1 or report is None:
                failures.append(f"stop run: rc {proc.returncode}, report {report is not None}: {err}")
            else:
                if "stopped" not in err or "went away" in err:
                    failures.append(f"stop run: want 'stopped', not 'went away':\n{err}")
                stopped = report["end_reasons"].get("worker_stopping", 0)
                if stopped < 1 or report["complete"]:
                    failures.append(f"stop run: end reasons {report['end_reasons']}, complete {report['complete']}")
                print(f"stop run: ends {report['end_reasons']}")
        finally:
            for p in reversed(procs):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
