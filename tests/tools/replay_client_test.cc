// dhs-replay's node client (tools/replay/zmq_node_client.h) against a scripted stand-in worker (a RouterServer on a
// thread of the test): how it reads the end of a worker's epoch, and the identity it sends.
// - A final chunk coded TokenChunk.end_reason = WORKER_EPOCH_ENDED keeps its request outstanding for a re-attach
//   whatever its text says; a chunk whose text reads "worker epoch ended: ..." without the code is a failure of the
//   request (the client matches the code, never the text: docs/protocol.md "The epoch's end").
// - Each client sends one non-zero identity (SubmitRequest.client) on every submit, and two clients send different
//   ones, so a worker can tell their resumed requests apart (Attach.client).
// - Issue 26 review: memd's cluster counters (a stand-in memd's status view) add up across a memd restart.
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/protocol.h"
#include "common/status.h"
#include "common/transport.h"
#include "nlohmann/json.hpp"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tools/replay/zmq_node_client.h"

namespace dhs::replay {
namespace {

// A ROUTER bound as RUN_DIR/<name>.sock whose decoded messages go to Serve() on its own thread until Close() (the peer
// exits: its socket closes, the client sees its connection drop). A subclass calls Close() in its destructor, so that
// Serve never runs on a destroyed object.
class FakeRouterPeer {
 public:
  virtual ~FakeRouterPeer() = default;
  void Close() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }
  std::string endpoint() const { return server_->endpoint(); }

 protected:
  void Start(const std::string& run_dir, const std::string& name) {
    auto server = RouterServer::Bind(run_dir, name);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    thread_ = std::thread([this] { Loop(); });
  }
  // One message from `peer` (already decoded); answers go through Reply.
  virtual void Serve(const std::string& peer, const Message& m) = 0;
  void Reply(const std::string& peer, const std::string& bytes) { server_->Reply(peer, bytes).IgnoreError(); }
  std::mutex mu_;  // guards what a subclass records

 private:
  void Loop() {
    while (!stop_) {
      auto in = server_->Poll(std::chrono::milliseconds(10));
      if (!in.ok() || !in->has_value()) continue;
      auto m = DecodeEnvelope((*in)->bytes);
      if (m.ok()) Serve((*in)->peer, *m);
    }
  }
  std::unique_ptr<RouterServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

// The stand-in worker: answers WorkerStatsQuery; each SubmitRequest is recorded and answered with the chunks
// `script` gives for its request id (sent in order, the submit's sequence).
class FakeWorker : public FakeRouterPeer {
 public:
  // `extras`: a message sent after a request's scripted chunks (issue 23: messages a worker never sends a client).
  explicit FakeWorker(const std::string& run_dir, std::map<RequestId, std::vector<wire::TokenChunkT>> script,
                      std::map<RequestId, std::string> extras = {})
      : script_(std::move(script)), extras_(std::move(extras)) {
    Start(run_dir, "worker-0");
  }
  ~FakeWorker() override { Close(); }
  std::vector<wire::CancelT> cancels() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancels_;
  }
  std::vector<wire::SubmitRequestT> submits() {
    std::lock_guard<std::mutex> lock(mu_);
    return submits_;
  }

