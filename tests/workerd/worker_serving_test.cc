// tests/workerd/worker_serving_test.cc: submit validation (clear errors, the worker keeps serving), the prepared-prefix
// generator and logits digest, a failed copy that ends only its own request, admission refusal, memd orders crossing
// in flight copies (a scripted memd and held copies force the interleaving), and the client wire (ServingFrontend over
// ipc:// with a DealerClient) in one process.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <thread>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/workerd/kv_test_util.h"
#include "tests/workerd/recording_transport.h"
#include "tests/workerd/worker_test_util.h"
#include "workerd/device/cpu_device.h"
#include "workerd/kv/layout.h"

namespace dhs::test {
namespace {

wire::SubmitRequestT Submit(RequestId id, std::vector<uint8_t> prompt, uint32_t max_new) {
  wire::SubmitRequestT s;
  s.request = id;
  s.prompt = std::move(prompt);
  s.max_new_tokens = max_new;
  return s;
}

// A worker on a CpuDevice with a quiet fake memd.
struct Fixture {
  explicit Fixture(WorkerMode mode, const std::string& preset = "dsv4flash-like", GpuId gpu = 0)
      : model(MakePresetModel(preset)) {
    config.mode = mode;
    config.gpu = gpu;
    config.page_rows = 16;
    config.tail_rows = 32;
    config.slots = 4;
    config.max_context_tokens = 200;
    auto g = ComputeGeometry(model->config(), config);
    EXPECT_TRUE(g.ok()) << g.status();
    config.hbm_budget_bytes = 64 * g->page_bytes;
    memd = std::make_unique<FakeMemd>(64, g->host_page_bytes, config.page_rows, 256, 1, false, config.slots);
    auto w = Worker::Create(model.get(), &device, config, memd.get(), &sink);
    EXPECT_TRUE(w.ok()) << w.status();
    worker = std::move(*w);
  }
  void RunUntilFinished(size_t n) {
    for (int it = 0; it < 5000 && sink.finished.size() < n; ++it) {
      memd->Pump(*worker);
      ASSERT_TRUE(worker->Iterate().ok());
    }
    ASSERT_EQ(sink.finished.size(), n);
  }
  std::vector<model::Token> Input(const std::vector<uint8_t>& p) { return {p.begin(), p.end()}; }

  std::unique_ptr<model::Model> model;
  WorkerConfig config;
  CpuDevice device;
  std::unique_ptr<FakeMemd> memd;
  RecordingSink sink;
  std::unique_ptr<Worker> worker;
};

void ExpectInvalid(Worker& w, const wire::SubmitRequestT& s, const std::string& needle) {
  absl::Status st = w.Submit(s, ClientRef{"c", 1});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find(needle), std::string::npos) << st.message() << " lacks '" << needle << "'";
}

TEST(WorkerSubmit, BadSubmissionsGetClearErrorsAndTheWorkerKeepsServing) {
  Fixture f(WorkerMode::kHisparse);
  ExpectInvalid(*f.worker, Submit(1, {}, 4), "empty prompt");
  ExpectInvalid(*f.worker, Submit(2, Prompt(150, 1), 51), "too many tokens");
  ExpectInvalid(*f.worker, Submit(3, Prompt(10, 1), 0), "max_new_tokens");
  wire::SubmitRequestT prefix0 = Submit(4, {}, 4);
  prefix0.hash_ids = {5};
  prefix0.input_tokens = 0;
  ExpectInvalid(*f.worker, prefix0, "unknown prefix reference");
  wire::SubmitRequestT prefix_count = Submit(5, {}, 4);
  prefix_count.hash_ids = {5, 6};
  prefix_count.input_tokens = 100;  // one 512-token block, two ids
  ExpectInvalid(*f.worker, prefix_count, "unknown prefix reference");
  wire::SubmitRequestT block0 = Submit(5, {}, 4);
  block0.hash_ids = {5};
  block0.input_tokens = 100;
  block0.prefix_block_tokens = 0;
  ExpectInvalid(*f.worker, block0, "prefix_block_tokens 0");
  wire::SubmitRequestT suffix = Submit(5, Prompt(3, 1), 4);
  suffix.hash_ids = {5};
  suffix.input_tokens = 40;
  suffix.prefix_block_tokens = 32;  // 32 prefix tokens + 8 prompt tokens would make 40; 3 given
  ExpectInvalid(*f.worker, suffix, "needs 8 prompt tokens");
  wire::SubmitRequestT tenant = Submit(5, Prompt(10, 1), 4);
  tenant.tenant = std::string(kMaxTenantBytes + 1, 't');  // issue 24: an opaque salt, bounded
  ExpectInvalid(*f.worker, tenant, "tenant of 257 bytes");
  for (float t : {-0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    wire::SubmitRequestT s = Submit(6, Prompt(10, 1), 4);
    s.temperature = t;
    ExpectInvalid(*f.worker, s, "bad sampling");
  }
  for (float p : {0.0f, 1.5f, std::numeric_limits<float>::quiet_NaN()}) {
    wire::SubmitRequestT s = Submit(7, Prompt(10, 1), 4);
    s.temperature = 1;
    s.top_p = p;
    ExpectInvalid(*f.worker, s, "bad sampling");
  }
  EXPECT_TRUE(f.sink.accepted.empty());  // nothing was accepted
  // The worker still serves a good request, exactly.
  ASSERT_TRUE(f.worker->Submit(Submit(8, Prompt(20, 8), 6), ClientRef{"c", 8}).ok());
  EXPECT_EQ(f.worker->Submit(Submit(8, Prompt(20, 8), 6), ClientRef{"c", 9}).code(), absl::StatusCode::kAlreadyExists);
  f.RunUntilFinished(1);
  const Generated want = Oracle(*f.model, f.Input(Prompt(20, 8)), 6);
  EXPECT_EQ(f.sink.out[8].tokens, want.tokens);
  EXPECT_EQ(f.sink.out[8].digests, want.digests);
  EXPECT_TRUE(f.sink.errors.empty());
  EXPECT_EQ(f.memd->completes, 1);
}

// Committed tokens (issue 11, resume): every token is in memd's record (the fake memd keeps TokensCommitted as memd
// does: in order, no gap, no repeat) before its TokenChunk reaches the client, with one TokensCommitted per step
// that produced tokens (not one per token); sampled requests draw token t at (seed, client id, t), as the oracle.
TEST(WorkerCommit, EveryTokenIsCommittedToMemdBeforeItIsStreamedWithOneMessagePerStep) {
  Fixture f(WorkerMode::kAdaptive);
  std::map<RequestId, size_t> streamed;
  size_t checked = 0;
  f.sink.on_chunk = [&](const wire::TokenChunkT& c) {
    const std::vector<uint8_t>& have = f.memd->committed[c.request];  // node id == client id (GPU 0, epoch 1)
    for (uint8_t t : c.tokens) {
      const size_t i = streamed[c.request]++;
      ASSERT_LT(i, have.size()) << "request " << c.request << ": token " << i << " streamed before it was committed";
      EXPECT_EQ(have[i], t);
      ++checked;
    }
  };
  for (RequestId id : {1, 2, 3}) {
    wire::SubmitRequestT s = Submit(id, Prompt(10 + 7 * id, static_cast<uint32_t>(id)), 5 + static_cast<uint32_t>(id));
    s.temperature = id == 2 ? 0.0f : 0.9f;
    s.seed = 40 + id;
    ASSERT_TRUE(f.worker->Submit(s, ClientRef{"c", id}).ok());
  }
  int steps_with_tokens = 0;
  for (int it = 0; it < 5000 && f.sink.finished.size() < 3; ++it) {
    f.memd->Pump(*f.worker);
    const size_t before = checked;
    ASSERT_TRUE(f.worker->Iterate().ok());
    steps_with_tokens += checked > before;
  }
  ASSERT_EQ(f.sink.finished.size(), 3u);
  EXPECT_EQ(checked, 6u + 7u + 8u);
  EXPECT_EQ(f.memd->commit_messages, steps_with_tokens);
  EXPECT_LT(f.memd->commit_messages, static_cast<int>(checked));  // batched: the three requests share steps
  for (RequestId id : {1, 2, 3}) {
    const Generated want = Oracle(*f.model, f.Input(Prompt(10 + 7 * id, static_cast<uint32_t>(id))),
                                  5 + static_cast<uint32_t>(id), id == 2 ? 0.0f : 0.9f, 1.0f, 40 + id, id);
    EXPECT_EQ(f.sink.out[id].tokens, want.tokens) << "request " << id;
    EXPECT_EQ(f.sink.out[id].digests, want.digests) << "request " << id;
    EXPECT_EQ(std::vector<int>(f.memd->committed[id].begin(), f.memd->committed[id].end()), want.tokens);
  }
}

// memd refuses the tokens of one request (issue 25's TokenLedger, shared with libdhs): the message it is in is refused
// whole (the entries before it applied), then each request of it goes alone until answered alone. The refused
// request's record stops where memd acknowledged it, every other record still gets every token (with the old
// optimistic count, the later entries of the refused message were never resent: their records kept a gap), and every
// client still gets every token, equal to the oracle.
TEST(WorkerCommit, TokensMemdRefusesForOneRequestStopOnlyItsRecord) {
  Fixture f(WorkerMode::kAdaptive);
  for (RequestId id : {1, 2, 3}) {
    ASSERT_TRUE(f.worker->Submit(Submit(id, Prompt(12 + 5 * id, static_cast<uint32_t>(id)), 8), ClientRef{"c", id}).ok());
  }
  size_t refused_at = 0;
  for (int it = 0; it < 5000 && f.sink.finished.size() < 3; ++it) {
    if (refused_at == 0 && f.memd->committed[2].size() >= 2) {  // from now on memd refuses request 2's tokens
      refused_at = f.memd->committed[2].size();
      f.memd->refuse_tokens_of.insert(2);
    }
    f.memd->Pump(*f.worker);
    ASSERT_TRUE(f.worker->Iterate().ok());
  }
  ASSERT_EQ(f.sink.finished.size(), 3u);
  ASSERT_GE(refused_at, 2u);
  EXPECT_GE(f.memd->commits_refused, 2) << "a message of several entries, then request 2 alone";
  EXPECT_EQ(f.worker->stats().records_refused, 1u);
  EXPECT_EQ(f.worker->StatsReply().token_records_refused, 1u);  // exported (dhs_worker_token_records_refused_total)
  for (RequestId id : {1, 2, 3}) {
    const Generated want = Oracle(*f.model, f.Input(Prompt(12 + 5 * id, static_cast<uint32_t>(id))), 8);
    EXPECT_EQ(f.sink.out[id].tokens, want.tokens) << "request " << id << ": the client's stream";
    const std::vector<int> record(f.memd->committed[id].begin(), f.memd->committed[id].end());
    if (id == 2) {
      EXPECT_EQ(record, std::vector<int>(want.tokens.begin(), want.tokens.begin() + refused_at));
    } else {
      EXPECT_EQ(record, want.tokens) << "request " << id << "'s record";
    }
  }
}

// Request ids are the client's (issue 12): memd sees node request ids (gpu << 48) | n, unique among the worker's
// requests in flight and never a reserved value (0, 2^64-1), so clients of different workers never collide; the client
// sees its own id in SubmitAccepted and TokenChunk. Two clients may use the same id at once; one client may not (it is
// ALREADY_EXISTS while in flight) but may reuse an id once its request finished.
TEST(WorkerSubmit, ClientIdsMapToNodeIdsThatNeverCollideOrUseReservedValues) {
  Fixture f(WorkerMode::kAdaptive, "dsv4flash-like", /*gpu=*/1);
  constexpr RequestId kMax = ~RequestId{0};
  constexpr RequestId kGpu1 = RequestId{1} << 48;
  ASSERT_TRUE(f.worker->Submit(Submit(kMax, Prompt(20, 1), 3), ClientRef{"a", 1}).ok());
  ASSERT_TRUE(f.worker->Submit(Submit(5, Prompt(20, 2), 3), ClientRef{"a", 2}).ok());
  ASSERT_TRUE(f.worker->Submit(Submit(5, Prompt(20, 3), 3), ClientRef{"b", 1}).ok());  // another client, same id
  ASSERT_TRUE(f.worker->Submit(Submit(0, Prompt(20, 4), 3), ClientRef{"b", 2}).ok());
  EXPECT_EQ(f.worker->Submit(Submit(5, Prompt(20, 2), 3), ClientRef{"a", 3}).code(), absl::StatusCode::kAlreadyExists);
  // The client's id when it fits and is free (5 -> gpu | 5), else the per-worker counter (from 1, skipping ids taken).
  EXPECT_EQ(f.memd->admitted_ids, (std::vector<RequestId>{kGpu1 | 1, kGpu1 | 5, kGpu1 | 2, kGpu1 | 3}));
  EXPECT_EQ(f.sink.accepted, (std::vector<RequestId>{kMax, 5, 5, 0}));
  for (int it = 0; it < 5000 && f.memd->completes < 4; ++it) {
    f.memd->Pump(*f.worker);
    ASSERT_TRUE(f.worker->Iterate().ok());
  }
  EXPECT_EQ(f.memd->completes, 4);
  EXPECT_TRUE(f.sink.errors.empty());
  size_t finished = 0;
  for (const wire::TokenChunkT& c : f.sink.chunks) {
    EXPECT_TRUE(c.request == kMax || c.request == 5 || c.request == 0) << c.request;  // the clients' ids
    finished += c.finished;
  }
  EXPECT_EQ(finished, 4u);
  EXPECT_EQ(f.sink.out[kMax].tokens, Oracle(*f.model, f.Input(Prompt(20, 1)), 3).tokens);
  // A finished id is free again, for its client and the node.
  ASSERT_TRUE(f.worker->Submit(Submit(5, Prompt(20, 2), 3), ClientRef{"a", 4}).ok());
  EXPECT_EQ(f.memd->admitted_ids.back(), kGpu1 | 5);
}

// Node ids carry the epoch (issue 11): a restarted worker (epoch 3 here) never reuses the id of a request memd still
// holds from an earlier epoch of its GPU: client id 5 on GPU 1 is (1 << 48) | (2 << 24) | 5, the counter's ids too.
TEST(WorkerSubmit, NodeIdsOfALaterEpochDifferFromTheFirstEpochs) {
  Fixture f(WorkerMode::kAdaptive, "dsv4flash-like", /*gpu=*/1);
  f.worker->book().set_epoch(3);
  constexpr RequestId kEpoch3 = (RequestId{1} << 48) | (RequestId{2} << 24);
  ASSERT_TRUE(f.worker->Submit(Submit(5, Prompt(20, 1), 3), ClientRef{"a", 1}).ok());
  ASSERT_TRUE(f.worker->Submit(Submit(RequestId{1} << 24, Prompt(20, 2), 3), ClientRef{"a", 2}).ok());  // out of n's range
  EXPECT_EQ(f.memd->admitted_ids, (std::vector<RequestId>{kEpoch3 | 5, kEpoch3 | 1}));
}

// A GPU beyond the 16 bits of a node request id is refused at the start (before any Hello).
TEST(WorkerGeometry, GpuBeyondTheNodeIdRangeIsRefused) {
  auto model = MakePresetModel("dsv4flash-like");
  WorkerConfig config;
  config.page_rows = 16;
  config.tail_rows = 32;
  config.gpu = kMaxGpus;
  auto g = ComputeGeometry(model->config(), config);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  EXPECT_NE(std::string(g.status().message()).find("GPU 65536 out of range"), std::string::npos) << g.status();
}

TEST(WorkerSubmit, PreparedPrefixIsDeterministicAndSharedBlocksAreEqual) {
  // splitmix64 computed here from its published constants, not through the code under test.
  auto splitmix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  auto block_token = [&](uint64_t id, uint64_t j) { return static_cast<model::Token>(splitmix(splitmix(id) + j) >> 56); };
  wire::SubmitRequestT a, b;
  a.hash_ids = {11, 12};
  a.input_tokens = 600;
  a.max_new_tokens = 1;
  b.hash_ids = {11, 13};
  b.input_tokens = 700;
  b.max_new_tokens = 1;
  ASSERT_TRUE(ValidateSubmit(a, 4096).ok());
  ASSERT_TRUE(ValidateSubmit(b, 4096).ok());
  const auto ta = SubmitInputTokens(a), tb = SubmitInputTokens(b);
  ASSERT_EQ(ta.size(), 600u);
  ASSERT_EQ(tb.size(), 700u);
  EXPECT_EQ(SubmitPrefixTokens(a), 600u);
  for (uint32_t j = 0; j < 512; ++j) ASSERT_EQ(ta[j], tb[j]);  // equal first id -> equal first block
  EXPECT_NE(std::vector<model::Token>(ta.begin() + 512, ta.end()),
            std::vector<model::Token>(tb.begin() + 512, tb.begin() + 600));
  EXPECT_EQ(ta[3], block_token(11, 3));
  EXPECT_EQ(ta[515], block_token(12, 3));

  // A length-scaled trace: 2 blocks of 51 tokens cover 102 of 110 input tokens; the last 8 come as prompt bytes.
  wire::SubmitRequestT c;
  c.hash_ids = {11, 12};
  c.input_tokens = 110;
  c.prefix_block_tokens = 51;
  c.prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  c.max_new_tokens = 1;
  ASSERT_TRUE(ValidateSubmit(c, 4096).ok());
  const auto tc = SubmitInputTokens(c);
  ASSERT_EQ(tc.size(), 110u);
  EXPECT_EQ(SubmitPrefixTokens(c), 102u);
  for (uint32_t j = 0; j < 51; ++j) ASSERT_EQ(tc[j], ta[j]);  // a block's tokens do not depend on the block size
  EXPECT_EQ(tc[51], block_token(12, 0));
  EXPECT_EQ(std::vector<model::Token>(tc.begin() + 102, tc.end()), (std::vector<model::Token>{1, 2, 3, 4, 5, 6, 7, 8}));
}

// The required pages of a request (AdmitRequest.required_pages, and dhs-replay's resident sizing): hot cache + tail in
// pages (hierarchical modes) or its whole context in pages (resident mode: no hot cache, issue 27), plus its index
// keys in pages.
TEST(WorkerGeometry, RequiredPagesAreHotTailIndexKeysAndResidentContext) {
  auto mc = model::PresetConfig("dsv4flash-like");
  ASSERT_TRUE(mc.ok());
  WorkerGeometry g;
  g.kv.page_rows = 16;
  g.hot_rows = 64;
  g.tail_rows = 32;
  const uint64_t key_bytes = static_cast<uint64_t>(mc->n_indexers()) * mc->index_key_bytes();  // per token
  ASSERT_GT(key_bytes, 0u);
  g.page_bytes = 10 * key_bytes;  // 10 tokens of index keys per page
  EXPECT_EQ(RequiredPages(*mc, g, WorkerMode::kAdaptive, 0), 6u);                  // (64 + 32) / 16
  EXPECT_EQ(RequiredPages(*mc, g, WorkerMode::kAdaptive, 10), 7u);                 // + 1 page of keys
  EXPECT_EQ(RequiredPages(*mc, g, WorkerMode::kHisparse, 11), 8u);                 // + 2 pages of keys
  EXPECT_EQ(RequiredPages(*mc, g, WorkerMode::kResident, 11), 3u);                 // 1 context page (11 rows) + 2 keys
  EXPECT_EQ(RequiredPages(*mc, g, WorkerMode::kResident, 17), 2u + 2u);            // 17 rows: 2 context pages + 2 keys
  EXPECT_EQ(RequiredPages(*mc, g, WorkerMode::kResident, 0), 0u);                  // no hot cache, no tail
}

TEST(WorkerSubmit, LogitsDigestIsFnv1aOverTheFloatBits) {
  EXPECT_EQ(LogitsDigest({}), 0xcbf29ce484222325ULL);  // FNV-1a 64 offset basis
  // The float whose bits are 0x00000061 has the little-endian bytes "a\0\0\0"; FNV-1a("a") = 0xaf63dc4c8601ec8c, then
  // three zero bytes, each h *= prime.
  float f;
  const uint32_t bits = 0x61;
  std::memcpy(&f, &bits, 4);
  uint64_t h = 0xaf63dc4c8601ec8cULL;
  for (int i = 0; i < 3; ++i) h *= 0x100000001b3ULL;
  const float one[1] = {f};
  EXPECT_EQ(LogitsDigest(one), h);
  const float pz[1] = {0.0f}, nz[1] = {-0.0f};
  EXPECT_NE(LogitsDigest(pz), LogitsDigest(nz));  // bit patterns, not values
}

TEST(WorkerWire, AppendedTokenChunkFieldsAndStatsMessagesRoundTrip) {
  wire::TokenChunkT c;
  c.request = 9;
  c.tokens = {1, 2};
  c.finished = true;
  c.allocation_wait_us = 1234;
  c.error = wire::ErrorCode::UNAVAILABLE;
  c.error_message = "copy failed";
  const std::string bytes = EncodeTokenChunk(c, 3, "worker/0");  // a Message views its buffer
  auto m = DecodeEnvelope(bytes);
  ASSERT_TRUE(m.ok());
  auto back = ReadTokenChunk(*m);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->allocation_wait_us, 1234u);
  EXPECT_EQ(back->error, wire::ErrorCode::UNAVAILABLE);
  EXPECT_EQ(back->error_message, "copy failed");
  wire::WorkerStatsReplyT r;
  r.census_host = 77;
  r.pages_kept = 5;
  r.mode = "hisparse";
  const std::string reply_bytes = EncodeWorkerStatsReply(r, 4, "worker/0");
  auto rm = DecodeEnvelope(reply_bytes);
  ASSERT_TRUE(rm.ok());
  EXPECT_EQ(rm->type, wire::Body::WorkerStatsReply);
  auto rb = ReadWorkerStatsReply(*rm);
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->census_host, 77u);
  EXPECT_EQ(rb->pages_kept, 5u);
  EXPECT_EQ(rb->mode, "hisparse");
  EXPECT_EQ(ReadWorkerStatsQuery(*rm).status().code(), absl::StatusCode::kFailedPrecondition);
}

