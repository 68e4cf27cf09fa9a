#include "workerd/speculation/block_width.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"

namespace dhs::spec {
namespace {

bool ParseInt(absl::string_view s, int64_t* v) {
  s = absl::StripAsciiWhitespace(s);
  if (s.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(s[0]))) return false;  // no sign, no "+"
  return absl::SimpleAtoi(s, v);
}

}  // namespace

absl::StatusOr<BlockWidthSchedule> BlockWidthSchedule::Parse(absl::string_view text, int64_t k_max) {
  if (k_max < 1) return absl::InvalidArgumentError(absl::StrFormat("block width schedule: K_max=%d < 1", k_max));
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError("block width schedule is empty; expected e.g. \"1:8,33:6,128:4\"");
  }
  BlockWidthSchedule out;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    Step st;
    if (parts.size() != 2 || !ParseInt(parts[0], &st.from_sessions) || !ParseInt(parts[1], &st.width)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "block width schedule entry \"%s\" is not from_sessions:width (decimal integers), e.g. \"33:6\"", entry));
    }
    const int64_t prev = out.steps_.empty() ? 0 : out.steps_.back().from_sessions;
    if (out.steps_.empty() ? st.from_sessions != 1 : st.from_sessions <= prev) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "block width schedule entry \"%s\": %s", entry,
          out.steps_.empty() ? "the first entry must start at 1 session"
                             : absl::StrFormat("sessions must increase (previous entry starts at %d)", prev)));
    }
    if (st.width < 1 || st.width > k_max) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "block width schedule entry \"%s\": width %d outside [1, K_max=%d]", entry, st.width, k_max));
    }
    out.steps_.push_back(st);
  }
  return out;
}

int64_t BlockWidthSchedule::WidthFor(int64_t sessions) const {
  int64_t w = steps_.front().width;
  for (const Step& s : steps_) {
    if (s.from_sessions > sessions) break;
    w = s.width;
  }
  return w;
}

std::string BlockWidthSchedule::ToString() const {
  return absl::StrJoin(steps_, ",", [](std::string* o, const Step& s) {
    absl::StrAppend(o, s.from_sessions, ":", s.width);
  });
}

absl::StatusOr<int64_t> ConfidencePrefix(std::span<const double> confidences, double threshold,
                                         int64_t max_proposals) {
  if (!(threshold >= 0.0 && threshold <= 1.0) || max_proposals < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "confidence prefix: threshold %g must be in [0, 1] and max_proposals %d >= 0", threshold, max_proposals));
  }
  int64_t n = 0;
  for (size_t j = 0; j < confidences.size(); ++j) {
    const double c = confidences[j];
    if (!(c >= 0.0 && c <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("confidence prefix: confidence %d is %g, not in [0, 1]", j, c));
    }
    if (n < max_proposals && c >= threshold && n == static_cast<int64_t>(j)) ++n;
  }
  return n;
}

absl::StatusOr<double> ExpectedAcceptanceLength(double alpha, int64_t width) {
  if (!(alpha >= 0.0 && alpha <= 1.0) || width < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "expected acceptance length: alpha %g must be in [0, 1] and width %d >= 1", alpha, width));
  }
  double sum = 0.0, term = 1.0;
  for (int64_t i = 0; i < width; ++i, term *= alpha) sum += term;  // no cancellation near alpha = 1
  return sum;
}

}  // namespace dhs::spec
