// common/worker_shape.h: the shape of a worker as its Hello declares it (issue 14: what `dhsctl plan --live` plans
// with) and the ONE computation of the GPU pages a request of that shape declares (AdmitRequest.required_pages),
// shared by workerd (workerd/geometry.h RequiredPages) and the capacity planner (tools/planner/planner.h ComputeLive).
//
// Pure header: plain values and arithmetic, no I/O (the planner library links nothing else). The Hello -> WorkerShape
// conversion is WorkerShapeOf in common/protocol.h.
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace dhs {

// ceil(a / b) for b > 0, without overflow: e.g. the whole pages `a` bytes (or rows) take at `b` per page.
inline uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// What one request of a worker costs on its GPU before it may start (brief §8 hierarchical, §6 / §8 "with a drafter").
struct SessionPagesInput {
  uint64_t page_rows = 0;         // p, rows per page (> 0)
  uint64_t page_bytes = 0;        // bytes of one GPU page, p * sum of d_KV over payload sources (> 0)
  uint64_t hot_rows = 0;          // B per request and payload source
  uint64_t tail_rows = 0;         // T per request and payload source
  uint64_t index_producers = 0;   // L_idx: layers with an indexer
  uint64_t index_key_bytes = 0;   // d_idx: bytes of one index key
  bool resident = false;          // resident mode: the whole context stays on GPU too
  uint64_t slot_draft_ring_bytes = 0;  // the slot's draft ring, R_d * draft_bytes_per_row (0 without a drafter)
  uint64_t slot_staging_bytes = 0;     // the slot's staging share, M_stage / N = χ * K_max * k * d_KV (0 without)
};

// The speculation share's GPU pages: ceil(slot_draft_ring_bytes / page_bytes) + ceil(slot_staging_bytes / page_bytes)
// (brief §8 "with a drafter"; each part rounded alone, as AdmitRequest declares them).
inline uint64_t SessionSpeculationPages(const SessionPagesInput& in) {
  return CeilDiv(in.slot_draft_ring_bytes, in.page_bytes) + CeilDiv(in.slot_staging_bytes, in.page_bytes);
}

// GPU pages a request of `context_tokens` (prompt + max_new_tokens) declares as required (AdmitRequest.required_pages):
//   ceil((B + T) / p)                                    hierarchical modes: hot cache and tail (a page holds p rows
//                                                        of every source)
// + ceil(context / p)                                    resident mode instead: the whole context (its rows, tail
//                                                        included: resident serving keeps no hot cache, brief §8)
// + ceil(context * L_idx * d_idx / page_bytes)           its index keys (unpadded context: no metadata term)
// + ceil(slot_draft_ring_bytes / page_bytes) + ceil(slot_staging_bytes / page_bytes)   speculation share
// Issue 27: resident requests declared the hot cache and tail too, which resident serving (ResidentKvAccess) never
// allocates: memd admitted 11 resident sessions where the planner's §8 figure said 14 (512-token contexts).
// No overflow check: callers keep the sizes far below 2^64 (workerd checks its sizes in ComputeGeometry).
inline uint64_t SessionRequiredPages(const SessionPagesInput& in, uint64_t context_tokens) {
  const uint64_t rows = in.resident ? CeilDiv(context_tokens, in.page_rows)
                                    : CeilDiv(in.hot_rows + in.tail_rows, in.page_rows);
  return rows + CeilDiv(context_tokens * in.index_producers * in.index_key_bytes, in.page_bytes) +
         SessionSpeculationPages(in);
}

// A worker's shape as its Hello declares it (schemas/dhs.fbs Hello; memd keeps it per GPU for its `status` view).
// An older worker declares no shape: serving_mode is empty.
struct WorkerShape {
  std::string serving_mode;        // "resident" | "hisparse" | "adaptive"; "" = not declared
  uint32_t page_rows = 0;          // p
  uint64_t page_bytes = 0;         // GPU page, bytes: p * L_pay * d_KV
  uint64_t host_page_bytes = 0;    // host page, bytes: p * (L_pay * d_KV + L_idx * d_idx)
  uint32_t payload_sources = 0;    // L_pay: payload sources (Hello.sources)
  uint32_t index_producers = 0;    // L_idx
  uint32_t index_key_bytes = 0;    // d_idx, bytes
  uint32_t top_k = 0;              // k
  uint32_t hot_rows = 0;           // B
  uint32_t tail_rows = 0;          // T
  uint32_t fetched_rows_per_token = 0;  // payload rows per selected position and token, over all selections
  uint32_t request_slots = 0;      // N
  uint32_t drafter_window = 0;     // W (0 without a drafter)
  uint32_t k_max = 0;              // K_max (0 with speculation off)
  uint64_t draft_bytes_per_row = 0;  // bytes of one draft-ring row (0 without a drafter)
  uint32_t draft_ring_rows = 0;    // R_d per slot (0 without a drafter)
  uint64_t draft_ring_bytes = 0;   // N * R_d * draft_bytes_per_row
  uint64_t staging_bytes = 0;      // M_stage = χ * N * K_max * k * d_KV
  uint32_t staging_arenas = 0;     // χ

  bool declared() const { return !serving_mode.empty(); }
  bool speculating() const { return k_max > 0; }
};

// Calls visit(name, field) for every numeric field of `w` (all but serving_mode), in declaration order: the one list
// of field names that memd's status view writes (memd/state_dump.cc) and `dhsctl plan --live` reads back
// (tools/planner/planner.cc WorkerShapeFromJson). W is WorkerShape or const WorkerShape.
template <typename W, typename Visit>
void ForEachNumericField(W& w, Visit&& visit) {
  visit("page_rows", w.page_rows);
  visit("page_bytes", w.page_bytes);
  visit("host_page_bytes", w.host_page_bytes);
  visit("payload_sources", w.payload_sources);
  visit("index_producers", w.index_producers);
  visit("index_key_bytes", w.index_key_bytes);
  visit("top_k", w.top_k);
  visit("hot_rows", w.hot_rows);
  visit("tail_rows", w.tail_rows);
  visit("fetched_rows_per_token", w.fetched_rows_per_token);
  visit("request_slots", w.request_slots);
  visit("drafter_window", w.drafter_window);
  visit("k_max", w.k_max);
  visit("draft_bytes_per_row", w.draft_bytes_per_row);
  visit("draft_ring_rows", w.draft_ring_rows);
  visit("draft_ring_bytes", w.draft_ring_bytes);
  visit("staging_bytes", w.staging_bytes);
  visit("staging_arenas", w.staging_arenas);
}

}  // namespace dhs
