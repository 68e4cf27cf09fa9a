// tests/workerd/worker_memd_process_test.cc: the real `memd` and `workerd` executables over ipc:// in a private run
// directory, one request per mode (resident, hisparse, adaptive): the client's tokens and logits digests equal the
// model run alone, the worker's log holds no error from the conversation, both processes exit 0 on SIGTERM.
// Processes are started with posix_spawn (fork + exec at once; their stderr goes to files in the run directory, printed
// on failure) and killed by pid at teardown.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <netinet/in.h>
#include <sys/socket.h>

#include "common/curve_keys.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/workerd/worker_test_util.h"
#include "nlohmann/json.hpp"
#include "zmq.hpp"

namespace dhs::test {
namespace {

using dhs::testing::ChildProcess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class RealMemd : public ::testing::TestWithParam<std::string> {};

TEST_P(RealMemd, WorkerServesOneRequestPerMode) {
  const char* memd_bin = std::getenv("MEMD");
  const char* workerd_bin = std::getenv("WORKERD");
  ASSERT_NE(workerd_bin, nullptr);
  if (memd_bin == nullptr || !std::filesystem::exists(memd_bin)) GTEST_SKIP() << "no memd executable";
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  constexpr uint32_t kPageRows = 16;
  auto model = MakePresetModel("glm5-like", 3);
  const uint64_t page_bytes = uint64_t{kPageRows} * model->config().row_bytes() * model->config().n_sources();
  const uint64_t host_page_bytes = HostPageBytes(model->config(), kPageRows);  // memd's pool pages
  const std::string memd_log = dir.path() + "/memd.log", worker_log = dir.path() + "/workerd.log";
  ChildProcess memd({memd_bin, "--run-dir", dir.path(), "--page-bytes", std::to_string(host_page_bytes), "--host-pool-pages",
              "64", "--log-level", "warn"},
             memd_log);
  ASSERT_TRUE(memd.ok());
  ChildProcess worker({workerd_bin, "--run-dir", dir.path(), "--gpu", "0", "--mode", GetParam(), "--preset", "glm5-like",
                "--seed", "3", "--page-rows", std::to_string(kPageRows), "--tail-rows", "32", "--slots", "2",
                "--hbm-budget", std::to_string(40 * page_bytes), "--log-level", "warn"},
               worker_log);
  ASSERT_TRUE(worker.ok());
  auto client = DealerClient::Connect(IpcEndpoint(dir.path(), "worker-0"));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitPeerConnected(true, std::chrono::milliseconds(10000)))
      << "workerd did not come up\nmemd: " << ReadFile(memd_log) << "\nworkerd: " << ReadFile(worker_log);

