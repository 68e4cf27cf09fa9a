// tools/replay/options.cc: command-line parsing and what the options mean (see options.h).
#include "tools/replay/options.h"
#include "tools/replay/router.h"

#include "common/protocol.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "CLI/CLI.hpp"
#include "common/cli_flags.h"
#include "common/redis_client.h"
#include "absl/strings/str_cat.h"
#include "memd/memd_flags.h"      // PrefixEvictionPolicyNames (issue 24: memd/prefix_pages.h owns them)
#include "memd/reclaim_policy.h"  // ReclaimPolicyNames (memd owns them)
#include "tools/replay/fault_plan.h"
#include "workerd/device/async_device_cli.h"
#include "workerd/device/link_model_cli.h"
#include "workerd/speculation/speculation_cli.h"

#ifndef DHS_REPLAY_DEFAULT_TRACE
#define DHS_REPLAY_DEFAULT_TRACE "tools/replay/data/mooncake_conversation_head200.jsonl"
#endif

namespace dhs::replay {
namespace {

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Issue 27: the prepared-prefix workload's own checks and what it does not combine with.
absl::Status ValidateWorkloadCombination(const ReplayOptions& o) {
  if (absl::Status s = ValidatePrefixWorkload(o.prefix_workload); !s.ok()) return s;
  if (!o.prefix_workload.on()) return absl::OkStatus();
  if (o.time_scale) return absl::InvalidArgumentError("--prefixes is a closed loop: not with --time-scale");
  if (InjectsFaults(o)) return absl::InvalidArgumentError("--prefixes: not with fault injection");
  return absl::OkStatus();
}

// Issue 24: memd's cache limits go to the memd the tool starts, and mean something only with sharing on.
absl::Status ValidatePrefixLimits(const ReplayOptions& o) {
  for (const auto& [name, given] : {std::pair<const char*, bool>{"--prefix-eviction", !o.prefix_eviction.empty()},
                                    {"--prefix-tenant-quota-pages", o.prefix_tenant_quota_pages != 0}}) {
    if (!given) continue;
    if (!o.connect.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " applies to the memd of a node the tool starts, not to --connect ", o.connect));
    }
    if (!o.prefix_sharing) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " needs --prefix-sharing on (it limits memd's cache of shared prefix pages)"));
    }
  }
  if (o.prefix_tenant_quota_pages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prefix-tenant-quota-pages must be >= 0, got ", o.prefix_tenant_quota_pages));
  }
  // The longest tenant the mix makes ("<--tenant>#<i mod N>") must fit the worker's bound (common/protocol.h).
  const size_t longest = o.tenant.size() + (o.tenants > 1 ? 1 + std::to_string(o.tenants - 1).size() : 0);
  if (longest > kMaxTenantBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--tenant: tenants of up to ", longest, " bytes (at most ",
                                                   kMaxTenantBytes, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ReplayOptions::DefaultTrace() { return DHS_REPLAY_DEFAULT_TRACE; }

namespace {
// Issue 26: --nodes, --route, --cluster-store.
absl::Status ValidateMultiNode(const ReplayOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.nodes < 1 || o.nodes > 16) return bad("--nodes must be in 1..16, got ", o.nodes);
  absl::StatusOr<RoutePolicy> route = ParseRoutePolicy(o.route);
  if (!route.ok()) return bad("--route: ", route.status().message());
  if (o.nodes > 1) {
    if (!o.connect.empty()) return bad("--nodes ", o.nodes, " starts its nodes; not with --connect ", o.connect);
    if (o.prefix_workload.on()) return bad("--nodes ", o.nodes, ": not with --prefixes (one node's workload)");
  }
  if (*route == RoutePolicy::kPrefix && !o.prefix_sharing) {
    return bad("--route prefix needs --prefix-sharing on (the KV event stream it routes by tells the shared host "
               "tier's blocks)");
  }
  if (!o.cluster_store.empty()) {
    if (!o.connect.empty()) return bad("--cluster-store applies to the nodes the tool starts, not to --connect");
    if (o.cluster_store != "local" && o.cluster_store != "local-cluster" && !StartsWith(o.cluster_store, "redis://")) {
      return bad("--cluster-store must be local, local-cluster or redis://HOST:PORT[,HOST:PORT...], got '",
                 o.cluster_store, "'");
    }
    if (StartsWith(o.cluster_store, "redis://")) {  // as every memd will parse it (memd --cluster-store)
      if (absl::Status s = redis::ParseSeeds(o.cluster_store).status(); !s.ok()) {
        return bad("--cluster-store: ", s.message());
      }
    }
  } else if (o.cluster_lookup_timeout_ms != 0) {
    return bad("--cluster-lookup-timeout-ms needs --cluster-store (the deadline of memd's cluster tier)");
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status ValidateReplayOptions(const ReplayOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.trace.empty()) return bad("--trace: a trace file is required");
  if (o.requests < 1) return bad("--requests must be >= 1, got ", o.requests);
  if (o.concurrency && *o.concurrency < 1) return bad("--concurrency must be >= 1, got ", *o.concurrency);
  if (o.time_scale && !(std::isfinite(*o.time_scale) && *o.time_scale >= 0)) {
    return bad("--time-scale must be a number >= 0, got ", *o.time_scale);
  }
  if (o.concurrency && o.time_scale) return bad("--concurrency and --time-scale exclude each other");
  if (!(std::isfinite(o.length_scale) && o.length_scale > 0)) {
    return bad("--length-scale must be a number > 0, got ", o.length_scale);
  }
  if (o.hbm_budget_bytes && *o.hbm_budget_bytes <= 0) {
    return bad("--hbm-budget must be > 0 bytes, got ", *o.hbm_budget_bytes);
  }
  if (!o.sweep.empty()) {
    if (o.concurrency || o.time_scale) return bad("--sweep excludes --concurrency and --time-scale");
    if (!o.outputs_out.empty() && !o.prefix_workload.on()) {  // issue 27: a prefix sweep writes OUT.c<C> per point
      return bad("--outputs with --sweep needs --prefixes (each point's outputs go to OUT.c<C>)");
    }
    std::set<int64_t> seen;
    for (int64_t c : o.sweep) {
      if (c < 1) return bad("--sweep: every concurrency must be >= 1, got ", c);
      if (!seen.insert(c).second) return bad("--sweep: concurrency ", c, " is repeated");
    }
  }
  if (!o.plot_out.empty() && o.sweep.empty()) return bad("--plot needs --sweep");
  if (!o.connect.empty() && !StartsWith(o.connect, "tcp://") && !StartsWith(o.connect, "ipc://")) {
    return bad("--connect must be a tcp:// or ipc:// endpoint, got '", o.connect, "'");
  }
  if (StartsWith(o.connect, "tcp://") && o.curve_server_key.empty()) {  // issue 22: tcp:// serving is CURVE only
    return bad("--connect ", o.connect, " needs --curve-server-key FILE (the worker's RUN_DIR/serving-curve.pub: "
               "a worker serves tcp:// with CURVE only)");
  }
  if (!o.curve_server_key.empty() && !StartsWith(o.connect, "tcp://")) {
    return bad("--curve-server-key applies to --connect tcp://HOST:PORT");
  }
  if (o.request_timeout_ms < 0) return bad("--request-timeout-ms must be >= 0, got ", o.request_timeout_ms);
  if (!o.connect.empty() && o.prefix_sharing) {
    return bad("--prefix-sharing applies to the memd of a node the tool starts, not to --connect ", o.connect);
  }
  if (absl::Status s = ValidatePrefixLimits(o); !s.ok()) return s;  // issue 24
  if (!o.connect.empty() && !o.reclaim_policy.empty()) {
    return bad("--reclaim-policy applies to a node the tool starts, not to --connect ", o.connect);
  }
  if (!o.connect.empty() && o.link_model.enabled) {
    return bad("--link-model applies to the worker the tool starts, not to --connect ", o.connect);
  }
  if (!o.connect.empty() && o.hot_rows != 0) {
    return bad("--hot-rows applies to the worker the tool starts, not to --connect ", o.connect);
  }
  if (!o.connect.empty() && o.async_device_seed != 0) {
    return bad("--async-device applies to the worker the tool starts, not to --connect ", o.connect);
  }
  if (o.link_model.enabled && o.async_device_seed != 0) return bad("--async-device and --link-model exclude each other");
  if (!o.connect.empty() && o.speculation.mode != spec::SpeculateMode::kOff) {
    return bad("--speculate applies to the worker the tool starts, not to --connect ", o.connect);
  }
  if (!o.connect.empty() && o.check_exact) {
    return bad("--check-exact needs a resident reference node that the tool starts; with --connect ", o.connect,
               " both runs would go to the same worker (drop one of the two)");
  }
  if (absl::Status s = ValidateMultiNode(o); !s.ok()) return s;  // issue 26
  if (InjectsFaults(o)) {
    if (!o.connect.empty()) {
      return bad("fault injection (--kill-worker-every, --restart-memd-every, --kill-worker-at) needs a node the tool "
                 "starts, not --connect ", o.connect);
    }
    if (!o.sweep.empty()) return bad("fault injection applies to one run, not to --sweep");
    for (const auto& [name, value] : {std::pair<const char*, double>{"--kill-worker-every", o.kill_worker_every_s},
                                      {"--restart-memd-every", o.restart_memd_every_s}}) {
      if (!std::isfinite(value) || value < 0) return bad(name, " must be a number of seconds > 0, got ", value);
    }
    if (absl::StatusOr<std::vector<FaultKill>> k = ParseHookKills(o.kill_worker_at, 1); !k.ok()) return k.status();
    if (o.corrupt_host_page_for_test && o.kill_worker_every_s <= 0) {
      return bad("--corrupt-host-page-for-test needs --kill-worker-every (the byte is flipped before a timed kill)");
    }
  }
  return absl::OkStatus();
}

bool InjectsFaults(const ReplayOptions& o) {
  return o.kill_worker_every_s != 0 || o.restart_memd_every_s != 0 || !o.kill_worker_at.empty() ||
         o.corrupt_host_page_for_test;
}

absl::Status ValidateOutputPaths(const ReplayOptions& o) {
  const std::pair<const char*, const std::string*> outputs[] = {
      {"--json", &o.json_out}, {"--csv", &o.csv_out}, {"--plot", &o.plot_out}, {"--outputs", &o.outputs_out}};
  for (const auto& [name, path] : outputs) {
    if (path->empty()) continue;
    const std::filesystem::path p(*path);
    const std::filesystem::path dir = p.has_parent_path() ? p.parent_path() : std::filesystem::path(".");
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": directory '", dir.string(), "' of '", *path, "' does not exist"));
    }
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": directory '", dir.string(), "' of '", *path, "' is not writable"));
    }
  }
  return absl::OkStatus();
}

