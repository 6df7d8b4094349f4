"""ScoredTarget: a round target over a back end that can only score (return the target's logits).

Some targets we do not own (an OpenAI-compatible server) cannot verify drafts themselves but
can return the target's distribution at the draft positions. The engine then verifies with its
own rule (``verify.verify_round``), so acceptance logic lives in one place. A ``Scorer`` says
whether its distributions are complete (``TargetInfo.exact_sampling``): when they are not (a
server's top-n log-probabilities), greedy verification is still exact and sampled rounds are
flagged ``approximate``.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from draftgate.engine.round import Round
from draftgate.engine.target import TargetInfo
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams
from draftgate.verify import RoundDraft, verify_round

__all__ = ["Scorer", "ScoredTarget", "verify_choices"]


class Scorer(Protocol):
    info: TargetInfo
    tokenizer: TextTokenizer

    def check(self, prompt_ids: Sequence[int], params: SamplingParams, k_max: int) -> None: ...

    def score(self, history: Sequence[int], drafts: Sequence[int], params: SamplingParams) -> tuple[list[int], Tensor]:
        """(the drafts it scored: a prefix of ``drafts``, logits [len + 1, V] after history + each of them).

        Logits the scorer does not know are -inf (a server's top-n). Raises on failure.
        """
        ...

    def shutdown(self) -> None: ...


class ScoredTarget:
    def __init__(self, scorer: Scorer, max_concurrent: int = 4) -> None:
        self.scorer = scorer
        self.info = scorer.info
        self.tokenizer = scorer.tokenizer
        self._max_concurrent = max_concurrent
        self._pool: cf.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def check(self, prompt_ids: Sequence[int], params: SamplingParams, k_max: int) -> None:
        self.scorer.check(prompt_ids, params, k_max)

    def open(self, rnd: Round) -> None:
        self._round(rnd)  # no session to open: the first token is a round without drafts

    def run(self, rounds: Sequence[Round]) -> None:
        if len(rounds) <= 1:
            for r in rounds:
                self._round(r)
            return
        list(self._executor().map(self._round, rounds))

    def close(self, seq_id: int) -> None:
        pass  # nothing of ours is held by the scorer

    def kv_stats(self) -> dict[str, int]:
        return {}

    def shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self.scorer.shutdown()

    def _executor(self) -> cf.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self._max_concurrent, thread_name_prefix="draftgate-score")
            return self._pool

    def _round(self, r: Round) -> None:
        """Score r's drafts, verify them here (an error ends this sequence only)."""
        p = r.params
        try:
            drafts, logits = self.scorer.score(r.history, list(r.draft.token_ids), p)  # [k+1, V]
        except Exception as e:
            r.fail(f"target {self.info.kind}: {type(e).__name__}: {e}")
            return
        u = r.uniforms[: len(drafts) + 1] if r.uniforms is not None else None  # [k+1, 2]
        out = verify_round(logits, [RoundDraft(drafts, p.temperature, p.top_k, p.top_p, u)])
        r.done(out.emitted[0], out.accepted[0], approximate=p.temperature > 0 and not self.info.exact_sampling)


def verify_choices(
    drafts: Sequence[int], choices: Sequence[int], after: int | None, vocab_size: int
) -> tuple[list[int], int]:
    """Greedy verification against a target's own choices: (emitted, accepted).

    ``choices[j]`` is the target's greedy token after history + drafts[:j] (known up to the first
    mismatch at least); ``after`` its token after all the drafts (None: not known; only read when
    every draft matched: then the drafts alone are emitted). The rule is ``verify.verify_round``'s, on
    logits 0 at each choice.
    """
    k = len(choices)
    logits = torch.full((k + 1, vocab_size), float("-inf"))  # [k+1, V]
    logits[torch.arange(k), torch.tensor(list(choices), dtype=torch.long)] = 0.0
    logits[k, after if after is not None else 0] = 0.0
    out = verify_round(logits, [RoundDraft(list(drafts[:k]), 0.0, 0, 1.0, None)])
    if after is None and out.accepted[0] == k:
        return out.emitted[0][:k], k  # no bonus token is known: none is made up
    return out.emitted[0], out.accepted[0]
