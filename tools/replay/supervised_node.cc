// tools/replay/supervised_node.cc: see supervised_node.h.
#include "tools/replay/supervised_node.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/host_pool.h"
#include "common/protocol.h"
#include "common/spawn.h"
#include "common/transport.h"
#include "nlohmann/json.hpp"
#include "tools/node/node_process.h"
#include "tools/replay/host_ledger.h"
#include "tools/replay/zmq_node_client.h"

namespace dhs::replay {
namespace {

using node::Supervisor;
using node::SupervisorOrder;
constexpr size_t kWorker = 1;
constexpr char kSender[] = "dhs-replay-supervisor";
constexpr std::chrono::milliseconds kAskTimeout{1000};
constexpr uint64_t kClientBits = kNodeRequestCounterEnd - 1;  // n of a node request id (common/types.h)

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Log(const std::string& line) { std::cerr << "dhs-replay: " << line << "\n" << std::flush; }

// The last non-empty line of the log at `path` (at most its last 64 KiB read), or "(no log)".
std::string LastLogLine(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "(no log)";
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 65536);
  f.seekg(from);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const size_t nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

// One request/reply on a fresh connection to <run_dir>/<name>.sock; nullopt on any failure within kAskTimeout.
std::optional<Message> Ask(const std::string& run_dir, const std::string& name, const std::string& request,
                           std::string& storage) {
  auto client = DealerClient::Connect(IpcEndpoint(run_dir, name));
  if (!client.ok()) return std::nullopt;
  (*client)->SetLinger(std::chrono::milliseconds(0));
  absl::StatusOr<std::string> reply = (*client)->Request(request, kAskTimeout);
  if (!reply.ok()) return std::nullopt;
  storage = *std::move(reply);
  absl::StatusOr<Message> m = DecodeEnvelope(storage);
  if (!m.ok()) return std::nullopt;
  return *m;
}

// memd's JSON view `what` (for kRequest: of request `id`); nullopt when memd does not answer.
std::optional<nlohmann::json> AskMemd(const std::string& run_dir, wire::IntrospectWhat what, RequestId id = 0) {
  wire::IntrospectQueryT q;
  q.what = what;
  q.request = id;
  q.format = wire::IntrospectFormat::Json;
  std::string storage;
  std::optional<Message> m = Ask(run_dir, "memd", EncodeIntrospectQuery(q, 1, kSender), storage);
  if (!m || m->type != wire::Body::IntrospectReply) return std::nullopt;
  absl::StatusOr<wire::IntrospectReplyT> reply = ReadIntrospectReply(*m);
  if (!reply.ok()) return std::nullopt;
  nlohmann::json doc = nlohmann::json::parse(reply->document, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return std::nullopt;
  return doc;
}

std::optional<wire::WorkerStatsReplyT> AskWorker(const std::string& run_dir) {
  wire::WorkerStatsQueryT q;
  std::string storage;
  std::optional<Message> m = Ask(run_dir, "worker-0", EncodeWorkerStatsQuery(q, 1, kSender), storage);
  if (!m || m->type != wire::Body::WorkerStatsReply) return std::nullopt;
  absl::StatusOr<wire::WorkerStatsReplyT> stats = ReadWorkerStatsReply(*m);
  if (!stats.ok()) return std::nullopt;
  return *stats;
}

// FNV-1a over the page's bytes, 64 bits (a changed byte changes it; collisions are negligible at these counts).
uint64_t PageDigest(const uint8_t* data, uint64_t bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < bytes; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

// The /dev/shm object memd `pid` maps (its host pool), from /proc/<pid>/maps; "" when none.
std::string SegmentOf(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::string line;
  const std::string dir = std::string(kHostPoolShmDir) + "/";
  while (std::getline(maps, line)) {
    const size_t at = line.find(dir);
    if (at != std::string::npos) return line.substr(at + dir.size());
  }
  return "";
}

// (history page, host page) pairs of a `request N` view's host_copies.
// memd's `requests` view: node request id -> state ("admitted", "interrupted", ...); malformed entries are skipped.
std::map<RequestId, std::string> ListedRequests(const nlohmann::json& requests) {
  std::map<RequestId, std::string> out;
  if (!requests.is_array()) return out;
  for (const nlohmann::json& r : requests) {
    if (r.is_object() && r.contains("request") && r["request"].is_number_unsigned()) {
      out[r["request"].get<RequestId>()] = r.value("state", "");
    }
  }
  return out;
}

std::map<uint32_t, PageIndex> HostCopiesOf(const nlohmann::json& view) {
  std::map<uint32_t, PageIndex> out;
  if (!view.is_object() || !view.contains("host_copies") || !view["host_copies"].is_array()) return out;
  for (const nlohmann::json& c : view["host_copies"]) {
    if (c.is_array() && c.size() == 2 && c[0].is_number_unsigned() && c[1].is_number_unsigned()) {
      out[c[0].get<uint32_t>()] = c[1].get<PageIndex>();
    }
  }
  return out;
}

}  // namespace

node::SupervisorPolicy SupervisedNodeOptions::ChaosPolicy() {
  node::SupervisorPolicy p;
  p.backoff_initial_ms = 100;
  p.backoff_max_ms = 2000;
  p.backoff_reset_ms = 2000;
  p.max_restarts = 1000000;
  p.restart_window_ms = 1000;
  p.stop_grace_ms = 5000;
  p.start_timeout_ms = 60000;
  p.probe_interval_ms = 50;
  // Its faults kill the children on purpose: a child killed before it was ready is restarted, and a worker busy with
  // a long CPU step is not probed into a SIGKILL (issue 22's worker liveness is dhs-node's).
  p.fail_fast = false;
  p.worker_liveness_timeout_ms = 0;
  return p;
}

// The loop's state (the two cores, the children's pids, the mapped pool and the ledger) and its steps. Runs on the
// supervision thread only; `node` is read for its options and run directory and written under its mutex.
struct SupervisedNode::Runtime {
  Runtime(SupervisedNode& n)
      : node(n), sup(n.options_.policy, {"memd", "worker gpu 0"}), plan(n.options_.faults) {}

  bool ExecuteSupervisorOrders();  // true once kExit was executed
  void StartChild(size_t child);
  void Reap();
  void ObserveReadiness();
  void ExecuteFaultOrders();
  void Sample();
  void ObserveCoverage(RequestId id, const nlohmann::json& view, const std::map<uint32_t, PageIndex>& confirmed);
  void AfterWorkerDeath();
  void CheckAgainstMemd(bool interrupted_only);
  std::optional<bool> Gpu0Up() const;
  void MapPool();
  void RemoveLeftoverPool();
  void Corrupt();
  std::optional<uint64_t> Digest(PageIndex host_page) const;
  void Publish();

  SupervisedNode& node;
  Supervisor sup;
  FaultPlan plan;
  pid_t pids[2] = {-1, -1};
  bool was_ready[2] = {false, false};
  bool terminating = false;
  bool faults_stopped = false;
  bool worker_kill_sent = false;    // the worker's death is timed at the kill (not at its reaping)
  bool memd_check_pending = false;  // memd restarted: check the ledger once the new one serves
  // memd restarted under a surviving worker: check the ledger once its re-Hello registered GPU 0 again (issue 24: the
  // shared prefix pages its requests hold come back as references with its report, not from the journal).
  bool rehello_check_pending = false;
  bool corrupted = false;
  bool worker_stopped = false;  // the supervisor signalled the worker (it did not die by itself or by a fault)
  pid_t memd_of_worker = -1;    // the memd the worker started under
  std::string armed;            // the worker's --fault-kill-at ("" none)
  std::unique_ptr<HostPoolSegment> pool;
  std::string segment;  // the /dev/shm name of memd's pool, once seen mapped (the same for every memd of the run dir)
  HostLedger ledger;
  std::map<std::pair<RequestId, uint32_t>, PageIndex> host_page_of;  // (node, page) -> host page, last sample
  int64_t last_sample = 0;
  uint64_t worker_crashes = 0;  // worker ends other than SIGKILL (the tool kills only by SIGKILL)
  std::string last_crash;
  uint64_t worker_deaths = 0, resumed = 0, recomputed = 0, hooks_armed = 0, fence_timeouts = 0;
  std::optional<NodeStats> live_worker_counters;  // the running worker's, sampled (Sample, before a kill)
  NodeStats dead_worker_counters;                 // summed over the workers that died
  void SampleWorker();
  std::vector<std::chrono::steady_clock::time_point> down_at;
};

void SupervisedNode::Loop() {
  Runtime rt(*this);
  rt.sup.Begin(NowMs());
  while (!rt.ExecuteSupervisorOrders()) {
    rt.Reap();
    if (stop_ && !rt.terminating) {
      rt.terminating = true;
      rt.plan.Stop();
      rt.sup.Terminate(NowMs());
      continue;
    }
    if (stop_faults_ && !rt.faults_stopped) {
      rt.faults_stopped = true;
      rt.plan.Stop();
      std::lock_guard<std::mutex> lock(mu_);
      faults_stopped_ = true;
      cv_.notify_all();
    }
    rt.ObserveReadiness();
    rt.plan.Timer(NowMs());
    rt.ExecuteFaultOrders();
    if (!rt.terminating && NowMs() - rt.last_sample >= options_.sample_interval.count()) rt.Sample();
    rt.sup.Timer(NowMs());
    rt.Publish();
    const int64_t wake = std::min(rt.sup.NextWakeupMs(), rt.plan.NextWakeupMs());
    std::this_thread::sleep_for(std::chrono::milliseconds(std::clamp<int64_t>(wake - NowMs(), 1, 10)));
  }
  if (rt.terminating) rt.RemoveLeftoverPool();
  rt.Publish();
}

bool SupervisedNode::Runtime::ExecuteSupervisorOrders() {
  using Kind = SupervisorOrder::Kind;
  for (std::vector<SupervisorOrder> orders = sup.DrainOrders(); !orders.empty(); orders = sup.DrainOrders()) {
    for (const SupervisorOrder& o : orders) {
      switch (o.kind) {
        case Kind::kStart: StartChild(o.child); break;
        case Kind::kSignal:
          if (pids[o.child] > 0) ::kill(pids[o.child], o.signal);
          if (o.child == kWorker) worker_stopped = true;  // stopped on purpose (memd went away, or the end)
          break;
        case Kind::kProbe: {
          const std::string& dir = node.run_dir_;
          const bool ready = o.child == Supervisor::kMemd
                                 ? node::ProbeMemd(dir, std::nullopt, node::kProbeTimeout)
                                 : node::ProbeWorker(dir, 0, node::kProbeTimeout) &&
                                       node::ProbeMemd(dir, GpuId{0}, node::kProbeTimeout);
          sup.ProbeResult(o.child, ready, NowMs());
          ObserveReadiness();  // before the orders this answer causes (a memd check precedes the worker's start)
          break;
        }
        case Kind::kReady: {
          std::lock_guard<std::mutex> lock(node.mu_);
          node.ready_ = true;
          node.cv_.notify_all();
          break;
        }
        case Kind::kLog:
        case Kind::kLogTail: Log(o.message); break;
        case Kind::kExit: {
          std::lock_guard<std::mutex> lock(node.mu_);
          node.exited_ = true;
          node.exit_message_ = o.message;
          node.cv_.notify_all();
          if (!terminating) Log(o.message);
          return true;
        }
      }
    }
  }
  return false;
}

void SupervisedNode::Runtime::StartChild(size_t child) {
  const NodeLaunchOptions& launch = node.options_.launch;
  const bool memd = child == Supervisor::kMemd;
  std::vector<std::string> args = memd ? MemdArgs(launch, node.run_dir_) : WorkerArgs(launch, node.run_dir_);
  std::string spec;  // the worker's --fault-kill-at
  if (!memd) {
    if (std::optional<FaultKill> kill = plan.WorkerFaultForStart()) {
      spec = FormatFaultKill(*kill);
      args.insert(args.end(), {"--fault-kill-at", spec});
      ++hooks_armed;
      Log(absl::StrCat("worker start ", sup.starts(kWorker), " armed with --fault-kill-at ", spec));
    }
  }
  const std::string log = NodeLogPath(node.run_dir_, memd ? "memd" : "workerd", launch.log_tag);
  absl::StatusOr<pid_t> pid = SpawnChild(memd ? launch.memd_path : launch.workerd_path, args,
                                         SpawnOptions{.log = log, .append_log = true, .drop_notify_socket = true});
  if (!pid.ok()) {
    Log(std::string(pid.status().message()));
    sup.Exited(child, 127 << 8, NowMs());
    return;
  }
  pids[child] = *pid;
  if (!memd) {
    worker_stopped = false;
    memd_of_worker = pids[Supervisor::kMemd];
    armed = spec;
  }
}

FaultStats SupervisedNode::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

absl::StatusOr<std::unique_ptr<SupervisedNode>> SupervisedNode::Start(const SupervisedNodeOptions& options) {
  const NodeLaunchOptions& launch = options.launch;
  for (const std::string* path : {&launch.memd_path, &launch.workerd_path}) {
    if (path->empty() || ::access(path->c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("not an executable: '", *path, "'"));
    }
  }
  if (launch.page_bytes == 0 || launch.hbm_budget_bytes == 0 || launch.host_pool_bytes == 0) {
    return absl::InvalidArgumentError("page bytes, HBM budget and host pool size must be > 0");
  }
  std::unique_ptr<SupervisedNode> node(new SupervisedNode(options));
  absl::StatusOr<std::string> dir = CreateRunDir(launch, node->owns_run_dir_);
  if (!dir.ok()) return dir.status();
  node->run_dir_ = *dir;
  node->stats_.seed = options.faults.seed;
  node->thread_ = std::thread([n = node.get()] { n->Loop(); });
  std::unique_lock<std::mutex> lock(node->mu_);
  const bool settled = node->cv_.wait_for(lock, std::chrono::milliseconds(options.policy.start_timeout_ms + 5000),
                                          [&] { return node->ready_ || node->exited_; });
  if (settled && node->ready_) return node;
  const std::string why = node->exited_ ? node->exit_message_ : "not ready in time";
  lock.unlock();
  node->keep_run_dir();
  DHS_CHECK_OK(node->Stop());  // its only error is removing the run directory, which it now keeps: cannot fail
  return absl::UnavailableError(absl::StrCat("the node did not start: ", why, "; see ",
                                             NodeLogPath(node->run_dir_, "memd", launch.log_tag), " and ",
                                             NodeLogPath(node->run_dir_, "workerd", launch.log_tag),
                                             " (the run directory is kept)"));
}

SupervisedNode::~SupervisedNode() {
  if (absl::Status s = Stop(); !s.ok()) Log(absl::StrCat("stopping the node: ", s.message()));
}

void SupervisedNode::StopFaults() {
  stop_faults_ = true;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::seconds(2), [&] { return faults_stopped_ || exited_; });
}

absl::Status SupervisedNode::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (owns_run_dir_ && !run_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(run_dir_, ec);
    owns_run_dir_ = false;
    if (ec) return absl::InternalError(absl::StrCat("cannot remove the run directory ", run_dir_, ": ", ec.message()));
  }
  return absl::OkStatus();
}

void SupervisedNode::Runtime::Reap() {
  for (size_t c : {Supervisor::kMemd, kWorker}) {
    int status = 0;
    if (pids[c] <= 0 || ::waitpid(pids[c], &status, WNOHANG) != pids[c]) continue;
    pids[c] = -1;
    const int64_t now = NowMs();
    const bool memd_ready = was_ready[Supervisor::kMemd];
    was_ready[c] = false;
    sup.Exited(c, status, now);
    if (terminating) continue;
    if (c == kWorker) {
      plan.WorkerExited(now);
      ++worker_deaths;
      if (live_worker_counters) AddWorkerCounters(dead_worker_counters, *live_worker_counters);
      live_worker_counters.reset();
      if (!worker_kill_sent) down_at.push_back(std::chrono::steady_clock::now());
      worker_kill_sent = false;
      Log(absl::StrCat("worker exited (", DescribeWaitStatus(status), ")",
                       armed.empty() ? "" : absl::StrCat(", armed with --fault-kill-at ", armed)));
      // Every death the tool causes is a SIGKILL (timed kills, kill points): any other end is a crash (issue 28: the
      // asynchronous device's read hazard aborts), which a restart must not hide. Its log's last line says why.
      if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
        ++worker_crashes;
        last_crash = absl::StrCat(DescribeWaitStatus(status), ": ",
                                  LastLogLine(NodeLogPath(node.run_dir_, "workerd", node.options_.launch.log_tag)));
        Log(absl::StrCat("worker crashed: ", last_crash));
      }
      // A worker that died under the memd it registered with: that memd fences its GPU and keeps its requests.
      if (memd_ready && !worker_stopped && pids[Supervisor::kMemd] > 0 &&
          pids[Supervisor::kMemd] == memd_of_worker) {
        AfterWorkerDeath();
      }
    } else {
      plan.MemdExited(now);
      pool.reset();
      memd_check_pending = true;
      Log(absl::StrCat("memd exited (", DescribeWaitStatus(status), ")"));
    }
  }
}

