// memd/core_dump.h: the core's introspection (brief §3): what one view of memd's state shows (dhsctl, /metrics, the
// tests), read from the core's state as a StateDump (memd/state_dump.h renders it, one rendering for all of them).
// Read-only, no sockets, no clock but the core's own (the dump's now_us). Per view its cost does not grow with M except
// for the `pages` view's scan (bounded by M; issue 12, memd/README.md "Introspection at scale").
//
// Thread-safety: none. Called inside the loop that drives the core (ResidencyManager::Dump).
#pragma once

#include "memd/core_state.h"
#include "memd/prefix_sharing.h"
#include "memd/reclaim_policy.h"
#include "memd/state_dump.h"

namespace dhs::memd::core {

// One view (DumpScopeOf): the counts and every GPU's row (fenced ones without page accounting), the scope's requests
// (each with its reclaim rank: its place in `policy`'s order of its GPU's victim candidates, -1 when none) and page
// rows, the host pool, and the host tier's counts (with its chains in the `prefixes` view).
StateDump DumpOf(const State& s, const ReclaimPolicy& policy, const PrefixSharing& prefix, const DumpScope& scope);
// kFull: every request and every up GPU's page rows (cost grows with M); kCounts: the counts only.
StateDump DumpOf(const State& s, const ReclaimPolicy& policy, const PrefixSharing& prefix, DumpDetail detail);

}  // namespace dhs::memd::core
