// tests/workerd/worker_speculation_test.cc: speculative decoding in the Worker (brief §6, §7; issue 13) with the
// synthetic proposer: greedy speculative output equals plain greedy decoding bit for bit (tokens and per-token logits
// digests, against the model alone) in resident, hisparse and adaptive modes while a fake memd forces reclaims and
// repopulations; every host page written holds the oracle's rows (a rejected row never reaches the host); rounds
// commit A_r + 1 tokens; the drafter modes and blocks the KV cannot serve are refused at start.
#include <unistd.h>

#include <algorithm>
#include <boost/math/distributions/chi_squared.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/workerd/worker_test_util.h"
#include "workerd/device/cpu_device.h"
#include "workerd/speculation/drafter_distill.h"
#include "workerd/speculation/drafter_model.h"

namespace dhs::test {
namespace {

struct Spec {
  RequestId id;
  std::vector<uint8_t> prompt;
  uint32_t max_new;
  float temperature = 0;
  int submit_at = 0;
};

std::vector<Spec> Requests(int k) {
  return {{1, Prompt(5, 1), 17},  {2, Prompt(static_cast<size_t>(k), 2), 21, 0, 0}, {3, Prompt(37, 3), 25, 0, 2},
          {4, Prompt(64, 4), 19, 0, 5}, {5, Prompt(83, 5), 14, 0.8f, 9}, {6, Prompt(48, 2), 23, 0, 30}};
}

// The oracle's rows of every position of input + tokens[0 .. max_new-2] (what the worker commits), and its index keys.
struct OracleRows {
  std::unique_ptr<model::ResidentKvAccess> kv;
  std::optional<model::ModelSession> session;
};

OracleRows RowsOf(const model::Model& m, const std::vector<model::Token>& input, const Generated& g) {
  OracleRows o{model::ResidentKvAccess::ForModel(m.config(), size_t{64} << 20, 16), m.NewSession(1)};
  std::vector<model::Token> all = input;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end() - 1);
  EXPECT_TRUE(m.ImportPrefix(*o.session, all, *o.kv).ok());
  return o;
}

// Every host page of `request` with a completed backup holds the oracle's payload rows and index keys.
void ExpectHostPagesExact(Worker& w, RequestId request, const std::vector<uint8_t>& host, const model::Model& m,
                          OracleRows& oracle, int& pages_checked) {
  HierarchicalKvAccess* h = w.hierarchical();
  const RequestKv* kv = h == nullptr ? nullptr : h->Find(request);
  if (kv == nullptr) return;
  const KvLayout& l = h->layout();
  const uint32_t p = l.config().page_rows;
  for (uint32_t page = 0; page < kv->pages.size(); ++page) {
    const KvPage& pg = kv->pages[page];
    if (!pg.HostReady()) continue;
    const uint8_t* base = host.data() + pg.host_page * l.host_page_bytes();
    for (uint32_t r = 0; r < p; ++r) {
      const Position t = Position{page} * p + r;
      std::vector<Position> sel = {t};
      for (SourceId s = 0; s < l.num_sources(); ++s) {
        std::vector<const uint8_t*> out(1);
        KvQuery q{1, sel, out};
        ASSERT_TRUE(oracle.kv->Fetch(std::vector<SourceId>{s}, {&q, 1}).ok()) << "t " << t;
        ASSERT_EQ(0, std::memcmp(base + l.InPage(s, r), out[0], l.row_bytes(s)))
            << "request " << request << " page " << page << " position " << t << " source " << s;
      }
      for (int i = 0; i < m.config().n_indexers(); ++i) {
        const float* want = oracle.session->index_keys(i).data() + t * m.config().idx_dim;
        ASSERT_EQ(0, std::memcmp(base + l.KeyInPage(static_cast<uint32_t>(i), r), want,
                                 static_cast<size_t>(m.config().idx_dim) * sizeof(float)))
            << "index key of position " << t;
      }
    }
    ++pages_checked;
  }
}

struct RunResult {
  RecordingSink sink;
  int reclaims = 0, populated = 0, host_pages_checked = 0;
  WorkerStats stats;
  uint64_t draft_ring_bytes = 0;  // the worker's WorkerStatsReply
  uint64_t staging_bytes = 0;     // the worker's WorkerStatsReply
  StagingCensus staging;          // what the staging path did (hierarchical modes)
  uint32_t arenas = 0, free_arenas = 0;  // χ, and the arenas free after the run
  size_t host_pages_held = 0, gpu_pages_free = 0, kv_requests_left = 0;  // after the run
};

WorkerConfig SpecConfig(const model::Model& m, WorkerMode mode, double corruption) {
  WorkerConfig c;
  c.mode = mode;
  c.page_rows = 16;
  c.tail_rows = 32;
  c.slots = 4;
  c.hot_rows = static_cast<uint32_t>(4 * (m.config().top_k + m.config().local_window));  // max_block 4
  c.speculation.mode = spec::SpeculateMode::kSynthetic;
  c.speculation.block = 4;
  c.speculation.corruption = corruption;
  return c;
}

// Rounds a greedy request of max_new tokens takes when every proposal is accepted (all) or none is: its first token
// comes from prefill, then rounds of K_r = min(4, tokens left) while K_r >= 2 (one token left: a plain step).
uint64_t ExpectedRounds(uint32_t max_new, bool all) {
  uint64_t rounds = 0;
  for (int64_t left = max_new - 1; left > 0;) {
    const int64_t k = std::min<int64_t>(4, left);
    if (k >= 2) ++rounds;
    left -= k >= 2 && all ? k : 1;
  }
  return rounds;
}

// `async_seed` != 0: the CPU device's asynchronous mode (issue 28) seeded with it; a read hazard fails the test and a
// wait that cannot end fails within 10 s naming what it waits for.
void Serve(const model::Model& m, WorkerConfig c, uint64_t seed, uint32_t budget_pages,
           std::map<RequestId, OracleRows>& oracle, const std::vector<Spec>& specs, RunResult& res,
           uint64_t async_seed = 0) {
  auto g = ComputeGeometry(m.config(), c);
  ASSERT_TRUE(g.ok()) << g.status();
  const bool resident = c.mode == WorkerMode::kResident;
  c.hbm_budget_bytes = resident ? uint64_t{64} << 20 : budget_pages * g->page_bytes;
  AsyncDeviceConfig async;
  async.enabled = async_seed != 0;
  async.seed = async_seed;
  CpuDevice device(async);
  FakeMemd memd(resident ? 4096 : budget_pages, g->host_page_bytes, c.page_rows, 512, seed, !resident, c.slots);
  auto w = Worker::Create(&m, &device, c, &memd, &res.sink);
  ASSERT_TRUE(w.ok()) << w.status();
  for (int it = 0; it < 20000; ++it) {
    for (const Spec& s : specs) {
      if (s.submit_at != it) continue;
      wire::SubmitRequestT sub;
      sub.request = s.id;
      sub.prompt = s.prompt;
      sub.max_new_tokens = s.max_new;
      sub.temperature = s.temperature;
      sub.seed = 5;
      ASSERT_TRUE((*w)->Submit(sub, ClientRef{"c", s.id}).ok());
    }
    memd.Pump(**w);
    auto more = (*w)->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
    ASSERT_TRUE(device.ReadHazards().ok()) << device.ReadHazards() << " (iteration " << it << ")";
    for (const Spec& s : specs) {
      ExpectSafe(**w, s.id);
      if (s.temperature == 0) ExpectHostPagesExact(**w, s.id, memd.host, m, oracle.at(s.id), res.host_pages_checked);
    }
    if (::testing::Test::HasFatalFailure()) return;
    if (res.sink.finished.size() == specs.size()) break;
  }
  ASSERT_EQ(res.sink.finished.size(), specs.size()) << "not every request finished";
  res.reclaims = memd.reclaims_done;
  res.populated = memd.pages_populated;
  res.stats = (*w)->stats();
  res.draft_ring_bytes = (*w)->StatsReply().draft_ring_bytes;
  res.staging_bytes = (*w)->StatsReply().staging_bytes;
  if (HierarchicalKvAccess* h = (*w)->hierarchical(); h != nullptr) {
    res.staging = h->staging_census();
    if (const spec::StagingArenaPool* pool = h->staging_pool(); pool != nullptr) {
      res.arenas = pool->arenas();
      res.free_arenas = pool->free_arenas();
    }
    for (const Spec& s : specs) res.kv_requests_left += h->Find(s.id) != nullptr;
  }
  EXPECT_EQ(memd.completes, static_cast<int>(specs.size()));
  res.host_pages_held = memd.host_pages_held();
  res.gpu_pages_free = memd.gpu_pages_free();
}

// The model alone's output of every request (`want`), and, for the greedy ones, its rows and keys (`oracle`).
void ComputeOracle(const model::Model& m, const std::vector<Spec>& specs, std::map<RequestId, Generated>& want,
                   std::map<RequestId, OracleRows>& oracle) {
  for (const Spec& s : specs) {
    const std::vector<model::Token> input(s.prompt.begin(), s.prompt.end());
    want[s.id] = Oracle(m, input, s.max_new, s.temperature, 1.0f, 5, s.id);
    if (s.temperature == 0) oracle.emplace(s.id, RowsOf(m, input, want[s.id]));
  }
}

class GreedyRounds : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyRounds, MatchPlainDecodingInEveryModeUnderReclaims) {
  auto m = MakePresetModel(GetParam());
  const std::vector<Spec> specs = Requests(m->config().top_k);
  std::map<RequestId, Generated> want;
  std::map<RequestId, OracleRows> oracle;
  ComputeOracle(*m, specs, want, oracle);
  int reclaims = 0, populated = 0, pages_checked = 0;
  for (double corruption : {0.0, 0.4, 1.0}) {
    // The sampled request 5 joins the mixed run only: at 0 and 1 every round's acceptance is known exactly.
    std::vector<Spec> run;
    for (const Spec& s : specs) {
      if (s.temperature == 0 || corruption == 0.4) run.push_back(s);
    }
    uint64_t want_rounds = 0;
    for (const Spec& s : run) want_rounds += ExpectedRounds(s.max_new, corruption == 0.0);
    for (WorkerMode mode : {WorkerMode::kResident, WorkerMode::kHisparse, WorkerMode::kAdaptive}) {
      for (uint64_t seed : {1ull, 2ull}) {
        if (mode != WorkerMode::kAdaptive && seed > 1) continue;
        SCOPED_TRACE(std::string(WorkerModeName(mode)) + " corruption " + std::to_string(corruption) + " seed " +
                     std::to_string(seed));
        RunResult res;
        Serve(*m, SpecConfig(*m, mode, corruption), seed, /*budget_pages=*/24, oracle, run, res);
        if (HasFatalFailure()) return;
        EXPECT_TRUE(res.sink.errors.empty()) << res.sink.errors.begin()->second;
        for (const Spec& s : run) {
          EXPECT_EQ(res.sink.out[s.id].tokens.size(), s.max_new) << "request " << s.id;
          if (s.temperature != 0) continue;  // sampled: same distribution, other draws (see the sampling test)
          EXPECT_EQ(res.sink.out[s.id].tokens, want[s.id].tokens) << "request " << s.id;
          EXPECT_EQ(res.sink.out[s.id].digests, want[s.id].digests) << "request " << s.id;
        }
        const WorkerStats& st = res.stats;
        // Each round commits A_r + 1 tokens; greedy acceptance of the target's own continuation accepts every
        // uncorrupted proposal up to the first corrupted one.
        EXPECT_GT(st.spec_rounds, 0u);
        EXPECT_EQ(st.spec_round_tokens, st.spec_accepted + st.spec_rounds);
        uint64_t max_new = 0;
        for (const Spec& s : run) max_new += s.max_new;
        EXPECT_EQ(st.tokens_generated, max_new);
        if (corruption == 0.0) {
          EXPECT_EQ(st.spec_accepted, st.spec_proposed);
          EXPECT_EQ(st.spec_rounds, want_rounds);
        }
        if (corruption == 1.0) {  // K_r >= 2 with the draft always rejected, many rounds
          EXPECT_EQ(st.spec_accepted, 0u);
          EXPECT_EQ(st.spec_rounds, want_rounds);
        }
        uint64_t widths = 0;
        for (uint64_t n : st.spec_width_rounds) widths += n;
        EXPECT_EQ(widths, st.spec_rounds);
        std::printf("%s corruption %.1f seed %llu: rounds %llu, acceptance length %.2f, reclaims %d, populated %d, "
                    "host pages checked %d\n",
                    std::string(WorkerModeName(mode)).c_str(), corruption, static_cast<unsigned long long>(seed),
                    static_cast<unsigned long long>(st.spec_rounds),
                    static_cast<double>(st.spec_round_tokens) / static_cast<double>(st.spec_rounds), res.reclaims,
                    res.populated, res.host_pages_checked);
        reclaims += res.reclaims;
        populated += res.populated;
        pages_checked += res.host_pages_checked;
      }
    }
  }
  EXPECT_GT(reclaims, 0);
  EXPECT_GT(populated, 0);
  EXPECT_GT(pages_checked, 0);
}

