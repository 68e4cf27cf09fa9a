/* include/dhs/dhs.h: libdhs, the worker side of the KV hierarchy as a C ABI (issue 25; brief §12 "libdhs").
 *
 * A serving engine with its own model and its own process per GPU opens one worker (dhs_worker) for its GPU. The
 * library connects to the node's memd (ipc://RUN_DIR/memd.sock), allocates the KV pool through the device backend,
 * maps memd's host pool, and from then on carries out memd's orders itself: reclaim (backups, withdrawal, readers,
 * retire), population and host backups stay inside the library; the engine never sees a memd order. The engine:
 *   submits requests (non-blocking) and polls for their events (granted, waiting, rejected, reclaimed, failed);
 *   appends each step's rows (payload rows of every source, optionally the index keys);
 *   resolves a batch's ordered top-k selections to locations in the KV pool (the fused resolver, brief §5) and marks
 *   their readers done after its attention read them;
 *   holds unverified rows of a speculative round and commits the accepted prefix (brief §6);
 *   completes requests; after a restart it lists what memd kept (dhs_worker_list_resumable);
 *   reads statistics as JSON.
 * docs/embedding.md: the request lifecycle, threading, pointer ownership, error codes, and how vLLM's KV connector,
 * SGLang's HiCache storage and LMCache map onto these calls.
 *
 * Conventions (SQLite's and LevelDB's C APIs):
 *   - every function returns a dhs_status (DHS_OK = 0) except dhs_version, dhs_status_name and dhs_worker_errmsg;
 *   - the message of the latest failed call on a worker is dhs_worker_errmsg(w): owned by the library, valid until the
 *     next call on that worker (or its close);
 *   - structs passed in carry their size in their first field (`struct_size = sizeof(the struct)`); a struct of
 *     another size is refused (DHS_ERR_VERSION); structs grow only at their end;
 *   - handles are opaque; a handle used after dhs_worker_close answers DHS_ERR_CLOSED (a closed handle keeps a few
 *     bytes until the process exits so that this is never undefined behaviour); a pointer that is no handle of this
 *     library answers DHS_ERR_BAD_HANDLE;
 *   - nothing aborts the process and no C++ exception crosses this boundary.
 * Units: positions and rows are token positions (a source stores one row per position); pages hold p positions of
 * every source; bytes are bytes.
 * Threading: calls on one worker are serialised by the library (a mutex per worker); different workers may be used
 * from different threads at once. dhs_worker_errmsg reads the message without that mutex: call it from the thread
 * that made the failed call, while no other call on that worker is in flight (one engine thread per worker is the
 * simple rule). dhs_worker_poll must be called at least once a second (see dhs_worker_poll).
 */
#ifndef DHS_DHS_H_
#define DHS_DHS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version: MAJOR changes break callers (a worker opened with another major is refused); MINOR adds calls or
 * struct fields at their end. Compile time: these macros; run time: dhs_version(). */
#define DHS_ABI_MAJOR 1
#define DHS_ABI_MINOR 8
#define DHS_ABI_VERSION ((DHS_ABI_MAJOR << 16) | DHS_ABI_MINOR)

#if defined(__GNUC__)
#define DHS_EXPORT __attribute__((visibility("default")))
#else
#define DHS_EXPORT
#endif

/* Status codes. Numbers never change; new codes are appended. */
typedef enum dhs_status {
  DHS_OK = 0,
  DHS_ERR_INVALID_ARGUMENT = 1, /* a null pointer, a size, a value out of range, a selection longer than k, ... */
  DHS_ERR_VERSION = 2,          /* a struct of another size, or an ABI major this library does not speak */
  DHS_ERR_BAD_HANDLE = 3,       /* the pointer is not a worker of this library */
  DHS_ERR_CLOSED = 4,           /* the worker was closed */
  DHS_ERR_NOT_FOUND = 5,        /* a request id never submitted on this worker, or already completed */
  DHS_ERR_FAILED_PRECONDITION = 6, /* the call does not fit the request's state (e.g. append before its grant) */
  DHS_ERR_OUT_OF_RANGE = 7,     /* a position beyond the request's history (appended rows, or its declared rows) */
  DHS_ERR_RESOURCE_EXHAUSTED = 8, /* a table or pool is full (events buffer, submit queue, hot cache) */
  DHS_ERR_UNAVAILABLE = 9,      /* memd cannot be reached (at open, or a send failed) */
  DHS_ERR_UNIMPLEMENTED = 10,   /* not in this build or this version (see the message) */
  DHS_ERR_DATA_LOSS = 11,       /* a host page changed after its confirmation (issue 22) */
  DHS_ERR_ABORTED = 12,         /* the worker's epoch ended (memd fenced it): close and open again */
  DHS_ERR_INTERNAL = 13         /* a bug: the message says where */
} dhs_status;

/* Returns DHS_ABI_VERSION of the library (run-time check against the header's macro). */
DHS_EXPORT uint32_t dhs_version(void);
/* The name of a status ("DHS_ERR_NOT_FOUND"); "DHS_ERR_UNKNOWN" for a number that is no status. Static storage. */
DHS_EXPORT const char* dhs_status_name(int status);

typedef struct dhs_worker dhs_worker;

