// common/page_checksum.h: the checksum of a confirmed host page (issue 22, "Host-page integrity";
// docs/architecture.md "Host pages", "Host-page integrity").
//
// A host page holds p positions' payload rows followed by their index keys (workerd/kv/layout.h, KvLayout); its
// checksum is XXH3-64 (libxxhash) of ALL its host_page_bytes, computed by the worker that wrote it once the
// device->host copy completed and the positions' keys were stored, and carried with the page's confirmation
// (HostCopyWritten, BackupComplete) to memd, which keeps it with the confirmed copy (its journal included) and hands
// it to a resuming worker (AdmitGrant.host_backed_checksums). A page is verified against it before its bytes are
// used again: imported by a resume, recovered by the resolver, populated host->device.
//
// kNoChecksum (0) means "none known" on the wire and in memd's journal (an older peer, or a page adopted from a
// journal that predates checksums). PageChecksum never returns it (a hash of 0 is reported as 1), so a known
// checksum is never mistaken for none; a page with none is never imported (its rows are recomputed).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

namespace dhs {

inline constexpr uint64_t kNoChecksum = 0;

// XXH3-64 of `page` (seed 0), with 0 mapped to 1 (on x86-64 through libxxhash's CPU dispatch: AVX2 where present).
// Cost: linear in bytes (about 8-14 GB/s on one core here, see
// docs/performance.md "Host-page integrity").
uint64_t PageChecksum(std::span<const uint8_t> page);

// True when `expected` is a known checksum (not kNoChecksum) equal to PageChecksum(page).
bool PageChecksumMatches(std::span<const uint8_t> page, uint64_t expected);

}  // namespace dhs
