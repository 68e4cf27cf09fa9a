#include "workerd/speculation/synthetic_proposer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "workerd/speculation/keyed_draw.h"

namespace dhs::spec {

absl::StatusOr<std::vector<model::Token>> SyntheticProposals(std::span<const model::Token> continuation,
                                                             double corruption, const RoundKey& key) {
  constexpr Position kMaxPosition = Position{1} << 56;
  const Position n = static_cast<Position>(continuation.size());
  if (!(corruption >= 0.0 && corruption <= 1.0) || key.frontier < 0 || n > kMaxPosition ||
      key.frontier > kMaxPosition - n - 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "synthetic proposer: corruption %g must be in [0, 1] and frontier %d in [0, 2^56 - %d - 1]", corruption,
        key.frontier, n));
  }
  // corruption * 2^32 as an integer threshold: word0 < threshold corrupts (exactly never at 0, always at 1).
  const uint64_t threshold = static_cast<uint64_t>(std::ldexp(corruption, 32));
  std::vector<model::Token> out;
  out.reserve(continuation.size());
  for (size_t j = 0; j < continuation.size(); ++j) {
    const model::Token g = continuation[j];
    if (g < 0 || g >= model::kVocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("synthetic proposer: continuation token %d is %d, outside [0, %d)", j, g, model::kVocab));
    }
    const std::array<uint32_t, 4> w =
        KeyedBits({key.seed, key.request, key.frontier + static_cast<Position>(j) + 1, DrawPurpose::kDraft});
    if (w[0] >= threshold) {
      out.push_back(g);
      continue;
    }
    const model::Token other = static_cast<model::Token>(w[1] % (model::kVocab - 1));  // one of the other ids
    out.push_back(other < g ? other : other + 1);
  }
  return out;
}

}  // namespace dhs::spec

namespace dhs::spec {

absl::StatusOr<std::unique_ptr<SyntheticProposer>> SyntheticProposer::Create(const model::Model* model, int slots,
                                                                             double corruption, size_t arena_bytes,
                                                                             int64_t catch_up_tokens) {
  if (model == nullptr || slots < 1 || !(corruption >= 0.0 && corruption <= 1.0) || catch_up_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "synthetic proposer: needs a model, slots >= 1 (got %d), corruption in [0, 1] (got %g) and catch-up tokens "
        ">= 1 (got %d)", slots, corruption, catch_up_tokens));
  }
  std::unique_ptr<SyntheticProposer> p(new SyntheticProposer(model, slots, corruption, arena_bytes, catch_up_tokens));
  if (p->kv_.total_pages() == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("synthetic proposer: an arena of %d bytes holds no page", arena_bytes));
  }
  return p;
}

SyntheticProposer::SyntheticProposer(const model::Model* model, int slots, double corruption, size_t arena_bytes,
                                     int64_t catch_up)
    : model_(model),
      corruption_(corruption),
      catch_up_(catch_up),
      kv_(std::vector<size_t>(model->config().n_sources(), model->config().row_bytes()), arena_bytes),
      slots_(static_cast<size_t>(slots)) {}

void SyntheticProposer::Reset(Slot& slot, RequestId request) {
  const auto index = static_cast<RequestId>(&slot - slots_.data());
  kv_.Release(index + 1);  // the private store's request id of slot i is i + 1
  slot = Slot{};
  slot.request = request;
  slot.session.emplace(model_->NewSession(index + 1));
}

void SyntheticProposer::Start(Slot& slot, const DraftRequest& r) {
  Reset(slot, r.key.request);
  if (!r.import_history) return;
  absl::StatusOr<Position> copied = r.import_history(*slot.session, kv_);
  const size_t n = copied.ok() ? static_cast<size_t>(*copied) : 0;
  if (!copied.ok() || n >= r.tokens.size()) {  // e.g. the private arena full: the slot catches up by itself
    Reset(slot, r.key.request);                   // drops what the failed copy appended
    ++import_failures_;
    return;
  }
  slot.fed.assign(r.tokens.begin(), r.tokens.begin() + static_cast<std::ptrdiff_t>(n));
  imported_positions_ += n;
}

absl::Status SyntheticProposer::CatchUp(std::span<const DraftRequest> batch, std::vector<bool>& ready) {
  std::vector<model::StepInput> in;
  std::vector<Slot*> who;
  ready.assign(batch.size(), true);
  for (size_t b = 0; b < batch.size(); ++b) {  // the tokens before the anchor (the anchor is fed by Continue)
    const DraftRequest& r = batch[b];
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    if (s.fed.size() + 1 >= r.tokens.size()) continue;
    const size_t behind = r.tokens.size() - 1 - s.fed.size();
    const size_t n = std::min(behind, static_cast<size_t>(catch_up_));
    ready[b] = n == behind;
    in.push_back(model::StepInput{&*s.session, r.tokens.subspan(s.fed.size(), n)});
    who.push_back(&s);
  }
  if (in.empty()) return absl::OkStatus();
  std::vector<model::StepOutput> out(in.size());
  if (absl::Status st = model_->Step(in, kv_, out); !st.ok()) return st;
  for (size_t b = 0; b < in.size(); ++b) {
    who[b]->fed.insert(who[b]->fed.end(), in[b].tokens.begin(), in[b].tokens.end());
    reference_positions_ += in[b].tokens.size();
  }
  return absl::OkStatus();
}

