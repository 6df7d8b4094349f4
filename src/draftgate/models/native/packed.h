// Weights packed for the few-row products (gemm.h, qgemm.h): the storage formats, the column tiles
// both the float and the quantized kernels stream, and what every register block shares (the K
// chunking, the prefetch distance, the store of a block's finished sums).
//
// Packed layout: columns in tiles of NV_TILE vectors (NV_TILE * VL columns); tile t holds
// W[t*NR : t*NR + NR, :] transposed, [K][NR] contiguous, so a tile is one sequential stream.
// N is padded to a multiple of VL with zero columns; stores are cut at N.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "simd.h"

namespace dg {

// Register blocks: MR rows x NV vectors of accumulators (+ NV weight vectors + 1 broadcast must
// fit the register file). Tiles are NV_TILE = 2 vectors wide so that up to MR_MAX[2] rows take
// one pass over the weights: every weight byte is read from memory once while the FMAs of all
// rows run, and compute hides under the memory stream. More rows take row blocks of MR_MAX[2]
// (the later blocks read the tile from L2; measured faster than one-vector-wide blocks of up to
// MR_MAX[1] rows, whose two half-width passes over a tile stream alternate cache lines).
constexpr int NV_TILE = 2;
#if defined(__AVX512F__)
constexpr int MR_MAX[3] = {0, 12, 12};  // 32 zmm registers
#elif defined(__AVX2__)
constexpr int MR_MAX[3] = {0, 6, 6};  // 16 ymm registers
#else
constexpr int MR_MAX[3] = {0, 4, 4};
#endif
constexpr int NR = NV_TILE * VL;

// Weight storage; compute is always fp32. Q4 and Q8 are the quantized tiles of qgemm.h.
enum DType : int { F32 = 0, BF16 = 1, F16 = 2, Q4 = 3, Q8 = 4 };

struct Packed {
  int N = 0, K = 0, dtype = F32;
  int group = 0;  // quantized: weights per scale along K
  int nvec = 0;   // ceil(N / VL) column vectors
  int tiles = 0;  // ceil(nvec / NV_TILE)
  void* data = nullptr;

  size_t elem() const { return dtype == F32 ? 4 : 2; }
  // Start of tile t, and its row stride (the last tile may be narrower).
  size_t tile_offset(int t) const { return size_t(t) * NR * K; }
  int tile_width(int t) const { return std::min(NR, (nvec - t * NV_TILE) * VL); }
};

// Element i of a float32, bfloat16 or float16 array, as float32 (exact).
static inline float to_f32(const void* data, int dtype, size_t i) {
  if (dtype == F32) return static_cast<const float*>(data)[i];
  uint16_t h = static_cast<const uint16_t*>(data)[i];
  return dtype == BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// K is reduced in chunks of KC: each chunk is one FMA chain from 0, and the chunk sums are added in
// order. That bounds the rounding error by about (KC + K/KC) ulps instead of K (a 1536-long chain
// drifted 1.9e-4 from transformers' logits on SmolLM2), at the same cost, and the order is still
// fixed by K alone.
constexpr int KC = 64;

#ifndef DG_PREFETCH_HINT
#define DG_PREFETCH_HINT _MM_HINT_T1  // into L2: measured a little ahead of T0 for 5-9 rows
#endif
#ifndef DG_PREFETCH_BYTES
#define DG_PREFETCH_BYTES 8192
#endif

// A register block's finished sums tot[MR][NV * VL] into y (add: onto it), only the real columns of
// a padded last vector.
template <int MR, int NV>
static inline void store_block(const float (&tot)[MR][NV * VL], float* y, int ldy, int ncols, bool add) {
  for (int r = 0; r < MR; r++)
    for (int j = 0; j < NV; j++) {
      float* out = y + size_t(r) * ldy + j * VL;
      int valid = ncols - j * VL;
      if (valid >= VL) {
        V t = vload(&tot[r][j * VL]);
        vstore(out, add ? vadd(vload(out), t) : t);
      } else if (valid > 0) {
        for (int i = 0; i < valid; i++) out[i] = add ? out[i] + tot[r][j * VL + i] : tot[r][j * VL + i];
      }
    }
}

}  // namespace dg
