#include "common/prometheus.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dhs {

void LatencyHistogram::Observe(uint64_t us) {
  if (counts.size() != bounds_us.size() + 1) counts.assign(bounds_us.size() + 1, 0);
  size_t i = 0;
  while (i < bounds_us.size() && us > bounds_us[i]) ++i;
  ++counts[i];
  sum_us += us;
  ++count;
}

LatencyHistogram MakeLatencyHistogram() {
  LatencyHistogram h;
  h.bounds_us = {100,    250,    500,    1000,    2500,    5000,    10000,    25000,    50000,
                 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000, 60000000};
  h.counts.assign(h.bounds_us.size() + 1, 0);
  return h;
}

std::string SecondsText(uint64_t us) { return absl::StrFormat("%d.%06d", us / 1000000, us % 1000000); }

void AppendMetricHeader(std::string& out, absl::string_view name, absl::string_view type, absl::string_view help) {
  absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void AppendHistogram(std::string& out, absl::string_view name, absl::string_view labels, const LatencyHistogram& h) {
  const bool valid = h.counts.size() == h.bounds_us.size() + 1;
  const std::string sep = labels.empty() ? "" : ",";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds_us.size(); ++i) {
    cumulative += valid ? h.counts[i] : 0;
    absl::StrAppend(&out, name, "_bucket{", labels, sep, "le=\"", SecondsText(h.bounds_us[i]), "\"} ", cumulative,
                    "\n");
  }
  cumulative += valid ? h.counts.back() : 0;
  absl::StrAppend(&out, name, "_bucket{", labels, sep, "le=\"+Inf\"} ", cumulative, "\n");
  const std::string braces = labels.empty() ? "" : absl::StrCat("{", labels, "}");
  absl::StrAppend(&out, name, "_sum", braces, " ", SecondsText(valid ? h.sum_us : 0), "\n");
  absl::StrAppend(&out, name, "_count", braces, " ", cumulative, "\n");
}

}  // namespace dhs
