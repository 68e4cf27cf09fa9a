// The model's forward step: batch invariance, multi-token == token-by-token, topology call pattern (Reuse makes no
// Fetch, followers fetched in one call), ImportPrefix, input errors, sampling, ResidentKvAccess (brief §5, §11).
#include <algorithm>
#include <cmath>
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

// One request of a batch-invariance check: its history (imported) and the tokens of two later steps.
struct InvarianceRequest {
  RequestId id;
  std::vector<Token> history, step1, step2;
};

// Every request stepped alone (own KvAccess) vs all of them in one batch sharing a KvAccess (then a second batched
// step of a different composition: every other request, in reverse order), vs the first batch in reverse order:
// logits and index keys must be bit-identical (brief §7, §11: a request's numbers never depend on its batch).
void ExpectBatchInvariance(const Model& model, const std::vector<InvarianceRequest>& reqs) {
  const size_t n = reqs.size();
  auto new_kv = [&] { return ResidentKvAccess::ForModel(model.config(), kArena, 16); };
  auto step_one = [&](ModelSession& s, KvAccess& kv, const std::vector<Token>& t) {
    StepInput in{&s, t};
    StepOutput out;
    EXPECT_TRUE(model.Step(std::span<StepInput>(&in, 1), kv, std::span<StepOutput>(&out, 1)).ok());
    return out.logits;
  };
  // Alone.
  std::vector<std::vector<float>> alone1(n), alone2(n);
  std::vector<std::vector<std::vector<float>>> alone_keys(n);
  for (size_t i = 0; i < n; ++i) {
    auto kv = new_kv();
    ModelSession s = model.NewSession(reqs[i].id);
    ASSERT_TRUE(model.ImportPrefix(s, reqs[i].history, *kv).ok());
    alone1[i] = step_one(s, *kv, reqs[i].step1);
    alone2[i] = step_one(s, *kv, reqs[i].step2);
    for (int x = 0; x < model.config().n_indexers(); ++x) {
      alone_keys[i].emplace_back(s.index_keys(x).begin(), s.index_keys(x).end());
    }
  }
  for (bool reverse : {false, true}) {
    auto kv = new_kv();
    std::vector<ModelSession> sessions;
    for (size_t i = 0; i < n; ++i) {
      sessions.push_back(model.NewSession(reqs[i].id));
      ASSERT_TRUE(model.ImportPrefix(sessions.back(), reqs[i].history, *kv).ok());
    }
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = reverse ? n - 1 - i : i;
    std::vector<StepInput> batch;
    for (size_t i : order) batch.push_back({&sessions[i], reqs[i].step1});
    std::vector<StepOutput> outs(n);
    ASSERT_TRUE(model.Step(batch, *kv, outs).ok());
    for (size_t b = 0; b < n; ++b) {
      const size_t i = order[b];
      ASSERT_EQ(outs[b].logits.size(), reqs[i].step1.size() * kVocab);
      EXPECT_TRUE(SameBits(alone1[i], outs[b].logits)) << "request " << reqs[i].id << " reverse " << reverse;
    }
    if (reverse) continue;
    // Second step: every other request, in reverse order; the rest then step alone in the same KvAccess.
    std::vector<StepInput> batch2;
    for (size_t i = n; i-- > 0;) {
      if (i % 2 == 0) batch2.push_back({&sessions[i], reqs[i].step2});
    }
    std::vector<StepOutput> outs2(batch2.size());
    ASSERT_TRUE(model.Step(batch2, *kv, outs2).ok());
    for (size_t b = 0; b < batch2.size(); ++b) {
      const size_t i = static_cast<size_t>(batch2[b].session - sessions.data());
      EXPECT_TRUE(SameBits(alone2[i], outs2[b].logits)) << "request " << reqs[i].id << " second step";
    }
    for (size_t i = 1; i < n; i += 2) {
      EXPECT_TRUE(SameBits(alone2[i], step_one(sessions[i], *kv, reqs[i].step2))) << "request " << reqs[i].id;
    }
    for (size_t i = 0; i < n; ++i) {
      for (int x = 0; x < model.config().n_indexers(); ++x) {
        EXPECT_TRUE(SameBits(alone_keys[i][x], sessions[i].index_keys(x))) << "request " << reqs[i].id;
      }
    }
  }
}

