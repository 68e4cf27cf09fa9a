// tools/replay/closed_loop.h: the closed-loop prepared-prefix workload of dhs-replay (issue 27, "the seed's regime"):
// a fixed set of N prepared prefixes of L tokens; each session = one prefix (imported by the worker from its
// prepared-prefix row cache) + a short distinct suffix + a fixed number of output tokens; a closed loop at
// concurrency C over M sessions (a session starts as another ends). The prefix rows are computed once per prefix in a
// preparation phase (one request per prefix, 1 output token) whose time is reported apart from the measured window.
//
// Owns: PrefixWorkload (the settings), the two synthetic traces (preparation and sessions), the command-line block
// (AddPrefixWorkloadOptions; called from ParseReplayCommandLine), RunPrefixWorkload (both phases through one
// NodeClient) and the workerd arguments it needs (its prefix row cache sized to hold every prefix).
//
// Thread-safety: free functions over values; RunPrefixWorkload drives the client on the calling thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/replay/driver.h"
#include "tools/replay/node_client.h"
#include "tools/replay/report.h"
#include "tools/replay/trace.h"

namespace CLI {
class App;
}

namespace dhs::replay {

// The workload's settings (docs/replay.md "Closed loop over prepared prefixes"). prefixes == 0: off.
struct PrefixWorkload {
  int64_t prefixes = 0;            // --prefixes N >= 1: the prepared prefixes (0 = the workload is off)
  int64_t prefix_tokens = 0;       // --prefix-tokens L >= 1: tokens of each prefix, a multiple of block_tokens
  int64_t block_tokens = 0;        // --prefix-block-tokens B: tokens per hash block (0 = min(512, L))
  int64_t suffix_tokens = 16;      // --suffix-tokens S >= 1: each session's own tokens after the prefix
  int64_t output_tokens = 32;      // --session-output-tokens O >= 1: tokens each session generates
  int64_t sessions = 0;            // --sessions M: measured sessions (0 = per_c x concurrency, at least N)
  int64_t sessions_per_c = 4;      // --sessions-per-c K >= 1: with sessions == 0, K x C sessions at each C (a sweep)
  int64_t prefix_cache_bytes = 0;  // --prefix-cache-bytes: the worker's row cache (0 = sized to hold every prefix)