absl::Status SyntheticProposer::Continue(std::span<const DraftRequest> batch, const std::vector<bool>& ready,
                                         std::vector<std::vector<model::Token>>& out) {
  // A round on the private session: the anchor, then c_1 .. c_{P-1}, each the argmax after the previous; only the
  // anchor's row is kept (EndVerification), so the session holds the request's committed tokens.
  out.assign(batch.size(), {});
  int64_t longest = 0;
  std::vector<int64_t> want(batch.size(), 0);  // proposals of slot b this round
  for (size_t b = 0; b < batch.size(); ++b) want[b] = ready[b] ? batch[b].max_proposals : 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const DraftRequest& r = batch[b];
    if (want[b] < 1) continue;
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    if (absl::Status st = model_->BeginVerification(*s.session, kv_); !st.ok()) return st;
    longest = std::max(longest, want[b]);
  }
  for (int64_t i = 0; i < longest; ++i) {  // feeds the anchor (i = 0) or c_i, reads c_{i+1}
    std::vector<model::StepInput> in;
    std::vector<size_t> who;
    for (size_t b = 0; b < batch.size(); ++b) {
      if (want[b] <= i) continue;
      const model::Token* token = i == 0 ? &batch[b].tokens.back() : &out[b][static_cast<size_t>(i) - 1];
      in.push_back(model::StepInput{&*slots_[static_cast<size_t>(batch[b].slot)].session,
                                    std::span<const model::Token>(token, 1)});
      who.push_back(b);
    }
    std::vector<model::StepOutput> logits(in.size());
    if (absl::Status st = model_->Step(in, kv_, logits); !st.ok()) return st;
    for (size_t j = 0; j < who.size(); ++j) out[who[j]].push_back(model::Argmax(logits[j].logits));
    reference_positions_ += in.size();
  }
  for (size_t b = 0; b < batch.size(); ++b) {
    const DraftRequest& r = batch[b];
    if (want[b] < 1) continue;
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    if (absl::Status st = model_->EndVerification(*s.session, static_cast<Position>(r.tokens.size()), kv_); !st.ok()) {
      return st;
    }
    s.fed.assign(r.tokens.begin(), r.tokens.end());
  }
  return absl::OkStatus();
}

absl::Status SyntheticProposer::Propose(std::span<const DraftRequest> batch, std::span<DraftResult> out) {
  if (out.size() != batch.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("synthetic proposer: %d results for a batch of %d", out.size(), batch.size()));
  }
  std::vector<bool> seen(slots_.size(), false);
  for (const DraftRequest& r : batch) {
    if (r.slot < 0 || static_cast<size_t>(r.slot) >= slots_.size() || seen[static_cast<size_t>(r.slot)] ||
        r.tokens.empty() || r.max_proposals < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "synthetic proposer: slot %d (of %d, each once) with %d tokens and %d proposals", r.slot, slots_.size(),
          r.tokens.size(), r.max_proposals));
    }
    seen[static_cast<size_t>(r.slot)] = true;
    if (slots_[static_cast<size_t>(r.slot)].pending) {
      return absl::FailedPreconditionError(
          absl::StrFormat("synthetic proposer: slot %d proposes before its last round was committed", r.slot));
    }
  }
  for (const DraftRequest& r : batch) {  // a slot whose history is not a prefix of the request's starts again
    Slot& s = slots_[static_cast<size_t>(r.slot)];
    if (s.request != r.key.request || !s.session || s.fed.size() >= r.tokens.size() ||
        !std::equal(s.fed.begin(), s.fed.end(), r.tokens.begin())) {
      Start(s, r);
    }
  }
  std::vector<std::vector<model::Token>> continuation;
  std::vector<bool> ready;
  absl::Status st = CatchUp(batch, ready);
  if (st.ok()) st = Continue(batch, ready, continuation);
  if (!st.ok()) {  // the batch's slots start again at their next Propose (with their prefix copy, if any)
    for (const DraftRequest& r : batch) Release(r.slot);
    return st;
  }
  for (size_t b = 0; b < batch.size(); ++b) {
    absl::StatusOr<std::vector<model::Token>> tokens = SyntheticProposals(continuation[b], corruption_, batch[b].key);
    if (!tokens.ok()) return tokens.status();
    out[b].tokens = *std::move(tokens);
    out[b].q.assign(out[b].tokens.size(), std::vector<double>(model::kVocab, 0.0));
    for (size_t j = 0; j < out[b].tokens.size(); ++j) out[b].q[j][static_cast<size_t>(out[b].tokens[j])] = 1.0;
    Slot& s = slots_[static_cast<size_t>(batch[b].slot)];
    s.pending = true;
    s.proposed = static_cast<int64_t>(out[b].tokens.size());
  }
  return absl::OkStatus();
}

absl::Status SyntheticProposer::Commit(int slot, int64_t accepted) {
  if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("synthetic proposer: slot %d outside [0, %d)", slot,
                                                      slots_.size()));
  }
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (!s.pending || accepted < 0 || accepted > s.proposed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "synthetic proposer: slot %d commits %d accepted of %d proposed (pending: %s)", slot, accepted, s.proposed,
        s.pending ? "true" : "false"));
  }
  s.pending = false;  // the private session holds committed tokens only; the next Propose feeds the new ones
  return absl::OkStatus();
}

void SyntheticProposer::Release(int slot) {
  if (slot < 0 || static_cast<size_t>(slot) >= slots_.size()) return;
  kv_.Release(static_cast<RequestId>(slot) + 1);
  slots_[static_cast<size_t>(slot)] = Slot{};
}

}  // namespace dhs::spec