namespace {

// What the command line gives before it lands in ReplayOptions: values whose absence matters, the options that
// exclude each other, the link-model and speculation flags resolved after the parse.
struct ParsedFlags {
  int64_t concurrency = 0;
  double time_scale = 0;
  int64_t hbm_budget = 0;
  CLI::Option* concurrency_opt = nullptr;
  CLI::Option* time_scale_opt = nullptr;
  CLI::Option* hbm_budget_opt = nullptr;
  CLI::Option* sweep_opt = nullptr;
  CLI::Option* plot_opt = nullptr;
  LinkModelFlags link_flags;
  spec::SpeculationFlags speculation_flags;
};

// The load: trace, requests, closed or open loop, scales, mode and KV budget.
void AddLoadOptions(CLI::App& app, ReplayOptions& o, ParsedFlags& f) {
  std::map<std::string, WorkerMode> modes;  // workerd's serving modes (workerd/serving_mode.h)
  for (const auto& [mode, name] : kWorkerModes) modes.emplace(std::string(name), mode);
  app.add_option("--trace", o.trace, "Trace file: .jsonl (Mooncake) or .csv (Azure)")
      ->check(CLI::ExistingFile)
      ->capture_default_str();
  app.add_option("--requests", o.requests, "Replay the first N requests")
      ->check(IntegerIn<int64_t>(1, INT64_MAX))->capture_default_str();
  f.concurrency_opt = app.add_option("--concurrency", f.concurrency,
                                     "Closed loop: keep C requests in flight (default " +
                                         std::to_string(ReplayOptions::kDefaultConcurrency) + ")")
                          ->check(IntegerIn<int64_t>(1, INT64_MAX));
  f.time_scale_opt =
      app.add_option("--time-scale", f.time_scale, "Open loop: submit each request at its trace arrival (ms) times X");
  app.add_option("--length-scale", o.length_scale,
                 "Multiply input and output lengths (and the 512-token hash block) by X")
      ->capture_default_str();
  app.add_option("--mode", o.mode, "KV placement: " + WorkerModeList())
      ->transform(CLI::CheckedTransformer(modes, CLI::ignore_case))
      ->default_str(std::string(WorkerModeName(ReplayOptions().mode)));
  f.hbm_budget_opt =
      app.add_option("--hbm-budget", f.hbm_budget, "GPU memory for the KV pools, bytes (KB, KiB, MiB, GB, ...)")
          ->transform(CLI::AsSizeValue(true));
}

// The outputs: exactness check, reports, per-request outputs, sweep and plot.
void AddOutputOptions(CLI::App& app, ReplayOptions& o, ParsedFlags& f) {
  app.add_flag("--check-exact", o.check_exact, "Also run resident and compare the tokens (brief §7)");
  app.add_option("--json", o.json_out, "Write the report as JSON to OUT");
  app.add_option("--csv", o.csv_out, "Write the report's scalar fields as CSV to OUT");
  app.add_option("--idle-timeout-ms", o.idle_timeout_ms,
                 "Fail the run after MS with requests in flight and no event from the node (a long prefill sends none)")
      ->check(IntegerIn<int64_t>(1000, 86400000))->capture_default_str();
  app.add_option("--outputs", o.outputs_out,
                 "Write every request's output tokens and logits digests to OUT, one JSON object a line (compare two "
                 "runs' files for exactness across runs, e.g. against a resident run on another node)");
  f.sweep_opt = app.add_option("--sweep", o.sweep, "Closed-loop runs at each concurrency C1,C2,...")->delimiter(',');
  f.plot_opt = app.add_option("--plot", o.plot_out, "With --sweep: plot throughput against concurrency to OUT.png");
}

// The node: an endpoint to use, or the one the tool starts (run directory, model, slots, memd's policy), and the
// client's conduct (re-attach, request timeout, CURVE key, prepared prefixes).
void AddNodeOptions(CLI::App& app, ReplayOptions& o) {
  app.add_option("--connect", o.connect, "Use the node at ENDPOINT (tcp:// or ipc://) instead of starting one");
  app.add_option("--run-dir", o.run_dir, "Directory for the sockets and logs of a node the tool starts");
  app.add_option("--preset", o.preset, "Built-in model topology of a node the tool starts")
      ->check(CLI::IsMember(model::PresetNames()))->capture_default_str();
  app.add_option("--seed", o.seed, "Weights seed of the built-in model")
      ->check(IntegerIn<uint64_t>(0, UINT64_MAX))->capture_default_str();
  app.add_option("--slots", o.slots, "Request slots of the worker the tool starts")
      ->check(IntegerIn<int64_t>(1, 1024))->capture_default_str();
  app.add_option("--reattach-timeout-ms", o.reattach_timeout_ms,
                 "When the worker goes away with requests unfinished, wait up to MS for a worker on the same socket "
                 "(restarted by dhs-node or a supervisor) and re-attach them (Attach: the stream goes on, nothing "
                 "lost or repeated); 0 = off, the run fails")
      ->check(IntegerIn<int64_t>(0, INT64_MAX));
  app.add_option("--request-timeout-ms", o.request_timeout_ms,
                 "Cancel a request not ended MS after its submit (the worker ends it and frees its slot and pages; "
                 "it counts as failed with end reason timeout) and go on; 0 = none")
      ->check(IntegerIn<int64_t>(0, INT64_MAX));
  app.add_option("--curve-server-key", o.curve_server_key,
                 "With --connect tcp://: the worker's CURVE public key file (its RUN_DIR/serving-curve.pub)");
  app.add_flag("--prepared-prefix", o.prepared_prefix,
               "Send the trace's hash_ids as a prepared prefix (imported history) instead of prompt bytes");
  app.add_flag("--chat-turns", o.chat_turns,
               "Issue 26: a session's next turn (tools/replay/sessions.h) waits for its previous turn's end and sends "
               "as its prompt the previous prompt, the previous answer's tokens, then its own new tokens (a chat "
               "template; prompt bytes, not a prepared prefix)");
  // Issue 24: the content-addressed host tier and the requests' tenants.
  app.add_option("--prefix-sharing", o.prefix_sharing,
                 "memd's --prefix-sharing of the node the tool starts: on shares the host pages of complete prefix "
                 "blocks across requests (the worker imports them instead of prefilling); default off")
      ->transform(CLI::CheckedTransformer(std::map<std::string, bool>{{"on", true}, {"off", false}}));
  app.add_option("--tenant", o.tenant, "Every request's tenant (an opaque salt; default: the default tenant)");
  app.add_option("--tenants", o.tenants,
                 "A tenant mix: a request has tenant \"<--tenant>#<k mod N>\" (N >= 1), k by --tenant-by")
      ->check(IntegerIn<int64_t>(1, 1 << 20));
  app.add_option("--tenant-by",
                 "Issue 26: with --tenants N > 1, k = the request's session (every turn of a conversation under one "
                 "tenant; a single-turn request's is its trace index), or its trace index (index: each row by itself)")
      ->check(CLI::IsMember({"session", "index"}))
      ->each([&o](const std::string& v) { o.tenant_by = v == "index" ? TenantKey::kTraceIndex : TenantKey::kSession; });
  app.add_option("--prefix-eviction", o.prefix_eviction,
                 "With --prefix-sharing on: memd's eviction order of cached prefix pages (default: memd's, lru)")
      ->check(CLI::IsMember(memd::PrefixEvictionPolicyNames()));
  app.add_option("--prefix-tenant-quota-pages", o.prefix_tenant_quota_pages,
                 "With --prefix-sharing on: host pages one tenant may store in memd's shared tier (writing, shared "
                 "and cached; 0 = no quota)")
      ->check(IntegerIn<int64_t>(0, UINT32_MAX));
  // Issue 26: several nodes, routing, the cluster store (ValidateMultiNode).
  app.add_option("--nodes", o.nodes, "Start N nodes on this machine (each its own run directory, memd and worker); "
                                     "default 1")
      ->check(IntegerIn<int64_t>(1, 16));
  app.add_option("--route", o.route,
                 "With --nodes N: round-robin, session (a session's turns stay on its node) or prefix (the node "
                 "holding the longest prefix of the request's blocks; needs --prefix-sharing on)")
      ->check(CLI::IsMember({"round-robin", "session", "prefix"}))->capture_default_str();
  app.add_option("--cluster-store", o.cluster_store,
                 "Every node's memd --cluster-store: local (a redis-server the tool starts), local-cluster (a 3-master "
                 "Redis Cluster it starts) or redis://HOST:PORT[,HOST:PORT...] (an existing one)");
  app.add_option("--cluster-lookup-timeout-ms", o.cluster_lookup_timeout_ms,
                 "With --cluster-store: every memd's --cluster-lookup-timeout-ms, the deadline of one admission's "
                 "cluster lookup (default: memd's, 5)")
      ->check(IntegerIn<int64_t>(1, 10000));
  app.add_option("--reclaim-policy", o.reclaim_policy,
                 absl::StrCat("Victim order of the memd the tool starts (default: memd's, ",
                              std::string(memd::kDefaultReclaimPolicy), ")"))
      ->check(CLI::IsMember(memd::ReclaimPolicyNames()));
}

// Fault injection on the node the tool starts.
void AddFaultOptions(CLI::App& app, ReplayOptions& o) {
  app.add_option("--kill-worker-every", o.kill_worker_every_s,
                 "Fault injection: SIGKILL the worker of the node the tool starts at random times, S seconds apart on "
                 "average; it is restarted and its requests resumed and re-attached");
  app.add_option("--restart-memd-every", o.restart_memd_every_s,
                 "Fault injection: SIGKILL memd at random times, S seconds apart on average (restarted with the same "
                 "flags; the worker is restarted with it)");
  app.add_option("--fault-seed", o.fault_seed, "Seed of the kill times and random kill points (printed)")
      ->check(IntegerIn<uint64_t>(0, UINT64_MAX));
  app.add_option("--fault-distribution", o.fault_distribution,
                 "Kill intervals: exponential (mean S) or uniform ([S/2, 3S/2])")
      ->check(CLI::IsMember({"exponential", "uniform"}))->capture_default_str();
  app.add_option("--kill-worker-at", o.kill_worker_at,
                 "Fault injection (test-only kill points): the k-th worker start SIGKILLs itself at the N-th KIND "
                 "point (prefill, decode, backup, populate, reclaim, complete); random:K draws K points from the seed; repeatable");
  app.add_flag("--corrupt-host-page-for-test", o.corrupt_host_page_for_test,
               "TEST ONLY: flip a byte of a recorded host page before the first timed kill (host_rows_lost > 0)");
}

// The worker the tool starts: link model, asynchronous device, hot cache, speculation; then the exclusions.
void AddWorkerOptions(CLI::App& app, ReplayOptions& o, ParsedFlags& f) {
  AddLinkModelOptions(app, &f.link_flags);
  AddAsyncDeviceOption(app, &o.async_device_seed);
  app.add_option("--hot-rows", o.hot_rows,
                 "hot-cache rows B per slot and source of the workerd the tool starts (0 = workerd's auto); with "
                 "B = k + window, speculative unions go through the staging arenas")
      ->check(IntegerIn<uint32_t>(0, 1u << 20));
  spec::AddSpeculationOptions(app, &f.speculation_flags);
  AddPrefixWorkloadOptions(app, o.prefix_workload);  // issue 27: the closed loop over prepared prefixes
  f.concurrency_opt->excludes(f.time_scale_opt);
  f.sweep_opt->excludes(f.concurrency_opt);
  f.sweep_opt->excludes(f.time_scale_opt);
  f.plot_opt->needs(f.sweep_opt);
}

// "dhs-replay: <why>" with exit code 2 in `cl`.
void UsageError(CommandLine& cl, absl::string_view why) {
  cl.exit_code = 2;
  cl.message = absl::StrCat("dhs-replay: ", why, "\nRun with --help for more information.\n");
}

// After the parse: the values given, the link model and speculation resolved, the defaults that depend on others.
absl::Status ResolveParsedFlags(const ParsedFlags& f, ReplayOptions& o) {
  if (f.concurrency_opt->count() > 0) o.concurrency = f.concurrency;
  if (f.time_scale_opt->count() > 0) o.time_scale = f.time_scale;
  if (f.hbm_budget_opt->count() > 0) o.hbm_budget_bytes = f.hbm_budget;
  absl::StatusOr<LinkModelConfig> link = ResolveLinkModel(f.link_flags);
  if (!link.ok()) return link.status();
  o.link_model = *link;
  absl::StatusOr<spec::SpeculationConfig> speculation = spec::ResolveSpeculation(f.speculation_flags);
  if (!speculation.ok()) return speculation.status();
  o.speculation = *speculation;
  // The worker it starts reads the drafter's file: a relative path is the caller's, made absolute here.
  if (!o.speculation.drafter_weights.empty()) {
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(o.speculation.drafter_weights, ec);
    if (!ec) o.speculation.drafter_weights = abs.string();
  }
  std::sort(o.sweep.begin(), o.sweep.end());
  if (!o.concurrency && !o.time_scale && o.sweep.empty()) o.concurrency = ReplayOptions::kDefaultConcurrency;
  return absl::OkStatus();
}

// The checks of the whole: ValidateReplayOptions, fault periods given as 0, the output paths.
absl::Status ValidateParsed(const CLI::App& app, const ReplayOptions& o) {
  absl::Status s = ValidateReplayOptions(o);
  for (const char* name : {"--kill-worker-every", "--restart-memd-every"}) {  // 0 is "not given" in ReplayOptions
    const double value = std::string_view(name) == "--kill-worker-every" ? o.kill_worker_every_s : o.restart_memd_every_s;
    if (s.ok() && app.count(name) > 0 && value == 0) {
      s = absl::InvalidArgumentError(absl::StrCat(name, " must be a number of seconds > 0, got 0"));
    }
  }
  if (s.ok()) s = ValidateWorkloadCombination(o);  // issue 27
  if (s.ok()) s = ValidateOutputPaths(o);
  return s;
}

}  // namespace

