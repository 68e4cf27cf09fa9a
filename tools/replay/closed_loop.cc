// tools/replay/closed_loop.cc: the closed-loop prepared-prefix workload (see closed_loop.h).
#include "tools/replay/closed_loop.h"

#include <algorithm>
#include <cmath>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/cli_flags.h"
#include "tools/replay/scheduler.h"

namespace dhs::replay {
namespace {

// Block ids of prefix p: (p + 1) * kPrefixIdStride + b; a prefix of up to kPrefixIdStride blocks (2^32 x the block).
constexpr int64_t kPrefixIdStride = int64_t{1} << 32;

TraceRequest WorkloadRequest(const PrefixWorkload& w, int64_t index, int64_t prefix, int64_t output_tokens) {
  TraceRequest r;
  r.index = index;
  r.input_tokens = w.prefix_tokens + w.suffix_tokens;
  r.output_tokens = output_tokens;
  const int64_t blocks = w.prefix_tokens / w.block();
  r.hash_ids.reserve(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) r.hash_ids.push_back(PrefixHashId(prefix, b));
  return r;
}

Trace EmptyWorkloadTrace(const PrefixWorkload& w) {
  Trace t;
  t.path = absl::StrCat("prepared-prefixes:", w.prefixes, "x", w.prefix_tokens);
  t.format = TraceFormat::kMooncake;  // hash ids, as Mooncake's
  t.block_tokens = w.block();
  return t;
}

absl::StatusOr<DriverResult> RunPhase(NodeClient* client, Clock* clock, DriverOptions options, const Trace& trace,
                                      int64_t concurrency, const std::string& phase) {
  auto scheduler = Scheduler::ClosedLoop(trace.requests.size(), concurrency);
  if (!scheduler.ok()) return scheduler.status();
  ReplayDriver driver(client, clock, std::move(options));
  auto result = driver.Run(trace, *scheduler);
  if (!result.ok()) {
    return absl::Status(result.status().code(), absl::StrCat("prepared-prefix workload, ", phase, ": ",
                                                             std::string(result.status().message())));
  }
  return result;
}

}  // namespace

int64_t PrefixWorkload::block() const {
  return block_tokens > 0 ? block_tokens : std::min<int64_t>(512, std::max<int64_t>(1, prefix_tokens));
}

int64_t PrefixWorkload::SessionsAt(int64_t concurrency) const {
  return sessions > 0 ? sessions : std::max(prefixes, sessions_per_c * concurrency);
}

void AddPrefixWorkloadOptions(CLI::App& app, PrefixWorkload& w) {
  const std::string group = "Closed loop over prepared prefixes (issue 27)";
  app.add_option("--prefixes", w.prefixes,
                 "Prepared-prefix workload: N prefixes, computed once each, then --sessions sessions in a closed loop "
                 "at --concurrency (or each --sweep point); replaces --trace / --requests / --length-scale")
      ->group(group)->check(IntegerIn<int64_t>(0, 1 << 20));
  app.add_option("--prefix-tokens", w.prefix_tokens, "Tokens of each prepared prefix (a multiple of the block)")
      ->group(group)->check(IntegerIn<int64_t>(1, int64_t{1} << 40));
  app.add_option("--prefix-block-tokens", w.block_tokens, "Tokens per prefix hash block (0 = min(512, L))")
      ->group(group)->check(IntegerIn<int64_t>(0, int64_t{1} << 30));
  app.add_option("--suffix-tokens", w.suffix_tokens, "Each session's own tokens after its prefix")
      ->group(group)->check(IntegerIn<int64_t>(1, int64_t{1} << 30))->capture_default_str();
  app.add_option("--session-output-tokens", w.output_tokens, "Tokens each session generates")
      ->group(group)->check(IntegerIn<int64_t>(1, int64_t{1} << 30))->capture_default_str();
  app.add_option("--sessions", w.sessions, "Measured sessions per run (0 = max(N, --sessions-per-c x concurrency))")
      ->group(group)->check(IntegerIn<int64_t>(0, int64_t{1} << 30));
  app.add_option("--sessions-per-c", w.sessions_per_c,
                 "With --sessions 0: K x C sessions at each concurrency C (each --sweep point its own count)")
      ->group(group)->check(IntegerIn<int64_t>(1, int64_t{1} << 20))->capture_default_str();
  app.add_option("--prefix-cache-bytes", w.prefix_cache_bytes,
                 "The worker's prepared-prefix row cache, bytes (0 = sized to hold every prefix)")
      ->group(group)->transform(CLI::AsSizeValue(true));
}

absl::Status ValidatePrefixWorkload(const PrefixWorkload& w) {
  auto bad = [](const std::string& option, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(option, " ", what));
  };
  if (w.prefixes < 0) return bad("--prefixes", "must be >= 0");
  if (!w.on()) {
    const PrefixWorkload d;
    if (w.prefix_tokens != d.prefix_tokens || w.block_tokens != d.block_tokens || w.suffix_tokens != d.suffix_tokens ||
        w.output_tokens != d.output_tokens || w.sessions != d.sessions || w.sessions_per_c != d.sessions_per_c ||
        w.prefix_cache_bytes != d.prefix_cache_bytes) {
      return bad("--prefixes", "is needed by --prefix-tokens, --prefix-block-tokens, --suffix-tokens, "
                               "--session-output-tokens, --sessions, --sessions-per-c and --prefix-cache-bytes");
    }
    return absl::OkStatus();
  }
  if (w.prefix_tokens < 1) return bad("--prefix-tokens", "must be >= 1 with --prefixes");
  if (w.block_tokens < 0) return bad("--prefix-block-tokens", "must be >= 0");
  if (w.prefix_tokens % w.block() != 0) {
    return bad("--prefix-tokens", absl::StrCat("(", w.prefix_tokens, ") must be a multiple of the block (",
                                               w.block(), " tokens, --prefix-block-tokens)"));
  }
  if (w.prefix_tokens / w.block() >= kPrefixIdStride) return bad("--prefix-tokens", "has too many blocks");
  if (w.suffix_tokens < 1) return bad("--suffix-tokens", "must be >= 1");
  if (w.output_tokens < 1) return bad("--session-output-tokens", "must be >= 1");
  if (w.sessions < 0) return bad("--sessions", "must be >= 0");
  if (w.sessions_per_c < 1) return bad("--sessions-per-c", "must be >= 1");
  if (w.prefix_cache_bytes < 0) return bad("--prefix-cache-bytes", "must be >= 0");
  return absl::OkStatus();
}

