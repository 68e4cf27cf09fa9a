// tests/speculation/drafter_bench.cc: figures for the built-in drafter (workerd/speculation/drafter.h). Prints, asserts nothing.
// BM_Propose/<batch>: one drafting round (K = 8: 7 proposals, keyed sampling) for `batch` requests in one Propose, in
//   steady state (each round first catches up on 3 committed positions: A = 2 accepted + the anchor), drafter of
//   the default config for dsv4flash-like (D = 64, 2 layers, W = 32, K_max = 8) whose rings are warm (prompt of 256
//   positions). Counters: us per round, us per request, proposals per second.
// After the benchmarks, the acceptance report: the drafter (greedy proposals) against the target's greedy decoding
//   (dsv4flash-like, seed 1) on a few text prompts, 96 generated tokens each: the mean acceptance length (accepted
//   proposals + 1 per round, averaged over rounds) for K = 4 and 8. The rounds are simulated from one plain greedy
//   run (tokens and final hidden states; model::Step's numerics are batch-invariant, so a verification pass would
//   give the same bits): proposal j is accepted while it equals the greedy token at its position.
#include <benchmark/benchmark.h>

#include "absl/strings/str_format.h"

#include <cstdio>
#include <string>
#include <vector>

#include "tests/speculation/drafter_test_util.h"
#include "workerd/speculation/drafter_distill.h"
#include "workerd/model/model.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/sampling.h"
#include "workerd/model/weights.h"

