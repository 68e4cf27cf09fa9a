#include "memd/population_scheduler.h"

#include <algorithm>

namespace dhs::memd {

std::vector<PopulationGrant> PopulationScheduler::Plan(std::span<const PopulationCandidate> candidates,
                                                       uint32_t budget_pages) {
  std::vector<PopulationGrant> grants;
  const size_t n = candidates.size();
  if (n == 0) return grants;
  uint32_t budget = std::min(budget_pages, max_pages_);
  // Start with the first candidate after the one served last (wrapping around).
  size_t start = 0;
  if (last_) {
    while (start < n && candidates[start].request <= *last_) ++start;
    if (start == n) start = 0;
  }
  std::vector<uint32_t> given(n, 0);
  std::vector<size_t> order;  // first-served order of candidate indexes
  bool progress = true;
  while (budget > 0 && progress) {
    progress = false;
    for (size_t k = 0; k < n && budget > 0; ++k) {
      const size_t i = (start + k) % n;
      if (given[i] >= candidates[i].missing_pages) continue;
      if (given[i] == 0) order.push_back(i);
      ++given[i];
      --budget;
      last_ = candidates[i].request;
      progress = true;
    }
  }
  for (size_t i : order) grants.push_back({candidates[i].request, given[i]});
  return grants;
}

}  // namespace dhs::memd
