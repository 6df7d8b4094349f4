// One step of an EAGLE-style draft head (models/eagle.py) in one call on the pool: m new entries
// (the target's features of the positions committed since the last draft, or the head's own
// output for a chain step), their keys and values into the head's cache, then the last entry's
// attention, MLP, output norm, logits over the head's vocabulary subset and its argmax.
//
// Why native: in the engine's thread a step in torch spent more time in its ~40 small ops (five
// RMS norms, RoPE, SDPA, concatenations) than in its products (docs/BENCHMARKS.md, issue 13).
// Same math as EagleHead.extend + logits (float32, the products' weights as packed), so drafts
// change only where float rounding breaks a near-tie; drafts are verified either way.
//
// Included by kernels.cpp after its helpers (rmsnorm_row, silu_mul, rows_of, pool, guarded).
#pragma once

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

struct HeadIo {  // one call, as EagleHead.step describes it
  int m;
  const float* feats;     // [m, nF, C] the target's raw features, or null: g is given
  const float* g;         // [m, C] fused features (a chain step: the head's own output), or null
  const int64_t* tokens;  // [m] the token after each entry's position
  int64_t pos0;           // position of the first new entry
  float* kc;              // [Hkv, cap, D] the head cache's keys
  float* vc;              // [Hkv, cap, D] and values
  int64_t n, cap;         // entries held before the call, capacity (n + m <= cap)
  float* h_out;           // [C] the last entry's output
  float* logits;          // [Vs]
  int64_t* argmax;        // [1] first index of the maximum; -1 if a logit is not finite
};

