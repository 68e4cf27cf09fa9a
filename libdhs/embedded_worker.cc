// libdhs/embedded_worker.cc: see embedded_worker.h.
#include "libdhs/embedded_worker.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/protocol.h"
#include "common/record_bounds.h"
#include "workerd/admission_shape.h"
#include "common/status.h"
#include "common/worker_shape.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "workerd/memd_session.h"
#include "workerd/prefix_chain.h"
#include "workerd/resume_plan.h"
#include "workerd/verification/staging_pool.h"

namespace dhs::lib {
namespace {

EmbeddedEvent Event(EmbeddedEvent::Kind kind, RequestId request, absl::Status status = absl::OkStatus()) {
  EmbeddedEvent e;
  e.kind = kind;
  e.request = request;
  e.status = std::move(status);
  return e;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EmbeddedWorker>> EmbeddedWorker::Open(const EmbeddedConfig& config,
                                                                      const RegionBackend& backend) {
  if (config.run_dir.empty()) return absl::InvalidArgumentError("dhs_worker_config: run_dir is empty");
  absl::StatusOr<wire::HelloT> hello = HelloOf(config);  // the shape checked (CheckShape) before connecting
  if (!hello.ok()) return hello.status();
  absl::StatusOr<RegionLayout> region = RegionOf(config);
  if (!region.ok()) return region.status();
  if (absl::Status s = CheckEnginePool(config, *region); !s.ok()) return s;
  // The backend's own checks (the GPU, the engine pool's kind) before memd hears a Hello: a refused open must not
  // register this GPU's shape at memd or spend an epoch.
  if (backend.check != nullptr) {
    if (absl::Status s = backend.check(config); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<MemdClient>> memd =
      MemdClient::Connect(config.run_dir, *hello, std::chrono::milliseconds(config.connect_timeout_ms));
  if (!memd.ok()) return memd.status();
  std::unique_ptr<MemdClient> client = *std::move(memd);
  MemdTransport* link = client.get();
  return Build(config, *region, *std::move(hello), std::move(client), *link, nullptr, backend.make);
}

absl::StatusOr<std::unique_ptr<EmbeddedWorker>> EmbeddedWorker::OpenOver(const EmbeddedConfig& config,
                                                                          MemdTransport& memd, Device* device) {
  absl::StatusOr<wire::HelloT> hello = HelloOf(config);
  if (!hello.ok()) return hello.status();
  absl::StatusOr<RegionLayout> region = RegionOf(config);
  if (!region.ok()) return region.status();
  if (absl::Status s = CheckEnginePool(config, *region); !s.ok()) return s;
  if (device != nullptr && config.engine_pool != nullptr) {
    return absl::InvalidArgumentError("dhs_worker_config: engine_pool with the caller's device (its pools are the "
                                      "device's: it allocates them)");
  }
  return Build(config, *region, *std::move(hello), nullptr, memd, device, CpuRegionDevice);
}

absl::Status EmbeddedWorker::CheckEnginePool(const EmbeddedConfig& config, const RegionLayout& region) {
  if (config.engine_pool == nullptr) return absl::OkStatus();  // the library allocates the region
  if (reinterpret_cast<uintptr_t>(config.engine_pool) % kEnginePoolAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: engine_pool is not aligned to ",
                                                   kEnginePoolAlignment, " bytes"));
  }
  if (config.engine_pool_bytes < region.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: engine_pool_bytes ", config.engine_pool_bytes,
                                                   " is below the ", region.bytes,
                                                   " bytes the KV pool", config.staging_arenas > 0 ?
                                                   " and its staging arenas need" : " needs",
                                                   " (dhs_pool_bytes_needed)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EmbeddedWorker>> EmbeddedWorker::Build(const EmbeddedConfig& config,
                                                                       const RegionLayout& region, wire::HelloT hello,
                                                                       std::unique_ptr<MemdTransport> owned,
                                                                       MemdTransport& memd, Device* device,
                                                                       decltype(RegionBackend::make) make_device) {
  std::unique_ptr<EmbeddedWorker> w(new EmbeddedWorker(config));
  w->owned_memd_ = std::move(owned);
  w->memd_ = &memd;
  const KvConfig kv = KvConfigOf(config);
  w->region_ = region;
  w->page_bytes_ = hello.page_bytes;  // the shape's sizes, as HelloOf declared them
  w->host_page_bytes_ = hello.host_page_bytes;
  w->capacity_pages_ = hello.capacity_pages;
  w->hello_ = std::move(hello);
  if (config.mode != WorkerMode::kResident && w->memd_->host_pages().empty()) {
    return absl::FailedPreconditionError("memd listed no host-pool segment");
  }
  if (device != nullptr) {
    // The caller's device (workerd's Worker: its CPU, asynchronous or CUDA backend): the store's pools are the
    // device's own (no region: Pool() and Resolve's offsets are not offered), resident mode's arena the store's own.
    w->device_ = device;
  } else {
    // The region: the engine's memory, or one pool of the library's device (region_device.h); the store's KV pool and
    // staging pool are its parts (RegionLayout), so a location is one offset into one region whichever part it names.
    absl::StatusOr<RegionDevice> made = make_device(config, region, w->memd_->host_pages());
    if (!made.ok()) return made.status();
    w->owned_device_ = std::move(made->device);
    w->device_ = w->owned_device_.get();
    w->region_base_ = made->base;
    w->backend_ = made->backend;
  }
  if (config.mode == WorkerMode::kResident) {
    // Every row resident (workerd's resident store; no host tier: NoKvResidency): over the region when there is one
    // (a location is an offset into it, as in the other modes), else in the store's own arena.
    const std::span<uint8_t> memory =
        w->region_base_ != nullptr ? std::span<uint8_t>(w->region_base_, region.kv_bytes) : std::span<uint8_t>();
    w->stack_ = KvStack::Resident(
        std::make_unique<model::ResidentKvAccess>(kv.row_bytes, region.kv_bytes, config.page_rows, memory), kv,
        w->memd_, KvStackConfig{config.gpu, config.slots, false});
  }
  if (config.mode != WorkerMode::kResident) {
    absl::StatusOr<std::unique_ptr<KvStack>> stack =
        KvStack::Hierarchical(kv, w->device_, w->memd_->host_pages(), w->memd_,
                              KvStackConfig{config.gpu, config.slots, config.mode == WorkerMode::kAdaptive});
    if (!stack.ok()) return stack.status();
    w->stack_ = *std::move(stack);
  }
  // A new worker holds no request and ended none: every interrupted request of the GPU is resumable (as workerd's start).
  w->resumable_.assign(w->memd_->interrupted_requests().begin(), w->memd_->interrupted_requests().end());
  w->kv_ = w->stack_->hierarchical();  // nullptr in resident mode
  w->agent_ = w->stack_->agent();
  w->port_ = std::make_unique<KvPort>(w->stack_->port_store());
  // memd's orders wait while readers are outstanding (KvStack::Order): carrying one out may wait for a copy that waits
  // for those readers (a keep copy into a page still read; found by the libFuzzer run), on the engine's thread that
  // alone can end them. An engine's request is told when memd's reclaim of it is carried out (kReclaimed).
  EmbeddedWorker* self = w.get();
  w->stack_->SetOrderHooks([self] { return self->port_->ReadersOutstanding(); },
                           [self](const wire::ReclaimOrderT& m) {
                             if (!self->requests_.contains(m.request)) return;
                             self->events_.push_back(Event(EmbeddedEvent::kReclaimed, m.request));
                             self->events_.back().pages = static_cast<uint32_t>(m.pages.size());
                           });
  return w;
}

// memd's messages for an owner that admits its own requests (InboxFor): the orders here, the answers to it.
class EmbeddedWorker::Inbox final : public MemdHandler {
 public:
  Inbox(EmbeddedWorker& worker, AdmissionAnswers& answers) : worker_(worker), answers_(answers) {}
  void OnAdmitGrant(const wire::AdmitGrantT& m) override { answers_.OnAdmitGrant(m); }
  void OnAdmitWait(const wire::AdmitWaitT& m) override { answers_.OnAdmitWait(m); }
  void OnAdmitReject(const wire::AdmitRejectT& m) override { answers_.OnAdmitReject(m); }
  void OnCompleteAck(const wire::CompleteAckT& m) override { answers_.OnCompleteAck(m); }
  void OnTokensCommitted() override { answers_.OnTokensCommitted(); }
  void OnTokensRefused(const absl::Status& why) override { answers_.OnTokensRefused(why); }
  void OnReclaimOrder(const wire::ReclaimOrderT& m) override { worker_.OnReclaimOrder(m); }
  void OnRetire(const wire::RetireT& m) override { worker_.OnRetire(m); }
  void OnPopulateOrder(const wire::PopulateOrderT& m) override { worker_.OnPopulateOrder(m); }

 private:
  EmbeddedWorker& worker_;
  AdmissionAnswers& answers_;
};

EmbeddedWorker::EmbeddedWorker(EmbeddedConfig config)
    : config_(std::move(config)), recorder_(config_.gpu), book_(config_.gpu, ResumedOutputLimits{}) {}

MemdHandler& EmbeddedWorker::InboxFor(AdmissionAnswers& answers) {
  inbox_ = std::make_unique<Inbox>(*this, answers);
  return *inbox_;
}

EmbeddedWorker::~EmbeddedWorker() {
  // An engine's worker (the library's own device) ends its readers and requests and serves the agent once more. Over
  // the caller's device (workerd's Worker) the caller ends its own requests: its KV side is only taken down here and
  // nothing is sent (a worker dropped mid-decode, as a killed one, reports none of its copies; review finding: a
  // dropped Worker reported its failed backups to memd).
  const bool close = owned_device_ != nullptr;
  if (close && port_ != nullptr) port_->EndAllReaders();  // closing: nobody reads the pool any more
  if (close && agent_ != nullptr) {
    std::vector<RequestId> open;
    for (const auto& [id, r] : requests_) open.push_back(id);
    for (RequestId id : open) (void)Complete(id);
    agent_->Poll();
  }
  if (owned_memd_ != nullptr) owned_memd_->SetLinger(std::chrono::milliseconds(1000));  // not a caller's transport
  agent_ = nullptr;
  kv_ = nullptr;
  stack_.reset();
  // The device before the memd link: a CUDA device unpins memd's host pool, which the link's mapping still holds.
  device_ = nullptr;
  owned_device_.reset();
  memd_ = nullptr;
  owned_memd_.reset();
}

absl::StatusOr<std::span<uint8_t>> EmbeddedWorker::Pool() const {
  if (region_base_ == nullptr) {
    return absl::FailedPreconditionError("this worker was opened over the caller's device: its KV pools are the "
                                         "device's own, with no single region to address");
  }
  return std::span<uint8_t>(region_base_, region_.bytes);
}

absl::StatusOr<RequestId> EmbeddedWorker::Submit(uint64_t input_rows, uint64_t max_rows, RequestId resume_of,
                                                  const SubmitPrefix& prefix) {
  if (input_rows == 0 || max_rows < input_rows || max_rows > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_request_desc: input_rows ", input_rows, " and max_rows ",
                                                   max_rows, ": need 1 <= input_rows <= max_rows <= 2^32"));
  }
  if (prefix.tokens.size() > input_rows) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_request_desc: ", prefix.tokens.size(),
                                                   " tokens for a prompt of ", input_rows, " rows"));
  }
  if (prefix.tenant.size() > 255) {
    return absl::InvalidArgumentError("dhs_request_desc: the tenant is longer than 255 bytes");
  }
  const wire::RequestRecordT* interrupted_record = nullptr;  // a resume's record at memd (its tokens carry over)
  if (resume_of != 0) {
    interrupted_record = InterruptedRecord(resume_of);
    if (interrupted_record != nullptr && interrupted_record->token_kind != wire::TokenKind::EngineIds) {
      interrupted_record = nullptr;  // workerd's byte record: nothing an engine's tokens continue
    }
    if (interrupted_record != nullptr && interrupted_record->token_ids.size() > max_rows - input_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dhs_request_desc: request ", resume_of, "'s record holds ", interrupted_record->token_ids.size(),
          " committed tokens; max_rows - input_rows = ", max_rows - input_rows, " cannot carry them"));
    }
    for (const auto& [id, r] : requests_) {
      if (r.resume_of == resume_of && Life(id)->phase != RequestPhase::kEnding) {
        return absl::FailedPreconditionError(absl::StrCat("request ", resume_of, " is resumed already by ", id));
      }
    }
    const std::vector<Resumable> listed = ListResumable();
    if (std::none_of(listed.begin(), listed.end(), [&](const Resumable& l) { return l.request == resume_of; })) {
      return absl::NotFoundError(absl::StrCat("request ", resume_of, " is not among the resumable requests memd "
                                              "kept for GPU ", config_.gpu, " (dhs_worker_list_resumable)"));
    }
  }
  const SessionPagesInput in = SessionPagesOf(config_, region_);  // the slot's speculation share included
  const uint64_t required = SessionRequiredPages(in, max_rows);  // the one formula (common/worker_shape.h)
  if (required > UINT32_MAX / 2) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_request_desc: max_rows ", max_rows, " needs ", required,
                                                   " required pages"));
  }
  // Opened in the book: its node id (gpu | epoch | n, never one in flight or ended unacknowledged). While memd is
  // away the admission is not sent (kUnsent): it goes after the re-Hello (Return).
  book_.set_epoch(memd_->worker_epoch());
  wire::SubmitRequestT submit;  // what the book keeps of it (its record is the engine's: below)
  submit.client = prefix.session;
  submit.tenant = prefix.tenant;
  const bool away = memd_->away();
  const RequestId id = book_.OpenDetached(submit, away)->id;
  // The shape, as workerd's AdmissionDesk declares it (workerd/admission_shape.h); a resume: memd hands the
  // interrupted request's kept host pages over.
  wire::AdmitRequestT admit = AdmitRequestOf(AdmissionShape{
      .request = id,
      .gpu = config_.gpu,
      .mode = config_.mode,
      .sources = config_.sources,
      .page_rows = config_.page_rows,
      .required_pages = static_cast<uint32_t>(required),
      .history_rows = max_rows,
      .prompt_rows = input_rows,
      // inside required_pages, rounded as memd checks (CheckShare)
      .draft_ring_pages = static_cast<uint32_t>(CeilDiv(in.slot_draft_ring_bytes, in.page_bytes)),
      .staging_pages = static_cast<uint32_t>(CeilDiv(in.slot_staging_bytes, in.page_bytes)),
      .draft_ring_bytes = in.slot_draft_ring_bytes,
      .staging_bytes = in.slot_staging_bytes,
      .resume_of = resume_of,
  });
  if (max_rows > input_rows) {  // memd keeps a record with its sizes (a record needs max_new_tokens > 0)
    admit.record = std::make_unique<wire::RequestRecordT>();
    admit.record->request = id;
    admit.record->client_request = id;
    admit.record->input_tokens = static_cast<uint32_t>(input_rows);
    admit.record->max_new_tokens = static_cast<uint32_t>(max_rows - input_rows);
    admit.record->client = prefix.session;  // the engine's session: a resume is found by it
    admit.record->tenant = prefix.tenant;   // a resumed request names its chain under its own tenant
    // ABI 1.5 (token records): the engine's vocabulary; the prompt tokens the submit gave (a resume that gives none
    // keeps its interrupted record's), and a resume's committed tokens (CommitTokens continues after them).
    admit.record->token_kind = wire::TokenKind::EngineIds;
    admit.record->prompt_ids.assign(prefix.tokens.begin(), prefix.tokens.end());  // the int32's bits
    if (interrupted_record != nullptr) {
      if (prefix.tokens.empty()) admit.record->prompt_ids = interrupted_record->prompt_ids;
      const size_t carried = interrupted_record->token_ids.size();  // <= max_rows - input_rows: checked above
      admit.record->token_ids = interrupted_record->token_ids;
      admit.record->logits_digests.assign(interrupted_record->logits_digests.begin(),
                                          interrupted_record->logits_digests.begin() +
                                              std::min(carried, interrupted_record->logits_digests.size()));
      admit.record->logits_digests.resize(carried, 0);
    }
  }
  // Issue 24: the tenant and prefix chain, as workerd's SetPrefixChain fills them (complete blocks of the tokens given;
  // ids from block_ids, derived after them; digests of the tokens). memd --prefix-sharing off ignores them.
  admit.tenant = prefix.tenant;
  uint64_t blocks = 0;
  // Resident mode names no chain (it has no host tier to import shared pages into).
  if (prefix.block_tokens > 0 && !prefix.tokens.empty() && config_.mode != WorkerMode::kResident) {
    RequestPrefixChain chain = PrefixChainOf(prefix.tokens, prefix.block_ids, prefix.block_tokens, prefix.tenant);
    blocks = chain.block_ids.size();
    admit.prefix_block_ids = std::move(chain.block_ids);
    admit.prefix_block_digests = std::move(chain.block_digests);
    admit.prefix_block_tokens = chain.block_tokens;
  }
  if (!away) {
    if (absl::Status s = memd_->SendAdmitRequest(admit); !s.ok()) {
      book_.Close(id, /*completed=*/false);
      return absl::UnavailableError(absl::StrCat("cannot reach memd: ", s.message()));
    }
  }
  ++counters_.submitted;
  counters_.prefix_lookups += resume_of == 0 ? blocks : 0;
  Request r;
  r.input_rows = input_rows;
  r.max_rows = max_rows;
  r.resume_of = resume_of;
  if (admit.record != nullptr) {  // a resume's carried tokens are in memd's record with its admission
    r.tokens = admit.record->token_ids;
    r.digests = admit.record->logits_digests;
    book_.Find(id)->tokens.committed = r.tokens.size();
  }
  r.resumed = r.tokens.size();
  r.submitted = std::chrono::steady_clock::now();
  recorder_.Submitted(id, id, prefix.session, r.submitted, r.resumed,
                      resume_of != 0 ? absl::StrCat("resume of ", resume_of) : "");
  r.admit = std::make_shared<const wire::AdmitRequestT>(std::move(admit));
  requests_.emplace(id, std::move(r));
  return id;
}

