// workerd/geometry.cc: see geometry.h.
#include "workerd/geometry.h"

#include <algorithm>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/protocol.h"
#include "common/worker_shape.h"
#include "workerd/speculation/draft_ring.h"
#include "workerd/speculation/drafter_model.h"
#include "workerd/verification/staging_pool.h"

namespace dhs {
namespace {


// The KV groups: one per source, except an index producer's followers, which join its group (brief §5).
std::vector<std::vector<SourceId>> KvGroups(const model::ModelConfig& model) {
  std::vector<std::vector<SourceId>> groups;
  std::vector<int> group_of(model.n_sources(), -1);
  int producer_group = -1;
  for (const model::LayerSpec& l : model.layers) {
    if (l.kind == model::LayerKind::kProducer) {
      producer_group = static_cast<int>(groups.size());
      groups.push_back({l.source});
      group_of[l.source] = producer_group;
    } else if (l.kind == model::LayerKind::kFollower) {
      if (group_of[l.source] < 0) {
        groups[producer_group].push_back(l.source);
        group_of[l.source] = producer_group;
      }
    } else if (group_of[l.source] < 0) {
      group_of[l.source] = static_cast<int>(groups.size());
      groups.push_back({l.source});
    }
  }
  return groups;
}

// The speculation memory of `config` (WorkerGeometry::Speculation): staging with any --speculate mode but off, the
// draft ring with the drafter (its W and row bytes from --drafter-weights). g.page_bytes is set.
absl::Status ComputeSpeculation(const model::ModelConfig& model, const WorkerConfig& config, WorkerGeometry& g) {
  const spec::SpeculationConfig& sc = config.speculation;
  WorkerGeometry::Speculation s;
  if (sc.mode == spec::SpeculateMode::kOff) {
    g.speculation = s;
    return absl::OkStatus();
  }
  const uint64_t page_bytes = g.page_bytes;
  const auto pages_of = [page_bytes](uint64_t bytes) { return CeilDiv(bytes, page_bytes); };
  // The staging arenas ComputeGeometry sized (g.staging_bytes: --staging-arenas χ in the hierarchical modes; none in
  // resident mode or with --staging-arenas 0): the reservation HierarchicalKvAccess allocates is the one declared.
  s.slot_staging_bytes = static_cast<uint64_t>(g.staging_bytes) / config.slots;  // exact: N is a factor of M_stage
  if (sc.mode == spec::SpeculateMode::kFixed || sc.mode == spec::SpeculateMode::kConfidence) {
    absl::StatusOr<std::unique_ptr<spec::DrafterModel>> drafter = spec::DrafterModel::Load(sc.drafter_weights);
    if (!drafter.ok()) {
      return absl::Status(drafter.status().code(), absl::StrCat("--drafter-weights ", sc.drafter_weights, ": ",
                                                                drafter.status().message()));
    }
    const spec::DrafterConfig& dc = (*drafter)->config();
    // The ring the drafter builds (DrafterProposer::Create: W, K_max = --block, the worker's p, N, exactly R_d rows).
    absl::StatusOr<spec::DraftRingGeometry> ring = spec::DraftRingGeometry::Create(
        {.window = dc.window, .k_max = sc.block, .page_rows = config.page_rows, .slots = config.slots,
         .ring_rows = 0, .draft_bytes_per_row = dc.draft_bytes_per_row()});
    if (!ring.ok()) {
      return absl::Status(ring.status().code(), absl::StrCat("--drafter-weights ", sc.drafter_weights, ": ",
                                                             ring.status().message()));
    }
    s.draft_ring_rows = ring->rows_per_slot();
    s.draft_bytes_per_row = dc.draft_bytes_per_row();
    s.drafter_window = dc.window;
    s.draft_ring_bytes = static_cast<uint64_t>(ring->bytes());
    s.slot_draft_ring_bytes = static_cast<uint64_t>(ring->rows_per_slot() * dc.draft_bytes_per_row());
  }
  const uint64_t ring_pages = pages_of(s.slot_draft_ring_bytes), staging_pages = pages_of(s.slot_staging_bytes);
  if (ring_pages + staging_pages > UINT32_MAX / 2) {
    return absl::InvalidArgumentError(absl::StrCat("worker: a slot's draft ring (", s.slot_draft_ring_bytes,
                                                   " bytes) and staging (", s.slot_staging_bytes,
                                                   " bytes) need more pages of ", page_bytes, " bytes than M can be"));
  }
  s.draft_ring_pages = static_cast<uint32_t>(ring_pages);
  s.staging_pages = static_cast<uint32_t>(staging_pages);
  g.speculation = s;
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateGeometry(const model::ModelConfig& model, const WorkerConfig& config, const WorkerGeometry& g) {
  const uint32_t p = g.kv.page_rows, b = g.hot_rows, t = g.tail_rows, c = g.prefill_chunk;
  const uint32_t k = static_cast<uint32_t>(model.top_k), w = static_cast<uint32_t>(model.local_window);
  const bool hierarchical = config.mode != WorkerMode::kResident;
  if (p == 0) return absl::InvalidArgumentError("worker: page rows p must be > 0");
  if (t == 0 || t % p != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker: tail rows T = ", t, " is not a positive multiple of page rows p = ", p));
  }
  if (config.slots == 0) return absl::InvalidArgumentError("worker: request slots N must be > 0");
  if (config.gpu >= kMaxGpus) {  // the GPU is the top 16 bits of the worker's node request ids (worker.h)
    return absl::InvalidArgumentError(absl::StrCat("worker: GPU ", config.gpu, " out of range (at most ", kMaxGpus - 1,
                                                   ")"));
  }
  if (c == 0) return absl::InvalidArgumentError("worker: prefill chunk must be > 0");
  if (hierarchical) {
    // One query selects k rows and reads its local window: the hot cache holds them while it reads (brief §5).
    if (b < k + w) {
      return absl::InvalidArgumentError(absl::StrCat("worker: hot rows B = ", b, " < k + window = ", k, " + ", w, " = ",
                                                     k + w, " (one query's selection must fit the hot cache)"));
    }
    // The tail rule (issue 22). A step appends its C rows to the tail (T slots, row t in slot t mod T) before it reads
    // them; slot t mod T may be reused only once the row it held, t - T, has a host copy (or is ready on GPU), and a
    // page gets its backup only when every source has all its p rows. A chunk may start anywhere in a page (after a
    // prepared prefix, a resume's host run, a decode), so its page may be p - 1 rows along: C + p - 1 <= T.
    if (c > t - p + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker: prefill chunk C = ", c, " > T - p + 1 = ", t, " - ", p, " + 1 = ", t - p + 1,
          ": a step's rows and the partial page before them must fit the tail (a tail slot is reused only once its "
          "page has a host copy); lower --prefill-chunk or raise --tail-rows"));
    }
    // One step's selections of one request stay protected in the hot cache until its readers finish (brief §5).
    if (uint64_t{c} * (k + w) > b) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker: prefill chunk C = ", c, " x (k + window) = ", c, " x ", k + w, " = ", uint64_t{c} * (k + w),
          " > hot rows B = ", b, ": one step's selections must fit the hot cache; lower --prefill-chunk or raise "
          "--hot-rows"));
    }
  }
  const uint64_t m = g.page_bytes == 0 ? 0 : config.hbm_budget_bytes / g.page_bytes;
  if (m == 0 || m > UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("worker: HBM budget of ", config.hbm_budget_bytes,
                                                   " bytes gives ", m, " pages of ", g.page_bytes, " bytes"));
  }
  // Speculation: K_max = --block against the widest round the tail (and, without staging arenas, the hot cache)
  // serves, g.max_block.
  const spec::SpeculationConfig& sc = config.speculation;
  return spec::CheckSpeculation(sc, g.max_block, sc.mode != spec::SpeculateMode::kOff && config.staging_arenas > 0);
}

