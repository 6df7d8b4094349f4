"""Tests for draftgate.sampling.transforms: temperature/top-k/top-p, sampling, uniforms."""

from __future__ import annotations

import pytest
import torch

from draftgate.sampling import draw_uniforms, logits_to_probs, sample_from_probs


def _logits(n: int, v: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * 2  # [N, V]


def test_no_filters_is_softmax_of_logits_over_temperature() -> None:
    x = _logits(4, 50)
    for t in (0.3, 1.0, 2.5):
        torch.testing.assert_close(logits_to_probs(x, t, 0, 1.0), (x / t).softmax(-1))


def test_half_precision_logits_give_float32_probs() -> None:
    x = _logits(3, 20).half()
    probs = logits_to_probs(x, 1.0, 0, 1.0)
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs, x.float().softmax(-1))


def test_greedy_is_one_hot_at_argmax_with_lowest_index_on_ties() -> None:
    x = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, -1.0, 5.0, 2.0]])
    probs = logits_to_probs(x, 0.0, 0, 1.0)
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize("k", [1, 3, 7])
def test_top_k_keeps_exactly_the_k_largest(k: int) -> None:
    x = _logits(8, 40, seed=1)  # continuous values: no ties
    probs = logits_to_probs(x, 1.0, k, 1.0)
    assert ((probs > 0).sum(-1) == k).all()
    top = x.topk(k, dim=-1).indices
    assert (probs.gather(1, top) > 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(8))
    # Renormalised softmax over the kept set.
    masked = torch.full_like(x, float("-inf")).scatter(1, top, x.gather(1, top))
    torch.testing.assert_close(probs, masked.softmax(-1))


def test_top_k_larger_than_vocab_disables() -> None:
    x = _logits(2, 10)
    torch.testing.assert_close(logits_to_probs(x, 1.0, 100, 1.0), x.softmax(-1))


def test_top_p_keeps_the_minimal_nucleus() -> None:
    base = torch.tensor([0.4, 0.3, 0.2, 0.1])
    x = base.log()[None, :].repeat(4, 1)  # [4, 4]
    top_p = torch.tensor([0.35, 0.5, 0.75, 0.95])
    probs = logits_to_probs(x, 1.0, 0, top_p)
    # mass 0.4 >= 0.35 -> {0}; 0.7 >= 0.5 -> {0, 1}; 0.9 >= 0.75 -> {0, 1, 2}; 1.0 >= 0.95 -> all
    assert (probs > 0).sum(-1).tolist() == [1, 2, 3, 4]
    torch.testing.assert_close(probs[1], torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]))


def test_top_p_always_keeps_one_token() -> None:
    x = _logits(5, 30, seed=2)
    probs = logits_to_probs(x, 1.0, 0, 1e-6)
    assert ((probs > 0).sum(-1) == 1).all()
    assert (probs.argmax(-1) == x.argmax(-1)).all()


def test_top_k_then_top_p_order() -> None:
    # After top-k=2 the kept mass renormalises to [0.6, 0.4] (from 0.3, 0.2): top-p=0.5 keeps 1.
    x = torch.tensor([[0.3, 0.2, 0.15, 0.15, 0.1, 0.1]]).log()
    probs = logits_to_probs(x, 1.0, 2, 0.5)
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    # Without top-k, top-p=0.5 needs two tokens (0.3 + 0.2).
    assert (logits_to_probs(x, 1.0, 0, 0.5) > 0).sum().item() == 2


def test_per_row_params_match_row_by_row_calls() -> None:
    x = _logits(4, 25, seed=3)
    temps = torch.tensor([0.0, 0.7, 1.0, 1.5])
    ks = torch.tensor([0, 5, 0, 3])
    ps = torch.tensor([1.0, 1.0, 0.8, 0.6])
    batched = logits_to_probs(x, temps, ks, ps)
    for i in range(4):
        one = logits_to_probs(x[i : i + 1], temps[i].item(), int(ks[i]), ps[i].item())
        torch.testing.assert_close(batched[i : i + 1], one)


def test_tiny_temperature_is_finite() -> None:
    probs = logits_to_probs(_logits(3, 10), 1e-30, 0, 1.0)
    assert torch.isfinite(probs).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(3))


def test_sample_from_probs_is_inverse_cdf() -> None:
    probs = torch.tensor([[0.25, 0.25, 0.5]]).repeat(4, 1)
    u = torch.tensor([0.0, 0.26, 0.5, 0.99])
    assert sample_from_probs(probs, u).tolist() == [0, 1, 2, 2]


def test_sample_from_probs_never_returns_zero_probability_tokens() -> None:
    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 1e-30, 0.0, 0.0]])
    # u just below 1 rounds u * total up to the total; u = 0 must skip leading zeros.
    for u in (0.0, 1.0 - 1e-12, 0.9999999):
        out = sample_from_probs(probs, torch.full((2,), u, dtype=torch.float64))
        assert probs.gather(1, out[:, None]).gt(0).all(), (u, out)


def test_sample_from_probs_accepts_unnormalised_rows() -> None:
    probs = torch.tensor([[0.1, 0.0, 0.3]])  # total 0.4
    assert sample_from_probs(probs, torch.tensor([0.2])).item() == 0
    assert sample_from_probs(probs, torch.tensor([0.3])).item() == 2


def test_draw_uniforms_rows_come_from_their_own_generator() -> None:
    gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    u = draw_uniforms(gens, 5, "cpu")
    assert u.shape == (3, 5) and ((u >= 0) & (u < 1)).all()
    alone = draw_uniforms([torch.Generator().manual_seed(2)], 5, "cpu")
    torch.testing.assert_close(u[1:2], alone)
    assert draw_uniforms([None, None], 4, "cpu").shape == (2, 4)
    assert draw_uniforms([], 4, "cpu").shape == (0, 4)
