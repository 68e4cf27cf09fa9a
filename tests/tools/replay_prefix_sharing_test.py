#!/usr/bin/env python3
"""The content-addressed host tier end to end (issue 24, worker side): real memd + workerd started by dhs-replay.

A conversation trace made from the bundled Mooncake slice (its first 200 rows repeat few multi-block prefixes): its
first 15 rows (8 more hash ids each of its own, so that after scaling the ids cover every input token), then their
follow-up turns (the same ids + 4 new blocks + 8 of its own, 4 * 512 more input tokens); 30 requests,
lengths x 0.03 (blocks of 15 tokens), plain prefill (prompt bytes: the worker derives its chain from the tokens) unless
said otherwise. Asserts:
  1. hisparse, --prefix-sharing on, --check-exact: every request served, tokens and logits digests equal to resident
     serving; blocks were imported from memd's shared host pages (prefix.hits_host > 0, prefill_tokens_saved > 0,
     host_pages_shared > 0);
  2. hisparse, sharing off: nothing imported from host (hits_host == 0), and every request's tokens and digests equal
     run 1's (sharing on == sharing off == resident);
  3. adaptive under dhs-replay's default GPU budget, sharing on, --check-exact: reclaims forced (reclaims > 0), shared
     pages imported (hits_host > 0), exact;
  4. hisparse, sharing on, worker kill points (prefill:3, decode:40), --check-exact: the workers were killed and
     restarted, requests resumed, exact, no host row lost; the prepared-prefix path (hash_ids) as well;
  4b. hisparse, sharing on, memd restarted every ~0.5 s while the worker survives (its re-Hello reports the shared pages
     its requests hold): memd restarted, exact, no host row lost (dhs-replay checks after the worker's re-Hello; a
     report whose shared pages memd refused would leave them off the request: counted lost);
  5. two tenants replaying the same trace (every row twice in a row, --tenants 2 --tenant-by index, closed loop at
     C = 1: row 2k is tenant "#0", row 2k+1 tenant "#1"; by session the twin would be its row's next turn): each tenant's outputs equal a run of the trace with that tenant alone, and
     the host hits are exactly twice the lone tenant's (a page shared across tenants would add the twin row's whole
     prefix) and memd holds twice the lone tenant's shared pages (each tenant its own copy); the control: the same
     doubled trace under one tenant hits more than that and holds the lone tenant's pages once;
Bad input (the same ids with other tokens) cannot come through dhs-replay (a prepared prefix's tokens follow from its
ids; prompt bytes get ids derived from their tokens): memd_process MemdPrefix.AChainWithTheSameIdsAndOtherTokens...
tests it with chains as the worker names them.
Usage: replay_prefix_sharing_test.py DHS_REPLAY"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRACE = os.path.join(HERE, "..", "..", "tools", "replay", "data", "mooncake_conversation_head200.jsonl")
PAIRS = 15
N = 2 * PAIRS


def replay(exe, tmp, tag, args, requests=N):
    out, outputs = os.path.join(tmp, f"{tag}.json"), os.path.join(tmp, f"{tag}.outputs")
    cmd = [exe, *args, "--json", out, "--outputs", outputs]
    print("$", " ".join(cmd[1:]), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    report, rows = {}, {}
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    if os.path.exists(outputs):
        with open(outputs) as f:
            rows = {r["trace_index"]: r for r in map(json.loads, filter(None, f.read().splitlines()))}
    p = report.get("prefix") or {}
    print(f"  rc {proc.returncode}: served {report.get('requests_served')}/{requests}, exact "
          f"{report.get('exact_match')}, prefix {p}, tokens saved {report.get('prefill_tokens_saved')}, "
          f"host pages shared {report.get('host_pages_shared')}, host bytes/session "
          f"{report.get('host_bytes_per_session')}, reclaims {report.get('reclaims')}", flush=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
    return proc.returncode, report, rows


def served(failures, tag, rc, report, requests=N, exact=None):
    if rc != 0:
        failures.append(f"{tag}: dhs-replay exited {rc}")
        return False
    if report.get("requests_served") != requests or report.get("requests_failed") != 0:
        failures.append(f"{tag}: served {report.get('requests_served')}, failed {report.get('requests_failed')}")
    if exact is not None and report.get("exact_match") is not True:
        failures.append(f"{tag}: exact_match = {report.get('exact_match')!r}")
    return True


def same(a, b):
    return a.get("served") and b.get("served") and a["tokens"] == b["tokens"] and \
        a["logits_digests"] == b["logits_digests"] and len(a["tokens"]) > 0


def hits(report):
    return (report.get("prefix") or {}).get("hits_host", 0)


def base_rows():
    rows = []
    with open(TRACE) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
            if len(rows) == PAIRS:
                break
    for k, r in enumerate(rows):
        r["own"] = [10**12 + 100 * k + j for j in range(8)]
    return rows


def conversation_trace(tmp):
    """The base rows, then their follow-up turns in the same order (each shares every block of its row's hash ids and
    comes after it ended, so its row's pages are confirmed by then)."""
    path = os.path.join(tmp, "conversation.jsonl")
    firsts, follow_ups = [], []
    for k, r in enumerate(base_rows()):
        a = {"timestamp": r["timestamp"], "input_length": r["input_length"], "output_length": r["output_length"],
             "hash_ids": r["hash_ids"] + r["own"]}
        firsts.append(a)
        follow_ups.append(dict(a, input_length=r["input_length"] + 4 * 512,
                               hash_ids=r["hash_ids"] + [2 * 10**12 + 100 * k + j for j in range(4)] +
                               [3 * 10**12 + 100 * k + j for j in range(8)]))
    with open(path, "w") as f:
        for row in firsts + follow_ups:
            f.write(json.dumps(row) + "\n")
    return path


def tenant_traces(tmp):
    """The conversation trace once (the lone tenant's) and each of its rows twice in a row (rows 2k and 2k+1 the same
    request: the two tenants' trace)."""
    conv = conversation_trace(tmp)
    with open(conv) as f:
        rows = [l for l in f.read().splitlines() if l]
    twice = os.path.join(tmp, "twice.jsonl")
    with open(twice, "w") as g:
        for r in rows:
            g.write(r + "\n" + r + "\n")
    return conv, twice


def main():
    exe = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        conv = conversation_trace(tmp)
        SLICE = ["--trace", conv, "--requests", str(N), "--length-scale", "0.03"]
        # 1, 2: sharing on (against resident) and off.
        rc, on, on_rows = replay(exe, tmp, "on", SLICE + ["--mode", "hisparse", "--concurrency", "2",
                                                          "--prefix-sharing", "on", "--check-exact"])
        if served(failures, "on", rc, on, exact=True):
            if hits(on) <= 0 or on.get("prefill_tokens_saved", 0) <= 0 or on.get("host_pages_shared", 0) <= 0:
                failures.append(f"on: nothing imported from shared host pages: prefix {on.get('prefix')}, saved "
                                f"{on.get('prefill_tokens_saved')}, shared {on.get('host_pages_shared')}")
            if (on.get("settings") or {}).get("prefix_sharing") != "on":
                failures.append(f"on: settings.prefix_sharing {(on.get('settings') or {}).get('prefix_sharing')!r}")
            hb = on.get("host_bytes_per_session") or {}
            if not 0 < hb.get("mean", 0) <= hb.get("peak", 0):
                failures.append(f"on: host_bytes_per_session {hb}")
        rc, off, off_rows = replay(exe, tmp, "off", SLICE + ["--mode", "hisparse", "--concurrency", "2"])
        if served(failures, "off", rc, off):
            if hits(off) != 0 or off.get("host_pages_shared", 0) != 0:
                failures.append(f"off: prefix {off.get('prefix')}, host_pages_shared {off.get('host_pages_shared')}")
            if (off.get("prefix") or {}).get("lookups", 0) <= 0:
                failures.append(f"off: the worker named no chain (lookups {off.get('prefix')})")
            diff = [i for i in range(N) if i not in on_rows or i not in off_rows or not same(on_rows[i], off_rows[i])]
            if diff:
                failures.append(f"sharing on != sharing off at rows {diff[:10]}")
        # 3: forced reclaims (adaptive under dhs-replay's default budget, which reclaims).
        rc, rec, _ = replay(exe, tmp, "reclaim", SLICE + ["--mode", "adaptive", "--concurrency", "4",
                                                          "--prefix-sharing", "on", "--check-exact"])
        if served(failures, "reclaim", rc, rec, exact=True):
            if rec.get("reclaims", 0) < 1:
                failures.append("reclaim: no reclaim: the budget did not put the node under pressure")
            if hits(rec) <= 0:  # pages reach host by reclaims' backups and decoded pages: shared, then imported
                failures.append(f"reclaim: no shared page imported: prefix {rec.get('prefix')}")
        # 4: worker kills, plain prefill and prepared prefix.
        for tag, extra in (("kills", []), ("kills-prepared", ["--prepared-prefix"])):
            rc, k, _ = replay(exe, tmp, tag, SLICE + ["--mode", "hisparse", "--concurrency", "2", "--prefix-sharing",
                                                      "on", "--check-exact", "--fault-seed", "7", "--kill-worker-at",
                                                      "prefill:3", "--kill-worker-at", "decode:40", *extra])
            if served(failures, tag, rc, k, exact=True):
                if k.get("worker_restarts") != 2 or k.get("requests_resumed", 0) < 1:
                    failures.append(f"{tag}: worker_restarts {k.get('worker_restarts')}, resumed "
                                    f"{k.get('requests_resumed')}")
                if k.get("host_rows_lost") != 0:
                    failures.append(f"{tag}: host_rows_lost {k.get('host_rows_lost')}")
        # 4b: memd restarts while the worker survives (issue 24): its re-Hello names the shared pages its requests
        # hold; memd takes them back as references (memd_prefix_pages ASurvivingWorkersReportHoldsTheSharedPagesItNames).
        rc, m, _ = replay(exe, tmp, "memd-restarts", SLICE + ["--mode", "hisparse", "--concurrency", "2",
                                                               "--prefix-sharing", "on", "--check-exact",
                                                               "--fault-seed", "7", "--restart-memd-every", "0.5"])
        if served(failures, "memd-restarts", rc, m, exact=True):
            if m.get("memd_restarts", 0) < 1:
                failures.append(f"memd-restarts: no memd restart ({m.get('memd_restarts')})")
            if m.get("host_rows_lost") != 0:
                failures.append(f"memd-restarts: host_rows_lost {m.get('host_rows_lost')}")
        # 5: two tenants.
        once, doubled = tenant_traces(tmp)
        base = ["--mode", "hisparse", "--concurrency", "1", "--length-scale", "0.03", "--prefix-sharing", "on"]
        rc, mix, mix_rows = replay(exe, tmp, "two-tenants", base + ["--trace", doubled, "--requests", str(2 * N),
                                                                    "--tenants", "2", "--tenant-by", "index"], 2 * N)
        rc0, solo, solo_rows = replay(exe, tmp, "tenant0", base + ["--trace", once, "--requests", str(N),
                                                                   "--tenant", "#0"])
        rc1, one, _ = replay(exe, tmp, "one-tenant", base + ["--trace", doubled, "--requests", str(2 * N)], 2 * N)
        ok = served(failures, "two tenants", rc, mix, 2 * N) & served(failures, "tenant #0 alone", rc0, solo) & \
            served(failures, "doubled, one tenant", rc1, one, 2 * N)
        if ok:
            diff = [k for k in range(N) for twin in (2 * k, 2 * k + 1)
                    if k not in solo_rows or twin not in mix_rows or not same(solo_rows[k], mix_rows[twin])]
            if diff:
                failures.append(f"two tenants: outputs differ from the lone tenant's at rows {diff[:10]}")
            if hits(solo) <= 0 or hits(mix) != 2 * hits(solo):
                failures.append(f"two tenants: hits_host {hits(mix)}, want twice the lone tenant's {hits(solo)} "
                                f"(no page shared across tenants)")
            # memd's stats (status view, sampled at the end): each tenant stores its own copy of every page.
            shared = [r.get("host_pages_shared", 0) for r in (mix, solo, one)]
            if shared[1] <= 0 or shared[0] != 2 * shared[1] or shared[2] != shared[1]:
                failures.append(f"host_pages_shared two tenants / lone tenant / one tenant twice: {shared}, want "
                                f"2x, x, x")
            if hits(one) <= 2 * hits(solo):
                failures.append(f"control: one tenant over the doubled trace hits {hits(one)}, want more than "
                                f"{2 * hits(solo)} (the twin's prefix)")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("OK: prefix sharing exact (on == off == resident; reclaims; kills), tenants isolated")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
