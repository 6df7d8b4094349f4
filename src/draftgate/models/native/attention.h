// Attention of the native forward over the paged KV cache, for several query vectors at once: the
// query heads that share a kv head (GQA) and the consecutive rows of one sequence (a verify pass's
// K + 1 rows read the same keys). One load of a key or value vector feeds every query of the
// group, and the independent FMA chains of a tile keep both FMA ports busy; one query at a time
// left them waiting on a single chain's latency (docs/BENCHMARKS.md).
//
// Batch invariance: grouping decides which queries share a load, never a rounding. Each score is
// one FMA chain over d (ascending, from 0) of its own query and key, scaled (1/sqrt(D), or the
// model's scale); each query's softmax takes the max and the sum over its own keys lo..S-1 in a fixed
// vector order (lo > 0: a layer whose positions attend the last S - lo keys, a sliding window; the
// keys before lo get weight exactly 0); each output accumulates p_j v_j over j = 0..S-1 in order,
// then divides by the sum. A query's output is
// therefore bitwise the same alone, in any group, and whichever thread runs it.
//
// Draft trees: a query may read, from position `shared` on, keys that are not its sequence's next
// slots (its ancestors in a draft tree, stored wherever the tree put them: AttnQuery::slots). Its
// scores there are computed again from those keys (the same FMA chain over d, into the same
// positions of its score row) and its value sum reads them through its own slots, so a tree node's
// output is bitwise the one plain decoding computes at its position along its path.
//
// The cache layout (store_kv): keys [blocks, Hkv, D, bs], transposed within a block of bs positions
// so a vector of VL consecutive keys loads at once; values [slots, Hkv, D] (slot = block * bs + offset).
// The target's paged cache and a draft head's cache (one block) are both laid out so.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "simd.h"

