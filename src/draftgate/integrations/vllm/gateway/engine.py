"""VllmTargetEngine: the engine with its target on a vLLM server that only scores (``vllm+http://`` rounds).

Not a loop of its own: ``Engine`` runs every request (drafting, stats, stops) over
``vllm_target.VllmRoundTarget``, whose declared pricer (``TargetInfo.pricer``) tells the engine's
policy which lookup drafts are worth a scoring round on this server. This class checks the
server at start (``vllm_checks``) and keeps sampled requests off the drafts: they run on vLLM's
own decoding (exact by construction).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from draftgate.drafters.base import Drafter
from draftgate.engine import Engine, Sink
from draftgate.integrations.vllm.gateway.checks import ServerFacts, VllmTargetError, check_numerics, check_rows
from draftgate.integrations.vllm.gateway.target import VllmRoundTarget
from draftgate.integrations.vllm.gateway.wire import VllmWire
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams

__all__ = ["VllmTargetEngine", "LOOKUP_K_MAX"]

LOOKUP_K_MAX = 16  # drafts a lookup may offer a scoring round at least: its price hardly grows with K on vLLM


class VllmTargetEngine(Engine):
    """``Engine(VllmRoundTarget(...))`` over a vLLM server started with ``--enable-scale-out``."""

    def __init__(
        self,
        url: str,
        facts: ServerFacts,
        client: httpx.Client,
        tokenizer: TextTokenizer,
        drafter: Drafter | None,
        k: int | None = None,
        k_max: int = 8,
        max_queue: int = 256,
        timeout_s: float = 30.0,
        max_concurrent: int = 16,
    ) -> None:
        if not facts.token_route:
            raise VllmTargetError(
                f"vLLM at {url} has no token route ({url}/inference/v1/generate): start it with --enable-scale-out"
            )
        self.wire = VllmWire(url, client, facts.model, timeout_s)
        check_rows(self.wire, tokenizer)
        margin = check_numerics(self.wire, tokenizer)
        self.rounds_target = VllmRoundTarget(self.wire, tokenizer, facts.max_context, max_concurrent, margin=margin)
        super().__init__(
            self.rounds_target,
            drafter,
            k=k,
            k_max=max(k_max, LOOKUP_K_MAX),
            max_batch=max_concurrent,
            max_queue=max_queue,
        )

    def submit(  # type: ignore[override]
        self, prompt_ids: list[int], params: SamplingParams, sink: Sink, speculate: bool = True
    ) -> Callable[[], None]:
        # Sampled requests: vLLM's own sampling, start to end (one stream; nothing drafted or verified here).
        return super().submit(prompt_ids, params, sink, speculate and params.greedy)

    def verification_counts(self) -> dict[str, int]:
        return self.rounds_target.counts()

    def shutdown(self) -> None:
        super().shutdown()
        self.wire.client.close()
