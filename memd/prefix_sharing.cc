#include "memd/prefix_sharing.h"

#include "spdlog/spdlog.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"

namespace dhs::memd {

using core::Request;

// ---------------------------------------------------------------- Admit

absl::Status PrefixSharing::CheckRequestId(RequestId request) const {
  if (!on() || request != kSharedOwner) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrFormat("request id %d is reserved (2^64-2 owns the shared host pages)", request));
}

absl::StatusOr<std::vector<PrefixAddress>> PrefixSharing::Addresses(const AdmitRequest& a,
                                                                     uint32_t context_pages) const {
  const bool session = a.session_hash != 0 && !a.session_digests.empty();
  if (!on() || (a.prefix.empty() && !session)) return std::vector<PrefixAddress>{};  // ignored while sharing is off
  if (a.page_rows == 0) {
    if (!session) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "request %d names a prefix chain of %d blocks without page_rows", a.request, a.prefix.block_ids.size()));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "request %d names %d session page digests without page_rows", a.request, a.session_digests.size()));
  }
  auto addresses = PrefixPages::Addresses(a.prefix, a.page_rows, context_pages);
  if (!addresses.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", a.request, ": ", addresses.status().message()));
  }
  // Issue 26: the input's further complete pages by their session address, after the chain's shareable pages.
  if (session) {
    const uint64_t tenant = PrefixPages::TenantHash(a.prefix.tenant);
    const size_t end = std::min<size_t>(a.session_digests.size(), context_pages);
    for (size_t h = addresses->size(); h < end; ++h) {
      addresses->push_back(PrefixPages::SessionAddress(tenant, a.session_hash, a.session_digests[h], a.page_rows,
                                                       static_cast<uint32_t>(h)));
    }
  }
  return addresses;
}

// ---------------------------------------------------------------- a grant

PrefixHits PrefixSharing::Hits(const Request& r) const {
  PrefixHits hits;
  if (!on()) return hits;
  for (const PrefixAddress& ad : r.prefix) {
    if (r.resumed_host.contains(ad.page)) continue;  // a resume's own copy wins
    if (auto page = tier_->Find(ad)) hits.emplace(ad.page, PrefixHit{*page, tier_->AtPage(*page)->checksum});
  }
  return hits;
}

std::optional<std::vector<PageIndex>> PrefixSharing::RoomFor(uint32_t need, const PrefixHits& hits) const {
  const uint32_t reusable = s_.host.reusable();
  if (need <= reusable) return std::vector<PageIndex>{};
  if (!on()) return std::nullopt;  // waits for host pages
  std::set<PageIndex> hit_pages;
  for (const auto& [h, hit] : hits) hit_pages.insert(hit.host_page);
  std::vector<PageIndex> evict = tier_->ChooseEvictions(need - reusable, [&](PageIndex p) {
    return !s_.host.is_pinned(p) && !hit_pages.contains(p);
  });
  if (evict.size() < need - reusable) return std::nullopt;  // cached pages included, it does not fit yet
  return evict;
}

void PrefixSharing::Hold(const Request& r, const PrefixHits& hits, std::span<const PageIndex> evict) {
  if (!on()) return;
  for (const PrefixAddress& ad : r.prefix) {
    // Issue 26: a session address is counted only when it hits (session_hits): it is not a prefix lookup.
    if (!r.resumed_host.contains(ad.page) && ad.session == 0) tier_->Lookup(ad);
  }
  for (const auto& [h, hit] : hits) {
    if (h < r.prefix.size() && r.prefix[h].session != 0) tier_->CountSessionHit();
    DHS_CHECK_OK(tier_->Acquire(hit.host_page, r.id, s_.clock()));
  }
  for (PageIndex p : evict) Evict(p);
}

