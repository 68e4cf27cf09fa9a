// workerd/client_outbox.cc: see client_outbox.h.
#include "workerd/client_outbox.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dhs {

PushVerdict ClientOutbox::Push(const std::string& peer, std::string bytes, ReplyKind kind) {
  const uint64_t size = bytes.size();
  if (kind != ReplyKind::kEnd && Full(peer, size)) {
    ++(kind == ReplyKind::kStream ? stats_.streams_refused : stats_.replies_dropped);
    return PushVerdict::kRefused;
  }
  Client& c = clients_[peer];
  c.queue.push_back(Queued{std::move(bytes), kind});
  c.bytes += size;
  stats_.queued_bytes += size;
  if (kind != ReplyKind::kEnd) {
    c.limited_bytes += size;
    limited_bytes_ += size;
  }
  stats_.peak_queued_bytes = std::max(stats_.peak_queued_bytes, stats_.queued_bytes);
  return PushVerdict::kQueued;
}

bool ClientOutbox::Full(const std::string& peer, uint64_t bytes) const {
  return queued_bytes(peer) + bytes > limits_.per_client_bytes || stats_.queued_bytes + bytes > limits_.total_bytes;
}

uint64_t ClientOutbox::queued_bytes(const std::string& peer) const {
  auto it = clients_.find(peer);
  return it == clients_.end() ? 0 : it->second.bytes;
}

const std::string* ClientOutbox::Front(const std::string& peer) const {
  auto it = clients_.find(peer);
  return it == clients_.end() ? nullptr : &it->second.queue.front().bytes;
}

void ClientOutbox::Remove(std::map<std::string, Client>::iterator it, const Queued& q) {
  const uint64_t size = q.bytes.size();
  it->second.bytes -= size;
  stats_.queued_bytes -= size;
  if (q.kind != ReplyKind::kEnd) {
    it->second.limited_bytes -= size;
    limited_bytes_ -= size;
  }
}

void ClientOutbox::Sent(const std::string& peer) {
  auto it = clients_.find(peer);
  if (it == clients_.end()) return;
  Remove(it, it->second.queue.front());
  it->second.queue.pop_front();
  if (it->second.queue.empty()) clients_.erase(it);
}

void ClientOutbox::PeerGone(const std::string& peer) {
  auto it = clients_.find(peer);
  if (it != clients_.end()) {
    for (const Queued& q : it->second.queue) Remove(it, q);
    stats_.dropped_for_gone += it->second.queue.size();
    clients_.erase(it);
  }
  if (std::find(gone_.begin(), gone_.end(), peer) == gone_.end()) gone_.push_back(peer);
}

std::vector<std::string> ClientOutbox::Backlogged() const {
  std::vector<std::string> out;
  out.reserve(clients_.size());
  for (const auto& [peer, c] : clients_) out.push_back(peer);
  return out;
}

std::vector<std::string> ClientOutbox::TakeGonePeers() { return std::exchange(gone_, {}); }

absl::Status ClientOutbox::CheckInvariants() const {
  uint64_t total = 0, limited = 0;
  for (const auto& [peer, c] : clients_) {
    if (c.queue.empty()) return absl::InternalError(absl::StrCat("client ", peer, " has an entry and nothing queued"));
    uint64_t bytes = 0, mine = 0;
    for (const Queued& q : c.queue) {
      bytes += q.bytes.size();
      if (q.kind != ReplyKind::kEnd) mine += q.bytes.size();
    }
    if (bytes != c.bytes || mine != c.limited_bytes) {
      return absl::InternalError(absl::StrCat("client ", peer, ": counted ", c.bytes, "/", c.limited_bytes,
                                              " bytes, queued ", bytes, "/", mine));
    }
    if (mine > limits_.per_client_bytes) {
      return absl::InternalError(absl::StrCat("client ", peer, ": ", mine, " limited bytes > per-client limit ",
                                              limits_.per_client_bytes));
    }
    total += bytes;
    limited += mine;
  }
  if (total != stats_.queued_bytes || limited != limited_bytes_) {
    return absl::InternalError(absl::StrCat("counted ", stats_.queued_bytes, "/", limited_bytes_, " bytes, queued ",
                                            total, "/", limited));
  }
  if (limited > limits_.total_bytes) {
    return absl::InternalError(absl::StrCat(limited, " limited bytes > total limit ", limits_.total_bytes));
  }
  return absl::OkStatus();
}

}  // namespace dhs
