// workerd/kv/resolver.h: the fused resolver (brief §5) and its oracle, ReferenceResolver.
//
// Input: a batch of (request, ordered selection of k distinct positions, -1 = empty) over one group's sources; a
// position selected twice in one query is INVALID_ARGUMENT (a top-k selection never repeats one; the LRU order a
// repeated miss would give is left undefined). Several queries of one request may select the same rows. Output: for
// each source s (index si in `sources`) and entry j, out[si * k + j] = the row's byte offset in the KV pool, -1 kept.
// Steps, per query: (1) direct: tail or ready map; (2) hot cache: hits touched (LRU), every slot selected in this
// step protected, unselected LRU slots are victims; the scan is skipped only when every selected row resolved
// directly; (3) host recovery: each remaining miss is copied from its host page into a victim slot, per source.
// Fused: one pass over the batch, all copies issued (one batch per source) and waited once; cost bounded by B and k.
// Rows adjacent in both the host pool and the KV pool are issued as one copy (same bytes, fewer ops).
// Failure of any copy: nothing of the batch counts as resolved (census untouched), every hot slot the batch targeted
// is invalidated (every query is planned before any copy: the hits of every query stay touched), the call returns
// the copy's error. Hot caches are per (request slot, group): no request ever sees another's rows.
// Any error (validation, planning or copy): every entry of every query's `out` is -1, the census is untouched, and
// every hot slot the batch claimed for a miss is invalidated (its bytes may never have been copied), so a slot the
// cache maps to row t always holds t's original bytes. Hits touched before a planning error stay touched.
// Census (per group): selected rows resolved direct / hot / host, hot-cache scans skipped, bytes recovered.
// Host-page integrity (ResolverEnv.verify_host_page): the page of each host-recovery miss is verified before its
// bytes are copied, once per page (KvPage::Verified); a mismatch is DATA_LOSS with the effects of any error.
//
// Thread-safety: none; driven by the worker thread. Copies run on the Device.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workerd/device/device.h"
#include "workerd/kv/hot_cache.h"
#include "workerd/kv/layout.h"
#include "workerd/kv/request_kv.h"

namespace dhs {

struct Census {
  uint64_t direct = 0;           // selected rows found in the tail or the ready map
  uint64_t hot = 0;              // selected rows found in the hot cache
  uint64_t host = 0;             // selected rows recovered from the host tier
  uint64_t scans_skipped = 0;    // queries whose rows all resolved directly
  uint64_t bytes_recovered = 0;  // host->device bytes, all sources of the group
  bool operator==(const Census&) const = default;
  // The one way to add censuses (groups, workers, runs).
  Census& operator+=(const Census& o) {
    direct += o.direct;
    hot += o.hot;
    host += o.host;
    scans_skipped += o.scans_skipped;
    bytes_recovered += o.bytes_recovered;
    return *this;
  }
};

struct ResolveQuery {
  RequestKv* kv = nullptr;
  std::span<const Position> selection;  // k entries, distinct but for -1
  std::span<Location> out;              // sources.size() * k entries
};

// Host-page integrity (issue 22): called during planning for the page of every host-recovery miss whose KvPage is
// not Verified() yet, before any of its bytes is copied; moves it to HostCopy::kVerified when the page matches its checksum, returns
// DATA_LOSS when it does not (the batch then fails as after a planning error: nothing resolved, claimed slots
// invalidated). HierarchicalKvAccess::VerifyHostPage is the one implementation.
using HostPageVerifier = std::function<absl::Status(RequestKv& kv, uint32_t page)>;

// What the resolver works on: the KV pool on the device and the host pool (host page h at h * host_page_bytes).
struct ResolverEnv {
  const KvLayout* layout = nullptr;
  Device* device = nullptr;
  PoolId pool = 0;
  std::span<uint8_t> host_pool;
  HostPageVerifier verify_host_page;  // empty: host pages are not verified (states built by hand in tests, benchmarks)
};

class Resolver {
 public:
  virtual ~Resolver() = default;
  // Empties the hot caches of `slot` (a request was admitted into it).
  virtual void ResetSlot(SlotIndex slot) = 0;
  // Resolves the batch over `sources`: every source of group `group` exactly once, in any order (the hot cache of a
  // request is shared by the group's sources: a slot filled for a subset would be a hit with stale bytes for the
  // others). Errors: INVALID_ARGUMENT (bad sizes, position not appended, position repeated in one query, source
  // outside the group, not the whole group or a source twice), RESOURCE_EXHAUSTED (one step's union of a request
  // exceeds B), INTERNAL (a row with neither a GPU nor a host copy), the copy's error (UNAVAILABLE) when a recovery
  // copy, or the write of a selected tail row, failed. Effects of an error: see the top of this file.
  virtual absl::Status Resolve(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch) = 0;
  const Census& census(uint32_t group) const { return census_[group]; }
  // The row that hot slot h (< B) of (request slot, group) holds, kNoPosition when empty; for checks and tests.
  // Invariant (brief §7): the slot's bytes of every source of the group are that row's original bytes.
  virtual Position HotPosition(SlotIndex slot, uint32_t group, uint32_t h) const = 0;
  // Whether the hot cache of (request slot, group) holds row t now (a hit if selected in the next step), without
  // touching it: the union plan's view of the hot cache (HierarchicalKvAccess's staging path, brief §6).
  virtual bool HotHolds(SlotIndex slot, uint32_t group, Position t) const = 0;

