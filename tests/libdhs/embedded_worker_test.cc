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
       "more than 64 GiB"},
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

}  // namespace
}  // namespace dhs::lib
