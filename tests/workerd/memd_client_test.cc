// tests/workerd/memd_client_test.cc: MemdClient's liveness decisions against a stand-in memd in this process (a
// RouterServer at ipc://<run_dir>/memd.sock with a host-pool segment, answering the Hello).
// - A worker resumed after a long stall (SIGSTOP) whose memd died meanwhile: nothing was heard from memd beyond the
//   memd timeout, and the socket monitor has not reported the close yet (its events are held: the interleaving of a
//   process whose ZeroMQ I/O thread has not run since SIGCONT, forced, not timed). CheckEpoch must find the closed
//   connection and go away (the re-Hello path), not end the epoch blaming a live connection.
// - The same silence over a connection that is still open ends the epoch (ABORTED), naming the stall.
// - Issue 22: a worker whose Hello first reached a hung memd (its connection taken into the kernel's backlog, never
//   answered) that then died, and was answered by the memd started after it, does not take that first connection's
//   close for the new memd's death: no away, no re-Hello (which the new memd would refuse: exit 75).
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <map>
#include <thread>
#include <vector>

#include "common/host_pool.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "workerd/memd_client.h"

namespace dhs::test {
namespace {

constexpr uint64_t kPageBytes = 4096;

// A stand-in memd that answers one Hello of GPU 0 (epoch 1, its host-pool segment) and acks heartbeats on demand.
// `same_pool_as`: the memd after another one (a restart): it serves that one's segment (same shm object), as a memd
// that adopted the pool does.
class StandInMemd {
 public:
  explicit StandInMemd(const std::string& run_dir, uint32_t worker_timeout_ms = 0,
                       const StandInMemd* same_pool_as = nullptr)
      : worker_timeout_ms_(worker_timeout_ms), shm_("dhs-mct-" + std::to_string(::getpid())) {
    if (same_pool_as == nullptr) {
      (void)HostPoolSegment::Remove(shm_);
      auto seg = HostPoolSegment::Create(shm_, kPageBytes, 4);
      EXPECT_TRUE(seg.ok()) << seg.status();
      segment_ = *std::move(seg);
    } else {
      auto seg = HostPoolSegment::Open(shm_);
      EXPECT_TRUE(seg.ok()) << seg.status();
      segment_ = *std::move(seg);
    }
    auto router = RouterServer::Bind(run_dir, "memd");
    EXPECT_TRUE(router.ok()) << router.status();
    router_ = *std::move(router);
  }
  ~StandInMemd() { (void)HostPoolSegment::Remove(shm_); }
  // The next Hello within `timeout`, not answered yet.
  std::optional<Incoming> TakeHello(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto in = router_->Poll(std::chrono::milliseconds(5));
      if (!in.ok() || !in->has_value()) continue;
      auto m = DecodeEnvelope((*in)->bytes);
      if (!m.ok() || m->type != wire::Body::Hello) continue;
      ++hellos_;
      return **in;
    }
    return std::nullopt;
  }
  // Answers `hello`: accepted, unless this stand-in already accepted one (as memd refuses a re-Hello for a GPU that
  // a re-Hello registered: AdoptGpu of a GPU that is up).
  bool Answer(const Incoming& hello) {
    auto m = DecodeEnvelope(hello.bytes);
    if (!m.ok()) return false;
    wire::HelloReplyT r;
    r.accepted = accepted_ == 0;
    if (!r.accepted) r.reason = "GPU 0 is up (a second Hello)";
    ++accepted_;
    r.worker_epoch = 1;
    r.worker_timeout_ms = worker_timeout_ms_;
    auto info = std::make_unique<wire::HostSegmentInfoT>();
    info->name = shm_;
    info->size_bytes = segment_->size_bytes();
    info->page_bytes = kPageBytes;
    info->pages = 4;
    r.segments.push_back(std::move(info));
    return router_->Reply(hello.peer, EncodeHelloReply(r, m->sequence, "memd")).ok();
  }
  // Serves until one Hello was answered or `timeout` passed; returns whether it was.
  bool AnswerHello(std::chrono::milliseconds timeout) {
    std::optional<Incoming> hello = TakeHello(timeout);
    return hello.has_value() && Answer(*hello);
  }
  void Die() { router_.reset(); }  // memd's socket closes (its process died)
  // Sends `bytes` to the worker of GPU 0.
  bool SendToWorker(const std::string& bytes) { return router_->Reply("worker/0", bytes).ok(); }
  // Serves for up to `wait`: acks the worker's Heartbeats; returns the types of the messages received.
  std::vector<wire::Body> Serve(std::chrono::milliseconds wait) {
    std::vector<wire::Body> got;
    auto in = router_->Poll(wait);
    while (in.ok() && in->has_value()) {
      auto m = DecodeEnvelope((*in)->bytes);
      if (m.ok()) {
        got.push_back(m->type);
        last_sequence[m->type] = m->sequence;
        if (m->type == wire::Body::Heartbeat) {
          EXPECT_TRUE(router_->Reply((*in)->peer, EncodeHeartbeatAck(wire::HeartbeatAckT(), m->sequence, "memd")).ok());
        }
      }
      in = router_->Poll(std::chrono::milliseconds(0));
    }
    return got;
  }
  int hellos() const { return hellos_; }
  std::map<wire::Body, uint64_t> last_sequence;  // of each type received (Serve)

