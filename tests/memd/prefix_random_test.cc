// Randomized test of the content-addressed host tier (issue 24) inside ResidencyManager, driven through the events
// memd's daemon sends: admissions naming prefix chains (a few chains shared by many requests, two tenants with the
// same block ids and tokens, and chains whose ids repeat with other tokens), HostCopyWritten, reclaims answered
// (backups written, ReadersDone), populations answered, Complete at any time, fences and re-registrations, resumes,
// and memd restarts that adopt the journal's shared pages. A small host pool forces evictions.
// Issue 26: a cluster tier (a model store, outliving memd restarts) receives every page the core confirms shared
// (DrainClusterPublish, with the bytes the fake worker wrote there); before an admission the pages the core names
// (ClusterLookups) that the store holds are imported (a run from the first, cut at random: a miss) into the room the
// core names (ClusterRoom), carrying the stored bytes: the exactness checks of every later grant cover them.
//
// The fake worker keeps what every host page really holds (the content it wrote: tenant, block ids and token digests
// up to the page's block, page index; computed here with the header's hash, independently of the core), so every
// import is checked for exactness: a grant's shared page must hold exactly what the request would have computed.
// After every event, from the dump and the public tier (not the core's own recount): CheckInvariants; each shared
// page's references = the requests whose confirmed host copies name it, a cached page none and never free in the host
// pool; cached + shared + private + free == the pool; no page held by two tenants; a writing page never imported.
// Issue 26, sessions across nodes: some requests are turns of a session (4 sessions, each a tenant, a chain and a
// script of per-page tokens after the chain; a turn sometimes diverges from the script, i.e. other tokens: other
// digests). Such an admission names session digests (the model's own hash of a page's whole history, as the worker's
// common/session_digest.h); its Complete publishes the pages the core names (SessionPages: each checked to hold its
// history exactly) to the model store under (tenant, session, digest, page); before an admission the session
// addresses the core names are looked up there by those four fields and imported like prefix pages, and the grant
// check covers them (a shared page granted must hold exactly what the request would compute there).
// Seeds: 1..20 by default, or env DHS_SEED; events per seed: env DHS_EVENTS (2000).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "memd/host_journal.h"
#include "memd/residency_manager.h"
#include "tests/memd/residency_test_util.h"
#include "xxhash.h"

namespace dhs::memd {
namespace {

constexpr uint32_t kGpus = 2, kM = 24, kHost = 40, kSlots = 6, kPageRows = 4, kBlockTokens = 8;

struct Content {  // what a shareable page holds: its tenant, and the chain of (id, digest) up to its block; its page
  std::string tenant;
  std::vector<std::pair<uint64_t, uint64_t>> chain;
  uint32_t page = 0;
  std::vector<uint64_t> tokens;  // issue 26: a session turn's page: the tokens of every page up to it (chain empty)
  bool operator==(const Content&) const = default;
};

struct MReq {
  GpuId gpu = 0;
  std::string tenant;
  std::vector<uint64_t> ids, digests;
  uint32_t context = 0;
  bool granted = false, interrupted = false;
  std::set<uint32_t> imported;  // history pages granted as shared
  std::map<uint32_t, PageIndex> taken;  // a queued resume: the confirmed host copies it took over
  // Issue 26: a session turn (session > 0: 1 + the session's index), its pages' tokens (one value per page of its
  // context; its chain's block digests are made of them) and how many of its context pages are complete input pages.
  uint32_t session = 0;
  std::vector<uint64_t> tokens;
  uint32_t input_pages = 0;
};

uint32_t Shareable(const MReq& m) {
  return std::min<uint32_t>(static_cast<uint32_t>(m.ids.size()) * kBlockTokens / kPageRows, m.context);
}
Content ContentOf(const MReq& m, uint32_t h) {
  if (m.session != 0) {  // issue 26: a session turn's page holds the rows of its tokens up to the page's end
    return Content{m.tenant, {}, h, std::vector<uint64_t>(m.tokens.begin(), m.tokens.begin() + h + 1)};
  }
  const uint32_t b = ((h + 1) * kPageRows - 1) / kBlockTokens;
  Content c{m.tenant, {}, h, {}};
  for (uint32_t i = 0; i <= b && i < m.ids.size(); ++i) c.chain.emplace_back(m.ids[i], m.digests[i]);
  return c;
}
// Issue 26: the session digest of page h: a hash of every token up to the page's end, not of the tenant (the key
// has it). Independent of the core's hashes.
uint64_t SessionDigestOf(const MReq& m, uint32_t h) {
  std::vector<uint64_t> words = {0x5e55, h};
  words.insert(words.end(), m.tokens.begin(), m.tokens.begin() + h + 1);
  return XXH3_64bits(words.data(), words.size() * sizeof(uint64_t));
}
uint64_t SessionHashOf(const MReq& m) {  // what the daemon computes (SessionHash): any nonzero per (tenant, session)
  const uint64_t words[2] = {PrefixPages::TenantHash(m.tenant), m.session};
  return XXH3_64bits(words, sizeof words) | 1;
}

struct Stored {  // issue 26: a value in the model store
  PrefixAddress address;
  Content content;
  uint64_t checksum = 0;
};

class Harness : Dice {
 public:
  explicit Harness(uint64_t seed) : Dice(seed), journal_(kHost) {
    NewCore();
    for (GpuId g = 0; g < kGpus; ++g) EXPECT_TRUE(mgr_->RegisterGpu(g, kM, kSlots).ok());
    up_.assign(kGpus, true);
  }

