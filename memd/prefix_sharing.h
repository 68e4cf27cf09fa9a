// memd/prefix_sharing.h: the core's prefix-sharing room (issue 24; issue 23 gave it its own place): it ties memd's
// requests to the content-addressed host tier (memd/prefix_pages.h) and owns that tier. Its one job: which host pages
// of a request are shared prefix pages, and what each request event does to them:
// - Admit: the content addresses of the admission's shareable pages (its prefix chain; request id kSharedOwner is
//   reserved while sharing is on);
// - a grant: the stored pages of the chain with the same content (hits: imported, not computed), the cached pages to
//   evict when the host pool lacks room (cached pages are room, never a reason to wait), the hits held and the
//   lookups counted, and the pages the request computes begun as writing pages (the tenant's quota may evict first);
// - a confirmed host copy of a writing page: the page becomes shared (the host pool's kSharedOwner, journal kShared);
// - the end of a request (Complete, a refused grant, a fence): references released (the last one makes the page
//   cached), unconfirmed writes abandoned;
// - recovery (memd/recovery.h): a resume's take-over moves references; a memd restart adopts the journal's shared
//   pages as cached ones;
// - the checks of all this against the requests and the host pool, and its part of the state dump.
//
// Like Recovery it works on the core's shared state (memd/core_state.h: requests, host pool, clock) inside one event
// of ResidencyManager, which owns both and calls it; it sends no orders, counts no events and pumps nothing. No
// sockets, no threads, no wall clock. Off (ResidencyConfig::prefix_sharing false, the default) there is no tier: every
// step is a no-op (no hits, no room from cached pages, no reference), so memd behaves exactly as without it.
//
// Invariants (CheckInvariants): a shared page's reference count = the number of requests holding it (their history, or
// a queued resume's taken-over pages, names it with a host copy); a shared or cached page is the host pool's
// kSharedOwner page, a writing page its writer's own page without a confirmed copy; no page both cached and free;
// shared + cached + private + free = the pool; no two tenants on one page.
//
// Thread-safety: none. One loop drives the core.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "memd/core_state.h"
#include "memd/prefix_pages.h"
#include "memd/residency_types.h"
#include "memd/state_dump.h"

namespace dhs::memd {

// A stored page an admission imports instead of computing it: its host page and its confirmed copy's checksum.
struct PrefixHit {
  PageIndex host_page = 0;
  uint64_t checksum = 0;  // common/page_checksum.h; 0 = none known
};
using PrefixHits = std::map<uint32_t, PrefixHit>;  // history page -> hit, ascending

// Issue 26, the cluster tier (docs/cluster_tier.md): a page that became a confirmed shared page, for the daemon to
// publish (its bytes are in host page `host_page` while the page stays stored).
struct ClusterPublishPage {
  PrefixAddress address;
  PageIndex host_page = 0;
  uint64_t checksum = 0;
  GpuId gpu = 0;  // the writer's GPU (whose worker's geometry the page has)
};
// A page found in the cluster tier whose bytes the daemon copied into reusable host page `host_page`.
struct ClusterImport {
  PrefixAddress address;
  PageIndex host_page = 0;
  uint64_t checksum = 0;  // the value's page checksum (what the importing worker checks)
};

class PrefixSharing {
 public:
  // `state` is the core's (owned by ResidencyManager, outlives this); `tier` the host tier (nullopt: sharing off).
  PrefixSharing(core::State& state, std::optional<PrefixPages> tier) : s_(state), tier_(std::move(tier)) {}

  bool on() const { return tier_.has_value(); }
  const PrefixPages* tier() const { return tier_ ? &*tier_ : nullptr; }  // nullptr when off
  // The tier's KV events since the last drain (PrefixPages::DrainKvEvents; empty when off).
  std::vector<KvEvent> DrainKvEvents() { return tier_ ? tier_->DrainKvEvents() : std::vector<KvEvent>{}; }

