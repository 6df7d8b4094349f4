"""The speculative step: draft -> one round on the target -> emit.

For a batch of running sequences with per-sequence draft lengths k_i:

1. the drafter proposes up to k_i tokens per sequence;
2. the round target verifies every sequence's [pending token, drafts...] in one round
   (``engine.target``: for our runner, one ragged forward and one ``verify.verify_round``
   call for the whole batch: deterministic drafts are verified by *matching* the target's own
   choice, identical to plain decoding with the same seed; drafts that carry a sampled q by
   exact rejection sampling) and rolls each sequence back to its accepted prefix;
3. emitted tokens are appended, cut exactly where plain decoding would stop.

A drafter that raises, or returns a draft that does not fit the request (more
than k tokens, ids outside the vocabulary, q of the wrong shape), costs only the
sequences concerned their drafts: they decode plainly this round and the result
flags them (DESIGN 5.3), the rest of the batch is untouched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from draftgate.drafters.base import Draft, Drafter, DraftRequest, draft_problem
from draftgate.engine.sequence import SequenceState
from draftgate.engine.target import RoundTarget, RoundWork

__all__ = ["SeqRound", "StepResult", "speculative_step", "round_work"]

_NO_DRAFT = Draft(token_ids=[])


@dataclass(frozen=True)
class SeqRound:
    """One sequence's round: what it drafted and what the target made of it."""

    drafted: int  # draft tokens verified
    accepted: int  # drafts accepted
    emitted: list[int]  # tokens kept (accepted + recovered or bonus, after stop cuts)
    draft_failed: bool = False  # the drafter raised or returned an invalid draft for it
    sampled: bool = False  # its drafts came with a sampled q (rejection sampling, not matching)
    error: str | None = None  # the target's error (the request ends), else None
    approximate: bool = False  # verified by an approximation the route allowed
    branch_rows: int = 0  # forward rows the target ran for its draft tree's nodes (Draft.tree)
    fallback: bool = False  # the target could not score its drafts: it decoded plainly instead
    target_decoded: bool = False  # sampled by the target's own decoding


@dataclass(frozen=True)
class StepResult:
    rounds: list[SeqRound]  # one per sequence, in order
    draft_s: float
    forward_s: float
    forward_tokens: int  # rows of the round's forward (k + 1 per sequence, plus tree rows)


def speculative_step(
    target: RoundTarget,
    drafter: Drafter | None,
    seqs: Sequence[SequenceState],
    ks: Sequence[int],
    hidden: Sequence[bool] | None = None,
) -> StepResult:
    """One round; ``hidden[i]``: the drafter does not see sequence i (it failed on it before)."""
    # 1. Draft.
    t0 = time.perf_counter()
    drafts: list[Draft] = [_NO_DRAFT] * len(seqs)
    failed = [False] * len(seqs)
    if drafter is not None and any(ks):
        shown = [i for i in range(len(seqs)) if not (hidden and hidden[i])]
        got, bad = _draft(drafter, [seqs[i] for i in shown], [ks[i] for i in shown], target.info.vocab_size)
        for i, d, f in zip(shown, got, bad, strict=True):
            drafts[i], failed[i] = d, f
    t1 = time.perf_counter()

    # 2. One round on the target: verify every sequence's drafts, roll each back to its accepted prefix.
    done = target.run([round_work(s, d) for s, d in zip(seqs, drafts, strict=True)])
    t2 = time.perf_counter()

    # 3. Emit, cut where plain decoding stops.
    rounds = [
        SeqRound(
            0 if r.declined else len(d.token_ids), r.accepted, s.append(r.emitted) if r.error is None else [], f,
            bool(d.token_ids) and d.q is not None and not s.params.greedy, r.error, r.approximate, r.branch_rows,
            r.fallback, r.target_decoded,
        )  # fmt: skip
        for s, d, f, r in zip(seqs, drafts, failed, done, strict=True)
    ]
    n_tok = sum(x.drafted + 1 + x.branch_rows for x in rounds)  # a branch the target skipped ran no rows
    return StepResult(rounds, t1 - t0, t2 - t1, n_tok)


def round_work(s: SequenceState, d: Draft) -> RoundWork:
    """What the target gets of a sequence this round (the uniforms of its next k+1 output positions)."""
    k = len(d.token_ids)
    u = None if s.params.greedy else s.rand.get(len(s.output), k + 1)  # [k+1, 2]
    return RoundWork(s.seq_id, s.history, s.params, d, u, s.params.max_new_tokens - len(s.output))


def _draft(
    drafter: Drafter, seqs: Sequence[SequenceState], ks: Sequence[int], vocab_size: int
) -> tuple[list[Draft], list[bool]]:
    """Drafts per sequence (none where k == 0) and which sequences' drafting failed."""
    reqs = [
        DraftRequest(s.seq_id, s.history, k, s.params, None if s.params.greedy or not k else s.rand.get(len(s.output), k + 1))
        for s, k in zip(seqs, ks, strict=True)
    ]  # fmt: skip
    proposed: list[Draft | None]
    try:
        proposed = list(drafter.propose(reqs))
        if len(proposed) != len(reqs):
            raise ValueError(f"drafter returned {len(proposed)} drafts for {len(reqs)} requests")
    except Exception as e:
        # Find the culprits: one failing sequence (drafting or only showing its history) must not
        # cost the others their drafts. Alone, or timed out, asking again would only fail or wait again.
        if isinstance(e, TimeoutError) or len(reqs) <= 1:
            proposed = [None if r.k else _NO_DRAFT for r in reqs]
        else:
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
    return draft_problem(d, k, V) is None
