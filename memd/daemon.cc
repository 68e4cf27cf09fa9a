#include "memd/daemon.h"

#include <unistd.h>

#include <algorithm>
#include <variant>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace dhs::memd {
namespace {

constexpr char kSender[] = "memd";

int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

wire::HostPageRef HostRef(PageIndex page) { return wire::HostPageRef(0, page); }

DumpView ViewOf(const wire::IntrospectQueryT& q) {
  DumpView v;
  switch (q.what) {
    case wire::IntrospectWhat::Status: v.kind = DumpView::Kind::kStatus; break;
    case wire::IntrospectWhat::Gpus: v.kind = DumpView::Kind::kGpus; break;
    case wire::IntrospectWhat::Requests: v.kind = DumpView::Kind::kRequests; break;
    case wire::IntrospectWhat::Request: v.kind = DumpView::Kind::kRequest; break;
    case wire::IntrospectWhat::Pages: v.kind = DumpView::Kind::kPages; break;
    case wire::IntrospectWhat::Queue: v.kind = DumpView::Kind::kQueue; break;
  }
  v.request = q.request;
  v.gpu = q.gpu;
  return v;
}

}  // namespace

std::string DefaultRunDir() { return absl::StrFormat("/tmp/dhs-%d", getuid()); }

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& in) {
  DaemonOptions options = in;
  if (options.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is empty");
  if (options.page_bytes == 0 || options.page_bytes % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("page bytes must be a positive multiple of 64, got %d", options.page_bytes));
  }
  if (options.host_pool_pages == 0) return absl::InvalidArgumentError("the host pool needs at least one page");
  if (options.populate_pages_per_attempt == 0) {
    return absl::InvalidArgumentError("populate_pages_per_attempt must be at least 1 (0 would never populate)");
  }
  if (options.segment_name.empty()) options.segment_name = absl::StrFormat("dhs-memd-%d", getpid());
  if (absl::Status s = MakeRunDir(options.run_dir); !s.ok()) return s;

  // The segment first: a pool larger than the free /dev/shm fails at once (HostPoolSegment::Create checks the free
  // space), before the core spends seconds building its host-page allocator for millions of pages.
  auto segment = HostPoolSegment::Create(options.segment_name, options.page_bytes, options.host_pool_pages);
  if (!segment.ok()) {
    return absl::Status(segment.status().code(),
                        absl::StrFormat("cannot create the host pool (%d pages x %d bytes = %d bytes in "
                                        "/dev/shm/%s): %s",
                                        options.host_pool_pages, options.page_bytes,
                                        uint64_t{options.host_pool_pages} * options.page_bytes, options.segment_name,
                                        segment.status().message()));
  }
  ResidencyConfig config;
  config.reserve_pages = options.reserve_pages;
  config.host_pages = options.host_pool_pages;
  config.host_page_bytes = options.page_bytes;
  config.populate_pages_per_attempt = options.populate_pages_per_attempt;
  config.reclaim_policy = options.reclaim_policy;
  auto core = ResidencyManager::Create(config, NowUs);
  if (!core.ok()) {
    (void)HostPoolSegment::Remove(options.segment_name);
    return core.status();
  }
  auto router = RouterServer::Bind(options.run_dir, "memd");
  if (!router.ok()) {
    (void)HostPoolSegment::Remove(options.segment_name);
    return router.status();
  }
  std::unique_ptr<Daemon> d(
      new Daemon(std::move(options), std::move(*segment), std::move(*router), std::move(*core)));
  d->PublishMetrics();
  return d;
}

Daemon::Daemon(DaemonOptions options, std::unique_ptr<HostPoolSegment> segment, std::unique_ptr<RouterServer> router,
               std::unique_ptr<ResidencyManager> core)
    : options_(std::move(options)),
      segment_(std::move(segment)),
      router_(std::move(router)),
      core_(std::move(core)),
      server_(std::make_unique<Server>(router_.get(), kSender)) {
  next_tick_ = std::chrono::steady_clock::now() + options_.tick;
  next_retry_ = std::chrono::steady_clock::now() + options_.retry_period;
  Register();
}

