// dhsctl: introspection CLI of memd (brief §3). Sends one IntrospectQuery and prints the document memd rendered
// with the shared DumpToJson / DumpToTable (memd/state_dump.h), so the daemon, the CLI and the tests show the same.
//
//   dhsctl [--run-dir DIR] [--json] [--timeout-ms MS] status | gpus | requests | request ID | queue
//     (requests show their speculation share, GPUs the shares in use and the Hello's totals: issue 13)
//   dhsctl ... pages GPU [--from F] [--count N] [--runs]   (at most N rows, default 1000: pages, or runs of pages)
//   dhsctl ... watch [--interval S] [--count N] [VIEW]     (repeats `status` or VIEW every S seconds)
//   dhsctl [--json] plan --preset NAME --context TOKENS ...   (capacity plan, no memd needed; docs/planner.md)
//   dhsctl ... plan ... --live                                (plus what the running memd would admit now)
//   dhsctl ... worker-stats [--gpu G]                         (the worker's counters, asked on its serving socket)
//   dhsctl ... events [--count N] [--idle-ms MS]             (memd's KV event stream, lines or --json: issue 24;
//                                                              tools/dhsctl/events_command.h)
//   dhsctl ... request --client CLIENT_ID                     (a client's request across worker epochs: memd's and
//                                                              the workers' timelines merged by time; issue 22)
//
// Exit codes (docs/operations.md): 0 ok (also --help); 1 memd is not running (no socket, cannot connect); 2 bad command
// line (the message names the word or the value); 3 no answer within --timeout-ms; 4 memd answered with an error
// (ErrorReply), including NOT_FOUND for a request or GPU it does not know (`request ID`, `pages GPU`).
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/protocol.h"
#include "common/request_timeline.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/worker_metrics.h"
#include "nlohmann/json.hpp"
#include "tools/dhsctl/events_command.h"
#include "tools/planner/plan_command.h"

namespace {

struct Query {
  dhs::wire::IntrospectWhat what = dhs::wire::IntrospectWhat::Status;
  uint64_t request = 0;
  uint32_t gpu = 0;
  uint32_t page_from = 0;   // pages: first page shown
  uint32_t page_count = 0;  // pages: rows at most (0: memd's default, 1000)
  bool page_runs = false;   // pages: run-length rows
};

int Ask(dhs::DealerClient& client, const Query& q, bool json, std::chrono::milliseconds timeout, uint64_t seq) {
  dhs::wire::IntrospectQueryT body;
  body.what = q.what;
  body.request = q.request;
  body.gpu = q.gpu;
  body.page_from = q.page_from;
  body.page_count = q.page_count;
  body.page_runs = q.page_runs;
  body.format = json ? dhs::wire::IntrospectFormat::Json : dhs::wire::IntrospectFormat::Text;
  auto bytes = client.Request(dhs::EncodeIntrospectQuery(body, seq, "dhsctl"), timeout);
  if (!bytes.ok()) {
    std::fprintf(stderr, "dhsctl: memd did not answer within %lld ms (%s)\n", static_cast<long long>(timeout.count()),
                 std::string(bytes.status().message()).c_str());
    return 3;
  }
  auto message = dhs::DecodeEnvelope(*bytes);
  if (!message.ok()) {
    std::fprintf(stderr, "dhsctl: bad reply: %s\n", std::string(message.status().message()).c_str());
    return 4;
  }
  if (message->type == dhs::wire::Body::ErrorReply) {
    const absl::Status error = dhs::ReadErrorStatus(*message);
    // NOT_FOUND: a request or GPU memd does not know. With --json the error is a JSON document on stdout too.
    if (json && error.code() == absl::StatusCode::kNotFound) {
      std::printf("%s\n", nlohmann::json{{"error", std::string(error.message())}}.dump(2).c_str());
      std::fflush(stdout);
    }
    std::fprintf(stderr, "dhsctl: memd: %s\n", error.ToString().c_str());
    return 4;  // every error memd answered, NOT_FOUND included (docs/operations.md)
  }
  auto reply = dhs::ReadIntrospectReply(*message);
  if (!reply.ok()) {
    std::fprintf(stderr, "dhsctl: %s\n", std::string(reply.status().message()).c_str());
    return 4;
  }
  const std::string& doc = reply->document;
  std::fwrite(doc.data(), 1, doc.size(), stdout);
  std::fflush(stdout);
  return 0;
}

// An unsigned id as a plain decimal number at most `max`: CLI11 would wrap "-1" to 2^64-1 and saturate a number
// beyond 2^64-1 to 2^64-1 (a valid id), so both are refused here, naming the word.
CLI::Validator NonNegativeId(const char* what, uint64_t max) {
  return CLI::Validator(
      [what, max](std::string& v) {
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
          return std::string(what) + " must be a non-negative integer, got '" + v + "'";
        }
        uint64_t n = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec != std::errc() || end != v.data() + v.size() || n > max) {
          return std::string(what) + " must be at most " + std::to_string(max) + ", got '" + v + "'";
        }
        return std::string();
      },
      "", "ID");
}

