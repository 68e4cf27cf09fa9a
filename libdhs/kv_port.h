// libdhs/kv_port.h: the KV data path of libdhs (issue 25), below the C ABI's argument checks and above the KV store:
// what dhs_request_append_source / dhs_request_append_keys / dhs_resolve / dhs_readers_done / dhs_request_hold /
// dhs_request_commit do, checked, over one PortStore: the HierarchicalKvAccess (tail, hot cache, ready map, host
// copies, the fused resolver), or in workerd's resident mode its ResidentKvAccess (every row resident). Two callers use the same object: libdhs's EmbeddedWorker (an engine's calls), and workerd's Worker, whose
// built-in model reaches the hierarchy only through a PortKvAccess over it (issue 25, "workerd uses it": every
// exactness, resume, chaos and speculation test of workerd drives this path).
//
// Owns: only the readers outstanding per group (which requests a group's rows were resolved for since its last
// ReadersDone). Every other fact it checks is the store's own (rows appended per source, the speculative hold): one
// owner, read through the store's accessors, so a release or a rebuild below it never leaves it stale.
//
// Rules it enforces (each a clear error, nothing changed, never a hang):
//   - positions of one source arrive in order; a held round's rows fit the tail (workerd's K_max <= T - p + 1);
//   - a resolve names exactly one group's sources (an index producer's followers: one plan, brief §5), positions
//     below the rows every named source holds, at most k per query;
//   - a request is not resolved again on a group before that group's ReadersDone: the second resolve could wait on
//     the caller's own thread for readers only that thread can end (found by the libFuzzer run of fuzz/libdhs_fuzz.cc);
//   - hold from at least the most rows a source holds; commit at most the fewest;
//   - host-backed pages (a resume's, shared prefix pages) are imported only after their check against memd's checksums
//     (VerifyHostPages), made host-ready before any row of theirs is appended (MakeHostReady), and taken as appended
//     only at the rows every source holds (ImportRows): recomputed rows and imported runs alternate in position order.
//
// Thread-safety: none; the owner's thread drives it (libdhs: the handle's mutex; workerd: the worker thread).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/kv_access.h"
#include "workerd/resume_plan.h"

namespace dhs::lib {

// The store below a KvPort: the model's KvAccess, the facts the port's checks read (its shape, rows appended per
// source, the speculative hold, the tail's room while host writes pause) and the host tier's imports. Two stores:
// HierarchicalPortStore (below: tail, hot cache, ready map, host tier) and resident mode's (workerd/kv_stack.h:
// every row resident, no tail bound, no host tier: its host calls answer FAILED_PRECONDITION).
class PortStore {
 public:
  virtual ~PortStore() = default;
  virtual KvAccess& kv() = 0;
  // The shape: row_bytes per source, groups, key_bytes per indexer, page_rows, tail_rows, k.
  virtual const KvConfig& config() const = 0;
  // Rows `source` of `request` holds (0 for an unknown request); the speculative hold's `from` (-1: none).
  virtual Position AppendedRows(RequestId request, SourceId source) const = 0;
  virtual Position HoldFrom(RequestId request) const = 0;
  // Whether a held round's rows must fit the tail (a store whose tail slots are reused: KvPort::CheckHeldRoom).
  virtual bool bounded_tail() const = 0;
  // Host writes paused (memd away) and whether `rows` more rows of `source` fit its tail without a host write.
  virtual bool host_writes_paused() const = 0;
  virtual bool TailHasRoom(RequestId request, SourceId source, Position rows) const = 0;
  // The host tier (HierarchicalKvAccess's CheckHostCopies, ImportHostPages, ImportHostRows).
  virtual absl::StatusOr<std::vector<uint32_t>> CheckHostCopies(RequestId request, std::span<const uint32_t> pages,
                                                                std::span<const uint64_t> checksums) = 0;
  virtual absl::Status ImportHostPages(RequestId request, std::span<const uint32_t> pages,
                                       std::span<const uint64_t> checksums) = 0;
  virtual absl::Status ImportHostRows(RequestId request, uint32_t first, uint32_t count,
                                      std::vector<std::vector<float>>& keys_out) = 0;
};

// The hierarchical store as a KvPort sees it (`kv` must outlive it).
class HierarchicalPortStore final : public PortStore {
 public:
  explicit HierarchicalPortStore(HierarchicalKvAccess* kv) : kv_(kv) {}
  KvAccess& kv() override { return *kv_; }
  const KvConfig& config() const override { return kv_->layout().config(); }
  Position AppendedRows(RequestId request, SourceId source) const override {
    return kv_->AppendedRows(request, source);
  }
  Position HoldFrom(RequestId request) const override { return kv_->HoldFrom(request); }
  bool bounded_tail() const override { return true; }
  bool host_writes_paused() const override { return kv_->host_writes_paused(); }
  bool TailHasRoom(RequestId request, SourceId source, Position rows) const override {
    return kv_->TailHasRoom(request, source, rows);
  }
  absl::StatusOr<std::vector<uint32_t>> CheckHostCopies(RequestId request, std::span<const uint32_t> pages,
                                                        std::span<const uint64_t> checksums) override {
    return kv_->CheckHostCopies(request, pages, checksums);
  }
  absl::Status ImportHostPages(RequestId request, std::span<const uint32_t> pages,
                               std::span<const uint64_t> checksums) override {
    return kv_->ImportHostPages(request, pages, checksums);
  }
  absl::Status ImportHostRows(RequestId request, uint32_t first, uint32_t count,
                              std::vector<std::vector<float>>& keys_out) override {
    return kv_->ImportHostRows(request, first, count, keys_out);
  }

