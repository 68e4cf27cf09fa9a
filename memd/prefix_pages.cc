#include "memd/prefix_pages.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "xxhash.h"

namespace dhs::memd {
namespace {

uint64_t HashWords(std::span<const uint64_t> words, uint64_t seed) {
  // Little-endian words (the project builds for x86-64 and aarch64, both little-endian): stable across processes.
  return XXH3_64bits_withSeed(words.data(), words.size() * sizeof(uint64_t), seed);
}

class LruPolicy final : public PrefixEvictionPolicy {
 public:
  std::string_view name() const override { return kPrefixEvictionPolicyNames[0]; }
  uint64_t Rank(const SharedPage& page) const override { return page.use_seq; }
};

class FifoPolicy final : public PrefixEvictionPolicy {
 public:
  std::string_view name() const override { return kPrefixEvictionPolicyNames[1]; }
  uint64_t Rank(const SharedPage& page) const override { return page.stored_seq; }
};

constexpr uint32_t kMaxChainBlocks = uint32_t{1} << 20;

// The block of a page's address, as the KV event ledger counts it (memd/kv_block_ledger.h).
KvEvent BlockOf(const PrefixAddress& a) {
  KvEvent e;
  e.tenant = a.tenant;
  e.block_hash = a.chain;
  e.parent_hash = a.parent;
  e.blocks = a.blocks;
  e.block_tokens = a.block_tokens;
  e.page_rows = a.page_rows;
  return e;
}

}  // namespace

std::string_view SharedPageStateName(SharedPageState state) {
  static constexpr std::string_view kNames[] = {"writing", "shared", "cached", "free"};
  return kNames[static_cast<int>(state)];
}

bool SharedPageTransitionAllowed(SharedPageState from, SharedPageState to) {
  return std::any_of(std::begin(kSharedPageTransitions), std::end(kSharedPageTransitions),
                     [&](const auto& t) { return t.first == from && t.second == to; });
}

absl::Status TransitionSharedPage(SharedPage& page, SharedPageState from, SharedPageState to) {
  if (page.state != from || to == SharedPageState::kFree || !SharedPageTransitionAllowed(from, to)) {
    return absl::FailedPreconditionError(absl::StrFormat("shared host page %d: %s -> %s not allowed (it is %s)",
                                                         page.host_page, SharedPageStateName(from),
                                                         SharedPageStateName(to), SharedPageStateName(page.state)));
  }
  page.state = to;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PrefixEvictionPolicy>> MakePrefixEvictionPolicy(std::string_view name) {
  if (name == kPrefixEvictionPolicyNames[0]) return std::unique_ptr<PrefixEvictionPolicy>(new LruPolicy());
  if (name == kPrefixEvictionPolicyNames[1]) return std::unique_ptr<PrefixEvictionPolicy>(new FifoPolicy());
  std::vector<std::string> names(std::begin(kPrefixEvictionPolicyNames), std::end(kPrefixEvictionPolicyNames));
  return absl::InvalidArgumentError(absl::StrFormat("unknown prefix eviction policy '%s' (known: %s)",
                                                    std::string(name), absl::StrJoin(names, ", ")));
}

absl::StatusOr<PrefixPages> PrefixPages::Create(const PrefixConfig& config) {
  auto policy = MakePrefixEvictionPolicy(config.eviction_policy);
  if (!policy.ok()) return policy.status();
  return PrefixPages(config, std::move(*policy));
}

PrefixPages::PrefixPages(const PrefixConfig& config, std::unique_ptr<PrefixEvictionPolicy> policy)
    : config_(config), policy_(std::move(policy)), ledger_(config.kv_events) {}

uint64_t PrefixPages::TenantHash(std::string_view tenant) {
  return XXH3_64bits_withSeed(tenant.data(), tenant.size(), kTenantSeed);
}

absl::StatusOr<std::vector<PrefixAddress>> PrefixPages::Addresses(const PrefixChain& chain, uint32_t page_rows,
                                                                  uint32_t context_pages) {
  std::vector<PrefixAddress> out;
  if (chain.empty()) return out;
  if (chain.block_digests.size() != chain.block_ids.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("prefix chain: %d block digests for %d block ids",
                                                      chain.block_digests.size(), chain.block_ids.size()));
  }
  if (chain.block_tokens == 0 || page_rows == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prefix chain of %d blocks: block_tokens (%d) and page_rows (%d) must be > 0", chain.block_ids.size(),
        chain.block_tokens, page_rows));
  }
  if (chain.block_ids.size() > kMaxChainBlocks) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prefix chain of %d blocks: at most %d", chain.block_ids.size(), kMaxChainBlocks));
  }
  const uint64_t rows = uint64_t{chain.block_tokens} * chain.block_ids.size();
  const auto pages = static_cast<uint32_t>(std::min<uint64_t>(rows / page_rows, context_pages));
  const uint64_t tenant = TenantHash(chain.tenant);
  std::vector<uint64_t> chain_hash(chain.block_ids.size()), content(chain.block_ids.size());
  uint64_t c = tenant, k = 0;
  for (size_t b = 0; b < chain.block_ids.size(); ++b) {
    c = HashWords(std::span(&chain.block_ids[b], 1), c);
    k = HashWords(std::span(&chain.block_digests[b], 1), k ^ kContentSeed);
    chain_hash[b] = c;
    content[b] = k;
  }
  out.reserve(pages);
  for (uint32_t h = 0; h < pages; ++h) {
    const uint64_t b = ((uint64_t{h} + 1) * page_rows - 1) / chain.block_tokens;  // the block of its last row
    const uint64_t words[3] = {chain_hash[b], page_rows, h};
    out.push_back(PrefixAddress{HashWords(words, kPageSeed), content[b], tenant, static_cast<uint32_t>(b + 1), h,
                                chain_hash[b], b == 0 ? tenant : chain_hash[b - 1], chain.block_tokens, page_rows});
  }
  return out;
}