  const std::vector<uint8_t> prompt = Prompt(70, 4);
  const uint32_t max_new = 7;
  wire::SubmitRequestT s;
  s.request = 1001;
  s.prompt = prompt;
  s.max_new_tokens = max_new;
  ASSERT_TRUE((*client)->Send(EncodeSubmitRequest(s, 1, "replay")).ok());
  Generated got;
  bool finished = false;
  std::string error;
  for (int i = 0; i < 3000 && !finished; ++i) {
    auto r = (*client)->Receive(std::chrono::milliseconds(5));
    if (!r.ok()) {
      if (worker.Exited() || memd.Exited()) break;
      continue;
    }
    auto m = DecodeEnvelope(*r);
    ASSERT_TRUE(m.ok());
    if (m->type == wire::Body::SubmitAccepted) continue;
    if (m->type == wire::Body::ErrorReply) {
      error = ReadErrorReply(*m)->message;
      break;
    }
    ASSERT_EQ(m->type, wire::Body::TokenChunk);
    auto chunk = ReadTokenChunk(*m);
    if (chunk->error != wire::ErrorCode::OK) error = chunk->error_message;
    for (uint8_t t : chunk->tokens) got.tokens.push_back(t);
    for (uint64_t d : chunk->logits_digests) got.digests.push_back(d);
    finished = chunk->finished;
  }
  const std::string logs = "\nmemd log:\n" + ReadFile(memd_log) + "\nworkerd log:\n" + ReadFile(worker_log);
  ASSERT_TRUE(finished) << "no finished chunk" << logs;
  EXPECT_EQ(error, "") << logs;
  const Generated want = Oracle(*model, std::vector<model::Token>(prompt.begin(), prompt.end()), max_new);
  EXPECT_EQ(got.tokens, want.tokens) << logs;
  EXPECT_EQ(got.digests, want.digests);
  // What the worker did with memd's grant: adaptive keeps imported pages on GPU, hisparse backs every page up.
  ASSERT_TRUE((*client)->Send(EncodeWorkerStatsQuery(wire::WorkerStatsQueryT(), 2, "replay")).ok());
  auto reply = (*client)->Receive(std::chrono::milliseconds(5000));
  ASSERT_TRUE(reply.ok()) << reply.status();
  auto rm = DecodeEnvelope(*reply);
  ASSERT_TRUE(rm.ok());
  auto stats = ReadWorkerStatsReply(*rm);
  ASSERT_TRUE(stats.ok()) << stats.status();
  const uint64_t complete = (prompt.size() + max_new - 1) / kPageRows;  // 76 rows -> 4 pages
  std::printf("mode %s: pages kept %llu, backed up %llu, census direct %llu hot %llu host %llu\n", GetParam().c_str(),
              static_cast<unsigned long long>(stats->pages_kept), static_cast<unsigned long long>(stats->pages_backed_up),
              static_cast<unsigned long long>(stats->census_direct), static_cast<unsigned long long>(stats->census_hot),
              static_cast<unsigned long long>(stats->census_host));
  if (GetParam() == "adaptive") {
    EXPECT_GT(stats->pages_kept, 0u);
    EXPECT_EQ(stats->pages_kept + stats->pages_backed_up, complete);
  } else if (GetParam() == "hisparse") {
    EXPECT_EQ(stats->pages_kept, 0u);
    EXPECT_EQ(stats->pages_backed_up, complete);
  }
  EXPECT_EQ(worker.Terminate(), 0) << logs;
  EXPECT_EQ(memd.Terminate(), 0) << logs;
  const std::string wlog = ReadFile(worker_log);
  EXPECT_EQ(wlog.find("[error]"), std::string::npos) << logs;
  EXPECT_EQ(wlog.find("answered message"), std::string::npos) << logs;  // memd refused one of our messages
}

INSTANTIATE_TEST_SUITE_P(Modes, RealMemd, ::testing::Values("resident", "hisparse", "adaptive"));

// A real node for the edge cases of issue 12: memd and the workerd of `gpus`, glm5-like, in a private run directory.
class RealNode {
 public:
  static constexpr uint32_t kPageRows = 16;
  explicit RealNode(const std::string& run_dir) : run_dir_(run_dir), model_(MakePresetModel("glm5-like", 3)) {
    page_bytes_ = uint64_t{kPageRows} * model_->config().row_bytes() * model_->config().n_sources();
  }
  bool Available() const {
    const char* m = std::getenv("MEMD");
    return m != nullptr && std::getenv("WORKERD") != nullptr && std::filesystem::exists(m);
  }
  std::vector<std::string> MemdArgs(uint32_t host_pool_pages = 64) const {
    return {std::getenv("MEMD"), "--run-dir", run_dir_, "--page-bytes",
            std::to_string(HostPageBytes(model_->config(), kPageRows)),
            "--host-pool-pages", std::to_string(host_pool_pages), "--log-level", "warn"};
  }
  std::vector<std::string> WorkerArgs(GpuId gpu) const {
    return {std::getenv("WORKERD"), "--run-dir", run_dir_, "--gpu", std::to_string(gpu), "--mode", "adaptive",
            "--preset", "glm5-like", "--seed", "3", "--page-rows", std::to_string(kPageRows), "--tail-rows", "32",
            "--slots", "2", "--hbm-budget", std::to_string(40 * page_bytes_), "--log-level", "warn"};
  }
  std::string Log(const std::string& name) const { return run_dir_ + "/" + name + ".log"; }
  std::string Logs() const {
    std::string out;
    for (const auto& e : std::filesystem::directory_iterator(run_dir_)) {
      if (e.path().extension() == ".log") out += "\n" + e.path().string() + ":\n" + ReadFile(e.path().string());
    }
    return out;
  }
  // A client of the worker of `gpu`, once its serving socket accepts.
  std::unique_ptr<DealerClient> Client(GpuId gpu) {
    auto c = DealerClient::Connect(IpcEndpoint(run_dir_, "worker-" + std::to_string(gpu)));
    EXPECT_TRUE(c.ok());
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->WaitPeerConnected(true, std::chrono::milliseconds(10000))) << "no worker " << gpu << Logs();
    return std::move(*c);
  }
  static void Submit(DealerClient& c, RequestId id, uint32_t salt, uint32_t max_new = 4) {
    wire::SubmitRequestT s;
    s.request = id;
    s.prompt = Prompt(40, salt);
    s.max_new_tokens = max_new;
    ASSERT_TRUE(c.Send(EncodeSubmitRequest(s, id + 1, "replay")).ok());
  }
  // Reads `c`'s replies until every request of `ids` finished (their chunks interleave); returns the errors ("" =
  // none): an ErrorReply, an error chunk, a chunk of an id not asked for, or "no finish".
  static std::string WaitFinished(DealerClient& c, std::set<RequestId> ids) {
    std::string errors;
    for (int i = 0; i < 2000 && !ids.empty(); ++i) {
      auto r = c.Receive(std::chrono::milliseconds(10));
      if (!r.ok()) continue;
      auto m = DecodeEnvelope(*r);
      if (!m.ok()) return "undecodable reply";
      if (m->type == wire::Body::ErrorReply) errors += ReadErrorReply(*m)->message + "; ";
      if (m->type != wire::Body::TokenChunk) continue;
      auto chunk = ReadTokenChunk(*m);
      if (!ids.count(chunk->request)) errors += "a chunk of request " + std::to_string(chunk->request) + "; ";
      if (chunk->error != wire::ErrorCode::OK) errors += chunk->error_message + "; ";
      if (chunk->finished) ids.erase(chunk->request);
    }
    return ids.empty() ? errors : errors + "no finish";
  }

 private:
  std::string run_dir_;
  std::unique_ptr<model::Model> model_;
  uint64_t page_bytes_ = 0;
};

// Request ids are the client's (issue 12): clients of two workers (GPU 0, GPU 1) submit the same ids at once, memd
// sees node ids (gpu << 48 | n) and every request is served; an id of 2^64-1 (memd's "no owner") is one like any other.
TEST(RealNodeEdges, ClientsOfTwoWorkersUseTheSameIdsAtOnce) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(), node.Log("memd"));
  ChildProcess w0(node.WorkerArgs(0), node.Log("workerd0"));
  ChildProcess w1(node.WorkerArgs(1), node.Log("workerd1"));
  auto c0 = node.Client(0), c1 = node.Client(1);
  ASSERT_TRUE(c0 && c1);
  const std::vector<RequestId> ids = {1, 2, ~RequestId{0}};
  for (RequestId id : ids) {
    RealNode::Submit(*c0, id, 1);
    RealNode::Submit(*c1, id, 2);
  }
  EXPECT_EQ(RealNode::WaitFinished(*c0, {ids.begin(), ids.end()}), "") << "GPU 0" << node.Logs();
  EXPECT_EQ(RealNode::WaitFinished(*c1, {ids.begin(), ids.end()}), "") << "GPU 1" << node.Logs();
  EXPECT_FALSE(memd.Exited()) << node.Logs();
  EXPECT_EQ(w0.Terminate(), 0);
  EXPECT_EQ(w1.Terminate(), 0);
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
}

// A second workerd for a GPU whose worker is live fails before it says Hello (its serving socket is taken), exits 1
// naming the reason, and the live worker keeps its link to memd: its requests are still served. A worker restarted
// after a crash (its socket file stale) registers again as before.
TEST(RealNodeEdges, SecondWorkerForALiveGpuIsRefusedAndTheFirstKeepsServing) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(), node.Log("memd"));
  auto first = std::make_unique<ChildProcess>(node.WorkerArgs(0), node.Log("workerd-first"));
  auto c = node.Client(0);
  ASSERT_TRUE(c);
  ChildProcess second(node.WorkerArgs(0), node.Log("workerd-second"));
  EXPECT_EQ(second.WaitExit(20000), 1) << node.Logs();
  EXPECT_NE(ReadFile(node.Log("workerd-second")).find("a worker for this GPU is running"), std::string::npos)
      << node.Logs();
  RealNode::Submit(*c, 7, 3);
  EXPECT_EQ(RealNode::WaitFinished(*c, {7}), "") << node.Logs();
  // A crash (SIGKILL) leaves a stale socket file; the restarted worker takes over the GPU and serves.
  first.reset();
  c.reset();
  ChildProcess restarted(node.WorkerArgs(0), node.Log("workerd-restarted"));
  auto c2 = node.Client(0);
  ASSERT_TRUE(c2);
  RealNode::Submit(*c2, 8, 4);
  EXPECT_EQ(RealNode::WaitFinished(*c2, {8}), "") << node.Logs();
  EXPECT_EQ(restarted.Terminate(), 0);
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
}

