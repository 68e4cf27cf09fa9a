// dhs-node's configuration (tools/node/node_config.h, node_geometry.h): a good file gives the daemons' exact command
// lines; each kind of error names the key and the problem; memd's page size comes from the presets' row sizes.
#include "tools/node/node_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tools/node/node_geometry.h"
#include "workerd/model/config.h"

namespace dhs::node {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kGood[] = R"(
[node]
run_dir = "/tmp/dhs-node-test"

[memd]
host_pool_bytes = "64MiB"
reserve_pages = 4
reclaim_policy = "oldest-first"
metrics_address = "127.0.0.1:0"

[[worker]]
gpu = 0
mode = "adaptive"
preset = "glm5-like"
page_rows = 16
hbm_budget_bytes = "1MiB"
slots = 2

[[worker]]
gpu = 3
mode = "resident"
device = "cpu"
preset = "glm5-like"
page_rows = 16
extra_args = ["--link-model", "pcie4"]

[supervise]
backoff_initial_ms = 100
backoff_max_ms = 1600
max_restarts = 3
restart_window_s = 60
stop_grace_ms = 2000
restart_workers_with_memd = false
worker_liveness_timeout_ms = 2500
)";

// The error message of parsing `text`, "" when it parsed.
std::string ErrorOf(const std::string& text) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(text);
  if (c.ok()) return "";
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(c.status().message());
}

// kGood with `from` replaced by `to` (which must occur).
std::string Edited(const std::string& from, const std::string& to) {
  std::string text = kGood;
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(NodeConfig, GoodConfigGivesTheDaemonsCommandLines) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(kGood);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->run_dir, "/tmp/dhs-node-test");
  ASSERT_EQ(c->workers.size(), 2u);
  EXPECT_EQ(c->workers[1].gpu, 3u);
  EXPECT_THAT(MemdArgs(*c, 4096),
              ElementsAre("--run-dir", "/tmp/dhs-node-test", "--page-bytes", "4096", "--host-pool-bytes", "67108864",
                          "--reserve-pages", "4", "--reclaim-policy", "oldest-first", "--metrics-address",
                          "127.0.0.1:0"));
  EXPECT_THAT(WorkerArgs(*c, 0),
              ElementsAre("--run-dir", "/tmp/dhs-node-test", "--gpu", "0", "--mode", "adaptive", "--preset",
                          "glm5-like", "--hbm-budget", "1048576", "--slots", "2", "--page-rows", "16"));
  EXPECT_THAT(WorkerArgs(*c, 1),
              ElementsAre("--run-dir", "/tmp/dhs-node-test", "--gpu", "3", "--mode", "resident", "--device", "cpu",
                          "--preset", "glm5-like", "--page-rows", "16", "--link-model", "pcie4"));
  EXPECT_EQ(c->supervise.backoff_initial_ms, 100);
  EXPECT_EQ(c->supervise.backoff_max_ms, 1600);
  EXPECT_EQ(c->supervise.max_restarts, 3u);
  EXPECT_EQ(c->supervise.restart_window_ms, 60000);
  EXPECT_EQ(c->supervise.stop_grace_ms, 2000);
  EXPECT_FALSE(c->supervise.restart_workers_with_memd);
  EXPECT_EQ(c->supervise.start_timeout_ms, SupervisorPolicy{}.start_timeout_ms);  // not given: the default
  EXPECT_EQ(c->supervise.worker_liveness_timeout_ms, 2500);
}

TEST(NodeConfig, LivenessTimeoutsAndTheAdoptionGraceArePassedAndChecked) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(
      Edited("reserve_pages = 4", "reserve_pages = 4\nworker_timeout_ms = 5000\nadopt_grace_ms = 0"));
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> memd = MemdArgs(*c, 4096);
  for (const auto& [flag, value] : {std::pair<std::string, std::string>{"--worker-timeout-ms", "5000"},
                                    {"--adopt-grace-ms", "0"}}) {
    auto at = std::find(memd.begin(), memd.end(), flag);
    ASSERT_NE(at, memd.end()) << flag;
    EXPECT_EQ(*(at + 1), value) << flag;
  }
  c = ParseNodeConfig(Edited("page_rows = 16\nextra_args", "page_rows = 16\nmemd_timeout_ms = 1500\nextra_args"));
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> worker = WorkerArgs(*c, 1);
  auto at = std::find(worker.begin(), worker.end(), "--memd-timeout-ms");
  ASSERT_NE(at, worker.end());
  EXPECT_EQ(*(at + 1), "1500");
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "worker_timeout_ms = 99")), HasSubstr("memd.worker_timeout_ms"));
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "adopt_grace_ms = 600001")), HasSubstr("memd.adopt_grace_ms"));
}

