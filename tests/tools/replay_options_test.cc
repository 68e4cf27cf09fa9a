// dhs-replay command line: defaults, every option, and errors -> exit 2 with a clear message; loading the
// default trace and building the schedule and report settings from options (tools/replay/options.h).
#include <initializer_list>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "memd/prefix_pages.h"  // kPrefixEvictionPolicyNames (issue 24)
#include "tools/replay/options.h"
#include "workerd/speculation/speculation_cli.h"
#include "tests/common/test_util.h"

namespace dhs::replay {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kDataDir = DHS_REPLAY_DATA_DIR;

CommandLine Parse(std::initializer_list<std::string> args) {
  std::vector<std::string> all = {"dhs-replay"};
  all.insert(all.end(), args);
  std::vector<const char*> argv;
  for (const std::string& a : all) argv.push_back(a.c_str());
  return ParseReplayCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(ReplayOptions, Defaults) {
  CommandLine cl = Parse({});
  ASSERT_FALSE(cl.exit_code) << cl.message;
  const ReplayOptions& o = cl.options;
  EXPECT_EQ(o.trace, kDataDir + "/mooncake_conversation_head200.jsonl");
  EXPECT_EQ(o.requests, 24);
  EXPECT_EQ(o.length_scale, 0.1);
  EXPECT_EQ(o.concurrency, 4);  // closed loop by default
  EXPECT_FALSE(o.time_scale);
  EXPECT_EQ(o.mode, WorkerMode::kAdaptive);
  EXPECT_FALSE(o.hbm_budget_bytes);
  EXPECT_FALSE(o.check_exact);
  EXPECT_TRUE(o.sweep.empty());
  EXPECT_TRUE(o.json_out.empty());
  EXPECT_TRUE(o.connect.empty());
}

TEST(ReplayOptions, EveryOption) {
  const std::string csv_trace = kDataDir + "/azure_llm_code_2023_head200.csv";
  CommandLine cl = Parse({"--trace", csv_trace, "--requests", "10", "--time-scale", "0.25", "--length-scale", "0.5",
                          "--mode", "hisparse", "--hbm-budget", "2GiB", "--json", "r.json", "--csv",
                          "r.csv", "--connect", "ipc:///tmp/node.sock", "--run-dir", "run/x"});
  ASSERT_FALSE(cl.exit_code) << cl.message;
  const ReplayOptions& o = cl.options;
  EXPECT_EQ(o.trace, csv_trace);
  EXPECT_EQ(o.requests, 10);
  EXPECT_EQ(o.time_scale, 0.25);
  EXPECT_FALSE(o.concurrency);
  EXPECT_EQ(o.length_scale, 0.5);
  EXPECT_EQ(o.mode, WorkerMode::kHisparse);
  EXPECT_EQ(o.hbm_budget_bytes, int64_t{2} << 30);
  EXPECT_FALSE(o.check_exact);  // not with --connect (see BadValuesExitTwoWithAClearMessage)
  EXPECT_EQ(o.json_out, "r.json");
  EXPECT_EQ(o.csv_out, "r.csv");
  EXPECT_EQ(o.connect, "ipc:///tmp/node.sock");
  EXPECT_EQ(o.run_dir, "run/x");
}

TEST(ReplayOptions, SizesAndModes) {
  EXPECT_EQ(Parse({"--hbm-budget", "1000"}).options.hbm_budget_bytes, 1000);
  EXPECT_EQ(Parse({"--hbm-budget", "3KB"}).options.hbm_budget_bytes, 3000);
  EXPECT_EQ(Parse({"--hbm-budget", "3KiB"}).options.hbm_budget_bytes, 3072);
  EXPECT_EQ(Parse({"--mode", "resident"}).options.mode, WorkerMode::kResident);
  EXPECT_EQ(Parse({"--mode", "ADAPTIVE"}).options.mode, WorkerMode::kAdaptive);
  EXPECT_EQ(Parse({"--reclaim-policy", "largest-first"}).options.reclaim_policy, "largest-first");
  EXPECT_EQ(Parse({}).options.reclaim_policy, "");  // memd's own default
  EXPECT_EQ(Parse({"--preset", "bench-wide"}).options.preset, "bench-wide");
  EXPECT_EQ(WorkerModeName(WorkerMode::kHisparse), "hisparse");
}

TEST(ReplayOptions, SpeculationOptionsReachTheRunSettings) {
  CommandLine cl = Parse({"--speculate", "synthetic", "--block", "3", "--block-schedule", "1:3,4:2",
                          "--spec-corruption", "0.25"});
  ASSERT_FALSE(cl.exit_code) << cl.message;
  EXPECT_EQ(cl.options.speculation.mode, spec::SpeculateMode::kSynthetic);
  EXPECT_EQ(cl.options.speculation.block, 3);
  EXPECT_EQ(cl.options.speculation.schedule, "1:3,4:2");
  EXPECT_EQ(cl.options.speculation.corruption, 0.25);
  EXPECT_EQ(Parse({}).options.speculation.mode, spec::SpeculateMode::kOff);
  EXPECT_EQ(spec::SpeculationArgs(cl.options.speculation),
            (std::vector<std::string>{"--speculate", "synthetic", "--block", "3", "--spec-confidence", "0.500000",
                                      "--spec-corruption", "0.250000", "--block-schedule", "1:3,4:2"}));
  EXPECT_TRUE(spec::SpeculationArgs(Parse({}).options.speculation).empty());
}

TEST(ReplayOptions, SweepIsSortedAndPlotNeedsIt) {
  CommandLine cl = Parse({"--sweep", "8,2,4", "--plot", "s.png"});
  ASSERT_FALSE(cl.exit_code) << cl.message;
  EXPECT_THAT(cl.options.sweep, ElementsAre(2, 4, 8));
  EXPECT_FALSE(cl.options.concurrency);  // the sweep gives the concurrencies
  EXPECT_EQ(cl.options.plot_out, "s.png");
}

TEST(ReplayOptions, HelpExitsZero) {
  CommandLine cl = Parse({"--help"});
  ASSERT_EQ(cl.exit_code, 0);
  EXPECT_THAT(cl.message, HasSubstr("--trace"));
  EXPECT_THAT(cl.message, HasSubstr("--sweep"));
}

struct BadArgs {
  std::vector<std::string> args;
  std::string message;
};

// Issue 24: memd's cache limits. The policies are memd's one list (memd/prefix_pages.h kPrefixEvictionPolicyNames):
// each is taken, another name is refused naming the option; both limits need --prefix-sharing on and a node the tool
// starts (exit 2 with a message saying which), and reach the report's settings.
TEST(ReplayOptions, PrefixCacheLimits) {
  for (std::string_view policy : memd::kPrefixEvictionPolicyNames) {
    CommandLine cl = Parse({"--prefix-sharing", "on", "--prefix-eviction", std::string(policy)});
    ASSERT_FALSE(cl.exit_code) << cl.message;
    EXPECT_EQ(cl.options.prefix_eviction, policy);
  }
  CommandLine cl = Parse({"--prefix-sharing", "on", "--prefix-eviction", "fifo", "--prefix-tenant-quota-pages", "12"});
  ASSERT_FALSE(cl.exit_code) << cl.message;
  EXPECT_EQ(cl.options.prefix_tenant_quota_pages, 12);
  auto trace = LoadTrace(cl.options);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const RunSettings s = MakeRunSettings(cl.options, *trace, "prefill");
  EXPECT_EQ(s.prefix_eviction, "fifo");
  EXPECT_EQ(s.prefix_tenant_quota_pages, 12);
  EXPECT_EQ(Parse({}).options.prefix_eviction, "");  // memd's own default
  EXPECT_EQ(Parse({}).options.prefix_tenant_quota_pages, 0);
  const std::vector<BadArgs> cases = {
      {{"--prefix-sharing", "on", "--prefix-eviction", "random"}, "--prefix-eviction: random not in {lru,fifo}"},
      {{"--prefix-eviction", "lru"}, "--prefix-eviction needs --prefix-sharing on"},
      {{"--prefix-sharing", "off", "--prefix-eviction", "fifo"}, "--prefix-eviction needs --prefix-sharing on"},
      {{"--prefix-tenant-quota-pages", "8"}, "--prefix-tenant-quota-pages needs --prefix-sharing on"},
      {{"--prefix-sharing", "on", "--prefix-tenant-quota-pages", "-1"}, "--prefix-tenant-quota-pages: must be an integer"},
      {{"--prefix-sharing", "on", "--prefix-tenant-quota-pages", "4294967296"},
       "--prefix-tenant-quota-pages: must be an integer in [0, 4294967295]"},
      {{"--prefix-eviction", "lru", "--connect", "ipc:///tmp/n.sock"}, "--prefix-eviction applies to the memd of a node"},
      {{"--prefix-tenant-quota-pages", "3", "--connect", "ipc:///tmp/n.sock"},
       "--prefix-tenant-quota-pages applies to the memd of a node the tool starts, not to --connect"},
      // A tenant the worker would refuse (common/protocol.h kMaxTenantBytes 256), alone or with its mix suffix.
      {{"--tenant", std::string(257, 't')}, "--tenant: tenants of up to 257 bytes (at most 256)"},
      {{"--tenant", std::string(254, 't'), "--tenants", "11"}, "--tenant: tenants of up to 257 bytes"},  // "#10"
      {{"--tenants", "2", "--tenant-by", "row"}, "--tenant-by: row not in {session,index}"},
      {{"--cluster-lookup-timeout-ms", "20"}, "--cluster-lookup-timeout-ms needs --cluster-store"},
      {{"--nodes", "2", "--cluster-store", "redis://127.0.0.1"}, "--cluster-store: redis seed"},
      {{"--nodes", "2", "--cluster-store", "redis://127.0.0.1:0"}, "port 1..65535"},
      {{"--nodes", "2", "--cluster-store", "redis://:pw@127.0.0.1:6379"}, "credentials in the address"},
      {{"--cluster-store", "local", "--cluster-lookup-timeout-ms", "0"}, "--cluster-lookup-timeout-ms: "},
  };
  for (const BadArgs& c : cases) {
    std::vector<std::string> all = {"dhs-replay"};
    all.insert(all.end(), c.args.begin(), c.args.end());
    std::vector<const char*> argv;
    for (const std::string& a : all) argv.push_back(a.c_str());
    CommandLine bad = ParseReplayCommandLine(static_cast<int>(argv.size()), argv.data());
    EXPECT_EQ(bad.exit_code, 2) << c.args[1];
    EXPECT_THAT(bad.message, HasSubstr(c.message)) << c.args[1];
  }
}

TEST(ReplayOptions, BadValuesExitTwoWithAClearMessage) {
  const std::vector<BadArgs> cases = {
      {{"--concurrency", "2", "--time-scale", "1"}, "excludes"},
      {{"--sweep", "1,2", "--outputs", "o.jsonl"}, "--outputs with --sweep needs --prefixes (each point's outputs go to OUT.c<C>)"},
      {{"--idle-timeout-ms", "999"}, "--idle-timeout-ms: must be an integer in [1000, 86400000], got '999'"},
      {{"--concurrency", "0"}, "--concurrency: must be an integer in [1, 9223372036854775807], got '0'"},
      {{"--concurrency", "1e3"}, "--concurrency: must be an integer in [1, 9223372036854775807], got '1e3'"},
      {{"--concurrency", "many"}, "--concurrency"},
      {{"--time-scale", "-1"}, "--time-scale must be a number >= 0"},
      {{"--requests", "0"}, "--requests: must be an integer in [1, 9223372036854775807], got '0'"},
      {{"--requests", "2.5"}, "--requests: must be an integer in [1, 9223372036854775807], got '2.5'"},
      {{"--slots", "1e2"}, "--slots: must be an integer in [1, 1024], got '1e2'"},
      {{"--seed", "-1"}, "--seed: must be an integer in [0, 18446744073709551615], got '-1'"},
      {{"--reattach-timeout-ms", "1e3"}, "--reattach-timeout-ms: must be an integer in [0, 9223372036854775807]"},
      {{"--length-scale", "0"}, "--length-scale must be a number > 0"},
      {{"--length-scale", "-0.5"}, "--length-scale must be a number > 0"},
      {{"--mode", "fast"}, "--mode"},
      {{"--hbm-budget", "0"}, "--hbm-budget must be > 0 bytes"},
      {{"--hbm-budget", "lots"}, "--hbm-budget"},
      {{"--sweep", "2,0"}, "--sweep: every concurrency must be >= 1"},
      {{"--sweep", "2,2"}, "--sweep: concurrency 2 is repeated"},
      {{"--sweep", "2,4", "--concurrency", "3"}, "excludes"},
      {{"--sweep", "2,4", "--time-scale", "1"}, "excludes"},
      {{"--plot", "x.png"}, "--plot requires --sweep"},
      {{"--trace", "/nonexistent/trace.jsonl"}, "/nonexistent/trace.jsonl"},
      {{"--connect", "localhost:5555"}, "--connect must be a tcp:// or ipc:// endpoint"},
      {{"--reclaim-policy", "random"}, "--reclaim-policy"},
      {{"--reclaim-policy", "newest-first", "--connect", "ipc:///tmp/n.sock"}, "not to --connect"},
      {{"--check-exact", "--connect", "ipc:///tmp/n/worker-0.sock"}, "--check-exact needs a resident reference"},
      {{"--json", "/nonexistent/dir/r.json"}, "--json: directory '/nonexistent/dir' of '/nonexistent/dir/r.json' does not exist"},
      {{"--csv", "/nonexistent/r.csv"}, "--csv: directory '/nonexistent'"},
      {{"--sweep", "1,2", "--plot", "/nonexistent/p.png"}, "--plot: directory '/nonexistent'"},
      {{"--json", "/proc/self/status/r.json"}, "does not exist"},  // the parent is a file, not a directory
      {{"--bogus"}, "--bogus"},
      {{"--speculate", "always"}, "--speculate"},
      {{"--speculate", "synthetic", "--connect", "ipc:///tmp/n/worker-0.sock"}, "--speculate applies to the worker"},
  };
  for (const BadArgs& c : cases) {
    std::vector<std::string> all = {"dhs-replay"};
    all.insert(all.end(), c.args.begin(), c.args.end());
    std::vector<const char*> argv;
    for (const std::string& a : all) argv.push_back(a.c_str());
    CommandLine cl = ParseReplayCommandLine(static_cast<int>(argv.size()), argv.data());
    ASSERT_EQ(cl.exit_code, 2) << c.args[0];
    EXPECT_THAT(cl.message, HasSubstr(c.message)) << c.args[0];
    EXPECT_THAT(cl.message, ::testing::StartsWith("dhs-replay: "));
  }
}

TEST(ReplayOptions, ValidateCatchesProgrammaticCombinations) {
  ReplayOptions o;
  EXPECT_TRUE(ValidateReplayOptions(o).ok());
  o.concurrency = 2;
  o.time_scale = 1;
  EXPECT_THAT(std::string(ValidateReplayOptions(o).message()), HasSubstr("exclude each other"));
  ReplayOptions p;
  p.plot_out = "x.png";
  EXPECT_THAT(std::string(ValidateReplayOptions(p).message()), HasSubstr("--plot needs --sweep"));
}

TEST(ReplayOptions, CheckExactWithConnectIsRejected) {
  ReplayOptions o;
  o.check_exact = true;
  EXPECT_TRUE(ValidateReplayOptions(o).ok());  // with a node the tool starts: fine
  o.connect = "ipc:///tmp/dhs-run/worker-0.sock";
  absl::Status s = ValidateReplayOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("same worker"));
  o.connect = "tcp://127.0.0.1:5555";  // over TCP too, once the worker's CURVE key is given
  o.curve_server_key = "/tmp/dhs-run/serving-curve.pub";
  s = ValidateReplayOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("same worker"));
}

