// memd/prefix_pages.h: the content-addressed host tier (issue 24; brief §12): host pages that hold only rows of
// complete prefix blocks, addressed by content, kept once per node and shared by every request whose prefix chain
// reaches them. A pure core: events in (lookups, holds, writes, evictions), answers out; no sockets, no clock (the
// caller passes its time for display only), no host memory (memd's HostPageAllocator owns the pages; this class
// records which of them are shared and by whom).
//
// Content address of a host page (brief §12, "content address"): (tenant, block chain up to the block holding the
// page's last position, page index). Computed by PrefixPages::Addresses, with a chain hash (XXH3-64 of libxxhash,
// stable across processes and builds, so the journal can keep it):
//   t       = XXH3_64(tenant bytes, seed kTenantSeed)                       (the empty tenant is the default one)
//   c_{-1}  = t;  c_b = XXH3_64(le64(block_ids[b]), seed c_{b-1})           (the block chain hash, vLLM-like)
//   k_{-1}  = 0;  k_b = XXH3_64(le64(block_digests[b]), seed k_{b-1} ^ kContentSeed)   (what the chain holds)
//   key(h)  = XXH3_64(le64(c_b) le64(page_rows) le64(h), seed kPageSeed)    (b = the block of page h's last row)
// `key` says where a page lives, `content` (k_b) what it must hold: a lookup hits only a stored page of the same key
// AND the same content (brief §12: "never trusting an id"): the same ids with other tokens are a miss
// (content_mismatches), never imported. Two tenants have different t, so different keys whatever their block ids
// (a collision of 64-bit keys would also need equal contents and is then still refused by the page checksum the
// importing worker checks, common/page_checksum.h). The page index is the history page h itself: the chain and
// page_rows fix its block, so h is the page within the block up to a constant.
// Shareable pages of a chain of n blocks of T tokens, pages of p rows: h = 0 .. floor(n * T / p) - 1 (every row in a
// complete block; the partial last block and decoded rows stay private). Positions = rows (one row per position).
//
// State of a stored page (one enum, ONE table, one validating Transition()):
//
//   BeginWrite            ConfirmWrite              last Release
//   ---------> writing -----------------> shared -----------------> cached
//                 |                       (refs >= 1) <------------  (refs 0, LRU)
//                 | AbandonWrite                      Acquire (hit)    |
//                 v                                                    | Evict (an admission needs the room,
//               free (forgotten) <-------------------------------------'        or its tenant's quota)
//
// A writing page is never importable (Lookup misses it): its writer's copy is not confirmed. Shared and cached pages
// are immutable. refs = the number of requests holding the page (holders); a writing page's writer is not a holder
// until its copy is confirmed (then its one holder). Adopt (memd restart) stores a confirmed page as cached.
//
// Eviction: PrefixEvictionPolicy only *ranks* cached pages (lowest rank evicted first, ties by host page); this class
// keeps them ordered and ChooseEvictions returns the first ones; the owner (ResidencyManager) frees them. Cached
// pages never starve admission: the owner counts them as free room and evicts before it would wait.
// Quota (optional, PrefixConfig::tenant_quota_pages): pages one tenant may store (writing + shared + cached); at the
// quota, QuotaVictim names the tenant's first cached page to evict, else BeginWrite is refused (the page stays the
// writer's private page: nothing is lost).
//
// Thread-safety: none. One owner (ResidencyManager, one loop).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"
#include "memd/host_journal.h"
#include "memd/kv_block_ledger.h"

