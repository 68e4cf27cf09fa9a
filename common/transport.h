// common/transport.h: the control-message transport on ZeroMQ (cppzmq) over ipc:// sockets in a
// private run directory (brief §3). Bulk KV bytes never travel here (they use the host pool).
//
//   RouterServer  memd side: binds ipc://<run_dir>/<name>.sock, one ROUTER socket; Poll/Reply.
//   DealerClient  worker/CLI side: one DEALER socket; Send/Receive/Request, every receive with a
//                 timeout; peer loss seen through a zmq socket monitor.
//   Server        a dispatch loop over a RouterServer: decode -> ErrorReply on a bad message and
//                 keep serving -> else the handler registered for the body type.
//
// Connections (issue 22): ZeroMQ names a connection by its file descriptor, and the kernel gives a closed descriptor's
// number to the next connection, so a socket monitor's DISCONNECTED read late would be taken for the connection that
// now has that number. Here every connection gets an id that is never reused (ConnectionTable), each received message
// is tied to the connection that delivered it, and a close names the connection it belongs to.
// Signals (issue 22): every ZeroMQ call handles EINTR (memd and workerd take SIGTERM at any moment): a send, receive,
// bind, connect or monitor read is retried; a wait (poll) that a signal interrupts ends early as if it timed out, so
// the caller's loop checks its stop flag. No ZeroMQ error escapes as an exception.
//
// Thread-safety: none of these classes is thread-safe (ZeroMQ sockets are single-thread objects);
// each instance is used by one thread at a time. Each owns its own zmq context, so create them
// after any fork() that runs code without exec.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/protocol.h"
#include "common/types.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace dhs {

class ConnectionMonitor;  // transport.cc: a socket monitor feeding a ConnectionTable

// Which connection each socket-monitor event and each received message belongs to: a pure table (events in, ids out;
// no sockets). Ids are 1, 2, ... in the order the connections were seen, never reused (0 = none). Feed the events in
// the monitor's order: the I/O thread queues a connection's open (CONNECTED / ACCEPTED) before any of its messages is
// readable, and its close (DISCONNECTED) before it closes the descriptor, so before the number can be reused; a
// received message is looked up (Of) after the events queued before it were fed.
class ConnectionTable {
 public:
  using Id = uint64_t;
  // A connection opened on descriptor `fd`; returns its new id. A connection still open on `fd` (its close was never
  // reported) is taken as closed first.
  Id Opened(int fd);
  // The connection on `fd` closed; returns its id (a new id, closed at once, when no open connection on `fd` was
  // seen: e.g. opened before the monitor started).
  Id Closed(int fd);
  // The connection a message received from `fd` (ZMQ_SRCFD) belongs to: the open one on `fd`, else the latest one that
  // was on `fd` (a message read after its connection closed), else a new open one (its open was not seen).
  Id Of(int fd);
  bool IsOpen(Id id) const;
  size_t open_count() const { return open_.size(); }
  uint64_t closes() const { return closes_; }  // Closed calls so far

 private:
  Id next_ = 0;
  uint64_t closes_ = 0;
  std::unordered_map<int, Id> open_;     // fd -> its open connection
  std::unordered_map<int, Id> last_;     // fd -> the latest connection on it (open or closed)
};

// Creates the run directory `path` with mode 0700 (the parent must exist). An existing directory
// is accepted only if it is owned by this user and grants nothing to group/others; otherwise
// FAILED_PRECONDITION (PERMISSION_DENIED for another owner). Errors from mkdir are returned.
absl::Status MakeRunDir(std::string_view path);

// The default run directory of memd and its clients when --run-dir is not given: /tmp/dhs-<uid>.
std::string DefaultRunDir();

// The longest path of a unix socket (sockaddr_un.sun_path: 108 bytes with the NUL): 107.
inline constexpr size_t kMaxSocketPathBytes = 107;

// Checks, before anything is created, that every socket a node creates in `run_dir` fits kMaxSocketPathBytes:
// <run_dir>/memd.sock and <run_dir>/worker-<gpu>.sock, for `gpu` or, when nullopt, the longest GPU number
// (kMaxGpus - 1; memd does not know which workers will come). INVALID_ARGUMENT naming the longest path, its length
// and the limit. memd and workerd call it at start, dhs-replay when it picks a run directory.
absl::Status CheckSocketPaths(std::string_view run_dir, std::optional<GpuId> gpu = std::nullopt);