constexpr const char* kCommands =
    "status, gpus, requests, request, pages, queue, prefixes, events, watch, plan, worker-stats";

// The command line: the query (one view) and, for `watch`, how to repeat it.
struct Args {
  std::string run_dir = dhs::DefaultRunDir();
  bool json = false;
  int timeout_ms = 2000;
  Query q;
  double interval_s = 1.0;
  int count = 0;
  std::string watch_view = "status";
  CLI::App* watch = nullptr;
  dhs::planner::PlanCommandOptions plan_options;
  CLI::App* plan = nullptr;
  CLI::App* worker_stats = nullptr;  // worker-stats [--gpu G]
  uint32_t worker_gpu = 0;
  dhs::tools::EventsOptions events_options;  // events (issue 24)
  CLI::App* events = nullptr;
  bool by_client = false;            // request --client: ID is the client's request id (timeline)
};

// Declares the options and subcommands on `app`, writing into `a`.
void AddCommands(CLI::App& app, Args& a) {
  app.add_option("--run-dir", a.run_dir, "memd's run directory")->capture_default_str();
  app.add_flag("--json", a.json, "print JSON instead of a table");
  app.add_option("--timeout-ms", a.timeout_ms, "give up when memd does not answer in time (1..3600000)")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  app.require_subcommand(1);
  app.fallthrough();  // the global options may also follow the command: `dhsctl events --json`, `status --run-dir D`
  Query& q = a.q;
  app.add_subcommand("status", "GPUs (M, M_req, M_opt, M_res, free), requests and host pool")
      ->callback([&q] { q.what = dhs::wire::IntrospectWhat::Status; });
  app.add_subcommand("gpus", "page accounting per GPU")->callback([&q] { q.what = dhs::wire::IntrospectWhat::Gpus; });
  app.add_subcommand("requests", "admitted and queued requests (a_r, host coverage)")
      ->callback([&q] { q.what = dhs::wire::IntrospectWhat::Requests; });
  auto* request = app.add_subcommand("request", "one request");
  request->add_option("ID", q.request, "request id (node id; with --client: the client's id)")
      ->required()
      ->check(NonNegativeId("request ID", UINT64_MAX));
  request->add_flag("--client", a.by_client,
                    "ID is the client's request id: its timeline in every worker epoch (memd's events and the "
                    "workers': admitted, granted, reclaimed, populated, first token, end)");
  request->callback([&q, &a] {
    q.what = a.by_client ? dhs::wire::IntrospectWhat::Timeline : dhs::wire::IntrospectWhat::Request;
  });
  auto* pages = app.add_subcommand("pages", "state and owner of the pages of one GPU (1000 rows unless --count)");
  pages->add_option("GPU", q.gpu, "GPU id")->required()->check(NonNegativeId("GPU", UINT32_MAX));
  pages->add_option("--from", q.page_from, "first page shown (with --runs: where the first run starts), < M")
      ->check(NonNegativeId("--from", UINT32_MAX));
  pages->add_option("--count", q.page_count, "rows at most, 1..65536 (default 1000)")->check(CLI::Range(1, 65536));
  pages->add_flag("--runs", q.page_runs, "run-length rows: first page, count, state, owner of each run");
  pages->callback([&q] { q.what = dhs::wire::IntrospectWhat::Pages; });
  app.add_subcommand("queue", "queued admissions per GPU")->callback([&q] { q.what = dhs::wire::IntrospectWhat::Queue; });
  // Issue 24: the content-addressed host tier's chains (memd --prefix-sharing on).
  app.add_subcommand("prefixes", "shared prefix chains in the host tier: tenant, blocks, pages, holders, last use")
      ->callback([&q] { q.what = dhs::wire::IntrospectWhat::Prefixes; });
  a.watch = app.add_subcommand("watch", "repeat a view (status, gpus, requests, queue)");
  a.watch->add_option("--interval", a.interval_s, "seconds between refreshes, in (0, 86400]")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) {
            double s = 0;
            if (!CLI::detail::lexical_cast(v, s) || !(s > 0 && s <= 86400)) {
              return "--interval must be a number of seconds in (0, 86400], got " + v;
            }
            return std::string();
          },
          "", "SECONDS"));
  a.watch->add_option("--count", a.count, "stop after N refreshes (0: until interrupted)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  a.watch->add_option("VIEW", a.watch_view, "the view to repeat")
      ->check(CLI::IsMember({"status", "gpus", "requests", "queue"}))
      ->capture_default_str();
  a.plan = dhs::planner::AddPlanSubcommand(app, &a.plan_options);
  a.events = dhs::tools::AddEventsSubcommand(app, &a.events_options);
  a.worker_stats = app.add_subcommand("worker-stats", "a worker's counters (asked on RUN_DIR/worker-<gpu>.sock)");
  a.worker_stats->add_option("--gpu", a.worker_gpu, "the worker's GPU")
      ->check(NonNegativeId("--gpu", UINT32_MAX))
      ->capture_default_str();
}

