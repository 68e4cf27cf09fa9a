// memd/cluster_tier.h: memd's side of the cluster tier (issue 26; docs/cluster_tier.md "memd"): the I/O between the
// core's decisions (memd/residency_manager.h ClusterLookups / ImportClusterPages / DrainClusterPublish) and the store
// (common/redis_client.h through memd/cluster_io.h). It decides nothing about pages; it owns the two clients, the
// write-behind queue (memd/cluster_publish_queue.h) and the sender thread.
//
// - Publishing (Offer, from memd's loop): the page's value is encoded (memd/cluster_page_value.h) and offered to the
//   bounded queue under a mutex held only for the queue's in-memory step; the sender thread (its own redis::Client)
//   takes the next batch under that mutex, sends it without it (SET ... PX ttl, or a PING probe), and reports back.
//   memd's loop never waits on the store: a full queue, a too-large page or a store that is down sheds (counted).
// - Lookups (Lookup, from memd's loop, before an admission's grant decision): one batch GET with the lookup deadline
//   (ClusterTierOptions::lookup_timeout) on the loop's own client, each value checked (LookupPages). While the
//   publisher finds the store down, or for `lookup_backoff` after a lookup batch none of whose keys got an answer
//   (all timeouts / unreachable), lookups are skipped and counted as misses (reason "store_down"): a dead or stopped
//   store costs one deadline per backoff, not one per admission.
//
// Thread-safety: Offer, Lookup, CountMiss and Stats from one thread (memd's loop); the sender thread is internal.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/redis_client.h"
#include "memd/cluster_io.h"
#include "memd/cluster_keys.h"
#include "memd/cluster_page_value.h"
#include "memd/cluster_publish_queue.h"
#include "memd/prefix_pages.h"
#include "memd/state_dump.h"

namespace dhs::memd {

struct ClusterTierOptions {
  std::string store;                                  // "redis://HOST:PORT" or comma-separated cluster seeds
  std::chrono::milliseconds lookup_timeout{5};        // one lookup batch's deadline
  std::chrono::milliseconds publish_timeout{500};     // one publish batch's deadline (the sender thread's)
  std::chrono::milliseconds lookup_backoff{1000};     // lookups skipped after a batch the store did not answer
  PublishQueueConfig queue;
  ClusterKeyConfig keys;
};

// Why a page of an admission was not imported, beyond LookupPages' reasons (counters, metric labels).
enum class ClusterMiss : uint8_t {
  kNoRoom = 0,       // found, but the host pool had no reusable page for it (cached pages are not evicted for it)
  kStoreDown = 1,    // not asked: the store is down or did not answer the last lookup (backoff)
  kNoGeometry = 2,   // not asked: the request's worker declared no shape (no geometry to check values against)
  kAfterGap = 3,     // found, but an earlier page of the chain was missed (a page after a gap is not imported)
};
inline constexpr size_t kClusterMisses = 4;
std::string_view ClusterMissName(ClusterMiss miss);  // "no_room", "store_down", "no_geometry", "after_gap"

// The store's latest contact as memd saw it (ClusterDump::reachable): not tried yet, answered, or no answer.
enum class StoreContact : uint8_t { kNotYet, kAnswered, kNoAnswer };
std::string_view StoreContactName(StoreContact contact);  // "not yet", "yes", "no"

class ClusterTier {
 public:
  // Parses the store (redis::ParseSeeds), creates the clients (they connect lazily) and starts the sender thread.
  // Errors: InvalidArgument (a bad store spec, a bad queue config).
  static absl::StatusOr<std::unique_ptr<ClusterTier>> Start(const ClusterTierOptions& options);
  ~ClusterTier();  // stops and joins the sender thread (what is queued is dropped: the tier is a cache)
  ClusterTier(const ClusterTier&) = delete;
  ClusterTier& operator=(const ClusterTier&) = delete;

