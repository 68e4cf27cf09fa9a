// memd: the node's memory daemon (brief §3, §4). See docs/operations.md for flags and operation.
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "CLI/CLI.hpp"
#include "common/cli_flags.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/host_pool.h"
#include "common/sd_notify.h"
#include "common/transport.h"
#include "common/redis_client.h"  // issue 26: ParseSeeds checks --cluster-store
#include "memd/daemon.h"
#include "memd/memd_flags.h"  // kMemdFlags: memd's flags, one list (dhs-node reads it too)
#include "common/metrics_server.h"
#include "spdlog/spdlog.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }
// SIGUSR1: the node stops around memd (dhs-node's parent-death signal for memd, issue 22): the workers got SIGTERM at
// the same moment and end their requests ("worker stopping") with a Complete each; memd serves on until no request
// record is left, or kDrainMs passed, then stops as on SIGTERM. Without it, memd would stop first and keep those
// requests for the next memd, which would resume requests whose clients were told they ended.
volatile std::sig_atomic_t g_drain = 0;
void OnDrainSignal(int) { g_drain = 1; }
// The workers' own stop waits at most 5 s for memd's acknowledgements (WorkerProcess::Shutdown); one more second.
constexpr std::chrono::milliseconds kDrainMs{6000};

// A plain unsigned integer: CLI11 would wrap "-1" to 2^64-1 for an unsigned option.
CLI::Validator NotNegative() {
  return CLI::Validator(
      [](std::string& v) { return !v.empty() && v[0] == '-' ? std::string("must not be negative") : std::string(); },
      "", "NOT_NEGATIVE");
}

// --page-bytes: a positive multiple of 64 (docs/operations.md).
CLI::Validator PageBytes() {
  return CLI::Validator(
      [](std::string& v) {
        uint64_t n = 0;
        if (!CLI::detail::lexical_cast(v, n) || n == 0 || n % 64 != 0) {
          return "--page-bytes must be a positive multiple of 64, got " + v;
        }
        return std::string();
      },
      "", "PAGE_BYTES");
}

// A count that must not be 0 (`why` is the error); other values are left to the option's range check.
CLI::Validator AtLeastOne(std::string why) {
  return CLI::Validator(
      [why](std::string& v) {
        uint64_t n = 0;
        return CLI::detail::lexical_cast(v, n) && n == 0 ? why : std::string();
      },
      "", "AT_LEAST_1");
}

struct CommandLine {
  dhs::memd::DaemonOptions options;
  uint64_t pool_bytes = 0, pool_pages = 0;
  uint64_t worker_timeout_ms = 3000;
  uint64_t adopt_grace_ms = 6000;
  uint64_t unreadable_segment_age_s = 3600;
  std::string metrics_address, log_level = "info";
  std::string prefix_sharing = "off";  // --prefix-sharing off|on (issue 24)
  std::string kv_events = "off";       // --kv-events off|on (issue 24)
  uint64_t cluster_lookup_timeout_ms = 5;  // --cluster-lookup-timeout-ms (issue 26)
  const CLI::Option* cluster_lookup_timeout_flag = nullptr;  // given on the command line: needs --cluster-store
  bool check_config = false;  // --check-config (issue 22: dhs-node --check runs it)
};

// Issue 24: the KV event stream's flags (memd/kv_events.h, docs/protocol.md "KV event stream").
void AddKvEventFlags(CLI::App& app, CommandLine& c) {
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--kv-events", c.kv_events,
                     "publish the host tier's block stored / removed events on RUN_DIR/kv-events.sock (needs "
                     "--prefix-sharing on)")
      ->capture_default_str();
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--kv-events-hwm", c.options.kv_events_hwm,
                     "event batches queued per subscriber; past it batches are dropped (counted), memd never waits")
      ->capture_default_str();
}