/* Serving modes (brief §4; workerd --mode). */
typedef enum dhs_mode {
  DHS_MODE_HISPARSE = 1, /* history on host; selected misses recovered from host */
  DHS_MODE_ADAPTIVE = 2, /* resident-first: complete pages of the prompt kept on GPU while memory is spare */
  /* ABI 1.7: every row stays in the pool (workerd's exactness oracle, through the same calls): memd admits each
   * request with its whole context (common/worker_shape.h SessionRequiredPages, resident term) against the pool of
   * hbm_budget_bytes, so a request that does not fit waits (DHS_EVENT_WAITING) until another completes. No host tier:
   * nothing is backed up, reclaimed or imported (a resume recomputes every row; a prefix chain is kept in the record
   * but not named to memd), index keys are checked and not kept; staging_arenas must be 0 (rows are read in place).
   * The pool (dhs_pool_bytes_needed) is hbm_budget_bytes rounded down to whole pages. */
  DHS_MODE_RESIDENT = 3
} dhs_mode;

typedef enum dhs_backend {
  DHS_BACKEND_CPU = 1, /* the CPU device (brief §9): pools are host memory the engine can read */
  DHS_BACKEND_CUDA = 2 /* the CUDA device of ordinal `gpu` (a libdhs built with CUDA; otherwise dhs_worker_open answers
                          DHS_ERR_UNIMPLEMENTED). The library's pool is CUDA managed memory (host-visible); an engine's
                          pool (engine_pool) is managed or plain device memory of that GPU (cudaMalloc: a framework's
                          CUDA tensor; not in resident mode). The engine's kernels read row `location` at
                          base + location. memd's host pool is pinned and mapped, and dhs_resolve runs the fused
                          resolver kernel on the device (host recoveries are device-side reads of pinned memory).
                          `rows` of the appends stay host memory; the engine synchronises its own streams before it
                          appends rows its kernels computed. */
} dhs_backend;

/* The worker's shape (brief §8) and where its memd is. Every source has the same row size (d_KV = row_bytes); each
 * source is its own group unless source_groups (ABI 1.3) puts an index producer's followers in one. */
