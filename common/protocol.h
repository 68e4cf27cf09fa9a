// common/protocol.h: the one place wire messages (schemas/dhs.fbs) are built and read.
//
// Inbound: DecodeEnvelope() checks, in this order and in every build type: size (empty or larger
// than the max -> INVALID_MESSAGE), the FlatBuffers Verifier (-> INVALID_MESSAGE), the protocol
// version (-> VERSION_MISMATCH), and that the body type is known (-> UNKNOWN_MESSAGE; an envelope
// without a body -> INVALID_MESSAGE). Then Read<Msg>() unpacks the typed body (wrong type ->
// FAILED_PRECONDITION). Outbound: Encode<Msg>() packs an object-API table into an envelope with
// the current protocol version. A reply repeats its request's sequence.
//
// Thread-safety: all functions are pure and thread-safe. A Message views the caller's buffer and
// is valid only while that buffer lives and is unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/status/statusor.h"
#include "common/status.h"
#include "common/worker_shape.h"
#include "dhs_generated.h"

namespace dhs {

// The protocol version this build speaks (Envelope.protocol_version). Must not change except for
// an incompatible protocol change (see docs/protocol.md). 2: BackupComplete.deferred_pages (a version-1 memd would
// read a deferred page as written and could populate it from a host page never written). 3: HostCopyWritten replaces
// BackupComplete with order 0 (whose `pages` held history pages, not GPU pages). 4: fencing (issue 11): every Hello
// starts a new epoch and fences the previous one, messages of a fenced worker are refused FAILED_PRECONDITION
// "fenced", HelloReply.interrupted_requests (a version-3 worker would never end them: their host pages would leak).
// 5: request records for resume (AdmitRequest.record, TokensCommitted, HelloReply.interrupted_records): a version-4
// worker would end interrupted requests that memd expects to be resumed, and a version-4 memd would drop the records.
// 6: resume from host KV (AdmitRequest.resume_of, AdmitGrant.imported_pages, Hello.host_page_bytes): host pages hold
// the positions' index keys after the payload rows, so a version-5 worker would write its pages at another stride.
// 7: re-Hello with a report (Hello.rehello / worker_epoch / report, HelloReply.refused_reports): a version-6 memd would
// skip the report and start a new epoch while the worker kept serving the old epoch's grants.
inline constexpr uint32_t kProtocolVersion = 7;

// Largest inbound message accepted, bytes (control messages are small; bulk KV goes through the
// host pool, never through sockets).
inline constexpr size_t kMaxMessageBytes = size_t{64} << 20;

// Longest tenant a SubmitRequest may carry, bytes (issue 24: an opaque salt; memd keeps only its hash in addresses,
// but the request's record keeps the string, so it is bounded like the rest of the record).
inline constexpr size_t kMaxTenantBytes = 256;

// A verified inbound envelope.
struct Message {
  wire::Body type = wire::Body::NONE;   // known, never NONE after a successful decode
  uint64_t sequence = 0;                // Envelope.sequence
  std::string sender;                   // Envelope.sender
  const wire::Envelope* envelope = nullptr;  // view into the decoded buffer
};

// Verifies and decodes `bytes` (see the header comment for the order of checks and the errors).
// `max_bytes` bounds the accepted size (default kMaxMessageBytes).
absl::StatusOr<Message> DecodeEnvelope(std::span<const uint8_t> bytes, size_t max_bytes = kMaxMessageBytes);
absl::StatusOr<Message> DecodeEnvelope(std::string_view bytes, size_t max_bytes = kMaxMessageBytes);

// The sequence of `bytes` when it passes the Verifier (whatever its version or body), else 0.
// Used to address an ErrorReply to a message that failed a later check.
uint64_t PeekSequence(std::string_view bytes);

// The worker's shape its Hello declares (issue 14; common/worker_shape.h): L_pay = sources.size(), the rest copied
// field by field. An older worker's Hello gives serving_mode "" (WorkerShape::declared() false).
WorkerShape WorkerShapeOf(const wire::HelloT& hello);

// Name of a body type for logs ("Hello", ..., "unknown(200)").
std::string BodyName(wire::Body type);

// The wire messages: THE one list, in the order of schemas/dhs.fbs's `union Body` (entry i is wire::Body value
// i + 1). It drives the typed pairs below, their definitions (protocol.cc), VisitMessage and the protocol test that
// round-trips every member (tests/common/protocol_test.cc). A member appended to the union and not here fails to
// compile (the static_asserts below compare the list with the generated enum's range).
// memd <-> workerd: Hello .. HeartbeatAck, ErrorReply, HostCopyWritten, TokensCommitted, TokensCommittedAck;
// dhsctl <-> memd: IntrospectQuery, IntrospectReply; client/replay <-> workerd: SubmitRequest, SubmitAccepted,
// TokenChunk, WorkerStatsQuery, WorkerStatsReply, Attach, Cancel (issue 22).
#define DHS_WIRE_MESSAGES(X)                                                                                     \
  X(Hello) X(HelloReply) X(AdmitRequest) X(AdmitGrant) X(AdmitWait) X(AdmitReject) X(ReclaimOrder)               \
  X(BackupComplete) X(ReadersDone) X(Retire) X(PopulateOrder) X(ReadyPublish) X(Complete) X(CompleteAck)         \
  X(Heartbeat) X(HeartbeatAck) X(ErrorReply) X(IntrospectQuery) X(IntrospectReply) X(SubmitRequest)              \
  X(SubmitAccepted) X(TokenChunk) X(WorkerStatsQuery) X(WorkerStatsReply) X(HostCopyWritten) X(TokensCommitted)  \
  X(Attach) X(TokensCommittedAck) X(Cancel)

// The list as body types, in its order.
#define DHS_WIRE_BODY_TYPE(Name) wire::BodyTraits<wire::Name>::enum_value,
inline constexpr wire::Body kWireMessages[] = {DHS_WIRE_MESSAGES(DHS_WIRE_BODY_TYPE)};
#undef DHS_WIRE_BODY_TYPE

namespace internal {
constexpr bool ListMatchesUnion() {
  for (size_t i = 0; i < std::size(kWireMessages); ++i) {
    if (static_cast<size_t>(kWireMessages[i]) != i + 1) return false;
  }
  return true;
}
}  // namespace internal
static_assert(std::size(kWireMessages) == static_cast<size_t>(wire::Body::MAX),
              "DHS_WIRE_MESSAGES must name every member of schemas/dhs.fbs's union Body, once");
static_assert(internal::ListMatchesUnion(), "DHS_WIRE_MESSAGES must follow the order of union Body");

// One typed pair per message. Encode returns the serialized envelope; Read unpacks the body of a
// decoded message and fails with FAILED_PRECONDITION when the message holds another type.
#define DHS_DECLARE_MESSAGE(Name)                                                                  \
  std::string Encode##Name(const wire::Name##T& body, uint64_t seq, std::string_view sender);     \
  absl::StatusOr<wire::Name##T> Read##Name(const Message& message);
DHS_WIRE_MESSAGES(DHS_DECLARE_MESSAGE)
#undef DHS_DECLARE_MESSAGE

// Dispatch over the list: reads the typed body of `message` (Read<Name>) and calls visit(body) with it (a const
// wire::<Name>T&). Errors: Read's (FAILED_PRECONDITION when the message was not decoded), UNKNOWN_MESSAGE for a body
// type outside the list.
template <typename Visitor>
absl::Status VisitMessage(const Message& message, Visitor&& visit) {
  switch (message.type) {
#define DHS_VISIT_MESSAGE(Name)                                                  \
  case wire::Body::Name: {                                                       \
    absl::StatusOr<wire::Name##T> body = Read##Name(message);                    \
    if (!body.ok()) return body.status();                                        \
    visit(static_cast<const wire::Name##T&>(*body));                             \
    return absl::OkStatus();                                                     \
  }
    DHS_WIRE_MESSAGES(DHS_VISIT_MESSAGE)
#undef DHS_VISIT_MESSAGE
    default: break;
  }
  return UnknownMessageError(BodyName(message.type));
}

// ---- A receiver's account of the union (issue 23): every receiver of wire messages (memd's daemon, the worker's
// MemdClient and client front, dhs-replay's client) says, for EVERY member of DHS_WIRE_MESSAGES, either how it handles
// it or that it does not expect it. A member appended to the union and to the list then fails to compile at each
// receiver until it is placed on one side.

// The body type of an object-API table: kBodyOf<wire::HelloT> == wire::Body::Hello.
template <typename T>
inline constexpr wire::Body kBodyOf = wire::BodyTraits<typename T::TableType>::enum_value;

// A set of members of the union, e.g. the messages a receiver does not expect.
template <wire::Body... kTypes>
struct MessageSet {
  static constexpr bool Has(wire::Body type) { return ((type == kTypes) || ...); }
};

// The first member of the union that `Handle` (an overload set: one operator() per message served, taking its
// const wire::<Name>T&) and `NotExpected` (a MessageSet) do not account for exactly once (neither handled nor listed,
// or both), in list order; wire::Body::NONE when every member is accounted for.
template <typename Handle, typename NotExpected>
constexpr wire::Body FirstUnaccountedMessage() {
  wire::Body first = wire::Body::NONE;
#define DHS_ACCOUNT_FOR(Name)                                                                                   \
  if (first == wire::Body::NONE &&                                                                              \
      std::is_invocable_v<Handle&, const wire::Name##T&> == NotExpected::Has(wire::Body::Name)) {               \
    first = wire::Body::Name;                                                                                   \
  }
  DHS_WIRE_MESSAGES(DHS_ACCOUNT_FOR)
#undef DHS_ACCOUNT_FOR
  return first;
}

namespace internal {
// Instantiated with the first unaccounted member, so that the compiler's error names it (ReceiverAccountsFor<Name>).
template <wire::Body kUnaccounted>
struct ReceiverAccountsFor {
  static_assert(kUnaccounted == wire::Body::NONE,
                "this wire message (the template argument) is neither handled by the receiver nor in its NotExpected "
                "set, or is both: handle it or list it as not expected");
  static constexpr bool value = true;
};
}  // namespace internal

// A receiver's dispatch over the list: reads the body of `message` (VisitMessage) and calls handle(body) when the
// receiver serves it, refuse(type) when its type is in NotExpected (the receiver's clear error reply or log). Checked
// at compile time: every member of the union is handled or in NotExpected, never both (FirstUnaccountedMessage).
// Errors: VisitMessage's (FAILED_PRECONDITION for an undecoded message, UNKNOWN_MESSAGE outside the list).
template <typename NotExpected, typename Handle, typename Refuse>
absl::Status ReceiveMessage(const Message& message, Handle& handle, Refuse&& refuse) {
  static_assert(internal::ReceiverAccountsFor<FirstUnaccountedMessage<Handle, NotExpected>()>::value);
  return VisitMessage(message, [&](const auto& body) {
    using Body = std::remove_cvref_t<decltype(body)>;
    if constexpr (NotExpected::Has(kBodyOf<Body>)) {
      refuse(kBodyOf<Body>);
    } else {
      handle(body);
    }
  });
}

// Reads an ErrorReply message as the absl::Status it carries (FromWireError, with its ErrorReply.reason attached:
// WithErrorReason); a message of
// another type gives FAILED_PRECONDITION.
absl::Status ReadErrorStatus(const Message& message);

namespace internal {
// Test seam: an envelope with an explicit protocol version and a raw body type (to produce wrong
// versions and unknown body types). `body` is packed as an ErrorReply table.
std::string EncodeRawEnvelope(uint32_t protocol_version, uint8_t body_type, uint64_t seq, std::string_view sender);
}  // namespace internal

}  // namespace dhs