// Every socket a node creates is checked at start: a run directory short enough for memd.sock but not for
// worker-<gpu>.sock (sun_path holds 107 bytes) is refused by memd (it checks the longest worker socket: a bad
// --run-dir, exit 2, docs/operations.md) and by the worker (exit 1), each with a message naming the path and its
// length; nothing registers.
TEST(RealNodeEdges, RunDirectoryTooLongForTheWorkerSocketIsRefusedAtStart) {
  dhs::testing::ScopedRunDir base;
  ASSERT_TRUE(MakeRunDir(base.path()).ok());
  std::string run_dir = base.path() + "/";
  run_dir += std::string(95 - run_dir.size(), 'r');  // 95 bytes: memd.sock fits (105), worker-0.sock does not (109)
  ASSERT_EQ(run_dir.size(), 95u);
  ASSERT_TRUE(MakeRunDir(run_dir).ok());
  RealNode node(run_dir);
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  const std::string memd_log = base.path() + "/memd.log", worker_log = base.path() + "/workerd.log";
  ChildProcess memd(node.MemdArgs(), memd_log);
  EXPECT_EQ(memd.WaitExit(20000), 2) << ReadFile(memd_log);
  EXPECT_NE(ReadFile(memd_log).find("worker-65535.sock is 113 bytes"), std::string::npos) << ReadFile(memd_log);
  EXPECT_FALSE(std::filesystem::exists(run_dir + "/memd.sock"));
  ChildProcess worker(node.WorkerArgs(0), worker_log);
  EXPECT_EQ(worker.WaitExit(20000), 1) << ReadFile(worker_log);
  EXPECT_NE(ReadFile(worker_log).find("worker-0.sock is 109 bytes"), std::string::npos) << ReadFile(worker_log);
}

// workerd's command line (docs/operations.md): a non-integer value of an integer flag exits 2 naming the flag and its
// range (CLI::Range called "1e3" out of range); a --run-dir that does not exist exits 2 saying so (it used to fail as
// a bind error of the serving socket, exit 1). Nothing is started: no memd is needed.
TEST(RealNodeEdges, BadWorkerCommandLinesExit2NamingTheFlag) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--memd-reconnect-ms", "1e3"}, "--memd-reconnect-ms: must be an integer in [100, 3600000], got '1e3'"},
      {{"--memd-timeout-ms", "2000.5"}, "--memd-timeout-ms: must be an integer in [100, 3600000], got '2000.5'"},
      {{"--connect-timeout-ms", "0"}, "--connect-timeout-ms: must be an integer in [1, 3600000], got '0'"},
      {{"--metrics-address", "127.0.0.1:99999"}, "metrics address '127.0.0.1:99999': bad port"},
      {{"--metrics-address", "nonsense"}, "metrics address 'nonsense' is not HOST:PORT"},
      {{"--slots", "1.5"}, "--slots: must be an integer in [1, 4096], got '1.5'"},
      {{"--page-rows", "1e2"}, "--page-rows: must be an integer in [1, 1048576], got '1e2'"},
      {{"--gpu", "abc"}, "--gpu: must be an integer in [0, 65535], got 'abc'"},
      {{"--hbm-budget", "1e9"}, "--hbm-budget: must be an integer in [1, 18446744073709551615], got '1e9'"},
      {{"--seed", "-1"}, "--seed: must be an integer in [0, 18446744073709551615], got '-1'"},
      {{"--submit-queue", "0x10"}, "--submit-queue: must be an integer in [1, 1048576], got '0x10'"},
      {{"--run-dir", dir.path() + "/missing"}, "run directory " + dir.path() + "/missing does not exist"},
      // The geometry rules (issue 22, ValidateGeometry): glm5-like, p = 16, T = 32, so a chunk of 18 overflows the tail.
      {{"--hot-rows", "4096", "--prefill-chunk", "18"}, "worker: prefill chunk C = 18 > T - p + 1 = 32 - 16 + 1 = 17"},
  };
  for (const auto& [extra, message] : bad) {
    std::vector<std::string> args = node.WorkerArgs(0);
    if (extra[0] == "--run-dir") {  // given once: replaces the node's
      *(std::find(args.begin(), args.end(), "--run-dir") + 1) = extra[1];
    } else {
      args.insert(args.end(), extra.begin(), extra.end());  // the last value of a repeated flag is the one checked
    }
    const std::string log = dir.path() + "/workerd.log";
    ChildProcess worker(args, log);
    EXPECT_EQ(worker.WaitExit(20000), 2) << extra[0] << ": " << ReadFile(log);
    EXPECT_NE(ReadFile(log).find(message), std::string::npos) << extra[0] << ": " << ReadFile(log);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/missing"));
}

