#include "workerd/speculation/drafter.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "workerd/model/sampling.h"
#include "workerd/speculation/block_width.h"
#include "workerd/speculation/keyed_draw.h"

namespace dhs::spec {

// One request of a Propose: where its catch-up stands, the drafter's last logits row and predicted feature (of the
// last position fed), and its result.
struct DrafterProposer::Work {
  const DraftRequest* request = nullptr;
  DraftResult* out = nullptr;
  Position next = 0;          // next position to feed in the catch-up (F .. n_r)
  Position hidden_first = 0;  // the position of target_hidden's first row: max(0, F - 1)
  std::vector<float> logits;  // kVocab floats
  std::vector<float> feature; // target_d_model floats
  bool drafting = true;
};

DrafterProposer::DrafterProposer(std::shared_ptr<const DrafterModel> model, DraftRing ring,
                                 const DrafterOptions& options)
    : model_(std::move(model)), ring_(std::move(ring)), options_(options) {
  ring_data_.assign(static_cast<size_t>(ring_.geometry().total_rows() * model_->config().row_floats()), 0.0f);
  slots_.resize(options.slots);
}

absl::StatusOr<std::unique_ptr<DrafterProposer>> DrafterProposer::Create(std::shared_ptr<const DrafterModel> model,
                                                                         const model::ModelConfig& target,
                                                                         const DrafterOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("drafter: no model");
  const DrafterConfig& c = model->config();
  if (c.target_d_model != target.d_model) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "drafter: built for a target of d_model %d, the target has d_model %d", c.target_d_model, target.d_model));
  }
  if (!(options.temperature > 0.0f) || !(options.threshold >= 0.0 && options.threshold <= 1.0) ||
      options.k_max < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "drafter: temperature %g must be > 0, threshold %g in [0, 1], k_max %d >= 0 (0: the file's %d)",
        options.temperature, options.threshold, options.k_max, c.k_max));
  }
  absl::StatusOr<DraftRingGeometry> geometry = DraftRingGeometry::Create(
      {.window = c.window, .k_max = options.k_max > 0 ? options.k_max : c.k_max, .page_rows = options.page_rows,
       .slots = options.slots, .ring_rows = options.ring_rows, .draft_bytes_per_row = c.draft_bytes_per_row()});
  if (!geometry.ok()) return geometry.status();
  if (geometry->total_rows() > (int64_t{1} << 40) / c.row_floats()) {
    return absl::InvalidArgumentError(absl::StrFormat("drafter: a ring of %d rows of %d floats is too large",
                                                      geometry->total_rows(), c.row_floats()));
  }
  return std::unique_ptr<DrafterProposer>(new DrafterProposer(std::move(model), DraftRing(*geometry), options));
}

absl::StatusOr<std::unique_ptr<DrafterProposer>> DrafterProposer::Load(const std::string& path,
                                                                       const model::ModelConfig& target,
                                                                       const DrafterOptions& options) {
  absl::StatusOr<std::unique_ptr<DrafterModel>> model = DrafterModel::Load(path);
  if (!model.ok()) return model.status();
  return Create(std::shared_ptr<const DrafterModel>(std::move(*model)), target, options);
}

absl::Status DrafterProposer::CheckRequest(const DraftRequest& r) const {
  const int64_t N = static_cast<int64_t>(slots_.size());
  if (r.slot < 0 || r.slot >= N) {
    return absl::InvalidArgumentError(absl::StrFormat("drafter: slot %d outside [0, %d)", r.slot, N));
  }
  const SlotIndex slot = static_cast<SlotIndex>(r.slot);
  const SlotState& st = slots_[slot];
  const bool open = ring_.open(slot);
  const Position n = r.key.frontier;
  if (open && st.awaiting_commit) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "drafter: slot %d proposed for frontier %d and awaits its Commit", r.slot, st.anchor));
  }
  if (open && st.request != r.key.request) {
    return absl::InvalidArgumentError(absl::StrFormat("drafter: slot %d holds request %d, not %d", r.slot,
                                                      st.request, r.key.request));
  }
  if (r.max_proposals < 0 || r.max_proposals > k_max() - 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("drafter: max_proposals %d outside [0, K_max - 1 = %d]", r.max_proposals, k_max() - 1));
  }
  const Position committed = open ? ring_.frontier(slot) : 0;
  if (n < committed || n >= (Position{1} << 56) - k_max() || static_cast<Position>(r.tokens.size()) != n + 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "drafter: slot %d frontier %d with %d tokens: need frontier in [%d, 2^56 - K_max) and frontier + 1 tokens",
        r.slot, n, r.tokens.size(), committed));
  }
  for (model::Token t : r.tokens) {
    if (t < 0 || t >= model::kVocab) {
      return absl::InvalidArgumentError(absl::StrFormat("drafter: token %d outside [0, %d)", t, model::kVocab));
    }
  }
  const Position first = open ? std::max<Position>(0, st.final_frontier - 1) : 0;
  const size_t want = static_cast<size_t>(n - first) * model_->config().target_d_model;
  if (r.target_hidden.size() != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "drafter: slot %d needs the target's hidden states of positions %d .. %d (%d floats), got %d floats", r.slot,
        first, n - 1, want, r.target_hidden.size()));
  }
  for (size_t i = 0; i < want; ++i) {
    if (!std::isfinite(r.target_hidden[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "drafter: slot %d: the target's hidden state of position %d is not finite", r.slot,
          first + static_cast<Position>(i / model_->config().target_d_model)));
    }
  }
  return absl::OkStatus();
}

