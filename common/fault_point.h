// common/fault_point.h: test-only fault injection (issue 11): a worker started with `--fault-kill-at KIND:N` SIGKILLs
// itself at the N-th time its serving loop reaches a point of that kind, so that a test forces the interleaving it
// wants (a kill right after a backup copy was issued, in the middle of a populate, ...) instead of hoping a timed kill
// lands there. Nothing happens unless a kill was armed (ArmFaultKill); an unarmed ReachFaultPoint costs one relaxed
// atomic load.
//
// The points (where workerd calls ReachFaultPoint):
//   prefill   Worker::RunBatch: a model step that computed a prompt chunk of some request, before its tokens are
//             committed to memd or sent
//   decode    Worker::RunBatch: a model step that decoded a token of some request, before it is committed or sent
//   backup    HierarchicalKvAccess: right after a device->host backup copy of a page was issued (not yet complete,
//             not yet reported to memd)
//   populate  ResidencyAgent::OnPopulateOrder: the order's host->device copies issued, none published or answered
//   reclaim   ResidencyAgent::OnReclaimOrder: the order's backups issued, BackupComplete not sent
//   complete  Worker::OnCompleteAck: memd acknowledged a request's Complete (it released the request and its record)
//             while its final chunk has not left the worker: a worker armed at this kind keeps every final TokenChunk
//             back (ServingFrontend never sends it; FaultKillArmedAt), modelling a final chunk still queued in the
//             dying process (the client outbox, or ZeroMQ's send queue, which its I/O thread writes out on its own
//             schedule, independent of the memd socket's). The "lost end" interleaving of workerd/README.md "Restart".
//
// Thread-safety: ArmFaultKill before the serving threads start; ReachFaultPoint from any thread; FaultCounter none.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace dhs {

enum class FaultPoint : uint8_t { kPrefill = 0, kDecode = 1, kBackup = 2, kPopulate = 3, kReclaim = 4, kComplete = 5 };
inline constexpr size_t kFaultPoints = 6;
// "prefill", "decode", "backup", "populate", "reclaim", "complete"
std::string_view FaultPointName(FaultPoint point);

// Kill at the nth (>= 1) arrival at `point`.
struct FaultKill {
  FaultPoint point = FaultPoint::kDecode;
  uint64_t nth = 1;
  bool operator==(const FaultKill&) const = default;
};

// "KIND:N" (KIND one of the names above, N a decimal in [1, 2^63)). INVALID_ARGUMENT naming the problem otherwise.
absl::StatusOr<FaultKill> ParseFaultKill(std::string_view spec);
std::string FormatFaultKill(const FaultKill& kill);  // "KIND:N", the inverse of ParseFaultKill

// Counts arrivals per point; Reach says whether this arrival is the armed one (true exactly once, at the nth arrival
// of the armed kind; never when unarmed). Pure bookkeeping, no signals.
class FaultCounter {
 public:
  explicit FaultCounter(std::optional<FaultKill> armed = std::nullopt) : armed_(armed) {}
  bool Reach(FaultPoint point);
  uint64_t count(FaultPoint point) const { return counts_[static_cast<size_t>(point)]; }

 private:
  std::optional<FaultKill> armed_;
  std::array<uint64_t, kFaultPoints> counts_{};
};

// Arms the process-wide kill (workerd's --fault-kill-at). Call once, before any thread reaches a point.
void ArmFaultKill(const FaultKill& kill);
// Counts an arrival at `point`; at the armed arrival writes "fault injection: SIGKILL at KIND:N" to stderr and raises
// SIGKILL (the process dies there, as under `kill -9`). No-op unless armed.
void ReachFaultPoint(FaultPoint point);
// Whether the process-wide kill is armed at a point of kind `point` (false when unarmed).
bool FaultKillArmedAt(FaultPoint point);

}  // namespace dhs
