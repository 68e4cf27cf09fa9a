#include "workerd/model/weights.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace dhs::model {

std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& c) {
  const int64_t D = c.d_model, H = c.n_heads, F = c.d_ff;
  std::vector<TensorSpec> specs;
  specs.push_back({"tok_emb", {int64_t{kVocab}, D}});
  for (int l = 0; l < c.n_layers(); ++l) {
    const LayerSpec& spec = c.layers[l];
    auto name = [l](const char* t) { return absl::StrCat("layers.", l, ".", t); };
    specs.push_back({name("attn_norm"), {D}});
    if (spec.writes_row()) {
      specs.push_back({name("kv_norm"), {D}});
      specs.push_back({name("w_dkv"), {int64_t{c.d_c}, D}});
      specs.push_back({name("w_kr"), {int64_t{c.d_r}, D}});
    }
    if (spec.has_indexer()) {
      specs.push_back({name("idx_wq"), {int64_t{c.idx_heads} * c.idx_dim, D}});
      specs.push_back({name("idx_ww"), {int64_t{c.idx_heads}, D}});
      specs.push_back({name("idx_wk"), {int64_t{c.idx_dim}, D}});
    }
    specs.push_back({name("w_qc"), {H * c.d_c, D}});
    specs.push_back({name("w_qr"), {H * c.d_r, D}});
    specs.push_back({name("w_o"), {D, H * c.d_c}});
    specs.push_back({name("mlp_norm"), {D}});
    specs.push_back({name("w_up"), {F, D}});
    specs.push_back({name("w_down"), {D, F}});
  }
  specs.push_back({"final_norm", {D}});
  specs.push_back({"lm_head", {int64_t{kVocab}, D}});
  return specs;
}

absl::Status AddSeededTensors(std::span<const TensorSpec> specs, uint64_t seed, SafetensorsWriter& writer) {
  std::mt19937_64 rng(seed);
  // 24 random bits -> a float in [-1, 1): exact in float, so no platform-dependent rounding.
  auto uniform = [&rng]() { return static_cast<float>(static_cast<int64_t>(rng() >> 40) - (1 << 23)) * 0x1p-23f; };
  for (const TensorSpec& spec : specs) {
    int64_t count = 1;
    for (int64_t d : spec.shape) count *= d;
    std::vector<float> data(static_cast<size_t>(count));
    const bool is_gain = spec.shape.size() == 1;
    const float bound = spec.name == "tok_emb" ? 1.0f : std::sqrt(3.0f / static_cast<float>(spec.shape.back()));
    for (float& v : data) v = is_gain ? 1.0f + 0.1f * uniform() : bound * uniform();
    if (auto s = writer.AddF32(spec.name, spec.shape, data); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsWriter> GenerateWeights(const ModelConfig& config, uint64_t seed) {
  if (auto s = config.Validate(); !s.ok()) return s;
  SafetensorsWriter writer;
  if (auto s = AddSeededTensors(ModelTensorSpecs(config), seed, writer); !s.ok()) return s;
  writer.SetMetadata("format", kWeightsFormat);
  writer.SetMetadata("preset", config.preset);
  writer.SetMetadata("seed", absl::StrCat(seed));
  writer.SetMetadata("config", config.ToJson());
  return writer;
}

}  // namespace dhs::model
