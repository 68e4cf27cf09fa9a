// The memd binary as a real process (posix_spawn in a temp run dir, SIGKILL at teardown) with fake workers that
// speak the worker <-> memd conversation contract (docs/protocol.md) over ipc://, dhsctl run against it, and
// GET /metrics. Expected values come from the brief's accounting (§4), worked out by hand in the comments.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <cstdio>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host_pool.h"
#include "common/kv_event_stream.h"
#include "common/protocol.h"
#include "common/status.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "memd/host_journal.h"
#include "memd/pool_segment.h"
#include "workerd/prefix_chain.h"  // issue 24: chains as the worker names them
#include "nlohmann/json.hpp"
#include "xxhash.h"
#include "zmq.hpp"

extern char** environ;

namespace dhs {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr uint64_t kPageBytes = 4096;
constexpr uint32_t kPageRows = 16;  // p

std::vector<uint32_t> Sorted(std::vector<uint32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// A worker's Hello for GPU `gpu` with M = `capacity_pages`, p = kPageRows, `page_bytes` as both its GPU page and its
// host page (memd's pool pages, --page-bytes), N = `request_slots`.
wire::HelloT MakeTestHello(GpuId gpu, std::string device_name, uint32_t capacity_pages, uint64_t page_bytes,
                           uint32_t request_slots) {
  wire::HelloT h;
  h.protocol_version = kProtocolVersion;
  h.gpu = gpu;
  h.pid = static_cast<uint32_t>(getpid());
  h.device_name = std::move(device_name);
  h.capacity_pages = capacity_pages;
  h.page_rows = kPageRows;
  h.page_bytes = page_bytes;
  h.host_page_bytes = page_bytes;
  h.request_slots = request_slots;
  return h;
}

// A fake worker: a DEALER with identity worker/<gpu> that sends contract messages and reads memd's orders.
class FakeWorker {
 public:
  // `identity`: the DEALER's routing id (default worker/<gpu>; another one plays a client that is no worker).
  FakeWorker(const std::string& run_dir, GpuId gpu, const std::string& identity = "") : gpu_(gpu) {
    DealerClient::Options o;
    o.identity = identity.empty() ? "worker/" + std::to_string(gpu) : identity;
    client_ = std::move(*DealerClient::Connect(IpcEndpoint(run_dir, "memd"), o));
  }
  void Send(const std::string& bytes) { ASSERT_TRUE(client_->Send(bytes).ok()); }
  // Next message from memd (decoded into `buffer_`), or nullopt after `timeout`.
  std::optional<Message> Next(std::chrono::milliseconds timeout = 3000ms) {
    auto bytes = client_->Receive(timeout);
    if (!bytes.ok()) return std::nullopt;
    buffers_.push_back(std::move(*bytes));
    auto m = DecodeEnvelope(buffers_.back());
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return std::nullopt;
    return *m;
  }
  // The next message of `type`, skipping others memd may send first (e.g. a PopulateOrder of its 20 ms tick once a
  // host copy is written); nullopt after `timeout` without one.
  std::optional<Message> NextOf(wire::Body type, std::chrono::milliseconds timeout = 3000ms) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto m = Next(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()));
      if (!m || m->type == type) return m;
    }
    return std::nullopt;
  }
  // Receives `n` messages and files them by type.
  std::map<wire::Body, Message> NextN(int n) {
    std::map<wire::Body, Message> out;
    for (int i = 0; i < n; ++i) {
      auto m = Next();
      EXPECT_TRUE(m.has_value()) << "message " << i << " of " << n << " did not come";
      if (!m) break;
      EXPECT_FALSE(out.count(m->type)) << "two messages of type " << BodyName(m->type);
      out[m->type] = *m;
    }
    return out;
  }
  wire::HelloReplyT Hello(uint32_t capacity_pages, uint64_t page_bytes = kPageBytes, uint32_t request_slots = 4) {
    Send(EncodeHello(MakeTestHello(gpu_, "fake", capacity_pages, page_bytes, request_slots), seq_++, "worker"));
    auto m = Next();
    EXPECT_TRUE(m && m->type == wire::Body::HelloReply);
    return m ? *ReadHelloReply(*m) : wire::HelloReplyT();
  }
  void Admit(RequestId r, uint32_t required, uint64_t history_rows, uint32_t complete_pages) {
    wire::AdmitRequestT a;
    a.request = r;
    a.gpu = gpu_;
    a.required_pages = required;
    a.history_rows = history_rows;
    a.complete_pages = complete_pages;
    Send(EncodeAdmitRequest(a, seq_++, "worker"));
  }
  uint64_t seq() { return seq_++; }
  GpuId gpu() const { return gpu_; }
  // Node request id `n` of this worker's GPU in epoch `epoch`, as workerd gives it (MakeNodeRequestId).
  RequestId Id(uint64_t n, uint64_t epoch = 1) const { return MakeNodeRequestId(gpu_, epoch, n); }

 private:
  GpuId gpu_;
  uint64_t seq_ = 1;
  std::unique_ptr<DealerClient> client_;
  std::deque<std::string> buffers_;  // keeps the bytes of decoded messages alive at stable addresses
};

// The host-pool segment of the memd of `run_dir` (memd/pool_segment.h: named by the canonical run directory).
std::string SegmentOf(const std::string& run_dir) {
  return memd::PoolSegmentName(std::filesystem::canonical(run_dir).string());
}

// Removes the host-pool segment of a memd of `run_dir` (kept by a SIGKILL, or by a clean exit while requests held
// host pages; already gone otherwise: not an error).
void RemoveSegmentOf(const std::string& run_dir) {
  std::error_code ec;
  if (!std::filesystem::exists(run_dir, ec)) return;
  const absl::Status s = HostPoolSegment::Remove(SegmentOf(run_dir));
  EXPECT_TRUE(s.ok() || absl::IsNotFound(s)) << s;
}

// Runs a shell command line as given; returns its exit code (-1 if it did not exit) and what it wrote to stdout.
std::pair<int, std::string> CaptureShell(const std::string& command_line) {
  FILE* f = popen(command_line.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Runs `command` through the shell; returns its exit code and stdout + stderr. `timeout -s KILL` is a guard against a
// memd that would start and serve instead of failing (the test then fails with 137), not a timing assertion.
std::pair<int, std::string> RunShell(const std::string& command) {
  return CaptureShell("timeout -s KILL 60 " + command + " 2>&1");
}

// memd's exit codes (docs/operations.md): every bad command-line value exits 2 with a message naming it; a host pool
// that does not fit in /dev/shm is a runtime failure: exit 1, refused by the free-space check before any segment
// exists. --host-pool-bytes takes K/M/G/T (1000^n) and KiB/MiB/GiB/TiB (1024^n).
TEST(MemdCommandLine, BadValuesExit2AndAPoolTooLargeExits1) {
  char tmpl[] = "/tmp/memd_cli_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string memd = std::string(MEMD_BIN) + " --run-dir " + tmpl + "/run ";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--page-bytes 0 --host-pool-pages 8", "--page-bytes must be a positive multiple of 64, got 0"},
      {"--page-bytes 100 --host-pool-pages 8", "--page-bytes must be a positive multiple of 64, got 100"},
      {"--page-bytes -4096 --host-pool-pages 8", "must not be negative"},
      {"--page-bytes 4096 --host-pool-pages 0", "at least one page of 4096 bytes"},
      {"--page-bytes 4096 --host-pool-bytes 4095", "at least one page of 4096 bytes"},
      {"--page-bytes 4096 --host-pool-pages 4294967296", "fewer than 2^32 pages"},
      {"--page-bytes 4096 --host-pool-bytes 32X", "--host-pool-bytes"},
      {"--page-bytes 4096 --host-pool-bytes -1G", "must not be negative"},
      {"--page-bytes 4096 --host-pool-pages 8 --populate-pages-per-attempt 0",
       "--populate-pages-per-attempt must be at least 1"},
      {"--page-bytes 4096 --host-pool-pages 8 --reserve-pages -1",
       "--reserve-pages: must be an integer in [0, 4294967295], got '-1'"},
      {"--page-bytes 4096 --host-pool-pages 8 --reserve-pages 1.5",
       "--reserve-pages: must be an integer in [0, 4294967295], got '1.5'"},
      {"--page-bytes 4096 --host-pool-pages 8 --worker-timeout-ms 2.5e3",
       "--worker-timeout-ms: must be an integer in [100, 86400000], got '2.5e3'"},
      {"--page-bytes 4096 --host-pool-pages 8 --adopt-grace-ms 1e3",
       "--adopt-grace-ms: must be an integer in [0, 600000], got '1e3'"},
      {"--page-bytes 4096 --host-pool-pages 1e3", "--host-pool-pages: must be an integer in [0, "},
      {"--page-bytes 4096 --host-pool-pages 8 --reclaim-policy random", "--reclaim-policy"},
      {"--page-bytes 4096 --host-pool-pages 8 --frobnicate", "frobnicate"},
      {"--host-pool-pages 8", "--page-bytes is required"},
      // Every flag's bad value (issue 22, docs/operations.md "Exit codes"): each exits 2 and names the flag.
      {"--page-bytes 4096 --host-pool-pages 8 --host-pool-bytes 1M", "--host-pool-bytes excludes --host-pool-pages"},
      {"--page-bytes 99999999999999999999999 --host-pool-pages 8", "--page-bytes"},
      {"--page-bytes 4096 --host-pool-pages 8 --reserve-pages 4294967296",
       "--reserve-pages: must be an integer in [0, 4294967295], got '4294967296'"},
      {"--page-bytes 4096 --host-pool-pages 8 --populate-pages-per-attempt -1", "--populate-pages-per-attempt"},
      {"--page-bytes 4096 --host-pool-pages 8 --worker-timeout-ms 99",
       "--worker-timeout-ms: must be an integer in [100, 86400000], got '99'"},
      {"--page-bytes 4096 --host-pool-pages 8 --adopt-grace-ms 600001",
       "--adopt-grace-ms: must be an integer in [0, 600000], got '600001'"},
      {"--page-bytes 4096 --host-pool-pages 8 --unreadable-segment-age-s 0", "--unreadable-segment-age-s"},
      {"--page-bytes 4096 --host-pool-pages 8 --log-level verbose", "--log-level"},
      {"--page-bytes 4096 --host-pool-pages 8 --metrics-address nonsense",
       "--metrics-address: metrics address 'nonsense' is not HOST:PORT"},
      {"--page-bytes 4096 --host-pool-pages 8 --metrics-address 127.0.0.1:65536",
       "--metrics-address: metrics address '127.0.0.1:65536': bad port"},
      {"--page-bytes 4096 --host-pool-pages 8 --replace-host-pool=maybe", "--replace-host-pool"},
      // Issue 24: the KV event stream tells what the host tier stores: it needs prefix sharing.
      {"--page-bytes 4096 --host-pool-pages 8 --kv-events on", "--kv-events on needs --prefix-sharing on"},
      // Issue 26: the cluster tier shares the host tier's pages.
      {"--page-bytes 4096 --host-pool-pages 8 --cluster-store redis://127.0.0.1:1",
       "--cluster-store needs --prefix-sharing on"},
      {"--page-bytes 4096 --host-pool-pages 8 --prefix-sharing on --cluster-store http://127.0.0.1:1",
       "--cluster-store 'http://127.0.0.1:1': "},
      {"--page-bytes 4096 --host-pool-pages 8 --prefix-sharing on --cluster-store redis://127.0.0.1",
       "--cluster-store 'redis://127.0.0.1': "},
      {"--page-bytes 4096 --host-pool-pages 8 --prefix-sharing on --cluster-store redis://127.0.0.1:1 "
       "--cluster-lookup-timeout-ms 0", "--cluster-lookup-timeout-ms: must be an integer in [1, 10000], got '0'"},
      {"--page-bytes 4096 --host-pool-pages 8 --cluster-lookup-timeout-ms 50",
       "--cluster-lookup-timeout-ms needs --cluster-store"},
      {"--page-bytes 4096 --host-pool-pages 8 --prefix-sharing on --cluster-store redis://:pw@127.0.0.1:6379",
       "credentials in the address are not supported"},
      {"--page-bytes 4096 --host-pool-pages 8 --prefix-eviction fifo", "need --prefix-sharing on"},
      {"--page-bytes 4096 --host-pool-pages 8 --prefix-sharing off --prefix-tenant-quota-pages 5",
       "need --prefix-sharing on"},
      {"--page-bytes 4096 --host-pool-pages 8 --prefix-sharing on --kv-events yes", "--kv-events"},
      {"--page-bytes 4096 --host-pool-pages 8 --prefix-sharing on --kv-events on --kv-events-hwm 0",
       "--kv-events-hwm: must be an integer in [1, 100000000], got '0'"},
  };
  for (const auto& [args, message] : bad) {
    auto [rc, out] = RunShell(memd + args);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_NE(out.find(message), std::string::npos) << args << ": " << out;
  }
  {  // memd creates its run directory, not its parent: a missing parent is a bad --run-dir, not a mkdir/bind error
    const std::string missing = std::string(tmpl) + "/missing/run";
    auto [rc, out] = RunShell(std::string(MEMD_BIN) + " --run-dir " + missing + " --page-bytes 4096 --host-pool-pages 8");
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("run directory " + missing + " does not exist and cannot be created: " + tmpl +
                       "/missing does not exist"),
              std::string::npos)
        << out;
    EXPECT_FALSE(std::filesystem::exists(missing));
  }
  {  // an empty --run-dir, and one too long for the node's sockets: bad values, nothing created
    auto [rc, out] = RunShell(std::string(MEMD_BIN) + " --run-dir '' --page-bytes 4096 --host-pool-pages 8");
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("--run-dir is empty"), std::string::npos) << out;
    const std::string long_dir = std::string(tmpl) + "/" + std::string(100, 'd');
    std::tie(rc, out) = RunShell(std::string(MEMD_BIN) + " --run-dir " + long_dir + " --page-bytes 4096 --host-pool-pages 8");
    EXPECT_EQ(rc, 2) << out;
    EXPECT_NE(out.find("--run-dir: run directory too long for its sockets"), std::string::npos) << out;
    EXPECT_FALSE(std::filesystem::exists(long_dir));
  }
  {  // runtime failures exit 1: a run directory that is a file, a metrics address in use
    const std::string file = std::string(tmpl) + "/a-file";
    std::ofstream(file) << "x";
    auto [rc, out] = RunShell(std::string(MEMD_BIN) + " --run-dir " + file + " --page-bytes 4096 --host-pool-pages 8");
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("exists and is not a directory"), std::string::npos) << out;
  }
  // Nothing of this test's memds is left in /dev/shm: the segments of its run directories do not exist.
  for (const std::string& dir : {std::string(tmpl) + "/run", std::string(tmpl) + "/a-file"}) {
    const std::string canonical = std::filesystem::weakly_canonical(dir).string();
    EXPECT_FALSE(std::filesystem::exists(std::string("/dev/shm/") + memd::PoolSegmentName(canonical))) << dir;
  }

  struct statvfs fs {};
  ASSERT_EQ(::statvfs(kHostPoolShmDir, &fs), 0);
  const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  const uint64_t pages = free_bytes / kMiB + 1024;  // 1 GiB above the free space
  // Plain bytes, and suffixes: 64TiB = 2^46 bytes = 2^26 pages of 1 MiB; 64T = 64e12 bytes -> 61035156 pages.
  const std::vector<std::pair<std::string, uint64_t>> too_large = {
      {std::to_string(pages * kMiB), pages}, {"64TiB", uint64_t{1} << 26}, {"64T", 61035156}};
  for (const auto& [size, want_pages] : too_large) {
    if (want_pages * kMiB <= free_bytes) continue;  // a /dev/shm of more than 64 TB: not this case
    auto [rc, out] = RunShell(memd + "--page-bytes 1048576 --host-pool-bytes " + size);
    EXPECT_EQ(rc, 1) << size << ": " << out;
    EXPECT_NE(out.find("cannot create the host pool (" + std::to_string(want_pages) + " pages x 1048576 bytes"),
              std::string::npos)
        << size << ": " << out;
    EXPECT_NE(out.find("/dev/shm has only"), std::string::npos) << size << ": " << out;
    // Nothing left behind: the segment the message names does not exist.
    const size_t at = out.find("in /dev/shm/");
    ASSERT_NE(at, std::string::npos) << out;
    const std::string segment = out.substr(at + 12, out.find(')', at) - at - 12);
    EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + segment)) << segment;
  }
  std::filesystem::remove_all(tmpl);
}

class MemdProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/memd_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    run_dir_ = dir_ + "/run";
    Spawn();
  }
  // Starts memd on run_dir_ with the fixture's flags and waits for its socket and metrics address.
  void Spawn() {
    std::filesystem::remove(run_dir_ + "/memd.metrics");
    std::vector<std::string> args = {MEMD_BIN,          "--run-dir",         run_dir_,  "--page-bytes",
                                     std::to_string(kPageBytes), "--host-pool-pages", pool_pages_, "--metrics-address",
                                     "127.0.0.1:0",     "--log-level",       "warn"};
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&pid_, MEMD_BIN, nullptr, nullptr, argv.data(), environ), 0);
    for (int i = 0; i < 250 && !(std::filesystem::exists(run_dir_ + "/memd.sock") &&
                                 std::filesystem::exists(run_dir_ + "/memd.metrics"));
         ++i) {
      std::this_thread::sleep_for(20ms);  // connect with retries: memd is starting
    }
    ASSERT_TRUE(std::filesystem::exists(run_dir_ + "/memd.sock")) << "memd did not start";
    std::ifstream(run_dir_ + "/memd.metrics") >> metrics_address_;
  }
  // SIGKILLs memd (nothing of its own cleanup runs) and waits for it.
  void KillMemd() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  std::vector<std::string> extra_args_;  // memd flags of a derived fixture (set in its constructor)
  std::string pool_pages_ = "64";        // memd --host-pool-pages
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    RemoveSegmentOf(run_dir_);  // SIGKILL skips memd's own cleanup
    std::filesystem::remove_all(dir_);
  }

  // Whether the memd of `run_dir` answers `dhsctl status` within `limit` (polled every 20 ms).
  bool AnswersWithin(const std::string& run_dir, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (Dhsctl("--timeout-ms 500 status", run_dir).first == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // Runs dhsctl with `args`; returns its exit code and stdout (stdout and stderr with `with_stderr`).
  std::pair<int, std::string> Dhsctl(const std::string& args, const std::string& run_dir = "",
                                     bool with_stderr = false) {
    return CaptureShell(std::string(DHSCTL_BIN) + " --run-dir " + (run_dir.empty() ? run_dir_ : run_dir) + " " + args +
                        (with_stderr ? " 2>&1" : " 2>/dev/null"));
  }
  json DhsctlJson(const std::string& view) {
    auto [rc, out] = Dhsctl("--json " + view);
    EXPECT_EQ(rc, 0) << out;
    return json::parse(out, nullptr, false);
  }
  // Polls GET /metrics until `line` appears (the loop publishes after each message); returns the last body.
  std::string MetricsWith(const std::string& line) {
    const size_t colon = metrics_address_.rfind(':');
    httplib::Client client(metrics_address_.substr(0, colon), std::stoi(metrics_address_.substr(colon + 1)));
    std::string body;
    for (int i = 0; i < 100; ++i) {
      if (auto res = client.Get("/metrics"); res && res->status == 200) {
        body = res->body;
        if (body.find(line + "\n") != std::string::npos) break;
      }
      std::this_thread::sleep_for(20ms);
    }
    return body;
  }

  std::string dir_, run_dir_, metrics_address_;
  pid_t pid_ = -1;
};

// Two requests on one GPU: the second admission reclaims the first's optional pages
// (ReclaimOrder -> BackupComplete -> ReadersDone -> Retire -> AdmitGrant), then a Complete frees pages and population
// brings the first request's history back (PopulateOrder -> ReadyPublish). A second worker (GPU 0) holds a request
// meanwhile and receives nothing: orders go to the identity of the GPU that owns the pages.
TEST_F(MemdProcess, ReclaimThenPopulateWithTwoWorkers) {
  FakeWorker w0(run_dir_, 0), w1(run_dir_, 1);
  auto hello0 = w0.Hello(4);
  ASSERT_TRUE(hello0.accepted) << hello0.reason;
  ASSERT_EQ(hello0.segments.size(), 1u);
  EXPECT_EQ(hello0.segments[0]->page_bytes, kPageBytes);
  EXPECT_EQ(hello0.segments[0]->pages, 64u);
  EXPECT_EQ(hello0.worker_epoch, 1u);
  ASSERT_TRUE(w1.Hello(8).accepted);

  // GPU 0: request 10, 1 required page, context 2 pages, nothing optional.
  w0.Admit(10, 1, 2 * kPageRows, 0);
  auto m = w0.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  EXPECT_EQ(ReadAdmitGrant(*m)->backup_host_pages.size(), 2u);

  // GPU 1 (M = 8): request r1 (node id 1 of GPU 1), 2 required, context 6 pages (96 rows), 4 complete imported pages. Resident-first: the
  // 6 spare pages keep all 4 complete pages as optional history; every one of the 6 context pages gets a host page.
  const RequestId r1 = w1.Id(1), r2 = w1.Id(2);
  w1.Admit(r1, 2, 6 * kPageRows, 4);
  m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  const wire::AdmitGrantT g1 = *ReadAdmitGrant(*m);
  EXPECT_EQ(g1.request, r1);
  EXPECT_EQ(g1.slot, 0u);  // memd chooses the slot: the lowest free of GPU 1's request_slots
  EXPECT_EQ(g1.required_pages.size(), 2u);
  ASSERT_EQ(g1.optional_pages.size(), 4u);
  EXPECT_EQ(g1.optional_history_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  ASSERT_EQ(g1.backup_host_pages.size(), 6u);

  // dhsctl while request r1 holds its optional pages: GPU 1 M 8, M_req 2, M_opt 4, free 2; a_r 4; host 2/6 (the two
  // pages not kept optional count as host-covered from the grant).
  json status = DhsctlJson("status");
  ASSERT_TRUE(status.is_object()) << status;
  ASSERT_EQ(status["gpus"].size(), 2u);
  const json& gpu1 = status["gpus"][1];
  EXPECT_EQ(gpu1["gpu"], 1);
  EXPECT_EQ(gpu1["M"], 8);
  EXPECT_EQ(gpu1["M_req"], 2);
  EXPECT_EQ(gpu1["M_opt"], 4);
  EXPECT_EQ(gpu1["M_res"], 0);
  EXPECT_EQ(gpu1["free"], 2);
  EXPECT_EQ(status["gpus"][0]["M_req"], 1);
  EXPECT_EQ(status["gpus"][0]["free"], 3);
  json requests = DhsctlJson("requests");
  ASSERT_EQ(requests.size(), 2u);  // in id order: GPU 0's ids are below GPU 1's
  EXPECT_EQ(requests[0]["request"], 10);
  EXPECT_EQ(requests[0]["host_coverage"], "2/2");
  EXPECT_EQ(requests[1]["request"], r1);
  EXPECT_EQ(requests[1]["a_r"], 4);
  EXPECT_EQ(requests[1]["host_coverage"], "2/6");
  auto [rc, table] = Dhsctl("requests");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(table.find("REQ"), std::string::npos) << table;

  // The metrics endpoint shows the same accounting.
  const std::string metrics = MetricsWith("dhs_memd_gpu_pages{gpu=\"1\",kind=\"optional\"} 4");
  EXPECT_NE(metrics.find("dhs_memd_gpu_pages{gpu=\"1\",kind=\"optional\"} 4\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dhs_memd_gpu_pages{gpu=\"1\",kind=\"required\"} 2\n"), std::string::npos);
  EXPECT_NE(metrics.find("dhs_memd_gpu_pages{gpu=\"0\",kind=\"free\"} 3\n"), std::string::npos);
  EXPECT_NE(metrics.find("dhs_memd_grants_total 2\n"), std::string::npos);
  EXPECT_NE(metrics.find("dhs_memd_workers 2\n"), std::string::npos);

  // Request r2 needs 6 required pages: lendable 2, deficit Δ = 4 = a_r1, so request r1 is reclaimed whole and r2
  // waits (queue position 0, Δ 4).
  w1.Admit(r2, 6, 2 * kPageRows, 0);
  auto got = w1.NextN(2);
  ASSERT_TRUE(got.count(wire::Body::ReclaimOrder) && got.count(wire::Body::AdmitWait));
  const wire::AdmitWaitT wait = *ReadAdmitWait(got[wire::Body::AdmitWait]);
  EXPECT_EQ(wait.request, r2);
  EXPECT_EQ(wait.queue_position, 0u);
  EXPECT_EQ(wait.deficit_pages, 4u);
  const wire::ReclaimOrderT rc1 = *ReadReclaimOrder(got[wire::Body::ReclaimOrder]);
  EXPECT_EQ(rc1.request, r1);
  EXPECT_EQ(rc1.gpu, 1u);
  EXPECT_EQ(Sorted(rc1.pages), Sorted(g1.optional_pages));
  EXPECT_EQ(Sorted(rc1.backup_pages), Sorted(g1.optional_pages));  // no host copy yet: all need a backup
  ASSERT_EQ(rc1.backup_targets.size(), rc1.backup_pages.size());
  for (size_t i = 0; i < rc1.backup_pages.size(); ++i) {  // the target is the host page assigned at the grant
    const size_t h = std::find(g1.optional_pages.begin(), g1.optional_pages.end(), rc1.backup_pages[i]) -
                     g1.optional_pages.begin();
    EXPECT_EQ(rc1.backup_targets[i].page(), g1.backup_host_pages[g1.optional_history_pages[h]].page());
  }

  // No Retire before the backup and the readers are done.
  EXPECT_FALSE(w1.Next(100ms).has_value());
  // The GPU page of history page 3 is answered deferred (contract §4: only planned to be kept, its rows still being
  // written). A deferred page the message does not report is refused, and changes nothing.
  const uint32_t page3 = g1.optional_pages[std::find(g1.optional_history_pages.begin(),
                                                     g1.optional_history_pages.end(), 3u) -
                                           g1.optional_history_pages.begin()];
  wire::BackupCompleteT bad;
  bad.order = rc1.order;
  bad.request = r1;
  bad.gpu = 1;
  bad.pages = {page3};
  bad.host_pages = {g1.backup_host_pages[3]};
  bad.ok = true;
  bad.deferred_pages = {page3 == 0 ? 1u : 0u};
  w1.Send(EncodeBackupComplete(bad, w1.seq(), "worker"));
  m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::INVALID_ARGUMENT);
  bad.pages = {page3, page3};  // a page named twice is refused too (and memd keeps serving)
  bad.host_pages = {g1.backup_host_pages[3], g1.backup_host_pages[3]};
  bad.deferred_pages = {};
  w1.Send(EncodeBackupComplete(bad, w1.seq(), "worker"));
  m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(ReadErrorReply(*m)->message.find("named twice"), std::string::npos) << ReadErrorReply(*m)->message;
  wire::BackupCompleteT bc;
  bc.order = rc1.order;
  bc.request = r1;
  bc.gpu = 1;
  bc.pages = rc1.backup_pages;
  bc.host_pages = rc1.backup_targets;
  bc.ok = true;
  bc.deferred_pages = {page3};
  w1.Send(EncodeBackupComplete(bc, w1.seq(), "worker"));
  EXPECT_FALSE(w1.Next(100ms).has_value());
  wire::ReadersDoneT rd;
  rd.order = rc1.order;
  rd.request = r1;
  rd.gpu = 1;
  rd.pages = rc1.pages;
  w1.Send(EncodeReadersDone(rd, w1.seq(), "worker"));
  got = w1.NextN(2);
  ASSERT_TRUE(got.count(wire::Body::Retire) && got.count(wire::Body::AdmitGrant));
  const wire::RetireT retire = *ReadRetire(got[wire::Body::Retire]);
  EXPECT_EQ(retire.order, rc1.order);
  EXPECT_EQ(retire.request, r1);
  EXPECT_EQ(Sorted(retire.pages), Sorted(rc1.pages));
  EXPECT_EQ(retire.regranted_to, r2);
  const wire::AdmitGrantT g2 = *ReadAdmitGrant(got[wire::Body::AdmitGrant]);
  EXPECT_EQ(g2.request, r2);
  EXPECT_EQ(g2.slot, 1u);  // slot 0 is request r1's
  EXPECT_EQ(g2.required_pages.size(), 6u);
  EXPECT_TRUE(g2.optional_pages.empty());
  // The second admission's required pages are the 2 free ones plus the 4 retired ones: all of GPU 1 but request r1's.
  std::vector<uint32_t> all = g1.required_pages;
  all.insert(all.end(), g2.required_pages.begin(), g2.required_pages.end());
  EXPECT_EQ(Sorted(all), (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));

  const json r1_after = DhsctlJson("request " + std::to_string(r1));
  EXPECT_EQ(r1_after["a_r"], 0);
  EXPECT_EQ(r1_after["host_coverage"], "6/6");

  // The worker confirms the host copies of history pages 4 and 5 (HostCopyWritten), then request r2 completes:
  // 6 pages free again and population brings history pages 0-2 (backed up), 4 and 5 back, not page 3 (deferred and not
  // confirmed yet); once page 3 is confirmed, it comes back too.
  wire::HostCopyWrittenT written;
  written.request = r1;
  written.gpu = 1;
  written.history_pages = {4, 5};
  written.host_pages = {g1.backup_host_pages[4], g1.backup_host_pages[5]};
  written.ok = true;
  w1.Send(EncodeHostCopyWritten(written, w1.seq(), "worker"));
  wire::CompleteT done;
  done.request = r2;
  done.gpu = 1;
  w1.Send(EncodeComplete(done, w1.seq(), "worker"));
  m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::CompleteAck);
  EXPECT_EQ(ReadCompleteAck(*m)->released_pages, 6u);
  m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::PopulateOrder);
  const wire::PopulateOrderT pop = *ReadPopulateOrder(*m);
  EXPECT_EQ(pop.request, r1);
  EXPECT_EQ(Sorted(pop.history_pages), (std::vector<uint32_t>{0, 1, 2, 4, 5}));
  ASSERT_EQ(pop.host_pages.size(), pop.pages.size());
  for (size_t i = 0; i < pop.pages.size(); ++i) {
    EXPECT_EQ(pop.host_pages[i].page(), g1.backup_host_pages[pop.history_pages[i]].page());
  }
  // Pending pages are not ready: M_opt 5 of which 0 ready until ReadyPublish.
  status = DhsctlJson("gpus");
  EXPECT_EQ(status[1]["optional_pending"], 5);
  EXPECT_EQ(status[1]["optional_ready"], 0);
  written.history_pages = {3};
  written.host_pages = {g1.backup_host_pages[3]};
  w1.Send(EncodeHostCopyWritten(written, w1.seq(), "worker"));
  m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::PopulateOrder);
  const wire::PopulateOrderT pop3 = *ReadPopulateOrder(*m);
  EXPECT_EQ(pop3.history_pages, std::vector<uint32_t>{3});
  ASSERT_EQ(pop3.host_pages.size(), 1u);
  EXPECT_EQ(pop3.host_pages[0].page(), g1.backup_host_pages[3].page());
  for (const wire::PopulateOrderT* p : {&pop, &pop3}) {
    wire::ReadyPublishT ready;
    ready.order = p->order;
    ready.gpu = 1;
    ready.request = r1;
    ready.pages = p->pages;
    ready.history_pages = p->history_pages;
    ready.ok = true;
    w1.Send(EncodeReadyPublish(ready, w1.seq(), "worker"));
  }
  // Heartbeat as a barrier: its ack comes after the ReadyPublish was handled.
  wire::HeartbeatT hb;
  hb.sender_time_ns = 42;
  w1.Send(EncodeHeartbeat(hb, w1.seq(), "worker"));
  m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::HeartbeatAck);
  EXPECT_EQ(ReadHeartbeatAck(*m)->sender_time_ns, 42u);
  status = DhsctlJson("gpus");
  EXPECT_EQ(status[1]["optional_ready"], 6);
  EXPECT_EQ(status[1]["M_req"], 2);
  EXPECT_EQ(status[1]["free"], 0);
  EXPECT_EQ(DhsctlJson("request " + std::to_string(r1))["a_r"], 6);

  // The other worker got nothing meant for GPU 1.
  EXPECT_FALSE(w0.Next(100ms).has_value());
}

// A bad message gets an ErrorReply and memd keeps serving.
TEST_F(MemdProcess, BadMessagesGetErrorRepliesAndMemdKeepsServing) {
  FakeWorker w(run_dir_, 0);
  w.Send("this is not a flatbuffer");
  auto m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::INVALID_MESSAGE);

  // A worker whose page size differs from the host pool's is refused, with the reason.
  auto refused = w.Hello(4, 2 * kPageBytes);
  EXPECT_FALSE(refused.accepted);
  EXPECT_NE(refused.reason.find("host_page_bytes"), std::string::npos) << refused.reason;

  // Admission before an accepted Hello is rejected.
  w.Admit(5, 1, kPageRows, 0);
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitReject);
  EXPECT_EQ(ReadAdmitReject(*m)->code, wire::ErrorCode::FAILED_PRECONDITION);

  ASSERT_TRUE(w.Hello(4).accepted);
  // complete_pages beyond the context: INVALID_ARGUMENT.
  w.Admit(6, 1, kPageRows, 3);
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitReject);
  EXPECT_EQ(ReadAdmitReject(*m)->code, wire::ErrorCode::INVALID_ARGUMENT);
  // More required pages than M: can never fit.
  w.Admit(7, 5, kPageRows, 0);
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitReject);
  EXPECT_EQ(ReadAdmitReject(*m)->code, wire::ErrorCode::RESOURCE_EXHAUSTED);

  // Reports for orders that were never issued.
  wire::ReadersDoneT rd;
  rd.order = 999;
  const uint64_t seq = w.seq();
  w.Send(EncodeReadersDone(rd, seq, "worker"));
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::NOT_FOUND);
  EXPECT_EQ(ReadErrorReply(*m)->answering_sequence, seq);

  // Still serving: a valid admission is granted.
  w.Admit(8, 1, 3 * kPageRows, 2);
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  const wire::AdmitGrantT g8 = *ReadAdmitGrant(*m);
  EXPECT_EQ(g8.optional_pages.size(), 2u);
  ASSERT_EQ(g8.backup_host_pages.size(), 3u);
  EXPECT_EQ(DhsctlJson("request 8")["host_coverage"], "1/3");  // page 2 is covered by the worker's tail

  // BackupComplete with order 0 (protocol version 2's way to report host writes, whose `pages` were history pages)
  // is refused since version 3: INVALID_ARGUMENT, nothing changes, memd keeps serving.
  wire::BackupCompleteT order0;
  order0.order = 0;
  order0.request = 8;
  order0.gpu = 0;
  order0.pages = {2};
  order0.host_pages = {g8.backup_host_pages[2]};
  order0.ok = true;
  const uint64_t seq0 = w.seq();
  w.Send(EncodeBackupComplete(order0, seq0, "worker"));
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(ReadErrorReply(*m)->answering_sequence, seq0);
  EXPECT_NE(ReadErrorReply(*m)->message.find("HostCopyWritten"), std::string::npos) << ReadErrorReply(*m)->message;
  EXPECT_EQ(DhsctlJson("request 8")["host_coverage"], "1/3");
  // HostCopyWritten naming a host page other than the one assigned at the grant is refused too.
  wire::HostCopyWrittenT written;
  written.request = 8;
  written.gpu = 0;
  written.history_pages = {2};
  written.host_pages = {g8.backup_host_pages[0]};
  w.Send(EncodeHostCopyWritten(written, w.seq(), "worker"));
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::INVALID_ARGUMENT);
  // The same report with the right host page is accepted (no reply), in one message with the kept pages 0 and 1:
  // page 2 now has a confirmed host copy, and the kept pages, written to host outside a reclaim, were not kept (their
  // keep copies failed, contract §3), so memd frees their GPU pages. The population tick brings all three back, from
  // their host pages, into the one free GPU page and the two freed ones: 3/3.
  written.history_pages = {2, 0, 1};
  written.host_pages = {g8.backup_host_pages[2], g8.backup_host_pages[0], g8.backup_host_pages[1]};
  w.Send(EncodeHostCopyWritten(written, w.seq(), "worker"));
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::PopulateOrder);
  EXPECT_EQ(ReadPopulateOrder(*m)->history_pages, (std::vector<uint32_t>{0, 1, 2}));
  ASSERT_EQ(ReadPopulateOrder(*m)->host_pages.size(), 3u);
  EXPECT_EQ(ReadPopulateOrder(*m)->host_pages[2].page(), g8.backup_host_pages[2].page());
  EXPECT_FALSE(w.Next(100ms).has_value());
  EXPECT_EQ(DhsctlJson("request 8")["host_coverage"], "3/3");
  const std::string metrics = MetricsWith("dhs_memd_host_writes_total 3");
  EXPECT_NE(metrics.find("dhs_memd_keeps_lost_total 2\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dhs_memd_grants_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dhs_memd_rejects_total 1\n"), std::string::npos) << metrics;
}

