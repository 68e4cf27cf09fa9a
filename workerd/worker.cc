// workerd/worker.cc: see worker.h.
#include "workerd/worker.h"

#include <algorithm>
#include <utility>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "workerd/model/resident_kv_access.h"

namespace dhs {
namespace {

wire::CompleteT MakeComplete(RequestId request, GpuId gpu) {
  wire::CompleteT c;
  c.request = request;
  c.gpu = gpu;
  return c;
}

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

uint64_t MicrosSince(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
}

}  // namespace

std::string_view WorkerModeName(WorkerMode mode) {
  switch (mode) {
    case WorkerMode::kResident: return "resident";
    case WorkerMode::kHisparse: return "hisparse";
    case WorkerMode::kAdaptive: return "adaptive";
  }
  return "unknown";
}

absl::StatusOr<WorkerMode> ParseWorkerMode(std::string_view name) {
  if (name == "resident") return WorkerMode::kResident;
  if (name == "hisparse") return WorkerMode::kHisparse;
  if (name == "adaptive") return WorkerMode::kAdaptive;
  return absl::InvalidArgumentError(absl::StrCat("unknown mode '", std::string(name), "' (resident, hisparse, adaptive)"));
}

absl::StatusOr<WorkerGeometry> ComputeGeometry(const model::ModelConfig& model, const WorkerConfig& config) {
  WorkerGeometry g;
  const uint32_t p = config.page_rows;
  if (p == 0) return absl::InvalidArgumentError("worker: page rows p must be > 0");
  const uint32_t k = static_cast<uint32_t>(model.top_k);
  const uint32_t span = k + static_cast<uint32_t>(model.local_window);
  g.hot_rows = config.hot_rows != 0 ? config.hot_rows : std::max<uint32_t>(64, 4 * span);
  g.tail_rows = config.tail_rows != 0 ? config.tail_rows : 2 * p;
  if (g.tail_rows % p != 0) {
    return absl::InvalidArgumentError(absl::StrCat("worker: tail rows ", g.tail_rows, " not a multiple of p = ", p));
  }
  if (config.mode != WorkerMode::kResident && g.hot_rows < span) {
    return absl::InvalidArgumentError(absl::StrCat("worker: hot rows B = ", g.hot_rows, " < k + window = ", span));
  }
  if (config.slots == 0) return absl::InvalidArgumentError("worker: request slots N must be > 0");
  const int n_sources = model.n_sources();
  g.page_bytes = uint64_t{p} * model.row_bytes() * static_cast<uint64_t>(n_sources);
  const uint64_t m = config.hbm_budget_bytes / g.page_bytes;
  if (m == 0 || m > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("worker: HBM budget of ", config.hbm_budget_bytes,
                                                   " bytes gives ", m, " pages of ", g.page_bytes, " bytes"));
  }
  g.capacity_pages = static_cast<uint32_t>(m);
  if (config.prefill_chunk != 0) {
    g.prefill_chunk = config.prefill_chunk;
  } else {
    // The same in every mode (resident included) so that the modes differ in memory only, not in how prefill
    // interleaves with decode: B / (k + window), the most one step's selections of one request can keep hot.
    g.prefill_chunk = std::max<uint32_t>(1, g.hot_rows / span);
  }
  if (config.mode != WorkerMode::kResident && g.prefill_chunk * span > g.hot_rows) {
    return absl::InvalidArgumentError(absl::StrCat("worker: prefill chunk ", g.prefill_chunk, " x (k + window) ",
                                                   span, " exceeds hot rows ", g.hot_rows));
  }
  g.kv.row_bytes.assign(n_sources, model.row_bytes());
  // Groups: one per source, except an index producer's followers, which join its group (brief §5).
  std::vector<int> group_of(n_sources, -1);
  int producer_group = -1;
  for (const model::LayerSpec& l : model.layers) {
    if (l.kind == model::LayerKind::kProducer) {
      producer_group = static_cast<int>(g.kv.groups.size());
      g.kv.groups.push_back({l.source});
      group_of[l.source] = producer_group;
    } else if (l.kind == model::LayerKind::kFollower) {
      if (group_of[l.source] < 0) {
        g.kv.groups[producer_group].push_back(l.source);
        group_of[l.source] = producer_group;
      }
    } else if (group_of[l.source] < 0) {
      group_of[l.source] = static_cast<int>(g.kv.groups.size());
      g.kv.groups.push_back({l.source});
    }
  }
  g.kv.page_rows = p;
  g.kv.hot_rows = g.hot_rows;
  g.kv.k = k;
  g.kv.tail_rows = g.tail_rows;
  g.kv.slots = config.slots;
  g.kv.optional_pages = g.capacity_pages;
  return g;
}

wire::HelloT MakeHello(const model::ModelConfig& model, const WorkerConfig& config, const WorkerGeometry& geometry,
                       std::string_view device_name) {
  wire::HelloT h;
  h.protocol_version = kProtocolVersion;
  h.gpu = config.gpu;
  h.pid = static_cast<uint32_t>(::getpid());
  h.device_name = std::string(device_name);
  h.capacity_pages = geometry.capacity_pages;
  h.page_rows = config.page_rows;
  h.page_bytes = geometry.page_bytes;
  h.request_slots = config.slots;
  std::vector<uint32_t> consumers(model.n_sources(), 0);
  for (const model::LayerSpec& l : model.layers) ++consumers[l.source];
  for (int s = 0; s < model.n_sources(); ++s) {
    auto info = std::make_unique<wire::SourceInfoT>();
    info->source = static_cast<uint32_t>(s);
    info->bytes_per_row = static_cast<uint32_t>(model.row_bytes());
    info->positions_per_row = 1;
    info->consumers = consumers[s];
    h.sources.push_back(std::move(info));
  }
  h.has_drafter = false;
  h.draft_ring_rows = 0;
  return h;
}

