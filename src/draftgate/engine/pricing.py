"""Lookup drafts priced by their evidence, after they are proposed.

A lookup (n-gram, suffix tree) proposes in microseconds and says how much it matched: the
tokens of the history's end it found before (``Draft.context``). That evidence predicts
acceptance far better than a request's past rounds do: on the bundled model's benchmark
prompts a draft on 1 token of context had its first token accepted 12-28% of the time, on 3
tokens 38-65%, on 8 or more 95-99%, open chat and grounded prompts alike. So a lookup is asked
for every draft it has, and each draft is then cut to the K that pays at its evidence:

    goodput(K) = E[tokens | K, evidence] / t_round(other + K + 1)

with E[tokens | K] = 1 + sum_j prod_{i<=j} alpha_i(evidence) from the acceptance of the last
rounds at that evidence, pooled over all requests (``AcceptanceTracker`` per source, evidence
bucket and greedy or sampled) and refined by the request's own, and the round times of ``CostModel``
(the draft is proposed already: only the verified rows' cost depends on K). K = 0 (the draft
is dropped: a plain round) unless a K beats plain decoding by NEAR_TIE. A bucket priced out whose
optimistic estimate (mean + OPTIMISM posterior sds) could still pay is probed now and then with
what its request's plain rounds paid for (``controller.funded_k``); one known to lose is not.

A target whose rounds cost what its server measures rather than forward rows (a vLLM scoring
round) prices drafts itself: it declares a ``DraftPricer`` (``TargetInfo.pricer``) and the policy
asks it instead.
"""

from __future__ import annotations

from typing import Final

from draftgate.engine.acceptance import AcceptanceTracker
from draftgate.engine.controller import OPTIMISM, best_k, down_probe_due, funded_k
from draftgate.engine.costs import CostModel

__all__ = ["EvidencePricer", "MAX_EVIDENCE"]

MAX_EVIDENCE: Final = 8  # contexts of 8 tokens or more share one bucket (acceptance ~0.95 and up)
WINDOW: Final = 128  # rounds per bucket kept (all requests')
OWN_WINDOW: Final = 32  # a request's own rounds per band kept
OWN_PRIOR_WEIGHT: Final = 2.0  # the pooled estimate counts as this many of the request's own rounds


class EvidencePricer:
    """Per source and evidence: the acceptance of lookup drafts, and the K that pays for each draft."""

    def __init__(self, k_max: int, window: int = WINDOW) -> None:
        self.k_max, self.window = k_max, window
        self._trackers: dict[tuple[str, int, bool], AcceptanceTracker] = {}

    @staticmethod
    def bucket(context: int) -> int:
        return max(0, min(int(context), MAX_EVIDENCE))

    def tracker(self, source: str, context: int, greedy: bool) -> AcceptanceTracker:
        key = (source, self.bucket(context), greedy)
        t = self._trackers.get(key)
        if t is None:
            t = self._trackers[key] = AcceptanceTracker(self.k_max, window=self.window)
        return t

    def steps(self, cost: CostModel, source: str, other_tokens: int, length: int) -> list[float]:
        """[k-1]: estimated seconds of a round verifying k of this source's drafts (its draft call is
        paid already, whatever K: only the rows differ)."""
        plain = other_tokens + 1
        return [cost.round_forward_time(source, plain + k) for k in range(1, length + 1)]

    @staticmethod
    def band(context: int) -> int:
        """A request's own estimates are kept per band of evidence (shallow 1-2, middle 3-5, deep 6+):
        a request has few rounds per bucket, and one kind of request fails (or succeeds) alike on
        neighbouring buckets."""
        return 0 if context <= 2 else 1 if context <= 5 else 2

    def own(self) -> AcceptanceTracker:
        """A request's own estimate at one band of evidence: it refines the pooled one (``choose``)."""
        return AcceptanceTracker(self.k_max, window=OWN_WINDOW, prior_weight=OWN_PRIOR_WEIGHT)

    def choose(
        self,
        cost: CostModel,
        source: str,
        context: int,
        length: int,
        greedy: bool,
        other_tokens: int,
        funds: float,
        own: AcceptanceTracker | None = None,
    ) -> tuple[int, bool]:
        """(K, probe) for a draft of ``length`` tokens on ``context`` tokens of evidence; ``funds``: the
        seconds of probing its request has paid for; ``own``: the request's own rounds at this bucket,
        which refine the pooled estimate (a chat request whose 2-token matches fail stops drafting
        them though grounded requests' succeed). K = 0 drops the draft."""
        length = min(length, self.k_max)
        if length <= 0:
            return 0, False
        steps = self.steps(cost, source, other_tokens, length)
        t_plain = cost.forward_time(other_tokens + 1, optimistic=True)
        pooled = self.tracker(source, context, greedy)
        alphas = pooled.alphas(length) if own is None else own.alphas(length, prior=pooled.alphas(length))
        k = best_k(alphas, steps, t_plain)
        if k > 0:
            return (0, False) if down_probe_due(cost, other_tokens + 1) else (k, False)
        if not cost.measured(other_tokens + 1):
            return 0, False  # plain decoding's cost is still a guess: measure it first
        # A probe only where the bucket could still pay (its pooled optimistic alphas win): a bucket
        # known to lose is not probed again, one with few rounds is.
        top = best_k(pooled.alphas(length, z=OPTIMISM), steps, t_plain)
        k = funded_k(top, steps, t_plain, funds) if top else 0
        return k, k > 0

    def probe_cost(self, cost: CostModel, source: str, other_tokens: int, k: int) -> float:
        """What a probe of k drafts costs over a plain round should it emit one token (its funds spent)."""
        t_plain = cost.forward_time(other_tokens + 1, optimistic=True)
        return max(0.0, self.steps(cost, source, other_tokens, k)[-1] - t_plain)

    def record(self, source: str, context: int, greedy: bool, k: int, accepted: int) -> None:
        """A verified round of k drafts at this evidence kept the first ``accepted``."""
        if k > 0:
            self.tracker(source, context, greedy).record(min(k, self.k_max), min(accepted, k, self.k_max))
