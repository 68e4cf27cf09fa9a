// tests/common/prometheus_text.h: reads a Prometheus text page (exposition format 0.0.4) back for tests: its metric
// families in page order, checked against the rules a scraper relies on. Header-only (absl).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dhs::testing {

// The metric families of `text` in the order of their TYPE lines. Every sample must belong to the family whose TYPE
// line came last (so a family is typed once, before its samples, and its samples are contiguous); a histogram's
// samples are NAME_bucket, NAME_sum and NAME_count. A HELP line comes before its family's TYPE line.
// InvalidArgument (naming the line) otherwise: a sample of another family or before any TYPE, a family typed twice,
// a HELP line of a family already typed, an unknown '#' line, a sample that is not "name[{labels}] value" with a
// numeric value, or a text that does not end in '\n'.
inline absl::StatusOr<std::vector<std::string>> PrometheusFamilies(const std::string& text) {
  if (text.empty() || text.back() != '\n') return absl::InvalidArgumentError("the page does not end in a newline");
  std::vector<std::string> families;
  std::map<std::string, std::string> type_of;
  std::string open;  // the family whose TYPE line came last
  const std::vector<std::string> lines = absl::StrSplit(text.substr(0, text.size() - 1), '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    const auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", i + 1, " '", line, "': ", why));
    };
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
      const std::vector<std::string> words = absl::StrSplit(line.substr(7), absl::MaxSplits(' ', 1));
      if (words.size() != 2 || words[0].empty()) return bad("a HELP or TYPE line needs a name and a text");
      if (type_of.contains(words[0])) return bad("the family was typed before");
      if (line.starts_with("# HELP ")) continue;
      type_of[words[0]] = words[1];
      families.push_back(words[0]);
      open = words[0];
      continue;
    }
    if (line.starts_with("#")) return bad("an unknown comment line");
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    double value = 0;
    if (name_end == std::string::npos || name_end == 0 || value_at == std::string::npos ||
        !absl::SimpleAtod(line.substr(value_at + 1), &value)) {
      return bad("not a sample 'name[{labels}] value'");
    }
    const std::string name = line.substr(0, name_end);
    if (open.empty()) return bad("a sample before any TYPE line");
    const bool histogram = type_of[open] == "histogram";
    const bool ours = histogram ? (name == open + "_bucket" || name == open + "_sum" || name == open + "_count")
                                : name == open;
    if (!ours) return bad(absl::StrCat("a sample outside its family's block (the open family is ", open, ")"));
  }
  return families;
}

}  // namespace dhs::testing
