// tests/workerd/resume_import_test.cc: ResumeImporter (workerd/resume_import.h) alone (issue 23: each room moved out
// of the Worker is tested alone), driven the way the Worker drives a resumed request's prefill: OnGrant, Begin, then
// ImportRun where a host run starts and model steps up to NextHostRow elsewhere. A first store (the worker that died)
// writes a request's pages to a host pool; a second store over a copy of that pool (the restarted worker) resumes a
// shorter record of the same tokens. Asserted against values computed by hand from the grant: the pages whose
// checksums match, the runs imported and the rows recomputed, the positions the prefill reaches after each import and
// each recompute, the figures (and their time, from given time points); and the logits of the resumed request's last
// token equal to the model alone (imported rows are the rows the model computes).
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "tests/workerd/kv_test_util.h"
#include "tests/workerd/worker_test_util.h"
#include "workerd/geometry.h"
#include "workerd/resume_import.h"

namespace dhs::test {
namespace {

constexpr uint32_t kPageRows = 8;

std::vector<model::Token> Tokens(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

WorkerConfig ImportConfig() {
  WorkerConfig c;
  c.mode = WorkerMode::kAdaptive;
  c.page_rows = kPageRows;
  c.tail_rows = 4 * kPageRows;
  c.slots = 2;
  return c;
}

// Feeds tokens [session.position(), end) of `all` in chunks of at most `chunk`, each step's copies completed and
// polled (the Worker's loop polls its KV every iteration). Returns the last step's output.
model::StepOutput Feed(const model::Model& m, model::ModelSession& session, const std::vector<model::Token>& all,
                       Position end, uint32_t chunk, Harness& h) {
  model::StepOutput out;
  while (session.position() < end) {
    const Position from = session.position();
    const Position to = std::min<Position>(end, from + chunk);
    model::StepInput in{&session, std::span<const model::Token>(all).subspan(from, to - from)};
    EXPECT_TRUE(m.Step(std::span<model::StepInput>(&in, 1), *h.kv, std::span<model::StepOutput>(&out, 1)).ok());
    h.device.WaitIdle();
    h.kv->Poll();
  }
  return out;
}

struct Resumable {
  std::unique_ptr<model::Model> m = MakePresetModel("dsv4flash-like");
  WorkerGeometry g;
  std::vector<model::Token> tokens = Tokens(Prompt(48, 3));  // the dead worker fed 48 rows: pages 0..5, all backed
  std::vector<PageIndex> plan = {9, 4, 11, 2, 7, 5};         // host page of history page j
  std::map<uint32_t, uint64_t> sums;                          // history page -> checksum of its confirmed copy
  std::vector<uint8_t> host;                                  // the host pool the dead worker left
};

Resumable Prepare() {
  Resumable s;
  absl::StatusOr<WorkerGeometry> g = ComputeGeometry(s.m->config(), ImportConfig());
  EXPECT_TRUE(g.ok()) << g.status();
  s.g = *g;
  Harness h(s.g.kv, 12);
  EXPECT_TRUE(h.kv->PlanResidency(1, 0, s.plan, {}).ok());
  model::ModelSession session = s.m->NewSession(1);
  Feed(*s.m, session, s.tokens, 48, s.g.prefill_chunk, h);  // every page completes and is backed up
  for (uint32_t page = 0; page < 6; ++page) s.sums[page] = h.kv->HostChecksum(1, page);
  s.host = h.host;
  return s;
}

// The record holds 45 tokens (p = 8): pages wholly before its last token (row 44) are 0..4 ((45 - 1) / 8 = 5). The
// grant names pages 0, 1, 3, 4, 5; page 4's checksum is wrong, so it is not host-backed. Runs: pages 0-1 (rows
// 0..15) and page 3 (rows 24..31); recomputed: rows 16..23 and 32..44. Imported 24 rows, recomputed 21; page 5 is
// host-ready (its confirmed copy is never written again) but holds the last token's page: recomputed.
TEST(ResumeImporter, ImportsTheRunsOfMatchingPagesAndRecomputesTheRest) {
  Resumable s = Prepare();
  for (uint32_t page = 0; page < 6; ++page) ASSERT_NE(s.sums[page], 0u) << "page " << page << " was not backed up";
  Harness h(s.g.kv, 12);  // the restarted worker's store over the same host pool
  std::copy(s.host.begin(), s.host.end(), h.host.begin());
  ASSERT_TRUE(h.kv->PlanResidency(1, 0, s.plan, {}).ok());
  lib::HierarchicalPortStore store(h.kv.get());
  lib::KvPort port(&store);  // libdhs's data path over the store, as the Worker wires it
  ResumeImporter importer(s.m.get(), &port, kPageRows);
  ResumeState state;
  const auto t0 = std::chrono::steady_clock::now();
  ResumeImporter::Start(state, t0);
  EXPECT_TRUE(ResumeImporter::resumed(state));

  wire::AdmitGrantT grant;
  grant.host_backed_pages = {0, 1, 3, 4, 5};
  grant.host_backed_checksums = {s.sums[0], s.sums[1], s.sums[3], s.sums[4] ^ 1, s.sums[5]};
  ASSERT_TRUE(importer.OnGrant(state, 1, 7, grant).ok());
  EXPECT_EQ(state.host_backed, (std::vector<HostBackedPage>{{0, s.sums[0]}, {1, s.sums[1]}, {3, s.sums[3]},
                                                             {5, s.sums[5]}}));
  const Position n = 45;
  ASSERT_TRUE(importer.Begin(state, 1, 7, n));
  EXPECT_EQ(state.runs, (std::deque<HostRun>{{0, 2}, {3, 1}}));
  EXPECT_EQ(state.rows_imported, 24);
  EXPECT_EQ(state.rows_recomputed, 21);
  EXPECT_TRUE(ResumeImporter::importing(state));

  // The prefill as the Worker runs it: (start, end, imported) of each stretch.
  std::vector<std::tuple<Position, Position, bool>> stretches;
  model::ModelSession session = s.m->NewSession(1);
  model::StepOutput last;
  Position fed = 0;
  while (fed < n) {
    const Position from = fed;
    if (importer.RunAt(state, fed)) {
      ASSERT_TRUE(importer.ImportRun(state, 1, session, fed));
      EXPECT_EQ(session.position(), fed);
      stretches.emplace_back(from, fed, true);
      continue;
    }
    const Position stop = importer.NextHostRow(state, n);
    last = Feed(*s.m, session, s.tokens, stop, s.g.prefill_chunk, h);
    fed = session.position();
    stretches.emplace_back(from, fed, false);
  }
  EXPECT_EQ(stretches, (std::vector<std::tuple<Position, Position, bool>>{
                           {0, 16, true}, {16, 24, false}, {24, 32, true}, {32, 45, false}}));
  EXPECT_FALSE(ResumeImporter::importing(state));
  // Through libdhs's data path: 4 pages verified, page 4 refused, the 3 pages of the two runs imported.
  EXPECT_EQ(port.counters().pages_verified, 4u);
  EXPECT_EQ(port.counters().pages_mismatched, 1u);
  EXPECT_EQ(port.counters().pages_imported, 3u);

  // Exact: the next token's logits are those of the model alone over the 45 tokens.
  const Generated oracle = Oracle(*s.m, std::vector<model::Token>(s.tokens.begin(), s.tokens.begin() + n), 1);
  const std::span<const float> logits = std::span<const float>(last.logits).last(model::kVocab);
  EXPECT_EQ(LogitsDigest(logits), oracle.digests[0]);

  importer.FirstNewToken(state, 1, 7, t0 + std::chrono::microseconds(2500));
  EXPECT_EQ(importer.counters().rows_imported, 24u);
  EXPECT_EQ(importer.counters().rows_recomputed, 21u);
  EXPECT_EQ(importer.counters().resume_us_max, 2500u);
  ASSERT_EQ(importer.figures().count(7), 1u);
  const ResumeFigures& f = importer.figures().at(7);
  EXPECT_EQ(f.request, 1u);
  EXPECT_EQ(f.rows_imported, 24u);
  EXPECT_EQ(f.rows_recomputed, 21u);
  EXPECT_EQ(f.resume_us, 2500u);
}

// A rebuild after the first run was imported (the Worker recomputes the request's KV from its tokens): the rows
// imported so far count as recomputed, the run left (page 3) is still imported: 8 imported, 37 recomputed.
TEST(ResumeImporter, ARebuildCountsTheImportedRowsRecomputedAndKeepsTheRunsLeft) {
  Resumable s = Prepare();
  Harness h(s.g.kv, 12);
  std::copy(s.host.begin(), s.host.end(), h.host.begin());
  ASSERT_TRUE(h.kv->PlanResidency(1, 0, s.plan, {}).ok());
  lib::HierarchicalPortStore store(h.kv.get());
  lib::KvPort port(&store);  // libdhs's data path over the store, as the Worker wires it
  ResumeImporter importer(s.m.get(), &port, kPageRows);
  ResumeState state;
  ResumeImporter::Start(state, std::chrono::steady_clock::now());
  wire::AdmitGrantT grant;
  grant.host_backed_pages = {0, 1, 3};
  grant.host_backed_checksums = {s.sums[0], s.sums[1], s.sums[3]};
  ASSERT_TRUE(importer.OnGrant(state, 1, 7, grant).ok());
  ASSERT_TRUE(importer.Begin(state, 1, 7, 45));
  model::ModelSession session = s.m->NewSession(1);
  Position fed = 0;
  ASSERT_TRUE(importer.ImportRun(state, 1, session, fed));
  EXPECT_EQ(fed, 16);
  // The rebuild as the Worker does it (ResidencyAgent::RebuildKv: released and planned again), then AfterRebuild.
  h.kv->Release(1);
  ASSERT_TRUE(h.kv->PlanResidency(1, 0, s.plan, {}).ok());
  importer.AfterRebuild(state, 1);
  EXPECT_EQ(state.runs, (std::deque<HostRun>{{3, 1}}));
  EXPECT_EQ(state.rows_imported, 8);
  EXPECT_EQ(state.rows_recomputed, 37);
  EXPECT_EQ(importer.counters().rows_imported, 8u);
  EXPECT_EQ(importer.counters().rows_recomputed, 37u);
  EXPECT_EQ(importer.NextHostRow(state, 45), 24);
  session = s.m->NewSession(1);  // rows 0..15 recomputed; the run at page 3 still imports
  Feed(*s.m, session, s.tokens, 24, s.g.prefill_chunk, h);
  fed = session.position();
  ASSERT_TRUE(importer.RunAt(state, fed));
  ASSERT_TRUE(importer.ImportRun(state, 1, session, fed));
  EXPECT_EQ(fed, 32);
  EXPECT_FALSE(ResumeImporter::importing(state));
}

// The grant takes its pages as libdhs's grant does (KvPort::TakeGrantedHostPages): page 0 matches its checksum and
// is host-ready from the grant on (importable before Begin plans anything); page 1's checksum is wrong: not host-ready,
// its import is refused (its rows are recomputed). The port counts 1 verified, 1 mismatched.
TEST(ResumeImporter, TheGrantMakesOnlyItsCheckedPagesHostReady) {
  Resumable s = Prepare();
  Harness h(s.g.kv, 12);
  std::copy(s.host.begin(), s.host.end(), h.host.begin());
  ASSERT_TRUE(h.kv->PlanResidency(1, 0, s.plan, {}).ok());
  lib::HierarchicalPortStore store(h.kv.get());
  lib::KvPort port(&store);
  ResumeImporter importer(s.m.get(), &port, kPageRows);
  ResumeState state;
  ResumeImporter::Start(state, std::chrono::steady_clock::now());
  wire::AdmitGrantT grant;
  grant.host_backed_pages = {0, 1};
  grant.host_backed_checksums = {s.sums[0], s.sums[1] ^ 1};
  ASSERT_TRUE(importer.OnGrant(state, 1, 7, grant).ok());
  EXPECT_EQ(state.host_backed, (std::vector<HostBackedPage>{{0, s.sums[0]}}));
  EXPECT_EQ(port.counters().pages_verified, 1u);
  EXPECT_EQ(port.counters().pages_mismatched, 1u);
  std::vector<std::vector<float>> keys;
  ASSERT_TRUE(port.ImportRows(1, 0, 1, keys).ok()) << "page 0 is not host-ready at the grant";
  const absl::Status refused = port.ImportRows(1, 1, 1, keys);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
}

// Resident mode (no hierarchy): nothing is imported, every row is recomputed, whatever the grant names.
TEST(ResumeImporter, ResidentModeRecomputesEveryRow) {
  auto m = MakePresetModel("dsv4flash-like");
  ResumeImporter importer(m.get(), nullptr, kPageRows);
  ResumeState state;
  ResumeImporter::Start(state, std::chrono::steady_clock::now());
  wire::AdmitGrantT grant;
  grant.host_backed_pages = {0, 1, 2};
  grant.host_backed_checksums = {11, 12, 13};
  ASSERT_TRUE(importer.OnGrant(state, 1, 7, grant).ok());
  ASSERT_TRUE(importer.Begin(state, 1, 7, 30));
  EXPECT_TRUE(state.runs.empty());
  EXPECT_EQ(state.rows_imported, 0);
  EXPECT_EQ(state.rows_recomputed, 30);
  EXPECT_EQ(importer.NextHostRow(state, 30), 30);
  EXPECT_FALSE(importer.RunAt(state, 0));
  EXPECT_EQ(importer.counters().rows_recomputed, 30u);
}

}  // namespace
}  // namespace dhs::test
