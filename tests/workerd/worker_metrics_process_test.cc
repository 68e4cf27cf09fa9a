// tests/workerd/worker_metrics_process_test.cc: issue 22's worker metrics and request timelines, on the real memd,
// workerd and dhsctl executables in a private run directory.
// - A worker in adaptive mode under a GPU budget that forces reclaims serves requests; its GET /metrics (workerd
//   --metrics-address) is scraped over HTTP and equals what the clients observed: tokens, requests, the TTFT / TPOT /
//   admission-wait histograms' counts (and the TTFT sum bounded by the clients' TTFTs), the census summed over its tiers
//   equals the selected rows of every query the requests fed (brief §5: min(k, t + 1) non-padding rows per query and
//   index producer), and `dhsctl worker-stats --json` says the same. A request memd refuses (it can never fit) is
//   counted as one failure under its error code's name. Every metric memd and the worker serve is documented in
//   docs/operations.md with its type (the doc's metric tables parsed).
// - `dhsctl request --client ID` finds a request across a worker restart (SIGKILL mid-decode, restart, resume): memd's
//   events of both epochs (admitted, granted, interrupted, resumed; admitted as a resume, granted, completed) and the
//   restarted worker's (submitted, first_token, end).
#include <signal.h>
#include <sys/wait.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "common/host_pool.h"
#include "common/protocol.h"
#include "common/transport.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "memd/pool_segment.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"
#include "tests/workerd/worker_test_util.h"
#include "workerd/geometry.h"