void SupervisedNode::Runtime::ObserveReadiness() {
  for (size_t c : {Supervisor::kMemd, kWorker}) {
    const bool ready = sup.state(c) == node::ChildState::kReady;
    if (ready == was_ready[c]) continue;
    was_ready[c] = ready;
    if (!ready) continue;
    if (c == Supervisor::kMemd) {
      MapPool();
      if (memd_check_pending) {  // the new memd serves; the worker starts only after this
        memd_check_pending = false;
        if (terminating) {
          // The node is stopping: the worker ends its requests ("worker stopping") and memd frees their pages, so
          // what memd lists no longer says what a restart kept.
          Log("host_rows_lost: memd came back while the node stops; this restart's host pages are not checked");
        } else if (sup.state(kWorker) == node::ChildState::kReady) {
          rehello_check_pending = true;  // Sample checks once GPU 0 is up again
        } else {
          CheckAgainstMemd(/*interrupted_only=*/false);
        }
      }
      plan.MemdReady(NowMs());
    } else {
      if (std::optional<wire::WorkerStatsReplyT> s = AskWorker(node.run_dir_)) {  // its resumes happened at its start
        resumed += s->requests_resumed;
        recomputed += s->rows_recomputed;
      }
      plan.WorkerReady(NowMs());
    }
  }
}