  // ---- Admit (nothing changes) ----
  // InvalidArgument for request id kSharedOwner while sharing is on (the host pool's owner of shared pages).
  absl::Status CheckRequestId(RequestId request) const;
  // The content addresses of the admission's shareable pages, ascending history page (empty when off or neither a
  // chain nor a session is named): its chain's pages [0, a), then (issue 26, sessions: session_hash nonzero and
  // session digests) the session addresses (PrefixPages::SessionAddress) of pages [a, min(digests, context_pages)).
  // `context_pages` is the admission's context in pages. Errors: InvalidArgument naming the request (a chain or
  // session digests without page_rows; a bad chain: PrefixPages::Addresses).
  absl::StatusOr<std::vector<PrefixAddress>> Addresses(const AdmitRequest& admission, uint32_t context_pages) const;

  // ---- a grant ----
  // r's shareable pages stored (shared or cached) with the same content, without counting the lookups (an admission
  // that waits asks on every attempt); a resume's own taken-over copy of a page wins over a hit.
  PrefixHits Hits(const core::Request& r) const;
  // Cached pages to evict (the tier's policy order; not pinned by a copy, not among `hits`) so that `need` host pages
  // are reusable: empty when they are already; nullopt when even every such cached page does not make room (always,
  // when sharing is off and the pool lacks room): the admission waits.
  std::optional<std::vector<PageIndex>> RoomFor(uint32_t need, const PrefixHits& hits) const;
  // The grant of `r` goes ahead: the lookups of its chain (but a resume's taken-over pages) are counted, its hits by
  // a session address counted as session_hits, `hits` held by r (a reference each), `evict` (RoomFor's answer)
  // evicted and their host pages freed.
  void Hold(const core::Request& r, const PrefixHits& hits, std::span<const PageIndex> evict);
  // The shareable pages a new grant of `r` computes become writing pages of their addresses (r's own host pages). A
  // page imported (kHost), or whose key is stored already (other content, or another writer), stays private; so does
  // one over its tenant's quota when no cached page of the tenant (not pinned) can be evicted to make room, and every
  // page at a session address (issue 26: lookup-only; a finished turn publishes its own pages to the cluster tier).
  void BeginWrites(const core::Request& r);
  // A refused grant after Hold: `hits`' references let go, then Release(r) (a resume's taken-over references).
  void Unhold(core::Request& r, const PrefixHits& hits);

  // ---- host copies and the end of a request ----
  // A confirmed host copy of r's history page `h` (with its checksum): when r was writing that page it becomes shared
  // (the host pool's owner kSharedOwner, journal kShared) and r its one holder. Else nothing.
  void Publish(core::Request& r, uint32_t h, uint64_t checksum);
  // The references and unconfirmed writes `r` holds, over its history (or a queued resume's taken-over pages): each
  // reference released (the last one makes the page cached), each write abandoned (the host page stays r's own). Its
  // private pages are the caller's to free. Returns the references released.
  uint32_t Release(core::Request& r);
  // The write of host page `page` by `r` ends unconfirmed (fence, failure): no-op when r does not write that page.
  void AbandonWrite(const core::Request& r, PageIndex page);

  // ---- recovery ----
  // A resume takes over the interrupted request's host page `page`: true when it is a shared page `from` holds (its
  // reference moves to `to`); false when it is not (the caller transfers the private page).
  bool Rehold(PageIndex page, RequestId from, RequestId to);
  // AdoptHostPages' check of the journal's shared pages against the host pool and `claimed` (the adopted requests'
  // host pages; the shared pages are added): InvalidArgument (out of range, a request's page, a key named twice).
  absl::Status CheckAdopted(std::span<const AdoptedSharedPage> shared, std::set<PageIndex>& claimed) const;
  // The journal's shared pages come back cached (host pool: kSharedOwner, confirmed). Off: nothing (the caller's
  // journal sweep frees them). Precondition: CheckAdopted passed. Returns the pages adopted.
  uint32_t Adopt(std::span<const AdoptedSharedPage> shared);