namespace dhs::test {
namespace {

using dhs::testing::ChildProcess;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr uint32_t kPageRows = 16;
constexpr uint32_t kPromptTokens = 40;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A Prometheus scrape: series ("name{labels}") -> value, and family name -> type.
struct Scrape {
  std::map<std::string, double> series;
  std::map<std::string, std::string> types;
  double at(const std::string& s) const {
    auto it = series.find(s);
    return it == series.end() ? -1 : it->second;
  }
};

Scrape Parse(const std::string& text) {
  Scrape out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream t(line.substr(7));
      std::string name, type;
      t >> name >> type;
      out.types[name] = type;
    } else if (!line.empty() && line[0] != '#') {
      const size_t sp = line.rfind(' ');
      out.series[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
    }
  }
  return out;
}

// GET http://ADDRESS/metrics, ADDRESS from RUN_DIR/NAME.metrics (written by the daemon once bound).
std::string Get(const std::string& address_file) {
  std::string address = ReadFile(address_file);
  while (!address.empty() && (address.back() == '\n')) address.pop_back();
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "";
  httplib::Client client(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  client.set_connection_timeout(5);
  auto res = client.Get("/metrics");
  return res && res->status == 200 ? res->body : "";
}

class Node {
 public:
  explicit Node(const std::string& run_dir) : run_dir_(run_dir), model_(MakePresetModel("glm5-like", 3)) {
    page_bytes_ = uint64_t{kPageRows} * model_->config().row_bytes() * model_->config().n_sources();
  }
  ~Node() {  // a SIGKILLed memd's pool (named by the run directory) is removed
    std::error_code ec;
    if (!std::filesystem::exists(run_dir_, ec)) return;
    HostPoolSegment::Remove(memd::PoolSegmentName(std::filesystem::canonical(run_dir_, ec).string())).IgnoreError();
  }
  static bool Available() {
    for (const char* v : {"MEMD", "WORKERD", "DHSCTL", "OPERATIONS_MD"}) {
      if (std::getenv(v) == nullptr || !std::filesystem::exists(std::getenv(v))) return false;
    }
    return true;
  }
  std::unique_ptr<ChildProcess> StartMemd() {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{std::getenv("MEMD"), "--run-dir", run_dir_, "--page-bytes",
                                 std::to_string(HostPageBytes(model_->config(), kPageRows)), "--host-pool-pages",
                                 "2048", "--metrics-address", "127.0.0.1:0", "--log-level", "info"},
        Log("memd"));
  }
  std::unique_ptr<ChildProcess> StartWorker(const std::string& log, uint64_t gpu_pages) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{std::getenv("WORKERD"), "--run-dir", run_dir_, "--gpu", "0", "--mode", "adaptive",
                                 "--preset", "glm5-like", "--seed", "3", "--page-rows", std::to_string(kPageRows),
                                 "--tail-rows", "32", "--slots", "2", "--hbm-budget",
                                 std::to_string(gpu_pages * page_bytes_), "--metrics-address", "127.0.0.1:0",
                                 "--log-level", "info"},
        Log(log));
  }
  uint32_t RequiredPages(uint32_t context) const {
    WorkerConfig wc;
    wc.mode = WorkerMode::kAdaptive;
    wc.page_rows = kPageRows;
    wc.tail_rows = 32;
    wc.slots = 2;
    wc.hbm_budget_bytes = uint64_t{1} << 30;
    const auto geo = ComputeGeometry(model_->config(), wc);
    EXPECT_TRUE(geo.ok()) << geo.status();
    return dhs::RequiredPages(model_->config(), *geo, wc.mode, context);
  }
  std::string Log(const std::string& name) const { return run_dir_ + "/" + name + ".log"; }
  std::string Logs() const {
    std::string out;
    for (const auto& e : std::filesystem::directory_iterator(run_dir_)) {
      if (e.path().extension() == ".log") out += "\n" + e.path().string() + ":\n" + ReadFile(e.path().string());
    }
    return out;
  }
  // `dhsctl --json ARGS`; null when dhsctl failed.
  json Dhsctl(const std::string& args) const {
    const std::string cmd = std::string(std::getenv("DHSCTL")) + " --run-dir " + run_dir_ + " --json " + args +
                            " 2>/dev/null";
    FILE* f = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    const int status = pclose(f);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return json();
    return json::parse(out, nullptr, false);
  }
  // dhsctl's text output of ARGS.
  std::string DhsctlText(const std::string& args) const {
    const std::string cmd = std::string(std::getenv("DHSCTL")) + " --run-dir " + run_dir_ + " " + args + " 2>&1";
    FILE* f = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    pclose(f);
    return out;
  }
  json WaitGpu0(bool up, int epoch, int timeout_ms = 20000) const {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Clock::now() < deadline) {
      for (const json& g : Dhsctl("gpus")) {
        if (g["gpu"] == 0 && g["up"] == up && g["epoch"] == epoch) return g;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return json();
  }
  std::unique_ptr<DealerClient> Client() const {
    auto c = DealerClient::Connect(IpcEndpoint(run_dir_, "worker-0"));
    EXPECT_TRUE(c.ok());
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->WaitPeerConnected(true, std::chrono::milliseconds(15000))) << "no worker" << Logs();
    return std::move(*c);
  }
  // A scrape of NAME (memd, worker-0) once its address file exists, until `ready` holds (the loop publishes after
  // each iteration: a client can see its final chunk an iteration before the scrape shows it), up to 10 s.
  Scrape ScrapeUntil(const std::string& name, const std::function<bool(const Scrape&)>& ready) const {
    const std::string file = run_dir_ + "/" + name + ".metrics";
    Scrape s;
    for (int i = 0; i < 500; ++i) {
      if (std::filesystem::exists(file)) {
        s = Parse(Get(file));
        if (!s.series.empty() && ready(s)) return s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return s;
  }
  const model::Model& model() const { return *model_; }

 private:
  std::string run_dir_;
  std::unique_ptr<model::Model> model_;
  uint64_t page_bytes_ = 0;
};

// What one client saw of a request.
struct Seen {
  size_t tokens = 0;
  bool finished = false;
  std::string error;
  wire::ErrorCode code = wire::ErrorCode::OK;
  uint64_t ttft_us = 0;
  uint64_t allocation_wait_us = 0;
};

void Submit(DealerClient& c, RequestId id, uint32_t salt, uint32_t max_new) {
  wire::SubmitRequestT s;
  s.request = id;
  s.prompt = Prompt(kPromptTokens, salt);
  s.max_new_tokens = max_new;
  ASSERT_TRUE(c.Send(EncodeSubmitRequest(s, id + 1, "replay")).ok());
}

// Reads `c`'s chunks into `seen` until `done` holds or `timeout_ms` passed.
void ReadUntil(DealerClient& c, std::map<RequestId, Seen>& seen, const std::function<bool()>& done, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done() && Clock::now() < deadline) {
    auto r = c.Receive(std::chrono::milliseconds(10));
    if (!r.ok()) continue;
    auto m = DecodeEnvelope(*r);
    if (!m.ok() || m->type != wire::Body::TokenChunk) continue;
    auto chunk = ReadTokenChunk(*m);
    Seen& s = seen[chunk->request];
    s.tokens += chunk->tokens.size();
    if (chunk->error != wire::ErrorCode::OK) {
      s.error = chunk->error_message;
      s.code = chunk->error;
    }
    if (chunk->finished) {
      s.finished = true;
      s.ttft_us = chunk->ttft_us;
      s.allocation_wait_us = chunk->allocation_wait_us;
    }
  }
}

