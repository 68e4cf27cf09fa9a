#include "common/transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "common/log_limiter.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace dhs {
namespace {

absl::Status ErrnoStatus(int err, std::string_view what) {
  const std::string msg = absl::StrCat(std::string(what), ": ", std::strerror(err));
  switch (err) {
    case ENOENT: return absl::NotFoundError(msg);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(msg);
    case EEXIST: return absl::AlreadyExistsError(msg);
    case ENOSPC:
    case ENOMEM: return absl::ResourceExhaustedError(msg);
    case EINVAL:
    case ENAMETOOLONG: return absl::InvalidArgumentError(msg);
    default: return absl::InternalError(msg);
  }
}

absl::Status ZmqStatus(const zmq::error_t& e, std::string_view what) {
  if (e.num() == EHOSTUNREACH || e.num() == ETERM) return absl::UnavailableError(absl::StrCat(std::string(what), ": ", e.what()));
  return absl::InternalError(absl::StrCat(std::string(what), ": ", e.what()));
}

// Whether a server accepts connections on the unix socket at `path` right now. A connect interrupted by a signal is
// tried again on a new socket: a live server's socket must not be taken for a stale one.
bool SocketHasListener(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  while (true) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    const int err = errno;
    ::close(fd);
    if (rc == 0) return true;
    if (err != EINTR) return false;
  }
}

// Calls `call` (a libzmq C call: -1 and errno on failure) again while a signal interrupts it (EINTR): a send, receive,
// bind or connect that failed with EINTR did nothing, so calling it again is what the caller asked for.
template <typename Call>
int RetryOnEintr(Call call) {
  int rc;
  do {
    rc = call();
  } while (rc == -1 && zmq_errno() == EINTR);
  return rc;
}

// zmq_poll over `items`: the number ready, 0 when none within `timeout` or when a signal ended the wait early (the
// caller's loop checks its stop flag and waits again). Throws zmq::error_t for other errors.
int PollItems(zmq::pollitem_t* items, int count, std::chrono::milliseconds timeout) {
  const int rc = zmq_poll(items, count, static_cast<long>(timeout.count()));
  if (rc >= 0) return rc;
  if (zmq_errno() == EINTR) return 0;
  throw zmq::error_t();
}

// Receives every part of the next message without blocking; false when none is queued. A message's parts are queued
// together, so parts after the first never wait; each receive is retried on EINTR (a message is never left half read).
bool ReceiveParts(zmq::socket_t& socket, std::vector<zmq::message_t>& parts) {
  parts.clear();
  while (true) {
    zmq::message_t part;
    if (RetryOnEintr([&] { return zmq_msg_recv(part.handle(), socket.handle(), ZMQ_DONTWAIT); }) == -1) {
      if (zmq_errno() == EAGAIN && parts.empty()) return false;
      throw zmq::error_t();
    }
    const bool more = zmq_msg_more(part.handle()) != 0;
    parts.push_back(std::move(part));
    if (!more) return true;
  }
}

// Sends one part without blocking (retried on EINTR); false when it cannot be queued now (EAGAIN).
bool SendPart(zmq::socket_t& socket, std::string_view bytes, int flags) {
  if (RetryOnEintr([&] { return zmq_send(socket.handle(), bytes.data(), bytes.size(), flags | ZMQ_DONTWAIT); }) ==
      -1) {
    if (zmq_errno() == EAGAIN) return false;
    throw zmq::error_t();
  }
  return true;
}

void ZmqBind(zmq::socket_t& socket, const std::string& endpoint) {
  if (RetryOnEintr([&] { return zmq_bind(socket.handle(), endpoint.c_str()); }) != 0) throw zmq::error_t();
}

void ZmqConnect(zmq::socket_t& socket, const std::string& endpoint) {
  if (RetryOnEintr([&] { return zmq_connect(socket.handle(), endpoint.c_str()); }) != 0) throw zmq::error_t();
}

}  // namespace

// ---------------------------------------------------------------- ConnectionTable

ConnectionTable::Id ConnectionTable::Opened(int fd) {
  if (open_.contains(fd)) Closed(fd);  // its close was never reported: the descriptor is another connection's now
  const Id id = ++next_;
  open_[fd] = id;
  last_[fd] = id;
  return id;
}

ConnectionTable::Id ConnectionTable::Closed(int fd) {
  ++closes_;
  if (auto it = open_.find(fd); it != open_.end()) {
    const Id id = it->second;
    open_.erase(it);
    return id;
  }
  const Id id = ++next_;  // opened before the monitor started, or its open was not reported
  last_[fd] = id;
  return id;
}

