// common/local_redis.h: a real Redis on this machine, started by the project itself (issue 26): one redis-server on a
// free loopback port in its own directory, or a Redis Cluster of masters (and replicas) built with
// `redis-cli --cluster create`. dhs-replay --cluster-store local|local-cluster starts one for its nodes; the cluster
// tier's tests (tests/common/redis_test_util.h) start theirs with the same code.
//
// Servers: Debian's redis-server (found on PATH), `--bind 127.0.0.1`, no persistence (`--save "" --appendonly no`),
// `--dir` and the cluster's nodes.conf in the server's directory, its log in DIR/redis.log. Never a fixed port: a port
// is taken from the kernel (bind to port 0) with its cluster bus port (port + 10000) free too, and a start that loses a
// race for it is retried on another. A server is a child started with common/spawn.h (it gets SIGTERM when the
// starting thread dies: a killed dhs-replay leaves no redis-server behind); Kill() SIGKILLs and reaps it.
//
// Thread-safety: one thread per object. Kill() may be called from another thread only when nothing else uses it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dhs {

// The executable `name` on $PATH (or /usr/bin:/bin); "" when none.
std::string FindProgram(const std::string& name);
// A loopback TCP port free now whose port + 10000 (a cluster node's bus port) is free too; 0 when none found.
uint16_t FreeLoopbackPort();
// Runs `command` with /bin/sh; its stdout (stderr discarded), trailing newlines removed.
std::string RunCapture(const std::string& command);

class LocalRedisServer {
 public:
  // Starts a server in `dir` (created 0700 if missing): `cluster` adds cluster mode (node timeout `node_timeout_ms`,
  // replicas may always take over, a replica's first sync starts at once). Ready when it answers PING.
  // Errors: NotFound (no redis-server / redis-cli on PATH), Unavailable (no port after 5 tries; the last log is kept
  // in `dir`).
  static absl::StatusOr<std::unique_ptr<LocalRedisServer>> Start(const std::string& dir, bool cluster,
                                                                 int node_timeout_ms = 1000);
  ~LocalRedisServer();  // Kill()
  LocalRedisServer(const LocalRedisServer&) = delete;
  LocalRedisServer& operator=(const LocalRedisServer&) = delete;

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  std::string url() const;  // "redis://127.0.0.1:PORT"
  int Signal(int signal);   // kill(2) of the server (-1 when not running)
  // SIGCONT (a stopped server dies at once), SIGKILL, reap. Idempotent.
  void Kill();
  // Starts again on the same port and directory, empty (no persistence). Unavailable when it does not answer.
  absl::Status Restart();
  // `redis-cli -h 127.0.0.1 -p PORT args...` (args go through a shell: quote them); its stdout.
  std::string Cli(const std::string& args) const;

 private:
  LocalRedisServer(std::string dir, uint16_t port, bool cluster, int node_timeout_ms)
      : dir_(std::move(dir)), port_(port), cluster_(cluster), node_timeout_ms_(node_timeout_ms) {}
  bool Launch();

  std::string dir_;
  uint16_t port_;
  bool cluster_;
  int node_timeout_ms_;
  pid_t pid_ = -1;
};

// A Redis Cluster: masters * (1 + replicas) servers, server i in DIR/node<i>, joined by `redis-cli --cluster create`.
class LocalRedisCluster {
 public:
  // Ready when every node sees cluster_state:ok and all nodes, and every replica's link to its master is up
  // (WaitHealthy, 20 s). Errors: LocalRedisServer::Start's; Unavailable when the create or the wait fails (every
  // server started is killed again).
  static absl::StatusOr<std::unique_ptr<LocalRedisCluster>> Start(const std::string& dir, int masters = 3,
                                                                  int replicas = 1, int node_timeout_ms = 1000);
  std::vector<std::unique_ptr<LocalRedisServer>>& nodes() { return nodes_; }
  // "127.0.0.1:PORT" of every node, in node order.
  std::vector<std::string> Addresses() const;
  // The seed list memd's --cluster-store takes: "redis://127.0.0.1:P1,127.0.0.1:P2,..." (every node).
  std::string SeedUrl() const;
  LocalRedisServer* ByPort(uint16_t port);
  // Every live node (all but `skip`) reports cluster_state:ok and `known` nodes, and `replicas` of them are replicas
  // linked to their master, each node seeing them as replicas; false after `timeout`.
  bool WaitHealthy(int known, int replicas, std::chrono::milliseconds timeout, const LocalRedisServer* skip = nullptr);
  void Kill();  // every server; idempotent

 private:
  LocalRedisCluster() = default;
  std::vector<std::unique_ptr<LocalRedisServer>> nodes_;
};

}  // namespace dhs