// HierarchicalKvAccess's residency plan (adaptive mode): a completed page with a kept GPU page is copied there from the
// tail, readable through the ready map only after that copy completed, and never backed up to host; other pages go to
// the host page memd granted for them.
TEST(WorkerKv, KeptPageIsPublishedOnlyAfterItsCopyAndNeverBackedUp) {
  KvConfig c;
  c.row_bytes = {32};
  c.groups = {{0}};
  c.page_rows = 4;
  c.hot_rows = 8;
  c.k = 4;
  c.tail_rows = 8;
  c.slots = 1;
  c.optional_pages = 2;
  Harness h(c, 8);
  const std::vector<PageIndex> host_plan{6, 5, 4};
  const std::vector<std::pair<uint32_t, PageIndex>> keep{{0, 1}};
  ASSERT_TRUE(h.kv->PlanResidency(1, 0, host_plan, keep).ok());
  const std::vector<std::pair<uint32_t, PageIndex>> bad{{1, 9}};
  EXPECT_EQ(h.kv->PlanResidency(2, 0, host_plan, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(h.kv->PlanResidency(2, 0, host_plan, {}).code(), absl::StatusCode::kFailedPrecondition);  // 1's slot
  EXPECT_EQ(h.kv->PlanResidency(2, 1, host_plan, {}).code(), absl::StatusCode::kInvalidArgument);     // N = 1
  h.device.SetCopyHook([](const CopyInfo& i) { return i.kind == CopyKind::kDeviceToDevice && !i.device.empty()
                                                           ? CopyFate::kHold : CopyFate::kRun; });
  for (Position t = 0; t < 4; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  h.device.WaitIdle();
  KvCompletions none = h.kv->Poll();
  EXPECT_TRUE(none.published.empty());
  EXPECT_FALSE(h.kv->Find(1)->pages[0].Ready());  // the copy is held: not in the ready map yet
  EXPECT_EQ(h.kv->Find(1)->pages[0].host_page, -1);
  EXPECT_EQ(h.kv->HistoryPageOf(1, 1), std::optional<uint32_t>(0));
  h.device.SetCopyHook(nullptr);
  h.device.ReleaseAllHeld();
  h.device.WaitIdle();
  KvCompletions done = h.kv->Poll();
  ASSERT_EQ(done.published.size(), 1u);
  EXPECT_TRUE(done.published[0].kept);
  EXPECT_TRUE(done.published[0].status.ok());
  EXPECT_TRUE(h.kv->Find(1)->pages[0].Ready());
  for (Position t = 4; t < 12; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());  // page 0 leaves the tail
  h.device.WaitIdle();
  h.kv->Poll();
  EXPECT_EQ(h.kv->Find(1)->pages[0].host_page, -1);  // never backed up
  EXPECT_EQ(h.kv->Find(1)->pages[1].host_page, 5);   // the granted host page, not the allocator's
  EXPECT_TRUE(h.kv->Find(1)->pages[1].HostReady());
  std::vector<Position> sel{3, 0, 2, 1};
  std::vector<const uint8_t*> rows(4);
  KvQuery q{1, sel, rows};
  ASSERT_TRUE(h.kv->Fetch(std::vector<SourceId>{0}, {&q, 1}).ok());
  for (size_t j = 0; j < 4; ++j) {
    const auto want = OriginalRow(1, 0, sel[j], 32);
    EXPECT_EQ(0, std::memcmp(rows[j], want.data(), 32)) << "position " << sel[j];
  }
  h.kv->ReadersDone(std::vector<SourceId>{0});
  EXPECT_EQ(h.kv->census(0).direct, 4u);  // from the ready map
  EXPECT_EQ(h.kv->census(0).host, 0u);
  // A reclaim: back up the kept page, withdraw it, retire its GPU page.
  auto b = h.kv->BackupPages(1, std::vector<uint32_t>{0}, std::vector<PageIndex>{6});
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b->Wait().ok());
  auto wd = h.kv->WithdrawReady(1, std::vector<uint32_t>{0});
  ASSERT_TRUE(wd.ok());
  ASSERT_TRUE(wd->Wait().ok());
  h.kv->Poll();
  EXPECT_TRUE(h.kv->Retire(std::vector<PageIndex>{1}).ok());
  EXPECT_EQ(0, std::memcmp(h.host.data() + 6 * h.layout.page_bytes(), OriginalRow(1, 0, 0, 32).data(), 32));
}

TEST(WorkerFailure, FailedCopyEndsOnlyItsRequestAndNeverHandsOutAnotherRequestsRows) {
  Fixture f(WorkerMode::kHisparse);
  const KvLayout layout = *KvLayout::Create(f.worker->geometry().kv);
  // Host recoveries land in hot-cache slots; tail writes do not. Fail every host->device copy into a hot cache.
  f.device.SetCopyHook([&](const CopyInfo& info) {
    if (info.kind != CopyKind::kHostToDevice) return CopyFate::kRun;
    for (const DeviceRange& r : info.device) {
      for (SlotIndex s = 0; s < layout.config().slots; ++s) {
        for (SourceId src = 0; src < layout.num_sources(); ++src) {
          const Location lo = layout.HotRow(s, src, 0);
          const Location hi = lo + static_cast<Location>(layout.config().hot_rows * layout.row_bytes(src));
          if (r.offset < hi && lo < r.offset + static_cast<Location>(r.bytes)) return CopyFate::kFail;
        }
      }
    }
    return CopyFate::kRun;
  });
  // Request 1 outgrows the tail (T = 32) and needs host recovery; request 2 stays in its tail.
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(90, 1), 10), ClientRef{"c", 1}).ok());
  ASSERT_TRUE(f.worker->Submit(Submit(2, Prompt(6, 2), 12), ClientRef{"c", 2}).ok());
  f.RunUntilFinished(2);
  ASSERT_TRUE(f.sink.errors.contains(1));
  EXPECT_NE(f.sink.errors[1].find("request 1"), std::string::npos) << f.sink.errors[1];
  EXPECT_FALSE(f.sink.errors.contains(2));
  const Generated want = Oracle(*f.model, f.Input(Prompt(6, 2)), 12);
  EXPECT_EQ(f.sink.out[2].tokens, want.tokens);
  EXPECT_EQ(f.sink.out[2].digests, want.digests);
  EXPECT_EQ(f.worker->stats().failed_requests, 1u);
  EXPECT_EQ(f.memd->completes, 2);  // the failed request released its capacity too
  // The worker keeps serving once copies work again.
  f.device.SetCopyHook(nullptr);
  ASSERT_TRUE(f.worker->Submit(Submit(3, Prompt(70, 3), 5), ClientRef{"c", 3}).ok());
  f.RunUntilFinished(3);
  const Generated want3 = Oracle(*f.model, f.Input(Prompt(70, 3)), 5);
  EXPECT_EQ(f.sink.out[3].tokens, want3.tokens);
  EXPECT_EQ(f.sink.out[3].digests, want3.digests);
}

