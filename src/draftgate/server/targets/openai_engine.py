"""OpenAITargetEngine: the engine with its target on an OpenAI-compatible server we do not own.

Not a loop of its own: ``Engine`` runs every request and ``ScoredTarget`` verifies each round
from the server's scores (``openai_target.OpenAIScorer``, where the server's wire quirks live).
This class only wires the two.
"""

from __future__ import annotations

import httpx

from draftgate.drafters.base import Drafter
from draftgate.engine import Engine, ScoredTarget
from draftgate.models.tokenizer import TextTokenizer
from draftgate.server.targets.openai_target import OpenAIScorer
from draftgate.types import SamplingParams

__all__ = ["OpenAITargetEngine"]


class OpenAITargetEngine(Engine):
    """The engine over an OpenAI-compatible server: ``Engine(ScoredTarget(OpenAIScorer(...)))``."""

    def __init__(
        self,
        url: str,
        tokenizer: TextTokenizer,
        drafter: Drafter | None,
        k: int | None = None,
        k_max: int = 8,
        max_queue: int = 256,
        allow_approximate: bool = False,
        timeout_s: float = 60.0,
        max_concurrent: int = 4,
        model_name: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.server = OpenAIScorer(url, tokenizer, allow_approximate, timeout_s, model_name, client)
        super().__init__(
            ScoredTarget(self.server, max_concurrent),
            drafter,
            k=k,
            k_max=k_max,
            max_batch=max_concurrent,
            max_queue=max_queue,
        )

    def check_params(self, params: SamplingParams) -> None:
        """Raise BadRequestError if the route would refuse these params (sampling without approximation)."""
        self.server.check([0], params, self.k_max)

    @property
    def rounds(self) -> int:
        return self.server.rounds
