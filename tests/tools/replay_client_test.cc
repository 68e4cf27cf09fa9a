// dhs-replay's node client (tools/replay/zmq_node_client.h) against a scripted stand-in worker (a RouterServer on a
// thread of the test): how it reads the end of a worker's epoch, and the identity it sends.
// - A final chunk coded TokenChunk.end_reason = WORKER_EPOCH_ENDED keeps its request outstanding for a re-attach
//   whatever its text says; a chunk whose text reads "worker epoch ended: ..." without the code is a failure of the
//   request (the client matches the code, never the text: docs/protocol.md "The epoch's end").
// - Each client sends one non-zero identity (SubmitRequest.client) on every submit, and two clients send different
//   ones, so a worker can tell their resumed requests apart (Attach.client).
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tools/replay/zmq_node_client.h"

namespace dhs::replay {
namespace {

// The stand-in worker: answers WorkerStatsQuery; each SubmitRequest is recorded and answered with the chunks
// `script` gives for its request id (sent in order, the submit's sequence).
class FakeWorker {
 public:
  explicit FakeWorker(const std::string& run_dir, std::map<RequestId, std::vector<wire::TokenChunkT>> script)
      : script_(std::move(script)) {
    auto server = RouterServer::Bind(run_dir, "worker-0");
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeWorker() {
    stop_ = true;
    thread_.join();
  }
  std::string endpoint() const { return server_->endpoint(); }
  std::vector<wire::SubmitRequestT> submits() {
    std::lock_guard<std::mutex> lock(mu_);
    return submits_;
  }

 private:
  void Loop() {
    while (!stop_) {
      auto in = server_->Poll(std::chrono::milliseconds(10));
      if (!in.ok() || !in->has_value()) continue;
      auto m = DecodeEnvelope((*in)->bytes);
      if (!m.ok()) continue;
      if (m->type == wire::Body::WorkerStatsQuery) {
        server_->Reply((*in)->peer, EncodeWorkerStatsReply(wire::WorkerStatsReplyT{}, m->sequence, "worker"))
            .IgnoreError();
      } else if (m->type == wire::Body::SubmitRequest) {
        auto submit = ReadSubmitRequest(*m);
        {
          std::lock_guard<std::mutex> lock(mu_);
          submits_.push_back(*submit);
        }
        for (const wire::TokenChunkT& c : script_[submit->request]) {
          server_->Reply((*in)->peer, EncodeTokenChunk(c, m->sequence, "worker")).IgnoreError();
        }
      }
    }
  }
  std::map<RequestId, std::vector<wire::TokenChunkT>> script_;
  std::unique_ptr<RouterServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<wire::SubmitRequestT> submits_;
};

wire::TokenChunkT Chunk(RequestId id, std::vector<uint8_t> tokens, bool finished = false) {
  wire::TokenChunkT c;
  c.request = id;
  c.tokens = std::move(tokens);
  c.logits_digests.assign(c.tokens.size(), 5);
  c.finished = finished;
  return c;
}

wire::TokenChunkT Final(RequestId id, std::string message, wire::EndReason reason) {
  wire::TokenChunkT c = Chunk(id, {}, true);
  c.error = wire::ErrorCode::UNAVAILABLE;
  c.error_message = std::move(message);
  c.end_reason = reason;
  return c;
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
  ZmqNodeClientOptions o;
  o.worker_endpoint = worker.endpoint();
  o.worker_heartbeat = std::chrono::milliseconds(0);
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

TEST(ReplayClient, EachClientSendsItsOwnNonZeroIdentityOnEverySubmit) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  FakeWorker worker(dir.path(), {});
  ZmqNodeClientOptions o;
  o.worker_endpoint = worker.endpoint();
  o.worker_heartbeat = std::chrono::milliseconds(0);
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

}  // namespace
}  // namespace dhs::replay
