// workerd/worker_process.h: one worker process (brief §3), the counterpart of memd's Daemon: Start binds the serving
// socket ipc://<run_dir>/worker-<gpu>.sock (first: a live worker of the GPU makes a second one fail before it says
// Hello), joins memd (Hello, the mapped host pool) and creates the Worker while a helper thread keeps memd informed
// (issue 22: a long preparation is never taken for a hung worker); Run drives
// the event loop (memd's messages and heartbeats, clients' requests, one serving iteration) until told to stop.
// workerd's main only parses the command line, loads the model and calls Start / Run, as memd's main does.
//
// Thread-safety: Start, Run and ServeOnce from one thread (the ZeroMQ sockets are single-thread objects).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "workerd/device/device.h"
#include "workerd/geometry.h"
#include "workerd/memd_client.h"
#include "workerd/model/model.h"
#include "workerd/serving.h"
#include "workerd/worker.h"

namespace dhs {

// workerd's exit code when its epoch ended (fenced by memd, or memd lost): a supervisor restarts it (docs/operations.md).
inline constexpr int kExitEpochEnded = 75;

struct WorkerProcessOptions {
  std::string run_dir;  // holds memd.sock; the serving socket is bound here
  WorkerConfig config;
  std::chrono::milliseconds connect_timeout{10000};  // how long to wait for memd's HelloReply
  std::chrono::milliseconds memd_timeout{2000};      // MemdClient: memd silent this long ends the epoch (ABORTED)
  std::chrono::milliseconds memd_reconnect{30000};   // MemdClient: a dead memd's successor must take the re-Hello
                                                     // within this long, else the epoch ends (ABORTED)
  std::string device_name = "cpu-backend";           // Hello.device_name
  ClientOutboxLimits client_buffer;  // replies buffered for clients that do not read (ServingFrontend)
  std::string listen;  // issue 22: "" or workerd --listen's tcp:// endpoint (ServingFrontend::Bind, CURVE)
  // Called once with memd's mapped host pool before the Worker is created (the CUDA backend pins it there); an error
  // stops Start. Empty: nothing to do. It runs during the start-up's preparation (Start), with memd kept informed.
  std::function<absl::Status(std::span<uint8_t> host_pool)> on_host_pool;
  // TEST ONLY (workerd --fault-start-delay-ms): the preparation after HelloReply takes this much longer, as pinning a
  // terabyte of host memory or allocating a large pool would (issue 22); 0 = none.
  std::chrono::milliseconds start_delay_for_test{0};
  // Publish the Prometheus text after every iteration (metrics(); workerd --metrics-address). Off: metrics() stays
  // empty and the loop renders nothing.
  bool publish_metrics = false;
  // Check the Worker's invariants (Worker::CheckInvariants) after every serving iteration and abort on a broken one
  // (workerd reads $DHS_CHECK_INVARIANTS=1, as libdhs does at open: the process tests and tools/chaos.sh set it).
  bool check_invariants = false;
};

class WorkerProcess {
 public:
  // `model` and `device` must outlive the process. Start-up (issue 22; docs/operations.md "Start-up"): what needs no
  // memd (the model's weights, the geometry, the serving socket) happens before the Hello; what needs memd's
  // HelloReply (its host pool: mapped, pinned by on_host_pool; the Worker: its device pools, the hot caches) is the
  // preparation, and during it a helper thread keeps memd informed (MemdClient::KeepAlive: heartbeats both ways,
  // memd's orders held for the first Poll), so a preparation of any length is never taken for a hung worker.
  // Errors: INVALID_ARGUMENT (config, see ComputeGeometry; a socket path beyond sun_path, CheckSocketPaths), the
  // serving socket's (RouterServer::Bind; ALREADY_EXISTS: a live worker serves this GPU, nothing was sent to memd),
  // memd's (MemdClient::Connect), FAILED_PRECONDITION (a hierarchical mode without a host pool from memd), the
  // Worker's (Worker::Create), ABORTED (the epoch ended during the preparation: memd fenced this worker, or it heard
  // nothing from memd for the memd timeout: exit with kExitEpochEnded).
  static absl::StatusOr<std::unique_ptr<WorkerProcess>> Start(const model::Model* model, Device* device,
                                                              const WorkerProcessOptions& options);

