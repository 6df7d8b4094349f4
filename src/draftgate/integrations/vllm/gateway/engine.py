"""VllmTargetEngine: the engine with its target on a vLLM server that only scores (``vllm+http://`` rounds).

Not a loop of its own: ``Engine`` runs every request (drafting, stats, stops) over
``target.VllmRoundTarget``, whose declared pricer (``TargetInfo.pricer``) tells the engine's
policy which lookup drafts are worth a scoring round on this server. This class checks the
server at start (``checks``) and sends a request to vLLM's own decoding, relayed untouched
(``plugin_route.VllmPluginBackend`` as a pass-through), where rounds cannot help it: a sampled
request (exact by construction), a request that does not speculate, and any greedy request while
rounds do not pay on this server with an adaptive K (``pricing.RouteGate``).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from draftgate.drafters.base import Drafter
from draftgate.engine import Engine, Sink
from draftgate.integrations.vllm.gateway.checks import ServerFacts, VllmTargetError, check_numerics, check_rows
from draftgate.integrations.vllm.gateway.plugin_route import VllmPluginBackend
from draftgate.integrations.vllm.gateway.pricing import RouteGate
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
        self.gate = RouteGate(self.rounds_target.pricer)
        self.passthrough = VllmPluginBackend(
            url, tokenizer, None, None, max_queue=max_queue, client=client, facts=facts, passthrough=True
        )
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
        rounds = speculate and params.greedy and self.speculation_enabled and self.drafter is not None
        # A fixed K scores every draft whatever a round costs (as the policy does); an adaptive one asks the gate.
        if rounds and (self.k is not None or self.gate.rounds()):
            return super().submit(prompt_ids, params, sink, True)
        return self.passthrough.submit(prompt_ids, params, sink, speculate=False)

    @property
    def num_running(self) -> int:
        return super().num_running + self.passthrough.num_running

    def verification_counts(self) -> dict[str, int]:
        return {**self.rounds_target.counts(), "passed_through": self.gate.passed}

    def shutdown(self) -> None:
        super().shutdown()
        self.wire.client.close()
