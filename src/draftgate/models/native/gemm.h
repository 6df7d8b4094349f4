// Few-row matrix products over pre-packed weights: y[M, N] (+)= x[M, K] @ W[N, K]^T.
//
// Batch invariance by construction: every output element y[m, n] is the same sequence of
// roundings (fused multiply-adds over k in ascending order, in chunks of KC added in order)
// whatever M is, however the rows are tiled into register blocks and however the columns are
// split between threads. So a
// token's activations are bitwise the same alone, inside a K+1-row verify pass, or inside a
// ragged batch. Speed comes from streaming each weight once per call for up to MR rows (decoding
// is memory-bound: the weights are read once whether 1 or 17 rows use them).
//
// The packed layout is packed.h's; float32, bfloat16 and float16 tiles run the kernel here, the
// quantized ones (Q4, Q8) qgemm.h's, and `gemm` dispatches on the storage.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "packed.h"
#include "qgemm.h"
#include "simd.h"

namespace dg {

static inline Packed* pack(const void* src, int dtype, int N, int K) {
  auto* p = new Packed();
  p->N = N;
  p->K = K;
  p->dtype = dtype;
  p->nvec = (N + VL - 1) / VL;
  p->tiles = (p->nvec + NV_TILE - 1) / NV_TILE;
  size_t bytes = size_t(p->tiles) * NR * K * p->elem();
  p->data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  std::memset(p->data, 0, bytes);
  for (int t = 0; t < p->tiles; t++) {
    int w = p->tile_width(t);
    for (int c = 0; c < w; c++) {
      int n = t * NR + c;
      if (n >= N) break;
      for (int k = 0; k < K; k++) {
        size_t dst = p->tile_offset(t) + size_t(k) * w + c;
        size_t s = size_t(n) * K + k;
        if (dtype == F32)
          static_cast<float*>(p->data)[dst] = static_cast<const float*>(src)[s];
        else
          static_cast<uint16_t*>(p->data)[dst] = static_cast<const uint16_t*>(src)[s];
      }
    }
  }
  return p;
}

static inline void unpack_row(const Packed* p, int n, float* out) {  // W[n, :] (for a tied embedding)
  if (p->dtype >= Q4) return qunpack_row(p, n, out);
  int t = n / NR, c = n % NR, w = p->tile_width(t);
  for (int k = 0; k < p->K; k++) {
    size_t i = p->tile_offset(t) + size_t(k) * w + c;
    out[k] = to_f32(p->data, p->dtype, i);
  }
}

// One register block: MR rows x NV vectors of columns, the whole K reduction.
// x: [MR, ldx] rows, w: the block's first column in its tile (row stride ws), y: [MR, ldy].
// The weights stream from memory once per call: software prefetch runs DG_PREFETCH_BYTES ahead
// (into the next tile at the end of this one, which is the next block this thread reads), far
// enough to hide the memory latency behind the FMAs of several rows; the hardware prefetcher
// alone keeps too few lines in flight, and compute and memory time then add up.
template <int MR, int NV, typename W>
static void microkernel(const float* x, int ldx, const W* w, int ws, int K, float* y, int ldy, int ncols,
                        bool add) {
  V acc[MR][NV];
  alignas(64) float tot[MR][NV * VL];  // sum of the finished chunks (stays in L1)
  for (int k0 = 0; k0 < K; k0 += KC) {
    for (int r = 0; r < MR; r++)
      for (int j = 0; j < NV; j++) acc[r][j] = vzero();
    const int k1 = std::min(K, k0 + KC);
    for (int k = k0; k < k1; k++) {
      const W* wk = w + size_t(k) * ws;
#if defined(__AVX512F__) || defined(__AVX2__)
      constexpr int ROW_BYTES = NV * VL * int(sizeof(W));
      const char* pf = reinterpret_cast<const char*>(wk) + DG_PREFETCH_BYTES;
      for (int b = 0; b < ROW_BYTES; b += 64) _mm_prefetch(pf + b, DG_PREFETCH_HINT);
#endif
      V wv[NV];
      for (int j = 0; j < NV; j++) wv[j] = vload(wk + j * VL);
      for (int r = 0; r < MR; r++) {
        V b = vset1(x[size_t(r) * ldx + k]);
        for (int j = 0; j < NV; j++) acc[r][j] = vfma(b, wv[j], acc[r][j]);
      }
    }
    for (int r = 0; r < MR; r++)
      for (int j = 0; j < NV; j++)
        vstore(&tot[r][j * VL], k0 == 0 ? acc[r][j] : vadd(vload(&tot[r][j * VL]), acc[r][j]));
  }
  store_block<MR, NV>(tot, y, ldy, ncols, add);
}

template <typename W>
using MicroFn = void (*)(const float*, int, const W*, int, int, float*, int, int, bool);

template <typename W, int NV, int... MRs>
static MicroFn<W> pick_mr(int mr, std::integer_sequence<int, MRs...>) {
  static constexpr MicroFn<W> table[] = {microkernel<MRs + 1, NV, W>...};
  return table[mr - 1];
}

template <typename W>
static MicroFn<W> pick(int mr, int nv) {
  if (nv == 1) return pick_mr<W, 1>(mr, std::make_integer_sequence<int, MR_MAX[1]>{});
  return pick_mr<W, 2>(mr, std::make_integer_sequence<int, MR_MAX[2]>{});
}

// This thread's share of y (+)= x @ W^T: column vectors [tid*nvec/n, (tid+1)*nvec/n).
template <typename W>
static void gemm_part(const Packed* p, const float* x, int M, int ldx, float* y, int ldy, bool add, int tid,
                      int nthreads) {
  const W* base = static_cast<const W*>(p->data);
  int v0 = int(int64_t(p->nvec) * tid / nthreads), v1 = int(int64_t(p->nvec) * (tid + 1) / nthreads);
  const int step = NV_TILE, mr_max = MR_MAX[NV_TILE];  // nv < NV_TILE only where a thread's range ends
  while (v0 < v1) {
    int t = v0 / NV_TILE, in_tile = v0 - t * NV_TILE;
    int nv = std::min({step - in_tile % step, v1 - v0, p->nvec - v0, NV_TILE - in_tile});
    int ws = p->tile_width(t), col = v0 * VL;
    const W* w = base + p->tile_offset(t) + in_tile * VL;
    for (int r0 = 0; r0 < M;) {
      int mr = std::min(M - r0, mr_max);
      pick<W>(mr, nv)(x + size_t(r0) * ldx, ldx, w, ws, p->K, y + size_t(r0) * ldy + col, ldy, p->N - col, add);
      r0 += mr;
    }
    v0 += nv;
  }
}

static inline void gemm(const Packed* p, const float* x, int M, int ldx, float* y, int ldy, bool add, int tid,
                        int nthreads) {
  if (p->dtype >= Q4)
    qgemm(p, x, M, ldx, y, ldy, add, tid, nthreads);
  else if (p->dtype == BF16)
    gemm_part<bf16_t>(p, x, M, ldx, y, ldy, add, tid, nthreads);
  else if (p->dtype == F16)
    gemm_part<f16_t>(p, x, M, ldx, y, ldy, add, tid, nthreads);
  else
    gemm_part<float>(p, x, M, ldx, y, ldy, add, tid, nthreads);
}

}  // namespace dg
