// workerd/kv/hierarchical_kv_access.cc: see hierarchical_kv_access.h.
#include "workerd/kv/hierarchical_kv_access.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/check.h"
#include "common/fault_point.h"
#include "common/page_checksum.h"
#include "workerd/kv/kernel_resolver.h"
#include "spdlog/spdlog.h"

namespace dhs {
namespace {

// Blocks until `e` ended (a copy whose slot, page or buffer is about to be reused) in a path that cannot fail (a
// destructor, the release of a request): a failed copy is logged with `what`, the copy it was.
void AwaitEndedOrLog(const CopyEvent& e, std::string_view what) {
  if (absl::Status s = e.Wait(); !s.ok()) {
    spdlog::warn("KV: {} failed: {}", what, s.ToString());
  }
}

}  // namespace

HierarchicalKvAccess::HierarchicalKvAccess(KvLayout layout, Device* device, HostPoolAccess host)
    : layout_(std::move(layout)), device_(device), host_(std::move(host)) {}

HierarchicalKvAccess::~HierarchicalKvAccess() {
  // Copies may still read the tail upload buffers or write host pages: let them finish.
  for (auto& [id, kv] : requests_) {
    for (auto& per_source : kv->tail_write) {
      for (auto& e : per_source) AwaitEndedOrLog(e, absl::StrCat("tail write of request ", id, " at shutdown"));
    }
    for (auto& pg : kv->pages) {
      AwaitEndedOrLog(pg.backup, absl::StrCat("host backup of request ", id, " at shutdown"));
      AwaitEndedOrLog(pg.populate, absl::StrCat("copy into a GPU page of request ", id, " at shutdown"));
    }
  }
  for (auto& f : pending_free_) {
    for (auto& e : f.events) AwaitEndedOrLog(e, absl::StrCat("copy of host page ", f.host_page, " at shutdown"));
  }
}

const uint8_t* HierarchicalKvAccess::RowAddress(PoolId pool, Location offset) const {
  if (const uint8_t* host = device_->HostVisible(pool, offset); host != nullptr) return host;
  const DeviceCompute* compute = device_->Compute();
  return compute != nullptr ? compute->PoolAddress(pool, offset) : nullptr;
}

bool HierarchicalKvAccess::resolves_on_device() const {
  return dynamic_cast<const KernelResolver*>(resolver_.get()) != nullptr;
}

absl::StatusOr<std::unique_ptr<HierarchicalKvAccess>> HierarchicalKvAccess::Create(const KvConfig& config,
                                                                                    Device* device,
                                                                                    HostPoolAccess host,
                                                                                    ResolverKind kind) {
  absl::StatusOr<KvLayout> layout = KvLayout::Create(config);
  if (!layout.ok()) return layout.status();
  if (device == nullptr) return absl::InvalidArgumentError("HierarchicalKvAccess: no device");
  if (host.bytes.size() % layout->host_page_bytes() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("HierarchicalKvAccess: host pool of ", host.bytes.size(),
                                                   " bytes is not a whole number of ", layout->host_page_bytes(),
                                                   "-byte pages"));
  }
  std::unique_ptr<HierarchicalKvAccess> a(new HierarchicalKvAccess(*std::move(layout), device, std::move(host)));
  absl::StatusOr<PoolId> pool = device->AllocatePool(a->layout_.pool_bytes());
  if (!pool.ok()) return pool.status();
  a->pool_ = *pool;
  ResolverEnv env{&a->layout_, device, a->pool_, a->host_.bytes,
                  [raw = a.get()](RequestKv& kv, uint32_t page) { return raw->VerifyHostPage(kv, page); }};
  if (kind == ResolverKind::kFused && device->Compute() != nullptr && DevicePlanRunner()) {
    // Issue 23: a device with a compute side resolves with the kernel (kernel_resolver.h); FusedResolver otherwise.
    absl::StatusOr<std::unique_ptr<KernelResolver>> k =
        KernelResolver::Create(env, device->Compute(), DevicePlanRunner());
    if (k.ok()) {
      a->resolver_ = *std::move(k);
    } else {
      spdlog::warn("KV: resolver kernel not used ({}); the fused resolver runs on the host", k.status().ToString());
    }
  }
  if (a->resolver_ != nullptr) {
    // the kernel resolver
  } else if (kind == ResolverKind::kFused) {
    a->resolver_ = std::make_unique<FusedResolver>(env);
  } else {
    a->resolver_ = std::make_unique<ReferenceResolver>(env);
  }
  a->slot_used_.assign(config.slots, false);
  a->device_page_owner_.assign(config.optional_pages, -1);
  a->device_page_page_.assign(config.optional_pages, 0);
  a->keep_planner_.assign(config.optional_pages, -1);
  a->keep_planned_page_.assign(config.optional_pages, 0);
  a->readers_.resize(config.groups.size());
  a->staging_held_.resize(config.groups.size());
  if (config.staging_arenas > 0) {
    size_t widest = 0;
    for (const auto& g : config.groups) widest = std::max(widest, g.size());
    if (config.staging_k_max == 0 || config.staging_arenas < widest) {
      return absl::InvalidArgumentError(absl::StrCat(
          "HierarchicalKvAccess: staging arenas χ = ", config.staging_arenas, " with K_max = ", config.staging_k_max,
          ": K_max must be >= 1 and χ >= ", widest, " (the largest group's sources, one arena each)"));
    }
    const uint64_t d_kv = *std::max_element(config.row_bytes.begin(), config.row_bytes.end());
    a->staging_shape_ = spec::StagingShape{config.staging_arenas, config.slots, config.staging_k_max, config.k,
                                           static_cast<int64_t>(d_kv)};
    absl::StatusOr<int64_t> bytes = spec::StagingReservationBytes(a->staging_shape_);
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<PoolId> staging = device->AllocatePool(static_cast<uint64_t>(*bytes));
    if (!staging.ok()) return staging.status();
    a->staging_pool_id_ = *staging;
    a->staging_bytes_ = *bytes;
    a->arenas_.emplace(config.staging_arenas);
  }
  uint64_t upload = 0;
  for (uint64_t rb : config.row_bytes) upload += rb * config.tail_rows;
  a->tail_upload_.assign(config.slots, std::vector<uint8_t>(upload));
  return a;
}

uint64_t HierarchicalKvAccess::TailUploadOffset(SourceId s, Position t) const {
  uint64_t off = 0;
  const KvConfig& c = layout_.config();
  for (SourceId i = 0; i < s; ++i) off += c.row_bytes[i] * c.tail_rows;
  return off + static_cast<uint64_t>(t % c.tail_rows) * c.row_bytes[s];
}

const RequestKv* HierarchicalKvAccess::Find(RequestId request) const {
  auto it = requests_.find(request);
  return it == requests_.end() ? nullptr : it->second.get();
}

absl::StatusOr<RequestKv*> HierarchicalKvAccess::AdmitAnySlot(RequestId request) {
  auto it = requests_.find(request);
  if (it != requests_.end()) return it->second.get();
  auto free_slot = std::find(slot_used_.begin(), slot_used_.end(), false);
  if (free_slot == slot_used_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV: no free request slot for request ", request));
  }
  return Admit(request, static_cast<SlotIndex>(free_slot - slot_used_.begin()));
}

absl::StatusOr<RequestKv*> HierarchicalKvAccess::Admit(RequestId request, SlotIndex slot) {
  if (slot >= slot_used_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("KV: slot ", slot, " of request ", request, " is not below N = ",
                                                   slot_used_.size()));
  }
  auto it = requests_.find(request);
  if (it != requests_.end()) {
    if (it->second->slot == slot) return it->second.get();
    return absl::FailedPreconditionError(absl::StrCat("KV: request ", request, " holds slot ", it->second->slot,
                                                      ", not ", slot));
  }
  if (slot_used_[slot]) {
    return absl::FailedPreconditionError(absl::StrCat("KV: slot ", slot, " of request ", request,
                                                      " is held by another request"));
  }
  slot_used_[slot] = true;
  auto kv = std::make_unique<RequestKv>();
  kv->id = request;
  kv->slot = slot;
  kv->appended.assign(layout_.num_sources(), 0);
  kv->tail_end.assign(layout_.num_sources(), 0);
  kv->tail_write.assign(layout_.num_sources(), std::vector<CopyEvent>(layout_.config().tail_rows));
  resolver_->ResetSlot(kv->slot);
  RequestKv* raw = kv.get();
  requests_.emplace(request, std::move(kv));
  return raw;
}

absl::Status HierarchicalKvAccess::Append(RequestId request, SourceId source, Position position,
                                          std::span<const uint8_t> row) {
  return AppendRun(request, source, position, 1, row);
}