absl::StatusOr<WorkerGeometry> ComputeGeometry(const model::ModelConfig& model, const WorkerConfig& config) {
  WorkerGeometry g;
  const uint32_t p = config.page_rows;
  const uint32_t k = static_cast<uint32_t>(model.top_k);
  const uint32_t span = k + static_cast<uint32_t>(model.local_window);
  g.kv.page_rows = p;
  g.hot_rows = config.hot_rows != 0 ? config.hot_rows : std::max<uint32_t>(64, 4 * span);
  g.tail_rows = config.tail_rows != 0 ? config.tail_rows : 2 * p;
  // The widest step of one request, queries: its selections fit the hot cache, B / (k + window), and its rows with
  // the partial page before them fit the tail, T - p + 1 (ValidateGeometry). 1 when T < p (refused there).
  const uint32_t tail_cap = g.tail_rows >= p && p > 0 ? g.tail_rows - p + 1 : 1;
  const uint32_t widest_step = std::max<uint32_t>(1, std::min<uint32_t>(span == 0 ? g.hot_rows : g.hot_rows / span,
                                                                        tail_cap));
  // The same in every mode (resident included) so that the modes differ in memory only, not in how prefill
  // interleaves with decode.
  g.prefill_chunk = config.prefill_chunk != 0 ? config.prefill_chunk : widest_step;
  const int n_sources = model.n_sources();
  g.page_bytes = uint64_t{p} * model.row_bytes() * static_cast<uint64_t>(n_sources);
  const spec::SpeculationConfig& sc = config.speculation;
  const bool staging = sc.mode != spec::SpeculateMode::kOff && config.staging_arenas > 0;
  if (staging) {
    // min(K_max, T - p + 1); a block above the tail's cap is refused by CheckSpeculation with these numbers.
    g.max_block = static_cast<uint32_t>(std::max<int64_t>(1, std::min<int64_t>(sc.block, tail_cap)));
  } else {
    g.max_block = widest_step;
  }
  if (absl::Status s = ValidateGeometry(model, config, g); !s.ok()) return s;
  g.capacity_pages = static_cast<uint32_t>(config.hbm_budget_bytes / g.page_bytes);
  if (staging && config.mode != WorkerMode::kResident) {
    g.staging_arenas = config.staging_arenas;
    absl::StatusOr<int64_t> bytes = spec::StagingReservationBytes(
        {g.staging_arenas, config.slots, sc.block, k, static_cast<int64_t>(model.row_bytes())});
    if (!bytes.ok()) return bytes.status();
    g.staging_bytes = *bytes;
  }
  g.kv.row_bytes.assign(n_sources, model.row_bytes());
  g.kv.groups = KvGroups(model);
  g.kv.page_rows = p;
  g.kv.hot_rows = g.hot_rows;
  g.kv.k = k;
  g.kv.tail_rows = g.tail_rows;
  g.kv.slots = config.slots;
  g.kv.optional_pages = g.capacity_pages;
  g.kv.key_bytes.assign(static_cast<size_t>(model.n_indexers()), model.index_key_bytes());
  g.kv.staging_arenas = g.staging_arenas;
  g.kv.staging_k_max = g.staging_arenas > 0 ? static_cast<uint32_t>(sc.block) : 0;
  g.host_page_bytes = HostPageBytes(model, p);
  if (absl::Status s = ComputeSpeculation(model, config, g); !s.ok()) return s;
  return g;
}

