// workerd/kv/resolver_plan.h: the fused resolver's per-query plan and gather (brief §5), written once and compiled
// for the host (g++, every CI run: tests/workerd/resolver_plan_test.cc checks it against ReferenceResolver) and for
// the device (nvcc: resolver_kernel.cu runs it as one kernel over the batch, one thread block per
// query). Plain data only (no absl, no std containers), so nvcc compiles it as is.
//
// Execution model: the code runs on a group of `lanes` cooperating lanes (`Lanes` below): loops stride over
// lane()..n by lanes(), sync() separates phases. HostLanes is one lane whose sync() is a no-op, so the host runs the
// same phases as plain loops; the device's lanes are the threads of a block and sync() is __syncthreads().
//
// Per query (selection of k positions, -1 = empty), over the group's sources (num_sources, index si):
//   A. direct: t >= tail_low -> tail; ready_page[t / p] >= 0 -> ready map; else the row needs a completed host copy
//      (host_ready), otherwise the query fails with kErrNoCopy. Missing positions go into a small hash table
//      (capacity HashCapacity(k), first occurrence j kept).
//   B. hot cache (skipped when every selected row resolved directly): each of the B slots probes the table once; a
//      hit is protected (stamp = step) and touched (last_use = clock0 + 1 + j, the largest j for a repeated row).
//   C. victims: the unprotected slots sorted by last_use (bitonic sort over BPad(B) keys); the r-th distinct miss in
//      selection order takes the r-th least recent one (kErrExhausted when fewer than the distinct misses), which
//      then holds the row, protected, last_use = clock0 + 1 + k + r (more recent than every hit). A repeated miss
//      resolves to the same slot and counts as hot. These are the LRU rules of HotCache (hot_cache.h): hits touched
//      in selection order, then misses claimed in selection order.
//   D. emission and gather: out[si * k + j] = the row's byte offset in the KV pool (-1 kept); every host-resolved
//      row of every source is copied from the host pool (host page h at h * host_page_bytes) into its hot slot, 16 bytes
//      kUnroll chunks in flight per lane.
// The cache clock advances by 2k + 2 per planned query, so last_use values stay distinct within a cache.
//
// Preconditions (the caller's, as Resolver::Validate checks them): every t < the group's length; each slot (hot
// cache) appears at most once per batch (the device runs the queries of a batch concurrently); B >= k.
// On an error the query's output is not written and its hits may have been touched; no victim was claimed.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DHS_HD __host__ __device__
#else
#define DHS_HD
#endif