 protected:
  explicit Resolver(const ResolverEnv& env) : env_(env), census_(env.layout->config().groups.size()) {}
  absl::Status Validate(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch) const;
  const uint8_t* HostRow(const KvPage& page, SourceId s, Position t) const;
  // The page of host-recovery miss t verified (env_.verify_host_page; OK without one or when verified before).
  absl::Status VerifyHostPage(RequestKv& kv, Position t) const;

  ResolverEnv env_;
  std::vector<Census> census_;

 private:
  // Validate's steps (resolver.cc).
  absl::Status ValidateSources(uint32_t group, std::span<const SourceId> sources) const;
  absl::Status ValidateQuery(std::span<const SourceId> group_sources, size_t num_sources,
                             const ResolveQuery& q) const;
  // Every position of q.selection (each in [-1, n)) at most once.
  absl::Status CheckDistinct(const ResolveQuery& q, Position n) const;

  struct SeenEntry {
    Position t = kNoPosition;
    uint32_t stamp = 0;  // the query that wrote it; other stamps are empty
  };
  mutable std::vector<SeenEntry> seen_;  // Validate's duplicate check (scratch, power-of-two size)
  mutable uint32_t seen_stamp_ = 0;
  mutable std::vector<uint64_t> seen_bits_;  // the bitmap form of the check, for short requests (resolver.cc)
};

// A planned batch of the fused resolver: the shared position->slot plan of one group, ready to issue each
// follower's copies separately (brief §5: plan once per producer, copy per follower, prefetch the next follower).
class PlannedBatch;
struct PlannedBatchDeleter {
  void operator()(PlannedBatch* p) const;  // defined in resolver.cc, where PlannedBatch is complete
};
using PlannedBatchPtr = std::unique_ptr<PlannedBatch, PlannedBatchDeleter>;

class FusedResolver final : public Resolver {
 public:
  explicit FusedResolver(const ResolverEnv& env);
  ~FusedResolver() override;

  void ResetSlot(SlotIndex slot) override;
  absl::Status Resolve(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch) override;
  Position HotPosition(SlotIndex slot, uint32_t group, uint32_t h) const override {
    return caches_[slot * groups_ + group].PositionAt(h);
  }
  bool HotHolds(SlotIndex slot, uint32_t group, Position t) const override {
    return caches_[slot * groups_ + group].Find(t) != HotCache::kNone;
  }

