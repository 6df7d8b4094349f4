"""Verify K draft tokens against one target forward, for a batch of sequences.

Glossary (paper notation, used everywhere in draftgate):

- p: the target distribution, q: the draft distribution, both after the
  request's temperature/top-k/top-p (``draftgate.sampling.logits_to_probs``).
- K: draft tokens per round; row b has ``k_b = draft_lens[b] <= K`` of them,
  the rest of its row is padding and is ignored.
- accepted: a draft token the target keeps. Greedy: it equals the target's
  argmax. Sampling: draft x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)).
- recovered: at the first rejected position j, the token sampled instead from
  the residual norm(max(0, p_j - q_j)) over the full vocabulary.
- bonus: when all k_b drafts are accepted, one more token sampled from p at
  position k_b (the target already computed it, so it is free).

Every row emits ``num_accepted + 1`` tokens. The output distribution is exactly
the target's (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model
Decoding with Speculative Sampling").

Randomness comes in as uniforms drawn by the caller from per-sequence
generators (the engine's ``PositionRandom``, keyed by output position); nothing
here draws any.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from draftgate.sampling.transforms import sample_from_probs

__all__ = ["VerifyResult", "verify_greedy", "verify_sampling", "DraftQ"]

# q as the drafter sent it: None (one-hot at the draft ids: deterministic drafter),
# dense [B, K, V], or sparse (ids [B, K, M] int64, probs [B, K, M]), 0 outside ids.
DraftQ = Tensor | tuple[Tensor, Tensor] | None


@dataclass(frozen=True)
class VerifyResult:
    tokens: Tensor  # [B, K+1] int64 emitted tokens, padded with -1 after the last one
    num_accepted: Tensor  # [B] int64 accepted drafts; row b emits num_accepted[b] + 1 tokens


def _check_drafts(draft_ids: Tensor, draft_lens: Tensor, target: Tensor) -> tuple[int, int, int]:
    B, K = draft_ids.shape
    assert draft_lens.shape == (B,), f"draft_lens must be [{B}], got {tuple(draft_lens.shape)}"
    assert target.dim() == 3 and target.shape[:2] == (B, K + 1), (
        f"target must be [{B}, {K + 1}, V], got {tuple(target.shape)}"
    )
    return B, K, target.shape[2]


def _accepted_prefix(accepted: Tensor, draft_lens: Tensor) -> Tensor:
    """Length ``[B]`` of the all-accepted prefix of ``accepted [B, K]``, ignoring padding."""
    B, K = accepted.shape
    valid = torch.arange(K, device=accepted.device)[None, :] < draft_lens[:, None]  # [B, K]
    return (accepted & valid).long().cumprod(dim=1).sum(dim=1)  # [B]


def _emit(draft_ids: Tensor, num_accepted: Tensor, last: Tensor) -> VerifyResult:
    """Accepted drafts, then ``last [B]`` (recovered or bonus), then -1 padding."""
    B, K = draft_ids.shape
    pos = torch.arange(K + 1, device=draft_ids.device)[None, :]  # [1, K+1]
    n = num_accepted[:, None]  # [B, 1]
    drafts = torch.cat([draft_ids, draft_ids.new_full((B, 1), -1)], dim=1)  # [B, K+1]
    tokens = torch.where(pos < n, drafts, torch.where(pos == n, last[:, None], -1))  # [B, K+1]
    return VerifyResult(tokens=tokens.long(), num_accepted=num_accepted)


def verify_greedy(draft_ids: Tensor, draft_lens: Tensor, target_logits: Tensor) -> VerifyResult:
    """Accept the longest prefix of drafts equal to the target's argmax.

    draft_ids ``[B, K]`` int64, draft_lens ``[B]`` int64, target_logits ``[B, K+1, V]``.
    The token after the accepted prefix is the argmax at that position: recovered
    on a mismatch, bonus when all k_b drafts matched.
    """
    _check_drafts(draft_ids, draft_lens, target_logits)
    K = draft_ids.shape[1]
    argmax = target_logits.argmax(dim=-1)  # [B, K+1]
    num_accepted = _accepted_prefix(draft_ids == argmax[:, :K], draft_lens)  # [B]
    last = argmax.gather(1, num_accepted[:, None]).squeeze(1)  # [B]
    return _emit(draft_ids, num_accepted, last)


def _check_q(q: DraftQ, B: int, K: int, V: int) -> None:
    if isinstance(q, Tensor):
        assert q.shape == (B, K, V), f"dense q must be [{B}, {K}, {V}], got {tuple(q.shape)}"
    elif q is not None:
        q_ids, q_probs = q
        assert q_ids.dim() == 3 and q_ids.shape[:2] == (B, K) and q_probs.shape == q_ids.shape, (
            f"sparse q must be ([{B}, {K}, M], [{B}, {K}, M]), got {tuple(q_ids.shape)}, {tuple(q_probs.shape)}"
        )


def _q_of_drafts(q: DraftQ, draft_ids: Tensor) -> Tensor:
    """q_i(x_i) ``[B, K]``: the draft's probability of each drafted token."""
    if q is None:
        return torch.ones(draft_ids.shape, device=draft_ids.device)  # [B, K]
    if isinstance(q, Tensor):
        return q.float().gather(2, draft_ids[..., None]).squeeze(2)  # [B, K]
    q_ids, q_probs = q  # [B, K, M], [B, K, M]
    return (q_probs.float() * (q_ids == draft_ids[..., None])).sum(dim=2)  # [B, K]


