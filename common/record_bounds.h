// common/record_bounds.h: the size of a request's record at memd (memd/request_records.h), shared by memd, which
// bounds it, and libdhs, which refuses a commit that memd would refuse (issue 25: a refusal after the call returned
// would lose the engine's tokens from the record without the engine knowing).
#pragma once

#include <cstdint>

namespace dhs {

// One record at most, bytes (RecordLimits::max_record_bytes' default; RequestRecord::bytes counts it).
inline constexpr uint64_t kMaxRecordBytes = uint64_t{4} << 20;
// Bytes a committed token adds to its record: the token (1 byte for workerd's byte vocabulary, 4 for an engine's id)
// and its 8-byte logits digest.
inline constexpr uint64_t kByteTokenRecordBytes = 1 + 8;
inline constexpr uint64_t kEngineTokenRecordBytes = 4 + 8;

// The counts a record's size is made of (memd/request_records.h's RequestRecord fields; libdhs fills them from the
// wire record and the admission it sends).
struct RecordSizes {
  uint64_t prompt_bytes = 0;   // `prompt`: workerd's byte tokens, 1 byte each
  uint64_t prompt_ids = 0;     // an engine's prompt ids, 4 bytes each
  uint64_t hash_ids = 0;       // prepared-prefix block ids, 8 bytes each
  uint64_t tenant_bytes = 0;
  uint64_t chain_entries = 0;  // prefix-chain block ids plus block digests (issue 24), 8 bytes each
  uint64_t tokens = 0;         // committed tokens
  bool engine_ids = false;     // the tokens are an engine's ids (kEngineTokenRecordBytes) else bytes
};
// Bytes a record holds, the quantity kMaxRecordBytes bounds (its wire and journal size, digests included): the one
// formula memd's RequestRecord::bytes and libdhs's commit check both evaluate.
inline constexpr uint64_t RecordBytes(const RecordSizes& s) {
  return s.prompt_bytes + 4 * s.prompt_ids + 8 * s.hash_ids + s.tenant_bytes + 8 * s.chain_entries +
         (s.engine_ids ? kEngineTokenRecordBytes : kByteTokenRecordBytes) * s.tokens;
}

}  // namespace dhs
