// The prepared-prefix closed loop (tools/replay/closed_loop.h, issue 27) against a fake node and a fake clock: the
// two synthetic traces, the request ids of both phases, the closed loop's in-flight count, the counters of the
// measured window (preparation subtracted), the preparation time apart, and the settings' validation. Every expected
// value is computed by hand from the script below.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/replay/closed_loop.h"

namespace dhs::replay {
namespace {

using ::testing::HasSubstr;

class FakeClock : public Clock {
 public:
  double NowMs() override { return now; }
  double now = 1000;
};

// Each request streams its first token 1 ms after its Submit, then the others and its end `latency_ms` after it.
// Counts like a worker with a row cache:
// the first request naming a prefix chain computes its blocks, every later one imports them.
class FakeNode : public NodeClient {
 public:
  explicit FakeNode(FakeClock* clock, double latency_ms) : clock_(clock), latency_ms_(latency_ms) {}

  absl::Status Submit(const SubmitRequest& r) override {
    submits.push_back(r);
    ++in_flight;
    max_in_flight = std::max(max_in_flight, in_flight);
    const int64_t blocks = static_cast<int64_t>(r.prompt.hash_ids.size());
    if (seen_prefix_.insert(r.prompt.hash_ids.empty() ? -1 : r.prompt.hash_ids[0]).second) {
      counters.prefix_blocks_computed += blocks;
    } else {
      counters.prefix_blocks_imported += blocks;
    }
    TokenEvent first, rest;  // the first token 1 ms after the submit, the others and the end at latency_ms
    first.request = rest.request = r.request;
    for (int64_t k = 0; k < r.max_new_tokens; ++k) {
      TokenEvent& ev = k == 0 ? first : rest;
      ev.tokens.push_back(static_cast<int32_t>(k));
      ev.logits_digests.push_back(static_cast<uint64_t>(k));
    }
    rest.finished = true;
    pending_.emplace(clock_->now + 1, first);
    pending_.emplace(clock_->now + latency_ms_, rest);
    return absl::OkStatus();
  }
  absl::Status Cancel(RequestId, std::string_view) override { return absl::OkStatus(); }
  absl::StatusOr<std::vector<TokenEvent>> Poll(double timeout_ms) override {
    if (pending_.empty() || pending_.begin()->first > clock_->now + timeout_ms) {
      clock_->now += timeout_ms;
      return std::vector<TokenEvent>{};
    }
    clock_->now = std::max(clock_->now, pending_.begin()->first);
    std::vector<TokenEvent> out;
    while (!pending_.empty() && pending_.begin()->first <= clock_->now) {
      out.push_back(pending_.begin()->second);
      if (out.back().finished) --in_flight;
      pending_.erase(pending_.begin());
    }
    return out;
  }
  absl::StatusOr<NodeStats> Stats() override {
    NodeStats s = counters;  // since the client connected, as ZmqNodeClient's
    s.sessions_admitted_max = max_in_flight;  // a peak, sampled since the client connected or the last restart
    return s;
  }
  absl::Status RestartPeaks() override {
    ++peak_restarts;
    max_in_flight = in_flight;
    return absl::OkStatus();
  }

  std::vector<SubmitRequest> submits;
  int64_t in_flight = 0, max_in_flight = 0, peak_restarts = 0;
  NodeStats counters;

