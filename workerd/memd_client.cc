// workerd/memd_client.cc: see memd_client.h.
#include "workerd/memd_client.h"

#include <unistd.h>

#include <algorithm>

#include "common/log_limiter.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/protocol.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs {
namespace {
uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
}  // namespace

absl::StatusOr<std::unique_ptr<MemdClient>> MemdClient::Connect(std::string_view run_dir, const wire::HelloT& hello,
                                                                std::chrono::milliseconds timeout) {
  // A socket this user may not reach fails now, not after `timeout` without a HelloReply (ZeroMQ would retry silently).
  // No socket yet (memd still starting) is waited for as before.
  if (absl::Status s = CheckSocketAccess(run_dir, "memd"); !s.ok() && !absl::IsNotFound(s)) {
    return absl::Status(s.code(), absl::StrCat("memd: ", s.message()));
  }
  const std::string sender = absl::StrCat("worker/", hello.gpu);
  absl::StatusOr<std::unique_ptr<DealerClient>> dealer =
      DealerClient::Connect(IpcEndpoint(run_dir, "memd"), DealerClient::Options{sender, std::chrono::milliseconds(20)});
  if (!dealer.ok()) return dealer.status();
  std::unique_ptr<MemdClient> c(new MemdClient(*std::move(dealer), sender, hello.gpu));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const uint64_t seq = c->NextSeq();
  if (absl::Status s = c->dealer_->Send(EncodeHello(hello, seq, sender)); !s.ok()) return s;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(absl::StrCat("no HelloReply from memd at ", IpcEndpoint(run_dir, "memd")));
    }
    absl::StatusOr<std::string> bytes = c->dealer_->Receive(left);
    if (absl::IsDeadlineExceeded(bytes.status())) continue;
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<Message> msg = DecodeEnvelope(*bytes);
    if (!msg.ok()) return msg.status();
    if (msg->type == wire::Body::ErrorReply) return ReadErrorStatus(*msg);
    if (msg->type != wire::Body::HelloReply) continue;
    absl::StatusOr<wire::HelloReplyT> reply = ReadHelloReply(*msg);
    if (!reply.ok()) return reply.status();
    if (!reply->accepted) return absl::FailedPreconditionError(absl::StrCat("memd refused Hello: ", reply->reason));
    c->epoch_ = reply->worker_epoch;
    c->interrupted_ = reply->interrupted_requests;
    c->records_ = std::move(reply->interrupted_records);
    c->last_heard_ = std::chrono::steady_clock::now();
    if (!reply->segments.empty()) {
      const wire::HostSegmentInfoT& info = *reply->segments[0];
      absl::StatusOr<std::unique_ptr<HostPoolSegment>> seg = HostPoolSegment::Open(info.name);
      if (!seg.ok()) return seg.status();
      if ((*seg)->page_bytes() != hello.host_page_bytes) {
        return absl::InvalidArgumentError(absl::StrCat("host pool '", info.name, "' has pages of ",
                                                       (*seg)->page_bytes(), " bytes, this worker's host pages have ",
                                                       hello.host_page_bytes));
      }
      c->segment_ = *std::move(seg);
    }
    spdlog::info("workerd: memd accepted gpu {} (epoch {}, {} host segment(s))", hello.gpu, c->epoch_,
                 reply->segments.size());
    return c;
  }
}

std::span<uint8_t> MemdClient::host_pages() const {
  if (segment_ == nullptr) return {};
  return {*segment_->PageData(0), segment_->pages() * segment_->page_bytes()};
}

absl::Status MemdClient::CheckEpoch() {
  if (!ended_.ok()) return ended_;
  if (const auto silent = std::chrono::steady_clock::now() - last_heard_; silent > memd_timeout_) {
    ended_ = absl::AbortedError(absl::StrFormat(
        "memd lost: nothing from memd for %d ms (it acks our heartbeat every second; memd timeout %d ms): memd died "
        "or hung, or this worker was stopped; the grants of epoch %d are void",
        std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(), memd_timeout_.count(), epoch_));
  }
  return ended_;
}

