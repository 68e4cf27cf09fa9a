// workerd/speculation/drafter.h: the built-in drafter as a Proposer (brief §6 "Proposal modes", "Draft KV ring"; issue 13).
// The network is drafter_model.h (windowed attention over its own KV, conditioned on the target's hidden state); this
// file owns its KV ring (DraftRing rows: position t of slot i at i * R_d + (t mod R_d)), the per-slot state and the
// proposal rules.
//
// A slot's state: the final frontier F (rows of positions < F were computed with the target's features) and, between
// Propose and Commit, the round's anchor n_r and proposal count. Propose(request at frontier n_r):
//   1. catch-up: positions F .. n_r (the anchor last) are fed with the target's features f_{t-1} =
//      DraftRequest.target_hidden, which must hold the target's final hidden state (model::StepOutput::hidden) of
//      positions max(0, F - 1) .. n_r - 1: on a slot's first round every position 0 .. n_r - 1 (F = 0), afterwards
//      from the previous round's anchor n' on (its verification pass fed n' .. n' + A, of which the kept ones count,
//      and any plain steps since fed the rest). Rows of accepted
//      proposals, drafted with predicted features, are recomputed here (EAGLE-style), so the state after any history
//      of rounds equals, bit for bit, that of a drafter fed the committed tokens in one go.
//   2. proposals x_1 .. x_m at n_r + 1 ..: q_j = model::SamplingDistribution(drafter logits, temperature); x_j =
//      argmax (greedy; the reported q_j is then one-hot, what x_j was drawn from) or the keyed draw
//      KeyedUniform(seed, request, n_r + j, kDraft) from q_j (inverse CDF). Fixed mode: m = max_proposals. Confidence
//      mode: stop at the first x_j whose confidence (q_j(x_j) of the softmax, before the one-hot of greedy mode) is
//      under the threshold (spec::ConfidencePrefix): that x_j is not proposed. Each proposal but the last is fed at
//      n_r + j with the drafter's predicted feature to draft the next.
// Commit(slot, A): the ring keeps the anchor and the accepted proposals it wrote (DraftRing::Commit(min(1 + A,
// written))), rejected rows are dropped (overwritten later, never read: queries read only positions <= their own);
// F = n_r + 1. Memory is the ring alone: N * R_d * draft_bytes_per_row, whatever the context length (catch-up over a
// long prompt streams through the ring in blocks of K_max positions).
//
// Errors (absl::Status; a failing call changes nothing): INVALID_ARGUMENT (out.size() != batch.size(), a slot outside
// [0, N) or twice in a batch, max_proposals outside [0, K_max - 1], tokens.size() != n_r + 1, a token outside
// [0, kVocab), target_hidden not (n_r - max(0, F - 1)) * target_d_model floats, n_r below the slot's committed
// frontier or at/above 2^56 - K_max, a request other than the slot's, A outside [0, proposals], a slot not open),
// FAILED_PRECONDITION (Propose while the slot's previous round awaits its Commit; Commit without a round).
// Thread-safety: none (the worker thread calls it).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workerd/model/config.h"
#include "workerd/speculation/draft_ring.h"
#include "workerd/speculation/drafter_model.h"
#include "workerd/speculation/proposer.h"

namespace dhs::spec {

enum class DraftMode { kFixed, kConfidence };

struct DrafterOptions {
  uint32_t slots = 1;        // N request slots (DraftRequest.slot in [0, N))
  int64_t page_rows = 64;    // p: rows per page of the ring (R_d is whole pages)
  int64_t ring_rows = 0;     // rows per slot the deployment provides; 0 = exactly R_d
  int64_t k_max = 0;         // K_max (queries per round, anchor included); 0 = the drafter file's k_max
  DraftMode mode = DraftMode::kFixed;
  double threshold = 0.0;    // confidence mode: in [0, 1]
  bool greedy = false;       // argmax proposals (one-hot q) for every request (else per DraftRequest.greedy)
  float temperature = 1.0f;  // q = softmax(logits / temperature); > 0
};

class DrafterProposer final : public Proposer {
 public:
  // Checks that the drafter pairs with the target (its target_d_model == target.d_model), the options (temperature >
  // 0, threshold in [0, 1]) and the ring: DraftRingGeometry::Create(W, K_max, p, N, ring_rows, draft_bytes_per_row)
  // refuses a ring that cannot hold the window and a block, with the formula's numbers. Error: INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<DrafterProposer>> Create(std::shared_ptr<const DrafterModel> model,
                                                                 const model::ModelConfig& target,
                                                                 const DrafterOptions& options);
  // DrafterModel::Load(path), then Create. Errors: as both.
  static absl::StatusOr<std::unique_ptr<DrafterProposer>> Load(const std::string& path,
                                                               const model::ModelConfig& target,
                                                               const DrafterOptions& options);

  absl::Status Propose(std::span<const DraftRequest> batch, std::span<DraftResult> out) override;
  absl::Status Commit(int slot, int64_t accepted) override;
  void Release(int slot) override;

  // Bytes of the draft ring, N * R_d * draft_bytes_per_row (the allocation the worker declares to memd); fixed at
  // creation, independent of context lengths.
  int64_t draft_ring_bytes() const { return static_cast<int64_t>(ring_data_.size() * sizeof(float)); }
  const DraftRing& ring() const { return ring_; }
  const DrafterModel& model() const { return *model_; }
  int64_t k_max() const { return ring_.geometry().config().k_max; }

 private:
  struct SlotState {
    RequestId request = 0;
    Position final_frontier = 0;  // F
    bool awaiting_commit = false;
    Position anchor = 0;          // n_r of the round awaiting its Commit
    int64_t proposed = 0;
  };
  struct Work;  // one request of a Propose (drafter.cc)

  DrafterProposer(std::shared_ptr<const DrafterModel> model, DraftRing ring, const DrafterOptions& options);
  absl::Status Check(std::span<const DraftRequest> batch, std::span<DraftResult> out) const;
  absl::Status CheckRequest(const DraftRequest& r) const;
  void CatchUp(std::vector<Work>& work);
  void BookChunk(SlotIndex slot, Position first, Position last, Position anchor);
  void Draft(std::vector<Work>& work);
  bool ChooseProposal(Work& w);

  std::shared_ptr<const DrafterModel> model_;
  DraftRing ring_;
  DrafterOptions options_;
  std::vector<float> ring_data_;  // total_rows * row_floats
  std::vector<SlotState> slots_;
};

}  // namespace dhs::spec
