#include "workerd/speculation/drafter_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "nlohmann/json.hpp"
#include "workerd/model/kernels.h"

namespace dhs::spec {

namespace kernels = model::kernels;

struct DrafterModel::Weights {
  struct Layer {
    std::vector<float> attn_norm, w_q, w_k, w_v, w_o, mlp_norm, w_up, w_down;
  };
  std::vector<float> tok_emb, feat_norm, w_in, final_norm, lm_head, w_feat;
  std::vector<Layer> layers;
};

namespace {

// The tensors of `c` in file order, each with the vector that holds it in `w` (null: specs only); one table for load,
// save and the spec list.
std::vector<std::pair<model::TensorSpec, std::vector<float>*>> TensorSlots(const DrafterConfig& c,
                                                                           DrafterModel::Weights* w) {
  const int64_t D = c.d_model, Dt = c.target_d_model, A = int64_t{c.n_heads} * c.head_dim, F = c.d_ff;
  const int64_t V = model::kVocab;
  auto at = [w](std::vector<float> DrafterModel::Weights::*field) { return w ? &(w->*field) : nullptr; };
  std::vector<std::pair<model::TensorSpec, std::vector<float>*>> out;
  out.push_back({{"tok_emb", {V, D}}, at(&DrafterModel::Weights::tok_emb)});
  out.push_back({{"feat_norm", {Dt}}, at(&DrafterModel::Weights::feat_norm)});
  out.push_back({{"w_in", {D, Dt}}, at(&DrafterModel::Weights::w_in)});
  for (int l = 0; l < c.n_layers; ++l) {
    auto* lw = w ? &w->layers[l] : nullptr;
    auto name = [l](const char* t) { return absl::StrCat("layers.", l, ".", t); };
    auto layer = [lw](std::vector<float> DrafterModel::Weights::Layer::*field) {
      return lw ? &(lw->*field) : nullptr;
    };
    using L = DrafterModel::Weights::Layer;
    out.push_back({{name("attn_norm"), {D}}, layer(&L::attn_norm)});
    out.push_back({{name("w_q"), {A, D}}, layer(&L::w_q)});
    out.push_back({{name("w_k"), {A, D}}, layer(&L::w_k)});
    out.push_back({{name("w_v"), {A, D}}, layer(&L::w_v)});
    out.push_back({{name("w_o"), {D, A}}, layer(&L::w_o)});
    out.push_back({{name("mlp_norm"), {D}}, layer(&L::mlp_norm)});
    out.push_back({{name("w_up"), {F, D}}, layer(&L::w_up)});
    out.push_back({{name("w_down"), {D, F}}, layer(&L::w_down)});
  }
  out.push_back({{"final_norm", {D}}, at(&DrafterModel::Weights::final_norm)});
  out.push_back({{"lm_head", {V, D}}, at(&DrafterModel::Weights::lm_head)});
  out.push_back({{"w_feat", {Dt, D}}, at(&DrafterModel::Weights::w_feat)});
  return out;
}
}  // namespace

absl::Status DrafterConfig::Validate() const {
  const std::pair<const char*, int> sizes[] = {{"target_d_model", target_d_model}, {"d_model", d_model},
                                               {"n_layers", n_layers},             {"n_heads", n_heads},
                                               {"head_dim", head_dim},             {"d_ff", d_ff}};
  for (const auto& [name, v] : sizes) {
    if (v < 1 || v > (1 << 16)) {
      return absl::InvalidArgumentError(absl::StrCat("drafter config: ", name, "=", v, " not in [1, 65536]"));
    }
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("drafter config: head_dim=", head_dim, " is odd (RoPE pairs)"));
  }
  if (window < 1 || window > (1 << 20) || k_max < 1 || k_max > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("drafter config: window=", window, " and k_max=", k_max, " must be in [1, 2^20]"));
  }
  if (!(rope_theta > 0.0f) || !(norm_eps > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("drafter config: rope_theta=", rope_theta, " and norm_eps=", norm_eps, " must be > 0"));
  }
  return absl::OkStatus();
}

std::string DrafterConfig::ToJson() const {
  nlohmann::json j = {{"target_d_model", target_d_model}, {"d_model", d_model}, {"n_layers", n_layers},
                      {"n_heads", n_heads}, {"head_dim", head_dim}, {"d_ff", d_ff}, {"window", window},
                      {"k_max", k_max}, {"rope_theta", rope_theta}, {"norm_eps", norm_eps}};
  return j.dump();
}