// Issue 26: the cluster tier's keys are memd flags of the one list, in its order; memd.cluster_store needs sharing on.
TEST(NodeConfig, ClusterStoreKeysBecomeMemdFlags) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(Edited(
      "reserve_pages = 4", "reserve_pages = 4\ncluster_lookup_timeout_ms = 7\ncluster_store = \"redis://127.0.0.1:6399\"\n"
                           "prefix_sharing = \"on\""));
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> memd = MemdArgs(*c, 4096);
  const std::vector<std::string> tail(memd.end() - 4, memd.end());
  EXPECT_THAT(tail, ElementsAre("--cluster-store", "redis://127.0.0.1:6399", "--cluster-lookup-timeout-ms", "7"));
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "cluster_store = \"redis://127.0.0.1:6399\"")),
              HasSubstr("memd.cluster_store: needs memd.prefix_sharing = \"on\""));
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "prefix_sharing = \"on\"\ncluster_lookup_timeout_ms = 0")),
              HasSubstr("memd.cluster_lookup_timeout_ms"));
  // Off by default: no flag passed.
  absl::StatusOr<NodeConfig> plain = ParseNodeConfig(Edited("reserve_pages = 4", "reserve_pages = 4"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<std::string> args = MemdArgs(*plain, 4096);
  EXPECT_EQ(std::find(args.begin(), args.end(), "--cluster-store"), args.end());
}

// Issue 24: the KV event stream's keys are memd flags of the one list (memd/memd_flags.h), in its order, checked here.
TEST(NodeConfig, KvEventKeysBecomeMemdFlags) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(Edited(
      "reserve_pages = 4", "reserve_pages = 4\nkv_events_hwm = 64\nkv_events = \"on\"\nprefix_sharing = \"on\""));
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> memd = MemdArgs(*c, 4096);
  const std::vector<std::string> tail(memd.end() - 6, memd.end());  // the list's order: sharing, then the stream
  EXPECT_THAT(tail, ElementsAre("--prefix-sharing", "on", "--kv-events", "on", "--kv-events-hwm", "64")) << memd.size();
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "kv_events = \"yes\"")), HasSubstr("memd.kv_events"));
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "kv_events_hwm = 0")), HasSubstr("memd.kv_events_hwm"));
  // The host tier's own keys need it on (memd refuses them too).
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "kv_events = \"on\"")),
              HasSubstr("memd.kv_events: needs memd.prefix_sharing = \"on\""));
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "prefix_sharing = \"off\"\nprefix_tenant_quota_pages = 5")),
              HasSubstr("memd.prefix_tenant_quota_pages: needs memd.prefix_sharing = \"on\""));
  EXPECT_THAT(ErrorOf(Edited("reserve_pages = 4", "prefix_eviction = \"fifo\"")), HasSubstr("memd.prefix_eviction"));
  EXPECT_TRUE(ParseNodeConfig(Edited("reserve_pages = 4", "prefix_sharing = \"on\"\nprefix_eviction = \"fifo\"\n"
                                                          "prefix_tenant_quota_pages = 5"))
                  .ok());
}

TEST(NodeConfig, SpeculationKeysBecomeWorkerFlags) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(Edited(
      "page_rows = 16\nextra_args",
      "page_rows = 16\nspeculate = \"fixed\"\nblock = 4\nblock_schedule = \"online\"\nspec_confidence = 0.25\n"
      "spec_corruption = 1\ndrafter_weights = \"/w/drafter.safetensors\"\nextra_args"));
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> worker = WorkerArgs(*c, 1);
  for (const auto& [flag, value] : {std::pair<std::string, std::string>{"--speculate", "fixed"},
                                    {"--block", "4"},
                                    {"--block-schedule", "online"},
                                    {"--spec-confidence", "0.25"},
                                    {"--spec-corruption", "1"},
                                    {"--drafter-weights", "/w/drafter.safetensors"}}) {
    auto at = std::find(worker.begin(), worker.end(), flag);
    ASSERT_NE(at, worker.end()) << flag;
    EXPECT_EQ(*(at + 1), value) << flag;
  }
  EXPECT_THAT(ErrorOf(Edited("slots = 2", "slots = 2\nspec_confidence = 1.5")),
              HasSubstr("worker[0].spec_confidence: 1.5 is out of range [0, 1]"));
  EXPECT_THAT(ErrorOf(Edited("slots = 2", "slots = 2\nspec_corruption = \"half\"")),
              HasSubstr("worker[0].spec_corruption: expected a number in [0, 1], got a string"));
  EXPECT_THAT(ErrorOf(Edited("slots = 2", "slots = 2\nspeculate = \"always\"")),
              HasSubstr("worker[0].speculate: 'always' is not one of off, fixed, confidence, synthetic"));
  EXPECT_THAT(ErrorOf(Edited("slots = 2", "slots = 2\nblock = 0")), HasSubstr("worker[0].block: 0 is out of range"));
}

