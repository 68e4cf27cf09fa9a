// Randomized state-machine test of ResidencyManager (brief §4): random admissions, completions, decode appends,
// population attempts and retries, against fake workers that hold the outstanding orders (backups, population
// copies, withdrawals) and answer them in random order, some failing. After every event: CheckInvariants, page
// ownership counted from the dump, and safety from the test's own model of which history pages have a host copy or
// are readable on GPU. Seeds: 1..20 by default, or the one in env DHS_SEED; events per seed: env DHS_EVENTS (2000).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "memd/residency_manager.h"

namespace dhs::memd {
namespace {

constexpr uint32_t kGpus = 2, kM = 24, kRes = 2, kHost = 48;

struct ModelPage {
  bool on_gpu = false;  // readable on GPU: tail, or an optional page whose copy completed and is not retired
  bool host = false;    // complete host copy
};

class Harness {
 public:
  explicit Harness(uint64_t seed, const std::string& policy) : rng_(seed) {
    ResidencyConfig c{.reserve_pages = kRes, .host_pages = kHost, .host_page_bytes = 4096,
                      .populate_pages_per_attempt = 3, .reclaim_policy = policy};
    mgr_ = std::move(*ResidencyManager::Create(c, [this] { return now_; }));
    for (GpuId g = 0; g < kGpus; ++g) EXPECT_TRUE(mgr_->RegisterGpu(g, kM).ok());
  }

  void Step() {
    ++now_;
    const int dice = Pick(100);
    absl::Status s;
    if (dice < 18 && live_.size() + queued_.size() < 14) {
      const RequestId r = next_id_++;
      const bool oversize = Pick(40) == 0;
      const uint32_t required = oversize ? kM : 1 + Pick(5);
      s = mgr_->Admit({r, static_cast<GpuId>(Pick(kGpus)), static_cast<SlotIndex>(r), required, Pick(9)});
      queued_.insert(r);
    } else if (dice < 28 && !AllRequests().empty()) {
      const RequestId r = PickFrom(AllRequests());
      s = mgr_->Complete(r);
      live_.erase(r);
      queued_.erase(r);
      model_.erase(r);
    } else if (dice < 40 && !live_.empty()) {
      const RequestId r = PickFrom(live_);
      s = mgr_->OnTailPageComplete(r);
      model_[r].push_back({.on_gpu = true, .host = false});
    } else if (dice < 60 && !backups_.empty()) {
      s = AnswerBackup(Pick(10) != 0);
    } else if (dice < 75 && !populates_.empty()) {
      s = AnswerPopulate(Pick(10) != 0);
    } else if (dice < 87 && !withdraws_.empty()) {
      s = mgr_->OnReadersDone(Take(withdraws_).reclaim);
    } else if (dice < 95) {
      s = mgr_->Populate();
    } else {
      s = mgr_->RetryBackups();
    }
    ASSERT_TRUE(s.ok()) << s;
    Absorb();
    Check();
  }

  // Answers everything (ok), completes every request; then all pages must be free again.
  void Drain() {
    for (;;) {
      while (!backups_.empty() || !populates_.empty() || !withdraws_.empty()) {
        if (!backups_.empty()) ASSERT_TRUE(AnswerBackup(true).ok());
        else if (!populates_.empty()) ASSERT_TRUE(AnswerPopulate(true).ok());
        else ASSERT_TRUE(mgr_->OnReadersDone(Take(withdraws_).reclaim).ok());
        Absorb();
        Check();
      }
      const std::set<RequestId> all = AllRequests();
      if (all.empty()) break;
      const RequestId r = *all.begin();
      ASSERT_TRUE(mgr_->Complete(r).ok());
      live_.erase(r);
      queued_.erase(r);
      model_.erase(r);
      Absorb();  // may grant queued admissions
      Check();
    }
    for (GpuId g = 0; g < kGpus; ++g) EXPECT_EQ(mgr_->gpu_table(g)->free(), kM);
    EXPECT_EQ(mgr_->host().reusable(), kHost);
  }

  const Counters& counters() const { return mgr_->counters(); }