TEST(WorkerAdmission, RejectedAdmissionEndsTheRequestWithMemdsReason) {
  Fixture f(WorkerMode::kAdaptive);
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(20, 1), 4), ClientRef{"c", 1}).ok());
  wire::AdmitRejectT reject;
  reject.request = 1;
  reject.code = wire::ErrorCode::RESOURCE_EXHAUSTED;
  reject.reason = "context larger than the GPU";
  f.worker->memd_inbox().OnAdmitReject(reject);
  ASSERT_TRUE(f.sink.finished.contains(1));
  EXPECT_NE(f.sink.errors[1].find("context larger than the GPU"), std::string::npos);
  EXPECT_EQ(f.sink.chunks.back().error, wire::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(f.worker->book().not_active(), 0u);
  // A reject without a code (OK on the wire) still ends the request: UNKNOWN (AdmitRejectError, libdhs's too).
  ASSERT_TRUE(f.worker->Submit(Submit(2, Prompt(20, 2), 4), ClientRef{"c", 2}).ok());
  reject.request = 2;
  reject.code = wire::ErrorCode::OK;
  reject.reason = "no code";
  f.worker->memd_inbox().OnAdmitReject(reject);
  ASSERT_TRUE(f.sink.finished.contains(2));
  EXPECT_NE(f.sink.errors[2].find("admission refused by memd: no code"), std::string::npos) << f.sink.errors[2];
  EXPECT_EQ(f.sink.chunks.back().error, wire::ErrorCode::UNKNOWN);
  EXPECT_EQ(f.worker->book().not_active(), 0u);
}

// AdmitReject answers an AdmitRequest still waiting for its grant. One for a request memd granted already (it holds its
// slot and KV: ending it here would leak both and never send Complete) is logged and ignored; the request runs on.
TEST(WorkerAdmission, RejectAfterTheGrantIsIgnored) {
  Fixture f(WorkerMode::kAdaptive);
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(20, 1), 4), ClientRef{"c", 1}).ok());
  f.memd->Pump(*f.worker);  // the grant
  wire::AdmitRejectT reject;
  reject.request = 1;
  reject.code = wire::ErrorCode::RESOURCE_EXHAUSTED;
  reject.reason = "late reject";
  f.worker->memd_inbox().OnAdmitReject(reject);  // granted, not started
  EXPECT_FALSE(f.sink.finished.contains(1));
  ASSERT_TRUE(f.worker->Iterate().ok());
  ASSERT_EQ(f.worker->book().active(), 1u);
  f.worker->memd_inbox().OnAdmitReject(reject);  // active
  EXPECT_FALSE(f.sink.finished.contains(1));
  f.RunUntilFinished(1);
  EXPECT_FALSE(f.sink.errors.contains(1)) << f.sink.errors[1];
  EXPECT_EQ(f.sink.out[1].tokens.size(), 4u);
  EXPECT_EQ(f.memd->completes, 1) << "the granted request ended without Complete";
}

// A client that stops reading (issue 12): once its sink refuses a chunk (its buffer is full), the request fails
// explicitly: a final chunk with RESOURCE_EXHAUSTED naming how many tokens were delivered, Complete to memd (its slot
// and pages return), no further chunk of it; another client's request is served whole.
TEST(WorkerBackPressure, AChunkTheClientRefusesFailsItsRequestThroughComplete) {
  Fixture f(WorkerMode::kAdaptive);
  f.sink.accept_chunks = 3;  // refuses the 4th chunk on
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(20, 1), 30), ClientRef{"slow", 1}).ok());
  f.RunUntilFinished(1);
  EXPECT_EQ(f.sink.refused, 1u) << "a chunk was offered after the refusal";
  EXPECT_EQ(f.sink.out[1].tokens.size(), 3u);
  ASSERT_EQ(f.sink.chunks.size(), 4u);
  EXPECT_EQ(f.sink.chunks.back().error, wire::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(f.sink.chunks.back().finished);
  EXPECT_NE(f.sink.errors[1].find("failed after 3 tokens: client not reading"), std::string::npos) << f.sink.errors[1];
  EXPECT_EQ(f.memd->completes, 1) << "the failed request did not release its pages";
  EXPECT_EQ(f.worker->stats().failed_requests, 1u);
  // The worker serves on: a client that reads gets all of its tokens.
  f.sink.accept_chunks = SIZE_MAX;
  ASSERT_TRUE(f.worker->Submit(Submit(2, Prompt(20, 2), 6), ClientRef{"fast", 2}).ok());
  f.RunUntilFinished(2);
  EXPECT_EQ(f.sink.out[2].tokens, Oracle(*f.model, f.Input(Prompt(20, 2)), 6).tokens);
  EXPECT_FALSE(f.sink.errors.contains(2)) << f.sink.errors[2];
}

// A bounded submit queue (issue 12): with submit_queue requests waiting for their grant, the next submit is refused
// with RESOURCE_EXHAUSTED "submit queue full (N)" and nothing changes (no AdmitRequest); once grants come, submits are
// accepted again. The peak of waiting requests never exceeds N.
TEST(WorkerBackPressure, SubmitsBeyondTheSubmitQueueAreRefusedAndTheQueueStaysBounded) {
  Fixture f(WorkerMode::kAdaptive);
  f.config.submit_queue = 3;
  auto w = Worker::Create(f.model.get(), &f.device, f.config, f.memd.get(), &f.sink);
  ASSERT_TRUE(w.ok()) << w.status();
  f.worker = std::move(*w);
  for (RequestId id = 1; id <= 3; ++id) ASSERT_TRUE(f.worker->Submit(Submit(id, Prompt(20, 1), 2), ClientRef{"c", id}).ok());
  const size_t admits = f.memd->admitted_ids.size();
  for (RequestId id = 4; id <= 50; ++id) {
    absl::Status st = f.worker->Submit(Submit(id, Prompt(20, 1), 2), ClientRef{"c", id});
    ASSERT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_NE(st.message().find("submit queue full (3)"), std::string::npos) << st;
  }
  EXPECT_EQ(f.memd->admitted_ids.size(), admits) << "a refused submit reached memd";
  EXPECT_EQ(f.worker->stats().submits_refused, 47u);
  EXPECT_EQ(f.worker->stats().waiting_requests_peak, 3u);
  f.RunUntilFinished(3);
  ASSERT_TRUE(f.worker->Submit(Submit(51, Prompt(20, 1), 2), ClientRef{"c", 51}).ok());
  f.RunUntilFinished(4);
  EXPECT_EQ(f.worker->StatsReply().waiting_requests_peak, 3u);
  EXPECT_EQ(f.worker->StatsReply().submits_refused, 47u);
}

// A client that went away (its connection is gone): its unfinished requests end and memd gets their Complete.
TEST(WorkerBackPressure, EndClientEndsOnlyThatClientsRequests) {
  Fixture f(WorkerMode::kAdaptive);
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(20, 1), 30), ClientRef{"gone", 1}).ok());
  ASSERT_TRUE(f.worker->Submit(Submit(2, Prompt(20, 2), 5), ClientRef{"here", 2}).ok());
  f.memd->Pump(*f.worker);
  ASSERT_TRUE(f.worker->Iterate().ok());
  EXPECT_EQ(f.worker->clients().EndClient("gone", absl::UnavailableError("client went away")), 1u);
  EXPECT_EQ(f.memd->completes, 1);
  EXPECT_EQ(f.sink.errors[1], "client went away");
  f.RunUntilFinished(2);
  EXPECT_EQ(f.sink.out[2].tokens, Oracle(*f.model, f.Input(Prompt(20, 2)), 5).tokens);
  EXPECT_EQ(f.worker->clients().EndClient("gone", absl::UnavailableError("again")), 0u);
}

