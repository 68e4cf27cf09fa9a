#include "workerd/model/config.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace dhs::model {
namespace {

constexpr struct {
  LayerKind kind;
  std::string_view name;
} kKindNames[] = {
    {LayerKind::kWrite, "write"},       {LayerKind::kReuse, "reuse"},
    {LayerKind::kReindex, "reindex"},   {LayerKind::kProducer, "producer"},
    {LayerKind::kFollower, "follower"},
};

ModelConfig Dsv4FlashLike() {
  ModelConfig c;
  c.preset = std::string(kPresetNames[0]);
  c.d_model = 64;
  c.d_ff = 128;
  c.n_heads = 2;
  c.d_c = 64;
  c.d_r = 8;  // d_KV = 288 bytes, as the dsv4flash-like preset of brief §8
  c.idx_heads = 2;
  c.idx_dim = 32;  // index key 128 bytes (brief §8: d_idx = 132)
  c.top_k = 16;
  c.local_window = 4;
  // 3 sources, 8 layers: every later consumer is Reuse or Reindex of an earlier one (brief §8: shared sources).
  using K = LayerKind;
  c.layers = {{K::kWrite, 0}, {K::kReuse, 0},   {K::kWrite, 1},   {K::kReindex, 0},
              {K::kReuse, 1}, {K::kWrite, 2},   {K::kReindex, 1}, {K::kReuse, 2}};
  return c;
}

// dsv4flash-like's topology, k, window, indexer and payload rows (so memd/worker geometry is unchanged) with a wide
// hidden state and MLP: the weights total 114,647,040 bytes (109.3 MiB, ModelTensorSpecs), well above a CPU's L3, so
// a decode step is bound by streaming the weights once per step for the whole batch, as on a GPU (brief §11).
ModelConfig BenchWide() {
  ModelConfig c = Dsv4FlashLike();
  c.preset = std::string(kPresetNames[2]);
  c.d_model = 1024;
  c.d_ff = 1536;
  return c;
}

ModelConfig Glm5Like() {
  ModelConfig c;
  c.preset = std::string(kPresetNames[1]);
  c.d_model = 64;
  c.d_ff = 128;
  c.n_heads = 2;
  c.d_c = 128;
  c.d_r = 16;  // d_KV = 576 bytes, as the glm5-like preset of brief §8
  c.idx_heads = 4;
  c.idx_dim = 32;  // index key 128 bytes (brief §8: d_idx = 132)
  c.top_k = 32;
  c.local_window = 0;
  // 2 index producers driving 4 and 3 payload layers (~3.5 per selection; brief §8: ~3.7), one source each.
  using K = LayerKind;
  c.layers = {{K::kProducer, 0}, {K::kFollower, 1}, {K::kFollower, 2}, {K::kFollower, 3},
              {K::kProducer, 4}, {K::kFollower, 5}, {K::kFollower, 6}};
  return c;
}

}  // namespace

std::string_view LayerKindName(LayerKind kind) {
  for (const auto& e : kKindNames) {
    if (e.kind == kind) return e.name;
  }
  return "?";
}

