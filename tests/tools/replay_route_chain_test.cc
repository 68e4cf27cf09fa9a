// Prefix routing names a request's blocks as memd does (issue 26): RouteChainOf (tools/replay/multi_node.h) against
// memd's own PrefixPages::Addresses (memd/prefix_pages.h) for the chain the worker would send (workerd/prefix_chain.h),
// with prompt bytes (ids derived from the tokens) and with a prepared prefix (the trace's ids), two tenants.
#include <set>
#include <string>
#include <vector>

#include "common/prompt_tokens.h"
#include "gtest/gtest.h"
#include "memd/prefix_pages.h"
#include "tools/replay/multi_node.h"
#include "workerd/prefix_chain.h"

namespace dhs::replay {
namespace {

// memd's chain hash c_b of every block of `prompt` as the worker would name it, from memd's Addresses (one page per
// block here: page_rows == block_tokens).
std::vector<uint64_t> MemdChain(const PromptRef& prompt, const std::string& tenant, bool prepared) {
  const std::vector<uint64_t> ids = HashIdsOf(prompt);
  const uint64_t n = static_cast<uint64_t>(prompt.input_tokens), block = static_cast<uint64_t>(prompt.block_tokens);
  const std::vector<uint8_t> bytes = SyntheticPromptTokens(ids, block, n, static_cast<uint64_t>(prompt.trace_index), 0, n);
  const std::vector<model::Token> tokens(bytes.begin(), bytes.end());
  const RequestPrefixChain worker =
      PrefixChainOf(tokens, prepared ? ids : std::vector<uint64_t>{}, static_cast<uint32_t>(block), tenant);
  memd::PrefixChain chain{worker.tenant, worker.block_ids, worker.block_digests, worker.block_tokens};
  auto addresses = memd::PrefixPages::Addresses(chain, static_cast<uint32_t>(block), 1 << 20);
  EXPECT_TRUE(addresses.ok()) << addresses.status();
  std::vector<uint64_t> out;
  for (const memd::PrefixAddress& a : *addresses) out.push_back(a.chain);
  return out;
}

TEST(ReplayRouteChainTest, MatchesMemdsChainHashes) {
  PromptRef prompt;
  prompt.trace_index = 3;
  prompt.input_tokens = 64 * 5 + 25;  // 5 complete blocks and a partial one
  prompt.block_tokens = 64;
  prompt.hash_ids = {11, 12, 13, 14, 15, 16};
  for (bool prepared : {false, true}) {
    for (const std::string tenant : {"", "acme"}) {
      const std::vector<uint64_t> mine = RouteChainOf(prompt, tenant, prepared);
      EXPECT_EQ(mine.size(), 5u);
      EXPECT_EQ(mine, MemdChain(prompt, tenant, prepared)) << "prepared " << prepared << " tenant '" << tenant << "'";
    }
  }
  // Tenants and the two id sources give different chains (nothing routes across them).
  const std::set<std::vector<uint64_t>> all = {RouteChainOf(prompt, "", false), RouteChainOf(prompt, "acme", false),
                                               RouteChainOf(prompt, "", true), RouteChainOf(prompt, "acme", true)};
  EXPECT_EQ(all.size(), 4u);
  // Two requests sharing their first 3 ids (prompt bytes: the same tokens) share exactly 3 chain hashes.
  PromptRef other = prompt;
  other.trace_index = 9;
  other.hash_ids = {11, 12, 13, 99, 98, 97};
  const auto a = RouteChainOf(prompt, "", false), b = RouteChainOf(other, "", false);
  size_t common = 0;
  while (common < a.size() && a[common] == b[common]) ++common;
  EXPECT_EQ(common, 3u);
  EXPECT_TRUE(RouteChainOf(PromptRef{0, 10, 0, {}}, "", false).empty());  // no block size: no chain
}

}  // namespace
}  // namespace dhs::replay