void SupervisedNode::Runtime::ExecuteFaultOrders() {
  for (const FaultOrder& o : plan.DrainOrders()) {
    const size_t c = o.kind == FaultOrder::Kind::kKillWorker ? kWorker : Supervisor::kMemd;
    if (pids[c] <= 0) continue;
    Sample();  // the latest digests before the kill
    if (node.options_.corrupt_host_pages && !corrupted) Corrupt();
    if (c == kWorker) {
      worker_kill_sent = true;
      down_at.push_back(std::chrono::steady_clock::now());
    }
    ::kill(pids[c], SIGKILL);
    Log(absl::StrCat("fault: SIGKILL ", c == kWorker ? "worker" : "memd", " (pid ", pids[c], ")"));
  }
}

void SupervisedNode::Runtime::MapPool() {
  pool.reset();
  const std::string name = SegmentOf(pids[Supervisor::kMemd]);
  if (name.empty()) {
    Log("host_rows_lost: memd maps no /dev/shm segment; host pages are not checked");
    return;
  }
  absl::StatusOr<std::unique_ptr<HostPoolSegment>> seg = HostPoolSegment::Open(name);
  if (!seg.ok()) {
    Log(absl::StrCat("host_rows_lost: cannot map ", name, ": ", seg.status().message()));
    return;
  }
  pool = *std::move(seg);
  segment = name;
}