int64_t PrefixHashId(int64_t prefix, int64_t block) { return (prefix + 1) * kPrefixIdStride + block; }

Trace PreparationTrace(const PrefixWorkload& w) {
  Trace t = EmptyWorkloadTrace(w);
  for (int64_t p = 0; p < w.prefixes; ++p) t.requests.push_back(WorkloadRequest(w, p, p, 1));
  return t;
}

Trace SessionTrace(const PrefixWorkload& w, int64_t sessions) {
  Trace t = EmptyWorkloadTrace(w);
  for (int64_t i = 0; i < sessions; ++i) {
    t.requests.push_back(WorkloadRequest(w, w.prefixes + i, i % std::max<int64_t>(1, w.prefixes), w.output_tokens));
  }
  return t;
}

absl::StatusOr<PrefixRunResult> RunPrefixWorkload(NodeClient* client, Clock* clock, const DriverOptions& options,
                                                  const PrefixWorkload& workload, int64_t concurrency,
                                                  int64_t preparation_concurrency) {
  if (concurrency < 1) return absl::InvalidArgumentError("prepared-prefix workload: concurrency must be >= 1");
  PrefixRunResult out;
  out.concurrency = concurrency;
  const double prep_start = clock->NowMs();
  auto prep = RunPhase(client, clock, options, PreparationTrace(workload),
                       std::clamp<int64_t>(preparation_concurrency, 1, std::max<int64_t>(1, workload.prefixes)),
                       "preparation");
  if (!prep.ok()) return prep.status();
  out.preparation_ms = clock->NowMs() - prep_start;
  out.preparation = *std::move(prep);
  DriverOptions session_options = options;
  session_options.first_request_id = options.first_request_id + static_cast<RequestId>(workload.prefixes);
  // The peaks (sessions admitted, memory) are memd samples since the client connected: start them over, so that they
  // are the measured window's, not the preparation's (which runs min(prefixes, slots) requests at once).
  if (absl::Status s = client->RestartPeaks(); !s.ok()) return s;
  out.window_begin_ms = clock->NowMs();
  auto measured = RunPhase(client, clock, session_options, SessionTrace(workload, workload.SessionsAt(concurrency)),
                           concurrency, "sessions");
  if (!measured.ok()) return measured.status();
  out.window_end_ms = clock->NowMs();
  out.measured = *std::move(measured);
  // The node's counters since the client connected include the preparation: keep the sessions' share (the peaks are
  // the window's already, RestartPeaks; WorkerCountersSince keeps them from `now`).
  out.measured.stats = WorkerCountersSince(out.measured.stats, out.preparation.stats);
  return out;
}

