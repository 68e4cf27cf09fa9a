// The model's forward step: batch invariance, multi-token == token-by-token, topology call pattern (Reuse makes no
// Fetch, followers fetched in one call), ImportPrefix, input errors, sampling, ResidentKvAccess (brief §5, §11).
#include <cstring>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "tests/model/test_util.h"
#include "workerd/model/sampling.h"

namespace dhs::model {
namespace {

using testing::CountingKvAccess;
using testing::MakePreset;
using testing::Tokens;

constexpr size_t kArena = 64u << 20;

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

class PresetTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model_ = MakePreset(GetParam()); }
  std::unique_ptr<ResidentKvAccess> NewKv() { return ResidentKvAccess::ForModel(model_->config(), kArena, 16); }
  // Feeds tokens in chunks of the given sizes; returns the logits of every fed token, concatenated.
  std::vector<float> Feed(ModelSession& s, KvAccess& kv, const std::vector<Token>& tokens,
                          const std::vector<size_t>& chunks) {
    std::vector<float> all;
    size_t at = 0;
    for (size_t c : chunks) {
      StepInput in{&s, std::span<const Token>(tokens).subspan(at, c)};
      StepOutput out;
      EXPECT_TRUE(model_->Step(std::span<StepInput>(&in, 1), kv, std::span<StepOutput>(&out, 1)).ok());
      all.insert(all.end(), out.logits.begin(), out.logits.end());
      at += c;
    }
    return all;
  }
  std::unique_ptr<Model> model_;
};

TEST_P(PresetTest, MultiTokenStepEqualsTokenByToken) {
  const auto tokens = Tokens(60, 1);  // longer than k: selections are sparse
  auto kv1 = NewKv(), kv2 = NewKv();
  ModelSession one = model_->NewSession(1), many = model_->NewSession(1);
  const auto a = Feed(one, *kv1, tokens, std::vector<size_t>(60, 1));
  const auto b = Feed(many, *kv2, tokens, {37, 1, 8, 14});
  ASSERT_EQ(a.size(), 60u * kVocab);
  EXPECT_TRUE(SameBits(a, b));
  EXPECT_EQ(one.position(), 60);
  EXPECT_EQ(many.position(), 60);
  for (int i = 0; i < model_->config().n_indexers(); ++i) {
    EXPECT_TRUE(SameBits(one.index_keys(i), many.index_keys(i)));
    EXPECT_EQ(one.index_keys(i).size(), 60u * model_->config().idx_dim);
  }
}

TEST_P(PresetTest, BatchInvariance) {
  const auto prompt = Tokens(45, 2);
  const std::vector<Token> next = {10, 200, 33};
  // Alone.
  auto kv_alone = NewKv();
  ModelSession alone = model_->NewSession(7);
  ASSERT_TRUE(model_->ImportPrefix(alone, prompt, *kv_alone).ok());
  StepInput in{&alone, next};
  StepOutput out_alone;
  ASSERT_TRUE(model_->Step(std::span<StepInput>(&in, 1), *kv_alone, std::span<StepOutput>(&out_alone, 1)).ok());
  // In a batch of 3 others with different histories and query counts, sharing one KvAccess.
  auto kv = NewKv();
  std::vector<ModelSession> sessions;
  sessions.push_back(model_->NewSession(100));
  sessions.push_back(model_->NewSession(7));
  sessions.push_back(model_->NewSession(101));
  sessions.push_back(model_->NewSession(102));
  ASSERT_TRUE(model_->ImportPrefix(sessions[0], Tokens(3, 9), *kv).ok());
  ASSERT_TRUE(model_->ImportPrefix(sessions[1], prompt, *kv).ok());
  ASSERT_TRUE(model_->ImportPrefix(sessions[2], Tokens(80, 10), *kv).ok());
  ASSERT_TRUE(model_->ImportPrefix(sessions[3], Tokens(17, 11), *kv).ok());
  const auto t0 = Tokens(5, 12), t2 = Tokens(1, 13), t3 = Tokens(2, 14);
  std::vector<StepInput> batch = {{&sessions[0], t0}, {&sessions[1], next}, {&sessions[2], t2}, {&sessions[3], t3}};
  std::vector<StepOutput> outs(4);
  ASSERT_TRUE(model_->Step(batch, *kv, outs).ok());
  EXPECT_TRUE(SameBits(out_alone.logits, outs[1].logits));
  EXPECT_EQ(outs[0].logits.size(), 5u * kVocab);
  EXPECT_EQ(outs[2].logits.size(), 1u * kVocab);
}