PrefixAddress PrefixPages::SessionAddress(uint64_t tenant, uint64_t session, uint64_t digest, uint32_t page_rows,
                                          uint32_t h) {
  const uint64_t words[5] = {tenant, session, digest, page_rows, h};
  PrefixAddress a;
  a.key = HashWords(words, kSessionPageSeed);
  a.content = digest;
  a.tenant = tenant;
  a.page = h;
  a.page_rows = page_rows;
  a.session = session;
  return a;
}

std::optional<PageIndex> PrefixPages::Lookup(const PrefixAddress& address) {
  ++counters_.lookups;
  const SharedPage* p = AtKey(address.key);
  if (p == nullptr || p->state == SharedPageState::kWriting) {
    ++counters_.misses;
    return std::nullopt;
  }
  if (p->address.content != address.content) {
    ++counters_.misses;
    ++counters_.content_mismatches;
    return std::nullopt;
  }
  ++counters_.hits;
  counters_.hit_rows += address.page_rows;
  if (p->address.blocks == 0 && address.blocks > 0) Learn(p->host_page, address);
  return p->host_page;
}

std::optional<PageIndex> PrefixPages::Find(const PrefixAddress& address) const {
  const SharedPage* p = AtKey(address.key);
  if (p == nullptr || p->state == SharedPageState::kWriting || p->address.content != address.content) {
    return std::nullopt;
  }
  return p->host_page;
}

const SharedPage* PrefixPages::AtKey(uint64_t key) const {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : &pages_.at(it->second);
}

const SharedPage* PrefixPages::AtPage(PageIndex host_page) const {
  auto it = pages_.find(host_page);
  return it == pages_.end() ? nullptr : &it->second;
}

void PrefixPages::Count(SharedPageState state, int sign) {
  if (state != SharedPageState::kFree) count_[static_cast<int>(state)] += sign;
}

void PrefixPages::EnterCache(SharedPage& p) {
  const uint64_t rank = policy_->Rank(p);
  cache_.emplace(rank, p.host_page);
  cache_rank_[p.host_page] = rank;
}