 private:
  void Serve(const std::string& peer, const Message& m) override {
    if (m.type == wire::Body::WorkerStatsQuery) {
      Reply(peer, EncodeWorkerStatsReply(wire::WorkerStatsReplyT{}, m.sequence, "worker"));
    } else if (m.type == wire::Body::SubmitRequest) {
      auto submit = ReadSubmitRequest(m);
      {
        std::lock_guard<std::mutex> lock(mu_);
        submits_.push_back(*submit);
      }
      for (const wire::TokenChunkT& c : script_[submit->request]) Reply(peer, EncodeTokenChunk(c, m.sequence, "worker"));
      if (auto extra = extras_.find(submit->request); extra != extras_.end()) Reply(peer, extra->second);
    } else if (m.type == wire::Body::Cancel) {  // recorded, answered NOT_FOUND (as for a request that ended)
      auto cancel = ReadCancel(m);
      {
        std::lock_guard<std::mutex> lock(mu_);
        cancels_.push_back(*cancel);
      }
      Reply(peer, EncodeError(absl::NotFoundError("ended"), m.sequence, "worker"));
    }
  }
  std::map<RequestId, std::vector<wire::TokenChunkT>> script_;
  std::map<RequestId, std::string> extras_;
  std::vector<wire::SubmitRequestT> submits_;
  std::vector<wire::CancelT> cancels_;
};

// A stand-in memd (issue 26 review): answers IntrospectQuery, the gpus view with no GPU and the status view with
// `status` (settable: memd's counters growing). Close(): memd dies (its socket closes); another FakeMemd on the same
// run directory is its restarted successor on the same endpoint.
class FakeMemd : public FakeRouterPeer {
 public:
  FakeMemd(const std::string& run_dir, nlohmann::json status) : status_(std::move(status)) { Start(run_dir, "memd"); }
  ~FakeMemd() override { Close(); }
  void SetStatus(nlohmann::json status) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
  }
  int status_queries() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_queries_;
  }

 private:
  void Serve(const std::string& peer, const Message& m) override {
    if (m.type != wire::Body::IntrospectQuery) return;
    auto query = ReadIntrospectQuery(m);
    if (!query.ok()) return;
    wire::IntrospectReplyT reply;
    reply.what = query->what;
    reply.format = wire::IntrospectFormat::Json;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (query->what == wire::IntrospectWhat::Status) ++status_queries_;
      reply.document = query->what == wire::IntrospectWhat::Status ? status_.dump() : "[]";
    }
    Reply(peer, EncodeIntrospectReply(reply, m.sequence, "memd"));
  }
  nlohmann::json status_;
  int status_queries_ = 0;
};

// memd's status view with a cluster tier (the fields memd/state_dump.cc ClusterJson renders that the report reads).
nlohmann::json ClusterStatus(int64_t lookups, int64_t hits, int64_t published, int64_t timeouts, std::string health) {
  return {{"policy", "lru"},
          {"host", {{"allocated", 0}, {"page_bytes", 4096}}},
          {"cluster",
           {{"store", "redis://127.0.0.1:1"}, {"health", health}, {"lookups", lookups}, {"hits", hits},
            {"imported", hits}, {"published", published}, {"published_bytes", 100 * published},
            {"imported_bytes", 10 * hits}, {"session_imported", 0}, {"offered", published}, {"publish_failed", 0},
            {"misses", {{"absent", lookups - hits - timeouts}, {"timeout", timeouts}}},
            {"shed", {{"queue_full", 0}, {"store_down", 0}}}}}};
}

wire::TokenChunkT Chunk(RequestId id, std::vector<uint8_t> tokens, bool finished = false) {
  wire::TokenChunkT c;
  c.request = id;
  c.tokens = std::move(tokens);
  c.logits_digests.assign(c.tokens.size(), 5);
  c.finished = finished;
  return c;
}

wire::TokenChunkT Stamped(RequestId id, std::vector<uint8_t> tokens, uint64_t since_submit_us, bool finished = false) {
  wire::TokenChunkT c = Chunk(id, std::move(tokens), finished);
  c.since_submit_us = since_submit_us;
  return c;
}

wire::TokenChunkT Final(RequestId id, std::string message, wire::EndReason reason) {
  wire::TokenChunkT c = Chunk(id, {}, true);
  c.error = wire::ErrorCode::UNAVAILABLE;
  c.error_message = std::move(message);
  c.end_reason = reason;
  return c;
}

// The client's options for `worker`: its endpoint, no heartbeat (the fake worker answers none).
ZmqNodeClientOptions OptionsFor(const FakeWorker& worker) {
  ZmqNodeClientOptions o;
  o.worker_endpoint = worker.endpoint();
  o.worker_heartbeat = std::chrono::milliseconds(0);
  return o;
}

SubmitRequest Request(RequestId id) {
  SubmitRequest r;
  r.request = id;
  r.prompt.input_tokens = 4;
  r.max_new_tokens = 8;
  return r;
}