// Cancel (issue 22): a request cancelled mid-stream ends at once with a final chunk carrying CANCELLED and the reason,
// its pages and slot go back through the normal Complete, and its client id may be used again; a cancel of an
// unknown request, of a finished one, or of another client's request is NOT_FOUND and changes nothing.
TEST(WorkerCancel, CancelMidStreamEndsTheStreamWithTheReasonAndReleasesItsSlot) {
  Fixture f(WorkerMode::kAdaptive);
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(20, 1), 30), ClientRef{"c", 7}).ok());
  ASSERT_TRUE(f.worker->Submit(Submit(2, Prompt(20, 2), 4), ClientRef{"c", 8}).ok());
  const size_t slots = f.memd->slots_free() + 2;
  for (int it = 0; it < 200 && f.sink.out[1].tokens.size() < 3; ++it) {
    f.memd->Pump(*f.worker);
    ASSERT_TRUE(f.worker->Iterate().ok());
  }
  ASSERT_GE(f.sink.out[1].tokens.size(), 3u);
  const size_t had = f.sink.out[1].tokens.size();
  const size_t chunks = f.sink.chunks.size();
  // Another client cannot cancel it; an unknown id is NOT_FOUND: nothing changes.
  EXPECT_EQ(f.worker->Cancel(1, 0, ClientRef{"d", 3}, "not mine").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.worker->Cancel(99, 0, ClientRef{"c", 3}, "unknown").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.sink.chunks.size(), chunks);
  EXPECT_EQ(f.memd->completes, 0);

  ASSERT_TRUE(f.worker->Cancel(1, 0, ClientRef{"c", 9}, "deadline passed").ok());
  ASSERT_EQ(f.sink.chunks.size(), chunks + 1);
  const wire::TokenChunkT& end = f.sink.chunks.back();
  EXPECT_EQ(end.request, 1u);
  EXPECT_TRUE(end.finished);
  EXPECT_TRUE(end.tokens.empty());
  EXPECT_EQ(end.error, wire::ErrorCode::CANCELLED);
  EXPECT_EQ(end.end_reason, wire::EndReason::CANCELLED);
  EXPECT_EQ(end.error_message, "cancelled: deadline passed");
  EXPECT_EQ(f.memd->completes, 1) << "the cancelled request did not release its pages";
  EXPECT_EQ(f.memd->slots_free(), slots - 1) << "its slot did not come back";
  EXPECT_EQ(f.worker->stats().requests_cancelled, 1u);
  EXPECT_EQ(f.worker->StatsReply().requests_cancelled, 1u);
  EXPECT_EQ(f.worker->stats().failed_requests, 1u);
  // A second cancel is NOT_FOUND; the other request runs to its end, exactly.
  EXPECT_EQ(f.worker->Cancel(1, 0, ClientRef{"c", 10}, "again").code(), absl::StatusCode::kNotFound);
  f.RunUntilFinished(2);
  EXPECT_EQ(f.sink.out[1].tokens.size(), had) << "a token after the cancel";
  EXPECT_EQ(f.sink.out[2].tokens, Oracle(*f.model, f.Input(Prompt(20, 2)), 4).tokens);
  EXPECT_EQ(f.worker->Cancel(2, 0, ClientRef{"c", 11}, "finished").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.memd->completes, 2);
  EXPECT_EQ(f.memd->slots_free(), slots);
  // The client id is free again: a new request 1 is served exactly.
  f.sink.out.erase(1);
  f.sink.finished.clear();
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(20, 3), 5), ClientRef{"c", 12}).ok());
  f.RunUntilFinished(1);
  EXPECT_EQ(f.sink.out[1].tokens, Oracle(*f.model, f.Input(Prompt(20, 3)), 5).tokens);
}

// Cancel (issue 22) of a request still waiting for its grant: it ends with CANCELLED, memd's queue loses it (the
// Complete), a grant memd sent before it read the Complete is ignored (no second Complete, no start), and its node
// id is not handed to a new request before the CompleteAck.
TEST(WorkerCancel, CancelWhileWaitingForAdmission) {
  Fixture f(WorkerMode::kAdaptive);
  f.memd = std::make_unique<FakeMemd>(64, ComputeGeometry(f.model->config(), f.config)->host_page_bytes, 16, 256, 1,
                                      false, /*slots=*/1);
  auto w = Worker::Create(f.model.get(), &f.device, f.config, f.memd.get(), &f.sink);
  ASSERT_TRUE(w.ok()) << w.status();
  f.worker = std::move(*w);
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(20, 1), 6), ClientRef{"c", 1}).ok());
  ASSERT_TRUE(f.worker->Submit(Submit(2, Prompt(20, 2), 6), ClientRef{"c", 2}).ok());
  f.memd->Pump(*f.worker);
  ASSERT_TRUE(f.worker->Iterate().ok());
  ASSERT_EQ(f.memd->admissions_waiting(), 1u);  // request 2 waits for the only slot
  EXPECT_EQ(f.worker->book().not_active(), 1u);
  const RequestId node2 = f.memd->admitted_ids.at(1);
  ASSERT_TRUE(f.worker->Cancel(2, 0, ClientRef{"c", 5}, "gave up waiting").ok());
  EXPECT_EQ(f.sink.errors[2], "cancelled: gave up waiting");
  EXPECT_TRUE(f.sink.finished.contains(2));
  EXPECT_EQ(f.worker->book().not_active(), 0u);
  EXPECT_EQ(f.memd->admissions_waiting(), 0u) << "memd still queues the cancelled admission";
  EXPECT_EQ(f.memd->completes, 1);
  // A grant that crossed the Complete: ignored (the Complete releases it at memd).
  wire::AdmitGrantT late;
  late.request = node2;
  late.slot = 0;
  f.worker->memd_inbox().OnAdmitGrant(late);
  EXPECT_EQ(f.memd->completes, 1) << "the crossing grant was answered with another Complete";
  EXPECT_EQ(f.worker->book().active(), 1u);
  // Until the CompleteAck its node id stays taken; afterwards client id 2 may map to it again.
  ASSERT_TRUE(f.worker->Submit(Submit(2, Prompt(20, 2), 6), ClientRef{"c", 6}).ok());
  EXPECT_NE(f.memd->admitted_ids.back(), node2);
  wire::CompleteAckT ack;
  ack.request = node2;
  f.worker->memd_inbox().OnCompleteAck(ack);
  f.sink.finished.erase(2);
  f.sink.out.erase(2);
  f.RunUntilFinished(2);  // request 1 and the new 2
  EXPECT_EQ(f.sink.out[1].tokens, Oracle(*f.model, f.Input(Prompt(20, 1)), 6).tokens);
  EXPECT_EQ(f.sink.out[2].tokens, Oracle(*f.model, f.Input(Prompt(20, 2)), 6).tokens);
  EXPECT_EQ(f.memd->slots_free(), 1u);
}

// --listen (issue 22): loopback unless an address is named; bad values name the problem.
TEST(WorkerListen, ListenEndpointsDefaultToLoopback) {
  EXPECT_EQ(*ParseListenEndpoint("tcp://:7001"), "tcp://127.0.0.1:7001");
  EXPECT_EQ(*ParseListenEndpoint("tcp://*:7001"), "tcp://*:7001");
  EXPECT_EQ(*ParseListenEndpoint("tcp://10.0.0.5:*"), "tcp://10.0.0.5:*");
  EXPECT_EQ(*ParseListenEndpoint("tcp://:*"), "tcp://127.0.0.1:*");
  for (const char* bad : {"ipc:///tmp/x.sock", "tcp://host", "tcp://:0", "tcp://:70000", "tcp://:7a", "7001", "tcp://:"}) {
    absl::StatusOr<std::string> e = ParseListenEndpoint(bad);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(e.status().message().find(bad), std::string::npos) << e.status();
  }
}

TEST(WorkerAdmission, AllocationWaitIsSubmitToGrant) {
  Fixture f(WorkerMode::kAdaptive);
  ASSERT_TRUE(f.worker->Submit(Submit(1, Prompt(20, 1), 3), ClientRef{"c", 1}).ok());
  // The grant arrives only with the next Pump; everything the chunk reports is ordered: wait <= ttft <= since.
  f.RunUntilFinished(1);
  ASSERT_FALSE(f.sink.chunks.empty());
  const wire::TokenChunkT& last = f.sink.chunks.back();
  EXPECT_TRUE(last.finished);
  EXPECT_LE(last.allocation_wait_us, last.ttft_us);
  EXPECT_LE(last.ttft_us, last.since_submit_us);
  EXPECT_EQ(f.sink.out[1].tokens.size(), 3u);
}

// ---- Scripted memd conversations: the test delivers memd's messages itself, in a chosen order ----

// A memd that only records what the worker sends (in order); `on_readers_done` / `on_backup_complete` run when a
// ReadersDone / BackupComplete is sent.
class ScriptedMemd final : public RecordingTransport {
 public:
  absl::Status SendAdmitRequest(const wire::AdmitRequestT& m) override {
    log.push_back(absl::StrCat("admit/", m.request));
    return absl::OkStatus();
  }
  absl::Status SendBackupComplete(const wire::BackupCompleteT& m) override {
    log.push_back(absl::StrCat("backup/", m.order));
    backups.push_back(m);
    if (on_backup_complete) on_backup_complete(m);
    return absl::OkStatus();
  }
  absl::Status SendHostCopyWritten(const wire::HostCopyWrittenT& m) override {
    log.push_back(absl::StrCat("host_copy/", m.request));
    host_copies.push_back(m);
    if (on_host_copy) on_host_copy(m);
    return absl::OkStatus();
  }
  absl::Status SendReadersDone(const wire::ReadersDoneT& m) override {
    log.push_back(absl::StrCat("readers_done/", m.order));
    readers_done.push_back(m);
    if (on_readers_done) on_readers_done(m);
    return absl::OkStatus();
  }
  absl::Status SendReadyPublish(const wire::ReadyPublishT& m) override {
    log.push_back(absl::StrCat("ready_publish/", m.order));
    publishes.push_back(m);
    return absl::OkStatus();
  }
  absl::Status SendComplete(const wire::CompleteT& m) override {
    log.push_back(absl::StrCat("complete/", m.request));
    if (auto it = slot_of.find(m.request); it != slot_of.end()) {
      used_slots.erase(it->second);
      slot_of.erase(it);
    }
    if (on_complete) on_complete(m);
    return absl::OkStatus();
  }
  absl::Status SendTokensCommitted(const wire::TokensCommittedT& m) override {
    for (const auto& e : m.entries) log.push_back(absl::StrCat("commit/", e->request, "/", e->from));
    return absl::OkStatus();
  }
  // Position of `entry` in the log, or -1.
  int Index(const std::string& entry) const {
    auto it = std::find(log.begin(), log.end(), entry);
    return it == log.end() ? -1 : static_cast<int>(it - log.begin());
  }

  std::vector<std::string> log;
  // memd owns the slots: the lowest free one for `request` (freed at its Complete).
  SlotIndex TakeSlot(RequestId request) {
    SlotIndex slot = 0;
    while (used_slots.contains(slot)) ++slot;
    used_slots.insert(slot);
    slot_of[request] = slot;
    return slot;
  }

  std::vector<wire::BackupCompleteT> backups;
  std::vector<wire::HostCopyWrittenT> host_copies;
  std::set<SlotIndex> used_slots;
  std::map<RequestId, SlotIndex> slot_of;
  std::vector<wire::ReadersDoneT> readers_done;
  std::vector<wire::ReadyPublishT> publishes;
  std::function<void(const wire::ReadersDoneT&)> on_readers_done;
  std::function<void(const wire::BackupCompleteT&)> on_backup_complete;
  std::function<void(const wire::HostCopyWrittenT&)> on_host_copy;
  std::function<void(const wire::CompleteT&)> on_complete;
};

// A Device forwarding to a CpuDevice that lets a test see a thread about to block on a device->host copy: the event
// of every such copy is wrapped, and a Wait on one not yet done first calls `on_wait` (on the waiting thread).
class WaitWatchingDevice final : public Device {
 public:
  explicit WaitWatchingDevice(CpuDevice* device) : d_(device) {}
  std::function<void()> on_wait;  // set before the worker runs