Worker::Worker(const model::Model* model, Device* device, WorkerConfig config, WorkerGeometry geometry,
               MemdLink* memd, ClientSink* client)
    : model_(model), device_(device), config_(std::move(config)), geometry_(std::move(geometry)), memd_(memd),
      client_(client), prefix_cache_(config_.prefix_cache_bytes) {}

Worker::~Worker() = default;

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const model::Model* model, Device* device,
                                                       const WorkerConfig& config, std::span<uint8_t> host_pool,
                                                       MemdLink* memd, ClientSink* client) {
  if (model == nullptr || device == nullptr || memd == nullptr || client == nullptr) {
    return absl::InvalidArgumentError("worker: model, device, memd link and client sink are required");
  }
  absl::StatusOr<WorkerGeometry> g = ComputeGeometry(model->config(), config);
  if (!g.ok()) return g.status();
  std::unique_ptr<Worker> w(new Worker(model, device, config, *std::move(g), memd, client));
  if (config.mode == WorkerMode::kResident) {
    w->kv_ = model::ResidentKvAccess::ForModel(model->config(), config.hbm_budget_bytes, config.page_rows);
  } else {
    HostPoolAccess host{host_pool, nullptr, nullptr};  // host pages come from memd's grants only
    absl::StatusOr<std::unique_ptr<HierarchicalKvAccess>> kv =
        HierarchicalKvAccess::Create(w->geometry_.kv, device, host, ResolverKind::kFused);
    if (!kv.ok()) return kv.status();
    w->hier_ = kv->get();
    w->kv_ = *std::move(kv);
  }
  return w;
}

uint32_t Worker::active_requests() const {
  uint32_t n = 0;
  for (const auto& [id, r] : requests_) n += r->phase == Phase::kActive;
  return n;
}

uint32_t Worker::waiting_requests() const {
  uint32_t n = 0;
  for (const auto& [id, r] : requests_) n += r->phase != Phase::kActive;
  return n;
}

absl::Status Worker::Submit(const wire::SubmitRequestT& submit, const ClientRef& client) {
  if (absl::Status s = ValidateSubmit(submit, config_.max_context_tokens); !s.ok()) return s;
  if (requests_.contains(submit.request)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", submit.request, " is already being served"));
  }
  auto r = std::make_unique<Request>();
  r->id = submit.request;
  r->client = client;
  r->input = SubmitInputTokens(submit);
  r->prefix_tokens = static_cast<Position>(SubmitPrefixTokens(submit));
  r->hash_ids = submit.hash_ids;
  r->prefix_block_tokens = submit.prefix_block_tokens;
  r->max_new = submit.max_new_tokens;
  r->greedy = submit.temperature == 0.0f;
  r->sampling = model::SamplingParams{submit.temperature, submit.top_p};
  r->rng.seed(submit.seed);
  r->submitted = std::chrono::steady_clock::now();

  const uint64_t p = config_.page_rows;
  const uint64_t ctx = r->input.size() + r->max_new;
  const model::ModelConfig& mc = model_->config();
  wire::AdmitRequestT admit;
  admit.request = r->id;
  admit.gpu = config_.gpu;
  const uint64_t meta = CeilDiv(ctx * static_cast<uint64_t>(mc.n_indexers()) * mc.index_key_bytes(),
                                geometry_.page_bytes);
  uint64_t required = CeilDiv(geometry_.hot_rows + geometry_.tail_rows, p) + meta;
  if (config_.mode == WorkerMode::kResident) required += CeilDiv(ctx, p);
  admit.required_pages = static_cast<uint32_t>(required);
  admit.history_rows = ctx;
  admit.complete_pages = config_.mode == WorkerMode::kAdaptive ? static_cast<uint32_t>(r->input.size() / p) : 0;
  // Only adaptive mode holds optional history; hisparse keeps all history on host (memd never populates it).
  admit.optional_history = config_.mode == WorkerMode::kAdaptive;
  for (int s = 0; s < mc.n_sources(); ++s) {
    auto info = std::make_unique<wire::RequestSourceInfoT>();
    info->source = static_cast<uint32_t>(s);
    info->history_rows = ctx;
    info->complete_pages = admit.complete_pages;
    admit.sources.push_back(std::move(info));
  }
  admit.host_backed = false;
  if (absl::Status s = memd_->SendAdmitRequest(admit); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("worker cannot reach memd: ", s.message()));
  }
  wire::SubmitAcceptedT accepted;
  accepted.request = r->id;
  accepted.queue_position = waiting_requests();
  requests_.emplace(r->id, std::move(r));
  client_->Accepted(client, accepted);
  return absl::OkStatus();
}

// ---- memd's messages ----

