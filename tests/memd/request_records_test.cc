// tests/memd/request_records_test.cc: memd's request records (memd/request_records.h): open, commit (in order,
// resent overlaps, gaps and conflicts refused), release, and the size limits, each refused event changing nothing;
// the finished records (lost ends).
#include "memd/request_records.h"

#include <vector>

#include "gtest/gtest.h"

namespace dhs::memd {
namespace {

constexpr TokenKind kBytes = TokenKind::kBytes;

RequestRecord Rec(GpuId gpu, size_t prompt, uint32_t max_new) {
  RequestRecord r;
  r.client_request = 77;
  r.gpu = gpu;
  r.prompt.assign(prompt, 5);
  r.max_new_tokens = max_new;
  r.temperature = 0.7f;
  r.seed = 9;
  return r;
}

TEST(RequestRecords, CommitsInOrderAcceptResentOverlapsAndRefuseGapsAndConflicts) {
  RequestRecordStore s;
  ASSERT_TRUE(s.Open(1, Rec(0, 10, 6)).ok());
  EXPECT_EQ(s.Open(1, Rec(0, 10, 6)).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(s.Commit(1, 0, kBytes, {3, 4}, {30, 40}).ok());
  ASSERT_TRUE(s.Commit(1, 2, kBytes, {5}, {50}).ok());
  ASSERT_TRUE(s.Commit(1, 1, kBytes, {4, 5, 6}, {40, 50, 60}).ok());  // resent overlap {4, 5} + one new
  EXPECT_EQ(s.Find(1)->tokens, (std::vector<uint32_t>{3, 4, 5, 6}));
  EXPECT_EQ(s.Find(1)->digests, (std::vector<uint64_t>{30, 40, 50, 60}));
  EXPECT_EQ(s.total_bytes(0), 10u + 9u * 4);
  EXPECT_EQ(s.Commit(1, 6, kBytes, {1}, {1}).code(), absl::StatusCode::kInvalidArgument);        // gap
  EXPECT_EQ(s.Commit(1, 3, kBytes, {7}, {60}).code(), absl::StatusCode::kInvalidArgument);       // conflicting token
  EXPECT_EQ(s.Commit(1, 3, kBytes, {6}, {61}).code(), absl::StatusCode::kInvalidArgument);       // conflicting digest
  EXPECT_EQ(s.Commit(1, 4, kBytes, {1}, {}).code(), absl::StatusCode::kInvalidArgument);         // digests' length
  EXPECT_EQ(s.Commit(1, 4, kBytes, {1, 2, 3}, {1, 2, 3}).code(), absl::StatusCode::kInvalidArgument);  // over max_new 6
  EXPECT_EQ(s.Commit(2, 0, kBytes, {1}, {1}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.Find(1)->tokens.size(), 4u);  // refused commits changed nothing
  EXPECT_EQ(s.total_bytes(0), 10u + 9u * 4);
  EXPECT_TRUE(s.Release(1));
  EXPECT_FALSE(s.Release(1));
  EXPECT_EQ(s.Find(1), nullptr);
  EXPECT_EQ(s.total_bytes(0), 0u);
}

TEST(RequestRecords, SizeLimitsRefuseOversizeRecordsPerRecordAndPerGpu) {
  RequestRecordStore s(RecordLimits{/*max_record_bytes=*/100, /*max_total_bytes=*/150});
  const absl::Status big = s.Open(1, Rec(0, 101, 4));
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(big.message().find("per-record limit of 100 bytes"), std::string::npos) << big;
  ASSERT_TRUE(s.Open(1, Rec(0, 80, 4)).ok());
  const absl::Status full = s.Open(2, Rec(0, 80, 4));  // 160 > 150 on GPU 0
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("GPU 0"), std::string::npos) << full;
  ASSERT_TRUE(s.Open(3, Rec(1, 80, 4)).ok());  // another GPU has its own budget
  // 80 + 9 * 3 = 107 > 100: the commit that would grow the record past its limit is refused, nothing changes.
  ASSERT_TRUE(s.Commit(1, 0, kBytes, {1, 2}, {1, 2}).ok());
  EXPECT_EQ(s.Commit(1, 2, kBytes, {3}, {3}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.Find(1)->tokens.size(), 2u);
  EXPECT_EQ(s.total_bytes(0), 98u);
  EXPECT_EQ(s.Open(4, Rec(0, 0, 0)).code(), absl::StatusCode::kInvalidArgument);  // max_new 0
  RequestRecord resumed = Rec(0, 1, 4);  // a resumed request opens with its committed tokens
  resumed.tokens = {1, 2};
  resumed.digests = {10};
  EXPECT_EQ(s.Open(5, resumed).code(), absl::StatusCode::kInvalidArgument);  // digests' length
  resumed.tokens = {1, 2, 3, 4, 5};
  resumed.digests = {1, 2, 3, 4, 5};
  EXPECT_EQ(s.Open(5, resumed).code(), absl::StatusCode::kInvalidArgument);  // over max_new 4
  EXPECT_EQ(s.size(), 2u);
  resumed.tokens = {1, 2};
  resumed.digests = {10, 20};
  ASSERT_TRUE(s.Open(5, resumed).ok());
  ASSERT_TRUE(s.Commit(5, 2, kBytes, {3}, {30}).ok());
  EXPECT_EQ(s.Find(5)->tokens, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(s.total_bytes(0), 98u + 1u + 9u * 3);
}

// Issue 24: the tenant is input the record keeps (for a resume to name the same chain): it counts in the record's
// bytes and against its limits, and a finished record drops it with the prompt.
TEST(RequestRecords, TheTenantCountsInTheRecordsBytesAndAFinishedRecordDropsIt) {
  RequestRecordStore s(RecordLimits{/*max_record_bytes=*/100, /*max_total_bytes=*/150});
  RequestRecord r = Rec(0, 60, 2);
  r.tenant = std::string(41, 'a');  // 60 + 41 = 101 > 100
  EXPECT_EQ(s.Open(1, r).code(), absl::StatusCode::kResourceExhausted);
  r.tenant = std::string(20, 'a');
  ASSERT_TRUE(s.Open(1, r).ok());
  EXPECT_EQ(s.total_bytes(0), 60u + 20u);
  ASSERT_TRUE(s.Commit(1, 0, kBytes, {7, 8}, {70, 80}).ok());
  EXPECT_EQ(s.total_bytes(0), 60u + 20u + 9u * 2);
  ASSERT_TRUE(s.KeepFinished(1).ok());
  EXPECT_EQ(s.total_bytes(0), 0u);
  const std::vector<std::pair<RequestId, RequestRecord>> kept = s.FinishedRecords(0);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_TRUE(kept[0].second.tenant.empty());
  EXPECT_EQ(kept[0].second.bytes(), 9u * 2);
}

// Lost ends (workerd/README.md "Restart: a finished request's end"): a finished record leaves the live ones without
// its input, is handed out (oldest first) as often as asked, and the oldest beyond the count / byte bounds go.
TEST(RequestRecords, FinishedRecordsKeepTheOutputWithoutTheInputBoundedPerGpu) {
  RecordLimits limits;
  limits.max_finished_records = 2;
  limits.max_finished_bytes = 9 * 5;  // five tokens' worth
  RequestRecordStore s(limits);
  RequestRecord with_prefix = Rec(0, 10, 2);
  with_prefix.hash_ids = {7, 8};
  ASSERT_TRUE(s.Open(1, with_prefix).ok());
  ASSERT_TRUE(s.Commit(1, 0, kBytes, {3}, {30}).ok());
  const absl::StatusOr<size_t> early = s.KeepFinished(1);  // 1 of 2 tokens: not finished, nothing changes
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_NE(s.Find(1), nullptr);
  EXPECT_EQ(s.KeepFinished(9).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(s.Commit(1, 0, kBytes, {3, 4}, {30, 40}).ok());
  ASSERT_EQ(s.KeepFinished(1), absl::StatusOr<size_t>(0));
  EXPECT_EQ(s.Find(1), nullptr);        // no longer a live record (a Release finds none)
  EXPECT_FALSE(s.Release(1));
  EXPECT_EQ(s.total_bytes(0), 0u);      // nor counted against the live records' budget
  EXPECT_EQ(s.finished(0), 1u);
  EXPECT_EQ(s.finished(1), 0u);
  std::vector<std::pair<RequestId, RequestRecord>> f = s.FinishedRecords(0);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].first, 1u);
  EXPECT_TRUE(f[0].second.prompt.empty());
  EXPECT_TRUE(f[0].second.hash_ids.empty());
  EXPECT_EQ(f[0].second.tokens, (std::vector<uint32_t>{3, 4}));
  EXPECT_EQ(f[0].second.digests, (std::vector<uint64_t>{30, 40}));
  EXPECT_EQ(f[0].second.client_request, 77u);
  EXPECT_EQ(f[0].second.max_new_tokens, 2u);
  EXPECT_EQ(s.FinishedRecords(0).size(), 1u);  // still there for a later epoch (a second death)
  // A third finished record of GPU 0 drops the oldest (count bound 2); GPU 1's are apart.
  for (RequestId id : {2, 3}) {
    ASSERT_TRUE(s.Open(id, Rec(0, 10, 1)).ok());
    ASSERT_TRUE(s.Commit(id, 0, kBytes, {static_cast<uint8_t>(id)}, {id}).ok());
  }
  ASSERT_TRUE(s.Open(4, Rec(1, 10, 1)).ok());
  ASSERT_TRUE(s.Commit(4, 0, kBytes, {4}, {4}).ok());
  EXPECT_EQ(s.KeepFinished(2), absl::StatusOr<size_t>(0));
  EXPECT_EQ(s.KeepFinished(3), absl::StatusOr<size_t>(1));  // request 1 goes
  EXPECT_EQ(s.KeepFinished(4), absl::StatusOr<size_t>(0));
  f = s.FinishedRecords(0);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].first, 2u);
  EXPECT_EQ(f[1].first, 3u);
  EXPECT_EQ(s.finished(1), 1u);
  // Request 5 (3 tokens, 27 bytes) drops request 2 by the count; request 7 (2 tokens) then request 3 by the bytes
  // (9 + 27 + 18 = 54 > 45; the count, 3 > 2, too).
  ASSERT_TRUE(s.Open(5, Rec(0, 10, 3)).ok());
  ASSERT_TRUE(s.Commit(5, 0, kBytes, {1, 2, 3}, {1, 2, 3}).ok());
  EXPECT_EQ(s.KeepFinished(5), absl::StatusOr<size_t>(1));
  ASSERT_TRUE(s.Open(7, Rec(0, 10, 2)).ok());
  ASSERT_TRUE(s.Commit(7, 0, kBytes, {1, 2}, {1, 2}).ok());
  EXPECT_EQ(s.KeepFinished(7), absl::StatusOr<size_t>(1));
  f = s.FinishedRecords(0);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].first, 5u);
  EXPECT_EQ(f[1].first, 7u);
  // A record over the byte bound alone (6 tokens, 54 bytes > 45) is dropped at once; the older ones stay.
  ASSERT_TRUE(s.Open(6, Rec(0, 10, 6)).ok());
  ASSERT_TRUE(s.Commit(6, 0, kBytes, {1, 2, 3, 4, 5, 6}, {1, 2, 3, 4, 5, 6}).ok());
  EXPECT_EQ(s.KeepFinished(6), absl::StatusOr<size_t>(1));
  EXPECT_EQ(s.Find(6), nullptr);
  EXPECT_EQ(s.finished(0), 2u);
  EXPECT_EQ(s.finished(1), 1u);
}

