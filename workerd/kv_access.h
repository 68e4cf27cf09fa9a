// workerd/kv_access.h: the seam between the model and the KV store that serves it.
//
// The model computes payload rows and selections; a KvAccess stores the rows and, for a batch of ordered
// selections, returns where each selected row's bytes are readable. Two implementations exist:
//   - ResidentKvAccess (workerd/model): every row of every source stays in one device arena (the `resident` mode,
//     the exactness oracle of brief §7);
//   - the hierarchical one (workerd/kv): tail + hot cache + ready map + host recovery (brief §5).
// Exactness contract (brief §7): for the same appended rows, every implementation returns pointers to bytes equal to
// the original row of each selected position, so the model's outputs are bit-identical across implementations.
//
// Sources (brief §2, §5): payload bytes are stored per KV source. A Reuse consumer layer does not call Fetch (it keeps
// the previous consumer's rows); a Reindex consumer calls Fetch with its fresh selection on the same source; an index
// producer's selection drives several follower sources, fetched in one call so the plan is made once.
//
// Thread-safety: implementations are driven by one worker thread; no method is called concurrently.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "common/types.h"

namespace dhs {

// One batch entry of a Fetch: a request's ordered selection (k positions, kNoPosition = -1 for padding).
struct KvQuery {
  RequestId request = 0;
  std::span<const Position> selection;  // k entries, in the model's selection order
  // Output, laid out [source index in the Fetch call][j], i.e. sources.size() * selection.size() entries.
  // rows_out[s * k + j] points at d_KV bytes of row selection[j] of sources[s]; nullptr where selection[j] == -1.
  // A host address where the device's memory is host-visible (the CPU backend, CUDA managed pools), else the device's
  // address of the row (CUDA device memory, read only by kernels). Valid until ReadersDone() for these sources.
  std::span<const uint8_t*> rows_out;
  // The position of the query that made this selection (a round's query j sits at n_r + j, brief §6), or
  // kNoPosition when unknown. A store that serves a round's union through staging (workerd/kv) uses it to group a
  // query's selections (its top-k and its local window) and to check the causal mask; without it the union is still
  // served, checked only against the appended rows.
  Position at = kNoPosition;
};

class KvAccess {
 public:
  virtual ~KvAccess() = default;

  // Stores the payload row (row_bytes(source) bytes) of `position` of `request` for `source`. Positions of one
  // (request, source) arrive in increasing order without gaps, starting at 0. Errors: INVALID_ARGUMENT on a wrong
  // size or out-of-order position; RESOURCE_EXHAUSTED when the store is full.
  virtual absl::Status Append(RequestId request, SourceId source, Position position,
                              std::span<const uint8_t> row) = 0;

  // Stores `count` consecutive rows of `source` from position `first` on (`rows`: count whole rows back to back), as
  // `count` Appends in position order would: same rows stored, same errors (a failure leaves the rows before it
  // stored). Issue 27: a store may move them together (HierarchicalKvAccess: one copy batch per run of rows inside a
  // page instead of one per row; a prepared prefix's imported block is 512 rows per source). The default appends row
  // by row. Errors: as Append; INVALID_ARGUMENT when count is 0 or rows.size() is not a multiple of count.
  virtual absl::Status AppendRun(RequestId request, SourceId source, Position first, uint32_t count,
                                 std::span<const uint8_t> rows) {
    if (count == 0 || rows.size() % count != 0) {
      return absl::InvalidArgumentError("KV: a run of rows needs count > 0 whole rows");
    }
    const size_t row_bytes = rows.size() / count;
    for (uint32_t j = 0; j < count; ++j) {
      if (absl::Status s = Append(request, source, first + static_cast<Position>(j), rows.subspan(j * row_bytes, row_bytes));
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

  // Index keys (resume from host KV, issue 11): the model hands every position's index key of indexer number
  // `indexer` (0 .. n_indexers-1, layer order) as soon as it computed it: keys holds n * d_I floats (idx_dim each) of
  // positions first .. first+n-1 of `request`. A store with a host tier keeps them in the positions' host pages
  // (docs/architecture.md, "Host pages") so that a restarted worker imports them instead of recomputing the history;
  // the default ignores them (ResidentKvAccess: no host tier). Called after the positions' Append of the same step.
  // Errors: INVALID_ARGUMENT (indexer out of range, keys not whole keys), NOT_FOUND (unknown request).
  virtual absl::Status StoreIndexKeys(RequestId request, uint32_t indexer, Position first,
                                      std::span<const float> keys) {
    (void)request, (void)indexer, (void)first, (void)keys;
    return absl::OkStatus();
  }

  // The longest run (rows of one source, AppendRun) a caller appending several sources should pass before the other
  // sources catch up, runs aligned to multiples of it in position: a hierarchical store completes (backs up) a page
  // only when every source holds it, and its tail frees a slot only once the page two tails back is backed up
  // (HierarchicalKvAccess: its page rows p). 0 (the default): position by position, every source at each (Append).
  virtual uint32_t AppendRunRows() const { return 0; }

  // Resolves a batch of selections over the given sources (all of them read with the same selections: one source,
  // or an index producer's followers). Only positions < the request's appended length may be selected.
  // Errors: INVALID_ARGUMENT (position not appended yet, bad request/source), UNAVAILABLE or INTERNAL (a copy failed;
  // nothing of the batch counts as resolved).
  virtual absl::Status Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) = 0;

  // The attention pass that read the rows returned by the last Fetch over `sources` finished (brief §4: readers).
  virtual void ReadersDone(std::span<const SourceId> sources) = 0;

  // The request finished or was cancelled: its rows may be dropped.
  virtual void Release(RequestId request) = 0;

  // Speculative rounds (brief §6 "Commit"; workerd/speculation.h). A verification pass appends rows the round may
  // reject. HoldUnverified: rows of `request` at positions >= `from` appended from now on are unverified: a store with
  // a host tier completes no page holding one (no backup, no kept copy: they never reach the host nor the optional
  // history). `from` >= every source's appended length; the worker passes n_r + 1 before the round's step (the
  // anchor's row at n_r is always kept). CommitVerified: the round is
  // verified: rows at positions >= `length` (>= the held `from`) are dropped on every source, the hold ends, and the
  // pages now complete below `length` are completed as an Append would have (backup or kept copy scheduled).
  // One round at a time: a hold while one is held is refused (its `from` would pass held rows, whose pages would then
  // never be completed).
  // Errors: NOT_FOUND (unknown request), INVALID_ARGUMENT (`from` / `length` out of range: below the rows that are
  // already immutable, or above the appended length), FAILED_PRECONDITION (CommitVerified without a hold,
  // HoldUnverified while one is held),
  // UNIMPLEMENTED (a store that cannot drop rows: the default).
  virtual absl::Status HoldUnverified(RequestId request, Position from) {
    (void)request, (void)from;
    return absl::UnimplementedError("KV store: speculative rounds are not supported");
  }
  virtual absl::Status CommitVerified(RequestId request, Position length) {
    (void)request, (void)length;
    return absl::UnimplementedError("KV store: speculative rounds are not supported");
  }
};

}  // namespace dhs
