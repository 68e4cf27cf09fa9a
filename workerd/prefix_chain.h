// workerd/prefix_chain.h: the prefix chain a worker names in its AdmitRequest (issue 24, worker side; memd's side is
// memd/prefix_pages.h): the request's tenant, the ids of its complete prefix blocks, the tokens per block, and a
// digest of each block's tokens. memd addresses a shared host page by (tenant, ids up to its block, page) and only
// imports a stored page whose chain of digests is the request's own: an id is never trusted alone.
//
// Blocks: block b holds input tokens [b * T, (b + 1) * T), T = SubmitRequest.prefix_block_tokens (the trace's block
// size, scaled with its lengths; 512 by default); only complete blocks are named ((b + 1) * T <= input tokens). The
// partial last block and decoded rows stay private (memd shares floor(n * T / p) pages of a chain of n blocks).
// Block ids: the request's hash_ids (Mooncake's, already chained: equal id => equal prefix) where it has them, else
// derived from the tokens: id_b = XXH3_64(le64(id_{b-1}) tokens of block b, seed kDerivedBlockSeed) (id_{-1} = 0),
// so a prompt sent as bytes shares with the same prompt sent as hash_ids only through equal content, never by id.
// Digests: digest_b = XXH3_64(the block's tokens as little-endian int32, seed kBlockDigestSeed), always computed
// from the tokens the worker will feed (a client that names another's ids with other tokens gets other digests:
// memd's content check misses, nothing is imported).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "workerd/model/config.h"

namespace dhs {

inline constexpr uint64_t kBlockDigestSeed = 0x44485342446967ull;   // "DHSBDig"
inline constexpr uint64_t kDerivedBlockSeed = 0x444853426c6b49ull;  // "DHSBlkI"

struct RequestPrefixChain {
  std::string tenant;                   // SubmitRequest.tenant (empty = the default tenant)
  std::vector<uint64_t> block_ids;      // one per complete block, block 0 first
  std::vector<uint64_t> block_digests;  // same length
  uint32_t block_tokens = 0;            // T (0 when no block is complete)
  bool empty() const { return block_ids.empty(); }
};

// digest_b of the tokens of one block (any length).
uint64_t BlockDigest(std::span<const model::Token> tokens);

// The chain of `input` (the tokens the worker feeds, prefix first) in blocks of `block_tokens` (0: none), with ids
// `hash_ids[b]` for b < hash_ids.size() and derived ids after them. `tenant` is copied.
RequestPrefixChain PrefixChainOf(std::span<const model::Token> input, std::span<const uint64_t> hash_ids,
                                 uint32_t block_tokens, const std::string& tenant);

// Blocks b < `blocks` whose rows [b * T, (b + 1) * T) all lie in `pages` (history pages of `page_rows` rows,
// ascending or not): the blocks a grant's shared pages cover whole (prefix.hits_host).
uint64_t BlocksCovered(std::span<const uint32_t> pages, uint32_t page_rows, uint32_t block_tokens, uint64_t blocks);

}  // namespace dhs