// Fault injection (issue 11): the values, repeated --kill-worker-at, and the refused combinations.
TEST(ReplayOptions, FaultInjection) {
  CommandLine cl = Parse({"--kill-worker-every", "2.5", "--restart-memd-every", "30", "--fault-seed", "12",
                          "--fault-distribution", "uniform", "--kill-worker-at", "prefill:3", "--kill-worker-at",
                          "random:2"});
  ASSERT_FALSE(cl.exit_code) << cl.message;
  EXPECT_EQ(cl.options.kill_worker_every_s, 2.5);
  EXPECT_EQ(cl.options.restart_memd_every_s, 30);
  EXPECT_EQ(cl.options.fault_seed, 12u);
  EXPECT_EQ(cl.options.fault_distribution, "uniform");
  EXPECT_THAT(cl.options.kill_worker_at, ElementsAre("prefill:3", "random:2"));
  EXPECT_TRUE(InjectsFaults(cl.options));
  EXPECT_FALSE(InjectsFaults(Parse({}).options));
  const std::pair<std::vector<std::string>, const char*> bad[] = {
      {{"--kill-worker-every", "2", "--connect", "ipc:///tmp/x/worker-0.sock"}, "not --connect"},
      {{"--kill-worker-every", "-1"}, "--kill-worker-every must be a number of seconds > 0"},
      {{"--kill-worker-every", "0"}, "--kill-worker-every must be a number of seconds > 0, got 0"},
      {{"--restart-memd-every", "0"}, "--restart-memd-every must be a number of seconds > 0, got 0"},
      {{"--restart-memd-every", "nan"}, "--restart-memd-every must be"},
      {{"--kill-worker-at", "decode:0"}, "--kill-worker-at: fault kill 'decode:0': N must be"},
      {{"--kill-worker-at", "nap:3"}, "unknown kind 'nap'"},
      {{"--kill-worker-at", "decode:3", "--sweep", "1,2"}, "not to --sweep"},
      {{"--corrupt-host-page-for-test"}, "needs --kill-worker-every"},
      {{"--fault-distribution", "normal"}, "--fault-distribution"}};
  for (const auto& [args, want] : bad) {
    std::vector<const char*> argv = {"dhs-replay"};
    for (const std::string& a : args) argv.push_back(a.c_str());
    CommandLine b = ParseReplayCommandLine(static_cast<int>(argv.size()), argv.data());
    ASSERT_TRUE(b.exit_code) << want;
    EXPECT_EQ(*b.exit_code, 2) << want;
    EXPECT_THAT(b.message, HasSubstr(want));
  }
}

