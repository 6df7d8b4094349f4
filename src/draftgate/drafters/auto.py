"""`auto`: free lookup drafts (suffix + n-gram) first, a model draft where lookup finds little.

With ``--draft-head DIR`` the model is a draft head on the target's hidden states
(drafters/eagle.py), under the same rules.

The goodput controller (engine.controller) chooses K per request from measured
acceptance and costs, down to 0; this class picks the draft *source* per request
and round:

1. lookup: the longer of the suffix-tree and n-gram proposals (microseconds);
2. if a model drafter is configured (a draft head, a draft model) and lookup
   proposes fewer than ``min_lookup`` tokens (or K where K is smaller), the model drafts
   instead. ``min_lookup`` defaults to 3 for a draft head: on open chat lookup mostly
   proposes a token or two from a short match, accepted about 10% of the time, while
   grounded text gives long matches that keep the turn. For a draft model, whose every
   drafted token costs a forward of its own, it defaults to 1 (the model drafts only
   where lookup proposes nothing). Lookup's hits are bursty, so a lookup draft of
   ``min_lookup`` tokens keeps the turn however the request's lookups have fared. Whether
   the model's drafts pay on a request is its source's controller's call (K down to 0,
   with probes); there is deliberately no second acceptance bar here, which would back
   the head off where its rounds pay (docs/BENCHMARKS.md);
3. only lookup drafts with evidence count toward ``min_lookup``: the n-gram's and the
   suffix tree's from the request's own text, and the suffix tree's from earlier requests'
   outputs (its global trie) on a context match of at least ``min_global_match`` (4) tokens.
   A 2-3-token match in another request's answer is a common phrase, not a quote (see
   MIN_GLOBAL_MATCH); where the model does not draft, such a draft is still lookup's.

The engine asks ``source`` before it chooses K, and keeps one controller per source
(``auto``, ``auto+eagle``), so the head's lower acceptance and its cost (a millisecond a
step) never shorten lookup's long, free drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftgate.drafters.base import Abilities, Draft, Drafter, DraftRequest, Source
from draftgate.drafters.ngram import NgramDrafter
from draftgate.drafters.suffix import SuffixDrafter
from draftgate.types import SamplingParams

__all__ = ["AutoDrafter", "MIN_GLOBAL_MATCH"]

# A suffix draft copied from earlier requests' outputs (the global trie) on a context match shorter
# than this does not keep the turn from a model drafter (it still drafts where the model would not):
# a 2-3 token match in another request's answer is a common phrase, not a quote. Such drafts were
# accepted 0.05-0.35 tokens on average against 0.41-0.86 for the head at the same positions; from 4
# tokens of context on they beat it (docs/BENCHMARKS.md).
MIN_GLOBAL_MATCH = 4
_ANY = SamplingParams()  # lookups draft the same whatever a request samples with


@dataclass(frozen=True)
class _Plan:
    """``source``'s decision for a sequence's round: at which history length, for which k_max, whether
    the model drafts, and lookup's draft (k_max tokens at most)."""

    seen: int
    k_max: int
    model: bool
    lookup: Draft


def _fits(p: _Plan | None, r: DraftRequest) -> bool:
    """Whether ``source``'s plan is this request's round (the same history, no more tokens asked)."""
    return p is not None and p.seen == len(r.tokens) and r.k <= p.k_max


@dataclass
class _ModelUse:
    """Per request: whether the model drafted its last round (its outcome goes to the model)."""

    last_was_model: bool = False


