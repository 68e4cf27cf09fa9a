// memd's cluster-tier counters totalled by dhs-replay across memd restarts (tools/replay/cluster_counters.h; issue 26
// review F3 / F4): parsing memd's status "cluster" object, the restart test, and the accumulation over a sequence of
// samples with restarts in the middle, against totals worked out by hand.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/replay/cluster_counters.h"

namespace dhs::replay {
namespace {

using ::testing::HasSubstr;
using Map = std::map<std::string, int64_t>;

// One memd sample: lookups, hits, imported, published (bytes: 100 per page published, 50 per page imported),
// timeouts, store_down sheds, health.
ClusterCounters Sample(int64_t lookups, int64_t hits, int64_t imported, int64_t published, int64_t timeouts,
                       int64_t shed_down = 0, std::string health = "up") {
  ClusterCounters c;
  c.lookups = lookups;
  c.hits = hits;
  c.imported = imported;
  c.published = published;
  c.published_bytes = 100 * published;
  c.imported_bytes = 50 * imported;
  c.offered = published;
  c.misses = {{"absent", lookups - hits - timeouts}, {"timeout", timeouts}};
  c.shed = {{"queue_full", 0}, {"store_down", shed_down}};
  c.reachable = health == "down" ? "no" : "yes";
  c.health = std::move(health);
  return c;
}

TEST(ClusterCountersOfJson, ReadsMemdsClusterObject) {
  // The shape memd renders (memd/state_dump.cc ClusterJson), with fields this tool does not report (queue, bytes).
  const nlohmann::json j = nlohmann::json::parse(R"({
    "store": "redis://127.0.0.1:6379", "health": "down", "reachable": "no", "queue_depth": 3, "queue_bytes": 999, "offered": 40,
    "published": 30, "published_bytes": 3000, "publish_failed": 2,
    "shed": {"queue_full": 1, "bytes_full": 0, "too_large": 0, "store_down": 7},
    "lookups": 113, "hits": 7, "hit_bytes": 700, "imported": 6, "imported_bytes": 600, "session_lookups": 9,
    "session_hits": 2, "session_imported": 1,
    "misses": {"absent": 10, "timeout": 96, "unavailable": 0, "store_error": 0, "bad_value": 0, "no_room": 1,
               "store_down": 0, "no_geometry": 0, "after_gap": 0},
    "bad_values": {}})");
  absl::StatusOr<ClusterCounters> c = ClusterCountersOfJson(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->lookups, 113);
  EXPECT_EQ(c->hits, 7);
  EXPECT_EQ(c->imported, 6);
  EXPECT_EQ(c->session_imported, 1);
  EXPECT_EQ(c->published, 30);
  EXPECT_EQ(c->published_bytes, 3000);
  EXPECT_EQ(c->imported_bytes, 600);
  EXPECT_EQ(c->offered, 40);
  EXPECT_EQ(c->publish_failed, 2);
  EXPECT_EQ(c->health, "down");
  EXPECT_EQ(c->reachable, "no");
  EXPECT_EQ(c->miss("timeout"), 96);
  EXPECT_EQ(c->miss("no_room"), 1);
  EXPECT_EQ(c->miss("not_a_reason"), 0);
  EXPECT_EQ(c->misses.size(), 9u);
  EXPECT_EQ(c->shed_of("store_down"), 7);
  EXPECT_EQ(c->shed, (Map{{"queue_full", 1}, {"bytes_full", 0}, {"too_large", 0}, {"store_down", 7}}));
  EXPECT_TRUE(c->health_samples.empty());
  EXPECT_EQ(c->memd_restarts_seen, 0);
  // Missing fields read 0 / empty.
  absl::StatusOr<ClusterCounters> empty = ClusterCountersOfJson(nlohmann::json::object());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->lookups, 0);
  EXPECT_TRUE(empty->misses.empty());
  EXPECT_EQ(empty->health, "");
}