TEST(ReplayOptions, OutputPathsInExistingDirectoriesPass) {
  ReplayOptions o;
  o.json_out = "r.json";  // the current directory
  o.csv_out = dhs::testing::ProcessTempDir() + "/r.csv";
  EXPECT_TRUE(ValidateOutputPaths(o).ok()) << ValidateOutputPaths(o);
  o.csv_out = dhs::testing::ProcessTempDir() + "/missing-dir-of-replay-test/r.csv";
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateOutputPaths(o)));
}

TEST(LoadTrace, DefaultsGiveTheFirst24ScaledRequests) {
  ReplayOptions o;  // bundled slice, 24 requests, length scale 0.1
  auto trace = LoadTrace(o);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->requests.size(), 24u);
  EXPECT_EQ(trace->block_tokens, 51);               // 512 * 0.1 = 51.2
  EXPECT_EQ(trace->requests[0].input_tokens, 676);  // 6758 * 0.1 = 675.8
  EXPECT_EQ(trace->requests[0].output_tokens, 50);  // 500 * 0.1
  o.requests = 500;
  EXPECT_THAT(std::string(LoadTrace(o).status().message()), HasSubstr("has only 200 requests"));
}

TEST(MakeScheduler, FollowsTheOptions) {
  ReplayOptions o;
  auto trace = LoadTrace(o);
  ASSERT_TRUE(trace.ok());
  o.concurrency = 3;
  auto closed = MakeScheduler(o, *trace);
  ASSERT_TRUE(closed.ok());
  EXPECT_FALSE(closed->open_loop());
  EXPECT_EQ(closed->Due(0, 0).size(), 3u);
  auto point = MakeScheduler(o, *trace, 5);  // a sweep point overrides
  EXPECT_EQ(point->Due(0, 0).size(), 5u);
  o.concurrency.reset();
  o.time_scale = 0;  // open loop, all at once
  auto open = MakeScheduler(o, *trace);
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->open_loop());
  EXPECT_EQ(open->Due(0, 0).size(), 24u);
}