void PrefixSharing::BeginWrites(const Request& r) {
  if (!on()) return;
  for (const PrefixAddress& ad : r.prefix) {
    if (ad.session != 0) continue;  // issue 26: lookup-only (the request's own rows of it stay private)
    const HistoryPage& hp = r.history[ad.page];
    if (hp.state == HistoryState::kHost || tier_->AtKey(ad.key) != nullptr) continue;  // imported, or taken
    if (auto victim = tier_->QuotaVictim(ad.tenant, [&](PageIndex p) { return !s_.host.is_pinned(p); })) {
      Evict(*victim);
    }
    const absl::Status s = tier_->BeginWrite(ad, hp.host_page, r.id, s_.clock());
    if (!absl::IsResourceExhausted(s)) DHS_CHECK_OK(s);  // the tenant's quota may refuse: the page stays private
  }
}

void PrefixSharing::Unhold(Request& r, const PrefixHits& hits) {
  if (!on()) return;
  for (const auto& [h, hit] : hits) DHS_CHECK_OK(tier_->Release(hit.host_page, r.id, s_.clock()));
  Release(r);
}

void PrefixSharing::Evict(PageIndex page) {
  DHS_CHECK_OK(tier_->Evict(page));
  DHS_CHECK_OK(s_.host.Free(page));
}

// ---------------------------------------------------------------- host copies and the end of a request

void PrefixSharing::Publish(Request& r, uint32_t h, uint64_t checksum) {
  if (!on()) return;
  const PageIndex page = r.history[h].host_page;
  const SharedPage* p = tier_->AtPage(page);
  if (p == nullptr || p->state != SharedPageState::kWriting || p->writer != r.id) return;
  const PrefixAddress address = p->address;
  DHS_CHECK_OK(tier_->ConfirmWrite(page, checksum, s_.clock()));
  DHS_CHECK_OK(s_.host.Share(page, address.key, address.content, checksum));
  if (tier_->config().cluster_outbox) cluster_outbox_.push_back({address, page, checksum, r.gpu});  // issue 26
}

// ---------------------------------------------------------------- issue 26: the cluster tier

std::vector<ClusterPublishPage> PrefixSharing::DrainClusterPublish() {
  std::vector<ClusterPublishPage> out;
  for (ClusterPublishPage& p : cluster_outbox_) {
    const SharedPage* sp = tier_ ? tier_->AtPage(p.host_page) : nullptr;
    if (sp != nullptr && sp->address.key == p.address.key && sp->state != SharedPageState::kWriting) {
      out.push_back(std::move(p));
    }
  }
  cluster_outbox_.clear();
  return out;
}

std::vector<PrefixAddress> PrefixSharing::ClusterLookups(std::span<const PrefixAddress> addresses) const {
  std::vector<PrefixAddress> out;
  if (!on()) return out;
  bool past_hits = false;
  for (const PrefixAddress& ad : addresses) {
    if (!past_hits && tier_->Find(ad).has_value()) continue;  // a local hit
    past_hits = true;
    if (tier_->AtKey(ad.key) == nullptr) out.push_back(ad);
  }
  return out;
}

std::vector<PageIndex> PrefixSharing::ClusterRoom(uint32_t count) const {
  return on() ? s_.host.FirstReusable(count) : std::vector<PageIndex>{};
}

absl::Status PrefixSharing::ImportCluster(std::span<const ClusterImport> pages) {
  if (!on()) return absl::FailedPreconditionError("cluster import with prefix sharing off");
  std::set<PageIndex> seen;
  std::set<uint64_t> keys;
  for (const ClusterImport& p : pages) {  // checked first: all or nothing
    if (!s_.host.is_reusable(p.host_page) || !seen.insert(p.host_page).second) {
      return absl::FailedPreconditionError(absl::StrFormat("cluster import: host page %d is not reusable", p.host_page));
    }
    if (tier_->AtKey(p.address.key) != nullptr || !keys.insert(p.address.key).second || tier_->AtPage(p.host_page)) {
      return absl::FailedPreconditionError(
          absl::StrFormat("cluster import: prefix page %016x is stored already", p.address.key));
    }
  }
  for (const ClusterImport& p : pages) {
    DHS_CHECK_OK(s_.host.AdoptShared(p.host_page, p.address.key, p.address.content, p.checksum));  // checked above
    DHS_CHECK_OK(tier_->Import(p.host_page, p.address, p.checksum, s_.clock()));
  }
  return absl::OkStatus();
}

