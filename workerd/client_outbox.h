// workerd/client_outbox.h: the worker's send-side back-pressure towards its clients (issue 12, "Back-pressure instead
// of silent loss"): the replies the serving socket could not take yet, per client, bounded per client and in total.
//
// Events in, decisions out, as memd's ResidencyManager: ServingFrontend (the thin socket part) pushes every reply here
// (Push: the verdict says whether it is queued or refused), sends what Front() names and reports the socket's answer
// (Sent: taken; a full socket queue: nothing, try again later; PeerGone: the client is not connected). No sockets,
// no clocks.
//
// Each reply has a kind (ReplyKind) that decides what a full buffer does to it:
//   kStream  a TokenChunk that is not its request's last. Queued while the client's queued bytes (every kind) stay
//            within per_client_bytes and all clients' within total_bytes; else refused: the caller fails that
//            request (RESOURCE_EXHAUSTED, its pages return through the normal Complete path) and sends its final chunk.
//   kEnd     one per request and end: SubmitAccepted, the final TokenChunk (finished, or with the error). Always
//            queued, so a request's end is never lost. Bounded all the same: a client that is Full has its submits
//            refused, so the kEnd replies beyond the limit are those of its requests accepted before (at most the
//            slots + the submit queue).
//   kReply   an answer not tied to a request (ErrorReply, WorkerStatsReply). Queued within the limits as kStream;
//            else refused: the caller drops it and counts it (replies_dropped), as a client that sends without
//            reading (a flood) must not make the worker buffer without bound.
// A client whose connection is gone (PeerGone) loses what was queued for it (counted in dropped_for_gone); its id is
// reported once by TakeGonePeers so that its requests end (their pages return).
//
// Invariants (CheckInvariants): total bytes = sum of the clients' queued bytes; each client's kStream + kReply bytes
// <= per_client_bytes; all clients' kStream + kReply bytes <= total_bytes (only kEnd replies go beyond the limits);
// a client with nothing queued has no entry.
//
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace dhs {

struct ClientOutboxLimits {
  uint64_t per_client_bytes = uint64_t{16} << 20;  // kStream + kReply bytes queued for one client, bytes
  uint64_t total_bytes = uint64_t{256} << 20;      // kStream + kReply bytes queued for all clients, bytes
};

enum class ReplyKind { kStream, kEnd, kReply };

enum class PushVerdict { kQueued, kRefused };

// Counters since start (WorkerStatsReply).
struct ClientOutboxStats {
  uint64_t queued_bytes = 0;       // gauge: bytes queued now (every kind), bytes
  uint64_t peak_queued_bytes = 0;  // the largest queued_bytes seen, bytes
  uint64_t streams_refused = 0;    // kStream replies refused (each failed its request)
  uint64_t replies_dropped = 0;    // kReply replies refused
  uint64_t dropped_for_gone = 0;   // replies queued for a client whose connection was gone
};

class ClientOutbox {
 public:
  explicit ClientOutbox(ClientOutboxLimits limits) : limits_(limits) {}

  // A reply of `kind` for `peer` (the client's routing id), in the order the client must receive it. kQueued: it is
  // the last in `peer`'s queue; kRefused: nothing changed (see the header comment for what the caller does).
  PushVerdict Push(const std::string& peer, std::string bytes, ReplyKind kind);
  // The reply to send next to `peer`, or nullptr when nothing is queued for it. Valid until the next event.
  const std::string* Front(const std::string& peer) const;
  // The socket took Front(peer): it leaves the queue.
  void Sent(const std::string& peer);
  // `peer` is not connected: everything queued for it is dropped (counted); TakeGonePeers reports it once.
  void PeerGone(const std::string& peer);
  // The clients with something queued (whom the caller should try to send to), in routing-id order.
  std::vector<std::string> Backlogged() const;
  // Whether a kStream of `bytes` for `peer` would be refused now: its queued bytes (every kind) + `bytes` exceed
  // per_client_bytes, or all clients' exceed total_bytes. A Full client's submits are refused (it does not read).
  bool Full(const std::string& peer, uint64_t bytes = 1) const;
  // The clients found gone since the last call (each once per PeerGone).
  std::vector<std::string> TakeGonePeers();

  uint64_t queued_bytes(const std::string& peer) const;
  const ClientOutboxStats& stats() const { return stats_; }
  const ClientOutboxLimits& limits() const { return limits_; }
  // INTERNAL naming the first broken invariant (header comment).
  absl::Status CheckInvariants() const;

 private:
  struct Queued {
    std::string bytes;
    ReplyKind kind;
  };
  struct Client {
    std::deque<Queued> queue;
    uint64_t bytes = 0;          // every kind
    uint64_t limited_bytes = 0;  // kStream + kReply
  };
  void Remove(std::map<std::string, Client>::iterator it, const Queued& q);

  ClientOutboxLimits limits_;
  std::map<std::string, Client> clients_;  // only clients with something queued
  uint64_t limited_bytes_ = 0;             // kStream + kReply of every client
  std::vector<std::string> gone_;
  ClientOutboxStats stats_;
};

}  // namespace dhs