// Every member of the wire message list (DHS_WIRE_MESSAGES, issue 23), each with a default body, from a worker's
// routing id that said no Hello: the members memd does not serve are refused UNKNOWN_MESSAGE "memd does not serve
// <Name>" answering their sequence; every member memd serves gets another answer (a HelloReply, an AdmitReject, an
// IntrospectReply, or the refusal of a worker without a Hello). The served list is docs/protocol.md's, typed here
// independently of memd's NotForMemd. memd keeps serving: a Hello is accepted after it.
TEST_F(MemdProcess, EveryWireMessageIsServedOrRefusedAsNotForMemd) {
  const std::set<wire::Body> served = {
      wire::Body::Hello,          wire::Body::AdmitRequest, wire::Body::BackupComplete, wire::Body::HostCopyWritten,
      wire::Body::ReadersDone,    wire::Body::ReadyPublish, wire::Body::TokensCommitted, wire::Body::Complete,
      wire::Body::IntrospectQuery, wire::Body::Heartbeat,   wire::Body::HeartbeatAck};
  FakeWorker w(run_dir_, 0);
  int refused = 0;
  auto check = [&](wire::Body type, uint64_t seq) {
    std::optional<Message> m = w.Next();
    ASSERT_TRUE(m.has_value()) << BodyName(type) << ": no answer";
    const bool unknown = m->type == wire::Body::ErrorReply && ReadErrorReply(*m)->code == wire::ErrorCode::UNKNOWN_MESSAGE;
    EXPECT_EQ(unknown, !served.contains(type)) << BodyName(type) << " answered by " << BodyName(m->type);
    if (!unknown) return;
    ++refused;
    EXPECT_EQ(ReadErrorReply(*m)->message, absl::StrCat("memd does not serve ", BodyName(type)));
    EXPECT_EQ(ReadErrorReply(*m)->answering_sequence, seq);
  };
#define DHS_SEND_EVERY(Name)                                          \
  {                                                                   \
    const uint64_t seq = w.seq();                                     \
    w.Send(Encode##Name(wire::Name##T{}, seq, "worker"));             \
    check(wire::Body::Name, seq);                                     \
  }
  DHS_WIRE_MESSAGES(DHS_SEND_EVERY)
#undef DHS_SEND_EVERY
  EXPECT_EQ(refused, static_cast<int>(std::size(kWireMessages) - served.size()));  // 29 - 11 = 18 today
  ASSERT_TRUE(w.Hello(4).accepted);
}

// A Hello with M = 2^32-1 pages (it used to kill memd with std::bad_alloc, leaving its shm segment behind) or too
// many request slots is refused with the reason, and memd keeps serving.
TEST_F(MemdProcess, HelloBeyondTheBoundsIsRefusedAndMemdKeepsServing) {
  FakeWorker w(run_dir_, 0);
  auto huge = w.Hello(UINT32_MAX);
  EXPECT_FALSE(huge.accepted);
  EXPECT_NE(huge.reason.find("exceeds memd's bound of 67108864 pages"), std::string::npos) << huge.reason;
  auto slots = w.Hello(4, kPageBytes, UINT32_MAX);
  EXPECT_FALSE(slots.accepted);
  EXPECT_NE(slots.reason.find("request slots"), std::string::npos) << slots.reason;
  ASSERT_TRUE(w.Hello(4).accepted);  // still serving; the GPU was never registered with the refused numbers
}

// The worker's shape (issue 14) is shown in the status view: a Hello whose serving_mode is not one of workerd's modes
// (here bytes that are not UTF-8, which once made memd terminate when dhsctl --json status rendered them, and a line
// break that would forge a table line) is refused with the reason, and memd keeps serving; workerd's modes are kept
// and shown, and a Hello without a shape (an older worker) shows "worker": null.
TEST_F(MemdProcess, HelloWithAnUnknownServingModeIsRefusedAndStatusStaysValid) {
  FakeWorker w(run_dir_, 0);
  for (const char* bad : {"\xff\xfe", "adaptive\nGPU 9 worker: x", "fast"}) {
    wire::HelloT h = MakeTestHello(0, "fake", 4, kPageBytes, 4);
    h.serving_mode = bad;
    w.Send(EncodeHello(h, w.seq(), "worker"));
    auto m = w.NextOf(wire::Body::HelloReply);
    ASSERT_TRUE(m.has_value());
    const wire::HelloReplyT reply = *ReadHelloReply(*m);
    EXPECT_FALSE(reply.accepted);
    EXPECT_NE(reply.reason.find("is not resident, hisparse or adaptive"), std::string::npos) << reply.reason;
  }
  json status = DhsctlJson("status");
  ASSERT_TRUE(status.is_object());
  EXPECT_TRUE(status["gpus"].empty()) << status.dump();  // none of them registered the GPU
  wire::HelloT h = MakeTestHello(0, "fake", 4, kPageBytes, 4);
  h.serving_mode = "hisparse";
  h.index_producers = 1;
  w.Send(EncodeHello(h, w.seq(), "worker"));
  auto m = w.NextOf(wire::Body::HelloReply);
  ASSERT_TRUE(m.has_value());
  EXPECT_TRUE(ReadHelloReply(*m)->accepted);
  FakeWorker old(run_dir_, 1);
  ASSERT_TRUE(old.Hello(4).accepted);  // no shape at all
  status = DhsctlJson("status");
  ASSERT_EQ(status["gpus"].size(), 2u) << status.dump();
  EXPECT_EQ(status["gpus"][0]["worker"]["serving_mode"], "hisparse") << status.dump();
  EXPECT_TRUE(status["gpus"][1]["worker"].is_null()) << status.dump();
}

// The whole text of `path` ("" when it cannot be read).
std::string FileText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// An AdmitRequest of `id` on GPU 0 (1 required page, `history_rows` rows) with a record (prompt {1, 2, 3}, 4 new
// tokens): what a resumable request's admission carries.
wire::AdmitRequestT RecordedAdmit(RequestId id, uint64_t history_rows) {
  wire::AdmitRequestT m;
  m.request = id;
  m.gpu = 0;
  m.required_pages = 1;
  m.history_rows = history_rows;
  m.record = std::make_unique<wire::RequestRecordT>();
  m.record->request = id;
  m.record->prompt = {1, 2, 3};
  m.record->max_new_tokens = 4;
  return m;
}

// Confirms the host copy of history page 0 of `a` (HostCopyWritten, GPU 0), then commits token 7 (digest 70) and
// waits for its TokensCommittedAck: memd handled the HostCopyWritten before it (another message may come first).
void ConfirmPageZeroAndSync(FakeWorker& w, RequestId a) {
  wire::HostCopyWrittenT hw;
  hw.request = a;
  hw.gpu = 0;
  hw.history_pages = {0};
  hw.ok = true;
  w.Send(EncodeHostCopyWritten(hw, w.seq(), "worker"));
  wire::TokensCommittedT t;
  t.gpu = 0;
  t.entries.push_back(std::make_unique<wire::CommittedTokensT>());
  t.entries[0]->request = a;
  t.entries[0]->tokens = {7};
  t.entries[0]->logits_digests = {70};
  w.Send(EncodeTokensCommitted(t, w.seq(), "worker"));
  auto ack = w.NextOf(wire::Body::TokensCommittedAck);
  ASSERT_TRUE(ack && ack->type == wire::Body::TokensCommittedAck);
}

// A Hello of `w`'s GPU (M = 4, N = 4) naming model `model` (Hello.model_fingerprint), and memd's reply.
wire::HelloReplyT HelloOfModel(FakeWorker& w, uint64_t model) {
  wire::HelloT h = MakeTestHello(w.gpu(), "fake", 4, kPageBytes, 4);
  h.model_fingerprint = model;
  w.Send(EncodeHello(h, w.seq(), "worker"));
  auto m = w.NextOf(wire::Body::HelloReply);
  EXPECT_TRUE(m.has_value());
  return m ? *ReadHelloReply(*m) : wire::HelloReplyT();
}

// Issue 26: a worker's model fingerprint (Hello.model_fingerprint). A restarted worker of a GPU must serve the model
// its GPU was registered with (its interrupted requests' host pages hold that model's rows); without prefix sharing
// two GPUs may serve two models; 0 (not said) is never compared. dhsctl status shows it (16 hex digits, a string).
TEST_F(MemdProcess, ARestartedWorkerOfAnotherModelIsRefused) {
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(HelloOfModel(w, 0xa1).accepted);
  const wire::HelloReplyT other = HelloOfModel(w, 0xb2);
  EXPECT_FALSE(other.accepted);
  EXPECT_NE(other.reason.find("GPU 0 was registered with model 00000000000000a1; a restarted worker must serve it "
                              "(got 00000000000000b2)"), std::string::npos) << other.reason;
  EXPECT_TRUE(HelloOfModel(w, 0).accepted);     // not said: not compared
  EXPECT_TRUE(HelloOfModel(w, 0xa1).accepted);  // the same model again
  FakeWorker w1(run_dir_, 1);
  EXPECT_TRUE(HelloOfModel(w1, 0xb2).accepted);  // another GPU, another model: fine without prefix sharing
  json status = DhsctlJson("status");
  ASSERT_EQ(status["gpus"].size(), 2u) << status.dump();
  EXPECT_EQ(status["gpus"][0]["model"], "00000000000000a1") << status.dump();
  EXPECT_EQ(status["gpus"][1]["model"], "00000000000000b2") << status.dump();
}

// Issue 26: memd journals each GPU's model (RUN_DIR/models, memd/model_journal.h). A memd SIGKILLed while GPU 0's
// request of model a1 holds a host page adopts that page after its restart and still refuses a GPU 0 worker of model
// b2 (which would resume the request from a1's rows); GPU 1, which held nothing, takes b2; a1's worker is accepted
// and gets its interrupted request back. The file names both GPUs' models.
TEST_F(MemdProcess, ARestartedMemdKeepsTheModelOfTheHostPagesItAdopted) {
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(HelloOfModel(*w, 0xa1).accepted);
  const RequestId a = w->Id(1);
  w->Send(EncodeAdmitRequest(RecordedAdmit(a, kPageRows), w->seq(), "worker"));
  ASSERT_TRUE(w->NextOf(wire::Body::AdmitGrant).has_value());
  ConfirmPageZeroAndSync(*w, a);
  KillMemd();
  w.reset();
  Spawn();
  FakeWorker w2(run_dir_, 0);
  const wire::HelloReplyT other = HelloOfModel(w2, 0xb2);
  EXPECT_FALSE(other.accepted);
  EXPECT_NE(other.reason.find("GPU 0 was registered with model 00000000000000a1; a restarted worker must serve it "
                              "(got 00000000000000b2)"), std::string::npos) << other.reason;
  FakeWorker w1(run_dir_, 1);
  EXPECT_TRUE(HelloOfModel(w1, 0xb2).accepted);  // GPU 1 held nothing: any model (no prefix sharing)
  const wire::HelloReplyT same = HelloOfModel(w2, 0xa1);
  ASSERT_TRUE(same.accepted) << same.reason;
  EXPECT_EQ(same.interrupted_requests, std::vector<uint64_t>{a});
  EXPECT_EQ(FileText(run_dir_ + "/models"), "0 00000000000000a1\n1 00000000000000b2\n");
}

// A restarted memd forgets the model of a GPU that held nothing: its next worker may serve another one.
TEST_F(MemdProcess, ARestartedMemdForgetsTheModelOfAGpuThatHeldNothing) {
  {
    FakeWorker w(run_dir_, 0);
    ASSERT_TRUE(HelloOfModel(w, 0xa1).accepted);
    EXPECT_EQ(FileText(run_dir_ + "/models"), "0 00000000000000a1\n");
    KillMemd();
  }
  Spawn();
  EXPECT_FALSE(std::filesystem::exists(run_dir_ + "/models"));  // nothing adopted: nothing of a1 is left
  FakeWorker w2(run_dir_, 0);
  const wire::HelloReplyT r = HelloOfModel(w2, 0xb2);
  EXPECT_TRUE(r.accepted) << r.reason;
  EXPECT_EQ(FileText(run_dir_ + "/models"), "0 00000000000000b2\n");
}

// Speculation memory declared to memd (issue 13): the Hello's totals for N = 4 slots (draft rings 4 * 10000 bytes,
// staging 4 * 5000) and each admission's share inside its required pages (ceil(10000 / 4096) = 3 ring pages,
// ceil(5000 / 4096) = 2 staging pages, + 2 for the hot cache and tail = 7). M = 16: two sessions take 14 pages and a
// third waits (2 lendable < 7), where without the shares 16 / 2 = 8 would fit N = 4 slots. dhsctl shows each request's
// share and the GPU's sums; GET /metrics counts them; a share whose pages are not its bytes is rejected.
TEST_F(MemdProcess, DhsctlAndMetricsShowSpeculationShares) {
  FakeWorker w(run_dir_, 2);
  wire::HelloT hello = MakeTestHello(2, "fake", 16, kPageBytes, 4);
  hello.has_drafter = true;
  hello.draft_ring_bytes = 40000;
  hello.staging_bytes = 20000;
  hello.staging_arenas = 4;
  w.Send(EncodeHello(hello, w.seq(), "worker"));
  auto reply = w.Next();
  ASSERT_TRUE(reply && reply->type == wire::Body::HelloReply);
  ASSERT_TRUE(ReadHelloReply(*reply)->accepted) << ReadHelloReply(*reply)->reason;
  const auto admit = [&](uint64_t n, uint32_t ring_pages) {
    wire::AdmitRequestT a;
    a.request = w.Id(n);
    a.gpu = 2;
    a.required_pages = 2 + ring_pages + 2;
    a.history_rows = kPageRows;
    a.draft_ring_pages = ring_pages;
    a.staging_pages = 2;
    a.draft_ring_bytes = 10000;
    a.staging_bytes = 5000;
    w.Send(EncodeAdmitRequest(a, w.seq(), "worker"));
    return w.Next();
  };
  for (uint64_t n : {1, 2}) {
    auto m = admit(n, 3);
    ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant) << (m ? BodyName(m->type) : "nothing");
    EXPECT_EQ(ReadAdmitGrant(*m)->required_pages.size(), 7u);
  }
  auto wait = admit(3, 3);
  ASSERT_TRUE(wait && wait->type == wire::Body::AdmitWait) << (wait ? BodyName(wait->type) : "nothing");
  EXPECT_EQ(ReadAdmitWait(*wait)->deficit_pages, 5u);  // 7 - 2 lendable
  auto bad = admit(4, 2);  // 10000 bytes are 3 pages of 4096, not 2
  ASSERT_TRUE(bad && bad->type == wire::Body::AdmitReject) << (bad ? BodyName(bad->type) : "nothing");
  EXPECT_EQ(ReadAdmitReject(*bad)->code, wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(ReadAdmitReject(*bad)->reason.find("pages of 4096 bytes need 3 and 2"), std::string::npos)
      << ReadAdmitReject(*bad)->reason;

  const json r1 = DhsctlJson("request " + std::to_string(w.Id(1)));
  EXPECT_EQ(r1["required_pages"], 7);
  EXPECT_EQ(r1["draft_ring_pages"], 3);
  EXPECT_EQ(r1["draft_ring_bytes"], 10000);
  EXPECT_EQ(r1["staging_pages"], 2);
  EXPECT_EQ(r1["staging_bytes"], 5000);
  const json r3 = DhsctlJson("request " + std::to_string(w.Id(3)));  // queued: its share, not yet counted
  EXPECT_EQ(r3["state"], "queued");
  EXPECT_EQ(r3["draft_ring_bytes"], 10000);
  const json g = DhsctlJson("gpus")[0];
  EXPECT_EQ(g["M_req"], 14);
  EXPECT_EQ(g["draft_ring_pages"], 6);
  EXPECT_EQ(g["staging_pages"], 4);
  EXPECT_EQ(g["draft_ring_bytes"], 20000);
  EXPECT_EQ(g["staging_bytes"], 10000);
  EXPECT_EQ(g["declared_draft_ring_bytes"], 40000);
  EXPECT_EQ(g["declared_staging_bytes"], 20000);
  auto [rc, text] = Dhsctl("request " + std::to_string(w.Id(1)));
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("speculation: draft ring 3 pages = 10000 bytes, staging 2 pages = 5000 bytes"),
            std::string::npos)
      << text;
  auto [grc, gtext] = Dhsctl("gpus");
  EXPECT_EQ(grc, 0);
  EXPECT_NE(gtext.find("GPU 2 speculation: draft ring 6 pages = 20000 bytes in use (40000 declared), staging 4 pages "
                       "= 10000 bytes in use (20000 declared)"),
            std::string::npos)
      << gtext;
  const std::string metrics = MetricsWith("dhs_memd_gpu_speculation_pages{gpu=\"2\",kind=\"draft_ring\"} 6");
  for (const char* line : {"dhs_memd_gpu_speculation_pages{gpu=\"2\",kind=\"draft_ring\"} 6\n",
                           "dhs_memd_gpu_speculation_pages{gpu=\"2\",kind=\"staging\"} 4\n",
                           "dhs_memd_gpu_speculation_bytes{gpu=\"2\",kind=\"draft_ring\"} 20000\n",
                           "dhs_memd_gpu_speculation_bytes{gpu=\"2\",kind=\"staging\"} 10000\n",
                           "dhs_memd_gpu_declared_speculation_bytes{gpu=\"2\",kind=\"draft_ring\"} 40000\n",
                           "dhs_memd_gpu_declared_speculation_bytes{gpu=\"2\",kind=\"staging\"} 20000\n"}) {
    EXPECT_NE(metrics.find(line), std::string::npos) << line << metrics;
  }
}

// history_rows = 2^64-1: the daemon's rows -> pages used to wrap to 0 context pages and grant it; the core now refuses
// it (INVALID_ARGUMENT).
TEST_F(MemdProcess, AdmitWithHistoryRowsBeyondAnyPoolIsRejected) {
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(4).accepted);
  w.Admit(1, 1, UINT64_MAX, 0);
  auto m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitReject) << (m ? BodyName(m->type) : "nothing");
  EXPECT_EQ(ReadAdmitReject(*m)->code, wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(ReadAdmitReject(*m)->reason.find("history_rows"), std::string::npos) << ReadAdmitReject(*m)->reason;
  EXPECT_EQ(Dhsctl("request 1").first, 4);  // not admitted
}

// HostCopyWritten naming a page three times used to be accepted and counted three times: INVALID_ARGUMENT, nothing
// changes.
TEST_F(MemdProcess, HostCopyWrittenNamingAPageTwiceIsRefused) {
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(4).accepted);
  w.Admit(2, 1, 3 * kPageRows, 0);
  auto m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  const wire::AdmitGrantT g = *ReadAdmitGrant(*m);
  ASSERT_EQ(g.backup_host_pages.size(), 3u);
  EXPECT_EQ(DhsctlJson("request 2")["host_coverage"], "3/3");  // all three covered by the worker's tail
  wire::HostCopyWrittenT written;
  written.request = 2;
  written.gpu = 0;
  written.history_pages = {1, 1, 1};
  written.ok = true;
  const uint64_t seq = w.seq();
  w.Send(EncodeHostCopyWritten(written, seq, "worker"));
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply) << (m ? BodyName(m->type) : "nothing");
  EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(ReadErrorReply(*m)->answering_sequence, seq);
  EXPECT_NE(ReadErrorReply(*m)->message.find("named twice"), std::string::npos) << ReadErrorReply(*m)->message;
  EXPECT_EQ(DhsctlJson("request 2")["tail_pages"], 3);  // state unchanged
  written.history_pages = {1};
  w.Send(EncodeHostCopyWritten(written, w.seq(), "worker"));
  const std::string metrics = MetricsWith("dhs_memd_host_writes_total 1");
  EXPECT_NE(metrics.find("dhs_memd_host_writes_total 1\n"), std::string::npos) << metrics;
  EXPECT_EQ(DhsctlJson("request 2")["tail_pages"], 2);
}

// An idle memd counts its 20 ms timer in dhs_memd_ticks_total, not in dhs_memd_events_total (it used to count ~50
// events a second with no peer at all).
TEST_F(MemdProcess, IdleTicksAreNotCountedAsEvents) {
  std::this_thread::sleep_for(300ms);  // ~15 ticks
  const std::string metrics = MetricsWith("dhs_memd_events_total 0");
  EXPECT_NE(metrics.find("dhs_memd_events_total 0\n"), std::string::npos) << metrics;
  const size_t at = metrics.find("\ndhs_memd_ticks_total ");
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_GT(std::stoull(metrics.substr(at + 22)), 0u) << metrics;
}

// Issue 12: memd never aborts on what a peer sent. Reserved request ids (0, 2^64-1 = memd's "no owner") are refused
// with INVALID_ARGUMENT; worker-only messages (Complete, HostCopyWritten, BackupComplete, ReadersDone, ReadyPublish)
// are accepted only from the worker that said Hello for the GPU of the request / order they name: another peer (a
// client, or the worker of another GPU) gets PERMISSION_DENIED, the message changes nothing, and the refusal is counted
// (dhs_memd_refused_peers_total).
TEST_F(MemdProcess, ReservedIdsAndMessagesFromTheWrongPeerAreRefused) {
  FakeWorker w(run_dir_, 0);
  FakeWorker other(run_dir_, 1);
  ASSERT_TRUE(w.Hello(8).accepted);
  ASSERT_TRUE(other.Hello(8).accepted);
  for (RequestId reserved : {~RequestId{0}, RequestId{0}}) {
    w.Admit(reserved, 1, kPageRows, 0);
    auto m = w.Next();
    ASSERT_TRUE(m && m->type == wire::Body::AdmitReject);
    EXPECT_EQ(ReadAdmitReject(*m)->code, wire::ErrorCode::INVALID_ARGUMENT);
    EXPECT_NE(ReadAdmitReject(*m)->reason.find("reserved"), std::string::npos) << ReadAdmitReject(*m)->reason;
  }
  w.Admit(5, 1, 3 * kPageRows, 2);
  auto m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  const wire::AdmitGrantT g5 = *ReadAdmitGrant(*m);

  FakeWorker client(run_dir_, 0, "dhsctl/4242");  // a client on memd's socket, claiming GPU 0's request
  int refused = 0;
  // It cannot take GPU 0's role over with a Hello: only the routing id worker/0 may say it.
  const wire::HelloReplyT taken = client.Hello(8);
  EXPECT_FALSE(taken.accepted);
  EXPECT_NE(taken.reason.find("must come from the routing id worker/0"), std::string::npos) << taken.reason;
  ++refused;
  auto expect_refused = [&](FakeWorker& from, const std::string& bytes, const std::string& what) {
    from.Send(bytes);
    auto r = from.Next();
    ASSERT_TRUE(r && r->type == wire::Body::ErrorReply) << what;
    EXPECT_EQ(ReadErrorReply(*r)->code, wire::ErrorCode::PERMISSION_DENIED) << what << ": " << ReadErrorReply(*r)->message;
    ++refused;
  };
  wire::CompleteT complete;
  complete.request = 5;
  complete.gpu = 0;
  expect_refused(client, EncodeComplete(complete, client.seq(), "dhsctl"), "Complete from a client");
  expect_refused(other, EncodeComplete(complete, other.seq(), "worker"), "Complete from GPU 1's worker");
  wire::HostCopyWrittenT written;
  written.request = 5;
  written.gpu = 0;
  written.history_pages = {2};
  written.host_pages = {g5.backup_host_pages[2]};
  written.ok = true;
  expect_refused(client, EncodeHostCopyWritten(written, client.seq(), "dhsctl"), "HostCopyWritten");
  wire::BackupCompleteT backup;
  backup.order = 1;
  backup.request = 5;
  backup.ok = true;
  expect_refused(client, EncodeBackupComplete(backup, client.seq(), "dhsctl"), "BackupComplete");
  wire::ReadersDoneT readers;
  readers.order = 1;
  readers.request = 5;
  expect_refused(client, EncodeReadersDone(readers, client.seq(), "dhsctl"), "ReadersDone");
  wire::ReadyPublishT publish;
  publish.order = 1;
  publish.request = 5;
  publish.ok = true;
  expect_refused(client, EncodeReadyPublish(publish, client.seq(), "dhsctl"), "ReadyPublish");
  // Nothing changed: request 5 is admitted with its pages and its one host-covered page (the tail's).
  const json r5 = DhsctlJson("request 5");
  EXPECT_EQ(r5["state"], "admitted");
  EXPECT_EQ(r5["host_coverage"], "1/3");
  EXPECT_NE(MetricsWith("dhs_memd_refused_peers_total " + std::to_string(refused)).find(
                "dhs_memd_refused_peers_total " + std::to_string(refused) + "\n"),
            std::string::npos);
  // The owner's Complete is accepted; introspection from anyone still is.
  w.Send(EncodeComplete(complete, w.seq(), "worker"));
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::CompleteAck);
  EXPECT_EQ(ReadCompleteAck(*m)->released_pages, 3u);
  EXPECT_EQ(Dhsctl("status").first, 0);
}

// Issue 12: memd enforces each worker's range of node request ids (MakeNodeRequestId, common/types.h): a request id a
// worker names must carry its own GPU. The worker of GPU 1 admitting GPU 0's id 5 (or GPU 2's) is refused with
// AdmitReject{INVALID_ARGUMENT} naming both GPUs; a Complete / HostCopyWritten of an unknown id of another GPU's range
// likewise (ErrorReply INVALID_ARGUMENT), one of a known request of another GPU as before (PERMISSION_DENIED). Each
// refusal is counted (dhs_memd_foreign_request_ids_total) and changes nothing; ids in range, of any epoch, are served.
TEST_F(MemdProcess, RequestIdsOutsideTheWorkersGpuRangeAreRefused) {
  FakeWorker w0(run_dir_, 0), w1(run_dir_, 1);
  ASSERT_TRUE(w0.Hello(8).accepted);
  ASSERT_TRUE(w1.Hello(8).accepted);
  w0.Admit(w0.Id(5), 1, 2 * kPageRows, 0);
  auto m = w0.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  int foreign = 0;
  const std::vector<std::pair<RequestId, GpuId>> outside = {
      {w0.Id(5), 0}, {w0.Id(6), 0}, {MakeNodeRequestId(2, 1, 5), 2}, {MakeNodeRequestId(0, 3, 7), 0}};
  for (const auto& [id, owner] : outside) {
    w1.Admit(id, 1, kPageRows, 0);
    m = w1.Next();
    ASSERT_TRUE(m && m->type == wire::Body::AdmitReject) << id;
    const wire::AdmitRejectT reject = *ReadAdmitReject(*m);
    EXPECT_EQ(reject.request, id);
    EXPECT_EQ(reject.code, wire::ErrorCode::INVALID_ARGUMENT) << reject.reason;
    EXPECT_NE(reject.reason.find("request id " + std::to_string(id) + " is outside GPU 1's range"), std::string::npos)
        << reject.reason;
    EXPECT_NE(reject.reason.find("it is GPU " + std::to_string(owner) + "'s"), std::string::npos) << reject.reason;
    ++foreign;
  }
  auto expect_error = [&](const std::string& bytes, wire::ErrorCode code, const std::string& what) {
    w1.Send(bytes);
    auto r = w1.Next();
    ASSERT_TRUE(r && r->type == wire::Body::ErrorReply) << what;
    EXPECT_EQ(ReadErrorReply(*r)->code, code) << what << ": " << ReadErrorReply(*r)->message;
  };
  wire::CompleteT complete;
  complete.gpu = 1;
  complete.request = w0.Id(6);  // unknown, GPU 0's range
  expect_error(EncodeComplete(complete, w1.seq(), "worker"), wire::ErrorCode::INVALID_ARGUMENT, "Complete, unknown");
  ++foreign;
  wire::HostCopyWrittenT written;
  written.gpu = 1;
  written.request = w0.Id(6);
  written.history_pages = {0};
  written.ok = true;
  expect_error(EncodeHostCopyWritten(written, w1.seq(), "worker"), wire::ErrorCode::INVALID_ARGUMENT,
               "HostCopyWritten, unknown");
  ++foreign;
  complete.request = w0.Id(5);  // GPU 0's live request: the peer check (not counted as a foreign id)
  expect_error(EncodeComplete(complete, w1.seq(), "worker"), wire::ErrorCode::PERMISSION_DENIED, "Complete, known");
  complete.request = w1.Id(9);  // its own range, unknown: the core's NOT_FOUND, as before
  expect_error(EncodeComplete(complete, w1.seq(), "worker"), wire::ErrorCode::NOT_FOUND, "Complete, own range");

  // Nothing changed: GPU 1 holds nothing, GPU 0's request 5 is admitted.
  json gpus = DhsctlJson("gpus");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[1]["free"], 8) << gpus.dump();
  EXPECT_EQ(gpus[0]["M_req"], 1) << gpus.dump();
  EXPECT_EQ(DhsctlJson("request " + std::to_string(w0.Id(5)))["state"], "admitted");
  const std::string line = "dhs_memd_foreign_request_ids_total " + std::to_string(foreign);
  EXPECT_NE(MetricsWith(line).find(line + "\n"), std::string::npos) << line;
  // Ids in GPU 1's range, of epoch 1 and of a later epoch's bits, are served.
  for (RequestId id : {w1.Id(5), w1.Id(5, 2)}) {
    w1.Admit(id, 1, kPageRows, 0);
    m = w1.Next();
    ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant) << id;
    EXPECT_EQ(ReadAdmitGrant(*m)->request, id);
  }
  EXPECT_EQ(DhsctlJson("gpus")[1]["M_req"], 2);
}

