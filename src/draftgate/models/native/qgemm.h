// Quantized weights in the few-row products of gemm.h: GGUF's own blocks (Q4_0, Q4_1, Q8_0, Q4_K,
// Q6_K), repacked once into column tiles and multiplied from their codes inside the microkernels.
//
// Every GGUF format here is "integer code q, per-group scale d and offset m along K": a weight is
// d * q + m (m = 0 for the symmetric formats; K-quants' 6-bit sub-block scales multiply into d and
// m exactly). The packer decodes each row into codes and per-group (d, m) and stores, per tile and
// per group of G weights along K:
//   d[w] float, m[w] float, then G code rows: Q4 packs two columns per byte (vector 0's column i in
//   the low nibble of byte i, vector 1's in the high one: VL bytes a row); Q8 one signed byte each.
// A tile is still one sequential stream, about 0.75-1.25 bytes a weight instead of 4.
//
// Two kernels, by tile format and instruction set:
// - integer (AVX-512 VNNI for every tile; AVX-512 and AVX2 for Q4 tiles): like llama.cpp, each
//   row's activations are quantized to 8 bits per group (x ~ dx * xq, |xq| <= 127, from that row
//   alone), and a group's products are exact integer dot products (vpdpbusd, or maddubs + madd:
//   4 k per 32-bit lane, so codes are stored 4 k to a lane; Q8 codes as q + 128, the offset taken
//   back exactly in integers); each group then adds d * dx * dot + m * dx * sum(xq) to the row's
//   float sums in group order. The integer work is a quarter of the float work or less.
// - otherwise (Q8 tiles without VNNI, portable builds): the weights are dequantized in registers
//   (q * d + m, one FMA) and reduced like the float kernel (fixed-order chunks over k) with float
//   activations.
// Either way a row's result depends on that row and the weights only: batch invariant by
// construction, whatever the row count. gemm.h dispatches quantized tiles here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "gguf_decode.h"  // GGUF block formats -> codes and per-group scales
#include "packed.h"
#include "simd.h"

