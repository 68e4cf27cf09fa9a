// common/session_digest.cc: see session_digest.h.
#include "common/session_digest.h"

#include <xxhash.h>

namespace dhs {

std::vector<uint64_t> SessionPageDigests(std::span<const uint8_t> tokens, uint32_t page_rows) {
  std::vector<uint64_t> out;
  if (page_rows == 0) return out;
  const uint8_t p_bytes[4] = {static_cast<uint8_t>(page_rows), static_cast<uint8_t>(page_rows >> 8),
                              static_cast<uint8_t>(page_rows >> 16), static_cast<uint8_t>(page_rows >> 24)};
  uint64_t d = XXH3_64bits_withSeed(p_bytes, sizeof(p_bytes), kSessionDigestSeed);
  const size_t pages = tokens.size() / page_rows;
  out.reserve(pages);
  for (size_t h = 0; h < pages; ++h) {
    d = XXH3_64bits_withSeed(tokens.data() + h * page_rows, page_rows, d);
    out.push_back(d);
  }
  return out;
}

std::vector<uint64_t> SessionPageDigests(std::span<const int32_t> tokens, uint32_t page_rows) {
  std::vector<uint8_t> bytes(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) bytes[i] = static_cast<uint8_t>(tokens[i]);
  return SessionPageDigests(std::span<const uint8_t>(bytes), page_rows);
}

}  // namespace dhs
