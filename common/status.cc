#include "common/status.h"

#include <optional>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/protocol.h"

namespace dhs {
namespace {

using wire::ErrorCode;

absl::Status WithWireCode(absl::StatusCode canonical, ErrorCode code, std::string_view message) {
  absl::Status status(canonical, absl::string_view(message.data(), message.size()));
  status.SetPayload(kWireErrorPayloadUrl, absl::Cord(std::to_string(static_cast<int>(code))));
  return status;
}

std::optional<ErrorCode> PayloadCode(const absl::Status& status) {
  auto payload = status.GetPayload(kWireErrorPayloadUrl);
  if (!payload.has_value()) return std::nullopt;
  std::string text(*payload);
  if (text == std::to_string(static_cast<int>(ErrorCode::INVALID_MESSAGE))) return ErrorCode::INVALID_MESSAGE;
  if (text == std::to_string(static_cast<int>(ErrorCode::UNKNOWN_MESSAGE))) return ErrorCode::UNKNOWN_MESSAGE;
  if (text == std::to_string(static_cast<int>(ErrorCode::VERSION_MISMATCH))) return ErrorCode::VERSION_MISMATCH;
  return std::nullopt;
}

}  // namespace

namespace {
absl::Status WithEndReason(absl::Status status, wire::EndReason reason) {
  status.SetPayload(kEndReasonPayloadUrl, absl::Cord(std::to_string(static_cast<int>(reason))));
  return status;
}
}  // namespace

absl::Status WorkerEpochEndedError(std::string_view why) {
  return WithEndReason(
      absl::UnavailableError(absl::StrCat("worker epoch ended: ", absl::string_view(why.data(), why.size()))),
      wire::EndReason::WORKER_EPOCH_ENDED);
}

absl::Status RequestCancelledError(std::string_view reason) {
  return WithEndReason(absl::CancelledError(absl::StrCat("cancelled: ", absl::string_view(reason.data(), reason.size()))),
                       wire::EndReason::CANCELLED);
}

absl::Status WorkerStoppingError() {
  return WithEndReason(absl::UnavailableError("worker stopping"), wire::EndReason::WORKER_STOPPING);
}

wire::EndReason EndReasonOf(const absl::Status& status) {
  auto payload = status.GetPayload(kEndReasonPayloadUrl);
  if (!payload.has_value()) return wire::EndReason::NONE;
  const std::string text(*payload);
  for (wire::EndReason r : {wire::EndReason::WORKER_EPOCH_ENDED, wire::EndReason::CANCELLED,
                            wire::EndReason::WORKER_STOPPING}) {
    if (text == std::to_string(static_cast<int>(r))) return r;
  }
  return wire::EndReason::NONE;
}

absl::Status FencedError(std::string_view why) {
  return WithErrorReason(
      absl::FailedPreconditionError(absl::StrCat("fenced: ", absl::string_view(why.data(), why.size()))),
      wire::ErrorReason::FENCED);
}

absl::Status WithErrorReason(absl::Status status, wire::ErrorReason reason) {
  if (reason == wire::ErrorReason::NONE || status.ok()) return status;
  status.SetPayload(kErrorReasonPayloadUrl, absl::Cord(std::to_string(static_cast<int>(reason))));
  return status;
}

wire::ErrorReason ErrorReasonOf(const absl::Status& status) {
  auto payload = status.GetPayload(kErrorReasonPayloadUrl);
  if (!payload.has_value()) return wire::ErrorReason::NONE;
  const std::string text(*payload);
  for (wire::ErrorReason r : wire::EnumValuesErrorReason()) {
    if (r != wire::ErrorReason::NONE && text == std::to_string(static_cast<int>(r))) return r;
  }
  return wire::ErrorReason::NONE;
}

absl::Status InvalidMessageError(std::string_view message) {
  return WithWireCode(absl::StatusCode::kInvalidArgument, ErrorCode::INVALID_MESSAGE, message);
}
absl::Status UnknownMessageError(std::string_view message) {
  return WithWireCode(absl::StatusCode::kUnimplemented, ErrorCode::UNKNOWN_MESSAGE, message);
}
absl::Status VersionMismatchError(std::string_view message) {
  return WithWireCode(absl::StatusCode::kFailedPrecondition, ErrorCode::VERSION_MISMATCH, message);
}

ErrorCode ToWireError(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk: return ErrorCode::OK;
    case absl::StatusCode::kCancelled: return ErrorCode::CANCELLED;
    case absl::StatusCode::kUnknown: return ErrorCode::UNKNOWN;
    case absl::StatusCode::kInvalidArgument: return ErrorCode::INVALID_ARGUMENT;
    case absl::StatusCode::kDeadlineExceeded: return ErrorCode::DEADLINE_EXCEEDED;
    case absl::StatusCode::kNotFound: return ErrorCode::NOT_FOUND;
    case absl::StatusCode::kAlreadyExists: return ErrorCode::ALREADY_EXISTS;
    case absl::StatusCode::kPermissionDenied: return ErrorCode::PERMISSION_DENIED;
    case absl::StatusCode::kResourceExhausted: return ErrorCode::RESOURCE_EXHAUSTED;
    case absl::StatusCode::kFailedPrecondition: return ErrorCode::FAILED_PRECONDITION;
    case absl::StatusCode::kAborted: return ErrorCode::ABORTED;
    case absl::StatusCode::kOutOfRange: return ErrorCode::OUT_OF_RANGE;
    case absl::StatusCode::kUnimplemented: return ErrorCode::UNIMPLEMENTED;
    case absl::StatusCode::kInternal: return ErrorCode::INTERNAL;
    case absl::StatusCode::kUnavailable: return ErrorCode::UNAVAILABLE;
    case absl::StatusCode::kDataLoss: return ErrorCode::DATA_LOSS;
    case absl::StatusCode::kUnauthenticated: return ErrorCode::PERMISSION_DENIED;
    default: return ErrorCode::UNKNOWN;
  }
}