Daemon::~Daemon() {
  server_.reset();
  router_.reset();  // removes memd.sock
  const std::string name = segment_->name();
  segment_.reset();
  if (absl::Status s = HostPoolSegment::Remove(name); !s.ok()) spdlog::warn("memd: {}", std::string(s.message()));
}

std::string Daemon::metrics() const {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  return metrics_;
}

void Daemon::PublishMetrics() {
  std::string text = RenderPrometheus(core_->Dump(), core_->counters());
  const std::pair<const char*, uint64_t> own[] = {
      {"messages", counters_.messages},         {"hellos", counters_.hellos},
      {"host_writes", counters_.host_writes},   {"host_write_failures", counters_.host_write_failures},
      {"send_failures", counters_.send_failures}, {"deferred_backups", counters_.deferred_backups},
  };
  for (const auto& [name, v] : own) {
    absl::StrAppendFormat(&text, "# TYPE dhs_memd_%s_total counter\ndhs_memd_%s_total %d\n", name, name, v);
  }
  absl::StrAppendFormat(&text, "# TYPE dhs_memd_workers gauge\ndhs_memd_workers %d\n", gpus_.size());
  std::lock_guard<std::mutex> lock(metrics_mu_);
  metrics_ = std::move(text);
}

absl::Status Daemon::Run(const std::function<bool()>& keep_going) {
  while (keep_going()) {
    if (absl::Status s = ServeOnce(options_.tick); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Daemon::ServeOnce(std::chrono::milliseconds timeout) {
  auto served = server_->ServeOnce(timeout);
  if (!served.ok()) return served.status();
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_tick_) {  // the metrics snapshot is refreshed here too (a dump per message would cost the loop)
    next_tick_ = now + options_.tick;
    Tick();
  }
  return absl::OkStatus();
}

void Daemon::Tick() {
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_retry_) {
    next_retry_ = now + options_.retry_period;
    (void)core_->RetryBackups();
  }
  (void)core_->Populate();
  FlushOrders();
  PublishMetrics();
}

void Daemon::SendToGpu(GpuId gpu, const std::string& bytes) {
  auto it = gpus_.find(gpu);
  absl::Status s = it == gpus_.end() ? absl::NotFoundError("no worker said Hello")
                                     : router_->Reply(it->second.peer, bytes);
  if (!s.ok()) {
    ++counters_.send_failures;
    spdlog::warn("memd: cannot send to the worker of GPU {}: {}", gpu, std::string(s.message()));
  }
}

// ---------------------------------------------------------------- handlers

void Daemon::Register() {
  auto counted = [this](auto fn) {
    return [this, fn](const Message& m, std::string_view peer) -> absl::StatusOr<std::string> {
      ++counters_.messages;
      absl::StatusOr<std::string> out = fn(m, peer);
      FlushOrders();  // also on error: an event refused changes nothing, but keep the outbox empty
      return out;
    };
  };
  server_->On(wire::Body::Hello, counted([this](const Message& m, std::string_view p) { return OnHello(m, p); }));
  server_->On(wire::Body::AdmitRequest,
              counted([this](const Message& m, std::string_view p) { return OnAdmit(m, p); }));
  server_->On(wire::Body::BackupComplete,
              counted([this](const Message& m, std::string_view) { return OnBackupComplete(m); }));
  server_->On(wire::Body::ReadersDone,
              counted([this](const Message& m, std::string_view) { return OnReadersDone(m); }));
  server_->On(wire::Body::ReadyPublish,
              counted([this](const Message& m, std::string_view) { return OnReadyPublish(m); }));
  server_->On(wire::Body::Complete, counted([this](const Message& m, std::string_view) { return OnComplete(m); }));
  server_->On(wire::Body::IntrospectQuery,
              counted([this](const Message& m, std::string_view) { return OnIntrospect(m); }));
  server_->On(wire::Body::Heartbeat,
              counted([](const Message& m, std::string_view) -> absl::StatusOr<std::string> {
                auto hb = ReadHeartbeat(m);
                if (!hb.ok()) return hb.status();
                wire::HeartbeatAckT ack;
                ack.sender_time_ns = hb->sender_time_ns;
                ack.receiver_time_ns = NowNs();
                return EncodeHeartbeatAck(ack, m.sequence, kSender);
              }));
  server_->On(wire::Body::HeartbeatAck,
              counted([](const Message&, std::string_view) -> absl::StatusOr<std::string> { return std::string(); }));
}

absl::StatusOr<std::string> Daemon::OnHello(const Message& m, std::string_view peer) {
  auto hello = ReadHello(m);
  if (!hello.ok()) return hello.status();
  wire::HelloReplyT reply;
  std::string reason;
  auto known = gpus_.find(hello->gpu);
  if (hello->page_bytes != options_.page_bytes) {
    reason = absl::StrFormat("page_bytes %d differs from memd's host pool page size %d (memd --page-bytes)",
                             hello->page_bytes, options_.page_bytes);
  } else if (hello->capacity_pages == 0 || hello->page_rows == 0) {
    reason = "capacity_pages and page_rows must be > 0";
  } else if (known != gpus_.end() && known->second.capacity_pages != hello->capacity_pages) {
    reason = absl::StrFormat("GPU %d was registered with M = %d pages; a restarted worker must keep it (got %d)",
                             hello->gpu, known->second.capacity_pages, hello->capacity_pages);
  } else if (known == gpus_.end()) {
    if (absl::Status s = core_->RegisterGpu(hello->gpu, hello->capacity_pages); !s.ok()) {
      reason = std::string(s.message());
    }
  }
  if (!reason.empty()) {
    spdlog::warn("memd: Hello of GPU {} refused: {}", hello->gpu, reason);
    reply.accepted = false;
    reply.reason = reason;
    return EncodeHelloReply(reply, m.sequence, kSender);
  }
  GpuInfo& g = gpus_[hello->gpu];
  g.peer = std::string(peer);
  g.page_rows = hello->page_rows;
  g.capacity_pages = hello->capacity_pages;
  g.request_slots = hello->request_slots;
  ++g.epoch;
  ++counters_.hellos;
  spdlog::info("memd: worker of GPU {} (pid {}, {}) registered: M = {} pages, p = {} rows, epoch {}", hello->gpu,
               hello->pid, hello->device_name, hello->capacity_pages, hello->page_rows, g.epoch);
  reply.accepted = true;
  reply.worker_epoch = g.epoch;
  auto seg = std::make_unique<wire::HostSegmentInfoT>();
  seg->name = segment_->name();
  seg->size_bytes = segment_->size_bytes();
  seg->page_bytes = segment_->page_bytes();
  seg->pages = static_cast<uint32_t>(segment_->pages());
  reply.segments.push_back(std::move(seg));
  return EncodeHelloReply(reply, m.sequence, kSender);
}

absl::StatusOr<std::string> Daemon::OnAdmit(const Message& m, std::string_view peer) {
  auto a = ReadAdmitRequest(m);
  if (!a.ok()) return a.status();
  auto reject = [&](absl::Status why) {
    wire::AdmitRejectT r;
    r.request = a->request;
    r.code = ToWireError(why);
    r.reason = std::string(why.message());
    spdlog::info("memd: admission of request {} rejected: {}", a->request, r.reason);
    return EncodeAdmitReject(r, m.sequence, kSender);
  };
  auto g = gpus_.find(a->gpu);
  if (g == gpus_.end() || g->second.peer != peer) {
    return reject(absl::FailedPreconditionError(
        absl::StrFormat("GPU %d has no registered worker on this connection (send Hello first)", a->gpu)));
  }
  if (requests_.count(a->request)) {
    return reject(absl::AlreadyExistsError(absl::StrFormat("request %d already known", a->request)));
  }
  GpuInfo& gpu = g->second;
  const uint64_t context_pages = (a->history_rows + gpu.page_rows - 1) / gpu.page_rows;
  if (context_pages > UINT32_MAX || a->complete_pages > context_pages) {
    return reject(absl::InvalidArgumentError(absl::StrFormat(
        "request %d: complete_pages %d exceeds the %d pages of history_rows %d", a->request, a->complete_pages,
        context_pages, a->history_rows)));
  }
  if (a->host_backed) {
    return reject(absl::UnimplementedError("host_backed admissions (resume after a worker restart) are not served yet"));
  }
  SlotIndex slot = 0;
  if (gpu.request_slots != 0) {
    while (slot < gpu.request_slots && gpu.used_slots.count(slot)) ++slot;
    if (slot == gpu.request_slots) {
      return reject(absl::ResourceExhaustedError(
          absl::StrFormat("GPU %d: all %d request slots are in use", a->gpu, gpu.request_slots)));
    }
  } else {
    while (gpu.used_slots.count(slot)) ++slot;
  }
  AdmitRequest core_admit;
  core_admit.request = a->request;
  core_admit.gpu = a->gpu;
  core_admit.slot = slot;
  core_admit.required_pages = a->required_pages;
  core_admit.history_pages = a->complete_pages;
  core_admit.optional_history = a->optional_history;
  core_admit.assign_host_pages = true;
  core_admit.context_pages = static_cast<uint32_t>(context_pages);
  if (absl::Status s = core_->Admit(core_admit); !s.ok()) return reject(s);
  gpu.used_slots.insert(slot);
  requests_[a->request] = RequestInfo{a->gpu, m.sequence, slot};
  return std::string();  // Grant / Wait / Reject go out with the drained orders
}

absl::StatusOr<std::string> Daemon::OnBackupComplete(const Message& m) {
  auto b = ReadBackupComplete(m);
  if (!b.ok()) return b.status();
  if (b->order == 0) {  // deferred backups during import/decode (contract §3): pages are history pages
    if (!b->ok) {
      ++counters_.host_write_failures;
      spdlog::warn("memd: request {}: host backup of {} pages failed: {}", b->request, b->pages.size(), b->message);
      return std::string();
    }
    for (uint32_t h : b->pages) {
      if (absl::Status s = core_->OnHostCopyWritten(b->request, h); !s.ok()) return s;
      ++counters_.host_writes;
    }
    return std::string();
  }
  auto it = orders_.find(b->order);
  if (it == orders_.end() || !it->second.reclaim) {
    return absl::NotFoundError(absl::StrFormat("BackupComplete: reclaim order %d unknown", b->order));
  }
  WireOrder& o = it->second;
  std::vector<PageIndex> pages = b->pages;
  if (pages.empty()) {  // the whole order
    for (const auto& [page, copy] : o.copies) pages.push_back(page);
  }
  absl::flat_hash_set<PageIndex> seen;
  for (PageIndex p : pages) {
    if (!o.copies.contains(p)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("BackupComplete: page %d is not a backup page of reclaim order %d", p, b->order));
    }
    if (!seen.insert(p).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("BackupComplete: page %d named twice for reclaim order %d", p, b->order));
    }
  }
  const absl::flat_hash_set<PageIndex> deferred(b->deferred_pages.begin(), b->deferred_pages.end());
  for (PageIndex p : deferred) {
    if (std::find(pages.begin(), pages.end(), p) == pages.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "BackupComplete: deferred page %d is not among the pages reported for reclaim order %d", p, b->order));
    }
  }
  for (PageIndex p : pages) {
    auto c = o.copies.find(p);
    const CopyId copy = c->second;
    o.copies.erase(c);
    // A deferred page (contract §4) held nothing yet: host-covered by the worker's tail, written later (order 0).
    const bool written = !b->ok || !deferred.contains(p);
    if (!written) ++counters_.deferred_backups;
    if (absl::Status s = core_->OnBackupDone(copy, b->ok, written); !s.ok()) return s;
  }
  if (!b->ok) {
    spdlog::warn("memd: reclaim order {} of request {}: backup failed ({}); the victim stays untouched", b->order,
                 o.request, b->message);
    // The core aborted the reclaim; the wire order is finished once its other backups reported.
    reclaim_orders_.erase(o.reclaim_id);
    if (o.copies.empty()) orders_.erase(it);
  }
  return std::string();
}

