// GGUF's quantized formats as column tiles (qgemm.h multiplies them), and the packer of a GGUF product:
// its stacked parts (q, k, v; gate, up) each become a segment along N in their own format (packed.h),
// consecutive parts of one format one segment.
//
// A quantized weight is d * (u - zero) + m with u its unsigned code (gguf_decode.h's decode_codes).
// Each format keeps its own fields at its own width, so the tiles take about the file's bytes:
//   format  codes           per block of 32 (K-quants: 256) and column   bytes a weight (file)
//   Q4_0    nibbles         d f16 (m = -8 d)                             0.5625 (0.5625)
//   Q4_1    nibbles         d, m f16                                     0.625  (0.625)
//   Q5_0    nibbles + plane d f16 (m = -16 d)                            0.6875 (0.6875)
//   Q5_1    nibbles + plane d, m f16                                     0.75   (0.75)
//   Q8_0    bytes (q + 128) d f16 (m = 0)                                1.0625 (1.0625)
//   Q4_K    nibbles         d, dmin f16; per 32: sc, mn bytes            0.578  (0.5625)
//   Q5_K    nibbles + plane as Q4_K                                      0.703  (0.6875)
//   Q6_K    nibbles + 2 planes (q + 32)  d f16; per 16: sc int8          0.8203 (0.8203)
// K-quants' d * sc and -(dmin * mn) are multiplied in float32 by the kernels (exact: an 11-bit by a
// 6- or 8-bit significand), Q4_0's -8 d and Q5_0's -16 d too.
//
// Tile layout: a tile of w columns (NR, or VL for a segment's narrower last tile) is K / block blocks
// in order, each its header (per field, w values in column order: d[w], then m or dmin[w], then the
// K-quants' sc[sub][w] and mn[sub][w]) and its sub-blocks' codes in order. A sub-block's codes are
// rows of 4 k (a 32-bit lane holds 4 k of one column, as the integer kernel's dot products take them):
// - bytes (Q8_0): a row is w lanes, 4 * w bytes;
// - nibbles: a row is VL lanes, 4 * VL bytes: vector 0's code in the low nibble, vector 1's in the high;
// - bit planes (the fifth code bit, and Q6_K's sixth), after the nibble rows, one plane after the other:
//   a row is 4 * w bits, vector j's 4 * VL from bit j * 4 * VL; bit i is byte i's of the vector's lanes.
// A sub-block's bytes: a multiple of 64 for full tiles, so every row is one aligned load.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gguf_decode.h"
#include "packed.h"
#include "simd.h"