absl::Status DrafterProposer::Check(std::span<const DraftRequest> batch, std::span<DraftResult> out) const {
  if (out.size() != batch.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("drafter: %d results for %d requests", out.size(), batch.size()));
  }
  std::set<int> seen;
  for (const DraftRequest& r : batch) {
    if (!seen.insert(r.slot).second) {
      return absl::InvalidArgumentError(absl::StrFormat("drafter: slot %d twice in a batch", r.slot));
    }
    if (absl::Status s = CheckRequest(r); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Ring bookkeeping of a catch-up block [first, last] of a slot (last <= anchor): positions already committed in the
// ring are rewritten in place (no bookkeeping); the others up to anchor - 1 are written and committed; the anchor is
// written and stays pending (committed by the round's Commit). Cannot fail: the block spans at most K_max positions
// and nothing is pending before it (checked by Propose's validation).
void DrafterProposer::BookChunk(SlotIndex slot, Position first, Position last, Position anchor) {
  int64_t written = 0;
  for (Position t = std::max(first, ring_.frontier(slot)); t <= std::min(last, anchor - 1); ++t, ++written) {
    DHS_CHECK_OK(ring_.Write(slot).status());
  }
  if (written > 0) DHS_CHECK_OK(ring_.Commit(slot, written));
  if (last == anchor) DHS_CHECK_OK(ring_.Write(slot).status());
}

// Catch-up blocks of at most K_max positions per request, all requests in one Forward per block. The rows a query at t
// reads (max(0, t-W+1) .. t, with t >= F) are intact: earlier rounds wrote no position above F - 1 + K_max - 2 (the
// previous round fed its anchor F - 1 and at most K_max - 2 proposals), so a row read at s >= F - W + 1 was last
// written by s itself (W + K_max - 4 < R_d); within one block the span is W + K_max - 1 < R_d.
void DrafterProposer::CatchUp(std::vector<Work>& work) {
  const int Dt = model_->config().target_d_model;
  std::vector<DrafterQuery> queries;
  std::vector<std::pair<size_t, size_t>> anchors;  // (work index, query index) of the anchors fed in this call
  DrafterOutput out;
  for (;;) {
    queries.clear();
    anchors.clear();
    for (size_t i = 0; i < work.size(); ++i) {
      Work& w = work[i];
      const DraftRequest& r = *w.request;
      const Position n = r.key.frontier;
      if (w.next > n) continue;
      const Position last = std::min(n, w.next + k_max() - 1);
      const SlotIndex slot = static_cast<SlotIndex>(r.slot);
      BookChunk(slot, w.next, last, n);
      for (Position t = w.next; t <= last; ++t) {
        std::span<const float> feature;
        if (t > 0) feature = r.target_hidden.subspan(static_cast<size_t>(t - 1 - w.hidden_first) * Dt, Dt);
        if (t == n) anchors.push_back({i, queries.size()});
        queries.push_back({slot, t, r.tokens[t], feature});
      }
      w.next = last + 1;
    }
    if (queries.empty()) return;
    model_->Forward(queries, ring_.geometry(), ring_data_, out);
    for (auto [i, q] : anchors) {
      work[i].logits.assign(out.logits.begin() + q * model::kVocab, out.logits.begin() + (q + 1) * model::kVocab);
      work[i].feature.assign(out.features.begin() + q * Dt, out.features.begin() + (q + 1) * Dt);
    }
  }
}

// The next proposal of a drafting request from its last logits: appended to its result unless confidence mode stops.
// Returns whether it was proposed.
bool DrafterProposer::ChooseProposal(Work& w) {
  const DraftRequest& r = *w.request;
  DraftResult& res = *w.out;
  const Position at = r.key.frontier + static_cast<Position>(res.tokens.size()) + 1;
  std::vector<double> q = model::SamplingDistribution(w.logits, {.temperature = options_.temperature, .top_p = 1.0f});
  model::Token x;
  if (options_.greedy || r.greedy) {
    x = model::Argmax(w.logits);
  } else {
    x = model::SampleAt(q, KeyedUniform({r.key.seed, r.key.request, at, DrawPurpose::kDraft}));
  }
  if (options_.mode == DraftMode::kConfidence) {
    const double confidence = q[x];
    absl::StatusOr<int64_t> keep = ConfidencePrefix(std::span<const double>(&confidence, 1), options_.threshold, 1);
    if (!keep.ok() || *keep == 0) return false;
  }
  if (options_.greedy || r.greedy) {
    std::fill(q.begin(), q.end(), 0.0);
    q[x] = 1.0;
  }
  res.tokens.push_back(x);
  res.q.push_back(std::move(q));
  return true;
}

void DrafterProposer::Draft(std::vector<Work>& work) {
  const int Dt = model_->config().target_d_model;
  std::vector<DrafterQuery> queries;
  std::vector<size_t> owner;
  DrafterOutput out;
  for (;;) {
    queries.clear();
    owner.clear();
    for (size_t i = 0; i < work.size(); ++i) {
      Work& w = work[i];
      const int64_t max = w.request->max_proposals;
      if (!w.drafting || static_cast<int64_t>(w.out->tokens.size()) >= max || !ChooseProposal(w)) {
        w.drafting = false;
        continue;
      }
      if (static_cast<int64_t>(w.out->tokens.size()) == max) {  // the last proposal is not fed
        w.drafting = false;
        continue;
      }
      const SlotIndex slot = static_cast<SlotIndex>(w.request->slot);
      DHS_CHECK_OK(ring_.Write(slot).status());  // anchor + fed proposals <= K_max - 1 pending: cannot fail
      owner.push_back(i);
      queries.push_back({slot, w.request->key.frontier + static_cast<Position>(w.out->tokens.size()),
                         w.out->tokens.back(), w.feature});
    }
    if (queries.empty()) return;
    model_->Forward(queries, ring_.geometry(), ring_data_, out);
    for (size_t q = 0; q < owner.size(); ++q) {
      Work& w = work[owner[q]];
      w.logits.assign(out.logits.begin() + q * model::kVocab, out.logits.begin() + (q + 1) * model::kVocab);
      w.feature.assign(out.features.begin() + q * Dt, out.features.begin() + (q + 1) * Dt);
    }
  }
}

absl::Status DrafterProposer::Propose(std::span<const DraftRequest> batch, std::span<DraftResult> out) {
  if (absl::Status s = Check(batch, out); !s.ok()) return s;
  std::vector<Work> work(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftRequest& r = batch[i];
    const SlotIndex slot = static_cast<SlotIndex>(r.slot);
    if (!ring_.open(slot)) {
      DHS_CHECK_OK(ring_.Open(slot, 0));  // a closed slot < N (Check): cannot fail
      slots_[slot] = SlotState{.request = r.key.request};
    }
    out[i] = DraftResult{};
    work[i].request = &r;
    work[i].out = &out[i];
    work[i].next = slots_[slot].final_frontier;
    work[i].hidden_first = std::max<Position>(0, slots_[slot].final_frontier - 1);
  }
  CatchUp(work);
  Draft(work);
  for (size_t i = 0; i < batch.size(); ++i) {
    SlotState& st = slots_[static_cast<SlotIndex>(batch[i].slot)];
    st.awaiting_commit = true;
    st.anchor = batch[i].key.frontier;
    st.proposed = static_cast<int64_t>(out[i].tokens.size());
    st.final_frontier = st.anchor + 1;
  }
  return absl::OkStatus();
}

absl::Status DrafterProposer::Commit(int slot, int64_t accepted) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size()) || !ring_.open(static_cast<SlotIndex>(slot))) {
    return absl::InvalidArgumentError(absl::StrFormat("drafter: commit of slot %d, which is not open", slot));
  }
  const SlotIndex s = static_cast<SlotIndex>(slot);
  SlotState& st = slots_[s];
  if (!st.awaiting_commit) {
    return absl::FailedPreconditionError(absl::StrFormat("drafter: slot %d has no round awaiting its Commit", slot));
  }
  if (accepted < 0 || accepted > st.proposed) {
    return absl::InvalidArgumentError(
        absl::StrFormat("drafter: slot %d accepted %d of %d proposals", slot, accepted, st.proposed));
  }
  // The anchor and the accepted proposals the ring holds (the last proposal of a round is never fed).
  if (absl::Status c = ring_.Commit(s, std::min(1 + accepted, ring_.pending(s))); !c.ok()) return c;
  st.awaiting_commit = false;
  return absl::OkStatus();
}

void DrafterProposer::Release(int slot) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size())) return;
  const SlotIndex s = static_cast<SlotIndex>(slot);
  if (ring_.open(s)) DHS_CHECK_OK(ring_.Close(s));  // an open slot: cannot fail
  slots_[s] = SlotState{};
}

}  // namespace dhs::spec
