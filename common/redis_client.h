// common/redis_client.h: a Redis client for one server or a Redis Cluster (issue 26, the cluster tier's store),
// over hiredis (libhiredis-dev), following the Redis Cluster specification's client rules:
//
// - Slot map: at first use (and whenever a redirection or a failure says it is stale) the client asks a known node
//   CLUSTER SLOTS (the seeds first, then every node of the last map) and maps each of the 16384 slots to its master.
//   A server without cluster support (the error "This instance has cluster support disabled") is one server: every
//   slot maps to it.
// - Batches: Get and Set take many keys; each key is routed by its slot (common/redis_slot.h) to its master, the
//   commands of one master are pipelined on one connection, and all masters are written before any is read, so the
//   masters work in parallel. One poll(2) loop drives every connection (non-blocking sockets).
// - MOVED slot host:port: the slot moved for good; the client records the new master, refreshes the whole map before
//   the next round and resends the command there. ASK slot host:port: the slot is being migrated and this key may be
//   on the target already; the client sends ASKING then the command to the target, for this command only, without
//   changing the map. TRYAGAIN / CLUSTERDOWN: resent after a map refresh. At most `max_redirects` resends per key.
// - Deadline: every batch has one (connect, write, read included). Keys not answered by then get DeadlineExceeded
//   and the connections that did not answer are closed (their pipeline state is unknown): a SIGSTOPped server costs
//   one deadline per batch, never a hang.
// - Failures: a connection that fails (refused, reset, closed by a restarted server) is closed, the map is refreshed
//   from the other known nodes (the seeds and every node of the last map, so a dead seed is survived), and its keys
//   are resent while the deadline allows; a replica promoted after its master died is found by that refresh.
//
// Errors are absl::Status per key: OK with a value (hit), OK without one (the key does not exist: a miss),
// DeadlineExceeded (the batch's deadline passed first), Unavailable (no node reachable, connection failures,
// CLUSTERDOWN), Internal (an unexpected reply, or the server's error message, e.g. OOM).
//
// Thread-safety: none. One owner thread calls every method (memd's cluster-tier thread); a second client is
// independent. SIGPIPE is blocked in the calling thread while a batch writes, and a SIGPIPE raised by a broken
// connection is consumed, so a dead server never kills the process.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dhs::redis {

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;  // "host:port"
  bool operator==(const Endpoint&) const = default;
  auto operator<=>(const Endpoint&) const = default;
};

// "redis://HOST:PORT", "HOST:PORT", or several of them separated by commas or spaces (cluster seeds).
// Errors: InvalidArgument (empty, an empty seed between commas, no port, port out of 1..65535, another scheme,
// credentials "user:pw@" (no AUTH is sent), brackets "[::1]:6379" (an IPv6 address is written without them:
// "::1:6379", the port after the last colon)).
absl::StatusOr<std::vector<Endpoint>> ParseSeeds(std::string_view spec);

// A redirection of Redis Cluster: "MOVED <slot> <host>:<port>" (the slot moved for good) or "ASK <slot> <host>:<port>"
// (this one command goes to the target, after ASKING). An empty host is the host of the node that answered (`from`).
struct Redirection {
  bool ask = false;
  uint32_t slot = 0;
  Endpoint target;
};
// nullopt for any other error and for a malformed redirection.
std::optional<Redirection> ParseRedirection(std::string_view error, const Endpoint& from);

struct ClientConfig {
  std::vector<Endpoint> seeds;  // at least one
  int max_redirects = 5;        // resends of one key per batch (MOVED, ASK, TRYAGAIN, a failed connection)
  // The longest one CLUSTER SLOTS attempt may take inside a batch's deadline, so that one stopped node does not
  // use up a whole refresh.
  std::chrono::milliseconds refresh_attempt_timeout{200};
};

struct GetResult {
  absl::Status status;               // see the header comment
  std::optional<std::string> value;  // set when status is OK and the key exists
  bool hit() const { return status.ok() && value.has_value(); }
};

struct SetItem {
  std::string_view key;
  std::string_view value;
  uint32_t ttl_ms = 0;  // SET ... PX ttl_ms; 0 = no expiry
};