TEST_P(PresetTest, ImportPrefixEqualsPrefillStep) {
  const auto prompt = Tokens(30, 3);
  auto kv1 = NewKv(), kv2 = NewKv();
  ModelSession a = model_->NewSession(1), b = model_->NewSession(1);
  ASSERT_TRUE(model_->ImportPrefix(a, prompt, *kv1).ok());
  Feed(b, *kv2, prompt, {30});
  const std::vector<Token> next = {65};
  EXPECT_TRUE(SameBits(Feed(a, *kv1, next, {1}), Feed(b, *kv2, next, {1})));
  for (SourceId s = 0; s < static_cast<SourceId>(model_->config().n_sources()); ++s) {
    EXPECT_EQ(kv1->appended_rows(1, s), 31);
  }
}

TEST_P(PresetTest, SeedChangesLogits) {
  auto other = MakePreset(GetParam(), 2);
  auto kv1 = NewKv(), kv2 = NewKv();
  ModelSession a = model_->NewSession(1), b = other->NewSession(1);
  const auto t = Tokens(4, 4);
  std::vector<float> la, lb;
  {
    StepInput in{&a, t};
    StepOutput out;
    ASSERT_TRUE(model_->Step(std::span<StepInput>(&in, 1), *kv1, std::span<StepOutput>(&out, 1)).ok());
    la = out.logits;
  }
  {
    StepInput in{&b, t};
    StepOutput out;
    ASSERT_TRUE(other->Step(std::span<StepInput>(&in, 1), *kv2, std::span<StepOutput>(&out, 1)).ok());
    lb = out.logits;
  }
  EXPECT_FALSE(SameBits(la, lb));
  for (float v : la) ASSERT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetTest, ::testing::Values("dsv4flash-like", "glm5-like"));

TEST(TopologyTest, Dsv4ReuseLayersMakeNoFetch) {
  auto model = MakePreset("dsv4flash-like");
  const ModelConfig& c = model->config();
  auto inner = ResidentKvAccess::ForModel(c, kArena);
  CountingKvAccess kv(*inner);
  ModelSession s = model->NewSession(1);
  const auto t = Tokens(20, 5);
  ASSERT_TRUE(model->ImportPrefix(s, t, kv).ok());
  // Expected from the preset: one Fetch per write/reindex layer, in layer order, over its own source only.
  std::vector<std::vector<SourceId>> expected;
  int writes = 0;
  for (const LayerSpec& l : c.layers) {
    if (l.kind == LayerKind::kWrite || l.kind == LayerKind::kReindex) expected.push_back({l.source});
    if (l.kind == LayerKind::kWrite) writes++;
    ASSERT_NE(l.kind, LayerKind::kProducer);
  }
  ASSERT_LT(expected.size(), c.layers.size());  // the preset has Reuse layers
  EXPECT_EQ(kv.fetches, expected);
  // 20 queries, each with a selection entry and a local-window entry.
  for (size_t q : kv.fetch_queries) EXPECT_EQ(q, 20u * (c.local_window > 0 ? 2 : 1));
  EXPECT_EQ(kv.appends, 20 * writes);
  EXPECT_EQ(kv.protocol_errors, 0);
  EXPECT_TRUE(kv.outstanding.empty());
}

TEST(TopologyTest, Glm5FollowersFetchedInOneCall) {
  auto model = MakePreset("glm5-like");
  const ModelConfig& c = model->config();
  auto inner = ResidentKvAccess::ForModel(c, kArena);
  CountingKvAccess kv(*inner);
  ModelSession s = model->NewSession(1);
  ASSERT_TRUE(model->ImportPrefix(s, Tokens(40, 6), kv).ok());
  std::vector<std::vector<SourceId>> expected;
  for (const LayerSpec& l : c.layers) {
    if (l.kind == LayerKind::kProducer) expected.push_back({});
    ASSERT_TRUE(l.kind == LayerKind::kProducer || l.kind == LayerKind::kFollower);
    expected.back().push_back(l.source);
  }
  EXPECT_EQ(kv.fetches, expected);
  EXPECT_EQ(kv.appends, 40 * c.n_layers());  // every payload layer has its own bytes
  EXPECT_EQ(kv.protocol_errors, 0);
  EXPECT_TRUE(kv.outstanding.empty());
}

