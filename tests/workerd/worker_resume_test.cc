// tests/workerd/worker_resume_test.cc: resume after a worker restart (issue 11), in process with the fake memd.
//
// Worker A serves four requests (greedy and sampled) and is dropped mid-decode at a chosen step (the in-process
// stand-in for SIGKILL; tests/workerd/worker_fence_process_test.cc kills real processes). Worker B (epoch 2) resumes
// them from the records the fake memd kept as memd does (AdmitRequest.record + TokensCommitted), recomputing their KV
// from the tokens; their clients re-attach saying how many tokens they have: one at once, one while B decodes, one
// after its request finished, and one whose record lacks the last token the client got (the TokensCommitted of A's
// last step lost); request 1's client lacks the last token its record holds (A killed between the two sends). Each client's stream (A's chunks, then B's) equals the uninterrupted oracle run token for token
// and digest for digest: nothing lost, nothing twice.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
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

const std::vector<Spec>& Specs() {
  static const std::vector<Spec> s = {
      {1, 20, 20, 0.0f, 1.0f, 0}, {2, 33, 22, 0.9f, 1.0f, 7}, {3, 15, 18, 1.0f, 0.9f, 8}, {4, 41, 21, 0.0f, 1.0f, 0}};
  return s;
}

// Each spec's uninterrupted stream (the model alone, the spec's sampling, draws keyed by its id), by id.
std::map<RequestId, Generated> Oracles(const model::Model& m, const std::vector<Spec>& specs) {
  std::map<RequestId, Generated> want;
  for (const Spec& s : specs) {
    const std::vector<uint8_t> p = Prompt(s.prompt, static_cast<uint32_t>(s.id));
    want[s.id] = Oracle(m, {p.begin(), p.end()}, s.max_new, s.temperature, s.top_p, s.seed, s.id);
  }
  return want;
}

// The client's SubmitRequest of `s` (its prompt from Prompt).
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

WorkerConfig SideConfig(WorkerMode mode, uint32_t tail_rows = 32) {
  WorkerConfig config;
  config.mode = mode;
  config.page_rows = 16;
  config.tail_rows = tail_rows;
  config.slots = 4;
  config.max_context_tokens = 200;
  return config;
}

// The memd both lives of the GPU talk to (memd outlives its workers): `gpu_pages` optional pages to keep history on.
std::unique_ptr<FakeMemd> SharedMemd(const model::Model* m, WorkerMode mode, uint32_t gpu_pages) {
  const WorkerConfig config = SideConfig(mode);
  auto g = ComputeGeometry(m->config(), config);
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_unique<FakeMemd>(gpu_pages, g->host_page_bytes, config.page_rows, 256, 1, false, config.slots);
}

// One life of the worker of GPU 0 (epoch `epoch`) against `memd`.
struct Side {
  Side(const model::Model* m, uint64_t epoch, FakeMemd* shared, WorkerMode mode = WorkerMode::kAdaptive,
       uint32_t tail_rows = 32)
      : config(SideConfig(mode, tail_rows)), memd(shared) {
    auto g = ComputeGeometry(m->config(), config);
    EXPECT_TRUE(g.ok()) << g.status();
    config.hbm_budget_bytes = 64 * g->page_bytes;
    auto w = Worker::Create(m, &device, config, memd, &sink);
    EXPECT_TRUE(w.ok()) << w.status();
    worker = std::move(*w);
    worker->book().set_epoch(epoch);
  }
  WorkerConfig config;
  CpuDevice device;
  FakeMemd* memd;
  RecordingSink sink;
  std::unique_ptr<Worker> worker;
};

TEST(WorkerResume, ResumedRequestsStreamExactlyTheUninterruptedTokensToReattachedClients) {
  auto m = MakePresetModel("dsv4flash-like");
  std::map<RequestId, Generated> want = Oracles(*m, Specs());
  // Worker A: A is dropped right after the step where the last of the requests streamed its 2nd token.
  std::map<RequestId, wire::RequestRecordT> records;
  std::map<RequestId, size_t> had;  // tokens each client received from A
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kAdaptive, 64);
  {
    Side a(m.get(), 1, memd.get());
    for (const Spec& s : Specs()) {
      ASSERT_TRUE(a.worker->Submit(SubmitOf(s), ClientRef{"c", s.id}).ok());
    }
    auto fewest = [&] {
      size_t n = SIZE_MAX;
      for (const Spec& s : Specs()) n = std::min(n, a.sink.out[s.id].tokens.size());
      return n;
    };
    for (int it = 0; it < 500 && fewest() < 2; ++it) {
      a.memd->Pump(*a.worker);
      ASSERT_TRUE(a.worker->Iterate().ok());
    }
    for (const Spec& s : Specs()) {
      had[s.id] = a.sink.out[s.id].tokens.size();
      ASSERT_GE(had[s.id], 1u) << "request " << s.id << " had not started decoding at the kill point";
      ASSERT_LT(had[s.id], s.max_new) << "request " << s.id << " finished before the kill point";
      EXPECT_EQ(a.sink.out[s.id].tokens, std::vector<int>(want[s.id].tokens.begin(),
                                                          want[s.id].tokens.begin() + had[s.id]));
      records[s.id] = a.memd->records.at(s.id);  // node id == client id on GPU 0, epoch 1
      ASSERT_EQ(records[s.id].tokens.size(), had[s.id]) << "memd's record must hold every token streamed";
    }
  }
  records[4].tokens.pop_back();  // A's last TokensCommitted for request 4 never reached memd
  records[4].logits_digests.pop_back();
  had[1] -= 1;  // A was killed between committing request 1's last token and sending its chunk: the client lacks it
  memd->Fence();  // memd fences A's GPU: the requests are interrupted, keeping their confirmed host copies
  // Worker B (epoch 2) resumes all four; clients 1 and 4 attach at once, 2 while B decodes, 3 after its end.
  Side b(m.get(), 2, memd.get());
  uint64_t rows = 0;
  for (const Spec& s : Specs()) {
    ASSERT_TRUE(b.worker->admission().Resume(s.id, records[s.id]).ok());
    rows += s.prompt + records[s.id].tokens.size();
  }
  EXPECT_EQ(b.memd->completes, 0);  // the interrupted ids end with their resumes' admissions (resume_of)
  EXPECT_EQ(b.memd->resumes, 4);
  EXPECT_TRUE(b.memd->interrupted.empty());
  EXPECT_EQ(b.worker->Attach(9, 0, ClientRef{"c2", 1}).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(b.worker->Attach(1, static_cast<uint32_t>(had[1]), ClientRef{"c2", 1}).ok());
  ASSERT_TRUE(b.worker->Attach(4, static_cast<uint32_t>(had[4]), ClientRef{"c2", 4}).ok());
  bool attached2 = false;
  for (int it = 0; it < 5000; ++it) {
    b.memd->Pump(*b.worker);
    absl::StatusOr<bool> more = b.worker->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
    if (!attached2 && b.worker->stats().tokens_generated >= 4) {
      ASSERT_TRUE(b.worker->Attach(2, static_cast<uint32_t>(had[2]), ClientRef{"c2", 2}).ok());
      attached2 = true;
    }
    if (!*more && b.worker->book().active() == 0 && b.worker->book().not_active() == 0) break;
  }
  ASSERT_TRUE(attached2);
  EXPECT_EQ(b.sink.finished.count(3), 0u);  // finished without a client: its output waits
  ASSERT_TRUE(b.worker->Attach(3, static_cast<uint32_t>(had[3]), ClientRef{"c2", 3}).ok());
  EXPECT_EQ(b.worker->Attach(3, 0, ClientRef{"c2", 3}).code(), absl::StatusCode::kNotFound);  // streamed once
  EXPECT_TRUE(b.sink.errors.empty()) << b.sink.errors.begin()->second;
  for (const Spec& s : Specs()) {
    SCOPED_TRACE("request " + std::to_string(s.id));
    EXPECT_EQ(b.sink.finished.count(s.id), 1u);
    // A's tokens of the first life, then B's: the uninterrupted run, nothing lost, nothing twice.
    const Generated stream = StitchedStream(want[s.id], had[s.id], b.sink.out[s.id]);  // A's part, then B's chunks
    EXPECT_EQ(stream.tokens, want[s.id].tokens);
    EXPECT_EQ(stream.digests, want[s.id].digests);
  }
  const WorkerStats st = b.worker->stats();
  EXPECT_EQ(st.requests_resumed, 4u);
  EXPECT_EQ(st.rows_recomputed + st.rows_imported, rows);
  EXPECT_EQ(b.memd->completes, 4);  // and each resumed request ended once
  EXPECT_EQ(b.memd->host_pages_held(), 0u);
  std::printf("resumed 4 requests, %llu rows recomputed, longest resume %llu us\n",
              static_cast<unsigned long long>(st.rows_recomputed), static_cast<unsigned long long>(st.resume_us_max));
}