// A worker of one slot with greedy speculation (SpecConfig, adaptive mode, 64 optional pages) against a fake memd of
// 64 GPU pages and 512 host pages (Start builds it).
struct OneSlotSpeculation {
  std::unique_ptr<model::Model> m = MakePresetModel("dsv4flash-like");
  CpuDevice device;
  std::unique_ptr<FakeMemd> memd;
  RecordingSink sink;
  std::unique_ptr<Worker> worker;
  void Start() {
    WorkerConfig c = SpecConfig(*m, WorkerMode::kAdaptive, 0.0);
    c.slots = 1;
    auto g = ComputeGeometry(m->config(), c);
    ASSERT_TRUE(g.ok()) << g.status();
    c.hbm_budget_bytes = 64 * g->page_bytes;
    memd = std::make_unique<FakeMemd>(64, g->host_page_bytes, c.page_rows, 512, 1, false, c.slots);
    auto w = Worker::Create(m.get(), &device, c, memd.get(), &sink);
    ASSERT_TRUE(w.ok()) << w.status();
    worker = *std::move(w);
  }
};

// Cancel (issue 22) mid-speculation: a request cancelled after speculative rounds ends with CANCELLED, its KV (staging
// arenas included) and its proposer slot are released and memd gets its Complete. With one slot, the next request
// gets that proposer slot again (its rounds happen) and its output equals the model alone's.
TEST(WorkerSpeculation, CancelMidSpeculationReleasesTheProposerSlotAndTheKv) {
  OneSlotSpeculation one;
  ASSERT_NO_FATAL_FAILURE(one.Start());
  const model::Model* m = one.m.get();
  FakeMemd& memd = *one.memd;
  RecordingSink& sink = one.sink;
  Worker& worker = *one.worker;
  auto submit = [&](RequestId id, uint32_t max_new) {
    wire::SubmitRequestT sub;
    sub.request = id;
    sub.prompt = Prompt(30, static_cast<uint32_t>(id));
    sub.max_new_tokens = max_new;
    ASSERT_TRUE(worker.Submit(sub, ClientRef{"c", id}).ok());
  };
  submit(1, 60);
  for (int it = 0; it < 500 && worker.stats().spec_rounds < 2; ++it) {
    memd.Pump(worker);
    ASSERT_TRUE(worker.Iterate().ok());
  }
  ASSERT_GE(worker.stats().spec_rounds, 2u);
  ASSERT_LT(sink.out[1].tokens.size(), 60u);
  const RequestId node = memd.admitted_ids.at(0);
  ASSERT_NE(worker.hierarchical()->Find(node), nullptr);
  ASSERT_TRUE(worker.Cancel(1, 0, ClientRef{"c", 2}, "mid round").ok());
  EXPECT_EQ(sink.errors[1], "cancelled: mid round");
  EXPECT_EQ(sink.chunks.back().end_reason, wire::EndReason::CANCELLED);
  EXPECT_EQ(memd.completes, 1);
  EXPECT_EQ(worker.hierarchical()->Find(node), nullptr) << "its KV was not released";
  if (const spec::StagingArenaPool* pool = worker.hierarchical()->staging_pool(); pool != nullptr) {
    EXPECT_EQ(pool->free_arenas(), pool->arenas()) << "a staging arena is still held";
  }
  const uint64_t rounds = worker.stats().spec_rounds;
  submit(2, 17);
  for (int it = 0; it < 2000 && !sink.finished.contains(2); ++it) {
    memd.Pump(worker);
    ASSERT_TRUE(worker.Iterate().ok());
  }
  ASSERT_TRUE(sink.finished.contains(2));
  EXPECT_GT(worker.stats().spec_rounds, rounds) << "the proposer slot of the cancelled request was not released";
  const std::vector<uint8_t> prompt = Prompt(30, 2);
  const Generated want = Oracle(*m, {prompt.begin(), prompt.end()}, 17);
  EXPECT_EQ(sink.out[2].tokens, want.tokens);
  EXPECT_EQ(sink.out[2].digests, want.digests);
  EXPECT_EQ(memd.completes, 2);
}

// A refused report (memd restarted and took the re-Hello without request 1) mid-speculation: request 1 ends here like
// after a fence and is resumed from the worker's own record. With one slot, the resume gets the proposer slot again
// (its rounds happen) and, re-attached, its stream equals the model alone's. Review finding: the refused request kept
// its proposer slot for good (the resume, and every later request, decoded without speculation).
TEST(WorkerSpeculation, ARefusedReportReleasesTheProposerSlot) {
  OneSlotSpeculation one;
  ASSERT_NO_FATAL_FAILURE(one.Start());
  const model::Model* m = one.m.get();
  FakeMemd& memd = *one.memd;
  RecordingSink& sink = one.sink;
  Worker& worker = *one.worker;
  wire::SubmitRequestT sub;
  sub.request = 1;
  sub.prompt = Prompt(30, 1);
  sub.max_new_tokens = 40;
  ASSERT_TRUE(worker.Submit(sub, ClientRef{"c", 1}).ok());
  for (int it = 0; it < 500 && worker.stats().spec_rounds < 2; ++it) {
    memd.Pump(worker);
    ASSERT_TRUE(worker.Iterate().ok());
  }
  ASSERT_GE(worker.stats().spec_rounds, 2u);
  const size_t had = sink.out[1].tokens.size();
  ASSERT_LT(had, 40u);
  const RequestId node = memd.admitted_ids.at(0);
  worker.memd_away().Enter();
  wire::CompleteT gone;  // the new memd holds nothing of request 1: the fake forgets it (its slot free)
  gone.request = node;
  ASSERT_TRUE(memd.SendComplete(gone).ok());
  wire::HelloReplyT reply;
  reply.accepted = true;
  reply.worker_epoch = 1;
  reply.refused_reports = {node};
  reply.refused_reasons = {"slot 0 out of range or taken"};
  ASSERT_TRUE(worker.memd_away().Return(reply).ok());
  ASSERT_EQ(memd.admitted_ids.size(), 2u) << "the refused request was not resumed";
  const uint64_t rounds = worker.stats().spec_rounds;
  ASSERT_TRUE(worker.Attach(1, static_cast<uint32_t>(had), ClientRef{"c2", 1}).ok());
  for (int it = 0; it < 2000 && worker.book().active() + worker.book().not_active() > 0; ++it) {
    memd.Pump(worker);
    ASSERT_TRUE(worker.Iterate().ok());
  }
  EXPECT_GT(worker.stats().spec_rounds, rounds) << "the refused request's proposer slot was not released";
  const std::vector<uint8_t> prompt = Prompt(30, 1);
  const Generated want = Oracle(*m, {prompt.begin(), prompt.end()}, 40);
  EXPECT_EQ(sink.out[1].tokens, want.tokens) << "the stream before the refusal, then after the attach";
  EXPECT_EQ(sink.out[1].digests, want.digests);
}

// --block-schedule online (spec::OnlineBlockWidth): the width changes from step to step with the measured acceptance
// and step times; outputs stay those of the model alone, every round's width is within [2, --block], and the rounds
// add up. (The choice itself is tested with made-up figures in tests/speculation/online_block_width_test.cc.)
TEST(WorkerSpeculation, OnlineBlockWidthKeepsGreedyOutputsExact) {
  auto m = MakePresetModel("dsv4flash-like");
  const std::vector<Spec> specs = Requests(m->config().top_k);
  std::map<RequestId, Generated> want;
  std::map<RequestId, OracleRows> oracle;
  ComputeOracle(*m, specs, want, oracle);
  std::vector<Spec> run;
  for (const Spec& s : specs) {
    if (s.temperature == 0) run.push_back(s);
  }
  for (WorkerMode mode : {WorkerMode::kHisparse, WorkerMode::kAdaptive}) {
    SCOPED_TRACE(std::string(WorkerModeName(mode)));
    WorkerConfig c = SpecConfig(*m, mode, 0.4);
    c.speculation.schedule = std::string(spec::kOnlineSchedule);
    RunResult res;
    Serve(*m, c, /*seed=*/3, /*budget_pages=*/24, oracle, run, res);
    if (HasFatalFailure()) return;
    EXPECT_TRUE(res.sink.errors.empty()) << res.sink.errors.begin()->second;
    for (const Spec& s : run) {
      EXPECT_EQ(res.sink.out[s.id].tokens, want[s.id].tokens) << "request " << s.id;
      EXPECT_EQ(res.sink.out[s.id].digests, want[s.id].digests) << "request " << s.id;
    }
    const WorkerStats& st = res.stats;
    EXPECT_GT(st.spec_rounds, 0u);
    EXPECT_EQ(st.spec_round_tokens, st.spec_accepted + st.spec_rounds);
    uint64_t widths = 0;
    for (size_t w = 0; w < st.spec_width_rounds.size(); ++w) {
      if (st.spec_width_rounds[w] == 0) continue;
      EXPECT_GE(w, 2u);
      EXPECT_LE(static_cast<int64_t>(w), c.speculation.block);
      widths += st.spec_width_rounds[w];
    }
    EXPECT_EQ(widths, st.spec_rounds);
    std::string hist;
    for (size_t w = 2; w < st.spec_width_rounds.size(); ++w) absl::StrAppend(&hist, " K=", w, ":", st.spec_width_rounds[w]);
    std::printf("%s online: rounds %llu, acceptance length %.2f, widths%s\n", std::string(WorkerModeName(mode)).c_str(),
                static_cast<unsigned long long>(st.spec_rounds),
                static_cast<double>(st.spec_round_tokens) / static_cast<double>(st.spec_rounds), hist.c_str());
  }
}

// Staging arenas (brief §6 "Staging"): with B = k + w hot rows a round of K_r = 4 or 8 queries selects a union far
// larger than the hot cache; its rows beyond the hot cache are copied once each into a staging arena (χ = 4, the
// default). Greedy speculative output equals the model alone's plain greedy decoding bit for bit (tokens and logits
// digests) in hisparse and adaptive modes under the fake memd's reclaims and repopulations, with random acceptance
// (corruption 0.4) and full acceptance (the widest rounds). After every request ran to completion, every staging
// arena is free, the KV store holds no request, and every host and GPU page is back with memd. The worker reports
// staging_bytes = χ * N * K_max * k * d_KV, computed here from the config.
class StagingRounds : public ::testing::TestWithParam<std::string> {};

TEST_P(StagingRounds, AUnionLargerThanBIsServedThroughStagingAndMatchesTheReference) {
  auto m = MakePresetModel(GetParam());
  const model::ModelConfig& mc = m->config();
  std::vector<Spec> specs;
  for (const Spec& s : Requests(mc.top_k)) {
    if (s.temperature == 0) specs.push_back(s);  // greedy: exact against the model alone
  }
  std::map<RequestId, Generated> want;
  std::map<RequestId, OracleRows> oracle;
  ComputeOracle(*m, specs, want, oracle);
  const uint32_t budget_pages = 24;
  uint64_t staged_total = 0;
  int reclaims = 0;
  for (int64_t block : {4, 8}) {
    for (double corruption : {0.0, 0.4}) {
      for (WorkerMode mode : {WorkerMode::kHisparse, WorkerMode::kAdaptive}) {
        // Seed 3: seed 1's memd orders on the asynchronous device (issue 28), adaptive with corruption only.
        for (uint64_t seed : {1ull, 2ull, 3ull}) {
          if (mode != WorkerMode::kAdaptive && seed > 1) continue;
          if (seed == 3 && corruption == 0.0) continue;
          SCOPED_TRACE(std::string(WorkerModeName(mode)) + " K_max " + std::to_string(block) + " corruption " +
                       std::to_string(corruption) + " seed " + std::to_string(seed));
          WorkerConfig c = SpecConfig(*m, mode, corruption);
          c.hot_rows = static_cast<uint32_t>(mc.top_k + mc.local_window);  // B = k + w: one query's selections
          c.speculation.block = block;
          auto g = ComputeGeometry(mc, c);
          ASSERT_TRUE(g.ok()) << g.status();
          EXPECT_EQ(g->max_block, static_cast<uint32_t>(block));  // min(K_max, T - p + 1 = 17): no B / (k + w) cap
          RunResult res;
          Serve(*m, c, seed == 3 ? 1 : seed, budget_pages, oracle, specs, res, seed == 3 ? 17 : 0);
          if (HasFatalFailure()) return;
          EXPECT_TRUE(res.sink.errors.empty()) << res.sink.errors.begin()->second;
          for (const Spec& s : specs) {
            EXPECT_EQ(res.sink.out[s.id].tokens, want[s.id].tokens) << "request " << s.id;
            EXPECT_EQ(res.sink.out[s.id].digests, want[s.id].digests) << "request " << s.id;
          }
          const WorkerStats& st = res.stats;
          EXPECT_GT(st.spec_rounds, 0u);
          if (corruption == 0.0) {  // every proposal accepted: rounds as wide as the tokens left allow
            EXPECT_EQ(st.spec_accepted, st.spec_proposed);
            ASSERT_GT(st.spec_width_rounds.size(), static_cast<size_t>(block));
            EXPECT_GT(st.spec_width_rounds[static_cast<size_t>(block)], 0u) << "no round of width K_max";
          }
          EXPECT_EQ(res.staging_bytes,
                    uint64_t{4} * c.slots * static_cast<uint64_t>(block) * static_cast<uint64_t>(mc.top_k) *
                        mc.row_bytes());
          EXPECT_EQ(res.arenas, 4u);
          EXPECT_EQ(res.free_arenas, 4u) << "a staging arena is still held after every request finished";
          EXPECT_EQ(res.kv_requests_left, 0u);
          EXPECT_EQ(res.host_pages_held, 0u);
          EXPECT_EQ(res.gpu_pages_free, budget_pages);
          EXPECT_GT(res.staging.unions, 0u);
          std::printf("%s K_max %lld corruption %.1f seed %llu: rounds %llu, acceptance length %.2f, unions %llu, "
                      "staged rows %llu in %llu fetches, reclaims %d, populated %d\n",
                      std::string(WorkerModeName(mode)).c_str(), static_cast<long long>(block), corruption,
                      static_cast<unsigned long long>(seed), static_cast<unsigned long long>(st.spec_rounds),
                      static_cast<double>(st.spec_round_tokens) / static_cast<double>(st.spec_rounds),
                      static_cast<unsigned long long>(res.staging.unions),
                      static_cast<unsigned long long>(res.staging.rows),
                      static_cast<unsigned long long>(res.staging.staged_fetches), res.reclaims, res.populated);
          staged_total += res.staging.rows;
          reclaims += res.reclaims;
        }
      }
    }
  }
  EXPECT_GT(staged_total, 0u) << "no row went through a staging arena";
  EXPECT_GT(reclaims, 0);
}

INSTANTIATE_TEST_SUITE_P(Presets, StagingRounds, ::testing::Values("dsv4flash-like", "glm5-like"));

// Sampling mode (brief §6 acceptance): N = 1200 requests with one prompt, temperature 0.3, each with its own keyed
// draws (client ids 1..N). Token 0 comes from prefill, token 1 from a K = 2 round whose proposal (the greedy
// continuation, corrupted with probability 0.2) is accepted with min(1, p/q) or corrected from norm(max(0, p - q)).
// Given t0, t1 must follow the target's own p(t1 | t0), computed independently with the model alone: Pearson
// chi-square per t0 (cells with expected count < 5 pooled), summed, at significance 0.001, critical value from
// Boost.Math's quantile.
// dsv4flash-like: sources shared by Reuse / Reindex layers; glm5-like: index producers whose followers' rows come in
// one Fetch over several sources.
INSTANTIATE_TEST_SUITE_P(Presets, GreedyRounds, ::testing::Values("dsv4flash-like", "glm5-like"));

TEST(WorkerSpeculation, SampledRoundsEmitTheTargetsOwnDistribution) {
  constexpr int kRequests = 1200;
  constexpr float kTemperature = 0.3f;
  auto m = MakePresetModel("dsv4flash-like");
  const std::vector<uint8_t> prompt = Prompt(12, 4);
  const model::SamplingParams params{kTemperature, 1.0f};
  // p(t0) and p(t1 | t0) with the model alone.
  auto kv = model::ResidentKvAccess::ForModel(m->config(), size_t{64} << 20, 16);
  std::vector<double> p0;
  std::vector<std::vector<double>> p1(model::kVocab);
  {
    model::ModelSession s = m->NewSession(1);
    std::vector<model::Token> in(prompt.begin(), prompt.end());
    model::StepInput step{&s, in};
    model::StepOutput out;
    ASSERT_TRUE(m->Step(std::span<model::StepInput>(&step, 1), *kv, std::span<model::StepOutput>(&out, 1)).ok());
    p0 = model::SamplingDistribution(std::span<const float>(out.logits).last(model::kVocab), params);
    kv->Release(1);
  }
  for (int t0 = 0; t0 < model::kVocab; ++t0) {
    if (p0[static_cast<size_t>(t0)] * kRequests < 1e-3) continue;  // never matters to any cell
    model::ModelSession s = m->NewSession(2);
    std::vector<model::Token> in(prompt.begin(), prompt.end());
    in.push_back(t0);
    model::StepInput step{&s, in};
    model::StepOutput out;
    ASSERT_TRUE(m->Step(std::span<model::StepInput>(&step, 1), *kv, std::span<model::StepOutput>(&out, 1)).ok());
    p1[static_cast<size_t>(t0)] = model::SamplingDistribution(std::span<const float>(out.logits).last(model::kVocab),
                                                              params);
    kv->Release(2);
  }
  // The worker, speculating with K = 2 rounds.
  WorkerConfig c = SpecConfig(*m, WorkerMode::kResident, 0.2);
  c.speculation.block = 2;
  c.submit_queue = kRequests;
  auto g = ComputeGeometry(m->config(), c);
  ASSERT_TRUE(g.ok()) << g.status();
  CpuDevice device;
  FakeMemd memd(4096, g->host_page_bytes, c.page_rows, 512, 1, false, c.slots);
  RecordingSink sink;
  auto w = Worker::Create(m.get(), &device, c, &memd, &sink);
  ASSERT_TRUE(w.ok()) << w.status();
  for (RequestId id = 1; id <= kRequests; ++id) {
    wire::SubmitRequestT sub;
    sub.request = id;
    sub.prompt = prompt;
    sub.max_new_tokens = 3;  // token 1 from the round (K = min(2, 3 - 1)); token 2 its bonus or a plain step
    sub.temperature = kTemperature;
    sub.seed = 11;
    ASSERT_TRUE((*w)->Submit(sub, ClientRef{"c", id}).ok());
  }
  for (int it = 0; it < 100000 && sink.finished.size() < kRequests; ++it) {
    memd.Pump(**w);
    ASSERT_TRUE((*w)->Iterate().ok());
  }
  ASSERT_EQ(sink.finished.size(), static_cast<size_t>(kRequests));
  EXPECT_EQ((*w)->stats().spec_rounds, static_cast<uint64_t>(kRequests));  // token 1 of every request
  // Given t0, the t1 of the requests that drew t0 are i.i.d. draws of p(t1 | t0) (t1's draws are independent of t0's):
  // one Pearson statistic per t0 drawn at least 20 times against p(. | t0), summed (independent groups: the degrees
  // of freedom add up).
  std::map<int, std::vector<int64_t>> by_t0;
  for (const auto& [id, out] : sink.out) {
    ASSERT_EQ(out.tokens.size(), 3u) << id;
    std::vector<int64_t>& c = by_t0[out.tokens[0]];
    c.resize(model::kVocab, 0);
    ++c[static_cast<size_t>(out.tokens[1])];
  }
  double stat = 0;
  int bins = 0, groups = 0;
  for (const auto& [t0, c] : by_t0) {
    ASSERT_FALSE(p1[static_cast<size_t>(t0)].empty()) << "t0 = " << t0 << " has probability ~0 but was drawn";
    int64_t n = 0;
    for (int64_t x : c) n += x;
    if (n < 20) continue;
    const std::vector<double>& p = p1[static_cast<size_t>(t0)];
    double pooled_e = 0;
    int64_t pooled_o = 0;
    int group_bins = 0;
    for (int t1 = 0; t1 < model::kVocab; ++t1) {
      const int64_t o = c[static_cast<size_t>(t1)];
      if (p[static_cast<size_t>(t1)] == 0.0) {
        EXPECT_EQ(o, 0) << "(" << t0 << ", " << t1 << ") has probability 0 but was emitted";
        continue;
      }
      const double e = p[static_cast<size_t>(t1)] * static_cast<double>(n);
      if (e < 5.0) {
        pooled_e += e;
        pooled_o += o;
        continue;
      }
      stat += (static_cast<double>(o) - e) * (static_cast<double>(o) - e) / e;
      ++group_bins;
    }
    if (pooled_e > 0) {
      stat += (static_cast<double>(pooled_o) - pooled_e) * (static_cast<double>(pooled_o) - pooled_e) / pooled_e;
      ++group_bins;
    }
    bins += group_bins - 1;
    ++groups;
  }
  ++bins;  // df = bins - 1 below = the sum of the groups' degrees of freedom
  const int df = bins - 1;
  ASSERT_GE(df, 3) << "too few cells to test";
  const double critical = boost::math::quantile(boost::math::complement(boost::math::chi_squared(df), 0.001));
  std::printf("t1 given t0 (%d groups of %d sampled requests): chi2 = %.2f, df = %d, critical(0.001) = %.2f; "
              "acceptance %llu of %llu proposals\n", groups, kRequests, stat, df, critical,
              static_cast<unsigned long long>((*w)->stats().spec_accepted),
              static_cast<unsigned long long>((*w)->stats().spec_proposed));
  EXPECT_LT(stat, critical);
}

TEST(WorkerSpeculation, DrafterModesAndOversizedBlocksAreRefusedAtStart) {
  auto m = MakePresetModel("dsv4flash-like");
  for (spec::SpeculateMode mode : {spec::SpeculateMode::kFixed, spec::SpeculateMode::kConfidence}) {
    WorkerConfig c = SpecConfig(*m, WorkerMode::kAdaptive, 0);
    c.speculation.mode = mode;
    auto g = ComputeGeometry(m->config(), c);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("--drafter-weights FILE"), std::string_view::npos) << g.status();
  }
  WorkerConfig c = SpecConfig(*m, WorkerMode::kHisparse, 0);
  c.staging_arenas = 0;     // without staging arenas a round must fit the hot cache
  c.speculation.block = 5;  // B / (k + w) = 4
  auto g = ComputeGeometry(m->config(), c);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("--block 5 outside [1, 4]"), std::string_view::npos) << g.status();
  c.staging_arenas = 4;  // with them only the tail limits a round: T - p + 1 = 32 - 16 + 1 = 17
  EXPECT_TRUE(ComputeGeometry(m->config(), c).ok());
  c.speculation.block = 17;
  EXPECT_TRUE(ComputeGeometry(m->config(), c).ok());
  c.speculation.block = 18;
  g = ComputeGeometry(m->config(), c);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("--block 18 outside [1, 17]"), std::string_view::npos) << g.status();
  c.speculation.block = 4;
  c.speculation.schedule = "1:4,3:2";
  EXPECT_TRUE(ComputeGeometry(m->config(), c).ok());
  c.speculation.schedule = "1:5";
  EXPECT_EQ(ComputeGeometry(m->config(), c).status().code(), absl::StatusCode::kInvalidArgument);
  c.speculation.schedule = std::string(spec::kOnlineSchedule);  // the online width, up to --block
  EXPECT_TRUE(ComputeGeometry(m->config(), c).ok());
}

// The drafter's weights for `target`, written under `dir`: DrafterConfig{} paired with target_d_model, its output
// layers distilled on the target's own texts when `distill` (so that rounds accept some proposals).
std::string WriteDrafter(const model::Model& target, int target_d_model, bool distill,
                         const std::filesystem::path& dir) {
  spec::DrafterConfig dc;
  dc.target_d_model = target_d_model;
  auto w = spec::GenerateDrafterWeights(dc, 1);
  EXPECT_TRUE(w.ok()) << w.status();
  const std::string path = (dir / (distill ? "drafter_distilled.safetensors" : "drafter.safetensors")).string();
  if (!distill) {
    EXPECT_TRUE(w->WriteFile(path).ok());
    return path;
  }
  auto random = spec::DrafterModel::FromSafetensors(*model::SafetensorsFile::Parse(w->Serialize()));
  auto texts = spec::SampleTargetTexts(target, 8, 128, 7);
  EXPECT_TRUE(random.ok() && texts.ok());
  auto fitted = spec::DistillOutputLayers(**random, target, *texts, {});
  EXPECT_TRUE(fitted.ok()) << fitted.status();
  EXPECT_TRUE((*fitted)->ToSafetensors().WriteFile(path).ok());
  return path;
}

std::filesystem::path FreshDir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("dhs_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The built-in drafter (--speculate fixed | confidence, --drafter-weights) in the worker: greedy output equals plain
// greedy decoding bit for bit (tokens and logits digests, against the model alone) in resident, hisparse and adaptive
// with forced reclaims; the drafter is fed the target's hidden states of the positions since its slot's last round
// (a wrong or missing one makes Propose fail, and no round happens). The sampled request 5 draws keyed proposals.
// The worker reports the draft ring: N * R_d * draft bytes per row, R_d = p * ceil((W + K_max + p - 1) / p).
class DrafterRounds : public ::testing::TestWithParam<std::string> {};

TEST_P(DrafterRounds, MatchPlainDecodingInEveryModeUnderReclaims) {
  auto m = MakePresetModel(GetParam());
  const std::filesystem::path dir = FreshDir("worker_drafter_" + GetParam());
  const std::string drafter = WriteDrafter(*m, m->config().d_model, /*distill=*/true, dir);
  const std::vector<Spec> specs = Requests(m->config().top_k);
  std::map<RequestId, Generated> want;
  std::map<RequestId, OracleRows> oracle;
  ComputeOracle(*m, specs, want, oracle);
  const spec::DrafterConfig dc;  // WriteDrafter's shape
  const int64_t p = 16, k_max = 4, slots = 4;  // SpecConfig's page_rows, block, slots
  const int64_t ring_rows = p * ((dc.window + k_max + p - 1 + p - 1) / p);  // 16 * ceil(51 / 16) = 64
  const int64_t row_bytes = 4 * int64_t{dc.n_layers} * 2 * dc.n_heads * dc.head_dim;  // K and V, f32: 1024
  uint64_t accepted = 0;
  int reclaims = 0;
  for (spec::SpeculateMode spec_mode : {spec::SpeculateMode::kFixed, spec::SpeculateMode::kConfidence}) {
    for (WorkerMode mode : {WorkerMode::kResident, WorkerMode::kHisparse, WorkerMode::kAdaptive}) {
      for (uint64_t seed : {1ull, 2ull}) {
        if (mode != WorkerMode::kAdaptive && seed > 1) continue;
        SCOPED_TRACE(std::string(spec::SpeculateModeName(spec_mode)) + " " + std::string(WorkerModeName(mode)) +
                     " seed " + std::to_string(seed));
        WorkerConfig c = SpecConfig(*m, mode, 0);
        c.speculation.mode = spec_mode;
        c.speculation.confidence = 0.02;  // the distilled drafter's confidences: 0.001 .. 0.05, median ~0.02
        c.speculation.drafter_weights = drafter;
        RunResult res;
        Serve(*m, c, seed, /*budget_pages=*/24, oracle, specs, res);
        if (HasFatalFailure()) return;
        EXPECT_TRUE(res.sink.errors.empty()) << res.sink.errors.begin()->second;
        for (const Spec& s : specs) {
          EXPECT_EQ(res.sink.out[s.id].tokens.size(), s.max_new) << "request " << s.id;
          if (s.temperature != 0) continue;
          EXPECT_EQ(res.sink.out[s.id].tokens, want[s.id].tokens) << "request " << s.id;
          EXPECT_EQ(res.sink.out[s.id].digests, want[s.id].digests) << "request " << s.id;
        }
        const WorkerStats& st = res.stats;
        EXPECT_GT(st.spec_rounds, 0u);
        EXPECT_EQ(st.spec_round_tokens, st.spec_accepted + st.spec_rounds);
        EXPECT_EQ(res.draft_ring_bytes, static_cast<uint64_t>(slots * ring_rows * row_bytes));
        accepted += st.spec_accepted;
        reclaims += res.reclaims;
        std::printf("%s %s seed %llu: rounds %llu, proposals %llu, accepted %llu, acceptance length %.2f, "
                    "reclaims %d, draft ring %llu bytes\n",
                    std::string(spec::SpeculateModeName(spec_mode)).c_str(), std::string(WorkerModeName(mode)).c_str(),
                    static_cast<unsigned long long>(seed), static_cast<unsigned long long>(st.spec_rounds),
                    static_cast<unsigned long long>(st.spec_proposed),
                    static_cast<unsigned long long>(st.spec_accepted),
                    static_cast<double>(st.spec_round_tokens) / static_cast<double>(st.spec_rounds), res.reclaims,
                    static_cast<unsigned long long>(res.draft_ring_bytes));
      }
    }
  }
  EXPECT_GT(accepted, 0u) << "the distilled drafter never agreed with the target: rounds were not exercised";
  EXPECT_GT(reclaims, 0);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Presets, DrafterRounds, ::testing::Values("dsv4flash-like", "glm5-like"));

// A drafter not paired with the target (its target_d_model is not the target's d_model) and a missing file are
// refused at the worker's start, naming the flag (a missing file already by ComputeGeometry, which sizes the draft
// ring from the file).
TEST(WorkerSpeculation, AnUnpairedOrMissingDrafterIsRefusedAtStart) {
  auto m = MakePresetModel("dsv4flash-like");
  const std::filesystem::path dir = FreshDir("worker_drafter_unpaired");
  for (const std::string& path : {WriteDrafter(*m, m->config().d_model + 8, false, dir), (dir / "none").string()}) {
    WorkerConfig c = SpecConfig(*m, WorkerMode::kAdaptive, 0);
    auto g = ComputeGeometry(m->config(), c);  // synthetic: no drafter file read
    ASSERT_TRUE(g.ok()) << g.status();
    c.hbm_budget_bytes = 24 * g->page_bytes;
    c.speculation.mode = spec::SpeculateMode::kFixed;
    c.speculation.drafter_weights = path;
    if (path == (dir / "none").string()) {
      auto missing = ComputeGeometry(m->config(), c);
      ASSERT_FALSE(missing.ok());
      EXPECT_NE(missing.status().message().find("--drafter-weights " + path), std::string_view::npos)
          << missing.status();
    }
    CpuDevice device;
    FakeMemd memd(24, g->host_page_bytes, c.page_rows, 512, 1, true, c.slots);
    RunResult res;
    auto w = Worker::Create(m.get(), &device, c, &memd, &res.sink);
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find("--drafter-weights " + path), std::string_view::npos) << w.status();
  }
  std::filesystem::remove_all(dir);
}

// Speculation memory declared to memd (issue 13; brief §6, §8 "with a drafter"), by hand for dsv4flash-like (k = 16,
// d_KV = 288 bytes, 3 sources) at p = 16, N = 4, K_max = --block 4, χ = --staging-arenas 4: a GPU page is
// 16 * 288 * 3 = 13,824 bytes; staging M_stage = χ * N * K_max * k * d_KV = 4 * 4 * 4 * 16 * 288 = 294,912 bytes,
// 73,728 per slot = 6 pages (5.33); the drafter's ring R_d = 16 * ceil((32 + 4 + 15) / 16) = 64 rows of
// 4 * 2 layers * 2 * 2 heads * 32 = 1,024 bytes = 65,536 bytes per slot = 5 pages (4.74), 262,144 for N. The Hello
// carries the totals, every AdmitRequest the slot's share inside its required pages (6 more with synthetic
// proposals, 11 with the drafter), WorkerStatsReply the totals.
TEST(WorkerSpeculation, DraftRingAndStagingAreDeclaredToMemd) {
  auto m = MakePresetModel("dsv4flash-like");
  const std::filesystem::path dir = FreshDir("worker_declares");
  const std::string drafter = WriteDrafter(*m, m->config().d_model, /*distill=*/false, dir);
  WorkerConfig off = SpecConfig(*m, WorkerMode::kAdaptive, 0);
  off.speculation.mode = spec::SpeculateMode::kOff;
  auto base = ComputeGeometry(m->config(), off);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->page_bytes, 13824u);
  EXPECT_EQ(static_cast<uint64_t>(base->staging_bytes) + base->speculation.draft_ring_bytes, 0u);
  const uint32_t base_required = RequiredPages(m->config(), *base, WorkerMode::kAdaptive, 100);
  const absl::StatusOr<wire::HelloT> base_hello = MakeHello(m->config(), off, *base, "cpu");
  ASSERT_TRUE(base_hello.ok()) << base_hello.status();
  EXPECT_FALSE(base_hello->has_drafter);
  EXPECT_EQ(base_hello->staging_bytes, 0u);

  WorkerConfig synthetic = SpecConfig(*m, WorkerMode::kAdaptive, 0);
  auto sg = ComputeGeometry(m->config(), synthetic);
  ASSERT_TRUE(sg.ok()) << sg.status();
  EXPECT_EQ(sg->staging_bytes, 294912);
  EXPECT_EQ(sg->speculation.slot_staging_bytes, 73728u);
  EXPECT_EQ(sg->speculation.staging_pages, 6u);
  EXPECT_EQ(sg->speculation.draft_ring_bytes, 0u);  // no drafter
  EXPECT_EQ(sg->speculation.draft_ring_pages, 0u);
  EXPECT_EQ(RequiredPages(m->config(), *sg, WorkerMode::kAdaptive, 100), base_required + 6);
  EXPECT_EQ(RequiredPages(m->config(), *sg, WorkerMode::kResident, 100),
            RequiredPages(m->config(), *base, WorkerMode::kResident, 100) + 6);

  WorkerConfig c = SpecConfig(*m, WorkerMode::kAdaptive, 0);
  c.speculation.mode = spec::SpeculateMode::kFixed;
  c.speculation.drafter_weights = drafter;
  auto g = ComputeGeometry(m->config(), c);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->staging_arenas, 4u);
  EXPECT_EQ(g->speculation.draft_ring_rows, 64);
  EXPECT_EQ(g->speculation.draft_bytes_per_row, 1024);
  EXPECT_EQ(g->speculation.slot_draft_ring_bytes, 65536u);
  EXPECT_EQ(g->speculation.draft_ring_bytes, 262144u);
  EXPECT_EQ(g->speculation.draft_ring_pages, 5u);
  EXPECT_EQ(g->speculation.staging_pages, 6u);
  EXPECT_EQ(RequiredPages(m->config(), *g, WorkerMode::kAdaptive, 100), base_required + 11);
  const absl::StatusOr<wire::HelloT> hello = MakeHello(m->config(), c, *g, "cpu");  // through libdhs's HelloOf
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_TRUE(hello->has_drafter);
  EXPECT_EQ(hello->draft_ring_rows, 64u);
  EXPECT_EQ(hello->draft_ring_bytes, 262144u);
  EXPECT_EQ(hello->draft_bytes_per_row, 1024u);
  EXPECT_EQ(hello->staging_bytes, 294912u);
  EXPECT_EQ(hello->staging_arenas, 4u);

  c.hbm_budget_bytes = 64 * g->page_bytes;
  CpuDevice device;
  FakeMemd memd(64, g->host_page_bytes, c.page_rows, 512, 1, false, c.slots);
  RunResult res;
  auto w = Worker::Create(m.get(), &device, c, &memd, &res.sink);
  ASSERT_TRUE(w.ok()) << w.status();
  wire::SubmitRequestT sub;
  sub.request = 1;
  sub.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  sub.max_new_tokens = 4;
  ASSERT_TRUE((*w)->Submit(sub, ClientRef{"c", 1}).ok());
  for (int it = 0; it < 4 && memd.admits.empty(); ++it) ASSERT_TRUE((*w)->Iterate().ok());
  ASSERT_EQ(memd.admits.size(), 1u);
  const wire::AdmitRequestT& a = memd.admits[0];
  EXPECT_EQ(a.required_pages, RequiredPages(m->config(), *g, WorkerMode::kAdaptive, 12));  // 8 + 4 tokens
  EXPECT_EQ(a.draft_ring_pages, 5u);
  EXPECT_EQ(a.staging_pages, 6u);
  EXPECT_EQ(a.draft_ring_bytes, 65536u);
  EXPECT_EQ(a.staging_bytes, 73728u);
  const wire::WorkerStatsReplyT stats = (*w)->StatsReply();
  EXPECT_EQ(stats.draft_ring_bytes, 262144u);
  EXPECT_EQ(stats.staging_bytes, 294912u);
  // A re-Hello's report of the granted request repeats what its AdmitRequest declared (workerd/admission_shape.h
  // ReportOf, the construction libdhs's EmbeddedWorker calls too): the share, complete pages, optional history, and its
  // record.
  std::vector<std::unique_ptr<wire::ReportedRequestT>> reports = (*w)->memd_away().Report();
  for (int it = 0; it < 16 && reports.empty(); ++it) {  // from its grant on (it may finish a few iterations later)
    memd.Pump(**w);  // the grant
    ASSERT_TRUE((*w)->Iterate().ok());
    reports = (*w)->memd_away().Report();
  }
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0]->request, a.request);
  EXPECT_EQ(reports[0]->draft_ring_pages, 5u);
  EXPECT_EQ(reports[0]->staging_pages, 6u);
  EXPECT_EQ(reports[0]->draft_ring_bytes, 65536u);
  EXPECT_EQ(reports[0]->staging_bytes, 73728u);
  EXPECT_EQ(reports[0]->complete_pages, a.complete_pages);
  EXPECT_TRUE(reports[0]->optional_history);
  ASSERT_NE(reports[0]->record, nullptr);
  EXPECT_EQ(reports[0]->record->prompt, sub.prompt);
  std::filesystem::remove_all(dir);
}

// Issue 25, "workerd uses it": workerd's Hello is libdhs's HelloOf over EmbeddedConfigOf (one construction of a
// worker's Hello), and for every shape workerd serves, the required pages libdhs declares for a request of that shape
// (SessionPagesOf, what dhs_request_submit sends) equal workerd's RequiredPages: whatever workerd declares to memd, an
// engine can declare through dhs_worker_config (ABI 1.8 added the consumers, the fetched rows, the drafter's ring and
// K_max without arenas). Each figure is checked against workerd's own geometry or counted here from the model.
TEST(WorkerSpeculation, WorkerdShapesAreLibdhsShapes) {
  const std::filesystem::path dir = FreshDir("workerd_shapes");
  int shapes = 0;
  for (const std::string& preset : {std::string("dsv4flash-like"), std::string("glm5-like")}) {
    auto m = MakePresetModel(preset);
    const model::ModelConfig& mc = m->config();
    const std::string drafter = WriteDrafter(*m, mc.d_model, /*distill=*/false, dir);
    for (const WorkerMode mode : {WorkerMode::kResident, WorkerMode::kHisparse, WorkerMode::kAdaptive}) {
      // 0: no speculation; 1: synthetic rounds with 4 staging arenas; 2: synthetic without arenas; 3: the drafter.
      for (int variant = 0; variant < 4; ++variant) {
        SCOPED_TRACE(preset + " " + std::string(WorkerModeName(mode)) + " variant " + std::to_string(variant));
        WorkerConfig c = SpecConfig(*m, mode, 0);
        if (variant == 0) c.speculation.mode = spec::SpeculateMode::kOff;
        if (variant == 2) c.staging_arenas = 0;
        if (variant == 3) {
          c.speculation.mode = spec::SpeculateMode::kFixed;
          c.speculation.drafter_weights = drafter;
        }
        const absl::StatusOr<WorkerGeometry> g = ComputeGeometry(mc, c);
        ASSERT_TRUE(g.ok()) << g.status();
        const absl::StatusOr<wire::HelloT> hello = MakeHello(mc, c, *g, "cpu");
        ASSERT_TRUE(hello.ok()) << hello.status();
        EXPECT_EQ(hello->page_bytes, g->page_bytes);
        EXPECT_EQ(hello->host_page_bytes, g->host_page_bytes);
        EXPECT_EQ(hello->capacity_pages, g->capacity_pages);
        EXPECT_EQ(hello->hot_rows, mode == WorkerMode::kResident ? std::max<uint32_t>(g->hot_rows, mc.top_k)
                                                                  : g->hot_rows);
        EXPECT_EQ(hello->tail_rows, g->tail_rows);
        EXPECT_EQ(hello->serving_mode, WorkerModeName(mode));
        ASSERT_EQ(hello->sources.size(), static_cast<size_t>(mc.n_sources()));
        uint32_t fetched = 0;  // each layer with an indexer fetches a row of every source of its layer's group
        for (const model::LayerSpec& l : mc.layers) {
          if (!l.has_indexer()) continue;
          for (const std::vector<SourceId>& group : g->kv.groups) {
            if (std::count(group.begin(), group.end(), l.source) > 0) fetched += static_cast<uint32_t>(group.size());
          }
        }
        EXPECT_EQ(hello->fetched_rows_per_token, fetched);
        for (int s = 0; s < mc.n_sources(); ++s) {
          const auto layers = std::count_if(mc.layers.begin(), mc.layers.end(),
                                            [s](const model::LayerSpec& l) { return l.source == static_cast<SourceId>(s); });
          EXPECT_EQ(hello->sources[s]->consumers, static_cast<uint32_t>(layers)) << "source " << s;
          EXPECT_EQ(hello->sources[s]->bytes_per_row, static_cast<uint32_t>(mc.row_bytes()));
        }
        EXPECT_EQ(hello->k_max, variant == 0 ? 0u : 4u);
        EXPECT_EQ(hello->staging_arenas, g->staging_arenas);
        EXPECT_EQ(hello->staging_bytes, static_cast<uint64_t>(g->staging_bytes));
        EXPECT_EQ(hello->staging_bytes > 0, (variant == 1 || variant == 3) && mode != WorkerMode::kResident);
        EXPECT_EQ(hello->has_drafter, variant == 3);
        EXPECT_EQ(hello->draft_ring_rows, static_cast<uint32_t>(g->speculation.draft_ring_rows));
        EXPECT_EQ(hello->draft_ring_bytes, g->speculation.draft_ring_bytes);
        EXPECT_EQ(hello->draft_bytes_per_row, static_cast<uint64_t>(g->speculation.draft_bytes_per_row));
        EXPECT_EQ(hello->drafter_window, static_cast<uint32_t>(g->speculation.drafter_window));
        const lib::EmbeddedConfig shape = EmbeddedConfigOf(mc, c, *g, "cpu");
        // The library's KV layout of that shape is workerd's own (the store libdhs would open for it).
        const KvConfig kv = lib::KvConfigOf(shape);
        EXPECT_EQ(kv.row_bytes, g->kv.row_bytes);
        EXPECT_EQ(kv.groups, g->kv.groups);
        EXPECT_EQ(kv.page_rows, g->kv.page_rows);
        EXPECT_EQ(kv.hot_rows, hello->hot_rows);
        EXPECT_EQ(kv.k, g->kv.k);
        EXPECT_EQ(kv.tail_rows, g->kv.tail_rows);
        EXPECT_EQ(kv.slots, g->kv.slots);
        EXPECT_EQ(kv.optional_pages, g->kv.optional_pages);
        EXPECT_EQ(kv.key_bytes, g->kv.key_bytes);
        EXPECT_EQ(kv.staging_arenas, g->kv.staging_arenas);
        EXPECT_EQ(kv.staging_k_max, g->kv.staging_k_max);
        const absl::StatusOr<lib::RegionLayout> region = lib::RegionOf(shape);
        ASSERT_TRUE(region.ok()) << region.status();
        EXPECT_EQ(region->staging_bytes, static_cast<uint64_t>(g->staging_bytes));
        for (const uint64_t context : {0u, 1u, 17u, 100u, 1000u, 70000u}) {
          EXPECT_EQ(SessionRequiredPages(lib::SessionPagesOf(shape, *region), context),
                    RequiredPages(mc, *g, mode, context))
              << context << " tokens";
        }
        ++shapes;
      }
    }
  }
  EXPECT_EQ(shapes, 24);
  // Shapes workerd's flags allow that libdhs's first bounds refused (review finding): workerd must start with them.
  auto m = MakePresetModel("dsv4flash-like");
  WorkerConfig resident = SpecConfig(*m, WorkerMode::kResident, 0);
  resident.hot_rows = 4;  // below k: resident mode reads no hot cache
  WorkerConfig arenas = SpecConfig(*m, WorkerMode::kHisparse, 0);
  arenas.staging_arenas = 100;  // --staging-arenas takes up to 1024
  WorkerConfig pages = SpecConfig(*m, WorkerMode::kAdaptive, 0);
  pages.page_rows = 1u << 17;  // --page-rows takes up to 2^20
  pages.tail_rows = 1u << 18;
  pages.hbm_budget_bytes = uint64_t{4} << 30;
  for (const WorkerConfig& c : {resident, arenas, pages}) {
    const absl::StatusOr<WorkerGeometry> g = ComputeGeometry(m->config(), c);
    ASSERT_TRUE(g.ok()) << g.status();
    const absl::StatusOr<wire::HelloT> hello = MakeHello(m->config(), c, *g, "cpu");
    EXPECT_TRUE(hello.ok()) << hello.status();
  }
}

}  // namespace
}  // namespace dhs::test
