#include "tools/dhsctl/events_command.h"


#include <chrono>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "common/kv_event_stream.h"
#include "common/transport.h"
#include "nlohmann/json.hpp"

namespace dhs::tools {
namespace {

std::string Hex(uint64_t v) { return absl::StrFormat("%016x", v); }

nlohmann::json EventJson(uint64_t seq, const KvEvent& e, const KvEventBatch& b) {
  nlohmann::json j{{"seq", seq}, {"kind", KvEventKindName(e.kind)}, {"medium", KvMediumName(e.medium)}};
  if (e.kind != KvEventKind::kAllBlocksCleared) {
    j.update({{"tenant", Hex(e.tenant)}, {"block_hash", Hex(e.block_hash)}, {"parent_hash", Hex(e.parent_hash)},
              {"blocks", e.blocks}, {"block_tokens", e.block_tokens}, {"pages", e.pages}, {"page_rows", e.page_rows}});
  }
  j.update({{"stream", Hex(b.stream)}, {"time_us", b.time_us}});
  return j;
}

void Print(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

CLI::App* AddEventsSubcommand(CLI::App& app, EventsOptions* options) {
  CLI::App* events = app.add_subcommand(
      "events", "print memd's KV events (block stored / removed, medium, tenant, chain hash, parent) as they come "
                "(memd --kv-events on)");
  events->add_option("--count", options->count, "stop after N events (0: until interrupted)")->capture_default_str();
  events->add_option("--idle-ms", options->idle_ms, "stop after this many ms without a message (0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  return events;
}

int RunEventsCommand(const std::string& run_dir, const EventsOptions& options, bool json) {
  if (absl::Status s = CheckSocketAccess(run_dir, kKvEventsSocket); !s.ok()) {
    std::fprintf(stderr, "dhsctl: no KV event stream at %s/%s.sock (memd not running, or without --kv-events on): %s\n",
                 run_dir.c_str(), std::string(kKvEventsSocket).c_str(), std::string(s.message()).c_str());
    return 1;
  }
  auto sub = KvEventSubscriber::Connect(IpcEndpoint(run_dir, kKvEventsSocket), {});
  if (!sub.ok()) {
    std::fprintf(stderr, "dhsctl: %s\n", std::string(sub.status().message()).c_str());
    return 1;
  }
  KvSequenceCheck check;
  uint64_t seen = 0;
  const auto wait = std::chrono::milliseconds(options.idle_ms > 0 ? options.idle_ms : 1000);
  while (options.count == 0 || seen < options.count) {
    auto batch = (*sub)->Next(wait);
    if (!batch.ok()) {
      std::fprintf(stderr, "dhsctl: bad KV event message: %s\n", std::string(batch.status().message()).c_str());
      return 4;
    }
    if (!batch->has_value()) {
      if (options.idle_ms > 0) break;
      continue;
    }
    const KvEventBatch& b = **batch;
    const KvSequenceStep step = check.Next(b);
    if (step.new_stream) {
      Print(json ? nlohmann::json{{"stream", Hex(b.stream)}, {"node", b.node}, {"first_seq", b.first_seq}}.dump()
                 : absl::StrFormat("stream %s node %s first_seq=%d", Hex(b.stream), b.node, b.first_seq));
    }
    if (step.lost > 0) {
      const uint64_t after = b.first_seq - step.lost - 1;
      Print(json ? nlohmann::json{{"gap", step.lost}, {"after_seq", after}}.dump()
                 : absl::StrFormat("gap lost=%d after seq=%d", step.lost, after));
    }
    for (size_t i = 0; i < b.events.size() && (options.count == 0 || seen < options.count); ++i, ++seen) {
      Print(json ? EventJson(b.first_seq + i, b.events[i], b).dump() : KvEventLine(b.first_seq + i, b.events[i]));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace dhs::tools
