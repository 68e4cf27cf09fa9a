// tests/speculation/drafter_test.cc: the built-in drafter (workerd/speculation/drafter.h, drafter_model.h; brief §6, §8; issue 13).
//   - the ring never grows: draft_ring_bytes = N * R_d * draft_bytes_per_row (numbers by hand) while positions run to
//     many times R_d;
//   - windowed attention over the ring equals a direct computation over the last W positions: an independent
//     reference in this file (double precision, plain loops over the whole history, tensors read from the weights
//     file), which a window of W - 1 or W + 1 does not match;
//   - state exactness: after rounds with rejected proposals, each round's proposals are bit-identical to those of a
//     fresh drafter fed only the committed history; determinism across batch composition;
//   - confidence mode cuts at the first proposal whose q(x) is under the threshold; greedy mode's q is one-hot;
//   - bad configurations, files and calls are refused with clear errors and change nothing;
//   - weights: same seed same bytes, save/load round trip, dhs-gen-weights --drafter;
//   - the optional distillation raises agreement with the target, and the whole round contract with the real target
//     (Propose, one verification pass, AcceptRound, Commit, target_hidden) gives plain greedy's tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>

#include "tests/speculation/drafter_test_util.h"
#include "workerd/model/model.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/sampling.h"
#include "workerd/speculation/acceptance.h"
#include "workerd/speculation/drafter_distill.h"

