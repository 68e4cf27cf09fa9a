// ReplayDriver with a scripted fake NodeClient and a fake clock: every timing below is computed by hand from
// the script (tools/replay/driver.h).
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/replay/driver.h"

namespace dhs::replay {
namespace {

using ::testing::HasSubstr;

class FakeClock : public Clock {
 public:
  double NowMs() override { return now; }
  double now = 5000;  // not zero, so that the driver's times must be relative to the start
};

// One scripted node event: `after_ms` after the request's Submit, `tokens` new tokens.
struct Step {
  Step(double after, int n, bool end = false, std::string err = "", double wait = 0, double interval = -1)
      : after_ms(after), tokens(n), finished(end), error(std::move(err)), allocation_wait_ms(wait),
        token_interval_ms(interval) {}
  double after_ms;
  int tokens;
  bool finished;
  std::string error;
  double allocation_wait_ms;
  double token_interval_ms;  // the node's own gap since the previous tokens (TokenEvent::token_interval_ms)
};

// Plays each request's script relative to its Submit. Poll jumps the clock to the next scripted event when
// it falls within the timeout (so times are exact), else advances it by the whole timeout.
class FakeNode : public NodeClient {
 public:
  FakeNode(FakeClock* clock, std::map<RequestId, std::vector<Step>> plans) : clock_(clock), plans_(std::move(plans)) {}

