// tools/replay/node_client.cc: SynthesizePrompt, WorkerCountersSince (see node_client.h).
#include "tools/replay/node_client.h"

#include <algorithm>

#include "common/prompt_tokens.h"

namespace dhs::replay {

std::string_view EndReasonName(EndReason reason) {
  switch (reason) {
    case EndReason::kNone: return "not_ended";
    case EndReason::kFinished: return "finished";
    case EndReason::kFailed: return "failed";
    case EndReason::kRejected: return "rejected";
    case EndReason::kCancelled: return "cancelled";
    case EndReason::kTimeout: return "timeout";
    case EndReason::kWorkerStopping: return "worker_stopping";
    case EndReason::kWorkerGone: return "worker_gone";
  }
  return "unknown";
}

std::vector<uint64_t> HashIdsOf(const PromptRef& prompt) {
  return std::vector<uint64_t>(prompt.hash_ids.begin(), prompt.hash_ids.end());
}

std::string SynthesizePrompt(const PromptRef& prompt) {
  if (!prompt.tokens.empty()) return prompt.tokens;  // issue 26: explicit bytes
  const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(0, prompt.input_tokens));
  const uint64_t block = static_cast<uint64_t>(std::max<int64_t>(1, prompt.block_tokens));
  const std::vector<uint64_t> ids = HashIdsOf(prompt);
  const std::vector<uint8_t> tokens =
      SyntheticPromptTokens(ids, block, n, static_cast<uint64_t>(prompt.trace_index), 0, n);
  return std::string(tokens.begin(), tokens.end());
}

namespace {
int64_t NodeStats::*const kCounters[] = {&NodeStats::reclaims,          &NodeStats::repopulated_pages,
                                         &NodeStats::prefix_blocks_imported, &NodeStats::prefix_blocks_computed,
                                         &NodeStats::spec_rounds,       &NodeStats::spec_round_tokens,
                                         &NodeStats::spec_proposed,     &NodeStats::spec_accepted,
                                         &NodeStats::spec_propose_us,   &NodeStats::host_bytes_recovered,
                                         &NodeStats::prefix_lookups,    &NodeStats::prefix_hits_host,  // issue 24
                                         &NodeStats::prefix_hits_worker, &NodeStats::prefill_tokens_saved,
                                         &NodeStats::prefix_shared_pages_granted};
int64_t Census::*const kCensus[] = {&Census::direct, &Census::hot, &Census::host};
}  // namespace

void AddWorkerCounters(NodeStats& into, const NodeStats& from) {
  for (auto c : kCounters) into.*c += from.*c;
  for (auto c : kCensus) into.census.*c += from.census.*c;
  if (into.spec_width_rounds.size() < from.spec_width_rounds.size()) {
    into.spec_width_rounds.resize(from.spec_width_rounds.size(), 0);
  }
  for (size_t k = 0; k < from.spec_width_rounds.size(); ++k) into.spec_width_rounds[k] += from.spec_width_rounds[k];
}

NodeStats WorkerCountersSince(const NodeStats& now, const NodeStats& baseline) {
  for (auto c : kCounters) {
    if (now.*c < baseline.*c) return now;  // the worker restarted: its counters start again from 0
  }
  for (auto c : kCensus) {
    if (now.census.*c < baseline.census.*c) return now;
  }
  NodeStats out = now;
  for (auto c : kCounters) out.*c -= baseline.*c;
  for (auto c : kCensus) out.census.*c -= baseline.census.*c;
  for (size_t k = 0; k < out.spec_width_rounds.size() && k < baseline.spec_width_rounds.size(); ++k) {
    out.spec_width_rounds[k] -= std::min(out.spec_width_rounds[k], baseline.spec_width_rounds[k]);
  }
  return out;
}

}  // namespace dhs::replay
