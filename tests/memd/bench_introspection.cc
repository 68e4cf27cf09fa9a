// Introspection at real scale (issue 12): a real memd Daemon, serving on its own thread over ipc://, with G GPUs of
// M pages each registered by fake workers (Hello) and a few requests admitted on every GPU. Prints, per setup:
// - idle CPU: CPU seconds of this process (the daemon loop, its ZeroMQ threads; the clients are idle) over a few
//   seconds of idle ticks, as a share of one core;
// - the admission grant round trip (AdmitRequest -> AdmitGrant) p50/p99 over ipc://, while the GPUs are registered,
//   alone and while another client asks the `status` view in a loop;
// - every dhsctl view (text and JSON, exactly the IntrospectQuery dhsctl sends): the median time of a few queries
//   and the reply size in bytes, or the error memd or the transport answered.
// Asserts nothing about time (no timed tests); the figures go to memd/README.md, "Introspection at scale".
//
//   memd_bench_introspection [--idle-s S] [--grants N] [SETUP...]   SETUP: GxM, e.g. 1x1000 1x100000 8x2500000
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/check.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "memd/daemon.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kPageRows = 64;
constexpr uint32_t kRequestsPerGpu = 16;  // admitted on every GPU before measuring: 8 required + 12 optional pages each

struct Setup {
  uint32_t gpus = 1;
  uint32_t pages = 1000;
};

struct View {
  std::string name;
  dhs::wire::IntrospectQueryT query;
};

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "memd_bench_introspection: %s failed\n", what);
  std::exit(1);
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

// A fake worker of `gpu`: says Hello with M = `pages`. Aborts the bench when memd refuses.
std::unique_ptr<dhs::DealerClient> Worker(const std::string& endpoint, uint32_t gpu, uint32_t pages,
                                          uint64_t page_bytes) {
  dhs::DealerClient::Options co;
  co.identity = absl::StrFormat("worker/%d", gpu);
  auto client = std::move(*dhs::DealerClient::Connect(endpoint, co));
  dhs::wire::HelloT hello;
  hello.gpu = gpu;
  hello.capacity_pages = pages;
  hello.page_rows = kPageRows;
  hello.page_bytes = page_bytes;
  hello.host_page_bytes = page_bytes;
  auto bytes = client->Request(dhs::EncodeHello(hello, 1, "worker"), std::chrono::seconds(60));
  Require(bytes.ok(), "HelloReply");
  auto reply = dhs::ReadHelloReply(*dhs::DecodeEnvelope(*bytes));
  Require(reply.ok() && reply->accepted, "Hello accepted");
  return client;
}

// Admits request `id` on `gpu` (8 required pages, 16 context pages of which 12 complete) and returns the round trip
// in microseconds; < 0 when no grant came.
double Admit(dhs::DealerClient& w, uint32_t gpu, dhs::RequestId id, uint64_t& seq) {
  dhs::wire::AdmitRequestT a;
  a.request = id;
  a.gpu = gpu;
  a.required_pages = 8;
  a.history_rows = kPageRows * 16;
  a.complete_pages = 12;
  const auto t0 = Clock::now();
  auto grant = w.Request(dhs::EncodeAdmitRequest(a, seq++, "worker"), std::chrono::seconds(10));
  const auto t1 = Clock::now();
  if (!grant.ok()) return -1;
  auto m = dhs::DecodeEnvelope(*grant);
  if (!m.ok() || m->type != dhs::wire::Body::AdmitGrant) return -1;
  return Ms(t1 - t0) * 1000;
}

void Complete(dhs::DealerClient& w, uint32_t gpu, dhs::RequestId id, uint64_t& seq) {
  dhs::wire::CompleteT c;
  c.request = id;
  c.gpu = gpu;
  DHS_CHECK_OK(w.Request(dhs::EncodeComplete(c, seq++, "worker"), std::chrono::seconds(10)).status());
}