TEST(ClusterCountersOfJson, RefusesMalformedObjectsNamingTheField) {
  for (const char* bad : {R"([1, 2])", R"({"lookups": -1})", R"({"hits": "7"})", R"({"misses": [1]})",
                          R"({"misses": {"timeout": 1.5}})", R"({"shed": {"queue_full": -2}})", R"({"health": 3})",
                          R"({"reachable": true})"}) {
    absl::StatusOr<ClusterCounters> c = ClusterCountersOfJson(nlohmann::json::parse(bad));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_THAT(ClusterCountersOfJson(nlohmann::json::parse(R"({"lookups": -1})")).status().message(),
              HasSubstr("'lookups'"));
  EXPECT_THAT(ClusterCountersOfJson(nlohmann::json::parse(R"({"misses": {"timeout": 1.5}})")).status().message(),
              HasSubstr("misses.timeout"));
}

TEST(CountersWentDown, AnyCounterOrReasonBelowThePreviousSample) {
  const ClusterCounters a = Sample(10, 4, 3, 5, 2);
  EXPECT_FALSE(CountersWentDown(a, a));
  EXPECT_FALSE(CountersWentDown(a, Sample(12, 4, 3, 6, 2)));
  EXPECT_TRUE(CountersWentDown(a, Sample(9, 4, 3, 5, 1)));    // lookups (and a reason) went down
  EXPECT_TRUE(CountersWentDown(a, Sample(20, 4, 3, 4, 2)));   // only published went down
  ClusterCounters fewer_timeouts = Sample(10, 4, 3, 5, 2);
  fewer_timeouts.misses["timeout"] = 1;                        // only one reason went down
  fewer_timeouts.misses["absent"] += 1;
  EXPECT_TRUE(CountersWentDown(a, fewer_timeouts));
  ClusterCounters no_reasons = Sample(10, 4, 3, 5, 2);
  no_reasons.misses.clear();                                   // a reason gone reads 0: went down
  EXPECT_TRUE(CountersWentDown(a, no_reasons));
  ClusterCounters other_health = a;
  other_health.health = "down";                                // health is not a counter
  EXPECT_FALSE(CountersWentDown(a, other_health));
}

TEST(ClusterTally, NoSampleIsNoClusterTier) {
  EXPECT_EQ(TotalClusterCounters({}), std::nullopt);
  EXPECT_EQ(ClusterTally().Totals(), std::nullopt);
}

TEST(ClusterTally, OneMemdsTotalsAreItsLastSample) {
  const std::vector<ClusterSample> samples = {{Sample(3, 1, 1, 2, 0)}, {Sample(8, 3, 2, 4, 1)},
                                              {Sample(8, 3, 2, 4, 1)}};
  std::optional<ClusterCounters> t = TotalClusterCounters(samples);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->lookups, 8);
  EXPECT_EQ(t->hits, 3);
  EXPECT_EQ(t->published_bytes, 400);
  EXPECT_EQ(t->miss("timeout"), 1);
  EXPECT_EQ(t->memd_restarts_seen, 0);
  EXPECT_EQ(t->health_samples, (Map{{"up", 3}}));
}

// The reviewer's case: the first memd looked up 300 pages before it was killed, its successor 13 by the end. The last
// sample alone said 13 (and 8 published); the run's totals are both memds' last samples added.
TEST(ClusterTally, ARestartInTheMiddleAddsTheDeadMemdsLastSample) {
  const std::vector<ClusterSample> samples = {
      {Sample(100, 60, 50, 2, 10)},
      {Sample(300, 200, 180, 5, 40, 0, "probing")},  // memd 1's last sample
      {Sample(4, 1, 1, 0, 3)},                       // memd 2: counters went down
      {Sample(13, 7, 6, 8, 5, 2, "down")},           // memd 2's last sample
  };
  std::optional<ClusterCounters> t = TotalClusterCounters(samples);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->lookups, 300 + 13);
  EXPECT_EQ(t->hits, 200 + 7);
  EXPECT_EQ(t->imported, 180 + 6);
  EXPECT_EQ(t->published, 5 + 8);
  EXPECT_EQ(t->published_bytes, 500 + 800);
  EXPECT_EQ(t->imported_bytes, 50 * (180 + 6));
  EXPECT_EQ(t->offered, 13);
  EXPECT_EQ(t->miss("timeout"), 40 + 5);
  EXPECT_EQ(t->miss("absent"), (300 - 200 - 40) + (13 - 7 - 5));
  EXPECT_EQ(t->shed_of("store_down"), 2);
  EXPECT_EQ(t->memd_restarts_seen, 1);
  EXPECT_EQ(t->health, "down");  // the last sample's
  EXPECT_EQ(t->reachable, "no");
  EXPECT_EQ(t->health_samples, (Map{{"up", 2}, {"probing", 1}, {"down", 1}}));
}

