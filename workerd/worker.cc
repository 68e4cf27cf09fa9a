// workerd/worker.cc: see worker.h.
#include "workerd/worker.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/fault_point.h"
#include "common/log_limiter.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "workerd/model/resident_kv_access.h"

namespace dhs {
namespace {

// The slot's share of the draft ring and staging arenas, as an AdmitRequest and a re-Hello's ReportedRequest carry it
// (inside required_pages; docs/protocol.md "Speculation memory").
template <class Message>
void SetSpeculationShare(const WorkerGeometry& g, Message& m) {
  m.draft_ring_pages = g.speculation.draft_ring_pages;
  m.staging_pages = g.speculation.staging_pages;
  m.draft_ring_bytes = g.speculation.slot_draft_ring_bytes;
  m.staging_bytes = g.speculation.slot_staging_bytes;
}

// A steady_clock time as CLOCK_MONOTONIC microseconds (the timelines' clock, common/request_timeline.h).
int64_t NowMicros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::unique_ptr<wire::LatencyHistogramT> ToWireHistogram(const LatencyHistogram& h) {
  auto w = std::make_unique<wire::LatencyHistogramT>();
  w->bounds_us = h.bounds_us;
  w->counts = h.counts;
  w->sum_us = h.sum_us;
  return w;
}

uint64_t MicrosSince(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
}

}  // namespace

Worker::Worker(const model::Model* model, Device* device, WorkerConfig config, WorkerGeometry geometry,
               MemdLink* memd, ClientSink* client)
    : model_(model), device_(device), config_(std::move(config)), geometry_(std::move(geometry)), memd_(memd),
      client_(client), book_(config_.gpu, config_.resumed_outputs), prefix_cache_(config_.prefix_cache_bytes) {}

Worker::~Worker() = default;

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const model::Model* model, Device* device,
                                                       const WorkerConfig& config, std::span<uint8_t> host_pool,
                                                       MemdLink* memd, ClientSink* client) {
  if (model == nullptr || device == nullptr || memd == nullptr || client == nullptr) {
    return absl::InvalidArgumentError("worker: model, device, memd link and client sink are required");
  }
  absl::StatusOr<WorkerGeometry> g = ComputeGeometry(model->config(), config);
  if (!g.ok()) return g.status();
  if (absl::Status s = ValidateResumedOutputLimits(config.resumed_outputs); !s.ok()) return s;
  std::unique_ptr<Worker> w(new Worker(model, device, config, *std::move(g), memd, client));
  KvResidency* residency = nullptr;
  if (config.mode == WorkerMode::kResident) {
    w->kv_ = model::ResidentKvAccess::ForModel(model->config(), config.hbm_budget_bytes, config.page_rows);
    w->no_residency_ = std::make_unique<NoKvResidency>(w->kv_.get());
    residency = w->no_residency_.get();
  } else {
    HostPoolAccess host{host_pool, nullptr, nullptr};  // host pages come from memd's grants only
    absl::StatusOr<std::unique_ptr<HierarchicalKvAccess>> kv =
        HierarchicalKvAccess::Create(w->geometry_.kv, device, host, ResolverKind::kFused);
    if (!kv.ok()) return kv.status();
    w->hier_ = kv->get();
    residency = w->hier_;
    w->kv_ = *std::move(kv);
  }
  ResidencyAgentConfig agent{config.gpu, config.slots, config.mode == WorkerMode::kAdaptive,
                             config.mode != WorkerMode::kResident};
  w->agent_ = std::make_unique<ResidencyAgent>(agent, residency, memd);
  w->resumes_ = std::make_unique<ResumeImporter>(model, w->hier_, config.page_rows);
  absl::StatusOr<std::unique_ptr<SpeculativeRounds>> rounds = SpeculativeRounds::Create(model, config, w->geometry_);
  if (!rounds.ok()) return rounds.status();
  w->rounds_ = *std::move(rounds);
  return w;
}

uint32_t Worker::active_requests() const { return book_.active(); }

uint32_t Worker::waiting_requests() const { return book_.not_active(); }

absl::Status Worker::Submit(const wire::SubmitRequestT& submit, const ClientRef& client) {
  if (absl::Status s = ValidateSubmit(submit, config_.max_context_tokens); !s.ok()) return s;
  absl::StatusOr<RequestLife*> life = book_.Open(submit, client, away(), config_.submit_queue);
  if (absl::IsResourceExhausted(life.status())) ++stats_.submits_refused;
  if (!life.ok()) return life.status();
  auto r = NewRequest(**life);
  // memd away: admitted after the re-Hello (ReturnFromAway; kUnsent).
  if (absl::Status s = away() ? absl::OkStatus() : SendAdmit(*r); !s.ok()) {
    book_.Close(r->id, /*completed=*/false);
    return s;
  }
  wire::SubmitAcceptedT accepted;
  accepted.request = r->client_id;
  accepted.queue_position = waiting_requests() - 1;  // the requests not active before this one
  if (r->id != r->client_id) {
    spdlog::debug("worker: request {} of client {} is node request {}", r->client_id, client.peer, r->id);
  }
  timelines_.Open(r->id, r->client_id, submit.client, config_.gpu, EpochOfNodeRequestId(r->id));
  timelines_.Add(r->id, TimelineEntry{NowMicros(r->submitted), TimelineEvent::kSubmitted, 0, "", ""});
  requests_.emplace(r->id, std::move(r));
  stats_.waiting_requests_peak = std::max(stats_.waiting_requests_peak, book_.waiting_for_grant());
  client_->Accepted(client, accepted);
  return absl::OkStatus();
}

std::unique_ptr<Worker::Request> Worker::NewRequest(RequestLife& life) {
  const wire::SubmitRequestT& submit = life.submit;
  auto r = std::make_unique<Request>();
  r->id = life.id;
  r->client_id = life.client_id;
  r->life = &life;
  r->input = SubmitInputTokens(submit);
  r->prefix_tokens = static_cast<Position>(SubmitPrefixTokens(submit));
  r->hash_ids = submit.hash_ids;
  r->prefix_block_tokens = submit.prefix_block_tokens;
  r->max_new = submit.max_new_tokens;
  r->greedy = submit.temperature == 0.0f;
  r->sampling = model::SamplingParams{submit.temperature, submit.top_p};
  r->seed = submit.seed;
  r->submitted = std::chrono::steady_clock::now();
  return r;
}

absl::Status Worker::SendAdmit(const Request& r) {
  const uint64_t ctx = r.input.size() - r.resumed + r.max_new;  // a resumed input holds its committed tokens
  const model::ModelConfig& mc = model_->config();
  wire::AdmitRequestT admit;
  admit.request = r.id;
  admit.gpu = config_.gpu;
  admit.required_pages = RequiredPages(mc, geometry_, config_.mode, ctx);  // the speculation share included
  SetSpeculationShare(geometry_, admit);
  admit.history_rows = ctx;
  admit.complete_pages = AdmitCompletePages(r);
  // Only adaptive mode holds optional history; hisparse keeps all history on host (memd never populates it).
  admit.optional_history = config_.mode == WorkerMode::kAdaptive;
  for (int s = 0; s < mc.n_sources(); ++s) {
    auto info = std::make_unique<wire::RequestSourceInfoT>();
    info->source = static_cast<uint32_t>(s);
    info->history_rows = ctx;
    info->complete_pages = admit.complete_pages;
    admit.sources.push_back(std::move(info));
  }
  admit.host_backed = r.resume_of != 0;  // a resume takes the interrupted request's kept host pages over
  admit.resume_of = r.resume_of;
  admit.record = RecordOf(*r.life, r.generated, r.digests);
  if (absl::Status s = memd_->SendAdmitRequest(admit); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("worker cannot reach memd: ", s.message()));
  }
  return absl::OkStatus();
}