absl::Status EmbeddedWorker::Poll() {
  MemdLoad load;
  load.active_requests = book_.active();
  load.pending_copies = stack_->pending_orders();  // held orders included
  stack_->CarryOutHeld();  // memd's orders held while readers were outstanding
  absl::Status s = memd_->Poll(*this, load);
  agent_->Poll();
  FailDataLoss();
  if (!s.ok()) return s;
  if (!agent_->link_status().ok()) return agent_->link_status();
  if (!memd_->away()) {
    SendTokens();  // the tokens committed since the last TokensCommitted memd answered
    return absl::OkStatus();
  }
  EnterAway();  // once per death
  absl::StatusOr<std::optional<wire::HelloReplyT>> back = memd_->PollAway([this] { return ReHello(); });
  if (!back.ok()) return back.status();  // ABORTED: the epoch ended
  if (!back->has_value()) return absl::OkStatus();  // still away: served from here
  return Return(**back);
}

void EmbeddedWorker::EnterAway() {
  if (!memd_->session().TakeLoss(std::chrono::steady_clock::now())) return;  // taken already (this death)
  ++counters_.memd_aways;
  ledger_.Lost();  // never answered: the re-Hello's report carries every token
  stack_->EnterAway();      // the dead memd's held orders dropped; its orders resolved here, nothing answered; host
                            // writes paused (a new memd may not adopt a page written now)
  spdlog::warn("libdhs: memd is away: serving {} requests from the pool (no host writes, admissions wait) until a "
               "memd takes the re-Hello", requests_.size());
}

