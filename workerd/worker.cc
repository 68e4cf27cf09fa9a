// workerd/worker.cc: see worker.h.
#include "workerd/worker.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/fault_point.h"
#include "common/log_limiter.h"
#include "common/session_digest.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "workerd/model/resident_kv_access.h"
#include "workerd/model/step_profile.h"

namespace dhs {
namespace {

// The TokensCommitted of `ids` (requests with tokens this step): each one's tokens from its `committed` on.
// The TokensCommitted of the ledger's `entries` (TokenLedger::Next): tokens [from, to) of each request.
wire::TokensCommittedT TokensCommittedOf(GpuId gpu, std::span<const TokenLedger::Entry> entries,
                                         const RequestMap& requests) {
  wire::TokensCommittedT commit;
  commit.gpu = gpu;
  for (const TokenLedger::Entry& entry : entries) {
    const WorkerRequest& r = *requests.at(entry.request);
    auto e = std::make_unique<wire::CommittedTokensT>();
    e->request = entry.request;
    e->from = static_cast<uint32_t>(entry.from);  // what memd acknowledged: an unqueued step's tokens go again here
    for (size_t t = entry.from; t < entry.to; ++t) {
      e->tokens.push_back(static_cast<uint8_t>(r.out.generated[t]));
      e->logits_digests.push_back(r.out.digests[t]);
    }
    commit.entries.push_back(std::move(e));
  }
  return commit;
}

}  // namespace

Worker::Worker(const model::Model* model, Device* device, WorkerConfig config, WorkerGeometry geometry,
               MemdLink* memd)
    : model_(model), device_(device), config_(std::move(config)), geometry_(std::move(geometry)), memd_(memd),
      book_(config_.gpu, config_.resumed_outputs), recorder_(config_.gpu) {}

Worker::~Worker() = default;

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const model::Model* model, Device* device,
                                                       const WorkerConfig& config, MemdTransport* memd,
                                                       ClientSink* client) {
  if (model == nullptr || device == nullptr || memd == nullptr || client == nullptr) {
    return absl::InvalidArgumentError("worker: model, device, memd transport and client sink are required");
  }
  absl::StatusOr<WorkerGeometry> g = ComputeGeometry(model->config(), config);
  if (!g.ok()) return g.status();
  if (absl::Status s = ValidateResumedOutputLimits(config.resumed_outputs); !s.ok()) return s;
  std::unique_ptr<Worker> w(new Worker(model, device, config, *std::move(g), memd));
  // The KV side is libdhs's (issue 25, "workerd uses it"): the library opened over this worker's memd transport and
  // device with the worker's shape (EmbeddedConfigOf, the shape its Hello declared) builds the store, the residency
  // agent and the data path the model goes through, as it does for an engine.
  lib::EmbeddedConfig shape = EmbeddedConfigOf(model->config(), config, w->geometry_, "workerd");
  shape.model_fingerprint = model->fingerprint();  // as the Hello memd took (WorkerProcess)
  absl::StatusOr<std::unique_ptr<lib::EmbeddedWorker>> lib = lib::EmbeddedWorker::OpenOver(shape, *memd, device);
  if (!lib.ok()) return lib.status();
  w->lib_ = *std::move(lib);
  w->hier_ = w->lib_->stack().hierarchical();
  // The model's KV calls go through libdhs's data path (libdhs/kv_port.h), in every mode.
  w->port_ = &w->lib_->port();
  w->port_kv_ = std::make_unique<lib::PortKvAccess>(w->port_);
  w->kv_ = w->port_kv_.get();
  w->agent_ = w->lib_->stack().agent();
  // Resident mode imports nothing (no host tier): its ResumeImporter has no port.
  w->resumes_ = std::make_unique<ResumeImporter>(model, w->hier_ != nullptr ? w->port_ : nullptr,
                                                 config.page_rows);
  absl::StatusOr<std::unique_ptr<SpeculativeRounds>> rounds = SpeculativeRounds::Create(model, config, w->geometry_);
  if (!rounds.ok()) return rounds.status();
  w->rounds_ = *std::move(rounds);
  w->prefixes_ = std::make_unique<PrefixImporter>(model, w->geometry_.prefill_chunk, config.prefix_cache_bytes,
                                                  w->resumes_.get(), &w->recorder_);
  RequestEnds* ends = w.get();  // the rooms end a request through the loop's Finish
  w->clients_ = std::make_unique<ClientStreams>(client, &w->book_, &w->requests_, &w->recorder_, ends);
  w->admission_ = std::make_unique<AdmissionDesk>(
      AdmissionParts{model, &w->config_, &w->geometry_, memd, &w->book_, &w->requests_, w->agent_,
                     w->resumes_.get(), &w->recorder_, w->clients_.get(), ends, &w->ledger_});
  // memd's messages arrive through libdhs: it carries the orders out on the KV side, the desk gets the answers.
  w->inbox_ = &w->lib_->InboxFor(*w->admission_);
  w->away_ = std::make_unique<MemdAway>(AwayParts{&w->config_, &w->geometry_, memd, &w->book_, &w->requests_,
                                                  w->agent_, w->hier_, &w->recorder_, w->clients_.get(),
                                                  w->admission_.get(), ends, &w->lib_->stack(), &w->ledger_});
  return w;
}

