// memd/cluster_io.cc: see cluster_io.h.
#include "memd/cluster_io.h"

#include "common/check.h"

namespace dhs::memd {

BatchOutcome SendBatch(redis::Client& client, const PublishBatch& batch, std::chrono::milliseconds timeout,
                       absl::FunctionRef<void(const absl::Status&)> on_failure) {
  BatchOutcome out;
  if (batch.probe) {
    out.answered = client.Ping(timeout).ok();
    return out;
  }
  std::vector<redis::SetItem> items;
  items.reserve(batch.items.size());
  for (const PublishItem& item : batch.items) items.push_back(redis::SetItem{item.key, item.value, item.ttl_ms});
  for (const absl::Status& s : client.Set(items, timeout)) {
    out.written += s.ok();
    // An error reply (e.g. OOM) is an answer; a timeout or a dead connection is not.
    out.answered |= s.ok() || s.code() == absl::StatusCode::kInternal;
    if (!s.ok()) on_failure(s);
  }
  return out;
}

bool ClusterPublisher::Pump(int64_t now_us, std::chrono::milliseconds timeout) {
  std::optional<PublishBatch> batch = queue_->NextBatch(now_us);
  if (!batch) return false;
  const BatchOutcome o = SendBatch(*client_, *batch, timeout, [](const absl::Status&) {});
  DHS_CHECK_OK(queue_->BatchDone(batch->id, o.written, o.answered, now_us));
  return true;
}

uint64_t LookupCounters::miss_total() const {
  uint64_t n = 0;
  for (uint64_t m : misses) n += m;
  return n;
}

std::vector<std::optional<ClusterPage>> LookupPages(redis::Client& client, std::span<const PageLookup> lookups,
                                                    const PageGeometry& geometry, std::chrono::milliseconds timeout,
                                                    LookupCounters* counters) {
  std::vector<std::string> keys;
  keys.reserve(lookups.size());
  for (const PageLookup& l : lookups) keys.push_back(l.key);
  std::vector<redis::GetResult> got = client.Get(keys, timeout);
  std::vector<std::optional<ClusterPage>> out(lookups.size());
  counters->lookups += lookups.size();
  for (size_t i = 0; i < lookups.size(); ++i) {
    redis::GetResult& g = got[i];
    auto miss = [&](LookupMiss why) { ++counters->misses[static_cast<size_t>(why)]; };
    if (!g.status.ok()) {
      miss(absl::IsDeadlineExceeded(g.status)  ? LookupMiss::kTimeout
           : absl::IsUnavailable(g.status)     ? LookupMiss::kUnavailable
                                               : LookupMiss::kStoreError);
      continue;
    }
    if (!g.value) {
      miss(LookupMiss::kAbsent);
      continue;
    }
    const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(g.value->data()), g.value->size());
    const DecodedPageValue d = DecodePageValue(bytes, geometry, lookups[i].identity);
    if (!d.ok()) {
      miss(LookupMiss::kBadValue);
      ++counters->bad_values[static_cast<size_t>(d.error)];
      continue;
    }
    ++counters->hits;
    counters->hit_bytes += d.payload.size();
    out[i] = ClusterPage{std::move(*g.value), d.page_checksum};
  }
  return out;
}

}  // namespace dhs::memd