 private:
  uint32_t worker_timeout_ms_;
  std::string shm_;
  std::unique_ptr<HostPoolSegment> segment_;
  std::unique_ptr<RouterServer> router_;
  int hellos_ = 0, accepted_ = 0;
};

// A unix socket at `path` that listens and never accepts: a hung (SIGSTOPped) memd. The kernel completes a worker's
// connect into its backlog; nobody answers ZeroMQ's greeting, so the worker's Hello stays queued in ZeroMQ's pipe.
int HungMemd(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 16) != 0) return -1;
  return fd;
}

std::unique_ptr<MemdClient> ConnectedClient(const std::string& run_dir, StandInMemd& memd) {
  wire::HelloT hello;
  hello.gpu = 0;
  hello.host_page_bytes = kPageBytes;
  absl::StatusOr<std::unique_ptr<MemdClient>> client;
  std::thread t([&] { client = MemdClient::Connect(run_dir, hello, std::chrono::milliseconds(10000)); });
  const bool answered = memd.AnswerHello(std::chrono::milliseconds(10000));
  t.join();
  EXPECT_TRUE(answered);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  EXPECT_EQ((*client)->worker_epoch(), 1u);
  return *std::move(client);
}

// Records which MemdHandler calls the client made (their message types), in order.
class TypeRecorder final : public MemdHandler {
 public:
  void OnAdmitGrant(const wire::AdmitGrantT&) override { calls.push_back(wire::Body::AdmitGrant); }
  void OnAdmitWait(const wire::AdmitWaitT&) override { calls.push_back(wire::Body::AdmitWait); }
  void OnAdmitReject(const wire::AdmitRejectT&) override { calls.push_back(wire::Body::AdmitReject); }
  void OnReclaimOrder(const wire::ReclaimOrderT&) override { calls.push_back(wire::Body::ReclaimOrder); }
  void OnRetire(const wire::RetireT&) override { calls.push_back(wire::Body::Retire); }
  void OnPopulateOrder(const wire::PopulateOrderT&) override { calls.push_back(wire::Body::PopulateOrder); }
  void OnCompleteAck(const wire::CompleteAckT&) override { calls.push_back(wire::Body::CompleteAck); }
  std::vector<wire::Body> calls;
};

// Issue 23: memd sends the worker every member of the wire message list (DHS_WIRE_MESSAGES), each with a default
// body, then one more AdmitWait as a marker. The worker's dispatch hands memd's orders and answers to its handler,
// in order (the list below is docs/protocol.md's, typed independently of the client's NotFromMemd), answers the
// Heartbeat, and logs and drops every message memd never sends a worker; its epoch goes on.
TEST(MemdClientDispatch, EveryWireMessageIsHandledOrDroppedAsNotFromMemd) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StandInMemd memd(dir.path());
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), memd);
  ASSERT_TRUE(client);
  uint64_t seq = 100;
#define DHS_SEND_EVERY(Name) ASSERT_TRUE(memd.SendToWorker(Encode##Name(wire::Name##T{}, seq++, "memd"))) << #Name;
  DHS_WIRE_MESSAGES(DHS_SEND_EVERY)
