// tests/libdhs/libdhs_api_test.cc: the C ABI of issue 25 (include/dhs/dhs.h) through the shared library, against a
// real memd (MEMD, started per test in its own run directory): every bad-input case of the issue answers its status
// with a message and aborts nothing; a request's lifecycle; the rows a resolve returns are the bytes appended, also
// after memd reclaimed the request's optional pages (host recovery, brief §5, §7); speculative hold and commit.
#include <dhs/dhs.h>

#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <future>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <span>
#include <functional>
#include <iterator>
#include <set>
#include <thread>
#include <string>
#include <string_view>
#include <vector>

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"
#include "tests/libdhs/libdhs_fixture.h"

namespace {

using dhs::testing::ChildProcess;
using dhs::testing::ScopedRunDir;
using namespace dhs::testing::libdhs;  // the shape, the row pattern, Config, MemdFixture


std::string PoolSegmentPath(const std::string& run_dir);

class LibdhsTest : public MemdFixture {
 protected:
  // Resolves `sel` of request `id` on every source and checks every row's bytes, read from the library's pool on the
  // host, against the pattern appended under `pattern` (0: `id`; a resumed request's rows are keyed by the interrupted
  // request's id).
  void ExpectRows(uint64_t id, const std::vector<int64_t>& sel, uint64_t pattern = 0) {
    dhs_pool_desc pool{};
    pool.struct_size = sizeof pool;
    pool.kind = DHS_POOLS_LIBRARY;
    ASSERT_EQ(dhs_pools_register(w_, &pool), DHS_OK);
    ExpectRowsAt(id, sel, pattern, pool.bytes,
                 [&](int64_t at, uint8_t* row) { std::memcpy(row, static_cast<const uint8_t*>(pool.base) + at, kRow); });
  }
  // A request of 64 rows (max 80) on the open worker, its 4 pages backed up and their HostCopyWritten reports given
  // to memd (hisparse mode: memd would keep them for a resume); *id = its id.
  void BackedUpRequest(uint64_t* id) {
    *id = SubmitGranted(64, 80);
    ASSERT_EQ(Append(*id, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
    ASSERT_NO_FATAL_FAILURE(WaitBackedUp(4));
  }
  // memd started, a hisparse worker opened with `*c` (every complete page backed up: memd would keep them for a
  // resume) and one request backed up on it (BackedUpRequest); *id = its id.
  void StartWithBackedUpRequest(dhs_worker_config* c, uint64_t* id) {
    ASSERT_NO_FATAL_FAILURE(StartMemd());
    c->mode = DHS_MODE_HISPARSE;
    ASSERT_EQ(dhs_worker_open(c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
    ASSERT_NO_FATAL_FAILURE(BackedUpRequest(id));
  }
  // memd started, a hisparse worker of 2 slots opened with `*c`, request *x backed up (4 host pages) and interrupted
  // by a new epoch (NewEpoch), then *a and *b granted (16 rows, max 32): both slots held.
  void StartWithInterruptedAndTwoGranted(dhs_worker_config* c, uint64_t* x, uint64_t* a, uint64_t* b) {
    ASSERT_NO_FATAL_FAILURE(StartMemd());
    c->mode = DHS_MODE_HISPARSE;
    c->slots = 2;
    ASSERT_EQ(dhs_worker_open(c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
    ASSERT_NO_FATAL_FAILURE(BackedUpRequest(x));
    ASSERT_NO_FATAL_FAILURE(NewEpoch(*c));  // x is interrupted, its 4 host pages kept
    *a = SubmitGranted(16, 32);
    *b = SubmitGranted(16, 32);
  }
  // memd started, a hisparse worker of 2 slots opened with `*c`: requests *a and *b granted (16 rows, max 32), *q
  // submitted after them (it waits for a slot).
  void StartWithTwoGrantedAndOneQueued(dhs_worker_config* c, uint64_t* a, uint64_t* b, uint64_t* q) {
    ASSERT_NO_FATAL_FAILURE(StartMemd());
    c->mode = DHS_MODE_HISPARSE;
    c->slots = 2;
    ASSERT_EQ(dhs_worker_open(c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
    *a = SubmitGranted(16, 32);
    *b = SubmitGranted(16, 32);
    dhs_request_desc d = Desc(16, 32);
    ASSERT_EQ(dhs_request_submit(w_, &d, q), DHS_OK) << dhs_worker_errmsg(w_);
  }
  // The ids dhs_worker_list_resumable lists now (at most 8).
  std::set<uint64_t> ListedIds() {
    std::vector<dhs_resumable> list(8);
    size_t n = 0, total = 0;
    EXPECT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
    std::set<uint64_t> ids;
    for (size_t i = 0; i < n; ++i) ids.insert(list[i].request);
    return ids;
  }
  // Completed request `id` is not kept at memd: the open worker lists nothing resumable, and memd, stopped cleanly with
  // no request left after the worker closes, removes its host-pool segment (it keeps it for the next memd only while
  // it holds interrupted requests' pages).
  void ExpectNothingKeptFor(uint64_t id) {
    std::vector<dhs_resumable> list(4);
    size_t n = 0, total = 0;
    ASSERT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
    EXPECT_EQ(total, 0u) << "the completed request " << id << " is kept as interrupted";
    ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
    w_ = nullptr;
    const std::string segment = PoolSegmentPath(dir_.path());
    ASSERT_TRUE(std::filesystem::exists(segment));
    memd_->Terminate();
    memd_.reset();
    EXPECT_FALSE(std::filesystem::exists(segment)) << "memd kept its host pool for request " << id;
  }
  // Polls until `pages` pages are backed up, then 20 polls more: their HostCopyWritten reports reach memd (its journal;
  // shared prefix pages become shared).
  void WaitBackedUp(int pages) {
    for (int i = 0; i < 2000 && Stats()["pages"]["backed_up"] < pages; ++i) {
      dhs_event ev[4];
      size_t n = 0;
      ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK);
      ::poll(nullptr, 0, 1);
    }
    ASSERT_EQ(Stats()["pages"]["backed_up"], pages);
    for (int i = 0; i < 20; ++i) {
      dhs_event ev[4];
      size_t n = 0;
      ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK);
      ::poll(nullptr, 0, 5);
    }
  }
  void CompletedWaitingStaysEnded(bool second_death);
  void InterruptAndRestart(const dhs_worker_config& c, uint64_t* interrupted,
                           const std::function<void()>& between = {});
  // SIGKILLs memd (its socket file removed, so that the next StartMemd waits for the new one's).
  void KillMemd() {
    memd_->Signal(SIGKILL);
    ASSERT_GE(memd_->WaitExit(5000), -1);
    memd_.reset();
    std::filesystem::remove(dir_.path() + "/memd.sock");
  }
  // memd dies and the engine closes while it is down; a memd of the same run directory and the reopened worker (a
  // new epoch) follow: the open requests are interrupted there.
  void NewEpoch(const dhs_worker_config& c) {
    ASSERT_NO_FATAL_FAILURE(KillMemd());
    ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
    w_ = nullptr;
    ASSERT_NO_FATAL_FAILURE(StartMemd());
    ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  }
  // The end of a test that leaves a request interrupted (never resumed): the engine and memd stop, and the host pool
  // memd keeps for it (a later memd of the run directory would adopt it) is removed.
  void DropInterruptedPool() {
    if (w_ != nullptr) ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
    w_ = nullptr;
    memd_->Terminate();
    memd_.reset();
    std::filesystem::remove(PoolSegmentPath(dir_.path()));
  }
  // Polls `n` times, `sleep_ms` apart, appending every event to `seen`.
  void PollInto(std::vector<dhs_event>& seen, int n, int sleep_ms) {
    for (int i = 0; i < n; ++i) {
      dhs_event ev[8];
      size_t got = 0;
      ASSERT_EQ(dhs_worker_poll(w_, ev, 8, &got), DHS_OK) << dhs_worker_errmsg(w_);
      seen.insert(seen.end(), ev, ev + got);
      ::poll(nullptr, 0, sleep_ms);
    }
  }
  // Polls (2 ms apart, 4000 times at most) until request `id` is GRANTED; the other events are dropped. Fails if it
  // is not granted by then.
  void PollUntilGranted(uint64_t id) {
    bool granted = false;
    for (int i = 0; i < 4000 && !granted; ++i) {
      dhs_event ev[8];
      size_t got = 0;
      ASSERT_EQ(dhs_worker_poll(w_, ev, 8, &got), DHS_OK) << dhs_worker_errmsg(w_);
      for (size_t e = 0; e < got; ++e) granted |= ev[e].kind == DHS_EVENT_GRANTED && ev[e].request == id;
      if (!granted) ::poll(nullptr, 0, 2);
    }
    ASSERT_TRUE(granted) << "request " << id << " was not granted";
  }
  // Polls (2 ms apart, `polls` times at most) until `done` holds.
  void PollUntil(const std::function<bool()>& done, int polls = 2000) {
    for (int i = 0; i < polls && !done(); ++i) {
      dhs_event ev[4];
      size_t n = 0;
      ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK) << dhs_worker_errmsg(w_);
      ::poll(nullptr, 0, 2);
    }
  }
  // Polls until memd acknowledged (journaled) `acked` tokens in all and none is in flight.
  void WaitTokensAcknowledged(uint64_t acked) {
    ASSERT_NO_FATAL_FAILURE(PollUntil([&] {
      return Stats()["tokens"]["acknowledged"] == acked && !Stats()["tokens"]["in_flight"].get<bool>();
    }));
    ASSERT_EQ(Stats()["tokens"]["acknowledged"], acked) << Stats().dump();
    ASSERT_FALSE(Stats()["tokens"]["in_flight"].get<bool>());
  }
};

TEST(LibdhsNoMemd, VersionNamesAndHandles) {
  EXPECT_EQ(dhs_version(), static_cast<uint32_t>(DHS_ABI_VERSION));
  EXPECT_STREQ(dhs_status_name(DHS_ERR_NOT_FOUND), "DHS_ERR_NOT_FOUND");
  EXPECT_STREQ(dhs_status_name(-3), "DHS_ERR_UNKNOWN");
  EXPECT_STREQ(dhs_status_name(99), "DHS_ERR_UNKNOWN");
  // NULL and a pointer that is no handle of the library: refused without touching it.
  EXPECT_EQ(dhs_worker_close(nullptr), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_worker_open(nullptr, nullptr), DHS_ERR_INVALID_ARGUMENT);
  int not_a_worker = 0;
  auto* fake = reinterpret_cast<dhs_worker*>(&not_a_worker);
  size_t n = 0;
  EXPECT_EQ(dhs_worker_poll(fake, nullptr, 0, &n), DHS_ERR_BAD_HANDLE);
  EXPECT_EQ(dhs_request_complete(fake, 1), DHS_ERR_BAD_HANDLE);
  EXPECT_STREQ(dhs_worker_errmsg(fake), "dhs_worker_errmsg: not a worker of this library");
  EXPECT_STREQ(dhs_worker_errmsg(nullptr), "dhs_worker_errmsg: NULL worker");
}

TEST(LibdhsNoMemd, OpenChecksItsConfig) {
  ScopedRunDir dir;  // no memd there
  struct Case {
    const char* name;
    void (*edit)(dhs_worker_config&);
    int code;
    const char* message_part;
  };
  const Case cases[] = {
      {"struct size", [](dhs_worker_config& c) { c.struct_size -= 4; }, DHS_ERR_VERSION, "struct_size"},
      {"abi major", [](dhs_worker_config& c) { c.abi_version = (DHS_ABI_MAJOR + 1) << 16; }, DHS_ERR_VERSION, "ABI"},
      {"run dir", [](dhs_worker_config& c) { c.run_dir = nullptr; }, DHS_ERR_INVALID_ARGUMENT, "run_dir"},
#ifdef DHS_LIBDHS_CUDA
      // A libdhs built with CUDA takes the backend and checks its GPU before memd hears a Hello (no machine has 65535).
      {"cuda", [](dhs_worker_config& c) { c.backend = DHS_BACKEND_CUDA; c.gpu = 65535; },
       DHS_ERR_FAILED_PRECONDITION, "gpu 65535 is not a CUDA device of this machine"},
#else
      {"cuda", [](dhs_worker_config& c) { c.backend = DHS_BACKEND_CUDA; }, DHS_ERR_UNIMPLEMENTED,
       "built without CUDA"},
#endif
      {"backend", [](dhs_worker_config& c) { c.backend = 7; }, DHS_ERR_INVALID_ARGUMENT, "backend"},
      {"mode", [](dhs_worker_config& c) { c.mode = 0; }, DHS_ERR_INVALID_ARGUMENT, "mode"},
      {"page rows", [](dhs_worker_config& c) { c.page_rows = 0; }, DHS_ERR_INVALID_ARGUMENT, "page_rows"},
      {"row bytes", [](dhs_worker_config& c) { c.row_bytes = 6; }, DHS_ERR_INVALID_ARGUMENT, "row_bytes"},
      {"k above B", [](dhs_worker_config& c) { c.top_k = c.hot_rows + 1; }, DHS_ERR_INVALID_ARGUMENT, "top_k"},
      {"tail", [](dhs_worker_config& c) { c.tail_rows = c.page_rows + 1; }, DHS_ERR_INVALID_ARGUMENT, "tail_rows"},
      {"budget", [](dhs_worker_config& c) { c.hbm_budget_bytes = 1; }, DHS_ERR_INVALID_ARGUMENT, "hbm_budget"},
      {"keys", [](dhs_worker_config& c) { c.index_key_bytes = 0; }, DHS_ERR_INVALID_ARGUMENT, "index_key_bytes"},
      {"no memd", [](dhs_worker_config& c) { c.connect_timeout_ms = 300; }, DHS_ERR_UNAVAILABLE, ""},
      // ABI 1.5: staging arenas (K_max <= T - p + 1 = 17; χ >= the largest group's 2 sources).
      // ABI 1.8: K_max may be declared without arenas, within the tail's bound.
      {"round without arenas beyond the tail", [](dhs_worker_config& c) { c.round_queries = 18; },
       DHS_ERR_INVALID_ARGUMENT, "at most T - p + 1 = 17"},
      {"round beyond the tail", [](dhs_worker_config& c) { c.staging_arenas = 1; c.round_queries = 18; },
       DHS_ERR_INVALID_ARGUMENT, "T - p + 1 = 17"},
      {"no round", [](dhs_worker_config& c) { c.staging_arenas = 1; }, DHS_ERR_INVALID_ARGUMENT, "round_queries"},
      {"arenas below a group",
       [](dhs_worker_config& c) {
         static const uint32_t groups[kS] = {0, 0};
         c.source_groups = groups;
         c.staging_arenas = 1;
         c.round_queries = 4;
       },
       DHS_ERR_INVALID_ARGUMENT, "staging_arenas (χ) 1 must be in [2, 1024]"},
      // ABI 1.8: the drafter's ring, consumers.
      {"ring rows without bytes", [](dhs_worker_config& c) { c.draft_ring_rows = 16; }, DHS_ERR_INVALID_ARGUMENT,
       "draft_ring_rows (16) and draft_bytes_per_row (0)"},
      {"window without a ring", [](dhs_worker_config& c) { c.drafter_window = 4; }, DHS_ERR_INVALID_ARGUMENT,
       "drafter_window"},
      {"no consumer",
       [](dhs_worker_config& c) {
         static const uint32_t consumers[kS] = {2, 0};
         c.source_consumers = consumers;
       },
       DHS_ERR_INVALID_ARGUMENT, "source_consumers[1] = 0"},
      {"reserved", [](dhs_worker_config& c) { c.reserved = 1; }, DHS_ERR_INVALID_ARGUMENT, "reserved must be 0"},
      // A 1.5 .. 1.7 struct ends before the 1.8 fields: they are not read (this one reaches the memd check).
      {"1.7 struct",
       [](dhs_worker_config& c) {
         c.struct_size = DHS_WORKER_CONFIG_SIZE_1_5;
         c.draft_ring_rows = 16;
         c.drafter_window = 4;
         c.connect_timeout_ms = 300;
       },
       DHS_ERR_UNAVAILABLE, ""},
      // A 1.3 / 1.4 struct ends before the arenas' fields: they are not read (this one reaches the memd check).
      {"1.4 struct",
       [](dhs_worker_config& c) {
         c.struct_size = DHS_WORKER_CONFIG_SIZE_1_3;
         c.round_queries = 99;
         c.connect_timeout_ms = 300;
       },
       DHS_ERR_UNAVAILABLE, ""},
  };
  for (const Case& k : cases) {
    dhs_worker_config c = Config(dir.path(), 8);
    k.edit(c);
    dhs_worker* w = nullptr;
    EXPECT_EQ(dhs_worker_open(&c, &w), k.code) << k.name << ": " << dhs_worker_errmsg(w);
    ASSERT_NE(w, nullptr) << k.name;  // the failed handle carries the reason
    EXPECT_NE(std::string(dhs_worker_errmsg(w)).find(k.message_part), std::string::npos)
        << k.name << ": " << dhs_worker_errmsg(w);
    size_t n = 0;
    EXPECT_EQ(dhs_worker_poll(w, nullptr, 0, &n), DHS_ERR_FAILED_PRECONDITION) << k.name;  // a failed open serves nothing
    EXPECT_EQ(dhs_worker_close(w), DHS_OK);
    EXPECT_EQ(dhs_worker_close(w), DHS_ERR_CLOSED);
  }
}

TEST_F(LibdhsTest, EveryEntryPointChecksItsArguments) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(8));
  dhs_worker_info info{};
  EXPECT_EQ(dhs_worker_info_get(w_, &info), DHS_ERR_VERSION);  // struct_size 0
  info.struct_size = sizeof info;
  ASSERT_EQ(dhs_worker_info_get(w_, &info), DHS_OK);
  EXPECT_EQ(info.page_bytes, kPageBytes);
  EXPECT_EQ(info.host_page_bytes, kHostPageBytes);
  EXPECT_EQ(info.capacity_pages, 8u);
  EXPECT_GE(info.worker_epoch, 1u);

  dhs_pool_desc pool{};
  pool.struct_size = sizeof pool;
  pool.kind = DHS_POOLS_ENGINE;  // opened without an engine pool
  EXPECT_EQ(dhs_pools_register(w_, &pool), DHS_ERR_FAILED_PRECONDITION);
  pool.kind = 9;
  EXPECT_EQ(dhs_pools_register(w_, &pool), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_pools_register(w_, nullptr), DHS_ERR_INVALID_ARGUMENT);

  uint64_t id = 0;
  dhs_request_desc d = Desc(20, 40);
  EXPECT_EQ(dhs_request_submit(w_, &d, nullptr), DHS_ERR_INVALID_ARGUMENT);
  d.struct_size = 8;
  EXPECT_EQ(dhs_request_submit(w_, &d, &id), DHS_ERR_VERSION);
  d.struct_size = sizeof d;
  d.input_rows = 0;
  EXPECT_EQ(dhs_request_submit(w_, &d, &id), DHS_ERR_INVALID_ARGUMENT);
  d.input_rows = 50;  // above max_rows
  EXPECT_EQ(dhs_request_submit(w_, &d, &id), DHS_ERR_INVALID_ARGUMENT);
  d.input_rows = 20;
  d.resume_of = 12345;  // not among the interrupted requests memd kept
  EXPECT_EQ(dhs_request_submit(w_, &d, &id), DHS_ERR_NOT_FOUND);
  d.resume_of = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &id), DHS_OK);
  // Before its grant: no append, no resolve.
  const std::vector<uint8_t> early = Rows(id, 0, 1);
  EXPECT_EQ(dhs_request_append(w_, id, 0, 1, early.data(), early.size(), nullptr, 0), DHS_ERR_FAILED_PRECONDITION);
  const std::vector<dhs_event> ev = PollFor(1);
  ASSERT_EQ(ev.size(), 1u);
  ASSERT_EQ(ev[0].kind, DHS_EVENT_GRANTED);

  // A request id never submitted.
  EXPECT_EQ(dhs_request_complete(w_, id + 1000), DHS_ERR_NOT_FOUND);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("not open"), std::string::npos);
  EXPECT_EQ(dhs_request_append(w_, id + 1000, 0, 1, early.data(), early.size(), nullptr, 0), DHS_ERR_NOT_FOUND);
  // Appends: null rows, a wrong size, keys of a wrong size, a gap, past max_rows.
  EXPECT_EQ(dhs_request_append(w_, id, 0, 1, nullptr, 0, nullptr, 0), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append(w_, id, 0, 1, early.data(), early.size() - 1, nullptr, 0), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append(w_, id, 0, 1, early.data(), early.size(), early.data(), 3), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append(w_, id, 0, 1, early.data(), early.size(), nullptr, 5), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append(w_, id, 3, 1, early.data(), early.size(), nullptr, 0), DHS_ERR_OUT_OF_RANGE);
  EXPECT_EQ(dhs_request_append(w_, id, -1, 1, early.data(), early.size(), nullptr, 0), DHS_ERR_OUT_OF_RANGE);
  ASSERT_EQ(Append(id, 0, 20), DHS_OK) << dhs_worker_errmsg(w_);
  const std::vector<uint8_t> far = Rows(id, 20, 21);
  EXPECT_EQ(dhs_request_append(w_, id, 20, 21, far.data(), far.size(), nullptr, 0), DHS_ERR_OUT_OF_RANGE);
  // Keys of the right size are taken.
  std::vector<uint8_t> keys(kKey, 1);
  const std::vector<uint8_t> one = Rows(id, 20, 1);
  ASSERT_EQ(dhs_request_append(w_, id, 20, 1, one.data(), one.size(), keys.data(), keys.size()), DHS_OK);