// A run directory this user may not reach: the worker fails at once with "permission denied" (not after waiting 10 s
// for a HelloReply). Root passes every permission check, so the worker runs as nobody (setpriv) when the test is root.
TEST(RealNodeEdges, WorkerOnARunDirectoryItMayNotReadFailsAtOnce) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());  // mode 0700, ours
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(), node.Log("memd"));
  for (int i = 0; i < 500 && !std::filesystem::exists(dir.path() + "/memd.sock"); ++i) ::poll(nullptr, 0, 10);
  std::vector<std::string> args = node.WorkerArgs(0);
  if (::geteuid() == 0) {
    if (!std::filesystem::exists("/usr/bin/setpriv")) GTEST_SKIP() << "root without setpriv";
    args.insert(args.begin(), {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"});
  } else {
    ASSERT_EQ(::chmod(dir.path().c_str(), 0), 0);
  }
  dhs::testing::ScopedRunDir logs;
  ASSERT_TRUE(MakeRunDir(logs.path()).ok());
  ASSERT_EQ(::chmod(logs.path().c_str(), 0777), 0);  // the log of a worker run as nobody
  const std::string worker_log = logs.path() + "/workerd.log";
  const auto start = std::chrono::steady_clock::now();
  ChildProcess worker(args, worker_log);
  EXPECT_EQ(worker.WaitExit(20000), 1) << ReadFile(worker_log);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << ReadFile(worker_log);
  EXPECT_NE(ReadFile(worker_log).find("permission denied"), std::string::npos) << ReadFile(worker_log);
  if (::geteuid() != 0) ::chmod(dir.path().c_str(), 0700);
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
}

// Back-pressure (issue 12): requests beyond the worker's slots wait for a slot (memd queues the admission, as one
// short of pages) instead of being refused, and are served in arrival order. 5 requests at once on a worker with 2
// slots: all are served without error; a request beyond the slots starts (first token) only after an earlier one
// finished, and the waiting ones start in the order they were submitted.
TEST(RealNodeEdges, RequestsBeyondTheSlotsWaitForASlotAndAreServedInArrivalOrder) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(), node.Log("memd"));
  ChildProcess worker(node.WorkerArgs(0), node.Log("workerd"));  // --slots 2
  auto c = node.Client(0);
  ASSERT_TRUE(c);
  constexpr int kRequests = 5;
  for (RequestId id = 1; id <= kRequests; ++id) RealNode::Submit(*c, id, static_cast<uint32_t>(id));
  // Event numbers (the order chunks arrived in) of each request's first token and finish.
  std::map<RequestId, int> first, finish;
  std::string errors;
  int event = 0;
  for (int i = 0; i < 3000 && static_cast<int>(finish.size()) < kRequests; ++i) {
    auto r = c->Receive(std::chrono::milliseconds(10));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    ASSERT_TRUE(m.ok());
    if (m->type == wire::Body::ErrorReply) errors += ReadErrorReply(*m)->message + "; ";
    if (m->type != wire::Body::TokenChunk) continue;
    auto chunk = ReadTokenChunk(*m);
    ++event;
    if (chunk->error != wire::ErrorCode::OK) errors += chunk->error_message + "; ";
    if (!chunk->tokens.empty()) first.emplace(chunk->request, event);
    if (chunk->finished) finish.emplace(chunk->request, event);
  }
  ASSERT_EQ(errors, "") << node.Logs();
  ASSERT_EQ(finish.size(), static_cast<size_t>(kRequests)) << node.Logs();
  ASSERT_EQ(first.size(), static_cast<size_t>(kRequests)) << node.Logs();
  std::vector<int> finishes;
  for (const auto& [id, e] : finish) finishes.push_back(e);
  std::sort(finishes.begin(), finishes.end());
  // Request k (k > 2) needs a slot some earlier request gave back: its first token comes after the (k-2)-th finish.
  for (RequestId id = 3; id <= kRequests; ++id) {
    EXPECT_GT(first[id], finishes[id - 3]) << "request " << id << " started before a slot was free" << node.Logs();
  }
  for (RequestId id = 2; id <= kRequests; ++id) {
    EXPECT_LT(first[id - 1], first[id]) << "request " << id << " started before request " << id - 1;
  }
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
  EXPECT_EQ(ReadFile(node.Log("workerd")).find("answered message"), std::string::npos) << node.Logs();
}

// memd's view of one request (IntrospectQuery Request, as `dhsctl request ID`): true when memd knows it.
bool MemdKnowsRequest(const std::string& run_dir, RequestId id) {
  DealerClient::Options options;
  options.identity = "dhsctl/test";
  auto client = DealerClient::Connect(IpcEndpoint(run_dir, "memd"), options);
  EXPECT_TRUE(client.ok());
  if (!client.ok()) return false;
  wire::IntrospectQueryT q;
  q.what = wire::IntrospectWhat::Request;
  q.request = id;
  q.format = wire::IntrospectFormat::Json;
  auto bytes = (*client)->Request(EncodeIntrospectQuery(q, 1, "dhsctl"), std::chrono::milliseconds(5000));
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return false;
  auto m = DecodeEnvelope(*bytes);
  EXPECT_TRUE(m.ok());
  if (!m.ok()) return false;
  if (m->type == wire::Body::ErrorReply) {
    EXPECT_TRUE(absl::IsNotFound(ReadErrorStatus(*m))) << ReadErrorStatus(*m);
    return false;
  }
  return m->type == wire::Body::IntrospectReply;
}

// A worker stopped with SIGTERM while serving (issue 12) tells its clients and memd before it exits: every unfinished
// request (decoding, or waiting for a slot) gets a final chunk with UNAVAILABLE "worker stopping" at once (not after
// the client's 120 s), and memd no longer holds any of them (their Complete came).
TEST(RealNodeEdges, AWorkerStoppedWhileServingEndsItsRequestsWithClientsAndMemd) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(), node.Log("memd"));
  ChildProcess worker(node.WorkerArgs(0), node.Log("workerd"));  // --slots 2
  auto c = node.Client(0);
  ASSERT_TRUE(c);
  const std::vector<RequestId> ids = {5, 6, 7};  // 7 waits for a slot (or pages)
  for (RequestId id : ids) RealNode::Submit(*c, id, static_cast<uint32_t>(id), /*max_new=*/400);
  bool streaming = false;
  std::set<RequestId> finished_early;
  for (int i = 0; i < 2000 && !streaming; ++i) {
    auto r = c->Receive(std::chrono::milliseconds(10));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    ASSERT_TRUE(m.ok());
    if (m->type != wire::Body::TokenChunk) continue;
    auto chunk = ReadTokenChunk(*m);
    ASSERT_EQ(chunk->error, wire::ErrorCode::OK) << chunk->error_message << node.Logs();
    if (chunk->finished) finished_early.insert(chunk->request);
    streaming = chunk->request == 5 && !chunk->tokens.empty();
  }
  ASSERT_TRUE(streaming) << "request 5 never streamed" << node.Logs();
  ASSERT_TRUE(MemdKnowsRequest(dir.path(), 5)) << node.Logs();  // node id of client id 5 on GPU 0: 5
  const auto stop = std::chrono::steady_clock::now();
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_LT(std::chrono::steady_clock::now() - stop, std::chrono::seconds(5)) << node.Logs();
  // The final chunks were sent before the worker exited; they are in our socket now.
  std::map<RequestId, std::string> ended;  // id -> error message ("" = finished normally)
  for (RequestId id : finished_early) ended[id] = "";
  for (int i = 0; i < 500 && ended.size() < ids.size(); ++i) {
    auto r = c->Receive(std::chrono::milliseconds(10));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    ASSERT_TRUE(m.ok());
    if (m->type != wire::Body::TokenChunk) continue;
    auto chunk = ReadTokenChunk(*m);
    if (!chunk->finished) continue;
    if (chunk->error != wire::ErrorCode::OK) {
      EXPECT_EQ(chunk->error, wire::ErrorCode::UNAVAILABLE) << chunk->error_message;
    }
    ended[chunk->request] = chunk->error_message;
  }
  ASSERT_EQ(ended.size(), ids.size()) << "a request was left without its final chunk" << node.Logs();
  EXPECT_EQ(ended[5], "worker stopping") << node.Logs();
  EXPECT_EQ(ended[7], "worker stopping") << node.Logs();
  for (RequestId id : ids) EXPECT_FALSE(MemdKnowsRequest(dir.path(), id)) << "memd still holds " << id << node.Logs();
  EXPECT_FALSE(memd.Exited()) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
  EXPECT_EQ(ReadFile(node.Log("workerd")).find("answered message"), std::string::npos) << node.Logs();
}