#undef DHS_SEND_EVERY
  ASSERT_TRUE(memd.SendToWorker(EncodeAdmitWait(wire::AdmitWaitT{}, seq++, "memd")));  // the marker
  TypeRecorder handler;
  std::vector<wire::Body> to_memd;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (handler.calls.size() < 8 && std::chrono::steady_clock::now() < deadline) {
    const absl::Status s = client->Poll(handler, MemdClient::Load{});
    ASSERT_TRUE(s.ok()) << s;
    for (wire::Body b : memd.Serve(std::chrono::milliseconds(10))) to_memd.push_back(b);
  }
  EXPECT_EQ(handler.calls, (std::vector<wire::Body>{wire::Body::AdmitGrant, wire::Body::AdmitWait,
                                                    wire::Body::AdmitReject, wire::Body::ReclaimOrder,
                                                    wire::Body::Retire, wire::Body::PopulateOrder,
                                                    wire::Body::CompleteAck, wire::Body::AdmitWait}));
  for (wire::Body b : memd.Serve(std::chrono::milliseconds(50))) to_memd.push_back(b);
  EXPECT_NE(std::find(to_memd.begin(), to_memd.end(), wire::Body::HeartbeatAck), to_memd.end())
      << "memd's Heartbeat was not answered";
  EXPECT_TRUE(client->CheckEpoch().ok());
  EXPECT_FALSE(client->away());
}

TEST(MemdClientLiveness, AStalledWorkerWhoseMemdDiedGoesAwayEvenBeforeTheMonitorReportsTheClose) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StandInMemd memd(dir.path());
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), memd);
  ASSERT_TRUE(client);
  client->set_memd_timeout(std::chrono::milliseconds(100));
  ASSERT_TRUE(client->CheckEpoch().ok());
  client->HoldConnectionEventsForTest();  // the monitor's DISCONNECTED stays queued
  memd.Die();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the stall: beyond the memd timeout
  const absl::Status s = client->CheckEpoch();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(client->away()) << "the closed connection was not seen: memd's death taken for a hung memd";
}

TEST(MemdClientLiveness, SilenceOverAnOpenConnectionEndsTheEpochNamingTheStall) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StandInMemd memd(dir.path());
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), memd);
  ASSERT_TRUE(client);
  client->set_memd_timeout(std::chrono::milliseconds(100));
  ASSERT_TRUE(client->CheckEpoch().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // memd alive, nothing sent: silent beyond the timeout
  const absl::Status s = client->CheckEpoch();
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_FALSE(client->away());
  EXPECT_NE(s.message().find("while its connection is still open"), std::string::npos) << s;
  EXPECT_NE(s.message().find("this worker did not run for"), std::string::npos) << s;
}

TEST(MemdClientConnections, AnEarlierConnectionsCloseIsNotTakenForTheNewMemdsDeath) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  const int hung = HungMemd(dir.path() + "/memd.sock");
  ASSERT_GE(hung, 0);
  wire::HelloT hello;
  hello.gpu = 0;
  hello.host_page_bytes = kPageBytes;
  absl::StatusOr<std::unique_ptr<MemdClient>> client;
  std::thread t([&] { client = MemdClient::Connect(dir.path(), hello, std::chrono::milliseconds(10000)); });
  pollfd p{hung, POLLIN, 0};
  const bool reached = ::poll(&p, 1, 10000) == 1;  // the worker's first connection is in the hung memd's backlog
  ::close(hung);  // the hung memd is killed: that connection closes; ZeroMQ reconnects to the next memd
  StandInMemd memd(dir.path());  // the memd started after it: answers the Hello ZeroMQ kept queued
  const bool answered = memd.AnswerHello(std::chrono::milliseconds(10000));
  t.join();
  ASSERT_TRUE(reached);
  ASSERT_TRUE(answered);
  ASSERT_TRUE(client.ok()) << client.status();
  (*client)->set_memd_timeout(std::chrono::milliseconds(5000));
  const absl::Status s = (*client)->CheckEpoch();  // the first connection's close is read here at the latest
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_FALSE((*client)->away()) << "the first connection's close was taken for the new memd's death";
  memd.Die();  // the answering memd's death is still seen
  bool away = false;
  for (int i = 0; i < 1000 && !away; ++i) {
    ASSERT_TRUE((*client)->CheckEpoch().ok());
    away = (*client)->away();
    if (!away) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(away);
}

