// libdhs/embedded_shape.cc: see embedded_shape.h.
#include "libdhs/embedded_shape.h"

#include <algorithm>
#include <map>
#include <memory>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/protocol.h"
#include "workerd/verification/staging_pool.h"

namespace dhs::lib {
namespace {

// One GPU page: p rows of every source, bytes (unchecked).
uint64_t PageBytesOf(const EmbeddedConfig& c) { return uint64_t{c.page_rows} * c.sources * c.row_bytes; }

absl::Status Field(bool ok, const char* what) {
  return ok ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: ", what));
}

// The most sources of one group (1 without groups).
size_t WidestGroup(const EmbeddedConfig& c) {
  size_t widest = 1;
  std::map<uint32_t, size_t> members;
  for (uint32_t g : c.source_groups) widest = std::max(widest, ++members[g]);
  return widest;
}

absl::Status CheckGroups(const EmbeddedConfig& c) {
  if (c.source_groups.empty()) return absl::OkStatus();  // ABI 1.3: numbered in order of first use
  if (c.source_groups.size() != c.sources) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: source_groups has ", c.source_groups.size(),
                                                   " entries for ", c.sources, " sources"));
  }
  uint32_t next = 0;  // the next new group's number
  for (SourceId s = 0; s < c.sources; ++s) {
    if (c.source_groups[s] > next) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dhs_worker_config: source_groups[", s, "] = ", c.source_groups[s], "; groups are numbered in order of "
          "first use, so it must be at most ", next));
    }
    if (c.source_groups[s] == next) ++next;
  }
  return absl::OkStatus();
}