typedef struct dhs_worker_config {
  uint32_t struct_size;       /* sizeof(dhs_worker_config) */
  uint32_t abi_version;       /* DHS_ABI_VERSION of the header the caller compiled against */
  const char* run_dir;        /* memd's run directory (holds memd.sock); copied at open */
  uint32_t gpu;               /* the GPU of this worker, < 65536; one worker per GPU per node */
  uint32_t mode;              /* dhs_mode */
  uint32_t backend;           /* dhs_backend */
  uint32_t sources;           /* S: KV sources (payload layers that store rows), >= 1 */
  uint32_t row_bytes;         /* d_KV: bytes of one row of one source, a positive multiple of 4 */
  uint32_t indexers;          /* L_idx: index producers whose keys go to host pages with the rows (0: none) */
  uint32_t index_key_bytes;   /* d_idx: bytes of one index key (a multiple of 4; 0 when indexers == 0) */
  uint32_t page_rows;         /* p: positions per page, >= 1 */
  uint32_t top_k;             /* k: the longest selection a query may resolve */
  uint32_t hot_rows;          /* B: hot-cache rows per slot and source, >= k */
  uint32_t tail_rows;         /* T: tail rows per slot and source, a positive multiple of p */
  uint32_t slots;             /* N: request slots (requests granted at once) */
  uint64_t hbm_budget_bytes;  /* GPU bytes for optional history: M = budget / (p * S * d_KV) pages, >= 1 */
  uint32_t connect_timeout_ms; /* how long open waits for memd's HelloReply (0: 5000) */
  /* ABI 1.1 (a 1.0 caller's struct, DHS_WORKER_CONFIG_SIZE_1_0 bytes, is still accepted: the library's pool).
   * Engine-owned KV pool: NULL, or memory the engine allocated and owns (CUDA backend: device or managed memory of
   * the worker's GPU, managed in resident mode; else INVALID_ARGUMENT), at least
   * dhs_pool_bytes_needed() bytes, aligned to DHS_POOL_ALIGNMENT; the library keeps the KV pool there (zeroed at
   * open) instead of allocating it. It must stay valid until dhs_worker_close; the library never frees it. */
  void* engine_pool;
  uint64_t engine_pool_bytes;
  /* ABI 1.2 (a 1.1 caller's struct, DHS_WORKER_CONFIG_SIZE_1_1 bytes, is still accepted: 0).
   * The engine's model fingerprint: any 64-bit value that differs between models (weights or config) and is equal
   * for the same model in every process, e.g. a hash of the weights; 0 = not said. memd keys the cluster tier by it
   * (docs/cluster_tier.md "Geometry": two models of one KV geometry never read each other's pages from the store), and
   * refuses an open whose fingerprint differs from its GPU's earlier worker's, or, with prefix sharing, from another
   * GPU's (FAILED_PRECONDITION). */
  uint64_t model_fingerprint;
  /* ABI 1.3 (a 1.2 caller's struct, DHS_WORKER_CONFIG_SIZE_1_2 bytes, is still accepted: NULL).
   * Index producers with followers (brief §5; workerd's KV groups): NULL, every source is its own group; else
   * `sources` entries (read during open), source_groups[s] = the group of source s, numbered in order of first use
   * (source 0 is in group 0; each source's group is at most one above the largest before it). The sources of one
   * group share each query's selection and the request's hot-cache slots: dhs_resolve names every source of one
   * group (in any order) and plans the batch once for all of them. */
  const uint32_t* source_groups;
  /* ABI 1.5 (a 1.3 / 1.4 caller's struct, DHS_WORKER_CONFIG_SIZE_1_3 bytes, is still accepted: 0, no arenas).
   * Staging arenas of speculative verification (brief §6 "Staging"): while a request holds a speculative round
   * (dhs_request_hold), the queries of its round resolved in one dhs_resolve are served as ONE union: each distinct
   * missing row is copied once, into the hot cache while it has room, the rest into a staging arena, so a round's
   * union may exceed the hot cache. staging_arenas = χ (0: none; else >= the largest group's sources, <= 64; ABI
   * 1.8: <= 1024); round_queries = K_max, the most queries of one round (1 .. T - p + 1; before ABI 1.8, 0 without
   * arenas; since, also declared without them: below). The arenas take
   * M_stage = χ * N * K_max * k * d_KV bytes after the KV pool in the same region (dhs_pool_bytes_needed counts
   * them; a location may point into them), and each admitted request declares its slot's share M_stage / N to memd
   * inside its required pages. */
  uint32_t staging_arenas;
  uint32_t round_queries;
  /* ABI 1.8 (a 1.5 .. 1.7 caller's struct, DHS_WORKER_CONFIG_SIZE_1_5 bytes, is still accepted: NULL and 0).
   * What workerd's own Hello declares beyond the above (workerd builds its Hello from this shape), for an engine with
   * a drafter or with layers that share sources. round_queries may now also be set without staging arenas: the most
   * queries of one speculative round (at most T - p + 1), declared to memd (dhsctl plan). */
  const uint32_t* source_consumers; /* NULL (1 each) or `sources` entries in [1, 65536]: the layers reading source s */
  uint32_t fetched_rows_per_token;  /* rows a generated token fetches (each selecting layer: its group's sources;
                                       0 = sources) */
  /* A drafter's KV ring the engine keeps in GPU memory per slot (brief §8 "with a drafter"): draft_ring_rows R_d
   * rows of draft_bytes_per_row bytes (both 0: no drafter; R_d <= 2^24, a row <= 1 GiB). memd counts each admitted
   * request's slot share R_d * draft_bytes_per_row inside its required pages, and the worker's N shares
   * (Hello.draft_ring_bytes). drafter_window: W, the prior positions the drafter reads (0 without a ring). */
  uint32_t draft_ring_rows;
  uint64_t draft_bytes_per_row;
  uint32_t drafter_window;
  uint32_t reserved;  /* 0 (an explicit tail: a later field changes sizeof, so struct_size tells the versions apart) */
} dhs_worker_config;
#define DHS_WORKER_CONFIG_SIZE_1_0 80u  /* sizeof(dhs_worker_config) of ABI 1.0 (up to connect_timeout_ms) */
#define DHS_WORKER_CONFIG_SIZE_1_1 96u  /* sizeof(dhs_worker_config) of ABI 1.1 (up to engine_pool_bytes) */
#define DHS_WORKER_CONFIG_SIZE_1_2 104u /* sizeof(dhs_worker_config) of ABI 1.2 (up to model_fingerprint) */
#define DHS_WORKER_CONFIG_SIZE_1_3 112u /* sizeof(dhs_worker_config) of ABI 1.3 and 1.4 (up to source_groups) */
#define DHS_WORKER_CONFIG_SIZE_1_5 120u /* sizeof(dhs_worker_config) of ABI 1.5 .. 1.7 (up to round_queries) */
#define DHS_WORKER_CONFIG_SIZE_1_8 152u /* sizeof(dhs_worker_config) of ABI 1.8 (up to reserved) */
#define DHS_POOL_ALIGNMENT 64u          /* engine_pool's alignment, bytes */

/* The bytes of the KV pool a worker of `config` needs (its slot regions and optional pages, then, ABI 1.5, its
 * staging arenas at the next DHS_POOL_ALIGNMENT boundary), for an engine-owned pool. Only the shape is read (no memd contact). Errors: INVALID_ARGUMENT (null, a field out of range), VERSION. */
DHS_EXPORT int dhs_pool_bytes_needed(const dhs_worker_config* config, uint64_t* bytes);

/* Opens the worker of one GPU: checks the config and the ABI, connects to memd (Hello), maps its host pool and
 * allocates the KV pool on the backend. memd must run with --page-bytes equal to the host page size
 * p * (S * d_KV + L_idx * d_idx) (dhs_worker_info's host_page_bytes; the worker's Hello declares it).
 * On success *out is the worker. On failure *out is still set when out != NULL (like sqlite3_open): a worker handle
 * that only dhs_worker_errmsg and dhs_worker_close accept (the reason is its message); close it.
 * Errors: INVALID_ARGUMENT (a null pointer, a field out of range: the message names it), VERSION (struct_size or the
 * ABI major), UNIMPLEMENTED (the CUDA backend in a libdhs built without CUDA), UNAVAILABLE (memd did not answer; the
 * CUDA backend: most CUDA failures, e.g. memd's host pool could not be pinned; an allocation that failed is
 * RESOURCE_EXHAUSTED, an invalid value INVALID_ARGUMENT), FAILED_PRECONDITION (memd refused the
 * Hello, e.g. another page size; the CUDA backend: no GPU of that ordinal), RESOURCE_EXHAUSTED (the KV pool). The
 * CUDA backend's checks (the GPU, engine_pool's kind: INVALID_ARGUMENT) come before memd hears a Hello. On the CUDA
 * backend every call on the worker may make its GPU the calling thread's current CUDA device (cudaSetDevice): an
 * engine that drives several GPUs from one thread sets its own device again after them. */