// Resume from host KV (issue 11): worker A serves four requests (greedy and sampled) until each decoded 20 tokens and
// is dropped; memd fences the GPU, keeping the pages with a confirmed host copy (every completed page is backed up:
// memd gives no optional GPU page). Worker B imports each request's kept pages (index keys into the session, payload
// host-resident) and recomputes only the rest: the expected counts come from the pages memd
// kept. The clients' streams equal the uninterrupted run token for token and digest for digest, and no host page is
// held at the end. Fallbacks: resident mode keeps nothing on host, and a fence that kept nothing (`drop`): everything
// is recomputed, as exactly. The printed resume times compare importing with recomputing the same requests.
struct ImportCase {
  WorkerMode mode;
  bool keep;          // memd keeps the confirmed host copies at the fence
  bool chaos = false;  // B's memd populates (imported pages among them) and reclaims at random
};
class WorkerImport : public ::testing::TestWithParam<ImportCase> {
 protected:
  WorkerMode Mode() const { return GetParam().mode; }
};

TEST_P(WorkerImport, KeptHostPagesAreImportedNotRecomputedAndTheStreamsStayExact) {
  auto m = MakePresetModel("dsv4flash-like");
  const std::vector<Spec> specs = {
      {1, 40, 40, 0.0f, 1.0f, 0}, {2, 57, 40, 0.9f, 1.0f, 7}, {3, 70, 36, 1.0f, 0.9f, 8}, {4, 33, 44, 0.0f, 1.0f, 0}};
  std::map<RequestId, Generated> want = Oracles(*m, specs);
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), Mode(), 0);
  std::map<RequestId, wire::RequestRecordT> records;
  std::map<RequestId, size_t> had;
  {
    Side a(m.get(), 1, memd.get(), Mode());
    for (const Spec& s : specs) {
      ASSERT_TRUE(a.worker->Submit(SubmitOf(s), ClientRef{"c", s.id}).ok());
    }
    auto fewest = [&] {
      size_t n = SIZE_MAX;
      for (const Spec& s : specs) n = std::min(n, a.sink.out[s.id].tokens.size());
      return n;
    };
    for (int it = 0; it < 2000 && fewest() < 20; ++it) {
      a.memd->Pump(*a.worker);
      ASSERT_TRUE(a.worker->Iterate().ok());
    }
    for (const Spec& s : specs) {
      had[s.id] = a.sink.out[s.id].tokens.size();
      ASSERT_LT(had[s.id], s.max_new) << "request " << s.id << " finished before the kill point";
      records[s.id] = a.memd->records.at(s.id);
    }
  }
  memd->Fence(GetParam().keep);
  // What B must import and recompute, from the pages memd kept: every confirmed host copy among the pages wholly
  // before the last token of the record (prompt + committed tokens; that token is fed by a step).
  uint64_t imported = 0, recomputed = 0, taken = 0;
  for (const Spec& s : specs) {
    const std::map<uint32_t, PageIndex>& kept = memd->interrupted.at(s.id);
    taken += kept.size();
    const uint64_t n = s.prompt + records[s.id].tokens.size();
    uint64_t rows = 0;
    for (const auto& [j, hp] : kept) rows += j < (n - 1) / 16 ? 16 : 0;
    imported += rows;
    recomputed += n - rows;
  }
  const bool imports = Mode() != WorkerMode::kResident && GetParam().keep;  // else nothing is on host
  if (imports) {
    ASSERT_GT(imported, 0u) << "no page had a confirmed host copy at the kill point";
  } else {
    ASSERT_EQ(imported, 0u);
  }
  if (GetParam().chaos) memd->EnableChaos(16);
  Side b(m.get(), 2, memd.get(), Mode());
  for (const Spec& s : specs) {
    ASSERT_TRUE(b.worker->admission().Resume(s.id, records[s.id]).ok());
    ASSERT_TRUE(b.worker->Attach(s.id, static_cast<uint32_t>(had[s.id]), ClientRef{"c2", s.id}).ok());
  }
  EXPECT_EQ(memd->resumes, 4);
  EXPECT_EQ(memd->pages_taken_over, taken);
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
  EXPECT_EQ(st.requests_resumed, 4u);
  EXPECT_EQ(st.rows_imported, imported);
  EXPECT_EQ(st.rows_recomputed, recomputed);
  if (imports) EXPECT_LT(st.rows_recomputed, imported + recomputed);
  EXPECT_EQ(memd->completes, 4);
  EXPECT_EQ(memd->host_pages_held(), 0u);
  if (GetParam().chaos) EXPECT_GT(memd->pages_populated, 0);
  std::printf("%s%s%s: resumed 4 requests: %llu rows imported from host, %llu recomputed, longest resume %llu us\n",
              std::string(WorkerModeName(Mode())).c_str(), GetParam().keep ? "" : " (nothing kept)",
              GetParam().chaos ? " (populate/reclaim chaos)" : "",
              static_cast<unsigned long long>(st.rows_imported),
              static_cast<unsigned long long>(st.rows_recomputed),
              static_cast<unsigned long long>(st.resume_us_max));
}

INSTANTIATE_TEST_SUITE_P(Modes, WorkerImport,
                         ::testing::Values(ImportCase{WorkerMode::kHisparse, true}, ImportCase{WorkerMode::kAdaptive, true},
                                           ImportCase{WorkerMode::kResident, true},
                                           ImportCase{WorkerMode::kHisparse, false},
                                           ImportCase{WorkerMode::kAdaptive, true, true}),
                         [](const auto& info) {
                           return std::string(WorkerModeName(info.param.mode)) +
                                  (info.param.keep ? "" : "_nothing_kept") + (info.param.chaos ? "_chaos" : "");
                         });

// Resume from host KV with gaps (issue 11): worker A (a tail of 128 rows, so that held backups do not stall it) serves
// four requests (greedy and sampled); the device's copy hook holds the host backups of history pages 1 and 3 of every
// request, and A is dropped mid-decode with them held; they then fail (the dead GPU's copies never landed: those
// host pages hold nothing). In adaptive mode memd also kept request 1's pages 0 and 1 on GPU at its grant (no host
// copy: resident-first). So memd keeps copy, gap, copy, gap, copies.. (hisparse) and gap, gap, copy, gap, copies..
// (adaptive, request 1). Worker B imports every kept page and recomputes only the others, in position order. Each
// request's figures equal what memd's view of its pages says (kept pages wholly before the last token imported, the
// rest recomputed), and the clients' streams equal the uninterrupted run token for token and digest for digest.
struct GapCase {
  WorkerMode mode;
  bool chaos = false;  // B's memd populates (pages not imported yet among them) and reclaims at random
  // B's first host->device copy into a request slot (a row written into its tail, here the first imported run's, or a
  // host recovery into its hot cache) fails: the batched step that depends on it fails and each of its requests is
  // rebuilt from its tokens (Worker::ReplayFed), its host-backed pages host-ready again, the runs still ahead
  // imported. B has T = 32 then (tail slots shared by pages 2 apart), so the no-rewrite check is not made.
  bool fail_step = false;
};
class WorkerImportGaps : public ::testing::TestWithParam<GapCase> {};

