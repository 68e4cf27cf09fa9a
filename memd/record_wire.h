// memd/record_wire.h: a request's record (memd/request_records.h) to and from its wire form, wire::RequestRecordT
// (schemas/): the AdmitRequest's record, HelloReply.interrupted_records and the record journal's Open frame
// (memd/record_journal.h) all carry it this way.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

#include "common/protocol.h"
#include "memd/request_records.h"

namespace dhs::memd {

// The record of node request `id` as the wire carries it, committed tokens and their logits digests included.
std::unique_ptr<wire::RequestRecordT> ToWireRecord(RequestId id, const RequestRecord& record);

// The record a wire record gives; `gpu` is its sender's GPU (the wire form has none). Its tokens come from the field
// of its token_kind (tokens for Bytes, token_ids for EngineIds). Errors: INVALID_ARGUMENT (the other kind's tokens
// are present too).
absl::StatusOr<RequestRecord> FromWireRecord(const wire::RequestRecordT& w, GpuId gpu);

// The tokens of one TokensCommitted entry with their kind: `tokens` (Bytes) or `token_ids` (EngineIds); an entry of
// no tokens is Bytes. Errors: INVALID_ARGUMENT (both fields hold tokens).
absl::StatusOr<std::pair<TokenKind, std::vector<uint32_t>>> CommittedTokensOf(const wire::CommittedTokensT& e);

// Byte tokens widened (the built-in model's vocabulary in a record's uint32 tokens).
std::vector<uint32_t> WidenTokens(const std::vector<uint8_t>& bytes);

}  // namespace dhs::memd
