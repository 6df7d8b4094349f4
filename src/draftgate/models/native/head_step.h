// One step of an EAGLE-style draft head (models/eagle.py) for B sequences in one call on the pool:
// each sequence's new entries (the target's features of the positions committed since its last
// draft, or the head's own output for a chain step), their keys and values into its cache, then
// its last entry's attention, MLP, output norm, logits over the head's vocabulary subset and their
// argmax. The products run once over the rows of all sequences (a draft of a batch streams the
// head's weights once, not once per request).
//
// Why native: in the engine's thread a step in torch spent more time in its ~40 small ops (five
// RMS norms, RoPE, SDPA, concatenations) than in its products (docs/BENCHMARKS.md).
// Same math as EagleHead.extend + logits (float32, the products' weights as packed), so drafts
// change only where float rounding breaks a near-tie; drafts are verified either way. The row
// steps and the attention are the target forward's (rows.h, attention.h): a sequence's head cache
// is laid out as the target's KV cache with one block of `cap` positions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "attention.h"
#include "gemm.h"
#include "pool.h"
#include "rows.h"
#include "simd.h"

namespace dg {

struct Head {
  int C, H, Hkv, D, F, nF;
  float eps;
  std::vector<float> inv_freq;  // [D/2]
  const float* norm_f;          // [nF, C] one norm per fused feature layer
  const float *norm_e, *norm_g, *norm_attn, *norm_mlp, *norm_out;  // [C] each
  Packed *fuse, *inp, *qkv, *o, *gate_up, *down, *out;               // [N, K] as in EagleHead._weights
  const float* embed;  // [vocab, C] the target's embedding, float32
  int64_t vocab;
};

struct HeadIo {  // one call for B sequences, as EagleHead.step_many describes it
  int B;
  const int32_t* m;       // [B] new entries per sequence (>= 1); their rows are concatenated, M in all
  const float* feats;     // [M, nF, C] the target's raw features, or null: g is given
  const float* g;         // [M, C] fused features (a chain step: the head's own output), or null
  const int64_t* tokens;  // [M] the token after each entry's position
  const int64_t* pos0;    // [B] position of each sequence's first new entry
  const int64_t* kc;      // [B] addresses of the head caches' keys, each [Hkv, D, cap_b] float32
  const int64_t* vc;      // [B] and values, each [cap_b, Hkv, D]
  const int64_t* n;       // [B] entries held before the call
  const int64_t* cap;     // [B] capacities (n_b + m_b <= cap_b)
  float* h_out;           // [B, C] each sequence's last entry's output
  float* logits;          // [B, Vs]
  int64_t* argmax;        // [B] first index of the maximum; -1 if a logit is not finite
};

// Attention of sequence s's last entry (query heads it.h0.. of kv head it.g) over its entries 0..S-1.
struct HeadAttention {
  std::vector<std::vector<KeyChunk>> chunks;  // [B] each sequence's keys (one block of cap_b)
  std::vector<int64_t> slots;                 // [S_max] 0, 1, ...: entry j is in slot j
  std::vector<AttnItem> items;
  int64_t stride;                              // score scratch per query
  std::vector<std::vector<float>> scratch;     // per thread
  std::vector<std::vector<AttnQuery>> queries;  // per thread

  HeadAttention(const Head& hd, const HeadIo& io, int64_t S_max, int nthreads) {
    static const int32_t block0 = 0;
    const int hpg = hd.H / hd.Hkv;
    for (int s = 0; s < io.B; s++)
      chunks.push_back(key_chunks(&block0, io.n[s] + io.m[s], io.cap[s], int64_t(hd.Hkv) * hd.D * io.cap[s]));
    slots.resize(size_t(S_max));
    std::iota(slots.begin(), slots.end(), int64_t(0));
    items = attn_items(io.B, hd.Hkv, hpg, nthreads);
    stride = (S_max + VL - 1) / VL * VL;
    scratch.assign(size_t(nthreads), std::vector<float>(size_t(hpg) * stride));
    queries.assign(size_t(nthreads), std::vector<AttnQuery>(size_t(hpg)));
  }

