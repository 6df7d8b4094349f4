"""The draft being distilled: a small trainable Llama with the runner's exact math.

Same RMSNorm, RoPE (``rope_inv_freq``), GQA attention and SwiGLU as
``draftgate.models.llama.LlamaModel``, written as an ``nn.Module`` over dense
[B, T] batches so it can be trained; ``hf_weights()`` exports it under HF names
(plus the vocabulary subset), so the folder it is saved to runs on our runner
as the ``model`` drafter. A parity test checks the two forwards agree.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from draftgate.models.config import ModelConfig, rope_inv_freq
from draftgate.models.llama import VOCAB_SUBSET_KEY
from draftgate.models.loader import LoadedModel

__all__ = ["DraftLM", "draft_config", "pick_layers"]


def pick_layers(n_target: int, n_draft: int) -> list[int]:
    """Evenly spaced target layers to copy, always the first and the last: 30 -> 4 gives [0, 10, 19, 29]."""
    if n_draft >= n_target:
        return list(range(n_target))
    if n_draft == 1:
        return [0]
    return [round(i * (n_target - 1) / (n_draft - 1)) for i in range(n_draft)]


def draft_config(target: ModelConfig, layers: int, hidden: int | None) -> ModelConfig:
    """The draft's shape: the target's width by default (so it can start from the target's weights)."""
    if hidden is None or hidden == target.hidden_size:
        return replace(target, num_layers=layers, tie_word_embeddings=False)
    head_dim = 64 if hidden % 64 == 0 else target.head_dim
    if hidden % head_dim:
        raise ValueError(f"--hidden {hidden} must be a multiple of the head size {head_dim}")
    heads = hidden // head_dim
    ratio = max(1, target.num_heads // target.num_kv_heads)
    kv = max(1, heads // ratio) if heads % max(1, heads // ratio) == 0 else heads
    inter = int(round(hidden * target.intermediate_size / target.hidden_size / 64)) * 64
    return replace(
        target,
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=max(64, inter),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        tie_word_embeddings=False,
    )


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        C, D, H, Hkv, Fh = (cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size)
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, Hkv * D, bias=False)
        self.v_proj = nn.Linear(C, Hkv * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.gate_proj = nn.Linear(C, Fh, bias=False)
        self.up_proj = nn.Linear(C, Fh, bias=False)
        self.down_proj = nn.Linear(Fh, C, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(C))
        self.post_attention_layernorm = nn.Parameter(torch.ones(C))


class DraftLM(nn.Module):
    """tokens [B, T] -> logits [B, T, Vs] over ``out_ids`` (the full vocabulary when no subset)."""

    def __init__(self, cfg: ModelConfig, out_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        C = cfg.hidden_size
        self.embed = nn.Embedding(cfg.vocab_size, C)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(C))
        n_out = cfg.vocab_size if out_ids is None else int(out_ids.numel())
        self.head = nn.Linear(C, n_out, bias=False)
        self.register_buffer("out_ids", out_ids.clone() if out_ids is not None else None)
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)  # [D/2]
        for p in self.parameters():
            if p.ndim == 2:
                nn.init.normal_(p, std=0.02)

    @classmethod
    def from_target(
        cls, target: LoadedModel, cfg: ModelConfig, out_ids: torch.Tensor | None, layers: list[int] | None
    ) -> DraftLM:
        """Start from the target: its embeddings, head rows and (same width) the given layers."""
        m = cls(cfg, out_ids)
        w = target.weights
        if cfg.hidden_size != target.config.hidden_size:
            return m  # a narrower draft starts from scratch
        with torch.no_grad():
            emb = w["model.embed_tokens.weight"].float()  # [V, C]
            m.embed.weight.copy_(emb)
            head = emb if target.config.tie_word_embeddings else w["lm_head.weight"].float()  # [V, C]
            m.head.weight.copy_(head if out_ids is None else head[out_ids])
            m.norm.copy_(w["model.norm.weight"].float())
            for blk, li in zip(m.blocks, layers or [], strict=False):
                p = f"model.layers.{li}."
                for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(blk, name).weight.copy_(w[p + f"self_attn.{name}.weight"].float())
                for name in ("gate_proj", "up_proj", "down_proj"):
                    getattr(blk, name).weight.copy_(w[p + f"mlp.{name}.weight"].float())
                blk.input_layernorm.copy_(w[p + "input_layernorm.weight"].float())
                blk.post_attention_layernorm.copy_(w[p + "post_attention_layernorm.weight"].float())
        return m

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        B, T = tokens.shape
        H, Hkv, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        pos = torch.arange(T, device=tokens.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]  # [T, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [T, D]
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, T, D]
        x = self.embed(tokens)  # [B, T, C]
        for blk in self.blocks:
            h = self._rms(x, blk.input_layernorm)
            q = blk.q_proj(h).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
            k = blk.k_proj(h).view(B, T, Hkv, D).transpose(1, 2)  # [B, Hkv, T, D]
            v = blk.v_proj(h).view(B, T, Hkv, D).transpose(1, 2)  # [B, Hkv, T, D]
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B, H, T, D]
            x = x + blk.o_proj(a.transpose(1, 2).reshape(B, T, H * D))
            h = self._rms(x, blk.post_attention_layernorm)
            x = x + blk.down_proj(F.silu(blk.gate_proj(h)) * blk.up_proj(h))
        return self.head(self._rms(x, self.norm))  # [B, T, Vs]

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """HF names, [out, in] weights, plus ``draftgate.vocab_subset`` when the head is reduced."""
        out: dict[str, torch.Tensor] = {
            "model.embed_tokens.weight": self.embed.weight,
            "model.norm.weight": self.norm,
            "lm_head.weight": self.head.weight,
        }
        for i, blk in enumerate(self.blocks):
            p = f"model.layers.{i}."
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[p + f"self_attn.{name}.weight"] = getattr(blk, name).weight
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{name}.weight"] = getattr(blk, name).weight
            out[p + "input_layernorm.weight"] = blk.input_layernorm
            out[p + "post_attention_layernorm.weight"] = blk.post_attention_layernorm
        res = {k: v.detach().float().contiguous().clone() for k, v in out.items()}
        if self.out_ids is not None:
            res[VOCAB_SUBSET_KEY] = self.out_ids.clone()
        return res


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
