// dhs-replay: replays a real request trace (Mooncake JSONL or Azure CSV) against a node and reports throughput,
// latency, admission and KV-hierarchy figures (issue 5; docs/replay.md). By default it starts its own one-GPU node
// (memd + workerd, tools/replay/node_launcher.h) per run; --connect uses a running worker instead.
// Exit codes: 0 every request served (and, with --check-exact, outputs bit-identical to resident); 1 a run failed,
// a request failed or the outputs differ; 2 bad command line; 130 / 143 stopped by SIGINT / SIGTERM (the node it
// started is stopped first and a temporary run directory removed).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/curve_keys.h"
#include "common/kv_event_stream.h"
#include "common/local_redis.h"
#include "common/transport.h"
#include "tools/replay/budget.h"
#include "tools/replay/closed_loop.h"
#include "tools/replay/driver.h"
#include "tools/replay/multi_node.h"
#include "tools/replay/sessions.h"
#include "tools/replay/node_launcher.h"
#include "tools/replay/options.h"
#include "workerd/device/async_device_cli.h"
#include "workerd/speculation/speculation_cli.h"
#include "tools/replay/report.h"
#include "tools/replay/supervised_node.h"
#include "tools/replay/zmq_node_client.h"

#ifndef DHS_MEMD_PATH
#define DHS_MEMD_PATH ""
#endif
#ifndef DHS_WORKERD_PATH
#define DHS_WORKERD_PATH ""
#endif

namespace dhs::replay {
namespace {

// Issue 22: a run that ended part-way keeps what it recorded (each request's end reason) when some request ended;
// one that recorded no end is just the error.
bool AnyRequestEnded(const DriverResult& partial) {
  return std::any_of(partial.requests.begin(), partial.requests.end(),
                     [](const RequestTiming& t) { return t.end_ms >= 0; });
}

// SIGINT / SIGTERM: blocked in every thread (Main blocks them before any thread starts) and taken by one thread
// with sigwait, which stops the node that is running (if any) and exits 128 + signal. No signal handler runs, so
// nothing here has to be async-signal-safe. The node is registered while it runs; the main thread unregisters it
// under the same mutex before stopping it itself, so the two never stop one node together.
// Issue 26 (--cluster-store local|local-cluster): the Redis server or cluster this tool started for its nodes, in
// `dir` (under --run-dir, else a temporary directory removed by Stop). Stop kills every server and is idempotent.
struct LocalRedis {
  std::unique_ptr<LocalRedisServer> server;
  std::unique_ptr<LocalRedisCluster> cluster;
  std::string dir;
  bool remove_dir = false;
  std::string endpoint;  // what every memd gets: redis://127.0.0.1:PORT or the cluster's seed list
  void Stop() {
    if (server) server->Kill();
    if (cluster) cluster->Kill();
    if (remove_dir && !dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      remove_dir = false;
    }
  }
};

std::mutex g_node_mutex;
std::vector<ReplayNode*> g_nodes;  // guarded by g_node_mutex (issue 26: --nodes N registers N)
// Issue 26: the Redis server or cluster this tool started (--cluster-store local|local-cluster), stopped after the
// nodes; guarded by g_node_mutex.
LocalRedis* g_redis = nullptr;

void StartSignalThread() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    {
      std::lock_guard<std::mutex> lock(g_node_mutex);
      // With --connect (or between runs) no node of this tool is running: there is nothing to stop.
      std::fprintf(stderr, "\ndhs-replay: %s: %s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                   !g_nodes.empty() ? "stopping the node" : "exiting (no node of this tool is running)");
      for (ReplayNode* node : g_nodes) {  // workerd, memd, then the temporary run directory
        if (absl::Status s = node->Stop(); !s.ok()) {
          std::fprintf(stderr, "dhs-replay: stopping the node: %s\n", std::string(s.message()).c_str());
        }
      }
      if (g_redis) g_redis->Stop();  // issue 26: after the nodes (their memds are its clients)
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(128 + sig);
    }
  }).detach();
}

// Owns the node of one run and keeps it registered for the signal thread while it lives.
class RegisteredNode {
 public:
  explicit RegisteredNode(std::unique_ptr<ReplayNode> node) : node_(std::move(node)) {
    std::lock_guard<std::mutex> lock(g_node_mutex);
    g_nodes.push_back(node_.get());
  }
  ~RegisteredNode() { Stop(); }
  ReplayNode* operator->() { return node_.get(); }
  ReplayNode* get() { return node_.get(); }
  void KeepRunDir() {  // under the lock: the signal thread may be stopping the node
    std::lock_guard<std::mutex> lock(g_node_mutex);
    if (node_) node_->keep_run_dir();
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(g_node_mutex);
    if (!node_) return;
    std::erase(g_nodes, node_.get());
    if (absl::Status s = node_->Stop(); !s.ok()) std::cerr << "dhs-replay: stopping the node: " << s.message() << "\n";
    node_.reset();
  }

 private:
  std::unique_ptr<ReplayNode> node_;
};

// How long the client waits for a restarted worker when faults are injected and --reattach-timeout-ms is not given.
constexpr std::chrono::milliseconds kFaultReattachTimeout{60000};

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

struct RunOutcome {
  DriverResult result;
  bool complete = true;  // false: the run failed part-way (result holds what was recorded; error says why)
  std::string error;
  std::string prefill;
  std::optional<uint64_t> hbm_budget_bytes;  // the budget of the node this tool started (nullopt with --connect)
  FaultFigures faults;  // what fault injection did (the run with faults only)
  std::string crash;    // the supervised node's latest worker crash (issue 28), when faults.worker_crashes > 0
  std::optional<PrefixWorkloadFigures> prefix_workload;  // issue 27: the prepared-prefix workload's own figures
  std::optional<MultiNodeFigures> multi_node;            // issue 26: --nodes > 1 or --cluster-store
};

// Fault injection of a run (the run under test; never the resident reference).
struct FaultSetup {
  FaultPlanConfig plan;
  bool corrupt_host_pages = false;
};

