#include "memd/daemon.h"
#include "memd/record_wire.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include <algorithm>
#include <cstring>
#include <optional>
#include <variant>

#include "common/log_limiter.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/status.h"
#include "memd/cluster_keys.h"  // issue 26: SessionHash
#include "workerd/serving_mode.h"  // the serving modes a Hello may declare (workerd owns them)
#include "spdlog/spdlog.h"

namespace dhs::memd {
namespace {

// A peer's routing id as a log shows it: bytes outside printable ASCII escaped (a raw peer may send any id).
std::string Printable(std::string_view bytes) { return absl::CHexEscape(absl::string_view(bytes.data(), bytes.size())); }

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

// The Hello's page bytes and speculation totals (issue 13), what the core checks each admission's share against.
GpuDeclaration DeclarationOf(const wire::HelloT& hello) {
  return GpuDeclaration{hello.page_bytes, hello.draft_ring_bytes, hello.staging_bytes};
}

DumpView ViewOf(const wire::IntrospectQueryT& q) {
  DumpView v;
  switch (q.what) {
    case wire::IntrospectWhat::Status: v.kind = DumpView::Kind::kStatus; break;
    case wire::IntrospectWhat::Gpus: v.kind = DumpView::Kind::kGpus; break;
    case wire::IntrospectWhat::Requests: v.kind = DumpView::Kind::kRequests; break;
    case wire::IntrospectWhat::Request: v.kind = DumpView::Kind::kRequest; break;
    case wire::IntrospectWhat::Pages: v.kind = DumpView::Kind::kPages; break;
    case wire::IntrospectWhat::Queue: v.kind = DumpView::Kind::kQueue; break;
    case wire::IntrospectWhat::Timeline: break;  // answered before (OnIntrospect), never a dump view
    case wire::IntrospectWhat::Prefixes: v.kind = DumpView::Kind::kPrefixes; break;  // issue 24
  }
  v.request = q.request;
  v.gpu = q.gpu;
  v.from = q.page_from;
  v.count = q.page_count == 0 ? kDefaultPageRows : q.page_count;
  v.runs = q.page_runs;
  return v;
}

// What a dead memd left for this one: the verified journal's requests (confirmed host pages kept) and the granted
// requests of the record files that hold no host page (all their rows were lost, as FenceGpu loses them).
std::vector<AdoptedRequest> AdoptionList(const std::map<RequestId, JournaledRequest>& journaled,
                                         const std::map<RequestId, JournaledRecord>& records) {
  std::vector<AdoptedRequest> out;
  for (const auto& [id, jr] : journaled) {
    out.push_back({id, GpuOfNodeRequestId(id), EpochOfNodeRequestId(id), jr.context_pages, jr.confirmed,
                   jr.checksums});
  }
  // A record without journaled pages: granted with nothing confirmed, or still queued (a resume waiting for host
  // pages, or a new request): interrupted with nothing kept, so the next worker resumes it from its tokens.
  for (const auto& [id, rec] : records) {
    if (journaled.contains(id)) continue;
    out.push_back({id, GpuOfNodeRequestId(id), EpochOfNodeRequestId(id), rec.granted ? rec.context_pages : 0, {}, {}});
  }
  // Issue 24: a granted request's prefix chain (its record's), so that it holds its shared prefix pages again.
  for (AdoptedRequest& a : out) {
    const auto rec = records.find(a.request);
    if (rec == records.end() || !rec->second.granted || rec->second.record.chain_ids.empty()) continue;
    const RequestRecord& r = rec->second.record;
    a.prefix = PrefixChain{r.tenant, r.chain_ids, r.chain_digests, r.chain_block_tokens};
    a.page_rows = r.chain_page_rows;
  }
  return out;
}

absl::Status CheckOptions(const DaemonOptions& options) {
  if (options.run_dir.empty()) return absl::InvalidArgumentError("--run-dir is empty");
  if (options.page_bytes == 0 || options.page_bytes % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("page bytes must be a positive multiple of 64, got %d", options.page_bytes));
  }
  if (options.host_pool_pages == 0) return absl::InvalidArgumentError("the host pool needs at least one page");
  if (options.worker_timeout.count() <= 0) return absl::InvalidArgumentError("the worker timeout must be > 0 ms");
  if (options.populate_pages_per_attempt == 0) {
    return absl::InvalidArgumentError("populate_pages_per_attempt must be at least 1 (0 would never populate)");
  }
  if (options.kv_events && !options.prefix_sharing) {  // issue 24: the stream tells what the host tier stores
    return absl::InvalidArgumentError("--kv-events on needs --prefix-sharing on (the events are the host tier's)");
  }
  if (!options.cluster_store.empty() && !options.prefix_sharing) {  // issue 26: it shares the host tier's pages
    return absl::InvalidArgumentError("--cluster-store needs --prefix-sharing on (the tier shares prefix pages)");
  }
  return absl::OkStatus();
}

// Issue 26: the cluster tier (nullptr without --cluster-store). Its clients connect lazily: an unreachable store is
// a miss, never a failed start; a bad store spec is InvalidArgument.
absl::StatusOr<std::unique_ptr<ClusterTier>> StartClusterTier(const DaemonOptions& options) {
  if (options.cluster_store.empty()) return std::unique_ptr<ClusterTier>();
  ClusterTierOptions co;
  co.store = options.cluster_store;
  co.lookup_timeout = options.cluster_lookup_timeout;
  return ClusterTier::Start(co);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& in) {
  DaemonOptions options = in;
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  // Every socket of the node must fit sun_path, the workers' too: checked before anything is created.
  if (absl::Status s = CheckSocketPaths(options.run_dir); !s.ok()) return s;
  if (absl::Status s = MakeRunDir(options.run_dir); !s.ok()) return s;
  std::error_code ec;
  const std::string canonical = std::filesystem::canonical(options.run_dir, ec).string();
  if (ec) return absl::InternalError(absl::StrFormat("run directory %s: %s", options.run_dir, ec.message()));
  if (options.segment_name.empty()) options.segment_name = PoolSegmentName(canonical);
  // The socket first: a live memd of this run directory makes this one fail before its pool is touched.
  RouterServer::Options router_options;
  auto router = RouterServer::Bind(options.run_dir, "memd", router_options);
  if (!router.ok()) return router.status();
  RemoveStaleSegments(options.segment_name, options.unreadable_segment_age);
  // The pool before the core: one larger than the free /dev/shm fails at once (HostPoolSegment::Create checks the
  // free space), before the core spends seconds building its host-page allocator for millions of pages.
  auto pool = OpenPool(options.segment_name, canonical, options.page_bytes, options.host_pool_pages,
                       options.replace_host_pool);
  if (!pool.ok()) {
    return absl::Status(pool.status().code(),
                        absl::StrFormat("cannot create the host pool (%d pages x %d bytes = %d bytes in "
                                        "/dev/shm/%s): %s",
                                        options.host_pool_pages, options.page_bytes,
                                        uint64_t{options.host_pool_pages} * options.page_bytes, options.segment_name,
                                        pool.status().message()));
  }
  auto journal = std::make_unique<HostJournal>(*pool->journal);
  auto remove_segment = [&] {  // a failed start removes a pool it created, never one it was to adopt
    pool->segment.reset();
    if (pool->reused) return;
    if (absl::Status s = HostPoolSegment::Remove(options.segment_name); !s.ok()) {
      spdlog::warn("memd: {}", std::string(s.message()));
    }
  };
  auto record_journal = RecordJournal::Create(options.run_dir);
  if (!record_journal.ok()) {
    remove_segment();
    return record_journal.status();
  }
  ResidencyConfig config;
  config.reserve_pages = options.reserve_pages;
  config.host_pages = options.host_pool_pages;
  config.host_page_bytes = options.page_bytes;
  config.populate_pages_per_attempt = options.populate_pages_per_attempt;
  config.reclaim_policy = options.reclaim_policy;
  config.prefix_sharing = options.prefix_sharing;  // issue 24
  config.prefix = PrefixConfig{options.prefix_eviction, options.prefix_tenant_quota_pages, options.kv_events,
                               !options.cluster_store.empty()};  // issue 26: the cluster tier publishes confirmed pages
  std::unique_ptr<KvEventPublisher> kv_events;  // issue 24: bound after memd.sock (a live memd has failed by now)
  if (options.kv_events) {
    auto bound = KvEventPublisher::Bind(options.run_dir, {options.kv_events_hwm, canonical});
    if (!bound.ok()) {
      remove_segment();
      return bound.status();
    }
    kv_events = std::move(*bound);
  }
  auto cluster = StartClusterTier(options);  // issue 26: null when off
  if (!cluster.ok()) {
    remove_segment();
    return cluster.status();
  }
  auto core = ResidencyManager::Create(config, NowUs, journal.get());
  if (!core.ok()) {
    remove_segment();
    return core.status();
  }
  std::unique_ptr<Daemon> d(new Daemon(std::move(options), std::move(pool->segment), std::move(journal),
                                       std::move(*router), std::move(*core), std::move(*record_journal)));
  if (absl::Status s = d->AdoptLeftovers(pool->adopted, pool->reused, pool->shared); !s.ok()) {
    d->keep_pool_ = pool->reused;  // a failed start never removes a pool it was to adopt (nor its records)
    return s;
  }
  d->kv_events_ = std::move(kv_events);
  d->cluster_ = std::move(*cluster);
  d->PublishKvEvents();  // the stream's first event: AllBlocksCleared (memd/kv_block_ledger.h)
  d->PublishMetrics();
  return d;
}

absl::Status Daemon::AdoptLeftovers(const std::map<RequestId, JournaledRequest>& journaled, bool reused,
                                    const std::map<PageIndex, JournaledSharedPage>& shared) {
  // Records are kept even when the pool was replaced (other geometry, a journal that did not verify): their requests
  // come back interrupted with nothing kept, and the next worker resumes them by recomputing from their tokens.
  std::map<RequestId, JournaledRecord> records = record_journal_.LoadAll();
  std::erase_if(records, [&](const auto& e) {
    const bool fits = e.second.context_pages <= options_.host_pool_pages;
    if (!fits) spdlog::warn("memd: the record of request {} is dropped: its {} context pages exceed the host pool", e.first,
                            e.second.context_pages);
    return !fits;
  });
  const std::vector<AdoptedRequest> adopted = AdoptionList(journaled, records);
  // Issue 26: the models that wrote what is adopted: those of the GPUs with adopted requests and, with shared pages
  // adopted, every GPU's (the node's one model); the rest is forgotten (memd/model_journal.h).
  absl::StatusOr<ModelFingerprints> models = model_journal_.Load();
  if (!models.ok()) {
    spdlog::warn("memd: {}: {}; the models of the adopted host pages are not known (the next workers set them)",
                 model_journal_.path(), models.status().ToString());
    models = ModelFingerprints{};
  }
  std::set<GpuId> adopted_gpus;
  for (const AdoptedRequest& a : adopted) adopted_gpus.insert(a.gpu);
  const bool shared_adopted = reused && !shared.empty();
  std::erase_if(*models, [&](const auto& e) { return !shared_adopted && !adopted_gpus.contains(e.first); });
  models_ = *models;
  if (absl::Status s = model_journal_.Save(models_); !s.ok()) spdlog::warn("memd: {}", s.ToString());
  std::vector<AdoptedSharedPage> shared_pages;  // issue 24: the journal's shared prefix pages (cached again)
  for (const auto& [page, sp] : shared) shared_pages.push_back({page, sp.key, sp.content, sp.checksum});
  if (absl::Status s = reused || !adopted.empty() ? core_->AdoptHostPages(adopted, shared_pages) : absl::OkStatus();
      !s.ok()) {
    // A bug (Verify checked what AdoptHostPages checks); nothing was adopted, the next start begins afresh.
    return absl::InternalError(absl::StrFormat("adopting the journal of /dev/shm/%s failed (%s); it is removed",
                                               segment_->name(), s.message()));
  }
  if (!reused && !adopted.empty()) {
    spdlog::warn("memd: the host pool was not adopted; {} requests with a record come back interrupted with no host "
                 "page kept (their workers recompute them)", adopted.size());
    DHS_CHECK_OK(core_->ReleaseHeldPages());  // a new pool: no worker of a dead memd writes into it; never fails
  }
  std::erase_if(records, [&](const auto& e) { return !core_->GpuOfRequest(e.first).has_value(); });
  record_journal_.RemoveAllBut(records);
  for (auto& [id, rec] : records) {
    if (absl::Status s = records_.Open(id, std::move(rec.record)); !s.ok()) {
      spdlog::warn("memd: the record of adopted request {} is not kept: {}", id, s.ToString());
      record_journal_.Release(id);
    }
  }
  if (reused) {  // the other host pages are held until the dead memd's workers surely stopped writing
    spdlog::warn("memd: adopted {} interrupted requests ({} with a record) from a previous memd of this run directory; "
                 "the other host pages are reusable in {} ms (--adopt-grace-ms)", adopted.size(), records_.size(),
                 options_.adopt_grace.count());
    for (const AdoptedRequest& a : adopted) adopt_waiting_gpus_.insert(a.gpu);  // every journaled request is in it
    release_held_at_ = std::chrono::steady_clock::now() + options_.adopt_grace;
    if (adopt_waiting_gpus_.empty()) ReleaseHeldNow("the journal names no page: no worker of the dead memd writes");
  }
  return absl::OkStatus();
}

Daemon::Daemon(DaemonOptions options, std::unique_ptr<HostPoolSegment> segment, std::unique_ptr<HostJournal> journal,
               std::unique_ptr<RouterServer> router, std::unique_ptr<ResidencyManager> core,
               RecordJournal record_journal)
    : options_(std::move(options)),
      segment_(std::move(segment)),
      journal_(std::move(journal)),
      router_(std::move(router)),
      core_(std::move(core)),
      server_(std::make_unique<Server>(router_.get(), kSender)),
      record_journal_(std::move(record_journal)),
      model_journal_(options_.run_dir) {
  next_tick_ = std::chrono::steady_clock::now() + options_.tick;
  next_retry_ = std::chrono::steady_clock::now() + options_.retry_period;
  Register();
}

Daemon::~Daemon() {
  server_.reset();
  router_.reset();  // removes memd.sock
  const std::string name = segment_->name();
  // Cached prefix pages (issue 24) are held by no request: a clean stop drops them with the pool (the cache survives
  // a crash, whose segment the next memd adopts, not a clean stop of a run directory that may be deleted next).
  const uint32_t held = core_->host().allocated() - (core_->prefix() != nullptr ? core_->prefix()->cached() : 0);
  segment_.reset();
  if (keep_pool_) {
    spdlog::info("memd: /dev/shm/{} kept for the next memd of this run directory (this start failed)", name);
    return;
  }
  if (held > 0) {  // interrupted (or live) requests hold host copies: the next memd of this run directory adopts them
    spdlog::info("memd: /dev/shm/{} kept for the next memd of this run directory: {} host pages of {} requests",
                 name, held, core_->Dump(DumpDetail::kCounts).request_count);
    return;
  }
  record_journal_.RemoveAllBut({});
  if (absl::Status s = HostPoolSegment::Remove(name); !s.ok()) spdlog::warn("memd: {}", std::string(s.message()));
}

std::string Daemon::metrics() const {
  std::lock_guard<std::mutex> lock(metrics_mu_);
  return metrics_;
}

void Daemon::PublishMetrics() {
  counters_.workers = std::count_if(gpus_.begin(), gpus_.end(), [&](const auto& g) { return !core_->fenced(g.first); });
  if (kv_events_) {  // issue 24
    kv_events_->Poll();
    counters_.kv_events = true;
    counters_.kv_events_published = kv_events_->published();
    counters_.kv_events_dropped = kv_events_->dropped();
    counters_.kv_event_subscriptions = kv_events_->subscriptions();
  }
  if (cluster_) counters_.cluster = cluster_->Stats();  // issue 26
  // Counts only: a full dump is O(M + context pages) and would stall the loop on every tick (issue 14).
  std::string text = RenderPrometheus(core_->Dump(DumpDetail::kCounts), core_->counters(), counters_);
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
  CheckDisconnects();
  if (!closing_.empty()) {  // a worker's connection closed: the messages it sent before are served first
    for (int i = 0; i < 4096; ++i) {
      auto more = server_->ServeOnce(std::chrono::milliseconds(0));
      if (!more.ok()) return more.status();
      if (!*more) break;
    }
    FenceClosed();
  }
  auto served = server_->ServeOnce(timeout);
  if (!served.ok()) return served.status();
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_tick_) {  // the metrics snapshot is refreshed here too (a dump per message would cost the loop)
    next_tick_ = now + options_.tick;
    Tick();
  }
  return absl::OkStatus();
}

