// The native decoder forward (RMSNorm, RoPE, GQA attention over the paged KV cache, a gated MLP) for
// CPU decoding: one call runs every layer of one ragged batch, on the pool's threads. What a model
// family adds is read from its Layer and Model (config.Family): q/k/v biases, per-head q/k norms,
// norms of the attention's and the MLP's outputs before the residual, GELU, scaled embeddings,
// per-layer sliding windows with their own RoPE frequencies, the attention's scale.
//
// Batch invariance: every phase computes a row's values from that row's inputs only, with a
// reduction order fixed by the model's shapes and the row's own position (gemm.h for the
// products; attention reduces over the row's keys 0..pos in order). The logits of a position are
// therefore bitwise the same however many rows or sequences share the pass.
//
// Shapes: N new rows, B sequences, R logit rows.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "attention.h"
#include "gemm.h"
#include "pool.h"
#include "rows.h"
#include "simd.h"

namespace dg {

struct Layer {
  const float* attn_norm = nullptr;  // [C]
  const float* ffn_norm = nullptr;   // [C]
  Packed *qkv = nullptr, *o = nullptr, *gate_up = nullptr, *down = nullptr;
  const float* qkv_bias = nullptr;   // [(H+2Hkv)*D] added to q, k, v (null: none)
  const float* q_norm = nullptr;     // [D] per-head RMSNorm of q before RoPE (null: none; then k_norm too)
  const float* k_norm = nullptr;     // [D]
  const float* o_norm = nullptr;     // [C] RMSNorm of the attention's output before the residual (null: none)
  const float* down_norm = nullptr;  // [C] RMSNorm of the MLP's output before the residual (null: none)
  int window = 0;                    // a position attends the last `window` keys, itself included (0: all)
  bool local_rope = false;           // RoPE with the model's local frequencies
};

enum Activation { ACT_SILU = 0, ACT_GELU_TANH = 1 };

struct Model {
  int L, C, H, Hkv, D, F;
  float eps;
  std::vector<float> inv_freq;        // [D/2]
  std::vector<float> inv_freq_local;  // [D/2] of the layers with local_rope (empty: none)
  float attn_scale;                   // the attention scores' scale
  float embed_scale = 1.0f;           // embeddings are multiplied by it
  int act = ACT_SILU;
  std::vector<Layer> layers;
  const float* final_norm = nullptr;  // [C]
  Packed* head = nullptr;             // [Vout, C]
  // The embedding's rows: a row-major [V, C] array, else a packed product's rows (a GGUF file's own
  // blocks, or the head's when tied).
  const void* embed = nullptr;  // [V, C] row-major, or null
  int embed_dtype = F32;
  const Packed* embed_packed = nullptr;
  int vocab = 0;  // rows of the embedding: token ids must be below it
};

struct Batch {  // one ragged forward, as the runner describes it
  int N;
  const int64_t* tokens;     // [N]
  const int64_t* positions;  // [N] absolute position of each row (RoPE; it attends keys 0..position)
  const int32_t* row_seq;    // [N] sequence index of each row
  // Draft trees (both null: every row follows the one before it, its KV at its position): where in
  // its sequence's slots each row's KV goes, and the row it follows (-1: the committed context).
  const int64_t* slot_index;  // [N] or null
  const int32_t* parent;      // [N] or null
  const int32_t* tables;     // block tables of the B sequences, concatenated
  const int64_t* table_off;  // [B+1] start of sequence b's table in `tables`
  int block_size;
  float* kc;  // [L, blocks, Hkv, D, block_size]: keys transposed within each block
  float* vc;  // [L, blocks * block_size, Hkv, D]
  int64_t layer_stride;  // slots * Hkv * D (both caches)
  int R;
  const int64_t* logit_rows;  // [R]
  float* logits;              // [R, Vout]
  int64_t* argmax;            // [R] first index of each row's maximum; -1 if the row has a NaN or an inf
  int n_feat;                 // features wanted per feature row (0: none, the plain path)
  const int32_t* feat_layers; // [n_feat] l < L: the residual stream after layer l; L: the final normed hidden
  int RF;                     // feature rows (a prefill wants every row's, the logits of its last only)
  const int64_t* feat_rows;   // [RF]
  float* features;            // [RF, n_feat, C]
};

static inline int64_t slot_index(const Batch& bt, int i) { return bt.slot_index ? bt.slot_index[i] : bt.positions[i]; }

// Flat KV slot of every slot index of each sequence, up to the longest context a row reads or writes.
static std::vector<std::vector<int64_t>> slot_lists(const Batch& bt, int B) {
  std::vector<int64_t> len(B, 0);
  for (int i = 0; i < bt.N; i++)
    len[bt.row_seq[i]] = std::max<int64_t>(len[bt.row_seq[i]], std::max(bt.positions[i], slot_index(bt, i)) + 1);
  std::vector<std::vector<int64_t>> out(B);
  for (int b = 0; b < B; b++) {
    const int32_t* table = bt.tables + bt.table_off[b];
    out[b].resize(size_t(len[b]));
    for (int64_t j = 0; j < len[b]; j++) out[b][j] = int64_t(table[j / bt.block_size]) * bt.block_size + j % bt.block_size;
  }
  return out;
}

// A draft tree's rows: the slots each row reads (its sequence's up to its path's first relocated
// ancestor, then its ancestors' own slots) and from which position they differ (S: a chain row).
struct RowKeys {
  std::vector<int64_t> own;  // [S] the row's slots where shared < S, else empty (it reads its sequence's)
  int64_t shared;
};

static std::vector<RowKeys> tree_keys(const Batch& bt, const std::vector<std::vector<int64_t>>& slots) {
  std::vector<RowKeys> out(size_t(bt.N));
  for (int r = 0; r < bt.N; r++) {
    const int64_t S = bt.positions[r] + 1;
    out[r].shared = S;
    if (bt.parent == nullptr) continue;
    const auto& seq = slots[bt.row_seq[r]];
    for (int a = r; a >= 0; a = bt.parent[a])
      if (slot_index(bt, a) != bt.positions[a]) out[r].shared = bt.positions[a];  // the topmost one wins
    if (out[r].shared == S) continue;
    out[r].own.assign(seq.begin(), seq.begin() + S);
    for (int a = r; a >= 0; a = bt.parent[a]) out[r].own[bt.positions[a]] = seq[slot_index(bt, a)];
  }
  return out;
}

// Consecutive rows of one sequence, up to ATT_ROWS, whose queries attend together, with their key chunks.
struct RowGroup {
  int row0, nrows, seq;
  std::vector<KeyChunk> chunks;
};

static std::vector<RowGroup> row_groups(const Model& m, const Batch& bt) {
  std::vector<RowGroup> groups;
  for (int i = 0; i < bt.N;) {
    int j = i + 1;
    while (j < bt.N && j - i < ATT_ROWS && bt.row_seq[j] == bt.row_seq[i]) j++;
    int64_t smax = 0;
    for (int r = i; r < j; r++) smax = std::max<int64_t>(smax, bt.positions[r] + 1);
    const int32_t* table = bt.tables + bt.table_off[bt.row_seq[i]];
    groups.push_back(RowGroup{i, j - i, bt.row_seq[i],
                              key_chunks(table, smax, bt.block_size, int64_t(m.Hkv) * m.D * bt.block_size)});
    i = j;
  }
  return groups;
}

static void embed_row(const Model& m, int64_t tok, float* out) {
  if (m.embed == nullptr) {
    unpack_row(m.embed_packed != nullptr ? m.embed_packed : m.head, int(tok), out);
  } else {
    for (int c = 0; c < m.C; c++) out[c] = to_f32(m.embed, m.embed_dtype, size_t(tok) * m.C + c);
  }
  if (m.embed_scale != 1.0f)
    for (int c = 0; c < m.C; c++) out[c] = out[c] * m.embed_scale;
}

// q/k/v of one row after the qkv product: its bias added, each q and k head RMS-normed, RoPE applied.
static void prepare_qkv(const Model& m, const Layer& Ly, float* row, const float* cs, const float* sn) {
  const int H = m.H, Hkv = m.Hkv, D = m.D, ldq = (H + 2 * Hkv) * D;
  if (Ly.qkv_bias != nullptr)
    for (int j = 0; j < ldq; j++) row[j] = row[j] + Ly.qkv_bias[j];
  if (Ly.q_norm != nullptr) {
    std::vector<float> tmp(static_cast<size_t>(D));
    for (int h = 0; h < H + Hkv; h++) {
      float* v = row + size_t(h) * D;
      rmsnorm_row(v, h < H ? Ly.q_norm : Ly.k_norm, D, m.eps, tmp.data());
      std::memcpy(v, tmp.data(), sizeof(float) * D);
    }
  }
  rope_rotate(row, H + Hkv, D, cs, sn);
}

// x[i] += rmsnorm(y[i]) (norm non-null) for this thread's rows: a sandwich norm before the residual.
static void add_normed(float* x, const float* y, const float* norm, int C, float eps, int a, int b, float* tmp) {
  for (int i = a; i < b; i++) {
    rmsnorm_row(y + size_t(i) * C, norm, C, eps, tmp);
    float* xi = x + size_t(i) * C;
    for (int c = 0; c < C; c++) xi[c] = xi[c] + tmp[c];
  }
}

// Wall time per phase on thread 0 (each phase ends at a barrier), for `dg_profile`.
enum Phase { P_EMBED, P_NORM, P_QKV, P_ROPE, P_ATTN, P_O, P_GATE_UP, P_ACT, P_DOWN, P_HEAD, P_COUNT };
inline std::atomic<bool> g_prof_on{false};
inline double g_prof[P_COUNT];

struct PhaseClock {
  bool on;
  std::chrono::steady_clock::time_point t;
  explicit PhaseClock(bool on_) : on(on_), t(std::chrono::steady_clock::now()) {}
  void lap(Phase p) {
    if (!on) return;
    auto now = std::chrono::steady_clock::now();
    g_prof[p] += std::chrono::duration<double>(now - t).count();
    t = now;
  }
};

// Copy this thread's feature rows of x ([N, C]) into feature slot j.
static void copy_features(const Batch& bt, int j, const float* x, int C, int tid, int nt) {
  int ra, rb;
  rows_of(bt.RF, tid, nt, &ra, &rb);
  for (int r = ra; r < rb; r++)
    std::memcpy(bt.features + (size_t(r) * bt.n_feat + j) * C, x + size_t(bt.feat_rows[r]) * C, sizeof(float) * C);
}

static void forward(const Model& m, const Batch& bt, int B) {
  const int N = bt.N, C = m.C, D = m.D, F = m.F, H = m.H, half = D / 2;
  const int ldq = (m.H + 2 * m.Hkv) * D;
  int64_t max_ctx = 1;
  for (int i = 0; i < N; i++) max_ctx = std::max<int64_t>(max_ctx, bt.positions[i] + 1);
  std::vector<float> x(size_t(N) * C), h(size_t(N) * C), qkv(size_t(N) * ldq), attn(size_t(N) * H * D);
  std::vector<float> gu(size_t(N) * 2 * F), act(size_t(N) * F), cs(size_t(N) * half), sn(size_t(N) * half);
  const bool local = !m.inv_freq_local.empty();
  std::vector<float> cs_l(local ? size_t(N) * half : 0), sn_l(local ? size_t(N) * half : 0);
  bool sandwich = false;
  for (const Layer& Ly : m.layers) sandwich = sandwich || Ly.o_norm != nullptr || Ly.down_norm != nullptr;
  std::vector<float> y(sandwich ? size_t(N) * C : 0);  // a sublayer's output before its norm
  std::vector<float> hf(size_t(bt.R) * C);
  const auto slots = slot_lists(bt, B);
  const auto row_keys = tree_keys(bt, slots);
  Pool& P = pool();
  std::vector<RowMax> part(size_t(P.size()) * bt.R);
  Barrier team(P.size());
  const std::vector<RowGroup> groups = row_groups(m, bt);
  const int hpg = H / m.Hkv;
  const std::vector<AttnItem> items = attn_items(int(groups.size()), m.Hkv, hpg, P.size());
  const int n_items = int(items.size());
  std::unique_ptr<std::atomic<int>[]> next_item(new std::atomic<int>[m.L]);  // each layer's next item
  for (int li = 0; li < m.L; li++) next_item[li].store(0);
  const int64_t stride = (max_ctx + VL - 1) / VL * VL;
  std::vector<std::vector<float>> scratch(P.size(), std::vector<float>(size_t(ATT_ROWS * hpg) * stride));
  std::vector<std::vector<AttnQuery>> queries(P.size(), std::vector<AttnQuery>(size_t(ATT_ROWS * hpg)));
  auto run_attention = [&](const AttnItem& it, int li, int tid) {
    const RowGroup& gr = groups[it.group];
    const int window = m.layers[li].window;
    AttnQuery* qs = queries[tid].data();
    int nq = 0;
    for (int r = gr.row0; r < gr.row0 + gr.nrows; r++) {
      const RowKeys& rk = row_keys[r];
      const int64_t* rs = rk.own.empty() ? slots[gr.seq].data() : rk.own.data();
      const int64_t S = bt.positions[r] + 1;
      for (int hh = it.h0; hh < it.h0 + it.nh; hh++, nq++)
        qs[nq] = AttnQuery{&qkv[size_t(r) * ldq + size_t(hh) * D], S, scratch[tid].data() + size_t(nq) * stride,
                           &attn[size_t(r) * H * D + size_t(hh) * D], rs, rk.shared,
                           window > 0 ? std::max<int64_t>(0, S - window) : 0};
    }
    const float* kbase = bt.kc + size_t(li) * bt.layer_stride + size_t(it.g) * D * bt.block_size;
    const float* vbase = bt.vc + size_t(li) * bt.layer_stride + size_t(it.g) * D;
    attend_many(qs, nq, kbase, vbase, gr.chunks.data(), int64_t(gr.chunks.size()), m.Hkv, D, bt.block_size,
                m.attn_scale);
  };

  P.run([&](int tid, int nt) {
    Barrier solo(1);  // the pool was busy and this thread runs the whole job
    Barrier& bar = nt == 1 ? solo : team;
    PhaseClock clk(tid == 0 && g_prof_on.load(std::memory_order_relaxed));
    int a, b;
    rows_of(N, tid, nt, &a, &b);
    std::vector<float> tmp(static_cast<size_t>(C));
    for (int i = a; i < b; i++) {
      embed_row(m, bt.tokens[i], &x[size_t(i) * C]);
      rope_angles(bt.positions[i], m.inv_freq.data(), half, &cs[size_t(i) * half], &sn[size_t(i) * half]);
      if (local)
        rope_angles(bt.positions[i], m.inv_freq_local.data(), half, &cs_l[size_t(i) * half], &sn_l[size_t(i) * half]);
    }
    bar.wait();
    clk.lap(P_EMBED);
    for (int li = 0; li < m.L; li++) {
      const Layer& Ly = m.layers[li];
      for (int i = a; i < b; i++) rmsnorm_row(&x[size_t(i) * C], Ly.attn_norm, C, m.eps, &h[size_t(i) * C]);
      bar.wait();
      clk.lap(P_NORM);
      gemm(Ly.qkv, h.data(), N, C, qkv.data(), ldq, false, tid, nt);
      bar.wait();
      clk.lap(P_QKV);
      const bool lr = Ly.local_rope && local;
      for (int i = a; i < b; i++) {  // bias, q/k norms, RoPE on q and k, then k and v into the cache
        float* row = &qkv[size_t(i) * ldq];
        prepare_qkv(m, Ly, row, &(lr ? cs_l : cs)[size_t(i) * half], &(lr ? sn_l : sn)[size_t(i) * half]);
        store_kv(bt.kc + size_t(li) * bt.layer_stride, bt.vc + size_t(li) * bt.layer_stride,
                 slots[bt.row_seq[i]][slot_index(bt, i)], bt.block_size, m.Hkv, D, row + H * D, row + (H + m.Hkv) * D);
      }
      bar.wait();
      clk.lap(P_ROPE);
      for (int it = next_item[li].fetch_add(1); it < n_items; it = next_item[li].fetch_add(1))
        run_attention(items[it], li, tid);
      bar.wait();
      clk.lap(P_ATTN);
      if (Ly.o_norm == nullptr) {
        gemm(Ly.o, attn.data(), N, H * D, x.data(), C, true, tid, nt);
        bar.wait();
      } else {
        gemm(Ly.o, attn.data(), N, H * D, y.data(), C, false, tid, nt);
        bar.wait();
        add_normed(x.data(), y.data(), Ly.o_norm, C, m.eps, a, b, tmp.data());
        bar.wait();
      }
      clk.lap(P_O);
      for (int i = a; i < b; i++) rmsnorm_row(&x[size_t(i) * C], Ly.ffn_norm, C, m.eps, &h[size_t(i) * C]);
      bar.wait();
      clk.lap(P_NORM);
      gemm(Ly.gate_up, h.data(), N, C, gu.data(), 2 * F, false, tid, nt);
      bar.wait();
      clk.lap(P_GATE_UP);
      for (int i = a; i < b; i++)
        (m.act == ACT_GELU_TANH ? gelu_mul : silu_mul)(&gu[size_t(i) * 2 * F], F, &act[size_t(i) * F]);
      bar.wait();
      clk.lap(P_ACT);
      if (Ly.down_norm == nullptr) {
        gemm(Ly.down, act.data(), N, F, x.data(), C, true, tid, nt);
        bar.wait();
      } else {
        gemm(Ly.down, act.data(), N, F, y.data(), C, false, tid, nt);
        bar.wait();
        add_normed(x.data(), y.data(), Ly.down_norm, C, m.eps, a, b, tmp.data());
        bar.wait();
      }
      clk.lap(P_DOWN);
      // x is next written by layer li + 1's o-projection, several barriers from here.
      for (int j = 0; j < bt.n_feat; j++)
        if (bt.feat_layers[j] == li) copy_features(bt, j, x.data(), C, tid, nt);
    }
    int ra, rb;
    rows_of(bt.R, tid, nt, &ra, &rb);
    for (int r = ra; r < rb; r++)
      rmsnorm_row(&x[size_t(bt.logit_rows[r]) * C], m.final_norm, C, m.eps, &hf[size_t(r) * C]);
    for (int j = 0; j < bt.n_feat; j++)  // the final normed hidden of this thread's feature rows (x is final)
      if (bt.feat_layers[j] == m.L) {
        int fa, fb;
        rows_of(bt.RF, tid, nt, &fa, &fb);
        for (int r = fa; r < fb; r++)
          rmsnorm_row(&x[size_t(bt.feat_rows[r]) * C], m.final_norm, C, m.eps,
                      bt.features + (size_t(r) * bt.n_feat + j) * C);
      }
    bar.wait();
    gemm(m.head, hf.data(), bt.R, C, bt.logits, m.head->N, false, tid, nt);
    bar.wait();
    argmax_rows(bt.logits, bt.R, m.head->N, part.data(), bt.argmax, tid, nt, bar);  // every logit row's greedy choice
    clk.lap(P_HEAD);
  });
}

}  // namespace dg
