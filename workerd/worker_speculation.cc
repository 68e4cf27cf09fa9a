// workerd/worker_speculation.cc: the Worker's speculative rounds (brief §6; issue 13): see worker.h (AddProposals,
// FinishRound) and workerd/spec/README.md.
//
// A round of a decoding request r at frontier n_r (its anchor, the last emitted token, not fed yet): the proposer
// drafts K_r - 1 tokens; the anchor and the proposals are fed in the batch's one Model::Step (query j sees positions
// <= n_r + j, its own selection); the rows from n_r + 1 on are held unverified (no page holding one is backed up or
// kept); spec::AcceptRound on the K_r rows of logits gives A_r (greedy requests: argmax, identical to plain greedy
// decoding; sampling: the speculative sampling rule with keyed draws); positions n_r .. n_r + A_r are kept, the rest
// dropped (Model::EndVerification), the A_r + 1 tokens are emitted with their queries' logits digests (the same bits
// plain decoding gives: batch-invariant numerics), then the proposer commits A_r.
#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "workerd/spec/synthetic_proposer.h"
#include "workerd/worker.h"

namespace dhs {

absl::Status Worker::CreateProposer() {
  const spec::SpeculationConfig& sc = config_.speculation;
  if (sc.mode == spec::SpeculateMode::kOff) return absl::OkStatus();
  if (absl::Status s = spec::CheckSpeculation(sc, geometry_.max_block, config_.staging_arenas > 0); !s.ok()) return s;
  if (sc.schedule == spec::kOnlineSchedule) {
    absl::StatusOr<spec::OnlineBlockWidth> online = spec::OnlineBlockWidth::Create({.k_max = sc.block});
    if (!online.ok()) return online.status();
    online_width_ = *std::move(online);
  } else if (!sc.schedule.empty()) {
    absl::StatusOr<spec::BlockWidthSchedule> schedule = spec::BlockWidthSchedule::Parse(sc.schedule, sc.block);
    if (!schedule.ok()) return schedule.status();
    schedule_ = *std::move(schedule);
  }
  spec_slot_used_.assign(config_.slots, false);
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
absl::Status Worker::CreateDrafter() {
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

void Worker::KeepHidden(Request& r, Position first, std::span<const float> hidden, size_t rows) {
  if (!WantsHidden(r)) return;
  const auto d = static_cast<size_t>(model_->config().d_model);
  if (first != r.hidden_end || hidden.size() < rows * d) {  // positions fed without their hidden states
    r.hidden_gap = true;
    std::vector<float>().swap(r.target_hidden);
    return;
  }
  r.target_hidden.insert(r.target_hidden.end(), hidden.begin(), hidden.begin() + static_cast<ptrdiff_t>(rows * d));
  r.hidden_end += static_cast<Position>(rows);
}

int64_t Worker::StepWidth(int64_t active) const {
  int64_t width = config_.speculation.block;
  if (online_width_) {
    int64_t joining = 0;  // granted soon: sent to memd and not told to wait
    for (const auto& [id, r] : requests_) {  // waiting, not told to wait (kQueued)
      const RequestPhase p = r->life->held_phase();
      joining += p == RequestPhase::kUnsent || p == RequestPhase::kWaiting;
    }
    width = online_width_->Decide(active, joining, config_.speculation.block).width;
  } else if (schedule_) {
    width = schedule_->WidthFor(active);
  }
  return std::min<int64_t>(width, geometry_.max_block);
}

int64_t Worker::RoundWidth(const Request& r, int64_t width) const {
  if (!proposer_) return 1;
  const int64_t remaining = static_cast<int64_t>(r.max_new) - static_cast<int64_t>(r.generated.size());
  return std::max<int64_t>(1, std::min(width, remaining));
}

void Worker::AddProposals(std::vector<BatchItem>& items) {
  if (!proposer_) return;
  const int64_t step_width = StepWidth(static_cast<int64_t>(active_requests()));
  std::vector<spec::DraftRequest> drafts;
  std::vector<std::vector<model::Token>> histories;  // the spans of `drafts` point here
  std::vector<BatchItem*> which;
  histories.reserve(items.size());
  for (BatchItem& item : items) {
    Request& r = *item.r;
    if (r.fed < static_cast<Position>(r.input.size()) || r.generated.empty()) continue;  // prefilling
    const int64_t width = RoundWidth(r, step_width);
    if (width < 2) continue;
    // The drafter needs the hidden states of every position since its slot's last round (all, on the first).
    if (drafter_ && (r.hidden_gap || r.hidden_end != r.fed || (r.spec_slot < 0 && r.hidden_from != 0))) continue;
    if (r.spec_slot < 0) {
      auto free = std::find(spec_slot_used_.begin(), spec_slot_used_.end(), false);
      if (free == spec_slot_used_.end()) continue;
      *free = true;
      r.spec_slot = static_cast<int>(free - spec_slot_used_.begin());
    }
    const std::vector<model::Token>& all = histories.emplace_back(r.Tokens());
    drafts.push_back(spec::DraftRequest{r.spec_slot, spec::RoundKey{r.seed, r.client_id, r.fed}, all,
                                        r.target_hidden, width - 1, r.greedy});
    which.push_back(&item);
  }
  if (drafts.empty()) return;
  std::vector<spec::DraftResult> results(drafts.size());
  const auto start = std::chrono::steady_clock::now();
  absl::Status proposed = proposer_->Propose(drafts, results);
  stats_.spec_propose_us += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
  if (!proposed.ok()) {
    spdlog::warn("worker: the proposer failed ({}); this step decodes without speculation", proposed.ToString());
    return;
  }
  for (size_t i = 0; i < which.size(); ++i) {
    BatchItem& item = *which[i];
    Request& r = *item.r;
    std::vector<float>().swap(r.target_hidden);  // the drafter consumed them: its slot's frontier is past them
    r.hidden_from = r.hidden_end;
    absl::Status held = results[i].tokens.empty() ? absl::CancelledError("no proposal")
                                                  : model_->BeginVerification(*r.session, kv());
    if (!held.ok()) {  // a plain step; the proposer's round ends with nothing accepted
      if (!absl::IsCancelled(held)) spdlog::warn("worker: request {} steps plainly: {}", r.id, held.ToString());
      proposer_->Commit(r.spec_slot, 0).IgnoreError();
      continue;
    }
    item.draft = std::move(results[i]);
    item.tokens.insert(item.tokens.end(), item.draft.tokens.begin(), item.draft.tokens.end());
    item.round = true;
  }
}

absl::Status Worker::FinishRound(BatchItem& item, std::span<const float> logits, std::span<const float> hidden) {
  Request& r = *item.r;
  const Position n = r.fed;
  const std::vector<spec::Proposal> proposals = item.draft.proposals();
  absl::StatusOr<spec::RoundOutcome> outcome =
      spec::AcceptRound(r.greedy ? spec::AcceptMode::kGreedy : spec::AcceptMode::kSampling, logits, r.sampling,
                        proposals, spec::RoundKey{r.seed, r.client_id, n});
  if (!outcome.ok()) return outcome.status();
  const Position length = n + outcome->accepted + 1;
  if (absl::Status s = model_->EndVerification(*r.session, length, kv()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("request ", r.client_id, " failed committing its round: ", s.message()));
  }
  if (absl::Status s = proposer_->Commit(r.spec_slot, outcome->accepted); !s.ok()) {
    spdlog::warn("worker: proposer commit of request {}: {}", r.id, s.ToString());  // it restarts the slot
    r.hidden_gap = true;  // a restarted drafter slot would need every position's hidden state again
  }
  KeepHidden(r, n, hidden, static_cast<size_t>(outcome->accepted) + 1);  // the kept positions n .. n + A_r
  r.fed = length;
  for (size_t j = 0; j < outcome->emitted.size(); ++j) {
    RecordToken(r, outcome->emitted[j], logits.subspan(j * model::kVocab, model::kVocab));
  }
  const size_t width = item.tokens.size();
  ++stats_.spec_rounds;
  stats_.spec_round_tokens += outcome->emitted.size();
  stats_.spec_proposed += width - 1;
  stats_.spec_accepted += static_cast<uint64_t>(outcome->accepted);
  if (online_width_) online_width_->ObserveRound(static_cast<int64_t>(width) - 1, outcome->accepted).IgnoreError();
  if (stats_.spec_width_rounds.size() <= width) stats_.spec_width_rounds.resize(width + 1, 0);
  ++stats_.spec_width_rounds[width];
  return absl::OkStatus();
}

void Worker::ReleaseSpecSlot(Request& r) {
  if (r.spec_slot < 0) return;
  proposer_->Release(r.spec_slot);
  spec_slot_used_[static_cast<size_t>(r.spec_slot)] = false;
  r.spec_slot = -1;
}

}  // namespace dhs