TEST(NodeConfig, PageBytesGivenIsPassedAsIs) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(Edited("reserve_pages = 4", "page_bytes = 2560"));
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<std::string> args = MemdArgs(*c, 999);
  EXPECT_THAT(std::vector<std::string>(args.begin(), args.begin() + 4),
              ElementsAre("--run-dir", "/tmp/dhs-node-test", "--page-bytes", "2560"));
}

TEST(NodeConfig, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64MiB"), 64u << 20);
  EXPECT_EQ(*ParseByteSize("2 GiB"), uint64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("3G"), 3000000000u);
  EXPECT_EQ(*ParseByteSize("5kb"), 5000u);
  EXPECT_EQ(*ParseByteSize("1TiB"), uint64_t{1} << 40);
  EXPECT_FALSE(ParseByteSize("").ok());
  EXPECT_FALSE(ParseByteSize("MiB").ok());
  EXPECT_FALSE(ParseByteSize("-1").ok());
  EXPECT_FALSE(ParseByteSize("12 furlongs").ok());
  EXPECT_FALSE(ParseByteSize("18446744073709551616").ok());  // 2^64
  EXPECT_FALSE(ParseByteSize("20000000TiB").ok());           // 2^64 overflow after the unit
}

TEST(NodeConfig, EachErrorNamesTheKeyAndTheProblem) {
  struct Case {
    std::string text, key, problem;
  };
  const std::vector<Case> cases = {
      {Edited("reserve_pages = 4", "reserve_pagez = 4"), "memd.reserve_pagez", "unknown key"},
      {Edited("[supervise]", "[supervize]"), "supervize", "unknown table"},
      {Edited("slots = 2", "slots = \"2\""), "worker[0].slots", "expected an integer, got a string"},
      {Edited("slots = 2", "slots = 0"), "worker[0].slots", "0 is out of range [1, 4096]"},
      {Edited("slots = 2", "slots = 5000"), "worker[0].slots", "5000 is out of range [1, 4096]"},
      {Edited("reserve_pages = 4", "reserve_pages = -4"), "memd.reserve_pages", "must not be negative"},
      {Edited("gpu = 3", "gpu = 0"), "worker[1].gpu", "GPU 0 is already configured by worker[0]"},
      {Edited("gpu = 3", "gpu = 65536"), "worker[1].gpu", "out of range [0, 65535]"},
      {Edited("gpu = 3\n", ""), "worker[1].gpu", "missing"},
      {Edited("run_dir = \"/tmp/dhs-node-test\"", ""), "node.run_dir", "missing"},
      {Edited("run_dir = \"/tmp/dhs-node-test\"", "run_dir = 7"), "node.run_dir", "expected a string, got an integer"},
      {Edited("run_dir = \"/tmp/dhs-node-test\"", "run_dir = \"/" + std::string(120, 'x') + "\""), "node.run_dir",
       "too long"},
      {Edited("reclaim_policy = \"oldest-first\"", "reclaim_policy = \"random\""), "memd.reclaim_policy",
       "'random' is not one of oldest-first, newest-first, largest-first"},
      {Edited("mode = \"resident\"", "mode = true"), "worker[1].mode", "expected a string, got a boolean"},
      {Edited("host_pool_bytes = \"64MiB\"", "host_pool_bytes = \"64 parsecs\""), "memd.host_pool_bytes",
       "unknown unit"},
      {Edited("host_pool_bytes = \"64MiB\"", "host_pool_bytes = \"1.5GiB\""), "memd.host_pool_bytes",
       "a size is a whole number"},
      {Edited("host_pool_bytes = \"64MiB\"", "host_pool_bytes = 1\nhost_pool_pages = 8"), "memd.host_pool_pages",
       "excludes memd.host_pool_bytes"},
      {Edited("host_pool_bytes = \"64MiB\"", ""), "memd.host_pool_bytes", "missing"},
      {Edited("reserve_pages = 4", "page_bytes = 100"), "memd.page_bytes", "multiple of 64"},
      {Edited("extra_args = [\"--link-model\", \"pcie4\"]", "extra_args = [\"--x\", 5]"), "worker[1].extra_args[1]",
       "expected a string"},
      {Edited("device = \"cpu\"", "weights = \"/w.safetensors\""), "worker[1].preset", "excludes weights"},
      {Edited("backoff_max_ms = 1600", "backoff_max_ms = 50"), "supervise.backoff_max_ms",
       "below supervise.backoff_initial_ms"},
      {Edited("restart_workers_with_memd = false", "restart_workers_with_memd = 0"),
       "supervise.restart_workers_with_memd", "expected a boolean"},
      {Edited("worker_liveness_timeout_ms = 2500", "worker_liveness_timeout_ms = -1"),
       "supervise.worker_liveness_timeout_ms", "must not be negative"},
      {"[node]\nrun_dir = \"/tmp/x\"\n[memd]\nhost_pool_pages = 8\n", "worker", "missing"},
      {"worker = 3\n[node]\nrun_dir = \"/tmp/x\"\n[memd]\nhost_pool_pages = 8\n", "worker", "expected an array"},
      {"memd = 5\n[node]\nrun_dir = \"/tmp/x\"\n", "memd", "expected a table, got an integer"},
  };
  for (const Case& c : cases) {
    const std::string error = ErrorOf(c.text);
    EXPECT_THAT(error, HasSubstr(c.key + ": ")) << c.text;
    EXPECT_THAT(error, HasSubstr(c.problem)) << c.text;
  }
}