uint32_t PrefixSharing::Release(Request& r) {
  if (!on()) return 0;
  uint32_t released = 0;
  auto let_go = [&](PageIndex page) {
    if (Holds(r.id, page)) {
      DHS_CHECK_OK(tier_->Release(page, r.id, s_.clock()));
      ++released;
    } else {
      AbandonWrite(r, page);
    }
  };
  for (const HistoryPage& hp : r.history) {
    if (hp.state != HistoryState::kLost) let_go(hp.host_page);
  }
  for (const auto& [h, page] : r.resumed_host) let_go(page);
  return released;
}

void PrefixSharing::AbandonWrite(const Request& r, PageIndex page) {
  if (!on()) return;
  const SharedPage* p = tier_->AtPage(page);
  if (p != nullptr && p->state == SharedPageState::kWriting && p->writer == r.id) {
    DHS_CHECK_OK(tier_->AbandonWrite(page));
  }
}

// ---------------------------------------------------------------- recovery

bool PrefixSharing::Rehold(PageIndex page, RequestId from, RequestId to) {
  if (!Holds(from, page)) return false;
  DHS_CHECK_OK(tier_->Rehold(page, from, to));
  return true;
}

absl::Status PrefixSharing::CheckAdopted(std::span<const AdoptedSharedPage> shared,
                                         std::set<PageIndex>& claimed) const {
  std::set<uint64_t> keys;
  for (const AdoptedSharedPage& sp : shared) {
    if (sp.host_page >= s_.host.pages() || claimed.contains(sp.host_page) || !keys.insert(sp.key).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "adopted shared page %d (key %016x): out of range, a request's page, or a key named twice", sp.host_page,
          sp.key));
    }
    claimed.insert(sp.host_page);
  }
  return absl::OkStatus();
}

uint32_t PrefixSharing::Adopt(std::span<const AdoptedSharedPage> shared) {
  if (!on()) return 0;  // with sharing off they are freed by the journal's sweep
  for (const AdoptedSharedPage& sp : shared) {
    DHS_CHECK_OK(s_.host.AdoptShared(sp.host_page, sp.key, sp.content, sp.checksum));  // CheckAdopted passed
    DHS_CHECK_OK(tier_->Adopt(sp.host_page, sp.key, sp.content, sp.checksum));
  }
  return static_cast<uint32_t>(shared.size());
}

// ---------------------------------------------------------------- queries

bool PrefixSharing::ReportedHit(PageIndex page, uint64_t checksum) const {
  if (!on() || checksum == 0) return false;
  const SharedPage* p = tier_->AtPage(page);
  return p != nullptr && p->state != SharedPageState::kWriting && p->checksum == checksum;
}

void PrefixSharing::HoldReported(PageIndex page, RequestId id) {
  DHS_CHECK_OK(tier_->Acquire(page, id, s_.clock()));  // ReportedHit said stored and confirmed; CheckReport: once
}

uint32_t PrefixSharing::HoldAdopted(Request& r, const PrefixChain& chain, uint32_t page_rows) {
  if (!on() || chain.empty() || page_rows == 0) return 0;
  auto addresses = PrefixPages::Addresses(chain, page_rows, r.context_pages);
  if (!addresses.ok()) {  // memd wrote the record itself: never expected; the request keeps what it has
    spdlog::warn("memd: request {}: its record's prefix chain: {}", r.id, addresses.status().ToString());
    return 0;
  }
  uint32_t held = 0;
  for (const PrefixAddress& ad : *addresses) {
    HistoryPage& hp = r.history[ad.page];
    if (hp.state != HistoryState::kLost) continue;  // its own confirmed copy
    const std::optional<PageIndex> page = tier_->Find(ad);
    if (!page || tier_->AtPage(*page)->holders.contains(r.id)) continue;
    DHS_CHECK_OK(tier_->Acquire(*page, r.id, s_.clock()));  // stored, confirmed, not held by r: checked
    hp.state = HistoryState::kHost;
    hp.host_page = *page;
    hp.checksum = tier_->AtPage(*page)->checksum;
    ++r.host_only;
    ++held;
  }
  return held;
}

