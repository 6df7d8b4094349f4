"""The decoder forward pass over a paged KV cache (RMSNorm, RoPE, GQA attention, a gated MLP), with
what each family adds (``config.Family``: q/k/v biases, q/k norms, norms around the attention and
the MLP, GELU, scaled embeddings, per-layer attention windows and RoPE bases).

One call runs a *ragged batch*: B sequences, each contributing 1..n new tokens,
flattened to N = sum(n_b) rows so every matmul is one call. Attention gathers
each sequence's context from the paged cache by flat slot index; the slots
are written at absolute positions, so rolling back a sequence is only a
bookkeeping change (the runner's ``truncate``) and never touches tensors.

This is the PyTorch implementation: the one used on CUDA, and on CPU with
``--kernels torch``. CPU decoding uses ``native_llama.NativeLlama`` by default
(faster, and batch invariant by construction). Here batch invariance holds by
observation only: the CPU weights are stored for fast small-M matmuls (a
pre-transposed contiguous ``x @ Wt`` for 1..3 rows, ``F.linear`` for the tied
lm_head from 4 rows up), and those are different kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from draftgate.models.batch import ForwardOutput, RaggedBatch
from draftgate.models.config import ModelConfig, rope_inv_freq
from draftgate.models.rope import apply_rope, rope_cos_sin

__all__ = ["VOCAB_SUBSET_KEY", "LlamaModel", "AttentionLayout", "KVCache"]

# Optional weight: the token ids a reduced output head predicts (a distilled draft's vocabulary subset).
VOCAB_SUBSET_KEY = "draftgate.vocab_subset"


@dataclass
class AttentionLayout:
    """Index tensors for one ragged forward, built once and shared by all layers.

    B sequences, n_b new tokens each (N = sum n_b), S_b context length after the
    new tokens are written. Padded layouts let one SDPA call serve the batch.
    """

    positions: torch.Tensor  # [N] int64 absolute position of each new token
    write_slots: torch.Tensor  # [N] int64 flat KV slot where each new token's K/V goes
    kv_gather: torch.Tensor  # [B, S_max] int64 flat slots of each sequence's context (padded)
    kv_span: tuple[int, int] | None  # B == 1 with contiguous slots: read the cache as a slice, no gather
    q_index: torch.Tensor | None  # [B, T_max] int64 rows of the flat batch (None when B == 1)
    unpad: torch.Tensor | None  # [N] int64 rows of the padded [B*T_max] layout (None when B == 1)
    mask: torch.Tensor | None  # [B, 1, T_max, S_max] bool, True = attend (None: no mask needed)
    logit_rows: torch.Tensor  # [R] int64 rows of the flat batch whose logits are wanted
    q_pos: torch.Tensor | None = None  # [B, T_max] each query's position (for windowed layers' masks)
    k_len: torch.Tensor | None = None  # [B] keys per sequence
    windowed: dict[int, torch.Tensor | None] = field(default_factory=dict)  # window -> its mask (cached)

    def mask_for(self, window: int) -> torch.Tensor | None:
        """The attention mask of a layer whose positions attend the last ``window`` keys (0: all)."""
        if not window:
            return self.mask
        if window not in self.windowed:
            assert self.q_pos is not None and self.k_len is not None
            S_max = self.kv_gather.shape[1]
            k_pos = torch.arange(S_max, device=self.q_pos.device)[None, None, :]  # [1, 1, S_max]
            q = self.q_pos[:, :, None]  # [B, T_max, 1]
            near = (k_pos <= q) & (k_pos > q - window) & (k_pos < self.k_len[:, None, None])
            self.windowed[window] = near[:, None] if self.mask is None else self.mask & near[:, None]
        return self.windowed[window]

    @classmethod
    def build(cls, batch: RaggedBatch, device: torch.device) -> AttentionLayout:
        """The index tensors, from the block tables: no Python work per context token (a GPU batch
        of 256 sequences at context 250 spent 30 ms a step building them a slot at a time)."""
        new_lens, logits_per_seq, ctx_lens, bs = batch.new_lens, batch.logits_per_seq, batch.ctx_lens, batch.block_size
        B = len(new_lens)
        as_t = lambda x: torch.tensor(x, dtype=torch.int64, device=device)  # noqa: E731
        write: list[int] = []
        logit_rows: list[int] = []
        row = 0
        for b, (n, S, r) in enumerate(zip(new_lens, ctx_lens, logits_per_seq, strict=True)):
            table = batch.block_tables[b]
            write.extend(table[t // bs] * bs + t % bs for t in range(S - n, S))
            logit_rows.extend(range(row + n - r, row + n))
            row += n
        positions = batch.positions()  # a tree row's: the context's length plus its depth
        T_max, S_max = max(new_lens), max(ctx_lens)
        n_blocks = (S_max + bs - 1) // bs
        tables = as_t(
            [list(t[:n_blocks]) + [0] * (n_blocks - min(len(t), n_blocks)) for t in batch.block_tables]
        )  # [B, nb]
        t_idx = torch.arange(S_max, device=device)  # [S_max]
        kv_gather = tables[:, t_idx // bs] * bs + t_idx % bs  # [B, S_max] (past a sequence's length: masked)
        q_index = unpad = mask = None
        q_pos_all = torch.arange(T_max, device=device)[None, :] + (as_t(ctx_lens) - as_t(new_lens))[:, None]
        if B > 1:
            starts = [0]
            for n in new_lens[:-1]:
                starts.append(starts[-1] + n)
            q_index = as_t([[st + min(t, n - 1) for t in range(T_max)] for st, n in zip(starts, new_lens, strict=True)])
            unpad = as_t([b * T_max + t for b, n in enumerate(new_lens) for t in range(n)])
        if B > 1 or T_max > 1:
            q_pos = q_pos_all
            k_pos = torch.arange(S_max, device=device)[None, None, :]  # [1, 1, S_max]
            mask = (k_pos <= q_pos[:, :, None]) & (k_pos < as_t(ctx_lens)[:, None, None])
            if batch.parents is not None:  # a tree row attends the context and its own ancestors only
                for b, (n, S) in enumerate(zip(new_lens, ctx_lens, strict=True)):
                    mask[b, :n, S - n : S] = _ancestry(batch.parents[b], device)
            mask = mask[:, None]  # [B, 1, T_max, S_max]
        span = None
        if B == 1:  # its blocks consecutive: the context is one slice of the cache
            table = batch.block_tables[0][:n_blocks]
            if table == list(range(table[0], table[0] + n_blocks)):
                span = (table[0] * bs, table[0] * bs + S_max)
        return cls(
            as_t(positions),
            as_t(write),
            kv_gather,
            span,
            q_index,
            unpad,
            mask,
            as_t(logit_rows),
            q_pos_all,
            as_t(ctx_lens),
        )


@dataclass
class KVCache:
    """The paged KV tensors: one flat slot axis (block_id * block_size + offset)."""

    k: torch.Tensor  # [L, num_slots, H_kv, D]
    v: torch.Tensor  # [L, num_slots, H_kv, D]

    @classmethod
    def allocate(cls, cfg: ModelConfig, num_slots: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        shape = (cfg.num_layers, num_slots, cfg.num_kv_heads, cfg.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def copy_block(self, src: int, dst: int, block_size: int) -> None:
        s, d = src * block_size, dst * block_size
        self.k[:, d : d + block_size] = self.k[:, s : s + block_size]
        self.v[:, d : d + block_size] = self.v[:, s : s + block_size]

    def move_slots(self, src: list[int], dst: list[int], block_size: int) -> None:
        """Copy the KV of flat slots ``src`` to ``dst`` (every layer; all read before any is written)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


