#include "tools/replay/node_launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/spawn.h"
#include "common/transport.h"

extern char** environ;

namespace dhs::replay {
namespace {

std::string LogTail(const std::string& path, size_t max_bytes = 2000) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  if (text.size() > max_bytes) text = text.substr(text.size() - max_bytes);
  return text;
}

// Sends SIGTERM, waits up to `grace`, then SIGKILL. Returns the exit status (or -1).
int Terminate(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return -1;
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return status;
}

}  // namespace

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return abbrev ? absl::StrCat("signal SIG", abbrev, " (", sig, ")") : absl::StrCat("signal ", sig);
  }
  return absl::StrCat("status ", status);
}

std::string TempRunDirParent(const char* tmpdir) {
  if (tmpdir != nullptr && *tmpdir != '\0') {
    std::string parent(tmpdir);
    while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
    if (CheckSocketPaths(absl::StrCat(parent, "/dhs-replay-XXXXXX")).ok()) return parent;
  }
  return "/tmp";
}

absl::StatusOr<std::string> CreateRunDir(const NodeLaunchOptions& options, bool& temporary) {
  temporary = false;
  if (options.run_dir.empty()) {
    std::string pattern = absl::StrCat(TempRunDirParent(std::getenv("TMPDIR")), "/dhs-replay-XXXXXX");
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
    }
    temporary = true;
    return pattern;
  }
  if (absl::Status s = CheckSocketPaths(options.run_dir); !s.ok()) return s;  // as memd will check it
  if (absl::Status s = MakeRunDir(options.run_dir); !s.ok()) return s;
  return options.run_dir;
}

absl::Status MakeNodesRunDir(const std::string& run_dir) {
  const std::filesystem::path parent = std::filesystem::path(run_dir).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) return absl::InternalError(absl::StrCat("mkdir -p ", parent.string(), ": ", ec.message()));
  }
  return MakeRunDir(run_dir);
}

std::string NodeLogPath(const std::string& run_dir, const std::string& daemon, const std::string& log_tag) {
  return absl::StrCat(run_dir, "/", daemon, log_tag.empty() ? "" : ".", log_tag, ".log");
}

std::vector<std::string> MemdArgs(const NodeLaunchOptions& options, const std::string& run_dir) {
  std::vector<std::string> args = {"--run-dir", run_dir, "--page-bytes", std::to_string(options.page_bytes),
                                   "--host-pool-bytes", std::to_string(options.host_pool_bytes), "--log-level", "warn"};
  args.insert(args.end(), options.extra_memd_args.begin(), options.extra_memd_args.end());
  return args;
}

std::vector<std::string> WorkerArgs(const NodeLaunchOptions& options, const std::string& run_dir) {
  std::vector<std::string> args = {
      "--run-dir", run_dir, "--gpu", "0", "--mode", options.mode, "--preset", options.preset,
      "--seed", std::to_string(options.seed), "--hbm-budget", std::to_string(options.hbm_budget_bytes),
      "--slots", std::to_string(options.slots), "--log-level", "warn"};
  args.insert(args.end(), options.extra_workerd_args.begin(), options.extra_workerd_args.end());
  return args;
}

absl::StatusOr<std::unique_ptr<EmbeddedNode>> EmbeddedNode::Start(const NodeLaunchOptions& options) {
  for (const std::string* path : {&options.memd_path, &options.workerd_path}) {
    if (path->empty() || ::access(path->c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("not an executable: '", *path, "'"));
    }
  }
  if (options.page_bytes == 0 || options.hbm_budget_bytes == 0 || options.host_pool_bytes == 0) {
    return absl::InvalidArgumentError("page bytes, HBM budget and host pool size must be > 0");
  }
  std::unique_ptr<EmbeddedNode> node(new EmbeddedNode());
  absl::StatusOr<std::string> dir = CreateRunDir(options, node->owns_run_dir_);
  if (!dir.ok()) return dir.status();
  node->run_dir_ = *dir;
  const std::string memd_log = NodeLogPath(node->run_dir_, "memd", options.log_tag);
  const std::string worker_log = NodeLogPath(node->run_dir_, "workerd", options.log_tag);
  const std::vector<std::string> memd_args = MemdArgs(options, node->run_dir_);
  // On a failed start the directory stays (its logs explain the failure); the node's destructor stops the children.
  auto failed = [&node](const absl::Status& s) {
    node->owns_run_dir_ = false;
    return absl::Status(s.code(), absl::StrCat(s.message(), "\n(run directory kept: ", node->run_dir_, ")"));
  };
  if (absl::Status s = node->Spawn(options.memd_path, memd_args, memd_log, node->memd_pid_); !s.ok()) {
    return failed(s);
  }
  if (absl::Status s = node->WaitForSocket("memd", node->memd_pid_, memd_log, options.start_timeout); !s.ok()) {
    return failed(s);
  }
  const std::vector<std::string> worker_args = WorkerArgs(options, node->run_dir_);
  if (absl::Status s = node->Spawn(options.workerd_path, worker_args, worker_log, node->worker_pid_); !s.ok()) {
    return failed(s);
  }
  if (absl::Status s = node->WaitForSocket("worker-0", node->worker_pid_, worker_log, options.start_timeout);
      !s.ok()) {
    return failed(s);
  }
  return node;
}

absl::Status EmbeddedNode::Spawn(const std::string& path, const std::vector<std::string>& args,
                                 const std::string& log, pid_t& pid) {
  absl::StatusOr<pid_t> child = SpawnChild(path, args, SpawnOptions{.log = log});
  if (!child.ok()) return child.status();
  pid = *child;
  return absl::OkStatus();
}

absl::Status EmbeddedNode::WaitForSocket(const std::string& name, pid_t pid, const std::string& log,
                                         std::chrono::milliseconds timeout) {
  const std::string socket = run_dir_ + "/" + name + ".sock";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    struct stat st;
    if (::stat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return absl::OkStatus();
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      if (pid == memd_pid_) memd_pid_ = -1;
      if (pid == worker_pid_) worker_pid_ = -1;
      return absl::UnavailableError(absl::StrCat(name, " exited during start-up (", DescribeWaitStatus(status),
                                                 "); log ", log, ":\n", LogTail(log)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::UnavailableError(absl::StrCat(name, " did not open ", socket, " within ", timeout.count(),
                                             " ms; log ", log, ":\n", LogTail(log)));
}

absl::Status EmbeddedNode::Stop() {
  Terminate(worker_pid_, std::chrono::milliseconds(5000));
  worker_pid_ = -1;
  Terminate(memd_pid_, std::chrono::milliseconds(5000));
  memd_pid_ = -1;
  if (owns_run_dir_ && !run_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(run_dir_, ec);
    owns_run_dir_ = false;
    if (ec) return absl::InternalError(absl::StrCat("cannot remove the run directory ", run_dir_, ": ", ec.message()));
  }
  return absl::OkStatus();
}

EmbeddedNode::~EmbeddedNode() {
  if (absl::Status s = Stop(); !s.ok()) std::cerr << "dhs-replay: stopping the node: " << s.message() << "\n";
}

std::string ReplayNode::memd_endpoint() const { return IpcEndpoint(run_dir(), "memd"); }
std::string ReplayNode::worker_endpoint() const { return IpcEndpoint(run_dir(), "worker-0"); }

}  // namespace dhs::replay
