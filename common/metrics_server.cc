#include "common/metrics_server.h"

#include <sys/socket.h>

#include <chrono>
#include <charconv>

#include "absl/strings/str_format.h"
#include "common/atomic_file.h"
#include "httplib.h"

namespace dhs {

absl::StatusOr<std::pair<std::string, int>> ParseMetricsAddress(std::string_view address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("metrics address '%s' is not HOST:PORT", std::string(address)));
  }
  const std::string_view port_text = address.substr(colon + 1);
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat("metrics address '%s': bad port", std::string(address)));
  }
  return std::make_pair(std::string(address.substr(0, colon)), port);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(std::string_view address,
                                                                    std::function<std::string()> snapshot) {
  absl::StatusOr<std::pair<std::string, int>> parsed = ParseMetricsAddress(address);
  if (!parsed.ok()) return parsed.status();
  const int port = parsed->second;
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->host_ = parsed->first;
  m->http_ = std::make_unique<httplib::Server>();
  // Exclusive: cpp-httplib's default sets SO_REUSEPORT, with which a second daemon binds the same address and
  // scrapes reach either at random. SO_REUSEADDR alone lets a restarted daemon bind over TIME_WAIT connections only.
  m->http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  m->http_->Get("/metrics", [snapshot = std::move(snapshot)](const httplib::Request&, httplib::Response& res) {
    res.set_content(snapshot(), "text/plain; version=0.0.4");
  });
  m->port_ = port == 0 ? m->http_->bind_to_any_port(m->host_) : (m->http_->bind_to_port(m->host_, port) ? port : -1);
  if (m->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrFormat("metrics: cannot listen on %s (in use by another process, or not a local address)",
                        std::string(address)));
  }
  httplib::Server* http = m->http_.get();
  std::atomic<bool>* listen_returned = &m->listen_returned_;
  m->thread_ = std::thread([http, listen_returned] {
    http->listen_after_bind();
    listen_returned->store(true);
  });
  return m;
}

std::string MetricsServer::bound_address() const { return absl::StrFormat("%s:%d", host_, port_); }

absl::Status MetricsServer::WriteAddressFile(const std::string& path) const {
  return WriteFileAtomically(path, bound_address() + "\n", 0644);
}

MetricsServer::~MetricsServer() {
  // cpp-httplib's stop() does nothing before listen_after_bind() marked the server running, and the listen would then
  // accept forever: a server destroyed right after Start (memd --check-config) waits until it runs (or its listen
  // returned) before stopping it.
  while (thread_.joinable() && !http_->is_running() && !listen_returned_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace dhs