// Issue 26: the cluster tier's flags (docs/cluster_tier.md).
void AddClusterFlags(CLI::App& app, CommandLine& c) {
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--cluster-store", c.options.cluster_store,
                     "the cluster tier on Redis: redis://HOST:PORT, or a comma-separated list of Redis Cluster seeds "
                     "(needs --prefix-sharing on; empty: off)")
      ->capture_default_str();
  c.cluster_lookup_timeout_flag =
      dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--cluster-lookup-timeout-ms", c.cluster_lookup_timeout_ms,
                         "deadline of one admission's cluster-tier lookup, ms (past it the pages are counted misses; "
                         "needs --cluster-store)")
          ->capture_default_str();
}

// Declares every flag of memd on `app`, writing into `c`.
void AddFlags(CLI::App& app, CommandLine& c) {
  dhs::memd::DaemonOptions& o = c.options;
  app.add_option("--run-dir", o.run_dir, "run directory (created 0700); holds memd.sock")->capture_default_str();
  app.add_option("--page-bytes", o.page_bytes,
                 "bytes per host pool page = p * (sum of d_KV + sum over indexers of idx_dim * 4): the payload "
                 "rows, then the index keys (docs/operations.md), a positive multiple of 64; every worker's Hello "
                 "(host_page_bytes) must match")
      ->required()
      ->check(NotNegative())
      ->check(PageBytes());
  // K/M/G/T = powers of 1000, KiB/MiB/GiB/TiB = powers of 1024 (case-insensitive), as dhs-replay's --hbm-budget.
  auto* bytes_opt = app.add_option("--host-pool-bytes", c.pool_bytes,
                                   "host pool size, bytes (K/M/G/T = 1000^n, KiB/MiB/GiB/TiB = 1024^n; rounded down "
                                   "to pages)")
                        ->transform(CLI::AsSizeValue(true))
                        ->transform(NotNegative());  // a transform runs before those added earlier: sign first
  auto* pages_opt = app.add_option("--host-pool-pages", c.pool_pages, "host pool size, pages")
                        ->check(dhs::IntegerIn<uint64_t>(0, UINT64_MAX));
  bytes_opt->excludes(pages_opt);
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--reserve-pages", o.reserve_pages,
                     "admission reserve M_res per GPU, pages")
      ->capture_default_str();
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--reclaim-policy", o.reclaim_policy, "reclaim order of victims")
      ->capture_default_str();
  app.add_option("--populate-pages-per-attempt", o.populate_pages_per_attempt,
                 "pages one population attempt may hand out (>= 1)")
      ->check(dhs::IntegerIn<uint32_t>(0, UINT32_MAX))
      ->check(AtLeastOne("--populate-pages-per-attempt must be at least 1 (0 would never populate)"))
      ->capture_default_str();
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--metrics-address", c.metrics_address,
                     "serve Prometheus text on GET /metrics at HOST:PORT (PORT 0: ephemeral; the bound address is "
                     "written to RUN_DIR/memd.metrics)");
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--worker-timeout-ms", c.worker_timeout_ms,
                     "a registered worker that sends nothing (its heartbeat comes every second) for this long is hung: "
                     "its GPU is fenced")
      ->capture_default_str();
  dhs::AddDaemonFlag(
      app, dhs::memd::kMemdFlags, "--adopt-grace-ms", c.adopt_grace_ms,
      "after adopting the host pool of a memd that died, the pages not adopted stay unused this long (its "
      "workers may still write them until their epochs end)")
      ->capture_default_str();
  app.add_option("--unreadable-segment-age-s", c.unreadable_segment_age_s,
                 "at start, a dhs-pool-* segment of this user that is not a readable host pool (a memd killed while "
                 "creating its pool leaves one) is removed once it was last modified this long ago; a younger one may "
                 "be another memd's pool being created and is kept")
      ->check(dhs::IntegerIn<uint64_t>(1, uint64_t{10} * 365 * 86400))
      ->capture_default_str();
  app.add_flag("--replace-host-pool", o.replace_host_pool,
               "replace a leftover host pool of this run directory that cannot be adopted (another --page-bytes or "
               "pool size) although its journal still names requests: their host copies are dropped. Without it such "
               "a start fails (exit 1) naming the requests, their pages and the pool's geometry, and keeps the pool");
  // Issue 24: the content-addressed host tier (memd/prefix_pages.h, docs/protocol.md "Prefix sharing").
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--prefix-sharing", c.prefix_sharing,
                     "share host pages of complete prefix blocks across requests (off: every host page is one "
                     "request's)")
      ->capture_default_str();
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--prefix-eviction", o.prefix_eviction,
                     "which cached prefix pages an admission evicts first")
      ->capture_default_str();
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--prefix-tenant-quota-pages", o.prefix_tenant_quota_pages,
                     "host pages one tenant may store as shared prefix pages (0: no quota)")
      ->capture_default_str();
  AddKvEventFlags(app, c);
  AddClusterFlags(app, c);
  dhs::AddDaemonFlag(app, dhs::memd::kMemdFlags, "--log-level", c.log_level,
                     absl::StrJoin(dhs::memd::MemdLogLevels(), ", "))
      ->capture_default_str();
  app.add_flag("--check-config", c.check_config,
               "check the options and exit: the command line as at a start, the host pool against the free space "
               "of /dev/shm, the metrics address by binding it for a moment; starts nothing, creates nothing (exit 0 "
               "ok, 2 a bad command line, 1 a pool or metrics address that would fail the start)");
}

