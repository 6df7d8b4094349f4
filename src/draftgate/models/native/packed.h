// Weights packed for the few-row products (gemm.h, qgemm.h): the storage formats, the column tiles
// both the float and the quantized kernels stream, and what every register block shares (the K
// chunking, the prefetch distance, the store of a block's finished sums).
//
// A product is one or more segments along N, each a run of columns in one storage: float32,
// bfloat16, float16, or one GGUF quantized format (qgemm.h's tiles); the stacked parts of a product
// (q, k, v; gate, up) each keep their own storage. A segment's columns are in tiles of NV_TILE
// vectors (NV_TILE * VL columns); float tile t holds W[t*NR : t*NR + NR, :] transposed, [K][NR]
// contiguous, so a tile is one sequential stream, and a segment's tiles follow each other. A
// segment's columns are padded to a multiple of VL with zero columns; stores are cut at its end.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

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

// A product's storage as dg_packed_dtype reports it; compute is always fp32. A product with
// quantized segments reports the class of its widest codes: Q4 (4-bit), Q5 (5-bit), Q8 (6- and 8-bit).
enum DType : int { F32 = 0, BF16 = 1, F16 = 2, Q4 = 3, Q8 = 4, Q5 = 5 };
constexpr int QUANT = 16;  // a segment's dtype for quantized tiles (its GGUF format in Seg::type)

// A run of columns in one storage.
struct Seg {
  int dtype = F32;  // F32, BF16, F16, or QUANT
  int type = 0;     // QUANT: the GGUF type id (gguf_decode.h's GgmlType)
  int n0 = 0, N = 0;           // its first column in the product, and its columns
  int v0 = 0, nvec = 0;        // its first column vector in the product's numbering, and its vectors
  int tiles = 0;               // ceil(nvec / NV_TILE)
  size_t offset = 0, bytes = 0;  // where its tiles start in Packed::data, and their bytes

  size_t elem() const { return dtype == F32 ? 4 : 2; }  // float tiles: bytes a weight
  int tile_width(int t) const { return std::min(NR, (nvec - t * NV_TILE) * VL); }  // the last may be narrower
};

struct Packed {
  int N = 0, K = 0, dtype = F32;
  int nvec = 0;     // column vectors of all segments
  int group = 32;   // the integer kernel's activation group along K (qgemm.h)
  bool qint = false;  // quantized segments run qgemm.h's integer kernel
  std::vector<Seg> segs;
  void* data = nullptr;
  size_t bytes = 0;  // of all segments' tiles

  // Append a segment of N columns (its tiles' bytes from seg_bytes) after the others.
  Seg& add(int dtype, int type, int n, size_t (*seg_bytes)(const Seg&, int K)) {
    Seg s;
    s.dtype = dtype, s.type = type, s.n0 = N, s.N = n, s.v0 = nvec;
    s.nvec = (n + VL - 1) / VL;
    s.tiles = (s.nvec + NV_TILE - 1) / NV_TILE;
    s.offset = bytes;
    s.bytes = (seg_bytes(s, K) + 63) / 64 * 64;  // each segment starts on a cache line
    N += n, nvec += s.nvec, bytes += s.bytes;
    segs.push_back(s);
    return segs.back();
  }
  // Storage for the segments' tiles (freed with std::free), zeroed unless the caller zeroes each tile
  // as it fills it (in the thread that fills it: the pages fault in on every packing thread at once).
  void alloc_data(bool zero = true) {
    data = std::aligned_alloc(64, (bytes + 64 + 63) / 64 * 64);
    if (!data) throw std::bad_alloc();
    std::memset(static_cast<uint8_t*>(data) + (zero ? 0 : bytes), 0, zero ? bytes + 64 : 64);
  }
  const Seg& seg_of(int n) const {  // the segment holding column n
    for (const Seg& s : segs)
      if (n < s.n0 + s.N) return s;
    return segs.back();
  }
};

// Bytes of a float segment's tiles: [K][w] elements per tile.
static inline size_t float_seg_bytes(const Seg& s, int K) { return size_t(s.tiles) * NR * K * s.elem(); }

// This thread's share [*v0, *v1) of a product's column vectors: equal shares of its tiles' bytes
// (a segment's vectors weigh its bytes a vector). Any split gives the same values: a column's sums
// do not depend on which thread computes it.
static inline void thread_vectors(const Packed* p, int tid, int nthreads, int* v0, int* v1) {
  auto at = [&](int i) {  // the first vector of share i
    if (i >= nthreads) return p->nvec;
    const size_t target = size_t(double(p->bytes) * i / nthreads);
    size_t before = 0;
    for (const Seg& s : p->segs) {
      if (target < before + s.bytes) return s.v0 + int((target - before) * s.nvec / s.bytes);
      before += s.bytes;
    }
    return p->nvec;
  };
  *v0 = at(tid);
  *v1 = at(tid + 1);
}

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

// Software prefetch of [p, p + n) DG_PREFETCH_BYTES ahead (no-op in portable builds). Always inlined:
// GCC takes a function whose only effect is a prefetch for one without side effects, and drops its calls.
#define DG_INLINE inline __attribute__((always_inline))
static DG_INLINE void prefetch_ahead(const void* p, size_t n) {
#if defined(__AVX512F__) || defined(__AVX2__)
  const char* a = static_cast<const char*>(p) + DG_PREFETCH_BYTES;
  for (size_t b = 0; b < n; b += 64) _mm_prefetch(a + b, DG_PREFETCH_HINT);
#else
  (void)p, (void)n;
#endif
}

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
