// memd/cluster_tier.cc: see cluster_tier.h.
#include "memd/cluster_tier.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/log_limiter.h"
#include "spdlog/spdlog.h"

namespace dhs::memd {

std::string_view ClusterMissName(ClusterMiss miss) {
  switch (miss) {
    case ClusterMiss::kNoRoom: return "no_room";
    case ClusterMiss::kStoreDown: return "store_down";
    case ClusterMiss::kNoGeometry: return "no_geometry";
    case ClusterMiss::kAfterGap: return "after_gap";
  }
  return "unknown";
}

namespace {
constexpr std::string_view kLookupMissNames[kLookupMisses] = {"absent", "timeout", "unavailable", "store_error",
                                                              "bad_value"};
}  // namespace

absl::StatusOr<std::unique_ptr<ClusterTier>> ClusterTier::Start(const ClusterTierOptions& options) {
  auto seeds = redis::ParseSeeds(options.store);
  if (!seeds.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--cluster-store '", options.store, "': ", seeds.status().message()));
  }
  if (absl::Status s = PublishQueue::Validate(options.queue); !s.ok()) return s;
  if (options.lookup_timeout.count() <= 0) return absl::InvalidArgumentError("cluster lookup timeout must be > 0 ms");
  redis::ClientConfig config;
  config.seeds = *seeds;
  auto sender = redis::Client::Create(config);
  if (!sender.ok()) return sender.status();
  auto lookup = redis::Client::Create(config);
  if (!lookup.ok()) return lookup.status();
  std::unique_ptr<ClusterTier> tier(new ClusterTier(options, std::move(*sender), std::move(*lookup)));
  tier->sender_ = std::thread([t = tier.get()] { t->SenderLoop(); });
  return tier;
}

ClusterTier::ClusterTier(const ClusterTierOptions& options, std::unique_ptr<redis::Client> sender_client,
                         std::unique_ptr<redis::Client> lookup_client)
    : options_(options),
      sender_client_(std::move(sender_client)),
      lookup_client_(std::move(lookup_client)),
      queue_(options.queue) {}

ClusterTier::~ClusterTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (sender_.joinable()) sender_.join();
}

int64_t ClusterTier::NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string_view StoreContactName(StoreContact contact) {
  switch (contact) {
    case StoreContact::kNotYet: return "not yet";
    case StoreContact::kAnswered: return "yes";
    case StoreContact::kNoAnswer: return "no";
  }
  return "?";
}

void ClusterTier::SenderLoop() {
  // One PING at start, so that a store that cannot be reached is said at once (log, dhsctl "reachable: no") rather
  // than at the first page published or looked up; then one every kIdlePingUs while the sender has sent nothing, so
  // that "reachable" stays true on an idle memd (a store killed or started after memd is seen within a second).
  constexpr int64_t kIdlePingUs = 1'000'000;
  if (absl::Status s = sender_client_->Ping(options_.publish_timeout); s.ok()) {
    SawContact(true);
    spdlog::info("memd: cluster tier: the store {} answers", options_.store);
  } else {
    SawContact(false);
    spdlog::warn("memd: cluster tier: the store {} did not answer a PING at start ({}); pages are published and "
                 "looked up once it answers, missed meanwhile", options_.store, s.ToString());
  }
  int64_t last_trip_us = NowUs();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    std::optional<PublishBatch> batch = queue_.NextBatch(NowUs());
    if (!batch) {
      if (NowUs() - last_trip_us >= kIdlePingUs) {  // idle: a PING without the lock, for "reachable" only
        lock.unlock();
        const bool answered = sender_client_->Ping(options_.publish_timeout).ok();
        if (contact_.load() == StoreContact::kAnswered && !answered) {
          DHS_LOG_LIMITED(spdlog::level::warn, "memd: cluster tier: the store {} stopped answering", options_.store);
        }
        SawContact(answered);
        last_trip_us = NowUs();
        lock.lock();
        continue;
      }
      // Nothing to send (or down before its retry time): wait for an offer, the retry time or 50 ms.
      cv_.notify_all();  // WaitDrained
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    lock.unlock();  // the store's trip without the lock: Offer never waits on it
    last_trip_us = NowUs();
    const BatchOutcome o = SendBatch(*sender_client_, *batch, options_.publish_timeout, [](const absl::Status& s) {
      DHS_LOG_LIMITED(spdlog::level::warn, "memd: cluster tier: a page not published: {}", s.ToString());
    });
    SawContact(o.answered);
    lock.lock();
    const StoreHealth before = queue_.health();
    DHS_CHECK_OK(queue_.BatchDone(batch->id, o.written, o.answered, NowUs()));
    if (queue_.health() != before) {
      spdlog::warn("memd: cluster tier: store {} -> {}", StoreHealthName(before), StoreHealthName(queue_.health()));
    }
  }
}

