// tests/workerd/plan_live_process_test.cc: `dhsctl plan --live` against a REAL node (issue 14): the real `memd`,
// `workerd` and `dhsctl` executables over ipc:// in a private run directory, without --preset / --file (the plan takes
// the shape the worker declared in its Hello), once without speculation and once with the built-in drafter
// (--speculate fixed). Checks:
// - required_pages_per_session equals the required pages memd's `requests` view shows for a real request of that
//   context (prompt + max_new_tokens), and equals the figure written out by hand below from workerd's glm5-like model;
// - sessions_now equals min(floor(available / required), free slots, host pages / host pages per session) computed
//   here from memd's own `status` figures, read just before and after the plan (retried until the two agree).
// Times are never asserted.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "memd/pool_segment.h"
#include "common/host_pool.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"
#include "tests/workerd/worker_test_util.h"
#include "workerd/geometry.h"
#include "workerd/speculation/drafter_model.h"

namespace dhs::test {
namespace {

using dhs::testing::ChildProcess;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// workerd's glm5-like (workerd/model/config.cc): 7 payload sources of d_KV = 4 * (128 + 16) = 576 bytes, 2 index
// producers with 4 * 32 = 128-byte keys, k = 32, no local window. At p = 16: GPU page 16 * 7 * 576 = 64512 bytes, host
// page 16 * (7 * 576 + 2 * 128) = 68608 bytes. B = max(64, 4 * (32 + 0)) = 128 (workerd's default), T = 32 (flag).
constexpr uint64_t kPageRows = 16;
constexpr uint64_t kGpuPageBytes = 16 * 7 * 576;
constexpr uint64_t kHostPageBytes = 16 * (7 * 576 + 2 * 128);
constexpr uint64_t kGpuPages = 100;   // M (--hbm-budget = 100 GPU pages)
constexpr uint64_t kSlots = 8;
constexpr uint64_t kPrompt = 40, kMaxNew = 1000;
constexpr uint64_t kContext = kPrompt + kMaxNew;  // 1040 tokens = 65 pages of 16

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Required pages by hand (brief §8 hierarchical as workerd declares it, common/worker_shape.h):
// ceil((B + T) / p) = ceil(160 / 16) = 10, index keys ceil(1040 * 2 * 128 / 64512) = ceil(266240 / 64512) = 5 -> 15.
constexpr uint64_t kRequiredPlain = 15;
// With the drafter (--speculate fixed --block 4, the drafter file's W = 32 and 2 layers * K and V * 2 heads * 32 * 4
// bytes = 1024 bytes per ring row): R_d = 16 * ceil((32 + 4 + 15) / 16) = 64 rows -> 65536 bytes -> ceil(65536 /
// 64512) = 2 pages; staging share χ * K_max * k * d_KV = 4 * 4 * 32 * 576 = 294912 bytes -> ceil(4.57) = 5 pages.
constexpr uint64_t kSpeculationPages = 2 + 5;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class Node {
 public:
  Node() {
    char tmpl[] = "/tmp/dhs_plan_live_XXXXXX";
    run_dir_ = ::mkdtemp(tmpl);
  }
  ~Node() {
    worker_.reset();
    memd_.reset();
    std::error_code ec;
    HostPoolSegment::Remove(memd::PoolSegmentName(std::filesystem::canonical(run_dir_, ec).string())).IgnoreError();
    std::filesystem::remove_all(run_dir_, ec);
  }
  static bool Available() {
    for (const char* v : {"MEMD", "WORKERD", "DHSCTL"}) {
      if (std::getenv(v) == nullptr || !std::filesystem::exists(std::getenv(v))) return false;
    }
    return true;
  }
  void Start(const std::vector<std::string>& worker_extra) {
    memd_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{std::getenv("MEMD"), "--run-dir", run_dir_, "--page-bytes",
                                 std::to_string(kHostPageBytes), "--host-pool-pages", "1024", "--log-level", "info"},
        run_dir_ + "/memd.log");
    std::vector<std::string> args = {std::getenv("WORKERD"), "--run-dir", run_dir_, "--gpu", "0", "--mode", "adaptive",
                                     "--preset", "glm5-like", "--seed", "3", "--page-rows",
                                     std::to_string(kPageRows), "--tail-rows", "32", "--slots",
                                     std::to_string(kSlots), "--hbm-budget", std::to_string(kGpuPages * kGpuPageBytes),
                                     "--log-level", "info"};
    args.insert(args.end(), worker_extra.begin(), worker_extra.end());
    worker_ = std::make_unique<ChildProcess>(std::move(args), run_dir_ + "/workerd.log");
  }
  // `dhsctl --json ARGS`: exit code and parsed stdout (null when not JSON).
  std::pair<int, json> Dhsctl(const std::string& args) const {
    const std::string cmd =
        std::string(std::getenv("DHSCTL")) + " --run-dir " + run_dir_ + " --json " + args + " 2>>" + run_dir_ +
        "/dhsctl.err";
    FILE* f = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    const int status = pclose(f);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, json::parse(out, nullptr, false)};
  }
  // Polls memd's status until GPU 0's worker declared its shape; returns that status (null on timeout).
  json WaitWorker(int timeout_ms = 30000) const {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Clock::now() < deadline) {
      auto [rc, s] = Dhsctl("status");
      if (rc == 0 && s.is_object() && s["gpus"].size() == 1 && s["gpus"][0]["worker"].is_object()) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return json();
  }
  std::string Logs() const {
    return "\nmemd.log:\n" + ReadFile(run_dir_ + "/memd.log") + "\nworkerd.log:\n" +
           ReadFile(run_dir_ + "/workerd.log") + "\ndhsctl.err:\n" + ReadFile(run_dir_ + "/dhsctl.err");
  }
  const std::string& run_dir() const { return run_dir_; }