  void Step() {
    ++now_;
    const uint32_t dice = Pick(100);
    if (dice < 22 && model_.size() < 14) return Admit();
    if (dice < 40) return Written();
    if (dice < 52 && !model_.empty()) return Complete(PickKey(model_));
    if (dice < 60) return Run(mgr_->Populate());
    if (dice < 70) return AnswerPopulate();
    if (dice < 80) return AnswerReclaim();
    if (dice == 80 && Pick(3) == 0) return Fence();
    if (dice == 81) return Reregister();
    if (dice < 85) return Resume();
    if (dice == 85 && Pick(4) == 0 && now_ < 1500) return Restart();
    if (dice == 86) return Run(mgr_->ReleaseHeldPages());
    return Run(mgr_->RetryBackups());
  }

  void Drain() {
    Run(mgr_->ReleaseHeldPages());
    for (GpuId g = 0; g < kGpus; ++g) {
      if (!up_[g]) Reregister(g);
    }
    for (int guard = 0; guard < 10000 && (!populates_.empty() || !reclaims_.empty()); ++guard) {
      if (!populates_.empty()) AnswerPopulate();
      if (!reclaims_.empty()) AnswerReclaim();
    }
    while (!model_.empty()) Complete(model_.begin()->first);
    for (int guard = 0; guard < 10000 && (!populates_.empty() || !reclaims_.empty()); ++guard) {
      if (!populates_.empty()) AnswerPopulate();
      if (!reclaims_.empty()) AnswerReclaim();
    }
    // Everything released: only cached pages stay, each an allocated host page, none pinned.
    EXPECT_EQ(mgr_->prefix()->shared() + mgr_->prefix()->writing(), 0u);
    EXPECT_EQ(mgr_->host().allocated(), mgr_->prefix()->cached());
    EXPECT_EQ(mgr_->host().pinned(), 0u);
  }

  uint64_t hits() const { return hits_; }
  uint64_t mismatch_chains() const { return mismatch_chains_; }
  uint64_t cross_tenant_chains() const { return cross_tenant_chains_; }
  const PrefixCounters& counters() const { return mgr_->prefix()->counters(); }
  uint64_t evictions() const { return evictions_ + mgr_->prefix()->counters().evictions; }
  uint64_t max_cached() const { return max_cached_; }
  uint64_t adopted() const { return adopted_; }
  uint64_t kv_events() const { return kv_events_; }
  uint64_t cluster_imports() const { return cluster_imports_; }
  uint64_t cluster_published() const { return cluster_published_; }
  uint64_t session_turns() const { return session_turns_; }
  uint64_t session_published() const { return session_published_; }
  uint64_t session_imports() const { return session_imports_; }
  uint64_t session_grants() const { return session_grants_; }
  uint64_t chain_by_session() const { return chain_by_session_; }
  uint64_t session_hits() const { return mgr_->prefix()->counters().session_hits; }

 private:
  void NewCore() {
    ResidencyConfig c{.reserve_pages = 1, .host_pages = kHost, .host_page_bytes = 4096,
                      .populate_pages_per_attempt = 3, .reclaim_policy = "largest-first", .prefix_sharing = true,
                      .prefix = PrefixConfig{.kv_events = true, .cluster_outbox = true}};  // issues 24, 26
    mgr_ = std::move(*ResidencyManager::Create(c, [this] { return now_; }, journal_.get()));
  }

  // Chains: 3 families of 5 blocks (ids 100f + b, digests 7000 + 10f + b); a request takes a family's first 1..5
  // blocks, a tenant "" or "t2", and sometimes block 1's tokens differ (digest + 1: same ids, other content).
  void Admit() {
    const RequestId r = next_id_++;
    MReq m;
    m.gpu = Pick(kGpus);
    if (Pick(5) < 2) return AdmitTurn(r, m);  // issue 26: a session's turn
    const uint32_t family = Pick(3), blocks = 1 + Pick(5);
    m.tenant = Pick(3) == 0 ? "t2" : "";
    cross_tenant_chains_ += m.tenant == "t2";
    for (uint32_t b = 0; b < blocks; ++b) {
      m.ids.push_back(100 * family + b);
      m.digests.push_back(7000 + 10 * family + b + (b == 1 && Pick(6) == 0 ? 1 : 0));
    }
    mismatch_chains_ += blocks > 1 && m.digests[1] % 10 != 1;
    m.context = Shareable(m) + Pick(4);
    AdmitRequest a;
    a.request = r;
    a.gpu = m.gpu;
    a.required_pages = 1 + Pick(3);
    a.page_rows = kPageRows;
    a.context_rows = uint64_t{m.context} * kPageRows;
    a.history_pages = Pick(m.context + 1);
    a.optional_history = Pick(3) != 0;
    a.prefix = PrefixChain{m.tenant, m.ids, m.digests, kBlockTokens};
    AdmitModel(r, std::move(m), a);
  }

