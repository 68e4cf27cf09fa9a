// memd/cluster_publish_queue.cc: see cluster_publish_queue.h.
#include "memd/cluster_publish_queue.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/check.h"

namespace dhs::memd {

std::string_view StoreHealthName(StoreHealth health) {
  switch (health) {
    case StoreHealth::kUp: return "up";
    case StoreHealth::kDown: return "down";
    case StoreHealth::kProbing: return "probing";
  }
  return "unknown";
}

bool StoreHealthTransitionAllowed(StoreHealth from, StoreHealth to) {
  return std::find(std::begin(kStoreHealthTransitions), std::end(kStoreHealthTransitions), std::pair{from, to}) !=
         std::end(kStoreHealthTransitions);
}

absl::Status TransitionStoreHealth(StoreHealth& health, StoreHealth from, StoreHealth to) {
  if (health != from) {
    return absl::FailedPreconditionError(
        absl::StrFormat("store health is %s, expected %s", StoreHealthName(health), StoreHealthName(from)));
  }
  if (!StoreHealthTransitionAllowed(from, to)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("no store health transition %s -> %s", StoreHealthName(from), StoreHealthName(to)));
  }
  health = to;
  return absl::OkStatus();
}

std::string_view ShedReasonName(ShedReason reason) {
  switch (reason) {
    case ShedReason::kQueueFull: return "queue_full";
    case ShedReason::kBytesFull: return "bytes_full";
    case ShedReason::kTooLarge: return "too_large";
    case ShedReason::kStoreDown: return "store_down";
  }
  return "unknown";
}

uint64_t PublishQueueCounters::shed_total() const {
  uint64_t n = 0;
  for (uint64_t s : shed) n += s;
  return n;
}

absl::Status PublishQueue::Validate(const PublishQueueConfig& c) {
  if (c.max_entries == 0 || c.max_bytes == 0 || c.batch_max_entries == 0 || c.batch_max_bytes == 0 ||
      c.failures_to_down == 0) {
    return absl::InvalidArgumentError("publish queue: every limit must be positive");
  }
  if (c.batch_max_entries > c.max_entries || c.batch_max_bytes > c.max_bytes) {
    return absl::InvalidArgumentError("publish queue: a batch limit is larger than the queue's");
  }
  if (c.retry_initial_us <= 0 || c.retry_initial_us > c.retry_max_us) {
    return absl::InvalidArgumentError("publish queue: retry times must satisfy 0 < initial <= max");
  }
  return absl::OkStatus();
}

PublishQueue::PublishQueue(const PublishQueueConfig& config) : config_(config) { DHS_CHECK_OK(Validate(config)); }

void PublishQueue::Move(StoreHealth to) { DHS_CHECK_OK(TransitionStoreHealth(health_, health_, to)); }

OfferDecision PublishQueue::Offer(PublishItem item, int64_t now_us) {
  ++counters_.offered;
  auto shed = [&](ShedReason reason) {
    Shed(reason);
    ++shed_on_offer_;
    return OfferDecision{OfferResult::kShed, reason};
  };
  if (health_ != StoreHealth::kUp) return shed(ShedReason::kStoreDown);
  const uint64_t bytes = item.bytes();
  if (bytes > config_.batch_max_bytes) return shed(ShedReason::kTooLarge);
  if (queued_keys_.contains(item.key)) {
    ++counters_.coalesced;
    return OfferDecision{OfferResult::kCoalesced, ShedReason::kQueueFull};
  }
  if (queue_.size() >= config_.max_entries) return shed(ShedReason::kQueueFull);
  if (queued_bytes_ + bytes > config_.max_bytes) return shed(ShedReason::kBytesFull);
  queued_keys_.insert(item.key);
  queued_bytes_ += bytes;
  queue_.push_back(std::move(item));
  ++counters_.queued;
  counters_.peak_depth = std::max(counters_.peak_depth, depth());
  return OfferDecision{OfferResult::kQueued, ShedReason::kQueueFull};
}

