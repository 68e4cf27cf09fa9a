// tests/libdhs/libdhs_fixture.h: what the tests of the C API against a real memd share (libdhs_api_test, and
// tests/gpu/libdhs_device_pool_test on the CUDA backend): the small shape and its memd --page-bytes, the row pattern,
// a config of that shape, and a fixture that starts memd ($MEMD) in its own run directory and drives one worker.
#pragma once

#include <dhs/dhs.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <poll.h>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"

namespace dhs::testing::libdhs {

inline constexpr uint32_t kS = 2, kRow = 64, kKey = 16, kP = 16, kK = 8, kB = 32, kT = 32;
inline constexpr uint64_t kPageBytes = uint64_t{kP} * kS * kRow;      // 2048
inline constexpr uint64_t kHostPageBytes = kPageBytes + kP * kKey;     // 2304: memd --page-bytes

// A request of ABI 1.0's fields (no chain) in a 1.1 struct.
inline dhs_request_desc Desc(uint64_t input, uint64_t max, uint64_t resume_of = 0) {
  dhs_request_desc d{};
  d.struct_size = sizeof d;
  d.input_rows = input;
  d.max_rows = max;
  d.resume_of = resume_of;
  return d;
}

inline uint8_t RowByte(uint64_t r, uint32_t s, int64_t t, uint32_t b) {
  return static_cast<uint8_t>(r * 131 + s * 31 + static_cast<uint64_t>(t) * 7 + b);
}

inline std::vector<uint8_t> Rows(uint64_t r, int64_t first, uint32_t n) {
  std::vector<uint8_t> rows(size_t{n} * kS * kRow);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t s = 0; s < kS; ++s)
      for (uint32_t b = 0; b < kRow; ++b) rows[(i * kS + s) * kRow + b] = RowByte(r, s, first + i, b);
  return rows;
}

// The backend the tests open: DHS_BACKEND_CPU, or DHS_BACKEND_CUDA with DHS_TEST_BACKEND=cuda (tools/gpu_check.sh runs
// the lifecycle, reclaim, staging and restart cases so on a GPU: the resolver kernel, rows read back from managed
// memory at base + location).
inline uint32_t TestBackend() {
  const char* b = std::getenv("DHS_TEST_BACKEND");
  return b != nullptr && std::string_view(b) == "cuda" ? DHS_BACKEND_CUDA : DHS_BACKEND_CPU;
}

inline dhs_worker_config Config(const std::string& run_dir, uint32_t optional_pages) {
  dhs_worker_config c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.abi_version = DHS_ABI_VERSION;
  c.run_dir = run_dir.c_str();
  c.mode = DHS_MODE_ADAPTIVE;
  c.backend = TestBackend();
  c.sources = kS;
  c.row_bytes = kRow;
  c.indexers = 1;
  c.index_key_bytes = kKey;
  c.page_rows = kP;
  c.top_k = kK;
  c.hot_rows = kB;
  c.tail_rows = kT;
  c.slots = 2;
  c.hbm_budget_bytes = optional_pages * kPageBytes;
  c.connect_timeout_ms = 10000;
  return c;
}