// The views dhsctl sends: `pages 0` as before (since issue 12: its first 1000 rows) and with the options that page
// through a GPU of M pages (--from, --count, --runs).
std::vector<View> Views(uint32_t pages) {
  using W = dhs::wire::IntrospectWhat;
  std::vector<View> views;
  auto add = [&](std::string name, W what, uint64_t request = 0, uint32_t from = 0, uint32_t count = 0,
                 bool runs = false) {
    View v{std::move(name), {}};
    v.query.what = what;
    v.query.request = request;
    v.query.page_from = from;
    v.query.page_count = count;
    v.query.page_runs = runs;
    views.push_back(v);
  };
  add("status", W::Status);
  add("gpus", W::Gpus);
  add("requests", W::Requests);
  add("request 1", W::Request, 1);
  add("queue", W::Queue);
  add("pages 0", W::Pages);
  add(absl::StrFormat("pages 0 --from %d", pages - 10), W::Pages, 0, pages - 10);
  add("pages 0 --count 65536", W::Pages, 0, 0, 65536);
  add("pages 0 --runs", W::Pages, 0, 0, 0, true);
  return views;
}

// Asks `view` (`format`) up to 5 times (fewer when one takes over a second) and prints the median time and size.
void MeasureView(dhs::DealerClient& cli, View view, dhs::wire::IntrospectFormat format, uint64_t& seq) {
  view.query.format = format;
  std::vector<double> ms;
  std::string outcome;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    auto bytes = cli.Request(dhs::EncodeIntrospectQuery(view.query, seq++, "dhsctl"), std::chrono::seconds(120));
    ms.push_back(Ms(Clock::now() - t0));
    if (!bytes.ok()) {
      outcome = absl::StrFormat("error: %s", bytes.status().ToString());
      break;
    }
    auto m = dhs::DecodeEnvelope(*bytes, 2 * dhs::kMaxMessageBytes);
    auto reply = m.ok() ? dhs::ReadIntrospectReply(*m) : absl::StatusOr<dhs::wire::IntrospectReplyT>(m.status());
    outcome = reply.ok() ? absl::StrFormat("%d bytes", reply->document.size())
                         : absl::StrFormat("error: %s", m.ok() ? dhs::ReadErrorStatus(*m).ToString()
                                                               : reply.status().ToString());
    if (ms.back() > 1000) break;
  }
  std::printf("  view %-28s %-4s %10.3f ms  %s\n", view.name.c_str(),
              format == dhs::wire::IntrospectFormat::Json ? "json" : "text", Percentile(ms, 0.5), outcome.c_str());
}

// `grants` admissions (+ completions) on GPU 0; with `busy`, another client asks the `status` view (text) in a loop
// meanwhile, as a `dhsctl watch` or replay's sampling does: a view that stalls the loop shows in the grants' tail.
void MeasureGrants(dhs::DealerClient& w, const std::string& endpoint, int grants, bool busy, dhs::RequestId& next,
                   uint64_t& seq) {
  std::atomic<bool> stop{false};
  std::atomic<int> views{0};
  std::thread asker([&] {
    if (!busy) return;
    auto cli = std::move(*dhs::DealerClient::Connect(endpoint));
    dhs::wire::IntrospectQueryT q;
    q.what = dhs::wire::IntrospectWhat::Status;
    q.format = dhs::wire::IntrospectFormat::Text;
    for (uint64_t s = 1; !stop.load(); ++s) {
      if (cli->Request(dhs::EncodeIntrospectQuery(q, s, "dhsctl"), std::chrono::seconds(60)).ok()) ++views;
    }
  });
  std::vector<double> rtt;
  for (int i = 0; i < grants; ++i) {
    const dhs::RequestId id = next++;
    rtt.push_back(Admit(w, 0, id, seq));
    Complete(w, 0, id, seq);
  }
  stop = true;
  asker.join();
  std::printf("  grant round trip%s: p50 %.1f us, p99 %.1f us, max %.1f us (%d grants%s)\n",
              busy ? " while a client asks `status` in a loop" : "", Percentile(rtt, 0.5), Percentile(rtt, 0.99),
              Percentile(rtt, 1.0), grants, busy ? absl::StrFormat(", %d views answered", views.load()).c_str() : "");
}