  bool on() const { return prefixes > 0; }
  int64_t block() const;                        // block_tokens, or min(512, L) when 0
  int64_t SessionsAt(int64_t concurrency) const;  // sessions, or max(N, sessions_per_c * concurrency) when 0
};

// Registers --prefixes, --prefix-tokens, --prefix-block-tokens, --suffix-tokens, --session-output-tokens, --sessions,
// --sessions-per-c and --prefix-cache-bytes on `app`, writing into `workload` (which must outlive the parse).
void AddPrefixWorkloadOptions(CLI::App& app, PrefixWorkload& workload);

// InvalidArgument naming the option: with prefixes > 0, prefix_tokens < 1, block_tokens < 0, L not a multiple of the
// block, suffix_tokens < 1, output_tokens < 1, sessions < 0, sessions_per_c < 1, prefix_cache_bytes < 0; with
// prefixes == 0, any of the
// other options changed from its default (they would be ignored); prefixes < 0.
absl::Status ValidatePrefixWorkload(const PrefixWorkload& workload);

// The hash id of block b of prefix p (distinct for every (p, b); chains of different prefixes share no block).
int64_t PrefixHashId(int64_t prefix, int64_t block);

// The preparation trace: N requests, request p = prefix p + S suffix tokens, 1 output token; trace rows 0..N-1.
Trace PreparationTrace(const PrefixWorkload& workload);

// The measured sessions: M requests, session i = prefix i mod N + S suffix tokens (its own: trace row N + i, so its
// suffix tokens differ from every other request's) + O output tokens. block_tokens = workload.block().
Trace SessionTrace(const PrefixWorkload& workload, int64_t sessions);

// What one workload run measured.
struct PrefixRunResult {
  DriverResult preparation;         // the preparation phase (its own timings; stats: the node's after it)
  double preparation_ms = 0;        // wall time of the preparation phase (not in the measured window)
  DriverResult measured;            // the sessions; stats: this phase's counters only (preparation's subtracted)
  int64_t concurrency = 0;          // C of the closed loop
  double window_begin_ms = 0;       // the clock's time when the sessions phase began and ended (the measured window)
  double window_end_ms = 0;
};

// Runs the preparation (closed loop at min(N, preparation_concurrency)) and then the sessions (closed loop at
// `concurrency`) through `client`. Request ids: preparation first_request_id + p, sessions first_request_id + N + i.
// The sampled peaks (sessions admitted, memory) start over between the phases (NodeClient::RestartPeaks): the
// measured window's are its own, the preparation's (min(N, preparation_concurrency) at once) stay in `preparation`.
// Errors: those of ReplayDriver::Run (the phase is named), InvalidArgument for concurrency < 1.
absl::StatusOr<PrefixRunResult> RunPrefixWorkload(NodeClient* client, Clock* clock, const DriverOptions& options,
                                                  const PrefixWorkload& workload, int64_t concurrency,
                                                  int64_t preparation_concurrency);

// The report's figures of a run: settings, sessions, in flight (max: the driver's streaming_max; mean: sum over the
// sessions of end - submit over the window, Little's law), the preparation's time and prefix blocks.
PrefixWorkloadFigures MakePrefixWorkloadFigures(const PrefixWorkload& workload, const PrefixRunResult& run);

// The workerd arguments of the workload: --prefix-cache-bytes (given, or N * L * bytes_per_token + 1/8 headroom) and
// --memd-timeout-ms kStarvedStepMs; bytes_per_token: the prefix block bytes per token (payload rows of every source +
// index keys). Empty when off.
std::vector<std::string> PrefixWorkloadWorkerArgs(const PrefixWorkload& workload, double bytes_per_token);
// The memd arguments of the workload: --worker-timeout-ms 1.5 x kStarvedStepMs. Empty when off. Why: one step of a
// long-context batch (a prefix's prefill chunk, a speculative round at C = 8 and more) can take seconds on a loaded
// CPU backend, during which the worker's loop sends no heartbeat; with the defaults (2 s / 3 s) memd would fence it
// and the worker end its epoch mid-benchmark.
std::vector<std::string> PrefixWorkloadMemdArgs(const PrefixWorkload& workload);
inline constexpr int64_t kStarvedStepMs = 40000;

// A sweep of the workload (--prefixes with --sweep C1,C2,...) on a node this tool starts runs every point on ONE node:
// the first point's preparation computes the prefixes, every later point's preparation imports them from the worker's
// row cache (its preparation_blocks_computed is 0, preparation_blocks_imported N * L / B), so a long context is
// prepared once per sweep rather than once per point. Each point's window holds its own sessions only (counters
// subtracted, requests of earlier points all ended). True when the workload is on, `sweep_points` > 0 and no
// --connect (`connect` empty: a worker given by --connect is one node for every point already).
bool PrefixSweepSharesNode(const PrefixWorkload& workload, size_t sweep_points, const std::string& connect);
// The first request id of sweep point `point` (0-based) on a shared node: 1 + point * kSweepRequestIdStride, so no
// two points' requests share an id. kSweepRequestIdStride = 2^32 requests per point.
RequestId SweepFirstRequestId(size_t point);
inline constexpr RequestId kSweepRequestIdStride = RequestId{1} << 32;
// --outputs OUT of a sweep point at concurrency C: OUT.c<C> (e.g. out.jsonl.c16); of a run without a sweep: OUT.
std::string SweepOutputsPath(const std::string& out, std::optional<int64_t> concurrency);

}  // namespace dhs::replay