ConnectionTable::Id ConnectionTable::Of(int fd) {
  if (auto it = open_.find(fd); it != open_.end()) return it->second;
  if (auto it = last_.find(fd); it != last_.end()) return it->second;
  const Id id = ++next_;
  open_[fd] = id;
  last_[fd] = id;
  return id;
}

bool ConnectionTable::IsOpen(Id id) const {
  for (const auto& [fd, open] : open_) {
    if (open == id) return true;
  }
  return false;
}

// ---------------------------------------------------------------- ConnectionMonitor

// A socket monitor (zmq_socket_monitor, event format of libzmq 4.x: a frame of [uint16 event][uint32 value], then a
// frame with the endpoint) that feeds a ConnectionTable: CONNECTED and ACCEPTED open a connection on the event's
// descriptor, DISCONNECTED closes it. Every call handles EINTR (cppzmq's monitor_t lets an interrupted poll escape as
// zmq::error_t and asserts on an interrupted receive). Same thread as the monitored socket.
class ConnectionMonitor {
 public:
  // Starts monitoring `socket` for `events` through inproc `address` of `context`. Throws zmq::error_t.
  ConnectionMonitor(zmq::context_t& context, zmq::socket_t& socket, const std::string& address, int events)
      : socket_(socket.handle()) {
    if (RetryOnEintr([&] { return zmq_socket_monitor(socket_, address.c_str(), events); }) != 0) throw zmq::error_t();
    try {
      pair_ = std::make_unique<zmq::socket_t>(context, zmq::socket_type::pair);
      pair_->set(zmq::sockopt::linger, 0);
      ZmqConnect(*pair_, address);
    } catch (const zmq::error_t&) {
      zmq_socket_monitor(socket_, nullptr, 0);
      throw;
    }
  }
  ~ConnectionMonitor() {
    zmq_socket_monitor(socket_, nullptr, 0);  // stops monitoring (before the monitored socket closes)
    pair_->close();
  }
  ConnectionMonitor(const ConnectionMonitor&) = delete;
  ConnectionMonitor& operator=(const ConnectionMonitor&) = delete;

  // Processes every queued event, waiting up to `timeout` for the first; returns how many were processed. A signal
  // ends the wait early (0). Never throws: an unexpected error is logged once per call and ends it.
  int Drain(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    int processed = 0;
    try {
      zmq::pollitem_t item{pair_->handle(), 0, ZMQ_POLLIN, 0};
      if (PollItems(&item, 1, timeout) == 0) return 0;
      std::vector<zmq::message_t> parts;
      while (ReceiveParts(*pair_, parts)) {
        if (parts.size() < 1 || parts[0].size() < 6) continue;  // not a libzmq 4.x event: skipped whole
        uint16_t event = 0;
        int32_t value = 0;
        std::memcpy(&event, parts[0].data(), 2);
        std::memcpy(&value, static_cast<const char*>(parts[0].data()) + 2, 4);
        if (event == ZMQ_EVENT_CONNECTED || event == ZMQ_EVENT_ACCEPTED) {
          table_.Opened(value);
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
          closed_.push_back(table_.Closed(value));
        }
        ++processed;
      }
    } catch (const zmq::error_t& e) {
      DHS_LOG_LIMITED(spdlog::level::warn, "socket monitor: {}", e.what());
    }
    return processed;
  }
  ConnectionTable& table() { return table_; }
  // The connections closed since the last call, in the order reported.
  std::vector<uint64_t> TakeClosed() { return std::exchange(closed_, {}); }

 private:
  void* socket_;
  std::unique_ptr<zmq::socket_t> pair_;
  ConnectionTable table_;
  std::vector<uint64_t> closed_;
};

std::string DefaultRunDir() { return absl::StrFormat("/tmp/dhs-%d", getuid()); }

absl::Status MakeRunDir(std::string_view path) {
  const std::string dir(path);
  if (dir.empty()) return absl::InvalidArgumentError("empty run directory path");
  if (::mkdir(dir.c_str(), 0700) == 0) {
    if (::chmod(dir.c_str(), 0700) != 0) return ErrnoStatus(errno, absl::StrCat("chmod ", dir));
    return absl::OkStatus();
  }
  if (errno != EEXIST) return ErrnoStatus(errno, absl::StrCat("mkdir ", dir));
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", dir));
  if (!S_ISDIR(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(dir, " exists and is not a directory"));
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(absl::StrCat("run directory ", dir, " is owned by uid ", st.st_uid));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("run directory %s has mode %04o; it must grant nothing to group or others", dir,
                        st.st_mode & 07777));
  }
  return absl::OkStatus();
}

