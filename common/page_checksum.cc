// common/page_checksum.cc: see page_checksum.h.
#include "common/page_checksum.h"

#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // libxxhash's run-time choice of SSE2 / AVX2 / AVX-512: the same hash, 2-4x faster
#endif

namespace dhs {

uint64_t PageChecksum(std::span<const uint8_t> page) {
#if defined(__x86_64__)
  const uint64_t h = XXH3_64bits_dispatch(page.data(), page.size());
#else
  const uint64_t h = XXH3_64bits(page.data(), page.size());
#endif
  return h == kNoChecksum ? 1 : h;
}

bool PageChecksumMatches(std::span<const uint8_t> page, uint64_t expected) {
  return expected != kNoChecksum && PageChecksum(page) == expected;
}

}  // namespace dhs