absl::Status HierarchicalKvAccess::AppendRun(RequestId request, SourceId source, Position first, uint32_t count,
                                             std::span<const uint8_t> rows) {
  const KvConfig& c = layout_.config();
  if (source >= layout_.num_sources()) return absl::InvalidArgumentError(absl::StrCat("KV: unknown source ", source));
  const uint64_t row_bytes = c.row_bytes[source];
  if (count == 0 || rows.size() != count * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("KV: ", count == 0 ? "empty run" : "row", " of ",
                                                   count == 0 ? 0 : rows.size() / count, " bytes, source ", source,
                                                   " has ", row_bytes));
  }
  absl::StatusOr<RequestKv*> kvp = AdmitAnySlot(request);
  if (!kvp.ok()) return kvp.status();
  RequestKv& kv = **kvp;
  if (first != kv.appended[source]) {
    return absl::InvalidArgumentError(absl::StrCat("KV: request ", request, " source ", source, " expects position ",
                                                   kv.appended[source], ", got ", first));
  }
  const Position page_rows = static_cast<Position>(c.page_rows);
  std::vector<HostToDeviceCopy> ops;
  std::vector<CopyEvent> after;
  // Rows t .. u-1 (copied to their upload slots) go to the tail in one batch; appended moves past them.
  auto issue = [&](Position t, Position u) {
    if (u == t) return;
    const CopyEvent write = device_->CopyHostToDevice(ops, after);
    for (Position v = t; v < u; ++v) kv.tail_write[source][static_cast<size_t>(v % c.tail_rows)] = write;
    kv.appended[source] = u;
    kv.tail_end[source] = std::max(kv.tail_end[source], kv.appended[source]);
  };
  for (Position t = first, last = first + static_cast<Position>(count); t < last;) {
    // One batch per run inside one page (at most p <= T rows: distinct tail slots, each freed of an earlier page).
    const Position end = std::min(last, (t / page_rows + 1) * page_rows);
    ops.clear();
    after.clear();
    for (Position u = t; u < end; ++u) {
      absl::Status freed = FreeTailSlot(kv, u - static_cast<Position>(c.tail_rows));
      CopyEvent& write = kv.tail_write[source][static_cast<size_t>(u % c.tail_rows)];
      if (freed.ok()) {
        freed = write.Wait();  // upload slot free again (a failed earlier write freed it too)
        if (absl::IsUnavailable(freed)) freed = absl::OkStatus();
      }
      if (!freed.ok()) {
        issue(t, u);  // the rows before it are stored, as Append by Append
        return freed;
      }
      uint8_t* upload = tail_upload_[kv.slot].data() + TailUploadOffset(source, u);
      std::memcpy(upload, rows.data() + static_cast<size_t>(u - first) * row_bytes, row_bytes);
      const DeviceRange dst{pool_, layout_.TailRow(kv.slot, source, u), row_bytes};
      if (device_->ReadersBusy(dst)) after.push_back(device_->ReadersFence(dst));
      if (!ops.empty() && ops.back().dst.offset + static_cast<Location>(ops.back().dst.bytes) == dst.offset &&
          ops.back().src + ops.back().dst.bytes == upload) {
        ops.back().dst.bytes += row_bytes;  // adjacent tail slots and upload bytes: one memcpy
      } else {
        ops.push_back(HostToDeviceCopy{dst, upload});
      }
    }
    issue(t, end);
    t = end;
    // Page completion: every source has the whole page -> schedule its backup (brief §4, §6); a page with an
    // unverified row waits for CommitVerified.
    const Position position = end - 1;
    if (end % page_rows == 0 && position < kv.hold_from) {
      const uint32_t page = static_cast<uint32_t>(position / c.page_rows);
      kv.GrowPages(page + 1);
      const bool complete = std::all_of(kv.appended.begin(), kv.appended.end(),
                                        [&](Position n) { return n >= Position{page + 1} * c.page_rows; });
      if (complete) {
        if (absl::Status s = OnPageComplete(kv, page); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status HierarchicalKvAccess::StoreIndexKeys(RequestId request, uint32_t indexer, Position first,
                                                  std::span<const float> keys) {
  if (layout_.num_indexers() == 0) return absl::OkStatus();  // no key regions in this layout
  if (indexer >= layout_.num_indexers()) {
    return absl::InvalidArgumentError(absl::StrCat("KV: unknown indexer ", indexer));
  }
  const KvConfig& c = layout_.config();
  const uint64_t key_bytes = c.key_bytes[indexer];
  if (first < 0 || (keys.size() * sizeof(float)) % key_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV: ", keys.size(), " floats at position ", first,
                                                   " are not whole index keys of ", key_bytes, " bytes"));
  }
  absl::StatusOr<RequestKv*> kvp = AdmitAnySlot(request);
  if (!kvp.ok()) return kvp.status();
  const RequestKv& kv = **kvp;
  const auto* bytes = reinterpret_cast<const uint8_t*>(keys.data());
  const size_t n = keys.size() * sizeof(float) / key_bytes;
  // A page whose own host copy Poll confirmed has its checksum over the keys it held then: a key written now would
  // make the confirmed page fail its check (DATA_LOSS) at its next use. Refused before anything is written.
  for (Position t = first; t < first + static_cast<Position>(n); t = (t / c.page_rows + 1) * c.page_rows) {
    const auto page = static_cast<size_t>(t / c.page_rows);
    if (page < kv.pages.size() && !kv.pages[page].Imported() && kv.pages[page].checksum != kNoChecksum) {
      return absl::FailedPreconditionError(absl::StrCat(
          "KV: request ", request, ": index keys at position ", t, " come after page ", page,
          "'s host copy was confirmed (checksummed at the poll after it completed); a step's keys go before that"));
    }
  }
  for (size_t j = 0; j < n; ++j) {
    const Position t = first + static_cast<Position>(j);
    const auto page = static_cast<size_t>(t / c.page_rows);
    if (page >= kv.host_plan.size() || kv.host_plan[page] < 0) continue;
    if (page < kv.pages.size() && kv.pages[page].Imported()) continue;  // a resume's confirmed copy holds them
    const uint64_t offset = layout_.KeyInPage(indexer, static_cast<uint32_t>(t % c.page_rows));
    if (host_writes_paused_) {  // memd away: written by ResumeHostWrites
      held_keys_.push_back(HeldKey{kv.host_plan[page], offset,
                                   std::vector<uint8_t>(bytes + j * key_bytes, bytes + (j + 1) * key_bytes)});
      continue;
    }
    std::memcpy(HostPageData(kv.host_plan[page]) + offset, bytes + j * key_bytes, key_bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> HierarchicalKvAccess::CheckHostCopies(RequestId request,
                                                                            std::span<const uint32_t> pages,
                                                                            std::span<const uint64_t> checksums) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  const RequestKv& kv = *it->second;
  std::vector<uint32_t> bad;
  for (size_t i = 0; i < pages.size(); ++i) {
    const uint32_t j = pages[i];
    if (j >= kv.host_plan.size() || kv.host_plan[j] < 0) {
      return absl::FailedPreconditionError(absl::StrCat("KV: page ", j, " of request ", request, " has no host page"));
    }
    const uint64_t want = i < checksums.size() ? checksums[i] : kNoChecksum;
    ++integrity_.pages_verified;
    integrity_.bytes_verified += layout_.host_page_bytes();
    if (PageChecksumMatches({HostPageData(kv.host_plan[j]), layout_.host_page_bytes()}, want)) continue;
    ++integrity_.mismatches;
    bad.push_back(j);
    spdlog::error("KV: host page {} (history page {} of request {}) {}: its rows are recomputed, not imported",
                  kv.host_plan[j], j, request,
                  want == kNoChecksum ? "has no checksum" : "does not match its confirmed checksum");
  }
  return bad;
}

absl::Status HierarchicalKvAccess::VerifyHostPage(RequestKv& kv, uint32_t page) {
  KvPage& pg = kv.pages[page];
  if (pg.Verified() || pg.checksum == kNoChecksum) return absl::OkStatus();
  ++integrity_.pages_verified;
  integrity_.bytes_verified += layout_.host_page_bytes();
  if (PageChecksumMatches({HostPageData(pg.host_page), layout_.host_page_bytes()}, pg.checksum)) {
    DHS_CHECK_OK(kv.Transition(page, HostCopy::kWritten, HostCopy::kVerified));  // host-ready, not verified
    return absl::OkStatus();
  }
  ++integrity_.mismatches;
  spdlog::error("KV: host page {} (history page {} of request {}) does not match its confirmed checksum", pg.host_page,
                page, kv.id);
  absl::Status lost = absl::DataLossError(absl::StrCat("KV: host page ", pg.host_page, " (history page ", page,
                                                       " of request ", kv.id,
                                                       ") changed after its copy was confirmed (checksum mismatch)"));
  if (std::none_of(data_loss_.begin(), data_loss_.end(), [&](const auto& d) { return d.first == kv.id; })) {
    data_loss_.emplace_back(kv.id, lost);
  }
  return lost;
}

uint64_t HierarchicalKvAccess::HostChecksum(RequestId request, uint32_t page) const {
  auto it = requests_.find(request);
  if (it == requests_.end() || page >= it->second->pages.size()) return kNoChecksum;
  const KvPage& pg = it->second->pages[page];
  return pg.HostReady() ? pg.checksum : kNoChecksum;
}

absl::Status HierarchicalKvAccess::ImportHostPages(RequestId request, std::span<const uint32_t> pages,
                                                   std::span<const uint64_t> checksums) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  if (std::any_of(kv.appended.begin(), kv.appended.end(), [](Position n) { return n != 0; })) {
    return absl::FailedPreconditionError(absl::StrCat("KV: request ", request, " has rows already"));
  }
  for (uint32_t j : pages) {
    if (j >= kv.host_plan.size() || kv.host_plan[j] < 0) {
      return absl::FailedPreconditionError(absl::StrCat("KV: page ", j, " of request ", request, " has no host page"));
    }
    if (j < kv.pages.size() && kv.pages[j].host != HostCopy::kNone) {
      return absl::FailedPreconditionError(absl::StrCat("KV: page ", j, " of request ", request, " has a host copy"));
    }
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    const uint32_t j = pages[i];
    kv.GrowPages(j + 1);
    kv.pages[j].host_page = kv.host_plan[j];
    kv.pages[j].checksum = i < checksums.size() ? checksums[i] : kNoChecksum;  // checked by the caller
    DHS_CHECK_OK(kv.Transition(j, HostCopy::kNone, HostCopy::kImported));      // checked above
  }
  return absl::OkStatus();
}

absl::Status HierarchicalKvAccess::ImportHostRows(RequestId request, uint32_t first, uint32_t count,
                                                  std::vector<std::vector<float>>& keys_out) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  const KvConfig& c = layout_.config();
  const Position begin = Position{first} * c.page_rows, end = Position{first + count} * c.page_rows;
  if (std::any_of(kv.appended.begin(), kv.appended.end(), [&](Position n) { return n != begin; })) {
    return absl::FailedPreconditionError(absl::StrCat("KV: request ", request, " is not at the start of page ",
                                                      first, " on every source: its sources hold ",
                                                      absl::StrJoin(kv.appended, ", "), " rows, not ", begin,
                                                      " each"));
  }
  for (uint32_t j = first; j < first + count; ++j) {
    if (j >= kv.pages.size() || !kv.pages[j].HostReady()) {
      return absl::FailedPreconditionError(absl::StrCat("KV: page ", j, " of request ", request,
                                                        " is not host-backed (memd named no confirmed host copy of it, or its copy failed its "
                                                        "checksum at the grant): its rows are appended instead"));
    }
  }
  keys_out.assign(layout_.num_indexers(), {});
  for (uint32_t i = 0; i < layout_.num_indexers(); ++i) {
    const uint64_t kb = c.key_bytes[i];
    keys_out[i].resize(static_cast<size_t>(end - begin) * kb / sizeof(float));
    auto* out = reinterpret_cast<uint8_t*>(keys_out[i].data());
    for (Position t = begin; t < end; ++t) {
      const uint8_t* page = HostPageData(kv.pages[static_cast<size_t>(t / c.page_rows)].host_page);
      std::memcpy(out + (t - begin) * kb, page + layout_.KeyInPage(i, static_cast<uint32_t>(t % c.page_rows)), kb);
    }
  }
  // The tail holds the latest T rows: copied from the host pages (Append of a host-ready page issues no backup).
  const Position from = std::max<Position>(begin, end - Position{c.tail_rows});
  if (from > begin) {
    // Appends from `from` on skip rows: the slots they take hold rows before `begin`, which Append's own check
    // (the row T earlier) would not wait for. Their pages' copies end first.
    for (Position old = std::max<Position>(0, begin - Position{c.tail_rows}); old < begin; ++old) {
      if (absl::Status s = FreeTailSlot(kv, old); !s.ok()) return s;
    }
  }
  for (SourceId s = 0; s < layout_.num_sources(); ++s) kv.appended[s] = from;
  for (Position t = from; t < end; ++t) {
    const uint8_t* page = HostPageData(kv.pages[static_cast<size_t>(t / c.page_rows)].host_page);
    for (SourceId s = 0; s < layout_.num_sources(); ++s) {
      std::span<const uint8_t> row(page + layout_.InPage(s, static_cast<uint32_t>(t % c.page_rows)), c.row_bytes[s]);
      if (absl::Status st = Append(request, s, t, row); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

// The tail slot of row `old` (the row it held; < 0: never used) may be reused once that row's page has a host copy
// or is ready on GPU; waits for the page's copies in flight. Errors: the failed copy's, or RESOURCE_EXHAUSTED.
absl::Status HierarchicalKvAccess::FreeTailSlot(RequestKv& kv, Position old) {
  const KvConfig& c = layout_.config();
  const RequestId request = kv.id;
  if (old >= 0) {
    KvPage& pg = kv.pages[static_cast<size_t>(old / c.page_rows)];
    if (pg.host == HostCopy::kWriting) {
      if (absl::Status s = pg.backup.Wait(); !s.ok()) return s;  // tail slot reused only after its backup
      Update();
    }
    if (pg.gpu == GpuCopy::kFilling && !pg.HostReady()) {
      // ... or after its kept copy. A failed one is reported by Update (a failed publish) and falls back to a host
      // backup there; without one the tail slot cannot be reused and the copy's error is returned.
      const absl::Status kept = pg.populate.Wait();
      Update();
      if (pg.host == HostCopy::kWriting) {
        if (absl::Status s = pg.backup.Wait(); !s.ok()) return s;
        Update();
      }
      if (!kept.ok() && !pg.HostReady()) {
        return absl::Status(kept.code(), absl::StrCat("KV: request ", request, " page ", old / c.page_rows,
                                                      ": kept copy failed and no host copy: ", kept.message()));
      }
    }
    if (!pg.HostReady() && !pg.Ready()) {
      return absl::ResourceExhaustedError(absl::StrCat("KV: tail of request ", request, " is full: page ",
                                                       old / c.page_rows, " has no host copy yet"));
    }
  }
  return absl::OkStatus();
}

absl::Status HierarchicalKvAccess::OnPageComplete(RequestKv& kv, uint32_t page) {
  KvPage& pg = kv.pages[page];
  if (pg.host_page >= 0 || pg.device_page >= 0) return absl::OkStatus();  // re-appended after a Truncate
  if (page < kv.keep_plan.size() && kv.keep_plan[page] >= 0) {
    const PageIndex dp = static_cast<PageIndex>(kv.keep_plan[page]);
    SetKeepPlan(kv, page, -1);
    return KeepOptional(kv, page, dp);
  }
  std::optional<PageIndex> hp;
  if (page < kv.host_plan.size() && kv.host_plan[page] >= 0) {
    hp = static_cast<PageIndex>(kv.host_plan[page]);
  } else if (host_.allocate_host_page) {
    hp = host_.allocate_host_page();
  }
  if (!hp || host_writes_paused_) return absl::OkStatus();  // deferred until BackupPages / ResumeHostWrites
  absl::StatusOr<CopyEvent> b = IssueBackup(kv, page, *hp);
  return b.status();
}

absl::Status HierarchicalKvAccess::ResumeHostWrites() {
  host_writes_paused_ = false;
  for (const HeldKey& k : held_keys_) std::memcpy(HostPageData(k.host_page) + k.offset, k.bytes.data(), k.bytes.size());
  held_keys_.clear();
  const KvConfig& c = layout_.config();
  absl::Status first;
  for (auto& [id, kvp] : requests_) {
    RequestKv& kv = *kvp;
    const Position rows = *std::min_element(kv.appended.begin(), kv.appended.end());
    const auto complete = static_cast<uint32_t>(std::max<Position>(rows, 0) / c.page_rows);
    for (uint32_t j = 0; j < complete && j < kv.pages.size(); ++j) {
      const KvPage& pg = kv.pages[j];
      if (pg.host_page >= 0 || pg.device_page >= 0 || j >= kv.host_plan.size() || kv.host_plan[j] < 0) continue;
      if (j < kv.keep_plan.size() && kv.keep_plan[j] >= 0) continue;
      if (absl::StatusOr<CopyEvent> b = IssueBackup(kv, j, static_cast<PageIndex>(kv.host_plan[j]));
          !b.ok() && first.ok()) {
        first = b.status();
      }
    }
  }
  return first;
}

bool HierarchicalKvAccess::TailHasRoom(RequestId request, Position rows) const {
  for (SourceId s = 0; s < layout_.num_sources(); ++s) {
    if (!TailHasRoom(request, s, rows)) return false;
  }
  return true;
}

bool HierarchicalKvAccess::TailHasRoom(RequestId request, SourceId source, Position rows) const {
  auto it = requests_.find(request);
  if (it == requests_.end() || source >= it->second->appended.size()) return true;
  const RequestKv& kv = *it->second;
  const KvConfig& c = layout_.config();
  const Position n = kv.appended[source];
  for (Position t = n; t < n + rows; ++t) {
    const Position old = t - Position{c.tail_rows};
    if (old < 0) continue;
    const auto j = static_cast<size_t>(old / c.page_rows);
    if (j >= kv.pages.size() || (kv.pages[j].host_page < 0 && kv.pages[j].device_page < 0)) return false;
  }
  return true;
}

Position HierarchicalKvAccess::HoldFrom(RequestId request) const {
  auto it = requests_.find(request);
  if (it == requests_.end() || it->second->hold_from == INT64_MAX) return -1;
  return it->second->hold_from;
}

Position HierarchicalKvAccess::AppendedRows(RequestId request, SourceId source) const {
  auto it = requests_.find(request);
  if (it == requests_.end() || source >= it->second->appended.size()) return 0;
  return it->second->appended[source];
}

absl::Status HierarchicalKvAccess::KeepOptional(RequestKv& kv, uint32_t page, PageIndex device_page) {
  const KvConfig& c = layout_.config();
  if (device_page_owner_[device_page] >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("KV: kept device page ", device_page, " is in use"));
  }
  KvPage& pg = kv.pages[page];
  const Position first = Position{page} * c.page_rows;
  const DeviceRange whole{pool_, layout_.PageRow(device_page, 0, 0), layout_.page_bytes()};
  std::vector<CopyEvent> after{device_->ReadersFence(whole)};
  std::vector<DeviceToDeviceCopy> ops;
  for (SourceId s = 0; s < layout_.num_sources(); ++s) {
    const uint64_t bytes = c.page_rows * c.row_bytes[s];
    ops.push_back(DeviceToDeviceCopy{DeviceRange{pool_, layout_.PageRow(device_page, s, 0), bytes},
                                     DeviceRange{pool_, layout_.TailRow(kv.slot, s, first), bytes}});
    for (Position t = first; t < first + c.page_rows; ++t) {
      const CopyEvent& w = kv.tail_write[s][static_cast<size_t>(t % c.tail_rows)];
      if (!w.Done() || w.Failed()) after.push_back(w);  // the copy waits for the rows' writes
    }
  }
  pg.device_page = device_page;
  DHS_CHECK_OK(kv.Transition(page, GpuCopy::kNone, GpuCopy::kFilling));  // published by Update after the copy
  pg.populate = device_->CopyDeviceToDevice(ops, after);
  SetGpuPageOwner(device_page, static_cast<int64_t>(kv.id), page);
  pending_populates_.push_back(PendingPopulate{kv.id, page, true});
  return absl::OkStatus();
}

void HierarchicalKvAccess::SetKeepPlan(RequestKv& kv, uint32_t page, int64_t dp) {
  if (page < kv.keep_plan.size() && kv.keep_plan[page] >= 0 &&
      keep_planner_[kv.keep_plan[page]] == static_cast<int64_t>(kv.id)) {
    keep_planner_[kv.keep_plan[page]] = -1;
  }
  if (dp < 0 && page >= kv.keep_plan.size()) return;
  if (kv.keep_plan.size() <= page) kv.keep_plan.resize(page + 1, -1);
  kv.keep_plan[page] = dp;
  if (dp >= 0) {
    keep_planner_[dp] = static_cast<int64_t>(kv.id);
    keep_planned_page_[dp] = page;
  }
}

void HierarchicalKvAccess::SetGpuPageOwner(PageIndex dp, int64_t request, uint32_t page) {
  device_page_owner_[dp] = request;
  device_page_page_[dp] = page;
}

absl::Status HierarchicalKvAccess::PlanResidency(RequestId request, SlotIndex slot,
                                                 std::span<const PageIndex> host_pages,
                                                 std::span<const std::pair<uint32_t, PageIndex>> keep) {
  const KvConfig& c = layout_.config();
  for (PageIndex hp : host_pages) {
    if (static_cast<uint64_t>(hp + 1) * layout_.host_page_bytes() > host_.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("KV: host page ", hp, " outside the host pool"));
    }
  }
  for (const auto& [page, dp] : keep) {
    if (dp >= c.optional_pages) {
      return absl::InvalidArgumentError(absl::StrCat("KV: device page ", dp, " outside the optional pool"));
    }
    if (device_page_owner_[dp] >= 0) {
      return absl::FailedPreconditionError(absl::StrCat("KV: device page ", dp, " is in use"));
    }
  }
  absl::StatusOr<RequestKv*> kvp = Admit(request, slot);
  if (!kvp.ok()) return kvp.status();
  RequestKv& kv = **kvp;
  kv.host_plan.assign(host_pages.begin(), host_pages.end());
  for (uint32_t page = 0; page < kv.keep_plan.size(); ++page) SetKeepPlan(kv, page, -1);
  for (const auto& [page, dp] : keep) {
    if (page < kv.pages.size() && (kv.pages[page].host_page >= 0 || kv.pages[page].device_page >= 0)) {
      return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", request,
                                                        " is already complete"));
    }
    SetKeepPlan(kv, page, dp);
  }
  return absl::OkStatus();
}

bool HierarchicalKvAccess::DropKeep(RequestId request, uint32_t page) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return false;
  RequestKv& kv = *it->second;
  if (page >= kv.keep_plan.size() || kv.keep_plan[page] < 0) return false;
  SetKeepPlan(kv, page, -1);
  return true;
}

bool HierarchicalKvAccess::Complete(const RequestKv& kv, uint32_t page) const {
  // A page with an unverified row (a speculative round held from below its end) completes only at CommitVerified, and
  // a page completes by growing `pages` (AppendRun, CommitVerified, ImportHostPages): rows of every source alone do not
  // make it complete (found by libdhs_api HeldPagesAreNotReclaimedAsComplete: a reclaim took a held page as complete,
  // its backup failed and the keep restored after it indexed a page never grown).
  const Position end = Position{page + 1} * layout_.config().page_rows;
  return page < kv.pages.size() && end <= kv.hold_from &&
         std::all_of(kv.appended.begin(), kv.appended.end(), [&](Position n) { return n >= end; });
}

bool HierarchicalKvAccess::InTail(const RequestKv& kv, uint32_t page) const {
  const Position first = Position{page} * layout_.config().page_rows;
  for (SourceId s = 0; s < layout_.num_sources(); ++s) {
    if (first < kv.TailEnd(s) - Position{layout_.config().tail_rows}) return false;
  }
  return true;
}

absl::StatusOr<bool> HierarchicalKvAccess::BackupInsteadOfKeep(RequestId request, uint32_t page,
                                                               PageIndex host_page) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  if (static_cast<uint64_t>(host_page + 1) * layout_.host_page_bytes() > host_.bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("KV: host page ", host_page, " outside the host pool"));
  }
  if (page < kv.pages.size() && (kv.pages[page].host_page >= 0 || kv.pages[page].device_page >= 0)) {
    return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", request,
                                                      " already has a host copy or a device page"));
  }
  if (Complete(kv, page) && !InTail(kv, page)) {
    return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", request,
                                                      " left the tail without a copy"));
  }
  SetKeepPlan(kv, page, -1);
  if (kv.host_plan.size() <= page) kv.host_plan.resize(page + 1, -1);
  kv.host_plan[page] = host_page;
  if (!Complete(kv, page)) return false;  // OnPageComplete issues it into host_plan[page]
  absl::StatusOr<CopyEvent> e = IssueBackup(kv, page, host_page);
  if (!e.ok()) return e.status();
  return true;
}

