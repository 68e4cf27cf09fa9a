// tests/workerd/worker_integrity_test.cc: host-page integrity through the worker (issue 22), in process with the fake
// memd (tests/workerd/worker_test_util.h), which keeps the checksum each confirmation carries and hands it to a
// resume's grant as memd does.
//
// (a) Resume: worker A serves requests until each decoded 20 tokens and is dropped; memd fences the GPU, keeping the
//     confirmed host copies; a byte of one kept page of request 1 changes in the host pool. Worker B checks every
//     host-backed page against its checksum before importing it: the changed page is recomputed from the record's
//     tokens (counted: one mismatch, its 16 rows recomputed instead of imported) and every stream equals the
//     uninterrupted run token for token and digest for digest.
// (b) Live recovery: a byte of each confirmed host page of a live request changes right after its confirmation; the
//     next recovery of a row of such a page fails the request with DATA_LOSS. Every token it streamed before is the
//     uninterrupted run's: never a token from foreign bytes, never success.
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/workerd/worker_test_util.h"
#include "workerd/device/cpu_device.h"

namespace dhs::test {
namespace {

struct Spec {
  RequestId id;
  size_t prompt;
  uint32_t max_new;
  float temperature;
  float top_p;
  uint64_t seed;
};

wire::SubmitRequestT SubmitOf(const Spec& s) {
  wire::SubmitRequestT sub;
  sub.request = s.id;
  sub.prompt = Prompt(s.prompt, static_cast<uint32_t>(s.id));
  sub.max_new_tokens = s.max_new;
  sub.temperature = s.temperature;
  sub.top_p = s.top_p;
  sub.seed = s.seed;
  return sub;
}

WorkerConfig SideConfig() {
  WorkerConfig config;
  config.mode = WorkerMode::kHisparse;  // every completed page goes to host; recoveries read host pages
  config.page_rows = 16;
  config.tail_rows = 32;
  config.slots = 4;
  config.max_context_tokens = 200;
  return config;
}

std::unique_ptr<FakeMemd> SharedMemd(const model::Model* m) {
  const WorkerConfig config = SideConfig();
  auto g = ComputeGeometry(m->config(), config);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_unique<FakeMemd>(0, g->host_page_bytes, config.page_rows, 256, 1, false, config.slots);
}

struct Side {
  Side(const model::Model* m, uint64_t epoch, FakeMemd* shared) : config(SideConfig()), memd(shared) {
    auto g = ComputeGeometry(m->config(), config);
    EXPECT_TRUE(g.ok()) << g.status();
    host_page_bytes = g->host_page_bytes;
    config.hbm_budget_bytes = 64 * g->page_bytes;
    auto w = Worker::Create(m, &device, config, memd, &sink);
    EXPECT_TRUE(w.ok()) << w.status();
    worker = std::move(*w);
    worker->book().set_epoch(epoch);
  }
  WorkerConfig config;
  uint64_t host_page_bytes = 0;
  CpuDevice device;
  FakeMemd* memd;
  RecordingSink sink;
  std::unique_ptr<Worker> worker;
};

TEST(WorkerIntegrity, AResumedPageThatChangedIsRecomputedAndTheStreamsStayExact) {
  auto m = MakePresetModel("dsv4flash-like");
  const std::vector<Spec> specs = {{1, 57, 40, 0.0f, 1.0f, 0}, {2, 70, 36, 0.9f, 1.0f, 7}};
  std::map<RequestId, Generated> want;
  for (const Spec& s : specs) {
    const std::vector<uint8_t> p = Prompt(s.prompt, static_cast<uint32_t>(s.id));
    want[s.id] = Oracle(*m, {p.begin(), p.end()}, s.max_new, s.temperature, s.top_p, s.seed, s.id);
  }
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get());
  std::map<RequestId, wire::RequestRecordT> records;
  std::map<RequestId, size_t> had;
  uint64_t hpb = 0;
  {
    Side a(m.get(), 1, memd.get());
    hpb = a.host_page_bytes;
    for (const Spec& s : specs) ASSERT_TRUE(a.worker->Submit(SubmitOf(s), ClientRef{"c", s.id}).ok());
    auto fewest = [&] {
      size_t n = SIZE_MAX;
      for (const Spec& s : specs) n = std::min(n, a.sink.out[s.id].tokens.size());
      return n;
    };
    for (int it = 0; it < 2000 && fewest() < 20; ++it) {
      a.memd->Pump(*a.worker);
      ASSERT_TRUE(a.worker->Iterate().ok());
    }
    EXPECT_GT(a.worker->stats().host_integrity.pages_checksummed, 0u);
    for (const Spec& s : specs) {
      had[s.id] = a.sink.out[s.id].tokens.size();
      ASSERT_LT(had[s.id], s.max_new);
      records[s.id] = a.memd->records.at(s.id);
    }
  }
  memd->Fence();
  // Expected figures from memd's kept pages (as worker_resume_test), less the changed page of request 1.
  uint64_t imported = 0, recomputed = 0;
  uint32_t changed = UINT32_MAX;
  for (const Spec& s : specs) {
    const uint64_t n = s.prompt + records[s.id].tokens.size();
    for (const auto& [j, hp] : memd->interrupted.at(s.id)) {
      if (j >= (n - 1) / 16) continue;
      if (s.id == 1 && changed == UINT32_MAX) {
        changed = j;
        ASSERT_NE(memd->host_checksums[hp], 0u) << "confirmed without a checksum";
        memd->host[hp * hpb + 100] ^= 0x20;  // a payload byte of history page j of request 1
        continue;
      }
      imported += 16;
    }
    recomputed += n;
  }
  recomputed -= imported;
  ASSERT_NE(changed, UINT32_MAX) << "request 1 kept no page before its last token";
  Side b(m.get(), 2, memd.get());
  for (const Spec& s : specs) {
    ASSERT_TRUE(b.worker->admission().Resume(s.id, records[s.id]).ok());
    ASSERT_TRUE(b.worker->Attach(s.id, static_cast<uint32_t>(had[s.id]), ClientRef{"c2", s.id}).ok());
  }
  for (int it = 0; it < 5000; ++it) {
    b.memd->Pump(*b.worker);
    absl::StatusOr<bool> more = b.worker->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more && b.worker->book().active() == 0 && b.worker->book().not_active() == 0) break;
  }
  EXPECT_TRUE(b.sink.errors.empty()) << b.sink.errors.begin()->second;
  for (const Spec& s : specs) {
    SCOPED_TRACE("request " + std::to_string(s.id));
    EXPECT_EQ(b.sink.finished.count(s.id), 1u);
    const Generated stream = StitchedStream(want[s.id], had[s.id], b.sink.out[s.id]);  // A's part, then B's chunks
    EXPECT_EQ(stream.tokens, want[s.id].tokens);
    EXPECT_EQ(stream.digests, want[s.id].digests);
  }
  const WorkerStats st = b.worker->stats();
  EXPECT_EQ(st.host_integrity.mismatches, 1u);
  EXPECT_EQ(st.rows_imported, imported);
  EXPECT_EQ(st.rows_recomputed, recomputed);
  EXPECT_EQ(memd->completes, 2);
  EXPECT_EQ(memd->host_pages_held(), 0u);
}