// Issue 26 review: the node's final stop, every child exited. A memd stopped by SIGTERM removes its pool; one that was
// dead then (SIGKILLed by a fault, its restart still in backoff, cancelled by the stop) left it in /dev/shm, where
// only a later memd of this run directory would adopt or sweep it. The run is over: remove it, as the clean stop would
// (only a segment whose header names this node's run directory).
void SupervisedNode::Runtime::RemoveLeftoverPool() {
  pool.reset();
  if (segment.empty() || pids[Supervisor::kMemd] > 0) return;
  std::error_code ec;
  const std::string dir = std::filesystem::canonical(node.run_dir_, ec).string();
  if (ec) return;
  {
    absl::StatusOr<std::unique_ptr<HostPoolSegment>> seg = HostPoolSegment::Open(segment);
    if (!seg.ok() || (*seg)->owner_tag() != dir) return;  // removed by memd's clean stop (NOT_FOUND), or not ours
  }
  if (absl::Status s = HostPoolSegment::Remove(segment); s.ok()) {
    Log(absl::StrCat("removed /dev/shm/", segment, ": the host pool of a memd that was dead at the node's stop"));
  } else if (!absl::IsNotFound(s)) {
    Log(absl::StrCat("cannot remove /dev/shm/", segment, ": ", s.message()));
  }
}