// Speculation (ABI 1.5 arenas and K_max; ABI 1.8 K_max alone, the drafter's ring).
absl::Status CheckSpeculationShape(const EmbeddedConfig& c) {
  const uint32_t round_cap = c.tail_rows - c.page_rows + 1;  // a held round's rows fit the tail: K_max <= T - p + 1
  if (c.staging_arenas > 0) {  // brief §6 "Staging"; workerd's --staging-arenas / --block
    if (c.round_queries < 1 || c.round_queries > round_cap) {
      return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: round_queries (K_max) ", c.round_queries,
                                                     " with staging arenas must be in [1, T - p + 1 = ", round_cap,
                                                     "]"));
    }
    const size_t widest = WidestGroup(c);
    if (c.staging_arenas < widest || c.staging_arenas > kMaxStagingArenas) {
      return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: staging_arenas (χ) ", c.staging_arenas,
                                                     " must be in [", widest, ", ", kMaxStagingArenas,
                                                     "]: one arena per source of the "
                                                     "largest group (", widest, " sources)"));
    }
  } else if (c.round_queries > round_cap) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: round_queries (K_max) ", c.round_queries,
                                                   " must be at most T - p + 1 = ", round_cap,
                                                   " (a held round's rows fit the tail)"));
  }
  if ((c.draft_ring_rows == 0) != (c.draft_bytes_per_row == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dhs_worker_config: draft_ring_rows (", c.draft_ring_rows, ") and draft_bytes_per_row (",
        c.draft_bytes_per_row, ") must be both 0 (no drafter) or both positive"));
  }
  if (c.drafter_window > 0 && c.draft_ring_rows == 0) {
    return absl::InvalidArgumentError("dhs_worker_config: drafter_window is set without a draft ring "
                                      "(draft_ring_rows)");
  }
  if (c.draft_ring_rows > (1u << 24) || c.draft_bytes_per_row > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: a draft ring of ", c.draft_ring_rows,
                                                   " rows of ", c.draft_bytes_per_row,
                                                   " bytes: at most 2^24 rows of at most 1 GiB"));
  }
  const uint64_t page_bytes = PageBytesOf(c);
  const uint64_t slot_ring = uint64_t{c.draft_ring_rows} * c.draft_bytes_per_row;
  if (CeilDiv(slot_ring, page_bytes) > UINT32_MAX / 2 || slot_ring > kMaxRegionBytes / c.slots) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: the draft ring's ", slot_ring,
                                                   " bytes per slot (", c.slots, " slots) are beyond the bounds"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckShape(const EmbeddedConfig& c) {
  if (absl::Status s = Field(c.gpu < kMaxGpus, "gpu must be below 65536"); !s.ok()) return s;
  if (absl::Status s = Field(c.mode != WorkerMode::kResident || c.staging_arenas == 0,
                             "staging_arenas must be 0 in DHS_MODE_RESIDENT (a held round's rows are read in place)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Field(c.sources >= 1 && c.sources <= 4096, "sources must be in [1, 4096]"); !s.ok()) return s;
  if (absl::Status s = Field(c.row_bytes > 0 && c.row_bytes % 4 == 0 && c.row_bytes <= (1u << 20),
                             "row_bytes must be a positive multiple of 4, at most 1 MiB");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Field(c.indexers <= 4096, "indexers must be at most 4096"); !s.ok()) return s;
  if (absl::Status s = Field(c.indexers == 0 ? c.index_key_bytes == 0
                                             : c.index_key_bytes > 0 && c.index_key_bytes % 4 == 0 &&
                                                   c.index_key_bytes <= (1u << 16),
                             "index_key_bytes must be 0 without indexers, else a positive multiple of 4 (<= 64 KiB)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Field(c.page_rows >= 1 && c.page_rows <= (1u << 20), "page_rows must be in [1, 2^20]");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Field(c.top_k >= 1 && c.top_k <= c.hot_rows, "top_k must be in [1, hot_rows]"); !s.ok()) {
    return s;
  }
  if (absl::Status s = Field(c.hot_rows <= (1u << 31), "hot_rows must be at most 2^31"); !s.ok()) return s;
  if (absl::Status s = Field(c.tail_rows >= c.page_rows && c.tail_rows % c.page_rows == 0 && c.tail_rows <= (1u << 31),
                             "tail_rows must be a positive multiple of page_rows (at most 2^31)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Field(c.slots >= 1 && c.slots <= 4096, "slots must be in [1, 4096]"); !s.ok()) return s;
  if (absl::Status s = CheckGroups(c); !s.ok()) return s;
  if (!c.source_consumers.empty()) {  // ABI 1.8
    if (c.source_consumers.size() != c.sources) {
      return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: source_consumers has ",
                                                     c.source_consumers.size(), " entries for ", c.sources,
                                                     " sources"));
    }
    for (SourceId s = 0; s < c.sources; ++s) {
      if (c.source_consumers[s] == 0 || c.source_consumers[s] > 65536) {
        return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: source_consumers[", s, "] = ",
                                                       c.source_consumers[s], " must be in [1, 65536] (the layers "
                                                       "that read the source)"));
      }
    }
  }
  if (absl::Status s = CheckSpeculationShape(c); !s.ok()) return s;
  const uint64_t page_bytes = PageBytesOf(c);
  const uint64_t m = c.hbm_budget_bytes / page_bytes;
  if (m == 0 || m > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: hbm_budget_bytes ", c.hbm_budget_bytes,
                                                   " gives ", m, " pages of ", page_bytes,
                                                   " bytes; it must give 1 .. 2^32 - 1"));
  }
  // The slot regions (B + T rows per source and slot) and the optional pages in one pool: bounded (kMaxRegionBytes).
  // 128-bit: N * S * (B + T) * d_KV reaches 2^75 within the field bounds.
  const unsigned __int128 pool = static_cast<unsigned __int128>(c.slots) * c.sources *
                                     (uint64_t{c.hot_rows} + c.tail_rows) * c.row_bytes +
                                 static_cast<unsigned __int128>(m) * page_bytes;
  if (pool > kMaxRegionBytes) {
    return absl::InvalidArgumentError("dhs_worker_config: the KV pool would take more than 1 TiB");
  }
  return absl::OkStatus();
}

KvConfig KvConfigOf(const EmbeddedConfig& config) {
  KvConfig kv;
  kv.row_bytes.assign(config.sources, config.row_bytes);
  for (SourceId s = 0; s < config.sources; ++s) {
    const uint32_t g = config.source_groups.empty() ? s : config.source_groups[s];
    if (g == kv.groups.size()) kv.groups.emplace_back();
    kv.groups[g].push_back(s);
  }
  kv.page_rows = config.page_rows;
  kv.hot_rows = config.hot_rows;
  kv.k = config.top_k;
  kv.tail_rows = config.tail_rows;
  kv.slots = config.slots;
  const uint64_t page_bytes = PageBytesOf(config);
  kv.optional_pages = static_cast<uint32_t>(config.hbm_budget_bytes / page_bytes);
  kv.key_bytes.assign(config.indexers, config.index_key_bytes);
  kv.staging_arenas = config.staging_arenas;
  kv.staging_k_max = config.staging_arenas > 0 ? config.round_queries : 0;
  return kv;
}