// The same race on the re-Hello path: memd A dies, the worker is away; its re-Hello attempt first reaches a hung memd
// (which dies), then ZeroMQ delivers the queued re-Hello to memd B over a new connection. The worker looks (PollAway)
// after that first connection closed and before B answered: the close is no reason to give the attempt up (that would
// drop B's reply and send a second re-Hello, which memd refuses: exit 75). B's one answer is taken.
TEST(MemdClientConnections, AReHelloIsNotGivenUpWhenAnEarlierConnectionOfItsAttemptCloses) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  auto a = std::make_unique<StandInMemd>(dir.path());
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), *a);
  ASSERT_TRUE(client);
  client->set_memd_timeout(std::chrono::milliseconds(5000));
  a->Die();
  for (int i = 0; i < 1000 && !client->away(); ++i) {
    ASSERT_TRUE(client->CheckEpoch().ok());
    if (!client->away()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(client->away());
  ASSERT_TRUE(client->session().TakeLoss(std::chrono::steady_clock::now()));  // the Worker's part (EnterAway)
  const int hung = HungMemd(dir.path() + "/memd.sock");
  ASSERT_GE(hung, 0);
  auto make_hello = [] {
    wire::HelloT h;
    h.gpu = 0;
    h.host_page_bytes = kPageBytes;
    return h;
  };
  pollfd p{hung, POLLIN, 0};
  bool reached = false;
  for (int i = 0; i < 1000 && !reached; ++i) {  // the attempt's first connection lands in the hung memd's backlog
    auto r = client->PollAway(make_hello);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->has_value());
    reached = ::poll(&p, 1, 10) == 1;
  }
  ASSERT_TRUE(reached);
  ASSERT_TRUE(client->rehello_in_flight());
  ::close(hung);  // the hung memd is killed
  StandInMemd b(dir.path(), 0, a.get());
  std::optional<Incoming> hello = b.TakeHello(std::chrono::milliseconds(10000));  // the queued re-Hello, delivered
  ASSERT_TRUE(hello.has_value());
  auto before = client->PollAway(make_hello);  // after the first connection's close, before B's answer
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(before->has_value());
  ASSERT_TRUE(b.Answer(*hello));
  absl::StatusOr<std::optional<wire::HelloReplyT>> reply;
  for (int i = 0; i < 1000; ++i) {
    reply = client->PollAway(make_hello);
    if (!reply.ok() || reply->has_value()) break;
    if (std::optional<Incoming> again = b.TakeHello(std::chrono::milliseconds(10))) b.Answer(*again);  // refused
  }
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->has_value());
  EXPECT_TRUE((*reply)->accepted);
  EXPECT_FALSE(client->away());
  EXPECT_EQ(b.hellos(), 1) << "the attempt was given up and the re-Hello said twice";
}

// memd fences a worker silent for its --worker-timeout-ms; a worker configured to wait longer for memd (here 8 s against
// memd's 300 ms) would act on grants of a fenced epoch after a SIGSTOP of 300-8000 ms. The HelloReply tells the worker
// memd's timeout and the worker ends its epoch after 2/3 of it (200 ms) instead.
TEST(MemdClientLiveness, TheMemdTimeoutIsCappedByMemdsWorkerTimeout) {
  using std::chrono::milliseconds;
  EXPECT_EQ(EffectiveMemdTimeout(milliseconds(2000), 3000), milliseconds(2000));
  EXPECT_EQ(EffectiveMemdTimeout(milliseconds(8000), 3000), milliseconds(2000));
  EXPECT_EQ(EffectiveMemdTimeout(milliseconds(5000), 0), milliseconds(5000)) << "memd did not say";
  EXPECT_EQ(EffectiveMemdTimeout(milliseconds(5000), 1), milliseconds(1)) << "at least 1 ms";
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StandInMemd memd(dir.path(), /*worker_timeout_ms=*/300);
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), memd);
  ASSERT_TRUE(client);
  client->set_memd_timeout(milliseconds(8000));  // after Connect, as WorkerProcess::Start sets it
  EXPECT_EQ(client->memd_timeout(), milliseconds(200));
  std::this_thread::sleep_for(milliseconds(400));  // stopped past memd's fence (300 ms)
  EXPECT_TRUE(absl::IsAborted(client->CheckEpoch()));
}

// Records the orders dispatched to it, in order.
class RecordingHandler final : public MemdHandler {
 public:
  void OnAdmitGrant(const wire::AdmitGrantT& m) override { seen.push_back("grant " + std::to_string(m.request)); }
  void OnAdmitWait(const wire::AdmitWaitT& m) override { seen.push_back("wait " + std::to_string(m.request)); }
  void OnAdmitReject(const wire::AdmitRejectT& m) override { seen.push_back("reject " + std::to_string(m.request)); }
  void OnReclaimOrder(const wire::ReclaimOrderT&) override { seen.push_back("reclaim"); }
  void OnRetire(const wire::RetireT& m) override { seen.push_back("retire " + std::to_string(m.request)); }
  void OnPopulateOrder(const wire::PopulateOrderT&) override { seen.push_back("populate"); }
  void OnCompleteAck(const wire::CompleteAckT& m) override { seen.push_back("ack " + std::to_string(m.request)); }
  void OnTokensRefused(const absl::Status& why) override { seen.push_back("tokens refused"); }
  std::vector<std::string> seen;
};

