// dhsctl: introspection CLI of memd (brief §3). Sends one IntrospectQuery and prints the document memd rendered
// with the shared DumpToJson / DumpToTable (memd/state_dump.h), so the daemon, the CLI and the tests show the same.
//
//   dhsctl [--run-dir DIR] [--json] [--timeout-ms MS] status | gpus | requests | request ID | pages GPU | queue
//   dhsctl ... watch [--interval S] [--count N] [VIEW]     (repeats `status` or VIEW every S seconds)
//
// Exit codes: 0 ok; a usage error: CLI11's non-zero code; 2 memd not running (no socket); 3 no answer within the timeout; 4 memd refused.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "CLI/CLI.hpp"
#include "common/status.h"
#include "common/transport.h"
#include "memd/daemon.h"

namespace {

struct Query {
  dhs::wire::IntrospectWhat what = dhs::wire::IntrospectWhat::Status;
  uint64_t request = 0;
  uint32_t gpu = 0;
};

int Ask(dhs::DealerClient& client, const Query& q, bool json, std::chrono::milliseconds timeout, uint64_t seq) {
  dhs::wire::IntrospectQueryT body;
  body.what = q.what;
  body.request = q.request;
  body.gpu = q.gpu;
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
    std::fprintf(stderr, "dhsctl: memd: %s\n", dhs::ReadErrorStatus(*message).ToString().c_str());
    return 4;
  }
  auto reply = dhs::ReadIntrospectReply(*message);
  if (!reply.ok()) {
    std::fprintf(stderr, "dhsctl: %s\n", std::string(reply.status().message()).c_str());
    return 4;
  }
  std::fwrite(reply->document.data(), 1, reply->document.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string run_dir = dhs::memd::DefaultRunDir();
  bool json = false;
  int timeout_ms = 2000;
  CLI::App app("dhsctl: show memd's state (GPU page accounting, requests, queue)");
  app.add_option("--run-dir", run_dir, "memd's run directory")->capture_default_str();
  app.add_flag("--json", json, "print JSON instead of a table");
  app.add_option("--timeout-ms", timeout_ms, "give up when memd does not answer in time")->capture_default_str();
  app.require_subcommand(1);
  Query q;
  app.add_subcommand("status", "GPUs (M, M_req, M_opt, M_res, free), requests and host pool")
      ->callback([&] { q.what = dhs::wire::IntrospectWhat::Status; });
  app.add_subcommand("gpus", "page accounting per GPU")->callback([&] { q.what = dhs::wire::IntrospectWhat::Gpus; });
  app.add_subcommand("requests", "admitted and queued requests (a_r, host coverage)")
      ->callback([&] { q.what = dhs::wire::IntrospectWhat::Requests; });
  auto* request = app.add_subcommand("request", "one request");
  request->add_option("ID", q.request, "request id")->required();
  request->callback([&] { q.what = dhs::wire::IntrospectWhat::Request; });
  auto* pages = app.add_subcommand("pages", "state and owner of every page of one GPU");
  pages->add_option("GPU", q.gpu, "GPU id")->required();
  pages->callback([&] { q.what = dhs::wire::IntrospectWhat::Pages; });
  app.add_subcommand("queue", "queued admissions per GPU")->callback([&] { q.what = dhs::wire::IntrospectWhat::Queue; });
  double interval_s = 1.0;
  int count = 0;
  std::string watch_view = "status";
  auto* watch = app.add_subcommand("watch", "repeat a view (status, gpus, requests, queue)");
  watch->add_option("--interval", interval_s, "seconds between refreshes")->capture_default_str()->check(
      CLI::PositiveNumber);
  watch->add_option("--count", count, "stop after N refreshes (0: until interrupted)")->capture_default_str();
  watch->add_option("VIEW", watch_view, "the view to repeat")
      ->check(CLI::IsMember({"status", "gpus", "requests", "queue"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::string socket_path = run_dir + "/memd.sock";
  if (!std::filesystem::exists(socket_path)) {
    std::fprintf(stderr, "dhsctl: memd is not running (no socket at %s)\n", socket_path.c_str());
    return 2;
  }
  dhs::DealerClient::Options options;
  options.identity = "dhsctl/" + std::to_string(getpid());
  auto client = dhs::DealerClient::Connect(dhs::IpcEndpoint(run_dir, "memd"), options);
  if (!client.ok()) {
    std::fprintf(stderr, "dhsctl: %s\n", std::string(client.status().message()).c_str());
    return 2;
  }
  const std::chrono::milliseconds timeout(timeout_ms);
  if (!watch->parsed()) return Ask(**client, q, json, timeout, 1);
  if (watch_view == "gpus") q.what = dhs::wire::IntrospectWhat::Gpus;
  else if (watch_view == "requests") q.what = dhs::wire::IntrospectWhat::Requests;
  else if (watch_view == "queue") q.what = dhs::wire::IntrospectWhat::Queue;
  else q.what = dhs::wire::IntrospectWhat::Status;
  for (int i = 0; count == 0 || i < count; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(interval_s));
    if (!json && isatty(STDOUT_FILENO)) std::fputs("\033[H\033[2J", stdout);
    if (int rc = Ask(**client, q, json, timeout, static_cast<uint64_t>(i) + 1); rc != 0) return rc;
  }
  return 0;
}