ErrorCode ToWireError(const absl::Status& status) {
  if (status.ok()) return ErrorCode::OK;
  if (std::optional<ErrorCode> code = PayloadCode(status)) return *code;
  return ToWireError(status.code());
}

absl::Status FromWireError(ErrorCode code, std::string_view message) {
  const absl::string_view msg(message.data(), message.size());
  switch (code) {
    case ErrorCode::OK: return absl::OkStatus();
    case ErrorCode::INVALID_MESSAGE: return InvalidMessageError(message);
    case ErrorCode::UNKNOWN_MESSAGE: return UnknownMessageError(message);
    case ErrorCode::VERSION_MISMATCH: return VersionMismatchError(message);
    case ErrorCode::NOT_FOUND: return absl::NotFoundError(msg);
    case ErrorCode::RESOURCE_EXHAUSTED: return absl::ResourceExhaustedError(msg);
    case ErrorCode::FAILED_PRECONDITION: return absl::FailedPreconditionError(msg);
    case ErrorCode::INVALID_ARGUMENT: return absl::InvalidArgumentError(msg);
    case ErrorCode::UNAVAILABLE: return absl::UnavailableError(msg);
    case ErrorCode::INTERNAL: return absl::InternalError(msg);
    case ErrorCode::ALREADY_EXISTS: return absl::AlreadyExistsError(msg);
    case ErrorCode::DEADLINE_EXCEEDED: return absl::DeadlineExceededError(msg);
    case ErrorCode::ABORTED: return absl::AbortedError(msg);
    case ErrorCode::CANCELLED: return absl::CancelledError(msg);
    case ErrorCode::UNIMPLEMENTED: return absl::UnimplementedError(msg);
    case ErrorCode::DATA_LOSS: return absl::DataLossError(msg);
    case ErrorCode::OUT_OF_RANGE: return absl::OutOfRangeError(msg);
    case ErrorCode::PERMISSION_DENIED: return absl::PermissionDeniedError(msg);
    case ErrorCode::UNKNOWN: return absl::UnknownError(msg);
  }
  return absl::UnknownError(absl::StrCat("wire error ", static_cast<int>(code), ": ", msg));
}

std::string EncodeError(const absl::Status& status, uint64_t answering_seq, std::string_view sender) {
  wire::ErrorReplyT reply;
  reply.code = status.ok() ? ErrorCode::INTERNAL : ToWireError(status);
  reply.message = status.ok() ? std::string("EncodeError called with OK") : std::string(status.message());
  reply.answering_sequence = answering_seq;
  reply.reason = status.ok() ? wire::ErrorReason::NONE : ErrorReasonOf(status);
  return EncodeErrorReply(reply, answering_seq, sender);
}

}  // namespace dhs
