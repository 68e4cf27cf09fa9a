// memd/cluster_keys.h: the key schema of the cluster tier (issue 26; docs/cluster_tier.md "Key schema").
//
// Every key starts with a schema version and the geometry's space, so that nodes of another schema or another page
// geometry (another model, page size or layout) sharing one Redis never read or overwrite each other's pages:
//
//   prefix page   dhs1:<space>:p:<key>                          TTL ClusterKeyConfig::prefix_ttl_ms
//   session page  dhs1:<space>:s:{<session>}:<chain>:<page>     TTL ClusterKeyConfig::session_ttl_ms
//
//   <space>   16 lowercase hex digits: GeometryFingerprint(geometry) (memd/cluster_page_value.h)
//   <key>     16 hex: the shared prefix page's content address key (memd/prefix_pages.h PrefixAddress::key: tenant,
//             block chain up to the page's block, page rows, page index; the tenant is inside the chain hash)
//   <session> 16 hex: SessionHash(tenant, session id) = XXH3_64(session id bytes, seed PrefixPages::TenantHash(tenant))
//   <chain>   16 hex: the caller's 64-bit hash of the session's history up to and including the page (for a page of
//             complete prefix blocks, its PrefixAddress::key); <page>: the history page h, decimal.
// The value under each key is a page value (memd/cluster_page_value.h) whose header repeats kind, key and content, so
// a lookup never trusts the key alone.
//
// Hash tags (Redis Cluster specification, "Hash tags"; common/redis_slot.h):
// - Prefix pages carry NONE: their keys are uniform hashes, so the pages spread evenly over the masters. A lookup
//   batch is grouped per master and pipelined (common/redis_client.h), so it does not need one slot; and a hot shared
//   prefix (a system prompt every request of a tenant starts with) is read by every node at once: tagging its pages
//   together would send all that traffic to one master.
// - Session pages are tagged by the session ({<session>}): all pages of one session live on one master. A session's
//   history is only usable as a contiguous run of pages from page 0 (a missing page makes every later page useless),
//   so spreading it would make the loss of any master cut every session short; tagged, a lost master loses whole
//   sessions and leaves the others complete. A next turn's lookup then goes to one master (one round trip).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dhs::memd {

inline constexpr std::string_view kClusterKeyVersion = "dhs1";

struct ClusterKeyConfig {
  // Shared prefix pages: immutable and content-addressed, so a long TTL only costs store memory (1 hour).
  uint32_t prefix_ttl_ms = 3'600'000;
  // A finished turn's session pages: useful until the conversation's next turn (30 minutes).
  uint32_t session_ttl_ms = 1'800'000;
};

uint64_t SessionHash(std::string_view tenant, std::string_view session_id);

// Keys as in the header comment. `space` is GeometryFingerprint(geometry).
std::string PrefixPageKey(uint64_t space, uint64_t address_key);
std::string SessionPageKey(uint64_t space, std::string_view tenant, std::string_view session_id, uint64_t chain,
                           uint32_t page);
// The same key from the session hash (SessionHash(tenant, session id)): what a lookup by a session address
// (memd/prefix_pages.h PrefixAddress::session) names.
std::string SessionPageKey(uint64_t space, uint64_t session_hash, uint64_t chain, uint32_t page);

}  // namespace dhs::memd
