#include "memd/core_state.h"

#include <string>

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/worker_shape.h"

namespace dhs::memd::core {

absl::Status CheckShare(RequestId request, uint32_t required, const SpeculationShare& share,
                        const GpuDeclaration& declared) {
  if (share.empty()) return absl::OkStatus();
  const auto bad = [request](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrFormat("request %d: speculation share: %s", request, why));
  };
  if (share.pages() > required) {
    return bad(absl::StrFormat("draft ring %d + staging %d pages exceed its %d required pages", share.draft_ring_pages,
                               share.staging_pages, required));
  }
  if (declared.page_bytes == 0) return bad("its GPU's Hello declared no page_bytes");
  // The rounding workerd declares with (SessionRequiredPages, common/worker_shape.h).
  const auto pages_of = [&](uint64_t bytes) { return CeilDiv(bytes, declared.page_bytes); };
  if (pages_of(share.draft_ring_bytes) != share.draft_ring_pages ||
      pages_of(share.staging_bytes) != share.staging_pages) {
    return bad(absl::StrFormat(
        "draft ring %d bytes in %d pages and staging %d bytes in %d pages, but pages of %d bytes need %d and %d",
        share.draft_ring_bytes, share.draft_ring_pages, share.staging_bytes, share.staging_pages, declared.page_bytes,
        pages_of(share.draft_ring_bytes), pages_of(share.staging_bytes)));
  }
  if (share.draft_ring_bytes > declared.draft_ring_bytes || share.staging_bytes > declared.staging_bytes) {
    return bad(absl::StrFormat(
        "draft ring %d and staging %d bytes exceed its GPU's declared totals (Hello: draft ring %d, staging %d bytes)",
        share.draft_ring_bytes, share.staging_bytes, declared.draft_ring_bytes, declared.staging_bytes));
  }
  return absl::OkStatus();
}

void CountShare(Gpu& g, const SpeculationShare& share, int sign) {
  if (sign > 0) {
    g.speculation += share;
  } else {
    g.speculation -= share;
  }
}

SlotIndex FreeSlot(const Gpu& g) {
  const SlotIndex slot = g.released_slots.empty() ? g.slot_high : *g.released_slots.begin();  // lowest free
  return g.request_slots != 0 && slot >= g.request_slots ? kNoSlot : slot;
}

void TakeSlot(Gpu& g, SlotIndex slot) {
  g.used_slots.insert(slot);
  if (slot >= g.slot_high) {  // above the high mark (a report's slot): the slots skipped are free
    for (SlotIndex s = g.slot_high; s < slot; ++s) g.released_slots.insert(s);
    g.slot_high = slot + 1;
  } else {
    g.released_slots.erase(slot);
  }
}

void ReleaseSlot(Gpu& g, SlotIndex slot) {
  g.used_slots.erase(slot);
  g.released_slots.insert(slot);
}

void Reindex(Request& r, Gpu& g) {
  if (r.state == RequestState::kAdmitted && r.optional_history && r.host_only > 0) {
    g.populatable.insert(r.id);
  } else {
    g.populatable.erase(r.id);
  }
  if (r.victim_key) {
    g.victims.Erase(*r.victim_key);
    r.victim_key.reset();
  }
  if (r.state != RequestState::kAdmitted || r.optional == 0 || r.backoff) return;
  r.victim_key = ReclaimCandidate{r.id, r.time_us, r.seq, r.optional};
  g.victims.Insert(*r.victim_key);
}

std::vector<ReclaimCandidate> VictimCandidates(const State& s, GpuId gpu, bool skip_backoff) {
  std::vector<ReclaimCandidate> out;
  for (const auto& [id, r] : s.requests) {
    if (r.gpu != gpu || r.state != RequestState::kAdmitted || r.optional == 0) continue;
    if (skip_backoff && r.backoff) continue;
    out.push_back({id, r.time_us, r.seq, r.optional});
  }
  return out;
}

}  // namespace dhs::memd::core
