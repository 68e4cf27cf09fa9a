"""python/examples/sparse_decode.py: an example engine on libdhs (issue 25): a small sparse-attention decode loop in
numpy that keeps its KV rows in libdhs pools, resolves each query's top-k selection through the library (the fused
resolver: tail, hot cache, ready map, host recovery) and serves a few requests of the bundled Mooncake slice through
memd with a GPU budget small enough that memd reclaims earlier requests' pages (forced reclaims). Its tokens are
compared with the same loop keeping every row resident in numpy (brief §7): equal, or the run fails.

Usage: sparse_decode.py --run-dir DIR [--requests 4] [--grouped | --speculate K]
                        [--trace tools/replay/data/mooncake_conversation_head200.jsonl]
       (memd in DIR started with --page-bytes 2304, i.e. p * (S * d_KV + L_idx * d_idx) = 16 * (2 * 64 + 16))
Exit 0: outputs equal and at least one reclaim served; 1: a mismatch or no reclaim; 77: numpy missing (skipped).

The model (seeded, not trained): byte-free vocabulary of 64 tokens; per position one payload row per source
(S = 2 layers, d_KV = 16 float32 = 64 bytes, computed from the token's embedding as a producer computes its group's
rows) and one index key (4 float32); a query's selection is the top-k (k = 8) of q . key over positions <= t, ties to
the lower position, -1 padding; each layer attends over its selected rows (softmax), adds its output to the hidden
state; the next token is the argmax of the logits. Rows gathered in selection order, one fixed reduction order: the
same rows give the same bits whichever store served them.

--speculate K (ABI 1.5): speculative rounds of K queries (brief §6). A drafter (the embedding's bigram guess, cheap and
often wrong) proposes K - 1 tokens after the anchor; their rows are appended held (dhs_request_hold), the round's K
queries are resolved in one call per source with their positions (dhs_resolve_at) through staging arenas (chi = 1,
K_max = K; the hot cache is cut to B = k rows, so a round's union takes the arena), the longest prefix of drafts the model agrees with is kept
(dhs_request_commit) and A + 1 tokens are emitted. The tokens equal the non-speculative resident loop's."""
import argparse
import hashlib
import json
import os
import sys
import time

try:
    import numpy as np
