// common/metrics_server.h: the Prometheus endpoint of memd and of workerd (GET /metrics, text format 0.0.4) on
// cpp-httplib.
//
// Serves whatever text the `snapshot` callback returns (memd: Daemon::metrics(); workerd: WorkerProcess::metrics();
// each published by its loop under a mutex), from its own thread. Start binds HOST:PORT exclusively (no SO_REUSEPORT: a second daemon on the same address
// fails; PORT 0 = an ephemeral port; port() tells which).
//
// Thread-safety: Start/Stop/destructor from one thread; `snapshot` is called from the HTTP thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace dhs {

// Parses a metrics address "HOST:PORT" (PORT 0..65535; 0 = ephemeral). Returns {host, port}. Errors:
// INVALID_ARGUMENT "metrics address 'X' is not HOST:PORT" or "metrics address 'X': bad port". MetricsServer::Start and
// the daemons' command lines use this one parse, so a bad address is refused before anything starts (exit 2).
absl::StatusOr<std::pair<std::string, int>> ParseMetricsAddress(std::string_view address);

class MetricsServer {
 public:
  // `address` is "HOST:PORT" (e.g. "127.0.0.1:9464"). Errors: InvalidArgument (bad address), Unavailable (bind;
  // e.g. the address is in use, by another memd too).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(std::string_view address,
                                                              std::function<std::string()> snapshot);
  ~MetricsServer();  // stops the server and joins its thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // "HOST:PORT" as bound (the ephemeral port resolved).
  std::string bound_address() const;
  // Writes bound_address() and a newline to `path` whole (a temporary file renamed into place: a reader never sees
  // it half-written; memd: RUN_DIR/memd.metrics, workerd: RUN_DIR/worker-<gpu>.metrics; common/atomic_file.h).
  // Errors: WriteFileAtomically's (NOT_FOUND, PERMISSION_DENIED, INTERNAL, with errno's text).
  absl::Status WriteAddressFile(const std::string& path) const;
  const std::string& host() const { return host_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};  // the listen thread's listen_after_bind() returned (~MetricsServer)
  std::string host_;
  int port_ = 0;
};

}  // namespace dhs