void PrefixPages::LeaveCache(const SharedPage& p) {
  auto it = cache_rank_.find(p.host_page);
  cache_.erase({it->second, p.host_page});
  cache_rank_.erase(it);
}

absl::Status PrefixPages::Acquire(PageIndex host_page, RequestId holder, int64_t now_us) {
  auto it = pages_.find(host_page);
  if (it == pages_.end()) return absl::NotFoundError(absl::StrFormat("host page %d is not shared", host_page));
  SharedPage& p = it->second;
  if (p.state == SharedPageState::kWriting) {
    return absl::FailedPreconditionError(
        absl::StrFormat("shared host page %d is being written by request %d: not importable", host_page, p.writer));
  }
  if (p.holders.contains(holder)) {
    return absl::AlreadyExistsError(absl::StrFormat("request %d holds shared host page %d already", holder, host_page));
  }
  if (p.state == SharedPageState::kCached) {
    LeaveCache(p);
    Count(p.state, -1);
    if (absl::Status s = TransitionSharedPage(p, SharedPageState::kCached, SharedPageState::kShared); !s.ok()) {
      return s;  // cannot happen: listed
    }
    Count(p.state, +1);
  }
  p.holders.insert(holder);
  p.last_use_us = now_us;
  p.use_seq = next_seq_++;
  return absl::OkStatus();
}

absl::Status PrefixPages::Release(PageIndex host_page, RequestId holder, int64_t now_us) {
  auto it = pages_.find(host_page);
  if (it == pages_.end() || !it->second.holders.contains(holder)) {
    return absl::NotFoundError(absl::StrFormat("request %d holds no shared host page %d", holder, host_page));
  }
  SharedPage& p = it->second;
  p.holders.erase(holder);
  p.last_use_us = now_us;
  p.use_seq = next_seq_++;
  if (p.holders.empty()) {
    Count(p.state, -1);
    if (absl::Status s = TransitionSharedPage(p, SharedPageState::kShared, SharedPageState::kCached); !s.ok()) {
      return s;
    }
    Count(p.state, +1);
    EnterCache(p);
  }
  return absl::OkStatus();
}

absl::Status PrefixPages::Rehold(PageIndex host_page, RequestId from, RequestId to) {
  auto it = pages_.find(host_page);
  if (it == pages_.end() || !it->second.holders.contains(from)) {
    return absl::NotFoundError(absl::StrFormat("request %d holds no shared host page %d", from, host_page));
  }
  if (it->second.holders.contains(to)) {
    return absl::AlreadyExistsError(absl::StrFormat("request %d holds shared host page %d already", to, host_page));
  }
  it->second.holders.erase(from);
  it->second.holders.insert(to);
  return absl::OkStatus();
}

uint32_t PrefixPages::tenant_pages(uint64_t tenant) const {
  auto it = tenant_pages_.find(tenant);
  return it == tenant_pages_.end() ? 0 : it->second;
}

bool PrefixPages::AtQuota(uint64_t tenant) const {
  return config_.tenant_quota_pages > 0 && tenant_pages(tenant) >= config_.tenant_quota_pages;
}

absl::Status PrefixPages::BeginWrite(const PrefixAddress& address, PageIndex host_page, RequestId writer,
                                     int64_t now_us) {
  if (writer == 0 || writer == kSharedOwner) {
    return absl::InvalidArgumentError(absl::StrFormat("request id %d cannot write a shared page", writer));
  }
  if (by_key_.contains(address.key) || pages_.contains(host_page)) {
    return absl::AlreadyExistsError(absl::StrFormat("prefix page %016x (host page %d) is stored already",
                                                    address.key, host_page));
  }
  if (AtQuota(address.tenant)) {
    ++counters_.quota_refusals;
    return absl::ResourceExhaustedError(absl::StrFormat("tenant %016x stores %d pages: its quota", address.tenant,
                                                        tenant_pages(address.tenant)));
  }
  SharedPage p;
  p.state = SharedPageState::kWriting;
  p.address = address;
  p.host_page = host_page;
  p.writer = writer;
  p.last_use_us = now_us;
  Insert(std::move(p));
  return absl::OkStatus();
}

