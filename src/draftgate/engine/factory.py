"""Build an Engine from an EngineConfig: load the target, make the KV cache and the drafter."""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from draftgate.drafters import NgramDrafter, SuffixDrafter
from draftgate.drafters.auto import AutoDrafter
from draftgate.drafters.base import Drafter
from draftgate.engine.config import DrafterKind, EngineConfig
from draftgate.engine.engine import Engine
from draftgate.errors import ModelLoadError
from draftgate.models.gguf_blocks import load_blocks, quantize
from draftgate.models.loader import LoadedModel, load_model
from draftgate.models.native import load_library
from draftgate.models.runner import Kernels, ModelRunner
from draftgate.paths import default_cache_dir

__all__ = ["build_engine", "build_drafter", "build_runner", "quant_copy", "NO_HEAD"]

NO_HEAD = "none"  # --draft-head none: auto drafts from lookups only


def build_drafter(cfg: EngineConfig, target: LoadedModel, features: bool = True) -> Drafter | None:
    """``features``: the target is our runner in this process, so a drafter may read its hidden states."""
    kind = cfg.drafter
    if kind == DrafterKind.NONE:
        return None
    if kind == DrafterKind.NGRAM:
        return NgramDrafter(max_n=cfg.ngram_max)
    if kind == DrafterKind.SUFFIX:
        return SuffixDrafter()
    if kind == DrafterKind.AUTO:
        return AutoDrafter(model=_auto_model_drafter(cfg, target, features))
    if kind == DrafterKind.EAGLE:
        if not features:
            raise ModelLoadError(
                "drafter 'eagle' reads the target's hidden states, which only the embedded target gives; "
                "use auto, ngram, suffix or model on a remote target"
            )
        return _eagle(cfg, target)
    return _model_drafter(cfg, target)


def _eagle(cfg: EngineConfig, target: LoadedModel) -> Drafter:
    from draftgate.drafters.eagle import EagleDrafter, load_head

    if cfg.draft_head == NO_HEAD:
        raise ModelLoadError("--drafter eagle needs a draft head; --draft-head none turns the head off for auto only")
    head = load_head(cfg.draft_head, target)
    if _runs_native(cfg, target):
        # The head's products on the target's own pool, in bfloat16 (measured: docs/BENCHMARKS.md).
        head.use_native(load_library(cfg.cache_dir or default_cache_dir(), cfg.kernel_level))
    return EagleDrafter(head, min_branch=cfg.draft_branch or None)


def _model_drafter(cfg: EngineConfig, target: LoadedModel) -> Drafter:
    """`model`: a separate draft model on our runner; `quant`: the target's own quantized copy on it."""
    from draftgate.drafters.model import ModelDrafter
    from draftgate.modelinfo.pairing import check_pair

    if cfg.drafter == DrafterKind.QUANT:
        return ModelDrafter(build_runner(cfg, quant_copy(cfg, target)), name="quant")
    assert cfg.draft_model is not None
    draft = load_model(cfg.draft_model, dtype=cfg.torch_dtype, cache_dir=cfg.cache_dir, quantized=cfg.quantized)
    report = check_pair(target, draft)  # the same check as `draftgate check-pair`
    if not report.ok:
        reasons = "; ".join(f"{f.check}: {f.reason}" for f in report.errors)
        raise ModelLoadError(f"draft model {cfg.draft_model} cannot draft for {target.source}: {reasons}")
    for f in report.findings:
        if f.severity == "warning":  # lossless either way; the draft may just be accepted less
            logging.getLogger(__name__).warning("draft model %s: %s: %s", cfg.draft_model, f.check, f.reason)
    return ModelDrafter(build_runner(cfg, draft))


def _auto_model_drafter(cfg: EngineConfig, target: LoadedModel, features: bool) -> Drafter | None:
    """auto adds a model drafter for the rounds lookup has nothing for: --draft-model, or --draft-head DIR,
    else (embedded target only) the target's own quantized copy where the target runs float weights on
    the native kernels, else the draft head shipped for the target; --draft-head none: lookups only.

    The quantized copy first: on held-out prompts against a float32 target (Zen 5) auto with it ran
    at 2.01x of plain, where auto with the shipped head ran at 1.63x (docs/BENCHMARKS.md); a Q4 draft
    step costs about a third of a float32 target step and 87% of its drafted tokens are accepted.
    A target that already runs its quantization (--dtype auto) gets the head. A remote target gets
    lookups only: the head needs its hidden states (an explicit --draft-head is refused there).
    """
    from draftgate.drafters.eagle import shipped_head
    from draftgate.drafters.model import ModelDrafter

    if cfg.draft_model:
        return _model_drafter(replace(cfg, drafter=DrafterKind.MODEL), target)
    if cfg.draft_head == NO_HEAD:
        return None
    if cfg.draft_head is None:
        if not features:
            return None
        if target.blocks is None and _runs_native(cfg, target):
            # One-hot drafts: auto mixes it with lookups, whose turns follow earlier requests' answers,
            # and a seeded request must not depend on which rounds a sampled q drafted.
            return ModelDrafter(build_runner(cfg, quant_copy(cfg, target)), name="quant", one_hot=True)
        return _eagle(cfg, target) if shipped_head(target) is not None else None
    if not features:
        raise ModelLoadError(
            "--draft-head: a draft head reads the target's hidden states, which only the embedded target gives; "
            "drop --draft-head for auto on a remote target"
        )
    return _eagle(cfg, target)


