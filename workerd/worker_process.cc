// workerd/worker_process.cc: see worker_process.h.
#include "workerd/worker_process.h"

#include <atomic>
#include "common/worker_metrics.h"

#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs {

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Start(const model::Model* model, Device* device,
                                                                     const WorkerProcessOptions& options) {
  const WorkerConfig& config = options.config;
  absl::StatusOr<WorkerGeometry> geometry = ComputeGeometry(model->config(), config);
  if (!geometry.ok()) return geometry.status();
  // memd's socket and ours must fit sun_path: checked before anything is bound or sent.
  if (absl::Status s = CheckSocketPaths(options.run_dir, config.gpu); !s.ok()) return s;
  std::unique_ptr<WorkerProcess> p(new WorkerProcess());
  // A run directory this user may not reach fails now, with "permission denied" (MemdClient::Connect checks again).
  if (absl::Status s = CheckSocketAccess(options.run_dir, "memd");
      !s.ok() && !absl::IsNotFound(s) && !absl::IsUnavailable(s)) {  // not yet / a dead memd's socket: waited for
    return absl::Status(s.code(), absl::StrCat("memd: ", s.message()));
  }
  if (absl::Status s = p->BindAndConnect(model, options, *geometry); !s.ok()) return s;
  if (absl::Status s = p->PrepareKeptAlive(model, device, options); !s.ok()) return s;
  p->worker_->book().set_epoch(p->memd_->worker_epoch());
  p->frontend_->set_submitter(p->worker_.get());
  p->publish_metrics_ = options.publish_metrics;
  p->check_invariants_ = options.check_invariants;
  p->PublishMetrics();
  // A new worker holds no request and ended none: every interrupted request of the GPU is resumable.
  if (absl::Status s = p->worker_->ResumeInterrupted(); !s.ok()) return s;
  p->worker_->clients().KeepFinishedOutputs(p->memd_->finished_records());  // also before the socket is served (lost ends)
  return p;
}

absl::Status WorkerProcess::BindAndConnect(const model::Model* model, const WorkerProcessOptions& options,
                                           const WorkerGeometry& geometry) {
  const WorkerConfig& config = options.config;
  // The serving socket first: a second workerd for a GPU whose worker is live fails here (RouterServer::Bind finds
  // the live listener: ALREADY_EXISTS) before it connects to memd as worker/<gpu>, which would take the live worker's
  // link to memd over (ROUTER_HANDOVER). A stale socket file of a crashed worker is replaced: a restart still works.
  absl::StatusOr<std::unique_ptr<ServingFrontend>> frontend = ServingFrontend::Bind(options.run_dir, config.gpu,
                                                                                    options.client_buffer,
                                                                                    options.listen);
  if (!frontend.ok()) {
    return absl::Status(frontend.status().code(),
                        absl::StrCat("serving socket of GPU ", config.gpu, ": ", frontend.status().message(),
                                     absl::IsAlreadyExists(frontend.status()) ? " (a worker for this GPU is running)"
                                                                              : ""));
  }
  frontend_ = *std::move(frontend);
  absl::StatusOr<wire::HelloT> made = MakeHello(model->config(), config, geometry, options.device_name);
  if (!made.ok()) return made.status();
  wire::HelloT hello = *std::move(made);
  hello.model_fingerprint = model->fingerprint();  // issue 26: the cluster tier's key space (memd GeometryOf)
  absl::StatusOr<std::unique_ptr<MemdClient>> memd = MemdClient::Connect(options.run_dir, hello,
                                                                         options.connect_timeout);
  if (!memd.ok()) return memd.status();
  memd_ = *std::move(memd);
  memd_->set_memd_timeout(options.memd_timeout);
  memd_->set_reconnect_bound(options.memd_reconnect);
  hello_ = hello;
  if (config.mode != WorkerMode::kResident && memd_->host_pages().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("mode ", std::string(WorkerModeName(config.mode)),
                                                      " needs a host pool, memd listed none"));
  }
  return absl::OkStatus();
}

absl::Status WorkerProcess::PrepareKeptAlive(const model::Model* model, Device* device,
                                             const WorkerProcessOptions& options) {
  // The preparation, while a helper thread keeps memd informed (the only thread using memd_ until it is joined; the
  // join is the memory barrier that hands the socket back to this thread). The preparation itself stays on this
  // thread: a CUDA backend's device and pinning calls see the thread that created the device.
  const auto prepare_start = std::chrono::steady_clock::now();
  absl::Status kept_alive;
  absl::Status prepared;
  {
    std::atomic<bool> done{false};
    std::thread keeper([&] {
      while (!done.load(std::memory_order_acquire)) {
        if (absl::Status s = memd_->KeepAlive(std::chrono::milliseconds(20)); !s.ok()) {
          kept_alive = s;
          return;
        }
      }
    });
    struct Join {  // also when the preparation throws (std::bad_alloc): a joinable std::thread must not be destroyed
      std::atomic<bool>& done;
      std::thread& keeper;
      ~Join() {
        done.store(true, std::memory_order_release);
        keeper.join();
      }
    } join{done, keeper};
    prepared = Prepare(model, device, options);
  }
  const auto prepare_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - prepare_start).count();
  if (!kept_alive.ok()) {
    return absl::Status(kept_alive.code(),
                        absl::StrCat("while preparing (", prepare_ms, " ms after memd's HelloReply): ",
                                     kept_alive.message()));
  }
  if (!prepared.ok()) return prepared;
  spdlog::info("workerd: gpu {} prepared in {} ms after memd's HelloReply (host pool, device pools, worker; memd "
               "kept informed; {} of memd's messages held for the first poll)", options.config.gpu, prepare_ms,
               memd_->held_messages());
  return absl::OkStatus();
}

