// common/cli_flags.h: the command-line validators shared by workerd, memd and dhs-replay (CLI11).
#pragma once

#include <charconv>
#include <cstddef>
#include <string>
#include <system_error>

#include "CLI/CLI.hpp"

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

}  // namespace dhs
