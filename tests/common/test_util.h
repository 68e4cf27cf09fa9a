// tests/common/test_util.h: helpers of the tests of every suite: a private run directory per test, a private temporary
// directory (never a fixed name in /tmp: two suites run at once must not collide), a bounded wait on a pipe (no
// sleeps), a spawned child process killed at teardown and a hand-written ZMTP peer.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

extern char** environ;

namespace dhs::testing {

// A fresh run directory path /tmp/dhs-t<pid>-<n> (not created); removed with its content on
// destruction. Short, so socket paths fit a unix socket address.
class ScopedRunDir {
 public:
  ScopedRunDir() {
    static std::atomic<int> counter{0};
    path_ = "/tmp/dhs-t" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    std::filesystem::remove_all(path_);
  }
  ~ScopedRunDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A fresh private directory <temp>/<prefix>XXXXXX (mkdtemp under $TMPDIR, else /tmp), removed with its content on
// destruction. Tests write their files here, never under a fixed name in /tmp.
class ScopedTempDir {
 public:
  explicit ScopedTempDir(const std::string& prefix = "dhs-test-") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ScopedTempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;
  const std::string& path() const { return path_; }  // empty when mkdtemp failed

 private:
  std::string path_;
};

// This test process's own temporary directory (one ScopedTempDir, removed at exit).
inline const std::string& ProcessTempDir() {
  static const ScopedTempDir dir("dhs-test-");
  return dir.path();
}

// Reads one byte from `fd`, waiting at most `timeout_ms`; returns the byte or -1.
inline int ReadByte(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return -1;
  unsigned char c = 0;
  return ::read(fd, &c, 1) == 1 ? c : -1;
}

// A child process started with posix_spawn (fork + exec at once, so a threaded test never forks); its stderr and
// stdout go to `log` when one is given. SIGKILLed and reaped on destruction unless it was reaped already.
class ChildProcess {
 public:
  explicit ChildProcess(std::vector<std::string> args, const std::string& log = "") {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (!log.empty()) {
      posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    }
    ok_ = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) == 0;
    posix_spawn_file_actions_destroy(&fa);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool ok() const { return ok_; }
  pid_t pid() const { return pid_; }
  // Sends `signal` (SIGSTOP, SIGCONT, ...); returns kill(2)'s result.
  int Signal(int signal) { return ::kill(pid_, signal); }
  // Whether the child has exited (reaps it; never blocks).
  bool Exited() {
    int status = 0;
    if (!reaped_ && ::waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    return reaped_;
  }
  // Waits up to `timeout_ms` for the exit; returns its exit code, or -1 (still running, or killed by a signal).
  int WaitExit(int timeout_ms) {
    for (int waited = 0; !Exited() && waited < timeout_ms; waited += 10) ::poll(nullptr, 0, 10);
    return reaped_ ? exit_code_ : -1;
  }
  // SIGTERM, then wait up to ~10 s for the exit; returns the exit status or -1.
  int Terminate() {
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 1000; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      ::poll(nullptr, 0, 10);
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  bool ok_ = false;
  bool reaped_ = false;
  int exit_code_ = -1;
};

// A ZMTP 3.0 peer written by hand (RFC 23/ZMTP, NULL mechanism): the greeting, then READY with Socket-Type DEALER and
// `identity`; afterwards it reads and answers nothing (no PONG to a PING, unlike a libzmq peer). Returns the fd or -1.
inline int RawZmtpPeer(const std::string& path, const std::string& identity) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  std::string greeting(64, '\0');
  greeting[0] = '\xff';
  greeting[9] = '\x7f';
  greeting[10] = 3;  // version 3.0
  std::memcpy(&greeting[12], "NULL", 4);
  char theirs[64];
  if (::write(fd, greeting.data(), 64) != 64 || ::recv(fd, theirs, 64, MSG_WAITALL) != 64) return -1;
  auto property = [](const std::string& name, const std::string& value) {
    const uint32_t n = htonl(static_cast<uint32_t>(value.size()));
    return std::string(1, static_cast<char>(name.size())) + name + std::string(reinterpret_cast<const char*>(&n), 4) +
           value;
  };
  const std::string body = "\x05READY" + property("Socket-Type", "DEALER") + property("Identity", identity);
  const std::string command = std::string{'\x04', static_cast<char>(body.size())} + body;  // short command frame
  if (::write(fd, command.data(), command.size()) != static_cast<ssize_t>(command.size())) return -1;
  return fd;
}


}  // namespace dhs::testing