// The metrics address is bound exclusively (issue 12): cpp-httplib's default SO_REUSEPORT let a second memd bind the
// same address, and scrapes reached either node at random. The second memd exits 1 naming the address, leaves no
// socket or segment, and the first keeps serving its metrics.
TEST_F(MemdProcess, SecondMemdOnTheSameMetricsAddressFails) {
  const std::string other = dir_ + "/other";
  auto [rc, out] = RunShell(std::string(MEMD_BIN) + " --run-dir " + other + " --page-bytes 4096 --host-pool-pages 8 " +
                            "--metrics-address " + metrics_address_);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("metrics: cannot listen on " + metrics_address_), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(other + "/memd.sock"));
  EXPECT_FALSE(std::filesystem::exists(other + "/memd.metrics"));
  EXPECT_NE(MetricsWith("dhs_memd_workers 0").find("dhs_memd_workers 0\n"), std::string::npos);
}

// dhsctl on a run directory it may not read (issue 12): exit 1 with "permission denied", never an uncaught exception
// (exit 134). Root passes every permission check, so as root dhsctl runs as nobody (setpriv); a path component that is
// not a directory is the other way std::filesystem used to throw.
TEST_F(MemdProcess, DhsctlOnARunDirectoryItMayNotReadExits1) {
  auto [rc, out] = Dhsctl("status", "/etc/passwd/run", true);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("not a directory"), std::string::npos) << out;
  std::string as_other = std::string(DHSCTL_BIN) + " --run-dir " + run_dir_ + " status 2>&1";
  if (::geteuid() == 0) {
    if (!std::filesystem::exists("/usr/bin/setpriv")) GTEST_SKIP() << "root without setpriv";
    as_other = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups " + as_other;
  } else {
    ASSERT_EQ(::chmod(run_dir_.c_str(), 0), 0);
  }
  std::tie(rc, out) = CaptureShell(as_other);
  if (::geteuid() != 0) ::chmod(run_dir_.c_str(), 0700);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("dhsctl: permission denied: cannot reach " + run_dir_ + "/memd.sock"), std::string::npos) << out;
  EXPECT_EQ(Dhsctl("status").first, 0);  // memd itself is fine
}

// dhsctl (suite tools): table and JSON views, bad views, and a clear error when memd is not running.
// `dhsctl plan --live` against a started memd with a fake worker, then the worker admits sessions of the plan's shape:
// exactly the number the live plan gave are granted (one of them after a reclaim), the next one waits.
// Topology (a description file): p = 16 rows, L_pay = 1, d_KV = 128, L_idx = 1, d_idx = 128, so its host page (payload
// rows, then the index keys) is 16 * (128 + 128) = 4096 bytes = memd's --page-bytes and its GPU page 16 * 128 = 2048.
// Context n = 100 -> n_pad = 112 -> 7 host pages per session. Hierarchical bytes per session (the static plan) =
// n_pad * L_idx * d_idx + (B + tail) * L_pay * d_KV + 16 * B * L_idx = 112 * 128 + (64 + 16) * 128 + 16 * 64 = 14336 +
// 10240 + 1024 = 25600. The live plan counts what workerd declares (SessionRequiredPages; "speculation": false, so no
// draft ring or staging share): ceil((B + T) / p) + ceil(n * L_idx * d_idx / GPU page) = ceil(80 / 16) +
// ceil(12800 / 2048) = 5 + 7 = 12 GPU pages per session.
// memd state: GPU 0 with M = 30, 8 slots; request 1 holds 2 required + 6 optional pages (8 context pages). Lendable
// 30 - 8 = 22, reclaimable 6 -> 28 pages -> floor(28 / 12) = 2 sessions; free slots 8 - 1 = 7; host 64 - 8 = 56 pages
// -> 8 sessions. memd would admit 2 now.
TEST_F(MemdProcess, DhsctlPlanLiveAgreesWithWhatMemdAdmits) {
  const std::string topo = dir_ + "/topology.json";
  std::ofstream(topo) << R"({"payload_layers": 1, "index_producers": 1, "top_k": 32, "payload_row_bytes": 128,
    "index_key_bytes": 128, "page_rows": 16, "hot_rows": 64, "tail_rows": 16, "selections_per_token": 1,
    "rows_per_selection": 1, "drafter_window": 16, "k_max": 2, "draft_bytes_per_row": 64,
    "live_payload_layers": 1, "slots": 8, "speculation": false})";
  const std::string plan = "--json plan --file " + topo + " --context 100 --live";

  // Before any worker: nothing to plan against (exit 2, the message says why).
  auto [rc0, err0] = Dhsctl(plan, "", /*with_stderr=*/true);
  EXPECT_EQ(rc0, 2) << err0;
  EXPECT_NE(err0.find("no GPU registered"), std::string::npos) << err0;

  FakeWorker w0(run_dir_, 0);
  ASSERT_TRUE(w0.Hello(30, kPageBytes, 8).accepted);
  w0.Admit(1, 2, 8 * kPageRows, 6);
  auto m = w0.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  ASSERT_EQ(ReadAdmitGrant(*m)->optional_pages.size(), 6u);

  // Without --preset / --file the plan takes the worker's declared shape: this fake worker declares none (exit 2).
  auto [rc_shape, err_shape] = Dhsctl("plan --context 100 --live", "", /*with_stderr=*/true);
  EXPECT_EQ(rc_shape, 2) << err_shape;
  EXPECT_NE(err_shape.find("declared no shape"), std::string::npos) << err_shape;
  auto [rc_gpu, err_gpu] = Dhsctl("plan --context 100 --live --gpu 3", "", /*with_stderr=*/true);
  EXPECT_EQ(rc_gpu, 2) << err_gpu;
  EXPECT_NE(err_gpu.find("--gpu: GPU 3 is not registered"), std::string::npos) << err_gpu;

  auto [rc, out] = Dhsctl(plan);
  ASSERT_EQ(rc, 0) << out;
  const json j = json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["hierarchical_bytes_per_session"], 25600);  // the static plan is printed as without --live
  const json& live = j["live"];
  EXPECT_EQ(live["page_bytes"], 4096);
  EXPECT_EQ(live["gpu_page_bytes"], 2048);
  EXPECT_EQ(live["required_pages_per_session"], 12);
  EXPECT_EQ(live["speculation_pages_per_session"], 0);
  EXPECT_EQ(live["host_pages_per_session"], 7);
  ASSERT_EQ(live["gpus"].size(), 1u);
  EXPECT_EQ(live["gpus"][0]["available_pages"], 28);
  EXPECT_EQ(live["gpus"][0]["free_slots"], 7);
  EXPECT_EQ(live["gpus"][0]["sessions"], 2);
  EXPECT_EQ(live["host_available_pages"], 56);
  EXPECT_EQ(live["sessions_by_host"], 8);
  EXPECT_EQ(live["sessions_now"], 2);

  // Session 11: granted from the 22 lendable pages (10 left).
  w0.Admit(11, 12, 100, 0);
  m = w0.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  // Session 12: Δ = 12 - 10 = 2 <= a_1 = 6: request 1 is reclaimed (backup, readers done, retire), then 12 is granted.
  w0.Admit(12, 12, 100, 0);
  auto got = w0.NextN(2);
  ASSERT_TRUE(got.count(wire::Body::ReclaimOrder) && got.count(wire::Body::AdmitWait));
  const wire::ReclaimOrderT rc1 = *ReadReclaimOrder(got[wire::Body::ReclaimOrder]);
  EXPECT_EQ(rc1.request, 1u);
  wire::BackupCompleteT b;
  b.order = rc1.order;
  b.request = 1;
  b.gpu = 0;
  b.ok = true;  // pages empty: every backup of the order
  w0.Send(EncodeBackupComplete(b, w0.seq(), "worker"));
  wire::ReadersDoneT rd;
  rd.order = rc1.order;
  rd.request = 1;
  rd.gpu = 0;
  w0.Send(EncodeReadersDone(rd, w0.seq(), "worker"));
  got = w0.NextN(2);
  ASSERT_TRUE(got.count(wire::Body::Retire) && got.count(wire::Body::AdmitGrant));
  EXPECT_EQ(ReadAdmitGrant(got[wire::Body::AdmitGrant])->request, 12u);
  // Session 13: 4 lendable pages, nothing reclaimable: it waits (queued), as the plan said. (A population tick may
  // have ordered those pages back to request 1's history meanwhile: a_1 <= 4 then, still far from 12.)
  w0.Admit(13, 12, 100, 0);
  do {
    m = w0.Next();
  } while (m && m->type == wire::Body::PopulateOrder);
  ASSERT_TRUE(m && m->type == wire::Body::AdmitWait);
  const json status = DhsctlJson("status");
  EXPECT_EQ(status["gpus"][0]["queued"], 1);
  EXPECT_EQ(status["gpus"][0]["slots_used"], 3);  // requests 1, 11, 12

  // And now the live plan says 0: 4 lendable pages, the queued session takes 12 first.
  auto [rc2, out2] = Dhsctl(plan);
  ASSERT_EQ(rc2, 0) << out2;
  const json j2 = json::parse(out2, nullptr, false);
  EXPECT_EQ(j2["live"]["gpus"][0]["available_pages"], 0);
  EXPECT_EQ(j2["live"]["sessions_now"], 0);

  // A topology whose page is not memd's page is refused (exit 2), memd not running exits 1.
  auto [rc3, err3] = Dhsctl("plan --preset glm5-like --context 100 --live", "", /*with_stderr=*/true);
  EXPECT_EQ(rc3, 2) << err3;
  EXPECT_NE(err3.find("memd's page is 4096 bytes"), std::string::npos) << err3;
  EXPECT_EQ(Dhsctl(plan, dir_ + "/nothing").first, 1);
}

// Issue 12: two GPUs of 2.5M pages (an H200 at 55,296-byte pages). Every dhsctl view answers, bounded: `pages` shows
// 1000 rows unless --count (at most 65536), pages further on with --from, or runs of pages with --runs.
// The fake workers send no heartbeats: the worker timeout is 10 minutes, as the test takes longer than the default
// 3 s under ThreadSanitizer (tools/sanitize.sh tsan), and a fence would void the page tables it looks at.
class MemdAtScale : public MemdProcess {
 protected:
  MemdAtScale() { extra_args_ = {"--worker-timeout-ms", "600000"}; }
};

TEST_F(MemdAtScale, DhsctlPagesAtRealScale) {
  constexpr uint32_t kM = 2'500'000;
  FakeWorker w0(run_dir_, 0), w1(run_dir_, 1);
  ASSERT_TRUE(w0.Hello(kM).accepted);
  ASSERT_TRUE(w1.Hello(kM).accepted);
  const RequestId r5 = w1.Id(5);
  w1.Admit(r5, 3, 5 * kPageRows, 4);  // 3 required pages, 4 optional-ready (the 4 complete history pages)
  auto m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);

  json gpus = DhsctlJson("gpus");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[1]["M"], kM);
  EXPECT_EQ(gpus[1]["free"], kM - 7);
  auto [rc, table] = Dhsctl("pages 1");
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 1 + 1000 + 1) << table.substr(0, 200);
  EXPECT_TRUE(table.ends_with("... pages 1000..2499999 of GPU 1 not shown (M = 2500000): --from 1000 for the next "
                              "rows, --runs for runs of pages\n"))
      << table.substr(table.size() - 200);
  json runs = DhsctlJson("pages 1 --runs");
  EXPECT_EQ(runs["runs"], (json{{{"first", 0}, {"count", 3}, {"state", "required"}, {"owner", r5}},
                                {{"first", 3}, {"count", 4}, {"state", "optional-ready"}, {"owner", r5}},
                                {{"first", 7}, {"count", kM - 7}, {"state", "free"}, {"owner", nullptr}}}));
  EXPECT_TRUE(runs["next"].is_null());
  json last = DhsctlJson("pages 1 --from 2499999");
  ASSERT_EQ(last["pages"].size(), 1u);
  EXPECT_EQ(last["pages"][0]["page"], kM - 1);
  EXPECT_TRUE(last["next"].is_null());
  json most = DhsctlJson("pages 0 --count 65536");
  EXPECT_EQ(most["pages"].size(), 65536u);
  EXPECT_EQ(most["next"], 65536);
  auto [prc, past] = Dhsctl("pages 1 --from 2500000", "", /*with_stderr=*/true);
  EXPECT_EQ(prc, 4) << past;
  EXPECT_NE(past.find("OUT_OF_RANGE: pages: from 2500000 is beyond the last page 2499999 of GPU 1 (M = 2500000)"),
            std::string::npos)
      << past;
  EXPECT_EQ(Dhsctl("pages 1 --count 65537").first, 2);
  EXPECT_EQ(Dhsctl("pages 1 --count 0").first, 2);
  EXPECT_EQ(Dhsctl("pages 1 --from -1").first, 2);
  // A query sent with a count beyond the bound (dhsctl refuses it first) is INVALID_ARGUMENT from memd.
  FakeWorker client(run_dir_, 0, "dhsctl/1");
  wire::IntrospectQueryT q;
  q.what = wire::IntrospectWhat::Pages;
  q.gpu = 1;
  q.page_count = 65537;
  client.Send(EncodeIntrospectQuery(q, client.seq(), "dhsctl"));
  auto reply = client.Next();
  ASSERT_TRUE(reply && reply->type == wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorStatus(*reply).code(), absl::StatusCode::kInvalidArgument);
  auto [src, status] = Dhsctl("status");
  EXPECT_EQ(src, 0);
  EXPECT_NE(status.find("0    2500000"), std::string::npos) << status;
}

TEST_F(MemdProcess, DhsctlViewsAndErrors) {
  FakeWorker w(run_dir_, 3);
  ASSERT_TRUE(w.Hello(16).accepted);
  const RequestId r77 = w.Id(77), r78 = w.Id(78);
  const std::string id77 = std::to_string(r77), id78 = std::to_string(r78);
  w.Admit(r77, 3, 5 * kPageRows, 4);
  auto m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);

  auto [rc, text] = Dhsctl("status");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(text.find("policy largest-first, 1 requests"), std::string::npos) << text;  // the default
  json gpus = DhsctlJson("gpus");
  ASSERT_EQ(gpus.size(), 1u);
  EXPECT_EQ(gpus[0]["gpu"], 3);
  EXPECT_EQ(gpus[0]["M"], 16);
  EXPECT_EQ(gpus[0]["M_req"], 3);
  EXPECT_EQ(gpus[0]["M_opt"], 4);
  EXPECT_EQ(gpus[0]["free"], 9);
  json r = DhsctlJson("request " + id77);
  EXPECT_EQ(r["a_r"], 4);
  EXPECT_EQ(r["host_coverage"], "1/5");
  EXPECT_EQ(r["slot"], 0);
  json pages = DhsctlJson("pages 3");
  ASSERT_EQ(pages["pages"].size(), 16u);
  int owned = 0;
  for (const json& p : pages["pages"]) owned += p["owner"] == r77;
  EXPECT_EQ(owned, 7);
  // A request or GPU memd does not know: memd answers NOT_FOUND -> exit 4 (docs/operations.md), an {"error": ...}
  // document on stdout with --json, the message on stderr.
  {
    auto [jrc, jout] = Dhsctl("--json request " + id78);
    EXPECT_EQ(jrc, 4) << jout;
    EXPECT_EQ(json::parse(jout, nullptr, false).value("error", ""), "request " + id78 + " not found") << jout;
    auto [trc, tout] = Dhsctl("request " + id78);
    EXPECT_EQ(trc, 4);
    EXPECT_EQ(tout, "");  // nothing on stdout
    auto [erc, err] = Dhsctl("request " + id78, "", /*with_stderr=*/true);
    EXPECT_EQ(erc, 4);
    EXPECT_NE(err.find("NOT_FOUND: request " + id78 + " not found"), std::string::npos) << err;
    auto [prc, perr] = Dhsctl("pages 9", "", /*with_stderr=*/true);
    EXPECT_EQ(prc, 4);
    EXPECT_NE(perr.find("NOT_FOUND: GPU 9 not found"), std::string::npos) << perr;
    EXPECT_EQ(Dhsctl("pages 9").first, 4);
    EXPECT_EQ(Dhsctl("--json pages 9").first, 4);
    EXPECT_EQ(Dhsctl("request " + id77).first, 0);  // a known one still exits 0
  }
  // Bad command lines exit 2 and name the problem.
  {
    auto [rc1, neg] = Dhsctl("request -1", "", true);
    EXPECT_EQ(rc1, 2);
    EXPECT_NE(neg.find("request ID must be a non-negative integer, got '-1'"), std::string::npos) << neg;
    EXPECT_EQ(Dhsctl("pages -3").first, 2);
    // A number beyond the id's type used to saturate to 2^64-1 (asked for, exit 4): exit 2, naming the word.
    auto [rc5, big] = Dhsctl("request 99999999999999999999999", "", true);
    EXPECT_EQ(rc5, 2) << big;
    EXPECT_NE(big.find("request ID must be at most 18446744073709551615, got '99999999999999999999999'"),
              std::string::npos)
        << big;
    auto [rc6, gpu] = Dhsctl("pages 4294967296", "", true);
    EXPECT_EQ(rc6, 2) << gpu;
    EXPECT_NE(gpu.find("GPU must be at most 4294967295, got '4294967296'"), std::string::npos) << gpu;
    // An empty run directory used to look for /memd.sock (exit 1): exit 2.
    auto [rc7, empty] = CaptureShell(std::string(DHSCTL_BIN) + " --run-dir '' status 2>&1");
    EXPECT_EQ(rc7, 2) << empty;
    EXPECT_NE(empty.find("empty run directory"), std::string::npos) << empty;
    auto [rc2, bogus] = Dhsctl("bogus", "", true);
    EXPECT_EQ(rc2, 2);
    EXPECT_NE(bogus.find("unknown command 'bogus'"), std::string::npos) << bogus;
    auto [rc3, interval] = Dhsctl("watch --interval 0", "", true);
    EXPECT_EQ(rc3, 2);
    EXPECT_NE(interval.find("--interval must be a number of seconds in (0, 86400], got 0"), std::string::npos)
        << interval;
    EXPECT_LT(interval.size(), 300u) << interval;  // no 300-digit range bound
    EXPECT_EQ(Dhsctl("watch --count -1").first, 2);
    auto [rc4, timeout] = Dhsctl("--timeout-ms -5 status", "", true);
    EXPECT_EQ(rc4, 2);
    EXPECT_NE(timeout.find("--timeout-ms"), std::string::npos) << timeout;
    EXPECT_EQ(Dhsctl("--timeout-ms 0 status").first, 2);
  }
  EXPECT_EQ(DhsctlJson("queue").is_null(), false);
  {  // the global options may follow the command too (docs/protocol.md writes `dhsctl events [--json]`)
    auto [rc, out] = Dhsctl("status --json --timeout-ms 2000");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(json::parse(out, nullptr, false).is_object(), true) << out;
  }
  auto [wrc, watch] = Dhsctl("watch --interval 0.05 --count 2 gpus");
  EXPECT_EQ(wrc, 0);
  size_t headers = 0;
  for (size_t at = 0; (at = watch.find("M_req", at)) != std::string::npos; ++at) ++headers;
  EXPECT_EQ(headers, 2u) << watch;
  EXPECT_EQ(Dhsctl("frobnicate").first, 2);  // usage error

  // No memd in this run dir: exit code 1 at once, never a hang.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Dhsctl("status", dir_ + "/nothing").first, 1);
  // A hung memd (SIGSTOPped): no answer within the timeout -> exit code 3.
  kill(pid_, SIGSTOP);
  EXPECT_EQ(Dhsctl("--timeout-ms 300 status").first, 3);
  kill(pid_, SIGCONT);
  // A socket file without a live memd (SIGKILLed): nothing listens -> exit code 1 at once, named.
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  auto [stale_rc, stale_out] = Dhsctl("--timeout-ms 300 status", "", /*with_stderr=*/true);
  EXPECT_EQ(stale_rc, 1);
  EXPECT_NE(stale_out.find("nothing listens on " + run_dir_ + "/memd.sock"), std::string::npos) << stale_out;
  EXPECT_EQ(Dhsctl("--timeout-ms -5 status").first, 2);  // refused before connecting: never waits forever
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  RemoveSegmentOf(run_dir_);
  pid_ = -1;
}

}  // namespace
}  // namespace dhs

namespace dhs {
namespace {

// Liveness and fencing (issue 11) with fake workers: a short worker timeout, ZMTP heartbeats off (the fake workers'
// connections stay up), so the silence of a worker is the only cause of its fence in the first test.
class MemdFence : public MemdProcess {
 protected:
  MemdFence() { extra_args_ = {"--worker-timeout-ms", "2000"}; }

  // Polls `dhsctl --json gpus` until GPU `gpu` shows `up` (each poll is one dhsctl run, no sleep in between).
  json WaitGpu(GpuId gpu, bool up) {
    json g;
    for (int i = 0; i < 400; ++i) {
      for (const json& e : DhsctlJson("gpus")) {
        if (e["gpu"] == gpu) g = e;
      }
      if (!g.is_null() && g["up"] == up) return g;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "GPU " << gpu << " never became " << (up ? "up" : "fenced") << ": " << g.dump();
    return g;
  }
};

// A worker that sends nothing for the timeout is fenced: its granted request is interrupted and keeps exactly the
// host page whose write it confirmed (history page 0 of 3), its queued admission is dropped, its pages and slot are
// gone; its late messages are refused FAILED_PRECONDITION "fenced"; a new Hello is epoch 2 and lists the request,
// and Complete of it frees the host page. The other worker (heartbeating) stays up throughout.
TEST_F(MemdFence, SilentWorkerIsFencedAndReRegistersAsANewEpoch) {
  FakeWorker w(run_dir_, 0);
  FakeWorker alive(run_dir_, 1);
  ASSERT_TRUE(w.Hello(8).accepted);
  const wire::HelloReplyT first = alive.Hello(8);
  ASSERT_TRUE(first.accepted);
  EXPECT_EQ(first.worker_epoch, 1u);
  w.Admit(7, 2, 3 * kPageRows, 0);  // context 3 pages: host pages assigned at the grant
  auto m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  const wire::AdmitGrantT grant = *ReadAdmitGrant(*m);
  ASSERT_EQ(grant.backup_host_pages.size(), 3u);
  wire::HostCopyWrittenT written;
  written.request = 7;
  written.history_pages = {0};
  written.host_pages = {grant.backup_host_pages[0]};
  written.ok = true;
  w.Send(EncodeHostCopyWritten(written, w.seq(), "worker"));
  w.Admit(8, 7, kPageRows, 0);  // 2 + 7 > 8: queued
  m = w.NextOf(wire::Body::AdmitWait);  // (memd's tick may send an order for the written page first)
  ASSERT_TRUE(m.has_value());

  const auto silent_from = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  std::atomic<int> acks{0};
  std::thread heartbeats([&] {  // `alive` heartbeats every 100 ms, as workerd does every second
    while (!stop) {
      wire::HeartbeatT hb;
      hb.gpu = 1;
      alive.Send(EncodeHeartbeat(hb, alive.seq(), "worker"));
      auto ack = alive.Next();
      acks += ack && ack->type == wire::Body::HeartbeatAck;
      std::this_thread::sleep_for(100ms);
    }
  });
  struct Join {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Join() { stop = true; t.join(); }
  } join{stop, heartbeats};
  json g0 = WaitGpu(0, false);
  const double fenced_after_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - silent_from).count();
  std::printf("GPU 0 fenced %.3f s after its worker fell silent (worker timeout 2 s)\n", fenced_after_s);
  ASSERT_EQ(g0["up"], false) << g0.dump();
  EXPECT_EQ(g0["epoch"], 1);
  EXPECT_GE(fenced_after_s, 2.0);
  for (const json& e : DhsctlJson("gpus")) {
    if (e["gpu"] == 1) {
      EXPECT_EQ(e["up"], true) << e.dump();
    }
  }
  json req = DhsctlJson("request 7");
  EXPECT_EQ(req["state"], "interrupted") << req.dump();
  EXPECT_EQ(req["host_pages"], 1);
  EXPECT_TRUE(req["slot"].is_null());
  EXPECT_EQ(DhsctlJson("status")["host"]["allocated"], 1);
  EXPECT_EQ(DhsctlJson("status")["host"]["pinned"], 0);
  EXPECT_EQ(Dhsctl("request 8").first, 4) << "the queued admission of the fenced GPU is gone";
  const auto [pages_rc, pages_out] = Dhsctl("pages 0", "", /*with_stderr=*/true);
  EXPECT_EQ(pages_rc, 4);
  EXPECT_NE(pages_out.find("GPU 0 is fenced"), std::string::npos) << pages_out;
  const std::string metrics = MetricsWith("dhs_memd_gpu_up{gpu=\"0\"} 0\n");
  EXPECT_NE(metrics.find("dhs_memd_gpu_up{gpu=\"1\"} 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dhs_memd_workers_lost_total 1\n"), std::string::npos) << metrics;

