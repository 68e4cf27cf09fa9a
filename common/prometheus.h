// common/prometheus.h: Prometheus text exposition (format 0.0.4) pieces shared by memd and workerd (issue 22):
// latency histograms with Prometheus semantics and their one rendering.
//
// A LatencyHistogram counts observations in microseconds into fixed buckets (upper bounds `le`, inclusive, plus the
// implicit +Inf); RenderHistogram writes it the way Prometheus defines a histogram: one `NAME_bucket{le="B"}` line per
// bound with the CUMULATIVE count of observations <= B, `le="+Inf"` equal to `NAME_count`, then `NAME_sum` (the sum of
// the observations) and `NAME_count`. Names end in `_seconds` (Prometheus base unit): bounds and sums are rendered in
// seconds from the integer microseconds, exactly (six decimals, no floating-point rounding).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

namespace dhs {

struct LatencyHistogram {
  // Ascending upper bounds, us (the buckets `le`); empty = only +Inf.
  std::vector<uint64_t> bounds_us;
  // counts[i]: observations v with bounds_us[i-1] < v <= bounds_us[i] (per bucket, NOT cumulative); counts.back():
  // those above every bound (+Inf). Size bounds_us.size() + 1.
  std::vector<uint64_t> counts;
  uint64_t sum_us = 0;  // sum of the observations, us
  uint64_t count = 0;   // observations

  // Adds one observation of `us` microseconds.
  void Observe(uint64_t us);
};

// The latency buckets of the worker's TTFT, TPOT and admission-wait histograms, us: 100 us .. 60 s
// (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60 s).
LatencyHistogram MakeLatencyHistogram();

// Microseconds as seconds with six decimals ("1.500000" for 1500000): exact.
std::string SecondsText(uint64_t us);

// Appends "# HELP NAME HELP\n# TYPE NAME TYPE\n" to `out`.
void AppendMetricHeader(std::string& out, absl::string_view name, absl::string_view type, absl::string_view help);

// Appends the sample lines of one histogram series (no HELP/TYPE: call AppendMetricHeader once per metric name):
// NAME_bucket{LABELS,le="B"} per bound (cumulative counts), NAME_bucket{LABELS,le="+Inf"}, NAME_sum{LABELS} (seconds),
// NAME_count{LABELS}. `labels` is the inside of the braces without them (e.g. `gpu="0"`), or empty.
// A histogram whose counts size is not bounds + 1 is rendered as empty (every count 0).
void AppendHistogram(std::string& out, absl::string_view name, absl::string_view labels, const LatencyHistogram& h);

}  // namespace dhs
