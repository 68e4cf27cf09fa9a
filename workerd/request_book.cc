// workerd/request_book.cc: see request_book.h.
#include "workerd/request_book.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dhs {

std::string_view RequestPhaseName(RequestPhase phase) {
  switch (phase) {
    case RequestPhase::kUnsent: return "unsent";
    case RequestPhase::kWaiting: return "waiting";
    case RequestPhase::kQueued: return "queued";
    case RequestPhase::kGranted: return "granted";
    case RequestPhase::kActive: return "active";
    case RequestPhase::kPaused: return "paused";
    case RequestPhase::kEnding: return "ending";
  }
  return "unknown";
}

bool WaitsForGrant(RequestPhase phase) {
  return phase == RequestPhase::kUnsent || phase == RequestPhase::kWaiting || phase == RequestPhase::kQueued;
}

AdmissionAnswer RequestBook::AnswerTo(RequestId id) const {
  const RequestLife* life = Find(id);
  if (life == nullptr) return StaleGrant(id) ? AdmissionAnswer::kCrossedComplete : AdmissionAnswer::kUnknown;
  const bool waiting = life->phase == RequestPhase::kWaiting || life->phase == RequestPhase::kQueued;
  return waiting ? AdmissionAnswer::kApplies : AdmissionAnswer::kNotWaiting;
}

bool Steps(RequestPhase phase) { return phase == RequestPhase::kActive || phase == RequestPhase::kPaused; }

absl::Status TransitionRequest(RequestLife& life, RequestPhase from, RequestPhase to) {
  if (life.phase != from) {
    return absl::FailedPreconditionError(absl::StrFormat("request %d is %s, expected %s", life.id,
                                                         RequestPhaseName(life.phase), RequestPhaseName(from)));
  }
  const bool allowed = std::find(std::begin(kRequestTransitions), std::end(kRequestTransitions),
                                 std::pair{from, to}) != std::end(kRequestTransitions);
  if (!allowed) {
    return absl::FailedPreconditionError(absl::StrFormat("request %d: no transition %s -> %s", life.id,
                                                         RequestPhaseName(from), RequestPhaseName(to)));
  }
  if (to == RequestPhase::kEnding) life.ended_in = from;
  life.phase = to;
  return absl::OkStatus();
}

std::unique_ptr<wire::RequestRecordT> RecordOf(const RequestLife& life, std::span<const model::Token> tokens,
                                               std::span<const uint64_t> digests) {
  const wire::SubmitRequestT& submit = life.submit;
  auto rec = std::make_unique<wire::RequestRecordT>();
  rec->request = life.id;
  rec->client_request = life.client_id;
  rec->client = submit.client;  // the client's identity: its resume is found by (client, client_request)
  rec->prompt = submit.prompt;
  rec->hash_ids = submit.hash_ids;
  rec->input_tokens = submit.input_tokens;
  rec->prefix_block_tokens = submit.prefix_block_tokens;
  rec->session = submit.session;  // issue 26: a resumed turn still publishes under its session
  rec->tenant = submit.tenant;  // issue 24: a resume names its chain under its own tenant
  rec->max_new_tokens = submit.max_new_tokens;
  rec->temperature = submit.temperature;
  rec->top_p = submit.top_p;
  rec->seed = submit.seed;
  rec->tokens.assign(tokens.begin(), tokens.end());
  rec->logits_digests.assign(digests.begin(), digests.end());
  return rec;
}

wire::SubmitRequestT SubmitOfRecord(const wire::RequestRecordT& rec) {
  wire::SubmitRequestT s;
  s.request = rec.client_request;
  s.client = rec.client;
  s.prompt = rec.prompt;
  s.hash_ids = rec.hash_ids;
  s.input_tokens = rec.input_tokens;
  s.prefix_block_tokens = rec.prefix_block_tokens;
  s.tenant = rec.tenant;
  s.session = rec.session;  // issue 26
  s.max_new_tokens = rec.max_new_tokens;
  s.temperature = rec.temperature;
  s.top_p = rec.top_p;
  s.seed = rec.seed;
  return s;
}

RequestBook::RequestBook(GpuId gpu, ResumedOutputLimits limits) : gpu_(gpu), resumed_bound_(limits) {}

RequestLife* RequestBook::Insert(RequestLife life) {
  const RequestId id = life.id;
  if (life.client) client_ids_.emplace(std::make_pair(life.client->peer, life.client_id), id);
  return &requests_.emplace(id, std::move(life)).first->second;
}

