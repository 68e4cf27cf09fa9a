// tests/libdhs/embedded_worker_test.cc: libdhs's C++ core alone (libdhs/embedded_worker.h): the shape checks of
// EmbeddedWorker::Open, which refuse a bad shape before connecting to anything. (A request's phase is workerd's
// RequestBook's: tests/workerd/request_book_test.cc; the libdhs tests check the worker's invariants after every call,
// DHS_CHECK_INVARIANTS.)
#include "libdhs/embedded_worker.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"

namespace dhs::lib {
namespace {

EmbeddedConfig Good() {
  EmbeddedConfig c;
  c.run_dir = "/nonexistent/dhs-embedded-test";
  c.sources = 2;
  c.row_bytes = 64;
  c.page_rows = 16;
  c.top_k = 8;
  c.hot_rows = 32;
  c.tail_rows = 32;
  c.slots = 2;
  c.hbm_budget_bytes = 8 * 16 * 2 * 64;
  c.connect_timeout_ms = 100;
  return c;
}

TEST(EmbeddedWorkerOpen, ShapeChecksNameTheField) {
  struct Case {
    void (*edit)(EmbeddedConfig&);
    const char* field;
  };
  const Case cases[] = {
      {[](EmbeddedConfig& c) { c.run_dir.clear(); }, "run_dir"},
      {[](EmbeddedConfig& c) { c.gpu = 1u << 16; }, "gpu"},
      {[](EmbeddedConfig& c) { c.mode = WorkerMode::kResident; c.staging_arenas = 1; c.round_queries = 4; },
       "staging_arenas must be 0 in DHS_MODE_RESIDENT"},
      {[](EmbeddedConfig& c) { c.sources = 0; }, "sources"},
      {[](EmbeddedConfig& c) { c.row_bytes = 66; }, "row_bytes"},
      {[](EmbeddedConfig& c) { c.indexers = 1; }, "index_key_bytes"},
      {[](EmbeddedConfig& c) { c.page_rows = 0; }, "page_rows"},
      {[](EmbeddedConfig& c) { c.top_k = 33; }, "top_k"},
      {[](EmbeddedConfig& c) { c.tail_rows = 24; }, "tail_rows"},
      {[](EmbeddedConfig& c) { c.slots = 0; }, "slots"},
      {[](EmbeddedConfig& c) { c.hbm_budget_bytes = 100; }, "hbm_budget_bytes"},
      {[](EmbeddedConfig& c) { c.hot_rows = 1u << 24; c.tail_rows = 1u << 20; c.slots = 4096; c.top_k = 8; },
       "more than 1 TiB"},
      // ABI 1.8: what workerd's Hello declares (consumers, the drafter's ring, K_max without arenas).
      {[](EmbeddedConfig& c) { c.source_consumers = {1}; }, "source_consumers has 1 entries for 2 sources"},
      {[](EmbeddedConfig& c) { c.source_consumers = {1, 0}; }, "source_consumers[1] = 0"},
      {[](EmbeddedConfig& c) { c.draft_ring_rows = 16; }, "draft_ring_rows (16) and draft_bytes_per_row (0)"},
      {[](EmbeddedConfig& c) { c.draft_bytes_per_row = 512; }, "draft_ring_rows (0) and draft_bytes_per_row (512)"},
      {[](EmbeddedConfig& c) { c.drafter_window = 4; }, "drafter_window is set without a draft ring"},
      {[](EmbeddedConfig& c) { c.round_queries = 18; }, "at most T - p + 1 = 17"},
  };
  for (const Case& k : cases) {
    EmbeddedConfig c = Good();
    k.edit(c);
    const auto w = EmbeddedWorker::Open(c);
    ASSERT_FALSE(w.ok()) << k.field;
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << k.field << ": " << w.status();
    EXPECT_NE(std::string(w.status().message()).find(k.field), std::string::npos) << w.status();
  }
  // The good shape passes the checks and fails only at the connection (no memd there).
  const auto w = EmbeddedWorker::Open(Good());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
}

// The Hello and the required pages of a shape with a drafter (ABI 1.8; workerd's MakeHello goes through HelloOf:
// tests/workerd/worker_geometry_test.cc checks it against workerd's own sizes).
TEST(EmbeddedShape, HelloDeclaresTheDrafterConsumersAndRoundBound) {
  EmbeddedConfig c = Good();
  c.source_consumers = {3, 1};
  c.fetched_rows_per_token = 6;
  c.round_queries = 4;                 // K_max without arenas: declared only
  c.draft_ring_rows = 16;
  c.draft_bytes_per_row = 512;         // 8192 bytes per slot = 4 pages of 16 * 2 * 64 = 2048 bytes
  c.drafter_window = 8;
  c.device_name = "test device";
  const absl::StatusOr<wire::HelloT> h = HelloOf(c);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->device_name, "test device");
  ASSERT_EQ(h->sources.size(), 2u);
  EXPECT_EQ(h->sources[0]->consumers, 3u);
  EXPECT_EQ(h->sources[1]->consumers, 1u);
  EXPECT_EQ(h->fetched_rows_per_token, 6u);
  EXPECT_EQ(h->k_max, 4u);
  EXPECT_EQ(h->staging_arenas, 0u);
  EXPECT_EQ(h->staging_bytes, 0u);
  EXPECT_TRUE(h->has_drafter);
  EXPECT_EQ(h->draft_ring_rows, 16u);
  EXPECT_EQ(h->draft_bytes_per_row, 512u);
  EXPECT_EQ(h->draft_ring_bytes, 2u * 16 * 512);  // N * R_d * row bytes
  EXPECT_EQ(h->drafter_window, 8u);
  EXPECT_EQ(h->capacity_pages, 8u);

  // Unsaid: one consumer per source, S rows per token, no drafter, no round bound.
  const absl::StatusOr<wire::HelloT> plain = HelloOf(Good());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->sources[0]->consumers, 1u);
  EXPECT_EQ(plain->fetched_rows_per_token, 2u);
  EXPECT_FALSE(plain->has_drafter);
  EXPECT_EQ(plain->draft_ring_bytes, 0u);
  EXPECT_EQ(plain->k_max, 0u);

  // Required pages (brief §8): ceil((B + T) / p) = 4, plus the slot's ring, ceil(8192 / 2048) = 4, in every mode.
  for (WorkerMode mode : {WorkerMode::kHisparse, WorkerMode::kAdaptive, WorkerMode::kResident}) {
    EmbeddedConfig m = c, base = Good();
    m.mode = base.mode = mode;
    const absl::StatusOr<RegionLayout> rm = RegionOf(m), rb = RegionOf(base);
    ASSERT_TRUE(rm.ok() && rb.ok());
    for (uint64_t rows : {0u, 16u, 100u}) {
      EXPECT_EQ(SessionRequiredPages(SessionPagesOf(m, *rm), rows),
                SessionRequiredPages(SessionPagesOf(base, *rb), rows) + 4)
          << WorkerModeName(mode) << " " << rows;
    }
    EXPECT_EQ(SessionRequiredPages(SessionPagesOf(base, *rb), 0), mode == WorkerMode::kResident ? 0u : 4u);
  }
}

}  // namespace
}  // namespace dhs::lib