  // Resolve: a selection longer than k, a position beyond the history, a bad source, null pointers, reserved.
  std::vector<int64_t> sel(kK + 1, 0), loc((kK + 1) * kS, 0);
  uint32_t src = 0;
  dhs_query q{id, sel.data(), kK + 1, 0, loc.data()};
  EXPECT_EQ(dhs_resolve(w_, &src, 1, &q, 1), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("longer than k"), std::string::npos);
  q.length = 2;
  sel[1] = 21;  // 21 rows appended: 0..20
  EXPECT_EQ(dhs_resolve(w_, &src, 1, &q, 1), DHS_ERR_OUT_OF_RANGE);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("beyond request"), std::string::npos) << dhs_worker_errmsg(w_);
  sel[1] = -2;
  EXPECT_EQ(dhs_resolve(w_, &src, 1, &q, 1), DHS_ERR_OUT_OF_RANGE);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("is negative (-1 alone is padding)"), std::string::npos)
      << dhs_worker_errmsg(w_);
  sel[1] = 5;
  uint32_t bad_src = kS;
  EXPECT_EQ(dhs_resolve(w_, &bad_src, 1, &q, 1), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_resolve(w_, nullptr, 1, &q, 1), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_resolve(w_, &src, 1, nullptr, 1), DHS_ERR_INVALID_ARGUMENT);
  q.reserved = 1;
  EXPECT_EQ(dhs_resolve(w_, &src, 1, &q, 1), DHS_ERR_INVALID_ARGUMENT);
  q.reserved = 0;
  q.request = id + 1000;
  EXPECT_EQ(dhs_resolve(w_, &src, 1, &q, 1), DHS_ERR_NOT_FOUND);
  EXPECT_EQ(dhs_readers_done(w_, &bad_src, 1), DHS_ERR_INVALID_ARGUMENT);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(id, {0, 5, 20, -1, 19}));

  // Hold / commit: three unverified rows, one accepted.
  EXPECT_EQ(dhs_request_commit(w_, id, 21), DHS_ERR_FAILED_PRECONDITION);  // no hold
  EXPECT_EQ(dhs_request_hold(w_, id, 3), DHS_ERR_OUT_OF_RANGE);            // below the appended rows
  ASSERT_EQ(dhs_request_hold(w_, id, 22), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(Append(id, 21, 3), DHS_OK) << dhs_worker_errmsg(w_);           // 21 (anchor), 22, 23 unverified
  EXPECT_EQ(dhs_request_commit(w_, id, 30), DHS_ERR_OUT_OF_RANGE);
  ASSERT_EQ(dhs_request_commit(w_, id, 23), DHS_OK) << dhs_worker_errmsg(w_);  // 22 accepted, 23 dropped
  ASSERT_EQ(Append(id, 23, 1), DHS_OK) << dhs_worker_errmsg(w_);           // position 23 computed again
  ASSERT_NO_FATAL_FAILURE(ExpectRows(id, {21, 22, 23}));

  EXPECT_EQ(dhs_request_import(w_, id, 0, 1, nullptr, 0), DHS_ERR_FAILED_PRECONDITION);  // not a resume
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("no host-backed page"), std::string::npos);
  EXPECT_EQ(dhs_request_import(w_, id, 0, 1, nullptr, 4), DHS_ERR_INVALID_ARGUMENT);

  // Stats: a buffer too small answers the size it needs.
  char small[4];
  size_t need = 0;
  EXPECT_EQ(dhs_worker_stats_json(w_, small, sizeof small, &need), DHS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_GT(need, sizeof small);
  EXPECT_EQ(dhs_worker_stats_json(w_, nullptr, 0, nullptr), DHS_ERR_INVALID_ARGUMENT);
  const nlohmann::json st = Stats();
  EXPECT_EQ(st["rows_appended"], 25);  // 20 + 1 + 3 + 1
  EXPECT_EQ(st["requests"]["open_granted"], 1);

  ASSERT_EQ(dhs_request_complete(w_, id), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, id), DHS_ERR_NOT_FOUND);
  size_t n = 0, total = 0;
  EXPECT_EQ(dhs_worker_list_resumable(w_, nullptr, 0, &n, &total), DHS_OK);
  EXPECT_EQ(total, 0u);
  EXPECT_EQ(dhs_request_import(w_, id, 0, 1, nullptr, 0), DHS_ERR_NOT_FOUND);  // completed

  // Token records (ABI 1.5): a completed request has none; a request that generates nothing (max_rows == input_rows)
  // keeps no record.
  const int32_t tok = 9;
  EXPECT_EQ(dhs_request_commit_tokens(w_, id, &tok, nullptr, 1), DHS_ERR_NOT_FOUND);
  const uint64_t exact = SubmitGranted(16, 16);
  EXPECT_EQ(dhs_request_commit_tokens(w_, exact, &tok, nullptr, 1), DHS_ERR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("no token record"), std::string::npos) << dhs_worker_errmsg(w_);
  const uint64_t digests[2] = {1, 2};
  EXPECT_EQ(dhs_request_commit_tokens(w_, exact, &tok, digests, 1), DHS_ERR_FAILED_PRECONDITION);
  ASSERT_EQ(dhs_request_complete(w_, exact), DHS_OK);
  int32_t out[4];
  size_t prompt = 0;
  EXPECT_EQ(dhs_worker_resumable_tokens(w_, id, out, 4, &n, &total, &prompt), DHS_ERR_NOT_FOUND);

  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  EXPECT_EQ(dhs_worker_poll(w_, nullptr, 0, &n), DHS_ERR_CLOSED);
  EXPECT_EQ(dhs_request_complete(w_, id), DHS_ERR_CLOSED);
  EXPECT_EQ(dhs_request_commit_tokens(w_, id, &tok, nullptr, 1), DHS_ERR_CLOSED);
  EXPECT_EQ(dhs_worker_resumable_tokens(w_, id, out, 4, &n, &total, &prompt), DHS_ERR_CLOSED);
  EXPECT_STREQ(dhs_worker_errmsg(w_), "the worker was closed");
  EXPECT_EQ(dhs_worker_close(w_), DHS_ERR_CLOSED);
  w_ = nullptr;
}

// Brief §4 and §7 through the API: request A's prompt pages are kept on GPU (adaptive); B's admission leaves a
// deficit, memd reclaims A's optional pages (the library backs them up, withdraws, answers: a RECLAIMED event is all
// the engine sees); A's old rows then come from host and are byte-identical.
TEST_F(LibdhsTest, ForcedReclaimKeepsRowsExact) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  // Required pages per request: ceil((B + T) / p) + ceil(80 * 1 * 16 / 2048) = 4 + 1 = 5; A keeps 64 / 16 = 4
  // optional pages: 9 of M = 12; B needs 5, 3 are free: memd reclaims A.
  ASSERT_NO_FATAL_FAILURE(Open(12));
  const uint64_t a = SubmitGranted(64, 80);
  ASSERT_EQ(Append(a, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
  for (int i = 0; i < 50; ++i) {  // the keep copies complete and are published
    dhs_event ev[4];
    size_t got = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &got), DHS_OK);
    ::poll(nullptr, 0, 2);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, {0, 17, 33, 63, -1}));
  const nlohmann::json before = Stats();
  EXPECT_EQ(before["pages"]["kept"], 4) << before.dump();

  uint64_t b = 0;
  ASSERT_NO_FATAL_FAILURE(SubmitReclaiming(a, &b));
  // A's old rows: not in its tail (32 rows: 32..63), its hot cache holds the earlier selection's rows; the others
  // are recovered from host.
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, {1, 2, 3, 18, 40, 41, 5, 6}));
  const nlohmann::json after = Stats();
  EXPECT_GE(after["pages"]["reclaimed"], 4) << after.dump();
  EXPECT_GE(after["census"]["host"].get<uint64_t>(), 8u) << after.dump();  // 4 positions x 2 sources at least
  ASSERT_EQ(Append(b, 0, 16), DHS_OK);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(b, {0, 15}));
  EXPECT_EQ(dhs_request_complete(w_, a), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
}

// Where dhs_resolve runs (stats' device object): the CPU backend's fused resolver on the host; on the CUDA backend
// (DHS_TEST_BACKEND=cuda, tools/gpu_check.sh) the resolver kernel, whose rows ForcedReclaimKeepsRowsExact and the
// other cases of that run read back from managed memory.
TEST_F(LibdhsTest, StatsNameTheBackendAndWhereResolvesRun) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(12));
  const bool cuda = TestBackend() == DHS_BACKEND_CUDA;
  const nlohmann::json s = Stats();
  EXPECT_EQ(s["device"]["backend"], cuda ? "cuda" : "cpu") << s.dump();
  EXPECT_EQ(s["device"]["resolver"], cuda ? "kernel" : "host") << s.dump();
}

// The CUDA backend takes an engine's pool as CUDA device or managed memory (tests/gpu/libdhs_device_pool_test.cc), not
// as host memory: refused with the reason before memd hears a Hello, and the GPU's worker opens afterwards.
TEST_F(LibdhsTest, TheCudaBackendRefusesAnEnginePoolOfHostMemory) {
  if (TestBackend() != DHS_BACKEND_CUDA) GTEST_SKIP() << "the CUDA backend's case (DHS_TEST_BACKEND=cuda)";
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 12);
  uint64_t need = 0;
  ASSERT_EQ(dhs_pool_bytes_needed(&c, &need), DHS_OK);
  void* host = std::aligned_alloc(DHS_POOL_ALIGNMENT, (need + DHS_POOL_ALIGNMENT - 1) / DHS_POOL_ALIGNMENT *
                                                          DHS_POOL_ALIGNMENT);
  ASSERT_NE(host, nullptr);
  c.engine_pool = host;
  c.engine_pool_bytes = need;
  dhs_worker* w = nullptr;
  EXPECT_EQ(dhs_worker_open(&c, &w), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dhs_worker_errmsg(w)).find("managed memory"), std::string::npos) << dhs_worker_errmsg(w);
  EXPECT_EQ(dhs_worker_close(w), DHS_OK);
  std::free(host);
  // The GPU's worker is free again: an open without the engine's pool succeeds.
  ASSERT_NO_FATAL_FAILURE(Open(12));
}

// A page whose rows are all appended but held (a speculative round not committed yet) is not complete: it has no
// backup and no keep copy until the commit. memd reclaims the request meanwhile (a second request needs its GPU
// pages): the keep planned for such a page becomes a backup planned for the commit. Found by the libdhs_corpus replay
// (a SIGSEGV under MALLOC_PERTURB_): the store took a held page as complete, its backup failed ("has no page 0") and
// the keep it restored indexed a page it had never grown.
TEST_F(LibdhsTest, HeldPagesAreNotReclaimedAsComplete) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(12));  // as ForcedReclaimKeepsRowsExact: A keeps 4 of 12 pages, B needs 5 of 3 free
  const uint64_t a = SubmitGranted(64, 80);
  ASSERT_EQ(dhs_request_hold(w_, a, 0), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(Append(a, 0, 32), DHS_OK) << dhs_worker_errmsg(w_);  // pages 0 and 1 whole, every row held
  uint64_t b = 0;
  ASSERT_NO_FATAL_FAILURE(SubmitReclaiming(a, &b));
  EXPECT_EQ(Stats()["pages"]["backed_up"], 0);  // nothing of the held pages was copied anywhere
  // The commit completes pages 0 and 1: backed up into the host pages the reclaim planned; A decodes on.
  ASSERT_EQ(dhs_request_commit(w_, a, 32), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(Append(a, 32, 32), DHS_OK) << dhs_worker_errmsg(w_);
  for (int i = 0; i < 2000 && Stats()["pages"]["backed_up"] < 4; ++i) {
    dhs_event ev[8];
    size_t got = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 8, &got), DHS_OK) << dhs_worker_errmsg(w_);
    for (size_t e = 0; e < got; ++e) EXPECT_NE(ev[e].kind, static_cast<uint32_t>(DHS_EVENT_FAILED)) << ev[e].message;
    ::poll(nullptr, 0, 1);
  }
  EXPECT_EQ(Stats()["pages"]["backed_up"], 4);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, {0, 1, 15, 16, 31, 2, 3, 4}));  // out of the tail (32 .. 63): from host
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, {17, 18, 33, 63, 40, 41, 5, 6}));
  EXPECT_EQ(dhs_request_complete(w_, a), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
}

// A held round's rows must fit the tail with the partial page before them (found by fuzz/libdhs_fuzz.cc: before the
// check, position T past the held page made the KV store index a page it had never grown: a segfault). Here p = 16,
// T = 32, held from 16: positions up to 47 fit, 48 does not; after the commit appends go on.
TEST_F(LibdhsTest, HeldRowsBeyondTheTailAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(8));
  const uint64_t id = SubmitGranted(16, 80);
  ASSERT_EQ(Append(id, 0, 16), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_hold(w_, id, 16), DHS_OK) << dhs_worker_errmsg(w_);
  // A call that does not fit appends nothing (review finding: it appended 16 .. 47 and dropped their keys).
  EXPECT_EQ(Append(id, 16, 40), DHS_ERR_RESOURCE_EXHAUSTED);
  ASSERT_EQ(Append(id, 16, 32), DHS_OK) << dhs_worker_errmsg(w_);  // 16 .. 47
  EXPECT_EQ(Append(id, 48, 1), DHS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("do not fit the tail"), std::string::npos) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_commit(w_, id, 20), DHS_OK) << dhs_worker_errmsg(w_);  // 16 .. 19 kept
  ASSERT_EQ(Append(id, 20, 40), DHS_OK) << dhs_worker_errmsg(w_);              // 20 .. 59: pages complete again
  ASSERT_NO_FATAL_FAILURE(ExpectRows(id, {0, 15, 16, 19, 20, 33, 47, 59}));
}

