// Quantized weights in the few-row products of gemm.h: GGUF's own blocks (Q4_0, Q4_1, Q5_0, Q5_1,
// Q8_0, Q4_K, Q5_K, Q6_K) in qtiles.h's column tiles, each segment of a product in its own format,
// multiplied from their codes inside the microkernels.
//
// Every format is "unsigned code u, per-sub-block scale d and offset m along K": a weight is
// d * (u - zero) + m. The kernels compute each sub-block's d and m in float32 from the tile's own
// fields (float16 d, m, dmin; the K-quants' d * sc and -(dmin * mn)), once per sub-block for all of
// a register block's rows.
//
// Two kernels, chosen per product (the same for all its quantized segments) by its widest code and the
// instruction set (qtiles.h's int_kernel_for):
// - integer (AVX-512 VNNI for every product; AVX-512 and AVX2 for products of 4- and 5-bit codes): like
//   llama.cpp, each row's activations are quantized to 8 bits per group (x ~ dx * xq, |xq| <= 127, from
//   that row alone; groups of 16 where the product has a Q6_K part, else 32), and a group's products
//   are exact integer dot products over the unsigned codes (vpdpbusd, or maddubs + madd: 4 k per 32-bit
//   lane), the zero point taken back exactly in integers (acc - zero * sum(xq)); each group then adds
//   d * dx * dot + m * dx * sum(xq) to the row's float sums in group order. maddubs adds two
//   code * int8 products in 16 bits, saturating: exact for codes up to 129 (2 * 129 * 127 <= 32767),
//   so for 4- and 5-bit codes; VNNI's vpdpbusd sums in 32 bits and takes any.
// - otherwise (portable builds; products with 6- or 8-bit codes without VNNI): the weights are
//   dequantized in registers ((u - zero) * d + m, one FMA) and reduced like the float kernel
//   (fixed-order chunks over k) with float activations.
// Either way a row's result depends on that row and the weights only: batch invariant by
// construction, whatever the row count.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "packed.h"
#include "qtiles.h"
#include "simd.h"

