// Row-wise steps shared by the native forward (forward.h) and the draft head's step (head_step.h):
// RMSNorm, the gated MLP's activations (SiLU, GELU's tanh approximation), RoPE, and the greedy choice
// (argmax) of logit rows on the pool.
// Each computes a row's values from that row alone, in a fixed order, so a row's result does not
// depend on the rows beside it or on how the rows are split between threads.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "pool.h"
#include "simd.h"

namespace dg {

// Thread tid's share [*a, *b) of n rows split over nt threads.
static inline void rows_of(int n, int tid, int nt, int* a, int* b) {
  *a = int(int64_t(n) * tid / nt);
  *b = int(int64_t(n) * (tid + 1) / nt);
}

// out[C] = w * x / sqrt(mean(x^2) + eps).
static void rmsnorm_row(const float* x, const float* w, int C, float eps, float* out) {
  int c = 0;
  V acc = vzero();
  for (; c + VL <= C; c += VL) {
    V v = vload(x + c);
    acc = vfma(v, v, acc);
  }
  float ss = vsum(acc);
  for (; c < C; c++) ss += x[c] * x[c];
  float inv = 1.0f / std::sqrt(ss / float(C) + eps);
  for (c = 0; c + VL <= C; c += VL) vstore(out + c, vmul(vload(w + c), vmul(vload(x + c), vset1(inv))));
  for (; c < C; c++) out[c] = w[c] * (x[c] * inv);
}

static void silu_mul(const float* gu, int F, float* out) {  // gu = [gate | up], out = silu(gate) * up
  int c = 0;
  V one = vset1(1.0f), zero = vzero();
  for (; c + VL <= F; c += VL) {
    V g = vload(gu + c);
    V s = vdiv(g, vadd(one, vexp(vsub(zero, g))));
    vstore(out + c, vmul(s, vload(gu + F + c)));
  }
  for (; c < F; c++) {
    float g = gu[c];
    out[c] = (g / (1.0f + sexp(-g))) * gu[F + c];
  }
}

// out = gelu(gate) * up, GELU's tanh approximation: 0.5 x (1 + tanh(z)) = x * sigmoid(2z), with
// z = sqrt(2/pi) (x + 0.044715 x^3).
static void gelu_mul(const float* gu, int F, float* out) {
  constexpr float k2 = 1.5957691216057308f, c3 = 0.044715f;  // 2 * sqrt(2/pi)
  int c = 0;
  V one = vset1(1.0f), zero = vzero(), vk2 = vset1(k2), vc3 = vset1(c3);
  for (; c + VL <= F; c += VL) {
    V g = vload(gu + c);
    V z = vmul(vk2, vfma(vmul(vc3, g), vmul(g, g), g));  // 2 sqrt(2/pi) (g + 0.044715 g^3)
    V s = vdiv(g, vadd(one, vexp(vsub(zero, z))));
    vstore(out + c, vmul(s, vload(gu + F + c)));
  }
  for (; c < F; c++) {
    float g = gu[c];
    float z = k2 * ((c3 * g) * (g * g) + g);
    out[c] = (g / (1.0f + sexp(-z))) * gu[F + c];
  }
}

// RoPE's angles at position pos: cs[c] = cos(pos * inv_freq[c]), sn[c] = sin(...), c < half.
static inline void rope_angles(int64_t pos, const float* inv_freq, int half, float* cs, float* sn) {
  for (int c = 0; c < half; c++) {
    const float ang = float(pos) * inv_freq[c];
    cs[c] = std::cos(ang);
    sn[c] = std::sin(ang);
  }
}

// Rotate-half RoPE in place on nh consecutive heads x[nh, D] of one position (cs, sn: its angles [D/2]).
static inline void rope_rotate(float* x, int nh, int D, const float* cs, const float* sn) {
  const int half = D / 2;
  for (int h = 0; h < nh; h++) {
    float* v = x + h * D;
    for (int c = 0; c < half; c++) {
      const float x1 = v[c], x2 = v[c + half];
      v[c] = x1 * cs[c] - x2 * sn[c];
      v[c + half] = x2 * cs[c] + x1 * sn[c];
    }
  }
}

// A thread's (max, first index) over a column range of a row, and whether it saw a non-finite value.
struct RowMax {
  float value = -INFINITY;
  int64_t index = -1;
  bool finite = true;
};

static RowMax row_max(const float* row, int64_t c0, int64_t c1) {
  RowMax r;
  for (int64_t c = c0; c < c1; c++) {
    float v = row[c];
    if (!std::isfinite(v)) r.finite = false;
    if (v > r.value) {  // strict: the first maximum wins, as torch.argmax
      r.value = v;
      r.index = c;
    }
  }
  return r;
}

// Greedy choice of R logit rows [R, V], run by every thread of a pool job: thread tid scans its
// column range of each row into part[tid * R + r] (part: [nt * R], shared by the job), then, after
// the barrier, thread 0 merges the ranges in thread order into argmax[r] (the first index of the
// row's maximum; -1 if the row has a NaN or an inf).
static void argmax_rows(const float* logits, int R, int64_t V, RowMax* part, int64_t* argmax, int tid, int nt,
                        Barrier& bar) {
  for (int r = 0; r < R; r++) part[size_t(tid) * R + r] = row_max(logits + size_t(r) * V, V * tid / nt, V * (tid + 1) / nt);
  bar.wait();
  if (tid != 0) return;
  for (int r = 0; r < R; r++) {
    RowMax best = part[r];
    for (int t = 1; t < nt; t++) {
      const RowMax& o = part[size_t(t) * R + r];
      best.finite = best.finite && o.finite;
      if (o.value > best.value) best = RowMax{o.value, o.index, best.finite};
    }
    argmax[r] = best.finite && best.index >= 0 ? best.index : -1;
  }
}

}  // namespace dg