wire::HelloT EmbeddedWorker::ReHello() const {
  wire::HelloT hello = hello_;
  for (const auto& [id, r] : requests_) {
    if (WaitsForGrant(Life(id)->held_phase())) continue;  // its AdmitRequest goes again
    std::unique_ptr<wire::RequestRecordT> record;
    if (r.admit->record != nullptr) {  // with every token committed (those memd never got too)
      record = std::make_unique<wire::RequestRecordT>(*r.admit->record);
      record->token_ids = r.tokens;
      record->logits_digests = r.digests;
    }
    // What its AdmitRequest declared (workerd/admission_shape.h, as workerd's MemdAway reports).
    std::unique_ptr<wire::ReportedRequestT> rep = ReportOf(agent_->Report(id), *r.admit, std::move(record));
    if (rep == nullptr) continue;
    hello.report.push_back(std::move(rep));
  }
  return hello;
}

absl::Status EmbeddedWorker::Return(const wire::HelloReplyT& reply) {
  ++counters_.memd_returns;
  book_.set_epoch(memd_->worker_epoch());
  resumable_.clear();  // the new memd's list, as PlanReturn sorts it (ResumableFound)
  ended_resumes_.clear();  // the dead memd's answers never come: the new memd's list says what it holds
  // workerd's return, step by step (CarryOutReturn, workerd/memd_return.h; this class its ReturnHandler): the same
  // plan (PlanReturn over the same book), carried out in the same order. The resumable ones stay listed to the engine
  // (dhs_worker_list_resumable).
  absl::StatusOr<ReturnDone> done = CarryOutReturn(
      reply, book_,
      ReturnFacts{.ended_here = [this](RequestId id) { return agent_->Finished(id) || completes_sent_.contains(id); },
                  .resume_of = [this](RequestId id) { return requests_.at(id).resume_of; }},
      *this);
  if (!done.ok()) {  // stopped before its end: every request memd lists is offered (memd answers the rest)
    resumable_.assign(memd_->interrupted_requests().begin(), memd_->interrupted_requests().end());
    return done.status();
  }
  // memd's interrupted requests a live resume here takes over (PlanReturn lists them neither resumable nor ended)
  // are kept on the list too: ListResumable hides each while its resume lives, and offers it again if memd rejects
  // that resume before taking it over (review finding: it stayed hidden until the next return).
  const std::set<RequestId> listed(resumable_.begin(), resumable_.end());
  const std::set<RequestId> live = LiveResumes();
  for (RequestId id : memd_->interrupted_requests()) {
    if (live.contains(id) && !listed.contains(id)) resumable_.push_back(id);
  }
  spdlog::info("libdhs: memd is back: {} requests adopted, {} refused, {} ends deferred, {} admissions sent again",
               done->plan.adopted.size(), done->plan.refused.size(), done->ended, done->resent);
  return absl::OkStatus();
}