// Starts the node of a run: supervised (restarts, faults, host-row checks) when `faults` is set or re-attaching is on,
// else the plain embedded node.
absl::StatusOr<std::unique_ptr<ReplayNode>> StartNode(const ReplayOptions& options, const Trace& trace,
                                                      std::string_view mode, uint64_t budget,
                                                      const std::optional<FaultSetup>& faults,
                                                      const std::string& log_tag,
                                                      std::function<int64_t(RequestId)> rows_computed,
                                                      int node_index = 0) {
  auto geometry = ReplayGeometry(options, budget);
  if (!geometry.ok()) return geometry.status();
  NodeLaunchOptions launch;
  launch.memd_path = EnvOr("DHS_MEMD", DHS_MEMD_PATH);
  launch.workerd_path = EnvOr("DHS_WORKERD", DHS_WORKERD_PATH);
  launch.run_dir = options.run_dir;
  if (options.nodes > 1 && !options.run_dir.empty()) {  // issue 26: RUN_DIR/node<i> per node
    // Mode 0700 (issue 26 review): --check-exact's resident reference node runs in RUN_DIR itself afterwards.
    if (absl::Status s = MakeNodesRunDir(options.run_dir); !s.ok()) return s;
    launch.run_dir = absl::StrCat(options.run_dir, "/node", node_index);
  }
  launch.log_tag = log_tag;
  launch.mode = std::string(mode);
  launch.preset = options.preset;
  launch.seed = options.seed;
  launch.hbm_budget_bytes = budget;
  launch.page_bytes = geometry->host_page_bytes;  // memd's pool pages are host pages (payload, then index keys)
  launch.host_pool_bytes = HostPoolBytes(trace, geometry->host_page_bytes, geometry->kv.page_rows);
  launch.slots = static_cast<uint32_t>(options.slots);
  if (!options.reclaim_policy.empty()) launch.extra_memd_args = {"--reclaim-policy", options.reclaim_policy};
  if (options.prefix_sharing) {  // issue 24 (the resident reference of --check-exact sends no chain: nothing shared)
    launch.extra_memd_args.insert(launch.extra_memd_args.end(), {"--prefix-sharing", "on"});
    if (!options.prefix_eviction.empty()) {  // memd's cache limits (validated: only with sharing on)
      launch.extra_memd_args.insert(launch.extra_memd_args.end(), {"--prefix-eviction", options.prefix_eviction});
    }
    if (options.prefix_tenant_quota_pages > 0) {
      launch.extra_memd_args.insert(launch.extra_memd_args.end(), {"--prefix-tenant-quota-pages",
                                                                   std::to_string(options.prefix_tenant_quota_pages)});
    }
  }
  if (options.nodes > 1 && options.route == "prefix") {  // issue 26: the router reads each node's KV event stream
    launch.extra_memd_args.insert(launch.extra_memd_args.end(), {"--kv-events", "on"});
  }
  if (!options.cluster_store_endpoint.empty()) {  // issue 26: the cluster tier (memd's side: the cluster branch)
    launch.extra_memd_args.insert(launch.extra_memd_args.end(), {"--cluster-store", options.cluster_store_endpoint});
    if (options.cluster_lookup_timeout_ms != 0) {
      launch.extra_memd_args.insert(launch.extra_memd_args.end(), {"--cluster-lookup-timeout-ms",
                                                                   std::to_string(options.cluster_lookup_timeout_ms)});
    }
  }
  launch.extra_workerd_args = LinkModelArgs(options.link_model);  // empty when off
  if (options.link_model.enabled) {  // the model stands for the link of the CPU backend (docs/link_model.md)
    launch.extra_workerd_args.insert(launch.extra_workerd_args.end(), {"--device", "cpu"});
  }
  if (options.hot_rows != 0) {
    launch.extra_workerd_args.insert(launch.extra_workerd_args.end(), {"--hot-rows", std::to_string(options.hot_rows)});
  }
  if (options.async_device_seed != 0) {  // issue 28: the CPU device's asynchronous test mode (both runs)
    const std::vector<std::string> async = AsyncDeviceArgs(options.async_device_seed);
    launch.extra_workerd_args.insert(launch.extra_workerd_args.end(), async.begin(), async.end());
    launch.extra_workerd_args.insert(launch.extra_workerd_args.end(), {"--device", "cpu"});
  }
  const std::vector<std::string> speculation = spec::SpeculationArgs(options.speculation);  // empty when off
  launch.extra_workerd_args.insert(launch.extra_workerd_args.end(), speculation.begin(), speculation.end());
  const double bytes_per_row = double(geometry->host_page_bytes) / double(std::max<uint64_t>(1, geometry->kv.page_rows));
  const std::vector<std::string> prefix_cache =  // issue 27: every prefix stays in the worker's row cache
      PrefixWorkloadWorkerArgs(options.prefix_workload, bytes_per_row);
  launch.extra_workerd_args.insert(launch.extra_workerd_args.end(), prefix_cache.begin(), prefix_cache.end());
  const std::vector<std::string> memd_timeout = PrefixWorkloadMemdArgs(options.prefix_workload);
  launch.extra_memd_args.insert(launch.extra_memd_args.end(), memd_timeout.begin(), memd_timeout.end());
  if (!faults && options.reattach_timeout_ms == 0) return EmbeddedNode::Start(launch);
  SupervisedNodeOptions supervised;
  supervised.launch = launch;
  if (faults) {
    supervised.faults = faults->plan;
    supervised.corrupt_host_pages = faults->corrupt_host_pages;
  }
  supervised.page_rows = geometry->kv.page_rows;
  supervised.tail_rows = geometry->kv.tail_rows;
  supervised.rows_computed = std::move(rows_computed);
  return SupervisedNode::Start(supervised);
}

