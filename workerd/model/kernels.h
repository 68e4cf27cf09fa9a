// workerd/model/kernels.h (internal): the per-row numeric kernels of the built-in model.
//
// Every kernel reduces in a fixed order (index ascending) with a float accumulator and no threading, so a row's result
// depends only on that row's inputs: the numerics are batch-invariant (brief §11) given -ffp-contract=off.
// Thread-safety: pure functions.
#pragma once

#include <span>

#include "common/types.h"

namespace dhs::model::kernels {

// y[i] = Σ_j W[i * cols + j] * x[j], j ascending. Shapes: W rows x cols (row-major), x cols, y rows.
void MatVec(const float* w, int rows, int cols, const float* x, float* y);

// out[i] = x[i] / sqrt(mean(x^2) + eps) * gain[i]; n floats each. `out` may alias `x`.
void RmsNorm(const float* x, const float* gain, int n, float eps, float* out);

// Rotary embedding of `v` (n floats, n even) at `position`: pair (2i, 2i+1) rotated by position * theta^(-2i/n).
void Rope(float* v, int n, Position position, float theta);

// x * sigmoid(x), elementwise, in place.
void Silu(float* x, int n);

// One head's attention over rows in list order: each row is d_c latent floats then d_r rotary floats (already
// rotated). logit_j = (q_c · c_j + q_r · r_j) * scale; softmax over the non-null rows (max-subtracted, list order);
// out_c (d_c floats) = Σ_j p_j c_j. Rows given as floats: rows[j * (d_c + d_r)], valid[j] false = padding (skipped).
// With no valid row out_c is all zero.
void AttendLatent(const float* q_c, const float* q_r, const float* rows, const bool* valid, int n_rows, int d_c,
                  int d_r, float scale, float* out_c);

}  // namespace dhs::model::kernels
