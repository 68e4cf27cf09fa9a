// Decode-step throughput of the built-in model per preset and context length (resident KV). Prints tokens/s; asserts
// nothing about time. Each benchmark prefills `context` tokens, then runs a fixed number of one-token decode steps.
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "workerd/model/model.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/weights.h"

namespace dhs::model {
namespace {

std::unique_ptr<Model> Build(const char* preset) {
  auto writer = GenerateWeights(*PresetConfig(preset), 1);
  auto file = SafetensorsFile::Parse(writer->Serialize());
  return std::move(*Model::FromSafetensors(*file));
}

void BM_Decode(benchmark::State& state, const char* preset) {
  auto model = Build(preset);
  auto kv = ResidentKvAccess::ForModel(model->config(), 256u << 20);
  ModelSession s = model->NewSession(1);
  const int64_t context = state.range(0);
  std::vector<Token> prompt(context);
  for (int64_t i = 0; i < context; ++i) prompt[i] = static_cast<Token>((i * 31 + 7) & 0xff);
  if (!model->ImportPrefix(s, prompt, *kv).ok()) state.SkipWithError("prefill failed");
  std::vector<Token> tok = {42};
  StepOutput out;
  for (auto _ : state) {
    StepInput in{&s, tok};
    if (!model->Step(std::span<StepInput>(&in, 1), *kv, std::span<StepOutput>(&out, 1)).ok()) {
      state.SkipWithError("step failed");
      break;
    }
    tok[0] = static_cast<Token>((tok[0] * 7 + 3) & 0xff);
  }
  state.counters["tokens_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()),
                                                      benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_Decode, dsv4flash_like, "dsv4flash-like")->Arg(64)->Arg(512)->Arg(2048)->Iterations(64);
BENCHMARK_CAPTURE(BM_Decode, glm5_like, "glm5-like")->Arg(64)->Arg(512)->Arg(2048)->Iterations(64);

}  // namespace
}  // namespace dhs::model

BENCHMARK_MAIN();
