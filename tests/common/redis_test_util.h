// tests/common/redis_test_util.h: real Redis servers for the cluster tier's tests (issue 26): one redis-server on a free
// loopback port in its own private directory, or a Redis Cluster of masters with replicas built by
// `redis-cli --cluster create`. The servers are common/local_redis.h's (the code dhs-replay --cluster-store local uses
// too; this header only adds the tests' types: redis::Endpoint, nullptr for a failed start, a private temporary
// directory for a cluster). Every server is SIGKILLed and reaped at teardown and its directory removed.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/local_redis.h"
#include "common/redis_client.h"
#include "tests/common/test_util.h"

namespace dhs::testing {

using ::dhs::FindProgram;
using ::dhs::FreeLoopbackPort;
using ::dhs::RunCapture;

// One redis-server child (LocalRedisServer): no persistence, loopback only, its log and files in `dir`.
class RedisServer {
 public:
  // Starts a server in `dir` (created): `cluster` adds cluster mode (nodes.conf in dir, node timeout
  // `node_timeout_ms`). Returns nullptr when no port could be had after a few tries (each failure's log is kept).
  static std::unique_ptr<RedisServer> Start(const std::string& dir, bool cluster, int node_timeout_ms = 1000) {
    auto s = LocalRedisServer::Start(dir, cluster, node_timeout_ms);
    if (!s.ok()) return nullptr;
    auto out = std::make_unique<RedisServer>(s->get());
    out->owned_ = std::move(*s);
    return out;
  }
  explicit RedisServer(LocalRedisServer* server) : server_(server) {}  // not owned (a LocalRedisCluster's)

  uint16_t port() const { return server_->port(); }
  redis::Endpoint endpoint() const { return redis::Endpoint{"127.0.0.1", server_->port()}; }
  pid_t pid() const { return server_->pid(); }
  const std::string& dir() const { return server_->dir(); }
  int Signal(int signal) { return server_->Signal(signal); }
  // SIGKILL and reap (a stopped server is continued first so that it dies at once).
  void Kill() { server_->Kill(); }
  // Starts again on the same port and directory, empty (no persistence); false when it does not answer.
  bool Restart() { return server_->Restart().ok(); }
  // `redis-cli -h 127.0.0.1 -p PORT args...` (args are passed to a shell: quote them), its stdout.
  std::string Cli(const std::string& args) const { return server_->Cli(args); }
  LocalRedisServer& local() const { return *server_; }

 private:
  LocalRedisServer* server_;
  std::unique_ptr<LocalRedisServer> owned_;
};

// A Redis Cluster of `masters` masters with `replicas` replicas each (LocalRedisCluster), every node in its own
// subdirectory of one private temporary directory. Ready when every node sees cluster_state:ok, all nodes and every
// replica as one, and every replica's link to its master is up.
class RedisCluster {
 public:
  static std::unique_ptr<RedisCluster> Start(int masters = 3, int replicas = 1) {
    auto c = std::unique_ptr<RedisCluster>(new RedisCluster());
    if (c->tmp_.path().empty()) return nullptr;
    auto cluster = LocalRedisCluster::Start(c->tmp_.path(), masters, replicas);
    if (!cluster.ok()) return nullptr;
    c->cluster_ = std::move(*cluster);
    for (auto& s : c->cluster_->nodes()) c->nodes_.push_back(std::make_unique<RedisServer>(s.get()));
    return c;
  }

  std::vector<std::unique_ptr<RedisServer>>& nodes() { return nodes_; }
  std::vector<redis::Endpoint> Seeds() const {
    std::vector<redis::Endpoint> out;
    for (const auto& s : nodes_) out.push_back(s->endpoint());
    return out;
  }
  RedisServer* ByPort(uint16_t port) {
    for (auto& s : nodes_) {
      if (s->port() == port) return s.get();
    }
    return nullptr;
  }
  // LocalRedisCluster::WaitHealthy.
  bool WaitHealthy(int known, int replicas, std::chrono::milliseconds timeout, const RedisServer* skip = nullptr) {
    return cluster_->WaitHealthy(known, replicas, timeout, skip ? &skip->local() : nullptr);
  }

 private:
  RedisCluster() : tmp_("dhs-redis-") {}
  ScopedTempDir tmp_;  // declared first: removed after the servers are gone
  std::unique_ptr<LocalRedisCluster> cluster_;
  std::vector<std::unique_ptr<RedisServer>> nodes_;  // views of cluster_'s servers
};

}  // namespace dhs::testing