TEST(ReplayClient, TheEpochEndIsToldByItsCodeNotByItsText) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  // Request 1: 2 tokens, then the epoch's end coded, with a text the client never saw before. Request 2: a failure
  // whose text reads like the epoch's end, not coded: the request failed.
  FakeWorker worker(dir.path(),
                    {{1, {Chunk(1, {7, 8}), Final(1, "fenced, in other words", wire::EndReason::WORKER_EPOCH_ENDED)}},
                     {2, {Chunk(2, {9}), Final(2, "worker epoch ended: but not coded", wire::EndReason::NONE)}}});
  ZmqNodeClientOptions o = OptionsFor(worker);
  o.reattach_timeout = std::chrono::milliseconds(30000);  // re-attaching on (faults)
  auto client = ZmqNodeClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Submit(Request(1)).ok());
  ASSERT_TRUE((*client)->Submit(Request(2)).ok());
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, std::string> errors;
  std::map<RequestId, bool> finished;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  // Until request 2 ended and request 1's three messages were read (2 tokens; its end adds no event of its own).
  while (std::chrono::steady_clock::now() < deadline && !(finished[2] && tokens[1].size() == 2)) {
    auto events = (*client)->Poll(10);
    ASSERT_TRUE(events.ok()) << events.status();
    for (const TokenEvent& e : *events) {
      tokens[e.request].insert(tokens[e.request].end(), e.tokens.begin(), e.tokens.end());
      if (!e.error.empty()) errors[e.request] = e.error;
      if (e.finished) finished[e.request] = true;
    }
  }
  // Request 2's final chunk came after request 1's: by now request 1's end was read too.
  for (int i = 0; i < 20; ++i) {
    auto events = (*client)->Poll(5);
    ASSERT_TRUE(events.ok()) << events.status();
    for (const TokenEvent& e : *events) {
      if (!e.error.empty()) errors[e.request] = e.error;
      if (e.finished) finished[e.request] = true;
    }
  }
  EXPECT_EQ(tokens[1], (std::vector<int32_t>{7, 8}));
  EXPECT_FALSE(finished[1]) << "a coded epoch end must leave the request outstanding: " << errors[1];
  EXPECT_TRUE(errors[1].empty()) << errors[1];
  EXPECT_TRUE(finished[2]);
  EXPECT_EQ(errors[2], "worker epoch ended: but not coded") << "an uncoded end is the request's failure";
}

// Issue 23: every member of the wire message list, one per request, sent as the answer to its submit: the client
// takes SubmitAccepted, TokenChunk and ErrorReply (docs/protocol.md; typed here independently of its
// NotFromTheWorker), and Poll fails INTERNAL "unexpected message from the worker: <Name>" for each other one.
TEST(ReplayClient, EveryWireMessageIsTakenOrRefusedAsNotFromTheWorker) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  const std::set<wire::Body> taken = {wire::Body::SubmitAccepted, wire::Body::TokenChunk, wire::Body::ErrorReply};
  std::map<RequestId, std::string> extras;
  std::map<RequestId, wire::Body> type_of;
  RequestId next = 1;
#define DHS_EXTRA(Name)                                                                   \
  if (!taken.contains(wire::Body::Name)) {                                                \
    type_of[next] = wire::Body::Name;                                                     \
    extras[next++] = Encode##Name(wire::Name##T{}, 0, "worker");                          \
  }
  DHS_WIRE_MESSAGES(DHS_EXTRA)
#undef DHS_EXTRA
  EXPECT_EQ(type_of.size(), std::size(kWireMessages) - taken.size());
  FakeWorker worker(dir.path(), {}, extras);
  auto client = ZmqNodeClient::Connect(OptionsFor(worker));
  ASSERT_TRUE(client.ok()) << client.status();
  for (const auto& [request, type] : type_of) {
    ASSERT_TRUE((*client)->Submit(Request(request)).ok());
    absl::Status refused;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (refused.ok() && std::chrono::steady_clock::now() < deadline) refused = (*client)->Poll(10).status();
    EXPECT_TRUE(absl::IsInternal(refused)) << BodyName(type) << ": " << refused;
    EXPECT_EQ(refused.message(), "unexpected message from the worker: " + BodyName(type));
  }
}