// Whether this process may connect to <run_dir>/<name>.sock, checked before a ZeroMQ connect (which retries silently
// and never reports a refused permission). NOT_FOUND: no such socket (its server is not running); PERMISSION_DENIED
// (the message starts "permission denied"): the run directory or the socket may not be searched / written by this
// user; FAILED_PRECONDITION: a path component is not a directory, or the path is not a socket; UNAVAILABLE (the
// message starts "nothing listens on"): a stale socket, left by a server that died (a probe connect is refused).
// Never throws.
absl::Status CheckSocketAccess(std::string_view run_dir, std::string_view name);

// ipc endpoint of socket `name` in `run_dir`: "ipc://<run_dir>/<name>.sock".
std::string IpcEndpoint(std::string_view run_dir, std::string_view name);

// One inbound message on a RouterServer.
struct Incoming {
  std::string peer;   // ZeroMQ routing id of the sender (pass back to Reply)
  std::string bytes;  // the message (an Envelope, unverified)
  int source_fd = -1; // the connection's file descriptor (ZMQ_SRCFD); reused by later connections once closed
  uint64_t connection = 0;  // the connection that delivered it (ConnectionTable id): what TakeDisconnected names
};

class RouterServer {
 public:
  struct Options {
    // Hard cap enforced by ZeroMQ (ZMQ_MAXMSGSIZE), bytes: a peer sending more is disconnected.
    // Kept above kMaxMessageBytes so that a message slightly too large still gets an ErrorReply.
    int64_t hard_max_message_bytes = 2 * static_cast<int64_t>(kMaxMessageBytes);
    // ZMTP heartbeats (ZMQ_HEARTBEAT_IVL / ZMQ_HEARTBEAT_TIMEOUT): a PING every `heartbeat_interval`; a connection
    // that answers nothing for `heartbeat_timeout` (its process is dead or stopped) is closed, which the socket
    // monitor reports (TakeDisconnected). 0: off.
    std::chrono::milliseconds heartbeat_interval{0};
    std::chrono::milliseconds heartbeat_timeout{0};
    // ZeroMQ CURVE (issue 22; common/curve_keys.h): the server's secret key, Z85 (40 characters). Set: every
    // connection must complete a CURVE handshake with this server's public key (a client without it, or with another
    // key, is never served: its connection is closed in the handshake); empty: no security mechanism (ipc:// in the
    // 0700 run directory).
    std::string curve_secret_key{};
  };

  // Binds ipc://<run_dir>/<name>.sock. If the socket file exists and a live server accepts on it,
  // ALREADY_EXISTS; a stale file (its server died) is removed and the bind goes on. `name` must be
  // a plain file name; the path must fit a unix socket address (107 bytes) -> INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<RouterServer>> Bind(std::string_view run_dir, std::string_view name,
                                                            Options options);
  static absl::StatusOr<std::unique_ptr<RouterServer>> Bind(std::string_view run_dir, std::string_view name) {
    return Bind(run_dir, name, Options());
  }
  // Issue 22: binds a tcp:// endpoint ("tcp://ADDR:PORT"; PORT "*" picks a free port: endpoint() then names the one
  // bound). No socket file. Use Options::curve_secret_key for anything but a test. Errors: INVALID_ARGUMENT (not
  // tcp://), the bind's (INTERNAL naming the endpoint: address in use, no such interface).
  static absl::StatusOr<std::unique_ptr<RouterServer>> BindTcp(std::string_view endpoint, Options options);
  ~RouterServer();  // closes the socket and removes the socket file (ipc)
  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  const std::string& socket_path() const { return socket_path_; }
  // How long close waits to deliver messages still queued (ZMQ_LINGER; 0 by default: dropped). A process that ends
  // after telling its peers something (a worker stopping) sets it first.
  void SetLinger(std::chrono::milliseconds linger);

  // Waits up to `timeout` for one message; nullopt when none arrived. Malformed multipart
  // frames (not [routing id][payload]) are dropped with a warning.
  absl::StatusOr<std::optional<Incoming>> Poll(std::chrono::milliseconds timeout);

  // Sends `bytes` to `peer` without blocking; UNAVAILABLE when the peer is not connected (ZMQ_ROUTER_MANDATORY),
  // RESOURCE_EXHAUSTED when its queue is full (ZMQ_SNDHWM reached: it does not read; nothing was sent, retry later).
  absl::Status Reply(std::string_view peer, std::string_view bytes);

  // Issue 22: waits up to `timeout` until one of `routers` has a message to Poll; its index, or -1 when none came.
  // Errors: the sockets' (an interrupted wait is -1).
  static absl::StatusOr<int> WaitReadable(const std::vector<RouterServer*>& routers,
                                          std::chrono::milliseconds timeout);

  // The connections (Incoming::connection ids) closed since the last call, oldest first, from the socket monitor
  // (ZMQ_EVENT_DISCONNECTED: the peer closed, died, or missed its ZMTP heartbeats). A close is tied to its own
  // connection: a peer that reconnects (a restarted worker, possibly on the same descriptor number) has a new id, and
  // the old connection's close, however late it is taken, never names it. Never blocks.
  std::vector<uint64_t> TakeDisconnected();

 private:
  RouterServer(std::unique_ptr<zmq::context_t> context, std::unique_ptr<zmq::socket_t> socket,
               std::string endpoint, std::string socket_path);
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::unique_ptr<ConnectionMonitor> monitor_;
  std::string endpoint_;
  std::string socket_path_;
};