  absl::StatusOr<PoolId> AllocatePool(uint64_t bytes) override { return d_->AllocatePool(bytes); }
  uint64_t PoolBytes(PoolId pool) const override { return d_->PoolBytes(pool); }
  CopyEvent CopyHostToDevice(std::span<const HostToDeviceCopy> ops, std::span<const CopyEvent> after) override {
    return d_->CopyHostToDevice(ops, after);
  }
  CopyEvent CopyDeviceToHost(std::span<const DeviceToHostCopy> ops, std::span<const CopyEvent> after) override {
    return CopyEvent(std::make_shared<Watched>(d_->CopyDeviceToHost(ops, after), this));
  }
  CopyEvent CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops, std::span<const CopyEvent> after) override {
    return d_->CopyDeviceToDevice(ops, after);
  }
  ReaderId BeginReaders(std::span<const DeviceRange> ranges) override { return d_->BeginReaders(ranges); }
  void EndReaders(ReaderId reader) override { d_->EndReaders(reader); }
  bool ReadersBusy(const DeviceRange& range) const override { return d_->ReadersBusy(range); }
  CopyEvent ReadersFence(const DeviceRange& range) override { return d_->ReadersFence(range); }
  uint8_t* HostVisible(PoolId pool, Location offset) override { return d_->HostVisible(pool, offset); }

 private:
  class Watched final : public EventState {
   public:
    Watched(CopyEvent inner, const WaitWatchingDevice* device) : inner_(std::move(inner)), device_(device) {}
    bool Done() const override { return inner_.Done(); }
    absl::Status Status() const override { return inner_.Status(); }
    absl::Status Wait() const override {
      if (!inner_.Done() && device_->on_wait) device_->on_wait();
      return inner_.Wait();
    }

   private:
    CopyEvent inner_;
    const WaitWatchingDevice* device_;
  };
  CpuDevice* d_;
};

// An adaptive worker on a CpuDevice talking to a ScriptedMemd; host pages 10.. of a 64-page host pool. With
// `watch_waits` the worker's device is a WaitWatchingDevice over `device` (`watched`).
struct ScriptedFixture {
  explicit ScriptedFixture(bool watch_waits = false) : model(MakePresetModel("dsv4flash-like")) {
    if (watch_waits) watched = std::make_unique<WaitWatchingDevice>(&device);
    config.mode = WorkerMode::kAdaptive;
    config.page_rows = 16;
    config.tail_rows = 32;
    config.slots = 2;
    config.max_context_tokens = 200;
    auto g = ComputeGeometry(model->config(), config);
    EXPECT_TRUE(g.ok()) << g.status();
    config.hbm_budget_bytes = 16 * g->page_bytes;
    host.assign(64 * g->host_page_bytes, 0);
    Device* worker_device = watched ? static_cast<Device*>(watched.get()) : &device;
    memd.host_span = host;
    auto w = Worker::Create(model.get(), worker_device, config, &memd, &sink);
    EXPECT_TRUE(w.ok()) << w.status();
    worker = std::move(*w);
    layout = std::make_unique<KvLayout>(*KvLayout::Create(worker->geometry().kv));
  }
  // Submits `id` and grants it: history page j goes to host page host_base + j, except the pages of `kept` (history
  // page -> optional GPU page), which memd lets the worker keep on GPU without a host backup (adaptive mode).
  void SubmitAndGrant(RequestId id, size_t prompt, uint32_t max_new, std::map<uint32_t, PageIndex> kept = {},
                      PageIndex host_base = 10) {
    wire::SubmitRequestT s;
    s.request = id;
    s.prompt = Prompt(prompt, static_cast<uint32_t>(id));
    s.max_new_tokens = max_new;
    ASSERT_TRUE(worker->Submit(s, ClientRef{"c", id}).ok());
    wire::AdmitGrantT grant;
    grant.request = id;
    grant.slot = memd.TakeSlot(id);
    for (uint32_t j = 0; j < (prompt + max_new + 15) / 16; ++j) grant.backup_host_pages.emplace_back(0, host_base + j);
    for (const auto& [j, dp] : kept) {
      grant.optional_history_pages.push_back(j);
      grant.optional_pages.push_back(dp);
    }
    worker->memd_inbox().OnAdmitGrant(grant);
  }
  // Rows of `id` appended for every source (0 before its first row).
  Position Appended(RequestId id) {
    const RequestKv* kv = worker->hierarchical()->Find(id);
    return kv == nullptr ? 0 : *std::min_element(kv->appended.begin(), kv->appended.end());
  }
  // Iterates (copies complete in between) until `done` holds; false after `limit` iterations.
  bool IterateUntil(const std::function<bool()>& done, int limit = 200) {
    for (int it = 0; it < limit && !done(); ++it) {
      if (!worker->Iterate().ok()) return false;
      device.WaitIdle();
    }
    return done();
  }
  // Holds every device->host copy that reads the tail rows of history page `page` of `id` (its host backup).
  void HoldHostCopyOf(RequestId id, uint32_t page) {
    const Location at = layout->TailRow(worker->hierarchical()->Find(id)->slot, 0, Position{page} * 16);
    device.SetCopyHook([at](const CopyInfo& i) {
      if (i.kind != CopyKind::kDeviceToHost) return CopyFate::kRun;
      for (const DeviceRange& r : i.device) {
        if (r.offset == at) return CopyFate::kHold;
      }
      return CopyFate::kRun;
    });
  }
  // BackupComplete messages for reclaim order `order`.
  std::vector<wire::BackupCompleteT> BackupsOf(uint64_t order) const {
    std::vector<wire::BackupCompleteT> out;
    for (const wire::BackupCompleteT& b : memd.backups) {
      if (b.order == order) out.push_back(b);
    }
    return out;
  }
  // Whether a HostCopyWritten{ok} named history page `page` of `id`.
  bool ReportedDeferred(RequestId id, uint32_t page) const {
    for (const wire::HostCopyWrittenT& b : memd.host_copies) {
      if (b.ok && b.request == id && std::count(b.history_pages.begin(), b.history_pages.end(), page)) return true;
    }
    return false;
  }
  // Iterates until history page `page` of `id` has a completed host copy reported to memd.
  void RunUntilHostCopy(RequestId id, uint32_t page) {
    for (int it = 0; it < 200; ++it) {
      if (ReportedDeferred(id, page)) return;
      ASSERT_TRUE(worker->Iterate().ok());
      device.WaitIdle();
    }
    FAIL() << "history page " << page << " of request " << id << " never got a host copy";
  }
  // Holds every host->device copy that writes GPU page `dp` of the optional pool (a populate copy).
  void HoldPopulateInto(PageIndex dp) {
    const Location at = layout->PageRow(dp, 0, 0);
    device.SetCopyHook([at](const CopyInfo& i) {
      if (i.kind != CopyKind::kHostToDevice) return CopyFate::kRun;
      for (const DeviceRange& r : i.device) {
        if (r.offset == at) return CopyFate::kHold;
      }
      return CopyFate::kRun;
    });
  }
  void ReleaseHeld() {
    device.SetCopyHook(nullptr);
    device.ReleaseAllHeld();
    device.WaitIdle();
  }
  static wire::ReclaimOrderT ReclaimOrder(uint64_t order, RequestId id, std::vector<uint32_t> pages,
                                          std::vector<PageIndex> targets) {
    wire::ReclaimOrderT o;
    o.order = order;
    o.request = id;
    o.pages = pages;
    o.backup_pages = pages;
    for (PageIndex h : targets) o.backup_targets.emplace_back(0, h);
    return o;
  }
  static wire::PopulateOrderT PopulateOrder(uint64_t order, RequestId id, PageIndex dp, uint32_t page) {
    wire::PopulateOrderT o;
    o.order = order;
    o.request = id;
    o.pages = {dp};
    o.history_pages = {page};
    o.host_pages = {wire::HostPageRef(0, 10 + page)};
    return o;
  }

  std::unique_ptr<model::Model> model;
  WorkerConfig config;
  CpuDevice device;
  std::unique_ptr<WaitWatchingDevice> watched;  // with watch_waits: the worker's device
  ScriptedMemd memd;
  RecordingSink sink;
  std::vector<uint8_t> host;
  std::unique_ptr<Worker> worker;
  std::unique_ptr<KvLayout> layout;
};

// memd's orders reach the Worker through libdhs (issue 25): the admission desk takes memd's answers only, and an order
// is carried out on the KV side (KvStack::Order), as for an engine's request: one that comes while the model's readers
// are outstanding waits (counted as work in flight) until they end and the loop iterates; one still held when memd
// dies is dropped (the dead memd's orders are never acted on: not in an iteration between memd's death and the loss
// taken, not after the return either).
static_assert(!std::is_base_of_v<MemdHandler, AdmissionDesk>, "memd's orders never reach the admission desk");

TEST(WorkerOrders, AnOrderWaitsForTheModelsReadersAndIsDroppedWhenMemdDies) {
  for (const bool memd_dies : {false, true}) {
    SCOPED_TRACE(memd_dies ? "memd dies while the order is held" : "the readers end");
    ScriptedFixture f;
    constexpr PageIndex kDp = 5;
    f.SubmitAndGrant(1, 70, 24);
    f.RunUntilHostCopy(1, 0);
    // Readers of request 1 outstanding on the group of source 0 (the model ended its own after its step).
    lib::KvPort* port = f.worker->kv_port();
    const std::vector<SourceId>& group = f.worker->geometry().kv.groups[0];
    const std::vector<Position> selection = {0, 1, 2};
    std::vector<const uint8_t*> rows(group.size() * selection.size());
    lib::KvPort::Query q{.request = 1, .selection = selection, .rows_out = rows};
    ASSERT_TRUE(port->Resolve(group, std::span(&q, 1)).ok());
    ASSERT_TRUE(port->ReadersOutstanding());
    f.worker->memd_inbox().OnPopulateOrder(ScriptedFixture::PopulateOrder(100, 1, kDp, 0));
    EXPECT_EQ(f.worker->pending_orders(), 1u) << "not held (or not counted as work in flight)";
    EXPECT_EQ(f.worker->hierarchical()->HistoryPageOf(1, kDp), std::nullopt) << "carried out under the readers";
    if (memd_dies) {
      // The transport sees memd gone; the model's readers end and the loop iterates before the worker takes the loss
      // (WorkerProcess::ServeOnce: CheckEpoch, then Iterate, then ServeAway): the dead memd's order stays held.
      ASSERT_TRUE(f.memd.session().ConnectionLost(std::chrono::steady_clock::now()));
      ASSERT_TRUE(port->ReadersDone(group).ok());
      ASSERT_TRUE(f.worker->Iterate().ok());
      EXPECT_EQ(f.worker->hierarchical()->HistoryPageOf(1, kDp), std::nullopt) << "carried out for a dead memd";
      f.worker->memd_away().Enter();  // dropped
      EXPECT_EQ(f.worker->pending_orders(), 0u);
      wire::HelloReplyT reply;  // a memd takes the re-Hello: request 1 adopted
      reply.accepted = true;
      reply.worker_epoch = 1;
      ASSERT_TRUE(f.worker->memd_away().Return(reply).ok());
    } else {
      ASSERT_TRUE(port->ReadersDone(group).ok());
    }
    ASSERT_TRUE(f.worker->Iterate().ok());
    if (memd_dies) {
      EXPECT_EQ(f.worker->pending_orders(), 0u) << "the dead memd's held order was carried out";
      EXPECT_EQ(f.worker->hierarchical()->HistoryPageOf(1, kDp), std::nullopt);
    } else {
      // Carried out now: the page is mapped (its populate copy in flight or answered).
      EXPECT_EQ(f.worker->hierarchical()->HistoryPageOf(1, kDp), std::optional<uint32_t>(0));
      EXPECT_TRUE(f.IterateUntil([&] { return f.memd.publishes.size() == 1; }));
      ASSERT_EQ(f.memd.publishes.size(), 1u);
      EXPECT_TRUE(f.memd.publishes[0].ok);
    }
    EXPECT_TRUE(f.worker->CheckInvariants().ok()) << f.worker->CheckInvariants();
  }
}