void Daemon::ReleaseHeldNow(std::string_view why) {
  release_held_at_.reset();
  adopt_waiting_gpus_.clear();
  spdlog::info("memd: the host pages held since the adoption are reusable: {}", why);
  DHS_CHECK_OK(core_->ReleaseHeldPages());  // an event without input cannot be refused
}

void Daemon::Tick() {
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_retry_) {
    next_retry_ = now + options_.retry_period;
    DHS_CHECK_OK(core_->RetryBackups());  // events without input cannot be refused
  }
  CheckSilentWorkers();
  if (release_held_at_ && now >= *release_held_at_) ReleaseHeldNow("--adopt-grace-ms passed");
  DHS_CHECK_OK(core_->Populate());
  FlushOrders();
  PublishMetrics();
}

// Precondition: `gpu` is registered and up (FlushOrders drops the orders of a fenced GPU). An order that cannot be
// delivered fences the GPU: its worker would act on a state memd no longer has.
void Daemon::SendToGpu(GpuId gpu, const std::string& bytes) {
  if (absl::Status s = router_->Reply(gpus_.at(gpu).peer, bytes); !s.ok()) {
    ++counters_.send_failures;
    Fence(gpu, absl::StrCat("an order could not be sent to it: ", s.message()));
  }
}

void Daemon::ReplyNotDelivered(std::string_view peer, const absl::Status& why) {
  for (const auto& [gpu, g] : gpus_) {
    if (core_->fenced(gpu) || g.peer != peer) continue;
    ++counters_.send_failures;
    Fence(gpu, absl::StrCat("a reply could not be sent to it: ", why.message()));
    return;
  }
  DHS_LOG_LIMITED(spdlog::level::warn, "memd: reply to '{}' not delivered: {}", Printable(peer),
                  why.ToString());
}