uint32_t Worker::AdmitCompletePages(const Request& r) const {
  return config_.mode == WorkerMode::kAdaptive ? static_cast<uint32_t>(r.input.size() / config_.page_rows) : 0;
}

void Worker::Erase(std::map<RequestId, std::unique_ptr<Request>>::iterator it, bool completed) {
  book_.Close(it->first, completed);
  requests_.erase(it);
}

// ---- memd's messages ----

void Worker::OnAdmitGrant(const wire::AdmitGrantT& m) {
  auto it = requests_.find(m.request);
  if (it == requests_.end() && book_.StaleGrant(m.request)) {
    // Ended (StopAll, Cancel, its client gone) while memd granted it: the Complete sent then (memd reads it after this
    // grant) releases it.
    return;
  }
  if (it == requests_.end()) {
    spdlog::warn("worker: AdmitGrant for request {} that is not waiting; releasing it", m.request);
    agent_->RefuseGrant(m);
    return;
  }
  Request& r = *it->second;
  const RequestPhase phase = r.life->phase;
  if (phase != RequestPhase::kWaiting && phase != RequestPhase::kQueued) {
    spdlog::warn("worker: second AdmitGrant for request {}; ignored", m.request);
    return;
  }
  r.granted = std::chrono::steady_clock::now();
  stats_.admission_wait.Observe(MicrosSince(r.submitted, r.granted));
  const uint64_t rows = r.input.size() - r.resumed + r.max_new - 1;  // rows ever appended
  if (absl::Status s = agent_->OnGrant(m, rows / config_.page_rows); !s.ok()) {
    Finish(r.id, s);
    return;
  }
  // A resume's host-backed pages (every one memd took over), checked against their checksums (issue 22).
  if (absl::Status s = resumes_->OnGrant(r.resume, r.id, r.client_id, m); !s.ok()) {
    Finish(r.id, s);
    return;
  }
  DHS_CHECK_OK(book_.Transition(r.id, phase, RequestPhase::kGranted));  // queued for StartGranted
}

void Worker::OnAdmitWait(const wire::AdmitWaitT& m) {
  if (RequestLife* life = book_.Find(m.request); life != nullptr && life->phase == RequestPhase::kWaiting) {
    DHS_CHECK_OK(book_.Transition(m.request, RequestPhase::kWaiting, RequestPhase::kQueued));
  }
  spdlog::debug("worker: request {} waits for admission (queue position {}, deficit {} pages)", m.request,
                m.queue_position, m.deficit_pages);
}

void Worker::OnAdmitReject(const wire::AdmitRejectT& m) {
  auto it = requests_.find(m.request);
  if (it == requests_.end()) {
    spdlog::warn("worker: AdmitReject for request {} that is not here; ignored", m.request);
    return;
  }
  Request& r = *it->second;
  if (r.life->phase != RequestPhase::kWaiting && r.life->phase != RequestPhase::kQueued) {
    // Granted already: it holds its slot, its plan and its KV, and ends only through Finish (Complete). A reject
    // after the grant breaks the contract (§2: one answer per AdmitRequest); it is not obeyed.
    spdlog::warn("worker: AdmitReject for request {}, which memd granted already; ignored", m.request);
    return;
  }
  absl::Status error = FromWireError(m.code, absl::StrCat("admission refused by memd: ", m.reason));
  if (error.ok()) error = absl::UnknownError(absl::StrCat("admission refused by memd: ", m.reason));
  ReportEnd(r, error);
  Erase(it);  // never admitted: nothing to release
}

void Worker::OnCompleteAck(const wire::CompleteAckT& m) {
  book_.OnCompleteAck(m.request);
  ReachFaultPoint(FaultPoint::kComplete);  // test-only: memd released the request (common/fault_point.h)
  spdlog::debug("worker: request {} released {} pages", m.request, m.released_pages);
}

void Worker::OnReclaimOrder(const wire::ReclaimOrderT& m) { agent_->OnReclaimOrder(m); }
void Worker::OnRetire(const wire::RetireT& m) { agent_->OnRetire(m); }
void Worker::OnPopulateOrder(const wire::PopulateOrderT& m) { agent_->OnPopulateOrder(m); }

// ---- resume (issue 11) ----

absl::Status Worker::Resume(RequestId interrupted, const wire::RequestRecordT& record) {
  const wire::SubmitRequestT submit = SubmitOfRecord(record);
  absl::Status valid = ValidateSubmit(submit, config_.max_context_tokens);
  if (valid.ok() && (record.tokens.size() > record.max_new_tokens ||
                     record.logits_digests.size() != record.tokens.size())) {
    valid = absl::InvalidArgumentError(absl::StrCat(record.tokens.size(), " committed tokens, ",
                                                    record.logits_digests.size(), " digests, max_new ",
                                                    record.max_new_tokens));
  }
  // Not resumed (a bad record, or every token committed): the interrupted id ends, memd frees what it kept.
  auto end_interrupted = [&](bool finished = false) -> absl::Status {
    if (interrupted == 0) return absl::OkStatus();  // a refused report memd holds nothing of (ReturnFromAway)
    wire::CompleteT done;
    done.request = interrupted;
    done.gpu = config_.gpu;
    done.keep_output = finished;  // its output waits here for its client: memd keeps it too (lost ends)
    if (absl::Status s = memd_->SendComplete(done); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("worker cannot reach memd: ", s.message()));
    }
    return absl::OkStatus();
  };
  if (!valid.ok()) {
    if (absl::Status s = end_interrupted(); !s.ok()) return s;
    return absl::InvalidArgumentError(
        absl::StrCat("interrupted request ", interrupted, ": its record is not resumable: ", valid.message()));
  }
  ++stats_.requests_resumed;
  if (record.tokens.size() >= record.max_new_tokens) {  // every token was committed: nothing to compute
    if (absl::Status s = end_interrupted(/*finished=*/true); !s.ok()) return s;
    spdlog::info("worker: interrupted request {} (client {}) had all its {} tokens; kept for its client", interrupted,
                 record.client_request, record.max_new_tokens);
    DropUnclaimed(book_.KeepDetached(
        {record.client, record.client_request},
        DetachedOutput{std::vector<model::Token>(record.tokens.begin(), record.tokens.end()), record.logits_digests,
                       absl::OkStatus()},
        std::chrono::steady_clock::now()));
    return absl::OkStatus();
  }
  // Detached (no client until Attach), never under the interrupted id it continues.
  std::unique_ptr<Request> r = NewRequest(*book_.OpenResumed(submit, interrupted));
  ResumeImporter::Start(r->resume, r->submitted);
  r->generated.assign(record.tokens.begin(), record.tokens.end());
  r->digests = record.logits_digests;
  r->resumed = static_cast<Position>(r->generated.size());
  r->life->tokens.committed = r->generated.size();  // the new record opens with them
  r->input.insert(r->input.end(), r->generated.begin(), r->generated.end());  // imported or recomputed
  r->resume_of = interrupted;
  if (absl::Status s = SendAdmit(*r); !s.ok()) {
    book_.Close(r->id, /*completed=*/false);
    return s;
  }
  timelines_.Open(r->id, r->client_id, submit.client, config_.gpu, EpochOfNodeRequestId(r->id));
  timelines_.Add(r->id, TimelineEntry{NowMicros(r->submitted), TimelineEvent::kSubmitted,
                                      static_cast<uint64_t>(r->resumed),
                                      absl::StrCat("resume of ", interrupted, " (pages = committed tokens)"), ""});
  spdlog::info("worker: interrupted request {} (client {}) resumes as {}: {} committed tokens, {} tokens of history",
               interrupted, r->client_id, r->id, r->resumed, r->input.size());
  requests_.emplace(r->id, std::move(r));  // detached: found by Attach through (client identity, client id)
  return absl::OkStatus();
}