namespace dhs::spec {
namespace {

using testing::Driver;
using testing::MakeDrafter;

DrafterConfig DefaultFor(int target_d_model) {
  DrafterConfig c;
  c.target_d_model = target_d_model;
  return c;
}

void BM_Propose(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  auto m = MakeDrafter(DefaultFor(64));
  auto p = DrafterProposer::Create(m, *model::PresetConfig("dsv4flash-like"),
                                   {.slots = static_cast<uint32_t>(batch), .page_rows = 64});
  if (!p.ok()) {
    state.SkipWithError(std::string(p.status().message()).c_str());
    return;
  }
  std::vector<Driver> drivers;
  for (int i = 0; i < batch; ++i) drivers.emplace_back(**p, i, 1 + i, 50 + i, 256);
  std::vector<std::vector<float>> hidden(batch);
  std::vector<DraftRequest> requests(batch);
  std::vector<DraftResult> out(batch);
  auto round = [&] {
    for (int i = 0; i < batch; ++i) requests[i] = drivers[i].Request(7, hidden[i]);
    if (!(*p)->Propose(requests, out).ok()) return false;
    for (int i = 0; i < batch; ++i) {
      if (!drivers[i].Commit(out[i], 2).ok()) return false;
    }
    return true;
  };
  if (!round()) {  // warm: the prompt's catch-up
    state.SkipWithError("propose failed");
    return;
  }
  for (auto _ : state) {
    state.PauseTiming();
    for (int i = 0; i < batch; ++i) requests[i] = drivers[i].Request(7, hidden[i]);
    state.ResumeTiming();
    benchmark::DoNotOptimize((*p)->Propose(requests, out).ok());
    state.PauseTiming();
    for (int i = 0; i < batch; ++i) benchmark::DoNotOptimize(drivers[i].Commit(out[i], 2).ok());
    state.ResumeTiming();
  }
  state.counters["us_per_round"] = benchmark::Counter(static_cast<double>(state.iterations()) * 1e-6,
                                                      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["us_per_request"] = benchmark::Counter(static_cast<double>(state.iterations() * batch) * 1e-6,
                                                        benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["proposals_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * batch * 7), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Propose)->Arg(1)->Arg(2)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMicrosecond);

// The target's greedy decoding of `prompt` for `generate` tokens: tokens (prompt then generated) and the final hidden
// state of every fed position.
struct GreedyTrace {
  std::vector<model::Token> tokens;
  std::vector<float> hidden;
};

GreedyTrace TargetGreedy(const model::Model& target, const std::string& prompt, int generate) {
  GreedyTrace tr;
  for (unsigned char ch : prompt) tr.tokens.push_back(ch);
  auto kv = model::ResidentKvAccess::ForModel(target.config(), 64u << 20, 16);
  model::ModelSession s = target.NewSession(1);
  std::vector<model::Token> feed = tr.tokens;
  for (int g = 0; g < generate; ++g) {
    model::StepInput in{&s, feed, true};
    model::StepOutput out;
    if (!target.Step(std::span(&in, 1), *kv, std::span(&out, 1)).ok()) break;
    tr.hidden.insert(tr.hidden.end(), out.hidden.begin(), out.hidden.end());
    const size_t last = out.logits.size() - model::kVocab;
    tr.tokens.push_back(model::Argmax(std::span<const float>(out.logits).subspan(last, model::kVocab)));
    feed = {tr.tokens.back()};
  }
  return tr;
}

// Simulated greedy speculative rounds over a trace: returns (sum of accepted + 1, rounds).
std::pair<int64_t, int64_t> AcceptanceOver(std::shared_ptr<const DrafterModel> m, const model::ModelConfig& target,
                                           const GreedyTrace& tr, size_t prompt, int k) {
  auto p = DrafterProposer::Create(m, target, {.slots = 1, .page_rows = 64, .k_max = 8, .greedy = true});
  const int dt = target.d_model;
  Position n = static_cast<Position>(prompt), previous = -1;
  int64_t sum = 0, rounds = 0;
  while (n + k <= static_cast<Position>(tr.tokens.size()) - 1) {
    const Position first = previous < 0 ? 0 : previous;
    DraftRequest r{.slot = 0, .key = {1, 1, n}, .tokens = std::span(tr.tokens).first(n + 1),
                   .target_hidden = std::span(tr.hidden).subspan(first * dt, (n - first) * dt), .max_proposals = k - 1};
    DraftResult res;
    if (!(*p)->Propose(std::span(&r, 1), std::span(&res, 1)).ok()) break;
    int64_t a = 0;
    while (a < static_cast<int64_t>(res.tokens.size()) && res.tokens[a] == tr.tokens[n + 1 + a]) ++a;
    if (!(*p)->Commit(0, a).ok()) break;
    sum += a + 1;
    ++rounds;
    previous = n;
    n += a + 1;
  }
  return {sum, rounds};
}

void AcceptanceReport() {
  const char* prompts[] = {"The quick brown fox jumps over the lazy dog. ", "int main(int argc, char** argv) {\n  ",
                           "Speculative decoding proposes several tokens and the target verifies them. ",
                           "KV cache pages move between GPU memory and host memory under pressure. "};
  const model::ModelConfig tc = *model::PresetConfig("dsv4flash-like");
  auto writer = model::GenerateWeights(tc, 1);
  auto target = model::Model::FromSafetensors(*model::SafetensorsFile::Parse(writer->Serialize()));
  auto drafter = MakeDrafter(DefaultFor(tc.d_model), 1);
  // The distilled drafter: output layers fitted on 64 texts of 256 tokens the target sampled (seed 7).
  auto texts = SampleTargetTexts(**target, 64, 256, 7);
  auto distilled = DistillOutputLayers(*drafter, **target, *texts, {});
  if (!distilled.ok()) {
    std::printf("distillation failed: %s\n", std::string(distilled.status().message()).c_str());
    return;
  }
  std::shared_ptr<const DrafterModel> fitted(std::move(*distilled));
  std::vector<GreedyTrace> traces;
  for (const char* p : prompts) {
    traces.push_back(TargetGreedy(**target, p, 96));
    std::string shown;
    for (size_t t = std::string(p).size(); t < std::string(p).size() + 24; ++t) {
      shown += absl::StrFormat("%d ", traces.back().tokens[t]);
    }
    std::printf("target greedy continuation of prompt %zu (first 24 ids): %s\n", traces.size() - 1, shown.c_str());
  }
  std::printf("\nDrafter acceptance vs the target's greedy decoding (dsv4flash-like seed 1, drafter seed 1, 96 "
              "generated tokens per prompt, greedy proposals; 'distilled': output layers fitted on 64 x 256 "
              "target-sampled tokens, seed 7)\n");
  std::printf("%-10s %-8s %-4s %-8s %s\n", "drafter", "prompt", "K", "rounds", "mean_acceptance_length");
  for (const auto& [name, m] : {std::pair{"random", drafter}, {"distilled", fitted}}) {
    for (int k : {4, 8}) {
      int64_t total = 0, rounds = 0;
      for (size_t i = 0; i < traces.size(); ++i) {
        auto [sum, r] = AcceptanceOver(m, tc, traces[i], std::string(prompts[i]).size(), k);
        std::printf("%-10s %-8zu %-4d %-8lld %.3f\n", name, i, k, static_cast<long long>(r), r ? double(sum) / r : 0.0);
        total += sum;
        rounds += r;
      }
      std::printf("%-10s %-8s %-4d %-8lld %.3f\n", name, "all", k, static_cast<long long>(rounds),
                  rounds ? double(total) / rounds : 0.0);
    }
  }
}

}  // namespace
}  // namespace dhs::spec

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  dhs::spec::AcceptanceReport();
  return 0;
}