uint64_t HostPageBytes(const model::ModelConfig& model, uint32_t page_rows) {
  return uint64_t{page_rows} * (model.row_bytes() * static_cast<uint64_t>(model.n_sources()) +
                                model.index_key_bytes() * static_cast<uint64_t>(model.n_indexers()));
}

lib::EmbeddedConfig EmbeddedConfigOf(const model::ModelConfig& model, const WorkerConfig& config,
                                     const WorkerGeometry& geometry, std::string_view device_name) {
  lib::EmbeddedConfig c;
  c.gpu = config.gpu;
  c.mode = config.mode;
  c.sources = static_cast<uint32_t>(model.n_sources());
  c.row_bytes = static_cast<uint32_t>(model.row_bytes());
  c.indexers = static_cast<uint32_t>(model.n_indexers());
  c.index_key_bytes = static_cast<uint32_t>(model.index_key_bytes());
  c.page_rows = config.page_rows;
  c.top_k = static_cast<uint32_t>(model.top_k);
  // Resident mode reads no hot cache (B is not validated there): the shape's B >= k rule is met with B = k then.
  c.hot_rows = config.mode == WorkerMode::kResident ? std::max(geometry.hot_rows, c.top_k) : geometry.hot_rows;
  c.tail_rows = geometry.tail_rows;
  c.slots = config.slots;
  c.hbm_budget_bytes = config.hbm_budget_bytes;
  // The KV groups (brief §5), numbered in order of first use over the sources (dhs_worker_config.source_groups).
  std::vector<int64_t> group_of(c.sources, -1);
  for (size_t g = 0; g < geometry.kv.groups.size(); ++g) {
    for (SourceId s : geometry.kv.groups[g]) group_of[s] = static_cast<int64_t>(g);
  }
  std::vector<int64_t> number(geometry.kv.groups.size(), -1);
  uint32_t next = 0;
  for (SourceId s = 0; s < c.sources; ++s) {
    int64_t& n = number[static_cast<size_t>(group_of[s])];
    if (n < 0) n = next++;
    c.source_groups.push_back(static_cast<uint32_t>(n));
  }
  c.source_consumers.assign(c.sources, 0);
  for (const model::LayerSpec& l : model.layers) ++c.source_consumers[l.source];
  // Each layer with an indexer makes one selection per token; a selected position costs a row of every source of
  // that layer's KV group (a producer's group: itself and its followers; a write / reindex layer: its own source).
  uint32_t fetched = 0;
  for (const model::LayerSpec& l : model.layers) {
    if (!l.has_indexer()) continue;
    for (const std::vector<SourceId>& group : geometry.kv.groups) {
      if (std::find(group.begin(), group.end(), l.source) != group.end()) {
        fetched += static_cast<uint32_t>(group.size());
      }
    }
  }
  c.fetched_rows_per_token = fetched;
  c.staging_arenas = geometry.staging_arenas;
  c.round_queries =
      config.speculation.mode != spec::SpeculateMode::kOff ? static_cast<uint32_t>(config.speculation.block) : 0;
  const auto saturated = [](int64_t v) { return static_cast<uint32_t>(std::clamp<int64_t>(v, 0, UINT32_MAX)); };
  c.draft_ring_rows = saturated(geometry.speculation.draft_ring_rows);  // beyond the shape's bounds: refused there
  c.draft_bytes_per_row = static_cast<uint64_t>(std::max<int64_t>(geometry.speculation.draft_bytes_per_row, 0));
  c.drafter_window = saturated(geometry.speculation.drafter_window);
  c.device_name = std::string(device_name);
  return c;
}