void Worker::OnAdmitGrant(const wire::AdmitGrantT& m) {
  auto it = requests_.find(m.request);
  if (it == requests_.end() || it->second->phase != Phase::kWaitGrant) {
    spdlog::warn("worker: AdmitGrant for request {} that is not waiting; releasing it", m.request);
    if (it == requests_.end()) (void)memd_->SendComplete(MakeComplete(m.request, config_.gpu));
    return;
  }
  Request& r = *it->second;
  r.granted = std::chrono::steady_clock::now();
  const uint64_t rows = r.input.size() + r.max_new - 1;  // rows ever appended
  const uint64_t complete = rows / config_.page_rows;
  if (hier_ != nullptr && m.backup_host_pages.size() < complete) {
    Finish(r.id, absl::InternalError(absl::StrCat("memd granted ", m.backup_host_pages.size(), " host pages for ",
                                                  complete, " complete pages of request ", r.id)));
    return;
  }
  for (const auto& ref : m.backup_host_pages) {
    if (ref.segment() != 0) {
      Finish(r.id, absl::UnimplementedError(absl::StrCat("host page in segment ", ref.segment(),
                                                         ": this worker maps segment 0 only")));
      return;
    }
    r.host_pages.push_back(ref.page());
  }
  if (m.optional_pages.size() != m.optional_history_pages.size()) {
    Finish(r.id, absl::InternalError("AdmitGrant: optional_pages and optional_history_pages differ in length"));
    return;
  }
  for (size_t i = 0; i < m.optional_pages.size(); ++i) r.optional[m.optional_history_pages[i]] = m.optional_pages[i];
  r.phase = Phase::kGranted;
  granted_.push_back(r.id);
}

void Worker::OnAdmitWait(const wire::AdmitWaitT& m) {
  spdlog::debug("worker: request {} waits for admission (queue position {}, deficit {} pages)", m.request,
                m.queue_position, m.deficit_pages);
}

void Worker::OnAdmitReject(const wire::AdmitRejectT& m) {
  auto it = requests_.find(m.request);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  absl::Status error = FromWireError(m.code, absl::StrCat("admission refused by memd: ", m.reason));
  if (error.ok()) error = absl::UnknownError(absl::StrCat("admission refused by memd: ", m.reason));
  SendChunk(r, {}, {}, true, error);
  ++stats_.failed_requests;
  ++stats_.finished_requests;
  std::erase(granted_, r.id);
  requests_.erase(it);  // never admitted: nothing to release
}

void Worker::OnCompleteAck(const wire::CompleteAckT& m) {
  spdlog::debug("worker: request {} released {} pages", m.request, m.released_pages);
}

void Worker::SendBackupComplete(const wire::ReclaimOrderT& m, const absl::Status& status,
                                std::vector<PageIndex> deferred) {
  wire::BackupCompleteT done;
  done.order = m.order; done.request = m.request; done.gpu = config_.gpu; done.pages = m.backup_pages;
  done.host_pages = m.backup_targets; done.ok = status.ok();
  if (status.ok()) done.deferred_pages = std::move(deferred);
  if (!status.ok()) { done.error = ToWireError(status); done.message = std::string(status.message()); }
  (void)memd_->SendBackupComplete(done);
}

bool Worker::ReclaimInFlight(RequestId request, PageIndex device_page) const {
  for (const auto& [order, rc] : reclaims_) {
    if (rc.order.request != request || rc.readers_done) continue;
    if (std::find(rc.order.pages.begin(), rc.order.pages.end(), device_page) != rc.order.pages.end()) return true;
  }
  return false;
}

bool Worker::BackupInFlight(const Reclaim& rc) const {
  const RequestKv* kv = hier_ != nullptr ? hier_->Find(rc.order.request) : nullptr;
  if (kv == nullptr) return false;
  for (uint32_t j : rc.awaiting) {
    if (j < kv->pages.size() && kv->pages[j].host_page >= 0) return true;  // issued; its completion not polled yet
  }
  return false;
}