std::optional<uint64_t> SupervisedNode::Runtime::Digest(PageIndex host_page) const {
  absl::StatusOr<uint8_t*> data = pool->PageData(host_page);
  if (!data.ok()) return std::nullopt;
  return PageDigest(*data, pool->page_bytes());
}

void SupervisedNode::Runtime::SampleWorker() {
  if (!was_ready[kWorker]) return;
  if (std::optional<wire::WorkerStatsReplyT> s = AskWorker(node.run_dir_)) live_worker_counters = WorkerCountersOf(*s);
}

// Digests of the confirmed host copies of every live request, each page listed before and after its digest.
// Issue 28: the pages of node request `id` that should hold a confirmed host copy by the rows the client saw
// computed (below the worker's tail window), against the confirmed copies and the GPU pages of memd's view.
void SupervisedNode::Runtime::ObserveCoverage(RequestId id, const nlohmann::json& view,
                                              const std::map<uint32_t, PageIndex>& confirmed) {
  const SupervisedNodeOptions& o = node.options_;
  if (!o.rows_computed || o.tail_rows == 0 || o.page_rows == 0) return;
  // An interrupted request (its worker died, memd fenced the GPU) keeps only its confirmed host copies: its pages that
  // were on the dead GPU alone (deferred backups, the tail) are recomputed by the resume, not missing confirmations.
  if (view.contains("state") && view["state"] == "interrupted") return;
  const int64_t rows = o.rows_computed(id & kClientBits);
  const int64_t window = (o.tail_rows + o.page_rows - 1) / o.page_rows + 1;
  const int64_t due = rows / o.page_rows - window;
  if (due <= 0) return;
  CoverageSeen seen{id, id & kClientBits, static_cast<uint32_t>(due), 0, 0};
  for (const auto& [page, host_page] : confirmed) seen.confirmed_due += page < seen.due_pages;
  if (view.contains("a_r") && view["a_r"].is_number_unsigned()) seen.on_gpu = view["a_r"].get<uint32_t>();
  ledger.ObserveCoverage(seen);
}

