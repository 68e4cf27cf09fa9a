// tools/replay/node_client.cc: SynthesizePrompt (see node_client.h).
#include "tools/replay/node_client.h"

#include <algorithm>

namespace dhs::replay {
namespace {

// SplitMix64 finaliser (Steele, Lea, Flood 2014): a cheap, well-mixed 64-bit hash.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Distinct salts keep block tokens and per-request tokens from colliding for equal numbers.
constexpr uint64_t kBlockSalt = 0x426c6f636b000000ULL;    // "Block"
constexpr uint64_t kRequestSalt = 0x5265717565737400ULL;  // "Request"

}  // namespace

std::string SynthesizePrompt(const PromptRef& prompt) {
  const int64_t n = std::max<int64_t>(0, prompt.input_tokens);
  const int64_t block = std::max<int64_t>(1, prompt.block_tokens);
  std::string out(static_cast<size_t>(n), '\0');
  for (int64_t t = 0; t < n; ++t) {
    const auto b = static_cast<size_t>(t / block);
    uint64_t h;
    if (b < prompt.hash_ids.size()) {
      h = Mix(Mix(kBlockSalt ^ static_cast<uint64_t>(prompt.hash_ids[b])) ^ static_cast<uint64_t>(t % block));
    } else {
      h = Mix(Mix(kRequestSalt ^ static_cast<uint64_t>(prompt.trace_index)) ^ static_cast<uint64_t>(t));
    }
    out[static_cast<size_t>(t)] = static_cast<char>(h & 0xff);
  }
  return out;
}

}  // namespace dhs::replay
