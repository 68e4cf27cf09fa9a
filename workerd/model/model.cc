#include "workerd/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "workerd/model/kernels.h"
#include "workerd/model/step_profile.h"
#include "workerd/model/topk.h"
#include "workerd/model/weights.h"

namespace dhs::model {

struct Model::LayerWeights {
  std::vector<float> attn_norm, kv_norm, w_dkv, w_kr, idx_wq, idx_ww, idx_wk, w_qc, w_qr, w_o, mlp_norm, w_up, w_down;
};

struct Model::Weights {
  std::vector<float> tok_emb, final_norm, lm_head;
  std::vector<LayerWeights> layers;
};

// Static schedule derived from the topology (brief §5 sources and layer groups).
struct Model::Plan {
  std::vector<int> indexer_slot;                 // per layer: index into ModelSession::index_keys_, -1 if none
  std::vector<int> fetch_layer;                  // per layer: the layer whose Fetch supplies its rows
  std::vector<int> source_index;                 // per layer: its source's index in that Fetch's source list
  std::vector<std::vector<SourceId>> sources;    // per fetching layer: the sources of its Fetch (else empty)
  std::vector<std::vector<int>> row_writers;     // per layer: layers whose payload rows it computes and appends
  std::vector<std::vector<int>> release_after;   // per layer: fetching layers whose readers are done after it
};

// One step's state: the batch's queries (query qi = q_offset[b] + j is token j of input b, at position n_b + j), the
// hidden states, and the step buffers, one row per query (Q x width): every projection runs as one weight-stationary
// MatMul over all Q queries of the step, so a weight matrix is streamed from memory once per step for the whole batch.
// Each output element is the same kernels::Dot whatever Q is, so the numerics stay batch-invariant (brief §11).
struct Model::Scratch {
  // Rows handed back by one Fetch: per query qi a block of k + w positions (selection, then window) and
  // S * (k + w) row pointers laid out [selection: source][j] then [window: source][j] (KvQuery::rows_out layout).
  struct Fetched {
    std::vector<Position> positions;
    std::vector<const uint8_t*> rows;
    std::vector<KvQuery> queries;
    size_t n_sources = 0;
    bool outstanding = false;
  };

  Scratch(const ModelConfig& c, std::span<StepInput> in);
  // out_buf[qi * D ..] = RMSNorm(hidden row qi, gain) for every query.
  void NormAll(const ModelConfig& c, const std::vector<float>& gain, std::vector<float>& out_buf);
  void AddDelta();  // hidden += delta

  std::span<StepInput> batch;
  std::vector<size_t> q_offset;
  size_t Q = 0;
  int Qi = 0;
  std::vector<Position> query_pos;
  std::vector<float> hidden, xn, xk, rowbuf, keybuf, idx_q, idx_w, qc, qr, o, delta, ff, scores, o_win, rows;
  std::unique_ptr<bool[]> valid;
  TopK topk;
  std::vector<Fetched> fetched;  // per layer
};

Model::Scratch::Scratch(const ModelConfig& c, std::span<StepInput> in) : batch(in), q_offset(in.size() + 1, 0) {
  const int D = c.d_model, H = c.n_heads, width = c.d_c + c.d_r, span_len = c.top_k + c.local_window;
  for (size_t b = 0; b < batch.size(); ++b) q_offset[b + 1] = q_offset[b] + batch[b].tokens.size();
  Q = q_offset.back();
  Qi = static_cast<int>(Q);
  query_pos.resize(Q);
  for (size_t b = 0; b < batch.size(); ++b) {
    for (size_t j = 0; j < batch[b].tokens.size(); ++j) {
      query_pos[q_offset[b] + j] = batch[b].session->position_ + static_cast<Position>(j);
    }
  }
  const int idx_q_width = c.idx_heads * c.idx_dim;
  hidden.resize(Q * D);
  xn.resize(Q * D);
  xk.resize(Q * D);
  rowbuf.resize(Q * width);
  keybuf.resize(Q * c.idx_dim);
  idx_q.resize(Q * idx_q_width);
  idx_w.resize(Q * c.idx_heads);
  qc.resize(Q * H * c.d_c);
  qr.resize(Q * H * c.d_r);
  o.resize(Q * H * c.d_c);
  delta.resize(Q * D);
  ff.resize(Q * c.d_ff);
  o_win.resize(c.d_c);
  rows.resize(static_cast<size_t>(span_len) * width);
  valid.reset(new bool[std::max(span_len, 1)]);
  fetched.resize(c.n_layers());
}

void Model::Scratch::NormAll(const ModelConfig& c, const std::vector<float>& gain, std::vector<float>& out_buf) {
  const int D = c.d_model;
  for (size_t qi = 0; qi < Q; ++qi) {
    kernels::RmsNorm(hidden.data() + qi * D, gain.data(), D, c.norm_eps, out_buf.data() + qi * D);
  }
}

void Model::Scratch::AddDelta() {
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] += delta[i];
}

