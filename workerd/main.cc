// workerd/main.cc: the worker process (brief §3): one per GPU. Parses the command line, loads the model (a weights
// file, or a preset + seed) and creates the device backend before anything is said to memd, then WorkerProcess::Start
// (ipc://<run_dir>/worker-<gpu>.sock, Hello to memd, then the preparation with memd kept informed: host pool, pools,
// Worker) and WorkerProcess::Run until SIGTERM/SIGINT, as memd's main does with Daemon::Start / Run.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "common/cli_flags.h"
#include "workerd/worker_flags.h"
#include "common/fault_point.h"
#include "common/metrics_server.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/sd_notify.h"
#include "spdlog/spdlog.h"
#include "workerd/device/cpu_device.h"
#ifdef DHS_HAVE_CUDA
#include "workerd/device/cuda_device.h"
#include "workerd/kv/cuda_plan_runner.h"
#endif
#include "workerd/device/async_device_cli.h"
#include "workerd/device/link_model_cli.h"
#include "workerd/speculation/speculation_cli.h"
#include "workerd/model/weights.h"
#include "workerd/worker_process.h"

namespace {
volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

absl::StatusOr<std::unique_ptr<dhs::model::Model>> LoadModel(const std::string& weights, const std::string& preset,
                                                             uint64_t seed) {
  if (!weights.empty()) return dhs::model::Model::Load(weights);
  absl::StatusOr<dhs::model::ModelConfig> config = dhs::model::PresetConfig(preset);
  if (!config.ok()) return config.status();
  absl::StatusOr<dhs::model::SafetensorsWriter> w = dhs::model::GenerateWeights(*config, seed);
  if (!w.ok()) return w.status();
  absl::StatusOr<dhs::model::SafetensorsFile> file = dhs::model::SafetensorsFile::Parse(w->Serialize());
  if (!file.ok()) return file.status();
  return dhs::model::Model::FromSafetensors(*file);
}

struct CommandLine {
  std::string run_dir, mode_name{dhs::WorkerModeName(dhs::WorkerMode::kAdaptive)}, weights,
      preset{dhs::model::kDefaultPreset}, log_level = "info";
  uint64_t seed = 1;
  int connect_timeout_ms = 10000;
  int memd_timeout_ms = 2000;
  int memd_reconnect_ms = 30000;
  int64_t resumed_output_age_ms = 600000;  // --resumed-output-age-ms (config.resumed_outputs.max_age)
  std::string device_name = "auto";
  dhs::LinkModelFlags link_flags;
  uint64_t async_device_seed = 0;  // --async-device SEED (issue 28): the CPU backend's asynchronous test mode
  dhs::spec::SpeculationFlags speculation;
  std::string fault_kill_at;  // test-only: --fault-kill-at KIND:N (common/fault_point.h)
  bool check_config = false;  // --check-config (issue 22: dhs-node --check runs it)
  int fault_start_delay_ms = 0;  // test-only: --fault-start-delay-ms N (WorkerProcessOptions::start_delay_for_test)
  std::string metrics_address;  // --metrics-address HOST:PORT (empty: no endpoint)
  dhs::WorkerConfig config;
  dhs::ClientOutboxLimits client_buffer;
  std::string listen;  // --listen tcp://ADDR:PORT (issue 22): a second serving socket, CURVE
};

// A flag of workerd's list (workerd/worker_flags.h: its range or choices come from there, as dhs-node's).
template <typename T>
CLI::Option* WorkerFlag(CLI::App& app, std::string_view flag, T& value, std::string help) {
  return dhs::AddDaemonFlag(app, dhs::kWorkerFlags, flag, value, std::move(help));
}

// The options of the worker's place (run directory, GPU, mode, device) and its model (weights, or preset + seed).
void AddServingOptions(CLI::App& app, CommandLine& c) {
  app.add_option("--run-dir", c.run_dir, "run directory holding memd.sock (mode 0700)")->required();
  WorkerFlag(app, "--gpu", c.config.gpu, "GPU id served by this worker")->capture_default_str();
  WorkerFlag(app, "--mode", c.mode_name, absl::StrJoin(dhs::WorkerModeNames(), " | "))->capture_default_str();
  WorkerFlag(app, "--device", c.device_name,
             "device backend: " + absl::StrJoin(dhs::WorkerDeviceNames(), " | ") +
                 " (auto: cuda when built with CUDA and a GPU is present)")
      ->capture_default_str();
  WorkerFlag(app, "--weights", c.weights, "safetensors weights file (else --preset + --seed)");
  WorkerFlag(app, "--preset", c.preset, "model preset when no --weights")->capture_default_str();
  WorkerFlag(app, "--seed", c.seed, "weights seed with --preset");
}

// The sizes (brief §4, §6): KV budget, slots, hot cache, tail, staging, pages, context, prefix cache, prefill chunk.
void AddGeometryOptions(CLI::App& app, CommandLine& c) {
  WorkerFlag(app, "--hbm-budget", c.config.hbm_budget_bytes, "GPU KV budget, bytes (M = budget / page bytes)")
      ->capture_default_str();
  WorkerFlag(app, "--slots", c.config.slots, "request slots N")->capture_default_str();
  WorkerFlag(app, "--hot-rows", c.config.hot_rows, "hot-cache rows B per slot and source (0 = auto)");
  WorkerFlag(app, "--tail-rows", c.config.tail_rows, "tail rows T per slot and source, a multiple of p (0 = 2p)");
  app.add_option("--staging-arenas", c.config.staging_arenas,
                 "χ: staging arenas of speculative verification (rows of a round's union beyond the hot cache), "
                 "M_stage = χ * N * K_max * k * d_KV bytes at start; 0 = none (a round must fit the hot cache)")
      ->check(dhs::IntegerIn<uint32_t>(0, 1024))
      ->capture_default_str();
  WorkerFlag(app, "--page-rows", c.config.page_rows, "rows per page p")->capture_default_str();
  WorkerFlag(app, "--max-context", c.config.max_context_tokens, "prompt + max_new_tokens limit, tokens")
      ->capture_default_str();
  WorkerFlag(app, "--prefix-cache-bytes", c.config.prefix_cache_bytes,
             "prepared-prefix row cache (rows produced once per hash-block chain), bytes; 0 = off")
      ->capture_default_str();
  WorkerFlag(app, "--prefill-chunk", c.config.prefill_chunk, "prompt tokens per request and step (0 = auto)");
}

// The clients' side: the submit queue, the reply buffers of clients that do not read, the CURVE listener.
void AddClientOptions(CLI::App& app, CommandLine& c) {
  app.add_option("--submit-queue", c.config.submit_queue,
                 "requests waiting for their grant at most; beyond: RESOURCE_EXHAUSTED \"submit queue full (N)\"")
      ->check(dhs::IntegerIn<uint32_t>(1, 1u << 20))
      ->capture_default_str();
  app.add_option("--client-buffer-bytes", c.client_buffer.per_client_bytes,
                 "replies buffered for one client that does not read, bytes; beyond: its streaming request fails")
      ->check(dhs::IntegerIn<uint64_t>(4096, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--client-buffer-total-bytes", c.client_buffer.total_bytes,
                 "replies buffered for all clients together, bytes (>= --client-buffer-bytes)")
      ->check(dhs::IntegerIn<uint64_t>(4096, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--listen", c.listen,
                 "also serve clients on tcp://ADDR:PORT (routers on other hosts) with ZeroMQ CURVE: the key pair is "
                 "RUN_DIR/serving-curve.secret (0600, created once) and a client needs RUN_DIR/serving-curve.pub; "
                 "tcp://:PORT binds 127.0.0.1; PORT * picks a free one (logged)")
      ->check([](const std::string& v) {
        absl::StatusOr<std::string> e = dhs::ParseListenEndpoint(v);
        return e.ok() ? std::string() : std::string(e.status().message());
      });
}

// The conversation with memd (connect, timeout, reconnect) and the outputs kept for clients of resumed requests.
void AddMemdOptions(CLI::App& app, CommandLine& c) {
  WorkerFlag(app, "--connect-timeout-ms", c.connect_timeout_ms, "how long to wait for memd's HelloReply")
      ->capture_default_str();
  WorkerFlag(app, "--memd-timeout-ms", c.memd_timeout_ms,
             "memd acks our heartbeat every second; nothing from memd for this long while its connection is "
             "open ends this worker's epoch (memd hung, or this worker was stopped): requests end with an error, "
             "exit code 75. Keep it below memd's --worker-timeout-ms")
      ->capture_default_str();
  WorkerFlag(app, "--memd-reconnect-ms", c.memd_reconnect_ms,
             "memd died (its connection closed): keep serving the granted requests from the GPU and say Hello "
             "again with a report (backoff 50 ms doubling to 1 s) for up to this long; then the epoch ends "
             "(exit code 75)")
      ->capture_default_str();
  app.add_option("--resumed-outputs-max", c.config.resumed_outputs.max_outputs,
                 "finished outputs of resumed requests kept for a client that has not re-attached (Attach), at most; "
                 "beyond, the oldest is dropped (logged, counted in resumed_outputs_dropped)")
      ->check(dhs::IntegerIn<uint32_t>(1, 1u << 24))
      ->capture_default_str();
  app.add_option("--resumed-output-bytes-max", c.config.resumed_outputs.max_bytes,
                 "those outputs' bytes together (12 per token + the error text), at most; beyond, the oldest is "
                 "dropped")
      ->check(dhs::IntegerIn<uint64_t>(1, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--resumed-output-age-ms", c.resumed_output_age_ms,
                 "how long such an output waits for its client before it is dropped, ms")
      ->check(dhs::IntegerIn<int64_t>(1, int64_t{1} << 40))
      ->capture_default_str();
}

// Operations: metrics endpoint, log level, --check-config; test-only fault injection, hidden from --help.
void AddOperationOptions(CLI::App& app, CommandLine& c) {
  WorkerFlag(app, "--metrics-address", c.metrics_address,
             "serve Prometheus text on GET /metrics at HOST:PORT (PORT 0: ephemeral; the bound address is written "
             "to RUN_DIR/worker-<gpu>.metrics); default: off")
      ->check([](const std::string& a) {  // refused at parse time (exit 2, --check-config too), not after Hello
        absl::StatusOr<std::pair<std::string, int>> parsed = dhs::ParseMetricsAddress(a);
        return parsed.ok() ? std::string() : std::string(parsed.status().message());
      });
  WorkerFlag(app, "--log-level", c.log_level, "spdlog level")->capture_default_str();
  app.add_flag("--check-config", c.check_config,
               "check the options and exit: the command line, the mode, speculation and link-model settings, the "
               "device choice and the geometry against the model (a --weights file is loaded); needs no memd and no "
               "run directory, starts nothing (exit 0 ok, 2 a bad option, 1 a weights file that cannot be loaded)");
  // Test-only, hidden from --help (empty group): fault-injection tests (dhs-replay --kill-worker-at) force a kill
  // at a chosen point of the serving loop.
  app.add_option("--fault-kill-at", c.fault_kill_at,
                 "TEST ONLY: SIGKILL this worker at the N-th arrival at a KIND point (prefill, decode, backup, "
                 "populate, reclaim), KIND:N")
      ->group("");
  app.add_option("--fault-start-delay-ms", c.fault_start_delay_ms,
                 "TEST ONLY: the start-up's preparation after memd's HelloReply takes N ms longer (a slow start: "
                 "pinning a large host pool, allocating large pools)")
      ->check(dhs::IntegerIn(0, 3600000))
      ->group("");
}

// Declares the options of `c` on `app`, group by group.
void AddOptions(CLI::App& app, CommandLine& c) {
  AddServingOptions(app, c);
  AddGeometryOptions(app, c);
  AddClientOptions(app, c);
  AddMemdOptions(app, c);
  AddOperationOptions(app, c);
  dhs::AddLinkModelOptions(app, &c.link_flags);
  dhs::AddAsyncDeviceOption(app, &c.async_device_seed);
  dhs::spec::AddSpeculationOptions(app, &c.speculation);
}

// The device backend (brief §9) chosen by --device, with the Hello's device name and, for CUDA, the registration of
// memd's host pool as pinned memory (WorkerProcessOptions::on_host_pool).
struct Backend {
  std::unique_ptr<dhs::Device> device;
  std::string name = "cpu-backend";
  std::function<absl::Status(std::span<uint8_t>)> on_host_pool;
};

// Whether `device_name` selects the CPU backend for GPU `gpu`. Errors: INVALID_ARGUMENT (the link model with a CUDA
// device; --device cuda without CUDA in the build).
absl::StatusOr<bool> ChooseCpuBackend(const std::string& device_name, const dhs::LinkModelConfig& link,
                                      dhs::GpuId gpu) {
#ifdef DHS_HAVE_CUDA
  const bool gpu_present = dhs::CudaDeviceCount() > static_cast<int>(gpu);
#else
  const bool gpu_present = false;
#endif
  if (device_name == "cpu" || (device_name == "auto" && !gpu_present)) return true;
  if (link.enabled) {  // docs/link_model.md: a model of the link for the CPU backend; on a GPU the link is real
    return absl::InvalidArgumentError(
        "--link-model models the host-device link of the CPU backend; use --device cpu with it");
  }
#ifndef DHS_HAVE_CUDA
  return absl::InvalidArgumentError("--device cuda: this workerd was built without CUDA (meson option cuda)");
#endif
  return false;
}

// Errors: ChooseCpuBackend's, the CUDA device's (CudaDevice::Create); INVALID_ARGUMENT for --async-device off the CPU
// backend or with the link model.
absl::StatusOr<Backend> MakeBackend(const std::string& device_name, const dhs::LinkModelConfig& link, dhs::GpuId gpu,
                                    uint64_t async_device_seed) {
  absl::StatusOr<bool> cpu = ChooseCpuBackend(device_name, link, gpu);
  if (!cpu.ok()) return cpu.status();
  Backend b;
  if (async_device_seed != 0) {  // issue 28: a test mode of the CPU backend, never of a GPU
    if (!*cpu) return absl::InvalidArgumentError("--async-device is a mode of the CPU backend; use --device cpu with it");
    if (link.enabled) return absl::InvalidArgumentError("--async-device and --link-model exclude each other");
    b.device = std::make_unique<dhs::CpuDevice>(dhs::WorkerAsyncDevice(async_device_seed));
    spdlog::warn("workerd: TEST MODE: asynchronous CPU device, seed {} (read hazards abort)", async_device_seed);
    return b;
  }
  if (*cpu) {
    b.device = std::make_unique<dhs::CpuDevice>(link);
    if (link.enabled) {
      spdlog::info("workerd: link model on: host->device {} GB/s, device->host {} GB/s, {} us per batch",
                   link.host_to_device_gb_per_s, link.device_to_host_gb_per_s, link.latency_us);
    }
    return b;
  }
#ifdef DHS_HAVE_CUDA
  // CUDA: the KV pools are managed memory (CudaDeviceOptions::managed_pools) while the model still runs on the CPU and
  // reads them through HostVisible; copies run on CUDA streams with events.
  absl::StatusOr<std::unique_ptr<dhs::CudaDevice>> cuda =
      dhs::CudaDevice::Create(dhs::CudaDeviceOptions{static_cast<int>(gpu), /*managed_pools=*/true});
  if (!cuda.ok()) return cuda.status();
  dhs::CudaDevice* raw = cuda->get();
  b.device = *std::move(cuda);
  b.name = "cuda-backend";
  // Issue 23: the KV access resolves with the kernel on this device (workerd/kv/kernel_resolver.h).
  dhs::SetDevicePlanRunner(dhs::plan::CudaPlanRunner());
  // memd's host-pool segment, pinned and mapped: host<->device copies are DMA of pinned memory. A failure is logged
  // and not fatal: copies stay correct, only slower.
  b.on_host_pool = [raw](std::span<uint8_t> pool) {
    if (absl::StatusOr<uint8_t*> pinned = raw->RegisterHostPool(pool); !pinned.ok()) {
      spdlog::warn("workerd: host pool not pinned (copies stay correct, slower): {}", pinned.status().ToString());
    }
    return absl::OkStatus();
  };
  return b;
#else
  return absl::InvalidArgumentError("--device cuda: this workerd was built without CUDA (meson option cuda)");
#endif
}
// Parses the command line into `cl` and resolves the mode (into cl.config) and the link model. Returns the exit code
// when the process ends here: 0 after --help, 2 for every bad command-line value (docs/operations.md).
std::optional<int> ParseCommandLine(int argc, char** argv, CommandLine& cl, dhs::LinkModelConfig& link) {
  CLI::App app{"workerd: the Adaptive DHiSparse worker (one per GPU)"};
  AddOptions(app, cl);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help (0) or the error
    return rc == 0 ? 0 : 2;
  }
  spdlog::set_level(spdlog::level::from_str(cl.log_level));
  // memd creates the run directory; a worker started on one that does not exist fails here, not as a bind error.
  if (std::error_code ec; !cl.check_config && !std::filesystem::is_directory(cl.run_dir, ec)) {
    spdlog::error("workerd: run directory {} does not exist (memd creates it: start memd first, with the same "
                  "--run-dir)", cl.run_dir);
    return 2;
  }
  absl::StatusOr<dhs::WorkerMode> mode = dhs::ParseWorkerMode(cl.mode_name);
  if (!mode.ok()) {
    spdlog::error("workerd: {}", mode.status().ToString());
    return 2;
  }
  cl.config.mode = *mode;
  absl::StatusOr<dhs::spec::SpeculationConfig> speculation = dhs::spec::ResolveSpeculation(cl.speculation);
  if (!speculation.ok()) {
    spdlog::error("workerd: {}", std::string(speculation.status().message()));
    return 2;
  }
  cl.config.speculation = *speculation;
  cl.config.resumed_outputs.max_age = std::chrono::milliseconds(cl.resumed_output_age_ms);
  if (!cl.fault_kill_at.empty()) {
    absl::StatusOr<dhs::FaultKill> kill = dhs::ParseFaultKill(cl.fault_kill_at);
    if (!kill.ok()) {
      spdlog::error("workerd: --fault-kill-at: {}", std::string(kill.status().message()));
      return 2;
    }
    spdlog::warn("workerd: TEST ONLY fault injection armed: SIGKILL at {}", dhs::FormatFaultKill(*kill));
    dhs::ArmFaultKill(*kill);
  }
  if (cl.client_buffer.total_bytes < cl.client_buffer.per_client_bytes) {
    spdlog::error("workerd: --client-buffer-total-bytes {} is below --client-buffer-bytes {}",
                  cl.client_buffer.total_bytes, cl.client_buffer.per_client_bytes);
    return 2;
  }
  absl::StatusOr<dhs::LinkModelConfig> resolved = dhs::ResolveLinkModel(cl.link_flags);
  if (!resolved.ok()) {
    spdlog::error("workerd: {}", std::string(resolved.status().message()));
    return 2;
  }
  link = *resolved;
  return std::nullopt;
}

// Starts the worker process on `backend` and serves until SIGTERM / SIGINT. Returns the exit code.
int Serve(const CommandLine& cl, dhs::model::Model* model, const dhs::WorkerGeometry& geometry, Backend& backend) {
  const dhs::WorkerConfig& config = cl.config;
  dhs::WorkerProcessOptions options;
  options.run_dir = cl.run_dir;
  options.config = config;
  options.connect_timeout = std::chrono::milliseconds(cl.connect_timeout_ms);
  options.memd_timeout = std::chrono::milliseconds(cl.memd_timeout_ms);
  options.memd_reconnect = std::chrono::milliseconds(cl.memd_reconnect_ms);
  options.device_name = backend.name;
  options.client_buffer = cl.client_buffer;
  options.listen = cl.listen;
  options.on_host_pool = backend.on_host_pool;
  options.start_delay_for_test = std::chrono::milliseconds(cl.fault_start_delay_ms);
  options.publish_metrics = !cl.metrics_address.empty();
  const char* check = std::getenv("DHS_CHECK_INVARIANTS");  // tests and chaos runs: abort on a broken invariant
  options.check_invariants = check != nullptr && std::string_view(check) == "1";
  if (options.check_invariants) spdlog::info("workerd: DHS_CHECK_INVARIANTS=1: invariants checked every iteration");
  absl::StatusOr<std::unique_ptr<dhs::WorkerProcess>> process =
      dhs::WorkerProcess::Start(model, backend.device.get(), options);
  if (!process.ok()) {
    spdlog::error("workerd: {}", process.status().ToString());
    // The epoch ended while the worker prepared (fenced, or memd silent): a supervisor restarts it (a new Hello).
    return absl::IsAborted(process.status()) ? dhs::kExitEpochEnded : 1;
  }
  spdlog::info("workerd: gpu {} mode {} serving at {} (M = {} pages of {} bytes, B = {}, T = {}, p = {}, N = {})",
               config.gpu, cl.mode_name, (*process)->endpoint(), geometry.capacity_pages, geometry.page_bytes,
               geometry.hot_rows, geometry.tail_rows, config.page_rows, config.slots);
  std::unique_ptr<dhs::MetricsServer> metrics;  // destroyed before the process its snapshot reads
  const std::string metrics_file = absl::StrCat(cl.run_dir, "/worker-", config.gpu, ".metrics");
  if (!cl.metrics_address.empty()) {
    dhs::WorkerProcess* p = process->get();
    absl::StatusOr<std::unique_ptr<dhs::MetricsServer>> m =
        dhs::MetricsServer::Start(cl.metrics_address, [p] { return p->metrics(); });
    if (!m.ok()) {
      spdlog::error("workerd: {}", std::string(m.status().message()));
      return 1;
    }
    metrics = *std::move(m);
    if (absl::Status s = metrics->WriteAddressFile(metrics_file); !s.ok()) spdlog::warn("workerd: {}", s.ToString());
    spdlog::info("workerd: metrics on http://{}/metrics", metrics->bound_address());
  }
  struct RemoveFile {
    const std::string& path;
    bool armed;
    ~RemoveFile() {
      if (armed) std::remove(path.c_str());
    }
  } remove_metrics_file{metrics_file, metrics != nullptr};
  dhs::NotifyReady("serving " + (*process)->endpoint());  // registered with memd; docs/systemd/workerd@.service
  if (absl::Status s = (*process)->Run([] { return g_stop == 0; }); !s.ok()) {
    if (!absl::IsAborted(s)) {
      spdlog::error("workerd: {}", s.ToString());
      return 1;
    }
    // The epoch ended (fenced, memd hung, or memd died and none came back in time): nothing memd granted may be used any more (docs/operations.md).
    const size_t ended = (*process)->Abandon(s, std::chrono::seconds(1));
    spdlog::error("workerd: gpu {}: {}; {} requests ended with an error; exiting with code {} so that a supervisor "
                  "restarts this worker (a new Hello: a new epoch)", config.gpu, std::string(s.message()), ended,
                  dhs::kExitEpochEnded);
    return dhs::kExitEpochEnded;
  }
  // Requests still being served end with an error chunk to their clients and a Complete to memd (issue 12).
  absl::StatusOr<size_t> ended = (*process)->Shutdown(std::chrono::seconds(5));
  if (!ended.ok()) {
    spdlog::warn("workerd: gpu {} stopping: {}", config.gpu, ended.status().ToString());
  } else if (*ended > 0) {
    spdlog::info("workerd: gpu {} stopping: {} unfinished requests ended (\"worker stopping\")", config.gpu, *ended);
  }
  spdlog::info("workerd: gpu {} stopping ({} tokens generated)", config.gpu,
               (*process)->worker().stats().tokens_generated);
  return 0;
}

}  // namespace

// --check-config after the command line parsed: the device choice and the geometry against the model's shape (a
// preset's shape without generating its weights; a --weights file loaded). Returns the exit code.
int CheckConfig(const CommandLine& cl, const dhs::LinkModelConfig& link) {
  if (absl::StatusOr<bool> cpu = ChooseCpuBackend(cl.device_name, link, cl.config.gpu); !cpu.ok()) {
    spdlog::error("workerd: --device {}: {}", cl.device_name, std::string(cpu.status().message()));
    return 2;
  }
  absl::StatusOr<dhs::model::ModelConfig> shape = dhs::model::PresetConfig(cl.preset);
  if (!cl.weights.empty()) {
    absl::StatusOr<std::unique_ptr<dhs::model::Model>> model = dhs::model::Model::Load(cl.weights);
    if (!model.ok()) {
      spdlog::error("workerd: cannot load the model: {}", model.status().ToString());
      return 1;
    }
    shape = (*model)->config();
  }
  if (!shape.ok()) {
    spdlog::error("workerd: {}", shape.status().ToString());
    return 2;
  }
  absl::StatusOr<dhs::WorkerGeometry> geometry = dhs::ComputeGeometry(*shape, cl.config);
  if (!geometry.ok()) {
    spdlog::error("workerd: {}", geometry.status().ToString());
    return 2;
  }
  std::printf("workerd: configuration ok (gpu %u: M = %llu pages of %llu bytes)\n", cl.config.gpu,
              static_cast<unsigned long long>(geometry->capacity_pages),
              static_cast<unsigned long long>(geometry->page_bytes));
  return 0;
}

int main(int argc, char** argv) {
  CommandLine cl;
  dhs::LinkModelConfig link;
  if (std::optional<int> rc = ParseCommandLine(argc, argv, cl, link)) return *rc;
  if (cl.check_config) return CheckConfig(cl, link);
  absl::StatusOr<std::unique_ptr<dhs::model::Model>> model = LoadModel(cl.weights, cl.preset, cl.seed);
  if (!model.ok()) {
    spdlog::error("workerd: cannot load the model: {}", model.status().ToString());
    return 1;
  }
  absl::StatusOr<dhs::WorkerGeometry> geometry = dhs::ComputeGeometry((*model)->config(), cl.config);
  if (!geometry.ok()) {
    spdlog::error("workerd: {}", geometry.status().ToString());
    return 2;
  }
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  absl::StatusOr<Backend> backend = MakeBackend(cl.device_name, link, cl.config.gpu, cl.async_device_seed);
  if (!backend.ok()) {
    spdlog::error("workerd: --device {}: {}", cl.device_name, backend.status().ToString());
    return backend.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  spdlog::info("workerd: device backend {}", backend->name);
  return Serve(cl, model->get(), *geometry, *backend);
}