bool PrefixSharing::Holds(RequestId id, PageIndex page) const {
  if (!on()) return false;
  const SharedPage* p = tier_->AtPage(page);
  return p != nullptr && p->holders.contains(id);
}

uint32_t PrefixSharing::Held(const Request& r) const {
  if (!on()) return 0;
  uint32_t n = 0;
  for (const HistoryPage& hp : r.history) n += hp.state != HistoryState::kLost && Holds(r.id, hp.host_page);
  for (const auto& [h, page] : r.resumed_host) n += Holds(r.id, page);
  return n;
}

uint32_t PrefixSharing::PoolPages() const { return on() ? s_.host.pages_of(kSharedOwner) : 0; }

// ---------------------------------------------------------------- checks

absl::Status PrefixSharing::CheckHeldPage(const Request& r, uint32_t h) const {
  const HistoryPage& hp = r.history[h];
  if (!Holds(r.id, hp.host_page) || hp.state == HistoryState::kHost || hp.state == HistoryState::kPopulating ||
      hp.state == HistoryState::kGpuAndHost) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrFormat("request %d page %d (%s): a shared host page without a host copy", r.id,
                                             h, HistoryStateName(hp.state)));
}

absl::Status PrefixSharing::CheckJournal(PageIndex page) const {
  const HostJournal* journal = s_.host.journal();
  const SharedPage* p = tier_ ? tier_->AtPage(page) : nullptr;
  if (journal == nullptr || p == nullptr) return absl::OkStatus();
  const JournalEntry e = journal->Read(page);
  if (e.state != JournalState::kShared || e.key != p->address.key || e.content != p->address.content ||
      e.checksum != p->checksum) {
    return absl::InternalError(absl::StrFormat("shared host page %d: journal entry state %d key %016x", page,
                                               static_cast<int>(e.state), e.key));
  }
  return absl::OkStatus();
}