CommandLine ParseReplayCommandLine(int argc, const char* const* argv) {
  CommandLine cl;
  ReplayOptions& o = cl.options;
  CLI::App app{"Replays a request trace (Mooncake JSONL or Azure CSV) against a DHiSparse node and reports "
               "throughput, latency and memory figures. See docs/replay.md.",
               "dhs-replay"};
  ParsedFlags f;
  AddLoadOptions(app, o, f);
  AddOutputOptions(app, o, f);
  AddNodeOptions(app, o);
  AddFaultOptions(app, o);
  AddWorkerOptions(app, o, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {  // --help
      cl.exit_code = 0;
      cl.message = app.help();
    } else {
      UsageError(cl, e.what());
    }
    return cl;
  }
  absl::Status s = ResolveParsedFlags(f, o);
  if (s.ok()) s = ValidateParsed(app, o);
  if (!s.ok()) UsageError(cl, s.message());
  return cl;
}

absl::StatusOr<Trace> LoadTrace(const ReplayOptions& options) {
  auto trace = ReadTrace(options.trace);
  if (!trace.ok()) return trace.status();
  auto first = TakeFirst(*std::move(trace), options.requests);
  if (!first.ok()) return first.status();
  return ScaleLengths(*std::move(first), options.length_scale);
}

