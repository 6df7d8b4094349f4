"""Turn logits into the distribution a request samples from, and sample from it.

The same function builds p (target) and q (draft): lossless speculative decoding
needs both sides to go through identical transforms (temperature, then top-k,
then top-p, the HF/vLLM order).

Randomness never comes from a global: callers draw uniforms from each
sequence's own ``torch.Generator`` (the engine's ``PositionRandom``; ``draw_uniforms``
for batches of generators) and pass them in, so a seeded request is reproducible
whatever else shares its batch.

Deviation from HF/vLLM, flagged: top-k and top-p cut at a logit *value*, so
tokens tied with the last kept token are kept too. The kept set then depends
only on the logits, never on how a sort orders ties.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["logits_to_probs", "sample_from_probs", "draw_uniforms"]

Param = float | int | Tensor  # a python scalar (whole batch) or a [N] tensor (per row)


def _per_row(value: Param, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Broadcast a scalar or [N] parameter to a [N] tensor."""
    t = torch.as_tensor(value, dtype=dtype, device=device)
    if t.dim() == 0:
        return t.expand(n)
    assert t.shape == (n,), f"per-row parameter must have shape [{n}], got {tuple(t.shape)}"
    return t


def logits_to_probs(logits: Tensor, temperature: Param, top_k: Param, top_p: Param) -> Tensor:
    """Probabilities ``[N, V]`` (float32) after temperature, top-k and top-p.

    logits: ``[N, V]``, any float dtype (computed in float32). Each parameter is a
    python scalar or a ``[N]`` tensor. temperature == 0 means greedy: a one-hot at
    argmax (ties: lowest index). top_k == 0 and top_p >= 1.0 disable their filter.
    top-p keeps the smallest prefix of the sorted distribution whose mass is
    >= top_p (at least one token), measured after top-k.
    """
    assert logits.dim() == 2, f"logits must be [N, V], got {tuple(logits.shape)}"
    N, V = logits.shape
    dev = logits.device
    x = logits.float()  # [N, V]
    temp = _per_row(temperature, N, torch.float32, dev)  # [N]
    k = _per_row(top_k, N, torch.int64, dev)  # [N]
    top_p_ = _per_row(top_p, N, torch.float32, dev)  # [N]

    greedy = temp <= 0  # [N]
    safe_temp = torch.where(greedy, torch.ones_like(temp), temp)  # [N]
    # Subtract the row max first: a tiny temperature then gives -inf, never +inf/NaN.
    scaled = (x - x.amax(dim=-1, keepdim=True)) / safe_temp[:, None]  # [N, V]

    sorted_logits, _ = scaled.sort(dim=-1, descending=True)  # [N, V]
    # top-k: threshold at the k-th largest value.
    k_eff = torch.where(k <= 0, torch.full_like(k, V), k.clamp(max=V))  # [N]
    kth = sorted_logits.gather(1, (k_eff - 1)[:, None])  # [N, 1]
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))  # [N, V]

    # top-p: keep sorted token i while the mass strictly before it is < top_p.
    sorted_probs = sorted_logits.softmax(dim=-1)  # [N, V]
    cum = sorted_probs.cumsum(dim=-1)  # [N, V]
    mass_before = torch.cat([torch.zeros_like(cum[:, :1]), cum[:, :-1]], dim=1)  # [N, V]
    n_keep = (mass_before < top_p_[:, None]).sum(dim=-1).clamp(min=1)  # [N]
    n_keep = torch.where(top_p_ >= 1.0, torch.full_like(n_keep, V), n_keep)  # [N]
    pth = sorted_logits.gather(1, (n_keep - 1)[:, None])  # [N, 1]

    threshold = torch.maximum(kth, pth)  # [N, 1]
    probs = scaled.masked_fill(scaled < threshold, float("-inf")).softmax(dim=-1)  # [N, V]

    one_hot = torch.zeros_like(probs).scatter_(1, x.argmax(dim=-1, keepdim=True), 1.0)  # [N, V]
    return torch.where(greedy[:, None], one_hot, probs)  # [N, V]


def sample_from_probs(probs: Tensor, uniforms: Tensor) -> Tensor:
    """Inverse-CDF sample ``[N]`` int64 from ``probs [N, V]`` with ``uniforms [N]`` in [0, 1).

    Rows need not be normalised (a residual can be passed as is). A token of
    probability 0 is never returned, even when ``u * total`` rounds up to the total.
    """
    assert probs.dim() == 2, f"probs must be [N, V], got {tuple(probs.shape)}"
    N, V = probs.shape
    assert uniforms.shape == (N,), f"uniforms must be [{N}], got {tuple(uniforms.shape)}"
    cdf = probs.double().cumsum(dim=-1)  # [N, V]
    target = uniforms.double() * cdf[:, -1]  # [N]
    # First index whose cdf exceeds the target: a zero-probability entry never
    # increases the cdf, so it can only be chosen by running off the end.
    idx = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)  # [N]
    positive = probs > 0  # [N, V]
    last_positive = (V - 1) - positive.flip(dims=[1]).int().argmax(dim=-1)  # [N]
    return torch.minimum(idx, last_positive)  # [N] int64


def draw_uniforms(
    generators: Sequence[torch.Generator | None], n: int, device: torch.device | str, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Uniforms in [0, 1), ``[len(generators), n]``: row i from ``generators[i]``.

    A None generator uses torch's default generator. Each row is drawn on its
    generator's own device and then moved, so a CPU generator serves a CUDA batch.
    For a seeded request to be reproducible whatever shares its batch, callers
    should draw a fixed ``n`` per round (e.g. the configured maximum K, plus one),
    not one that depends on the batch.
    """
    rows = [torch.rand(n, generator=g, dtype=dtype, device=g.device if g is not None else device) for g in generators]
    if not rows:
        return torch.empty(0, n, dtype=dtype, device=device)  # [0, n]
    return torch.stack([r.to(device) for r in rows])  # [G, n]
