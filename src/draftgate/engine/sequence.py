"""Per-request state: history, position-keyed randomness, stop rules, incremental text."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams, SpecStats

__all__ = ["IncrementalText", "PositionRandom", "SequenceState", "StopChecker"]

_CHUNK = 64


class PositionRandom:
    """Uniforms keyed by output position, drawn in order from the request's own generator.

    Position t always gets the same pair (u_accept, u_sample) whatever K the rounds
    used, so a seeded request gives the same tokens with any drafter and any K
    (deterministic drafts are verified by sampling the target with u_sample and
    matching, which is exactly plain sampling).
    """

    def __init__(self, generator: torch.Generator) -> None:
        self._gen = generator
        self._base = 0  # position of _buf[0]
        self._buf = torch.empty(0, 2, dtype=torch.float64)  # [n, 2] (u_accept, u_sample)

    def get(self, t0: int, n: int) -> torch.Tensor:
        """Uniforms for positions t0..t0+n-1: [n, 2] float64."""
        assert t0 >= self._base, "positions must be consumed in order"
        drop = t0 - self._base
        if drop:
            self._buf = self._buf[drop:]
            self._base = t0
        while self._buf.shape[0] < n:
            more = torch.rand(_CHUNK, 2, generator=self._gen, dtype=torch.float64)
            self._buf = torch.cat([self._buf, more])
        return self._buf[:n]


class StopChecker:
    """Finds where a token stream must end: EOS, max tokens, or a stop string.

    Applied to every emitted token in order, so a block of accepted tokens is cut
    exactly where plain decoding would have stopped.
    """

    def __init__(self, tokenizer: TextTokenizer, params: SamplingParams) -> None:
        self._tok = tokenizer
        self._eos = set() if params.ignore_eos else set(tokenizer.eos_ids)
        self._stop = params.stop
        self._max = params.max_new_tokens
        self._max_stop_len = max((len(s) for s in params.stop), default=0)

    def cut(self, output: Sequence[int], new: Sequence[int]) -> tuple[int, str | None]:
        """How many of ``new`` (appended after ``output``) to keep, and the finish reason or None."""
        n_out = len(output)
        for i, t in enumerate(new):
            if t in self._eos:
                return i + 1, "stop"
            if self._stop and self._hits_stop([*output, *new[: i + 1]]):
                return i + 1, "stop"
            if n_out + i + 1 >= self._max:
                return i + 1, "length"
        return len(new), None

    @property
    def max_stop_len(self) -> int:
        return self._max_stop_len

    def _hits_stop(self, ids: Sequence[int]) -> bool:
        # Decode only a tail long enough to contain any stop string.
        tail = self._tok.decode(ids[-(self._max_stop_len + 8) :])
        return any(s in tail for s in self._stop)

    def trim_text(self, text: str) -> str:
        """Text up to (not including) the first stop string."""
        cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
        return text if cut < 0 else text[:cut]


_ids = itertools.count(1)


@dataclass
class SequenceState:
    """One running request as the step sees it."""

    prompt: list[int]
    params: SamplingParams
    rand: PositionRandom
    stop: StopChecker
    seq_id: int = field(default_factory=lambda: next(_ids))
    output: list[int] = field(default_factory=list)
    history: list[int] = field(default_factory=list)  # prompt + output (what drafters see)
    stats: SpecStats = field(default_factory=SpecStats)
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        self.history = list(self.prompt)

    @property
    def pending(self) -> int:
        """The last emitted token: in the history, not yet in the KV cache."""
        return self.history[-1]

    def append(self, tokens: Sequence[int]) -> list[int]:
        """Add emitted tokens, cut at the stop rules; return the ones kept."""
        keep, reason = self.stop.cut(self.output, tokens)
        kept = list(tokens[:keep])
        self.output.extend(kept)
        self.history.extend(kept)
        if reason is not None:
            self.finish_reason = reason
        return kept


@dataclass
class IncrementalText:
    """A request's text as it grows: never splits a multi-byte character or a forming stop string."""

    checker: StopChecker
    sent: int = 0  # characters of text already sent
    ids: list[int] = field(default_factory=list)

    def delta(self, tok_decode: Callable[[list[int]], str], new: list[int], final: bool) -> str:
        self.ids.extend(new)
        text = self.checker.trim_text(tok_decode(self.ids))
        if not final:
            text = text.rstrip("\ufffd")  # an incomplete UTF-8 sequence: wait for more bytes
            hold = self.checker.max_stop_len  # a stop string may be forming
            text = text[: max(self.sent, len(text) - hold)] if hold else text
        out, self.sent = text[self.sent :], max(self.sent, len(text))
        return out
