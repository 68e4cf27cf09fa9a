// Round-trip latency of an admission over ipc:// against a real memd Daemon serving on its own thread:
// AdmitRequest -> AdmitGrant, then Complete -> CompleteAck (to free the pages for the next iteration).
// Prints p50/p99 of the grant round trip as counters (microseconds); asserts nothing about time.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "common/check.h"
#include "memd/daemon.h"

namespace {

void BM_AdmissionGrantRoundTrip(benchmark::State& state) {
  char tmpl[] = "/tmp/memd_bench_XXXXXX";
  if (!mkdtemp(tmpl)) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  const std::string dir = tmpl;
  dhs::memd::DaemonOptions o;
  o.run_dir = dir + "/run";
  o.page_bytes = 4096;
  o.host_pool_pages = 1024;
  o.segment_name = "dhs-memd-bench-" + std::to_string(getpid());
  auto daemon = dhs::memd::Daemon::Start(o);
  if (!daemon.ok()) {
    state.SkipWithError(std::string(daemon.status().message()).c_str());
    return;
  }
  std::atomic<bool> stop{false};
  std::thread loop([&] { DHS_CHECK_OK((*daemon)->Run([&] { return !stop.load(); })); });

  dhs::DealerClient::Options co;
  co.identity = "worker/0";
  auto client = std::move(*dhs::DealerClient::Connect(dhs::IpcEndpoint(o.run_dir, "memd"), co));
  dhs::wire::HelloT hello;
  hello.gpu = 0;
  hello.capacity_pages = 4096;
  hello.page_rows = 64;
  hello.page_bytes = o.page_bytes;
  if (auto reply = client->Request(dhs::EncodeHello(hello, 1, "worker"), std::chrono::seconds(5)); !reply.ok()) {
    state.SkipWithError("no HelloReply");
    stop = true;
    loop.join();
    return;
  }

  std::vector<double> rtt_us;
  uint64_t seq = 2;
  dhs::RequestId id = 1;
  for (auto _ : state) {
    dhs::wire::AdmitRequestT a;
    a.request = id;
    a.gpu = 0;
    a.required_pages = 8;
    a.history_rows = 64 * 16;  // 16 pages of context
    a.complete_pages = 12;
    const auto t0 = std::chrono::steady_clock::now();
    auto grant = client->Request(dhs::EncodeAdmitRequest(a, seq++, "worker"), std::chrono::seconds(5));
    const auto t1 = std::chrono::steady_clock::now();
    if (!grant.ok()) {
      state.SkipWithError("no grant");
      break;
    }
    rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    state.PauseTiming();
    dhs::wire::CompleteT c;
    c.request = id++;
    c.gpu = 0;
    DHS_CHECK_OK(client->Request(dhs::EncodeComplete(c, seq++, "worker"), std::chrono::seconds(5)).status());
    state.ResumeTiming();
  }
  stop = true;
  loop.join();
  client.reset();
  daemon->reset();
  std::filesystem::remove_all(dir);
  if (rtt_us.empty()) return;
  std::sort(rtt_us.begin(), rtt_us.end());
  state.counters["p50_us"] = rtt_us[rtt_us.size() / 2];
  state.counters["p99_us"] = rtt_us[std::min(rtt_us.size() - 1, rtt_us.size() * 99 / 100)];
  state.counters["grants"] = static_cast<double>(rtt_us.size());
}
BENCHMARK(BM_AdmissionGrantRoundTrip)->Iterations(2000)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