class DealerClient {
 public:
  struct Options {
    std::string identity;  // ZeroMQ routing id; empty = chosen by ZeroMQ
    std::chrono::milliseconds reconnect_interval{20};  // ZMQ_RECONNECT_IVL
    // ZMTP heartbeats (ZMQ_HEARTBEAT_IVL; ZMQ_HEARTBEAT_TIMEOUT = 3 intervals): a peer that stops answering (hung,
    // SIGSTOP, a dead host behind tcp://) is disconnected and counted in disconnects(). 0 = off.
    std::chrono::milliseconds heartbeat_interval{0};
    // Issue 22: the CURVE server's public key, Z85 (40 characters; a tcp:// worker's serving-curve.pub). Set: the
    // socket is a CURVE client with a fresh key pair of its own (zmq_curve_keypair) and is served only by the server
    // holding the matching secret key; empty: no security mechanism.
    std::string curve_server_key{};
  };

  // Connects to `endpoint` (e.g. IpcEndpoint(run_dir, "memd")). Connecting succeeds even if no
  // server is up yet; ZeroMQ keeps retrying every reconnect_interval.
  static absl::StatusOr<std::unique_ptr<DealerClient>> Connect(std::string endpoint, Options options);
  static absl::StatusOr<std::unique_ptr<DealerClient>> Connect(std::string endpoint) {
    return Connect(std::move(endpoint), Options());
  }
  ~DealerClient();
  DealerClient(const DealerClient&) = delete;
  DealerClient& operator=(const DealerClient&) = delete;

  // Queues `bytes` for the server without blocking; UNAVAILABLE when it cannot be queued.
  // A message queued while the server is down is delivered after it comes back, or lost if the
  // socket is reset first.
  absl::Status Send(std::string_view bytes);

  // Waits up to `timeout` for the next message; DEADLINE_EXCEEDED when none came (a signal does not end the wait).
  absl::StatusOr<std::string> Receive(std::chrono::milliseconds timeout);

  // Send + Receive. On DEADLINE_EXCEEDED the socket is reset (closed, reopened, reconnected:
  // the "lazy pirate" pattern), so a late reply to the abandoned request is never taken for the
  // reply to a later one; the caller may retry the request.
  absl::StatusOr<std::string> Request(std::string_view bytes, std::chrono::milliseconds timeout);

  // Whether a transport connection to the server is up, from the socket monitor's CONNECTED/DISCONNECTED events seen
  // so far (processes pending events, does not block).
  bool peer_connected();

  // How many transport connections to the server dropped since the socket was opened (the server closed one: it
  // exited or was killed; or missed heartbeats), from the socket monitor (processes pending events, does not block).
  // Counts every connection of the socket, also one that dropped before the server that answers now was reached (a
  // dying server's, before ZeroMQ reconnected to its successor): PeerClosed tells whether the one that answers ended.
  // A Request that timed out reopens the socket and starts the count again.
  int disconnects();

