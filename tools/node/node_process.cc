#include "tools/node/node_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/protocol.h"
#include "common/sd_notify.h"
#include "common/spawn.h"
#include "common/transport.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tools/node/supervisor.h"

extern char** environ;

namespace dhs::node {
namespace {

constexpr char kSender[] = "dhs-node";

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One request/reply on a fresh connection to <run_dir>/<name>.sock; nullopt when the socket is missing or there is
// no (decodable, non-error) reply within `timeout`.
std::optional<std::string> Ask(const std::string& run_dir, const std::string& name, const std::string& request,
                               std::chrono::milliseconds timeout) {
  if (!CheckSocketAccess(run_dir, name).ok()) return std::nullopt;
  auto client = DealerClient::Connect(IpcEndpoint(run_dir, name));
  if (!client.ok()) return std::nullopt;
  (*client)->SetLinger(std::chrono::milliseconds(0));
  absl::StatusOr<std::string> reply = (*client)->Request(request, timeout);
  if (!reply.ok()) return std::nullopt;
  return *std::move(reply);
}

// The loop around one Supervisor: its state is the pid of each child and the events waiting to be fed.
class NodeLoop {
 public:
  NodeLoop(const NodeConfig& config, uint64_t page_bytes, const NodePaths& paths, Supervisor& supervisor)
      : config_(config), page_bytes_(page_bytes), paths_(paths), sup_(supervisor),
        pids_(supervisor.children(), -1) {}

  // Runs until the supervisor orders kExit; returns its code.
  int Run(int signal_fd) {
    sup_.Begin(NowMs());
    while (true) {
      if (std::optional<int> code = Execute()) return *code;
      const int64_t wake = sup_.NextWakeupMs();
      const int64_t now = NowMs();
      const int timeout =
          wake == Supervisor::kNever ? 1000 : static_cast<int>(std::clamp<int64_t>(wake - now, 0, 1000));
      pollfd p{signal_fd, POLLIN, 0};
      if (::poll(&p, 1, timeout) > 0) ReadSignals(signal_fd);
      Reap();
      sup_.Timer(NowMs());
    }
  }

 private:
  // Executes the drained orders (and those their answers cause); the exit code once kExit came.
  std::optional<int> Execute() {
    for (std::vector<SupervisorOrder> orders = sup_.DrainOrders(); !orders.empty(); orders = sup_.DrainOrders()) {
      for (const SupervisorOrder& o : orders) {
        if (std::optional<int> code = ExecuteOne(o)) return code;
      }
    }
    return std::nullopt;
  }

  std::optional<int> ExecuteOne(const SupervisorOrder& o) {
    using Kind = SupervisorOrder::Kind;
    switch (o.kind) {
      case Kind::kStart: StartChild(o.child); break;
      case Kind::kSignal:
        if (pids_[o.child] > 0) ::kill(pids_[o.child], o.signal);
        spdlog::info("dhs-node: {} {} (pid {})", o.signal == SIGKILL ? "SIGKILL" : "SIGTERM", Name(o.child),
                     pids_[o.child]);
        break;
      case Kind::kProbe: sup_.ProbeResult(o.child, Probe(o.child), NowMs()); break;
      case Kind::kReady:
        spdlog::info("{}", o.message);
        NotifyReady(o.message);
        break;
      case Kind::kLog: spdlog::warn("{}", o.message); break;
      case Kind::kExit:
        NotifyStopping();
        if (o.exit_code == 0) spdlog::info("{}", o.message);
        else spdlog::error("{}", o.message);
        return o.exit_code;
    }
    return std::nullopt;
  }

  std::string Name(size_t child) const {
    return child == Supervisor::kMemd ? "memd" : absl::StrCat("worker gpu ", config_.workers[child - 1].gpu);
  }

  void StartChild(size_t child) {
    const bool memd = child == Supervisor::kMemd;
    const std::string log = memd ? config_.run_dir + "/memd.log"
                                 : absl::StrCat(config_.run_dir, "/worker-", config_.workers[child - 1].gpu, ".log");
    absl::StatusOr<pid_t> pid =
        SpawnChild(memd ? paths_.memd : paths_.workerd,
                   memd ? MemdArgs(config_, page_bytes_) : WorkerArgs(config_, child - 1),
                   SpawnOptions{.log = log, .append_log = true, .drop_notify_socket = true});
    if (!pid.ok()) {
      spdlog::error("dhs-node: {}: {}", Name(child), std::string(pid.status().message()));
      sup_.Exited(child, 127 << 8, NowMs());  // as a shell reports a command it cannot run
      return;
    }
    pids_[child] = *pid;
    spdlog::info("dhs-node: started {} (pid {}), log {}", Name(child), *pid, log);
  }