// One round at a time (found when the fuzz target's corpus replayed a new call sequence, 2026-12-03): a second hold
// moved the held `from` past held rows, so their pages were never completed, and the next append reusing their tail
// slot read a page the store never grew (SIGSEGV). Now the second hold is refused, nothing changed; the commit
// completes the pages, the tail slots are reused, and every row reads back.
TEST_F(LibdhsTest, ASecondHoldIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(8));
  const uint64_t id = SubmitGranted(16, 80);
  ASSERT_EQ(dhs_request_hold(w_, id, 0), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(Append(id, 0, 32), DHS_OK) << dhs_worker_errmsg(w_);  // pages 0 and 1 held: not completed
  EXPECT_EQ(dhs_request_hold(w_, id, 33), DHS_ERR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("holds a round from 0"), std::string::npos) << dhs_worker_errmsg(w_);
  EXPECT_EQ(Append(id, 32, 2), DHS_ERR_RESOURCE_EXHAUSTED);  // still held: row 32 would reuse row 0's tail slot
  ASSERT_EQ(dhs_request_commit(w_, id, 32), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(Append(id, 32, 32), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(id, {0, 15, 16, 31, 32, 47, 48, 63}));
}

// Staging arenas (ABI 1.5; brief §6 "Staging"): a held speculative round of K_max = 8 queries, each selecting 8 rows
// that are only on host (hisparse: no optional history; the tail holds 64 .. 95), reads 64 distinct rows, twice the
// hot cache (B = 32). Without arenas the union does not fit (RESOURCE_EXHAUSTED, nothing resolved); with χ = 1 it is
// served: the first rows into the hot cache, the rest into the staging arena after the KV pool in the same region
// (a location at or past the KV pool's bytes), every row the bytes appended. memd takes the slot's staging share
// (χ * K_max * k * d_KV = 4096 bytes, 2 pages) inside the admission's required pages.
// ABI 1.8: a drafter's KV ring the engine keeps per slot is declared (Hello.draft_ring_bytes = N shares) and counted
// by memd in each admission's required pages: a hisparse request of 32 rows needs ceil((B + T) / p) = 4 pages and
// ceil(32 * 16 / 2048) = 1 page of index keys; a ring of 16 rows of 512 bytes adds 8192 / 2048 = 4 pages. With a
// budget of 16 pages two plain requests (5 + 5) are granted at once; with the ring (9 + 9) the second waits for the
// first to end. memd refuses a share the Hello did not declare (CheckShare), so the grant shows the declaration too.
TEST_F(LibdhsTest, ADrafterRingCountsInEachAdmission) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  for (const bool drafter : {false, true}) {
    SCOPED_TRACE(drafter);
    dhs_worker_config c = Config(dir_.path(), 16);
    c.mode = DHS_MODE_HISPARSE;
    c.round_queries = 4;  // declared without arenas
    if (drafter) {
      c.draft_ring_rows = 16;
      c.draft_bytes_per_row = 512;
      c.drafter_window = 8;
    }
    ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
    const uint64_t a = SubmitGranted(16, 32);
    dhs_request_desc d = Desc(16, 32);
    uint64_t b = 0;
    ASSERT_EQ(dhs_request_submit(w_, &d, &b), DHS_OK) << dhs_worker_errmsg(w_);
    std::vector<dhs_event> ev = PollFor(1);
    ASSERT_EQ(ev.size(), 1u);
    EXPECT_EQ(ev[0].request, b);
    if (!drafter) {
      EXPECT_EQ(ev[0].kind, DHS_EVENT_GRANTED) << ev[0].message;
    } else {
      EXPECT_EQ(ev[0].kind, DHS_EVENT_WAITING) << ev[0].message;
      ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK) << dhs_worker_errmsg(w_);
      ev = PollFor(1);
      ASSERT_EQ(ev.size(), 1u);
      EXPECT_EQ(ev[0].kind, DHS_EVENT_GRANTED) << ev[0].message;
      EXPECT_EQ(ev[0].request, b);
    }
    ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
    w_ = nullptr;
  }
}

TEST_F(LibdhsTest, StagingArenasServeARoundBeyondTheHotCache) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  for (const uint32_t arenas : {0u, 1u}) {
    SCOPED_TRACE(arenas);
    dhs_worker_config c = Config(dir_.path(), 16);
    c.mode = DHS_MODE_HISPARSE;
    c.staging_arenas = arenas;
    c.round_queries = arenas > 0 ? 8 : 0;
    uint64_t kv_bytes = 0, region_bytes = 0;
    dhs_worker_config plain = c;
    plain.staging_arenas = plain.round_queries = 0;
    ASSERT_EQ(dhs_pool_bytes_needed(&plain, &kv_bytes), DHS_OK);
    ASSERT_EQ(dhs_pool_bytes_needed(&c, &region_bytes), DHS_OK);
    const uint64_t staging = uint64_t{arenas} * c.slots * 8 * kK * kRow;  // M_stage = χ * N * K_max * k * d_KV
    EXPECT_EQ(region_bytes, arenas > 0 ? (kv_bytes + 63) / 64 * 64 + staging : kv_bytes);
    ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
    const uint64_t id = SubmitGranted(96, 128);  // GRANTED: memd took the share (CheckShare refuses a wrong one)
    ASSERT_EQ(Append(id, 0, 96), DHS_OK) << dhs_worker_errmsg(w_);
    ASSERT_NO_FATAL_FAILURE(WaitBackedUp(6));
    ASSERT_EQ(dhs_request_hold(w_, id, 96), DHS_OK) << dhs_worker_errmsg(w_);
    ASSERT_EQ(Append(id, 96, 8), DHS_OK) << dhs_worker_errmsg(w_);  // the round's 8 rows, held
    std::vector<std::vector<int64_t>> sel(8);
    std::vector<int64_t> at(8);
    for (int j = 0; j < 8; ++j) {
      for (int i = 0; i < 8; ++i) sel[j].push_back(i * 8 + j);  // query j: 8 of rows 0 .. 63, none selected twice
      at[j] = 96 + j;
    }
    dhs_pool_desc pool{};
    pool.struct_size = sizeof pool;
    pool.kind = DHS_POOLS_LIBRARY;
    ASSERT_EQ(dhs_pools_register(w_, &pool), DHS_OK);
    EXPECT_EQ(pool.bytes, region_bytes);
    bool staged = false;
    for (uint32_t s = 0; s < kS; ++s) {
      std::vector<std::vector<int64_t>> loc(8, std::vector<int64_t>(8, -7));
      std::vector<dhs_query> q;
      for (int j = 0; j < 8; ++j) q.push_back(dhs_query{id, sel[j].data(), 8, 0, loc[j].data()});
      const int rc = dhs_resolve_at(w_, &s, 1, q.data(), 8, at.data());
      if (arenas == 0) {
        EXPECT_EQ(rc, DHS_ERR_RESOURCE_EXHAUSTED) << dhs_worker_errmsg(w_);
        continue;
      }
      ASSERT_EQ(rc, DHS_OK) << dhs_worker_errmsg(w_);
      for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 8; ++i) {
          const int64_t l = loc[j][i];
          ASSERT_GE(l, 0);
          ASSERT_LE(static_cast<uint64_t>(l) + kRow, pool.bytes);
          staged = staged || static_cast<uint64_t>(l) >= kv_bytes;
          const uint8_t* row = static_cast<const uint8_t*>(pool.base) + l;
          for (uint32_t b = 0; b < kRow; ++b) ASSERT_EQ(row[b], RowByte(id, s, sel[j][i], b)) << sel[j][i];
        }
      }
      ASSERT_EQ(dhs_readers_done(w_, &s, 1), DHS_OK);
    }
    const nlohmann::json st = Stats();
    if (arenas > 0) {
      EXPECT_TRUE(staged);
      EXPECT_EQ(st["staging"]["bytes"], staging);
      EXPECT_EQ(st["staging"]["unions"], 2) << st.dump();          // one per source (group)
      EXPECT_EQ(st["staging"]["rows"], 2 * (64 - kB)) << st.dump();  // past the hot cache's 32, per source
      // The causal mask (dhs_resolve_at): query 0 at 96 may not read 97; without positions the store checks only the
      // appended rows.
      std::vector<int64_t> ahead{97, 1}, loc(2);
      dhs_query q{id, ahead.data(), 2, 0, loc.data()};
      const int64_t at96 = 96;
      const uint32_t s0 = 0;
      EXPECT_EQ(dhs_resolve_at(w_, &s0, 1, &q, 1, &at96), DHS_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("causal"), std::string::npos) << dhs_worker_errmsg(w_);
      const int64_t below = -2;
      EXPECT_EQ(dhs_resolve_at(w_, &s0, 1, &q, 1, &below), DHS_ERR_INVALID_ARGUMENT);
      ASSERT_EQ(dhs_resolve(w_, &s0, 1, &q, 1), DHS_OK) << dhs_worker_errmsg(w_);
      ASSERT_EQ(dhs_readers_done(w_, &s0, 1), DHS_OK);
    } else {
      EXPECT_EQ(st["staging"]["rows"], 0);
    }
    ASSERT_EQ(dhs_request_commit(w_, id, 100), DHS_OK) << dhs_worker_errmsg(w_);  // 4 of the round's rows accepted
    ASSERT_NO_FATAL_FAILURE(ExpectRows(id, {0, 63, 95, 96, 99}));
    EXPECT_EQ(dhs_request_complete(w_, id), DHS_OK);
    ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
    w_ = nullptr;
  }
}

// The threading rules of dhs.h: two threads share one worker (calls serialised by its mutex), each serving its own
// request (append, resolve, check, readers done, poll) with rows of its own pattern; every row read back is the
// thread's own. (The interleaving is whatever the scheduler makes; the assertion is on bytes, never on time. Under
// tools/sanitize.sh tsan this is the race check of the handle's mutex.)
TEST_F(LibdhsTest, TwoThreadsShareOneWorker) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(16));
  const uint64_t ids[2] = {SubmitGranted(16, 80), SubmitGranted(16, 80)};
  dhs_pool_desc pool{};
  pool.struct_size = sizeof pool;
  pool.kind = DHS_POOLS_LIBRARY;
  ASSERT_EQ(dhs_pools_register(w_, &pool), DHS_OK);
  std::atomic<int> bad{0};
  auto serve = [&](uint64_t id) {
    for (int64_t t = 0; t < 80; ++t) {
      const std::vector<uint8_t> row = Rows(id, t, 1);
      if (dhs_request_append(w_, id, t, 1, row.data(), row.size(), nullptr, 0) != DHS_OK) ++bad;
      std::vector<int64_t> sel;  // distinct positions (a selection names a row once), -1 padded to 4
      for (int64_t c : {t, t / 2, t / 3, t - 3}) {
        if (c >= 0 && std::find(sel.begin(), sel.end(), c) == sel.end()) sel.push_back(c);
      }
      sel.resize(4, -1);
      std::vector<int64_t> loc(sel.size());
      for (uint32_t s = 0; s < kS; ++s) {
        dhs_query q{id, sel.data(), static_cast<uint32_t>(sel.size()), 0, loc.data()};
        if (dhs_resolve(w_, &s, 1, &q, 1) != DHS_OK) {
          ++bad;
          continue;
        }
        for (size_t j = 0; j < sel.size(); ++j) {
          if (sel[j] < 0) continue;
          const uint8_t* got = static_cast<const uint8_t*>(pool.base) + loc[j];
          for (uint32_t b = 0; b < kRow; ++b) bad += got[b] != RowByte(id, s, sel[j], b) ? 1 : 0;
        }
        dhs_readers_done(w_, &s, 1);
      }
      dhs_event ev[4];
      size_t n = 0;
      if (dhs_worker_poll(w_, ev, 4, &n) != DHS_OK) ++bad;
    }
  };
  std::thread a(serve, ids[0]), b(serve, ids[1]);
  a.join();
  b.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(Stats()["rows_appended"], 160);
}

// An interrupted request left for the next worker of this GPU: a hisparse request of 64 rows (4 pages, every one
// backed up and confirmed), memd SIGKILLed under it, the worker closed while memd is down (no Complete can reach
// memd). `between` runs while no memd runs (the host pool's bytes may be changed). The next memd adopts the pool and
// keeps the request as interrupted; *interrupted = its id, and a new worker (`c`) is open on that memd.
void LibdhsTest::InterruptAndRestart(const dhs_worker_config& c, uint64_t* interrupted,
                                     const std::function<void()>& between) {
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(BackedUpRequest(&id));
  memd_->Signal(SIGKILL);  // KillMemd's first half: the socket stays until the engine closed (below)
  ASSERT_GE(memd_->WaitExit(5000), -1);
  for (int i = 0; i < 2000 && !Stats()["memd"]["away"].get<bool>(); ++i) {
    dhs_event ev[4];
    size_t n = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK) << dhs_worker_errmsg(w_);  // serving away
    ::poll(nullptr, 0, 2);
  }
  ASSERT_TRUE(Stats()["memd"]["away"].get<bool>());
  EXPECT_EQ(Stats()["memd"]["aways"], 1);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  w_ = nullptr;

  memd_.reset();
  std::filesystem::remove(dir_.path() + "/memd.sock");  // the killed memd's socket: wait for the new one's
  *interrupted = id;
  if (between) ASSERT_NO_FATAL_FAILURE(between());
  ASSERT_NO_FATAL_FAILURE(StartMemd());  // the same run directory: the pool and the journal are adopted
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
}

// memd dies (SIGKILL) under a request whose pages are backed up; the worker serves away (poll answers OK, stats say
// memd.away) but the engine gives up and closes it while memd is down; the next memd of the run directory adopts the
// host pool and its journal, the reopened worker lists the request as resumable, resumes it and reads back the same
// rows (brief §3).
TEST_F(LibdhsTest, MemdRestartLeavesTheRequestResumable) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 16);
  c.mode = DHS_MODE_HISPARSE;  // every complete page backed up at once
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(InterruptAndRestart(c, &id));
  std::vector<dhs_resumable> list(4);
  size_t n = 0, total = 0;
  ASSERT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(list[0].request, id);
  EXPECT_EQ(list[0].input_rows, 64u);
  EXPECT_EQ(list[0].max_rows, 80u);
  dhs_request_desc d = Desc(64, 80, id);
  uint64_t resumed = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &resumed), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_request_submit(w_, &d, &resumed), DHS_ERR_FAILED_PRECONDITION);  // resumed already
  const std::vector<dhs_event> ev = PollFor(1);
  ASSERT_EQ(ev.size(), 1u);
  ASSERT_EQ(ev[0].kind, DHS_EVENT_GRANTED) << ev[0].message;
  EXPECT_EQ(ev[0].pages, 4u);
  ASSERT_EQ(ev[0].import_pages, 4u);
  // Granted: memd handed the interrupted request over, so it is no longer listed (review finding).
  ASSERT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
  EXPECT_EQ(total, 0u);
  EXPECT_EQ(dhs_request_import(w_, resumed, 0, 0, nullptr, 0), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("an import of 0 pages"), std::string::npos)
      << dhs_worker_errmsg(w_);
  std::vector<uint8_t> keys(size_t{4} * kP * kKey);
  ASSERT_EQ(dhs_request_import(w_, resumed, 0, 4, keys.data(), keys.size()), DHS_OK) << dhs_worker_errmsg(w_);
  // The rows of the dead epoch, under the new id: the pattern is keyed by the first id.
  dhs_pool_desc pool{};
  pool.struct_size = sizeof pool;
  pool.kind = DHS_POOLS_LIBRARY;
  ASSERT_EQ(dhs_pools_register(w_, &pool), DHS_OK);
  const std::vector<int64_t> sel = {0, 1, 17, 31, 40, 63, 5, -1};
  std::vector<int64_t> loc(sel.size());
  for (uint32_t s = 0; s < kS; ++s) {
    dhs_query q{resumed, sel.data(), static_cast<uint32_t>(sel.size()), 0, loc.data()};
    ASSERT_EQ(dhs_resolve(w_, &s, 1, &q, 1), DHS_OK) << dhs_worker_errmsg(w_);
    for (size_t j = 0; j + 1 < sel.size(); ++j) {
      const uint8_t* row = static_cast<const uint8_t*>(pool.base) + loc[j];
      for (uint32_t b = 0; b < kRow; ++b) ASSERT_EQ(row[b], RowByte(id, s, sel[j], b)) << sel[j];
    }
    ASSERT_EQ(dhs_readers_done(w_, &s, 1), DHS_OK);
  }
  EXPECT_EQ(dhs_request_complete(w_, resumed), DHS_OK);
}