// A raw ZeroMQ DEALER on a worker's socket, for clients that misbehave: `rcvhwm` messages at most queued on our side
// (1: a client that stops reading fills the worker's queue at once) and a small kernel receive buffer.
class RawClient {
 public:
  RawClient(const std::string& run_dir, GpuId gpu, int rcvhwm) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::rcvhwm, rcvhwm);
    socket_.set(zmq::sockopt::rcvbuf, 4096);
    socket_.connect(IpcEndpoint(run_dir, "worker-" + std::to_string(gpu)));
  }
  void Send(const std::string& bytes) { socket_.send(zmq::buffer(bytes), zmq::send_flags::none); }
  // The next message within `timeout_ms`, or nullopt.
  std::optional<Message> Receive(int timeout_ms, std::string* keep) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(timeout_ms)) == 0) return std::nullopt;
    zmq::message_t m;
    if (!socket_.recv(m, zmq::recv_flags::dontwait)) return std::nullopt;
    *keep = m.to_string();
    auto decoded = DecodeEnvelope(*keep);
    EXPECT_TRUE(decoded.ok()) << decoded.status();
    if (!decoded.ok()) return std::nullopt;
    return *decoded;
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

wire::WorkerStatsReplyT WorkerStats(DealerClient& c) {
  auto bytes = c.Request(EncodeWorkerStatsQuery(wire::WorkerStatsQueryT{}, 99999, "test"), std::chrono::seconds(10));
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return {};
  auto m = DecodeEnvelope(*bytes);
  EXPECT_TRUE(m.ok());
  if (!m.ok() || m->type != wire::Body::WorkerStatsReply) return {};
  return *ReadWorkerStatsReply(*m);
}

// Back-pressure (issue 12): a client that stops reading while its request streams 6000 tokens gets bounded buffering
// (--client-buffer-bytes) and then an explicit failure of that request: memd releases it (its pages return) while it
// still streams, and, once the client reads again, it receives every token the worker buffered, in order, then a final
// chunk with RESOURCE_EXHAUSTED naming that count. Meanwhile a client that reads gets every token and its final chunk.
TEST(RealNodeEdges, AClientThatStopsReadingHasItsRequestFailedExplicitlyAndOthersAreServed) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(/*host_pool_pages=*/1024), node.Log("memd"));
  std::vector<std::string> args = node.WorkerArgs(0);
  for (const char* a : {"--client-buffer-bytes", "65536", "--client-buffer-total-bytes", "1048576"}) args.push_back(a);
  ChildProcess worker(args, node.Log("workerd"));
  auto reader = node.Client(0);
  ASSERT_TRUE(reader);
  RawClient slow(dir.path(), 0, /*rcvhwm=*/1);
  constexpr uint32_t kLong = 6000;
  wire::SubmitRequestT s;
  s.request = 1;
  s.prompt = Prompt(40, 1);
  s.max_new_tokens = kLong;
  slow.Send(EncodeSubmitRequest(s, 2, "slow"));
  // The slow client reads nothing. memd forgets request 1 once the worker failed it (Complete: its pages returned).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool known = false;
  while (std::chrono::steady_clock::now() < deadline && !(known && !MemdKnowsRequest(dir.path(), 1))) {
    known = known || MemdKnowsRequest(dir.path(), 1);
    ::poll(nullptr, 0, 50);
  }
  ASSERT_TRUE(known) << "request 1 never reached memd" << node.Logs();
  ASSERT_FALSE(MemdKnowsRequest(dir.path(), 1)) << "the slow client's request was never failed" << node.Logs();
  // Another client reads normally: every token, then its final chunk, no error.
  RealNode::Submit(*reader, 2, 2, /*max_new=*/300);
  EXPECT_EQ(RealNode::WaitFinished(*reader, {2}), "") << node.Logs();
  const wire::WorkerStatsReplyT stats = WorkerStats(*reader);
  EXPECT_EQ(stats.client_streams_refused, 1u);
  EXPECT_EQ(stats.failed_requests, 1u);
  EXPECT_LE(stats.client_queued_peak_bytes, 65536u + 1024u) << "buffered beyond the limit (+ one final chunk)";
  EXPECT_GT(stats.client_queued_bytes, 0u) << "the slow client's replies should still wait";
  // The slow client reads again: SubmitAccepted, tokens with no gap, then the failure.
  std::string keep;
  uint64_t tokens = 0;
  std::optional<wire::TokenChunkT> last;
  bool accepted = false;
  while (!last) {
    std::optional<Message> m = slow.Receive(10000, &keep);
    ASSERT_TRUE(m.has_value()) << "the slow client's stream ended without a final chunk after " << tokens << node.Logs();
    if (m->type == wire::Body::SubmitAccepted) accepted = true;
    if (m->type != wire::Body::TokenChunk) continue;
    auto chunk = ReadTokenChunk(*m);
    ASSERT_TRUE(chunk.ok());
    tokens += chunk->tokens.size();
    if (chunk->finished) last = *chunk;
  }
  EXPECT_TRUE(accepted);
  EXPECT_EQ(last->error, wire::ErrorCode::RESOURCE_EXHAUSTED) << last->error_message;
  EXPECT_LT(tokens, kLong);
  EXPECT_NE(last->error_message.find("failed after " + std::to_string(tokens) + " tokens: client not reading"),
            std::string::npos) << last->error_message << " (received " << tokens << ")";
  EXPECT_EQ(WorkerStats(*reader).client_queued_bytes, 0u);
  std::printf("slow client: %llu of %u tokens delivered before the failure, reply buffer peak %llu bytes\n",
              static_cast<unsigned long long>(tokens), kLong,
              static_cast<unsigned long long>(stats.client_queued_peak_bytes));
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
}