  absl::Status Submit(const SubmitRequest& request) override {
    if (fail_submit_of && *fail_submit_of == request.request) return absl::UnavailableError("node went away");
    submits.push_back(request);
    ++in_flight;
    max_in_flight = std::max(max_in_flight, in_flight);
    for (const Step& step : plans_[request.request]) {
      TokenEvent ev;
      ev.request = request.request;
      for (int k = 0; k < step.tokens; ++k) {
        ev.tokens.push_back(static_cast<int32_t>((request.request * 31 + next_token_++) & 0xff));
        ev.logits_digests.push_back(0xD000u + static_cast<uint64_t>(ev.tokens.back()));  // a digest per token
      }
      ev.finished = step.finished;
      ev.error = step.error;
      ev.allocation_wait_ms = step.allocation_wait_ms;
      ev.token_interval_ms = step.token_interval_ms;
      pending_.emplace(clock_->now + step.after_ms, ev);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<TokenEvent>> Poll(double timeout_ms) override {
    EXPECT_GE(timeout_ms, 0);
    ++polls;
    if (pending_.empty() || pending_.begin()->first > clock_->now + timeout_ms) {
      clock_->now += timeout_ms;
      return std::vector<TokenEvent>{};
    }
    clock_->now = std::max(clock_->now, pending_.begin()->first);
    std::vector<TokenEvent> out;
    while (!pending_.empty() && pending_.begin()->first <= clock_->now) {
      out.push_back(pending_.begin()->second);
      if (out.back().finished || !out.back().error.empty()) --in_flight;
      pending_.erase(pending_.begin());
    }
    return out;
  }

  absl::StatusOr<NodeStats> Stats() override { return stats; }

  // As the worker: the request's remaining events are dropped and its end (error "cancelled: <reason>", end reason
  // kCancelled) comes cancel_delay_ms later; a request that has ended changes nothing.
  absl::Status Cancel(RequestId request, std::string_view reason) override {
    cancels.emplace_back(request, std::string(reason));
    bool open = false;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.request == request) {
        open = true;
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    if (!open || !confirm_cancels) return absl::OkStatus();
    TokenEvent ev;
    ev.request = request;
    ev.finished = true;
    ev.error = "cancelled: " + std::string(reason);
    ev.end_reason = EndReason::kCancelled;
    pending_.emplace(clock_->now + cancel_delay_ms, ev);
    return absl::OkStatus();
  }

  std::vector<std::pair<RequestId, std::string>> cancels;
  double cancel_delay_ms = 3;
  bool confirm_cancels = true;

  std::vector<SubmitRequest> submits;
  int in_flight = 0;
  int max_in_flight = 0;
  int polls = 0;
  std::optional<RequestId> fail_submit_of;
  NodeStats stats;

 private:
  FakeClock* clock_;
  std::map<RequestId, std::vector<Step>> plans_;
  std::multimap<double, TokenEvent> pending_;  // by absolute time, then insertion order
  int next_token_ = 0;
};

Trace MakeTrace(int n, std::vector<double> arrivals = {}) {
  Trace t;
  t.path = "fake";
  t.block_tokens = 10;
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.index = i;
    r.arrival_ms = arrivals.empty() ? 0 : arrivals[static_cast<size_t>(i)];
    r.input_tokens = 25 + i;
    r.output_tokens = 4;
    r.hash_ids = {0, 100 + i, 200 + i};
    t.requests.push_back(r);
  }
  return t;
}

DriverOptions Quiet() {
  DriverOptions o;
  o.on_progress = nullptr;
  return o;
}

TEST(ReplayDriver, ClosedLoopTimingsFollowTheScript) {
  FakeClock clock;
  // Request ids are 1 + trace index. Request 1: tokens at +10 (1), +15 (2), +25 (1, finished, waited 4 ms).
  // Request 2: +30 (1), +40 (1, finished).
  FakeNode node(&clock, {{1, {{10, 1}, {15, 2}, {25, 1, true, "", 4}}}, {2, {{30, 1}, {40, 1, true}}}});
  Trace trace = MakeTrace(2);
  auto sched = Scheduler::ClosedLoop(2, 1);
  ASSERT_TRUE(sched.ok());
  ReplayDriver driver(&node, &clock, Quiet());
  auto result = driver.Run(trace, *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->requests.size(), 2u);

  const RequestTiming& a = result->requests[0];
  EXPECT_EQ(a.request, 1u);
  EXPECT_EQ(a.submit_ms, 0);
  EXPECT_EQ(a.first_token_ms, 10);
  EXPECT_EQ(a.last_token_ms, 25);
  EXPECT_EQ(a.end_ms, 25);
  EXPECT_EQ(a.tokens, 4);
  EXPECT_EQ(a.output.size(), 4u);
  ASSERT_EQ(a.logits_digests.size(), 4u);  // digests of all three events, concatenated in token order
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a.logits_digests[i], 0xD000u + static_cast<uint64_t>(a.output[i]));
  EXPECT_EQ(a.allocation_wait_ms, 4);
  EXPECT_TRUE(a.served());
  EXPECT_EQ(a.ttft_ms(), 10.0);
  EXPECT_EQ(a.tpot_ms(), 5.0);  // (25 - 10) / (4 - 1)