namespace dhs::plan {

inline constexpr int64_t kNone = -1;
inline constexpr int64_t kProtectedKey = INT64_MAX;  // sort key of a slot that cannot be a victim

// 16 bytes in flight (gather). kUnroll: chunks each lane loads before it stores.
struct alignas(16) Chunk16 {
  uint8_t b[16];
};
inline constexpr uint32_t kUnroll = 4;

// Per-query error codes (QueryResult::error).
inline constexpr int32_t kOk = 0;
inline constexpr int32_t kErrNoCopy = 1;     // a row with neither a GPU nor a host copy (INTERNAL)
inline constexpr int32_t kErrExhausted = 2;  // more distinct missing rows than unprotected slots (RESOURCE_EXHAUSTED)

// Entry kinds (Scratch::kind).
inline constexpr int32_t kKindNone = 0, kKindTail = 1, kKindReady = 2, kKindHot = 3, kKindHost = 4, kKindMiss = 5;

// The KV pool layout seen by one group's sources (a flattened KvLayout; resolver_plan_host.h builds it). Byte
// offsets: tail row = slot * slot_bytes + slot_src[si] + (B + t mod T) * row_bytes[si]; hot slot h = slot *
// slot_bytes + slot_src[si] + h * row_bytes[si]; ready row = pages_base + page * page_bytes + in_page[si] +
// (t mod p) * row_bytes[si]; host row = host_page * host_page_bytes + in_page[si] + (t mod p) * row_bytes[si].
struct Geometry {
  uint32_t hot_rows = 0;   // B
  uint32_t tail_rows = 0;  // T
  uint32_t page_rows = 0;  // p
  uint32_t num_sources = 0;
  uint64_t slot_bytes = 0;   // bytes of one request slot's region (all sources)
  uint64_t pages_base = 0;   // offset of optional-history page 0
  uint64_t page_bytes = 0;   // p * sum of row bytes (a device page)
  uint64_t host_page_bytes = 0;  // a host page: page_bytes then the index keys (KvLayout::host_page_bytes)
  const uint64_t* slot_src = nullptr;   // [num_sources] offset of the source's hot cache inside a slot's region
  const uint64_t* in_page = nullptr;    // [num_sources] offset of the source's rows inside a page
  const uint64_t* row_bytes = nullptr;  // [num_sources]
};

// The hot cache of one (request slot, group): B slots. pos = row held (-1 empty); last_use = recency (larger = more
// recent); stamp = last step that selected it (protected in that step). clock: the cache's recency counter.
struct HotSlots {
  int64_t* pos = nullptr;       // [B]
  int64_t* last_use = nullptr;  // [B]
  uint64_t* stamp = nullptr;    // [B]
  int64_t* clock = nullptr;     // [1]
};

// One query: a request's state (its hot index, request_kv.h) and its selection.
struct Query {
  uint32_t slot = 0;
  int64_t tail_low = 0;                // positions >= tail_low are in the tail of every group source
  uint64_t pages = 0;                  // entries of the three arrays below (history pages)
  const int32_t* ready_page = nullptr;  // device page of the ready-map entry, -1 = none
  const uint8_t* host_ready = nullptr;  // 1 = the page's host copy completed
  const int64_t* host_page = nullptr;   // host page of the page's copy, -1 = none
  const int64_t* selection = nullptr;   // [k]
  uint32_t k = 0;
  int64_t* out = nullptr;               // [num_sources * k]
  HotSlots cache;
};

// What one query added to the census (brief §5), and its error code.
struct QueryResult {
  unsigned long long direct = 0, hot = 0, host = 0, scans_skipped = 0, bytes_recovered = 0;
  int32_t error = kOk;
  int32_t pad = 0;
};

DHS_HD inline uint32_t NextPow2(uint32_t n) {
  uint32_t c = 1;
  while (c < n) c <<= 1;
  return c;
}
DHS_HD inline uint32_t HashCapacity(uint32_t k) { return NextPow2(2 * (k > 0 ? k : 1)); }
DHS_HD inline uint32_t BPad(uint32_t b) { return NextPow2(b > 0 ? b : 1); }

// Per-query scratch (any memory the lanes share). Sizes: keys/first_j/slot: HashCapacity(k); kind/aux/scan_a/scan_b:
// k; sort_key/sort_slot: BPad(B); flags: 4.
struct Scratch {
  int64_t* keys;
  int32_t* first_j;
  int32_t* slot;
  int32_t* kind;
  int32_t* aux;
  int32_t* scan_a;
  int32_t* scan_b;
  int64_t* sort_key;
  int32_t* sort_slot;
  int32_t* flags;  // [0] any miss, [1] error
};

// Bytes of one query's scratch, and the carving of a block of that size (8-byte aligned).
DHS_HD inline uint64_t ScratchBytes(uint32_t k, uint32_t b) {
  const uint64_t h = HashCapacity(k), bp = BPad(b);
  return h * 8 + bp * 8 + ((h * 2 + uint64_t{k} * 4 + bp + 4 + 1) & ~uint64_t{1}) * 4;
}
DHS_HD inline Scratch CarveScratch(void* base, uint32_t k, uint32_t b) {
  const uint64_t h = HashCapacity(k), bp = BPad(b);
  Scratch s;
  int64_t* p64 = static_cast<int64_t*>(base);
  s.keys = p64;
  s.sort_key = p64 + h;
  int32_t* p32 = reinterpret_cast<int32_t*>(p64 + h + bp);
  s.first_j = p32;
  s.slot = p32 + h;
  s.kind = p32 + 2 * h;
  s.aux = s.kind + k;
  s.scan_a = s.aux + k;
  s.scan_b = s.scan_a + k;
  s.sort_slot = s.scan_b + k;
  s.flags = s.sort_slot + bp;
  return s;
}

// One lane on the host: loops run in order, sync() is a no-op, atomics are plain operations.
struct HostLanes {
  uint32_t lane() const { return 0; }
  uint32_t lanes() const { return 1; }
  void sync() const {}
  unsigned long long add(unsigned long long* p, unsigned long long v) const {
    const unsigned long long o = *p;
    *p += v;
    return o;
  }
  int64_t cas(int64_t* p, int64_t expected, int64_t v) const {
    const int64_t o = *p;
    if (o == expected) *p = v;
    return o;
  }
  void min32(int32_t* p, int32_t v) const { *p = v < *p ? v : *p; }
  void max64(int64_t* p, int64_t v) const { *p = v > *p ? v : *p; }
  void store_i32(int32_t* p, int32_t v) const { *p = v; }
  // Loads / stores n <= 16 bytes through a Chunk16.
  void load16(const uint8_t* src, uint32_t n, Chunk16* c) const {
    for (uint32_t i = 0; i < n; ++i) c->b[i] = src[i];
  }
  void store16(uint8_t* dst, uint32_t n, const Chunk16& c) const {
    for (uint32_t i = 0; i < n; ++i) dst[i] = c.b[i];
  }
};

DHS_HD inline uint32_t HashOf(int64_t t, uint32_t mask) {
  return static_cast<uint32_t>((static_cast<uint64_t>(t) * 0x9E3779B97F4A7C15ULL) >> 32) & mask;
}

// Table index holding t, or -1.
DHS_HD inline int32_t HashFind(const int64_t* keys, uint32_t mask, int64_t t) {
  for (uint32_t i = HashOf(t, mask);; i = (i + 1) & mask) {
    if (keys[i] == t) return static_cast<int32_t>(i);
    if (keys[i] == kNone) return -1;
  }
}

// Byte offset of selected entry (si, t) in the KV pool.
DHS_HD inline int64_t LocationOf(const Geometry& g, const Query& q, uint32_t si, int64_t t, int32_t kind,
                                 int32_t aux) {
  const uint64_t base = uint64_t{q.slot} * g.slot_bytes + g.slot_src[si];
  const uint64_t rb = g.row_bytes[si];
  switch (kind) {
    case kKindTail:
      return static_cast<int64_t>(base + (g.hot_rows + static_cast<uint64_t>(t) % g.tail_rows) * rb);
    case kKindReady:
      return static_cast<int64_t>(g.pages_base + static_cast<uint64_t>(aux) * g.page_bytes + g.in_page[si] +
                                  (static_cast<uint64_t>(t) % g.page_rows) * rb);
    case kKindHot:
    case kKindHost:
      return static_cast<int64_t>(base + static_cast<uint64_t>(aux) * rb);
    default:
      return kNone;
  }
}

// ---- The phases of PlanAndGather (below), in order. Each is called by every lane of the group together; each ends
// with the lanes in step (a sync() where a later phase reads what another lane wrote). `PlanShape` holds the sizes
// every phase uses.
struct PlanShape {
  uint32_t k, hot_rows, page_rows, hcap, mask, bpad, lane, lanes;
  int64_t clock0;  // the cache clock before this query
};

template <class Lanes>
DHS_HD inline PlanShape ShapeOf(const Lanes& L, const Geometry& g, const Query& q) {
  const uint32_t hcap = HashCapacity(q.k);
  return PlanShape{q.k, g.hot_rows, g.page_rows, hcap, hcap - 1, BPad(g.hot_rows), L.lane(), L.lanes(),
                   *q.cache.clock};
}

// Init: the miss table empty, the flags clear.
template <class Lanes>
DHS_HD void PlanInit(const Lanes& L, const PlanShape& z, const Scratch& s) {
  for (uint32_t i = z.lane; i < z.hcap; i += z.lanes) {
    s.keys[i] = kNone;
    s.first_j[i] = INT32_MAX;
    s.slot[i] = -1;
  }
  if (z.lane == 0) s.flags[0] = s.flags[1] = 0;
  L.sync();
}

// A. direct lookups (tail, ready map); misses into the table (first occurrence j kept). Returns false (r->error set)
// when a row has neither a GPU nor a host copy.
template <class Lanes>
DHS_HD bool PlanDirect(const Lanes& L, const PlanShape& z, const Query& q, const Scratch& s, QueryResult* r) {
  unsigned long long direct = 0;
  for (uint32_t j = z.lane; j < z.k; j += z.lanes) {
    const int64_t t = q.selection[j];
    int32_t kind = kKindNone, aux = 0;
    if (t != kNone) {
      const uint64_t pg = static_cast<uint64_t>(t) / z.page_rows;
      if (t >= q.tail_low) {
        kind = kKindTail;
      } else if (pg < q.pages && q.ready_page[pg] >= 0) {
        kind = kKindReady;
        aux = q.ready_page[pg];
      } else if (pg >= q.pages || q.host_ready[pg] == 0) {
        L.store_i32(&s.flags[1], kErrNoCopy);
      } else {
        kind = kKindMiss;
        L.store_i32(&s.flags[0], 1);
        for (uint32_t i = HashOf(t, z.mask);; i = (i + 1) & z.mask) {
          const int64_t prev = L.cas(&s.keys[i], kNone, t);
          if (prev == kNone || prev == t) {
            L.min32(&s.first_j[i], static_cast<int32_t>(j));
            break;
          }
        }
      }
      direct += (kind == kKindTail || kind == kKindReady);
    }
    s.kind[j] = kind;
    s.aux[j] = aux;
  }
  if (direct) L.add(&r->direct, direct);
  L.sync();
  if (s.flags[1] != kOk) {
    if (z.lane == 0) r->error = s.flags[1];
    return false;
  }
  return true;
}

// B. hot cache: each slot probes the table once; hits protected and touched (*hot counts them). Sets scan_a[j] = 1
// for the first occurrence of each distinct miss, 0 elsewhere.
template <class Lanes>
DHS_HD void PlanHotHits(const Lanes& L, const PlanShape& z, const Query& q, uint64_t step, const Scratch& s,
                        unsigned long long* hot) {
  for (uint32_t h = z.lane; h < z.hot_rows; h += z.lanes) {
    const int64_t t = q.cache.pos[h];
    if (t == kNone) continue;
    const int32_t i = HashFind(s.keys, z.mask, t);
    if (i >= 0) {
      s.slot[i] = static_cast<int32_t>(h);
      q.cache.stamp[h] = step;
    }
  }
  L.sync();
  for (uint32_t j = z.lane; j < z.k; j += z.lanes) {
    int32_t distinct = 0;
    if (s.kind[j] == kKindMiss) {
      const int32_t i = HashFind(s.keys, z.mask, q.selection[j]);
      const int32_t h = s.slot[i];
      if (h >= 0) {
        s.kind[j] = kKindHot;
        s.aux[j] = h;
        L.max64(&q.cache.last_use[h], z.clock0 + 1 + static_cast<int64_t>(j));
        ++*hot;
      } else {
        distinct = s.first_j[i] == static_cast<int32_t>(j);
      }
    }
    s.scan_a[j] = distinct;
  }
  L.sync();
}

// Inclusive prefix sum of the distinct-miss flags in scan_a (Hillis-Steele, double-buffered over scan_a / scan_b):
// the rank (1-based) of each distinct miss. Returns the buffer that holds the sums.
template <class Lanes>
DHS_HD int32_t* RankMisses(const Lanes& L, const PlanShape& z, const Scratch& s) {
  int32_t* a = s.scan_a;
  int32_t* b = s.scan_b;
  for (uint32_t off = 1; off < z.k; off <<= 1) {
    for (uint32_t j = z.lane; j < z.k; j += z.lanes) b[j] = a[j] + (j >= off ? a[j - off] : 0);
    L.sync();
    int32_t* tmp = a;
    a = b;
    b = tmp;
  }
  return a;
}

// C. victims: the unprotected slots by last_use, least recent first (bitonic sort, ascending, over BPad(B) keys;
// a protected or padding slot sorts last as kProtectedKey).
template <class Lanes>
DHS_HD void SortVictims(const Lanes& L, const PlanShape& z, const Query& q, uint64_t step, const Scratch& s) {
  for (uint32_t i = z.lane; i < z.bpad; i += z.lanes) {
    s.sort_key[i] = (i < z.hot_rows && q.cache.stamp[i] != step) ? q.cache.last_use[i] : kProtectedKey;
    s.sort_slot[i] = static_cast<int32_t>(i);
  }
  L.sync();
  for (uint32_t size = 2; size <= z.bpad; size <<= 1) {
    for (uint32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (uint32_t i = z.lane; i < z.bpad; i += z.lanes) {
        const uint32_t o = i ^ stride;
        if (o <= i) continue;
        const bool ascending = (i & size) == 0;
        if ((s.sort_key[i] > s.sort_key[o]) == ascending) {
          const int64_t tk = s.sort_key[i];
          s.sort_key[i] = s.sort_key[o];
          s.sort_key[o] = tk;
          const int32_t ts = s.sort_slot[i];
          s.sort_slot[i] = s.sort_slot[o];
          s.sort_slot[o] = ts;
        }
      }
      L.sync();
    }
  }
}

// The r-th distinct miss (rank[j] = r + 1) claims the r-th least recent victim, which then holds the row, protected,
// more recent than every hit; then each repeated miss takes the slot its first occurrence claimed (*hot counts
// them). Ends by advancing the cache clock.
template <class Lanes>
DHS_HD void ClaimVictims(const Lanes& L, const PlanShape& z, const Query& q, uint64_t step, const Scratch& s,
                         const int32_t* rank, unsigned long long* hot, QueryResult* r) {
  unsigned long long host = 0;
  for (uint32_t j = z.lane; j < z.k; j += z.lanes) {
    if (s.kind[j] != kKindMiss) continue;
    const int64_t t = q.selection[j];
    const int32_t i = HashFind(s.keys, z.mask, t);
    if (s.first_j[i] != static_cast<int32_t>(j)) continue;
    const int32_t rk = rank[j] - 1;
    const int32_t h = s.sort_slot[rk];
    s.kind[j] = kKindHost;
    s.aux[j] = h;
    s.slot[i] = h;
    q.cache.pos[h] = t;
    q.cache.stamp[h] = step;
    q.cache.last_use[h] = z.clock0 + 1 + static_cast<int64_t>(z.k) + rk;
    ++host;
  }
  if (host) L.add(&r->host, host);
  L.sync();
  for (uint32_t j = z.lane; j < z.k; j += z.lanes) {  // repeated misses: the slot their first occurrence claimed
    if (s.kind[j] != kKindMiss) continue;
    s.kind[j] = kKindHot;
    s.aux[j] = s.slot[HashFind(s.keys, z.mask, q.selection[j])];
    ++*hot;
  }
  if (*hot) L.add(&r->hot, *hot);
  L.sync();
  if (z.lane == 0) *q.cache.clock = z.clock0 + 2 * static_cast<int64_t>(z.k) + 2;
}

// B and C for a query with at least one miss. Returns false (r->error = kErrExhausted) when fewer unprotected slots
// than distinct misses are left.
template <class Lanes>
DHS_HD bool PlanMisses(const Lanes& L, const PlanShape& z, const Query& q, uint64_t step, const Scratch& s,
                       QueryResult* r) {
  unsigned long long hot = 0;
  PlanHotHits(L, z, q, step, s, &hot);
  const int32_t* rank = RankMisses(L, z, s);
  const uint32_t misses = z.k > 0 ? static_cast<uint32_t>(rank[z.k - 1]) : 0;
  SortVictims(L, z, q, step, s);
  if (misses > 0 && s.sort_key[misses - 1] == kProtectedKey) {
    if (z.lane == 0) r->error = kErrExhausted;
    return false;
  }
  ClaimVictims(L, z, q, step, s, rank, &hot, r);
  return true;
}

// D (emission): out[si * k + j] = the location of selected entry j for source si (every source, selection order).
DHS_HD inline void EmitLocations(const PlanShape& z, const Geometry& g, const Query& q, const Scratch& s) {
  const uint32_t n = g.num_sources * z.k;
  for (uint32_t e = z.lane; e < n; e += z.lanes) {
    const uint32_t si = e / z.k, j = e % z.k;
    q.out[e] = LocationOf(g, q, si, q.selection[j], s.kind[j], s.aux[j]);
  }
}

// D (gather): 16-byte chunks of every host-resolved row of every source; each lane loads kUnroll chunks before it
// stores any, so that many reads of (mapped, pinned) host memory are in flight at once. Locations are recomputed
// here, never read back from `out` (another lane writes it, with no sync in between).
template <class Lanes>
DHS_HD void GatherHostRows(const Lanes& L, const PlanShape& z, const Geometry& g, const Query& q, const Scratch& s,
                           QueryResult* r, const uint8_t* host_pool, uint8_t* device_pool) {
  const uint32_t k = z.k, p = z.page_rows, lanes = z.lanes;
  const uint32_t n = g.num_sources * k;
  uint64_t max_row = 0;
  for (uint32_t si = 0; si < g.num_sources; ++si) max_row = g.row_bytes[si] > max_row ? g.row_bytes[si] : max_row;
  const uint32_t chunks = static_cast<uint32_t>((max_row + 15) / 16);
  const uint64_t total = uint64_t{n} * chunks;
  unsigned long long bytes = 0;
  for (uint64_t base = z.lane; base < total; base += uint64_t{lanes} * kUnroll) {
    Chunk16 buf[kUnroll];
    uint8_t* dst[kUnroll];
    uint32_t len[kUnroll];
    for (uint32_t u = 0; u < kUnroll; ++u) {
      len[u] = 0;
      dst[u] = nullptr;
      const uint64_t c = base + uint64_t{u} * lanes;
      if (c >= total) continue;
      const uint32_t e = static_cast<uint32_t>(c / chunks), part = static_cast<uint32_t>(c % chunks);
      const uint32_t si = e / k, j = e % k;
      if (s.kind[j] != kKindHost) continue;
      const uint64_t rb = g.row_bytes[si], at = uint64_t{part} * 16;
      if (at >= rb) continue;
      const int64_t t = q.selection[j];
      const uint64_t src = static_cast<uint64_t>(q.host_page[static_cast<uint64_t>(t) / p]) * g.host_page_bytes +
                           g.in_page[si] + (static_cast<uint64_t>(t) % p) * rb;
      len[u] = rb - at < 16 ? static_cast<uint32_t>(rb - at) : 16;
      dst[u] = device_pool + LocationOf(g, q, si, t, kKindHost, s.aux[j]) + at;
      L.load16(host_pool + src + at, len[u], &buf[u]);
      if (part == 0) bytes += rb;
    }
    for (uint32_t u = 0; u < kUnroll; ++u) {
      if (len[u] != 0) L.store16(dst[u], len[u], buf[u]);
    }
  }
  if (bytes) L.add(&r->bytes_recovered, bytes);
}

// Plans query q, writes its locations and copies its host-resolved rows from host_pool into device_pool (both
// addressed by byte offset; the device reads the host pool through its mapped pinned address). Adds to *r (zeroed
// by the caller). All lanes of the group must call it together. Phases: see the top of this file.
template <class Lanes>
DHS_HD void PlanAndGather(const Lanes& L, const Geometry& g, const Query& q, uint64_t step, const Scratch& s,
                          QueryResult* r, const uint8_t* host_pool, uint8_t* device_pool) {
  const PlanShape z = ShapeOf(L, g, q);
  PlanInit(L, z, s);
  if (!PlanDirect(L, z, q, s, r)) return;
  const bool any_miss = s.flags[0] != 0;
  if (any_miss) {
    if (!PlanMisses(L, z, q, step, s, r)) return;
  } else if (z.lane == 0) {
    r->scans_skipped = r->scans_skipped + 1;
  }
  EmitLocations(z, g, q, s);
  if (any_miss) GatherHostRows(L, z, g, q, s, r, host_pool, device_pool);
}

}  // namespace dhs::plan