// A client that goes away while its request streams (its socket closes): the worker's next chunk finds no route
// (ZMQ_ROUTER_MANDATORY), the request ends and memd releases it, instead of the worker generating every token for no one.
TEST(RealNodeEdges, TheRequestOfAClientThatWentAwayEndsAndItsPagesReturn) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(/*host_pool_pages=*/1024), node.Log("memd"));
  ChildProcess worker(node.WorkerArgs(0), node.Log("workerd"));
  auto reader = node.Client(0);
  ASSERT_TRUE(reader);
  auto client = std::make_unique<RawClient>(dir.path(), 0, /*rcvhwm=*/1000);
  wire::SubmitRequestT s;
  s.request = 3;
  s.prompt = Prompt(40, 3);
  s.max_new_tokens = 6000;
  client->Send(EncodeSubmitRequest(s, 1, "leaver"));
  std::string keep;
  bool streaming = false;
  for (int i = 0; i < 200 && !streaming; ++i) {
    std::optional<Message> m = client->Receive(50, &keep);
    streaming = m && m->type == wire::Body::TokenChunk;
  }
  ASSERT_TRUE(streaming) << node.Logs();
  client.reset();  // the client goes away mid-stream
  bool released = false;
  for (int i = 0; i < 600 && !released; ++i) {
    released = !MemdKnowsRequest(dir.path(), 3);
    if (!released) ::poll(nullptr, 0, 50);
  }
  EXPECT_TRUE(released) << "memd still holds the request of a client that went away" << node.Logs();
  const wire::WorkerStatsReplyT stats = WorkerStats(*reader);
  EXPECT_EQ(stats.failed_requests, 1u);
  EXPECT_LT(stats.tokens_generated, 6000u);
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
}

// A flood of submissions (issue 12) from a raw socket: with --submit-queue 4 every submit is answered once, either
// SubmitAccepted (then served to its final chunk) or RESOURCE_EXHAUSTED "submit queue full (4)"; the requests waiting
// for a grant never exceed 4 (the worker's gauge), and the worker serves a normal client afterwards.
TEST(RealNodeEdges, AFloodOfSubmitsGetsErrorRepliesFromABoundedQueue) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(), node.Log("memd"));
  std::vector<std::string> args = node.WorkerArgs(0);
  for (const char* a : {"--submit-queue", "4"}) args.push_back(a);
  ChildProcess worker(args, node.Log("workerd"));
  auto reader = node.Client(0);
  ASSERT_TRUE(reader);
  RawClient flood(dir.path(), 0, /*rcvhwm=*/1000);
  constexpr int kSubmits = 3000;
  for (int i = 1; i <= kSubmits; ++i) {
    wire::SubmitRequestT s;
    s.request = static_cast<RequestId>(i);
    s.prompt = Prompt(20, static_cast<uint32_t>(i));
    s.max_new_tokens = 2;
    flood.Send(EncodeSubmitRequest(s, static_cast<uint64_t>(i), "flood"));
  }
  std::set<uint64_t> answered;  // sequences answered by SubmitAccepted or ErrorReply
  std::set<RequestId> accepted, finished;
  int refused = 0;
  std::string errors, keep;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while ((answered.size() < kSubmits || finished.size() < accepted.size()) &&
         std::chrono::steady_clock::now() < deadline) {
    std::optional<Message> m = flood.Receive(100, &keep);
    if (!m) continue;
    if (m->type == wire::Body::SubmitAccepted || m->type == wire::Body::ErrorReply) {
      EXPECT_TRUE(answered.insert(m->sequence).second) << "sequence " << m->sequence << " answered twice";
    }
    if (m->type == wire::Body::SubmitAccepted) accepted.insert(ReadSubmitAccepted(*m)->request);
    if (m->type == wire::Body::ErrorReply) {
      auto e = ReadErrorReply(*m);
      ++refused;
      if (e->code != wire::ErrorCode::RESOURCE_EXHAUSTED || e->message.find("submit queue full (4)") == std::string::npos) {
        errors += e->message + "; ";
      }
    }
    if (m->type == wire::Body::TokenChunk) {
      auto c = ReadTokenChunk(*m);
      if (c->error != wire::ErrorCode::OK) errors += c->error_message + "; ";
      if (c->finished) finished.insert(c->request);
    }
  }
  EXPECT_EQ(errors, "") << node.Logs();
  EXPECT_EQ(answered.size(), static_cast<size_t>(kSubmits)) << node.Logs();
  EXPECT_EQ(finished, accepted) << node.Logs();
  EXPECT_GT(refused, 0);
  EXPECT_GE(accepted.size(), 4u);
  const wire::WorkerStatsReplyT stats = WorkerStats(*reader);
  EXPECT_LE(stats.waiting_requests_peak, 4u);
  EXPECT_EQ(stats.submits_refused, static_cast<uint64_t>(refused));
  EXPECT_EQ(stats.client_replies_dropped, 0u);
  RealNode::Submit(*reader, 77, 7, /*max_new=*/5);
  EXPECT_EQ(RealNode::WaitFinished(*reader, {77}), "") << node.Logs();
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
  std::printf("flood: %d submits, %zu accepted, %d refused, waiting peak %u, reply buffer peak %llu bytes\n",
              kSubmits, accepted.size(), refused, stats.waiting_requests_peak,
              static_cast<unsigned long long>(stats.client_queued_peak_bytes));
}

// memd's `gpus` view of GPU 0 (IntrospectQuery Gpus, as `dhsctl gpus`): slots_used, M_req, M_opt, queued, ...
nlohmann::json MemdGpu0(const std::string& run_dir) {
  DealerClient::Options options;
  options.identity = "dhsctl/test-gpus";
  auto client = DealerClient::Connect(IpcEndpoint(run_dir, "memd"), options);
  EXPECT_TRUE(client.ok());
  if (!client.ok()) return {};
  wire::IntrospectQueryT q;
  q.what = wire::IntrospectWhat::Gpus;
  q.format = wire::IntrospectFormat::Json;
  auto bytes = (*client)->Request(EncodeIntrospectQuery(q, 1, "dhsctl"), std::chrono::milliseconds(5000));
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return {};
  auto m = DecodeEnvelope(*bytes);
  if (!m.ok() || m->type != wire::Body::IntrospectReply) return {};
  nlohmann::json doc = nlohmann::json::parse(ReadIntrospectReply(*m)->document, nullptr, false);
  if (!doc.is_array() || doc.empty()) return {};
  return doc[0];
}

