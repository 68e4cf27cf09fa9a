// tests/verification/staging_pool_test.cc: the staging arenas (workerd/verification/staging_pool.h, brief §6 "Staging"): the
// reservation χ * N * K_max * k * d_KV and row offsets by hand (glm5-like preset of brief §8), acquire / release with
// reader counts and their refusals, and a randomized run of layer groups against a shadow of the readers: no arena is
// handed out while it has readers, and an arena frees exactly when its last reader releases.
#include <gtest/gtest.h>

#include <cstdio>
#include <deque>
#include <random>
#include <vector>

#include "workerd/verification/staging_pool.h"

namespace dhs::spec {
namespace {

TEST(StagingReservation, BytesByHand) {
  // glm5-like (brief §8): χ = 4 live payload layers, K_max = 8, k = 2048, d_KV = 576: 4 * 8 * 2048 * 576 per slot.
  EXPECT_EQ(*StagingReservationBytes({.arenas = 4, .slots = 1, .k_max = 8, .k = 2048, .row_bytes = 576}), 37748736);
  EXPECT_EQ(*StagingReservationBytes({.arenas = 4, .slots = 16, .k_max = 8, .k = 2048, .row_bytes = 576}),
            603979776);
  EXPECT_EQ(*StagingReservationBytes({.arenas = 2, .slots = 3, .k_max = 4, .k = 5, .row_bytes = 6}), 720);
  EXPECT_EQ(StagingReservationBytes({.arenas = 0, .slots = 3, .k_max = 4, .k = 5, .row_bytes = 6}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<int64_t> big = StagingReservationBytes(
      {.arenas = 1u << 30, .slots = 1u << 30, .k_max = 8, .k = 2048, .row_bytes = 576});
  ASSERT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("χ * N * K_max * k * d_KV"), std::string::npos) << big.status();
}

TEST(StagingReservation, RowOffsetsTileTheReservation) {
  const StagingShape s{.arenas = 2, .slots = 3, .k_max = 4, .k = 5, .row_bytes = 6};
  EXPECT_EQ(StagingRowOffset(s, 0, 0, 0), 0);
  EXPECT_EQ(StagingRowOffset(s, 0, 1, 0), 120);  // one slot = K_max * k = 20 rows of 6 bytes
  EXPECT_EQ(StagingRowOffset(s, 1, 0, 0), 360);  // one arena = 3 slots
  EXPECT_EQ(StagingRowOffset(s, 1, 2, 7), 642);  // ((1 * 3 + 2) * 20 + 7) * 6
  EXPECT_EQ(StagingRowOffset(s, 1, 2, 19) + 6, *StagingReservationBytes(s));
}

TEST(StagingArenaPool, ReaderCountsAndRefusals) {
  StagingArenaPool pool(2);
  EXPECT_EQ(*pool.Acquire(0, 0, 2), 0u);
  EXPECT_EQ(*pool.Acquire(0, 1, 1), 1u);
  EXPECT_EQ(pool.Acquire(1, 0, 3).status().code(), absl::StatusCode::kResourceExhausted);  // group 1 waits
  EXPECT_EQ(pool.Acquire(0, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);    // already holds arena 0
  EXPECT_EQ(pool.Acquire(1, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);    // no readers
  EXPECT_EQ(*pool.ReleaseReader(1), true);   // group 0 source 1's only reader: arena 1 free
  EXPECT_EQ(pool.ReleaseReader(1).status().code(), absl::StatusCode::kInvalidArgument);  // released twice
  EXPECT_EQ(pool.ReleaseReader(5).status().code(), absl::StatusCode::kInvalidArgument);  // no such arena
  EXPECT_EQ(*pool.Acquire(1, 0, 3), 1u);     // the next group reuses arena 1
  EXPECT_EQ(*pool.ReleaseReader(0), false);  // arena 0 still has a reader
  EXPECT_EQ(pool.readers(0), 1u);
  EXPECT_EQ(pool.free_arenas(), 0u);
  EXPECT_EQ(*pool.ReleaseReader(0), true);
  EXPECT_EQ(pool.free_arenas(), 1u);
  EXPECT_EQ(pool.readers(1), 3u);
}

TEST(StagingArenaPool, RandomGroupsNeverReuseAnArenaWithReaders) {
  const uint64_t seed = 4242;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int64_t acquired = 0, waits = 0;
  for (int run = 0; run < 50; ++run) {
    const uint32_t chi = std::uniform_int_distribution<uint32_t>(1, 6)(rng);
    StagingArenaPool pool(chi);
    std::vector<uint32_t> shadow(chi, 0);  // outstanding readers per arena
    std::deque<std::pair<uint32_t, uint32_t>> next;  // (group, source) waiting for an arena, in layer order
    for (uint32_t g = 0; g < 40; ++g) {
      const uint32_t sources = std::uniform_int_distribution<uint32_t>(1, chi)(rng);
      for (uint32_t s = 0; s < sources; ++s) next.push_back({g, s});
    }
    while (!next.empty() || pool.free_arenas() < chi) {
      if (!next.empty() && std::bernoulli_distribution(0.5)(rng)) {
        const uint32_t readers = std::uniform_int_distribution<uint32_t>(1, 4)(rng);
        absl::StatusOr<uint32_t> a = pool.Acquire(next.front().first, next.front().second, readers);
        if (a.ok()) {
          ASSERT_LT(*a, chi);
          ASSERT_EQ(shadow[*a], 0u) << "arena " << *a << " reused with readers";
          shadow[*a] = readers;
          next.pop_front();
          ++acquired;
        } else {
          ASSERT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted) << a.status();
          for (uint32_t x : shadow) ASSERT_GT(x, 0u);
          ++waits;
        }
      } else {
        const uint32_t a = std::uniform_int_distribution<uint32_t>(0, chi)(rng);  // chi: out of range
        absl::StatusOr<bool> freed = pool.ReleaseReader(a);
        if (a >= chi || shadow[a] == 0) {
          ASSERT_EQ(freed.status().code(), absl::StatusCode::kInvalidArgument);
        } else {
          ASSERT_TRUE(freed.ok()) << freed.status();
          ASSERT_EQ(*freed, --shadow[a] == 0);
        }
      }
      for (uint32_t a = 0; a < chi; ++a) ASSERT_EQ(pool.readers(a), shadow[a]);
    }
  }
  std::printf("%lld arenas handed out, %lld waits for readers\n", static_cast<long long>(acquired),
              static_cast<long long>(waits));
  EXPECT_GT(waits, 0);
}

}  // namespace
}  // namespace dhs::spec
