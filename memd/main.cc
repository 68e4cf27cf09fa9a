// memd: the node's memory daemon (brief §3, §4). See docs/operations.md for flags and operation.
#include <csignal>
#include <cstdio>
#include <fstream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_format.h"
#include "memd/daemon.h"
#include "memd/metrics_server.h"
#include "spdlog/spdlog.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  dhs::memd::DaemonOptions o;
  o.run_dir = dhs::memd::DefaultRunDir();
  uint64_t pool_bytes = 0, pool_pages = 0;
  std::string metrics_address, log_level = "info";
  CLI::App app("memd: the node memory daemon of Adaptive DHiSparse (host pool, GPU page accounting, admission, "
               "reclaim and population)");
  app.add_option("--run-dir", o.run_dir, "run directory (created 0700); holds memd.sock")->capture_default_str();
  app.add_option("--page-bytes", o.page_bytes, "bytes per KV page; every worker's Hello must match")->required();
  auto* bytes_opt = app.add_option("--host-pool-bytes", pool_bytes, "host pool size, bytes (rounded down to pages)");
  auto* pages_opt = app.add_option("--host-pool-pages", pool_pages, "host pool size, pages");
  bytes_opt->excludes(pages_opt);
  app.add_option("--reserve-pages", o.reserve_pages, "admission reserve M_res per GPU, pages")->capture_default_str();
  app.add_option("--reclaim-policy", o.reclaim_policy, "reclaim order of victims")
      ->check(CLI::IsMember({"oldest-first", "newest-first", "largest-first"}))
      ->capture_default_str();
  app.add_option("--populate-pages-per-attempt", o.populate_pages_per_attempt,
                 "pages one population attempt may hand out")->capture_default_str();
  app.add_option("--metrics-address", metrics_address,
                 "serve Prometheus text on GET /metrics at HOST:PORT (PORT 0: ephemeral; the bound address is "
                 "written to RUN_DIR/memd.metrics)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (pool_pages == 0 && o.page_bytes > 0) pool_pages = pool_bytes / o.page_bytes;
  if (pool_pages == 0 || pool_pages > UINT32_MAX) {
    std::fprintf(stderr, "memd: give --host-pool-pages N or --host-pool-bytes N (at least one page, < 2^32 pages)\n");
    return 2;
  }
  o.host_pool_pages = static_cast<uint32_t>(pool_pages);

  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  auto daemon = dhs::memd::Daemon::Start(o);
  if (!daemon.ok()) {
    std::fprintf(stderr, "memd: %s\n", std::string(daemon.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<dhs::memd::MetricsServer> metrics;
  if (!metrics_address.empty()) {
    dhs::memd::Daemon* d = daemon->get();
    auto m = dhs::memd::MetricsServer::Start(metrics_address, [d] { return d->metrics(); });
    if (!m.ok()) {
      std::fprintf(stderr, "memd: %s\n", std::string(m.status().message()).c_str());
      return 1;
    }
    metrics = std::move(*m);
    const std::string bound = absl::StrFormat("%s:%d", metrics->host(), metrics->port());
    std::ofstream(o.run_dir + "/memd.metrics") << bound << "\n";
    spdlog::info("memd: metrics on http://{}/metrics", bound);
  }
  spdlog::info("memd: serving {} (host pool /dev/shm/{}: {} pages x {} bytes, policy {})", (*daemon)->endpoint(),
               (*daemon)->segment().name(), o.host_pool_pages, o.page_bytes, o.reclaim_policy);
  absl::Status s = (*daemon)->Run([] { return g_stop == 0; });
  metrics.reset();
  daemon->reset();  // removes memd.sock and the host-pool segment
  std::remove((o.run_dir + "/memd.metrics").c_str());
  if (!s.ok()) {
    std::fprintf(stderr, "memd: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  spdlog::info("memd: stopped cleanly");
  return 0;
}