Model::Model(ModelConfig config, std::unique_ptr<Weights> weights, uint64_t fingerprint)
    : config_(std::move(config)), weights_(std::move(weights)), plan_(std::make_unique<Plan>()),
      fingerprint_(fingerprint) {
  const int L = config_.n_layers();
  Plan& p = *plan_;
  p.indexer_slot.assign(L, -1);
  p.fetch_layer.assign(L, -1);
  p.source_index.assign(L, 0);
  p.sources.assign(L, {});
  p.row_writers.assign(L, {});
  p.release_after.assign(L, {});
  std::vector<int> last_consumer(config_.n_sources(), -1);
  int slots = 0;
  int producer = -1;
  for (int l = 0; l < L; ++l) {
    const LayerSpec& s = config_.layers[l];
    if (s.has_indexer()) p.indexer_slot[l] = slots++;
    switch (s.kind) {
      case LayerKind::kWrite:
        p.row_writers[l] = {l};
        [[fallthrough]];
      case LayerKind::kReindex:
        p.fetch_layer[l] = l;
        p.sources[l] = {s.source};
        break;
      case LayerKind::kReuse:
        p.fetch_layer[l] = p.fetch_layer[last_consumer[s.source]];
        break;
      case LayerKind::kProducer:
        producer = l;
        p.fetch_layer[l] = l;
        for (int f = l; f < L && (f == l || config_.layers[f].kind == LayerKind::kFollower); ++f) {
          p.row_writers[l].push_back(f);
          p.sources[l].push_back(config_.layers[f].source);
        }
        break;
      case LayerKind::kFollower:
        p.fetch_layer[l] = producer;
        p.source_index[l] = l - producer;
        break;
    }
    last_consumer[s.source] = l;
  }
  for (int f = 0; f < L; ++f) {
    if (p.sources[f].empty()) continue;
    int last = f;
    for (int l = f; l < L; ++l) {
      if (p.fetch_layer[l] == f) last = l;
    }
    p.release_after[last].push_back(f);
  }
}

Model::~Model() = default;

absl::StatusOr<std::unique_ptr<Model>> Model::FromSafetensors(const SafetensorsFile& file) {
  auto meta = file.metadata().find("config");
  if (meta == file.metadata().end()) {
    return absl::InvalidArgumentError("model weights: __metadata__ has no \"config\" entry");
  }
  auto config = ModelConfig::FromJson(meta->second);
  if (!config.ok()) return config.status();
  auto w = std::make_unique<Weights>();
  w->layers.resize(config->n_layers());
  std::set<std::string> expected;
  // The fingerprint (model.h fingerprint()): the canonical config, then every tensor's name and bytes in spec order.
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(XXH3_createState(), &XXH3_freeState);
  if (hash == nullptr || XXH3_64bits_reset(hash.get()) != XXH_OK) {
    return absl::ResourceExhaustedError("model weights: cannot allocate the fingerprint's hash state");
  }
  const std::string canonical = config->ToJson();
  XXH3_64bits_update(hash.get(), canonical.data(), canonical.size());
  for (const TensorSpec& spec : ModelTensorSpecs(*config)) {
    auto data = file.ReadF32(spec.name, spec.shape);
    if (!data.ok()) return data.status();
    expected.insert(spec.name);
    XXH3_64bits_update(hash.get(), spec.name.data(), spec.name.size() + 1);  // with its NUL: names never run together
    XXH3_64bits_update(hash.get(), data->data(), data->size() * sizeof(float));
    std::vector<float>* dst = nullptr;
    if (spec.name == "tok_emb") dst = &w->tok_emb;
    else if (spec.name == "final_norm") dst = &w->final_norm;
    else if (spec.name == "lm_head") dst = &w->lm_head;
    else {
      // "layers.{l}.{field}"
      const size_t dot = spec.name.find('.', 7);
      const int l = std::stoi(spec.name.substr(7, dot - 7));
      const std::string field = spec.name.substr(dot + 1);
      LayerWeights& lw = w->layers[l];
      const std::pair<const char*, std::vector<float>*> fields[] = {
          {"attn_norm", &lw.attn_norm}, {"kv_norm", &lw.kv_norm}, {"w_dkv", &lw.w_dkv},   {"w_kr", &lw.w_kr},
          {"idx_wq", &lw.idx_wq},       {"idx_ww", &lw.idx_ww},   {"idx_wk", &lw.idx_wk}, {"w_qc", &lw.w_qc},
          {"w_qr", &lw.w_qr},           {"w_o", &lw.w_o},         {"mlp_norm", &lw.mlp_norm},
          {"w_up", &lw.w_up},           {"w_down", &lw.w_down}};
      for (const auto& [n, ptr] : fields) {
        if (field == n) dst = ptr;
      }
    }
    if (dst == nullptr) return absl::InternalError(absl::StrCat("model weights: no slot for tensor '", spec.name, "'"));
    *dst = std::move(*data);
  }
  for (const auto& [name, info] : file.tensors()) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("model weights: unexpected tensor '", name, "' for this config"));
    }
  }
  const uint64_t fingerprint = std::max<uint64_t>(XXH3_64bits_digest(hash.get()), 1);  // 0 means "not known" on the wire
  return std::unique_ptr<Model>(new Model(std::move(*config), std::move(w), fingerprint));
}

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path) {
  auto file = SafetensorsFile::Load(path);
  if (!file.ok()) return file.status();
  return FromSafetensors(*file);
}

