// workerd/speculative_rounds.h: the worker's speculative rounds (brief §6; issue 13): the proposer of --speculate
// (the built-in drafter or the synthetic proposer, workerd/speculation), the block width schedule (--block,
// --block-schedule, online), the proposer's slots and each request's round state. The Worker keeps the batch: it asks
// Propose for the step's decoding requests, feeds each round's K_r queries in its one Model::Step and hands the
// round's logits to Finish, which returns the A_r + 1 tokens to emit.
//
// A round of a decoding request r at frontier n_r (its anchor, the last emitted token, not fed yet): the proposer
// drafts K_r - 1 tokens; the anchor and the proposals are fed in the batch's one Model::Step (query j sees positions
// <= n_r + j, its own selection); the rows from n_r + 1 on are held unverified (Model::BeginVerification: no page
// holding one is backed up or kept); spec::AcceptRound on the K_r rows of logits gives A_r (greedy requests: argmax,
// identical to plain greedy decoding; sampling: the speculative sampling rule with keyed draws); positions n_r ..
// n_r + A_r are kept, the rest dropped (Model::EndVerification), the A_r + 1 tokens are emitted with their queries'
// logits digests (the same bits plain decoding gives: batch-invariant numerics), then the proposer commits A_r.
//
// The drafter (--speculate fixed|confidence) conditions on the target's final hidden states: a request's steps ask
// them (WantsHidden) and KeepHidden keeps those of every position fed since its slot's last Propose, handed to the
// drafter as DraftRequest.target_hidden and released then. A position fed without one (an imported prefix or host
// run) is a gap: the request decodes without the drafter from then on.
//
// Thread-safety: none; the worker thread drives every method.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "workerd/geometry.h"
#include "workerd/kv_access.h"
#include "workerd/model/model.h"
#include "workerd/speculation/acceptance.h"
#include "workerd/speculation/block_width.h"
#include "workerd/speculation/drafter.h"
#include "workerd/speculation/online_block_width.h"
#include "workerd/speculation/proposer.h"

namespace dhs {

// One request's round state (held by the worker's request, changed only by SpeculativeRounds).
struct RoundState {
  int slot = -1;  // the proposer's slot (taken at its first round, released when the request ends), else -1
  // The drafter's input: the target's final hidden states (d_model floats per position) of positions
  // [hidden_from, hidden_end) fed since the slot's last Propose (the prompt before the first).
  std::vector<float> target_hidden;
  Position hidden_from = 0, hidden_end = 0;
  bool hidden_gap = false;  // positions were fed without their hidden states: no drafter rounds
};

// Counters since start (WorkerStats' spec_* fields).
struct RoundCounters {
  uint64_t rounds = 0;        // verified rounds (K_r >= 2)
  uint64_t round_tokens = 0;  // tokens those rounds emitted: sum of A_r + 1
  uint64_t proposed = 0;      // proposals verified: sum of K_r - 1
  uint64_t accepted = 0;      // proposals accepted: sum of A_r
  uint64_t propose_us = 0;    // time in Proposer::Propose, us
  std::vector<uint64_t> width_rounds;  // [K] = rounds of K_r = K queries (index 0 and 1 unused)
};

// One decoding request of a step, as Propose sees it.
struct RoundCandidate {
  RoundState* state = nullptr;
  RequestId id = 0;                          // logs
  model::ModelSession* session = nullptr;    // its target session (held unverified when its round opens)
  spec::RoundKey key;                        // (seed, client id, n_r = tokens fed)
  int64_t remaining = 0;                     // tokens it may still emit (max_new - generated)
  bool greedy = true;
  std::function<std::vector<model::Token>()> tokens;  // every token so far, asked only when its round opens
  // Its prepared prefix copied into a proposer's private session (spec::DraftRequest::import_history); may be empty.
  std::function<absl::StatusOr<Position>(model::ModelSession&, KvAccess&)> import_history;
};

// One request's verified round, as Finish needs it.
struct RoundInput {
  RoundState* state = nullptr;
  RequestId id = 0;        // logs
  model::ModelSession* session = nullptr;
  spec::RoundKey key;      // (seed, client id, n_r): the client id names the request in errors
  bool greedy = true;
  const model::SamplingParams* sampling = nullptr;
};

class SpeculativeRounds {
 public:
  // The rounds of `config.speculation` (off: no proposer, every step plain). `model` must outlive it.
  // Errors: spec::CheckSpeculation's (INVALID_ARGUMENT), a bad --block-schedule, the drafter's load
  // ("--drafter-weights PATH: ..."), the synthetic proposer's; INTERNAL when the drafter's rings differ from
  // geometry.speculation.draft_ring_bytes (what the Hello declares is what the drafter holds).
  static absl::StatusOr<std::unique_ptr<SpeculativeRounds>> Create(const model::Model* model,
                                                                   const WorkerConfig& config,
                                                                   const WorkerGeometry& geometry);

