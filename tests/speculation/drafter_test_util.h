// tests/speculation/drafter_test_util.h: helpers of the drafter tests and benchmarks: an in-memory drafter from a config and
// a seed, stand-in target hidden states, and a Driver that runs a slot through speculative rounds (Propose, then
// Commit of a chosen number of accepted proposals), keeping the committed tokens and hidden states.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "workerd/speculation/drafter.h"

namespace dhs::spec::testing {

inline std::shared_ptr<const DrafterModel> MakeDrafter(const DrafterConfig& config, uint64_t seed = 1) {
  auto writer = GenerateDrafterWeights(config, seed);
  if (!writer.ok()) return nullptr;
  auto file = model::SafetensorsFile::Parse(writer->Serialize());
  if (!file.ok()) return nullptr;
  auto m = DrafterModel::FromSafetensors(*file);
  if (!m.ok()) return nullptr;
  return std::shared_ptr<const DrafterModel>(std::move(*m));
}

// A small drafter for tests: W = 8, K_max = 4, 2 layers, D = 32, target d_model 64.
inline DrafterConfig SmallConfig() {
  DrafterConfig c;
  c.target_d_model = 64;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 2;
  c.head_dim = 8;
  c.d_ff = 64;
  c.window = 8;
  c.k_max = 4;
  return c;
}

// Deterministic stand-ins for the target: token t and hidden state of position t of stream `salt`.
inline model::Token TokenAt(Position t, uint32_t salt) {
  uint64_t x = (static_cast<uint64_t>(t) + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t{salt} * 0xBF58476D1CE4E5B9ull);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  return static_cast<model::Token>((x >> 29) & 0xff);
}
inline void HiddenAt(Position t, uint32_t salt, int dt, std::vector<float>& out) {
  for (int d = 0; d < dt; ++d) {
    const uint64_t v = static_cast<uint64_t>(TokenAt(t * 131 + d, salt + 7)) ^ (static_cast<uint64_t>(d) << 3);
    out.push_back(static_cast<float>(static_cast<int>(v % 2001) - 1000) / 500.0f);
  }
}

// Runs one request on one slot of a proposer. The committed tokens are the history the target accepted; after a
// round with A accepted proposals, the next anchor is `TokenAt(position, salt ^ round)` (stands for the correction or
// bonus), so rejected proposals never enter the history. hidden(t) is HiddenAt(t, salt).
class Driver {
 public:
  Driver(DrafterProposer& p, int slot, RequestId request, uint32_t salt, Position prompt)
      : p_(p), slot_(slot), request_(request), salt_(salt) {
    for (Position t = 0; t <= prompt; ++t) tokens_.push_back(TokenAt(t, salt));  // positions 0 .. prompt (anchor)
  }
  Position frontier() const { return static_cast<Position>(tokens_.size()) - 1; }
  const std::vector<model::Token>& tokens() const { return tokens_; }

  // The request of the next round (hidden states of positions max(0, F - 1) .. n_r - 1 into `hidden`).
  DraftRequest Request(int64_t max_proposals, std::vector<float>& hidden) const {
    hidden.clear();
    const Position first = fed_ ? std::max<Position>(0, last_anchor_) : 0;
    for (Position t = first; t < frontier(); ++t) HiddenAt(t, salt_, p_.model().config().target_d_model, hidden);
    DraftRequest r;
    r.slot = slot_;
    r.key = {.seed = 99, .request = request_, .frontier = frontier()};
    r.tokens = tokens_;
    r.target_hidden = hidden;
    r.max_proposals = max_proposals;
    return r;
  }
  // After the proposer drafted `result` for Request(): commits A = min(accept, proposals) and extends the history.
  absl::Status Commit(const DraftResult& result, int64_t accept) {
    const int64_t a = std::min<int64_t>(accept, static_cast<int64_t>(result.tokens.size()));
    if (absl::Status s = p_.Commit(slot_, a); !s.ok()) return s;
    last_anchor_ = frontier();
    fed_ = true;
    for (int64_t j = 0; j < a; ++j) tokens_.push_back(result.tokens[j]);
    tokens_.push_back(TokenAt(frontier() + 1, salt_ ^ static_cast<uint32_t>(++rounds_)));
    return absl::OkStatus();
  }

 private:
  DrafterProposer& p_;
  int slot_;
  RequestId request_;
  uint32_t salt_;
  std::vector<model::Token> tokens_;
  Position last_anchor_ = 0;
  bool fed_ = false;
  int rounds_ = 0;
};

}  // namespace dhs::spec::testing
