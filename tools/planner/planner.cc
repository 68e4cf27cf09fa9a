// tools/planner/planner.cc: see planner.h; the formulas and their sources are in docs/planner.md.
#include "tools/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <initializer_list>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dhs::planner {
namespace {

// Default GPU metadata per hot slot and index producer: an 8-byte position tag and an 8-byte LRU stamp, as
// workerd/kv/hot_cache.h keeps per slot (docs/planner.md, "metadata").
constexpr uint64_t kDefaultMetadataBytesPerHotSlot = 16;

Topology Glm5Like() {
  Topology t;
  t.name = "glm5-like";
  t.payload_layers = 78;
  t.index_producers = 21;
  t.top_k = 2048;
  t.payload_row_bytes = 576;
  t.index_key_bytes = 132;
  t.page_rows = 64;
  t.hot_rows = 4096;
  t.tail_rows = 64;  // one page
  t.metadata_bytes_per_hot_slot = kDefaultMetadataBytesPerHotSlot;
  t.selections_per_token = 21;           // one selection per index producer
  t.rows_per_selection = 78.0 / 21.0;    // "~3.7 follower payload layers" per selection: L_pay / L_idx
  t.drafter_window = 2048;
  t.k_max = 8;
  t.draft_bytes_per_row = 12288;         // all 6 draft layers together
  t.live_payload_layers = 4;
  t.slots = 64;
  return t;
}

Topology Dsv4FlashLike() {
  Topology t;
  t.name = "dsv4flash-like";
  t.payload_layers = 8;
  t.index_producers = 8;
  t.top_k = 512;
  t.payload_row_bytes = 288;
  t.index_key_bytes = 132;
  t.page_rows = 64;
  t.hot_rows = 1024;                     // 2k, the glm5-like ratio B / k (§8 gives none)
  t.tail_rows = 64;                      // one page, as glm5-like
  t.metadata_bytes_per_hot_slot = kDefaultMetadataBytesPerHotSlot;
  t.selections_per_token = 8;            // one fresh top-k per source (Reuse consumers resolve nothing)
  t.rows_per_selection = 1;              // "one source row per selection"
  t.drafter_window = 2048;               // drafter as glm5-like (§8 gives none)
  t.k_max = 8;
  t.draft_bytes_per_row = 12288;
  t.live_payload_layers = 1;             // one source live at a time: its consumers share it
  t.slots = 64;
  return t;
}

// 64-bit arithmetic that records the first overflow with the figure it happened in.
class Checked {
 public:
  uint64_t Mul(std::initializer_list<uint64_t> factors, std::string_view figure) {
    uint64_t r = 1;
    for (uint64_t f : factors) {
      if (__builtin_mul_overflow(r, f, &r)) Overflow(figure);
    }
    return r;
  }
  uint64_t Add(std::initializer_list<uint64_t> terms, std::string_view figure) {
    uint64_t r = 0;
    for (uint64_t t : terms) {
      if (__builtin_add_overflow(r, t, &r)) Overflow(figure);
    }
    return r;
  }
  const absl::Status& status() const { return status_; }

 private:
  void Overflow(std::string_view figure) {
    if (status_.ok()) status_ = absl::OutOfRangeError(absl::StrCat(std::string(figure), " does not fit in 64 bits"));
  }
  absl::Status status_;
};

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", std::string(why)));
}