// Selected rows of one request (brief §5): each query at position t (every position fed: the input, then each
// generated token but the last) selects min(k, t + 1) rows (the causal mask; -1 padding is not a row), once per
// index producer (a follower reuses its producer's selection).
uint64_t SelectedRows(const model::ModelConfig& mc, uint64_t fed) {
  uint64_t producers = 0;
  for (const auto& l : mc.layers) producers += l.kind == model::LayerKind::kProducer;
  uint64_t rows = 0;
  for (uint64_t t = 0; t < fed; ++t) rows += std::min<uint64_t>(mc.top_k, t + 1);
  return rows * producers;
}

// The metric tables of docs/operations.md: name (labels stripped) -> type, from rows "| `NAME{...}` | TYPE | ...".
std::map<std::string, std::string> DocumentedMetrics() {
  std::map<std::string, std::string> out;
  std::istringstream in(ReadFile(std::getenv("OPERATIONS_MD")));
  const std::regex row(R"(^\| `(dhs_[a-z0-9_]+)(\{[^`]*\})?` \| (counter|gauge|histogram) \|)");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) out[m[1]] = m[3];
  }
  return out;
}

void ExpectDocumented(const Scrape& s, const std::map<std::string, std::string>& doc, const std::string& who) {
  ASSERT_FALSE(s.types.empty()) << who;
  for (const auto& [name, type] : s.types) {
    auto it = doc.find(name);
    if (it == doc.end()) {
      ADD_FAILURE() << who << " serves " << name << " (" << type << "), not in docs/operations.md";
    } else {
      EXPECT_EQ(it->second, type) << who << ": " << name << " is documented as " << it->second;
    }
  }
}