// A new memd whose counters already passed its predecessor's by its first sample is seen only through the caller's
// memd_changed (its connection closed); without it the predecessor's counts are lost, never counted twice.
TEST(ClusterTally, AConnectionChangeMarksANewMemdWhoseCountersDidNotGoDown) {
  std::vector<ClusterSample> samples = {{Sample(5, 2, 2, 1, 0)}, {Sample(9, 5, 5, 3, 1), /*memd_changed=*/true}};
  std::optional<ClusterCounters> t = TotalClusterCounters(samples);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->lookups, 5 + 9);
  EXPECT_EQ(t->published, 1 + 3);
  EXPECT_EQ(t->memd_restarts_seen, 1);
  samples[1].memd_changed = false;
  t = TotalClusterCounters(samples);
  EXPECT_EQ(t->lookups, 9);
  EXPECT_EQ(t->memd_restarts_seen, 0);
  // memd_changed on the first sample has no predecessor to add.
  t = TotalClusterCounters(std::vector<ClusterSample>{{Sample(5, 2, 2, 1, 0), true}});
  EXPECT_EQ(t->lookups, 5);
  EXPECT_EQ(t->memd_restarts_seen, 0);
}

TEST(ClusterTally, ThreeMemdsAndTheIncrementalFormAgree) {
  // memd 1: 10 lookups; memd 2 (went down to 2): 6; memd 3 (connection changed, 7 >= 6): 7 -> 23.
  const std::vector<ClusterSample> samples = {{Sample(4, 1, 1, 1, 0)}, {Sample(10, 3, 3, 2, 1)},
                                              {Sample(2, 0, 0, 0, 0)}, {Sample(6, 2, 2, 2, 0)},
                                              {Sample(7, 2, 2, 2, 0), true}};
  ClusterTally tally;
  for (const ClusterSample& s : samples) tally.Add(s);
  std::optional<ClusterCounters> t = tally.Totals();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->lookups, 10 + 6 + 7);
  EXPECT_EQ(t->hits, 3 + 2 + 2);
  EXPECT_EQ(t->miss("timeout"), 1);
  EXPECT_EQ(t->memd_restarts_seen, 2);
  EXPECT_EQ(t->lookups, TotalClusterCounters(samples)->lookups);
}

TEST(ClusterCountersSum, AddsNodesReasonsAndKeepsTheWorseHealth) {
  ClusterCounters a = Sample(10, 4, 3, 5, 2);
  a.health_samples = {{"up", 3}};
  a.memd_restarts_seen = 1;
  ClusterCounters b = Sample(6, 1, 1, 2, 4, 3, "probing");
  b.misses["no_room"] = 1;
  b.health_samples = {{"up", 1}, {"probing", 2}};
  a += b;
  EXPECT_EQ(a.lookups, 16);
  EXPECT_EQ(a.miss("timeout"), 6);
  EXPECT_EQ(a.miss("no_room"), 1);
  EXPECT_EQ(a.shed_of("store_down"), 3);
  EXPECT_EQ(a.health, "probing");
  EXPECT_EQ(a.health_samples, (Map{{"up", 4}, {"probing", 2}}));
  EXPECT_EQ(a.memd_restarts_seen, 1);
  EXPECT_EQ(a.reachable, "yes");
  ClusterCounters down;
  down.health = "down";
  down.reachable = "no";
  a += down;
  EXPECT_EQ(a.health, "down");
  EXPECT_EQ(a.reachable, "no");
  a += Sample(0, 0, 0, 0, 0);  // "up" does not hide a worse one
  EXPECT_EQ(a.health, "down");
  EXPECT_EQ(a.reachable, "no");
}

}  // namespace
}  // namespace dhs::replay