namespace dhs::memd {

inline constexpr uint64_t kTenantSeed = 0x44485354656e616eull;   // "DHSTenan"
inline constexpr uint64_t kContentSeed = 0x444853436f6e7465ull;  // "DHSConte"
inline constexpr uint64_t kPageSeed = 0x4448535061676521ull;     // "DHSPage!"
// Issue 26 (sessions across nodes): the seed of a session address's key (PrefixPages::SessionAddress), its own so a
// session address never equals a block-chain address by construction of the hashed words.
inline constexpr uint64_t kSessionPageSeed = 0x4448535365735067ull;  // "DHSSesPg"
// kSharedOwner (memd/host_journal.h): the owner the host pool records for a shared or cached page (a writing page is
// still its writer's); never a request id (Admit refuses it while prefix sharing is on).

// A request's prefix chain as its AdmitRequest names it (schemas/dhs.fbs AdmitRequest.tenant, prefix_block_ids,
// prefix_block_tokens, prefix_block_digests).
struct PrefixChain {
  std::string tenant;                   // opaque salt; empty = the default tenant
  std::vector<uint64_t> block_ids;      // the block chain (Mooncake hash_ids), block 0 first
  std::vector<uint64_t> block_digests;  // per block: a digest of its tokens (same length as block_ids)
  uint32_t block_tokens = 0;            // tokens per block (> 0 when block_ids is not empty)
  bool empty() const { return block_ids.empty(); }
};

struct PrefixAddress {
  uint64_t key = 0;      // where the page lives (tenant, chain up to its block, page_rows, page)
  uint64_t content = 0;  // what it holds (the chain of block digests up to its block)
  uint64_t tenant = 0;   // t (0: unknown, a page adopted from a journal)
  uint32_t blocks = 0;   // chain length up to its block (0: unknown, adopted)
  uint32_t page = 0;     // history page h
  uint64_t chain = 0;    // c_b: the block chain hash up to its block (dhsctl prefixes groups by it; 0: adopted)
  // Issue 24's KV events (memd/kv_block_ledger.h; 0: adopted): c_{b-1} (t for b = 0), T, p.
  uint64_t parent = 0;
  uint32_t block_tokens = 0;
  uint32_t page_rows = 0;
  // Issue 26 (sessions across nodes; docs/cluster_tier.md "Sessions"): nonzero = a SESSION address
  // (PrefixPages::SessionAddress): the session hash (memd/cluster_keys.h SessionHash(tenant, session id)); then
  // `content` is the page's session digest (common/session_digest.h), blocks / chain / parent / block_tokens are 0
  // (no KV event names it), and the page is lookup-only: found locally or imported from the cluster tier, never
  // written under this address by a local request.
  uint64_t session = 0;
  bool operator==(const PrefixAddress&) const = default;
};

enum class SharedPageState : uint8_t { kWriting = 0, kShared = 1, kCached = 2, kFree = 3 };
std::string_view SharedPageStateName(SharedPageState state);

// Every allowed move, with the event that makes it (kFree: the page is forgotten, its host page the owner's to free):
inline constexpr std::pair<SharedPageState, SharedPageState> kSharedPageTransitions[] = {
    {SharedPageState::kWriting, SharedPageState::kShared},  // ConfirmWrite: the writer's host copy is confirmed
    {SharedPageState::kWriting, SharedPageState::kFree},    // AbandonWrite: writer completed, fenced or failed first
    {SharedPageState::kShared, SharedPageState::kCached},   // Release of the last holder
    {SharedPageState::kCached, SharedPageState::kShared},   // Acquire: a hit of an admission
    {SharedPageState::kCached, SharedPageState::kFree},     // Evict
};

struct SharedPage {
  SharedPageState state = SharedPageState::kWriting;
  PrefixAddress address;
  PageIndex host_page = 0;
  uint64_t checksum = 0;           // the confirmed copy's checksum (common/page_checksum.h; 0 = none known)
  RequestId writer = 0;            // kWriting: the request computing it
  std::set<RequestId> holders;     // refs = holders.size()
  int64_t last_use_us = 0;         // the caller's time of its last Acquire / Release / store (display)
  uint64_t use_seq = 0;            // order of its last use (LRU rank)
  uint64_t stored_seq = 0;         // order it was stored in (FIFO rank)
  uint32_t refs() const { return static_cast<uint32_t>(holders.size()); }
};

// Moves `page` from `from` to `to` (to != kFree; kFree is Forget's). Errors: FailedPrecondition when the page is
// not in `from` or the move is not in kSharedPageTransitions (the page is then unchanged).
absl::Status TransitionSharedPage(SharedPage& page, SharedPageState from, SharedPageState to);
bool SharedPageTransitionAllowed(SharedPageState from, SharedPageState to);

// Chooses which cached pages go first: only ranks them (the owner evicts). Rank is read when a page becomes cached.
class PrefixEvictionPolicy {
 public:
  virtual ~PrefixEvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual uint64_t Rank(const SharedPage& page) const = 0;  // lowest first
};
// "lru" (least recently used first: the default, issue 24) and "fifo" (first stored first).
inline constexpr std::string_view kPrefixEvictionPolicyNames[] = {"lru", "fifo"};
inline constexpr std::string_view kDefaultPrefixEvictionPolicy = kPrefixEvictionPolicyNames[0];
// Errors: InvalidArgument naming the known policies.
absl::StatusOr<std::unique_ptr<PrefixEvictionPolicy>> MakePrefixEvictionPolicy(std::string_view name);

struct PrefixConfig {
  std::string eviction_policy{kDefaultPrefixEvictionPolicy};
  uint32_t tenant_quota_pages = 0;  // pages one tenant may store (writing + shared + cached); 0 = no quota
  bool kv_events = false;           // keep the KV event outbox (DrainKvEvents; memd --kv-events on)
  bool cluster_outbox = false;      // issue 26: keep the pages confirmed shared for the cluster tier (memd
                                    // --cluster-store; PrefixSharing::DrainClusterPublish)
};

// Counters of the host tier (memd's stats, Prometheus dhs_memd_prefix_*; units: pages = host pages looked up).
struct PrefixCounters {
  uint64_t lookups = 0;            // shareable pages looked up (one per page of a chain, per admission)
  uint64_t hits = 0;               // found shared or cached with the same content: imported, not computed
  uint64_t hit_rows = 0;           // rows (= prefill tokens) of the hits: prefill the host tier saved
  uint64_t misses = 0;             // not stored, being written, or a content mismatch
  uint64_t content_mismatches = 0; // of the misses: stored under the same key with other content (never imported)
  uint64_t stored = 0;             // pages confirmed and shared (ConfirmWrite)
  uint64_t abandoned = 0;          // writes abandoned before their copy was confirmed
  uint64_t evictions = 0;          // cached pages evicted for an admission or a quota
  uint64_t quota_refusals = 0;     // BeginWrite refused by a tenant's quota (the page stayed private)
  uint64_t adopted = 0;            // confirmed pages adopted from a dead memd's journal (cached)
  uint64_t cluster_imported = 0;   // issue 26: pages found in the cluster tier, copied in and stored cached (Import)
  uint64_t session_hits = 0;       // issue 26: admissions' hits on stored pages by a session address (not in hits)
};

class PrefixPages {
 public:
  // Errors: InvalidArgument for an unknown eviction policy.
  static absl::StatusOr<PrefixPages> Create(const PrefixConfig& config);