// Token records (ABI 1.5): an engine's tokens (ids above 255) survive memd and engine restarts with the request.
// The prompt ids given at submit and 3 committed tokens reach memd's journal; memd is SIGKILLed and 2 more are
// committed while it is away (they wait); the restarted memd takes the re-Hello, whose report carries all 5. memd is
// killed again and the engine closes while it is down; the next memd and the reopened worker list the request, and
// dhs_worker_resumable_tokens gives back the 64 prompt ids and the 5 tokens, in order. The resume starts from them:
// its commits continue after the 5 and stop at max_rows - input_rows = 16.
TEST_F(LibdhsTest, TokenRecordsSurviveMemdAndEngineRestarts) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 16);
  c.mode = DHS_MODE_HISPARSE;
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  std::vector<int32_t> prompt(64);
  for (int i = 0; i < 64; ++i) prompt[i] = 100000 + 37 * i;
  dhs_request_desc d = Desc(64, 80);
  d.tokens = prompt.data();
  d.token_count = prompt.size();
  uint64_t id = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &id), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(PollFor(1).at(0).kind, DHS_EVENT_GRANTED);
  ASSERT_EQ(Append(id, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
  const int32_t first[] = {200000, 7}, second[] = {300}, away[] = {65535, -5};  // any int32, kept as given
  ASSERT_EQ(dhs_request_commit_tokens(w_, id, first, nullptr, 2), DHS_OK) << dhs_worker_errmsg(w_);
  const uint64_t digest = 0xd16e57;
  ASSERT_EQ(dhs_request_commit_tokens(w_, id, second, &digest, 1), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_request_commit_tokens(w_, id, nullptr, nullptr, 1), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_commit_tokens(w_, id + 99, first, nullptr, 2), DHS_ERR_NOT_FOUND);
  // Until memd answered (journaled) every token sent: a kill before then could lose them (as workerd's steps).
  ASSERT_NO_FATAL_FAILURE(WaitTokensAcknowledged(3));
  ASSERT_NO_FATAL_FAILURE(WaitBackedUp(4));

  // memd dies; the engine commits 2 tokens while it is away; the next memd takes the re-Hello with all 5.
  ASSERT_NO_FATAL_FAILURE(KillMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  ASSERT_EQ(dhs_request_commit_tokens(w_, id, away, nullptr, 2), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(Stats()["tokens"]["acknowledged"], 3);  // waits for the re-Hello
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["returns"] == 1; }, 10000));  // the re-Hello backs off
  ASSERT_EQ(Stats()["memd"]["returns"], 1) << Stats().dump();
  EXPECT_EQ(Stats()["tokens"]["acknowledged"], 5);  // in the report

  // memd dies again and the engine gives up while it is down: the request stays interrupted at the next memd.
  ASSERT_NO_FATAL_FAILURE(NewEpoch(c));
  std::vector<int32_t> got(80, -9);
  size_t count = 0, total = 0, prompt_tokens = 0;
  ASSERT_EQ(dhs_worker_resumable_tokens(w_, id, got.data(), got.size(), &count, &total, &prompt_tokens), DHS_OK)
      << dhs_worker_errmsg(w_);
  ASSERT_EQ(total, 69u);
  ASSERT_EQ(count, 69u);
  ASSERT_EQ(prompt_tokens, 64u);
  std::vector<int32_t> want = prompt;
  want.insert(want.end(), {200000, 7, 300, 65535, -5});
  got.resize(count);
  EXPECT_EQ(got, want);
  ASSERT_EQ(dhs_worker_resumable_tokens(w_, id, got.data(), 10, &count, &total, &prompt_tokens), DHS_OK);
  EXPECT_EQ(count, 10u);  // capacity bounds the copy; total says how many there are
  EXPECT_EQ(total, 69u);
  EXPECT_EQ(dhs_worker_resumable_tokens(w_, id + 1, got.data(), 10, &count, &total, &prompt_tokens),
            DHS_ERR_NOT_FOUND);
  EXPECT_EQ(dhs_worker_resumable_tokens(w_, id, got.data(), 10, nullptr, &total, &prompt_tokens),
            DHS_ERR_INVALID_ARGUMENT);

  // The resume carries the 5 tokens and the prompt ids on: 11 more fit (16 in all), a 12th does not.
  dhs_request_desc r = Desc(64, 80, id);
  uint64_t resumed = 0;
  ASSERT_EQ(dhs_request_submit(w_, &r, &resumed), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(PollFor(1).at(0).kind, DHS_EVENT_GRANTED);
  const std::vector<int32_t> more(12, 42);
  EXPECT_EQ(dhs_request_commit_tokens(w_, resumed, more.data(), nullptr, 12), DHS_ERR_OUT_OF_RANGE);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("5 tokens committed and 12 more"), std::string::npos)
      << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_commit_tokens(w_, resumed, more.data(), nullptr, 11), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(WaitTokensAcknowledged(11));
  // memd's record of the resumed request holds the 5 carried and the 11 new ones (a gap would have been refused):
  // seen by the next epoch once memd and the engine are gone again.
  ASSERT_NO_FATAL_FAILURE(NewEpoch(c));
  got.assign(100, -9);
  ASSERT_EQ(dhs_worker_resumable_tokens(w_, resumed, got.data(), got.size(), &count, &total, &prompt_tokens), DHS_OK)
      << dhs_worker_errmsg(w_);
  got.resize(count);
  want.insert(want.end(), more.begin(), more.end() - 1);
  EXPECT_EQ(prompt_tokens, 64u);
  EXPECT_EQ(got, want);
  ASSERT_NO_FATAL_FAILURE(DropInterruptedPool());
}

// Token records at memd's bound (review finding, 2026-12-03: a commit memd refused for its record bound was lost
// from the record while the engine had been told OK, and every later commit was refused as a gap). The library
// refuses, at the call, a commit that would pass memd's bound on one record (common/record_bounds.h: 4 MiB, 12 bytes
// an engine token): 349525 tokens fill it exactly and memd acknowledges all of them (its own RequestRecord::bytes
// agrees at the boundary); one more is RESOURCE_EXHAUSTED, nothing committed.
TEST_F(LibdhsTest, TokenRecordsStopAtMemdsBound) {
  constexpr uint32_t kFits = (uint64_t{4} << 20) / 12;  // 349525
  constexpr uint64_t kMaxRows = 16 + kFits + 1;           // room for one token past the bound
  // memd's host pool holds the context's pages (21848 of 2304 bytes: 50 MB) and M its index keys' (2731 pages).
  ASSERT_NO_FATAL_FAILURE(StartMemd({}, static_cast<uint32_t>(kMaxRows / kP + 8)));
  dhs_worker_config c = Config(dir_.path(), 2800);
  c.mode = DHS_MODE_HISPARSE;
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  const uint64_t id = SubmitGranted(16, kMaxRows);
  ASSERT_EQ(Append(id, 0, 16), DHS_OK) << dhs_worker_errmsg(w_);
  std::vector<int32_t> tokens(kFits);
  for (uint32_t i = 0; i < kFits; ++i) tokens[i] = static_cast<int32_t>(i * 2654435761u);
  ASSERT_EQ(dhs_request_commit_tokens(w_, id, tokens.data(), nullptr, kFits - 1), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_request_commit_tokens(w_, id, tokens.data(), nullptr, 2), DHS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("over memd's bound of 4194304"), std::string::npos)
      << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_commit_tokens(w_, id, tokens.data() + kFits - 1, nullptr, 1), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_request_commit_tokens(w_, id, tokens.data(), nullptr, 1), DHS_ERR_RESOURCE_EXHAUSTED);
  ASSERT_NO_FATAL_FAILURE(WaitTokensAcknowledged(kFits));
  EXPECT_EQ(Stats()["tokens"]["refused"], 0) << Stats().dump();
  ASSERT_NO_FATAL_FAILURE(NewEpoch(c));
  std::vector<int32_t> got(16 + kFits + 1);
  size_t count = 0, total = 0, prompt_tokens = 0;
  ASSERT_EQ(dhs_worker_resumable_tokens(w_, id, got.data(), got.size(), &count, &total, &prompt_tokens), DHS_OK)
      << dhs_worker_errmsg(w_);
  got.resize(count);
  EXPECT_EQ(prompt_tokens, 0u);  // the submit gave no prompt tokens
  EXPECT_EQ(got, tokens);
  ASSERT_NO_FATAL_FAILURE(DropInterruptedPool());
}

// memd refuses one request's tokens in a message of several (its journal write fails: the request's record file is
// made a directory, as a full or broken disk would fail it). memd's ErrorReply does not say whose entry it refused:
// the library sends each request of the message again alone; the refused one keeps memd's reason (its later commits
// are refused with it, FAILED_PRECONDITION), the other loses nothing (memd takes the equal resend).
TEST_F(LibdhsTest, TokensMemdRefusesAreNotLostSilently) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(16));
  const uint64_t a = SubmitGranted(16, 80), b = SubmitGranted(16, 80);
  const int32_t first[] = {1, 2}, second[] = {3, 4, 5};
  ASSERT_EQ(dhs_request_commit_tokens(w_, a, first, nullptr, 2), DHS_OK);
  ASSERT_EQ(dhs_request_commit_tokens(w_, b, first, nullptr, 2), DHS_OK);
  ASSERT_NO_FATAL_FAILURE(WaitTokensAcknowledged(4));
  char name[32];
  std::snprintf(name, sizeof name, "/records/%016llx.rec", static_cast<unsigned long long>(a));
  const std::string a_file = dir_.path() + name;
  ASSERT_TRUE(std::filesystem::remove(a_file));
  ASSERT_TRUE(std::filesystem::create_directory(a_file));  // memd's next append to a's record fails
  // b's first token goes at once (nothing in flight); a's 3 and b's next 2 wait for its answer and then go in one
  // TokensCommitted: refused; then each alone: a refused, b acknowledged.
  ASSERT_EQ(dhs_request_commit_tokens(w_, b, second, nullptr, 1), DHS_OK);
  ASSERT_EQ(dhs_request_commit_tokens(w_, a, second, nullptr, 3), DHS_OK);
  ASSERT_EQ(dhs_request_commit_tokens(w_, b, second + 1, nullptr, 2), DHS_OK);
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["tokens"]["records_refused"] == 1 &&
                                                 Stats()["tokens"]["acknowledged"] == 7; }));
  const nlohmann::json st = Stats()["tokens"];
  EXPECT_EQ(st["records_refused"], 1) << st;
  EXPECT_EQ(st["acknowledged"], 7) << st;  // b's 3, not a's
  EXPECT_EQ(st["refused"], 2) << st;       // the message of both, then a's alone
  const int32_t more = 6;
  EXPECT_EQ(dhs_request_commit_tokens(w_, a, &more, nullptr, 1), DHS_ERR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("memd refused its token record"), std::string::npos)
      << dhs_worker_errmsg(w_);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("holds the first 2 tokens"), std::string::npos)
      << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_commit_tokens(w_, b, &more, nullptr, 1), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(WaitTokensAcknowledged(8));
  // memd restarts (its record file writable again): the re-Hello's report carries a's 5 tokens and the new memd takes
  // them, so a's refusal is over (review finding: it stayed, and a's later tokens were refused for good).
  std::filesystem::remove(a_file);
  memd_->Signal(SIGKILL);
  ASSERT_GE(memd_->WaitExit(5000), -1);
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  std::filesystem::remove(dir_.path() + "/memd.sock");
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["returns"] == 1; }));
  EXPECT_EQ(Stats()["memd"]["reports_refused"], 0);
  ASSERT_EQ(dhs_request_commit_tokens(w_, a, &more, nullptr, 1), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(WaitTokensAcknowledged(8 + 3 + 1));  // the report's 3 of a, then a's 6th
  EXPECT_EQ(dhs_request_complete(w_, a), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
}

// The bytes of memd's host-pool segment for `run_dir` (memd/pool_segment.cc PoolSegmentName: "dhs-pool-" and the hex
// of the first 8 bytes of SHA-256 of the canonical run directory), mapped shared: a write changes the pool memd adopts.
std::string PoolSegmentPath(const std::string& run_dir) {
  const std::string canonical = std::filesystem::canonical(run_dir).string();
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(canonical.data(), canonical.size(), digest, &length, EVP_sha256(), nullptr);
  char name[64] = "/dev/shm/dhs-pool-";
  for (int i = 0; i < 8; ++i) std::snprintf(name + 18 + 2 * i, 3, "%02x", digest[i]);
  return name;
}

struct MappedSegment {
  explicit MappedSegment(const std::string& run_dir) {
    const int fd = ::open(PoolSegmentPath(run_dir).c_str(), O_RDWR);
    if (fd < 0) return;
    struct stat st{};
    if (::fstat(fd, &st) == 0) {
      void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m != MAP_FAILED) bytes = std::span<uint8_t>(static_cast<uint8_t*>(m), static_cast<size_t>(st.st_size));
    }
    ::close(fd);
  }
  ~MappedSegment() {
    if (!bytes.empty()) ::munmap(bytes.data(), bytes.size());
  }
  std::span<uint8_t> bytes;
};

// ABI 1.4, the import plan (dhs_request_import_plan): an interrupted request's page 1 changed in the host pool while
// no memd ran (one byte of position 16, source 0). The resume's grant checks every page against memd's checksum:
// page 1 does not match, so the plan of a 64-row prefill is the runs {page 0} and {page 2} (page 3 holds the last
// row: computed); the event's leading run is page 0 alone. The engine walks the plan: imports page 0, appends rows
// 16 .. 31 itself, imports page 2, appends 48 .. 63; every row of both sources then reads back the first worker's
// bytes (the corrupted copy never served), and page 1 cannot be imported.
TEST_F(LibdhsTest, ImportPlanSkipsAPageThatFailsItsChecksum) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 16);
  c.mode = DHS_MODE_HISPARSE;
  uint64_t id = 0;
  int corrupted = 0;
  ASSERT_NO_FATAL_FAILURE(InterruptAndRestart(c, &id, [&] {
    MappedSegment seg(dir_.path());
    ASSERT_FALSE(seg.bytes.empty()) << "memd's host-pool segment for " << dir_.path() << " is not in /dev/shm";
    uint8_t want[kRow];
    for (uint32_t b = 0; b < kRow; ++b) want[b] = RowByte(id, 0, 16, b);
    for (size_t at = 0; at + kRow <= seg.bytes.size(); ++at) {
      if (std::memcmp(seg.bytes.data() + at, want, kRow) == 0) {
        seg.bytes[at + 5] ^= 0x40;  // position 16, source 0, byte 5
        ++corrupted;
      }
    }
  }));
  ASSERT_EQ(corrupted, 1) << "position 16's row of source 0 is not once in the host pool";
  dhs_request_desc d = Desc(64, 80, id);
  uint64_t resumed = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &resumed), DHS_OK) << dhs_worker_errmsg(w_);
  const std::vector<dhs_event> ev = PollFor(1);
  ASSERT_EQ(ev.size(), 1u);
  ASSERT_EQ(ev[0].kind, DHS_EVENT_GRANTED) << ev[0].message;
  EXPECT_EQ(ev[0].pages, 3u);         // pages 0, 2, 3 matched their checksums
  EXPECT_EQ(ev[0].import_pages, 1u);  // the leading run: page 0 only

  // Bad input first: nothing planned, a clear error.
  dhs_host_run runs[4];
  size_t n = 9, total = 9;
  EXPECT_EQ(dhs_request_import_plan(w_, resumed, 0, runs, 4, &n, &total), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_import_plan(w_, resumed, 81, runs, 4, &n, &total), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("max_rows"), std::string::npos) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_request_import_plan(w_, resumed, 64, runs, 4, nullptr, &total), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_import_plan(w_, resumed, 64, nullptr, 4, &n, &total), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_import_plan(w_, resumed + 999, 64, runs, 4, &n, &total), DHS_ERR_NOT_FOUND);
  // Capacity 1: one run copied, both counted.
  ASSERT_EQ(dhs_request_import_plan(w_, resumed, 64, runs, 1, &n, &total), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(total, 2u);
  // A 65-row prefill would import page 3 too (its last row is then row 64).
  ASSERT_EQ(dhs_request_import_plan(w_, resumed, 65, runs, 4, &n, &total), DHS_OK);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(runs[1].first_page, 2u);
  EXPECT_EQ(runs[1].pages, 2u);
  ASSERT_EQ(dhs_request_import_plan(w_, resumed, 64, runs, 4, &n, &total), DHS_OK);
  ASSERT_EQ(n, 2u);
  EXPECT_EQ(runs[0].first_page, 0u);
  EXPECT_EQ(runs[0].pages, 1u);
  EXPECT_EQ(runs[1].first_page, 2u);
  EXPECT_EQ(runs[1].pages, 1u);

  // The prefill along the plan; the rows outside the runs are the engine's (the first worker's bytes).
  const auto append = [&](int64_t first, uint32_t count) {
    const std::vector<uint8_t> rows = Rows(id, first, count);
    return dhs_request_append(w_, resumed, first, count, rows.data(), rows.size(), nullptr, 0);
  };
  int64_t at = 0;
  for (size_t r = 0; r < n; ++r) {
    const int64_t start = int64_t{runs[r].first_page} * kP;
    if (r == 1) {  // page 1 (mismatched) is no host-backed page: refused at its rows (16), nothing imported
      ASSERT_EQ(at, 16);
      EXPECT_EQ(dhs_request_import(w_, resumed, 1, 1, nullptr, 0), DHS_ERR_FAILED_PRECONDITION);
      EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("failed its checksum"), std::string::npos)
          << dhs_worker_errmsg(w_);
    }
    if (at < start) ASSERT_EQ(append(at, static_cast<uint32_t>(start - at)), DHS_OK) << dhs_worker_errmsg(w_);
    ASSERT_EQ(dhs_request_import(w_, resumed, runs[r].first_page, runs[r].pages, nullptr, 0), DHS_OK)
        << dhs_worker_errmsg(w_);
    at = start + int64_t{runs[r].pages} * kP;
  }
  ASSERT_EQ(at, 48);
  ASSERT_EQ(append(48, 16), DHS_OK) << dhs_worker_errmsg(w_);
  std::vector<int64_t> sel;
  for (int64_t t = 0; t < 64; ++t) {
    sel.push_back(t);
    if (sel.size() == kK) {
      ASSERT_NO_FATAL_FAILURE(ExpectRows(resumed, sel, id));
      sel.clear();
    }
  }
  const nlohmann::json st = Stats();
  EXPECT_EQ(st["host_backed"]["verified"], 3);
  EXPECT_EQ(st["host_backed"]["mismatched"], 1);
  EXPECT_EQ(st["host_backed"]["imported"], 2);
  EXPECT_EQ(dhs_request_complete(w_, resumed), DHS_OK);
}

// A request completed and the worker closed at once (an engine that ends its last request and exits): memd must end
// the request, not keep it as interrupted. The interleaving that lost it is forced: memd is SIGSTOPped while the
// engine completes and closes, so that when it runs again the Complete is queued on its socket and the connection's
// close is queued on its monitor together. memd used to take the close first (fence: the request kept as
// interrupted, its host pages held for a resume, listed to the GPU's next worker); the close now waits for the
// messages already queued. The next worker of the GPU lists nothing to resume and memd holds no host page.
TEST_F(LibdhsTest, CompleteThenCloseEndsTheRequestAtMemd) {
  dhs_worker_config c = Config(dir_.path(), 16);
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithBackedUpRequest(&c, &id));
  ASSERT_EQ(memd_->Signal(SIGSTOP), 0);
  ASSERT_EQ(dhs_request_complete(w_, id), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  w_ = nullptr;
  ::poll(nullptr, 0, 200);  // the engine's socket closed: its bytes and its end wait in memd's kernel buffer
  ASSERT_EQ(memd_->Signal(SIGCONT), 0);
  ::poll(nullptr, 0, 300);
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectNothingKeptFor(id));
}

