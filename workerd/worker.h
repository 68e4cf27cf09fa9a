// workerd/worker.h: the serving core of one worker (brief §3, §4, §5, §7, §11): continuous batching over the built-in
// model, the three KV modes, and the worker side of the memd conversation (docs/protocol.md, conversation contract).
//
// Owns the KV store of its GPU (ResidentKvAccess in `resident` mode, HierarchicalKvAccess otherwise), the requests'
// model sessions and the state of memd's orders. Sockets are not its business: memd is reached through a MemdLink and
// answers through the MemdHandler methods; clients through a ClientSink.
//
// The loop (Iterate, one call per iteration): (1) poll the KV copies and report completions to memd (deferred
// BackupComplete order 0, ReadyPublish after a populate copy completed, BackupComplete / ReadersDone of reclaim
// orders); (2) start granted requests while a slot is free; (3) one Model::Step over every active request: a chunk of
// the prompt for a prefilling request, the last generated token for a decoding one (a prepared prefix is imported with
// Model::ImportPrefix chunk by chunk, its last token joins the step); (4) sample (greedy at temperature 0, else the
// seeded sampler), stream a TokenChunk per token with its logits digest, complete finished requests (Complete to memd,
// KV released). A failed batched step rebuilds each request of the batch alone (its KV replayed from its tokens,
// bit-identical by batch invariance, brief §11); a request whose own step still fails ends with an error chunk.
//
// Modes (WorkerMode): resident: every row on GPU, required pages = whole context; hisparse: hierarchical KV, every
// completed page backed up to its host page, no optional history; adaptive: hierarchical with resident-first optional
// history (brief §4): completed imported pages with a granted optional GPU page are kept there without host backup,
// backed up only on a ReclaimOrder.
//
// Thread-safety: none; one worker thread drives every method.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "dhs_generated.h"
#include "workerd/device/device.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/kv_access.h"
#include "workerd/memd_link.h"
#include "workerd/model/model.h"
#include "workerd/model/sampling.h"
#include "workerd/prefix_cache.h"
#include "workerd/serving.h"

namespace dhs {

enum class WorkerMode { kResident, kHisparse, kAdaptive };
std::string_view WorkerModeName(WorkerMode mode);
// "resident" | "hisparse" | "adaptive"; else INVALID_ARGUMENT.
absl::StatusOr<WorkerMode> ParseWorkerMode(std::string_view name);

struct WorkerConfig {
  GpuId gpu = 0;
  WorkerMode mode = WorkerMode::kAdaptive;
  uint64_t hbm_budget_bytes = uint64_t{64} << 20;  // GPU KV budget, bytes: M = budget / page_bytes
  uint32_t slots = 8;                // N request slots
  uint32_t hot_rows = 0;             // B per slot and source; 0 = max(64, 4 * (k + local_window))
  uint32_t tail_rows = 0;            // T per slot and source, a multiple of p; 0 = 2 * p
  uint32_t page_rows = 64;           // p
  uint64_t max_context_tokens = 131072;  // prompt + max_new_tokens limit per request, tokens
  uint64_t prefix_cache_bytes = uint64_t{256} << 20;  // prepared-prefix row cache (prefix_cache.h), bytes; 0 = off
  uint32_t prefill_chunk = 0;        // prompt tokens fed per request and step; 0 = auto: B / (k + window) in every
                                     // mode, so one step's selections fit the hot cache and the modes interleave
                                     // prefill with decode alike
};

// The sizes derived from the model and the config (brief §8).
struct WorkerGeometry {
  uint64_t page_bytes = 0;       // p * sum of d_KV over payload sources (contract "Units")
  uint32_t capacity_pages = 0;   // M
  uint32_t hot_rows = 0;         // B
  uint32_t tail_rows = 0;        // T
  uint32_t prefill_chunk = 0;    // tokens
  KvConfig kv;                   // the hierarchical layout (optional_pages = M)
};
// Errors: INVALID_ARGUMENT (p = 0, T not a multiple of p, B < k + window, budget below one page).
absl::StatusOr<WorkerGeometry> ComputeGeometry(const model::ModelConfig& model, const WorkerConfig& config);

// The Hello of this worker (contract §1).
wire::HelloT MakeHello(const model::ModelConfig& model, const WorkerConfig& config, const WorkerGeometry& geometry,
                       std::string_view device_name);

// Counters since start (WorkerStatsReply).
struct WorkerStats {
  Census census;                 // summed over groups
  uint64_t reclaims_obeyed = 0;
  uint64_t pages_reclaimed = 0;
  uint64_t pages_populated = 0;
  uint64_t pages_kept = 0;
  uint64_t pages_backed_up = 0;
  uint64_t finished_requests = 0;
  uint64_t failed_requests = 0;
  uint64_t tokens_generated = 0;
  uint64_t prefix_blocks_imported = 0;  // prepared-prefix blocks imported from the row cache (not computed)
  uint64_t prefix_blocks_computed = 0;  // prepared-prefix blocks computed (and offered to the cache)
};

class Worker final : public MemdHandler {
 public:
  // `model`, `device`, `memd`, `client` must outlive the Worker. `host_pool`: the mapped host-pool pages of segment 0
  // (HostPoolSegment::PageData(0), pages * page_bytes bytes); may be empty in resident mode.
  // Errors: INVALID_ARGUMENT (config, see ComputeGeometry; host pool not whole pages), RESOURCE_EXHAUSTED (device).
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const model::Model* model, Device* device,
                                                        const WorkerConfig& config, std::span<uint8_t> host_pool,
                                                        MemdLink* memd, ClientSink* client);
  ~Worker() override;

