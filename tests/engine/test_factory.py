"""build_drafter: a `model` draft goes through the pairing check (refused with the reasons)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from draftgate.drafters.model import ModelDrafter
from draftgate.engine import DrafterKind, EngineConfig
from draftgate.engine.factory import build_drafter
from draftgate.errors import ModelLoadError
from draftgate.models.loader import LoadedModel
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
        tiny_model_dir, tmp_path / "d",
        tokenizer_config=lambda t: t.update(eos_token="<pad>"),
        config=lambda c: c.update(eos_token_id=0),
        generation_config=lambda g: g.update(eos_token_id=0),
    )  # fmt: skip
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
