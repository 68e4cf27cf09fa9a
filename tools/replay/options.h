// tools/replay/options.h: the dhs-replay command line (issue 5; docs/replay.md) parsed with CLI11 into
// ReplayOptions, validated, and turned into the trace, the schedule and the report settings of a run.
// main() calls ParseReplayCommandLine and then connects the node; the node part is not here.
//
// Thread-safety: free functions over values; no shared state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/replay/closed_loop.h"
#include "tools/replay/report.h"
#include "tools/replay/scheduler.h"
#include "tools/replay/trace.h"
#include "workerd/device/link_model.h"
#include "workerd/model/config.h"  // kPresetNames (the model owns them)
#include "workerd/serving_mode.h"
#include "workerd/speculation/speculation_config.h"

namespace dhs::replay {

// --mode is workerd's serving mode (WorkerMode, workerd/serving_mode.h): resident (every row stays on GPU, the
// exactness reference, brief §7), hisparse (hot cache + host tier, no optional history, brief §5), adaptive
// (resident-first optional history, reclaim and repopulation, brief §4).

// Defaults suit a 2-core machine with the built-in small model: the bundled 200-request Mooncake slice, its
// first 24 requests at 10% of their lengths (median prompt ~700 tokens, output ~35: long enough that histories
// exceed the hot cache and the GPU budget), closed loop at 4; about a minute per run on 2 cores.
struct ReplayOptions {
  static constexpr int64_t kDefaultRequests = 24;
  static constexpr double kDefaultLengthScale = 0.1;
  static constexpr int64_t kDefaultConcurrency = 4;
  static std::string DefaultTrace();  // tools/replay/data/mooncake_conversation_head200.jsonl of this tree