absl::Status EmbeddedWorker::EndRefused(RequestId id, const std::string& why, RefusedEnd how, bool /*listed*/) {
  // memd holds the request as interrupted (resumable), or not at all.
  agent_->Forget(id);
  ++counters_.reports_refused;
  if (how != RefusedEnd::kFenced) {
    // Completed by the engine while away (its end recorded then): it ends now; when memd holds it as interrupted, with
    // its Complete (review finding: it stayed resumable at memd, its pages kept).
    Forget(id, /*completed=*/false);
    if (how == RefusedEnd::kEndedComplete) return CompleteInterrupted(id);
    return absl::OkStatus();
  }
  // It ends here (the engine resumes it, or not): an end like any failure.
  EndFailed(requests_.find(id), absl::AbortedError(absl::StrCat(
      "memd restarted: ", why, " (dhs_worker_list_resumable may list it)")));
  return absl::OkStatus();
}

void EmbeddedWorker::ReturnToKv(const std::set<RequestId>& adopted) {
  stack_->ReturnFromAway(adopted);  // the agent adopts them, host writes resume
}

void EmbeddedWorker::Adopted(RequestId id) {
  // memd took its record with the report: every token is there.
  Request& r = requests_.at(id);
  TokenCounts& counts = book_.Find(id)->tokens;
  counters_.tokens_acked += r.tokens.size() - counts.committed;
  counts.committed = r.tokens.size();
  counts.refused = absl::OkStatus();  // the new memd took the whole record: its tokens go on (TokenLedger)
}

absl::Status EmbeddedWorker::EndDeferred(RequestId id, bool listed) {
  // Completed by the engine while away (kEnding).
  ++counters_.ends_deferred;
  if (!WaitsForGrant(Life(id)->held_phase())) {  // granted: copies end, KV released, Complete
    agent_->EndRequest(id);
    Forget(id, /*completed=*/true);
    return absl::OkStatus();
  }
  // Never granted: memd holds it as interrupted when the dead memd journaled its admission (its Complete then).
  Forget(id, /*completed=*/false);
  return listed ? CompleteInterrupted(id) : absl::OkStatus();
}

absl::Status EmbeddedWorker::CompleteInterrupted(RequestId id) {
  if (absl::Status s = SendComplete(id); !s.ok()) return s;
  not_resumable_.insert(id);
  return absl::OkStatus();
}

absl::Status EmbeddedWorker::Resend(RequestId id) {
  // Its admission goes again under the same id: a new life at memd. The Complete of its interrupted copy (step 6) no
  // longer says it ended here, nor is it hidden from the resumable list if memd later keeps it interrupted (review
  // finding: a later return ended it at memd, its pages freed, and it was never listed).
  not_resumable_.erase(id);
  completes_sent_.erase(id);
  if (absl::Status s = memd_->SendAdmitRequest(*requests_.at(id).admit); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach memd: ", s.message()));
  }
  ++counters_.admissions_resent;
  return absl::OkStatus();
}

absl::StatusOr<EmbeddedWorker::Request*> EmbeddedWorker::Granted(RequestId id) {
  const RequestLife* life = Life(id);
  if (life == nullptr || life->phase == RequestPhase::kEnding) {
    return absl::NotFoundError(absl::StrCat("request ", id, " is not open on this worker"));
  }
  if (life->phase != RequestPhase::kActive) {
    return absl::FailedPreconditionError(absl::StrCat("request ", id, " is not granted yet"));
  }
  return &requests_.at(id);
}

absl::Status EmbeddedWorker::SendComplete(RequestId id) {
  wire::CompleteT done;
  done.request = id;
  done.gpu = config_.gpu;
  const uint64_t seq = ++completes_seq_;
  completes_sent_[id] = seq;
  completes_order_.emplace_back(id, seq);
  if (completes_order_.size() > kCompletesRemembered) {  // the oldest goes, unless sent again since
    const auto [old, old_seq] = completes_order_.front();
    completes_order_.pop_front();
    if (auto it = completes_sent_.find(old); it != completes_sent_.end() && it->second == old_seq) {
      completes_sent_.erase(it);
    }
  }
  if (absl::Status s = memd_->SendComplete(done); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach memd: ", s.message()));
  }
  return absl::OkStatus();
}

void EmbeddedWorker::Forget(RequestId id, bool completed) {
  book_.Close(id, completed);
  requests_.erase(id);
}

void EmbeddedWorker::Fail(RequestId id, const absl::Status& error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  // A failed request ends now: the readers of its rows are ended first (its end would wait for them for ever), with
  // those of every request resolved on the same groups (the readers' unit is a group).
  const RequestLife& life = *Life(id);
  const bool holds_grant = Steps(life.held_phase());
  const std::vector<SourceId> read = port_->UnreadGroupsOf(id);
  if (holds_grant && !read.empty()) DHS_CHECK_OK(port_->ReadersDone(read));
  if (holds_grant) agent_->EndRequest(id);  // copies end, KV released, Complete
  if (life.phase == RequestPhase::kEnding) {  // completed by the engine: counted and told already
    Forget(id, /*completed=*/holds_grant);
    return;
  }
  EndFailed(it, error);
}

void EmbeddedWorker::EndFailed(std::map<RequestId, Request>::iterator it, const absl::Status& error) {
  const RequestId id = it->first;
  RecordEnd(id, it->second, error);
  Forget(id, /*completed=*/false);  // granted (its Complete is the agent's), or memd holds it no more
  ++counters_.failed;
  events_.push_back(Event(EmbeddedEvent::kFailed, id, error));
}

void EmbeddedWorker::FailDataLoss() {
  if (kv_ == nullptr) return;  // resident mode: no host page to lose
  for (auto& [id, status] : kv_->TakeDataLoss()) Fail(id, status);
}