size_t Worker::KeepFinishedOutputs(const std::vector<std::unique_ptr<wire::RequestRecordT>>& records) {
  size_t kept = 0;
  for (const auto& rec : records) {
    if (rec == nullptr) continue;
    if (rec->tokens.size() != rec->max_new_tokens || rec->logits_digests.size() != rec->tokens.size()) {
      spdlog::warn("worker: finished record of request {} (client {}) skipped: {} tokens, {} digests, max_new {}",
                   rec->request, rec->client_request, rec->tokens.size(), rec->logits_digests.size(),
                   rec->max_new_tokens);
      continue;
    }
    // A resumed request of that key waits for its client (clients without an identity share keys): it is the one.
    if (book_.FindDetached({rec->client, rec->client_request}) != nullptr) continue;
    DropUnclaimed(book_.KeepDetached(
        {rec->client, rec->client_request},
        DetachedOutput{std::vector<model::Token>(rec->tokens.begin(), rec->tokens.end()), rec->logits_digests,
                       absl::OkStatus()},
        std::chrono::steady_clock::now()));
    ++kept;
  }
  if (kept > 0) {
    spdlog::info("worker: {} outputs of requests the previous worker finished are kept for a client whose final "
                 "chunk died with it (Attach)", kept);
  }
  return kept;
}

absl::Status Worker::Attach(RequestId client_id, uint32_t received, const ClientRef& client,
                            uint64_t client_identity) {
  const ResumeKey key{client_identity, client_id};
  auto send = [&](Request& r, bool finished, const absl::Status& error) {
    wire::SubmitAcceptedT accepted;
    accepted.request = client_id;
    client_->Accepted(client, accepted);
    std::vector<model::Token> tokens;
    std::vector<uint64_t> digests;
    TokenCounts& counts = r.life->tokens;
    const size_t known = counts.held_from.value_or(r.generated.size());  // held ones go after the re-Hello
    for (size_t t = received; t < known; ++t) {
      tokens.push_back(r.generated[t]);
      digests.push_back(r.digests[t]);
    }
    counts.client_has = std::max<size_t>(received, known);
    if (!tokens.empty() || finished) return SendChunk(r, std::move(tokens), std::move(digests), finished, error);
    return absl::OkStatus();
  };
  if (std::optional<DetachedOutput> done = book_.ClaimDetached(key)) {
    RequestLife life;  // the finished request's output, streamed once
    life.client_id = client_id;
    life.client = client;
    Request r;
    r.client_id = client_id;
    r.life = &life;
    r.generated = std::move(done->tokens);
    r.digests = std::move(done->digests);
    r.submitted = r.granted = std::chrono::steady_clock::now();
    DHS_CHECK_OK(send(r, true, done->error));  // a final chunk is always taken
    return absl::OkStatus();
  }
  // A running resumed request of that key (the first in node-id order: anonymous clients may share a key).
  RequestLife* life = book_.FindDetached(key);
  if (life == nullptr) {
    return absl::NotFoundError(absl::StrCat("request ", client_id, " of client ", client_identity,
                                            " is not a resumed request of this worker"));
  }
  if (absl::Status s = book_.AttachClient(life->id, client); !s.ok()) return s;  // the client's id is in use
  Request& r = *requests_.at(life->id);
  if (absl::Status s = send(r, false, absl::OkStatus()); !s.ok()) r.client_error = s;
  return absl::OkStatus();
}

// ---- the loop ----

void Worker::StartGranted() {
  // Every granted request holds its own slot (memd's AdmitGrant.slot) and its residency plan: it starts at once.
  for (RequestId id : book_.TakeGranted()) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    r.session.emplace(model_->NewSession(id));
    DHS_CHECK_OK(book_.Transition(id, RequestPhase::kGranted, RequestPhase::kActive));
    if (!ResumeImporter::resumed(r.resume)) continue;
    if (resumes_->Begin(r.resume, r.id, r.client_id, static_cast<Position>(r.input.size()))) continue;
    r.fed = 0;  // the import failed: every row recomputed from the tokens (same bits)
    if (absl::Status rebuilt = ReplayFed(r); !rebuilt.ok()) Finish(r.id, rebuilt);
  }
}

absl::Status Worker::ImportChunk(Request& r) {
  // The prefix ends at prefix_tokens; the last input token is always fed by a Step (its logits start decoding).
  const Position last = std::min<Position>(static_cast<Position>(r.input.size()) - 1, r.prefix_tokens);
  // A resume recomputes up to its next host run only (imported there); its rows bypass the row cache meanwhile.
  Position end = std::min({last, r.fed + static_cast<Position>(geometry_.prefill_chunk),
                           resumes_->NextHostRow(r.resume, static_cast<Position>(r.input.size()))});
  const Position block = static_cast<Position>(r.prefix_block_tokens);
  const bool cached = prefix_cache_.capacity_bytes() > 0 && block > 0 && !ResumeImporter::importing(r.resume);
  const Position first = cached ? r.fed / block * block : 0;
  std::span<const uint64_t> chain;
  if (cached) {
    // Whole blocks go through the row cache (prefix_cache.h): imported when their chain is cached, else computed
    // (still prefill_chunk tokens per iteration) with their rows captured. A chunk never crosses a block's end, so
    // later blocks start on block boundaries.
    end = std::min<Position>(end, first + block);
    const auto b = static_cast<size_t>(first / block);
    const bool whole = first + block <= last && b < r.hash_ids.size();
    if (whole) chain = std::span<const uint64_t>(r.hash_ids.data(), b + 1);
    if (whole && r.fed == first && !r.capture) {
      if (const PrefixBlock* hit = prefix_cache_.Find(chain, r.prefix_block_tokens)) {
        if (absl::Status s = model_->ImportRows(*r.session, r.prefix_block_tokens, hit->rows, hit->keys, kv());
            !s.ok()) {
          return s;
        }
        r.fed += block;
        ++stats_.prefix_blocks_imported;
        return absl::OkStatus();
      }
      r.capture.emplace();
      r.capture->first = first;
      r.capture->tokens = r.prefix_block_tokens;
      r.capture->rows.resize(static_cast<size_t>(model_->config().n_sources()));
    }
  }
  std::optional<RowCapture> capture;
  if (r.capture) capture.emplace(&kv(), r.id, &*r.capture);
  KvAccess& target = capture ? static_cast<KvAccess&>(*capture) : kv();
  std::span<const model::Token> chunk(r.input.data() + r.fed, static_cast<size_t>(end - r.fed));
  if (absl::Status s = model_->ImportPrefix(*r.session, chunk, target); !s.ok()) return s;
  r.fed = end;
  if (r.capture && r.fed == r.capture->first + block) {
    const model::ModelConfig& mc = model_->config();
    for (int i = 0; i < mc.n_indexers(); ++i) {
      std::span<const float> keys = r.session->index_keys(i).subspan(
          static_cast<size_t>(r.capture->first) * mc.idx_dim, static_cast<size_t>(block) * mc.idx_dim);
      r.capture->keys.emplace_back(keys.begin(), keys.end());
    }
    prefix_cache_.Insert(chain, r.prefix_block_tokens, *std::move(r.capture));
    r.capture.reset();
    ++stats_.prefix_blocks_computed;
  }
  return absl::OkStatus();
}