namespace dg {

enum CodeKind : int { CODE4 = 0, CODE5 = 1, CODE6 = 2, CODE8 = 3 };  // nibbles; + 1 bit plane; + 2; bytes
// m of a weight: SC_D mmul * d; SC_D0 0; SC_DM stored; SC_K d * sc and -(dmin * mn); SC_K6 d * sc and 0.
enum ScaleKind : int { SC_D = 0, SC_D0 = 1, SC_DM = 2, SC_K = 3, SC_K6 = 4 };

struct QFormat {
  int type, code;
  int block, sub;  // weights per block (its header) and per sub-block (one d, m) along K
  int zero;        // code of q = 0 (Q8_0 128, Q6_K 32)
  int scale;       // ScaleKind
  float mmul;      // SC_D: m = mmul * d
  int head;        // header bytes per column
};
constexpr QFormat Q_FORMATS[] = {
    {GGML_Q4_0, CODE4, 32, 32, 0, SC_D, -8.0f, 2},   {GGML_Q4_1, CODE4, 32, 32, 0, SC_DM, 0.0f, 4},
    {GGML_Q5_0, CODE5, 32, 32, 0, SC_D, -16.0f, 2},  {GGML_Q5_1, CODE5, 32, 32, 0, SC_DM, 0.0f, 4},
    {GGML_Q8_0, CODE8, 32, 32, 128, SC_D0, 0.0f, 2}, {GGML_Q4_K, CODE4, 256, 32, 0, SC_K, 0.0f, 20},
    {GGML_Q5_K, CODE5, 256, 32, 0, SC_K, 0.0f, 20},  {GGML_Q6_K, CODE6, 256, 16, 32, SC_K6, 0.0f, 18},
};

static inline const QFormat& q_format(int type) {
  for (const QFormat& f : Q_FORMATS)
    if (f.type == type) return f;
  throw std::invalid_argument("GGML type " + ggml_type_name(type) + " has no quantized tiles");
}

static inline int code_bits(int code) { return code == CODE8 ? 8 : 4 + code; }

#if defined(__AVX512VNNI__)
#define DG_QDOT 1     // integer dot products on quantized tiles of every code width
#define DG_QDOT_Q8 1  // (vpdpbusd sums u8 * s8 in 32 bits: any code up to 255)
#elif defined(__AVX512F__) || defined(__AVX2__)
#define DG_QDOT 1  // integer dot products on codes of up to 5 bits (maddubs' 16-bit pair sums are exact below 129)
#endif

// Whether a product whose widest code has `bits` bits runs the integer kernel on this build.
static inline bool int_kernel_for(int bits) {
#if defined(DG_QDOT_Q8)
  return bits > 0;
#elif defined(DG_QDOT)
  return bits > 0 && bits <= 5;
#else
  return bits < 0;  // portable: never
#endif
}

// Layout (see the header comment): bytes of a row of 4 k of codes (planes included), a sub-block, a block.
static inline size_t q_row_bytes(const QFormat& f, int w) {
  return f.code == CODE8 ? size_t(4) * w : size_t(4) * VL + size_t(f.code) * (w / 2);
}
static inline size_t q_sub_bytes(const QFormat& f, int w) { return size_t(f.sub / 4) * q_row_bytes(f, w); }
static inline size_t q_block_bytes(const QFormat& f, int w) {
  return size_t(f.head) * w + size_t(f.block / f.sub) * q_sub_bytes(f, w);
}
static inline size_t q_tile_offset(const QFormat& f, int K, int t) {  // the tiles before t are full width
  return size_t(t) * (K / f.block) * q_block_bytes(f, NR);
}
static inline size_t seg_bytes(const Seg& s, int K) {
  if (s.dtype != QUANT || s.tiles == 0) return float_seg_bytes(s, K);
  const QFormat& f = q_format(s.type);
  return q_tile_offset(f, K, s.tiles - 1) + (K / f.block) * q_block_bytes(f, s.tile_width(s.tiles - 1));
}

// Where code (kk, c) of a sub-block lies: byte `*at` (nibbles: the high one if `*hi`), and its plane bits
// at plane_at + p * plane_stride, bit `*bit`.
static inline void q_code_at(const QFormat& f, int w, int kk, int c, size_t* at, bool* hi, size_t* plane_at,
                             size_t* plane_stride, int* bit) {
  const int j = c / VL, i = (c % VL) * 4 + kk % 4, kq = kk / 4;
  *hi = f.code != CODE8 && j == 1;
  *at = f.code == CODE8 ? size_t(kq) * 4 * w + size_t(j) * 4 * VL + i : size_t(kq) * 4 * VL + i;
  *plane_stride = size_t(f.sub / 4) * (w / 2);
  *plane_at = size_t(f.sub) * VL + size_t(kq) * (w / 2) + size_t(j) * (VL / 2) + i / 8;
  *bit = i % 8;
}

// The header fields of column c: d's float16 bits at h + 2c, m's or dmin's at h + 2w + 2c, the K-quants'
// sc of sub-block s at h + 4w + s * w + c (Q6_K: h + 2w + s * w + c) and mn at h + 12w + s * w + c.
static inline size_t q_sc_at(const QFormat& f, int w, int s, int c) {
  return size_t(f.scale == SC_K6 ? 2 : 4) * w + size_t(s) * w + c;
}
static inline size_t q_mn_at(int w, int s, int c) { return size_t(12) * w + size_t(s) * w + c; }

// Column c's d and m in sub-block s of the block at h, in float32 as the kernels compute them.
static inline void q_scale(const QFormat& f, const uint8_t* h, int w, int s, int c, float* d, float* m) {
  const float d0 = f16_to_f32(u16_at(h + 2 * c));
  switch (f.scale) {
    case SC_D: *d = d0, *m = f.mmul * d0; break;
    case SC_D0: *d = d0, *m = 0.0f; break;
    case SC_DM: *d = d0, *m = f16_to_f32(u16_at(h + 2 * w + 2 * c)); break;
    case SC_K:
      *d = d0 * float(h[q_sc_at(f, w, s, c)]);
      *m = (f16_to_f32(u16_at(h + 2 * w + 2 * c)) * float(h[q_mn_at(w, s, c)])) * -1.0f;
      break;
    default: *d = d0 * float(int8_t(h[q_sc_at(f, w, s, c)])), *m = 0.0f; break;  // SC_K6
  }
}

// Column c of the tile at `tile` (w columns), weights [K] as the kernels multiply them: d * q + m.
static void qunpack_col(const QFormat& f, const uint8_t* tile, int w, int c, int K, float* out) {
  const size_t bb = q_block_bytes(f, w), sb = q_sub_bytes(f, w);
  for (int k = 0; k < K; k++) {
    const uint8_t* h = tile + size_t(k / f.block) * bb;
    const int s = (k % f.block) / f.sub;
    const uint8_t* codes = h + size_t(f.head) * w + size_t(s) * sb;
    size_t at, pa, ps;
    bool hi;
    int bit;
    q_code_at(f, w, k % f.sub, c, &at, &hi, &pa, &ps, &bit);
    int u = f.code == CODE8 ? codes[at] : hi ? codes[at] >> 4 : codes[at] & 15;
    for (int p = 0; p < f.code && f.code != CODE8; p++) u |= ((codes[pa + p * ps] >> bit) & 1) << (4 + p);
    float d, m;
    q_scale(f, h, w, s, c, &d, &m);
    out[k] = float(u - f.zero) * d + m;
  }
}

// One GGUF row `src` decoded into column c of the tile at `tile` (w columns).
struct QRowScratch {  // one decoded GGUF row
  std::vector<uint8_t> u, sc, mn;
  std::vector<uint16_t> d, m;
  explicit QRowScratch(int K) : u(K), sc(K / 16), mn(K / 16), d(K / 32), m(K / 32) {}
};

// A column's codes, 4 k at a time: one 32-bit OR into its lane of a row (bytes, or nibbles at `shift`),
// and per bit plane one OR of 4 bits at `bit0` (the plane bits of 4 consecutive k of a column are adjacent).
template <int CODE>
static void qpack_codes(const uint8_t* u, int n, uint8_t* row, size_t rb, uint8_t* plane, size_t pw, size_t ps,
                        int shift, int bit0) {
  for (int kq = 0; kq < n / 4; kq++, row += rb, plane += pw) {
    uint32_t u4, lane;
    std::memcpy(&u4, u + 4 * kq, 4);
    std::memcpy(&lane, row, 4);
    lane |= CODE == CODE8 ? u4 : (u4 & 0x0F0F0F0Fu) << shift;
    std::memcpy(row, &lane, 4);
    for (int p = 0; p < (CODE == CODE8 ? 0 : CODE); p++) {
      const uint32_t x = (u4 >> (4 + p)) & 0x01010101u;  // bit 4 + p of each code, at bit 0 of its byte
      const uint32_t bits = (x | x >> 7 | x >> 14 | x >> 21) & 15u;
      plane[p * ps] |= uint8_t(bits << bit0);
    }
  }
}

static void qpack_col(const QFormat& f, const uint8_t* src, int K, uint8_t* tile, int w, int c, QRowScratch& r) {
  decode_codes(f.type, src, K, r.u.data(), r.d.data(), r.m.data(), r.sc.data(), r.mn.data());
  const size_t bb = q_block_bytes(f, w), sb = q_sub_bytes(f, w), rb = f.code == CODE8 ? 4 * w : 4 * VL;
  const int nsub = f.block / f.sub, shift = f.code != CODE8 && c >= VL ? 4 : 0;
  size_t at0, pa0, ps;  // row 0's byte of k = 0 and its plane byte; the planes' stride
  bool hi;
  int bit0;
  q_code_at(f, w, 0, c, &at0, &hi, &pa0, &ps, &bit0);
  auto codes_fn = f.code == CODE4   ? qpack_codes<CODE4>
                  : f.code == CODE5 ? qpack_codes<CODE5>
                  : f.code == CODE6 ? qpack_codes<CODE6>
                                    : qpack_codes<CODE8>;
  for (int b = 0; b < K / f.block; b++) {
    uint8_t* h = tile + size_t(b) * bb;
    std::memcpy(h + 2 * c, &r.d[b], 2);
    if (f.scale == SC_DM || f.scale == SC_K) std::memcpy(h + 2 * w + 2 * c, &r.m[b], 2);
    for (int s = 0; s < nsub; s++) {
      const int si = b * nsub + s;
      if (f.scale == SC_K || f.scale == SC_K6) h[q_sc_at(f, w, s, c)] = r.sc[si];
      if (f.scale == SC_K) h[q_mn_at(w, s, c)] = r.mn[si];
      uint8_t* codes = h + size_t(f.head) * w + size_t(s) * sb;
      codes_fn(&r.u[size_t(si) * f.sub], f.sub, codes + at0, rb, codes + pa0, w / 2, ps, shift, bit0);
    }
  }
}

// Tiles of the segments before segment i (numbering tiles across a product's segments).
static inline int tile_count_before(const Packed* p, int i) {
  int n = 0;
  for (int j = 0; j < i; j++) n += p->segs[j].tiles;
  return n;
}

// Where tile t of segment s lies in a product's data, [begin, end) (a segment's last tile to its end).
static inline std::pair<size_t, size_t> tile_bytes(const Packed* p, const Seg& s, int t) {
  auto start = [&](int i) {
    if (i >= s.tiles) return s.offset + s.bytes;
    return s.offset + (s.dtype == QUANT ? q_tile_offset(q_format(s.type), p->K, i) : size_t(i) * NR * p->K * s.elem());
  };
  return {start(t), start(t + 1)};
}

// Threads packing one product: the CPUs, at most 8, and no more than its tiles (pack time only).
static inline int pack_threads(const Packed* p) {
  const int cpus = std::max(1, int(std::thread::hardware_concurrency()));
  return std::max(1, std::min({cpus, 8, tile_count_before(p, int(p->segs.size()))}));
}

// Pack the rows of n_parts GGML tensors, stacked (e.g. q, k, v), all [rows[i], K], into one product:
// a segment per run of parts in one format, in that format's tiles (float types in their own storage).
static Packed* pack_gguf(int n_parts, const void* const* srcs, const int* types, const int* rows, int K) {
  if (n_parts < 1) throw std::invalid_argument("a product needs at least one part");
  int bits = 0;
  bool any6 = false;
  for (int i = 0; i < n_parts; i++) {
    const GgmlFormat& f = ggml_format(types[i]);  // throws, naming an unsupported type
    if (K % f.block != 0)
      throw std::invalid_argument("K = " + std::to_string(K) + " is not a multiple of " + f.name + "'s block of " +
                                  std::to_string(f.block));
    bits = std::max(bits, f.bits);
    any6 = any6 || f.type == GGML_Q6_K;
  }
  auto* p = new Packed();
  p->K = K;
  std::vector<int> seg_of_part(n_parts);
  for (int i = 0; i < n_parts;) {  // a segment per run of one type
    int n = 0, j = i;
    for (; j < n_parts && types[j] == types[i]; j++) n += rows[j];
    const int bitsi = ggml_format(types[i]).bits;
    const int dtype = bitsi ? QUANT : types[i] == GGML_F16 ? F16 : types[i] == GGML_BF16 ? BF16 : F32;
    p->add(dtype, types[i], n, seg_bytes);
    for (; i < j; i++) seg_of_part[i] = int(p->segs.size()) - 1;
  }
  p->dtype = bits == 0 ? p->segs[0].dtype : bits <= 4 ? Q4 : bits == 5 ? Q5 : Q8;
  p->qint = int_kernel_for(bits);
  p->group = any6 ? 16 : 32;
  p->alloc_data(false);  // each tile zeroed by its thread below: padded columns get zero codes and scales
  // Columns in tiles of NR: tile g (numbered across segments) is thread g % T's, so threads write disjoint bytes.
  auto work = [&](int tid, int T) {
    for (int si = 0, g = 0; si < int(p->segs.size()); si++)
      for (int t = 0; t < p->segs[si].tiles; t++, g++)
        if (g % T == tid) {
          const auto [b0, b1] = tile_bytes(p, p->segs[si], t);
          std::memset(static_cast<uint8_t*>(p->data) + b0, 0, b1 - b0);
        }
    QRowScratch scratch(K);
    for (int i = 0, n = 0; i < n_parts; i++) {
      const Seg& s = p->segs[seg_of_part[i]];
      const size_t rb = ggml_row_bytes(types[i], K);
      const int tiles_before = tile_count_before(p, seg_of_part[i]);
      for (int r = 0; r < rows[i]; r++, n++) {
        const int col = n - s.n0, t = col / NR, c = col % NR, w = s.tile_width(t);
        if ((tiles_before + t) % T != tid) continue;
        const uint8_t* src = static_cast<const uint8_t*>(srcs[i]) + size_t(r) * rb;
        uint8_t* base = static_cast<uint8_t*>(p->data) + s.offset;
        if (s.dtype == QUANT) {
          const QFormat& f = q_format(s.type);
          qpack_col(f, src, K, base + q_tile_offset(f, K, t), w, c, scratch);
        } else {  // float: the stored bits of each weight, [K][w] per tile
          const size_t e = s.elem();
          uint8_t* out = base + (size_t(t) * NR * K + c) * e;
          for (int k = 0; k < K; k++) std::memcpy(out + size_t(k) * w * e, src + size_t(k) * e, e);
        }
      }
    }
  };
  const int T = pack_threads(p);
  std::vector<std::thread> threads;
  for (int tid = 1; tid < T; tid++) threads.emplace_back(work, tid, T);
  work(0, T);
  for (std::thread& t : threads) t.join();
  return p;
}

}  // namespace dg
