// common/daemon_flag.h: one flag of a daemon (memd, workerd) as ONE description that both the daemon's CLI11 set-up
// (AddDaemonFlag, common/cli_flags.h) and dhs-node's configuration (tools/node/node_config.h: a TOML key per flag)
// read, so neither types a flag's name, range or choices again. The daemons' lists: memd/memd_flags.h (kMemdFlags),
// workerd/worker_flags.h (kWorkerFlags).
//
// Thread-safety: constants and pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dhs {

struct DaemonFlag {
  // How a value reads: kUint an integer in [min, max]; kSize the same, which a configuration file may also write
  // with a unit ("64MiB", common ParseByteSize); kString any non-empty text; kChoice one of choices(); kFraction a
  // number in [0, 1]; kBool true/false (dhs-node's own keys only).
  enum Kind : uint8_t { kUint, kSize, kString, kChoice, kFraction, kBool };
  std::string_view key;   // the configuration key (snake_case), e.g. "hbm_budget_bytes"
  std::string_view flag;  // the daemon's flag, e.g. "--hbm-budget"; "" = a key of dhs-node itself
  Kind kind = kString;
  uint64_t min = 0, max = std::numeric_limits<uint64_t>::max();  // kUint, kSize: the accepted range
  std::vector<std::string> (*choices)() = nullptr;                // kChoice: the names it takes, from their owner
};

// The entry of `flags` whose flag is `flag`, nullptr when none.
constexpr const DaemonFlag* FindDaemonFlag(std::span<const DaemonFlag> flags, std::string_view flag) {
  for (const DaemonFlag& f : flags) {
    if (f.flag == flag) return &f;
  }
  return nullptr;
}

// The flags of `a`, then those of `b`: a daemon's list that appends the list a component of it owns (kWorkerFlags
// appends spec::kSpeculationFlags).
template <size_t A, size_t B>
constexpr std::array<DaemonFlag, A + B> ConcatDaemonFlags(const DaemonFlag (&a)[A], const DaemonFlag (&b)[B]) {
  std::array<DaemonFlag, A + B> flags{};
  for (size_t i = 0; i < A; ++i) flags[i] = a[i];
  for (size_t i = 0; i < B; ++i) flags[A + i] = b[i];
  return flags;
}

}  // namespace dhs