absl::StatusOr<RequestLife*> RequestBook::Open(const wire::SubmitRequestT& submit, const ClientRef& client,
                                               bool memd_away, uint32_t submit_queue) {
  if (client_ids_.contains({client.peer, submit.request})) {
    return absl::AlreadyExistsError(absl::StrCat("request ", submit.request, " is already being served"));
  }
  if (waiting_for_grant() >= submit_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request ", submit.request, ": submit queue full (", submit_queue, ")"));
  }
  RequestLife life;
  life.id = NodeRequestId(submit.request);
  life.client_id = submit.request;
  life.client = client;
  life.submit = submit;
  life.phase = memd_away ? RequestPhase::kUnsent : RequestPhase::kWaiting;
  return Insert(std::move(life));
}

RequestLife* RequestBook::OpenDetached(const wire::SubmitRequestT& submit, bool memd_away, RequestId avoid) {
  RequestLife life;
  life.id = NodeRequestId(submit.request, avoid);
  life.client_id = submit.request;
  life.submit = submit;
  life.phase = memd_away ? RequestPhase::kUnsent : RequestPhase::kWaiting;
  return Insert(std::move(life));
}

absl::Status RequestBook::Transition(RequestId id, RequestPhase from, RequestPhase to) {
  RequestLife* life = Find(id);
  if (life == nullptr) return absl::NotFoundError(absl::StrCat("request ", id, " is not in the book"));
  if (absl::Status s = TransitionRequest(*life, from, to); !s.ok()) return s;
  if (from == RequestPhase::kGranted) std::erase(granted_, id);  // started (or ended): not queued any more
  if (to == RequestPhase::kGranted) granted_.push_back(id);
  return absl::OkStatus();
}

absl::Status RequestBook::DeferEnd(RequestId id, absl::Status why) {
  RequestLife* life = Find(id);
  if (life == nullptr) return absl::NotFoundError(absl::StrCat("request ", id, " is not in the book"));
  if (life->phase == RequestPhase::kEnding) return absl::OkStatus();  // the first end stands
  if (absl::Status s = TransitionRequest(*life, life->phase, RequestPhase::kEnding); !s.ok()) return s;
  life->end_status = std::move(why);
  std::erase(granted_, id);  // it never starts
  return absl::OkStatus();
}

std::vector<RequestId> RequestBook::TakeGranted() {
  std::vector<RequestId> ids(granted_.begin(), granted_.end());
  granted_.clear();
  return ids;
}

absl::Status RequestBook::AttachClient(RequestId id, const ClientRef& client) {
  RequestLife* life = Find(id);
  if (life == nullptr) return absl::NotFoundError(absl::StrCat("request ", id, " is not in the book"));
  if (life->client) return absl::FailedPreconditionError(absl::StrCat("request ", id, " has a client already"));
  if (client_ids_.contains({client.peer, life->client_id})) {
    return absl::AlreadyExistsError(absl::StrCat("request ", life->client_id, " of this client is in flight already"));
  }
  life->client = client;
  client_ids_.emplace(std::make_pair(client.peer, life->client_id), id);
  return absl::OkStatus();
}

RequestLife* RequestBook::FindByClient(const std::string& peer, RequestId client_id) {
  auto it = client_ids_.find({peer, client_id});
  return it == client_ids_.end() ? nullptr : Find(it->second);
}

RequestLife* RequestBook::FindDetached(const ResumeKey& key) {
  for (auto& [id, life] : requests_) {
    if (!life.client && life.key() == key) return &life;
  }
  return nullptr;
}

RequestLife* RequestBook::Find(RequestId id) {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

const RequestLife* RequestBook::Find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

std::vector<RequestId> RequestBook::IdsOfPeer(const std::string& peer) const {
  std::vector<RequestId> ids;
  for (auto it = client_ids_.lower_bound({peer, 0}); it != client_ids_.end() && it->first.first == peer; ++it) {
    ids.push_back(it->second);
  }
  return ids;
}

void RequestBook::Close(RequestId id, bool completed) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const RequestLife& life = it->second;
  const RequestPhase held = life.held_phase();
  // Its AdmitRequest is with memd and unanswered: a grant may cross the Complete.
  if (completed && (held == RequestPhase::kWaiting || held == RequestPhase::kQueued)) ended_waiting_.insert(id);
  if (life.client) {
    auto mapped = client_ids_.find({life.client->peer, life.client_id});
    if (mapped != client_ids_.end() && mapped->second == id) client_ids_.erase(mapped);
  }
  std::erase(granted_, id);
  requests_.erase(it);
}

void RequestBook::OnCompleteAck(RequestId id) {
  stopping_.erase(id);
  ended_waiting_.erase(id);
}

