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

struct HeadIo {  // one call for B sequences, as EagleHead.step_many describes it
  int B;
  const int32_t* m;       // [B] new entries per sequence (>= 1); their rows are concatenated, M in all
  const float* feats;     // [M, nF, C] the target's raw features, or null: g is given
  const float* g;         // [M, C] fused features (a chain step: the head's own output), or null
  const int64_t* tokens;  // [M] the token after each entry's position
  const int64_t* pos0;    // [B] position of each sequence's first new entry
  const int64_t* kc;      // [B] addresses of the head caches' keys, each [Hkv, cap_b, D] float32
  const int64_t* vc;      // [B] and values
  const int64_t* n;       // [B] entries held before the call
  const int64_t* cap;     // [B] capacities (n_b + m_b <= cap_b)
  float* h_out;           // [B, C] each sequence's last entry's output
  float* logits;          // [B, Vs]
  int64_t* argmax;        // [B] first index of the maximum; -1 if a logit is not finite
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
  std::vector<std::vector<float>> scratch(P.size(), std::vector<float>(size_t(S_max)));
  std::vector<RowMax> part(size_t(P.size()) * B);
  Barrier team(P.size());
  P.run([&](int tid, int nt) {
    Barrier solo(1);
    Barrier& Bw = nt == 1 ? solo : team;
    int a, b;
    rows_of(M, tid, nt, &a, &b);
    const float* g = io.g;
    if (io.feats != nullptr) {  // g = fuse(concat_j(rms(feature_j) * norm_f[j]))
      for (int i = a; i < b; i++)
        for (int j = 0; j < hd.nF; j++)
          rmsnorm_row(io.feats + (size_t(i) * hd.nF + j) * C, hd.norm_f + size_t(j) * C, C, hd.eps,
                      &fcat[(size_t(i) * hd.nF + j) * C]);
      Bw.wait();
      gemm(hd.fuse, fcat.data(), M, hd.nF * C, gbuf.data(), C, false, tid, nt);
      Bw.wait();
      g = gbuf.data();
    }
    std::vector<float> e(C);
    for (int i = a; i < b; i++) {  // the layer's input: inp(concat(rms(embed(x_{t+1})), rms(g)))
      for (int c = 0; c < C; c++) e[c] = hd.embed[size_t(io.tokens[i]) * C + c];
      rmsnorm_row(e.data(), hd.norm_e, C, hd.eps, &ecat[size_t(i) * 2 * C]);
      rmsnorm_row(g + size_t(i) * C, hd.norm_g, C, hd.eps, &ecat[size_t(i) * 2 * C + C]);
    }
    Bw.wait();
    gemm(hd.inp, ecat.data(), M, 2 * C, u.data(), C, false, tid, nt);
    Bw.wait();
    for (int i = a; i < b; i++) rmsnorm_row(&u[size_t(i) * C], hd.norm_attn, C, hd.eps, &hn[size_t(i) * C]);
    Bw.wait();
    gemm(hd.qkv, hn.data(), M, C, qkv.data(), ldq, false, tid, nt);
    Bw.wait();
    for (int i = a; i < b; i++) {  // RoPE on q and k (rotate-half), k and v into the sequence's cache
      const int s = seq_of[i];
      const int64_t slot = io.n[s] + (i - first[s]);
      float* row = &qkv[size_t(i) * ldq];
      const float pos = float(io.pos0[s] + (i - first[s]));
      for (int c = 0; c < half; c++) {
        const float ang = pos * hd.inv_freq[c], cs = std::cos(ang), sn = std::sin(ang);
        for (int hh = 0; hh < H + Hkv; hh++) {
          float* v = row + hh * D;
          const float x1 = v[c], x2 = v[c + half];
          v[c] = x1 * cs - x2 * sn;
          v[c + half] = x2 * cs + x1 * sn;
        }
      }
      float* kc = reinterpret_cast<float*>(io.kc[s]);
      float* vc = reinterpret_cast<float*>(io.vc[s]);
      for (int gg = 0; gg < Hkv; gg++) {
        std::memcpy(kc + (size_t(gg) * io.cap[s] + slot) * D, row + (H + gg) * D, sizeof(float) * D);
        std::memcpy(vc + (size_t(gg) * io.cap[s] + slot) * D, row + (H + Hkv + gg) * D, sizeof(float) * D);
      }
    }
    Bw.wait();
    const float scale = 1.0f / std::sqrt(float(D));
    for (int item = tid; item < B * H; item += nt) {  // only each sequence's last entry's output is needed
      const int s = item / H, hh = item % H, gg = hh / (H / Hkv);
      const int64_t S = io.n[s] + io.m[s];
      const float* q = &qkv[size_t(first[s + 1] - 1) * ldq + size_t(hh) * D];
      const float* kb = reinterpret_cast<const float*>(io.kc[s]) + size_t(gg) * io.cap[s] * D;
      const float* vb = reinterpret_cast<const float*>(io.vc[s]) + size_t(gg) * io.cap[s] * D;
      float* sc = scratch[tid].data();
      float mx = -INFINITY;
      for (int64_t j = 0; j < S; j++) {
        V acc = vzero();
        int c = 0;
        for (; c + VL <= D; c += VL) acc = vfma(vload(q + c), vload(kb + j * D + c), acc);
        float sv = vsum(acc);
        for (; c < D; c++) sv += q[c] * kb[j * D + c];
        sc[j] = sv * scale;
        mx = std::max(mx, sc[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < S; j++) {
        sc[j] = sexp(sc[j] - mx);
        sum += sc[j];
      }
      float* out = &attn[(size_t(s) * H + hh) * D];
      for (int c = 0; c < D; c++) out[c] = 0.0f;
      for (int64_t j = 0; j < S; j++)
        for (int c = 0; c < D; c++) out[c] += sc[j] * vb[j * D + c];
      const float inv = 1.0f / sum;
      for (int c = 0; c < D; c++) out[c] *= inv;
    }
    int sa, sb;
    rows_of(B, tid, nt, &sa, &sb);  // the rest runs on each sequence's last row only
    for (int s = sa; s < sb; s++)
      std::memcpy(&x[size_t(s) * C], &u[size_t(first[s + 1] - 1) * C], sizeof(float) * C);  // the residual
    Bw.wait();
    gemm(hd.o, attn.data(), B, H * D, x.data(), C, true, tid, nt);
    Bw.wait();
    for (int s = sa; s < sb; s++) {
      rmsnorm_row(&x[size_t(s) * C], hd.norm_mlp, C, hd.eps, &hm[size_t(s) * C]);
      std::memcpy(&ho[size_t(s) * C], &x[size_t(s) * C], sizeof(float) * C);
    }
    Bw.wait();
    gemm(hd.gate_up, hm.data(), B, C, gu.data(), 2 * F, false, tid, nt);
    Bw.wait();
    for (int s = sa; s < sb; s++) silu_mul(&gu[size_t(s) * 2 * F], F, &act[size_t(s) * F]);
    Bw.wait();
    gemm(hd.down, act.data(), B, F, ho.data(), C, true, tid, nt);
    Bw.wait();
    for (int s = sa; s < sb; s++) {
      std::memcpy(io.h_out + size_t(s) * C, &ho[size_t(s) * C], sizeof(float) * C);
      rmsnorm_row(&ho[size_t(s) * C], hd.norm_out, C, hd.eps, &hm[size_t(s) * C]);
    }
    Bw.wait();
    gemm(hd.out, hm.data(), B, C, io.logits, int(Vs), false, tid, nt);
    Bw.wait();
    for (int s = 0; s < B; s++)
      part[size_t(tid) * B + s] = row_max(io.logits + size_t(s) * Vs, Vs * tid / nt, Vs * (tid + 1) / nt);
    Bw.wait();
    if (tid == 0) {
      for (int s = 0; s < B; s++) {
        RowMax best = part[s];
        for (int t = 1; t < nt; t++) {
          const RowMax& o = part[size_t(t) * B + s];
          best.finite = best.finite && o.finite;
          if (o.value > best.value) best = RowMax{o.value, o.index, best.finite};
        }
        io.argmax[s] = best.finite && best.index >= 0 ? best.index : -1;
      }
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

int dg_head_step(void* hp, int B, const int32_t* m, const float* feats, const float* g, const int64_t* tokens,
                 const int64_t* pos0, const int64_t* kc, const int64_t* vc, const int64_t* n, const int64_t* cap,
                 float* h_out, float* logits, int64_t* argmax) {
  const dg::Head& hd = *static_cast<dg::Head*>(hp);
  return guarded([&] {
    if (B < 1) throw std::invalid_argument("head step: need at least one sequence");
    if ((feats == nullptr) == (g == nullptr)) throw std::invalid_argument("head step: give feats or g, not both");
    int64_t M = 0;
    for (int b = 0; b < B; b++) {
      if (m[b] < 1 || n[b] < 0 || n[b] + m[b] > cap[b])
        throw std::invalid_argument("head step: need 1 <= m and n + m <= capacity for every sequence");
      M += m[b];
    }
    for (int64_t i = 0; i < M; i++)
      if (tokens[i] < 0 || tokens[i] >= hd.vocab)
        throw std::out_of_range("token id " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                                std::to_string(hd.vocab) + ")");
    dg::head_step(hd, dg::HeadIo{B, m, feats, g, tokens, pos0, kc, vc, n, cap, h_out, logits, argmax});
  });
}

}  // extern "C"
