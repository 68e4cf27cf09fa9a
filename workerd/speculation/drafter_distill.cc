#include "workerd/speculation/drafter_distill.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_format.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/sampling.h"

namespace dhs::spec {
namespace {

constexpr size_t kPageRows = 16;

// A resident KV store holding `positions` rows of every source of the target.
std::unique_ptr<model::ResidentKvAccess> KvFor(const model::ModelConfig& c, size_t positions) {
  const size_t pages = positions / kPageRows + 1;
  return model::ResidentKvAccess::ForModel(c, pages * kPageRows * c.row_bytes() * c.n_sources(), kPageRows);
}

// Normal equations of the two ridge regressions: G = Σ h hᵀ (D x D), Bz = Σ z hᵀ (kVocab x D),
// Bf = Σ f hᵀ (Dt x D).
struct Normal {
  int D = 0, Dt = 0;
  int64_t positions = 0;
  std::vector<double> G, Bz, Bf;
};

void Accumulate(const float* h, const float* z, const float* f, Normal& n) {
  const int D = n.D;
  double mean = 0.0;
  for (int v = 0; v < model::kVocab; ++v) mean += z[v];
  mean /= model::kVocab;
  for (int i = 0; i < D; ++i) {
    for (int j = 0; j < D; ++j) n.G[i * D + j] += double{h[i]} * h[j];
  }
  for (int v = 0; v < model::kVocab; ++v) {
    for (int j = 0; j < D; ++j) n.Bz[v * D + j] += (z[v] - mean) * h[j];
  }
  for (int v = 0; v < n.Dt; ++v) {
    for (int j = 0; j < D; ++j) n.Bf[v * D + j] += double{f[v]} * h[j];
  }
  ++n.positions;
}

// Rows of W = B A^-1 with A = G + λ n I (symmetric positive definite): Cholesky A = L Lᵀ, then per row of B two
// triangular solves (W rows are A^-1 b since A is symmetric).
std::vector<float> SolveRidge(const Normal& n, const std::vector<double>& B, double ridge) {
  const int D = n.D;
  std::vector<double> L(n.G);
  for (int i = 0; i < D; ++i) L[i * D + i] += ridge * static_cast<double>(n.positions);
  for (int j = 0; j < D; ++j) {
    for (int k = 0; k < j; ++k) L[j * D + j] -= L[j * D + k] * L[j * D + k];
    L[j * D + j] = std::sqrt(L[j * D + j]);
    for (int i = j + 1; i < D; ++i) {
      for (int k = 0; k < j; ++k) L[i * D + j] -= L[i * D + k] * L[j * D + k];
      L[i * D + j] /= L[j * D + j];
    }
  }
  const size_t rows = B.size() / D;
  std::vector<float> W(B.size());
  std::vector<double> y(D);
  for (size_t r = 0; r < rows; ++r) {
    for (int i = 0; i < D; ++i) {  // L y = b
      double s = B[r * D + i];
      for (int k = 0; k < i; ++k) s -= L[i * D + k] * y[k];
      y[i] = s / L[i * D + i];
    }
    for (int i = D - 1; i >= 0; --i) {  // Lᵀ w = y
      double s = y[i];
      for (int k = i + 1; k < D; ++k) s -= L[k * D + i] * y[k];
      y[i] = s / L[i * D + i];
    }
    for (int i = 0; i < D; ++i) W[r * D + i] = static_cast<float>(y[i]);
  }
  return W;
}

// The drafter's final hidden state at every position of `text`, fed as in its catch-up (features = the target's).
std::vector<float> DrafterHidden(const DrafterModel& drafter, std::span<const model::Token> text,
                                 std::span<const float> target_hidden) {
  const DrafterConfig& c = drafter.config();
  const DraftRingGeometry geometry =
      *DraftRingGeometry::Create({.window = c.window, .k_max = c.k_max, .page_rows = 1, .slots = 1});
  std::vector<float> ring(static_cast<size_t>(geometry.total_rows() * c.row_floats()));
  std::vector<float> hidden;
  DrafterOutput out;
  std::vector<DrafterQuery> queries;
  for (size_t at = 0; at < text.size(); at += static_cast<size_t>(c.k_max)) {
    queries.clear();
    for (size_t t = at; t < std::min(text.size(), at + c.k_max); ++t) {
      std::span<const float> f;
      if (t > 0) f = target_hidden.subspan((t - 1) * c.target_d_model, c.target_d_model);
      queries.push_back({0, static_cast<Position>(t), text[t], f});
    }
    drafter.Forward(queries, geometry, ring, out);
    hidden.insert(hidden.end(), out.hidden.begin(), out.hidden.end());
  }
  return hidden;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<model::Token>>> SampleTargetTexts(const model::Model& target, int count,
                                                                         int length, uint64_t seed) {
  std::vector<std::vector<model::Token>> texts;
  for (int i = 0; i < count; ++i) {
    auto kv = KvFor(target.config(), static_cast<size_t>(length));
    model::ModelSession s = target.NewSession(static_cast<RequestId>(i + 1));
    const uint64_t stream = static_cast<uint64_t>(i);
    std::vector<model::Token> text = {
        static_cast<model::Token>(model::UniformAt({seed, stream, 0, 0}) * model::kVocab)};
    while (static_cast<int>(text.size()) < length) {
      model::StepInput in{&s, std::span<const model::Token>(&text.back(), 1)};
      model::StepOutput out;
      if (absl::Status st = target.Step(std::span(&in, 1), *kv, std::span(&out, 1)); !st.ok()) return st;
      text.push_back(model::Sample(out.logits, {.temperature = 1.0f}, {seed, stream, text.size(), 0}));
    }
    texts.push_back(std::move(text));
  }
  return texts;
}

absl::StatusOr<std::unique_ptr<DrafterModel>> DistillOutputLayers(const DrafterModel& drafter,
                                                                  const model::Model& target,
                                                                  std::span<const std::vector<model::Token>> texts,
                                                                  const DistillOptions& options) {
  const DrafterConfig& c = drafter.config();
  if (c.target_d_model != target.config().d_model || !(options.ridge > 0.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "distill: drafter for d_model %d, target d_model %d, ridge %g (> 0)", c.target_d_model,
        target.config().d_model, options.ridge));
  }
  Normal n;
  n.D = c.d_model;
  n.Dt = c.target_d_model;
  n.G.assign(static_cast<size_t>(n.D) * n.D, 0.0);
  n.Bz.assign(static_cast<size_t>(model::kVocab) * n.D, 0.0);
  n.Bf.assign(static_cast<size_t>(n.Dt) * n.D, 0.0);
  for (const std::vector<model::Token>& text : texts) {
    if (text.size() < 2) continue;
    auto kv = KvFor(target.config(), text.size());
    model::ModelSession s = target.NewSession(1);
    model::StepInput in{&s, text, true};
    model::StepOutput out;
    if (absl::Status st = target.Step(std::span(&in, 1), *kv, std::span(&out, 1)); !st.ok()) return st;
    const std::vector<float> h = DrafterHidden(drafter, text, out.hidden);
    for (size_t t = 0; t < text.size(); ++t) {
      Accumulate(h.data() + t * n.D, out.logits.data() + t * model::kVocab, out.hidden.data() + t * n.Dt, n);
    }
  }
  if (n.positions == 0) return absl::InvalidArgumentError("distill: no text of at least 2 tokens");
  const std::vector<float> lm_head = SolveRidge(n, n.Bz, options.ridge);
  const std::vector<float> w_feat = SolveRidge(n, n.Bf, options.ridge);
  return drafter.WithOutputLayers(
      lm_head, w_feat, "distilled",
      absl::StrFormat("lm_head and w_feat fitted by ridge regression (lambda %g) on %d positions of %d texts",
                      options.ridge, n.positions, texts.size()));
}

}  // namespace dhs::spec
