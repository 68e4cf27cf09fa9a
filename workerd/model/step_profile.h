// workerd/model/step_profile.h: an opt-in split of the model's step time (issue 27, "report the step time split"):
// with DHS_STEP_PROFILE=1 in the worker's environment, Model::Run times its phases and the worker's stderr (its log)
// gets, after every step, the cumulative line of its kind of step (decode: every request of the batch fed one token;
// mixed: any other, i.e. with prefill chunks or speculative rounds):
//   step profile: KIND steps N queries Q wall_ms W model_ms M index_topk_ms I fetch_ms F append_ms A release_ms R
//   outside_ms O at_ms T
// model = Run's wall time minus the timed phases (embedding, norms, matmuls, attention, MLP, logits);
// index_topk = the indexer's scores over every visible position and the top-k; fetch = KvAccess::Fetch (the resolve
// plan, hot-cache hits, host recoveries and their copies: the link model's time included); append = KvAccess::Append
// and StoreIndexKeys (tail, pages, host backups queued); release = ReadersDone; outside = time between the end of one
// step and the start of the next (the worker's loop: batching, emits, memd messages, and any idle wait); at = the end
// of the latest step on steady_clock (CLOCK_MONOTONIC, ms since its epoch: a client on the same machine, e.g.
// dhs-replay's window_begin_ms / window_end_ms, splits the cumulative lines per measured window).
// Issue 27 (admission, "where adaptive's admission time at 32K goes"): the worker's loop between steps is split too,
// in a third cumulative line printed after every prepared-prefix chunk and every step:
//   step profile: loop import_chunks N import_ms I import_append_ms A import_keys_ms K poll_ms P at_ms T
// import = PrefixImporter::ImportChunk (a prepared prefix's block imported from the row cache, or computed);
// import_append = of that, the rows' KvAccess::AppendRun calls of an imported block (tail copies, page completions,
// backups issued, waits for a tail slot); import_keys = its StoreIndexKeys and the session's key copy; poll = the
// residency agent's Poll (memd messages, copy completions published); at = when the line was printed (steady_clock
// ms, as above).
// Off (the default): one relaxed load of a pointer per phase, no clock read.
//
// Thread-safety: the worker's loop thread only (one Model::Run at a time), as the model itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dhs::model {

enum class StepPhase { kIndexTopK, kFetch, kAppend, kRelease, kCount };
// Parts of the worker's loop outside a step (the "loop" line).
enum class LoopPhase { kImport, kImportAppend, kImportKeys, kPoll, kCount };

class StepProfile {
 public:
  // The process's profile when DHS_STEP_PROFILE is set to a non-empty value other than "0", else null (read once).
  static StepProfile* Get();

  void StepBegin();
  // Ends a step of `queries` tokens over `requests` requests (decode when equal); prints its kind's cumulative line.
  void StepEnd(int64_t queries, int64_t requests);
  void Add(StepPhase phase, int64_t ns) { step_ns_[static_cast<int>(phase)] += ns; }
  void Add(LoopPhase phase, int64_t ns) { loop_ns_[static_cast<int>(phase)] += ns; }
  // Counts one prepared-prefix chunk (its time added as LoopPhase::kImport) and prints the loop line.
  void ImportChunkEnd();
  // The cumulative line of decode steps (decode = true) or of the others (without a newline).
  std::string Line(bool decode) const;
  // The cumulative loop line (without a newline).
  std::string LoopLine() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Totals {
    int64_t phase_ns[static_cast<int>(StepPhase::kCount)] = {};
    int64_t steps = 0, queries = 0, wall_ns = 0, outside_ns = 0;
  };
  int64_t step_ns_[static_cast<int>(StepPhase::kCount)] = {};  // the step in progress
  int64_t step_outside_ns_ = 0;
  Totals totals_[2];  // [0] mixed, [1] decode
  int64_t loop_ns_[static_cast<int>(LoopPhase::kCount)] = {};
  int64_t import_chunks_ = 0;
  Clock::time_point step_start_{}, last_end_{};
  bool has_last_end_ = false;
};

// Adds the time from construction to destruction to `phase` of `profile` (nothing when null).
template <typename Phase>
class BasicPhaseTimer {
 public:
  BasicPhaseTimer(StepProfile* profile, Phase phase) : profile_(profile), phase_(phase) {
    if (profile_) start_ = std::chrono::steady_clock::now();
  }
  ~BasicPhaseTimer() {
    if (profile_) {
      profile_->Add(phase_, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                                 start_).count());
    }
  }
  BasicPhaseTimer(const BasicPhaseTimer&) = delete;
  BasicPhaseTimer& operator=(const BasicPhaseTimer&) = delete;

 private:
  StepProfile* profile_;
  Phase phase_;
  std::chrono::steady_clock::time_point start_{};
};
using PhaseTimer = BasicPhaseTimer<StepPhase>;
using LoopTimer = BasicPhaseTimer<LoopPhase>;

}  // namespace dhs::model
