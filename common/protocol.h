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
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
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

// One typed pair per message. Encode returns the serialized envelope; Read unpacks the body of a
// decoded message and fails with FAILED_PRECONDITION when the message holds another type.
#define DHS_DECLARE_MESSAGE(Name)                                                                  \
  std::string Encode##Name(const wire::Name##T& body, uint64_t seq, std::string_view sender);     \
  absl::StatusOr<wire::Name##T> Read##Name(const Message& message);
// memd <-> workerd
DHS_DECLARE_MESSAGE(Hello)
DHS_DECLARE_MESSAGE(HelloReply)
DHS_DECLARE_MESSAGE(AdmitRequest)
DHS_DECLARE_MESSAGE(AdmitGrant)
DHS_DECLARE_MESSAGE(AdmitWait)
DHS_DECLARE_MESSAGE(AdmitReject)
DHS_DECLARE_MESSAGE(ReclaimOrder)
DHS_DECLARE_MESSAGE(BackupComplete)
DHS_DECLARE_MESSAGE(HostCopyWritten)
DHS_DECLARE_MESSAGE(TokensCommitted)
DHS_DECLARE_MESSAGE(Attach)
DHS_DECLARE_MESSAGE(TokensCommittedAck)
DHS_DECLARE_MESSAGE(ReadersDone)
DHS_DECLARE_MESSAGE(Retire)
DHS_DECLARE_MESSAGE(PopulateOrder)
DHS_DECLARE_MESSAGE(ReadyPublish)
DHS_DECLARE_MESSAGE(Complete)
DHS_DECLARE_MESSAGE(CompleteAck)
DHS_DECLARE_MESSAGE(Heartbeat)
DHS_DECLARE_MESSAGE(HeartbeatAck)
DHS_DECLARE_MESSAGE(ErrorReply)
// dhsctl <-> memd
DHS_DECLARE_MESSAGE(IntrospectQuery)
DHS_DECLARE_MESSAGE(IntrospectReply)
// client/replay <-> workerd
DHS_DECLARE_MESSAGE(SubmitRequest)
DHS_DECLARE_MESSAGE(SubmitAccepted)
DHS_DECLARE_MESSAGE(TokenChunk)
DHS_DECLARE_MESSAGE(WorkerStatsQuery)
DHS_DECLARE_MESSAGE(WorkerStatsReply)
DHS_DECLARE_MESSAGE(Cancel)  // issue 22
#undef DHS_DECLARE_MESSAGE

// Reads an ErrorReply message as the absl::Status it carries (FromWireError); a message of
// another type gives FAILED_PRECONDITION.
absl::Status ReadErrorStatus(const Message& message);

namespace internal {
// Test seam: an envelope with an explicit protocol version and a raw body type (to produce wrong
// versions and unknown body types). `body` is packed as an ErrorReply table.
std::string EncodeRawEnvelope(uint32_t protocol_version, uint8_t body_type, uint64_t seq, std::string_view sender);
}  // namespace internal

}  // namespace dhs
