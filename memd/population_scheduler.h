// memd/population_scheduler.h: the bounded round-robin population scheduler (brief §4, "Population ordering").
//
// Pure: given the requests whose history is not fully on GPU (with how many pages each misses) and the free pages
// it may hand out, it plans one population attempt: one page per request in turn, round-robin, starting after the
// request served last, until the budget, the per-attempt bound or the candidates' needs run out.
// The ResidencyManager decides the budget (free pages beyond the reserve, zero while an admission is queued) and
// carries the plan out.
//
// Thread-safety: none (it remembers the round-robin cursor); one owner.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "common/types.h"

namespace dhs::memd {

struct PopulationCandidate {
  RequestId request = 0;
  uint32_t missing_pages = 0;  // history pages with a host copy but not on GPU
};

struct PopulationGrant {
  RequestId request = 0;
  uint32_t pages = 0;
};

class PopulationScheduler {
 public:
  // `max_pages_per_attempt` bounds one attempt (0 disables population).
  explicit PopulationScheduler(uint32_t max_pages_per_attempt) : max_pages_(max_pages_per_attempt) {}

  // `candidates` sorted by ascending request id (duplicates not allowed); `budget_pages` free pages it may give.
  // Returns the grants in the order served (each request at most once, pages > 0) and moves the cursor.
  std::vector<PopulationGrant> Plan(std::span<const PopulationCandidate> candidates, uint32_t budget_pages);

  uint32_t max_pages_per_attempt() const { return max_pages_; }
  std::optional<RequestId> last_served() const { return last_; }

 private:
  uint32_t max_pages_;
  std::optional<RequestId> last_;  // the request that got the last page of the previous attempt
};

}  // namespace dhs::memd