// The report's fault figures: the supervised node's counts, the client's resubmits, and one recovery sample per
// re-attach that got a token: from the latest worker death before that token (and after the previous recovery) to it.
// A worker killed again before any token came has no sample of its own (its successor's recovery counts).
FaultFigures CollectFaults(const FaultStats& node, const ZmqNodeClient& client) {
  FaultFigures f;
  f.fault_seed = node.seed;
  f.worker_restarts = static_cast<int64_t>(node.worker_restarts);
  f.memd_restarts = static_cast<int64_t>(node.memd_restarts);
  f.worker_kills = static_cast<int64_t>(node.worker_kills);
  f.memd_kills = static_cast<int64_t>(node.memd_kills);
  f.kill_points_armed = static_cast<int64_t>(node.hook_kills_armed);
  f.requests_resumed = static_cast<int64_t>(node.requests_resumed);
  f.rows_recomputed = static_cast<int64_t>(node.rows_recomputed);
  f.requests_resubmitted = client.resubmits();
  f.host_rows_lost = static_cast<int64_t>(node.host_rows_lost);
  f.host_pages_checked = static_cast<int64_t>(node.host_pages_checked);
  f.host_pages_unconfirmed = static_cast<int64_t>(node.host_pages_unconfirmed);
  f.worker_crashes = static_cast<int64_t>(node.worker_crashes);
  std::vector<std::chrono::steady_clock::time_point> down = node.worker_down_at;
  std::sort(down.begin(), down.end());
  std::optional<std::chrono::steady_clock::time_point> previous;
  for (const auto& t : client.recovered_at()) {
    auto d = std::find_if(down.rbegin(), down.rend(), [&](const auto& x) { return (!previous || x > *previous) && x <= t; });
    if (d != down.rend()) {
      f.recovery_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(t - *d).count());
    }
    previous = t;
  }
  return f;
}

// Issue 27: the prepared-prefix workload at `concurrency` (or --concurrency); its own figures go to `figures`.
absl::StatusOr<DriverResult> RunPrefixWorkloadOnce(NodeClient* client, Clock* clock, const DriverOptions& driver_options,
                                                   const ReplayOptions& options, std::optional<int64_t> concurrency,
                                                   std::optional<PrefixWorkloadFigures>& figures) {
  const int64_t c = concurrency.value_or(options.concurrency.value_or(ReplayOptions::kDefaultConcurrency));
  std::cerr << "dhs-replay: preparing " << options.prefix_workload.prefixes << " prefixes of "
            << options.prefix_workload.prefix_tokens << " tokens, then "
            << options.prefix_workload.SessionsAt(c) << " sessions at concurrency " << c << "\n";
  auto run = RunPrefixWorkload(client, clock, driver_options, options.prefix_workload, c, options.slots);
  if (!run.ok()) return run.status();
  figures = MakePrefixWorkloadFigures(options.prefix_workload, *run);
  return std::move(run->measured);
}

// Rows computed per client request, from the driver's thread to the supervision thread's host ledger (issue 28).
struct RowsBoard {
  std::mutex mu;
  std::map<RequestId, int64_t> by_client;
};

// One run of RunOnce: the client's and the driver's options, and the node this tool started for it (none with
// --connect). Its phases: the target (UseWorker: the worker --connect names, or StartOwnNode), then Drive.
class ReplayRun {
 public:
  ReplayRun(const ReplayOptions& options, const Trace& trace, std::string_view mode,
            const std::optional<FaultSetup>& faults, const std::string& log_tag)
      : options_(options), trace_(trace), mode_(mode), faults_(faults), log_tag_(log_tag) {
    client_options_.prepared_prefix = options.prepared_prefix || options.prefix_workload.on();
    client_options_.tenant = options.tenant;  // issue 24
    client_options_.tenants = options.tenants;
    client_options_.tenant_by = options.tenant_by;
    // Issue 26: each request's session (tools/replay/sessions.h), by trace index, sent in its SubmitRequest.
    const std::vector<SessionTurn> turns = DeriveSessions(trace);
    for (size_t i = 0; i < turns.size() && i < trace.requests.size(); ++i) {
      const int64_t index = trace.requests[i].index;
      if (index < 0) continue;
      auto& of = client_options_.session_of;
      if (static_cast<size_t>(index) >= of.size()) of.resize(static_cast<size_t>(index) + 1, -1);
      of[static_cast<size_t>(index)] = turns[i].session;
    }
    if (options.chat_turns) {  // issue 26: each next turn's previous turn, by trace position
      std::map<int64_t, int64_t> position_of;
      for (size_t i = 0; i < trace.requests.size(); ++i) position_of[trace.requests[i].index] = static_cast<int64_t>(i);
      driver_options_.chat_parent.assign(trace.requests.size(), -1);
      for (size_t i = 0; i < turns.size() && i < trace.requests.size(); ++i) {
        auto p = position_of.find(turns[i].parent);
        if (turns[i].parent >= 0 && p != position_of.end()) driver_options_.chat_parent[i] = p->second;
      }
    }
    client_options_.reattach_timeout = std::chrono::milliseconds(options.reattach_timeout_ms);
    if (faults && options.reattach_timeout_ms == 0) client_options_.reattach_timeout = kFaultReattachTimeout;
    driver_options_.idle_timeout_ms = static_cast<double>(options.idle_timeout_ms);
    driver_options_.on_rows = [rows = rows_](RequestId request, int64_t n) {
      std::lock_guard<std::mutex> l(rows->mu);
      rows->by_client[request] = n;
    };
    driver_options_.request_timeout_ms = static_cast<double>(options.request_timeout_ms);
  }

  // --connect: the running worker (a tcp:// one with its CURVE key; memd's socket beside an ipc:// one's).
  absl::Status UseWorker() {
    client_options_.worker_endpoint = options_.connect;
    if (!options_.curve_server_key.empty()) {  // issue 22: a tcp:// worker (CURVE)
      absl::StatusOr<std::string> key = ReadCurvePublicKey(options_.curve_server_key);
      if (!key.ok()) return absl::Status(key.status().code(), absl::StrCat("--curve-server-key: ", key.status().message()));
      client_options_.curve_server_key = *key;
    }
    if (absl::StartsWith(options_.connect, "ipc://")) {  // memd's socket sits beside the worker's
      const std::string path = options_.connect.substr(6);
      client_options_.memd_endpoint = "ipc://" + path.substr(0, path.rfind('/') + 1) + "memd.sock";
    }
    driver_options_.idle_hint = absl::StrCat("; check the worker at ", options_.connect, " and its log");
    return absl::OkStatus();
  }

