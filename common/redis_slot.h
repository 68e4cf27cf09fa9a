// common/redis_slot.h: the key -> hash slot map of Redis Cluster (issue 26; Redis Cluster specification, "Keys
// distribution model" and "Hash tags").
//
//   HASH_SLOT = CRC16(hashed part of key) mod 16384
//
// CRC16 is the XMODEM variant (width 16, polynomial 0x1021, initial value 0, no reflection, no final xor; the
// specification's check value: CRC16("123456789") = 0x31C3). The hashed part is the whole key, unless the key holds a
// '{' with a '}' somewhere to its right and at least one byte between the first '{' and the first '}' after it: then
// only those bytes are hashed ("{user1000}.following" and "{user1000}.followers" share a slot; "foo{}{bar}" hashes the
// whole key; "foo{{bar}}" hashes "{bar"; "foo{bar}{zap}" hashes "bar"). Keys are binary: every byte counts.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

namespace dhs::redis {

inline constexpr uint32_t kClusterSlots = 16384;  // fixed by the specification

// CRC16/XMODEM of `bytes`.
uint16_t Crc16(std::string_view bytes);

// The part of `key` that decides its slot (the hash tag's content, else the whole key); a view into `key`.
std::string_view HashTag(std::string_view key);

// The cluster slot of `key`, 0 .. 16383 (what CLUSTER KEYSLOT answers).
uint32_t KeySlot(std::string_view key);

}  // namespace dhs::redis
