"""tests/libdhs/prefix_test.py: prefix sharing through the Python binding (issue 24 through libdhs's ABI 1.1): a request
naming a prefix chain (tenant, prompt tokens, Mooncake-style block ids) appends its rows; once their host copies are
confirmed, a second request of the same tenant naming the same chain is granted those pages as shared host pages
(GRANTED.shared_pages), imports them (import_rows) and reads back the first request's rows and index keys; a request of
another tenant naming the same chain gets none.

Usage (under with_memd.py with MEMD_EXTRA_ARGS="--prefix-sharing on", memd --page-bytes 2304): prefix_test.py
--run-dir DIR"""
import argparse
import os
import sys
import time

try:
    import numpy as np
except ImportError:
    print("prefix_test: numpy is not installed; skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import dhs  # noqa: E402

S, ROW, KEY, P = 2, 64, 16, 16
INPUT, MAX, BLOCK = 64, 80, 32  # 2 blocks of 32 tokens = 4 pages of 16 rows


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    args = ap.parse_args()
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 50000, size=INPUT, dtype=np.int32)
    ids = [0xABC001, 0xABC002]  # hash_ids of the 2 blocks
    rows = rng.integers(0, 256, size=(INPUT, S, ROW), dtype=np.uint8)
    keys = rng.integers(0, 256, size=(1, INPUT, KEY), dtype=np.uint8)
    with dhs.Worker(args.run_dir, sources=S, row_bytes=ROW, indexers=1, index_key_bytes=KEY, page_rows=P, top_k=8,
                    hot_rows=32, tail_rows=32, slots=2, hbm_budget_bytes=16 * P * S * ROW,
                    mode=dhs.MODE_HISPARSE) as w:
        a = w.submit(INPUT, MAX, tenant="t1", session=11, tokens=tokens, block_tokens=BLOCK, block_ids=ids)
        ev = wait_event(w, dhs.EVENT_GRANTED)
        assert ev.shared_pages == 0, ev
        w.append(a, 0, rows, keys)
        deadline = time.monotonic() + 10
        while w.stats()["pages"]["backed_up"] < 4 and time.monotonic() < deadline:
            w.poll()
            time.sleep(0.001)
        for _ in range(20):  # the confirmations reach memd
            w.poll()
            time.sleep(0.005)
        w.complete(a)

        b = w.submit(INPUT, MAX, tenant="t1", session=12, tokens=tokens, block_tokens=BLOCK, block_ids=ids)
        ev = wait_event(w, dhs.EVENT_GRANTED)
        print("prefix_test: same tenant:", ev)
        assert ev.shared_pages == 4 and ev.import_pages == 4, ev
        got_keys = w.import_rows(b, 0, 4, P)
        assert np.array_equal(got_keys, keys), "imported index keys differ"
        pool = w.pool_bytes()
        sel = np.array([0, 9, 16, 31, 32, 50, 63, -1], dtype=np.int64)
        for s in range(S):
            loc = w.resolve(s, [(b, sel)])[0]
            for j, t in enumerate(sel[:-1]):
                assert np.array_equal(pool[loc[j]:loc[j] + ROW], rows[t, s]), (s, t)
            w.readers_done(s)
        w.complete(b)

        c = w.submit(INPUT, MAX, tenant="t2", session=13, tokens=tokens, block_tokens=BLOCK, block_ids=ids)
        ev = wait_event(w, dhs.EVENT_GRANTED)
        print("prefix_test: other tenant:", ev)
        assert ev.shared_pages == 0 and ev.pages == 0, ev
        w.complete(c)
        stats = w.stats()["prefix"]
        print("prefix_test: stats", stats)
        assert stats == {"lookups": 6, "shared_pages_granted": 4}, stats
    print("prefix_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
