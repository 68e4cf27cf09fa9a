// memd/cluster_publish_queue.h: the write-behind queue of the cluster tier (issue 26): pages to publish to the store
// (Redis), bounded, decided here and sent by the owner. A pure core in the house style (memd/residency_manager.h):
// events in (Offer, NextBatch, BatchDone), decisions out; no sockets, no threads, no clock (the caller passes its time
// with each event, in microseconds of any monotonic clock).
//
// Never blocks and never grows without bound: Offer answers at once, and when the queue is full (entries or bytes),
// the item is too large, or the store is down, the item is shed: dropped and counted by reason. The tier is a cache,
// so a shed page costs only a later miss. A batch that fails is not retried (its items are counted as failed).
//
// Store health (one enum, ONE table of allowed moves, one validating function):
//
//            failures_to_down batches failed in a row          NextBatch at/after retry time
//     up  ------------------------------------------>  down  -------------------------------> probing
//      ^                                                 ^                                         |
//      |                the probe succeeded              |        the probe failed                 |
//      '-------------------------------------------------+-----------------------------------------'
//
// In `down` the queue is emptied (its items shed as kStoreDown) and every Offer is shed as kStoreDown until a probe
// (an empty batch: the owner only checks that the store answers, e.g. PING) succeeds. The retry time starts at
// retry_initial_us after going down and doubles on each failed probe up to retry_max_us.
//
// One batch is in flight at a time (the owner has one sender); NextBatch takes the oldest items up to the batch
// limits. Items with the same key are coalesced while queued (pages are immutable: the same key is the same page).
//
// Thread-safety: none. One owner.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"

namespace dhs::memd {

struct PublishItem {
  std::string key;      // the store key (memd/cluster_keys.h)
  std::string value;    // the page value (memd/cluster_page_value.h)
  uint32_t ttl_ms = 0;  // time to live in the store, ms (0: none)
  uint64_t bytes() const { return key.size() + value.size(); }
};

struct PublishQueueConfig {
  uint32_t max_entries = 1024;         // queued items (not counting the batch in flight)
  uint64_t max_bytes = 256ull << 20;   // queued key + value bytes
  uint32_t batch_max_entries = 64;     // items per batch
  uint64_t batch_max_bytes = 16ull << 20;  // bytes per batch (an item larger than this is shed as kTooLarge)
  uint32_t failures_to_down = 3;       // whole batches failed in a row before the store counts as down
  int64_t retry_initial_us = 100'000;  // first probe after going down
  int64_t retry_max_us = 5'000'000;    // the longest wait between probes
};

enum class StoreHealth : uint8_t { kUp = 0, kDown = 1, kProbing = 2 };
std::string_view StoreHealthName(StoreHealth health);

inline constexpr std::pair<StoreHealth, StoreHealth> kStoreHealthTransitions[] = {
    {StoreHealth::kUp, StoreHealth::kDown},       // failures_to_down batches failed in a row
    {StoreHealth::kDown, StoreHealth::kProbing},  // the retry time came: a probe batch goes out
    {StoreHealth::kProbing, StoreHealth::kUp},    // the probe succeeded
    {StoreHealth::kProbing, StoreHealth::kDown},  // the probe failed (the wait doubles)
};
bool StoreHealthTransitionAllowed(StoreHealth from, StoreHealth to);
// Moves `health` from `from` to `to`. Errors: FailedPrecondition when it is not in `from` or the move is not in
// kStoreHealthTransitions (then unchanged).
absl::Status TransitionStoreHealth(StoreHealth& health, StoreHealth from, StoreHealth to);

// Why an item was not published (counters, metric labels: ShedReasonName).
enum class ShedReason : uint8_t { kQueueFull = 0, kBytesFull = 1, kTooLarge = 2, kStoreDown = 3 };
inline constexpr size_t kShedReasons = 4;
std::string_view ShedReasonName(ShedReason reason);  // "queue_full", "bytes_full", "too_large", "store_down"

enum class OfferResult : uint8_t { kQueued, kCoalesced, kShed };
struct OfferDecision {
  OfferResult result = OfferResult::kQueued;
  ShedReason reason = ShedReason::kQueueFull;  // meaningful when kShed
};

struct PublishBatch {
  uint64_t id = 0;
  bool probe = false;              // an empty batch: only check that the store answers
  std::vector<PublishItem> items;  // oldest first
};

struct PublishQueueCounters {
  uint64_t offered = 0;
  uint64_t queued = 0;      // accepted into the queue
  uint64_t coalesced = 0;   // offered while the same key was queued (nothing added)
  std::array<uint64_t, kShedReasons> shed{};  // by ShedReason (kStoreDown also counts items dropped on going down)
  uint64_t written = 0;     // items the store confirmed
  uint64_t failed = 0;      // items of a batch that the store did not confirm (not retried)
  uint64_t bytes_written = 0;
  uint64_t batches = 0;     // batches with items handed out
  uint64_t probes = 0;
  uint64_t went_down = 0;   // up -> down and probing -> down moves
  uint32_t peak_depth = 0;
  uint64_t shed_total() const;
};

class PublishQueue {
 public:
  // Errors: InvalidArgument (a zero limit, batch limits above the queue's, retry times not 0 < initial <= max).
  static absl::Status Validate(const PublishQueueConfig& config);
  explicit PublishQueue(const PublishQueueConfig& config);

