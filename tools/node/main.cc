// dhs-node: starts and supervises one node (memd + one workerd per configured GPU) from a TOML configuration
// (issue 11, "The node launcher"; docs/operations.md "Running a node with dhs-node").
//
//   dhs-node --config node.toml [--check] [--worker-liveness-timeout-ms MS]
//
// Exit codes: 0 clean stop (SIGTERM/SIGINT), --help, or --check of a good configuration; 1 the node could not run
// (an unusable or busy run directory, executables not found), a child failed before it was ever ready, or the node
// gave up (a child crashed more than supervise.max_restarts times within supervise.restart_window_s); 2 a bad
// command line or configuration (the message names the key and the problem), or --check found a problem (the run
// directory, or memd's or a worker's own --check-config).
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "spdlog/spdlog.h"
#include "tools/node/node_config.h"
#include "tools/node/node_geometry.h"
#include "tools/node/node_process.h"

namespace {

// memd or workerd: the configured path, else the build tree's (compiled in), else next to this executable.
std::string ExecutablePath(const std::string& configured, const char* built, const char* name) {
  if (!configured.empty()) return configured;
  if (::access(built, X_OK) == 0) return built;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(name) : (self.parent_path() / name).string();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("dhs-node: starts memd and one workerd per configured GPU, waits until all are registered, "
               "supervises them (restarts with backoff) and stops them cleanly on SIGTERM/SIGINT");
  std::string config_path;
  bool check_only = false;
  app.add_option("--config", config_path, "the node's TOML configuration (docs/operations.md)")->required();
  app.add_flag("--check", check_only,
               "validate the configuration, print memd's and the workers' command lines, run each one's own "
               "--check-config, check the run directory (writable, no live dhs-node, memd or worker on it), exit");
  int64_t worker_liveness_timeout_ms = -1;
  app.add_option("--worker-liveness-timeout-ms", worker_liveness_timeout_ms,
                 "overrides supervise.worker_liveness_timeout_ms: a ready worker no liveness probe found alive this "
                 "long gets SIGKILL and is restarted; 0 = off")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::ifstream in(config_path);
  if (!in) {
    std::fprintf(stderr, "dhs-node: cannot read %s\n", config_path.c_str());
    return 2;
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<dhs::node::NodeConfig> config = dhs::node::ParseNodeConfig(text.str());
  absl::StatusOr<uint64_t> page_bytes =
      config.ok() ? dhs::node::ResolvePageBytes(*config) : absl::StatusOr<uint64_t>(config.status());
  if (!page_bytes.ok()) {
    std::fprintf(stderr, "dhs-node: %s: %s\n", config_path.c_str(), std::string(page_bytes.status().message()).c_str());
    return 2;
  }
  if (worker_liveness_timeout_ms >= 0) config->supervise.worker_liveness_timeout_ms = worker_liveness_timeout_ms;
  const dhs::node::NodePaths paths{ExecutablePath(config->memd_path, DHS_MEMD_PATH, "memd"),
                                   ExecutablePath(config->workerd_path, DHS_WORKERD_PATH, "workerd")};
  if (check_only) {
    std::printf("%s", paths.memd.c_str());
    for (const std::string& a : dhs::node::MemdArgs(*config, *page_bytes)) std::printf(" %s", a.c_str());
    for (size_t i = 0; i < config->workers.size(); ++i) {
      std::printf("\n%s", paths.workerd.c_str());
      for (const std::string& a : dhs::node::WorkerArgs(*config, i)) std::printf(" %s", a.c_str());
    }
    std::printf("\n");
    std::fflush(stdout);
    std::vector<absl::Status> problems = {dhs::node::CheckRunDirUsable(config->run_dir),
                                          dhs::node::CheckRunDirFree(*config)};
    problems.push_back(
        dhs::node::CheckChildConfig("memd", paths.memd, dhs::node::MemdArgs(*config, *page_bytes)));
    for (size_t i = 0; i < config->workers.size(); ++i) {
      problems.push_back(dhs::node::CheckChildConfig("worker gpu " + std::to_string(config->workers[i].gpu),
                                                     paths.workerd, dhs::node::WorkerArgs(*config, i)));
    }
    int code = 0;
    for (const absl::Status& s : problems) {
      if (s.ok()) continue;
      std::fprintf(stderr, "dhs-node: %s: %s\n", config_path.c_str(), std::string(s.message()).c_str());
      code = 2;
    }
    return code;
  }
  return dhs::node::RunNode(*config, *page_bytes, paths);
}
