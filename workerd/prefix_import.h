// workerd/prefix_import.h: a request's prepared prefix (SubmitRequest.hash_ids; issue 5, brief §10) imported into its
// model session chunk by chunk (Model::ImportPrefix), whole blocks through the row cache (workerd/prefix_cache.h):
// a block whose chain is cached is imported (Model::ImportRows, no compute), else computed with its rows captured and
// offered to the cache. Issue 23: the prepared-prefix import state and its job, out of the Worker's loop (the loop asks
// for one chunk per iteration while a request's input is fed before its batched steps).
//
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dhs_generated.h"
#include "workerd/kv_access.h"
#include "workerd/model/model.h"
#include "workerd/prefix_cache.h"
#include "workerd/prefix_chain.h"
#include "workerd/resume_import.h"
#include "workerd/serving_mode.h"
#include "workerd/worker_request.h"
#include "workerd/worker_stats.h"

namespace dhs {

// Issue 24 (the content-addressed host tier, worker side): r's prefix chain (PrefixChainOf over its input, its
// hash_ids, prefix.block_tokens and prefix.tenant; workerd/prefix_chain.h) into `admit`'s tenant, prefix_block_ids,
// prefix_block_tokens and prefix_block_digests. Resident mode names none (no host tier: it is the exactness
// reference). memd (--prefix-sharing on) grants the shared pages of the chain that exist (AdmitGrant.shared_pages,
// inside host_backed_pages with their checksums); a memd with sharing off ignores it.
void SetPrefixChain(const WorkerRequest& r, WorkerMode mode, wire::AdmitRequestT& admit);

// At r's grant (after ResumeImporter::OnGrant checked its host-backed pages): its shared pages are imported from host
// like a resume's host-backed pages (AdmissionDesk::Start -> ResumeImporter::Begin, the runs by ImportRun), never
// computed. Counts (units in WorkerStats; none in resident mode): prefix_lookups += the chain's blocks, prefix_shared_pages_granted +=
// shared pages granted, prefix_hits_host += the blocks whose every row is in a shared page that will be imported (it
// matched its checksum and lies wholly before the last input token), prefill_tokens_saved += those pages' rows.
void CountSharedGrant(const WorkerRequest& r, const wire::AdmitGrantT& m, WorkerMode mode, uint32_t page_rows,
                      WorkerStats& counts);

class PrefixImporter {
 public:
  // `model`, `resumes` and `recorder` must outlive it. `prefill_chunk`: the most tokens imported per call (>= 1);
  // `cache_bytes`: the row cache's capacity (0: no cache, every block computed).
  PrefixImporter(const model::Model* model, uint32_t prefill_chunk, uint64_t cache_bytes, const ResumeImporter* resumes,
                 WorkerRecorder* recorder)
      : model_(model), prefill_chunk_(prefill_chunk), cache_(cache_bytes), resumes_(resumes), recorder_(recorder) {}

  // Feeds r's next chunk of its input up to the prefix's end (r.prefix.tokens, never the last input token: its
  // logits start decoding) into r.session on `kv`; r.fed advances. A chunk never crosses a block's end when the cache
  // is on; a whole cached block is imported at once (prefix_blocks_imported), a computed block is captured and
  // inserted (prefix_blocks_computed). A resume recomputes up to its next host run only, its rows bypassing the cache
  // (ResumeImporter::NextHostRow). Precondition: r.session open, r.fed < that end. Errors: the model's (the loop
  // ends r).
  absl::Status ImportChunk(WorkerRequest& r, KvAccess& kv);

  // The leading whole blocks of r's prepared prefix that the row cache holds (blocks 0, 1, .. up to the first one it
  // does not hold; never the last input token's), copied into `session`, a fresh session of the same model, on `kv`
  // (Model::ImportRows: no compute). For a proposer's private copy of r's history (DraftRequest::import_history,
  // issue 27). The cache is only read (PrefixRowCache::Peek): no counter of r or of the cache moves. Returns the
  // positions copied (0 when the cache is off or holds none, or r names no chain). Errors: the model's.
  absl::StatusOr<Position> CopyCachedPrefix(const WorkerRequest& r, model::ModelSession& session, KvAccess& kv);

 private:
  // Where r's imported prefix ends (exclusive): prefix.tokens, never past the last input token (fed by a Step: its
  // logits start decoding). Precondition: r.input not empty.
  static Position PrefixEnd(const WorkerRequest& r);
  // Whole block `first / block` of r through the cache when r.fed == first: imported when cached (true), else its
  // capture opened (false). `chain`: the block's chain hash_ids[0..b].
  absl::StatusOr<bool> ImportCached(WorkerRequest& r, std::span<const uint64_t> chain, KvAccess& kv);
  // r's captured block, complete at r.fed: its index keys taken from the session, stored in the cache.
  void InsertCaptured(WorkerRequest& r, std::span<const uint64_t> chain);

  const model::Model* model_;
  uint32_t prefill_chunk_;
  PrefixRowCache cache_;
  const ResumeImporter* resumes_;
  WorkerRecorder* recorder_;
};

}  // namespace dhs
