// workerd/speculation/synthetic_proposer.h: FOR BENCHMARKS ONLY, never the default proposal mode (issue 13, "Proposal
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
//
// SyntheticProposer (a spec::Proposer, FOR BENCHMARKS AND TESTS ONLY): gets the continuation by running the target
// greedily on a private resident session per slot (its own ResidentKvAccess, host memory), then corrupts it with
// SyntheticProposals. Per Propose batch: one batched Step feeds each slot's newly committed tokens before the
// anchor, then max_proposals batched one-token Steps feed the anchor and extend the greedy continuation, which is
// then rolled back to the anchor (Model::BeginVerification / EndVerification): the private session holds committed
// tokens only. Its compute is about K_r target steps per round (not a drafter's cost: benchmarks report the
// proposer's time apart). A slot starts from the request's prepared prefix when the DraftRequest can import it
// (DraftRequest::import_history, issue 27): over a 32K-token prepared prefix the slot then catches up its own suffix
// only, instead of (L + suffix) / catch_up rounds of nothing.
#pragma once

#include <memory>
#include <optional>

#include "workerd/model/model.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/speculation/proposer.h"

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "workerd/model/config.h"
#include "workerd/speculation/acceptance.h"

namespace dhs::spec {

// Proposals x_1 .. x_n (n = continuation.size()) for a round at frontier key.frontier.
absl::StatusOr<std::vector<model::Token>> SyntheticProposals(std::span<const model::Token> continuation,
                                                             double corruption, const RoundKey& key);

class SyntheticProposer final : public Proposer {
 public:
  // `model` must outlive the proposer; `slots` >= 1 request slots; `corruption` in [0, 1]; `arena_bytes`: the
  // private resident store shared by the slots (rows of every source of every position a slot fed; host memory).
  // Errors: INVALID_ARGUMENT (null model, slots < 1, corruption outside [0, 1], an arena below one page).
  // `catch_up_tokens` (>= 1): the most history tokens one Propose feeds a slot's private session, so that a long
  // prompt never stalls the caller's loop; a slot still behind gets no proposals this round (an empty result).
  static absl::StatusOr<std::unique_ptr<SyntheticProposer>> Create(const model::Model* model, int slots,
                                                                  double corruption, size_t arena_bytes,
                                                                  int64_t catch_up_tokens = 64);

  // Errors (Proposer): INVALID_ARGUMENT (slot outside [0, slots), out.size() != batch.size(), a slot twice, no
  // tokens), FAILED_PRECONDITION (the slot's previous round not committed), RESOURCE_EXHAUSTED (the private arena is
  // full: the slot's state is dropped, a later Propose starts it again), or the model's error. A failed call leaves
  // every slot as it was, or released (started again, its prefix copied again, at its next Propose).
  absl::Status Propose(std::span<const DraftRequest> batch, std::span<DraftResult> out) override;
  absl::Status Commit(int slot, int64_t accepted) override;
  void Release(int slot) override;

  // Positions the private sessions fed, continuation steps included (the proposer's cost, in target positions).
  uint64_t reference_positions() const { return reference_positions_; }
  // Positions copied into the private sessions from prepared prefixes (DraftRequest::import_history; not computed).
  uint64_t imported_positions() const { return imported_positions_; }
  // Slots whose copy failed (DraftRequest::import_history returned an error, or claimed the whole history): each
  // caught up by itself instead.
  uint64_t import_failures() const { return import_failures_; }

 private:
  struct Slot {
    RequestId request = 0;
    std::optional<model::ModelSession> session;
    std::vector<model::Token> fed;  // tokens the session holds, positions 0 .. fed.size()-1
    bool pending = false;           // proposed, not committed yet
    int64_t proposed = 0;
  };
  SyntheticProposer(const model::Model* model, int slots, double corruption, size_t arena_bytes, int64_t catch_up);
  void Reset(Slot& slot, RequestId request);
  // Reset, then r's prepared prefix copied into the slot's session when r can import it (r.import_history); a copy
  // that fails leaves the slot reset (counted in import_failures), never fails the batch.
  void Start(Slot& slot, const DraftRequest& r);
  // Feeds each slot's tokens beyond `fed` up to the anchor, excluded, at most catch_up_ per slot (one batched
  // Step). ready[b]: slot b's session holds every token before the anchor.
  absl::Status CatchUp(std::span<const DraftRequest> batch, std::vector<bool>& ready);
  // The greedy continuation of every ready slot of `batch`: out[b] has batch[b].max_proposals tokens (none when not
  // ready).
  absl::Status Continue(std::span<const DraftRequest> batch, const std::vector<bool>& ready,
                        std::vector<std::vector<model::Token>>& out);

  const model::Model* model_;
  double corruption_;
  int64_t catch_up_;
  model::ResidentKvAccess kv_;
  std::vector<Slot> slots_;
  uint64_t reference_positions_ = 0;
  uint64_t imported_positions_ = 0;
  uint64_t import_failures_ = 0;
};

}  // namespace dhs::spec
