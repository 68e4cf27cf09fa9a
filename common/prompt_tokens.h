// common/prompt_tokens.h: the synthetic prompt tokens of a trace request, shared by the replay tool (which sends
// prompt bytes) and the worker (which expands a prepared-prefix reference), so that both produce the same tokens.
//
// Traces carry no text, only lengths and prefix-block ids (`hash_ids`, brief §10). A request's input is
//   tokens [0, covered):            block b = t / block_tokens, token PrefixBlockToken(hash_ids[b], t % block_tokens)
//   tokens [covered, input_tokens): PrivateToken(private_seed, t)
// with covered = min(input_tokens, hash_ids.size() * block_tokens). Equal ids give equal blocks, so requests that
// share leading hash ids share leading tokens (and a prepared-prefix cache can share their rows).
// Tokens are bytes (the byte vocabulary of brief §11). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dhs {

// SplitMix64's finaliser over x + golden gamma (Steele, Lea, Flood 2014, "Fast splittable pseudorandom number
// generators"): a cheap, well-mixed 64-bit hash.
uint64_t SplitMix64(uint64_t x);

// Token j of the prefix block named `hash_id`: the top byte of SplitMix64(SplitMix64(hash_id) + j).
// Independent of the block size, so a block of a scaled trace is a prefix of the unscaled block.
uint8_t PrefixBlockToken(uint64_t hash_id, uint64_t j);

// Token t of a request's tokens not covered by hash ids: the top byte of
// SplitMix64(SplitMix64(private_seed ^ 0x5265717565737400) + t) (the salt is ASCII "Request\0").
uint8_t PrivateToken(uint64_t private_seed, uint64_t t);

// Tokens covered by `n_hash_ids` blocks of `block_tokens` in an input of `input_tokens`:
// min(input_tokens, n_hash_ids * block_tokens). block_tokens >= 1.
uint64_t PrefixCoveredTokens(uint64_t n_hash_ids, uint64_t block_tokens, uint64_t input_tokens);

// Tokens [begin, end) of the input described above. Precondition: block_tokens >= 1, begin <= end <= input_tokens.
std::vector<uint8_t> SyntheticPromptTokens(std::span<const uint64_t> hash_ids, uint64_t block_tokens,
                                           uint64_t input_tokens, uint64_t private_seed, uint64_t begin,
                                           uint64_t end);

}  // namespace dhs