// ---------------------------------------------------------------- liveness and fencing

void Daemon::Fence(GpuId gpu, const std::string& why) {
  auto it = gpus_.find(gpu);
  if (it == gpus_.end() || core_->fenced(gpu)) return;
  const GpuInfo& g = it->second;
  ++counters_.workers_lost;
  spdlog::warn("memd: worker of GPU {} (pid {}, epoch {}) lost: {}; GPU {} fenced", gpu, g.pid, core_->epoch(gpu), why,
               gpu);
  if (absl::Status s = core_->FenceGpu(gpu, why); !s.ok()) {
    spdlog::error("memd: fence of GPU {}: {}", gpu, s.ToString());
  }
  for (RequestId r : core_->InterruptedRequests(gpu)) {
    if (const RequestTimeline* t = timelines_.Find(r); t != nullptr && !t->ended) {
      Note(r, TimelineEvent::kInterrupted, 0, why);
    }
  }
  FlushOrders();  // now: a Hello that re-registers the GPU next must not receive the old epoch's rejects
}

void Daemon::CheckDisconnects() {
  for (uint64_t connection : router_->TakeDisconnected()) {  // each close names its own connection (issue 22)
    for (auto& [gpu, g] : gpus_) {
      if (core_->fenced(gpu) || g.connection != connection) continue;
      closing_.emplace_back(gpu, connection);
    }
  }
}

void Daemon::FenceClosed() {
  for (const auto& [gpu, connection] : std::exchange(closing_, {})) {
    auto g = gpus_.find(gpu);
    // A message read after the close still names the closed connection (ConnectionTable::Of), so only a Hello on a
    // new connection moves the GPU away from it.
    if (g == gpus_.end() || core_->fenced(gpu) || g->second.connection != connection) continue;
    Fence(gpu, absl::StrFormat("its connection closed (the process exited, or answered no ZMTP heartbeat for %d ms)",
                               options_.worker_timeout.count()));
  }
}

void Daemon::CheckSilentWorkers() {
  const auto now = std::chrono::steady_clock::now();
  for (auto& [gpu, g] : gpus_) {
    if (core_->fenced(gpu) || now - g.last_heard <= options_.worker_timeout) continue;
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - g.last_heard);
    Fence(gpu, absl::StrFormat("no message for %d ms (heartbeat timeout %d ms): hung or dead", silent.count(),
                               options_.worker_timeout.count()));
  }
}

