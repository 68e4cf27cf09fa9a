#include "common/protocol.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "flatbuffers/flatbuffers.h"

namespace dhs {
namespace {

// Packs `body` (an object-API table of type T) into a finished envelope.
template <typename T>
std::string EncodeBody(const T& body, uint32_t version, uint64_t seq, std::string_view sender) {
  using Table = typename T::TableType;
  flatbuffers::FlatBufferBuilder fbb(256);
  const auto sender_offset = fbb.CreateString(sender.data(), sender.size());
  const auto body_offset = Table::Pack(fbb, &body);
  wire::EnvelopeBuilder envelope(fbb);
  envelope.add_protocol_version(version);
  envelope.add_sequence(seq);
  envelope.add_sender(sender_offset);
  envelope.add_body_type(wire::BodyTraits<Table>::enum_value);
  envelope.add_body(body_offset.Union());
  fbb.Finish(envelope.Finish());
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

template <typename T>
absl::StatusOr<T> ReadBody(const Message& message) {
  using Table = typename T::TableType;
  constexpr wire::Body kType = wire::BodyTraits<Table>::enum_value;
  if (message.envelope == nullptr) return absl::FailedPreconditionError("message was not decoded");
  if (message.type != kType) {
    return absl::FailedPreconditionError(
        absl::StrCat("expected ", BodyName(kType), ", message holds ", BodyName(message.type)));
  }
  const Table* table = static_cast<const Table*>(message.envelope->body());
  if (table == nullptr) return InvalidMessageError("envelope body missing");
  T out;
  table->UnPackTo(&out);
  return out;
}

}  // namespace

absl::StatusOr<Message> DecodeEnvelope(std::span<const uint8_t> bytes, size_t max_bytes) {
  if (bytes.empty()) return InvalidMessageError("empty message");
  if (bytes.size() > max_bytes) {
    return InvalidMessageError(absl::StrCat("message of ", bytes.size(), " bytes exceeds the maximum of ", max_bytes));
  }
  flatbuffers::Verifier verifier(bytes.data(), bytes.size());
  if (!wire::VerifyEnvelopeBuffer(verifier)) {
    return InvalidMessageError(absl::StrCat("message of ", bytes.size(), " bytes failed verification"));
  }
  const wire::Envelope* envelope = wire::GetEnvelope(bytes.data());
  if (envelope->protocol_version() != kProtocolVersion) {
    return VersionMismatchError(absl::StrCat("protocol version ", envelope->protocol_version(),
                                             ", this peer speaks ", kProtocolVersion));
  }
  const wire::Body type = envelope->body_type();
  if (type == wire::Body::NONE || envelope->body() == nullptr) {
    return InvalidMessageError("envelope without a body");
  }
  if (static_cast<uint32_t>(type) > static_cast<uint32_t>(wire::Body::MAX)) {
    return UnknownMessageError(absl::StrCat("unknown body type ", static_cast<int>(type)));
  }
  Message message;
  message.type = type;
  message.sequence = envelope->sequence();
  message.sender = envelope->sender() != nullptr ? envelope->sender()->str() : std::string();
  message.envelope = envelope;
  return message;
}

absl::StatusOr<Message> DecodeEnvelope(std::string_view bytes, size_t max_bytes) {
  return DecodeEnvelope(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
                        max_bytes);
}

uint64_t PeekSequence(std::string_view bytes) {
  if (bytes.empty()) return 0;
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (!wire::VerifyEnvelopeBuffer(verifier)) return 0;
  return wire::GetEnvelope(bytes.data())->sequence();
}

std::string BodyName(wire::Body type) {
  if (static_cast<uint32_t>(type) <= static_cast<uint32_t>(wire::Body::MAX)) {
    return wire::EnumNameBody(type);
  }
  return absl::StrCat("unknown(", static_cast<int>(type), ")");
}

#define DHS_DEFINE_MESSAGE(Name)                                                                   \
  std::string Encode##Name(const wire::Name##T& body, uint64_t seq, std::string_view sender) {    \
    return EncodeBody(body, kProtocolVersion, seq, sender);                                        \
  }                                                                                                \
  absl::StatusOr<wire::Name##T> Read##Name(const Message& message) { return ReadBody<wire::Name##T>(message); }
DHS_WIRE_MESSAGES(DHS_DEFINE_MESSAGE)
#undef DHS_DEFINE_MESSAGE

absl::Status ReadErrorStatus(const Message& message) {
  absl::StatusOr<wire::ErrorReplyT> reply = ReadErrorReply(message);
  if (!reply.ok()) return reply.status();
  absl::Status status = FromWireError(reply->code, reply->message);
  if (status.ok()) return absl::UnknownError("ErrorReply with code OK");
  return WithErrorReason(std::move(status), reply->reason);
}

WorkerShape WorkerShapeOf(const wire::HelloT& h) {
  WorkerShape w;
  w.serving_mode = h.serving_mode;
  w.page_rows = h.page_rows;
  w.page_bytes = h.page_bytes;
  w.host_page_bytes = h.host_page_bytes;
  w.payload_sources = static_cast<uint32_t>(h.sources.size());
  w.index_producers = h.index_producers;
  w.index_key_bytes = h.index_key_bytes;
  w.top_k = h.top_k;
  w.hot_rows = h.hot_rows;
  w.tail_rows = h.tail_rows;
  w.fetched_rows_per_token = h.fetched_rows_per_token;
  w.request_slots = h.request_slots;
  w.drafter_window = h.drafter_window;
  w.k_max = h.k_max;
  w.draft_bytes_per_row = h.draft_bytes_per_row;
  w.draft_ring_rows = h.draft_ring_rows;
  w.draft_ring_bytes = h.draft_ring_bytes;
  w.staging_bytes = h.staging_bytes;
  w.staging_arenas = h.staging_arenas;
  return w;
}

namespace internal {
std::string EncodeRawEnvelope(uint32_t protocol_version, uint8_t body_type, uint64_t seq, std::string_view sender) {
  flatbuffers::FlatBufferBuilder fbb(128);
  const auto sender_offset = fbb.CreateString(sender.data(), sender.size());
  wire::ErrorReplyT placeholder;
  placeholder.message = "raw";
  const auto body_offset = wire::ErrorReply::Pack(fbb, &placeholder);
  wire::EnvelopeBuilder envelope(fbb);
  envelope.add_protocol_version(protocol_version);
  envelope.add_sequence(seq);
  envelope.add_sender(sender_offset);
  envelope.add_body_type(static_cast<wire::Body>(body_type));
  envelope.add_body(body_offset.Union());
  fbb.Finish(envelope.Finish());
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}
}  // namespace internal

}  // namespace dhs
