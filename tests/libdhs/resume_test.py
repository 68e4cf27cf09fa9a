"""tests/libdhs/resume_test.py: restart survival through libdhs (issue 25; brief §3): an engine process appends a
request's rows, the library backs its complete pages up into memd's host pool, and the process is SIGKILLed. A new
process opens the GPU's worker again (a new epoch: memd fences the old one and keeps the request's confirmed host
pages), finds the request in dhs_worker_list_resumable, resumes it (resume_of), imports its host-backed pages without
recomputing them (dhs_request_import) and reads back exactly the rows and index keys the dead process appended.
ABI 1.5: the dead process's prompt tokens and committed tokens come back from memd's token record
(dhs_worker_resumable_tokens), and the resume continues the record after them.

Usage (under with_memd.py, memd --page-bytes 2304): resume_test.py --run-dir DIR"""
import argparse
import os
import signal
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:
    print("resume_test: numpy is not installed; skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import dhs  # noqa: E402

S, ROW, KEY, P = 2, 64, 16, 16
INPUT, MAX = 64, 96
PROMPT = [50000 + 7 * i for i in range(INPUT)]  # an engine vocabulary's ids (above 255)
GENERATED = [151643, 0, 2 ** 31 - 1, -1]  # any int32, kept as given


def rows(first, n):
    return np.stack([np.random.default_rng(t).integers(0, 256, size=(S, ROW), dtype=np.uint8)
                     for t in range(first, first + n)])


def keys(first, n):
    return np.stack([np.random.default_rng(10000 + t).integers(0, 256, size=KEY, dtype=np.uint8)
                     for t in range(first, first + n)])[None]  # [indexer][position][bytes]


def open_worker(run_dir):
    return dhs.Worker(run_dir, sources=S, row_bytes=ROW, indexers=1, index_key_bytes=KEY, page_rows=P, top_k=8,
                      hot_rows=32, tail_rows=32, slots=2, hbm_budget_bytes=16 * P * S * ROW, mode=dhs.MODE_HISPARSE)


def wait_event(w, kind, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for ev in w.poll():
            if ev.kind == kind:
                return ev
            if ev.kind in (dhs.EVENT_REJECTED, dhs.EVENT_FAILED):
                raise RuntimeError(repr(ev))
        time.sleep(0.002)
    raise RuntimeError(f"no {dhs.EVENT_NAMES[kind]} event")


def crash(run_dir) -> int:
    """The first engine process: a request's 64 rows appended and backed up (hisparse), then SIGKILL."""
    w = open_worker(run_dir)
    rid = w.submit(INPUT, MAX, tokens=PROMPT)
    wait_event(w, dhs.EVENT_GRANTED)
    w.append(rid, 0, rows(0, INPUT), keys(0, INPUT))
    w.commit_tokens(rid, GENERATED, digests=[11, 22, 33, 44])
    deadline = time.monotonic() + 10
    while (w.stats()["pages"]["backed_up"] < INPUT // P or w.stats()["tokens"]["acknowledged"] < len(GENERATED) or
           w.stats()["tokens"]["in_flight"]) and time.monotonic() < deadline:
        w.poll()
        time.sleep(0.002)
    for _ in range(20):  # the HostCopyWritten reports go out inside poll; memd confirms them
        w.poll()
        time.sleep(0.005)
    print(rid, w.stats()["pages"]["backed_up"], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return 1


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--crash", action="store_true")
    a = ap.parse_args()
    if a.crash:
        return crash(a.run_dir)
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--run-dir", a.run_dir, "--crash"],
                           capture_output=True, text=True, timeout=60)
    print(child.stderr, end="")
    last = child.stdout.strip().splitlines()[-1] if child.stdout.strip() else ""  # the library logs lines too
    if child.returncode != -signal.SIGKILL or len(last.split()) != 2:
        print("the first process did not get as far as its SIGKILL:", child.returncode, child.stdout)
        return 1
    rid, backed = (int(x) for x in last.split())
    print(f"first process: request {rid}, {backed} pages backed up, then SIGKILL")
    if backed != INPUT // P:
        return 1

    w = open_worker(a.run_dir)
    listed = w.list_resumable()
    print("resumable after the restart:", listed)
    if (rid, INPUT, MAX) not in listed:
        return 1
    try:
        w.submit(INPUT, MAX, resume_of=rid + 12345)
        print("a resume of an unknown request was taken")
        return 1
    except dhs.DhsError as e:
        assert e.name == "DHS_ERR_NOT_FOUND", e
    prompt, generated = w.resumable_tokens(rid)
    print(f"token record: {len(prompt)} prompt tokens, generated {generated}")
    if prompt != PROMPT or generated != GENERATED:
        print("the token record differs from what the dead process committed")
        return 1
    new = w.submit(INPUT, MAX, resume_of=rid)
    ev = wait_event(w, dhs.EVENT_GRANTED)
    print(f"resume {new} granted: {ev.pages} host-backed pages, pages 0 .. {ev.import_pages - 1} importable")
    if ev.request != new or ev.pages != INPUT // P or ev.import_pages != INPUT // P:
        return 1
    # ABI 1.4: the import plan. A prefill of INPUT rows computes its last row, so page 3 (rows 48 .. 63) is not in it;
    # one of INPUT + 1 rows imports every page.
    plan, plan_more = w.import_plan(new, INPUT), w.import_plan(new, INPUT + 1)
    print("import plans:", plan, plan_more)
    if plan != [(0, INPUT // P - 1)] or plan_more != [(0, INPUT // P)]:
        return 1
    try:
        w.import_plan(new, MAX + 1)
        print("a plan beyond max_rows was made")
        return 1
    except dhs.DhsError as e:
        assert e.name == "DHS_ERR_INVALID_ARGUMENT", e
    try:
        w.import_rows(new, 1, 1, P)  # not at the rows appended (0)
        print("an import past the appended rows was taken")
        return 1
    except dhs.DhsError as e:
        assert e.name == "DHS_ERR_FAILED_PRECONDITION", e
    got_keys = w.import_rows(new, 0, ev.import_pages, P)
    if not np.array_equal(got_keys, keys(0, INPUT)):
        print("index keys differ from the ones the first process appended")
        return 1
    pool = w.pool_bytes()
    want = rows(0, INPUT)
    for src in range(S):
        for sel in ([0, 1, 2, 3, 4, 5, 6, 7], [15, 16, 17, 31, 32, 33, 62, 63], [40, 8, 9, 50, 55, -1, -1, -1]):
            loc = w.resolve(src, [(new, np.array(sel))])[0]
            for t, o in zip(sel, loc):
                if t < 0:
                    continue
                if not np.array_equal(pool[o:o + ROW], want[t, src]):
                    print(f"source {src} position {t}: bytes differ")
                    return 1
            w.readers_done(src)
    w.append(new, INPUT, rows(INPUT, 1), keys(INPUT, 1))  # decoding goes on
    # The resume's record starts from the 4 tokens: 28 more fit (MAX - INPUT = 32), a 29th does not.
    try:
        w.commit_tokens(new, [5] * 29)
        print("a commit past max_rows - input_rows was taken")
        return 1
    except dhs.DhsError as e:
        assert e.name == "DHS_ERR_OUT_OF_RANGE", e
    w.commit_tokens(new, [5] * 28)
    st = w.stats()
    print("census after the resume:", st["census"])
    if st["census"]["host"] == 0:
        return 1
    w.complete(new)
    w.close()
    print("resumed from host copies: rows and index keys equal, no row recomputed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