  // The fenced worker's late messages: refused, nothing changes.
  written.history_pages = {1};
  written.host_pages = {grant.backup_host_pages[1]};
  w.Send(EncodeHostCopyWritten(written, w.seq(), "worker"));
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply);
  EXPECT_EQ(ReadErrorReply(*m)->code, wire::ErrorCode::FAILED_PRECONDITION);
  EXPECT_EQ(ReadErrorReply(*m)->message.rfind("fenced: ", 0), 0u) << ReadErrorReply(*m)->message;
  EXPECT_EQ(ReadErrorReply(*m)->reason, wire::ErrorReason::FENCED) << "the fence is told by its code (issue 23)";
  EXPECT_EQ(DhsctlJson("request 7")["host_pages"], 1);
  // Why it was fenced: the core's FenceReason (the daemon keeps no copy of "fenced").
  EXPECT_NE(ReadErrorReply(*m)->message.find("no message for"), std::string::npos) << ReadErrorReply(*m)->message;

  // A new Hello: epoch 2, the interrupted request listed; Complete ends it and frees its host page.
  const wire::HelloReplyT again = w.Hello(8);
  ASSERT_TRUE(again.accepted) << again.reason;
  EXPECT_EQ(again.worker_epoch, 2u);
  EXPECT_EQ(again.interrupted_requests, (std::vector<uint64_t>{7}));
  EXPECT_EQ(WaitGpu(0, true)["free"], 8);
  wire::CompleteT c;
  c.request = 7;
  w.Send(EncodeComplete(c, w.seq(), "worker"));
  m = w.Next();
  ASSERT_TRUE(m && m->type == wire::Body::CompleteAck);
  EXPECT_EQ(ReadCompleteAck(*m)->released_pages, 0u);
  EXPECT_EQ(DhsctlJson("status")["host"]["allocated"], 0);
  stop = true;
  for (const json& e : DhsctlJson("gpus")) {
    if (e["gpu"] == 1) {
      EXPECT_EQ(e["up"], true) << "a heartbeating worker was fenced: " << e.dump();
    }
  }
  EXPECT_GT(acks.load(), 0);
}

// Issue 12 / 11: an order memd cannot deliver fences its GPU (Daemon::SendToGpu), it is never dropped silently. The
// worker of GPU 0 is a raw DEALER with a receive queue of 1 message and a 4 KiB socket buffer that stops reading after
// its HelloReply and first grant; it then sends Admit + Complete pairs (blocking sends: memd reads them all), each of
// which makes memd send an AdmitGrant (an order) and a CompleteAck, until memd's queue to it is full (ZeroMQ's
// SNDHWM of 1000 messages plus the kernel's buffer) and an AdmitGrant cannot be queued. ZMTP heartbeats are off and
// the worker timeout is a minute, so the failed send is the only thing that can fence the GPU here. Then: GPU 0
// fenced (epoch 1), exactly one failed send counted, request 1 interrupted keeping its confirmed host page, the
// request whose grant failed interrupted too; GPU 1's worker still served; the next Hello lists both.
class MemdSendFailure : public MemdProcess {
 protected:
  MemdSendFailure() { extra_args_ = {"--worker-timeout-ms", "60000"}; }
  // Is GPU `gpu` fenced (dhsctl gpus)?
  bool Fenced(GpuId gpu) {
    bool fenced = false;
    for (const json& g : DhsctlJson("gpus")) fenced |= g["gpu"] == gpu && g["up"] == false;
    return fenced;
  }
};

// The worker of GPU 0 as a raw DEALER with a receive queue of 1 message and a 4 KiB socket buffer: once it stops
// reading, memd's queue to it fills. Sends block (memd reads everything); `Hello` registers GPU 0 with M = 8.
class StuckWorker {
 public:
  explicit StuckWorker(const std::string& run_dir) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::routing_id, "worker/0");
    socket_.set(zmq::sockopt::rcvhwm, 1);
    socket_.set(zmq::sockopt::rcvbuf, 4096);
    socket_.set(zmq::sockopt::rcvtimeo, 3000);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(IpcEndpoint(run_dir, "memd"));
  }
  void Send(const std::string& bytes) { socket_.send(zmq::buffer(bytes), zmq::send_flags::none); }
  std::optional<Message> Receive() {
    zmq::message_t msg;
    if (!socket_.recv(msg)) return std::nullopt;
    received_.push_back(msg.to_string());  // a copy: a zmq frame's bytes need not be aligned for FlatBuffers (UBSan)
    auto m = DecodeEnvelope(received_.back());
    if (!m.ok()) return std::nullopt;
    return *m;
  }
  bool Hello() {
    Send(EncodeHello(MakeTestHello(0, "stuck", 8, kPageBytes, 4), seq_++, "worker"));
    auto reply = Receive();
    return reply && reply->type == wire::Body::HelloReply && ReadHelloReply(*reply)->accepted;
  }
  uint64_t seq() { return seq_++; }
  void Close() { socket_.close(); }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
  std::deque<std::string> received_;
  uint64_t seq_ = 1;
};

// Issue 12: a reply memd cannot deliver to a live worker fences its GPU like an undeliverable order
// (Daemon::ReplyNotDelivered): a lost HelloReply / CompleteAck / ErrorReply breaks the conversation as much as a lost
// order. The stuck worker sends only Heartbeats, whose HeartbeatAck is a reply (no order is ever sent to it), until
// memd's queue to it is full. The worker timeout is a minute and ZMTP heartbeats are off, so nothing but the failed
// reply can fence GPU 0. Then: GPU 0 fenced (epoch 1), one failed send counted, its request interrupted; GPU 1
// served. Before the fix the reply was dropped with a warning and GPU 0 stayed up for good.
TEST_F(MemdSendFailure, AReplyThatCannotBeDeliveredFencesTheGpu) {
  FakeWorker w1(run_dir_, 1);
  ASSERT_TRUE(w1.Hello(8).accepted);
  StuckWorker stuck(run_dir_);
  ASSERT_TRUE(stuck.Hello());
  wire::AdmitRequestT a;
  a.request = MakeNodeRequestId(0, 1, 1);
  a.gpu = 0;
  a.required_pages = 1;
  a.history_rows = kPageRows;
  stuck.Send(EncodeAdmitRequest(a, stuck.seq(), "worker"));
  auto grant = stuck.Receive();
  ASSERT_TRUE(grant && grant->type == wire::Body::AdmitGrant);

  uint64_t beats = 0;
  bool fenced = false;
  for (; beats < 400000 && !fenced; ++beats) {
    wire::HeartbeatT hb;
    hb.sender_time_ns = beats;
    stuck.Send(EncodeHeartbeat(hb, stuck.seq(), "worker"));
    if (beats % 512 == 511) fenced = Fenced(0);
  }
  ASSERT_TRUE(fenced) << "a worker that reads nothing was not fenced after " << beats << " heartbeats";
  std::printf("GPU 0 fenced after at most %llu heartbeats whose acks it did not read\n",
              static_cast<unsigned long long>(beats));
  const std::string metrics = MetricsWith("dhs_memd_send_failures_total 1");
  EXPECT_NE(metrics.find("dhs_memd_send_failures_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dhs_memd_workers_lost_total 1\n"), std::string::npos) << metrics;
  EXPECT_EQ(DhsctlJson("request " + std::to_string(a.request))["state"], "interrupted");
  w1.Admit(w1.Id(1), 1, kPageRows, 0);
  auto m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  EXPECT_FALSE(Fenced(1));
}

// Issue 12 / 11: an order memd cannot deliver fences its GPU (Daemon::SendToGpu), it is never dropped silently. The
// stuck worker of GPU 0 (4 slots, M = 8) stops reading after its HelloReply and first grant; it then sends only
// AdmitRequests (1 page each), which get no reply: the next 3 are granted (AdmitGrant orders) and every later one waits
// for a slot (an AdmitWait order each), until memd's queue to it is full (ZeroMQ's SNDHWM of 1000 messages plus the
// kernel's buffer) and an order cannot be queued. ZMTP heartbeats are off and the worker timeout is a minute, so the
// failed order is the only thing that can fence the GPU here. Then: GPU 0 fenced (epoch 1), exactly one failed send
// counted, the 4 admitted requests interrupted (request 1 keeping its confirmed host page), the waiting ones dropped;
// GPU 1's worker still served; the next Hello lists exactly the 4 admitted ones.
TEST_F(MemdSendFailure, AnOrderThatCannotBeDeliveredFencesTheGpu) {
  FakeWorker w1(run_dir_, 1);
  ASSERT_TRUE(w1.Hello(8).accepted);
  StuckWorker stuck(run_dir_);
  ASSERT_TRUE(stuck.Hello());
  auto admit = [&](RequestId r, uint32_t required, uint64_t rows) {
    wire::AdmitRequestT a;
    a.request = r;
    a.gpu = 0;
    a.required_pages = required;
    a.history_rows = rows;
    stuck.Send(EncodeAdmitRequest(a, stuck.seq(), "worker"));
  };
  const RequestId r1 = MakeNodeRequestId(0, 1, 1);
  admit(r1, 2, 3 * kPageRows);
  auto grant_message = stuck.Receive();
  ASSERT_TRUE(grant_message && grant_message->type == wire::Body::AdmitGrant);
  const wire::AdmitGrantT grant = *ReadAdmitGrant(*grant_message);
  wire::HostCopyWrittenT written;  // history page 0 is on host: a fence keeps exactly that host page
  written.request = r1;
  written.history_pages = {0};
  written.host_pages = {grant.backup_host_pages[0]};
  written.ok = true;
  stuck.Send(EncodeHostCopyWritten(written, stuck.seq(), "worker"));

  // The flood: from now on the worker reads nothing.
  uint64_t admits = 0;
  bool fenced = false;
  for (uint64_t n = 2; n < 400000 && !fenced; ++n) {
    admit(MakeNodeRequestId(0, 1, n), 1, kPageRows);
    // Is GPU 0 fenced yet? (memd read the admits before dhsctl's query or after: either way the loop goes on until
    // it is)
    if (++admits % 512 == 0) fenced = Fenced(0);
  }
  ASSERT_TRUE(fenced) << "memd's queue to a worker that reads nothing never filled in " << admits << " admissions";
  std::printf("GPU 0 fenced after at most %llu admissions to a worker that reads nothing\n",
              static_cast<unsigned long long>(admits));
  json g0;
  for (const json& g : DhsctlJson("gpus")) {
    if (g["gpu"] == 0) g0 = g;
    if (g["gpu"] == 1) {
      EXPECT_EQ(g["up"], true) << g.dump();
    }
  }
  EXPECT_EQ(g0["epoch"], 1) << g0.dump();
  const std::string failures = MetricsWith("dhs_memd_send_failures_total 1");
  EXPECT_NE(failures.find("dhs_memd_send_failures_total 1\n"), std::string::npos) << failures;
  EXPECT_NE(failures.find("dhs_memd_workers_lost_total 1\n"), std::string::npos) << failures;
  const json req1 = DhsctlJson("request " + std::to_string(r1));
  EXPECT_EQ(req1["state"], "interrupted") << req1.dump();
  EXPECT_EQ(req1["host_pages"], 1);
  // GPU 1's worker is still served.
  w1.Admit(w1.Id(1), 1, kPageRows, 0);
  auto m = w1.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);

  // The next worker of GPU 0 (a new connection under the same routing id) learns the 4 requests that held its slots:
  // memd had granted them, they were not silently forgotten; the waiting ones were never admitted.
  stuck.Close();
  FakeWorker w0(run_dir_, 0);
  const wire::HelloReplyT again = w0.Hello(8);
  ASSERT_TRUE(again.accepted) << again.reason;
  EXPECT_EQ(again.worker_epoch, 2u);
  std::vector<RequestId> interrupted = again.interrupted_requests;
  std::sort(interrupted.begin(), interrupted.end());
  EXPECT_EQ(interrupted, (std::vector<RequestId>{r1, MakeNodeRequestId(0, 1, 2), MakeNodeRequestId(0, 1, 3),
                                                 MakeNodeRequestId(0, 1, 4)}));
}

// A worker whose connection closes is fenced by the socket monitor at once: the worker timeout is a minute here, so
// nothing else can fence it. A Hello while a GPU is up (a restarted worker that came back first) fences the
// previous epoch itself.
class MemdFenceOnDisconnect : public MemdFence {
 protected:
  MemdFenceOnDisconnect() { extra_args_ = {"--worker-timeout-ms", "60000"}; }
};