TEST(TopologyTest, FailedFetchBreaksSessionsAndReleasesReaders) {
  auto model = MakePreset("dsv4flash-like");
  auto inner = ResidentKvAccess::ForModel(model->config(), kArena);
  CountingKvAccess kv(*inner);
  kv.fail_fetch_number = 2;
  ModelSession s = model->NewSession(1);
  const auto t = Tokens(3, 1);
  EXPECT_EQ(model->ImportPrefix(s, t, kv).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(s.broken());
  EXPECT_EQ(s.position(), 0);
  EXPECT_TRUE(kv.outstanding.empty());  // the two successful Fetches before the failure got their ReadersDone
  EXPECT_EQ(kv.fetches.size(), 3u);
  EXPECT_EQ(kv.protocol_errors, 0);
  EXPECT_EQ(model->ImportPrefix(s, t, kv).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StepErrorsTest, RejectsBadInput) {
  auto model = MakePreset("glm5-like");
  auto other = MakePreset("glm5-like");
  auto kv = ResidentKvAccess::ForModel(model->config(), kArena);
  ModelSession s = model->NewSession(1);
  ModelSession foreign = other->NewSession(2);
  const std::vector<Token> ok = {1, 2}, bad = {1, 256}, none;
  std::vector<StepOutput> outs(2);
  auto step = [&](std::vector<StepInput> batch, size_t n_out) {
    return model->Step(batch, *kv, std::span<StepOutput>(outs).first(n_out)).code();
  };
  EXPECT_EQ(step({{&s, ok}}, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{nullptr, ok}}, 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{&foreign, ok}}, 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{&s, ok}, {&s, ok}}, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{&s, bad}}, 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step({{&s, none}}, 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.position(), 0);
  EXPECT_FALSE(s.broken());
  EXPECT_EQ(kv->appended_rows(1, 0), 0);
  EXPECT_EQ(step({{&s, ok}}, 1), absl::StatusCode::kOk);
  EXPECT_EQ(s.position(), 2);
}

TEST(ConfigTest, PresetsValidateAndRoundTrip) {
  for (const std::string& name : PresetNames()) {
    auto c = PresetConfig(name);
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->Validate().ok());
    auto back = ModelConfig::FromJson(c->ToJson());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ToJson(), c->ToJson());
    EXPECT_EQ(c->row_bytes(), 4u * (c->d_c + c->d_r));
  }
  EXPECT_EQ(PresetConfig("nope").status().code(), absl::StatusCode::kNotFound);
  auto c = *PresetConfig("dsv4flash-like");
  c.layers[0].kind = LayerKind::kReuse;  // reuse before any write
  EXPECT_FALSE(c.Validate().ok());
  c = *PresetConfig("glm5-like");
  c.layers[0].kind = LayerKind::kFollower;
  EXPECT_FALSE(c.Validate().ok());
  c = *PresetConfig("glm5-like");
  c.d_r = 7;
  EXPECT_FALSE(c.Validate().ok());
}

TEST(SamplingTest, ArgmaxTieRuleLowestId) {
  std::vector<float> l(256, 0.0f);
  l[17] = 3.0f;
  l[9] = 3.0f;
  l[200] = 2.0f;
  EXPECT_EQ(Argmax(l), 9);
  l[3] = NAN;
  EXPECT_EQ(Argmax(l), 9);
  EXPECT_EQ(Argmax(std::vector<float>(256, 1.0f)), 0);
}

