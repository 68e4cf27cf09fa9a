// tests/common/redis_test_util.h: real Redis servers for the cluster tier's tests (issue 26): one redis-server on a free
// loopback port in its own private directory, or a Redis Cluster of masters with replicas built by
// `redis-cli --cluster create`. Never a fixed port: a port is taken from the kernel (bind to port 0) with its cluster
// bus port (port + 10000) free too, and a start that loses a race for it is retried on another. Every server is
// SIGKILLed and reaped at teardown and its directory removed (no process, file or temp dir left behind).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/redis_client.h"
#include "tests/common/test_util.h"

namespace dhs::testing {

inline std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string full = dir + "/" + name;
    if (::access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

// A loopback TCP port that is free now, with port + 10000 free too (a cluster node's bus port); 0 when none found.
inline uint16_t FreeLoopbackPort() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      if (fd >= 0) ::close(fd);
      continue;
    }
    const uint16_t port = ntohs(a.sin_port);
    ::close(fd);
    if (port > 55535) continue;
    const int bus = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in b = a;
    b.sin_port = htons(static_cast<uint16_t>(port + 10000));
    const bool bus_free = bus >= 0 && ::bind(bus, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
    if (bus >= 0) ::close(bus);
    if (bus_free) return port;
  }
  return 0;
}

