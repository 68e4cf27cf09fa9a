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

}  // namespace dhs