// Reads `c` until request `id`'s final chunk (other requests' chunks are skipped); nullopt when none in ~10 s.
std::optional<wire::TokenChunkT> FinalChunk(DealerClient& c, RequestId id, std::string* errors = nullptr) {
  // Bounded by time, not by messages: other requests' chunks may stream faster than this reads.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = c.Receive(std::chrono::milliseconds(10));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    if (!m.ok()) return std::nullopt;
    if (m->type == wire::Body::ErrorReply && errors != nullptr) *errors += ReadErrorReply(*m)->message + "; ";
    if (m->type != wire::Body::TokenChunk) continue;
    auto chunk = ReadTokenChunk(*m);
    if (chunk->request == id && chunk->finished) return *chunk;
  }
  return std::nullopt;
}

void SendCancel(DealerClient& c, RequestId id, uint64_t seq, const std::string& reason) {
  wire::CancelT cancel;
  cancel.request = id;
  cancel.reason = reason;
  ASSERT_TRUE(c.Send(EncodeCancel(cancel, seq, "replay")).ok());
}

// Cancel (issue 22) with the real memd and workerd: a request cancelled mid-stream and one cancelled while waiting for
// a slot each end with a final chunk carrying CANCELLED and the reason; memd's own view then shows their slots and
// pages released (its request table no longer holds them, slots_used and M_req fall), the worker's counters count
// them, and a Cancel of an unknown request gets ErrorReply NOT_FOUND answering its sequence while the others run on.
TEST(RealNodeEdges, CancelReleasesTheRequestsSlotAndPagesAtMemdMidStreamOrWaiting) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  ChildProcess memd(node.MemdArgs(/*host_pool_pages=*/1024), node.Log("memd"));
  ChildProcess worker(node.WorkerArgs(0), node.Log("workerd"));  // --slots 2
  auto c = node.Client(0);
  ASSERT_TRUE(c);
  // 1500 tokens: requests 5 and 6 must still stream when they are cancelled (with 400 a loaded machine's dhsctl calls
  // below let request 5 finish first, and FinalChunk(7) consumed its final chunk: no final chunk for 5 at the cancel).
  for (RequestId id : {5, 6, 7}) RealNode::Submit(*c, id, static_cast<uint32_t>(id), /*max_new=*/1500);  // 7 waits
  bool streaming = false;
  for (int i = 0; i < 2000 && !streaming; ++i) {
    auto r = c->Receive(std::chrono::milliseconds(10));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    ASSERT_TRUE(m.ok());
    if (m->type != wire::Body::TokenChunk) continue;
    auto chunk = ReadTokenChunk(*m);
    ASSERT_EQ(chunk->error, wire::ErrorCode::OK) << chunk->error_message << node.Logs();
    streaming = chunk->request == 5 && !chunk->tokens.empty();
  }
  ASSERT_TRUE(streaming) << node.Logs();
  const nlohmann::json before = MemdGpu0(dir.path());
  ASSERT_EQ(before.value("slots_used", -1), 2) << before.dump() << node.Logs();
  const int64_t req_pages = before.value("M_req", int64_t{-1});
  ASSERT_GT(req_pages, 0);
  ASSERT_TRUE(MemdKnowsRequest(dir.path(), 7)) << "request 7 is not queued at memd" << node.Logs();

  SendCancel(*c, 7, 100, "waited too long");  // still waiting for its grant
  std::optional<wire::TokenChunkT> end7 = FinalChunk(*c, 7);
  ASSERT_TRUE(end7) << node.Logs();
  EXPECT_EQ(end7->error, wire::ErrorCode::CANCELLED);
  EXPECT_EQ(end7->end_reason, wire::EndReason::CANCELLED);
  EXPECT_EQ(end7->error_message, "cancelled: waited too long");
  SendCancel(*c, 5, 101, "mid stream");
  std::optional<wire::TokenChunkT> end5 = FinalChunk(*c, 5);
  ASSERT_TRUE(end5) << node.Logs();
  EXPECT_EQ(end5->error, wire::ErrorCode::CANCELLED);
  EXPECT_EQ(end5->error_message, "cancelled: mid stream");
  // memd: both gone from its tables, one slot and that request's required pages free (request 6 still runs).
  nlohmann::json after;
  for (int i = 0; i < 200; ++i) {
    after = MemdGpu0(dir.path());
    if (after.value("slots_used", -1) == 1 && !MemdKnowsRequest(dir.path(), 5) && !MemdKnowsRequest(dir.path(), 7)) {
      break;
    }
    ::poll(nullptr, 0, 20);
  }
  EXPECT_EQ(after.value("slots_used", -1), 1) << after.dump() << node.Logs();
  EXPECT_EQ(after.value("M_req", int64_t{-1}), req_pages / 2) << after.dump();  // same shape: half the pages each
  EXPECT_FALSE(MemdKnowsRequest(dir.path(), 5)) << node.Logs();
  EXPECT_FALSE(MemdKnowsRequest(dir.path(), 7)) << node.Logs();
  // A cancel of an unknown (or finished) request: NOT_FOUND, answering its own sequence; nothing else changes.
  SendCancel(*c, 42, 102, "no such request");
  bool not_found = false;
  for (int i = 0; i < 500 && !not_found; ++i) {
    auto r = c->Receive(std::chrono::milliseconds(10));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    ASSERT_TRUE(m.ok());
    if (m->type != wire::Body::ErrorReply) continue;
    EXPECT_EQ(m->sequence, 102u);
    EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::NOT_FOUND);
    not_found = true;
  }
  EXPECT_TRUE(not_found) << node.Logs();
  EXPECT_TRUE(MemdKnowsRequest(dir.path(), 6)) << "request 6 was touched" << node.Logs();
  SendCancel(*c, 6, 103, "last one");
  ASSERT_TRUE(FinalChunk(*c, 6)) << node.Logs();
  for (int i = 0; i < 200 && MemdGpu0(dir.path()).value("slots_used", -1) != 0; ++i) ::poll(nullptr, 0, 20);
  const nlohmann::json empty = MemdGpu0(dir.path());
  EXPECT_EQ(empty.value("slots_used", -1), 0) << empty.dump();
  EXPECT_EQ(empty.value("M_req", int64_t{-1}), 0) << empty.dump();
  const wire::WorkerStatsReplyT stats = WorkerStats(*c);
  EXPECT_EQ(stats.requests_cancelled, 3u);
  EXPECT_EQ(stats.active_requests + stats.waiting_requests, 0u);
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
  EXPECT_EQ(ReadFile(node.Log("workerd")).find("answered message"), std::string::npos) << node.Logs();
}