void RunSetup(const Setup& s, double idle_s, int grants) {
  char tmpl[] = "/tmp/memd_bench_intro_XXXXXX";
  Require(mkdtemp(tmpl) != nullptr, "mkdtemp");
  const std::string dir = tmpl;
  dhs::memd::DaemonOptions o;
  o.run_dir = dir + "/run";
  o.page_bytes = 4096;
  o.host_pool_pages = 16 * kRequestsPerGpu * s.gpus + 1024;
  o.segment_name = absl::StrFormat("dhs-memd-bench-intro-%d", getpid());
  auto daemon = dhs::memd::Daemon::Start(o);
  Require(daemon.ok(), "Daemon::Start");
  std::atomic<bool> stop{false};
  std::thread loop([&] { DHS_CHECK_OK((*daemon)->Run([&] { return !stop.load(); })); });
  const std::string endpoint = dhs::IpcEndpoint(o.run_dir, "memd");
  std::printf("setup %d GPU(s) x M = %d pages\n", s.gpus, s.pages);
  const auto reg0 = Clock::now();
  std::vector<std::unique_ptr<dhs::DealerClient>> workers;
  for (uint32_t g = 0; g < s.gpus; ++g) workers.push_back(Worker(endpoint, g, s.pages, o.page_bytes));
  std::printf("  register %d GPU(s): %.1f ms\n", s.gpus, Ms(Clock::now() - reg0));
  uint64_t seq = 2;
  dhs::RequestId next = 1;
  const uint32_t per_gpu = std::min<uint32_t>(kRequestsPerGpu, s.pages / 40);
  for (uint32_t g = 0; g < s.gpus; ++g) {
    for (uint32_t i = 0; i < per_gpu; ++i) {  // ids in GPU g's range, as its worker gives them (memd checks)
      Require(Admit(*workers[g], g, dhs::MakeNodeRequestId(g, 1, next++), seq) >= 0, "admission");
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double cpu0 = CpuSeconds();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(idle_s));
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("  idle CPU: %.4f CPU s over %.2f s = %.2f%% of a core\n", CpuSeconds() - cpu0, wall,
              100 * (CpuSeconds() - cpu0) / wall);
  MeasureGrants(*workers[0], endpoint, grants, /*busy=*/false, next, seq);
  MeasureGrants(*workers[0], endpoint, grants, /*busy=*/true, next, seq);
  auto cli = std::move(*dhs::DealerClient::Connect(endpoint));
  for (const View& v : Views(s.pages)) {
    for (auto f : {dhs::wire::IntrospectFormat::Text, dhs::wire::IntrospectFormat::Json}) MeasureView(*cli, v, f, seq);
  }
  std::fflush(stdout);
  stop = true;
  loop.join();
  cli.reset();
  workers.clear();
  daemon->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace

int main(int argc, char** argv) {
  double idle_s = 3;
  int grants = 500;
  std::vector<Setup> setups;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--idle-s" && i + 1 < argc) {
      Require(absl::SimpleAtod(argv[++i], &idle_s), "--idle-s");
    } else if (a == "--grants" && i + 1 < argc) {
      Require(absl::SimpleAtoi(argv[++i], &grants), "--grants");
    } else {
      std::vector<std::string> gm = absl::StrSplit(a, 'x');
      Setup s;
      if (gm.size() != 2 || !absl::SimpleAtoi(gm[0], &s.gpus) || !absl::SimpleAtoi(gm[1], &s.pages)) {
        std::fprintf(stderr, "usage: %s [--idle-s S] [--grants N] [GxM ...]\n", argv[0]);
        return 2;
      }
      setups.push_back(s);
    }
  }
  if (setups.empty()) setups = {{1, 1000}, {1, 100000}, {1, 2500000}, {8, 2500000}};
  for (const Setup& s : setups) RunSetup(s, idle_s, grants);
  return 0;
}