// A request completed while memd is alive, whose Complete memd never read: memd is SIGSTOPped while the engine
// completes it and SIGKILLed before it runs again. The next memd lists the request as interrupted in its reply to the
// re-Hello; this worker ended it (workerd's PlanReturn: ended here), so it sends the Complete again instead of listing
// it resumable (review finding: libdhs kept it resumable and memd its host pages, while workerd ended it). Nothing is
// resumable, and memd, stopped with no request left, removes its host pool.
TEST_F(LibdhsTest, ACompleteTheDeadMemdNeverReadIsSentAgainAtTheReHello) {
  dhs_worker_config c = Config(dir_.path(), 16);
  uint64_t id = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithBackedUpRequest(&c, &id));
  ASSERT_EQ(memd_->Signal(SIGSTOP), 0);
  ASSERT_EQ(dhs_request_complete(w_, id), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(KillMemd());  // the Complete dies unread with it
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["returns"] == 1; }, 10000));
  ASSERT_EQ(Stats()["memd"]["returns"], 1);
  ASSERT_NO_FATAL_FAILURE(PollUntil([] { return false; }, 50));  // memd reads the Complete
  ASSERT_NO_FATAL_FAILURE(ExpectNothingKeptFor(id));
}

// A request completed while memd still queues it: the admission is dropped, and the id is unknown afterwards.
// ABI 1.6: workerd's recorder over the engine's events. A request submitted, granted, its tokens committed in two
// calls (2, then 3) and completed gives one admission wait, one TTFT (its first token), four TPOTs (the second token
// of the first call and the three of the second; those after the first of a call are 0 us apart); a request memd
// rejects (its max_rows beyond the host pool) ends as a failure by reason; each histogram's counts sum to its count,
// and the timelines say submitted, first_token and end with the tokens committed.
TEST_F(LibdhsTest, LatencyFiguresAndTimelinesFollowTheEnginesEvents) {
  ASSERT_NO_FATAL_FAILURE(StartMemd({}, 64));
  ASSERT_NO_FATAL_FAILURE(Open(8));
  const uint64_t id = SubmitGranted(16, 40);
  ASSERT_EQ(Append(id, 0, 16), DHS_OK) << dhs_worker_errmsg(w_);
  const int32_t first[] = {7, 8}, second[] = {9, 10, 11};
  ASSERT_EQ(dhs_request_commit_tokens(w_, id, first, nullptr, 2), DHS_OK) << dhs_worker_errmsg(w_);
  ::poll(nullptr, 0, 20);  // the second call comes later: its first token's TPOT is at least 20 ms
  ASSERT_EQ(dhs_request_commit_tokens(w_, id, second, nullptr, 3), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_complete(w_, id), DHS_OK);
  // 100000 rows need 6250 pages of 16 rows; memd's host pool has 64: memd rejects it.
  dhs_request_desc big = Desc(16, 100000);
  uint64_t rejected = 0;
  ASSERT_EQ(dhs_request_submit(w_, &big, &rejected), DHS_OK) << dhs_worker_errmsg(w_);
  const std::vector<dhs_event> ev = PollFor(1);
  ASSERT_EQ(ev.size(), 1u);
  ASSERT_EQ(ev[0].kind, static_cast<uint32_t>(DHS_EVENT_REJECTED)) << ev[0].message;

  const nlohmann::json st = Stats();
  const nlohmann::json& lat = st["latency_us"];
  EXPECT_EQ(lat["admission_wait"]["count"], 1);
  EXPECT_EQ(lat["ttft"]["count"], 1);
  EXPECT_EQ(lat["tpot"]["count"], 4);
  EXPECT_GE(lat["tpot"]["sum"].get<uint64_t>(), 20000u);  // the pause between the two calls
  for (const char* h : {"admission_wait", "ttft", "tpot"}) {
    const nlohmann::json& x = lat[h];
    ASSERT_EQ(x["counts"].size(), x["bounds"].size() + 1) << h;
    uint64_t n = 0;
    for (const auto& c : x["counts"]) n += c.get<uint64_t>();
    EXPECT_EQ(n, x["count"].get<uint64_t>()) << h;
  }
  EXPECT_EQ(st["requests"]["ended"], 2);
  EXPECT_EQ(st["requests"]["rejected"], 1);
  ASSERT_EQ(st["requests"]["failures"].size(), 1u) << st["requests"].dump();
  EXPECT_EQ(st["requests"]["failures"].begin().value(), 1);

  const nlohmann::json tl = Timeline(id);
  ASSERT_EQ(tl["timelines"].size(), 1u) << tl.dump();
  const nlohmann::json& events = tl["timelines"][0]["events"];
  ASSERT_EQ(events.size(), 3u) << tl.dump();
  EXPECT_EQ(events[0]["event"], "submitted");
  EXPECT_EQ(events[1]["event"], "first_token");
  EXPECT_EQ(events[2]["event"], "end");
  EXPECT_EQ(events[2]["pages"], 5);  // tokens committed
  EXPECT_EQ(events[2]["detail"], "ok");
  const nlohmann::json tr = Timeline(rejected);
  ASSERT_EQ(tr["timelines"].size(), 1u);
  EXPECT_NE(tr["timelines"][0]["events"].back()["detail"].get<std::string>(), "ok");
  EXPECT_TRUE(Timeline(12345)["timelines"].empty());
  size_t need = 0;
  EXPECT_EQ(dhs_request_timeline_json(w_, id, nullptr, 0, nullptr), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_timeline_json(nullptr, id, nullptr, 0, &need), DHS_ERR_INVALID_ARGUMENT);
}

// Reports memd refuses (review finding, 2026-12-03): memd is SIGKILLed under two granted requests, the engine
// completes one of them while memd is away, and the next memd starts with --reserve-pages 15 of the 16 GPU pages, so
// neither report fits. The open request fails (FAILED, aborted) and counts as ended (requests.ended = completed +
// failed + rejected; before, a refused report was a failure that never ended); the one the engine completed gets its
// Complete at memd (before, memd kept it as interrupted: listed resumable, its host pages kept), so only the failed
// one is resumable, with its record's sizes (before, a re-Hello left the records out: 0 rows).
TEST_F(LibdhsTest, RefusedReportsEndTheirRequests) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 16);
  c.mode = DHS_MODE_HISPARSE;  // every complete page backed up at once
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  const uint64_t a = SubmitGranted(64, 128);
  const uint64_t b = SubmitGranted(16, 32);
  ASSERT_EQ(Append(a, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(Append(b, 0, 16), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(WaitBackedUp(5));
  ASSERT_NO_FATAL_FAILURE(KillMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  ASSERT_EQ(dhs_request_complete(w_, b), DHS_OK) << dhs_worker_errmsg(w_);  // ends after the re-Hello
  ASSERT_NO_FATAL_FAILURE(StartMemd({"--reserve-pages", "15"}));
  std::vector<dhs_event> events;
  for (int i = 0; i < 3000 && Stats()["memd"]["returns"] == 0; ++i) {
    dhs_event ev[4];
    size_t n = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK) << dhs_worker_errmsg(w_);
    events.insert(events.end(), ev, ev + n);
    ::poll(nullptr, 0, 2);
  }
  const nlohmann::json st = Stats();
  ASSERT_EQ(st["memd"]["returns"], 1) << st.dump();
  EXPECT_EQ(st["memd"]["reports_refused"], 2) << st.dump();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, static_cast<uint32_t>(DHS_EVENT_FAILED));
  EXPECT_EQ(events[0].request, a);
  EXPECT_EQ(events[0].code, DHS_ERR_ABORTED) << events[0].message;
  const nlohmann::json& r = st["requests"];
  EXPECT_EQ(r["completed"], 1);
  EXPECT_EQ(r["failed"], 1);
  EXPECT_EQ(r["ended"].get<uint64_t>(),
            r["completed"].get<uint64_t>() + r["failed"].get<uint64_t>() + r["rejected"].get<uint64_t>());
  EXPECT_EQ(r["failures"]["aborted"], 1) << r.dump();
  std::vector<dhs_resumable> list(4);
  size_t n = 0, total = 0;
  ASSERT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(list[0].request, a);
  EXPECT_EQ(list[0].input_rows, 64u);
  EXPECT_EQ(list[0].max_rows, 128u);
  ASSERT_NO_FATAL_FAILURE(DropInterruptedPool());  // a stays interrupted (never resumed here)
}

// A resume that memd queued (its AdmitRequest journaled: memd took the interrupted request's host pages over for it)
// when memd dies. The new memd lists the resume's own id as interrupted (it holds the pages now). Sending the
// admission again as a resume of the first request would be rejected (memd knows it no more), and ending the resume
// would free the pages (review finding: the re-Hello did both, and the request was lost). PlanReturn ends it like a
// refused report instead: FAILED naming why, listed resumable with its sizes, and its resume is granted with the 4
// host pages, whose rows are the first request's.
TEST_F(LibdhsTest, AQueuedResumeSurvivesAMemdRestart) {
  dhs_worker_config c = Config(dir_.path(), 16);
  uint64_t x = 0, a = 0, b = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithInterruptedAndTwoGranted(&c, &x, &a, &b));
  dhs_request_desc d = Desc(64, 80, x);
  uint64_t y = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &y), DHS_OK) << dhs_worker_errmsg(w_);
  std::vector<dhs_event> seen;
  auto poll_some = [&](int n, int sleep_ms) { PollInto(seen, n, sleep_ms); };
  ASSERT_NO_FATAL_FAILURE(poll_some(50, 5));  // memd journals y's admission (it waits for a slot)
  for (const dhs_event& e : seen) {
    if (e.request == y) ASSERT_EQ(e.kind, static_cast<uint32_t>(DHS_EVENT_WAITING)) << "y answered: " << e.message;
  }
  ASSERT_NO_FATAL_FAILURE(KillMemd());
  for (int i = 0; i < 2000 && !Stats()["memd"]["away"].get<bool>(); ++i) ASSERT_NO_FATAL_FAILURE(poll_some(1, 2));
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  for (int i = 0; i < 3000 && Stats()["memd"]["returns"] < 1; ++i) ASSERT_NO_FATAL_FAILURE(poll_some(1, 2));
  ASSERT_EQ(Stats()["memd"]["returns"], 1);
  bool failed = false;
  for (const dhs_event& e : seen) {
    if (e.request != y) continue;
    ASSERT_EQ(e.kind, e.kind == DHS_EVENT_WAITING ? e.kind : static_cast<uint32_t>(DHS_EVENT_FAILED)) << e.message;
    if (e.kind != DHS_EVENT_FAILED) continue;
    failed = true;
    EXPECT_NE(std::string(e.message).find("this resume waited for its grant when memd died"), std::string::npos)
        << e.message;
  }
  ASSERT_TRUE(failed) << "the queued resume was neither resumed nor failed";
  std::vector<dhs_resumable> list(4);
  size_t n = 0, total = 0;
  ASSERT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(list[0].request, y);
  EXPECT_EQ(list[0].input_rows, 64u);
  EXPECT_EQ(list[0].max_rows, 80u);
  ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK) << dhs_worker_errmsg(w_);  // a slot for the resume
  dhs_request_desc again = Desc(64, 80, y);
  uint64_t z = 0;
  ASSERT_EQ(dhs_request_submit(w_, &again, &z), DHS_OK) << dhs_worker_errmsg(w_);
  const std::vector<dhs_event> ev = PollFor(1);
  ASSERT_EQ(ev.size(), 1u);
  ASSERT_EQ(ev[0].kind, DHS_EVENT_GRANTED) << ev[0].message;
  EXPECT_EQ(ev[0].request, z);
  ASSERT_EQ(ev[0].import_pages, 4u) << "x's host pages were not kept for the resume";
  std::vector<uint8_t> keys(size_t{4} * kP * kKey);
  ASSERT_EQ(dhs_request_import(w_, z, 0, 4, keys.data(), keys.size()), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(z, {0, 1, 17, 31, 40, 63, -1}, x));
  EXPECT_EQ(dhs_request_complete(w_, z), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
}

// A resume whose admission memd never read (memd SIGSTOPped while it is submitted, then SIGKILLed): the new memd still
// lists the first request x as interrupted, and the re-Hello sends the resume's admission again, which takes x over.
// PlanReturn lists x neither resumable nor ended; the library lists only PlanReturn's resumable requests (review
// finding, 2026-12-03: it listed memd's whole list, so x was offered while its resume waited), a second resume of x
// is refused (resumed already), and the resume, granted once a slot frees, imports x's 4 host pages: x's rows.
TEST_F(LibdhsTest, AResumeWaitingAtTheReHelloKeepsItsRequestOffTheList) {
  dhs_worker_config c = Config(dir_.path(), 16);
  uint64_t x = 0, a = 0, b = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithInterruptedAndTwoGranted(&c, &x, &a, &b));
  ASSERT_EQ(memd_->Signal(SIGSTOP), 0);
  dhs_request_desc d = Desc(64, 80, x);
  uint64_t y = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &y), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(KillMemd());  // y's admission dies unread with it
  std::vector<dhs_event> seen;
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  for (int i = 0; i < 3000 && Stats()["memd"]["returns"] < 1; ++i) ASSERT_NO_FATAL_FAILURE(PollInto(seen, 1, 2));
  ASSERT_EQ(Stats()["memd"]["returns"], 1);
  ASSERT_NO_FATAL_FAILURE(PollInto(seen, 20, 5));  // memd queues y (both slots are held)
  for (const dhs_event& e : seen) {
    EXPECT_EQ(e.kind, static_cast<uint32_t>(DHS_EVENT_WAITING)) << "request " << e.request << ": " << e.message;
  }
  std::vector<dhs_resumable> list(4);
  size_t n = 0, total = 0;
  ASSERT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
  EXPECT_EQ(total, 0u) << "listed: " << (n > 0 ? list[0].request : 0) << " (x = " << x << ")";
  dhs_request_desc twice = Desc(64, 80, x);
  uint64_t z = 0;
  EXPECT_EQ(dhs_request_submit(w_, &twice, &z), DHS_ERR_FAILED_PRECONDITION) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK) << dhs_worker_errmsg(w_);  // a slot for the resume
  ASSERT_NO_FATAL_FAILURE(PollUntilGranted(y));
  std::vector<uint8_t> keys(size_t{4} * kP * kKey);
  ASSERT_EQ(dhs_request_import(w_, y, 0, 4, keys.data(), keys.size()), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(y, {0, 1, 17, 31, 40, 63, -1}, x));
  EXPECT_EQ(dhs_request_complete(w_, y), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
}

// A rejected resume leaves its request listed exactly while memd holds it (review finding, 2026-12-04): a bad resume
// (a context of 2 pages, x kept host page 3) is refused before memd changes anything, and x stays listed; a resume
// that can never fit (more host pages than memd's pool) is rejected after memd took x over, and the reject names x
// (AdmitReject.took_over): x is gone at memd and no longer listed, so a third resume is refused here (NOT_FOUND),
// not by memd's "unknown". Before, x stayed listed after the second reject.
TEST_F(LibdhsTest, ARejectedResumeListsItsRequestWhileMemdHoldsIt) {
  dhs_worker_config c = Config(dir_.path(), 16);
  uint64_t x = 0, a = 0, b = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithInterruptedAndTwoGranted(&c, &x, &a, &b));
  const auto rejected = [&](uint64_t id) {
    const std::vector<dhs_event> ev = PollFor(1);
    EXPECT_EQ(ev.size(), 1u);
    if (ev.empty()) return std::string("no event");
    EXPECT_EQ(ev[0].request, id);
    EXPECT_EQ(ev[0].kind, static_cast<uint32_t>(DHS_EVENT_REJECTED)) << ev[0].message;
    return std::string(ev[0].message);
  };
  ASSERT_EQ(ListedIds(), std::set<uint64_t>{x});
  dhs_request_desc bad = Desc(16, 32, x);
  uint64_t y = 0;
  ASSERT_EQ(dhs_request_submit(w_, &bad, &y), DHS_OK) << dhs_worker_errmsg(w_);
  const std::string why_bad = rejected(y);
  EXPECT_NE(why_bad.find("kept a host copy of history page"), std::string::npos) << why_bad;  // memd's CheckResume
  EXPECT_EQ(ListedIds(), std::set<uint64_t>{x}) << "memd still holds x";
  dhs_request_desc never = Desc(64, uint64_t{kP} * 300, x);  // 300 pages of context, memd's pool has 256
  uint64_t z = 0;
  ASSERT_EQ(dhs_request_submit(w_, &never, &z), DHS_OK) << dhs_worker_errmsg(w_);
  const std::string why_never = rejected(z);
  EXPECT_NE(why_never.find("it can never fit"), std::string::npos) << why_never;
  EXPECT_TRUE(ListedIds().empty()) << "memd ended x with the resume it took it over for";
  dhs_request_desc third = Desc(64, 80, x);
  uint64_t v = 0;
  EXPECT_EQ(dhs_request_submit(w_, &third, &v), DHS_ERR_NOT_FOUND) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_request_complete(w_, a), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
}