  // Issue 26: a turn of session s (0..3: tenant "" for s < 3, else "t2"): its pages' tokens follow the session's
  // script (page j: 500 s + j), diverging sometimes from a page on (other tokens); a chain of 1..3 blocks (ids
  // 5000 + 100 s + b, digests made of the block's page tokens: a longer chain than an earlier turn's covers pages
  // that turn published under its session); its input is some of its context pages (the rest: what it generates).
  void AdmitTurn(RequestId r, MReq& m) {
    const uint32_t s = Pick(4);
    m.session = 1 + s;
    m.tenant = s < 3 ? "" : "t2";
    const uint32_t blocks = 1 + Pick(3), per_block = kBlockTokens / kPageRows;
    m.context = std::min<uint32_t>(blocks * per_block + 1 + Pick(8), 16);
    const uint32_t diverge = Pick(5) == 0 ? Pick(m.context) : UINT32_MAX;
    for (uint32_t j = 0; j < m.context; ++j) m.tokens.push_back(500 * s + j + (j >= diverge ? 7 : 0));
    for (uint32_t b = 0; b < blocks; ++b) {
      m.ids.push_back(5000 + 100 * s + b);
      m.digests.push_back(XXH3_64bits(&m.tokens[b * per_block], per_block * sizeof(uint64_t)));
    }
    m.input_pages = Shareable(m) + Pick(m.context - Shareable(m) + 1);  // its chain covers complete input blocks
    ++session_turns_;
    AdmitRequest a;
    a.request = r;
    a.gpu = m.gpu;
    a.required_pages = 1 + Pick(3);
    a.page_rows = kPageRows;
    a.context_rows = uint64_t{m.context} * kPageRows;
    a.history_pages = Pick(m.context + 1);
    a.optional_history = Pick(3) != 0;
    a.prefix = PrefixChain{m.tenant, m.ids, m.digests, kBlockTokens};
    SetSession(m, a);
    AdmitModel(r, std::move(m), a);
  }

  // The worker's session fields of an admission: the digests of its complete input pages.
  static void SetSession(const MReq& m, AdmitRequest& a) {
    if (m.session == 0) return;
    a.session_hash = SessionHashOf(m);
    for (uint32_t h = 0; h < m.input_pages; ++h) a.session_digests.push_back(SessionDigestOf(m, h));
  }

  void AdmitModel(RequestId r, MReq m, const AdmitRequest& a) {
    if (!up_[m.gpu]) {
      EXPECT_EQ(mgr_->Admit(a).code(), absl::StatusCode::kNotFound);
      mgr_->DrainOrders();
      return Check();
    }
    model_[r] = m;
    ImportFromStore(a);  // issue 26: before the grant decision, as the daemon does
    if (::testing::Test::HasFatalFailure()) return;
    Run(mgr_->Admit(a));
  }

  // Issue 26: the model store's value for a wanted address: a prefix page by its key (its content checked, as the
  // value check does), a session page by (tenant, session, digest, page); nullptr: a miss.
  const Stored* StoredFor(const PrefixAddress& w) const {
    if (w.session != 0) {
      auto it = session_store_.find(SessionKey{w.tenant, w.session, w.content, w.page});
      return it == session_store_.end() ? nullptr : &it->second;
    }
    auto it = store_.find(w.key);
    return it == store_.end() || it->second.address.content != w.content ? nullptr : &it->second;
  }