  // Concurrency 1: request 2 is submitted when request 1 ended, at 25.
  const RequestTiming& b = result->requests[1];
  EXPECT_EQ(b.submit_ms, 25);
  EXPECT_EQ(b.first_token_ms, 55);
  EXPECT_EQ(b.last_token_ms, 65);
  EXPECT_EQ(b.ttft_ms(), 30.0);
  EXPECT_EQ(b.tpot_ms(), 10.0);  // (65 - 55) / (2 - 1)
  EXPECT_EQ(result->elapsed_ms, 65);
  EXPECT_EQ(node.max_in_flight, 1);
}

TEST(ReplayDriver, SubmitCarriesThePromptReferenceAndLengths) {
  FakeClock clock;
  FakeNode node(&clock, {{7, {{1, 1, true}}}, {8, {{1, 1, true}}}});
  Trace trace = MakeTrace(2);
  auto sched = Scheduler::ClosedLoop(2, 2);
  DriverOptions options = Quiet();
  options.first_request_id = 7;
  ReplayDriver driver(&node, &clock, options);
  ASSERT_TRUE(driver.Run(trace, *sched).ok());
  ASSERT_EQ(node.submits.size(), 2u);
  const SubmitRequest& s = node.submits[1];
  EXPECT_EQ(s.request, 8u);
  EXPECT_EQ(s.prompt.trace_index, 1);
  EXPECT_EQ(s.prompt.input_tokens, 26);
  EXPECT_EQ(s.prompt.block_tokens, 10);
  EXPECT_EQ(s.prompt.hash_ids, (std::vector<int64_t>{0, 101, 201}));
  EXPECT_EQ(s.max_new_tokens, 4);
  EXPECT_TRUE(s.sampling.greedy);
  EXPECT_EQ(s.sampling.seed, 1u);
}

// Issue 26 (--chat-turns): a next turn waits for its previous turn's end although it is due, then sends the previous
// prompt, the previous output tokens and its own tokens past them (ChatPrompt); a first turn sends its trace prompt.
TEST(ReplayDriver, ChatTurnsWaitForThePreviousTurnAndCarryItsAnswer) {
  FakeClock clock;
  // Request 1 (turn 0): 3 tokens, ends at +20. Request 2 (its next turn): due at 0 as well (open loop).
  FakeNode node(&clock, {{1, {{10, 2}, {20, 1, true}}}, {2, {{5, 1, true}}}});
  Trace trace = MakeTrace(2);
  trace.requests[1].input_tokens = 40;
  auto sched = Scheduler::ClosedLoop(2, 2);
  DriverOptions options = Quiet();
  options.chat_parent = {-1, 0};
  ReplayDriver driver(&node, &clock, options);
  auto result = driver.Run(trace, *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(node.submits.size(), 2u);
  const std::string first = SynthesizePrompt(PromptRef{0, 25, 10, {0, 100, 200}});
  EXPECT_EQ(node.submits[0].prompt.tokens, first);
  EXPECT_EQ(node.submits[0].prompt.input_tokens, 25);
  EXPECT_EQ(result->requests[1].submit_ms, 20);  // held until request 1 ended
  const std::vector<int32_t>& answer = result->requests[0].output;
  ASSERT_EQ(answer.size(), 3u);
  std::string want = first;
  for (int32_t t : answer) want.push_back(static_cast<char>(t));
  const std::string own = SynthesizePrompt(PromptRef{1, 40, 10, {0, 101, 201}});
  want += own.substr(28);  // its own tokens past 25 + 3
  EXPECT_EQ(node.submits[1].prompt.tokens, want);
  EXPECT_EQ(node.submits[1].prompt.input_tokens, 40);
}

TEST(ChatPrompt, HistoryAnswerThenNewTokensAndAlwaysOneNew) {
  EXPECT_EQ(ChatPrompt("abc", {'X', 'Y'}, "abcdefgh"), "abcXYfgh");
  EXPECT_EQ(ChatPrompt("abc", {'X', 'Y'}, "abcd"), "abcXYd");  // shorter than history + answer: its last token
  EXPECT_EQ(ChatPrompt("abc", {}, "abcd"), "abcd");
  EXPECT_EQ(ChatPrompt("", {0x141}, "zz"), std::string("\x41z"));  // tokens are bytes
}

TEST(ReplayDriver, ClosedLoopNeverExceedsConcurrency) {
  FakeClock clock;
  std::map<RequestId, std::vector<Step>> plans;
  for (RequestId r = 1; r <= 7; ++r) plans[r] = {{static_cast<double>(10 * r), 1}, {static_cast<double>(10 * r + 5), 1, true}};
  FakeNode node(&clock, plans);
  auto sched = Scheduler::ClosedLoop(7, 3);
  ReplayDriver driver(&node, &clock, Quiet());
  auto result = driver.Run(MakeTrace(7), *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(node.max_in_flight, 3);
  for (const RequestTiming& r : result->requests) EXPECT_TRUE(r.served());
  // Requests 1..3 start at 0 and end at 15, 25, 35; request 4 starts at 15 (when 1 ended).
  EXPECT_EQ(result->requests[3].submit_ms, 15);
  EXPECT_EQ(result->requests[4].submit_ms, 25);
}

TEST(ReplayDriver, OpenLoopSubmitsOnTimeWhileOthersRun) {
  FakeClock clock;
  // Arrivals 0 and 100 ms at time scale 0.5: request 2 is due at 50 while request 1 runs until 80.
  FakeNode node(&clock, {{1, {{10, 1}, {80, 1, true}}}, {2, {{5, 3, true}}}});
  Trace trace = MakeTrace(2, {0, 100});
  std::vector<double> arrivals = {0, 100};
  auto sched = Scheduler::OpenLoop(arrivals, 0.5);
  ASSERT_TRUE(sched.ok());
  ReplayDriver driver(&node, &clock, Quiet());
  auto result = driver.Run(trace, *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->requests[1].submit_ms, 50);  // the poll timeout was cut to the next arrival
  EXPECT_EQ(result->requests[1].ttft_ms(), 5.0);
  EXPECT_EQ(result->requests[1].tpot_ms(), 0.0);  // three tokens in one event: (55 - 55) / 2
  EXPECT_EQ(result->requests[0].tpot_ms(), 70.0);
  EXPECT_EQ(node.max_in_flight, 2);
  EXPECT_EQ(result->elapsed_ms, 80);
}

TEST(ReplayDriver, FailedRequestIsRecordedAndTheRunGoesOn) {
  FakeClock clock;
  FakeNode node(&clock, {{1, {{10, 1}, {20, 0, false, "out of host memory"}}}, {2, {{10, 1, true}}}});
  auto sched = Scheduler::ClosedLoop(2, 2);
  ReplayDriver driver(&node, &clock, Quiet());
  auto result = driver.Run(MakeTrace(2), *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->requests[0].served());
  EXPECT_EQ(result->requests[0].error, "out of host memory");
  EXPECT_EQ(result->requests[0].end_ms, 20);
  EXPECT_EQ(result->requests[0].tokens, 1);
  EXPECT_EQ(result->requests[0].tpot_ms(), std::nullopt);  // one token
  EXPECT_TRUE(result->requests[1].served());
}

TEST(ReplayDriver, EventForUnknownOrEndedRequestIsAnError) {
  {
    FakeClock clock;
    FakeNode node(&clock, {{1, {{10, 1, true}, {10, 1}}}});  // an event after the end, same poll
    auto sched = Scheduler::ClosedLoop(1, 1);
    auto result = ReplayDriver(&node, &clock, Quiet()).Run(MakeTrace(1), *sched);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(std::string(result.status().message()), HasSubstr("after it ended"));
  }
  {
    FakeClock clock;
    FakeNode node(&clock, {{1, {{10, 1, true}}}});
    auto sched = Scheduler::ClosedLoop(1, 1);
    DriverOptions options = Quiet();
    options.first_request_id = 50;  // the fake's script is for id 1: no events at all for 50
    options.idle_timeout_ms = 500;
    options.cancel_wait_ms = 0;  // the fake never confirms a cancel of a request it knows nothing of
    auto result = ReplayDriver(&node, &clock, options).Run(MakeTrace(1), *sched);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(result.status().message()), HasSubstr("1 requests in flight"));
    EXPECT_LT(clock.now - 5000, 600);  // gave up just after the idle timeout
  }
}

class StrayEventNode : public FakeNode {
 public:
  using FakeNode::FakeNode;
  absl::StatusOr<std::vector<TokenEvent>> Poll(double) override {
    TokenEvent ev;
    ev.request = 999;
    return std::vector<TokenEvent>{ev};
  }
};

TEST(ReplayDriver, EventForUnknownRequestIsAnError) {
  FakeClock clock;
  StrayEventNode node(&clock, {});
  auto sched = Scheduler::ClosedLoop(1, 1);
  auto result = ReplayDriver(&node, &clock, Quiet()).Run(MakeTrace(1), *sched);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("unknown request 999"));
}

TEST(ReplayDriver, SubmitFailureEndsTheRun) {
  FakeClock clock;
  FakeNode node(&clock, {{1, {{10, 1, true}}}});
  node.fail_submit_of = 2;
  auto sched = Scheduler::ClosedLoop(2, 1);
  auto result = ReplayDriver(&node, &clock, Quiet()).Run(MakeTrace(2), *sched);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
}

TEST(ReplayDriver, SchedulerMustMatchTheTrace) {
  FakeClock clock;
  FakeNode node(&clock, {});
  auto sched = Scheduler::ClosedLoop(3, 1);
  auto result = ReplayDriver(&node, &clock, Quiet()).Run(MakeTrace(2), *sched);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReplayDriver, ProgressAtMostOncePerIntervalAndAFinalLine) {
  FakeClock clock;
  // One request with a token every 100 ms for 3.5 s (35 tokens).
  std::vector<Step> steps;
  for (int k = 1; k <= 35; ++k) steps.push_back({100.0 * k, 1, k == 35});
  FakeNode node(&clock, {{1, steps}});
  std::vector<Progress> seen;
  DriverOptions options;
  options.on_progress = [&](const Progress& p) { seen.push_back(p); };
  auto sched = Scheduler::ClosedLoop(1, 1);
  auto result = ReplayDriver(&node, &clock, options).Run(MakeTrace(1), *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  // Lines at 1000, 2000, 3000 ms, and the final one at 3500 ms.
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].elapsed_ms, 1000);
  EXPECT_EQ(seen[0].output_tokens, 10);
  EXPECT_EQ(seen[0].tokens_per_s(), 10.0);
  EXPECT_EQ(seen[2].elapsed_ms, 3000);
  EXPECT_EQ(seen[3].elapsed_ms, 3500);
  EXPECT_EQ(seen[3].served, 1);
  EXPECT_EQ(seen[3].total, 1);
  EXPECT_EQ(seen[3].output_tokens, 35);
  EXPECT_EQ(FormatProgressLine(seen[3]), "replay: served 1/1 (failed 0), 35 tokens, 10.0 tokens/s, 3.5 s");
}

TEST(ReplayDriver, NodeStatsArePassedThrough) {
  FakeClock clock;
  FakeNode node(&clock, {{1, {{10, 1, true}}}});
  node.stats.sessions_admitted_max = 3;
  node.stats.census = {10, 20, 30};
  node.stats.gpus = {{0, 100, 40, 50, 5, 4096, 90 * 4096}};
  auto sched = Scheduler::ClosedLoop(1, 1);
  auto result = ReplayDriver(&node, &clock, Quiet()).Run(MakeTrace(1), *sched);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->stats.sessions_admitted_max, 3);
  EXPECT_EQ(result->stats.census.hot, 20);
  ASSERT_EQ(result->stats.gpus.size(), 1u);
  EXPECT_EQ(result->stats.gpus[0].peak_used_bytes, 90 * 4096);
}

