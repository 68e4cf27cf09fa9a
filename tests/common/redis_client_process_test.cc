// tests/common/redis_client_process_test.cc: the cluster tier's Redis client (common/redis_client.h) against real
// redis-server 7 processes (tests/common/redis_test_util.h): one server, and a Redis Cluster of 3 masters with one
// replica each. Faults are real: SIGSTOP, SIGKILL, a restart with an empty store, a slot moved or being migrated with
// CLUSTER SETSLOT / MIGRATE, a master killed and its replica promoted.
#include "common/redis_client.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/redis_slot.h"
#include "tests/common/redis_test_util.h"

namespace dhs::redis {
namespace {

using std::chrono::milliseconds;
using testing::RedisCluster;
using testing::RedisServer;
using testing::ScopedTempDir;

constexpr milliseconds kBatch{2000};

std::unique_ptr<Client> MakeClient(std::vector<Endpoint> seeds) {
  ClientConfig config;
  config.seeds = std::move(seeds);
  auto c = Client::Create(config);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

// A value with every byte value, CR LF and NUL included, distinct per key.
std::string Value(const std::string& key, size_t bytes) {
  std::string v(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<char>((i * 131 + key.size() * 7 + key.back()) & 0xff);
  return v;
}

TEST(RedisSeeds, ParsesUrlsAndLists) {
  auto one = ParseSeeds("redis://127.0.0.1:6379");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0], (Endpoint{"127.0.0.1", 6379}));
  auto many = ParseSeeds("redis://a:1, b:2,redis://c:65535/");
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(*many, (std::vector<Endpoint>{{"a", 1}, {"b", 2}, {"c", 65535}}));
  for (const char* bad : {"", "redis://host", "host:0", "host:65536", "http://h:1", ":80", "h:x", "redis://h:1/0"}) {
    EXPECT_EQ(ParseSeeds(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // Review of issue 26: what the client cannot do is refused by name, not taken as a strange host.
  const std::pair<const char*, const char*> refused[] = {
      {"redis://:pw@127.0.0.1:6379", "credentials in the address are not supported"},
      {"redis://user:pw@h:1", "credentials in the address are not supported"},
      {"redis://[::1]:6379", "brackets are not supported"},
      {"redis://h:1,", "an empty seed"},
      {"a:1,,b:2", "an empty seed"},
      {",a:1", "an empty seed"},
      {"a:1, ,b:2", "an empty seed"}};
  for (const auto& [spec, why] : refused) {
    const absl::Status s = ParseSeeds(spec).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(s.message().find(why), std::string::npos) << spec << ": " << s;
  }
  EXPECT_EQ(Client::Create(ClientConfig{}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RedisRedirection, ParsesMovedAndAsk) {
  const Endpoint from{"10.0.0.1", 7000};
  auto moved = ParseRedirection("MOVED 3999 127.0.0.1:6381", from);
  ASSERT_TRUE(moved);
  EXPECT_FALSE(moved->ask);
  EXPECT_EQ(moved->slot, 3999u);
  EXPECT_EQ(moved->target, (Endpoint{"127.0.0.1", 6381}));
  auto ask = ParseRedirection("ASK 0 :6380", from);  // an empty host: the node that answered
  ASSERT_TRUE(ask);
  EXPECT_TRUE(ask->ask);
  EXPECT_EQ(ask->target, (Endpoint{"10.0.0.1", 6380}));
  auto v6 = ParseRedirection("MOVED 16383 ::1:7001", from);
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->target, (Endpoint{"::1", 7001}));
  for (const char* other : {"ERR wrong", "MOVED", "MOVED 1", "MOVED 16384 h:1", "MOVED x h:1", "ASK 1 h:0",
                            "ASK 1 h", "MOVED 1 h:1 extra", "TRYAGAIN Multiple keys request during rehashing"}) {
    EXPECT_FALSE(ParseRedirection(other, from)) << other;
  }
}

class OneServer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    server_ = RedisServer::Start(tmp_.path() + "/server", /*cluster=*/false);
    ASSERT_TRUE(server_) << "redis-server did not start (is it installed? tools/setup.sh installs it)";
    client_ = MakeClient({server_->endpoint()});
    ASSERT_TRUE(client_);
  }
  ScopedTempDir tmp_{"dhs-redis-"};
  std::unique_ptr<RedisServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(OneServer, RoundTripWithTtl) {
  std::vector<std::string> keys, values;
  std::vector<SetItem> items;
  for (int i = 0; i < 20; ++i) {
    keys.push_back("dhs1:test:p:" + std::to_string(i));
    values.push_back(Value(keys.back(), 1000 + 4096 * (i % 3)));
  }
  for (int i = 0; i < 20; ++i) items.push_back(SetItem{keys[i], values[i], 60'000});
  for (const absl::Status& s : client_->Set(items, kBatch)) ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(client_->cluster_mode());
  EXPECT_EQ(client_->MasterOf(KeySlot(keys[3])), server_->endpoint());
  std::vector<std::string> ask = keys;
  ask.push_back("dhs1:test:p:absent");
  const std::vector<GetResult> got = client_->Get(ask, kBatch);
  ASSERT_EQ(got.size(), 21u);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(got[i].hit()) << i << " " << got[i].status;
    EXPECT_EQ(*got[i].value, values[i]) << i;
  }
  EXPECT_TRUE(got[20].status.ok());
  EXPECT_FALSE(got[20].value);
  const int64_t pttl = std::stoll(server_->Cli("pttl dhs1:test:p:0"));
  EXPECT_GT(pttl, 50'000);
  EXPECT_LE(pttl, 60'000);
  EXPECT_EQ(client_->counters().get_hits, 20u);
  EXPECT_EQ(client_->counters().get_misses, 1u);
  EXPECT_EQ(client_->counters().set_ok, 20u);
  EXPECT_TRUE(client_->Ping(kBatch).ok());
}

// Host-page-sized values: 24 values of 512 KiB in one batch (12 MiB through one pipeline: many partial writes and
// reads of the non-blocking loop).
TEST_F(OneServer, LargeValuesInOneBatch) {
  std::vector<std::string> keys, values;
  std::vector<SetItem> items;
  for (int i = 0; i < 24; ++i) {
    keys.push_back("big:" + std::to_string(i));
    values.push_back(Value(keys.back(), 512 * 1024 + i));
  }
  for (int i = 0; i < 24; ++i) items.push_back(SetItem{keys[i], values[i], 0});
  for (const absl::Status& s : client_->Set(items, std::chrono::seconds(20))) ASSERT_TRUE(s.ok()) << s;
  const std::vector<GetResult> got = client_->Get(keys, std::chrono::seconds(20));
  for (int i = 0; i < 24; ++i) {
    ASSERT_TRUE(got[i].hit()) << got[i].status;
    ASSERT_EQ(*got[i].value, values[i]) << i;
  }
  uint64_t bytes = 0;
  for (const std::string& v : values) bytes += v.size();
  EXPECT_EQ(client_->counters().bytes_written, bytes);
  EXPECT_EQ(client_->counters().bytes_read, bytes);
  EXPECT_EQ(client_->counters().connects, 1u);  // one connection, reused
}

TEST_F(OneServer, AStoppedServerIsATimeoutWithinTheDeadline) {
  const std::string key = "k";
  ASSERT_TRUE(client_->Set(std::vector<SetItem>{{key, "v", 0}}, kBatch)[0].ok());
  ASSERT_EQ(server_->Signal(SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<GetResult> got = client_->Get(std::vector<std::string>{key, "other"}, milliseconds(150));
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(got[0].status.code(), absl::StatusCode::kDeadlineExceeded) << got[0].status;
  EXPECT_EQ(got[1].status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(took, milliseconds(2000));  // bounded by the deadline (never a hang); generous for a loaded machine
  // A fresh connection (connect succeeds: the kernel accepts for a stopped process) times out too.
  const std::vector<absl::Status> set = client_->Set(std::vector<SetItem>{{"k2", "v", 0}}, milliseconds(100));
  EXPECT_EQ(set[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(client_->counters().timeouts, 3u);
  ASSERT_EQ(server_->Signal(SIGCONT), 0);
  const std::vector<GetResult> again = client_->Get(std::vector<std::string>{key}, kBatch);
  ASSERT_TRUE(again[0].hit()) << again[0].status;
  EXPECT_EQ(*again[0].value, "v");
}

TEST_F(OneServer, RestartedEmptyIsAMissNotAnError) {
  ASSERT_TRUE(client_->Set(std::vector<SetItem>{{"a", "1", 0}}, kBatch)[0].ok());
  server_->Kill();
  const std::vector<GetResult> down = client_->Get(std::vector<std::string>{"a"}, milliseconds(300));
  EXPECT_EQ(down[0].status.code(), absl::StatusCode::kUnavailable) << down[0].status;  // refused: counted error
  ASSERT_TRUE(server_->Restart());
  // The client's connection died with the old server: it reconnects inside the batch.
  const std::vector<GetResult> got = client_->Get(std::vector<std::string>{"a"}, kBatch);
  EXPECT_TRUE(got[0].status.ok()) << got[0].status;
  EXPECT_FALSE(got[0].value);
  ASSERT_TRUE(client_->Set(std::vector<SetItem>{{"a", "2", 0}}, kBatch)[0].ok());
  EXPECT_EQ(*client_->Get(std::vector<std::string>{"a"}, kBatch)[0].value, "2");
}

TEST_F(OneServer, ADeadServerWithALiveSeedIsServedByTheSeed) {
  // Seeds: a dead port first, then the server: the map comes from the live one.
  std::unique_ptr<Client> c = MakeClient({Endpoint{"127.0.0.1", testing::FreeLoopbackPort()}, server_->endpoint()});
  ASSERT_TRUE(c->Set(std::vector<SetItem>{{"x", "y", 0}}, kBatch)[0].ok());
  EXPECT_EQ(c->MasterOf(0), server_->endpoint());
}

// ---- Redis Cluster: 3 masters, 3 replicas ----

class Cluster : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = RedisCluster::Start(3, 1);
    ASSERT_TRUE(cluster_) << "the 3-master cluster did not form";
    client_ = MakeClient(cluster_->Seeds());
    ASSERT_TRUE(client_);
    ASSERT_TRUE(client_->RefreshMap(kBatch).ok());
    ASSERT_TRUE(client_->cluster_mode());
  }
  RedisServer* MasterOfKey(const std::string& key) {
    auto m = client_->MasterOf(KeySlot(key));
    return m ? cluster_->ByPort(m->port) : nullptr;
  }
  std::string NodeId(RedisServer* s) { return s->Cli("cluster myid"); }
  std::vector<RedisServer*> Masters() {
    std::vector<RedisServer*> out;
    for (auto& s : cluster_->nodes()) {
      if (s->Cli("role").rfind("master", 0) == 0) out.push_back(s.get());
    }
    return out;
  }
  std::unique_ptr<RedisCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(Cluster, RoutingAgreesWithClusterKeyslotAndSpreadsOverTheMasters) {
  std::vector<std::string> keys;
  std::vector<std::string> values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("dhs1:0000000000000001:p:" + std::to_string(i * 7919));
    values.push_back(Value(keys.back(), 64 + i));
  }
  // The slot the server computes equals ours (a sample: one redis-cli run each).
  for (int i = 0; i < 300; i += 15) {
    EXPECT_EQ(cluster_->nodes()[0]->Cli("cluster keyslot " + keys[i]), std::to_string(KeySlot(keys[i]))) << keys[i];
  }
  EXPECT_EQ(cluster_->nodes()[0]->Cli("cluster keyslot '{abc}x'"), std::to_string(KeySlot("{abc}x")));
  std::vector<SetItem> items;
  for (int i = 0; i < 300; ++i) items.push_back(SetItem{keys[i], values[i], 0});
  for (const absl::Status& s : client_->Set(items, kBatch)) ASSERT_TRUE(s.ok()) << s;
  const std::vector<GetResult> got = client_->Get(keys, kBatch);
  for (int i = 0; i < 300; ++i) {
    ASSERT_TRUE(got[i].hit()) << i << " " << got[i].status;
    EXPECT_EQ(*got[i].value, values[i]);
  }
  EXPECT_EQ(client_->counters().moved, 0u);  // the map was right: no redirection
  // Each key is on the master the map names (asked on that node directly), and every master holds some.
  std::map<uint16_t, int> per_master;
  for (int i = 0; i < 300; ++i) ++per_master[client_->MasterOf(KeySlot(keys[i]))->port];
  const std::vector<RedisServer*> masters = Masters();
  ASSERT_EQ(masters.size(), 3u);
  int total = 0;
  for (RedisServer* m : masters) {
    const int dbsize = std::stoi(m->Cli("dbsize"));
    EXPECT_EQ(dbsize, per_master[m->port()]) << m->port();
    EXPECT_GT(dbsize, 50) << m->port();
    total += dbsize;
  }
  EXPECT_EQ(total, 300);
  // The masters at least (redis 7.0.15's CLUSTER SLOTS may leave replicas out for a while after they joined).
  EXPECT_GE(client_->KnownNodes().size(), 3u);
}

TEST_F(Cluster, MovedAfterASlotMovesToAnotherMaster) {
  const std::string key = "{moved}page";
  ASSERT_TRUE(client_->Set(std::vector<SetItem>{{key, "before", 0}}, kBatch)[0].ok());
  const uint32_t slot = KeySlot(key);
  RedisServer* from = MasterOfKey(key);
  ASSERT_TRUE(from);
  RedisServer* to = nullptr;
  for (RedisServer* m : Masters()) {
    if (m != from) to = m;
  }
  ASSERT_TRUE(to);
  const std::string s = std::to_string(slot), from_id = NodeId(from), to_id = NodeId(to);
  ASSERT_EQ(to->Cli("cluster setslot " + s + " importing " + from_id), "OK");
  ASSERT_EQ(from->Cli("cluster setslot " + s + " migrating " + to_id), "OK");
  ASSERT_EQ(from->Cli(absl::StrCat("migrate 127.0.0.1 ", to->port(), " '' 0 5000 keys '", key, "'")), "OK");
  ASSERT_EQ(to->Cli("cluster setslot " + s + " node " + to_id), "OK");
  ASSERT_EQ(from->Cli("cluster setslot " + s + " node " + to_id), "OK");
  for (RedisServer* m : Masters()) m->Cli("cluster setslot " + s + " node " + to_id);
  // The client's map still names `from`: MOVED, the map refreshed, the value read from `to`.
  EXPECT_EQ(client_->MasterOf(slot)->port, from->port());
  const std::vector<GetResult> got = client_->Get(std::vector<std::string>{key}, kBatch);
  ASSERT_TRUE(got[0].hit()) << got[0].status;
  EXPECT_EQ(*got[0].value, "before");
  EXPECT_GE(client_->counters().moved, 1u);
  EXPECT_EQ(client_->MasterOf(slot)->port, to->port());
  // A write of the moved slot goes straight to its new master.
  const uint64_t moved = client_->counters().moved;
  ASSERT_TRUE(client_->Set(std::vector<SetItem>{{"{moved}other", "x", 0}}, kBatch)[0].ok());
  EXPECT_EQ(client_->counters().moved, moved);
  EXPECT_EQ(to->Cli("exists {moved}other"), "1");
}

TEST_F(Cluster, AskDuringAMigratingSlot) {
  const std::string stays = "{ask}stays", moves = "{ask}moves", absent = "{ask}absent", fresh = "{ask}fresh";
  ASSERT_TRUE(client_->Set(std::vector<SetItem>{{stays, "s", 0}, {moves, "m", 0}}, kBatch)[0].ok());
  const uint32_t slot = KeySlot(stays);
  RedisServer* from = MasterOfKey(stays);
  RedisServer* to = nullptr;
  for (RedisServer* m : Masters()) {
    if (m != from) to = m;
  }
  ASSERT_TRUE(from && to);
  const std::string s = std::to_string(slot);
  ASSERT_EQ(to->Cli("cluster setslot " + s + " importing " + NodeId(from)), "OK");
  ASSERT_EQ(from->Cli("cluster setslot " + s + " migrating " + NodeId(to)), "OK");
  ASSERT_EQ(from->Cli(absl::StrCat("migrate 127.0.0.1 ", to->port(), " '' 0 5000 keys '", moves, "'")), "OK");
  // `stays` is answered by `from`; `moves` and `absent` get ASK -> ASKING + GET on `to`.
  const std::vector<GetResult> got = client_->Get(std::vector<std::string>{stays, moves, absent}, kBatch);
  ASSERT_TRUE(got[0].hit()) << got[0].status;
  EXPECT_EQ(*got[0].value, "s");
  ASSERT_TRUE(got[1].hit()) << got[1].status;
  EXPECT_EQ(*got[1].value, "m");
  EXPECT_TRUE(got[2].status.ok()) << got[2].status;
  EXPECT_FALSE(got[2].value);
  EXPECT_EQ(client_->counters().ask, 2u);
  EXPECT_EQ(client_->counters().moved, 0u);
  EXPECT_EQ(client_->MasterOf(slot)->port, from->port());  // ASK does not change the map
  // A new key of a migrating slot is written on the target (ASK), readable there with ASKING.
  ASSERT_TRUE(client_->Set(std::vector<SetItem>{{fresh, "f", 0}}, kBatch)[0].ok());
  EXPECT_EQ(from->Cli("exists " + fresh).rfind("ASK ", 0), 0u);  // not on `from`: it redirects
  EXPECT_EQ(testing::RunCapture(absl::StrCat("printf 'ASKING\\nEXISTS ", fresh, "\\n' | ",
                                             testing::FindProgram("redis-cli"), " -h 127.0.0.1 -p ", to->port())),
            "OK\n1");  // on `to`
  const std::vector<GetResult> again = client_->Get(std::vector<std::string>{fresh}, kBatch);
  ASSERT_TRUE(again[0].hit()) << again[0].status;
  EXPECT_EQ(*again[0].value, "f");
}

// One stopped master costs its own keys (DeadlineExceeded at the batch's deadline), never the keys of the others: the
// masters are read in parallel.
TEST_F(Cluster, AStoppedMasterCostsOnlyItsKeys) {
  std::vector<std::string> keys;
  std::vector<SetItem> items;
  for (int i = 0; i < 60; ++i) keys.push_back("stop:" + std::to_string(i));
  for (const std::string& k : keys) items.push_back(SetItem{k, k, 0});
  for (const absl::Status& s : client_->Set(items, kBatch)) ASSERT_TRUE(s.ok()) << s;
  RedisServer* stopped = MasterOfKey(keys[0]);
  ASSERT_TRUE(stopped);
  ASSERT_EQ(stopped->Signal(SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<GetResult> got = client_->Get(keys, milliseconds(300));
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(stopped->Signal(SIGCONT), 0);
  int timed_out = 0, hits = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool on_stopped = client_->MasterOf(KeySlot(keys[i]))->port == stopped->port();
    if (on_stopped) {
      EXPECT_EQ(got[i].status.code(), absl::StatusCode::kDeadlineExceeded) << keys[i];
      ++timed_out;
    } else {
      ASSERT_TRUE(got[i].hit()) << keys[i] << " " << got[i].status;
      EXPECT_EQ(*got[i].value, keys[i]);
      ++hits;
    }
  }
  EXPECT_GT(timed_out, 0);
  EXPECT_GT(hits, 0);
  EXPECT_EQ(client_->counters().timeouts, static_cast<uint64_t>(timed_out));
  EXPECT_LT(took, milliseconds(3000));  // bounded by the deadline, never a hang (generous for a loaded machine)
}

TEST_F(Cluster, AKilledMasterIsReplacedByItsReplicaAndTheValueSurvives) {
  const std::string key = "{failover}page";
  const std::string value = Value(key, 5000);
  RedisServer* master = MasterOfKey(key);
  ASSERT_TRUE(master);
  // The client's first seed is the master that will die: the refresh must come from the others.
  std::vector<Endpoint> seeds = {master->endpoint()};
  for (const Endpoint& e : cluster_->Seeds()) {
    if (!(e == master->endpoint())) seeds.push_back(e);
  }
  client_ = MakeClient(seeds);
  ASSERT_TRUE(client_->Set(std::vector<SetItem>{{key, value, 0}}, kBatch)[0].ok());
  auto acked = client_->WaitReplicas(key, 1, milliseconds(2000));
  ASSERT_TRUE(acked.ok()) << acked.status();
  ASSERT_EQ(*acked, 1);  // the replica has the write before the kill
  const uint16_t dead = master->port();
  master->Kill();
  // Until the replica is promoted a batch is a counted error (refused), never a hang; then the value is read again.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::optional<std::string> read;
  uint64_t failed_batches = 0;
  while (!read && std::chrono::steady_clock::now() < until) {
    const std::vector<GetResult> got = client_->Get(std::vector<std::string>{key}, milliseconds(500));
    if (got[0].hit()) {
      read = got[0].value;
    } else {
      EXPECT_FALSE(got[0].status.ok() && !got[0].value) << "a miss: the replica lost the value";
      ++failed_batches;
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  ASSERT_TRUE(read) << "no replica took over within 20 s";
  EXPECT_EQ(*read, value);
  EXPECT_NE(client_->MasterOf(KeySlot(key))->port, dead);
  EXPECT_GE(failed_batches, 1u);
  EXPECT_EQ(client_->counters().get_errors, failed_batches);
}

}  // namespace
}  // namespace dhs::redis