  // Starts this run's node with the HBM budget `budget_override`, else --hbm-budget-bytes, else the default.
  absl::Status StartOwnNode(std::optional<uint64_t> budget_override) {
    const uint64_t budget = budget_override            ? *budget_override
                            : options_.hbm_budget_bytes ? static_cast<uint64_t>(*options_.hbm_budget_bytes)
                                                        : DefaultHbmBudget(trace_, options_);
    used_budget_ = budget;
    for (int i = 0; i < options_.nodes; ++i) {  // issue 26: --nodes N, each its own run directory, memd and worker
      std::optional<FaultSetup> faults = faults_;  // node i's kills are drawn from seed + i (one byte flipped: node 0)
      if (faults && i > 0) {
        faults->plan.seed += static_cast<uint64_t>(i);
        faults->corrupt_host_pages = false;
      }
      auto started = StartNode(options_, trace_, mode_, budget, faults, log_tag_, [rows = rows_](RequestId client) {
        std::lock_guard<std::mutex> l(rows->mu);
        auto it = rows->by_client.find(client);
        return it == rows->by_client.end() ? int64_t{0} : it->second;
      }, i);
      if (!started.ok()) {
        if (nodes_.empty()) return started.status();
        return Fail(absl::Status(started.status().code(), absl::StrCat("node ", i, ": ", started.status().message())));
      }
      nodes_.push_back(std::make_unique<RegisteredNode>(std::move(*started)));
      if (auto* sup = dynamic_cast<SupervisedNode*>(nodes_.back()->get())) supervised_nodes_.push_back(sup);
    }
    RegisteredNode& first = *nodes_.front();
    supervised_ = dynamic_cast<SupervisedNode*>(first.get());
    client_options_.worker_endpoint = first->worker_endpoint();
    client_options_.memd_endpoint = first->memd_endpoint();
    driver_options_.idle_hint =
        absl::StrCat("; see ", NodeLogPath(first->run_dir(), "workerd", log_tag_), " and ",
                     NodeLogPath(first->run_dir(), "memd", log_tag_),
                     nodes_.size() > 1 ? " (and the other nodes' run directories, kept)" : " (the run directory is kept)");
    return absl::OkStatus();
  }

  // Request ids of the next Drive start at `first` (issue 27: the points of a sweep on one node never reuse an id).
  void SetFirstRequestId(RequestId first) { driver_options_.first_request_id = first; }

  // Connects to the target, replays the trace (at `concurrency`) and collects the outcome.
  absl::StatusOr<RunOutcome> Drive(std::optional<int64_t> concurrency) {
    if (supervised_) {  // no kill once every request ended (the closing stats query must find a worker)
      driver_options_.on_progress = [supervised = supervised_](const Progress& p) {
        PrintProgressToStderr(p);
        if (p.ended == p.total) supervised->StopFaults();
      };
    }
    if (nodes_.size() > 1) return DriveNodes(concurrency);  // issue 26
    auto client = ZmqNodeClient::Connect(client_options_);
    if (!client.ok()) return Fail(client.status());
    auto scheduler = MakeScheduler(options_, trace_, concurrency);
    if (!scheduler.ok()) return scheduler.status();
    SteadyClock clock;
    ReplayDriver driver(client->get(), &clock, driver_options_);
    std::cerr << "dhs-replay: " << trace_.requests.size() << " requests, mode " << mode_
              << (concurrency ? absl::StrCat(", concurrency ", *concurrency) : std::string()) << "\n";
    std::optional<PrefixWorkloadFigures> workload;
    auto result = options_.prefix_workload.on()  // issue 27: preparation, then the measured closed loop
                      ? RunPrefixWorkloadOnce(client->get(), &clock, driver_options_, options_, concurrency, workload)
                      : driver.Run(trace_, *scheduler);
    const std::string prefill = options_.prepared_prefix || workload ? "prepared-prefix" : "prefill";
    const FaultFigures figures = faults_ && supervised_ ? CollectFaults(supervised_->stats(), **client) : FaultFigures{};
    if (!result.ok()) {
      const absl::Status s = Fail(result.status());
      const DriverResult& partial = driver.partial();
      if (!AnyRequestEnded(partial)) return s;
      DriverResult kept = partial;
      if (supervised_) AddWorkerCounters(kept.stats, supervised_->stats().dead_worker_counters);
      return RunOutcome{std::move(kept), false, std::string(s.message()), prefill, used_budget_, figures};
    }
    // The workers that died counted from 0 each; their counts join the last worker's (WorkerStatsReply).
    if (supervised_) AddWorkerCounters(result->stats, supervised_->stats().dead_worker_counters);
    RunOutcome outcome{std::move(*result), true, "", prefill, used_budget_, figures};
    outcome.prefix_workload = workload;
    if (!options_.cluster_store.empty()) outcome.multi_node = OneNodeFigures(outcome.result);  // issue 26 review
    if (faults_ && supervised_) outcome.crash = supervised_->stats().last_crash;
    return outcome;
  }

 private:
  // After a failure the logs of the node are kept for reading.
  absl::Status Fail(absl::Status s) {
    if (nodes_.empty()) return s;
    std::string dirs;
    for (auto& node : nodes_) {
      node->KeepRunDir();
      absl::StrAppend(&dirs, dirs.empty() ? "" : ", ", (*node)->run_dir());
    }
    return absl::Status(s.code(), absl::StrCat(s.message(), "\n(run ", nodes_.size() > 1 ? "directories" : "directory",
                                               " kept: ", dirs, ")"));
  }

