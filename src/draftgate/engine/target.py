"""The round target: the one seam between the request loop (``Engine``) and where the target runs.

The engine owns everything about a request once: admission, K choice, drafting, stats,
emission, stop rules, cancellation and cleanup. A round target owns only the target model's
side of a sequence:

1. ``open``: prefill the prompt and return the first token, chosen as plain decoding would;
2. ``run``: verify one round of drafts for each of several sequences (one batched forward where
   the target can batch), roll each sequence back to its accepted prefix, and return what the
   round emits (accepted drafts + the recovered or bonus token, before stop cuts);
3. ``close``: forget the sequence (free its KV or session); idempotent.

Implementations: ``LocalTarget`` (our runner in this process), the gRPC worker session target
(``server.targets.grpc_target``) and the OpenAI-compatible server target
(``server.targets.openai_target``). What a target can do is stated in ``TargetInfo``, never
probed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from draftgate.drafters.base import Draft
from draftgate.errors import BadRequestError
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams

__all__ = ["TargetInfo", "RoundWork", "RoundDone", "RoundTarget", "NotNow", "check_prompt"]


@dataclass(frozen=True)
class TargetInfo:
    """What a round target is and can do (fixed for its lifetime)."""

    kind: str  # "local" | "grpc" | "openai": for logs and metrics labels only
    vocab_size: int
    max_context: int | None  # prompt + completion tokens it accepts (None: unknown)
    exact_sampling: bool = True  # sampled requests are verified exactly (else refused or approximate)


@dataclass(frozen=True)
class RoundWork:
    """One sequence's part of a round (or of an open: history = the prompt, no drafts).

    The target sees only this: the engine keeps the request itself. ``history[-1]`` is the
    pending token (emitted, not yet in the target's KV); the uniforms are the request's own,
    keyed by output position, so a seeded request gives the same tokens on every target.
    """

    seq_id: int
    history: Sequence[int]  # prompt + output so far (a live view: do not mutate)
    params: SamplingParams
    draft: Draft  # k >= 0 draft tokens, with q for sampled drafts
    uniforms: Tensor | None  # [k+1, 2] (u_accept, u_sample) for the next k+1 output positions; None: greedy
    remaining: int | None = None  # output tokens the request may still emit (None: not said)


@dataclass(frozen=True)
class RoundDone:
    """What a round (or an open) gave one sequence."""

    emitted: list[int]  # accepted drafts + the recovered or bonus token (open: the first token)
    accepted: int  # drafts accepted
    error: str | None = None  # this sequence's target failed; the request ends with this error
    approximate: bool = False  # verified by an approximation (a route that allowed it)
    branch_rows: int = 0  # forward rows the target ran for the draft's tree nodes (0: none, or skipped)
    fallback: bool = False  # scoring the drafts failed: the target's plain next token was emitted instead
    target_decoded: bool = False  # sampled by the target's own decoding (not verified here: exact by construction)
    declined: bool = False  # the target did not score the drafts (not worth its round's price): a plain round


def check_prompt(prompt_ids: Sequence[int], max_new_tokens: int, vocab_size: int | None, max_context: int | None) -> None:
    """The one check of a prompt against a target (None: not known here): BadRequestError saying what to do."""
    if not prompt_ids:
        raise BadRequestError("the prompt is empty")
    V = vocab_size
    if V is not None and any(not isinstance(t, int) or not 0 <= t < V for t in prompt_ids):
        raise BadRequestError(f"prompt token ids must be in [0, {V})")
    if max_context is not None and len(prompt_ids) + max_new_tokens > max_context:
        raise BadRequestError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_new_tokens}) exceeds the model's context "
            f"of {max_context} tokens; shorten the prompt or lower max_tokens"
        )


class NotNow(Exception):
    """``open`` cannot take the sequence yet (its KV reserve does not fit); try again later."""


class RoundTarget(Protocol):
    info: TargetInfo
    tokenizer: TextTokenizer

    def check(self, prompt_ids: Sequence[int], params: SamplingParams, k_max: int) -> None:
        """Raise BadRequestError (with what to do) if the request can never run on this target."""
        ...

    def open(self, work: RoundWork, k_max: int) -> RoundDone:
        """Prefill ``work.history`` (the prompt); the first token (``error`` if it failed). Raises NotNow."""
        ...

    def run(self, work: Sequence[RoundWork]) -> list[RoundDone]:
        """One round for each sequence, in order (a failed sequence gets ``error``, the rest go on)."""
        ...

    def close(self, seq_id: int) -> None:
        """The sequence ended: free what it holds (idempotent)."""
        ...

    def kv_stats(self) -> dict[str, int]: ...

    def shutdown(self) -> None: ...