  // A fake worker answers one outstanding backup / population copy (picked at random); the model follows.
  absl::Status AnswerBackup(bool ok) {
    const BackupOrder b = Take(backups_);
    absl::Status s = mgr_->OnBackupDone(b.copy, ok);
    if (ok && live_.count(b.request)) {
      ModelPage& p = model_[b.request][b.history_page];
      p.host = true;
      if (b.from_tail) p.on_gpu = false;  // leaves the tail after its backup
    }
    return s;
  }
  absl::Status AnswerPopulate(bool ok) {
    const PopulateOrder p = Take(populates_);
    absl::Status s = mgr_->OnPopulateDone(p.copy, ok);
    if (ok && live_.count(p.request)) model_[p.request][p.history_page].on_gpu = true;
    return s;
  }

 private:
  uint32_t Pick(uint32_t n) { return std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_); }
  template <typename C>
  RequestId PickFrom(const C& c) {
    auto it = c.begin();
    std::advance(it, Pick(static_cast<uint32_t>(c.size())));
    return *it;
  }
  template <typename T>
  T Take(std::vector<T>& v) {
    const size_t i = Pick(static_cast<uint32_t>(v.size()));
    T t = v[i];
    v.erase(v.begin() + static_cast<std::ptrdiff_t>(i));
    return t;
  }
  std::set<RequestId> AllRequests() const {
    std::set<RequestId> all = live_;
    all.insert(queued_.begin(), queued_.end());
    return all;
  }

  // Applies the orders to the fake workers and the model.
  void Absorb() {
    for (Order& o : mgr_->DrainOrders()) {
      if (auto* g = std::get_if<GrantOrder>(&o)) {
        ASSERT_TRUE(queued_.erase(g->request));
        live_.insert(g->request);
        auto& pages = model_[g->request];
        for (PageIndex p : g->history_gpu_pages) {
          gpu_map_[{g->gpu, p}] = {g->request, static_cast<uint32_t>(pages.size())};
          pages.push_back({.on_gpu = true, .host = false});
        }
        for (size_t i = 0; i < g->history_host_pages.size(); ++i) pages.push_back({.on_gpu = false, .host = true});
        required_[g->request] = static_cast<uint32_t>(g->required_pages.size());
      } else if (auto* r = std::get_if<RejectOrder>(&o)) {
        ASSERT_TRUE(queued_.erase(r->request));
        EXPECT_EQ(r->error.code(), absl::StatusCode::kResourceExhausted);
      } else if (auto* b = std::get_if<BackupOrder>(&o)) {
        backups_.push_back(*b);
      } else if (auto* p = std::get_if<PopulateOrder>(&o)) {
        populates_.push_back(*p);
        gpu_map_[{p->gpu, p->gpu_page}] = {p->request, p->history_page};
        EXPECT_TRUE(model_[p->request][p->history_page].host) << "population from a page without host copy";
      } else if (auto* w = std::get_if<WithdrawOrder>(&o)) {
        withdraws_.push_back(*w);
      } else if (auto* rt = std::get_if<RetireOrder>(&o)) {
        for (PageIndex p : rt->gpu_pages) {
          auto [req, h] = gpu_map_.at({rt->gpu, p});
          ASSERT_EQ(req, rt->request);
          EXPECT_TRUE(model_[req][h].host) << "retired a page without a host copy";
          model_[req][h].on_gpu = false;
        }
      }
    }
  }

