// tools/replay/cluster_counters.h: memd's cluster-tier counters as dhs-replay totals them over a run (issue 26 review,
// F3 / F4; docs/replay.md "Several nodes"). memd reports running totals since its own start in its status view's
// "cluster" object (memd/state_dump.cc ClusterJson); a memd restarted under the run (--restart-memd-every, a crash)
// counts from 0 again, so the run's totals are the sum over its memds of each one's last sample. What a memd counted
// between its last sample and its death is not seen (at most one sample period: ZmqNodeClientOptions::sample_interval).
//
// The status view names no memd (no pid, no start time), so a new memd is told by (a) the caller: memd's connection
// that answered the previous sample closed since (DealerClient::PeerClosed), or (b) the sample itself: some counter is
// below the previous sample's (a memd's counters never go down). A new memd whose every counter already reached its
// predecessor's by its first sample and whose connection change the caller missed (a sample request that timed out
// resets the socket) is taken for the same memd: its predecessor's counts are then lost, never counted twice.
//
// Pure: values in, values out; no sockets or clocks. Thread-safety: none needed (values; a ClusterTally is used by
// one thread).
#pragma once

#include <optional>
#include <span>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/replay/node_client.h"

namespace dhs::replay {

using ClusterCounters = NodeStats::ClusterCounters;

// memd's status view's "cluster" object as counters: its numbers (pages, bytes), its "misses" and "shed" objects
// (reason -> pages), its "health" and "reachable"; a missing field reads 0 / empty. dhs-replay's own fields
// (health_samples, memd_restarts_seen) stay empty / 0. Errors: InvalidArgument when `cluster` is not an object, or a counter (also one
// of misses / shed) is not a non-negative integer, or health or reachable is not a string.
absl::StatusOr<ClusterCounters> ClusterCountersOfJson(const nlohmann::json& cluster);

// Whether some counter of `sample` (lookups ... publish_failed, every miss and shed reason) is below `previous`'s:
// `sample` then comes from another memd than `previous` (a memd's counters only grow).
bool CountersWentDown(const ClusterCounters& previous, const ClusterCounters& sample);

// One status sample of one node's memd.
struct ClusterSample {
  ClusterCounters counters;  // memd's totals (ClusterCountersOfJson)
  bool memd_changed = false; // the caller knows another memd answered than the previous sample's (its connection
                             // closed since); ignored for the first sample
};

// The run's totals of one node's memds, sample by sample.
class ClusterTally {
 public:
  // Takes one sample (in the order they were taken). A new memd (sample.memd_changed, or CountersWentDown against the
  // previous sample) adds the previous sample's counters to the base and counts a restart seen.
  void Add(const ClusterSample& sample);
  // base + the last sample's counters; health, reachable = the last sample's; health_samples = the samples by health;
  // memd_restarts_seen = new memds seen. nullopt before any sample (memd reported no cluster tier).
  std::optional<ClusterCounters> Totals() const;

 private:
  ClusterCounters base_;                  // the earlier memds' last samples, added
  std::optional<ClusterCounters> last_;   // the latest sample's counters
  std::map<std::string, int64_t> health_samples_;
  int64_t restarts_ = 0;
};

// The totals of a sequence of samples (a ClusterTally fed with each in order). nullopt: no sample.
std::optional<ClusterCounters> TotalClusterCounters(std::span<const ClusterSample> samples);

}  // namespace dhs::replay
