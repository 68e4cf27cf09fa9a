// workerd/resumed_outputs.cc: see resumed_outputs.h.
#include "workerd/resumed_outputs.h"

#include "absl/strings/str_cat.h"

namespace dhs {

absl::Status ValidateResumedOutputLimits(const ResumedOutputLimits& limits) {
  if (limits.max_outputs == 0) return absl::InvalidArgumentError("--resumed-outputs-max must be at least 1");
  if (limits.max_bytes == 0) return absl::InvalidArgumentError("--resumed-output-bytes-max must be at least 1");
  if (limits.max_age.count() <= 0) return absl::InvalidArgumentError("--resumed-output-age-ms must be at least 1");
  return absl::OkStatus();
}

uint64_t ResumedOutputBytes(uint64_t tokens, uint64_t message_bytes) { return tokens * (4 + 8) + message_bytes; }

std::string_view ResumedDropReasonName(ResumedDropReason reason) {
  switch (reason) {
    case ResumedDropReason::kCount: return "count";
    case ResumedDropReason::kBytes: return "bytes";
    case ResumedDropReason::kAge: return "age";
    case ResumedDropReason::kReplaced: return "replaced";
  }
  return "?";
}

DroppedOutput ResumedOutputBound::Drop(std::map<ResumeKey, Entry>::iterator it, ResumedDropReason reason,
                                       TimePoint now) {
  const auto waited = now > it->second.kept
                          ? std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.kept)
                          : std::chrono::milliseconds(0);
  DroppedOutput d{it->first, it->second.bytes, reason, waited};
  bytes_ -= it->second.bytes;
  by_order_.erase(it->second.order);
  entries_.erase(it);
  return d;
}

std::vector<DroppedOutput> ResumedOutputBound::Keep(ResumeKey key, uint64_t bytes, TimePoint now) {
  std::vector<DroppedOutput> dropped;
  if (auto old = entries_.find(key); old != entries_.end()) {
    dropped.push_back(Drop(old, ResumedDropReason::kReplaced, now));
  }
  if (bytes > limits_.max_bytes) {  // never fits: dropped at once, nothing else moves
    dropped.push_back(DroppedOutput{key, bytes, ResumedDropReason::kBytes, std::chrono::milliseconds(0)});
    return dropped;
  }
  const uint64_t order = next_order_++;
  entries_.emplace(key, Entry{bytes, now, order});
  by_order_.emplace(order, key);
  bytes_ += bytes;
  while (entries_.size() > limits_.max_outputs || bytes_ > limits_.max_bytes) {
    const ResumedDropReason why =
        entries_.size() > limits_.max_outputs ? ResumedDropReason::kCount : ResumedDropReason::kBytes;
    dropped.push_back(Drop(entries_.find(by_order_.begin()->second), why, now));  // never `key`: it fits alone
  }
  return dropped;
}

bool ResumedOutputBound::Claim(ResumeKey key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.bytes;
  by_order_.erase(it->second.order);
  entries_.erase(it);
  return true;
}

std::vector<DroppedOutput> ResumedOutputBound::Expire(TimePoint now) {
  std::vector<DroppedOutput> dropped;
  last_expire_ = now;
  while (!by_order_.empty()) {
    auto it = entries_.find(by_order_.begin()->second);
    if (now - it->second.kept < limits_.max_age) break;  // the oldest is young enough: so are the later ones
    dropped.push_back(Drop(it, ResumedDropReason::kAge, now));
  }
  return dropped;
}

absl::Status ResumedOutputBound::CheckInvariants() const {
  if (entries_.size() > limits_.max_outputs) {
    return absl::InternalError(absl::StrCat(entries_.size(), " outputs kept, over ", limits_.max_outputs));
  }
  if (bytes_ > limits_.max_bytes) {
    return absl::InternalError(absl::StrCat(bytes_, " bytes kept, over ", limits_.max_bytes));
  }
  if (by_order_.size() != entries_.size()) return absl::InternalError("age index and outputs differ");
  uint64_t sum = 0;
  for (const auto& [key, e] : entries_) {
    sum += e.bytes;
    auto o = by_order_.find(e.order);
    if (o == by_order_.end() || o->second != key) return absl::InternalError("an output missing from the age index");
    if (last_expire_ >= e.kept && last_expire_ - e.kept >= limits_.max_age) {
      return absl::InternalError(absl::StrCat("request ", key.second, " kept past max_age at the latest Expire"));
    }
  }
  if (sum != bytes_) return absl::InternalError(absl::StrCat("bytes ", bytes_, " != sum of outputs ", sum));
  return absl::OkStatus();
}

}  // namespace dhs
