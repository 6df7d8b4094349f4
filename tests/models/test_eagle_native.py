"""The draft head on the native kernels (models/eagle_native.py) computes what torch's products compute."""

from __future__ import annotations

import pytest
import torch
from eagle_support import tiny_head

from draftgate.models.loader import LoadedModel
from draftgate.models.native import load_library
from draftgate.paths import default_cache_dir


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_products_compute_what_torch_computes(tiny_model: LoadedModel, dtype: torch.dtype) -> None:
    """Drafting on the native pool: float32 storage gives torch's values, bfloat16 storage their rounding."""
    ref, nat = tiny_head(tiny_model), tiny_head(tiny_model).use_native(load_library(default_cache_dir()), dtype)
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
        caches.append(torch.cat([cache.keys(), cache.values()]))  # [2 Hkv, n, D]
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
    nat = tiny_head(tiny_model).use_native(load_library(default_cache_dir()), torch.float32)  # torch's values
    ref = tiny_head(tiny_model)
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
                assert torch.equal(caches[b].keys(), c.keys()) and torch.equal(caches[b].values(), c.values())
            else:
                torch.testing.assert_close(logits2[b], lb, atol=1e-4 * float(lb.abs().max()), rtol=1e-4)
    with pytest.raises(ValueError, match="one cache"):
        nat.step_many([nat.new_cache(4)], toks, feats=feats)
