// tools/replay/cluster_counters.cc: ClusterCounters' arithmetic, parsing memd's "cluster" object, ClusterTally
// (see cluster_counters.h and node_client.h).
#include "tools/replay/cluster_counters.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dhs::replay {
namespace {

// memd's counters of the "cluster" object (ClusterJson's names) and their fields: the one list that parsing, adding
// and the restart test share. (hit_bytes, session_lookups, session_hits: not in the report.)
struct CounterField {
  const char* name;
  int64_t ClusterCounters::*field;
};
constexpr CounterField kCounterFields[] = {
    {"lookups", &ClusterCounters::lookups},
    {"hits", &ClusterCounters::hits},
    {"imported", &ClusterCounters::imported},
    {"published", &ClusterCounters::published},
    {"published_bytes", &ClusterCounters::published_bytes},
    {"imported_bytes", &ClusterCounters::imported_bytes},
    {"session_imported", &ClusterCounters::session_imported},
    {"offered", &ClusterCounters::offered},
    {"publish_failed", &ClusterCounters::publish_failed},
};
constexpr std::map<std::string, int64_t> ClusterCounters::*kReasonFields[] = {&ClusterCounters::misses,
                                                                              &ClusterCounters::shed};
constexpr const char* kReasonNames[] = {"misses", "shed"};

// Worse health first: the total of several memds / nodes shows the worst.
int HealthRank(const std::string& health) {
  if (health == "down") return 3;
  if (health == "probing") return 2;
  if (health.empty()) return 0;
  return 1;  // "up" (or a state this tool does not know: below probing)
}

int ReachableRank(const std::string& reachable) {
  if (reachable == "no") return 3;
  if (reachable == "not yet") return 2;
  if (reachable.empty()) return 0;
  return 1;  // "yes"
}

int64_t At(const std::map<std::string, int64_t>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

absl::StatusOr<int64_t> CounterOf(const nlohmann::json& v, const std::string& name) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memd's cluster counter '", name, "' is ", v.dump(), ", not a non-negative integer"));
  }
  return v.get<int64_t>();
}

}  // namespace

ClusterCounters& ClusterCounters::operator+=(const ClusterCounters& o) {
  for (const CounterField& c : kCounterFields) this->*c.field += o.*c.field;
  for (auto reasons : kReasonFields) {
    for (const auto& [reason, n] : o.*reasons) (this->*reasons)[reason] += n;
  }
  for (const auto& [health_name, n] : o.health_samples) health_samples[health_name] += n;
  if (HealthRank(o.health) > HealthRank(health)) health = o.health;
  if (ReachableRank(o.reachable) > ReachableRank(reachable)) reachable = o.reachable;
  memd_restarts_seen += o.memd_restarts_seen;
  return *this;
}

int64_t ClusterCounters::miss(const std::string& reason) const { return At(misses, reason); }
int64_t ClusterCounters::shed_of(const std::string& reason) const { return At(shed, reason); }

absl::StatusOr<ClusterCounters> ClusterCountersOfJson(const nlohmann::json& cluster) {
  if (!cluster.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("memd's cluster view is ", cluster.dump(), ", not an object"));
  }
  ClusterCounters c;
  for (const CounterField& f : kCounterFields) {
    if (!cluster.contains(f.name)) continue;
    absl::StatusOr<int64_t> n = CounterOf(cluster[f.name], f.name);
    if (!n.ok()) return n.status();
    c.*f.field = *n;
  }
  for (size_t r = 0; r < std::size(kReasonFields); ++r) {
    if (!cluster.contains(kReasonNames[r])) continue;
    const nlohmann::json& by = cluster[kReasonNames[r]];
    if (!by.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("memd's cluster '", kReasonNames[r], "' is ", by.dump(), ", not an object"));
    }
    for (const auto& [reason, v] : by.items()) {
      absl::StatusOr<int64_t> n = CounterOf(v, absl::StrCat(kReasonNames[r], ".", reason));
      if (!n.ok()) return n.status();
      (c.*kReasonFields[r])[reason] = *n;
    }
  }
  for (auto [name, field] : {std::pair{"health", &ClusterCounters::health},
                             std::pair{"reachable", &ClusterCounters::reachable}}) {
    if (!cluster.contains(name)) continue;
    if (!cluster[name].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("memd's cluster ", name, " is ", cluster[name].dump(), ", not a string"));
    }
    c.*field = cluster[name].get<std::string>();
  }
  return c;
}

bool CountersWentDown(const ClusterCounters& previous, const ClusterCounters& sample) {
  for (const CounterField& c : kCounterFields) {
    if (sample.*c.field < previous.*c.field) return true;
  }
  for (auto reasons : kReasonFields) {
    for (const auto& [reason, n] : previous.*reasons) {
      if (At(sample.*reasons, reason) < n) return true;
    }
  }
  return false;
}

void ClusterTally::Add(const ClusterSample& sample) {
  if (last_ && (sample.memd_changed || CountersWentDown(*last_, sample.counters))) {
    base_ += *last_;
    ++restarts_;
  }
  last_ = sample.counters;
  last_->health_samples.clear();  // dhs-replay's own fields: kept by the tally, not taken from a sample
  last_->memd_restarts_seen = 0;
  if (!sample.counters.health.empty()) ++health_samples_[sample.counters.health];
}

std::optional<ClusterCounters> ClusterTally::Totals() const {
  if (!last_) return std::nullopt;
  ClusterCounters out = base_;
  out.health.clear();  // the last sample's health and reachable, not the worst of the earlier memds'
  out.reachable.clear();
  out += *last_;
  out.health = last_->health;
  out.reachable = last_->reachable;
  out.health_samples = health_samples_;
  out.memd_restarts_seen = restarts_;
  return out;
}

std::optional<ClusterCounters> TotalClusterCounters(std::span<const ClusterSample> samples) {
  ClusterTally tally;
  for (const ClusterSample& s : samples) tally.Add(s);
  return tally.Totals();
}

}  // namespace dhs::replay