void Worker::OnReclaimOrder(const wire::ReclaimOrderT& m) {
  Reclaim rc;
  rc.order = m;
  auto it = requests_.find(m.request);
  Request* r = it == requests_.end() ? nullptr : it->second.get();
  if (m.backup_pages.size() != m.backup_targets.size()) {
    SendBackupComplete(m, absl::InvalidArgumentError("ReclaimOrder: backup_pages and backup_targets differ in length"));
    return;
  }
  if (r == nullptr && !m.backup_pages.empty() && !finished_ids_.contains(m.request)) {
    // Never served by this worker process (admitted through an earlier one that died): nothing of it was written
    // here, so no host copy may be reported. memd keeps the victim as it was.
    SendBackupComplete(m, absl::FailedPreconditionError(absl::StrCat(
        "ReclaimOrder ", m.order, ": request ", m.request, " is unknown to this worker process; no host copy written")));
    return;
  }
  if (r == nullptr) {
    // Finished here: its Complete crossed the order and memd dropped the reclaim and the request's pages with it.
    // The answer only closes memd's orphaned copies (contract, details); ReadersDone follows (nothing is mapped).
    if (!m.backup_pages.empty()) SendBackupComplete(m, absl::OkStatus());
    reclaims_[m.order] = std::move(rc);
    AdvanceReclaims();
    return;
  }
  // The history page of each GPU page of the order: a page the KV store maps (kept or populated, copy pending or
  // ready) is withdrawn before the page may be retired; a page only planned to be kept (the grant's optional page of a
  // history page the victim is still writing, or a request still waiting for a slot) holds nothing yet.
  const RequestKv* kv = hier_ != nullptr ? hier_->Find(r->id) : nullptr;
  auto held_page = [&](PageIndex dp) -> std::optional<uint32_t> {
    return kv != nullptr ? hier_->HistoryPageOf(r->id, dp) : std::nullopt;
  };
  auto planned_page = [&](PageIndex dp) -> std::optional<uint32_t> {
    if (hier_ == nullptr) return std::nullopt;
    for (const auto& [j, d] : r->optional) {
      if (d == dp) return j;
    }
    return std::nullopt;
  };
  // Pass 1: map and check every backup page before anything changes.
  struct Item { uint32_t page; PageIndex target; bool held; };
  std::vector<Item> items;
  for (size_t i = 0; i < m.backup_pages.size(); ++i) {
    const PageIndex dp = m.backup_pages[i];
    std::optional<uint32_t> j = held_page(dp);
    const bool held = j.has_value();
    if (!held) j = planned_page(dp);
    if (!j) {
      SendBackupComplete(m, absl::FailedPreconditionError(absl::StrCat(
          "ReclaimOrder ", m.order, ": GPU page ", dp, " holds no history page of request ", m.request, " here")));
      return;
    }
    if (m.backup_targets[i].segment() != 0) {
      SendBackupComplete(m, absl::UnimplementedError(absl::StrCat("ReclaimOrder ", m.order, ": host page in segment ",
                                                                  m.backup_targets[i].segment(),
                                                                  ": this worker maps segment 0 only")));
      return;
    }
    items.push_back(Item{*j, m.backup_targets[i].page(), held});
  }
  // Pages named without a backup (memd has their host copy) and only planned: the plan is dropped; they go to host
  // when they complete (BackupComplete order 0).
  if (kv != nullptr) {
    for (PageIndex dp : m.pages) {
      if (held_page(dp) || std::count(m.backup_pages.begin(), m.backup_pages.end(), dp) != 0) continue;
      if (std::optional<uint32_t> j = planned_page(dp)) hier_->DropKeep(r->id, *j);
    }
  }
  // Pass 2: a page with a host copy written counts at once; one being written is awaited; a held page is backed up
  // from GPU now; a planned page is backed up as soon as its rows are written (at once if they are).
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& item = items[i];
    const uint32_t j = item.page;
    if (j < r->host_pages.size() && item.target != r->host_pages[j]) {
      spdlog::warn("worker: reclaim order {} targets host page {} for history page {}, the grant gave another",
                   m.order, item.target, j);
      r->host_pages[j] = item.target;  // where the copy lives now
    }
    const KvPage* pg = kv != nullptr && j < kv->pages.size() ? &kv->pages[j] : nullptr;
    if (pg != nullptr && pg->host_page >= 0) {
      rc.backup_history.push_back(j);
      if (!pg->host_ready) rc.awaiting.insert(j);  // a backup already in flight: its completion is this order's
      continue;
    }
    absl::Status issued;
    if (item.held) {
      (void)pg->populate.Wait();  // a kept copy still in flight: back up what it holds
      issued = hier_->BackupPages(r->id, std::vector<uint32_t>{j}, std::vector<PageIndex>{item.target}).status();
    } else {
      rc.planned[j] = m.backup_pages[i];
      // Only planned to be kept: the GPU page holds nothing. A page whose rows are all written (still in the tail)
      // is backed up now and awaited; one the victim is still writing (or a request not started yet: PlanKv leaves
      // the page out of the keep plan while ReclaimInFlight) is *deferred* (contract §4): it goes to its host page
      // from the tail when it completes, reported with order 0, and the order does not wait for the victim's prefill.
      bool now = false;
      if (kv != nullptr) {
        absl::StatusOr<bool> b = hier_->BackupInsteadOfKeep(r->id, j, item.target);
        issued = b.status();
        now = b.ok() && *b;
      }
      if (issued.ok() && !now) {
        rc.deferred.push_back(m.backup_pages[i]);
        continue;
      }
    }
    rc.backup_history.push_back(j);
    rc.awaiting.insert(j);
    if (!issued.ok()) {
      rc.awaiting.erase(j);
      if (rc.backup_status.ok()) rc.backup_status = issued;
    }
  }
  for (uint32_t j : rc.awaiting) reclaim_backup_of_[{r->id, j}] = m.order;
  reclaims_[m.order] = std::move(rc);
  AdvanceReclaims();
}

