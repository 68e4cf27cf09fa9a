// The node side of dhs-replay: WorkerCountersSince (this run's share of a worker's counters, --connect),
// DescribeWaitStatus, and EmbeddedNode::Start failing (the run directory is kept and the message decodes how the
// child ended) (tools/replay/node_client.h, tools/replay/node_launcher.h).
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/replay/node_client.h"
#include "tools/replay/node_launcher.h"
#include "common/transport.h"
#include "tests/common/test_util.h"

namespace dhs::replay {
namespace {

using ::testing::HasSubstr;

TEST(WorkerCountersSince, SubtractsTheBaselineAndKeepsThePeaks) {
  NodeStats baseline;
  baseline.census = {100, 50, 10};
  baseline.reclaims = 7;
  baseline.repopulated_pages = 40;
  baseline.prefix_blocks_imported = 3;
  baseline.prefix_blocks_computed = 5;
  baseline.sessions_admitted_max = 99;  // not a counter: ignored
  NodeStats now;
  now.census = {130, 52, 10};
  now.reclaims = 9;
  now.repopulated_pages = 41;
  now.prefix_blocks_imported = 3;
  now.prefix_blocks_computed = 8;
  now.sessions_admitted_max = 4;
  now.gpus = {GpuMemoryUse{.gpu = 0, .capacity_pages = 64, .peak_required_pages = 20}};
  const NodeStats d = WorkerCountersSince(now, baseline);
  EXPECT_EQ(d.census.direct, 30);
  EXPECT_EQ(d.census.hot, 2);
  EXPECT_EQ(d.census.host, 0);
  EXPECT_EQ(d.reclaims, 2);
  EXPECT_EQ(d.repopulated_pages, 1);
  EXPECT_EQ(d.prefix_blocks_imported, 0);
  EXPECT_EQ(d.prefix_blocks_computed, 3);
  EXPECT_EQ(d.sessions_admitted_max, 4);
  ASSERT_EQ(d.gpus.size(), 1u);
  EXPECT_EQ(d.gpus[0].peak_required_pages, 20);
  // A fresh worker (baseline all 0): the totals are the run's.
  EXPECT_EQ(WorkerCountersSince(now, NodeStats{}).census.direct, 130);
}

TEST(AddWorkerCounters, ADeadWorkersCountsJoinTheTotals) {
  NodeStats dead;  // a killed worker's last sample
  dead.census = {10, 2, 3};
  dead.reclaims = 1;
  dead.spec_rounds = 5;
  dead.spec_round_tokens = 9;
  dead.spec_proposed = 15;
  dead.spec_accepted = 4;
  dead.spec_width_rounds = {0, 0, 1, 0, 4};
  NodeStats total;  // the last worker's
  total.census = {7, 0, 1};
  total.spec_rounds = 2;
  total.spec_round_tokens = 2;
  total.spec_proposed = 2;
  total.spec_width_rounds = {0, 0, 2};
  total.sessions_admitted_max = 3;
  AddWorkerCounters(total, dead);
  EXPECT_EQ(total.census.direct, 17);
  EXPECT_EQ(total.census.hot, 2);
  EXPECT_EQ(total.census.host, 4);
  EXPECT_EQ(total.reclaims, 1);
  EXPECT_EQ(total.spec_rounds, 7);
  EXPECT_EQ(total.spec_round_tokens, 11);
  EXPECT_EQ(total.spec_proposed, 17);
  EXPECT_EQ(total.spec_accepted, 4);
  EXPECT_EQ(total.spec_width_rounds, (std::vector<int64_t>{0, 0, 3, 0, 4}));
  EXPECT_EQ(total.sessions_admitted_max, 3) << "a peak, not a counter";
}

TEST(WorkerCountersSince, AWorkerThatRestartedReportsItsNewTotals) {
  NodeStats baseline;
  baseline.reclaims = 10;
  baseline.census = {100, 0, 0};
  NodeStats now;
  now.reclaims = 12;
  now.census = {30, 0, 0};  // below the baseline: counters started again from 0
  const NodeStats d = WorkerCountersSince(now, baseline);
  EXPECT_EQ(d.reclaims, 12);
  EXPECT_EQ(d.census.direct, 30);
}

TEST(DescribeWaitStatus, DecodesExitCodesAndSignals) {
  EXPECT_EQ(DescribeWaitStatus(256), "exit code 1");  // what used to be printed as "status 256"
  EXPECT_EQ(DescribeWaitStatus(0), "exit code 0");
  EXPECT_EQ(DescribeWaitStatus(SIGKILL), "signal SIGKILL (9)");
  EXPECT_EQ(DescribeWaitStatus(SIGSEGV | 0x80), "signal SIGSEGV (11)");  // with the core-dump bit
}

TEST(EmbeddedNode, AFailedStartKeepsTheRunDirectoryAndDecodesTheExit) {
  const std::string tmp = dhs::testing::ProcessTempDir() + "/replay_node_test_tmp";
  std::filesystem::create_directories(tmp);
  setenv("TMPDIR", tmp.c_str(), 1);
  NodeLaunchOptions o;
  o.memd_path = "/bin/false";  // exits 1 at once, never opens memd.sock
  o.workerd_path = "/bin/false";
  o.page_bytes = 4096;
  o.hbm_budget_bytes = 1 << 20;
  o.host_pool_bytes = 1 << 20;
  auto node = EmbeddedNode::Start(o);  // run_dir "": a temporary directory
  ASSERT_FALSE(node.ok());
  const std::string message(node.status().message());
  EXPECT_TRUE(absl::IsUnavailable(node.status()));
  EXPECT_THAT(message, HasSubstr("memd exited during start-up (exit code 1)"));
  const std::string kept = "(run directory kept: ";
  const size_t at = message.find(kept);
  ASSERT_NE(at, std::string::npos) << message;
  const std::string dir = message.substr(at + kept.size(), message.find(')', at) - at - kept.size());
  EXPECT_THAT(dir, ::testing::StartsWith(tmp + "/dhs-replay-"));
  EXPECT_THAT(message, HasSubstr(dir + "/memd.log"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/memd.log")) << dir;  // the log the message points at is there
  std::filesystem::remove_all(dir);
}

// A run directory whose sockets do not fit sun_path (issue 12): with a long TMPDIR the fresh run directory goes under
// /tmp instead (the node's sockets are checked as memd checks them: CheckSocketPaths); a given run directory that is
// too long is refused before anything starts.
TEST(EmbeddedNode, ALongTmpdirGivesARunDirectoryWhoseSocketsFit) {
  EXPECT_EQ(TempRunDirParent(nullptr), "/tmp");
  EXPECT_EQ(TempRunDirParent(""), "/tmp");
  EXPECT_EQ(TempRunDirParent("/var/tmp/"), "/var/tmp");
  const std::string long_tmp = "/tmp/" + std::string(90, 't');
  EXPECT_EQ(TempRunDirParent(long_tmp.c_str()), "/tmp");
  ASSERT_TRUE(CheckSocketPaths(TempRunDirParent(long_tmp.c_str()) + "/dhs-replay-XXXXXX").ok());

  NodeLaunchOptions o;
  o.memd_path = o.workerd_path = "/bin/false";
  o.page_bytes = o.hbm_budget_bytes = o.host_pool_bytes = 4096;
  o.run_dir = long_tmp;
  auto node = EmbeddedNode::Start(o);
  EXPECT_TRUE(absl::IsInvalidArgument(node.status())) << node.status();
  EXPECT_THAT(std::string(node.status().message()), HasSubstr("worker-65535.sock is 113 bytes"));
  EXPECT_FALSE(std::filesystem::exists(long_tmp));  // nothing created
}

// Issue 26 review: dhs-replay --nodes N --run-dir NEW creates NEW (and its missing parents) for the nodes' NEW/node<i>;
// NEW must be mode 0700, since --check-exact's resident reference node then runs in NEW itself and MakeRunDir refuses
// a directory granting anything to group or others (before: 0755 from create_directories, the reference refused it).
TEST(MakeNodesRunDir, CreatesTheDirectory0700AndRefusesAnOpenOne) {
  dhs::testing::ScopedTempDir tmp;
  const std::string dir = tmp.path() + "/a/b/run";
  ASSERT_TRUE(MakeNodesRunDir(dir).ok());
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(MakeRunDir(dir).ok());        // what the reference node checks
  EXPECT_TRUE(MakeNodesRunDir(dir).ok());   // the next node's call: the existing directory
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  const absl::Status open = MakeNodesRunDir(dir);
  EXPECT_FALSE(open.ok());
  EXPECT_THAT(std::string(open.message()), HasSubstr("must grant nothing to group or others"));
}

TEST(EmbeddedNode, AMissingExecutableIsReported) {
  NodeLaunchOptions o;
  o.memd_path = "/nonexistent/memd";
  o.workerd_path = "/bin/false";
  o.page_bytes = o.hbm_budget_bytes = o.host_pool_bytes = 4096;
  auto node = EmbeddedNode::Start(o);
  EXPECT_TRUE(absl::IsInvalidArgument(node.status()));
  EXPECT_THAT(std::string(node.status().message()), HasSubstr("/nonexistent/memd"));
}

}  // namespace
}  // namespace dhs::replay