absl::StatusOr<DrafterConfig> DrafterConfig::FromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("drafter config: not a JSON object");
  DrafterConfig c;
  try {
    for (auto [name, field] : {std::pair{"target_d_model", &c.target_d_model}, {"d_model", &c.d_model},
                               {"n_layers", &c.n_layers}, {"n_heads", &c.n_heads}, {"head_dim", &c.head_dim},
                               {"d_ff", &c.d_ff}, {"window", &c.window}, {"k_max", &c.k_max}}) {
      *field = j.at(name).get<int>();
    }
    c.rope_theta = j.at("rope_theta").get<float>();
    c.norm_eps = j.at("norm_eps").get<float>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("drafter config: ", e.what()));
  }
  if (auto s = c.Validate(); !s.ok()) return s;
  return c;
}

std::vector<model::TensorSpec> DrafterTensorSpecs(const DrafterConfig& config) {
  std::vector<model::TensorSpec> specs;
  for (auto& [spec, slot] : TensorSlots(config, nullptr)) specs.push_back(spec);
  return specs;
}

absl::StatusOr<model::SafetensorsWriter> GenerateDrafterWeights(const DrafterConfig& config, uint64_t seed) {
  if (auto s = config.Validate(); !s.ok()) return s;
  model::SafetensorsWriter writer;
  if (auto s = model::AddSeededTensors(DrafterTensorSpecs(config), seed, writer); !s.ok()) return s;
  writer.SetMetadata("format", kDrafterFormat);
  writer.SetMetadata("seed", absl::StrCat(seed));
  writer.SetMetadata("config", config.ToJson());
  return writer;
}

DrafterModel::DrafterModel(DrafterConfig config, std::unique_ptr<Weights> weights,
                           std::map<std::string, std::string> metadata)
    : config_(std::move(config)), weights_(std::move(weights)), metadata_(std::move(metadata)) {}

DrafterModel::~DrafterModel() = default;

absl::StatusOr<std::unique_ptr<DrafterModel>> DrafterModel::FromSafetensors(const model::SafetensorsFile& file) {
  const auto& meta = file.metadata();
  auto format = meta.find("format");
  if (format == meta.end() || format->second != kDrafterFormat) {
    return absl::InvalidArgumentError(absl::StrCat("drafter weights: __metadata__ \"format\" is ",
                                                   format == meta.end() ? "missing" : "\"" + format->second + "\"",
                                                   ", expected \"", std::string(kDrafterFormat), "\""));
  }
  auto config_text = meta.find("config");
  if (config_text == meta.end()) return absl::InvalidArgumentError("drafter weights: __metadata__ has no \"config\"");
  absl::StatusOr<DrafterConfig> config = DrafterConfig::FromJson(config_text->second);
  if (!config.ok()) return config.status();
  auto w = std::make_unique<Weights>();
  w->layers.resize(config->n_layers);
  std::set<std::string> expected;
  for (auto& [spec, slot] : TensorSlots(*config, w.get())) {
    absl::StatusOr<std::vector<float>> data = file.ReadF32(spec.name, spec.shape);
    if (!data.ok()) return data.status();
    if (!std::all_of(data->begin(), data->end(), [](float v) { return std::isfinite(v); })) {
      return absl::InvalidArgumentError(
          absl::StrCat("drafter weights: tensor '", spec.name, "' holds a non-finite value"));
    }
    *slot = std::move(*data);
    expected.insert(spec.name);
  }
  for (const auto& [name, info] : file.tensors()) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("drafter weights: unexpected tensor '", name, "' for this config"));
    }
  }
  return std::unique_ptr<DrafterModel>(new DrafterModel(*config, std::move(w), meta));
}

absl::StatusOr<std::unique_ptr<DrafterModel>> DrafterModel::Load(const std::string& path) {
  absl::StatusOr<model::SafetensorsFile> file = model::SafetensorsFile::Load(path);
  if (!file.ok()) return file.status();
  return FromSafetensors(*file);
}

model::SafetensorsWriter DrafterModel::ToSafetensors() const {
  model::SafetensorsWriter writer;
  for (auto& [spec, slot] : TensorSlots(config_, weights_.get())) {
    DHS_CHECK_OK(writer.AddF32(spec.name, spec.shape, *slot));  // shapes were checked at load: cannot fail
  }
  for (const auto& [key, value] : metadata_) writer.SetMetadata(key, value);  // format and config included
  return writer;
}

