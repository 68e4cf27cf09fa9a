// common/spawn.h: a child's output goes to its log (truncated or appended), a missing program is an error of
// SpawnChild itself, NOTIFY_SOCKET is dropped only when asked, signals blocked in the parent are unblocked, and the
// parent-death signal is the one asked for.
#include "common/spawn.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"

namespace dhs {
namespace {

class SpawnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spawn_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Runs `sh -c script` to its end; returns its exit status.
  int Run(const std::string& script, const SpawnOptions& options) {
    absl::StatusOr<pid_t> pid = SpawnChild("/bin/sh", {"-c", script}, options);
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return -1;
    int status = 0;
    EXPECT_EQ(::waitpid(*pid, &status, 0), *pid);
    return status;
  }
  std::string Log() {
    std::ifstream in(dir_ + "/log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string dir_;
};

TEST_F(SpawnTest, OutputGoesToTheLogTruncatedOrAppended) {
  EXPECT_EQ(Run("echo one; echo two >&2", {.log = dir_ + "/log"}), 0);
  EXPECT_EQ(Log(), "one\ntwo\n");
  EXPECT_EQ(Run("echo three", {.log = dir_ + "/log"}), 0);
  EXPECT_EQ(Log(), "three\n");
  EXPECT_EQ(Run("echo four", {.log = dir_ + "/log", .append_log = true}), 0);
  EXPECT_EQ(Log(), "three\nfour\n");
}

TEST_F(SpawnTest, AProgramThatCannotRunIsAnErrorNotAChild) {
  absl::StatusOr<pid_t> pid = SpawnChild(dir_ + "/no-such-program", {}, {.log = dir_ + "/log"});
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(pid.status().message().find("cannot start " + dir_ + "/no-such-program: No such file or directory"),
            std::string::npos)
      << pid.status();
  pid = SpawnChild("/bin/true", {}, {.log = dir_ + "/missing-dir/log"});  // the log cannot be opened
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.status().message().find("cannot start /bin/true"), std::string::npos) << pid.status();
}

TEST_F(SpawnTest, NotifySocketIsDroppedOnlyWhenAsked) {
  ASSERT_EQ(::setenv("NOTIFY_SOCKET", "/run/test-notify", 1), 0);
  EXPECT_EQ(Run("echo \"[$NOTIFY_SOCKET]\"", {.log = dir_ + "/log"}), 0);
  EXPECT_EQ(Log(), "[/run/test-notify]\n");
  EXPECT_EQ(Run("echo \"[$NOTIFY_SOCKET]\"", {.log = dir_ + "/log", .drop_notify_socket = true}), 0);
  EXPECT_EQ(Log(), "[]\n");
  ::unsetenv("NOTIFY_SOCKET");
}

TEST_F(SpawnTest, SignalsBlockedInTheParentAreUnblockedInTheChild) {
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  const int status = Run("kill -TERM $$; sleep 5", {.log = dir_ + "/log"});
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
}

// The parent-death signal is SpawnOptions::parent_death_signal (dhs-node gives memd SIGUSR1, issue 22): the child of a
// thread that ended gets it (a shell at SIGUSR1's default action dies by it), SIGTERM by default.
TEST_F(SpawnTest, TheChildGetsItsParentDeathSignalWhenTheStartingThreadEnds) {
  for (int sig : {SIGUSR1, SIGTERM}) {
    pid_t pid = -1;
    std::thread starter([&] {
      SpawnOptions options{.log = dir_ + "/log"};
      if (sig != SIGTERM) options.parent_death_signal = sig;
      absl::StatusOr<pid_t> p = SpawnChild("/bin/sleep", {"30"}, options);
      ASSERT_TRUE(p.ok()) << p.status();
      pid = *p;
    });
    starter.join();  // the thread that spawned the child ends: the kernel signals the child
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << sig << ": status " << status;
  }
}

}  // namespace
}  // namespace dhs
