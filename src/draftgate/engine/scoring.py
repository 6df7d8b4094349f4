"""The target worker's stateless Score call: log-probabilities of a token list's suffix.

No session: the tokens are prefilled in a scratch sequence (reusing the prefix cache, and
leaving their blocks to it for the next call on the same prefix), the rows from
``validation_offset`` on are returned as ``log p(tokens[i] | tokens[:i])`` with the top-n
alternatives, and the sequence is freed. The worker's loop thread runs it (it owns the model).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftgate.errors import BadRequestError
from draftgate.models.runner import ForwardItem, ModelRunner

__all__ = ["ScoredPosition", "ScoreJob", "score_positions", "MAX_TOP_N"]

MAX_TOP_N = 20  # most alternatives Score returns per position (OpenAI's limit)
_SCORE_CHUNK = 512
_score_ids = itertools.count(1 << 48)  # Score's scratch sequences never meet session ids


@dataclass(frozen=True)
class ScoredPosition:
    position: int
    token: int | None  # tokens[position]; None for the next-token distribution
    logprob: float | None
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass
class ScoreJob:
    tokens: list[int]
    start: int  # first position scored (>= 1)
    top_n: int
    future: cf.Future[list[ScoredPosition]]

    @classmethod
    def checked(cls, runner: ModelRunner, tokens: Sequence[int], validation_offset: int, top_n: int) -> ScoreJob:
        """A job for ``runner``, or BadRequestError saying what is wrong with the call."""
        toks = [int(t) for t in tokens]
        V, ctx = runner.vocab_size, runner.config.max_position_embeddings
        if not toks or any(not 0 <= t < V for t in toks):
            raise BadRequestError(f"tokens must be a non-empty list of ids in [0, {V})")
        if len(toks) > ctx:
            raise BadRequestError(f"{len(toks)} tokens exceed the model's context of {ctx}")
        if validation_offset > len(toks):
            raise BadRequestError(f"validation_offset {validation_offset} is past the {len(toks)} tokens")
        if not 0 <= top_n <= MAX_TOP_N:
            raise BadRequestError(f"top_n must be in [0, {MAX_TOP_N}], got {top_n}")
        if math.ceil(len(toks) / runner.block_size) > runner.kv.num_blocks:
            raise BadRequestError("the tokens do not fit in the worker's KV cache")
        return cls(toks, max(1, validation_offset), top_n, cf.Future())


def score_positions(runner: ModelRunner, job: ScoreJob) -> list[ScoredPosition]:
    """log p(tokens[i] | tokens[:i]) for i in start..n (i == n: the next-token distribution)."""
    toks, n = job.tokens, len(job.tokens)
    j0 = job.start - 1  # first logits row needed: the one that predicts position `start`
    sid = next(_score_ids)
    cached = runner.add_sequence(sid, toks)
    try:
        runner.truncate(sid, min(cached, j0))
        for s in range(min(cached, j0), j0, _SCORE_CHUNK):  # context before the suffix: no logits
            runner.forward([ForwardItem(sid, toks[s : min(s + _SCORE_CHUNK, j0)], 1)])
        rows = []
        for s in range(j0, n, _SCORE_CHUNK):
            chunk = toks[s : s + _SCORE_CHUNK]
            rows.append(runner.forward([ForwardItem(sid, chunk, len(chunk))])[0])
        runner.commit(sid, toks)  # later calls on the same prefix skip it
    finally:
        runner.free(sid)
    logp = torch.cat(rows).float().log_softmax(dim=-1)  # [n - j0, V]
    top = logp.topk(job.top_n, dim=-1) if job.top_n else None
    out = []
    for r in range(n - j0):
        pos = j0 + 1 + r
        tok = toks[pos] if pos < n else None
        out.append(
            ScoredPosition(
                pos,
                tok,
                float(logp[r, tok]) if tok is not None else None,
                top.indices[r].tolist() if top is not None else [],
                top.values[r].tolist() if top is not None else [],
            )
        )
    return out