  // Issue 26: the pages the core names that the model store holds (a run from the first; a random cut is a miss),
  // imported into the room it names with the stored bytes.
  void ImportFromStore(const AdmitRequest& a) {
    const std::vector<PrefixAddress> wanted = mgr_->ClusterLookups(a);
    // What the daemon asks: the wanted addresses, and a session admission's chain pages under their session key too
    // (memd/cluster_sessions.h SessionAlternates): a page found either way serves (the prefix value first).
    const ClusterAsk ask = SessionAlternates(wanted, PrefixPages::TenantHash(a.prefix.tenant), a.session_hash,
                                             a.session_digests, kPageRows);
    auto served = [&](size_t i) -> const Stored* {
      if (const Stored* s = StoredFor(wanted[i])) return s;
      if (ask.alternate[i] < 0) return nullptr;
      const PrefixAddress& alt = ask.asked[static_cast<size_t>(ask.alternate[i])];
      EXPECT_EQ(alt.session, a.session_hash);
      EXPECT_EQ(alt.page, wanted[i].page);
      EXPECT_EQ(alt.content, a.session_digests[wanted[i].page]);
      return StoredFor(alt);
    };
    // The names: the chain's addresses first, then session addresses only, each of its session and digests.
    bool sessions = false;
    for (const PrefixAddress& w : wanted) {
      if (w.session == 0) {
        ASSERT_FALSE(sessions) << "a prefix address after a session address";
        continue;
      }
      sessions = true;
      ASSERT_EQ(w.session, a.session_hash);
      ASSERT_EQ(w.tenant, PrefixPages::TenantHash(a.prefix.tenant));
      ASSERT_LT(w.page, a.session_digests.size());
      ASSERT_EQ(w.content, a.session_digests[w.page]);
      ASSERT_GE(w.page, std::min<uint64_t>(a.prefix.block_ids.size() * kBlockTokens / kPageRows,
                                           a.context_rows / kPageRows));
    }
    uint32_t run = 0;
    // A value under the key with other content is the value check's address mismatch: a miss, the run ends.
    while (run < wanted.size() && served(run) != nullptr && Pick(8) != 0) ++run;
    if (run == 0) return;
    const std::vector<PageIndex> room = mgr_->ClusterRoom(run);
    std::vector<ClusterImport> imports;
    for (size_t i = 0; i < room.size(); ++i) {
      const Stored& s = *served(i);
      session_imports_ += wanted[i].session != 0 || StoredFor(wanted[i]) == nullptr;
      chain_by_session_ += wanted[i].session == 0 && StoredFor(wanted[i]) == nullptr;  // a chain page, by its session key
      ASSERT_FALSE(mgr_->prefix()->AtPage(room[i])) << "room " << room[i] << " is a stored page";
      bytes_[room[i]] = s.content;  // the daemon's copy of the value's payload
      imports.push_back({wanted[i], room[i], s.checksum});
    }
    if (imports.empty()) return;
    cluster_imports_ += imports.size();
    Run(mgr_->ImportClusterPages(imports));
  }

  // Issue 26: what the core confirmed shared since the last event goes to the model store.
  void Publish() {
    for (const ClusterPublishPage& p : mgr_->DrainClusterPublish()) {
      const SharedPage* sp = mgr_->prefix()->AtPage(p.host_page);
      ASSERT_TRUE(sp != nullptr && sp->state != SharedPageState::kWriting && sp->address == p.address);
      ASSERT_TRUE(bytes_.contains(p.host_page));
      store_[p.address.key] = Stored{p.address, bytes_.at(p.host_page), p.checksum};
      ++cluster_published_;
    }
  }

  // Issue 26: a session turn's Complete (as the daemon's, before the event): the pages the core names for its
  // session (digests of all its context pages: its input, then what it generated) go to the model store; each must be
  // a confirmed page of its own holding exactly its history there (never a prefix page, never one it holds shared).
  void PublishSession(RequestId r) {
    const MReq& m = model_.at(r);
    if (m.session == 0 || !m.granted || m.interrupted) return;  // an interrupted turn's end names no pages
    std::vector<uint64_t> digests;
    for (uint32_t h = 0; h < m.context; ++h) digests.push_back(SessionDigestOf(m, h));
    const RequestDump d = Dump(r);
    for (const SessionPublishPage& p : mgr_->SessionPages(r, digests)) {
      ASSERT_GE(p.page, Shareable(m)) << "a prefix page published under the session";
      ASSERT_FALSE(m.imported.contains(p.page)) << "a page it holds shared published under the session";
      ASSERT_NE(std::find(d.host_copies.begin(), d.host_copies.end(), std::make_pair(p.page, p.host_page)),
                d.host_copies.end()) << "request " << r << " page " << p.page << " is not its confirmed copy";
      ASSERT_EQ(p.digest, digests[p.page]);
      ASSERT_TRUE(bytes_.contains(p.host_page));
      ASSERT_EQ(bytes_.at(p.host_page), ContentOf(m, p.page)) << "request " << r << " publishes wrong rows";
      session_store_[SessionKey{PrefixPages::TenantHash(m.tenant), SessionHashOf(m), p.digest, p.page}] =
          Stored{PrefixAddress{}, bytes_.at(p.host_page), p.checksum};
      ++session_published_;
    }
  }