namespace dg {

// d and m of the VL columns from c0, as q_scale computes them: a block's (q_block_scales, from the
// header at h of w columns: d, and m, or -dmin for the K-quants), then sub-block s's from those.
static inline void q_block_scales(const QFormat& f, const uint8_t* h, int w, int c0, V* d0, V* m0) {
  *d0 = vload(reinterpret_cast<const f16_t*>(h + 2 * c0));
  if (f.scale == SC_D) *m0 = vmul(vset1(f.mmul), *d0);
  if (f.scale == SC_DM) *m0 = vload(reinterpret_cast<const f16_t*>(h + 2 * w + 2 * c0));
  if (f.scale == SC_K) *m0 = vmul(vload(reinterpret_cast<const f16_t*>(h + 2 * w + 2 * c0)), vset1(-1.0f));
  if (f.scale == SC_D0 || f.scale == SC_K6) *m0 = vzero();
}
static inline void q_sub_scales(const QFormat& f, const uint8_t* h, int w, int s, int c0, V d0, V m0, V* d, V* m) {
  if (f.scale == SC_K) {  // d * sc, and -(dmin * mn) as (-dmin) * mn: the same rounding
    *d = vmul(d0, vu8(h + q_sc_at(f, w, s, c0)));
    *m = vmul(m0, vu8(h + q_mn_at(w, s, c0)));
  } else if (f.scale == SC_K6) {
    *d = vmul(d0, vq8(reinterpret_cast<const int8_t*>(h + q_sc_at(f, w, s, c0))));
    *m = m0;
  } else {
    *d = d0, *m = m0;
  }
}

template <int CODE>
constexpr int zero_of() {  // the code of q = 0
  return CODE == CODE8 ? 128 : CODE == CODE6 ? 32 : 0;
}
template <int CODE>
constexpr int sub_of() {  // weights a sub-block (one d, m): Q6_K's 16, the others' 32
  return CODE == CODE6 ? 16 : 32;
}

// Codes of row kq (4 k) of a sub-block, vector j of the tile (w columns): 4 unsigned codes a 32-bit
// lane. Nibble kinds pass the row's nibble load in `nib`.
template <int CODE>
static inline VI q_codes(const uint8_t* codes, VI nib, int kq, int j, int w) {
  constexpr int sub = sub_of<CODE>();
  if constexpr (CODE == CODE8) {
    return vi_load(codes + size_t(kq) * 4 * w + size_t(j) * 4 * VL);
  } else {
    VI c = j == 0 ? vi_low4(nib) : vi_high4(nib);
    if constexpr (CODE != CODE4) {
      const uint8_t* plane = codes + size_t(sub) * VL + size_t(kq) * (w / 2) + size_t(j) * (VL / 2);
      c = vi_plane(c, plane, 16);
      if constexpr (CODE == CODE6) c = vi_plane(c, plane + size_t(sub / 4) * (w / 2), 32);
    }
    return c;
  }
}
template <int CODE>
static inline VI q_nibbles(const uint8_t* codes, int kq) {
  if constexpr (CODE == CODE8) return VI{};
  return vi_load(codes + size_t(kq) * 4 * VL);
}
// A walk over a tile's sub-blocks in order: the block's header h, the sub-block's index s and codes.
struct SubWalk {
  const QFormat& f;
  const uint8_t* h;
  size_t bb, hb, sb;
  int s = 0, nsub;
  SubWalk(const QFormat& fmt, const uint8_t* tile, int w, int sub)
      : f(fmt), h(tile), bb(q_block_bytes(fmt, w)), hb(size_t(fmt.head) * w), sb(q_sub_bytes(fmt, w)),
        nsub(fmt.block / sub) {}
  const uint8_t* codes() const { return h + hb + size_t(s) * sb; }
  DG_INLINE void prefetch() const { prefetch_ahead(s == 0 ? h : codes(), s == 0 ? hb + sb : sb); }
  void next() {
    if (++s == nsub) s = 0, h += bb;
  }
};

// One register block of the float kernel over a quantized tile: MR rows x NV vectors from vector j0.
template <int MR, int NV, int CODE>
static void qmicrokernel(const float* x, int ldx, const QFormat& f, const uint8_t* tile, int w, int j0, int K,
                         float* y, int ldy, int ncols, bool add) {
  constexpr int SUB = sub_of<CODE>(), Z = zero_of<CODE>();
  if (NV == NV_TILE) j0 = 0;  // a block of the whole tile's width starts at its first vector (a constant)
  SubWalk sw(f, tile, w, SUB);
  V acc[MR][NV];
  alignas(64) float tot[MR][NV * VL];
  alignas(64) float bsc[2][NV * VL];  // the block's d and m (or -dmin)
  for (int k0 = 0; k0 < K; k0 += KC) {
    for (int r = 0; r < MR; r++)
      for (int j = 0; j < NV; j++) acc[r][j] = vzero();
    const int k1 = std::min(K, k0 + KC);
    for (int kb = k0; kb < k1; kb += SUB, sw.next()) {
      const uint8_t* codes = sw.codes();
      sw.prefetch();
      V d[NV], m[NV];
      for (int j = 0; j < NV; j++) {
        if (sw.s == 0) {
          q_block_scales(f, sw.h, w, (j0 + j) * VL, &d[j], &m[j]);
          vstore(&bsc[0][j * VL], d[j]);
          vstore(&bsc[1][j * VL], m[j]);
        }
        q_sub_scales(f, sw.h, w, sw.s, (j0 + j) * VL, vload(&bsc[0][j * VL]), vload(&bsc[1][j * VL]), &d[j], &m[j]);
      }
      for (int kq = 0; kq < SUB / 4; kq++) {
        const VI nib = q_nibbles<CODE>(codes, kq);
        VI u[NV];
        for (int j = 0; j < NV; j++) {
          u[j] = q_codes<CODE>(codes, nib, kq, j0 + j, w);
          if constexpr (Z != 0) u[j] = vi_sub8(u[j], Z);  // q = u - zero, a signed byte
        }
        for (int b = 0; b < 4; b++) {
          const int k = kb + 4 * kq + b;
          V wv[NV];
          for (int j = 0; j < NV; j++) wv[j] = vfma(Z != 0 ? vi_sbyte_ps(u[j], b) : vi_byte_ps(u[j], b), d[j], m[j]);
          for (int r = 0; r < MR; r++) {
            V xb = vset1(x[size_t(r) * ldx + k]);
            for (int j = 0; j < NV; j++) acc[r][j] = vfma(xb, wv[j], acc[r][j]);
          }
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

static inline QRows& thread_qrows() {  // every thread quantizes all rows itself: M * K work, no barrier
  static thread_local QRows xr;
  return xr;
}

// One register block of the integer kernel: rows r0.. of xr (activations in groups of G along K, G at
// most a sub-block), NV vectors from the tile's vector j0.
template <int MR, int NV, int CODE, int G>
static void qdot_kernel(const QRows& xr, int r0, const QFormat& f, const uint8_t* tile, int w, int j0, int K,
                        float* y, int ldy, int ncols, bool add) {
  constexpr int SUB = sub_of<CODE>(), Z = zero_of<CODE>();
  static_assert(SUB % G == 0, "a group lies in one sub-block");
  if (NV == NV_TILE) j0 = 0;  // a block of the whole tile's width starts at its first vector (a constant)
  const int ng = K / G;
  SubWalk sw(f, tile, w, SUB);
  alignas(64) float tot[MR][NV * VL];
  alignas(64) float sc[4][NV * VL];  // the block's d and m (or -dmin), the sub-block's d and m (in L1, not registers)
  for (int kb = 0, g = 0; kb < K; kb += SUB, sw.next()) {
    const uint8_t* codes = sw.codes();
    sw.prefetch();
    for (int part = 0; part < SUB / G; part++, g++) {
      VI acc[MR][NV];
      for (int r = 0; r < MR; r++)
        for (int j = 0; j < NV; j++) acc[r][j] = vi_zero();
#pragma GCC unroll 8
      for (int i = 0; i < G / 4; i++) {
        const int kq = part * (G / 4) + i;
        const VI nib = q_nibbles<CODE>(codes, kq);
        VI wv[NV];
        for (int j = 0; j < NV; j++) wv[j] = q_codes<CODE>(codes, nib, kq, j0 + j, w);
        for (int r = 0; r < MR; r++) {
          int32_t x4;
          std::memcpy(&x4, &xr.q[size_t(r0 + r) * K + kb + kq * 4], 4);
          const VI xb = vi_set1(x4);
          for (int j = 0; j < NV; j++) acc[r][j] = vdot4(acc[r][j], wv[j], xb);
        }
      }
      if (part == 0) {  // the sub-block's d and m, after its first dots (the loads of the codes go first)
        const bool subs = f.block != SUB;  // K-quants: sub-block scales from the block's
        for (int j = 0; j < NV; j++) {
          V bd, bm, d, m;
          if (sw.s == 0) {
            q_block_scales(f, sw.h, w, (j0 + j) * VL, &bd, &bm);
            vstore(&sc[subs ? 0 : 2][j * VL], bd);
            vstore(&sc[subs ? 1 : 3][j * VL], bm);
          }
          if (subs) {
            q_sub_scales(f, sw.h, w, sw.s, (j0 + j) * VL, vload(&sc[0][j * VL]), vload(&sc[1][j * VL]), &d, &m);
            vstore(&sc[2][j * VL], d);
            vstore(&sc[3][j * VL], m);
          }
        }
      }
      for (int r = 0; r < MR; r++) {
        const float dx = xr.d[size_t(r0 + r) * ng + g];
        const int32_t sx = xr.s[size_t(r0 + r) * ng + g];
        const V ms = vset1(dx * float(sx));
        for (int j = 0; j < NV; j++) {
          const VI a = Z != 0 ? vi_sub(acc[r][j], vi_set1(Z * sx)) : acc[r][j];  // sum of (u - zero) * xq
          V t = g == 0 ? vzero() : vload(&tot[r][j * VL]);
          t = vfma(vi_to_ps(a), vmul(vload(&sc[2][j * VL]), vset1(dx)), t);
          vstore(&tot[r][j * VL], vfma(vload(&sc[3][j * VL]), ms, t));
        }
      }
    }
  }
  store_block<MR, NV>(tot, y, ldy, ncols, add);
}

using QDotFn = void (*)(const QRows&, int, const QFormat&, const uint8_t*, int, int, int, float*, int, int, bool);

template <int CODE, int G, int NV, int... MRs>
static QDotFn qdot_pick_mr(int mr, std::integer_sequence<int, MRs...>) {
  static constexpr QDotFn table[] = {qdot_kernel<MRs + 1, NV, CODE, G>...};
  return table[mr - 1];
}

template <int CODE, int G>
static QDotFn qdot_pick_code(int mr, int nv) {
  if (nv == 1) return qdot_pick_mr<CODE, G, 1>(mr, std::make_integer_sequence<int, MR_MAX[1]>{});
  return qdot_pick_mr<CODE, G, 2>(mr, std::make_integer_sequence<int, MR_MAX[2]>{});
}

// The integer kernel of a code kind and activation group (16 in a product with a Q6_K part, else 32).
static QDotFn qdot_pick(int code, int G, int mr, int nv) {
#if defined(DG_QDOT_Q8)
  if (code == CODE6) return qdot_pick_code<CODE6, 16>(mr, nv);
  if (code == CODE8) return G == 16 ? qdot_pick_code<CODE8, 16>(mr, nv) : qdot_pick_code<CODE8, 32>(mr, nv);
#endif
  if (code == CODE4) return G == 16 ? qdot_pick_code<CODE4, 16>(mr, nv) : qdot_pick_code<CODE4, 32>(mr, nv);
  return G == 16 ? qdot_pick_code<CODE5, 16>(mr, nv) : qdot_pick_code<CODE5, 32>(mr, nv);
}
#endif

#if !defined(DG_QDOT_Q8)  // with VNNI every quantized product runs the integer kernel
using QMicroFn = void (*)(const float*, int, const QFormat&, const uint8_t*, int, int, int, float*, int, int, bool);

template <int CODE, int NV, int... MRs>
static QMicroFn qpick_mr(int mr, std::integer_sequence<int, MRs...>) {
  static constexpr QMicroFn table[] = {qmicrokernel<MRs + 1, NV, CODE>...};
  return table[mr - 1];
}

template <int CODE>
static QMicroFn qpick_code(int mr, int nv) {
  if (nv == 1) return qpick_mr<CODE, 1>(mr, std::make_integer_sequence<int, MR_MAX[1]>{});
  return qpick_mr<CODE, 2>(mr, std::make_integer_sequence<int, MR_MAX[2]>{});
}

static QMicroFn qpick(int code, int mr, int nv) {
  switch (code) {
    case CODE4: return qpick_code<CODE4>(mr, nv);
    case CODE5: return qpick_code<CODE5>(mr, nv);
    case CODE6: return qpick_code<CODE6>(mr, nv);
    default: return qpick_code<CODE8>(mr, nv);
  }
}
#endif

// Before a product's segments: this thread's quantized activations, where the product runs the integer kernel.
static inline void qgemm_prepare(const Packed* p, const float* x, int M, int ldx) {
#ifdef DG_QDOT
  if (p->qint) thread_qrows().quantize(x, M, ldx, p->K, p->group);
#else
  (void)p, (void)x, (void)M, (void)ldx;
#endif
}

// Vectors [v0, v1) of quantized segment s (its own numbering) of y (+)= x @ W^T; y: the segment's first column.
static void qgemm_seg(const Packed* p, const Seg& sg, int v0, int v1, const float* x, int M, int ldx, float* y,
                      int ldy, bool add) {
  const QFormat& f = q_format(sg.type);
  const uint8_t* base = static_cast<const uint8_t*>(p->data) + sg.offset;
#ifdef DG_QDOT
  const QRows& xr = thread_qrows();
#endif
  while (v0 < v1) {
    const int t = v0 / NV_TILE, in_tile = v0 - t * NV_TILE;
    const int nv = std::min(v1 - v0, NV_TILE - in_tile);
    const int w = sg.tile_width(t), col = v0 * VL;
    const uint8_t* tile = base + q_tile_offset(f, p->K, t);
    for (int r0 = 0; r0 < M;) {
      const int mr = std::min(M - r0, MR_MAX[NV_TILE]);
      float* yr = y + size_t(r0) * ldy + col;
#ifdef DG_QDOT
      if (p->qint) {
        qdot_pick(f.code, p->group, mr, nv)(xr, r0, f, tile, w, in_tile, p->K, yr, ldy, sg.N - col, add);
        r0 += mr;
        continue;
      }
#endif
#if !defined(DG_QDOT_Q8)
      qpick(f.code, mr, nv)(x + size_t(r0) * ldx, ldx, f, tile, w, in_tile, p->K, yr, ldy, sg.N - col, add);
#endif
      r0 += mr;
    }
    v0 += nv;
  }
}

// W[n, :] of a quantized segment's column n (its own numbering).
static void qunpack_row(const Packed* p, const Seg& sg, int n, float* out) {
  const QFormat& f = q_format(sg.type);
  const int t = n / NR;
  const uint8_t* tile = static_cast<const uint8_t*>(p->data) + sg.offset + q_tile_offset(f, p->K, t);
  qunpack_col(f, tile, sg.tile_width(t), n % NR, p->K, out);
}

}  // namespace dg
