// tests/workerd/worker_startup_process_test.cc: start-up that scales (issue 22), with the real `memd` and `workerd`
// executables over ipc:// in a private run directory.
// - A start-up whose preparation after HelloReply lasts three times memd's --worker-timeout-ms (the test-only
//   `workerd --fault-start-delay-ms`, standing for pinning a large host pool) registers once, is never fenced and
//   serves: the worker keeps memd informed while it prepares (MemdClient::KeepAlive).
// - A worker stopped (SIGSTOP) during that preparation for longer than memd's worker timeout is fenced by memd, and
//   once resumed ends its start with exit code 75 (a supervisor restarts it) instead of serving with a void epoch.
// - A multi-GB KV budget on the CPU backend (6e9 bytes, the case) starts, registers and serves, and the
//   worker's resident memory stays far below the budget (the pools are touched lazily).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/workerd/worker_test_util.h"

namespace dhs::test {
namespace {

using dhs::testing::ChildProcess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// VmRSS of `pid` in bytes (0 when it cannot be read).
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;  // "kB"
  }
  return 0;
}

// Waits up to `timeout_ms` for `what` in the file at `path`.
bool WaitForLine(const std::string& path, const std::string& what, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (ReadFile(path).find(what) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// memd and one workerd (GPU 0, glm5-like, adaptive, CPU backend) in a private run directory.
class StartupNode {
 public:
  static constexpr uint32_t kPageRows = 16;
  explicit StartupNode(const std::string& run_dir) : run_dir_(run_dir), model_(MakePresetModel("glm5-like", 3)) {
    page_bytes_ = uint64_t{kPageRows} * model_->config().row_bytes() * model_->config().n_sources();
  }
  static bool Available() {
    const char* m = std::getenv("MEMD");
    return m != nullptr && std::getenv("WORKERD") != nullptr && std::filesystem::exists(m);
  }
  uint64_t page_bytes() const { return page_bytes_; }
  std::vector<std::string> MemdArgs(uint32_t worker_timeout_ms) const {
    return {std::getenv("MEMD"), "--run-dir", run_dir_, "--page-bytes",
            std::to_string(HostPageBytes(model_->config(), kPageRows)), "--host-pool-pages", "64",
            "--worker-timeout-ms", std::to_string(worker_timeout_ms), "--log-level", "info"};
  }
  std::vector<std::string> WorkerArgs(uint64_t hbm_budget, int start_delay_ms) const {
    return {std::getenv("WORKERD"), "--run-dir", run_dir_, "--gpu", "0", "--mode", "adaptive", "--device", "cpu",
            "--preset", "glm5-like", "--seed", "3", "--page-rows", std::to_string(kPageRows), "--tail-rows", "32",
            "--slots", "2", "--hbm-budget", std::to_string(hbm_budget), "--fault-start-delay-ms",
            std::to_string(start_delay_ms), "--log-level", "info"};
  }
  std::string Log(const std::string& name) const { return run_dir_ + "/" + name + ".log"; }
  std::string Logs() const {
    return "\nmemd:\n" + ReadFile(Log("memd")) + "\nworkerd:\n" + ReadFile(Log("workerd"));
  }
  // Submits one request (40 prompt tokens, 4 new) on a fresh client of the worker and reads its replies until it
  // finished or `timeout_ms` passed. Returns "" when it finished with the model's own tokens, else what went wrong.
  std::string ServeOne(RequestId id, int timeout_ms) {
    auto c = DealerClient::Connect(IpcEndpoint(run_dir_, "worker-0"));
    if (!c.ok()) return c.status().ToString();
    const std::vector<uint8_t> prompt = Prompt(40, 5);
    wire::SubmitRequestT s;
    s.request = id;
    s.prompt = prompt;
    s.max_new_tokens = 4;
    if (!(*c)->Send(EncodeSubmitRequest(s, 1, "replay")).ok()) return "send failed";
    std::vector<model::Token> tokens;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      auto r = (*c)->Receive(std::chrono::milliseconds(10));
      if (!r.ok()) continue;
      auto m = DecodeEnvelope(*r);
      if (!m.ok()) return "undecodable reply";
      if (m->type == wire::Body::ErrorReply) return ReadErrorReply(*m)->message;
      if (m->type != wire::Body::TokenChunk) continue;
      auto chunk = ReadTokenChunk(*m);
      if (chunk->error != wire::ErrorCode::OK) return chunk->error_message;
      for (uint8_t t : chunk->tokens) tokens.push_back(t);
      if (!chunk->finished) continue;
      const Generated want = Oracle(*model_, std::vector<model::Token>(prompt.begin(), prompt.end()), 4);
      return tokens == want.tokens ? "" : "tokens differ from the model's own";
    }
    return "no finished chunk";
  }

 private:
  std::string run_dir_;
  std::unique_ptr<model::Model> model_;
  uint64_t page_bytes_ = 0;
};

// Without the heartbeats of the preparation memd fences the worker at 1 s (no message since its Hello) and the worker
// itself ends its epoch at its first poll (nothing from memd for more than 2/3 of 1 s): exit 75, nothing served.
TEST(WorkerStartup, APreparationThreeTimesMemdsWorkerTimeoutRegistersOnceAndServes) {
  if (!StartupNode::Available()) GTEST_SKIP() << "no memd / workerd executable";
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StartupNode node(dir.path());
  ChildProcess memd(node.MemdArgs(/*worker_timeout_ms=*/1000), node.Log("memd"));
  ASSERT_TRUE(memd.ok());
  ChildProcess worker(node.WorkerArgs(40 * node.page_bytes(), /*start_delay_ms=*/3000), node.Log("workerd"));
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(node.ServeOne(11, 30000), "") << node.Logs();
  EXPECT_FALSE(worker.Exited()) << node.Logs();
  const std::string memd_log = ReadFile(node.Log("memd")), worker_log = ReadFile(node.Log("workerd"));
  EXPECT_EQ(memd_log.find("GPU 0 fenced"), std::string::npos) << "memd fenced the preparing worker" << node.Logs();
  EXPECT_NE(worker_log.find("TEST ONLY slow start"), std::string::npos) << node.Logs();
  EXPECT_NE(worker_log.find("prepared in"), std::string::npos) << node.Logs();
  EXPECT_EQ(Count(worker_log, "memd accepted gpu 0"), 1u) << "one Hello, one epoch" << node.Logs();
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
}

// The heartbeats of the preparation do not hide a hung worker: stopped past memd's worker timeout while it prepares,
// it is fenced, and once resumed it ends its start with exit code 75 (kExitEpochEnded) without serving.
TEST(WorkerStartup, AWorkerStoppedWhileItPreparesIsFencedAndExits75) {
  if (!StartupNode::Available()) GTEST_SKIP() << "no memd / workerd executable";
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StartupNode node(dir.path());
  ChildProcess memd(node.MemdArgs(/*worker_timeout_ms=*/1000), node.Log("memd"));
  ASSERT_TRUE(memd.ok());
  ChildProcess worker(node.WorkerArgs(40 * node.page_bytes(), /*start_delay_ms=*/4000), node.Log("workerd"));
  ASSERT_TRUE(worker.ok());
  // The preparation has begun (memd accepted the Hello; the slow start is under way): stop it past the fence.
  ASSERT_TRUE(WaitForLine(node.Log("workerd"), "TEST ONLY slow start", 20000)) << node.Logs();
  ASSERT_EQ(worker.Signal(SIGSTOP), 0);
  ASSERT_TRUE(WaitForLine(node.Log("memd"), "GPU 0 fenced", 20000)) << "memd did not fence the stopped worker" << node.Logs();
  ASSERT_EQ(worker.Signal(SIGCONT), 0);
  EXPECT_EQ(worker.WaitExit(20000), 75) << node.Logs();
  EXPECT_NE(ReadFile(node.Log("workerd")).find("while preparing"), std::string::npos) << node.Logs();
  EXPECT_FALSE(memd.Exited()) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
}

// The case: `workerd --hbm-budget 6000000000` on the CPU backend under memd's default worker timeout (3 s).
// The worker registers and serves, and its resident memory stays below 1 GiB: the 6 GB of pools are only touched
// where rows are written (a zero-filled pool would take every byte, and seconds to write them).
TEST(WorkerStartup, ASixGigabyteBudgetOnTheCpuBackendStartsAndServesWithoutTouchingThePools) {
  if (!StartupNode::Available()) GTEST_SKIP() << "no memd / workerd executable";
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  StartupNode node(dir.path());
  ChildProcess memd(node.MemdArgs(/*worker_timeout_ms=*/3000), node.Log("memd"));
  ASSERT_TRUE(memd.ok());
  constexpr uint64_t kBudget = 6000000000;
  ChildProcess worker(node.WorkerArgs(kBudget, /*start_delay_ms=*/0), node.Log("workerd"));
  ASSERT_TRUE(worker.ok());
  EXPECT_EQ(node.ServeOne(12, 60000), "") << node.Logs();
  ASSERT_FALSE(worker.Exited()) << node.Logs();
  const uint64_t rss = ResidentBytes(worker.pid());
  std::printf("workerd --hbm-budget %llu: resident %llu bytes after one request\n",
              static_cast<unsigned long long>(kBudget), static_cast<unsigned long long>(rss));
  EXPECT_GT(rss, 0u);
  EXPECT_LT(rss, uint64_t{1} << 30) << node.Logs();
  // memd registered the GPU with the whole budget: M = 6e9 / page bytes pages.
  const std::string expected_m = "M = " + std::to_string(kBudget / node.page_bytes()) + " pages";
  EXPECT_NE(ReadFile(node.Log("workerd")).find(expected_m), std::string::npos) << expected_m << node.Logs();
  EXPECT_EQ(ReadFile(node.Log("memd")).find("GPU 0 fenced"), std::string::npos) << node.Logs();
  EXPECT_EQ(worker.Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd.Terminate(), 0) << node.Logs();
}

}  // namespace
}  // namespace dhs::test
