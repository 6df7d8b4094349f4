"""Rotary position embedding of the PyTorch paths (``llama.LlamaModel`` and ``eagle.EagleHead``):
rotate-half RoPE, the angles computed in float32 as transformers does.

The native kernels' RoPE is models/native/rows.h; the frequencies are ``config.rope_inv_freq``.
"""

from __future__ import annotations

import torch

__all__ = ["rope_cos_sin", "apply_rope"]


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, D] (float32) at positions [T] for frequencies inv_freq [D/2]."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)  # [T, D]
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., D] rotated by angles cos, sin (broadcast to x): x * cos + rotate_half(x) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin
