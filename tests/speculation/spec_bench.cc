// tests/speculation/spec_bench.cc: figures for the speculative building blocks (workerd/speculation). Prints, asserts nothing
// about time.
// BM_PlanUnion/<K_r>: PlanUnion for one (request, source) at the glm5-like selection size (k = 2048, brief §8):
//   K_r queries whose selections overlap (each query shares ~75% of its rows with the anchor's, as consecutive
//   queries of one request do), half of the union ready (direct), a hot budget of 1024 slots. Counters: ns per plan,
//   ns per selected entry, copies and staged rows per plan (the union's missing rows, each copied once).
// BM_AcceptRound/<K_r>: AcceptRound in sampling mode (temperature 1, top-p 0.95) on K_r rows of 256 logits with the
//   drafter's q close to p; counters: ns per round and the mean acceptance length (accepted + 1).
// BM_KeyedUniform: one Philox4x32-10 draw.
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "workerd/speculation/acceptance.h"
#include "workerd/speculation/keyed_draw.h"
#include "workerd/verification/union_plan.h"

namespace dhs::spec {
namespace {

void BM_PlanUnion(benchmark::State& state) {
  const int64_t k_r = state.range(0), k = 2048, k_max = 8;
  const Position n_r = 200000;
  std::mt19937_64 rng(1);
  std::uniform_int_distribution<Position> pos(0, n_r - 1);
  std::vector<std::vector<Position>> sels(k_r);
  for (int64_t j = 0; j < k_r; ++j) {
    std::vector<Position> s;
    std::vector<char> used(n_r + k_max, 0);
    for (int64_t e = 0; e < k; ++e) {
      Position t = (j > 0 && e < k * 3 / 4) ? sels[0][e] : pos(rng);
      while (used[t]) t = pos(rng);
      used[t] = 1;
      s.push_back(t);
    }
    sels[j] = s;
  }
  std::vector<std::span<const Position>> spans(sels.begin(), sels.end());
  const UnionPlanInput in{.selections = spans, .k = k, .k_max = k_max, .frontier = n_r, .hot_budget = 1024,
                          .ready = [](Position t) { return (t * 0x9E3779B97F4A7C15ULL) >> 63; }};
  int64_t copies = 0, staged = 0;
  for (auto _ : state) {
    absl::StatusOr<UnionPlan> plan = PlanUnion(in);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    copies = static_cast<int64_t>(plan->copies.size());
    staged = plan->staging_copies;
    benchmark::DoNotOptimize(plan->reads.data());
  }
  state.counters["ns_per_plan"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                     benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["ns_per_entry"] = benchmark::Counter(static_cast<double>(state.iterations() * k_r * k),
                                                      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["copies"] = static_cast<double>(copies);
  state.counters["staged"] = static_cast<double>(staged);
}
BENCHMARK(BM_PlanUnion)->Arg(1)->Arg(4)->Arg(8);

void BM_AcceptRound(benchmark::State& state) {
  const int k_r = static_cast<int>(state.range(0));
  std::mt19937_64 rng(2);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(static_cast<size_t>(k_r) * model::kVocab);
  for (float& x : logits) x = nd(rng);
  const model::SamplingParams params{.temperature = 1.0f, .top_p = 0.95f};
  std::vector<std::vector<double>> qs(k_r);
  std::vector<Proposal> props;
  for (int j = 1; j < k_r; ++j) {
    std::vector<float> noisy(logits.begin() + (j - 1) * model::kVocab, logits.begin() + j * model::kVocab);
    for (float& x : noisy) x += nd(rng) * 0.25f;
    qs[j] = model::SamplingDistribution(noisy, {.temperature = 1.0f});
  }
  int64_t rounds = 0, accepted = 0;
  for (auto _ : state) {
    const RoundKey key{.seed = 3, .request = 1, .frontier = rounds * 16};
    props.clear();
    for (int j = 1; j < k_r; ++j) {
      const double u = KeyedUniform({key.seed, key.request, key.frontier + j, DrawPurpose::kDraft});
      props.push_back({SampleWithUniform(qs[j], u), qs[j]});
    }
    absl::StatusOr<RoundOutcome> out = AcceptRound(AcceptMode::kSampling, logits, params, props, key);
    accepted += out->accepted;
    ++rounds;
  }
  state.counters["ns_per_round"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["acceptance_length_mean"] = 1.0 + static_cast<double>(accepted) / std::max<int64_t>(rounds, 1);
}
BENCHMARK(BM_AcceptRound)->Arg(2)->Arg(4)->Arg(8);

void BM_KeyedUniform(benchmark::State& state) {
  int64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(KeyedUniform({7, 11, i++, DrawPurpose::kAccept}));
}
BENCHMARK(BM_KeyedUniform);

}  // namespace
}  // namespace dhs::spec

BENCHMARK_MAIN();
