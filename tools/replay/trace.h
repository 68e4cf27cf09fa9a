// tools/replay/trace.h: request traces for dhs-replay (brief §10): the Mooncake JSONL and Azure CSV readers,
// the common TraceRequest, length scaling and the first-N selection.
//
// Thread-safety: free functions over values; no shared state. Safe to call from any thread.
//
// Units: arrival_ms in milliseconds from the first request of the trace; lengths in tokens; a prefix block
// (one hash id) covers `block_tokens` tokens (512 in the Mooncake release; brief §10).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace dhs::replay {

// One request of a trace.
struct TraceRequest {
  int64_t index = 0;               // 0-based row of the request in its trace file (data rows only)
  double arrival_ms = 0;           // arrival, ms after the trace's first request (>= 0)
  int64_t input_tokens = 0;        // prompt length, tokens (>= 1)
  int64_t output_tokens = 0;       // tokens to generate, tokens (>= 1)
  std::vector<int64_t> hash_ids;   // prefix-block ids, one per block of Trace::block_tokens tokens;
                                   // equal ids = shared prefix. Empty for traces without them (Azure).
};

enum class TraceFormat { kMooncake, kAzure };

std::string_view TraceFormatName(TraceFormat format);  // "mooncake" / "azure"

struct Trace {
  std::string path;                   // the file it was read from
  TraceFormat format = TraceFormat::kMooncake;
  int64_t block_tokens = 512;         // tokens per hash block (Mooncake: 512; scaled by ScaleLengths)
  std::vector<TraceRequest> requests; // in file order (arrivals are non-decreasing in both public traces)
};

// Mooncake JSONL: one JSON object per line with `timestamp` (ms), `input_length`, `output_length` (tokens,
// integers >= 1) and `hash_ids` (array of integers). Blank lines are skipped. Errors (InvalidArgument or
// NotFound) name the file and the 1-based line: "trace.jsonl:7: input_length must be an integer >= 1".
// arrival_ms is the timestamp minus the first request's timestamp; a timestamp earlier than the first is an error.
absl::StatusOr<Trace> ReadMooncakeTrace(std::string_view path);

// Azure LLM inference CSV: header `TIMESTAMP,ContextTokens,GeneratedTokens`, then rows like
// `2023-11-16 18:17:03.9799600,4808,10` (UTC wall time, fraction of a second with up to 9 digits).
// arrival_ms = offset from the first row's timestamp. No hash ids. Errors name file and line as above.
absl::StatusOr<Trace> ReadAzureTrace(std::string_view path);

// Picks the reader by extension: ".jsonl" -> Mooncake, ".csv" -> Azure; anything else is InvalidArgument.
absl::StatusOr<Trace> ReadTrace(std::string_view path);

// Parses an Azure TIMESTAMP into ms since the Unix epoch, with absl::ParseTime: "YYYY-MM-DD HH:MM:SS" (every field
// zero-padded, a valid calendar date and time of day), an optional fraction of a second ".d" with 1 to 9 digits, and
// an optional UTC offset ("Z", "+hh:mm", "-hhmm"); no offset = UTC (the public traces carry none).
// InvalidArgument for anything else, naming the stamp and the reason; a leap second ":60" is rejected
// (used by ReadAzureTrace; public for tests).
absl::StatusOr<double> ParseAzureTimestampMs(std::string_view text);

// Length scale X > 0 (brief §10 traces are far longer than a small CPU model can serve):
//   input_tokens  <- max(1, round(input_tokens * X)), output_tokens <- max(1, round(output_tokens * X)),
//   block_tokens  <- max(1, round(block_tokens * X)); hash ids keep their values (shared prefixes stay
//   shared) but are cut to ceil(input_tokens / block_tokens) blocks, so that the blocks never cover more
//   than the scaled prompt. Rounding is half away from zero (std::llround). Arrivals are unchanged.
// InvalidArgument when X is not a finite number > 0, or when a scaled length would reach 2^62 tokens.
absl::StatusOr<Trace> ScaleLengths(Trace trace, double length_scale);

// Keeps the first n requests (`--requests N`). InvalidArgument when n < 1 or the trace has fewer than n.
absl::StatusOr<Trace> TakeFirst(Trace trace, int64_t n);

}  // namespace dhs::replay