std::optional<PublishBatch> PublishQueue::NextBatch(int64_t now_us) {
  if (in_flight_) return std::nullopt;
  PublishBatch batch;
  batch.id = next_batch_id_;
  if (health_ == StoreHealth::kDown) {
    if (now_us < retry_at_us_) return std::nullopt;
    Move(StoreHealth::kProbing);
    batch.probe = true;
    ++counters_.probes;
  } else {
    if (queue_.empty()) return std::nullopt;
    uint64_t bytes = 0;
    while (!queue_.empty() && batch.items.size() < config_.batch_max_entries &&
           bytes + queue_.front().bytes() <= config_.batch_max_bytes) {
      PublishItem& front = queue_.front();
      bytes += front.bytes();
      queued_bytes_ -= front.bytes();
      queued_keys_.erase(front.key);
      batch.items.push_back(std::move(front));
      queue_.pop_front();
    }
    ++counters_.batches;
  }
  ++next_batch_id_;
  uint64_t bytes = 0;
  for (const PublishItem& item : batch.items) bytes += item.bytes();
  in_flight_ = InFlight{batch.id, batch.probe, static_cast<uint32_t>(batch.items.size()), bytes};
  return batch;
}

absl::Status PublishQueue::BatchDone(uint64_t id, uint32_t written, bool store_answered, int64_t now_us) {
  if (!in_flight_ || in_flight_->id != id) {
    return absl::NotFoundError(absl::StrFormat("publish queue: batch %d is not in flight", id));
  }
  if (written > in_flight_->items) {
    return absl::InvalidArgumentError(
        absl::StrFormat("publish queue: %d written of a batch of %d", written, in_flight_->items));
  }
  const InFlight done = *in_flight_;
  in_flight_.reset();
  if (done.probe) {
    if (store_answered) {
      Move(StoreHealth::kUp);
      failures_in_row_ = 0;
    } else {
      Move(StoreHealth::kDown);
      ++counters_.went_down;
      retry_wait_us_ = std::min(retry_wait_us_ * 2, config_.retry_max_us);
      retry_at_us_ = now_us + retry_wait_us_;
    }
    return absl::OkStatus();
  }
  counters_.written += written;
  counters_.failed += done.items - written;
  // Bytes of the confirmed items (items of one batch are not told apart: the share of the batch's bytes).
  counters_.bytes_written += done.items == 0 ? 0 : done.bytes * written / done.items;
  if (written > 0) {
    failures_in_row_ = 0;
  } else if (++failures_in_row_ >= config_.failures_to_down) {
    Move(StoreHealth::kDown);
    ++counters_.went_down;
    counters_.shed[static_cast<size_t>(ShedReason::kStoreDown)] += queue_.size();
    queue_.clear();
    queued_keys_.clear();
    queued_bytes_ = 0;
    retry_wait_us_ = config_.retry_initial_us;
    retry_at_us_ = now_us + retry_wait_us_;
  }
  return absl::OkStatus();
}

absl::Status PublishQueue::CheckInvariants() const {
  auto fail = [](const std::string& what) { return absl::InternalError("publish queue invariant: " + what); };
  if (queue_.size() > config_.max_entries) return fail("more entries than max_entries");
  uint64_t bytes = 0;
  absl::flat_hash_set<std::string> keys;
  for (const PublishItem& item : queue_) {
    bytes += item.bytes();
    if (!keys.insert(item.key).second) return fail("a key queued twice");
    if (item.bytes() > config_.batch_max_bytes) return fail("an item larger than a batch is queued");
  }
  if (bytes != queued_bytes_) return fail(absl::StrFormat("queued bytes %d, recount %d", queued_bytes_, bytes));
  if (bytes > config_.max_bytes) return fail("more bytes than max_bytes");
  if (keys != queued_keys_) return fail("the key index differs from the queue");
  if (health_ != StoreHealth::kUp && !queue_.empty()) return fail("items queued while the store is not up");
  const bool probing = in_flight_ && in_flight_->probe;
  if ((health_ == StoreHealth::kProbing) != probing) return fail("probing without a probe in flight, or the reverse");
  if (counters_.offered != counters_.queued + counters_.coalesced + shed_on_offer_) {
    return fail("offered != queued + coalesced + shed at offer");
  }
  const uint64_t shed_later = counters_.shed_total() - shed_on_offer_;
  const uint64_t flying = in_flight_ ? in_flight_->items : 0;
  if (counters_.queued != counters_.written + counters_.failed + shed_later + queue_.size() + flying) {
    return fail("queued != written + failed + shed on going down + depth + in flight");
  }
  if (counters_.peak_depth < queue_.size()) return fail("peak depth below depth");
  if (failures_in_row_ >= config_.failures_to_down && health_ == StoreHealth::kUp) {
    return fail("up after failures_to_down failed batches in a row");
  }
  return absl::OkStatus();
}

}  // namespace dhs::memd