void SupervisedNode::Runtime::Sample() {
  last_sample = NowMs();
  SampleWorker();
  if (!pool || !was_ready[Supervisor::kMemd]) return;
  if (rehello_check_pending && Gpu0Up().value_or(false)) {
    rehello_check_pending = false;
    CheckAgainstMemd(/*interrupted_only=*/false);
  }
  std::optional<nlohmann::json> requests = AskMemd(node.run_dir_, wire::IntrospectWhat::Requests);
  if (!requests || !requests->is_array()) return;
  std::set<RequestId> live;  // node ids
  for (const auto& [id, state] : ListedRequests(*requests)) {
    live.insert(id);
    std::optional<nlohmann::json> before = AskMemd(node.run_dir_, wire::IntrospectWhat::Request, id);
    if (!before) continue;
    std::vector<std::pair<uint32_t, uint64_t>> digests;
    const std::map<uint32_t, PageIndex> copies = HostCopiesOf(*before);
    for (const auto& [page, host_page] : copies) {
      if (std::optional<uint64_t> d = Digest(host_page)) digests.emplace_back(page, *d);
    }
    std::optional<nlohmann::json> after = AskMemd(node.run_dir_, wire::IntrospectWhat::Request, id);
    if (!after) continue;
    const std::map<uint32_t, PageIndex> still = HostCopiesOf(*after);
    ObserveCoverage(id, *after, still);
    for (const auto& [page, digest] : digests) {
      auto it = still.find(page);
      if (it == still.end() || it->second != copies.at(page)) continue;
      ledger.Observe(HostCopySeen{id, id & kClientBits, page, digest});
      host_page_of[{id, page}] = it->second;
    }
  }
  for (RequestId node : ledger.nodes()) {
    if (!live.contains(node)) ledger.Forget(node);  // ended: memd freed its pages
  }
}

