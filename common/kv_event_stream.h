// common/kv_event_stream.h: the wire form of memd's KV event stream (issue 24; schemas/kv_events.fbs; docs/protocol.md
// "KV event stream") and its consumer side: the one encoder/decoder pair of a batch, the sequence check a consumer
// runs (gaps, a new stream), and a SUB socket on RUN_DIR/kv-events.sock (dhsctl events, tests). The publisher is
// memd's (memd/kv_events.h).
//
// One stream message = two ZeroMQ frames: the topic kKvEventsTopic and one KvEventBatch. Every event has a sequence
// number, contiguous from 0 within a stream (one stream per memd start, named by a random 64-bit id); a batch holds
// consecutive numbers. A batch memd could not queue (a subscriber at the high-water mark) is dropped whole and its
// numbers are never sent: a consumer sees the gap.
//
// Thread-safety: the functions and KvSequenceCheck are pure; a KvEventSubscriber is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv_event.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace dhs {

// KvEventBatch.version of this build (schemas/kv_events.fbs): bump only for a change old consumers cannot read.
inline constexpr uint32_t kKvEventsVersion = 1;
// The socket's name in the run directory (IpcEndpoint(run_dir, kKvEventsSocket): ipc://RUN_DIR/kv-events.sock).
inline constexpr std::string_view kKvEventsSocket = "kv-events";
// The topic frame of every stream message (a consumer subscribes to it, or to "").
inline constexpr std::string_view kKvEventsTopic = "kv";
// Largest batch accepted by DecodeKvEventBatch, bytes.
inline constexpr size_t kMaxKvEventBatchBytes = size_t{16} << 20;

struct KvEventBatch {
  uint64_t stream = 0;        // random per memd start
  int64_t time_us = 0;        // publisher's wall clock, microseconds since the Unix epoch
  std::string node;           // the publisher's canonical run directory
  uint64_t first_seq = 0;     // sequence number of events[0]; events[i] has first_seq + i
  std::vector<KvEvent> events;
};

std::string EncodeKvEventBatch(const KvEventBatch& batch);
// Checks, in order: size (empty or above kMaxKvEventBatchBytes), the file identifier "DHKV" and the FlatBuffers
// Verifier, the version (kKvEventsVersion), no events, sequence numbers not contiguous, an unknown kind or medium.
// Errors: InvalidArgument naming the check (a version mismatch: FailedPrecondition).
absl::StatusOr<KvEventBatch> DecodeKvEventBatch(std::string_view bytes);

// What a consumer learns from the next batch's numbers (docs/protocol.md "Sequence numbers and gaps").
struct KvSequenceStep {
  bool new_stream = false;  // first batch seen, or another stream id (memd restarted): forget this node's blocks and
                            // start from this batch (it may begin at any number: the consumer joined late)
  uint64_t lost = 0;        // events lost before this batch: numbers skipped within the same stream
};
class KvSequenceCheck {
 public:
  KvSequenceStep Next(const KvEventBatch& batch);
  uint64_t lost() const { return lost_; }  // events lost in total
 private:
  std::optional<uint64_t> stream_;
  uint64_t next_seq_ = 0;
  uint64_t lost_ = 0;
};

// One event as a line of text: "seq=12 stored host tenant=... block=... parent=... blocks=2 tokens=32 pages=2 rows=16".
std::string KvEventLine(uint64_t seq, const KvEvent& e);

// A consumer: a SUB socket connected to RUN_DIR/kv-events.sock, subscribed to kKvEventsTopic. Connecting succeeds
// while memd is not up (ZeroMQ retries); events published before the subscription reached memd are not seen.
class KvEventSubscriber {
 public:
  struct Options {
    int receive_hwm = 0;     // ZMQ_RCVHWM, messages (0: libzmq's default, 1000)
    int receive_buffer = 0;  // ZMQ_RCVBUF, bytes (0: the OS default); tests make a slow consumer with a small one
  };
  // `endpoint`: IpcEndpoint(run_dir, kKvEventsSocket). Errors: Internal (ZeroMQ).
  static absl::StatusOr<std::unique_ptr<KvEventSubscriber>> Connect(const std::string& endpoint, Options options);
  ~KvEventSubscriber();
  KvEventSubscriber(const KvEventSubscriber&) = delete;
  KvEventSubscriber& operator=(const KvEventSubscriber&) = delete;
  // The next batch, or nullopt after `timeout`. Errors: a message that does not decode (DecodeKvEventBatch's; the
  // subscriber stays usable), Internal (ZeroMQ).
  absl::StatusOr<std::optional<KvEventBatch>> Next(std::chrono::milliseconds timeout);

 private:
  KvEventSubscriber(std::unique_ptr<zmq::context_t> context, std::unique_ptr<zmq::socket_t> socket);
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<zmq::socket_t> socket_;
};

}  // namespace dhs