TEST(ReplayClient, EachClientSendsItsOwnNonZeroIdentityOnEverySubmit) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  FakeWorker worker(dir.path(), {});
  ZmqNodeClientOptions o = OptionsFor(worker);
  auto a = ZmqNodeClient::Connect(o);
  auto b = ZmqNodeClient::Connect(o);
  o.client_identity = 42;  // chosen by the caller: kept as given
  auto c = ZmqNodeClient::Connect(o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE((*a)->client_identity(), 0u);
  EXPECT_NE((*b)->client_identity(), 0u);
  EXPECT_NE((*a)->client_identity(), (*b)->client_identity());
  EXPECT_EQ((*c)->client_identity(), 42u);
  ASSERT_TRUE((*a)->Submit(Request(1)).ok());
  ASSERT_TRUE((*a)->Submit(Request(2)).ok());
  ASSERT_TRUE((*b)->Submit(Request(1)).ok());
  ASSERT_TRUE((*c)->Submit(Request(1)).ok());
  std::vector<wire::SubmitRequestT> got;
  for (int i = 0; i < 500 && (got = worker.submits()).size() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(got.size(), 4u);
  std::map<uint64_t, int> per_identity;
  for (const wire::SubmitRequestT& s : got) ++per_identity[s.client];
  EXPECT_EQ(per_identity[(*a)->client_identity()], 2);
  EXPECT_EQ(per_identity[(*b)->client_identity()], 1);
  EXPECT_EQ(per_identity[42], 1);
}

// Polls `client` until `done` or 10 s; every event goes to `events`. Returns the first error status of a Poll.
absl::Status PollUntil(ZmqNodeClient& client, std::vector<TokenEvent>& events, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline && !done()) {
    auto got = client.Poll(10);
    if (!got.ok()) return got.status();
    events.insert(events.end(), got->begin(), got->end());
  }
  return absl::OkStatus();
}

// Issue 22: a worker that stops (SIGTERM) ends its requests with end_reason WORKER_STOPPING, then closes. The client
// keeps each request's reason (worker_stopping for the one it ended, worker_gone for one it left open), and says the
// worker *stopped*, not "went away", from then on (Poll, Submit, Stats).
TEST(ReplayClient, AStoppedWorkerIsReportedAsStoppedWithEveryRequestsReason) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  wire::TokenChunkT stopping = Final(1, "worker stopping", wire::EndReason::WORKER_STOPPING);
  FakeWorker worker(dir.path(), {{1, {Chunk(1, {7}), stopping}}, {2, {Chunk(2, {9})}}});
  ZmqNodeClientOptions o = OptionsFor(worker);
  auto client = ZmqNodeClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Submit(Request(1)).ok());
  ASSERT_TRUE((*client)->Submit(Request(2)).ok());
  std::vector<TokenEvent> events;
  std::map<RequestId, TokenEvent> ends;
  auto ended = [&](RequestId id) {
    for (const TokenEvent& e : events) {
      if (e.request == id && e.finished) return true;
    }
    return false;
  };
  auto has_token_of_2 = [&] {
    for (const TokenEvent& e : events) {
      if (e.request == 2 && !e.tokens.empty()) return true;
    }
    return false;
  };
  ASSERT_TRUE(PollUntil(**client, events, [&] { return ended(1) && has_token_of_2(); }).ok());
  worker.Close();
  ASSERT_TRUE(PollUntil(**client, events, [&] { return ended(2); }).ok());
  for (const TokenEvent& e : events) {
    if (e.finished) ends[e.request] = e;
  }
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[1].end_reason, EndReason::kWorkerStopping);
  EXPECT_EQ(ends[1].error, "worker stopping");
  EXPECT_EQ(ends[2].end_reason, EndReason::kWorkerGone);
  EXPECT_THAT(ends[2].error, ::testing::HasSubstr("stopped: it ended 1 request with \"worker stopping\""));
  EXPECT_THAT(ends[2].error, ::testing::Not(::testing::HasSubstr("went away")));
  auto next = (*client)->Poll(10);
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(next.status().message()), ::testing::HasSubstr("stopped"));
  EXPECT_THAT(std::string((*client)->Submit(Request(3)).message()), ::testing::HasSubstr("stopped"));
  EXPECT_THAT(std::string((*client)->Stats().status().message()), ::testing::HasSubstr("stopped"));
}