absl::Status Worker::ReplayFed(Request& r) {
  if (absl::Status s = agent_->RebuildKv(r.id); !s.ok()) return s;  // released and planned again
  // A resume: the rows it imported so far are recomputed below too; its host-backed pages are host-ready again, so
  // the runs after `fed` are still imported (else everything is recomputed).
  resumes_->AfterRebuild(r.resume, r.id);
  r.session.emplace(model_->NewSession(r.id));
  r.capture.reset();  // recomputed below without the row cache; a later block starts a fresh capture
  const std::vector<model::Token> all = r.Tokens();
  for (Position pos = 0; pos < r.fed;) {
    const size_t n = std::min<size_t>(geometry_.prefill_chunk, static_cast<size_t>(r.fed - pos));
    if (absl::Status s = model_->ImportPrefix(*r.session, std::span<const model::Token>(all.data() + pos, n), kv());
        !s.ok()) {
      return s;
    }
    pos += static_cast<Position>(n);
  }
  return absl::OkStatus();
}

std::vector<Worker::BatchItem> Worker::CollectBatch() {
  std::vector<BatchItem> items;
  std::vector<RequestId> failed;
  for (auto& [id, rp] : requests_) {
    Request& r = *rp;
    if (!Steps(r.life->phase)) continue;
    const Position in = static_cast<Position>(r.input.size());
    const Position import_end = std::min<Position>(r.prefix_tokens, in - 1);
    const auto chunk = static_cast<Position>(std::max<uint32_t>(geometry_.prefill_chunk, r.prefix_block_tokens));
    if (!MayStep(r, r.fed < in ? std::min<Position>(chunk, in - r.fed) : 1)) {
      if (away() && r.life->phase == RequestPhase::kActive && r.client_error.ok() &&
          r.generated.size() < r.max_new) {
        DHS_CHECK_OK(book_.Transition(id, RequestPhase::kActive, RequestPhase::kPaused));  // logged once
        ++stats_.paused_while_away;
        const std::optional<size_t>& held = r.life->tokens.held_from;
        spdlog::info("worker: request {} (client {}) pauses until memd is back ({} tokens held, tail full or held "
                     "bound {})", r.id, r.client_id, held ? r.generated.size() - *held : 0, config_.away_held_tokens);
      }
      continue;
    }
    // A resume's host run starting here is imported (no compute), but not while memd is away: the jump may overwrite
    // tail slots whose backups wait for the re-Hello (host writes are paused).
    if (away() && resumes_->RunAt(r.resume, r.fed)) continue;
    absl::Status s = absl::OkStatus();
    if (!resumes_->ImportRun(r.resume, r.id, *r.session, r.fed)) {  // every row recomputed from the tokens instead
      r.fed = 0;
      s = ReplayFed(r);
    }
    if (!s.ok()) {
      failed.push_back(id);
      spdlog::warn("worker: request {} failed: its KV could not be rebuilt after a failed import: {}", id,
                   s.ToString());
      continue;
    }
    if (r.fed < import_end) {
      if (absl::Status s = ImportChunk(r); !s.ok()) {
        failed.push_back(id);
        spdlog::warn("worker: request {} failed while importing its prefix: {}", id, s.ToString());
        continue;
      }
      if (r.fed < import_end) continue;
    }
    BatchItem item{&r, {}, true, false, {}};
    if (r.fed < in) {
      // A resume's prefill stops at its next host run (imported by the next iteration's ResumeImporter::ImportRun).
      const size_t n = std::min<size_t>(geometry_.prefill_chunk,
                                        static_cast<size_t>(resumes_->NextHostRow(r.resume, in) - r.fed));
      if (n == 0) continue;  // a host run starts here: the next iteration imports it
      item.tokens.assign(r.input.begin() + r.fed, r.input.begin() + r.fed + static_cast<Position>(n));
      item.emits = r.fed + static_cast<Position>(n) == in;
    } else {
      item.tokens = {r.generated.back()};
    }
    items.push_back(std::move(item));
  }
  for (RequestId id : failed) {
    Finish(id, absl::UnavailableError(absl::StrCat("request ", id, " failed: its KV could not be imported")));
  }
  AddProposals(items);  // speculative rounds for decoding items (SpeculativeRounds)
  return items;
}

void Worker::AddProposals(std::vector<BatchItem>& items) {
  if (!rounds_->enabled()) return;
  std::vector<RoundCandidate> candidates;
  std::vector<BatchItem*> which;
  for (BatchItem& item : items) {
    Request& r = *item.r;
    if (r.fed < static_cast<Position>(r.input.size()) || r.generated.empty()) continue;  // prefilling
    const int64_t remaining = static_cast<int64_t>(r.max_new) - static_cast<int64_t>(r.generated.size());
    candidates.push_back(RoundCandidate{&r.spec, r.id, &*r.session, spec::RoundKey{r.seed, r.client_id, r.fed},
                                        remaining, r.greedy, [&r] { return r.Tokens(); }});
    which.push_back(&item);
  }
  int64_t joining = 0;  // the online width's load: granted soon (sent to memd and not told to wait)
  for (const auto& [id, r] : requests_) {  // waiting, not told to wait (kQueued)
    const RequestPhase p = r->life->held_phase();
    joining += rounds_->online() && (p == RequestPhase::kUnsent || p == RequestPhase::kWaiting);
  }
  std::vector<std::optional<spec::DraftResult>> drafts =
      rounds_->Propose(candidates, static_cast<int64_t>(active_requests()), joining, kv());
  for (size_t i = 0; i < which.size(); ++i) {
    if (!drafts[i]) continue;
    BatchItem& item = *which[i];
    item.draft = *std::move(drafts[i]);
    item.tokens.insert(item.tokens.end(), item.draft.tokens.begin(), item.draft.tokens.end());
    item.round = true;
  }
}

absl::Status Worker::FinishRound(BatchItem& item, std::span<const float> logits, std::span<const float> hidden) {
  Request& r = *item.r;
  const RoundInput round{&r.spec, r.id, &*r.session, spec::RoundKey{r.seed, r.client_id, r.fed}, r.greedy,
                         &r.sampling};
  absl::StatusOr<spec::RoundOutcome> outcome = rounds_->Finish(round, item.draft, logits, hidden, kv());
  if (!outcome.ok()) return outcome.status();
  r.fed += outcome->accepted + 1;  // positions n_r .. n_r + A_r kept
  for (size_t j = 0; j < outcome->emitted.size(); ++j) {
    RecordToken(r, outcome->emitted[j], logits.subspan(j * model::kVocab, model::kVocab));
  }
  return absl::OkStatus();
}