bool PositiveFinite(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

std::vector<std::string> PresetNames() { return {"glm5-like", "dsv4flash-like"}; }

absl::StatusOr<Topology> Preset(std::string_view name) {
  if (name == "glm5-like") return Glm5Like();
  if (name == "dsv4flash-like") return Dsv4FlashLike();
  return absl::NotFoundError(
      absl::StrCat("unknown preset '", std::string(name), "' (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
}

absl::StatusOr<Topology> TopologyFromWorker(const WorkerShape& w, std::string name) {
  if (!w.declared()) {
    return absl::FailedPreconditionError(
        "the worker declared no shape in its Hello (a workerd older than issue 14): give --preset or --file");
  }
  if (w.payload_sources == 0 || w.page_rows == 0 || w.index_producers == 0) {
    return Bad("worker", absl::StrCat("declares ", w.payload_sources, " payload sources, p = ", w.page_rows, " and ",
                                      w.index_producers, " indexers (each must be >= 1)"));
  }
  const uint64_t per_row = uint64_t{w.page_rows} * w.payload_sources;
  if (w.page_bytes == 0 || w.page_bytes % per_row != 0) {
    return Bad("worker", absl::StrCat("its GPU page of ", w.page_bytes, " bytes is not p * L_pay * d_KV = ",
                                      w.page_rows, " * ", w.payload_sources, " * d_KV for a whole d_KV"));
  }
  Topology t;
  t.name = std::move(name);
  t.payload_layers = w.payload_sources;
  t.index_producers = w.index_producers;
  t.top_k = w.top_k;
  t.payload_row_bytes = w.page_bytes / per_row;
  t.index_key_bytes = w.index_key_bytes;
  t.page_rows = w.page_rows;
  t.hot_rows = w.hot_rows;
  t.tail_rows = w.tail_rows;
  t.metadata_bytes_per_hot_slot = 0;  // workerd's declared pages count no metadata (SessionRequiredPages)
  t.selections_per_token = static_cast<double>(w.index_producers);
  t.rows_per_selection = static_cast<double>(w.fetched_rows_per_token) / static_cast<double>(w.index_producers);
  t.drafter_window = w.drafter_window;
  t.k_max = w.k_max;
  t.draft_bytes_per_row = w.draft_bytes_per_row;
  t.live_payload_layers = w.staging_arenas;
  t.slots = w.request_slots;
  t.speculation = w.speculating();
  return t;
}

absl::StatusOr<Topology> TopologyFromJson(std::string_view text) {
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("description: not valid JSON");
  if (!doc.is_object()) return absl::InvalidArgumentError("description: must be a JSON object");
  Topology t;
  t.name = "custom";
  t.metadata_bytes_per_hot_slot = kDefaultMetadataBytesPerHotSlot;
  struct IntField {
    uint64_t* dst;
    bool required;
  };
  const std::map<std::string, IntField> ints = {
      {"payload_layers", {&t.payload_layers, true}},
      {"index_producers", {&t.index_producers, true}},
      {"top_k", {&t.top_k, true}},
      {"payload_row_bytes", {&t.payload_row_bytes, true}},
      {"index_key_bytes", {&t.index_key_bytes, true}},
      {"page_rows", {&t.page_rows, true}},
      {"hot_rows", {&t.hot_rows, true}},
      {"tail_rows", {&t.tail_rows, true}},
      {"metadata_bytes_per_hot_slot", {&t.metadata_bytes_per_hot_slot, false}},
      {"drafter_window", {&t.drafter_window, true}},
      {"k_max", {&t.k_max, true}},
      {"draft_bytes_per_row", {&t.draft_bytes_per_row, true}},
      {"live_payload_layers", {&t.live_payload_layers, true}},
      {"slots", {&t.slots, true}},
  };
  const std::map<std::string, double*> reals = {
      {"selections_per_token", &t.selections_per_token},
      {"rows_per_selection", &t.rows_per_selection},
  };
  for (const auto& [key, value] : doc.items()) {
    if (key == "name") {
      if (!value.is_string()) return Bad("description: name", "must be a string");
      t.name = value.get<std::string>();
    } else if (key == "speculation") {
      if (!value.is_boolean()) return Bad("description: speculation", "must be true or false, got " + value.dump());
      t.speculation = value.get<bool>();
    } else if (auto it = ints.find(key); it != ints.end()) {
      if (!value.is_number_unsigned()) {
        return Bad(absl::StrCat("description: ", key), "must be a non-negative integer, got " + value.dump());
      }
      *it->second.dst = value.get<uint64_t>();
    } else if (auto rt = reals.find(key); rt != reals.end()) {
      if (!value.is_number() || !std::isfinite(value.get<double>()) || value.get<double>() < 0) {
        return Bad(absl::StrCat("description: ", key), "must be a non-negative number, got " + value.dump());
      }
      *rt->second = value.get<double>();
    } else {
      return Bad(absl::StrCat("description: ", key), "unknown key");
    }
  }
  for (const auto& [key, field] : ints) {
    if (field.required && !doc.contains(key)) return Bad(absl::StrCat("description: ", key), "missing");
  }
  for (const auto& [key, dst] : reals) {
    if (!doc.contains(key)) return Bad(absl::StrCat("description: ", key), "missing");
  }
  return t;
}

absl::Status Validate(const PlanInput& in) {
  const Topology& t = in.topology;
  if (in.context_tokens == 0) return Bad("context_tokens", "must be >= 1");
  const std::pair<const char*, uint64_t> nonzero[] = {
      {"payload_layers", t.payload_layers}, {"index_producers", t.index_producers},
      {"top_k", t.top_k},                   {"payload_row_bytes", t.payload_row_bytes},
      {"index_key_bytes", t.index_key_bytes}, {"page_rows", t.page_rows},
      {"hot_rows", t.hot_rows},             {"slots", t.slots},
  };
  for (const auto& [field, value] : nonzero) {
    if (value == 0) return Bad(field, "must be >= 1");
  }
  if (t.speculation && t.k_max == 0) return Bad("k_max", "must be >= 1 (with speculation)");
  if (t.hot_rows < t.top_k) {
    return Bad("hot_rows", absl::StrCat("B = ", t.hot_rows, " is below k = ", t.top_k,
                                        " (one selection must fit the hot cache, brief §5)"));
  }
  if (t.tail_rows % t.page_rows != 0) {
    return Bad("tail_rows", absl::StrCat(t.tail_rows, " is not a multiple of page_rows ", t.page_rows));
  }
  if (t.live_payload_layers > t.payload_layers) {
    return Bad("live_payload_layers", absl::StrCat("χ = ", t.live_payload_layers, " exceeds payload_layers ",
                                                   t.payload_layers));
  }
  if (!PositiveFinite(t.selections_per_token)) return Bad("selections_per_token", "must be a finite number > 0");
  if (!PositiveFinite(t.rows_per_selection)) return Bad("rows_per_selection", "must be a finite number > 0");
  if (!(in.miss_rate >= 0 && in.miss_rate <= 1)) return Bad("miss_rate", "must be in [0, 1]");
  if (in.hbm_bytes && *in.hbm_bytes == 0) return Bad("hbm_bytes", "must be >= 1");
  if (in.host_bytes && *in.host_bytes == 0) return Bad("host_bytes", "must be >= 1");
  if (in.tpot_base_ms.has_value() != in.tpot_spec_ms.has_value()) {
    return Bad(in.tpot_base_ms ? "tpot_spec_ms" : "tpot_base_ms", "give both TPOT figures or neither");
  }
  if (in.tpot_base_ms) {
    if (!PositiveFinite(*in.tpot_base_ms)) return Bad("tpot_base_ms", "must be a finite number > 0");
    if (!PositiveFinite(*in.tpot_spec_ms)) return Bad("tpot_spec_ms", "must be a finite number > 0");
    if (!in.hbm_bytes) return Bad("hbm_bytes", "needed with the TPOT figures (N_spec and N_base, brief §6)");
  }
  return absl::OkStatus();
}

namespace {

// Compute's phases. The bytes of one session by layout (brief §8, §6), into `p`; an overflow fails (Checked).
absl::Status SessionBytes(const PlanInput& in, Plan& p) {
  const Topology& t = in.topology;
  Checked c;
  const uint64_t n = in.context_tokens;
  const uint64_t pg = t.page_rows;
  // §8: "rounded up to whole pages".
  p.padded_context_tokens = c.Mul({CeilDiv(n, pg), pg}, "padded_context_tokens");
  const uint64_t n_pad = p.padded_context_tokens;
  // §8 (metadata): per hot slot and index producer (docs/planner.md).
  p.metadata_bytes_per_session =
      c.Mul({t.metadata_bytes_per_hot_slot, t.hot_rows, t.index_producers}, "metadata_bytes_per_session");
  // §8 resident: n_pad * (L_pay * d_KV + L_idx * d_idx).
  const uint64_t payload_per_pos = c.Mul({t.payload_layers, t.payload_row_bytes}, "payload bytes per position");
  const uint64_t index_per_pos = c.Mul({t.index_producers, t.index_key_bytes}, "index bytes per position");
  p.resident_bytes_per_session =
      c.Mul({n_pad, c.Add({payload_per_pos, index_per_pos}, "resident_bytes_per_session")},
            "resident_bytes_per_session");
  // §8 hierarchical: n_pad * L_idx * d_idx + (B + tail_rows) * L_pay * d_KV + metadata.
  p.hierarchical_bytes_per_session =
      c.Add({c.Mul({n_pad, index_per_pos}, "hierarchical_bytes_per_session"),
             c.Mul({c.Add({t.hot_rows, t.tail_rows}, "hot + tail rows"), payload_per_pos},
                   "hierarchical_bytes_per_session"),
             p.metadata_bytes_per_session},
            "hierarchical_bytes_per_session");
  // §6 draft ring: R_d = p * ceil((W + K_max + p - 1) / p), exactly as the brief writes it (none without speculation:
  // every draft-ring and staging figure below is then 0).
  p.draft_ring_rows =
      t.speculation
          ? c.Mul({CeilDiv(c.Add({t.drafter_window, t.k_max, pg - 1}, "draft_ring_rows"), pg), pg}, "draft_ring_rows")
          : 0;
  p.draft_ring_bytes_per_session = c.Mul({p.draft_ring_rows, t.draft_bytes_per_row}, "draft_ring_bytes_per_session");
  p.draft_ring_bytes_per_gpu = c.Mul({t.slots, p.draft_ring_bytes_per_session}, "draft_ring_bytes_per_gpu");
  // §6 staging: M_stage = χ * N * K_max * k * d_KV; against one arena per payload layer: L_pay * N * K_max * k * d_KV.
  const uint64_t speculating = t.speculation ? 1 : 0;
  p.staging_bytes_per_session =
      c.Mul({speculating, t.live_payload_layers, t.k_max, t.top_k, t.payload_row_bytes}, "staging_bytes_per_session");
  p.staging_bytes_per_gpu = c.Mul({t.slots, p.staging_bytes_per_session}, "staging_bytes_per_gpu");
  p.staging_bytes_one_arena_per_layer =
      c.Mul({speculating, t.payload_layers, t.slots, t.k_max, t.top_k, t.payload_row_bytes},
            "staging_bytes_one_arena_per_layer");
  // §8 with a drafter: add R_d * draft_bytes_per_row and M_stage / N.
  p.hierarchical_with_drafter_bytes_per_session =
      c.Add({p.hierarchical_bytes_per_session, p.draft_ring_bytes_per_session, p.staging_bytes_per_session},
            "hierarchical_with_drafter_bytes_per_session");
  // §8 host tier, extended (resume from host KV, docs/architecture.md "Host pages"): a host page holds its positions'
  // payload rows and their index keys: n_pad * (L_pay * d_KV + L_idx * d_idx).
  p.host_bytes_per_session =
      c.Mul({n_pad, c.Add({payload_per_pos, index_per_pos}, "host bytes per position")}, "host_bytes_per_session");
  return c.status();
}

// §6: whether speculation raises throughput (N_spec / N_base > TPOT_spec / TPOT_base), from the sessions per GPU
// `s` and the TPOT figures (both given, > 0).
SpeculationVerdict Verdict(const SessionsPerGpu& s, double tpot_base_ms, double tpot_spec_ms) {
  SpeculationVerdict v;
  v.sessions_base = s.hierarchical;
  v.sessions_spec = s.hierarchical_with_drafter;
  v.sessions_ratio = static_cast<double>(v.sessions_spec) / static_cast<double>(v.sessions_base);
  v.tpot_ratio = tpot_spec_ms / tpot_base_ms;
  v.break_even_tpot_spec_ms = tpot_base_ms * v.sessions_ratio;
  // Cross-multiplied (N_spec * TPOT_base > N_base * TPOT_spec) so that no rounded quotient decides.
  v.pays = static_cast<double>(v.sessions_spec) * tpot_base_ms >
           static_cast<double>(v.sessions_base) * tpot_spec_ms;
  return v;
}

// Sessions per GPU and per host for the budgets given (with the speculation verdict when the TPOT figures are
// given), into `p`. ResourceExhausted when a budget holds no session.
absl::Status Capacity(const PlanInput& in, Plan& p) {
  const uint64_t n = in.context_tokens;
  if (in.hbm_bytes) {
    const uint64_t x = *in.hbm_bytes;
    SessionsPerGpu s;
    s.resident = x / p.resident_bytes_per_session;
    s.hierarchical = x / p.hierarchical_bytes_per_session;
    s.hierarchical_with_drafter = x / p.hierarchical_with_drafter_bytes_per_session;
    if (s.hierarchical == 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("hbm_bytes: ", x, " bytes hold no hierarchical session (one needs ",
                       p.hierarchical_bytes_per_session, " bytes at context ", n, ")"));
    }
    p.sessions_per_gpu = s;
    if (in.tpot_base_ms) p.speculation = Verdict(s, *in.tpot_base_ms, *in.tpot_spec_ms);
  }
  if (in.host_bytes) {
    const uint64_t y = *in.host_bytes;
    if (y / p.host_bytes_per_session == 0) {
      return absl::ResourceExhaustedError(absl::StrCat("host_bytes: ", y, " bytes hold no session's host tier (one needs ",
                                                       p.host_bytes_per_session, " bytes at context ", n, ")"));
    }
    p.sessions_per_host = y / p.host_bytes_per_session;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> Compute(const PlanInput& in) {
  if (absl::Status s = Validate(in); !s.ok()) return s;
  const Topology& t = in.topology;
  Plan p;
  p.input = in;
  if (absl::Status s = SessionBytes(in, p); !s.ok()) return s;
  p.resident_over_hierarchical =
      static_cast<double>(p.resident_bytes_per_session) / static_cast<double>(p.hierarchical_bytes_per_session);
  p.resident_over_hierarchical_with_drafter = static_cast<double>(p.resident_bytes_per_session) /
                                              static_cast<double>(p.hierarchical_with_drafter_bytes_per_session);
  // §8 fetch: μ * selections_per_token * k * rows_per_selection * d_KV.
  p.host_bytes_per_token = in.miss_rate * t.selections_per_token * static_cast<double>(t.top_k) *
                           t.rows_per_selection * static_cast<double>(t.payload_row_bytes);
  if (absl::Status s = Capacity(in, p); !s.ok()) return s;
  return p;
}

namespace {

nlohmann::json TopologyToJson(const Topology& t) {
  return {{"name", t.name},
          {"payload_layers", t.payload_layers},
          {"index_producers", t.index_producers},
          {"top_k", t.top_k},
          {"payload_row_bytes", t.payload_row_bytes},
          {"index_key_bytes", t.index_key_bytes},
          {"page_rows", t.page_rows},
          {"hot_rows", t.hot_rows},
          {"tail_rows", t.tail_rows},
          {"metadata_bytes_per_hot_slot", t.metadata_bytes_per_hot_slot},
          {"selections_per_token", t.selections_per_token},
          {"rows_per_selection", t.rows_per_selection},
          {"drafter_window", t.drafter_window},
          {"k_max", t.k_max},
          {"draft_bytes_per_row", t.draft_bytes_per_row},
          {"live_payload_layers", t.live_payload_layers},
          {"slots", t.slots},
          {"speculation", t.speculation}};
}

template <typename T>
nlohmann::json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::string Bytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return absl::StrFormat("%d B (%.2f GiB)", b, static_cast<double>(b) / (1 << 30));
  if (b >= (uint64_t{1} << 20)) return absl::StrFormat("%d B (%.2f MiB)", b, static_cast<double>(b) / (1 << 20));
  return absl::StrFormat("%d B", b);
}

}  // namespace

nlohmann::json PlanToJson(const Plan& p) {
  nlohmann::json input = {{"topology", TopologyToJson(p.input.topology)},
                          {"context_tokens", p.input.context_tokens},
                          {"hbm_bytes", OrNull(p.input.hbm_bytes)},
                          {"host_bytes", OrNull(p.input.host_bytes)},
                          {"miss_rate", p.input.miss_rate},
                          {"tpot_base_ms", OrNull(p.input.tpot_base_ms)},
                          {"tpot_spec_ms", OrNull(p.input.tpot_spec_ms)}};
  nlohmann::json sessions = nullptr;
  if (p.sessions_per_gpu) {
    sessions = {{"resident", p.sessions_per_gpu->resident},
                {"hierarchical", p.sessions_per_gpu->hierarchical},
                {"hierarchical_with_drafter", p.sessions_per_gpu->hierarchical_with_drafter}};
  }
  nlohmann::json spec = nullptr;
  if (p.speculation) {
    const SpeculationVerdict& v = *p.speculation;
    spec = {{"sessions_base", v.sessions_base},
            {"sessions_spec", v.sessions_spec},
            {"sessions_ratio", v.sessions_ratio},
            {"tpot_ratio", v.tpot_ratio},
            {"break_even_tpot_spec_ms", v.break_even_tpot_spec_ms},
            {"pays", v.pays}};
  }
  return {{"input", input},
          {"padded_context_tokens", p.padded_context_tokens},
          {"metadata_bytes_per_session", p.metadata_bytes_per_session},
          {"resident_bytes_per_session", p.resident_bytes_per_session},
          {"hierarchical_bytes_per_session", p.hierarchical_bytes_per_session},
          {"hierarchical_with_drafter_bytes_per_session", p.hierarchical_with_drafter_bytes_per_session},
          {"resident_over_hierarchical", p.resident_over_hierarchical},
          {"resident_over_hierarchical_with_drafter", p.resident_over_hierarchical_with_drafter},
          {"draft_ring_rows", p.draft_ring_rows},
          {"draft_ring_bytes_per_session", p.draft_ring_bytes_per_session},
          {"draft_ring_bytes_per_gpu", p.draft_ring_bytes_per_gpu},
          {"staging_bytes_per_session", p.staging_bytes_per_session},
          {"staging_bytes_per_gpu", p.staging_bytes_per_gpu},
          {"staging_bytes_one_arena_per_layer", p.staging_bytes_one_arena_per_layer},
          {"sessions_per_gpu", sessions},
          {"host_bytes_per_session", p.host_bytes_per_session},
          {"sessions_per_host", OrNull(p.sessions_per_host)},
          {"host_bytes_per_token", p.host_bytes_per_token},
          {"speculation", spec}};
}

std::string PlanToTable(const Plan& p) {
  const Topology& t = p.input.topology;
  std::vector<std::pair<std::string, std::string>> rows;
  auto row = [&](std::string k, std::string v) { rows.emplace_back(std::move(k), std::move(v)); };
  row("preset", t.name);
  row("context n (padded n_pad)", absl::StrCat(p.input.context_tokens, " tokens (", p.padded_context_tokens, ")"));
  row("slots N, hot rows B, tail rows", absl::StrCat(t.slots, ", ", t.hot_rows, ", ", t.tail_rows));
  row("resident per session", Bytes(p.resident_bytes_per_session));
  row("hierarchical per session", Bytes(p.hierarchical_bytes_per_session));
  row("  of which metadata", Bytes(p.metadata_bytes_per_session));
  row("hierarchical + drafter per session", Bytes(p.hierarchical_with_drafter_bytes_per_session));
  row("resident / hierarchical", absl::StrFormat("%.2f", p.resident_over_hierarchical));
  row("resident / (hierarchical + drafter)", absl::StrFormat("%.2f", p.resident_over_hierarchical_with_drafter));
  row("draft ring R_d", absl::StrCat(p.draft_ring_rows, " rows per slot"));
  row("draft ring per session", Bytes(p.draft_ring_bytes_per_session));
  row("draft ring per GPU (N slots)", Bytes(p.draft_ring_bytes_per_gpu));
  row(absl::StrCat("staging M_stage per GPU (chi = ", t.live_payload_layers, ")"), Bytes(p.staging_bytes_per_gpu));
  row("staging share per session (M_stage / N)", Bytes(p.staging_bytes_per_session));
  row(absl::StrCat("staging, one arena per payload layer (", t.payload_layers, ")"),
      Bytes(p.staging_bytes_one_arena_per_layer));
  if (p.sessions_per_gpu) {
    row(absl::StrCat("sessions per GPU (", *p.input.hbm_bytes, " B)"),
        absl::StrCat("resident ", p.sessions_per_gpu->resident, ", hierarchical ", p.sessions_per_gpu->hierarchical,
                     ", with drafter ", p.sessions_per_gpu->hierarchical_with_drafter));
  } else {
    row("sessions per GPU", "- (give --hbm-bytes)");
  }
  row("host tier per session", Bytes(p.host_bytes_per_session));
  row("sessions per host",
      p.sessions_per_host ? absl::StrCat(*p.sessions_per_host, " (", *p.input.host_bytes, " B)")
                          : std::string("- (give --host-bytes)"));
  row(absl::StrFormat("host bytes per token (miss rate %g)", p.input.miss_rate),
      absl::StrFormat("%.1f B", p.host_bytes_per_token));
  if (p.speculation) {
    const SpeculationVerdict& v = *p.speculation;
    row("speculation pays",
        absl::StrFormat("%s: N_spec/N_base = %d/%d = %.4f %s TPOT_spec/TPOT_base = %.4f (break-even TPOT_spec %.3f ms)",
                        v.pays ? "yes" : "no", v.sessions_spec, v.sessions_base, v.sessions_ratio,
                        v.pays ? ">" : "<=", v.tpot_ratio, v.break_even_tpot_spec_ms));
  } else {
    row("speculation pays", "- (give --hbm-bytes, --tpot-base-ms and --tpot-spec-ms)");
  }
  size_t width = 0;
  for (const auto& [k, v] : rows) width = std::max(width, k.size());
  std::string out;
  for (const auto& [k, v] : rows) absl::StrAppend(&out, k, std::string(width - k.size() + 2, ' '), v, "\n");
  return out;
}

// ---------------------------------------------------------------- live

namespace {

// o[key] as a non-negative integer into `out`; INVALID_ARGUMENT naming `what` and the key otherwise.
template <typename T>
absl::Status UnsignedField(const nlohmann::json& o, const char* key, std::string_view what, T& out) {
  if (!o.is_object() || !o.contains(key) || !o[key].is_number_unsigned() ||
      o[key].get<uint64_t>() > std::numeric_limits<T>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": \"", key,
                                                   "\" missing or not a non-negative integer (memd too old?)"));
  }
  out = static_cast<T>(o[key].get<uint64_t>());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerShape> WorkerShapeFromJson(const nlohmann::json& j) {
  constexpr std::string_view kWhat = "memd's status: worker";
  WorkerShape w;
  if (!j.is_object() || !j.contains("serving_mode") || !j["serving_mode"].is_string()) {
    return absl::InvalidArgumentError(std::string(kWhat) + ": \"serving_mode\" missing or not a string");
  }
  w.serving_mode = j["serving_mode"].get<std::string>();
  absl::Status st;
  ForEachNumericField(w, [&](const char* key, auto& out) {
    if (st.ok()) st = UnsignedField(j, key, kWhat, out);
  });
  if (!st.ok()) return st;
  return w;
}

absl::StatusOr<LiveState> LiveStateFromStatusJson(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("memd's status is not a JSON object");
  constexpr std::string_view kWhat = "memd's status";
  LiveState s;
  if (!j.contains("host")) return absl::InvalidArgumentError("memd's status: \"host\" missing");
  if (absl::Status st = UnsignedField(j["host"], "page_bytes", kWhat, s.page_bytes); !st.ok()) return st;
  if (absl::Status st = UnsignedField(j["host"], "reusable", kWhat, s.host_reusable_pages); !st.ok()) return st;
  if (!j.contains("gpus") || !j["gpus"].is_array()) {
    return absl::InvalidArgumentError("memd's status: \"gpus\" missing");
  }
  for (const nlohmann::json& g : j["gpus"]) {
    if (g.is_object() && g.contains("up") && g["up"] == false) {  // fenced (issue 11): admits nothing
      if (g.contains("gpu") && g["gpu"].is_number_unsigned() && g["gpu"].get<uint64_t>() <= UINT32_MAX) {
        s.fenced_gpus.push_back(static_cast<uint32_t>(g["gpu"].get<uint64_t>()));
      }
      continue;
    }
    LiveGpu lg;
    uint64_t id = 0;
    const std::pair<const char*, uint64_t*> fields[] = {
        {"gpu", &id},          {"M", &lg.pages},           {"M_res", &lg.reserve_pages},
        {"free", &lg.free_pages}, {"reclaimable", &lg.reclaimable_pages}, {"reclaiming", &lg.reclaiming_pages},
        {"slots", &lg.slots},  {"slots_used", &lg.slots_used}, {"queued", &lg.queued},
        {"queued_required", &lg.queued_required_pages}, {"queued_host", &lg.queued_host_pages}};
    for (const auto& [key, out] : fields) {
      if (absl::Status st = UnsignedField(g, key, kWhat, *out); !st.ok()) return st;
    }
    lg.gpu = static_cast<uint32_t>(id);
    if (g.contains("worker") && !g["worker"].is_null()) {
      absl::StatusOr<WorkerShape> w = WorkerShapeFromJson(g["worker"]);
      if (!w.ok()) return w.status();
      lg.worker = *w;
    }
    s.gpus.push_back(lg);
  }
  return s;
}

absl::StatusOr<LivePlan> ComputeLive(const Plan& plan, const LiveState& live, const LiveOptions& options) {
  const Topology& t = plan.input.topology;
  // memd's pool page is a host page: p * (L_pay * d_KV + L_idx * d_idx); its GPU pages hold p * L_pay * d_KV.
  uint64_t gpu_page = 0, keys = 0, host_page = 0;
  if (__builtin_mul_overflow(t.page_rows, t.payload_layers, &gpu_page) ||
      __builtin_mul_overflow(gpu_page, t.payload_row_bytes, &gpu_page) ||
      __builtin_mul_overflow(t.page_rows, t.index_producers, &keys) ||
      __builtin_mul_overflow(keys, t.index_key_bytes, &keys) || __builtin_add_overflow(gpu_page, keys, &host_page) ||
      gpu_page == 0 || live.page_bytes == 0) {
    return absl::FailedPreconditionError("the topology's page size does not fit in 64 bits or is 0, or memd's is 0");
  }
  if (host_page != live.page_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "memd's page is ", live.page_bytes, " bytes but the topology's host page is p * (L_pay * d_KV + L_idx * d_idx) = ",
        t.page_rows, " * (", t.payload_layers, " * ", t.payload_row_bytes, " + ", t.index_producers, " * ",
        t.index_key_bytes, ") = ", host_page, " bytes: the live plan counts in memd's pages, give the topology memd serves"));
  }
  if (live.gpus.empty()) return absl::FailedPreconditionError("memd has no GPU registered (no worker said Hello)");
  std::vector<const LiveGpu*> gpus;
  for (const LiveGpu& g : live.gpus) {
    if (!options.gpu || g.gpu == *options.gpu) gpus.push_back(&g);
  }
  if (gpus.empty()) {
    return absl::NotFoundError(absl::StrCat("GPU ", *options.gpu, " is not registered with memd (or is fenced)"));
  }
  auto sub = [](uint64_t a, uint64_t b) { return a > b ? a - b : 0; };
  LivePlan lp;
  lp.page_bytes = live.page_bytes;
  lp.gpu_page_bytes = gpu_page;
  lp.resident = options.resident;
  // What workerd declares for a request of context n (the same function: common/worker_shape.h).
  SessionPagesInput in;
  in.page_rows = t.page_rows;
  in.page_bytes = gpu_page;
  in.hot_rows = t.hot_rows;
  in.tail_rows = t.tail_rows;
  in.index_producers = t.index_producers;
  in.index_key_bytes = t.index_key_bytes;
  in.resident = options.resident;
  in.slot_draft_ring_bytes = plan.draft_ring_bytes_per_session;
  in.slot_staging_bytes = plan.staging_bytes_per_session;
  lp.required_pages_per_session = SessionRequiredPages(in, plan.input.context_tokens);
  lp.speculation_pages_per_session = SessionSpeculationPages(in);
  lp.host_pages_per_session = plan.padded_context_tokens / t.page_rows;
  uint64_t gpu_sessions = 0;
  uint64_t queued_host = 0;
  for (const LiveGpu& g : live.gpus) queued_host += g.queued_host_pages;  // the host pool is shared by every GPU
  for (const LiveGpu* g : gpus) {
    LiveGpuPlan gp;
    gp.gpu = g->gpu;
    gp.available_pages = sub(sub(g->free_pages, g->reserve_pages) + g->reclaimable_pages + g->reclaiming_pages,
                             g->queued_required_pages);
    gp.sessions = gp.available_pages / lp.required_pages_per_session;
    if (g->slots != 0) {
      gp.free_slots = sub(g->slots, g->slots_used + g->queued);
      gp.sessions = std::min(gp.sessions, *gp.free_slots);
    }
    gpu_sessions += gp.sessions;
    lp.gpus.push_back(gp);
  }
  lp.host_available_pages = sub(live.host_reusable_pages, queued_host);
  lp.sessions_by_host = lp.host_available_pages / lp.host_pages_per_session;
  lp.sessions_now = std::min(gpu_sessions, lp.sessions_by_host);
  return lp;
}

nlohmann::json LivePlanToJson(const LivePlan& l) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const LiveGpuPlan& g : l.gpus) {
    gpus.push_back({{"gpu", g.gpu},
                    {"available_pages", g.available_pages},
                    {"free_slots", g.free_slots ? nlohmann::json(*g.free_slots) : nlohmann::json(nullptr)},
                    {"sessions", g.sessions}});
  }
  return {{"page_bytes", l.page_bytes},
          {"gpu_page_bytes", l.gpu_page_bytes},
          {"resident", l.resident},
          {"required_pages_per_session", l.required_pages_per_session},
          {"speculation_pages_per_session", l.speculation_pages_per_session},
          {"host_pages_per_session", l.host_pages_per_session},
          {"gpus", gpus},
          {"host_available_pages", l.host_available_pages},
          {"sessions_by_host", l.sessions_by_host},
          {"sessions_now", l.sessions_now}};
}

std::string LivePlanToTable(const LivePlan& l) {
  std::string out = absl::StrFormat(
      "live (memd now, host pages of %d B, GPU pages of %d B): a %ssession takes %d GPU pages (%d of them its "
      "speculation share) and %d host pages\n",
      l.page_bytes, l.gpu_page_bytes, l.resident ? "resident " : "", l.required_pages_per_session,
      l.speculation_pages_per_session, l.host_pages_per_session);
  for (const LiveGpuPlan& g : l.gpus) {
    absl::StrAppendFormat(&out, "  GPU %d: %d pages available, %s free slots -> %d sessions\n", g.gpu,
                          g.available_pages, g.free_slots ? absl::StrCat(*g.free_slots) : "unlimited", g.sessions);
  }
  absl::StrAppendFormat(&out, "  host: %d pages available -> %d sessions\n", l.host_available_pages,
                        l.sessions_by_host);
  absl::StrAppendFormat(&out, "sessions memd would admit now: %d\n", l.sessions_now);
  return out;
}

}  // namespace dhs::planner
