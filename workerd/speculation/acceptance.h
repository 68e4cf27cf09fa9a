// workerd/speculation/acceptance.h: acceptance of one speculative round of one request (brief §6 "Acceptance"; Leviathan,
// Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding", ICML 2023, Algorithm 1).
//
// A round of request r has K_r target queries: the anchor (j = 0, the token at position n_r) and K_r - 1 proposals
// x_1 .. x_{K_r-1} at positions n_r + 1 .. n_r + K_r - 1. Query j's logits give p_j, the target's distribution of the
// token at position n_r + j + 1, so proposal x_j is judged by p_{j-1} against the drafter's q_j:
//   - sampling mode: x_j is accepted iff u_j * q_j(x_j) < p_{j-1}(x_j) (probability min(1, p/q)), u_j uniform in
//     [0, 1); at the first rejection the correction is sampled from norm(max(0, p_{j-1} - q_j)); if all K_r - 1 are
//     accepted the bonus is sampled from p_{K_r-1}. The emitted tokens are then distributed exactly as the target's own
//     samples. (If rounding leaves max(0, p - q) with no mass after a rejection, the correction is drawn from p.)
//   - greedy mode: x_j is accepted iff it equals Argmax of query j-1's logits (lowest id on ties); the correction or
//     bonus is that argmax. Identical to non-speculative greedy decoding.
// A_r = accepted proposals (0 .. K_r - 1); emitted = x_1 .. x_{A_r}, then the correction or bonus b_r; A_r + 1 tokens,
// and the positions n_r .. n_r + A_r are committed (frontier n_r + A_r + 1, where b_r is the next anchor).
//
// Draws: KeyedUniform with (seed, request, position, purpose): the acceptance of x_j at n_r + j (kAccept), the
// correction at n_r + j (kCorrection), the bonus at n_r + K_r (kBonus). A round is reproducible from its inputs.
// Errors: INVALID_ARGUMENT (sizes, token ids, q not a distribution or q(x_j) = 0, p not a distribution, n_r outside
// [0, 2^56 - K_r - 1]); nothing else. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "workerd/model/config.h"
#include "workerd/model/sampling.h"

namespace dhs::spec {

enum class AcceptMode { kSampling, kGreedy };

// One proposal: its token and the drafter's distribution q (kVocab probabilities summing to 1 within 1e-6;
// may be empty in greedy mode).
struct Proposal {
  model::Token token = 0;
  std::span<const double> q;
};

struct RoundOutcome {
  int32_t accepted = 0;               // A_r
  std::vector<model::Token> emitted;  // A_r + 1 tokens: accepted proposals, then the correction or bonus
  bool bonus = false;                 // every proposal was accepted
};

// Where a round's draws come from.
struct RoundKey {
  uint64_t seed = 0;
  RequestId request = 0;
  Position frontier = 0;  // n_r: the anchor's position
};

// Sampling-mode acceptance with the target distributions given: p holds K_r rows of kVocab probabilities (row j =
// p_j), proposals K_r - 1 entries.
absl::StatusOr<RoundOutcome> AcceptWithDistributions(std::span<const std::vector<double>> p,
                                                     std::span<const Proposal> proposals, const RoundKey& key);

// The round from the target's logits (K_r * kVocab floats, query-major): sampling mode uses
// model::SamplingDistribution(row, params) as p_j (only the rows it needs); greedy mode uses model::Argmax(row) and
// ignores params and q.
absl::StatusOr<RoundOutcome> AcceptRound(AcceptMode mode, std::span<const float> target_logits,
                                         const model::SamplingParams& params, std::span<const Proposal> proposals,
                                         const RoundKey& key);

}  // namespace dhs::spec