TEST(SweepCsvPath, CsvOptionOrBesideThePlot) {
  ReplayOptions o;
  o.sweep = {1, 2};
  EXPECT_EQ(SweepCsvPath(o), "");
  o.plot_out = "out/sweep.png";
  EXPECT_EQ(SweepCsvPath(o), "out/sweep.csv");
  o.plot_out = "out/sweep";
  EXPECT_EQ(SweepCsvPath(o), "out/sweep.csv");
  o.csv_out = "rows.csv";
  EXPECT_EQ(SweepCsvPath(o), "rows.csv");
}

TEST(MakeRunSettings, EchoesOptionsAndTrace) {
  ReplayOptions o;
  o.mode = WorkerMode::kResident;
  o.hbm_budget_bytes = 4096;
  auto trace = LoadTrace(o);
  ASSERT_TRUE(trace.ok());
  RunSettings s = MakeRunSettings(o, *trace, "prepared-prefix");
  EXPECT_EQ(s.trace_path, o.trace);
  EXPECT_EQ(s.trace_format, "mooncake");
  EXPECT_EQ(s.block_tokens, 51);  // round(512 * 0.1)
  EXPECT_EQ(s.mode, "resident");
  EXPECT_EQ(s.prefill, "prepared-prefix");
  EXPECT_EQ(s.concurrency, 4);
  EXPECT_EQ(s.hbm_budget_bytes, 4096);
  EXPECT_EQ(MakeRunSettings(o, *trace, "prefill", 8).concurrency, 8);
}

