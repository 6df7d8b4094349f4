"""Build one route's Backend from its config, target spec and drafter spec."""

from __future__ import annotations

from dataclasses import replace

from draftgate.drafters.base import Drafter
from draftgate.engine import EngineConfig, build_engine
from draftgate.engine.config import DrafterKind
from draftgate.engine.engine import Engine
from draftgate.engine.factory import build_drafter, build_runner
from draftgate.models.loader import LoadedModel
from draftgate.server.targets import DrafterSpec, RemoteDrafterKind, TargetKind, TargetSpec

__all__ = ["build_backend", "make_drafter"]


def make_drafter(cfg: EngineConfig, spec: DrafterSpec, loaded: LoadedModel, features: bool = False) -> Drafter | None:
    """The route's drafter: a built-in kind (cfg.drafter is set to it), or a remote one.

    ``features``: the target is embedded, so a drafter may read its hidden states (eagle).
    """
    if spec.kind is RemoteDrafterKind.HTTP:
        from draftgate.drafters.http import HttpDrafter

        return HttpDrafter(str(spec.url), timeout_s=spec.timeout_s)
    if spec.kind is RemoteDrafterKind.LLAMACPP:
        from draftgate.drafters.llamacpp_server import LlamaCppServerDrafter

        return LlamaCppServerDrafter(str(spec.url), loaded.tokenizer, timeout_s=spec.timeout_s)
    assert isinstance(spec.kind, DrafterKind)
    return build_drafter(replace(cfg, drafter=spec.kind), loaded, features=features)


def build_backend(
    cfg: EngineConfig, target: TargetSpec, drafter: DrafterSpec, loaded: LoadedModel, allow_approximate: bool = False
):  # -> Backend
    """``loaded`` is the route's model: run by the embedded engine, only its tokenizer used otherwise."""
    if target.kind is TargetKind.EMBEDDED:
        if not drafter.remote:
            return build_engine(replace(cfg, drafter=drafter.kind), loaded=loaded)  # type: ignore[arg-type]
        return Engine(
            build_runner(cfg, loaded),
            make_drafter(cfg, drafter, loaded, features=True),
            k=cfg.k,
            k_max=cfg.k_max,
            max_batch=cfg.max_batch,
            max_queue=cfg.max_queue,
        )
    d = make_drafter(cfg, drafter, loaded)
    if target.kind is TargetKind.GRPC:
        from draftgate.server.targets.grpc_engine import RemoteTargetEngine

        return RemoteTargetEngine(
            list(target.addresses),
            loaded.tokenizer,
            d,
            k=cfg.k,
            k_max=cfg.k_max,
            max_queue=cfg.max_queue,
            draft_timeout_s=drafter.timeout_s if drafter.remote else None,
        )
    if target.kind is TargetKind.OPENAI:
        from draftgate.server.targets.openai_engine import OpenAITargetEngine

        return OpenAITargetEngine(
            target.addresses[0],
            loaded.tokenizer,
            d,
            k=cfg.k,
            k_max=cfg.k_max,
            max_queue=cfg.max_queue,
            allow_approximate=allow_approximate,
        )
    if target.kind is TargetKind.VLLM:
        import httpx

        from draftgate.integrations.vllm.gateway.checks import connect
        from draftgate.integrations.vllm.gateway.engine import VllmTargetEngine
        from draftgate.integrations.vllm.gateway.plugin_route import VllmPluginBackend

        url = target.addresses[0]
        client = httpx.Client(timeout=httpx.Timeout(600.0, connect=10.0))
        facts = connect(url, client, loaded.tokenizer)
        if facts.token_route and not facts.proposer:  # the gateway drafts and verifies, vLLM scores
            return VllmTargetEngine(
                url, facts, client, loaded.tokenizer, d, k=cfg.k, k_max=cfg.k_max, max_queue=cfg.max_queue
            )
        return VllmPluginBackend(
            url,
            loaded.tokenizer,
            d,
            _proposer_drafter(drafter),
            k=cfg.k,
            k_max=cfg.k_max,
            max_queue=cfg.max_queue,
            client=client,
            facts=facts,
        )
    raise ValueError(f"unknown target kind {target.kind!r}")


def _proposer_drafter(spec: DrafterSpec) -> str | None:
    """What DraftGate's proposer inside vLLM drafts with for this route (None: nothing)."""
    if spec.kind is RemoteDrafterKind.HTTP:
        return "remote"  # vLLM's proposer reaches its own DRAFTGATE_VLLM_DRAFT_URL
    if spec.kind is DrafterKind.NONE:
        return None
    return spec.kind.value
