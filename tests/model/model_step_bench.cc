// Per-token decode cost of Model::Step against the batch size (1, 2, 4, 8, 16) for the presets dsv4flash-like
// (1.33 MiB of weights: cache resident) and bench-wide (109.3 MiB: a step streams the weights from memory once for the
// whole batch, as decode does on a GPU; brief §11). Every session has a short history (64 prefilled tokens, at most
// 64 more decoded before the sessions are made again); resident KV (ResidentKvAccess).
// Prints tokens/s per batch size and, at the end, tokens/s(batch 8) / tokens/s(batch 1) per preset. Asserts nothing
// about time.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "workerd/model/model.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/weights.h"

namespace dhs::model {
namespace {

constexpr int kHistory = 64;     // prefilled tokens per session
constexpr int kMaxSession = 16;  // the largest batch
constexpr int kMaxDecode = 64;   // decode steps a session takes before the pool is prefilled again

// Per preset: the model (bench-wide takes seconds to generate) and kMaxSession sessions with short histories; the run
// for batch B steps sessions 0 .. B-1. Histories stay within kHistory .. kHistory + kMaxDecode, so the indexer's
// O(history) work stays small next to the projections.
struct Pool {
  std::unique_ptr<Model> model;
  std::unique_ptr<ResidentKvAccess> kv;
  std::vector<ModelSession> sessions;
  std::vector<std::vector<Token>> next;  // the next token of each session

  // Fresh sessions, all prefilled with kHistory tokens in one batched step.
  bool Prefill() {
    kv = ResidentKvAccess::ForModel(model->config(), kMaxSession * (4u << 20));
    sessions.clear();
    next.assign(kMaxSession, {0});
    std::vector<std::vector<Token>> prompts(kMaxSession, std::vector<Token>(kHistory));
    for (int i = 0; i < kMaxSession; ++i) {
      sessions.push_back(model->NewSession(static_cast<RequestId>(i + 1)));
      for (int t = 0; t < kHistory; ++t) prompts[i][t] = static_cast<Token>((t * 31 + 7 * i + 5) & 0xff);
      next[i][0] = static_cast<Token>((i * 53 + 11) & 0xff);
    }
    std::vector<StepInput> in;
    for (int i = 0; i < kMaxSession; ++i) in.push_back({&sessions[i], prompts[i]});
    std::vector<StepOutput> out(kMaxSession);
    return model->Step(in, *kv, out).ok();
  }
};

Pool& GetPool(const std::string& preset) {
  static auto* pools = new std::map<std::string, Pool>();
  auto it = pools->find(preset);
  if (it == pools->end()) {
    auto writer = GenerateWeights(*PresetConfig(preset), 1);
    auto file = SafetensorsFile::Parse(writer->Serialize());
    it = pools->emplace(preset, Pool{}).first;
    it->second.model = std::move(*Model::FromSafetensors(*file));
    if (!it->second.Prefill()) std::fprintf(stderr, "model_step_bench: prefill failed\n");
  }
  return it->second;
}

void BM_DecodeStep(benchmark::State& state, const char* preset) {
  Pool& pool = GetPool(preset);
  const int batch = static_cast<int>(state.range(0));
  std::vector<StepInput> in(batch);
  std::vector<StepOutput> out(batch);
  for (auto _ : state) {
    if (pool.sessions[0].position() >= kHistory + kMaxDecode) {
      state.PauseTiming();
      const bool ok = pool.Prefill();
      state.ResumeTiming();
      if (!ok) {
        state.SkipWithError("prefill failed");
        break;
      }
    }
    for (int i = 0; i < batch; ++i) in[i] = {&pool.sessions[i], pool.next[i]};
    if (!pool.model->Step(in, *pool.kv, out).ok()) {
      state.SkipWithError("step failed");
      break;
    }
    for (int i = 0; i < batch; ++i) pool.next[i][0] = static_cast<Token>((pool.next[i][0] * 7 + 3 + i) & 0xff);
  }
  const double tokens = static_cast<double>(state.iterations()) * batch;
  state.counters["tokens_per_s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["s_per_token"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Session 0 takes part in every run: bench-wide's fixed 12 iterations x 5 batch sizes stay under kMaxDecode, so its
// (expensive) pool is prefilled once.
BENCHMARK_CAPTURE(BM_DecodeStep, dsv4flash_like, "dsv4flash-like")
    ->RangeMultiplier(2)->Range(1, 16)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK_CAPTURE(BM_DecodeStep, bench_wide, "bench-wide")
    ->RangeMultiplier(2)->Range(1, 16)->Unit(benchmark::kMillisecond)->Iterations(12);

// Console output plus a record of tokens/s per (preset, batch) for the closing ratio.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& reports) override {
    ConsoleReporter::ReportRuns(reports);
    for (const Run& r : reports) {
      if (r.error_occurred || r.run_type != Run::RT_Iteration) continue;
      auto it = r.counters.find("tokens_per_s");
      if (it == r.counters.end()) continue;
      // Name "BM_DecodeStep/<preset>/<batch>/min_time:..."
      const std::string name = r.benchmark_name();
      const size_t a = name.find('/'), b2 = name.find('/', a + 1), c = name.find('/', b2 + 1);
      if (a == std::string::npos || b2 == std::string::npos) continue;
      const std::string preset = name.substr(a + 1, b2 - a - 1);
      const int batch = std::stoi(name.substr(b2 + 1, c == std::string::npos ? std::string::npos : c - b2 - 1));
      tokens_per_s[preset][batch] = it->second.value;
    }
  }
  std::map<std::string, std::map<int, double>> tokens_per_s;
};

}  // namespace
}  // namespace dhs::model

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  dhs::model::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  for (const auto& [preset, by_batch] : reporter.tokens_per_s) {
    std::printf("%s:", preset.c_str());
    for (const auto& [batch, tps] : by_batch) std::printf("  B=%d %.0f tok/s", batch, tps);
    auto one = by_batch.find(1), eight = by_batch.find(8);
    if (one != by_batch.end() && eight != by_batch.end() && one->second > 0) {
      std::printf("  | tokens/s(batch 8) / tokens/s(batch 1) = %.2f", eight->second / one->second);
    }
    std::printf("\n");
  }
  benchmark::Shutdown();
  return 0;
}
