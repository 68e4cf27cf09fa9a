// common/page_checksum.cc: see page_checksum.h.
#include "common/page_checksum.h"

#include <xxhash.h>

namespace dhs {

uint64_t PageChecksum(std::span<const uint8_t> page) {
  const uint64_t h = XXH3_64bits(page.data(), page.size());
  return h == kNoChecksum ? 1 : h;
}

bool PageChecksumMatches(std::span<const uint8_t> page, uint64_t expected) {
  return expected != kNoChecksum && PageChecksum(page) == expected;
}

}  // namespace dhs