// Issue 25: an engine's record (libdhs) holds token ids of its own vocabulary (EngineIds: any 32-bit value, an int32's
// bits), with its prompt ids; a record keeps its kind: a commit of the other kind, a byte token above 255 or a mixed
// prompt is refused and changes nothing. Its bytes count 4 + 8 per token (RequestRecord::bytes).
TEST(RequestRecords, EngineIdRecordsKeepTheirKind) {
  RequestRecordStore s;
  RequestRecord engine;
  engine.max_new_tokens = 4;
  engine.token_kind = TokenKind::kEngineIds;
  engine.prompt_ids = {50000, 7, 128000};
  ASSERT_TRUE(s.Open(1, engine).ok());
  EXPECT_EQ(s.total_bytes(0), 12u);
  ASSERT_TRUE(s.Commit(1, 0, TokenKind::kEngineIds, {70000, 300}, {1, 2}).ok());
  ASSERT_TRUE(s.Commit(1, 1, TokenKind::kEngineIds, {300, 0xfffffffb}, {2, 3}).ok());  // resent overlap + one (-5)
  EXPECT_EQ(s.Find(1)->tokens, (std::vector<uint32_t>{70000, 300, 0xfffffffb}));
  EXPECT_EQ(s.total_bytes(0), 12u + 12u * 3);
  EXPECT_EQ(s.Commit(1, 3, kBytes, {1}, {1}).code(), absl::StatusCode::kInvalidArgument);  // the other kind
  EXPECT_EQ(s.Commit(1, 2, TokenKind::kEngineIds, {7}, {3}).code(), absl::StatusCode::kInvalidArgument);  // differs
  EXPECT_EQ(s.Find(1)->tokens.size(), 3u);
  EXPECT_EQ(s.total_bytes(0), 12u + 12u * 3);

  ASSERT_TRUE(s.Open(2, Rec(0, 4, 4)).ok());  // a Bytes record (workerd's)
  EXPECT_EQ(s.Commit(2, 0, kBytes, {256}, {1}).code(), absl::StatusCode::kInvalidArgument);  // not a byte
  EXPECT_EQ(s.Commit(2, 0, TokenKind::kEngineIds, {5}, {1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(s.Find(2)->tokens.empty());
  RequestRecord mixed = Rec(0, 4, 4);
  mixed.prompt_ids = {1};
  EXPECT_EQ(s.Open(3, mixed).code(), absl::StatusCode::kInvalidArgument);
  mixed.token_kind = TokenKind::kEngineIds;  // ids, but a byte prompt too
  EXPECT_EQ(s.Open(3, mixed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.Find(3), nullptr);
}

}  // namespace
}  // namespace dhs::memd