TEST_F(MemdFenceOnDisconnect, ClosedConnectionAndANewHelloFenceTheGpu) {
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(w->Hello(8).accepted);
  w->Admit(3, 2, 2 * kPageRows, 0);
  auto m = w->Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  const auto closed_at = std::chrono::steady_clock::now();
  w.reset();  // closes its socket (what the kernel does for a killed process)
  json g0 = WaitGpu(0, false);
  std::printf("GPU 0 fenced %.3f s after its connection closed\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - closed_at).count());
  EXPECT_EQ(g0["epoch"], 1);
  EXPECT_EQ(DhsctlJson("request 3")["state"], "interrupted");
  EXPECT_EQ(DhsctlJson("status")["host"]["allocated"], 0);  // nothing confirmed: nothing kept

  FakeWorker w2(run_dir_, 0);
  wire::HelloReplyT r = w2.Hello(8);
  ASSERT_TRUE(r.accepted) << r.reason;
  EXPECT_EQ(r.worker_epoch, 2u);
  EXPECT_EQ(r.interrupted_requests, (std::vector<uint64_t>{3}));
  w2.Admit(4, 2, kPageRows, 0);
  m = w2.Next();
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  FakeWorker w3(run_dir_, 0);  // a restart that says Hello before memd noticed anything: epoch 3 fences epoch 2
  r = w3.Hello(8);
  ASSERT_TRUE(r.accepted) << r.reason;
  EXPECT_EQ(r.worker_epoch, 3u);
  EXPECT_EQ(r.interrupted_requests, (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(DhsctlJson("request 4")["state"], "interrupted");
  EXPECT_EQ(WaitGpu(0, true)["free"], 8);
}

// A worker whose declared shape the planner refuses (k = 0 here): `plan --live` without --preset / --file exits 2 and
// says the field came from the worker's Hello, not from the command line.
TEST_F(MemdFenceOnDisconnect, DhsctlPlanLiveSaysABadFieldIsTheWorkersShape) {
  FakeWorker w(run_dir_, 0);
  wire::HelloT h = MakeTestHello(0, "fake", 8, kPageBytes, 4);
  h.serving_mode = "adaptive";
  h.sources.push_back(std::make_unique<wire::SourceInfoT>());  // L_pay 1: d_KV = 4096 / 16
  h.index_producers = 1;
  h.index_key_bytes = 0;
  h.top_k = 0;
  h.hot_rows = 64;
  h.tail_rows = 16;
  h.fetched_rows_per_token = 1;
  w.Send(EncodeHello(h, w.seq(), "worker"));
  auto m = w.NextOf(wire::Body::HelloReply);
  ASSERT_TRUE(m && ReadHelloReply(*m)->accepted);
  auto [rc, err] = Dhsctl("plan --context 100 --live", "", /*with_stderr=*/true);
  EXPECT_EQ(rc, 2) << err;
  EXPECT_NE(err.find("top_k: must be >= 1 (the topology is the shape GPU 0's worker declared in its Hello"), std::string::npos)
      << err;
}

// `dhsctl plan --live` against a fenced GPU (its worker's connection closed, as for a SIGKILLed worker): memd's status
// still lists the GPU (and its last worker's shape) but it admits nothing; the plan says the GPU is fenced rather than
// "not registered", with and without --gpu (exit 2 both).
TEST_F(MemdFenceOnDisconnect, DhsctlPlanLiveNamesAFencedGpu) {
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(w->Hello(8).accepted);
  w.reset();
  WaitGpu(0, false);
  auto [rc, err] = Dhsctl("plan --context 100 --live --gpu 0", "", /*with_stderr=*/true);
  EXPECT_EQ(rc, 2) << err;
  EXPECT_NE(err.find("--gpu: GPU 0 is fenced (its worker exited or stopped answering"), std::string::npos) << err;
  EXPECT_NE(err.find("live GPUs: none"), std::string::npos) << err;
  auto [rc_all, err_all] = Dhsctl("plan --context 100 --live", "", /*with_stderr=*/true);
  EXPECT_EQ(rc_all, 2) << err_all;
  EXPECT_NE(err_all.find("memd has no live GPU: fenced 0"), std::string::npos) << err_all;
  FakeWorker w1(run_dir_, 1);
  ASSERT_TRUE(w1.Hello(8).accepted);
  auto [rc_other, err_other] = Dhsctl("plan --context 100 --live --gpu 2", "", /*with_stderr=*/true);
  EXPECT_EQ(rc_other, 2) << err_other;
  EXPECT_NE(err_other.find("GPU 2 is not registered with memd (live GPUs: 1; fenced: 0)"), std::string::npos)
      << err_other;
}

// Request records (issue 11, resume; memd/request_records.h): AdmitRequest.record opens one, TokensCommitted grows it
// (a gap is refused with an ErrorReply, a resent overlap accepted), an oversize record refuses the admission, and a
// Complete releases it; the next epoch's HelloReply carries the records of the interrupted requests, tokens included.
TEST_F(MemdFenceOnDisconnect, RequestRecordsAreCommittedAndHandedToTheNextEpoch) {
  auto record = [](RequestId id, RequestId client, size_t prompt) {
    auto r = std::make_unique<wire::RequestRecordT>();
    r->request = id;
    r->client_request = client;
    r->prompt.assign(prompt, 3);
    r->max_new_tokens = 4;
    r->temperature = 0.5f;
    r->seed = 9;
    return r;
  };
  auto admit = [&](FakeWorker& w, RequestId id, size_t prompt) {
    wire::AdmitRequestT a;
    a.request = id;
    a.gpu = 0;
    a.required_pages = 2;
    a.history_rows = kPageRows;
    a.record = record(id, id + 10, prompt);
    w.Send(EncodeAdmitRequest(a, w.seq(), "worker"));
    return w.Next();
  };
  auto commit = [](FakeWorker& w, RequestId id, uint32_t from, std::vector<uint8_t> tokens) {
    wire::TokensCommittedT t;
    t.gpu = 0;
    auto e = std::make_unique<wire::CommittedTokensT>();
    e->request = id;
    e->from = from;
    for (uint8_t v : tokens) e->logits_digests.push_back(v * 10);
    e->tokens = std::move(tokens);
    t.entries.push_back(std::move(e));
    w.Send(EncodeTokensCommitted(t, w.seq(), "worker"));
  };
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(w->Hello(8).accepted);
  auto m = admit(*w, 1, 5);
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  commit(*w, 1, 0, {7, 8});
  m = w->Next();
  ASSERT_TRUE(m && m->type == wire::Body::TokensCommittedAck);
  EXPECT_EQ(ReadTokensCommittedAck(*m)->entries, 1u);
  commit(*w, 1, 1, {8});  // resent: accepted, nothing twice
  m = w->Next();
  ASSERT_TRUE(m && m->type == wire::Body::TokensCommittedAck);
  commit(*w, 1, 3, {9});  // a gap: refused
  m = w->Next();
  ASSERT_TRUE(m && m->type == wire::Body::ErrorReply);
  auto err = ReadErrorReply(*m);
  EXPECT_EQ(err->code, wire::ErrorCode::INVALID_ARGUMENT);
  EXPECT_NE(err->message.find("only 2 are"), std::string::npos) << err->message;
  m = admit(*w, 2, size_t{5} << 20);  // 5 MiB of prompt: over the 4 MiB record limit
  ASSERT_TRUE(m && m->type == wire::Body::AdmitReject);
  auto reject = ReadAdmitReject(*m);
  EXPECT_EQ(reject->code, wire::ErrorCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(reject->reason.find("per-record limit"), std::string::npos) << reject->reason;
  EXPECT_EQ(Dhsctl("--json request 2").first, 4);  // NOT_FOUND: nothing admitted
  m = admit(*w, 3, 5);
  ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant);
  commit(*w, 3, 0, {1});
  m = w->Next();
  ASSERT_TRUE(m && m->type == wire::Body::TokensCommittedAck);
  wire::CompleteT c;
  c.request = 3;
  c.gpu = 0;
  w->Send(EncodeComplete(c, w->seq(), "worker"));
  m = w->Next();
  ASSERT_TRUE(m && m->type == wire::Body::CompleteAck);
  w.reset();  // the worker dies: request 1 is interrupted and keeps its record
  WaitGpu(0, false);
  FakeWorker w2(run_dir_, 0);
  wire::HelloReplyT r = w2.Hello(8);
  ASSERT_TRUE(r.accepted) << r.reason;
  EXPECT_EQ(r.interrupted_requests, (std::vector<uint64_t>{1}));
  ASSERT_EQ(r.interrupted_records.size(), 1u);
  const wire::RequestRecordT& got = *r.interrupted_records[0];
  EXPECT_EQ(got.request, 1u);
  EXPECT_EQ(got.client_request, 11u);
  EXPECT_EQ(got.prompt, std::vector<uint8_t>(5, 3));
  EXPECT_EQ(got.max_new_tokens, 4u);
  EXPECT_EQ(got.temperature, 0.5f);
  EXPECT_EQ(got.seed, 9u);
  EXPECT_EQ(got.tokens, (std::vector<uint8_t>{7, 8}));
  EXPECT_EQ(got.logits_digests, (std::vector<uint64_t>{70, 80}));
}

// Lost ends (workerd/README.md "Restart: a finished request's end"): a Complete with keep_output completes the record
// with its output tokens and memd hands it, without its input, to every next epoch's worker (finished_records, not an
// interrupted request); a Complete without it, or one whose output lacks tokens, keeps nothing.
TEST_F(MemdFenceOnDisconnect, FinishedRecordsAreHandedToEveryNextEpoch) {
  auto admit = [](FakeWorker& w, RequestId id) {
    wire::AdmitRequestT a = RecordedAdmit(id, kPageRows);
    a.required_pages = 2;
    a.record->client_request = id + 10;
    a.record->client = 99;
    a.record->prompt.assign(5, 3);
    a.record->hash_ids = {4};
    w.Send(EncodeAdmitRequest(a, w.seq(), "worker"));
    return w.Next();
  };
  auto complete = [](FakeWorker& w, RequestId id, bool keep, std::vector<uint8_t> tokens) {
    wire::CompleteT c;
    c.request = id;
    c.gpu = 0;
    c.keep_output = keep;
    for (uint8_t v : tokens) c.output_digests.push_back(v * 10);
    c.output_tokens = std::move(tokens);
    w.Send(EncodeComplete(c, w.seq(), "worker"));
    return w.Next();
  };
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(w->Hello(8).accepted);
  for (RequestId id : {1, 2, 3}) {
    auto m = admit(*w, id);
    ASSERT_TRUE(m && m->type == wire::Body::AdmitGrant) << id;
  }
  wire::TokensCommittedT t;  // request 1's first two tokens committed; its Complete brings all four
  t.gpu = 0;
  auto e = std::make_unique<wire::CommittedTokensT>();
  e->request = 1;
  e->tokens = {7, 8};
  e->logits_digests = {70, 80};
  t.entries.push_back(std::move(e));
  w->Send(EncodeTokensCommitted(t, w->seq(), "worker"));
  auto m = w->Next();
  ASSERT_TRUE(m && m->type == wire::Body::TokensCommittedAck);
  // `dhsctl request N` shows the tokens each record holds: 2 committed, none yet (a request without a record: null).
  EXPECT_EQ(DhsctlJson("request 1")["record_tokens"], 2);
  EXPECT_EQ(DhsctlJson("request 2")["record_tokens"], 0);
  m = complete(*w, 1, true, {7, 8, 9, 6});
  ASSERT_TRUE(m && m->type == wire::Body::CompleteAck);
  m = complete(*w, 2, true, {1, 2, 3});  // 3 of 4 tokens: not finished, nothing kept (the Complete still acked)
  ASSERT_TRUE(m && m->type == wire::Body::CompleteAck);
  m = complete(*w, 3, false, {});
  ASSERT_TRUE(m && m->type == wire::Body::CompleteAck);
  for (int epoch = 2; epoch <= 3; ++epoch) {  // handed to the next worker, and again to the one after it
    w.reset();
    WaitGpu(0, false);
    w = std::make_unique<FakeWorker>(run_dir_, 0);
    wire::HelloReplyT r = w->Hello(8);
    ASSERT_TRUE(r.accepted) << r.reason;
    EXPECT_TRUE(r.interrupted_requests.empty()) << epoch;
    EXPECT_TRUE(r.interrupted_records.empty()) << epoch;
    ASSERT_EQ(r.finished_records.size(), 1u) << epoch;
    const wire::RequestRecordT& got = *r.finished_records[0];
    EXPECT_EQ(got.request, 1u);
    EXPECT_EQ(got.client_request, 11u);
    EXPECT_EQ(got.client, 99u);
    EXPECT_TRUE(got.prompt.empty());
    EXPECT_TRUE(got.hash_ids.empty());
    EXPECT_EQ(got.max_new_tokens, 4u);
    EXPECT_EQ(got.tokens, (std::vector<uint8_t>{7, 8, 9, 6}));
    EXPECT_EQ(got.logits_digests, (std::vector<uint64_t>{70, 80, 90, 60}));
  }
}
}  // namespace
}  // namespace dhs

namespace dhs {
namespace {

// A memd killed with SIGKILL leaves its host pool in /dev/shm for the next memd of its run directory; a memd removes
// at start the segments nobody will use again (issue 11: segments of dead memds do not pile up): a "dhs-pool-*" one
// whose run directory no longer exists, and the "dhs-memd-<pid>" ones of memds before the run-directory naming whose
// pid is gone or runs another program. Kept: a live memd's, and one of a run directory that still exists.
TEST_F(MemdProcess, SegmentsOfDeadMemdsAreRemovedAtStartAndLiveOnesKept) {
  pid_t dead = 0;
  char* true_argv[] = {const_cast<char*>("/bin/true"), nullptr};
  ASSERT_EQ(posix_spawn(&dead, "/bin/true", nullptr, nullptr, true_argv, environ), 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);  // reaped: the pid runs nothing now
  const std::string dead_name = "dhs-memd-" + std::to_string(dead);
  const std::string reused_name = "dhs-memd-" + std::to_string(getpid());  // a live pid that is not a memd
  const std::string live_name = SegmentOf(run_dir_);                       // the fixture's memd
  const std::string kept_dir = dir_ + "/idle";  // a run directory whose memd is down: its next memd adopts the pool
  const std::string gone_dir = dir_ + "/gone";  // a run directory removed since
  ASSERT_TRUE(std::filesystem::create_directories(kept_dir));
  ASSERT_TRUE(std::filesystem::create_directories(gone_dir));
  const std::string kept_name = SegmentOf(kept_dir), gone_name = SegmentOf(gone_dir);
  ASSERT_TRUE(HostPoolSegment::Create(dead_name, 4096, 2).ok());
  ASSERT_TRUE(HostPoolSegment::Create(reused_name, 4096, 2).ok());
  ASSERT_TRUE(HostPoolSegment::Create(kept_name, 4096, 2, {0, std::filesystem::canonical(kept_dir).string()}).ok());
  ASSERT_TRUE(HostPoolSegment::Create(gone_name, 4096, 2, {0, std::filesystem::canonical(gone_dir).string()}).ok());
  std::filesystem::remove(gone_dir);
  const std::string other = dir_ + "/other";
  std::vector<std::string> args = {MEMD_BIN, "--run-dir", other, "--page-bytes", "4096", "--host-pool-pages", "8"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t second = 0;
  ASSERT_EQ(posix_spawn(&second, MEMD_BIN, nullptr, nullptr, argv.data(), environ), 0);
  // Serving: memd answers only once its start (the segment clean-up included) is done; the socket file alone
  // appears before the clean-up (memd binds first).
  const bool started = AnswersWithin(other, 5s);
  const bool dead_left = std::filesystem::exists("/dev/shm/" + dead_name);
  const bool reused_left = std::filesystem::exists("/dev/shm/" + reused_name);
  const bool live_left = std::filesystem::exists("/dev/shm/" + live_name);
  const bool kept_left = std::filesystem::exists("/dev/shm/" + kept_name);
  const bool gone_left = std::filesystem::exists("/dev/shm/" + gone_name);
  const std::string second_name = SegmentOf(other);
  const bool second_had = std::filesystem::exists("/dev/shm/" + second_name);
  kill(second, SIGTERM);
  waitpid(second, nullptr, 0);
  for (const std::string& name : {dead_name, reused_name, kept_name, gone_name}) (void)HostPoolSegment::Remove(name);
  ASSERT_TRUE(started);
  EXPECT_FALSE(dead_left) << dead_name;
  EXPECT_FALSE(reused_left) << reused_name;
  EXPECT_FALSE(gone_left) << gone_name;
  EXPECT_TRUE(live_left) << live_name;
  EXPECT_TRUE(kept_left) << kept_name;
  EXPECT_TRUE(second_had) << second_name;
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + second_name));  // its clean exit (no host page held) removed it
}


// A memd killed while creating its pool leaves a "dhs-pool-*" segment that does not open as a host pool (no header
// yet, or cut short); nobody can tell its run directory. A memd removes such a segment at start once it was last
// modified --unreadable-segment-age-s or longer ago (60 s here), and keeps a younger one (another memd may be creating
// it right now). Removed: a garbage one modified 2 h ago and a real pool truncated to 100 bytes modified 90 s ago.
// Kept: a garbage one modified now, and the fixture's live segment.
TEST_F(MemdProcess, UnreadableSegmentsOlderThanTheAgeBoundAreRemovedAtStartYoungerOnesKept) {
  const std::string tag = absl::StrFormat("%08x", static_cast<uint32_t>(getpid()));
  const std::string old_garbage = "dhs-pool-" + tag + "0000000a", old_truncated = "dhs-pool-" + tag + "0000000b",
                    fresh_garbage = "dhs-pool-" + tag + "0000000c";
  const std::string shm = std::string(kHostPoolShmDir) + "/";
  auto write_garbage = [&](const std::string& name) {
    std::ofstream out(shm + name, std::ios::binary);
    out << std::string(100, 'x');
  };
  write_garbage(old_garbage);
  write_garbage(fresh_garbage);
  ASSERT_TRUE(HostPoolSegment::Create(old_truncated, 4096, 2).ok());
  std::filesystem::resize_file(shm + old_truncated, 100);  // its header cut short
  ASSERT_FALSE(HostPoolSegment::Open(old_truncated).ok());
  ASSERT_FALSE(HostPoolSegment::Open(old_garbage).ok());
  const auto now = std::filesystem::file_time_type::clock::now();
  std::filesystem::last_write_time(shm + old_garbage, now - std::chrono::hours(2));
  std::filesystem::last_write_time(shm + old_truncated, now - std::chrono::seconds(90));
  const std::string live_name = SegmentOf(run_dir_);  // the fixture's memd
  const std::string other = dir_ + "/other";
  std::vector<std::string> args = {MEMD_BIN, "--run-dir", other, "--page-bytes", "4096", "--host-pool-pages", "8",
                                   "--unreadable-segment-age-s", "60"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t second = 0;
  ASSERT_EQ(posix_spawn(&second, MEMD_BIN, nullptr, nullptr, argv.data(), environ), 0);
  // Serving: memd answers only once its start (the segment clean-up included) is done; the socket file alone
  // appears before the clean-up (memd binds first).
  const bool started = AnswersWithin(other, 5s);
  const bool old_garbage_left = std::filesystem::exists(shm + old_garbage);
  const bool old_truncated_left = std::filesystem::exists(shm + old_truncated);
  const bool fresh_left = std::filesystem::exists(shm + fresh_garbage);
  const bool live_left = std::filesystem::exists(shm + live_name);
  kill(second, SIGTERM);
  waitpid(second, nullptr, 0);
  for (const std::string& name : {old_garbage, old_truncated, fresh_garbage}) std::filesystem::remove(shm + name);
  ASSERT_TRUE(started);
  EXPECT_FALSE(old_garbage_left) << old_garbage;
  EXPECT_FALSE(old_truncated_left) << old_truncated;
  EXPECT_TRUE(fresh_left) << fresh_garbage << ": younger than the bound, it may be a pool being created";
  EXPECT_TRUE(live_left) << live_name;
}

// memd restart (issue 11): memd is SIGKILLed while a worker holds three granted requests: A (3 context pages, host
// copies of pages 0 and 1 confirmed, tokens 7 8 committed, its host pages filled with a pattern), B (a record, no page
// confirmed), C (no record, page 0 confirmed). The next memd with the same flags adopts the same segment: the GPU's
// next worker is epoch 2 and finds A, B, C interrupted, A keeping exactly its 2 confirmed host pages with their bytes,
// the records of A (tokens included) and B; completing them leaves no host page owned and no record file.
TEST_F(MemdProcess, HostPoolJournalAndRecordsSurviveASigkilledMemd) {
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(w->Hello(8).accepted);
  const RequestId a = w->Id(1), b = w->Id(2), c = w->Id(3);
  auto admit = [&](RequestId id, uint64_t rows, bool with_record) {
    wire::AdmitRequestT m = RecordedAdmit(id, rows);
    if (with_record) {
      m.record->client_request = id + 100;
      m.record->seed = 5;
    } else {
      m.record.reset();
    }
    w->Send(EncodeAdmitRequest(m, w->seq(), "worker"));
    auto g = w->Next();
    EXPECT_TRUE(g && g->type == wire::Body::AdmitGrant);
    return g ? *ReadAdmitGrant(*g) : wire::AdmitGrantT();
  };
  auto written = [&](RequestId id, std::vector<uint32_t> pages) {
    wire::HostCopyWrittenT m;
    m.request = id;
    m.gpu = 0;
    m.history_pages = std::move(pages);
    m.ok = true;
    w->Send(EncodeHostCopyWritten(m, w->seq(), "worker"));
  };
  const wire::AdmitGrantT ga = admit(a, 3 * kPageRows, true);
  admit(b, kPageRows, true);
  admit(c, kPageRows, false);
  ASSERT_EQ(ga.backup_host_pages.size(), 3u);
  auto seg = HostPoolSegment::Open(SegmentOf(run_dir_));
  ASSERT_TRUE(seg.ok()) << seg.status();
  for (uint32_t h = 0; h < 2; ++h) std::memset(*(*seg)->PageData(ga.backup_host_pages[h].page()), 0x40 + h, kPageBytes);
  written(a, {0, 1});
  written(c, {0});
  wire::TokensCommittedT t;
  t.gpu = 0;
  t.entries.push_back(std::make_unique<wire::CommittedTokensT>());
  t.entries[0]->request = a;
  t.entries[0]->tokens = {7, 8};
  t.entries[0]->logits_digests = {70, 80};
  w->Send(EncodeTokensCommitted(t, w->seq(), "worker"));
  auto ack = w->NextOf(wire::Body::TokensCommittedAck);
  ASSERT_TRUE(ack && ack->type == wire::Body::TokensCommittedAck);  // after the HostCopyWritten: memd handled them
  KillMemd();
  w.reset();
  Spawn();
  const std::string adopted = MetricsWith("dhs_memd_requests_adopted_total 3");
  EXPECT_NE(adopted.find("dhs_memd_host_pages_adopted_total 3\n"), std::string::npos) << adopted;
  EXPECT_NE(adopted.find("dhs_memd_host_pages_held_total 61\n"), std::string::npos) << adopted;  // the other pages
  FakeWorker w2(run_dir_, 0);
  wire::HelloReplyT r = w2.Hello(8);
  ASSERT_TRUE(r.accepted) << r.reason;
  EXPECT_EQ(r.worker_epoch, 2u);
  ASSERT_EQ(r.segments.size(), 1u);
  EXPECT_EQ(r.segments[0]->name, SegmentOf(run_dir_));  // the same segment, adopted
  EXPECT_EQ(r.interrupted_requests, (std::vector<uint64_t>{a, b, c}));
  std::map<uint64_t, const wire::RequestRecordT*> records;
  for (const auto& rec : r.interrupted_records) records[rec->request] = rec.get();
  ASSERT_EQ(records.size(), 2u);
  ASSERT_TRUE(records.contains(a) && records.contains(b));
  EXPECT_EQ(records[a]->client_request, a + 100);
  EXPECT_EQ(records[a]->prompt, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(records[a]->tokens, (std::vector<uint8_t>{7, 8}));
  EXPECT_EQ(records[a]->logits_digests, (std::vector<uint64_t>{70, 80}));
  EXPECT_TRUE(records[b]->tokens.empty());
  const json ja = DhsctlJson("request " + std::to_string(a));
  EXPECT_EQ(ja["state"], "interrupted") << ja.dump();
  EXPECT_EQ(ja["host_pages"], 2) << ja.dump();
  EXPECT_EQ(ja["history_pages"], 3) << ja.dump();
  EXPECT_EQ(DhsctlJson("request " + std::to_string(b))["host_pages"], 0);
  auto seg2 = HostPoolSegment::Open(SegmentOf(run_dir_));
  ASSERT_TRUE(seg2.ok());
  for (uint32_t h = 0; h < 2; ++h) {
    const uint8_t* p = *(*seg2)->PageData(ga.backup_host_pages[h].page());
    EXPECT_TRUE(std::all_of(p, p + kPageBytes, [h](uint8_t v) { return v == 0x40 + h; })) << "history page " << h;
  }
  for (RequestId id : {a, b, c}) {
    wire::CompleteT done;
    done.request = id;
    done.gpu = 0;
    w2.Send(EncodeComplete(done, w2.seq(), "worker"));
    auto m = w2.Next();
    ASSERT_TRUE(m && m->type == wire::Body::CompleteAck) << id;
  }
  EXPECT_NE(MetricsWith("dhs_memd_host_pages{kind=\"allocated\"} 0").find("dhs_memd_host_pages{kind=\"pinned\"} 0\n"),
            std::string::npos);
  EXPECT_TRUE(std::filesystem::is_empty(run_dir_ + "/records"));
}

// A worker survives a memd SIGKILL (issue 11): it says Hello again to the new memd with a report of its granted
// requests (Hello.rehello). Request a (3 context pages, 2 kept on GPU at the grant, page 0 confirmed before the kill)
// is adopted as admitted with its slot, GPU pages and epoch; its report claims a host copy of page 1 the journal never
// confirmed (not one: only page 0 is populated back); the worker's record replaces the journal's. Request b's report names a's slot: refused alone, b stays interrupted. At the end nothing is held.
TEST_F(MemdProcess, ReHelloWithAReportKeepsASurvivingWorkersRequests) {
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(w->Hello(8).accepted);
  const RequestId a = w->Id(1), b = w->Id(2);
  auto admit = [&](RequestId id, uint64_t rows, uint32_t complete) {
    wire::AdmitRequestT m = RecordedAdmit(id, rows);
    m.complete_pages = complete;
    w->Send(EncodeAdmitRequest(m, w->seq(), "worker"));
    auto g = w->Next();
    EXPECT_TRUE(g && g->type == wire::Body::AdmitGrant);
    return g ? *ReadAdmitGrant(*g) : wire::AdmitGrantT();
  };
  const wire::AdmitGrantT ga = admit(a, 3 * kPageRows, 2);
  const wire::AdmitGrantT gb = admit(b, kPageRows, 0);
  ASSERT_EQ(ga.backup_host_pages.size(), 3u);
  ASSERT_EQ(ga.optional_pages.size(), 2u);
  // Page 0 was kept: its confirmed copy makes memd free its GPU page (contract §3); a PopulateOrder may come first.
  ConfirmPageZeroAndSync(*w, a);
  KillMemd();
  w.reset();  // its DEALER would reconnect as worker/0 too and take the routing id over
  Spawn();
  MetricsWith("dhs_memd_requests_adopted_total 2");
  FakeWorker w2(run_dir_, 0);  // the same worker's new connection
  wire::HelloT h = MakeTestHello(0, "fake", 8, kPageBytes, 4);
  h.rehello = true;
  h.worker_epoch = 1;
  auto report = [&](const wire::AdmitGrantT& g, uint32_t slot, uint32_t complete, std::vector<bool> copies) {
    auto r = std::make_unique<wire::ReportedRequestT>();
    r->request = g.request;
    r->slot = slot;
    r->required_pages = g.required_pages;
    r->complete_pages = complete;
    for (size_t i = 0; i < g.backup_host_pages.size(); ++i) {
      auto p = std::make_unique<wire::ReportedPageT>();
      p->host_page = g.backup_host_pages[i].page();
      p->host_copy = copies[i];
      for (size_t k = 0; k < g.optional_history_pages.size(); ++k) {
        if (g.optional_history_pages[k] == i && i != 0) {  // page 0's GPU page was freed by its HostCopyWritten
          p->has_gpu_page = true;
          p->gpu_page = g.optional_pages[k];
        }
      }
      r->history.push_back(std::move(p));
    }
    r->record = std::make_unique<wire::RequestRecordT>();
    r->record->request = g.request;
    r->record->prompt = {1, 2, 3};
    r->record->max_new_tokens = 4;
    r->record->tokens = {7, 8};
    r->record->logits_digests = {70, 80};
    return r;
  };
  h.report.push_back(report(ga, ga.slot, 2, {true, true, false}));
  h.report.push_back(report(gb, ga.slot, 0, {false}));
  w2.Send(EncodeHello(h, w2.seq(), "worker"));
  auto m = w2.Next();
  ASSERT_TRUE(m && m->type == wire::Body::HelloReply);
  const wire::HelloReplyT r = *ReadHelloReply(*m);
  ASSERT_TRUE(r.accepted) << r.reason;
  EXPECT_EQ(r.worker_epoch, 1u);  // kept: the worker's node ids carry it
  EXPECT_EQ(r.refused_reports, std::vector<uint64_t>{b});
  ASSERT_EQ(r.refused_reasons.size(), 1u);
  EXPECT_NE(r.refused_reasons[0].find("slot"), std::string::npos) << r.refused_reasons[0];
  EXPECT_EQ(r.interrupted_requests, std::vector<uint64_t>{b});
  const json ja = DhsctlJson("request " + std::to_string(a));
  EXPECT_EQ(ja["state"], "admitted") << ja.dump();
  EXPECT_EQ(ja["slot"], ga.slot) << ja.dump();
  EXPECT_EQ(ja["host_copies"], json::array({json::array({0, ga.backup_host_pages[0].page()})})) << ja.dump();
  // Population brings the one confirmed copy (page 0) back next to the kept page 1.
  auto po = w2.Next();
  ASSERT_TRUE(po && po->type == wire::Body::PopulateOrder) << (po ? BodyName(po->type) : "nothing");
  const wire::PopulateOrderT order = *ReadPopulateOrder(*po);
  EXPECT_EQ(order.request, a);
  EXPECT_EQ(order.history_pages, std::vector<uint32_t>{0});
  ASSERT_EQ(order.host_pages.size(), 1u);
  EXPECT_EQ(order.host_pages[0].page(), ga.backup_host_pages[0].page());
  wire::ReadyPublishT rp;
  rp.order = order.order;
  rp.gpu = 0;
  rp.request = a;
  rp.pages = order.pages;
  rp.history_pages = order.history_pages;
  w2.Send(EncodeReadyPublish(rp, w2.seq(), "worker"));
  const std::string gauges = MetricsWith("dhs_memd_gpu_pages{gpu=\"0\",kind=\"optional_ready\"} 2");
  EXPECT_NE(gauges.find("dhs_memd_gpu_pages{gpu=\"0\",kind=\"required\"} 1\n"), std::string::npos) << gauges;
  EXPECT_NE(gauges.find("dhs_memd_gpu_epoch{gpu=\"0\"} 1\n"), std::string::npos) << gauges;
  for (RequestId id : {a, b}) {
    wire::CompleteT done;
    done.request = id;
    done.gpu = 0;
    w2.Send(EncodeComplete(done, w2.seq(), "worker"));
    auto c = w2.Next();
    ASSERT_TRUE(c && c->type == wire::Body::CompleteAck) << id << " " << (c ? BodyName(c->type) : "nothing");
    EXPECT_EQ(ReadCompleteAck(*c)->released_pages, id == a ? 3u : 0u);  // a: required + kept page 1 + populated 0
  }
  const std::string end = MetricsWith("dhs_memd_host_pages{kind=\"allocated\"} 0");
  EXPECT_NE(end.find("dhs_memd_host_pages{kind=\"pinned\"} 0\n"), std::string::npos) << end;
  EXPECT_NE(end.find("dhs_memd_gpu_pages{gpu=\"0\",kind=\"free\"} 8\n"), std::string::npos) << end;
  EXPECT_NE(end.find("dhs_memd_requests_reported_total 1\n"), std::string::npos) << end;
  EXPECT_TRUE(std::filesystem::is_empty(run_dir_ + "/records"));
}

// The records outlive the pool: when the next memd cannot adopt the pool (here it is gone; another geometry or a
// journal that does not verify take the same path), each request with a record still comes back interrupted, with
// nothing kept, so its next worker resumes it by recomputing from its tokens; its record file goes at its Complete.
TEST_F(MemdProcess, RecordsSurviveAPoolThatIsNotAdopted) {
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(w->Hello(8).accepted);
  const RequestId a = w->Id(1);
  wire::AdmitRequestT m = RecordedAdmit(a, 3 * kPageRows);
  m.record->client_request = 42;
  m.record->client = 77;  // the client's identity comes back with the record (a resume is found by it)
  w->Send(EncodeAdmitRequest(m, w->seq(), "worker"));
  auto g = w->Next();
  ASSERT_TRUE(g && g->type == wire::Body::AdmitGrant);
  wire::HostCopyWrittenT hw;
  hw.request = a;
  hw.gpu = 0;
  hw.history_pages = {0, 1};
  hw.ok = true;
  w->Send(EncodeHostCopyWritten(hw, w->seq(), "worker"));
  wire::TokensCommittedT t;
  t.gpu = 0;
  t.entries.push_back(std::make_unique<wire::CommittedTokensT>());
  t.entries[0]->request = a;
  t.entries[0]->tokens = {7, 8};
  t.entries[0]->logits_digests = {70, 80};
  w->Send(EncodeTokensCommitted(t, w->seq(), "worker"));
  auto ack = w->NextOf(wire::Body::TokensCommittedAck);
  ASSERT_TRUE(ack && ack->type == wire::Body::TokensCommittedAck);
  KillMemd();
  w.reset();
  ASSERT_TRUE(HostPoolSegment::Remove(SegmentOf(run_dir_)).ok());  // the pool is gone; RUN_DIR/records is not
  Spawn();
  FakeWorker w2(run_dir_, 0);
  wire::HelloReplyT r = w2.Hello(8);
  ASSERT_TRUE(r.accepted) << r.reason;
  EXPECT_EQ(r.interrupted_requests, (std::vector<uint64_t>{a}));
  ASSERT_EQ(r.interrupted_records.size(), 1u);
  EXPECT_EQ(r.interrupted_records[0]->client_request, 42u);
  EXPECT_EQ(r.interrupted_records[0]->client, 77u);
  EXPECT_EQ(r.interrupted_records[0]->tokens, (std::vector<uint8_t>{7, 8}));
  const json ja = DhsctlJson("request " + std::to_string(a));
  EXPECT_EQ(ja["state"], "interrupted") << ja.dump();
  EXPECT_EQ(ja["host_pages"], 0) << ja.dump();  // nothing kept: the host copies went with the pool
  wire::CompleteT done;
  done.request = a;
  done.gpu = 0;
  w2.Send(EncodeComplete(done, w2.seq(), "worker"));
  auto m2 = w2.Next();
  ASSERT_TRUE(m2 && m2->type == wire::Body::CompleteAck);
  EXPECT_TRUE(std::filesystem::is_empty(run_dir_ + "/records"));
}

// A leftover segment of this run directory that cannot be adopted never blocks memd: another geometry, a journal
// whose bytes do not verify, and an object that is no host pool at all are each replaced by a new pool (formatted
// journal, memd's geometry, nothing adopted). One that names another run directory is left alone and memd says why.
TEST_F(MemdProcess, LeftoverSegmentsThatCannotBeAdoptedAreReplaced) {
  const std::string name = SegmentOf(run_dir_), canonical = std::filesystem::canonical(run_dir_).string();
  auto restart_with = [&](const std::function<void()>& leave) {
    KillMemd();
    ASSERT_TRUE(HostPoolSegment::Remove(name).ok());
    leave();
    Spawn();
    auto seg = HostPoolSegment::Open(name);
    ASSERT_TRUE(seg.ok()) << seg.status();
    EXPECT_EQ((*seg)->page_bytes(), kPageBytes);
    EXPECT_EQ((*seg)->pages(), 64u);
    auto journal = memd::HostJournal::Attach((*seg)->journal(), 64);
    ASSERT_TRUE(journal.ok());
    auto v = journal->Verify();
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(v->empty());
    FakeWorker w(run_dir_, 0);
    wire::HelloReplyT r = w.Hello(8);
    EXPECT_TRUE(r.accepted) << r.reason;
    EXPECT_TRUE(r.interrupted_requests.empty());
  };
  {
    SCOPED_TRACE("other geometry");
    restart_with([&] {
      ASSERT_TRUE(HostPoolSegment::Create(name, 2 * kPageBytes, 64,
                                          {memd::HostJournal::BytesFor(64), canonical}).ok());
    });
  }
  {
    SCOPED_TRACE("a journal that does not verify");
    restart_with([&] {
      auto seg = HostPoolSegment::Create(name, kPageBytes, 64, {memd::HostJournal::BytesFor(64), canonical});
      ASSERT_TRUE(seg.ok());
      auto j = memd::HostJournal::Attach((*seg)->journal(), 64);
      j->Format();
      j->Assign(3, MakeNodeRequestId(0, 1, 9), 0, 1);
      j->Confirm(3);
      (*seg)->journal()[memd::kJournalHeaderBytes + 3 * memd::kJournalEntryBytes] ^= 0x01;  // one bit of the owner
    });
  }
  {
    SCOPED_TRACE("not a host pool");
    restart_with([&] { std::ofstream("/dev/shm/" + name) << "garbage bytes, no header"; });
  }
  KillMemd();
  ASSERT_TRUE(HostPoolSegment::Remove(name).ok());
  ASSERT_TRUE(HostPoolSegment::Create(name, kPageBytes, 64, {memd::HostJournal::BytesFor(64), "/elsewhere"}).ok());
  auto [rc, out] = RunShell(std::string(MEMD_BIN) + " --run-dir " + run_dir_ + " --page-bytes " +
                            std::to_string(kPageBytes) + " --host-pool-pages 64");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("belongs to run directory '/elsewhere'"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + name));  // left alone
}

// Issue 22: a start that fails, or that was given the wrong geometry, never touches a pool it could adopt. A dead
// memd's pool holds request a (3 host pages, 2 of them confirmed copies, a record with 2 tokens). A memd started with
// another --host-pool-pages or --page-bytes exits 1 naming the request, its pages and the pool's geometry, and the
// pool is kept byte for byte; so does one whose new pool does not fit /dev/shm even with --replace-host-pool (the
// free space is checked before anything is removed). The right flags then adopt a with its 2 confirmed pages; after
// another kill, --replace-host-pool with another size replaces the pool, and a comes back with no host page kept (its
// record survives: it is recomputed from its tokens).
TEST_F(MemdProcess, AFailedOrMisconfiguredStartNeverTouchesAnAdoptablePool) {
  const std::string name = SegmentOf(run_dir_);
  auto w = std::make_unique<FakeWorker>(run_dir_, 0);
  ASSERT_TRUE(w->Hello(8).accepted);
  const RequestId a = w->Id(1);
  wire::AdmitRequestT m = RecordedAdmit(a, 3 * kPageRows);
  w->Send(EncodeAdmitRequest(m, w->seq(), "worker"));
  auto g = w->Next();
  ASSERT_TRUE(g && g->type == wire::Body::AdmitGrant);
  const wire::AdmitGrantT grant = *ReadAdmitGrant(*g);
  ASSERT_EQ(grant.backup_host_pages.size(), 3u);
  {
    auto seg = HostPoolSegment::Open(name);
    ASSERT_TRUE(seg.ok()) << seg.status();
    for (uint32_t h = 0; h < 2; ++h) {
      std::memset(*(*seg)->PageData(grant.backup_host_pages[h].page()), 0x50 + h, kPageBytes);
    }
  }
  wire::HostCopyWrittenT hw;
  hw.request = a;
  hw.gpu = 0;
  hw.history_pages = {0, 1};
  hw.ok = true;
  w->Send(EncodeHostCopyWritten(hw, w->seq(), "worker"));
  wire::TokensCommittedT t;
  t.gpu = 0;
  t.entries.push_back(std::make_unique<wire::CommittedTokensT>());
  t.entries[0]->request = a;
  t.entries[0]->tokens = {7, 8};
  t.entries[0]->logits_digests = {70, 80};
  w->Send(EncodeTokensCommitted(t, w->seq(), "worker"));
  auto ack = w->NextOf(wire::Body::TokensCommittedAck);
  ASSERT_TRUE(ack && ack->type == wire::Body::TokensCommittedAck);  // after the HostCopyWritten: memd handled both
  KillMemd();
  w.reset();

  // The pool as the dead memd left it: its geometry, its journal's one request, the bytes of the confirmed pages.
  auto expect_kept = [&](const std::string& why) {
    SCOPED_TRACE(why);
    auto seg = HostPoolSegment::Open(name);
    ASSERT_TRUE(seg.ok()) << seg.status();
    EXPECT_EQ((*seg)->page_bytes(), kPageBytes);
    EXPECT_EQ((*seg)->pages(), 64u);
    const memd::LeftoverContents held = memd::LeftoverRequests(**seg);
    EXPECT_TRUE(held.journal_verified);
    EXPECT_EQ(held.requests, 1u);
    EXPECT_EQ(held.host_pages, 3u);
    EXPECT_EQ(held.confirmed_pages, 2u);
    for (uint32_t h = 0; h < 2; ++h) {
      const uint8_t* p = *(*seg)->PageData(grant.backup_host_pages[h].page());
      EXPECT_TRUE(std::all_of(p, p + kPageBytes, [h](uint8_t v) { return v == 0x50 + h; })) << "history page " << h;
    }
    EXPECT_TRUE(std::filesystem::exists(run_dir_ + absl::StrFormat("/records/%016x.rec", a)));  // RecordJournal
  };
  expect_kept("before");
  const std::string memd = std::string(MEMD_BIN) + " --run-dir " + run_dir_ + " ";
  const std::string refusal = "holds 1 requests of a previous memd holding 3 host pages (2 with a confirmed host copy)";
  const std::string how = "start memd with the pool's geometry (--page-bytes 4096 --host-pool-pages 64) to adopt "
                          "them, or give --replace-host-pool to drop them";
  for (const std::string& flags : {std::string("--page-bytes 4096 --host-pool-pages 32"),
                                   std::string("--page-bytes 8192 --host-pool-pages 64"),
                                   std::string("--page-bytes 4096 --host-pool-bytes 1MiB")}) {
    auto [rc, out] = RunShell(memd + flags);
    EXPECT_EQ(rc, 1) << flags << ": " << out;
    EXPECT_NE(out.find(refusal), std::string::npos) << flags << ": " << out;
    EXPECT_NE(out.find(how), std::string::npos) << flags << ": " << out;
    expect_kept(flags);
  }
  {  // replacing is allowed, but the new pool does not fit: refused before the leftover is removed
    struct statvfs fs {};
    ASSERT_EQ(::statvfs(kHostPoolShmDir, &fs), 0);
    const uint64_t too_many = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize / (1 << 20) + 1024;
    auto [rc, out] = RunShell(memd + "--replace-host-pool --page-bytes 1048576 --host-pool-pages " +
                              std::to_string(too_many));
    EXPECT_EQ(rc, 1) << out;
    EXPECT_NE(out.find("/dev/shm has only"), std::string::npos) << out;
    EXPECT_NE(out.find("the leftover /dev/shm/" + name + " is kept"), std::string::npos) << out;
    expect_kept("too large to replace");
  }
  Spawn();  // the right flags: adopted
  const std::string adopted = MetricsWith("dhs_memd_requests_adopted_total 1");
  EXPECT_NE(adopted.find("dhs_memd_host_pages_adopted_total 2\n"), std::string::npos) << adopted;
  KillMemd();
  pool_pages_ = "32";
  extra_args_ = {"--replace-host-pool"};
  Spawn();  // the operator said so: replaced, the request comes back with nothing kept
  auto seg = HostPoolSegment::Open(name);
  ASSERT_TRUE(seg.ok()) << seg.status();
  EXPECT_EQ((*seg)->pages(), 32u);
  EXPECT_EQ(memd::LeftoverRequests(**seg).requests, 0u);
  FakeWorker w2(run_dir_, 0);
  wire::HelloReplyT r = w2.Hello(8);
  ASSERT_TRUE(r.accepted) << r.reason;
  EXPECT_EQ(r.interrupted_requests, (std::vector<uint64_t>{a}));
  ASSERT_EQ(r.interrupted_records.size(), 1u);
  EXPECT_EQ(r.interrupted_records[0]->tokens, (std::vector<uint8_t>{7, 8}));
  EXPECT_EQ(DhsctlJson("request " + std::to_string(a))["host_pages"], 0);
}

// Issue 24, prefix sharing end to end through memd's socket (--prefix-sharing on): a fake worker's first request
// names a chain of 2 blocks of 32 tokens (4 pages of 16 rows) and confirms their host copies; a second request of the
// same chain is granted those 4 host pages as shared, host-backed pages (AdmitGrant.shared_pages), a third of another
// tenant is not; dhsctl prefixes and GET /metrics show it; after a SIGKILL of memd the next memd adopts the 4 shared
// pages from the journal (cached) and grants them again.
class MemdPrefix : public MemdProcess {
 protected:
  MemdPrefix() { extra_args_ = {"--prefix-sharing", "on", "--adopt-grace-ms", "0"}; }
  static void Chain(wire::AdmitRequestT& a, const std::string& tenant) {
    a.tenant = tenant;
    a.prefix_block_ids = {11, 12};
    a.prefix_block_digests = {101, 102};
    a.prefix_block_tokens = 2 * kPageRows;
  }
  wire::AdmitGrantT AdmitChain(FakeWorker& w, RequestId r, const std::string& tenant) {
    wire::AdmitRequestT a;
    a.request = r;
    a.gpu = w.gpu();
    a.required_pages = 1;
    a.history_rows = 6 * kPageRows;  // 6 pages, 4 of them shareable
    a.optional_history = false;
    Chain(a, tenant);
    w.Send(EncodeAdmitRequest(a, w.seq(), "worker"));
    auto m = w.NextOf(wire::Body::AdmitGrant);
    EXPECT_TRUE(m.has_value());
    return m ? *ReadAdmitGrant(*m) : wire::AdmitGrantT();
  }
  // Confirms the host copies of history pages 0-3 of request `r` (HostCopyWritten), page h with checksum
  // `first_checksum + h`.
  static void ConfirmFirstPages(FakeWorker& w, RequestId r, uint64_t first_checksum) {
    wire::HostCopyWrittenT written;
    written.request = r;
    written.gpu = w.gpu();
    for (uint32_t h = 0; h < 4; ++h) {
      written.history_pages.push_back(h);
      written.checksums.push_back(first_checksum + h);
    }
    written.ok = true;
    w.Send(EncodeHostCopyWritten(written, w.seq(), "worker"));
  }
  // Request `r` admits the default chain, confirms its first pages and completes: its 4 shared pages stay cached.
  void CacheChainOf(FakeWorker& w, RequestId r) {
    AdmitChain(w, r, "");
    ConfirmFirstPages(w, r, 7);
    wire::CompleteT done;
    done.request = r;
    w.Send(EncodeComplete(done, w.seq(), "worker"));
    ASSERT_TRUE(w.NextOf(wire::Body::CompleteAck).has_value());
    ASSERT_EQ(DhsctlJson("status")["prefix"]["cached_pages"], 4);
  }
};

// Issue 26: with prefix sharing every GPU of the node serves one model (the host tier is addressed by tokens: a page
// of one model would be a wrong row for another).
TEST_F(MemdPrefix, AGpuOfAnotherModelIsRefused) {
  FakeWorker w0(run_dir_, 0), w1(run_dir_, 1);
  ASSERT_TRUE(HelloOfModel(w0, 0xa1).accepted);
  const wire::HelloReplyT other = HelloOfModel(w1, 0xb2);
  EXPECT_FALSE(other.accepted);
  EXPECT_NE(other.reason.find("GPU 0 serves model 00000000000000a1 and this worker model 00000000000000b2: with "
                              "--prefix-sharing on every GPU of a node must serve one model"), std::string::npos)
      << other.reason;
  EXPECT_TRUE(HelloOfModel(w1, 0xa1).accepted);
}

// Issue 26: shared prefix pages of model a1 adopted by a restarted memd (SIGKILL, pool journal) keep the node's
// model: a worker of model b2 on another GPU is refused (it would be granted a1's rows), a1's is accepted.
TEST_F(MemdPrefix, AdoptedSharedPagesKeepTheirModelAcrossAMemdRestart) {
  {
    FakeWorker w(run_dir_, 0);
    ASSERT_TRUE(HelloOfModel(w, 0xa1).accepted);
    CacheChainOf(w, w.Id(1));
    KillMemd();
  }
  Spawn();
  ASSERT_EQ(DhsctlJson("status")["prefix"]["cached_pages"], 4);  // adopted
  FakeWorker w1(run_dir_, 1);
  const wire::HelloReplyT other = HelloOfModel(w1, 0xb2);
  EXPECT_FALSE(other.accepted);
  EXPECT_NE(other.reason.find("GPU 0 serves model 00000000000000a1 and this worker model 00000000000000b2"),
            std::string::npos) << other.reason;
  EXPECT_TRUE(HelloOfModel(w1, 0xa1).accepted);
}

// A clean stop (SIGTERM) when the pool holds only cached prefix pages (no request holds a page) removes the segment:
// the run directory may be deleted next, and nothing would adopt it (a SIGKILL keeps it: the test below).
TEST_F(MemdPrefix, ACleanStopDropsAPoolHoldingOnlyCachedPages) {
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(32).accepted);
  CacheChainOf(w, w.Id(1));
  const std::string segment = "/dev/shm/" + SegmentOf(run_dir_);
  ASSERT_TRUE(std::filesystem::exists(segment));
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(std::filesystem::exists(segment));
}

TEST_F(MemdPrefix, SharedPagesAreGrantedAcrossRequestsAndSurviveAMemdRestart) {
  std::vector<uint32_t> shared_hosts;
  {
    FakeWorker w(run_dir_, 0);
    ASSERT_TRUE(w.Hello(32).accepted);
    const wire::AdmitGrantT g1 = AdmitChain(w, w.Id(1), "");
    EXPECT_TRUE(g1.shared_pages.empty());
    ConfirmFirstPages(w, w.Id(1), 7);
    const wire::AdmitGrantT g2 = AdmitChain(w, w.Id(2), "");
    EXPECT_EQ(g2.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
    EXPECT_EQ(g2.host_backed_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
    EXPECT_EQ(g2.host_backed_checksums, (std::vector<uint64_t>{7, 8, 9, 10}));
    for (uint32_t h = 0; h < 4; ++h) {
      EXPECT_EQ(g2.backup_host_pages[h].page(), g1.backup_host_pages[h].page());
      shared_hosts.push_back(g1.backup_host_pages[h].page());
    }
    const wire::AdmitGrantT g3 = AdmitChain(w, w.Id(3), "other-tenant");
    EXPECT_TRUE(g3.shared_pages.empty());
    const std::string metrics = MetricsWith("dhs_memd_prefix_hits_total 4");
    EXPECT_NE(metrics.find("dhs_memd_prefix_hits_total 4\n"), std::string::npos) << metrics;
    EXPECT_NE(metrics.find("dhs_memd_prefix_pages{state=\"shared\"} 4\n"), std::string::npos) << metrics;
    const json chains = DhsctlJson("prefixes")["chains"];
    ASSERT_EQ(chains.size(), 4u) << chains;  // 2 chains (1 and 2 blocks) of each tenant: 2 pages each
    uint32_t holders_of_shared = 0;
    for (const json& c : chains) holders_of_shared += c["shared"] == 2 ? c["holders"].get<uint32_t>() : 0;
    EXPECT_EQ(holders_of_shared, 4u);  // requests 1 and 2 on each of the default tenant's two chains
    auto [rc, table] = Dhsctl("prefixes");
    EXPECT_EQ(rc, 0);
    EXPECT_NE(table.find("holders"), std::string::npos) << table;
    EXPECT_EQ(DhsctlJson("status")["prefix"]["shared_pages"], 4);
  }
  KillMemd();
  Spawn();
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(32).accepted);
  EXPECT_EQ(DhsctlJson("status")["prefix"]["cached_pages"], 4);
  EXPECT_EQ(DhsctlJson("status")["prefix"]["adopted"], 4);
  const wire::AdmitGrantT g4 = AdmitChain(w, w.Id(1, 2), "");
  EXPECT_EQ(g4.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
  for (uint32_t h = 0; h < 4; ++h) EXPECT_EQ(g4.backup_host_pages[h].page(), shared_hosts[h]);
  EXPECT_EQ(g4.host_backed_checksums, (std::vector<uint64_t>{7, 8, 9, 10}));
}

// Issue 24, worker side, bad input: chains as workerd names them (PrefixChainOf: block digests computed from the tokens,
// workerd/prefix_chain.h). A request whose blocks carry the same ids as the stored chain but other tokens in block 1
// is granted only block 0's pages (its block 1 disagrees: never imported); the same tokens get all 4 pages.
TEST_F(MemdPrefix, AChainWithTheSameIdsAndOtherTokensIsNeverImported) {
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(32).accepted);
  std::vector<model::Token> tokens(2 * 2 * kPageRows + 5);  // 2 complete blocks of 2 pages, then private tokens
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<model::Token>((i * 31 + 7) % 256);
  std::vector<model::Token> other = tokens;
  other[3 * kPageRows] ^= 1;  // a token of block 1
  const std::vector<uint64_t> ids = {11, 12};
  auto admit = [&](RequestId r, const std::vector<model::Token>& t) {
    const RequestPrefixChain chain = PrefixChainOf(t, ids, 2 * kPageRows, "");
    wire::AdmitRequestT a;
    a.request = r;
    a.gpu = w.gpu();
    a.required_pages = 1;
    a.history_rows = 6 * kPageRows;
    a.optional_history = false;
    a.prefix_block_ids = chain.block_ids;
    a.prefix_block_digests = chain.block_digests;
    a.prefix_block_tokens = chain.block_tokens;
    w.Send(EncodeAdmitRequest(a, w.seq(), "worker"));
    auto m = w.NextOf(wire::Body::AdmitGrant);
    EXPECT_TRUE(m.has_value());
    return m ? *ReadAdmitGrant(*m) : wire::AdmitGrantT();
  };
  const wire::AdmitGrantT g1 = admit(w.Id(1), tokens);
  EXPECT_TRUE(g1.shared_pages.empty());
  ConfirmFirstPages(w, w.Id(1), 7);
  const wire::AdmitGrantT g2 = admit(w.Id(2), other);
  EXPECT_EQ(g2.shared_pages, (std::vector<uint32_t>{0, 1}));  // block 0 agrees; block 1's pages are not imported
  for (uint32_t h = 2; h < 4; ++h) EXPECT_NE(g2.backup_host_pages[h].page(), g1.backup_host_pages[h].page()) << h;
  EXPECT_GE(DhsctlJson("status")["prefix"]["content_mismatches"].get<int>(), 2);
  const wire::AdmitGrantT g3 = admit(w.Id(3), tokens);
  EXPECT_EQ(g3.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));
}

// Issue 24's KV event stream through a real memd (--prefix-sharing on --kv-events on, a host pool of 8 pages): a
// subscriber on RUN_DIR/kv-events.sock sees BlockStored(host) for exactly the blocks whose host copies a fake worker
// confirmed, with the chain hashes computed here from memd/prefix_pages.h's formula, BlockRemoved when an admission
// evicts a cached page of a block, contiguous sequence numbers; the per-tier counters in GET /metrics.
class MemdKvEvents : public MemdPrefix {
 protected:
  MemdKvEvents() {
    extra_args_.insert(extra_args_.end(), {"--kv-events", "on"});
    pool_pages_ = "8";
  }
  // t and c_b of the header (t = XXH3(tenant, "DHSTenan"), c_b = XXH3(le64(id_b), seed c_{b-1}), c_{-1} = t).
  static uint64_t TenantHash(std::string_view tenant) {
    return XXH3_64bits_withSeed(tenant.data(), tenant.size(), 0x44485354656e616eull);
  }
  static std::vector<uint64_t> ChainHashes(std::string_view tenant, const std::vector<uint64_t>& ids) {
    std::vector<uint64_t> out;
    uint64_t c = TenantHash(tenant);
    for (uint64_t id : ids) out.push_back(c = XXH3_64bits_withSeed(&id, 8, c));
    return out;
  }
  // Admits request `r` of 6 pages whose first 4 are the chain `ids` (2 blocks of 2 pages), optionally confirms their
  // host copies (HostCopyWritten of pages 0-3) and completes it. Returns the grant.
  wire::AdmitGrantT Cycle(FakeWorker& w, RequestId r, std::vector<uint64_t> ids, bool write, bool complete) {
    wire::AdmitRequestT a;
    a.request = r;
    a.gpu = w.gpu();
    a.required_pages = 1;
    a.history_rows = 6 * kPageRows;
    a.optional_history = false;
    a.prefix_block_ids = ids;
    a.prefix_block_digests = {ids[0] * 7, ids[1] * 7};
    a.prefix_block_tokens = 2 * kPageRows;
    w.Send(EncodeAdmitRequest(a, w.seq(), "worker"));
    auto m = w.NextOf(wire::Body::AdmitGrant);
    EXPECT_TRUE(m.has_value()) << "request " << r << " was not granted";
    const wire::AdmitGrantT g = m ? *ReadAdmitGrant(*m) : wire::AdmitGrantT();
    if (write) ConfirmFirstPages(w, r, 1000);
    if (complete) {
      wire::CompleteT done;
      done.request = r;
      w.Send(EncodeComplete(done, w.seq(), "worker"));
      EXPECT_TRUE(w.NextOf(wire::Body::CompleteAck).has_value()) << "request " << r;
    }
    return g;
  }
  std::unique_ptr<KvEventSubscriber> Subscribe(KvEventSubscriber::Options o = {}) {
    auto sub = KvEventSubscriber::Connect(IpcEndpoint(run_dir_, kKvEventsSocket), o);
    EXPECT_TRUE(sub.ok()) << sub.status();
    // memd counts the subscription when its loop reads it (every tick): then no event can miss this subscriber.
    const std::string metrics = MetricsWith("dhs_memd_kv_events_subscriptions_total 1");
    EXPECT_NE(metrics.find("dhs_memd_kv_events_subscriptions_total 1\n"), std::string::npos) << metrics;
    return sub.ok() ? std::move(*sub) : nullptr;
  }
  // The next `n` events (batches split as memd made them), checking that numbers follow without a gap.
  std::vector<std::pair<uint64_t, KvEvent>> NextEvents(KvEventSubscriber& sub, KvSequenceCheck& check, size_t n) {
    std::vector<std::pair<uint64_t, KvEvent>> out;
    while (out.size() < n) {
      auto b = sub.Next(5000ms);
      EXPECT_TRUE(b.ok() && b->has_value()) << "got " << out.size() << " of " << n << " events";
      if (!b.ok() || !b->has_value()) break;
      const KvSequenceStep step = check.Next(**b);
      EXPECT_EQ(step.lost, 0u);
      for (size_t i = 0; i < (*b)->events.size(); ++i) out.emplace_back((*b)->first_seq + i, (*b)->events[i]);
    }
    return out;
  }
};

TEST_F(MemdKvEvents, StoredAndRemovedEventsNameTheChainsMemdStores) {
  auto sub = Subscribe();
  ASSERT_NE(sub, nullptr);
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(32).accepted);
  const uint64_t t = TenantHash("");
  const std::vector<uint64_t> a = ChainHashes("", {11, 12}), b = ChainHashes("", {21, 22});
  KvSequenceCheck check;
  // Request 1 confirms its 4 shareable pages: both blocks stored (2 pages of 16 rows, 32 tokens each). Event 0 was
  // the AllBlocksCleared memd published at its start, before this subscriber joined.
  Cycle(w, w.Id(1), {11, 12}, /*write=*/true, /*complete=*/true);
  auto events = NextEvents(*sub, check, 2);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].first, 1u);
  EXPECT_EQ(events[0].second, (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, a[0], t, 1, 32, 2, 16}));
  EXPECT_EQ(events[1].first, 2u);
  EXPECT_EQ(events[1].second, (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, a[1], a[0], 2, 32, 2, 16}));
  // Its 4 pages are cached; request 2 (another chain, 6 pages) finds 8 - 4 = 4 free: 2 cached pages are evicted, the
  // least recently used: pages 0 and 1, block 0 of request 1's chain -> one BlockRemoved. Request 2 writes nothing.
  Cycle(w, w.Id(2), {21, 22}, /*write=*/false, /*complete=*/true);
  events = NextEvents(*sub, check, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].first, 3u);
  EXPECT_EQ(events[0].second, (KvEvent{KvEventKind::kBlockRemoved, KvMedium::kHost, t, a[0], t, 1, 32, 2, 16}));
  // Request 3 (chain 11, 12 again) imports block 1's 2 cached pages (a host-tier hit of 2 pages = 32 tokens) and
  // writes block 0 again: BlockStored of block 0 once more. Then chain 21, 22 is written: its two blocks.
  const wire::AdmitGrantT g3 = Cycle(w, w.Id(3), {11, 12}, /*write=*/true, /*complete=*/true);
  EXPECT_EQ(g3.shared_pages, (std::vector<uint32_t>{2, 3}));
  events = NextEvents(*sub, check, 1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].first, 4u);
  EXPECT_EQ(events[0].second, (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, a[0], t, 1, 32, 2, 16}));
  // Request 4 (chain 21, 22) needs 6 pages with 4 free: request 3 released its 4 pages in page order, so the 2 least
  // recently used are pages 0, 1 (block 0 of chain 11, 12): BlockRemoved again; then it writes its 2 blocks.
  Cycle(w, w.Id(4), {21, 22}, /*write=*/true, /*complete=*/false);
  events = NextEvents(*sub, check, 3);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].first, 5u);
  EXPECT_EQ(events[0].second, (KvEvent{KvEventKind::kBlockRemoved, KvMedium::kHost, t, a[0], t, 1, 32, 2, 16}));
  EXPECT_EQ(events[1].second, (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, b[0], t, 1, 32, 2, 16}));
  EXPECT_EQ(events[2].second, (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, b[1], b[0], 2, 32, 2, 16}));
  EXPECT_EQ(events[2].first, 7u);
  EXPECT_EQ(check.lost(), 0u);
  // Per tier: 2 host hits of 16 rows (32 prefill tokens, 2 x 4096 bytes) of 16 pages looked up.
  const std::string metrics = MetricsWith("dhs_memd_kv_events_published_total 8");
  for (const std::string line :
       {"dhs_memd_kv_events_published_total 8", "dhs_memd_kv_events_dropped_total 0",
        "dhs_memd_prefix_tier_pages_total{tier=\"host\"} 2", "dhs_memd_prefix_tier_pages_total{tier=\"miss\"} 14",
        "dhs_memd_prefix_prefill_tokens_saved_total 32", "dhs_memd_prefix_bytes_saved_total 8192",
        "dhs_memd_prefix_stored_blocks 3"}) {
    EXPECT_NE(metrics.find(line + "\n"), std::string::npos) << line << "\n" << metrics;
  }
  // A clean stop removes the stream's socket file as it removes memd.sock (docs/operations.md: no socket left).
  ASSERT_TRUE(std::filesystem::exists(run_dir_ + "/kv-events.sock"));
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(std::filesystem::exists(run_dir_ + "/kv-events.sock"));
  EXPECT_FALSE(std::filesystem::exists(run_dir_ + "/memd.sock"));
  RemoveSegmentOf(run_dir_);
}

