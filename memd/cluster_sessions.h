// memd/cluster_sessions.h: which pages of a finished turn go to the cluster tier under its session (issue 26,
// "Sessions across nodes"; docs/cluster_tier.md "Sessions"). A pure decision: the request's history pages and the
// worker's page digests in, the pages to publish out; the daemon reads their bytes and offers them to the write-behind
// queue under memd/cluster_keys.h's session key (ClusterTier::OfferSession).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/types.h"
#include "memd/core_state.h"

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
// - is not one of its shareable prefix pages (h >= r.prefix.size()): those are published and found under their prefix
//   key (the content-addressed tier), so the session key would only store them twice.
// `digests[h]` is Complete.session_page_digests[h]. Pages in the worker's tail (kHostPending), on GPU only or lost
// are not published: the next turn recomputes them.
std::vector<SessionPublishPage> SessionPagesToPublish(const core::Request& r, std::span<const uint64_t> digests);

}  // namespace dhs::memd