// memd reclaims whole requests, pages whose population copy is still in flight included (memd/README.md). The worker
// must withdraw such a page too, after its populate copy was answered: a ReadersDone while the page is still mapped
// (or about to be published) lets memd retire and regrant a page another request's lookups would read (brief §4;
// the replay's "device page N is still in a ready map" / "device page N is in use").
TEST(WorkerOrders, ReclaimOfAPageWhosePopulateIsInFlightWithdrawsItBeforeReadersDone) {
  ScriptedFixture f;
  constexpr PageIndex kDp = 5;
  f.SubmitAndGrant(1, 70, 24);
  f.RunUntilHostCopy(1, 0);
  HierarchicalKvAccess* kv = f.worker->hierarchical();
  ASSERT_NE(kv, nullptr);
  // At ReadersDone no page of the order may still be mapped by the worker, and each must be retirable.
  f.memd.on_readers_done = [&](const wire::ReadersDoneT& m) {
    for (uint32_t dp : m.pages) EXPECT_EQ(kv->HistoryPageOf(1, dp), std::nullopt) << "GPU page " << dp;
    EXPECT_TRUE(kv->Retire(m.pages).ok());
  };
  f.HoldPopulateInto(kDp);
  f.worker->memd_inbox().OnPopulateOrder(ScriptedFixture::PopulateOrder(100, 1, kDp, 0));
  ASSERT_EQ(f.device.HeldCopies().size(), 1u);
  EXPECT_EQ(kv->HistoryPageOf(1, kDp), std::optional<uint32_t>(0));  // pending: mapped, not ready
  // memd's scripted order: the reclaim of request 1 (page kDp, which has a host copy) crosses the populate.
  wire::ReclaimOrderT reclaim;
  reclaim.order = 101;
  reclaim.request = 1;
  reclaim.pages = {kDp};
  f.worker->memd_inbox().OnReclaimOrder(reclaim);
  for (int it = 0; it < 3; ++it) ASSERT_TRUE(f.worker->Iterate().ok());
  EXPECT_TRUE(f.memd.readers_done.empty()) << "ReadersDone while the populate copy into the page is in flight";
  EXPECT_TRUE(f.memd.publishes.empty());
  EXPECT_EQ(f.worker->pending_orders(), 2u);
  // The copy lands: ReadyPublish answers the populate, then the page is withdrawn and ReadersDone follows.
  f.ReleaseHeld();
  for (int it = 0; it < 50 && f.memd.readers_done.empty(); ++it) {
    ASSERT_TRUE(f.worker->Iterate().ok());
    f.device.WaitIdle();
  }
  ASSERT_EQ(f.memd.readers_done.size(), 1u);
  ASSERT_EQ(f.memd.publishes.size(), 1u);
  EXPECT_TRUE(f.memd.publishes[0].ok);
  EXPECT_LT(f.memd.Index("ready_publish/100"), f.memd.Index("readers_done/101"));
  EXPECT_EQ(f.memd.readers_done[0].pages, std::vector<uint32_t>{kDp});
  EXPECT_FALSE(kv->Find(1)->pages[0].Ready());
  EXPECT_EQ(kv->Find(1)->ready_page[0], -1);
  wire::RetireT retire;
  retire.order = 101;
  retire.request = 1;
  retire.pages = {kDp};
  f.worker->memd_inbox().OnRetire(retire);
  EXPECT_EQ(f.worker->stats().reclaims_obeyed, 1u);
  EXPECT_EQ(f.worker->pending_orders(), 0u);
  // The request still runs to the end, bit-identical to the model alone.
  for (int it = 0; it < 500 && !f.sink.finished.contains(1); ++it) ASSERT_TRUE(f.worker->Iterate().ok());
  ASSERT_TRUE(f.sink.finished.contains(1));
  EXPECT_FALSE(f.sink.errors.contains(1));
  const std::vector<uint8_t> prompt = Prompt(70, 1);
  const Generated want = Oracle(*f.model, std::vector<model::Token>(prompt.begin(), prompt.end()), 24);
  EXPECT_EQ(f.sink.out[1].tokens, want.tokens);
  EXPECT_EQ(f.sink.out[1].digests, want.digests);
}

// A request that finishes while a populate copy into one of its GPU pages is in flight: memd frees that page only when
// the populate order is answered (memd/README.md, completion), so the worker answers it (ok = false, CANCELLED) after
// its Complete, and only once the copy into the page ended; before, memd could regrant a page still being written.
TEST(WorkerOrders, PopulateOfAFinishedRequestIsAnsweredAfterItsCopyEnded) {
  ScriptedFixture f;
  constexpr PageIndex kDp = 7;
  f.SubmitAndGrant(1, 40, 3);
  f.RunUntilHostCopy(1, 0);
  f.HoldPopulateInto(kDp);
  f.worker->memd_inbox().OnPopulateOrder(ScriptedFixture::PopulateOrder(200, 1, kDp, 0));
  ASSERT_EQ(f.device.HeldCopies().size(), 1u);
  for (int it = 0; it < 500 && !f.sink.finished.contains(1); ++it) ASSERT_TRUE(f.worker->Iterate().ok());
  ASSERT_TRUE(f.sink.finished.contains(1));
  ASSERT_NE(f.memd.Index("complete/1"), -1);
  absl::StatusOr<bool> busy = f.worker->Iterate();
  ASSERT_TRUE(busy.ok());
  EXPECT_TRUE(*busy) << "the unanswered populate order is work in flight";
  EXPECT_TRUE(f.memd.publishes.empty()) << "answered while the copy into GPU page " << kDp << " is in flight";
  f.ReleaseHeld();
  busy = f.worker->Iterate();
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(*busy);
  ASSERT_EQ(f.memd.publishes.size(), 1u);
  EXPECT_EQ(f.memd.publishes[0].order, 200u);
  EXPECT_FALSE(f.memd.publishes[0].ok);
  EXPECT_EQ(f.memd.publishes[0].error, wire::ErrorCode::CANCELLED);
  EXPECT_EQ(f.memd.publishes[0].pages, std::vector<uint32_t>{kDp});
  EXPECT_LT(f.memd.Index("complete/1"), f.memd.Index("ready_publish/200"));
  EXPECT_EQ(f.worker->pending_orders(), 0u);
}

// The payload rows the model appends for `tokens`, by (source, position): the model alone on ResidentKvAccess, the
// whole prompt in one step (batch invariance, brief §11: the worker's chunked prefill appends the same bytes).
class RecordingKv final : public KvAccess {
 public:
  explicit RecordingKv(const model::ModelConfig& c)
      : inner_(model::ResidentKvAccess::ForModel(c, size_t{64} << 20, 16)) {}
  absl::Status Append(RequestId request, SourceId source, Position position, std::span<const uint8_t> row) override {
    rows[{source, position}].assign(row.begin(), row.end());
    return inner_->Append(request, source, position, row);
  }
  absl::Status Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) override {
    return inner_->Fetch(sources, batch);
  }
  void ReadersDone(std::span<const SourceId> sources) override { inner_->ReadersDone(sources); }
  void Release(RequestId request) override { inner_->Release(request); }
  std::map<std::pair<SourceId, Position>, std::vector<uint8_t>> rows;

 private:
  std::unique_ptr<model::ResidentKvAccess> inner_;
};

std::map<std::pair<SourceId, Position>, std::vector<uint8_t>> OriginalRows(const model::Model& m,
                                                                           const std::vector<uint8_t>& prompt) {
  RecordingKv kv(m.config());
  model::ModelSession s = m.NewSession(1);
  std::vector<model::Token> feed(prompt.begin(), prompt.end());
  model::StepInput in{&s, feed};
  model::StepOutput out;
  EXPECT_TRUE(m.Step(std::span<model::StepInput>(&in, 1), kv, std::span<model::StepOutput>(&out, 1)).ok());
  return std::move(kv.rows);
}

// Host page `host_page` holds the original rows of history page `page`, source by source (layout.h: host pages use
// the device page layout).
void ExpectHostPageHolds(const ScriptedFixture& f, PageIndex host_page, uint32_t page,
                         const std::map<std::pair<SourceId, Position>, std::vector<uint8_t>>& rows) {
  const uint8_t* base = f.host.data() + uint64_t{host_page} * f.layout->host_page_bytes();
  for (SourceId s = 0; s < f.layout->num_sources(); ++s) {
    for (uint32_t i = 0; i < 16; ++i) {
      const Position t = Position{page} * 16 + i;
      auto it = rows.find({s, t});
      ASSERT_NE(it, rows.end()) << "source " << s << " position " << t;
      ASSERT_EQ(it->second.size(), f.layout->row_bytes(s));
      ASSERT_EQ(0, std::memcmp(base + f.layout->InPage(s, i), it->second.data(), it->second.size()))
          << "host page " << host_page << " (history page " << page << "), source " << s << ", position " << t;
    }
  }
}

// At every BackupComplete{ok} of a reclaim order, each page it names has a written host copy on the worker, except
// the pages it names deferred (only planned to be kept, contract §4: they must hold nothing, their rows still to be
// written); at every HostCopyWritten{ok}, each history page it names has a written host copy. memd counts those
// pages as host copies, and may populate them, from that message on. BackupComplete never has order 0 (version 3).
void CheckBackupsAreWritten(ScriptedFixture& f, RequestId id, std::map<PageIndex, uint32_t> history_of) {
  f.memd.on_host_copy = [&f, id](const wire::HostCopyWrittenT& m) {
    if (!m.ok || m.request != id) return;
    const RequestKv* kv = f.worker->hierarchical()->Find(id);
    ASSERT_NE(kv, nullptr);
    for (uint32_t j : m.history_pages) {
      ASSERT_LT(j, kv->pages.size());
      EXPECT_TRUE(kv->pages[j].HostReady()) << "history page " << j << " reported written before its copy ended";
    }
  };
  f.memd.on_backup_complete = [&f, id, history_of](const wire::BackupCompleteT& m) {
    EXPECT_NE(m.order, 0u) << "BackupComplete with order 0 (version 3: HostCopyWritten)";
    if (!m.ok || m.request != id) return;
    const RequestKv* kv = f.worker->hierarchical()->Find(id);
    EXPECT_FALSE(m.pages.empty()) << "an empty list reads as the whole order at memd";
    for (uint32_t dp : m.pages) {
      auto h = history_of.find(dp);
      ASSERT_NE(h, history_of.end()) << "GPU page " << dp;
      const bool deferred = std::count(m.deferred_pages.begin(), m.deferred_pages.end(), dp) != 0;
      if (kv == nullptr || kv->pages.empty()) {  // nothing written yet: every page must be deferred
        EXPECT_TRUE(deferred) << "GPU page " << dp << " of a request that has not started reported backed up";
        continue;
      }
      if (deferred) {  // its host copy may be written by now (then reported with order 0): only check the GPU page
        EXPECT_EQ(f.worker->hierarchical()->HistoryPageOf(id, dp), std::nullopt)
            << "GPU page " << dp << " reported deferred but holds history page " << h->second;
        continue;
      }
      ASSERT_LT(h->second, kv->pages.size());
      EXPECT_TRUE(kv->pages[h->second].HostReady()) << "GPU page " << dp << " (history page " << h->second
                                                   << ") reported backed up before its host copy was written";
    }
  };
}

