// SIMD vocabulary for the native kernels: one vector type per instruction set, chosen at compile
// time (the build compiles one library per CPU level: AVX-512, AVX2+FMA, or portable C++).
//
// Every reduction in the kernels is written as a fixed sequence of these operations, never left
// to the compiler (the library is built with -ffp-contract=off and without -ffast-math), so a
// value's rounding depends only on its own inputs: that is what makes the forward batch invariant.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace dg {

// 16-bit weight formats, as distinct types so overloads pick the right conversion.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

static inline float bf16_to_f32(uint16_t h) {  // exact: the bits move up 16
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline float f16_to_f32(uint16_t h) {  // exact (IEEE half -> single)
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal half: normalise
    int e = -1;
    do {
      man <<= 1;
      e++;
    } while ((man & 0x400) == 0);
    u = sign | (uint32_t(112 - e) << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__AVX512F__)
constexpr int VL = 16;  // floats per vector
using V = __m512;
static inline V vzero() { return _mm512_setzero_ps(); }
static inline V vset1(float a) { return _mm512_set1_ps(a); }
static inline V vload(const float* p) { return _mm512_loadu_ps(p); }
static inline void vstore(float* p, V a) { _mm512_storeu_ps(p, a); }
static inline V vload(const bf16_t* p) {  // bf16 -> fp32 is exact: the bits move up 16
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline V vload(const f16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }  // a*b+c, one rounding
static inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
static inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
static inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
static inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
static inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
static inline V vmin(V a, V b) { return _mm512_min_ps(a, b); }
static inline V vround(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline V vpow2i(V n) {  // 2^n for integral n in [-126, 127]
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(e);
}
static inline const char* isa_name() {
#if defined(__AVX512VNNI__)
  return "avx512vnni";  // + 8-bit integer dot products (qgemm.h's quantized path)
#else
  return "avx512";
#endif
}
#elif defined(__AVX2__)
constexpr int VL = 8;
using V = __m256;
static inline V vzero() { return _mm256_setzero_ps(); }
static inline V vset1(float a) { return _mm256_set1_ps(a); }
static inline V vload(const float* p) { return _mm256_loadu_ps(p); }
static inline void vstore(float* p, V a) { _mm256_storeu_ps(p, a); }
static inline V vload(const bf16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline V vload(const f16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
static inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
static inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
static inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
static inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
static inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
static inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
static inline V vmin(V a, V b) { return _mm256_min_ps(a, b); }
static inline V vround(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline V vpow2i(V n) {
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(e);
}
static inline const char* isa_name() { return "avx2"; }
#else
// Portable fallback: an 8-float struct; the compiler may vectorize the lane loops (they are
// element-wise, so that changes no rounding). "fma" is a multiply then an add here.
constexpr int VL = 8;
struct V {
  float v[VL];
};
#define DG_LANES(expr) \
  V r;                 \
  for (int i = 0; i < VL; i++) r.v[i] = (expr);   \
  return r
static inline V vzero() { DG_LANES(0.0f); }
static inline V vset1(float a) { DG_LANES(a); }
static inline V vload(const float* p) { DG_LANES(p[i]); }
static inline void vstore(float* p, V a) { std::memcpy(p, a.v, sizeof(a.v)); }
static inline V vload(const bf16_t* p) { DG_LANES(bf16_to_f32(p[i].bits)); }
static inline V vload(const f16_t* p) { DG_LANES(f16_to_f32(p[i].bits)); }
static inline V vfma(V a, V b, V c) { DG_LANES(a.v[i] * b.v[i] + c.v[i]); }
static inline V vadd(V a, V b) { DG_LANES(a.v[i] + b.v[i]); }
static inline V vsub(V a, V b) { DG_LANES(a.v[i] - b.v[i]); }
static inline V vmul(V a, V b) { DG_LANES(a.v[i] * b.v[i]); }
static inline V vdiv(V a, V b) { DG_LANES(a.v[i] / b.v[i]); }
static inline V vmax(V a, V b) { DG_LANES(a.v[i] > b.v[i] ? a.v[i] : b.v[i]); }
static inline V vmin(V a, V b) { DG_LANES(a.v[i] < b.v[i] ? a.v[i] : b.v[i]); }
static inline V vround(V a) { DG_LANES(std::nearbyint(a.v[i])); }
static inline V vpow2i(V n) { DG_LANES(std::ldexp(1.0f, int(n.v[i]))); }
#undef DG_LANES
static inline const char* isa_name() { return "portable"; }
#endif

// 32-bit integer lanes (VL of them) for the quantized kernels (qgemm.h): 4 bytes a lane, as the 8-bit
// dot products take them. vi_plane adds `value` to every byte i whose bit i of bits[] is set (a code's
// high bit from its bit plane); vi_byte_ps is byte b of every lane as a float (vi_sbyte_ps: as a signed
// byte); vi_sub8 subtracts z from every byte.
#if defined(__AVX512F__)
using VI = __m512i;
static inline VI vi_zero() { return _mm512_setzero_si512(); }
static inline VI vi_load(const void* p) { return _mm512_loadu_si512(p); }
static inline void vi_store(int32_t* p, VI a) { _mm512_storeu_si512(p, a); }
static inline VI vi_set1(int32_t a) { return _mm512_set1_epi32(a); }
static inline VI vi_sub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
static inline VI vi_clamp127(VI a) { return _mm512_max_epi32(_mm512_min_epi32(a, vi_set1(127)), vi_set1(-127)); }
static inline VI vi_round(V a) { return _mm512_cvtps_epi32(a); }  // to nearest even (MXCSR's default)
static inline V vi_to_ps(VI a) { return _mm512_cvtepi32_ps(a); }
static inline VI vi_low4(VI v) { return _mm512_and_si512(v, _mm512_set1_epi8(15)); }  // of every byte
static inline VI vi_high4(VI v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(15)); }
// acc + per 32-bit lane the 4 products of w's unsigned bytes with x's signed bytes. Without VNNI the
// byte pairs add in 16 bits first, exact while w's bytes are below 129 (the 4- and 5-bit codes).
static inline VI vdot4(VI acc, VI w, VI x) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, w, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), _mm512_set1_epi16(1)));
#endif
}
static inline VI vi_plane(VI v, const uint8_t* bits, int value) {
  uint64_t b;
  std::memcpy(&b, bits, 8);
  return _mm512_mask_add_epi8(v, _cvtu64_mask64(b), v, _mm512_set1_epi8(char(value)));
}
static inline V vi_byte_ps(VI v, int b) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * b), _mm512_set1_epi32(255)));
}
static inline VI vi_sub8(VI v, int z) { return _mm512_sub_epi8(v, _mm512_set1_epi8(char(z))); }
static inline V vi_sbyte_ps(VI v, int b) {  // byte b of every lane, signed
  return _mm512_cvtepi32_ps(_mm512_srai_epi32(b == 3 ? v : _mm512_slli_epi32(v, 24 - 8 * b), 24));
}
#elif defined(__AVX2__)
using VI = __m256i;
static inline VI vi_zero() { return _mm256_setzero_si256(); }
static inline VI vi_load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
static inline void vi_store(int32_t* p, VI a) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), a); }
static inline VI vi_set1(int32_t a) { return _mm256_set1_epi32(a); }
static inline VI vi_sub(VI a, VI b) { return _mm256_sub_epi32(a, b); }
static inline VI vi_clamp127(VI a) { return _mm256_max_epi32(_mm256_min_epi32(a, vi_set1(127)), vi_set1(-127)); }
static inline VI vi_round(V a) { return _mm256_cvtps_epi32(a); }
static inline V vi_to_ps(VI a) { return _mm256_cvtepi32_ps(a); }
static inline VI vi_low4(VI v) { return _mm256_and_si256(v, _mm256_set1_epi8(15)); }
static inline VI vi_high4(VI v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(15)); }
static inline VI vdot4(VI acc, VI w, VI x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
}
static inline VI vi_plane(VI v, const uint8_t* bits, int value) {
  uint32_t b;
  std::memcpy(&b, bits, 4);
  const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));  // byte i: bit i % 8
  const __m256i x = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(int(b)), spread), bit);
  return _mm256_or_si256(v, _mm256_and_si256(_mm256_cmpeq_epi8(x, bit), _mm256_set1_epi8(char(value))));
}
static inline V vi_byte_ps(VI v, int b) {
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8 * b), _mm256_set1_epi32(255)));
}
static inline VI vi_sub8(VI v, int z) { return _mm256_sub_epi8(v, _mm256_set1_epi8(char(z))); }
static inline V vi_sbyte_ps(VI v, int b) {
  return _mm256_cvtepi32_ps(_mm256_srai_epi32(b == 3 ? v : _mm256_slli_epi32(v, 24 - 8 * b), 24));
}
#else  // portable: the lanes as plain integers (no dot products here: the float kernel decodes codes with them)
struct VI {
  uint32_t v[VL];
};
static inline VI vi_load(const void* p) {
  VI r;
  std::memcpy(r.v, p, sizeof(r.v));
  return r;
}
static inline VI vi_low4(VI a) {
  for (int i = 0; i < VL; i++) a.v[i] &= 0x0F0F0F0Fu;
  return a;
}
static inline VI vi_high4(VI a) {
  for (int i = 0; i < VL; i++) a.v[i] = (a.v[i] >> 4) & 0x0F0F0F0Fu;
  return a;
}
static inline VI vi_plane(VI a, const uint8_t* bits, int value) {
  for (int i = 0; i < VL; i++) {  // lane i's 4 bits, one to each of its bytes
    const uint32_t n = (bits[i / 2] >> (4 * (i % 2))) & 15u;
    a.v[i] += ((n & 1u) | (n & 2u) << 7 | (n & 4u) << 14 | (n & 8u) << 21) * uint32_t(value);
  }
  return a;
}
static inline V vi_byte_ps(VI a, int b) {
  V r;
  for (int i = 0; i < VL; i++) r.v[i] = float((a.v[i] >> (8 * b)) & 255u);
  return r;
}
static inline VI vi_sub8(VI a, int z) {
  for (int i = 0; i < VL; i++) {
    uint32_t r = 0;
    for (int b = 0; b < 4; b++) r |= uint32_t(uint8_t((a.v[i] >> (8 * b)) - uint32_t(z))) << (8 * b);
    a.v[i] = r;
  }
  return a;
}
static inline V vi_sbyte_ps(VI a, int b) {
  V r;
  for (int i = 0; i < VL; i++) r.v[i] = float(int8_t(uint8_t(a.v[i] >> (8 * b))));
  return r;
}
#endif