  // Whether the server's connection is known to have ended, tied to the connection (issue 22): once a message was
  // received, true exactly when the connection that delivered the latest message is closed on the peer's side
  // (POLLHUP / POLLRDHUP) or already closed by ZeroMQ's I/O thread (its descriptor gone or now another socket: the
  // connection is named by descriptor and inode, recorded at every receive). An earlier connection's close (a server
  // that died before ZeroMQ reconnected to the one that answers) is not this one's, however late the monitor reports
  // it. Before any message: whether any connection dropped (disconnects() > 0). Needs no monitor event: a process
  // resumed after SIGSTOP sees the close before its I/O thread reported it. Never blocks.
  bool PeerClosed();
  // TEST ONLY: while held, the socket monitor's events are left queued (as in a process whose I/O thread has not run
  // yet, or one that reads them late): disconnects() and peer_connected() do not change.
  void HoldMonitorEventsForTest(bool hold) { hold_monitor_ = hold; }

  // Processes monitor events until peer_connected() == `connected` or `timeout` passed; returns
  // the final state == `connected`.
  bool WaitPeerConnected(bool connected, std::chrono::milliseconds timeout);
  // As RouterServer::SetLinger.
  void SetLinger(std::chrono::milliseconds linger);

  const std::string& endpoint() const { return endpoint_; }

 private:
  DealerClient(std::string endpoint, Options options);
  absl::Status OpenSocket();
  void CloseSocket();
  // Processes the monitor's pending events without blocking (an EINTR ends it early, never throws).
  void DrainMonitor();

  std::string endpoint_;
  Options options_;
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::unique_ptr<ConnectionMonitor> monitor_;
  int socket_generation_ = 0;
  // The connection of the latest received message (ZMQ_SRCFD) and its socket's inode (-1 / 0: none yet).
  int source_fd_ = -1;
  uint64_t source_inode_ = 0;
  bool hold_monitor_ = false;
};

// Dispatch loop over a RouterServer (Plasma-style single event loop).
class Server {
 public:
  // Handles one decoded message from `peer`. Returns the encoded reply (use Encode<Msg>(...,
  // message.sequence, sender())), an empty string for no reply, or an error, which is sent back
  // as an ErrorReply answering message.sequence.
  using Handler = std::function<absl::StatusOr<std::string>(const Message& message, std::string_view peer)>;

  // `router` must outlive the Server; `sender` is this server's identity in replies ("memd").
  Server(RouterServer* router, std::string sender) : router_(router), sender_(std::move(sender)) {}

  // Registers the handler of `type` (replaces an earlier one).
  void On(wire::Body type, Handler handler) { handlers_[static_cast<int>(type)] = std::move(handler); }

  // Called when a reply (a handler's, or an ErrorReply) cannot be queued to `peer` (its queue is full, or it is gone:
  // ROUTER_MANDATORY); `why` is RouterServer::Reply's error. Without one such a reply is logged (rate-limited) and
  // dropped. memd fences the GPU of a worker whose reply is lost, as for an order (docs/protocol.md).
  using ReplyFailureHandler = std::function<void(std::string_view peer, const absl::Status& why)>;
  void OnReplyFailure(ReplyFailureHandler handler) { on_reply_failure_ = std::move(handler); }

  // Sets the largest accepted message, bytes (default kMaxMessageBytes).
  void set_max_message_bytes(size_t max_bytes) { max_message_bytes_ = max_bytes; }

  // Waits up to `timeout` for one message and serves it. A message that fails DecodeEnvelope, or
  // whose type has no handler (UNKNOWN_MESSAGE), or whose handler fails, gets an ErrorReply; the
  // server keeps serving. Returns whether a message was served; errors only from the socket.
  absl::StatusOr<bool> ServeOnce(std::chrono::milliseconds timeout);

  // Serves until `keep_going()` returns false (checked after every ServeOnce of at most `tick`).
  absl::Status Run(const std::function<bool()>& keep_going, std::chrono::milliseconds tick);

  const std::string& sender() const { return sender_; }
  // The connection (Incoming::connection) of the message being handled, or of the last one served.
  uint64_t source_connection() const { return source_connection_; }

 private:
  RouterServer* router_;
  std::string sender_;
  size_t max_message_bytes_ = kMaxMessageBytes;
  uint64_t source_connection_ = 0;
  std::unordered_map<int, Handler> handlers_;
  ReplyFailureHandler on_reply_failure_;
};

}  // namespace dhs