def _runs_native(cfg: EngineConfig, target: LoadedModel) -> bool:
    """Whether the target's forward runs on the native CPU kernels under this config."""
    dtype = target.dtype
    return Kernels(cfg.kernels).resolve(torch.device(cfg.device), dtype) is Kernels.NATIVE


def quant_copy(cfg: EngineConfig, target: LoadedModel) -> LoadedModel:
    """The target with quantized weights for the ``quant`` self-draft: a GGUF file's own blocks, else
    Q4_1 products and a Q8_0 embedding/head quantized here (about a quarter of float32's bytes)."""
    if not _runs_native(cfg, target):
        raise ModelLoadError("drafter 'quant' runs on the native CPU kernels; drop --kernels torch or use --device cpu")
    if target.blocks is not None:
        raise ModelLoadError(
            "drafter 'quant' drafts for a float target with its own quantized copy, and --dtype auto already runs "
            "the model's quantization: use --dtype float32 or bfloat16 with it, or another drafter"
        )
    c = target.config
    if target.gguf_path is not None:
        blocks = load_blocks(target.gguf_path, c)
    else:
        try:
            blocks = {
                k: quantize(w, "q8_0" if k in ("model.embed_tokens.weight", "lm_head.weight") else "q4_1")
                for k, w in target.weights.items()
                if w.ndim == 2 and w.is_floating_point()
            }
        except ValueError as e:
            raise ModelLoadError(f"drafter 'quant' cannot quantize {target.source}: {e}") from e
    return replace(target, blocks=blocks)


def build_runner(cfg: EngineConfig, loaded: LoadedModel | None = None) -> ModelRunner:
    """The one place a model and its KV cache are built from config (engine, workers, drafts)."""
    if loaded is None:
        check_memory(cfg, [("model", cfg.model)])
        loaded = load_model(cfg.model, dtype=cfg.torch_dtype, cache_dir=cfg.cache_dir, quantized=cfg.quantized)
    runner = ModelRunner(
        loaded,
        device=cfg.device,
        num_blocks=cfg.num_blocks,
        block_size=cfg.block_size,
        enable_prefix_cache=cfg.enable_prefix_cache,
        kernels=cfg.kernels,
        build_dir=cfg.cache_dir,
        level=cfg.kernel_level,
    )
    if runner.kernels is Kernels.TORCH and cfg.drafter != DrafterKind.NONE:
        # Measured (docs/BENCHMARKS.md): PyTorch's CPU kernels round a 2-row pass differently
        # from a 1-row pass even in float32; in bfloat16, 16 of 20 greedy answers differed from plain.
        # Its CUDA kernels promise no invariance either (benchmarks/invariance_probe.py measures it).
        where = "CPU kernels (--kernels torch)" if runner.device.type == "cpu" else f"kernels on {runner.device}"
        logging.getLogger(__name__).warning(
            "speculation on PyTorch's %s: greedy output may differ from plain decoding near ties (a K+1-row "
            "verify may round differently from a one-row decode); the native CPU kernels are batch invariant",
            where,
        )
    return runner


def build_engine(cfg: EngineConfig, loaded: LoadedModel | None = None) -> Engine:
    cfg.validate()
    if loaded is None:
        draft = cfg.draft_model if cfg.drafter in (DrafterKind.MODEL, DrafterKind.AUTO) else None
        check_memory(cfg, [("target", cfg.model)] + ([("draft", draft)] if draft else []))
        loaded = load_model(cfg.model, dtype=cfg.torch_dtype, cache_dir=cfg.cache_dir, quantized=cfg.quantized)
    runner = build_runner(cfg, loaded)
    drafter = build_drafter(cfg, loaded)
    k = cfg.k if cfg.drafter != DrafterKind.NONE else 0
    return Engine(runner, drafter, k=k, k_max=cfg.k_max, max_batch=cfg.max_batch, max_queue=cfg.max_queue)


def check_memory(cfg: EngineConfig, models: list[tuple[str, str]]) -> None:
    """Refuse before loading (ModelLoadError with the numbers) when these models, each with a KV cache of
    ``cfg.num_blocks``, and the process need more than ``cfg.memory_limit_gib`` or the memory available."""
    from draftgate.modelinfo.host_memory import check_fits, host_need
    from draftgate.modelinfo.shapes import resolve_shape
    from draftgate.models.loader import resolve_model_path

    slots = cfg.num_blocks * cfg.block_size
    needs = []
    for role, name in models:
        path = resolve_model_path(name)
        needs.append(host_need(f"{role} {name}", path, resolve_shape(str(path)), cfg.dtype, slots))
    check_fits(needs, cfg.memory_limit_gib)
