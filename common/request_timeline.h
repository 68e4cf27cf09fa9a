// common/request_timeline.h: the bounded per-request timelines behind `dhsctl request CLIENT_ID` (issue 22).
//
// Each process keeps the events it sees itself: memd the admission side (admitted, waited, granted, reclaimed,
// populated, rejected, completed, interrupted, and `resumed` on an interrupted request a resume took over), the worker the serving
// side (submitted, first_token, end). A timeline is keyed by the node request id and carries the client's id
// (SubmitRequest.request, the same in every epoch: a resume keeps it) and identity, so `dhsctl request CLIENT_ID`
// finds every epoch's node id of one client request in memd and merges the workers' events by time.
//
// Bounds (TimelineLimits): at most max_requests timelines per process (opening one more evicts the oldest ended one,
// else the oldest), each of at most max_events events: beyond that, events are dropped and counted (events_dropped),
// except the terminal ones (rejected, completed, interrupted, resumed, end), which replace the latest kept event. Times are
// CLOCK_MONOTONIC microseconds (std::chrono::steady_clock on Linux: one clock for every process of the node).
//
// Like the decision cores it makes no I/O and reads no clock: events in (Open / Add / End), lookups out.
// Thread-safety: none; its process's event loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace dhs {

// The events, in the order a request usually meets them. Names (TimelineEventName) are what dhsctl prints.
enum class TimelineEvent : uint8_t {
  kSubmitted = 0,   // worker: the client's SubmitRequest accepted (or a resume of an interrupted request started)
  kAdmitted = 1,    // memd: AdmitRequest accepted by the core (detail: "resume of N" for a resume)
  kWaited = 2,      // memd: AdmitWait sent (pages = queue position)
  kGranted = 3,     // memd: AdmitGrant sent (pages = required + optional GPU pages granted)
  kReclaimed = 4,   // memd: ReclaimOrder sent for its optional history (pages = GPU pages reclaimed)
  kPopulated = 5,   // memd: PopulateOrder sent (pages = GPU pages to populate)
  kFirstToken = 6,  // worker: the first token generated (a resumed request: the first new token)
  kEnd = 7,         // worker: the request ended (pages = tokens generated; detail: "ok" or the error)
  kRejected = 8,    // memd: AdmitReject (detail: why)
  kCompleted = 9,   // memd: CompleteAck (its pages released)
  kResumed = 10,    // memd: an interrupted request taken over by a resume admission (detail: "as N")
  kInterrupted = 11,  // memd: its GPU was fenced (its worker died or hung) while it was admitted (detail: why)
};
std::string_view TimelineEventName(TimelineEvent event);
// The event named `name`. Errors: INVALID_ARGUMENT for an unknown name.
absl::StatusOr<TimelineEvent> TimelineEventOf(std::string_view name);

struct TimelineEntry {
  int64_t at_us = 0;   // CLOCK_MONOTONIC, us
  TimelineEvent event = TimelineEvent::kSubmitted;
  uint64_t pages = 0;  // pages, queue position or tokens (TimelineEvent says which); 0 when none
  std::string detail;
  std::string source;  // "memd" or "worker/<gpu>": filled by the process that renders it
};

struct RequestTimeline {
  uint64_t request = 0;         // node request id
  uint64_t client_request = 0;  // the client's id (SubmitRequest.request)
  uint64_t client = 0;          // the client's identity (SubmitRequest.client; 0 = none)
  uint32_t gpu = 0;
  uint32_t epoch = 0;           // the GPU's epoch the node id belongs to (EpochOfNodeRequestId)
  bool ended = false;
  uint64_t events_dropped = 0;  // events beyond max_events not kept
  std::vector<TimelineEntry> events;
};

struct TimelineLimits {
  size_t max_requests = 4096;  // timelines kept per process
  size_t max_events = 32;      // events kept per timeline
};

class RequestTimelines {
 public:
  explicit RequestTimelines(TimelineLimits limits = {}) : limits_(limits) {}

  // Starts the timeline of node request `request` (an existing one of that id is replaced), evicting one when
  // max_requests are kept (the oldest ended, else the oldest).
  void Open(uint64_t request, uint64_t client_request, uint64_t client, uint32_t gpu, uint32_t epoch);
  // Adds an event to `request`'s timeline; false (nothing kept) when it has none (never opened, or evicted).
  bool Add(uint64_t request, TimelineEntry entry);
  // Marks `request` ended: its timeline stays, and is the first evicted. No-op when unknown.
  void End(uint64_t request);

  const RequestTimeline* Find(uint64_t request) const;
  // Every kept timeline of client id `client_request`, oldest first.
  std::vector<const RequestTimeline*> FindClient(uint64_t client_request) const;
  size_t size() const { return timelines_.size(); }
  const TimelineLimits& limits() const { return limits_; }

 private:
  struct Kept {
    uint64_t seq = 0;  // opening order
    RequestTimeline timeline;
  };
  void Evict();
  void Forget(std::map<uint64_t, Kept>::iterator it);

  TimelineLimits limits_;
  uint64_t next_seq_ = 0;
  std::map<uint64_t, Kept> timelines_;               // node id -> timeline
  std::map<uint64_t, uint64_t> order_;               // seq -> node id (all)
  std::set<uint64_t> ended_;                         // seqs of ended ones
  std::multimap<uint64_t, uint64_t> by_client_;      // client id -> node id
};

// JSON of timelines: {"timelines": [{"request", "client_request", "client", "gpu", "epoch", "ended",
// "events_dropped", "events": [{"at_us", "event", "pages", "detail", "source"}]}]}; `source` is set on every event.
nlohmann::json TimelinesToJson(const std::vector<const RequestTimeline*>& timelines, std::string_view source);
// The reverse (dhsctl). Errors: INVALID_ARGUMENT (not that shape, an unknown event name).
absl::StatusOr<std::vector<RequestTimeline>> TimelinesFromJson(const nlohmann::json& j);

// The merged view of one client request (dhsctl request): every timeline's events, ordered by time (ties: memd's
// first, then by event order), one line each: "+MS.mmm  EVENT  node N (gpu G, epoch E)  SOURCE  [pages] [detail]"
// relative to the earliest event, then one line per timeline with dropped events. Empty input: "no events\n".
std::string RenderTimelineTable(const std::vector<RequestTimeline>& timelines);

}  // namespace dhs
