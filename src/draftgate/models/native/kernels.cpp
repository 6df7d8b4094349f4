// The native Llama forward (RMSNorm, RoPE, GQA attention over the paged KV cache, SwiGLU) for
// CPU decoding: one call runs every layer of one ragged batch, on the pool's threads.
//
// Batch invariance: every phase computes a row's values from that row's inputs only, with a
// reduction order fixed by the model's shapes and the row's own position (gemm.h for the
// products; attention reduces over the row's keys 0..pos in order). The logits of a position are
// therefore bitwise the same however many rows or sequences share the pass.
//
// C ABI (ctypes): handles are opaque pointers; arrays are raw pointers to contiguous tensors
// owned by the caller. Shapes: N new rows, B sequences, R logit rows.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention.h"
#include "gemm.h"
#include "pool.h"
#include "simd.h"

namespace dg {

struct Layer {
  const float* attn_norm = nullptr;  // [C]
  const float* ffn_norm = nullptr;   // [C]
  Packed *qkv = nullptr, *o = nullptr, *gate_up = nullptr, *down = nullptr;
};

struct Model {
  int L, C, H, Hkv, D, F;
  float eps;
  std::vector<float> inv_freq;  // [D/2]
  std::vector<Layer> layers;
  const float* final_norm = nullptr;  // [C]
  Packed* head = nullptr;             // [Vout, C]
  const void* embed = nullptr;        // [V, C] row-major, or null: rows of the packed head (tied)
  int embed_dtype = F32;
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

// This thread's (max, first index) over columns [c0, c1) of a row, and whether it saw a non-finite value.
struct RowMax {
  float value = -INFINITY;
  int64_t index = -1;
  bool finite = true;
};

static RowMax row_max(const float* row, int64_t c0, int64_t c1) {
  RowMax r;
  for (int64_t c = c0; c < c1; c++) {
    float v = row[c];
    if (!std::isfinite(v)) r.finite = false;
    if (v > r.value) {  // strict: the first maximum wins, as torch.argmax
      r.value = v;
      r.index = c;
    }
  }
  return r;
}

static std::mutex g_pool_mu;
static std::unique_ptr<Pool> g_pool;

static Pool& pool() {
  std::lock_guard<std::mutex> g(g_pool_mu);
  if (!g_pool) g_pool.reset(new Pool(int(std::thread::hardware_concurrency()), 200));
  return *g_pool;
}

static inline void rows_of(int n, int tid, int nt, int* a, int* b) {
  *a = int(int64_t(n) * tid / nt);
  *b = int(int64_t(n) * (tid + 1) / nt);
}

static void rmsnorm_row(const float* x, const float* w, int C, float eps, float* out) {
  int c = 0;
  V acc = vzero();
  for (; c + VL <= C; c += VL) {
    V v = vload(x + c);
    acc = vfma(v, v, acc);
  }
  float ss = vsum(acc);
  for (; c < C; c++) ss += x[c] * x[c];
  float inv = 1.0f / std::sqrt(ss / float(C) + eps);
  for (c = 0; c + VL <= C; c += VL) vstore(out + c, vmul(vload(w + c), vmul(vload(x + c), vset1(inv))));
  for (; c < C; c++) out[c] = w[c] * (x[c] * inv);
}

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

// Rotate q and k of row i in place and write its k, v into the cache.
static void rope_and_store(const Model& m, const Batch& bt, int li, float* qkv_row, int64_t slot, const float* cs,
                           const float* sn) {
  int D = m.D, half = D / 2;
  for (int h = 0; h < m.H + m.Hkv; h++) {
    float* v = qkv_row + h * D;
    for (int c = 0; c < half; c++) {
      float x1 = v[c], x2 = v[c + half];
      v[c] = x1 * cs[c] - x2 * sn[c];
      v[c + half] = x2 * cs[c] + x1 * sn[c];
    }
  }
  const int64_t bs = bt.block_size, block = slot / bs, off = slot % bs;
  float* kt = bt.kc + size_t(li) * bt.layer_stride + size_t(block) * m.Hkv * D * bs + off;
  const float* k = qkv_row + m.H * D;
  for (int g = 0; g < m.Hkv; g++)
    for (int d = 0; d < D; d++) kt[(size_t(g) * D + d) * bs] = k[g * D + d];
  std::memcpy(bt.vc + size_t(li) * bt.layer_stride + size_t(slot) * m.Hkv * D, qkv_row + (m.H + m.Hkv) * D,
              sizeof(float) * m.Hkv * D);
}

static void silu_mul(const float* gu, int F, float* out) {  // gu = [gate | up], out = silu(gate) * up
  int c = 0;
  V one = vset1(1.0f), zero = vzero();
  for (; c + VL <= F; c += VL) {
    V g = vload(gu + c);
    V s = vdiv(g, vadd(one, vexp(vsub(zero, g))));
    vstore(out + c, vmul(s, vload(gu + F + c)));
  }
  for (; c < F; c++) {
    float g = gu[c];
    out[c] = (g / (1.0f + sexp(-g))) * gu[F + c];
  }
}

static void embed_row(const Model& m, int64_t tok, float* out) {
  if (m.embed == nullptr) {
    unpack_row(m.head, int(tok), out);
  } else {
    for (int c = 0; c < m.C; c++) out[c] = to_f32(m.embed, m.embed_dtype, size_t(tok) * m.C + c);
  }
}

// Wall time per phase on thread 0 (each phase ends at a barrier), for `dg_profile`.
enum Phase { P_EMBED, P_NORM, P_QKV, P_ROPE, P_ATTN, P_O, P_GATE_UP, P_ACT, P_DOWN, P_HEAD, P_COUNT };
static std::atomic<bool> g_prof_on{false};
static double g_prof[P_COUNT];

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
  std::vector<float> hf(size_t(bt.R) * C);
  const auto slots = slot_lists(bt, B);
  const auto row_keys = tree_keys(bt, slots);
  Pool& P = pool();
  std::vector<RowMax> part(size_t(P.size()) * bt.R);
  Barrier team(P.size());
  // Attention work: consecutive rows of one sequence in groups of up to ATT_ROWS, each with its key
  // chunks. An item is a group and a kv head (all of its query heads), or a group and one query
  // head where that would leave fewer than two items a thread (a one-token pass uses every thread).
  struct RowGroup {
    int row0, nrows, seq;
    std::vector<KeyChunk> chunks;
  };
  struct AttnItem {
    int group, g, h0, nh;
  };
  std::vector<RowGroup> groups;
  for (int i = 0; i < N;) {
    int j = i + 1;
    while (j < N && j - i < ATT_ROWS && bt.row_seq[j] == bt.row_seq[i]) j++;
    int64_t smax = 0;
    for (int r = i; r < j; r++) smax = std::max<int64_t>(smax, bt.positions[r] + 1);
    const int32_t* table = bt.tables + bt.table_off[bt.row_seq[i]];
    groups.push_back(RowGroup{i, j - i, bt.row_seq[i], key_chunks(table, smax, bt.block_size, int64_t(m.Hkv) * D * bt.block_size)});
    i = j;
  }
  const int hpg = H / m.Hkv;
  const bool split = int(groups.size()) * m.Hkv < 2 * P.size();
  std::vector<AttnItem> items;
  for (int gi = 0; gi < int(groups.size()); gi++)
    for (int g = 0; g < m.Hkv; g++) {
      if (split)
        for (int hh = 0; hh < hpg; hh++) items.push_back(AttnItem{gi, g, g * hpg + hh, 1});
      else
        items.push_back(AttnItem{gi, g, g * hpg, hpg});
    }
  const int n_items = int(items.size());
  std::unique_ptr<std::atomic<int>[]> next_item(new std::atomic<int>[m.L]);  // each layer's next item
  for (int li = 0; li < m.L; li++) next_item[li].store(0);
  const int64_t stride = (max_ctx + VL - 1) / VL * VL;
  std::vector<std::vector<float>> scratch(P.size(), std::vector<float>(size_t(ATT_ROWS * hpg) * stride));
  std::vector<std::vector<AttnQuery>> queries(P.size(), std::vector<AttnQuery>(size_t(ATT_ROWS * hpg)));
  auto run_attention = [&](const AttnItem& it, int li, int tid) {
    const RowGroup& gr = groups[it.group];
    AttnQuery* qs = queries[tid].data();
    int nq = 0;
    for (int r = gr.row0; r < gr.row0 + gr.nrows; r++) {
      const RowKeys& rk = row_keys[r];
      const int64_t* rs = rk.own.empty() ? slots[gr.seq].data() : rk.own.data();
      for (int hh = it.h0; hh < it.h0 + it.nh; hh++, nq++)
        qs[nq] = AttnQuery{&qkv[size_t(r) * ldq + size_t(hh) * D], bt.positions[r] + 1,
                           scratch[tid].data() + size_t(nq) * stride, &attn[size_t(r) * H * D + size_t(hh) * D],
                           rs, rk.shared};
    }
    const float* kbase = bt.kc + size_t(li) * bt.layer_stride + size_t(it.g) * D * bt.block_size;
    const float* vbase = bt.vc + size_t(li) * bt.layer_stride + size_t(it.g) * D;
    attend_many(qs, nq, kbase, vbase, gr.chunks.data(), int64_t(gr.chunks.size()), m.Hkv, D, bt.block_size);
  };