  // The worker writes some of a granted request's computed pages and reports them (the bytes land first).
  void Written() {
    std::vector<RequestId> granted;
    for (const auto& [id, m] : model_) {
      if (m.granted && !m.interrupted && m.context > 0) granted.push_back(id);
    }
    if (granted.empty()) return Run(mgr_->Populate());
    const RequestId r = granted[Pick(static_cast<uint32_t>(granted.size()))];
    const MReq& m = model_.at(r);
    const RequestDump d = Dump(r);
    std::set<uint32_t> confirmed;
    for (const auto& [h, p] : d.host_copies) confirmed.insert(h);
    std::vector<uint32_t> pages;
    std::vector<uint64_t> sums;
    std::set<PageIndex> backing_up;  // host pages a pending reclaim of r backs up into: the worker writes them there
    for (const auto& [order, rc] : reclaims_) {
      if (rc.request == r && !rc.backed_up) backing_up.insert(rc.order.backup_host_pages.begin(),
                                                              rc.order.backup_host_pages.end());
    }
    for (uint32_t h = 0; h < m.context; ++h) {
      if (confirmed.contains(h) || Pick(2) != 0) continue;  // a confirmed page (shared ones too) is never rewritten
      if (backing_up.contains(HostPageOf(r, h))) continue;  // (a real worker never writes one page both ways)
      pages.push_back(h);
      sums.push_back(1 + h);
    }
    if (pages.empty()) return Run(mgr_->Populate());
    for (uint32_t h : pages) { SCOPED_TRACE("written r=" + std::to_string(r) + " h=" + std::to_string(h)); WriteBytes(m, h, HostPageOf(r, h)); }
    Run(mgr_->OnHostCopyWritten(r, pages, {}, true, sums));
  }

  void WriteBytes(const MReq& m, uint32_t h, PageIndex host_page) {
    // A shared page is immutable: no worker ever writes one (the core never hands one as a page to compute).
    if (const SharedPage* p = mgr_->prefix()->AtPage(host_page); p && p->state != SharedPageState::kWriting) {
      FAIL() << "host page " << host_page << " is " << SharedPageStateName(p->state) << " but assigned to be written"
             << " (session " << m.session << ", page " << h << "; stored page " << p->address.page << " session "
             << p->address.session << " blocks " << p->address.blocks << " writer " << p->writer << ", holders "
             << p->holders.size() << ")";
    }
    bytes_[host_page] = ContentOf(m, h);
  }

  PageIndex HostPageOf(RequestId r, uint32_t h) { return host_pages_.at(r).at(h); }

  RequestDump Dump(RequestId r) {
    const std::optional<RequestDump> d = DumpOf(*mgr_, r);
    if (!d) ADD_FAILURE() << "request " << r;
    return d.value_or(RequestDump{});
  }

  void Complete(RequestId r) {
    PublishSession(r);
    if (::testing::Test::HasFatalFailure()) return;
    model_.erase(r);
    host_pages_.erase(r);
    for (auto& [o, rc] : reclaims_) rc.gone |= rc.request == r;
    Run(mgr_->Complete(r));
  }

  void AnswerPopulate() {
    if (populates_.empty()) return Run(mgr_->Populate());
    auto it = populates_.begin();
    std::advance(it, Pick(static_cast<uint32_t>(populates_.size())));
    const PopulateOrder p = it->second;
    populates_.erase(it);
    // A population reads host pages: each must hold what the request needs there (shared or its own).
    if (model_.contains(p.request)) {
      for (size_t i = 0; i < p.history_pages.size(); ++i) {
        const MReq& m = model_.at(p.request);
        if (p.history_pages[i] < Shareable(m)) {
          ASSERT_TRUE(bytes_.contains(p.host_pages[i]));
          ASSERT_EQ(bytes_.at(p.host_pages[i]), ContentOf(m, p.history_pages[i])) << "populated wrong rows";
        }
      }
    }
    Run(mgr_->OnReadyPublish(p.order, {}, Pick(8) != 0));
  }

  void AnswerReclaim() {
    if (reclaims_.empty()) return Run(mgr_->Populate());
    auto it = reclaims_.begin();
    Pending& rc = it->second;
    const OrderId order = it->first;
    if (!rc.backed_up) {
      rc.backed_up = true;
      if (!rc.order.backup_pages.empty()) {
        if (!rc.gone && model_.contains(rc.request)) {
          const auto& hp = host_pages_.at(rc.request);
          for (PageIndex host : rc.order.backup_host_pages) {
            for (const auto& [h, page] : hp) {
              if (page == host) { SCOPED_TRACE("reclaim r=" + std::to_string(rc.request) + " h=" + std::to_string(h)); WriteBytes(model_.at(rc.request), h, host); }
            }
          }
        }
        std::vector<uint64_t> sums(rc.order.backup_pages.size(), 77);
        return Run(mgr_->OnBackupComplete(order, rc.order.backup_pages, true, {}, sums));
      }
    }
    reclaims_.erase(it);
    Run(mgr_->OnReadersDone(order));
  }

  void Fence() {
    const GpuId g = Pick(kGpus);
    if (!up_[g]) return Run(mgr_->Populate());
    up_[g] = false;
    for (auto it = model_.begin(); it != model_.end();) {
      if (it->second.gpu != g) {
        ++it;
      } else if (it->second.granted || !it->second.taken.empty()) {  // a queued resume: interrupted again
        it->second.granted = it->second.interrupted = true;
        ++it;
      } else {
        fence_rejects_.insert(it->first);
        host_pages_.erase(it->first);
        it = model_.erase(it);
      }
    }
    std::erase_if(reclaims_, [&](const auto& e) { return e.second.order.gpu == g; });
    std::erase_if(populates_, [&](const auto& e) { return e.second.gpu == g; });
    Run(mgr_->FenceGpu(g, "test"));
  }