absl::StatusOr<std::string> Daemon::OnReadersDone(const Message& m) {
  auto r = ReadReadersDone(m);
  if (!r.ok()) return r.status();
  auto it = orders_.find(r->order);
  if (it == orders_.end() || !it->second.reclaim) {
    return absl::NotFoundError(absl::StrFormat("ReadersDone: reclaim order %d unknown", r->order));
  }
  WireOrder& o = it->second;
  if (!reclaim_orders_.count(o.reclaim_id)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("ReadersDone: reclaim order %d was aborted by a failed backup", r->order));
  }
  if (!o.withdrawn) {  // e.g. a population copy into one of its pages has not reported yet: hold it
    o.readers_done = true;
    return std::string();
  }
  if (absl::Status s = core_->OnReadersDone(o.reclaim_id); !s.ok()) return s;
  return std::string();
}

absl::StatusOr<std::string> Daemon::OnReadyPublish(const Message& m) {
  auto r = ReadReadyPublish(m);
  if (!r.ok()) return r.status();
  auto it = orders_.find(r->order);
  if (it == orders_.end() || it->second.reclaim) {
    return absl::NotFoundError(absl::StrFormat("ReadyPublish: populate order %d unknown", r->order));
  }
  WireOrder& o = it->second;
  std::vector<PageIndex> pages = r->pages;
  if (pages.empty()) {
    for (const auto& [page, copy] : o.copies) pages.push_back(page);
  }
  for (PageIndex p : pages) {
    auto c = o.copies.find(p);
    if (c == o.copies.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ReadyPublish: page %d is not a page of populate order %d", p, r->order));
    }
    const CopyId copy = c->second;
    o.copies.erase(c);
    if (absl::Status s = core_->OnPopulateDone(copy, r->ok); !s.ok()) return s;
  }
  if (o.copies.empty()) orders_.erase(it);
  return std::string();
}