absl::Status HierarchicalKvAccess::RestoreKeep(RequestId request, uint32_t page, PageIndex device_page) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  if (device_page >= layout_.config().optional_pages) {
    return absl::InvalidArgumentError(absl::StrCat("KV: device page ", device_page, " outside the optional pool"));
  }
  if (device_page_owner_[device_page] >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("KV: device page ", device_page, " is in use"));
  }
  if (page < kv.pages.size() && (kv.pages[page].host_page >= 0 || kv.pages[page].device_page >= 0)) {
    return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", request,
                                                      " already has a host copy or a device page"));
  }
  if (!Complete(kv, page)) {
    SetKeepPlan(kv, page, device_page);
    return absl::OkStatus();
  }
  if (!InTail(kv, page)) {
    return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", request,
                                                      " left the tail without a copy"));
  }
  return KeepOptional(kv, page, device_page);
}

std::optional<uint32_t> HierarchicalKvAccess::HistoryPageOf(RequestId request, PageIndex device_page) const {
  if (device_page >= device_page_owner_.size() || device_page_owner_[device_page] != static_cast<int64_t>(request)) {
    return std::nullopt;
  }
  return device_page_page_[device_page];
}

std::optional<GpuPageUse> HierarchicalKvAccess::GpuPageOf(RequestId request, PageIndex device_page) const {
  if (std::optional<uint32_t> j = HistoryPageOf(request, device_page)) return GpuPageUse{*j, true};
  if (device_page < keep_planner_.size() && keep_planner_[device_page] == static_cast<int64_t>(request)) {
    return GpuPageUse{keep_planned_page_[device_page], false};
  }
  return std::nullopt;
}