absl::Status WorkerProcess::Prepare(const model::Model* model, Device* device, const WorkerProcessOptions& options) {
  if (options.start_delay_for_test.count() > 0) {
    spdlog::warn("workerd: TEST ONLY slow start: the preparation takes {} ms longer", options.start_delay_for_test.count());
    std::this_thread::sleep_for(options.start_delay_for_test);
  }
  if (options.on_host_pool && !memd_->host_pages().empty()) {
    if (absl::Status s = options.on_host_pool(memd_->host_pages()); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<Worker>> worker =
      Worker::Create(model, device, options.config, memd_.get(), frontend_.get());
  if (!worker.ok()) return worker.status();
  worker_ = *std::move(worker);
  return absl::OkStatus();
}

absl::StatusOr<bool> WorkerProcess::ServeOnce(std::chrono::milliseconds wait) {
  const auto now = std::chrono::steady_clock::now();
  if (now - rate_since_ >= std::chrono::seconds(1)) {
    const uint64_t tokens = worker_->stats().tokens_generated;
    tokens_per_s_ = static_cast<float>(tokens - tokens_before_) /
                    std::chrono::duration<float>(now - rate_since_).count();
    tokens_before_ = tokens;
    rate_since_ = now;
  }
  const MemdClient::Load load{worker_->book().active(), worker_->pending_orders(), tokens_per_s_};
  if (absl::Status s = memd_->Poll(worker_->memd_inbox(), load); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("memd connection: ", s.message()));
  }
  if (absl::Status s = ServeAway(); !s.ok()) return s;
  // Issue 27: a grant this Poll took starts in this iteration, not after a wait on the client sockets (which memd's
  // messages do not end: before, an idle worker's admission waited up to the whole `wait` here).
  if (worker_->book().granted_not_started() > 0) wait = std::chrono::milliseconds(0);
  if (absl::Status s = frontend_->Serve(wait); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("serving socket: ", s.message()));
  }
  for (const std::string& peer : frontend_->TakeGonePeers()) {
    if (const size_t n = worker_->clients().EndClient(peer, absl::UnavailableError("client went away")); n > 0) {
      spdlog::info("workerd: a client went away; its {} requests end", n);
    }
  }
  // Again right before the step: a worker stopped (SIGSTOP) while it waited on the serving socket must not step
  // requests whose grants memd may have fenced meanwhile.
  if (absl::Status s = memd_->CheckEpoch(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("memd connection: ", s.message()));
  }
  if (memd_->rehello_in_flight()) return false;  // the report holds every token: nothing steps until memd answers
  absl::StatusOr<bool> more = worker_->Iterate();
  if (check_invariants_) DHS_CHECK_OK(worker_->CheckInvariants());  // after memd's messages, the clients', the step
  PublishMetrics();
  return more;
}

void WorkerProcess::PublishMetrics() {
  if (!publish_metrics_) return;
  std::string text = RenderWorkerPrometheus(frontend_->StatsReply());
  std::lock_guard<std::mutex> lock(metrics_mu_);
  metrics_ = std::move(text);
}

std::string WorkerProcess::metrics() const {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  return metrics_;
}

absl::Status WorkerProcess::ServeAway() {
  if (!memd_->away()) return absl::OkStatus();
  worker_->memd_away().Enter();  // once per death
  absl::StatusOr<std::optional<wire::HelloReplyT>> back = memd_->PollAway([this] {
    wire::HelloT hello = hello_;
    hello.report = worker_->memd_away().Report();
    return hello;
  });
  if (!back.ok()) return absl::Status(back.status().code(), absl::StrCat("memd connection: ", back.status().message()));
  if (!back->has_value()) return absl::OkStatus();
  return worker_->memd_away().Return(**back);
}

absl::StatusOr<size_t> WorkerProcess::Shutdown(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  frontend_->SetLinger(timeout);
  memd_->SetLinger(timeout);
  const size_t ended = worker_->StopAll(WorkerStoppingError());  // end_reason WORKER_STOPPING
  absl::Status status;
  while (std::chrono::steady_clock::now() < deadline) {
    const MemdClient::Load load{worker_->book().active(), worker_->pending_orders(), 0};
    if (absl::Status s = memd_->Poll(worker_->memd_inbox(), load); !s.ok()) {
      status = absl::Status(s.code(), absl::StrCat("memd connection: ", s.message()));
      break;
    }
    frontend_->Flush();  // the final chunks of slow clients
    absl::StatusOr<bool> busy = worker_->Iterate();  // no request is active: advances the orders only
    if (!busy.ok()) {
      status = busy.status();
      break;
    }
    if (!*busy && worker_->book().unacknowledged_stops() == 0) break;
    if (memd_->away()) break;  // memd died: no Complete can be acknowledged (the next memd holds them interrupted)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!status.ok()) return status;
  if (worker_->book().unacknowledged_stops() != 0) {
    return absl::DeadlineExceededError(absl::StrCat(worker_->book().unacknowledged_stops(), " of ", ended,
                                                    " stopped requests not acknowledged by memd within ",
                                                    timeout.count(), " ms"));
  }
  return ended;
}

size_t WorkerProcess::Abandon(const absl::Status& why, std::chrono::milliseconds linger) {
  frontend_->SetLinger(linger);
  return worker_->StopAll(WorkerEpochEndedError(std::string(why.message())));
}

absl::Status WorkerProcess::Run(const std::function<bool()>& keep_going) {
  bool busy = false;
  while (keep_going()) {
    absl::StatusOr<bool> more = ServeOnce(std::chrono::milliseconds(busy ? 0 : 5));
    if (!more.ok()) return more.status();
    busy = *more;
  }
  return absl::OkStatus();
}

}  // namespace dhs
