// common/local_redis.cc: see local_redis.h.
#include "common/local_redis.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spawn.h"

namespace dhs {

std::string FindProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string full = dir + "/" + name;
    if (::access(full.c_str(), X_OK) == 0) return full;
  }
  return "";
}

uint16_t FreeLoopbackPort() {
  for (int attempt = 0; attempt < 50; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
    const int bus = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in b = a;
    b.sin_port = htons(static_cast<uint16_t>(port + 10000));
    const bool bus_free = bus >= 0 && ::bind(bus, reinterpret_cast<sockaddr*>(&b), sizeof b) == 0;
    if (bus >= 0) ::close(bus);
    if (bus_free) return port;
  }
  return 0;
}

std::string RunCapture(const std::string& command) {
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

absl::StatusOr<std::unique_ptr<LocalRedisServer>> LocalRedisServer::Start(const std::string& dir, bool cluster,
                                                                           int node_timeout_ms) {
  if (FindProgram("redis-server").empty() || FindProgram("redis-cli").empty()) {
    return absl::NotFoundError("redis-server or redis-cli not on PATH (Debian: apt-get install redis-server)");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  for (int attempt = 0; attempt < 5; ++attempt) {
    const uint16_t port = FreeLoopbackPort();
    if (port == 0) continue;
    auto server = std::unique_ptr<LocalRedisServer>(new LocalRedisServer(dir, port, cluster, node_timeout_ms));
    if (server->Launch()) return server;
  }
  return absl::UnavailableError(absl::StrCat("redis-server did not start on a free loopback port after 5 tries; see ",
                                             dir, "/redis.log"));
}

LocalRedisServer::~LocalRedisServer() { Kill(); }

std::string LocalRedisServer::url() const { return absl::StrCat("redis://127.0.0.1:", port_); }

int LocalRedisServer::Signal(int signal) { return pid_ > 0 ? ::kill(pid_, signal) : -1; }

void LocalRedisServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGCONT);
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

absl::Status LocalRedisServer::Restart() {
  Kill();
  if (!Launch()) return absl::UnavailableError(absl::StrCat("redis-server did not restart on port ", port_));
  return absl::OkStatus();
}

std::string LocalRedisServer::Cli(const std::string& args) const {
  return RunCapture(absl::StrCat(FindProgram("redis-cli"), " -h 127.0.0.1 -p ", port_, " ", args));
}

bool LocalRedisServer::Launch() {
  std::vector<std::string> args = {"--port", std::to_string(port_), "--bind", "127.0.0.1", "--dir", dir_,
                                   "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no",
                                   "--logfile", ""};
  if (cluster_) {
    std::filesystem::remove(dir_ + "/nodes.conf");
    for (const std::string& a : {std::string("--cluster-enabled"), std::string("yes"),
                                 std::string("--cluster-config-file"), dir_ + "/nodes.conf",
                                 std::string("--cluster-node-timeout"), std::to_string(node_timeout_ms_),
                                 // a replica may always take over, and its first sync starts at once
                                 std::string("--cluster-replica-validity-factor"), std::string("0"),
                                 std::string("--repl-diskless-sync-delay"), std::string("0")}) {
      args.push_back(a);
    }
  }
  SpawnOptions spawn;
  spawn.log = dir_ + "/redis.log";
  absl::StatusOr<pid_t> pid = SpawnChild(FindProgram("redis-server"), args, spawn);
  if (!pid.ok()) return false;
  pid_ = *pid;
  // Ready when it answers PING; a server that exits (e.g. the port was taken meanwhile) is a failed launch.
  for (int i = 0; i < 500; ++i) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    if (Cli("ping") == "PONG") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Kill();
  return false;
}

absl::StatusOr<std::unique_ptr<LocalRedisCluster>> LocalRedisCluster::Start(const std::string& dir, int masters,
                                                                            int replicas, int node_timeout_ms) {
  auto c = std::unique_ptr<LocalRedisCluster>(new LocalRedisCluster());
  const int n = masters * (1 + replicas);
  for (int i = 0; i < n; ++i) {
    auto s = LocalRedisServer::Start(absl::StrCat(dir, "/node", i), /*cluster=*/true, node_timeout_ms);
    if (!s.ok()) return s.status();  // c's servers are killed by its destructor
    c->nodes_.push_back(std::move(*s));
  }
  const std::string create = RunCapture(absl::StrCat(FindProgram("redis-cli"), " --cluster create ",
                                                     absl::StrJoin(c->Addresses(), " "), " --cluster-replicas ",
                                                     replicas, " --cluster-yes"));
  if (create.find("All 16384 slots covered") == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("redis-cli --cluster create failed: ", create));
  }
  if (!c->WaitHealthy(n, masters * replicas, std::chrono::seconds(20))) {
    return absl::UnavailableError("the Redis Cluster did not become healthy within 20 s");
  }
  return c;
}

std::vector<std::string> LocalRedisCluster::Addresses() const {
  std::vector<std::string> out;
  for (const auto& s : nodes_) out.push_back(absl::StrCat("127.0.0.1:", s->port()));
  return out;
}

std::string LocalRedisCluster::SeedUrl() const { return "redis://" + absl::StrJoin(Addresses(), ","); }

LocalRedisServer* LocalRedisCluster::ByPort(uint16_t port) {
  for (auto& s : nodes_) {
    if (s->port() == port) return s.get();
  }
  return nullptr;
}

bool LocalRedisCluster::WaitHealthy(int known, int replicas, std::chrono::milliseconds timeout,
                                    const LocalRedisServer* skip) {
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

void LocalRedisCluster::Kill() {
  for (auto& s : nodes_) s->Kill();
}

}  // namespace dhs
