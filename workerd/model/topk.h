// workerd/model/topk.h: the indexer score and the top-k selection of the built-in model (brief §2 "selection", §11).
//
// Owns: IndexScores (I(t,s) over the visible positions) and TopK (ordered selection with the tie rule and padding).
// Thread-safety: IndexScores is a pure function; a TopK object keeps scratch space, one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/types.h"

namespace dhs::model {

// Index scores of one query over the visible positions s = 0 .. n_visible-1 (causal: n_visible = t + 1):
//   out[s] = Σ_h w[h] * ReLU(q[h] · keys[s])          (brief §11)
// Shapes: q = idx_heads * idx_dim floats (head-major), w = idx_heads floats, keys = n_visible * idx_dim floats
// (row s at keys[s * idx_dim]), out = n_visible floats. Fixed reduction order (dims ascending, then heads ascending),
// so a score depends only on its own inputs (batch-invariant).
void IndexScores(std::span<const float> q, std::span<const float> w, std::span<const float> keys, int idx_dim,
                 std::span<float> out);

// Top-k selection. Order: higher score first; equal scores: lower position first. NaN scores rank below every number.
// When fewer than k positions are visible the tail of the selection is padded with kNoPosition (-1); with at most k
// visible positions every one of them is selected (so attention over the selection equals dense attention).
class TopK {
 public:
  // Writes the ordered selection over positions 0 .. scores.size()-1 into `out` (out.size() = k >= 1). Every entry of
  // `out` is overwritten: a reused buffer never keeps a stale position.
  void Select(std::span<const float> scores, std::span<Position> out);

 private:
  std::vector<Position> order_;  // scratch, reused across calls
};

}  // namespace dhs::model