static_assert(kMaxSocketPathBytes + 1 == sizeof(sockaddr_un{}.sun_path));

absl::Status CheckSocketPaths(std::string_view run_dir, std::optional<GpuId> gpu) {
  const GpuId worst = gpu.value_or(kMaxGpus - 1);
  for (const std::string& name : {std::string("memd"), absl::StrCat("worker-", worst)}) {
    const std::string path = absl::StrCat(std::string(run_dir), "/", name, ".sock");
    if (path.size() > kMaxSocketPathBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "run directory too long for its sockets: %s is %d bytes, a unix socket path holds at most %d (choose a run "
          "directory of at most %d bytes)",
          path, path.size(), kMaxSocketPathBytes, kMaxSocketPathBytes - (path.size() - run_dir.size())));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSocketAccess(std::string_view run_dir, std::string_view name) {
  const std::string path = absl::StrCat(std::string(run_dir), "/", std::string(name), ".sock");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == EACCES) return absl::PermissionDeniedError(absl::StrCat("permission denied: cannot reach ", path));
    if (e == ENOENT) return absl::NotFoundError(absl::StrCat("no socket at ", path));
    if (e == ENOTDIR) return absl::FailedPreconditionError(absl::StrCat(path, ": a path component is not a directory"));
    return ErrnoStatus(e, absl::StrCat("stat ", path));
  }
  if (!S_ISSOCK(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(path, " is not a socket"));
  if (::access(path.c_str(), R_OK | W_OK) != 0) {  // connecting to a unix socket needs write permission on it
    const int e = errno;
    if (e == EACCES) return absl::PermissionDeniedError(absl::StrCat("permission denied: cannot connect to ", path));
    return ErrnoStatus(e, absl::StrCat("access ", path));
  }
  // A server that died leaves its socket file; a ZeroMQ peer connected to it would wait silently for ever.
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": path too long"));
  }
  if (!SocketHasListener(path)) {
    return absl::UnavailableError(absl::StrCat("nothing listens on ", path, " (its server stopped and left the socket)"));
  }
  return absl::OkStatus();
}

std::string IpcEndpoint(std::string_view run_dir, std::string_view name) {
  return absl::StrCat("ipc://", std::string(run_dir), "/", std::string(name), ".sock");
}

// ---------------------------------------------------------------- RouterServer

RouterServer::RouterServer(std::unique_ptr<zmq::context_t> context, std::unique_ptr<zmq::socket_t> socket,
                           std::string endpoint, std::string socket_path)
    : context_(std::move(context)),
      socket_(std::move(socket)),
      monitor_(std::make_unique<ConnectionMonitor>(
          *context_, *socket_, absl::StrCat("inproc://dhs-router-monitor-", reinterpret_cast<uintptr_t>(this)),
          ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED)),
      endpoint_(std::move(endpoint)),
      socket_path_(std::move(socket_path)) {}

std::vector<uint64_t> RouterServer::TakeDisconnected() {
  monitor_->Drain();
  return monitor_->TakeClosed();
}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Bind(std::string_view run_dir, std::string_view name,
                                                                 Options options) {
  if (name.empty() || name.find('/') != std::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("bad socket name '", std::string(name), "'"));
  }
  const std::string path = absl::StrCat(std::string(run_dir), "/", std::string(name), ".sock");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path too long (", path.size(), " bytes): ", path));
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return absl::AlreadyExistsError(absl::StrCat(path, " exists and is not a socket"));
    // libzmq's bind silently replaces an existing ipc file: refuse when a server is alive there.
    if (SocketHasListener(path)) return absl::AlreadyExistsError(absl::StrCat("a server is listening on ", path));
    spdlog::info("removing stale socket {}", path);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoStatus(errno, absl::StrCat("unlink ", path));
  }
  const std::string endpoint = absl::StrCat("ipc://", path);
  try {
    auto context = std::make_unique<zmq::context_t>(1);
    auto socket = std::make_unique<zmq::socket_t>(*context, zmq::socket_type::router);
    socket->set(zmq::sockopt::linger, 0);
    socket->set(zmq::sockopt::router_mandatory, 1);  // Reply to a gone peer fails instead of dropping
    socket->set(zmq::sockopt::router_handover, 1);   // a restarted peer with the same id takes over
    socket->set(zmq::sockopt::maxmsgsize, options.hard_max_message_bytes);
    if (options.heartbeat_interval.count() > 0) {
      socket->set(zmq::sockopt::heartbeat_ivl, static_cast<int>(options.heartbeat_interval.count()));
      socket->set(zmq::sockopt::heartbeat_timeout, static_cast<int>(options.heartbeat_timeout.count()));
    }
    ZmqBind(*socket, endpoint);
    return std::unique_ptr<RouterServer>(new RouterServer(std::move(context), std::move(socket), endpoint, path));
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("bind ", endpoint));
  }
}