 private:
  std::string run_dir_;
  std::unique_ptr<ChildProcess> memd_, worker_;
};

struct Observed {
  uint64_t required = 0;        // plan --live: required_pages_per_session
  uint64_t sessions_now = 0;    // plan --live
  uint64_t expected_sessions = 0;  // from memd's status figures
  uint64_t admitted_required = 0;  // memd's requests view for the real request
};

// Plans, checks against memd's figures, submits one request of kContext tokens and reads its required pages.
void PlanAndAdmit(Node& node, uint64_t want_required, uint64_t want_speculation_pages, Observed& o) {
  ASSERT_FALSE(node.WaitWorker().is_null()) << "the worker never registered" << node.Logs();
  const std::string plan_args = "plan --context " + std::to_string(kContext) + " --live";
  json plan, before;
  bool stable = false;
  for (int attempt = 0; attempt < 50 && !stable; ++attempt) {
    auto [rc1, s1] = node.Dhsctl("status");
    auto [rc, p] = node.Dhsctl(plan_args);
    auto [rc2, s2] = node.Dhsctl("status");
    ASSERT_EQ(rc, 0) << node.Logs();
    ASSERT_TRUE(rc1 == 0 && rc2 == 0) << node.Logs();
    stable = s1["gpus"] == s2["gpus"] && s1["host"] == s2["host"];
    plan = p;
    before = s1;
  }
  ASSERT_TRUE(stable) << "memd's state kept changing";
  const json& live = plan["live"];
  o.required = live["required_pages_per_session"].get<uint64_t>();
  o.sessions_now = live["sessions_now"].get<uint64_t>();
  EXPECT_EQ(o.required, want_required);
  EXPECT_EQ(live["speculation_pages_per_session"].get<uint64_t>(), want_speculation_pages);
  EXPECT_EQ(live["gpu_page_bytes"].get<uint64_t>(), kGpuPageBytes);
  EXPECT_EQ(live["page_bytes"].get<uint64_t>(), kHostPageBytes);

  // sessions_now from memd's own figures: GPU 0's available pages, its free slots, the host pool.
  const json& g = before["gpus"][0];
  const auto u = [](const json& j, const char* k) { return j[k].get<uint64_t>(); };
  const auto sub = [](uint64_t a, uint64_t b) { return a > b ? a - b : 0; };
  const uint64_t available = sub(sub(u(g, "free"), u(g, "M_res")) + u(g, "reclaimable") + u(g, "reclaiming"),
                                 u(g, "queued_required"));
  const uint64_t free_slots = sub(u(g, "slots"), u(g, "slots_used") + u(g, "queued"));
  const uint64_t host_sessions = sub(u(before["host"], "reusable"), u(g, "queued_host")) / CeilDiv(kContext, kPageRows);
  o.expected_sessions = std::min({available / want_required, free_slots, host_sessions});
  EXPECT_EQ(o.sessions_now, o.expected_sessions) << before.dump(2) << plan.dump(2);
  EXPECT_EQ(live["gpus"][0]["available_pages"].get<uint64_t>(), available);
  EXPECT_LT(o.expected_sessions, free_slots) << "the figure should be bound by pages here, not by slots";

  // A real request of that context: memd's requests view shows what workerd declared.
  auto client = DealerClient::Connect(IpcEndpoint(node.run_dir(), "worker-0"));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitPeerConnected(true, std::chrono::milliseconds(15000))) << node.Logs();
  wire::SubmitRequestT s;
  s.request = 1;
  s.prompt = Prompt(kPrompt, 7);
  s.max_new_tokens = kMaxNew;
  ASSERT_TRUE((*client)->Send(EncodeSubmitRequest(s, 2, "plan-live")).ok());
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  json request;
  while (request.is_null() && Clock::now() < deadline) {
    auto [rc, r] = node.Dhsctl("requests");
    const json& list = r.is_array() ? r : r["requests"];
    if (rc == 0 && list.is_array()) {
      for (const json& e : list) {
        if (e["state"] == "admitted") request = e;
      }
    }
    if (request.is_null()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_FALSE(request.is_null()) << "the request never showed as admitted" << node.Logs();
  o.admitted_required = request["required_pages"].get<uint64_t>();
  EXPECT_EQ(o.admitted_required, o.required) << request.dump(2);
  EXPECT_EQ(request["draft_ring_pages"].get<uint64_t>() + request["staging_pages"].get<uint64_t>(),
            want_speculation_pages)
      << request.dump(2);
  // How long the request stayed admitted after it was seen (printed, never asserted: the margin the poll above had).
  const auto seen = Clock::now();
  for (bool listed = true; listed && Clock::now() < seen + std::chrono::seconds(60);) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto [rc, r] = node.Dhsctl("requests");
    const json& list = r.is_array() ? r : r["requests"];
    listed = rc == 0 && list.is_array() && !list.empty();
  }
  std::printf("the request of %llu tokens stayed admitted %.0f ms after the poll saw it\n",
              static_cast<unsigned long long>(kContext),
              std::chrono::duration<double, std::milli>(Clock::now() - seen).count());
}

