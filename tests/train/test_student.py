"""The trainable draft computes exactly what our runner computes on the folder it is saved to."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftgate.models.loader import LoadedModel, load_model
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.train.distill import _save_folder
from draftgate.train.student import DraftLM, draft_config, pick_layers


def test_pick_layers_spreads_first_to_last() -> None:
    assert pick_layers(30, 4) == [0, 10, 19, 29]
    assert pick_layers(30, 1) == [0]
    assert pick_layers(2, 5) == [0, 1]


def test_narrow_draft_config_keeps_heads_consistent(tiny_model: LoadedModel) -> None:
    c = draft_config(tiny_model.config, 1, 128)
    assert (c.hidden_size, c.num_heads * c.head_dim, c.num_layers) == (128, 128, 1)
    assert c.num_heads % c.num_kv_heads == 0 and not c.tie_word_embeddings
    with pytest.raises(ValueError, match="multiple"):
        draft_config(tiny_model.config, 1, 100)


@pytest.mark.parametrize("subset", [None, [2, 5, 7, 11, 40, 41, 42, 90]])
def test_saved_draft_matches_runner(tiny_model: LoadedModel, tmp_path: Path, subset: list[int] | None) -> None:
    out_ids = torch.tensor(subset) if subset else None
    cfg = draft_config(tiny_model.config, 1, None)
    m = DraftLM.from_target(tiny_model, cfg, out_ids, [1])
    with torch.no_grad():  # move away from the copied target so a mis-exported tensor shows
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    _save_folder(tmp_path, tiny_model, m)
    loaded = load_model(str(tmp_path))
    runner = ModelRunner(loaded, num_blocks=16)
    toks = [1, 7, 9, 30, 31, 12, 5, 60, 3, 44]
    runner.add_sequence(0, toks)
    ours = runner.forward([ForwardItem(0, toks, len(toks))])[0]  # [T, V]
    with torch.no_grad():
        ref = m(torch.tensor([toks]))[0]  # [T, Vs]
    if out_ids is None:
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(ours[:, out_ids], ref, atol=1e-5, rtol=1e-5)
        outside = torch.ones(ours.shape[1], dtype=torch.bool)
        outside[out_ids] = False
        assert torch.isneginf(ours[:, outside]).all()  # q = 0 outside the subset