absl::StatusOr<Scheduler> MakeScheduler(const ReplayOptions& options, const Trace& trace,
                                        std::optional<int64_t> concurrency) {
  if (options.time_scale && !concurrency) {
    std::vector<double> arrivals;
    arrivals.reserve(trace.requests.size());
    for (const TraceRequest& r : trace.requests) arrivals.push_back(r.arrival_ms);
    return Scheduler::OpenLoop(arrivals, *options.time_scale);
  }
  return Scheduler::ClosedLoop(trace.requests.size(),
                               concurrency.value_or(options.concurrency.value_or(ReplayOptions::kDefaultConcurrency)));
}

std::string SweepCsvPath(const ReplayOptions& options) {
  if (!options.csv_out.empty()) return options.csv_out;
  if (options.plot_out.empty()) return "";
  std::string_view png = options.plot_out;
  if (png.size() > 4 && png.substr(png.size() - 4) == ".png") png.remove_suffix(4);
  return std::string(png) + ".csv";
}

RunSettings MakeRunSettings(const ReplayOptions& options, const Trace& trace, std::string_view prefill,
                            std::optional<int64_t> concurrency) {
  RunSettings s;
  s.trace_path = trace.path;
  s.trace_format = std::string(TraceFormatName(trace.format));
  s.block_tokens = trace.block_tokens;
  s.length_scale = options.length_scale;
  if (concurrency) {
    s.concurrency = concurrency;
  } else if (options.time_scale) {
    s.time_scale = options.time_scale;
  } else {
    s.concurrency = options.concurrency.value_or(ReplayOptions::kDefaultConcurrency);
  }
  s.mode = std::string(WorkerModeName(options.mode));
  s.prefill = std::string(prefill);
  s.hbm_budget_bytes = options.hbm_budget_bytes;
  s.check_exact = options.check_exact;
  s.connect = options.connect;
  s.reclaim_policy = options.reclaim_policy;
  s.link_model = options.link_model;
  s.speculation = options.speculation;
  s.prefix_sharing = options.prefix_sharing;  // issue 24
  s.tenant = options.tenant;
  s.tenants = options.tenants;
  s.tenant_by = options.tenant_by;
  s.prefix_eviction = options.prefix_eviction;
  s.prefix_tenant_quota_pages = options.prefix_tenant_quota_pages;
  return s;
}

}  // namespace dhs::replay