absl::Status Daemon::Heard(std::string_view peer, wire::Body type) {
  for (auto& [gpu, g] : gpus_) {
    if (g.peer != peer) continue;
    if (!core_->fenced(gpu)) {
      g.last_heard = std::chrono::steady_clock::now();
      g.connection = server_->source_connection();
      return absl::OkStatus();
    }
    if (type == wire::Body::Hello || type == wire::Body::IntrospectQuery) return absl::OkStatus();
    ++counters_.fenced_refused;
    DHS_LOG_LIMITED(spdlog::level::warn, "memd: {} from the fenced worker of GPU {} refused", BodyName(type), gpu);
    return FencedError(absl::StrFormat(
        "the worker of GPU %d (epoch %d) was fenced (%s); its grants and orders are void: say Hello again "
        "(a new epoch)", gpu, core_->epoch(gpu), core_->FenceReason(gpu)));
  }
  // A worker's routing id that said no Hello to this memd: a worker of an earlier memd (memd restarted under it).
  // (An AdmitRequest is answered by OnAdmit with AdmitReject "send Hello first".)
  if (peer.starts_with("worker/") && type != wire::Body::Hello && type != wire::Body::IntrospectQuery &&
      type != wire::Body::AdmitRequest) {
    ++counters_.fenced_refused;
    DHS_LOG_LIMITED(spdlog::level::warn, "memd: {} from '{}', which said no Hello to this memd, refused",
                    BodyName(type), Printable(peer));
    return FencedError(absl::StrFormat(
        "'%s' said no Hello to this memd (pid %d; memd restarted?): nothing of an earlier memd is valid, "
        "say Hello (a new epoch)", peer, getpid()));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- handlers

// The messages memd does not serve (docs/protocol.md): each is answered UNKNOWN_MESSAGE "memd does not serve <Name>",
// not counted and not heard (liveness). Receive handles the rest of the union; ReceiveMessage checks at compile time
// that the two cover it.
using NotForMemd =
    MessageSet<wire::Body::HelloReply, wire::Body::AdmitGrant, wire::Body::AdmitWait, wire::Body::AdmitReject,
               wire::Body::ReclaimOrder, wire::Body::Retire, wire::Body::PopulateOrder, wire::Body::CompleteAck,
               wire::Body::ErrorReply, wire::Body::IntrospectReply, wire::Body::SubmitRequest,
               wire::Body::SubmitAccepted, wire::Body::TokenChunk, wire::Body::WorkerStatsQuery,
               wire::Body::WorkerStatsReply, wire::Body::Attach, wire::Body::TokensCommittedAck, wire::Body::Cancel>;

void Daemon::Register() {
  server_->OnReplyFailure([this](std::string_view peer, const absl::Status& why) { ReplyNotDelivered(peer, why); });
  for (wire::Body type : kWireMessages) {  // every member of the union: Receive serves it or refuses it
    server_->On(type, [this](const Message& m, std::string_view peer) { return Receive(m, peer); });
  }
}

absl::StatusOr<std::string> Daemon::Receive(const Message& m, std::string_view peer) {
  // One overload per message memd serves. Each is counted, checks the connections and the sender's liveness first
  // (Heard: a fenced worker's message is refused, nothing else done), and flushes the core's orders after its handler
  // (also on error: an event refused changes nothing, but the outbox stays empty).
  struct Served {
    Daemon& d;
    const Message& m;
    std::string_view peer;
    absl::StatusOr<std::string> reply = std::string();
    void operator()(const wire::HelloT& b) { Serve([&] { return d.OnHello(b, m, peer); }); }
    void operator()(const wire::AdmitRequestT& b) { Serve([&] { return d.OnAdmit(b, m, peer); }); }
    void operator()(const wire::BackupCompleteT& b) { Serve([&] { return d.OnBackupComplete(b, m, peer); }); }
    void operator()(const wire::HostCopyWrittenT& b) { Serve([&] { return d.OnHostCopyWritten(b, m, peer); }); }
    void operator()(const wire::ReadersDoneT& b) { Serve([&] { return d.OnReadersDone(b, m, peer); }); }
    void operator()(const wire::ReadyPublishT& b) { Serve([&] { return d.OnReadyPublish(b, m, peer); }); }
    void operator()(const wire::TokensCommittedT& b) { Serve([&] { return d.OnTokensCommitted(b, m, peer); }); }
    void operator()(const wire::CompleteT& b) { Serve([&] { return d.OnComplete(b, m, peer); }); }
    void operator()(const wire::IntrospectQueryT& b) { Serve([&] { return d.OnIntrospect(b, m); }); }
    void operator()(const wire::HeartbeatT& hb) {
      Serve([&]() -> absl::StatusOr<std::string> {
        wire::HeartbeatAckT ack;
        ack.sender_time_ns = hb.sender_time_ns;
        ack.receiver_time_ns = NowNs();
        return EncodeHeartbeatAck(ack, m.sequence, kSender);
      });
    }
    void operator()(const wire::HeartbeatAckT&) {
      Serve([]() -> absl::StatusOr<std::string> { return std::string(); });
    }

    void Serve(absl::FunctionRef<absl::StatusOr<std::string>()> handler) {
      ++d.counters_.messages;
      d.CheckDisconnects();  // first: a new connection may reuse the descriptor of one that just closed
      if (absl::Status s = d.Heard(peer, m.type); !s.ok()) {
        reply = s;
        return;
      }
      reply = handler();
      d.FlushOrders();
    }
  } served{*this, m, peer};
  const absl::Status read = ReceiveMessage<NotForMemd>(m, served, [&](wire::Body type) {
    served.reply = UnknownMessageError(absl::StrCat(kSender, " does not serve ", BodyName(type)));
  });
  if (!read.ok()) return read;
  return std::move(served.reply);
}

absl::StatusOr<std::string> Daemon::OnHello(const wire::HelloT& hello, const Message& m, std::string_view peer) {
  wire::HelloReplyT reply;
  reply.worker_timeout_ms = static_cast<uint32_t>(std::min<int64_t>(options_.worker_timeout.count(), UINT32_MAX));
  std::string reason = HelloRefusal(hello, peer);
  if (reason.empty()) {
    // a worker that survived a memd restart: its epoch and requests go on; else a new epoch starts
    reason = hello.rehello ? ReHello(hello, reply) : StartEpoch(hello);
  }
  if (!reason.empty()) {
    spdlog::warn("memd: Hello of GPU {} refused: {}", hello.gpu, reason);
    reply.accepted = false;
    reply.reason = reason;
    return EncodeHelloReply(reply, m.sequence, kSender);
  }
  KeepWorker(hello, peer);
  reply.accepted = true;
  reply.worker_epoch = core_->epoch(hello.gpu);
  if (release_held_at_ && adopt_waiting_gpus_.erase(hello.gpu) > 0 && adopt_waiting_gpus_.empty()) {
    // A worker says Hello only once its GPU's previous worker stopped serving (its socket is checked first) or, after
    // a memd restart, resolved the dead memd's orders (re-Hello): nothing of the dead memd writes any more.
    ReleaseHeldNow("every GPU the journal names registered with this memd");
  }
  AddHelloRecords(hello, reply);
  spdlog::info("memd: worker of GPU {} (pid {}, {}) registered: M = {} pages, p = {} rows, epoch {}, {} interrupted "
               "requests", hello.gpu, hello.pid, hello.device_name, hello.capacity_pages, hello.page_rows,
               reply.worker_epoch, reply.interrupted_requests.size());
  if (!reply.interrupted_requests.empty()) {
    spdlog::info("memd: GPU {}: {} of its {} interrupted requests have a record to resume from", hello.gpu,
                 reply.interrupted_records.size(), reply.interrupted_requests.size());
  }
  reply.segments.push_back(HostSegmentInfo());
  return EncodeHelloReply(reply, m.sequence, kSender);
}

std::string Daemon::HelloRefusal(const wire::HelloT& hello, std::string_view peer) {
  auto known = gpus_.find(hello.gpu);
  if (peer != absl::StrCat("worker/", hello.gpu)) {  // a client must not take a GPU's role (and its orders) over
    ++counters_.refused_peers;
    return absl::StrFormat("a Hello of GPU %d must come from the routing id worker/%d, not '%s'", hello.gpu,
                           hello.gpu, peer);
  }
  if (hello.host_page_bytes != options_.page_bytes) {
    return absl::StrFormat("host_page_bytes %d differs from memd's host pool page size %d (memd --page-bytes)",
                           hello.host_page_bytes, options_.page_bytes);
  }
  if (hello.capacity_pages == 0 || hello.page_rows == 0) return "capacity_pages and page_rows must be > 0";
  if (!hello.serving_mode.empty() && !ParseWorkerMode(hello.serving_mode).ok()) {
    // Shown in the status view (JSON strings must be UTF-8) and table: only workerd's modes, or none (older worker).
    return absl::StrFormat("serving_mode '%s' is not %s (or empty: an older worker)",
                           Printable(std::string_view(hello.serving_mode).substr(0, 64)), WorkerModeList());
  }
  if (known != gpus_.end() && known->second.capacity_pages != hello.capacity_pages) {
    return absl::StrFormat("GPU %d was registered with M = %d pages; a restarted worker must keep it (got %d)",
                           hello.gpu, known->second.capacity_pages, hello.capacity_pages);
  }
  return ModelRefusal(hello);
}

std::string Daemon::ModelRefusal(const wire::HelloT& hello) const {
  // Rows of one model are wrong rows for another (issue 26): a restarted worker must serve its GPU's model (its
  // interrupted requests resume from host pages that model wrote), and with prefix sharing every GPU of the node
  // must serve one model (the host tier's pages are addressed by tokens, not by model). 0 = a worker that does not
  // say (an older worker, libdhs): not compared.
  // models_ holds every GPU's model said since this memd started, and from before a restart the models of the host
  // pages it adopted (memd/model_journal.h).
  if (hello.model_fingerprint == 0) return "";
  for (const auto& [gpu, model] : models_) {
    if (model == hello.model_fingerprint) continue;
    if (gpu == hello.gpu) {
      return absl::StrFormat("GPU %d was registered with model %016x; a restarted worker must serve it (got %016x): "
                             "the host pages memd holds of it (its interrupted requests', or with prefix sharing the "
                             "node's shared prefix pages) hold that model's rows (to change the model, start the node "
                             "with a fresh run directory, or restart memd once none are left: a restarted memd keeps "
                             "a model only while it holds host pages of it)", gpu, model,
                             hello.model_fingerprint);
    }
    if (options_.prefix_sharing) {
      return absl::StrFormat("GPU %d serves model %016x and this worker model %016x: with --prefix-sharing on every "
                             "GPU of a node must serve one model (the shared host tier is addressed by tokens)",
                             gpu, model, hello.model_fingerprint);
    }
  }
  return "";
}

std::string Daemon::StartEpoch(const wire::HelloT& hello) {
  auto known = gpus_.find(hello.gpu);
  if (known != gpus_.end() && !core_->fenced(hello.gpu)) {  // a restarted worker: the previous epoch ends here
    Fence(hello.gpu, absl::StrFormat("a new Hello for GPU %d (pid %d): the previous worker (pid %d) is gone",
                                      hello.gpu, hello.pid, known->second.pid));
  }
  if (absl::Status s = core_->RegisterGpu(hello.gpu, hello.capacity_pages, hello.request_slots, DeclarationOf(hello));
      !s.ok()) {
    return std::string(s.message());
  }
  return "";
}

void Daemon::KeepWorker(const wire::HelloT& hello, std::string_view peer) {
  GpuInfo& g = gpus_[hello.gpu];
  g.peer = std::string(peer);
  g.page_rows = hello.page_rows;
  g.capacity_pages = hello.capacity_pages;
  g.pid = hello.pid;
  g.shape = WorkerShapeOf(hello);
  g.model_fingerprint = hello.model_fingerprint;
  if (hello.model_fingerprint != 0) KeepModel(hello.gpu, hello.model_fingerprint);
  g.connection = server_->source_connection();
  g.last_heard = std::chrono::steady_clock::now();
  ++counters_.hellos;
}

void Daemon::KeepModel(GpuId gpu, uint64_t model) {
  auto [it, inserted] = models_.try_emplace(gpu, model);
  if (!inserted && it->second == model) return;
  it->second = model;
  if (absl::Status s = model_journal_.Save(models_); !s.ok()) {
    spdlog::warn("memd: GPU {}'s model {:016x} is not journaled ({}): a restarted memd will not know it", gpu, model,
                 s.ToString());
  }
}

void Daemon::AddHelloRecords(const wire::HelloT& hello, wire::HelloReplyT& reply) {
  reply.interrupted_requests = core_->InterruptedRequests(hello.gpu);
  for (RequestId id : reply.interrupted_requests) {
    if (const RequestRecord* rec = records_.Find(id)) reply.interrupted_records.push_back(ToWireRecord(id, *rec));
  }
  if (!hello.rehello) {  // lost ends: the outputs the dead worker may not have delivered
    for (const auto& [id, rec] : records_.FinishedRecords(hello.gpu)) {
      reply.finished_records.push_back(ToWireRecord(id, rec));
    }
  }
}

std::unique_ptr<wire::HostSegmentInfoT> Daemon::HostSegmentInfo() const {
  auto seg = std::make_unique<wire::HostSegmentInfoT>();
  seg->name = segment_->name();
  seg->size_bytes = segment_->size_bytes();
  seg->page_bytes = segment_->page_bytes();
  seg->pages = static_cast<uint32_t>(segment_->pages());
  return seg;
}

std::string Daemon::ReHello(const wire::HelloT& hello, wire::HelloReplyT& reply) {
  if (hello.worker_epoch == 0 || hello.worker_epoch > UINT32_MAX) {
    return absl::StrFormat("a re-Hello needs the epoch of its grants (worker_epoch %d)", hello.worker_epoch);
  }
  std::vector<ReportedRequest> reports;
  for (const auto& w : hello.report) {
    ReportedRequest r{w->request, w->slot, w->required_pages, w->complete_pages, w->optional_history, {},
                      SpeculationShare{w->draft_ring_pages, w->staging_pages, w->draft_ring_bytes, w->staging_bytes}};
    for (const auto& p : w->history) {
      r.history.push_back({p->host_page, p->host_copy,
                           p->has_gpu_page ? std::optional<PageIndex>(p->gpu_page) : std::nullopt, p->checksum});
    }
    reports.push_back(std::move(r));
  }
  std::vector<absl::Status> outcomes;
  if (absl::Status s = core_->AdoptGpu(hello.gpu, hello.capacity_pages, hello.request_slots,
                                       static_cast<uint32_t>(hello.worker_epoch), reports, &outcomes,
                                       DeclarationOf(hello));
      !s.ok()) {
    return std::string(s.message());
  }
  for (size_t i = 0; i < reports.size(); ++i) {
    const RequestId id = reports[i].request;
    if (!outcomes[i].ok()) {
      reply.refused_reports.push_back(id);
      reply.refused_reasons.push_back(std::string(outcomes[i].message()));
      continue;
    }
    if (!hello.report[i]->record) continue;
    // The worker's record has every token it committed: it replaces the one the journal kept (if any).
    ReleaseRecord(id);
    absl::StatusOr<RequestRecord> record = FromWireRecord(*hello.report[i]->record, hello.gpu);
    absl::Status s = record.status();
    if (s.ok()) s = record_journal_.Open(id, *record);
    if (s.ok()) s = record_journal_.Granted(id, static_cast<uint32_t>(reports[i].history.size()));
    if (s.ok()) s = records_.Open(id, *std::move(record));
    if (!s.ok()) {
      record_journal_.Release(id);
      spdlog::warn("memd: reported request {}: its record is not kept ({}); it cannot be resumed", id, s.ToString());
    }
  }
  spdlog::warn("memd: worker of GPU {} (pid {}) survived a memd restart: {} of its {} requests adopted (epoch {})",
               hello.gpu, hello.pid, reports.size() - reply.refused_reports.size(), reports.size(),
               hello.worker_epoch);
  return "";
}

absl::StatusOr<std::string> Daemon::OnAdmit(const wire::AdmitRequestT& a, const Message& m, std::string_view peer) {
  // An admission refused as bad input (the core's status, or no Hello on this connection) is answered directly, by
  // the same encoder as the core's RejectOrder (never fits): it cannot go out through the outbox, since it must reach
  // the sender (its GPU may have no worker) and must not touch a live request that has the same id.
  auto reject = [&](const absl::Status& why) { return EncodeReject(a.request, why, m.sequence); };
  auto g = gpus_.find(a.gpu);
  if (g == gpus_.end() || g->second.peer != peer) {
    ++counters_.refused_peers;
    return reject(absl::FailedPreconditionError(
        absl::StrFormat("GPU %d has no registered worker on this connection (send Hello first)", a.gpu)));
  }
  if (absl::Status s = CheckRequestIdRange(a.request, a.gpu, "AdmitRequest"); !s.ok()) return reject(s);
  AdmitRequest admit;
  admit.request = a.request;
  admit.gpu = a.gpu;
  admit.required_pages = a.required_pages;
  admit.history_pages = a.complete_pages;
  admit.context_rows = a.history_rows;  // the core converts rows to pages (and refuses what overflows)
  admit.page_rows = g->second.page_rows;
  admit.optional_history = a.optional_history;
  admit.host_backed = a.host_backed;
  admit.resume_of = a.resume_of;
  admit.speculation = SpeculationShare{a.draft_ring_pages, a.staging_pages, a.draft_ring_bytes, a.staging_bytes};
  // Issue 24 (prefix sharing): the tenant and prefix chain (the core ignores them while --prefix-sharing is off).
  admit.prefix = PrefixChain{a.tenant, a.prefix_block_ids, a.prefix_block_digests, a.prefix_block_tokens};
  // Issue 26 (sessions across nodes): with the cluster tier, the input's further complete pages are looked up by
  // their session address (docs/cluster_tier.md "Sessions"); without it no node publishes session pages.
  if (cluster_ && a.session != 0 && !a.session_page_digests.empty()) {
    admit.session_hash = SessionHash(a.tenant, absl::StrCat(a.session));
    admit.session_digests = a.session_page_digests;
  }
  if (a.record) {  // opened first: an oversize record refuses the admission, and nothing is left behind
    absl::StatusOr<RequestRecord> wire_record = FromWireRecord(*a.record, a.gpu);
    if (!wire_record.ok()) return reject(wire_record.status());
    RequestRecord record = *std::move(wire_record);
    record.chain_ids = a.prefix_block_ids;  // issue 24: what a memd restart needs to give its shared pages back
    record.chain_digests = a.prefix_block_digests;
    record.chain_block_tokens = a.prefix_block_tokens;
    record.chain_page_rows = admit.page_rows;
    if (absl::Status s = record_journal_.Open(a.request, record); !s.ok()) {
      record_journal_.Release(a.request);
      return reject(s);
    }
    if (absl::Status s = records_.Open(a.request, std::move(record)); !s.ok()) {
      record_journal_.Release(a.request);
      return reject(s);
    }
  }
  // Issue 26: before the grant decision, the pages the host tier lacks are asked of the cluster tier.
  const uint32_t from_cluster = cluster_ ? ImportClusterPages(admit) : 0;
  if (absl::Status s = core_->Admit(admit); !s.ok()) {
    if (a.record) {
      ReleaseRecord(a.request);
    }
    return reject(s);
  }
  if (admit.resume_of != 0) ReleaseRecord(admit.resume_of);  // the interrupted request ended in that event
  admit_sequence_[a.request] = m.sequence;
  timelines_.Open(a.request, a.record ? a.record->client_request : a.request, a.record ? a.record->client : 0,
                  a.gpu, EpochOfNodeRequestId(a.request));
  Note(a.request, TimelineEvent::kAdmitted, from_cluster,
       absl::StrCat(admit.resume_of != 0 ? absl::StrCat("resume of ", admit.resume_of) : std::string(),
                    from_cluster > 0 ? absl::StrCat(admit.resume_of != 0 ? "; " : "", from_cluster,
                                                    " pages imported from the cluster tier")
                                     : std::string()));
  if (admit.resume_of != 0) {
    Note(admit.resume_of, TimelineEvent::kResumed, 0, absl::StrCat("as ", a.request));
    timelines_.End(admit.resume_of);
  }
  return std::string();  // Grant / Wait / Reject go out with the drained orders
}

absl::Status Daemon::CheckWorkerPeer(std::string_view peer, std::optional<GpuId> gpu, std::string_view what) {
  if (gpu.has_value()) {
    auto g = gpus_.find(*gpu);
    if (g != gpus_.end() && g->second.peer == peer) return absl::OkStatus();
  } else if (std::any_of(gpus_.begin(), gpus_.end(), [&](const auto& e) { return e.second.peer == peer; })) {
    return absl::OkStatus();  // a registered worker: the core refuses the unknown request / order
  }
  ++counters_.refused_peers;
  DHS_LOG_LIMITED(spdlog::level::warn, "memd: {} from peer '{}' refused: only the worker of its GPU may send it", what,
                  Printable(peer));
  return absl::PermissionDeniedError(
      gpu.has_value() ? absl::StrFormat("%s: only the worker of GPU %d may send it (peer '%s')", what, *gpu, peer)
                      : absl::StrFormat("%s: only a worker may send it (peer '%s' said no accepted Hello)", what, peer));
}

absl::Status Daemon::CheckRequestIdRange(RequestId request, GpuId gpu, std::string_view what) {
  const GpuId owner = GpuOfNodeRequestId(request);
  // 2^64-1 (kNoOwner) is no GPU's: the core refuses it by name ("reserved"), as it does 0.
  if (owner == gpu || request == kNoOwner) return absl::OkStatus();
  ++counters_.foreign_request_ids;
  DHS_LOG_LIMITED(spdlog::level::warn, "memd: {} from the worker of GPU {} refused: request id {} is GPU {}'s", what,
                  gpu, request, owner);
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: request id %d is outside GPU %d's range of node request ids (%d << 48 | epoch << 24 | n): it is GPU %d's",
      what, request, gpu, gpu, owner));
}

