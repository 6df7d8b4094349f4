"""The decoder forward on the native CPU kernels (``models/native``): weights packed once, one call per pass.

Why not PyTorch's kernels on CPU (measured, docs/BENCHMARKS.md):
- a K+1-row pass over MKL's GEMM cost 1.5-2.7x a one-row pass, where decoding is memory-bound
  and more rows over the same weights should cost little; the native products stream each
  weight once for up to 24 rows, with software prefetch so the FMAs hide under the stream;
- a forward run from any thread but the one whose OpenMP team came first paid a futex wake-up
  per parallel region (47 instead of 25 ms per token); the native pool does not use OpenMP;
- batch invariance held by observation only (different kernels for 1, 2-3 and >= 4 rows); here
  every value is computed by a reduction whose order depends on the model's shapes and the row's
  own position only, so a position's logits are bitwise the same alone, in a K+1-row verify and
  in a ragged batch (tests/models/test_invariance.py checks it on the real model).

Weights may be stored as float32, bfloat16 or float16 (activations, the KV cache and every sum
float32), or as a GGUF file's own tensors (``gguf_blocks``): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K
and Q6_K blocks multiplied from their codes inside the product's tiles (``native/qgemm.h``: with 8-bit
activations as llama.cpp does, where the CPU has the integer dot products), F32, F16 and BF16 tensors
from their own storage. Every format computes a row from
that row alone, so each keeps the same invariance (speculation stays exact against plain decoding
of the same weights).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from draftgate.models.batch import ForwardOutput, RaggedBatch
from draftgate.models.config import ModelConfig, rope_inv_freq
from draftgate.models.gguf_blocks import Blocks
from draftgate.models.llama import VOCAB_SUBSET_KEY
from draftgate.models.native.build import NativeLib
from draftgate.models.weights import EMBED, ModelWeights

__all__ = ["NativeLlama", "NATIVE_DTYPES", "NativeKVCache", "PackedLinear", "profile"]

# Weight storage formats the kernels read (compute is float32 either way).
NATIVE_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


_SHARED: weakref.WeakValueDictionary[tuple[int, int, int], NativeLlama] = weakref.WeakValueDictionary()
_FORMATS = {0: "float32", 1: "bfloat16", 2: "float16", 3: "q4", 4: "q8", 5: "q5"}  # packed.h's DType


class NativeKVCache:
    """float32 keys and values of every layer, paged in blocks of ``block_size`` positions.

    k: [L, num_blocks, H_kv, D, block_size] (keys transposed within a block, so attention scores
    a block of keys with vector FMAs and no horizontal sums); v: [L, num_blocks * block_size,
    H_kv, D] (flat slot = block * block_size + offset).
    """

    def __init__(self, cfg: ModelConfig, num_blocks: int, block_size: int) -> None:
        L, Hkv, D = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
        self.k = torch.zeros(L, num_blocks, Hkv, D, block_size, dtype=torch.float32)
        self.v = torch.zeros(L, num_blocks * block_size, Hkv, D, dtype=torch.float32)

    def copy_block(self, src: int, dst: int, block_size: int) -> None:
        self.k[:, dst] = self.k[:, src]
        s, d = src * block_size, dst * block_size
        self.v[:, d : d + block_size] = self.v[:, s : s + block_size]

    def move_slots(self, src: list[int], dst: list[int], block_size: int) -> None:
        """Copy the KV of flat slots ``src`` to ``dst`` (every layer; all read before any is written)."""
        sb, so = [s // block_size for s in src], [s % block_size for s in src]
        db, do = [d // block_size for d in dst], [d % block_size for d in dst]
        self.k[:, db, :, :, do] = self.k[:, sb, :, :, so]
        self.v[:, dst] = self.v[:, src]


def _i64(x: list[int]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int64)


class NativeLlama:
    """Packed weights and the native forward. Holds no per-request state: KV lives in a NativeKVCache."""

    @classmethod
    def shared(
        cls, cfg: ModelConfig, weights: ModelWeights, lib: NativeLib, blocks: Mapping[str, Blocks] | None = None
    ) -> NativeLlama:
        """One packed copy per loaded model in a process: runners built on the same weights share it.

        Each copy is the model's size again (538 MB for SmolLM2-135M in float32), and copies land
        in different memory: several engine arms of one benchmark process each streamed their own,
        and an arm could run 8-20% slower than its neighbours for a whole bench (docs/BENCHMARKS.md).
        Safe to share: the forward keeps no state between calls.
        """
        source = _source(weights, blocks)
        key = (id(source), id(lib), id(blocks) if blocks is not None else 0)
        hit = _SHARED.get(key)
        if hit is not None and hit._source() is source and hit._blocks is blocks:
            return hit
        model = _SHARED[key] = cls(cfg, weights, lib, blocks)
        return model

    def __init__(
        self, cfg: ModelConfig, weights: ModelWeights, lib: NativeLib, blocks: Mapping[str, Blocks] | None = None
    ) -> None:
        """``blocks``: run these weights (runner names) from their GGUF blocks (their pages handed back to
        the file once packed); the rest from ``weights``' float tensors."""
        self.cfg = cfg
        self.lib = lib
        c = lib.cdll
        self.dtype = weights.dtype
        if self.dtype not in NATIVE_DTYPES:
            raise ValueError(f"native kernels store float32, bfloat16 or float16 weights, not {self.dtype}")
        self._source = weakref.ref(_source(weights, blocks))  # what ``shared`` matches (an id may be reused)
        self._blocks = blocks
        self._formats: set[str] = set()  # the packed products' storage formats (float32, q4, ...)
        self._keep: list[torch.Tensor] = []  # tensors the C side points into
        self._packed: list[int] = []
        inv_freq = self._f32(rope_inv_freq(cfg))  # [D/2]
        local = cfg.rope_local_theta is not None and any(cfg.layer_windows)
        inv_local = self._f32(rope_inv_freq(cfg, local=True)) if local else None  # [D/2]
        fam = cfg.family
        # Gemma scales embeddings by sqrt(hidden) rounded to the weights' dtype, as transformers does.
        scale = float(torch.tensor(cfg.hidden_size**0.5, dtype=self.dtype)) if fam.embed_scale else 1.0
        self._model = c.dg_model_new(
            cfg.num_layers,
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            cfg.rms_norm_eps,
            inv_freq.data_ptr(),
            inv_local.data_ptr() if inv_local is not None else None,
            cfg.scale,
            scale,
            1 if fam.gelu else 0,
        )
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."

            def pack(*names: str, p: str = p) -> int:
                return self._pack(weights, [p + n + ".weight" for n in names])

            def vec(*names: str, p: str = p) -> int | None:  # float32 vectors a family adds (None: absent)
                parts = [weights.get(p + n) for n in names]
                return self._f32(torch.cat(parts)).data_ptr() if all(x is not None for x in parts) else None

            c.dg_model_set_layer(
                self._model,
                i,
                self._f32(weights[p + "input_layernorm.weight"]).data_ptr(),
                self._f32(weights[p + "post_attention_layernorm.weight"]).data_ptr(),
                pack("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),  # [(H+2Hkv)*D, C]
                pack("self_attn.o_proj"),
                pack("mlp.gate_proj", "mlp.up_proj"),  # [2F, C]
                pack("mlp.down_proj"),
                vec("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),  # [(H+2Hkv)*D]
                vec("self_attn.q_norm.weight"),  # [D]
                vec("self_attn.k_norm.weight"),  # [D]
                vec("self_attn.o_norm.weight"),  # [C]
                vec("mlp.down_norm.weight"),  # [C]
                cfg.window(i),
                1 if local and cfg.window(i) else 0,
            )
        # A distilled draft may predict a vocabulary subset: head [Vs, C], out_ids [Vs] -> token ids.
        self.out_ids: torch.Tensor | None = weights.get(VOCAB_SUBSET_KEY)  # [Vs] int64
        head_name = "lm_head.weight" if not cfg.tie_word_embeddings and "lm_head.weight" in weights else EMBED
        self.head_rows = weights.shape(head_name)[0]
        embed_ptr, embed_packed = None, None
        if head_name != EMBED:  # untied: the embedding's rows from its own storage; tied: the packed head's
            if blocks is not None and EMBED in blocks:
                embed_packed = self._pack(weights, [EMBED])
            else:
                embed_ptr = self._keep_tensor(weights[EMBED].contiguous()).data_ptr()
        c.dg_model_set_head(
            self._model,
            self._f32(weights["model.norm.weight"]).data_ptr(),
            self._pack(weights, [head_name]),
            embed_ptr,
            NATIVE_DTYPES[self.dtype],
            cfg.vocab_size,
            embed_packed,
        )
        weakref.finalize(self, _free, c, self._model, list(self._packed))

    @property
    def packed_bytes(self) -> int:
        return sum(int(self.lib.cdll.dg_packed_bytes(p)) for p in self._packed)

    def _keep_tensor(self, t: torch.Tensor) -> torch.Tensor:
        self._keep.append(t)
        return t

    def _f32(self, t: torch.Tensor) -> torch.Tensor:
        return self._keep_tensor(t.detach().to(torch.float32).contiguous())

    def _pack(self, weights: Mapping[str, torch.Tensor], names: list[str]) -> int:
        """The weights ``parts`` ([N_i, K] each) stacked into one product: from the GGUF file's own tensors
        (quantized blocks, or F32/F16/BF16 as stored) where ``blocks`` has every part, else from the float tensors."""
        c = self.lib.cdll
        qb = [b for n in names if (b := (self._blocks or {}).get(n)) is not None]
        if len(qb) == len(names):
            data = [b.data.contiguous() for b in qb]  # copied into the tiles (q/k rows unpermuted here)
            ptrs = (ctypes.c_void_p * len(qb))(*[d.data_ptr() for d in data])
            types = (ctypes.c_int * len(qb))(*[b.ggml_type for b in qb])
            rows = (ctypes.c_int * len(qb))(*[b.N for b in qb])
            h = c.dg_pack_gguf(len(qb), ptrs, types, rows, qb[0].K)
            for b in qb:
                b.release()
            N, K = sum(b.N for b in qb), qb[0].K
        else:
            parts = [weights[n] for n in names]
            w = (parts[0] if len(parts) == 1 else torch.cat(parts)).detach().contiguous()
            N, K = w.shape
            h = c.dg_pack(w.data_ptr(), NATIVE_DTYPES[w.dtype], N, K)
        if not h:
            raise MemoryError(f"packing a [{N}, {K}] weight failed: {c.dg_last_error().decode()}")
        self._packed.append(h)
        self._formats.add(_FORMATS[c.dg_packed_dtype(h)])
        return h

    @property
    def weight_format(self) -> str:
        """The products' storage, e.g. ``float32`` or ``q4`` (``q4+q8``: mixed)."""
        return "+".join(sorted(self._formats))

    def forward(self, batch: RaggedBatch, kv: NativeKVCache) -> ForwardOutput:
        """Logits [R, V] float32 of the batch's logit rows (V: the full vocabulary) and their argmax."""
        x = _Inputs.of(batch)
        C = self.cfg.hidden_size
        features = torch.empty(x.RF, x.n_feat, C, dtype=torch.float32) if x.n_feat else None  # [RF, n_feat, C]
        logits = torch.empty(x.R, self.head_rows, dtype=torch.float32)  # [R, V or Vs]
        out = ForwardOutput(logits, torch.empty(x.R, dtype=torch.int64), features)  # argmax [R]
        self._run(x, batch.block_size, kv, out)
        return self._full_vocabulary(out)

    def _run(self, x: _Inputs, block_size: int, kv: NativeKVCache, out: ForwardOutput) -> None:
        """One dg_forward call: the batch ``x`` over the cache ``kv``, into ``out``'s tensors."""
        _, slots, Hkv, D = kv.v.shape
        ptr = lambda t: t.data_ptr() if t is not None else None  # noqa: E731
        rc = self.lib.cdll.dg_forward(
            self._model,
            x.tokens.shape[0],
            ptr(x.tokens),
            ptr(x.positions),
            ptr(x.row_seq),
            ptr(x.slot_index),
            ptr(x.parent),
            x.B,
            ptr(x.tables),
            ptr(x.table_off),
            block_size,
            kv.k.data_ptr(),
            kv.v.data_ptr(),
            slots * Hkv * D,
            x.R,
            ptr(x.logit_rows),
            ptr(out.logits),
            ptr(out.argmax),
            x.n_feat,
            ptr(x.feat_layers) if x.n_feat else None,
            x.RF,
            ptr(x.feat_rows),
            ptr(out.features),
        )
        if rc != 0:
            msg = self.lib.cdll.dg_last_error().decode()
            raise (IndexError if rc == 2 else RuntimeError)(f"native forward failed: {msg}")

    def _full_vocabulary(self, out: ForwardOutput) -> ForwardOutput:
        """``out`` over the full vocabulary: a vocabulary subset's rows placed at their token ids (-inf elsewhere)."""
        if self.out_ids is None:
            return out
        R = out.logits.shape[0]
        full = out.logits.new_full((R, self.cfg.vocab_size), float("-inf"))  # [R, V]
        full[:, self.out_ids] = out.logits
        argmax = out.argmax
        ids = torch.where(argmax >= 0, self.out_ids[argmax.clamp(min=0)], -1)  # [R] subset row -> token id
        return ForwardOutput(full, ids, out.features)


def _source(weights: ModelWeights, blocks: Mapping[str, Blocks] | None) -> torch.Tensor:
    """The tensor a packed model is known by: its embedding's blocks, else its float embedding."""
    b = (blocks or {}).get(EMBED)
    return b.data if b is not None else weights.dense[EMBED]


@dataclass(frozen=True)
class _Inputs:
    """A ragged batch as dg_forward reads it: contiguous int64 / int32 tensors."""

    tokens: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    row_seq: torch.Tensor  # [N] int32 sequence index of each row
    slot_index: torch.Tensor | None  # [N] int64 a draft tree's KV slot indices (None: a chain)
    parent: torch.Tensor | None  # [N] int32 a draft tree's parent rows (None: a chain)
    tables: torch.Tensor  # [sum of tables] int32 the block tables, concatenated
    table_off: torch.Tensor  # [B+1] int64 start of each sequence's table
    logit_rows: torch.Tensor  # [R] int64
    feat_layers: torch.Tensor  # [n_feat] int32
    feat_rows: torch.Tensor | None  # [RF] int64 (None without features)

    @property
    def B(self) -> int:
        return int(self.table_off.shape[0]) - 1

    @property
    def R(self) -> int:
        return int(self.logit_rows.shape[0])

    @property
    def n_feat(self) -> int:
        return int(self.feat_layers.shape[0])

    @property
    def RF(self) -> int:
        return int(self.feat_rows.shape[0]) if self.feat_rows is not None else 0

    @classmethod
    def of(cls, batch: RaggedBatch) -> _Inputs:
        tree = batch.parents is not None
        offsets = [0]
        for t in batch.block_tables:
            offsets.append(offsets[-1] + len(t))
        return cls(
            tokens=_i64(batch.tokens),
            positions=_i64(batch.positions()),
            row_seq=torch.tensor(batch.row_seq(), dtype=torch.int32),
            slot_index=_i64(batch.slot_indices()) if tree else None,
            parent=torch.tensor(batch.flat_parents(), dtype=torch.int32) if tree else None,
            tables=torch.tensor([b for t in batch.block_tables for b in t], dtype=torch.int32),
            table_off=_i64(offsets),
            logit_rows=_i64(batch.logit_rows()),
            feat_layers=torch.tensor(batch.feature_layers, dtype=torch.int32),
            feat_rows=_i64(batch.feature_rows()) if batch.feature_layers else None,
        )


class PackedLinear:
    """``y = x @ W^T`` on the native pool, W packed once (float32, bfloat16 or float16 storage).

    For small products run from the engine's thread (a draft head's step): torch's GEMM there pays
    an OpenMP wake-up per call while the native pool spins (docs/BENCHMARKS.md), and
    bfloat16 storage halves the bytes a cold step streams.
    """

    def __init__(self, lib: NativeLib, w: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
        if dtype not in NATIVE_DTYPES:
            raise ValueError(f"native kernels store float32, bfloat16 or float16 weights, not {dtype}")
        w = w.detach().to(dtype).contiguous()  # [N, K]
        self.N, self.K = w.shape
        self.lib = lib
        self._h = lib.cdll.dg_pack(w.data_ptr(), NATIVE_DTYPES[dtype], self.N, self.K)
        if not self._h:
            raise MemoryError(f"packing a [{self.N}, {self.K}] weight failed: {lib.cdll.dg_last_error().decode()}")
        weakref.finalize(self, lib.cdll.dg_packed_free, self._h)

    @property
    def handle(self) -> int:
        """The packed product's C handle (what dg_head_new takes)."""
        return self._h

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] float32."""
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.K).to(torch.float32).contiguous()  # [M, K]
        y = torch.empty(x2.shape[0], self.N, dtype=torch.float32)  # [M, N]
        if self.lib.cdll.dg_linear(self._h, x2.data_ptr(), x2.shape[0], y.data_ptr(), 0) != 0:
            raise RuntimeError(f"native linear failed: {self.lib.cdll.dg_last_error().decode()}")
        return y.view(*lead, self.N)


def _free(c: ctypes.CDLL, model: int, packed: list[int]) -> None:
    c.dg_model_free(model)
    for p in packed:
        c.dg_packed_free(p)


def profile(lib: NativeLib, run: Callable[[], None]) -> dict[str, float]:
    """Seconds per forward phase (thread 0's wall time between barriers) while ``run()`` executes."""
    names = ["embed", "norm", "qkv", "rope_kv", "attention", "o_proj", "gate_up", "silu", "down", "head"]
    buf = (ctypes.c_double * len(names))()
    lib.cdll.dg_profile(1, None)
    try:
        run()
    finally:
        lib.cdll.dg_profile(0, buf)
    return dict(zip(names, list(buf), strict=True))