TEST_P(PresetTest, BatchInvariance) {
  // Histories below, at and above k, with 1..5 tokens per step (prefill-like and decode-like queries mixed).
  ExpectBatchInvariance(*model_, {{100, Tokens(3, 9), Tokens(5, 12), Tokens(1, 20)},
                                  {7, Tokens(45, 2), {10, 200, 33}, Tokens(2, 21)},
                                  {101, Tokens(80, 10), Tokens(1, 13), Tokens(4, 22)},
                                  {102, Tokens(17, 11), Tokens(2, 14), Tokens(1, 23)},
                                  {103, Tokens(16, 15), Tokens(1, 16), Tokens(1, 24)}});
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

// Captures the rows one request appends, per source, in arrival order.
class RowRecorder : public KvAccess {
 public:
  RowRecorder(KvAccess& inner, int sources) : inner_(inner), rows(sources) {}
  absl::Status Append(RequestId r, SourceId s, Position p, std::span<const uint8_t> row) override {
    rows[s].insert(rows[s].end(), row.begin(), row.end());
    return inner_.Append(r, s, p, row);
  }
  absl::Status Fetch(std::span<const SourceId> s, std::span<KvQuery> b) override { return inner_.Fetch(s, b); }
  void ReadersDone(std::span<const SourceId> s) override { inner_.ReadersDone(s); }
  void Release(RequestId r) override { inner_.Release(r); }
  KvAccess& inner_;
  std::vector<std::vector<uint8_t>> rows;
};

TEST_P(PresetTest, ImportRowsEqualsComputingThem) {
  // Session a computes 24 tokens after an 8-token history; the rows and keys of those 24 positions are imported into
  // session b (with the same 8-token history) and both then decode the same tokens: identical logits and keys.
  const ModelConfig& c = model_->config();
  const auto history = Tokens(8, 5), block = Tokens(24, 6);
  auto kv1 = NewKv(), kv2 = NewKv();
  ModelSession a = model_->NewSession(1), b = model_->NewSession(1);
  ASSERT_TRUE(model_->ImportPrefix(a, history, *kv1).ok());
  ASSERT_TRUE(model_->ImportPrefix(b, history, *kv2).ok());
  RowRecorder rec(*kv1, c.n_sources());
  ASSERT_TRUE(model_->ImportPrefix(a, block, rec).ok());
  std::vector<std::vector<float>> keys;
  for (int i = 0; i < c.n_indexers(); ++i) {
    auto all = a.index_keys(i);
    keys.emplace_back(all.begin() + 8 * c.idx_dim, all.end());
  }
  ASSERT_TRUE(model_->ImportRows(b, 24, rec.rows, keys, *kv2).ok());
  EXPECT_EQ(b.position(), 32);
  for (int i = 0; i < c.n_indexers(); ++i) {
    EXPECT_TRUE(std::equal(a.index_keys(i).begin(), a.index_keys(i).end(), b.index_keys(i).begin(),
                           b.index_keys(i).end()));
  }
  for (SourceId s = 0; s < static_cast<SourceId>(c.n_sources()); ++s) EXPECT_EQ(kv2->appended_rows(1, s), 32);
  const auto next = Tokens(5, 7);
  EXPECT_TRUE(SameBits(Feed(a, *kv1, next, {5}), Feed(b, *kv2, next, {5})));

  // Bad input: nothing is appended and the session stays usable.
  ModelSession d = model_->NewSession(2);
  EXPECT_EQ(model_->ImportRows(d, 0, rec.rows, keys, *kv2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->ImportRows(d, 23, rec.rows, keys, *kv2).code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::vector<uint8_t>> short_rows(rec.rows.begin(), rec.rows.end() - 1);
  EXPECT_EQ(model_->ImportRows(d, 24, short_rows, keys, *kv2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.position(), 0);
  for (SourceId s = 0; s < static_cast<SourceId>(c.n_sources()); ++s) EXPECT_EQ(kv2->appended_rows(2, s), 0);
  EXPECT_FALSE(d.broken());
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

// The final hidden state (StepInput::want_hidden): absent unless asked; asking leaves the logits bit-identical; the
// same bits whether the request is fed token by token alone or in chunks inside a mixed batch (batch invariance);
// and it is the vector lm_head reads: each logit equals lm_head[v] · hidden computed here in double from the
// weights file (independent of the model's kernels; tolerance 1e-4 relative to the row's magnitude).
TEST_P(PresetTest, FinalHiddenStateIsOptInBatchInvariantAndFeedsLmHead) {
  const ModelConfig& c = model_->config();
  const size_t D = static_cast<size_t>(c.d_model);
  const auto tokens = Tokens(40, 5), other = Tokens(40, 6);
  // Alone, token by token, asking for the hidden state; and alone without asking (logits only).
  auto kv1 = NewKv(), kv2 = NewKv();
  ModelSession one = model_->NewSession(1), plain = model_->NewSession(1);
  std::vector<float> hidden_alone, logits_alone, logits_plain;
  for (size_t i = 0; i < tokens.size(); ++i) {
    StepInput in{&one, std::span<const Token>(tokens).subspan(i, 1), true};
    StepInput in_plain{&plain, std::span<const Token>(tokens).subspan(i, 1)};
    StepOutput out, out_plain;
    ASSERT_TRUE(model_->Step(std::span<StepInput>(&in, 1), *kv1, std::span<StepOutput>(&out, 1)).ok());
    ASSERT_TRUE(model_->Step(std::span<StepInput>(&in_plain, 1), *kv2, std::span<StepOutput>(&out_plain, 1)).ok());
    ASSERT_EQ(out.hidden.size(), D);
    EXPECT_TRUE(out_plain.hidden.empty());
    hidden_alone.insert(hidden_alone.end(), out.hidden.begin(), out.hidden.end());
    logits_alone.insert(logits_alone.end(), out.logits.begin(), out.logits.end());
    logits_plain.insert(logits_plain.end(), out_plain.logits.begin(), out_plain.logits.end());
  }
  EXPECT_TRUE(SameBits(logits_alone, logits_plain));
  // In chunks of 25 and 15, batched with another request that does not ask.
  auto kv3 = NewKv();
  ModelSession mixed = model_->NewSession(1), neighbour = model_->NewSession(2);
  std::vector<float> hidden_batched;
  for (auto [at, len] : {std::pair<size_t, size_t>{0, 25}, {25, 15}}) {
    StepInput batch[2] = {{&neighbour, std::span<const Token>(other).subspan(at, len)},
                          {&mixed, std::span<const Token>(tokens).subspan(at, len), true}};
    StepOutput outs[2];
    ASSERT_TRUE(model_->Step(batch, *kv3, outs).ok());
    EXPECT_TRUE(outs[0].hidden.empty());
    ASSERT_EQ(outs[1].hidden.size(), len * D);
    hidden_batched.insert(hidden_batched.end(), outs[1].hidden.begin(), outs[1].hidden.end());
  }
  EXPECT_TRUE(SameBits(hidden_alone, hidden_batched));
  // logits = lm_head · hidden, recomputed in double from the tensors.
  auto writer = GenerateWeights(c, 1);
  ASSERT_TRUE(writer.ok());
  auto file = SafetensorsFile::Parse(writer->Serialize());
  ASSERT_TRUE(file.ok());
  auto lm_head = file->ReadF32("lm_head", std::vector<int64_t>{kVocab, c.d_model});
  ASSERT_TRUE(lm_head.ok());
  for (size_t t = 0; t < tokens.size(); ++t) {
    double scale = 0.0;
    for (int v = 0; v < kVocab; ++v) scale = std::max(scale, std::abs(double{logits_alone[t * kVocab + v]}));
    for (int v = 0; v < kVocab; ++v) {
      double dot = 0.0;
      for (size_t d = 0; d < D; ++d) dot += double{(*lm_head)[v * D + d]} * hidden_alone[t * D + d];
      ASSERT_NEAR(logits_alone[t * kVocab + v], dot, 1e-4 * (1.0 + scale)) << "position " << t << " token " << v;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetTest, ::testing::Values("dsv4flash-like", "glm5-like"));

// bench-wide (d_model 1024, d_ff 1536: MatMul with one-to-four-row weight blocks and query tiles of 64): the same
// exactness properties, on shorter histories (each token costs ~29 M multiply-adds). One model for both tests.
const Model& BenchWideModel() {
  static const Model* model = MakePreset("bench-wide").release();
  return *model;
}

TEST(BenchWideTest, BatchInvariance) {
  ExpectBatchInvariance(BenchWideModel(), {{1, Tokens(20, 30), Tokens(1, 31), Tokens(1, 32)},
                                           {2, Tokens(5, 33), Tokens(3, 34), Tokens(1, 35)},
                                           {3, Tokens(26, 36), Tokens(1, 37), Tokens(2, 38)}});
}

TEST(BenchWideTest, MultiTokenStepEqualsTokenByToken) {
  const Model& model = BenchWideModel();
  const auto tokens = Tokens(24, 40);
  auto kv1 = ResidentKvAccess::ForModel(model.config(), kArena, 16);
  auto kv2 = ResidentKvAccess::ForModel(model.config(), kArena, 16);
  ModelSession one = model.NewSession(1), many = model.NewSession(1);
  std::vector<float> a, b;
  for (size_t at = 0, i = 0; at < tokens.size(); ++i) {
    const size_t c = std::min<size_t>(tokens.size() - at, i % 2 == 0 ? 13 : 1);
    StepInput in{&many, std::span<const Token>(tokens).subspan(at, c)};
    StepOutput out;
    ASSERT_TRUE(model.Step(std::span<StepInput>(&in, 1), *kv2, std::span<StepOutput>(&out, 1)).ok());
    b.insert(b.end(), out.logits.begin(), out.logits.end());
    at += c;
  }
  for (size_t at = 0; at < tokens.size(); ++at) {
    StepInput in{&one, std::span<const Token>(tokens).subspan(at, 1)};
    StepOutput out;
    ASSERT_TRUE(model.Step(std::span<StepInput>(&in, 1), *kv1, std::span<StepOutput>(&out, 1)).ok());
    a.insert(a.end(), out.logits.begin(), out.logits.end());
  }
  ASSERT_EQ(a.size(), tokens.size() * kVocab);
  EXPECT_TRUE(SameBits(a, b));
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
}

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
  const auto names = PresetNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "bench-wide"), names.end());
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

size_t WeightBytes(const ModelConfig& c) {
  size_t bytes = 0;
  for (const TensorSpec& t : ModelTensorSpecs(c)) {
    size_t n = sizeof(float);
    for (int64_t d : t.shape) n *= static_cast<size_t>(d);
    bytes += n;
  }
  return bytes;
}

TEST(ConfigTest, BenchWideIsDsv4FlashLikeWidened) {
  const ModelConfig wide = *PresetConfig("bench-wide"), base = *PresetConfig("dsv4flash-like");
  EXPECT_EQ(wide.preset, "bench-wide");
  EXPECT_EQ(wide.d_model, 1024);
  EXPECT_EQ(wide.d_ff, 1536);
  // Everything that shapes memd / worker geometry and the call pattern is dsv4flash-like's.
  EXPECT_EQ(wide.n_heads, base.n_heads);
  EXPECT_EQ(wide.d_c, base.d_c);
  EXPECT_EQ(wide.d_r, base.d_r);
  EXPECT_EQ(wide.row_bytes(), base.row_bytes());
  EXPECT_EQ(wide.idx_heads, base.idx_heads);
  EXPECT_EQ(wide.idx_dim, base.idx_dim);
  EXPECT_EQ(wide.top_k, base.top_k);
  EXPECT_EQ(wide.local_window, base.local_window);
  ASSERT_EQ(wide.n_layers(), base.n_layers());
  for (int l = 0; l < wide.n_layers(); ++l) {
    EXPECT_EQ(wide.layers[l].kind, base.layers[l].kind);
    EXPECT_EQ(wide.layers[l].source, base.layers[l].source);
  }
  // Weight bytes, by hand (floats): embeddings + lm_head 2*256*1024 = 524288, final_norm 1024; per layer (x8)
  // attn_norm 1024 + w_qc 128*1024 + w_qr 16*1024 + w_o 1024*128 + mlp_norm 1024 + w_up/w_down 2*1536*1024 = 3426304;
  // write layers (x3) kv_norm 1024 + w_dkv 64*1024 + w_kr 8*1024 = 74752; indexer layers (x5) idx_wq 64*1024 +
  // idx_ww 2*1024 + idx_wk 32*1024 = 100352. Total 28661760 floats: above a 32 MiB L3 several times over.
  EXPECT_EQ(WeightBytes(wide), 4u * 28661760u);
  // dsv4flash-like: 16384*2 + 64 + 8*(64 + 8192 + 1024 + 8192 + 64 + 2*8192) + 3*(64 + 4096 + 512) +
  // 5*(4096 + 128 + 2048) = 349568 floats: cache resident.
  EXPECT_EQ(WeightBytes(base), 4u * 349568u);
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
