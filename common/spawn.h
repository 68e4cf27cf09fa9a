// common/spawn.h: starting a daemon as a child process (dhs-node's supervisor and dhs-replay's embedded node).
//
// The child dies with the thread that started it (PR_SET_PDEATHSIG, SIGTERM unless SpawnOptions says otherwise; a parent already gone makes it exit 143
// at once), starts with every signal unblocked and SIGTERM/SIGINT at their defaults, reads /dev/null and writes
// stdout and stderr to a log file. A failed exec (no such file, not executable) is an error of SpawnChild itself,
// reported through a close-on-exec pipe, not a child that exits 127 later.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dhs {

struct SpawnOptions {
  std::string log;                  // stdout and stderr of the child (created 0600)
  bool append_log = false;          // false: truncated
  bool drop_notify_socket = false;  // true: the child does not inherit NOTIFY_SOCKET (only the unit's main process
                                    // reports readiness to systemd)
  // The signal the child gets when the starting thread dies (PR_SET_PDEATHSIG). dhs-node gives memd SIGUSR1 (issue
  // 22): memd then serves on until the workers, stopped by their own SIGTERM, ended their requests.
  int parent_death_signal = SIGTERM;
};

// Starts `path args...`; returns the child's pid. Errors: Unavailable "cannot start PATH: ..." (pipe, fork, the log
// file, or exec failed; nothing is left running).
absl::StatusOr<pid_t> SpawnChild(const std::string& path, const std::vector<std::string>& args,
                                 const SpawnOptions& options);

}  // namespace dhs