  // A client's request. Validates it (ValidateSubmit; duplicate id -> ALREADY_EXISTS), sends SubmitAccepted to the
  // client and AdmitRequest to memd. A returned error is the client's ErrorReply; nothing else changed.
  absl::Status Submit(const wire::SubmitRequestT& submit, const ClientRef& client);

  // One iteration of the serving loop (header comment). Returns whether work remains (requests active, waiting for a
  // grant, or orders in flight). Errors: only an internal inconsistency; request failures end their request.
  absl::StatusOr<bool> Iterate();

  // MemdHandler: memd's messages (contract §2, §4, §5, §6).
  void OnAdmitGrant(const wire::AdmitGrantT& m) override;
  void OnAdmitWait(const wire::AdmitWaitT& m) override;
  void OnAdmitReject(const wire::AdmitRejectT& m) override;
  void OnReclaimOrder(const wire::ReclaimOrderT& m) override;
  void OnRetire(const wire::RetireT& m) override;
  void OnPopulateOrder(const wire::PopulateOrderT& m) override;
  void OnCompleteAck(const wire::CompleteAckT& m) override;

  WorkerStats stats() const;
  wire::WorkerStatsReplyT StatsReply() const;
  const WorkerGeometry& geometry() const { return geometry_; }
  const WorkerConfig& config() const { return config_; }
  uint32_t active_requests() const;
  uint32_t waiting_requests() const;
  // Copies and orders in flight (Heartbeat.pending_copies).
  uint32_t pending_orders() const {
    return static_cast<uint32_t>(reclaims_.size() + populates_.size() + cancelled_populates_.size());
  }
  // Test/introspection: the hierarchical KV store, or nullptr in resident mode.
  HierarchicalKvAccess* hierarchical() { return hier_; }

 private:
  enum class Phase { kWaitGrant, kGranted, kActive };
  struct Request {
    RequestId id = 0;
    ClientRef client;
    Phase phase = Phase::kWaitGrant;
    std::vector<model::Token> input;   // prepared prefix (if any) then prompt
    Position prefix_tokens = 0;        // leading input tokens imported with ImportPrefix (the prepared prefix)
    std::vector<uint64_t> hash_ids;    // the prefix's block chain (row-cache keys)
    uint32_t prefix_block_tokens = 0;  // tokens per block
    std::optional<PrefixBlock> capture;  // the block being computed, captured for the row cache
    uint32_t max_new = 0;
    model::SamplingParams sampling;
    bool greedy = true;
    std::mt19937_64 rng;
    std::optional<model::ModelSession> session;
    Position fed = 0;                  // tokens fed to the model (input, then generated)
    std::vector<model::Token> generated;
    std::vector<PageIndex> host_pages;          // host page by history page (grant)
    std::map<uint32_t, PageIndex> optional;     // history page -> optional GPU page currently held
    std::set<uint32_t> reported_backups;        // history pages reported to memd with a host copy
    std::chrono::steady_clock::time_point submitted, granted;
    uint64_t ttft_us = 0;
  };
  struct Reclaim {
    wire::ReclaimOrderT order;
    // BackupComplete (contract §4) names every backup page of the order and goes out once all of them have a written
    // host copy, or (ok = false) once a copy failed and none of the order's copies is still in flight.
    // awaiting: history pages whose host copy is not written yet: copies in flight, and pages the victim is still
    // writing (planned to be kept, the backup replaces the keep and is issued when the page completes). Their
    // completions come from ReportKvCompletions (reclaim_backup_of_), never as a BackupComplete with order 0.
    std::set<uint32_t> awaiting;
    // Pages only planned to be kept when the order came (history page -> GPU page): kept again if the order fails,
    // since memd then leaves the victim's pages as they were.
    std::map<uint32_t, PageIndex> planned;
    // GPU pages of backup_pages only planned to be kept and not written yet (a subset of planned's pages): reported
    // as BackupComplete.deferred_pages; their host copy goes out later with order 0.
    std::vector<PageIndex> deferred;
    std::vector<uint32_t> backup_history;  // history pages of the order's backup pages, deferred ones excepted
    uint64_t copies = 0;                   // host copies this order wrote
    absl::Status backup_status;            // the first failed copy (or issue) of the order
    bool backup_reported = false;
    // The pages to withdraw are read from the KV store when the withdrawal starts (AdvanceReclaims).
    CopyEvent withdraw;
    bool withdrawing = false;
    bool readers_done = false;
  };
  struct Populate {
    wire::PopulateOrderT order;
    size_t outstanding = 0;
    absl::Status status;
    std::vector<uint32_t> published;  // history pages issued and completed ok
  };