void Worker::FailDataLoss(std::vector<BatchItem>* items) {
  if (hier_ == nullptr) return;
  for (auto& [id, why] : hier_->TakeDataLoss()) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    if (items != nullptr) std::erase_if(*items, [&](const BatchItem& b) { return b.r->id == id; });  // before Finish
    Finish(id, absl::DataLossError(absl::StrCat("request ", it->second->client_id, " failed: ", why.message())));
  }
}

void Worker::RetryAlone(std::vector<BatchItem>& items) {
  for (BatchItem& item : items) {
    Request& r = *item.r;
    absl::Status s = ReplayFed(r);
    model::StepOutput solo;
    if (s.ok() && item.round) s = model_->BeginVerification(*r.session, kv());  // rebuilt: hold its round again
    if (s.ok()) {
      model::StepInput in{&*r.session, item.tokens, rounds_->WantsHidden(r.spec)};
      s = model_->Step(std::span<model::StepInput>(&in, 1), kv(), std::span<model::StepOutput>(&solo, 1));
    }
    if (!s.ok()) {
      Finish(r.id, absl::Status(s.code(), absl::StrCat("request ", r.client_id, " failed: ", s.message())));
      continue;
    }
    if (item.round) {
      if (absl::Status f = FinishRound(item, solo.logits, solo.hidden); !f.ok()) Finish(r.id, f);
      continue;
    }
    rounds_->KeepHidden(r.spec, r.fed, solo.hidden, item.tokens.size());
    r.fed += static_cast<Position>(item.tokens.size());
    if (item.emits) EmitToken(r, std::span<const float>(solo.logits).last(model::kVocab));
  }
}

absl::Status Worker::RunBatch() {
  std::vector<BatchItem> items = CollectBatch();
  last_batch_ = items.size();
  if (items.empty()) return absl::OkStatus();
  std::vector<model::StepInput> batch;
  for (BatchItem& it : items) {
    batch.push_back(model::StepInput{&*it.r->session, it.tokens, rounds_->WantsHidden(it.r->spec)});
  }
  std::vector<model::StepOutput> out(items.size());
  const auto step_start = std::chrono::steady_clock::now();
  absl::Status st = model_->Step(batch, kv(), out);
  if (rounds_->online() && st.ok()) {  // t(Q): the step's time against its queries (every token fed is one)
    int64_t queries = 0;
    for (const BatchItem& it : items) queries += static_cast<int64_t>(it.tokens.size());
    rounds_->ObserveStep(queries, std::chrono::steady_clock::now() - step_start);
  }
  if (st.ok()) {
    bool prefill = false, decode = false;  // test-only kill points (common/fault_point.h)
    std::vector<std::pair<RequestId, absl::Status>> failed_rounds;
    for (size_t b = 0; b < items.size(); ++b) {
      Request& r = *items[b].r;
      (r.fed < static_cast<Position>(r.input.size()) ? prefill : decode) = true;
      if (items[b].round) {
        if (absl::Status f = FinishRound(items[b], out[b].logits, out[b].hidden); !f.ok()) {
          failed_rounds.emplace_back(r.id, f);
        }
        continue;
      }
      rounds_->KeepHidden(r.spec, r.fed, out[b].hidden, items[b].tokens.size());
      r.fed += static_cast<Position>(items[b].tokens.size());
      if (items[b].emits) EmitToken(r, std::span<const float>(out[b].logits).last(model::kVocab));
    }
    for (auto& [id, f] : failed_rounds) Finish(id, std::move(f));  // before CommitStep: they emitted nothing
    if (prefill) ReachFaultPoint(FaultPoint::kPrefill);
    if (decode) ReachFaultPoint(FaultPoint::kDecode);
  } else {
    // The batch failed as a whole: each request is rebuilt alone and its step retried, so only the request whose own
    // copies fail ends (its rows are never handed to another request: hot caches are per slot).
    spdlog::warn("worker: batched step of {} requests failed ({}); retrying each alone", items.size(), st.ToString());
    // Issue 22: a request whose host page changed after its confirmation fails with DATA_LOSS, not rebuilt and
    // retried (a page that keeps changing would rebuild it forever); the others are retried alone.
    FailDataLoss(&items);
    RetryAlone(items);
  }
  CommitStep();
  // Finished requests (their last chunk is out), and those whose client refused a chunk: release and tell memd
  // (memd away: after the re-Hello).
  if (away()) return absl::OkStatus();
  std::vector<std::pair<RequestId, absl::Status>> done;
  for (const auto& [id, r] : requests_) {
    if (!Steps(r->life->phase)) continue;
    if (!r->client_error.ok()) {
      done.emplace_back(id, r->client_error);
    } else if (r->generated.size() >= r->max_new) {
      done.emplace_back(id, absl::OkStatus());
    }
  }
  for (auto& [id, status] : done) Finish(id, std::move(status));
  return absl::OkStatus();
}

void Worker::EmitToken(Request& r, std::span<const float> logits) {
  // Token t's draw is keyed by (seed, client id, t): a resumed request draws what the dead worker would have.
  const model::DrawKey key{r.seed, r.client_id, r.generated.size()};
  RecordToken(r, r.greedy ? model::Argmax(logits) : model::Sample(logits, r.sampling, key), logits);
}

void Worker::RecordToken(Request& r, model::Token token, std::span<const float> logits) {
  const auto now = std::chrono::steady_clock::now();
  if (r.generated.empty()) r.ttft_us = MicrosSince(r.submitted, now);
  if (r.generated.size() == static_cast<size_t>(r.resumed)) {  // its first token (a resume: its first new one)
    stats_.ttft.Observe(MicrosSince(r.submitted, now));
    timelines_.Add(r.id, TimelineEntry{NowMicros(now), TimelineEvent::kFirstToken, 0, "", ""});
  } else {
    stats_.tpot.Observe(MicrosSince(r.last_token, now));
  }
  r.last_token = now;
  r.generated.push_back(token);
  r.digests.push_back(LogitsDigest(logits));
  ++stats_.tokens_generated;
  step_tokens_.push_back(r.id);  // committed to memd, then streamed, by CommitStep
}

wire::TokensCommittedT Worker::TokensCommittedOf(std::span<const RequestId> ids) const {
  wire::TokensCommittedT commit;
  commit.gpu = config_.gpu;
  for (RequestId id : ids) {
    const Request& r = *requests_.at(id);
    const size_t committed = r.life->tokens.committed;
    if (committed >= r.generated.size()) continue;
    auto e = std::make_unique<wire::CommittedTokensT>();
    e->request = id;
    e->from = static_cast<uint32_t>(committed);  // a step whose message could not be queued is resent here
    for (size_t t = committed; t < r.generated.size(); ++t) {
      e->tokens.push_back(static_cast<uint8_t>(r.generated[t]));
      e->logits_digests.push_back(r.digests[t]);
    }
    commit.entries.push_back(std::move(e));
  }
  return commit;
}