TEST(PlanLive, RealWorkerWithoutSpeculation) {
  if (!Node::Available()) GTEST_SKIP() << "MEMD, WORKERD or DHSCTL not set";
  Node node;
  node.Start({});
  Observed o;
  PlanAndAdmit(node, kRequiredPlain, 0, o);
  std::printf("plan --live, no speculation: context %llu, required %llu (memd admitted %llu), sessions_now %llu\n",
              static_cast<unsigned long long>(kContext), static_cast<unsigned long long>(o.required),
              static_cast<unsigned long long>(o.admitted_required), static_cast<unsigned long long>(o.sessions_now));
}

TEST(PlanLive, RealWorkerWithTheDrafter) {
  if (!Node::Available()) GTEST_SKIP() << "MEMD, WORKERD or DHSCTL not set";
  Node node;
  spec::DrafterConfig dc;  // W = 32, 2 layers, 2 heads of 32: 1024 bytes per ring row
  dc.target_d_model = 64;  // workerd's glm5-like d_model
  ASSERT_EQ(dc.draft_bytes_per_row(), 1024);
  auto weights = spec::GenerateDrafterWeights(dc, 1);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const std::string path = node.run_dir() + "/drafter.safetensors";
  ASSERT_TRUE(weights->WriteFile(path).ok());
  node.Start({"--speculate", "fixed", "--block", "4", "--drafter-weights", path});
  Observed o;
  PlanAndAdmit(node, kRequiredPlain + kSpeculationPages, kSpeculationPages, o);
  std::printf("plan --live, --speculate fixed: context %llu, required %llu (memd admitted %llu), sessions_now %llu\n",
              static_cast<unsigned long long>(kContext), static_cast<unsigned long long>(o.required),
              static_cast<unsigned long long>(o.admitted_required), static_cast<unsigned long long>(o.sessions_now));
}

}  // namespace
}  // namespace dhs::test
