// workerd/memd_client.cc: see memd_client.h.
#include "workerd/memd_client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "common/check.h"
#include "common/log_limiter.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/protocol.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs {
namespace {
// The inode of shm object `name` (0 when it cannot be read): a fresh pool under the same name is another object.
uint64_t ShmInode(const std::string& name) {
  struct stat st {};
  if (::stat(absl::StrCat(kHostPoolShmDir, "/", name).c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}
}  // namespace

absl::StatusOr<std::unique_ptr<MemdClient>> MemdClient::Connect(std::string_view run_dir, const wire::HelloT& hello,
                                                                std::chrono::milliseconds timeout) {
  // A socket this user may not reach fails now, not after `timeout` without a HelloReply (ZeroMQ would retry silently).
  // No socket yet (memd still starting), or a dead memd's socket (a new memd replaces it), is waited for as before.
  if (absl::Status s = CheckSocketAccess(run_dir, "memd"); !s.ok() && !absl::IsNotFound(s) && !absl::IsUnavailable(s)) {
    return absl::Status(s.code(), absl::StrCat("memd: ", s.message()));
  }
  const std::string sender = absl::StrCat("worker/", hello.gpu);
  absl::StatusOr<std::unique_ptr<DealerClient>> dealer =
      DealerClient::Connect(IpcEndpoint(run_dir, "memd"), DealerClient::Options{sender, std::chrono::milliseconds(20)});
  if (!dealer.ok()) return dealer.status();
  std::unique_ptr<MemdClient> c(new MemdClient(*std::move(dealer), sender, hello.gpu, std::string(run_dir)));
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
    c->AdoptWorkerTimeout(reply->worker_timeout_ms);
    c->interrupted_ = reply->interrupted_requests;
    c->records_ = std::move(reply->interrupted_records);
    c->finished_records_ = std::move(reply->finished_records);
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
      c->pool_inode_ = ShmInode(info.name);
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
  if (session().away()) return absl::OkStatus();
  const auto now = std::chrono::steady_clock::now();
  const auto stalled = now - last_check_;  // this worker did not run (SIGSTOP, starved) for this long
  last_check_ = now;
  // memd's connection closed: it died (checked before the silence: a dead memd is not a hung one). PeerClosed, not
  // the socket monitor alone: after a long stall (SIGSTOP) the I/O thread may not have reported the close yet.
  if (dealer_->PeerClosed()) {
    EnterAway();
    return absl::OkStatus();
  }
  if (const auto silent = now - last_heard_; silent > memd_timeout_) {
    const auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    ended_ = absl::AbortedError(absl::StrFormat(
        "memd lost: nothing from memd for %d ms (memd timeout %d ms; it acks our heartbeat every second) while its "
        "connection is still open: %s; memd may have fenced this worker meanwhile, the grants of epoch %d are void",
        ms(silent), memd_timeout_.count(),
        stalled > memd_timeout_ / 2
            ? absl::StrFormat("this worker did not run for %d ms (stopped or starved)", ms(stalled))
            : std::string("memd hangs"),
        epoch_));
  }
  return ended_;
}

absl::Status MemdClient::Poll(MemdHandler& handler, const Load& load) {
  if (absl::Status s = CheckEpoch(); !s.ok()) return s;
  if (session().away()) return absl::OkStatus();  // PollAway
  // What arrived while the worker prepared (KeepAlive), first and in order.
  std::vector<std::string> held = std::move(held_);
  held_.clear();
  for (const std::string& bytes : held) {
    Dispatch(bytes, handler);
    if (!ended_.ok()) return ended_;
  }
  while (true) {
    absl::StatusOr<std::string> bytes = dealer_->Receive(std::chrono::milliseconds(0));
    if (absl::IsDeadlineExceeded(bytes.status())) break;
    if (!bytes.ok()) return bytes.status();
    last_heard_ = std::chrono::steady_clock::now();
    Dispatch(*bytes, handler);
    if (!ended_.ok()) return ended_;
  }
  return HeartbeatIfDue(load);
}

absl::Status MemdClient::HeartbeatIfDue(const Load& load) {
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

namespace {
// The messages KeepAlive dispatches at once (the rest is held for the first Poll).
using ServedBeforeTheWorker = MessageSet<wire::Body::Heartbeat, wire::Body::HeartbeatAck, wire::Body::ErrorReply>;

// KeepAlive's handler: only Heartbeat, HeartbeatAck and ErrorReply reach Dispatch before the Worker exists, and none
// of those calls a handler then (no AdmitRequest is out: the ErrorReply of one cannot come). An order reaching it
// would be a bug of KeepAlive's sorting, so it is logged, never acted on.
class NoWorkerYet final : public MemdHandler {
 public:
  void OnAdmitGrant(const wire::AdmitGrantT&) override { Drop("AdmitGrant"); }
  void OnAdmitWait(const wire::AdmitWaitT&) override { Drop("AdmitWait"); }
  void OnAdmitReject(const wire::AdmitRejectT&) override { Drop("AdmitReject"); }
  void OnReclaimOrder(const wire::ReclaimOrderT&) override { Drop("ReclaimOrder"); }
  void OnRetire(const wire::RetireT&) override { Drop("Retire"); }
  void OnPopulateOrder(const wire::PopulateOrderT&) override { Drop("PopulateOrder"); }
  void OnCompleteAck(const wire::CompleteAckT&) override { Drop("CompleteAck"); }

 private:
  static void Drop(const char* what) { spdlog::error("workerd: {} from memd before the worker exists, dropped", what); }
};
}  // namespace

absl::Status MemdClient::KeepAlive(std::chrono::milliseconds wait) {
  if (absl::Status s = CheckEpoch(); !s.ok()) return s;
  if (session().away()) {  // memd died: the re-Hello needs the Worker's report; the first Poll after start begins it
    std::this_thread::sleep_for(wait);
    return absl::OkStatus();
  }
  if (absl::Status s = HeartbeatIfDue(Load{}); !s.ok()) return s;
  absl::StatusOr<std::string> bytes = dealer_->Receive(wait);
  while (bytes.ok()) {
    last_heard_ = std::chrono::steady_clock::now();
    absl::StatusOr<Message> msg = DecodeEnvelope(*bytes);
    if (msg.ok() && ServedBeforeTheWorker::Has(msg->type)) {
      NoWorkerYet none;
      Dispatch(*bytes, none);  // answers memd's Heartbeat; a "fenced" ErrorReply ends the epoch now
      if (!ended_.ok()) return ended_;
    } else {
      held_.push_back(*std::move(bytes));  // an order (or an undecodable message): the first Poll dispatches it
    }
    bytes = dealer_->Receive(std::chrono::milliseconds(0));
  }
  if (!absl::IsDeadlineExceeded(bytes.status())) return bytes.status();
  return absl::OkStatus();
}

// The messages memd sends no worker (docs/protocol.md): the rest of the union is handled by Dispatch's FromMemd.
// HelloReply is read by Connect / PollAway only; one reaching Dispatch is unexpected too.
using NotFromMemd =
    MessageSet<wire::Body::Hello, wire::Body::HelloReply, wire::Body::AdmitRequest, wire::Body::BackupComplete,
               wire::Body::ReadersDone, wire::Body::ReadyPublish, wire::Body::Complete, wire::Body::IntrospectQuery,
               wire::Body::IntrospectReply, wire::Body::SubmitRequest, wire::Body::SubmitAccepted,
               wire::Body::TokenChunk, wire::Body::WorkerStatsQuery, wire::Body::WorkerStatsReply,
               wire::Body::HostCopyWritten, wire::Body::TokensCommitted, wire::Body::Attach, wire::Body::Cancel>;

void MemdClient::Dispatch(const std::string& bytes, MemdHandler& handler) {
  absl::StatusOr<Message> msg = DecodeEnvelope(bytes);
  if (!msg.ok()) {
    DHS_LOG_LIMITED(spdlog::level::warn, "workerd: undecodable message from memd dropped: {}", msg.status().ToString());
    return;
  }
  // One overload per message the worker takes from memd (ReceiveMessage checks that with NotFromMemd it covers the
  // union): memd's orders and answers go to `handler`; the conversation's own messages are served here.
  struct FromMemd {
    MemdClient& client;
    MemdHandler& handler;
    const Message& msg;
    void operator()(const wire::AdmitGrantT& m) { handler.OnAdmitGrant(m); }
    void operator()(const wire::AdmitWaitT& m) { handler.OnAdmitWait(m); }
    void operator()(const wire::AdmitRejectT& m) { handler.OnAdmitReject(m); }
    void operator()(const wire::ReclaimOrderT& m) { handler.OnReclaimOrder(m); }
    void operator()(const wire::RetireT& m) { handler.OnRetire(m); }
    void operator()(const wire::PopulateOrderT& m) { handler.OnPopulateOrder(m); }
    void operator()(const wire::CompleteAckT& m) { handler.OnCompleteAck(m); }
    void operator()(const wire::HeartbeatT& hb) {
      wire::HeartbeatAckT ack;
      ack.sender_time_ns = hb.sender_time_ns;
      ack.receiver_time_ns = NowNs();
      if (absl::Status s = client.dealer_->Send(EncodeHeartbeatAck(ack, msg.sequence, client.sender_)); !s.ok()) {
        spdlog::warn("workerd: cannot answer memd's heartbeat: {}", s.ToString());
      }
    }
    void operator()(const wire::HeartbeatAckT&) {}
    void operator()(const wire::TokensCommittedAckT&) {
      if (msg.sequence == client.commit_seq_ && client.commit_seq_ != 0) {
        client.commit_seq_ = 0;  // the next TokensCommitted may go
        handler.OnTokensCommitted();
      }
    }
    void operator()(const wire::ErrorReplyT&) { client.OnErrorReply(msg, handler); }
  } from_memd{*this, handler, *msg};
  const absl::Status read = ReceiveMessage<NotFromMemd>(*msg, from_memd, [&](wire::Body type) {
    DHS_LOG_LIMITED(spdlog::level::warn, "workerd: unexpected {} from memd dropped", BodyName(type));
  });
  if (!read.ok()) spdlog::warn("workerd: bad {} from memd: {}", BodyName(msg->type), read.ToString());
}

void MemdClient::OnErrorReply(const Message& msg, MemdHandler& handler) {
  const absl::Status s = ReadErrorStatus(msg);
  // Fenced first, whatever message it answers: the epoch ended (review finding: a FENCED answer to the TokensCommitted
  // in flight was taken for a refusal of those tokens, and the epoch went on until another message was refused).
  if (IsFenced(s)) {  // ErrorReply.reason FENCED (the code, not the text)
    ended_ = absl::AbortedError(absl::StrCat("fenced by memd: ", s.message()));
    return;
  }
  if (msg.sequence == commit_seq_ && commit_seq_ != 0) {
    commit_seq_ = 0;
    spdlog::warn("workerd: memd refused tokens committed: {}", s.ToString());
    handler.OnTokensRefused(s);
    return;
  }
  auto it = admit_seq_.find(msg.sequence);
  if (it != admit_seq_.end()) {  // memd could not serve an AdmitRequest: the request is refused
    wire::AdmitRejectT reject;
    reject.request = it->second;
    reject.code = ToWireError(s);
    reject.reason = std::string(s.message());
    admit_seq_.erase(it);
    handler.OnAdmitReject(reject);
    return;
  }
  spdlog::warn("workerd: memd answered message {} with an error: {}", msg.sequence, s.ToString());
}

absl::Status MemdClient::SendAdmitRequest(const wire::AdmitRequestT& m) {
  if (!ended_.ok()) return ended_;
  if (session().away()) return absl::OkStatus();  // memd died: the waiting admissions go again after the re-Hello
  const uint64_t seq = NextSeq();
  admit_seq_[seq] = m.request;
  if (admit_seq_.size() > 4096) admit_seq_.erase(admit_seq_.begin());  // bounded: only recent admissions matter
  return dealer_->Send(EncodeAdmitRequest(m, seq, sender_));
}
absl::Status MemdClient::SendBackupComplete(const wire::BackupCompleteT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  if (session().away()) return absl::OkStatus();  // memd died: the re-Hello tells the next one what it must know
  return dealer_->Send(EncodeBackupComplete(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendHostCopyWritten(const wire::HostCopyWrittenT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  if (session().away()) return absl::OkStatus();  // memd died: the re-Hello tells the next one what it must know
  return dealer_->Send(EncodeHostCopyWritten(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendReadersDone(const wire::ReadersDoneT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  if (session().away()) return absl::OkStatus();  // memd died: the re-Hello tells the next one what it must know
  return dealer_->Send(EncodeReadersDone(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendReadyPublish(const wire::ReadyPublishT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  if (session().away()) return absl::OkStatus();  // memd died: the re-Hello tells the next one what it must know
  return dealer_->Send(EncodeReadyPublish(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendComplete(const wire::CompleteT& m) {
  if (!ended_.ok()) return ended_;  // the epoch ended: memd dropped its state, nothing of it is reported
  if (session().away()) return absl::OkStatus();  // memd died: the re-Hello tells the next one what it must know
  return dealer_->Send(EncodeComplete(m, NextSeq(), sender_));
}
absl::Status MemdClient::SendTokensCommitted(const wire::TokensCommittedT& m) {
  // Checked now, not only at the next Poll: a worker stopped mid-step must not report a step of a fenced epoch.
  if (absl::Status s = CheckEpoch(); !s.ok()) return s;
  if (session().away()) {
    return absl::UnavailableError("memd is away (it died): the tokens go with the re-Hello's report");
  }
  if (commit_seq_ != 0) return absl::UnavailableError("the previous TokensCommitted is not acknowledged yet");
  const uint64_t seq = NextSeq();
  if (absl::Status s = dealer_->Send(EncodeTokensCommitted(m, seq, sender_)); !s.ok()) return s;
  commit_seq_ = seq;
  return absl::OkStatus();
}

}  // namespace dhs

namespace dhs {

void MemdClient::EnterAway() {
  session().ConnectionLost(std::chrono::steady_clock::now());  // kLost; the first attempt in 50 ms
  dealer_.reset();  // closed with linger 0: nothing queued for the dead memd reaches the next one
  held_.clear();    // nor is anything the dead memd sent during the start-up acted on
  commit_seq_ = 0;
  admit_seq_.clear();
  spdlog::warn("workerd: memd's connection closed (memd died): serving from the GPU and saying Hello again to the "
               "next memd (epoch {}) for up to {} ms", epoch_, reconnect_bound_.count());
}

void MemdClient::RetryLater(std::chrono::steady_clock::time_point now) {
  dealer_.reset();
  session().RetryLater(now);
}

std::chrono::milliseconds EffectiveMemdTimeout(std::chrono::milliseconds configured, uint32_t memd_worker_timeout_ms) {
  if (memd_worker_timeout_ms == 0) return configured;
  const std::chrono::milliseconds cap{std::max<int64_t>(1, int64_t{memd_worker_timeout_ms} * 2 / 3)};
  return std::min(configured, cap);
}

void MemdClient::AdoptWorkerTimeout(uint32_t memd_worker_timeout_ms) {
  const bool told = memd_worker_timeout_ms != memd_worker_timeout_ms_;
  memd_worker_timeout_ms_ = memd_worker_timeout_ms;
  memd_timeout_ = EffectiveMemdTimeout(configured_timeout_, memd_worker_timeout_ms);
  if (memd_timeout_ < configured_timeout_ && told) {
    spdlog::warn("workerd: --memd-timeout-ms {} is not below memd's --worker-timeout-ms {}: using {} ms (2/3 of it), so "
                 "that a stopped worker learns memd fenced it before acting on a grant",
                 configured_timeout_.count(), memd_worker_timeout_ms, memd_timeout_.count());
  }
}

absl::Status MemdClient::CheckSamePool(const wire::HelloReplyT& reply) const {
  if (segment_ == nullptr) return absl::OkStatus();  // resident mode without a pool
  if (reply.segments.empty()) return absl::AbortedError("the new memd lists no host pool");
  const wire::HostSegmentInfoT& info = *reply.segments[0];
  if (info.name != segment_->name() || info.size_bytes != segment_->size_bytes() ||
      info.page_bytes != segment_->page_bytes() || ShmInode(info.name) != pool_inode_) {
    return absl::AbortedError(absl::StrCat("the new memd's host pool '", info.name, "' (", info.size_bytes,
                                           " bytes) is not the one this worker maps ('", segment_->name(), "', ",
                                           segment_->size_bytes(), " bytes): it started a fresh pool"));
  }
  return absl::OkStatus();
}

absl::Status MemdClient::AcceptReHello(const wire::HelloReplyT& reply) {
  absl::Status s;
  if (!reply.accepted) {
    s = absl::AbortedError(absl::StrCat("memd refused the re-Hello: ", reply.reason));
  } else if (reply.worker_epoch != epoch_) {
    s = absl::AbortedError(absl::StrCat("memd answered the re-Hello of epoch ", epoch_, " with epoch ",
                                        reply.worker_epoch));
  } else {
    s = CheckSamePool(reply);
  }
  if (!s.ok()) {
    ended_ = absl::AbortedError(absl::StrCat("memd restart: ", s.message()));
    dealer_.reset();
    return ended_;
  }
  AdoptWorkerTimeout(reply.worker_timeout_ms);  // the new memd may have another --worker-timeout-ms
  const auto now = std::chrono::steady_clock::now();
  DHS_CHECK_OK(session().Accepted());  // a re-Hello was out (PollAway)
  last_heard_ = now;
  last_heartbeat_ = {};
  interrupted_ = reply.interrupted_requests;
  records_.clear();  // their records with them (review finding: libdhs listed resumable requests of 0 rows after it)
  for (const auto& rec : reply.interrupted_records) {
    if (rec != nullptr) records_.push_back(std::make_unique<wire::RequestRecordT>(*rec));
  }
  spdlog::info("workerd: memd took the re-Hello of gpu {} (epoch {}) {} ms after the old one died ({} attempts): {} "
               "reports refused, {} interrupted requests", gpu_, epoch_,
               std::chrono::duration_cast<std::chrono::milliseconds>(now - session().away_since()).count(),
               session().attempts(),
               reply.refused_reports.size(), reply.interrupted_requests.size());
  return absl::OkStatus();
}

absl::StatusOr<std::optional<wire::HelloReplyT>> MemdClient::PollAway(const std::function<wire::HelloT()>& make_hello) {
  if (!ended_.ok()) return ended_;
  if (!session().away()) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  if (session().ReconnectExpired(now, reconnect_bound_)) {
    dealer_.reset();
    ended_ = absl::AbortedError(absl::StrFormat(
        "memd lost: it died and no memd took the re-Hello within %d ms (%d attempts); the grants of epoch %d are void",
        reconnect_bound_.count(), session().attempts(), epoch_));
    return ended_;
  }
  if (session().hello_out()) {  // a Hello is out (its connection: dealer_)
    while (true) {
      absl::StatusOr<std::string> bytes = dealer_->Receive(std::chrono::milliseconds(0));
      if (!bytes.ok()) break;
      absl::StatusOr<Message> msg = DecodeEnvelope(*bytes);
      if (!msg.ok()) continue;
      if (msg->type == wire::Body::ErrorReply) {
        ended_ = absl::AbortedError(absl::StrCat("memd restart: memd answered the re-Hello with an error: ",
                                                 ReadErrorStatus(*msg).ToString()));
        dealer_.reset();
        return ended_;
      }
      if (msg->type != wire::Body::HelloReply) continue;
      absl::StatusOr<wire::HelloReplyT> reply = ReadHelloReply(*msg);
      if (!reply.ok()) continue;
      if (absl::Status s = AcceptReHello(*reply); !s.ok()) return s;
      return std::optional<wire::HelloReplyT>(*std::move(reply));
    }
    // Unanswered for the memd timeout: given up, the next attempt on a new socket. A connection that dropped before
    // the answer is no reason: ZeroMQ sends a Hello it had not written yet on its next connection (a dying memd's
    // socket was reached first, then its successor's), and a second re-Hello to a memd that took the first is refused
    // (issue 22). A Hello lost with a memd that died is given up at the timeout.
    if (session().HelloExpired(now, memd_timeout_)) RetryLater(now);
    return std::nullopt;
  }
  if (!session().AttemptDue(now)) return std::nullopt;  // kLost: the worker has not taken the loss yet
  if (!CheckSocketAccess(run_dir_, "memd").ok()) {  // no memd socket (yet): nothing to connect to
    RetryLater(now);
    return std::nullopt;
  }
  absl::StatusOr<std::unique_ptr<DealerClient>> dealer =
      DealerClient::Connect(IpcEndpoint(run_dir_, "memd"), DealerClient::Options{sender_, std::chrono::milliseconds(20)});
  if (!dealer.ok()) {
    RetryLater(now);
    return std::nullopt;
  }
  dealer_ = *std::move(dealer);
  wire::HelloT hello = make_hello();
  hello.rehello = true;
  hello.worker_epoch = epoch_;
  if (absl::Status s = dealer_->Send(EncodeHello(hello, NextSeq(), sender_)); !s.ok()) {
    RetryLater(now);
    return std::nullopt;
  }
  DHS_CHECK_OK(session().HelloSent(now));  // kAway (AttemptDue) -> kHelloOut
  spdlog::info("workerd: re-Hello attempt {} to memd ({} requests reported)", session().attempts(),
               hello.report.size());
  return std::nullopt;
}

}  // namespace dhs
