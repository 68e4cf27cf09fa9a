// common/worker_metrics.h: the one rendering of a worker's WorkerStatsReply (issue 22): Prometheus text (workerd's
// GET /metrics), JSON and a table (`dhsctl worker-stats`). The reply is the whole of the worker's counters: the
// serving core's (Worker::StatsReply) and its frontend's back-pressure figures (ServingFrontend::StatsReply).
// docs/operations.md "Worker metrics" lists every metric: name, type, unit and meaning.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "dhs_generated.h"
#include "nlohmann/json.hpp"

namespace dhs {

// Prometheus text exposition (format 0.0.4). Every series carries the label gpu="G"; the latency histograms are
// rendered by AppendHistogram (common/prometheus.h).
std::string RenderWorkerPrometheus(const wire::WorkerStatsReplyT& stats);

// Every field of the reply as one JSON object: scalar fields by their wire name, "failures" as {reason: count},
// histograms as {"bounds_us": [...], "counts": [...] (per bucket, the last +Inf), "sum_us", "count"},
// "spec_width_rounds" as an array. timeline_json is left out.
nlohmann::json WorkerStatsToJson(const wire::WorkerStatsReplyT& stats);

// The same as "name value" lines (one per field; a histogram: its count, sum in seconds and mean; failures one line
// per reason), ending in '\n'.
std::string WorkerStatsToTable(const wire::WorkerStatsReplyT& stats);

}  // namespace dhs
