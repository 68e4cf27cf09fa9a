// fuzz/libdhs_fuzz.cc: libFuzzer target for libdhs's C ABI (issue 25, include/dhs/dhs.h): random call sequences and
// arguments against a real memd.
//
// LLVMFuzzerInitialize starts memd ($MEMD, else memd/memd next to this program's folder) in a fresh run directory
// (removed, and memd stopped, at exit) and opens one worker for GPU 0 that every input shares. Each input is a list
// of records [op][fields...]: submit (sizes, struct_size, reserved, resume_of fuzzed), poll, append (mostly the next
// position of a known request, sometimes any; sizes exact or off), resolve (sources, queries, selections around the
// history, lengths around k, null pointers), readers done, hold, commit, complete, stats (any capacity), info / pools
// (struct sizes fuzzed), list resumable, import, calls on pointers that are no handle, and a second worker for GPU 1
// opened with a fuzzed config, used, closed and used after the close. At the end of an input every request it opened
// is completed. Asserted (abort on failure): no call aborts or crashes; every status is a dhs_status; every failed call
// on a live handle leaves a non-empty message.
#include <dhs/dhs.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "fuzz/fuzz_input.h"

extern char** environ;

namespace {

constexpr uint32_t kS = 2, kRow = 64, kKey = 16, kP = 16, kK = 8;
constexpr uint64_t kHostPageBytes = uint64_t{kP} * (kS * kRow + kKey);  // 2304

pid_t g_memd = -1;
// Calls by name and outcome (DHS_FUZZ_COUNTS=1 prints them at exit: which calls the inputs reach, and how often they
// succeed).
std::map<std::string, std::pair<uint64_t, uint64_t>> g_counts;
std::string g_run_dir;
dhs_worker* g_w = nullptr;

void Stop() {
  if (std::getenv("DHS_FUZZ_COUNTS") != nullptr) {
    for (const auto& [call, c] : g_counts) std::printf("%-14s ok %6lu  failed %6lu\n", call.c_str(), c.first, c.second);
  }
  if (g_w != nullptr) dhs_worker_close(g_w);
  g_w = nullptr;
  if (g_memd > 0) {
    ::kill(g_memd, SIGTERM);
    for (int i = 0; i < 500 && ::waitpid(g_memd, nullptr, WNOHANG) != g_memd; ++i) ::poll(nullptr, 0, 10);
    ::kill(g_memd, SIGKILL);
    ::waitpid(g_memd, nullptr, 0);
    g_memd = -1;
  }
  // memd keeps its host pool when requests still hold host copies (an epoch this target lost leaves interrupted
  // requests): the segment memd logged is removed here, so that nothing is left in /dev/shm.
  std::error_code ec;
  if (!g_run_dir.empty()) {
    std::ifstream log(g_run_dir + ".log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    const size_t at = text.find("host pool /dev/shm/");
    if (at != std::string::npos) {
      const size_t from = at + std::strlen("host pool ");
      std::filesystem::remove(text.substr(from, text.find(':', from) - from), ec);
    }
    std::filesystem::remove_all(g_run_dir, ec);
    std::filesystem::remove(g_run_dir + ".log", ec);
  }
}

// A crash (a finding, or SIGPIPE from a closed output) must not leave memd running: SIGTERM to memd (async-signal-
// safe; memd removes its host-pool segment itself), then the signal's default action.
void OnFatalSignal(int sig) {
  if (g_memd > 0) ::kill(g_memd, SIGTERM);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// A request of ABI 1.0's fields (no chain) in a 1.1 struct.
dhs_request_desc Desc(uint64_t input, uint64_t max, uint64_t resume_of = 0) {
  dhs_request_desc d{};
  d.struct_size = sizeof d;
  d.input_rows = input;
  d.max_rows = max;
  d.resume_of = resume_of;
  return d;
}

dhs_worker_config BaseConfig(uint32_t gpu) {
  dhs_worker_config c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.abi_version = DHS_ABI_VERSION;
  c.run_dir = g_run_dir.c_str();
  c.gpu = gpu;
  c.mode = DHS_MODE_ADAPTIVE;
  c.backend = DHS_BACKEND_CPU;
  c.sources = kS;
  c.row_bytes = kRow;
  c.indexers = 1;
  c.index_key_bytes = kKey;
  c.page_rows = kP;
  c.top_k = kK;
  c.hot_rows = 4 * kK;
  c.tail_rows = 2 * kP;
  c.slots = 2;
  c.hbm_budget_bytes = 12 * kP * kS * kRow;
  c.connect_timeout_ms = 3000;
  // ABI 1.5: staging arenas (χ = 1: a group per source; K_max = 4 <= T - p + 1), so a held round's resolves take the
  // union path with its arena (HierarchicalKvAccess::FetchWithStaging).
  c.staging_arenas = 1;
  c.round_queries = 4;
  return c;
}

// The status a call returned: a dhs_status; a failure on a live handle has a message.
int Check(dhs_worker* w, int rc, const char* call) {
  if (rc < DHS_OK || rc > DHS_ERR_INTERNAL) {
    std::fprintf(stderr, "%s returned %d, no dhs_status\n", call, rc);
    std::abort();
  }
  if (rc != DHS_OK && rc != DHS_ERR_BAD_HANDLE && rc != DHS_ERR_CLOSED && w != nullptr &&
      dhs_worker_errmsg(w)[0] == '\0') {
    std::fprintf(stderr, "%s failed with %s and no message\n", call, dhs_status_name(rc));
    std::abort();
  }
  // DHS_FUZZ_TRACE=1: every call that failed; =all: every call (unbuffered, for a replay that crashes).
  if (const char* trace = std::getenv("DHS_FUZZ_TRACE"); trace != nullptr && (rc != DHS_OK || trace == std::string("all"))) {
    std::fprintf(stderr, "%s: %s: %s\n", call, dhs_status_name(rc), w != nullptr ? dhs_worker_errmsg(w) : "");
  }
  auto& count = g_counts[call];
  (rc == DHS_OK ? count.first : count.second) += 1;
  if (rc == DHS_ERR_INTERNAL) {  // a bug by definition
    std::fprintf(stderr, "%s: DHS_ERR_INTERNAL: %s\n", call, dhs_worker_errmsg(w));
    std::abort();
  }
  return rc;
}

struct Session {
  dhs::fuzz::Input& in;
  dhs_worker* w;
  std::map<uint64_t, int64_t> appended;  // requests submitted in this input -> rows appended (as far as we know)
  bool lost = false;  // the worker's epoch ended (it was not polled for the memd timeout): reopened after the input

  std::vector<uint64_t> granted;  // GRANTED events seen in this input, not completed since

  void Take(const dhs_event* ev, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (ev[i].kind == DHS_EVENT_GRANTED) granted.push_back(ev[i].request);
      if (ev[i].kind == DHS_EVENT_REJECTED || ev[i].kind == DHS_EVENT_FAILED) {
        appended.erase(ev[i].request);
        std::erase(granted, ev[i].request);
      }
    }
  }

  uint64_t PickRequest() {
    if (!granted.empty() && in.Below(4) != 0) return granted[in.Below(static_cast<uint32_t>(granted.size()))];
    if (!appended.empty() && in.Below(8) != 0) {
      auto it = appended.begin();
      std::advance(it, in.Below(static_cast<uint32_t>(appended.size())));
      return it->first;
    }
    return in.Small64(64);
  }

  void Submit() {
    // Mostly sizes memd admits (input 1..80, max up to 40 more), sometimes any.
    const uint64_t input = 1 + in.Below(80);
    dhs_request_desc d = Desc(input, input + in.Below(40));  // no chain
    if (in.Below(6) == 0) d = Desc(in.Small64(120), in.Small64(160));
    if (in.Below(8) == 0) d.struct_size = in.Small32(96);
    if (in.Below(8) == 0) d.reserved = 1;
    if (in.Below(8) == 0) d.resume_of = in.Small64(8);
    // ABI 1.1: a tenant, a session and a prefix chain (tokens, block size, ids) around the valid ranges; sometimes
    // 1.0's struct size (the chain fields are then never read).
    // The buffers hold more than any count below names (a count is the caller's promise; the library cannot check it).
    std::vector<int32_t> tokens(512, 0);
    std::vector<uint64_t> ids(512, 0);
    const size_t n_tokens = in.Below(100), n_ids = in.Below(4);
    for (size_t i = 0; i < n_tokens; ++i) tokens[i] = static_cast<int32_t>(in.Below(4));  // few tokens: chains repeat
    for (size_t i = 0; i < n_ids; ++i) ids[i] = in.Below(3);
    const size_t tenant_bytes = in.Below(3) == 0 ? in.Small32(300) % 301 : in.Below(2);
    const std::string tenant(tenant_bytes, static_cast<char>('a' + in.Below(3)));
    if (in.Bool()) {
      d.tenant = in.Below(4) == 0 ? nullptr : tenant.c_str();
      d.session = in.Small64(4);
      d.tokens = in.Below(16) == 0 ? nullptr : tokens.data();
      d.token_count = in.Below(8) == 0 ? in.Small64(200) % 513 : std::min<uint64_t>(n_tokens, d.input_rows);
      d.block_ids = in.Below(16) == 0 ? nullptr : ids.data();
      d.block_id_count = in.Below(8) == 0 ? in.Small32(8) % 513 : static_cast<uint32_t>(n_ids);
      d.block_tokens = in.Below(8) == 0 ? in.Small32(64) : kP * (1 + in.Below(2));
    }
    if (in.Below(8) == 0) d.struct_size = DHS_REQUEST_DESC_SIZE_1_0;
    uint64_t id = 0;
    if (Check(w, dhs_request_submit(w, in.Below(16) == 0 ? nullptr : &d, &id), "submit") == DHS_OK) {
      appended[id] = 0;
    }
  }

  void Poll() {
    dhs_event ev[8];
    size_t n = 0;
    const uint32_t cap = in.Below(9);
    const int rc = Check(w, dhs_worker_poll(w, cap == 0 && in.Bool() ? nullptr : ev, cap,
                                            in.Below(16) == 0 ? nullptr : &n),
                         "poll");
    // Sometimes wait (up to 20 ms) for memd's answers, so that later records meet granted requests.
    if (rc == DHS_OK && cap > 0) Take(ev, n);
    const bool wait = in.Bool();
    for (int i = 0; rc == DHS_OK && wait && i < 20 && n == 0; ++i) {
      ::poll(nullptr, 0, 1);
      if (Check(w, dhs_worker_poll(w, ev, 8, &n), "poll") == DHS_OK) Take(ev, n);
    }
    if (rc == DHS_ERR_ABORTED || rc == DHS_ERR_UNAVAILABLE) lost = true;
  }

  void Append() {
    const uint64_t id = PickRequest();
    // Mostly a few positions; sometimes a count no buffer could hold (the sizes below stay small: the library
    // must refuse it before reading).
    const bool huge = in.Below(16) == 0;
    const uint32_t count = huge ? in.U32() : in.Below(40);
    int64_t first = appended.contains(id) ? appended[id] : 0;
    if (in.Below(6) == 0) first = static_cast<int64_t>(in.Small64(200)) - 2;
    size_t bytes = huge ? 64 : size_t{count} * kS * kRow;
    std::vector<uint8_t> rows(bytes + 64, static_cast<uint8_t>(first));
    if (in.Below(6) == 0) bytes = in.Small32(static_cast<uint32_t>(rows.size()) + 1) % (rows.size() + 1);
    std::vector<uint8_t> keys((huge ? 0 : size_t{count} * kKey) + 16, 3);
    size_t key_bytes = in.Bool() ? keys.size() - 16 : 0;
    if (in.Below(8) == 0) key_bytes = in.Below(static_cast<uint32_t>(keys.size()) + 1);
    const int rc = Check(w, dhs_request_append(w, id, first, count, in.Below(16) == 0 ? nullptr : rows.data(),
                                               bytes, key_bytes == 0 && in.Bool() ? nullptr : keys.data(),
                                               key_bytes),
                         "append");
    if (rc == DHS_OK && appended.contains(id)) appended[id] = first + count;
  }

  // ABI 1.3: layer-wise rows of one source, or one indexer's keys (the per-source lengths are the library's to check:
  // `appended` tracks whole appends only, a hint for plausible positions).
  void AppendSource(bool keys) {
    const uint64_t id = PickRequest();
    const uint32_t source = in.Below(8) == 0 ? in.Small32(kS + 2) : in.Below(kS);
    const uint32_t count = in.Below(16) == 0 ? in.U32() : in.Below(40);
    int64_t first = (appended.contains(id) ? appended[id] : 0) + static_cast<int64_t>(in.Below(40)) - 2;
    const size_t unit = keys ? kKey : kRow;
    std::vector<uint8_t> bytes(size_t{std::min<uint32_t>(count, 64)} * unit + 64, static_cast<uint8_t>(first));
    size_t n = std::min<size_t>(size_t{count} * unit, bytes.size() - 64);
    if (in.Below(6) == 0) n = in.Below(static_cast<uint32_t>(bytes.size()) + 1);
    const uint8_t* p = in.Below(16) == 0 ? nullptr : bytes.data();
    if (keys) {
      Check(w, dhs_request_append_keys(w, id, in.Below(8) == 0 ? in.Below(4) : 0, first, count, p, n), "append_keys");
    } else {
      Check(w, dhs_request_append_source(w, id, source, first, count, p, n), "append_source");
    }
  }

  void Resolve() {
    const uint32_t n_src = in.Below(4) == 0 ? in.Below(3) : 1;  // mostly one source (1.0's rule), sometimes not
    std::vector<uint32_t> sources(n_src + 1);
    for (uint32_t& s : sources) s = in.Below(8) == 0 ? in.Small32(kS + 1) : in.Below(kS);
    const uint32_t n_q = in.Below(4);
    std::vector<dhs_query> qs(n_q + 1);
    std::vector<std::vector<int64_t>> sel(n_q + 1), loc(n_q + 1);
    for (uint32_t i = 0; i < n_q; ++i) {
      const uint64_t id = PickRequest();
      const int64_t hist = appended.contains(id) ? appended[id] : 4;
      const uint32_t len = in.Below(8) == 0 ? in.Below(kK + 3) : in.Below(kK + 1);
      sel[i].resize(len);
      for (int64_t& t : sel[i]) t = static_cast<int64_t>(in.Below(static_cast<uint32_t>(hist) + 3)) - 1;
      loc[i].resize(size_t{len} * n_src + 1);
      qs[i] = dhs_query{id, sel[i].data(), len, in.Below(16) == 0 ? 1u : 0u,
                        in.Below(16) == 0 ? nullptr : loc[i].data()};
    }
    const uint32_t* src = in.Below(16) == 0 ? nullptr : sources.data();
    if (in.Below(4) == 0) {  // ABI 1.5: each query's own position (a round's n_r + j), sometimes out of range
      std::vector<int64_t> at(n_q + 1);
      for (uint32_t i = 0; i < n_q; ++i) at[i] = static_cast<int64_t>(in.Below(8 * kP)) - 2;
      Check(w, dhs_resolve_at(w, src, n_src, qs.data(), n_q, in.Below(8) == 0 ? nullptr : at.data()), "resolve_at");
    } else {
      Check(w, dhs_resolve(w, src, n_src, qs.data(), n_q), "resolve");
    }
  }

  void Op(uint32_t op) {
    switch (op) {
      case 0:
        Submit();
        break;
      case 1:
        Poll();
        break;
      case 2:
        Append();
        break;
      case 3:
        Resolve();
        break;
      case 4: {  // readers done
        uint32_t s = in.Small32(kS + 1);
        Check(w, dhs_readers_done(w, in.Below(8) == 0 ? nullptr : &s, in.Below(2)), "readers_done");
        break;
      }
      case 5: {
        const uint64_t id = PickRequest();
        const int64_t base = appended.contains(id) ? appended[id] : 0;
        Check(w, dhs_request_hold(w, id, base + static_cast<int64_t>(in.Below(4)) - 1), "hold");
        break;
      }
      case 6: {
        const uint64_t id = PickRequest();
        const int64_t base = appended.contains(id) ? appended[id] : 0;
        const int64_t length = base - static_cast<int64_t>(in.Below(4));
        if (Check(w, dhs_request_commit(w, id, length), "commit") == DHS_OK) appended[id] = length;
        break;
      }
      case 7: {
        const uint64_t id = PickRequest();
        if (Check(w, dhs_request_complete(w, id), "complete") == DHS_OK) {
          appended.erase(id);
          std::erase(granted, id);
        }
        break;
      }
      case 8: {
        std::vector<char> buf(in.Bool() ? 4096 : in.Small32(300) % 301);
        size_t need = 0;
        Check(w, dhs_worker_stats_json(w, buf.empty() ? nullptr : buf.data(), buf.size(),
                                       in.Below(16) == 0 ? nullptr : &need),
              "stats");
        // ABI 1.6: a request's timeline (a known id, or any), into a buffer of any size.
        Check(w, dhs_request_timeline_json(w, PickRequest(), buf.empty() ? nullptr : buf.data(), buf.size(),
                                           in.Below(16) == 0 ? nullptr : &need),
              "timeline");
        break;
      }
      case 9: {
        dhs_worker_info info{};
        info.struct_size = in.Bool() ? sizeof info : in.Small32(128);
        Check(w, dhs_worker_info_get(w, in.Below(16) == 0 ? nullptr : &info), "info");
        dhs_pool_desc pool{};
        pool.struct_size = in.Bool() ? sizeof pool : in.Small32(128);
        pool.kind = in.Below(4);
        Check(w, dhs_pools_register(w, &pool), "pools");
        break;
      }
      case 10: {
        dhs_resumable r[2];
        size_t n = 0, total = 0;
        Check(w, dhs_worker_list_resumable(w, in.Bool() ? r : nullptr, in.Below(3), &n, &total), "resumable");
        std::vector<uint8_t> keys(in.Below(4) * kP * kKey);
        const uint64_t id = PickRequest();
        const uint32_t first = in.Bool() ? in.U32() : in.Below(4), count = in.Bool() ? in.U32() : in.Below(4);
        Check(w, dhs_request_import(w, id, first, count,
                                    keys.empty() ? nullptr : keys.data(), keys.size()),
              "import");
        dhs_host_run runs[3];  // ABI 1.4: the import plan, any request and prefill length, short or NULL outputs
        size_t rn = 0, rt = 0;
        Check(w, dhs_request_import_plan(w, PickRequest(), in.Bool() ? in.Small64(200) : in.Below(100),
                                         in.Bool() ? runs : nullptr, in.Below(4), in.Below(16) == 0 ? nullptr : &rn,
                                         &rt),
              "import_plan");
        // ABI 1.5: token records: commits of any length (beyond max_new too) and a resumable request's tokens.
        std::vector<int32_t> toks(in.Below(24));
        for (int32_t& t : toks) t = static_cast<int32_t>(in.U32());
        std::vector<uint64_t> digests(toks.size(), 7);
        Check(w, dhs_request_commit_tokens(w, PickRequest(), in.Below(16) == 0 ? nullptr : toks.data(),
                                           in.Bool() ? digests.data() : nullptr, static_cast<uint32_t>(toks.size())),
              "commit_tokens");
        int32_t out[8];
        size_t tn = 0, tt = 0, tp = 0;
        Check(w, dhs_worker_resumable_tokens(w, in.Bool() ? PickRequest() : (n > 0 ? r[0].request : 0),
                                             in.Bool() ? out : nullptr, in.Below(9), &tn, &tt,
                                             in.Below(16) == 0 ? nullptr : &tp),
              "resumable_tokens");
        break;
      }
      case 11: {  // pointers that are no handle
        int x = 0;
        auto* fake = reinterpret_cast<dhs_worker*>(&x);
        size_t n = 0;
        if (dhs_worker_poll(fake, nullptr, 0, &n) != DHS_ERR_BAD_HANDLE) std::abort();
        if (dhs_worker_close(nullptr) != DHS_ERR_INVALID_ARGUMENT) std::abort();
        break;
      }
      default:
        break;
    }
  }
};

// A second worker (GPU 1) with a fuzzed config: opened, a few calls, closed, then used after the close.
void SecondWorker(dhs::fuzz::Input& in) {
  dhs_worker_config c = BaseConfig(1);
  switch (in.Below(11)) {
    case 0: c.struct_size = in.Small32(256); break;
    case 1: c.abi_version = in.U32(); break;
    case 2: c.page_rows = in.Small32(40); break;
    case 3: c.top_k = in.Small32(80); break;
    case 4: c.tail_rows = in.Small32(80); break;
    case 5: c.row_bytes = in.Small32(200); break;  // another host page size: memd refuses the Hello
    case 6: c.hbm_budget_bytes = in.Small64(100000); break;
    case 7:  // 3 = DHS_MODE_RESIDENT (ABI 1.7): on the CPU backend, so that it opens and serves
      c.mode = in.Below(4);
      c.backend = c.mode == DHS_MODE_RESIDENT ? DHS_BACKEND_CPU : in.Below(4);
      break;
    case 8: c.sources = in.Small32(5); c.indexers = in.Small32(3); c.index_key_bytes = in.Small32(40); break;
    case 9: {  // ABI 1.3 source groups: both sources one group, or a numbering the open refuses
      static const uint32_t kOneGroup[kS] = {0, 0}, kBadGroups[kS] = {1, 0};
      c.source_groups = in.Bool() ? kOneGroup : kBadGroups;
      break;
    }
    case 10:  // ABI 1.5 arenas and K_max (ABI 1.8: K_max alone too), ABI 1.8's drafter ring or consumers
      c.staging_arenas = in.Small32(4);
      c.round_queries = in.Small32(40);
      switch (in.Below(3)) {
        case 1:
          c.draft_ring_rows = in.Small32(40);
          c.draft_bytes_per_row = in.Small64(4096);
          c.drafter_window = in.Small32(8);
          break;
        case 2: {
          static const uint32_t kConsumers[kS] = {2, 1}, kNoConsumer[kS] = {0, 1};
          c.source_consumers = in.Bool() ? kConsumers : kNoConsumer;
          c.fetched_rows_per_token = in.Small32(8);
          break;
        }
        default: break;
      }
      break;
    default: break;
  }
  c.connect_timeout_ms = 300;  // a Hello memd leaves unanswered must not starve GPU 0's worker of polls
  dhs_worker* w = nullptr;
  const int rc = Check(nullptr, dhs_worker_open(in.Below(16) == 0 ? nullptr : &c, &w), "open");
  if (w == nullptr) return;
  if (rc != DHS_OK && dhs_worker_errmsg(w)[0] == '\0') std::abort();
  if (rc == DHS_OK) {
    Session s{in, w, {}, false, {}};
    for (uint32_t i = in.Below(4); i > 0; --i) s.Op(in.Below(12));
  }
  if (dhs_worker_close(w) != DHS_OK) std::abort();
  size_t n = 0;
  if (dhs_worker_poll(w, nullptr, 0, &n) != DHS_ERR_CLOSED) std::abort();
  if (dhs_request_complete(w, 1) != DHS_ERR_CLOSED) std::abort();
  if (dhs_worker_close(w) != DHS_ERR_CLOSED) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  std::string memd = std::getenv("MEMD") != nullptr ? std::getenv("MEMD") : "";
  if (memd.empty()) {
    memd = (std::filesystem::path((*argv)[0]).parent_path().parent_path() / "memd" / "memd").string();
  }
  char pattern[] = "/tmp/dhs-fz-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) std::abort();
  g_run_dir = pattern;
  std::filesystem::remove(g_run_dir);  // memd creates it
  const std::string page_bytes = std::to_string(kHostPageBytes);
  const std::string log = g_run_dir + ".log";
  std::vector<std::string> args = {memd, "--run-dir", g_run_dir, "--page-bytes", page_bytes,
                                   "--host-pool-pages", "512", "--worker-timeout-ms", "20000",
                                   "--prefix-sharing", "on"};  // chains named at submit meet stored pages
  std::vector<char*> a;
  for (auto& s : args) a.push_back(s.data());
  a.push_back(nullptr);
  // fork + exec (not posix_spawn): memd gets SIGTERM when this process dies however it dies (PR_SET_PDEATHSIG):
  // libFuzzer ends a timeout or an out-of-memory input with _Exit, past atexit and the signal handlers below, and
  // its fork mode kills its jobs; an orphaned memd kept its host pool in /dev/shm (seen in the first real run).
  const pid_t parent = ::getpid();
  g_memd = ::fork();
  if (g_memd < 0) std::abort();
  if (g_memd == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);  // the parent died before the prctl
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
    ::execve(a[0], a.data(), environ);
    ::_exit(127);
  }
  std::atexit(Stop);
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGPIPE, SIGTERM, SIGINT}) ::signal(sig, OnFatalSignal);
  for (int i = 0; i < 800 && !std::filesystem::exists(g_run_dir + "/memd.sock"); ++i) ::poll(nullptr, 0, 25);
  // Every call is followed by the worker's invariant check (EmbeddedWorker::CheckInvariants: its request book and
  // requests); a broken one aborts: a finding.
  ::setenv("DHS_CHECK_INVARIANTS", "1", 1);
  const dhs_worker_config c = BaseConfig(0);
  if (dhs_worker_open(&c, &g_w) != DHS_OK) {
    std::fprintf(stderr, "libdhs_fuzz: open: %s\n", dhs_worker_errmsg(g_w));
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dhs::fuzz::Input in(data, size);
  Session s{in, g_w, {}, false, {}};
  for (int records = 0; records < 64 && !in.empty(); ++records) {
    const uint32_t op = in.Below(13);
    if (op == 12) {  // rarer records: a second worker, or (ABI 1.3) a layer-wise append of rows or keys
      switch (in.Below(3)) {
        case 0: SecondWorker(in); break;
        case 1: s.AppendSource(false); break;
        default: s.AppendSource(true); break;
      }
    } else {
      s.Op(op);
    }
  }
  // The readers of every source end before the requests do (an engine completes a request once nothing reads it).
  const uint32_t all_sources[kS] = {0, 1};
  dhs_readers_done(g_w, all_sources, kS);
  for (const auto& [id, rows] : s.appended) dhs_request_complete(g_w, id);
  dhs_event ev[8];
  size_t n = 0;
  for (int i = 0; i < 3; ++i) dhs_worker_poll(g_w, ev, 8, &n);
  if (s.lost) {  // an engine whose epoch ended closes its worker and opens a new one (docs/embedding.md)
    dhs_worker_close(g_w);
    g_w = nullptr;
    const dhs_worker_config c = BaseConfig(0);
    if (dhs_worker_open(&c, &g_w) != DHS_OK) {
      std::fprintf(stderr, "libdhs_fuzz: reopen: %s\n", dhs_worker_errmsg(g_w));
      std::abort();
    }
  }
  return 0;
}