  // Steps 1-2 and the victim choice for every query; no copy is issued yet. The batch's spans must stay valid
  // until Finish. At most one planned batch per group may be open. Validation and planning errors as Resolve's, with
  // the same effects (outputs -1, claimed slots invalidated).
  absl::StatusOr<PlannedBatchPtr> Plan(uint32_t group, std::span<const SourceId> sources,
                                                     std::span<ResolveQuery> batch);
  // Issues the host-recovery copies of follower `source_index` (index into `sources`) and writes its output
  // locations. The returned event covers those copies and the tail writes that follower reads.
  CopyEvent IssueFollower(PlannedBatch& plan, size_t source_index);
  // Issues any follower not issued yet, waits every follower's event once, then commits the census, or on a
  // failure invalidates the planned hot slots and returns the error.
  absl::Status Finish(PlannedBatchPtr plan);

 private:
  HotCache& Cache(SlotIndex slot, uint32_t group) { return caches_[slot * groups_ + group]; }
  // Plan's steps for query qi of `plan` (resolver.cc).
  absl::Status PlanQuery(PlannedBatch& plan, size_t qi, uint64_t step);
  absl::StatusOr<size_t> PlanDirect(PlannedBatch& plan, size_t qi) const;
  void PlanHotHits(PlannedBatch& plan, size_t qi, HotCache& hc, uint64_t step);
  absl::Status PlanMisses(PlannedBatch& plan, size_t qi, HotCache& hc, uint64_t step);
  absl::Status FailPlan(PlannedBatch& plan, absl::Status status);

  uint32_t groups_;
  std::vector<HotCache> caches_;
  uint64_t step_ = 0;
  std::vector<HostToDeviceCopy> ops_;  // IssueFollower's scratch (the device copies the ops it is given)
  std::vector<CopyEvent> after_;
  PlannedBatchPtr spare_;  // the last finished batch, reused by the next Plan (its vectors keep their capacity)
};

// The oracle: a simple per-query loop (linear scans, LRU by stamps), every query of the batch planned before any
// copy, then copies issued and waited one row at a time. Same locations, census, errors and hot-cache state
// (HotPosition, later victims) as FusedResolver for the same inputs, after a failed step too.
class ReferenceResolver final : public Resolver {
 public:
  explicit ReferenceResolver(const ResolverEnv& env);
  void ResetSlot(SlotIndex slot) override;
  absl::Status Resolve(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch) override;
  Position HotPosition(SlotIndex slot, uint32_t group, uint32_t h) const override {
    return caches_[slot * groups_ + group].pos[h];
  }
  bool HotHolds(SlotIndex slot, uint32_t group, Position t) const override {
    const std::vector<Position>& pos = caches_[slot * groups_ + group].pos;
    return t != kNoPosition && std::find(pos.begin(), pos.end(), t) != pos.end();
  }

 private:
  struct Slots {
    std::vector<Position> pos;
    std::vector<int64_t> last_use;
    std::vector<uint64_t> stamp;
  };
  struct Planned;  // the batch's plan: entries, claimed slots, census (resolver.cc)
  void Reset(Slots& c);
  // Resolve's steps (resolver.cc).
  absl::Status PlanQuery(Planned& p, uint32_t group, const ResolveQuery& q, size_t qi, uint64_t step);
  absl::StatusOr<bool> PlanDirect(Planned& p, uint32_t group, const ResolveQuery& q, size_t qi) const;
  absl::Status PlanHot(Planned& p, Slots& hc, const ResolveQuery& q, size_t qi, uint64_t step);
  static int64_t Scan(const Slots& hc, Position t);
  static int64_t Victim(const Slots& hc, uint64_t step);
  absl::Status EmitQuery(Planned& p, std::span<const SourceId> sources, const ResolveQuery& q, size_t qi);
  absl::Status RecoverRow(Planned& p, const ResolveQuery& q, SourceId s, Position t, Location dst);
  absl::Status Fail(Planned& p, std::span<ResolveQuery> batch, absl::Status status);
  uint32_t groups_;
  std::vector<Slots> caches_;
  uint64_t step_ = 0;
  int64_t clock_ = 0;
  int64_t low_ = 0;
};

}  // namespace dhs
