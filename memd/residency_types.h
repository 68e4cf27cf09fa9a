// memd/residency_types.h: the values memd's core takes in (brief §3, §4): its configuration, a Hello's declaration,
// an admission, a speculation share, and what a restart adopts (a dead memd's journal, a surviving worker's report).
// The events that take them: memd/residency_manager.h.
//
// Unit: a "page" is one page of a GPU's KV pools (p positions of the request's payload sources) and one host pool
// page holds the same rows; host pages are accounted under SourceId 0 (kAllSources) per request.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/types.h"
#include "memd/prefix_pages.h"
#include "memd/reclaim_policy.h"  // kDefaultReclaimPolicy

namespace dhs::memd {

inline constexpr SourceId kAllSources = 0;

// Upper bounds of a Hello (RegisterGpu), so a worker's number never makes memd allocate without bound: M per GPU at
// most 2^26 = 67,108,864 pages (an H200 has about 2.5M pages of 55,296 bytes: 26x headroom; memd's page table costs
// ~13 bytes a page, 0.9 GB at the bound), request slots at most 2^16 per GPU.
inline constexpr uint32_t kMaxGpuPages = uint32_t{1} << 26;
inline constexpr uint32_t kMaxRequestSlots = uint32_t{1} << 16;
// A Hello's page_bytes at most 2^37 bytes (128 GiB a page): M * page_bytes then fits 64 bits, and so does the sum of a
// GPU's speculation shares' bytes (each at most its pages * page_bytes).
inline constexpr uint64_t kMaxGpuPageBytes = uint64_t{1} << 37;
// The longest reclaim back-off of a victim whose backups keep failing, in RetryBackups() calls (1 s each in memd).
inline constexpr uint32_t kMaxRetryTicks = 64;

struct ResidencyConfig {
  uint32_t reserve_pages = 0;             // M_res per GPU
  uint32_t host_pages = 0;                // host pool size, pages
  uint64_t host_page_bytes = 1;           // bytes per host page
  uint32_t populate_pages_per_attempt = 8;
  std::string reclaim_policy{kDefaultReclaimPolicy};  // memd/reclaim_policy.h; chosen by measurement (memd/README.md)
  // The content-addressed host tier (issue 24, memd/prefix_pages.h): off by default (memd --prefix-sharing off):
  // admissions' prefix chains are then ignored and memd behaves exactly as without it.
  bool prefix_sharing = false;
  PrefixConfig prefix = {};  // eviction policy, per-tenant quota (used when prefix_sharing)
};

// A request slot's share of its worker's speculation memory, a required allocation (brief §2 "required allocation",
// §6 "Staging" and "Draft KV ring", §8 "with a drafter": add R_d * draft_bytes_per_row and M_stage / N per session).
// The pages are part of the request's required_pages (admission counts them like the hot cache and tail: a GPU whose
// pages go to draft rings and staging admits fewer sessions); the bytes are what they stand for.
struct SpeculationShare {
  uint32_t draft_ring_pages = 0;  // ceil(draft_ring_bytes / page_bytes)
  uint32_t staging_pages = 0;     // ceil(staging_bytes / page_bytes)
  uint64_t draft_ring_bytes = 0;  // R_d * draft_bytes_per_row: one slot's draft KV ring (0 without a drafter)
  uint64_t staging_bytes = 0;     // M_stage / N = χ * K_max * k * d_KV: one slot's staging rows (0: no speculation)
  uint64_t pages() const { return uint64_t{draft_ring_pages} + staging_pages; }
  bool empty() const { return pages() == 0 && draft_ring_bytes == 0 && staging_bytes == 0; }
  // Field by field: a GPU's sums over its admitted requests' shares (no overflow check: bounded by M and the Hello).
  SpeculationShare& operator+=(const SpeculationShare& o) {
    draft_ring_pages += o.draft_ring_pages;
    staging_pages += o.staging_pages;
    draft_ring_bytes += o.draft_ring_bytes;
    staging_bytes += o.staging_bytes;
    return *this;
  }
  SpeculationShare& operator-=(const SpeculationShare& o) {
    draft_ring_pages -= o.draft_ring_pages;
    staging_pages -= o.staging_pages;
    draft_ring_bytes -= o.draft_ring_bytes;
    staging_bytes -= o.staging_bytes;
    return *this;
  }
  bool operator==(const SpeculationShare&) const = default;
};

// What a worker's Hello declares of its GPU for the speculation shares of its admissions (RegisterGpu, AdoptGpu).
// page_bytes 0 (a Hello without it, e.g. the core's tests): no share is accepted on that GPU unless it is empty.
struct GpuDeclaration {
  uint64_t page_bytes = 0;        // bytes per GPU page (Hello.page_bytes), at most kMaxGpuPageBytes
  uint64_t draft_ring_bytes = 0;  // N * R_d * draft_bytes_per_row: the worker's draft rings of all N slots
  uint64_t staging_bytes = 0;     // M_stage = χ * N * K_max * k * d_KV
};

struct AdmitRequest {
  RequestId request = 0;
  GpuId gpu = 0;
  uint32_t required_pages = 0;  // > 0: hot cache + tail + metadata pages, + speculation.pages()
  // Part of required_pages (Admit refuses a share above it): the slot's draft ring and staging (issue 13).
  SpeculationShare speculation;
  uint32_t history_pages = 0;   // complete pages of imported history (candidates for optional history)
  uint32_t context_pages = 0;   // pages of the full context (input + max_new) >= history_pages; each gets a host page
  // page_rows > 0: the core computes context_pages = ceil(context_rows / page_rows) itself (the wire's history_rows;
  // InvalidArgument when that is beyond 2^32-1 pages) and context_pages above is ignored.
  uint64_t context_rows = 0;
  uint32_t page_rows = 0;
  // false: the request never holds optional history (hisparse mode, issue 5): none of its history is kept on GPU at
  // the grant and population never brings it back; it is never a reclaim victim.
  bool optional_history = true;
  // Resume from host KV after a worker restart (issue 11): host_backed with resume_of = the interrupted request of
  // an earlier epoch of the same GPU this admission continues. Both or neither.
  bool host_backed = false;
  RequestId resume_of = 0;
  // Prefix sharing (issue 24; ignored when it is off): the request's tenant and prefix chain. Needs page_rows > 0
  // (the page geometry the addresses depend on). Its shareable pages (prefix_pages.h) that are stored with the same
  // content are granted as host-backed (imported, counted once in the host pool); the others it computes become
  // shared once their host copy is confirmed.
  PrefixChain prefix;
  // Issue 26 (sessions across nodes; ignored while prefix sharing is off): the session hash (memd/cluster_keys.h
  // SessionHash(prefix.tenant, session id); 0 = none) and the session digests of the input's complete pages
  // (AdmitRequest.session_page_digests, page 0 first). The pages after the chain's shareable ones get session
  // addresses (PrefixPages::SessionAddress), up to the context: found stored (a page imported from the cluster tier),
  // they are granted as host hits like prefix pages; never written under them here.
  uint64_t session_hash = 0;
  std::vector<uint64_t> session_digests;
};

// One shared prefix page of a dead memd's journal (issue 24), adopted as a cached page by AdoptHostPages.
struct AdoptedSharedPage {
  PageIndex host_page = 0;
  uint64_t key = 0;
  uint64_t content = 0;
  uint64_t checksum = 0;
};

// One request of a dead memd's journal, adopted by a new memd (AdoptHostPages).
struct AdoptedRequest {
  RequestId request = 0;
  GpuId gpu = 0;
  uint32_t epoch = 1;          // the epoch of its GPU it was admitted in (>= 1): the GPU's next registration is later
  uint32_t context_pages = 0;  // pages of its full context (<= host pool pages)
  std::map<uint32_t, PageIndex> host_pages;  // history page -> host page holding a confirmed host copy
  std::map<uint32_t, uint64_t> checksums;    // history page -> its copy's checksum (issue 22; absent/0 = none known)
  // Issue 24: the prefix chain of its admission and its GPU's page rows (its record's; none: page_rows 0): with
  // sharing on, its shareable pages stored with the same address and content are held by it again (kHost).
  PrefixChain prefix;
  uint32_t page_rows = 0;
};

// One history page of a live request as a surviving worker reports it (AdoptGpu).
struct ReportedHistoryPage {
  PageIndex host_page = 0;            // the host page its grant assigned
  bool host_copy = false;             // the worker wrote that host page and reported it (HostCopyWritten / backup ok)
  std::optional<PageIndex> gpu_page;  // the optional GPU page it keeps (readable) with the rows; none: the rows are
                                      // in the worker's tail or only in the host copy
  uint64_t checksum = 0;              // its host copy's checksum as the worker reports it (issue 22; 0 = none known);
                                      // the journal's wins when it knows one
};

// One live (granted) request of a worker that survived a memd restart, as its re-Hello reports it (AdoptGpu).
struct ReportedRequest {
  RequestId request = 0;
  SlotIndex slot = 0;
  std::vector<PageIndex> required_pages;     // its required allocation (GPU pages, >= 1)
  uint32_t history_pages = 0;                // complete pages of imported history (the admission's)
  bool optional_history = true;
  std::vector<ReportedHistoryPage> history;  // one per page of its full context
  SpeculationShare speculation;              // part of required_pages, as its admission declared it
};


}  // namespace dhs::memd