// A reclaim order that arrives while the victim is still prefilling names a GPU page only planned to keep a history
// page the victim has not finished writing (history page 1 here), next to a kept one (page 0). The planned GPU page
// holds nothing, so the order does not wait for the victim's prefill (contract §4, deferred): its BackupComplete names
// both pages once page 0's host copy is written, with page 1 in deferred_pages; the pages are withdrawn and retired;
// page 1 goes to its host page from the tail when it completes and is reported then, with order 0 (held here, so
// that report must wait for the copy). Before, the order waited for the victim to finish writing page 1, and the
// admission behind it waited for the victim's prefill.
TEST(WorkerOrders, ReclaimOfAPageStillBeingWrittenDefersItAndReportsItsHostCopyLater) {
  ScriptedFixture f;
  constexpr PageIndex kDp0 = 3, kDp1 = 4;
  const std::vector<uint8_t> prompt = Prompt(70, 1);
  f.SubmitAndGrant(1, 70, 4, {{0, kDp0}, {1, kDp1}});
  HierarchicalKvAccess* kv = f.worker->hierarchical();
  CheckBackupsAreWritten(f, 1, {{kDp0, 0}, {kDp1, 1}});
  // Prefill until history page 0 is kept on GPU page kDp0 while page 1 is still being written.
  ASSERT_TRUE(f.IterateUntil([&] { return f.Appended(1) >= 16 && kv->Find(1)->pages[0].Ready(); }));
  const uint32_t chunk = f.worker->geometry().prefill_chunk;
  ASSERT_LT(f.Appended(1), 32) << "prefill chunk " << chunk << ": page 1 completed before the order";
  ASSERT_EQ(kv->HistoryPageOf(1, kDp1), std::nullopt);  // only planned: it holds nothing yet
  f.HoldHostCopyOf(1, 1);
  f.worker->memd_inbox().OnReclaimOrder(ScriptedFixture::ReclaimOrder(300, 1, {kDp0, kDp1}, {10, 11}));
  // Page 0's copy (from its GPU page) ends; the order is answered and withdrawn while page 1 is still being written.
  ASSERT_TRUE(f.IterateUntil([&] { return !f.memd.readers_done.empty(); }));
  ASSERT_LT(f.Appended(1), 32) << "the order waited for the victim to finish writing page 1";
  const std::vector<wire::BackupCompleteT> done = f.BackupsOf(300);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok) << done[0].message;
  std::vector<uint32_t> pages = done[0].pages;
  std::sort(pages.begin(), pages.end());
  EXPECT_EQ(pages, (std::vector<uint32_t>{kDp0, kDp1}));
  EXPECT_EQ(done[0].deferred_pages, std::vector<uint32_t>{kDp1});
  EXPECT_LT(f.memd.Index("backup/300"), f.memd.Index("readers_done/300"));
  EXPECT_EQ(kv->HistoryPageOf(1, kDp0), std::nullopt);
  EXPECT_EQ(kv->HistoryPageOf(1, kDp1), std::nullopt);
  wire::RetireT retire;
  retire.order = 300;
  retire.request = 1;
  retire.pages = {kDp0, kDp1};
  f.worker->memd_inbox().OnRetire(retire);
  EXPECT_EQ(f.worker->stats().reclaims_obeyed, 1u);
  // The victim goes on prefilling; page 1's host copy (to the order's target) is issued when the page completes, and
  // held: not reported yet. (Iterations stop before page 1's tail slots would be needed: they wait for its copy.)
  ASSERT_TRUE(f.IterateUntil([&] { return !f.device.HeldCopies().empty(); }));
  ASSERT_EQ(f.device.HeldCopies().size(), 1u);
  for (int it = 0; it < 3 && f.Appended(1) + chunk < 48; ++it) {
    ASSERT_TRUE(f.worker->Iterate().ok());
    f.device.WaitIdle();
  }
  EXPECT_FALSE(f.ReportedDeferred(1, 1)) << "page 1 reported written while its host copy is held";
  f.ReleaseHeld();
  ASSERT_TRUE(f.IterateUntil([&] { return f.ReportedDeferred(1, 1); }));
  EXPECT_FALSE(f.ReportedDeferred(1, 0)) << "page 0 belongs to the order's BackupComplete, not to order 0";
  // The host pages hold the original rows.
  const auto rows = OriginalRows(*f.model, prompt);
  ExpectHostPageHolds(f, 10, 0, rows);
  ExpectHostPageHolds(f, 11, 1, rows);
  // The request runs to the end (pages 0 and 1 now from host), bit-identical to the model alone.
  ASSERT_TRUE(f.IterateUntil([&] { return f.sink.finished.contains(1); }, 500));
  EXPECT_FALSE(f.sink.errors.contains(1));
  const Generated want = Oracle(*f.model, std::vector<model::Token>(prompt.begin(), prompt.end()), 4);
  EXPECT_EQ(f.sink.out[1].tokens, want.tokens);
  EXPECT_EQ(f.sink.out[1].digests, want.digests);
  EXPECT_EQ(f.worker->pending_orders(), 0u);
}

// As above, but the host write of the kept page (page 0, copied from its GPU page) fails: the order's BackupComplete
// reports the failure (never "done", and no deferred page), and memd then leaves the victim as it was, so the worker
// keeps page 0 on its GPU page and keeps page 1, which it had only planned to keep, on its GPU page after all; the
// request goes on, bit-identical.
TEST(WorkerOrders, FailedHostWriteFailsTheReclaimAndRestoresThePlannedKeep) {
  ScriptedFixture f;
  constexpr PageIndex kDp0 = 3, kDp1 = 4;
  const std::vector<uint8_t> prompt = Prompt(70, 1);
  f.SubmitAndGrant(1, 70, 4, {{0, kDp0}, {1, kDp1}});
  HierarchicalKvAccess* kv = f.worker->hierarchical();
  CheckBackupsAreWritten(f, 1, {{kDp0, 0}, {kDp1, 1}});
  ASSERT_TRUE(f.IterateUntil([&] { return f.Appended(1) >= 16 && kv->Find(1)->pages[0].Ready(); }));
  ASSERT_LT(f.Appended(1), 32);
  // Page 0's backup reads its GPU page or, while its rows are still there, the tail: fail either.
  const Location page0 = f.layout->PageRow(kDp0, 0, 0), tail0 = f.layout->TailRow(kv->Find(1)->slot, 0, 0);
  f.device.SetCopyHook([page0, tail0](const CopyInfo& i) {
    if (i.kind != CopyKind::kDeviceToHost) return CopyFate::kRun;
    for (const DeviceRange& r : i.device) {
      if (r.offset == page0 || r.offset == tail0) return CopyFate::kFail;
    }
    return CopyFate::kRun;
  });
  f.worker->memd_inbox().OnReclaimOrder(ScriptedFixture::ReclaimOrder(301, 1, {kDp0, kDp1}, {10, 11}));
  ASSERT_TRUE(f.IterateUntil([&] { return f.memd.Index("backup/301") != -1; }));
  f.device.SetCopyHook(nullptr);
  const std::vector<wire::BackupCompleteT> done = f.BackupsOf(301);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_FALSE(done[0].ok) << "a failed host write reported as done";
  EXPECT_NE(done[0].error, wire::ErrorCode::OK);
  EXPECT_TRUE(done[0].deferred_pages.empty());
  std::vector<uint32_t> pages = done[0].pages;
  std::sort(pages.begin(), pages.end());
  EXPECT_EQ(pages, (std::vector<uint32_t>{kDp0, kDp1}));
  // memd leaves the victim untouched: no ReadersDone; page 0 stays on its GPU page, page 1 is kept on its own once
  // written.
  ASSERT_TRUE(f.IterateUntil([&] { return f.Appended(1) >= 32 && kv->Find(1)->pages[1].Ready(); }));
  EXPECT_TRUE(f.memd.readers_done.empty());
  EXPECT_EQ(kv->HistoryPageOf(1, kDp0), std::optional<uint32_t>(0));
  EXPECT_EQ(kv->HistoryPageOf(1, kDp1), std::optional<uint32_t>(1));
  EXPECT_FALSE(f.ReportedDeferred(1, 1)) << "a page kept on GPU again was reported written to host";
  EXPECT_EQ(f.worker->pending_orders(), 0u);
  ASSERT_TRUE(f.IterateUntil([&] { return f.sink.finished.contains(1); }, 500));
  EXPECT_FALSE(f.sink.errors.contains(1)) << f.sink.errors[1];
  const Generated want = Oracle(*f.model, std::vector<model::Token>(prompt.begin(), prompt.end()), 4);
  EXPECT_EQ(f.sink.out[1].tokens, want.tokens);
  EXPECT_EQ(f.sink.out[1].digests, want.digests);
}

// A kept page whose keep copy (tail -> optional GPU page) fails holds nothing on that GPU page: the KV backs the page up
// to its grant's host page instead (held here), and memd, not told yet (HostCopyWritten comes once that copy is
// written, contract §3), orders a reclaim naming the GPU page among its backup pages. The order is answered, not
// refused: the fallback copy is the page's backup (awaited), nothing is withdrawn, the page is retired, and the request
// ends bit-identical. Before, the worker refused every such order (GpuPageOf found nothing) and memd kept the page,
// with the admission waiting on it, until the request ended.
TEST(WorkerOrders, ReclaimOfAPageWhoseKeepCopyFailedIsAnsweredWithTheFallbackCopy) {
  ScriptedFixture f;
  constexpr PageIndex kDp0 = 3;
  const std::vector<uint8_t> prompt = Prompt(70, 1);
  f.SubmitAndGrant(1, 70, 4, {{0, kDp0}});
  HierarchicalKvAccess* kv = f.worker->hierarchical();
  CheckBackupsAreWritten(f, 1, {{kDp0, 0}});
  ASSERT_NE(kv->Find(1), nullptr);
  const Location dp0 = f.layout->PageRow(kDp0, 0, 0), tail0 = f.layout->TailRow(kv->Find(1)->slot, 0, 0);
  f.device.SetCopyHook([dp0, tail0](const CopyInfo& i) {
    for (const DeviceRange& r : i.device) {
      if (i.kind == CopyKind::kDeviceToDevice && r.offset == dp0) return CopyFate::kFail;  // the keep copy
      if (i.kind == CopyKind::kDeviceToHost && r.offset == tail0) return CopyFate::kHold;   // its fallback backup
    }
    return CopyFate::kRun;
  });
  ASSERT_TRUE(f.IterateUntil([&] { return !f.device.HeldCopies().empty(); }));
  ASSERT_LT(f.Appended(1), 48) << "page 0's tail slots reused before its host copy";
  EXPECT_EQ(kv->HistoryPageOf(1, kDp0), std::nullopt) << "the failed keep copy left GPU page " << kDp0 << " mapped";
  EXPECT_FALSE(kv->Find(1)->pages[0].Ready());
  EXPECT_FALSE(f.ReportedDeferred(1, 0));
  f.worker->memd_inbox().OnReclaimOrder(ScriptedFixture::ReclaimOrder(303, 1, {kDp0}, {10}));
  EXPECT_TRUE(f.BackupsOf(303).empty()) << "the order was answered (refused?) before the fallback copy ended: "
                                        << (f.BackupsOf(303).empty() ? "" : f.BackupsOf(303)[0].message);
  f.ReleaseHeld();
  ASSERT_TRUE(f.IterateUntil([&] { return !f.memd.readers_done.empty(); }));
  const std::vector<wire::BackupCompleteT> done = f.BackupsOf(303);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok) << done[0].message;
  EXPECT_EQ(done[0].pages, std::vector<uint32_t>{kDp0});
  EXPECT_TRUE(done[0].deferred_pages.empty());
  EXPECT_LT(f.memd.Index("backup/303"), f.memd.Index("readers_done/303"));
  wire::RetireT retire;
  retire.order = 303;
  retire.request = 1;
  retire.pages = {kDp0};
  f.worker->memd_inbox().OnRetire(retire);
  EXPECT_EQ(f.worker->stats().reclaims_obeyed, 1u);
  EXPECT_FALSE(f.ReportedDeferred(1, 0)) << "page 0's copy belongs to the order's BackupComplete";
  ExpectHostPageHolds(f, 10, 0, OriginalRows(*f.model, prompt));
  ASSERT_TRUE(f.IterateUntil([&] { return f.sink.finished.contains(1); }, 500));
  EXPECT_FALSE(f.sink.errors.contains(1)) << f.sink.errors[1];
  const Generated want = Oracle(*f.model, std::vector<model::Token>(prompt.begin(), prompt.end()), 4);
  EXPECT_EQ(f.sink.out[1].tokens, want.tokens);
  EXPECT_EQ(f.sink.out[1].digests, want.digests);
  EXPECT_EQ(f.worker->pending_orders(), 0u);
}

// A reclaim order that arrives while the victim is granted but has not started (nothing written, nothing kept: its
// plan keeps history page 0 on the reclaimed GPU page): the order is answered at once with the page deferred, the page
// is not kept when the request runs, and its host copy is reported (HostCopyWritten) once written.
TEST(WorkerOrders, ReclaimBeforeTheVictimStartedIsDeferredAndThePageGoesToHost) {
  ScriptedFixture f;
  constexpr PageIndex kDp = 6;
  f.SubmitAndGrant(3, 40, 2, {{0, kDp}}, 30);
  ASSERT_EQ(f.worker->book().active(), 0u);  // granted, not started: no Iterate yet
  CheckBackupsAreWritten(f, 3, {{kDp, 0}});
  Position appended_at_readers_done = -1;
  f.memd.on_readers_done = [&](const wire::ReadersDoneT&) { appended_at_readers_done = f.Appended(3); };
  f.worker->memd_inbox().OnReclaimOrder(ScriptedFixture::ReclaimOrder(302, 3, {kDp}, {30}));
  ASSERT_TRUE(f.IterateUntil([&] { return !f.memd.readers_done.empty(); }));
  EXPECT_EQ(appended_at_readers_done, 0) << "the order waited for the victim to write its rows";
  const std::vector<wire::BackupCompleteT> done = f.BackupsOf(302);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].ok);
  EXPECT_EQ(done[0].pages, std::vector<uint32_t>{kDp});
  EXPECT_EQ(done[0].deferred_pages, std::vector<uint32_t>{kDp});
  EXPECT_LT(f.memd.Index("backup/302"), f.memd.Index("readers_done/302"));
  wire::RetireT retire;
  retire.order = 302;
  retire.request = 3;
  retire.pages = {kDp};
  f.worker->memd_inbox().OnRetire(retire);
  bool kept = false;
  ASSERT_TRUE(f.IterateUntil([&] {
    kept = kept || f.worker->hierarchical()->HistoryPageOf(3, kDp).has_value();
    return f.ReportedDeferred(3, 0);
  }, 500));
  EXPECT_FALSE(kept) << "GPU page " << kDp << " was used after memd reclaimed it";
  const std::vector<uint8_t> prompt = Prompt(40, 3);
  ExpectHostPageHolds(f, 30, 0, OriginalRows(*f.model, prompt));
}

