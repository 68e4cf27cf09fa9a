// memd/metrics_server.h: the Prometheus endpoint of memd (GET /metrics, text format 0.0.4) on cpp-httplib.
//
// Serves whatever text the `snapshot` callback returns (the daemon's metrics(), published by its loop under a
// mutex), from its own thread. Start binds HOST:PORT exclusively (no SO_REUSEPORT: a second memd on the same address
// fails; PORT 0 = an ephemeral port; port() tells which).
//
// Thread-safety: Start/Stop/destructor from one thread; `snapshot` is called from the HTTP thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace dhs::memd {

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
  const std::string& host() const { return host_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

}  // namespace dhs::memd