TEST_P(WorkerImportGaps, EveryKeptPageIsImportedAroundTheGapsAndTheStreamsStayExact) {
  const WorkerMode mode = GetParam().mode;
  constexpr uint32_t kTail = 128, kP = 16;
  auto m = MakePresetModel("dsv4flash-like");
  const std::vector<Spec> specs = {
      {1, 70, 40, 0.0f, 1.0f, 0}, {2, 57, 40, 0.9f, 1.0f, 7}, {3, 66, 36, 1.0f, 0.9f, 8}, {4, 65, 44, 0.0f, 1.0f, 0}};
  std::map<RequestId, Generated> want = Oracles(*m, specs);
  // Adaptive: 2 GPU pages to keep history on, all granted to request 1 (its pages 0 and 1). Request 4's record loses
  // its tokens below.
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), mode, mode == WorkerMode::kAdaptive ? 2 : 0);
  std::map<RequestId, wire::RequestRecordT> records;
  std::map<RequestId, size_t> had;
  {
    Side a(m.get(), 1, memd.get(), mode, kTail);
    HierarchicalKvAccess* kv = a.worker->hierarchical();
    ASSERT_NE(kv, nullptr);
    a.device.SetCopyHook([&](const CopyInfo& info) {
      if (info.kind != CopyKind::kDeviceToHost || info.device.empty()) return CopyFate::kRun;
      for (const Spec& s : specs) {
        const RequestKv* r = kv->Find(s.id);
        if (r == nullptr) continue;
        for (Position page : {1, 3}) {
          if (info.device[0].offset == kv->layout().TailRow(r->slot, 0, page * kP)) return CopyFate::kHold;
        }
      }
      return CopyFate::kRun;
    });
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
    for (const Spec& s : specs) {
      had[s.id] = a.sink.out[s.id].tokens.size();
      ASSERT_LT(had[s.id], s.max_new) << "request " << s.id << " finished before the kill point";
      ASSERT_LT(s.prompt + had[s.id], kP + kTail) << "a held page's tail slot would be needed";
      records[s.id] = a.memd->records.at(s.id);
    }
    EXPECT_GE(a.device.HeldCopies().size(), 7u) << "the backups of pages 1 and 3 were not all held";
    for (uint64_t id : a.device.HeldCopies()) a.device.ReleaseHeld(id, /*fail=*/true);  // never landed
  }  // A is gone (its copies ended)
  // Request 4's record lost every token (no TokensCommitted of A reached memd): its 65 rows end inside page 4, which
  // A had completed and backed up: a host-backed page after the last token, recomputed, never written again.
  records[4].tokens.clear();
  records[4].logits_digests.clear();
  memd->Fence();
  EXPECT_TRUE(memd->interrupted.at(4).contains(4));
  // What B must import and recompute, from memd's view of each request's pages: every kept page wholly before the
  // last token of the record (prompt + committed tokens; that token is fed by a step) imported, every other row
  // recomputed.
  std::map<RequestId, std::pair<uint64_t, uint64_t>> expect;  // imported, recomputed rows
  const std::map<RequestId, std::map<uint32_t, PageIndex>> kept_of = memd->interrupted;
  uint32_t taken = 0;
  for (const Spec& s : specs) {
    SCOPED_TRACE("request " + std::to_string(s.id));
    const std::map<uint32_t, PageIndex>& kept = memd->interrupted.at(s.id);
    taken += static_cast<uint32_t>(kept.size());
    EXPECT_FALSE(kept.contains(1));
    EXPECT_FALSE(kept.contains(3));
    EXPECT_TRUE(kept.contains(2)) << "a copy after the gap";
    EXPECT_EQ(kept.contains(0), mode == WorkerMode::kHisparse || s.id != 1) << "page 0: kept on GPU or backed up";
    const uint64_t n = s.prompt + records[s.id].tokens.size();
    const uint64_t usable = (n - 1) / kP;
    uint64_t imported = 0;
    for (const auto& [j, hp] : kept) imported += j < usable ? kP : 0;
    expect[s.id] = {imported, n - imported};
  }
  if (GetParam().chaos) memd->EnableChaos(16);
  const bool fail_step = GetParam().fail_step;
  Side b(m.get(), 2, memd.get(), mode, fail_step ? 32 : kTail);
  // B never writes a page memd holds a confirmed copy of: no backup from the tail rows of a kept page.
  int rewrites = 0, failed = 0;
  HierarchicalKvAccess* bkv = b.worker->hierarchical();
  ASSERT_NE(bkv, nullptr);
  b.device.SetCopyHook([&](const CopyInfo& info) {
    if (fail_step) {
      const KvLayout& l = bkv->layout();
      for (const DeviceRange& d : info.device) {
        const Location lo = l.HotRow(0, 0, 0), hi = l.HotRow(l.config().slots, 0, 0);  // every slot's region
        if (info.kind == CopyKind::kHostToDevice && failed == 0 && d.offset >= lo && d.offset < hi) {
          ++failed;
          return CopyFate::kFail;
        }
      }
      return CopyFate::kRun;
    }
    if (info.kind != CopyKind::kDeviceToHost || info.device.empty()) return CopyFate::kRun;
    for (const Spec& s : specs) {
      const RequestKv* r = bkv->Find(MakeNodeRequestId(0, 2, s.id));
      if (r == nullptr) continue;
      for (const auto& [j, hp] : kept_of.at(s.id)) {
        if (info.device[0].offset == bkv->layout().TailRow(r->slot, 0, Position{j} * kP)) ++rewrites;
      }
    }
    return CopyFate::kRun;
  });
  for (const Spec& s : specs) {
    ASSERT_TRUE(b.worker->admission().Resume(s.id, records[s.id]).ok());
    ASSERT_TRUE(b.worker->Attach(s.id, static_cast<uint32_t>(had[s.id]), ClientRef{"c2", s.id}).ok());
  }
  EXPECT_EQ(memd->pages_taken_over, taken);  // every kept page, gaps and all
  for (int it = 0; it < 5000; ++it) {
    b.memd->Pump(*b.worker);
    absl::StatusOr<bool> more = b.worker->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more && b.worker->book().active() == 0 && b.worker->book().not_active() == 0) break;
  }
  EXPECT_TRUE(b.sink.errors.empty()) << b.sink.errors.begin()->second;
  uint64_t imported = 0, recomputed = 0;
  for (const Spec& s : specs) {
    SCOPED_TRACE("request " + std::to_string(s.id));
    EXPECT_EQ(b.sink.finished.count(s.id), 1u);
    const Generated stream = StitchedStream(want[s.id], had[s.id], b.sink.out[s.id]);  // A's part, then B's chunks
    EXPECT_EQ(stream.tokens, want[s.id].tokens);
    EXPECT_EQ(stream.digests, want[s.id].digests);
    ASSERT_TRUE(b.worker->resume_figures().contains(s.id));
    const Worker::ResumeFigures& f = b.worker->resume_figures().at(s.id);
    if (fail_step) {  // rows imported before the failed step were recomputed in its retry
      EXPECT_LE(f.rows_imported, expect[s.id].first);
      EXPECT_EQ(f.rows_imported + f.rows_recomputed, expect[s.id].first + expect[s.id].second);
    } else {
      EXPECT_EQ(f.rows_imported, expect[s.id].first);
      EXPECT_EQ(f.rows_recomputed, expect[s.id].second);
    }
    imported += f.rows_imported;
    recomputed += f.rows_recomputed;
    std::printf("%s%s%s: request %llu: %llu rows imported, %llu recomputed, resumed in %llu us\n",
                std::string(WorkerModeName(mode)).c_str(), GetParam().chaos ? " (chaos)" : "",
                fail_step ? " (a failed step)" : "",
                static_cast<unsigned long long>(s.id), static_cast<unsigned long long>(f.rows_imported),
                static_cast<unsigned long long>(f.rows_recomputed), static_cast<unsigned long long>(f.resume_us));
  }
  const WorkerStats st = b.worker->stats();
  EXPECT_EQ(st.rows_imported, imported);
  EXPECT_EQ(st.rows_recomputed, recomputed);
  EXPECT_EQ(rewrites, 0) << "a kept (confirmed) host page was backed up again";
  if (fail_step) EXPECT_EQ(failed, 1) << "no host recovery to fail";
  EXPECT_EQ(memd->completes, 4);
  EXPECT_EQ(memd->host_pages_held(), 0u);
  if (GetParam().chaos) EXPECT_GT(memd->pages_populated, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, WorkerImportGaps,
                         ::testing::Values(GapCase{WorkerMode::kHisparse}, GapCase{WorkerMode::kAdaptive},
                                           GapCase{WorkerMode::kAdaptive, true},
                                           GapCase{WorkerMode::kHisparse, false, true}),
                         [](const auto& info) {
                           return std::string(WorkerModeName(info.param.mode)) + (info.param.chaos ? "_chaos" : "") +
                                  (info.param.fail_step ? "_failed_step" : "");
                         });

}  // namespace
}  // namespace dhs::test