namespace dhs::spec {
namespace {

using testing::Driver;
using testing::HiddenAt;
using testing::MakeDrafter;
using testing::SmallConfig;
using testing::TokenAt;

model::ModelConfig Target() { return *model::PresetConfig("dsv4flash-like"); }  // d_model 64

std::unique_ptr<DrafterProposer> NewProposer(std::shared_ptr<const DrafterModel> m, DrafterOptions o) {
  auto p = DrafterProposer::Create(std::move(m), Target(), o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? std::move(*p) : nullptr;
}

bool SameResult(const DraftResult& a, const DraftResult& b) {
  if (a.tokens != b.tokens || a.q.size() != b.q.size()) return false;
  for (size_t j = 0; j < a.q.size(); ++j) {
    if (a.q[j].size() != b.q[j].size() ||
        std::memcmp(a.q[j].data(), b.q[j].data(), a.q[j].size() * sizeof(double)) != 0) {
      return false;
    }
  }
  return true;
}

// A fresh proposer's round for a committed history (tokens 0 .. n, hidden states of 0 .. n - 1 in one request).
DraftResult FreshRound(std::shared_ptr<const DrafterModel> m, const DrafterOptions& o,
                       std::span<const model::Token> tokens, RequestId request, uint32_t salt, int64_t max_proposals) {
  auto p = NewProposer(m, o);
  std::vector<float> hidden;
  const Position n = static_cast<Position>(tokens.size()) - 1;
  for (Position t = 0; t < n; ++t) HiddenAt(t, salt, m->config().target_d_model, hidden);
  DraftRequest r{.slot = 0, .key = {99, request, n}, .tokens = tokens, .target_hidden = hidden,
                 .max_proposals = max_proposals};
  DraftResult res;
  EXPECT_TRUE(p->Propose(std::span(&r, 1), std::span(&res, 1)).ok());
  return res;
}

// ---- Independent reference: the drafter's definition (drafter_model.h) in double, over the whole history. ----
class Reference {
 public:
  Reference(const DrafterConfig& c, uint64_t seed, int window) : c_(c), window_(window) {
    auto file = model::SafetensorsFile::Parse(GenerateDrafterWeights(c, seed)->Serialize());
    for (const auto& spec : DrafterTensorSpecs(c)) {
      auto data = file->ReadF32(spec.name, spec.shape);
      t_[spec.name].assign(data->begin(), data->end());
    }
  }
  // Feeds positions 0 .. T-1; features[t] empty = none. logits[t] (kVocab) and predicted feature[t] (Dt) out.
  void Run(const std::vector<model::Token>& tokens, const std::vector<std::vector<double>>& features,
           std::vector<std::vector<double>>& logits, std::vector<std::vector<double>>& predicted) const {
    const int D = c_.d_model, A = c_.n_heads * c_.head_dim, T = static_cast<int>(tokens.size());
    std::vector<std::vector<double>> x(T);
    for (int t = 0; t < T; ++t) {
      x[t].assign(t_.at("tok_emb").begin() + tokens[t] * D, t_.at("tok_emb").begin() + (tokens[t] + 1) * D);
      if (!features[t].empty()) Add(x[t], MatVec("w_in", Norm(features[t], "feat_norm")));
    }
    for (int l = 0; l < c_.n_layers; ++l) {
      auto name = [l](const char* s) { return "layers." + std::to_string(l) + "." + s; };
      std::vector<std::vector<double>> q(T), k(T), v(T);
      for (int t = 0; t < T; ++t) {
        const auto xn = Norm(x[t], name("attn_norm"));
        q[t] = Rope(MatVec(name("w_q"), xn), t);
        k[t] = Rope(MatVec(name("w_k"), xn), t);
        v[t] = MatVec(name("w_v"), xn);
      }
      for (int t = 0; t < T; ++t) {
        std::vector<double> o(A, 0.0);
        for (int h = 0; h < c_.n_heads; ++h) Head(q, k, v, t, h, o);
        Add(x[t], MatVec(name("w_o"), o));
        auto ff = MatVec(name("w_up"), Norm(x[t], name("mlp_norm")));
        for (double& f : ff) f = f / (1.0 + std::exp(-f));
        Add(x[t], MatVec(name("w_down"), ff));
      }
    }
    logits.resize(T);
    predicted.resize(T);
    for (int t = 0; t < T; ++t) {
      const auto h = Norm(x[t], "final_norm");
      logits[t] = MatVec("lm_head", h);
      predicted[t] = MatVec("w_feat", h);
    }
  }

 private:
  void Head(const std::vector<std::vector<double>>& q, const std::vector<std::vector<double>>& k,
            const std::vector<std::vector<double>>& v, int t, int h, std::vector<double>& o) const {
    const int dh = c_.head_dim, first = std::max(0, t - window_ + 1);
    std::vector<double> s;
    double mx = -1e300;
    for (int p = first; p <= t; ++p) {
      double d = 0.0;
      for (int i = 0; i < dh; ++i) d += q[t][h * dh + i] * k[p][h * dh + i];
      s.push_back(d / std::sqrt(static_cast<double>(dh)));
      mx = std::max(mx, s.back());
    }
    double sum = 0.0;
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (int p = first; p <= t; ++p) {
      for (int i = 0; i < dh; ++i) o[h * dh + i] += s[p - first] / sum * v[p][h * dh + i];
    }
  }
  std::vector<double> Rope(std::vector<double> u, int t) const {
    const int dh = c_.head_dim;
    for (int h = 0; h < c_.n_heads; ++h) {
      for (int i = 0; i < dh / 2; ++i) {
        const double a = t * std::pow(static_cast<double>(c_.rope_theta), -2.0 * i / dh);
        double& x0 = u[h * dh + 2 * i];
        double& x1 = u[h * dh + 2 * i + 1];
        const double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x0 * std::sin(a) + x1 * std::cos(a);
        x0 = r0;
        x1 = r1;
      }
    }
    return u;
  }
  std::vector<double> Norm(const std::vector<double>& x, const std::string& gain) const {
    double ss = 0.0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c_.norm_eps);
    std::vector<double> out(x.size());
    for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * t_.at(gain)[i];
    return out;
  }
  std::vector<double> MatVec(const std::string& w, const std::vector<double>& x) const {
    const auto& m = t_.at(w);
    const size_t rows = m.size() / x.size();
    std::vector<double> y(rows, 0.0);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < x.size(); ++i) y[r] += m[r * x.size() + i] * x[i];
    }
    return y;
  }
  static void Add(std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  }

  DrafterConfig c_;
  int window_;
  std::map<std::string, std::vector<float>> t_;
};

// The largest |log q - log softmax(reference logits)| over ids with q > 1e-12.
double LogProbError(const std::vector<double>& q, const std::vector<double>& ref_logits) {
  double mx = -1e300, sum = 0.0, err = 0.0;
  for (double v : ref_logits) mx = std::max(mx, v);
  for (double v : ref_logits) sum += std::exp(v - mx);
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i] > 1e-12) err = std::max(err, std::abs(std::log(q[i]) - (ref_logits[i] - mx - std::log(sum))));
  }
  return err;
}