absl::Status Worker::Submit(const wire::SubmitRequestT& submit, const ClientRef& client) {
  if (absl::Status s = ValidateSubmit(submit, config_.max_context_tokens); !s.ok()) return s;
  const bool away = away_->away();
  absl::StatusOr<RequestLife*> life = book_.Open(submit, client, away, config_.submit_queue);
  if (absl::IsResourceExhausted(life.status())) ++recorder_.counts().submits_refused;
  if (!life.ok()) return life.status();
  std::unique_ptr<Request> r = NewWorkerRequest(**life, std::chrono::steady_clock::now());
  // memd away: admitted after the re-Hello (MemdAway::Return; kUnsent).
  if (absl::Status s = away ? absl::OkStatus() : admission_->SendAdmit(*r); !s.ok()) {
    book_.Close(r->id, /*completed=*/false);
    return s;
  }
  if (r->id != r->client_id) {
    spdlog::debug("worker: request {} of client {} is node request {}", r->client_id, client.peer, r->id);
  }
  recorder_.Submitted(*r, submit.client, "");
  const RequestId client_id = r->client_id;
  requests_.emplace(r->id, std::move(r));
  WorkerStats& counts = recorder_.counts();
  counts.waiting_requests_peak = std::max(counts.waiting_requests_peak, book_.waiting_for_grant());
  clients_->Accept(client, client_id, book_.not_active() - 1);  // the requests not active before this one
  return absl::OkStatus();
}