 private:
  HierarchicalKvAccess* kv_;
};

class KvPort {
 public:
  // `store` must outlive the port. The groups are the store's (KvConfig.groups).
  explicit KvPort(PortStore* store);

  PortStore& store() const { return *store_; }
  uint32_t sources() const { return static_cast<uint32_t>(group_of_.size()); }
  uint32_t GroupOf(SourceId source) const { return group_of_[source]; }
  // The rows `source` of `request` holds; the fewest and the most over every source (0 for an unknown request).
  Position Rows(RequestId request, SourceId source) const { return store_->AppendedRows(request, source); }
  Position Fewest(RequestId request) const;
  Position Most(RequestId request) const;

  // `count` rows of `source` (count * d_KV bytes) from `first`, which must be the rows that source holds;
  // max_rows > 0 bounds first + count. A failure after some rows leaves them appended (the message says how many).
  // Errors: INVALID_ARGUMENT (source, sizes), OUT_OF_RANGE (not the next position, beyond max_rows),
  // RESOURCE_EXHAUSTED (a held round's rows beyond the tail; the tail full: a page without a host copy yet, or memd
  // away); the store's errors.
  absl::Status AppendSource(RequestId request, SourceId source, Position first, uint32_t count,
                            std::span<const uint8_t> rows, uint64_t max_rows = 0);
  // Indexer `indexer`'s keys (count * d_idx bytes) of positions first .. first+count-1, each held by some source.
  // Errors: INVALID_ARGUMENT (indexer, sizes), OUT_OF_RANGE (a position on no source), FAILED_PRECONDITION (a page
  // whose host copy was confirmed: HierarchicalKvAccess::StoreIndexKeys).
  absl::Status AppendKeys(RequestId request, uint32_t indexer, Position first, uint32_t count,
                          std::span<const uint8_t> keys);

  // One query: its selection (<= k positions, -1 padding), rows_out (sources.size() * selection.size() entries,
  // [source as named][j]: the row's bytes, nullptr for padding; valid until ReadersDone of the group) and the
  // position of the query that made it (KvQuery.at: a speculative round's union is grouped by it; -1 unknown).
  struct Query {
    RequestId request = 0;
    std::span<const Position> selection;
    std::span<const uint8_t*> rows_out;
    Position at = kNoPosition;
  };
  // Resolves the batch over `sources`, exactly the sources of one group in any order (the caller checked that each
  // request may be resolved: libdhs its phase). Errors: INVALID_ARGUMENT (sources, sizes, a selection longer than
  // k), FAILED_PRECONDITION (a request resolved on this group since its ReadersDone), OUT_OF_RANGE (a position beyond
  // the rows of a named source); the store's errors (nothing counts as resolved).
  absl::Status Resolve(std::span<const SourceId> sources, std::span<Query> queries);
  // Ends the readers of every group among `sources`. Errors: INVALID_ARGUMENT (a source out of range).
  absl::Status ReadersDone(std::span<const SourceId> sources);
  // RESOURCE_EXHAUSTED when `request` holds a speculative round and positions first .. first+count-1 would not fit
  // the tail before its commit (AppendSource's rule; dhs_request_append checks it for the whole call up front).
  absl::Status CheckHeldRoom(RequestId request, Position first, uint32_t count) const;
  // Whether any group has readers outstanding; one source of each group with readers of `request` outstanding.
  bool ReadersOutstanding() const { return !unread_.empty(); }
  std::vector<SourceId> UnreadGroupsOf(RequestId request) const;
  // Ends every group's readers (closing: nobody reads the pool any more).
  void EndAllReaders();

