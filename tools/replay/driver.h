// tools/replay/driver.h: runs a trace through a NodeClient under a Scheduler and records per-request timings
// (submit, first token, last token, end, allocation wait, tokens) for the report (issue 5, brief §10).
//
// Thread-safety: a ReplayDriver is used by one thread; Run() drives the client on the calling thread. The
// client and clock it points to must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/replay/node_client.h"
#include "tools/replay/scheduler.h"
#include "tools/replay/trace.h"

namespace dhs::replay {

// Monotonic time in ms. The real one reads std::chrono::steady_clock; tests use a fake one.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double NowMs() = 0;
};

class SteadyClock final : public Clock {
 public:
  double NowMs() override;
};

// One request's timeline. Times are ms since the run started; -1 = did not happen.
struct RequestTiming {
  int64_t trace_index = 0;
  RequestId request = 0;
  double submit_ms = -1;        // Submit() was called
  double first_token_ms = -1;   // the poll that returned its first token(s) ended
  double last_token_ms = -1;    // the poll that returned its last token(s) ended
  // Issue 22: first token to last token as the node produced them, ms: per event, the node's own gap
  // (TokenEvent::token_interval_ms, the worker's stamps), else the gap between the polls that returned them.
  // -1 = not measured (a hand-made timing): tpot_ms then uses last_token_ms - first_token_ms.
  double decode_ms = -1;
  double end_ms = -1;           // finished or failed
  int64_t tokens = 0;           // output tokens received
  double allocation_wait_ms = 0;  // the node's figure (TokenEvent::allocation_wait_ms), the latest seen
  bool finished = false;        // ended without error
  std::string error;            // non-empty: failed with this text
  EndReason end_reason = EndReason::kNone;  // why it ended (kNone: not ended; kTimeout: the driver cancelled it)
  double cancel_sent_ms = -1;   // the driver asked the node to cancel it (timeout), ms since the start; -1 = never
  std::vector<int32_t> output;  // the tokens, in order (for the exactness check, brief §7)
  std::vector<uint64_t> logits_digests;  // per token when the node reports them (exactness of the logits)

  bool served() const { return finished && error.empty(); }
  // Time to first token, ms: first_token_ms - submit_ms. nullopt without a token.
  std::optional<double> ttft_ms() const;
  // Time per output token after the first, ms: decode_ms / (tokens - 1) (the node's stamps, issue 22), or
  // (last_token_ms - first_token_ms) / (tokens - 1) when decode_ms is not measured. nullopt with fewer than 2 tokens.
  std::optional<double> tpot_ms() const;
};

struct DriverResult {
  std::vector<RequestTiming> requests;  // one per trace request, in trace order
  double elapsed_ms = 0;                // start of the run to the end of the last request
  NodeStats stats;                      // NodeClient::Stats() at the end; sessions_admitted_max is at least
                                        // streaming_max (a request streaming tokens holds its allocation)
  int64_t streaming_max = 0;            // most requests seen streaming at once (first token seen, not ended)
};

// A progress snapshot for the live line.
struct Progress {
  int64_t served = 0;         // requests finished without error
  int64_t ended = 0;          // finished or failed
  int64_t total = 0;          // requests in the run
  int64_t output_tokens = 0;  // tokens received so far
  double elapsed_ms = 0;
  double tokens_per_s() const { return elapsed_ms > 0 ? output_tokens * 1000.0 / elapsed_ms : 0.0; }
};

// "replay: served 12/24 (failed 0), 1234 tokens, 56.7 tokens/s, 21.8 s"
std::string FormatProgressLine(const Progress& progress);
// Writes FormatProgressLine to stderr on one line rewritten in place ("\r...").
void PrintProgressToStderr(const Progress& progress);

struct DriverOptions {
  RequestId first_request_id = 1;     // request ids are first_request_id + trace index
  double poll_timeout_ms = 50;        // longest single Poll() wait
  double idle_timeout_ms = 120'000;   // fail (DeadlineExceeded) after this long with requests in flight and no event;
                                      // every request in flight is cancelled first (NodeClient::Cancel, issue 22)
  // Issue 22 (dhs-replay --request-timeout-ms): > 0: a request not ended this long after its submit is cancelled
  // (NodeClient::Cancel "timeout after N ms": the worker releases its slot and pages); it ends, when the node says
  // so, as failed with end reason kTimeout, and the run goes on. 0 = none.
  double request_timeout_ms = 0;
  // How long the idle timeout waits for the ends of the requests it cancelled before it fails the run, ms.
  double cancel_wait_ms = 2000;
  double progress_interval_ms = 1000; // at most one progress call per interval
  std::function<void(const Progress&)> on_progress = PrintProgressToStderr;  // null: no progress
  std::string idle_hint;  // appended to the idle-timeout error: where to look (the worker's log)
  // Issue 28 (the host ledger's unconfirmed pages): after each event with tokens, the rows of KV the node has
  // computed for `request` by the tokens it sent: prompt + output tokens - 1 (the last token's row comes with the
  // next step). Null: not called. Runs on the driver's thread.
  std::function<void(RequestId request, int64_t rows)> on_rows;
  // Issue 26 (sessions across nodes; dhs-replay --chat-turns): per trace position, the position of the request's
  // previous turn in its session (tools/replay/sessions.h SessionTurn::parent), or -1. Non-empty: a next turn is held
  // until its previous turn ended, then sent with ChatPrompt (history, the answer, the new tokens) when that turn was
  // served (a failed previous turn: its own trace prompt).
  std::vector<int64_t> chat_parent;
};