// The largest log-probability error of a round's q_1 and q_2 (the anchor's distribution, then x_1's, fed with the
// anchor's predicted feature) against `ref` over the committed history `tokens` (hidden states of salt 3).
double RoundError(const Reference& ref, std::vector<model::Token> tokens, const DraftResult& res) {
  const int dt = SmallConfig().target_d_model;
  std::vector<std::vector<double>> features(tokens.size() + 1), logits, predicted;
  std::vector<float> h;
  for (size_t t = 1; t < tokens.size(); ++t) {
    h.clear();
    HiddenAt(static_cast<Position>(t) - 1, 3, dt, h);
    features[t].assign(h.begin(), h.end());
  }
  ref.Run(tokens, std::vector<std::vector<double>>(features.begin(), features.end() - 1), logits, predicted);
  features.back() = predicted.back();  // two passes: the anchor's predicted feature feeds x_1
  tokens.push_back(res.tokens[0]);
  ref.Run(tokens, features, logits, predicted);
  const size_t n = tokens.size() - 2;
  return std::max(LogProbError(res.q[0], logits[n]), LogProbError(res.q[1], logits[n + 1]));
}

TEST(Drafter, RingNeverGrowsAndMatchesDirectWindowedAttention) {
  const DrafterConfig c = SmallConfig();
  auto m = MakeDrafter(c);
  ASSERT_NE(m, nullptr);
  // W = 8, K_max = 4, p = 4: R_d = 4 * ceil((8 + 4 + 3) / 4) = 16 rows; a row: 2 layers * (k + v) * 2 heads * 8
  // floats = 64 floats = 256 bytes; N = 3 slots: 3 * 16 * 256 = 12,288 bytes.
  auto p = NewProposer(m, {.slots = 3, .page_rows = 4});
  ASSERT_EQ(p->ring().geometry().rows_per_slot(), 16);
  EXPECT_EQ(c.draft_bytes_per_row(), 256);
  EXPECT_EQ(p->draft_ring_bytes(), 12288);
  const Reference ref(c, 1, c.window), wider(c, 1, c.window + 1), narrower(c, 1, c.window - 1);
  Driver d(*p, 1, 5, 3, 2);
  std::mt19937_64 rng(11);
  double worst = 0.0, wider_best = 1e300, narrower_best = 1e300;
  int checks = 0;
  for (int round = 0; d.frontier() < 10 * 16; ++round) {  // positions up to 10 R_d: the ring wraps many times
    std::vector<float> hidden;
    DraftRequest r = d.Request(3, hidden);
    DraftResult res;
    ASSERT_TRUE(p->Propose(std::span(&r, 1), std::span(&res, 1)).ok());
    ASSERT_EQ(res.tokens.size(), 3u);
    EXPECT_EQ(p->draft_ring_bytes(), 12288);
    if (round % 3 == 0) {
      const size_t n = static_cast<size_t>(d.frontier());
      worst = std::max(worst, RoundError(ref, d.tokens(), res));
      if (n > static_cast<size_t>(c.window)) {  // windows of W +- 1 differ only past W positions
        wider_best = std::min(wider_best, RoundError(wider, d.tokens(), res));
        narrower_best = std::min(narrower_best, RoundError(narrower, d.tokens(), res));
      }
      ++checks;
    }
    const int64_t a = static_cast<int64_t>(rng() % 4);
    ASSERT_TRUE(d.Commit(res, a).ok());
    // The ring holds the anchor and the accepted proposals it wrote (x_3, never fed, is not among them).
    EXPECT_EQ(p->ring().frontier(1), a < 3 ? d.frontier() : d.frontier() - 1);
  }
  EXPECT_GT(checks, 10);
  EXPECT_LT(worst, 1e-4) << "drafter vs the direct windowed computation";
  std::printf("largest log-probability error vs the reference: %.3g (W - 1: at least %.3g, W + 1: %.3g)\n", worst,
              narrower_best, wider_best);
  // The check has power: a window one wider or narrower is far off at every checked round past W.
  EXPECT_GT(wider_best, 1e-2);
  EXPECT_GT(narrower_best, 1e-2);
}

// Rounds with random acceptance (0 .. all): each round's proposals equal, bit for bit, those of a fresh drafter fed
// only the committed history (it never saw a rejected token nor drafted the accepted ones).
TEST(Drafter, RejectedProposalsLeaveNoTrace) {
  auto m = MakeDrafter(SmallConfig());
  for (bool greedy : {false, true}) {
    const DrafterOptions o{.slots = 2, .page_rows = 4, .greedy = greedy};
    auto p = NewProposer(m, o);
    Driver d(*p, 1, 8, 4, 5);
    std::mt19937_64 rng(3);
    int rejected_rounds = 0;
    for (int round = 0; round < 30; ++round) {
      std::vector<float> hidden;
      DraftRequest r = d.Request(3, hidden);
      DraftResult res;
      ASSERT_TRUE(p->Propose(std::span(&r, 1), std::span(&res, 1)).ok());
      EXPECT_TRUE(SameResult(res, FreshRound(m, o, d.tokens(), 8, 4, 3))) << "round " << round << " greedy " << greedy;
      const int64_t a = static_cast<int64_t>(rng() % 5);  // 4 = all accepted
      rejected_rounds += a < 3;
      ASSERT_TRUE(d.Commit(res, a).ok());
    }
    EXPECT_GT(rejected_rounds, 10);
  }
}