absl::Status Daemon::CheckRequestPeer(std::string_view peer, RequestId request, std::string_view what) {
  if (std::optional<GpuId> gpu = core_->GpuOfRequest(request)) return CheckWorkerPeer(peer, gpu, what);
  for (const auto& [gpu, g] : gpus_) {
    if (g.peer == peer) return CheckRequestIdRange(request, gpu, what);
  }
  return CheckWorkerPeer(peer, std::nullopt, what);  // no registered worker: PERMISSION_DENIED
}

absl::StatusOr<std::string> Daemon::OnBackupComplete(const wire::BackupCompleteT& b, const Message& m, std::string_view peer) {
  if (absl::Status s = CheckWorkerPeer(peer, core_->GpuOfOrder(b.order), "BackupComplete"); !s.ok()) return s;
  if (b.order == 0) {
    return absl::InvalidArgumentError(
        "BackupComplete with order 0 is refused since protocol version 3: report host copies written outside a "
        "ReclaimOrder with HostCopyWritten");
  }
  if (!b.ok) {
    spdlog::warn("memd: reclaim order {} of request {}: backup failed ({}); the victim stays untouched", b.order,
                 b.request, b.message);
  }
  if (absl::Status s = core_->OnBackupComplete(b.order, b.pages, b.ok, b.deferred_pages, b.checksums); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("BackupComplete: ", s.message()));
  }
  return std::string();
}

