// common/local_redis.h (issue 26): the redis-server / Redis Cluster dhs-replay --cluster-store local|local-cluster
// starts, against real servers: reachable at the URL it gives (which the cluster tier's ParseSeeds reads), empty after
// a restart, gone (process reaped) after Kill; a 3-master cluster whose seed URL names every node.
#include <signal.h>

#include <filesystem>

#include "common/local_redis.h"
#include "common/redis_client.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace dhs {
namespace {

TEST(LocalRedisTest, ServerStartsRestartsEmptyAndIsKilled) {
  testing::ScopedTempDir tmp("dhs-local-redis-");
  auto server = LocalRedisServer::Start(tmp.path() + "/one", /*cluster=*/false);
  ASSERT_TRUE(server.ok()) << server.status();
  const pid_t pid = (*server)->pid();
  EXPECT_GT(pid, 0);
  EXPECT_EQ((*server)->Cli("set k v"), "OK");
  EXPECT_EQ((*server)->Cli("get k"), "v");
  auto seeds = redis::ParseSeeds((*server)->url());
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  ASSERT_EQ(seeds->size(), 1u);
  EXPECT_EQ((*seeds)[0].port, (*server)->port());
  EXPECT_EQ((*server)->Cli("config get save"), "save");  // no persistence: "save" ""
  ASSERT_TRUE((*server)->Restart().ok());
  EXPECT_EQ((*server)->Cli("get k"), "");  // empty after a restart
  const pid_t second = (*server)->pid();
  (*server)->Kill();
  EXPECT_EQ((*server)->pid(), -1);
  EXPECT_NE(::kill(second, 0), 0);  // reaped: no such process
  EXPECT_NE(::kill(pid, 0), 0);
  EXPECT_EQ(RunCapture("redis-cli -p " + std::to_string(seeds->at(0).port) + " ping"), "");
}

TEST(LocalRedisTest, ClusterOfThreeMastersAndItsSeedUrl) {
  testing::ScopedTempDir tmp("dhs-local-redis-");
  auto cluster = LocalRedisCluster::Start(tmp.path(), /*masters=*/3, /*replicas=*/0);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ASSERT_EQ((*cluster)->nodes().size(), 3u);
  auto seeds = redis::ParseSeeds((*cluster)->SeedUrl());
  ASSERT_TRUE(seeds.ok()) << seeds.status();
  ASSERT_EQ(seeds->size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ((*seeds)[i].port, (*cluster)->nodes()[i]->port());
  EXPECT_NE((*cluster)->nodes()[0]->Cli("cluster info").find("cluster_state:ok"), std::string::npos);
  std::vector<pid_t> pids;
  for (auto& n : (*cluster)->nodes()) pids.push_back(n->pid());
  (*cluster)->Kill();
  for (pid_t p : pids) EXPECT_NE(::kill(p, 0), 0);
}

TEST(LocalRedisTest, FreePortAndProgram) {
  EXPECT_NE(FreeLoopbackPort(), 0);
  EXPECT_FALSE(FindProgram("redis-server").empty());
  EXPECT_TRUE(FindProgram("no-such-program-dhs").empty());
}

}  // namespace
}  // namespace dhs