  // Issue 26: --nodes N: one MultiNodeClient over the N nodes, routed by --route; the report's per-node figures.
  absl::StatusOr<RunOutcome> DriveNodes(std::optional<int64_t> concurrency) {
    MultiNodeOptions multi;
    multi.policy = *ParseRoutePolicy(options_.route);  // validated
    multi.sessions = DeriveSessions(trace_);
    if (multi.policy == RoutePolicy::kPrefix && used_budget_) {  // which blocks memd announces: see page_rows
      auto geometry = ReplayGeometry(options_, *used_budget_);
      if (!geometry.ok()) return Fail(geometry.status());
      multi.page_rows = static_cast<uint32_t>(geometry->kv.page_rows);
    }
    for (auto& node : nodes_) {
      ZmqNodeClientOptions o = client_options_;
      o.worker_endpoint = (*node)->worker_endpoint();
      o.memd_endpoint = (*node)->memd_endpoint();
      multi.nodes.push_back(o);
      if (multi.policy == RoutePolicy::kPrefix) {
        multi.kv_event_endpoints.push_back(IpcEndpoint((*node)->run_dir(), kKvEventsSocket));
      }
    }
    const std::vector<SessionTurn> sessions = multi.sessions;
    auto client = MultiNodeClient::Connect(std::move(multi));
    if (!client.ok()) return Fail(client.status());
    if (!supervised_nodes_.empty()) {  // no kill once every request ended (the closing stats queries need workers)
      driver_options_.on_progress = [nodes = supervised_nodes_](const Progress& p) {
        PrintProgressToStderr(p);
        if (p.ended == p.total) {
          for (SupervisedNode* n : nodes) n->StopFaults();
        }
      };
    }
    auto scheduler = MakeScheduler(options_, trace_, concurrency);
    if (!scheduler.ok()) return scheduler.status();
    SteadyClock clock;
    ReplayDriver driver(client->get(), &clock, driver_options_);
    std::cerr << "dhs-replay: " << trace_.requests.size() << " requests, mode " << mode_ << ", " << nodes_.size()
              << " nodes, route " << options_.route
              << (concurrency ? absl::StrCat(", concurrency ", *concurrency) : std::string()) << "\n";
    auto result = driver.Run(trace_, *scheduler);
    const std::string prefill = options_.prepared_prefix ? "prepared-prefix" : "prefill";
    MultiNodeFigures figures = NodesFigures(sessions);
    figures.kv_events_seen = (*client)->kv_events_seen();
    figures.kv_events_lost = (*client)->kv_events_lost();
    figures.kv_settle_timeouts = (*client)->kv_settle_timeouts();
    std::vector<int> node_of_row(trace_.requests.size(), -1);
    for (const RoutedRequest& r : (*client)->decisions()) {
      if (r.trace_index >= 0 && r.trace_index < static_cast<int64_t>(node_of_row.size())) {
        node_of_row[r.trace_index] = r.decision.node;
      }
      figures.routing.push_back(RouteFigure{r.trace_index, r.decision.node, r.session, r.turn,
                                            std::string(RouteReasonName(r.decision.reason)), r.decision.matched_blocks});
    }
    if (!result.ok()) {
      const absl::Status s = Fail(result.status());
      const DriverResult& partial = driver.partial();
      if (!AnyRequestEnded(partial)) return s;
      RunOutcome outcome{partial, false, std::string(s.message()), prefill, used_budget_, NodesFaults(**client)};
      outcome.multi_node = figures;  // the routing; node stats were not read
      return outcome;
    }
    std::vector<NodeStats> stats = (*client)->node_stats();
    for (size_t i = 0; i < supervised_nodes_.size() && i < stats.size(); ++i) {  // dead workers' counts join
      AddWorkerCounters(stats[i], supervised_nodes_[i]->stats().dead_worker_counters);
      AddWorkerCounters(result->stats, supervised_nodes_[i]->stats().dead_worker_counters);
    }
    for (size_t i = 0; i < nodes_.size() && i < stats.size(); ++i) {
      NodeFigures n = MakeNodeFigures(static_cast<int64_t>(i), *result, node_of_row, stats[i]);
      n.run_dir = (*nodes_[i])->run_dir();
      figures.cluster_counters = figures.cluster_counters || n.cluster.has_value();
      figures.per_node.push_back(std::move(n));
    }
    RunOutcome outcome{std::move(*result), true, "", prefill, used_budget_, NodesFaults(**client)};
    outcome.multi_node = std::move(figures);
    for (SupervisedNode* n : supervised_nodes_) {
      if (n->stats().worker_crashes > 0) outcome.crash = n->stats().last_crash;
    }
    return outcome;
  }

  // Issue 26: the multi-node report's settings and sessions (per node and routing: the caller's).
  MultiNodeFigures NodesFigures(const std::vector<SessionTurn>& sessions) const {
    MultiNodeFigures figures;
    figures.nodes = static_cast<int64_t>(nodes_.size());
    figures.route = options_.route;
    figures.cluster_store = options_.cluster_store;
    figures.cluster_endpoint = options_.cluster_store_endpoint;
    figures.cluster_lookup_timeout_ms = options_.cluster_lookup_timeout_ms;
    figures.sessions = CountSessions(sessions);
    for (const SessionTurn& t : sessions) figures.next_turns += t.turn > 0 ? 1 : 0;
    return figures;
  }

  // Issue 26 review (F4): a 1-node run with --cluster-store reports its node's figures (cluster tier included) as
  // multi_node.per_node[0], as a multi-node run does; no routing (every request on node 0).
  MultiNodeFigures OneNodeFigures(const DriverResult& result) const {
    MultiNodeFigures figures = NodesFigures(DeriveSessions(trace_));
    size_t rows = trace_.requests.size();
    for (const RequestTiming& t : result.requests) {
      if (t.trace_index >= 0) rows = std::max(rows, static_cast<size_t>(t.trace_index) + 1);
    }
    NodeFigures n = MakeNodeFigures(0, result, std::vector<int>(rows, 0), result.stats);
    if (!nodes_.empty()) n.run_dir = (*nodes_.front())->run_dir();
    figures.cluster_counters = n.cluster.has_value();
    figures.per_node.push_back(std::move(n));
    return figures;
  }