absl::Status PrefixPages::ConfirmWrite(PageIndex host_page, uint64_t checksum, int64_t now_us) {
  auto it = pages_.find(host_page);
  if (it == pages_.end()) return absl::NotFoundError(absl::StrFormat("host page %d is not stored", host_page));
  SharedPage& p = it->second;
  if (absl::Status s = TransitionSharedPage(p, SharedPageState::kWriting, SharedPageState::kShared); !s.ok()) {
    return s;
  }
  Count(SharedPageState::kWriting, -1);
  Count(SharedPageState::kShared, +1);
  p.checksum = checksum;
  p.holders.insert(p.writer);
  p.writer = 0;
  p.last_use_us = now_us;
  p.use_seq = next_seq_++;
  ++counters_.stored;
  ledger_.PageConfirmed(BlockOf(p.address));
  return absl::OkStatus();
}

absl::Status PrefixPages::AbandonWrite(PageIndex host_page) {
  auto it = pages_.find(host_page);
  if (it == pages_.end()) return absl::NotFoundError(absl::StrFormat("host page %d is not stored", host_page));
  if (it->second.state != SharedPageState::kWriting) {
    return absl::FailedPreconditionError(absl::StrFormat("shared host page %d is %s, not writing", host_page,
                                                         SharedPageStateName(it->second.state)));
  }
  Forget(host_page);
  ++counters_.abandoned;
  return absl::OkStatus();
}

void PrefixPages::Learn(PageIndex host_page, const PrefixAddress& address) {
  SharedPage& p = pages_.at(host_page);
  if (auto t = tenant_pages_.find(p.address.tenant); t != tenant_pages_.end() && --t->second == 0) {
    tenant_pages_.erase(t);
  }
  ++tenant_pages_[address.tenant];
  p.address = address;  // the same key and content: only what the journal did not keep is filled in
  ledger_.PageConfirmed(BlockOf(address));
}

SharedPage& PrefixPages::Insert(SharedPage p) {
  p.use_seq = next_seq_++;
  p.stored_seq = p.use_seq;
  Count(p.state, +1);
  by_key_.emplace(p.address.key, p.host_page);
  ++tenant_pages_[p.address.tenant];
  const PageIndex host_page = p.host_page;
  return pages_.emplace(host_page, std::move(p)).first->second;
}

void PrefixPages::Forget(PageIndex host_page) {
  auto it = pages_.find(host_page);
  const SharedPage& p = it->second;
  Count(p.state, -1);
  by_key_.erase(p.address.key);
  if (auto t = tenant_pages_.find(p.address.tenant); t != tenant_pages_.end() && --t->second == 0) {
    tenant_pages_.erase(t);
  }
  pages_.erase(it);
}

std::vector<PageIndex> PrefixPages::ChooseEvictions(uint32_t count,
                                                    const std::function<bool(PageIndex)>& usable) const {
  std::vector<PageIndex> out;
  for (auto it = cache_.begin(); it != cache_.end() && out.size() < count; ++it) {
    if (!usable || usable(it->second)) out.push_back(it->second);
  }
  return out;
}

std::optional<PageIndex> PrefixPages::QuotaVictim(uint64_t tenant,
                                                  const std::function<bool(PageIndex)>& usable) const {
  if (!AtQuota(tenant)) return std::nullopt;
  for (const auto& [rank, page] : cache_) {
    if (pages_.at(page).address.tenant == tenant && (!usable || usable(page))) return page;
  }
  return std::nullopt;
}

absl::Status PrefixPages::Evict(PageIndex host_page) {
  auto it = pages_.find(host_page);
  if (it == pages_.end()) return absl::NotFoundError(absl::StrFormat("host page %d is not stored", host_page));
  if (it->second.state != SharedPageState::kCached) {
    return absl::FailedPreconditionError(absl::StrFormat("shared host page %d is %s: only a cached page is evicted",
                                                         host_page, SharedPageStateName(it->second.state)));
  }
  LeaveCache(it->second);
  ledger_.PageRemoved(BlockOf(it->second.address));
  Forget(host_page);
  ++counters_.evictions;
  return absl::OkStatus();
}