void Worker::CommitStep() {
  if (step_tokens_.empty()) return;
  // A speculative round emits several tokens of one request (RecordToken per token): one entry per request, with the
  // count of its tokens this step.
  std::vector<RequestId> ids;
  std::map<RequestId, size_t> new_tokens;
  for (RequestId id : step_tokens_) {
    if (new_tokens[id]++ == 0) ids.push_back(id);
  }
  step_tokens_.clear();
  if (away()) {  // memd away: no record can take them, so no client gets them yet (FlushHeld after the re-Hello)
    for (RequestId id : ids) {
      Request& r = *requests_.at(id);
      std::optional<size_t>& held = r.life->tokens.held_from;
      if (!held) held = r.generated.size() - new_tokens[id];
      stats_.tokens_while_away += new_tokens[id];
    }
    return;
  }
  // The record first (one message for the step), then the chunks: see worker.h, "Committed tokens".
  if (absl::Status s = memd_->SendTokensCommitted(TokensCommittedOf(ids)); s.ok()) {
    for (RequestId id : ids) requests_.at(id)->life->tokens.committed = requests_.at(id)->generated.size();
  } else {
    // The previous message is not acknowledged yet (these tokens go with a later step), or memd is dead or hung (the
    // liveness checks end the epoch). The tokens stream anyway, ahead of memd's record: a resume regenerates them
    // identically (worker.h, "Committed tokens").
    ++stats_.commits_deferred;
    DHS_LOG_LIMITED(spdlog::level::debug, "worker: TokensCommitted not sent now ({})", s.ToString());
  }
  for (RequestId id : ids) {
    Request& r = *requests_.at(id);
    const bool finished = r.generated.size() >= r.max_new;
    if (r.generated.size() - new_tokens[id] == static_cast<size_t>(r.resumed)) {  // a resume's first new token
      resumes_->FirstNewToken(r.resume, r.id, r.client_id, std::chrono::steady_clock::now());
    }
    // A re-attached client that had tokens the record lacked gets only the ones after those (same draws: equal).
    const size_t first = std::max(r.generated.size() - new_tokens[id], r.life->tokens.client_has);
    const bool has = r.generated.size() <= first;
    if (has && !finished) continue;
    const auto from = static_cast<ptrdiff_t>(first);
    absl::Status sent =
        has ? SendChunk(r, {}, {}, true, absl::OkStatus())
            : SendChunk(r, std::vector<model::Token>(r.generated.begin() + from, r.generated.end()),
                        std::vector<uint64_t>(r.digests.begin() + from, r.digests.end()), finished, absl::OkStatus());
    if (!sent.ok()) {
      // The client does not read: the request fails (RunBatch ends it; its final chunk carries this error).
      r.client_error = absl::Status(sent.code(), absl::StrCat("request ", r.client_id, " failed after ",
                                                              r.generated.size() - 1, " tokens: ", sent.message()));
    }
  }
}

absl::Status Worker::SendChunk(Request& r, std::vector<model::Token> tokens, std::vector<uint64_t> digests,
                               bool finished, const absl::Status& error) {
  if (!r.life->client) return absl::OkStatus();  // detached: kept in r.generated / r.digests for its Attach
  const auto now = std::chrono::steady_clock::now();
  wire::TokenChunkT chunk;
  chunk.request = r.client_id;
  for (model::Token t : tokens) chunk.tokens.push_back(static_cast<uint8_t>(t));
  chunk.logits_digests = std::move(digests);
  chunk.finished = finished;
  chunk.ttft_us = r.ttft_us;
  chunk.since_submit_us = MicrosSince(r.submitted, now);
  chunk.allocation_wait_us =
      WaitsForGrant(r.life->held_phase()) ? chunk.since_submit_us : MicrosSince(r.submitted, r.granted);
  if (!error.ok()) {
    chunk.error = ToWireError(error);
    chunk.error_message = std::string(error.message());
    chunk.end_reason = EndReasonOf(error);  // WORKER_EPOCH_ENDED: the client re-attaches (matches the code, not text)
  }
  return client_->Chunk(*r.life->client, chunk);
}

std::string FailureReason(const absl::Status& error) {
  std::string name = absl::StatusCodeToString(error.code());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

void Worker::CountFailure(const absl::Status& error) {
  ++stats_.failed_requests;
  ++stats_.failures[FailureReason(error)];
}

void Worker::ReportEnd(Request& r, const absl::Status& error) {
  if (!error.ok()) {
    DHS_CHECK_OK(SendChunk(r, {}, {}, true, error));  // a final chunk is always taken (nothing sent when detached)
    CountFailure(error);
  }
  ++stats_.finished_requests;
  timelines_.Add(r.id, TimelineEntry{NowMicros(std::chrono::steady_clock::now()), TimelineEvent::kEnd,
                                     r.generated.size(), error.ok() ? "ok" : error.ToString(), ""});
  timelines_.End(r.id);
  if (!r.life->client) {  // kept for its Attach
    DropUnclaimed(book_.KeepDetached(r.life->key(), DetachedOutput{r.generated, r.digests, error},
                                     std::chrono::steady_clock::now()));
  }
}

void Worker::DropUnclaimed(const std::vector<DroppedOutput>& dropped) {
  for (const DroppedOutput& d : dropped) {
    ++stats_.resumed_outputs_dropped;
    spdlog::warn("worker: the resumed output of request {} of client {} ({} bytes) is dropped, no client attached to "
                 "it within the bound ({}; waited {} ms): an Attach now gets NOT_FOUND", d.key.second, d.key.first,
                 d.bytes, ResumedDropReasonName(d.reason), d.waited.count());
  }
}

void Worker::Finish(RequestId id, absl::Status error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (away() && !stopping_all_) {  // no Complete can go now: ended after the re-Hello (ReturnFromAway)
    DHS_CHECK_OK(book_.DeferEnd(id, std::move(error)));  // kEnding; a second end keeps the first
    return;
  }
  if (!error.ok()) spdlog::warn("worker: request {} ends with an error: {}", id, error.ToString());
  rounds_->Release(r.spec);
  ReportEnd(r, error);
  // A finished request's final chunk may still be queued in this process (the client outbox, ZeroMQ's queue): memd
  // keeps its output past the Complete, for the next worker should this one die first (README.md "Restart").
  wire::CompleteT complete;
  if (error.ok() && r.generated.size() >= r.max_new && r.digests.size() == r.generated.size()) {
    complete.keep_output = true;
    complete.output_from = 0;  // all of them: memd checks the overlap with its record (equal), appends the rest
    for (model::Token t : r.generated) complete.output_tokens.push_back(static_cast<uint8_t>(t));
    complete.output_digests = r.digests;
  }
  agent_->EndRequest(id, std::move(complete));  // copies memd would free pages under end first; KV released; Complete
  Erase(it, /*completed=*/true);  // a waiting one's grant may cross the Complete (RequestBook::StaleGrant)
}

size_t Worker::StopAll(const absl::Status& why) {
  // Waiting ones first: were a granted one completed first, memd could grant a waiting one its slot meanwhile.
  std::vector<RequestId> ids;
  for (const auto& [id, life] : book_.requests()) {
    if (WaitsForGrant(life.held_phase())) ids.push_back(id);
  }
  for (const auto& [id, life] : book_.requests()) {
    if (!WaitsForGrant(life.held_phase())) ids.push_back(id);
  }
  stopping_all_ = true;
  for (RequestId id : ids) {
    book_.MarkStopping(id);
    Finish(id, why);  // error chunk, copies waited for, KV released, Complete
  }
  stopping_all_ = false;
  return ids.size();
}

absl::Status Worker::Cancel(RequestId client_id, uint64_t client_identity, const ClientRef& client,
                            std::string_view reason) {
  constexpr size_t kMaxReasonBytes = 256;
  reason = reason.substr(0, kMaxReasonBytes);
  // By (peer, client id), else a resumed request no client re-attached to (the first in node-id order, as Attach).
  RequestLife* life = book_.FindByClient(client.peer, client_id);
  if (life == nullptr) life = book_.FindDetached({client_identity, client_id});
  Request* r = life != nullptr ? requests_.at(life->id).get() : nullptr;
  if (r == nullptr || life->phase == RequestPhase::kEnding || r->generated.size() >= r->max_new) {
    return absl::NotFoundError(absl::StrCat("cancel: request ", client_id, " of this client is not in flight here ",
                                            r == nullptr ? "(unknown, or finished already)" : "(already ending or finished)"));
  }
  if (!life->client) DHS_CHECK_OK(book_.AttachClient(r->id, client));  // its final chunk answers the Cancel
  ++stats_.requests_cancelled;
  spdlog::info("worker: request {} (client {}) cancelled by its client: {}", r->id, client_id, reason);
  Finish(r->id, RequestCancelledError(reason));  // final chunk, copies waited for, KV and slots released, Complete
  return absl::OkStatus();
}

size_t Worker::EndClient(const std::string& peer, const absl::Status& why) {
  const std::vector<RequestId> ids = book_.IdsOfPeer(peer);
  for (RequestId id : ids) Finish(id, why);  // error chunk (dropped: no one reads it), KV released, Complete
  return ids.size();
}

absl::StatusOr<bool> Worker::Iterate() {
  if (book_.detached_outputs() > 0) DropUnclaimed(book_.ExpireDetached(std::chrono::steady_clock::now()));
  agent_->Poll();
  FailDataLoss();  // issue 22: a populate found a changed host page
  StartGranted();
  if (absl::Status s = RunBatch(); !s.ok()) return s;
  agent_->Poll();
  if (!agent_->link_status().ok()) return agent_->link_status();
  if (away()) return last_batch_ > 0;  // paused requests wait for memd, not for the loop
  return active_requests() > 0 || agent_->busy();
}

std::vector<std::unique_ptr<wire::RequestRecordT>> Worker::DropRefused(const ReturnPlan& plan) {
  // Refused reports: memd changed nothing of them. Each ends here like after a fence (its client re-attaches) and is
  // resumed: from memd's interrupted record (ResumeInterrupted below), else from this worker's record.
  std::vector<std::unique_ptr<wire::RequestRecordT>> own;
  for (const auto& [id, why] : plan.refused) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    spdlog::warn("worker: memd refused the report of request {}: {}; it is resumed", id, why);
    agent_->Forget(id);
    if (!plan.interrupted.contains(id)) own.push_back(RecordOf(*r.life, r.generated, r.digests));
    const absl::Status ended = WorkerEpochEndedError(absl::StrCat("memd refused its report: ", why));
    DHS_CHECK_OK(SendChunk(r, {}, {}, true, ended));  // a final chunk is always taken
    CountFailure(ended);
    timelines_.Add(id, TimelineEntry{NowMicros(std::chrono::steady_clock::now()), TimelineEvent::kEnd,
                                     r.generated.size(), ended.ToString(), ""});
    timelines_.End(id);
    Erase(it);
  }
  return own;
}