// Issue 22 (TCP serving with CURVE).
absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::BindTcp(std::string_view endpoint_view, Options options) {
  const std::string endpoint(endpoint_view);
  if (endpoint.rfind("tcp://", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("not a tcp:// endpoint: '", endpoint, "'"));
  }
  if (!options.curve_secret_key.empty() && options.curve_secret_key.size() != 40) {
    return absl::InvalidArgumentError("CURVE secret key: 40 Z85 characters expected");
  }
  try {
    auto context = std::make_unique<zmq::context_t>(1);
    auto socket = std::make_unique<zmq::socket_t>(*context, zmq::socket_type::router);
    socket->set(zmq::sockopt::linger, 0);
    socket->set(zmq::sockopt::router_mandatory, 1);
    socket->set(zmq::sockopt::router_handover, 1);
    socket->set(zmq::sockopt::maxmsgsize, options.hard_max_message_bytes);
    if (options.heartbeat_interval.count() > 0) {
      socket->set(zmq::sockopt::heartbeat_ivl, static_cast<int>(options.heartbeat_interval.count()));
      socket->set(zmq::sockopt::heartbeat_timeout, static_cast<int>(options.heartbeat_timeout.count()));
    }
    if (!options.curve_secret_key.empty()) {
      socket->set(zmq::sockopt::curve_server, 1);
      socket->set(zmq::sockopt::curve_secretkey, options.curve_secret_key);
    }
    socket->bind(endpoint);
    const std::string bound = socket->get(zmq::sockopt::last_endpoint);
    return std::unique_ptr<RouterServer>(new RouterServer(std::move(context), std::move(socket), bound, ""));
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("bind ", endpoint));
  }
}

absl::StatusOr<int> RouterServer::WaitReadable(const std::vector<RouterServer*>& routers,
                                               std::chrono::milliseconds timeout) {
  std::vector<zmq::pollitem_t> items;
  for (RouterServer* r : routers) items.push_back(zmq::pollitem_t{r->socket_->handle(), 0, ZMQ_POLLIN, 0});
  try {
    if (zmq::poll(items.data(), items.size(), timeout) <= 0) return -1;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return -1;
    return ZmqStatus(e, "poll of the serving sockets");
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if ((items[i].revents & ZMQ_POLLIN) != 0) return static_cast<int>(i);
  }
  return -1;
}

void RouterServer::SetLinger(std::chrono::milliseconds linger) {
  socket_->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
}

RouterServer::~RouterServer() {
  monitor_.reset();  // stops monitoring before the socket closes
  socket_->close();
  context_->close();
  if (!socket_path_.empty()) ::unlink(socket_path_.c_str());  // tcp:// has none
}

absl::StatusOr<std::optional<Incoming>> RouterServer::Poll(std::chrono::milliseconds timeout) {
  try {
    zmq::pollitem_t item{socket_->handle(), 0, ZMQ_POLLIN, 0};
    if (PollItems(&item, 1, timeout) == 0) return std::optional<Incoming>();
    std::vector<zmq::message_t> parts;
    if (!ReceiveParts(*socket_, parts)) return std::optional<Incoming>();
    // The monitor's events up to this message (its connection's ACCEPTED, an earlier connection's DISCONNECTED on
    // the same descriptor number) are queued by now: taken first, so the message is tied to its own connection.
    monitor_->Drain();
    if (parts.size() != 2) {
      DHS_LOG_LIMITED(spdlog::level::warn, "{}: dropping a message of {} frames (expected routing id + payload)",
                      endpoint_, parts.size());
      return std::optional<Incoming>();
    }
    const int fd = zmq_msg_get(parts[1].handle(), ZMQ_SRCFD);
    return std::optional<Incoming>(
        Incoming{parts[0].to_string(), parts[1].to_string(), fd, fd >= 0 ? monitor_->table().Of(fd) : 0});
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("receive on ", endpoint_));
  }
}

