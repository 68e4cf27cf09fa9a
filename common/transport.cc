#include "common/transport.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
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

// Whether a server accepts connections on the unix socket at `path` right now.
bool SocketHasListener(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const bool live = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return live;
}

}  // namespace

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
  return absl::OkStatus();
}

std::string IpcEndpoint(std::string_view run_dir, std::string_view name) {
  return absl::StrCat("ipc://", std::string(run_dir), "/", std::string(name), ".sock");
}

// ---------------------------------------------------------------- RouterServer

class RouterServer::Monitor : public zmq::monitor_t {
 public:
  std::vector<int> Take() {
    while (check_event(0)) {
    }
    return std::exchange(closed_, {});
  }

 private:
  void on_event_disconnected(const zmq_event_t& event, const char*) override { closed_.push_back(event.value); }
  std::vector<int> closed_;
};

RouterServer::RouterServer(std::unique_ptr<zmq::context_t> context, std::unique_ptr<zmq::socket_t> socket,
                           std::string endpoint, std::string socket_path)
    : context_(std::move(context)),
      socket_(std::move(socket)),
      monitor_(std::make_unique<Monitor>()),
      endpoint_(std::move(endpoint)),
      socket_path_(std::move(socket_path)) {
  monitor_->init(*socket_, absl::StrCat("inproc://dhs-router-monitor-", reinterpret_cast<uintptr_t>(this)),
                 ZMQ_EVENT_DISCONNECTED);
}

std::vector<int> RouterServer::TakeDisconnected() { return monitor_->Take(); }

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
    socket->bind(endpoint);
    return std::unique_ptr<RouterServer>(new RouterServer(std::move(context), std::move(socket), endpoint, path));
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("bind ", endpoint));
  }
}

void RouterServer::SetLinger(std::chrono::milliseconds linger) {
  socket_->set(zmq::sockopt::linger, static_cast<int>(linger.count()));
}

RouterServer::~RouterServer() {
  monitor_.reset();  // stops monitoring before the socket closes
  socket_->close();
  context_->close();
  ::unlink(socket_path_.c_str());
}

absl::StatusOr<std::optional<Incoming>> RouterServer::Poll(std::chrono::milliseconds timeout) {
  try {
    zmq::pollitem_t item{socket_->handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::optional<Incoming>();
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(*socket_, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
      return std::optional<Incoming>();
    }
    if (parts.size() != 2) {
      DHS_LOG_LIMITED(spdlog::level::warn, "{}: dropping a message of {} frames (expected routing id + payload)",
                      endpoint_, parts.size());
      return std::optional<Incoming>();
    }
    return std::optional<Incoming>(Incoming{parts[0].to_string(), parts[1].to_string(), zmq_msg_get(parts[1].handle(), ZMQ_SRCFD)});
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return std::optional<Incoming>();
    return ZmqStatus(e, absl::StrCat("receive on ", endpoint_));
  }
}

absl::Status RouterServer::Reply(std::string_view peer, std::string_view bytes) {
  try {
    if (!socket_->send(zmq::buffer(peer.data(), peer.size()), zmq::send_flags::sndmore | zmq::send_flags::dontwait) ||
        !socket_->send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::dontwait)) {
      return absl::ResourceExhaustedError(absl::StrCat("reply queue of peer full on ", endpoint_));
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("reply on ", endpoint_));
  }
}

// ---------------------------------------------------------------- DealerClient

class DealerClient::Monitor : public zmq::monitor_t {
 public:
  bool connected() const { return connected_; }
  int disconnects() const { return disconnects_; }

 private:
  void on_event_connected(const zmq_event_t&, const char*) override { connected_ = true; }
  void on_event_disconnected(const zmq_event_t&, const char*) override {
    connected_ = false;
    ++disconnects_;
  }
  bool connected_ = false;
  int disconnects_ = 0;
};

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
    if (const int ivl = static_cast<int>(options_.heartbeat_interval.count()); ivl > 0) {
      socket_->set(zmq::sockopt::heartbeat_ivl, ivl);
      socket_->set(zmq::sockopt::heartbeat_timeout, 3 * ivl);
    }
    monitor_ = std::make_unique<Monitor>();
    monitor_->init(*socket_,
                   absl::StrCat("inproc://dhs-monitor-", reinterpret_cast<uintptr_t>(this), "-", ++socket_generation_),
                   ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED);
    socket_->connect(endpoint_);
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
    if (!socket_->send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::dontwait)) {
      return absl::UnavailableError(absl::StrCat("cannot queue a message to ", endpoint_));
    }
    return absl::OkStatus();
  } catch (const zmq::error_t& e) {
    return ZmqStatus(e, absl::StrCat("send to ", endpoint_));
  }
}

absl::StatusOr<std::string> DealerClient::Receive(std::chrono::milliseconds timeout) {
  if (socket_ == nullptr) return absl::UnavailableError("client socket is closed");
  try {
    zmq::pollitem_t item{socket_->handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) > 0) {
      std::vector<zmq::message_t> parts;
      if (zmq::recv_multipart(*socket_, std::back_inserter(parts), zmq::recv_flags::dontwait) && !parts.empty()) {
        if (const int fd = zmq_msg_get(parts.back().handle(), ZMQ_SRCFD); fd >= 0 && fd != source_fd_) {
          struct stat st {};
          if (::fstat(fd, &st) == 0) {
            source_fd_ = fd;
            source_inode_ = st.st_ino;
          }
        }
        return parts.back().to_string();
      }
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) return ZmqStatus(e, absl::StrCat("receive from ", endpoint_));
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
  if (hold_monitor_) return;
  try {
    while (monitor_->check_event(0)) {
    }
  } catch (const zmq::error_t& e) {
    // A signal (EINTR) interrupted the poll: the events left are processed by the next call.
    if (e.num() != EINTR) spdlog::warn("socket monitor of {}: {}", endpoint_, e.what());
  }
}

bool DealerClient::peer_connected() {
  if (monitor_ == nullptr) return false;
  DrainMonitor();
  return monitor_->connected();
}

int DealerClient::disconnects() {
  if (monitor_ == nullptr) return 0;
  DrainMonitor();
  return monitor_->disconnects();
}

bool DealerClient::PeerClosed() {
  if (disconnects() > 0) return true;
  if (source_fd_ < 0) return false;
  // The I/O thread emits DISCONNECTED before it closes the descriptor: a descriptor found closed or reused means the
  // event is queued; one whose peer hung up is a connection the I/O thread has not processed yet.
  struct stat st {};
  if (::fstat(source_fd_, &st) != 0 || st.st_ino != source_inode_) return true;
  pollfd p{source_fd_, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) != 0) return true;
  return disconnects() > 0;  // closed (and reused) between the two checks: the event is queued by now
}

bool DealerClient::WaitPeerConnected(bool connected, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (peer_connected() != connected) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || monitor_ == nullptr) return false;
    monitor_->check_event(static_cast<int>(left.count()));  // blocks until an event or the deadline
  }
  return true;
}

// ---------------------------------------------------------------- Server

absl::StatusOr<bool> Server::ServeOnce(std::chrono::milliseconds timeout) {
  absl::StatusOr<std::optional<Incoming>> incoming = router_->Poll(timeout);
  if (!incoming.ok()) return incoming.status();
  if (!incoming->has_value()) return false;
  const Incoming& in = **incoming;
  source_fd_ = in.source_fd;

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