// Runs a shell command; returns its stdout (stderr discarded), trailing newlines removed.
inline std::string RunCapture(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// One redis-server child: no persistence, loopback only, its log and files in `dir`.
class RedisServer {
 public:
  // Starts a server in `dir` (created): `cluster` adds cluster mode (nodes.conf in dir, node timeout
  // `node_timeout_ms`). Returns nullptr when no port could be had after a few tries (each failure's log is kept).
  static std::unique_ptr<RedisServer> Start(const std::string& dir, bool cluster, int node_timeout_ms = 1000) {
    std::filesystem::create_directories(dir);
    for (int attempt = 0; attempt < 5; ++attempt) {
      const uint16_t port = FreeLoopbackPort();
      if (port == 0) continue;
      auto server = std::unique_ptr<RedisServer>(new RedisServer(dir, port, cluster, node_timeout_ms));
      if (server->Launch()) return server;
    }
    return nullptr;
  }

  ~RedisServer() { Kill(); }

  uint16_t port() const { return port_; }
  redis::Endpoint endpoint() const { return redis::Endpoint{"127.0.0.1", port_}; }
  pid_t pid() const { return child_ ? child_->pid() : -1; }
  const std::string& dir() const { return dir_; }
  int Signal(int signal) { return child_ ? child_->Signal(signal) : -1; }
  // SIGKILL and reap (a stopped server is continued first so that it dies at once).
  void Kill() {
    if (child_) {
      child_->Signal(SIGCONT);
      child_.reset();  // ChildProcess SIGKILLs and reaps
    }
  }
  // Starts again on the same port and directory, empty (no persistence); false when it does not answer.
  bool Restart() {
    Kill();
    return Launch();
  }
  // `redis-cli -h 127.0.0.1 -p PORT args...` (args are passed to a shell: quote them), its stdout.
  std::string Cli(const std::string& args) const {
    return RunCapture(absl::StrCat(FindProgram("redis-cli"), " -h 127.0.0.1 -p ", port_, " ", args));
  }

 private:
  RedisServer(std::string dir, uint16_t port, bool cluster, int node_timeout_ms)
      : dir_(std::move(dir)), port_(port), cluster_(cluster), node_timeout_ms_(node_timeout_ms) {}

  bool Launch() {
    std::vector<std::string> args = {FindProgram("redis-server"), "--port", std::to_string(port_), "--bind",
                                     "127.0.0.1", "--dir", dir_, "--save", "", "--appendonly", "no",
                                     "--daemonize", "no", "--protected-mode", "no", "--logfile", ""};
    if (cluster_) {
      for (const char* a : {"--cluster-enabled", "yes", "--cluster-config-file"}) args.push_back(a);
      std::filesystem::remove(dir_ + "/nodes.conf");
      args.push_back(dir_ + "/nodes.conf");
      args.push_back("--cluster-node-timeout");
      args.push_back(std::to_string(node_timeout_ms_));
      // A replica may always take over (however long it has been apart from its master) and
      // the tests' failovers are quick.
      args.push_back("--cluster-replica-validity-factor");
      args.push_back("0");
      // A replica's first sync starts at once (the default waits 5 s for more replicas to join a diskless sync).
      args.push_back("--repl-diskless-sync-delay");
      args.push_back("0");
    }
    child_ = std::make_unique<ChildProcess>(args, dir_ + "/redis.log");
    if (!child_->ok()) {
      child_.reset();
      return false;
    }
    // Ready when it answers PING; a server that exits (e.g. the port was taken meanwhile) is a failed launch.
    for (int i = 0; i < 500; ++i) {
      if (child_->Exited()) {
        child_.reset();
        return false;
      }
      if (Cli("ping") == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    child_.reset();
    return false;
  }

  std::string dir_;
  uint16_t port_;
  bool cluster_;
  int node_timeout_ms_;
  std::unique_ptr<ChildProcess> child_;
};

// A Redis Cluster of `masters` masters with `replicas` replicas each (redis-cli --cluster create), every node in its
// own subdirectory of one private temporary directory. Ready when every node sees cluster_state:ok, all nodes and
// every replica as one, and every replica's link to its master is up.
class RedisCluster {
 public:
  static std::unique_ptr<RedisCluster> Start(int masters = 3, int replicas = 1) {
    auto c = std::unique_ptr<RedisCluster>(new RedisCluster());
    if (c->tmp_.path().empty()) return nullptr;
    const int n = masters * (1 + replicas);
    std::vector<std::string> addrs;
    for (int i = 0; i < n; ++i) {
      auto s = RedisServer::Start(c->tmp_.path() + "/node" + std::to_string(i), /*cluster=*/true);
      if (!s) return nullptr;
      addrs.push_back(absl::StrCat("127.0.0.1:", s->port()));
      c->nodes_.push_back(std::move(s));
    }
    const std::string create = RunCapture(absl::StrCat(FindProgram("redis-cli"), " --cluster create ",
                                                       absl::StrJoin(addrs, " "), " --cluster-replicas ", replicas,
                                                       " --cluster-yes"));
    if (create.find("All 16384 slots covered") == std::string::npos) return nullptr;
    if (!c->WaitHealthy(n, masters * replicas, std::chrono::seconds(20))) return nullptr;
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
  // Waits until every live node (all but `skip`) reports cluster_state:ok and `known` nodes, and `replicas` of them
  // are replicas whose link to their master is up; false after `timeout`.
  bool WaitHealthy(int known, int replicas, std::chrono::milliseconds timeout, const RedisServer* skip = nullptr) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      bool ok = true;
      int linked = 0;
      for (const auto& s : nodes_) {
        if (s.get() == skip) continue;
        const std::string info = s->Cli("cluster info");
        ok &= info.find("cluster_state:ok") != std::string::npos &&
              info.find(absl::StrCat("cluster_known_nodes:", known)) != std::string::npos;
        const std::string repl = s->Cli("info replication");
        linked += repl.find("role:slave") != std::string::npos &&
                  repl.find("master_link_status:up") != std::string::npos;
        // Its view of the others (gossip): every replica known as one (CLUSTER SLOTS lists only those).
        int seen_replicas = 0;
        std::stringstream lines(s->Cli("cluster nodes"));
        for (std::string line; std::getline(lines, line);) {
          std::stringstream fields(line);
          std::string id, addr, flags;
          fields >> id >> addr >> flags;
          seen_replicas += flags.find("slave") != std::string::npos && flags.find("fail") == std::string::npos;
        }
        ok &= seen_replicas == replicas;
      }
      if (ok && linked == replicas) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  RedisCluster() : tmp_("dhs-redis-") {}
  ScopedTempDir tmp_;  // declared first: removed after the servers are gone
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

}  // namespace dhs::testing