absl::Status RouterServer::Reply(std::string_view peer, std::string_view bytes) {
  try {
    // The routing id and the payload: a ROUTER queues a message's parts together (all or none: the first part's
    // EAGAIN / EHOSTUNREACH), so the payload is never refused once the id was taken.
    if (!SendPart(*socket_, peer, ZMQ_SNDMORE) || !SendPart(*socket_, bytes, 0)) {
      return absl::ResourceExhaustedError(absl::StrCat("reply queue of peer full on ", endpoint_));
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("reply on ", endpoint_));
  }
}

// ---------------------------------------------------------------- DealerClient

DealerClient::DealerClient(std::string endpoint, Options options)
    : endpoint_(std::move(endpoint)), options_(std::move(options)), context_(std::make_unique<zmq::context_t>(1)) {}

absl::StatusOr<std::unique_ptr<DealerClient>> DealerClient::Connect(std::string endpoint, Options options) {
  std::unique_ptr<DealerClient> client(new DealerClient(std::move(endpoint), std::move(options)));
  if (absl::Status status = client->OpenSocket(); !status.ok()) return status;
  return client;
}

void DealerClient::SetLinger(std::chrono::milliseconds linger) {
  if (socket_ != nullptr) socket_->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
}

DealerClient::~DealerClient() {
  CloseSocket();
  context_->close();
}

absl::Status DealerClient::OpenSocket() {
  try {
    socket_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::dealer);
    socket_->set(zmq::sockopt::linger, 0);
    socket_->set(zmq::sockopt::reconnect_ivl, static_cast<int>(options_.reconnect_interval.count()));
    if (!options_.identity.empty()) socket_->set(zmq::sockopt::routing_id, options_.identity);
    if (!options_.curve_server_key.empty()) {  // issue 22: a CURVE client with a key pair of its own
      char public_key[41], secret_key[41];
      if (zmq_curve_keypair(public_key, secret_key) != 0) {
        CloseSocket();
        return absl::FailedPreconditionError("CURVE is not available in this libzmq (zmq_has(\"curve\") is false)");
      }
      socket_->set(zmq::sockopt::curve_serverkey, options_.curve_server_key);
      socket_->set(zmq::sockopt::curve_publickey, std::string(public_key, 40));
      socket_->set(zmq::sockopt::curve_secretkey, std::string(secret_key, 40));
    }
    if (const int ivl = static_cast<int>(options_.heartbeat_interval.count()); ivl > 0) {
      socket_->set(zmq::sockopt::heartbeat_ivl, ivl);
      socket_->set(zmq::sockopt::heartbeat_timeout, 3 * ivl);
    }
    monitor_ = std::make_unique<ConnectionMonitor>(
        *context_, *socket_,
        absl::StrCat("inproc://dhs-monitor-", reinterpret_cast<uintptr_t>(this), "-", ++socket_generation_),
        ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED);
    ZmqConnect(*socket_, endpoint_);
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    CloseSocket();
    return ZmqStatus(e, absl::StrCat("connect ", endpoint_));
  }
}

void DealerClient::CloseSocket() {
  monitor_.reset();  // stops monitoring before the socket closes
  if (socket_ != nullptr) socket_->close();
  socket_.reset();
  source_fd_ = -1;
  source_inode_ = 0;
}

absl::Status DealerClient::Send(std::string_view bytes) {
  if (socket_ == nullptr) return absl::UnavailableError("client socket is closed");
  try {
    if (!SendPart(*socket_, bytes, 0)) {
      return absl::UnavailableError(absl::StrCat("cannot queue a message to ", endpoint_));
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("send to ", endpoint_));
  }
}