absl::Status EmbeddedWorker::Append(RequestId request, Position first, uint32_t count, std::span<const uint8_t> rows,
                                    std::span<const uint8_t> keys) {
  absl::StatusOr<Request*> r = Granted(request);
  if (!r.ok()) return r.status();
  const uint64_t row = config_.row_bytes, per_position = row * config_.sources;
  const Position fewest = port_->Fewest(request), most = port_->Most(request);
  if (first != fewest || fewest != most) {
    return absl::OutOfRangeError(
        fewest == most
            ? absl::StrCat("request ", request, ": append at position ", first, ", but ", fewest,
                           " rows are appended (the next must be ", fewest, ")")
            : absl::StrCat("request ", request, ": append of every source at position ", first, ", but its sources "
                           "hold ", fewest, " to ", most, " rows (dhs_request_append_source); bring every source to "
                           "one length first"));
  }
  if (static_cast<uint64_t>(first) + count > (*r)->max_rows) {  // also bounds the products below (< 2^60)
    return absl::OutOfRangeError(absl::StrCat("request ", request, ": positions ", first, " .. ",
                                              first + int64_t{count} - 1, " beyond its max_rows ", (*r)->max_rows));
  }
  if (count == 0 || rows.size() != per_position * count) {
    return absl::InvalidArgumentError(absl::StrCat("rows: ", rows.size(), " bytes for ", count, " positions; need ",
                                                   per_position * count, " (positions x sources x row_bytes)"));
  }
  const uint64_t key_bytes = uint64_t{config_.indexers} * count * config_.index_key_bytes;
  if (!keys.empty() && keys.size() != key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("keys: ", keys.size(), " bytes; need 0 or ", key_bytes,
                                                   " (indexers x positions x index_key_bytes)"));
  }
  const auto tail_has_room = [&] {
    for (SourceId s = 0; s < config_.sources; ++s) {
      if (!port_->store().TailHasRoom(request, s, count)) return false;
    }
    return true;
  };
  if (port_->store().host_writes_paused() && !tail_has_room()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", request, ": memd is away and the tail has no room for ", count, " more rows without a host write "
        "(positions ", first, " .. ", first + int64_t{count} - 1, "); poll and retry once memd is back"));
  }
  // The whole call fits a held round's tail or nothing is appended (review finding: a partial append returned
  // before storing the keys of the rows it had appended).
  if (absl::Status s = port_->CheckHeldRoom(request, first, count); !s.ok()) return s;
  // One run per page and source (KvPort::AppendSource -> HierarchicalKvAccess::AppendRun: one copy batch per page),
  // each source's rows of the run gathered from the [position][source] layout. Every check that could refuse a row
  // inside a page ran above for the whole call (max_rows, memd away's tail room, a held round's room), and a tail slot
  // frees page by page, so a run is refused at its first row or not at all: whole positions before it stay appended,
  // every source at one length. A source refused after an earlier source took the run leaves the request's sources at
  // different lengths: the request fails (as before, when one row of a position was refused after another).
  const uint32_t p = config_.page_rows;
  std::vector<uint8_t> run;
  for (uint32_t done = 0; done < count;) {
    const uint32_t n = std::min<uint32_t>(count - done, p - static_cast<uint32_t>((first + done) % p));
    run.resize(uint64_t{n} * row);
    for (SourceId s = 0; s < config_.sources; ++s) {
      for (uint32_t i = 0; i < n; ++i) {
        std::memcpy(run.data() + uint64_t{i} * row, rows.data() + (done + i) * per_position + s * row, row);
      }
      if (absl::Status st = port_->AppendSource(request, s, first + done, n, run); !st.ok()) {
        const Position fewest = port_->Fewest(request);
        const bool split = port_->Most(request) != fewest;  // sources at different lengths: the request fails
        const uint32_t appended = static_cast<uint32_t>(fewest - first);
        counters_.rows_appended += appended;
        if (split) Fail(request, st);
        return Step(split || appended == 0
                        ? st
                        : absl::Status(st.code(), absl::StrCat(st.message(), " (positions ", first, " .. ",
                                                               first + appended - 1, " were appended)")));
      }
    }
    done += n;
  }
  counters_.rows_appended += count;
  if (!keys.empty()) {
    const uint64_t per_indexer = uint64_t{count} * config_.index_key_bytes;
    for (uint32_t x = 0; x < config_.indexers; ++x) {
      std::vector<float> k(per_indexer / 4);
      std::memcpy(k.data(), keys.data() + x * per_indexer, per_indexer);
      if (absl::Status st = port_->store().kv().StoreIndexKeys(request, x, first, k); !st.ok()) return Step(st);
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddedWorker::AppendSource(RequestId request, SourceId source, Position first, uint32_t count,
                                          std::span<const uint8_t> rows) {
  absl::StatusOr<Request*> r = Granted(request);
  if (!r.ok()) return r.status();
  const Position before = source < config_.sources ? port_->Rows(request, source) : 0;
  const absl::Status s = port_->AppendSource(request, source, first, count, rows, (*r)->max_rows);
  if (source < config_.sources) counters_.rows_appended += static_cast<uint64_t>(port_->Rows(request, source) - before);
  return Step(s);
}

absl::Status EmbeddedWorker::AppendKeys(RequestId request, uint32_t indexer, Position first, uint32_t count,
                                        std::span<const uint8_t> keys) {
  absl::StatusOr<Request*> r = Granted(request);
  if (!r.ok()) return r.status();
  if (config_.indexers == 0) {
    return absl::InvalidArgumentError("this worker was opened without indexers (dhs_worker_config.indexers = 0)");
  }
  return Step(port_->AppendKeys(request, indexer, first, count, keys));
}

absl::Status EmbeddedWorker::Resolve(std::span<const SourceId> sources, std::span<Query> queries) {
  std::vector<KvPort::Query> batch(queries.size());
  std::vector<const uint8_t*> out;
  size_t total = 0;
  for (const Query& q : queries) total += q.locations.size();
  out.assign(total, nullptr);
  size_t at = 0;
  for (size_t i = 0; i < queries.size(); ++i) {
    const Query& q = queries[i];
    if (absl::StatusOr<Request*> r = Granted(q.request); !r.ok()) return r.status();
    batch[i] = KvPort::Query{q.request, q.selection, std::span<const uint8_t*>(out.data() + at, q.locations.size()),
                             q.at};
    at += q.locations.size();
  }
  // The region: a staged row lies in its staging part (checked before the port registers the readers).
  absl::StatusOr<std::span<uint8_t>> pool = Pool();
  if (!pool.ok()) return pool.status();
  if (absl::Status s = port_->Resolve(sources, batch); !s.ok()) return Step(s);
  at = 0;
  for (Query& q : queries) {
    for (size_t j = 0; j < q.locations.size(); ++j, ++at) {
      const uint8_t* p = out[at];
      if (p == nullptr && q.selection[j % q.selection.size()] != kNoPosition) {
        // A device with neither host-visible memory nor a compute side would give no address for a real row: an
        // error, never padding the engine would take for "not selected".
        return absl::InternalError("the device gave no address for a selected row");
      }
      if (p == nullptr) {
        q.locations[j] = -1;
      } else if (p < pool->data() || p + config_.row_bytes > pool->data() + pool->size()) {
        return absl::InternalError("the resolver returned a row outside the KV pool");
      } else {
        q.locations[j] = static_cast<int64_t>(p - pool->data());
      }
    }
  }
  counters_.queries_resolved += queries.size();
  return absl::OkStatus();
}

absl::Status EmbeddedWorker::ImportRows(RequestId request, uint32_t first, uint32_t count,
                                        std::span<uint8_t> keys_out) {
  absl::StatusOr<Request*> r = Granted(request);
  if (!r.ok()) return r.status();
  if ((*r)->host_backed.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("request ", request, " was granted no host-backed page (no resume, no shared prefix page)"));
  }
  const uint64_t p = config_.page_rows;
  if ((uint64_t{first} + count) * p > (*r)->max_rows) {  // also bounds the key size below (< 2^60)
    return absl::OutOfRangeError(absl::StrCat("pages ", first, " .. ", uint64_t{first} + count - 1,
                                              " go beyond max_rows ", (*r)->max_rows));
  }
  if (count == 0) return absl::InvalidArgumentError(absl::StrCat("request ", request, ": an import of 0 pages"));
  const uint64_t key_bytes = uint64_t{config_.indexers} * count * p * config_.index_key_bytes;
  if (!keys_out.empty() && keys_out.size() != key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("import of ", count, " pages: keys_out holds ", keys_out.size(),
                                                   " bytes; need 0 or ", key_bytes,
                                                   " (indexers x positions x index_key_bytes)"));
  }
  std::vector<std::vector<float>> keys;
  if (absl::Status s = port_->ImportRows(request, first, count, keys); !s.ok()) return Step(s);
  if (!keys_out.empty()) {
    const uint64_t per_indexer = count * p * config_.index_key_bytes;
    for (uint32_t x = 0; x < config_.indexers && x < keys.size(); ++x) {
      if (keys[x].size() * sizeof(float) != per_indexer) {
        return absl::InternalError(absl::StrCat("indexer ", x, ": ", keys[x].size(), " keys imported"));
      }
      std::memcpy(keys_out.data() + x * per_indexer, keys[x].data(), per_indexer);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HostRun>> EmbeddedWorker::ImportPlan(RequestId request, uint64_t tokens) {
  absl::StatusOr<Request*> r = Granted(request);
  if (!r.ok()) return r.status();
  if (tokens == 0 || tokens > (*r)->max_rows) {
    return absl::InvalidArgumentError(absl::StrCat("request ", request, ": an import plan for ", tokens,
                                                   " rows; need 1 .. its max_rows ", (*r)->max_rows));
  }
  absl::StatusOr<ResumePlan> plan =
      PlanResume((*r)->host_backed, static_cast<Position>(tokens), config_.page_rows);  // workerd's plan
  if (!plan.ok()) return plan.status();
  return std::move(plan->runs);
}

absl::Status EmbeddedWorker::ReadersDone(std::span<const SourceId> sources) {
  return port_->ReadersDone(sources);
}

absl::Status EmbeddedWorker::Hold(RequestId request, Position from) {
  absl::StatusOr<Request*> r = Granted(request);
  if (!r.ok()) return r.status();
  return port_->Hold(request, from, (*r)->max_rows);
}

absl::Status EmbeddedWorker::Commit(RequestId request, Position length) {
  absl::StatusOr<Request*> r = Granted(request);
  if (!r.ok()) return r.status();
  return Step(port_->Commit(request, length));
}

absl::Status EmbeddedWorker::Complete(RequestId request) {
  const RequestLife* life = Life(request);
  if (life == nullptr || life->phase == RequestPhase::kEnding) {
    return absl::NotFoundError(absl::StrCat("request ", request, " is not open"));
  }
  const bool granted = life->phase == RequestPhase::kActive;
  if (granted) {
    // Its end waits for the copies memd would free pages under, and those wait for the readers of its rows: with a
    // resolve of its slot not followed by dhs_readers_done it would wait for ever (found by the libFuzzer run).
    if (const std::vector<SourceId> read = port_->UnreadGroupsOf(request); !read.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "request ", request, " was resolved on source ", read[0], " since its last dhs_readers_done; "
          "call dhs_readers_done for that source before completing it (its rows may still be read)"));
    }
  }
  // A resume memd queued took its interrupted request over at its admission: that one is gone with it. One that memd
  // has not answered yet: its answer says (SettleEndedResume); while memd is away, the return's list says.
  const auto settle_resume = [&] {
    if (const RequestId of = requests_.at(request).resume_of; of != 0) {
      if (life->phase == RequestPhase::kQueued) {
        not_resumable_.insert(of);
      } else {
        ended_resumes_[request] = of;
      }
    }
  };
  if (memd_->away() && life->phase != RequestPhase::kUnsent) {
    // Review finding (2026-12-04): a resume completed while memd was away listed its request again, memd having
    // dropped it; a second resume then got the new memd's "unknown".
    if (!granted) settle_resume();
    // memd away: no Complete can go. A granted request is reported in the re-Hello and ended after it; a waiting one's
    // admission went to the dead memd (a new memd that journaled it lists it interrupted: Complete then). Return.
    DHS_CHECK_OK(book_.DeferEnd(request, absl::OkStatus()));
    RecordEnd(request, requests_.at(request), absl::OkStatus());
    ++counters_.completed;
    return absl::OkStatus();
  }
  if (granted) {
    agent_->EndRequest(request);  // copies memd would free pages under end first; KV released; Complete
  } else if (life->phase != RequestPhase::kUnsent) {
    // Not granted yet: memd drops the queued admission (or releases a grant already on its way) at the Complete.
    if (absl::Status s = SendComplete(request); !s.ok()) return s;  // the request stays open: it may be retried
    settle_resume();
  }
  RecordEnd(request, requests_.at(request), absl::OkStatus());
  Forget(request, /*completed=*/life->phase != RequestPhase::kUnsent);  // a waiting one: StaleGrant until its ack
  ++counters_.completed;
  return absl::OkStatus();
}

absl::Status EmbeddedWorker::CommitTokens(RequestId request, std::span<const int32_t> tokens,
                                          std::span<const uint64_t> digests) {
  absl::StatusOr<Request*> granted = Granted(request);
  if (!granted.ok()) return granted.status();
  Request& r = **granted;
  if (r.admit->record == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("request ", request, " has no token record: its max_rows equals "
                                                      "its input_rows (it generates nothing)"));
  }
  if (!digests.empty() && digests.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(digests.size(), " logits digests for ", tokens.size(), " tokens"));
  }
  const TokenCounts& counts = Life(request)->tokens;
  if (!counts.refused.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("request ", request, ": memd refused its token record (",
                                                      counts.refused.message(), "); it holds the first ",
                                                      counts.committed, " tokens"));
  }
  const uint64_t max_new = r.max_rows - r.input_rows;
  if (r.tokens.size() + tokens.size() > max_new) {
    return absl::OutOfRangeError(absl::StrCat("request ", request, ": ", r.tokens.size(), " tokens committed and ",
                                              tokens.size(), " more would pass max_rows - input_rows = ", max_new));
  }
  // memd's bound on one record (RecordBytes, the formula of memd's RequestRecord::bytes; memd fills the chain from
  // the AdmitRequest's prefix chain): a commit it would refuse is refused here, while the engine still holds the
  // tokens.
  const wire::RequestRecordT& record = *r.admit->record;
  const uint64_t bytes = RecordBytes({.prompt_bytes = record.prompt.size(),
                                      .prompt_ids = record.prompt_ids.size(),
                                      .hash_ids = record.hash_ids.size(),
                                      .tenant_bytes = record.tenant.size(),
                                      .chain_entries = r.admit->prefix_block_ids.size() +
                                                       r.admit->prefix_block_digests.size(),
                                      .tokens = r.tokens.size() + tokens.size(),
                                      .engine_ids = true});
  if (bytes > kMaxRecordBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "request ", request, ": ", tokens.size(), " more tokens would make its record ", bytes,
        " bytes, over memd's bound of ", kMaxRecordBytes, " (", r.tokens.size(), " tokens committed)"));
  }
  // The recorder: the first token after those it started with is its first (TTFT from its Submit); each later one a
  // TPOT from the one before (the tokens of one call come at once: a speculative round's accepted prefix).
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool first = r.tokens.size() + i == r.resumed;
    recorder_.Token(request, first, first ? r.submitted : r.last_token, now);
    r.last_token = now;
  }
  r.tokens.insert(r.tokens.end(), tokens.begin(), tokens.end());
  if (digests.empty()) {
    r.digests.resize(r.tokens.size(), 0);
  } else {
    r.digests.insert(r.digests.end(), digests.begin(), digests.end());
  }
  counters_.tokens_committed += tokens.size();
  SendTokens();
  return absl::OkStatus();
}