namespace dhs::test {
namespace {

// memd dies under a live worker (issue 11), in process with the fake memd: after EnterAway the worker keeps decoding
// its granted requests (hisparse: every completed page would be backed up) but sends memd nothing (no
// TokensCommitted, HostCopyWritten, Complete or AdmitRequest: a submit meanwhile waits) and streams nothing to its
// clients, until each request's tail is full (it pauses) or it finished. Its report has one entry per granted request
// with its slot, one page per page of its context (host copies reported before the death form a prefix), and a record
// holding every token it generated: the uninterrupted run's prefix, longer than what the clients got. After
// ReturnFromAway the held tokens reach the clients, the deferred backups are reported with the grant's host pages, the
// waiting submit is admitted, and every stream equals the uninterrupted run: nothing lost, nothing twice.
TEST(WorkerReHelloInProcess, AwayWorkerDecodesSendsNothingAndItsReportHoldsEveryToken) {
  auto m = MakePresetModel("dsv4flash-like");
  std::vector<Spec> specs = Specs();
  const Spec late{5, 25, 12, 0.7f, 1.0f, 3};  // submitted while memd is away
  std::map<RequestId, Generated> want = Oracles(*m, specs);
  const std::vector<uint8_t> lp = Prompt(late.prompt, static_cast<uint32_t>(late.id));
  want[late.id] = Oracle(*m, {lp.begin(), lp.end()}, late.max_new, late.temperature, late.top_p, late.seed, late.id);
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  Side a(m.get(), 1, memd.get(), WorkerMode::kHisparse);
  for (const Spec& s : specs) ASSERT_TRUE(a.worker->Submit(SubmitOf(s), ClientRef{"c", s.id}).ok());
  auto fewest = [&] {
    size_t n = SIZE_MAX;
    for (const Spec& s : specs) n = std::min(n, a.sink.out[s.id].tokens.size());
    return n;
  };
  for (int it = 0; it < 500 && fewest() < 2; ++it) {
    memd->Pump(*a.worker);
    ASSERT_TRUE(a.worker->Iterate().ok());
  }
  std::map<RequestId, size_t> had;
  for (const Spec& s : specs) had[s.id] = a.sink.out[s.id].tokens.size();
  const int commits = memd->commit_messages, copies = memd->host_copy_messages, completes = memd->completes;
  const size_t admitted = memd->admitted_ids.size();
  const uint64_t generated = a.worker->stats().tokens_generated;

  a.worker->memd_away().Enter();
  ASSERT_TRUE(a.worker->Submit(SubmitOf(late), ClientRef{"c", late.id}).ok());
  bool more = true;
  for (int it = 0; it < 1000 && more; ++it) {  // memd is dead: nothing of the fake is delivered (no Pump)
    absl::StatusOr<bool> m_more = a.worker->Iterate();
    ASSERT_TRUE(m_more.ok()) << m_more.status();
    more = *m_more;
  }
  ASSERT_FALSE(more) << "the away worker never paused";
  EXPECT_GT(a.worker->stats().tokens_generated, generated) << "nothing decoded while memd was away";
  EXPECT_EQ(a.worker->stats().tokens_while_away, a.worker->stats().tokens_generated - generated);
  EXPECT_EQ(memd->commit_messages, commits);
  EXPECT_EQ(memd->host_copy_messages, copies);
  EXPECT_EQ(memd->completes, completes);
  EXPECT_EQ(memd->admitted_ids.size(), admitted) << "an AdmitRequest went to a dead memd";
  for (const Spec& s : specs) EXPECT_EQ(a.sink.out[s.id].tokens.size(), had[s.id]) << "a token reached a client";
  EXPECT_EQ(std::count(a.sink.accepted.begin(), a.sink.accepted.end(), late.id), 1) << "the submit was not accepted";

  const std::vector<std::unique_ptr<wire::ReportedRequestT>> report = a.worker->memd_away().Report();
  ASSERT_EQ(report.size(), specs.size()) << "one report per granted request (the waiting submit is not reported)";
  std::set<uint32_t> slots;
  for (const auto& rep : report) {
    SCOPED_TRACE("request " + std::to_string(rep->request));
    const Spec& s = specs[rep->request - 1];
    slots.insert(rep->slot);
    EXPECT_EQ(rep->complete_pages, 0u);  // hisparse: no imported history kept on GPU
    EXPECT_FALSE(rep->optional_history);
    EXPECT_EQ(rep->history.size(), (s.prompt + s.max_new + 15) / 16);
    bool prefix = true;
    std::set<uint32_t> hosts;
    for (const auto& page : rep->history) {
      EXPECT_FALSE(page->has_gpu_page);
      hosts.insert(page->host_page);
      if (page->host_copy) EXPECT_TRUE(prefix) << "a reported host copy after an unreported page";
      prefix = prefix && page->host_copy;
    }
    EXPECT_EQ(hosts.size(), rep->history.size()) << "a host page named twice";
    ASSERT_NE(rep->record, nullptr);
    const size_t n = rep->record->tokens.size();
    EXPECT_GT(n, had[rep->request]) << "the record lacks the tokens decoded while away";
    ASSERT_LE(n, want[rep->request].tokens.size());
    EXPECT_EQ(rep->record->tokens, std::vector<uint8_t>(want[rep->request].tokens.begin(),
                                                        want[rep->request].tokens.begin() + n));
    EXPECT_EQ(rep->record->logits_digests, std::vector<uint64_t>(want[rep->request].digests.begin(),
                                                                 want[rep->request].digests.begin() + n));
  }
  EXPECT_EQ(slots.size(), specs.size());

  memd->AdoptReport(report);
  wire::HelloReplyT reply;
  reply.accepted = true;
  reply.worker_epoch = 1;
  ASSERT_TRUE(a.worker->memd_away().Return(reply).ok());
  EXPECT_FALSE(a.worker->memd_away().away());
  EXPECT_EQ(memd->admitted_ids.size(), admitted + 1) << "the submit made while away was not admitted";
  for (int it = 0; it < 5000; ++it) {
    memd->Pump(*a.worker);
    absl::StatusOr<bool> m_more = a.worker->Iterate();
    ASSERT_TRUE(m_more.ok()) << m_more.status();
    if (!*m_more && a.worker->book().active() == 0 && a.worker->book().not_active() == 0) break;
  }
  EXPECT_GT(memd->host_copy_messages, copies) << "the deferred backups were never reported";
  EXPECT_TRUE(a.sink.errors.empty()) << a.sink.errors.begin()->second;
  specs.push_back(late);
  for (const Spec& s : specs) {
    SCOPED_TRACE("request " + std::to_string(s.id));
    EXPECT_EQ(a.sink.finished.count(s.id), 1u);
    EXPECT_EQ(a.sink.out[s.id].tokens, std::vector<int>(want[s.id].tokens.begin(), want[s.id].tokens.end()));
    EXPECT_EQ(a.sink.out[s.id].digests, want[s.id].digests);
    EXPECT_EQ(memd->committed[s.id].size(), s.max_new) << "memd's record lacks tokens";
  }
}

}  // namespace
}  // namespace dhs::test