  // Issue 26: the fault figures of every supervised node added up (the seed is node 0's; node i used seed + i).
  FaultFigures NodesFaults(MultiNodeClient& client) {
    FaultFigures total;
    for (size_t i = 0; i < supervised_nodes_.size(); ++i) {
      const FaultFigures f = CollectFaults(supervised_nodes_[i]->stats(), client.node_client(static_cast<int>(i)));
      if (i == 0) total.fault_seed = f.fault_seed;
      for (auto field : {&FaultFigures::worker_restarts, &FaultFigures::memd_restarts, &FaultFigures::worker_kills,
                         &FaultFigures::memd_kills, &FaultFigures::kill_points_armed, &FaultFigures::requests_resumed,
                         &FaultFigures::rows_recomputed, &FaultFigures::requests_resubmitted,
                         &FaultFigures::host_rows_lost, &FaultFigures::host_pages_checked,
                         &FaultFigures::worker_crashes, &FaultFigures::host_pages_unconfirmed}) {
        total.*field += f.*field;
      }
      total.recovery_us.insert(total.recovery_us.end(), f.recovery_us.begin(), f.recovery_us.end());
    }
    return total;
  }

  const ReplayOptions& options_;
  const Trace& trace_;
  std::string_view mode_;
  const std::optional<FaultSetup>& faults_;
  const std::string& log_tag_;
  ZmqNodeClientOptions client_options_;
  DriverOptions driver_options_;
  std::vector<std::unique_ptr<RegisteredNode>> nodes_;  // the nodes this tool started (none with --connect)
  std::optional<uint64_t> used_budget_;       // its HBM budget, bytes
  SupervisedNode* supervised_ = nullptr;      // node_ when it is supervised
  std::vector<SupervisedNode*> supervised_nodes_;  // issue 26: every supervised node, in node order
  std::shared_ptr<RowsBoard> rows_ = std::make_shared<RowsBoard>();
};

// `log_tag`: the node's logs are <run dir>/memd[.TAG].log and workerd[.TAG].log (NodeLogPath): --check-exact's
// reference run is tagged "reference", so a given --run-dir keeps the logs of both runs.
absl::StatusOr<RunOutcome> RunOnce(const ReplayOptions& options, const Trace& trace, std::string_view mode,
                                   std::optional<int64_t> concurrency, std::optional<uint64_t> budget_override = {},
                                   const std::optional<FaultSetup>& faults = std::nullopt,
                                   const std::string& log_tag = "") {
  ReplayRun run(options, trace, mode, faults, log_tag);
  const absl::Status target = options.connect.empty() ? run.StartOwnNode(budget_override) : run.UseWorker();
  if (!target.ok()) return target;
  return run.Drive(concurrency);
}

// Prints why each unserved request ended (stderr; its end reason, issue 22) and returns whether all were served.
// Requests a partial run never ended are counted on one line.
bool AllServed(const DriverResult& r, std::string_view mode) {
  bool all = true;
  int64_t not_ended = 0;
  for (const RequestTiming& t : r.requests) {
    if (t.served()) continue;
    all = false;
    if (t.end_ms < 0) {
      ++not_ended;
      continue;
    }
    std::cerr << "dhs-replay: " << mode << ": request " << t.request << " (trace row " << t.trace_index
              << ") not served (" << EndReasonName(t.end_reason) << "): " << (t.error.empty() ? "did not finish" : t.error)
              << "\n";
  }
  if (not_ended > 0) std::cerr << "dhs-replay: " << mode << ": " << not_ended << " requests did not end\n";
  return all;
}

// --json and --csv of the runs so far (one report, or the sweep points). Prints and returns the first error.
absl::Status WriteOutputs(const ReplayOptions& options, const std::vector<SweepPoint>& sweep) {
  absl::Status s;
  if (!options.json_out.empty()) {
    s = options.sweep.empty() ? WriteReportJson(sweep.front().report, options.json_out)
                              : WriteSweepJson(sweep, options.json_out);
  }
  if (s.ok() && !options.csv_out.empty()) {
    s = options.sweep.empty() ? WriteReportCsv(sweep.front().report, options.csv_out)
                              : WriteSweepCsv(sweep, options.csv_out);
  }
  if (!s.ok()) std::cerr << "dhs-replay: " << s.message() << "\n";
  return s;
}

