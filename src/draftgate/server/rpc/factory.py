"""Build the split deployment's parts from typed config: workers' runners, the remote engine."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from draftgate.drafters.base import Drafter
from draftgate.engine.config import EngineConfig
from draftgate.engine.factory import build_drafter
from draftgate.models.loader import LoadedModel, load_model
from draftgate.models.runner import ModelRunner
from draftgate.server.rpc.client import RemoteTargetEngine
from draftgate.server.rpc.draft_client import DEFAULT_TIMEOUT_S, HttpDrafter

__all__ = ["build_runner", "build_remote_engine", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_runner(cfg: EngineConfig, loaded: LoadedModel | None = None) -> ModelRunner:
    """The model and its KV cache, as a worker holds them (cfg: model, device, dtype, KV sizes)."""
    cfg.validate()
    if loaded is None:
        loaded = load_model(cfg.model, dtype=DTYPES[cfg.dtype], cache_dir=cfg.cache_dir)
    return ModelRunner(
        loaded,
        device=cfg.device,
        num_blocks=cfg.num_blocks,
        block_size=cfg.block_size,
        enable_prefix_cache=cfg.enable_prefix_cache,
    )


def build_remote_engine(
    cfg: EngineConfig,
    targets: Sequence[str],
    draft_url: str | None = None,
    draft_timeout_s: float = DEFAULT_TIMEOUT_S,
    loaded: LoadedModel | None = None,
) -> RemoteTargetEngine:
    """A RemoteTargetEngine on ``targets`` (grpc://HOST:PORT each) with cfg's drafter and K policy.

    ``draft_url`` (http://HOST:PORT of a `draftgate serve-draft`) replaces cfg.drafter.
    The model is loaded here for its tokenizer (and for drafters that need the
    target's files, e.g. auto); its weights are not run.
    """
    cfg.validate()
    if loaded is None:
        loaded = load_model(cfg.model, dtype=DTYPES[cfg.dtype], cache_dir=cfg.cache_dir)
    drafter: Drafter | None
    if draft_url is not None:
        drafter = HttpDrafter(draft_url, timeout_s=draft_timeout_s)
    else:
        drafter = build_drafter(cfg, loaded)
    return RemoteTargetEngine(targets, loaded.tokenizer, drafter, k=cfg.k, k_max=cfg.k_max, max_queue=cfg.max_queue)