// The worker died: once memd fenced its GPU, every recorded page of each interrupted request must still be held.
void SupervisedNode::Runtime::AfterWorkerDeath() {
  rehello_check_pending = false;  // no re-Hello: its interrupted requests are checked here
  const int64_t deadline = NowMs() + node.options_.fence_timeout.count();
  while (true) {
    if (!Gpu0Up().value_or(true)) break;  // fenced
    if (NowMs() >= deadline) {
      ++fence_timeouts;
      Log("host_rows_lost: memd did not show GPU 0 fenced in time; this death's host pages are not checked");
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CheckAgainstMemd(/*interrupted_only=*/true);
}

// Whether memd's `gpus` view shows GPU 0 registered (up) or fenced (down); nullopt: no answer, or not listed.
std::optional<bool> SupervisedNode::Runtime::Gpu0Up() const {
  std::optional<nlohmann::json> gpus = AskMemd(node.run_dir_, wire::IntrospectWhat::Gpus);
  if (!gpus || !gpus->is_array()) return std::nullopt;
  for (const nlohmann::json& g : *gpus) {
    if (g.value("gpu", 1u) == 0) return g.value("up", true);
  }
  return std::nullopt;
}

// The pages held by the interrupted requests (after a worker death), or by every request recorded (after a memd
// restart), against the host copies memd holds now.
void SupervisedNode::Runtime::CheckAgainstMemd(bool interrupted_only) {
  if (!pool) return;
  std::optional<nlohmann::json> requests = AskMemd(node.run_dir_, wire::IntrospectWhat::Requests);
  if (!requests || !requests->is_array()) return;
  std::set<RequestId> nodes = interrupted_only ? std::set<RequestId>{} : ledger.nodes();
  std::vector<HostCopySeen> present;
  const std::map<RequestId, std::string> listed = ListedRequests(*requests);
  const node::ChildState worker_state = sup.state(kWorker);
  if (!interrupted_only &&
      (worker_state == node::ChildState::kReady || worker_state == node::ChildState::kStopping)) {
    // The worker survived the memd restart (issue 11: its re-Hello; alive, ready or being stopped) and may have
    // completed requests since: the new memd lists every request the journal or a report kept, so one it does not
    // list ended and its pages were freed.
    for (RequestId id : ledger.nodes()) {
      if (!listed.contains(id)) ledger.Forget(id);
    }
    nodes = ledger.nodes();
  }
  std::set<RequestId> unread;  // listed, but the view could not be read (ended since the listing, or no answer)
  for (const auto& [id, state] : listed) {
    if (interrupted_only && state != "interrupted") continue;
    if (interrupted_only) nodes.insert(id);
    std::optional<nlohmann::json> view = AskMemd(node.run_dir_, wire::IntrospectWhat::Request, id);
    if (!view || !view->contains("host_copies")) {
      unread.insert(id);
      continue;
    }
    for (const auto& [page, host_page] : HostCopiesOf(*view)) {
      if (std::optional<uint64_t> d = Digest(host_page)) present.push_back({id, id & kClientBits, page, *d});
    }
  }
  // The check is a listing then one view per request: a request that ended in between (a surviving worker's Complete
  // right after its re-Hello) has no view; memd's listing now says whether it ended (host_ledger.h).
  std::set<RequestId> listed_after;
  if (!unread.empty()) {
    std::optional<nlohmann::json> again = AskMemd(node.run_dir_, wire::IntrospectWhat::Requests);
    // No answer: nothing is taken as ended.
    for (const auto& [id, state] : again ? ListedRequests(*again) : listed) listed_after.insert(id);
    for (RequestId id : unread) {
      Log(absl::StrCat("host_rows_lost: request ", id, "'s view could not be read; ",
                       listed_after.contains(id) ? "still listed: not checked this time" : "it ended meanwhile"));
    }
  }
  const std::vector<std::pair<RequestId, uint32_t>> lost = ledger.CheckAfterFault(nodes, present, unread, listed_after);
  if (!lost.empty()) {
    std::string which;
    for (const auto& [client, page] : lost) absl::StrAppend(&which, which.empty() ? "" : ", ", client, ":", page);
    Log(absl::StrCat("host_rows_lost: ", lost.size(), " recorded host pages changed or vanished (client:page ", which,
                     "; ", ledger.pages_vanished(), " vanished, ", ledger.pages_changed(), " changed in all)"));
  }
}

// Test-only: flips one byte of one recorded host page of EVERY recorded request (a real corruption of the mapped
// pool). One page of each: a request that ends between the latest sample and the kill (its pages freed, not counted)
// cannot leave the corruption unseen while another request is interrupted by the kill.
void SupervisedNode::Runtime::Corrupt() {
  if (!pool || host_page_of.empty()) return;
  std::set<RequestId> flipped;
  for (const auto& [key, host_page] : host_page_of) {
    if (flipped.contains(key.first) || !ledger.nodes().contains(key.first)) continue;
    absl::StatusOr<uint8_t*> data = pool->PageData(host_page);
    if (!data.ok()) continue;
    (*data)[0] ^= 0xFF;
    corrupted = true;
    flipped.insert(key.first);
    Log(absl::StrCat("TEST ONLY: flipped byte 0 of host page ", host_page, " (request ", key.first, ", history page ",
                     key.second, ")"));
  }
}

void SupervisedNode::Runtime::Publish() {
  std::lock_guard<std::mutex> lock(node.mu_);
  FaultStats& s = node.stats_;
  s.worker_restarts = sup.starts(kWorker) > 0 ? sup.starts(kWorker) - 1 : 0;
  s.memd_restarts = sup.starts(Supervisor::kMemd) > 0 ? sup.starts(Supervisor::kMemd) - 1 : 0;
  s.worker_kills = plan.worker_kills();
  s.memd_kills = plan.memd_kills();
  s.worker_deaths = worker_deaths;
  s.worker_crashes = worker_crashes;
  s.last_crash = last_crash;
  s.hook_kills_armed = hooks_armed;
  s.requests_resumed = resumed;
  s.rows_recomputed = recomputed;
  s.host_pages_recorded = ledger.pages_recorded();
  s.host_pages_checked = ledger.pages_checked();
  s.host_pages_lost = ledger.pages_lost();
  s.host_rows_lost = ledger.pages_lost() * node.options_.page_rows;
  s.host_pages_unconfirmed = ledger.pages_unconfirmed();
  s.fence_timeouts = fence_timeouts;
  s.worker_down_at = down_at;
  s.dead_worker_counters = dead_worker_counters;
}

}  // namespace dhs::replay
