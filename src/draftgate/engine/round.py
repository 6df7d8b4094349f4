"""One sequence's round, as one record filled in place: plan -> draft -> target -> outcome.

The engine makes a ``Round`` for every running sequence each turn and hands the same objects
along: the policy writes the plan (``k``, ``source``), the step writes the draft, the round
target (``engine.target``) writes what it made of it (``emitted``, ``accepted`` and its flags),
the step cuts ``emitted`` where plain decoding stops (``kept``), and the policy's update and the
request's stats read the finished record. Nothing copies it.

Glossary (paper notation): K drafts are *proposed*; the target keeps the first ``accepted`` of
them and adds one token of its own (*recovered* after a mismatch, *bonus* when every draft
matched), so a round emits ``accepted + 1`` tokens before stop cuts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from draftgate.drafters.base import Draft
from draftgate.engine.sequence import PositionRandom
from draftgate.types import SamplingParams

__all__ = ["Round", "SequenceView", "NO_DRAFT"]

NO_DRAFT = Draft(token_ids=[])


class SequenceView(Protocol):
    """What a round reads of its sequence (``engine.sequence.SequenceState`` in the engine; the vLLM
    proposer keeps a smaller one): its id, history, output so far, params and uniforms."""

    seq_id: int
    history: list[int]  # prompt + output so far
    output: list[int]
    params: SamplingParams
    rand: PositionRandom  # position-keyed uniforms (read for sampled requests only)

    def append(self, tokens: Sequence[int]) -> list[int]:
        """Add emitted tokens, cut at the stop rules; the ones kept (the engine's step calls it)."""
        ...


@dataclass(eq=False)
class Round:
    """One sequence's round (or its opening: the prompt's prefill and first token, no drafts)."""

    seq: SequenceView
    k_max: int = 0  # the most drafts this sequence's KV reserve allows in a round
    # 1. The plan (engine.policy).
    k: int = 0  # the most drafts asked of the drafter (0: a plain round)
    source: str = ""  # the draft source asked ("" without a drafter)
    lookup: bool = False  # the source is a lookup: its draft is priced after it is proposed (policy.trim)
    lag: int = 0  # tokens the source has not drafted over (0 if it drafted the previous round)
    seen: int = 0  # the history's length when planned (what the source drafted from)
    hidden: bool = False  # the drafter failed on this sequence before: it is not shown again
    probe: bool = False  # the round drafts to measure, not because it is expected to pay
    # 2. The draft (engine.step).
    draft: Draft = NO_DRAFT
    draft_failed: bool = False  # the drafter raised or returned a draft that does not fit
    # 3. What the target made of it (RoundTarget.open / run).
    emitted: list[int] = field(default_factory=list)  # accepted drafts + recovered or bonus token
    accepted: int = 0  # drafts accepted
    error: str | None = None  # this sequence's target failed: the request ends with it
    approximate: bool = False  # verified by an approximation a route allowed
    branch_rows: int = 0  # forward rows run for the draft's tree nodes (0: none, or skipped)
    fallback: bool = False  # scoring the drafts failed: the target's plain next token instead
    target_decoded: bool = False  # sampled by the target's own decoding (exact by construction)
    declined: bool = False  # the target did not score the drafts (not worth its price): a plain round
    # 4. The outcome (engine.step).
    kept: list[int] = field(default_factory=list)  # emitted, cut where plain decoding stops
    draft_s: float = 0.0  # the step's draft call (every sequence waits for all of it)
    forward_s: float = 0.0  # the step's round on the target

    # ---------------------------------------------------------------- views of the sequence

    @property
    def seq_id(self) -> int:
        return self.seq.seq_id

    @property
    def history(self) -> Sequence[int]:
        """Prompt + output so far; ``history[-1]`` is the pending token (not in the target's KV)."""
        return self.seq.history

    @property
    def params(self) -> SamplingParams:
        return self.seq.params

    @property
    def remaining(self) -> int:
        """Output tokens the request may still emit."""
        return self.seq.params.max_new_tokens - len(self.seq.output)

    @property
    def uniforms(self) -> Tensor | None:
        """The uniforms of the round's positions: ``uniforms_for`` the draft's length."""
        return self.uniforms_for(len(self.draft.token_ids))

    def uniforms_for(self, k: int) -> Tensor | None:
        """[k+1, 2] (u_accept, u_sample) of the next k+1 output positions; None for greedy. Keyed by
        position: a seeded request gets the same tokens on every target and with any drafts."""
        if self.seq.params.greedy:
            return None
        return self.seq.rand.get(len(self.seq.output), k + 1)

    @property
    def drafted(self) -> int:
        """Drafts the target verified (0 when it declined them)."""
        return 0 if self.declined else len(self.draft.token_ids)

    @property
    def rows(self) -> int:
        """Forward rows this round put on the target: the pending token, the drafts, the tree nodes."""
        return self.drafted + 1 + self.branch_rows

    @property
    def sampled(self) -> bool:
        """Its drafts came with a sampled q (rejection sampling, not matching)."""
        return bool(self.draft.token_ids) and self.draft.q is not None and not self.params.greedy

    def done(
        self,
        emitted: Sequence[int],
        accepted: int = 0,
        *,
        branch_rows: int = 0,
        approximate: bool = False,
        fallback: bool = False,
        target_decoded: bool = False,
        declined: bool = False,
    ) -> None:
        """The target's answer for this sequence (the outcome fields above)."""
        self.emitted, self.accepted, self.branch_rows = list(emitted), accepted, branch_rows
        self.approximate, self.fallback, self.target_decoded, self.declined = (
            approximate,
            fallback,
            target_decoded,
            declined,
        )

    def fail(self, error: str) -> None:
        """This sequence's target failed: the request ends with ``error``."""
        self.emitted, self.accepted, self.error = [], 0, error
