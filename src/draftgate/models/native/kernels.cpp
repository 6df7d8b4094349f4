// The C ABI of the native kernels (ctypes, models/native/build.py declares the prototypes): packed
// products (gemm.h), the Llama forward (forward.h) and a draft head's step (head_step.h).
//
// Handles are opaque pointers; arrays are raw pointers to contiguous tensors owned by the caller.
// Shapes: N new rows, B sequences, R logit rows. No C++ exception crosses the ABI: each function
// returns a code (0 ok, 1 failure, 2 an index out of range) and dg_last_error says what failed.
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "forward.h"
#include "gemm.h"
#include "head_step.h"
#include "pool.h"
#include "qgemm.h"
#include "simd.h"

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

void dg_set_threads(int n, int spin_us) { set_pool(n, spin_us); }

int dg_threads() { return pool().size(); }

void* dg_pack(const void* w, int dtype, int N, int K) {
  Packed* p = nullptr;
  guarded([&] { p = pack(w, dtype, N, K); });
  return p;
}

// Rows of n_parts GGUF tensors (each [rows[i], K]) stacked into one Packed, each part in its own format.
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

void* dg_model_new(int L, int C, int H, int Hkv, int D, int F, float eps, const float* inv_freq,
                   const float* inv_freq_local, float attn_scale, float embed_scale, int act) {
  auto* m = new Model{};
  m->L = L, m->C = C, m->H = H, m->Hkv = Hkv, m->D = D, m->F = F, m->eps = eps;
  m->inv_freq.assign(inv_freq, inv_freq + D / 2);
  if (inv_freq_local != nullptr) m->inv_freq_local.assign(inv_freq_local, inv_freq_local + D / 2);
  m->attn_scale = attn_scale, m->embed_scale = embed_scale, m->act = act;
  m->layers.resize(L);
  return m;
}

// Layer i's norms and products; the rest (null or 0: the family has none) are what a family adds.
void dg_model_set_layer(void* mp, int i, const float* attn_norm, const float* ffn_norm, void* qkv, void* o,
                        void* gate_up, void* down, const float* qkv_bias, const float* q_norm, const float* k_norm,
                        const float* o_norm, const float* down_norm, int window, int local_rope) {
  auto* m = static_cast<Model*>(mp);
  Layer& Ly = m->layers[i];
  Ly.attn_norm = attn_norm, Ly.ffn_norm = ffn_norm;
  Ly.qkv = static_cast<Packed*>(qkv), Ly.o = static_cast<Packed*>(o);
  Ly.gate_up = static_cast<Packed*>(gate_up), Ly.down = static_cast<Packed*>(down);
  Ly.qkv_bias = qkv_bias, Ly.q_norm = q_norm, Ly.k_norm = k_norm, Ly.o_norm = o_norm, Ly.down_norm = down_norm;
  Ly.window = window, Ly.local_rope = local_rope != 0;
}

// The head; the embedding's rows from ``embed`` (row-major, ``embed_dtype``), else from the packed
// ``embed_packed``, else (both null: tied) from the head's.
void dg_model_set_head(void* mp, const float* final_norm, void* head, const void* embed, int embed_dtype,
                       int vocab, void* embed_packed) {
  auto* m = static_cast<Model*>(mp);
  m->final_norm = final_norm;
  m->head = static_cast<Packed*>(head);
  m->embed = embed;
  m->embed_dtype = embed_dtype;
  m->embed_packed = static_cast<Packed*>(embed_packed);
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

// ------------------------------------------------------------------ a draft head's step (head_step.h)

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