namespace dg {

// One position's keys k[Hkv, D] and values v[Hkv, D] into flat slot `slot` of a layer's caches.
static inline void store_kv(float* kc, float* vc, int64_t slot, int64_t bs, int Hkv, int D, const float* k,
                            const float* v) {
  float* kt = kc + size_t(slot / bs) * Hkv * D * bs + slot % bs;
  for (int g = 0; g < Hkv; g++)
    for (int d = 0; d < D; d++) kt[(size_t(g) * D + d) * bs] = k[g * D + d];
  std::memcpy(vc + size_t(slot) * Hkv * D, v, sizeof(float) * Hkv * D);
}

// One vector of up to VL consecutive keys of a sequence: they sit in one block's [D][bs] tile.
struct KeyChunk {
  int64_t off;  // first key's column, from the start of a layer's kv head 0 (block * Hkv*D*bs + column)
  int64_t j0;   // position of its first key
  int lanes;    // keys it holds (VL except at a block's or the context's end)
  int nload;    // lanes that may be read: up to the block's end (>= lanes)
};

// Every key chunk of positions 0..S-1 of a sequence whose block table is `table`.
static inline std::vector<KeyChunk> key_chunks(const int32_t* table, int64_t S, int64_t bs, int64_t kblock) {
  std::vector<KeyChunk> out;
  out.reserve(size_t(S / VL + S / bs + 2));
  for (int64_t t0 = 0; t0 < S; t0 += bs) {
    const int64_t nkeys = std::min(bs, S - t0);
    for (int64_t c = 0; c < nkeys; c += VL)
      out.push_back(KeyChunk{int64_t(table[t0 / bs]) * kblock + c, t0 + c, int(std::min<int64_t>(VL, nkeys - c)),
                             int(std::min<int64_t>(VL, bs - c))});
  }
  return out;
}

struct AttnQuery {
  const float* q;        // [D] the rotated query
  int64_t S;             // it reads keys 0..S-1
  float* scores;         // [S rounded up to VL] scratch
  float* out;            // [D]
  const int64_t* slots;  // [S] the cache slot of each key it reads
  int64_t shared;        // keys 0..shared-1 are its sequence's (the group's key chunks); S for a chain
  int64_t lo = 0;        // the first key it attends (a sliding window); the keys before weigh 0
};

#if defined(__AVX512F__)
constexpr int ATT_ACC = 24;  // accumulator registers a tile may hold (32 zmm)
constexpr int ATT_NK_MAX = 8;
#else
constexpr int ATT_ACC = 10;  // 16 ymm
constexpr int ATT_NK_MAX = 4;
#endif
constexpr int ATT_QB = 8;    // queries per score tile
constexpr int ATT_ROWS = 8;  // rows of one sequence whose queries form one attention item
constexpr int att_nk(int nq) { return std::max(1, std::min(ATT_NK_MAX, ATT_ACC / nq)); }  // key vectors per tile

// A unit of attention work: query group `group` (rows of one sequence) and kv head g, query heads h0..h0+nh-1.
struct AttnItem {
  int group, g, h0, nh;
};

// The items of n_groups groups over Hkv kv heads of hpg query heads each: a group and a kv head (all
// of its query heads), or a group and one query head where that would leave fewer than two items a
// thread (a one-token pass then uses every thread).
static inline std::vector<AttnItem> attn_items(int n_groups, int Hkv, int hpg, int nthreads) {
  const bool split = n_groups * Hkv < 2 * nthreads;
  std::vector<AttnItem> items;
  for (int gi = 0; gi < n_groups; gi++)
    for (int g = 0; g < Hkv; g++) {
      if (split)
        for (int hh = 0; hh < hpg; hh++) items.push_back(AttnItem{gi, g, g * hpg + hh, 1});
      else
        items.push_back(AttnItem{gi, g, g * hpg, hpg});
    }
  return items;
}

// scores[a][j] = (q_a . k_j) / sqrt(D) for NQ queries and every chunk, NK chunks a tile. A tile's
// last chunks may be padding (lanes 0: computed from chunk 0, never stored). FULL: every chunk
// may be read as a whole vector (the block size is a multiple of VL).
template <int NQ, bool FULL>
static void score_rows(const AttnQuery* qs, const float* kbase, const KeyChunk* ch, int nch, int D, int64_t bs,
                       V scale) {
  constexpr int NK = att_nk(NQ);
  const float* q[NQ];
  for (int a = 0; a < NQ; a++) q[a] = qs[a].q;
  for (int c0 = 0; c0 < nch; c0 += NK) {
    const float* kt[NK];
    int nload[NK], lanes[NK];
    int64_t j0[NK];
    for (int b = 0; b < NK; b++) {
      const KeyChunk& k = ch[c0 + b < nch ? c0 + b : 0];
      kt[b] = kbase + k.off;
      nload[b] = k.nload;
      lanes[b] = c0 + b < nch ? k.lanes : 0;
      j0[b] = k.j0;
    }
    V acc[NQ][NK];
    for (int a = 0; a < NQ; a++)
      for (int b = 0; b < NK; b++) acc[a][b] = vzero();
    for (int d = 0; d < D; d++) {
      V k[NK];
      for (int b = 0; b < NK; b++) k[b] = FULL ? vload(kt[b] + size_t(d) * bs) : vload_n(kt[b] + size_t(d) * bs, nload[b]);
      for (int a = 0; a < NQ; a++) {
        const V qd = vset1(q[a][d]);
        for (int b = 0; b < NK; b++) acc[a][b] = vfma(qd, k[b], acc[a][b]);
      }
    }
    for (int a = 0; a < NQ; a++)
      for (int b = 0; b < NK; b++) {
        const int64_t valid = std::min<int64_t>(lanes[b], qs[a].S - j0[b]);
        if (valid > 0) vstore_n(qs[a].scores + j0[b], vmul(acc[a][b], scale), int(valid));
      }
  }
}

using ScoreFn = void (*)(const AttnQuery*, const float*, const KeyChunk*, int, int, int64_t, V);

template <bool FULL, int... NQs>
static ScoreFn pick_score(int nq, std::integer_sequence<int, NQs...>) {
  static constexpr ScoreFn table[] = {score_rows<NQs + 1, FULL>...};
  return table[nq - 1];
}

// scores[j] for j in [a.shared, a.S): the keys at a.slots[j] (a draft tree's ancestors), VL at a
// time gathered into a [D][VL] tile so each lane is the same FMA chain over d as a chunk's.
static void rescore_own(const AttnQuery& a, const float* kbase, int64_t kblock, int D, int64_t bs, V scale) {
  static thread_local std::vector<float> tile_buf;
  tile_buf.resize(size_t(D) * VL);
  float* tile = tile_buf.data();
  for (int64_t j0 = a.shared; j0 < a.S; j0 += VL) {
    const int n = int(std::min<int64_t>(VL, a.S - j0));
    for (int i = 0; i < VL; i++) {
      const int64_t slot = a.slots[j0 + std::min(i, n - 1)];
      const float* k = kbase + (slot / bs) * kblock + slot % bs;  // key column in its block's [D][bs] tile
      for (int d = 0; d < D; d++) tile[d * VL + i] = k[size_t(d) * bs];
    }
    V acc = vzero();
    for (int d = 0; d < D; d++) acc = vfma(vset1(a.q[d]), vload(tile + d * VL), acc);
    vstore_n(a.scores + j0, vmul(acc, scale), n);
  }
}

// scores[0..S) <- exp(scores - max) in place; returns their sum (fixed order: vectors, then the tail).
static inline float softmax_unnormalized(float* s, int64_t S) {
  int64_t j = 0;
  V vmx = vset1(-INFINITY);
  for (; j + VL <= S; j += VL) vmx = vmax(vmx, vload(s + j));
  float mx = vmaxval(vmx);
  for (; j < S; j++) mx = s[j] > mx ? s[j] : mx;
  V vs = vzero(), vm = vset1(mx);
  for (j = 0; j + VL <= S; j += VL) {
    V e = vexp(vsub(vload(s + j), vm));
    vstore(s + j, e);
    vs = vadd(vs, e);
  }
  float sum = vsum(vs);
  for (; j < S; j++) {
    s[j] = sexp(s[j] - mx);
    sum += s[j];
  }
  return sum;
}

// out_a += sum_{j in [j0, j1)} p_a[j] v_j for PB queries (out holds the running sums), D = ND * VL.
template <int ND, int PB>
static void pv_rows(const AttnQuery* qs, const float* vbase, const int64_t* slots, size_t row, int64_t j0,
                    int64_t j1) {  // slots: of keys j0..j1-1, read by every query of the tile
  V acc[PB][ND];
  for (int a = 0; a < PB; a++)
    for (int c = 0; c < ND; c++) acc[a][c] = vload(qs[a].out + c * VL);
  for (int64_t j = j0; j < j1; j++) {
    const float* v = vbase + size_t(slots[j]) * row;
    for (int a = 0; a < PB; a++) {
      const V p = vset1(qs[a].scores[j]);
      for (int c = 0; c < ND; c++) acc[a][c] = vfma(p, vload(v + c * VL), acc[a][c]);
    }
  }
  for (int a = 0; a < PB; a++)
    for (int c = 0; c < ND; c++) vstore(qs[a].out + c * VL, acc[a][c]);
}

constexpr int att_pb(int nd) { return std::max(1, std::min(8, ATT_ACC / nd)); }  // queries per value tile

// The value pass for nq queries of head width ND vectors: tiles of att_pb(ND) queries share the
// values of the keys they all read (their sequence's, up to the smallest `shared`), then each query
// finishes its own remaining keys alone, through its own slots.
template <int ND>
static void pv_all(AttnQuery* qs, int nq, const float* vbase, size_t row) {
  constexpr int PB = att_pb(ND);
  int a = 0;
  for (; a + PB <= nq; a += PB) {
    int64_t smin = qs[a].shared;
    for (int i = 1; i < PB; i++) smin = std::min(smin, qs[a + i].shared);
    pv_rows<ND, PB>(qs + a, vbase, qs[a].slots, row, 0, smin);
    for (int i = 0; i < PB; i++) pv_rows<ND, 1>(qs + a + i, vbase, qs[a + i].slots, row, smin, qs[a + i].S);
  }
  for (; a < nq; a++) pv_rows<ND, 1>(qs + a, vbase, qs[a].slots, row, 0, qs[a].S);
}

// Attention of nq queries of one sequence and kv head g: kbase/vbase point at kv head g of this
// layer's caches, ch lists the sequence's key chunks (up to the largest S).
static void attend_many(AttnQuery* qs, int nq, const float* kbase, const float* vbase, const KeyChunk* ch,
                        int64_t nch_all, int Hkv, int D, int64_t bs, float score_scale) {
  const V scale = vset1(score_scale);
  const bool full = bs % VL == 0;
  for (int a = 0; a < nq; a += ATT_QB) {
    const int nb = std::min(ATT_QB, nq - a);
    int64_t smax = 0;
    for (int i = 0; i < nb; i++) smax = std::max(smax, qs[a + i].S);
    int nch = 0;  // chunks this tile's queries read
    while (nch < nch_all && ch[nch].j0 < smax) nch++;
    auto fn = full ? pick_score<true>(nb, std::make_integer_sequence<int, ATT_QB>{})
                   : pick_score<false>(nb, std::make_integer_sequence<int, ATT_QB>{});
    fn(qs + a, kbase, ch, nch, D, bs, scale);
  }
  const int64_t kblock = int64_t(Hkv) * D * bs;
  for (int a = 0; a < nq; a++)
    if (qs[a].shared < qs[a].S) rescore_own(qs[a], kbase, kblock, D, bs, scale);
  std::vector<float> inv(static_cast<size_t>(nq));
  for (int a = 0; a < nq; a++) {
    inv[a] = 1.0f / softmax_unnormalized(qs[a].scores + qs[a].lo, qs[a].S - qs[a].lo);
    std::fill(qs[a].scores, qs[a].scores + qs[a].lo, 0.0f);  // outside the window: p = 0, so p v adds nothing
    for (int c = 0; c < D; c++) qs[a].out[c] = 0.0f;
  }
  const size_t row = size_t(Hkv) * D;
  switch (D % VL == 0 ? D / VL : 0) {
    case 2: pv_all<2>(qs, nq, vbase, row); break;
    case 4: pv_all<4>(qs, nq, vbase, row); break;
    case 8: pv_all<8>(qs, nq, vbase, row); break;
    case 16: pv_all<16>(qs, nq, vbase, row); break;
    default:  // any other head width: one query and one float at a time, the same order
      for (int a = 0; a < nq; a++)
        for (int64_t j = 0; j < qs[a].S; j++) {
          const float* v = vbase + size_t(qs[a].slots[j]) * row;
          for (int c = 0; c < D; c++) qs[a].out[c] = qs[a].out[c] + qs[a].scores[j] * v[c];
        }
  }
  for (int a = 0; a < nq; a++) {
    int c = 0;
    const V vi = vset1(inv[a]);
    for (; c + VL <= D; c += VL) vstore(qs[a].out + c, vmul(vload(qs[a].out + c), vi));
    for (; c < D; c++) qs[a].out[c] = qs[a].out[c] * inv[a];
  }
}

}  // namespace dg
