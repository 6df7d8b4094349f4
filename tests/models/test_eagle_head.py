"""The draft head's two forwards agree: the dense training rollout is what incremental drafting computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from eagle_support import tiny_head

from draftgate.errors import ModelLoadError
from draftgate.models.eagle import EagleHead, default_feature_layers
from draftgate.models.eagle_format import target_fingerprint
from draftgate.models.loader import LoadedModel


def test_default_feature_layers_are_low_mid_high() -> None:
    assert default_feature_layers(30) == (2, 15, 30)
    assert default_feature_layers(2) == (1, 2)


def test_incremental_drafting_matches_the_training_rollout(tiny_model: LoadedModel) -> None:
    """Step j of the rollout at anchor t = absorbing the true entries up to t, then j - 1 chain steps."""
    head = tiny_head(tiny_model)
    T, S, C = 12, 3, tiny_model.config.hidden_size
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(1, T, len(head.feature_layers), C, generator=g)  # [1, T, nF, C]
    nxt = torch.randint(0, tiny_model.config.vocab_size, (1, T + S), generator=g)  # [1, T + S]
    with torch.no_grad():
        dense = head.rollout(feats, nxt[:, : T + S - 1], S)  # S x [1, T, Vs]
        fused = head.fused(feats[0])  # [T, C]
    for t in (0, 4, T - 1):
        cache = head.new_cache(4)  # grows as needed
        h = head.extend(cache, fused[: t + 1], nxt[0, : t + 1])  # true entries 0..t
        torch.testing.assert_close(head.logits(h), dense[0][0, t], atol=1e-4, rtol=1e-4)
        true_n = cache.n
        for j in range(2, S + 1):
            h = head.extend(cache, h[None], nxt[0, t + j - 1 : t + j])  # the token at t + j
            torch.testing.assert_close(head.logits(h), dense[j - 1][0, t], atol=1e-4, rtol=1e-4)
        head.truncate(cache, true_n)
        assert cache.n == t + 1


def test_a_head_saves_loads_and_refuses_another_target(
    tiny_model: LoadedModel, tiny_draft_dir: Path, tmp_path: Path
) -> None:
    from draftgate.models.loader import load_model

    head = tiny_head(tiny_model)
    meta = {"target": target_fingerprint(tiny_model.config, tiny_model.weights)}
    head.save(tmp_path / "h", meta)
    back = EagleHead.load(tmp_path / "h", tiny_model.config, tiny_model.weights)
    x = torch.randn(3, tiny_model.config.hidden_size)
    torch.testing.assert_close(back.logits(x), head.logits(x), atol=2e-2, rtol=2e-2)  # saved as float16
    assert torch.equal(back.vocab_ids, head.vocab_ids)
    other = load_model(str(tiny_draft_dir))  # same shape and tokenizer, other weights
    with pytest.raises(ModelLoadError, match="different target"):
        EagleHead.load(tmp_path / "h", other.config, other.weights)
    with pytest.raises(ModelLoadError, match="not a draft head folder"):
        EagleHead.load(tmp_path, tiny_model.config, tiny_model.weights)