  // The shareable pages of `chain` for pages of `page_rows` rows in a context of `context_pages` pages, ascending h
  // (at most context_pages). Errors: InvalidArgument (digests not one per block id, block_tokens 0 with blocks,
  // page_rows 0 with blocks, more than 2^20 blocks).
  static absl::StatusOr<std::vector<PrefixAddress>> Addresses(const PrefixChain& chain, uint32_t page_rows,
                                                              uint32_t context_pages);
  static uint64_t TenantHash(std::string_view tenant);
  // Issue 26 (sessions across nodes): the session address of history page `h` of a session's history whose session
  // digest (common/session_digest.h: every token up to the page's end) is `digest`:
  //   key = XXH3_64(le64(tenant) le64(session) le64(digest) le64(page_rows) le64(h), seed kSessionPageSeed)
  //   content = digest, tenant = `tenant` (TenantHash), session = `session` (memd/cluster_keys.h SessionHash), page = h.
  // `session` must be nonzero (it marks the address as a session one).
  static PrefixAddress SessionAddress(uint64_t tenant, uint64_t session, uint64_t digest, uint32_t page_rows,
                                      uint32_t h);

  // A lookup of one shareable page (counted): the host page of a shared or cached page with the same key and
  // content, else nullopt (not stored, being written, or another content: a mismatch). A hit of an adopted page
  // (chain unknown) learns its address from `address` (tenant, chain, blocks: the KV events announce it again).
  std::optional<PageIndex> Lookup(const PrefixAddress& address);
  // Lookup's answer without counting it (an admission that may still wait asks this on every attempt).
  std::optional<PageIndex> Find(const PrefixAddress& address) const;
  // The stored page at `address.key` (any state), without counting; nullptr none.
  const SharedPage* AtKey(uint64_t key) const;
  const SharedPage* AtPage(PageIndex host_page) const;