// Start-up (issue 22): while the worker prepares (no handler yet) for longer than its memd timeout, KeepAlive sends
// heartbeats (memd's acks keep the epoch alive), answers memd's own Heartbeat, and holds memd's orders; the first Poll
// dispatches them in arrival order, before anything newer. Without KeepAlive the same pause ends the epoch (the test
// above: SilenceOverAnOpenConnectionEndsTheEpochNamingTheStall).
TEST(MemdClientStartup, KeepAliveHeartbeatsThroughALongPreparationAndHoldsOrdersForTheFirstPoll) {
  using std::chrono::milliseconds;
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StandInMemd memd(dir.path(), /*worker_timeout_ms=*/300);
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), memd);
  ASSERT_TRUE(client);
  client->set_memd_timeout(milliseconds(8000));  // capped to 200 ms by memd's 300
  ASSERT_EQ(client->memd_timeout(), milliseconds(200));
  wire::RetireT retire;
  retire.request = 7;
  wire::CompleteAckT ack;
  ack.request = 9;
  wire::HeartbeatT memd_heartbeat;
  ASSERT_TRUE(memd.SendToWorker(EncodeRetire(retire, 1, "memd")));
  ASSERT_TRUE(memd.SendToWorker(EncodeHeartbeat(memd_heartbeat, 2, "memd")));
  ASSERT_TRUE(memd.SendToWorker(EncodeCompleteAck(ack, 3, "memd")));
  std::vector<wire::Body> at_memd;
  const auto end = std::chrono::steady_clock::now() + milliseconds(1000);  // five memd timeouts of preparation
  while (std::chrono::steady_clock::now() < end) {
    const absl::Status s = client->KeepAlive(milliseconds(10));
    ASSERT_TRUE(s.ok()) << s;
    for (wire::Body b : memd.Serve(milliseconds(5))) at_memd.push_back(b);
  }
  EXPECT_GE(std::count(at_memd.begin(), at_memd.end(), wire::Body::Heartbeat), 5)
      << "a heartbeat every third of the memd timeout (66 ms) over 1 s";
  EXPECT_EQ(std::count(at_memd.begin(), at_memd.end(), wire::Body::HeartbeatAck), 1) << "memd's Heartbeat answered";
  EXPECT_EQ(client->held_messages(), 2u);
  ASSERT_TRUE(client->CheckEpoch().ok()) << "the epoch outlived the preparation";
  // A message that comes after the preparation is dispatched after the held ones.
  wire::RetireT later;
  later.request = 8;
  ASSERT_TRUE(memd.SendToWorker(EncodeRetire(later, 4, "memd")));
  RecordingHandler handler;
  for (int i = 0; i < 200 && handler.seen.size() < 3; ++i) {
    ASSERT_TRUE(client->Poll(handler, MemdClient::Load{}).ok());
    (void)memd.Serve(milliseconds(5));
  }
  EXPECT_EQ(handler.seen, (std::vector<std::string>{"retire 7", "ack 9", "retire 8"}));
  EXPECT_EQ(client->held_messages(), 0u);
}

// memd dies while the worker prepares: KeepAlive makes the client away (what the dead memd sent is dropped, never
// acted on), and the first Poll after the preparation dispatches nothing (the re-Hello path, PollAway, goes on).
TEST(MemdClientStartup, MemdDyingDuringThePreparationMakesTheClientAwayAndDropsItsHeldOrders) {
  using std::chrono::milliseconds;
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StandInMemd memd(dir.path());
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), memd);
  ASSERT_TRUE(client);
  wire::RetireT retire;
  retire.request = 7;
  ASSERT_TRUE(memd.SendToWorker(EncodeRetire(retire, 1, "memd")));
  for (int i = 0; i < 100 && client->held_messages() == 0; ++i) ASSERT_TRUE(client->KeepAlive(milliseconds(10)).ok());
  ASSERT_EQ(client->held_messages(), 1u);
  memd.Die();
  for (int i = 0; i < 300 && !client->away(); ++i) ASSERT_TRUE(client->KeepAlive(milliseconds(10)).ok());
  ASSERT_TRUE(client->away());
  EXPECT_EQ(client->held_messages(), 0u);
  RecordingHandler handler;
  EXPECT_TRUE(client->Poll(handler, MemdClient::Load{}).ok());
  EXPECT_TRUE(handler.seen.empty());
}

