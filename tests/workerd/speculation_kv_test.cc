// tests/workerd/speculation_kv_test.cc: the KV side of a verified speculative round (brief §6 "Commit"; issue 13):
// rows appended by a round are held unverified, rejected rows are dropped and never reach the host, the pages the
// kept rows complete are backed up after verification only; and the model's round (K_r queries in one Step, then
// EndVerification) gives the logits plain greedy decoding gives, bit for bit. Staging arenas (StagingKv): a round's
// union beyond the hot cache is served from staging rows, each distinct missing row copied once (counted by the
// device's copy hook), every read the original row, arenas freed by the readers and every page freed at the end.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <set>

#include "tests/workerd/kv_test_util.h"
#include "tests/workerd/worker_test_util.h"
#include "workerd/prefix_cache.h"
#include "workerd/speculation/acceptance.h"

namespace dhs {
namespace {

using test::Harness;
using test::OriginalRow;

constexpr uint64_t kRejected = 7;  // salt of the rows a round rejects; kept rows have salt 0

KvConfig SmallConfig() {
  KvConfig c;
  c.row_bytes = {16, 24, 8};
  c.groups = {{0, 1}, {2}};
  c.page_rows = 4;
  c.hot_rows = 6;
  c.k = 4;
  c.tail_rows = 8;
  c.slots = 3;
  c.optional_pages = 6;
  return c;
}

// One round of request 1: hold from anchor + 1, append the anchor (kept) and the proposals (salt per position),
// then keep `length` rows.
absl::Status Round(Harness& h, Position anchor, Position end, Position rejected_from, Position length) {
  if (absl::Status s = h.kv->HoldUnverified(1, anchor + 1); !s.ok()) return s;
  for (Position t = anchor; t < end; ++t) {
    if (absl::Status s = h.AppendAll(1, t, t >= rejected_from ? kRejected : 0); !s.ok()) return s;
  }
  return h.kv->CommitVerified(1, length);
}

TEST(SpeculativeKv, HeldPagesAreBackedUpAfterVerificationWithKeptRowsOnly) {
  Harness h(SmallConfig(), 16);
  std::atomic<int> d2h{0};
  h.device.SetCopyHook([&](const CopyInfo& c) {
    if (c.kind == CopyKind::kDeviceToHost) ++d2h;
    return CopyFate::kRun;
  });
  for (Position t = 0; t < 6; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  EXPECT_EQ(d2h.load(), 1);  // page 0
  // Round A: anchor 6, proposals 7..9 all rejected: page 1 (4..7) was completed by a rejected row: no backup.
  ASSERT_TRUE(Round(h, 6, 10, 7, 7).ok());
  EXPECT_EQ(d2h.load(), 1);
  EXPECT_EQ(h.kv->Find(1)->appended, (std::vector<Position>{7, 7, 7}));
  // Round B: anchor 7 (its row completes page 1 below the hold: backed up at Append), 8..10 accepted.
  ASSERT_TRUE(Round(h, 7, 11, 11, 11).ok());
  EXPECT_EQ(d2h.load(), 2);
  // Round C: anchor 11 completes page 2; 12, 13 rejected.
  ASSERT_TRUE(Round(h, 11, 14, 12, 12).ok());
  EXPECT_EQ(d2h.load(), 3);
  // Round D: anchor 12, 13..15 accepted (page 3 held: 15 >= 13), 16 rejected: page 3 backed up by CommitVerified.
  ASSERT_TRUE(h.kv->HoldUnverified(1, 13).ok());
  for (Position t = 12; t < 17; ++t) ASSERT_TRUE(h.AppendAll(1, t, t >= 16 ? kRejected : 0).ok());
  EXPECT_EQ(d2h.load(), 3) << "a page holding unverified rows was backed up before verification";
  ASSERT_TRUE(h.kv->CommitVerified(1, 16).ok());
  EXPECT_EQ(d2h.load(), 4);
  h.device.WaitIdle();
  KvCompletions done = h.kv->Poll();
  ASSERT_EQ(done.backups.size(), 4u);
  // Every host page holds the kept rows (salt 0), never a rejected one: independent of the code under test.
  const RequestKv& kv = *h.kv->Find(1);
  for (uint32_t page = 0; page < 4; ++page) {
    ASSERT_TRUE(kv.pages[page].HostReady()) << page;
    const uint8_t* base = h.host.data() + kv.pages[page].host_page * h.layout.host_page_bytes();
    for (SourceId s = 0; s < 3; ++s) {
      for (uint32_t r = 0; r < 4; ++r) {
        const Position t = page * 4 + r;
        auto want = OriginalRow(1, s, t, h.layout.row_bytes(s));
        EXPECT_EQ(0, std::memcmp(base + h.layout.InPage(s, r), want.data(), want.size()))
            << "page " << page << " t " << t;
      }
    }
  }
  // The rejected row 16 is gone: selecting it is an error.
  std::vector<Position> sel = {16, -1, -1, -1};
  std::vector<const uint8_t*> out(4);
  KvQuery q{1, sel, out};
  std::vector<SourceId> src = {2};
  EXPECT_EQ(h.kv->Fetch(src, {&q, 1}).code(), absl::StatusCode::kInvalidArgument);
}

// A backup of the newest committed page still in flight (held by the copy hook) while a round discards its rejected
// rows: the kept rows stay, the held backup completes with the original bytes, the page the next round completes is
// backed up with kept rows only, and each host page goes back exactly once when the request is released.
TEST(SpeculativeKv, RoundCommitsWhileABackupIsInFlightAndFreesNothingTwice) {
  Harness h(SmallConfig(), 16);
  std::atomic<int> d2h{0};
  h.device.SetCopyHook([&](const CopyInfo& c) {
    if (c.kind != CopyKind::kDeviceToHost) return CopyFate::kRun;
    return ++d2h == 1 ? CopyFate::kHold : CopyFate::kRun;  // page 0's backup waits
  });
  for (Position t = 0; t < 4; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  ASSERT_EQ(h.device.HeldCopies().size(), 1u);
  // Round: anchor 4, proposals 5..7; one accepted (rows 4, 5 kept), 6 and 7 dropped while page 0's copy is in flight.
  ASSERT_TRUE(Round(h, 4, 8, 6, 6).ok());
  EXPECT_EQ(d2h.load(), 1);
  EXPECT_FALSE(h.kv->Find(1)->pages[0].HostReady());
  h.device.ReleaseAllHeld();
  h.device.WaitIdle();
  KvCompletions done = h.kv->Poll();
  ASSERT_EQ(done.backups.size(), 1u);
  EXPECT_EQ(done.backups[0].page, 0u);
  // Next round: anchor 6, 7 accepted (page 1 held until the commit), 8 (its tail slot is page 0's, backed up) dropped.
  ASSERT_TRUE(Round(h, 6, 9, 8, 8).ok());
  EXPECT_EQ(d2h.load(), 2);
  h.device.WaitIdle();
  done = h.kv->Poll();
  ASSERT_EQ(done.backups.size(), 1u);
  EXPECT_EQ(done.backups[0].page, 1u);
  const RequestKv& kv = *h.kv->Find(1);
  for (uint32_t page = 0; page < 2; ++page) {
    const uint8_t* base = h.host.data() + kv.pages[page].host_page * h.layout.host_page_bytes();
    for (SourceId s = 0; s < 3; ++s) {
      for (uint32_t r = 0; r < 4; ++r) {
        auto want = OriginalRow(1, s, page * 4 + r, h.layout.row_bytes(s));
        EXPECT_EQ(0, std::memcmp(base + h.layout.InPage(s, r), want.data(), want.size())) << page << " " << r;
      }
    }
  }
  const std::set<PageIndex> used = {static_cast<PageIndex>(kv.pages[0].host_page),
                                    static_cast<PageIndex>(kv.pages[1].host_page)};
  h.kv->Release(1);
  h.kv->Poll();
  EXPECT_EQ(h.freed.size(), 2u);
  EXPECT_EQ(std::set<PageIndex>(h.freed.begin(), h.freed.end()), used);
}

// Rows a round drops took the tail slots of the rows T before them: after the commit those older rows are no longer
// in the tail (though appended - T would say so) and are read from their host copies (found by the worker test on
// glm5-like: a backup from the tail copied a dropped row's slot).
TEST(SpeculativeKv, RowsEvictedByDroppedRowsAreReadFromHost) {
  Harness h(SmallConfig(), 16);
  for (Position t = 0; t < 8; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  ASSERT_TRUE(Round(h, 8, 12, 9, 9).ok());  // rows 9..11 dropped; their slots held rows 1..3
  h.device.WaitIdle();
  h.kv->Poll();
  const Census before = h.kv->census(1);
  std::vector<Position> sel = {1, 2, 3, 8};
  std::vector<const uint8_t*> out(4);
  KvQuery q{1, sel, out};
  std::vector<SourceId> src = {2};
  ASSERT_TRUE(h.kv->Fetch(src, {&q, 1}).ok());
  for (size_t e = 0; e < sel.size(); ++e) {
    auto want = OriginalRow(1, 2, sel[e], h.layout.row_bytes(2));
    EXPECT_EQ(0, std::memcmp(out[e], want.data(), want.size())) << "row " << sel[e];
  }
  h.kv->ReadersDone(src);
  EXPECT_EQ(h.kv->census(1).host - before.host, 3u);    // rows 1..3 from their host copies
  EXPECT_EQ(h.kv->census(1).direct - before.direct, 1u);  // row 8 (the anchor) in the tail
}

TEST(SpeculativeKv, RefusesRoundsOutOfOrder) {
  Harness h(SmallConfig(), 16);
  for (Position t = 0; t < 3; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  EXPECT_EQ(h.kv->CommitVerified(1, 3).code(), absl::StatusCode::kFailedPrecondition);  // no hold
  EXPECT_EQ(h.kv->HoldUnverified(1, 2).code(), absl::StatusCode::kInvalidArgument);    // below appended
  EXPECT_EQ(h.kv->HoldUnverified(9, 3).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(h.kv->HoldUnverified(1, 4).ok());
  for (Position t = 3; t < 6; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  EXPECT_EQ(h.kv->CommitVerified(1, 3).code(), absl::StatusCode::kInvalidArgument);  // below the hold
  EXPECT_EQ(h.kv->CommitVerified(1, 7).code(), absl::StatusCode::kInvalidArgument);  // beyond appended
  EXPECT_TRUE(h.kv->CommitVerified(1, 5).ok());
}

// The model's round against the oracle (plain greedy decoding, one token per step): K_r = 4 queries with proposals
// t1, t2 (the greedy tokens) and a wrong third; rows 0..2 of the round's logits are the plain steps' logits; greedy
// acceptance keeps 2 and corrects with t3; after EndVerification, plain decoding continues bit-identically.
void RoundMatchesPlainDecoding(KvAccess& kv, size_t prefill_chunk) {
  auto m = test::MakePresetModel("dsv4flash-like");
  const std::vector<model::Token> input = [] {
    std::vector<uint8_t> p = test::Prompt(70, 3);
    return std::vector<model::Token>(p.begin(), p.end());
  }();
  const test::Generated want = test::Oracle(*m, input, 8);
  model::ModelSession s = m->NewSession(1);
  model::StepOutput out;
  for (size_t at = 0; at < input.size(); at += prefill_chunk) {  // the hierarchy serves B / (k + w) queries a step
    model::StepInput prefill{&s, std::span<const model::Token>(input).subspan(at, std::min(prefill_chunk,
                                                                                            input.size() - at))};
    ASSERT_TRUE(m->Step(std::span<model::StepInput>(&prefill, 1), kv, std::span<model::StepOutput>(&out, 1)).ok());
  }
  const Position n = s.position();
  const model::Token wrong = static_cast<model::Token>((want.tokens[3] + 1) % model::kVocab);
  std::vector<model::Token> round = {want.tokens[0], want.tokens[1], want.tokens[2], wrong};
  ASSERT_TRUE(m->BeginVerification(s, kv).ok());
  model::StepInput in{&s, round};
  ASSERT_TRUE(m->Step(std::span<model::StepInput>(&in, 1), kv, std::span<model::StepOutput>(&out, 1)).ok());
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(LogitsDigest(std::span<const float>(out.logits).subspan(j * model::kVocab, model::kVocab)),
              want.digests[j + 1]) << "query " << j;
  }
  std::vector<spec::Proposal> proposals = {{round[1], {}}, {round[2], {}}, {round[3], {}}};
  auto outcome = spec::AcceptRound(spec::AcceptMode::kGreedy, out.logits, {}, proposals, {0, 1, n});
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->accepted, 2);
  EXPECT_EQ(outcome->emitted, (std::vector<model::Token>{want.tokens[1], want.tokens[2], want.tokens[3]}));
  EXPECT_EQ(m->EndVerification(s, n, kv).code(), absl::StatusCode::kInvalidArgument) << "drops the anchor's row";
  ASSERT_TRUE(m->EndVerification(s, n + 3, kv).ok());
  EXPECT_EQ(s.position(), n + 3);
  EXPECT_EQ(s.index_keys(0).size(), static_cast<size_t>(n + 3) * m->config().idx_dim);
  EXPECT_EQ(m->EndVerification(s, n + 3, kv).code(), absl::StatusCode::kFailedPrecondition);  // no round open
  std::vector<model::Token> next = {want.tokens[3]};
  for (size_t i = 4; i < want.tokens.size(); ++i) {
    model::StepInput plain{&s, next};
    ASSERT_TRUE(m->Step(std::span<model::StepInput>(&plain, 1), kv, std::span<model::StepOutput>(&out, 1)).ok());
    EXPECT_EQ(LogitsDigest(out.logits), want.digests[i]) << "token " << i;
    next = {want.tokens[i]};
  }
}

TEST(SpeculativeModel, RoundThenRollbackMatchesPlainDecodingResident) {
  auto kv = model::ResidentKvAccess::ForModel(*model::PresetConfig("dsv4flash-like"), size_t{64} << 20, 16);
  RoundMatchesPlainDecoding(*kv, 1000);
}

TEST(SpeculativeModel, RoundThenRollbackMatchesPlainDecodingHierarchical) {
  auto mc = *model::PresetConfig("dsv4flash-like");
  WorkerConfig c;
  c.mode = WorkerMode::kHisparse;
  c.page_rows = 16;
  c.tail_rows = 32;
  c.hot_rows = static_cast<uint32_t>(4 * (mc.top_k + mc.local_window));  // a round of 4 queries fits
  auto g = ComputeGeometry(mc, c);
  ASSERT_TRUE(g.ok()) << g.status();
  CpuDevice device;
  std::vector<uint8_t> host(64 * g->host_page_bytes);
  PageIndex next = 0;
  auto allocate = [&]() -> std::optional<PageIndex> { return next < 64 ? std::optional(next++) : std::nullopt; };
  HostPoolAccess access{host, allocate, [](PageIndex) {}};
  auto kv = HierarchicalKvAccess::Create(g->kv, &device, access, ResolverKind::kFused);
  ASSERT_TRUE(kv.ok()) << kv.status();
  RoundMatchesPlainDecoding(**kv, g->prefill_chunk);
}

}  // namespace
}  // namespace dhs

namespace dhs {
namespace {

// Union retrieval (brief §6 "Union retrieval"): the K_r queries of one request in one Fetch; a host-only row selected
// by three queries and another by two are copied once each (two host copies), and every query reads the same bytes.
TEST(SpeculativeKv, UnionOfTheRoundsQueriesCopiesEachMissingRowOnce) {
  Harness h(SmallConfig(), 16);
  for (Position t = 0; t < 17; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());  // tail: 9..16; 0..7 only on host
  h.device.WaitIdle();
  h.kv->Poll();
  std::vector<std::vector<Position>> sel = {{0, 1, 14, -1}, {0, 1, 13, 15}, {0, 16, 12, -1}};
  std::set<Position> missing;  // the independent count: selected rows neither in the tail nor on GPU
  for (const auto& q : sel) {
    for (Position t : q) {
      if (t >= 0 && t < 17 - 8) missing.insert(t);
    }
  }
  ASSERT_EQ(missing.size(), 2u);
  std::vector<std::vector<const uint8_t*>> out(3, std::vector<const uint8_t*>(4));
  std::vector<KvQuery> batch;
  for (size_t j = 0; j < 3; ++j) batch.push_back(KvQuery{1, sel[j], out[j]});
  std::vector<SourceId> src = {2};
  const Census before = h.kv->census(1);
  ASSERT_TRUE(h.kv->Fetch(src, batch).ok());
  const Census after = h.kv->census(1);
  EXPECT_EQ(after.host - before.host, missing.size());
  EXPECT_EQ(after.bytes_recovered - before.bytes_recovered, missing.size() * h.layout.row_bytes(2));
  EXPECT_EQ(after.hot - before.hot, 3u);  // the other selections of rows 0 and 1 read the copied rows
  EXPECT_EQ(out[0][0], out[1][0]);
  EXPECT_EQ(out[0][0], out[2][0]);
  EXPECT_EQ(out[0][1], out[1][1]);
  for (size_t j = 0; j < 3; ++j) {
    for (size_t e = 0; e < 4; ++e) {
      if (sel[j][e] < 0) continue;
      auto want = OriginalRow(1, 2, sel[j][e], h.layout.row_bytes(2));
      EXPECT_EQ(0, std::memcmp(out[j][e], want.data(), want.size())) << "query " << j << " row " << sel[j][e];
    }
  }
  h.kv->ReadersDone(src);
}

}  // namespace
}  // namespace dhs

#include "workerd/speculation/synthetic_proposer.h"

namespace dhs {
namespace {

// The synthetic proposer (benchmarks only): a long history is fed at most catch_up tokens per Propose (no
// proposals until it caught up), then the proposals are the model's own greedy continuation (the oracle's tokens)
// at corruption 0 and never it at corruption 1; a Propose before the slot's Commit is refused.
TEST(SyntheticProposer, CatchesUpInBoundedStepsThenProposesTheGreedyContinuation) {
  auto m = test::MakePresetModel("dsv4flash-like");
  std::vector<uint8_t> p = test::Prompt(30, 9);
  const std::vector<model::Token> prompt(p.begin(), p.end());
  const test::Generated want = test::Oracle(*m, prompt, 6);
  for (double corruption : {0.0, 1.0}) {
    auto proposer = spec::SyntheticProposer::Create(m.get(), 2, corruption, size_t{8} << 20, /*catch_up_tokens=*/8);
    ASSERT_TRUE(proposer.ok()) << proposer.status();
    std::vector<model::Token> tokens = prompt;
    tokens.push_back(want.tokens[0]);  // the anchor at position 30
    spec::DraftRequest r{1, spec::RoundKey{3, 42, 30}, tokens, {}, 4};
    spec::DraftResult out;
    int calls = 0;
    do {
      ASSERT_TRUE((*proposer)->Propose({&r, 1}, {&out, 1}).ok());
      ++calls;
      if (out.tokens.empty()) {
        EXPECT_EQ((*proposer)->Propose({&r, 1}, {&out, 1}).code(), absl::StatusCode::kFailedPrecondition);
        ASSERT_TRUE((*proposer)->Commit(1, 0).ok());
      }
    } while (out.tokens.empty() && calls < 10);
    EXPECT_EQ(calls, 4);  // 8 + 8 + 8 + 6 history tokens
    ASSERT_EQ(out.tokens.size(), 4u);
    for (size_t j = 0; j < 4; ++j) {
      if (corruption == 0.0) EXPECT_EQ(out.tokens[j], want.tokens[j + 1]) << j;
      if (corruption == 1.0) EXPECT_NE(out.tokens[j], want.tokens[j + 1]) << j;
      EXPECT_EQ(out.q[j][static_cast<size_t>(out.tokens[j])], 1.0);
    }
    EXPECT_EQ((*proposer)->Commit(1, 5).code(), absl::StatusCode::kInvalidArgument);  // more than proposed
    ASSERT_TRUE((*proposer)->Commit(1, 4).ok());
  }
}

// Issue 27: a slot whose request can import its prepared prefix (DraftRequest::import_history) starts from the copied
// rows: over a 24-token prefix of a 30-token prompt it catches up 6 tokens, so its first call already proposes the
// greedy continuation, where the same request without the import needs 4 calls (the test above). The rows copied are
// captured from a resident run of the prefix (RowCapture, the row cache's own capture), the keys from its session.
TEST(SyntheticProposer, StartsFromTheImportedPreparedPrefix) {
  auto m = test::MakePresetModel("dsv4flash-like");
  const model::ModelConfig& mc = m->config();
  std::vector<uint8_t> p = test::Prompt(30, 9);
  const std::vector<model::Token> prompt(p.begin(), p.end());
  const test::Generated want = test::Oracle(*m, prompt, 8);
  constexpr uint32_t kPrefix = 24;
  PrefixBlock block;
  block.tokens = kPrefix;
  block.rows.resize(static_cast<size_t>(mc.n_sources()));
  {
    auto kv = model::ResidentKvAccess::ForModel(mc, size_t{8} << 20, 16);
    model::ModelSession s = m->NewSession(7);
    RowCapture capture(kv.get(), 7, &block);
    ASSERT_TRUE(m->ImportPrefix(s, std::span<const model::Token>(prompt.data(), kPrefix), capture).ok());
    for (int i = 0; i < mc.n_indexers(); ++i) {
      std::span<const float> keys = s.index_keys(i).first(static_cast<size_t>(kPrefix) * mc.idx_dim);
      block.keys.emplace_back(keys.begin(), keys.end());
    }
  }
  std::vector<model::Token> tokens = prompt;
  tokens.push_back(want.tokens[0]);  // the anchor at position 30
  auto proposer = spec::SyntheticProposer::Create(m.get(), 2, 0.0, size_t{8} << 20, /*catch_up_tokens=*/8);
  ASSERT_TRUE(proposer.ok()) << proposer.status();
  int imports = 0;
  spec::DraftRequest r{1, spec::RoundKey{3, 42, 30}, tokens, {}, 4};
  r.import_history = [&](model::ModelSession& s, KvAccess& kv) -> absl::StatusOr<Position> {
    ++imports;
    if (absl::Status st = m->ImportRows(s, kPrefix, block.rows, block.keys, kv); !st.ok()) return st;
    return Position{kPrefix};
  };
  spec::DraftResult out;
  ASSERT_TRUE((*proposer)->Propose({&r, 1}, {&out, 1}).ok());
  ASSERT_EQ(out.tokens.size(), 4u);  // the first call proposes
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(out.tokens[j], want.tokens[j + 1]) << j;
  EXPECT_EQ((*proposer)->imported_positions(), kPrefix);
  EXPECT_EQ((*proposer)->reference_positions(), 6u + 4u);  // the suffix caught up, then the anchor and 3 proposals
  ASSERT_TRUE((*proposer)->Commit(1, 2).ok());
  // The next round continues the same slot: nothing imported again.
  tokens.insert(tokens.end(), want.tokens.begin() + 1, want.tokens.begin() + 4);  // 2 accepted + the next anchor
  r.tokens = tokens;
  r.key.frontier = 33;
  ASSERT_TRUE((*proposer)->Propose({&r, 1}, {&out, 1}).ok());
  ASSERT_EQ(out.tokens.size(), 4u);
  for (size_t j = 0; j < 4; ++j) EXPECT_EQ(out.tokens[j], want.tokens[j + 4]) << j;
  EXPECT_EQ(imports, 1);
  ASSERT_TRUE((*proposer)->Commit(1, 0).ok());

  // An import that fails, or claims the whole history (the anchor included), never fails the batch: the slot is
  // reset and catches up by itself (8 of its 33 history tokens in this call: no proposals yet), counted.
  for (int failure = 0; failure < 2; ++failure) {
    (*proposer)->Release(1);
    if (failure == 0) {
      r.import_history = [&](model::ModelSession&, KvAccess&) -> absl::StatusOr<Position> {
        return static_cast<Position>(r.tokens.size());
      };
    } else {
      r.import_history = [](model::ModelSession&, KvAccess&) -> absl::StatusOr<Position> {
        return absl::ResourceExhaustedError("arena full");
      };
    }
    ASSERT_TRUE((*proposer)->Propose({&r, 1}, {&out, 1}).ok());
    EXPECT_TRUE(out.tokens.empty());
    EXPECT_EQ((*proposer)->import_failures(), static_cast<uint64_t>(failure + 1));
    ASSERT_TRUE((*proposer)->Commit(1, 0).ok());
  }
  EXPECT_EQ((*proposer)->imported_positions(), kPrefix);  // only the first, good copy
}

}  // namespace
}  // namespace dhs

namespace dhs {
namespace {

// Staging arenas (brief §6 "Staging"): SmallConfig with χ = 2 arenas (group 0 has two sources, one arena each) of
// K_max * k = 3 * 4 rows per slot, B = 4 hot rows.
KvConfig StagingConfig() {
  KvConfig c = SmallConfig();
  c.hot_rows = 4;
  c.staging_arenas = 2;
  c.staging_k_max = 3;
  return c;
}

// Host->device rows the KV access copies, counted by the device's copy hook (independent of the KV access): by the
// destination pool (the KV pool's hot slots, or the staging pool) and row size.
struct HostCopies {
  std::atomic<uint64_t> kv_bytes{0}, staging_bytes{0};
  void Watch(Harness& h) {
    const PoolId kv_pool = h.kv->pool();
    h.device.SetCopyHook([this, kv_pool](const CopyInfo& c) {
      if (c.kind != CopyKind::kHostToDevice) return CopyFate::kRun;
      for (const DeviceRange& r : c.device) (r.pool == kv_pool ? kv_bytes : staging_bytes) += r.bytes;
      return CopyFate::kRun;
    });
  }
};

// Request 1 with rows 0..16 appended and backed up (tail: 9..16; 0..7 only on host), rows 0, 1, 2 in its hot cache of
// group 1 (a plain Fetch), then a round held from 17 on with the anchor 16 appended.
void PrepareRound(Harness& h) {
  for (Position t = 0; t < 17; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  h.device.WaitIdle();
  h.kv->Poll();
  for (std::vector<SourceId> src : {std::vector<SourceId>{2}, std::vector<SourceId>{0, 1}}) {
    std::vector<Position> warm = {0, 1, 2, -1};
    std::vector<const uint8_t*> out(4 * src.size());
    KvQuery q{1, warm, out};
    ASSERT_TRUE(h.kv->Fetch(src, {&q, 1}).ok());
    h.kv->ReadersDone(src);
  }
  ASSERT_TRUE(h.kv->HoldUnverified(1, 17).ok());
}

// A union larger than the hot cache: 3 queries at n_r = 16 .. 18 (the anchor and two proposals, rows 17, 18 appended
// held) select hot rows 0, 1, 2 (hits: one unprotected slot left), row 3 (three queries) and row 5 (two queries):
// row 3 takes the hot slot, row 5 goes to a staging row: exactly two host copies per source, every query that
// selected a row reads the same copy, every read gives the original bytes, and the arena is free after ReadersDone.
TEST(StagingKv, ARowSelectedByThreeQueriesAndAnotherByTwoCauseExactlyTwoHostCopies) {
  for (ResolverKind kind : {ResolverKind::kFused, ResolverKind::kReference}) {
    Harness h(StagingConfig(), 16, kind);
    PrepareRound(h);
    if (HasFatalFailure()) return;
    for (Position t = 17; t < 19; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
    EXPECT_EQ(h.kv->staging_bytes(), 2 * 3 * 3 * 4 * 24);  // χ * N * K_max * k * d_KV (the largest row)
    const std::vector<std::vector<Position>> sel = {{3, 0, 1, 16}, {2, 3, 5, -1}, {5, 18, 3, 17}};
    for (std::vector<SourceId> src : {std::vector<SourceId>{2}, std::vector<SourceId>{0, 1}}) {
      SCOPED_TRACE(src.size() == 1 ? "group 1" : "group 0");
      const size_t S = src.size();
      std::vector<std::vector<const uint8_t*>> out(3, std::vector<const uint8_t*>(4 * S));
      std::vector<KvQuery> batch;
      for (size_t j = 0; j < 3; ++j) batch.push_back(KvQuery{1, sel[j], out[j], 16 + static_cast<Position>(j)});
      HostCopies copies;
      copies.Watch(h);
      const StagingCensus before = h.kv->staging_census();
      ASSERT_TRUE(h.kv->Fetch(src, batch).ok());
      h.device.SetCopyHook(nullptr);
      uint64_t one_row = 0;  // one row of every source of the group
      for (SourceId s : src) one_row += h.layout.row_bytes(s);
      EXPECT_EQ(copies.kv_bytes.load(), one_row) << "row 3 into the hot cache, once";
      EXPECT_EQ(copies.staging_bytes.load(), one_row) << "row 5 into a staging row, once";
      EXPECT_EQ(h.kv->staging_census().rows - before.rows, 1u);
      EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 2u - S);
      for (size_t si = 0; si < S; ++si) {
        const size_t k = 4;
        EXPECT_EQ(out[0][si * k + 0], out[1][si * k + 1]);  // row 3
        EXPECT_EQ(out[0][si * k + 0], out[2][si * k + 2]);
        EXPECT_EQ(out[1][si * k + 2], out[2][si * k + 0]);  // row 5
        for (size_t j = 0; j < 3; ++j) {
          for (size_t e = 0; e < k; ++e) {
            const Position t = sel[j][e];
            if (t < 0) {
              EXPECT_EQ(out[j][si * k + e], nullptr);
              continue;
            }
            auto want = OriginalRow(1, src[si], t, h.layout.row_bytes(src[si]));
            EXPECT_EQ(0, std::memcmp(out[j][si * k + e], want.data(), want.size()))
                << "query " << j << " row " << t << " source " << src[si];
          }
        }
      }
      h.kv->ReadersDone(src);
      EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 2u);
    }
    ASSERT_TRUE(h.kv->CommitVerified(1, 18).ok());
  }
}

// χ arenas are shared by the layer groups whose readers are still reading: a second group needing an arena while
// the first holds both is refused (RESOURCE_EXHAUSTED, nothing resolved, no arena kept) until the first group's
// readers finished. A bad query (a position beyond the appended rows, a query not allowed to see a row) is refused.
TEST(StagingKv, ArenasAreReusedOnlyAfterTheirReadersFinished) {
  Harness h(StagingConfig(), 16);
  PrepareRound(h);
  if (HasFatalFailure()) return;
  for (Position t = 17; t < 19; ++t) ASSERT_TRUE(h.AppendAll(1, t).ok());
  const std::vector<std::vector<Position>> sel = {{3, 0, 1, 16}, {2, 4, 5, -1}, {6, 18, 7, 17}};
  auto fetch = [&](std::vector<SourceId> src, std::vector<std::vector<const uint8_t*>>& out) {
    out.assign(3, std::vector<const uint8_t*>(4 * src.size()));
    std::vector<KvQuery> batch;
    for (size_t j = 0; j < 3; ++j) batch.push_back(KvQuery{1, sel[j], out[j], 16 + static_cast<Position>(j)});
    return h.kv->Fetch(src, batch);
  };
  std::vector<std::vector<const uint8_t*>> out0, out1;
  ASSERT_TRUE(fetch({0, 1}, out0).ok());
  EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 0u);
  const absl::Status busy = fetch({2}, out1);
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted) << busy;
  EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 0u);
  h.kv->ReadersDone(std::vector<SourceId>{0, 1});
  EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 2u);
  ASSERT_TRUE(fetch({2}, out1).ok());
  for (size_t j = 0; j < 3; ++j) {
    for (size_t e = 0; e < 4; ++e) {
      if (sel[j][e] < 0) continue;
      auto want = OriginalRow(1, 2, sel[j][e], h.layout.row_bytes(2));
      EXPECT_EQ(0, std::memcmp(out1[j][e], want.data(), want.size())) << "query " << j << " row " << sel[j][e];
    }
  }
  h.kv->ReadersDone(std::vector<SourceId>{2});
  EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 2u);
  // Query 0 (at 16) may not see 17; no query may select 19 (not appended).
  std::vector<Position> ahead = {17, -1, -1, -1}, beyond = {19, -1, -1, -1};
  for (const std::vector<Position>* bad : {&ahead, &beyond}) {
    std::vector<const uint8_t*> o(4);
    KvQuery q{1, *bad, o, 16};
    EXPECT_EQ(h.kv->Fetch(std::vector<SourceId>{2}, {&q, 1}).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 2u);
}

TEST(StagingKv, TooFewArenasForAGroupAreRefusedAtCreate) {
  KvConfig c = StagingConfig();
  c.staging_arenas = 1;  // group 0 has two sources
  CpuDevice device;
  std::vector<uint8_t> host(16 * KvLayout::Create(c)->host_page_bytes());
  auto kv = HierarchicalKvAccess::Create(c, &device, HostPoolAccess{host, {}, {}}, ResolverKind::kFused);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(kv.status().message().find("χ >= 2"), std::string_view::npos) << kv.status();
  c.staging_arenas = 2;
  c.staging_k_max = 0;
  kv = HierarchicalKvAccess::Create(c, &device, HostPoolAccess{host, {}, {}}, ResolverKind::kFused);
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dhs

namespace dhs {
namespace {

// Many requests (three slots, each request released at 40 positions and replaced by a new one) run random rounds:
// K_r = 1 .. 3 queries, each a top-k selection of random visible positions and a local window, some requests
// stepping plainly in the same batch, random acceptance. Every row read through the fused resolver or the reference
// one, hot or staged, is the original row; χ = 3 arenas are all free after every step's readers finished; at the end
// every request is released, every host page is back and every arena free.
TEST(StagingKv, ManyRequestsWithRandomAcceptanceLeaveEveryArenaAndPageFree) {
  // The fused resolver on the asynchronous device first (issue 28: reads end steps after ReadersDone, so an arena
  // reused before its readers ended is a read hazard, and a wait that can never end fails at once naming what it
  // waits for, where the synchronous device would hang), then the fused and reference resolvers on the synchronous
  // device.
  for (int pass = 0; pass < 3; ++pass) {
    const ResolverKind kind = pass == 2 ? ResolverKind::kReference : ResolverKind::kFused;
    AsyncDeviceConfig async;
    async.enabled = pass == 0;
    async.seed = 29;
    async.stuck_after = absl::Seconds(5);
    KvConfig c = SmallConfig();
    c.hot_rows = 4;
    c.staging_arenas = 3;
    c.staging_k_max = 3;
    const uint32_t host_pages = 128;
    Harness h(c, host_pages, kind, async);
    const uint64_t seed = 1313 + static_cast<uint64_t>(kind);
    std::mt19937_64 rng(seed);
    std::printf("seed %llu%s\n", static_cast<unsigned long long>(seed), async.enabled ? " (asynchronous device)" : "");
    std::vector<RequestId> live = {1, 2, 3};
    RequestId next_id = 4;
    std::vector<Position> length(1024, 0);  // by request id
    int requests_done = 0;
    uint64_t reads_checked = 0;
    const std::vector<std::vector<SourceId>> groups = {{0, 1}, {2}};
    for (int step = 0; step < 400; ++step) {
      struct Item {
        RequestId r;
        bool round;
        int64_t k_r;
        std::vector<std::vector<Position>> sel;  // per query: top-k, then window
      };
      std::vector<Item> items;
      for (RequestId r : live) {
        Item it{r, length[r] > 0 && std::bernoulli_distribution(0.7)(rng), 1, {}};
        const Position n = length[r];
        if (it.round) {
          it.k_r = std::uniform_int_distribution<int64_t>(1, 3)(rng);
          ASSERT_TRUE(h.kv->HoldUnverified(r, n + 1).ok());
        }
        for (int64_t j = 0; j < it.k_r; ++j) ASSERT_TRUE(h.AppendAll(r, n + j).ok());
        for (int64_t j = 0; j < it.k_r; ++j) {
          const Position at = n + j;
          std::vector<Position> visible(static_cast<size_t>(at + 1));
          for (Position t = 0; t <= at; ++t) visible[static_cast<size_t>(t)] = t;
          std::shuffle(visible.begin(), visible.end(), rng);
          std::vector<Position> top(visible.begin(), visible.begin() + std::min<size_t>(4, visible.size()));
          top.resize(4, kNoPosition);
          it.sel.push_back(top);
          it.sel.push_back({at > 0 ? at - 1 : kNoPosition, at});
        }
        items.push_back(std::move(it));
      }
      for (const std::vector<SourceId>& src : groups) {
        std::vector<std::vector<const uint8_t*>> out;
        std::vector<KvQuery> batch;
        std::vector<std::pair<RequestId, const std::vector<Position>*>> who;
        for (const Item& it : items) {
          for (size_t q = 0; q < it.sel.size(); ++q) who.emplace_back(it.r, &it.sel[q]);
        }
        out.reserve(who.size());
        for (size_t q = 0; q < who.size(); ++q) out.emplace_back(who[q].second->size() * src.size());
        size_t q = 0;
        for (const Item& it : items) {
          for (size_t s = 0; s < it.sel.size(); ++s, ++q) {
            batch.push_back(KvQuery{it.r, it.sel[s], out[q], length[it.r] + static_cast<Position>(s / 2)});
          }
        }
        const absl::Status fetched = h.kv->Fetch(src, batch);
        ASSERT_TRUE(fetched.ok()) << fetched << " step " << step;
        for (size_t b = 0; b < batch.size(); ++b) {
          const std::vector<Position>& sel = *who[b].second;
          for (size_t si = 0; si < src.size(); ++si) {
            for (size_t e = 0; e < sel.size(); ++e) {
              const uint8_t* row = out[b][si * sel.size() + e];
              if (sel[e] < 0) {
                ASSERT_EQ(row, nullptr);
                continue;
              }
              auto want = OriginalRow(who[b].first, src[si], sel[e], h.layout.row_bytes(src[si]));
              ASSERT_EQ(0, std::memcmp(row, want.data(), want.size()))
                  << "step " << step << " request " << who[b].first << " row " << sel[e] << " source " << src[si];
              ++reads_checked;
            }
          }
        }
      }
      for (const std::vector<SourceId>& src : groups) h.kv->ReadersDone(src);
      ASSERT_EQ(h.kv->staging_pool()->free_arenas(), 3u) << "step " << step;
      ASSERT_TRUE(h.device.ReadHazards().ok()) << h.device.ReadHazards() << " step " << step;
      for (Item& it : items) {
        if (it.round) {
          const int64_t accepted = std::uniform_int_distribution<int64_t>(0, it.k_r - 1)(rng);
          ASSERT_TRUE(h.kv->CommitVerified(it.r, length[it.r] + accepted + 1).ok());
          length[it.r] += accepted + 1;
        } else {
          length[it.r] += 1;
        }
      }
      h.device.WaitIdle();
      h.kv->Poll();
      for (RequestId& r : live) {
        if (length[r] < 40) continue;
        h.kv->Release(r);
        ++requests_done;
        r = next_id++;  // a fresh request in the released slot
      }
    }
    for (RequestId r : live) h.kv->Release(r);
    h.device.WaitIdle();
    h.kv->Poll();
    EXPECT_EQ(h.free_pages.size(), host_pages) << "a host page was not given back";
    EXPECT_EQ(h.kv->staging_pool()->free_arenas(), 3u);
    const StagingCensus& sc = h.kv->staging_census();
    std::printf("%s%s: %d requests completed, %llu reads checked, %llu unions, %llu rows staged in %llu fetches\n",
                kind == ResolverKind::kFused ? "fused" : "reference", async.enabled ? " (async)" : "", requests_done,
                static_cast<unsigned long long>(reads_checked), static_cast<unsigned long long>(sc.unions),
                static_cast<unsigned long long>(sc.rows), static_cast<unsigned long long>(sc.staged_fetches));
    EXPECT_GT(requests_done, 10);
    EXPECT_GT(sc.rows, 0u) << "no row went through a staging arena";
  }
}

}  // namespace
}  // namespace dhs
