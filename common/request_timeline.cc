#include "common/request_timeline.h"

#include <algorithm>
#include <array>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dhs {
namespace {

constexpr std::array<std::string_view, 12> kNames = {"submitted", "admitted",  "waited",      "granted",
                                                     "reclaimed", "populated", "first_token", "end",
                                                     "rejected",  "completed", "resumed",     "interrupted"};

bool Terminal(TimelineEvent e) {
  return e == TimelineEvent::kEnd || e == TimelineEvent::kRejected || e == TimelineEvent::kCompleted ||
         e == TimelineEvent::kResumed || e == TimelineEvent::kInterrupted;
}

}  // namespace

std::string_view TimelineEventName(TimelineEvent event) {
  const auto i = static_cast<size_t>(event);
  return i < kNames.size() ? kNames[i] : "unknown";
}

absl::StatusOr<TimelineEvent> TimelineEventOf(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<TimelineEvent>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown timeline event '", std::string(name), "'"));
}

void RequestTimelines::Open(uint64_t request, uint64_t client_request, uint64_t client, uint32_t gpu,
                            uint32_t epoch) {
  if (auto it = timelines_.find(request); it != timelines_.end()) Forget(it);
  while (limits_.max_requests > 0 && timelines_.size() >= limits_.max_requests) Evict();
  Kept k;
  k.seq = next_seq_++;
  k.timeline.request = request;
  k.timeline.client_request = client_request;
  k.timeline.client = client;
  k.timeline.gpu = gpu;
  k.timeline.epoch = epoch;
  order_.emplace(k.seq, request);
  by_client_.emplace(client_request, request);
  timelines_.emplace(request, std::move(k));
}

bool RequestTimelines::Add(uint64_t request, TimelineEntry entry) {
  auto it = timelines_.find(request);
  if (it == timelines_.end()) return false;
  RequestTimeline& t = it->second.timeline;
  if (t.events.size() >= limits_.max_events) {
    ++t.events_dropped;
    if (!Terminal(entry.event) || t.events.empty()) return true;
    t.events.back() = std::move(entry);  // the end is worth more than the latest repeat before it
    return true;
  }
  t.events.push_back(std::move(entry));
  return true;
}

void RequestTimelines::End(uint64_t request) {
  auto it = timelines_.find(request);
  if (it == timelines_.end() || it->second.timeline.ended) return;
  it->second.timeline.ended = true;
  ended_.insert(it->second.seq);
}

const RequestTimeline* RequestTimelines::Find(uint64_t request) const {
  auto it = timelines_.find(request);
  return it == timelines_.end() ? nullptr : &it->second.timeline;
}

std::vector<const RequestTimeline*> RequestTimelines::FindClient(uint64_t client_request) const {
  std::vector<std::pair<uint64_t, const RequestTimeline*>> found;
  auto [lo, hi] = by_client_.equal_range(client_request);
  for (auto it = lo; it != hi; ++it) {
    const Kept& k = timelines_.at(it->second);
    found.emplace_back(k.seq, &k.timeline);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<const RequestTimeline*> out;
  for (const auto& f : found) out.push_back(f.second);
  return out;
}

void RequestTimelines::Evict() {
  const uint64_t seq = ended_.empty() ? order_.begin()->first : *ended_.begin();
  Forget(timelines_.find(order_.at(seq)));
}

void RequestTimelines::Forget(std::map<uint64_t, Kept>::iterator it) {
  const uint64_t seq = it->second.seq;
  auto [lo, hi] = by_client_.equal_range(it->second.timeline.client_request);
  for (auto c = lo; c != hi; ++c) {
    if (c->second == it->first) {
      by_client_.erase(c);
      break;
    }
  }
  order_.erase(seq);
  ended_.erase(seq);
  timelines_.erase(it);
}

nlohmann::json TimelinesToJson(const std::vector<const RequestTimeline*>& timelines, std::string_view source) {
  nlohmann::json list = nlohmann::json::array();
  for (const RequestTimeline* t : timelines) {
    nlohmann::json events = nlohmann::json::array();
    for (const TimelineEntry& e : t->events) {
      events.push_back({{"at_us", e.at_us},
                        {"event", std::string(TimelineEventName(e.event))},
                        {"pages", e.pages},
                        {"detail", e.detail},
                        {"source", e.source.empty() ? std::string(source) : e.source}});
    }
    list.push_back({{"request", t->request},
                    {"client_request", t->client_request},
                    {"client", t->client},
                    {"gpu", t->gpu},
                    {"epoch", t->epoch},
                    {"ended", t->ended},
                    {"events_dropped", t->events_dropped},
                    {"events", std::move(events)}});
  }
  return {{"timelines", std::move(list)}};
}

absl::StatusOr<std::vector<RequestTimeline>> TimelinesFromJson(const nlohmann::json& j) {
  std::vector<RequestTimeline> out;
  try {
    for (const auto& t : j.at("timelines")) {
      RequestTimeline r;
      r.request = t.at("request").get<uint64_t>();
      r.client_request = t.at("client_request").get<uint64_t>();
      r.client = t.at("client").get<uint64_t>();
      r.gpu = t.at("gpu").get<uint32_t>();
      r.epoch = t.at("epoch").get<uint32_t>();
      r.ended = t.at("ended").get<bool>();
      r.events_dropped = t.at("events_dropped").get<uint64_t>();
      for (const auto& e : t.at("events")) {
        TimelineEntry entry;
        entry.at_us = e.at("at_us").get<int64_t>();
        auto event = TimelineEventOf(e.at("event").get<std::string>());
        if (!event.ok()) return event.status();
        entry.event = *event;
        entry.pages = e.at("pages").get<uint64_t>();
        entry.detail = e.at("detail").get<std::string>();
        entry.source = e.at("source").get<std::string>();
        r.events.push_back(std::move(entry));
      }
      out.push_back(std::move(r));
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a timeline document: ", e.what()));
  }
  return out;
}

std::string RenderTimelineTable(const std::vector<RequestTimeline>& timelines) {
  struct Row {
    const RequestTimeline* t;
    const TimelineEntry* e;
  };
  std::vector<Row> rows;
  for (const RequestTimeline& t : timelines) {
    for (const TimelineEntry& e : t.events) rows.push_back({&t, &e});
  }
  if (rows.empty()) return "no events\n";
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::make_tuple(a.e->at_us, a.e->source != "memd", a.e->event) <
           std::make_tuple(b.e->at_us, b.e->source != "memd", b.e->event);
  });
  const int64_t t0 = rows.front().e->at_us;
  std::string out = absl::StrFormat("%-12s %-12s %-22s %-6s %-6s %-10s %8s  %s\n", "time_ms", "event", "node_request",
                                    "gpu", "epoch", "source", "pages", "detail");
  for (const Row& r : rows) {
    const int64_t d = r.e->at_us - t0;
    absl::StrAppendFormat(&out, "%-12s %-12s %-22d %-6d %-6d %-10s %8s  %s\n",
                          absl::StrFormat("+%d.%03d", d / 1000, d % 1000), TimelineEventName(r.e->event),
                          r.t->request, r.t->gpu, r.t->epoch, r.e->source,
                          r.e->pages == 0 ? std::string("-") : absl::StrCat(r.e->pages), r.e->detail);
  }
  for (const RequestTimeline& t : timelines) {
    if (t.events_dropped > 0) {
      absl::StrAppendFormat(&out, "node request %d: %d events not kept (beyond the events kept per request)\n",
                            t.request, t.events_dropped);
    }
  }
  return out;
}

}  // namespace dhs
