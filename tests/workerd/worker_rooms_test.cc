// The worker's rooms alone (issue 23: workerd/worker_stats.h WorkerRecorder, workerd/client_streams.h ClientStreams,
// workerd/memd_away.h MemdAway's step decisions), each over a RequestBook and a request map built here, without a
// Worker, a model or a memd: the counts, histograms and timelines an event stream leaves; which tokens a stream sends
// a client that had some; Cancel's lookups and the end it asks for; when a request may step, pauses and holds tokens
// while memd is away. Expected values are computed from the headers' rules by hand.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "workerd/client_streams.h"
#include "workerd/memd_away.h"
#include "workerd/request_book.h"
#include "workerd/worker_request.h"
#include "workerd/worker_stats.h"

namespace dhs {
namespace {

using Clock = std::chrono::steady_clock;

wire::SubmitRequestT Submit(RequestId id, uint32_t max_new, uint64_t client = 0) {
  wire::SubmitRequestT s;
  s.request = id;
  s.client = client;
  s.prompt = {1, 2, 3};
  s.max_new_tokens = max_new;
  return s;
}

// The chunks and acceptances a client got, by (peer, client id); refuses every non-final chunk once `accept` were
// taken (a client that stopped reading).
class Sink final : public ClientSink {
 public:
  void Accepted(const ClientRef& c, const wire::SubmitAcceptedT& a) override {
    accepted.emplace_back(c.peer, a.request);
  }
  absl::Status Chunk(const ClientRef& c, const wire::TokenChunkT& chunk) override {
    if (!chunk.finished && chunks.size() >= accept) return absl::ResourceExhaustedError("client not reading (test)");
    chunks.push_back(chunk);
    peers.push_back(c.peer);
    return absl::OkStatus();
  }
  size_t accept = SIZE_MAX;
  std::vector<std::pair<std::string, RequestId>> accepted;
  std::vector<wire::TokenChunkT> chunks;
  std::vector<std::string> peers;
};

// What the rooms asked the loop to end.
class Ends final : public RequestEnds {
 public:
  void Finish(RequestId id, absl::Status error) override { ended.emplace_back(id, std::move(error)); }
  void Drop(RequestId id) override { dropped.push_back(id); }
  std::vector<std::pair<RequestId, absl::Status>> ended;
  std::vector<RequestId> dropped;
};

// A MemdLink that takes everything (MemdAway reads its session only).
class Link final : public MemdLink {
 public:
  absl::Status SendAdmitRequest(const wire::AdmitRequestT&) override { return absl::OkStatus(); }
  absl::Status SendBackupComplete(const wire::BackupCompleteT&) override { return absl::OkStatus(); }
  absl::Status SendHostCopyWritten(const wire::HostCopyWrittenT&) override { return absl::OkStatus(); }
  absl::Status SendReadersDone(const wire::ReadersDoneT&) override { return absl::OkStatus(); }
  absl::Status SendReadyPublish(const wire::ReadyPublishT&) override { return absl::OkStatus(); }
  absl::Status SendComplete(const wire::CompleteT&) override { return absl::OkStatus(); }
  absl::Status SendTokensCommitted(const wire::TokensCommittedT&) override { return absl::OkStatus(); }
};

// A book, a request map and the rooms over them, as Worker::Create wires them (without the agent and the model).
struct Rooms {
  Rooms() : book(3, ResumedOutputLimits{}), recorder(3), clients(&sink, &book, &requests, &recorder, &ends) {}
  // A submitted request of `peer` with `generated` tokens (token t = t + 10, digest t + 100), moved to kActive.
  WorkerRequest& Active(RequestId client_id, const std::string& peer, uint32_t max_new, size_t generated) {
    absl::StatusOr<RequestLife*> life = book.Open(Submit(client_id, max_new), ClientRef{peer, 1}, false, 16);
    EXPECT_TRUE(life.ok()) << life.status();
    std::unique_ptr<WorkerRequest> r = NewWorkerRequest(**life, Clock::now());
    for (size_t t = 0; t < generated; ++t) {
      r->out.generated.push_back(static_cast<model::Token>(t + 10));
      r->out.digests.push_back(t + 100);
    }
    EXPECT_TRUE(book.Transition(r->id, RequestPhase::kWaiting, RequestPhase::kGranted).ok());
    book.TakeGranted();
    EXPECT_TRUE(book.Transition(r->id, RequestPhase::kGranted, RequestPhase::kActive).ok());
    WorkerRequest& ref = *r;
    requests.emplace(r->id, std::move(r));
    return ref;
  }