// A free TCP port of 127.0.0.1 (bound to port 0 and closed: the kernel does not hand it out again at once).
int FreeTcpPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// Submits request `id` (Prompt(40, 11), 8 tokens) on `c` and collects its stream; `error` gets any failure.
Generated ServeOne(DealerClient& c, RequestId id, std::string& error) {
  wire::SubmitRequestT s;
  s.request = id;
  s.prompt = Prompt(40, 11);
  s.max_new_tokens = 8;
  Generated got;
  if (!c.Send(EncodeSubmitRequest(s, id + 1000, "router")).ok()) {
    error = "send failed";
    return got;
  }
  for (int i = 0; i < 1000; ++i) {
    auto r = c.Receive(std::chrono::milliseconds(10));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    if (!m.ok()) {
      error = "undecodable";
      return got;
    }
    if (m->type == wire::Body::ErrorReply) error += ReadErrorReply(*m)->message;
    if (m->type != wire::Body::TokenChunk) continue;
    auto chunk = ReadTokenChunk(*m);
    for (uint8_t t : chunk->tokens) got.tokens.push_back(t);
    for (uint64_t d : chunk->logits_digests) got.digests.push_back(d);
    if (chunk->error != wire::ErrorCode::OK) error += chunk->error_message;
    if (chunk->finished) return got;
  }
  error += "no final chunk";
  return got;
}

// The serving socket over TCP (issue 22): `workerd --listen tcp://:PORT` binds 127.0.0.1 (loopback by default) with
// ZeroMQ CURVE; the key pair is created in the run directory (secret 0600, public key readable). A client holding the
// public key is served over tcp:// with exactly the tokens and logits digests of an ipc:// client; a client without a
// key, or with another server's key, gets no reply at all, and the worker keeps serving.
TEST(RealNodeEdges, TcpServingWithCurveServesKeyHoldersOnlyAndExactlyAsIpc) {
  if (!CurveAvailable()) GTEST_SKIP() << "libzmq without CURVE";
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  RealNode node(dir.path());
  if (!node.Available()) GTEST_SKIP() << "no memd / workerd executable";
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  ChildProcess memd(node.MemdArgs(), node.Log("memd"));
  std::vector<std::string> args = node.WorkerArgs(0);
  args.insert(args.end(), {"--listen", "tcp://:" + std::to_string(port)});
  ChildProcess worker(args, node.Log("workerd"));
  auto ipc = node.Client(0);
  ASSERT_TRUE(ipc);
  std::string error;
  const Generated over_ipc = ServeOne(*ipc, 1, error);  // served: the worker started, its tcp:// socket is bound
  ASSERT_EQ(error, "") << node.Logs();
  struct stat st {};
  ASSERT_EQ(::stat((dir.path() + "/" + kCurveSecretFile).c_str(), &st), 0) << node.Logs();
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((dir.path() + "/" + kCurvePublicFile).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  absl::StatusOr<std::string> key = ReadCurvePublicKey(dir.path() + "/" + kCurvePublicFile);
  ASSERT_TRUE(key.ok()) << key.status();
  // The listener is on 127.0.0.1 only (/proc/net/tcp: local address 0100007F, state 0A = LISTEN), not 0.0.0.0.
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, "%04X", port);
  std::istringstream table(ReadFile("/proc/net/tcp"));
  std::vector<std::string> listeners;
  for (std::string line; std::getline(table, line);) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state == "0A" && local.size() > 5 && local.substr(local.size() - 4) == port_hex) listeners.push_back(local);
  }
  EXPECT_EQ(listeners, std::vector<std::string>{std::string("0100007F:") + port_hex}) << node.Logs();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  // Without a key, and with another server's key: no reply (the handshake never completes).
  char other_public[41], other_secret[41];
  ASSERT_EQ(zmq_curve_keypair(other_public, other_secret), 0);
  for (const std::string& bad_key : {std::string(), std::string(other_public, 40)}) {
    DealerClient::Options o;
    o.curve_server_key = bad_key;
    auto intruder = DealerClient::Connect(endpoint, o);
    ASSERT_TRUE(intruder.ok());
    wire::SubmitRequestT s;
    s.request = 66;
    s.prompt = Prompt(40, 11);
    s.max_new_tokens = 8;
    ASSERT_TRUE((*intruder)->Send(EncodeSubmitRequest(s, 1, "intruder")).ok());
    auto reply = (*intruder)->Receive(std::chrono::milliseconds(1500));
    EXPECT_TRUE(absl::IsDeadlineExceeded(reply.status())) << "a client with key '" << bad_key << "' was answered";
  }
  DealerClient::Options o;
  o.curve_server_key = *key;
  auto tcp = DealerClient::Connect(endpoint, o);
  ASSERT_TRUE(tcp.ok());
  const Generated over_tcp = ServeOne(**tcp, 1, error);
  ASSERT_EQ(error, "") << node.Logs();
  EXPECT_EQ(over_tcp.tokens, over_ipc.tokens);
  EXPECT_EQ(over_tcp.digests, over_ipc.digests);
  const std::vector<uint8_t> prompt = Prompt(40, 11);
  const Generated want = Oracle(*MakePresetModel("glm5-like", 3), {prompt.begin(), prompt.end()}, 8);
  EXPECT_EQ(over_tcp.tokens, want.tokens);
  EXPECT_EQ(over_tcp.digests, want.digests);
  const wire::WorkerStatsReplyT stats = WorkerStats(**tcp);  // the refused clients' submits never reached it
  EXPECT_EQ(stats.finished_requests, 2u);
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
  // A restarted worker keeps the key its clients hold.
  absl::StatusOr<CurveKeyPair> again = LoadOrCreateServerKeys(dir.path());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->public_key, *key);
}

}  // namespace
}  // namespace dhs::test