absl::StatusOr<std::unique_ptr<DrafterModel>> DrafterModel::WithOutputLayers(std::span<const float> lm_head,
                                                                             std::span<const float> w_feat,
                                                                             const std::string& meta_key,
                                                                             const std::string& meta_value) const {
  if (lm_head.size() != weights_->lm_head.size() || w_feat.size() != weights_->w_feat.size()) {
    return absl::InvalidArgumentError(absl::StrCat("drafter output layers: lm_head has ", lm_head.size(),
                                                   " floats (want ", weights_->lm_head.size(), "), w_feat ",
                                                   w_feat.size(), " (want ", weights_->w_feat.size(), ")"));
  }
  auto w = std::make_unique<Weights>(*weights_);
  w->lm_head.assign(lm_head.begin(), lm_head.end());
  w->w_feat.assign(w_feat.begin(), w_feat.end());
  std::map<std::string, std::string> meta = metadata_;
  meta[meta_key] = meta_value;
  return std::unique_ptr<DrafterModel>(new DrafterModel(config_, std::move(w), std::move(meta)));
}

// One forward's buffers, one row per query.
struct DrafterModel::Scratch {
  size_t Q = 0;
  std::vector<float> x, xn, feat, q, k, v, o, delta, ff;
};

void DrafterModel::Embed(std::span<const DrafterQuery> queries, Scratch& s) const {
  const DrafterConfig& c = config_;
  const int D = c.d_model, Dt = c.target_d_model;
  s.feat.assign(s.Q * Dt, 0.0f);
  for (size_t i = 0; i < s.Q; ++i) {
    const float* e = weights_->tok_emb.data() + static_cast<size_t>(queries[i].token) * D;
    std::copy(e, e + D, s.x.data() + i * D);
    if (!queries[i].feature.empty()) {
      kernels::RmsNorm(queries[i].feature.data(), weights_->feat_norm.data(), Dt, c.norm_eps, s.feat.data() + i * Dt);
    }
  }
  kernels::MatMul(weights_->w_in.data(), D, Dt, s.feat.data(), Dt, static_cast<int>(s.Q), s.delta.data(), D);
  for (size_t i = 0; i < s.Q; ++i) {
    if (queries[i].feature.empty()) continue;  // no feature: x is the embedding alone
    for (int d = 0; d < D; ++d) s.x[i * D + d] += s.delta[i * D + d];
  }
}

// Head attention of one query over positions max(0, t-W+1) .. t of its slot's ring (ascending).
void DrafterModel::Attend(int l, const DrafterQuery& query, const float* q, const DraftRingGeometry& geometry,
                          std::span<const float> ring, float* o) const {
  const DrafterConfig& c = config_;
  const int H = c.n_heads, dh = c.head_dim, A = H * dh;
  const size_t row_floats = static_cast<size_t>(c.row_floats()), layer_off = static_cast<size_t>(l) * 2 * A;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const Position first = std::max<Position>(0, query.position - c.window + 1);
  auto row = [&](Position p) { return ring.data() + geometry.Row(query.slot, p) * row_floats + layer_off; };
  for (int h = 0; h < H; ++h) {
    const float* qh = q + h * dh;
    float max_logit = -std::numeric_limits<float>::infinity();
    for (Position p = first; p <= query.position; ++p) {
      max_logit = std::max(max_logit, kernels::Dot(qh, row(p) + h * dh, dh) * scale);
    }
    float* oh = o + h * dh;
    std::fill(oh, oh + dh, 0.0f);
    float sum = 0.0f;
    for (Position p = first; p <= query.position; ++p) {
      const float e = std::exp(kernels::Dot(qh, row(p) + h * dh, dh) * scale - max_logit);
      sum += e;
      kernels::Axpy(e, row(p) + A + h * dh, dh, oh);
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < dh; ++d) oh[d] *= inv;
  }
}