  Worker(const model::Model* model, Device* device, WorkerConfig config, WorkerGeometry geometry, MemdLink* memd,
         ClientSink* client);
  KvAccess& kv() { return *kv_; }
  void ReportKvCompletions();
  void AdvanceReclaims();
  // Whether a reclaim order of `request` not yet at ReadersDone names `device_page`.
  bool ReclaimInFlight(RequestId request, PageIndex device_page) const;
  // BackupComplete of reclaim order `m`: every backup page of the order, ok or the failure.
  void SendBackupComplete(const wire::ReclaimOrderT& m, const absl::Status& status,
                          std::vector<PageIndex> deferred = {});
  // Whether one of the order's awaited host copies is still being written (issued, not reported by Poll yet).
  bool BackupInFlight(const Reclaim& rc) const;
  // Whether a populate order of `request` still has a copy in flight into one of `device_pages`.
  bool PopulateInFlight(RequestId request, std::span<const PageIndex> device_pages) const;
  void StartGranted();
  absl::Status PlanKv(Request& r);
  absl::Status RunBatch();
  absl::Status ReplayFed(Request& r);
  absl::Status ImportChunk(Request& r);
  void EmitToken(Request& r, std::span<const float> logits);
  void Finish(RequestId id, absl::Status error);
  void SendChunk(Request& r, std::vector<model::Token> tokens, std::vector<uint64_t> digests, bool finished,
                 const absl::Status& error);
  void CountCensus();

  const model::Model* model_;
  Device* device_;
  WorkerConfig config_;
  WorkerGeometry geometry_;
  MemdLink* memd_;
  ClientSink* client_;
  std::unique_ptr<KvAccess> kv_;
  HierarchicalKvAccess* hier_ = nullptr;
  std::map<RequestId, std::unique_ptr<Request>> requests_;  // ordered: the batch order is stable
  std::deque<RequestId> granted_;                           // granted, waiting for a free slot
  std::map<uint64_t, Reclaim> reclaims_;                    // by order id
  std::map<uint64_t, Populate> populates_;                  // by order id
  // Requests this worker process finished (newest kFinishedMemory): an order for one of them crossed its Complete;
  // an order for a request neither served nor finished here (admitted through an earlier worker process) is refused.
  static constexpr size_t kFinishedMemory = size_t{1} << 16;
  std::deque<RequestId> finished_order_;
  absl::flat_hash_set<RequestId> finished_ids_;
  using PageKey = std::pair<RequestId, uint32_t>;           // (request, history page)
  std::map<PageKey, uint64_t> populate_of_;                 // -> PopulateOrder id
  std::map<PageKey, uint64_t> reclaim_backup_of_;           // -> ReclaimOrder id
  // Populate orders of finished requests: answered (ReadyPublish ok = false) once their copies into the GPU pages
  // ended, because memd frees such a page only on that answer and may hand it on at once.
  struct Cancelled {
    wire::ReadyPublishT answer;
    std::vector<CopyEvent> copies;
  };
  std::vector<Cancelled> cancelled_populates_;
  WorkerStats stats_;
  PrefixRowCache prefix_cache_;
};

}  // namespace dhs
