// tests/speculation/draft_ring_test.cc: the draft KV ring (workerd/speculation/draft_ring.h, brief §6, §8): R_d and phi(i, t) with
// values computed by hand, the refusal of a ring too small for W + K_max (the formula's numbers in the message), the
// commit / rollback API, and a randomized run (random W, K_max, p, slots, block lengths and accepted prefixes) over a
// shadow memory of the ring: after every call, every position of every live window reads a row that holds exactly
// that (slot, position): no aliasing, nothing of the window overwritten by a later block.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "workerd/speculation/draft_ring.h"

namespace dhs::spec {
namespace {

TEST(DraftRingGeometry, RowsPerSlotByHand) {
  // glm5-like drafter (brief §8): W=2048, K_max=8, p=64: 2048 + 8 + 63 = 2119 -> ceil(2119 / 64) = 34 pages.
  EXPECT_EQ(DraftRingRows(2048, 8, 64), 2176);
  // 10 + 4 + 3 = 17 -> 5 pages of 4; 8 + 8 + 15 = 31 -> 2 pages of 16; p = 1: W + K_max.
  EXPECT_EQ(DraftRingRows(10, 4, 4), 20);
  EXPECT_EQ(DraftRingRows(8, 8, 16), 32);
  EXPECT_EQ(DraftRingRows(5, 3, 1), 8);
  // W + K_max a multiple of p still needs one more page: 60 + 4 + 63 = 127 -> 2 pages.
  EXPECT_EQ(DraftRingRows(60, 4, 64), 128);
}

TEST(DraftRingGeometry, RowOfPositionAndBytes) {
  absl::StatusOr<DraftRingGeometry> g =
      DraftRingGeometry::Create({.window = 10, .k_max = 4, .page_rows = 4, .slots = 3, .draft_bytes_per_row = 100});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->rows_per_slot(), 20);
  EXPECT_EQ(g->Row(0, 0), 0);
  EXPECT_EQ(g->Row(0, 19), 19);
  EXPECT_EQ(g->Row(0, 20), 0);
  EXPECT_EQ(g->Row(1, 19), 39);
  EXPECT_EQ(g->Row(2, 45), 45);  // 2 * 20 + 45 mod 20
  EXPECT_EQ(g->total_rows(), 60);
  EXPECT_EQ(g->bytes(), 6000);
  absl::StatusOr<DraftRingGeometry> glm = DraftRingGeometry::Create(
      {.window = 2048, .k_max = 8, .page_rows = 64, .slots = 1, .draft_bytes_per_row = 12288});
  ASSERT_TRUE(glm.ok());
  EXPECT_EQ(glm->bytes(), 26738688);  // 2176 rows * 12,288 bytes (brief §8)
}

TEST(DraftRingGeometry, RingTooSmallIsRefusedWithTheFormula) {
  // 33 pages of 64 = 2112 rows < R_d = 2176; the largest K_max it allows: 2048 + K + 63 <= 2112 -> K <= 1.
  absl::StatusOr<DraftRingGeometry> g =
      DraftRingGeometry::Create({.window = 2048, .k_max = 8, .page_rows = 64, .slots = 4, .ring_rows = 2112});
  ASSERT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(g.status().message());
  EXPECT_NE(msg.find("2112 rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("64 * ceil((2048 + 8 + 64 - 1) / 64) = 2176"), std::string::npos) << msg;
  EXPECT_NE(msg.find("K_max <= 1"), std::string::npos) << msg;
  // 20 rows, W = 10, p = 4: K = 7 fits (10 + 7 + 3 = 20), K = 8 does not (21 -> 6 pages).
  EXPECT_TRUE(DraftRingGeometry::Create({.window = 10, .k_max = 7, .page_rows = 4, .slots = 1, .ring_rows = 20}).ok());
  g = DraftRingGeometry::Create({.window = 10, .k_max = 8, .page_rows = 4, .slots = 1, .ring_rows = 20});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("K_max <= 7"), std::string::npos) << g.status();
  EXPECT_NE(g.status().message().find("= 24 rows"), std::string::npos) << g.status();
  // A larger ring is used as given; a ring that is not whole pages is refused.
  g = DraftRingGeometry::Create({.window = 10, .k_max = 4, .page_rows = 4, .slots = 1, .ring_rows = 28});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->rows_per_slot(), 28);
  g = DraftRingGeometry::Create({.window = 10, .k_max = 4, .page_rows = 4, .slots = 1, .ring_rows = 22});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("not whole pages"), std::string::npos) << g.status();
}

