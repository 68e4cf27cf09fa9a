// tools/dhsctl/events_command.h: `dhsctl events` (issue 24), the consumer example of memd's KV event stream
// (docs/protocol.md "KV event stream"): subscribes to RUN_DIR/kv-events.sock (memd --kv-events on) and prints each
// event as a line (common/kv_event_stream.h KvEventLine) or, with --json, as one JSON object per line (JSON Lines):
//   {"seq":N,"kind":"stored|removed|cleared","medium":"host",...,"stream":"<hex>","time_us":T}
// A new stream (the first batch seen, or memd restarted) prints "stream <hex> node <dir>" ({"stream":..,"node":..});
// lost events print "gap lost=N after seq=S" ({"gap":N,"after_seq":S}): a router that sees one resyncs
// (e.g. from `dhsctl prefixes`).
//
// Exit codes (as dhsctl's): 0 after --count events or --idle-ms without a message (or interrupted); 1 no event
// socket (memd not running, or without --kv-events on); 4 a message that is not a KV event batch of this version.
#pragma once

#include <cstdint>
#include <string>

#include "CLI/CLI.hpp"

namespace dhs::tools {

struct EventsOptions {
  uint64_t count = 0;    // stop after this many events (0: no limit)
  int64_t idle_ms = 0;   // stop after this long without a message (0: never)
};

// Adds the `events` subcommand to `app`, writing into `options`; returns it (parsed() says whether it was given).
CLI::App* AddEventsSubcommand(CLI::App& app, EventsOptions* options);
// Runs it against memd of `run_dir`; returns the exit code.
int RunEventsCommand(const std::string& run_dir, const EventsOptions& options, bool json);

}  // namespace dhs::tools