DHS_EXPORT int dhs_worker_open(const dhs_worker_config* config, dhs_worker** out);
/* Ends every request still open (their host copies in flight finish first; memd is told Complete) and frees the
 * worker. Pointers into its pools are invalid after it. A closed handle answers DHS_ERR_CLOSED to every call
 * (dhs_worker_close included); NULL answers DHS_ERR_INVALID_ARGUMENT. */
DHS_EXPORT int dhs_worker_close(dhs_worker* w);
/* The message of the latest failed call on `w` ("" after a success; a fixed text for NULL, a bad or closed handle).
 * Owned by the library: valid until the next call on `w`. Never NULL. */
DHS_EXPORT const char* dhs_worker_errmsg(const dhs_worker* w);

/* Sizes derived from the shape (brief §8). */
typedef struct dhs_worker_info {
  uint32_t struct_size;        /* sizeof(dhs_worker_info), set by the caller */
  uint32_t gpu;
  uint64_t page_bytes;         /* p * S * d_KV: one GPU page */
  uint64_t host_page_bytes;    /* page_bytes + p * L_idx * d_idx: one host page (memd --page-bytes) */
  uint32_t capacity_pages;     /* M */
  uint32_t hot_rows;           /* B */
  uint32_t tail_rows;          /* T */
  uint32_t top_k;              /* k */
  uint64_t worker_epoch;       /* memd's epoch of this GPU (HelloReply.worker_epoch) */
} dhs_worker_info;
DHS_EXPORT int dhs_worker_info_get(dhs_worker* w, dhs_worker_info* info);

/* KV pools. DHS_POOLS_LIBRARY: the library allocated the KV pool through the device backend at open.
 * DHS_POOLS_ENGINE (ABI 1.1): the engine's pool given at open (dhs_worker_config.engine_pool); register names it
 * again (base, bytes in) and gets row_bytes; a location from dhs_resolve is then an offset into the engine's memory. */
typedef enum dhs_pool_kind { DHS_POOLS_LIBRARY = 1, DHS_POOLS_ENGINE = 2 } dhs_pool_kind;
typedef struct dhs_pool_desc {
  uint32_t struct_size;  /* sizeof(dhs_pool_desc), set by the caller */
  uint32_t kind;         /* in: dhs_pool_kind */
  void* base;            /* out (LIBRARY): the pool's first byte; on the CPU backend host memory the engine may read.
                            Owned by the library, valid until dhs_worker_close. in (ENGINE): the engine_pool of open */
  uint64_t bytes;        /* out: the pool's size (dhs_pool_bytes_needed: the KV pool, then the staging arenas) */
  uint64_t row_bytes;    /* out: d_KV; a location from dhs_resolve is a byte offset into this pool */
} dhs_pool_desc;
/* Registers (LIBRARY: describes) the KV pools. Errors: INVALID_ARGUMENT (ENGINE: base or bytes are not the pool
 * given at open), VERSION, FAILED_PRECONDITION (ENGINE on a worker opened without engine_pool, LIBRARY on one opened
 * with it). */
DHS_EXPORT int dhs_pools_register(dhs_worker* w, dhs_pool_desc* pools);

