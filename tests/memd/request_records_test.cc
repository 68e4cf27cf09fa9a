// tests/memd/request_records_test.cc: memd's request records (memd/request_records.h): open, commit (in order,
// resent overlaps, gaps and conflicts refused), release, and the size limits, each refused event changing nothing.
#include "memd/request_records.h"

#include <vector>

#include "gtest/gtest.h"

namespace dhs::memd {
namespace {

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
  ASSERT_TRUE(s.Commit(1, 0, {3, 4}, {30, 40}).ok());
  ASSERT_TRUE(s.Commit(1, 2, {5}, {50}).ok());
  ASSERT_TRUE(s.Commit(1, 1, {4, 5, 6}, {40, 50, 60}).ok());  // resent overlap {4, 5} + one new
  EXPECT_EQ(s.Find(1)->tokens, (std::vector<uint8_t>{3, 4, 5, 6}));
  EXPECT_EQ(s.Find(1)->digests, (std::vector<uint64_t>{30, 40, 50, 60}));
  EXPECT_EQ(s.total_bytes(0), 10u + 9u * 4);
  EXPECT_EQ(s.Commit(1, 6, {1}, {1}).code(), absl::StatusCode::kInvalidArgument);        // gap
  EXPECT_EQ(s.Commit(1, 3, {7}, {60}).code(), absl::StatusCode::kInvalidArgument);       // conflicting token
  EXPECT_EQ(s.Commit(1, 3, {6}, {61}).code(), absl::StatusCode::kInvalidArgument);       // conflicting digest
  EXPECT_EQ(s.Commit(1, 4, {1}, {}).code(), absl::StatusCode::kInvalidArgument);         // digests' length
  EXPECT_EQ(s.Commit(1, 4, {1, 2, 3}, {1, 2, 3}).code(), absl::StatusCode::kInvalidArgument);  // over max_new 6
  EXPECT_EQ(s.Commit(2, 0, {1}, {1}).code(), absl::StatusCode::kNotFound);
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
  ASSERT_TRUE(s.Commit(1, 0, {1, 2}, {1, 2}).ok());
  EXPECT_EQ(s.Commit(1, 2, {3}, {3}).code(), absl::StatusCode::kResourceExhausted);
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
  ASSERT_TRUE(s.Commit(5, 2, {3}, {30}).ok());
  EXPECT_EQ(s.Find(5)->tokens, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(s.total_bytes(0), 98u + 1u + 9u * 3);
}

}  // namespace
}  // namespace dhs::memd
