"""The Drafter protocol: what every proposer (n-gram, suffix, model, remote) implements.

A drafter sees token histories, a per-sequence k and the sampling params, and
returns up to k draft tokens per sequence. Deterministic drafters (n-gram,
suffix, greedy model) return ids only: their q is one-hot. Sampled drafters
also return the exact distribution q each token was drawn from, dense
``[k, V]`` or sparse ``(ids [k, M], probs [k, M])``. After verification the
drafter is told the outcome so it can update caches or statistics.

What a drafter can do beyond that it declares in ``abilities`` (``Abilities``), never found
by probing: ``features`` (it reads the embedded target's hidden states: eagle, auto with a
draft head), ``lookup`` (its drafts are lookups: free to propose, with their evidence in
``Draft.context``; the engine asks for all a lookup has and prices each draft by its evidence),
``sources`` (it drafts from several sources, auto: which one drafts a sequence's next round; the
engine keeps one acceptance estimate per source), ``forget`` (it drops its memory of finished
requests: benchmark runs start from the same state).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from draftgate.types import SamplingParams

__all__ = [
    "DraftRequest",
    "Draft",
    "SparseQ",
    "Drafter",
    "Abilities",
    "FeatureReader",
    "Source",
    "SourceChooser",
    "mass_at_drafts",
    "is_one_hot",
    "draft_problem",
]


@dataclass(frozen=True)
class SparseQ:
    """q restricted to a support: probability 0 outside ``ids``."""

    ids: torch.Tensor  # [k, M] int64
    probs: torch.Tensor  # [k, M] float32, each row sums to 1 over its support


@dataclass(frozen=True)
class DraftRequest:
    seq_id: int
    tokens: Sequence[int]  # the full history (prompt + output so far); a live view, do not mutate
    k: int  # the most draft tokens wanted (0 means none)
    params: SamplingParams
    # Sampling requests: the target's uniforms for the k draft positions and the bonus, [k+1, 2]
    # float64 (u_accept, u_sample; engine.sequence.PositionRandom), None for greedy. Only for
    # one-hot drafts: a drafter may guess the token the target will sample at row i by inverse CDF
    # with u[i, 1] (verification by matching stays plain sampling whatever the guess). A drafter
    # that sends a sampled q must not use them (its q would depend on the target's acceptance draw).
    uniforms: torch.Tensor | None = None


@dataclass(frozen=True)
class Draft:
    token_ids: list[int]  # len <= k; empty when the drafter has nothing to propose
    q: torch.Tensor | SparseQ | None = None  # None: one-hot (deterministic draft); dense: [len, V]
    # A draft tree, for one-hot drafts: more nodes as (parent, token), node 0 the pending token,
    # 1..len(token_ids) the chain, then these in order (a parent comes before its children; siblings
    # carry different tokens; at most len(token_ids) of them, none deeper than the chain). A draft
    # head's runner-ups, say. A target that can verifies the tree in the same forward (a tree
    # attention mask) and keeps the path its own choices follow; one that cannot verifies the chain.
    # Every path is matched against the target's choices, so the output is the same either way.
    tree: tuple[tuple[int, int], ...] = ()
    # Evidence for a lookup draft: tokens of the history's end that matched where it was copied
    # from (0: not a lookup, or unknown). A target whose rounds are dear prices drafts by it.
    context: int = 0


class FeatureReader(Protocol):
    """A drafter that reads the target's hidden states (a draft head): the embedded target feeds it."""

    feature_layers: tuple[int, ...]

    def feed(self, seq_id: int, start: int, feats: torch.Tensor) -> None:
        """Features [m, len(feature_layers), C] of the committed positions start .. start + m - 1."""
        ...


@dataclass(frozen=True)
class Source:
    """Where a sequence's next draft comes from: a name that keys its acceptance and price, and
    whether it is a lookup (free to propose, evidence in ``Draft.context``: priced per draft)."""

    name: str
    lookup: bool = False


class SourceChooser(Protocol):
    """A drafter with several sources (lookup, a draft head) that says which drafts a sequence next."""

    def source(self, seq_id: int, tokens: Sequence[int], k_max: int) -> Source:
        """The source of the sequence's next round."""
        ...


@dataclass(frozen=True)
class Abilities:
    """What a drafter can do beyond propose / observe / release, declared by the drafter itself."""

    features: FeatureReader | None = None  # reads the embedded target's hidden states
    lookup: bool = False  # its drafts are lookups (one source; with several, each Source says)
    sources: SourceChooser | None = None  # drafts from several sources
    forget: Callable[[], None] | None = None  # drops its memory of finished requests


