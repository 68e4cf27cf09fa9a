#include "common/spawn.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace dhs {

absl::StatusOr<pid_t> SpawnChild(const std::string& path, const std::vector<std::string>& args,
                                 const SpawnOptions& options) {
  // Everything the child needs is prepared here: between fork and exec only async-signal-safe calls.
  std::vector<std::string> storage = {path};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!options.drop_notify_socket || std::strncmp(*e, "NOTIFY_SOCKET=", 14) != 0) envp.push_back(*e);
  }
  envp.push_back(nullptr);
  const int log_flags = O_WRONLY | O_CREAT | O_CLOEXEC | (options.append_log ? O_APPEND : O_TRUNC);
  int report[2];  // the child writes its errno here when it cannot exec; closed on exec
  if (::pipe2(report, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot start ", path, ": pipe: ", std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) {
    const int e = errno;
    ::close(report[0]);
    ::close(report[1]);
    return absl::UnavailableError(absl::StrCat("cannot start ", path, ": fork: ", std::strerror(e)));
  }
  if (child == 0) {
    auto fail = [&](int e) {
      (void)!::write(report[1], &e, sizeof e);
      ::_exit(127);
    };
    // Stop when the starting thread dies; if the parent is already gone, the signal will never come.
    if (::prctl(PR_SET_PDEATHSIG, options.parent_death_signal) != 0) fail(errno);
    if (::getppid() != parent) ::_exit(143);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const int out = ::open(options.log.c_str(), log_flags, 0600);
    if (out < 0 || ::dup2(out, STDOUT_FILENO) < 0 || ::dup2(out, STDERR_FILENO) < 0) fail(errno);
    const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in < 0 || ::dup2(in, STDIN_FILENO) < 0) fail(errno);
    ::execve(path.c_str(), argv.data(), envp.data());
    fail(errno);
  }
  ::close(report[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {  // the exec (or the set-up before it) failed
    ::waitpid(child, nullptr, 0);
    return absl::UnavailableError(absl::StrCat("cannot start ", path, ": ", std::strerror(child_errno)));
  }
  return child;
}

}  // namespace dhs