namespace dhs::test {
namespace {

// A report memd refused (issue 11): request 1's report is refused; request 2's is adopted. Request 1 ends to its
// client like after a fence (final UNAVAILABLE "worker epoch ended: memd refused its report: ...", none of its held
// tokens) and is admitted again: from the worker's own record (every token it generated) when memd holds nothing of
// it, else as a resume of the interrupted id memd lists (its record; a new node id of the same epoch, never the
// interrupted one). Its client re-attaches with what it had and the two parts equal the uninterrupted run. Request 2
// goes on untouched: its held tokens, then the rest.
void RefusedReportIsResumed(bool memd_holds_it_interrupted) {
  auto m = MakePresetModel("dsv4flash-like");
  // Long enough that neither finishes while away (each pauses when its tail is full).
  const std::vector<Spec> specs = {{1, 20, 60, 0.0f, 1.0f, 0}, {2, 33, 60, 0.9f, 1.0f, 7}};
  std::map<RequestId, Generated> want = Oracles(*m, specs);
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  Side a(m.get(), 1, memd.get(), WorkerMode::kHisparse);
  for (const Spec& s : specs) ASSERT_TRUE(a.worker->Submit(SubmitOf(s), ClientRef{"c", s.id}).ok());
  for (int it = 0; it < 500 && (a.sink.out[1].tokens.size() < 2 || a.sink.out[2].tokens.size() < 2); ++it) {
    memd->Pump(*a.worker);
    ASSERT_TRUE(a.worker->Iterate().ok());
  }
  const size_t had1 = a.sink.out[1].tokens.size();
  a.worker->memd_away().Enter();
  for (int it = 0; it < 1000 && *a.worker->Iterate(); ++it) {
  }
  const std::vector<std::unique_ptr<wire::ReportedRequestT>> report = a.worker->memd_away().Report();
  ASSERT_EQ(report.size(), 2u);
  ASSERT_GT(report[0]->record->tokens.size(), had1);
  std::vector<std::unique_ptr<wire::ReportedRequestT>> adopted;
  adopted.push_back(std::make_unique<wire::ReportedRequestT>(*report[1]));
  memd->AdoptReport(adopted);
  wire::CompleteT gone;  // the new memd holds nothing of request 1 (or only as interrupted): the fake forgets it too
  gone.request = 1;
  ASSERT_TRUE(memd->SendComplete(gone).ok());
  wire::HelloReplyT reply;
  if (memd_holds_it_interrupted) {  // with the journal's record: the tokens committed before memd died
    memd->interrupted[1] = {};
    reply.interrupted_requests = {1};
    reply.interrupted_records.push_back(std::make_unique<wire::RequestRecordT>(memd->records.at(1)));
  }
  const size_t admitted = memd->admitted_ids.size();
  reply.accepted = true;
  reply.worker_epoch = 1;
  reply.refused_reports = {1};
  reply.refused_reasons = {"request 1: slot 0 out of range or taken"};
  ASSERT_TRUE(a.worker->memd_away().Return(reply).ok());
  ASSERT_EQ(a.sink.finished.count(1), 1u);
  EXPECT_NE(a.sink.errors[1].find("worker epoch ended: memd refused its report: request 1: slot 0"), std::string::npos)
      << a.sink.errors[1];
  // The client tells the epoch's end by its code, not by the text (dhs-replay re-attaches on it).
  const auto final1 = std::find_if(a.sink.chunks.begin(), a.sink.chunks.end(),
                                   [](const wire::TokenChunkT& c) { return c.request == 1 && c.finished; });
  ASSERT_NE(final1, a.sink.chunks.end());
  EXPECT_EQ(final1->error, wire::ErrorCode::UNAVAILABLE);
  EXPECT_EQ(final1->end_reason, wire::EndReason::WORKER_EPOCH_ENDED);
  EXPECT_EQ(a.sink.out[1].tokens.size(), had1) << "held tokens of a refused report reached its client";
  ASSERT_EQ(memd->admitted_ids.size(), admitted + 1) << "the refused request was not admitted again";
  if (memd_holds_it_interrupted) {
    EXPECT_NE(memd->admitted_ids.back(), 1u) << "the resume took the interrupted id";
    EXPECT_EQ(memd->resumes, 1);
  } else {
    EXPECT_EQ(memd->records[memd->admitted_ids.back()].tokens, report[0]->record->tokens);
  }
  ASSERT_TRUE(a.worker->Attach(1, static_cast<uint32_t>(had1), ClientRef{"c2", 1}).ok());
  for (int it = 0; it < 5000; ++it) {
    memd->Pump(*a.worker);
    absl::StatusOr<bool> more = a.worker->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more && a.worker->book().active() == 0 && a.worker->book().not_active() == 0) break;
  }
  EXPECT_EQ(a.sink.finished.count(2), 1u);
  EXPECT_EQ(a.sink.out[2].tokens, want[2].tokens) << "the adopted request's stream";
  EXPECT_EQ(a.sink.out[2].digests, want[2].digests);
  // The sink keeps request 1's chunks of both connections in order: before the refusal, then after the attach.
  EXPECT_EQ(a.sink.out[1].tokens, want[1].tokens) << "lost or repeated tokens of the refused request";
  EXPECT_EQ(a.sink.out[1].digests, want[1].digests);
}

// Requests of clients 1..5 on `a` (4 slots): memd grants four (delivered, started) and queues the fifth, *waiting.
void FourGrantedAndOneWaiting(Side& a, FakeMemd* memd, RequestId* waiting) {
  for (RequestId c = 1; c <= 5; ++c) {
    ASSERT_TRUE(a.worker->Submit(SubmitOf(Spec{c, 20, 30, 0.0f, 1.0f, 0}), ClientRef{"c", c}).ok());
  }
  *waiting = memd->admitted_ids.back();
  for (int it = 0; it < 3; ++it) {  // the four grants reach the worker
    memd->Pump(*a.worker);
    ASSERT_TRUE(a.worker->Iterate().ok());
  }
  ASSERT_EQ(a.worker->book().active(), 4u);
  ASSERT_EQ(memd->admissions_waiting(), 1u);
  ASSERT_EQ(a.worker->book().Find(*waiting)->phase, RequestPhase::kWaiting);
}

// A new memd's reply to the re-Hello (accepted, `epoch`) listing `id` as interrupted with `record`.
wire::HelloReplyT ReplyListingInterrupted(uint64_t epoch, RequestId id, const wire::RequestRecordT& record) {
  wire::HelloReplyT reply;
  reply.accepted = true;
  reply.worker_epoch = epoch;
  reply.interrupted_requests = {id};
  reply.interrupted_records.push_back(std::make_unique<wire::RequestRecordT>(record));
  return reply;
}

// A request its client cancelled while it waited for its grant, whose Complete the dead memd never read: the new
// memd lists it as interrupted, with the record the dead one journaled at its admission. The worker ended it (the
// book's StaleGrant; workerd's agent counts it finished too), so PlanReturn puts it in end_interrupted: it is ended at
// memd (a Complete), not admitted again as a resume nobody would attach to. The four requests granted here are
// adopted and untouched.
TEST(WorkerReHelloInProcess, ARequestCancelledWhileWaitingIsEndedNotResumed) {
  auto m = MakePresetModel("dsv4flash-like");
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  Side a(m.get(), 1, memd.get(), WorkerMode::kHisparse);
  RequestId waiting = 0;
  ASSERT_NO_FATAL_FAILURE(FourGrantedAndOneWaiting(a, memd.get(), &waiting));
  const wire::RequestRecordT journaled = memd->records.at(waiting);
  ASSERT_TRUE(a.worker->Cancel(5, 0, ClientRef{"c", 5}, "gone").ok());
  const int completes = memd->completes;  // its Complete: the dead memd never reads it (no Pump)
  ASSERT_TRUE(a.worker->book().StaleGrant(waiting));
  a.worker->memd_away().Enter();
  memd->AdoptReport(a.worker->memd_away().Report());
  const size_t admitted = memd->admitted_ids.size();
  ASSERT_TRUE(a.worker->memd_away().Return(ReplyListingInterrupted(1, waiting, journaled)).ok());
  EXPECT_EQ(memd->completes, completes + 1) << "the interrupted id was not ended at memd";
  EXPECT_EQ(memd->admitted_ids.size(), admitted) << "the cancelled request was admitted again";
  EXPECT_EQ(memd->resumes, 0);
  EXPECT_EQ(a.worker->book().active(), 4u);
  EXPECT_EQ(a.worker->book().waiting_for_grant(), 0u);
}

// The same request, but cancelled while memd is away (kEnding, ended while it waited). The new memd lists it
// interrupted. Its deferred end (EndDeferred's Finish) sends its one Complete; PlanReturn leaves a request ending here
// out of end_interrupted (review finding: a second Complete went for an id memd had ended already).
TEST(WorkerReHelloInProcess, ARequestCancelledWhileAwayAndWaitingIsEndedOnce) {
  auto m = MakePresetModel("dsv4flash-like");
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  Side a(m.get(), 1, memd.get(), WorkerMode::kHisparse);
  RequestId waiting = 0;
  ASSERT_NO_FATAL_FAILURE(FourGrantedAndOneWaiting(a, memd.get(), &waiting));
  const wire::RequestRecordT journaled = memd->records.at(waiting);
  a.worker->memd_away().Enter();
  ASSERT_TRUE(a.worker->Cancel(5, 0, ClientRef{"c", 5}, "gone").ok());
  ASSERT_EQ(a.worker->book().Find(waiting)->phase, RequestPhase::kEnding);
  memd->AdoptReport(a.worker->memd_away().Report());
  const int completes = memd->completes;
  ASSERT_TRUE(a.worker->memd_away().Return(ReplyListingInterrupted(1, waiting, journaled)).ok());
  EXPECT_EQ(memd->completes, completes + 1) << "Completes sent for the one interrupted id";
  EXPECT_EQ(memd->resumes, 0);
}

// Request 1 is served by a first worker (epoch 1) until it has 2 tokens; that worker dies (memd fences it: 1 is
// interrupted, its host pages kept: `kept`, its record: `record`). The GPU's next worker (epoch 2: `b`) resumes 1 at
// its start as Y, whose AdmitRequest memd takes (it hands 1 over to Y at once) but whose grant is not delivered (no
// Pump). Built by ResumeAtStartAfterAFence.
struct ResumedAtStart {
  std::unique_ptr<model::Model> m = MakePresetModel("dsv4flash-like");
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  wire::RequestRecordT record;
  std::map<uint32_t, PageIndex> kept;
  std::unique_ptr<Side> b;
};
void ResumeAtStartAfterAFence(ResumedAtStart& r) {
  FakeMemd* memd = r.memd.get();
  {
    Side a(r.m.get(), 1, memd, WorkerMode::kHisparse);
    ASSERT_TRUE(a.worker->Submit(SubmitOf(Spec{1, 20, 30, 0.0f, 1.0f, 0}), ClientRef{"c", 1}).ok());
    for (int it = 0; it < 500 && a.sink.out[1].tokens.size() < 2; ++it) {
      memd->Pump(*a.worker);
      ASSERT_TRUE(a.worker->Iterate().ok());
    }
    r.record = memd->records.at(1);
  }
  memd->Fence();
  r.kept = memd->interrupted.at(1);
  // The next worker's Hello: memd lists 1 interrupted, with its record; the worker resumes what libdhs lists.
  memd->listed_interrupted = {1};
  memd->listed_records.push_back(std::make_unique<wire::RequestRecordT>(r.record));
  r.b = std::make_unique<Side>(r.m.get(), 2, memd, WorkerMode::kHisparse);
  ASSERT_TRUE(r.b->worker->ResumeInterrupted().ok());
  memd->listed_interrupted.clear();  // later replies are the tests' own
  memd->listed_records.clear();
}

// Interrupted request 1 is resumed here as Y (a worker's start); memd dies before it reads Y's AdmitRequest, so the
// next memd still lists 1 interrupted, with its record. Y's admission, sent again, takes 1 over: PlanReturn lists 1
// neither resumable nor ended (review finding: 1 was resumed a second time beside Y, and memd rejected one of them).
TEST(WorkerReHelloInProcess, AResumeWaitingHereIsNotResumedTwiceAtTheReHello) {
  ResumedAtStart r;
  ASSERT_NO_FATAL_FAILURE(ResumeAtStartAfterAFence(r));
  FakeMemd* memd = r.memd.get();
  Side& b = *r.b;
  ASSERT_EQ(b.worker->book().waiting_for_grant(), 1u);  // Y: its AdmitRequest not answered (no Pump)
  b.worker->memd_away().Enter();
  memd->interrupted[1] = r.kept;  // the next memd never saw Y's admission: 1 is still interrupted there
  const size_t admits = memd->admits.size();
  ASSERT_TRUE(b.worker->memd_away().Return(ReplyListingInterrupted(2, 1, r.record)).ok());
  int resumes_of_1 = 0;
  for (size_t i = admits; i < memd->admits.size(); ++i) resumes_of_1 += memd->admits[i].resume_of == 1;
  EXPECT_EQ(resumes_of_1, 1) << "request 1 is resumed twice (a new resume beside the one sent again)";
  EXPECT_EQ(b.worker->book().waiting_for_grant(), 1u);
}

// The other side of the same interleaving: memd read Y's AdmitRequest (it handed 1's host pages over to Y) and died
// before Y's grant reached the worker, so the next memd lists Y itself as interrupted. Y is neither ended at memd (its
// pages would be freed) nor sent again as a resume of 1 (memd knows 1 no more): it ends here like a refused report and
// is resumed from its own record (review finding: it was ended and its admission rejected, the request lost). Its
// resume Z continues Y and takes 1's pages over; nothing resumes 1, nothing is ended.
TEST(WorkerReHelloInProcess, AResumeMemdQueuedWhenItDiedIsResumedFromItsOwnRecord) {
  ResumedAtStart r;
  ASSERT_NO_FATAL_FAILURE(ResumeAtStartAfterAFence(r));
  FakeMemd* memd = r.memd.get();
  Side& b = *r.b;
  ASSERT_EQ(memd->resumes, 1);  // memd took 1 over for Y at once
  const RequestId y = memd->admitted_ids.back();
  ASSERT_EQ(b.worker->book().Find(y)->phase, RequestPhase::kWaiting);  // its grant not delivered (no Pump)
  b.worker->memd_away().Enter();
  memd->interrupted[y] = r.kept;  // the next memd holds Y as interrupted, with 1's pages
  const size_t admits = memd->admits.size();
  const int completes = memd->completes;
  ASSERT_TRUE(b.worker->memd_away().Return(ReplyListingInterrupted(2, y, memd->records.at(y))).ok());
  EXPECT_EQ(memd->completes, completes) << "Y was ended at memd: its pages are freed";
  ASSERT_EQ(memd->admits.size(), admits + 1);
  EXPECT_EQ(memd->admits.back().resume_of, y) << "the resume continues Y, which holds 1's pages";
  EXPECT_NE(memd->admits.back().request, y);
  EXPECT_EQ(memd->resumes, 2);
  EXPECT_EQ(b.worker->book().Find(y), nullptr);
  EXPECT_EQ(b.worker->book().waiting_for_grant(), 1u);
}

// Request 1 ends while memd is away (its client cancels it, or it finishes: kEnding), and the new memd refuses its
// report (memd holds nothing of it, or holds it interrupted from the journal). It ends here as it was ending: its
// client gets its held tokens and its own end (CANCELLED; or the finished stream, whole, no error), it is not admitted
// again, and memd gets a Complete only for the interrupted id it lists: the loop's Complete (a finished one's output
// kept for a lost end). Request 2, adopted, goes on to its oracle stream. Then memd dies again before it read that
// Complete and the next memd lists request 1 interrupted once more: it is ended there again, still not resumed.
// Review findings: workerd resumed request 1 (from its record, or as a resume of the interrupted id), so a cancelled
// request ran again for nobody and a finished one's client was told the epoch ended; its Complete was a bare one (a
// finished output was not kept); and the worker forgot it had ended it, so the second return resumed it.
struct EndedWhileAway {
  bool cancelled;    // else it finishes while away
  bool interrupted;  // the new memd lists request 1 as interrupted (its journal's record)
};
class WorkerRefusedEnding : public ::testing::TestWithParam<EndedWhileAway> {};

TEST_P(WorkerRefusedEnding, ARequestThatEndedWhileAwayIsNotResumedWhenItsReportIsRefused) {
  const EndedWhileAway param = GetParam();
  auto m = MakePresetModel("dsv4flash-like");
  const std::vector<Spec> specs = {{1, 20, param.cancelled ? 60u : 12u, 0.0f, 1.0f, 0}, {2, 33, 60, 0.9f, 1.0f, 7}};
  std::map<RequestId, Generated> want = Oracles(*m, specs);
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  Side a(m.get(), 1, memd.get(), WorkerMode::kHisparse);
  for (const Spec& s : specs) ASSERT_TRUE(a.worker->Submit(SubmitOf(s), ClientRef{"c", s.id}).ok());
  for (int it = 0; it < 500 && (a.sink.out[1].tokens.size() < 2 || a.sink.out[2].tokens.empty()); ++it) {
    memd->Pump(*a.worker);
    ASSERT_TRUE(a.worker->Iterate().ok());
  }
  const size_t had1 = a.sink.out[1].tokens.size();
  ASSERT_LT(had1, specs[0].max_new);
  ASSERT_FALSE(a.sink.out[2].tokens.empty());
  const wire::RequestRecordT journaled = memd->records.at(1);
  a.worker->memd_away().Enter();
  if (param.cancelled) ASSERT_TRUE(a.worker->Cancel(1, 0, ClientRef{"c", 1}, "gone").ok());
  for (int it = 0; it < 1000 && *a.worker->Iterate(); ++it) {
  }
  ASSERT_EQ(a.worker->book().Find(1)->phase, RequestPhase::kEnding);
  EXPECT_EQ(a.sink.finished.count(1), 0u) << "an end while memd is away waits for the re-Hello";
  const std::vector<std::unique_ptr<wire::ReportedRequestT>> report = a.worker->memd_away().Report();
  ASSERT_EQ(report.size(), 2u);
  ASSERT_EQ(report[0]->request, 1u);
  std::vector<std::unique_ptr<wire::ReportedRequestT>> adopted;
  adopted.push_back(std::make_unique<wire::ReportedRequestT>(*report[1]));
  memd->AdoptReport(adopted);
  wire::CompleteT gone;  // the new memd holds nothing of request 1 (or only as interrupted): the fake forgets it too
  gone.request = 1;
  ASSERT_TRUE(memd->SendComplete(gone).ok());
  wire::HelloReplyT reply;
  if (param.interrupted) reply = ReplyListingInterrupted(1, 1, journaled);
  reply.accepted = true;
  reply.worker_epoch = 1;
  reply.refused_reports = {1};
  reply.refused_reasons = {"request 1: slot 0 out of range or taken"};
  const size_t admitted = memd->admitted_ids.size();
  const int completes = memd->completes;
  ASSERT_TRUE(a.worker->memd_away().Return(reply).ok());
  EXPECT_EQ(memd->admitted_ids.size(), admitted) << "the request that ended while memd was away was admitted again";
  EXPECT_EQ(memd->resumes, 0);
  EXPECT_EQ(memd->completes, completes + (param.interrupted ? 1 : 0)) << "Completes for the interrupted id memd lists";
  if (param.interrupted) {
    const wire::CompleteT& done = memd->complete_messages.back();
    EXPECT_EQ(done.request, 1u);
    EXPECT_EQ(done.keep_output, !param.cancelled) << "a finished output is kept at memd for a lost end";
    if (!param.cancelled) {
      EXPECT_EQ(done.output_from, 0u);
      EXPECT_EQ(std::vector<int>(done.output_tokens.begin(), done.output_tokens.end()), want[1].tokens);
      EXPECT_EQ(done.output_digests, want[1].digests);
    }
  }
  EXPECT_EQ(a.worker->book().Find(1), nullptr);
  ASSERT_EQ(a.sink.finished.count(1), 1u);
  const auto final1 = std::find_if(a.sink.chunks.begin(), a.sink.chunks.end(),
                                   [](const wire::TokenChunkT& c) { return c.request == 1 && c.finished; });
  ASSERT_NE(final1, a.sink.chunks.end());
  if (param.cancelled) {
    EXPECT_EQ(final1->end_reason, wire::EndReason::CANCELLED);
    EXPECT_EQ(final1->error, wire::ErrorCode::CANCELLED);
    // Its held tokens, then its end: a prefix of the uninterrupted stream.
    ASSERT_LE(a.sink.out[1].tokens.size(), want[1].tokens.size());
    EXPECT_TRUE(std::equal(a.sink.out[1].tokens.begin(), a.sink.out[1].tokens.end(), want[1].tokens.begin()));
  } else {
    EXPECT_EQ(final1->error, wire::ErrorCode::OK) << a.sink.errors[1];
    EXPECT_EQ(a.sink.out[1].tokens, want[1].tokens) << "the finished stream, whole";
    EXPECT_EQ(a.sink.out[1].digests, want[1].digests);
  }
  for (int it = 0; it < 5000; ++it) {
    memd->Pump(*a.worker);
    absl::StatusOr<bool> more = a.worker->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more && a.worker->book().active() == 0 && a.worker->book().not_active() == 0) break;
  }
  EXPECT_EQ(memd->admitted_ids.size(), admitted);
  EXPECT_EQ(a.sink.finished.count(2), 1u);
  EXPECT_EQ(a.sink.out[2].tokens, want[2].tokens) << "the adopted request's stream";
  if (!param.interrupted) return;
  a.worker->memd_away().Enter();  // memd dies again; the next one lists request 1 interrupted once more
  const int before = memd->completes;
  ASSERT_TRUE(a.worker->memd_away().Return(ReplyListingInterrupted(1, 1, journaled)).ok());
  EXPECT_EQ(memd->admitted_ids.size(), admitted) << "request 1 was resumed after the second memd death";
  EXPECT_EQ(memd->resumes, 0);
  EXPECT_EQ(memd->completes, before + 1) << "request 1 was not ended at the third memd";
}

