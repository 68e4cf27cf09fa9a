// workerd/speculation/drafter_distill.h: a tiny distillation of the drafter's output layers on the target (issue 13,
// optional part): with generated weights the drafter is random and its proposals are almost never accepted; fitting
// its two output layers to the target makes them useful without training the rest.
//
// Data: texts the target generated (SampleTargetTexts: keyed temperature-1 sampling from the target, so the data is a
// pure function of the seed). For each text the target runs once (model::Step with want_hidden) and the drafter runs
// over it as in its catch-up (features = the target's hidden states), giving per position t the drafter's final hidden
// h_d(t) (D floats), the target's logits z(t) (the distribution of token t+1, the drafter's prediction target) and
// the target's final hidden state f(t) (what the drafter's predicted feature f_t stands for).
// Fit (closed form, double precision): lm_head = argmin_W Σ_t ||W h_d(t) - (z(t) - mean z(t))||² + λ n ||W||²
// (logit matching; softmax ignores the per-row mean) and w_feat = argmin_W Σ_t ||W h_d(t) - f(t)||² + λ n ||W||²,
// both W = B (G + λ n I)^-1 with G = Σ h_d h_dᵀ (Cholesky). Everything else of the drafter is unchanged.
// Thread-safety: pure functions (the models are read only).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "workerd/model/model.h"
#include "workerd/speculation/drafter_model.h"

namespace dhs::spec {

// `count` texts of `length` tokens: text i starts with one keyed uniform byte (seed, stream i, position 0) and
// continues with model::Sample at temperature 1 keyed by (seed, stream i, position). Errors: the target's Step.
absl::StatusOr<std::vector<std::vector<model::Token>>> SampleTargetTexts(const model::Model& target, int count,
                                                                         int length, uint64_t seed);

struct DistillOptions {
  double ridge = 1e-3;  // λ (per position: the penalty is λ * positions * ||W||²); > 0
};

// The drafter with lm_head and w_feat fitted on `texts` (each >= 2 tokens); __metadata__ gains "distilled"
// (texts, positions, ridge). Errors: INVALID_ARGUMENT (the drafter does not pair with the target, no text of >= 2
// tokens, a token outside [0, kVocab), ridge <= 0), or the target's Step error.
absl::StatusOr<std::unique_ptr<DrafterModel>> DistillOutputLayers(const DrafterModel& drafter,
                                                                  const model::Model& target,
                                                                  std::span<const std::vector<model::Token>> texts,
                                                                  const DistillOptions& options);

}  // namespace dhs::spec
