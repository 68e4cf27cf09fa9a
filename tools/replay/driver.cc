// tools/replay/driver.cc: the replay loop (see driver.h).
#include "tools/replay/driver.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dhs::replay {

double SteadyClock::NowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

std::optional<double> RequestTiming::ttft_ms() const {
  if (first_token_ms < 0 || submit_ms < 0) return std::nullopt;
  return first_token_ms - submit_ms;
}

std::optional<double> RequestTiming::tpot_ms() const {
  if (tokens < 2 || first_token_ms < 0) return std::nullopt;
  return (decode_ms >= 0 ? decode_ms : last_token_ms - first_token_ms) / static_cast<double>(tokens - 1);
}

std::string FormatProgressLine(const Progress& p) {
  return absl::StrFormat("replay: served %d/%d (failed %d), %d tokens, %.1f tokens/s, %.1f s", p.served,
                         p.total, p.ended - p.served, p.output_tokens, p.tokens_per_s(), p.elapsed_ms / 1000.0);
}

void PrintProgressToStderr(const Progress& progress) {
  std::fprintf(stderr, "\r%s\x1b[K", FormatProgressLine(progress).c_str());
  if (progress.ended == progress.total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

ReplayDriver::ReplayDriver(NodeClient* client, Clock* clock, DriverOptions options)
    : client_(client), clock_(clock), options_(std::move(options)) {}

absl::StatusOr<DriverResult> ReplayDriver::Run(const Trace& trace, Scheduler& scheduler) {
  partial_ = DriverResult{};
  DriverResult result;
  if (absl::Status s = RunInto(trace, scheduler, result); !s.ok()) {
    partial_ = std::move(result);
    return s;
  }
  return result;
}

std::string ChatPrompt(std::string_view previous, const std::vector<int32_t>& output, std::string_view next) {
  std::string p(previous);
  for (int32_t t : output) p.push_back(static_cast<char>(static_cast<uint8_t>(t)));
  if (next.size() > p.size()) {
    p.append(next.substr(p.size()));
  } else if (!next.empty()) {
    p.push_back(next.back());
  }
  return p;
}

// RunInto's state between its phases.
struct ReplayDriver::Loop {
  std::vector<size_t> held;          // --chat-turns: due, waiting for their previous turn's end (submit order)
  std::vector<std::string> prompts;  // --chat-turns: the prompt bytes sent, per trace position
  absl::flat_hash_map<RequestId, size_t> by_id;  // request id -> index in the trace
  double start = 0;                               // the clock when the run began, ms
  Progress progress;
  double last_progress_ms = 0;
  int64_t in_flight = 0;
  int64_t streaming = 0;  // requests with a first token that have not ended
  double last_activity_ms = 0;
};

double ReplayDriver::Now(const Loop& loop) const { return clock_->NowMs() - loop.start; }

absl::Status ReplayDriver::RunInto(const Trace& trace, Scheduler& scheduler, DriverResult& result) {
  const size_t n = trace.requests.size();
  if (scheduler.size() != n || scheduler.submitted() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("scheduler covers ", scheduler.size(), " requests (",
                                                   scheduler.submitted(), " already submitted), trace has ", n));
  }
  Loop loop;
  result.requests.resize(n);
  for (size_t i = 0; i < n; ++i) {
    result.requests[i].trace_index = trace.requests[i].index;
    result.requests[i].request = options_.first_request_id + static_cast<RequestId>(i);
    loop.by_id[result.requests[i].request] = i;
  }
  loop.start = clock_->NowMs();
  loop.progress.total = static_cast<int64_t>(n);
  if (!options_.chat_parent.empty()) loop.prompts.resize(n);

  while (!scheduler.all_submitted() || loop.in_flight > 0 || !loop.held.empty()) {
    if (absl::Status s = SubmitDue(trace, scheduler, result, loop); !s.ok()) return s;
    if (scheduler.all_submitted() && loop.in_flight == 0 && loop.held.empty()) break;

    double timeout = options_.poll_timeout_ms;
    if (auto due = scheduler.NextDueMs()) timeout = std::clamp(*due - Now(loop), 0.0, timeout);
    auto events = client_->Poll(timeout);
    if (!events.ok()) return events.status();
    const double t = Now(loop);
    result.elapsed_ms = t;

    bool any_tokens = false;
    for (const TokenEvent& ev : *events) {
      if (absl::Status s = Record(trace, ev, t, result, loop); !s.ok()) return s;
      any_tokens = any_tokens || !ev.tokens.empty();
    }
    // Requests streaming after this poll were all admitted at once; one that streamed and ended within the poll
    // was admitted at least by itself.
    result.streaming_max = std::max({result.streaming_max, loop.streaming, any_tokens ? int64_t{1} : int64_t{0}});
    // Issue 22: requests past their timeout are cancelled (once); their ends come from the node.
    if (options_.request_timeout_ms > 0) {
      if (absl::Status s = CancelTimedOut(result, t); !s.ok()) return s;
    }
    if (!events->empty()) {
      loop.last_activity_ms = t;
    } else if (loop.in_flight > 0 && t - loop.last_activity_ms > options_.idle_timeout_ms) {
      const absl::Status idle = absl::DeadlineExceededError(absl::StrFormat(
          "no event from the node for %.0f ms with %d requests in flight: the worker may be dead or stuck%s",
          t - loop.last_activity_ms, loop.in_flight, options_.idle_hint));
      CancelInFlight(result, loop.start, t - loop.last_activity_ms);
      return idle;
    }
    if (options_.on_progress && t - loop.last_progress_ms >= options_.progress_interval_ms) {
      loop.progress.elapsed_ms = t;
      options_.on_progress(loop.progress);
      loop.last_progress_ms = t;
    }
  }
  return Finish(result, loop);
}

absl::Status ReplayDriver::SubmitDue(const Trace& trace, Scheduler& scheduler, DriverResult& result, Loop& loop) {
  // --chat-turns: a held next turn goes once its previous turn ended (in the order they came due).
  std::vector<size_t> ready;
  auto parent_ended = [&](size_t i) {
    const int64_t p = i < options_.chat_parent.size() ? options_.chat_parent[i] : -1;
    return p < 0 || static_cast<size_t>(p) >= result.requests.size() ||
           result.requests[static_cast<size_t>(p)].end_ms >= 0;
  };
  std::erase_if(loop.held, [&](size_t i) {
    if (!parent_ended(i)) return false;
    ready.push_back(i);
    return true;
  });
  for (size_t i : scheduler.Due(Now(loop), loop.in_flight)) {
    if (!options_.chat_parent.empty() && !parent_ended(i)) {
      loop.held.push_back(i);
      continue;
    }
    ready.push_back(i);
  }
  for (size_t i : ready) {
    const TraceRequest& tr = trace.requests[i];
    SubmitRequest submit;
    submit.request = result.requests[i].request;
    submit.prompt = PromptRef{tr.index, tr.input_tokens, trace.block_tokens, tr.hash_ids};
    if (!options_.chat_parent.empty()) {  // issue 26: the chat template's prompt
      const int64_t p = i < options_.chat_parent.size() ? options_.chat_parent[i] : -1;
      std::string own = SynthesizePrompt(submit.prompt);
      if (p >= 0 && static_cast<size_t>(p) < result.requests.size() && result.requests[static_cast<size_t>(p)].served() &&
          !loop.prompts[static_cast<size_t>(p)].empty()) {
        own = ChatPrompt(loop.prompts[static_cast<size_t>(p)], result.requests[static_cast<size_t>(p)].output, own);
      }
      submit.prompt.input_tokens = static_cast<int64_t>(own.size());
      submit.prompt.tokens = own;
      loop.prompts[i] = std::move(own);
    }
    submit.max_new_tokens = tr.output_tokens;
    submit.sampling.seed = static_cast<uint64_t>(tr.index);
    const double t = Now(loop);
    if (absl::Status s = client_->Submit(submit); !s.ok()) return s;
    result.requests[i].submit_ms = t;
    loop.last_activity_ms = t;
    ++loop.in_flight;
  }
  return absl::OkStatus();
}

absl::Status ReplayDriver::Record(const Trace& trace, const TokenEvent& ev, double t, DriverResult& result,
                                  Loop& loop) {
  auto it = loop.by_id.find(ev.request);
  if (it == loop.by_id.end()) return absl::InternalError(absl::StrCat("event for unknown request ", ev.request));
  RequestTiming& r = result.requests[it->second];
  if (r.submit_ms < 0) {
    return absl::InternalError(absl::StrCat("event for request ", ev.request, " before it was submitted"));
  }
  if (r.end_ms >= 0) return absl::InternalError(absl::StrCat("event for request ", ev.request, " after it ended"));
  // (--chat-turns: the prompt sent, not the trace's length)
  const size_t at = it->second;
  const int64_t input = at < loop.prompts.size() && !loop.prompts[at].empty()
                            ? static_cast<int64_t>(loop.prompts[at].size())
                            : trace.requests[at].input_tokens;
  if (!ev.tokens.empty()) RecordTokens(ev, t, input, r, loop);
  r.allocation_wait_ms = std::max(r.allocation_wait_ms, ev.allocation_wait_ms);
  if (!ev.error.empty() || ev.finished) RecordEnd(ev, t, r, loop);
  return absl::OkStatus();
}

void ReplayDriver::RecordTokens(const TokenEvent& ev, double t, int64_t input_tokens, RequestTiming& r, Loop& loop) {
  if (r.first_token_ms < 0) {
    r.first_token_ms = t;
    r.decode_ms = 0;
    ++loop.streaming;
  } else {  // the node's gap when it gives one, else the polls' (issue 22)
    r.decode_ms += ev.token_interval_ms >= 0 ? ev.token_interval_ms : t - r.last_token_ms;
  }
  r.last_token_ms = t;
  r.tokens += static_cast<int64_t>(ev.tokens.size());
  r.output.insert(r.output.end(), ev.tokens.begin(), ev.tokens.end());
  r.logits_digests.insert(r.logits_digests.end(), ev.logits_digests.begin(), ev.logits_digests.end());
  loop.progress.output_tokens += static_cast<int64_t>(ev.tokens.size());
  if (options_.on_rows) options_.on_rows(ev.request, input_tokens + r.tokens - 1);
}

void ReplayDriver::RecordEnd(const TokenEvent& ev, double t, RequestTiming& r, Loop& loop) {
  r.error = ev.error;
  r.finished = ev.error.empty();
  r.end_ms = t;
  r.end_reason = ev.end_reason != EndReason::kNone ? ev.end_reason
                 : r.finished                     ? EndReason::kFinished
                                                  : EndReason::kFailed;
  if (r.end_reason == EndReason::kCancelled && r.cancel_sent_ms >= 0) {  // our timeout's cancel
    r.end_reason = EndReason::kTimeout;
    r.error = absl::StrCat("timeout: ", r.error, " (the worker released it)");
  }
  if (r.first_token_ms >= 0) --loop.streaming;
  --loop.in_flight;
  ++loop.progress.ended;
  if (r.finished) ++loop.progress.served;
}

absl::Status ReplayDriver::CancelTimedOut(DriverResult& result, double t) {
  for (RequestTiming& r : result.requests) {
    if (r.submit_ms < 0 || r.end_ms >= 0 || r.cancel_sent_ms >= 0) continue;
    if (t - r.submit_ms < options_.request_timeout_ms) continue;
    r.cancel_sent_ms = t;
    if (absl::Status s = client_->Cancel(
            r.request, absl::StrFormat("timeout after %.0f ms (dhs-replay --request-timeout-ms)",
                                       options_.request_timeout_ms));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ReplayDriver::Finish(DriverResult& result, Loop& loop) {
  result.elapsed_ms = Now(loop);
  if (options_.on_progress) {  // the final line, so the count on screen ends at total
    loop.progress.elapsed_ms = result.elapsed_ms;
    options_.on_progress(loop.progress);
  }
  auto stats = client_->Stats();
  if (!stats.ok()) return stats.status();
  result.stats = *std::move(stats);
  result.stats.sessions_admitted_max = std::max(result.stats.sessions_admitted_max, result.streaming_max);
  return absl::OkStatus();
}

void ReplayDriver::CancelInFlight(DriverResult& result, double start, double idle_ms) {
  int64_t open = 0;
  for (RequestTiming& r : result.requests) {
    if (r.submit_ms < 0 || r.end_ms >= 0) continue;
    ++open;
    if (r.cancel_sent_ms >= 0) continue;
    r.cancel_sent_ms = clock_->NowMs() - start;
    if (!client_->Cancel(r.request, absl::StrFormat("timeout: no event from the node for %.0f ms", idle_ms)).ok()) {
      return;  // the node is unusable: nothing will end them
    }
  }
  // The ends of the cancelled requests, for a short while: a live worker confirms each one (kTimeout).
  const double deadline = clock_->NowMs() + options_.cancel_wait_ms;
  while (open > 0 && clock_->NowMs() < deadline) {
    auto events = client_->Poll(std::min(options_.poll_timeout_ms, std::max(0.0, deadline - clock_->NowMs())));
    if (!events.ok()) return;
    const double t = clock_->NowMs() - start;
    for (const TokenEvent& ev : *events) {
      auto it = std::find_if(result.requests.begin(), result.requests.end(),
                             [&](const RequestTiming& r) { return r.request == ev.request; });
      if (it == result.requests.end() || it->end_ms >= 0 || (ev.error.empty() && !ev.finished)) continue;
      it->end_ms = t;
      it->error = ev.end_reason == EndReason::kCancelled ? absl::StrCat("timeout: ", ev.error, " (the worker released it)")
                                                         : ev.error;
      it->finished = ev.error.empty();
      it->end_reason = ev.end_reason == EndReason::kCancelled ? EndReason::kTimeout : ev.end_reason;
      --open;
    }
  }
}

ExactnessVerdict CompareOutputs(const DriverResult& a, const DriverResult& b) {
  auto differ = [](std::string reason) { return ExactnessVerdict{false, std::move(reason)}; };
  if (a.requests.size() != b.requests.size()) {
    return differ(absl::StrCat("the runs hold ", a.requests.size(), " and ", b.requests.size(), " requests"));
  }
  if (a.requests.empty()) return differ("no requests to compare");
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const RequestTiming& x = a.requests[i];
    const RequestTiming& y = b.requests[i];
    const std::string name = absl::StrCat("request ", x.request, " (trace row ", x.trace_index, ")");
    if (x.trace_index != y.trace_index) {
      return differ(absl::StrCat("request ", i, " in run order is trace row ", x.trace_index, " in one run and ",
                                 y.trace_index, " in the other"));
    }
    for (const auto& [r, run] : {std::pair<const RequestTiming*, const char*>{&x, "run"}, {&y, "reference"}}) {
      if (!r->served()) {
        return differ(absl::StrCat(name, " was not served in the ", run, ": ",
                                   r->error.empty() ? "did not finish" : r->error));
      }
      if (r->output.empty()) return differ(absl::StrCat(name, " has no output token in the ", run));
      if (r->logits_digests.size() < r->output.size()) {
        return differ(absl::StrCat(name, ": token ", r->logits_digests.size(), " has no logits digest in the ", run,
                                   " (", r->output.size(), " tokens, ", r->logits_digests.size(), " digests)"));
      }
      if (r->logits_digests.size() > r->output.size()) {
        return differ(absl::StrCat(name, " has ", r->logits_digests.size(), " logits digests for ", r->output.size(),
                                   " tokens in the ", run));
      }
    }
    const size_t n = std::min(x.output.size(), y.output.size());
    for (size_t t = 0; t < n; ++t) {
      if (x.output[t] != y.output[t]) {
        return differ(absl::StrCat(name, ": token ", t, " is ", x.output[t], " in the run and ", y.output[t],
                                   " in the reference"));
      }
      if (x.logits_digests[t] != y.logits_digests[t]) {
        return differ(absl::StrFormat("%s: token %d has logits digest %016x in the run and %016x in the reference",
                                      name, t, x.logits_digests[t], y.logits_digests[t]));
      }
    }
    if (x.output.size() != y.output.size()) {
      return differ(absl::StrCat(name, " has ", x.output.size(), " tokens in the run and ", y.output.size(),
                                 " in the reference"));
    }
  }
  return ExactnessVerdict{true, ""};
}

bool OutputsMatch(const DriverResult& a, const DriverResult& b) { return CompareOutputs(a, b).match; }

}  // namespace dhs::replay