  // A confirmed shared prefix page to publish: `page` is its host page's bytes (geometry.host_page_bytes), `checksum`
  // its confirmed checksum. Encodes and offers; never blocks on the store. A page of the wrong size is shed
  // (counted as too_large, logged once).
  void Offer(const PageGeometry& geometry, const PrefixAddress& address, std::span<const uint8_t> page);
  // Issue 26, sessions: a finished turn's history page `page` (its confirmed host copy's bytes, as Offer) to publish
  // under the session key (memd/cluster_keys.h SessionPageKey: tenant, session id in decimal, `digest` as <chain>,
  // page) with the session TTL; the value's identity is (kSession, key `digest`, content SessionHash(tenant,
  // session id)). Counted in the queue's offers like a prefix page; never blocks.
  void OfferSession(const PageGeometry& geometry, std::string_view tenant, uint64_t session, uint32_t page,
                    uint64_t digest, std::span<const uint8_t> bytes);
  // Looks `addresses` up (one batch, the lookup deadline) and checks each value against `geometry`: one answer per
  // address, in order (nullopt: a miss, counted by reason). A prefix address is asked under its prefix key with the
  // identity (kPrefix, key, content); a session address (issue 26, PrefixAddress::session nonzero) under its session
  // key (SessionPageKey(space, session, content, page)) with the identity (kSession, content = its digest, session):
  // a value published for another session, digest or page is a bad_value miss. Session addresses are also counted
  // apart (session_lookups, session_hits).
  std::vector<std::optional<ClusterPage>> Lookup(const PageGeometry& geometry, std::span<const PrefixAddress> addresses);
  // A page not imported for one of memd's own reasons (counted; logged once per reason).
  void CountMiss(ClusterMiss why, uint64_t pages = 1);
  // A found page copied into the host pool (counted: imported pages and bytes; `session_pages` of them found by a
  // session address, issue 26).
  void CountImported(uint64_t pages, uint64_t bytes, uint64_t session_pages = 0);

  // The counters and state for memd's stats (state_dump.h ClusterDump).
  ClusterDump Stats() const;
  // Test hook: waits until the queue is empty and no batch is in flight, or `timeout` passes; true when drained.
  bool WaitDrained(std::chrono::milliseconds timeout);

 private:
  // Offer's and OfferSession's common part: encodes `bytes` as a page value of `identity`, then offers it under
  // `key` with `ttl_ms` to the write-behind queue (an encode failure is counted and logged, naming what() only then).
  void EncodeAndOffer(const PageGeometry& geometry, std::string key, uint32_t ttl_ms, const PageIdentity& identity,
                      std::span<const uint8_t> bytes,
                      absl::FunctionRef<std::string()> what);
  ClusterTier(const ClusterTierOptions& options, std::unique_ptr<redis::Client> sender_client,
              std::unique_ptr<redis::Client> lookup_client);
  void SenderLoop();
  static int64_t NowUs();

  ClusterTierOptions options_;
  std::unique_ptr<redis::Client> sender_client_;  // the sender thread's
  std::unique_ptr<redis::Client> lookup_client_;  // memd's loop's

  mutable std::mutex mu_;  // guards queue_ and stop_; held only for in-memory steps, never across I/O
  std::condition_variable cv_;
  PublishQueue queue_;
  bool stop_ = false;
  std::thread sender_;

  // The loop's counters (no lock: one thread).
  LookupCounters lookups_;
  std::array<uint64_t, kClusterMisses> misses_{};
  uint64_t imported_ = 0, imported_bytes_ = 0;
  uint64_t session_lookups_ = 0, session_hits_ = 0, session_imported_ = 0;  // issue 26: of lookups, hits, imported
  uint64_t encode_failures_ = 0;
  int64_t lookup_backoff_until_us_ = 0;
  // Whether the store answered its latest contact (the sender's start PING, a publish batch, a lookup batch):
  // an observation for dhsctl / metrics ("reachable"), not a decision (the publish queue's health decides).
  std::atomic<StoreContact> contact_{StoreContact::kNotYet};
  void SawContact(bool answered) { contact_.store(answered ? StoreContact::kAnswered : StoreContact::kNoAnswer); }
};

}  // namespace dhs::memd