absl::StatusOr<std::string> Daemon::OnHostCopyWritten(const wire::HostCopyWrittenT& w, const Message& m, std::string_view peer) {
  if (absl::Status s = CheckRequestPeer(peer, w.request, "HostCopyWritten"); !s.ok()) return s;
  std::vector<PageIndex> host_pages;
  for (const wire::HostPageRef& ref : w.host_pages) {
    if (ref.segment() != 0) {
      return absl::InvalidArgumentError(absl::StrFormat("HostCopyWritten: host segment %d unknown (memd has one: 0)",
                                                        ref.segment()));
    }
    host_pages.push_back(ref.page());
  }
  if (!w.ok) {
    spdlog::warn("memd: request {}: host copy of {} history pages failed: {}", w.request, w.history_pages.size(),
                 w.message);
  }
  if (absl::Status s = core_->OnHostCopyWritten(w.request, w.history_pages, host_pages, w.ok, w.checksums);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("HostCopyWritten: ", s.message()));
  }
  return std::string();
}

absl::StatusOr<std::string> Daemon::OnReadersDone(const wire::ReadersDoneT& r, const Message& m, std::string_view peer) {
  if (absl::Status s = CheckWorkerPeer(peer, core_->GpuOfOrder(r.order), "ReadersDone"); !s.ok()) return s;
  if (absl::Status s = core_->OnReadersDone(r.order); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("ReadersDone: ", s.message()));
  }
  return std::string();
}

absl::StatusOr<std::string> Daemon::OnReadyPublish(const wire::ReadyPublishT& r, const Message& m, std::string_view peer) {
  if (absl::Status s = CheckWorkerPeer(peer, core_->GpuOfOrder(r.order), "ReadyPublish"); !s.ok()) return s;
  if (absl::Status s = core_->OnReadyPublish(r.order, r.pages, r.ok); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("ReadyPublish: ", s.message()));
  }
  return std::string();
}

absl::StatusOr<std::string> Daemon::OnComplete(const wire::CompleteT& c, const Message& m, std::string_view peer) {
  if (absl::Status s = CheckRequestPeer(peer, c.request, "Complete"); !s.ok()) return s;
  if (cluster_ && !c.session_page_digests.empty()) PublishSessionPages(c);  // issue 26: before the event frees them
  if (absl::Status s = core_->Complete(c.request); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("Complete: ", s.message()));
  }
  if (c.keep_output) KeepFinishedRecord(c);  // before the CompleteAck releases the record
  return FlushOrders(m.sequence);  // the CompleteAck answers this message
}

void Daemon::KeepFinishedRecord(const wire::CompleteT& c) {
  // Lost ends (workerd/README.md "Restart: a finished request's end"): the record, completed with the tokens it may
  // lack, outlives the request until the GPU's next worker says Hello. Not journaled: a worker that outlives memd
  // still holds the final chunk it owes.
  absl::Status s = records_.Commit(c.request, c.output_from, TokenKind::kBytes, WidenTokens(c.output_tokens),
                                   c.output_digests);
  absl::StatusOr<size_t> dropped = s.ok() ? records_.KeepFinished(c.request) : absl::StatusOr<size_t>(s);
  if (!dropped.ok()) {
    DHS_LOG_LIMITED(spdlog::level::warn, "memd: Complete of request {}: its output is not kept for a lost end: {}",
                    c.request, dropped.status().ToString());
  } else if (*dropped > 0) {
    DHS_LOG_LIMITED(spdlog::level::info, "memd: {} finished records dropped (bound {} records / {} bytes per GPU)",
                    *dropped, records_.limits().max_finished_records, records_.limits().max_finished_bytes);
  }
}

absl::StatusOr<std::string> Daemon::OnTokensCommitted(const wire::TokensCommittedT& t, const Message& m,
                                                      std::string_view peer) {
  // Each entry on its own: a refused one (wrong peer, no record, a gap) does not hold back the others.
  absl::Status first;
  size_t refused = 0;
  for (const auto& e : t.entries) {
    if (e == nullptr) continue;
    absl::Status s = CheckWorkerPeer(peer, core_->GpuOfRequest(e->request), "TokensCommitted");
    absl::StatusOr<std::pair<TokenKind, std::vector<uint32_t>>> tokens = CommittedTokensOf(*e);
    if (s.ok()) s = tokens.status();
    if (s.ok()) s = records_.Commit(e->request, e->from, tokens->first, tokens->second, e->logits_digests);
    if (s.ok()) {  // before the ack
      s = record_journal_.Commit(e->request, e->from, tokens->first, tokens->second, e->logits_digests);
    }
    if (s.ok()) continue;
    if (refused++ == 0) first = s;
  }
  if (refused == 0) {
    wire::TokensCommittedAckT ack;
    ack.entries = static_cast<uint32_t>(t.entries.size());
    return EncodeTokensCommittedAck(ack, m.sequence, kSender);
  }
  DHS_LOG_LIMITED(spdlog::level::warn, "memd: TokensCommitted: {} of {} entries refused, first: {}", refused,
                  t.entries.size(), first.ToString());
  return absl::Status(first.code(), absl::StrFormat("TokensCommitted: %d of %d entries refused, first: %s", refused,
                                                    t.entries.size(), first.message()));
}