// VL bytes as floats (exact: small integers): vu8 unsigned, vq8 signed.
static inline V vu8(const uint8_t* p) {
#if defined(__AVX512F__)
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  V r;
  for (int i = 0; i < VL; i++) r.v[i] = float(p[i]);
  return r;
#endif
}

static inline V vq8(const int8_t* p) {
#if defined(__AVX512F__)
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__)
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
  V r;
  for (int i = 0; i < VL; i++) r.v[i] = float(p[i]);
  return r;
#endif
}

// The first n < VL floats at p, zeros in the other lanes (never reads past p + n).
static inline V vload_n(const float* p, int n) {
#if defined(__AVX512F__)
  return _mm512_maskz_loadu_ps(__mmask16((1u << n) - 1u), p);
#elif defined(__AVX2__)
  alignas(32) static const int32_t ramp[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_load_si256(reinterpret_cast<const __m256i*>(ramp)));
  return _mm256_maskload_ps(p, mask);
#else
  V r = vzero();
  for (int i = 0; i < n; i++) r.v[i] = p[i];
  return r;
#endif
}

// Store the first n <= VL lanes of a at p (never writes past p + n).
static inline void vstore_n(float* p, V a, int n) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, __mmask16((1u << n) - 1u), a);
#elif defined(__AVX2__)
  alignas(32) static const int32_t ramp[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_load_si256(reinterpret_cast<const __m256i*>(ramp)));
  _mm256_maskstore_ps(p, mask, a);