// memd started in a run directory of its own (StartMemd), one worker w_ on it (closed at teardown), and the calls most
// tests make on it.
class MemdFixture : public ::testing::Test {
 protected:
  // host_pool_pages: 0 = the last StartMemd's (256 at first): a later memd of the run directory adopts the pool.
  void StartMemd(const std::vector<std::string>& extra = {}, uint32_t host_pool_pages = 0) {
    if (host_pool_pages != 0) host_pool_pages_ = host_pool_pages;
    const char* memd = std::getenv("MEMD");
    ASSERT_NE(memd, nullptr) << "MEMD is not set";
    std::vector<std::string> args{
        memd, "--run-dir", dir_.path(), "--page-bytes", std::to_string(kHostPageBytes), "--host-pool-pages",
        std::to_string(host_pool_pages_)};
    args.insert(args.end(), extra.begin(), extra.end());
    memd_ = std::make_unique<dhs::testing::ChildProcess>(args);
    for (int i = 0; i < 400 && !std::filesystem::exists(dir_.path() + "/memd.sock"); ++i) ::poll(nullptr, 0, 25);
    ASSERT_TRUE(std::filesystem::exists(dir_.path() + "/memd.sock"));
  }
  void TearDown() override {
    if (w_ != nullptr) dhs_worker_close(w_);
    if (memd_ != nullptr) memd_->Terminate();
  }
  void Open(uint32_t optional_pages) {
    const dhs_worker_config c = Config(dir_.path(), optional_pages);
    ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  }
  // Polls until `n` events arrived (or ~10 s); returns them.
  std::vector<dhs_event> PollFor(size_t n) {
    std::vector<dhs_event> all;
    for (int i = 0; i < 2000 && all.size() < n; ++i) {
      dhs_event ev[8];
      size_t got = 0;
      EXPECT_EQ(dhs_worker_poll(w_, ev, 8, &got), DHS_OK) << dhs_worker_errmsg(w_);
      all.insert(all.end(), ev, ev + got);
      if (got == 0) ::poll(nullptr, 0, 5);
    }
    return all;
  }
  uint64_t SubmitGranted(uint64_t input, uint64_t max) {
    dhs_request_desc d = Desc(input, max);
    uint64_t id = 0;
    EXPECT_EQ(dhs_request_submit(w_, &d, &id), DHS_OK) << dhs_worker_errmsg(w_);
    const std::vector<dhs_event> ev = PollFor(1);
    EXPECT_EQ(ev.size(), 1u);
    if (!ev.empty()) {
      EXPECT_EQ(ev[0].kind, DHS_EVENT_GRANTED) << ev[0].message;
      EXPECT_EQ(ev[0].request, id);
    }
    return id;
  }
  // Resolves `sel` of request `id` on every source and checks every row's kRow bytes, read by `read(location, row)`
  // from a pool of `pool_bytes` bytes, against the pattern appended under `pattern` (0: `id`; a resumed request's
  // rows are keyed by the interrupted request's id); then ends the readers.
  void ExpectRowsAt(uint64_t id, const std::vector<int64_t>& sel, uint64_t pattern, uint64_t pool_bytes,
                    const std::function<void(int64_t, uint8_t*)>& read) {
    if (pattern == 0) pattern = id;
    for (uint32_t s = 0; s < kS; ++s) {
      std::vector<int64_t> loc(sel.size(), -7);
      dhs_query q{id, sel.data(), static_cast<uint32_t>(sel.size()), 0, loc.data()};
      ASSERT_EQ(dhs_resolve(w_, &s, 1, &q, 1), DHS_OK) << dhs_worker_errmsg(w_);
      for (size_t j = 0; j < sel.size(); ++j) {
        if (sel[j] < 0) {
          EXPECT_EQ(loc[j], -1);
          continue;
        }
        ASSERT_GE(loc[j], 0);
        ASSERT_LE(static_cast<uint64_t>(loc[j]) + kRow, pool_bytes);
        uint8_t row[kRow];
        read(loc[j], row);
        for (uint32_t b = 0; b < kRow; ++b) {
          ASSERT_EQ(row[b], RowByte(pattern, s, sel[j], b)) << "source " << s << " position " << sel[j] << " byte " << b;
        }
      }
      ASSERT_EQ(dhs_readers_done(w_, &s, 1), DHS_OK);
    }
  }
  // Submits a request of 16 rows (max 80) that needs `victim`'s GPU pages: polls until memd reclaimed them
  // (RECLAIMED of `victim`) and granted it (*granted_id); no request fails meanwhile. expect_reclaim false: the grant
  // alone is awaited (hisparse mode keeps no optional pages, so nothing is reclaimed).
  void SubmitReclaiming(uint64_t victim, uint64_t* granted_id, bool expect_reclaim = true) {
    dhs_request_desc d = Desc(16, 80);
    ASSERT_EQ(dhs_request_submit(w_, &d, granted_id), DHS_OK);
    bool reclaimed = false, granted = false;
    for (int i = 0; i < 4000 && !granted; ++i) {
      dhs_event ev[8];
      size_t got = 0;
      ASSERT_EQ(dhs_worker_poll(w_, ev, 8, &got), DHS_OK) << dhs_worker_errmsg(w_);
      for (size_t e = 0; e < got; ++e) {
        if (ev[e].kind == DHS_EVENT_RECLAIMED && ev[e].request == victim) reclaimed = true;
        if (ev[e].kind == DHS_EVENT_GRANTED && ev[e].request == *granted_id) granted = true;
        EXPECT_NE(ev[e].kind, static_cast<uint32_t>(DHS_EVENT_FAILED)) << ev[e].message;
      }
      if (got == 0) ::poll(nullptr, 0, 2);
    }
    ASSERT_TRUE(granted);
    if (expect_reclaim) {
      ASSERT_TRUE(reclaimed);
    }
  }
  int Append(uint64_t id, int64_t first, uint32_t n) {
    const std::vector<uint8_t> rows = Rows(id, first, n);
    return dhs_request_append(w_, id, first, n, rows.data(), rows.size(), nullptr, 0);
  }
  nlohmann::json Stats() {
    return Json([&](char* buf, size_t cap, size_t* need) { return dhs_worker_stats_json(w_, buf, cap, need); });
  }
  nlohmann::json Timeline(uint64_t id) {
    return Json([&](char* buf, size_t cap, size_t* need) { return dhs_request_timeline_json(w_, id, buf, cap, need); });
  }
  // dhs_worker_stats_json, dhs_request_timeline_json: asked for the size first, then the text.
  nlohmann::json Json(const std::function<int(char*, size_t, size_t*)>& call) {
    size_t need = 0;
    EXPECT_EQ(call(nullptr, 0, &need), DHS_ERR_RESOURCE_EXHAUSTED);
    std::vector<char> buf(need);
    EXPECT_EQ(call(buf.data(), buf.size(), &need), DHS_OK) << dhs_worker_errmsg(w_);
    return nlohmann::json::parse(buf.data());
  }

  dhs::testing::ScopedRunDir dir_;
  uint32_t host_pool_pages_ = 256;
  std::unique_ptr<dhs::testing::ChildProcess> memd_;
  dhs_worker* w_ = nullptr;
};

}  // namespace dhs::testing::libdhs