// Issue 26: --nodes, --route, --cluster-store.
TEST(ReplayOptions, MultiNodeOptions) {
  CommandLine cl = Parse({"--nodes", "3", "--route", "prefix", "--prefix-sharing", "on", "--cluster-store",
                          "redis://127.0.0.1:7000,127.0.0.1:7001"});
  ASSERT_FALSE(cl.exit_code) << cl.message;
  EXPECT_EQ(cl.options.nodes, 3);
  EXPECT_EQ(cl.options.route, "prefix");
  EXPECT_EQ(cl.options.cluster_store, "redis://127.0.0.1:7000,127.0.0.1:7001");
  EXPECT_EQ(Parse({}).options.nodes, 1);  // one node, as before
  EXPECT_EQ(Parse({}).options.route, "round-robin");
  EXPECT_EQ(Parse({}).options.cluster_store, "");
  EXPECT_FALSE(Parse({"--cluster-store", "local"}).exit_code);
  EXPECT_FALSE(Parse({"--cluster-store", "local-cluster", "--nodes", "2"}).exit_code);
  auto expect_bad = [](const CommandLine& c, const std::string& message) {
    EXPECT_EQ(c.exit_code, 2) << message;
    EXPECT_THAT(c.message, HasSubstr(message));
  };
  expect_bad(Parse({"--nodes", "0"}), "--nodes");
  expect_bad(Parse({"--nodes", "17"}), "--nodes");
  expect_bad(Parse({"--route", "random"}), "--route");
  expect_bad(Parse({"--nodes", "2", "--route", "prefix"}), "--route prefix needs --prefix-sharing on");
  expect_bad(Parse({"--nodes", "2", "--connect", "ipc:///tmp/x/worker-0.sock"}), "not with --connect");
  EXPECT_FALSE(Parse({"--nodes", "2", "--kill-worker-every", "1"}).exit_code);  // every node supervised
  expect_bad(Parse({"--cluster-store", "memcached://x"}), "--cluster-store must be");
  expect_bad(Parse({"--cluster-store", "local", "--connect", "ipc:///tmp/x/worker-0.sock"}), "--cluster-store");
}

}  // namespace
}  // namespace dhs::replay
