// memd/cluster_sessions.h: which pages of a finished turn go to the cluster tier under its session (issue 26,
// "Sessions across nodes"; docs/cluster_tier.md "Sessions"). A pure decision: the request's history pages and the
// worker's page digests in, the pages to publish out; the daemon reads their bytes and offers them to the write-behind
// queue under memd/cluster_keys.h's session key (ClusterTier::OfferSession).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/types.h"
#include "memd/core_state.h"
#include "memd/prefix_pages.h"

namespace dhs::memd {

// One history page of a finished turn to publish under its session: its bytes are in host page `host_page` until the
// request's Complete releases it (the daemon encodes the value before that event).
struct SessionPublishPage {
  uint32_t page = 0;         // history page h
  PageIndex host_page = 0;   // where its confirmed host copy is
  uint64_t checksum = 0;     // the confirmed copy's checksum (common/page_checksum.h), nonzero
  uint64_t digest = 0;       // the worker's digest of tokens [0, (h + 1) * p) (common/session_digest.h): <chain>
};

// The pages of `r`'s history to publish under its session at its Complete, ascending history page: every history
// page h < min(digests.size(), r.history.size()) that
// - holds a confirmed complete host copy (kHost, kPopulating, kGpuAndHost: a hisparse request's confirmed pages, an
//   adaptive request's backed-up ones) with a known checksum (a page without one is never imported anywhere), and
// - is not one of its shareable prefix pages (r.prefix[h] a block-chain address): those are published and found under
//   their prefix key (the content-addressed tier), so the session key would only store them twice, and
// - is not a shared page r holds (`held(h)` true: a page it was granted from the host tier, e.g. a session page an
//   earlier turn published and this node imported: the store has it under the same key already).
// `digests[h]` is Complete.session_page_digests[h]. Pages in the worker's tail (kHostPending), on GPU only or lost
// are not published: the next turn recomputes them. `held` may be empty (nothing held).
std::vector<SessionPublishPage> SessionPagesToPublish(const core::Request& r, std::span<const uint64_t> digests,
                                                      const std::function<bool(uint32_t)>& held = nullptr);

// Issue 26, the lookup at a next turn's admission: what to ask the store for the pages the core names
// (ResidencyManager::ClusterLookups: the chain's block addresses, then session addresses). A next turn's chain may
// cover pages the previous turn held beyond ITS chain (its partial last block, its answer, completed into blocks by the
// next turn's tokens): the store has those under their session key only. So for each block address of a session
// admission whose page has a session digest, the session address of that page is asked too (an alternate, in the same
// batch). A page found there holds the rows of exactly the tokens [0, (h + 1) p) the digest names, i.e. this
// admission's rows of page h: it is imported under the block address (shared locally like a prefix page).
struct ClusterAsk {
  std::vector<PrefixAddress> asked;  // the wanted addresses in order, then the alternates
  std::vector<int32_t> alternate;    // per wanted address: the index in `asked` of its session alternate, or -1
};
// `wanted` = ClusterLookups' answer; `tenant` = PrefixPages::TenantHash(tenant), `session_hash` (0: no session: no
// alternates), `digests` = the admission's session digests, `page_rows` its page rows.
ClusterAsk SessionAlternates(std::span<const PrefixAddress> wanted, uint64_t tenant, uint64_t session_hash,
                             std::span<const uint64_t> digests, uint32_t page_rows);
// Which answer serves wanted page i: the index in `asked` of its own answer when found, else of its alternate's when
// found, else -1 (a miss). `found[k]` = whether asked[k] was found and checked.
int32_t ServedBy(const ClusterAsk& ask, const std::vector<bool>& found, size_t i);

}  // namespace dhs::memd