/* A request as the engine submits it. */
typedef struct dhs_request_desc {
  uint32_t struct_size;   /* sizeof(dhs_request_desc) */
  uint32_t reserved;      /* 0 */
  uint64_t input_rows;    /* the prompt's positions (rows its prefill appends), >= 1 */
  uint64_t max_rows;      /* every position the request may ever append: input + output, >= input_rows */
  uint64_t resume_of;     /* 0, or an id from dhs_worker_list_resumable: resume that request from its host copies */
  /* ABI 1.1 (prefix sharing, issue 24; a 1.0 caller's struct, DHS_REQUEST_DESC_SIZE_1_0 bytes, is still accepted: no
   * chain, the default tenant, no session). The prefix chain is named as workerd names it (workerd/prefix_chain.h):
   * block b holds prompt tokens [b * block_tokens, (b + 1) * block_tokens); only complete blocks are named; block ids
   * are block_ids[b] where given (Mooncake hash_ids: equal id = equal prefix) and derived from the tokens after them;
   * every block's digest is computed from `tokens`, so memd imports a stored page only when its content matches. */
  const char* tenant;          /* NULL or "": the default tenant; else an opaque salt (at most 255 bytes, copied):
                                  two tenants never share a prefix page */
  uint64_t session;            /* the engine's session (client) id, 0 = none: kept in memd's record of the request */
  const int32_t* tokens;       /* NULL (no chain), or token_count prompt tokens (read during the call); ABI 1.5:
                                  memd keeps them in the request's token record (a resume gets them back:
                                  dhs_worker_resumable_tokens) */
  uint64_t token_count;        /* <= input_rows; complete blocks: token_count / block_tokens */
  const uint64_t* block_ids;   /* NULL (ids derived from the tokens), or block_id_count ids of blocks 0, 1, ... */
  uint32_t block_id_count;
  uint32_t block_tokens;       /* tokens per block (0: no chain); memd shares floor(blocks * block_tokens / p) pages */
} dhs_request_desc;
#define DHS_REQUEST_DESC_SIZE_1_0 32u  /* sizeof(dhs_request_desc) of ABI 1.0 (up to resume_of) */
/* Submits a request (non-blocking): the admission goes to memd; its answer arrives as an event (dhs_worker_poll).
 * *request_id is the request's id on this node. With a prefix chain (ABI 1.1) and memd --prefix-sharing on, memd
 * grants the stored pages of the chain's blocks (same tenant, same ids, same content) as shared host pages: the
 * GRANTED event names them (shared_pages; pages, import_pages as for a resume) and dhs_request_import takes them as
 * appended without recomputing them; the pages the request computes are shared once their host copy is confirmed.
 * With resume_of: memd hands the new request the interrupted one's
 * confirmed host pages; at the grant each is checked against memd's checksum (a page that does not match is not
 * imported) and the GRANTED event names them (pages, import_pages); dhs_request_import takes them as appended, the
 * engine appends every other row itself. Errors: INVALID_ARGUMENT (sizes; max_rows beyond the pages memd can hold;
 * token_count beyond input_rows, tokens NULL with block_tokens > 0, block_ids NULL with a count, a tenant longer than
 * 255 bytes), VERSION (struct_size neither 1.0's nor this header's), UNAVAILABLE (a send to memd failed; while memd
 * is away the admission waits and is sent after the re-Hello), NOT_FOUND (resume_of not listed by
 * dhs_worker_list_resumable),
 * FAILED_PRECONDITION (resume_of resumed already). */
DHS_EXPORT int dhs_request_submit(dhs_worker* w, const dhs_request_desc* desc, uint64_t* request_id);

typedef enum dhs_event_kind {
  DHS_EVENT_GRANTED = 1,  /* admitted: rows may be appended and resolved from now on */
  DHS_EVENT_WAITING = 2,  /* queued by memd until capacity frees (value = queue position, pages = deficit) */
  DHS_EVENT_REJECTED = 3, /* refused by memd (code, message): the request is gone */
  DHS_EVENT_RECLAIMED = 4, /* memd ordered the reclaim of `pages` optional pages of the request; the library carries
                              it out (backups, withdrawal, readers) with nothing to do for the engine: its rows
                              there are recovered from host from then on (informational) */
  DHS_EVENT_FAILED = 5    /* the request failed (code, message) and is gone: no dhs_request_complete needed */
} dhs_event_kind;
typedef struct dhs_event {
  uint32_t kind;          /* dhs_event_kind */
  int32_t code;           /* REJECTED / FAILED: a dhs_status; else 0 */
  uint64_t request;       /* the request id */
  uint32_t slot;          /* GRANTED: memd's slot for it */
  uint32_t value;         /* WAITING: queue position */
  uint32_t pages;         /* WAITING: deficit pages; RECLAIMED: pages; GRANTED of a resume or with shared prefix
                             pages: host-backed pages that matched their checksums (importable; the others' rows must
                             be appended again) */
  uint32_t import_first;  /* GRANTED with host-backed pages: the first page of the leading host-backed run (0) */
  uint32_t import_pages;  /* GRANTED with host-backed pages: pages 0 .. import_pages-1 can be imported
                             (dhs_request_import); dhs_request_import_plan (ABI 1.4) names every run, also those
                             after a gap */
  uint32_t shared_pages;  /* GRANTED (ABI 1.1; 1.0 named it `reserved`, always 0): how many of `pages` are shared
                             prefix pages memd granted for the request's chain (another request's confirmed copies) */
  char message[192];      /* REJECTED / FAILED: why, NUL-terminated (cut at 191 bytes) */
} dhs_event;
/* Serves memd (its orders are carried out here), reports finished host copies, and copies up to `capacity` pending
 * events into events[0..*count). Call it every step, at least once a second: the worker ends its epoch when it heard
 * nothing from memd for 2 s (memd acks the heartbeats this call sends), and memd fences a worker silent for its
 * worker timeout. Events left over stay for the next call. Never blocks.
 * memd restarts (ABI 1.1) are served inside the library, as workerd serves them: when memd dies (its connection
 * closes) poll keeps answering OK while the library serves away (memd's orders resolved locally, no host writes:
 * appends succeed while the tail has room, else RESOURCE_EXHAUSTED until memd is back; resolves go on; submits wait;
 * a granted request's complete is deferred) and says Hello again to the next memd of the run directory with a report
 * of every granted request; once that memd takes it, the requests go on, the deferred ends and the waiting
 * admissions are sent. stats_json's "memd" object tells (away, aways, returns, ...). A request whose report memd
 * refused gets a FAILED event (ABORTED; dhs_worker_list_resumable may list it).
 * Errors: INVALID_ARGUMENT, ABORTED (the epoch ended: fenced, memd silent over a live connection, no memd took the
 * re-Hello within 30 s, or the new memd refused it or started a fresh host pool: close and open again). */