struct ClientCounters {
  uint64_t get_keys = 0, get_hits = 0, get_misses = 0, get_errors = 0;  // errors: not OK (timeouts included)
  uint64_t set_keys = 0, set_ok = 0, set_errors = 0;
  uint64_t timeouts = 0;          // keys that got DeadlineExceeded
  uint64_t moved = 0, ask = 0;    // redirections followed
  uint64_t map_refreshes = 0;     // CLUSTER SLOTS answered
  uint64_t connects = 0, connect_failures = 0, connection_errors = 0;
  uint64_t bytes_read = 0;        // values returned by GET hits, bytes
  uint64_t bytes_written = 0;     // values of SETs the server confirmed, bytes
};

class Client {
 public:
  using Clock = std::chrono::steady_clock;

  // Errors: InvalidArgument (no seeds, max_redirects < 0). Connects lazily (on the first batch).
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientConfig config);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // GET of every key within `timeout`; one result per key, in order.
  std::vector<GetResult> Get(std::span<const std::string> keys, std::chrono::milliseconds timeout);
  // SET key value [PX ttl] of every item within `timeout`; one status per item, in order (OK: the server confirmed).
  std::vector<absl::Status> Set(std::span<const SetItem> items, std::chrono::milliseconds timeout);
  // PING to the master of slot 0 (any answer but an error is OK). Errors as a key's.
  absl::Status Ping(std::chrono::milliseconds timeout);
  // WAIT replicas timeout_ms on the connection to the master of `key`'s slot (the one this client's SETs of that key
  // used): the number of replicas that acknowledged every earlier write of that connection. Errors as a key's.
  absl::StatusOr<int64_t> WaitReplicas(std::string_view key, int replicas, std::chrono::milliseconds timeout);
  // Asks CLUSTER SLOTS again now. Errors: Unavailable (no known node answered), DeadlineExceeded.
  absl::Status RefreshMap(std::chrono::milliseconds timeout);

  bool has_map() const { return has_map_; }
  bool cluster_mode() const { return cluster_mode_; }  // false: one server (meaningful once has_map())
  // The master of `slot` in the current map (nullopt: no map yet).
  std::optional<Endpoint> MasterOf(uint32_t slot) const;
  // Every node the last map named (masters and replicas), ascending.
  std::vector<Endpoint> KnownNodes() const;
  const ClientCounters& counters() const { return counters_; }

  struct Conn;     // one connection (internal)
  struct Op;       // one command of a batch (internal)
  struct Pending;  // the commands of one round on one connection (internal)

 private:
  explicit Client(ClientConfig config);
  // Sends every op to its target and reads the replies until each op has one, failed, or `deadline` passed.
  void RunRound(std::vector<Op*>& ops, Clock::time_point deadline);
  // RunRound's parts: group the ops per target node and append them to its connection; handle one connection's poll
  // events (connect, write, read); move the reader's complete replies to their ops; fail what a connection still
  // owes (and close it).
  void Dispatch(std::vector<Op*>& ops, std::map<Endpoint, Pending>& pending);
  void Service(Pending& p, short revents);
  bool TakeReplies(Pending& p);
  void FailRest(Pending& p, const absl::Status& why);
  // One reply (or failure) of a round: final (op.done), or resent next round (a redirection, a failed connection);
  // sets *refresh when the map must be asked again.
  void Settle(Op& op, bool* refresh);
  // Runs `ops` (each routed by slot, or to its ASK target) with redirections and resends until done or `deadline`.
  void Execute(std::vector<Op>& ops, Clock::time_point deadline);
  absl::Status Refresh(Clock::time_point deadline);
  Conn* Connection(const Endpoint& endpoint);
  void Close(const Endpoint& endpoint);

  ClientConfig config_;
  bool has_map_ = false;
  bool cluster_mode_ = false;
  std::vector<Endpoint> nodes_;              // masters and replicas of the last map
  std::vector<Endpoint> masters_;            // index = the value in slots_
  std::array<uint16_t, 16384> slots_{};      // slot -> index in masters_ (kNoMaster: uncovered)
  std::map<Endpoint, std::unique_ptr<Conn>> conns_;
  ClientCounters counters_;
};

}  // namespace dhs::redis