 private:
  FakeClock* clock_;
  double latency_ms_;
  std::set<int64_t> seen_prefix_;
  std::multimap<double, TokenEvent> pending_;
};

PrefixWorkload Workload() {
  PrefixWorkload w;
  w.prefixes = 3;
  w.prefix_tokens = 256;
  w.block_tokens = 64;
  w.suffix_tokens = 8;
  w.output_tokens = 5;
  w.sessions = 10;
  return w;
}

// The driver's options of these tests: request ids from `first_request_id`, no progress line.
DriverOptions QuietOptions(RequestId first_request_id) {
  DriverOptions options;
  options.first_request_id = first_request_id;
  options.on_progress = nullptr;
  return options;
}

TEST(PrefixWorkloadTest, TracesHoldOnePrefixPerRequestAndDistinctRows) {
  const PrefixWorkload w = Workload();
  const Trace prep = PreparationTrace(w);
  ASSERT_EQ(prep.requests.size(), 3u);
  EXPECT_EQ(prep.block_tokens, 64);
  for (int64_t p = 0; p < 3; ++p) {
    const TraceRequest& r = prep.requests[static_cast<size_t>(p)];
    EXPECT_EQ(r.index, p);
    EXPECT_EQ(r.input_tokens, 264);
    EXPECT_EQ(r.output_tokens, 1);
    EXPECT_EQ(r.hash_ids, (std::vector<int64_t>{PrefixHashId(p, 0), PrefixHashId(p, 1), PrefixHashId(p, 2),
                                                PrefixHashId(p, 3)}));
  }
  const Trace sessions = SessionTrace(w, 10);
  ASSERT_EQ(sessions.requests.size(), 10u);
  for (int64_t i = 0; i < 10; ++i) {
    const TraceRequest& r = sessions.requests[static_cast<size_t>(i)];
    EXPECT_EQ(r.index, 3 + i);  // after the preparation's rows: its own suffix tokens
    EXPECT_EQ(r.output_tokens, 5);
    EXPECT_EQ(r.hash_ids, prep.requests[static_cast<size_t>(i % 3)].hash_ids) << "session " << i;
  }
  EXPECT_NE(PrefixHashId(0, 1), PrefixHashId(1, 0));
  EXPECT_EQ(PrefixWorkload{}.block(), 1);  // min(512, max(1, 0))
  PrefixWorkload big = w;
  big.block_tokens = 0;
  big.prefix_tokens = 32768;
  EXPECT_EQ(big.block(), 512);
  EXPECT_EQ(big.SessionsAt(4), 10);
  big.sessions = 0;
  EXPECT_EQ(big.SessionsAt(4), 16);  // 4 x C
  EXPECT_EQ(big.SessionsAt(0), 3);   // at least N
  big.sessions_per_c = 2;            // --sessions-per-c 2: each sweep point its own count
  EXPECT_EQ(big.SessionsAt(1), 3);   // max(3, 2)
  EXPECT_EQ(big.SessionsAt(64), 128);
}

TEST(PrefixWorkloadTest, ASweepSharesOneNodeWithDistinctIdsAndOutputsPerPoint) {
  PrefixWorkload w = Workload();
  EXPECT_TRUE(PrefixSweepSharesNode(w, 3, ""));
  EXPECT_FALSE(PrefixSweepSharesNode(w, 0, ""));                      // one run: its own node as before
  EXPECT_FALSE(PrefixSweepSharesNode(w, 3, "ipc:///tmp/x/worker-0.sock"));  // --connect: the given worker
  EXPECT_FALSE(PrefixSweepSharesNode(PrefixWorkload{}, 3, ""));        // no workload
  EXPECT_EQ(SweepFirstRequestId(0), 1u);
  EXPECT_EQ(SweepFirstRequestId(1), 4294967297u);  // 1 + 2^32
  EXPECT_EQ(SweepFirstRequestId(5), 21474836481u);  // 1 + 5 x 2^32
  EXPECT_EQ(SweepOutputsPath("out.jsonl", 16), "out.jsonl.c16");
  EXPECT_EQ(SweepOutputsPath("out.jsonl", std::nullopt), "out.jsonl");
}

TEST(PrefixWorkloadTest, ASecondPointOnTheSameNodeImportsItsPreparationAndKeepsItsOwnWindow) {
  // The same node (its row cache: FakeNode counts a chain computed once) serves two points, C = 2 then C = 4, as a
  // sweep on one node does: the second preparation imports every block, and each window counts its sessions only.
  FakeClock clock;
  FakeNode node(&clock, 100);
  PrefixWorkload w = Workload();
  w.sessions = 0;
  w.sessions_per_c = 2;
  DriverOptions options = QuietOptions(SweepFirstRequestId(0));
  auto first = RunPrefixWorkload(&node, &clock, options, w, 2, 8);
  ASSERT_TRUE(first.ok()) << first.status();
  options.first_request_id = SweepFirstRequestId(1);
  node.counters = NodeStats{};  // the next point connects a new client: its counters start at its connect
  auto second = RunPrefixWorkload(&node, &clock, options, w, 4, 8);
  ASSERT_TRUE(second.ok()) << second.status();
  const PrefixWorkloadFigures a = MakePrefixWorkloadFigures(w, *first), b = MakePrefixWorkloadFigures(w, *second);
  EXPECT_EQ(a.preparation_blocks_computed, 12);  // 3 prefixes x 4 blocks
  EXPECT_EQ(a.preparation_blocks_imported, 0);
  EXPECT_EQ(b.preparation_blocks_computed, 0);   // the node's cache: nothing computed again
  EXPECT_EQ(b.preparation_blocks_imported, 12);
  EXPECT_EQ(a.sessions, 4);  // max(3, 2 x 2)
  EXPECT_EQ(b.sessions, 8);  // 2 x 4
  EXPECT_EQ(second->measured.stats.prefix_blocks_imported, 32);  // 8 sessions x 4 blocks, the window's only
  EXPECT_EQ(second->measured.stats.prefix_blocks_computed, 0);
  // Ids: point 0 from 1 (3 + 4 requests), point 1 from 1 + 2^32 (3 + 8): 18 distinct ids.
  ASSERT_EQ(node.submits.size(), 18u);
  std::set<RequestId> ids;
  for (const SubmitRequest& r : node.submits) ids.insert(r.request);
  EXPECT_EQ(ids.size(), 18u);
  EXPECT_EQ(node.submits[7].request, SweepFirstRequestId(1));
  // Windows on the clock: point 0's preparation 100 ms from 1000, its sessions 2 rounds of 100 ms; point 1's
  // preparation 100 ms, its sessions 2 rounds.
  EXPECT_DOUBLE_EQ(a.window_begin_ms, 1100);
  EXPECT_DOUBLE_EQ(a.window_end_ms, 1300);
  EXPECT_DOUBLE_EQ(b.window_begin_ms, 1400);
  EXPECT_DOUBLE_EQ(b.window_end_ms, 1600);
}

TEST(PrefixWorkloadTest, RunsPreparationThenClosedLoopAndReportsTheWindowOnly) {
  FakeClock clock;
  FakeNode node(&clock, 100);
  const DriverOptions options = QuietOptions(1);
  const PrefixWorkload w = Workload();
  auto run = RunPrefixWorkload(&node, &clock, options, w, /*concurrency=*/4, /*preparation_concurrency=*/8);
  ASSERT_TRUE(run.ok()) << run.status();
  // Preparation: 3 requests at once (min(N, 8)), each 100 ms: one round of 100 ms.
  ASSERT_EQ(node.submits.size(), 13u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(node.submits[i].request, 1 + i);
  EXPECT_DOUBLE_EQ(run->preparation_ms, 100);
  EXPECT_EQ(run->preparation.stats.prefix_blocks_computed, 12);  // 3 prefixes x 4 blocks, once each
  // Sessions: ids 4..13, closed loop at 4: 10 sessions in rounds of 4, 4, 2 -> 300 ms.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(node.submits[3 + i].request, 4 + i);
    EXPECT_EQ(node.submits[3 + i].prompt.trace_index, 3 + i);
    EXPECT_EQ(node.submits[3 + i].max_new_tokens, 5);
  }
  EXPECT_EQ(node.max_in_flight, 4);
  EXPECT_DOUBLE_EQ(run->measured.elapsed_ms, 300);
  EXPECT_EQ(run->measured.stats.prefix_blocks_computed, 0);  // the preparation's 12 subtracted
  EXPECT_EQ(run->measured.stats.prefix_blocks_imported, 40);  // 10 sessions x 4 blocks
  const PrefixWorkloadFigures f = MakePrefixWorkloadFigures(w, *run);
  EXPECT_EQ(f.sessions, 10);
  EXPECT_EQ(f.concurrency, 4);
  EXPECT_EQ(f.in_flight_max, 4);
  EXPECT_DOUBLE_EQ(f.in_flight_mean, 10 * 100.0 / 300);  // Little's law over the window
  EXPECT_DOUBLE_EQ(f.preparation_s, 0.1);
  EXPECT_EQ(f.preparation_blocks_computed, 12);
  EXPECT_EQ(f.preparation_blocks_imported, 0);
  EXPECT_EQ(f.block_tokens, 64);
}

TEST(PrefixWorkloadTest, SessionsAdmittedAreTheWindowsNotThePreparations) {
  // Issue 27 review D1: the preparation runs min(N, slots) = 3 requests at once; at C = 1 the window admits 1 session
  // at a time. The node's peak since the client connected is 3: the window's figure must be 1.
  FakeClock clock;
  FakeNode node(&clock, 100);
  const DriverOptions options = QuietOptions(1);
  auto run = RunPrefixWorkload(&node, &clock, options, Workload(), /*concurrency=*/1, /*preparation_concurrency=*/4);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->preparation.stats.sessions_admitted_max, 3);  // the preparation's own peak, reported apart
  EXPECT_EQ(node.peak_restarts, 1);
  EXPECT_EQ(run->measured.stats.sessions_admitted_max, 1);
  EXPECT_EQ(MakePrefixWorkloadFigures(Workload(), *run).in_flight_max, 1);
}

TEST(PrefixWorkloadTest, RefusesBadSettings) {
  PrefixWorkload w = Workload();
  EXPECT_TRUE(ValidatePrefixWorkload(w).ok());
  w.prefix_tokens = 100;  // not a multiple of 64
  EXPECT_THAT(std::string(ValidatePrefixWorkload(w).message()), HasSubstr("--prefix-tokens"));
  w = Workload();
  w.suffix_tokens = 0;
  EXPECT_THAT(std::string(ValidatePrefixWorkload(w).message()), HasSubstr("--suffix-tokens"));
  PrefixWorkload off;
  EXPECT_TRUE(ValidatePrefixWorkload(off).ok());
  off.sessions = 5;  // would be ignored without --prefixes
  EXPECT_THAT(std::string(ValidatePrefixWorkload(off).message()), HasSubstr("--prefixes"));
  off = PrefixWorkload{};
  off.sessions_per_c = 2;
  EXPECT_THAT(std::string(ValidatePrefixWorkload(off).message()), HasSubstr("--sessions-per-c"));
  w = Workload();
  w.sessions_per_c = 0;
  EXPECT_EQ(std::string(ValidatePrefixWorkload(w).message()), "--sessions-per-c must be >= 1");
  FakeClock clock;
  FakeNode node(&clock, 1);
  EXPECT_FALSE(RunPrefixWorkload(&node, &clock, DriverOptions{}, Workload(), 0, 1).ok());
}

TEST(PrefixWorkloadTest, WorkerArgsSizeTheRowCacheForEveryPrefix) {
  PrefixWorkload w = Workload();
  // 3 x 256 tokens x 100 bytes = 76,800; x 1.125 = 86,400; + 1 MiB.
  EXPECT_EQ(PrefixWorkloadWorkerArgs(w, 100.0),
            (std::vector<std::string>{"--prefix-cache-bytes", std::to_string(86400 + (1 << 20)), "--memd-timeout-ms",
                                      "40000"}));
  w.prefix_cache_bytes = 5000;
  EXPECT_EQ(PrefixWorkloadWorkerArgs(w, 100.0),
            (std::vector<std::string>{"--prefix-cache-bytes", "5000", "--memd-timeout-ms", "40000"}));
  EXPECT_TRUE(PrefixWorkloadWorkerArgs(PrefixWorkload{}, 100.0).empty());
  // memd fences a silent worker only after 60 s (its timeout must exceed the worker's, brief: EffectiveMemdTimeout)
  EXPECT_EQ(PrefixWorkloadMemdArgs(w), (std::vector<std::string>{"--worker-timeout-ms", "60000"}));
  EXPECT_TRUE(PrefixWorkloadMemdArgs(PrefixWorkload{}).empty());
}

}  // namespace
}  // namespace dhs::replay
