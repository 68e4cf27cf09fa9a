#include "common/kv_event_stream.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "kv_events_generated.h"
#include "zmq.hpp"

namespace dhs {

std::string EncodeKvEventBatch(const KvEventBatch& batch) {
  wire::kv::KvEventBatchT t;
  t.version = kKvEventsVersion;
  t.stream = batch.stream;
  t.time_us = batch.time_us;
  t.node = batch.node;
  for (size_t i = 0; i < batch.events.size(); ++i) {
    const KvEvent& e = batch.events[i];
    auto w = std::make_unique<wire::kv::KvEventT>();
    w->seq = batch.first_seq + i;
    w->kind = static_cast<wire::kv::KvEventKind>(e.kind);
    w->medium = static_cast<wire::kv::KvMedium>(e.medium);
    w->tenant = e.tenant;
    w->block_hash = e.block_hash;
    w->parent_hash = e.parent_hash;
    w->blocks = e.blocks;
    w->block_tokens = e.block_tokens;
    w->pages = e.pages;
    w->page_rows = e.page_rows;
    t.events.push_back(std::move(w));
  }
  flatbuffers::FlatBufferBuilder fbb;
  wire::kv::FinishKvEventBatchBuffer(fbb, wire::kv::KvEventBatch::Pack(fbb, &t));
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

absl::StatusOr<KvEventBatch> DecodeKvEventBatch(std::string_view bytes) {
  if (bytes.empty() || bytes.size() > kMaxKvEventBatchBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("KV event batch of %d bytes (1 .. %d)", bytes.size(),
                                                      kMaxKvEventBatchBytes));
  }
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  flatbuffers::Verifier verifier(data, bytes.size());
  if (!wire::kv::KvEventBatchBufferHasIdentifier(data) || !wire::kv::VerifyKvEventBatchBuffer(verifier)) {
    return absl::InvalidArgumentError("not a KV event batch (identifier DHKV or FlatBuffers verification failed)");
  }
  const wire::kv::KvEventBatch* w = wire::kv::GetKvEventBatch(data);
  if (w->version() != kKvEventsVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("KV event stream version %d; this build reads %d", w->version(), kKvEventsVersion));
  }
  if (w->events() == nullptr || w->events()->size() == 0) return absl::InvalidArgumentError("KV event batch: no events");
  KvEventBatch b;
  b.stream = w->stream();
  b.time_us = w->time_us();
  b.node = w->node() ? w->node()->str() : "";
  b.first_seq = w->events()->Get(0)->seq();
  for (flatbuffers::uoffset_t i = 0; i < w->events()->size(); ++i) {
    const wire::kv::KvEvent* e = w->events()->Get(i);
    if (e->seq() != b.first_seq + i) {
      return absl::InvalidArgumentError(absl::StrFormat("KV event batch: event %d has seq %d, not %d", i, e->seq(),
                                                        b.first_seq + i));
    }
    if (static_cast<uint8_t>(e->kind()) > static_cast<uint8_t>(wire::kv::KvEventKind::MAX) ||
        static_cast<uint8_t>(e->medium()) > static_cast<uint8_t>(wire::kv::KvMedium::MAX)) {
      return absl::InvalidArgumentError(absl::StrFormat("KV event %d: unknown kind %d or medium %d", e->seq(),
                                                        static_cast<int>(e->kind()), static_cast<int>(e->medium())));
    }
    b.events.push_back(KvEvent{static_cast<KvEventKind>(e->kind()), static_cast<KvMedium>(e->medium()), e->tenant(),
                               e->block_hash(), e->parent_hash(), e->blocks(), e->block_tokens(), e->pages(),
                               e->page_rows()});
  }
  return b;
}

KvSequenceStep KvSequenceCheck::Next(const KvEventBatch& batch) {
  KvSequenceStep step;
  if (!stream_ || *stream_ != batch.stream) {
    step.new_stream = true;
    stream_ = batch.stream;
    // Numbers before first_seq were published before this consumer joined (or memd restarted): not a loss.
  } else if (batch.first_seq > next_seq_) {
    step.lost = batch.first_seq - next_seq_;
  }
  lost_ += step.lost;
  next_seq_ = batch.first_seq + batch.events.size();
  return step;
}

std::string KvEventLine(uint64_t seq, const KvEvent& e) {
  if (e.kind == KvEventKind::kAllBlocksCleared) {
    return absl::StrFormat("seq=%d %s %s", seq, KvEventKindName(e.kind), KvMediumName(e.medium));
  }
  return absl::StrFormat("seq=%d %s %s tenant=%016x block=%016x parent=%016x blocks=%d tokens=%d pages=%d rows=%d", seq,
                         KvEventKindName(e.kind), KvMediumName(e.medium), e.tenant, e.block_hash, e.parent_hash,
                         e.blocks, e.block_tokens, e.pages, e.page_rows);
}

KvEventSubscriber::KvEventSubscriber(std::unique_ptr<zmq::context_t> context, std::unique_ptr<zmq::socket_t> socket)
    : context_(std::move(context)), socket_(std::move(socket)) {}

KvEventSubscriber::~KvEventSubscriber() = default;

absl::StatusOr<std::unique_ptr<KvEventSubscriber>> KvEventSubscriber::Connect(const std::string& endpoint,
                                                                             Options options) {
  try {
    auto context = std::make_unique<zmq::context_t>(1);
    auto socket = std::make_unique<zmq::socket_t>(*context, zmq::socket_type::sub);
    socket->set(zmq::sockopt::linger, 0);
    if (options.receive_hwm > 0) socket->set(zmq::sockopt::rcvhwm, options.receive_hwm);
    if (options.receive_buffer > 0) socket->set(zmq::sockopt::rcvbuf, options.receive_buffer);
    socket->set(zmq::sockopt::subscribe, std::string(kKvEventsTopic));
    socket->connect(endpoint);
    return std::unique_ptr<KvEventSubscriber>(new KvEventSubscriber(std::move(context), std::move(socket)));
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrFormat("KV event subscriber on %s: %s", endpoint, e.what()));
  }
}

absl::StatusOr<std::optional<KvEventBatch>> KvEventSubscriber::Next(std::chrono::milliseconds timeout) {
  try {
    zmq::pollitem_t item{socket_->handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::optional<KvEventBatch>();
    zmq::message_t topic, body;
    if (!socket_->recv(topic, zmq::recv_flags::dontwait)) return std::optional<KvEventBatch>();
    if (!topic.more()) return absl::InvalidArgumentError("KV event message of one frame (topic without a batch)");
    (void)socket_->recv(body);  // the rest of a multipart message is there once its first frame is
    if (body.more()) {          // extra frames: not this stream's shape (read them all, then refuse the message)
      zmq::message_t extra;
      do {
        (void)socket_->recv(extra);
      } while (extra.more());
      return absl::InvalidArgumentError("KV event message of more than two frames");
    }
    auto batch = DecodeKvEventBatch(body.to_string_view());
    if (!batch.ok()) return batch.status();
    return std::optional<KvEventBatch>(std::move(*batch));
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrFormat("KV event subscriber: %s", e.what()));
  }
}

}  // namespace dhs