RequestId RequestBook::NodeRequestId(RequestId client_id, RequestId avoid) {
  constexpr uint64_t kLow = kNodeRequestCounterEnd - 1;
  // gpu_ < kMaxGpus (ComputeGeometry); the epoch's low 24 bits sit between the GPU and n.
  const uint64_t gpu = MakeNodeRequestId(gpu_, epoch_, 0);
  auto free = [&](uint64_t id) {
    return id != avoid && !requests_.contains(id) && !ended_waiting_.contains(id) && !held_by_memd_.contains(id);
  };
  if (client_id != 0 && client_id <= kLow && free(gpu | client_id)) return gpu | client_id;
  while (true) {  // fewer requests in flight than 2^24 (types.h): a free value comes
    const uint64_t n = next_node_;
    next_node_ = next_node_ >= kLow ? 1 : next_node_ + 1;
    if (free(gpu | n)) return gpu | n;
  }
}

std::vector<DroppedOutput> RequestBook::KeepDetached(const ResumeKey& key, DetachedOutput output, TimePoint now) {
  const uint64_t bytes = ResumedOutputBytes(output.tokens.size(), output.error.message().size());
  detached_done_[key] = std::move(output);
  std::vector<DroppedOutput> dropped = resumed_bound_.Keep(key, bytes, now);
  for (const DroppedOutput& d : dropped) {
    // A replaced one's key now holds the newer output (kept); any other is erased.
    if (d.reason != ResumedDropReason::kReplaced) detached_done_.erase(d.key);
  }
  return dropped;
}

std::optional<DetachedOutput> RequestBook::ClaimDetached(const ResumeKey& key) {
  auto it = detached_done_.find(key);
  if (it == detached_done_.end()) return std::nullopt;
  DetachedOutput output = std::move(it->second);
  detached_done_.erase(it);
  resumed_bound_.Claim(key);
  return output;
}

std::vector<DroppedOutput> RequestBook::ExpireDetached(TimePoint now) {
  std::vector<DroppedOutput> dropped = resumed_bound_.Expire(now);
  for (const DroppedOutput& d : dropped) detached_done_.erase(d.key);
  return dropped;
}

uint32_t RequestBook::waiting_for_grant() const {
  uint32_t n = 0;
  for (const auto& [id, life] : requests_) n += WaitsForGrant(life.held_phase());
  return n;
}

uint32_t RequestBook::active() const {
  uint32_t n = 0;
  for (const auto& [id, life] : requests_) n += Steps(life.held_phase());
  return n;
}

uint32_t RequestBook::not_active() const { return static_cast<uint32_t>(requests_.size()) - active(); }

absl::Status RequestBook::CheckInvariants() const {
  auto broken = [](auto&&... parts) { return absl::InternalError(absl::StrCat("request book: ", parts...)); };
  size_t granted = 0;
  for (const auto& [id, life] : requests_) {
    if (life.id != id) return broken("request ", id, " is filed as ", life.id);
    if (GpuOfNodeRequestId(id) != gpu_ || (id & (kNodeRequestCounterEnd - 1)) == 0) {
      return broken("request ", id, " is not a node id of GPU ", gpu_);
    }
    if (life.client) {
      auto mapped = client_ids_.find({life.client->peer, life.client_id});
      if (mapped == client_ids_.end()) return broken("attached request ", id, " has no client id entry");
    }
    if (life.phase == RequestPhase::kEnding && life.ended_in == RequestPhase::kEnding) {
      return broken("request ", id, " ends from kEnding");
    }
    if (life.phase != RequestPhase::kEnding && !life.end_status.ok()) {
      return broken("request ", id, " has an end status in ", std::string(RequestPhaseName(life.phase)));
    }
    if (ended_waiting_.contains(id)) return broken("request ", id, " is in flight and ended while waiting");
    granted += life.phase == RequestPhase::kGranted;
  }
  for (const auto& [key, id] : client_ids_) {
    const RequestLife* life = Find(id);
    if (life == nullptr || !life->client || life->client->peer != key.first || life->client_id != key.second) {
      return broken("client id (", key.first, ", ", key.second, ") maps to ", id, ", not its attached request");
    }
  }
  if (granted != granted_.size()) return broken(granted, " granted requests, ", granted_.size(), " queued to start");
  std::set<RequestId> queued(granted_.begin(), granted_.end());
  if (queued.size() != granted_.size()) return broken("a request is queued to start twice");
  for (RequestId id : granted_) {
    const RequestLife* life = Find(id);
    if (life == nullptr || life->phase != RequestPhase::kGranted) return broken("queued ", id, " is not granted");
  }
  if (detached_done_.size() != resumed_bound_.outputs()) {
    return broken(detached_done_.size(), " outputs kept, the bound counts ", resumed_bound_.outputs());
  }
  return resumed_bound_.CheckInvariants();
}

}  // namespace dhs