// --check-config after the command line parsed: what a start would refuse before serving, without starting. Returns
// the exit code (0 ok, 1 not startable).
int CheckConfig(const CommandLine& c) {
  const dhs::memd::DaemonOptions& o = c.options;
  dhs::HostPoolExtras extras;  // the segment memd would create: header, journal, pages (HostPoolSegment's layout)
  extras.journal_bytes = dhs::memd::HostJournal::BytesFor(o.host_pool_pages);
  const uint64_t pool_bytes = dhs::HostPoolSegment::SizeFor(o.page_bytes, o.host_pool_pages, extras);
  if (absl::Status s = dhs::CheckFreeSpace("host pool of " + o.run_dir, pool_bytes); !s.ok()) {
    std::fprintf(stderr, "memd: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  if (!c.metrics_address.empty()) {
    auto m = dhs::MetricsServer::Start(c.metrics_address, [] { return std::string(); });
    if (!m.ok()) {  // as a start: not HOST:PORT is a bad value (2), an address that cannot be bound 1
      std::fprintf(stderr, "memd: --metrics-address: %s\n", std::string(m.status().message()).c_str());
      return absl::IsInvalidArgument(m.status()) ? 2 : 1;
    }
  }
  std::printf("memd: configuration ok (host pool %llu pages x %llu bytes)\n",
              static_cast<unsigned long long>(o.host_pool_pages), static_cast<unsigned long long>(o.page_bytes));
  return 0;
}

// The host pool size in pages from --host-pool-pages or --host-pool-bytes. Returns false (message printed) when
// missing, zero pages, or too large, or --kv-events on / a prefix cache limit without --prefix-sharing on.
bool SetPoolPages(CommandLine& c) {
  const uint64_t page_bytes = c.options.page_bytes;
  uint64_t pool_pages = c.pool_pages != 0 ? c.pool_pages : c.pool_bytes / page_bytes;
  if (pool_pages == 0 || pool_pages > UINT32_MAX) {
    std::fprintf(stderr,
                 "memd: give --host-pool-pages N or --host-pool-bytes N (at least one page of %llu bytes, fewer "
                 "than 2^32 pages)\n",
                 static_cast<unsigned long long>(page_bytes));
    return false;
  }
  if (page_bytes > (static_cast<uint64_t>(INT64_MAX) - dhs::kHostPoolHeaderBytes) / pool_pages) {
    std::fprintf(stderr, "memd: %llu pages of %llu bytes overflow a file size\n",
                 static_cast<unsigned long long>(pool_pages), static_cast<unsigned long long>(page_bytes));
    return false;
  }
  c.options.host_pool_pages = static_cast<uint32_t>(pool_pages);
  c.options.worker_timeout = std::chrono::milliseconds(c.worker_timeout_ms);
  c.options.prefix_sharing = c.prefix_sharing == "on";
  c.options.kv_events = c.kv_events == "on";  // issue 24: the stream tells what the host tier stores
  if (c.options.kv_events && !c.options.prefix_sharing) {
    std::fprintf(stderr, "memd: --kv-events on needs --prefix-sharing on\n");
    return false;
  }
  c.options.cluster_lookup_timeout = std::chrono::milliseconds(c.cluster_lookup_timeout_ms);
  if (c.options.cluster_store.empty() && c.cluster_lookup_timeout_flag != nullptr &&
      c.cluster_lookup_timeout_flag->count() > 0) {  // a deadline of nothing: a configuration mistake, said
    std::fprintf(stderr, "memd: --cluster-lookup-timeout-ms needs --cluster-store (the cluster tier it bounds)\n");
    return false;
  }
  if (!c.options.cluster_store.empty() && !c.options.prefix_sharing) {  // issue 26: it shares the host tier's pages
    std::fprintf(stderr, "memd: --cluster-store needs --prefix-sharing on\n");
    return false;
  }
  if (!c.options.cluster_store.empty()) {
    if (auto seeds = dhs::redis::ParseSeeds(c.options.cluster_store); !seeds.ok()) {
      std::fprintf(stderr, "memd: --cluster-store '%s': %s\n", c.options.cluster_store.c_str(),
                   std::string(seeds.status().message()).c_str());
      return false;
    }
  }
  if (!c.options.prefix_sharing && (c.options.prefix_eviction != dhs::memd::kDefaultPrefixEvictionPolicy ||
                                    c.options.prefix_tenant_quota_pages != 0)) {
    std::fprintf(stderr, "memd: --prefix-eviction and --prefix-tenant-quota-pages need --prefix-sharing on\n");
    return false;
  }
  c.options.adopt_grace = std::chrono::milliseconds(c.adopt_grace_ms);
  c.options.unreadable_segment_age = std::chrono::seconds(c.unreadable_segment_age_s);
  return true;
}

// Starts the daemon (and the metrics endpoint) and serves until SIGTERM/SIGINT. Returns the exit code.
int Serve(const CommandLine& c) {
  const dhs::memd::DaemonOptions& o = c.options;
  // The metrics address is bound first: a start that fails on it has not opened (nor adopted) the host pool.
  std::atomic<dhs::memd::Daemon*> serving{nullptr};
  std::unique_ptr<dhs::MetricsServer> metrics;
  if (!c.metrics_address.empty()) {
    auto m = dhs::MetricsServer::Start(c.metrics_address, [&serving] {
      dhs::memd::Daemon* d = serving.load();
      return d != nullptr ? d->metrics() : std::string();
    });
    if (!m.ok()) {  // not HOST:PORT, a port out of range: a bad value (2); an address that cannot be bound: 1
      std::fprintf(stderr, "memd: --metrics-address: %s\n", std::string(m.status().message()).c_str());
      return absl::IsInvalidArgument(m.status()) ? 2 : 1;
    }
    metrics = std::move(*m);
  }
  auto daemon = dhs::memd::Daemon::Start(o);
  if (!daemon.ok()) {
    std::fprintf(stderr, "memd: %s\n", std::string(daemon.status().message()).c_str());
    return 1;
  }
  serving.store(daemon->get());
  if (metrics != nullptr) {
    // Written whole, then renamed into place: a reader that sees RUN_DIR/memd.metrics never reads it half-written.
    if (absl::Status s = metrics->WriteAddressFile(o.run_dir + "/memd.metrics"); !s.ok()) {
      spdlog::warn("memd: {}", s.ToString());
    }
    spdlog::info("memd: metrics on http://{}/metrics", metrics->bound_address());
  }
  spdlog::info("memd: serving {} (host pool /dev/shm/{}: {} pages x {} bytes, policy {})", (*daemon)->endpoint(),
               (*daemon)->segment().name(), o.host_pool_pages, o.page_bytes, o.reclaim_policy);
  dhs::NotifyReady("serving " + (*daemon)->endpoint());  // systemd Type=notify (docs/systemd/memd.service)
  std::optional<std::chrono::steady_clock::time_point> drain_until, drained_at;
  const dhs::memd::Daemon* d = daemon->get();
  absl::Status s = (*daemon)->Run([&] {
    if (g_stop != 0) return false;
    if (g_drain == 0) return true;
    const auto now = std::chrono::steady_clock::now();
    if (!drain_until) {
      drain_until = now + kDrainMs;
      spdlog::info("memd: SIGUSR1 (the node stops): serving until the workers ended their {} requests (at most {} ms)",
                   d->records().size(), kDrainMs.count());
    }
    if (d->records().size() == 0) {
      // Serve a last moment so that the CompleteAcks just sent reach the workers (the socket closes without linger).
      if (!drained_at) drained_at = now;
      return now < *drained_at + std::chrono::milliseconds(200);
    }
    if (now < *drain_until) return true;
    spdlog::warn("memd: {} requests still open after {} ms: kept for the next memd", d->records().size(),
                 kDrainMs.count());
    return false;
  });
  metrics.reset();  // its thread stops before the daemon it reads goes
  serving.store(nullptr);
  daemon->reset();  // removes memd.sock and the host-pool segment
  std::remove((o.run_dir + "/memd.metrics").c_str());
  if (!s.ok()) {
    std::fprintf(stderr, "memd: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  spdlog::info("memd: stopped cleanly");
  return 0;
}

}  // namespace

// Exit codes (docs/operations.md): 0 clean stop (SIGTERM/SIGINT at any moment, or SIGUSR1 once the workers ended their
// requests), --help or a good --check-config; 1 a runtime failure (the host pool does not fit in /dev/shm, a leftover
// pool that cannot be adopted still names requests and --replace-host-pool is not given, an unusable run directory, a
// live memd on it, the metrics address cannot be bound, the loop failed); 2 a bad command line (unknown flag, missing
// --page-bytes, a value out of range, an empty or too long --run-dir, a --metrics-address that is not HOST:PORT).
int main(int argc, char** argv) {
  // First: a SIGTERM at any moment of the start (the pool's fallocate, the core's allocator) is taken, and memd stops
  // cleanly as soon as it serves (Run checks the flag first) instead of dying with its pool half made (issue 22).
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGUSR1, OnDrainSignal);
  CommandLine c;
  c.options.run_dir = dhs::DefaultRunDir();
  CLI::App app("memd: the node memory daemon of Adaptive DHiSparse (host pool, GPU page accounting, admission, "
               "reclaim and population)");
  AddFlags(app, c);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help prints and exits 0; every bad command line exits 2
  }
  spdlog::set_level(spdlog::level::from_str(c.log_level));
  if (!SetPoolPages(c)) return 2;
  // An empty --run-dir, or one too long for the node's sockets (memd.sock and every worker-<gpu>.sock must fit a unix
  // socket path), is a bad value (exit 2), as in dhs-node's configuration check.
  if (c.options.run_dir.empty()) {
    std::fprintf(stderr, "memd: --run-dir is empty\n");
    return 2;
  }
  if (absl::Status s = dhs::CheckSocketPaths(c.options.run_dir); !s.ok()) {
    std::fprintf(stderr, "memd: --run-dir: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // memd creates its run directory (mode 0700), not the directories above it: a missing parent is a bad --run-dir
  // (exit 2), said so before it could surface as a socket or mkdir error.
  if (const std::filesystem::path run_dir(c.options.run_dir), parent = run_dir.parent_path();
      !run_dir.empty() && !parent.empty() && !std::filesystem::is_directory(run_dir) &&
      !std::filesystem::is_directory(parent)) {
    std::fprintf(stderr, "memd: run directory %s does not exist and cannot be created: %s does not exist\n",
                 run_dir.c_str(), parent.c_str());
    return 2;
  }
  if (c.check_config) return CheckConfig(c);
  return Serve(c);
}