  void Reregister(std::optional<GpuId> which = std::nullopt) {
    const GpuId g = which ? *which : Pick(kGpus);
    if (up_[g]) return Run(mgr_->Populate());
    up_[g] = true;
    Run(mgr_->RegisterGpu(g, kM, kSlots));
  }

  // The GPU's next worker resumes an interrupted request: same chain (a resume names it too).
  void Resume() {
    const std::vector<RequestId> interrupted = InterruptedOnLiveGpus(model_, up_);
    if (interrupted.empty()) return Run(mgr_->Populate());
    const RequestId old = interrupted[Pick(static_cast<uint32_t>(interrupted.size()))];
    MReq m = model_.at(old);
    m.taken.clear();
    for (const auto& [h, page] : Dump(old).host_copies) m.taken[h] = page;
    const RequestId r = next_id_++;
    AdmitRequest a;
    a.request = r;
    a.gpu = m.gpu;
    a.required_pages = 1;
    a.page_rows = kPageRows;
    a.context_rows = uint64_t{m.context} * kPageRows;
    a.optional_history = true;
    a.host_backed = true;
    a.resume_of = old;
    a.prefix = PrefixChain{m.tenant, m.ids, m.digests, kBlockTokens};
    SetSession(m, a);  // issue 26: a resume names its session too
    model_.erase(old);
    host_pages_.erase(old);
    m.granted = m.interrupted = false;
    m.imported.clear();
    model_[r] = m;
    Run(mgr_->Admit(a));
  }

  // memd dies: a new core verifies the journal (shared pages included) and adopts it; every worker says Hello
  // again (their requests interrupted: the simple path, no report), queued admissions are gone.
  void Restart() {
    std::map<PageIndex, JournaledSharedPage> shared;
    auto verified = journal_->Verify(&shared);
    ASSERT_TRUE(verified.ok()) << verified.status();
    ASSERT_EQ(shared.size(), mgr_->prefix()->shared() + mgr_->prefix()->cached()) << "a confirmed shared page lost";
    std::vector<AdoptedRequest> adopted;
    std::vector<AdoptedSharedPage> pages;
    for (const auto& [page, sp] : shared) pages.push_back({page, sp.key, sp.content, sp.checksum});
    for (const auto& [id, jr] : *verified) {
      if (!jr.confirmed.empty()) {
        const MReq& m = model_.at(id);
        AdoptedRequest a{id, m.gpu, 1, jr.context_pages, jr.confirmed, jr.checksums};
        if (m.granted && Pick(2) == 0) {  // its record's chain (issue 24): it holds its shared pages again
          a.prefix = PrefixChain{m.tenant, m.ids, m.digests, kBlockTokens};
          a.page_rows = kPageRows;
        }
        adopted.push_back(std::move(a));
      }
    }
    std::set<RequestId> keep;
    for (const AdoptedRequest& a : adopted) keep.insert(a.request);
    std::erase_if(model_, [&](const auto& e) { return !keep.contains(e.first); });
    std::erase_if(host_pages_, [&](const auto& e) { return !keep.contains(e.first); });
    for (auto& [id, m] : model_) m.granted = m.interrupted = true;
    reclaims_.clear();
    populates_.clear();
    evictions_ += mgr_->prefix()->counters().evictions;
    NewCore();
    ASSERT_TRUE(mgr_->AdoptHostPages(adopted, pages).ok());
    adopted_ += pages.size();
    ASSERT_EQ(mgr_->prefix()->cached() + mgr_->prefix()->shared(), pages.size());  // held again: shared
    for (GpuId g = 0; g < kGpus; ++g) {
      up_[g] = false;
      if (!mgr_->fenced(g)) {
        up_[g] = true;
        ASSERT_TRUE(mgr_->RegisterGpu(g, kM, kSlots).ok());
      }
    }
    ASSERT_TRUE(mgr_->DrainOrders().empty());
    Check();
  }

  void Run(absl::Status s) {
    ASSERT_TRUE(s.ok()) << s;
    for (const Order& o : mgr_->DrainOrders()) {
      if (const auto* g = std::get_if<GrantOrder>(&o)) OnGrant(*g);
      if (const auto* rc = std::get_if<ReclaimOrder>(&o)) reclaims_[rc->order] = Pending{rc->request, *rc};
      if (const auto* p = std::get_if<PopulateOrder>(&o)) populates_[p->order] = *p;
      if (const auto* rj = std::get_if<RejectOrder>(&o)) {
        if (!fence_rejects_.erase(rj->request)) {
          model_.erase(rj->request);
          host_pages_.erase(rj->request);
        }
      }
    }
    Check();
  }