void EmbeddedWorker::SendTokens() {
  if (memd_->away()) return;  // the re-Hello's report carries them
  // workerd's TokenLedger decides (one in flight; after a refused message of several, one request per message).
  std::vector<TokenLedger::Entry> entries =
      ledger_.Next(book_, [&](RequestId id) { return requests_.at(id).tokens.size(); });
  if (entries.empty()) return;
  wire::TokensCommittedT m;
  m.gpu = config_.gpu;
  for (const TokenLedger::Entry& e : entries) {
    const Request& r = requests_.at(e.request);
    auto c = std::make_unique<wire::CommittedTokensT>();
    c->request = e.request;
    c->from = static_cast<uint32_t>(e.from);  // memd takes an equal resend of what it has
    c->token_ids.assign(r.tokens.begin() + static_cast<ptrdiff_t>(e.from),
                        r.tokens.begin() + static_cast<ptrdiff_t>(e.to));
    c->logits_digests.assign(r.digests.begin() + static_cast<ptrdiff_t>(e.from),
                             r.digests.begin() + static_cast<ptrdiff_t>(e.to));
    m.entries.push_back(std::move(c));
  }
  if (!memd_->SendTokensCommitted(m).ok()) {  // memd's queue (or the epoch ended: Poll says so): sent later
    ++counters_.commits_deferred;
    return;
  }
  ledger_.Sent(std::move(entries));
}

