"""VllmTargetEngine: the engine with its target on a vLLM server that only scores (``vllm+http://`` rounds).

Not a loop of its own: ``Engine`` runs every request (drafting, stats, stops) over
``vllm_target.VllmRoundTarget`` at a fixed K: whether a draft is worth a round is priced per draft
by the target, not per K by the goodput controller. This class checks the server at start
(``vllm_checks``), starts the loop on the first request, and keeps sampled requests off the
drafts: they run on vLLM's own decoding (exact by construction).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from draftgate.drafters.base import Drafter
from draftgate.engine import Engine
from draftgate.engine.frontend import Sink
from draftgate.models.tokenizer import TextTokenizer
from draftgate.server.targets.vllm_checks import ServerFacts, VllmTargetError, check_rows
from draftgate.server.targets.vllm_target import VllmRoundTarget
from draftgate.server.targets.vllm_wire import VllmWire
from draftgate.types import SamplingParams

__all__ = ["VllmTargetEngine", "ROUND_K"]

ROUND_K = 16  # drafts a scoring round may carry: on vLLM a round's price hardly grows with K


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
        self.rounds_target = VllmRoundTarget(self.wire, tokenizer, facts.max_context, max_concurrent)
        # K: every draft the drafter has, up to k_max (or the route's fixed k); whether a draft is
        # worth a scoring round is priced per draft by the target (vllm_pricing), not per K here.
        k_max = max(k_max, ROUND_K)
        super().__init__(self.rounds_target, drafter, k=k or k_max, k_max=k_max, max_batch=max_concurrent,
                         max_queue=max_queue)  # fmt: skip

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink, speculate: bool = True) -> Callable[[], None]:
        # Sampled requests: vLLM's own sampling, start to end (one stream; nothing drafted or verified here).
        cancel = super().submit(prompt_ids, params, sink, speculate and params.greedy)
        self.start()
        return cancel

    def shutdown(self) -> None:
        super().shutdown()
        self.wire.client.close()