void Worker::AdvanceReclaims() {
  for (auto it = reclaims_.begin(); it != reclaims_.end();) {
    Reclaim& rc = it->second;
    const wire::ReclaimOrderT& m = rc.order;
    auto rit = requests_.find(m.request);
    Request* r = rit == requests_.end() ? nullptr : rit->second.get();
    if (!rc.backup_reported && r != nullptr) {
      // Every backup page's host copy written -> BackupComplete ok. A failure is reported once none of the order's
      // copies is still writing (memd may hand the host pages on after it); pages not issued yet are not waited for.
      if (!rc.awaiting.empty() && (rc.backup_status.ok() || BackupInFlight(rc))) { ++it; continue; }
      rc.backup_reported = true;
      for (uint32_t j : rc.awaiting) reclaim_backup_of_.erase(PageKey{m.request, j});
      if (!m.backup_pages.empty()) SendBackupComplete(m, rc.backup_status, rc.deferred);
      if (!rc.backup_status.ok()) {
        // memd leaves the victim untouched and may retry: a page only planned to be kept is kept again on its GPU
        // page (its rows are still in the tail: a page without a host copy never leaves it).
        spdlog::warn("worker: backup of reclaim order {} failed: {}", m.order, rc.backup_status.ToString());
        const RequestKv* kv = hier_ != nullptr ? hier_->Find(m.request) : nullptr;
        for (const auto& [j, dp] : rc.planned) {
          if (kv == nullptr) continue;  // not started: PlanKv keeps it once this order is gone
          if (j < kv->pages.size() && kv->pages[j].host_page >= 0) continue;  // written: host copy, nothing to undo
          if (absl::Status s = hier_->RestoreKeep(m.request, j, dp); !s.ok()) {
            spdlog::error("worker: keeping page {} of request {} again failed: {}", j, m.request, s.ToString());
          }
        }
        it = reclaims_.erase(it);
        continue;
      }
      for (uint32_t j : rc.backup_history) r->reported_backups.insert(j);
      stats_.pages_backed_up += rc.copies;
    }
    if (!rc.withdrawing && !rc.readers_done) {
      // Every page of the order this worker still holds is withdrawn, including pages whose populate copy was in
      // flight when the order came (memd reclaims whole requests, pending pages too). Such a page is withdrawn only
      // after its PopulateOrder was answered (ReadyPublish): memd waits for that answer before it retires the page,
      // and withdrawing it earlier would leave that populate order unanswered. ReadersDone is sent only once no
      // page of the order is mapped here (contract §4, brief §4).
      if (r != nullptr && PopulateInFlight(r->id, m.pages)) { ++it; continue; }
      std::vector<uint32_t> held;
      if (r != nullptr && hier_ != nullptr) {
        for (PageIndex dp : m.pages) {
          if (std::optional<uint32_t> j = hier_->HistoryPageOf(r->id, dp)) held.push_back(*j);
        }
      }
      if (!held.empty()) {
        absl::StatusOr<CopyEvent> e = hier_->WithdrawReady(r->id, held);
        if (!e.ok()) spdlog::error("worker: withdraw of order {} failed: {}", m.order, e.status().ToString());
        if (e.ok()) rc.withdraw = *e;
      }
      rc.withdrawing = true;
    }
    if (rc.withdrawing && rc.withdraw.Done()) {
      rc.withdrawing = false;
      rc.readers_done = true;
      if (r != nullptr) {
        for (PageIndex dp : m.pages) {
          std::erase_if(r->optional, [&](const auto& e) { return e.second == dp; });
        }
      }
      wire::ReadersDoneT done;
      done.order = m.order; done.request = m.request; done.gpu = config_.gpu; done.pages = m.pages;
      (void)memd_->SendReadersDone(done);
      // Obeyed: the pages are unmapped and unread. Counted here, not at Retire, which may come after the request
      // finished and its orders were forgotten; an order that crossed its request's Complete reclaimed nothing.
      if (r != nullptr) {
        ++stats_.reclaims_obeyed;
        stats_.pages_reclaimed += m.pages.size();
      }
    }
    ++it;
  }
}

bool Worker::PopulateInFlight(RequestId request, std::span<const PageIndex> device_pages) const {
  for (const auto& [order, po] : populates_) {
    if (po.order.request != request) continue;
    for (size_t i = 0; i < po.order.pages.size() && i < po.order.history_pages.size(); ++i) {
      if (!populate_of_.contains(PageKey{request, po.order.history_pages[i]})) continue;  // that copy reported
      if (std::find(device_pages.begin(), device_pages.end(), po.order.pages[i]) != device_pages.end()) return true;
    }
  }
  return false;
}

void Worker::OnRetire(const wire::RetireT& m) {
  auto it = reclaims_.find(m.order);
  if (it == reclaims_.end()) {
    // Its request finished after ReadersDone went out (Finish forgets the request's orders): nothing is mapped.
    spdlog::debug("worker: Retire for order {} of a finished request", m.order);
  } else if (!it->second.readers_done) {
    spdlog::warn("worker: Retire for order {} that has not reached ReadersDone", m.order);
  }
  if (hier_ != nullptr) {
    if (absl::Status s = hier_->Retire(m.pages); !s.ok()) spdlog::error("worker: Retire: {}", s.ToString());
  }
  if (it != reclaims_.end()) reclaims_.erase(it);
}

