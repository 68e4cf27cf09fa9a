"""python/dhs: the Python binding of libdhs (issue 25) over its C ABI (include/dhs/dhs.h), with ctypes.

Why ctypes and not pybind11: ctypes needs no compile step (the binding is this file; it loads the libdhs.so the
build made, or the installed one) and it binds exactly the C ABI, the same boundary every other engine uses, so the
binding cannot reach past it into the C++ classes. pybind11 would add a compiled module per Python version and would
bind C++ types the ABI deliberately hides.

The library is found through $DHS_LIBRARY (a path to libdhs.so), else next to this package in a build tree
(build/libdhs/libdhs.so), else the dynamic loader's path (an installed libdhs.so.1).

    w = dhs.Worker(run_dir, sources=2, row_bytes=64, page_rows=16, top_k=8, hot_rows=32, tail_rows=32, slots=2,
                   hbm_budget_bytes=..., indexers=1, index_key_bytes=16)
    pool = w.pool_rows()                 # numpy view (uint8) of the KV pool on the CPU backend
    rid = w.submit(input_rows, max_rows)
    for ev in w.poll(): ...              # dhs.Event: kind, request, code, message, ...
    w.append(rid, first, rows, keys)     # rows: uint8/float32 array [positions, sources, d_KV bytes]
    loc = w.resolve(source, [(rid, selection)])  # byte offsets into the pool, -1 for padding
    w.readers_done(source); w.complete(rid); w.close()
Errors raise dhs.DhsError (its .code is a dhs_status, its message the worker's)."""
import ctypes
import json
import os

ABI_MAJOR, ABI_MINOR = 1, 8
ABI_VERSION = (ABI_MAJOR << 16) | ABI_MINOR
MODE_HISPARSE, MODE_ADAPTIVE, MODE_RESIDENT = 1, 2, 3  # MODE_RESIDENT: ABI 1.7
BACKEND_CPU, BACKEND_CUDA = 1, 2
POOLS_LIBRARY, POOLS_ENGINE = 1, 2
EVENT_GRANTED, EVENT_WAITING, EVENT_REJECTED, EVENT_RECLAIMED, EVENT_FAILED = 1, 2, 3, 4, 5
EVENT_NAMES = {1: "granted", 2: "waiting", 3: "rejected", 4: "reclaimed", 5: "failed"}
# dhs_status (DhsError.code)
(OK, ERR_INVALID_ARGUMENT, ERR_VERSION, ERR_BAD_HANDLE, ERR_CLOSED, ERR_NOT_FOUND, ERR_FAILED_PRECONDITION,
 ERR_OUT_OF_RANGE, ERR_RESOURCE_EXHAUSTED, ERR_UNAVAILABLE, ERR_UNIMPLEMENTED, ERR_DATA_LOSS, ERR_ABORTED,
 ERR_INTERNAL) = range(14)


class WorkerConfig(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("abi_version", ctypes.c_uint32), ("run_dir", ctypes.c_char_p),
                ("gpu", ctypes.c_uint32), ("mode", ctypes.c_uint32), ("backend", ctypes.c_uint32),
                ("sources", ctypes.c_uint32), ("row_bytes", ctypes.c_uint32), ("indexers", ctypes.c_uint32),
                ("index_key_bytes", ctypes.c_uint32), ("page_rows", ctypes.c_uint32), ("top_k", ctypes.c_uint32),
                ("hot_rows", ctypes.c_uint32), ("tail_rows", ctypes.c_uint32), ("slots", ctypes.c_uint32),
                ("hbm_budget_bytes", ctypes.c_uint64), ("connect_timeout_ms", ctypes.c_uint32),
                # ABI 1.1: an engine-owned KV pool (None: the library's)
                ("engine_pool", ctypes.c_void_p), ("engine_pool_bytes", ctypes.c_uint64),
                # ABI 1.2: the engine's model fingerprint (0: not said; memd keys the cluster tier by it)
                ("model_fingerprint", ctypes.c_uint64),
                # ABI 1.3: the group of each source (None: every source its own group)
                ("source_groups", ctypes.POINTER(ctypes.c_uint32)),
                # ABI 1.5: staging arenas χ and K_max, the most queries of one speculative round (0, 0: none)
                ("staging_arenas", ctypes.c_uint32), ("round_queries", ctypes.c_uint32),
                # ABI 1.8: consumers per source (None: 1 each), rows fetched per token (0: sources), a drafter's
                # KV ring per slot (rows, bytes per row; 0, 0: no drafter) and its window W
                ("source_consumers", ctypes.POINTER(ctypes.c_uint32)), ("fetched_rows_per_token", ctypes.c_uint32),
                ("draft_ring_rows", ctypes.c_uint32), ("draft_bytes_per_row", ctypes.c_uint64),
                ("drafter_window", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


class WorkerInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("gpu", ctypes.c_uint32), ("page_bytes", ctypes.c_uint64),
                ("host_page_bytes", ctypes.c_uint64), ("capacity_pages", ctypes.c_uint32),
                ("hot_rows", ctypes.c_uint32), ("tail_rows", ctypes.c_uint32), ("top_k", ctypes.c_uint32),
                ("worker_epoch", ctypes.c_uint64)]


class PoolDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("kind", ctypes.c_uint32), ("base", ctypes.c_void_p),
                ("bytes", ctypes.c_uint64), ("row_bytes", ctypes.c_uint64)]


class RequestDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("input_rows", ctypes.c_uint64),
                ("max_rows", ctypes.c_uint64), ("resume_of", ctypes.c_uint64),
                # ABI 1.1: tenant, session and the prefix chain (issue 24)
                ("tenant", ctypes.c_char_p), ("session", ctypes.c_uint64), ("tokens", ctypes.POINTER(ctypes.c_int32)),
                ("token_count", ctypes.c_uint64), ("block_ids", ctypes.POINTER(ctypes.c_uint64)),
                ("block_id_count", ctypes.c_uint32), ("block_tokens", ctypes.c_uint32)]


class Event(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_uint32), ("code", ctypes.c_int32), ("request", ctypes.c_uint64),
                ("slot", ctypes.c_uint32), ("value", ctypes.c_uint32), ("pages", ctypes.c_uint32),
                ("import_first", ctypes.c_uint32), ("import_pages", ctypes.c_uint32), ("shared_pages", ctypes.c_uint32),
                ("message_raw", ctypes.c_char * 192)]

    @property
    def message(self) -> str:
        return self.message_raw.decode(errors="replace")

    def __repr__(self):
        return f"Event({EVENT_NAMES.get(self.kind, self.kind)}, request={self.request}, pages={self.pages}, " \
               f"shared_pages={self.shared_pages}, " \
               f"code={self.code}, message={self.message!r})"


class Query(ctypes.Structure):
    _fields_ = [("request", ctypes.c_uint64), ("selection", ctypes.POINTER(ctypes.c_int64)),
                ("length", ctypes.c_uint32), ("reserved", ctypes.c_uint32),
                ("locations", ctypes.POINTER(ctypes.c_int64))]


class Resumable(ctypes.Structure):
    _fields_ = [("request", ctypes.c_uint64), ("input_rows", ctypes.c_uint64), ("max_rows", ctypes.c_uint64)]


class HostRun(ctypes.Structure):  # ABI 1.4
    _fields_ = [("first_page", ctypes.c_uint32), ("pages", ctypes.c_uint32)]