absl::Status Worker::ResumeInterrupted() {
  for (const lib::EmbeddedWorker::TakenResumable& t : lib_->TakeResumable()) {
    if (absl::Status s = admission_->ResumeOrEnd(t.request, t.record); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Worker::Attach(RequestId client_id, uint32_t received, const ClientRef& client,
                            uint64_t client_identity) {
  return clients_->Attach(client_id, received, client, client_identity);
}

absl::Status Worker::Cancel(RequestId client_id, uint64_t client_identity, const ClientRef& client,
                            std::string_view reason) {
  return clients_->Cancel(client_id, client_identity, client, reason);
}

// ---- the loop ----

absl::StatusOr<bool> Worker::Iterate() {
  clients_->ExpireOutputs(std::chrono::steady_clock::now());
  model::StepProfile* const profile = model::StepProfile::Get();  // issue 27: the loop's split (opt-in)
  {
    model::LoopTimer timer(profile, model::LoopPhase::kPoll);
    lib_->stack().CarryOutHeld();  // memd's orders that came while the model's readers were outstanding
    agent_->Poll();
  }
  FailDataLoss();  // issue 22: a populate found a changed host page
  for (RequestId id : book_.TakeGranted()) {  // each holds its own slot and residency plan: it starts at once
    if (admission_->Start(id)) continue;
    Request& r = *requests_.at(id);
    r.fed = 0;  // its resume's import failed: every row recomputed from the tokens (same bits)
    if (absl::Status rebuilt = ReplayFed(r); !rebuilt.ok()) Finish(id, rebuilt);
  }
  if (absl::Status s = RunBatch(); !s.ok()) return s;
  {
    model::LoopTimer timer(profile, model::LoopPhase::kPoll);
    agent_->Poll();
  }
  if (!agent_->link_status().ok()) return agent_->link_status();
  if (away_->away()) return last_batch_ > 0;  // paused requests wait for memd, not for the loop
  return book_.active() > 0 || agent_->busy() || lib_->stack().held_orders() > 0;
}

absl::Status Worker::ReplayFed(Request& r) {
  if (absl::Status s = agent_->RebuildKv(r.id); !s.ok()) return s;  // released and planned again
  // A resume: the rows it imported so far are recomputed below too; its host-backed pages are host-ready again, so
  // the runs after `fed` are still imported (else everything is recomputed).
  resumes_->AfterRebuild(r.resume, r.id);
  r.session.emplace(model_->NewSession(r.id));
  r.prefix.capture.reset();  // recomputed below without the row cache; a later block starts a fresh capture
  const std::vector<model::Token> all = r.Tokens();
  for (Position pos = 0; pos < r.fed;) {
    const size_t n = std::min<size_t>(geometry_.prefill_chunk, static_cast<size_t>(r.fed - pos));
    if (absl::Status s = model_->ImportPrefix(*r.session, std::span<const model::Token>(all.data() + pos, n), *kv_);
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
    const Position import_end = std::min<Position>(r.prefix.tokens, in - 1);
    const auto chunk = static_cast<Position>(std::max<uint32_t>(geometry_.prefill_chunk, r.prefix.block_tokens));
    if (!away_->MayStep(r, r.fed < in ? std::min<Position>(chunk, in - r.fed) : 1)) {
      away_->Pause(r);  // memd away: paused until the re-Hello
      continue;
    }
    // A resume's host run starting here is imported (no compute), but not while memd is away: the jump may overwrite
    // tail slots whose backups wait for the re-Hello (host writes are paused).
    if (away_->away() && resumes_->RunAt(r.resume, r.fed)) continue;
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
      if (model::StepProfile* profile = model::StepProfile::Get(); profile != nullptr) {  // issue 27 (opt-in)
        {
          model::LoopTimer timer(profile, model::LoopPhase::kImport);
          s = prefixes_->ImportChunk(r, *kv_);
        }
        profile->ImportChunkEnd();
      } else {
        s = prefixes_->ImportChunk(r, *kv_);
      }
      if (!s.ok()) {
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
      item.tokens = {r.out.generated.back()};
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
    if (r.fed < static_cast<Position>(r.input.size()) || r.out.generated.empty()) continue;  // prefilling
    const int64_t remaining = static_cast<int64_t>(r.max_new) - static_cast<int64_t>(r.out.generated.size());
    candidates.push_back(RoundCandidate{&r.spec, r.id, &*r.session,
                                        spec::RoundKey{r.sampling.seed, r.client_id, r.fed}, remaining,
                                        r.sampling.greedy, [&r] { return r.Tokens(); },
                                        [this, &r](model::ModelSession& s, KvAccess& kv) {
                                          return prefixes_->CopyCachedPrefix(r, s, kv);
                                        }});
    which.push_back(&item);
  }
  int64_t joining = 0;  // the online width's load: granted soon (sent to memd and not told to wait)
  for (const auto& [id, r] : requests_) {  // waiting, not told to wait (kQueued)
    const RequestPhase p = r->life->held_phase();
    joining += rounds_->online() && (p == RequestPhase::kUnsent || p == RequestPhase::kWaiting);
  }
  std::vector<std::optional<spec::DraftResult>> drafts =
      rounds_->Propose(candidates, static_cast<int64_t>(book_.active()), joining, *kv_);
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
  const RoundInput round{&r.spec, r.id, &*r.session, spec::RoundKey{r.sampling.seed, r.client_id, r.fed},
                         r.sampling.greedy, &r.sampling.params};
  absl::StatusOr<spec::RoundOutcome> outcome = rounds_->Finish(round, item.draft, logits, hidden, *kv_);
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
    if (items != nullptr) std::erase_if(*items, [id = id](const BatchItem& b) { return b.r->id == id; });  // before Finish
    Finish(id, absl::DataLossError(absl::StrCat("request ", it->second->client_id, " failed: ", why.message())));
  }
}

void Worker::RetryAlone(std::vector<BatchItem>& items) {
  for (BatchItem& item : items) {
    Request& r = *item.r;
    absl::Status s = ReplayFed(r);
    model::StepOutput solo;
    if (s.ok() && item.round) s = model_->BeginVerification(*r.session, *kv_);  // rebuilt: hold its round again
    if (s.ok()) {
      model::StepInput in{&*r.session, item.tokens, rounds_->WantsHidden(r.spec)};
      s = model_->Step(std::span<model::StepInput>(&in, 1), *kv_, std::span<model::StepOutput>(&solo, 1));
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
  absl::Status st = model_->Step(batch, *kv_, out);
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
  // Finished requests (their last chunk is out), and those whose client refused a chunk: release and tell memd. memd
  // away: Finish defers the end to the re-Hello (kEnding: the request ended here, whatever memd answers; its held
  // tokens and final chunk go out then; review finding: a finished one stayed kActive, so a refused report had it
  // resumed and its client told the epoch ended).
  std::vector<std::pair<RequestId, absl::Status>> done;
  for (const auto& [id, r] : requests_) {
    if (!Steps(r->life->phase)) continue;
    if (!r->client_error.ok()) {
      done.emplace_back(id, r->client_error);
    } else if (r->finished()) {
      done.emplace_back(id, absl::OkStatus());
    }
  }
  for (auto& [id, status] : done) Finish(id, std::move(status));
  return absl::OkStatus();
}

void Worker::EmitToken(Request& r, std::span<const float> logits) {
  // Token t's draw is keyed by (seed, client id, t): a resumed request draws what the dead worker would have.
  const model::DrawKey key{r.sampling.seed, r.client_id, r.out.generated.size()};
  RecordToken(r, r.sampling.greedy ? model::Argmax(logits) : model::Sample(logits, r.sampling.params, key), logits);
}

void Worker::RecordToken(Request& r, model::Token token, std::span<const float> logits) {
  const auto now = std::chrono::steady_clock::now();
  if (r.out.generated.empty()) r.times.ttft_us = MicrosSince(r.times.submitted, now);
  recorder_.Token(r, now);  // TTFT / TPOT, the timeline's first token
  r.times.last_token = now;
  r.out.generated.push_back(token);
  r.out.digests.push_back(LogitsDigest(logits));
  step_tokens_.push_back(r.id);  // committed to memd, then streamed, by CommitStep
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
  if (away_->away()) {  // memd away: no record can take them, so no client gets them yet (until the re-Hello)
    for (RequestId id : ids) away_->Hold(*requests_.at(id), new_tokens[id]);
    return;
  }
  // The record first (one message for every request behind, TokenLedger::Next), then the chunks: see worker.h,
  // "Committed tokens".
  std::vector<TokenLedger::Entry> entries =
      ledger_.Next(book_, [&](RequestId id) { return requests_.at(id)->out.generated.size(); });
  absl::Status s = entries.empty() ? absl::OkStatus()
                                   : memd_->SendTokensCommitted(TokensCommittedOf(config_.gpu, entries, requests_));
  if (s.ok()) {
    ledger_.Sent(std::move(entries));
  } else {
    // The previous message is not acknowledged yet (these tokens go with a later step), or memd is dead or hung (the
    // liveness checks end the epoch). The tokens stream anyway, ahead of memd's record: a resume regenerates them
    // identically (worker.h, "Committed tokens").
    ++recorder_.counts().commits_deferred;
    DHS_LOG_LIMITED(spdlog::level::debug, "worker: TokensCommitted not sent now ({})", s.ToString());
  }
  for (RequestId id : ids) {
    Request& r = *requests_.at(id);
    if (r.out.generated.size() - new_tokens[id] == static_cast<size_t>(r.out.resumed)) {  // a resume's first new one
      resumes_->FirstNewToken(r.resume, r.id, r.client_id, std::chrono::steady_clock::now());
    }
    clients_->Stream(r, new_tokens[id]);
  }
}

void Worker::Finish(RequestId id, absl::Status error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (away_->away() && !stopping_all_) {  // no Complete can go now: ended after the re-Hello (MemdAway::Return)
    DHS_CHECK_OK(book_.DeferEnd(id, std::move(error)));  // kEnding; a second end keeps the first
    return;
  }
  if (!error.ok()) spdlog::warn("worker: request {} ends with an error: {}", id, error.ToString());
  rounds_->Release(r.spec);
  clients_->ReportEnd(r, error);
  // A finished request's final chunk may still be queued in this process (the client outbox, ZeroMQ's queue): memd
  // keeps its output past the Complete, for the next worker should this one die first (README.md "Restart").
  wire::CompleteT complete = CompleteOf(r, error);
  // Issue 26 (sessions across nodes): a turn that finished with a session names its complete history pages (the
  // tokens fed: input, then generated but the last) so that memd publishes them under its session.
  if (complete.keep_output && config_.mode != WorkerMode::kResident && r.life->submit.session != 0) {
    std::vector<model::Token> fed = r.Tokens();
    fed.resize(std::min(fed.size(), static_cast<size_t>(r.fed)));
    complete.session_page_digests = SessionPageDigests(std::span<const model::Token>(fed), config_.page_rows);
  }
  agent_->EndRequest(id, std::move(complete));  // copies memd would free pages under end first; KV released; Complete
  EraseRequest(requests_, book_, it, /*completed=*/true);  // a waiting one's grant may cross the Complete
}

void Worker::Drop(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  rounds_->Release(it->second->spec);  // review finding: a refused report's request kept its proposer slot for good
  EraseRequest(requests_, book_, it);
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

WorkerStats Worker::stats() const {
  return recorder_.Snapshot(StatsParts{hier_, &resumes_->counters(), &rounds_->counters(), &agent_->stats()});
}

absl::Status Worker::CheckInvariants() const {
  if (absl::Status s = book_.CheckInvariants(); !s.ok()) return s;
  if (absl::Status s = ledger_.CheckInvariants(); !s.ok()) return s;
  if (requests_.size() != book_.requests().size()) {
    return absl::InternalError(absl::StrCat(requests_.size(), " requests served, ", book_.requests().size(),
                                            " in the book"));
  }
  for (const auto& [id, r] : requests_) {
    if (r->life != book_.Find(id)) {
      return absl::InternalError(absl::StrCat("request ", id, " does not point at its book entry"));
    }
    if (r->life->tokens.committed > r->out.generated.size()) {
      return absl::InternalError(absl::StrCat("request ", id, ": ", r->life->tokens.committed, " tokens committed of ",
                                              r->out.generated.size(), " generated"));
    }
  }
  return absl::OkStatus();
}

wire::WorkerStatsReplyT Worker::StatsReply() const {
  return StatsReplyOf(stats(), StatsFacts{&config_, &geometry_, book_.active(), book_.not_active(),
                                          hier_ != nullptr ? hier_->staging_bytes() : 0,
                                          static_cast<uint32_t>(book_.detached_outputs()), book_.epoch()});
}

}  // namespace dhs