static void head_step(const Head& hd, const HeadIo& io) {
  const int C = hd.C, D = hd.D, H = hd.H, Hkv = hd.Hkv, F = hd.F, m = io.m, half = D / 2;
  const int ldq = (H + 2 * Hkv) * D;
  const int64_t S = io.n + m;  // entries the last one attends to
  const int64_t Vs = hd.out->N;
  std::vector<float> fcat(io.feats ? size_t(m) * hd.nF * C : 0), gbuf(io.feats ? size_t(m) * C : 0);
  std::vector<float> ecat(size_t(m) * 2 * C), u(size_t(m) * C), hn(size_t(m) * C), qkv(size_t(m) * ldq);
  std::vector<float> attn(size_t(H) * D), x(C), hm(C), gu(2 * size_t(F)), act(F), ho(C);
  Pool& P = pool();
  std::vector<std::vector<float>> scratch(P.size(), std::vector<float>(size_t(S)));
  std::vector<RowMax> part(P.size());
  Barrier team(P.size());
  P.run([&](int tid, int nt) {
    Barrier solo(1);
    Barrier& B = nt == 1 ? solo : team;
    int a, b;
    rows_of(m, tid, nt, &a, &b);
    const float* g = io.g;
    if (io.feats != nullptr) {  // g = fuse(concat_j(rms(feature_j) * norm_f[j]))
      for (int i = a; i < b; i++)
        for (int j = 0; j < hd.nF; j++)
          rmsnorm_row(io.feats + (size_t(i) * hd.nF + j) * C, hd.norm_f + size_t(j) * C, C, hd.eps,
                      &fcat[(size_t(i) * hd.nF + j) * C]);
      B.wait();
      gemm(hd.fuse, fcat.data(), m, hd.nF * C, gbuf.data(), C, false, tid, nt);
      B.wait();
      g = gbuf.data();
    }
    std::vector<float> e(C);
    for (int i = a; i < b; i++) {  // the layer's input: inp(concat(rms(embed(x_{t+1})), rms(g)))
      for (int c = 0; c < C; c++) e[c] = hd.embed[size_t(io.tokens[i]) * C + c];
      rmsnorm_row(e.data(), hd.norm_e, C, hd.eps, &ecat[size_t(i) * 2 * C]);
      rmsnorm_row(g + size_t(i) * C, hd.norm_g, C, hd.eps, &ecat[size_t(i) * 2 * C + C]);
    }
    B.wait();
    gemm(hd.inp, ecat.data(), m, 2 * C, u.data(), C, false, tid, nt);
    B.wait();
    for (int i = a; i < b; i++) rmsnorm_row(&u[size_t(i) * C], hd.norm_attn, C, hd.eps, &hn[size_t(i) * C]);
    B.wait();
    gemm(hd.qkv, hn.data(), m, C, qkv.data(), ldq, false, tid, nt);
    B.wait();
    for (int i = a; i < b; i++) {  // RoPE on q and k (rotate-half), k and v into the cache
      float* row = &qkv[size_t(i) * ldq];
      const float pos = float(io.pos0 + i);
      for (int c = 0; c < half; c++) {
        const float ang = pos * hd.inv_freq[c], cs = std::cos(ang), sn = std::sin(ang);
        for (int hh = 0; hh < H + Hkv; hh++) {
          float* v = row + hh * D;
          const float x1 = v[c], x2 = v[c + half];
          v[c] = x1 * cs - x2 * sn;
          v[c + half] = x2 * cs + x1 * sn;
        }
      }
      for (int gg = 0; gg < Hkv; gg++) {
        std::memcpy(io.kc + (size_t(gg) * io.cap + io.n + i) * D, row + (H + gg) * D, sizeof(float) * D);
        std::memcpy(io.vc + (size_t(gg) * io.cap + io.n + i) * D, row + (H + Hkv + gg) * D, sizeof(float) * D);
      }
    }
    B.wait();
    const float* q_last = &qkv[size_t(m - 1) * ldq];
    const float scale = 1.0f / std::sqrt(float(D));
    for (int hh = tid; hh < H; hh += nt) {  // only the last entry's output is needed
      const int gg = hh / (H / Hkv);
      const float* q = q_last + hh * D;
      const float* kb = io.kc + size_t(gg) * io.cap * D;
      const float* vb = io.vc + size_t(gg) * io.cap * D;
      float* sc = scratch[tid].data();
      float mx = -INFINITY;
      for (int64_t j = 0; j < S; j++) {
        V acc = vzero();
        int c = 0;
        for (; c + VL <= D; c += VL) acc = vfma(vload(q + c), vload(kb + j * D + c), acc);
        float s = vsum(acc);
        for (; c < D; c++) s += q[c] * kb[j * D + c];
        sc[j] = s * scale;
        mx = std::max(mx, sc[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < S; j++) {
        sc[j] = sexp(sc[j] - mx);
        sum += sc[j];
      }
      float* out = &attn[size_t(hh) * D];
      for (int c = 0; c < D; c++) out[c] = 0.0f;
      for (int64_t j = 0; j < S; j++)
        for (int c = 0; c < D; c++) out[c] += sc[j] * vb[j * D + c];
      const float inv = 1.0f / sum;
      for (int c = 0; c < D; c++) out[c] *= inv;
    }
    if (tid == 0) std::memcpy(x.data(), &u[size_t(m - 1) * C], sizeof(float) * C);  // the residual
    B.wait();
    gemm(hd.o, attn.data(), 1, H * D, x.data(), C, true, tid, nt);
    B.wait();
    if (tid == 0) {
      rmsnorm_row(x.data(), hd.norm_mlp, C, hd.eps, hm.data());
      std::memcpy(ho.data(), x.data(), sizeof(float) * C);
    }
    B.wait();
    gemm(hd.gate_up, hm.data(), 1, C, gu.data(), 2 * F, false, tid, nt);
    B.wait();
    if (tid == 0) silu_mul(gu.data(), F, act.data());
    B.wait();
    gemm(hd.down, act.data(), 1, F, ho.data(), C, true, tid, nt);
    B.wait();
    if (tid == 0) {
      std::memcpy(io.h_out, ho.data(), sizeof(float) * C);
      rmsnorm_row(ho.data(), hd.norm_out, C, hd.eps, hm.data());
    }
    B.wait();
    gemm(hd.out, hm.data(), 1, C, io.logits, int(Vs), false, tid, nt);
    B.wait();
    part[tid] = row_max(io.logits, Vs * tid / nt, Vs * (tid + 1) / nt);
    B.wait();
    if (tid == 0) {
      RowMax best = part[0];
      for (int t = 1; t < nt; t++) {
        best.finite = best.finite && part[t].finite;
        if (part[t].value > best.value) best = RowMax{part[t].value, part[t].index, best.finite};
      }
      *io.argmax = best.finite && best.index >= 0 ? best.index : -1;
    }
  });
}

}  // namespace dg

extern "C" {

void* dg_head_new(int C, int H, int Hkv, int D, int F, int nF, float eps, const float* inv_freq, const float* norm_f,
                  const float* norm_e, const float* norm_g, const float* norm_attn, const float* norm_mlp,
                  const float* norm_out, void* fuse, void* inp, void* qkv, void* o, void* gate_up, void* down,
                  void* out, const float* embed, int64_t vocab) {
  auto pk = [](void* p) { return static_cast<dg::Packed*>(p); };
  return new dg::Head{C, H, Hkv, D, F, nF, eps, std::vector<float>(inv_freq, inv_freq + D / 2), norm_f, norm_e,
                      norm_g, norm_attn, norm_mlp, norm_out, pk(fuse), pk(inp), pk(qkv), pk(o), pk(gate_up),
                      pk(down), pk(out), embed, vocab};
}

void dg_head_free(void* hp) { delete static_cast<dg::Head*>(hp); }

int dg_head_step(void* hp, int m, const float* feats, const float* g, const int64_t* tokens, int64_t pos0, float* kc,
                 float* vc, int64_t n, int64_t cap, float* h_out, float* logits, int64_t* argmax) {
  const dg::Head& hd = *static_cast<dg::Head*>(hp);
  return guarded([&] {
    if (m < 1 || n < 0 || n + m > cap) throw std::invalid_argument("head step: need 1 <= m and n + m <= capacity");
    if ((feats == nullptr) == (g == nullptr)) throw std::invalid_argument("head step: give feats or g, not both");
    for (int i = 0; i < m; i++)
      if (tokens[i] < 0 || tokens[i] >= hd.vocab)
        throw std::out_of_range("token id " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                                std::to_string(hd.vocab) + ")");
    dg::head_step(hd, dg::HeadIo{m, feats, g, tokens, pos0, kc, vc, n, cap, h_out, logits, argmax});
  });
}

}  // extern "C"