TEST(ReplayDriver, SessionsAdmittedMaxIsAtLeastTheRequestsSeenStreaming) {
  // memd sampled nothing (a run shorter than the sampling period): the node says 0 sessions.
  FakeClock clock;
  // Requests 1-3 all stream from 10 ms to 30 ms after their submits at time 0 (closed loop at 3): 3 at once.
  FakeNode node(&clock, {{1, {{10, 1}, {30, 1, true}}}, {2, {{10, 1}, {30, 1, true}}}, {3, {{10, 1}, {30, 1, true}}},
                         {4, {{5, 2, true}}}});  // request 4 streams and ends within one poll
  node.stats.sessions_admitted_max = 0;
  auto sched = Scheduler::ClosedLoop(4, 3);
  auto result = ReplayDriver(&node, &clock, Quiet()).Run(MakeTrace(4), *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->streaming_max, 3);
  EXPECT_EQ(result->stats.sessions_admitted_max, 3);
  // A node figure above what the driver saw is kept.
  FakeClock clock2;
  FakeNode node2(&clock2, {{1, {{5, 2, true}}}});  // first token and end in one poll: counts 1
  node2.stats.sessions_admitted_max = 0;
  auto sched2 = Scheduler::ClosedLoop(1, 1);
  auto result2 = ReplayDriver(&node2, &clock2, Quiet()).Run(MakeTrace(1), *sched2);
  ASSERT_TRUE(result2.ok()) << result2.status();
  EXPECT_EQ(result2->stats.sessions_admitted_max, 1);
}

