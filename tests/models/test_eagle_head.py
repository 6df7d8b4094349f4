"""The draft head's two forwards agree: the dense training rollout is what incremental drafting computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftgate.errors import ModelLoadError
from draftgate.models.eagle import EagleHead, default_feature_layers, target_fingerprint
from draftgate.models.loader import LoadedModel


def _head(tiny_model: LoadedModel, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    cfg = tiny_model.config
    head = EagleHead(cfg, default_feature_layers(cfg.num_layers), torch.arange(0, cfg.vocab_size, 2))
    head.attach_target(tiny_model.weights)
    head.init_weights(tiny_model.weights)
    return head.eval()


def test_default_feature_layers_are_low_mid_high() -> None:
    assert default_feature_layers(30) == (2, 15, 30)
    assert default_feature_layers(2) == (1, 2)


def test_incremental_drafting_matches_the_training_rollout(tiny_model: LoadedModel) -> None:
    """Step j of the rollout at anchor t = absorbing the true entries up to t, then j - 1 chain steps."""
    head = _head(tiny_model)
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

    head = _head(tiny_model)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_products_compute_what_torch_computes(tiny_model: LoadedModel, dtype: torch.dtype) -> None:
    """Drafting on the native pool: float32 storage gives torch's values, bfloat16 storage their rounding."""
    from draftgate.models.native import load_library
    from draftgate.paths import default_cache_dir

    ref, nat = _head(tiny_model), _head(tiny_model).use_native(load_library(default_cache_dir()), dtype)
    T, C = 9, tiny_model.config.hidden_size
    g = torch.Generator().manual_seed(2)
    feats = torch.randn(T, len(ref.feature_layers), C, generator=g)  # [T, nF, C]
    toks = torch.randint(0, tiny_model.config.vocab_size, (T,), generator=g)  # [T]
    out, hs, caches = [], [], []
    for head in (ref, nat):  # ref: torch's ops; nat: one native call a step (models/native/head_step.h)
        cache = head.new_cache(4)  # grows
        h0, logits0 = head.step(cache, toks, feats=feats)  # [C], [Vs]: T true entries
        h, logits = head.step(cache, toks[:1], g=h0[None])  # one chain step on its own output
        assert cache.n == T + 1
        out.append(logits)
        hs.append(torch.cat([h0, h]))
        caches.append(torch.cat([cache.k[:, : cache.n], cache.v[:, : cache.n]]))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out[1], out[0], atol=tol * float(out[0].abs().max()), rtol=tol)
    torch.testing.assert_close(hs[1], hs[0], atol=tol * float(hs[0].abs().max()), rtol=tol)
    torch.testing.assert_close(caches[1], caches[0], atol=tol * float(caches[0].abs().max()), rtol=tol)
    if dtype == torch.float32:
        assert int(out[1].argmax()) == int(out[0].argmax())
    with pytest.raises(IndexError, match="outside the vocabulary"):
        nat.step(nat.new_cache(4), torch.tensor([tiny_model.config.vocab_size]), g=h0[None])
    with pytest.raises(ValueError, match="not both"):
        nat.step(nat.new_cache(4), toks[:1], feats=feats[:1], g=h0[None])


def test_a_batch_of_sequences_steps_as_each_one_alone(tiny_model: LoadedModel) -> None:
    """step_many over sequences of different lengths: the native products run once over all their
    rows, and each sequence gets bitwise what its own step gives (torch's ops: to rounding)."""
    from draftgate.models.native import load_library
    from draftgate.paths import default_cache_dir

    nat = _head(tiny_model).use_native(load_library(default_cache_dir()), torch.float32)  # torch's values
    ref = _head(tiny_model)
    C, nF, V = tiny_model.config.hidden_size, len(nat.feature_layers), tiny_model.config.vocab_size
    g = torch.Generator().manual_seed(3)
    lens = [5, 1, 12]
    feats = [torch.randn(m, nF, C, generator=g) for m in lens]  # [m_b, nF, C]
    toks = [torch.randint(0, V, (m,), generator=g) for m in lens]  # [m_b]
    alone = []
    for f, t in zip(feats, toks, strict=True):
        c = nat.new_cache(8)
        h, _ = nat.step(c, t, feats=f)
        alone.append((c, *nat.step(c, t[:1], g=h[None])))
    for head, exact in ((nat, True), (ref, False)):
        caches = [head.new_cache(2 + i) for i in range(3)]  # different capacities, all grow
        h, _ = head.step_many(caches, toks, feats=feats)  # [3, C]
        h2, logits2 = head.step_many(caches, [t[:1] for t in toks], g=[x[None] for x in h])
        for b, (c, hb, lb) in enumerate(alone):
            assert caches[b].n == c.n == lens[b] + 1
            if exact:
                assert torch.equal(h2[b], hb) and torch.equal(logits2[b], lb)
                assert torch.equal(caches[b].k[:, : c.n], c.k[:, : c.n])
            else:
                torch.testing.assert_close(logits2[b], lb, atol=1e-4 * float(lb.abs().max()), rtol=1e-4)
    with pytest.raises(ValueError, match="one cache"):
        nat.step_many([nat.new_cache(4)], toks, feats=feats)
