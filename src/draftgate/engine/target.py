"""The round target: the one seam between the request loop (``Engine``) and where the target runs.

The engine owns everything about a request once: admission, K choice, drafting, stats,
emission, stop rules, cancellation and cleanup. A round target owns only the target model's
side of a sequence, and answers in the sequence's ``Round`` record (``engine.round``):

1. ``open``: prefill the prompt and answer the first token, chosen as plain decoding would;
2. ``run``: verify one round of drafts for each of several sequences (one batched forward where
   the target can batch), roll each sequence back to its accepted prefix, and answer what the
   round emits (accepted drafts + the recovered or bonus token, before stop cuts);
3. ``close``: forget the sequence (free its KV or session); idempotent.

Implementations: ``LocalTarget`` (our runner in this process), ``ScoredTarget`` (a server that
only scores: an OpenAI-compatible one, ``server.targets.openai_target``), the gRPC worker
session target (``server.targets.grpc_target``) and the vLLM token-route target
(``integrations.vllm.gateway.target``). What a target is and can do is stated in ``TargetInfo``,
never probed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from draftgate.engine.round import Round
from draftgate.errors import BadRequestError
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams

__all__ = ["TargetInfo", "DraftPricer", "RoundTarget", "NotNow", "check_prompt"]


class DraftPricer(Protocol):
    """A target that prices lookup drafts itself (its rounds cost what its server measures, not
    what forward rows cost): the policy asks it instead of its own evidence pricing."""

    def worth(self, context: int, length: int) -> bool:
        """Whether a lookup draft of ``length`` tokens on ``context`` tokens of evidence is worth a round."""
        ...


@dataclass(frozen=True)
class TargetInfo:
    """What a round target is and can do (fixed for its lifetime)."""

    kind: str  # "local" | "grpc" | "openai" | "vllm": for logs and metrics labels only
    vocab_size: int
    max_context: int | None  # prompt + completion tokens it accepts (None: unknown)
    exact_sampling: bool = True  # sampled requests are verified exactly (else refused or approximate)
    pricer: DraftPricer | None = None  # it prices lookup drafts itself (None: by forward rows, engine.pricing)


def check_prompt(
    prompt_ids: Sequence[int], max_new_tokens: int, vocab_size: int | None, max_context: int | None
) -> None:
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

    def open(self, rnd: Round) -> None:
        """Prefill ``rnd.history`` (the prompt; ``rnd.k_max`` drafts a round at most) and answer the first
        token (``rnd.done``), or ``rnd.fail``. Raises NotNow when it cannot take the sequence yet."""
        ...

    def run(self, rounds: Sequence[Round]) -> None:
        """One round for each sequence: each answered (``done``) or failed alone (``fail``)."""
        ...

    def close(self, seq_id: int) -> None:
        """The sequence ended: free what it holds (idempotent)."""
        ...

    def kv_stats(self) -> dict[str, int]: ...

    def shutdown(self) -> None: ...