TEST(ReplayDriver, AFailedRunKeepsWhatItRecordedAndNamesWhereToLook) {
  FakeClock clock;
  // Request 1 is served; request 2's node never answers (its script is empty).
  FakeNode node(&clock, {{1, {{10, 1, true}}}, {2, {}}});
  auto sched = Scheduler::ClosedLoop(2, 1);
  DriverOptions options = Quiet();
  options.idle_timeout_ms = 500;
  options.idle_hint = "; see RUN/workerd.log";
  ReplayDriver driver(&node, &clock, options);
  auto result = driver.Run(MakeTrace(2), *sched);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("the worker may be dead or stuck; see RUN/workerd.log"));
  ASSERT_EQ(driver.partial().requests.size(), 2u);
  EXPECT_TRUE(driver.partial().requests[0].served());
  EXPECT_EQ(driver.partial().requests[0].tokens, 1);
  EXPECT_FALSE(driver.partial().requests[1].served());
  EXPECT_GE(driver.partial().requests[1].submit_ms, 0);
  EXPECT_GT(driver.partial().elapsed_ms, 500);
}

// Issue 22: a request not ended request_timeout_ms after its submit is cancelled once; the node's confirmation ends
// it as a timeout (not served), and the run goes on with the others.
TEST(ReplayDriver, RequestTimeoutCancelsTheRequestAndTheRunGoesOn) {
  FakeClock clock;
  // Request 1 streams at +10 and +20, then would finish only at +10000; request 2 is quick.
  FakeNode node(&clock, {{1, {{10, 1}, {20, 1}, {10000, 1, true}}}, {2, {{10, 1}, {15, 1, true}}}});
  auto sched = Scheduler::ClosedLoop(2, 2);
  DriverOptions options = Quiet();
  options.request_timeout_ms = 100;
  ReplayDriver driver(&node, &clock, options);
  auto result = driver.Run(MakeTrace(2), *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(node.cancels.size(), 1u);
  EXPECT_EQ(node.cancels[0].first, 1u);
  EXPECT_THAT(node.cancels[0].second, HasSubstr("timeout after 100 ms"));
  const RequestTiming& r = result->requests[0];
  EXPECT_FALSE(r.served());
  EXPECT_EQ(r.end_reason, EndReason::kTimeout);
  EXPECT_THAT(r.error, HasSubstr("timeout after 100 ms"));
  EXPECT_EQ(r.tokens, 2);
  // Polls end at 10, 15, 20 (events), then 70, 120 (50 ms each): cancelled after the one at 120, ended 3 ms later.
  EXPECT_EQ(r.cancel_sent_ms, 120);
  EXPECT_EQ(r.end_ms, 123);
  EXPECT_TRUE(result->requests[1].served());
  EXPECT_EQ(result->requests[1].end_reason, EndReason::kFinished);
  EXPECT_LT(result->elapsed_ms, 200);  // not the 10 s of its script
}

// Issue 22: the idle timeout cancels every request in flight (the worker frees them) before the run fails; the ends
// the node confirms are recorded as timeouts.
TEST(ReplayDriver, IdleTimeoutCancelsEveryRequestInFlight) {
  FakeClock clock;
  FakeNode node(&clock, {{1, {{10, 1}, {100000, 1, true}}}, {2, {{100000, 1, true}}}});
  auto sched = Scheduler::ClosedLoop(2, 2);
  DriverOptions options = Quiet();
  options.idle_timeout_ms = 500;
  ReplayDriver driver(&node, &clock, options);
  auto result = driver.Run(MakeTrace(2), *sched);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  ASSERT_EQ(node.cancels.size(), 2u);
  EXPECT_THAT(node.cancels[0].second, HasSubstr("no event from the node"));
  for (const RequestTiming& r : driver.partial().requests) {
    EXPECT_EQ(r.end_reason, EndReason::kTimeout) << r.request;
    EXPECT_GE(r.end_ms, 0);
  }
  EXPECT_LT(clock.now - 5000, 600);  // the confirmations came at once: no wait for cancel_wait_ms
  // A node that never confirms: the driver waits cancel_wait_ms, then fails with the requests not ended.
  FakeClock clock2;
  FakeNode silent(&clock2, {{1, {{100000, 1, true}}}});
  silent.confirm_cancels = false;
  auto sched2 = Scheduler::ClosedLoop(1, 1);
  ReplayDriver driver2(&silent, &clock2, options);
  EXPECT_EQ(driver2.Run(MakeTrace(1), *sched2).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(driver2.partial().requests[0].end_reason, EndReason::kNone);
  EXPECT_EQ(silent.cancels.size(), 1u);
}

// Issue 22: TPOT from the node's own gaps between tokens, not from the polls that returned them: a stream whose
// events all arrive in one poll (a client that read late) still has the worker's 1.1 ms per token.
TEST(ReplayDriver, TpotUsesTheNodesTokenIntervals) {
  FakeClock clock;
  // Four single-token events in one poll (+30), the last three 1.1 ms after the one before as the worker stamped them.
  FakeNode node(&clock, {{1, {{30, 1}, {30, 1, false, "", 0, 1.1}, {30, 1, false, "", 0, 1.1},
                              {30, 1, true, "", 0, 1.1}}}});
  auto sched = Scheduler::ClosedLoop(1, 1);
  auto result = ReplayDriver(&node, &clock, Quiet()).Run(MakeTrace(1), *sched);
  ASSERT_TRUE(result.ok()) << result.status();
  const RequestTiming& r = result->requests[0];
  EXPECT_EQ(r.first_token_ms, r.last_token_ms);  // one poll
  ASSERT_TRUE(r.tpot_ms());
  EXPECT_NEAR(*r.tpot_ms(), 1.1, 1e-9);  // (3 * 1.1) / 3, not 0
  EXPECT_EQ(r.end_reason, EndReason::kFinished);
}

// Two runs of two served requests, tokens {1, 2, 3} and {4}, each token with its own digest.
void TwoServedRequests(DriverResult& r) {
  r.requests.resize(2);
  r.requests[0].request = 10;
  r.requests[0].trace_index = 0;
  r.requests[1].request = 11;
  r.requests[1].trace_index = 1;
  for (RequestTiming& t : r.requests) t.finished = true;
  r.requests[0].output = {1, 2, 3};
  r.requests[0].logits_digests = {0xa1, 0xa2, 0xa3};
  r.requests[1].output = {4};
  r.requests[1].logits_digests = {0xb1};
}

TEST(CompareOutputs, IdenticalRunsMatch) {
  DriverResult a, b;
  TwoServedRequests(a);
  TwoServedRequests(b);
  const ExactnessVerdict v = CompareOutputs(a, b);
  EXPECT_TRUE(v.match);
  EXPECT_EQ(v.reason, "");
  EXPECT_TRUE(OutputsMatch(a, b));
}

TEST(CompareOutputs, ComparesTokensOfServedRequests) {
  DriverResult a, b;
  TwoServedRequests(a);
  TwoServedRequests(b);
  b.requests[1].output = {5};
  EXPECT_EQ(CompareOutputs(a, b).reason, "request 11 (trace row 1): token 0 is 4 in the run and 5 in the reference");
  EXPECT_FALSE(OutputsMatch(a, b));
  TwoServedRequests(b);
  b.requests[1].error = "failed";
  b.requests[1].finished = false;
  EXPECT_EQ(CompareOutputs(a, b).reason, "request 11 (trace row 1) was not served in the reference: failed");
  TwoServedRequests(b);
  b.requests.pop_back();
  EXPECT_EQ(CompareOutputs(a, b).reason, "the runs hold 2 and 1 requests");
  TwoServedRequests(b);
  b.requests[0].output.push_back(9);
  b.requests[0].logits_digests.push_back(0xa4);
  EXPECT_EQ(CompareOutputs(a, b).reason, "request 10 (trace row 0) has 3 tokens in the run and 4 in the reference");
  TwoServedRequests(b);
  std::swap(b.requests[0].trace_index, b.requests[1].trace_index);
  EXPECT_FALSE(CompareOutputs(a, b).match);
  EXPECT_THAT(CompareOutputs(a, b).reason, HasSubstr("trace row 0 in one run and 1 in the other"));
}

TEST(CompareOutputs, ComparesLogitsDigests) {
  DriverResult a, b;
  TwoServedRequests(a);
  TwoServedRequests(b);
  b.requests[0].logits_digests[2] ^= 1;  // same tokens, one logit bit differs somewhere in token 2's logits
  const ExactnessVerdict v = CompareOutputs(a, b);
  EXPECT_FALSE(v.match);
  EXPECT_EQ(v.reason,
            "request 10 (trace row 0): token 2 has logits digest 00000000000000a3 in the run and 00000000000000a2 in "
            "the reference");
}

// The verdict never passes on tokens alone: a missing digest on either side, or on both, is a mismatch naming the
// request and the first token without one.
TEST(CompareOutputs, MissingDigestsAreAMismatchEvenOnBothSides) {
  DriverResult a, b;
  TwoServedRequests(a);
  TwoServedRequests(b);
  b.requests[0].logits_digests.pop_back();
  EXPECT_EQ(CompareOutputs(a, b).reason,
            "request 10 (trace row 0): token 2 has no logits digest in the reference (3 tokens, 2 digests)");
  a.requests[0].logits_digests.pop_back();  // lost on both sides: still a mismatch
  EXPECT_EQ(CompareOutputs(a, b).reason,
            "request 10 (trace row 0): token 2 has no logits digest in the run (3 tokens, 2 digests)");
  for (DriverResult* r : {&a, &b}) {  // every digest lost on both sides
    for (RequestTiming& t : r->requests) t.logits_digests.clear();
  }
  EXPECT_EQ(CompareOutputs(a, b).reason,
            "request 10 (trace row 0): token 0 has no logits digest in the run (3 tokens, 0 digests)");
  EXPECT_FALSE(OutputsMatch(a, b));
  TwoServedRequests(a);
  TwoServedRequests(b);
  a.requests[1].logits_digests.push_back(0xb2);  // more digests than tokens
  EXPECT_EQ(CompareOutputs(a, b).reason,
            "request 11 (trace row 1) has 2 logits digests for 1 tokens in the run");
}

TEST(CompareOutputs, NothingToCompareIsNotAMatch) {
  DriverResult a, b;
  EXPECT_EQ(CompareOutputs(a, b).reason, "no requests to compare");
  TwoServedRequests(a);
  TwoServedRequests(b);
  a.requests[1].output.clear();
  a.requests[1].logits_digests.clear();
  b.requests[1].output.clear();
  b.requests[1].logits_digests.clear();
  EXPECT_EQ(CompareOutputs(a, b).reason, "request 11 (trace row 1) has no output token in the run");
}

}  // namespace
}  // namespace dhs::replay
