// common/status.h: the one mapping between absl::Status (used inside every component) and the wire
// ErrorCode (schemas/dhs.fbs), plus the ErrorReply encoder.
//
// Three wire codes have no absl::StatusCode of their own: INVALID_MESSAGE, UNKNOWN_MESSAGE and
// VERSION_MISMATCH. They travel inside absl::Status as a canonical code (InvalidArgument,
// Unimplemented, FailedPrecondition) plus a payload under kWireErrorPayloadUrl, so that
// ToWireError(FromWireError(c, m)) == c for every code. Use the factories below to make them.
//
// Thread-safety: all functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "dhs_generated.h"

namespace dhs {

// Type URL of the absl::Status payload that names a protocol-only wire code.
inline constexpr char kWireErrorPayloadUrl[] = "type.dhs/dhs.wire.ErrorCode";

// Protocol-only errors (see above).
absl::Status InvalidMessageError(std::string_view message);   // -> INVALID_MESSAGE
absl::Status UnknownMessageError(std::string_view message);   // -> UNKNOWN_MESSAGE
absl::Status VersionMismatchError(std::string_view message);  // -> VERSION_MISMATCH

// The end of a worker's epoch without the end of its requests (TokenChunk.end_reason = WORKER_EPOCH_ENDED,
// docs/protocol.md "The epoch's end"): UNAVAILABLE "worker epoch ended: <why>" with a payload under
// kEndReasonPayloadUrl, which EndReasonOf reads (NONE for any other status). The worker sets the chunk's end_reason
// from it, so clients match the code, never the text.
inline constexpr char kEndReasonPayloadUrl[] = "type.dhs/dhs.wire.EndReason";
absl::Status WorkerEpochEndedError(std::string_view why);
// Cancel (issue 22): a request its client cancelled (TokenChunk.end_reason = CANCELLED): CANCELLED
// "cancelled: <reason>".
absl::Status RequestCancelledError(std::string_view reason);
// A request the stopping worker ended for good (end_reason = WORKER_STOPPING): UNAVAILABLE "worker stopping".
absl::Status WorkerStoppingError();
// The end reason a status carries (one of the three factories above), NONE for any other status.
wire::EndReason EndReasonOf(const absl::Status& status);

// Fencing (ErrorReply.reason = FENCED, docs/protocol.md "Fencing"): memd's refusal of a message of a fenced worker
// (or of a worker that said no Hello to this memd): FAILED_PRECONDITION "fenced: <why>" with a payload under
// kErrorReasonPayloadUrl, which ErrorReasonOf reads (NONE for any other status). EncodeError puts it on the wire and
// ReadErrorStatus back, so the worker tells a fence by the code, never by the text.
inline constexpr char kErrorReasonPayloadUrl[] = "type.dhs/dhs.wire.ErrorReason";
absl::Status FencedError(std::string_view why);
// `status` with `reason` attached (NONE: `status` unchanged); used when reading an ErrorReply.
absl::Status WithErrorReason(absl::Status status, wire::ErrorReason reason);
// The reason a status carries (FencedError, WithErrorReason), NONE for any other status.
wire::ErrorReason ErrorReasonOf(const absl::Status& status);
inline bool IsFenced(const absl::Status& status) { return ErrorReasonOf(status) == wire::ErrorReason::FENCED; }

// absl::StatusCode -> wire code (kOk -> OK; every canonical code has its own wire code).
wire::ErrorCode ToWireError(absl::StatusCode code);
// Full status -> wire code: the protocol payload wins over the canonical code.
wire::ErrorCode ToWireError(const absl::Status& status);
// Wire code + message -> absl::Status. OK gives absl::OkStatus() (message ignored); an unknown
// numeric value (from a newer peer) gives absl::UnknownError.
absl::Status FromWireError(wire::ErrorCode code, std::string_view message);

// Encodes an ErrorReply envelope for `status` (must not be OK; its ErrorReasonOf goes to ErrorReply.reason) answering the message with sequence
// `answering_seq` (0 when the inbound message was unreadable). The envelope's own sequence is
// `answering_seq` as for every reply.
std::string EncodeError(const absl::Status& status, uint64_t answering_seq, std::string_view sender = "");

}  // namespace dhs
