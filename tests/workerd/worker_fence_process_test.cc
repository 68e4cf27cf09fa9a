// tests/workerd/worker_fence_process_test.cc: liveness and fencing (issue 11) with the real `memd`, `workerd` and
// `dhsctl` executables over ipc:// in a private run directory. Faults are real signals to real processes:
// - SIGKILL a worker mid-decode: memd fences its GPU within its worker timeout (the socket monitor sees the closed
//   connection at once); nothing is pinned, no slot or page of the GPU is counted; a new worker registers as epoch 2,
//   resumes the interrupted requests (importing the history memd kept on host, recomputing the rest) and serves new
//   requests whose tokens and logits digests equal the model run alone.
// - SIGSTOP a worker: fenced within the timeout; after SIGCONT it learns its epoch ended before it acts on anything
//   memd sent, ends its request with an error to the client, sends memd nothing (no message of it is refused) and
//   exits 75 (kExitEpochEnded) for a supervisor to restart it; the restarted worker is epoch 2 and serves.
// - SIGKILL memd under a running worker and start a new memd: the worker ends its request with an error and exits
//   75 within its memd timeout (it never hangs); restarted, it says Hello to the new memd (which adopted the dead
//   memd's host pool: a later epoch) and serves.
// - SIGKILL memd and the worker mid-decode, start memd again with the same flags, then the worker: the new memd adopts
//   the host pool's journal and the request records, the worker resumes the interrupted requests and the clients'
//   re-attached streams equal the model run alone; no host page stays owned afterwards.
// - Speculation memory (issue 13): a --speculate worker's staging share and totals as dhsctl shows them, before and
//   after a memd restart (the re-Hello's report carries the share).
// memd's view is read with `dhsctl --json` (the operator's view). Times are printed, never asserted below a bound.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/host_pool.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "memd/pool_segment.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"
#include "tests/workerd/worker_test_util.h"
#include "tools/replay/zmq_node_client.h"

namespace dhs::test {
namespace {

using dhs::testing::ChildProcess;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kPageRows = 16;
constexpr int kExitEpochEnded = 75;  // workerd/worker_process.h

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One node: memd + workerd of GPU 0 (adaptive, glm5-like), with the default liveness timeouts given explicitly
// (memd: worker timeout 3 s, ZMTP heartbeats every second; workerd: memd timeout 2 s).
// What a client received over its DealerClient: tokens and logits digests per request and which requests finished;
// every chunk must carry no error.
struct ClientStreams {
  std::map<RequestId, Generated> got;
  std::map<RequestId, bool> finished;
  // Reads TokenChunks from `c` until `done()` or `timeout_ms` passed.
  void Read(DealerClient& c, const std::function<bool()>& done, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      auto b = c.Receive(std::chrono::milliseconds(10));
      if (!b.ok()) continue;
      auto m = DecodeEnvelope(*b);
      if (!m.ok() || m->type != wire::Body::TokenChunk) continue;
      auto chunk = ReadTokenChunk(*m);
      EXPECT_EQ(chunk->error, wire::ErrorCode::OK) << chunk->error_message;
      Generated& g = got[chunk->request];
      for (uint8_t t : chunk->tokens) g.tokens.push_back(t);
      for (uint64_t d : chunk->logits_digests) g.digests.push_back(d);
      if (chunk->finished) finished[chunk->request] = true;
    }
  }
};

class Node {
 public:
  explicit Node(const std::string& run_dir, uint32_t host_pool_pages = 2048)
      : run_dir_(run_dir), model_(MakePresetModel("glm5-like", 3)), host_pool_pages_(host_pool_pages) {
    page_bytes_ = uint64_t{kPageRows} * model_->config().row_bytes() * model_->config().n_sources();
  }
  // The memds of a test are gone by now (declared after the Node); one SIGKILLed, or stopped while requests held host
  // pages, left its host pool (named by the run directory) in /dev/shm: removed, so runs do not pile them up.
  ~Node() {
    std::error_code ec;
    if (!std::filesystem::exists(run_dir_, ec)) return;
    HostPoolSegment::Remove(memd::PoolSegmentName(std::filesystem::canonical(run_dir_, ec).string())).IgnoreError();
  }
  static bool Available() {
    for (const char* v : {"MEMD", "WORKERD", "DHSCTL"}) {
      if (std::getenv(v) == nullptr || !std::filesystem::exists(std::getenv(v))) return false;
    }
    return true;
  }
  std::unique_ptr<ChildProcess> StartMemd(const std::string& log) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{std::getenv("MEMD"), "--run-dir", run_dir_, "--page-bytes",
                                 std::to_string(HostPageBytes(model_->config(), kPageRows)), "--host-pool-pages",
                                 std::to_string(host_pool_pages_), "--worker-timeout-ms", "3000", "--adopt-grace-ms",
                                 "500", "--log-level", "info"},
        Log(log));
  }
  // `gpu_pages`: the worker's HBM budget in GPU pages (M); `reconnect_ms`: workerd --memd-reconnect-ms (how long a
  // worker whose memd died tries its re-Hello).
  // `extra`: more workerd flags (e.g. --speculate).
  std::unique_ptr<ChildProcess> StartWorker(const std::string& log, const std::string& mode = "adaptive",
                                            uint64_t gpu_pages = 200, int reconnect_ms = 30000,
                                            const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {std::getenv("WORKERD"), "--run-dir", run_dir_, "--gpu", "0", "--mode", mode,
                                     "--preset", "glm5-like", "--seed", "3", "--page-rows", std::to_string(kPageRows),
                                     "--tail-rows", "32", "--slots", "2", "--hbm-budget",
                                     std::to_string(gpu_pages * page_bytes_),
                                     "--memd-timeout-ms", "2000", "--memd-reconnect-ms", std::to_string(reconnect_ms),
                                     "--log-level", "info"};
    args.insert(args.end(), extra.begin(), extra.end());
    return std::make_unique<ChildProcess>(std::move(args), Log(log));
  }
  uint64_t page_bytes() const { return page_bytes_; }
  // Waits until `text` appears in log `name` (an event the process logs), up to `timeout_ms`.
  bool WaitLog(const std::string& name, const std::string& text, int timeout_ms = 20000) const {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Clock::now() < deadline) {
      if (ReadFile(Log(name)).find(text) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  std::string Log(const std::string& name) const { return run_dir_ + "/" + name + ".log"; }
  const model::Model& model() const { return *model_; }
  std::string Logs() const {
    std::string out;
    for (const auto& e : std::filesystem::directory_iterator(run_dir_)) {
      if (e.path().extension() == ".log") out += "\n" + e.path().string() + ":\n" + ReadFile(e.path().string());
    }
    return out;
  }
  // `dhsctl --json VIEW`; null when dhsctl failed.
  json Dhsctl(const std::string& view) const {
    const std::string cmd = std::string(std::getenv("DHSCTL")) + " --run-dir " + run_dir_ + " --json " + view +
                            " 2>/dev/null";
    FILE* f = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    const int status = pclose(f);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return json();
    return json::parse(out, nullptr, false);
  }
  json Gpu0() const {
    for (const json& g : Dhsctl("gpus")) {
      if (g["gpu"] == 0) return g;
    }
    return json();
  }
  // Polls dhsctl until GPU 0 is up == `up` (with `epoch`, when > 0); returns its entry (null on timeout).
  json WaitGpu0(bool up, int epoch = 0, int timeout_ms = 20000) const {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Clock::now() < deadline) {
      json g = Gpu0();
      if (!g.is_null() && g["up"] == up && (epoch == 0 || g["epoch"] == epoch)) return g;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return json();
  }
  std::unique_ptr<DealerClient> Client() const {
    auto c = DealerClient::Connect(IpcEndpoint(run_dir_, "worker-0"));
    EXPECT_TRUE(c.ok());
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->WaitPeerConnected(true, std::chrono::milliseconds(15000))) << "no worker" << Logs();
    return std::move(*c);
  }
  static void Submit(DealerClient& c, RequestId id, uint32_t salt, uint32_t max_new) {
    wire::SubmitRequestT s;
    s.request = id;
    s.prompt = Prompt(40, salt);
    s.max_new_tokens = max_new;
    ASSERT_TRUE(c.Send(EncodeSubmitRequest(s, id + 1, "replay")).ok());
  }
  // Reads chunks of request `id` until it finished or `timeout_ms` passed.
  struct Outcome {
    Generated got;
    bool finished = false;
    wire::ErrorCode error = wire::ErrorCode::OK;
    std::string message;
    wire::EndReason end_reason = wire::EndReason::NONE;
  };
  static Outcome Read(DealerClient& c, RequestId id, int timeout_ms, size_t stop_after_tokens = SIZE_MAX) {
    Outcome o;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!o.finished && Clock::now() < deadline && o.got.tokens.size() < stop_after_tokens) {
      auto r = c.Receive(std::chrono::milliseconds(10));
      if (!r.ok()) continue;
      auto m = DecodeEnvelope(*r);
      if (!m.ok() || m->type != wire::Body::TokenChunk) continue;
      auto chunk = ReadTokenChunk(*m);
      if (chunk->request != id) continue;
      for (uint8_t t : chunk->tokens) o.got.tokens.push_back(t);
      for (uint64_t d : chunk->logits_digests) o.got.digests.push_back(d);
      o.finished = chunk->finished;
      if (chunk->error != wire::ErrorCode::OK) {
        o.error = chunk->error;
        o.message = chunk->error_message;
        o.end_reason = chunk->end_reason;
      }
    }
    return o;
  }
  Generated Oracle(uint32_t salt, uint32_t max_new) const {
    const std::vector<uint8_t> p = Prompt(40, salt);
    return test::Oracle(*model_, std::vector<model::Token>(p.begin(), p.end()), max_new);
  }
  // A fresh worker serves a request exactly as the model alone would.
  void ExpectServesExactly(RequestId id, uint32_t salt) {
    auto c = Client();
    ASSERT_TRUE(c);
    Submit(*c, id, salt, 6);
    const Outcome o = Read(*c, id, 30000);
    ASSERT_TRUE(o.finished) << Logs();
    EXPECT_EQ(o.error, wire::ErrorCode::OK) << o.message << Logs();
    const Generated want = Oracle(salt, 6);
    EXPECT_EQ(o.got.tokens, want.tokens) << Logs();
    EXPECT_EQ(o.got.digests, want.digests);
  }

 private:
  std::string run_dir_;
  std::unique_ptr<model::Model> model_;
  uint32_t host_pool_pages_ = 2048;
  uint64_t page_bytes_ = 0;
};