// A worker that dies without ending anything still "went away"; its open request ends with that account.
TEST(ReplayClient, AWorkerThatDiesWentAwayAndItsOpenRequestsEndWithThatReason) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  FakeWorker worker(dir.path(), {{1, {Chunk(1, {7})}}});
  ZmqNodeClientOptions o = OptionsFor(worker);
  auto client = ZmqNodeClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Submit(Request(1)).ok());
  std::vector<TokenEvent> events;
  ASSERT_TRUE(PollUntil(**client, events, [&] { return !events.empty(); }).ok());
  worker.Close();
  ASSERT_TRUE(PollUntil(**client, events, [&] { return events.back().finished; }).ok());
  EXPECT_EQ(events.back().request, 1u);
  EXPECT_EQ(events.back().end_reason, EndReason::kWorkerGone);
  EXPECT_THAT(events.back().error, ::testing::HasSubstr("went away"));
}

// Issue 22: the time between tokens is the worker's (TokenChunk.since_submit_us), whenever the client reads them:
// three chunks read at once give gaps of 1.1 ms each, and the first has none (-1).
TEST(ReplayClient, TokenIntervalsComeFromTheWorkersStamps) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  FakeWorker worker(dir.path(), {{1, {Stamped(1, {1}, 5000), Stamped(1, {2}, 6100), Stamped(1, {3, 4}, 7200),
                                      Stamped(1, {}, 7300, true)}}});
  ZmqNodeClientOptions o = OptionsFor(worker);
  auto client = ZmqNodeClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Submit(Request(1)).ok());
  std::vector<TokenEvent> events;
  ASSERT_TRUE(PollUntil(**client, events, [&] { return !events.empty() && events.back().finished; }).ok());
  std::vector<double> intervals;
  for (const TokenEvent& e : events) {
    if (!e.tokens.empty()) intervals.push_back(e.token_interval_ms);
  }
  ASSERT_EQ(intervals.size(), 3u);
  EXPECT_EQ(intervals[0], -1);
  EXPECT_NEAR(intervals[1], 1.1, 1e-9);
  EXPECT_NEAR(intervals[2], 1.1, 1e-9);
  EXPECT_EQ(events.back().end_reason, EndReason::kFinished);
}

// Issue 22: Cancel sends the request id, the client's identity and the reason; the worker's NOT_FOUND answer (the
// request ended first) is not an error of the run.
TEST(ReplayClient, CancelCarriesTheIdentityAndANotFoundAnswerIsIgnored) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  FakeWorker worker(dir.path(), {{1, {Chunk(1, {7})}}});
  ZmqNodeClientOptions o = OptionsFor(worker);
  auto client = ZmqNodeClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Submit(Request(1)).ok());
  ASSERT_TRUE((*client)->Cancel(1, "timeout after 5 ms").ok());
  std::vector<wire::CancelT> got;
  for (int i = 0; i < 500 && (got = worker.cancels()).empty(); ++i) {
    auto events = (*client)->Poll(10);
    ASSERT_TRUE(events.ok()) << events.status();  // the NOT_FOUND answer is taken quietly
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].request, 1u);
  EXPECT_EQ(got[0].client, (*client)->client_identity());
  EXPECT_EQ(got[0].reason, "timeout after 5 ms");
  for (int i = 0; i < 20; ++i) {
    auto events = (*client)->Poll(10);
    ASSERT_TRUE(events.ok()) << events.status();
  }
}

// ErrorEndReason (split out of ZmqNodeClient::Handle, issue 23): a failed chunk's end reason by its code alone.
TEST(ReplayClient, AFailedChunksEndReasonComesFromItsCode) {
  EXPECT_EQ(ErrorEndReason(wire::EndReason::CANCELLED), EndReason::kCancelled);
  EXPECT_EQ(ErrorEndReason(wire::EndReason::WORKER_STOPPING), EndReason::kWorkerStopping);
  EXPECT_EQ(ErrorEndReason(wire::EndReason::WORKER_EPOCH_ENDED), EndReason::kWorkerGone);
  EXPECT_EQ(ErrorEndReason(wire::EndReason::NONE), EndReason::kFailed);  // an error of the request itself
}

