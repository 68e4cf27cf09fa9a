// workerd/speculation/proposer.h: the seam between the worker's speculative round and whatever proposes the tokens
// (brief §6 "Proposal modes"; issue 13). The worker owns verification (one target pass of K_r queries per request,
// acceptance, commit); a Proposer owns the drafting: the built-in drafter (fixed block or confidence prefix) or, for
// benchmarks only, the synthetic proposer.
//
// A round of request r (conventions of acceptance.h): the anchor is the token at position n_r (the frontier; emitted
// by the previous round or the last plain step, not yet fed to the target); the proposer returns up to
// `max_proposals` = K_r - 1 tokens x_1 .. for positions n_r + 1 .., each with its q (the drafter's distribution it was
// drawn from, kVocab probabilities; one-hot for a deterministic proposer). After verification the worker calls
// Commit(slot, A_r): the proposer keeps the state of the accepted prefix only (a drafter's ring advances by
// A_r + 1 positions: the anchor and the accepted proposals) and drops the rest.
//
// Draws a proposer makes are keyed (keyed_draw.h, DrawPurpose::kDraft) by (seed, request, position): a round is
// reproducible whatever the batch. Errors: INVALID_ARGUMENT (a slot outside the configured slots, sizes that do not
// match, a request whose state the proposer does not hold), FAILED_PRECONDITION (Propose before Commit of the
// slot's previous round); a failing call changes nothing. Thread-safety: none; the worker thread calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "workerd/kv_access.h"
#include "workerd/model/config.h"
#include "workerd/model/model.h"
#include "workerd/speculation/acceptance.h"

namespace dhs::spec {

// One request of a drafting batch.
struct DraftRequest {
  int slot = 0;                                // request slot 0 .. N-1 (the draft ring's slot)
  RoundKey key;                                // seed, request, frontier n_r (the anchor's position)
  std::span<const model::Token> tokens;        // every token at positions 0 .. n_r (prompt, committed, anchor last)
  // The target's final hidden state (d_model floats) of each position the target fed since this slot's last
  // Commit (oldest first, ending at n_r - 1); a drafter conditioned on the target reads it. May be empty for a
  // proposer that does not use it.
  std::span<const float> target_hidden;
  int64_t max_proposals = 0;                   // K_r - 1 >= 0
  bool greedy = false;                         // a greedy request: argmax proposals (one-hot q) if the proposer draws
  // Optional (issue 27): copies the request's prepared prefix, rows the target already computed once (the worker's
  // prefix row cache), into a fresh private session of the target model on the given KV store, without compute
  // (Model::ImportRows), and returns the positions copied: 0 .. n-1 of `tokens`, n < tokens.size() (0: none). A
  // proposer that keeps a private copy of the target's history (the synthetic proposer) calls it when it starts the
  // request's slot, instead of recomputing those positions. Errors: the model's.
  std::function<absl::StatusOr<Position>(model::ModelSession&, KvAccess&)> import_history;
};

// What a proposer returns for one DraftRequest: tokens.size() <= max_proposals (fewer in confidence mode);
// tokens[j] is x_{j+1}, q[j] its distribution (kVocab probabilities, q[j][tokens[j]] > 0).
struct DraftResult {
  std::vector<model::Token> tokens;
  std::vector<std::vector<double>> q;
  // The proposals as acceptance.h takes them (spans into q: valid while this result lives and is not modified).
  std::vector<Proposal> proposals() const {
    std::vector<Proposal> out(tokens.size());
    for (size_t j = 0; j < tokens.size(); ++j) out[j] = Proposal{tokens[j], q[j]};
    return out;
  }
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Drafts one round for each request of `batch`; out.size() == batch.size().
  virtual absl::Status Propose(std::span<const DraftRequest> batch, std::span<DraftResult> out) = 0;
  // After verification of the slot's last round: `accepted` = A_r proposals were kept (0 .. tokens.size()).
  virtual absl::Status Commit(int slot, int64_t accepted) = 0;
  // The slot's request ended (finished, failed or moved): its state is dropped; the slot may be reused.
  virtual void Release(int slot) = 0;
};

}  // namespace dhs::spec