def _find_library() -> str:
    env = os.environ.get("DHS_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "..", "build", "libdhs", "libdhs.so"),):
        if os.path.exists(cand):
            return cand
    return "libdhs.so.1"


_lib = None


def library() -> ctypes.CDLL:
    """The loaded libdhs, with its functions' signatures declared (loaded once)."""
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(_find_library())
    P, u32, u64, i64, sz = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
    sigs = {
        "dhs_version": (u32, []),
        "dhs_status_name": (ctypes.c_char_p, [ctypes.c_int]),
        "dhs_worker_open": (ctypes.c_int, [ctypes.POINTER(WorkerConfig), ctypes.POINTER(P)]),
        "dhs_worker_close": (ctypes.c_int, [P]),
        "dhs_worker_errmsg": (ctypes.c_char_p, [P]),
        "dhs_worker_info_get": (ctypes.c_int, [P, ctypes.POINTER(WorkerInfo)]),
        "dhs_pools_register": (ctypes.c_int, [P, ctypes.POINTER(PoolDesc)]),
        "dhs_request_submit": (ctypes.c_int, [P, ctypes.POINTER(RequestDesc), ctypes.POINTER(u64)]),
        "dhs_worker_poll": (ctypes.c_int, [P, ctypes.POINTER(Event), sz, ctypes.POINTER(sz)]),
        "dhs_request_append": (ctypes.c_int, [P, u64, i64, u32, P, sz, P, sz]),
        "dhs_request_append_source": (ctypes.c_int, [P, u64, u32, i64, u32, P, sz]),
        "dhs_request_append_keys": (ctypes.c_int, [P, u64, u32, i64, u32, P, sz]),
        "dhs_resolve": (ctypes.c_int, [P, ctypes.POINTER(u32), u32, ctypes.POINTER(Query), u32]),
        "dhs_resolve_at": (ctypes.c_int, [P, ctypes.POINTER(u32), u32, ctypes.POINTER(Query), u32,
                                          ctypes.POINTER(ctypes.c_int64)]),
        "dhs_readers_done": (ctypes.c_int, [P, ctypes.POINTER(u32), u32]),
        "dhs_request_hold": (ctypes.c_int, [P, u64, i64]),
        "dhs_request_commit": (ctypes.c_int, [P, u64, i64]),
        "dhs_request_complete": (ctypes.c_int, [P, u64]),
        "dhs_worker_stats_json": (ctypes.c_int, [P, ctypes.c_char_p, sz, ctypes.POINTER(sz)]),
        "dhs_request_timeline_json": (ctypes.c_int, [P, ctypes.c_uint64, ctypes.c_char_p, sz, ctypes.POINTER(sz)]),
        "dhs_request_commit_tokens": (ctypes.c_int, [P, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int32),
                                                     ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint32]),
        "dhs_worker_resumable_tokens": (ctypes.c_int, [P, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int32), sz,
                                                       ctypes.POINTER(sz), ctypes.POINTER(sz), ctypes.POINTER(sz)]),
        "dhs_worker_list_resumable": (ctypes.c_int, [P, ctypes.POINTER(Resumable), sz, ctypes.POINTER(sz),
                                                      ctypes.POINTER(sz)]),
        "dhs_request_import": (ctypes.c_int, [P, u64, u32, u32, P, sz]),
        "dhs_request_import_plan": (ctypes.c_int, [P, u64, u64, ctypes.POINTER(HostRun), sz, ctypes.POINTER(sz),
                                                    ctypes.POINTER(sz)]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    if lib.dhs_version() >> 16 != ABI_MAJOR:
        raise ImportError(f"libdhs speaks ABI {lib.dhs_version() >> 16}, this binding {ABI_MAJOR}")
    _lib = lib
    return lib


class DhsError(Exception):
    """A libdhs call failed: .code is its dhs_status, .name its name, the message the worker's."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.name = library().dhs_status_name(code).decode()
        super().__init__(f"{self.name}: {message}")


class Worker:
    """One GPU's worker (dhs_worker). Not thread-safe beyond the library's own rule (calls serialised per worker).
    model_fingerprint (ABI 1.2): the engine's model, any 64-bit value equal for the same weights and different for
    others (0: not said); memd keys its cluster tier by it and refuses a worker of another model on a GPU that served
    one (DhsError FAILED_PRECONDITION). source_groups (ABI 1.3): None (every source its own group) or the group of
    each source, numbered in order of first use (an index producer's followers share its group: brief §5); resolve
    and readers_done then name a group's sources. staging_arenas, round_queries (ABI 1.5): χ staging arenas and K_max
    (the most queries of one speculative round): a held round's union of rows may then exceed the hot cache; the
    arenas follow the KV pool in the same region (pool() covers both); round_queries alone (ABI 1.8) declares K_max.
    draft_ring_rows, draft_bytes_per_row, drafter_window (ABI 1.8): a drafter's KV ring the engine keeps per slot
    (memd counts each request's share in its required pages); source_consumers, fetched_rows_per_token (ABI 1.8): the
    layers reading each source and the rows a token fetches (shown by dhsctl plan)."""

    def __init__(self, run_dir: str, *, sources: int, row_bytes: int, page_rows: int, top_k: int, hot_rows: int,
                 tail_rows: int, slots: int, hbm_budget_bytes: int, indexers: int = 0, index_key_bytes: int = 0,
                 gpu: int = 0, mode: int = MODE_ADAPTIVE, connect_timeout_ms: int = 10000,
                 model_fingerprint: int = 0, source_groups=None, staging_arenas: int = 0, round_queries: int = 0,
                 source_consumers=None, fetched_rows_per_token: int = 0, draft_ring_rows: int = 0,
                 draft_bytes_per_row: int = 0, drafter_window: int = 0):
        self._lib = library()
        self._h = ctypes.c_void_p()
        self._run_dir = run_dir.encode()
        c = WorkerConfig(ctypes.sizeof(WorkerConfig), ABI_VERSION, self._run_dir, gpu, mode, BACKEND_CPU, sources,
                         row_bytes, indexers, index_key_bytes, page_rows, top_k, hot_rows, tail_rows, slots,
                         hbm_budget_bytes, connect_timeout_ms, None, 0, model_fingerprint)
        c.staging_arenas, c.round_queries = staging_arenas, round_queries
        c.fetched_rows_per_token, c.drafter_window = fetched_rows_per_token, drafter_window
        c.draft_ring_rows, c.draft_bytes_per_row = draft_ring_rows, draft_bytes_per_row
        for name, per_source in (("source_groups", source_groups), ("source_consumers", source_consumers)):
            if per_source is not None and len(per_source) != sources:  # the library reads `sources` entries
                raise ValueError(f"{name} has {len(per_source)} entries for {sources} sources")
        consumers = None
        if source_consumers is not None:  # read during open only
            consumers = (ctypes.c_uint32 * len(source_consumers))(*source_consumers)
            c.source_consumers = consumers
        groups = None
        if source_groups is not None:  # read during open only
            groups = (ctypes.c_uint32 * len(source_groups))(*source_groups)
            c.source_groups = groups
        rc = self._lib.dhs_worker_open(ctypes.byref(c), ctypes.byref(self._h))
        if rc != 0:
            msg = self._lib.dhs_worker_errmsg(self._h).decode()
            self._lib.dhs_worker_close(self._h)
            self._h = None
            raise DhsError(rc, msg)
        self.sources, self.row_bytes, self.top_k = sources, row_bytes, top_k
        self.indexers, self.index_key_bytes = indexers, index_key_bytes
        self._events = (Event * 32)()

    def _check(self, rc: int):
        if rc != 0:
            raise DhsError(rc, self._lib.dhs_worker_errmsg(self._h).decode())

    def close(self):
        if self._h is not None:
            self._check(self._lib.dhs_worker_close(self._h))
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self) -> WorkerInfo:
        i = WorkerInfo()
        i.struct_size = ctypes.sizeof(WorkerInfo)
        self._check(self._lib.dhs_worker_info_get(self._h, ctypes.byref(i)))
        return i

    def pool_bytes(self):
        """The KV pool as a numpy uint8 array (a view: no copy; valid until close). CPU backend only."""
        import numpy as np
        d = PoolDesc()
        d.struct_size, d.kind = ctypes.sizeof(PoolDesc), POOLS_LIBRARY
        self._check(self._lib.dhs_pools_register(self._h, ctypes.byref(d)))
        buf = (ctypes.c_uint8 * d.bytes).from_address(d.base)
        return np.frombuffer(buf, dtype=np.uint8)

    def submit(self, input_rows: int, max_rows: int, resume_of: int = 0, *, tenant: str = "", session: int = 0,
               tokens=None, block_tokens: int = 0, block_ids=None) -> int:
        """Submits a request. tokens (the prompt's tokens, int32), block_tokens and block_ids (e.g. Mooncake hash_ids)
        name its prefix chain under `tenant` (ABI 1.1): with memd --prefix-sharing on, the GRANTED event's
        shared_pages are pages to import_rows instead of appending."""
        import numpy as np
        d = RequestDesc(ctypes.sizeof(RequestDesc), 0, input_rows, max_rows, resume_of)
        d.tenant = tenant.encode() if tenant else None
        d.session = session
        keep = []
        if tokens is not None:
            t = np.ascontiguousarray(tokens, dtype=np.int32)
            keep.append(t)
            d.tokens = t.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
            d.token_count = len(t)
        d.block_tokens = block_tokens
        if block_ids is not None:
            b = np.ascontiguousarray(block_ids, dtype=np.uint64)
            keep.append(b)
            d.block_ids = b.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64))
            d.block_id_count = len(b)
        rid = ctypes.c_uint64()
        self._check(self._lib.dhs_request_submit(self._h, ctypes.byref(d), ctypes.byref(rid)))
        return rid.value

    def poll(self) -> list:
        """Serves memd and returns the pending events (dhs.Event copies)."""
        out, n = [], ctypes.c_size_t()
        while True:
            self._check(self._lib.dhs_worker_poll(self._h, self._events, len(self._events), ctypes.byref(n)))
            out.extend(Event.from_buffer_copy(self._events[i]) for i in range(n.value))
            if n.value < len(self._events):
                return out

    def append(self, request: int, first: int, rows, keys=None):
        """rows: a C-contiguous array of count * sources * row_bytes bytes ([position][source][row]); keys: None or
        [indexer][position][index_key_bytes] bytes."""
        import numpy as np
        rows = np.ascontiguousarray(rows)
        count = rows.nbytes // (self.sources * self.row_bytes)
        kp, kn = None, 0
        if keys is not None:
            keys = np.ascontiguousarray(keys)
            kp, kn = keys.ctypes.data, keys.nbytes
        self._check(self._lib.dhs_request_append(self._h, request, first, count, rows.ctypes.data, rows.nbytes, kp,
                                                 kn))

    def append_source(self, request: int, source: int, first: int, rows):
        """Layer-wise (ABI 1.3): rows of one source, count * row_bytes bytes ([position][row]), from `first` (that
        source's appended rows)."""
        import numpy as np
        rows = np.ascontiguousarray(rows)
        self._check(self._lib.dhs_request_append_source(self._h, request, source, first,
                                                        rows.nbytes // self.row_bytes, rows.ctypes.data, rows.nbytes))

    def append_keys(self, request: int, indexer: int, first: int, keys):
        """Layer-wise (ABI 1.3): indexer `indexer`'s keys of positions first .. first+count-1, count *
        index_key_bytes bytes, before the poll that confirms their page's host copy (give a step's keys before its
        poll)."""
        import numpy as np
        if self.index_key_bytes == 0:
            raise DhsError(1, "append_keys: this worker was opened without indexers")
        keys = np.ascontiguousarray(keys)
        self._check(self._lib.dhs_request_append_keys(self._h, request, indexer, first,
                                                      keys.nbytes // self.index_key_bytes, keys.ctypes.data,
                                                      keys.nbytes))

    @staticmethod
    def _sources(source):
        sources = [source] if isinstance(source, int) else list(source)
        return sources, (ctypes.c_uint32 * len(sources))(*sources)

    def resolve(self, source, queries, at=None):
        """source: a source, or every source of one group (ABI 1.3); queries: [(request, selection int64 array of
        <= k positions, -1 padding)]; at (ABI 1.5, dhs_resolve_at): None, or per query the position of the token whose
        query made it (-1 unknown). Returns per query the byte offsets into the pool (-1 for padding): an int64
        array of len(selection) for one source, else [len(sources), len(selection)] in the order named; readable until
        readers_done of the source (group)."""
        import numpy as np
        sources, src = self._sources(source)
        n = len(queries)
        qs = (Query * n)()
        keep = []
        for i, (rid, sel) in enumerate(queries):
            sel = np.ascontiguousarray(sel, dtype=np.int64)
            loc = np.empty((len(sources), len(sel)), dtype=np.int64)
            keep.append((sel, loc))
            qs[i] = Query(rid, sel.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)), len(sel), 0,
                          loc.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)))
        if at is None:
            self._check(self._lib.dhs_resolve(self._h, src, len(sources), qs, n))
        else:
            if len(at) != n:
                raise ValueError(f"resolve: {len(at)} positions in at for {n} queries")
            ats = (ctypes.c_int64 * n)(*at)
            self._check(self._lib.dhs_resolve_at(self._h, src, len(sources), qs, n, ats))
        return [loc[0] if isinstance(source, int) else loc for _, loc in keep]

    def readers_done(self, source):
        """source: a source, or several (readers end per group)."""
        sources, src = self._sources(source)
        self._check(self._lib.dhs_readers_done(self._h, src, len(sources)))

    def hold(self, request: int, start: int):
        self._check(self._lib.dhs_request_hold(self._h, request, start))

    def commit(self, request: int, length: int):
        self._check(self._lib.dhs_request_commit(self._h, request, length))

    def complete(self, request: int):
        self._check(self._lib.dhs_request_complete(self._h, request))

    def list_resumable(self) -> list:
        """[(request, input_rows, max_rows)] memd kept for this GPU after a restart."""
        n, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self._lib.dhs_worker_list_resumable(self._h, None, 0, ctypes.byref(n), ctypes.byref(total)))
        out = (Resumable * max(1, total.value))()
        self._check(self._lib.dhs_worker_list_resumable(self._h, out, total.value, ctypes.byref(n),
                                                        ctypes.byref(total)))
        return [(out[i].request, out[i].input_rows, out[i].max_rows) for i in range(n.value)]

    def commit_tokens(self, request: int, tokens, digests=None):
        """ABI 1.5 (dhs_request_commit_tokens): appends `tokens` (ints >= 0) to the granted request's generated tokens
        in memd's token record (digests: None, or one uint64 per token), so that they come back after a restart
        (resumable_tokens)."""
        tokens = list(tokens)
        arr = (ctypes.c_int32 * max(1, len(tokens)))(*tokens)
        dig = None
        if digests is not None:
            digests = list(digests)
            dig = (ctypes.c_uint64 * max(1, len(digests)))(*digests)
            if len(digests) != len(tokens):
                raise ValueError(f"commit_tokens: {len(digests)} digests for {len(tokens)} tokens")
        self._check(self._lib.dhs_request_commit_tokens(self._h, request, arr, dig, len(tokens)))

    def resumable_tokens(self, request: int):
        """ABI 1.5 (dhs_worker_resumable_tokens): (prompt tokens, generated tokens) of a resumable request's record."""
        n, total, prompt = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self._lib.dhs_worker_resumable_tokens(self._h, request, None, 0, ctypes.byref(n),
                                                          ctypes.byref(total), ctypes.byref(prompt)))
        out = (ctypes.c_int32 * max(1, total.value))()
        self._check(self._lib.dhs_worker_resumable_tokens(self._h, request, out, total.value, ctypes.byref(n),
                                                          ctypes.byref(total), ctypes.byref(prompt)))
        got = list(out[: n.value])
        return got[: prompt.value], got[prompt.value:]

    def import_plan(self, request: int, tokens: int) -> list:
        """ABI 1.4: [(first_page, pages)] runs of a granted request's host-backed pages wholly before row tokens - 1,
        in position order (dhs_request_import_plan): append the rows before each run, import_rows the run, then append
        the rows after the last run."""
        n, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self._lib.dhs_request_import_plan(self._h, request, tokens, None, 0, ctypes.byref(n),
                                                      ctypes.byref(total)))
        out = (HostRun * max(1, total.value))()
        self._check(self._lib.dhs_request_import_plan(self._h, request, tokens, out, total.value, ctypes.byref(n),
                                                      ctypes.byref(total)))
        return [(out[i].first_page, out[i].pages) for i in range(n.value)]

    def import_rows(self, request: int, first_page: int, pages: int, page_rows: int):
        """A granted request with host-backed pages (a resume, shared prefix pages): takes host-backed pages first_page .. first_page+pages-1 as appended; returns their
        index keys, uint8 [indexers, pages * page_rows, index_key_bytes] (None without indexers)."""
        import numpy as np
        if self.indexers == 0:
            self._check(self._lib.dhs_request_import(self._h, request, first_page, pages, None, 0))
            return None
        keys = np.zeros((self.indexers, pages * page_rows, self.index_key_bytes), dtype=np.uint8)
        self._check(self._lib.dhs_request_import(self._h, request, first_page, pages, keys.ctypes.data, keys.nbytes))
        return keys

    def _json(self, call, *args) -> dict:
        need = ctypes.c_size_t()
        buf = ctypes.create_string_buffer(4096)
        rc = call(self._h, *args, buf, len(buf), ctypes.byref(need))
        if rc != 0 and need.value > len(buf):
            buf = ctypes.create_string_buffer(need.value)
            rc = call(self._h, *args, buf, len(buf), ctypes.byref(need))
        self._check(rc)
        return json.loads(buf.value.decode())

    def stats(self) -> dict:
        """dhs_worker_stats_json: census, pages, tokens, (ABI 1.6) latency_us histograms and failures by reason."""
        return self._json(self._lib.dhs_worker_stats_json)

    def timeline(self, request: int) -> dict:
        """ABI 1.6 (dhs_request_timeline_json): {"timelines": [{..., "events": [{"at_us", "event", "pages", "detail",
        "source"}]}]} of `request` (empty when none is kept)."""
        return self._json(self._lib.dhs_request_timeline_json, request)