  void Check() {
    ASSERT_TRUE(mgr_->CheckInvariants().ok()) << mgr_->CheckInvariants();
    const StateDump d = mgr_->Dump();
    // Safety from the model: every history page of every admitted request is on GPU or has a host copy.
    for (const auto& [r, pages] : model_) {
      for (size_t h = 0; h < pages.size(); ++h) {
        ASSERT_TRUE(pages[h].on_gpu || pages[h].host) << "request " << r << " history page " << h << " lost";
      }
    }
    std::set<RequestId> dead_owners_expected;
    std::map<RequestId, uint32_t> orphan_pages;
    for (const PopulateOrder& p : populates_) {
      if (!live_.count(p.request)) ++orphan_pages[p.request];
    }
    std::map<RequestId, const RequestDump*> by_id;
    for (const RequestDump& rd : d.requests) by_id[rd.request] = &rd;
    ASSERT_EQ(by_id.size(), live_.size() + queued_.size());
    for (const GpuDump& g : d.gpus) {
      ASSERT_LE(g.required_pages + g.optional_pages + g.reserve_pages, g.pages);
      std::map<RequestId, uint32_t> req, opt;
      uint32_t free = 0;
      for (size_t p = 0; p < g.page_states.size(); ++p) {
        const PageState s = g.page_states[p];
        const RequestId o = g.page_owners[p];
        if (s == PageState::kFree) {
          ++free;
          continue;
        }
        (s == PageState::kRequired ? req : opt)[o]++;
        if (s == PageState::kReclaiming && live_.count(o)) {
          ASSERT_EQ(by_id.at(o)->state, RequestState::kReclaiming);
        }
      }
      ASSERT_EQ(free, g.free_pages);
      for (const auto& [o, n] : opt) {
        if (live_.count(o)) {
          ASSERT_EQ(by_id.at(o)->optional_pages, n) << "a_r of request " << o;
        } else {
          ASSERT_EQ(orphan_pages[o], n) << "pages owned by completed request " << o;
        }
      }
      for (const auto& [o, n] : req) {
        ASSERT_TRUE(live_.count(o)) << "required page of a request that is not admitted";
        ASSERT_EQ(required_.at(o), n);
      }
    }
    for (RequestId r : live_) {
      const RequestDump& rd = *by_id.at(r);
      ASSERT_EQ(rd.required_pages, required_.at(r));
      uint32_t host = 0;
      for (const ModelPage& p : model_[r]) host += p.host;
      ASSERT_EQ(rd.history_pages, model_[r].size());
      ASSERT_EQ(rd.host_pages, host) << "host coverage of request " << r;
    }
    for (RequestId r : queued_) ASSERT_EQ(by_id.at(r)->state, RequestState::kQueued);
  }

  std::mt19937_64 rng_;
  int64_t now_ = 0;
  RequestId next_id_ = 1;
  std::unique_ptr<ResidencyManager> mgr_;
  std::set<RequestId> live_, queued_;
  std::map<RequestId, std::vector<ModelPage>> model_;
  std::map<RequestId, uint32_t> required_;
  std::map<std::pair<GpuId, PageIndex>, std::pair<RequestId, uint32_t>> gpu_map_;
  std::vector<BackupOrder> backups_;
  std::vector<PopulateOrder> populates_;
  std::vector<WithdrawOrder> withdraws_;
};

std::vector<uint64_t> Seeds() {
  if (const char* s = std::getenv("DHS_SEED")) return {std::strtoull(s, nullptr, 10)};
  std::vector<uint64_t> seeds;
  for (uint64_t s = 1; s <= 20; ++s) seeds.push_back(s);
  return seeds;
}

int Events() {
  const char* e = std::getenv("DHS_EVENTS");
  return e ? std::atoi(e) : 2000;
}

TEST(ResidencyRandom, InvariantsHoldUnderRandomEvents) {
  const char* policies[] = {"oldest-first", "newest-first", "largest-first"};
  Counters total;
  for (uint64_t seed : Seeds()) {
    const std::string policy = policies[seed % 3];
    SCOPED_TRACE("DHS_SEED=" + std::to_string(seed) + " policy " + policy);
    Harness h(seed, policy);
    for (int i = 0; i < Events(); ++i) {
      SCOPED_TRACE("event " + std::to_string(i));
      h.Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    h.Drain();
    if (::testing::Test::HasFatalFailure()) return;
    total.grants += h.counters().grants;
    total.reclaims_retired += h.counters().reclaims_retired;
    total.reclaims_failed += h.counters().reclaims_failed;
    total.populates_ordered += h.counters().populates_ordered;
    total.rejects += h.counters().rejects;
  }
  // The run must have exercised the interesting paths (each is reached many times over 20 seeds).
  EXPECT_GT(total.grants, 0u);
  EXPECT_GT(total.reclaims_retired, 0u);
  EXPECT_GT(total.reclaims_failed, 0u);
  EXPECT_GT(total.populates_ordered, 0u);
  EXPECT_GT(total.rejects, 0u);
  std::printf("grants %lu, reclaims retired %lu, failed %lu, populates %lu, rejects %lu\n",
              static_cast<unsigned long>(total.grants), static_cast<unsigned long>(total.reclaims_retired),
              static_cast<unsigned long>(total.reclaims_failed), static_cast<unsigned long>(total.populates_ordered),
              static_cast<unsigned long>(total.rejects));
}

}  // namespace
}  // namespace dhs::memd