DHS_EXPORT int dhs_worker_poll(dhs_worker* w, dhs_event* events, size_t capacity, size_t* count);

/* Appends positions first .. first+count-1 of a granted request on every source. rows: count * S * d_KV bytes laid
 * out [position][source][d_KV]; keys: NULL (indexers == 0 or keys not kept) or L_idx * count * d_idx bytes laid out
 * [indexer][position][d_idx]. `first` must equal the rows appended so far on every source; first + count <= max_rows.
 * The bytes are copied before the call returns. Errors: INVALID_ARGUMENT (sizes, null), NOT_FOUND, FAILED_PRECONDITION
 * (not granted), OUT_OF_RANGE (a position beyond max_rows or not the next one of every source: after
 * dhs_request_append_source the sources may differ), RESOURCE_EXHAUSTED (the tail is full: a page has no host copy
 * yet; poll and retry). */
DHS_EXPORT int dhs_request_append(dhs_worker* w, uint64_t request, int64_t first, uint32_t count, const void* rows,
                                  size_t rows_bytes, const void* keys, size_t keys_bytes);

/* ABI 1.3: layer-wise appends, for an engine that writes each layer's KV as its forward pass reaches it (vLLM's
 * save_kv_layer, SGLang's per-layer set_kv_buffer). Appends positions first .. first+count-1 of ONE source: rows is
 * count * d_KV bytes [position][d_KV]; `first` must equal that source's appended rows. A position is resolvable on a
 * source once that source holds it; a page completes (its host backup or kept copy is scheduled) when every source
 * holds it, so a source may run ahead of the slowest one by at most the tail: a row whose tail slot still holds a
 * page that is not complete and backed up gets RESOURCE_EXHAUSTED (the rows before it are appended: the message says
 * how many; append the other sources, poll and retry). Errors: as dhs_request_append; INVALID_ARGUMENT (a source out
 * of range, rows_bytes not count * d_KV). */
DHS_EXPORT int dhs_request_append_source(dhs_worker* w, uint64_t request, uint32_t source, int64_t first,
                                         uint32_t count, const void* rows, size_t rows_bytes);
/* ABI 1.3: the index keys of indexer `indexer` for positions first .. first+count-1 (keys: count * d_idx bytes), for
 * a layer-wise engine (dhs_request_append_source) whose indexer runs at its own layer. The keys go into the
 * positions' host pages, which a resume or a shared prefix imports with the rows (dhs_request_import's keys_out). A
 * complete page's host copy is confirmed (checksummed with the keys it holds then) by a dhs_worker_poll once its
 * backup finished, so give a step's keys before the step's poll; keys of a page whose copy is confirmed are refused,
 * nothing written (those of a resume's or a shared prefix's imported page are already there and are ignored).
 * Every position must be appended on at least one source. Errors: INVALID_ARGUMENT (indexer out of range, sizes,
 * null, no indexers), NOT_FOUND, FAILED_PRECONDITION (not granted; a page whose host copy was confirmed),
 * OUT_OF_RANGE (a position not appended on any source). */
DHS_EXPORT int dhs_request_append_keys(dhs_worker* w, uint64_t request, uint32_t indexer, int64_t first,
                                       uint32_t count, const void* keys, size_t keys_bytes);

/* One query of a batch: a request's ordered selection (brief §5). */
typedef struct dhs_query {
  uint64_t request;
  const int64_t* selection;  /* `length` positions, -1 = padding; every other one < the request's appended rows */
  uint32_t length;           /* <= k */
  uint32_t reserved;         /* 0 */
  int64_t* locations;        /* out: `sources_count * length` byte offsets into the KV pool, [source][j]; -1 for
                                padding. Readable until dhs_readers_done for these sources */
} dhs_query;
/* Resolves a batch of selections over `sources` (each source read with the same selections) in one fused pass:
 * direct (tail, ready map), hot cache, host recovery. `sources` is every source of one group (dhs_worker_config's
 * source_groups; without groups, one source), in any order; locations are laid out in the order named.
 * Errors: INVALID_ARGUMENT (null, a source out of range, sources that are not exactly one group's, a selection longer
 * than k, reserved != 0), NOT_FOUND (a request), FAILED_PRECONDITION (not granted; the group resolved again before its
 * dhs_readers_done), OUT_OF_RANGE (a position beyond the rows one of the named sources holds), RESOURCE_EXHAUSTED
 * (more distinct rows than the hot cache holds), DATA_LOSS (a changed host page: the request fails, an event follows).
 * After an error nothing is resolved. */
DHS_EXPORT int dhs_resolve(dhs_worker* w, const uint32_t* sources, uint32_t sources_count, dhs_query* queries,
                           uint32_t query_count);
/* ABI 1.5: dhs_resolve with the position of each query: at[i] = the position of the token whose query made
 * queries[i]'s selection (a speculative round's query j sits at n_r + j, brief §6), -1 unknown; NULL = all unknown
 * (dhs_resolve). With staging arenas, a held round's queries are grouped into their union by it and each position they
 * select is checked against the causal mask (a query reads only positions up to its own); without `at` the union is
 * still served, checked only against the appended rows (and a query of a request outside a round is never checked
 * against its position). Errors: dhs_resolve's, and INVALID_ARGUMENT for an at[i] below -1, a round's selection that
 * reads beyond its query's own position, a round of more queries than round_queries, or a position selected twice in
 * one selection; RESOURCE_EXHAUSTED also when the staging arenas are all held (a group's round staged rows and its
 * dhs_readers_done has not come yet). */