void Worker::OnPopulateOrder(const wire::PopulateOrderT& m) {
  Populate po;
  po.order = m;
  auto it = requests_.find(m.request);
  Request* r = it == requests_.end() ? nullptr : it->second.get();
  if (m.pages.size() != m.history_pages.size() || m.pages.size() != m.host_pages.size()) {
    po.status = absl::InvalidArgumentError("PopulateOrder: pages, history_pages and host_pages differ in length");
  } else if (r == nullptr || r->phase != Phase::kActive || hier_ == nullptr) {
    po.status = absl::FailedPreconditionError(absl::StrCat("PopulateOrder: request ", m.request,
                                                           " has no hierarchical KV on this worker"));
  } else {
    for (size_t i = 0; i < m.pages.size() && po.status.ok(); ++i) {
      const uint32_t j = m.history_pages[i];
      if (m.host_pages[i].segment() != 0 || j >= r->host_pages.size() || r->host_pages[j] != m.host_pages[i].page()) {
        po.status = absl::InvalidArgumentError(absl::StrCat("PopulateOrder: host page of history page ", j,
                                                            " differs from the grant"));
        break;
      }
      absl::StatusOr<CopyEvent> e = hier_->Populate(r->id, j, m.pages[i]);
      if (!e.ok()) { po.status = e.status(); break; }
      populate_of_[{r->id, j}] = m.order;
      ++po.outstanding;
    }
  }
  populates_[m.order] = std::move(po);
  if (populates_[m.order].outstanding == 0) {
    // Nothing in flight: answer at once (ReportKvCompletions finishes orders whose copies completed).
    Populate& p = populates_[m.order];
    wire::ReadyPublishT pub;
    pub.order = m.order; pub.gpu = config_.gpu; pub.request = m.request; pub.pages = m.pages;
    pub.history_pages = m.history_pages; pub.ok = p.status.ok();
    if (!p.status.ok()) pub.error = ToWireError(p.status);
    (void)memd_->SendReadyPublish(pub);
    populates_.erase(m.order);
  }
}

void Worker::ReportKvCompletions() {
  std::erase_if(cancelled_populates_, [&](const Cancelled& c) {
    if (!std::all_of(c.copies.begin(), c.copies.end(), [](const CopyEvent& e) { return e.Done(); })) return false;
    (void)memd_->SendReadyPublish(c.answer);
    return true;
  });
  if (hier_ == nullptr) return;
  KvCompletions c = hier_->Poll();
  std::map<RequestId, wire::BackupCompleteT> deferred;
  for (const KvCompletions::Backup& b : c.backups) {
    if (auto rb = reclaim_backup_of_.find(PageKey{b.request, b.page}); rb != reclaim_backup_of_.end()) {
      // A copy a reclaim order waits for: reported with that order's BackupComplete (AdvanceReclaims).
      auto o = reclaims_.find(rb->second);
      reclaim_backup_of_.erase(rb);
      if (o != reclaims_.end() && o->second.awaiting.erase(b.page) != 0) {
        if (b.status.ok()) {
          ++o->second.copies;
        } else if (o->second.backup_status.ok()) {
          o->second.backup_status = absl::Status(b.status.code(), absl::StrCat("host copy of page ", b.page,
                                                                               " failed: ", b.status.message()));
        }
        continue;
      }
    }
    auto it = requests_.find(b.request);
    if (it == requests_.end()) continue;
    if (!b.status.ok()) {
      spdlog::error("worker: backup of page {} of request {} failed: {}", b.page, b.request, b.status.ToString());
      wire::BackupCompleteT fail;
      fail.request = b.request; fail.gpu = config_.gpu; fail.pages = {b.page};
      fail.host_pages = {wire::HostPageRef(0, b.host_page)};
      fail.ok = false; fail.error = ToWireError(b.status); fail.message = std::string(b.status.message());
      (void)memd_->SendBackupComplete(fail);
      continue;
    }
    ++stats_.pages_backed_up;
    if (!it->second->reported_backups.insert(b.page).second) continue;  // a replayed page: reported before
    wire::BackupCompleteT& d = deferred[b.request];
    d.order = 0; d.request = b.request; d.gpu = config_.gpu; d.ok = true;
    d.pages.push_back(b.page);
    d.host_pages.emplace_back(0, b.host_page);
  }
  for (auto& [id, d] : deferred) (void)memd_->SendBackupComplete(d);

  for (const KvCompletions::Published& p : c.published) {
    if (p.kept) {
      if (p.status.ok()) {
        ++stats_.pages_kept;
      } else {
        spdlog::warn("worker: keeping page {} of request {} on GPU failed ({}); backed up to host instead", p.page,
                     p.request, p.status.ToString());
      }
      continue;
    }
    auto key = populate_of_.find(PageKey{p.request, p.page});
    if (key == populate_of_.end()) continue;
    const uint64_t order = key->second;
    populate_of_.erase(key);
    auto pit = populates_.find(order);
    if (pit == populates_.end()) continue;
    Populate& po = pit->second;
    --po.outstanding;
    if (p.status.ok()) {
      po.published.push_back(p.page);
    } else if (po.status.ok()) {
      po.status = p.status;
    }
    if (po.outstanding != 0) continue;
    const wire::PopulateOrderT& m = po.order;
    auto rit = requests_.find(m.request);
    if (!po.status.ok() && rit != requests_.end() && !po.published.empty()) {
      // Not published as a whole: withdraw the pages that did complete before memd frees them.
      absl::StatusOr<CopyEvent> e = hier_->WithdrawReady(m.request, po.published);
      if (e.ok()) (void)e->Wait();
    }
    if (po.status.ok() && rit != requests_.end()) {
      for (size_t i = 0; i < m.pages.size(); ++i) rit->second->optional[m.history_pages[i]] = m.pages[i];
      stats_.pages_populated += m.pages.size();
    }
    wire::ReadyPublishT pub;
    pub.order = m.order; pub.gpu = config_.gpu; pub.request = m.request; pub.pages = m.pages;
    pub.history_pages = m.history_pages; pub.ok = po.status.ok();
    if (!po.status.ok()) pub.error = ToWireError(po.status);
    (void)memd_->SendReadyPublish(pub);
    populates_.erase(pit);
  }
}

