// workerd/spec/synthetic_proposer.h: FOR BENCHMARKS ONLY, never the default proposal mode (issue 13, "Proposal
// modes"): proposes the target's own greedy continuation, each token corrupted with probability `corruption`, so that
// acceptance can be swept. With greedy acceptance each proposal is then accepted independently with probability
// 1 - corruption (until the first corrupted one), so the mean acceptance length is
// ExpectedAcceptanceLength(1 - corruption, K) (block_width.h).
//
// The continuation (the tokens greedy decoding emits at positions n_r + 1 ..) is an input: the caller obtains it, e.g.
// from a recorded plain greedy run of the same prompt. A corrupted token is drawn uniformly among the other
// kVocab - 1 ids (word 1 mod 255: bias below 1e-10). Draws: KeyedBits with (seed, request, position n_r + j,
// kDraft): word 0 decides the corruption (a 32-bit uniform against corruption * 2^32), word 1 picks the replacement.
// The proposer's q is one-hot at its proposal (pass that q for sampling-mode acceptance; greedy mode needs none).
// Errors: INVALID_ARGUMENT for corruption outside [0, 1], a continuation token outside [0, kVocab), a frontier outside
// [0, 2^56 - count - 1]. Thread-safety: pure.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "workerd/model/config.h"
#include "workerd/spec/acceptance.h"

namespace dhs::spec {

// Proposals x_1 .. x_n (n = continuation.size()) for a round at frontier key.frontier.
absl::StatusOr<std::vector<model::Token>> SyntheticProposals(std::span<const model::Token> continuation,
                                                             double corruption, const RoundKey& key);

}  // namespace dhs::spec