  // q: sequence s's last row of q|k|v; out: attn [B, H, D].
  void run(const Head& hd, const HeadIo& io, const AttnItem& it, const float* q, float* attn, int tid) {
    const int s = it.group, D = hd.D;
    const int64_t S = io.n[s] + io.m[s], cap = io.cap[s];
    AttnQuery* qs = queries[tid].data();
    for (int a = 0; a < it.nh; a++) {
      const int hh = it.h0 + a;
      qs[a] = AttnQuery{q + size_t(hh) * D, S, scratch[tid].data() + size_t(a) * stride,
                        attn + (size_t(s) * hd.H + hh) * D, slots.data(), S};
    }
    const float* kbase = reinterpret_cast<const float*>(io.kc[s]) + size_t(it.g) * D * cap;
    const float* vbase = reinterpret_cast<const float*>(io.vc[s]) + size_t(it.g) * D;
    attend_many(qs, it.nh, kbase, vbase, chunks[s].data(), int64_t(chunks[s].size()), hd.Hkv, D, cap,
                1.0f / std::sqrt(float(D)));
  }
};

static void head_step(const Head& hd, const HeadIo& io) {
  const int C = hd.C, D = hd.D, H = hd.H, Hkv = hd.Hkv, F = hd.F, B = io.B, half = D / 2;
  const int ldq = (H + 2 * Hkv) * D;
  const int64_t Vs = hd.out->N;
  std::vector<int> seq_of, first(B + 1, 0);  // row -> sequence; first[b]: sequence b's first row
  for (int b = 0; b < B; b++) {
    first[b + 1] = first[b] + io.m[b];
    for (int i = 0; i < io.m[b]; i++) seq_of.push_back(b);
  }
  const int M = first[B];
  int64_t S_max = 1;
  for (int b = 0; b < B; b++) S_max = std::max<int64_t>(S_max, io.n[b] + io.m[b]);
  std::vector<float> fcat(io.feats ? size_t(M) * hd.nF * C : 0), gbuf(io.feats ? size_t(M) * C : 0);
  std::vector<float> ecat(size_t(M) * 2 * C), u(size_t(M) * C), hn(size_t(M) * C), qkv(size_t(M) * ldq);
  std::vector<float> attn(size_t(B) * H * D), x(size_t(B) * C), hm(size_t(B) * C), gu(size_t(B) * 2 * F);
  std::vector<float> act(size_t(B) * F), ho(size_t(B) * C);
  Pool& P = pool();
  HeadAttention att(hd, io, S_max, P.size());
  std::vector<RowMax> part(size_t(P.size()) * B);
  Barrier team(P.size());
  P.run([&](int tid, int nt) {
    Barrier solo(1);
    Barrier& bar = nt == 1 ? solo : team;
    int a, b;
    rows_of(M, tid, nt, &a, &b);
    const float* g = io.g;
    if (io.feats != nullptr) {  // g = fuse(concat_j(rms(feature_j) * norm_f[j]))
      for (int i = a; i < b; i++)
        for (int j = 0; j < hd.nF; j++)
          rmsnorm_row(io.feats + (size_t(i) * hd.nF + j) * C, hd.norm_f + size_t(j) * C, C, hd.eps,
                      &fcat[(size_t(i) * hd.nF + j) * C]);
      bar.wait();
      gemm(hd.fuse, fcat.data(), M, hd.nF * C, gbuf.data(), C, false, tid, nt);
      bar.wait();
      g = gbuf.data();
    }
    std::vector<float> e(C);
    for (int i = a; i < b; i++) {  // the layer's input: inp(concat(rms(embed(x_{t+1})), rms(g)))
      for (int c = 0; c < C; c++) e[c] = hd.embed[size_t(io.tokens[i]) * C + c];
      rmsnorm_row(e.data(), hd.norm_e, C, hd.eps, &ecat[size_t(i) * 2 * C]);
      rmsnorm_row(g + size_t(i) * C, hd.norm_g, C, hd.eps, &ecat[size_t(i) * 2 * C + C]);
    }
    bar.wait();
    gemm(hd.inp, ecat.data(), M, 2 * C, u.data(), C, false, tid, nt);
    bar.wait();
    for (int i = a; i < b; i++) rmsnorm_row(&u[size_t(i) * C], hd.norm_attn, C, hd.eps, &hn[size_t(i) * C]);
    bar.wait();
    gemm(hd.qkv, hn.data(), M, C, qkv.data(), ldq, false, tid, nt);
    bar.wait();
    std::vector<float> cs(half), sn(half);
    for (int i = a; i < b; i++) {  // RoPE on q and k, then k and v into the sequence's cache
      const int s = seq_of[i];
      float* row = &qkv[size_t(i) * ldq];
      rope_angles(io.pos0[s] + (i - first[s]), hd.inv_freq.data(), half, cs.data(), sn.data());
      rope_rotate(row, H + Hkv, D, cs.data(), sn.data());
      store_kv(reinterpret_cast<float*>(io.kc[s]), reinterpret_cast<float*>(io.vc[s]), io.n[s] + (i - first[s]),
               io.cap[s], Hkv, D, row + H * D, row + (H + Hkv) * D);
    }
    bar.wait();
    for (int k = tid; k < int(att.items.size()); k += nt) {  // only each sequence's last entry's output is needed
      const AttnItem& it = att.items[k];
      att.run(hd, io, it, &qkv[size_t(first[it.group + 1] - 1) * ldq], attn.data(), tid);
    }
    int sa, sb;
    rows_of(B, tid, nt, &sa, &sb);  // the rest runs on each sequence's last row only
    for (int s = sa; s < sb; s++)
      std::memcpy(&x[size_t(s) * C], &u[size_t(first[s + 1] - 1) * C], sizeof(float) * C);  // the residual
    bar.wait();
    gemm(hd.o, attn.data(), B, H * D, x.data(), C, true, tid, nt);
    bar.wait();
    for (int s = sa; s < sb; s++) {
      rmsnorm_row(&x[size_t(s) * C], hd.norm_mlp, C, hd.eps, &hm[size_t(s) * C]);
      std::memcpy(&ho[size_t(s) * C], &x[size_t(s) * C], sizeof(float) * C);
    }
    bar.wait();
    gemm(hd.gate_up, hm.data(), B, C, gu.data(), 2 * F, false, tid, nt);
    bar.wait();
    for (int s = sa; s < sb; s++) silu_mul(&gu[size_t(s) * 2 * F], F, &act[size_t(s) * F]);
    bar.wait();
    gemm(hd.down, act.data(), B, F, ho.data(), C, true, tid, nt);
    bar.wait();
    for (int s = sa; s < sb; s++) {
      std::memcpy(io.h_out + size_t(s) * C, &ho[size_t(s) * C], sizeof(float) * C);
      rmsnorm_row(&ho[size_t(s) * C], hd.norm_out, C, hd.eps, &hm[size_t(s) * C]);
    }
    bar.wait();
    gemm(hd.out, hm.data(), B, C, io.logits, int(Vs), false, tid, nt);
    bar.wait();
    argmax_rows(io.logits, B, Vs, part.data(), io.argmax, tid, nt, bar);
  });
}

}  // namespace dg
