// Admission decisions per second with 100, 1K, 10K and 100K admitted requests on one GPU (brief §4; issue 14: at
// least 100k/s at 1K, the cost of a decision growing at most logarithmically with the admitted requests). Prints
// figures only (items_per_second = decisions/s); compare the rows of one run (the machine is shared).
#include <benchmark/benchmark.h>

#include "common/check.h"
#include "memd/reclaim_policy.h"
#include "memd/residency_manager.h"

namespace dhs::memd {
namespace {

std::unique_ptr<ReclaimPolicy> PolicyOf(int64_t arg) {
  return *MakeReclaimPolicy(arg == 0 ? "oldest-first" : arg == 1 ? "newest-first" : "largest-first");
}

std::vector<ReclaimCandidate> CandidatesOf(uint32_t n) {
  std::vector<ReclaimCandidate> c;
  for (uint32_t i = 0; i < n; ++i) c.push_back({i, int64_t{i} * 7919 % 1000, i, 1 + i % 8});
  return c;
}

// Victim choice over n candidates by sorting them all (ReclaimPolicy::Choose, what every deficit admission paid
// before issue 14). Args: policy (0 oldest, 1 newest, 2 largest), n.
void BM_ChooseVictimsSorted(benchmark::State& state) {
  auto policy = PolicyOf(state.range(0));
  const std::vector<ReclaimCandidate> c = CandidatesOf(static_cast<uint32_t>(state.range(1)));
  for (auto _ : state) benchmark::DoNotOptimize(policy->Choose(c, 20));
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(std::string(policy->name()));
}
BENCHMARK(BM_ChooseVictimsSorted)->ArgsProduct({{0, 1, 2}, {100, 1000, 10000}});

// The same choice from the ordered index the core keeps (ReclaimIndex), plus one re-key (erase + insert of a
// candidate, what an event changing a request's key costs).
void BM_ChooseVictimsIndexed(benchmark::State& state) {
  auto policy = PolicyOf(state.range(0));
  const std::vector<ReclaimCandidate> c = CandidatesOf(static_cast<uint32_t>(state.range(1)));
  ReclaimIndex index(policy.get());
  for (const ReclaimCandidate& x : c) index.Insert(x);
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(index.Choose(20));
    const ReclaimCandidate& x = c[i++ % c.size()];
    index.Erase(x);
    index.Insert(x);
  }
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(std::string(policy->name()));
}
BENCHMARK(BM_ChooseVictimsIndexed)->ArgsProduct({{0, 1, 2}, {100, 1000, 10000, 100000}});

// Full admission decision through ResidencyManager with n admitted requests (2 optional pages each), arg n:
// Admit (deficit -> victim choice -> reclaim start with backups), then Complete the new request (cancels nothing) and
// fail the victims' backups so they return to their state (back-off, cleared by RetryBackups).
void BM_AdmitWithReclaimChoice(benchmark::State& state) {
  const auto requests = static_cast<uint32_t>(state.range(0));
  ResidencyConfig cfg{.reserve_pages = 16, .host_pages = 2 * requests + 64, .host_page_bytes = 4096,
                      .populate_pages_per_attempt = 8, .reclaim_policy = "oldest-first"};
  int64_t now = 0;
  auto mgr = std::move(*ResidencyManager::Create(cfg, [&now] { return now; }));
  DHS_CHECK_OK(mgr->RegisterGpu(0, requests * 3 + 16));
  for (RequestId r = 1; r <= requests; ++r) {  // 0 is a reserved id (memd refuses it)
    ++now;
    DHS_CHECK_OK(mgr->Admit({.request = r, .gpu = 0, .required_pages = 1, .history_pages = 2, .context_pages = 2}));
    mgr->DrainOrders();
  }
  RequestId next = requests + 1;
  for (auto _ : state) {
    ++now;
    const RequestId r = next++;
    DHS_CHECK_OK(mgr->Admit({.request = r, .gpu = 0, .required_pages = 4}));  // Δ = 4 -> two victims
    auto orders = mgr->DrainOrders();
    DHS_CHECK_OK(mgr->Complete(r));
    for (const Order& o : orders) {  // answer: the backups fail, the victims stay untouched
      if (auto* rc = std::get_if<ReclaimOrder>(&o)) DHS_CHECK_OK(mgr->OnBackupComplete(rc->order, {}, false));
    }
    DHS_CHECK_OK(mgr->RetryBackups());
    mgr->DrainOrders();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["admitted"] = requests;
}
BENCHMARK(BM_AdmitWithReclaimChoice)->Arg(100)->Arg(1000)->Arg(10000)->Arg(100000);

}  // namespace
}  // namespace dhs::memd

BENCHMARK_MAIN();