// A request completed while it waited for its grant, its Complete unread (memd SIGSTOPped, then SIGKILLed): the
// second memd lists it interrupted and the re-Hello ends it (StaleGrant). With two deaths, that memd too is stopped
// before it reads the Complete and killed; the third memd lists it again, when StaleGrant is forgotten
// (ForgetUnacknowledged) and the agent never ended it: libdhs remembers the Completes it sent itself (PlanReturn's
// ended_here; review finding: it was left interrupted at memd, and the GPU's next worker listed a request the engine
// had completed). Either way nothing is resumable, now or for the next worker.
TEST_F(LibdhsTest, ACompletedWaitingRequestStaysEndedAcrossOneMemdDeath) { CompletedWaitingStaysEnded(false); }
TEST_F(LibdhsTest, ACompletedWaitingRequestStaysEndedAcrossTwoMemdDeaths) { CompletedWaitingStaysEnded(true); }
void LibdhsTest::CompletedWaitingStaysEnded(bool second_death) {
  dhs_worker_config c = Config(dir_.path(), 16);
  uint64_t a = 0, b = 0, q = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithTwoGrantedAndOneQueued(&c, &a, &b, &q));
  ASSERT_NO_FATAL_FAILURE(PollUntil([] { return false; }, 50));  // memd journals q's admission (no slot)
  ASSERT_EQ(memd_->Signal(SIGSTOP), 0);
  ASSERT_EQ(dhs_request_complete(w_, q), DHS_OK) << dhs_worker_errmsg(w_);  // its Complete: never read
  ASSERT_NO_FATAL_FAILURE(KillMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  // Polls only while the second memd is stopped: a poll that takes its HelloReply sends q's Complete (Return) to a
  // memd that never reads it.
  bool back = !second_death;
  if (!second_death) ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["returns"] == 1; }, 10000));
  for (int i = 0; i < 300 && !back; ++i) {
    ASSERT_EQ(memd_->Signal(SIGSTOP), 0);
    dhs_event ev[4];
    size_t n = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK) << dhs_worker_errmsg(w_);
    back = Stats()["memd"]["returns"] == 1;
    if (!back) {
      ASSERT_EQ(memd_->Signal(SIGCONT), 0);
      ::poll(nullptr, 0, 60);
    }
  }
  ASSERT_TRUE(back);
  if (second_death) {
    ASSERT_NO_FATAL_FAILURE(KillMemd());  // q's second Complete dies unread
    ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
    ASSERT_NO_FATAL_FAILURE(StartMemd());
    ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["returns"] == 2; }, 10000));
    ASSERT_EQ(Stats()["memd"]["returns"], 2);
  }
  ASSERT_NO_FATAL_FAILURE(PollUntil([] { return false; }, 50));
  std::vector<dhs_resumable> list(8);
  size_t n = 0, total = 0;
  ASSERT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
  EXPECT_EQ(total, 0u);
  ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_complete(w_, b), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(PollUntil([] { return false; }, 50));
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  w_ = nullptr;
  ::poll(nullptr, 0, 200);
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);  // the GPU's next worker
  ASSERT_EQ(dhs_worker_list_resumable(w_, list.data(), list.size(), &n, &total), DHS_OK);
  EXPECT_EQ(total, 0u) << "request " << q << ", completed by the engine, is resumable at the GPU's next worker"
                       << (n > 0 ? " (listed: " + std::to_string(list[0].request) + ")" : std::string());
}

// A waiting request q whose admission the dead memd journaled is ended at the re-Hello (its interrupted copy gets a
// Complete) and sent again under the same id: a new life, which memd2 grants. memd2 dies and memd3 refuses q's report
// (and b's): q FAILS here and memd3 holds it interrupted, so it is listed resumable. memd3 dies before the engine
// resumes it; memd4 lists q again, and it stays resumable: its first life's Complete does not count as "ended here"
// (review finding: it did, so the return ended q at memd, its pages freed, and the first life also hid it from the
// list). The GPU's next worker lists b and q.
TEST_F(LibdhsTest, ARequestSentAgainStaysResumableAfterItsReportIsRefused) {
  dhs_worker_config c = Config(dir_.path(), 16);
  uint64_t a = 0, b = 0, q = 0;
  ASSERT_NO_FATAL_FAILURE(StartWithTwoGrantedAndOneQueued(&c, &a, &b, &q));
  ASSERT_NO_FATAL_FAILURE(PollUntil([] { return false; }, 50));  // memd1 journals q's admission (no slot)
  ASSERT_NO_FATAL_FAILURE(KillMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["returns"] == 1; }, 10000));
  ASSERT_EQ(Stats()["memd"]["returns"], 1);  // q: Complete, then its admission again (same id)
  ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK) << dhs_worker_errmsg(w_);  // a slot for q
  ASSERT_NO_FATAL_FAILURE(PollUntilGranted(q));
  ASSERT_NO_FATAL_FAILURE(PollUntil([] { return false; }, 50));  // memd2 journals the grant
  ASSERT_NO_FATAL_FAILURE(KillMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  ASSERT_NO_FATAL_FAILURE(StartMemd({"--reserve-pages", "15"}));  // no report fits: b's and q's refused
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["returns"] == 2; }, 10000));
  ASSERT_EQ(Stats()["memd"]["returns"], 2);
  // Both FAILED ("dhs_worker_list_resumable may list it"); memd3 holds both. (Pre-existing: not_resumable_ still
  // holds q from its first life's end at the first re-Hello, so q is not listed.)
  EXPECT_EQ(ListedIds(), (std::set<uint64_t>{b, q})) << "after memd3: q FAILED but is not listed resumable";
  ASSERT_NO_FATAL_FAILURE(KillMemd());  // before the engine resumes them
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["away"].get<bool>(); }));
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(PollUntil([&] { return Stats()["memd"]["returns"] == 3; }, 10000));
  ASSERT_EQ(Stats()["memd"]["returns"], 3);
  ASSERT_NO_FATAL_FAILURE(PollUntil([] { return false; }, 50));
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  w_ = nullptr;
  ::poll(nullptr, 0, 200);
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);  // the GPU's next worker: what memd4 holds
  EXPECT_EQ(ListedIds(), (std::set<uint64_t>{b, q})) << "q (FAILED: \"dhs_worker_list_resumable may list it\") was "
                                                     "ended at memd4 by the re-Hello (completes_sent_): lost";
  ASSERT_NO_FATAL_FAILURE(DropInterruptedPool());
}

TEST_F(LibdhsTest, CompleteWhileWaiting) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(8));
  dhs_request_desc d = Desc(16, 40);
  uint64_t id = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &id), DHS_OK);
  ASSERT_EQ(dhs_request_complete(w_, id), DHS_OK);  // before any poll: memd sees the admission, then the Complete
  EXPECT_EQ(dhs_request_complete(w_, id), DHS_ERR_NOT_FOUND);
  for (int i = 0; i < 40; ++i) {
    dhs_event ev[4];
    size_t got = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &got), DHS_OK);
    EXPECT_EQ(got, 0u);  // its grant (if memd sent one) is not the engine's business any more
    ::poll(nullptr, 0, 5);
  }
  const uint64_t next = SubmitGranted(16, 40);  // the slot and pages came back
  EXPECT_NE(next, id);
}

// Issue 24 through the C API (ABI 1.1): a request that names a prefix chain (tenant, tokens, blocks of p tokens)
// computes
// its pages; once their host copies are confirmed, memd (--prefix-sharing on) grants a second request naming the same
// chain those pages as shared host pages: the GRANTED event counts them, dhs_request_import takes them without any
// append, and their rows and index keys are the first request's bytes. A request of another tenant with the same
// tokens gets none; one whose third block differs gets the two leading pages only (a chain of digests); a 1.0-sized
// struct still submits (no chain).
uint8_t KeyByte(uint64_t r, int64_t t, uint32_t b) {
  return static_cast<uint8_t>(r * 17 + static_cast<uint64_t>(t) * 3 + b);
}

// Request b imports the 4 shared prefix pages request a computed (rows of both sources, index keys of indexer 0):
// the keys are a's (KeyByte) and the rows of positions across the 4 pages are a's (RowByte), byte for byte.
void ExpectImportedPrefix(dhs_worker* w, uint64_t b, uint64_t a) {
  std::vector<uint8_t> keys(size_t{4} * kP * kKey);
  ASSERT_EQ(dhs_request_import(w, b, 0, 4, keys.data(), keys.size()), DHS_OK) << dhs_worker_errmsg(w);
  for (int64_t t = 0; t < 64; ++t) {
    for (uint32_t k = 0; k < kKey; ++k) ASSERT_EQ(keys[t * kKey + k], KeyByte(a, t, k)) << "key of position " << t;
  }
  dhs_pool_desc pool{};
  pool.struct_size = sizeof pool;
  pool.kind = DHS_POOLS_LIBRARY;
  ASSERT_EQ(dhs_pools_register(w, &pool), DHS_OK);
  const std::vector<int64_t> sel = {0, 15, 16, 33, 47, 48, 63, -1};
  for (uint32_t s = 0; s < kS; ++s) {
    std::vector<int64_t> loc(sel.size());
    dhs_query q{b, sel.data(), static_cast<uint32_t>(sel.size()), 0, loc.data()};
    ASSERT_EQ(dhs_resolve(w, &s, 1, &q, 1), DHS_OK) << dhs_worker_errmsg(w);
    for (size_t j = 0; j + 1 < sel.size(); ++j) {
      const uint8_t* row = static_cast<const uint8_t*>(pool.base) + loc[j];
      for (uint32_t k = 0; k < kRow; ++k) ASSERT_EQ(row[k], RowByte(a, s, sel[j], k)) << s << " " << sel[j];
    }
    ASSERT_EQ(dhs_readers_done(w, &s, 1), DHS_OK);
  }
}

TEST_F(LibdhsTest, PrefixChainGrantsSharedHostPagesPerTenant) {
  ASSERT_NO_FATAL_FAILURE(StartMemd({"--prefix-sharing", "on"}));
  dhs_worker_config c = Config(dir_.path(), 16);
  c.mode = DHS_MODE_HISPARSE;  // every complete page backed up at once
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  std::vector<int32_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(1000 + 7 * i);
  auto submit = [&](const char* tenant, const std::vector<int32_t>& toks, uint64_t session) {
    dhs_request_desc d{};
    d.struct_size = sizeof d;
    d.input_rows = 64;
    d.max_rows = 80;
    d.tenant = tenant;
    d.session = session;
    d.tokens = toks.data();
    d.token_count = toks.size();
    d.block_tokens = kP;  // 4 complete blocks of 16 tokens = 4 pages
    uint64_t id = 0;
    EXPECT_EQ(dhs_request_submit(w_, &d, &id), DHS_OK) << dhs_worker_errmsg(w_);
    const std::vector<dhs_event> ev = PollFor(1);
    EXPECT_EQ(ev.size(), 1u);
    dhs_event e{};
    if (!ev.empty()) e = ev[0];
    EXPECT_EQ(e.kind, DHS_EVENT_GRANTED) << e.message;
    EXPECT_EQ(e.request, id);
    return std::make_pair(id, e);
  };
  // The first request computes the 4 pages (rows and index keys), backed up and confirmed.
  const auto [a, ga] = submit("acme", tokens, 7);
  EXPECT_EQ(ga.shared_pages, 0u);
  EXPECT_EQ(ga.pages, 0u);
  {
    const std::vector<uint8_t> rows = Rows(a, 0, 64);
    std::vector<uint8_t> keys(size_t{64} * kKey);
    for (int64_t t = 0; t < 64; ++t)
      for (uint32_t b = 0; b < kKey; ++b) keys[t * kKey + b] = KeyByte(a, t, b);
    ASSERT_EQ(dhs_request_append(w_, a, 0, 64, rows.data(), rows.size(), keys.data(), keys.size()), DHS_OK)
        << dhs_worker_errmsg(w_);
  }
  ASSERT_NO_FATAL_FAILURE(WaitBackedUp(4));  // the HostCopyWritten reports reach memd: the pages become shared
  ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK);  // its pages stay stored (cached) for the chain

  // Same tenant, same chain: 4 shared pages, imported without an append; rows and keys are a's.
  const auto [b, gb] = submit("acme", tokens, 8);
  EXPECT_EQ(gb.shared_pages, 4u);
  EXPECT_EQ(gb.pages, 4u);
  ASSERT_EQ(gb.import_pages, 4u);
  ASSERT_NO_FATAL_FAILURE(ExpectImportedPrefix(w_, b, a));
  ASSERT_EQ(Append(b, 64, 1), DHS_OK) << dhs_worker_errmsg(w_);  // decoding goes on after the imported prompt
  EXPECT_EQ(Stats()["prefix"]["shared_pages_granted"], 4);
  ASSERT_EQ(dhs_request_complete(w_, b), DHS_OK);

  // Another tenant, the same tokens: nothing shared, nothing to import.
  const auto [other, go] = submit("globex", tokens, 9);
  EXPECT_EQ(go.shared_pages, 0u);
  EXPECT_EQ(go.pages, 0u);
  EXPECT_EQ(dhs_request_import(w_, other, 0, 1, nullptr, 0), DHS_ERR_FAILED_PRECONDITION);
  ASSERT_EQ(dhs_request_complete(w_, other), DHS_OK);

  // Same tenant, block 2 differs: blocks 0 and 1 still match (their ids and digests), 2 and 3 do not.
  std::vector<int32_t> changed = tokens;
  changed[40] = -5;
  const auto [d2, gd] = submit("acme", changed, 10);
  EXPECT_EQ(gd.shared_pages, 2u);
  EXPECT_EQ(gd.import_pages, 2u);
  ASSERT_EQ(dhs_request_complete(w_, d2), DHS_OK);
  EXPECT_EQ(Stats()["prefix"]["lookups"], 16);  // 4 blocks named by each of the 4 requests

  // ABI 1.0's struct (32 bytes, no chain) is accepted; other sizes are not; a bad chain is refused.
  dhs_request_desc old{};
  old.struct_size = DHS_REQUEST_DESC_SIZE_1_0;
  old.input_rows = 64;
  old.max_rows = 80;
  old.tenant = "acme";  // beyond a 1.0 struct: never read
  old.tokens = tokens.data();
  old.token_count = 64;
  old.block_tokens = kP;
  uint64_t id = 0;
  ASSERT_EQ(dhs_request_submit(w_, &old, &id), DHS_OK) << dhs_worker_errmsg(w_);
  const std::vector<dhs_event> ev = PollFor(1);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, DHS_EVENT_GRANTED);
  EXPECT_EQ(ev[0].shared_pages, 0u);  // no chain named: the default tenant has none stored anyway
  ASSERT_EQ(dhs_request_complete(w_, id), DHS_OK);
  old.struct_size = DHS_REQUEST_DESC_SIZE_1_0 + 8;
  EXPECT_EQ(dhs_request_submit(w_, &old, &id), DHS_ERR_VERSION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("(1.0)"), std::string::npos) << dhs_worker_errmsg(w_);
  dhs_request_desc bad{};
  bad.struct_size = sizeof bad;
  bad.input_rows = 16;
  bad.max_rows = 20;
  bad.tokens = tokens.data();
  bad.token_count = 17;  // more tokens than the prompt
  EXPECT_EQ(dhs_request_submit(w_, &bad, &id), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("token_count"), std::string::npos) << dhs_worker_errmsg(w_);
  bad.token_count = 16;
  bad.tokens = nullptr;
  EXPECT_EQ(dhs_request_submit(w_, &bad, &id), DHS_ERR_INVALID_ARGUMENT);
  bad.tokens = tokens.data();
  bad.block_id_count = 2;  // ids NULL
  EXPECT_EQ(dhs_request_submit(w_, &bad, &id), DHS_ERR_INVALID_ARGUMENT);
  bad.block_id_count = 0;
  const std::string long_tenant(300, 't');
  bad.tenant = long_tenant.c_str();
  EXPECT_EQ(dhs_request_submit(w_, &bad, &id), DHS_ERR_INVALID_ARGUMENT);
}