  P.run([&](int tid, int nt) {
    Barrier solo(1);  // the pool was busy and this thread runs the whole job
    Barrier& B = nt == 1 ? solo : team;
    PhaseClock clk(tid == 0 && g_prof_on.load(std::memory_order_relaxed));
    int a, b;
    rows_of(N, tid, nt, &a, &b);
    for (int i = a; i < b; i++) {
      embed_row(m, bt.tokens[i], &x[size_t(i) * C]);
      for (int c = 0; c < half; c++) {
        float ang = float(bt.positions[i]) * m.inv_freq[c];
        cs[size_t(i) * half + c] = std::cos(ang);
        sn[size_t(i) * half + c] = std::sin(ang);
      }
    }
    B.wait();
    clk.lap(P_EMBED);
    for (int li = 0; li < m.L; li++) {
      const Layer& Ly = m.layers[li];
      for (int i = a; i < b; i++) rmsnorm_row(&x[size_t(i) * C], Ly.attn_norm, C, m.eps, &h[size_t(i) * C]);
      B.wait();
      clk.lap(P_NORM);
      gemm(Ly.qkv, h.data(), N, C, qkv.data(), ldq, false, tid, nt);
      B.wait();
      clk.lap(P_QKV);
      for (int i = a; i < b; i++) {
        int64_t slot = slots[bt.row_seq[i]][slot_index(bt, i)];
        rope_and_store(m, bt, li, &qkv[size_t(i) * ldq], slot, &cs[size_t(i) * half], &sn[size_t(i) * half]);
      }
      B.wait();
      clk.lap(P_ROPE);
      for (int it = next_item[li].fetch_add(1); it < n_items; it = next_item[li].fetch_add(1))
        run_attention(items[it], li, tid);
      B.wait();
      clk.lap(P_ATTN);
      gemm(Ly.o, attn.data(), N, H * D, x.data(), C, true, tid, nt);
      B.wait();
      clk.lap(P_O);
      for (int i = a; i < b; i++) rmsnorm_row(&x[size_t(i) * C], Ly.ffn_norm, C, m.eps, &h[size_t(i) * C]);
      B.wait();
      clk.lap(P_NORM);
      gemm(Ly.gate_up, h.data(), N, C, gu.data(), 2 * F, false, tid, nt);
      B.wait();
      clk.lap(P_GATE_UP);
      for (int i = a; i < b; i++) silu_mul(&gu[size_t(i) * 2 * F], F, &act[size_t(i) * F]);
      B.wait();
      clk.lap(P_ACT);
      gemm(Ly.down, act.data(), N, F, x.data(), C, true, tid, nt);
      B.wait();
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
    B.wait();
    gemm(m.head, hf.data(), bt.R, C, bt.logits, m.head->N, false, tid, nt);
    B.wait();
    // Greedy choice of every logit row: each thread scans a column range, thread 0 merges in order.
    const int64_t V = m.head->N;
    for (int r = 0; r < bt.R; r++)
      part[size_t(tid) * bt.R + r] = row_max(bt.logits + size_t(r) * V, V * tid / nt, V * (tid + 1) / nt);
    B.wait();
    if (tid == 0) {
      for (int r = 0; r < bt.R; r++) {
        RowMax best = part[r];
        for (int t = 1; t < nt; t++) {
          const RowMax& o = part[size_t(t) * bt.R + r];
          best.finite = best.finite && o.finite;
          if (o.value > best.value) best = RowMax{o.value, o.index, best.finite};
        }
        bt.argmax[r] = best.finite && best.index >= 0 ? best.index : -1;
      }
    }
    clk.lap(P_HEAD);
  });
}

}  // namespace dg

using namespace dg;

static thread_local std::string g_error;

// Return codes of the C functions: 0 ok, 1 failure, 2 an index out of range (a bad token id).
template <typename Fn>
static int guarded(Fn&& fn) {  // no C++ exception may cross the C ABI
  try {
    fn();
    return 0;
  } catch (const std::out_of_range& e) {
    g_error = e.what();
    return 2;
  } catch (const std::exception& e) {
    g_error = e.what();
  } catch (...) {
    g_error = "unknown C++ exception";
  }
  return 1;
}

extern "C" {

const char* dg_isa() { return isa_name(); }

const char* dg_last_error() { return g_error.c_str(); }

void dg_set_threads(int n, int spin_us) {
  std::lock_guard<std::mutex> g(g_pool_mu);
  g_pool.reset(new Pool(n, spin_us));
}

int dg_threads() { return pool().size(); }

void* dg_pack(const void* w, int dtype, int N, int K) {
  Packed* p = nullptr;
  guarded([&] { p = pack(w, dtype, N, K); });
  return p;
}

// Rows of n_parts GGUF tensors (GGML block formats, each [rows[i], K]) stacked into one quantized Packed.
void* dg_pack_gguf(int n_parts, const void* const* srcs, const int* types, const int* rows, int K) {
  Packed* p = nullptr;
  guarded([&] { p = pack_gguf(n_parts, srcs, types, rows, K); });
  return p;
}

// Weights of a Packed as float32 [N, K] (tests: what the kernels multiply by).
int dg_unpack(const void* p, float* out) {
  auto* pk = static_cast<const Packed*>(p);
  return guarded([&] {
    for (int n = 0; n < pk->N; n++) unpack_row(pk, n, out + size_t(n) * pk->K);
  });
}

int dg_packed_dtype(const void* p) { return static_cast<const Packed*>(p)->dtype; }

void dg_packed_free(void* p) {
  auto* pk = static_cast<Packed*>(p);
  std::free(pk->data);
  delete pk;
}

int64_t dg_packed_bytes(const void* p) {
  return int64_t(packed_bytes(static_cast<const Packed*>(p)));
}

// y[M, N] = x[M, K] @ W^T (add != 0: y += ...), on the pool.
int dg_linear(const void* w, const float* x, int M, float* y, int add) {
  auto* p = static_cast<const Packed*>(w);
  return guarded([&] { pool().run([&](int tid, int nt) { gemm(p, x, M, p->K, y, p->N, add != 0, tid, nt); }); });
}

void* dg_model_new(int L, int C, int H, int Hkv, int D, int F, float eps, const float* inv_freq) {
  auto* m = new Model{L, C, H, Hkv, D, F, eps, std::vector<float>(inv_freq, inv_freq + D / 2), {}, nullptr,
                      nullptr, nullptr, F32, 0};
  m->layers.resize(L);
  return m;
}

void dg_model_set_layer(void* mp, int i, const float* attn_norm, const float* ffn_norm, void* qkv, void* o,
                        void* gate_up, void* down) {
  auto* m = static_cast<Model*>(mp);
  m->layers[i] = Layer{attn_norm, ffn_norm, static_cast<Packed*>(qkv), static_cast<Packed*>(o),
                       static_cast<Packed*>(gate_up), static_cast<Packed*>(down)};
}

void dg_model_set_head(void* mp, const float* final_norm, void* head, const void* embed, int embed_dtype,
                       int vocab) {
  auto* m = static_cast<Model*>(mp);
  m->final_norm = final_norm;
  m->head = static_cast<Packed*>(head);
  m->embed = embed;
  m->embed_dtype = embed_dtype;
  m->vocab = vocab;
}

void dg_model_free(void* mp) { delete static_cast<Model*>(mp); }

int dg_forward(void* mp, int N, const int64_t* tokens, const int64_t* positions, const int32_t* row_seq,
               const int64_t* slot_index, const int32_t* parent, int B, const int32_t* tables,
               const int64_t* table_off, int block_size, float* kc, float* vc,
               int64_t layer_stride, int R, const int64_t* logit_rows, float* logits, int64_t* argmax, int n_feat,
               const int32_t* feat_layers, int RF, const int64_t* feat_rows, float* features) {
  const Model& m = *static_cast<Model*>(mp);
  return guarded([&] {
    for (int i = 0; i < N; i++)
      if (tokens[i] < 0 || tokens[i] >= m.vocab)
        throw std::out_of_range("token id " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                                std::to_string(m.vocab) + ")");
    for (int j = 0; j < n_feat; j++)
      if (feat_layers[j] < 0 || feat_layers[j] > m.L)
        throw std::out_of_range("feature layer " + std::to_string(feat_layers[j]) + " is outside [0, " +
                                std::to_string(m.L) + "]");
    for (int r = 0; r < (n_feat > 0 ? RF : 0); r++)
      if (feat_rows[r] < 0 || feat_rows[r] >= N)
        throw std::out_of_range("feature row " + std::to_string(feat_rows[r]) + " is outside [0, " +
                                std::to_string(N) + ")");
    if ((slot_index == nullptr) != (parent == nullptr)) throw std::invalid_argument("a tree needs slot_index and parent");
    for (int i = 0; i < (parent ? N : 0); i++)
      if (parent[i] >= i || (parent[i] >= 0 && (row_seq[parent[i]] != row_seq[i] || positions[parent[i]] + 1 != positions[i])))
        throw std::out_of_range("row " + std::to_string(i) + " follows row " + std::to_string(parent[i]) +
                                ": a tree row follows an earlier row of its sequence, one position before it");
    Batch bt{N,  tokens, positions,  row_seq, slot_index, parent, tables,      table_off, block_size, kc, vc,
             layer_stride, R, logit_rows, logits, argmax, n_feat, feat_layers, RF,        feat_rows,  features};
    forward(m, bt, B);
  });
}

// Phase profile: enable (1) / disable (0) and reset; read the seconds per phase into out[P_COUNT].
int dg_profile(int enable, double* out) {
  if (out != nullptr)
    for (int p = 0; p < P_COUNT; p++) out[p] = g_prof[p];
  for (int p = 0; p < P_COUNT; p++) g_prof[p] = 0.0;
  g_prof_on.store(enable != 0);
  return P_COUNT;
}

}  // extern "C"

#include "head_step.h"  // a draft head's step (uses the helpers above)
