// workerd/prefix_import.cc: see prefix_import.h.
#include "workerd/prefix_import.h"

#include <algorithm>
#include <optional>
#include <utility>

namespace dhs {

void SetPrefixChain(const WorkerRequest& r, WorkerMode mode, wire::AdmitRequestT& admit) {
  admit.tenant = r.prefix.tenant;
  if (mode == WorkerMode::kResident) return;
  RequestPrefixChain chain = PrefixChainOf(r.input, r.prefix.hash_ids, r.prefix.block_tokens, r.prefix.tenant);
  admit.prefix_block_ids = std::move(chain.block_ids);
  admit.prefix_block_digests = std::move(chain.block_digests);
  admit.prefix_block_tokens = chain.block_tokens;
}

void CountSharedGrant(const WorkerRequest& r, const wire::AdmitGrantT& m, WorkerMode mode, uint32_t page_rows,
                      WorkerStats& counts) {
  const uint32_t block = r.prefix.block_tokens;
  if (mode == WorkerMode::kResident || block == 0 || page_rows == 0 || r.input.empty()) return;  // no chain named
  const uint64_t blocks = r.input.size() / block;
  counts.prefix_lookups += blocks;
  counts.prefix_shared_pages_granted += m.shared_pages.size();
  const uint64_t usable = (r.input.size() - 1) / page_rows;  // pages wholly before the last input token
  std::vector<uint32_t> imported = SharedPagesKept(m.shared_pages, r.resume.host_backed);
  std::erase_if(imported, [usable](uint32_t j) { return j >= usable; });
  counts.prefix_hits_host += BlocksCovered(imported, page_rows, block, blocks);
  counts.prefill_tokens_saved += static_cast<uint64_t>(imported.size()) * page_rows;
}

absl::StatusOr<bool> PrefixImporter::ImportCached(WorkerRequest& r, std::span<const uint64_t> chain, KvAccess& kv) {
  const uint32_t block = r.prefix.block_tokens;
  if (const PrefixBlock* hit = cache_.Find(chain, block, r.prefix.tenant)) {
    if (absl::Status s = model_->ImportRows(*r.session, block, hit->rows, hit->keys, kv); !s.ok()) return s;
    r.fed += static_cast<Position>(block);
    ++recorder_->counts().prefix_blocks_imported;
    recorder_->counts().prefill_tokens_saved += block;
    return true;
  }
  r.prefix.capture.emplace();
  r.prefix.capture->first = r.fed;
  r.prefix.capture->tokens = block;
  r.prefix.capture->rows.resize(static_cast<size_t>(model_->config().n_sources()));
  return false;
}

void PrefixImporter::InsertCaptured(WorkerRequest& r, std::span<const uint64_t> chain) {
  PrefixBlock& capture = *r.prefix.capture;
  const model::ModelConfig& mc = model_->config();
  for (int i = 0; i < mc.n_indexers(); ++i) {
    std::span<const float> keys = r.session->index_keys(i).subspan(
        static_cast<size_t>(capture.first) * mc.idx_dim, static_cast<size_t>(r.prefix.block_tokens) * mc.idx_dim);
    capture.keys.emplace_back(keys.begin(), keys.end());
  }
  cache_.Insert(chain, r.prefix.block_tokens, *std::move(r.prefix.capture), r.prefix.tenant);
  r.prefix.capture.reset();
  ++recorder_->counts().prefix_blocks_computed;
}

Position PrefixImporter::PrefixEnd(const WorkerRequest& r) {
  // The prefix ends at prefix.tokens; the last input token is always fed by a Step (its logits start decoding).
  return std::min<Position>(static_cast<Position>(r.input.size()) - 1, r.prefix.tokens);
}

absl::StatusOr<Position> PrefixImporter::CopyCachedPrefix(const WorkerRequest& r, model::ModelSession& session,
                                                          KvAccess& kv) {
  const Position block = static_cast<Position>(r.prefix.block_tokens);
  if (cache_.capacity_bytes() == 0 || block == 0 || r.input.empty()) return Position{0};
  const Position last = PrefixEnd(r);
  Position copied = 0;
  for (size_t b = 0; b < r.prefix.hash_ids.size() && copied + block <= last; ++b, copied += block) {
    const PrefixBlock* hit =
        cache_.Peek(std::span<const uint64_t>(r.prefix.hash_ids.data(), b + 1), r.prefix.block_tokens, r.prefix.tenant);
    if (hit == nullptr) break;
    if (absl::Status s = model_->ImportRows(session, r.prefix.block_tokens, hit->rows, hit->keys, kv); !s.ok()) {
      return s;
    }
  }
  return copied;
}

absl::Status PrefixImporter::ImportChunk(WorkerRequest& r, KvAccess& kv) {
  const Position last = PrefixEnd(r);
  // A resume recomputes up to its next host run only (imported there); its rows bypass the row cache meanwhile.
  Position end = std::min({last, r.fed + static_cast<Position>(prefill_chunk_),
                           resumes_->NextHostRow(r.resume, static_cast<Position>(r.input.size()))});
  const Position block = static_cast<Position>(r.prefix.block_tokens);
  const bool cached = cache_.capacity_bytes() > 0 && block > 0 && !ResumeImporter::importing(r.resume);
  const Position first = cached ? r.fed / block * block : 0;
  std::span<const uint64_t> chain;
  if (cached) {
    // Whole blocks go through the row cache (prefix_cache.h): imported when their chain is cached, else computed
    // (still prefill_chunk tokens per iteration) with their rows captured. A chunk never crosses a block's end, so
    // later blocks start on block boundaries.
    end = std::min<Position>(end, first + block);
    const auto b = static_cast<size_t>(first / block);
    const bool whole = first + block <= last && b < r.prefix.hash_ids.size();
    if (whole) chain = std::span<const uint64_t>(r.prefix.hash_ids.data(), b + 1);
    if (whole && r.fed == first && !r.prefix.capture) {
      absl::StatusOr<bool> imported = ImportCached(r, chain, kv);
      if (!imported.ok()) return imported.status();
      if (*imported) return absl::OkStatus();
    }
  }
  std::optional<RowCapture> capture;
  if (r.prefix.capture) capture.emplace(&kv, r.id, &*r.prefix.capture);
  KvAccess& target = capture ? static_cast<KvAccess&>(*capture) : kv;
  std::span<const model::Token> chunk(r.input.data() + r.fed, static_cast<size_t>(end - r.fed));
  if (absl::Status s = model_->ImportPrefix(*r.session, chunk, target); !s.ok()) return s;
  r.fed = end;
  if (r.prefix.capture && r.fed == r.prefix.capture->first + block) InsertCaptured(r, chain);
  return absl::OkStatus();
}

}  // namespace dhs