PageResidency HierarchicalKvAccess::Residency(RequestId request, uint32_t page) const {
  const RequestKv* kv = Find(request);
  if (kv == nullptr) return PageResidency::kNone;
  if (page < kv->pages.size()) {
    const KvPage& pg = kv->pages[page];
    if (pg.host != HostCopy::kNone) return pg.HostReady() ? PageResidency::kHostWritten : PageResidency::kHostWriting;
    if (pg.device_page >= 0) return PageResidency::kOnGpu;
  }
  if (page < kv->keep_plan.size() && kv->keep_plan[page] >= 0) return PageResidency::kKeepPlanned;
  return PageResidency::kNone;
}

absl::Status HierarchicalKvAccess::BackupHeldPage(RequestId request, uint32_t page, PageIndex host_page) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  if (page >= it->second->pages.size()) {
    return absl::InvalidArgumentError(absl::StrCat("KV: request ", request, " has no page ", page));
  }
  // A keep copy still in flight: back up what it holds. A failed one left the rows in the tail (IssueBackup reads
  // them there) or is reported in the error below.
  const absl::Status copied = it->second->pages[page].populate.Wait();
  absl::StatusOr<CopyEvent> e = IssueBackup(*it->second, page, host_page);
  if (!e.ok() && !copied.ok()) {
    return absl::Status(e.status().code(), absl::StrCat(e.status().message(), " (its GPU copy failed: ",
                                                        copied.message(), ")"));
  }
  return e.status();
}

