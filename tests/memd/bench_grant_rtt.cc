// Round-trip latency of an admission over ipc:// against a real memd Daemon serving on its own thread:
// AdmitRequest -> AdmitGrant, then Complete -> CompleteAck (to free the pages for the next iteration).
// Prints p50/p99 of the grant round trip as counters (microseconds); asserts nothing about time.
// The breakdown (issue 14, "where the time goes"), each measured alone:
// - BM_TransportEchoRoundTrip: the same DealerClient / RouterServer / Server over ipc:// with a handler that answers
//   the AdmitRequest at once with a prebuilt AdmitGrant (decode + verify + encode + ZeroMQ, no core): the floor.
// - BM_DaemonMessageWork: what the daemon loop does per Admit + Complete besides the transport, in-process: decode,
//   core event, drain, encode of the grant and the ack.
// - BM_TickWork: the periodic tick (Populate, FlushOrders, metrics snapshot) on the bench's state; a message arriving
//   during a tick waits for it (one message per tick in this one-at-a-time bench: it shows at p99.9 / max).
// - BM_UnixSeqpacketEchoRoundTrip: a prototype of a direct path (not in memd): the same request and grant over a unix
//   SOCK_SEQPACKET connection that the server polls in one zmq_poll with a ZeroMQ ROUTER socket, as memd's loop would
//   poll both; one thread wake-up per direction instead of the ZeroMQ I/O threads' hand-offs.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
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
#include "memd/residency_manager.h"
#include "memd/state_dump.h"
#include "zmq.hpp"

namespace {

// Sorts `rtt_us` (round trips, µs; not empty) and sets the p50_us / p99_us / p999_us / max_us counters.
void SetLatencyCounters(benchmark::State& state, std::vector<double>& rtt_us) {
  std::sort(rtt_us.begin(), rtt_us.end());
  state.counters["p50_us"] = rtt_us[rtt_us.size() / 2];
  state.counters["p99_us"] = rtt_us[std::min(rtt_us.size() - 1, rtt_us.size() * 99 / 100)];
  state.counters["p999_us"] = rtt_us[std::min(rtt_us.size() - 1, rtt_us.size() * 999 / 1000)];
  state.counters["max_us"] = rtt_us.back();
}

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
  hello.capacity_pages = static_cast<uint32_t>(state.range(0));
  hello.page_rows = 64;
  hello.page_bytes = o.page_bytes;
  hello.host_page_bytes = o.page_bytes;
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
  SetLatencyCounters(state, rtt_us);
  state.counters["grants"] = static_cast<double>(rtt_us.size());
}
// Arg: the GPU's M (pages): 4096 as before, 65536 (an H200-sized pool of 2 MiB pages) where the per-tick work of a
// loop that scales with M shows in the tail.
BENCHMARK(BM_AdmissionGrantRoundTrip)->Arg(4096)->Arg(65536)->Iterations(2000)->Unit(benchmark::kMicrosecond);

dhs::wire::AdmitRequestT BenchAdmit(dhs::RequestId id) {
  dhs::wire::AdmitRequestT a;
  a.request = id;
  a.gpu = 0;
  a.required_pages = 8;
  a.history_rows = 64 * 16;
  a.complete_pages = 12;
  return a;
}

// A grant of the bench's shape: 8 required pages, 12 optional, 16 host pages.
dhs::wire::AdmitGrantT BenchGrant(dhs::RequestId id) {
  dhs::wire::AdmitGrantT w;
  w.request = id;
  for (uint32_t i = 0; i < 8; ++i) w.required_pages.push_back(i);
  for (uint32_t i = 0; i < 12; ++i) {
    w.optional_pages.push_back(8 + i);
    w.optional_history_pages.push_back(i);
  }
  for (uint32_t i = 0; i < 16; ++i) w.backup_host_pages.push_back(dhs::wire::HostPageRef(0, i));
  return w;
}

