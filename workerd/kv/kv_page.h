// workerd/kv/kv_page.h: the worker's record of one history page of a request (brief §4): where its rows have a copy
// besides the tail. A page has two copies with lives of their own, each a state changed only through
// TransitionPage(), which checks the move against that copy's table (the pattern of memd/history_page.h):
//
//   host copy (HostCopy)                                  GPU copy (GpuCopy, optional history)
//   kNone      no host page (host_page = -1)              kNone     no device page (device_page = -1)
//   kWriting   backup issued into host_page, in flight    kFilling  keep (device->device) or populate copy into
//   kWritten   backup completed (host-ready)                        device_page in flight; not in the ready map
//   kVerified  host-ready, bytes checked against checksum kReady    in the ready map (set only after the copy ended)
//   kImported  a resume's confirmed copy taken over (host-ready; never written again, no backup, no index key;
//              nothing left to verify: its checksum was checked by CheckHostCopies before the import)
//
// Two enums rather than one: the two copies change independently (a page may be kWriting and kReady at once), so one
// product enum would list 15 states and every move 3 or 5 times. The safety invariant (brief §4: a row leaves the tail
// only once its page is host-ready or ready on GPU) is checked by HierarchicalKvAccess::FreeTailSlot on these states.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "workerd/device/device.h"

namespace dhs {

enum class HostCopy : uint8_t {
  kNone = 0,      // no host copy
  kWriting = 1,   // backup issued (host_page >= 0), its copy in flight
  kWritten = 2,   // backup completed: host-ready
  kVerified = 3,  // host-ready and its bytes matched the page's checksum once (issue 22)
  kImported = 4,  // host-ready: a resume's confirmed copy (HierarchicalKvAccess::ImportHostPages)
};

enum class GpuCopy : uint8_t {
  kNone = 0,     // no optional-history device page
  kFilling = 1,  // device_page >= 0, the keep or populate copy in flight
  kReady = 2,    // the ready-map entry: readable on GPU
};

std::string_view HostCopyName(HostCopy state);
std::string_view GpuCopyName(GpuCopy state);

// Every allowed move, with the event that makes it (nothing else may change a page's copies):
inline constexpr std::pair<HostCopy, HostCopy> kHostCopyTransitions[] = {
    {HostCopy::kNone, HostCopy::kWriting},      // IssueBackup (a completed page, BackupPages, BackupHeldPage, ...)
    {HostCopy::kWriting, HostCopy::kWritten},   // Poll: the backup completed
    {HostCopy::kWriting, HostCopy::kNone},      // Poll: the backup failed (its host page freed after the copy)
    {HostCopy::kWritten, HostCopy::kVerified},  // VerifyHostPage: the bytes match the checksum
    {HostCopy::kNone, HostCopy::kImported},     // ImportHostPages (resume, issue 11)
};
inline constexpr std::pair<GpuCopy, GpuCopy> kGpuCopyTransitions[] = {
    {GpuCopy::kNone, GpuCopy::kFilling},   // KeepOptional (kept page, adaptive mode), Populate
    {GpuCopy::kFilling, GpuCopy::kReady},  // Poll: the copy completed (the ready-map entry is published)
    {GpuCopy::kFilling, GpuCopy::kNone},   // Poll: the copy failed; or WithdrawReady before it was published
    {GpuCopy::kReady, GpuCopy::kNone},     // WithdrawReady
};

struct KvPage {
  HostCopy host = HostCopy::kNone;
  int64_t host_page = -1;  // the host page of the copy (kWriting and after), -1 with kNone
  CopyEvent backup;
  // Host-page integrity (issue 22; common/page_checksum.h): the page's checksum (payload and keys, all
  // host_page_bytes) once its host copy is confirmed: recorded by Poll when the worker's own backup completed, or
  // taken from memd's grant for a resume's imported page; kNoChecksum until then. Checked once per page (kVerified):
  // a confirmed host page is immutable while the request holds it (docs/architecture.md "Host-page integrity").
  uint64_t checksum = 0;
  GpuCopy gpu = GpuCopy::kNone;
  int64_t device_page = -1;  // the optional-history device page (kFilling, kReady), -1 with kNone
  CopyEvent populate;

  // A completed host copy (kWritten, kVerified, kImported).
  bool HostReady() const { return host == HostCopy::kWritten || host == HostCopy::kVerified || Imported(); }
  bool Imported() const { return host == HostCopy::kImported; }
  // Nothing left to check before its host bytes are used (kVerified; kImported: checked before the import).
  bool Verified() const { return host == HostCopy::kVerified || Imported(); }
  // In the ready map.
  bool Ready() const { return gpu == GpuCopy::kReady; }
};

// Moves `page`'s host (or GPU) copy from `from` to `to`. Errors: FAILED_PRECONDITION when the copy is not in `from`
// or the move is not in kHostCopyTransitions (kGpuCopyTransitions); the page is then unchanged.
absl::Status TransitionPage(KvPage& page, HostCopy from, HostCopy to);
absl::Status TransitionPage(KvPage& page, GpuCopy from, GpuCopy to);

}  // namespace dhs