absl::StatusOr<LayerKind> ParseLayerKind(std::string_view name) {
  for (const auto& e : kKindNames) {
    if (e.name == name) return e.kind;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown layer kind '", std::string(name), "'"));
}

int ModelConfig::n_sources() const {
  int n = 0;
  for (const auto& l : layers) n = std::max(n, static_cast<int>(l.source) + 1);
  return n;
}

int ModelConfig::n_indexers() const {
  return static_cast<int>(std::count_if(layers.begin(), layers.end(), [](const LayerSpec& l) { return l.has_indexer(); }));
}

absl::Status ModelConfig::Validate() const {
  auto positive = [](std::string_view field, int v) -> absl::Status {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat("model config: ", std::string(field), " must be > 0, got ", v));
    return absl::OkStatus();
  };
  for (auto [field, v] : {std::pair<std::string_view, int>{"d_model", d_model}, {"d_ff", d_ff}, {"n_heads", n_heads},
                          {"d_c", d_c}, {"d_r", d_r}, {"idx_heads", idx_heads}, {"idx_dim", idx_dim},
                          {"top_k", top_k}}) {
    if (auto s = positive(field, v); !s.ok()) return s;
  }
  if (d_r % 2 != 0) return absl::InvalidArgumentError(absl::StrCat("model config: d_r must be even, got ", d_r));
  if (local_window < 0) return absl::InvalidArgumentError("model config: local_window must be >= 0");
  if (!(rope_theta > 0.0f) || !(norm_eps > 0.0f)) {
    return absl::InvalidArgumentError("model config: rope_theta and norm_eps must be > 0");
  }
  if (layers.empty()) return absl::InvalidArgumentError("model config: no layers");
  const int n_src = n_sources();
  std::vector<int> readers(n_src, 0);
  std::vector<bool> written_by_write(n_src, false);
  for (const auto& l : layers) readers[l.source]++;
  for (int s = 0; s < n_src; ++s) {
    if (readers[s] == 0) return absl::InvalidArgumentError(absl::StrCat("model config: source ", s, " has no layer"));
  }
  std::vector<bool> seen(n_src, false);
  for (int i = 0; i < n_layers(); ++i) {
    const LayerSpec& l = layers[i];
    const std::string where = absl::StrCat("model config: layer ", i, " (", std::string(LayerKindName(l.kind)), ", source ",
                                           l.source, "): ");
    switch (l.kind) {
      case LayerKind::kWrite:
        if (seen[l.source]) return absl::InvalidArgumentError(where + "a write layer must be its source's first consumer");
        written_by_write[l.source] = true;
        break;
      case LayerKind::kReuse:
      case LayerKind::kReindex:
        if (!written_by_write[l.source]) {
          return absl::InvalidArgumentError(where + "needs an earlier write layer of the same source");
        }
        break;
      case LayerKind::kFollower:
        if (i == 0 || (layers[i - 1].kind != LayerKind::kProducer && layers[i - 1].kind != LayerKind::kFollower)) {
          return absl::InvalidArgumentError(where + "a follower must follow a producer or a follower");
        }
        [[fallthrough]];
      case LayerKind::kProducer:
        if (readers[l.source] != 1) {
          return absl::InvalidArgumentError(where + "producer/follower sources must not be shared with other layers");
        }
        break;
    }
    seen[l.source] = true;
  }
  return absl::OkStatus();
}

std::string ModelConfig::ToJson() const {
  nlohmann::json j;
  j["preset"] = preset;
  j["d_model"] = d_model;
  j["d_ff"] = d_ff;
  j["n_heads"] = n_heads;
  j["d_c"] = d_c;
  j["d_r"] = d_r;
  j["idx_heads"] = idx_heads;
  j["idx_dim"] = idx_dim;
  j["top_k"] = top_k;
  j["local_window"] = local_window;
  j["rope_theta"] = rope_theta;
  j["norm_eps"] = norm_eps;
  nlohmann::json ls = nlohmann::json::array();
  for (const auto& l : layers) {
    ls.push_back({{"kind", std::string(LayerKindName(l.kind))}, {"source", l.source}});
  }
  j["layers"] = ls;
  return j.dump();
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("model config: not a JSON object");
  ModelConfig c;
  try {
    c.preset = j.value("preset", std::string());
    c.d_model = j.at("d_model").get<int>();
    c.d_ff = j.at("d_ff").get<int>();
    c.n_heads = j.at("n_heads").get<int>();
    c.d_c = j.at("d_c").get<int>();
    c.d_r = j.at("d_r").get<int>();
    c.idx_heads = j.at("idx_heads").get<int>();
    c.idx_dim = j.at("idx_dim").get<int>();
    c.top_k = j.at("top_k").get<int>();
    c.local_window = j.at("local_window").get<int>();
    c.rope_theta = j.at("rope_theta").get<float>();
    c.norm_eps = j.at("norm_eps").get<float>();
    for (const auto& l : j.at("layers")) {
      auto kind = ParseLayerKind(l.at("kind").get<std::string>());
      if (!kind.ok()) return kind.status();
      const int64_t source = l.at("source").get<int64_t>();
      if (source < 0 || source > 1 << 20) {
        return absl::InvalidArgumentError(absl::StrCat("model config: bad source id ", source));
      }
      c.layers.push_back({*kind, static_cast<SourceId>(source)});
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", e.what()));
  }
  if (auto s = c.Validate(); !s.ok()) return s;
  return c;
}

absl::StatusOr<ModelConfig> PresetConfig(std::string_view name) {
  // One maker per name of kPresetNames, in its order.
  using Maker = ModelConfig (*)();
  static constexpr Maker kMakers[] = {Dsv4FlashLike, Glm5Like, BenchWide};
  static_assert(std::size(kMakers) == std::size(kPresetNames), "one maker per preset name");
  for (size_t i = 0; i < std::size(kPresetNames); ++i) {
    if (name == kPresetNames[i]) return kMakers[i]();
  }
  return absl::NotFoundError(absl::StrCat("unknown model preset '", std::string(name),
                                          "' (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
}

}  // namespace dhs::model
