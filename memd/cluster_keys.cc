// memd/cluster_keys.cc: see cluster_keys.h.
#include "memd/cluster_keys.h"

#include <xxhash.h>

#include "absl/strings/str_format.h"
#include "memd/prefix_pages.h"

namespace dhs::memd {

uint64_t SessionHash(std::string_view tenant, std::string_view session_id) {
  return XXH3_64bits_withSeed(session_id.data(), session_id.size(), PrefixPages::TenantHash(tenant));
}

std::string PrefixPageKey(uint64_t space, uint64_t address_key) {
  return absl::StrFormat("%s:%016x:p:%016x", kClusterKeyVersion, space, address_key);
}

std::string SessionPageKey(uint64_t space, std::string_view tenant, std::string_view session_id, uint64_t chain,
                           uint32_t page) {
  return SessionPageKey(space, SessionHash(tenant, session_id), chain, page);
}

std::string SessionPageKey(uint64_t space, uint64_t session_hash, uint64_t chain, uint32_t page) {
  return absl::StrFormat("%s:%016x:s:{%016x}:%016x:%d", kClusterKeyVersion, space, session_hash, chain, page);
}

}  // namespace dhs::memd
