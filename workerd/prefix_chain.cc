// workerd/prefix_chain.cc: see prefix_chain.h.
#include "workerd/prefix_chain.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "xxhash.h"

namespace dhs {

uint64_t BlockDigest(std::span<const model::Token> tokens) {
  std::vector<uint8_t> bytes(tokens.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto t = static_cast<uint32_t>(tokens[i]);
    for (int k = 0; k < 4; ++k) bytes[i * 4 + k] = static_cast<uint8_t>(t >> (8 * k));
  }
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), kBlockDigestSeed);
}

namespace {

uint64_t DerivedId(uint64_t previous, std::span<const model::Token> tokens) {
  std::vector<uint8_t> bytes(8 + tokens.size() * 4);
  for (int k = 0; k < 8; ++k) bytes[k] = static_cast<uint8_t>(previous >> (8 * k));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto t = static_cast<uint32_t>(tokens[i]);
    for (int k = 0; k < 4; ++k) bytes[8 + i * 4 + k] = static_cast<uint8_t>(t >> (8 * k));
  }
  return XXH3_64bits_withSeed(bytes.data(), bytes.size(), kDerivedBlockSeed);
}

}  // namespace

RequestPrefixChain PrefixChainOf(std::span<const model::Token> input, std::span<const uint64_t> hash_ids,
                                 uint32_t block_tokens, const std::string& tenant) {
  RequestPrefixChain chain;
  chain.tenant = tenant;
  if (block_tokens == 0) return chain;
  const size_t blocks = input.size() / block_tokens;
  uint64_t previous = 0;
  for (size_t b = 0; b < blocks; ++b) {
    std::span<const model::Token> tokens = input.subspan(b * block_tokens, block_tokens);
    const uint64_t id = b < hash_ids.size() ? hash_ids[b] : DerivedId(previous, tokens);
    chain.block_ids.push_back(id);
    chain.block_digests.push_back(BlockDigest(tokens));
    previous = id;
  }
  if (!chain.block_ids.empty()) chain.block_tokens = block_tokens;
  return chain;
}

uint64_t BlocksCovered(std::span<const uint32_t> pages, uint32_t page_rows, uint32_t block_tokens, uint64_t blocks) {
  if (page_rows == 0 || block_tokens == 0) return 0;
  const std::set<uint32_t> have(pages.begin(), pages.end());
  uint64_t covered = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t first = b * block_tokens / page_rows, last = ((b + 1) * block_tokens - 1) / page_rows;
    bool all = true;
    for (uint64_t h = first; h <= last && all; ++h) all = have.contains(static_cast<uint32_t>(h));
    covered += all;
  }
  return covered;
}

}  // namespace dhs