RequestCopies HierarchicalKvAccess::CopiesInFlight(RequestId request) const {
  RequestCopies out;
  const RequestKv* kv = Find(request);
  if (kv == nullptr) return out;
  for (const KvPage& pg : kv->pages) {
    if (pg.device_page >= 0) out.into_gpu.emplace_back(static_cast<PageIndex>(pg.device_page), pg.populate);
    if (pg.host == HostCopy::kWriting) out.to_host.push_back(pg.backup);
  }
  return out;
}

Census HierarchicalKvAccess::TotalCensus() const {
  Census total;
  for (uint32_t g = 0; g < layout_.config().groups.size(); ++g) total += census(g);
  total.host += staging_census_.rows;
  total.bytes_recovered += staging_census_.bytes;
  return total;
}

absl::StatusOr<CopyEvent> HierarchicalKvAccess::IssueBackup(RequestKv& kv, uint32_t page, PageIndex host_page) {
  const KvConfig& c = layout_.config();
  if (static_cast<uint64_t>(host_page + 1) * layout_.host_page_bytes() > host_.bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("KV: host page ", host_page, " outside the host pool"));
  }
  if (page >= kv.pages.size() || kv.Length(c.groups[0]) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV: request ", kv.id, " has no page ", page));
  }
  for (Position n : kv.appended) {
    if (n < Position{page + 1} * c.page_rows) {
      return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", kv.id, " is incomplete"));
    }
  }
  KvPage& pg = kv.pages[page];
  if (pg.host_page >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", kv.id, " already backed up"));
  }
  const Position first = Position{page} * c.page_rows;
  std::vector<DeviceToHostCopy> ops;
  std::vector<CopyEvent> after;
  uint8_t* host_base = HostPageData(host_page);
  bool in_tail = true;
  for (SourceId s = 0; s < layout_.num_sources(); ++s) {
    in_tail = in_tail && first >= kv.TailEnd(s) - Position{c.tail_rows};
  }
  for (SourceId s = 0; s < layout_.num_sources(); ++s) {
    const uint64_t bytes = c.page_rows * c.row_bytes[s];
    Location src;
    if (in_tail) {
      src = layout_.TailRow(kv.slot, s, first);  // a page is contiguous in the tail ring (T multiple of p)
      for (Position t = first; t < first + c.page_rows; ++t) {
        const CopyEvent& w = kv.tail_write[s][static_cast<size_t>(t % c.tail_rows)];
        if (!w.Done() || w.Failed()) after.push_back(w);  // backup waits for the rows' writes
      }
    } else if (pg.Ready()) {
      src = layout_.PageRow(static_cast<PageIndex>(pg.device_page), s, 0);
    } else {
      return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", kv.id,
                                                        " is neither in the tail nor ready on GPU"));
    }
    ops.push_back(DeviceToHostCopy{host_base + layout_.InPage(s, 0), DeviceRange{pool_, src, bytes}});
  }
  pg.host_page = host_page;
  DHS_CHECK_OK(kv.Transition(page, HostCopy::kNone, HostCopy::kWriting));  // no host page: checked above
  pg.backup = device_->CopyDeviceToHost(ops, after);
  pending_backups_.push_back(PendingBackup{kv.id, page});
  ReachFaultPoint(FaultPoint::kBackup);  // test-only (common/fault_point.h)
  return pg.backup;
}

absl::StatusOr<CopyEvent> HierarchicalKvAccess::BackupPages(RequestId request, std::span<const uint32_t> pages,
                                                            std::span<const PageIndex> host_pages) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  if (pages.size() != host_pages.size()) return absl::InvalidArgumentError("KV: pages and host pages differ in count");
  std::vector<CopyEvent> events;
  for (size_t i = 0; i < pages.size(); ++i) {
    absl::StatusOr<CopyEvent> e = IssueBackup(*it->second, pages[i], host_pages[i]);
    if (!e.ok()) return e.status();
    events.push_back(*e);
  }
  return device_->CopyDeviceToDevice({}, events);  // an empty batch: completes after all of them
}

absl::StatusOr<CopyEvent> HierarchicalKvAccess::WithdrawReady(RequestId request, std::span<const uint32_t> pages) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  std::vector<CopyEvent> events;
  for (uint32_t page : pages) {
    if (page >= kv.pages.size() || kv.pages[page].device_page < 0) {
      return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", request,
                                                        " has no optional-history page"));
    }
  }
  for (uint32_t page : pages) {
    KvPage& pg = kv.pages[page];
    const PageIndex dp = static_cast<PageIndex>(pg.device_page);
    events.push_back(pg.populate);
    events.push_back(device_->ReadersFence(DeviceRange{pool_, layout_.PageRow(dp, 0, 0), layout_.page_bytes()}));
    DHS_CHECK_OK(kv.Transition(page, pg.gpu, GpuCopy::kNone));  // lookups fall back to the hot cache and host now
    pg.device_page = -1;
    pg.populate = CopyEvent();
    SetGpuPageOwner(dp, -1, 0);
  }
  return device_->CopyDeviceToDevice({}, events);
}

absl::StatusOr<CopyEvent> HierarchicalKvAccess::Populate(RequestId request, uint32_t page, PageIndex device_page) {
  const KvConfig& c = layout_.config();
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  if (device_page >= c.optional_pages) {
    return absl::InvalidArgumentError(absl::StrCat("KV: device page ", device_page, " outside the optional pool"));
  }
  if (device_page_owner_[device_page] >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("KV: device page ", device_page, " is in use"));
  }
  if (page >= kv.pages.size() || !kv.pages[page].HostReady()) {
    return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " of request ", request,
                                                      " has no completed host copy"));
  }
  KvPage& pg = kv.pages[page];
  if (pg.device_page >= 0) return absl::FailedPreconditionError(absl::StrCat("KV: page ", page, " already populated"));
  if (absl::Status v = VerifyHostPage(kv, page); !v.ok()) return v;  // issue 22: never populate foreign bytes
  const DeviceRange whole{pool_, layout_.PageRow(device_page, 0, 0), layout_.page_bytes()};
  CopyEvent fence = device_->ReadersFence(whole);
  const uint8_t* host_base = HostPageData(pg.host_page);
  std::vector<HostToDeviceCopy> ops;
  for (SourceId s = 0; s < layout_.num_sources(); ++s) {
    ops.push_back(HostToDeviceCopy{DeviceRange{pool_, layout_.PageRow(device_page, s, 0), c.page_rows * c.row_bytes[s]},
                                   host_base + layout_.InPage(s, 0)});
  }
  pg.device_page = device_page;
  DHS_CHECK_OK(kv.Transition(page, GpuCopy::kNone, GpuCopy::kFilling));  // published by Poll after the copy
  pg.populate = device_->CopyHostToDevice(ops, {&fence, 1});
  SetGpuPageOwner(device_page, static_cast<int64_t>(request), page);
  pending_populates_.push_back(PendingPopulate{request, page, false});
  return pg.populate;
}