  // A page to publish: queued, coalesced or shed (never blocks).
  OfferDecision Offer(PublishItem item, int64_t now_us);
  // The next batch for the owner to send, or nullopt (one in flight already, nothing queued, or down before its
  // retry time). In down at/after the retry time: a probe (moves to probing).
  std::optional<PublishBatch> NextBatch(int64_t now_us);
  // The store's answer to batch `id`: `written` of its items confirmed, the rest failed. A probe is confirmed with
  // written = 0 and `store_answered`. Errors: NotFound (not the batch in flight; nothing changes), InvalidArgument
  // (written larger than the batch).
  absl::Status BatchDone(uint64_t id, uint32_t written, bool store_answered, int64_t now_us);

  StoreHealth health() const { return health_; }
  uint32_t depth() const { return static_cast<uint32_t>(queue_.size()); }
  uint64_t depth_bytes() const { return queued_bytes_; }
  bool in_flight() const { return in_flight_.has_value(); }
  int64_t retry_at_us() const { return retry_at_us_; }  // meaningful in down
  const PublishQueueCounters& counters() const { return counters_; }
  const PublishQueueConfig& config() const { return config_; }

  // Limits, the key index and the byte count against a recount; every offered item accounted for exactly once
  // (offered = queued + coalesced + shed at offer; queued = written + failed + shed on going down + depth + in flight).
  // Errors: Internal naming the first broken invariant.
  absl::Status CheckInvariants() const;

 private:
  struct InFlight {
    uint64_t id = 0;
    bool probe = false;
    uint32_t items = 0;
    uint64_t bytes = 0;
  };
  void Move(StoreHealth to);
  void Shed(ShedReason reason) { ++counters_.shed[static_cast<size_t>(reason)]; }

  PublishQueueConfig config_;
  StoreHealth health_ = StoreHealth::kUp;
  std::deque<PublishItem> queue_;
  absl::flat_hash_set<std::string> queued_keys_;
  uint64_t queued_bytes_ = 0;
  std::optional<InFlight> in_flight_;
  uint64_t next_batch_id_ = 1;
  uint32_t failures_in_row_ = 0;
  int64_t retry_wait_us_ = 0;
  int64_t retry_at_us_ = 0;
  uint64_t shed_on_offer_ = 0;  // of counters_.shed: shed by Offer (the rest: dropped on going down)
  PublishQueueCounters counters_;
};

}  // namespace dhs::memd
