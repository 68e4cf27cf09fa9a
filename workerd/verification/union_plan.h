// workerd/verification/union_plan.h: the union retrieval plan of one speculative round for one (request, source)
// (brief §6 "Union retrieval", "Staging").
//
// Input: the K_r queries' ordered selections (each k positions, -1 padding), a predicate `ready(t)` (row t is in R_r:
// tail, hot cache or ready optional history; the resolver's direct and hot steps), the number of hot-cache slots the
// round may fill (`hot_budget`: free or unprotected victims), and the staging arena's capacity K_max * k rows.
// Output: each distinct missing row of U_r = ∪_j S_{r,j} (D_r = U_r \ R_r) copied exactly once, in order of first
// appearance (query order, then selection order, so the anchor's rows get hot slots first): the first `hot_budget` of
// them into hot slots 0, 1, .. (ordinals into the caller's victim list), the rest into staging rows 0, 1, ..; and for
// every (query, selection slot) where it reads: kNone for -1, kDirect for a ready row (the resolver's location), or the
// hot ordinal / staging row of its copy. Every query that selected a missing row reads the same copy.
//
// Several selections per query (the serving path: a query's top-k selection and its local window, brief §5): give
// `query_of`, one entry per selection, the query j (0 .. K_r - 1) each belongs to; K_r is then max + 1 and a
// selection may hold 1 .. k entries. Without it selection i is query i and holds exactly k entries. `reads` follows
// the selections, entry by entry (the sum of their sizes).
//
// Errors (INVALID_ARGUMENT, nothing planned): K_r = 0 or K_r > K_max, a selection not of k entries (at most k with
// `query_of`), `query_of` not one entry per selection or naming a query < 0, a position < -1, a position repeated
// within one selection, a position query j may not see (t > n_r + j, the causal mask). RESOURCE_EXHAUSTED (nothing
// planned): more distinct missing rows than hot_budget + K_max * k (only possible when windows add missing rows:
// the K_r <= K_max top-k selections alone never exceed the arena).
// Pure: the predicate is the only view of the KV state. Thread-safety: pure function.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::spec {

struct UnionPlanInput {
  std::span<const std::span<const Position>> selections;  // K_r selections of k entries each
  int64_t k = 0;
  int64_t k_max = 0;            // staging capacity is k_max * k rows
  Position frontier = 0;        // n_r: query j may select positions <= n_r + j
  int64_t hot_budget = 0;       // hot-cache slots the round may fill (>= 0)
  std::function<bool(Position)> ready;  // t in R_r
  std::span<const int64_t> query_of;    // optional: the query j of each selection (see above)
};

enum class ReadFrom : uint8_t { kNone, kDirect, kHot, kStaging };

struct ReadLocation {
  ReadFrom from = ReadFrom::kNone;
  int64_t index = -1;  // hot ordinal (kHot) or staging row (kStaging); -1 otherwise
  bool operator==(const ReadLocation&) const = default;
};

struct RowCopy {
  Position row = -1;
  ReadFrom to = ReadFrom::kHot;  // kHot or kStaging
  int64_t index = -1;            // hot ordinal or staging row
  bool operator==(const RowCopy&) const = default;
};

struct UnionPlan {
  std::vector<RowCopy> copies;       // |D_r| entries, first appearance order: hot copies, then staging copies
  std::vector<ReadLocation> reads;   // one per selected entry (K_r * k without query_of), selection-major
  int64_t hot_copies = 0, staging_copies = 0;
  int64_t direct_reads = 0;          // selected entries read directly
  int64_t shared_reads = 0;          // selected entries served by a copy another query (or entry) already caused
};

absl::StatusOr<UnionPlan> PlanUnion(const UnionPlanInput& input);

}  // namespace dhs::spec