// One request to a socket of the run dir (memd, worker-<gpu>) and its decoded reply, a view into `buffer` (which
// holds the reply's bytes: keep it while the message is read). Errors: UNAVAILABLE (no socket, cannot connect),
// DEADLINE_EXCEEDED (no answer), INTERNAL (undecodable), the peer's ErrorReply.
absl::StatusOr<dhs::Message> AskSocket(const std::string& run_dir, const std::string& name, const std::string& bytes,
                                       std::chrono::milliseconds timeout, std::string& buffer) {
  if (absl::Status s = dhs::CheckSocketAccess(run_dir, name); !s.ok()) {
    return absl::IsNotFound(s) ? absl::UnavailableError(absl::StrCat(name, " is not running (no socket at ", run_dir,
                                                                     "/", name, ".sock)"))
                               : s;
  }
  dhs::DealerClient::Options options;
  options.identity = "dhsctl/" + std::to_string(getpid());
  auto client = dhs::DealerClient::Connect(dhs::IpcEndpoint(run_dir, name), options);
  if (!client.ok()) return absl::UnavailableError(client.status().message());
  auto reply = (*client)->Request(bytes, timeout);
  if (!reply.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(name, " did not answer within ", timeout.count(), " ms"));
  }
  buffer = *std::move(reply);
  auto message = dhs::DecodeEnvelope(buffer);
  if (!message.ok()) return absl::InternalError(absl::StrCat("bad reply: ", message.status().message()));
  if (message->type == dhs::wire::Body::ErrorReply) {
    const absl::Status error = dhs::ReadErrorStatus(*message);
    // Kept apart from the transport's codes: the peer's own answer (exit 4).
    return absl::Status(error.code() == absl::StatusCode::kUnavailable ||
                                error.code() == absl::StatusCode::kDeadlineExceeded
                            ? absl::StatusCode::kInternal
                            : error.code(),
                        absl::StrCat(name, ": ", error.ToString()));
  }
  return message;
}

// The exit code of a failed AskSocket (docs/operations.md): 1 not running, 3 no answer, 4 an error answered.
int ExitCodeOf(const absl::Status& s) {
  if (absl::IsUnavailable(s)) return 1;
  if (absl::IsDeadlineExceeded(s)) return 3;
  return 4;
}

// The worker's WorkerStatsReply (with its timelines of `client_request` when `timeline`).
absl::StatusOr<dhs::wire::WorkerStatsReplyT> AskWorkerStats(const Args& a, uint32_t gpu, bool timeline,
                                                            uint64_t client_request) {
  dhs::wire::WorkerStatsQueryT q;
  q.timeline = timeline;
  q.timeline_client_request = client_request;
  std::string buffer;
  auto m = AskSocket(a.run_dir, absl::StrCat("worker-", gpu), dhs::EncodeWorkerStatsQuery(q, 1, "dhsctl"),
                     std::chrono::milliseconds(a.timeout_ms), buffer);
  if (!m.ok()) return m.status();
  if (m->type != dhs::wire::Body::WorkerStatsReply) {
    return absl::InternalError(absl::StrCat("worker-", gpu, " answered ", dhs::BodyName(m->type)));
  }
  return dhs::ReadWorkerStatsReply(*m);
}