DHS_EXPORT int dhs_resolve_at(dhs_worker* w, const uint32_t* sources, uint32_t sources_count, dhs_query* queries,
                              uint32_t query_count, const int64_t* at);
/* The attention that read the locations of the last dhs_resolve over `sources` finished (brief §4: readers); until
 * then a reclaim of pages it read waits. Readers end per group: naming one source of a group ends the group's.
 * Errors: INVALID_ARGUMENT. */
DHS_EXPORT int dhs_readers_done(dhs_worker* w, const uint32_t* sources, uint32_t sources_count);

/* Speculative rounds (brief §6): rows at positions >= from appended from now on are unverified (no backup, never
 * kept); `from` >= every source's appended rows. Commit keeps positions < length and drops the rest on every source;
 * every source must hold the kept rows (length <= the fewest rows a source holds). One round at a time: a hold while
 * one is held is FAILED_PRECONDITION (commit it first), as is a commit without a hold. Errors: NOT_FOUND,
 * FAILED_PRECONDITION, OUT_OF_RANGE. */
DHS_EXPORT int dhs_request_hold(dhs_worker* w, uint64_t request, int64_t from);
DHS_EXPORT int dhs_request_commit(dhs_worker* w, uint64_t request, int64_t length);

/* Ends a request (finished or cancelled, in any state before its end): its copies in flight finish, its KV is
 * released, memd is told (while memd is away: after the re-Hello). The id is unknown afterwards. Errors: NOT_FOUND. */
DHS_EXPORT int dhs_request_complete(dhs_worker* w, uint64_t request);

/* After a restart of this GPU's worker: the requests memd kept for it (each with its confirmed host copies), as
 * memd's reply to this worker's Hello named them; after memd restarted (a re-Hello), those of the new memd's list
 * this worker did not end. A request is not listed while a resume of it is open here (submitted, not completed), and
 * leaves the list once memd took it over for that resume: at the resume's GRANTED or WAITING, or a REJECTED that memd
 * decided after taking it over (the resume can never fit: memd ended both). A resume rejected before memd took it (a
 * bad admission) leaves the request listed; one completed before memd's first answer hides it until that answer. */
typedef struct dhs_resumable {
  uint64_t request;      /* the interrupted request's id: dhs_request_desc.resume_of */
  uint64_t input_rows;   /* from its record (0 when memd kept none) */
  uint64_t max_rows;
} dhs_resumable;
/* Copies up to `capacity` entries; *count = entries written, *total = entries there are. Errors: INVALID_ARGUMENT. */
DHS_EXPORT int dhs_worker_list_resumable(dhs_worker* w, dhs_resumable* out, size_t capacity, size_t* count,
                                         size_t* total);

/* ABI 1.5, token records (issue 11's records, in the engine's vocabulary): memd keeps a record of each request with
 * max_rows > input_rows, opened with its admission (the prompt tokens dhs_request_desc.tokens gave, its sizes, its
 * session) and grown by the tokens the engine commits here, so that after the engine process (or memd) restarts the
 * request comes back with its tokens, not only its KV. `count` tokens (any int32: kept as given) are appended to the granted
 * request's generated tokens (token t of its output at index t); `digests`: NULL (0 each) or `count` logits digests
 * of the engine's choosing (kept with the tokens). They reach memd in one message per dhs_worker_poll (memd journals
 * them before it answers; dhs_worker_stats_json's tokens.acknowledged counts what it answered, tokens.in_flight
 * says whether an answer is awaited); while memd is away they wait and the re-Hello's report carries them. A resumed
 * request starts with its interrupted record's tokens: the next commit continues after them. memd bounds a record at
 * 4 MiB (4 bytes per prompt token, 12 per committed token: about 349,000 tokens without a prompt): a commit past it is
 * refused here. Should memd still refuse a request's tokens (its journal cannot be written), the library finds whose
 * (each request of the refused message is sent again alone), that request's record stops at what memd acknowledged
 * and its later commits are refused with memd's reason (tokens.records_refused counts them). Errors: INVALID_ARGUMENT
 * (NULL with count > 0), NOT_FOUND, FAILED_PRECONDITION (not granted; no record: max_rows == input_rows; memd refused
 * this request's tokens), OUT_OF_RANGE (more than max_rows - input_rows tokens in all), RESOURCE_EXHAUSTED (past
 * memd's bound on one record); nothing is committed on an error. */
DHS_EXPORT int dhs_request_commit_tokens(dhs_worker* w, uint64_t request, const int32_t* tokens,
                                         const uint64_t* digests, uint32_t count);
/* The token record of a resumable request (dhs_worker_list_resumable): its prompt tokens (as its submit gave them)
 * followed by its committed tokens. Copies up to `capacity` tokens to `out`; *count = tokens written, *total = tokens
 * there are, *prompt_tokens = how many of the total are prompt tokens. Errors: INVALID_ARGUMENT (NULL), NOT_FOUND (not
 * listed, or memd kept no record), FAILED_PRECONDITION (a record of workerd's built-in model, not an engine's). */