// A view naming a request or GPU memd does not know is answered with NOT_FOUND (dhsctl exits 4 on the code).
absl::StatusOr<std::string> Daemon::OnIntrospect(const wire::IntrospectQueryT& q, const Message& m) {
  if (q.what == wire::IntrospectWhat::Timeline) {  // issue 22: every kept timeline of the client's request id
    const std::vector<const RequestTimeline*> found = timelines_.FindClient(q.client_request);
    if (found.empty()) {
      return absl::NotFoundError(absl::StrFormat("no request of client id %d is known (never admitted, or its "
                                                 "timeline was evicted)", q.client_request));
    }
    wire::IntrospectReplyT reply;
    reply.what = q.what;
    reply.format = wire::IntrospectFormat::Json;
    reply.document = TimelinesToJson(found, "memd").dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    return EncodeIntrospectReply(reply, m.sequence, kSender);
  }
  if (q.what == wire::IntrospectWhat::Request && !core_->GpuOfRequest(q.request)) {
    return absl::NotFoundError(absl::StrFormat("request %d not found", q.request));
  }
  if (q.what == wire::IntrospectWhat::Pages) {
    const GpuPageTable* table = core_->gpu_table(q.gpu);
    if (table == nullptr) {
      return absl::NotFoundError(core_->fenced(q.gpu)
                                     ? absl::StrFormat("GPU %d is fenced: no page table until its worker says Hello", q.gpu)
                                     : absl::StrFormat("GPU %d not found", q.gpu));
    }
    if (q.page_from >= table->pages()) {
      return absl::OutOfRangeError(absl::StrFormat("pages: from %d is beyond the last page %d of GPU %d (M = %d)",
                                                   q.page_from, table->pages() - 1, q.gpu, table->pages()));
    }
    if (q.page_count > kMaxPageRows) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pages: count %d is above the %d rows a reply holds", q.page_count, kMaxPageRows));
    }
  }
  // Only what the view shows is dumped: the counts, and the requests or the bounded page rows it asks for.
  const DumpView view = ViewOf(q);
  StateDump dump = core_->Dump(DumpScopeOf(view));
  if (cluster_) dump.cluster = cluster_->Stats();  // issue 26
  if (view.kind == DumpView::Kind::kRequest) {  // shown in the `request N` view only; the records are the daemon's
    for (RequestDump& rd : dump.requests) {
      if (const RequestRecord* rec = records_.Find(rd.request)) rd.record_tokens = static_cast<uint32_t>(rec->tokens.size());
    }
  }
  for (GpuDump& gd : dump.gpus) {  // the workers' shapes (introspection only: the core never sees them)
    if (auto it = gpus_.find(gd.gpu); it != gpus_.end()) {
      if (it->second.shape.declared()) gd.worker = it->second.shape;
      gd.model_fingerprint = it->second.model_fingerprint;  // issue 26
    }
  }
  wire::IntrospectReplyT reply;
  reply.what = q.what;
  reply.format = q.format;
  // replace: a string that is not UTF-8 must not make dump() throw (memd would terminate).
  reply.document = q.format == wire::IntrospectFormat::Json
                       ? DumpToJson(dump, view).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"
                       : DumpToTable(dump, view);
  return EncodeIntrospectReply(reply, m.sequence, kSender);
}

// ---------------------------------------------------------------- orders -> wire (one message each)

void Daemon::PublishKvEvents() {
  if (!kv_events_) return;
  const std::vector<KvEvent> events = core_->DrainKvEvents();
  kv_events_->Publish(events, std::chrono::duration_cast<std::chrono::microseconds>(
                                  std::chrono::system_clock::now().time_since_epoch()).count());
}

// ---------------------------------------------------------------- issue 26: the cluster tier

std::optional<PageGeometry> Daemon::GeometryOf(GpuId gpu) const {
  auto g = gpus_.find(gpu);
  if (g == gpus_.end() || !g->second.shape.declared() || g->second.page_rows == 0) return std::nullopt;
  const WorkerShape& w = g->second.shape;
  PageGeometry geometry;
  geometry.page_rows = g->second.page_rows;
  geometry.payload_sources = w.payload_sources;
  geometry.index_producers = w.index_producers;
  geometry.index_key_bytes = w.index_key_bytes;
  geometry.page_bytes = w.page_bytes;
  geometry.host_page_bytes = options_.page_bytes;
  // The Hello gives the sizes, not each source's row bytes: the digest assumes the sources' rows of equal size (what
  // workerd's layouts are) and covers the counts and sizes it knows. The model is the worker's fingerprint (Hello):
  // pages of another model (0 = a worker that sends none) are another key space.
  const uint64_t rows = uint64_t{geometry.page_rows} * std::max<uint32_t>(w.payload_sources, 1);
  std::vector<uint64_t> row_bytes(w.payload_sources, rows > 0 ? w.page_bytes / rows : 0);
  std::vector<uint64_t> key_bytes(w.index_producers, w.index_key_bytes);
  geometry.layout_digest = LayoutDigest(row_bytes, key_bytes);
  geometry.model = g->second.model_fingerprint;
  return geometry;
}

void Daemon::PublishClusterPages() {
  if (!cluster_) return;
  for (const ClusterPublishPage& p : core_->DrainClusterPublish()) {
    const std::optional<PageGeometry> geometry = GeometryOf(p.gpu);
    if (!geometry) {
      cluster_->CountMiss(ClusterMiss::kNoGeometry);  // not publishable: nothing to describe it with
      continue;
    }
    absl::StatusOr<uint8_t*> data = segment_->PageData(p.host_page);
    if (!data.ok()) continue;  // the core's page: never out of range
    cluster_->Offer(*geometry, p.address, {*data, static_cast<size_t>(options_.page_bytes)});
  }
}

void Daemon::PublishSessionPages(const wire::CompleteT& c) {
  const RequestRecord* record = records_.Find(c.request);
  if (record == nullptr || record->session == 0) {  // no session named (or no record kept): nothing to publish
    spdlog::debug("memd: Complete of request {}: {} session page digests but no session", c.request,
                  c.session_page_digests.size());
    return;
  }
  const std::optional<GpuId> gpu = core_->GpuOfRequest(c.request);
  const std::vector<SessionPublishPage> pages = core_->SessionPages(c.request, c.session_page_digests);
  spdlog::debug("memd: Complete of request {}: session {}, {} page digests, {} pages to publish", c.request,
                record->session, c.session_page_digests.size(), pages.size());
  if (!gpu || pages.empty()) return;
  const std::optional<PageGeometry> geometry = GeometryOf(*gpu);
  if (!geometry) {
    cluster_->CountMiss(ClusterMiss::kNoGeometry, pages.size());
    return;
  }
  for (const SessionPublishPage& p : pages) {
    absl::StatusOr<uint8_t*> data = segment_->PageData(p.host_page);
    if (!data.ok()) continue;  // the core's page: never out of range
    cluster_->OfferSession(*geometry, record->tenant, record->session, p.page, p.digest,
                           {*data, static_cast<size_t>(options_.page_bytes)});
  }
}

