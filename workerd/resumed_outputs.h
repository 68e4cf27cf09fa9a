// workerd/resumed_outputs.h: the bound on resumed outputs that wait for their client (issue 11, docs/protocol.md
// "Request records and resume").
//
// A request resumed after a worker restart has no client until one re-attaches (Attach). When it finishes first, its
// output (tokens, logits digests, or its error) is kept for that client. A client that never comes back (it died with
// the worker, or gave up) must not make the worker keep outputs without bound, so each kept output is named here
// (its key and size) and this class decides which ones to drop:
//   - count: more than max_outputs kept -> the oldest kept ones are dropped;
//   - bytes: more than max_bytes kept together -> the oldest kept ones are dropped (an output larger than max_bytes
//     alone is dropped at once: it never fits);
//   - age: an output kept for max_age or longer (Expire) is dropped.
//   - the same key kept again (two anonymous clients, SubmitRequest.client = 0, that used the same request id): the
//     older output is replaced (reported as dropped, kReplaced).
// "Oldest" is the order Keep was called in. Claim (the client attached) forgets an output.
//
// Events in, decisions out, as memd/residency_manager.h: no clocks (the caller passes `now`, non-decreasing), no
// sockets; the outputs themselves stay with the caller (Worker), which erases the dropped ones, logs and counts them.
//
// Invariants (CheckInvariants): outputs() <= max_outputs, bytes() <= max_bytes, bytes() = the sum of the kept
// outputs' bytes, every kept output younger than max_age as of the latest Expire.
//
// Thread-safety: none; the worker thread drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/types.h"

namespace dhs {

// workerd --resumed-outputs-max, --resumed-output-bytes-max, --resumed-output-age-ms (docs/operations.md).
struct ResumedOutputLimits {
  uint32_t max_outputs = 1024;                      // outputs kept at once, >= 1
  uint64_t max_bytes = uint64_t{64} << 20;          // their bytes together (ResumedOutputBytes), bytes, >= 1
  std::chrono::milliseconds max_age{10 * 60 * 1000};  // how long one waits for its client, ms, >= 1
};
// INVALID_ARGUMENT naming the flag when a limit is 0.
absl::Status ValidateResumedOutputLimits(const ResumedOutputLimits& limits);

// A resumed request as its client names it: (SubmitRequest.client, the client's request id).
using ResumeKey = std::pair<uint64_t, RequestId>;

// The bytes an output of `tokens` tokens (each kept with its 8-byte logits digest, tokens as 4-byte ints) and an error
// message of `message_bytes` holds: tokens * 12 + message_bytes.
uint64_t ResumedOutputBytes(uint64_t tokens, uint64_t message_bytes);

enum class ResumedDropReason { kCount, kBytes, kAge, kReplaced };
std::string_view ResumedDropReasonName(ResumedDropReason reason);  // "count", "bytes", "age", "replaced"

struct DroppedOutput {
  ResumeKey key;
  uint64_t bytes = 0;
  ResumedDropReason reason = ResumedDropReason::kCount;
  std::chrono::milliseconds waited{0};  // from its Keep to the decision
};

class ResumedOutputBound {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // Precondition: ValidateResumedOutputLimits(limits) is OK.
  explicit ResumedOutputBound(ResumedOutputLimits limits) : limits_(limits) {}

  // An output of `bytes` to keep for `key`'s client from `now` on. Returns the outputs to drop now, oldest first: the
  // older output of the same key (kReplaced; the caller keeps the new one under the key), then the oldest others while
  // over max_outputs (kCount) or max_bytes (kBytes); `key` itself (kBytes) when bytes > max_bytes alone.
  std::vector<DroppedOutput> Keep(ResumeKey key, uint64_t bytes, TimePoint now);
  // Its client attached: the output is forgotten (the caller streams it). False when `key` is not kept.
  bool Claim(ResumeKey key);
  // The outputs kept for max_age or longer as of `now`, oldest first; forgotten here.
  std::vector<DroppedOutput> Expire(TimePoint now);

  size_t outputs() const { return entries_.size(); }
  uint64_t bytes() const { return bytes_; }
  const ResumedOutputLimits& limits() const { return limits_; }
  // INTERNAL naming the broken invariant (header comment), else OK. O(outputs).
  absl::Status CheckInvariants() const;

 private:
  struct Entry {
    uint64_t bytes = 0;
    TimePoint kept;
    uint64_t order = 0;  // Keep's call order: the age order
  };
  DroppedOutput Drop(std::map<ResumeKey, Entry>::iterator it, ResumedDropReason reason, TimePoint now);

  ResumedOutputLimits limits_;
  std::map<ResumeKey, Entry> entries_;
  std::map<uint64_t, ResumeKey> by_order_;  // oldest first
  uint64_t next_order_ = 0;
  uint64_t bytes_ = 0;
  TimePoint last_expire_{};
};

}  // namespace dhs