absl::Status Worker::ReturnFromAway(const wire::HelloReplyT& reply) {
  // The transport moved the session on the reply (MemdClient::PollAway); an in-process caller hands it in here.
  if (memd_->session().away()) DHS_CHECK_OK(memd_->session().Accepted());
  const ReturnPlan plan = PlanReturn(reply, book_);
  std::vector<std::unique_ptr<wire::RequestRecordT>> own = DropRefused(plan);
  // Adopted: the report carried every token (nothing stepped while the Hello was out), so the held ones go out.
  for (RequestId id : plan.adopted) {
    Request& r = *requests_.at(id);
    r.life->tokens.committed = r.generated.size();
    if (r.life->phase == RequestPhase::kPaused) {
      DHS_CHECK_OK(book_.Transition(id, RequestPhase::kPaused, RequestPhase::kActive));
    }
    FlushHeld(r);
  }
  agent_->ReturnFromAway(plan.adopted);
  if (hier_ != nullptr) {
    if (absl::Status s = hier_->ResumeHostWrites(); !s.ok()) spdlog::error("worker: deferred backups: {}", s.ToString());
  }
  std::vector<std::pair<RequestId, absl::Status>> ended;  // failed, finished or left by its client while away
  for (auto& [id, r] : requests_) {
    const RequestPhase phase = r->life->phase;
    if (phase == RequestPhase::kEnding) {
      ended.emplace_back(id, r->life->end_status);
    } else if (phase == RequestPhase::kActive && !r->client_error.ok()) {
      ended.emplace_back(id, r->client_error);
    } else if (phase == RequestPhase::kActive && r->generated.size() >= r->max_new) {
      ended.emplace_back(id, absl::OkStatus());
    }
  }
  for (auto& [id, why] : ended) Finish(id, why);
  if (absl::Status s = ResumeInterrupted(reply.interrupted_requests, reply.interrupted_records); !s.ok()) return s;
  for (const auto& rec : own) {
    absl::Status s = Resume(0, *rec);
    if (absl::IsUnavailable(s)) return s;
    if (!s.ok()) spdlog::warn("worker: {}; ended", s.ToString());
  }
  for (RequestId id : plan.resend) {  // sent again last (the resumes above sent their own)
    auto it = requests_.find(id);
    if (it == requests_.end() || !WaitsForGrant(it->second->life->phase)) continue;
    if (it->second->life->phase == RequestPhase::kUnsent) {
      DHS_CHECK_OK(book_.Transition(id, RequestPhase::kUnsent, RequestPhase::kWaiting));
    }
    if (absl::Status s = SendAdmit(*it->second); !s.ok()) return s;
  }
  spdlog::info("worker: memd is back: {} requests adopted, {} refused, {} ended while away; {} tokens generated and "
               "{} requests paused while away (since start)", plan.adopted.size(), reply.refused_reports.size(),
               ended.size(), stats_.tokens_while_away, stats_.paused_while_away);
  return absl::OkStatus();
}

absl::Status Worker::ResumeInterrupted(std::span<const uint64_t> ids,
                                       const std::vector<std::unique_ptr<wire::RequestRecordT>>& records) {
  std::map<uint64_t, const wire::RequestRecordT*> by_id;
  for (const auto& rec : records) by_id[rec->request] = rec.get();
  for (uint64_t id : ids) {
    auto served = requests_.find(id);
    if (served != requests_.end() && !WaitsForGrant(served->second->life->held_phase())) continue;  // adopted
    auto rec = by_id.find(id);
    // Resumed when it has a record, unless this worker ended it (its Complete went to a dead memd) or waits for its
    // grant (the dead memd's grant never came: it is admitted again, after this Complete).
    if (rec != by_id.end() && served == requests_.end() && !agent_->Finished(id)) {
      absl::Status s = Resume(id, *rec->second);
      if (absl::IsUnavailable(s)) return s;
      if (!s.ok()) spdlog::warn("workerd: {}; ended", s.ToString());
      continue;
    }
    wire::CompleteT c;
    c.request = id;
    c.gpu = config_.gpu;
    if (absl::Status s = memd_->SendComplete(c); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("worker cannot reach memd: ", s.message()));
    }
    spdlog::info("workerd: interrupted request {} of GPU {} ended ({})", id, config_.gpu,
                 served != requests_.end() ? "its admission is sent again"
                 : agent_->Finished(id)    ? "it had finished here"
                                           : "no record");
  }
  return absl::OkStatus();
}