class _Weight:
    """A [out, in] weight laid out for the matmul that is fastest at the row count used."""

    def __init__(self, w: torch.Tensor, keep_rowmajor: bool) -> None:
        self.wt = w.t().contiguous()  # [in, out]: best for 1..3 rows on CPU
        self.w = w.contiguous() if keep_rowmajor else None  # [out, in]: F.linear from 4 rows up

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out]
        if self.w is not None and x.shape[0] >= 4:
            return F.linear(x, self.w)
        return x @ self.wt


class _Layer:
    def __init__(self, w: dict[str, torch.Tensor], i: int, on_cpu: bool, window: int) -> None:
        p = f"model.layers.{i}."
        qkv = torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])  # [(H+2Hkv)*D, C]
        gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])  # [2F, C]
        keep = not on_cpu
        self.qkv = _Weight(qkv, keep)
        self.o = _Weight(w[p + "self_attn.o_proj.weight"], keep)
        self.gate_up = _Weight(gate_up, keep)
        self.down = _Weight(w[p + "mlp.down_proj.weight"], keep)
        self.attn_norm = w[p + "input_layernorm.weight"]
        self.ffn_norm = w[p + "post_attention_layernorm.weight"]
        bias = [w.get(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        self.qkv_bias = torch.cat(bias) if all(b is not None for b in bias) else None  # [(H+2Hkv)*D]
        self.q_norm, self.k_norm = w.get(p + "self_attn.q_norm.weight"), w.get(p + "self_attn.k_norm.weight")  # [D]
        self.o_norm, self.down_norm = w.get(p + "self_attn.o_norm.weight"), w.get(p + "mlp.down_norm.weight")  # [C]
        self.window = window


class LlamaModel:
    """Weights plus the forward pass. Holds no per-request state: KV lives in a KVCache."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        on_cpu = device.type == "cpu"
        w = {k: v.to(device) for k, v in weights.items()}
        self.dtype = w["model.embed_tokens.weight"].dtype
        self.embed = w["model.embed_tokens.weight"]  # [V, C]
        head = w.get("lm_head.weight", self.embed) if not cfg.tie_word_embeddings else self.embed
        self.lm_head = _Weight(head, keep_rowmajor=True)  # [V or Vs, C]
        # A distilled draft may predict only a subset of the vocabulary: lm_head is [Vs, C]
        # and out_ids [Vs] maps its rows to token ids; other tokens get logit -inf (q = 0).
        self.out_ids: torch.Tensor | None = w.get(VOCAB_SUBSET_KEY)  # [Vs] int64
        self.norm = w["model.norm.weight"]
        self.layers = [_Layer(w, i, on_cpu, cfg.window(i)) for i in range(cfg.num_layers)]
        if not on_cpu:  # GPU: F.linear everywhere (the CPU kernel quirk does not apply)
            for lw in [self.lm_head] + [x for L in self.layers for x in (L.qkv, L.o, L.gate_up, L.down)]:
                lw.w = lw.wt.t().contiguous() if lw.w is None else lw.w
        self._inv_freq = rope_inv_freq(cfg).to(device)  # [D/2]
        self._inv_freq_local = rope_inv_freq(cfg, local=True).to(device)  # [D/2]
        # Gemma scales embeddings by sqrt(hidden) in the weights' dtype, as transformers does.
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5, dtype=self.dtype) if cfg.family.embed_scale else None

    def _rope(self, positions: torch.Tensor, local: bool) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_cos_sin(positions, self._inv_freq_local if local else self._inv_freq)  # [N, D]
        return cos.to(self.dtype)[:, None, :], sin.to(self.dtype)[:, None, :]  # [N, 1, D]

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps))
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps)
        return w * xf.to(x.dtype)

    @torch.inference_mode()
    def forward(self, batch: RaggedBatch, kv: KVCache) -> ForwardOutput:
        """Logits [R, V] float32 of the batch's logit rows and their argmax (-1: not finite)."""
        layout = AttentionLayout.build(batch, self.device)
        tokens = torch.tensor(batch.tokens, dtype=torch.int64, device=self.device)  # [N]
        cfg = self.cfg
        ropes = {w > 0: self._rope(layout.positions, w > 0) for w in {L.window for L in self.layers}}  # [N, 1, D] each
        x = self.embed[tokens]  # [N, C]
        if self.embed_scale is not None:
            x = x * self.embed_scale
        feats: dict[int, torch.Tensor] = {}  # layer -> [RF, C]
        frows = (
            torch.tensor(batch.feature_rows(), dtype=torch.int64, device=self.device) if batch.feature_layers else None
        )  # [RF]
        for li, L in enumerate(self.layers):
            attn = self._attend(L, self._rms(x, L.attn_norm), ropes[L.window > 0], kv, li, layout)  # [N, H*D]
            o = L.o(attn)
            x = x + (o if L.o_norm is None else self._rms(o, L.o_norm))
            gu = L.gate_up(self._rms(x, L.ffn_norm))  # [N, 2F]
            g, u = gu.chunk(2, dim=-1)
            down = L.down((F.gelu(g, approximate="tanh") if cfg.family.gelu else F.silu(g)) * u)
            x = x + (down if L.down_norm is None else self._rms(down, L.down_norm))
            if li in batch.feature_layers:
                feats[li] = x[frows].float()  # [RF, C]
        if len(self.layers) in batch.feature_layers:
            feats[len(self.layers)] = self._rms(x[frows], self.norm).float()  # [RF, C]
        x = self._rms(x[layout.logit_rows], self.norm)  # [R, C]
        fl = batch.feature_layers
        features = torch.stack([feats[f] for f in fl], dim=1) if fl else None  # [RF, n, C]
        logits = self.lm_head(x).float()  # [R, V] (or [R, Vs] with a vocabulary subset)
        if self.out_ids is not None:
            full = logits.new_full((logits.shape[0], cfg.vocab_size), float("-inf"))  # [R, V]
            full[:, self.out_ids] = logits
            finite = torch.isfinite(logits).all(dim=-1)  # [R]
            logits = full
        else:
            finite = torch.isfinite(logits).all(dim=-1)  # [R]
        argmax = torch.where(finite, logits.argmax(dim=-1), -1)  # [R]
        return ForwardOutput(logits, argmax, features)

    def _attend(
        self,
        L: _Layer,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: KVCache,
        li: int,
        layout: AttentionLayout,
    ) -> torch.Tensor:
        """One layer's attention of the normed rows h [N, C]: q/k/v (biases, q/k norms, RoPE), the KV written
        at the rows' slots, attention over each row's keys. [N, H*D]"""
        cfg, N = self.cfg, h.shape[0]
        H, Hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv = L.qkv(h)  # [N, (H+2Hkv)*D]
        if L.qkv_bias is not None:
            qkv = qkv + L.qkv_bias
        q = qkv[:, : H * D].view(N, H, D)
        k = qkv[:, H * D : (H + Hkv) * D].view(N, Hkv, D)
        v = qkv[:, (H + Hkv) * D :].view(N, Hkv, D)
        if L.q_norm is not None and L.k_norm is not None:
            q, k = self._rms(q, L.q_norm), self._rms(k, L.k_norm)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kc, vc = kv.k[li], kv.v[li]  # [num_slots, Hkv, D]
        kc.index_copy_(0, layout.write_slots, k)
        vc.index_copy_(0, layout.write_slots, v)
        return self._attention(q, kc, vc, layout, L.window)

    def _attention(
        self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, layout: AttentionLayout, window: int = 0
    ) -> torch.Tensor:
        N, H, D = q.shape
        if layout.kv_span is not None:  # one sequence in consecutive slots: a view, no copy
            a, b = layout.kv_span
            keys, values = kc[a:b][None].transpose(1, 2), vc[a:b][None].transpose(1, 2)  # [1, Hkv, S, D]
        else:
            keys = kc[layout.kv_gather].transpose(1, 2)  # [B, Hkv, S_max, D]
            values = vc[layout.kv_gather].transpose(1, 2)  # [B, Hkv, S_max, D]
        if layout.q_index is None:  # B == 1: the flat batch is the padded one
            Q = q.view(1, N, H, D).transpose(1, 2)  # [1, H, N, D]
        else:
            Q = q[layout.q_index].transpose(1, 2)  # [B, H, T_max, D]
        mask = layout.mask_for(window)
        out = F.scaled_dot_product_attention(
            Q, keys, values, attn_mask=mask, enable_gqa=True, scale=self.cfg.scale
        )  # [B, H, T, D]
        out = out.transpose(1, 2).reshape(-1, H * D)  # [B*T_max, H*D]
        return out if layout.unpad is None else out[layout.unpad]  # [N, H*D]


def _ancestry(parents: list[int], device: torch.device) -> torch.Tensor:
    """[n, n] bool: row i of a draft tree attends row j (j is i or one of its ancestors)."""
    n = len(parents)
    m = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            m[i] |= m[p]
    return m.to(device)
