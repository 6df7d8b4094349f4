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
// The packed layout is packed.h's; float32, bfloat16 and float16 segments run the kernel here, the
// quantized ones qgemm.h's, and `gemm` dispatches each segment on its storage.
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

// W [N, K] row-major in float storage `dtype` into one float segment.
static inline Packed* pack(const void* src, int dtype, int N, int K) {
  auto* p = new Packed();
  p->K = K;
  p->dtype = dtype;
  const Seg& s = p->add(dtype, 0, N, float_seg_bytes);
  p->alloc_data();
  const size_t e = s.elem();
  for (int n = 0; n < N; n++) {
    const int t = n / NR, c = n % NR, w = s.tile_width(t);
    uint8_t* out = static_cast<uint8_t*>(p->data) + (size_t(t) * NR * K + c) * e;
    const uint8_t* in = static_cast<const uint8_t*>(src) + size_t(n) * K * e;
    for (int k = 0; k < K; k++) std::memcpy(out + size_t(k) * w * e, in + size_t(k) * e, e);
  }
  return p;
}

static inline void unpack_row(const Packed* p, int n, float* out) {  // W[n, :] (an embedding's row)
  const Seg& s = p->seg_of(n);
  n -= s.n0;
  if (s.dtype == QUANT) return qunpack_row(p, s, n, out);
  const int t = n / NR, c = n % NR, w = s.tile_width(t);
  const void* base = static_cast<const uint8_t*>(p->data) + s.offset;
  for (int k = 0; k < p->K; k++) out[k] = to_f32(base, s.dtype, size_t(t) * NR * p->K + size_t(k) * w + c);
}

static inline size_t packed_bytes(const Packed* p) { return p->bytes; }

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

// Vectors [v0, v1) of float segment s (its own numbering) of y (+)= x @ W^T; y: the segment's first column.
template <typename W>
static void gemm_seg(const Packed* p, const Seg& s, int v0, int v1, const float* x, int M, int ldx, float* y,
                     int ldy, bool add) {
  const W* base = reinterpret_cast<const W*>(static_cast<const uint8_t*>(p->data) + s.offset);
  const int step = NV_TILE, mr_max = MR_MAX[NV_TILE];  // nv < NV_TILE only where a thread's range ends
  while (v0 < v1) {
    int t = v0 / NV_TILE, in_tile = v0 - t * NV_TILE;
    int nv = std::min({step - in_tile % step, v1 - v0, NV_TILE - in_tile});
    int ws = s.tile_width(t), col = v0 * VL;
    const W* w = base + size_t(t) * NR * p->K + in_tile * VL;
    for (int r0 = 0; r0 < M;) {
      int mr = std::min(M - r0, mr_max);
      pick<W>(mr, nv)(x + size_t(r0) * ldx, ldx, w, ws, p->K, y + size_t(r0) * ldy + col, ldy, s.N - col, add);
      r0 += mr;
    }
    v0 += nv;
  }
}

// This thread's share of y (+)= x @ W^T (thread_vectors), segment by segment in each one's kernel.
static inline void gemm(const Packed* p, const float* x, int M, int ldx, float* y, int ldy, bool add, int tid,
                        int nthreads) {
  int v0, v1;
  thread_vectors(p, tid, nthreads, &v0, &v1);
  if (v0 >= v1) return;
  qgemm_prepare(p, x, M, ldx);
  for (const Seg& s : p->segs) {
    const int a = std::max(v0, s.v0) - s.v0, b = std::min(v1, s.v0 + s.nvec) - s.v0;
    if (a >= b) continue;
    float* ys = y + s.n0;
    if (s.dtype == QUANT)
      qgemm_seg(p, s, a, b, x, M, ldx, ys, ldy, add);
    else if (s.dtype == BF16)
      gemm_seg<bf16_t>(p, s, a, b, x, M, ldx, ys, ldy, add);
    else if (s.dtype == F16)
      gemm_seg<f16_t>(p, s, a, b, x, M, ldx, ys, ldy, add);
    else
      gemm_seg<float>(p, s, a, b, x, M, ldx, ys, ldy, add);
  }
}

}  // namespace dg
