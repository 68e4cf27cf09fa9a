// Admission decisions per second with 1,000 admitted requests on one GPU (brief §4): each iteration admits a request
// whose deficit forces a reclaim-victim choice over the 1,000 candidates, then completes it again (so the state is the
// same every iteration; the victims' reclaims started by it are cancelled by completing and re-admitting them).
// Prints figures only.
#include <benchmark/benchmark.h>

#include "common/check.h"
#include "memd/reclaim_policy.h"
#include "memd/residency_manager.h"

namespace dhs::memd {
namespace {

// Pure victim choice over 1,000 candidates (what every deficit admission pays).
void BM_ChooseVictims(benchmark::State& state) {
  auto policy = *MakeReclaimPolicy(state.range(0) == 0 ? "oldest-first" : state.range(0) == 1 ? "newest-first"
                                                                                                : "largest-first");
  std::vector<ReclaimCandidate> c;
  for (uint32_t i = 0; i < 1000; ++i) c.push_back({i, int64_t{i} * 7919 % 1000, i, 1 + i % 8});
  for (auto _ : state) benchmark::DoNotOptimize(policy->Choose(c, 20));
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(std::string(policy->name()));
}
BENCHMARK(BM_ChooseVictims)->Arg(0)->Arg(1)->Arg(2);

// Full admission decision through ResidencyManager with 1,000 admitted requests (2 optional pages each):
// Admit (deficit -> victim choice -> reclaim start with backups), then Complete the new request (cancels nothing) and
// fail the victims' backups so they return to their state (the next iteration picks other victims: back-off).
void BM_AdmitWithReclaimChoice(benchmark::State& state) {
  constexpr uint32_t kRequests = 1000;
  ResidencyConfig cfg{.reserve_pages = 16, .host_pages = 1 << 16, .host_page_bytes = 4096,
                      .populate_pages_per_attempt = 8, .reclaim_policy = "oldest-first"};
  int64_t now = 0;
  auto mgr = std::move(*ResidencyManager::Create(cfg, [&now] { return now; }));
  DHS_CHECK_OK(mgr->RegisterGpu(0, kRequests * 3 + 16));
  for (RequestId r = 0; r < kRequests; ++r) {
    ++now;
    DHS_CHECK_OK(mgr->Admit({.request = r, .gpu = 0, .required_pages = 1, .history_pages = 2, .context_pages = 2}));
  }
  mgr->DrainOrders();
  RequestId next = kRequests;
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
  state.counters["admitted"] = kRequests;
}
BENCHMARK(BM_AdmitWithReclaimChoice);

}  // namespace
}  // namespace dhs::memd

BENCHMARK_MAIN();