  // Host-backed pages (issue 11 resume, issue 22 integrity, issue 24 shared prefix pages; workerd/resume_plan.h).
  // VerifyHostPages: `backed` (ascending, each with memd's checksum) checked against the host bytes
  // (HierarchicalKvAccess::CheckHostCopies); returns those that match, in order: the others' rows are recomputed.
  // MakeHostReady: `backed` host-ready (HierarchicalKvAccess::ImportHostPages, checksums recorded): their confirmed
  // copies are never written again, whether their rows are imported or recomputed; before any row is appended, and
  // again after a release (a rebuild). ImportRows: pages first .. first+count-1 (host-ready) taken as appended without
  // computing them; every source must hold first * p rows; keys_out[i] receives indexer i's keys of their positions.
  // Errors: NOT_FOUND (unknown request), FAILED_PRECONDITION (rows appended already / not first * p on every source,
  // a page not host-ready or without a planned host page), INVALID_ARGUMENT (count 0); the store's errors.
  absl::StatusOr<std::vector<HostBackedPage>> VerifyHostPages(RequestId request, std::vector<HostBackedPage> backed);
  absl::Status MakeHostReady(RequestId request, std::span<const HostBackedPage> backed);
  // A grant's host-backed pages (`granted`: GrantHostBacked of its AdmitGrant, a resume's pages and shared prefix
  // pages), taken at the grant by both programs (libdhs's EmbeddedWorker::OnAdmitGrant, workerd's
  // ResumeImporter::OnGrant), after the agent planned the request and before any row of it is appended: checked
  // (VerifyHostPages) and those that match made host-ready (MakeHostReady). `pages`: those that matched, ascending;
  // `mismatched`: how many did not (their rows are recomputed; their confirmed copies are written again only with
  // the same rows). Errors: VerifyHostPages' and MakeHostReady's (the request must end).
  struct GrantedHostPages {
    std::vector<HostBackedPage> pages;
    size_t mismatched = 0;
  };
  absl::StatusOr<GrantedHostPages> TakeGrantedHostPages(RequestId request, std::vector<HostBackedPage> granted);
  absl::Status ImportRows(RequestId request, uint32_t first, uint32_t count,
                          std::vector<std::vector<float>>& keys_out);

  // Speculative rounds (brief §6): rows at positions >= from appended from now on are unverified; from >= the most
  // rows a source holds (max_rows > 0 bounds it). Commit keeps positions < length on every source (held from <=
  // length <= the fewest rows a source holds). Errors: OUT_OF_RANGE, FAILED_PRECONDITION (commit without a hold,
  // hold while one is held); the store's errors.
  absl::Status Hold(RequestId request, Position from, uint64_t max_rows = 0);
  absl::Status Commit(RequestId request, Position length);

  // What went through the port (rows of one source count once each; queries of a successful resolve).
  struct Counters {
    uint64_t rows_appended = 0, keys_stored = 0, queries_resolved = 0, resolves = 0, holds = 0, commits = 0;
    uint64_t pages_verified = 0, pages_mismatched = 0, pages_imported = 0;  // host-backed pages
  };
  const Counters& counters() const { return counters_; }

 private:
  PortStore* store_;
  std::vector<uint32_t> group_of_;             // per source
  std::vector<std::vector<SourceId>> groups_;  // per group, its sources
  std::map<uint32_t, std::set<RequestId>> unread_;  // per group: requests resolved since its last ReadersDone
  Counters counters_;
};

// The model's KvAccess over a KvPort: workerd's Worker gives its model this instead of the store itself (every mode), so the built-in model's appends, index keys, fetches, readers and speculative rounds are libdhs's data path.
// Append / AppendRun -> AppendSource; StoreIndexKeys -> AppendKeys; Fetch -> Resolve (KvQuery.at kept); ReadersDone;
// HoldUnverified / CommitVerified -> Hold / Commit; Release -> the store's (the agent releases through the store).
class PortKvAccess final : public KvAccess {
 public:
  // `port` (and its store) must outlive it.
  explicit PortKvAccess(KvPort* port) : port_(port), kv_(&port->store().kv()), config_(&port->store().config()) {}
  absl::Status Append(RequestId request, SourceId source, Position position, std::span<const uint8_t> row) override;
  absl::Status AppendRun(RequestId request, SourceId source, Position first, uint32_t count,
                         std::span<const uint8_t> rows) override;
  absl::Status StoreIndexKeys(RequestId request, uint32_t indexer, Position first,
                              std::span<const float> keys) override;
  uint32_t AppendRunRows() const override { return kv_->AppendRunRows(); }
  absl::Status Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) override;
  void ReadersDone(std::span<const SourceId> sources) override;
  void Release(RequestId request) override { kv_->Release(request); }
  absl::Status HoldUnverified(RequestId request, Position from) override { return port_->Hold(request, from); }
  absl::Status CommitVerified(RequestId request, Position length) override { return port_->Commit(request, length); }

 private:
  KvPort* port_;
  KvAccess* kv_;
  const KvConfig* config_;
};

}  // namespace dhs::lib