// ---- the loop ----

absl::Status Worker::PlanKv(Request& r) {
  if (hier_ == nullptr) return absl::OkStatus();
  std::vector<std::pair<uint32_t, PageIndex>> keep;
  if (config_.mode == WorkerMode::kAdaptive) {
    // A page a reclaim order took before the request started is not kept: it goes to its host page (contract §4).
    for (const auto& [j, dp] : r.optional) {
      if (!ReclaimInFlight(r.id, dp)) keep.emplace_back(j, dp);
    }
  }
  return hier_->PlanResidency(r.id, r.host_pages, keep);
}

void Worker::StartGranted() {
  while (!granted_.empty() && active_requests() < config_.slots) {
    const RequestId id = granted_.front();
    granted_.pop_front();
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request& r = *it->second;
    if (absl::Status s = PlanKv(r); !s.ok()) {
      Finish(id, s);
      continue;
    }
    r.session.emplace(model_->NewSession(id));
    r.phase = Phase::kActive;
  }
}

absl::Status Worker::ImportChunk(Request& r) {
  // The prefix ends at prefix_tokens; the last input token is always fed by a Step (its logits start decoding).
  const Position last = std::min<Position>(static_cast<Position>(r.input.size()) - 1, r.prefix_tokens);
  Position end = std::min<Position>(last, r.fed + static_cast<Position>(geometry_.prefill_chunk));
  const Position block = static_cast<Position>(r.prefix_block_tokens);
  const bool cached = prefix_cache_.capacity_bytes() > 0 && block > 0;
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
  for (const auto& [order, rc] : reclaims_) {
    if (rc.order.request == r.id && !rc.readers_done) {
      return absl::AbortedError("a reclaim order of this request is in flight");
    }
  }
  for (const auto& [order, po] : populates_) {
    if (po.order.request == r.id) return absl::AbortedError("a populate order of this request is in flight");
  }
  kv().Release(r.id);
  r.session.emplace(model_->NewSession(r.id));
  r.capture.reset();  // recomputed below without the row cache; a later block starts a fresh capture
  if (absl::Status s = PlanKv(r); !s.ok()) return s;
  std::vector<model::Token> all = r.input;
  all.insert(all.end(), r.generated.begin(), r.generated.end());
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

absl::Status Worker::RunBatch() {
  struct Item {
    Request* r;
    std::vector<model::Token> tokens;
    bool emits;
  };
  std::vector<Item> items;
  std::vector<RequestId> failed;
  for (auto& [id, rp] : requests_) {
    Request& r = *rp;
    if (r.phase != Phase::kActive) continue;
    const Position in = static_cast<Position>(r.input.size());
    const Position import_end = std::min<Position>(r.prefix_tokens, in - 1);
    if (r.fed < import_end) {
      if (absl::Status s = ImportChunk(r); !s.ok()) {
        failed.push_back(id);
        spdlog::warn("worker: request {} failed while importing its prefix: {}", id, s.ToString());
        continue;
      }
      if (r.fed < import_end) continue;
    }
    Item item{&r, {}, true};
    if (r.fed < in) {
      const size_t n = std::min<size_t>(geometry_.prefill_chunk, static_cast<size_t>(in - r.fed));
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
  if (items.empty()) return absl::OkStatus();

  std::vector<model::StepInput> batch;
  for (Item& it : items) batch.push_back(model::StepInput{&*it.r->session, it.tokens});
  std::vector<model::StepOutput> out(items.size());
  absl::Status st = model_->Step(batch, kv(), out);
  std::vector<RequestId> to_finish;
  if (st.ok()) {
    for (size_t b = 0; b < items.size(); ++b) {
      Request& r = *items[b].r;
      r.fed += static_cast<Position>(items[b].tokens.size());
      if (items[b].emits) {
        EmitToken(r, std::span<const float>(out[b].logits).last(model::kVocab));
      }
    }
  } else {
    // The batch failed as a whole: each request is rebuilt alone and its step retried, so only the request whose own
    // copies fail ends (its rows are never handed to another request: hot caches are per slot).
    spdlog::warn("worker: batched step of {} requests failed ({}); retrying each alone", items.size(), st.ToString());
    for (Item& item : items) {
      Request& r = *item.r;
      absl::Status s = ReplayFed(r);
      model::StepOutput solo;
      if (s.ok()) {
        model::StepInput in{&*r.session, item.tokens};
        s = model_->Step(std::span<model::StepInput>(&in, 1), kv(), std::span<model::StepOutput>(&solo, 1));
      }
      if (!s.ok()) {
        Finish(r.id, absl::Status(s.code(), absl::StrCat("request ", r.id, " failed: ", s.message())));
        continue;
      }
      r.fed += static_cast<Position>(item.tokens.size());
      if (item.emits) EmitToken(r, std::span<const float>(solo.logits).last(model::kVocab));
    }
  }
  // Finished requests (their last chunk is out): release and tell memd.
  std::vector<RequestId> done;
  for (const auto& [id, r] : requests_) {
    if (r->phase == Phase::kActive && r->generated.size() >= r->max_new) done.push_back(id);
  }
  for (RequestId id : done) Finish(id, absl::OkStatus());
  return absl::OkStatus();
}

void Worker::EmitToken(Request& r, std::span<const float> logits) {
  const model::Token token = r.greedy ? model::Argmax(logits) : model::Sample(logits, r.sampling, r.rng);
  const auto now = std::chrono::steady_clock::now();
  if (r.generated.empty()) r.ttft_us = MicrosSince(r.submitted, now);
  r.generated.push_back(token);
  ++stats_.tokens_generated;
  SendChunk(r, {token}, {LogitsDigest(logits)}, r.generated.size() >= r.max_new, absl::OkStatus());
}

void Worker::SendChunk(Request& r, std::vector<model::Token> tokens, std::vector<uint64_t> digests, bool finished,
                       const absl::Status& error) {
  const auto now = std::chrono::steady_clock::now();
  wire::TokenChunkT chunk;
  chunk.request = r.id;
  for (model::Token t : tokens) chunk.tokens.push_back(static_cast<uint8_t>(t));
  chunk.logits_digests = std::move(digests);
  chunk.finished = finished;
  chunk.ttft_us = r.ttft_us;
  chunk.since_submit_us = MicrosSince(r.submitted, now);
  chunk.allocation_wait_us = r.phase == Phase::kWaitGrant ? chunk.since_submit_us : MicrosSince(r.submitted, r.granted);
  if (!error.ok()) {
    chunk.error = ToWireError(error);
    chunk.error_message = std::string(error.message());
  }
  client_->Chunk(r.client, chunk);
}

void Worker::Finish(RequestId id, absl::Status error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  if (finished_ids_.insert(id).second) {
    finished_order_.push_back(id);
    if (finished_order_.size() > kFinishedMemory) {
      finished_ids_.erase(finished_order_.front());
      finished_order_.pop_front();
    }
  }
  // Populate orders in flight die with the request, but memd frees their GPU pages only when they are answered
  // (contract §5): answer each one unpublished once its copies into those pages ended (ReportKvCompletions).
  std::vector<Cancelled> cancelled;
  for (const auto& [order, po] : populates_) {
    if (po.order.request != id) continue;
    Cancelled c;
    c.answer.order = order; c.answer.gpu = config_.gpu; c.answer.request = id; c.answer.pages = po.order.pages;
    c.answer.history_pages = po.order.history_pages; c.answer.ok = false;
    c.answer.error = wire::ErrorCode::CANCELLED;
    cancelled.push_back(std::move(c));
  }
  if (r.phase == Phase::kActive) {
    if (const RequestKv* kv = hier_ != nullptr ? hier_->Find(id) : nullptr) {
      for (const KvPage& pg : kv->pages) {
        if (pg.device_page < 0) continue;
        const bool populated = std::any_of(cancelled.begin(), cancelled.end(), [&](const Cancelled& c) {
          return std::find(c.answer.pages.begin(), c.answer.pages.end(), pg.device_page) != c.answer.pages.end();
        });
        if (populated) {
          for (Cancelled& c : cancelled) c.copies.push_back(pg.populate);
        } else {
          // A kept page's device->device copy: memd frees the page at Complete, so it must have landed by then.
          (void)pg.populate.Wait();
        }
      }
      // Likewise every host backup still being written: memd frees the request's host pages at Complete and may grant
      // them at once; a late write would land in another request's page.
      for (const KvPage& pg : kv->pages) {
        if (pg.host_page >= 0 && !pg.host_ready) (void)pg.backup.Wait();
      }
    }
    kv().Release(id);
  }
  // Orders of this request die with it: Complete releases everything at memd (contract §6).
  std::erase_if(reclaims_, [&](const auto& e) { return e.second.order.request == id; });
  std::erase_if(populates_, [&](const auto& e) { return e.second.order.request == id; });
  std::erase_if(populate_of_, [&](const auto& e) { return e.first.first == id; });
  std::erase_if(reclaim_backup_of_, [&](const auto& e) { return e.first.first == id; });
  std::erase(granted_, id);
  if (!error.ok()) {
    spdlog::warn("worker: request {} ends with an error: {}", id, error.ToString());
    SendChunk(r, {}, {}, true, error);
    ++stats_.failed_requests;
  }
  ++stats_.finished_requests;
  (void)memd_->SendComplete(MakeComplete(id, config_.gpu));
  requests_.erase(it);
  for (Cancelled& c : cancelled) cancelled_populates_.push_back(std::move(c));
}

absl::StatusOr<bool> Worker::Iterate() {
  ReportKvCompletions();
  AdvanceReclaims();
  StartGranted();
  if (absl::Status s = RunBatch(); !s.ok()) return s;
  ReportKvCompletions();
  AdvanceReclaims();
  bool local = active_requests() > 0 || !populates_.empty() || !cancelled_populates_.empty();
  for (const auto& [order, rc] : reclaims_) local = local || !rc.readers_done;
  return local;
}

WorkerStats Worker::stats() const {
  WorkerStats s = stats_;
  if (hier_ != nullptr) {
    for (uint32_t g = 0; g < geometry_.kv.groups.size(); ++g) {
      const Census& c = hier_->census(g);
      s.census.direct += c.direct;
      s.census.hot += c.hot;
      s.census.host += c.host;
      s.census.scans_skipped += c.scans_skipped;
      s.census.bytes_recovered += c.bytes_recovered;
    }
  }
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
  r.capacity_pages = geometry_.capacity_pages;
  r.page_bytes = geometry_.page_bytes;
  return r;
}

}  // namespace dhs