void BM_TransportEchoRoundTrip(benchmark::State& state) {
  char tmpl[] = "/tmp/memd_bench_XXXXXX";
  if (!mkdtemp(tmpl)) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  const std::string dir = tmpl;
  auto router = dhs::RouterServer::Bind(dir, "echo");
  if (!router.ok()) {
    state.SkipWithError(std::string(router.status().message()).c_str());
    return;
  }
  dhs::Server server(router->get(), "memd");
  server.On(dhs::wire::Body::AdmitRequest, [](const dhs::Message& m, std::string_view) -> absl::StatusOr<std::string> {
    auto a = dhs::ReadAdmitRequest(m);
    if (!a.ok()) return a.status();
    return dhs::EncodeAdmitGrant(BenchGrant(a->request), m.sequence, "memd");
  });
  std::atomic<bool> stop{false};
  std::thread loop([&] { DHS_CHECK_OK(server.Run([&] { return !stop.load(); }, std::chrono::milliseconds(20))); });
  dhs::DealerClient::Options co;
  co.identity = "worker/0";
  auto client = std::move(*dhs::DealerClient::Connect(dhs::IpcEndpoint(dir, "echo"), co));
  std::vector<double> rtt_us;
  uint64_t seq = 1;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto grant = client->Request(dhs::EncodeAdmitRequest(BenchAdmit(static_cast<dhs::RequestId>(seq)), seq, "worker"),
                                 std::chrono::seconds(5));
    const auto t1 = std::chrono::steady_clock::now();
    ++seq;
    if (!grant.ok()) {
      state.SkipWithError("no echo");
      break;
    }
    rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  stop = true;
  loop.join();
  client.reset();
  router->reset();
  std::filesystem::remove_all(dir);
  if (rtt_us.empty()) return;
  SetLatencyCounters(state, rtt_us);
}
BENCHMARK(BM_TransportEchoRoundTrip)->Iterations(2000)->Unit(benchmark::kMicrosecond);

// A system call of the prototype that cannot fail in the bench: aborts with errno when it does.
void Must(bool ok, const char* what) {
  if (ok) return;
  std::perror(what);
  std::abort();
}

void BM_UnixSeqpacketEchoRoundTrip(benchmark::State& state) {
  char tmpl[] = "/tmp/memd_bench_XXXXXX";
  if (!mkdtemp(tmpl)) {
    state.SkipWithError("mkdtemp failed");
    return;
  }
  const std::string dir = tmpl;
  const std::string path = dir + "/grant.sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  const int listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  Must(listen_fd >= 0, "socket");
  Must(::bind(listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0, "bind");
  Must(::listen(listen_fd, 4) == 0, "listen");
  // The ZeroMQ socket the server polls alongside (nothing is sent to it here): the loop's shape, not its traffic.
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind(dhs::IpcEndpoint(dir, "zmq"));
  std::atomic<bool> stop{false};
  std::thread loop([&] {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    Must(fd >= 0, "accept");
    std::vector<char> buf(size_t{1} << 20);  // far above a grant
    while (!stop.load()) {
      zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, fd, ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::chrono::milliseconds(20));
      if ((items[1].revents & ZMQ_POLLIN) == 0) continue;
      const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0) break;  // the client closed
      auto m = dhs::DecodeEnvelope(std::string_view(buf.data(), static_cast<size_t>(n)), dhs::kMaxMessageBytes);
      DHS_CHECK_OK(m.status());
      auto a = dhs::ReadAdmitRequest(*m);
      DHS_CHECK_OK(a.status());
      const std::string reply = dhs::EncodeAdmitGrant(BenchGrant(a->request), m->sequence, "memd");
      Must(::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(reply.size()), "send");
    }
    ::close(fd);
  });
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  Must(fd >= 0, "socket");
  Must(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0, "connect");
  std::vector<char> buf(size_t{1} << 20);  // far above a grant
  std::vector<double> rtt_us;
  uint64_t seq = 1;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string request =
        dhs::EncodeAdmitRequest(BenchAdmit(static_cast<dhs::RequestId>(seq)), seq, "worker");
    bool ok = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size());
    pollfd p{fd, POLLIN, 0};
    ok = ok && ::poll(&p, 1, 5000) == 1;
    const ssize_t n = ok ? ::recv(fd, buf.data(), buf.size(), 0) : -1;
    ok = ok && n > 0 && dhs::DecodeEnvelope(std::string_view(buf.data(), static_cast<size_t>(n)), dhs::kMaxMessageBytes).ok();
    const auto t1 = std::chrono::steady_clock::now();
    ++seq;
    if (!ok) {
      state.SkipWithError("no echo");
      break;
    }
    rtt_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  ::close(fd);
  stop = true;
  loop.join();
  ::close(listen_fd);
  router.close();
  context.close();
  std::filesystem::remove_all(dir);
  if (rtt_us.empty()) return;
  SetLatencyCounters(state, rtt_us);
}
BENCHMARK(BM_UnixSeqpacketEchoRoundTrip)->Iterations(2000)->Unit(benchmark::kMicrosecond);