// Four requests on four slots: alone (one proposer each), all in one batch, and in changing compositions and orders:
// identical proposals and q bits (batch-invariant numerics, keyed draws).
TEST(Drafter, ProposalsDoNotDependOnTheBatch) {
  auto m = MakeDrafter(SmallConfig());
  const DrafterOptions o{.slots = 4, .page_rows = 4};
  auto together = NewProposer(m, o);
  std::vector<std::unique_ptr<DrafterProposer>> alone;
  std::vector<Driver> da, dt;
  const Position prompts[] = {0, 3, 17, 40};
  for (int i = 0; i < 4; ++i) {
    alone.push_back(NewProposer(m, o));
    da.emplace_back(*alone.back(), i, 100 + i, 20 + i, prompts[i]);
    dt.emplace_back(*together, i, 100 + i, 20 + i, prompts[i]);
  }
  int compared = 0;
  for (int round = 0; round < 12; ++round) {
    std::vector<int> members;  // a changing subset, in a changing order
    for (int i = 0; i < 4; ++i) {
      if ((round + i) % 3 != 0) members.push_back(round % 2 ? 3 - i : i);
    }
    std::vector<std::vector<float>> hidden(4), hidden_alone(4);
    std::vector<DraftRequest> batch;
    for (int i : members) batch.push_back(dt[i].Request(1 + (i + round) % 3, hidden[i]));
    std::vector<DraftResult> out(batch.size());
    ASSERT_TRUE(together->Propose(batch, out).ok());
    for (size_t b = 0; b < members.size(); ++b) {
      const int i = members[b];
      DraftRequest r = da[i].Request(1 + (i + round) % 3, hidden_alone[i]);
      DraftResult res;
      ASSERT_TRUE(alone[i]->Propose(std::span(&r, 1), std::span(&res, 1)).ok());
      EXPECT_TRUE(SameResult(res, out[b])) << "request " << i << " round " << round;
      compared += static_cast<int>(res.tokens.size());
      const int64_t a = (round * 7 + i) % 4;
      ASSERT_TRUE(da[i].Commit(res, a).ok());
      ASSERT_TRUE(dt[i].Commit(out[b], a).ok());
    }
  }
  EXPECT_GT(compared, 40);
}

// Confidence mode proposes the prefix of fixed mode's proposals up to (not including) the first whose q(x) is under
// the threshold; every threshold among the observed confidences is tried, so every cut position occurs.
TEST(Drafter, ConfidenceModeCutsWhereQFallsUnderTheThreshold) {
  auto m = MakeDrafter(SmallConfig());
  std::vector<model::Token> history;
  for (Position t = 0; t <= 30; ++t) history.push_back(TokenAt(t, 9));
  for (bool greedy : {false, true}) {
    const DrafterOptions fixed{.slots = 1, .page_rows = 4, .greedy = greedy};
    const DraftResult all = FreshRound(m, fixed, history, 1, 9, 3);
    ASSERT_EQ(all.tokens.size(), 3u);
    if (greedy) {  // greedy proposals: q is the one-hot they were drawn from
      for (size_t j = 0; j < 3; ++j) {
        EXPECT_EQ(all.q[j][all.tokens[j]], 1.0);
        double sum = 0.0;
        for (double v : all.q[j]) sum += v;
        EXPECT_EQ(sum, 1.0);
      }
      continue;
    }
    std::vector<double> conf;
    for (size_t j = 0; j < 3; ++j) conf.push_back(all.q[j][all.tokens[j]]);
    std::set<size_t> cuts;
    std::vector<double> thresholds = conf;
    thresholds.push_back(0.0);
    thresholds.push_back(1.0);
    for (double thr : thresholds) {
      size_t expect = 0;
      while (expect < 3 && conf[expect] >= thr) ++expect;
      DrafterOptions o = fixed;
      o.mode = DraftMode::kConfidence;
      o.threshold = thr;
      const DraftResult cut = FreshRound(m, o, history, 1, 9, 3);
      ASSERT_EQ(cut.tokens.size(), expect) << "threshold " << thr;
      for (size_t j = 0; j < expect; ++j) {
        EXPECT_EQ(cut.tokens[j], all.tokens[j]);
        EXPECT_EQ(cut.q[j], all.q[j]);
      }
      cuts.insert(expect);
    }
    EXPECT_GE(cuts.size(), 3u);  // thresholds 0 (all 3) and 1 (none, unless q = 1) and the interior cuts
  }
}

