// common/prompt_tokens.cc: see prompt_tokens.h.
#include "common/prompt_tokens.h"

#include <algorithm>

namespace dhs {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint8_t PrefixBlockToken(uint64_t hash_id, uint64_t j) {
  return static_cast<uint8_t>(SplitMix64(SplitMix64(hash_id) + j) >> 56);
}

uint8_t PrivateToken(uint64_t private_seed, uint64_t t) {
  constexpr uint64_t kRequestSalt = 0x5265717565737400ULL;  // "Request\0"
  return static_cast<uint8_t>(SplitMix64(SplitMix64(private_seed ^ kRequestSalt) + t) >> 56);
}

uint64_t PrefixCoveredTokens(uint64_t n_hash_ids, uint64_t block_tokens, uint64_t input_tokens) {
  // n_hash_ids * block_tokens may overflow only for absurd inputs; clamp through division instead.
  if (block_tokens == 0) return 0;
  if (n_hash_ids >= (input_tokens + block_tokens - 1) / block_tokens) return input_tokens;
  return n_hash_ids * block_tokens;
}

std::vector<uint8_t> SyntheticPromptTokens(std::span<const uint64_t> hash_ids, uint64_t block_tokens,
                                           uint64_t input_tokens, uint64_t private_seed, uint64_t begin,
                                           uint64_t end) {
  const uint64_t block = std::max<uint64_t>(1, block_tokens);
  const uint64_t covered = PrefixCoveredTokens(hash_ids.size(), block, input_tokens);
  std::vector<uint8_t> out;
  out.reserve(end > begin ? end - begin : 0);
  for (uint64_t t = begin; t < end; ++t) {
    out.push_back(t < covered ? PrefixBlockToken(hash_ids[t / block], t % block) : PrivateToken(private_seed, t));
  }
  return out;
}

}  // namespace dhs