def _q_at(q: DraftQ, draft_ids: Tensor, j: Tensor, V: int) -> Tensor:
    """The whole vector q_j ``[B, V]`` at position ``j [B]`` (each j < K)."""
    rows = torch.arange(draft_ids.shape[0], device=draft_ids.device)  # [B]
    if q is None:
        ids = draft_ids[rows, j]  # [B]
        one_hot = torch.zeros(ids.shape[0], V, device=ids.device)  # [B, V]
        return one_hot.scatter_(1, ids[:, None], 1.0)  # [B, V]
    if isinstance(q, Tensor):
        return q[rows, j].float()  # [B, V]
    q_ids, q_probs = q  # [B, K, M], [B, K, M]
    ids, probs = q_ids[rows, j], q_probs[rows, j].float()  # [B, M], [B, M]
    return torch.zeros(ids.shape[0], V, device=ids.device).scatter_add_(1, ids, probs)  # [B, V]


def verify_sampling(
    draft_ids: Tensor, draft_lens: Tensor, p: Tensor, q: DraftQ, uniforms_accept: Tensor, uniforms_sample: Tensor
) -> VerifyResult:
    """Exact speculative sampling (accepted drafts + one recovered or bonus token).

    draft_ids ``[B, K]`` int64 (padding past draft_lens may be any value, e.g. -1),
    draft_lens ``[B]``, p ``[B, K+1, V]`` target probabilities after the request's
    transforms, q as in ``DraftQ`` (the exact distribution each draft was drawn
    from, after the same transforms), uniforms_accept ``[B, K]`` and
    uniforms_sample ``[B]`` in [0, 1), or ``[B, K+1]``: one per position, of which
    the one at the stopping position num_accepted is used (callers that key
    randomness by output position use this so no uniform is ever used twice).
    """
    B, K, V = _check_drafts(draft_ids, draft_lens, p)
    if uniforms_sample.dim() == 2:
        assert uniforms_sample.shape == (B, K + 1)
    assert uniforms_accept.shape == (B, K) and uniforms_sample.shape[0] == B
    _check_q(q, B, K, V)
    p = p.float()
    valid = torch.arange(K, device=p.device)[None, :] < draft_lens[:, None]  # [B, K]
    x = torch.where(valid, draft_ids, 0).long()  # [B, K] padding -> a harmless id

    # 1. Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), i.e. u * q < p.
    p_x = p[:, :K].gather(2, x[..., None]).squeeze(2)  # [B, K]
    q_x = _q_of_drafts(q, x)  # [B, K]
    num_accepted = _accepted_prefix(uniforms_accept * q_x < p_x, draft_lens)  # [B]

    # 2. The last token comes from position j = num_accepted: the first rejection
    #    (recovered, from the residual) or k_b (bonus, from p itself).
    rows = torch.arange(B, device=p.device)  # [B]
    p_j = p[rows, num_accepted]  # [B, V]
    rejected = num_accepted < draft_lens  # [B]
    if K > 0:
        q_j = _q_at(q, x, num_accepted.clamp(max=K - 1), V)  # [B, V]
        residual = (p_j - q_j).clamp(min=0)  # [B, V] the full q_j vector, not q_j(x_j)
        # p == q leaves no residual; rejecting then has probability 0, but fall back to p.
        usable = rejected & (residual.sum(dim=1) > 0)  # [B]
        dist = torch.where(usable[:, None], residual, p_j)  # [B, V]
    else:
        dist = p_j  # [B, V]

    # 3. Sample it (sample_from_probs normalises).
    if uniforms_sample.dim() == 2:
        uniforms_sample = uniforms_sample.gather(1, num_accepted[:, None]).squeeze(1)  # [B]
    last = sample_from_probs(dist, uniforms_sample)  # [B]
    return _emit(draft_ids, num_accepted, last)
