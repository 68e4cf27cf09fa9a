// workerd/kv_residency.h: the narrow surface of the KV hierarchy that the worker side of the memd conversation
// (ResidencyAgent, workerd/residency_agent.h) drives, in the brief's terms (§4): where a history page lives, the
// residency plan of a request (its host page per history page, the optional GPU pages it keeps), the reclaim steps
// (back up, withdraw, retire), populates, and the copies to wait for before a request's pages may be freed.
//
// Implementations: HierarchicalKvAccess (workerd/kv), and NoKvResidency below for `resident` mode, where every row
// stays on GPU and memd's orders find nothing to move. Units: history pages (page j = positions [j*p, j*p+p)),
// GPU pages of the optional pool, host pages of segment 0.
//
// Thread-safety: driven by one worker thread; no method is called concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"
#include "workerd/device/device.h"
#include "workerd/kv_access.h"

namespace dhs {

// Where one history page of a request is, as the memd conversation needs it. A host copy takes precedence: a
// populated page (on GPU and on host) reads kHostWritten.
enum class PageResidency {
  kNone,         // no copy and no plan: rows still being written (or in the tail), or an unknown page
  kKeepPlanned,  // planned to be kept on an optional GPU page when it completes; that page holds nothing yet
  kOnGpu,        // on an optional GPU page (kept or populated; the copy may still be in flight), no host copy
  kHostWriting,  // host copy issued, not completed yet
  kHostWritten,  // host copy completed
};

// The optional GPU page `device_page` as used by one request: the history page it holds or is planned to hold.
struct GpuPageUse {
  uint32_t page = 0;  // history page
  bool held = false;  // true: mapped (kept or populated, copy pending or ready); false: only planned to be kept
};

// Completions the worker reports to memd (KvResidency::Poll).
struct KvCompletions {
  // checksum: the host page's checksum (common/page_checksum.h) with an ok status, computed when the completion is
  // drained (every key of the page stored by then); kNoChecksum otherwise.
  struct Backup { RequestId request; uint32_t page; PageIndex host_page; absl::Status status; uint64_t checksum = 0; };
  // kept = true: a keep copy of adaptive mode (no PopulateOrder behind it; memd is not told).
  struct Published { RequestId request; uint32_t page; PageIndex device_page; absl::Status status; bool kept; };
  std::vector<Backup> backups;
  std::vector<Published> published;
};

// Copies of one request still in flight that must end before memd may hand its pages on (contract §5, §6).
struct RequestCopies {
  std::vector<std::pair<PageIndex, CopyEvent>> into_gpu;  // (optional GPU page, its keep or populate copy)
  std::vector<CopyEvent> to_host;                         // host backups still being written
};

class KvResidency {
 public:
  virtual ~KvResidency() = default;

  // The residency plan of `request` in request slot `slot` (memd's AdmitGrant.slot; the request is admitted into it
  // when new). host_pages[j]: host page of history page j; keep: (history page, optional GPU page) kept on GPU when the
  // page completes. Errors: INVALID_ARGUMENT (slot, device or host page out of range), FAILED_PRECONDITION (slot or
  // kept device page in use, the page already complete).
  virtual absl::Status PlanResidency(RequestId request, SlotIndex slot, std::span<const PageIndex> host_pages,
                                     std::span<const std::pair<uint32_t, PageIndex>> keep) = 0;
  virtual PageResidency Residency(RequestId request, uint32_t page) const = 0;
  // The history page of `request` that optional GPU page `device_page` holds or is planned to hold (O(1)).
  virtual std::optional<GpuPageUse> GpuPageOf(RequestId request, PageIndex device_page) const = 0;

  // Reclaim steps (contract §4). See HierarchicalKvAccess for the exact preconditions.
  virtual bool DropKeep(RequestId request, uint32_t page) = 0;
  virtual absl::StatusOr<bool> BackupInsteadOfKeep(RequestId request, uint32_t page, PageIndex host_page) = 0;
  virtual absl::Status RestoreKeep(RequestId request, uint32_t page, PageIndex device_page) = 0;
  // Backs up held page `page` (waits for its keep/populate copy first) into `host_page`; reported by Poll.
  virtual absl::Status BackupHeldPage(RequestId request, uint32_t page, PageIndex host_page) = 0;
  virtual absl::StatusOr<CopyEvent> WithdrawReady(RequestId request, std::span<const uint32_t> pages) = 0;
  virtual absl::Status Retire(std::span<const PageIndex> device_pages) = 0;
  // Populate order (contract §5): published by Poll once the copy completed.
  virtual absl::StatusOr<CopyEvent> Populate(RequestId request, uint32_t page, PageIndex device_page) = 0;
  virtual KvCompletions Poll() = 0;

  // The copies to wait for before the request can finish (brief §4); then Release frees its slot and pages.
  virtual RequestCopies CopiesInFlight(RequestId request) const = 0;
  // Host-page integrity (issue 22): the checksum of history page `page`'s confirmed host copy (payload and keys), as
  // the worker computed it after its copy completed or took it from the grant of a resume; kNoChecksum (0) when none
  // is known (no host copy, or its completion not drained by Poll yet).
  virtual uint64_t HostChecksum(RequestId /*request*/, uint32_t /*page*/) const { return 0; }
  virtual void Release(RequestId request) = 0;
};

// `resident` mode: nothing moves. Plans are accepted and ignored, every page reads kNone, orders find no page;
// Release releases the request's rows in `kv` (the resident store), which must outlive this object.
class NoKvResidency final : public KvResidency {
 public:
  explicit NoKvResidency(KvAccess* kv) : kv_(kv) {}
  absl::Status PlanResidency(RequestId, SlotIndex, std::span<const PageIndex>,
                             std::span<const std::pair<uint32_t, PageIndex>>) override {
    return absl::OkStatus();
  }
  PageResidency Residency(RequestId, uint32_t) const override { return PageResidency::kNone; }
  std::optional<GpuPageUse> GpuPageOf(RequestId, PageIndex) const override { return std::nullopt; }
  bool DropKeep(RequestId, uint32_t) override { return false; }
  absl::StatusOr<bool> BackupInsteadOfKeep(RequestId, uint32_t, PageIndex) override { return Refused(); }
  absl::Status RestoreKeep(RequestId, uint32_t, PageIndex) override { return Refused(); }
  absl::Status BackupHeldPage(RequestId, uint32_t, PageIndex) override { return Refused(); }
  absl::StatusOr<CopyEvent> WithdrawReady(RequestId, std::span<const uint32_t>) override { return Refused(); }
  absl::Status Retire(std::span<const PageIndex>) override { return absl::OkStatus(); }
  absl::StatusOr<CopyEvent> Populate(RequestId, uint32_t, PageIndex) override { return Refused(); }
  KvCompletions Poll() override { return {}; }
  RequestCopies CopiesInFlight(RequestId) const override { return {}; }
  void Release(RequestId request) override { kv_->Release(request); }

 private:
  static absl::Status Refused() {
    return absl::FailedPreconditionError("resident mode: every row stays on GPU, no page moves");
  }
  KvAccess* kv_;
};

}  // namespace dhs