@runtime_checkable
class Drafter(Protocol):
    name: str
    abilities: Abilities
    # Whether drafts for sampling requests may carry a sampled q (verified by rejection sampling).
    # The engine then keeps a seeded request's K schedule independent of clocks and batches: with a
    # sampled q, which positions are drafted changes the tokens. False: one-hot drafts only.
    sampled_q: bool

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """One Draft per request, in order."""
        ...

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        """Verification outcome of the last round; ``tokens`` is the updated full history."""
        ...

    def release(self, seq_id: int) -> None:
        """The sequence ended: drop per-sequence state."""
        ...


def mass_at_drafts(d: Draft) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_i(x_i), sum of q_i) per draft position, both [k] (q None: one-hot, so ones)."""
    x = torch.tensor(d.token_ids, dtype=torch.int64)  # [k]
    if d.q is None:
        ones = torch.ones(len(d.token_ids))
        return ones, ones
    if isinstance(d.q, SparseQ):
        ids, probs = d.q.ids, d.q.probs.float()  # [k, M]
        return (probs * (ids == x[:, None])).sum(dim=1), probs.sum(dim=1)  # [k], [k]
    q = d.q.float()  # [k, V]
    return q.gather(1, x[:, None]).squeeze(1), q.sum(dim=1)  # [k], [k]


def is_one_hot(d: Draft) -> bool:
    """Every q row puts all its mass on the drafted token (a deterministic draft in disguise)."""
    at_x, total = mass_at_drafts(d)
    return bool((at_x == total).all())


Q_SUM_TOLERANCE = 1e-3  # a q row must sum to 1 within this (float32 softmax rows do, to ~1e-6)


def draft_problem(d: Draft, k: int, V: int) -> str | None:
    """Why the target cannot verify ``d`` exactly, or None if it can. The one validation of a draft.

    A draft must have at most k ids in [0, V); q, if any, dense ``[n, V]`` or sparse
    ``([n, M], [n, M])`` with ids in [0, V), every probability finite and >= 0, each row summing
    to 1, and each drafted token inside its own q (it was drawn from it). Every path (the
    embedded engine, a gRPC worker's session) treats a draft with a problem the same way: that
    request decodes plainly this round, nothing fails.
    """
    n = len(d.token_ids)
    if n > k:
        return f"{n} draft tokens for k = {k}"
    if any(not isinstance(t, int) or not 0 <= t < V for t in d.token_ids):
        return f"draft token ids must be in [0, {V})"
    if d.tree:
        if d.q is not None or len(d.tree) > n:
            return "a draft tree needs a one-hot draft with at least as many chain tokens as tree nodes"
        seen = {(i, t) for i, t in enumerate(d.token_ids)}  # (parent, token) of every node so far
        depth = list(range(n + 1))
        for node, (parent, t) in enumerate(d.tree, start=n + 1):
            if not isinstance(parent, int) or not 0 <= parent < node:
                return f"tree node {node}'s parent must be an earlier node, got {parent!r}"
            depth.append(depth[parent] + 1)
            if depth[-1] > n:
                return f"tree node {node} lies deeper than the chain's {n} tokens"
            if not isinstance(t, int) or not 0 <= t < V:
                return f"tree token ids must be in [0, {V})"
            if (parent, t) in seen:
                return f"tree node {node} repeats a sibling's token {t}"
            seen.add((parent, t))
    if d.q is None:
        return None
    if isinstance(d.q, SparseQ):
        ids, probs = d.q.ids, d.q.probs
        if ids.dim() != 2 or ids.shape != probs.shape or ids.shape[0] != n or ids.dtype != torch.int64:
            return "sparse q must be int64 ids [n, M] and probs [n, M] for n draft tokens"
        if n and not bool(((ids >= 0) & (ids < V)).all()):
            return f"sparse q ids must be in [0, {V})"
    elif d.q.dim() != 2 or tuple(d.q.shape) != (n, V):
        return f"dense q must be [{n}, {V}]"
    if n == 0:
        return None
    probs = (d.q.probs if isinstance(d.q, SparseQ) else d.q).float()
    if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
        return "q probabilities must be finite and >= 0"
    at_x, total = mass_at_drafts(d)
    if bool(((total - 1.0).abs() > Q_SUM_TOLERANCE).any()):
        return "each q row must sum to 1"
    if not bool((at_x > 0).all()):
        return "a draft token lies outside the q it was drawn from"
    return None