uint32_t Daemon::ImportClusterPages(const AdmitRequest& admit) {
  const std::vector<PrefixAddress> wanted = core_->ClusterLookups(admit);
  if (wanted.empty()) return 0;
  const std::optional<PageGeometry> geometry = GeometryOf(admit.gpu);
  if (!geometry) {
    cluster_->CountMiss(ClusterMiss::kNoGeometry, wanted.size());
    return 0;
  }
  // Issue 26: a session admission's chain pages are asked under their session key too (memd/cluster_sessions.h).
  const ClusterAsk ask = SessionAlternates(wanted, PrefixPages::TenantHash(admit.prefix.tenant), admit.session_hash,
                                           admit.session_digests, admit.page_rows);
  std::vector<std::optional<ClusterPage>> found = cluster_->Lookup(*geometry, ask.asked);
  std::vector<bool> hit(found.size());
  for (size_t k = 0; k < found.size(); ++k) hit[k] = found[k].has_value();
  // Only the run of found pages from the first one asked: a page after a missed one would be a hit after a gap,
  // which the worker recomputes anyway.
  size_t run = 0;
  while (run < wanted.size() && ServedBy(ask, hit, run) >= 0) ++run;
  uint64_t after_gap = 0;
  for (size_t i = run; i < wanted.size(); ++i) after_gap += ServedBy(ask, hit, i) >= 0;
  if (after_gap > 0) cluster_->CountMiss(ClusterMiss::kAfterGap, after_gap);
  if (run == 0) return 0;
  const std::vector<PageIndex> room = core_->ClusterRoom(static_cast<uint32_t>(run));
  if (room.size() < run) cluster_->CountMiss(ClusterMiss::kNoRoom, run - room.size());
  std::vector<ClusterImport> imports;
  uint64_t bytes = 0, session_pages = 0;
  for (size_t i = 0; i < room.size(); ++i) {
    const auto k = static_cast<size_t>(ServedBy(ask, hit, i));
    const std::span<const uint8_t> payload = found[k]->payload();
    absl::StatusOr<uint8_t*> data = segment_->PageData(room[i]);
    if (!data.ok() || payload.size() != options_.page_bytes) break;  // checked by the decode: never expected
    std::memcpy(*data, payload.data(), payload.size());  // a reusable page: no worker reads or writes it
    // Stored under the wanted address (a page found by its session alternate holds exactly this page's rows).
    imports.push_back({wanted[i], room[i], found[k]->page_checksum});
    bytes += payload.size();
    session_pages += ask.asked[k].session != 0;
  }
  if (imports.empty()) return 0;
  if (absl::Status s = core_->ImportClusterPages(imports); !s.ok()) {
    spdlog::warn("memd: cluster tier: {} found pages not imported: {}", imports.size(), s.ToString());
    cluster_->CountMiss(ClusterMiss::kNoRoom, imports.size());
    return 0;
  }
  cluster_->CountImported(imports.size(), bytes, session_pages);
  return static_cast<uint32_t>(imports.size());
}

std::string Daemon::FlushOrders(uint64_t answering_sequence) {
  PublishKvEvents();  // issue 24: what the event that made these orders changed in the host tier
  PublishClusterPages();  // issue 26: the pages that event confirmed shared
  std::string reply;
  for (const Order& order : core_->DrainOrders()) {  // a Fence while sending flushes the orders it makes itself
    if (const auto* ack = std::get_if<CompleteAckOrder>(&order)) {
      wire::CompleteAckT w;
      w.request = ack->request;
      w.released_pages = ack->released_pages;
      admit_sequence_.erase(ack->request);
      ReleaseRecord(ack->request);  // the request ended: nothing left to resume
      Note(ack->request, TimelineEvent::kCompleted, ack->released_pages);
      timelines_.End(ack->request);
      reply = EncodeCompleteAck(w, answering_sequence, kSender);
      continue;
    }
    if (const auto* reject = std::get_if<RejectOrder>(&order)) {  // never admitted
      ReleaseRecord(reject->request);
      Note(reject->request, TimelineEvent::kRejected, 0, reject->error.ToString());
      timelines_.End(reject->request);
    } else if (const auto* grant = std::get_if<GrantOrder>(&order)) {
      Note(grant->request, TimelineEvent::kGranted, grant->required_pages.size() + grant->optional_pages.size());
    } else if (const auto* wait = std::get_if<WaitOrder>(&order)) {
      Note(wait->request, TimelineEvent::kWaited, wait->queue_position, "pages = queue position");
    } else if (const auto* reclaim = std::get_if<ReclaimOrder>(&order)) {
      Note(reclaim->request, TimelineEvent::kReclaimed, reclaim->gpu_pages.size());
    } else if (const auto* populate = std::get_if<PopulateOrder>(&order)) {
      Note(populate->request, TimelineEvent::kPopulated, populate->gpu_pages.size());
    }
    if (const auto* grant = std::get_if<GrantOrder>(&order); grant && records_.Find(grant->request)) {
      // A memd restarted after this one died restores the request even when none of its pages was confirmed.
      if (absl::Status s = record_journal_.Granted(grant->request, static_cast<uint32_t>(grant->host_pages.size()));
          !s.ok()) {
        spdlog::warn("memd: request {}: {}", grant->request, s.ToString());
      }
    }
    const GpuId gpu = std::visit([](const auto& o) { return o.gpu; }, order);
    if (!gpus_.contains(gpu) || core_->fenced(gpu)) {  // its worker is gone: nobody to tell
      if (const auto* reject = std::get_if<RejectOrder>(&order)) admit_sequence_.erase(reject->request);
      spdlog::debug("memd: {} order for fenced GPU {} dropped", OrderName(order), gpu);
      continue;
    }
    const std::string bytes = std::visit(
        [this](const auto& o) -> std::string {
          if constexpr (std::is_same_v<std::decay_t<decltype(o)>, CompleteAckOrder>) {
            return std::string();  // handled above
          } else {
            return Encode(o);
          }
        },
        order);
    SendToGpu(gpu, bytes);
  }
  return reply;
}

void Daemon::Note(RequestId request, TimelineEvent event, uint64_t pages, std::string detail) {
  timelines_.Add(request, TimelineEntry{NowUs(), event, pages, std::move(detail), ""});
}

uint64_t Daemon::AdmitSequence(RequestId request) const {
  auto it = admit_sequence_.find(request);
  return it == admit_sequence_.end() ? 0 : it->second;
}

std::string Daemon::Encode(const GrantOrder& g) {
  wire::AdmitGrantT w;
  w.request = g.request;
  w.slot = g.slot;
  w.required_pages = g.required_pages;
  w.optional_pages = g.optional_pages;
  for (uint32_t h = 0; h < g.optional_pages.size(); ++h) w.optional_history_pages.push_back(h);
  for (PageIndex hp : g.host_pages) w.backup_host_pages.push_back(HostRef(hp));
  w.imported_pages = g.imported_pages;
  w.host_backed_pages = g.host_backed_pages;
  w.host_backed_checksums = g.host_backed_checksums;
  w.shared_pages = g.shared_pages;  // issue 24
  return EncodeAdmitGrant(w, AdmitSequence(g.request), kSender);
}

std::string Daemon::Encode(const WaitOrder& o) {
  wire::AdmitWaitT w;
  w.request = o.request;
  w.queue_position = o.queue_position;
  w.deficit_pages = o.deficit_pages;
  return EncodeAdmitWait(w, AdmitSequence(o.request), kSender);
}

std::string Daemon::Encode(const RejectOrder& o) {
  const uint64_t sequence = AdmitSequence(o.request);
  admit_sequence_.erase(o.request);
  return EncodeReject(o.request, o.error, sequence, o.took_over);
}

// The one AdmitReject encoder: the core's RejectOrder (never fits) and an admission refused as bad input.
std::string Daemon::EncodeReject(RequestId request, const absl::Status& why, uint64_t sequence,
                                 RequestId took_over) {
  wire::AdmitRejectT w;
  w.request = request;
  w.code = ToWireError(why);
  w.reason = std::string(why.message());
  w.took_over = took_over;
  spdlog::info("memd: admission of request {} rejected: {}", request, w.reason);
  return EncodeAdmitReject(w, sequence, kSender);
}

std::string Daemon::Encode(const ReclaimOrder& o) {
  wire::ReclaimOrderT w;
  w.order = o.order;
  w.gpu = o.gpu;
  w.request = o.request;
  w.pages = o.gpu_pages;
  w.backup_pages = o.backup_pages;
  for (PageIndex hp : o.backup_host_pages) w.backup_targets.push_back(HostRef(hp));
  return EncodeReclaimOrder(w, next_sequence_++, kSender);
}

std::string Daemon::Encode(const PopulateOrder& o) {
  wire::PopulateOrderT w;
  w.order = o.order;
  w.gpu = o.gpu;
  w.request = o.request;
  w.pages = o.gpu_pages;
  w.history_pages = o.history_pages;
  for (PageIndex hp : o.host_pages) w.host_pages.push_back(HostRef(hp));
  return EncodePopulateOrder(w, next_sequence_++, kSender);
}

std::string Daemon::Encode(const RetireOrder& o) {
  wire::RetireT w;
  w.order = o.order;
  w.gpu = o.gpu;
  w.request = o.request;
  w.pages = o.gpu_pages;
  w.regranted_to = o.regranted_to;
  return EncodeRetire(w, next_sequence_++, kSender);
}

}  // namespace dhs::memd
