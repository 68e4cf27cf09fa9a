// tests/memd/cluster_keys_test.cc: the cluster tier's key schema (memd/cluster_keys.h): exact key strings, the session
// hash recomputed here with libxxhash, and the hash-tag decision: a session's pages share one slot, prefix pages
// spread over the slots of three equal masters.
#include "memd/cluster_keys.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <set>

#include "common/redis_slot.h"
#include "memd/prefix_pages.h"

namespace dhs::memd {
namespace {

TEST(ClusterKeys, ExactStrings) {
  EXPECT_EQ(PrefixPageKey(0x00000000000000ffull, 0x0123456789abcdefull), "dhs1:00000000000000ff:p:0123456789abcdef");
  const uint64_t s = SessionHash("acme", "conv-7");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(s));
  EXPECT_EQ(SessionPageKey(0xff, "acme", "conv-7", 0xabcull, 12),
            std::string("dhs1:00000000000000ff:s:{") + hex + "}:0000000000000abc:12");
}

TEST(ClusterKeys, SessionHashIsSeededByTheTenant) {
  const uint64_t tenant = XXH3_64bits_withSeed("acme", 4, 0x44485354656e616eull);  // memd/prefix_pages.h kTenantSeed
  EXPECT_EQ(tenant, PrefixPages::TenantHash("acme"));
  EXPECT_EQ(SessionHash("acme", "conv-7"), XXH3_64bits_withSeed("conv-7", 6, tenant));
  EXPECT_NE(SessionHash("acme", "conv-7"), SessionHash("other", "conv-7"));  // two tenants never share a session key
  EXPECT_NE(SessionHash("", "conv-7"), SessionHash("acme", "conv-7"));
}

TEST(ClusterKeys, ASessionsPagesShareOneSlot) {
  std::set<uint32_t> slots;
  for (uint32_t page = 0; page < 200; ++page) {
    slots.insert(redis::KeySlot(SessionPageKey(42, "t", "session-1", 0x1000 + page * 7919, page)));
  }
  EXPECT_EQ(slots.size(), 1u);
  std::set<uint32_t> other;
  for (int s = 0; s < 50; ++s) other.insert(redis::KeySlot(SessionPageKey(42, "t", "session-" + std::to_string(s), 1, 0)));
  EXPECT_GT(other.size(), 45u);  // different sessions land on different slots
}

TEST(ClusterKeys, PrefixPagesSpreadOverThreeMasters) {
  // Three masters with the slot ranges redis-cli --cluster create gives 3 masters: 0-5460, 5461-10922, 10923-16383.
  uint32_t per_master[3] = {0, 0, 0};
  const int n = 3000;
  for (int i = 0; i < n; ++i) {
    const uint32_t slot = redis::KeySlot(PrefixPageKey(42, XXH3_64bits(&i, sizeof i)));
    ++per_master[slot <= 5460 ? 0 : slot <= 10922 ? 1 : 2];
  }
  for (uint32_t c : per_master) {
    EXPECT_GT(c, n / 3 - 150);
    EXPECT_LT(c, n / 3 + 150);
  }
}

}  // namespace
}  // namespace dhs::memd
