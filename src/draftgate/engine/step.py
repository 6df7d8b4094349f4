"""The speculative step: draft -> one batched target forward -> verify -> rollback -> emit.

For a batch of running sequences with per-sequence draft lengths k_i:

1. the drafter proposes up to k_i tokens per sequence;
2. one ragged target forward runs [pending token, drafts...] for every sequence
   and returns logits at all k_i + 1 positions;
3. verification decides how many drafts each sequence keeps (jagged acceptance)
   and the one extra token it emits (recovered or bonus);
4. each sequence's KV is truncated to its accepted length (the rollback);
5. emitted tokens are appended, cut exactly where plain decoding would stop.

Step 3 is one call for the whole batch (``verify.verify_round``): deterministic
drafts (n-gram, suffix, greedy model: one-hot q) are verified by *matching* the
target's own choice (identical to plain decoding with the same seed), drafts that
carry a sampled q by exact rejection sampling.

A drafter that raises, or returns a draft that does not fit the request (more
than k tokens, ids outside the vocabulary, q of the wrong shape), costs only the
sequences concerned their drafts: they decode plainly this round and the result
flags them (DESIGN 5.3), the rest of the batch is untouched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftgate.drafters.base import Draft, Drafter, DraftRequest, SparseQ
from draftgate.engine.sequence import SequenceState
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.verify import RoundDraft, target_choice, verify_round

__all__ = ["StepResult", "speculative_step", "first_token"]

_NO_DRAFT = Draft(token_ids=[])


@dataclass(frozen=True)
class StepResult:
    emitted: list[list[int]]  # per sequence, tokens kept this round (after stop cuts)
    drafted: list[int]  # per sequence, draft tokens verified
    accepted: list[int]  # per sequence, drafts accepted
    draft_s: float
    forward_s: float
    forward_tokens: int
    draft_failed: list[bool]  # per sequence, the drafter raised or returned an invalid draft


def first_token(logits: torch.Tensor, seq: SequenceState) -> int:
    """The token plain decoding picks after the prompt: logits [1, V] (uniforms of output position 0)."""
    p = seq.params
    u = seq.rand.get(0, 1)  # [1, 2]
    one = lambda v, dt: torch.tensor([v], dtype=dt)  # noqa: E731
    choice = target_choice(logits, one(p.temperature, torch.float32), one(p.top_k, torch.int64),
                           one(p.top_p, torch.float32), u[:, 1])  # fmt: skip
    return int(choice[0])


def speculative_step(
    runner: ModelRunner, drafter: Drafter | None, seqs: Sequence[SequenceState], ks: Sequence[int]
) -> StepResult:
    # 1. Draft.
    t0 = time.perf_counter()
    drafts: list[Draft] = [_NO_DRAFT] * len(seqs)
    failed = [False] * len(seqs)
    if drafter is not None and any(ks):
        drafts, failed = _draft(drafter, seqs, ks, runner.vocab_size)
    t1 = time.perf_counter()

    # 2. One batched target forward over [pending, drafts...] per sequence.
    items = [
        ForwardItem(s.seq_id, [s.pending, *d.token_ids], len(d.token_ids) + 1)
        for s, d in zip(seqs, drafts, strict=True)
    ]
    out = runner.forward_flat(items)  # logits [sum(k_i + 1), V] and their argmax
    t2 = time.perf_counter()

    # 3. Verify the whole round in one call; 4. roll back each sequence's KV to its accepted prefix; 5. emit.
    round_drafts = [_round_draft(s, d) for s, d in zip(seqs, drafts, strict=True)]
    outcome = verify_round(out.logits, round_drafts, out.argmax)
    emitted = []
    for s, out, a in zip(seqs, outcome.emitted, outcome.accepted, strict=True):
        runner.truncate(s.seq_id, len(s.history) + a)  # KV keeps pending + accepted drafts
        emitted.append(s.append(out))
    drafted = [len(d.token_ids) for d in drafts]
    n_tok = sum(len(it.tokens) for it in items)
    return StepResult(emitted, drafted, outcome.accepted, t1 - t0, t2 - t1, n_tok, failed)


def _round_draft(s: SequenceState, d: Draft) -> RoundDraft:
    p, k = s.params, len(d.token_ids)
    q = (d.q.ids, d.q.probs) if isinstance(d.q, SparseQ) else d.q
    u = None if p.greedy else s.rand.get(len(s.output), k + 1)  # [k+1, 2] keyed by output position
    return RoundDraft(d.token_ids, p.temperature, p.top_k, p.top_p, u, q)


def _draft(
    drafter: Drafter, seqs: Sequence[SequenceState], ks: Sequence[int], vocab_size: int
) -> tuple[list[Draft], list[bool]]:
    """Drafts per sequence (none where k == 0) and which sequences' drafting failed."""
    reqs = [DraftRequest(s.seq_id, s.history, k, s.params) for s, k in zip(seqs, ks, strict=True)]
    proposed: list[Draft | None]
    try:
        proposed = list(drafter.propose(reqs))
        if len(proposed) != len(reqs):
            raise ValueError(f"drafter returned {len(proposed)} drafts for {len(reqs)} requests")
    except Exception:
        # Find the culprits: one failing sequence must not cost the others their drafts.
        proposed = [_propose_one(drafter, r) if r.k else _NO_DRAFT for r in reqs]
    drafts, failed = [], []
    for d, r in zip(proposed, reqs, strict=True):
        ok = r.k == 0 or (d is not None and _fits(d, r.k, vocab_size))
        drafts.append(d if ok and r.k and d is not None else _NO_DRAFT)
        failed.append(not ok)
    return drafts, failed


def _propose_one(drafter: Drafter, req: DraftRequest) -> Draft | None:
    try:
        (d,) = drafter.propose([req])
    except Exception:
        return None
    return d


def _fits(d: Draft, k: int, V: int) -> bool:
    """A draft the target can verify: at most k ids in [0, V), q (if any) [n, V] or sparse [n, M]."""
    n = len(d.token_ids)
    if n > k or any(not 0 <= t < V for t in d.token_ids):
        return False
    if isinstance(d.q, SparseQ):
        ids, probs = d.q.ids, d.q.probs
        in_vocab = ids.dtype == torch.int64 and bool(((ids >= 0) & (ids < V)).all())
        return ids.dim() == 2 and ids.shape == probs.shape and ids.shape[0] == n and in_vocab
    return d.q is None or tuple(d.q.shape) == (n, V)
