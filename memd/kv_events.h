// memd/kv_events.h: the socket of memd's KV event stream (issue 24; docs/protocol.md "KV event stream"): a ZeroMQ
// XPUB socket bound at ipc://RUN_DIR/kv-events.sock (memd --kv-events on) on which the events the core decided
// (ResidencyManager::DrainKvEvents, memd/kv_block_ledger.h) are published as KvEventBatch messages
// (common/kv_event_stream.h). This class only numbers, encodes and sends; it decides nothing.
//
// Never blocks memd: every send is non-blocking. The socket is an XPUB with ZMQ_XPUB_NODROP and a send high-water mark
// (`send_hwm` messages per subscriber): when any subscriber's queue is full the send fails at once and the batch is
// dropped for every subscriber, counted in dropped() (events), and its sequence numbers are never sent, so every
// consumer sees the same gap (a plain PUB would drop per subscriber, silently: nothing memd could count). A consumer
// that stops reading therefore makes memd drop events, never wait; one that reads again sees the gap and resyncs.
// With no subscriber at all a batch goes nowhere and counts as published (nobody misses it).
//
// Thread-safety: one thread (memd's loop).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "common/kv_event.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace dhs::memd {

class KvEventPublisher {
 public:
  struct Options {
    int send_hwm = 10000;  // batches queued per subscriber before batches are dropped (ZMQ_SNDHWM, >= 1)
    std::string node;      // KvEventBatch.node: the canonical run directory
  };
  // Binds RUN_DIR/kv-events.sock (a leftover file of a dead memd is replaced). The stream id is random. Errors:
  // InvalidArgument (send_hwm < 1), Internal (ZeroMQ: bind failed).
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Bind(const std::string& run_dir, const Options& options);
  ~KvEventPublisher();  // closes the socket (its file is removed)
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Publishes `events` (none: nothing) as one batch with the next sequence numbers, at `now_us` (wall clock, us since
  // the Unix epoch). Never blocks; a batch that cannot be queued is dropped and counted.
  void Publish(std::span<const KvEvent> events, int64_t now_us);
  // Reads the consumers' subscription messages (counted in subscriptions()); call it on every tick.
  void Poll();

  uint64_t stream() const { return stream_; }
  uint64_t next_seq() const { return next_seq_; }        // events numbered so far (published + dropped)
  uint64_t published() const { return published_; }      // events of batches sent
  uint64_t dropped() const { return dropped_; }          // events of batches dropped at the high-water mark
  uint64_t subscriptions() const { return subscriptions_; }  // subscribe messages seen

 private:
  KvEventPublisher(std::unique_ptr<zmq::context_t> context, std::unique_ptr<zmq::socket_t> socket, uint64_t stream,
                   std::string node);
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::string path_;  // the socket file (removed at close: ZeroMQ leaves it)
  uint64_t stream_;
  std::string node_;
  uint64_t next_seq_ = 0;
  uint64_t published_ = 0, dropped_ = 0, subscriptions_ = 0;
};

}  // namespace dhs::memd