// A request whose last page completes on its last step ends with that page's host backup still in flight. memd
// frees the request's host pages at Complete and may grant them to another request at once, so Complete must follow
// the copy: a late write would land in a host page that already belongs to someone else. Forced interleaving, no
// sleeps: the copy is held; another thread releases it only once the worker thread, after the request's last step,
// is about to block on it (WaitWatchingDevice), or once Complete was sent (the defect), whichever comes first.
TEST(WorkerOrders, CompleteWaitsForTheRequestsHostBackupsInFlight) {
  ScriptedFixture f(/*watch_waits=*/true);
  f.SubmitAndGrant(1, 31, 2);  // rows ever appended: 31 + 2 - 1 = 32, so page 1 completes on the last step
  ASSERT_TRUE(f.IterateUntil([&] { return f.Appended(1) >= 1; }));
  f.HoldHostCopyOf(1, 1);
  std::mutex mu;
  std::condition_variable cv;
  bool blocked_on_held = false;    // the worker thread was about to wait while the copy was held
  bool finished_at_block = false;  // ... after the request's last token went out
  bool complete_sent = false, held_at_complete = false, complete_before_release = false, stop = false;
  f.watched->on_wait = [&] {  // the worker thread
    std::lock_guard<std::mutex> lock(mu);
    if (blocked_on_held || f.device.HeldCopies().empty()) return;
    blocked_on_held = true;
    finished_at_block = f.sink.finished.contains(1);
    cv.notify_all();
  };
  f.memd.on_complete = [&](const wire::CompleteT& m) {  // the worker thread
    if (m.request != 1) return;
    std::lock_guard<std::mutex> lock(mu);
    complete_sent = true;
    held_at_complete = !f.device.HeldCopies().empty();
    cv.notify_all();
  };
  std::thread releaser([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return blocked_on_held || complete_sent || stop; });
    complete_before_release = complete_sent;
    lock.unlock();
    f.device.ReleaseAllHeld();
  });
  const bool finished = f.IterateUntil([&] { return f.sink.finished.contains(1) && f.memd.Index("complete/1") >= 0; });
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    cv.notify_all();
  }
  releaser.join();
  ASSERT_TRUE(finished);
  EXPECT_TRUE(blocked_on_held) << "the worker never waited for the held host backup";
  EXPECT_TRUE(finished_at_block) << "it waited for the backup before the request's last step, not to end it";
  EXPECT_FALSE(complete_before_release) << "Complete sent while the request's host backup was still held";
  EXPECT_FALSE(held_at_complete);
  EXPECT_FALSE(f.sink.errors.contains(1));
}

// memd owns the request slot (AdmitGrant.slot). A grant with a slot outside N, or one another live request holds, fails
// that request with a clear error (and Complete, so memd frees what it granted); the worker keeps serving.
TEST(WorkerAdmission, BadSlotFromMemdFailsOnlyThatRequest) {
  ScriptedFixture f;  // N = 2
  f.SubmitAndGrant(1, 20, 2);  // slot 0
  auto submit = [&](RequestId id, SlotIndex slot) {
    wire::SubmitRequestT s;
    s.request = id;
    s.prompt = Prompt(20, static_cast<uint32_t>(id));
    s.max_new_tokens = 2;
    ASSERT_TRUE(f.worker->Submit(s, ClientRef{"c", id}).ok());
    wire::AdmitGrantT grant;
    grant.request = id;
    grant.slot = slot;
    for (uint32_t j = 0; j < 2; ++j) grant.backup_host_pages.emplace_back(0, 30 + 10 * id + j);
    f.worker->memd_inbox().OnAdmitGrant(grant);
  };
  submit(2, 2);  // outside N
  submit(3, 0);  // request 1's
  ASSERT_TRUE(f.sink.errors.contains(2));
  EXPECT_NE(f.sink.errors[2].find("slot 2"), std::string::npos) << f.sink.errors[2];
  ASSERT_TRUE(f.sink.errors.contains(3));
  EXPECT_NE(f.sink.errors[3].find("request 1 holds it"), std::string::npos) << f.sink.errors[3];
  EXPECT_NE(f.memd.Index("complete/2"), -1);
  EXPECT_NE(f.memd.Index("complete/3"), -1);
  ASSERT_TRUE(f.IterateUntil([&] { return f.sink.finished.contains(1); }));
  EXPECT_FALSE(f.sink.errors.contains(1));
  EXPECT_EQ(f.sink.out[1].tokens.size(), 2u);
}

// A reclaim order for a request this worker process never served (admitted through an earlier process that died) must
// not be answered "backed up": nothing was written here. A finished request's crossing order still is (contract §4).
TEST(WorkerOrders, ReclaimOfARequestUnknownToThisProcessIsRefusedNotReportedBackedUp) {
  ScriptedFixture f;
  f.worker->memd_inbox().OnReclaimOrder(ScriptedFixture::ReclaimOrder(900, 77, {4}, {20}));
  ASSERT_EQ(f.BackupsOf(900).size(), 1u);
  EXPECT_FALSE(f.BackupsOf(900)[0].ok);
  EXPECT_EQ(f.BackupsOf(900)[0].error, wire::ErrorCode::FAILED_PRECONDITION);
  EXPECT_NE(f.BackupsOf(900)[0].message.find("unknown to this worker process"), std::string::npos);
  EXPECT_EQ(f.memd.Index("readers_done/900"), -1);  // the reclaim ends with the failed backup

  // Request 3 is served and finished here; an order that crossed its Complete is answered ok (memd dropped it).
  f.SubmitAndGrant(3, 20, 2);
  ASSERT_TRUE(f.IterateUntil([&] { return f.sink.finished.contains(3); }));
  f.worker->memd_inbox().OnReclaimOrder(ScriptedFixture::ReclaimOrder(901, 3, {4}, {20}));
  ASSERT_TRUE(f.IterateUntil([&] { return f.memd.Index("readers_done/901") >= 0; }));
  ASSERT_EQ(f.BackupsOf(901).size(), 1u);
  EXPECT_TRUE(f.BackupsOf(901)[0].ok);
}

TEST(WorkerWire, FrontendServesSubmitStatsAndErrorsOverIpc) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  auto model = MakePresetModel("glm5-like");
  WorkerConfig config;
  config.mode = WorkerMode::kAdaptive;
  config.page_rows = 16;
  config.tail_rows = 32;
  auto g = ComputeGeometry(model->config(), config);
  ASSERT_TRUE(g.ok());
  config.hbm_budget_bytes = 32 * g->page_bytes;
  FakeMemd memd(32, g->host_page_bytes, 16, 64, 1, false, config.slots);
  auto frontend = ServingFrontend::Bind(dir.path(), 0);
  ASSERT_TRUE(frontend.ok()) << frontend.status();
  CpuDevice device;
  auto worker = Worker::Create(model.get(), &device, config, &memd, frontend->get());
  ASSERT_TRUE(worker.ok());
  (*frontend)->set_submitter(worker->get());
  auto client = DealerClient::Connect(IpcEndpoint(dir.path(), "worker-0"));
  ASSERT_TRUE(client.ok());

  auto roundtrip = [&](const std::string& bytes) -> Message {
    EXPECT_TRUE((*client)->Send(bytes).ok());
    static std::string last;
    for (int i = 0; i < 500; ++i) {
      EXPECT_TRUE((*frontend)->Serve(std::chrono::milliseconds(2)).ok());
      auto r = (*client)->Receive(std::chrono::milliseconds(2));
      if (r.ok()) {
        last = *r;
        auto m = DecodeEnvelope(last);
        EXPECT_TRUE(m.ok());
        return *m;
      }
    }
    ADD_FAILURE() << "no reply";
    return Message{};
  };
  // Garbage -> INVALID_MESSAGE; a bad submit -> its validation error; the worker goes on.
  Message bad = roundtrip("not a flatbuffer");
  ASSERT_EQ(bad.type, wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(bad)->code, wire::ErrorCode::INVALID_MESSAGE);
  Message invalid = roundtrip(EncodeSubmitRequest(Submit(1, {}, 3), 41, "replay"));
  ASSERT_EQ(invalid.type, wire::Body::ErrorReply);
  EXPECT_EQ(invalid.sequence, 41u);
  EXPECT_NE(ReadErrorReply(invalid)->message.find("empty prompt"), std::string::npos);
  Message accepted = roundtrip(EncodeSubmitRequest(Submit(2, Prompt(40, 2), 4), 42, "replay"));
  ASSERT_EQ(accepted.type, wire::Body::SubmitAccepted);
  EXPECT_EQ(ReadSubmitAccepted(accepted)->request, 2u);

  Generated got;
  bool finished = false;
  // Bounded by time, not iterations: the last chunk crosses ZeroMQ's I/O thread, which may lag far behind the loop
  // (under a sanitizer, or on a loaded machine) once the worker has nothing left to compute.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!finished && std::chrono::steady_clock::now() < deadline) {
    memd.Pump(**worker);
    ASSERT_TRUE((*worker)->Iterate().ok());
    for (bool first = true;; first = false) {
      auto r = (*client)->Receive(std::chrono::milliseconds(first ? 1 : 0));
      if (!r.ok()) break;
      auto m = DecodeEnvelope(*r);
      ASSERT_TRUE(m.ok());
      ASSERT_EQ(m->type, wire::Body::TokenChunk);
      EXPECT_EQ(m->sequence, 42u);
      auto chunk = ReadTokenChunk(*m);
      for (uint8_t t : chunk->tokens) got.tokens.push_back(t);
      for (uint64_t d : chunk->logits_digests) got.digests.push_back(d);
      finished = chunk->finished;
    }
  }
  ASSERT_TRUE(finished);
  const auto prompt = Prompt(40, 2);
  const Generated want = Oracle(*model, std::vector<model::Token>(prompt.begin(), prompt.end()), 4);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.digests, want.digests);

  Message stats = roundtrip(EncodeWorkerStatsQuery(wire::WorkerStatsQueryT(), 43, "replay"));
  ASSERT_EQ(stats.type, wire::Body::WorkerStatsReply);
  auto s = ReadWorkerStatsReply(stats);
  EXPECT_EQ(s->mode, "adaptive");
  EXPECT_EQ(s->tokens_generated, 4u);
  EXPECT_EQ(s->finished_requests, 1u);
  EXPECT_EQ(s->capacity_pages, 32u);
  EXPECT_GT(s->census_direct, 0u);
  Message unknown = roundtrip(EncodeHeartbeat(wire::HeartbeatT(), 44, "replay"));
  ASSERT_EQ(unknown.type, wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(unknown)->code, wire::ErrorCode::UNKNOWN_MESSAGE);
  // Issue 23: every member of the wire message list a client never sends a worker (all but SubmitRequest, Attach,
  // Cancel and WorkerStatsQuery, docs/protocol.md) is refused UNKNOWN_MESSAGE naming it, answering its sequence.
  const std::set<wire::Body> served = {wire::Body::SubmitRequest, wire::Body::Attach, wire::Body::Cancel,
                                       wire::Body::WorkerStatsQuery};
  uint64_t seq = 100;
  size_t refused = 0;
#define DHS_SEND_UNSERVED(Name)                                                                        \
  if (!served.contains(wire::Body::Name)) {                                                            \
    Message m = roundtrip(Encode##Name(wire::Name##T{}, seq, "replay"));                              \
    ASSERT_EQ(m.type, wire::Body::ErrorReply) << #Name;                                                \
    EXPECT_EQ(ReadErrorReply(m)->code, wire::ErrorCode::UNKNOWN_MESSAGE) << #Name;                     \
    EXPECT_EQ(ReadErrorReply(m)->message, "workerd does not serve " #Name);                            \
    EXPECT_EQ(ReadErrorReply(m)->answering_sequence, seq++);                                           \
    ++refused;                                                                                         \
  }
  DHS_WIRE_MESSAGES(DHS_SEND_UNSERVED)
#undef DHS_SEND_UNSERVED
  EXPECT_EQ(refused, std::size(kWireMessages) - served.size());
}

}  // namespace
}  // namespace dhs::test
