// workerd/model/kernels.h (internal): the per-row numeric kernels of the built-in model.
//
// Every kernel reduces in a fixed order with float accumulators and no threading, so a row's result depends only on
// that row's inputs: the numerics are batch-invariant (brief §11) given -ffp-contract=off (project wide: no FMA
// contraction, so a product is rounded before it is added, in every build and on every ISA).
// Dot products use kDotLanes independent partial sums (lane l sums the products j = l, l + kDotLanes, ... in ascending
// j), which the compiler maps to SIMD registers (GCC/Clang vector extensions, 4 floats each: SSE2 on x86-64, NEON on
// arm64) without -ffast-math; the lane order is part of the numerics, not of the ISA, so every build gives the same
// bits. MatVec and MatMul compute every output element with exactly that Dot, so a query's results never depend on
// how many queries share the call (batch invariance, brief §7/§11).
// Thread-safety: pure functions.
#pragma once

#include <span>

#include "common/types.h"

namespace dhs::model::kernels {

// Partial sums of Dot.
inline constexpr int kDotLanes = 16;

// Σ_j w[j] * x[j], j in 0..n-1 (n >= 0), in this fixed order: with m = n - n % 16,
//   acc[l] = Σ_{i=0..m/16-1} w[16i + l] * x[16i + l]  (l = 0..15, i ascending, acc[l] starts at +0),
//   acc[j - m] += w[j] * x[j] for the remainder j = m..n-1 (ascending),
//   then the tree: acc[l] += acc[l + 8] (l < 8); acc[l] += acc[l + 4] (l < 4); acc[l] += acc[l + 2] (l < 2);
//   result = acc[0] + acc[1].
float Dot(const float* w, const float* x, int n);

// y[i] = Dot(W + i * cols, x, cols). Shapes: W rows x cols (row-major), x cols, y rows.
void MatVec(const float* w, int rows, int cols, const float* x, float* y);

// Weight-stationary batched MatVec: Y[q * ldy + i] = Dot(W + i * cols, X + q * ldx, cols) for q in 0..n_queries-1,
// i in 0..rows-1 (bit-identical to MatVec per query, whatever n_queries). Shapes: W rows x cols row-major; X
// n_queries rows of stride ldx >= cols; Y n_queries rows of stride ldy >= rows. Y must not overlap W or X.
// Loop order: query tiles (the queries whose X rows fit 256 KiB, which stays in L2: 64 queries of 1024 floats; a decode
// batch is one tile), then blocks of W rows (~16 KiB), then the tile's queries inside, so each weight block is read
// from memory once per call for all queries of a tile (a long prefill streams W once per tile). Pairs of queries share
// each loaded weight vector.
void MatMul(const float* w, int rows, int cols, const float* x, int ldx, int n_queries, float* y, int ldy);

// out[i] = x[i] / sqrt(mean(x^2) + eps) * gain[i]; n floats each. `out` may alias `x`.
void RmsNorm(const float* x, const float* gain, int n, float eps, float* out);

// Rotary embedding of `v` (n floats, n even) at `position`: pair (2i, 2i+1) rotated by position * theta^(-2i/n).
void Rope(float* v, int n, Position position, float theta);

// y[i] += a * x[i], elementwise (no reduction: any vectorization gives the same bits).
void Axpy(float a, const float* x, int n, float* y);

// x * sigmoid(x), elementwise, in place.
void Silu(float* x, int n);

// One head's attention over rows in list order: each row is d_c latent floats then d_r rotary floats (already
// rotated). logit_j = (Dot(q_c, c_j, d_c) + Dot(q_r, r_j, d_r)) * scale; softmax over the non-null rows
// (max-subtracted, list order); out_c (d_c floats) = (Σ_j e_j c_j) * (1 / Σ_j e_j), e_j = exp(logit_j - max), j in
// list order (Axpy). Rows given as floats: rows[j * (d_c + d_r)], valid[j] false = padding (skipped).
// With no valid row out_c is all zero.
void AttendLatent(const float* q_c, const float* q_r, const float* rows, const bool* valid, int n_rows, int d_c,
                  int d_r, float scale, float* out_c);

}  // namespace dhs::model::kernels