namespace {

// Every stored page's expected holders: the requests whose history (not kLost, the page not being written) or queued
// resume's taken-over pages name it.
std::map<PageIndex, std::set<RequestId>> HoldersOf(const core::State& s, const PrefixPages& tier) {
  std::map<PageIndex, std::set<RequestId>> holders;
  for (const auto& [id, r] : s.requests) {
    for (const HistoryPage& hp : r.history) {
      const SharedPage* p = tier.AtPage(hp.host_page);
      if (hp.state == HistoryState::kLost || p == nullptr || p->state == SharedPageState::kWriting) continue;
      holders[hp.host_page].insert(id);  // a request's page that is not writing is its own, or one it holds
    }
    for (const auto& [h, page] : r.resumed_host) {
      if (tier.AtPage(page) != nullptr) holders[page].insert(id);
    }
  }
  return holders;
}

// A writing page: its writer's own host page of the history page it addresses, without a confirmed copy.
absl::Status CheckWriting(const core::State& s, PageIndex page, const SharedPage& p) {
  auto w = s.requests.find(p.writer);
  if (!s.host.is_allocated(page) || s.host.owner(page) != p.writer || w == s.requests.end() ||
      p.address.page >= w->second.history.size() || w->second.history[p.address.page].host_page != page) {
    return absl::InternalError(absl::StrFormat("writing prefix page %d: not request %d's page %d", page, p.writer,
                                               p.address.page));
  }
  const HistoryState st = w->second.history[p.address.page].state;
  if (st != HistoryState::kHostPending && st != HistoryState::kGpu && st != HistoryState::kGpuDeferred) {
    return absl::InternalError(absl::StrFormat("writing prefix page %d: its writer's copy is %s", page,
                                               HistoryStateName(st)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PrefixSharing::CheckInvariants() const {
  if (!on()) return absl::OkStatus();
  if (absl::Status s = tier_->CheckInvariants(); !s.ok()) return s;
  const std::map<PageIndex, std::set<RequestId>> holders = HoldersOf(s_, *tier_);
  uint32_t shared = 0, cached = 0;
  for (const auto& [page, p] : tier_->pages()) {
    const bool pool_shared = s_.host.is_allocated(page) && s_.host.owner(page) == kSharedOwner;
    if (p.state == SharedPageState::kWriting) {
      if (absl::Status s = CheckWriting(s_, page, p); !s.ok()) return s;
      continue;
    }
    if (!pool_shared) {  // a cached page is never free in the pool
      return absl::InternalError(absl::StrFormat("%s prefix page %d is not the host pool's shared page",
                                                 SharedPageStateName(p.state), page));
    }
    shared += p.state == SharedPageState::kShared;
    cached += p.state == SharedPageState::kCached;
    auto held = holders.find(page);
    const std::set<RequestId> want = held == holders.end() ? std::set<RequestId>{} : held->second;
    if (want != p.holders) {  // refs == the requests holding it
      return absl::InternalError(absl::StrFormat("prefix page %d: %d references, %d requests hold it", page, p.refs(),
                                                 want.size()));
    }
    for (RequestId id : p.holders) {
      const Request& r = s_.requests.at(id);
      if (!r.prefix.empty() && p.address.tenant != 0 && r.prefix.front().tenant != p.address.tenant) {
        return absl::InternalError(absl::StrFormat("prefix page %d of tenant %016x held by request %d of tenant %016x",
                                                   page, p.address.tenant, id, r.prefix.front().tenant));
      }
    }
  }
  const uint32_t private_pages = s_.host.allocated() - s_.host.pages_of(kSharedOwner);
  const uint32_t free_pages = s_.host.pages() - s_.host.allocated();
  if (shared != tier_->shared() || cached != tier_->cached() ||
      shared + cached + private_pages + free_pages != s_.host.pages() ||
      shared + cached != s_.host.pages_of(kSharedOwner)) {
    return absl::InternalError(absl::StrFormat("host pool of %d pages: %d shared + %d cached + %d private + %d free",
                                               s_.host.pages(), shared, cached, private_pages, free_pages));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- introspection

namespace {

// The `prefixes` view (issue 24): stored pages grouped by (tenant, blocks, chain); an adopted page (chain unknown) is
// a row of its own (keyed by its content key).
std::vector<PrefixDump::Chain> PrefixChains(const PrefixPages& p) {
  std::map<std::tuple<uint64_t, uint32_t, uint64_t>, std::pair<PrefixDump::Chain, std::set<RequestId>>> rows;
  for (const auto& [page, sp] : p.pages()) {
    const PrefixAddress& a = sp.address;
    const uint64_t chain = a.chain != 0 ? a.chain : a.key;
    auto& [row, holders] = rows[{a.tenant, a.blocks, chain}];
    row.tenant = a.tenant;
    row.chain = a.chain;
    row.blocks = a.blocks;
    ++row.pages;
    row.shared += sp.state == SharedPageState::kShared;
    row.cached += sp.state == SharedPageState::kCached;
    row.writing += sp.state == SharedPageState::kWriting;
    row.last_use_us = std::max(row.last_use_us, sp.last_use_us);
    holders.insert(sp.holders.begin(), sp.holders.end());
  }
  std::vector<PrefixDump::Chain> out;
  for (auto& [key, row] : rows) {
    row.first.holders = static_cast<uint32_t>(row.second.size());
    out.push_back(row.first);
  }
  return out;
}

}  // namespace

PrefixDump PrefixSharing::Dump(bool chains) const {
  if (!on()) return {};
  const PrefixPages& p = *tier_;
  const PrefixCounters& c = p.counters();
  PrefixDump d{true, std::string(p.policy_name()), p.config().tenant_quota_pages, p.writing(), p.shared(),
               p.cached(), c.lookups, c.hits, c.misses, c.content_mismatches, c.stored, c.abandoned,
               c.evictions, c.quota_refusals, c.adopted, {}};
  d.hit_rows = c.hit_rows;  // issue 24's per-tier counts and KV events
  d.hit_bytes = c.hits * s_.host.page_bytes();
  d.stored_blocks = p.kv_ledger().stored_blocks();
  if (chains) d.chains = PrefixChains(p);
  return d;
}

}  // namespace dhs::memd