TEST(SamplingTest, TopPAndSeededDraws) {
  std::vector<float> l(256, -1e9f);
  // Probabilities 0.5, 0.25, 0.125, 0.125 at ids 40, 7, 90, 91 (logs of them).
  l[40] = std::log(0.5f);
  l[7] = std::log(0.25f);
  l[90] = std::log(0.125f);
  l[91] = std::log(0.125f);
  auto p = SamplingDistribution(l, {1.0f, 0.7f});  // nucleus: 0.5 + 0.25 reaches 0.7 -> {40, 7}
  EXPECT_NEAR(p[40], 2.0 / 3.0, 1e-6);
  EXPECT_NEAR(p[7], 1.0 / 3.0, 1e-6);
  EXPECT_EQ(p[90], 0.0);
  auto p2 = SamplingDistribution(l, {1.0f, 0.8f});  // 0.75 < 0.8: the tie at 0.125 goes to the lower id 90
  EXPECT_GT(p2[90], 0.0);
  EXPECT_EQ(p2[91], 0.0);
  EXPECT_EQ(SamplingDistribution(l, {0.0f, 1.0f})[40], 1.0);
  std::mt19937_64 r1(5), r2(5);
  std::map<Token, int> counts;
  for (int i = 0; i < 3000; ++i) {
    const Token a = Sample(l, {1.0f, 0.7f}, r1);
    EXPECT_EQ(a, Sample(l, {1.0f, 0.7f}, r2));  // same seed, same draws
    counts[a]++;
  }
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[40] / 3000.0, 2.0 / 3.0, 0.05);
}

TEST(ResidentKvAccessTest, AppendFetchReleaseAndErrors) {
  ResidentKvAccess kv({8, 4}, /*arena_bytes=*/3 * 2 * 8, /*page_rows=*/2);  // 3 pages of 2 rows x 8 bytes
  auto row = [](uint8_t v, size_t n) { return std::vector<uint8_t>(n, v); };
  ASSERT_TRUE(kv.Append(1, 0, 0, row(10, 8)).ok());
  ASSERT_TRUE(kv.Append(1, 0, 1, row(11, 8)).ok());
  ASSERT_TRUE(kv.Append(1, 1, 0, row(20, 4)).ok());
  EXPECT_EQ(kv.Append(1, 0, 3, row(0, 8)).code(), absl::StatusCode::kInvalidArgument);  // gap
  EXPECT_EQ(kv.Append(1, 1, 1, row(0, 8)).code(), absl::StatusCode::kInvalidArgument);  // wrong size
  EXPECT_EQ(kv.Append(1, 5, 0, row(0, 8)).code(), absl::StatusCode::kInvalidArgument);  // unknown source
  ASSERT_TRUE(kv.Append(2, 0, 0, row(30, 8)).ok());
  EXPECT_EQ(kv.free_pages(), 0u);
  EXPECT_EQ(kv.Append(1, 0, 2, row(12, 8)).code(), absl::StatusCode::kResourceExhausted);

  const std::vector<Position> sel = {1, -1, 0};
  std::vector<const uint8_t*> out(3, reinterpret_cast<const uint8_t*>(1));
  KvQuery q{1, sel, out};
  const SourceId s0[] = {0};
  ASSERT_TRUE(kv.Fetch(s0, std::span<KvQuery>(&q, 1)).ok());
  EXPECT_EQ(out[0][0], 11);
  EXPECT_EQ(out[1], nullptr);
  EXPECT_EQ(out[2][7], 10);
  const SourceId both[] = {0, 1};
  EXPECT_EQ(kv.Fetch(both, std::span<KvQuery>(&q, 1)).code(), absl::StatusCode::kInvalidArgument);  // rows_out size
  const std::vector<Position> sel0 = {0};
  std::vector<const uint8_t*> out2(2);
  KvQuery q2{1, sel0, out2};
  ASSERT_TRUE(kv.Fetch(both, std::span<KvQuery>(&q2, 1)).ok());
  EXPECT_EQ(out2[0][0], 10);
  EXPECT_EQ(out2[1][3], 20);
  const std::vector<Position> sel1 = {1};
  KvQuery q3{1, sel1, out2};
  EXPECT_EQ(kv.Fetch(both, std::span<KvQuery>(&q3, 1)).code(), absl::StatusCode::kInvalidArgument);  // src 1 has 1 row
  kv.Release(1);
  EXPECT_EQ(kv.free_pages(), 2u);
  EXPECT_EQ(kv.appended_rows(1, 0), 0);
  EXPECT_EQ(kv.appended_rows(2, 0), 1);
}

}  // namespace
}  // namespace dhs::model