absl::Status HierarchicalKvAccess::Retire(std::span<const PageIndex> device_pages) {
  for (PageIndex dp : device_pages) {
    if (dp >= layout_.config().optional_pages) return absl::InvalidArgumentError(absl::StrCat("KV: bad page ", dp));
  }
  absl::Status first;
  for (PageIndex dp : device_pages) {
    const DeviceRange whole{pool_, layout_.PageRow(dp, 0, 0), layout_.page_bytes()};
    absl::Status s;
    if (device_page_owner_[dp] >= 0) {
      s = absl::FailedPreconditionError(absl::StrCat("KV: device page ", dp, " is still in a ready map"));
    } else if (device_->ReadersBusy(whole)) {
      s = absl::FailedPreconditionError(absl::StrCat("KV: device page ", dp, " still has readers"));
    }
    if (s.ok()) continue;
    // memd freed a page that is still mapped or read (it retired before ReadersDone): the asynchronous CPU device
    // poisons it and records a read hazard for the readers in flight (issue 28); other devices do nothing.
    device_->Freed(whole);
    if (first.ok()) first = s;
  }
  return first;
}

void HierarchicalKvAccess::FreeHostPageAfter(PageIndex host_page, std::vector<CopyEvent> events) {
  pending_free_.push_back(PendingFree{host_page, std::move(events)});
}

void HierarchicalKvAccess::Update() {
  std::erase_if(pending_backups_, [&](const PendingBackup& b) {
    auto it = requests_.find(b.request);
    if (it == requests_.end()) return true;  // released: its host page is freed by Release
    KvPage& pg = it->second->pages[b.page];
    if (!pg.backup.Done()) return false;
    const absl::Status s = pg.backup.Status();
    completions_.backups.push_back({b.request, b.page, static_cast<PageIndex>(pg.host_page), s});
    if (s.ok()) {
      DHS_CHECK_OK(it->second->Transition(b.page, HostCopy::kWriting, HostCopy::kWritten));
    } else {
      FreeHostPageAfter(static_cast<PageIndex>(pg.host_page), {});
      pg.host_page = -1;
      DHS_CHECK_OK(it->second->Transition(b.page, HostCopy::kWriting, HostCopy::kNone));
    }
    return true;
  });
  std::erase_if(pending_populates_, [&](const PendingPopulate& p) {
    auto it = requests_.find(p.request);
    if (it == requests_.end()) return true;
    KvPage& pg = it->second->pages[p.page];
    if (pg.gpu == GpuCopy::kNone) return true;  // withdrawn before it was published
    if (!pg.populate.Done()) return false;
    const absl::Status s = pg.populate.Status();
    completions_.published.push_back({p.request, p.page, static_cast<PageIndex>(pg.device_page), s, p.kept});
    if (s.ok()) {
      // The ready map entry, set only after the copy completed (already set when an earlier entry of this page, left
      // by a withdrawal followed by a new populate before this Update, saw the same copy).
      if (pg.gpu == GpuCopy::kFilling) DHS_CHECK_OK(it->second->Transition(p.page, GpuCopy::kFilling, GpuCopy::kReady));
    } else {
      SetGpuPageOwner(static_cast<PageIndex>(pg.device_page), -1, 0);
      DHS_CHECK_OK(it->second->Transition(p.page, GpuCopy::kFilling, GpuCopy::kNone));
      pg.device_page = -1;
      RequestKv& kv = *it->second;
      if (p.kept && !host_writes_paused_ && pg.host_page < 0 && p.page < kv.host_plan.size() &&
          kv.host_plan[p.page] >= 0) {
        // A failed kept copy: the rows are still in the tail (its slots wait for this page), back them up instead.
        const PageIndex hp = static_cast<PageIndex>(kv.host_plan[p.page]);
        if (absl::StatusOr<CopyEvent> b = IssueBackup(kv, p.page, hp); !b.ok()) {
          completions_.backups.push_back({p.request, p.page, hp, b.status()});  // reported as a failed host copy
        }
      }
    }
    return true;
  });
  std::erase_if(pending_free_, [&](const PendingFree& f) {
    if (!std::all_of(f.events.begin(), f.events.end(), [](const CopyEvent& e) { return e.Done(); })) return false;
    if (host_.free_host_page) host_.free_host_page(f.host_page);
    return true;
  });
}

KvCompletions HierarchicalKvAccess::Poll() {
  Update();
  // Host-page integrity (issue 22): the checksum of each completed backup, now that the step that completed it has
  // stored every key of its positions (StoreIndexKeys precedes the page's report in program order).
  for (KvCompletions::Backup& b : completions_.backups) {
    if (!b.status.ok()) continue;
    auto it = requests_.find(b.request);
    if (it == requests_.end() || b.page >= it->second->pages.size()) continue;
    KvPage& pg = it->second->pages[b.page];
    if (!pg.HostReady() || pg.host_page != static_cast<int64_t>(b.host_page)) continue;
    if (pg.checksum == kNoChecksum) {
      // Not marked verified: the first use after this confirmation checks the bytes against it (a byte changed
      // between the confirmation and that use is caught; docs/architecture.md "Host-page integrity").
      pg.checksum = PageChecksum({HostPageData(pg.host_page), layout_.host_page_bytes()});
      ++integrity_.pages_checksummed;
    }
    b.checksum = pg.checksum;
  }
  KvCompletions out = std::move(completions_);
  completions_ = KvCompletions();
  return out;
}

absl::Status HierarchicalKvAccess::Fetch(std::span<const SourceId> sources, std::span<KvQuery> batch) {
  if (sources.empty()) return absl::InvalidArgumentError("KV: Fetch without sources");
  if (sources[0] >= layout_.num_sources()) return absl::InvalidArgumentError(absl::StrCat("KV: unknown source ", sources[0]));
  const uint32_t group = layout_.group_of(sources[0]);
  Update();
  if (arenas_) {
    for (const KvQuery& q : batch) {
      auto it = requests_.find(q.request);
      if (it != requests_.end() && it->second->hold_from != INT64_MAX) return FetchWithStaging(group, sources, batch);
    }
  }
  std::vector<ResolveQuery> queries(batch.size());
  std::vector<std::vector<Location>> locs(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    auto it = requests_.find(batch[i].request);
    if (it == requests_.end()) return absl::InvalidArgumentError(absl::StrCat("KV: unknown request ", batch[i].request));
    if (batch[i].rows_out.size() != sources.size() * batch[i].selection.size()) {
      return absl::InvalidArgumentError("KV: rows_out must hold sources.size() * k entries");
    }
    locs[i].assign(batch[i].rows_out.size(), kNoLocation);
    queries[i] = ResolveQuery{it->second.get(), batch[i].selection, locs[i]};
  }
  if (absl::Status s = resolver_->Resolve(group, sources, queries); !s.ok()) return s;
  std::vector<DeviceRange> read;
  for (size_t i = 0; i < batch.size(); ++i) {
    const size_t k = batch[i].selection.size();
    for (size_t e = 0; e < locs[i].size(); ++e) {
      const Location l = locs[i][e];
      batch[i].rows_out[e] = l == kNoLocation ? nullptr : RowAddress(pool_, l);
      if (l != kNoLocation) read.push_back(DeviceRange{pool_, l, layout_.row_bytes(sources[e / k])});
    }
  }
  readers_[group].push_back(device_->BeginReaders(read));
  return absl::OkStatus();
}

// One round request of a staged Fetch: its queries (batch indices), the union plan, and the one resolver query over
// U_r without its staged rows (first appearance order) with that query's output.
struct HierarchicalKvAccess::RoundUnion {
  RequestKv* kv = nullptr;
  std::vector<size_t> members;
  spec::UnionPlan plan;
  std::vector<Position> unified;
  absl::flat_hash_map<Position, size_t> unified_index;
  std::vector<Location> out;
};

namespace {
// A round request's selections as PlanUnion takes them (pieces of at most k entries) and the query j of each.
struct RoundSelections {
  std::vector<std::span<const Position>> selections;
  std::vector<int64_t> query_of;
  bool located = true;     // every member query has its position (`at`)
  Position n_r = INT64_MAX;  // the smallest `at` of the members
};
}  // namespace

// FetchWithStaging's state across its phases: the batch sorted into plain queries and round unions, the resolver's
// queries, and the arenas this Fetch holds (one per source of the group, acquired only when a row is staged).
struct HierarchicalKvAccess::StagedFetch {
  uint32_t group = 0;
  std::span<const SourceId> sources;
  std::span<KvQuery> batch;
  std::vector<RoundUnion> rounds;
  std::vector<ResolveQuery> queries;
  std::vector<std::vector<Location>> locs;  // by batch index: the output of a plain query
  std::vector<bool> plain;                  // by batch index: not in a round (its own resolver query)
  int64_t staged_rows = 0;
  std::vector<uint32_t> held;  // arena of source index si
  CopyEvent staged;            // the staging copies (complete when none)

  DeviceRange StagingRow(const spec::StagingShape& shape, PoolId pool, const KvConfig& c, size_t si, SlotIndex slot,
                         int64_t row) const {
    return DeviceRange{pool, spec::StagingRowOffset(shape, held[si], slot, row), c.row_bytes[sources[si]]};
  }
};

