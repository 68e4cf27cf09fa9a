// memd/cluster_io.h: the cluster tier's two trips to the store (issue 26; docs/cluster_tier.md), between the pure parts
// (memd/cluster_publish_queue.h, memd/cluster_page_value.h) and the Redis client (common/redis_client.h). memd's
// ClusterTier (memd/cluster_tier.h) sends its batches with SendBatch and looks pages up with LookupPages.
//
// - SendBatch sends one batch of the write-behind queue (SET key value PX ttl of every item, or a PING for a probe)
//   within a deadline; ClusterPublisher::Pump takes the queue's next batch, sends it and reports the answer back.
// - LookupPages GETs a batch of page keys within a deadline and decodes each value against the importer's geometry and
//   the identity it asked for. Every failure is a miss, counted by reason (absent, timeout, unreachable, store error,
//   and each PageValueError), never an error of the caller and never a page whose bytes were not checked.
//
// Thread-safety: none; one owner thread (the one that owns the client).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/redis_client.h"
#include "memd/cluster_page_value.h"
#include "memd/cluster_publish_queue.h"

namespace dhs::memd {

// The store's answer to one batch: the SETs it confirmed, and whether it answered at all (an error reply is an
// answer; a timeout or a dead connection is not).
struct BatchOutcome {
  uint32_t written = 0;
  bool answered = false;
};
// Sends `batch` within `timeout`; each SET that failed goes to `on_failure` (for the caller's log).
BatchOutcome SendBatch(redis::Client& client, const PublishBatch& batch, std::chrono::milliseconds timeout,
                       absl::FunctionRef<void(const absl::Status&)> on_failure);

class ClusterPublisher {
 public:
  // Both outlive the publisher.
  ClusterPublisher(redis::Client* client, PublishQueue* queue) : client_(client), queue_(queue) {}
  // Sends the queue's next batch, if it has one at `now_us`, within `timeout`, and tells the queue how it went.
  // Returns whether a batch (or a probe) was sent.
  bool Pump(int64_t now_us, std::chrono::milliseconds timeout);

 private:
  redis::Client* client_;
  PublishQueue* queue_;
};

// One page to look up: its store key (memd/cluster_keys.h) and what its value must say (memd/cluster_page_value.h).
struct PageLookup {
  std::string key;
  PageIdentity identity;
};

// A page found and checked: the whole value as read; its payload is the host page's bytes.
struct ClusterPage {
  std::string value;
  uint64_t page_checksum = 0;  // PageChecksum(payload): what the host pool keeps for the imported page
  std::span<const uint8_t> payload() const {
    return {reinterpret_cast<const uint8_t*>(value.data()) + kPageValueHeaderBytes,
            value.size() - kPageValueHeaderBytes};
  }
};

enum class LookupMiss : uint8_t { kAbsent = 0, kTimeout = 1, kUnavailable = 2, kStoreError = 3, kBadValue = 4 };
inline constexpr size_t kLookupMisses = 5;

struct LookupCounters {
  uint64_t lookups = 0;
  uint64_t hits = 0;
  uint64_t hit_bytes = 0;                             // payload bytes of the hits
  std::array<uint64_t, kLookupMisses> misses{};       // by LookupMiss
  std::array<uint64_t, kPageValueErrors> bad_values{};  // kBadValue misses by PageValueError
  uint64_t miss_total() const;
};

// GETs every lookup's key within `timeout` and checks each value; one answer per lookup, in order (nullopt: a miss,
// counted in *counters by reason).
std::vector<std::optional<ClusterPage>> LookupPages(redis::Client& client, std::span<const PageLookup> lookups,
                                                    const PageGeometry& geometry, std::chrono::milliseconds timeout,
                                                    LookupCounters* counters);

}  // namespace dhs::memd
