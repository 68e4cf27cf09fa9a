// tests/common/test_util.h: helpers of the common suite: a private run directory per test and a
// bounded wait on a pipe (no sleeps).
#pragma once

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

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

// Reads one byte from `fd`, waiting at most `timeout_ms`; returns the byte or -1.
inline int ReadByte(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return -1;
  unsigned char c = 0;
  return ::read(fd, &c, 1) == 1 ? c : -1;
}

}  // namespace dhs::testing