absl::Status PrefixPages::Adopt(PageIndex host_page, uint64_t key, uint64_t content, uint64_t checksum) {
  if (by_key_.contains(key) || pages_.contains(host_page)) {
    return absl::AlreadyExistsError(
        absl::StrFormat("adopted prefix page %016x (host page %d) is stored already", key, host_page));
  }
  SharedPage p;
  p.state = SharedPageState::kCached;
  p.address.key = key;
  p.address.content = content;  // tenant 0: unknown
  p.host_page = host_page;
  p.checksum = checksum;
  EnterCache(Insert(std::move(p)));
  ++counters_.adopted;
  return absl::OkStatus();
}

absl::Status PrefixPages::Import(PageIndex host_page, const PrefixAddress& address, uint64_t checksum,
                                 int64_t now_us) {
  if (address.key == 0) return absl::InvalidArgumentError("imported prefix page without a key");
  if (by_key_.contains(address.key) || pages_.contains(host_page)) {
    return absl::AlreadyExistsError(absl::StrFormat("imported prefix page %016x (host page %d) is stored already",
                                                    address.key, host_page));
  }
  SharedPage p;
  p.state = SharedPageState::kCached;
  p.address = address;
  p.host_page = host_page;
  p.checksum = checksum;
  p.last_use_us = now_us;
  EnterCache(Insert(std::move(p)));
  ++counters_.cluster_imported;
  if (address.blocks != 0) ledger_.PageConfirmed(BlockOf(address));
  return absl::OkStatus();
}

absl::Status PrefixPages::CheckInvariants() const {
  uint32_t count[3] = {0, 0, 0};
  std::map<uint64_t, uint32_t> tenants;
  uint32_t in_cache = 0;
  for (const auto& [page, p] : pages_) {
    if (p.host_page != page || p.state == SharedPageState::kFree) {
      return absl::InternalError(absl::StrFormat("shared page %d: bad record", page));
    }
    ++count[static_cast<int>(p.state)];
    ++tenants[p.address.tenant];
    auto k = by_key_.find(p.address.key);
    if (k == by_key_.end() || k->second != page) {
      return absl::InternalError(absl::StrFormat("shared page %d: key %016x not indexed to it", page, p.address.key));
    }
    const bool cached = cache_rank_.contains(page);
    in_cache += cached;
    if (cached != (p.state == SharedPageState::kCached) ||
        (cached && !cache_.contains({cache_rank_.at(page), page}))) {
      return absl::InternalError(absl::StrFormat("shared page %d (%s): in the eviction order %d", page,
                                                 SharedPageStateName(p.state), cached));
    }
    const bool want_holders = p.state == SharedPageState::kShared;
    if (want_holders == p.holders.empty()) {
      return absl::InternalError(absl::StrFormat("shared page %d (%s) has %d holders", page,
                                                 SharedPageStateName(p.state), p.refs()));
    }
    if ((p.state == SharedPageState::kWriting) != (p.writer != 0)) {
      return absl::InternalError(absl::StrFormat("shared page %d (%s): writer %d", page, SharedPageStateName(p.state),
                                                 p.writer));
    }
  }
  for (int i = 0; i < 3; ++i) {
    if (count[i] != count_[i]) {
      return absl::InternalError(absl::StrFormat("%s pages counted %d, recounted %d",
                                                 SharedPageStateName(static_cast<SharedPageState>(i)), count_[i],
                                                 count[i]));
    }
  }
  if (by_key_.size() != pages_.size() || in_cache != cache_.size() || cache_.size() != cache_rank_.size() ||
      tenants != std::map<uint64_t, uint32_t>(tenant_pages_.begin(), tenant_pages_.end())) {
    return absl::InternalError("prefix index, eviction order or tenant counts out of step with the stored pages");
  }
  return absl::OkStatus();
}

}  // namespace dhs::memd