// The fault injection of the options (nullopt without any); prints the seed (drawn from the clock unless given).
absl::StatusOr<std::optional<FaultSetup>> MakeFaultSetup(const ReplayOptions& options) {
  if (!InjectsFaults(options)) return std::optional<FaultSetup>();
  FaultSetup setup;
  setup.plan.seed = options.fault_seed ? *options.fault_seed
                                       : (static_cast<uint64_t>(std::random_device{}()) << 32 ^
                                          static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
  setup.plan.kill_worker_every_ms = static_cast<int64_t>(std::llround(options.kill_worker_every_s * 1000));
  setup.plan.restart_memd_every_ms = static_cast<int64_t>(std::llround(options.restart_memd_every_s * 1000));
  setup.plan.distribution =
      options.fault_distribution == "uniform" ? FaultDistribution::kUniform : FaultDistribution::kExponential;
  absl::StatusOr<std::vector<FaultKill>> hooks = ParseHookKills(options.kill_worker_at, setup.plan.seed);
  if (!hooks.ok()) return hooks.status();
  setup.plan.hook_kills = *hooks;
  setup.corrupt_host_pages = options.corrupt_host_page_for_test;
  std::string points;
  for (const FaultKill& k : setup.plan.hook_kills) points += " " + FormatFaultKill(k);
  std::cerr << "dhs-replay: fault seed " << setup.plan.seed << " (--fault-seed " << setup.plan.seed << " repeats it)"
            << (points.empty() ? "" : "; kill points:" + points) << "\n";
  return std::optional<FaultSetup>(setup);
}

// The report of one run: its settings (with the HBM budget of the node this tool started), figures and faults;
// `exact`: the --check-exact verdict.
ReplayReport ReportOf(const ReplayOptions& options, const Trace& trace, const RunOutcome& run,
                      std::optional<int64_t> concurrency, std::optional<bool> exact) {
  RunSettings settings = MakeRunSettings(options, trace, run.prefill, concurrency);
  if (run.hbm_budget_bytes) settings.hbm_budget_bytes = static_cast<int64_t>(*run.hbm_budget_bytes);
  ReplayReport report = BuildReport(run.result, settings, exact);
  report.faults = run.faults;
  report.prefix_workload = run.prefix_workload;  // issue 27
  report.multi_node = run.multi_node;            // issue 26
  return report;
}

// The run's trace: --trace's, or (issue 27, --prefixes) the workload's sessions, as many as run at once (for the
// budgets and the host pool of the node this tool starts).
absl::StatusOr<Trace> RunTrace(const ReplayOptions& options) {
  if (!options.prefix_workload.on()) return LoadTrace(options);
  const int64_t most_in_flight =
      std::max<int64_t>(options.concurrency.value_or(1), options.sweep.empty() ? 1 : options.sweep.back());
  return SessionTrace(options.prefix_workload, options.prefix_workload.prefixes + most_in_flight);
}

// A run that failed part-way: reports what finished (complete: false; --json / --csv with the points before it).
// The command then stops: exit code 1.
int ReportPartialRun(const ReplayOptions& options, const Trace& trace, std::string_view mode, const RunOutcome& run,
                     std::optional<int64_t> concurrency, std::vector<SweepPoint>& sweep) {
  std::cerr << "\ndhs-replay: run failed: " << run.error << "\n";
  AllServed(run.result, mode);  // each request's reason (issue 22)
  ReplayReport report = ReportOf(options, trace, run, concurrency, std::nullopt);
  report.complete = false;
  std::cout << FormatSummary(report) << std::flush;
  sweep.push_back(SweepPoint{concurrency.value_or(0), std::move(report)});
  if (!WriteOutputs(options, sweep).ok()) std::cerr << "dhs-replay: the partial report was not written\n";
  return 1;
}

// --check-exact: runs the resident reference of the same point and compares `run` with it (brief §7). Whether they
// match (the difference printed when not); an error when the reference run failed.
absl::StatusOr<bool> CheckExact(const ReplayOptions& options, const Trace& trace, std::string_view mode,
                                const RunOutcome& run, std::optional<int64_t> concurrency) {
  ReplayOptions plain = options;  // the reference decodes without speculation (brief §7: same bits)
  plain.speculation = spec::SpeculationConfig{};
  plain.nodes = 1;  // issue 26: a multi-node run is compared with ONE resident node, without the cluster store
  plain.route = "round-robin";
  plain.cluster_store.clear();
  plain.cluster_store_endpoint.clear();
  // Its own logs (memd.reference.log, workerd.reference.log): the run's logs in a given --run-dir stay intact.
  auto reference = RunOnce(plain, trace, "resident", concurrency, ReferenceHbmBudget(trace, options), std::nullopt,
                           "reference");
  if (!reference.ok()) return reference.status();
  if (!reference->complete) return absl::InternalError(reference->error);
  AllServed(reference->result, "resident reference");
  const ExactnessVerdict verdict = CompareOutputs(run.result, reference->result);
  if (!verdict.match) std::cerr << "dhs-replay: not exact (" << mode << " vs resident): " << verdict.reason << "\n";
  return verdict.match;
}

// Issue 28: a restart must not hide a crash (a read hazard aborts), and missing host-copy confirmations make a run
// not clean. Whether the run is clean (why not printed).
bool FaultsClean(const RunOutcome& run) {
  bool clean = true;
  if (run.faults.worker_crashes > 0) {
    std::cerr << "dhs-replay: the worker crashed " << run.faults.worker_crashes
              << " time(s), not by a fault the tool injected; the latest: " << run.crash << "\n";
    clean = false;
  }
  if (run.faults.host_pages_unconfirmed > 0) {
    std::cerr << "dhs-replay: host copies not confirmed: " << run.faults.host_pages_unconfirmed
              << " history pages should have held a confirmed host copy by the steps taken (below the worker's "
                 "tail window, not on GPU) and memd never listed one (host_pages_unconfirmed)\n";
    clean = false;
  }
  return clean;
}

// One point of the sweep (or the one run): runs it, prints its summary and adds its report to `sweep`; `ok` turns
// false when a request was not served, the outputs differ or the run is not clean. An exit code when the command
// stops here (the run failed), else nullopt.
// `shared`: the node of a prepared-prefix sweep (PrefixSweepSharesNode), else null (the point starts its own).
std::optional<int> RunPoint(const ReplayOptions& options, const Trace& trace, std::string_view mode,
                            const std::optional<FaultSetup>& faults, std::optional<int64_t> c,
                            std::vector<SweepPoint>& sweep, bool& ok, ReplayRun* shared = nullptr) {
  auto run = shared ? shared->Drive(c) : RunOnce(options, trace, mode, c, std::nullopt, faults);
  if (!run.ok()) {
    std::cerr << "dhs-replay: run failed: " << run.status().message() << "\n";
    return 1;
  }
  if (!options.outputs_out.empty()) {  // --outputs: this run's tokens, also of a run that failed part-way
    if (absl::Status s = WriteRequestOutputs(run->result, SweepOutputsPath(options.outputs_out, c)); !s.ok()) {
      std::cerr << "dhs-replay: --outputs: " << s.message() << "\n";
      return 1;
    }
  }
  if (!run->complete) return ReportPartialRun(options, trace, mode, *run, c, sweep);
  std::optional<bool> exact;
  if (options.check_exact) {
    absl::StatusOr<bool> match = CheckExact(options, trace, mode, *run, c);
    if (!match.ok()) {
      std::cerr << "dhs-replay: resident reference run failed: " << match.status().message() << "\n";
      return 1;
    }
    exact = *match;
    ok = ok && *exact;
  }
  ok = AllServed(run->result, mode) && ok;
  ok = FaultsClean(*run) && ok;
  ReplayReport report = ReportOf(options, trace, *run, c, exact);
  std::cout << FormatSummary(report) << std::flush;
  sweep.push_back(SweepPoint{c.value_or(0), std::move(report)});
  return std::nullopt;
}

// --plot: the sweep's CSV, then its plot. Whether both were written (the error printed when not).
bool WritePlot(const ReplayOptions& options, const std::vector<SweepPoint>& sweep) {
  const std::string csv = SweepCsvPath(options);
  absl::Status s = WriteSweepCsv(sweep, csv);
  if (s.ok()) s = RunPlotSweep(csv, options.plot_out);
  if (!s.ok()) {
    std::cerr << "dhs-replay: plot: " << s.message() << "\n";
    return false;
  }
  std::cout << "plot written to " << options.plot_out << "\n";
  return true;
}

// Issue 26: --cluster-store local|local-cluster starts a redis-server (or a 3-master Redis Cluster, one replica each)
// in RUN_DIR/redis (kept with the run directory), else in a temporary directory (removed at the end); registered for
// the signal thread (a signal during the start is handled when it ended). A URL is used as it is. Sets
// options.cluster_store_endpoint.
absl::Status StartClusterStore(ReplayOptions& options, LocalRedis& redis) {
  if (options.cluster_store.empty()) return absl::OkStatus();
  if (absl::StartsWith(options.cluster_store, "redis://")) {
    options.cluster_store_endpoint = options.cluster_store;
    return absl::OkStatus();
  }
  if (!options.run_dir.empty()) {
    // RUN_DIR first (mode 0700, or refused when open), then RUN_DIR/redis inside it: creating the latter first would
    // make RUN_DIR 0755, which the nodes' run directory check then refuses (issue 26 review).
    if (absl::Status s = MakeNodesRunDir(options.run_dir); !s.ok()) return s;
    redis.dir = options.run_dir + "/redis";
  } else {
    std::string tmpl = TempRunDirParent(std::getenv("TMPDIR")) + "/dhs-replay-redis-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp for the Redis directory failed");
    redis.dir = tmpl;
    redis.remove_dir = true;
  }
  // Under the signal thread's mutex: a SIGINT / SIGTERM during the start (a cluster takes seconds) is handled once the
  // start ended, and then stops every server started; never while this thread still creates servers and directories.
  std::lock_guard<std::mutex> lock(g_node_mutex);
  g_redis = &redis;
  if (options.cluster_store == "local") {
    auto server = LocalRedisServer::Start(redis.dir, /*cluster=*/false);
    if (!server.ok()) return server.status();
    redis.server = std::move(*server);
    redis.endpoint = redis.server->url();
  } else {
    auto cluster = LocalRedisCluster::Start(redis.dir, /*masters=*/3, /*replicas=*/1);
    if (!cluster.ok()) return cluster.status();
    redis.cluster = std::move(*cluster);
    redis.endpoint = redis.cluster->SeedUrl();
  }
  options.cluster_store_endpoint = redis.endpoint;
  std::cerr << "dhs-replay: cluster store " << options.cluster_store << " at " << redis.endpoint << " (" << redis.dir
            << ")\n";
  return absl::OkStatus();
}

