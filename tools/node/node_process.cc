#include "tools/node/node_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
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

// The size of file `path` (0 when it cannot be read).
uint64_t FileSize(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// The name of the lock file in a run directory (held by the live dhs-node of that directory).
std::string LockPath(const std::string& run_dir) { return run_dir + "/dhs-node.lock"; }

// The pid a dhs-node wrote into the lock file `fd` ("?" when unreadable).
std::string LockHolder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? "?" : pid;
}

absl::Status InUse(const std::string& run_dir, int fd) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "run directory %s is in use by another dhs-node (pid %s, holding %s): stop it first, or give this node its own "
      "node.run_dir", run_dir, LockHolder(fd), LockPath(run_dir)));
}

// No memd and no worker of `config` answers on the run directory's sockets (one started by hand, or left by a node
// that is still stopping): a child of this node would fail on them every time.
absl::Status CheckNoLiveDaemons(const NodeConfig& config) {
  if (ProbeMemd(config.run_dir, std::nullopt, kProbeTimeout)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "a live memd serves %s/memd.sock (not started by this dhs-node): stop it first, or give this node its own "
        "node.run_dir", config.run_dir));
  }
  for (const WorkerEntry& w : config.workers) {
    if (ProbeWorker(config.run_dir, w.gpu, kProbeTimeout)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "a live worker of GPU %d serves %s/worker-%d.sock (not started by this dhs-node): stop it first",
          w.gpu, config.run_dir, w.gpu));
    }
  }
  return absl::OkStatus();
}

// The loop around one Supervisor: its state is the pid of each child and the events waiting to be fed.
class NodeLoop {
 public:
  NodeLoop(const NodeConfig& config, uint64_t page_bytes, const NodePaths& paths, Supervisor& supervisor)
      : config_(config), page_bytes_(page_bytes), paths_(paths), sup_(supervisor),
        pids_(supervisor.children(), -1), log_start_(supervisor.children(), 0) {}

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
      case Kind::kLogTail: ShowLogTail(o.child, o.message); break;
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

  std::string LogOf(size_t child) const {
    return child == Supervisor::kMemd
               ? config_.run_dir + "/memd.log"
               : absl::StrCat(config_.run_dir, "/worker-", config_.workers[child - 1].gpu, ".log");
  }

  // `message`, then the last kLogTailLines lines child `child`'s log got since its last start.
  void ShowLogTail(size_t child, const std::string& message) const {
    spdlog::error("{}", message);
    const std::string log = LogOf(child);
    for (const std::string& line : ReadLogTail(log, log_start_[child], kLogTailLines)) {
      spdlog::error("{} | {}", Name(child), line);
    }
    spdlog::error("dhs-node: (end of {}; its whole log: {})", Name(child), log);
  }

  void StartChild(size_t child) {
    const bool memd = child == Supervisor::kMemd;
    const std::string log = LogOf(child);
    log_start_[child] = FileSize(log);
    absl::StatusOr<pid_t> pid =
        SpawnChild(memd ? paths_.memd : paths_.workerd,
                   memd ? MemdArgs(config_, page_bytes_) : WorkerArgs(config_, child - 1),
                   SpawnOptions{.log = log, .append_log = true, .drop_notify_socket = true,
                                // memd outlives a killed dhs-node until the workers ended their requests (issue 22)
                                .parent_death_signal = memd ? SIGUSR1 : SIGTERM});
    if (!pid.ok()) {
      spdlog::error("dhs-node: {}: {}", Name(child), std::string(pid.status().message()));
      sup_.Exited(child, 127 << 8, NowMs());  // as a shell reports a command it cannot run
      return;
    }
    pids_[child] = *pid;
    spdlog::info("dhs-node: started {} (pid {}), log {}", Name(child), *pid, log);
  }

  // Readiness of a starting child; liveness of a ready one (a ready worker: it answers, and memd, when it answers,
  // does not hold its GPU fenced; memd away does not make a worker dead).
  bool Probe(size_t child) const {
    if (child == Supervisor::kMemd) return ProbeMemd(config_.run_dir, std::nullopt, kProbeTimeout);
    const GpuId gpu = config_.workers[child - 1].gpu;
    if (!ProbeWorker(config_.run_dir, gpu, kProbeTimeout)) return false;
    const MemdGpu at_memd = ProbeMemdGpu(config_.run_dir, gpu, kProbeTimeout);
    if (sup_.state(child) == ChildState::kReady) return at_memd != MemdGpu::kFenced;
    return at_memd == MemdGpu::kUp;
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
  std::vector<uint64_t> log_start_;  // each child's log size at its last start (its tail is shown from there)
};

}  // namespace

namespace {

// memd's GPU list (IntrospectQuery Gpus, JSON); nullopt when memd does not answer.
std::optional<nlohmann::json> MemdGpus(const std::string& run_dir, std::chrono::milliseconds timeout) {
  wire::IntrospectQueryT q;
  q.what = wire::IntrospectWhat::Gpus;
  q.format = wire::IntrospectFormat::Json;
  std::optional<std::string> bytes = Ask(run_dir, "memd", EncodeIntrospectQuery(q, 1, kSender), timeout);
  if (!bytes) return std::nullopt;
  absl::StatusOr<Message> m = DecodeEnvelope(*bytes);
  if (!m.ok() || m->type != wire::Body::IntrospectReply) return std::nullopt;
  absl::StatusOr<wire::IntrospectReplyT> reply = ReadIntrospectReply(*m);
  if (!reply.ok()) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(reply->document, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_array()) return std::nullopt;
  return doc;
}

}  // namespace