TEST(WorkerMetrics, ScrapedMetricsEqualWhatTheClientsObserved) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl / docs";
  Node node(dir.path());
  // Requests 1 (long) and 2: M = r1 + r2 + 1 pages, so request 2's admission reclaims request 1's optional history
  // (adaptive, resident-first), as in worker_fence_process_test's KilledAdaptiveWorkerImportsEveryKeptPageAroundTheGaps.
  const std::map<RequestId, uint32_t> max_new = {{1, 120}, {2, 30}, {3, 12}, {4, 9}};
  const uint32_t m = node.RequiredPages(kPromptTokens + 120) + node.RequiredPages(kPromptTokens + 30) + 1;
  auto memd = node.StartMemd();
  auto worker = node.StartWorker("workerd", m);
  auto c = node.Client();
  ASSERT_TRUE(c);
  std::map<RequestId, Seen> seen;
  Submit(*c, 1, 1, max_new.at(1));
  ReadUntil(*c, seen, [&] { return seen[1].tokens >= 2; }, 30000);
  ASSERT_GE(seen[1].tokens, 2u) << node.Logs();
  for (RequestId id : {2, 3, 4}) Submit(*c, id, static_cast<uint32_t>(id), max_new.at(id));  // 3, 4 wait for a slot
  auto all_done = [&] {
    for (const auto& [id, n] : max_new) {
      if (!seen[id].finished) return false;
    }
    return true;
  };
  ReadUntil(*c, seen, all_done, 60000);
  ASSERT_TRUE(all_done()) << node.Logs();
  uint64_t tokens = 0, tpot = 0, selected = 0, ttft_sum_us = 0;
  for (const auto& [id, n] : max_new) {
    EXPECT_EQ(seen[id].error, "") << id;
    EXPECT_EQ(seen[id].tokens, n) << id;
    tokens += seen[id].tokens;
    tpot += seen[id].tokens - 1;
    ttft_sum_us += seen[id].ttft_us;
    selected += SelectedRows(node.model().config(), kPromptTokens + seen[id].tokens - 1);
  }
  const std::string finished = "dhs_worker_requests_finished_total{gpu=\"0\"}";
  Scrape w = node.ScrapeUntil("worker-0", [&](const Scrape& s) { return s.at(finished) == 4; });
  ASSERT_EQ(w.at(finished), 4) << node.Logs();
  EXPECT_EQ(w.at("dhs_worker_tokens_total{gpu=\"0\"}"), tokens);
  EXPECT_EQ(w.at("dhs_worker_requests_active{gpu=\"0\"}"), 0);
  EXPECT_EQ(w.at("dhs_worker_requests_waiting{gpu=\"0\"}"), 0);
  EXPECT_EQ(w.at("dhs_worker_ttft_seconds_count{gpu=\"0\"}"), 4);
  EXPECT_EQ(w.at("dhs_worker_ttft_seconds_bucket{gpu=\"0\",le=\"+Inf\"}"), 4);
  // The worker's TTFT is the clients' (TokenChunk.ttft_us, the same clock reading): the sum agrees to the us.
  EXPECT_NEAR(w.at("dhs_worker_ttft_seconds_sum{gpu=\"0\"}"), ttft_sum_us / 1e6, 1e-6 * 4);
  EXPECT_EQ(w.at("dhs_worker_tpot_seconds_count{gpu=\"0\"}"), tpot);
  EXPECT_EQ(w.at("dhs_worker_admission_wait_seconds_count{gpu=\"0\"}"), 4);
  const double census = w.at("dhs_worker_census_rows_total{gpu=\"0\",tier=\"direct\"}") +
                        w.at("dhs_worker_census_rows_total{gpu=\"0\",tier=\"hot\"}") +
                        w.at("dhs_worker_census_rows_total{gpu=\"0\",tier=\"host\"}");
  EXPECT_EQ(census, selected) << "census by tier does not sum to the selected rows";
  EXPECT_EQ(w.at("dhs_worker_recovered_rows_total{gpu=\"0\"}"),
            w.at("dhs_worker_census_rows_total{gpu=\"0\",tier=\"host\"}"));
  EXPECT_GT(w.at("dhs_worker_reclaims_total{gpu=\"0\"}"), 0) << "no reclaim: the budget put no pressure" << node.Logs();
  EXPECT_GT(w.at("dhs_worker_pages_total{gpu=\"0\",kind=\"reclaimed\"}"), 0);
  std::printf("served 4 requests, %llu tokens, %llu selected rows (census direct %.0f hot %.0f host %.0f), %.0f "
              "reclaims, %.0f host bytes recovered\n",
              static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(selected),
              w.at("dhs_worker_census_rows_total{gpu=\"0\",tier=\"direct\"}"),
              w.at("dhs_worker_census_rows_total{gpu=\"0\",tier=\"hot\"}"),
              w.at("dhs_worker_census_rows_total{gpu=\"0\",tier=\"host\"}"),
              w.at("dhs_worker_reclaims_total{gpu=\"0\"}"), w.at("dhs_worker_recovered_bytes_total{gpu=\"0\"}"));
  // memd reclaimed what the worker obeyed.
  Scrape md = node.ScrapeUntil("memd", [&](const Scrape& s) { return s.at("dhs_memd_completions_total") == 4; });
  EXPECT_EQ(md.at("dhs_memd_reclaims_retired_total"), w.at("dhs_worker_reclaims_total{gpu=\"0\"}"));
  // dhsctl worker-stats says the same (the same reply, asked on the serving socket).
  const json ws = node.Dhsctl("worker-stats --gpu 0");
  ASSERT_FALSE(ws.is_null()) << node.DhsctlText("worker-stats --gpu 0");
  EXPECT_EQ(ws["tokens_generated"], tokens);
  EXPECT_EQ(ws["finished_requests"], 4);
  EXPECT_EQ(ws["failed_requests"], 0);
  EXPECT_EQ(ws["tpot"]["count"], tpot);
  EXPECT_EQ(ws["census_direct"].get<uint64_t>() + ws["census_hot"].get<uint64_t>() +
                ws["census_host"].get<uint64_t>(),
            selected);
  EXPECT_NE(node.DhsctlText("worker-stats").find("tokens_generated"), std::string::npos);
  EXPECT_NE(node.DhsctlText("worker-stats --gpu 5").find("worker-5 is not running"), std::string::npos);

  // A failure by reason: a request whose context can never fit this GPU's M is accepted, then refused by memd
  // (AdmitReject): its client gets a final chunk with the error; the worker counts it under the error code's name.
  std::map<RequestId, Seen> rejected;
  Submit(*c, 9, 9, 6000);
  ReadUntil(*c, rejected, [&] { return rejected[9].finished; }, 30000);
  ASSERT_TRUE(rejected[9].finished) << node.Logs();
  ASSERT_NE(rejected[9].code, wire::ErrorCode::OK) << node.Logs();
  std::string reason = wire::EnumNameErrorCode(rejected[9].code);
  for (char& ch : reason) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::string failed = "dhs_worker_requests_failed_total{gpu=\"0\",reason=\"" + reason + "\"}";
  w = node.ScrapeUntil("worker-0", [&](const Scrape& s) { return s.at(failed) == 1; });
  EXPECT_EQ(w.at(failed), 1) << reason << node.Logs();
  EXPECT_EQ(w.at(finished), 5);
  EXPECT_EQ(w.at("dhs_worker_tokens_total{gpu=\"0\"}"), tokens);
  std::printf("the refused request failed with reason %s (%s)\n", reason.c_str(), rejected[9].error.c_str());
  // Every metric either daemon serves is in docs/operations.md, with its type.
  const std::map<std::string, std::string> doc = DocumentedMetrics();
  ExpectDocumented(w, doc, "workerd");
  ExpectDocumented(node.ScrapeUntil("memd", [](const Scrape&) { return true; }), doc, "memd");
  EXPECT_EQ(worker->Terminate(), 0) << node.Logs();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/worker-0.metrics")) << "workerd left its address file";
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