// Serving through a memd restart inside the library (workerd's re-Hello with a report, docs/protocol.md): memd is
// SIGKILLed under a granted request whose complete pages are backed up and a second request still queued; the worker
// keeps serving away (poll OK; appends while the tail has room, resolves exact; a submit and a complete meanwhile);
// a new memd of the run directory (the same host pool and journal) takes the re-Hello; the request is adopted and
// goes on to its last row, every row read back exact (old rows from host, new ones from the tail); the queued and the
// away-submitted admissions are sent again and granted; the deferred end reaches memd; at a clean stop nothing is
// left in /dev/shm.
TEST_F(LibdhsTest, ServesThroughAMemdRestart) {
  const std::string log = dir_.path() + ".memd.log";
  const char* memd = std::getenv("MEMD");
  ASSERT_NE(memd, nullptr);
  const std::vector<std::string> args{memd, "--run-dir", dir_.path(), "--page-bytes", std::to_string(kHostPageBytes),
                                      "--host-pool-pages", "256"};
  auto start = [&] {
    memd_ = std::make_unique<ChildProcess>(args, log);
    for (int i = 0; i < 400 && !std::filesystem::exists(dir_.path() + "/memd.sock"); ++i) ::poll(nullptr, 0, 25);
    ASSERT_TRUE(std::filesystem::exists(dir_.path() + "/memd.sock"));
  };
  ASSERT_NO_FATAL_FAILURE(start());
  dhs_worker_config c = Config(dir_.path(), 16);
  c.mode = DHS_MODE_HISPARSE;  // every complete page backed up at once
  c.slots = 2;                 // a third request waits for a slot
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  const uint64_t id = SubmitGranted(64, 128);
  const uint64_t short_one = SubmitGranted(16, 32);
  dhs_request_desc queued_desc = Desc(16, 32);
  uint64_t queued = 0;
  ASSERT_EQ(dhs_request_submit(w_, &queued_desc, &queued), DHS_OK);
  uint64_t queued_then_completed = 0;  // waits for a slot too; the engine completes it while memd is away
  ASSERT_EQ(dhs_request_submit(w_, &queued_desc, &queued_then_completed), DHS_OK);
  ASSERT_EQ(Append(id, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
  std::vector<dhs_event> seen;
  auto poll_some = [&](int n, int sleep_ms) { PollInto(seen, n, sleep_ms); };
  for (int i = 0; i < 2000 && Stats()["pages"]["backed_up"] < 4; ++i) ASSERT_NO_FATAL_FAILURE(poll_some(1, 1));
  ASSERT_EQ(Stats()["pages"]["backed_up"], 4);
  ASSERT_NO_FATAL_FAILURE(poll_some(20, 5));  // the HostCopyWritten reports reach memd's journal
  const std::string first_log = [&] {
    std::ifstream f(log);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }();
  const size_t at = first_log.find("host pool /dev/shm/");
  ASSERT_NE(at, std::string::npos) << first_log;
  const std::string segment = first_log.substr(at + 10, first_log.find(':', at) - at - 10);

  memd_->Signal(SIGKILL);
  ASSERT_GE(memd_->WaitExit(5000), -1);
  for (int i = 0; i < 2000 && !Stats()["memd"]["away"].get<bool>(); ++i) ASSERT_NO_FATAL_FAILURE(poll_some(1, 2));
  ASSERT_TRUE(Stats()["memd"]["away"].get<bool>());
  // Away: rows 64 .. 79 fit the tail (their slots' rows have host copies), rows 96 .. are refused until memd is back.
  ASSERT_EQ(Append(id, 64, 16), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(id, {0, 5, 17, 40, 63, 64, 79, -1}));
  ASSERT_EQ(Append(id, 80, 16), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(Append(id, 96, 1), DHS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("memd is away"), std::string::npos) << dhs_worker_errmsg(w_);
  uint64_t late = 0, dropped = 0;
  dhs_request_desc late_desc = Desc(16, 32);
  ASSERT_EQ(dhs_request_submit(w_, &late_desc, &late), DHS_OK) << dhs_worker_errmsg(w_);   // waits for memd
  ASSERT_EQ(dhs_request_submit(w_, &late_desc, &dropped), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_request_complete(w_, dropped), DHS_OK);  // cancelled before memd ever saw it
  // Its admission went to the dead memd: ended here at once (NOT_FOUND after), never sent again; the new memd, which
  // finds it in the journal as an interrupted request, gets its Complete at the re-Hello (not listed resumable).
  ASSERT_EQ(dhs_request_complete(w_, queued_then_completed), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, queued_then_completed), DHS_ERR_NOT_FOUND);
  // Open for the engine now (review finding: an ending one was counted open too): the queued one and late.
  EXPECT_EQ(Stats()["requests"]["open_waiting"], 2);
  ASSERT_EQ(dhs_request_complete(w_, short_one), DHS_OK);  // granted: its end waits for the re-Hello
  EXPECT_EQ(Append(short_one, 0, 1), DHS_ERR_NOT_FOUND);   // gone for the engine at once
  ASSERT_NO_FATAL_FAILURE(poll_some(50, 2));              // ~100 ms away: re-Hello attempts find no memd

  std::filesystem::remove(dir_.path() + "/memd.sock");  // the killed memd's socket: wait for the new one's
  ASSERT_NO_FATAL_FAILURE(start());  // the same run directory: the pool and the journal are adopted
  for (int i = 0; i < 3000 && Stats()["memd"]["returns"] < 1; ++i) ASSERT_NO_FATAL_FAILURE(poll_some(1, 2));
  const nlohmann::json back = Stats()["memd"];
  ASSERT_EQ(back["returns"], 1) << back;
  EXPECT_FALSE(back["away"].get<bool>());
  EXPECT_EQ(back["reports_refused"], 0) << back;
  EXPECT_EQ(back["admissions_resent"], 2) << back;  // the queued one and the one submitted while away
  // short_one's Complete reached the new memd (its slot is free), and queued_then_completed's end happened there.
  EXPECT_EQ(back["ends_deferred"], 2) << back;
  {
    dhs_resumable listed[8];
    size_t n = 0, total = 0;
    ASSERT_EQ(dhs_worker_list_resumable(w_, listed, 8, &n, &total), DHS_OK) << dhs_worker_errmsg(w_);
    for (size_t i = 0; i < n; ++i) EXPECT_NE(listed[i].request, queued_then_completed);
  }
  EXPECT_EQ(Stats()["requests"]["completed"], 3);  // dropped, queued_then_completed, short_one
  EXPECT_EQ(Stats()["requests"]["open_waiting"], 2) << "the queued one and late; none of those completed";
  EXPECT_EQ(Stats()["requests"]["open_granted"], 1) << "id";
  // The request goes on: the rest of its rows (the deferred backups free the tail), all of them read back exact.
  for (int64_t t = 96; t < 128; t += 8) {
    int rc = DHS_ERR_RESOURCE_EXHAUSTED;
    for (int i = 0; i < 2000 && rc == DHS_ERR_RESOURCE_EXHAUSTED; ++i) {
      rc = Append(id, t, 8);
      if (rc == DHS_ERR_RESOURCE_EXHAUSTED) {
        ASSERT_NO_FATAL_FAILURE(poll_some(1, 1));
      }
    }
    ASSERT_EQ(rc, DHS_OK) << t << ": " << dhs_worker_errmsg(w_);
  }
  for (int64_t t0 = 0; t0 < 128; t0 += kK) {
    std::vector<int64_t> sel;
    for (int64_t t = t0; t < t0 + kK; ++t) sel.push_back(t);
    ASSERT_NO_FATAL_FAILURE(ExpectRows(id, sel));
  }
  for (const dhs_event& e : seen) EXPECT_NE(e.kind, DHS_EVENT_FAILED) << e.message;
  // A resent admission is granted while `id` holds one of the 2 slots: short_one's deferred end freed the other. Each
  // one granted is served and completed; `id` ends too; both resent admissions are granted in the end.
  std::set<uint64_t> granted;
  auto serve_granted = [&](size_t want) {
    for (int i = 0; i < 3000 && granted.size() < want; ++i) {
      ASSERT_NO_FATAL_FAILURE(poll_some(1, 2));
      for (const dhs_event& e : seen) {
        EXPECT_NE(e.request, dropped);
        if (e.kind == DHS_EVENT_GRANTED) EXPECT_NE(e.request, queued_then_completed);  // (it got a WAITING before)
        if (e.kind != DHS_EVENT_GRANTED || (e.request != queued && e.request != late) || granted.contains(e.request)) {
          continue;
        }
        granted.insert(e.request);
        ASSERT_EQ(Append(e.request, 0, 16), DHS_OK) << dhs_worker_errmsg(w_);
        ASSERT_NO_FATAL_FAILURE(ExpectRows(e.request, {0, 7, 15}));
        ASSERT_EQ(dhs_request_complete(w_, e.request), DHS_OK);
      }
    }
  };
  ASSERT_NO_FATAL_FAILURE(serve_granted(1));
  ASSERT_EQ(granted.size(), 1u);
  ASSERT_EQ(dhs_request_complete(w_, id), DHS_OK);
  ASSERT_NO_FATAL_FAILURE(serve_granted(2));
  EXPECT_EQ(granted.size(), 2u);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  w_ = nullptr;
  memd_->Terminate();  // clean stop: no request holds a host copy, the pool is dropped
  memd_.reset();
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + segment)) << segment;
  std::filesystem::remove(log);
}

// ABI 1.7, DHS_MODE_RESIDENT: every row stays in the pool, which is the budget's whole pages (12 of 2048 bytes: the
// 100 bytes past them are not used). memd admits a request with its whole context (common/worker_shape.h: ceil(128 /
// 16) = 8 row pages + ceil(128 * 16 / 2048) = 1 key page = 9 pages), so a second one of 5 pages (4 + 1) waits until the
// first completes. 128 rows append in one call (no tail bound), every row reads back exact from its offset in the pool,
// and nothing is backed up, reclaimed or recovered from host.
TEST_F(LibdhsTest, ResidentModeKeepsEveryRowAndAdmitsWholeContexts) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 12);
  c.mode = DHS_MODE_RESIDENT;
  c.hbm_budget_bytes += 100;
  uint64_t needed = 0;
  ASSERT_EQ(dhs_pool_bytes_needed(&c, &needed), DHS_OK);
  EXPECT_EQ(needed, 12 * kPageBytes);
  dhs_worker_config staged = c;  // a held round's rows are read in place: no staging arenas
  staged.staging_arenas = 1;
  staged.round_queries = 4;
  EXPECT_EQ(dhs_pool_bytes_needed(&staged, &needed), DHS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  const uint64_t a = SubmitGranted(100, 128);
  ASSERT_EQ(Append(a, 0, 128), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, {0, 15, 16, 63, 64, 99, 100, 127}));
  dhs_request_desc d = Desc(32, 64);
  uint64_t b = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &b), DHS_OK) << dhs_worker_errmsg(w_);
  std::vector<dhs_event> ev = PollFor(1);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, DHS_EVENT_WAITING) << "9 + 5 pages > 12: the second context must wait";
  EXPECT_EQ(ev[0].request, b);
  ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK) << dhs_worker_errmsg(w_);
  ev = PollFor(1);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, DHS_EVENT_GRANTED) << ev[0].message;
  EXPECT_EQ(ev[0].request, b);
  ASSERT_EQ(Append(b, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(b, {0, 31, 32, 63, -1}));
  const nlohmann::json st = Stats();
  EXPECT_EQ(st["mode"], "resident");
  EXPECT_EQ(st["pages"]["backed_up"], 0) << st;
  EXPECT_EQ(st["pages"]["reclaimed"], 0) << st;
  EXPECT_EQ(st["census"]["host"], 0) << st;
  ASSERT_EQ(dhs_request_complete(w_, b), DHS_OK) << dhs_worker_errmsg(w_);
}

// A worker of GPU 3 (review finding: the request book was GPU 0's, so every request id was outside GPU 3's range and
// memd rejected each one): its ids carry GPU 3 in their top 16 bits, and it serves.
TEST_F(LibdhsTest, AWorkerOfAnotherGpuServes) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 16);
  c.gpu = 3;
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  const uint64_t id = SubmitGranted(16, 40);
  EXPECT_EQ(id >> 48, 3u);
  ASSERT_EQ(Append(id, 0, 40), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(id, {0, 15, 16, 39}));
  ASSERT_EQ(dhs_request_complete(w_, id), DHS_OK) << dhs_worker_errmsg(w_);
}

// A request resolved twice on one source without dhs_readers_done between: the second resolve could wait for its own
// readers for ever (found by the libFuzzer run: a hang in FusedResolver::Finish); it is refused with a message, other
// sources and other requests are not affected, and after readers done it resolves again. Completing a request before
// the readers of its resolves are done would wait for them for ever (the next hang the run found): refused as well.
TEST_F(LibdhsTest, ResolveAgainBeforeReadersDoneIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(16));
  const uint64_t a = SubmitGranted(64, 80), b = SubmitGranted(16, 40);
  ASSERT_EQ(Append(a, 0, 64), DHS_OK);
  ASSERT_EQ(Append(b, 0, 16), DHS_OK);
  const std::vector<int64_t> sel = {0, 9, 20, 33, 41, 50, 60, 63};
  std::vector<int64_t> loc(sel.size());
  dhs_query qa{a, sel.data(), static_cast<uint32_t>(sel.size()), 0, loc.data()};
  dhs_query qb{b, sel.data(), 2, 0, loc.data()};
  const uint32_t s0 = 0, s1 = 1;
  ASSERT_EQ(dhs_resolve(w_, &s0, 1, &qa, 1), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_resolve(w_, &s0, 1, &qa, 1), DHS_ERR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("dhs_readers_done"), std::string::npos) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_resolve(w_, &s1, 1, &qa, 1), DHS_OK) << dhs_worker_errmsg(w_);  // another source
  EXPECT_EQ(dhs_resolve(w_, &s0, 1, &qb, 1), DHS_OK) << dhs_worker_errmsg(w_);  // another request
  // Completing a request whose rows may still be read would wait for those readers for ever: refused too.
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_ERR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("before completing"), std::string::npos) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_readers_done(w_, &s0, 1), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
  ASSERT_EQ(dhs_readers_done(w_, &s1, 1), DHS_OK);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, sel));
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, sel));
}

// dhs_readers_done over several sources ends the readers of each (the libFuzzer hangs timeout-5d954c15... and
// timeout-edabb974..., now in fuzz/corpus/libdhs/): before the fix the KV store ended only the first source's group,
// so the readers of source 1 stayed open behind the per-slot bookkeeping that believed them done. Here row 35 (an
// incomplete page: read from the tail) is resolved on source 1, both sources are declared done at once, then row 67
// takes row 35's tail slot: its tail write is ordered after the readers of that slot, and the resolve of row 67
// waits for the write. Before the fix that resolve waited for ever (the watchdog below fails the test after 60 s
// instead of hanging it); now it returns the appended bytes. The request then completes (its ends wait for no
// reader: the other hang's shape).
TEST_F(LibdhsTest, ReadersDoneOfSeveralSourcesEndsEach) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  ASSERT_NO_FATAL_FAILURE(Open(16));
  const uint64_t a = SubmitGranted(40, 80);
  ASSERT_EQ(Append(a, 0, 40), DHS_OK) << dhs_worker_errmsg(w_);
  const uint32_t s1 = 1, both[2] = {0, 1};
  const std::vector<int64_t> first = {35};
  std::vector<int64_t> loc(1, -7);
  dhs_query q{a, first.data(), 1, 0, loc.data()};
  ASSERT_EQ(dhs_resolve(w_, &s1, 1, &q, 1), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_readers_done(w_, both, 2), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(Append(a, 40, 28), DHS_OK) << dhs_worker_errmsg(w_);  // rows 40 .. 67: row 67 reuses row 35's tail slot
  auto check = std::async(std::launch::async, [&] {
    ExpectRows(a, {67, 66, 35, 3});  // resolve on each source, bytes checked, readers done per source
    return dhs_request_complete(w_, a);
  });
  if (check.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "ReadersDoneOfSeveralSourcesEndsEach: the resolve after dhs_readers_done(0, 1) waits for "
                         "a reader of source 1 that was never ended (hang)\n");
    memd_->Terminate();
    std::_Exit(1);
  }
  EXPECT_EQ(check.get(), DHS_OK) << dhs_worker_errmsg(w_);
}