except ImportError:
    print("sparse_decode: numpy is not installed; skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dhs  # noqa: E402

S, D_ROW, D_IDX, D, V, P, K = 2, 16, 4, 32, 64, 16, 8
ROW_BYTES, KEY_BYTES = D_ROW * 4, D_IDX * 4


class Model:
    def __init__(self, seed: int = 7):
        g = np.random.default_rng(seed)
        f = lambda *shape: (g.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)  # noqa: E731
        self.embed, self.w_kv, self.w_q, self.w_o = f(V, D), f(S, D_ROW, D), f(S, D_ROW, D), f(S, D, D_ROW)
        self.w_iq, self.w_ik, self.w_out = f(D_IDX, D), f(D_IDX, D), f(V, D)

    def fingerprint(self) -> int:
        """The model's fingerprint for libdhs (ABI 1.2, dhs_worker_config.model_fingerprint): 64 bits of BLAKE2b over
        every weight's bytes, so memd's cluster tier never mixes this model's pages with another's."""
        h = hashlib.blake2b(digest_size=8)
        for w in (self.embed, self.w_kv, self.w_q, self.w_o, self.w_iq, self.w_ik, self.w_out):
            h.update(w.tobytes())
        return int.from_bytes(h.digest(), "little") or 1

    def rows_and_key(self, token: int):
        """The payload rows [S, D_ROW] and index key [D_IDX] of a position holding `token` (float32)."""
        h0 = self.embed[token]
        return np.tanh(self.w_kv @ h0).astype(np.float32), (self.w_ik @ h0).astype(np.float32)

    def select(self, token: int, keys: np.ndarray, t: int) -> np.ndarray:
        """Top-k of positions 0..t by q . key (ties: the lower position first), -1 padded to k (int64)."""
        scores = keys[: t + 1] @ (self.w_iq @ self.embed[token])
        order = np.lexsort((np.arange(t + 1), -scores))[:K]
        sel = np.full(K, -1, dtype=np.int64)
        sel[: len(order)] = order
        return sel

    def draft(self, token: int) -> int:
        """The drafter's guess of the token after `token` (the logits of its embedding alone: no attention)."""
        return int(np.argmax(self.w_out @ self.embed[token]))

    def next_token(self, token: int, rows_of_layer) -> int:
        """rows_of_layer(l) -> the selected rows of layer l [n, D_ROW] float32, in selection order."""
        h = self.embed[token].copy()
        for layer in range(S):
            r = rows_of_layer(layer)
            a = r @ (self.w_q[layer] @ h)
            w = np.exp(a - a.max())
            h = h + self.w_o[layer] @ ((w / w.sum()) @ r)
        return int(np.argmax(self.w_out @ h))


def requests_of_trace(path: str, n: int):
    """The first n requests of the bundled slice, scaled to this toy: (prompt tokens, output length)."""
    out = []
    with open(path) as f:
        for line in f:
            if len(out) == n:
                break
            r = json.loads(line)
            g = np.random.default_rng(r["hash_ids"][0] if r["hash_ids"] else len(out))
            prompt = g.integers(0, V, size=min(96, max(20, r["input_length"] // 128))).tolist()
            out.append((prompt, min(12, max(4, r["output_length"] // 64))))
    return out


def serve_resident(model: Model, reqs):
    """The oracle: every row resident in numpy."""
    outputs = []
    for prompt, n_out in reqs:
        rows, keys, tokens = [], [], list(prompt)
        for tok in prompt:
            r, k = model.rows_and_key(tok)
            rows.append(r), keys.append(k)
        out = []
        for _ in range(n_out):
            t = len(tokens) - 1
            sel = model.select(tokens[t], np.stack(keys), t)
            picked = sel[sel >= 0]
            nxt = model.next_token(tokens[t], lambda layer: np.stack([rows[s][layer] for s in picked]))
            out.append(nxt)
            tokens.append(nxt)
            r, k = model.rows_and_key(nxt)
            rows.append(r), keys.append(k)
        outputs.append(out)
    return outputs


def append_retrying(w, *args, method="append"):
    """An append that the tail refused (a page's host copy in flight, RESOURCE_EXHAUSTED) goes again after a poll
    (the poll completes the backup; its events are kept for the loop)."""
    for _ in range(2000):
        try:
            return getattr(w, method)(*args)
        except dhs.DhsError as e:
            if e.code != dhs.ERR_RESOURCE_EXHAUSTED:
                raise
            w.pending_events.extend(w.poll())
            time.sleep(0.001)
    raise RuntimeError("append: the tail stayed full")


def serve_libdhs(model: Model, reqs, run_dir: str, budget_pages: int, grouped: bool = False, speculate: int = 0,
                 mode: int = dhs.MODE_ADAPTIVE):
    """The same loop with the KV in libdhs: requests submitted one admission at a time, memd admits (2 slots),
    queues, reclaims and populates; one decode step per iteration over every granted request (a batch per source).
    grouped (ABI 1.3): both layers read the index producer's one selection, so they are declared one group and
    resolved together (one plan, one call per step); decode steps append layer by layer (append_source per layer,
    then the indexer's keys) as an engine writing each layer's KV during its forward pass. speculate = K > 0: each step
    is a speculative round of K queries per request (module docstring), served through staging arenas. mode
    dhs.MODE_RESIDENT (ABI 1.7): every row stays in the pool; memd admits each request with its whole context, so a
    request that does not fit waits for another to complete."""
    w = dhs.Worker(run_dir, sources=S, row_bytes=ROW_BYTES, indexers=1, index_key_bytes=KEY_BYTES, page_rows=P,
                   top_k=K, hot_rows=K if speculate else 4 * K, tail_rows=2 * P, slots=2,
                   hbm_budget_bytes=budget_pages * P * S * ROW_BYTES, model_fingerprint=model.fingerprint(),
                   source_groups=[0] * S if grouped else None, mode=mode,
                   staging_arenas=1 if speculate else 0, round_queries=speculate)
    w.pending_events = []
    rounds = {"rounds": 0, "drafted": 0, "accepted": 0}
    pool = w.pool_bytes()
    cols = np.arange(ROW_BYTES)
    state = {}  # request id -> dict(i, tokens, keys, out)
    outputs, reclaims, tokens_made, submitted, waits = [None] * len(reqs), 0, 0, 0, 0
    start = time.monotonic()
    while any(o is None for o in outputs):
        # One admission at a time: the next request is submitted once every earlier one is granted and prefilled, so
        # memd decides it over requests whose kept pages are in place (the reclaims it orders then hit a request
        # that is decoding, not one that is finishing; found when a CI run's only reclaim order came for a request
        # completed at the same moment).
        if submitted < len(reqs) and all(st["granted"] for st in state.values()):
            prompt, n_out = reqs[submitted]
            rid = w.submit(len(prompt), len(prompt) + n_out)
            state[rid] = {"i": submitted, "tokens": list(prompt), "keys": [], "out": [], "granted": False,
                          "answered": False, "n_out": n_out}
            submitted += 1
        events, w.pending_events = w.pending_events + w.poll(), []
        for ev in events:
            st = state.get(ev.request)
            if st is not None and ev.kind in (dhs.EVENT_GRANTED, dhs.EVENT_WAITING):
                st["answered"] = True
            if ev.kind == dhs.EVENT_GRANTED:
                st["granted"] = True  # prefill: every prompt row (and key) appended in one call
                rk = [model.rows_and_key(tok) for tok in st["tokens"]]
                st["keys"] = [k for _, k in rk]
                keys = np.stack(st["keys"])[None]  # [indexer][position][D_IDX]
                w.append(ev.request, 0, np.stack([r for r, _ in rk]), keys)
            elif ev.kind == dhs.EVENT_RECLAIMED:
                reclaims += 1
            elif ev.kind == dhs.EVENT_WAITING:
                waits += 1
            elif ev.kind in (dhs.EVENT_REJECTED, dhs.EVENT_FAILED):
                raise RuntimeError(f"request {ev.request}: {ev}")
        batch = [rid for rid, st in state.items() if st["granted"]]
        # No decode step while memd has not answered the newest admission: the reclaims it orders to make room go to
        # requests still decoding, which then read their reclaimed rows back from host (without this wait, on a loaded
        # machine the victims could finish before memd's order arrived: no reclaim was served, ~1 run in 8).
        if not batch or not all(st["answered"] for st in state.values()):
            time.sleep(0.001)
            continue
        if speculate:
            tokens_made += speculative_step(model, w, pool, state, batch, outputs, speculate, rounds)
            continue
        sels = {rid: model.select(state[rid]["tokens"][-1], np.stack(state[rid]["keys"]),
                                  len(state[rid]["tokens"]) - 1) for rid in batch}
        rows = {rid: [] for rid in batch}
        if grouped:  # one fused resolve of the group (both layers) over the whole batch
            locs = w.resolve(list(range(S)), [(rid, sels[rid]) for rid in batch])
            for rid, loc in zip(batch, locs):
                for layer in range(S):
                    ll = loc[layer][loc[layer] >= 0]
                    rows[rid].append(pool[ll[:, None] + cols].view(np.float32).copy())
            w.readers_done(0)
        for layer in range(S if not grouped else 0):  # one fused resolve per source over the whole batch
            locs = w.resolve(layer, [(rid, sels[rid]) for rid in batch])
            for rid, loc in zip(batch, locs):
                loc = loc[loc >= 0]
                rows[rid].append(pool[loc[:, None] + cols].view(np.float32).copy())
            w.readers_done(layer)
        for rid in batch:
            st = state[rid]
            nxt = model.next_token(st["tokens"][-1], lambda layer: rows[rid][layer])
            st["out"].append(nxt)
            w.commit_tokens(rid, [nxt])  # memd's record of the request (ABI 1.5); TTFT / TPOT (ABI 1.6)
            tokens_made += 1
            if len(st["out"]) == st["n_out"]:
                outputs[st["i"]] = st["out"]
                w.complete(rid)
                del state[rid]
                continue
            st["tokens"].append(nxt)
            r, k = model.rows_and_key(nxt)
            st["keys"].append(k)
            t = len(st["tokens"]) - 1
            if grouped:  # layer by layer: layer 0 (the producer) and its key, then layer 1
                w.append_source(rid, 0, t, r[0][None])
                w.append_keys(rid, 0, t, k[None])
                for layer in range(1, S):
                    w.append_source(rid, layer, t, r[layer][None])
            else:
                w.append(rid, t, r[None], k[None, None])
    elapsed = time.monotonic() - start
    stats = w.stats()
    stats["rounds"] = rounds
    stats["waits"] = waits  # WAITING events: admissions memd queued
    w.close()
    return outputs, reclaims, stats, tokens_made / elapsed


def speculative_step(model: Model, w, pool, state, batch, outputs, width: int, rounds) -> int:
    """One speculative round of every request in `batch` (module docstring); returns the tokens emitted. Request r
    holds n + 1 rows (its anchor, tokens[n], the last); its drafts d_1 .. d_{K_r - 1} go to positions n + 1 ..
    n + K_r - 1 held; query j (position n + j) reads the token there and selects over positions <= n + j; y_j is the
    model's token after it. Drafts are kept while d_{j+1} == y_j (A of them): y_0 .. y_A are emitted, positions up to
    n + A committed, and y_A's row appended as the next anchor."""
    cols = np.arange(ROW_BYTES)
    plan = {}  # rid -> (n, query tokens, selections)
    for rid in batch:
        st = state[rid]
        n = len(st["tokens"]) - 1
        k_r = max(1, min(width, st["n_out"] - len(st["out"])))  # never emit past n_out
        qtok = [st["tokens"][-1]]
        for _ in range(k_r - 1):
            qtok.append(model.draft(qtok[-1]))
        w.hold(rid, n + 1)
        keys = list(st["keys"])
        for j, d in enumerate(qtok[1:], start=1):  # the drafts' rows and keys, held (unverified)
            r, k = model.rows_and_key(d)
            append_retrying(w, rid, n + j, r[None], k[None, None])
            keys.append(k)
        keys = np.stack(keys)
        plan[rid] = (n, qtok, [model.select(qtok[j], keys, n + j) for j in range(k_r)])
    queries = [(rid, sel) for rid in batch for sel in plan[rid][2]]
    at = [plan[rid][0] + j for rid in batch for j in range(len(plan[rid][1]))]
    rows = {(rid, j): [] for rid in batch for j in range(len(plan[rid][1]))}
    for layer in range(S):  # one resolve per source: every request's round, its union through the staging arena
        locs = w.resolve(layer, queries, at=at)
        keys_of = [(rid, j) for rid in batch for j in range(len(plan[rid][1]))]
        for key, loc in zip(keys_of, locs):
            loc = loc[loc >= 0]
            rows[key].append(pool[loc[:, None] + cols].view(np.float32).copy())
        w.readers_done(layer)
    made = 0
    for rid in batch:
        st = state[rid]
        n, qtok, _ = plan[rid]
        y = [model.next_token(qtok[j], lambda layer: rows[(rid, j)][layer]) for j in range(len(qtok))]
        accepted = 0
        while accepted + 1 < len(qtok) and qtok[accepted + 1] == y[accepted]:
            accepted += 1
        rounds["rounds"] += 1
        rounds["drafted"] += len(qtok) - 1
        rounds["accepted"] += accepted
        w.commit(rid, n + 1 + accepted)  # the anchor's row and the accepted drafts' rows stay
        emitted = y[: accepted + 1]
        st["out"].extend(emitted)
        w.commit_tokens(rid, emitted)
        st["tokens"].extend(qtok[1: accepted + 1])
        st["keys"].extend(model.rows_and_key(d)[1] for d in qtok[1: accepted + 1])
        made += len(emitted)
        if len(st["out"]) >= st["n_out"]:
            outputs[st["i"]] = st["out"][: st["n_out"]]
            w.complete(rid)
            del state[rid]
            continue
        nxt = emitted[-1]
        st["tokens"].append(nxt)
        r, k = model.rows_and_key(nxt)
        st["keys"].append(k)
        append_retrying(w, rid, len(st["tokens"]) - 1, r[None], k[None, None])
    return made


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--budget-pages", type=int, default=12)
    ap.add_argument("--grouped", action="store_true",
                    help="both layers one source group, decode appends layer by layer (ABI 1.3)")
    ap.add_argument("--speculate", type=int, default=0, metavar="K",
                    help="speculative rounds of K queries through staging arenas (ABI 1.5)")
    ap.add_argument("--mode", choices=["adaptive", "hisparse", "resident"], default="adaptive",
                    help="the library's serving mode (resident: ABI 1.7, every row in the pool, no reclaim)")
    ap.add_argument("--trace", default=os.path.join(here, "..", "..", "tools", "replay", "data",
                                                    "mooncake_conversation_head200.jsonl"))
    a = ap.parse_args()
    model = Model()
    reqs = requests_of_trace(a.trace, a.requests)
    t0 = time.monotonic()
    want = serve_resident(model, reqs)
    resident_s = time.monotonic() - t0
    mode = {"adaptive": dhs.MODE_ADAPTIVE, "hisparse": dhs.MODE_HISPARSE, "resident": dhs.MODE_RESIDENT}[a.mode]
    got, reclaims, stats, tps = serve_libdhs(model, reqs, a.run_dir, a.budget_pages, a.grouped, a.speculate, mode)
    n_tokens = sum(len(o) for o in want)
    print(f"requests {len(reqs)}, prompts {[len(p) for p, _ in reqs]}, output tokens {n_tokens}")
    print(f"libdhs loop: {tps:.1f} tokens/s; resident numpy loop: {n_tokens / resident_s:.1f} tokens/s")
    print(f"reclaim events {reclaims}; census {stats['census']}; pages {stats['pages']}")
    if a.speculate:
        print(f"speculation: {stats['rounds']}; staging {stats['staging']}")
    lat = stats["latency_us"]  # ABI 1.6: the library's recorder over the tokens committed
    mean = {h: lat[h]["sum"] / max(1, lat[h]["count"]) for h in ("admission_wait", "ttft", "tpot")}
    print(f"latency (library's figures, mean): admission wait {mean['admission_wait']:.0f} us, TTFT "
          f"{mean['ttft']:.0f} us, TPOT {mean['tpot']:.0f} us")
    exact = got == want
    print("outputs equal to the resident loop:", "yes" if exact else "NO")
    if not exact:
        for i, (g, e) in enumerate(zip(got, want)):
            if g != e:
                print(f"  request {i}: libdhs {g} resident {e}")
        return 1
    if a.speculate and (stats["staging"]["rows"] == 0 or stats["rounds"]["accepted"] == 0 or
                        stats["rounds"]["accepted"] == stats["rounds"]["drafted"]):
        print("speculation: no row was staged, or no draft was accepted / rejected")
        return 1
    if lat["ttft"]["count"] != len(reqs) or lat["tpot"]["count"] != n_tokens - len(reqs):
        print(f"the library's TTFT / TPOT counts {lat['ttft']['count']} / {lat['tpot']['count']} are not one first "
              f"token per request and one TPOT per later token ({len(reqs)} / {n_tokens - len(reqs)})")
        return 1
    if a.mode == "resident":
        # Every row stayed in the pool: nothing backed up, reclaimed or recovered from host; and the budget made a
        # request wait for another's whole context to leave (memd's resident admission).
        if stats["pages"]["backed_up"] or stats["pages"]["reclaimed"] or stats["census"]["host"] or reclaims:
            print(f"resident mode moved rows: pages {stats['pages']}, census {stats['census']}")
            return 1
        if stats["waits"] == 0:
            print("no request waited for its admission: the budget did not bound the resident contexts")
            return 1
    elif stats["pages"]["reclaimed"] == 0 or stats["census"]["host"] == 0:
        print("no reclaim or no host recovery happened: the budget did not force reclaims")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