TEST(Drafter, BadConfigurationsAreRefusedWithTheNumbers) {
  auto m = MakeDrafter(SmallConfig());
  // W = 8, K_max = 4, p = 4 need R_d = 16 rows: a ring of 12 is refused with the formula's numbers.
  auto small = DrafterProposer::Create(m, Target(), {.slots = 2, .page_rows = 4, .ring_rows = 12});
  ASSERT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(small.status().message());
  EXPECT_NE(msg.find("4 * ceil((8 + 4 + 4 - 1) / 4) = 16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("K_max <= 1"), std::string::npos) << msg;  // 8 + K + 3 <= 12
  // 20 rows: K_max 9 fits (8 + 9 + 3 = 20: 5 pages), 10 does not.
  EXPECT_TRUE(DrafterProposer::Create(m, Target(), {.page_rows = 4, .ring_rows = 20, .k_max = 9}).ok());
  auto big_k = DrafterProposer::Create(m, Target(), {.page_rows = 4, .ring_rows = 20, .k_max = 10});
  ASSERT_FALSE(big_k.ok());
  EXPECT_NE(std::string(big_k.status().message()).find("K_max <= 9"), std::string::npos) << big_k.status();
  // A target of another width, a bad temperature or threshold.
  auto glm_wide = model::PresetConfig("bench-wide");
  auto other = DrafterProposer::Create(m, *glm_wide, {});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(std::string(other.status().message()).find("d_model 64, the target has d_model 1024"), std::string::npos);
  EXPECT_FALSE(DrafterProposer::Create(m, Target(), {.temperature = 0.0f}).ok());
  EXPECT_FALSE(DrafterProposer::Create(m, Target(), {.threshold = 1.5}).ok());
  DrafterConfig odd = SmallConfig();
  odd.head_dim = 7;
  EXPECT_EQ(GenerateDrafterWeights(odd, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Drafter, BadCallsAreRefusedAndChangeNothing) {
  auto m = MakeDrafter(SmallConfig());
  const DrafterOptions o{.slots = 2, .page_rows = 4};
  auto p = NewProposer(m, o), clean = NewProposer(m, o);
  Driver d(*p, 0, 1, 2, 6), dc(*clean, 0, 1, 2, 6);
  std::vector<float> hidden, hidden_c;
  DraftResult res, res_c;
  auto expect_refused = [&](DraftRequest r, absl::StatusCode code, const char* what) {
    DraftResult out;
    EXPECT_EQ(p->Propose(std::span(&r, 1), std::span(&out, 1)).code(), code) << what;
  };
  DraftRequest good = d.Request(3, hidden);
  DraftRequest bad = good;
  bad.slot = 2;
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "slot out of range");
  bad = good;
  bad.max_proposals = 4;  // K_max - 1 = 3
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "too many proposals");
  bad = good;
  bad.target_hidden = bad.target_hidden.first(bad.target_hidden.size() - 1);
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "short hidden");
  std::vector<float> nan_hidden(good.target_hidden.begin(), good.target_hidden.end());
  nan_hidden[70] = std::nanf("");
  bad = good;
  bad.target_hidden = nan_hidden;
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "hidden state not finite");
  bad = good;
  bad.tokens = bad.tokens.first(bad.tokens.size() - 1);
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "tokens != frontier + 1");
  std::vector<model::Token> bad_tokens(good.tokens.begin(), good.tokens.end());
  bad_tokens[2] = 300;
  bad = good;
  bad.tokens = bad_tokens;
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "token out of range");
  EXPECT_EQ(p->Commit(0, 0).code(), absl::StatusCode::kInvalidArgument);  // nothing open
  // A batch with a bad second request changes nothing for the good first one.
  DraftRequest pair[2] = {good, good};
  pair[1].slot = 0;
  DraftResult two[2];
  EXPECT_EQ(p->Propose(pair, two).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(p->Propose(std::span(&good, 1), std::span(&res, 1)).ok());
  DraftRequest good_c = dc.Request(3, hidden_c);
  ASSERT_TRUE(clean->Propose(std::span(&good_c, 1), std::span(&res_c, 1)).ok());
  EXPECT_TRUE(SameResult(res, res_c));
  // Propose again before Commit; Commit of more than proposed; a request that is not the slot's.
  expect_refused(good, absl::StatusCode::kFailedPrecondition, "round awaiting its commit");
  EXPECT_EQ(p->Commit(0, 4).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(d.Commit(res, 1).ok());
  EXPECT_EQ(p->Commit(0, 0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(dc.Commit(res_c, 1).ok());
  DraftRequest next = d.Request(3, hidden);
  bad = next;
  bad.key.request = 77;
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "another request");
  ASSERT_TRUE(p->Propose(std::span(&next, 1), std::span(&res, 1)).ok());
  DraftRequest next_c = dc.Request(3, hidden_c);
  ASSERT_TRUE(clean->Propose(std::span(&next_c, 1), std::span(&res_c, 1)).ok());
  EXPECT_TRUE(SameResult(res, res_c));
  // Release frees the slot for another request, which starts from nothing.
  p->Release(0);
  EXPECT_FALSE(p->ring().open(0));
}

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(DrafterWeights, DeterministicSaveLoadRoundTripAndTool) {
  const DrafterConfig c = SmallConfig();
  const std::string a = GenerateDrafterWeights(c, 5)->Serialize();
  EXPECT_EQ(a, GenerateDrafterWeights(c, 5)->Serialize());
  EXPECT_NE(a, GenerateDrafterWeights(c, 6)->Serialize());
  const auto dir = std::filesystem::temp_directory_path() / ("dhs_drafter_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(GenerateDrafterWeights(c, 5)->WriteFile((dir / "d.st").string()).ok());
  auto loaded = DrafterModel::Load((dir / "d.st").string());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config().ToJson(), c.ToJson());
  EXPECT_EQ((*loaded)->ToSafetensors().Serialize(), a);  // save after load: the same bytes
  auto via_file = DrafterProposer::Load((dir / "d.st").string(), Target(), {.page_rows = 4});
  ASSERT_TRUE(via_file.ok()) << via_file.status();
  std::vector<model::Token> history(12, 65);
  EXPECT_TRUE(SameResult(FreshRound(MakeDrafter(c, 5), {.page_rows = 4}, history, 1, 1, 3),
                         FreshRound(std::shared_ptr<const DrafterModel>(std::move(*loaded)), {.page_rows = 4},
                                    history, 1, 1, 3)));
  EXPECT_EQ(DrafterModel::Load((dir / "missing.st").string()).status().code(), absl::StatusCode::kNotFound);
  // dhs-gen-weights --drafter writes the same bytes (the preset's d_model 64 as target_d_model).
  if (const char* exe = std::getenv("DHS_GEN_WEIGHTS"); exe != nullptr) {
    const std::string cmd = std::string(exe) + " --drafter --preset dsv4flash-like --seed 5 --layers 2 --window 8" +
                            " --k-max 4 --out " + (dir / "tool.st").string();
    ASSERT_EQ(std::system(cmd.c_str()), 0);
    DrafterConfig def;  // the tool's defaults for the other sizes
    def.window = 8;
    def.k_max = 4;
    EXPECT_EQ(ReadAll(dir / "tool.st"), GenerateDrafterWeights(def, 5)->Serialize());
  }
  std::filesystem::remove_all(dir);
}

// Bad files: the target's weights (wrong format), a missing tensor, a wrong shape, an extra tensor, an infinity.
TEST(DrafterWeights, BadFilesAreRefusedNamingTheTensor) {
  const DrafterConfig c = SmallConfig();
  const std::string a = GenerateDrafterWeights(c, 5)->Serialize();
  auto parse_error = [](const model::SafetensorsWriter& w) {
    auto f = model::SafetensorsFile::Parse(w.Serialize());
    EXPECT_TRUE(f.ok());
    return DrafterModel::FromSafetensors(*f).status();
  };
  const absl::Status target = parse_error(*model::GenerateWeights(Target(), 1));
  EXPECT_NE(std::string(target.message()).find("expected \"dhs-drafter/1\""), std::string::npos) << target;
  auto rebuild = [&](const std::string& skip, const std::string& reshape, bool extra, const std::string& poison = "") {
    model::SafetensorsWriter w;
    auto f = model::SafetensorsFile::Parse(a);
    for (const auto& spec : DrafterTensorSpecs(c)) {
      if (spec.name == skip) continue;
      auto data = f->ReadF32(spec.name, spec.shape);
      if (spec.name == poison) (*data)[3] = std::numeric_limits<float>::infinity();
      std::vector<int64_t> shape = spec.shape;
      if (spec.name == reshape) shape = {static_cast<int64_t>(data->size())};
      EXPECT_TRUE(w.AddF32(spec.name, shape, *data).ok());
    }
    if (extra) {
      EXPECT_TRUE(w.AddF32("layers.9.w_q", {1}, std::vector<float>{1.0f}).ok());
    }
    for (const auto& [k, v] : f->metadata()) w.SetMetadata(k, v);
    return w;
  };
  const absl::Status missing = parse_error(rebuild("layers.1.w_v", "", false));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(missing.message()).find("layers.1.w_v"), std::string::npos) << missing;
  const absl::Status shape = parse_error(rebuild("", "w_feat", false));
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(shape.message()).find("w_feat"), std::string::npos) << shape;
  const absl::Status extra = parse_error(rebuild("", "", true));
  const absl::Status inf = parse_error(rebuild("", "", false, "layers.0.w_k"));
  EXPECT_NE(std::string(inf.message()).find("'layers.0.w_k' holds a non-finite value"), std::string::npos) << inf;
  EXPECT_NE(std::string(extra.message()).find("unexpected tensor 'layers.9.w_q'"), std::string::npos) << extra;
}

