"""Build an Engine from an EngineConfig: load the target, make the KV cache and the drafter."""

from __future__ import annotations

import torch

from draftgate.drafters import NgramDrafter, SuffixDrafter
from draftgate.drafters.base import Drafter
from draftgate.engine.config import DrafterKind, EngineConfig
from draftgate.engine.engine import Engine
from draftgate.models.loader import LoadedModel, load_model
from draftgate.models.runner import ModelRunner

__all__ = ["build_engine", "build_drafter"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_drafter(cfg: EngineConfig, target: LoadedModel) -> Drafter | None:
    kind = cfg.drafter
    if kind == DrafterKind.NONE:
        return None
    if kind == DrafterKind.NGRAM:
        return NgramDrafter(max_n=cfg.ngram_max)
    if kind == DrafterKind.SUFFIX:
        return SuffixDrafter()
    if kind == DrafterKind.AUTO:
        from draftgate.drafters.auto import AutoDrafter

        return AutoDrafter.for_target(target, cfg)
    from draftgate.drafters.model import build_model_drafter

    return build_model_drafter(cfg, target)


def build_engine(cfg: EngineConfig, loaded: LoadedModel | None = None) -> Engine:
    cfg.validate()
    if loaded is None:
        loaded = load_model(cfg.model, dtype=_DTYPES[cfg.dtype], cache_dir=cfg.cache_dir)
    runner = ModelRunner(
        loaded,
        device=cfg.device,
        num_blocks=cfg.num_blocks,
        block_size=cfg.block_size,
        enable_prefix_cache=cfg.enable_prefix_cache,
    )
    drafter = build_drafter(cfg, loaded)
    k = cfg.k if cfg.drafter != DrafterKind.NONE else 0
    return Engine(runner, drafter, k=k, k_max=cfg.k_max, max_batch=cfg.max_batch, max_queue=cfg.max_queue)
