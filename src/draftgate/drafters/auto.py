"""`auto`: free lookup drafts (suffix + n-gram) first, a model draft where lookup finds little.

With ``--draft-head DIR`` the model is a draft head on the target's hidden states
(drafters/eagle.py), under the same rules.

The goodput controller (engine.controller) chooses K per request from measured
acceptance and costs, down to 0; this class picks the draft *source* per request
and round:

1. lookup: the longer of the suffix-tree and n-gram proposals (microseconds);
2. if a model drafter is configured (a draft head, a draft model) and lookup
   proposes fewer than ``min_lookup`` tokens (or K where K is smaller), the model drafts
   instead. ``min_lookup`` defaults to 3 for a draft head and 1 (lookup proposes nothing)
   for a draft model, whose every drafted token costs a forward of its own (not measured
   with 3). On open chat lookup mostly proposes a token or two from a
   short match, accepted about 10% of the time, while grounded text gives long
   matches that keep the turn. Measured side by side on the held-out prompts (docs/BENCHMARKS.md,
   issue 13, 3 runs, the 2026-12-02 head), min_lookup 1 / 2 / 3: open chat 1.11 / 1.21
   / 1.29x of plain, writing 1.78 / 1.97 / 1.99x, code edit 1.62 / 1.58 / 1.70x, all
   1.37 / 1.41 / 1.44x; built-in prompts all 1.61 / 1.60 / 1.72x. (With an earlier head
   and controller, also replacing lookup's drafts on requests where they had yielded
   little lately cost grounded prompts and writing up to 0.3x: lookup's hits are bursty,
   so a lookup draft of ``min_lookup`` tokens keeps the turn however the request's lookups
   fared.) Whether the model's drafts pay on a request is
   its source's controller's call (K down to 0, with probes): a second, fixed acceptance
   bar here (0.35 a drafted token, the head's average is ~0.3) kept backing the head off
   where its rounds paid (measured on the held-out prompts in three side-by-side sessions
   of 2 runs each, all categories: 1.43/1.40/1.30x of plain with the bar, 1.46/1.41/1.31x
   without).

The engine asks ``source`` before it chooses K, and keeps one controller per source
(``auto``, ``auto+eagle``): the head's acceptance (~0.4) and cost (a millisecond a
step) never shorten lookup's long, free drafts (measured: with one controller for
both, auto with the head ran writing prompts at 1.32x of plain against 1.70x without it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftgate.drafters.base import Draft, Drafter, DraftRequest
from draftgate.drafters.ngram import NgramDrafter
from draftgate.drafters.suffix import SuffixDrafter
from draftgate.types import SamplingParams

__all__ = ["AutoDrafter"]


@dataclass
class _ModelUse:
    """Per request: whether the model drafted its last round (its outcome goes to the model)."""

    last_was_model: bool = False


class AutoDrafter:
    name = "auto"

    def __init__(self, model: Drafter | None = None, min_lookup: int | None = None) -> None:
        self._suffix = SuffixDrafter()
        self._ngram = NgramDrafter(min_n=2)  # unigram matches are noise outside copied text
        self._model = model
        self.sampled_q = model is not None and model.sampled_q
        # A model that reads the target's hidden states (the eagle head): the target feeds it through us.
        self.feature_layers: tuple[int, ...] = tuple(getattr(model, "feature_layers", ()))
        head = bool(self.feature_layers)  # a draft head drafts in a millisecond; a draft model costs more
        self._min_lookup = min_lookup if min_lookup is not None else (3 if head else 1)
        self._use: dict[int, _ModelUse] = {}
        self._plans: dict[int, tuple[int, bool]] = {}  # seq -> (history length, model drafts?)

    def _lookup(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        a = self._suffix.propose(requests)
        b = self._ngram.propose(requests)
        return [x if len(x.token_ids) >= len(y.token_ids) else y for x, y in zip(a, b, strict=True)]

    def _wants_model(self, lookup_len: int, k: int) -> bool:
        """Whether the model drafts this round: lookup proposes fewer than min(min_lookup, k) tokens."""
        return k > 0 and lookup_len < min(self._min_lookup, k)

    def source(self, seq_id: int, tokens: Sequence[int], k_max: int) -> str:
        """Where this sequence's next draft comes from: ``auto`` (lookup) or ``auto+<model>``.

        The engine keeps one goodput controller (acceptance, cost, K) per source, so the model's
        acceptance never shortens lookup's drafts. The decision is kept for the ``propose`` of
        the same round.
        """
        if self._model is None:
            return self.name
        ask = min(self._min_lookup, k_max)  # enough to tell whether lookup proposes min_lookup tokens
        d = self._lookup([DraftRequest(seq_id, tokens, ask, SamplingParams())])[0]
        model = self._wants_model(len(d.token_ids), k_max)
        self._plans[seq_id] = (len(tokens), model)
        return f"{self.name}+{self._model.name}" if model else self.name

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        planned = [self._plans.pop(r.seq_id, None) for r in requests]
        planned = [p if p is not None and p[0] == len(r.tokens) else None for p, r in zip(planned, requests, strict=True)]
        # Lookup drafts for this round's k: a lookup asked for more tokens may pick another match
        # (measured: reusing source()'s k_max draft cut auto's accepted tokens on code edits by 12%).
        drafts = self._lookup(requests)
        need = []
        for i, (r, p, d) in enumerate(zip(requests, planned, list(drafts), strict=True)):
            if p is not None:
                model = p[1]
            else:
                model = self._model is not None and self._wants_model(len(d.token_ids), r.k)
            if self._model is not None:
                self._use.setdefault(r.seq_id, _ModelUse()).last_was_model = model and r.k > 0
            if model and r.k > 0:
                need.append(i)
        if need:
            assert self._model is not None
            for i, d in zip(need, self._model.propose([requests[i] for i in need]), strict=True):
                drafts[i] = d
        return drafts

    def feed(self, seq_id: int, start: int, feats: torch.Tensor) -> None:
        """The target's features for the model (only when it reads them: ``feature_layers``)."""
        self._model.feed(seq_id, start, feats)  # type: ignore[union-attr]

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        self._suffix.observe(seq_id, tokens, num_drafted, num_accepted)
        self._ngram.observe(seq_id, tokens, num_drafted, num_accepted)
        use = self._use.get(seq_id)
        if self._model is not None and use is not None and use.last_was_model and num_drafted:
            self._model.observe(seq_id, tokens, num_drafted, num_accepted)

    def forget(self) -> None:
        """Drop the lookup memory of finished requests (``SuffixDrafter.forget``)."""
        self._suffix.forget()

    def release(self, seq_id: int) -> None:
        self._suffix.release(seq_id)
        self._ngram.release(seq_id)
        self._use.pop(seq_id, None)
        self._plans.pop(seq_id, None)
        if self._model is not None:
            self._model.release(seq_id)