// Polls `client` (serving `memd`) until its epoch ends or ~2 s pass; returns the last Poll's status.
absl::Status PollUntilEnded(MemdClient& client, StandInMemd& memd, MemdHandler& handler) {
  absl::Status ended;
  for (int i = 0; i < 400 && ended.ok(); ++i) {
    ended = client.Poll(handler, MemdClient::Load{});
    (void)memd.Serve(std::chrono::milliseconds(5));
  }
  return ended;
}

// Issue 23 (the fenced code): memd's refusal of a fenced worker's message ends the epoch by its code
// (ErrorReply.reason FENCED, FencedError), never by its text: an ErrorReply FAILED_PRECONDITION whose text merely
// starts "fenced: " is logged and the epoch goes on; the coded one makes Poll return ABORTED "fenced by memd: ...".
TEST(MemdClientFence, AFencedRefusalEndsTheEpochByItsCodeNotByItsText) {
  using std::chrono::milliseconds;
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StandInMemd memd(dir.path());
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), memd);
  ASSERT_TRUE(client);
  const absl::Status text_only = absl::FailedPreconditionError("fenced: only the text says so");
  ASSERT_FALSE(IsFenced(text_only));
  ASSERT_TRUE(memd.SendToWorker(EncodeError(text_only, 5, "memd")));
  wire::RetireT marker;  // dispatched after the text-only refusal: that one was read by then
  marker.request = 7;
  ASSERT_TRUE(memd.SendToWorker(EncodeRetire(marker, 6, "memd")));
  RecordingHandler handler;
  for (int i = 0; i < 400 && handler.seen.empty(); ++i) {
    const absl::Status s = client->Poll(handler, MemdClient::Load{});
    ASSERT_TRUE(s.ok()) << "a refusal without the code ended the epoch: " << s;
    (void)memd.Serve(milliseconds(5));
  }
  ASSERT_EQ(handler.seen, (std::vector<std::string>{"retire 7"}));
  ASSERT_TRUE(memd.SendToWorker(EncodeError(FencedError("the worker of GPU 0 (epoch 1) was fenced (test)"), 8, "memd")));
  const absl::Status ended = PollUntilEnded(*client, memd, handler);
  EXPECT_TRUE(absl::IsAborted(ended)) << ended;
  EXPECT_NE(ended.message().find("fenced by memd: fenced: the worker of GPU 0 (epoch 1) was fenced (test)"),
            std::string::npos)
      << ended;
  EXPECT_TRUE(absl::IsAborted(client->CheckEpoch())) << "ABORTED stays";
}

// memd answers every message of a fenced worker with FENCED, the TokensCommitted in flight included (Daemon::Heard):
// that answer ends the epoch like any other FENCED refusal; it is not a refusal of those tokens (review finding:
// TokenLedger then marked the request's record refused for good and the epoch went on).
TEST(MemdClientFence, AFencedAnswerToTheTokensInFlightEndsTheEpoch) {
  using std::chrono::milliseconds;
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StandInMemd memd(dir.path());
  std::unique_ptr<MemdClient> client = ConnectedClient(dir.path(), memd);
  ASSERT_TRUE(client);
  wire::TokensCommittedT m;
  auto e = std::make_unique<wire::CommittedTokensT>();
  e->request = 1;
  e->token_ids = {7, 8};
  m.entries.push_back(std::move(e));
  ASSERT_TRUE(client->SendTokensCommitted(m).ok());
  for (int i = 0; i < 400 && !memd.last_sequence.contains(wire::Body::TokensCommitted); ++i) {
    (void)memd.Serve(milliseconds(5));
  }
  ASSERT_TRUE(memd.last_sequence.contains(wire::Body::TokensCommitted));
  ASSERT_TRUE(memd.SendToWorker(EncodeError(FencedError("the worker of GPU 0 (epoch 1) was fenced (test)"),
                                            memd.last_sequence[wire::Body::TokensCommitted], "memd")));
  RecordingHandler handler;
  const absl::Status ended = PollUntilEnded(*client, memd, handler);
  EXPECT_TRUE(absl::IsAborted(ended)) << ended;
  EXPECT_TRUE(handler.seen.empty()) << "the FENCED answer reached the handler as " << handler.seen.front();
}

}  // namespace
}  // namespace dhs::test