ModelSession Model::NewSession(RequestId request) const {
  return ModelSession(this, request, config_.n_indexers());
}

absl::Status Model::Step(std::span<StepInput> batch, KvAccess& kv, std::span<StepOutput> out) const {
  if (out.size() != batch.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model step: ", out.size(), " outputs for a batch of ", batch.size()));
  }
  absl::Status s = Run(batch, kv, out);
  if (s.ok() && logits_hook_) logits_hook_(batch, out);
  return s;
}

absl::Status Model::ImportPrefix(ModelSession& session, std::span<const Token> tokens, KvAccess& kv) const {
  StepInput in{&session, tokens};
  return Run(std::span<StepInput>(&in, 1), kv, {});
}

absl::Status Model::ImportRows(ModelSession& session, uint32_t tokens, std::span<const std::vector<uint8_t>> rows,
                               std::span<const std::vector<float>> keys, KvAccess& kv) const {
  const ModelConfig& c = config_;
  if (session.model_ != this) return absl::InvalidArgumentError("import rows: a session of another model");
  if (session.broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("import rows: request ", session.request_, " is broken by an earlier failed step"));
  }
  if (tokens == 0) return absl::InvalidArgumentError("import rows: no tokens");
  if (rows.size() != static_cast<size_t>(c.n_sources()) || keys.size() != static_cast<size_t>(c.n_indexers())) {
    return absl::InvalidArgumentError(absl::StrCat("import rows: ", rows.size(), " sources and ", keys.size(),
                                                   " indexers given, the model has ", c.n_sources(), " and ",
                                                   c.n_indexers()));
  }
  const size_t row_bytes = c.row_bytes();
  for (size_t s = 0; s < rows.size(); ++s) {
    if (rows[s].size() != tokens * row_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("import rows: source ", s, " has ", rows[s].size(),
                                                     " bytes, expected ", tokens, " x ", row_bytes));
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].size() != static_cast<size_t>(tokens) * c.idx_dim) {
      return absl::InvalidArgumentError(absl::StrCat("import rows: indexer ", i, " has ", keys[i].size(),
                                                     " floats, expected ", tokens, " x ", c.idx_dim));
    }
  }
  const Position n = session.position_;
  // Run by run (KvAccess::AppendRunRows: a hierarchical store's page, one copy batch per source; issue 27: a block
  // of 512 rows was 1,536 copies), every source at each: a hierarchical store completes each page on all sources
  // before the next, so its backup is issued before the tail slot is needed again (a block may be longer than the
  // tail). Without a run length, position by position.
  const uint32_t run = std::max<uint32_t>(kv.AppendRunRows(), 1);
  StepProfile* const profile = StepProfile::Get();  // issue 27: the admission's split (opt-in)
  std::optional<LoopTimer> append_timer(std::in_place, profile, LoopPhase::kImportAppend);
  for (uint32_t j = 0; j < tokens;) {
    const Position at = n + static_cast<Position>(j);  // runs aligned to multiples of `run` in position
    const auto len = static_cast<uint32_t>(std::min<Position>(tokens - j, run - at % run));
    for (size_t s = 0; s < rows.size(); ++s) {
      std::span<const uint8_t> part(rows[s].data() + j * row_bytes, len * row_bytes);
      if (absl::Status st = kv.AppendRun(session.request_, static_cast<SourceId>(s), n + static_cast<Position>(j),
                                         len, part);
          !st.ok()) {
        session.broken_ = true;
        return st;
      }
    }
    j += len;
  }
  append_timer.reset();
  LoopTimer keys_timer(profile, LoopPhase::kImportKeys);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status st = kv.StoreIndexKeys(session.request_, static_cast<uint32_t>(i), n, keys[i]); !st.ok()) {
      session.broken_ = true;
      return st;
    }
    session.index_keys_[i].insert(session.index_keys_[i].end(), keys[i].begin(), keys[i].end());
  }
  session.position_ += static_cast<Position>(tokens);
  return absl::OkStatus();
}