TEST(DraftRingGeometry, BadSizesAreRefused) {
  for (DraftRingConfig c : {DraftRingConfig{.window = 0, .k_max = 4, .page_rows = 4, .slots = 1},
                            DraftRingConfig{.window = 4, .k_max = 0, .page_rows = 4, .slots = 1},
                            DraftRingConfig{.window = 4, .k_max = 4, .page_rows = 0, .slots = 1},
                            DraftRingConfig{.window = 4, .k_max = 4, .page_rows = 4, .slots = 0},
                            DraftRingConfig{.window = int64_t{1} << 50, .k_max = 4, .page_rows = 4, .slots = 1},
                            DraftRingConfig{.window = int64_t{1} << 39, .k_max = 4, .page_rows = 4, .slots = 1u << 31,
                                            .draft_bytes_per_row = 1}}) {
    EXPECT_EQ(DraftRingGeometry::Create(c).status().code(), absl::StatusCode::kInvalidArgument) << c.window;
  }
}

DraftRing SmallRing() {  // W = 6, K_max = 3, p = 2: 6 + 3 + 1 = 10 -> 5 pages -> R_d = 10
  absl::StatusOr<DraftRingGeometry> g =
      DraftRingGeometry::Create({.window = 6, .k_max = 3, .page_rows = 2, .slots = 2});
  EXPECT_TRUE(g.ok());
  return DraftRing(*g);
}

TEST(DraftRing, CommitKeepsTheAcceptedPrefixOnly) {
  DraftRing ring = SmallRing();
  ASSERT_TRUE(ring.Open(1, 7).ok());
  EXPECT_EQ(*ring.Write(1), 17);  // slot 1, t = 7: 10 + 7
  EXPECT_EQ(*ring.Write(1), 18);  // t = 8
  EXPECT_EQ(*ring.Write(1), 19);  // t = 9
  EXPECT_EQ(ring.Write(1).status().code(), absl::StatusCode::kInvalidArgument);  // a 4th exceeds K_max = 3
  EXPECT_EQ(ring.Commit(1, 4).code(), absl::StatusCode::kInvalidArgument);       // only 3 pending
  EXPECT_EQ(ring.pending(1), 3);
  ASSERT_TRUE(ring.Commit(1, 2).ok());  // t = 7, 8 kept; t = 9 dropped
  EXPECT_EQ(ring.frontier(1), 9);
  EXPECT_EQ(ring.pending(1), 0);
  EXPECT_EQ(ring.ReadRow(1, 9).status().code(), absl::StatusCode::kInvalidArgument);  // dropped, not readable
  EXPECT_EQ(*ring.ReadRow(1, 8), 18);
  EXPECT_EQ(*ring.Write(1), 19);  // t = 9 again, same row
  EXPECT_EQ(*ring.Write(1), 10);  // t = 10 wraps: 10 + 0
  ASSERT_TRUE(ring.Rollback(1).ok());
  EXPECT_EQ(ring.frontier(1), 9);
  // Window of W = 6: after the frontier reaches 16, positions < 10 are out.
  for (int round = 0; round < 7; ++round) {
    ASSERT_TRUE(ring.Write(1).ok());
    ASSERT_TRUE(ring.Commit(1, 1).ok());
  }
  EXPECT_EQ(ring.frontier(1), 16);
  EXPECT_EQ(ring.window_begin(1), 10);
  EXPECT_EQ(ring.ReadRow(1, 9).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ring.ReadRow(1, 10), 10);
  EXPECT_EQ(*ring.ReadRow(1, 15), 15);
}