// The fraction of positions of `texts` where the drafter's argmax (fed as in its catch-up, features = the target's
// hidden states) equals the target's argmax of the next token.
double Agreement(const DrafterModel& d, const model::Model& target,
                 const std::vector<std::vector<model::Token>>& texts) {
  const DrafterConfig& c = d.config();
  const DraftRingGeometry g =
      *DraftRingGeometry::Create({.window = c.window, .k_max = c.k_max, .page_rows = 1, .slots = 1});
  int64_t same = 0, all = 0;
  for (const auto& text : texts) {
    auto kv = model::ResidentKvAccess::ForModel(target.config(), 16u << 20, 16);
    model::ModelSession s = target.NewSession(1);
    model::StepInput in{&s, text, true};
    model::StepOutput out;
    EXPECT_TRUE(target.Step(std::span(&in, 1), *kv, std::span(&out, 1)).ok());
    std::vector<float> ring(static_cast<size_t>(g.total_rows() * c.row_floats()));
    for (size_t t = 0; t < text.size(); ++t) {  // one position per call: the catch-up's rows, one by one
      std::span<const float> f;
      if (t > 0) f = std::span<const float>(out.hidden).subspan((t - 1) * c.target_d_model, c.target_d_model);
      DrafterQuery q{0, static_cast<Position>(t), text[t], f};
      DrafterOutput o;
      d.Forward(std::span(&q, 1), g, ring, o);
      same += model::Argmax(o.logits) ==
              model::Argmax(std::span<const float>(out.logits).subspan(t * model::kVocab, model::kVocab));
      ++all;
    }
  }
  return static_cast<double>(same) / static_cast<double>(all);
}