// Stops what StartClusterStore started (after the nodes: RegisteredNode stops each node when its run ends).
struct ClusterStoreGuard {
  LocalRedis& redis;
  ~ClusterStoreGuard() {
    std::lock_guard<std::mutex> lock(g_node_mutex);
    g_redis = nullptr;
    redis.Stop();
  }
};

int Main(int argc, char** argv) {
  CommandLine cl = ParseReplayCommandLine(argc, argv);
  if (cl.exit_code) {
    (*cl.exit_code == 0 ? std::cout : std::cerr) << cl.message;
    return *cl.exit_code;
  }
  StartSignalThread();  // before any other thread (ZeroMQ's) starts, so that all of them block the two signals
  LocalRedis redis;
  ClusterStoreGuard redis_guard{redis};
  if (absl::Status s = StartClusterStore(cl.options, redis); !s.ok()) {
    std::cerr << "dhs-replay: --cluster-store " << cl.options.cluster_store << ": " << s.message() << "\n";
    return 1;
  }
  const ReplayOptions& options = cl.options;
  auto trace = RunTrace(options);
  if (!trace.ok()) {
    std::cerr << "dhs-replay: " << trace.status().message() << "\n";
    return 2;
  }
  const std::string mode(WorkerModeName(options.mode));
  auto faults = MakeFaultSetup(options);
  if (!faults.ok()) {
    std::cerr << "dhs-replay: " << faults.status().message() << "\n";
    return 2;
  }
  std::vector<std::optional<int64_t>> points;
  if (options.sweep.empty()) {
    points.push_back(std::nullopt);
  } else {
    for (int64_t c : options.sweep) points.push_back(c);
  }
  std::vector<SweepPoint> sweep;
  bool ok = true;
  // Issue 27: a prepared-prefix sweep runs every point on one node, so the prefixes are computed once per sweep.
  static const std::string kNoTag;
  std::optional<ReplayRun> shared;
  if (PrefixSweepSharesNode(options.prefix_workload, options.sweep.size(), options.connect) && !*faults) {
    shared.emplace(options, *trace, mode, *faults, kNoTag);
    if (absl::Status s = shared->StartOwnNode(std::nullopt); !s.ok()) {
      std::cerr << "dhs-replay: run failed: " << s.message() << "\n";
      return 1;
    }
  }
  for (size_t i = 0; i < points.size(); ++i) {
    if (shared) shared->SetFirstRequestId(SweepFirstRequestId(i));
    if (std::optional<int> code = RunPoint(options, *trace, mode, *faults, points[i], sweep, ok,
                                           shared ? &*shared : nullptr)) {
      // A point that failed before any request ended wrote nothing: the points measured before it still go to
      // --json / --csv (a partial point wrote them already, with itself marked incomplete).
      if (!sweep.empty() && sweep.size() == i) (void)WriteOutputs(options, sweep);
      return *code;
    }
  }
  if (!WriteOutputs(options, sweep).ok()) return 1;
  if (!options.plot_out.empty() && !WritePlot(options, sweep)) return 1;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace dhs::replay

int main(int argc, char** argv) { return dhs::replay::Main(argc, argv); }