// memd restarts (SIGKILL; the next memd adopts the shared pages from the journal, their chains unknown): the same
// subscriber (ZeroMQ reconnects it) sees a new stream, its numbers from 1 again (event 0, AllBlocksCleared, went out
// before it was back), and the adopted blocks announced again when an admission's lookups hit all their pages.
TEST_F(MemdKvEvents, AMemdRestartStartsANewStreamAndReannouncesAdoptedBlocksOnTheirFirstHit) {
  auto sub = Subscribe();
  ASSERT_NE(sub, nullptr);
  const uint64_t t = TenantHash("");
  const std::vector<uint64_t> a = ChainHashes("", {11, 12});
  KvSequenceCheck check;
  uint64_t first_stream = 0;
  {
    FakeWorker w(run_dir_, 0);
    ASSERT_TRUE(w.Hello(32).accepted);
    Cycle(w, w.Id(1), {11, 12}, /*write=*/true, /*complete=*/true);
    auto b = sub->Next(5000ms);
    ASSERT_TRUE(b.ok() && b->has_value());
    EXPECT_TRUE(check.Next(**b).new_stream);
    first_stream = (*b)->stream;
    EXPECT_EQ((*b)->events.size(), 2u);
  }
  KillMemd();
  Spawn();
  // ZeroMQ reconnects the subscriber by itself; its subscription is sent again when its thread next calls into the
  // socket (the reconnection's hiccup is handled there), as a consumer waiting for events does: so wait in Next.
  std::string metrics;
  for (int i = 0; i < 100; ++i) {
    auto none = sub->Next(50ms);
    ASSERT_TRUE(none.ok() && !none->has_value());  // nothing published before a worker says Hello
    metrics = MetricsWith("dhs_memd_kv_events_subscriptions_total 1");  // the new memd's count
    if (metrics.find("dhs_memd_kv_events_subscriptions_total 1\n") != std::string::npos) break;
  }
  ASSERT_NE(metrics.find("dhs_memd_kv_events_subscriptions_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("dhs_memd_prefix_adopted_total 4\n"), std::string::npos) << metrics;
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(32).accepted);
  const wire::AdmitGrantT g = Cycle(w, w.Id(1, 2), {11, 12}, /*write=*/false, /*complete=*/true);
  EXPECT_EQ(g.shared_pages, (std::vector<uint32_t>{0, 1, 2, 3}));  // the adopted pages, imported
  auto b = sub->Next(5000ms);
  ASSERT_TRUE(b.ok() && b->has_value());
  const KvSequenceStep step = check.Next(**b);
  EXPECT_TRUE(step.new_stream);
  EXPECT_EQ(step.lost, 0u);
  EXPECT_NE((*b)->stream, first_stream);
  EXPECT_EQ((*b)->first_seq, 1u);
  ASSERT_EQ((*b)->events.size(), 2u);
  EXPECT_EQ((*b)->events[0], (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, a[0], t, 1, 32, 2, 16}));
  EXPECT_EQ((*b)->events[1], (KvEvent{KvEventKind::kBlockStored, KvMedium::kHost, t, a[1], a[0], 2, 32, 2, 16}));
}

