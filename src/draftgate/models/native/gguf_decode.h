// GGUF's quantized block formats (ggml's layouts), decoded row by row into what the packer of
// qgemm.h stores: integer codes and, per group of G weights along K, a scale d and an offset m
// (a weight is d * q + m). Pack-time code: plain C++, no SIMD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "simd.h"

namespace dg {

// ggml's type ids of the block formats the packer reads.
enum GgmlType : int { GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8, GGML_Q4_K = 12, GGML_Q6_K = 14 };

// Bytes of one row of K weights in a GGML block format (0: not a format the packer reads).
static inline size_t ggml_row_bytes(int type, int K) {
  switch (type) {
    case GGML_Q4_0: return size_t(K / 32) * 18;
    case GGML_Q4_1: return size_t(K / 32) * 20;
    case GGML_Q8_0: return size_t(K / 32) * 34;
    case GGML_Q4_K: return size_t(K / 256) * 144;
    case GGML_Q6_K: return size_t(K / 256) * 210;
    default: return 0;
  }
}

static inline float f16_at(const uint8_t* b) { return f16_to_f32(uint16_t(b[0] | (b[1] << 8))); }

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

// One row of K weights in GGML format `type` -> codes q[K] and (d, m) per group of G along K.
static void decode_row(int type, const uint8_t* s, int K, int G, int* q, float* d, float* m) {
  auto put = [&](int k0, int n, float dd, float mm) {
    for (int k = k0; k < k0 + n; k += G) {
      d[k / G] = dd;
      m[k / G] = mm;
    }
  };
  switch (type) {
    case GGML_Q4_0:
    case GGML_Q4_1:
      for (int b = 0; b < K / 32; b++) {
        const bool q41 = type == GGML_Q4_1;
        const uint8_t* blk = s + size_t(b) * (q41 ? 20 : 18);
        const uint8_t* qs = blk + (q41 ? 4 : 2);
        float dd = f16_at(blk);
        for (int j = 0; j < 16; j++) {
          q[32 * b + j] = qs[j] & 15;
          q[32 * b + j + 16] = qs[j] >> 4;
        }
        put(32 * b, 32, dd, q41 ? f16_at(blk + 2) : -8.0f * dd);
      }
      break;
    case GGML_Q8_0:
      for (int b = 0; b < K / 32; b++) {
        const uint8_t* blk = s + size_t(b) * 34;
        for (int j = 0; j < 32; j++) q[32 * b + j] = int8_t(blk[2 + j]);
        put(32 * b, 32, f16_at(blk), 0.0f);
      }
      break;
    case GGML_Q4_K:
      for (int b = 0; b < K / 256; b++) {
        const uint8_t* blk = s + size_t(b) * 144;
        const float dd = f16_at(blk), dmin = f16_at(blk + 2);
        const uint8_t *sc = blk + 4, *qs = blk + 16;
        for (int j = 0; j < 4; j++) {  // 64 weights: the low nibbles of 32 bytes, then their high nibbles
          int s1, m1, s2, m2;
          q4k_scale_min(2 * j, sc, &s1, &m1);
          q4k_scale_min(2 * j + 1, sc, &s2, &m2);
          const int k0 = 256 * b + 64 * j;
          for (int l = 0; l < 32; l++) {
            q[k0 + l] = qs[32 * j + l] & 15;
            q[k0 + 32 + l] = qs[32 * j + l] >> 4;
          }
          put(k0, 32, dd * float(s1), -(dmin * float(m1)));
          put(k0 + 32, 32, dd * float(s2), -(dmin * float(m2)));
        }
      }
      break;
    case GGML_Q6_K:
      for (int b = 0; b < K / 256; b++) {
        const uint8_t* blk = s + size_t(b) * 210;
        const float dd = f16_at(blk + 208);
        for (int n = 0; n < 2; n++) {  // two halves of 128: ql[64], qh[32], scales[8] each
          const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
          const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192) + 8 * n;
          const int k0 = 256 * b + 128 * n;
          for (int l = 0; l < 32; l++) {
            q[k0 + l] = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
            q[k0 + l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            q[k0 + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            q[k0 + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          }
          for (int g = 0; g < 8; g++) put(k0 + 16 * g, 16, dd * float(sc[g]), 0.0f);
        }
      }
      break;
    default:
      throw std::invalid_argument("unsupported GGML type " + std::to_string(type));
  }
}

}  // namespace dg