  void OnGrant(const GrantOrder& g) {
    ASSERT_TRUE(model_.contains(g.request));
    MReq& m = model_.at(g.request);
    m.granted = true;
    m.taken.clear();
    auto& pages = host_pages_[g.request];
    for (uint32_t h = 0; h < g.host_pages.size(); ++h) pages[h] = g.host_pages[h];
    const std::set<uint32_t> backed(g.host_backed_pages.begin(), g.host_backed_pages.end());
    for (uint32_t h : g.shared_pages) {
      ASSERT_TRUE(backed.contains(h)) << "a shared page not host-backed";
      ASSERT_LT(h, m.session != 0 ? m.input_pages : Shareable(m));  // issue 26: a turn's input pages
      // Exactness: the shared page holds exactly what this request would have computed there.
      ASSERT_TRUE(bytes_.contains(g.host_pages[h])) << "imported a page never written";
      ASSERT_EQ(bytes_.at(g.host_pages[h]), ContentOf(m, h)) << "request " << g.request << " page " << h;
      const SharedPage* p = mgr_->prefix()->AtPage(g.host_pages[h]);
      ASSERT_NE(p, nullptr);
      ASSERT_EQ(p->state, SharedPageState::kShared);
      m.imported.insert(h);
      ++hits_;
      session_grants_ += h >= Shareable(m);
    }
  }

  void Check() {
    ASSERT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();
    Publish();
    if (::testing::Test::HasFatalFailure()) return;
    const PrefixPages& tier = *mgr_->prefix();
    const HostPageAllocator& host = mgr_->host();
    const StateDump d = mgr_->Dump();
    // Holders from the dump: the requests whose confirmed host copies name a stored page.
    std::map<PageIndex, std::set<RequestId>> holders;
    for (const RequestDump& rd : d.requests) {
      for (const auto& [h, page] : rd.host_copies) {
        if (const SharedPage* p = tier.AtPage(page); p && p->state != SharedPageState::kWriting) {
          holders[page].insert(rd.request);
        }
      }
      if (rd.state != RequestState::kQueued) continue;
      for (const auto& [h, page] : model_.at(rd.request).taken) {  // a queued resume's, from the model
        if (tier.AtPage(page) != nullptr) holders[page].insert(rd.request);
      }
    }
    uint32_t shared = 0, cached = 0;
    for (const auto& [page, p] : tier.pages()) {
      ASSERT_FALSE(host.is_free(page)) << "stored page " << page << " is free in the host pool";
      if (p.state == SharedPageState::kWriting) continue;
      shared += p.state == SharedPageState::kShared;
      cached += p.state == SharedPageState::kCached;
      const auto held = holders.contains(page) ? holders.at(page) : std::set<RequestId>{};
      ASSERT_EQ(p.refs(), held.size()) << "page " << page << ": references != requests holding it";
      ASSERT_EQ(p.holders, held);
      ASSERT_EQ(p.state == SharedPageState::kCached, held.empty());
      std::set<std::string> tenants;
      for (RequestId id : held) tenants.insert(model_.at(id).tenant);
      ASSERT_LE(tenants.size(), 1u) << "page " << page << " shared by two tenants";
      if (!tenants.empty() && p.address.tenant != 0) {
        ASSERT_EQ(p.address.tenant, PrefixPages::TenantHash(*tenants.begin()));
      }
    }
    const uint32_t shared_pool = host.pages_of(kSharedOwner);
    const uint32_t private_pages = host.allocated() - shared_pool;
    const uint32_t free_pages = host.reusable() + host.freed_pinned();
    ASSERT_EQ(shared + cached, shared_pool);
    ASSERT_EQ(cached + shared + private_pages + free_pages, kHost);
    max_cached_ = std::max<uint64_t>(max_cached_, cached);
    CheckKvEvents(tier);
  }

  // Issue 24's KV events replayed (memd/kv_block_ledger.h): a block is stored once before it is removed, and the
  // blocks announced stored are exactly those whose kBlockTokens / kPageRows pages are all confirmed (shared or
  // cached) with a known chain; a new core (memd restart) clears them first.
  void CheckKvEvents(const PrefixPages& tier) {
    for (const KvEvent& e : mgr_->DrainKvEvents()) {
      const std::pair<uint64_t, uint64_t> block{e.tenant, e.block_hash};
      if (e.kind == KvEventKind::kAllBlocksCleared) {
        announced_.clear();
      } else if (e.kind == KvEventKind::kBlockStored) {
        ASSERT_TRUE(announced_.insert(block).second) << "block " << e.block_hash << " stored twice";
        ASSERT_EQ(e.pages, kBlockTokens / kPageRows);
      } else {
        ASSERT_EQ(announced_.erase(block), 1u) << "block " << e.block_hash << " removed but not stored";
      }
      ++kv_events_;
    }
    std::map<std::pair<uint64_t, uint64_t>, uint32_t> confirmed;
    for (const auto& [page, p] : tier.pages()) {
      if (p.state != SharedPageState::kWriting && p.address.blocks > 0) ++confirmed[{p.address.tenant, p.address.chain}];
    }
    std::set<std::pair<uint64_t, uint64_t>> complete;
    for (const auto& [block, n] : confirmed) {
      if (n == kBlockTokens / kPageRows) complete.insert(block);
    }
    ASSERT_EQ(announced_, complete);
  }