// Starts a request of 30000 tokens and waits until it streams; returns its client.
std::unique_ptr<DealerClient> StartStreaming(Node& node, RequestId id) {
  auto c = node.Client();
  if (!c) return nullptr;
  Node::Submit(*c, id, 9, 30000);  // decodes for seconds (~3000 tokens/s here): the faults come mid-decode
  const Node::Outcome o = Node::Read(*c, id, 30000, 2);
  EXPECT_GE(o.got.tokens.size(), 2u) << "request " << id << " never streamed" << node.Logs();
  EXPECT_FALSE(o.finished) << o.message;
  return c;
}

TEST(WorkerFence, KilledWorkerIsFencedAndARestartedWorkerIsEpoch2AndServesExactly) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd");
  auto worker = node.StartWorker("workerd-1");
  auto c = StartStreaming(node, 5);
  ASSERT_TRUE(c);
  const json before = node.Gpu0();
  ASSERT_EQ(before["up"], true) << before.dump();
  EXPECT_EQ(before["epoch"], 1);
  EXPECT_GT(before["M_req"], 0) << "the request holds pages while it decodes";
  const auto killed = Clock::now();
  worker.reset();  // SIGKILL mid-decode
  const json fenced = node.WaitGpu0(false, 1);
  const double fence_s = Since(killed);
  std::printf("SIGKILL -> GPU 0 fenced in %.3f s (worker timeout 3 s)\n", fence_s);
  ASSERT_FALSE(fenced.is_null()) << "never fenced" << node.Logs();
  EXPECT_LT(fence_s, 3.0 + 1.0) << "fenced later than the worker timeout (plus a second of dhsctl polls)";
  EXPECT_EQ(fenced["M"], 0);  // no page accounting of the dead worker's GPU
  EXPECT_EQ(fenced["slots_used"], 0);
  const json status = node.Dhsctl("status");
  EXPECT_EQ(status["host"]["pinned"], 0) << status.dump();
  const json req = node.Dhsctl("request 5");  // node id of client id 5 on GPU 0, epoch 1: 5
  EXPECT_EQ(req["state"], "interrupted") << req.dump();
  EXPECT_EQ(status["host"]["allocated"], req["host_pages"]) << "only the interrupted request's confirmed copies";

  auto restarted = node.StartWorker("workerd-2");
  const json up = node.WaitGpu0(true, 2);
  ASSERT_FALSE(up.is_null()) << node.Logs();
  // The new worker resumed the request under an epoch-2 id, whose admission ended the interrupted id (memd handed it
  // the kept host pages; KilledWorkerResumesItsRequestsExactlyAndClientsReattach checks what it streams).
  for (int i = 0; i < 500 && !node.Dhsctl("request 5").is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(node.Dhsctl("request 5").is_null()) << "the interrupted request was never ended" << node.Logs();
  const RequestId resumed = MakeNodeRequestId(0, 2, 5);  // client id 5 on GPU 0, epoch 2
  const json again = node.Dhsctl("request " + std::to_string(resumed));
  EXPECT_FALSE(again.is_null()) << "the request was not resumed" << node.Logs();
  if (!again.is_null()) EXPECT_NE(again["state"], "interrupted") << again.dump();
  node.ExpectServesExactly(5, 11);  // client id 5 again: node id (epoch 2) differs from the interrupted one's
  EXPECT_NE(ReadFile(node.Log("memd")).find("GPU 0 fenced"), std::string::npos) << node.Logs();
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// Resume (issue 11): SIGKILL the worker mid-decode (at the point where request 1's client holds 20 tokens), start it
// again: it resumes both requests from memd's records, importing the pages memd kept with a confirmed host copy
// (hisparse: every completed page is backed up, so the history before the kill point is on host) and recomputing
// only the rest, and a new client connection re-attaches with the tokens each request already streamed. Each stream
// (before the kill, then after the re-attach) equals the model run alone token for token and digest for digest,
// greedy and sampled: nothing lost, nothing twice. At the end no host page or GPU page stays allocated.
TEST(WorkerFence, KilledWorkerResumesItsRequestsExactlyAndClientsReattach) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd");
  auto worker = node.StartWorker("workerd-1", "hisparse");
  constexpr uint32_t kMaxNew = 400;
  struct Req {
    RequestId id;
    uint32_t salt;
    float temperature;
    uint64_t seed;
  };
  const std::vector<Req> reqs = {{1, 21, 0.0f, 0}, {2, 22, 0.9f, 5}};
  auto c1 = node.Client();
  ASSERT_TRUE(c1);
  for (const Req& r : reqs) {
    wire::SubmitRequestT s;
    s.request = r.id;
    s.prompt = Prompt(40, r.salt);
    s.max_new_tokens = kMaxNew;
    s.temperature = r.temperature;
    s.seed = r.seed;
    ASSERT_TRUE(c1->Send(EncodeSubmitRequest(s, r.id + 1, "replay")).ok());
  }
  ClientStreams streams;
  std::map<RequestId, Generated>& got = streams.got;
  std::map<RequestId, bool>& finished = streams.finished;
  streams.Read(*c1, [&] { return got[1].tokens.size() >= 20; }, 30000);
  ASSERT_GE(got[1].tokens.size(), 20u) << node.Logs();
  worker.reset();  // SIGKILL mid-decode
  // What the dead worker had sent is still delivered to c1: read it until its connection reports the loss.
  streams.Read(*c1, [&] { return c1->disconnects() > 0; }, 10000);
  streams.Read(*c1, [] { return false; }, 200);  // and what was queued before the close
  ASSERT_FALSE(finished[1] || finished[2]) << "a request finished before the kill";
  const auto killed = Clock::now();
  ASSERT_FALSE(node.WaitGpu0(false, 1).is_null()) << "never fenced" << node.Logs();
  uint64_t kept_pages = 0;  // confirmed host copies memd kept (node ids 1 and 2: GPU 0, epoch 1)
  for (const Req& r : reqs) {
    const json q = node.Dhsctl("request " + std::to_string(r.id));
    ASSERT_EQ(q["state"], "interrupted") << q.dump();
    kept_pages += q["host_pages"].get<uint64_t>();
  }
  ASSERT_GT(kept_pages, 0u) << "no page had a confirmed host copy at the kill" << node.Logs();
  auto restarted = node.StartWorker("workerd-2", "hisparse");
  ASSERT_FALSE(node.WaitGpu0(true, 2).is_null()) << node.Logs();
  auto c2 = node.Client();
  ASSERT_TRUE(c2);
  std::map<RequestId, size_t> had;
  for (const Req& r : reqs) {
    had[r.id] = got[r.id].tokens.size();
    wire::AttachT a;
    a.request = r.id;
    a.received = static_cast<uint32_t>(had[r.id]);
    ASSERT_TRUE(c2->Send(EncodeAttach(a, 100 + r.id, "replay")).ok());
  }
  streams.Read(*c2, [&] { return finished[1] && finished[2]; }, 60000);
  std::printf("kill -> both requests finished on the restarted worker in %.3f s (had %zu and %zu tokens)\n",
              Since(killed), had[1], had[2]);
  for (const Req& r : reqs) {
    SCOPED_TRACE("request " + std::to_string(r.id));
    ASSERT_TRUE(finished[r.id]) << node.Logs();
    const std::vector<uint8_t> p = Prompt(40, r.salt);
    const Generated want = test::Oracle(*MakePresetModel("glm5-like", 3), {p.begin(), p.end()}, kMaxNew,
                                        r.temperature, 1.0f, r.seed, r.id);
    EXPECT_EQ(got[r.id].tokens, want.tokens) << "lost or repeated tokens";
    EXPECT_EQ(got[r.id].digests, want.digests);
  }
  // The restarted worker's counters: both resumed; the kept pages imported (at most the leading run of each, whole
  // pages), the rest recomputed: together the inputs and the tokens memd's records held.
  wire::WorkerStatsQueryT q;
  auto reply = c2->Request(EncodeWorkerStatsQuery(q, 500, "replay"), std::chrono::milliseconds(5000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto stats = ReadWorkerStatsReply(*DecodeEnvelope(*reply));
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->requests_resumed, 2u);
  // Inputs, then the tokens memd's record held: fewer than the clients had when the last commits were in flight at
  // the kill, at most one more each (a step committed whose chunk the kill stopped).
  EXPECT_GT(stats->rows_imported, 0u) << "nothing imported from host" << node.Logs();
  EXPECT_EQ(stats->rows_imported % kPageRows, 0u);
  EXPECT_LE(stats->rows_imported, kept_pages * kPageRows);
  EXPECT_LT(stats->rows_recomputed, stats->rows_imported) << "most of the history was on host";
  const uint64_t history = stats->rows_imported + stats->rows_recomputed;
  EXPECT_GE(history, 80u);
  EXPECT_LE(history, 80u + had[1] + 1 + had[2] + 1);
  std::printf("restarted worker: %llu requests resumed, %llu rows imported from host (%llu pages kept), %llu rows "
              "recomputed, longest resume %.3f ms\n",
              static_cast<unsigned long long>(stats->requests_resumed),
              static_cast<unsigned long long>(stats->rows_imported), static_cast<unsigned long long>(kept_pages),
              static_cast<unsigned long long>(stats->rows_recomputed), stats->resume_us_max / 1000.0);
  for (int i = 0; i < 500 && node.Dhsctl("status")["host"]["allocated"] != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(node.Dhsctl("status")["host"]["allocated"], 0) << "host pages left behind" << node.Logs();
  EXPECT_EQ(node.Gpu0()["free"], node.Gpu0()["M"]);
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// Resume with gaps in adaptive mode (issue 11): M is sized so that request 1 (greedy) keeps its two prompt pages on
// GPU at its grant (resident-first: no host copy), and request 2's admission (sampled) makes memd reclaim them (backed
// up: host copies now) and keep request 2's first prompt page on GPU instead (no host copy); every page completed
// while decoding is backed up. The worker is SIGKILLed mid-decode: memd keeps request 1's pages 0, 1 (the reclaim's)
// and the later ones, and request 2's pages after its lost page 0: a copy after a gap. The restarted worker imports
// every kept page and recomputes the rest: each request's figures (its log line) equal what memd's view of its pages
// (`dhsctl request N`, host_copies) says, and the streams equal the model run alone.
TEST(WorkerFence, KilledAdaptiveWorkerImportsEveryKeptPageAroundTheGaps) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  struct Req {
    RequestId id;
    uint32_t salt;
    float temperature;
    uint64_t seed;
    uint32_t max_new;
  };
  const std::vector<Req> reqs = {{1, 31, 0.0f, 0, 1500}, {2, 32, 0.9f, 5, 400}};
  WorkerConfig wc;
  wc.mode = WorkerMode::kAdaptive;
  wc.page_rows = kPageRows;
  wc.tail_rows = 32;
  wc.slots = 2;
  wc.hbm_budget_bytes = uint64_t{1} << 30;
  const auto geo = ComputeGeometry(node.model().config(), wc);
  ASSERT_TRUE(geo.ok()) << geo.status();
  const uint32_t r1 = RequiredPages(node.model().config(), *geo, wc.mode, 40 + reqs[0].max_new);
  const uint32_t r2 = RequiredPages(node.model().config(), *geo, wc.mode, 40 + reqs[1].max_new);
  // Request 1 keeps 2 pages (M - r1 >= 2); then r2 > M - r1 - 2: a reclaim of them; then 1 spare page for request 2.
  auto memd = node.StartMemd("memd");
  auto worker = node.StartWorker("workerd-1", "adaptive", r1 + r2 + 1);
  auto c1 = node.Client();
  ASSERT_TRUE(c1);
  auto submit = [&](const Req& r) {
    wire::SubmitRequestT sub;
    sub.request = r.id;
    sub.prompt = Prompt(40, r.salt);
    sub.max_new_tokens = r.max_new;
    sub.temperature = r.temperature;
    sub.seed = r.seed;
    ASSERT_TRUE(c1->Send(EncodeSubmitRequest(sub, r.id + 1, "replay")).ok());
  };
  auto copies = [&](RequestId id) {
    std::set<uint32_t> pages;
    const json q = node.Dhsctl("request " + std::to_string(id));
    for (const json& c : q["host_copies"]) pages.insert(c[0].get<uint32_t>());
    return pages;
  };
  ClientStreams streams;
  std::map<RequestId, Generated>& got = streams.got;
  std::map<RequestId, bool>& finished = streams.finished;
  submit(reqs[0]);
  streams.Read(*c1, [&] { return got[1].tokens.size() >= 2; }, 30000);
  const json before = node.Dhsctl("request 1");
  // Its prompt pages 0, 1 on GPU, no host copy (population may have brought backed-up pages back too).
  ASSERT_GE(before["a_r"], 2) << "request 1 kept no prompt page on GPU: " << before.dump() << node.Logs();
  ASSERT_FALSE(copies(1).contains(0)) << before.dump();
  ASSERT_FALSE(copies(1).contains(1)) << before.dump();
  submit(reqs[1]);
  streams.Read(*c1, [&] { return got[2].tokens.size() >= 20; }, 30000);
  ASSERT_GE(got[2].tokens.size(), 20u) << node.Logs();
  worker.reset();  // SIGKILL mid-decode
  streams.Read(*c1, [&] { return c1->disconnects() > 0; }, 10000);
  streams.Read(*c1, [] { return false; }, 200);
  ASSERT_FALSE(finished[1] || finished[2]) << "a request finished before the kill";
  ASSERT_FALSE(node.WaitGpu0(false, 1).is_null()) << "never fenced" << node.Logs();
  std::map<RequestId, std::set<uint32_t>> kept;  // memd's view: history pages with a confirmed host copy
  std::map<RequestId, uint32_t> recorded;         // memd's view: the tokens its record holds
  for (const Req& r : reqs) {
    const json q = node.Dhsctl("request " + std::to_string(r.id));
    ASSERT_EQ(q["state"], "interrupted") << q.dump();
    ASSERT_TRUE(q["record_tokens"].is_number()) << "an interrupted request without a record: " << q.dump();
    recorded[r.id] = q["record_tokens"].get<uint32_t>();
    kept[r.id] = copies(r.id);
  }
  EXPECT_TRUE(kept[1].contains(0) && kept[1].contains(1)) << "the reclaim's backups of request 1's kept pages";
  EXPECT_FALSE(kept[2].contains(0)) << "request 2's page 0 was kept on GPU only";
  EXPECT_TRUE(kept[2].contains(1)) << "a copy after the gap";
  auto restarted = node.StartWorker("workerd-2", "adaptive", r1 + r2 + 1);
  ASSERT_FALSE(node.WaitGpu0(true, 2).is_null()) << node.Logs();
  auto c2 = node.Client();
  ASSERT_TRUE(c2);
  for (const Req& r : reqs) {
    wire::AttachT a;
    a.request = r.id;
    a.received = static_cast<uint32_t>(got[r.id].tokens.size());
    ASSERT_TRUE(c2->Send(EncodeAttach(a, 100 + r.id, "replay")).ok());
  }
  streams.Read(*c2, [&] { return finished[1] && finished[2]; }, 120000);
  for (const Req& r : reqs) {
    SCOPED_TRACE("request " + std::to_string(r.id));
    ASSERT_TRUE(finished[r.id]) << node.Logs();
    const std::vector<uint8_t> p = Prompt(40, r.salt);
    const Generated want = test::Oracle(node.model(), {p.begin(), p.end()}, r.max_new, r.temperature, 1.0f, r.seed,
                                        r.id);
    EXPECT_EQ(got[r.id].tokens, want.tokens) << "lost or repeated tokens";
    EXPECT_EQ(got[r.id].digests, want.digests);
  }
  // Each request's figures from the restarted worker's log line, against memd's view before the resume: its n rows
  // (imported + recomputed) are the record's tokens (prompt + committed: a commit not acknowledged before the kill
  // leaves the record behind what the client got, which the resume regenerates identically), of them the kept pages
  // wholly before the last row imported, the rest recomputed.
  const std::string log = ReadFile(node.Log("workerd-2"));
  for (const Req& r : reqs) {
    SCOPED_TRACE("request " + std::to_string(r.id));
    const std::string key = "(client " + std::to_string(r.id) + ") resumed: first new token after ";
    const size_t at = log.find(key);
    ASSERT_NE(at, std::string::npos) << log;
    unsigned long long us = 0, imported = 0, recomputed = 0;
    ASSERT_EQ(std::sscanf(log.c_str() + at + key.size(), "%llu us (%llu rows imported from host, %llu rows recomputed",
                          &us, &imported, &recomputed),
              3)
        << log.substr(at, 200);
    const uint64_t n = imported + recomputed;
    uint64_t want = 0;
    for (uint32_t j : kept[r.id]) want += j < (n - 1) / kPageRows ? kPageRows : 0;
    EXPECT_EQ(imported, want) << "kept pages " << kept[r.id].size() << ", " << n << " rows";
    EXPECT_EQ(n, 40u + recorded[r.id]) << "rows resumed against the record's tokens";
    std::printf("request %llu: %u tokens recorded, %zu pages kept (first: %u), %llu rows imported, %llu recomputed, "
                "resumed in %.3f ms\n",
                static_cast<unsigned long long>(r.id), recorded[r.id], kept[r.id].size(),
                kept[r.id].empty() ? 0u : *kept[r.id].begin(), imported, recomputed, us / 1000.0);
  }
  for (int i = 0; i < 500 && node.Dhsctl("status")["host"]["allocated"] != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(node.Dhsctl("status")["host"]["allocated"], 0) << "host pages left behind" << node.Logs();
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// memd restart (issue 11): memd and the worker are SIGKILLed while two requests (one greedy, one sampled) decode
// (20 tokens streamed, not a sleep); memd then the worker start again with the same flags. The new memd adopts the
// segment's journal and the records in the run directory: GPU 0 is fenced with both requests interrupted; the worker
// registers as epoch 2 and resumes them from their records (today's resume path recomputes); re-attached clients get
// streams equal to the model run alone, and once they finish memd owns no host page and pins none.
TEST(WorkerFence, KilledMemdAndWorkerResumeFromTheAdoptedPoolExactly) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd-1");
  auto worker = node.StartWorker("workerd-1");
  constexpr uint32_t kMaxNew = 300;
  const std::vector<std::tuple<RequestId, uint32_t, float, uint64_t>> reqs = {{1, 31, 0.0f, 0}, {2, 32, 0.8f, 7}};
  auto c1 = node.Client();
  ASSERT_TRUE(c1);
  for (const auto& [id, salt, temperature, seed] : reqs) {
    wire::SubmitRequestT s;
    s.request = id;
    s.prompt = Prompt(40, salt);
    s.max_new_tokens = kMaxNew;
    s.temperature = temperature;
    s.seed = seed;
    ASSERT_TRUE(c1->Send(EncodeSubmitRequest(s, id + 1, "replay")).ok());
  }
  ClientStreams streams;
  std::map<RequestId, Generated>& got = streams.got;
  std::map<RequestId, bool>& finished = streams.finished;
  streams.Read(*c1, [&] { return got[1].tokens.size() >= 20 && got[2].tokens.size() >= 20; }, 30000);
  ASSERT_GE(got[2].tokens.size(), 20u) << node.Logs();
  memd.reset();    // SIGKILL: nothing of memd's cleanup runs
  worker.reset();  // SIGKILL, before its memd timeout
  streams.Read(*c1, [&] { return c1->disconnects() > 0; }, 10000);
  streams.Read(*c1, [] { return false; }, 200);
  ASSERT_FALSE(finished[1] || finished[2]) << "a request finished before the kill";
  const auto killed = Clock::now();
  memd = node.StartMemd("memd-2");
  json g = node.WaitGpu0(false, 1);
  ASSERT_FALSE(g.is_null()) << "the new memd does not show GPU 0 fenced at epoch 1" << node.Logs();
  json requests = node.Dhsctl("requests");
  ASSERT_EQ(requests.size(), 2u) << requests.dump() << node.Logs();
  for (const json& r : requests) EXPECT_EQ(r["state"], "interrupted") << r.dump();
  auto restarted = node.StartWorker("workerd-2");
  ASSERT_FALSE(node.WaitGpu0(true, 2).is_null()) << node.Logs();
  auto c2 = node.Client();
  ASSERT_TRUE(c2);
  std::map<RequestId, size_t> had;
  for (const auto& [id, salt, temperature, seed] : reqs) {
    had[id] = got[id].tokens.size();
    wire::AttachT a;
    a.request = id;
    a.received = static_cast<uint32_t>(had[id]);
    ASSERT_TRUE(c2->Send(EncodeAttach(a, 100 + id, "replay")).ok());
  }
  streams.Read(*c2, [&] { return finished[1] && finished[2]; }, 60000);
  std::printf("memd + worker SIGKILL -> both requests finished after restarts in %.3f s (had %zu and %zu tokens)\n",
              Since(killed), had[1], had[2]);
  for (const auto& [id, salt, temperature, seed] : reqs) {
    SCOPED_TRACE("request " + std::to_string(id));
    ASSERT_TRUE(finished[id]) << node.Logs();
    const std::vector<uint8_t> p = Prompt(40, salt);
    const Generated want = test::Oracle(*MakePresetModel("glm5-like", 3), {p.begin(), p.end()}, kMaxNew, temperature,
                                        1.0f, seed, id);
    EXPECT_EQ(got[id].tokens, want.tokens) << "lost or repeated tokens";
    EXPECT_EQ(got[id].digests, want.digests);
  }
  wire::WorkerStatsQueryT q;
  auto reply = c2->Request(EncodeWorkerStatsQuery(q, 500, "replay"), std::chrono::milliseconds(5000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto stats = ReadWorkerStatsReply(*DecodeEnvelope(*reply));
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->requests_resumed, 2u);
  for (int i = 0; i < 500 && node.Dhsctl("status")["host"]["allocated"] != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const json status = node.Dhsctl("status");
  EXPECT_EQ(status["host"]["allocated"], 0) << "host pages left behind" << node.Logs();
  EXPECT_EQ(status["host"]["pinned"], 0);
  EXPECT_TRUE(node.Dhsctl("requests").empty());
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// memd restart under a live worker (issue 11): memd is SIGKILLed while two requests (greedy and sampled) decode on
// the worker (20 tokens streamed each). The worker sees memd's connection close, keeps decoding from its GPU (no
// host write, tokens held from the client) and, once memd is started again on the same run directory (after the
// worker logged that it is away: the interleaving is forced, not slept for), says its re-Hello with a report. The SAME
// worker process (pid) finishes both requests; each client stream equals the model run alone, token for token and
// digest for digest, exactly max_new tokens (nothing lost, nothing twice, no error chunk); GPU 0 keeps epoch 1; and
// afterwards memd pins no host page, owns none, and every GPU page of GPU 0 is free.
// Submits `reqs` ({id, prompt salt, temperature, seed}: a 40-token prompt, `max_new` tokens each) and reads until
// requests 1 and 2 streamed 20 tokens each (30 s at most).
void SubmitAndReadTwenty(DealerClient& c, const std::vector<std::tuple<RequestId, uint32_t, float, uint64_t>>& reqs,
                         uint32_t max_new, ClientStreams& streams) {
  for (const auto& [id, salt, temperature, seed] : reqs) {
    wire::SubmitRequestT sr;
    sr.request = id;
    sr.prompt = Prompt(40, salt);
    sr.max_new_tokens = max_new;
    sr.temperature = temperature;
    sr.seed = seed;
    ASSERT_TRUE(c.Send(EncodeSubmitRequest(sr, id + 1, "replay")).ok());
  }
  streams.Read(c, [&] { return streams.got[1].tokens.size() >= 20 && streams.got[2].tokens.size() >= 20; }, 30000);
}

void KilledMemdComesBackAndTheSameWorkerFinishes(const std::string& mode) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd-1");
  auto worker = node.StartWorker("workerd", mode);
  const pid_t pid = worker->pid();
  constexpr uint32_t kMaxNew = 300;
  const std::vector<std::tuple<RequestId, uint32_t, float, uint64_t>> reqs = {{1, 41, 0.0f, 0}, {2, 42, 0.8f, 9}};
  auto c = node.Client();
  ASSERT_TRUE(c);
  ClientStreams streams;
  SubmitAndReadTwenty(*c, reqs, kMaxNew, streams);
  ASSERT_GE(streams.got[2].tokens.size(), 20u) << node.Logs();
  const auto killed = Clock::now();
  memd.reset();  // SIGKILL mid-decode
  ASSERT_TRUE(node.WaitLog("workerd", "memd's connection closed")) << node.Logs();
  // The worker decodes on from its GPU until each request's tail is full (no host write while memd is away): both
  // pause before memd comes back.
  ASSERT_TRUE(node.WaitLog("workerd", "request 1 (client 1) pauses until memd is back")) << node.Logs();
  ASSERT_TRUE(node.WaitLog("workerd", "request 2 (client 2) pauses until memd is back")) << node.Logs();
  ASSERT_FALSE(streams.finished[1] || streams.finished[2]) << "a request finished before the kill";
  streams.Read(*c, [] { return false; }, 200);  // what was sent before memd died
  const size_t streamed = streams.got[1].tokens.size() + streams.got[2].tokens.size();
  streams.Read(*c, [] { return false; }, 200);
  EXPECT_EQ(streams.got[1].tokens.size() + streams.got[2].tokens.size(), streamed)
      << "tokens reached a client while memd's record could not take them";
  memd = node.StartMemd("memd-2");
  ASSERT_TRUE(node.WaitLog("workerd", "memd took the re-Hello")) << node.Logs();
  const double back_s = Since(killed);
  streams.Read(*c, [&] { return streams.finished[1] && streams.finished[2]; }, 60000);
  std::printf("%s: memd SIGKILL -> re-Hello taken after %.3f s (memd restarted once both requests paused), both "
              "requests finished after %.3f s\n", mode.c_str(), back_s, Since(killed));
  EXPECT_FALSE(worker->Exited()) << node.Logs();
  EXPECT_EQ(worker->pid(), pid);
  for (const auto& [id, salt, temperature, seed] : reqs) {
    SCOPED_TRACE("request " + std::to_string(id));
    ASSERT_TRUE(streams.finished[id]) << node.Logs();
    const std::vector<uint8_t> p = Prompt(40, salt);
    const Generated want = test::Oracle(*MakePresetModel("glm5-like", 3), {p.begin(), p.end()}, kMaxNew, temperature,
                                        1.0f, seed, id);
    EXPECT_EQ(streams.got[id].tokens.size(), kMaxNew) << "lost or repeated tokens";
    EXPECT_EQ(streams.got[id].tokens, want.tokens);
    EXPECT_EQ(streams.got[id].digests, want.digests);
  }
  const json g = node.WaitGpu0(true, 1);
  ASSERT_FALSE(g.is_null()) << "GPU 0 is not up at epoch 1 with the new memd" << node.Logs();
  for (int i = 0; i < 500 && !node.Dhsctl("requests").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(node.Dhsctl("requests").empty()) << node.Dhsctl("requests").dump() << node.Logs();
  const json status = node.Dhsctl("status");
  EXPECT_EQ(status["host"]["pinned"], 0) << status.dump();
  EXPECT_EQ(status["host"]["allocated"], 0) << status.dump() << node.Logs();
  const json after = node.Gpu0();
  EXPECT_EQ(after["free"], after["M"]) << after.dump();
  EXPECT_NE(ReadFile(node.Log("memd-2")).find("survived a memd restart"), std::string::npos) << node.Logs();
  node.ExpectServesExactly(7, 17);  // the new memd grants the surviving worker new requests
  EXPECT_EQ(worker->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

TEST(WorkerReHello, KilledMemdComesBackAndTheSameWorkerFinishesExactlyAdaptive) {
  KilledMemdComesBackAndTheSameWorkerFinishes("adaptive");
}
TEST(WorkerReHello, KilledMemdComesBackAndTheSameWorkerFinishesExactlyHisparse) {
  KilledMemdComesBackAndTheSameWorkerFinishes("hisparse");
}

// A worker stopped (SIGSTOP) while memd restarts: the worker is stopped mid-decode, memd is SIGKILLed, a new memd
// starts on the same run directory and adopts the pool (dhsctl shows GPU 0 at epoch 1, not up), and only once the
// worker has been stopped for longer than its memd timeout (2 s) is it continued (the ordering is forced: stop before
// the kill, continue after the new memd is ready). After SIGCONT nothing has come from memd for > 2 s, but its
// connection closed while the worker was stopped: the worker must take the "memd away" path (settle the dead memd's
// orders, re-Hello with its report), not end its epoch blaming a live connection. The SAME pid finishes both requests
// exactly (greedy and sampled), GPU 0 keeps epoch 1 and memd holds nothing afterwards.
TEST(WorkerReHello, WorkerStoppedWhileMemdRestartsSaysItsReHelloAfterContinue) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd-1");
  auto worker = node.StartWorker("workerd");
  const pid_t pid = worker->pid();
  constexpr uint32_t kMaxNew = 300;
  const std::vector<std::tuple<RequestId, uint32_t, float, uint64_t>> reqs = {{1, 51, 0.0f, 0}, {2, 52, 0.8f, 3}};
  auto c = node.Client();
  ASSERT_TRUE(c);
  ClientStreams streams;
  SubmitAndReadTwenty(*c, reqs, kMaxNew, streams);
  ASSERT_GE(streams.got[2].tokens.size(), 20u) << node.Logs();
  ASSERT_EQ(worker->Signal(SIGSTOP), 0);
  const auto stopped = Clock::now();
  memd.reset();  // SIGKILL while the worker is stopped
  memd = node.StartMemd("memd-2");
  ASSERT_FALSE(node.WaitGpu0(false, 1).is_null()) << "the new memd did not adopt GPU 0's epoch 1" << node.Logs();
  // The worker's memd timeout (2 s) passes while it is stopped: after SIGCONT, memd has been silent beyond it.
  while (Since(stopped) < 2.5) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(worker->Signal(SIGCONT), 0);
  const auto continued = Clock::now();
  ASSERT_TRUE(node.WaitLog("workerd", "memd took the re-Hello")) << node.Logs();
  std::printf("stopped %.3f s across a memd restart; SIGCONT -> re-Hello taken after %.3f s\n",
              std::chrono::duration<double>(continued - stopped).count(), Since(continued));
  streams.Read(*c, [&] { return streams.finished[1] && streams.finished[2]; }, 60000);
  EXPECT_FALSE(worker->Exited()) << node.Logs();
  EXPECT_EQ(worker->pid(), pid);
  const std::string wlog = ReadFile(node.Log("workerd"));
  EXPECT_NE(wlog.find("memd's connection closed"), std::string::npos) << wlog;
  EXPECT_EQ(wlog.find("memd lost"), std::string::npos) << wlog;
  for (const auto& [id, salt, temperature, seed] : reqs) {
    SCOPED_TRACE("request " + std::to_string(id));
    ASSERT_TRUE(streams.finished[id]) << node.Logs();
    const std::vector<uint8_t> p = Prompt(40, salt);
    const Generated want = test::Oracle(node.model(), {p.begin(), p.end()}, kMaxNew, temperature, 1.0f, seed, id);
    EXPECT_EQ(streams.got[id].tokens.size(), kMaxNew) << "lost or repeated tokens";
    EXPECT_EQ(streams.got[id].tokens, want.tokens);
    EXPECT_EQ(streams.got[id].digests, want.digests);
  }
  EXPECT_FALSE(node.WaitGpu0(true, 1).is_null()) << "GPU 0 is not up at epoch 1 with the new memd" << node.Logs();
  EXPECT_NE(ReadFile(node.Log("memd-2")).find("survived a memd restart"), std::string::npos) << node.Logs();
  for (int i = 0; i < 500 && !node.Dhsctl("requests").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(node.Dhsctl("requests").empty()) << node.Dhsctl("requests").dump() << node.Logs();
  EXPECT_EQ(node.Dhsctl("status")["host"]["allocated"], 0) << node.Logs();
  EXPECT_EQ(worker->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// dhs-replay's client (tools/replay/zmq_node_client.h) with --reattach-timeout-ms: its worker is SIGKILLed mid-decode
// and a new one starts on the same socket; the client re-attaches its unfinished request by itself and the stream it
// hands to the driver equals the model run alone (sampled): nothing lost, nothing twice.
TEST(WorkerFence, ReplayClientReattachesItsRequestsToTheRestartedWorker) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd");
  auto worker = node.StartWorker("workerd-1");
  ASSERT_TRUE(node.Client());  // the worker serves
  replay::ZmqNodeClientOptions o;
  o.worker_endpoint = IpcEndpoint(dir.path(), "worker-0");
  o.memd_endpoint = IpcEndpoint(dir.path(), "memd");
  o.reattach_timeout = std::chrono::milliseconds(30000);
  auto client = replay::ZmqNodeClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  replay::SubmitRequest sr;
  sr.request = 3;
  sr.prompt.input_tokens = 40;
  sr.max_new_tokens = 400;
  sr.sampling = replay::Sampling{false, 0.8, 4};
  ASSERT_TRUE((*client)->Submit(sr).ok());
  Generated got;
  bool finished = false;
  auto poll = [&](size_t until_tokens, int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!finished && got.tokens.size() < until_tokens && Clock::now() < deadline) {
      auto events = (*client)->Poll(10);
      ASSERT_TRUE(events.ok()) << events.status() << node.Logs();
      for (const replay::TokenEvent& e : *events) {
        EXPECT_TRUE(e.error.empty()) << e.error;
        got.tokens.insert(got.tokens.end(), e.tokens.begin(), e.tokens.end());
        got.digests.insert(got.digests.end(), e.logits_digests.begin(), e.logits_digests.end());
        finished = finished || e.finished;
      }
    }
  };
  poll(20, 30000);
  ASSERT_GE(got.tokens.size(), 20u) << node.Logs();
  worker.reset();  // SIGKILL mid-decode
  auto restarted = node.StartWorker("workerd-2");
  poll(SIZE_MAX, 60000);
  ASSERT_TRUE(finished) << node.Logs();
  EXPECT_EQ((*client)->reattaches(), 1);
  std::vector<model::Token> input;
  for (unsigned char ch : replay::SynthesizePrompt(sr.prompt)) input.push_back(ch);
  const Generated want = test::Oracle(*MakePresetModel("glm5-like", 3), input, 400, 0.8f, 1.0f, 4, 3);
  EXPECT_EQ(got.tokens, want.tokens) << "lost or repeated tokens";
  EXPECT_EQ(got.digests, want.digests);
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// Two dhs-replay clients (ZmqNodeClient, each with its own random identity: SubmitRequest.client) use the same request
// ids 3 and 4 with different prompts (trace rows 0 and 1: different private tokens). The worker is SIGKILLed mid-decode
// and a new one starts on the same socket; each client re-attaches by itself (Attach with its identity) and gets
// exactly its own tokens: each stream equals the model run alone on its own prompt (nothing of the other client's).
TEST(WorkerFence, TwoReplayClientsWithTheSameRequestIdsEachReattachToTheirOwnRequest) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd");
  auto worker = node.StartWorker("workerd-1", "hisparse");
  ASSERT_TRUE(node.Client());  // the worker serves
  constexpr int64_t kMaxNew = 300;
  const std::vector<RequestId> ids = {3, 4};
  struct One {
    std::unique_ptr<replay::ZmqNodeClient> client;
    int64_t trace_index;
    std::map<RequestId, Generated> got;
    std::map<RequestId, bool> finished;
  };
  std::vector<One> clients;
  for (int64_t row : {0, 1}) {
    replay::ZmqNodeClientOptions o;
    o.worker_endpoint = IpcEndpoint(dir.path(), "worker-0");
    o.reattach_timeout = std::chrono::milliseconds(30000);
    auto c = replay::ZmqNodeClient::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    clients.push_back(One{std::move(*c), row, {}, {}});
  }
  ASSERT_NE(clients[0].client->client_identity(), clients[1].client->client_identity());
  auto request_of = [&](const One& c, RequestId id) {
    replay::SubmitRequest sr;
    sr.request = id;
    sr.prompt.trace_index = c.trace_index * 10 + static_cast<int64_t>(id);
    sr.prompt.input_tokens = 40;
    sr.max_new_tokens = kMaxNew;
    sr.sampling = id == 4 ? replay::Sampling{false, 0.8, 4} : replay::Sampling{};
    return sr;
  };
  for (One& c : clients) {
    for (RequestId id : ids) ASSERT_TRUE(c.client->Submit(request_of(c, id)).ok());
  }
  auto poll = [&](const std::function<bool()>& done, int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!done() && Clock::now() < deadline) {
      for (One& c : clients) {
        auto events = c.client->Poll(5);
        ASSERT_TRUE(events.ok()) << events.status() << node.Logs();
        for (const replay::TokenEvent& e : *events) {
          EXPECT_TRUE(e.error.empty()) << e.error;
          Generated& g = c.got[e.request];
          g.tokens.insert(g.tokens.end(), e.tokens.begin(), e.tokens.end());
          g.digests.insert(g.digests.end(), e.logits_digests.begin(), e.logits_digests.end());
          if (e.finished) c.finished[e.request] = true;
        }
      }
    }
  };
  auto every = [&](const std::function<bool(const One&, RequestId)>& p) {
    for (const One& c : clients) {
      for (RequestId id : ids) {
        if (!p(c, id)) return false;
      }
    }
    return true;
  };
  auto streaming = [](const One& c, RequestId id) { return c.got.contains(id) && c.got.at(id).tokens.size() >= 10; };
  poll([&] { return every(streaming); }, 30000);
  ASSERT_TRUE(every(streaming)) << node.Logs();
  ASSERT_FALSE(every([](const One& c, RequestId id) { return c.finished.contains(id); }));
  worker.reset();  // SIGKILL mid-decode
  auto restarted = node.StartWorker("workerd-2", "hisparse");
  poll([&] { return every([](const One& c, RequestId id) { return c.finished.contains(id); }); }, 60000);
  auto model = MakePresetModel("glm5-like", 3);
  for (One& c : clients) {
    EXPECT_EQ(c.client->reattaches(), 1);
    for (RequestId id : ids) {
      SCOPED_TRACE("client row " + std::to_string(c.trace_index) + " request " + std::to_string(id));
      ASSERT_TRUE(c.finished[id]) << node.Logs();
      const replay::SubmitRequest sr = request_of(c, id);
      std::vector<model::Token> input;
      for (unsigned char ch : replay::SynthesizePrompt(sr.prompt)) input.push_back(ch);
      const Generated want = sr.sampling.greedy
                                 ? test::Oracle(*model, input, kMaxNew)
                                 : test::Oracle(*model, input, kMaxNew, 0.8f, 1.0f, 4, id);
      EXPECT_EQ(c.got[id].tokens, want.tokens) << "the other client's tokens, or lost / repeated ones";
      EXPECT_EQ(c.got[id].digests, want.digests);
    }
  }
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

TEST(WorkerFence, StoppedWorkerIsFencedAndAfterContinueEndsItsEpochWithoutActingOnStaleGrants) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd");
  auto w = node.StartWorker("workerd-1");
  auto c = StartStreaming(node, 7);
  ASSERT_TRUE(c);
  const auto stopped = Clock::now();
  ASSERT_EQ(w->Signal(SIGSTOP), 0);
  const json fenced = node.WaitGpu0(false, 1);
  const double fence_s = Since(stopped);
  std::printf("SIGSTOP -> GPU 0 fenced in %.3f s (worker timeout 3 s)\n", fence_s);
  ASSERT_FALSE(fenced.is_null()) << node.Logs();
  EXPECT_GE(fence_s, 0.3) << "fenced before any timeout could pass";
  EXPECT_EQ(node.Dhsctl("request 7")["state"], "interrupted");
  ASSERT_EQ(w->Signal(SIGCONT), 0);
  const auto continued = Clock::now();
  const Node::Outcome o = Node::Read(*c, 7, 20000);  // read while it ends: its stream must not overflow
  EXPECT_EQ(w->WaitExit(20000), kExitEpochEnded) << node.Logs();
  std::printf("SIGCONT -> worker exited %d in %.3f s\n", kExitEpochEnded, Since(continued));
  EXPECT_TRUE(o.finished) << "the client was never told" << node.Logs();
  EXPECT_EQ(o.error, wire::ErrorCode::UNAVAILABLE) << o.message;
  EXPECT_NE(o.message.find("epoch ended"), std::string::npos) << o.message;
  EXPECT_EQ(o.end_reason, wire::EndReason::WORKER_EPOCH_ENDED) << "the code clients re-attach on";
  EXPECT_NE(ReadFile(node.Log("workerd-1")).find("exiting with code 75"), std::string::npos) << node.Logs();
  // The Complete of its ended request is not sent (memd dropped the epoch): expected, so no error line says so; the
  // one error line is the exit's.
  const std::string wlog = ReadFile(node.Log("workerd-1"));
  EXPECT_EQ(wlog.find("cannot send Complete"), std::string::npos) << wlog;
  size_t error_lines = 0;
  for (size_t at = wlog.find("[error]"); at != std::string::npos; at = wlog.find("[error]", at + 1)) ++error_lines;
  EXPECT_EQ(error_lines, 1u) << wlog;
  // Its connection to memd stayed up (memd is alive): a stopped worker, not a dead memd. It never says a re-Hello
  // into the grants memd fenced; memd took none.
  EXPECT_EQ(ReadFile(node.Log("workerd-1")).find("re-Hello"), std::string::npos) << node.Logs();
  EXPECT_EQ(ReadFile(node.Log("memd")).find("survived a memd restart"), std::string::npos) << node.Logs();
  // Nothing the stopped worker sent reached memd's state: every message of the fenced worker was refused. What can
  // arrive is a report of work done before its next epoch check: the TokensCommitted it had in flight (one at a time:
  // MemdClient) and the copy reports of the iteration SIGSTOP interrupted, which the worker finishes after SIGCONT
  // before its Poll notices the stall (CI on a loaded machine saw TokensCommitted then HostCopyWritten), and any message
  // queued before the stop that ZeroMQ's I/O thread, stopped with the worker, writes only after SIGCONT (a loaded
  // machine saw a Heartbeat: queued before the stop, or sent by the Poll SIGSTOP interrupted between its epoch check
  // and its heartbeat; memd refuses it like the rest).
  const std::string memd_log = ReadFile(node.Log("memd"));
  const std::string kRefused = " from the fenced worker of GPU 0 refused";
  for (size_t at = memd_log.find(kRefused); at != std::string::npos; at = memd_log.find(kRefused, at + 1)) {
    const size_t begin = memd_log.rfind("memd: ", at) + std::string("memd: ").size();
    const std::string kind = memd_log.substr(begin, at - begin);
    EXPECT_TRUE(kind == "TokensCommitted" || kind == "HostCopyWritten" || kind == "BackupComplete" ||
                kind == "ReadyPublish" || kind == "Heartbeat")
        << kind << " from the fenced worker: not a report of work done before the stop\n" << memd_log;
  }

  auto restarted = node.StartWorker("workerd-2");
  ASSERT_FALSE(node.WaitGpu0(true, 2).is_null()) << node.Logs();
  node.ExpectServesExactly(8, 12);
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// memd dies and never comes back within the worker's --memd-reconnect-ms (1.5 s here): the worker keeps serving and
// tries its re-Hello, then ends its epoch ("no memd took the re-Hello"), its client gets the epoch-end chunk and it
// exits 75. A restarted worker says Hello to the new memd (which adopted the dead one's journal: a later epoch),
// resumes the request and serves exactly.
TEST(WorkerFence, KilledMemdThatNeverComesBackEndsTheWorkersEpochAfterTheReconnectBound) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd-1");
  auto w = node.StartWorker("workerd-1", "adaptive", 200, 1500);
  constexpr RequestId kId = 21;
  auto c = StartStreaming(node, kId);
  ASSERT_TRUE(c);
  const auto killed = Clock::now();
  memd.reset();  // SIGKILL: its segment stays for the next memd of this run directory
  const Node::Outcome o = Node::Read(*c, kId, 20000);  // no token while memd is away, then the epoch-end chunk
  const double ended_s = Since(killed);
  EXPECT_EQ(w->WaitExit(20000), kExitEpochEnded) << node.Logs();
  std::printf("memd SIGKILL -> request ended after %.3f s, worker exited %d after %.3f s (reconnect bound 1.5 s)\n",
              ended_s, kExitEpochEnded, Since(killed));
  EXPECT_GE(ended_s, 1.5) << "the epoch ended before the reconnect bound";
  EXPECT_TRUE(o.finished) << node.Logs();
  EXPECT_EQ(o.error, wire::ErrorCode::UNAVAILABLE) << o.message;
  EXPECT_NE(o.message.find("worker epoch ended: memd connection: memd lost: it died and no memd took the re-Hello "
                           "within 1500 ms"),
            std::string::npos) << o.message;
  EXPECT_EQ(o.end_reason, wire::EndReason::WORKER_EPOCH_ENDED) << "the code clients re-attach on";
  memd = node.StartMemd("memd-2");
  w = node.StartWorker("workerd-2");
  // The new memd adopted the dead one's journal and records: the streaming request is an interrupted request of
  // GPU 0's epoch 1, so the new worker is epoch 2 (and resumes it, no client attached).
  ASSERT_FALSE(node.WaitGpu0(true, 2).is_null()) << node.Logs();
  {  // A client attaches to the resumed request, takes a token and goes away: the worker ends the request.
    auto attached = node.Client();
    ASSERT_TRUE(attached);
    wire::AttachT a;
    a.request = kId;
    a.received = static_cast<uint32_t>(o.got.tokens.size());
    ASSERT_TRUE(attached->Send(EncodeAttach(a, 900 + kId, "replay")).ok());
    // At least one: the tokens the dead epoch held back from its client (memd's record lacks them) come again too.
    EXPECT_GE(Node::Read(*attached, kId, 20000, 1).got.tokens.size(), 1u) << "the adopted request was not resumed";
  }
  node.ExpectServesExactly(kId + 10, 15);
  EXPECT_EQ(w->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

}  // namespace
}  // namespace dhs::test

namespace dhs::test {
namespace {

// A second connection claiming the live worker's routing id (a hand-written ZMTP peer that never answers a PING) must
// not take memd down: with ZMTP heartbeats on memd's socket and router_handover, libzmq 4.3.4 aborted memd here
// (assertion `!_io_error`, stream_engine_base.cpp:331; found by a fresh review). memd's socket has no ZMTP heartbeats
// now; the cut-off worker is fenced by its silence (3 s) and memd keeps serving.
TEST(WorkerFence, ASecondConnectionUnderALiveWorkersIdDoesNotAbortMemd) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd");
  auto worker = node.StartWorker("workerd-1");
  ASSERT_FALSE(node.WaitGpu0(true, 1).is_null()) << node.Logs();
  const int impostor = dhs::testing::RawZmtpPeer(dir.path() + "/memd.sock", "worker/0");
  ASSERT_GE(impostor, 0);
  const json fenced = node.WaitGpu0(false);  // the worker lost its link: fenced by the heartbeat timeout
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // ZMTP heartbeats would have fired by now
  EXPECT_FALSE(memd->Exited()) << "memd exited" << node.Logs();
  EXPECT_FALSE(fenced.is_null()) << node.Logs();
  EXPECT_TRUE(node.Dhsctl("status").is_object()) << node.Logs();
  ::close(impostor);
}

// Speculation memory declared to memd (issue 13) with the real processes, across a memd restart: a worker with
// --speculate synthetic --block 4 declares staging of χ * N * K_max * k * d_KV (χ = 4, N = 2, glm5-like k = 32,
// d_KV = 576: 589,824 bytes) in its Hello, and each admission its slot's share (294,912 bytes in ceil(294,912 / page
// bytes) pages, inside its required pages); dhsctl shows both. memd is SIGKILLed mid-decode and started again: the
// surviving worker's re-Hello carries the totals again and its report the request's share, and the new memd shows the
// same numbers.
TEST(WorkerSpeculationMemory, SharesAreShownByDhsctlAndSurviveAMemdRestart) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  const model::ModelConfig& mc = node.model().config();
  const uint64_t slot_staging = 4ull * 4 * mc.top_k * mc.row_bytes();  // χ * K_max * k * d_KV
  const uint64_t staging_pages = (slot_staging + node.page_bytes() - 1) / node.page_bytes();
  ASSERT_EQ(slot_staging, 294912u);
  auto memd = node.StartMemd("memd-1");
  auto worker = node.StartWorker("workerd", "adaptive", 200, 30000, {"--speculate", "synthetic", "--block", "4"});
  auto c = StartStreaming(node, 3);
  ASSERT_TRUE(c) << node.Logs();
  const auto check = [&](const std::string& when) {
    SCOPED_TRACE(when);
    const json r = node.Dhsctl("request 3");  // node id of client id 3 on GPU 0, epoch 1
    ASSERT_FALSE(r.is_null()) << node.Logs();
    EXPECT_EQ(r["staging_bytes"], slot_staging) << r.dump();
    EXPECT_EQ(r["staging_pages"], staging_pages) << r.dump();
    EXPECT_EQ(r["draft_ring_bytes"], 0) << r.dump();  // synthetic proposals: no drafter, no ring
    EXPECT_GT(r["required_pages"].get<uint64_t>(), staging_pages) << r.dump();
    const json g = node.Gpu0();
    EXPECT_EQ(g["staging_pages"], staging_pages) << g.dump();
    EXPECT_EQ(g["staging_bytes"], slot_staging) << g.dump();
    EXPECT_EQ(g["declared_staging_bytes"], 2 * slot_staging) << g.dump();  // N = 2
    EXPECT_EQ(g["declared_draft_ring_bytes"], 0) << g.dump();
  };
  check("first memd");
  memd.reset();  // SIGKILL mid-decode
  ASSERT_TRUE(node.WaitLog("workerd", "memd's connection closed")) << node.Logs();
  memd = node.StartMemd("memd-2");
  ASSERT_TRUE(node.WaitLog("workerd", "memd took the re-Hello")) << node.Logs();
  ASSERT_FALSE(node.WaitGpu0(true, 1).is_null()) << node.Logs();
  check("after the re-Hello");
  EXPECT_EQ(worker->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// Host-page integrity (issue 22), real processes: SIGKILL a hisparse worker mid-decode; memd fences its GPU and keeps
// the requests' confirmed host copies with their checksums. One byte of one kept page of request 1 (a page wholly
// before its last token) changes in the host pool's shared-memory segment. The restarted worker checks every
// host-backed page against memd's checksum before importing it: that page is recomputed from the record's tokens (one
// mismatch counted, logged, and 16 rows fewer imported than memd kept), and both streams equal the model run alone.
TEST(WorkerFence, AKeptHostPageThatChangedIsRecomputedOnResumeAndTheStreamsStayExact) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl executable";
  Node node(dir.path());
  auto memd = node.StartMemd("memd");
  auto worker = node.StartWorker("workerd-1", "hisparse");
  constexpr uint32_t kMaxNew = 300;
  const std::vector<std::pair<RequestId, uint32_t>> reqs = {{1, 41}, {2, 42}};  // (id, prompt salt), greedy
  auto c1 = node.Client();
  ASSERT_TRUE(c1);
  for (const auto& [id, salt] : reqs) Node::Submit(*c1, id, salt, kMaxNew);
  ClientStreams streams;
  std::map<RequestId, Generated>& got = streams.got;
  std::map<RequestId, bool>& finished = streams.finished;
  streams.Read(*c1, [&] { return got[1].tokens.size() >= 40 && got[2].tokens.size() >= 1; }, 30000);
  ASSERT_GE(got[1].tokens.size(), 40u) << node.Logs();
  worker.reset();  // SIGKILL mid-decode
  streams.Read(*c1, [&] { return c1->disconnects() > 0; }, 10000);
  streams.Read(*c1, [] { return false; }, 200);
  ASSERT_FALSE(finished[1] || finished[2]) << "a request finished before the kill";
  ASSERT_FALSE(node.WaitGpu0(false, 1).is_null()) << "never fenced" << node.Logs();
  std::map<RequestId, std::map<uint32_t, uint32_t>> kept;  // history page -> host page, memd's confirmed copies
  for (const auto& [id, salt] : reqs) {
    const json q = node.Dhsctl("request " + std::to_string(id));
    ASSERT_EQ(q["state"], "interrupted") << q.dump();
    for (const json& c : q["host_copies"]) kept[id][c[0].get<uint32_t>()] = c[1].get<uint32_t>();
  }
  ASSERT_TRUE(kept[1].contains(0)) << "request 1's page 0 has no confirmed copy" << node.Logs();
  {
    std::error_code ec;
    auto seg = HostPoolSegment::Open(memd::PoolSegmentName(std::filesystem::canonical(dir.path(), ec).string()));
    ASSERT_TRUE(seg.ok()) << seg.status();
    absl::StatusOr<uint8_t*> page = (*seg)->PageData(kept[1].at(0));
    ASSERT_TRUE(page.ok()) << page.status();
    (*page)[77] ^= 0x40;  // a payload byte of request 1's history page 0
  }
  auto restarted = node.StartWorker("workerd-2", "hisparse");
  ASSERT_FALSE(node.WaitGpu0(true, 2).is_null()) << node.Logs();
  auto c2 = node.Client();
  ASSERT_TRUE(c2);
  for (const auto& [id, salt] : reqs) {
    wire::AttachT a;
    a.request = id;
    a.received = static_cast<uint32_t>(got[id].tokens.size());
    ASSERT_TRUE(c2->Send(EncodeAttach(a, 100 + id, "replay")).ok());
  }
  streams.Read(*c2, [&] { return finished[1] && finished[2]; }, 60000);
  for (const auto& [id, salt] : reqs) {
    SCOPED_TRACE("request " + std::to_string(id));
    ASSERT_TRUE(finished[id]) << node.Logs();
    const Generated want = node.Oracle(salt, kMaxNew);
    EXPECT_EQ(got[id].tokens, want.tokens) << "lost, repeated or wrong tokens";
    EXPECT_EQ(got[id].digests, want.digests);
  }
  wire::WorkerStatsQueryT q;
  auto reply = c2->Request(EncodeWorkerStatsQuery(q, 500, "replay"), std::chrono::milliseconds(5000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto stats = ReadWorkerStatsReply(*DecodeEnvelope(*reply));
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->requests_resumed, 2u);
  EXPECT_EQ(stats->host_page_mismatches, 1u) << node.Logs();
  EXPECT_GE(stats->host_pages_verified, 2u);
  // Each request's figures from its log line: request 1 imported every kept page before its last row but page 0.
  const std::string log = ReadFile(node.Log("workerd-2"));
  EXPECT_NE(log.find("do not match their checksums"), std::string::npos) << log;
  for (const auto& [id, salt] : reqs) {
    SCOPED_TRACE("request " + std::to_string(id));
    const std::string key = "(client " + std::to_string(id) + ") resumed: first new token after ";
    const size_t at = log.find(key);
    ASSERT_NE(at, std::string::npos) << log;
    unsigned long long us = 0, imported = 0, recomputed = 0;
    ASSERT_EQ(std::sscanf(log.c_str() + at + key.size(), "%llu us (%llu rows imported from host, %llu rows recomputed",
                          &us, &imported, &recomputed),
              3);
    const uint64_t n = imported + recomputed;
    uint64_t want = 0;
    for (const auto& [j, hp] : kept[id]) want += j < (n - 1) / kPageRows && !(id == 1 && j == 0) ? kPageRows : 0;
    EXPECT_EQ(imported, want);
  }
  for (int i = 0; i < 500 && node.Dhsctl("status")["host"]["allocated"] != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(node.Dhsctl("status")["host"]["allocated"], 0) << "host pages left behind" << node.Logs();
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

}  // namespace
}  // namespace dhs::test