absl::StatusOr<std::string> Daemon::OnComplete(const Message& m) {
  auto c = ReadComplete(m);
  if (!c.ok()) return c.status();
  auto info = requests_.find(c->request);
  if (info == requests_.end()) return absl::NotFoundError(absl::StrFormat("Complete: request %d unknown", c->request));
  uint32_t released = 0;
  if (const GpuPageTable* t = core_->gpu_table(info->second.gpu)) {
    for (PageIndex p = 0; p < t->pages(); ++p) released += t->owner(p) == c->request;
  }
  if (absl::Status s = core_->Complete(c->request); !s.ok()) return s;
  gpus_[info->second.gpu].used_slots.erase(info->second.slot);
  requests_.erase(info);
  wire::CompleteAckT ack;
  ack.request = c->request;
  ack.released_pages = released;
  return EncodeCompleteAck(ack, m.sequence, kSender);
}

absl::StatusOr<std::string> Daemon::OnIntrospect(const Message& m) {
  auto q = ReadIntrospectQuery(m);
  if (!q.ok()) return q.status();
  const StateDump dump = core_->Dump();
  const DumpView view = ViewOf(*q);
  wire::IntrospectReplyT reply;
  reply.what = q->what;
  reply.format = q->format;
  reply.document = q->format == wire::IntrospectFormat::Json ? DumpToJson(dump, view).dump(2) + "\n"
                                                             : DumpToTable(dump, view);
  return EncodeIntrospectReply(reply, m.sequence, kSender);
}