#else
  for (int i = 0; i < n; i++) p[i] = a.v[i];
#endif
}

// Horizontal sum in a fixed order (a fixed shuffle tree per instruction set).
static inline float vsum(V a) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps(a);
#elif defined(__AVX2__)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
#else
  float s = 0.0f;
  for (int i = 0; i < VL; i++) s += a.v[i];
  return s;
#endif
}

static inline float vmaxval(V a) {
  alignas(64) float t[VL];
  vstore(t, a);
  float m = t[0];
  for (int i = 1; i < VL; i++) m = t[i] > m ? t[i] : m;
  return m;
}

// exp(x) for a vector: Cody-Waite range reduction and a degree-6 polynomial (Cephes expf),
// about 1 ulp on [-87, 88]; below that it flushes to 0, which is what softmax needs.
static inline V vexp(V x) {
  const V hi = vset1(88.3762626647949f), lo = vset1(-87.0f);
  V xc = vmax(vmin(x, hi), lo);
  V n = vround(vmul(xc, vset1(1.44269504088896341f)));
  V r = vsub(vsub(xc, vmul(n, vset1(0.693359375f))), vmul(n, vset1(-2.12194440e-4f)));
  V p = vset1(1.9875691500e-4f);
  p = vadd(vmul(p, r), vset1(1.3981999507e-3f));
  p = vadd(vmul(p, r), vset1(8.3334519073e-3f));
  p = vadd(vmul(p, r), vset1(4.1665795894e-2f));
  p = vadd(vmul(p, r), vset1(1.6666665459e-1f));
  p = vadd(vmul(p, r), vset1(5.0000001201e-1f));
  p = vadd(vadd(vmul(vmul(p, r), r), r), vset1(1.0f));
  V y = vmul(p, vpow2i(n));
#if defined(__AVX512F__)
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), y);
#elif defined(__AVX2__)
  return _mm256_and_ps(y, _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
#else
  for (int i = 0; i < VL; i++) y.v[i] = x.v[i] >= -87.0f ? y.v[i] : 0.0f;
  return y;
#endif
}

// The same function for one float, computed through the vector path so that scalar tails and
// vector bodies round identically.
static inline float sexp(float x) {
  alignas(64) float t[VL];
  vstore(t, vexp(vset1(x)));
  return t[0];
}

}  // namespace dg