TEST(WorkerIntegrity, ALivePageThatChangedFailsItsRequestWithDataLossNeverWrongTokens) {
  auto m = MakePresetModel("dsv4flash-like");
  const Spec s{1, 70, 80, 0.0f, 1.0f, 0};
  const std::vector<uint8_t> prompt = Prompt(s.prompt, 1);
  const Generated want = Oracle(*m, {prompt.begin(), prompt.end()}, s.max_new, 0.0f, 1.0f, 0, 1);
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get());
  Side a(m.get(), 1, memd.get());
  ASSERT_TRUE(a.worker->Submit(SubmitOf(s), ClientRef{"c", s.id}).ok());
  std::set<PageIndex> changed;
  for (int it = 0; it < 3000; ++it) {
    a.memd->Pump(*a.worker);
    absl::StatusOr<bool> more = a.worker->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
    // Every host page confirmed since the last iteration changes one byte (a payload byte of its first row).
    for (const auto& [hp, sum] : memd->host_checksums) {
      if (changed.insert(hp).second) memd->host[hp * a.host_page_bytes + 1] ^= 0x01;
    }
    if (!*more && a.worker->book().active() == 0 && a.worker->book().not_active() == 0) break;
  }
  ASSERT_FALSE(changed.empty());
  // Its final chunk is the DATA_LOSS error: never a successful end.
  ASSERT_FALSE(a.sink.chunks.empty());
  const wire::TokenChunkT& last = a.sink.chunks.back();
  EXPECT_EQ(last.request, s.id);
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.error, wire::ErrorCode::DATA_LOSS) << "served to the end with foreign bytes in its host pages: "
                                                    << last.error_message;
  const Generated& got = a.sink.out[s.id];
  ASSERT_LE(got.tokens.size(), want.tokens.size());
  EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), want.tokens.begin()));
  EXPECT_TRUE(std::equal(got.digests.begin(), got.digests.end(), want.digests.begin()));
  const WorkerStats st = a.worker->stats();
  EXPECT_GE(st.host_integrity.mismatches, 1u);
  EXPECT_EQ(st.failed_requests, 1u);
  EXPECT_EQ(memd->completes, 1);
}

}  // namespace
}  // namespace dhs::test