absl::StatusOr<std::string> DealerClient::Receive(std::chrono::milliseconds timeout) {
  if (socket_ == nullptr) return absl::UnavailableError("client socket is closed");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  try {
    while (true) {
      zmq::pollitem_t item{socket_->handle(), 0, ZMQ_POLLIN, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (PollItems(&item, 1, std::max(left, std::chrono::milliseconds(0))) > 0) {
        std::vector<zmq::message_t> parts;
        if (ReceiveParts(*socket_, parts) && !parts.empty()) {
          // The connection that delivered it, by descriptor and inode (a later connection may get the same
          // descriptor number: its inode differs): what PeerClosed looks at.
          if (const int fd = zmq_msg_get(parts.back().handle(), ZMQ_SRCFD); fd >= 0) {
            struct stat st {};
            if (::fstat(fd, &st) == 0) {
              source_fd_ = fd;
              source_inode_ = st.st_ino;
            }
          }
          return parts.back().to_string();
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) break;  // else a signal ended the poll early: wait on
    }
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("receive from ", endpoint_));
  }
  return absl::DeadlineExceededError(absl::StrCat("no message from ", endpoint_, " within ", timeout.count(), " ms"));
}

absl::StatusOr<std::string> DealerClient::Request(std::string_view bytes, std::chrono::milliseconds timeout) {
  if (absl::Status status = Send(bytes); !status.ok()) return status;
  absl::StatusOr<std::string> reply = Receive(timeout);
  if (absl::IsDeadlineExceeded(reply.status())) {
    CloseSocket();
    if (absl::Status status = OpenSocket(); !status.ok()) return status;
  }
  return reply;
}

void DealerClient::DrainMonitor() {
  if (hold_monitor_ || monitor_ == nullptr) return;
  monitor_->Drain();
}

bool DealerClient::peer_connected() {
  if (monitor_ == nullptr) return false;
  DrainMonitor();
  return monitor_->table().open_count() > 0;
}

int DealerClient::disconnects() {
  if (monitor_ == nullptr) return 0;
  DrainMonitor();
  return static_cast<int>(monitor_->table().closes());
}

bool DealerClient::PeerClosed() {
  if (source_fd_ < 0) return disconnects() > 0;  // no answer yet: no connection to tie the question to
  // The connection of the latest message, named by descriptor and inode: closed by ZeroMQ's I/O thread (descriptor
  // gone, or reused by a later connection: another inode), or hung up by the peer. The monitor is not asked: its
  // DISCONNECTED names a descriptor number, which an earlier connection may have had.
  struct stat st {};
  if (::fstat(source_fd_, &st) != 0 || st.st_ino != source_inode_) return true;
  pollfd p{source_fd_, POLLIN | POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0;
}

bool DealerClient::WaitPeerConnected(bool connected, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (peer_connected() != connected) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || monitor_ == nullptr) return false;
    if (!hold_monitor_) {
      monitor_->Drain(left);  // blocks until an event or the deadline (a signal: earlier)
    } else {
      ::poll(nullptr, 0, static_cast<int>(std::min<int64_t>(left.count(), 10)));
    }
  }
  return true;
}

// ---------------------------------------------------------------- Server

absl::StatusOr<bool> Server::ServeOnce(std::chrono::milliseconds timeout) {
  absl::StatusOr<std::optional<Incoming>> incoming = router_->Poll(timeout);
  if (!incoming.ok()) return incoming.status();
  if (!incoming->has_value()) return false;
  const Incoming& in = **incoming;
  source_connection_ = in.connection;

  std::string reply;
  absl::StatusOr<Message> message = DecodeEnvelope(in.bytes, max_message_bytes_);
  if (!message.ok()) {
    DHS_LOG_LIMITED(spdlog::level::warn, "{}: bad message of {} bytes: {}", router_->endpoint(), in.bytes.size(),
                    message.status().ToString());
    reply = EncodeError(message.status(), PeekSequence(in.bytes), sender_);
  } else {
    auto it = handlers_.find(static_cast<int>(message->type));
    absl::StatusOr<std::string> handled =
        it == handlers_.end()
            ? absl::StatusOr<std::string>(UnknownMessageError(
                  absl::StrCat(sender_, " does not serve ", BodyName(message->type))))
            : it->second(*message, in.peer);
    if (handled.ok()) {
      reply = std::move(*handled);
    } else {
      reply = EncodeError(handled.status(), message->sequence, sender_);
    }
  }
  if (!reply.empty()) {
    if (absl::Status status = router_->Reply(in.peer, reply); !status.ok()) {
      if (on_reply_failure_) {
        on_reply_failure_(in.peer, status);
      } else {
        DHS_LOG_LIMITED(spdlog::level::warn, "{}: reply to '{}' not delivered: {}", router_->endpoint(), in.peer,
                        status.ToString());
      }
    }
  }
  return true;
}

absl::Status Server::Run(const std::function<bool()>& keep_going, std::chrono::milliseconds tick) {
  while (keep_going()) {
    absl::StatusOr<bool> served = ServeOnce(tick);
    if (!served.ok()) return served.status();
  }
  return absl::OkStatus();
}

}  // namespace dhs