TEST(NodeConfig, SyntaxErrorNamesLineAndColumn) {
  const std::string error = ErrorOf("[node]\nrun_dir = \"/tmp/x\"\nbroken = = 3\n");
  EXPECT_THAT(error, HasSubstr("line 3, column"));
  EXPECT_THAT(ErrorOf("[memd]\nreserve_pages = 1\nreserve_pages = 2\n"), HasSubstr("line 3"));  // duplicate key
}

// p * d_KV * sources from the preset's fields (brief §8 "Units"), computed here.
// memd's pool page = a host page: the payload rows of every source, then every indexer's index keys (float32).
uint64_t PresetPageBytes(const char* preset, uint64_t page_rows) {
  const model::ModelConfig m = *model::PresetConfig(preset);
  int sources = 0, indexers = 0;
  for (const model::LayerSpec& l : m.layers) {
    sources = std::max(sources, static_cast<int>(l.source) + 1);
    indexers += l.has_indexer();
  }
  return page_rows * 4 * (static_cast<uint64_t>(m.d_c + m.d_r) * sources + static_cast<uint64_t>(m.idx_dim) * indexers);
}

TEST(NodeGeometry, PageBytesFromThePresets) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(kGood);
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<uint64_t> bytes = ResolvePageBytes(*c);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, PresetPageBytes("glm5-like", 16));
}

TEST(NodeGeometry, DisagreementsNameTheWorker) {
  // worker[1] with p = 32: twice worker[0]'s pages.
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(Edited("device = \"cpu\"\npreset = \"glm5-like\"\npage_rows = 16",
                                                        "device = \"cpu\"\npreset = \"glm5-like\"\npage_rows = 32"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(std::string(ResolvePageBytes(*c).status().message()), HasSubstr("worker[1]: its pages are"));
  // memd.page_bytes differing from the presets'.
  c = ParseNodeConfig(Edited("reserve_pages = 4", "page_bytes = 64"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(std::string(ResolvePageBytes(*c).status().message()), HasSubstr("but memd.page_bytes gives 64"));
  // A weights file without memd.page_bytes.
  c = ParseNodeConfig(Edited("device = \"cpu\"\npreset = \"glm5-like\"", "weights = \"/w.safetensors\""));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(std::string(ResolvePageBytes(*c).status().message()), HasSubstr("memd.page_bytes: missing"));
  // A budget below one page: the worker's own geometry error, named.
  c = ParseNodeConfig(Edited("hbm_budget_bytes = \"1MiB\"", "hbm_budget_bytes = 64"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(std::string(ResolvePageBytes(*c).status().message()), HasSubstr("worker[0]: "));
}

// The geometry rules (issue 22, workerd's ValidateGeometry) refuse the node before anything starts: an adaptive
// worker's prefill chunk beyond its tail (glm5-like, p = 16, T = 2p: C <= 17); a resident worker keeps every row on
// GPU, so the same chunk is accepted there.
TEST(NodeGeometry, TheWorkersGeometryRulesApply) {
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(
      Edited("hbm_budget_bytes = \"1MiB\"", "hbm_budget_bytes = \"1MiB\"\nhot_rows = 4096\nprefill_chunk = 18"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(std::string(ResolvePageBytes(*c).status().message()),
              HasSubstr("worker[0]: worker: prefill chunk C = 18 > T - p + 1 = 32 - 16 + 1 = 17"));
  c = ParseNodeConfig(Edited("mode = \"resident\"", "mode = \"resident\"\nhot_rows = 4096\nprefill_chunk = 18"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ResolvePageBytes(*c).ok()) << ResolvePageBytes(*c).status();
}

}  // namespace
}  // namespace dhs::node