absl::Status Model::ImportKeys(ModelSession& session, uint32_t tokens, std::span<const std::vector<float>> keys) const {
  const ModelConfig& c = config_;
  if (session.model_ != this) return absl::InvalidArgumentError("import keys: a session of another model");
  if (session.broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("import keys: request ", session.request_, " is broken by an earlier failed step"));
  }
  if (keys.size() != static_cast<size_t>(c.n_indexers())) {
    return absl::InvalidArgumentError(
        absl::StrCat("import keys: ", keys.size(), " indexers given, the model has ", c.n_indexers()));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].size() != static_cast<size_t>(tokens) * c.idx_dim) {
      return absl::InvalidArgumentError(absl::StrCat("import keys: indexer ", i, " has ", keys[i].size(),
                                                     " floats, expected ", tokens, " x ", c.idx_dim));
    }
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    session.index_keys_[i].insert(session.index_keys_[i].end(), keys[i].begin(), keys[i].end());
  }
  session.position_ += static_cast<Position>(tokens);
  return absl::OkStatus();
}

absl::Status Model::BeginVerification(ModelSession& session, KvAccess& kv) const {
  if (session.model_ != this) return absl::InvalidArgumentError("verification: a session of another model");
  if (session.broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("verification: request ", session.request_, " is broken by an earlier failed step"));
  }
  if (absl::Status s = kv.HoldUnverified(session.request_, session.position_ + 1); !s.ok()) return s;
  session.verify_from_ = session.position_ + 1;
  return absl::OkStatus();
}

absl::Status Model::EndVerification(ModelSession& session, Position length, KvAccess& kv) const {
  if (session.model_ != this) return absl::InvalidArgumentError("verification: a session of another model");
  if (session.broken_) {
    return absl::FailedPreconditionError(
        absl::StrCat("verification: request ", session.request_, " is broken by an earlier failed step"));
  }
  if (session.verify_from_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("verification: request ", session.request_, " ends a round it did not begin"));
  }
  if (length < session.verify_from_ || length > session.position_) {
    return absl::InvalidArgumentError(absl::StrCat("verification: request ", session.request_, " keeps ", length,
                                                   " positions, outside [", session.verify_from_, ", ",
                                                   session.position_, "]"));
  }
  if (absl::Status s = kv.CommitVerified(session.request_, length); !s.ok()) {
    session.broken_ = true;
    return s;
  }
  for (std::vector<float>& keys : session.index_keys_) keys.resize(static_cast<size_t>(length) * config_.idx_dim);
  session.position_ = length;
  session.verify_from_ = -1;
  return absl::OkStatus();
}

