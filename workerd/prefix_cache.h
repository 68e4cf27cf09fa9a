// workerd/prefix_cache.h: the prepared-prefix row cache (issue 5; brief §10): the model state of a prefix block is
// produced once and then imported into every request that names the same chain of hash ids, the way a disaggregated
// prefill node hands history to a decode node.
//
// Owns: PrefixBlock (one block's payload rows per source and index keys per indexer), PrefixRowCache (an LRU over
// blocks keyed by the whole chain hash_ids[0..b] and the block size, bounded in bytes) and RowCapture (a KvAccess
// decorator that records the rows one request appends while its block is computed).
//
// Issue 24: with memd's content-addressed host tier (--prefix-sharing on) this cache is the host tier's FRONT, not a
// second copy of it: a block memd granted as shared host pages is imported from host first (no compute, no KV write;
// ResumeImporter), and only the blocks memd did not grant (being written by a concurrent request, evicted, refused by
// a quota, or sharing off) are looked up here (prefix.hits_worker) before they are computed. Its keys carry the tenant
// as memd's addresses do, so two tenants never share a block here either, whatever their hash ids.
//
// Why the whole chain: a block's rows depend on every earlier token (causal attention), so block b is reusable only
// by a request whose blocks 0..b are the same. Mooncake ids are already chained (equal id => equal prefix), but the
// cache does not rely on it: it compares the stored chain, so a digest collision can never import foreign rows.
// Thread-safety: none; the worker's loop thread owns both.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/types.h"
#include "workerd/kv_access.h"

namespace dhs {

// One prefix block of `tokens` positions starting at `first`: rows[s] = tokens * row_bytes(s) bytes of source s in
// position order; keys[i] = tokens * idx_dim floats of indexer i (layer order).
struct PrefixBlock {
  Position first = 0;
  uint32_t tokens = 0;
  std::vector<std::vector<uint8_t>> rows;
  std::vector<std::vector<float>> keys;
  uint64_t bytes() const;  // payload of rows and keys, bytes
};

// Counters of the cache, since start.
struct PrefixCacheStats {
  uint64_t hits = 0;        // blocks imported from the cache
  uint64_t misses = 0;      // blocks computed (and offered to the cache)
  uint64_t inserted = 0;    // blocks stored
  uint64_t evicted = 0;     // blocks dropped to make room (LRU)
  uint64_t bytes = 0;       // bytes held now
  uint64_t blocks = 0;      // blocks held now
};

class PrefixRowCache {
 public:
  // capacity_bytes: the most PrefixBlock::bytes() held at once; 0 disables the cache (every lookup misses, nothing
  // is stored).
  explicit PrefixRowCache(uint64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  uint64_t capacity_bytes() const { return capacity_bytes_; }

  // The block whose chain is `chain` (hash_ids[0..b], b = chain.size() - 1) at block size `block_tokens`, or null.
  // A hit moves the block to the front of the LRU order and counts a hit; a miss counts a miss. The pointer stays
  // valid until the next Insert.
  // `tenant` (SubmitRequest.tenant, empty = the default) is part of the key: another tenant's block is a miss.
  const PrefixBlock* Find(std::span<const uint64_t> chain, uint32_t block_tokens, std::string_view tenant = {});

  // The block of (chain, block_tokens, tenant) like Find, but neither counted nor moved in the LRU order: a read on
  // another's behalf (the synthetic proposer's copy of a request's prefix, issue 27), not a use by a request.
  const PrefixBlock* Peek(std::span<const uint64_t> chain, uint32_t block_tokens, std::string_view tenant = {});

  // Stores `block` for (chain, block_tokens), evicting least recently used blocks until it fits. A block larger than
  // the capacity, or a chain already present, is not stored. Returns whether it was stored.
  bool Insert(std::span<const uint64_t> chain, uint32_t block_tokens, PrefixBlock block, std::string_view tenant = {});

  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Entry {
    std::vector<uint64_t> chain;
    uint32_t block_tokens = 0;
    std::string tenant;
    uint64_t digest = 0;  // Digest(chain, block_tokens, tenant): its bucket in by_digest_
    PrefixBlock block;
  };
  using Lru = std::list<Entry>;
  static uint64_t Digest(std::span<const uint64_t> chain, uint32_t block_tokens, std::string_view tenant);
  Lru::iterator Lookup(std::span<const uint64_t> chain, uint32_t block_tokens, std::string_view tenant);

  uint64_t capacity_bytes_;
  Lru lru_;  // front = most recently used
  absl::flat_hash_map<uint64_t, std::vector<Lru::iterator>> by_digest_;
  PrefixCacheStats stats_;
};

// Forwards every call to `inner` and, for `request`, also copies each appended row into `block->rows[source]` (the
// caller sized `rows` to the number of sources and appends in position order, brief §2 Append contract).
class RowCapture final : public KvAccess {
 public:
  RowCapture(KvAccess* inner, RequestId request, PrefixBlock* block) : inner_(inner), request_(request), block_(block) {}

  absl::Status Append(RequestId request, SourceId source, Position position, std::span<const uint8_t> row) override;
  absl::Status Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) override {
    return inner_->Fetch(sources, batch);
  }
  void ReadersDone(std::span<const SourceId> sources) override { inner_->ReadersDone(sources); }
  void Release(RequestId request) override { inner_->Release(request); }
  absl::Status StoreIndexKeys(RequestId request, uint32_t indexer, Position first,
                              std::span<const float> keys) override {
    return inner_->StoreIndexKeys(request, indexer, first, keys);
  }

 private:
  KvAccess* inner_;
  RequestId request_;
  PrefixBlock* block_;
};

}  // namespace dhs