INSTANTIATE_TEST_SUITE_P(EndedAndRefused, WorkerRefusedEnding,
                         ::testing::Values(EndedWhileAway{true, false}, EndedWhileAway{true, true},
                                           EndedWhileAway{false, false}, EndedWhileAway{false, true}),
                         [](const ::testing::TestParamInfo<EndedWhileAway>& info) {
                           return std::string(info.param.cancelled ? "Cancelled" : "Finished") +
                                  (info.param.interrupted ? "MemdListsItInterrupted" : "MemdHoldsNothing");
                         });

TEST(WorkerReHelloInProcess, ARefusedReportMemdHoldsNothingOfIsResumedFromTheWorkersRecord) {
  RefusedReportIsResumed(false);
}
TEST(WorkerReHelloInProcess, ARefusedReportMemdHoldsInterruptedIsResumedUnderANewIdOfTheSameEpoch) {
  RefusedReportIsResumed(true);
}

}  // namespace
}  // namespace dhs::test

namespace dhs::test {
namespace {

using Key = std::pair<std::string, RequestId>;  // (ClientRef.peer, client request id)

// Two clients of one worker use the same request ids (1 and 2) with different prompts and their own identities
// (SubmitRequest.client 101 and 202). The worker is dropped mid-decode; the next one (epoch 2) resumes all four from
// memd's records. Each client re-attaches with its identity (Attach.client): each gets its own request's tokens, and
// its stream (before, then after) equals the oracle of its own prompt. Before the fix the resumes were keyed by the
// request id alone: the second resume of id 1 was unreachable (or the other client's stream was sent).
TEST(WorkerResume, TwoClientsWithTheSameRequestIdsEachReattachToTheirOwnRequest) {
  auto m = MakePresetModel("dsv4flash-like");
  struct Client {
    std::string peer;
    uint64_t identity;
    uint32_t salt;  // its prompts differ from the other client's
  };
  const std::vector<Client> clients = {{"alice", 101, 50}, {"bob", 202, 70}};
  const std::vector<RequestId> ids = {1, 2};
  constexpr uint32_t kMaxNew = 16;
  auto submit_of = [&](const Client& c, RequestId id) {
    wire::SubmitRequestT s;
    s.request = id;
    s.client = c.identity;
    s.prompt = Prompt(20 + id, c.salt + static_cast<uint32_t>(id));
    s.max_new_tokens = kMaxNew;
    s.temperature = id == 2 ? 0.8f : 0.0f;
    s.seed = 9;
    return s;
  };
  std::map<std::pair<std::string, RequestId>, Generated> want;
  for (const Client& c : clients) {
    for (RequestId id : ids) {
      const wire::SubmitRequestT s = submit_of(c, id);
      want[Key(c.peer, id)] =
          Oracle(*m, {s.prompt.begin(), s.prompt.end()}, kMaxNew, s.temperature, 1.0f, s.seed, id);
    }
  }
  ASSERT_NE(want[Key("alice", 1)].tokens, want[Key("bob", 1)].tokens) << "the test needs streams that differ";
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  std::map<std::pair<std::string, RequestId>, size_t> had;
  std::vector<std::pair<RequestId, wire::RequestRecordT>> records;  // (interrupted node id, record)
  {
    Side a(m.get(), 1, memd.get(), WorkerMode::kHisparse);
    for (const Client& c : clients) {
      for (RequestId id : ids) ASSERT_TRUE(a.worker->Submit(submit_of(c, id), ClientRef{c.peer, id}).ok());
    }
    auto fewest = [&] {
      size_t n = SIZE_MAX;
      for (const Client& c : clients) {
        for (RequestId id : ids) n = std::min(n, a.sink.by_peer[Key(c.peer, id)].tokens.size());
      }
      return n;
    };
    for (int it = 0; it < 500 && fewest() < 3; ++it) {
      memd->Pump(*a.worker);
      ASSERT_TRUE(a.worker->Iterate().ok());
    }
    for (const Client& c : clients) {
      for (RequestId id : ids) {
        had[Key(c.peer, id)] = a.sink.by_peer[Key(c.peer, id)].tokens.size();
        ASSERT_LT(had[Key(c.peer, id)], kMaxNew) << "finished before the kill point";
      }
    }
    for (const auto& [node, rec] : memd->records) records.emplace_back(node, rec);
  }
  ASSERT_EQ(records.size(), 4u);
  memd->Fence();
  Side b(m.get(), 2, memd.get(), WorkerMode::kHisparse);
  for (const auto& [node, rec] : records) ASSERT_TRUE(b.worker->admission().Resume(node, rec).ok());
  // Bob first (the resumes of id 1 are in node-id order: Alice's is found first when the key is the id alone).
  for (auto c = clients.rbegin(); c != clients.rend(); ++c) {
    for (RequestId id : ids) {
      const auto received = static_cast<uint32_t>(had[Key(c->peer, id)]);
      ASSERT_TRUE(b.worker->Attach(id, received, ClientRef{c->peer + "2", id}, c->identity).ok()) << c->peer << id;
    }
  }
  EXPECT_EQ(b.worker->Attach(1, 0, ClientRef{"eve", 1}, 303).code(), absl::StatusCode::kNotFound);  // no such client
  for (int it = 0; it < 5000; ++it) {
    memd->Pump(*b.worker);
    absl::StatusOr<bool> more = b.worker->Iterate();
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more && b.worker->book().active() == 0 && b.worker->book().not_active() == 0) break;
  }
  EXPECT_TRUE(b.sink.errors.empty()) << b.sink.errors.begin()->second;
  for (const Client& c : clients) {
    for (RequestId id : ids) {
      SCOPED_TRACE(c.peer + " request " + std::to_string(id));
      // What the first worker streamed to it, then what the second streamed to its new connection.
      Generated got;
      const size_t n = had[Key(c.peer, id)];
      const Generated& oracle = want[Key(c.peer, id)];
      got.tokens.assign(oracle.tokens.begin(), oracle.tokens.begin() + static_cast<std::ptrdiff_t>(n));
      got.digests.assign(oracle.digests.begin(), oracle.digests.begin() + static_cast<std::ptrdiff_t>(n));
      const Generated& after = b.sink.by_peer[Key(c.peer + "2", id)];
      got.tokens.insert(got.tokens.end(), after.tokens.begin(), after.tokens.end());
      got.digests.insert(got.digests.end(), after.digests.begin(), after.digests.end());
      EXPECT_EQ(got.tokens, want[Key(c.peer, id)].tokens) << "another client's tokens, or lost / repeated ones";
      EXPECT_EQ(got.digests, want[Key(c.peer, id)].digests);
    }
  }
}

// Cancel (issue 22) of resumed requests: one no client re-attached to is found by (client identity, id) and its final
// chunk (CANCELLED) goes to the canceller, nothing is kept for an Attach (NOT_FOUND afterwards); one re-attached is
// cancelled by its new connection mid-stream. Both release their slots through Complete; another client identity
// cannot cancel them.
TEST(WorkerResume, ResumedRequestsCanBeCancelledAttachedOrNot) {
  auto m = MakePresetModel("dsv4flash-like");
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  Side b(m.get(), 2, memd.get(), WorkerMode::kHisparse);
  auto record = [&](RequestId id) {  // 3 of 14 tokens committed, as the oracle has them
    wire::RequestRecordT rec;
    rec.client_request = id;
    rec.client = 77;
    rec.prompt = Prompt(20, static_cast<uint32_t>(id));
    rec.max_new_tokens = 14;
    const Generated g = Oracle(*m, {rec.prompt.begin(), rec.prompt.end()}, 3);
    rec.tokens.assign(g.tokens.begin(), g.tokens.end());
    rec.logits_digests = g.digests;
    return rec;
  };
  ASSERT_TRUE(b.worker->admission().Resume(0, record(1)).ok());
  ASSERT_TRUE(b.worker->admission().Resume(0, record(2)).ok());
  memd->Pump(*b.worker);
  ASSERT_TRUE(b.worker->Iterate().ok());
  EXPECT_EQ(b.worker->Cancel(1, 78, ClientRef{"x", 1}, "wrong identity").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(b.worker->Cancel(1, 77, ClientRef{"x", 5}, "nobody came back").ok());
  EXPECT_EQ(b.sink.errors[1], "cancelled: nobody came back");
  EXPECT_TRUE(b.sink.finished.contains(1));
  EXPECT_EQ(memd->completes, 1);
  EXPECT_EQ(b.worker->Attach(1, 3, ClientRef{"y", 2}, 77).code(), absl::StatusCode::kNotFound) << "kept after cancel";
  ASSERT_TRUE(b.worker->Attach(2, 3, ClientRef{"z", 3}, 77).ok());
  for (int it = 0; it < 100 && b.sink.by_peer[Key("z", 2)].tokens.size() < 2; ++it) {
    memd->Pump(*b.worker);
    ASSERT_TRUE(b.worker->Iterate().ok());
  }
  ASSERT_GE(b.sink.by_peer[Key("z", 2)].tokens.size(), 2u);
  ASSERT_TRUE(b.worker->Cancel(2, 0, ClientRef{"z", 9}, "enough").ok());  // found by its connection
  EXPECT_EQ(b.sink.errors[2], "cancelled: enough");
  EXPECT_EQ(memd->completes, 2);
  EXPECT_EQ(memd->slots_free(), static_cast<size_t>(b.config.slots));
  EXPECT_EQ(b.worker->book().active() + b.worker->book().not_active(), 0u);
  EXPECT_EQ(b.worker->stats().requests_cancelled, 2u);
}

// A resumed request's record that holds all its tokens: resumed with interrupted = 0 (nothing at memd to end), it
// waits finished for its client (AdmissionDesk::Resume).
wire::RequestRecordT FinishedRecord(RequestId id, uint64_t client, uint8_t first_token) {
  wire::RequestRecordT rec;
  rec.client_request = id;
  rec.client = client;
  rec.prompt = Prompt(10, static_cast<uint32_t>(id));
  rec.max_new_tokens = 3;
  rec.tokens = {first_token, static_cast<uint8_t>(first_token + 1), static_cast<uint8_t>(first_token + 2)};
  rec.logits_digests = {first_token * 10ull, first_token * 10ull + 1, first_token * 10ull + 2};
  return rec;
}

// The bound on resumed outputs no client re-attached to (workerd/resumed_outputs.h) in the worker: with
// --resumed-outputs-max 2, a third finished output drops the oldest (logged, counted in resumed_outputs_dropped); an
// Attach to it gets NOT_FOUND, the two others are streamed to their own clients (the same request id 1 under two
// identities: each gets its own tokens). With --resumed-output-age-ms 20, an output no one claims is dropped by the
// loop's iteration once 20 ms passed.
TEST(WorkerResume, UnclaimedResumedOutputsAreBoundedByCountAndAge) {
  auto m = MakePresetModel("dsv4flash-like");
  std::unique_ptr<FakeMemd> memd = SharedMemd(m.get(), WorkerMode::kHisparse, 0);
  {
    Side b(m.get(), 2, memd.get(), WorkerMode::kHisparse);
    WorkerConfig config = b.config;
    config.resumed_outputs.max_outputs = 2;
    auto w = Worker::Create(m.get(), &b.device, config, memd.get(), &b.sink);
    ASSERT_TRUE(w.ok()) << w.status();
    Worker& worker = **w;
    ASSERT_TRUE(worker.admission().Resume(0, FinishedRecord(1, 7, 10)).ok());  // client 7's request 1: the oldest
    ASSERT_TRUE(worker.admission().Resume(0, FinishedRecord(1, 8, 20)).ok());  // client 8's request 1
    EXPECT_EQ(worker.stats().resumed_outputs_dropped, 0u);
    ASSERT_TRUE(worker.admission().Resume(0, FinishedRecord(2, 7, 30)).ok());  // a third: client 7's request 1 is dropped
    EXPECT_EQ(worker.stats().resumed_outputs_dropped, 1u);
    EXPECT_EQ(worker.StatsReply().resumed_outputs_dropped, 1u);
    EXPECT_EQ(worker.StatsReply().resumed_outputs_waiting, 2u);
    EXPECT_EQ(worker.Attach(1, 0, ClientRef{"c7", 1}, 7).code(), absl::StatusCode::kNotFound);
    ASSERT_TRUE(worker.Attach(1, 1, ClientRef{"c8", 1}, 8).ok());
    ASSERT_TRUE(worker.Attach(2, 0, ClientRef{"c7", 2}, 7).ok());
    EXPECT_EQ((b.sink.by_peer[Key("c8", 1)].tokens), (std::vector<int>{21, 22}));  // it had 1 of them
    EXPECT_EQ((b.sink.by_peer[Key("c7", 2)].tokens), (std::vector<int>{30, 31, 32}));
    EXPECT_EQ((b.sink.by_peer[Key("c7", 2)].digests), (std::vector<uint64_t>{300, 301, 302}));
    EXPECT_EQ(worker.StatsReply().resumed_outputs_waiting, 0u);
  }
  Side b(m.get(), 3, memd.get(), WorkerMode::kHisparse);
  WorkerConfig config = b.config;
  config.resumed_outputs.max_age = std::chrono::milliseconds(20);
  auto w = Worker::Create(m.get(), &b.device, config, memd.get(), &b.sink);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->admission().Resume(0, FinishedRecord(4, 9, 40)).ok());
  const auto kept = std::chrono::steady_clock::now();
  ASSERT_TRUE((*w)->Iterate().ok());
  if (std::chrono::steady_clock::now() - kept < std::chrono::milliseconds(20)) {
    EXPECT_EQ((*w)->stats().resumed_outputs_dropped, 0u) << "dropped before its age";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(25));  // past the age: the next iteration drops it
  ASSERT_TRUE((*w)->Iterate().ok());
  EXPECT_EQ((*w)->stats().resumed_outputs_dropped, 1u);
  EXPECT_EQ((*w)->Attach(4, 0, ClientRef{"c9", 4}, 9).code(), absl::StatusCode::kNotFound);
  // A limit of 0 is refused at start, naming the flag.
  config.resumed_outputs.max_bytes = 0;
  auto bad = Worker::Create(m.get(), &b.device, config, memd.get(), &b.sink);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--resumed-output-bytes-max"), std::string::npos) << bad.status();
}

}  // namespace
}  // namespace dhs::test