void DrafterModel::AttentionLayer(int l, std::span<const DrafterQuery> queries, const DraftRingGeometry& geometry,
                                  std::span<float> ring, Scratch& s) const {
  const DrafterConfig& c = config_;
  const Weights::Layer& lw = weights_->layers[l];
  const int D = c.d_model, H = c.n_heads, dh = c.head_dim, A = H * dh, Q = static_cast<int>(s.Q);
  const size_t row_floats = static_cast<size_t>(c.row_floats()), layer_off = static_cast<size_t>(l) * 2 * A;
  for (size_t i = 0; i < s.Q; ++i) {
    kernels::RmsNorm(s.x.data() + i * D, lw.attn_norm.data(), D, c.norm_eps, s.xn.data() + i * D);
  }
  kernels::MatMul(lw.w_q.data(), A, D, s.xn.data(), D, Q, s.q.data(), A);
  kernels::MatMul(lw.w_k.data(), A, D, s.xn.data(), D, Q, s.k.data(), A);
  kernels::MatMul(lw.w_v.data(), A, D, s.xn.data(), D, Q, s.v.data(), A);
  for (size_t i = 0; i < s.Q; ++i) {  // every row of the call first: a query reads the rows of its own block
    for (int h = 0; h < H; ++h) {
      kernels::Rope(s.q.data() + i * A + h * dh, dh, queries[i].position, c.rope_theta);
      kernels::Rope(s.k.data() + i * A + h * dh, dh, queries[i].position, c.rope_theta);
    }
    float* row = ring.data() + geometry.Row(queries[i].slot, queries[i].position) * row_floats + layer_off;
    std::copy(s.k.data() + i * A, s.k.data() + (i + 1) * A, row);
    std::copy(s.v.data() + i * A, s.v.data() + (i + 1) * A, row + A);
  }
  for (size_t i = 0; i < s.Q; ++i) Attend(l, queries[i], s.q.data() + i * A, geometry, ring, s.o.data() + i * A);
  kernels::MatMul(lw.w_o.data(), D, A, s.o.data(), A, Q, s.delta.data(), D);
  for (size_t i = 0; i < s.x.size(); ++i) s.x[i] += s.delta[i];
}

void DrafterModel::MlpLayer(int l, Scratch& s) const {
  const DrafterConfig& c = config_;
  const Weights::Layer& lw = weights_->layers[l];
  const int D = c.d_model, Q = static_cast<int>(s.Q);
  for (size_t i = 0; i < s.Q; ++i) {
    kernels::RmsNorm(s.x.data() + i * D, lw.mlp_norm.data(), D, c.norm_eps, s.xn.data() + i * D);
  }
  kernels::MatMul(lw.w_up.data(), c.d_ff, D, s.xn.data(), D, Q, s.ff.data(), c.d_ff);
  for (size_t i = 0; i < s.Q; ++i) kernels::Silu(s.ff.data() + i * c.d_ff, c.d_ff);
  kernels::MatMul(lw.w_down.data(), D, c.d_ff, s.ff.data(), c.d_ff, Q, s.delta.data(), D);
  for (size_t i = 0; i < s.x.size(); ++i) s.x[i] += s.delta[i];
}

void DrafterModel::Forward(std::span<const DrafterQuery> queries, const DraftRingGeometry& geometry,
                           std::span<float> ring, DrafterOutput& out) const {
  const DrafterConfig& c = config_;
  const int D = c.d_model, A = c.n_heads * c.head_dim;
  Scratch s;
  s.Q = queries.size();
  s.x.resize(s.Q * D);
  s.xn.resize(s.Q * D);
  s.delta.resize(s.Q * D);
  s.q.resize(s.Q * A);
  s.k.resize(s.Q * A);
  s.v.resize(s.Q * A);
  s.o.resize(s.Q * A);
  s.ff.resize(s.Q * c.d_ff);
  Embed(queries, s);
  for (int l = 0; l < c.n_layers; ++l) {
    AttentionLayer(l, queries, geometry, ring, s);
    MlpLayer(l, s);
  }
  for (size_t i = 0; i < s.Q; ++i) {
    kernels::RmsNorm(s.x.data() + i * D, weights_->final_norm.data(), D, c.norm_eps, s.xn.data() + i * D);
  }
  const int Q = static_cast<int>(s.Q);
  out.logits.resize(s.Q * model::kVocab);
  out.features.resize(s.Q * c.target_d_model);
  out.hidden.assign(s.xn.begin(), s.xn.end());
  kernels::MatMul(weights_->lm_head.data(), model::kVocab, D, s.xn.data(), D, Q, out.logits.data(), model::kVocab);
  kernels::MatMul(weights_->w_feat.data(), c.target_d_model, D, s.xn.data(), D, Q, out.features.data(),
                  c.target_d_model);
}

}  // namespace dhs::spec