bool Worker::MayStep(const Request& r, Position rows) const {
  // Finished (or failed) while memd was away: it ends after the re-Hello, it never steps again.
  if (r.life->phase == RequestPhase::kEnding || r.generated.size() >= r.max_new) return false;
  if (!away()) return true;
  if (!r.client_error.ok()) return false;
  const std::optional<size_t>& held = r.life->tokens.held_from;
  if (held && r.generated.size() - *held >= config_.away_held_tokens) return false;
  return hier_ == nullptr || hier_->TailHasRoom(r.id, rows);
}

void Worker::FlushHeld(Request& r) {
  TokenCounts& counts = r.life->tokens;
  if (!counts.held_from) return;
  const size_t from = std::max(*counts.held_from, counts.client_has);
  counts.held_from.reset();
  const bool finished = r.generated.size() >= r.max_new;
  if (from >= r.generated.size() && !finished) return;
  std::vector<model::Token> tokens(r.generated.begin() + static_cast<std::ptrdiff_t>(std::min(from, r.generated.size())),
                                   r.generated.end());
  std::vector<uint64_t> digests(r.digests.begin() + static_cast<std::ptrdiff_t>(std::min(from, r.digests.size())),
                                r.digests.end());
  if (absl::Status s = SendChunk(r, std::move(tokens), std::move(digests), finished, absl::OkStatus()); !s.ok()) {
    r.client_error = absl::Status(s.code(), absl::StrCat("request ", r.client_id, " failed after ", r.generated.size(),
                                                         " tokens: ", s.message()));
  }
}

// ---- memd away (issue 11) ----

void Worker::EnterAway() {
  if (!memd_->session().TakeLoss(std::chrono::steady_clock::now())) return;  // once per death
  ++stats_.memd_aways;
  agent_->EnterAway();
  if (hier_ != nullptr) hier_->PauseHostWrites();
  spdlog::warn("worker: memd is away: serving {} granted requests from the GPU (no admissions, no host writes, "
               "tokens held from clients) until a memd takes the re-Hello", active_requests());
}

std::vector<std::unique_ptr<wire::ReportedRequestT>> Worker::Report() const {
  std::vector<std::unique_ptr<wire::ReportedRequestT>> out;
  for (const auto& [id, r] : requests_) {
    if (WaitsForGrant(r->life->held_phase())) continue;  // its AdmitRequest goes again
    std::unique_ptr<wire::ReportedRequestT> rep = agent_->Report(id);
    if (rep == nullptr) continue;
    rep->complete_pages = AdmitCompletePages(*r);
    rep->optional_history = config_.mode == WorkerMode::kAdaptive;
    rep->record = RecordOf(*r->life, r->generated, r->digests);
    SetSpeculationShare(geometry_, *rep);  // as its AdmitRequest declared it
    out.push_back(std::move(rep));
  }
  return out;
}


WorkerStats Worker::stats() const {
  WorkerStats s = stats_;
  if (hier_ != nullptr) s.census = hier_->TotalCensus();
  if (hier_ != nullptr) s.host_integrity = hier_->host_integrity();
  const ResumeCounters& rc = resumes_->counters();
  s.rows_imported = rc.rows_imported;
  s.rows_recomputed = rc.rows_recomputed;
  s.resume_us_max = rc.resume_us_max;
  const RoundCounters& sc = rounds_->counters();
  s.spec_rounds = sc.rounds;
  s.spec_round_tokens = sc.round_tokens;
  s.spec_proposed = sc.proposed;
  s.spec_accepted = sc.accepted;
  s.spec_propose_us = sc.propose_us;
  s.spec_width_rounds = sc.width_rounds;
  const ResidencyStats& a = agent_->stats();
  s.reclaims_obeyed = a.reclaims_obeyed;
  s.pages_reclaimed = a.pages_reclaimed;
  s.pages_populated = a.pages_populated;
  s.pages_kept = a.pages_kept;
  s.pages_backed_up = a.pages_backed_up;
  return s;
}

wire::WorkerStatsReplyT Worker::StatsReply() const {
  const WorkerStats s = stats();
  wire::WorkerStatsReplyT r;
  r.gpu = config_.gpu;
  r.mode = std::string(WorkerModeName(config_.mode));
  r.census_direct = s.census.direct;
  r.census_hot = s.census.hot;
  r.census_host = s.census.host;
  r.bytes_recovered = s.census.bytes_recovered;
  r.reclaims_obeyed = s.reclaims_obeyed;
  r.pages_reclaimed = s.pages_reclaimed;
  r.pages_populated = s.pages_populated;
  r.pages_kept = s.pages_kept;
  r.pages_backed_up = s.pages_backed_up;
  r.active_requests = active_requests();
  r.waiting_requests = waiting_requests();
  r.finished_requests = s.finished_requests;
  r.failed_requests = s.failed_requests;
  r.tokens_generated = s.tokens_generated;
  r.prefix_blocks_imported = s.prefix_blocks_imported;
  r.prefix_blocks_computed = s.prefix_blocks_computed;
  r.submits_refused = s.submits_refused;
  r.waiting_requests_peak = s.waiting_requests_peak;
  r.requests_resumed = s.requests_resumed;
  r.rows_recomputed = s.rows_recomputed;
  r.rows_imported = s.rows_imported;
  r.resume_us_max = s.resume_us_max;
  r.capacity_pages = geometry_.capacity_pages;
  r.page_bytes = geometry_.page_bytes;
  r.speculate = std::string(spec::SpeculateModeName(config_.speculation.mode));
  r.spec_rounds = s.spec_rounds;
  r.spec_round_tokens = s.spec_round_tokens;
  r.spec_proposed = s.spec_proposed;
  r.spec_accepted = s.spec_accepted;
  r.spec_propose_us = s.spec_propose_us;
  r.spec_width_rounds = s.spec_width_rounds;
  // The reservations declared to memd (Hello): the drafter's ring is checked equal at Create, the staging arenas are
  // the KV hierarchy's (staging_bytes(), sized by the same geometry).
  r.draft_ring_bytes = geometry_.speculation.draft_ring_bytes;
  r.staging_bytes = static_cast<uint64_t>(staging_bytes());
  r.resumed_outputs_waiting = static_cast<uint32_t>(book_.detached_outputs());
  r.resumed_outputs_dropped = s.resumed_outputs_dropped;
  r.host_pages_checksummed = s.host_integrity.pages_checksummed;
  r.host_pages_verified = s.host_integrity.pages_verified;
  r.host_bytes_verified = s.host_integrity.bytes_verified;
  r.host_page_mismatches = s.host_integrity.mismatches;
  r.ttft = ToWireHistogram(s.ttft);
  r.tpot = ToWireHistogram(s.tpot);
  r.admission_wait = ToWireHistogram(s.admission_wait);
  for (const auto& [reason, count] : s.failures) {
    auto rc = std::make_unique<wire::ReasonCountT>();
    rc->reason = reason;
    rc->count = count;
    r.failures.push_back(std::move(rc));
  }
  r.epoch = static_cast<uint32_t>(book_.epoch());
  r.requests_cancelled = s.requests_cancelled;
  return r;
}

std::string Worker::TimelineJson(uint64_t client_request) const {
  return TimelinesToJson(timelines_.FindClient(client_request), absl::StrCat("worker/", config_.gpu)).dump();
}

}  // namespace dhs
