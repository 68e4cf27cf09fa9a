// common/cli_flags.h: the command-line validators shared by workerd, memd and dhs-replay (CLI11).
#pragma once

#include <charconv>
#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <string>
#include <system_error>

#include "CLI/CLI.hpp"
#include "common/check.h"
#include "common/daemon_flag.h"

namespace dhs {

// An integer flag with its bounds: accepts only an optional '-' (when lo < 0) and decimal digits whose value is in
// [lo, hi]. CLI11 prefixes the flag's name, so `--memd-reconnect-ms 1e3` fails (exit 2) with
// "--memd-reconnect-ms: must be an integer in [100, 3600000], got '1e3'" (CLI::Range would take "1e3" or "1.5" as a
// number and call it out of range; an unsigned flag would wrap "-1" to 2^64-1).
template <typename T>
CLI::Validator IntegerIn(T lo, T hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& v) -> std::string {
        const char* end = v.data() + v.size();
        bool digits = !v.empty();
        for (size_t i = (v.size() > 1 && v[0] == '-') ? 1 : 0; digits && i < v.size(); ++i) {
          digits = v[i] >= '0' && v[i] <= '9';
        }
        T n{};
        if (digits) {
          const auto [ptr, ec] = std::from_chars(v.data(), end, n);
          digits = ec == std::errc() && ptr == end;  // a negative value of an unsigned T, or beyond T: refused
        }
        if (!digits || n < lo || n > hi) return "must be an integer in " + range + ", got '" + v + "'";
        return std::string();
      },
      "INT in " + range, "INTEGER_IN");
}

// Declares the flag of `flags` named `flag` (common/daemon_flag.h) on `app`, bound to `value`, with `help`: its range
// (kUint, kSize: IntegerIn over T) or its choices (kChoice: CLI::IsMember) as the list gives them, so the daemon and
// dhs-node check the same. `flag` must be in `flags` and its range must fit T (checked: a programming error).
template <typename T>
CLI::Option* AddDaemonFlag(CLI::App& app, std::span<const DaemonFlag> flags, std::string_view flag, T& value,
                           std::string help) {
  const DaemonFlag* f = FindDaemonFlag(flags, flag);
  if (f == nullptr) {
    internal::CheckFailed(__FILE__, __LINE__, "FindDaemonFlag(flags, flag)",
                          absl::InternalError(std::string(flag) + " is not in its daemon's list"));
  }
  CLI::Option* option = app.add_option(std::string(f->flag), value, std::move(help));
  if constexpr (std::is_integral_v<T>) {
    if (f->kind == DaemonFlag::kUint || f->kind == DaemonFlag::kSize) {
      if (f->max > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        internal::CheckFailed(__FILE__, __LINE__, "f->max <= max of T",
                              absl::InternalError(std::string(flag) + ": range beyond its type"));
      }
      option->check(IntegerIn<T>(static_cast<T>(f->min), static_cast<T>(f->max)));
    }
  }
  if (f->kind == DaemonFlag::kChoice) option->check(CLI::IsMember(f->choices()));
  return option;
}

}  // namespace dhs