absl::Status HierarchicalKvAccess::FetchWithStaging(uint32_t group, std::span<const SourceId> sources,
                                                    std::span<KvQuery> batch) {
  StagedFetch f;
  f.group = group;
  f.sources = sources;
  f.batch = batch;
  if (absl::Status s = SortStagedBatch(f); !s.ok()) return s;
  for (RoundUnion& r : f.rounds) {
    if (absl::Status s = PlanRoundUnion(f, r); !s.ok()) return s;
  }
  for (RoundUnion& r : f.rounds) f.queries.push_back(ResolveQuery{r.kv, r.unified, r.out});
  // Execution: one arena per source of the group when any row is staged, each staged row copied once per source
  // from its host page; the resolver's copies (hot cache) meanwhile.
  if (f.staged_rows > 0) {
    if (absl::Status s = IssueStagingCopies(f); !s.ok()) return s;
  }
  if (absl::Status st = resolver_->Resolve(group, sources, f.queries); !st.ok()) {
    AwaitEndedOrLog(f.staged, "staging copy after a failed resolve");  // arena rows are free once the copy ended
    ReleaseStagingArenas(f);
    return st;
  }
  if (absl::Status st = f.staged.Wait(); !st.ok()) {
    ReleaseStagingArenas(f);
    return absl::Status(st.code(), absl::StrCat("KV: staging copy of group ", group, " failed: ", st.message()));
  }
  PublishStagedReads(f);
  return absl::OkStatus();
}

// Phase 1: each batch entry either its own resolver query (a request not in a round, as Fetch without staging) or a
// member of its request's round union. Errors: INVALID_ARGUMENT (unknown request, rows_out of the wrong size).
absl::Status HierarchicalKvAccess::SortStagedBatch(StagedFetch& f) {
  absl::flat_hash_map<RequestId, size_t> round_of;
  f.locs.resize(f.batch.size());
  f.plain.assign(f.batch.size(), false);
  for (size_t i = 0; i < f.batch.size(); ++i) {
    auto it = requests_.find(f.batch[i].request);
    if (it == requests_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("KV: unknown request ", f.batch[i].request));
    }
    if (f.batch[i].rows_out.size() != f.sources.size() * f.batch[i].selection.size()) {
      return absl::InvalidArgumentError("KV: rows_out must hold sources.size() * k entries");
    }
    RequestKv* kv = it->second.get();
    if (kv->hold_from == INT64_MAX) {  // not in a round: its own query, as Fetch without staging
      f.locs[i].assign(f.batch[i].rows_out.size(), kNoLocation);
      f.queries.push_back(ResolveQuery{kv, f.batch[i].selection, f.locs[i]});
      f.plain[i] = true;
      continue;
    }
    auto [at, fresh] = round_of.try_emplace(kv->id, f.rounds.size());
    if (fresh) {
      f.rounds.emplace_back();
      f.rounds.back().kv = kv;
    }
    f.rounds[at->second].members.push_back(i);
  }
  return absl::OkStatus();
}

namespace {
// The selections of a round union's member queries (batch indices `members`) of request `request`, each position checked against the request's `length` rows.
// PlanUnion takes selections of at most k entries: a longer one (a local window wider than k) goes in pieces of the
// same query; `reads` follows the entries in the same order either way. Errors: INVALID_ARGUMENT.
absl::StatusOr<RoundSelections> CollectSelections(RequestId request, std::span<const size_t> members,
                                                  std::span<const KvQuery> batch, Position length, uint32_t k) {
  RoundSelections out;
  for (size_t i : members) {
    out.located = out.located && batch[i].at != kNoPosition;
    out.n_r = std::min(out.n_r, batch[i].at);
  }
  for (size_t i : members) {
    for (Position t : batch[i].selection) {
      if (t < kNoPosition || t >= length) {
        return absl::InvalidArgumentError(
            absl::StrCat("KV: request ", request, " selects position ", t, " but has ", length, " rows"));
      }
    }
    for (size_t from = 0; from < batch[i].selection.size(); from += k) {
      const size_t n = std::min<size_t>(k, batch[i].selection.size() - from);
      out.selections.push_back(batch[i].selection.subspan(from, n));
      out.query_of.push_back(out.located ? batch[i].at - out.n_r : 0);
    }
  }
  return out;
}
}  // namespace

// Phase 2, per round request (spec::PlanUnion): R_r = tail, ready map and this round's hot hits; the hot cache takes
// as many missing rows as it has slots the hits leave unprotected, a staging arena the rest. Then the union's rows
// that the resolver serves (first appearance order) and the checks of the staged rows' host copies.
absl::Status HierarchicalKvAccess::PlanRoundUnion(StagedFetch& f, RoundUnion& r) {
  const KvConfig& c = layout_.config();
  const std::vector<SourceId>& gs = c.groups[f.group];
  RequestKv& kv = *r.kv;
  kv.IndexPages();
  const Position length = kv.Length(gs);
  absl::StatusOr<RoundSelections> sel = CollectSelections(kv.id, r.members, f.batch, length, c.k);
  if (!sel.ok()) return sel.status();
  auto direct = [&](Position t) { return kv.InTail(gs, t, c.tail_rows) || kv.ReadyPage(t, c.page_rows) >= 0; };
  absl::flat_hash_set<Position> hits;
  for (std::span<const Position> s : sel->selections) {
    for (Position t : s) {
      if (t >= 0 && !direct(t) && resolver_->HotHolds(kv.slot, f.group, t)) hits.insert(t);
    }
  }
  spec::UnionPlanInput in{.selections = sel->selections,
                          .k = c.k,
                          .k_max = c.staging_k_max,
                          .frontier = sel->located ? sel->n_r : std::max<Position>(0, length - 1),
                          .hot_budget = static_cast<int64_t>(c.hot_rows) - static_cast<int64_t>(hits.size()),
                          .ready = [&](Position t) { return direct(t) || hits.contains(t); },
                          .query_of = sel->query_of};
  absl::StatusOr<spec::UnionPlan> plan =
      sel->selections.empty() ? absl::StatusOr<spec::UnionPlan>(spec::UnionPlan{}) : spec::PlanUnion(in);
  if (!plan.ok()) {
    return absl::Status(plan.status().code(), absl::StrCat("KV: request ", kv.id, ": ", plan.status().message()));
  }
  r.plan = *std::move(plan);
  size_t e = 0;
  for (std::span<const Position> s : sel->selections) {
    for (Position t : s) {
      const spec::ReadLocation& read = r.plan.reads[e++];
      if (t == kNoPosition || read.from == spec::ReadFrom::kStaging) continue;
      if (r.unified_index.try_emplace(t, r.unified.size()).second) r.unified.push_back(t);
    }
  }
  for (const spec::RowCopy& copy : r.plan.copies) {
    if (copy.to == spec::ReadFrom::kStaging && !kv.HostReady(copy.row, c.page_rows)) {
      return absl::InternalError(absl::StrCat("KV: row ", copy.row, " of request ", kv.id,
                                              " is neither ready on GPU nor backed up on host (safety invariant)"));
    }
    if (copy.to == spec::ReadFrom::kStaging) {  // issue 22: a staged row's host page is verified like a recovery's
      if (absl::Status v = VerifyHostPage(kv, static_cast<uint32_t>(copy.row / c.page_rows)); !v.ok()) return v;
    }
  }
  f.staged_rows += r.plan.staging_copies;
  r.out.assign(f.sources.size() * r.unified.size(), kNoLocation);
  return absl::OkStatus();
}

// Phase 3 (some row staged): one arena per source of the group, then every staged row of every round copied from its
// host page into staging rows 0, 1, .. of each source's arena (one batch, after the fences of readers still reading
// those arena rows). Errors: RESOURCE_EXHAUSTED (no free arena; nothing held).
absl::Status HierarchicalKvAccess::IssueStagingCopies(StagedFetch& f) {
  const KvConfig& c = layout_.config();
  const size_t num_sources = f.sources.size();
  const uint32_t serial = ++staging_serial_;
  for (size_t si = 0; si < num_sources; ++si) {
    absl::StatusOr<uint32_t> arena = arenas_->Acquire(serial, static_cast<uint32_t>(si), 1);
    if (!arena.ok()) {
      ReleaseStagingArenas(f);
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV: no free staging arena for group ", f.group, " (χ = ", arenas_->arenas(),
          ", every one held by a Fetch whose readers have not finished): ", arena.status().message()));
    }
    f.held.push_back(*arena);
  }
  std::vector<HostToDeviceCopy> ops;
  std::vector<CopyEvent> after;
  const auto slot_bytes = static_cast<uint64_t>(staging_shape_.k_max * staging_shape_.k * staging_shape_.row_bytes);
  for (const RoundUnion& r : f.rounds) {
    if (r.plan.staging_copies == 0) continue;
    for (size_t si = 0; si < num_sources; ++si) {
      const DeviceRange rows{staging_pool_id_, spec::StagingRowOffset(staging_shape_, f.held[si], r.kv->slot, 0),
                             slot_bytes};
      if (device_->ReadersBusy(rows)) after.push_back(device_->ReadersFence(rows));
    }
    for (const spec::RowCopy& copy : r.plan.copies) {
      if (copy.to != spec::ReadFrom::kStaging) continue;
      const uint8_t* page = HostPageData(r.kv->pages[static_cast<size_t>(copy.row / c.page_rows)].host_page);
      for (size_t si = 0; si < num_sources; ++si) {
        const auto in_page = static_cast<uint32_t>(copy.row % c.page_rows);
        ops.push_back(HostToDeviceCopy{f.StagingRow(staging_shape_, staging_pool_id_, c, si, r.kv->slot, copy.index),
                                       page + layout_.InPage(f.sources[si], in_page)});
      }
    }
  }
  f.staged = device_->CopyHostToDevice(ops, after);
  return absl::OkStatus();
}

