// GGUF's tensor formats the packer reads (ggml's type ids and layouts): its quantized block formats,
// decoded row by row into what the quantized tiles of qtiles.h store (unsigned integer codes and the
// blocks' own scale fields, bit for bit), and its float types, stored as they are. Pack-time code:
// plain C++, no SIMD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "simd.h"

namespace dg {

// ggml's type ids of the formats the packer reads: float rows and quantized blocks.
enum GgmlType : int {
  GGML_F32 = 0,
  GGML_F16 = 1,
  GGML_Q4_0 = 2,
  GGML_Q4_1 = 3,
  GGML_Q5_0 = 6,
  GGML_Q5_1 = 7,
  GGML_Q8_0 = 8,
  GGML_Q4_K = 12,
  GGML_Q5_K = 13,
  GGML_Q6_K = 14,
  GGML_BF16 = 30,
};

// A format the packer reads: weights and bytes per block, and the width of its integer codes
// (0: a float type, one weight a block, multiplied as it is stored).
struct GgmlFormat {
  int type;
  const char* name;
  int block, bytes, bits;
};
constexpr GgmlFormat GGML_FORMATS[] = {
    {GGML_F32, "F32", 1, 4, 0},         {GGML_F16, "F16", 1, 2, 0},      {GGML_BF16, "BF16", 1, 2, 0},
    {GGML_Q4_0, "Q4_0", 32, 18, 4},     {GGML_Q4_1, "Q4_1", 32, 20, 4},  {GGML_Q5_0, "Q5_0", 32, 22, 5},
    {GGML_Q5_1, "Q5_1", 32, 24, 5},     {GGML_Q8_0, "Q8_0", 32, 34, 8},  {GGML_Q4_K, "Q4_K", 256, 144, 4},
    {GGML_Q5_K, "Q5_K", 256, 176, 5},   {GGML_Q6_K, "Q6_K", 256, 210, 6},
};

// ggml's name of any type id (for messages; ids ggml retired have none).
static inline std::string ggml_type_name(int type) {
  static const char* const names[] = {
      "F32",    "F16",   "Q4_0",  "Q4_1",   nullptr, nullptr, "Q5_0",    "Q5_1",   "Q8_0",    "Q8_1",   // 0-9
      "Q2_K",   "Q3_K",  "Q4_K",  "Q5_K",   "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",  // 10-19
      "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",    "I16",   "I32",     "I64",    "F64",     "IQ1_M",  // 20-29
      "BF16",   nullptr, nullptr, nullptr,  "TQ1_0", "TQ2_0", nullptr,   nullptr,  nullptr,   "MXFP4",  // 30-39
      "NVFP4",  "Q1_0"};
  constexpr int n = int(sizeof(names) / sizeof(names[0]));
  return type >= 0 && type < n && names[type] ? names[type] : "type " + std::to_string(type);
}

// The format of type id `type`; throws naming the type and the formats read where it is not one.
static inline const GgmlFormat& ggml_format(int type) {
  for (const GgmlFormat& f : GGML_FORMATS)
    if (f.type == type) return f;
  std::string known;
  for (const GgmlFormat& f : GGML_FORMATS) known += std::string(known.empty() ? "" : ", ") + f.name;
  throw std::invalid_argument("unsupported GGML type " + ggml_type_name(type) + " (" + std::to_string(type) +
                              "): the native kernels read " + known);
}

// Bytes of one row of K weights in format `type` (K a multiple of its block).
static inline size_t ggml_row_bytes(int type, int K) {
  const GgmlFormat& f = ggml_format(type);
  return size_t(K / f.block) * f.bytes;
}

static inline float f16_at(const uint8_t* b) { return f16_to_f32(uint16_t(b[0] | (b[1] << 8))); }
static inline float bf16_at(const uint8_t* b) { return bf16_to_f32(uint16_t(b[0] | (b[1] << 8))); }

// Q4_K's 6-bit scale and min of sub-block j (ggml's packing of 8 pairs into 12 bytes).
static inline void q4k_scale_min(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

static inline uint16_t u16_at(const uint8_t* b) { return uint16_t(b[0] | (b[1] << 8)); }

// One row of K weights in GGML block format `type`, as the quantized tiles store it (qtiles.h):
// - codes u[K], unsigned: Q4_* 0..15 and Q5_* 0..31 (the zero point in m), Q6_K 0..63 (its q + 32),
//   Q8_0 0..255 (its q + 128);
// - per block (32 weights; K-quants 256) the float16 bits of d[K / block] and of m[K / block]
//   (Q4_1 and Q5_1: the offset; K-quants: dmin; the others: none);
// - per sub-block of the K-quants (32 weights; Q6_K 16) the scale sc[] and the min mn[] (Q4_K, Q5_K:
//   6 bits each; Q6_K: sc's int8 bits).
// The weights are then d * (u - zero) + m; qtiles.h says which m each format has.
static void decode_codes(int type, const uint8_t* s, int K, uint8_t* u, uint16_t* d, uint16_t* m, uint8_t* sc,
                         uint8_t* mn) {
  switch (type) {
    case GGML_Q4_0:
    case GGML_Q4_1:
    case GGML_Q5_0:
    case GGML_Q5_1:
      for (int b = 0; b < K / 32; b++) {  // d, (m,) Q5_*'s 32 fifth bits, then 16 bytes of nibbles
        const bool has_m = type == GGML_Q4_1 || type == GGML_Q5_1, q5 = type == GGML_Q5_0 || type == GGML_Q5_1;
        const uint8_t* blk = s + size_t(b) * ggml_format(type).bytes;
        const uint8_t* qh = blk + (has_m ? 4 : 2);
        const uint8_t* qs = qh + (q5 ? 4 : 0);
        const uint32_t h = q5 ? uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24 : 0;
        for (int j = 0; j < 16; j++) {  // weight j: the low nibble of byte j (+ bit j); weight j + 16: its high one
          u[32 * b + j] = uint8_t((qs[j] & 15) | ((h >> j) & 1) << 4);
          u[32 * b + j + 16] = uint8_t((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
        }
        d[b] = u16_at(blk);
        if (has_m) m[b] = u16_at(blk + 2);
      }
      break;
    case GGML_Q8_0:
      for (int b = 0; b < K / 32; b++) {
        const uint8_t* blk = s + size_t(b) * 34;
        for (int j = 0; j < 32; j++) u[32 * b + j] = uint8_t(blk[2 + j] + 128);  // int8 q -> q + 128
        d[b] = u16_at(blk);
      }
      break;
    case GGML_Q4_K:
    case GGML_Q5_K:
      for (int b = 0; b < K / 256; b++) {  // d, dmin, 12 bytes of scales and mins, (Q5_K: qh[32],) nibbles
        const bool q5 = type == GGML_Q5_K;
        const uint8_t* blk = s + size_t(b) * (q5 ? 176 : 144);
        const uint8_t *scales = blk + 4, *qh = blk + 16, *qs = blk + (q5 ? 48 : 16);
        d[b] = u16_at(blk);
        m[b] = u16_at(blk + 2);
        for (int j = 0; j < 8; j++) {  // sub-block j of 32: low (j even) or high nibbles of qs[32 * (j / 2)...], bit j of qh
          int s1, m1;
          q4k_scale_min(j, scales, &s1, &m1);
          sc[8 * b + j] = uint8_t(s1);
          mn[8 * b + j] = uint8_t(m1);
          const uint8_t* ql = qs + 32 * (j / 2);
          for (int l = 0; l < 32; l++)
            u[256 * b + 32 * j + l] = uint8_t(((ql[l] >> (4 * (j % 2))) & 15) | (q5 ? ((qh[l] >> j) & 1) << 4 : 0));
        }
      }
      break;
    case GGML_Q6_K:
      for (int b = 0; b < K / 256; b++) {
        const uint8_t* blk = s + size_t(b) * 210;
        d[b] = u16_at(blk + 208);
        for (int n = 0; n < 2; n++) {  // two halves of 128: ql[64], qh[32], scales[8] each
          const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
          const int k0 = 256 * b + 128 * n;
          for (int l = 0; l < 32; l++) {
            u[k0 + l] = uint8_t((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4));
            u[k0 + l + 32] = uint8_t((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
            u[k0 + l + 64] = uint8_t((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            u[k0 + l + 96] = uint8_t((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
          }
          for (int g = 0; g < 8; g++) sc[16 * b + 8 * n + g] = blk[192 + 8 * n + g];
        }
      }
      break;
    default:  // a float type, or one ggml_format refuses
      throw std::invalid_argument("GGML type " + ggml_type_name(type) + " has no integer codes");
  }
}

}  // namespace dg