absl::Status Model::ValidateStep(std::span<StepInput> batch) const {
  std::set<const ModelSession*> seen;
  for (size_t b = 0; b < batch.size(); ++b) {
    const StepInput& in = batch[b];
    if (in.session == nullptr) return absl::InvalidArgumentError(absl::StrCat("model step: input ", b, " has no session"));
    if (in.session->model_ != this) {
      return absl::InvalidArgumentError(absl::StrCat("model step: input ", b, " has a session of another model"));
    }
    if (!seen.insert(in.session).second) {
      return absl::InvalidArgumentError(absl::StrCat("model step: request ", in.session->request_, " twice in a batch"));
    }
    if (in.session->broken_) {
      return absl::FailedPreconditionError(
          absl::StrCat("model step: request ", in.session->request_, " is broken by an earlier failed step"));
    }
    if (in.tokens.empty()) return absl::InvalidArgumentError(absl::StrCat("model step: input ", b, " has no tokens"));
    for (Token t : in.tokens) {
      if (t < 0 || t >= kVocab) {
        return absl::InvalidArgumentError(absl::StrCat("model step: token ", t, " outside 0..255"));
      }
    }
  }
  return absl::OkStatus();
}

void Model::Embed(Scratch& s) const {
  const int D = config_.d_model;
  for (size_t b = 0; b < s.batch.size(); ++b) {
    for (size_t j = 0; j < s.batch[b].tokens.size(); ++j) {
      const float* e = weights_->tok_emb.data() + static_cast<size_t>(s.batch[b].tokens[j]) * D;
      std::copy(e, e + D, s.hidden.data() + (s.q_offset[b] + j) * D);
    }
  }
}

// Payload rows of the new positions (brief §2: the writing consumer; a producer writes its whole group).
absl::Status Model::AppendRows(int l, KvAccess& kv, Scratch& s) const {
  const ModelConfig& c = config_;
  const int D = c.d_model, width = c.d_c + c.d_r;
  const size_t row_bytes = c.row_bytes();
  for (int wl : plan_->row_writers[l]) {
    const LayerWeights& ww = weights_->layers[wl];
    const SourceId source = c.layers[wl].source;
    s.NormAll(c, ww.kv_norm, s.xk);
    kernels::MatMul(ww.w_dkv.data(), c.d_c, D, s.xk.data(), D, s.Qi, s.rowbuf.data(), width);
    kernels::MatMul(ww.w_kr.data(), c.d_r, D, s.xk.data(), D, s.Qi, s.rowbuf.data() + c.d_c, width);
    for (size_t qi = 0; qi < s.Q; ++qi) {
      kernels::Rope(s.rowbuf.data() + qi * width + c.d_c, c.d_r, s.query_pos[qi], c.rope_theta);
    }
    for (size_t b = 0; b < s.batch.size(); ++b) {
      const ModelSession& session = *s.batch[b].session;
      for (size_t j = 0; j < s.batch[b].tokens.size(); ++j) {
        const Position t = session.position_ + static_cast<Position>(j);
        const auto* row = reinterpret_cast<const uint8_t*>(s.rowbuf.data() + (s.q_offset[b] + j) * width);
        if (auto st = kv.Append(session.request_, source, t, std::span<const uint8_t>(row, row_bytes)); !st.ok()) {
          return st;
        }
      }
    }
  }
  return absl::OkStatus();
}