// The core and codec work of one Admit (grant) + Complete (ack), no sockets: what the daemon adds to the echo.
void BM_DaemonMessageWork(benchmark::State& state) {
  dhs::memd::ResidencyConfig cfg{.reserve_pages = 0, .host_pages = 1024, .host_page_bytes = 4096};
  auto core = std::move(*dhs::memd::ResidencyManager::Create(cfg, [] { return int64_t{0}; }));
  DHS_CHECK_OK(core->RegisterGpu(0, 4096));
  dhs::RequestId id = 1;
  uint64_t seq = 1;
  for (auto _ : state) {
    const std::string in = dhs::EncodeAdmitRequest(BenchAdmit(id), seq, "worker");
    auto m = dhs::DecodeEnvelope(in, dhs::kMaxMessageBytes);
    auto a = dhs::ReadAdmitRequest(*m);
    DHS_CHECK_OK(core->Admit({.request = a->request, .gpu = 0, .required_pages = a->required_pages,
                              .speculation = {}, .history_pages = a->complete_pages, .context_pages = 16}));
    for (const auto& o : core->DrainOrders()) {
      if (std::holds_alternative<dhs::memd::GrantOrder>(o)) {
        benchmark::DoNotOptimize(dhs::EncodeAdmitGrant(BenchGrant(id), seq, "memd"));
      }
    }
    const std::string cin = dhs::EncodeComplete([&] {
      dhs::wire::CompleteT c;
      c.request = id;
      return c;
    }(), seq + 1, "worker");
    auto cm = dhs::DecodeEnvelope(cin, dhs::kMaxMessageBytes);
    DHS_CHECK_OK(core->Complete(dhs::ReadComplete(*cm)->request));
    core->DrainOrders();
    dhs::wire::CompleteAckT ack;
    ack.request = id;
    benchmark::DoNotOptimize(dhs::EncodeCompleteAck(ack, seq + 1, "memd"));
    ++id;
    seq += 2;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DaemonMessageWork)->Unit(benchmark::kMicrosecond);

// The daemon's tick on the bench's state (M = 4096 pages, one admitted request): Populate + the metrics snapshot
// (Dump + RenderPrometheus), as Daemon::Tick does them. Args: GPU pages M; 0 = full dump (what the tick rendered
// before issue 14: O(M)), 1 = counts dump (what it renders now).
void BM_TickWork(benchmark::State& state) {
  dhs::memd::ResidencyConfig cfg{.reserve_pages = 0, .host_pages = 1024, .host_page_bytes = 4096};
  auto core = std::move(*dhs::memd::ResidencyManager::Create(cfg, [] { return int64_t{0}; }));
  DHS_CHECK_OK(core->RegisterGpu(0, static_cast<uint32_t>(state.range(0))));
  DHS_CHECK_OK(core->Admit({.request = 1, .gpu = 0, .required_pages = 8, .speculation = {},
                            .history_pages = 12, .context_pages = 16}));
  core->DrainOrders();
  dhs::memd::DaemonCounters dc;
  const auto detail = static_cast<dhs::memd::DumpDetail>(state.range(1));
  for (auto _ : state) {
    DHS_CHECK_OK(core->Populate());
    core->DrainOrders();
    benchmark::DoNotOptimize(dhs::memd::RenderPrometheus(core->Dump(detail), core->counters(), dc));
  }
  state.SetLabel(detail == dhs::memd::DumpDetail::kFull ? "full dump (before issue 14)" : "counts dump");
}
BENCHMARK(BM_TickWork)->ArgsProduct({{4096, 65536}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
