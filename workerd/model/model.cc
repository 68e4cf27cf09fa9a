#include "workerd/model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "workerd/model/kernels.h"
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

namespace {

// Rows handed back by one Fetch: per query qi a block of k + w positions (selection, then window) and
// S * (k + w) row pointers laid out [selection: source][j] then [window: source][j] (KvQuery::rows_out layout).
struct Fetched {
  std::vector<Position> positions;
  std::vector<const uint8_t*> rows;
  std::vector<KvQuery> queries;
  size_t n_sources = 0;
  bool outstanding = false;
};

}  // namespace

Model::Model(ModelConfig config, std::unique_ptr<Weights> weights)
    : config_(std::move(config)), weights_(std::move(weights)), plan_(std::make_unique<Plan>()) {
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
  for (const TensorSpec& spec : ModelTensorSpecs(*config)) {
    auto data = file.ReadF32(spec.name, spec.shape);
    if (!data.ok()) return data.status();
    expected.insert(spec.name);
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
  return std::unique_ptr<Model>(new Model(std::move(*config), std::move(w)));
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
  return Run(batch, kv, out);
}

absl::Status Model::ImportPrefix(ModelSession& session, std::span<const Token> tokens, KvAccess& kv) const {
  StepInput in{&session, tokens};
  return Run(std::span<StepInput>(&in, 1), kv, {});
}

absl::Status Model::Run(std::span<StepInput> batch, KvAccess& kv, std::span<StepOutput> out) const {
  // ---- validate everything before touching any state ----
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

  const ModelConfig& c = config_;
  const Plan& plan = *plan_;
  const Weights& w = *weights_;
  const int D = c.d_model, H = c.n_heads, k = c.top_k, win = c.local_window, width = c.d_c + c.d_r;
  const int span_len = k + win;
  const float scale = 1.0f / std::sqrt(static_cast<float>(width));
  const size_t row_bytes = c.row_bytes();

  // Query qi = q_offset[b] + j is token j of input b, at position n_b + j.
  std::vector<size_t> q_offset(batch.size() + 1, 0);
  for (size_t b = 0; b < batch.size(); ++b) q_offset[b + 1] = q_offset[b] + batch[b].tokens.size();
  const size_t Q = q_offset.back();
  std::vector<Position> query_pos(Q);
  for (size_t b = 0; b < batch.size(); ++b) {
    for (size_t j = 0; j < batch[b].tokens.size(); ++j) {
      query_pos[q_offset[b] + j] = batch[b].session->position_ + static_cast<Position>(j);
    }
  }

  std::vector<float> hidden(Q * D);
  for (size_t b = 0; b < batch.size(); ++b) {
    for (size_t j = 0; j < batch[b].tokens.size(); ++j) {
      const float* e = w.tok_emb.data() + static_cast<size_t>(batch[b].tokens[j]) * D;
      std::copy(e, e + D, hidden.data() + (q_offset[b] + j) * D);
    }
  }

  std::vector<Fetched> fetched(c.n_layers());
  auto release = [&](int f) {
    if (!fetched[f].outstanding) return;
    kv.ReadersDone(plan.sources[f]);
    fetched[f].outstanding = false;
  };
  auto fail = [&](absl::Status s) {
    for (int f = 0; f < c.n_layers(); ++f) release(f);
    for (StepInput& in : batch) in.session->broken_ = true;
    return s;
  };

  std::vector<float> xn(D), xk(D), row(width), idx_q(c.idx_heads * c.idx_dim), idx_w(c.idx_heads), scores;
  std::vector<float> qc(H * c.d_c), qr(H * c.d_r), o(H * c.d_c), o_win(c.d_c), delta(D), ff(c.d_ff);
  std::vector<float> rows(static_cast<size_t>(span_len) * width);
  std::vector<uint8_t> row_bytes_buf(row_bytes);
  std::unique_ptr<bool[]> valid(new bool[std::max(span_len, 1)]);
  TopK topk;

  for (int l = 0; l < c.n_layers(); ++l) {
    const LayerSpec& spec = c.layers[l];
    const LayerWeights& lw = w.layers[l];

    // ---- payload rows of the new positions (brief §2: the writing consumer; a producer writes its whole group) ----
    for (int wl : plan.row_writers[l]) {
      const LayerWeights& ww = w.layers[wl];
      const SourceId source = c.layers[wl].source;
      for (size_t b = 0; b < batch.size(); ++b) {
        const ModelSession& s = *batch[b].session;
        for (size_t j = 0; j < batch[b].tokens.size(); ++j) {
          const Position t = s.position_ + static_cast<Position>(j);
          kernels::RmsNorm(hidden.data() + (q_offset[b] + j) * D, ww.kv_norm.data(), D, c.norm_eps, xk.data());
          kernels::MatVec(ww.w_dkv.data(), c.d_c, D, xk.data(), row.data());
          kernels::MatVec(ww.w_kr.data(), c.d_r, D, xk.data(), row.data() + c.d_c);
          kernels::Rope(row.data() + c.d_c, c.d_r, t, c.rope_theta);
          std::memcpy(row_bytes_buf.data(), row.data(), row_bytes);
          if (auto st = kv.Append(s.request_, source, t, row_bytes_buf); !st.ok()) return fail(st);
        }
      }
    }

    // ---- indexer, top-k and Fetch (write / reindex / producer) ----
    if (spec.has_indexer()) {
      const int slot = plan.indexer_slot[l];
      for (size_t b = 0; b < batch.size(); ++b) {
        std::vector<float>& keys = batch[b].session->index_keys_[slot];
        for (size_t j = 0; j < batch[b].tokens.size(); ++j) {
          kernels::RmsNorm(hidden.data() + (q_offset[b] + j) * D, lw.attn_norm.data(), D, c.norm_eps, xn.data());
          keys.resize(keys.size() + c.idx_dim);
          kernels::MatVec(lw.idx_wk.data(), c.idx_dim, D, xn.data(), keys.data() + keys.size() - c.idx_dim);
        }
      }
      Fetched& f = fetched[l];
      const size_t S = plan.sources[l].size();
      f.n_sources = S;
      f.positions.assign(Q * span_len, kNoPosition);
      f.rows.assign(Q * S * span_len, nullptr);
      f.queries.clear();
      for (size_t b = 0; b < batch.size(); ++b) {
        const ModelSession& s = *batch[b].session;
        for (size_t j = 0; j < batch[b].tokens.size(); ++j) {
          const size_t qi = q_offset[b] + j;
          const Position t = s.position_ + static_cast<Position>(j);
          kernels::RmsNorm(hidden.data() + qi * D, lw.attn_norm.data(), D, c.norm_eps, xn.data());
          kernels::MatVec(lw.idx_wq.data(), c.idx_heads * c.idx_dim, D, xn.data(), idx_q.data());
          kernels::MatVec(lw.idx_ww.data(), c.idx_heads, D, xn.data(), idx_w.data());
          const size_t visible = static_cast<size_t>(t) + 1;
          scores.resize(visible);
          IndexScores(idx_q, idx_w, std::span<const float>(s.index_keys_[slot]).first(visible * c.idx_dim), c.idx_dim,
                      scores);
          std::span<Position> sel(f.positions.data() + qi * span_len, k);
          topk.Select(scores, sel);
          f.queries.push_back({s.request_, sel, std::span<const uint8_t*>(f.rows.data() + qi * S * span_len, S * k)});
          if (win > 0) {
            std::span<Position> wsel(f.positions.data() + qi * span_len + k, win);
            const Position first = std::max<Position>(0, t - win + 1);
            for (int i = 0; i < win; ++i) wsel[i] = first + i <= t ? first + i : kNoPosition;
            f.queries.push_back(
                {s.request_, wsel, std::span<const uint8_t*>(f.rows.data() + qi * S * span_len + S * k, S * win)});
          }
        }
      }
      if (auto st = kv.Fetch(plan.sources[l], f.queries); !st.ok()) return fail(st);
      f.outstanding = true;
    }

    // ---- attention over the fetched rows (own Fetch, or inherited: Reuse / follower) ----
    const Fetched& f = fetched[plan.fetch_layer[l]];
    const size_t S = f.n_sources, si = static_cast<size_t>(plan.source_index[l]);
    for (size_t qi = 0; qi < Q; ++qi) {
      float* h = hidden.data() + qi * D;
      const uint8_t* const* block = f.rows.data() + qi * S * span_len;
      for (int j = 0; j < span_len; ++j) {
        const uint8_t* p = j < k ? block[si * k + j] : block[S * k + si * win + (j - k)];
        valid[j] = p != nullptr;
        if (p != nullptr) std::memcpy(rows.data() + static_cast<size_t>(j) * width, p, row_bytes);
      }
      kernels::RmsNorm(h, lw.attn_norm.data(), D, c.norm_eps, xn.data());
      kernels::MatVec(lw.w_qc.data(), H * c.d_c, D, xn.data(), qc.data());
      kernels::MatVec(lw.w_qr.data(), H * c.d_r, D, xn.data(), qr.data());
      for (int hd = 0; hd < H; ++hd) {
        float* q_r = qr.data() + hd * c.d_r;
        kernels::Rope(q_r, c.d_r, query_pos[qi], c.rope_theta);
        float* o_h = o.data() + hd * c.d_c;
        kernels::AttendLatent(qc.data() + hd * c.d_c, q_r, rows.data(), valid.get(), k, c.d_c, c.d_r, scale, o_h);
        if (win > 0) {
          kernels::AttendLatent(qc.data() + hd * c.d_c, q_r, rows.data() + static_cast<size_t>(k) * width,
                                valid.get() + k, win, c.d_c, c.d_r, scale, o_win.data());
          for (int d = 0; d < c.d_c; ++d) o_h[d] += o_win[d];
        }
      }
      kernels::MatVec(lw.w_o.data(), D, H * c.d_c, o.data(), delta.data());
      for (int d = 0; d < D; ++d) h[d] += delta[d];
      kernels::RmsNorm(h, lw.mlp_norm.data(), D, c.norm_eps, xn.data());
      kernels::MatVec(lw.w_up.data(), c.d_ff, D, xn.data(), ff.data());
      kernels::Silu(ff.data(), c.d_ff);
      kernels::MatVec(lw.w_down.data(), D, c.d_ff, ff.data(), delta.data());
      for (int d = 0; d < D; ++d) h[d] += delta[d];
    }
    for (int done : plan.release_after[l]) release(done);
  }

  if (!out.empty()) {
    for (size_t b = 0; b < batch.size(); ++b) {
      out[b].logits.resize(batch[b].tokens.size() * kVocab);
      for (size_t j = 0; j < batch[b].tokens.size(); ++j) {
        kernels::RmsNorm(hidden.data() + (q_offset[b] + j) * D, w.final_norm.data(), D, c.norm_eps, xn.data());
        kernels::MatVec(w.lm_head.data(), kVocab, D, xn.data(), out[b].logits.data() + j * kVocab);
      }
    }
  }
  for (StepInput& in : batch) in.session->position_ += static_cast<Position>(in.tokens.size());
  return absl::OkStatus();
}

}  // namespace dhs::model