// ---------------------------------------------------------------- orders -> wire

void Daemon::FlushOrders() {
  struct Out {
    GpuId gpu = 0;
    uint64_t sequence = 0;
    std::variant<wire::AdmitGrantT, wire::AdmitWaitT, wire::AdmitRejectT, wire::ReclaimOrderT, wire::PopulateOrderT,
                 wire::RetireT>
        body;
  };
  std::vector<Out> out;
  std::map<std::pair<GpuId, RequestId>, size_t> populate_out;  // this flush's wire PopulateOrder per request
  std::map<ReclaimId, size_t> reclaim_out;                     // this flush's wire ReclaimOrder per reclaim
  while (!core_->outbox().empty()) {
    for (Order& order : core_->DrainOrders()) {
      if (auto* g = std::get_if<GrantOrder>(&order)) {
        wire::AdmitGrantT w;
        w.request = g->request;
        w.slot = g->slot;
        w.required_pages = g->required_pages;
        w.optional_pages = g->history_gpu_pages;
        for (uint32_t h = 0; h < g->history_gpu_pages.size(); ++h) w.optional_history_pages.push_back(h);
        for (PageIndex hp : g->context_host_pages) w.backup_host_pages.push_back(HostRef(hp));
        out.push_back({g->gpu, requests_[g->request].admit_sequence, std::move(w)});
      } else if (auto* wt = std::get_if<WaitOrder>(&order)) {
        wire::AdmitWaitT w;
        w.request = wt->request;
        w.queue_position = wt->queue_position;
        w.deficit_pages = wt->deficit_pages;
        out.push_back({wt->gpu, requests_[wt->request].admit_sequence, std::move(w)});
      } else if (auto* rj = std::get_if<RejectOrder>(&order)) {
        wire::AdmitRejectT w;
        w.request = rj->request;
        w.code = ToWireError(rj->error);
        w.reason = std::string(rj->error.message());
        auto info = requests_.find(rj->request);
        const uint64_t seq = info == requests_.end() ? 0 : info->second.admit_sequence;
        if (info != requests_.end()) {
          gpus_[info->second.gpu].used_slots.erase(info->second.slot);
          requests_.erase(info);
        }
        out.push_back({rj->gpu, seq, std::move(w)});
      } else if (auto* rs = std::get_if<ReclaimStartOrder>(&order)) {
        const uint64_t id = next_order_++;
        WireOrder& wo = orders_[id];
        wo.gpu = rs->gpu;
        wo.request = rs->request;
        wo.reclaim_id = rs->reclaim;
        reclaim_orders_[rs->reclaim] = id;
        wire::ReclaimOrderT w;
        w.order = id;
        w.gpu = rs->gpu;
        w.request = rs->request;
        w.pages = rs->gpu_pages;
        reclaim_out[rs->reclaim] = out.size();
        out.push_back({rs->gpu, next_sequence_++, std::move(w)});
      } else if (auto* b = std::get_if<BackupOrder>(&order)) {
        auto rc = reclaim_out.find(b->reclaim);
        if (b->reclaim == 0 || rc == reclaim_out.end()) {  // tail backups are the worker's own (contract §3)
          spdlog::error("memd: backup order of request {} outside a reclaim start; not sent", b->request);
          continue;
        }
        auto& w = std::get<wire::ReclaimOrderT>(out[rc->second].body);
        w.backup_pages.push_back(b->gpu_page);
        w.backup_targets.push_back(HostRef(b->host_page));
        orders_[w.order].copies[b->gpu_page] = b->copy;
      } else if (auto* p = std::get_if<PopulateOrder>(&order)) {
        auto [slot, fresh] = populate_out.try_emplace({p->gpu, p->request}, out.size());
        if (fresh) {
          const uint64_t id = next_order_++;
          WireOrder& wo = orders_[id];
          wo.reclaim = false;
          wo.gpu = p->gpu;
          wo.request = p->request;
          wire::PopulateOrderT w;
          w.order = id;
          w.gpu = p->gpu;
          w.request = p->request;
          out.push_back({p->gpu, next_sequence_++, std::move(w)});
        }
        auto& w = std::get<wire::PopulateOrderT>(out[slot->second].body);
        w.pages.push_back(p->gpu_page);
        w.history_pages.push_back(p->history_page);
        w.host_pages.push_back(HostRef(p->host_page));
        orders_[w.order].copies[p->gpu_page] = p->copy;
      } else if (auto* wd = std::get_if<WithdrawOrder>(&order)) {
        // Internal: the worker withdraws on its own after the backups (contract §4). Apply a held ReadersDone.
        auto id = reclaim_orders_.find(wd->reclaim);
        if (id == reclaim_orders_.end()) continue;
        WireOrder& o = orders_.at(id->second);
        o.withdrawn = true;
        if (o.readers_done) {
          if (absl::Status s = core_->OnReadersDone(wd->reclaim); !s.ok()) {
            spdlog::error("memd: held readers-done of reclaim {}: {}", wd->reclaim, std::string(s.message()));
          }
        }
      } else if (auto* rt = std::get_if<RetireOrder>(&order)) {
        auto id = reclaim_orders_.find(rt->reclaim);
        wire::RetireT w;
        w.order = id == reclaim_orders_.end() ? 0 : id->second;
        w.gpu = rt->gpu;
        w.request = rt->request;
        w.pages = rt->gpu_pages;
        if (id != reclaim_orders_.end()) {
          orders_.erase(id->second);
          reclaim_orders_.erase(id);
        }
        out.push_back({rt->gpu, next_sequence_++, std::move(w)});
      }
    }
  }
  // regranted_to: the admission of this flush whose required allocation took retired pages.
  for (Out& o : out) {
    auto* retire = std::get_if<wire::RetireT>(&o.body);
    if (!retire) continue;
    for (const Out& g : out) {
      const auto* grant = std::get_if<wire::AdmitGrantT>(&g.body);
      if (!grant || g.gpu != o.gpu) continue;
      const bool took = std::any_of(retire->pages.begin(), retire->pages.end(), [&](uint32_t p) {
        return std::find(grant->required_pages.begin(), grant->required_pages.end(), p) != grant->required_pages.end();
      });
      if (took) retire->regranted_to = grant->request;
    }
  }
  for (const Out& o : out) {
    const std::string bytes = std::visit(
        [&](const auto& body) -> std::string {
          using T = std::decay_t<decltype(body)>;
          if constexpr (std::is_same_v<T, wire::AdmitGrantT>) return EncodeAdmitGrant(body, o.sequence, kSender);
          if constexpr (std::is_same_v<T, wire::AdmitWaitT>) return EncodeAdmitWait(body, o.sequence, kSender);
          if constexpr (std::is_same_v<T, wire::AdmitRejectT>) return EncodeAdmitReject(body, o.sequence, kSender);
          if constexpr (std::is_same_v<T, wire::ReclaimOrderT>) return EncodeReclaimOrder(body, o.sequence, kSender);
          if constexpr (std::is_same_v<T, wire::PopulateOrderT>) {
            return EncodePopulateOrder(body, o.sequence, kSender);
          }
          if constexpr (std::is_same_v<T, wire::RetireT>) return EncodeRetire(body, o.sequence, kSender);
        },
        o.body);
    SendToGpu(o.gpu, bytes);
  }
}

}  // namespace dhs::memd
