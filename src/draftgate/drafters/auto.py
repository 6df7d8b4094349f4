"""`auto`: the suffix drafter (which also covers n-gram prompt lookup) under the goodput controller.

The controller (engine.controller) chooses K per request from measured acceptance
and costs, down to 0; this class only picks the draft source.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftgate.drafters.base import Draft, DraftRequest
from draftgate.drafters.ngram import NgramDrafter
from draftgate.drafters.suffix import SuffixDrafter

__all__ = ["AutoDrafter"]


class AutoDrafter:
    """Per sequence, the longer of the suffix and n-gram proposals (both are free to compute)."""

    name = "auto"

    def __init__(self) -> None:
        self._suffix = SuffixDrafter()
        self._ngram = NgramDrafter()

    @classmethod
    def for_target(cls, target: object, cfg: object) -> AutoDrafter:
        return cls()

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        a = self._suffix.propose(requests)
        b = self._ngram.propose(requests)
        return [x if len(x.token_ids) >= len(y.token_ids) else y for x, y in zip(a, b, strict=True)]

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        self._suffix.observe(seq_id, tokens, num_drafted, num_accepted)
        self._ngram.observe(seq_id, tokens, num_drafted, num_accepted)

    def release(self, seq_id: int) -> None:
        self._suffix.release(seq_id)
        self._ngram.release(seq_id)