  bool enabled() const { return proposer_ != nullptr; }
  // Whether the width schedule wants the waiting admissions that fit (Propose's `joining`): --block-schedule online.
  bool online() const { return online_width_.has_value(); }

  // The step's proposals: for each candidate whose round width K_r (the step's width, capped by its remaining
  // tokens; the drafter's also needs the hidden states of every position since its slot's last round) is >= 2 and
  // that has or gets a proposer slot, one Propose for the batch; each round that got proposals is held unverified
  // (Model::BeginVerification on its session). Returns, per candidate, the round's proposals (nullopt: a plain
  // step). A failed Propose (logged) leaves every candidate plain. `active`: decoding sessions; `joining`: requests
  // waiting for their grant that memd has not told to wait (asked only when online()).
  std::vector<std::optional<spec::DraftResult>> Propose(std::span<RoundCandidate> candidates, int64_t active,
                                                        int64_t joining, KvAccess& kv);
  // A verified round of `draft` (K_r = proposals + 1 queries, `logits` K_r rows of model::kVocab): acceptance, the
  // rejected rows dropped (Model::EndVerification: backups of the kept rows only), the proposer committed, the kept
  // positions' hidden states kept, the counters. Returns the outcome: the A_r + 1 tokens to emit in order (token j's
  // digest is of logits row j) and the new frontier n_r + A_r + 1. Errors: AcceptRound's, EndVerification's (the
  // request must end).
  absl::StatusOr<spec::RoundOutcome> Finish(const RoundInput& in, const spec::DraftResult& draft,
                                            std::span<const float> logits, std::span<const float> hidden, KvAccess& kv);
  // A step's time against its queries (every token fed is one): the online width's t(Q) fit. No-op unless online().
  void ObserveStep(int64_t queries, std::chrono::steady_clock::duration took);

  // Whether a request's steps ask the target's hidden states (the drafter conditions on them).
  bool WantsHidden(const RoundState& s) const { return drafter_ != nullptr && !s.hidden_gap; }
  // Keeps the first `rows` hidden states (d_model floats each) of a step that fed the request from position `first`
  // (s.hidden_end, else a gap). No-op unless WantsHidden.
  void KeepHidden(RoundState& s, Position first, std::span<const float> hidden, size_t rows);
  // The request ended: its proposer slot is released (no-op without one).
  void Release(RoundState& s);

  const RoundCounters& counters() const { return counters_; }

 private:
  SpeculativeRounds(const model::Model* model, const WorkerConfig& config, uint32_t max_block);
  absl::Status CreateSchedule();
  absl::Status CreateProposer();
  absl::Status CreateDrafter();
  // The step's block width K: OnlineBlockWidth's decision, else the schedule's (or --block) width at the active
  // sessions; capped by max_block.
  int64_t StepWidth(int64_t active, int64_t joining) const;
  // Whether the candidate may open a round of `width` queries now (a slot taken when it has none).
  bool Admit(RoundState& s, Position fed, int64_t width);
  // Holds the round of a candidate that got proposals; false (logged unless there were none): a plain step, the
  // proposer's round ends with nothing accepted.
  bool Hold(const RoundCandidate& c, const spec::DraftResult& result, KvAccess& kv);

  const model::Model* model_;
  WorkerConfig config_;  // its speculation, slots, page_rows, max_context_tokens, staging_arenas
  uint32_t max_block_;   // WorkerGeometry::max_block
  std::unique_ptr<spec::Proposer> proposer_;            // --speculate (nullptr when off)
  spec::DrafterProposer* drafter_ = nullptr;            // proposer_ when it is the drafter (fixed / confidence)
  std::optional<spec::BlockWidthSchedule> schedule_;    // --block-schedule (else --block at every load)
  std::optional<spec::OnlineBlockWidth> online_width_;  // --block-schedule online
  std::vector<bool> slot_used_;                         // the proposer's slots
  RoundCounters counters_;
};

}  // namespace dhs
