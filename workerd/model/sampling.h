// workerd/model/sampling.h: token choice from logits: greedy argmax and a seeded temperature / top-p sampler.
//
// Tie rules: Argmax returns the lowest token id among equal maxima (NaN never wins; all NaN -> 0). The top-p nucleus
// orders tokens by probability descending, then token id ascending.
//
// Recoverable sampling (issue 11, resume): the worker draws token t of a request from a counter-based generator
// (Philox4x32-10 of Random123, Debian librandom123-dev) keyed by (seed, the client's request id, t) -- DrawKey, no
// state carried from one token to the next -- so a restarted worker that resumes the request at token t draws exactly
// what the dead one would have drawn.
// Thread-safety: pure functions; the generator passed to the std::mt19937_64 overloads is the caller's.
#pragma once

#include <array>
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

// The key of one draw: the request's sampling seed (SubmitRequest.seed), a stream that is stable for the request's
// life, restarts included (the worker uses the client's request id, SubmitRequest.request), and the index of the
// generated token (0 = the first generated token).
// `purpose` tells apart several draws at one position (0: the token's own sample; speculative decoding's acceptance,
// correction and bonus draws use others, workerd/speculation/keyed_draw.h). Positions must be below 2^56.
struct DrawKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
  uint64_t position = 0;
  uint8_t purpose = 0;
};

// The four 32-bit words of Philox4x32-10 (Salmon et al., SC'11; Random123) with key = seed and counter =
// (stream lo, stream hi, position lo, purpose << 24 | position bits 32..55). The one counter-based generator of the
// worker: plain sampling and speculative decoding both draw from it.
std::array<uint32_t, 4> DrawBits(const DrawKey& key);

// The uniform draw of `key`, in [0, 1) with 53 bits: the top 53 bits of DrawBits' first 64-bit output word
// (word 1 << 32 | word 0), times 2^-53. A pure function of `key`.
double UniformAt(const DrawKey& key);

// Draws a token from a distribution (ids with probability 0 are never drawn) at the uniform `u` in [0, 1): the first
// id (ascending) whose cumulative mass exceeds u * total mass (the last id with mass if rounding leaves none).
Token SampleAt(std::span<const double> probs, double u);

// SampleAt(probs, one 53-bit draw of `rng`).
Token SampleFrom(std::span<const double> probs, std::mt19937_64& rng);

// SampleAt(SamplingDistribution(logits, params), UniformAt(key)); greedy (no draw) when temperature <= 0.
Token Sample(std::span<const float> logits, const SamplingParams& params, const DrawKey& key);
// The same with a stateful generator (one 53-bit draw of `rng`): not recoverable across a restart; the worker uses
// the DrawKey overload.
Token Sample(std::span<const float> logits, const SamplingParams& params, std::mt19937_64& rng);

}  // namespace dhs::model