// Index keys of the new positions, the indexer's queries and weights, then per query its index scores over every
// visible position, the top-k selection (and the local window) into the layer's Fetch, and the Fetch itself.
absl::Status Model::IndexAndFetch(int l, KvAccess& kv, Scratch& s) const {
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_->layers[l];
  const int D = c.d_model, k = c.top_k, win = c.local_window, span_len = k + win;
  const int idx_q_width = c.idx_heads * c.idx_dim;
  const int slot = plan_->indexer_slot[l];
  kernels::MatMul(lw.idx_wk.data(), c.idx_dim, D, s.xn.data(), D, s.Qi, s.keybuf.data(), c.idx_dim);
  for (size_t b = 0; b < s.batch.size(); ++b) {
    ModelSession& session = *s.batch[b].session;
    std::vector<float>& keys = session.index_keys_[slot];
    const float* first = s.keybuf.data() + s.q_offset[b] * c.idx_dim;
    const size_t n = s.batch[b].tokens.size() * c.idx_dim;
    keys.insert(keys.end(), first, first + n);
    // The store keeps them with the positions' host pages (resume from host KV): before the step ends, so before
    // any HostCopyWritten of those pages.
    PhaseTimer timer(StepProfile::Get(), StepPhase::kAppend);  // issue 27: the step-time split (opt-in)
    if (absl::Status st = kv.StoreIndexKeys(session.request_, static_cast<uint32_t>(slot), session.position_,
                                            std::span<const float>(first, n));
        !st.ok()) {
      return st;
    }
  }
  kernels::MatMul(lw.idx_wq.data(), idx_q_width, D, s.xn.data(), D, s.Qi, s.idx_q.data(), idx_q_width);
  kernels::MatMul(lw.idx_ww.data(), c.idx_heads, D, s.xn.data(), D, s.Qi, s.idx_w.data(), c.idx_heads);
  Scratch::Fetched& f = s.fetched[l];
  const size_t S = plan_->sources[l].size();
  f.n_sources = S;
  f.positions.assign(s.Q * span_len, kNoPosition);
  f.rows.assign(s.Q * S * span_len, nullptr);
  f.queries.clear();
  std::optional<PhaseTimer> index_timer(std::in_place, StepProfile::Get(), StepPhase::kIndexTopK);
  for (size_t b = 0; b < s.batch.size(); ++b) {
    const ModelSession& session = *s.batch[b].session;
    for (size_t j = 0; j < s.batch[b].tokens.size(); ++j) {
      const size_t qi = s.q_offset[b] + j;
      const Position t = session.position_ + static_cast<Position>(j);
      const size_t visible = static_cast<size_t>(t) + 1;
      s.scores.resize(visible);
      IndexScores(std::span<const float>(s.idx_q).subspan(qi * idx_q_width, idx_q_width),
                  std::span<const float>(s.idx_w).subspan(qi * c.idx_heads, c.idx_heads),
                  std::span<const float>(session.index_keys_[slot]).first(visible * c.idx_dim), c.idx_dim, s.scores);
      std::span<Position> sel(f.positions.data() + qi * span_len, k);
      s.topk.Select(s.scores, sel);
      f.queries.push_back(
          {session.request_, sel, std::span<const uint8_t*>(f.rows.data() + qi * S * span_len, S * k), t});
      if (win > 0) {
        std::span<Position> wsel(f.positions.data() + qi * span_len + k, win);
        const Position first = std::max<Position>(0, t - win + 1);
        for (int i = 0; i < win; ++i) wsel[i] = first + i <= t ? first + i : kNoPosition;
        f.queries.push_back(
            {session.request_, wsel, std::span<const uint8_t*>(f.rows.data() + qi * S * span_len + S * k, S * win), t});
      }
    }
  }
  index_timer.reset();
  PhaseTimer fetch_timer(StepProfile::Get(), StepPhase::kFetch);
  if (auto st = kv.Fetch(plan_->sources[l], f.queries); !st.ok()) return st;
  f.outstanding = true;
  return absl::OkStatus();
}

// Attention over the fetched rows (the layer's own Fetch, or an inherited one: Reuse / follower), then the output
// projection into the residual stream.
void Model::Attend(int l, Scratch& s) const {
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_->layers[l];
  const int D = c.d_model, H = c.n_heads, k = c.top_k, win = c.local_window, width = c.d_c + c.d_r;
  const int span_len = k + win;
  const float scale = 1.0f / std::sqrt(static_cast<float>(width));
  const size_t row_bytes = c.row_bytes();
  const Scratch::Fetched& f = s.fetched[plan_->fetch_layer[l]];
  const size_t S = f.n_sources, si = static_cast<size_t>(plan_->source_index[l]);
  kernels::MatMul(lw.w_qc.data(), H * c.d_c, D, s.xn.data(), D, s.Qi, s.qc.data(), H * c.d_c);
  kernels::MatMul(lw.w_qr.data(), H * c.d_r, D, s.xn.data(), D, s.Qi, s.qr.data(), H * c.d_r);
  for (size_t qi = 0; qi < s.Q; ++qi) {
    const uint8_t* const* block = f.rows.data() + qi * S * span_len;
    for (int j = 0; j < span_len; ++j) {
      const uint8_t* p = j < k ? block[si * k + j] : block[S * k + si * win + (j - k)];
      s.valid[j] = p != nullptr;
      if (p != nullptr) std::memcpy(s.rows.data() + static_cast<size_t>(j) * width, p, row_bytes);
    }
    for (int hd = 0; hd < H; ++hd) {
      const float* q_c = s.qc.data() + (qi * H + hd) * c.d_c;
      float* q_r = s.qr.data() + (qi * H + hd) * c.d_r;
      kernels::Rope(q_r, c.d_r, s.query_pos[qi], c.rope_theta);
      float* o_h = s.o.data() + (qi * H + hd) * c.d_c;
      kernels::AttendLatent(q_c, q_r, s.rows.data(), s.valid.get(), k, c.d_c, c.d_r, scale, o_h);
      if (win > 0) {
        kernels::AttendLatent(q_c, q_r, s.rows.data() + static_cast<size_t>(k) * width, s.valid.get() + k, win,
                              c.d_c, c.d_r, scale, s.o_win.data());
        for (int d = 0; d < c.d_c; ++d) o_h[d] += s.o_win[d];
      }
    }
  }
  kernels::MatMul(lw.w_o.data(), D, H * c.d_c, s.o.data(), H * c.d_c, s.Qi, s.delta.data(), D);
  s.AddDelta();
}

