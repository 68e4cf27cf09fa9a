// tests/workerd/speculative_rounds_test.cc: SpeculativeRounds (workerd/speculative_rounds.h) alone (issue 23: each
// room moved out of the Worker is tested alone), driven the way the Worker drives it: one request on a resident KV
// and the model, Propose -> one Model::Step of the anchor and the proposals -> Finish. Asserted against values
// computed independently: the block width K_r of each round from the --block-schedule text at the round's live
// sessions (and capped by the tokens left), the A_r + 1 tokens committed per round with the synthetic proposer
// (corruption 0: every proposal is the target's greedy token, A_r = K_r - 1; corruption 1: the first proposal is
// always another token, A_r = 0), the emitted tokens equal to the model alone decoding greedily, and the counters.
#include <gtest/gtest.h>

#include <vector>

#include "tests/workerd/worker_test_util.h"
#include "workerd/geometry.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/sampling.h"
#include "workerd/speculative_rounds.h"

namespace dhs::test {
namespace {

std::vector<model::Token> Tokens(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

WorkerConfig RoundsConfig(const model::Model& m, double corruption, std::string schedule) {
  WorkerConfig c;
  c.mode = WorkerMode::kResident;
  c.page_rows = 16;
  c.tail_rows = 32;
  c.slots = 1;  // one proposer slot: a second request gets none while the first holds it
  c.hot_rows = static_cast<uint32_t>(4 * (m.config().top_k + m.config().local_window));  // max_block 4
  c.speculation.mode = spec::SpeculateMode::kSynthetic;
  c.speculation.block = 4;
  c.speculation.corruption = corruption;
  c.speculation.schedule = std::move(schedule);
  return c;
}

// One request decoded greedily through the rounds: its prompt prefilled by one plain step, then per iteration the
// live-session count `active[i]` (the last entries repeat) and one Propose / Step / Finish (or a plain step when no
// round opens).
struct Decoded {
  std::vector<model::Token> tokens;   // every token emitted, the prefill's first
  std::vector<int64_t> widths;        // per iteration: K_r (1 = a plain step)
  std::vector<int32_t> accepted;      // per round: A_r
};

Decoded Decode(const model::Model& m, SpeculativeRounds& rounds, const std::vector<model::Token>& prompt,
               uint32_t max_new, const std::vector<int64_t>& active) {
  auto kv = model::ResidentKvAccess::ForModel(m.config(), size_t{64} << 20, 4);
  model::ModelSession session = m.NewSession(1);
  Decoded d;
  std::vector<model::Token> all = prompt;
  auto step = [&](std::vector<model::Token> feed) {
    model::StepInput in{&session, feed, rounds.WantsHidden(RoundState{})};
    model::StepOutput out;
    EXPECT_TRUE(m.Step(std::span<model::StepInput>(&in, 1), *kv, std::span<model::StepOutput>(&out, 1)).ok());
    return out;
  };
  model::StepOutput first = step(prompt);
  d.tokens.push_back(model::Argmax(std::span<const float>(first.logits).last(model::kVocab)));
  all.push_back(d.tokens.back());
  Position fed = static_cast<Position>(prompt.size());
  RoundState state;
  const model::SamplingParams greedy;
  for (size_t i = 0; d.tokens.size() < max_new; ++i) {
    const int64_t live = active[std::min(i, active.size() - 1)];
    const spec::RoundKey key{0, 1, fed};
    RoundCandidate candidate{&state, 1, &session, key, static_cast<int64_t>(max_new - d.tokens.size()), true,
                             [&all] { return all; }};
    std::vector<std::optional<spec::DraftResult>> drafts =
        rounds.Propose(std::span<RoundCandidate>(&candidate, 1), live, 0, *kv);
    EXPECT_EQ(drafts.size(), 1u);
    std::vector<model::Token> feed = {all.back()};
    if (drafts[0]) feed.insert(feed.end(), drafts[0]->tokens.begin(), drafts[0]->tokens.end());
    model::StepOutput out = step(feed);
    std::vector<model::Token> emitted;
    if (drafts[0]) {
      absl::StatusOr<spec::RoundOutcome> outcome =
          rounds.Finish(RoundInput{&state, 1, &session, key, true, &greedy}, *drafts[0], out.logits, out.hidden, *kv);
      EXPECT_TRUE(outcome.ok()) << outcome.status();
      if (!outcome.ok()) break;
      emitted = outcome->emitted;
      d.accepted.push_back(outcome->accepted);
      EXPECT_EQ(session.position(), fed + outcome->accepted + 1);  // positions n_r .. n_r + A_r kept
    } else {
      emitted = {model::Argmax(std::span<const float>(out.logits).last(model::kVocab))};
    }
    d.widths.push_back(static_cast<int64_t>(feed.size()));
    fed += static_cast<Position>(emitted.size());
    for (model::Token t : emitted) {
      d.tokens.push_back(t);
      all.push_back(t);
    }
  }
  rounds.Release(state);
  EXPECT_EQ(state.slot, -1);
  return d;
}

std::unique_ptr<SpeculativeRounds> MakeRounds(const model::Model& m, const WorkerConfig& c) {
  absl::StatusOr<WorkerGeometry> g = ComputeGeometry(m.config(), c);
  EXPECT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->max_block, 4u);
  absl::StatusOr<std::unique_ptr<SpeculativeRounds>> r = SpeculativeRounds::Create(&m, c, *g);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(*r);
}

// "1:4,3:3,5:2": 1-2 live sessions -> K = 4, 3-4 -> 3, 5 and more -> 2 (hand-read from the text). Every proposal is
// the greedy token, so each round commits K_r tokens; the last token (one left) is a plain step.
TEST(SpeculativeRounds, WidthScheduleGivesEachRoundsKAndEveryProposalCommits) {
  auto m = MakePresetModel("dsv4flash-like");
  auto rounds = MakeRounds(*m, RoundsConfig(*m, 0.0, "1:4,3:3,5:2"));
  ASSERT_TRUE(rounds->enabled());
  EXPECT_FALSE(rounds->online());
  const std::vector<model::Token> prompt = Tokens(Prompt(21, 5));
  // prefill 1 token, then rounds at live 1, 3, 5, 2, 4 -> K 4, 3, 2, 4, 3 (16 tokens), then 1 left: plain.
  const Decoded d = Decode(*m, *rounds, prompt, 18, {1, 3, 5, 2, 4, 1});
  EXPECT_EQ(d.widths, (std::vector<int64_t>{4, 3, 2, 4, 3, 1}));
  EXPECT_EQ(d.accepted, (std::vector<int32_t>{3, 2, 1, 3, 2}));
  const Generated oracle = Oracle(*m, prompt, 18);
  EXPECT_EQ(d.tokens, oracle.tokens);
  const RoundCounters& c = rounds->counters();
  EXPECT_EQ(c.rounds, 5u);
  EXPECT_EQ(c.proposed, 3u + 2 + 1 + 3 + 2);
  EXPECT_EQ(c.accepted, 11u);
  EXPECT_EQ(c.round_tokens, 16u);
  ASSERT_EQ(c.width_rounds.size(), 5u);
  EXPECT_EQ(c.width_rounds[4], 2u);
  EXPECT_EQ(c.width_rounds[3], 2u);
  EXPECT_EQ(c.width_rounds[2], 1u);
}

// Corruption 1: the first proposal of every round is another token than the greedy one, so A_r = 0 and each round
// commits only the anchor's correction (1 token, the greedy one); --block 4 at every load without a schedule, capped
// by the tokens left (3 left -> K 3, 2 left -> K 2, 1 left -> plain).
TEST(SpeculativeRounds, EveryProposalRejectedCommitsOneTokenPerRound) {
  auto m = MakePresetModel("dsv4flash-like");
  auto rounds = MakeRounds(*m, RoundsConfig(*m, 1.0, ""));
  const std::vector<model::Token> prompt = Tokens(Prompt(13, 9));
  const Decoded d = Decode(*m, *rounds, prompt, 7, {1});
  EXPECT_EQ(d.widths, (std::vector<int64_t>{4, 4, 4, 3, 2, 1}));
  EXPECT_EQ(d.accepted, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  const Generated oracle = Oracle(*m, prompt, 7);
  EXPECT_EQ(d.tokens, oracle.tokens);
  const RoundCounters& c = rounds->counters();
  EXPECT_EQ(c.rounds, 5u);
  EXPECT_EQ(c.proposed, 3u + 3 + 3 + 2 + 1);
  EXPECT_EQ(c.accepted, 0u);
  EXPECT_EQ(c.round_tokens, 5u);
}

// One proposer slot: a second request gets no round (a plain step) while the first holds the slot; once the first
// is released, the second's round opens.
TEST(SpeculativeRounds, ASlotIsHeldUntilRelease) {
  auto m = MakePresetModel("dsv4flash-like");
  auto rounds = MakeRounds(*m, RoundsConfig(*m, 0.0, ""));
  auto kv = model::ResidentKvAccess::ForModel(m->config(), size_t{64} << 20, 4);
  std::vector<model::ModelSession> sessions;
  sessions.push_back(m->NewSession(1));
  sessions.push_back(m->NewSession(2));
  std::vector<std::vector<model::Token>> all = {Tokens(Prompt(9, 1)), Tokens(Prompt(11, 2))};
  for (int i = 0; i < 2; ++i) {
    model::StepInput in{&sessions[i], all[i]};
    model::StepOutput out;
    ASSERT_TRUE(m->Step(std::span<model::StepInput>(&in, 1), *kv, std::span<model::StepOutput>(&out, 1)).ok());
    all[i].push_back(model::Argmax(std::span<const float>(out.logits).last(model::kVocab)));
  }
  RoundState a, b;
  auto candidate = [&](RoundState& s, int i) {
    return RoundCandidate{&s, static_cast<RequestId>(i + 1), &sessions[i],
                          spec::RoundKey{0, static_cast<RequestId>(i + 1), sessions[i].position()}, 10, true,
                          [&all, i] { return all[i]; }};
  };
  std::vector<RoundCandidate> both = {candidate(a, 0), candidate(b, 1)};
  auto drafts = rounds->Propose(both, 2, 0, *kv);
  ASSERT_EQ(drafts.size(), 2u);
  EXPECT_TRUE(drafts[0].has_value());
  EXPECT_FALSE(drafts[1].has_value());
  EXPECT_EQ(a.slot, 0);
  EXPECT_EQ(b.slot, -1);
  rounds->Release(a);  // request 1 ended (its held round is of no concern here: its own session)
  EXPECT_EQ(a.slot, -1);
  std::vector<RoundCandidate> second = {candidate(b, 1)};
  drafts = rounds->Propose(second, 1, 0, *kv);
  ASSERT_TRUE(drafts[0].has_value());
  EXPECT_EQ(drafts[0]->tokens.size(), 3u);  // K = --block 4: 3 proposals
  EXPECT_EQ(b.slot, 0);
}

}  // namespace
}  // namespace dhs::test