absl::Status MemdClient::Poll(MemdHandler& handler, const Load& load) {
  if (absl::Status s = CheckEpoch(); !s.ok()) return s;
  while (true) {
    absl::StatusOr<std::string> bytes = dealer_->Receive(std::chrono::milliseconds(0));
    if (absl::IsDeadlineExceeded(bytes.status())) break;
    if (!bytes.ok()) return bytes.status();
    last_heard_ = std::chrono::steady_clock::now();
    Dispatch(*bytes, handler);
    if (!ended_.ok()) return ended_;
  }
  const auto now = std::chrono::steady_clock::now();
  // Every second, or a third of the memd timeout when that is shorter: memd's acks keep last_heard_ fresh.
  if (now - last_heartbeat_ >= std::min<std::chrono::steady_clock::duration>(std::chrono::seconds(1),
                                                                            memd_timeout_ / 3)) {
    last_heartbeat_ = now;
    wire::HeartbeatT hb;
    hb.sender_time_ns = NowNs();
    hb.gpu = gpu_;
    hb.active_requests = load.active_requests;
    hb.pending_copies = load.pending_copies;
    hb.decode_tokens_per_s = load.decode_tokens_per_s;
    if (absl::Status s = dealer_->Send(EncodeHeartbeat(hb, NextSeq(), sender_)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void MemdClient::Dispatch(const std::string& bytes, MemdHandler& handler) {
  absl::StatusOr<Message> msg = DecodeEnvelope(bytes);
  if (!msg.ok()) {
    DHS_LOG_LIMITED(spdlog::level::warn, "workerd: undecodable message from memd dropped: {}", msg.status().ToString());
    return;
  }
  auto bad = [&](const absl::Status& s) { spdlog::warn("workerd: bad {} from memd: {}", BodyName(msg->type), s.ToString()); };
#define DHS_DISPATCH(Name)                               \
  case wire::Body::Name: {                               \
    absl::StatusOr<wire::Name##T> m = Read##Name(*msg);  \
    if (!m.ok()) return bad(m.status());                 \
    handler.On##Name(*m);                                \
    return;                                              \
  }
  switch (msg->type) {
    DHS_DISPATCH(AdmitGrant)
    DHS_DISPATCH(AdmitWait)
    DHS_DISPATCH(AdmitReject)
    DHS_DISPATCH(ReclaimOrder)
    DHS_DISPATCH(Retire)
    DHS_DISPATCH(PopulateOrder)
    DHS_DISPATCH(CompleteAck)
    case wire::Body::Heartbeat: {
      absl::StatusOr<wire::HeartbeatT> hb = ReadHeartbeat(*msg);
      if (!hb.ok()) return bad(hb.status());
      wire::HeartbeatAckT ack;
      ack.sender_time_ns = hb->sender_time_ns;
      ack.receiver_time_ns = NowNs();
      if (absl::Status s = dealer_->Send(EncodeHeartbeatAck(ack, msg->sequence, sender_)); !s.ok()) {
        spdlog::warn("workerd: cannot answer memd's heartbeat: {}", s.ToString());
      }
      return;
    }
    case wire::Body::HeartbeatAck:
      return;
    case wire::Body::TokensCommittedAck:
      if (msg->sequence == commit_seq_) commit_seq_ = 0;  // the next TokensCommitted may go
      return;
    case wire::Body::ErrorReply: {
      const absl::Status s = ReadErrorStatus(*msg);
      if (msg->sequence == commit_seq_ && commit_seq_ != 0) {
        commit_seq_ = 0;
        spdlog::warn("workerd: memd refused tokens committed: {}", s.ToString());
        return;
      }
      auto it = admit_seq_.find(msg->sequence);
      if (it != admit_seq_.end()) {  // memd could not serve an AdmitRequest: the request is refused
        wire::AdmitRejectT reject;
        reject.request = it->second;
        reject.code = ToWireError(s);
        reject.reason = std::string(s.message());
        admit_seq_.erase(it);
        handler.OnAdmitReject(reject);
        return;
      }
      if (absl::IsFailedPrecondition(s) && absl::StartsWith(s.message(), "fenced: ")) {
        ended_ = absl::AbortedError(absl::StrCat("fenced by memd: ", s.message()));
        return;
      }
      spdlog::warn("workerd: memd answered message {} with an error: {}", msg->sequence, s.ToString());
      return;
    }
    default:
      DHS_LOG_LIMITED(spdlog::level::warn, "workerd: unexpected {} from memd dropped", BodyName(msg->type));
  }
#undef DHS_DISPATCH
}

absl::Status MemdClient::SendAdmitRequest(const wire::AdmitRequestT& m) {
  if (!ended_.ok()) return ended_;
  const uint64_t seq = NextSeq();
  admit_seq_[seq] = m.request;
  if (admit_seq_.size() > 4096) admit_seq_.erase(admit_seq_.begin());  // bounded: only recent admissions matter
  return dealer_->Send(EncodeAdmitRequest(m, seq, sender_));
}
absl::Status MemdClient::SendBackupComplete(const wire::BackupCompleteT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  return dealer_->Send(EncodeBackupComplete(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendHostCopyWritten(const wire::HostCopyWrittenT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  return dealer_->Send(EncodeHostCopyWritten(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendReadersDone(const wire::ReadersDoneT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  return dealer_->Send(EncodeReadersDone(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendReadyPublish(const wire::ReadyPublishT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  return dealer_->Send(EncodeReadyPublish(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendComplete(const wire::CompleteT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  return dealer_->Send(EncodeComplete(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendTokensCommitted(const wire::TokensCommittedT& m) {
  // Checked now, not only at the next Poll: a worker stopped mid-step must not report a step of a fenced epoch.
  if (absl::Status s = CheckEpoch(); !s.ok()) return s;
  if (commit_seq_ != 0) return absl::UnavailableError("the previous TokensCommitted is not acknowledged yet");
  const uint64_t seq = NextSeq();
  if (absl::Status s = dealer_->Send(EncodeTokensCommitted(m, seq, sender_)); !s.ok()) return s;
  commit_seq_ = seq;
  return absl::OkStatus();
}

}  // namespace dhs