bool ProbeMemd(const std::string& run_dir, std::optional<GpuId> gpu, std::chrono::milliseconds timeout) {
  if (!gpu.has_value()) return MemdGpus(run_dir, timeout).has_value();
  const MemdGpu state = ProbeMemdGpu(run_dir, *gpu, timeout);
  return state == MemdGpu::kUp || state == MemdGpu::kFenced;
}

MemdGpu ProbeMemdGpu(const std::string& run_dir, GpuId gpu, std::chrono::milliseconds timeout) {
  std::optional<nlohmann::json> doc = MemdGpus(run_dir, timeout);
  if (!doc) return MemdGpu::kNoAnswer;
  for (const nlohmann::json& g : *doc) {
    if (g.is_object() && g.contains("gpu") && g["gpu"].is_number_unsigned() && g["gpu"].get<uint64_t>() == gpu) {
      const bool up = !g.contains("up") || !g["up"].is_boolean() || g["up"].get<bool>();
      return up ? MemdGpu::kUp : MemdGpu::kFenced;
    }
  }
  return MemdGpu::kAbsent;
}

std::vector<std::string> ReadLogTail(const std::string& path, uint64_t offset, size_t lines) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  if (offset > size) offset = 0;  // the log was truncated or replaced
  // At most 64 KiB from the end: enough for the last lines of a daemon's log.
  const uint64_t from = std::max(offset, size > 65536 ? size - 65536 : 0);
  in.seekg(static_cast<std::streamoff>(from));
  std::string text(size - from, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  std::deque<std::string> tail;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    tail.emplace_back(line);
    if (tail.size() > lines) tail.pop_front();
  }
  return {tail.begin(), tail.end()};
}

absl::Status CheckRunDirUsable(const std::string& run_dir) {
  struct stat st {};
  if (::stat(run_dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(run_dir, " exists and is not a directory"));
    if (::access(run_dir.c_str(), W_OK | X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "run directory %s is not writable (%s): dhs-node writes its lock file, memd's and the workers' logs and "
          "sockets there; fix its permissions or choose another node.run_dir", run_dir, std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  std::string parent = run_dir.substr(0, run_dir.find_last_of('/'));
  if (parent.empty()) parent = "/";
  if (run_dir.find('/') == std::string::npos) parent = ".";
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "run directory %s does not exist and cannot be created: %s is not a directory", run_dir, parent));
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "run directory %s does not exist and cannot be created: %s is not writable (%s)", run_dir, parent,
        std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckRunDirFree(const NodeConfig& config) {
  const int fd = ::open(LockPath(config.run_dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    absl::Status s = held ? InUse(config.run_dir, fd) : absl::OkStatus();
    ::close(fd);
    if (!s.ok()) return s;
  }
  return CheckNoLiveDaemons(config);
}

absl::Status CheckChildConfig(const std::string& name, const std::string& path, std::vector<std::string> args) {
  char out_path[] = "/tmp/dhs-node-check-XXXXXX";
  const int out = ::mkstemp(out_path);
  if (out < 0) return absl::InternalError(absl::StrCat("mkstemp: ", std::strerror(errno)));
  ::close(out);
  args.push_back("--check-config");
  absl::StatusOr<pid_t> pid = SpawnChild(path, args, SpawnOptions{.log = out_path, .drop_notify_socket = true});
  int status = 0;
  if (pid.ok()) {
    while (::waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  std::vector<std::string> lines = ReadLogTail(out_path, 0, kLogTailLines);
  ::unlink(out_path);
  if (!pid.ok()) return absl::FailedPreconditionError(absl::StrCat(name, ": ", pid.status().message()));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  std::string what = absl::StrCat(name, "'s own check (", path, " ... --check-config) failed: ", DescribeExit(status));
  for (const std::string& line : lines) absl::StrAppend(&what, "\n  ", name, " | ", line);
  return absl::FailedPreconditionError(what);
}

absl::StatusOr<int> LockRunDir(const NodeConfig& config) {
  if (absl::Status s = CheckRunDirUsable(config.run_dir); !s.ok()) return s;
  if (absl::Status s = MakeRunDir(config.run_dir); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("run directory ", config.run_dir, ": ", s.message()));
  }
  const std::string path = LockPath(config.run_dir);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "run directory %s is not writable (cannot create %s: %s): dhs-node writes its lock file, memd's and the "
        "workers' logs and sockets there; fix its permissions or choose another node.run_dir", config.run_dir, path,
        std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    absl::Status s = errno == EWOULDBLOCK ? InUse(config.run_dir, fd)
                                          : absl::InternalError(absl::StrCat("flock ", path, ": ", std::strerror(errno)));
    ::close(fd);
    return s;
  }
  if (absl::Status s = CheckNoLiveDaemons(config); !s.ok()) {
    ::close(fd);
    return s;
  }
  const std::string pid = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    spdlog::warn("dhs-node: cannot write its pid into {}: {}", path, std::strerror(errno));
  }
  return fd;
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
  absl::StatusOr<int> lock = LockRunDir(config);  // before anything is written there
  if (!lock.ok()) {
    spdlog::error("dhs-node: {}", std::string(lock.status().message()));
    return 1;
  }
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGTERM, SIGINT, SIGCHLD}) sigaddset(&set, sig);
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  const int fd = ::signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) {
    spdlog::error("dhs-node: signalfd: {}", std::strerror(errno));
    ::close(*lock);
    return 1;
  }
  std::vector<std::string> names = {"memd"};
  for (const WorkerEntry& w : config.workers) names.push_back(absl::StrCat("worker gpu ", w.gpu));
  Supervisor supervisor(config.supervise, std::move(names));
  NodeLoop loop(config, page_bytes, paths, supervisor);
  const int code = loop.Run(fd);
  ::close(fd);
  ::close(*lock);  // the lock file stays (empty of meaning once no process holds it)
  return code;
}

}  // namespace dhs::node