void ClusterTier::Offer(const PageGeometry& geometry, const PrefixAddress& address, std::span<const uint8_t> page) {
  EncodeAndOffer(geometry, PrefixPageKey(GeometryFingerprint(geometry), address.key), options_.keys.prefix_ttl_ms,
                 PageIdentity{PageValueKind::kPrefix, address.key, address.content}, page,
                 [&] { return absl::StrFormat("page %016x", address.key); });
}

void ClusterTier::OfferSession(const PageGeometry& geometry, std::string_view tenant, uint64_t session, uint32_t page,
                               uint64_t digest, std::span<const uint8_t> bytes) {
  const std::string session_id = absl::StrCat(session);
  EncodeAndOffer(geometry, SessionPageKey(GeometryFingerprint(geometry), tenant, session_id, digest, page),
                 options_.keys.session_ttl_ms,
                 PageIdentity{PageValueKind::kSession, digest, SessionHash(tenant, session_id)}, bytes,
                 [&] { return absl::StrCat("session ", session, " page ", page); });
}

void ClusterTier::EncodeAndOffer(const PageGeometry& geometry, std::string key, uint32_t ttl_ms,
                                 const PageIdentity& identity, std::span<const uint8_t> bytes,
                                 absl::FunctionRef<std::string()> what) {
  PublishItem item;
  item.key = std::move(key);
  item.ttl_ms = ttl_ms;
  if (absl::Status s = EncodePageValue(geometry, identity, bytes, &item.value); !s.ok()) {
    ++encode_failures_;
    DHS_LOG_LIMITED(spdlog::level::warn, "memd: cluster tier: {} not published: {}", what(), s.ToString());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.Offer(std::move(item), NowUs());
  }
  cv_.notify_all();
}

std::vector<std::optional<ClusterPage>> ClusterTier::Lookup(const PageGeometry& geometry,
                                                            std::span<const PrefixAddress> addresses) {
  if (addresses.empty()) return {};
  const int64_t now = NowUs();
  bool down;
  {
    std::lock_guard<std::mutex> lock(mu_);
    down = queue_.health() != StoreHealth::kUp;
  }
  if (down || now < lookup_backoff_until_us_) {
    CountMiss(ClusterMiss::kStoreDown, addresses.size());
    return std::vector<std::optional<ClusterPage>>(addresses.size());
  }
  const uint64_t space = GeometryFingerprint(geometry);
  std::vector<PageLookup> lookups;
  lookups.reserve(addresses.size());
  for (const PrefixAddress& a : addresses) {
    if (a.session != 0) {  // issue 26: a session page (published by ClusterTier::OfferSession)
      lookups.push_back({SessionPageKey(space, a.session, a.content, a.page),
                         PageIdentity{PageValueKind::kSession, a.content, a.session}});
      ++session_lookups_;
    } else {
      lookups.push_back({PrefixPageKey(space, a.key), PageIdentity{PageValueKind::kPrefix, a.key, a.content}});
    }
  }
  const LookupCounters before = lookups_;
  std::vector<std::optional<ClusterPage>> found =
      LookupPages(*lookup_client_, lookups, geometry, options_.lookup_timeout, &lookups_);
  for (size_t i = 0; i < found.size() && i < addresses.size(); ++i) {
    if (found[i].has_value() && addresses[i].session != 0) ++session_hits_;
  }
  const uint64_t unanswered = (lookups_.misses[static_cast<size_t>(LookupMiss::kTimeout)] -
                               before.misses[static_cast<size_t>(LookupMiss::kTimeout)]) +
                              (lookups_.misses[static_cast<size_t>(LookupMiss::kUnavailable)] -
                               before.misses[static_cast<size_t>(LookupMiss::kUnavailable)]);
  SawContact(unanswered < addresses.size());
  if (unanswered == addresses.size()) {
    lookup_backoff_until_us_ = NowUs() + std::chrono::duration_cast<std::chrono::microseconds>(
                                             options_.lookup_backoff).count();
    DHS_LOG_LIMITED(spdlog::level::warn, "memd: cluster tier: the store did not answer a lookup of {} pages within {} "
                    "ms: lookups skipped for {} ms", addresses.size(), options_.lookup_timeout.count(),
                    options_.lookup_backoff.count());
  }
  for (size_t i = 0; i < kLookupMisses; ++i) {
    if (i != static_cast<size_t>(LookupMiss::kAbsent) && lookups_.misses[i] > before.misses[i]) {
      DHS_LOG_LIMITED(spdlog::level::warn, "memd: cluster tier: {} lookup misses: {}", lookups_.misses[i] - before.misses[i],
                      kLookupMissNames[i]);
    }
  }
  return found;
}