  std::string trace = DefaultTrace();      // --trace FILE (.jsonl Mooncake, .csv Azure)
  int64_t requests = kDefaultRequests;     // --requests N: the first N requests, N >= 1
  std::optional<int64_t> concurrency;      // --concurrency C >= 1: closed loop
  std::optional<double> time_scale;        // --time-scale X >= 0: open loop at arrival_ms * X
  double length_scale = kDefaultLengthScale;  // --length-scale X > 0
  WorkerMode mode = WorkerMode::kAdaptive;    // --mode
  std::optional<int64_t> hbm_budget_bytes;    // --hbm-budget BYTES > 0 (suffixes: KB=1000, KiB=1024, ...)
  bool check_exact = false;                // --check-exact: also run resident and compare tokens (brief §7)
  std::string json_out;                    // --json OUT ("" = none)
  std::string csv_out;                     // --csv OUT ("" = none)
  int64_t idle_timeout_ms = 120000;        // --idle-timeout-ms: fail after this long with requests in flight and no
                                           // event (issue 22: a long prefill at production sizes on the CPU backend)
  std::string outputs_out;                 // --outputs OUT: every request's tokens and logits digests, JSON lines
                                           // (issue 22: exactness across separate runs; "" = none; not with --sweep)
  std::vector<int64_t> sweep;              // --sweep C1,C2,...: closed-loop runs, sorted ascending, distinct, >= 1
  std::string plot_out;                    // --plot OUT.png (needs --sweep)
  std::string connect;                     // --connect ENDPOINT (tcp://... or ipc://...; "" = start a node)
  std::string run_dir;                     // --run-dir DIR (sockets, logs of a node the tool starts)
  std::string preset{model::kDefaultPreset};  // --preset: the built-in model's topology (weights from --seed)
  uint64_t seed = 1;                       // --seed: weights seed of the built-in model
  int64_t slots = 8;                       // --slots: request slots N of the worker the tool starts
  bool prepared_prefix = false;            // --prepared-prefix: import history from hash_ids instead of prefill
  bool chat_turns = false;                 // --chat-turns (issue 26): a next turn's prompt = history + answer + new
                                           // tokens (ChatPrompt), held until its previous turn ended
  int64_t reattach_timeout_ms = 0;         // --reattach-timeout-ms: wait this long for a restarted worker (0: off)
  int64_t request_timeout_ms = 0;          // --request-timeout-ms (issue 22): cancel a request not ended this long
                                           // after its submit (the worker frees it; end reason timeout); 0 = none
  std::string curve_server_key;            // --curve-server-key FILE (issue 22): the tcp:// worker's
                                           // RUN_DIR/serving-curve.pub (needed with --connect tcp://)
  std::string reclaim_policy;              // --reclaim-policy: memd's victim order of a node the tool starts
                                           // (oldest-first / newest-first / largest-first; "" = memd's default)
  // Fault injection (issue 11; docs/replay.md "Faults"): only with a node the tool starts, which it then supervises
  // (tools/replay/supervised_node.h). Any of them turns re-attaching on (reattach_timeout_ms 60000 unless given).
  double kill_worker_every_s = 0;          // --kill-worker-every S > 0: SIGKILL the worker at random times, mean S
  double restart_memd_every_s = 0;         // --restart-memd-every S > 0: SIGKILL memd (restarted) at random times
  std::optional<uint64_t> fault_seed;      // --fault-seed N: seed of the kill times and random kill points (default:
                                           // drawn from the clock; printed either way)
  std::string fault_distribution = "exponential";  // --fault-distribution exponential|uniform (mean S / [S/2, 3S/2])
  std::vector<std::string> kill_worker_at; // --kill-worker-at KIND:N|random:K (repeatable): workerd --fault-kill-at of
                                           // the 1st, 2nd, ... worker start (test-only kill points)
  bool corrupt_host_page_for_test = false; // --corrupt-host-page-for-test: flip a byte of a recorded host page before
                                           // the first timed kill (proves host_rows_lost counts)
  spec::SpeculationConfig speculation;     // --speculate off|synthetic|... --block K --block-schedule S
                                           // --spec-confidence X --spec-corruption X: the workerd the tool starts
                                           // (workerd/speculation/speculation_config.h); the --check-exact reference is plain
  LinkModelConfig link_model;              // --link-model off|pcie5 [--link-h2d-gb-per-s X] [--link-d2h-gb-per-s X]
                                           // [--link-latency-us X]: the host-device link model of the workerd the
                                           // tool starts (docs/link_model.md); off by default
  uint32_t hot_rows = 0;                   // --hot-rows B: workerd's hot-cache rows per slot and source (0 = its auto);
                                           // B = k + window makes speculative unions use the staging arenas (issue 28)
  uint64_t async_device_seed = 0;          // --async-device SEED (issue 28): the workerd the tool starts (both runs
                                           // of --check-exact) uses the CPU device's asynchronous test mode; 0 = off
  // Issue 24 (the content-addressed host tier): memd's --prefix-sharing of the node the tool starts (both runs of
  // --check-exact: the resident reference has no host tier), and the requests' tenants: every request's tenant is
  // --tenant, or with --tenants N > 1 "<--tenant>#<k mod N>", k its session or its trace index (--tenant-by).
  bool prefix_sharing = false;             // --prefix-sharing on|off (default off)
  std::string tenant;                      // --tenant NAME ("" = the default tenant)
  int64_t tenants = 1;                     // --tenants N >= 1: the tenant mix
  TenantKey tenant_by = TenantKey::kSession;  // --tenant-by session|index (RequestTenant)
  std::string prefix_eviction;             // --prefix-eviction: memd's cache eviction policy (memd/prefix_pages.h
                                           // kPrefixEvictionPolicyNames; "" = memd's default, lru); needs sharing on
  int64_t prefix_tenant_quota_pages = 0;   // --prefix-tenant-quota-pages N >= 0: host pages one tenant may store
                                           // (writing + shared + cached); 0 = no quota (memd's default); needs sharing on
  // Issue 26 (several nodes, docs/replay.md "Several nodes"): --nodes N nodes on this machine (1 = one node, as before),
  // each request routed by --route (tools/replay/router.h), and --cluster-store: "" (none), "local" (a redis-server
  // the tool starts), "local-cluster" (a 3-master Redis Cluster it starts) or a redis:// URL / comma-separated seeds.
  int64_t nodes = 1;                       // --nodes N, 1..16
  std::string route = "round-robin";       // --route round-robin|session|prefix (prefix: needs --prefix-sharing on)
  std::string cluster_store;               // --cluster-store local|local-cluster|redis://HOST:PORT[,HOST:PORT...]
  int64_t cluster_lookup_timeout_ms = 0;   // --cluster-lookup-timeout-ms: every memd's (1..10000; 0 = memd's default)
  std::string cluster_store_endpoint;      // not a flag: what every memd gets as --cluster-store (main() resolves
                                           // local / local-cluster to the server it started; a URL is passed as is)
  PrefixWorkload prefix_workload;          // issue 27: --prefixes N --prefix-tokens L ... (tools/replay/closed_loop.h):
                                           // the closed-loop prepared-prefix workload instead of the trace
};

// Whether any fault-injection option is set (the node the tool starts is then supervised).
bool InjectsFaults(const ReplayOptions& options);

// The outcome of parsing argv. When exit_code is set, main prints `message` (to stdout for 0, stderr
// otherwise) and exits with it: 0 after --help, 2 for any bad option or value.
struct CommandLine {
  ReplayOptions options;
  std::optional<int> exit_code;
  std::string message;
};

// Parses `dhs-replay` arguments (argv[0] is the program name) and validates them (ValidateReplayOptions,
// ValidateOutputPaths). --sweep values may be given in any order; they are sorted ascending.
// When neither --concurrency, --time-scale nor --sweep is given, concurrency is kDefaultConcurrency.
CommandLine ParseReplayCommandLine(int argc, const char* const* argv);

// InvalidArgument naming the option for: requests < 1, concurrency < 1, time scale < 0 or not finite,
// length scale <= 0 or not finite, hbm budget <= 0, concurrency/time-scale/sweep combined, a sweep value < 1
// or repeated, --plot without --sweep, an empty --trace, a --connect endpoint other than tcp:// or ipc://,
// --reclaim-policy together with --connect, --link-model (enabled) together with --connect, --check-exact together
// with --connect (the resident reference run
// would go to the same worker: a run compared with itself), a fault-injection option with --connect or with --sweep,
// --kill-worker-every / --restart-memd-every not > 0 or not finite, a --kill-worker-at value ParseHookKills refuses,
// --corrupt-host-page-for-test without --kill-worker-every, --connect tcp:// without --curve-server-key or
// --curve-server-key without --connect tcp://, --request-timeout-ms < 0, --prefix-eviction or
// --prefix-tenant-quota-pages (issue 24: memd's cache limits) with --connect or without --prefix-sharing on;
// issue 26: --nodes outside 1..16, --nodes > 1 with --connect or --prefixes, an unknown --route,
// --route prefix without --prefix-sharing on, --cluster-store other than local, local-cluster or redis://... URLs, or
// with --connect.
absl::Status ValidateReplayOptions(const ReplayOptions& options);

// InvalidArgument naming the option when the directory of --json, --csv or --plot does not exist or is not
// writable (so a long run does not end without its report). Reads the file system; ParseReplayCommandLine
// calls it after ValidateReplayOptions.
absl::Status ValidateOutputPaths(const ReplayOptions& options);

// Reads options.trace, keeps the first options.requests requests, scales lengths by options.length_scale
// (in that order). Errors from ReadTrace / TakeFirst / ScaleLengths.
absl::StatusOr<Trace> LoadTrace(const ReplayOptions& options);

// The scheduler of one run: open loop when time_scale is set, else closed loop at `concurrency` (a sweep point)
// or options.concurrency (or kDefaultConcurrency).
absl::StatusOr<Scheduler> MakeScheduler(const ReplayOptions& options, const Trace& trace,
                                        std::optional<int64_t> concurrency = std::nullopt);

// The report's echo of the trace and settings. prefill: what the node used ("prefill" / "prepared-prefix").
RunSettings MakeRunSettings(const ReplayOptions& options, const Trace& trace, std::string_view prefill,
                            std::optional<int64_t> concurrency = std::nullopt);

// Where a sweep's CSV goes: --csv OUT when given (with --sweep it holds the sweep rows, not one report row),
// else beside --plot OUT.png as OUT.csv (".png" replaced, or ".csv" appended), else "" (not written).
std::string SweepCsvPath(const ReplayOptions& options);

}  // namespace dhs::replay