class AutoDrafter:
    name = "auto"

    def __init__(
        self, model: Drafter | None = None, min_lookup: int | None = None, min_global_match: int = MIN_GLOBAL_MATCH
    ) -> None:
        if min_global_match < 0:
            raise ValueError(f"min_global_match must be >= 0, got {min_global_match!r}")
        self._min_global_match = min_global_match
        self._suffix = SuffixDrafter()
        self._ngram = NgramDrafter(min_n=2)  # unigram matches are noise outside copied text
        self._model = model
        self.sampled_q = model is not None and model.sampled_q
        # A model that reads the target's hidden states (the eagle head): the target feeds it through us.
        reader = model.abilities.features if model is not None else None
        self.feature_layers: tuple[int, ...] = reader.feature_layers if reader is not None else ()
        head = reader is not None  # a draft head drafts in a millisecond; a draft model costs more
        self.abilities = Abilities(
            features=self if head else None,
            lookup=model is None,  # lookups only: one source
            sources=self if model is not None else None,
            forget=self.forget,
        )
        self._min_lookup = min_lookup if min_lookup is not None else (3 if head else 1)
        self._lookup_source = Source(self.name, lookup=True)
        self._model_source = Source(f"{self.name}+{model.name}") if model is not None else None
        self._use: dict[int, _ModelUse] = {}
        self._plans: dict[int, _Plan] = {}  # seq -> what source() decided for its round

    def _lookup(self, requests: Sequence[DraftRequest]) -> list[tuple[Draft, int]]:
        """Per request: lookup's draft (the longer of the suffix tree's and the n-gram's) and how many
        tokens lookup proposes with evidence enough to keep the turn from a model (see MIN_GLOBAL_MATCH)."""
        out = []
        for r, b in zip(requests, self._ngram.propose(requests), strict=True):
            a = self._suffix.match(r.seq_id, r.tokens, r.k)
            weak = a.from_global and a.depth < self._min_global_match
            draft = Draft(a.token_ids, context=a.depth) if len(a.token_ids) >= len(b.token_ids) else b
            out.append((draft, max(len(b.token_ids), 0 if weak else len(a.token_ids))))
        return out

    def _wants_model(self, lookup_len: int, k: int) -> bool:
        """Whether the model drafts this round: lookup proposes fewer than min(min_lookup, k) tokens
        (counting only drafts it has evidence enough for, see MIN_GLOBAL_MATCH)."""
        return k > 0 and lookup_len < min(self._min_lookup, k)

    def source(self, seq_id: int, tokens: Sequence[int], k_max: int) -> Source:
        """Where this sequence's next draft comes from: ``auto`` (lookup) or ``auto+<model>``.

        The engine keeps one acceptance estimate per source (lookup's per evidence, the model's per
        request), so the model's acceptance never shortens lookup's drafts. The decision, and the
        k_max lookup it rests on, are kept for the ``propose`` of the same round (a lookup in pure
        Python costs tens of microseconds: once a round, not twice).
        """
        if self._model_source is None:
            return self._lookup_source
        ((draft, strong),) = self._lookup([DraftRequest(seq_id, tokens, k_max, _ANY)])
        model = self._wants_model(strong, k_max)
        self._plans[seq_id] = _Plan(len(tokens), k_max, model, draft)
        return self._model_source if model else self._lookup_source

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        plans = [self._plans.pop(r.seq_id, None) for r in requests]
        fresh = [i for i, (r, p) in enumerate(zip(requests, plans, strict=True)) if not _fits(p, r)]
        looked = dict(zip(fresh, self._lookup([requests[i] for i in fresh]), strict=True)) if fresh else {}  # unplanned
        drafts: list[Draft] = []
        need = []
        for i, (r, p) in enumerate(zip(requests, plans, strict=True)):
            if i in looked:
                d, strong = looked[i]
                model = self._model is not None and self._wants_model(strong, r.k)
            else:
                assert p is not None
                d, model = p.lookup, p.model
                if len(d.token_ids) > r.k:  # the k_max lookup's first k tokens
                    d = Draft(list(d.token_ids[: r.k]), context=d.context)
            drafts.append(d)
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
        """The target's features for the model (only when it reads them: ``abilities.features``)."""
        assert self._model is not None and self._model.abilities.features is not None
        self._model.abilities.features.feed(seq_id, start, feats)

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