// `dhsctl request --client ID` across a worker restart: the request is SIGKILLed mid-decode with its worker, resumed
// by the restarted worker (epoch 2) and finishes there (no client re-attaches: its output waits for one).
TEST(WorkerMetrics, DhsctlFindsARequestByItsClientIdAcrossAWorkerRestart) {
  dhs::testing::ScopedRunDir dir;
  ASSERT_TRUE(MakeRunDir(dir.path()).ok());
  if (!Node::Available()) GTEST_SKIP() << "no memd / workerd / dhsctl / docs";
  Node node(dir.path());
  auto memd = node.StartMemd();
  auto worker = node.StartWorker("workerd-1", 200);
  constexpr RequestId kClientId = 4242;
  {
    auto c = node.Client();
    ASSERT_TRUE(c);
    std::map<RequestId, Seen> seen;
    Submit(*c, kClientId, 7, 600);
    ReadUntil(*c, seen, [&] { return seen[kClientId].tokens >= 20; }, 30000);
    ASSERT_GE(seen[kClientId].tokens, 20u) << node.Logs();
    ASSERT_FALSE(seen[kClientId].finished);
    worker.reset();  // SIGKILL mid-decode
  }
  ASSERT_FALSE(node.WaitGpu0(false, 1).is_null()) << "never fenced" << node.Logs();
  auto restarted = node.StartWorker("workerd-2", 200);
  ASSERT_FALSE(node.WaitGpu0(true, 2).is_null()) << node.Logs();
  // The resumed request finishes detached; memd completes it.
  json doc;
  auto events = [&](const json& t) {
    std::vector<std::string> out;
    for (const json& e : t["events"]) out.push_back(e["source"].get<std::string>() + ":" + e["event"].get<std::string>());
    return out;
  };
  for (int i = 0; i < 1500; ++i) {
    doc = node.Dhsctl("request --client " + std::to_string(kClientId));
    bool completed = false;
    if (!doc.is_null()) {
      for (const json& t : doc["timelines"]) {
        for (const std::string& e : events(t)) completed |= t["epoch"] == 2 && e == "memd:completed";
      }
    }
    if (completed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(doc.is_null()) << node.Logs();
  // memd's timelines of both epochs, then the restarted worker's of epoch 2 (the killed worker's died with it).
  std::map<std::pair<uint32_t, std::string>, std::vector<std::string>> by;  // (epoch, source) -> events
  std::set<uint64_t> node_ids;
  for (const json& t : doc["timelines"]) {
    EXPECT_EQ(t["client_request"], kClientId);
    node_ids.insert(t["request"].get<uint64_t>());
    for (const json& e : t["events"]) {
      by[{t["epoch"].get<uint32_t>(), e["source"].get<std::string>()}].push_back(e["event"].get<std::string>());
    }
  }
  EXPECT_EQ(node_ids.size(), 2u) << doc.dump(2);
  using V = std::vector<std::string>;
  // Epoch 1: admitted, granted, population of its optional history perhaps, then the fence and the resume.
  const V& e1 = by[{1, "memd"}];
  ASSERT_GE(e1.size(), 4u) << doc.dump(2);
  EXPECT_EQ((V{e1[0], e1[1], e1[e1.size() - 2], e1.back()}), (V{"admitted", "granted", "interrupted", "resumed"}))
      << doc.dump(2);
  for (size_t i = 2; i + 2 < e1.size(); ++i) {
    EXPECT_TRUE(e1[i] == "populated" || e1[i] == "reclaimed") << e1[i];
  }
  const V& e2 = by[{2, "memd"}];
  ASSERT_GE(e2.size(), 3u) << doc.dump(2);
  EXPECT_EQ(e2.front(), "admitted");
  EXPECT_EQ(e2[1], "granted");
  EXPECT_EQ(e2.back(), "completed");
  for (size_t i = 2; i + 1 < e2.size(); ++i) {
    EXPECT_TRUE(e2[i] == "populated" || e2[i] == "reclaimed") << e2[i];
  }
  EXPECT_TRUE(doc["notes"].empty()) << doc["notes"].dump();
  EXPECT_EQ((by[{2, "worker/0"}]), (V{"submitted", "first_token", "end"})) << doc.dump(2);
  EXPECT_EQ(by.count({1, "worker/0"}), 0u) << "the killed worker's events cannot be known";
  // The table names both node ids, in time order: epoch 1's admission before epoch 2's.
  const std::string table = node.DhsctlText("request --client " + std::to_string(kClientId));
  std::printf("$ dhsctl request --client %llu\n%s", static_cast<unsigned long long>(kClientId), table.c_str());
  const size_t first = table.find("admitted");
  const size_t interrupted = table.find("interrupted");
  const size_t end = table.find(" end ");
  EXPECT_NE(first, std::string::npos) << table;
  EXPECT_LT(first, interrupted) << table;
  EXPECT_LT(interrupted, end) << table;
  // An unknown client id: NOT_FOUND (exit 4).
  EXPECT_TRUE(node.Dhsctl("request --client 999999").is_null());
  EXPECT_NE(node.DhsctlText("request --client 999999").find("NOT_FOUND"), std::string::npos);
  EXPECT_EQ(restarted->Terminate(), 0) << node.Logs();
  EXPECT_EQ(memd->Terminate(), 0) << node.Logs();
}

}  // namespace
}  // namespace dhs::test