// The arenas `f` acquired, released (an error after IssueStagingCopies: nothing is held after a failed Fetch).
void HierarchicalKvAccess::ReleaseStagingArenas(StagedFetch& f) {
  for (uint32_t arena : f.held) DHS_CHECK_OK(arenas_->ReleaseReader(arena).status());  // held by this Fetch
  f.held.clear();
}

// Phase 4: every (query, entry, source) reads its planned location: a plain query its resolver output; a round's
// entry direct / hot from the resolver's union query, staged from its arena row (the same copy for every query that
// selected the row). One reader over all of them; the arenas stay held until the group's ReadersDone.
void HierarchicalKvAccess::PublishStagedReads(StagedFetch& f) {
  const KvConfig& c = layout_.config();
  const size_t num_sources = f.sources.size();
  std::span<KvQuery> batch = f.batch;
  std::vector<DeviceRange> read;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!f.plain[i]) continue;
    const size_t k = batch[i].selection.size();
    for (size_t e = 0; e < f.locs[i].size(); ++e) {
      const Location l = f.locs[i][e];
      batch[i].rows_out[e] = l == kNoLocation ? nullptr : RowAddress(pool_, l);
      if (l != kNoLocation) read.push_back(DeviceRange{pool_, l, layout_.row_bytes(f.sources[e / k])});
    }
  }
  for (const RoundUnion& r : f.rounds) {
    size_t e0 = 0;
    for (size_t i : r.members) {
      const size_t n = batch[i].selection.size();
      for (size_t j = 0; j < n; ++j) {
        const Position t = batch[i].selection[j];
        const spec::ReadLocation& at = r.plan.reads[e0 + j];
        for (size_t si = 0; si < num_sources; ++si) {
          const uint8_t*& row = batch[i].rows_out[si * n + j];
          if (t == kNoPosition) {
            row = nullptr;
            continue;
          }
          const DeviceRange range =
              at.from == spec::ReadFrom::kStaging
                  ? f.StagingRow(staging_shape_, staging_pool_id_, c, si, r.kv->slot, at.index)
                  : DeviceRange{pool_, r.out[si * r.unified.size() + r.unified_index.at(t)],
                                c.row_bytes[f.sources[si]]};
          row = RowAddress(range.pool, range.offset);
          read.push_back(range);
        }
      }
      e0 += n;
    }
  }
  readers_[f.group].push_back(device_->BeginReaders(read));
  staging_held_[f.group].insert(staging_held_[f.group].end(), f.held.begin(), f.held.end());
  CountStagedFetch(f);
}

// The staging census of a served Fetch: its round unions, and when rows were staged, the Fetch, the rows and their
// bytes (all sources of the group).
void HierarchicalKvAccess::CountStagedFetch(const StagedFetch& f) {
  uint64_t row_bytes_all = 0;
  for (SourceId s : f.sources) row_bytes_all += layout_.config().row_bytes[s];
  staging_census_.unions += f.rounds.size();
  if (f.staged_rows > 0) {
    ++staging_census_.staged_fetches;
    staging_census_.rows += static_cast<uint64_t>(f.staged_rows);
    staging_census_.bytes += static_cast<uint64_t>(f.staged_rows) * row_bytes_all;
  }
}

void HierarchicalKvAccess::ReadersDone(std::span<const SourceId> sources) {
  // Every group named ends (not only the first source's): a caller naming sources of several groups at once (libdhs's
  // dhs_readers_done, where each source is its own group) otherwise left the other groups' readers open for ever, and
  // a later copy ordered after them (a tail write, a hot-cache fill, a keep copy) never ran (the libFuzzer hangs
  // fuzz/corpus/libdhs/timeout-5d954c15... and timeout-edabb974...).
  absl::InlinedVector<uint32_t, 4> groups;
  for (SourceId s : sources) {
    if (s >= layout_.num_sources()) continue;
    const uint32_t group = layout_.group_of(s);
    if (std::find(groups.begin(), groups.end(), group) != groups.end()) continue;
    groups.push_back(group);
    auto& rs = readers_[group];
    for (ReaderId r : rs) device_->EndReaders(r);
    rs.clear();
    for (uint32_t arena : staging_held_[group]) DHS_CHECK_OK(arenas_->ReleaseReader(arena).status());  // held
    staging_held_[group].clear();
  }
}

absl::Status HierarchicalKvAccess::Truncate(RequestId request, Position length) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  const Position p = layout_.config().page_rows;
  const Position n = *std::min_element(kv.appended.begin(), kv.appended.end());
  if (length < (n / p) * p) {
    return absl::FailedPreconditionError(absl::StrCat("KV: cannot truncate request ", request, " to ", length,
                                                      ": rows below ", (n / p) * p, " are immutable"));
  }
  for (Position& a : kv.appended) a = std::min(a, length);
  return absl::OkStatus();
}

absl::Status HierarchicalKvAccess::HoldUnverified(RequestId request, Position from) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  if (kv.hold_from != INT64_MAX) {
    // A second hold would move `from` past held rows: the pages they complete would never be completed (no backup),
    // and the tail slots of their rows never freed (found by the libFuzzer target's corpus: an append then read a page
    // that was never grown).
    return absl::FailedPreconditionError(absl::StrCat("KV: request ", request, " holds a round from ", kv.hold_from,
                                                      " already; commit it before the next hold"));
  }
  const Position n = *std::max_element(kv.appended.begin(), kv.appended.end());
  if (from < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV: request ", request, " holds rows from ", from, " but has ", n, " appended"));
  }
  kv.hold_from = from;
  return absl::OkStatus();
}

absl::Status HierarchicalKvAccess::CommitVerified(RequestId request, Position length) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return absl::NotFoundError(absl::StrCat("KV: unknown request ", request));
  RequestKv& kv = *it->second;
  if (kv.hold_from == INT64_MAX) {
    return absl::FailedPreconditionError(absl::StrCat("KV: request ", request, " commits rows without a hold"));
  }
  const Position n = *std::min_element(kv.appended.begin(), kv.appended.end());
  if (length < kv.hold_from || length > n) {
    return absl::InvalidArgumentError(absl::StrCat("KV: request ", request, " commits ", length, " rows, outside [",
                                                   kv.hold_from, ", ", n, "]"));
  }
  const Position p = layout_.config().page_rows;
  const Position from = kv.hold_from;
  for (Position& a : kv.appended) a = length;  // the rejected rows are dropped (tail only, never copied out)
  kv.hold_from = INT64_MAX;
  // Pages completed by verified rows that the hold kept from completing: those ending in [from, length).
  for (Position page = from / p; (page + 1) * p <= length; ++page) {
    if ((page + 1) * p - 1 < from) continue;  // completed at its Append, before the hold
    kv.GrowPages(static_cast<size_t>(page) + 1);
    if (absl::Status s = OnPageComplete(kv, static_cast<uint32_t>(page)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

void HierarchicalKvAccess::Release(RequestId request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  RequestKv& kv = *it->second;
  for (auto& per_source : kv.tail_write) {
    // The slot's tail and upload buffer may be reused at once. A failed write was the request's error already if a
    // Fetch read its row (the resolver waits for it); one nobody read is only logged: the request ends here.
    for (auto& e : per_source) AwaitEndedOrLog(e, absl::StrCat("tail write of released request ", request));
  }
  for (KvPage& pg : kv.pages) {
    if (pg.host_page >= 0) FreeHostPageAfter(static_cast<PageIndex>(pg.host_page), {pg.backup, pg.populate});
    if (pg.device_page >= 0) SetGpuPageOwner(static_cast<PageIndex>(pg.device_page), -1, 0);
  }
  for (uint32_t page = 0; page < kv.keep_plan.size(); ++page) SetKeepPlan(kv, page, -1);
  slot_used_[kv.slot] = false;
  requests_.erase(it);
  Update();
}

}  // namespace dhs