  // Serves until keep_going() is false (checked every iteration, at most ~5 ms apart when idle). Errors: the memd
  // connection's or the serving socket's, or the Worker's (Iterate): the process should exit. ABORTED: this worker's
  // epoch ended (MemdClient::Poll: fenced by memd, or memd silent for memd_timeout while its connection is open; PollAway:
  // memd died and no memd took the re-Hello within memd_reconnect, or the new one refused it): nothing of memd's was
  // acted on in the iteration that found it; call Abandon, then exit with kExitEpochEnded. memd's death alone does
  // not end the epoch: the worker serves on (MemdAway::Enter) and says its re-Hello (MemdAway::Report) to the next
  // memd (MemdClient::PollAway), then goes on where it was (MemdAway::Return).
  absl::Status Run(const std::function<bool()>& keep_going);
  // One iteration: memd's messages (and our heartbeat; memd away: the re-Hello's next step, and no step of the
  // Worker while a re-Hello is out), clients' messages (waiting up to `wait`; replies waiting for
  // slow clients sent first), the requests of clients found gone end (UNAVAILABLE "client went away"),
  // Worker::Iterate. Returns whether work remains.
  absl::StatusOr<bool> ServeOnce(std::chrono::milliseconds wait);
  // After Run, before the process exits (SIGTERM): no more client requests are read; every unfinished request ends
  // with a final TokenChunk carrying UNAVAILABLE "worker stopping" and memd gets its Complete (Worker::StopAll); then
  // memd's messages are served until the orders in flight are answered and every such Complete is acknowledged, or
  // `timeout` passed. Queued replies are delivered for up to `timeout` when the sockets close. Returns how many
  // requests were ended; errors: the memd connection's (the clients were told already).
  absl::StatusOr<size_t> Shutdown(std::chrono::milliseconds timeout);
  // After Run returned ABORTED (the epoch ended): every unfinished request ends with a final TokenChunk carrying
  // UNAVAILABLE `why` (Worker::StopAll; its Completes go nowhere: memd dropped the epoch), delivered for up to
  // `linger` when the sockets close. Nothing else is sent; no order of memd is served. Returns how many ended.
  size_t Abandon(const absl::Status& why, std::chrono::milliseconds linger);

  const Worker& worker() const { return *worker_; }
  // The latest Prometheus text of this worker (RenderWorkerPrometheus of the frontend's whole WorkerStatsReply),
  // published by the loop after each iteration (ServeOnce) when options.publish_metrics. Thread-safe: workerd's
  // metrics server reads it.
  std::string metrics() const;
  const std::string& endpoint() const { return frontend_->endpoint(); }

 private:
  WorkerProcess() = default;
  // memd away: enters it (MemdAway::Enter), advances the re-Hello (MemdClient::PollAway) and, once a memd took it,
  // returns (MemdAway::Return). Errors: ABORTED (the epoch ended), UNAVAILABLE (memd unreachable after it).
  absl::Status ServeAway();
  // Start's phases. The serving socket bound, then memd's HelloReply taken (MemdClient::Connect); FailedPrecondition
  // when a mode that needs the host pool finds none listed.
  absl::Status BindAndConnect(const model::Model* model, const WorkerProcessOptions& options,
                              const WorkerGeometry& geometry);
  // Prepare, while a helper thread keeps memd informed (KeepAlive); the keep-alive's error (naming how long after
  // the HelloReply it came) or the preparation's.
  absl::Status PrepareKeptAlive(const model::Model* model, Device* device, const WorkerProcessOptions& options);
  // The preparation after HelloReply (see Start): on_host_pool, then Worker::Create, on this thread.
  absl::Status Prepare(const model::Model* model, Device* device, const WorkerProcessOptions& options);

  std::unique_ptr<MemdClient> memd_;
  wire::HelloT hello_;  // this worker's Hello (the re-Hello adds the report)
  std::unique_ptr<ServingFrontend> frontend_;
  std::unique_ptr<Worker> worker_;
  // Decode rate for the heartbeat, tokens/s over the last second.
  uint64_t tokens_before_ = 0;
  std::chrono::steady_clock::time_point rate_since_ = std::chrono::steady_clock::now();
  float tokens_per_s_ = 0;
  void PublishMetrics();
  bool publish_metrics_ = false;
  bool check_invariants_ = false;
  mutable std::mutex metrics_mu_;
  std::string metrics_;
};

}  // namespace dhs