TEST(DraftRing, MisuseIsRefusedAndChangesNothing) {
  DraftRing ring = SmallRing();
  EXPECT_EQ(ring.Write(0).status().code(), absl::StatusCode::kInvalidArgument);  // not open
  EXPECT_EQ(ring.Commit(0, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ring.Open(2, 0).code(), absl::StatusCode::kInvalidArgument);  // N = 2
  EXPECT_EQ(ring.Open(0, -1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ring.Open(0, 0).ok());
  EXPECT_EQ(ring.Open(0, 5).code(), absl::StatusCode::kInvalidArgument);  // already open
  EXPECT_EQ(ring.frontier(0), 0);
  EXPECT_EQ(ring.Commit(0, -1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ring.Close(0).ok());
  EXPECT_FALSE(ring.open(0));
  EXPECT_EQ(ring.Close(0).code(), absl::StatusCode::kInvalidArgument);
}

// The randomized run: the shadow memory holds, per ring row, the (slot, position) last written there.
TEST(DraftRing, LiveWindowsNeverAlias) {
  const uint64_t seed = 20261130;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int config = 0; config < 60; ++config) {
    const int64_t w = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    const int64_t k_max = std::uniform_int_distribution<int64_t>(1, 9)(rng);
    const int64_t p = std::uniform_int_distribution<int64_t>(1, 16)(rng);
    const uint32_t slots = std::uniform_int_distribution<uint32_t>(1, 4)(rng);
    absl::StatusOr<DraftRingGeometry> g =
        DraftRingGeometry::Create({.window = w, .k_max = k_max, .page_rows = p, .slots = slots});
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_GE(g->rows_per_slot(), w + k_max);
    DraftRing ring(*g);
    std::vector<std::pair<int64_t, Position>> memory(g->total_rows(), {-1, -1});
    for (uint32_t i = 0; i < slots; ++i) {
      ASSERT_TRUE(ring.Open(i, std::uniform_int_distribution<Position>(0, 50)(rng)).ok());
    }
    for (int step = 0; step < 400; ++step) {
      const uint32_t i = std::uniform_int_distribution<uint32_t>(0, slots - 1)(rng);
      const int64_t block = std::uniform_int_distribution<int64_t>(1, k_max)(rng);
      for (int64_t b = 0; b < block; ++b) {
        const Position t = ring.frontier(i) + ring.pending(i);
        absl::StatusOr<int64_t> row = ring.Write(i);
        ASSERT_TRUE(row.ok()) << row.status();
        ASSERT_GE(*row, int64_t{i} * g->rows_per_slot());
        ASSERT_LT(*row, int64_t{i + 1} * g->rows_per_slot());
        memory[*row] = {i, t};
      }
      ASSERT_TRUE(ring.Commit(i, std::uniform_int_distribution<int64_t>(0, block)(rng)).ok());
      if (step % 100 == 99) {  // a request finishes, another opens the slot further on
        ASSERT_TRUE(ring.Close(i).ok());
        ASSERT_TRUE(ring.Open(i, std::uniform_int_distribution<Position>(0, 5000)(rng)).ok());
      }
      for (uint32_t s = 0; s < slots; ++s) {
        std::set<int64_t> rows;
        for (Position t = ring.window_begin(s); t < ring.frontier(s); ++t) {
          absl::StatusOr<int64_t> row = ring.ReadRow(s, t);
          ASSERT_TRUE(row.ok()) << row.status();
          ASSERT_TRUE(rows.insert(*row).second) << "alias at slot " << s << " t " << t;
          // Every committed position of the window was written since the slot opened and must still be there.
          ASSERT_EQ(memory[*row], std::make_pair(int64_t{s}, t)) << "W=" << w << " K_max=" << k_max << " p=" << p;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dhs::spec