void Model::Mlp(int l, Scratch& s) const {
  const ModelConfig& c = config_;
  const LayerWeights& lw = weights_->layers[l];
  const int D = c.d_model;
  s.NormAll(c, lw.mlp_norm, s.xn);
  kernels::MatMul(lw.w_up.data(), c.d_ff, D, s.xn.data(), D, s.Qi, s.ff.data(), c.d_ff);
  for (size_t qi = 0; qi < s.Q; ++qi) kernels::Silu(s.ff.data() + qi * c.d_ff, c.d_ff);
  kernels::MatMul(lw.w_down.data(), D, c.d_ff, s.ff.data(), c.d_ff, s.Qi, s.delta.data(), D);
  s.AddDelta();
}

void Model::Logits(Scratch& s, std::span<StepOutput> out) const {
  const int D = config_.d_model;
  s.NormAll(config_, weights_->final_norm, s.xn);
  std::vector<float> logits(s.Q * kVocab);
  kernels::MatMul(weights_->lm_head.data(), kVocab, D, s.xn.data(), D, s.Qi, logits.data(), kVocab);
  for (size_t b = 0; b < s.batch.size(); ++b) {
    const float* first = logits.data() + s.q_offset[b] * kVocab;
    out[b].logits.assign(first, first + s.batch[b].tokens.size() * kVocab);
    if (s.batch[b].want_hidden) {
      const float* h = s.xn.data() + s.q_offset[b] * D;
      out[b].hidden.assign(h, h + s.batch[b].tokens.size() * D);
    } else {
      out[b].hidden.clear();
    }
  }
}

// Validate everything before touching any state; then per layer: its normalized input, the payload rows it writes,
// its indexer and Fetch, attention, MLP, and the Fetches whose readers are done after it; then the logits.
absl::Status Model::Run(std::span<StepInput> batch, KvAccess& kv, std::span<StepOutput> out) const {
  if (absl::Status v = ValidateStep(batch); !v.ok()) return v;
  const ModelConfig& c = config_;
  StepProfile* const profile = StepProfile::Get();  // issue 27: the step-time split (opt-in)
  if (profile) profile->StepBegin();
  Scratch s(c, batch);
  Embed(s);
  auto release = [&](int f) {
    if (!s.fetched[f].outstanding) return;
    PhaseTimer timer(profile, StepPhase::kRelease);
    kv.ReadersDone(plan_->sources[f]);
    s.fetched[f].outstanding = false;
  };
  auto fail = [&](absl::Status st) {
    for (int f = 0; f < c.n_layers(); ++f) release(f);
    for (StepInput& in : batch) in.session->broken_ = true;
    return st;
  };
  for (int l = 0; l < c.n_layers(); ++l) {
    // The layer's input, normalized: read by its indexer and its attention queries (h is unchanged until then).
    s.NormAll(c, weights_->layers[l].attn_norm, s.xn);
    absl::Status appended;
    {
      PhaseTimer timer(profile, StepPhase::kAppend);
      appended = AppendRows(l, kv, s);
    }
    if (!appended.ok()) return fail(appended);
    if (c.layers[l].has_indexer()) {
      if (absl::Status st = IndexAndFetch(l, kv, s); !st.ok()) return fail(st);
    }
    Attend(l, s);
    Mlp(l, s);
    for (int done : plan_->release_after[l]) release(done);
  }
  if (!out.empty()) Logits(s, out);
  for (StepInput& in : batch) in.session->position_ += static_cast<Position>(in.tokens.size());
  if (profile) profile->StepEnd(static_cast<int64_t>(s.Q), static_cast<int64_t>(batch.size()));
  return absl::OkStatus();
}

}  // namespace dhs::model