// Issue 26 (--chat-turns): a next turn's prompt as a chat template builds it: the previous turn's prompt bytes, its
// output tokens, then the next turn's own prompt bytes (`next`: its trace prompt, SynthesizePrompt) from position
// |previous| + |output| on (its new blocks); at least one of them (its last), so the prompt always ends with a new
// token. Its length is max(|next|, |previous| + |output| + 1). Pure.
std::string ChatPrompt(std::string_view previous, const std::vector<int32_t>& output, std::string_view next);

class ReplayDriver {
 public:
  ReplayDriver(NodeClient* client, Clock* clock, DriverOptions options = {});

  // Submits every request of `trace` when `scheduler` says so (the scheduler must cover trace.requests.size()
  // requests), polls the client and records each request's timeline until all have ended, then reads
  // NodeClient::Stats(). All events of one Poll() are stamped with the time that Poll() returned (TTFT, end times);
  // the time between tokens is the node's own where it gives it (TokenEvent::token_interval_ms).
  // Errors: a client error (returned as is); an event for an unknown or already ended request (Internal);
  // no event for idle_timeout_ms while requests are in flight (DeadlineExceeded); a scheduler of the wrong
  // size (InvalidArgument).
  // After a failed Run: what was recorded until the failure (node stats not read), else empty.
  absl::StatusOr<DriverResult> Run(const Trace& trace, Scheduler& scheduler);
  const DriverResult& partial() const { return partial_; }

 private:
  struct Loop;  // RunInto's state between its phases (driver.cc)
  absl::Status RunInto(const Trace& trace, Scheduler& scheduler, DriverResult& result);
  double Now(const Loop& loop) const;  // ms since the run began
  // RunInto's phases. Submits the requests the scheduler says are due (a client error is returned as is).
  absl::Status SubmitDue(const Trace& trace, Scheduler& scheduler, DriverResult& result, Loop& loop);
  // Records one event stamped `t` (its tokens, then its end); Internal for an unknown, unsubmitted or ended request.
  absl::Status Record(const Trace& trace, const TokenEvent& ev, double t, DriverResult& result, Loop& loop);
  void RecordTokens(const TokenEvent& ev, double t, int64_t input_tokens, RequestTiming& r, Loop& loop);
  void RecordEnd(const TokenEvent& ev, double t, RequestTiming& r, Loop& loop);
  // Issue 22: cancels (once) each request not ended request_timeout_ms after its submit.
  absl::Status CancelTimedOut(DriverResult& result, double t);
  // The final progress line and the node's stats.
  absl::Status Finish(DriverResult& result, Loop& loop);
  // The idle timeout (issue 22): cancels every request in flight and records the ends the node confirms within
  // cancel_wait_ms (end reason kTimeout).
  void CancelInFlight(DriverResult& result, double start, double idle_ms);
  DriverResult partial_;
  NodeClient* client_;
  Clock* clock_;
  DriverOptions options_;
};

// brief §7 exactness: the verdict of comparing run `a` with reference run `b`, request by request in trace order.
// They match only when both hold the same number of requests (at least one), and for every request: served in both
// runs, the same trace row, at least one token, identical output tokens, and a logits digest for every token on both
// sides (logits_digests.size() == output.size()) with identical values (bit-identical logits). A missing digest is a
// mismatch, never a pass on tokens alone: two runs whose digests were both lost do not match.
struct ExactnessVerdict {
  bool match = false;
  std::string reason;  // empty when match; else the first difference, naming the request (id and trace row) and,
                       // for a token or digest, its 0-based token index
};
ExactnessVerdict CompareOutputs(const DriverResult& a, const DriverResult& b);
// CompareOutputs(a, b).match.
bool OutputsMatch(const DriverResult& a, const DriverResult& b);

}  // namespace dhs::replay
