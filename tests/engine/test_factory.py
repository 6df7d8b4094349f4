"""build_drafter: a `model` draft goes through the pairing check (refused with the reasons)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from draftgate.drafters.model import ModelDrafter
from draftgate.engine import DrafterKind, EngineConfig
from draftgate.engine.factory import build_drafter, build_runner
from draftgate.errors import ModelLoadError
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import Kernels
from pair_support import make_variant, swapped_vocab_draft


def _cfg(draft: Path, kind: DrafterKind = DrafterKind.MODEL) -> EngineConfig:
    return EngineConfig(drafter=kind, draft_model=str(draft), num_blocks=16, block_size=8).validate()


@pytest.mark.parametrize("kind", [DrafterKind.MODEL, DrafterKind.AUTO])
def test_mismatched_draft_is_refused_with_reasons(
    tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path, kind: DrafterKind
) -> None:
    draft = swapped_vocab_draft(tiny_model_dir, tmp_path / "d")
    with pytest.raises(ModelLoadError, match=r"cannot draft for .*vocab: vocabularies differ.*'hello' is id 7"):
        build_drafter(_cfg(draft, kind), tiny_model)


def test_disjoint_eos_is_refused(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    draft = make_variant(
        tiny_model_dir,
        tmp_path / "d",
        tokenizer_config=lambda t: t.update(eos_token="<pad>"),
        config=lambda c: c.update(eos_token_id=0),
        generation_config=lambda g: g.update(eos_token_id=0),
    )
    with pytest.raises(ModelLoadError, match="eos: end-of-sequence ids have nothing in common"):
        build_drafter(_cfg(draft), tiny_model)


def test_compatible_draft_builds_and_warnings_are_logged(
    tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert isinstance(build_drafter(_cfg(tiny_model_dir), tiny_model), ModelDrafter)
    draft = make_variant(tiny_model_dir, tmp_path / "d", config=lambda c: c.update(max_position_embeddings=64))
    with caplog.at_level(logging.WARNING, logger="draftgate.engine.factory"):
        assert isinstance(build_drafter(_cfg(draft), tiny_model), ModelDrafter)
    assert "context: draft max_position_embeddings 64" in caplog.text


@pytest.mark.parametrize(
    ("kernels", "drafter", "warns"),
    [
        (Kernels.TORCH, DrafterKind.NGRAM, True),
        (Kernels.TORCH, DrafterKind.NONE, False),
        (Kernels.NATIVE, DrafterKind.NGRAM, False),
    ],
)
def test_torch_kernels_warn_that_greedy_identity_is_not_guaranteed(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture, kernels: Kernels, drafter: DrafterKind, warns: bool
) -> None:
    cfg = EngineConfig(model=str(tiny_model_dir), drafter=drafter, kernels=kernels)
    with caplog.at_level(logging.WARNING, logger="draftgate.engine.factory"):
        build_runner(cfg)
    said = [r.getMessage() for r in caplog.records if "may differ from plain decoding" in r.getMessage()]
    assert bool(said) == warns
    if warns:
        assert "CPU kernels (--kernels torch)" in said[0]
