// tools/replay/budget.h: the GPU KV budgets and host pool of the node dhs-replay starts (docs/replay.md,
// `--hbm-budget`, `--check-exact`). Every page count a request needs on GPU comes from the worker's own formula,
// `RequiredPages` (workerd/geometry.h), so the tool and the worker never disagree on whether a request fits.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "tools/replay/options.h"
#include "tools/replay/trace.h"
#include "workerd/geometry.h"

namespace dhs::replay {

// The node geometry the worker will use for `hbm_budget` bytes (ComputeGeometry, the worker's code), so memd's page
// size matches. Errors: those of PresetConfig and ComputeGeometry.
absl::StatusOr<WorkerGeometry> ReplayGeometry(const ReplayOptions& options, uint64_t hbm_budget);

// Host pool: the pages of the full context of every request (brief §8 host tier), bytes, plus 64 pages of slack.
uint64_t HostPoolBytes(const Trace& trace, uint64_t page_bytes, uint64_t page_rows);

// Default GPU KV budget (`--hbm-budget` not given), bytes: per slot, the required pages (RequiredPages, hierarchical
// modes) of a request of the mean context plus optional history for half the mean context, + 8 pages; never less
// than the largest request's resident RequiredPages + 8. So adaptive mode reclaims and repopulates, and resident mode
// serves every request but cannot keep every session at once (brief §4).
uint64_t DefaultHbmBudget(const Trace& trace, const ReplayOptions& options);

// The budget of the --check-exact reference run (resident mode), bytes: every session's whole context resident at
// once (brief §7): the resident RequiredPages of the min(slots, requests) largest requests, whatever the budget of
// the run under test.
uint64_t ReferenceHbmBudget(const Trace& trace, const ReplayOptions& options);

}  // namespace dhs::replay