// A subscriber that stops reading (receive HWM 1, a small buffer; memd --kv-events-hwm 1) never delays an admission:
// the cycles go on (every admission granted) until memd counts dropped events; the loop ends on that count, not on
// time. Reading again, the subscriber sees a gap of exactly the dropped events.
TEST_F(MemdKvEvents, AStalledSubscriberNeverBlocksAdmission) {
  KillMemd();
  extra_args_.insert(extra_args_.end(), {"--kv-events-hwm", "1"});
  Spawn();
  auto sub = Subscribe({1, 4096});
  ASSERT_NE(sub, nullptr);
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(32).accepted);
  const size_t colon = metrics_address_.rfind(':');
  httplib::Client client(metrics_address_.substr(0, colon), std::stoi(metrics_address_.substr(colon + 1)));
  auto dropped = [&]() -> uint64_t {
    auto res = client.Get("/metrics");
    if (!res || res->status != 200) return 0;
    const std::string name = "\ndhs_memd_kv_events_dropped_total ";  // the sample line, not its # TYPE line
    const size_t at = res->body.find(name);
    return at == std::string::npos ? 0 : std::stoull(res->body.substr(at + name.size()));
  };
  int cycles = 0;
  for (; cycles < 20000 && !HasFailure(); ++cycles) {
    Cycle(w, w.Id(cycles + 1), {uint64_t(100000 + 2 * cycles), uint64_t(100001 + 2 * cycles)}, true, true);
    if (cycles % 25 == 24 && dropped() > 0) break;
  }
  ASSERT_LT(cycles, 20000) << "memd never dropped an event for a subscriber that reads nothing";
  std::printf("kv events: memd dropped events after %d admission cycles with a stalled subscriber\n", cycles + 1);
  // The subscriber reads again; more cycles until a batch after the gap reaches it.
  KvSequenceCheck check;
  uint64_t received = 0;
  for (int more = 0; check.lost() == 0 && more < 1000 && !HasFailure(); ++more) {
    while (true) {
      auto b = sub->Next(more == 0 && received == 0 ? 5000ms : 200ms);
      ASSERT_TRUE(b.ok()) << b.status();
      if (!b->has_value()) break;
      check.Next(**b);
      received += (*b)->events.size();
    }
    if (check.lost() == 0) Cycle(w, w.Id(cycles + 2 + more), {uint64_t(900000 + 2 * more), uint64_t(900001 + 2 * more)},
                                 true, true);
  }
  ASSERT_GT(check.lost(), 0u);
  // No more events now. Every event memd sent reached the subscriber (received = published - event 0), so what it misses are
  // exactly memd's drops: the gaps it saw, plus the batches dropped after the last one it received (no gap yet).
  std::string metrics;
  for (int i = 0; i < 100; ++i) {  // memd's snapshot is taken on its 20 ms tick: read until two agree
    auto first = client.Get("/metrics");
    std::this_thread::sleep_for(100ms);
    auto second = client.Get("/metrics");
    if (first && second && first->body.find("dhs_memd_kv_events_published_total") != std::string::npos) {
      auto value = [](const std::string& body, const std::string& name) {
        const size_t at = body.find("\n" + name + " ");
        return at == std::string::npos ? uint64_t{0} : std::stoull(body.substr(at + name.size() + 2));
      };
      if (value(first->body, "dhs_memd_kv_events_published_total") ==
          value(second->body, "dhs_memd_kv_events_published_total")) {
        metrics = second->body;
        break;
      }
    }
  }
  auto value = [&](const std::string& name) {
    const size_t at = metrics.find("\n" + name + " ");
    return at == std::string::npos ? uint64_t{0} : std::stoull(metrics.substr(at + name.size() + 2));
  };
  const uint64_t published = value("dhs_memd_kv_events_published_total");
  const uint64_t memd_dropped = value("dhs_memd_kv_events_dropped_total");
  // Event 0 (AllBlocksCleared) was published at memd's start, to nobody: this subscriber joined after it.
  while (received + 1 < published) {
    auto b = sub->Next(5000ms);
    ASSERT_TRUE(b.ok() && b->has_value()) << "received " << received << " of " << published - 1;
    check.Next(**b);
    received += (*b)->events.size();
  }
  EXPECT_EQ(received + 1, published);
  EXPECT_LE(check.lost(), memd_dropped);
  std::printf("kv events: %llu published, %llu dropped, the subscriber saw %llu and %llu missing\n",
              static_cast<unsigned long long>(published), static_cast<unsigned long long>(memd_dropped),
              static_cast<unsigned long long>(received), static_cast<unsigned long long>(check.lost()));
}

// `dhsctl events --json` (the consumer example, tools/dhsctl/events_command.h) prints the stream's first batch's
// header and each event as a JSON line; `dhsctl events` without a stream exits 1.
TEST_F(MemdKvEvents, DhsctlEventsPrintsJsonLines) {
  const std::string cmd = "timeout -s KILL 30 " + std::string(DHSCTL_BIN) + " --run-dir " + run_dir_ +
                          " --json events --count 2";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  const std::string subscribed = MetricsWith("dhs_memd_kv_events_subscriptions_total 1");
  EXPECT_NE(subscribed.find("dhs_memd_kv_events_subscriptions_total 1\n"), std::string::npos) << subscribed;
  FakeWorker w(run_dir_, 0);
  ASSERT_TRUE(w.Hello(32).accepted);
  Cycle(w, w.Id(1), {11, 12}, true, false);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = pclose(f);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  std::vector<json> lines;
  for (size_t at = 0; at < out.size();) {
    const size_t end = out.find('\n', at);
    lines.push_back(json::parse(out.substr(at, end - at), nullptr, false));
    at = end == std::string::npos ? out.size() : end + 1;
  }
  ASSERT_EQ(lines.size(), 3u) << out;
  EXPECT_EQ(lines[0]["first_seq"], 1) << out;
  EXPECT_EQ(lines[0]["node"], std::filesystem::canonical(run_dir_).string());
  const uint64_t t = TenantHash("");
  const std::vector<uint64_t> c = ChainHashes("", {11, 12});
  auto hex = [](uint64_t v) { return absl::StrFormat("%016x", v); };
  EXPECT_EQ(lines[1]["seq"], 1);
  EXPECT_EQ(lines[1]["kind"], "stored");
  EXPECT_EQ(lines[1]["medium"], "host");
  EXPECT_EQ(lines[1]["tenant"], hex(t));
  EXPECT_EQ(lines[1]["block_hash"], hex(c[0]));
  EXPECT_EQ(lines[1]["parent_hash"], hex(t));
  EXPECT_EQ(lines[1]["blocks"], 1);
  EXPECT_EQ(lines[1]["block_tokens"], 32);
  EXPECT_EQ(lines[1]["pages"], 2);
  EXPECT_EQ(lines[2]["seq"], 2);
  EXPECT_EQ(lines[2]["block_hash"], hex(c[1]));
  EXPECT_EQ(lines[2]["parent_hash"], hex(c[0]));
  EXPECT_EQ(lines[2]["blocks"], 2);
  // No stream: exit 1, naming the socket.
  auto [rc, err] = RunShell(std::string(DHSCTL_BIN) + " --run-dir " + dir_ + " events --count 1");
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("no KV event stream at " + dir_ + "/kv-events.sock"), std::string::npos) << err;
  // A stale socket (a stopped memd leaves its file; nothing listens): exit 1 at once, never a silent wait.
  const std::string stale = dir_ + "/kv-events.sock";
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, stale.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0) << std::strerror(errno);
  close(fd);  // the file stays, nothing listens
  auto [rc2, err2] = RunShell("timeout 20 " + std::string(DHSCTL_BIN) + " --run-dir " + dir_ + " events --count 1");
  EXPECT_EQ(rc2, 1) << err2;
  EXPECT_NE(err2.find("nothing listens on " + stale), std::string::npos) << err2;
  std::filesystem::remove(stale);
}

}  // namespace
}  // namespace dhs