PrefixWorkloadFigures MakePrefixWorkloadFigures(const PrefixWorkload& w, const PrefixRunResult& run) {
  PrefixWorkloadFigures f;
  f.prefixes = w.prefixes;
  f.prefix_tokens = w.prefix_tokens;
  f.block_tokens = w.block();
  f.suffix_tokens = w.suffix_tokens;
  f.output_tokens = w.output_tokens;
  f.sessions = static_cast<int64_t>(run.measured.requests.size());
  f.concurrency = run.concurrency;
  f.in_flight_max = run.measured.streaming_max;
  double busy_ms = 0;
  for (const RequestTiming& t : run.measured.requests) {
    if (t.submit_ms >= 0 && t.end_ms >= t.submit_ms) busy_ms += t.end_ms - t.submit_ms;
  }
  f.in_flight_mean = run.measured.elapsed_ms > 0 ? busy_ms / run.measured.elapsed_ms : 0.0;
  f.preparation_s = run.preparation_ms / 1000.0;
  f.preparation_blocks_computed = run.preparation.stats.prefix_blocks_computed;
  f.preparation_blocks_imported = run.preparation.stats.prefix_blocks_imported;
  f.window_begin_ms = run.window_begin_ms;
  f.window_end_ms = run.window_end_ms;
  return f;
}

std::vector<std::string> PrefixWorkloadWorkerArgs(const PrefixWorkload& w, double bytes_per_token) {
  if (!w.on()) return {};
  int64_t bytes = w.prefix_cache_bytes;
  if (bytes == 0) {
    const double need = double(w.prefixes) * double(w.prefix_tokens) * std::max(0.0, bytes_per_token);
    bytes = static_cast<int64_t>(std::ceil(need * 1.125)) + (int64_t{1} << 20);
  }
  return {"--prefix-cache-bytes", std::to_string(bytes), "--memd-timeout-ms", std::to_string(kStarvedStepMs)};
}

std::vector<std::string> PrefixWorkloadMemdArgs(const PrefixWorkload& w) {
  if (!w.on()) return {};
  return {"--worker-timeout-ms", std::to_string(kStarvedStepMs * 3 / 2)};
}

bool PrefixSweepSharesNode(const PrefixWorkload& w, size_t sweep_points, const std::string& connect) {
  return w.on() && sweep_points > 0 && connect.empty();
}

RequestId SweepFirstRequestId(size_t point) { return 1 + static_cast<RequestId>(point) * kSweepRequestIdStride; }

std::string SweepOutputsPath(const std::string& out, std::optional<int64_t> concurrency) {
  return concurrency ? absl::StrCat(out, ".c", *concurrency) : out;
}

}  // namespace dhs::replay