absl::StatusOr<RegionLayout> RegionOf(const EmbeddedConfig& config) {
  if (absl::Status s = CheckShape(config); !s.ok()) return s;
  absl::StatusOr<KvLayout> layout = KvLayout::Create(KvConfigOf(config));
  if (!layout.ok()) return layout.status();
  RegionLayout r;
  // Resident mode: the pool is ResidentKvAccess's arena, the budget's whole pages (p rows of every source each).
  r.kv_bytes = config.mode == WorkerMode::kResident ? uint64_t{layout->config().optional_pages} * layout->page_bytes()
                                                    : layout->pool_bytes();
  r.staging_offset = CeilDiv(r.kv_bytes, kEnginePoolAlignment) * kEnginePoolAlignment;
  if (config.staging_arenas > 0) {
    absl::StatusOr<int64_t> staging = spec::StagingReservationBytes(
        {config.staging_arenas, config.slots, config.round_queries, config.top_k, config.row_bytes});
    if (!staging.ok()) return staging.status();
    r.staging_bytes = static_cast<uint64_t>(*staging);
  }
  r.bytes = config.staging_arenas > 0 ? r.staging_offset + r.staging_bytes : r.kv_bytes;
  if (r.bytes > kMaxRegionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("dhs_worker_config: the KV pool and staging arenas would take ",
                                                   r.bytes, " bytes (more than 1 TiB)"));
  }
  return r;
}

absl::StatusOr<wire::HelloT> HelloOf(const EmbeddedConfig& config) {
  absl::StatusOr<RegionLayout> region = RegionOf(config);  // CheckShape first
  if (!region.ok()) return region.status();
  const KvConfig kv = KvConfigOf(config);
  absl::StatusOr<KvLayout> layout = KvLayout::Create(kv);
  if (!layout.ok()) return layout.status();
  wire::HelloT h;
  h.protocol_version = kProtocolVersion;
  h.gpu = config.gpu;
  h.pid = static_cast<uint32_t>(::getpid());
  h.device_name = config.device_name;
  h.capacity_pages = kv.optional_pages;
  h.page_rows = config.page_rows;
  h.page_bytes = layout->page_bytes();
  h.host_page_bytes = layout->host_page_bytes();
  h.request_slots = config.slots;
  for (SourceId s = 0; s < config.sources; ++s) {
    auto info = std::make_unique<wire::SourceInfoT>();
    info->source = s;
    info->bytes_per_row = config.row_bytes;
    info->positions_per_row = 1;
    info->consumers = config.source_consumers.empty() ? 1 : config.source_consumers[s];
    h.sources.push_back(std::move(info));
  }
  // The speculation memory (docs/protocol.md "Speculation memory"): the drafter's N rings, the staging arenas.
  h.has_drafter = config.draft_ring_rows > 0;
  h.draft_ring_rows = config.draft_ring_rows;
  h.draft_ring_bytes = uint64_t{config.slots} * config.draft_ring_rows * config.draft_bytes_per_row;
  h.draft_bytes_per_row = config.draft_bytes_per_row;
  h.drafter_window = config.drafter_window;
  h.staging_arenas = config.staging_arenas;
  h.staging_bytes = region->staging_bytes;
  h.k_max = config.round_queries;
  // The shape `dhsctl plan --live` plans with (issue 14): memd shows it, never decides with it.
  h.serving_mode = std::string(WorkerModeName(config.mode));
  h.index_producers = config.indexers;
  h.index_key_bytes = config.index_key_bytes;
  h.top_k = config.top_k;
  h.hot_rows = config.hot_rows;
  h.tail_rows = config.tail_rows;
  h.fetched_rows_per_token = config.fetched_rows_per_token.value_or(config.sources);
  h.model_fingerprint = config.model_fingerprint;  // 0 = not said
  return h;
}

SessionPagesInput SessionPagesOf(const EmbeddedConfig& config, const RegionLayout& region) {
  SessionPagesInput in;
  in.page_rows = config.page_rows;
  in.page_bytes = PageBytesOf(config);
  in.hot_rows = config.hot_rows;
  in.tail_rows = config.tail_rows;
  in.index_producers = config.indexers;
  in.index_key_bytes = config.index_key_bytes;
  in.resident = config.mode == WorkerMode::kResident;  // the whole context instead of hot cache and tail
  in.slot_draft_ring_bytes = uint64_t{config.draft_ring_rows} * config.draft_bytes_per_row;
  in.slot_staging_bytes = region.staging_bytes / config.slots;  // the slot's share of M_stage (exact: N divides it)
  return in;
}

}  // namespace dhs::lib