void EmbeddedWorker::OnTokensCommitted() { counters_.tokens_acked += ledger_.Acked(book_); }

void EmbeddedWorker::OnTokensRefused(const absl::Status& why) {
  ++counters_.commits_refused;
  if (std::optional<RequestId> alone = ledger_.Refused(book_, why); alone && Life(*alone) != nullptr) {
    ++counters_.records_refused;
    spdlog::warn("libdhs: memd refused the tokens of request {}: {}; its record keeps {} tokens", *alone,
                 why.ToString(), Life(*alone)->tokens.committed);
  }
}

absl::StatusOr<EmbeddedWorker::RecordTokens> EmbeddedWorker::ResumableTokens(RequestId interrupted) const {
  const std::vector<Resumable> listed = ListResumable();
  const bool known = std::any_of(listed.begin(), listed.end(), [&](const Resumable& r) {
    return r.request == interrupted;
  });
  if (const wire::RequestRecordT* rec = known ? InterruptedRecord(interrupted) : nullptr; rec != nullptr) {
    if (rec->token_kind != wire::TokenKind::EngineIds) {
      return absl::FailedPreconditionError(absl::StrCat("request ", interrupted, "'s record holds the built-in "
                                                        "model's byte tokens (workerd's), not an engine's"));
    }
    return RecordTokens{rec->prompt_ids, rec->token_ids};
  }
  return absl::NotFoundError(absl::StrCat("request ", interrupted, " is not a resumable request with a record (",
                                          "dhs_worker_list_resumable)"));
}

std::set<RequestId> EmbeddedWorker::LiveResumes() const {
  std::set<RequestId> live;
  for (const auto& [id, r] : requests_) {
    if (r.resume_of != 0 && Life(id)->phase != RequestPhase::kEnding) live.insert(r.resume_of);
  }
  return live;
}

std::vector<EmbeddedWorker::Resumable> EmbeddedWorker::ListResumable() const {
  std::vector<Resumable> out;
  // Hidden: a resume of it waits here (its admission takes it over), or ended before memd answered (that answer says
  // whether memd took it over).
  std::set<RequestId> hidden = LiveResumes();
  for (const auto& [resume, of] : ended_resumes_) hidden.insert(of);
  for (RequestId id : resumable_) {
    if (not_resumable_.contains(id)) continue;  // resumed here since (its grant), or ended
    if (hidden.contains(id)) continue;
    Resumable r{id, 0, 0};
    if (const wire::RequestRecordT* rec = InterruptedRecord(id); rec != nullptr) {
      r.input_rows = rec->input_tokens;
      r.max_rows = uint64_t{rec->input_tokens} + rec->max_new_tokens;
    }
    out.push_back(r);
  }
  return out;
}

std::vector<EmbeddedWorker::TakenResumable> EmbeddedWorker::TakeResumable() {
  std::vector<TakenResumable> out;
  for (const Resumable& r : ListResumable()) {
    out.push_back({r.request, InterruptedRecord(r.request)});
    not_resumable_.insert(r.request);  // the owner resumes or ends it
  }
  return out;
}

void EmbeddedWorker::RecordEnd(RequestId id, const Request& r, const absl::Status& error) {
  recorder_.Ended(id, r.tokens.size(), error, std::chrono::steady_clock::now());
}

const wire::RequestRecordT* EmbeddedWorker::InterruptedRecord(RequestId id) const {
  for (const auto& rec : memd_->interrupted_records()) {
    if (rec != nullptr && rec->request == id) return rec.get();
  }
  return nullptr;
}

absl::Status EmbeddedWorker::CheckInvariants() const {
  if (absl::Status s = book_.CheckInvariants(); !s.ok()) return s;
  if (absl::Status s = ledger_.CheckInvariants(); !s.ok()) return s;
  if (requests_.size() != book_.requests().size()) {
    return absl::InternalError(absl::StrCat(requests_.size(), " requests here, ", book_.requests().size(),
                                            " in the book"));
  }
  for (const auto& [id, life] : book_.requests()) {
    if (!requests_.contains(id)) return absl::InternalError(absl::StrCat("request ", id, " is in the book only"));
    if (life.phase == RequestPhase::kGranted || life.phase == RequestPhase::kPaused) {
      return absl::InternalError(absl::StrCat("request ", id, " is ", std::string(RequestPhaseName(life.phase)),
                                              " (an engine's request is active from its grant)"));
    }
    if (life.client) return absl::InternalError(absl::StrCat("request ", id, " has a client of the book's"));
    if (GpuOfNodeRequestId(id) != config_.gpu) {
      return absl::InternalError(absl::StrCat("request ", id, " is not in GPU ", config_.gpu, "'s range of ids"));
    }
  }
  return absl::OkStatus();
}

