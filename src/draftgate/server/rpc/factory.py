"""Build the split deployment's parts from typed config: workers' runners, the remote engine."""

from __future__ import annotations

from collections.abc import Sequence

from draftgate.drafters.base import Drafter
from draftgate.drafters.http import DEFAULT_TIMEOUT_S, HttpDrafter
from draftgate.engine.config import EngineConfig
from draftgate.engine.factory import build_drafter
from draftgate.models.loader import LoadedModel, load_model
from draftgate.server.rpc.client import RemoteTargetEngine

__all__ = ["build_remote_engine"]


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
        loaded = load_model(cfg.model, dtype=cfg.torch_dtype, cache_dir=cfg.cache_dir)
    drafter: Drafter | None
    if draft_url is not None:
        drafter = HttpDrafter(draft_url, timeout_s=draft_timeout_s)
    else:
        drafter = build_drafter(cfg, loaded, features=False)  # a remote target: no hidden states
    return RemoteTargetEngine(
        targets, loaded.tokenizer, drafter, k=cfg.k, k_max=cfg.k_max, max_queue=cfg.max_queue,
        draft_timeout_s=draft_timeout_s if draft_url is not None else None,
    )  # fmt: skip
