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

// ceil(bytes / page_bytes) for page_bytes > 0: the whole pages a byte size takes.
inline uint64_t PagesOfBytes(uint64_t bytes, uint64_t page_bytes) {
  return bytes / page_bytes + (bytes % page_bytes != 0 ? 1 : 0);
}

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

// GPU pages a request of `context_tokens` (prompt + max_new_tokens) declares as required (AdmitRequest.required_pages):
//   ceil((B + T) / p)                                    hot cache and tail (a page holds p rows of every source)
// + ceil(context * L_idx * d_idx / page_bytes)           its index keys (unpadded context: no metadata term)
// + ceil(context / p)                                    resident mode only: the whole context
// + ceil(slot_draft_ring_bytes / page_bytes) + ceil(slot_staging_bytes / page_bytes)   speculation share
// No overflow check: callers keep the sizes far below 2^64 (workerd checks its sizes in ComputeGeometry).
inline uint64_t SessionRequiredPages(const SessionPagesInput& in, uint64_t context_tokens) {
  uint64_t required = PagesOfBytes(in.hot_rows + in.tail_rows, in.page_rows) +
                      PagesOfBytes(context_tokens * in.index_producers * in.index_key_bytes, in.page_bytes);
  if (in.resident) required += PagesOfBytes(context_tokens, in.page_rows);
  required += PagesOfBytes(in.slot_draft_ring_bytes, in.page_bytes);
  required += PagesOfBytes(in.slot_staging_bytes, in.page_bytes);
  return required;
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

}  // namespace dhs