void ClusterTier::CountMiss(ClusterMiss why, uint64_t pages) {
  misses_[static_cast<size_t>(why)] += pages;
  if (why != ClusterMiss::kStoreDown) {
    DHS_LOG_LIMITED(spdlog::level::info, "memd: cluster tier: {} pages not imported: {}", pages, ClusterMissName(why));
  }
}

void ClusterTier::CountImported(uint64_t pages, uint64_t bytes, uint64_t session_pages) {
  imported_ += pages;
  imported_bytes_ += bytes;
  session_imported_ += session_pages;
}

ClusterDump ClusterTier::Stats() const {
  ClusterDump d;
  d.configured = true;
  d.store = options_.store;
  PublishQueueCounters q;
  {
    std::lock_guard<std::mutex> lock(mu_);
    d.health = std::string(StoreHealthName(queue_.health()));
    d.reachable = std::string(StoreContactName(contact_.load()));
    d.queue_depth = queue_.depth();
    d.queue_bytes = queue_.depth_bytes();
    q = queue_.counters();
  }
  d.offered = q.offered;
  d.published = q.written;
  d.published_bytes = q.bytes_written;
  d.publish_failed = q.failed;
  for (size_t i = 0; i < kShedReasons; ++i) {
    uint64_t n = q.shed[i];
    if (static_cast<ShedReason>(i) == ShedReason::kTooLarge) n += encode_failures_;
    d.shed.emplace_back(std::string(ShedReasonName(static_cast<ShedReason>(i))), n);
  }
  d.lookups = lookups_.lookups;
  d.hits = lookups_.hits;
  d.hit_bytes = lookups_.hit_bytes;
  d.imported = imported_;
  d.imported_bytes = imported_bytes_;
  d.session_lookups = session_lookups_;
  d.session_hits = session_hits_;
  d.session_imported = session_imported_;
  for (size_t i = 0; i < kLookupMisses; ++i) d.misses.emplace_back(std::string(kLookupMissNames[i]), lookups_.misses[i]);
  for (size_t i = 0; i < kClusterMisses; ++i) {
    d.misses.emplace_back(std::string(ClusterMissName(static_cast<ClusterMiss>(i))), misses_[i]);
  }
  for (size_t i = 1; i < kPageValueErrors; ++i) {
    d.bad_values.emplace_back(std::string(PageValueErrorName(static_cast<PageValueError>(i))), lookups_.bad_values[i]);
  }
  return d;
}

bool ClusterTier::WaitDrained(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return queue_.depth() == 0 && !queue_.in_flight(); });
}

}  // namespace dhs::memd