  // `holder` takes a reference (cached -> shared, or one more holder). Errors: NotFound (not stored),
  // FailedPrecondition (writing), AlreadyExists (holder holds it already).
  absl::Status Acquire(PageIndex host_page, RequestId holder, int64_t now_us);
  // `holder` lets go (the last one: shared -> cached). Errors: NotFound (not stored or not a holder).
  absl::Status Release(PageIndex host_page, RequestId holder, int64_t now_us);
  // A resume takes over `from`'s reference (no state change). Errors: NotFound (not a holder), AlreadyExists.
  absl::Status Rehold(PageIndex host_page, RequestId from, RequestId to);
  // `writer` computes the page at `address` into its host page `host_page` (writing). Errors: AlreadyExists (the key
  // or the host page is stored), ResourceExhausted (the tenant's quota is full: the caller may evict QuotaVictim
  // first), InvalidArgument (writer 0 or kSharedOwner).
  absl::Status BeginWrite(const PrefixAddress& address, PageIndex host_page, RequestId writer, int64_t now_us);
  // The writer's copy of `host_page` is confirmed (checksum kept): writing -> shared, the writer its one holder.
  // Errors: NotFound, FailedPrecondition (not writing).
  absl::Status ConfirmWrite(PageIndex host_page, uint64_t checksum, int64_t now_us);
  // The write ends unconfirmed (writing -> free: forgotten; the host page stays the writer's). Errors: NotFound,
  // FailedPrecondition (not writing).
  absl::Status AbandonWrite(PageIndex host_page);
  // Up to `count` cached pages in the policy's order for which `usable` is true (e.g. not pinned by a copy).
  std::vector<PageIndex> ChooseEvictions(uint32_t count,
                                         const std::function<bool(PageIndex)>& usable = nullptr) const;
  // A cached page is forgotten (cached -> free); the owner frees its host page. Errors: NotFound,
  // FailedPrecondition (not cached).
  absl::Status Evict(PageIndex host_page);
  // With a quota: whether `tenant` is at it, and its first cached page in the policy's order (nullopt: none).
  bool AtQuota(uint64_t tenant) const;
  std::optional<PageIndex> QuotaVictim(uint64_t tenant,
                                       const std::function<bool(PageIndex)>& usable = nullptr) const;
  // A confirmed page of a dead memd's journal (key, content, checksum): stored cached (tenant and blocks unknown).
  // Errors: AlreadyExists (key or host page stored).
  absl::Status Adopt(PageIndex host_page, uint64_t key, uint64_t content, uint64_t checksum);

  // Issue 26: a page found in the cluster tier (its value checked, its bytes copied into `host_page` by the caller)
  // is stored cached, confirmed with `checksum`, at its full address (a KV event announces its block like a
  // confirmed write). Errors: AlreadyExists (key or host page stored), InvalidArgument (key 0).
  absl::Status Import(PageIndex host_page, const PrefixAddress& address, uint64_t checksum, int64_t now_us);
  // Issue 26: an admission's grant takes a stored page it found by a session address (counters().session_hits).
  void CountSessionHit() { ++counters_.session_hits; }
  uint32_t writing() const { return count_[0]; }
  uint32_t shared() const { return count_[1]; }
  uint32_t cached() const { return count_[2]; }
  uint32_t stored() const { return writing() + shared() + cached(); }
  uint32_t tenant_pages(uint64_t tenant) const;
  const PrefixCounters& counters() const { return counters_; }
  const PrefixConfig& config() const { return config_; }
  std::string_view policy_name() const { return policy_->name(); }
  // Every stored page, ascending host page.
  const std::map<PageIndex, SharedPage>& pages() const { return pages_; }

  // The KV events (issue 24; memd/kv_block_ledger.h) since the last drain: BlockStored when ConfirmWrite completes a
  // block's pages, BlockRemoved when Evict takes a page of an announced block; first an AllBlocksCleared. Empty when
  // PrefixConfig::kv_events is off.
  std::vector<KvEvent> DrainKvEvents() { return ledger_.Drain(); }
  const KvBlockLedger& kv_ledger() const { return ledger_; }

  // The counts, the key index, the cached order and the per-tenant counts against a recount (Internal errors).
  absl::Status CheckInvariants() const;

 private:
  PrefixPages(const PrefixConfig& config, std::unique_ptr<PrefixEvictionPolicy> policy);
  void Count(SharedPageState state, int sign);
  void EnterCache(SharedPage& p);
  void LeaveCache(const SharedPage& p);
  // A page enters the tier (its use and store sequence, state count, key and tenant indexes) / leaves it.
  SharedPage& Insert(SharedPage p);
  void Forget(PageIndex host_page);
  void Learn(PageIndex host_page, const PrefixAddress& address);  // an adopted page's address, from a hit

  PrefixConfig config_;
  std::unique_ptr<PrefixEvictionPolicy> policy_;
  std::map<PageIndex, SharedPage> pages_;
  std::map<uint64_t, PageIndex> by_key_;
  std::set<std::pair<uint64_t, PageIndex>> cache_;  // (rank, host page): the eviction order
  std::map<PageIndex, uint64_t> cache_rank_;        // host page -> its rank in cache_
  std::map<uint64_t, uint32_t> tenant_pages_;       // tenant -> stored pages
  uint32_t count_[3] = {0, 0, 0};                   // writing, shared, cached
  uint64_t next_seq_ = 1;
  PrefixCounters counters_;
  KvBlockLedger ledger_;  // issue 24's KV events: fed by ConfirmWrite and Evict
};

}  // namespace dhs::memd