absl::StatusOr<wire::HelloT> MakeHello(const model::ModelConfig& model, const WorkerConfig& config,
                                       const WorkerGeometry& geometry, std::string_view device_name) {
  absl::StatusOr<wire::HelloT> hello = lib::HelloOf(EmbeddedConfigOf(model, config, geometry, device_name));
  if (!hello.ok()) {
    return absl::Status(hello.status().code(), absl::StrCat("worker: ", hello.status().message()));
  }
  return hello;
}

uint32_t RequiredPages(const model::ModelConfig& model, const WorkerGeometry& geometry, WorkerMode mode,
                       uint64_t context_tokens) {
  SessionPagesInput in;
  in.page_rows = geometry.kv.page_rows;
  in.page_bytes = geometry.page_bytes;
  in.hot_rows = geometry.hot_rows;
  in.tail_rows = geometry.tail_rows;
  in.index_producers = static_cast<uint64_t>(model.n_indexers());
  in.index_key_bytes = model.index_key_bytes();
  in.resident = mode == WorkerMode::kResident;
  in.slot_draft_ring_bytes = geometry.speculation.slot_draft_ring_bytes;
  in.slot_staging_bytes = geometry.speculation.slot_staging_bytes;
  return static_cast<uint32_t>(SessionRequiredPages(in, context_tokens));
}

}  // namespace dhs