namespace dg {

#if defined(__AVX512F__) || defined(__AVX2__)
#define DG_QDOT 1  // integer dot products on Q4 tiles
#endif
#if defined(__AVX512VNNI__)
#define DG_QDOT_Q8 1  // ... and on Q8 tiles: vpdpbusd takes codes up to 255, where maddubs would saturate
#endif

// Whether tiles of format FMT run the integer kernel (activations in 8 bits) on this build.
template <int FMT>
constexpr bool int_kernel() {
#if defined(DG_QDOT_Q8)
  return true;
#elif defined(DG_QDOT)
  return FMT == Q4;
#else
  return false;
#endif
}

static inline int qrow_bytes(const Packed* p, int w) { return p->dtype == Q4 ? VL : w; }

// Byte of code (kk, c) in a group's codes, and Q8's stored offset (Q4 nibbles: c < VL low, else high).
// Row layout: G rows of qrow_bytes. Tiles of the integer kernel: 4 k per 32-bit lane, G/4 rows of 4 * qrow_bytes.
static inline size_t code_at(const Packed* p, int w, int kk, int c) {
  const int cc = p->dtype == Q4 ? c % VL : c;
  if (p->dtype == Q4 ? int_kernel<Q4>() : int_kernel<Q8>())
    return size_t(kk / 4) * 4 * qrow_bytes(p, w) + size_t(cc / VL) * VL * 4 + (cc % VL) * 4 + kk % 4;
  return size_t(kk) * qrow_bytes(p, w) + cc;
}
constexpr int Q8_OFFSET = int_kernel<Q8>() ? 128 : 0;  // the integer kernel multiplies unsigned codes
static inline size_t qblock_bytes(const Packed* p, int w) { return size_t(8) * w + size_t(p->group) * qrow_bytes(p, w); }
static inline size_t qtile_offset(const Packed* p, int t) { return size_t(t) * (p->K / p->group) * qblock_bytes(p, NR); }

static inline size_t packed_bytes(const Packed* p) {
  return p->dtype >= Q4 ? qtile_offset(p, p->tiles) : size_t(p->tiles) * NR * p->K * p->elem();
}

// Pack the rows of n_parts GGML tensors, stacked (e.g. q, k, v), all [rows[i], K], into one Packed.
// All 4-bit formats: Q4 tiles with groups of 32; otherwise Q8 tiles (groups of 16 if any is Q6_K).
static Packed* pack_gguf(int n_parts, const void* const* srcs, const int* types, const int* rows, int K) {
  bool all4 = true, any6 = false;
  int N = 0;
  for (int i = 0; i < n_parts; i++) {
    const int t = types[i];
    const int block = (t == GGML_Q4_K || t == GGML_Q6_K) ? 256 : 32;
    if (ggml_row_bytes(t, 256) == 0) throw std::invalid_argument("unsupported GGML type " + std::to_string(t));
    if (K % block != 0) throw std::invalid_argument("K = " + std::to_string(K) + " is not a multiple of the block size");
    all4 = all4 && (t == GGML_Q4_0 || t == GGML_Q4_1 || t == GGML_Q4_K);
    any6 = any6 || t == GGML_Q6_K;
    N += rows[i];
  }
  auto* p = new Packed();
  p->N = N;
  p->K = K;
  p->dtype = all4 ? Q4 : Q8;
  p->group = any6 ? 16 : 32;
  p->nvec = (N + VL - 1) / VL;
  p->tiles = (p->nvec + NV_TILE - 1) / NV_TILE;
  const size_t bytes = packed_bytes(p);
  p->data = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  std::memset(p->data, 0, bytes);  // padded columns: d = m = 0, a zero weight
  const int G = p->group, nb = K / G;
  std::vector<int> q(K);
  std::vector<float> d(nb), m(nb);
  int n = 0;
  for (int i = 0; i < n_parts; i++) {
    const size_t rb = ggml_row_bytes(types[i], K);
    for (int r = 0; r < rows[i]; r++, n++) {
      decode_row(types[i], static_cast<const uint8_t*>(srcs[i]) + size_t(r) * rb, K, G, q.data(), d.data(), m.data());
      const int t = n / NR, c = n % NR, w = p->tile_width(t);
      uint8_t* tile = static_cast<uint8_t*>(p->data) + qtile_offset(p, t);
      for (int b = 0; b < nb; b++) {
        uint8_t* blk = tile + size_t(b) * qblock_bytes(p, w);
        reinterpret_cast<float*>(blk)[c] = d[b];
        reinterpret_cast<float*>(blk)[w + c] = m[b];
        uint8_t* codes = blk + size_t(8) * w;
        for (int kk = 0; kk < G; kk++) {
          const int code = q[b * G + kk];
          if (p->dtype == Q4)
            codes[code_at(p, w, kk, c)] |= uint8_t(code << (c < VL ? 0 : 4));
          else
            codes[code_at(p, w, kk, c)] = uint8_t(code + Q8_OFFSET);
        }
      }
    }
  }
  return p;
}

static void qunpack_row(const Packed* p, int n, float* out) {
  const int t = n / NR, c = n % NR, w = p->tile_width(t), G = p->group;
  const uint8_t* tile = static_cast<const uint8_t*>(p->data) + qtile_offset(p, t);
  for (int k = 0; k < p->K; k++) {
    const uint8_t* blk = tile + size_t(k / G) * qblock_bytes(p, w);
    const float d = reinterpret_cast<const float*>(blk)[c], m = reinterpret_cast<const float*>(blk)[w + c];
    const uint8_t code = blk[size_t(8) * w + code_at(p, w, k % G, c)];
    const int q = p->dtype == Q4 ? (c < VL ? code & 15 : code >> 4) : int(int8_t(uint8_t(code - Q8_OFFSET)));
    out[k] = float(q) * d + m;
  }
}

// One register block over a quantized tile: MR rows x NV vectors starting at the tile's vector j0.
template <int MR, int NV, int FMT>
static void qmicrokernel(const float* x, int ldx, const uint8_t* tile, int w, int j0, int K, int G, float* y, int ldy,
                         int ncols, bool add) {
  const int rw = FMT == Q4 ? VL : w;
  const size_t bb = size_t(8) * w + size_t(G) * rw;
  V acc[MR][NV];
  alignas(64) float tot[MR][NV * VL];
  for (int k0 = 0; k0 < K; k0 += KC) {
    for (int r = 0; r < MR; r++)
      for (int j = 0; j < NV; j++) acc[r][j] = vzero();
    const int k1 = std::min(K, k0 + KC);
    for (int kb = k0; kb < k1; kb += G) {
      const uint8_t* blk = tile + size_t(kb / G) * bb;
#if defined(__AVX512F__) || defined(__AVX2__)
      for (size_t b = 0; b < bb; b += 64) _mm_prefetch(reinterpret_cast<const char*>(blk) + DG_PREFETCH_BYTES + b, DG_PREFETCH_HINT);
#endif
      const float* dm = reinterpret_cast<const float*>(blk);
      V d[NV], m[NV];
      for (int j = 0; j < NV; j++) {
        d[j] = vload(dm + (j0 + j) * VL);
        m[j] = vload(dm + w + (j0 + j) * VL);
      }
      const uint8_t* codes = blk + size_t(8) * w;
      for (int k = kb; k < kb + G; k++) {
        const uint8_t* row = codes + size_t(k - kb) * rw;
        V wv[NV];
        for (int j = 0; j < NV; j++) {
          V qv = FMT == Q4 ? vq4(row, j0 + j > 0) : vq8(reinterpret_cast<const int8_t*>(row) + (j0 + j) * VL);
          wv[j] = vfma(qv, d[j], m[j]);
        }
        for (int r = 0; r < MR; r++) {
          V b = vset1(x[size_t(r) * ldx + k]);
          for (int j = 0; j < NV; j++) acc[r][j] = vfma(b, wv[j], acc[r][j]);
        }
      }
    }
    for (int r = 0; r < MR; r++)
      for (int j = 0; j < NV; j++)
        vstore(&tot[r][j * VL], k0 == 0 ? acc[r][j] : vadd(vload(&tot[r][j * VL]), acc[r][j]));
  }
  store_block<MR, NV>(tot, y, ldy, ncols, add);
}

#ifdef DG_QDOT
// Rows of activations quantized per group of G along K: x ~ dx * xq. Each row from its own values.
struct QRows {
  std::vector<int8_t> q;   // [M, K]
  std::vector<float> d;    // [M, K / G]
  std::vector<int32_t> s;  // [M, K / G] sum of the group's xq
  void quantize(const float* x, int M, int ldx, int K, int G) {
    const int nb = K / G, nv = G / VL;  // G is 16 or 32: 1 to 4 vectors a group
    q.resize(size_t(M) * K);
    d.resize(size_t(M) * nb);
    s.resize(size_t(M) * nb);
    alignas(64) int32_t qi[32];
    for (int r = 0; r < M; r++)
      for (int b = 0; b < nb; b++) {
        const float* xg = x + size_t(r) * ldx + size_t(b) * G;
        V amax = vzero(), nan = vzero();  // nan: x * 0 is 0 unless x is not finite
        for (int j = 0; j < nv; j++) {
          const V v = vload(xg + j * VL);
          amax = vmax(amax, vmax(v, vsub(vzero(), v)));
          nan = vadd(nan, vmul(v, vzero()));
        }
        const float m = vmaxval(amax), inv = m > 0.0f ? 127.0f / m : 0.0f;
        for (int j = 0; j < nv; j++) vi_store(qi + j * VL, vi_clamp127(vi_round(vmul(vload(xg + j * VL), vset1(inv)))));
        int8_t* out = &q[size_t(r) * K + size_t(b) * G];
        int32_t sum = 0;
        for (int k = 0; k < G; k++) {
          out[k] = int8_t(qi[k]);
          sum += qi[k];
        }
        // A non-finite input makes the group's scale NaN, so the output shows it (as the float kernel's would).
        d[size_t(r) * nb + b] = vsum(nan) == 0.0f ? m / 127.0f : NAN;
        s[size_t(r) * nb + b] = sum;
      }
  }
};

// One register block of the integer kernel: rows r0.. of xr, NV vectors from the tile's vector j0.
template <int MR, int NV, int FMT, int G>  // G a template constant: the k loop unrolls, accumulators stay put
static void qdot_kernel(const QRows& xr, int r0, const uint8_t* tile, int w, int j0, int K, float* y, int ldy,
                        int ncols, bool add) {
  const int nb = K / G, rq = 4 * (FMT == Q4 ? VL : w);  // bytes of 4 k of codes
  const size_t bb = size_t(8) * w + size_t(G / 4) * rq;
  alignas(64) float tot[MR][NV * VL];
  for (int b = 0; b < nb; b++) {
    const uint8_t* blk = tile + size_t(b) * bb;
    for (size_t o = 0; o < bb; o += 64) _mm_prefetch(reinterpret_cast<const char*>(blk) + DG_PREFETCH_BYTES + o, DG_PREFETCH_HINT);
    const uint8_t* codes = blk + size_t(8) * w;
    VI acc[MR][NV];
    for (int r = 0; r < MR; r++)
      for (int j = 0; j < NV; j++) acc[r][j] = vi_zero();
    for (int kq = 0; kq < G / 4; kq++) {
      const uint8_t* row = codes + size_t(kq) * rq;
      VI wv[NV];
      if (FMT == Q4) {
        const VI v = vi_load(row);
        for (int j = 0; j < NV; j++) wv[j] = j0 + j == 0 ? vi_low4(v) : vi_high4(v);
      } else {
        for (int j = 0; j < NV; j++) wv[j] = vi_load(row + (j0 + j) * VL * 4);
      }
      for (int r = 0; r < MR; r++) {
        int32_t x4;
        std::memcpy(&x4, &xr.q[size_t(r0 + r) * K + size_t(b) * G + kq * 4], 4);
        const VI xb = vi_set1(x4);
        for (int j = 0; j < NV; j++) acc[r][j] = vdot4(acc[r][j], wv[j], xb);
      }
    }
    const float* dm = reinterpret_cast<const float*>(blk);
    for (int r = 0; r < MR; r++) {
      const float dx = xr.d[size_t(r0 + r) * nb + b];
      const int32_t sx = xr.s[size_t(r0 + r) * nb + b];
      const V ms = vset1(dx * float(sx));
      for (int j = 0; j < NV; j++) {
        const VI a = FMT == Q8 ? vi_sub(acc[r][j], vi_set1(Q8_OFFSET * sx)) : acc[r][j];
        V t = b == 0 ? vzero() : vload(&tot[r][j * VL]);
        t = vfma(vi_to_ps(a), vmul(vload(dm + (j0 + j) * VL), vset1(dx)), t);
        vstore(&tot[r][j * VL], vfma(vload(dm + w + (j0 + j) * VL), ms, t));
      }
    }
  }
  store_block<MR, NV>(tot, y, ldy, ncols, add);
}

using QDotFn = void (*)(const QRows&, int, const uint8_t*, int, int, int, float*, int, int, bool);

template <int FMT, int NV, int G, int... MRs>
static QDotFn qdot_pick_mr(int mr, std::integer_sequence<int, MRs...>) {
  static constexpr QDotFn table[] = {qdot_kernel<MRs + 1, NV, FMT, G>...};
  return table[mr - 1];
}

template <int FMT, int G>
static QDotFn qdot_pick(int mr, int nv) {
  if (nv == 1) return qdot_pick_mr<FMT, 1, G>(mr, std::make_integer_sequence<int, MR_MAX[1]>{});
  return qdot_pick_mr<FMT, 2, G>(mr, std::make_integer_sequence<int, MR_MAX[2]>{});
}
#endif

using QMicroFn = void (*)(const float*, int, const uint8_t*, int, int, int, int, float*, int, int, bool);

template <int FMT, int NV, int... MRs>
static QMicroFn qpick_mr(int mr, std::integer_sequence<int, MRs...>) {
  static constexpr QMicroFn table[] = {qmicrokernel<MRs + 1, NV, FMT>...};
  return table[mr - 1];
}

template <int FMT>
static QMicroFn qpick(int mr, int nv) {
  if (nv == 1) return qpick_mr<FMT, 1>(mr, std::make_integer_sequence<int, MR_MAX[1]>{});
  return qpick_mr<FMT, 2>(mr, std::make_integer_sequence<int, MR_MAX[2]>{});
}

// This thread's share of y (+)= x @ W^T, as gemm_part.
template <int FMT>
static void qgemm_part(const Packed* p, const float* x, int M, int ldx, float* y, int ldy, bool add, int tid,
                       int nthreads) {
  const uint8_t* base = static_cast<const uint8_t*>(p->data);
  int v0 = int(int64_t(p->nvec) * tid / nthreads), v1 = int(int64_t(p->nvec) * (tid + 1) / nthreads);
#ifdef DG_QDOT
  static thread_local QRows xr;  // every thread quantizes all rows itself: M * K work, no barrier
  if (int_kernel<FMT>() && v0 < v1) xr.quantize(x, M, ldx, p->K, p->group);
#endif
  while (v0 < v1) {
    int t = v0 / NV_TILE, in_tile = v0 - t * NV_TILE;
    int nv = std::min({v1 - v0, p->nvec - v0, NV_TILE - in_tile});
    int w = p->tile_width(t), col = v0 * VL;
    for (int r0 = 0; r0 < M;) {
      int mr = std::min(M - r0, MR_MAX[NV_TILE]);
#ifdef DG_QDOT
      if constexpr (int_kernel<FMT>()) {
        auto fn = p->group == 16 ? qdot_pick<FMT, 16>(mr, nv) : qdot_pick<FMT, 32>(mr, nv);
        fn(xr, r0, base + qtile_offset(p, t), w, in_tile, p->K, y + size_t(r0) * ldy + col, ldy, p->N - col, add);
        r0 += mr;
        continue;
      }
#endif
      qpick<FMT>(mr, nv)(x + size_t(r0) * ldx, ldx, base + qtile_offset(p, t), w, in_tile, p->K, p->group,
                         y + size_t(r0) * ldy + col, ldy, p->N - col, add);
      r0 += mr;
    }
    v0 += nv;
  }
}

static void qgemm(const Packed* p, const float* x, int M, int ldx, float* y, int ldy, bool add, int tid,
                  int nthreads) {
  if (p->dtype == Q4)
    qgemm_part<Q4>(p, x, M, ldx, y, ldy, add, tid, nthreads);
  else
    qgemm_part<Q8>(p, x, M, ldx, y, ldy, add, tid, nthreads);
}

}  // namespace dg