int RunWorkerStats(const Args& a) {
  auto stats = AskWorkerStats(a, a.worker_gpu, false, 0);
  if (!stats.ok()) {
    std::fprintf(stderr, "dhsctl: %s\n", std::string(stats.status().message()).c_str());
    return ExitCodeOf(stats.status());
  }
  const std::string out =
      a.json ? dhs::WorkerStatsToJson(*stats).dump(2) + "\n" : dhs::WorkerStatsToTable(*stats);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

// `request --client ID`: memd's timelines of the client id (every epoch it kept), then each GPU's worker's (those it
// still keeps: a dead worker's are gone with it), merged by time.
int RunTimeline(const Args& a) {
  dhs::wire::IntrospectQueryT body;
  body.what = dhs::wire::IntrospectWhat::Timeline;
  body.client_request = a.q.request;
  body.format = dhs::wire::IntrospectFormat::Json;
  std::string buffer;
  auto m = AskSocket(a.run_dir, "memd", dhs::EncodeIntrospectQuery(body, 1, "dhsctl"),
                     std::chrono::milliseconds(a.timeout_ms), buffer);
  if (!m.ok()) {
    if (a.json && absl::IsNotFound(m.status())) {
      std::printf("%s\n", nlohmann::json{{"error", std::string(m.status().message())}}.dump(2).c_str());
    }
    std::fprintf(stderr, "dhsctl: %s\n", std::string(m.status().message()).c_str());
    return ExitCodeOf(m.status());
  }
  auto reply = dhs::ReadIntrospectReply(*m);
  if (!reply.ok()) {
    std::fprintf(stderr, "dhsctl: %s\n", std::string(reply.status().message()).c_str());
    return 4;
  }
  auto doc = nlohmann::json::parse(reply->document, nullptr, false);
  absl::StatusOr<std::vector<dhs::RequestTimeline>> timelines = absl::InternalError("memd's timeline is not JSON");
  if (!doc.is_discarded()) timelines = dhs::TimelinesFromJson(doc);
  if (!timelines.ok()) {
    std::fprintf(stderr, "dhsctl: %s\n", std::string(timelines.status().message()).c_str());
    return 4;
  }
  std::set<uint32_t> gpus;
  for (const dhs::RequestTimeline& t : *timelines) gpus.insert(t.gpu);
  std::vector<std::string> notes;
  for (uint32_t gpu : gpus) {
    auto stats = AskWorkerStats(a, gpu, true, a.q.request);
    absl::StatusOr<std::vector<dhs::RequestTimeline>> w = std::vector<dhs::RequestTimeline>();
    if (!stats.ok()) {
      w = stats.status();
    } else {
      auto wdoc = nlohmann::json::parse(stats->timeline_json, nullptr, false);
      if (wdoc.is_discarded()) {
        w = absl::InternalError("its timeline is not JSON");
      } else {
        w = dhs::TimelinesFromJson(wdoc);
      }
    }
    if (!w.ok()) {
      notes.push_back(absl::StrCat("worker of GPU ", gpu, ": no events (", w.status().message(), ")"));
      continue;
    }
    for (dhs::RequestTimeline& t : *w) timelines->push_back(std::move(t));
  }
  if (a.json) {
    std::vector<const dhs::RequestTimeline*> all;
    for (const dhs::RequestTimeline& t : *timelines) all.push_back(&t);
    nlohmann::json j = dhs::TimelinesToJson(all, "");
    j["client_request"] = a.q.request;
    j["notes"] = notes;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::string out = absl::StrCat("client request ", a.q.request, "\n", dhs::RenderTimelineTable(*timelines));
    for (const std::string& n : notes) absl::StrAppend(&out, n, "\n");
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  return 0;
}

// memd's `status` view as JSON, for `plan --live`. Errors: UNAVAILABLE (not running), DEADLINE_EXCEEDED (no answer),
// memd's error reply otherwise.
absl::StatusOr<std::string> FetchStatusJson(const Args& a) {
  if (!std::filesystem::exists(a.run_dir + "/memd.sock")) {
    return absl::UnavailableError("memd is not running (no socket at " + a.run_dir + "/memd.sock)");
  }
  dhs::DealerClient::Options options;
  options.identity = "dhsctl/" + std::to_string(getpid());
  auto client = dhs::DealerClient::Connect(dhs::IpcEndpoint(a.run_dir, "memd"), options);
  if (!client.ok()) return absl::UnavailableError(client.status().message());
  dhs::wire::IntrospectQueryT body;
  body.what = dhs::wire::IntrospectWhat::Status;
  body.format = dhs::wire::IntrospectFormat::Json;
  auto bytes =
      (*client)->Request(dhs::EncodeIntrospectQuery(body, 1, "dhsctl"), std::chrono::milliseconds(a.timeout_ms));
  if (!bytes.ok()) {
    return absl::DeadlineExceededError(absl::StrCat("memd did not answer within ", a.timeout_ms, " ms"));
  }
  auto message = dhs::DecodeEnvelope(*bytes);
  if (!message.ok()) return absl::InternalError(absl::StrCat("bad reply: ", message.status().message()));
  if (message->type == dhs::wire::Body::ErrorReply) {
    const absl::Status error = dhs::ReadErrorStatus(*message);
    // Unavailable / DeadlineExceeded mean "not running" / "no answer" to RunPlanCommand: memd's own are errors (4).
    return absl::IsUnavailable(error) || absl::IsDeadlineExceeded(error) ? absl::InternalError(error.ToString())
                                                                         : error;
  }
  auto reply = dhs::ReadIntrospectReply(*message);
  if (!reply.ok()) return absl::InternalError(reply.status().message());
  return reply->document;
}

// Connects to memd and asks once (or repeats for `watch`). Returns the exit code.
int Run(Args& a) {
  const std::string socket_path = a.run_dir + "/memd.sock";
  if (absl::Status s = dhs::CheckSocketAccess(a.run_dir, "memd"); !s.ok()) {
    if (absl::IsNotFound(s)) {
      std::fprintf(stderr, "dhsctl: memd is not running (no socket at %s)\n", socket_path.c_str());
    } else {  // "permission denied: ...", a path that is no directory: never an uncaught exception
      std::fprintf(stderr, "dhsctl: %s\n", std::string(s.message()).c_str());
    }
    return 1;
  }
  dhs::DealerClient::Options options;
  options.identity = "dhsctl/" + std::to_string(getpid());
  auto client = dhs::DealerClient::Connect(dhs::IpcEndpoint(a.run_dir, "memd"), options);
  if (!client.ok()) {
    std::fprintf(stderr, "dhsctl: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  const std::chrono::milliseconds timeout(a.timeout_ms);
  if (!a.watch->parsed()) return Ask(**client, a.q, a.json, timeout, 1);
  if (a.watch_view == "gpus") a.q.what = dhs::wire::IntrospectWhat::Gpus;
  else if (a.watch_view == "requests") a.q.what = dhs::wire::IntrospectWhat::Requests;
  else if (a.watch_view == "queue") a.q.what = dhs::wire::IntrospectWhat::Queue;
  else a.q.what = dhs::wire::IntrospectWhat::Status;
  for (int i = 0; a.count == 0 || i < a.count; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(a.interval_s));
    if (!a.json && isatty(STDOUT_FILENO)) std::fputs("\033[H\033[2J", stdout);
    if (int rc = Ask(**client, a.q, a.json, timeout, static_cast<uint64_t>(i) + 1); rc != 0) return rc;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app("dhsctl: show memd's state (GPU page accounting, requests, queue)");
  AddCommands(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    // An unknown first word: CLI11 reports "A subcommand is required"; name the word instead.
    const std::vector<std::string> rest = app.remaining();
    if (app.get_subcommands().empty() && !rest.empty() && !rest.front().starts_with("-")) {
      std::fprintf(stderr, "dhsctl: unknown command '%s' (expected one of %s)\nRun with --help for more information.\n",
                   rest.front().c_str(), kCommands);
      return 2;
    }
    app.exit(e);
    return 2;
  }
  if (a.plan->parsed()) {
    return dhs::planner::RunPlanCommand(a.plan_options, a.json, [&a] { return FetchStatusJson(a); });
  }
  if (a.run_dir.empty()) {  // would look for /memd.sock
    std::fprintf(stderr, "dhsctl: --run-dir: empty run directory\n");
    return 2;
  }
  if (a.worker_stats->parsed()) return RunWorkerStats(a);
  if (a.events->parsed()) return dhs::tools::RunEventsCommand(a.run_dir, a.events_options, a.json);
  if (a.q.what == dhs::wire::IntrospectWhat::Timeline) return RunTimeline(a);
  return Run(a);
}