// Issue 26 review: with --tenants N > 1 every turn of a session gets its session's tenant (session id mod N), not its
// own trace index's (a next turn under another tenant cannot reuse its conversation's prefix); sessions still spread
// over the tenants, and a request of no known session keeps the trace index's tenant.
TEST(ReplayClient, EveryTurnOfASessionHasItsSessionsTenant) {
  ZmqNodeClientOptions o;
  o.tenant = "t";
  o.tenants = 2;
  // Trace indexes 0..5: session 0 = rows 0, 2, 5; session 1 = rows 1, 4; session 3 = row 3 (a single turn).
  o.session_of = {0, 1, 0, 3, 1, 0};
  const std::vector<std::string> want = {"t#0", "t#1", "t#0", "t#1", "t#1", "t#0"};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(RequestTenant(o, i), want[static_cast<size_t>(i)]) << "trace index " << i;
  std::set<std::string> tenants;
  for (int64_t i = 0; i < 6; ++i) tenants.insert(RequestTenant(o, i));
  EXPECT_EQ(tenants.size(), 2u);  // sessions 0 and 1 under different tenants
  EXPECT_EQ(RequestTenant(o, 9), "t#1");   // past session_of: its trace index 9 mod 2
  o.session_of = {};
  EXPECT_EQ(RequestTenant(o, 5), "t#1");   // no sessions known: trace index 5 mod 2, as before issue 26
  o.session_of = {0, 1, 0, 3, 1, 0};  // --tenant-by index: each row its trace index's tenant, sessions aside
  o.tenant_by = TenantKey::kTraceIndex;
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(RequestTenant(o, i), i % 2 == 0 ? "t#0" : "t#1") << "trace index " << i;
  o.tenants = 1;
  EXPECT_EQ(RequestTenant(o, 5), "t");
}

// Issue 26 review (F3): memd's cluster counters are totals since memd started; a memd killed and restarted under the
// run counts from 0 again. The client adds each earlier memd's last sample. Here the successor's counters are already
// above its predecessor's when first sampled, so only memd's connection closing tells the restart (the case a
// "counter went down" test alone misses); a later sample of the same memd is not a restart.
TEST(ReplayClient, ClusterCountersAddUpAcrossAMemdRestart) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  FakeWorker worker(dir.path(), {});
  auto first = std::make_unique<FakeMemd>(dir.path(), ClusterStatus(300, 200, 5, 40, "up"));
  ZmqNodeClientOptions o = OptionsFor(worker);
  o.memd_endpoint = first->endpoint();
  auto client = ZmqNodeClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_TRUE(stats->cluster.has_value());
  EXPECT_EQ(stats->cluster->lookups, 300);
  EXPECT_EQ(stats->cluster->memd_restarts_seen, 0);

  first.reset();  // memd dies; its successor serves the same endpoint with counters of its own, none lower (absent
                  // 60 -> 70, timeout 40 -> 80, ...)
  FakeMemd second(dir.path(), ClusterStatus(400, 250, 8, 80, "down"));
  stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(second.status_queries(), 1);
  ASSERT_TRUE(stats->cluster.has_value());
  EXPECT_EQ(stats->cluster->lookups, 300 + 400);
  EXPECT_EQ(stats->cluster->hits, 200 + 250);
  EXPECT_EQ(stats->cluster->published, 5 + 8);
  EXPECT_EQ(stats->cluster->published_bytes, 500 + 800);
  EXPECT_EQ(stats->cluster->miss("timeout"), 40 + 80);
  EXPECT_EQ(stats->cluster->miss("absent"), 60 + 70);
  EXPECT_EQ(stats->cluster->memd_restarts_seen, 1);
  EXPECT_EQ(stats->cluster->health, "down");
  EXPECT_EQ(stats->cluster->health_samples, (std::map<std::string, int64_t>{{"up", 1}, {"down", 1}}));

  second.SetStatus(ClusterStatus(410, 251, 9, 85, "up"));  // the same memd, later
  stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->cluster->lookups, 300 + 410);
  EXPECT_EQ(stats->cluster->memd_restarts_seen, 1);
  EXPECT_EQ(stats->cluster->health, "up");
}

// A memd without a cluster tier (no "cluster" in its status view): no cluster figures (null in the report), not 0s.
TEST(ReplayClient, AMemdWithoutAClusterTierGivesNoClusterCounters) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  FakeWorker worker(dir.path(), {});
  FakeMemd memd(dir.path(), nlohmann::json{{"policy", "lru"}, {"host", {{"allocated", 0}}}});
  ZmqNodeClientOptions o = OptionsFor(worker);
  o.memd_endpoint = memd.endpoint();
  auto client = ZmqNodeClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(memd.status_queries(), 1);
  EXPECT_FALSE(stats->cluster.has_value());
}

}  // namespace
}  // namespace dhs::replay