// Engine-owned KV pool (ABI 1.1, CPU backend): the engine asks the size (dhs_pool_bytes_needed), allocates aligned
// memory itself and names it at open; every location a resolve returns is an offset into the engine's memory, and the
// bytes there are the rows appended (also after a forced reclaim: host recovery writes into it). A pool too small or
// misaligned is refused at open naming the size; register checks base and bytes; the memory stays the engine's after
// close (freed by the test: a library that unmapped it would crash the free).
// ABI 1.2 (issue 26): the engine's model fingerprint reaches memd in the Hello. memd then refuses a worker of another
// model on the GPU (FAILED_PRECONDITION with memd's reason) and takes the same model again; a 1.1 caller's struct
// (no fingerprint: 0, not compared) is still accepted; a size between the known ones is refused.
TEST_F(LibdhsTest, ModelFingerprintReachesMemd) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 8);
  c.model_fingerprint = 0xa1;
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  c.model_fingerprint = 0xb2;
  EXPECT_EQ(dhs_worker_open(&c, &w_), DHS_ERR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("GPU 0 was registered with model 00000000000000a1; a restarted "
                                                    "worker must serve it (got 00000000000000b2)"),
            std::string::npos)
      << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  dhs_worker_config old = c;  // ABI 1.1's struct: it ends before model_fingerprint
  old.struct_size = DHS_WORKER_CONFIG_SIZE_1_1;
  ASSERT_EQ(dhs_worker_open(&old, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  c.model_fingerprint = 0xa1;
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  c.struct_size = DHS_WORKER_CONFIG_SIZE_1_1 + 4;
  EXPECT_EQ(dhs_worker_open(&c, &w_), DHS_ERR_VERSION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("takes 152 (1.8), 120 (1.5 .. 1.7), 112 (1.3, 1.4), 104 (1.2), 96 (1.1) or 80 (1.0)"), std::string::npos)
      << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  w_ = nullptr;
}

TEST_F(LibdhsTest, EngineOwnedPool) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  dhs_worker_config c = Config(dir_.path(), 12);  // as ForcedReclaimKeepsRowsExact: b's admission reclaims a
  uint64_t need = 0;
  ASSERT_EQ(dhs_pool_bytes_needed(&c, &need), DHS_OK);
  // S * N * (B + T) * d_KV + M * page_bytes = 2 * 2 * 64 * 64 + 12 * 2048
  EXPECT_EQ(need, uint64_t{kS} * 2 * (kB + kT) * kRow + 12 * kPageBytes);
  EXPECT_EQ(dhs_pool_bytes_needed(nullptr, &need), DHS_ERR_INVALID_ARGUMENT);
  dhs_worker_config bad_shape = c;
  bad_shape.top_k = 0;
  EXPECT_EQ(dhs_pool_bytes_needed(&bad_shape, &need), DHS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(dhs_pool_bytes_needed(&c, &need), DHS_OK);
  const uint64_t bytes = need + 4096;
  auto* mem = static_cast<uint8_t*>(std::aligned_alloc(DHS_POOL_ALIGNMENT, bytes + DHS_POOL_ALIGNMENT));
  ASSERT_NE(mem, nullptr);
  std::memset(mem, 0xAB, bytes);
  {  // too small, misaligned: refused with the size needed
    dhs_worker_config small = c;
    small.engine_pool = mem;
    small.engine_pool_bytes = need - 1;
    dhs_worker* w = nullptr;
    EXPECT_EQ(dhs_worker_open(&small, &w), DHS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dhs_worker_errmsg(w)).find(std::to_string(need)), std::string::npos) << dhs_worker_errmsg(w);
    dhs_worker_close(w);
    small.engine_pool = mem + 8;
    small.engine_pool_bytes = bytes;
    EXPECT_EQ(dhs_worker_open(&small, &w), DHS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dhs_worker_errmsg(w)).find("aligned"), std::string::npos) << dhs_worker_errmsg(w);
    dhs_worker_close(w);
  }
  c.engine_pool = mem;
  c.engine_pool_bytes = bytes;
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  dhs_pool_desc pool{};
  pool.struct_size = sizeof pool;
  pool.kind = DHS_POOLS_LIBRARY;
  EXPECT_EQ(dhs_pools_register(w_, &pool), DHS_ERR_FAILED_PRECONDITION);  // it is the engine's
  pool.kind = DHS_POOLS_ENGINE;
  pool.base = mem + 64;
  pool.bytes = bytes;
  EXPECT_EQ(dhs_pools_register(w_, &pool), DHS_ERR_INVALID_ARGUMENT);
  pool.base = mem;
  ASSERT_EQ(dhs_pools_register(w_, &pool), DHS_OK) << dhs_worker_errmsg(w_);
  EXPECT_EQ(pool.base, mem);
  EXPECT_EQ(pool.bytes, bytes);
  EXPECT_EQ(pool.row_bytes, kRow);
  // a keeps 4 optional pages; b's admission reclaims them (host recovery then writes a's rows into the engine's pool).
  const uint64_t a = SubmitGranted(64, 80);
  ASSERT_EQ(Append(a, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
  for (int i = 0; i < 50; ++i) {
    dhs_event ev[4];
    size_t got = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &got), DHS_OK);
    ::poll(nullptr, 0, 2);
  }
  dhs_request_desc d = Desc(16, 80);
  uint64_t b = 0;
  ASSERT_EQ(dhs_request_submit(w_, &d, &b), DHS_OK);
  ASSERT_NO_FATAL_FAILURE(PollUntilGranted(b));
  ASSERT_EQ(Append(b, 0, 16), DHS_OK) << dhs_worker_errmsg(w_);
  for (uint64_t id : {a, b}) {
    const std::vector<int64_t> sel = id == a ? std::vector<int64_t>{0, 13, 16, 31, 40, 47, 60, 63}
                                             : std::vector<int64_t>{0, 3, 5, 7, 9, 11, 13, 15};
    for (uint32_t s = 0; s < kS; ++s) {
      std::vector<int64_t> loc(sel.size());
      dhs_query q{id, sel.data(), static_cast<uint32_t>(sel.size()), 0, loc.data()};
      ASSERT_EQ(dhs_resolve(w_, &s, 1, &q, 1), DHS_OK) << dhs_worker_errmsg(w_);
      for (size_t j = 0; j < sel.size(); ++j) {
        ASSERT_GE(loc[j], 0);
        ASSERT_LE(static_cast<uint64_t>(loc[j]) + kRow, need);
        for (uint32_t k = 0; k < kRow; ++k) ASSERT_EQ(mem[loc[j] + k], RowByte(id, s, sel[j], k)) << sel[j];
      }
      ASSERT_EQ(dhs_readers_done(w_, &s, 1), DHS_OK);
    }
  }
  ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK);
  ASSERT_EQ(dhs_request_complete(w_, b), DHS_OK);
  EXPECT_GT(Stats()["census"]["host"], 0) << Stats().dump();  // a's reclaimed rows came from host
  ASSERT_EQ(dhs_worker_close(w_), DHS_OK);
  w_ = nullptr;
  for (uint64_t i = need; i < bytes; ++i) ASSERT_EQ(mem[i], 0xAB) << "byte " << i << " beyond the pool was written";
  std::free(mem);
  // ABI 1.0's config (80 bytes, no engine_pool fields) still opens (the library's pool).
  dhs_worker_config old = Config(dir_.path(), 4);
  old.struct_size = DHS_WORKER_CONFIG_SIZE_1_0;
  old.gpu = 1;  // GPU 0's closed worker may still be registered at memd
  old.engine_pool = reinterpret_cast<void*>(0x1);  // beyond a 1.0 struct: never read
  ASSERT_EQ(dhs_worker_open(&old, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  pool.kind = DHS_POOLS_LIBRARY;
  ASSERT_EQ(dhs_pools_register(w_, &pool), DHS_OK);
  EXPECT_NE(pool.base, nullptr);
}


// ABI 1.3, layer-wise appends (dhs_request_append_source, dhs_request_append_keys) as an engine writing each layer's
// KV during its forward pass: source 0 first, then its indexer's keys, then source 1. A source may run ahead by at
// most the tail (T = 32 here): source 0's row 32 would take row 0's tail slot while page 0 is incomplete (source 1
// holds nothing), so it is refused with the rows before it appended. Keys are taken until a poll confirmed their
// page's host copy (checksummed with the keys it held then), refused after.
// The rows read back (from the tail, and from host once the tail moved on) are each source's own, and a second
// request on the same prefix chain imports the 4 pages with the keys given layer-wise, as if appended whole.
TEST_F(LibdhsTest, LayerWiseAppendsMatchWholeAppends) {
  ASSERT_NO_FATAL_FAILURE(StartMemd({"--prefix-sharing", "on"}));
  dhs_worker_config c = Config(dir_.path(), 16);
  c.mode = DHS_MODE_HISPARSE;  // every complete page backed up at once
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  std::vector<int32_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(5000 + 3 * i);
  auto submit = [&](uint64_t session) {
    dhs_request_desc d{};
    d.struct_size = sizeof d;
    d.input_rows = 64;
    d.max_rows = 96;
    d.session = session;
    d.tokens = tokens.data();
    d.token_count = tokens.size();
    d.block_tokens = kP;
    uint64_t id = 0;
    EXPECT_EQ(dhs_request_submit(w_, &d, &id), DHS_OK) << dhs_worker_errmsg(w_);
    const std::vector<dhs_event> ev = PollFor(1);
    dhs_event e{};
    if (!ev.empty()) e = ev[0];
    EXPECT_EQ(e.kind, DHS_EVENT_GRANTED) << e.message;
    return std::make_pair(id, e);
  };
  auto source_rows = [](uint64_t r, uint32_t s, int64_t first, uint32_t n) {
    std::vector<uint8_t> rows(size_t{n} * kRow);
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t b = 0; b < kRow; ++b) rows[i * kRow + b] = RowByte(r, s, first + i, b);
    return rows;
  };
  auto keys_of = [](uint64_t r, int64_t first, uint32_t n) {
    std::vector<uint8_t> keys(size_t{n} * kKey);
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t b = 0; b < kKey; ++b) keys[i * kKey + b] = KeyByte(r, first + i, b);
    return keys;
  };
  auto append_source = [&](uint64_t r, uint32_t s, int64_t first, uint32_t n) {
    const std::vector<uint8_t> rows = source_rows(r, s, first, n);
    return dhs_request_append_source(w_, r, s, first, n, rows.data(), rows.size());
  };
  auto append_keys = [&](uint64_t r, int64_t first, uint32_t n) {
    const std::vector<uint8_t> keys = keys_of(r, first, n);
    return dhs_request_append_keys(w_, r, 0, first, n, keys.data(), keys.size());
  };
  const auto [a, ga] = submit(1);
  ASSERT_EQ(ga.shared_pages, 0u);

  // Bad input of the two calls.
  const std::vector<uint8_t> one = source_rows(a, 0, 0, 1);
  EXPECT_EQ(dhs_request_append_source(w_, a, kS, 0, 1, one.data(), one.size()), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append_source(w_, a, 0, 0, 1, nullptr, 0), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append_source(w_, a, 0, 0, 1, one.data(), one.size() * 2), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append_source(w_, a, 0, 1, 1, one.data(), one.size()), DHS_ERR_OUT_OF_RANGE);  // a gap
  EXPECT_EQ(dhs_request_append_source(w_, a, 0, -1, 1, one.data(), one.size()), DHS_ERR_OUT_OF_RANGE);
  EXPECT_EQ(dhs_request_append_source(w_, a + 100, 0, 0, 1, one.data(), one.size()), DHS_ERR_NOT_FOUND);
  EXPECT_EQ(append_keys(a, 0, 1), DHS_ERR_OUT_OF_RANGE);  // position 0 is on no source yet
  const std::vector<uint8_t> key = keys_of(a, 0, 1);
  EXPECT_EQ(dhs_request_append_keys(w_, a, 1, 0, 1, key.data(), key.size()), DHS_ERR_INVALID_ARGUMENT);  // indexer
  EXPECT_EQ(dhs_request_append_keys(w_, a, 0, 0, 1, key.data(), 3), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append_keys(w_, a, 0, 0, 1, nullptr, 0), DHS_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(dhs_request_append_keys(w_, a, 0, INT64_MAX, 1, key.data(), key.size()), DHS_ERR_OUT_OF_RANGE);  // overflow

  // Source 0 runs 48 rows ahead: rows 0 .. 31 go in, row 32 needs page 0 complete and backed up.
  EXPECT_EQ(append_source(a, 0, 0, 48), DHS_ERR_RESOURCE_EXHAUSTED);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("positions 0 .. 31 were appended"), std::string::npos)
      << dhs_worker_errmsg(w_);
  // The message says what helps (the other source), not only that page 0 has no host copy yet (review finding).
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("source 1 holds only 0 rows"), std::string::npos)
      << dhs_worker_errmsg(w_);
  ASSERT_EQ(append_keys(a, 0, 32), DHS_OK) << dhs_worker_errmsg(w_);
  // Whole-position calls need every source at one length.
  const std::vector<uint8_t> whole = Rows(a, 32, 1);
  EXPECT_EQ(dhs_request_append(w_, a, 32, 1, whole.data(), whole.size(), nullptr, 0), DHS_ERR_OUT_OF_RANGE);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("one length"), std::string::npos) << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_request_hold(w_, a, 16), DHS_ERR_OUT_OF_RANGE);  // below source 0's 32 rows
  // Source 0's rows resolve; source 1's do not exist yet.
  {
    const std::vector<int64_t> sel = {0, 31};
    std::vector<int64_t> loc(2);
    dhs_query q{a, sel.data(), 2, 0, loc.data()};
    const uint32_t s1 = 1;
    EXPECT_EQ(dhs_resolve(w_, &s1, 1, &q, 1), DHS_ERR_OUT_OF_RANGE);
  }
  ASSERT_EQ(append_source(a, 1, 0, 32), DHS_OK) << dhs_worker_errmsg(w_);  // pages 0 and 1 complete
  ASSERT_EQ(append_keys(a, 16, 1), DHS_OK) << dhs_worker_errmsg(w_);  // complete, not yet confirmed by a poll
  // The two backups finish and a poll confirms (checksums) them: the agent counts them then.
  for (int i = 0; i < 2000 && Stats()["pages"]["backed_up"] < 2; ++i) {
    dhs_event ev[4];
    size_t n = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK);
    ::poll(nullptr, 0, 1);
  }
  ASSERT_EQ(Stats()["pages"]["backed_up"], 2);
  EXPECT_EQ(append_keys(a, 16, 1), DHS_ERR_FAILED_PRECONDITION);
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("host copy was confirmed"), std::string::npos)
      << dhs_worker_errmsg(w_);
  EXPECT_EQ(append_keys(a, 40, 1), DHS_ERR_OUT_OF_RANGE);  // position 40 is on no source yet
  // The rest layer by layer, a page at a time: source 0, keys, source 1.
  for (int64_t t = 32; t < 64; t += kP) {
    ASSERT_EQ(append_source(a, 0, t, kP), DHS_OK) << dhs_worker_errmsg(w_);
    ASSERT_EQ(append_keys(a, t, kP), DHS_OK) << dhs_worker_errmsg(w_);
    ASSERT_EQ(append_source(a, 1, t, kP), DHS_OK) << dhs_worker_errmsg(w_);
  }
  // Every source at 64: a whole-position append goes on; positions 0 .. 31 are out of the tail (host recovery).
  ASSERT_EQ(Append(a, 64, 8), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_NO_FATAL_FAILURE(ExpectRows(a, {0, 7, 15, 16, 31, 40, 63, 71}));
  EXPECT_EQ(Stats()["rows_appended"], 2 * 64 + 8);  // rows of one source count once each, whole positions once
  for (int i = 0; i < 2000 && Stats()["pages"]["backed_up"] < 4; ++i) {
    dhs_event ev[4];
    size_t n = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK);
    ::poll(nullptr, 0, 1);
  }
  ASSERT_GE(Stats()["pages"]["backed_up"], 4);
  for (int i = 0; i < 20; ++i) {  // the HostCopyWritten reports reach memd: the pages become shared
    dhs_event ev[4];
    size_t n = 0;
    ASSERT_EQ(dhs_worker_poll(w_, ev, 4, &n), DHS_OK);
    ::poll(nullptr, 0, 5);
  }
  ASSERT_EQ(dhs_request_complete(w_, a), DHS_OK);

  // The same chain again: its 4 pages imported with the keys given layer-wise and the rows of both sources.
  const auto [b, gb] = submit(2);
  ASSERT_EQ(gb.shared_pages, 4u);
  ASSERT_EQ(gb.import_pages, 4u);
  ASSERT_NO_FATAL_FAILURE(ExpectImportedPrefix(w_, b, a));
  EXPECT_EQ(dhs_request_complete(w_, b), DHS_OK);
}

// ABI 1.3, source groups (brief §5: an index producer's followers read the producer's selection): with both sources
// in group 0, a resolve names the whole group (in any order; locations [source as named][j]), one source alone is
// refused, and readers end per group. Rows out of the tail come from host, exact for both sources. The open refuses
// groups not numbered in order of first use, and a 1.2-sized config (no groups field) opens with a group per source.
TEST_F(LibdhsTest, SourceGroupsResolveAGroupAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartMemd());
  const uint32_t bad1[kS] = {1, 0}, bad2[kS] = {0, 2}, one_group[kS] = {0, 0};
  for (const uint32_t* bad : {bad1, bad2}) {
    dhs_worker_config c = Config(dir_.path(), 8);
    c.source_groups = bad;
    dhs_worker* w = nullptr;
    EXPECT_EQ(dhs_worker_open(&c, &w), DHS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dhs_worker_errmsg(w)).find("source_groups"), std::string::npos) << dhs_worker_errmsg(w);
    EXPECT_EQ(dhs_worker_close(w), DHS_OK);
  }
  {  // 1.2's struct: its own groups (the field after model_fingerprint is not read)
    dhs_worker_config c = Config(dir_.path(), 8);
    c.struct_size = DHS_WORKER_CONFIG_SIZE_1_2;
    c.source_groups = one_group;
    dhs_worker* w = nullptr;
    ASSERT_EQ(dhs_worker_open(&c, &w), DHS_OK) << dhs_worker_errmsg(w);
    const uint64_t id = [&] {
      dhs_request_desc d = Desc(16, 40);
      uint64_t r = 0;
      EXPECT_EQ(dhs_request_submit(w, &d, &r), DHS_OK);
      for (int i = 0; i < 2000; ++i) {
        dhs_event ev[2];
        size_t n = 0;
        EXPECT_EQ(dhs_worker_poll(w, ev, 2, &n), DHS_OK);
        if (n > 0) break;
        ::poll(nullptr, 0, 5);
      }
      return r;
    }();
    const std::vector<uint8_t> rows = Rows(id, 0, 16);
    ASSERT_EQ(dhs_request_append(w, id, 0, 16, rows.data(), rows.size(), nullptr, 0), DHS_OK) << dhs_worker_errmsg(w);
    const uint32_t both[2] = {0, 1};
    const int64_t sel[1] = {3};
    int64_t loc[2];
    dhs_query q{id, sel, 1, 0, loc};
    EXPECT_EQ(dhs_resolve(w, both, 2, &q, 1), DHS_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(dhs_worker_errmsg(w)).find("not one group's"), std::string::npos) << dhs_worker_errmsg(w);
    EXPECT_EQ(dhs_worker_close(w), DHS_OK);
  }
  dhs_worker_config c = Config(dir_.path(), 8);
  c.mode = DHS_MODE_HISPARSE;
  c.source_groups = one_group;
  ASSERT_EQ(dhs_worker_open(&c, &w_), DHS_OK) << dhs_worker_errmsg(w_);
  const uint64_t id = SubmitGranted(64, 80);
  ASSERT_EQ(Append(id, 0, 64), DHS_OK) << dhs_worker_errmsg(w_);
  dhs_pool_desc pool{};
  pool.struct_size = sizeof pool;
  pool.kind = DHS_POOLS_LIBRARY;
  ASSERT_EQ(dhs_pools_register(w_, &pool), DHS_OK);
  const std::vector<int64_t> sel = {2, 17, 30, -1, 45, 63, 5, 40};  // 2 .. 30 out of the tail (T = 32: 32 .. 63)
  std::vector<int64_t> loc(sel.size() * kS, -7);
  dhs_query q{id, sel.data(), static_cast<uint32_t>(sel.size()), 0, loc.data()};
  const uint32_t s0 = 0, reversed[kS] = {1, 0}, twice[kS] = {0, 0};
  EXPECT_EQ(dhs_resolve(w_, &s0, 1, &q, 1), DHS_ERR_INVALID_ARGUMENT);  // half the group
  EXPECT_NE(std::string(dhs_worker_errmsg(w_)).find("whose sources are [0, 1]"), std::string::npos)
      << dhs_worker_errmsg(w_);
  EXPECT_EQ(dhs_resolve(w_, twice, kS, &q, 1), DHS_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(dhs_resolve(w_, reversed, kS, &q, 1), DHS_OK) << dhs_worker_errmsg(w_);
  for (uint32_t si = 0; si < kS; ++si) {
    const uint32_t s = reversed[si];
    for (size_t j = 0; j < sel.size(); ++j) {
      const int64_t l = loc[si * sel.size() + j];
      if (sel[j] < 0) {
        EXPECT_EQ(l, -1);
        continue;
      }
      ASSERT_GE(l, 0);
      const uint8_t* row = static_cast<const uint8_t*>(pool.base) + l;
      for (uint32_t b = 0; b < kRow; ++b) ASSERT_EQ(row[b], RowByte(id, s, sel[j], b)) << s << " " << sel[j];
    }
  }
  EXPECT_GE(Stats()["census"]["host"].get<uint64_t>(), 2u) << Stats().dump();  // recovered for both sources at once
  const uint32_t s1 = 1;
  EXPECT_EQ(dhs_resolve(w_, reversed, kS, &q, 1), DHS_ERR_FAILED_PRECONDITION);  // readers still open
  ASSERT_EQ(dhs_readers_done(w_, &s1, 1), DHS_OK);  // one source of the group ends the group's readers
  ASSERT_EQ(dhs_resolve(w_, reversed, kS, &q, 1), DHS_OK) << dhs_worker_errmsg(w_);
  ASSERT_EQ(dhs_readers_done(w_, &s0, 1), DHS_OK);
  EXPECT_EQ(dhs_request_complete(w_, id), DHS_OK);
}

}  // namespace