  // A surviving worker's report (memd restarted, docs/protocol.md "Re-Hello with a report") names host page `page` with
  // the checksum `checksum` for one of its requests: true when `page` is a stored page (shared or cached, not being
  // written) whose confirmed copy has that checksum (nonzero): the report may hold it. False otherwise (off, not
  // stored, no checksum known, another content): the caller treats the page as the request's own.
  bool ReportedHit(PageIndex page, uint64_t checksum) const;
  // The reported request `id` takes a reference to `page` (ReportedHit said true; a cached page becomes shared).
  void HoldReported(PageIndex page, RequestId id);

  // A request adopted from a dead memd's journal (interrupted) holds its shared prefix pages again: each shareable
  // page of `chain` (with `page_rows`) that r has no copy of (kLost) and that the tier stores with the same address and
  // content (adopted by Adopt first) becomes r's reference, kHost with the stored copy's checksum. Off, no chain, or a
  // bad chain: nothing. Returns the pages held.
  uint32_t HoldAdopted(core::Request& r, const PrefixChain& chain, uint32_t page_rows);

  // ---- issue 26: the cluster tier (the daemon does the store's I/O; this decides which pages) ----
  // The pages confirmed shared since the last drain that are still stored at the same host page (empty unless
  // PrefixConfig::cluster_outbox).
  std::vector<ClusterPublishPage> DrainClusterPublish();
  // Of `addresses` (an admission's, ascending page), the ones to ask the cluster tier for: every page from the first
  // one the host tier cannot serve (not stored with that content) whose key is not stored at all (a page being
  // written or of another content stays the local tier's business). Empty when off.
  std::vector<PrefixAddress> ClusterLookups(std::span<const PrefixAddress> addresses) const;
  // Up to `count` reusable host pages, ascending: where found pages may be copied (fewer: the pool lacks room; cached
  // pages are not evicted for the cluster tier).
  std::vector<PageIndex> ClusterRoom(uint32_t count) const;
  // Found pages, copied into their host pages, become cached shared pages (host pool: kSharedOwner, journal kShared,
  // confirmed with the checksum). All or nothing. Errors: FailedPrecondition (off, a page not reusable, a key stored
  // already, a host page named twice).
  absl::Status ImportCluster(std::span<const ClusterImport> pages);

  // ---- queries ----
  // True when host page `page` is a shared page request `id` holds a reference to.
  bool Holds(RequestId id, PageIndex page) const;
  // The shared references `r` holds (its history pages that are not kLost, and a queued resume's taken-over pages):
  // its private host pages are its pages less these.
  uint32_t Held(const core::Request& r) const;
  // Host pages the tier owns in the pool (shared + cached; 0 when off, where kSharedOwner is an ordinary id).
  uint32_t PoolPages() const;

  // ---- checks (parts of ResidencyManager::CheckInvariants; Internal errors) ----
  // The invariants above, and PrefixPages::CheckInvariants.
  absl::Status CheckInvariants() const;
  // r's history page h, when it is a shared page r holds (Holds): it must be a complete host copy (kHost,
  // kPopulating, kGpuAndHost). OK for a private page (the caller checks it as r's own).
  absl::Status CheckHeldPage(const core::Request& r, uint32_t h) const;
  // A held shared page's journal entry: kShared with the page's key, content and checksum.
  absl::Status CheckJournal(PageIndex page) const;

  // ---- introspection ----
  // The tier's counts and counters (O(1)); with `chains` the `prefixes` view: stored pages grouped by (tenant, blocks,
  // chain). Off: enabled false, nothing else.
  PrefixDump Dump(bool chains) const;

 private:
  void Evict(PageIndex page);  // a cached page forgotten, its host page freed

  core::State& s_;
  std::optional<PrefixPages> tier_;
  std::vector<ClusterPublishPage> cluster_outbox_;  // issue 26: PrefixConfig::cluster_outbox
};

}  // namespace dhs::memd
