#include "workerd/speculative_rounds.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "spdlog/spdlog.h"
#include "workerd/speculation/synthetic_proposer.h"

namespace dhs {

SpeculativeRounds::SpeculativeRounds(const model::Model* model, const WorkerConfig& config, uint32_t max_block)
    : model_(model), config_(config), max_block_(max_block) {}

absl::StatusOr<std::unique_ptr<SpeculativeRounds>> SpeculativeRounds::Create(const model::Model* model,
                                                                             const WorkerConfig& config,
                                                                             const WorkerGeometry& geometry) {
  std::unique_ptr<SpeculativeRounds> rounds(new SpeculativeRounds(model, config, geometry.max_block));
  if (absl::Status s = rounds->CreateProposer(); !s.ok()) return s;
  if (const uint64_t ring = rounds->drafter_ ? static_cast<uint64_t>(rounds->drafter_->draft_ring_bytes()) : 0;
      ring != geometry.speculation.draft_ring_bytes) {  // what the Hello declared is what the drafter holds
    return absl::InternalError(absl::StrCat("worker: the drafter's ring holds ", ring, " bytes, the geometry declares ",
                                            geometry.speculation.draft_ring_bytes));
  }
  return rounds;
}

absl::Status SpeculativeRounds::CreateSchedule() {
  const spec::SpeculationConfig& sc = config_.speculation;
  if (sc.schedule == spec::kOnlineSchedule) {
    absl::StatusOr<spec::OnlineBlockWidth> online = spec::OnlineBlockWidth::Create({.k_max = sc.block});
    if (!online.ok()) return online.status();
    online_width_ = *std::move(online);
  } else if (!sc.schedule.empty()) {
    absl::StatusOr<spec::BlockWidthSchedule> schedule = spec::BlockWidthSchedule::Parse(sc.schedule, sc.block);
    if (!schedule.ok()) return schedule.status();
    schedule_ = *std::move(schedule);
  }
  return absl::OkStatus();
}

absl::Status SpeculativeRounds::CreateProposer() {
  const spec::SpeculationConfig& sc = config_.speculation;
  if (sc.mode == spec::SpeculateMode::kOff) return absl::OkStatus();
  if (absl::Status s = spec::CheckSpeculation(sc, max_block_, config_.staging_arenas > 0); !s.ok()) return s;
  if (absl::Status s = CreateSchedule(); !s.ok()) return s;
  slot_used_.assign(config_.slots, false);
  if (sc.mode == spec::SpeculateMode::kFixed || sc.mode == spec::SpeculateMode::kConfidence) return CreateDrafter();
  // Synthetic (benchmarks only): a private resident copy of each slot's history, host memory; the arena is not
  // zero-filled, so only the pages the sessions touch cost memory (at most 4 GiB of address space).
  const model::ModelConfig& mc = model_->config();
  const uint64_t per_position = mc.row_bytes() * static_cast<uint64_t>(mc.n_sources());
  const uint64_t arena =
      std::min<uint64_t>(uint64_t{4} << 30, (config_.max_context_tokens + 64) * per_position * config_.slots);
  absl::StatusOr<std::unique_ptr<spec::SyntheticProposer>> p = spec::SyntheticProposer::Create(
      model_, static_cast<int>(config_.slots), sc.corruption, static_cast<size_t>(arena));
  if (!p.ok()) return p.status();
  proposer_ = *std::move(p);
  return absl::OkStatus();
}

// The drafter of --drafter-weights: N = slots request slots, rings of whole pages of the worker's p rows, sized for
// K_max = --block; proposals argmax for greedy requests (DraftRequest.greedy), keyed draws from q otherwise.
absl::Status SpeculativeRounds::CreateDrafter() {
  const spec::SpeculationConfig& sc = config_.speculation;
  spec::DrafterOptions o;
  o.slots = config_.slots;
  o.page_rows = config_.page_rows;
  o.k_max = sc.block;
  o.mode = sc.mode == spec::SpeculateMode::kConfidence ? spec::DraftMode::kConfidence : spec::DraftMode::kFixed;
  o.threshold = sc.confidence;
  absl::StatusOr<std::unique_ptr<spec::DrafterProposer>> d =
      spec::DrafterProposer::Load(sc.drafter_weights, model_->config(), o);
  if (!d.ok()) {
    return absl::Status(d.status().code(), absl::StrCat("--drafter-weights ", sc.drafter_weights, ": ",
                                                        d.status().message()));
  }
  drafter_ = d->get();
  proposer_ = *std::move(d);
  return absl::OkStatus();
}

void SpeculativeRounds::KeepHidden(RoundState& s, Position first, std::span<const float> hidden, size_t rows) {
  if (!WantsHidden(s)) return;
  const auto d = static_cast<size_t>(model_->config().d_model);
  if (first != s.hidden_end || hidden.size() < rows * d) {  // positions fed without their hidden states
    s.hidden_gap = true;
    std::vector<float>().swap(s.target_hidden);
    return;
  }
  s.target_hidden.insert(s.target_hidden.end(), hidden.begin(), hidden.begin() + static_cast<ptrdiff_t>(rows * d));
  s.hidden_end += static_cast<Position>(rows);
}

int64_t SpeculativeRounds::StepWidth(int64_t active, int64_t joining) const {
  int64_t width = config_.speculation.block;
  if (online_width_) {
    width = online_width_->Decide(active, joining, config_.speculation.block).width;
  } else if (schedule_) {
    width = schedule_->WidthFor(active);
  }
  return std::min<int64_t>(width, max_block_);
}

bool SpeculativeRounds::Admit(RoundState& s, Position fed, int64_t width) {
  if (width < 2) return false;
  // The drafter needs the hidden states of every position since its slot's last round (all, on the first).
  if (drafter_ && (s.hidden_gap || s.hidden_end != fed || (s.slot < 0 && s.hidden_from != 0))) return false;
  if (s.slot < 0) {
    auto free = std::find(slot_used_.begin(), slot_used_.end(), false);
    if (free == slot_used_.end()) return false;
    *free = true;
    s.slot = static_cast<int>(free - slot_used_.begin());
  }
  return true;
}

std::vector<std::optional<spec::DraftResult>> SpeculativeRounds::Propose(std::span<RoundCandidate> candidates,
                                                                         int64_t active, int64_t joining,
                                                                         KvAccess& kv) {
  std::vector<std::optional<spec::DraftResult>> out(candidates.size());
  if (!proposer_) return out;
  const int64_t step_width = StepWidth(active, joining);
  std::vector<spec::DraftRequest> drafts;
  std::vector<std::vector<model::Token>> histories;  // the spans of `drafts` point here
  std::vector<size_t> which;
  histories.reserve(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    RoundCandidate& c = candidates[i];
    const int64_t width = std::max<int64_t>(1, std::min(step_width, c.remaining));  // K_r: what it may still emit
    if (!Admit(*c.state, c.key.frontier, width)) continue;
    const std::vector<model::Token>& all = histories.emplace_back(c.tokens());
    drafts.push_back(spec::DraftRequest{c.state->slot, c.key, all, c.state->target_hidden, width - 1, c.greedy,
                                        c.import_history});
    which.push_back(i);
  }
  if (drafts.empty()) return out;
  std::vector<spec::DraftResult> results(drafts.size());
  const auto start = std::chrono::steady_clock::now();
  absl::Status proposed = proposer_->Propose(drafts, results);
  counters_.propose_us += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
  if (!proposed.ok()) {
    spdlog::warn("worker: the proposer failed ({}); this step decodes without speculation", proposed.ToString());
    return out;
  }
  for (size_t i = 0; i < which.size(); ++i) {
    if (Hold(candidates[which[i]], results[i], kv)) out[which[i]] = std::move(results[i]);
  }
  return out;
}

bool SpeculativeRounds::Hold(const RoundCandidate& c, const spec::DraftResult& result, KvAccess& kv) {
  RoundState& s = *c.state;
  std::vector<float>().swap(s.target_hidden);  // the drafter consumed them: its slot's frontier is past them
  s.hidden_from = s.hidden_end;
  absl::Status held =
      result.tokens.empty() ? absl::CancelledError("no proposal") : model_->BeginVerification(*c.session, kv);
  if (held.ok()) return true;
  if (!absl::IsCancelled(held)) spdlog::warn("worker: request {} steps plainly: {}", c.id, held.ToString());
  DHS_CHECK_OK(proposer_->Commit(s.slot, 0));  // a plain step; the proposer's round ends with nothing accepted
  return false;
}

absl::StatusOr<spec::RoundOutcome> SpeculativeRounds::Finish(const RoundInput& in, const spec::DraftResult& draft,
                                                             std::span<const float> logits,
                                                             std::span<const float> hidden, KvAccess& kv) {
  const Position n = in.key.frontier;
  const std::vector<spec::Proposal> proposals = draft.proposals();
  absl::StatusOr<spec::RoundOutcome> outcome = spec::AcceptRound(
      in.greedy ? spec::AcceptMode::kGreedy : spec::AcceptMode::kSampling, logits, *in.sampling, proposals, in.key);
  if (!outcome.ok()) return outcome.status();
  const Position length = n + outcome->accepted + 1;
  if (absl::Status s = model_->EndVerification(*in.session, length, kv); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("request ", in.key.request, " failed committing its round: ",
                                               s.message()));
  }
  if (absl::Status s = proposer_->Commit(in.state->slot, outcome->accepted); !s.ok()) {
    spdlog::warn("worker: proposer commit of request {}: {}", in.id, s.ToString());  // it restarts the slot
    in.state->hidden_gap = true;  // a restarted drafter slot would need every position's hidden state again
  }
  KeepHidden(*in.state, n, hidden, static_cast<size_t>(outcome->accepted) + 1);  // the kept positions n .. n + A_r
  const size_t width = draft.tokens.size() + 1;
  ++counters_.rounds;
  counters_.round_tokens += outcome->emitted.size();
  counters_.proposed += width - 1;
  counters_.accepted += static_cast<uint64_t>(outcome->accepted);
  if (online_width_) DHS_CHECK_OK(online_width_->ObserveRound(static_cast<int64_t>(width) - 1, outcome->accepted));
  if (counters_.width_rounds.size() <= width) counters_.width_rounds.resize(width + 1, 0);
  ++counters_.width_rounds[width];
  return outcome;
}

void SpeculativeRounds::ObserveStep(int64_t queries, std::chrono::steady_clock::duration took) {
  if (!online_width_) return;
  // queries >= 1, time > 0
  DHS_CHECK_OK(online_width_->ObserveStep(queries, std::chrono::duration<double, std::micro>(took).count() + 1e-3));
}

void SpeculativeRounds::Release(RoundState& s) {
  if (s.slot < 0) return;
  proposer_->Release(s.slot);
  slot_used_[static_cast<size_t>(s.slot)] = false;
  s.slot = -1;
}

}  // namespace dhs