  bool Probe(size_t child) const {
    if (child == Supervisor::kMemd) return ProbeMemd(config_.run_dir, std::nullopt, kProbeTimeout);
    const GpuId gpu = config_.workers[child - 1].gpu;
    return ProbeWorker(config_.run_dir, gpu, kProbeTimeout) && ProbeMemd(config_.run_dir, gpu, kProbeTimeout);
  }

  void ReadSignals(int fd) {
    signalfd_siginfo info;
    while (::read(fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      if (info.ssi_signo == SIGTERM || info.ssi_signo == SIGINT) {
        spdlog::info("dhs-node: {}: stopping the node", info.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
        sup_.Terminate(NowMs());
      }
    }
  }

  void Reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (size_t c = 0; c < pids_.size(); ++c) {
        if (pids_[c] != pid) continue;
        pids_[c] = -1;
        spdlog::info("dhs-node: {} (pid {}) exited: {}", Name(c), pid, DescribeExit(status));
        sup_.Exited(c, status, NowMs());
      }
    }
  }

  const NodeConfig& config_;
  uint64_t page_bytes_;
  NodePaths paths_;
  Supervisor& sup_;
  std::vector<pid_t> pids_;
};

}  // namespace

bool ProbeMemd(const std::string& run_dir, std::optional<GpuId> gpu, std::chrono::milliseconds timeout) {
  wire::IntrospectQueryT q;
  q.what = wire::IntrospectWhat::Gpus;
  q.format = wire::IntrospectFormat::Json;
  std::optional<std::string> bytes = Ask(run_dir, "memd", EncodeIntrospectQuery(q, 1, kSender), timeout);
  if (!bytes) return false;
  absl::StatusOr<Message> m = DecodeEnvelope(*bytes);
  if (!m.ok() || m->type != wire::Body::IntrospectReply) return false;
  absl::StatusOr<wire::IntrospectReplyT> reply = ReadIntrospectReply(*m);
  if (!reply.ok()) return false;
  if (!gpu.has_value()) return true;
  const nlohmann::json doc = nlohmann::json::parse(reply->document, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_array()) return false;
  for (const nlohmann::json& g : doc) {
    if (g.is_object() && g.contains("gpu") && g["gpu"].is_number_unsigned() && g["gpu"].get<uint64_t>() == *gpu) {
      return true;
    }
  }
  return false;
}

bool ProbeWorker(const std::string& run_dir, GpuId gpu, std::chrono::milliseconds timeout) {
  wire::WorkerStatsQueryT q;
  std::optional<std::string> bytes =
      Ask(run_dir, absl::StrCat("worker-", gpu), EncodeWorkerStatsQuery(q, 1, kSender), timeout);
  if (!bytes) return false;
  absl::StatusOr<Message> m = DecodeEnvelope(*bytes);
  if (!m.ok() || m->type != wire::Body::WorkerStatsReply) return false;
  absl::StatusOr<wire::WorkerStatsReplyT> stats = ReadWorkerStatsReply(*m);
  return stats.ok() && stats->gpu == gpu;
}

int RunNode(const NodeConfig& config, uint64_t page_bytes, const NodePaths& paths) {
  for (const std::string* p : {&paths.memd, &paths.workerd}) {
    if (p->empty() || ::access(p->c_str(), X_OK) != 0) {
      spdlog::error("dhs-node: not an executable: '{}' (set node.memd_path / node.workerd_path)", *p);
      return 1;
    }
  }
  if (absl::Status s = MakeRunDir(config.run_dir); !s.ok()) {
    spdlog::error("dhs-node: run directory {}: {}", config.run_dir, std::string(s.message()));
    return 1;
  }
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGCHLD}) sigaddset(&set, sig);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  const int fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) {
    spdlog::error("dhs-node: signalfd: {}", std::strerror(errno));
    return 1;
  }
  std::vector<std::string> names = {"memd"};
  for (const WorkerEntry& w : config.workers) names.push_back(absl::StrCat("worker gpu ", w.gpu));
  Supervisor supervisor(config.supervise, std::move(names));
  NodeLoop loop(config, page_bytes, paths, supervisor);
  const int code = loop.Run(fd);
  ::close(fd);
  return code;
}

}  // namespace dhs::node