  Sink sink;
  Ends ends;
  RequestBook book;
  RequestMap requests;
  WorkerRecorder recorder;
  ClientStreams clients;
};

std::vector<int> Tokens(const wire::TokenChunkT& c) { return std::vector<int>(c.tokens.begin(), c.tokens.end()); }

TEST(WorkerRecorder, CountsEndsByReasonAndKeepsTheTimeline) {
  Rooms k;
  WorkerRequest& r = k.Active(42, "p", 4, 0);
  r.times.submitted = Clock::time_point(std::chrono::microseconds(1000));
  r.times.granted = Clock::time_point(std::chrono::microseconds(1250));
  k.recorder.Submitted(r, 9, "");
  k.recorder.Granted(r);
  // The first token 500 us after the submit (TTFT), the second 30 us after it (TPOT).
  k.recorder.Token(r, Clock::time_point(std::chrono::microseconds(1500)));
  r.times.last_token = Clock::time_point(std::chrono::microseconds(1500));
  r.out.generated.push_back(1);
  k.recorder.Token(r, Clock::time_point(std::chrono::microseconds(1530)));
  r.out.generated.push_back(2);
  k.recorder.Ended(r.id, 2, absl::UnavailableError("gone"), Clock::time_point(std::chrono::microseconds(2000)));
  k.recorder.Refused(77, 0, absl::UnavailableError("refused"), Clock::time_point(std::chrono::microseconds(2100)));
  k.recorder.Ended(78, 4, absl::OkStatus(), Clock::time_point(std::chrono::microseconds(2200)));

  const WorkerStats s = k.recorder.Snapshot(StatsParts{});
  EXPECT_EQ(s.tokens_generated, 2u);
  EXPECT_EQ(s.finished_requests, 2u);  // the refused report is a failure, not a finished request
  EXPECT_EQ(s.failed_requests, 2u);
  EXPECT_EQ(s.failures, (std::map<std::string, uint64_t>{{"unavailable", 2}}));
  EXPECT_EQ(s.ttft.sum_us, 500u);
  EXPECT_EQ(s.tpot.sum_us, 30u);
  EXPECT_EQ(s.admission_wait.sum_us, 250u);

  const nlohmann::json j = nlohmann::json::parse(k.recorder.TimelineJson(42));
  ASSERT_EQ(j["timelines"].size(), 1u);
  const nlohmann::json& t = j["timelines"][0];
  EXPECT_EQ(t["client_request"], 42);
  EXPECT_EQ(t["client"], 9);
  EXPECT_EQ(t["gpu"], 3);
  EXPECT_TRUE(t["ended"].get<bool>());
  ASSERT_EQ(t["events"].size(), 3u);
  EXPECT_EQ(t["events"][0]["at_us"], 1000);
  EXPECT_EQ(t["events"][1]["at_us"], 1500);
  EXPECT_EQ(t["events"][2]["at_us"], 2000);
  EXPECT_EQ(t["events"][2]["detail"], "UNAVAILABLE: gone");
}

TEST(WorkerRecorder, AResumeTakesItsFirstNewTokenAsItsFirst) {
  Rooms k;
  WorkerRequest& r = k.Active(5, "p", 8, 3);
  r.out.resumed = 3;  // three tokens committed before the resume
  r.times.submitted = Clock::time_point(std::chrono::microseconds(10));
  k.recorder.Token(r, Clock::time_point(std::chrono::microseconds(110)));
  const WorkerStats s = k.recorder.Snapshot(StatsParts{});
  EXPECT_EQ(s.ttft.sum_us, 100u);
  EXPECT_EQ(s.tpot.sum_us, 0u);
}

TEST(WorkerRecorder, StatsReplyCarriesTheCountersAndTheFacts) {
  WorkerRecorder rec(2);
  ++rec.counts().submits_refused;
  rec.Ended(1, 3, absl::ResourceExhaustedError("full"), Clock::now());
  WorkerConfig config;
  config.gpu = 2;
  config.mode = WorkerMode::kAdaptive;
  WorkerGeometry geometry;
  geometry.capacity_pages = 17;
  geometry.page_bytes = 4096;
  const wire::WorkerStatsReplyT r =
      StatsReplyOf(rec.Snapshot(StatsParts{}), StatsFacts{&config, &geometry, 4, 6, 96, 2, 5});
  EXPECT_EQ(r.gpu, 2u);
  EXPECT_EQ(r.mode, "adaptive");
  EXPECT_EQ(r.submits_refused, 1u);
  EXPECT_EQ(r.finished_requests, 1u);
  EXPECT_EQ(r.failed_requests, 1u);
  ASSERT_EQ(r.failures.size(), 1u);
  EXPECT_EQ(r.failures[0]->reason, "resource_exhausted");
  EXPECT_EQ(r.active_requests, 4u);
  EXPECT_EQ(r.waiting_requests, 6u);
  EXPECT_EQ(r.staging_bytes, 96u);
  EXPECT_EQ(r.resumed_outputs_waiting, 2u);
  EXPECT_EQ(r.epoch, 5u);
  EXPECT_EQ(r.capacity_pages, 17u);
  EXPECT_EQ(r.page_bytes, 4096u);
}

TEST(ClientStreams, AStreamSendsOnlyWhatItsClientLacks) {
  Rooms k;
  WorkerRequest& r = k.Active(7, "p", 10, 5);  // tokens 10..14
  k.clients.Stream(r, 2);                      // the step gave the last two
  ASSERT_EQ(k.sink.chunks.size(), 1u);
  EXPECT_EQ(Tokens(k.sink.chunks[0]), (std::vector<int>{13, 14}));
  EXPECT_EQ(k.sink.chunks[0].logits_digests, (std::vector<uint64_t>{103, 104}));
  EXPECT_FALSE(k.sink.chunks[0].finished);
  EXPECT_EQ(k.sink.chunks[0].request, 7u);

  r.life->tokens.client_has = 4;  // a re-attached client that had four
  k.clients.Stream(r, 2);
  ASSERT_EQ(k.sink.chunks.size(), 2u);
  EXPECT_EQ(Tokens(k.sink.chunks[1]), (std::vector<int>{14}));

  r.life->tokens.client_has = 5;  // it had them all, not finished: nothing
  k.clients.Stream(r, 2);
  EXPECT_EQ(k.sink.chunks.size(), 2u);

  WorkerRequest& done = k.Active(8, "p", 5, 5);  // finished, its client had every token: an empty final chunk
  done.life->tokens.client_has = 5;
  k.clients.Stream(done, 1);
  ASSERT_EQ(k.sink.chunks.size(), 3u);
  EXPECT_TRUE(k.sink.chunks[2].tokens.empty());
  EXPECT_TRUE(k.sink.chunks[2].finished);
}

TEST(ClientStreams, ARefusedChunkFailsItsRequest) {
  Rooms k;
  k.sink.accept = 0;
  WorkerRequest& r = k.Active(7, "p", 10, 5);
  k.clients.Stream(r, 1);
  EXPECT_TRUE(k.sink.chunks.empty());
  EXPECT_EQ(r.client_error.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.client_error.message(), "request 7 failed after 4 tokens: client not reading (test)");
}

TEST(ClientStreams, ReportEndSendsAFailedRequestsFinalChunkAndCountsIt) {
  Rooms k;
  WorkerRequest& ok = k.Active(1, "p", 4, 4);
  WorkerRequest& bad = k.Active(2, "p", 4, 1);
  k.clients.ReportEnd(ok, absl::OkStatus());  // its last chunk went with its last token: nothing more
  k.clients.ReportEnd(bad, absl::InternalError("boom"));
  ASSERT_EQ(k.sink.chunks.size(), 1u);
  EXPECT_EQ(k.sink.chunks[0].request, 2u);
  EXPECT_TRUE(k.sink.chunks[0].finished);
  EXPECT_EQ(k.sink.chunks[0].error_message, "boom");
  const WorkerStats s = k.recorder.Snapshot(StatsParts{});
  EXPECT_EQ(s.finished_requests, 2u);
  EXPECT_EQ(s.failures, (std::map<std::string, uint64_t>{{"internal", 1}}));
}

TEST(ClientStreams, CancelFindsTheClientsRequestAndAsksForItsEnd) {
  Rooms k;
  WorkerRequest& r = k.Active(7, "p", 10, 2);
  // Another peer's id 7, and an unknown id: NOT_FOUND, nothing ended.
  EXPECT_EQ(k.clients.Cancel(7, 0, ClientRef{"q", 2}, "no").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(k.clients.Cancel(8, 0, ClientRef{"p", 2}, "no").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(k.ends.ended.empty());
  ASSERT_TRUE(k.clients.Cancel(7, 0, ClientRef{"p", 2}, std::string(300, 'x')).ok());
  ASSERT_EQ(k.ends.ended.size(), 1u);
  EXPECT_EQ(k.ends.ended[0].first, r.id);
  EXPECT_EQ(k.ends.ended[0].second.code(), absl::StatusCode::kCancelled);
  EXPECT_NE(k.ends.ended[0].second.message().find(std::string(256, 'x')), std::string::npos);
  EXPECT_EQ(k.ends.ended[0].second.message().find(std::string(257, 'x')), std::string::npos);  // cut to 256 bytes
  EXPECT_EQ(k.recorder.Snapshot(StatsParts{}).requests_cancelled, 1u);
}

TEST(ClientStreams, EndClientEndsEveryRequestOfThatPeer) {
  Rooms k;
  const RequestId a = k.Active(1, "gone", 4, 0).id;
  k.Active(2, "stays", 4, 0);
  const RequestId c = k.Active(3, "gone", 4, 0).id;
  EXPECT_EQ(k.clients.EndClient("gone", absl::UnavailableError("client went away")), 2u);
  ASSERT_EQ(k.ends.ended.size(), 2u);
  EXPECT_EQ(k.ends.ended[0].first, a);
  EXPECT_EQ(k.ends.ended[1].first, c);
}

TEST(ClientStreams, AFinishedResumedOutputIsStreamedOnceToItsAttach) {
  Rooms k;
  k.clients.KeepOutput({9, 4}, DetachedOutput{{10, 11, 12}, {100, 101, 102}, absl::OkStatus()});
  ASSERT_TRUE(k.clients.Attach(4, 1, ClientRef{"p", 3}, 9).ok());  // it had one token
  ASSERT_EQ(k.sink.accepted.size(), 1u);
  ASSERT_EQ(k.sink.chunks.size(), 1u);
  EXPECT_EQ(Tokens(k.sink.chunks[0]), (std::vector<int>{11, 12}));
  EXPECT_TRUE(k.sink.chunks[0].finished);
  EXPECT_EQ(k.clients.Attach(4, 0, ClientRef{"p", 3}, 9).code(), absl::StatusCode::kNotFound);  // claimed once
}

TEST(MemdAway, WhileAwayARequestStepsUntilItsHeldBoundThenPausesAndHolds) {
  Rooms k;
  Link link;
  WorkerConfig config;
  config.away_held_tokens = 3;
  WorkerGeometry geometry;
  MemdAway away(AwayParts{&config, &geometry, &link, &k.book, &k.requests, nullptr, nullptr, &k.recorder, &k.clients,
                          nullptr, &k.ends});
  WorkerRequest& r = k.Active(7, "p", 10, 2);
  EXPECT_FALSE(away.away());
  EXPECT_TRUE(away.MayStep(r, 1));
  away.Pause(r);  // memd up: nothing
  EXPECT_EQ(r.life->phase, RequestPhase::kActive);

  ASSERT_TRUE(link.session().TakeLoss(Clock::now()));  // what Enter does first (the agent is not needed here)
  EXPECT_TRUE(away.away());
  r.out.generated.push_back(12);
  r.out.digests.push_back(102);
  away.Hold(r, 1);  // held from token 2 on
  EXPECT_EQ(r.life->tokens.held_from, std::optional<size_t>(2));
  EXPECT_TRUE(away.MayStep(r, 1));  // one held, bound 3
  r.out.generated.insert(r.out.generated.end(), {13, 14});
  r.out.digests.insert(r.out.digests.end(), {103, 104});
  away.Hold(r, 2);
  EXPECT_EQ(r.life->tokens.held_from, std::optional<size_t>(2));  // the first held token stays the mark
  EXPECT_FALSE(away.MayStep(r, 1));  // three held: the bound
  away.Pause(r);
  EXPECT_EQ(r.life->phase, RequestPhase::kPaused);
  const WorkerStats s = k.recorder.Snapshot(StatsParts{});
  EXPECT_EQ(s.tokens_while_away, 3u);
  EXPECT_EQ(s.paused_while_away, 1u);
  EXPECT_TRUE(k.sink.chunks.empty());  // nothing streamed while away

  WorkerRequest& done = k.Active(8, "p", 2, 2);  // finished: never steps again, never pauses
  EXPECT_FALSE(away.MayStep(done, 1));
  away.Pause(done);
  EXPECT_EQ(done.life->phase, RequestPhase::kActive);
}

}  // namespace
}  // namespace dhs