// The optional distillation (drafter_distill.h): output layers fitted on target-sampled texts make the drafter's
// next-token argmax agree with the target's far more often than the random drafter's, on held-out texts too; the
// rest of the file is unchanged and the result is marked in __metadata__.
TEST(DrafterDistill, FittedOutputLayersAgreeWithTheTarget) {
  auto tw = model::GenerateWeights(Target(), 1);
  auto target = model::Model::FromSafetensors(*model::SafetensorsFile::Parse(tw->Serialize()));
  ASSERT_TRUE(target.ok());
  DrafterConfig c;  // the default drafter for a d_model-64 target
  auto random = MakeDrafter(c, 1);
  auto train = SampleTargetTexts(**target, 16, 128, 7);
  auto held_out = SampleTargetTexts(**target, 4, 128, 8);
  ASSERT_TRUE(train.ok() && held_out.ok());
  EXPECT_EQ(*train, *SampleTargetTexts(**target, 16, 128, 7));  // a pure function of the seed
  auto fitted = DistillOutputLayers(*random, **target, *train, {});
  ASSERT_TRUE(fitted.ok()) << fitted.status();
  const double before = Agreement(*random, **target, *held_out), after = Agreement(**fitted, **target, *held_out);
  std::printf("argmax agreement with the target on held-out texts: random drafter %.3f, distilled %.3f\n", before,
              after);
  EXPECT_GT(after, before + 0.1);
  const std::string bytes = (*fitted)->ToSafetensors().Serialize();
  auto file = model::SafetensorsFile::Parse(bytes);
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(file->metadata().contains("distilled"));
  auto orig = model::SafetensorsFile::Parse(random->ToSafetensors().Serialize());
  for (const auto& spec : DrafterTensorSpecs(c)) {
    const bool output = spec.name == "lm_head" || spec.name == "w_feat";
    EXPECT_EQ(*file->ReadF32(spec.name, spec.shape) == *orig->ReadF32(spec.name, spec.shape), !output) << spec.name;
  }
  EXPECT_EQ(DistillOutputLayers(*random, **target, *train, {.ridge = 0.0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The whole round contract with the real target: Propose -> one target pass over the anchor and the proposals (a
// fresh session that imports the committed history: the model cannot roll back) -> AcceptRound (greedy) -> Commit ->
// the next round's target_hidden = that pass's hidden states of the kept positions. The emitted tokens equal plain
// greedy decoding, token for token (the distilled drafter gets some proposals accepted, so every path runs).
TEST(DrafterDistill, GreedySpeculationWithTheDrafterEqualsPlainGreedy) {
  auto tw = model::GenerateWeights(Target(), 1);
  auto target = model::Model::FromSafetensors(*model::SafetensorsFile::Parse(tw->Serialize()));
  ASSERT_TRUE(target.ok());
  const model::Model& t = **target;
  auto texts = SampleTargetTexts(t, 16, 128, 7);
  auto fitted = DistillOutputLayers(*MakeDrafter(DrafterConfig{}, 1), t, *texts, {});
  ASSERT_TRUE(fitted.ok());
  auto p = NewProposer(std::shared_ptr<const DrafterModel>(std::move(*fitted)), {.slots = 1, .greedy = true});
  const std::string prompt = "Speculative decoding keeps the output bits. ";
  std::vector<model::Token> tokens(prompt.begin(), prompt.end());
  auto run = [&](std::span<const model::Token> history, std::span<const model::Token> feed, model::StepOutput& out) {
    auto kv = model::ResidentKvAccess::ForModel(t.config(), 16u << 20, 16);
    model::ModelSession s = t.NewSession(1);
    if (!history.empty()) {
      ASSERT_TRUE(t.ImportPrefix(s, history, *kv).ok());
    }
    model::StepInput in{&s, feed, true};
    ASSERT_TRUE(t.Step(std::span(&in, 1), *kv, std::span(&out, 1)).ok());
  };
  model::StepOutput first;
  run({}, tokens, first);  // prefill: the first anchor and the hidden states of the prompt
  std::vector<float> hidden = first.hidden;
  tokens.push_back(model::Argmax(std::span<const float>(first.logits).last(model::kVocab)));
  const size_t P = prompt.size(), generate = 64;
  int64_t accepted = 0;
  while (tokens.size() < P + generate) {
    const Position n = static_cast<Position>(tokens.size()) - 1;
    DraftRequest r{.slot = 0, .key = {1, 1, n}, .tokens = tokens, .target_hidden = hidden, .max_proposals = 3};
    DraftResult res;
    ASSERT_TRUE(p->Propose(std::span(&r, 1), std::span(&res, 1)).ok());
    std::vector<model::Token> block = {tokens.back()};
    block.insert(block.end(), res.tokens.begin(), res.tokens.end());
    model::StepOutput verify;
    run(std::span(tokens).first(n), block, verify);
    auto outcome = AcceptRound(AcceptMode::kGreedy, verify.logits, {}, res.proposals(), r.key);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    ASSERT_TRUE(p->Commit(0, outcome->accepted).ok());
    accepted += outcome->accepted;
    hidden.assign(verify.hidden.begin(), verify.hidden.begin() + (outcome->accepted + 1) * t.config().d_model);
    tokens.insert(tokens.end(), outcome->emitted.begin(), outcome->emitted.end());
  }
  // Plain greedy decoding, token by token.
  std::vector<model::Token> plain(prompt.begin(), prompt.end());
  auto kv = model::ResidentKvAccess::ForModel(t.config(), 16u << 20, 16);
  model::ModelSession s = t.NewSession(1);
  std::vector<model::Token> feed = plain;
  while (plain.size() < tokens.size()) {
    model::StepInput in{&s, feed};
    model::StepOutput out;
    ASSERT_TRUE(t.Step(std::span(&in, 1), *kv, std::span(&out, 1)).ok());
    plain.push_back(model::Argmax(std::span<const float>(out.logits).last(model::kVocab)));
    feed = {plain.back()};
  }
  EXPECT_EQ(tokens, plain);
  EXPECT_GT(accepted, 0);
  std::printf("greedy speculation with the distilled drafter: %lld proposals accepted over %zu tokens\n",
              static_cast<long long>(accepted), tokens.size() - P);
}

}  // namespace
}  // namespace dhs::spec