DHS_EXPORT int dhs_worker_resumable_tokens(dhs_worker* w, uint64_t request, int32_t* out, size_t capacity,
                                           size_t* count, size_t* total, size_t* prompt_tokens);
/* A granted request with host-backed pages (a resume, or shared prefix pages): takes its host-backed pages
 * first .. first+count-1 (the GRANTED event's leading run 0 .. import_pages-1, or any run of dhs_request_import_plan,
 * ABI 1.4) as appended rows without recomputing them (the newest of them are copied from host into the tail);
 * `first` * p must equal the rows appended so far on every source (the rows before a run are the engine's). keys_out (NULL, or L_idx * count * p * d_idx bytes laid out
 * [indexer][position][d_idx]) receives their index keys, which the engine's indexer needs. Errors: INVALID_ARGUMENT
 * (keys_out's size, count 0), NOT_FOUND, FAILED_PRECONDITION (not granted, no host-backed page, rows appended are not
 * first * p,
 * a page not host-backed), OUT_OF_RANGE (beyond max_rows), RESOURCE_EXHAUSTED (memd is away and the tail has no
 * room without a host write: nothing imported; poll and retry once memd is back). */
DHS_EXPORT int dhs_request_import(dhs_worker* w, uint64_t request, uint32_t first, uint32_t count, void* keys_out,
                                  size_t keys_bytes);

/* ABI 1.4: where a granted request's host-backed pages go in its prefill (a resume's, or shared prefix pages), so an
 * engine imports every one of them, not only the leading run the GRANTED event names. */
typedef struct dhs_host_run {
  uint32_t first_page;  /* rows [first_page * p, (first_page + pages) * p) */
  uint32_t pages;
} dhs_host_run;
/* The import plan of a prefill of `tokens` rows (1 .. max_rows): the maximal runs of the request's host-backed pages
 * (those that matched their checksums at the grant) wholly before row tokens - 1, in position order. That last row is
 * always computed (its logits give the next token), and so is every row outside the runs. The engine walks the plan
 * in order: it appends the rows before a run (computing them), then takes the run with dhs_request_import, and so on,
 * ending with the rows after the last run. A page whose host copy did not match its checksum is a gap between runs.
 * The plan is workerd's own (workerd/resume_plan.h PlanResume). Copies up to `capacity` runs into runs[0..*count);
 * *total = runs there are (capacity 0 with runs NULL asks for *total only). Errors: INVALID_ARGUMENT (null
 * pointers, tokens 0 or beyond max_rows), NOT_FOUND, FAILED_PRECONDITION (not granted). */
DHS_EXPORT int dhs_request_import_plan(dhs_worker* w, uint64_t request, uint64_t tokens, dhs_host_run* runs,
                                       size_t capacity, size_t* count, size_t* total);

/* Statistics as one JSON object, NUL-terminated, into buf (capacity bytes): requests (open, granted, completed,
 * failed), the census (direct / hot / host rows, bytes recovered), pages (kept, backed up, populated, reclaimed),
 * host_backed (ABI 1.4: granted host-backed pages verified against their checksums, mismatched, imported).
 * ABI 1.6, workerd's own latency figures for the engine's requests (its WorkerRecorder, fed the same events):
 * latency_us.admission_wait (submit to grant), latency_us.ttft (submit, or a resume's submit, to the first token
 * committed with dhs_request_commit_tokens after those it started with) and latency_us.tpot (between consecutive
 * committed tokens; the tokens of one call count 0 after the first), each {count, sum (us), bounds (us, ascending),
 * counts (per bucket, not cumulative; the last above every bound)}; requests.ended (completed, failed or rejected)
 * and requests.failures (ended with an error, by the status code's name in lower case: "aborted", ...).
 * device.backend ("cpu", "cuda") and device.resolver (where dhs_resolve runs: "kernel", the fused resolver kernel on
 * the GPU; "host", the fused resolver on the CPU; "resident", every row resident).
 * *needed = bytes the text takes with its NUL. Errors: INVALID_ARGUMENT (null), RESOURCE_EXHAUSTED (capacity below
 * *needed: nothing written but *needed). */
DHS_EXPORT int dhs_worker_stats_json(dhs_worker* w, char* buf, size_t capacity, size_t* needed);

/* ABI 1.6: the timeline of request `request` (workerd's `dhsctl request` timelines, common/request_timeline.h) as a
 * JSON object {"timelines": [...]}: one timeline per request this worker kept under that id (1024 timelines at most;
 * beyond, the oldest ended one is dropped first), each {request, client_request, client (the submit's session), gpu, epoch, ended, events_dropped, events:
 * [{at_us (CLOCK_MONOTONIC), event ("submitted", "first_token", "end"), pages (submitted: tokens it resumed with;
 * end: tokens committed), detail ("resume of N"; end: "ok" or the error), source ("worker/<gpu>")}]}; "timelines" is
 * empty for an id it keeps none of.
 * Buffer as dhs_worker_stats_json. Errors: INVALID_ARGUMENT (null), RESOURCE_EXHAUSTED (capacity below *needed). */
DHS_EXPORT int dhs_request_timeline_json(dhs_worker* w, uint64_t request, char* buf, size_t capacity, size_t* needed);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* DHS_DHS_H_ */
