// tests/speculation/block_width_test.cc: the block width schedule and the confidence prefix (workerd/speculation/block_width.h,
// brief §6): the issue's example table parsed and looked up at its boundaries, every refusal with its message, the
// canonical text form, and the confidence rule on hand-made confidence lists.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "workerd/speculation/block_width.h"

namespace dhs::spec {
namespace {

TEST(BlockWidthSchedule, IssueExampleTable) {
  // "8 up to 32 sessions, 6 at 64, 4 from 128".
  absl::StatusOr<BlockWidthSchedule> s = BlockWidthSchedule::Parse("1:8, 33:6 ,128:4", 8);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->WidthFor(0), 8);
  EXPECT_EQ(s->WidthFor(1), 8);
  EXPECT_EQ(s->WidthFor(32), 8);
  EXPECT_EQ(s->WidthFor(33), 6);
  EXPECT_EQ(s->WidthFor(64), 6);
  EXPECT_EQ(s->WidthFor(127), 6);
  EXPECT_EQ(s->WidthFor(128), 4);
  EXPECT_EQ(s->WidthFor(100000), 4);
  EXPECT_EQ(s->ToString(), "1:8,33:6,128:4");
  absl::StatusOr<BlockWidthSchedule> one = BlockWidthSchedule::Parse("1:1", 8);  // no speculation at any load
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->WidthFor(500), 1);
}

TEST(BlockWidthSchedule, BadTextIsRefusedNamingTheEntry) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{{"", "empty"},
                                         {"  ", "empty"},
                                         {"1:8,", "entry \"\""},
                                         {"1-8", "not from_sessions:width"},
                                         {"1:8:2", "not from_sessions:width"},
                                         {"1:x", "not from_sessions:width"},
                                         {"1:-2", "not from_sessions:width"},
                                         {"1:+2", "not from_sessions:width"},
                                         {"2:8", "first entry must start at 1"},
                                         {"1:8,64:6,33:4", "sessions must increase (previous entry starts at 64)"},
                                         {"1:8,1:6", "sessions must increase"},
                                         {"1:9", "width 9 outside [1, K_max=8]"},
                                         {"1:8,33:0", "width 0 outside"},
                                         {"1:99999999999999999999", "not from_sessions:width"}}) {
    absl::StatusOr<BlockWidthSchedule> s = BlockWidthSchedule::Parse(c.text, 8);
    ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(s.status().message().find(c.says), std::string::npos) << c.text << ": " << s.status();
  }
  EXPECT_EQ(BlockWidthSchedule::Parse("1:1", 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ConfidencePrefix, StopsAtTheFirstLowConfidence) {
  const std::vector<double> c = {0.9, 0.8, 0.4, 0.95, 0.99};
  EXPECT_EQ(*ConfidencePrefix(c, 0.5, 7), 2);   // 0.4 < 0.5: the later 0.95 does not count
  EXPECT_EQ(*ConfidencePrefix(c, 0.8, 7), 2);   // 0.8 >= 0.8 is kept
  EXPECT_EQ(*ConfidencePrefix(c, 0.85, 7), 1);
  EXPECT_EQ(*ConfidencePrefix(c, 0.95, 7), 0);
  EXPECT_EQ(*ConfidencePrefix(c, 0.0, 7), 5);   // threshold 0: the fixed block
  EXPECT_EQ(*ConfidencePrefix(c, 0.0, 3), 3);   // capped by the block width - 1
  EXPECT_EQ(*ConfidencePrefix({}, 0.5, 7), 0);
  EXPECT_EQ(ConfidencePrefix(c, 1.5, 7).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConfidencePrefix(c, 0.5, -1).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<double> bad = {0.9, 1.2};
  EXPECT_EQ(ConfidencePrefix(bad, 0.5, 7).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ExpectedAcceptanceLength, ByHand) {
  EXPECT_DOUBLE_EQ(*ExpectedAcceptanceLength(0.5, 4), 1.875);  // 1 + .5 + .25 + .125
  EXPECT_DOUBLE_EQ(*ExpectedAcceptanceLength(0.8, 8), (1.0 - std::pow(0.8, 8)) / 0.2);
  EXPECT_DOUBLE_EQ(*ExpectedAcceptanceLength(1.0, 6), 6.0);
  EXPECT_DOUBLE_EQ(*ExpectedAcceptanceLength(0.0, 6), 1.0);
  EXPECT_DOUBLE_EQ(*ExpectedAcceptanceLength(0.9, 1), 1.0);  // K = 1: no proposals
  EXPECT_EQ(ExpectedAcceptanceLength(1.1, 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpectedAcceptanceLength(0.5, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dhs::spec