  struct Pending {
    RequestId request = 0;
    ReclaimOrder order;
    bool backed_up = false, gone = false;
  };
  int64_t now_ = 0;
  RequestId next_id_ = 1;
  JournalMemory journal_;
  std::unique_ptr<ResidencyManager> mgr_;
  std::vector<bool> up_;
  std::map<RequestId, MReq> model_;
  std::map<RequestId, std::map<uint32_t, PageIndex>> host_pages_;
  std::map<PageIndex, Content> bytes_;  // what each host page holds (the fake worker's writes)
  std::map<OrderId, Pending> reclaims_;
  std::map<OrderId, PopulateOrder> populates_;
  std::set<RequestId> fence_rejects_;
  std::set<std::pair<uint64_t, uint64_t>> announced_;  // blocks the KV events say are stored
  uint64_t kv_events_ = 0;
  std::map<uint64_t, Stored> store_;  // key -> value; outlives memd restarts (the store is not memd's)
  using SessionKey = std::tuple<uint64_t, uint64_t, uint64_t, uint32_t>;  // tenant, session, digest, page
  std::map<SessionKey, Stored> session_store_;  // issue 26: session pages
  uint64_t cluster_imports_ = 0, cluster_published_ = 0;
  uint64_t session_turns_ = 0, session_published_ = 0, session_imports_ = 0, session_grants_ = 0, chain_by_session_ = 0;
  uint64_t hits_ = 0, mismatch_chains_ = 0, cross_tenant_chains_ = 0, evictions_ = 0, max_cached_ = 0, adopted_ = 0;
};

TEST(PrefixRandom, InvariantsAfterEveryEvent) {
  const std::vector<uint64_t> seeds = Seeds();
  const int events = Events();
  uint64_t hits = 0, evictions = 0, mismatches = 0, max_cached = 0, adopted = 0, lookups = 0, kv_events = 0;
  uint64_t cluster_imports = 0, cluster_published = 0;
  uint64_t turns = 0, session_published = 0, session_imports = 0, session_grants = 0, session_hits = 0;
  uint64_t chain_by_session = 0;
  for (uint64_t seed : seeds) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Harness h(seed);
    for (int i = 0; i < events; ++i) {
      h.Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    h.Drain();
    if (::testing::Test::HasFatalFailure()) return;
    hits += h.hits();
    evictions += h.evictions();
    mismatches += h.counters().content_mismatches;
    lookups += h.counters().lookups;
    max_cached = std::max(max_cached, h.max_cached());
    adopted += h.adopted();
    kv_events += h.kv_events();
    cluster_imports += h.cluster_imports();
    cluster_published += h.cluster_published();
    turns += h.session_turns();
    session_published += h.session_published();
    session_imports += h.session_imports();
    session_grants += h.session_grants();
    session_hits += h.session_hits();
    chain_by_session += h.chain_by_session();
  }
  std::printf("prefix random: issue 26's sessions: %llu turns, %llu session pages published, %llu imported, %llu "
              "granted (pages after the chain), %llu session hits (last core), %llu chain pages found by their session "
              "key\n",
              (unsigned long long)turns, (unsigned long long)session_published, (unsigned long long)session_imports,
              (unsigned long long)session_grants, (unsigned long long)session_hits,
              (unsigned long long)chain_by_session);
  std::printf("prefix random: issue 26's model store: %llu pages published, %llu imported before admissions\n",
              (unsigned long long)cluster_published, (unsigned long long)cluster_imports);
  std::printf("prefix random: %zu seeds x %d events: %llu shared pages imported, %llu lookups (last core), %llu "
              "content mismatches (last core), %llu evictions, %llu shared pages adopted by restarts, at most %llu "
              "cached at once\n",
              seeds.size(), events, (unsigned long long)hits, (unsigned long long)lookups,
              (unsigned long long)mismatches, (unsigned long long)evictions, (unsigned long long)adopted,
              (unsigned long long)max_cached);
  std::printf("prefix random: %llu KV events replayed against the stored blocks\n", (unsigned long long)kv_events);
  if (seeds.size() == 20 && events == 2000) {  // the default run exercises every part
    EXPECT_GT(kv_events, 100u);
    EXPECT_GT(hits, 100u);
    EXPECT_GT(evictions, 10u);
    EXPECT_GT(mismatches, 0u);
    EXPECT_GT(adopted, 0u);
    EXPECT_GT(cluster_imports, 10u);
    EXPECT_GT(cluster_published, 100u);
    EXPECT_GT(session_published, 100u);
    EXPECT_GT(session_imports, 10u);
    EXPECT_GT(session_grants, 10u);
    EXPECT_GT(chain_by_session, 10u);
  }
}

}  // namespace
}  // namespace dhs::memd
