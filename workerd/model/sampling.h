// workerd/model/sampling.h: token choice from logits: greedy argmax and a seeded temperature / top-p sampler.
//
// Tie rules: Argmax returns the lowest token id among equal maxima (NaN never wins; all NaN -> 0). The top-p nucleus
// orders tokens by probability descending, then token id ascending.
// Thread-safety: pure functions; the generator passed in is the caller's.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "workerd/model/config.h"

namespace dhs::model {

struct SamplingParams {
  float temperature = 1.0f;  // <= 0 means greedy
  float top_p = 1.0f;        // nucleus mass in (0, 1]
};

// Greedy choice over `logits` (256 floats): the highest logit, lowest id on ties.
Token Argmax(std::span<const float> logits);

// The sampling distribution p (256 probabilities, in double) after temperature and top-p truncation: softmax of
// logits / temperature, then only the smallest prefix of the (prob desc, id asc) order whose mass reaches top_p
// keeps its probability, renormalised. temperature <= 0 gives a one-hot at Argmax. Used for sampling and for
// speculative acceptance (brief §6: p(x)).
std::vector<double> SamplingDistribution(std::span<const float> logits, const SamplingParams& params);

// Draws a token from a distribution (ids with probability 0 are never drawn) with one 53-bit draw of `rng`.
Token SampleFrom(std::span<const double> probs, std::mt19937_64& rng);

// SampleFrom(SamplingDistribution(logits, params), rng); greedy (no draw) when temperature <= 0.
Token Sample(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng);

}  // namespace dhs::model
