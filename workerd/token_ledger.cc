// workerd/token_ledger.cc: see token_ledger.h.
#include "workerd/token_ledger.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace dhs {

std::vector<TokenLedger::Entry> TokenLedger::Next(const RequestBook& book, const TotalFn& total) {
  if (in_flight_) return {};
  const auto behind = [&](RequestId id) -> std::optional<Entry> {
    const RequestLife* life = book.Find(id);
    if (life == nullptr || life->phase != RequestPhase::kActive || !life->tokens.refused.ok()) return std::nullopt;
    const size_t have = total(id);
    if (have <= life->tokens.committed) return std::nullopt;
    return Entry{id, life->tokens.committed, have};
  };
  while (!probe_.empty()) {  // after a refused message: one request per message until each is answered alone
    if (std::optional<Entry> e = behind(probe_.front())) return {*e};
    probe_.pop_front();
  }
  std::vector<Entry> entries;
  for (const auto& [id, life] : book.requests()) {
    if (std::optional<Entry> e = behind(id)) entries.push_back(*e);
  }
  return entries;
}

void TokenLedger::Sent(std::vector<Entry> entries) {
  if (!entries.empty()) in_flight_ = std::move(entries);
}

size_t TokenLedger::Acked(RequestBook& book) {
  if (!in_flight_) return 0;
  size_t acked = 0;
  for (const Entry& e : *in_flight_) {
    RequestLife* life = book.Find(e.request);
    if (life == nullptr || life->tokens.committed >= e.to) continue;
    acked += e.to - life->tokens.committed;
    life->tokens.committed = e.to;
  }
  if (!probe_.empty() && in_flight_->size() == 1 && in_flight_->front().request == probe_.front()) {
    probe_.pop_front();
  }
  in_flight_.reset();
  return acked;
}

std::optional<RequestId> TokenLedger::Refused(RequestBook& book, const absl::Status& why) {
  if (!in_flight_) return std::nullopt;
  std::optional<RequestId> alone;
  if (in_flight_->size() == 1) {  // refused alone: this request's record stops at what memd acknowledged
    const RequestId id = in_flight_->front().request;
    if (RequestLife* life = book.Find(id); life != nullptr) life->tokens.refused = why;
    if (!probe_.empty() && probe_.front() == id) probe_.pop_front();
    alone = id;
  } else {  // some entries were applied, some not: each request goes again alone
    for (const Entry& e : *in_flight_) {
      if (std::find(probe_.begin(), probe_.end(), e.request) == probe_.end()) probe_.push_back(e.request);
    }
  }
  in_flight_.reset();
  return alone;
}

void TokenLedger::Lost() {
  in_flight_.reset();
  probe_.clear();
}

absl::Status TokenLedger::CheckInvariants() const {
  if (in_flight_) {
    if (in_flight_->empty()) return absl::InternalError("an empty TokensCommitted in flight");
    std::set<RequestId> seen;
    for (const Entry& e : *in_flight_) {
      if (e.from >= e.to) {
        return absl::InternalError(absl::StrCat("request ", e.request, ": entry [", e.from, ", ", e.to, ") in flight"));
      }
      if (!seen.insert(e.request).second) {
        return absl::InternalError(absl::StrCat("request ", e.request, " twice in the message in flight"));
      }
    }
    if (!probe_.empty() && in_flight_->size() != 1) {
      return absl::InternalError(absl::StrCat(in_flight_->size(), " entries in flight while probing"));
    }
  }
  std::set<RequestId> probed(probe_.begin(), probe_.end());
  if (probed.size() != probe_.size()) return absl::InternalError("a request twice in the probe queue");
  return absl::OkStatus();
}

}  // namespace dhs
