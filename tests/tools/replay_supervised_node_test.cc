// dhs-replay's supervised node (tools/replay/supervised_node.h) with the real memd and workerd (paths from $MEMD and
// $WORKERD): its final stop while memd is dead (SIGKILLed, its restart still in backoff) leaves no host pool in
// /dev/shm (issue 26 review: a multi-node fault run left /dev/shm/dhs-pool-* of 236 MB behind).
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "common/host_pool.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tools/replay/budget.h"
#include "tools/replay/options.h"
#include "tools/replay/supervised_node.h"

namespace dhs::replay {
namespace {

// The pid of this process's child running `comm` (from /proc/<pid>/stat: "pid (comm) state ppid ..."), or -1.
pid_t ChildNamed(const std::string& comm) {
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return -1;
  pid_t found = -1;
  while (dirent* e = ::readdir(d)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    std::ifstream f(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) != 2) continue;
    if (line.substr(open + 1, close - open - 1) == comm && ppid == ::getpid() && state != 'Z') found = pid;
  }
  ::closedir(d);
  return found;
}

// The dhs-pool-* segment `pid` maps, from /proc/<pid>/maps ("" when none).
std::string PoolOf(pid_t pid) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t at = line.find("/dev/shm/dhs-pool-");
    if (at != std::string::npos) return line.substr(at + 9);
  }
  return "";
}

TEST(SupervisedNode, AStopWhileMemdIsDeadLeavesNoHostPool) {
  const char* memd = std::getenv("MEMD");
  const char* workerd = std::getenv("WORKERD");
  ASSERT_TRUE(memd != nullptr && workerd != nullptr) << "set MEMD and WORKERD";
  dhs::testing::ScopedTempDir tmp;
  ASSERT_FALSE(tmp.path().empty());
  ReplayOptions ro;
  const uint64_t budget = uint64_t{64} << 20;
  auto geometry = ReplayGeometry(ro, budget);
  ASSERT_TRUE(geometry.ok()) << geometry.status();
  SupervisedNodeOptions o;
  o.launch.memd_path = memd;
  o.launch.workerd_path = workerd;
  o.launch.run_dir = tmp.path() + "/run";
  o.launch.hbm_budget_bytes = budget;
  o.launch.page_bytes = geometry->host_page_bytes;
  o.launch.host_pool_bytes = 64 * geometry->host_page_bytes;
  o.launch.slots = 2;
  o.page_rows = geometry->kv.page_rows;
  o.policy.backoff_initial_ms = 600000;  // a killed memd is not restarted before the stop (forces the interleaving)
  o.policy.backoff_max_ms = 600000;
  auto node = SupervisedNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();

  const pid_t memd_pid = ChildNamed("memd");
  ASSERT_GT(memd_pid, 0);
  const std::string segment = PoolOf(memd_pid);
  ASSERT_FALSE(segment.empty());
  const std::string path = std::string(kHostPoolShmDir) + "/" + segment;
  ASSERT_TRUE(std::filesystem::exists(path));
  ASSERT_EQ(::kill(memd_pid, SIGKILL), 0);
  // Until the supervision thread reaped it (no longer our live child): memd is dead, its restart 600 s away.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ChildNamed("memd") == memd_pid && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_NE(ChildNamed("memd"), memd_pid);
  EXPECT_TRUE(std::filesystem::exists(path));  // the SIGKILLed memd left it (a successor would adopt it)

  EXPECT_TRUE((*node)->Stop().ok());
  EXPECT_EQ(ChildNamed("memd"), -1);
  EXPECT_EQ(ChildNamed("workerd"), -1);
  EXPECT_FALSE(std::filesystem::exists(path)) << path << " left behind";
  (void)HostPoolSegment::Remove(segment);  // the test leaves nothing in /dev/shm either way
}

}  // namespace
}  // namespace dhs::replay