std::string EmbeddedWorker::StatsJson() const {
  const Census c = kv_ != nullptr ? kv_->TotalCensus() : Census{};  // resident: every row direct, none counted
  const StagingCensus staged = kv_ != nullptr ? kv_->staging_census() : StagingCensus{};
  const ResidencyStats& a = agent_->stats();
  uint64_t granted = 0, waiting = 0;  // open for the engine: an ending one (completed while memd is away) is not
  for (const auto& [id, life] : book_.requests()) {
    granted += life.phase == RequestPhase::kActive ? 1 : 0;
    waiting += WaitsForGrant(life.phase) ? 1 : 0;
  }
  nlohmann::json j = {
      {"gpu", config_.gpu},
      {"mode", std::string(WorkerModeName(config_.mode))},
      {"device", {{"backend", backend_},
                  {"resolver", kv_ == nullptr ? "resident" : kv_->resolves_on_device() ? "kernel" : "host"}}},
      {"requests", {{"open_granted", granted}, {"open_waiting", waiting}, {"submitted", counters_.submitted},
                    {"granted", counters_.granted}, {"completed", counters_.completed},
                    {"failed", counters_.failed}, {"rejected", counters_.rejected}}},
      {"census", {{"direct", c.direct}, {"hot", c.hot}, {"host", c.host}, {"scans_skipped", c.scans_skipped},
                  {"bytes_recovered", c.bytes_recovered}}},
      {"pages", {{"capacity", capacity_pages()}, {"kept", a.pages_kept}, {"backed_up", a.pages_backed_up},
                 {"populated", a.pages_populated}, {"reclaimed", a.pages_reclaimed},
                 {"reclaim_orders", counters_.reclaim_orders}, {"reclaims_obeyed", a.reclaims_obeyed},
                 {"orders_held", stack_->held_orders()}}},
      {"prefix", {{"lookups", counters_.prefix_lookups}, {"shared_pages_granted", counters_.shared_pages_granted}}},
      {"host_backed", {{"verified", port_->counters().pages_verified},
                       {"mismatched", port_->counters().pages_mismatched},
                       {"imported", port_->counters().pages_imported}}},
      {"memd", {{"away", memd_->away()}, {"aways", counters_.memd_aways}, {"returns", counters_.memd_returns},
                {"reports_refused", counters_.reports_refused}, {"admissions_resent", counters_.admissions_resent},
                {"ends_deferred", counters_.ends_deferred}}},
      {"staging", {{"arenas", config_.staging_arenas}, {"bytes", region_.staging_bytes},
                   {"unions", staged.unions}, {"staged_fetches", staged.staged_fetches}, {"rows", staged.rows}}},
      {"tokens", {{"committed", counters_.tokens_committed}, {"acknowledged", counters_.tokens_acked},
                  {"deferred", counters_.commits_deferred}, {"in_flight", ledger_.in_flight()},
                  {"refused", counters_.commits_refused}, {"records_refused", counters_.records_refused}}},
      {"rows_appended", counters_.rows_appended},
      {"queries_resolved", counters_.queries_resolved},
  };
  // workerd's recorder (WorkerStatsReply's histograms): per-bucket counts (not cumulative), the last one above every
  // bound; failures by reason (the status code's name in lower case).
  const WorkerStats& rec = recorder_.stats();
  const auto histogram = [](const LatencyHistogram& h) {
    return nlohmann::json{{"count", h.count}, {"sum", h.sum_us}, {"bounds", h.bounds_us}, {"counts", h.counts}};
  };
  j["latency_us"] = {{"admission_wait", histogram(rec.admission_wait)}, {"ttft", histogram(rec.ttft)},
                     {"tpot", histogram(rec.tpot)}};
  j["requests"]["ended"] = rec.finished_requests;
  j["requests"]["failures"] = rec.failures;
  return j.dump();
}

// ---- memd's messages ----

void EmbeddedWorker::OnAdmitGrant(const wire::AdmitGrantT& m) {
  // workerd's rule (RequestBook::AnswerTo): a grant that crossed the request's Complete is released by that Complete;
  // one of an unknown request is handed back; a second grant breaks the contract and is ignored.
  switch (book_.AnswerTo(m.request)) {
    case AdmissionAnswer::kApplies: break;
    case AdmissionAnswer::kCrossedComplete: SettleEndedResume(m.request, /*took_effect=*/true); return;
    case AdmissionAnswer::kUnknown: agent_->RefuseGrant(m); return;
    case AdmissionAnswer::kNotWaiting: return;
  }
  auto it = requests_.find(m.request);
  Request& r = it->second;
  const RequestPhase phase = Life(m.request)->phase;
  // memd handed the interrupted request over to its resume: no longer resumable, whether the grant is taken here or
  // fails below (review findings: the list kept a request resumed and completed here; a failed grant listed it again).
  if (r.resume_of != 0) not_resumable_.insert(r.resume_of);
  if (absl::Status s = agent_->OnGrant(m, r.max_rows / config_.page_rows); !s.ok()) {
    agent_->EndRequest(m.request);
    EndFailed(it, s);
    return;
  }
  EmbeddedEvent granted = Event(EmbeddedEvent::kGranted, m.request);
  granted.slot = m.slot;
  r.slot = m.slot;
  // Resident mode imports nothing (no host tier): a resume recomputes every row.
  if ((r.resume_of != 0 || !m.shared_pages.empty()) && kv_ != nullptr) {
    // A resume (docs/architecture.md "Resume from host KV"), or shared prefix pages (issue 24: they come inside
    // host_backed_pages): the host-backed pages memd handed over, each checked against its checksum (issue 22) and
    // made host-ready, as workerd's ResumeImporter takes them (KvPort::TakeGrantedHostPages); a page that does not
    // match is appended again by the engine (its confirmed copy is never written again).
    absl::StatusOr<KvPort::GrantedHostPages> backed = port_->TakeGrantedHostPages(
        m.request, GrantHostBacked(m.host_backed_pages, m.host_backed_checksums, m.imported_pages));
    if (!backed.ok()) {
      agent_->EndRequest(m.request);
      EndFailed(it, backed.status());
      return;
    }
    r.host_backed = std::move(backed->pages);
    const std::vector<HostBackedPage>& pages = r.host_backed;  // ascending
    granted.pages = static_cast<uint32_t>(pages.size());
    while (granted.import_pages < pages.size() && pages[granted.import_pages].page == granted.import_pages) {
      ++granted.import_pages;  // the leading run 0 .. n-1
    }
    granted.shared_pages = static_cast<uint32_t>(SharedPagesKept(m.shared_pages, pages).size());
    counters_.shared_pages_granted += granted.shared_pages;
  }
  DHS_CHECK_OK(book_.Transition(m.request, phase, RequestPhase::kGranted));
  DHS_CHECK_OK(book_.Transition(m.request, RequestPhase::kGranted, RequestPhase::kActive));  // the engine steps it
  recorder_.Granted(r.submitted, std::chrono::steady_clock::now());
  ++counters_.granted;
  events_.push_back(std::move(granted));
}

void EmbeddedWorker::OnAdmitWait(const wire::AdmitWaitT& m) {
  const RequestLife* life = Life(m.request);
  if (life == nullptr) {  // completed before memd's answer
    SettleEndedResume(m.request, /*took_effect=*/true);
    return;
  }
  if (life->phase == RequestPhase::kWaiting) {
    DHS_CHECK_OK(book_.Transition(m.request, RequestPhase::kWaiting, RequestPhase::kQueued));
  }
  events_.push_back(Event(EmbeddedEvent::kWaiting, m.request));
  events_.back().value = m.queue_position;
  events_.back().pages = m.deficit_pages;
}

void EmbeddedWorker::OnAdmitReject(const wire::AdmitRejectT& m) {
  // A reject of a request not waiting for its grant (after a grant) breaks the contract: ignored (AnswerTo). One that
  // crossed the engine's Complete still says whether a resume took its interrupted request over.
  if (const AdmissionAnswer answer = book_.AnswerTo(m.request); answer != AdmissionAnswer::kApplies) {
    if (answer == AdmissionAnswer::kCrossedComplete) SettleEndedResume(m.request, m.took_over != 0);
    return;
  }
  if (const RequestId of = requests_.at(m.request).resume_of; of != 0 && m.took_over == of) {
    not_resumable_.insert(of);  // memd ended it with the resume (review finding, 2026-12-04)
  }
  const absl::Status error = AdmitRejectError(m);
  RecordEnd(m.request, requests_.at(m.request), error);
  Forget(m.request, /*completed=*/false);
  ++counters_.rejected;
  events_.push_back(Event(EmbeddedEvent::kRejected, m.request, error));
}

void EmbeddedWorker::SettleEndedResume(RequestId id, bool took_effect) {
  auto it = ended_resumes_.find(id);
  if (it == ended_resumes_.end()) return;
  if (took_effect) not_resumable_.insert(it->second);
  ended_resumes_.erase(it);
}

void EmbeddedWorker::OnReclaimOrder(const wire::ReclaimOrderT& m) {
  ++counters_.reclaim_orders;
  stack_->Order(m);
}

void EmbeddedWorker::OnRetire(const wire::RetireT& m) { stack_->Order(m); }
void EmbeddedWorker::OnPopulateOrder(const wire::PopulateOrderT& m) { stack_->Order(m); }

}  // namespace dhs::lib
