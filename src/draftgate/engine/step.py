"""The speculative step: plan -> draft -> price -> one round on the target -> emit -> learn.

For a batch of running sequences, each with its ``Round`` record:

1. the policy plans each round: its source and the most drafts to ask for (``k``);
2. the drafter proposes up to k tokens per sequence;
3. the policy cuts each lookup draft to what its evidence pays for (``SpeculationPolicy.trim``);
4. the round target verifies every sequence's [pending token, drafts...] in one round
   (``engine.target``: for our runner, one ragged forward and one ``verify.verify_round`` call
   for the whole batch: deterministic drafts are verified by *matching* the target's own
   choice, identical to plain decoding with the same seed; drafts that carry a sampled q by
   exact rejection sampling) and rolls each sequence back to its accepted prefix;
5. emitted tokens are appended, cut exactly where plain decoding would stop (``kept``);
6. the policy learns the step's costs and each round's acceptance.

A drafter that raises, or returns a draft that does not fit the request (more than k tokens,
ids outside the vocabulary, q of the wrong shape), costs only the sequences concerned their
drafts: they decode plainly this round and their record says so (``draft_failed``); the rest of
the batch is untouched. A target that raises fails the whole step (the caller ends its requests).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from draftgate.drafters.base import Draft, Drafter, DraftRequest, draft_problem
from draftgate.engine.policy import SpeculationPolicy
from draftgate.engine.round import NO_DRAFT, Round
from draftgate.engine.target import RoundTarget

__all__ = ["speculative_step"]


def speculative_step(
    target: RoundTarget, drafter: Drafter | None, policy: SpeculationPolicy, rounds: Sequence[Round]
) -> None:
    """One round for every sequence in ``rounds``, filled in place (``kept``: what each emits).

    Timed for the policy: ``draft_s`` the draft call, ``forward_s`` everything else a round costs
    whether it drafts or not (planning, pricing, the target's round, the cut)."""
    t0 = time.perf_counter()
    policy.plan(rounds)  # 1. plan
    t1 = time.perf_counter()
    if drafter is not None and any(r.k for r in rounds):  # 2. draft (a sequence the drafter failed on is not shown)
        _draft(drafter, [r for r in rounds if not r.hidden], target.info.vocab_size)
    t2 = time.perf_counter()
    policy.trim(rounds)  # 3. price each lookup draft by its evidence
    target.run(rounds)  # 4. verify on the target, roll back to the accepted prefix
    for r in rounds:  # 5. emit, cut where plain decoding stops
        r.kept = r.seq.append(r.emitted) if r.error is None else []
    t3 = time.perf_counter()
    for r in rounds:
        r.draft_s, r.forward_s = t2 - t1, (t1 - t0) + (t3 - t2)
    policy.update(rounds)  # 6. learn: costs, acceptance, the drafter told


def _draft(drafter: Drafter, rounds: Sequence[Round], vocab_size: int) -> None:
    """Each round's draft (none where k == 0); ``draft_failed`` where drafting failed or did not fit."""
    reqs = [
        DraftRequest(r.seq_id, r.history, r.k, r.params, None if r.params.greedy or not r.k else r.uniforms_for(r.k))
        for r in rounds
    ]
    proposed: list[Draft | None]
    try:
        proposed = list(drafter.propose(reqs))
        if len(proposed) != len(reqs):
            raise ValueError(f"drafter returned {len(proposed)} drafts for {len(reqs)} requests")
    except Exception as e:
        # Find the culprits: one failing sequence (drafting or only showing its history) must not
        # cost the others their drafts. Alone, or timed out, asking again would only fail or wait again.
        if isinstance(e, TimeoutError) or len(reqs) <= 1:
            proposed = [None if q.k else NO_DRAFT for q in reqs]
        else:
            proposed = [_propose_one(drafter, q) if q.k else NO_DRAFT for q in reqs]
    for r, d in zip(rounds, proposed, strict=True):
        ok = r.k == 0 or (d is not None and draft_problem(d, r.k, vocab_size) is None)
        r.draft = d if ok and r.k and d is not None else NO_DRAFT
        r.draft_failed = not ok


def _propose_one(drafter: Drafter, req: DraftRequest) -> Draft | None:
    try:
        (d,) = drafter.propose([req])
    except Exception:
        return None
    return d
