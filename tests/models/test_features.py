"""Hidden states returned with the logits (``forward_flat(..., feature_layers=...)``), for draft heads.

They must be the model's own hidden states (checked against transformers' ``hidden_states``),
the same in the native and the PyTorch forward, batch invariant like the logits, and free:
asking for none leaves the plain path's output as it was.
"""

from __future__ import annotations

import pytest
import torch

from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, Kernels, ModelRunner

PROMPT = [1, 7, 9, 11, 13, 5, 8, 21, 30, 4, 9, 11]


def _run(runner: ModelRunner, tokens: list[int], n_logits: int, layers: tuple[int, ...], others: int = 0):  # type: ignore[no-untyped-def]
    """Features of one sequence's last n_logits rows, optionally batched with `others` other sequences."""
    runner.prefill(0, tokens[:1])
    items = [ForwardItem(0, tokens[1:], n_logits)]
    for j in range(others):
        runner.prefill(100 + j, [2, 6 + j])
        items.append(ForwardItem(100 + j, [3 + j, 4, 5 + j], 2))
    try:
        return runner.forward_flat(items, layers)
    finally:
        for sid in [0, *range(100, 100 + others)]:
            runner.free(sid)


@pytest.mark.parametrize("kernels", [Kernels.NATIVE, Kernels.TORCH])
def test_features_are_the_models_hidden_states(tiny_model: LoadedModel, hf_reference, kernels: Kernels) -> None:  # type: ignore[no-untyped-def]
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=8, kernels=kernels, enable_prefix_cache=False)
    L = tiny_model.config.num_layers
    out = _run(runner, PROMPT, 4, (0, L))
    assert out.features is not None and out.features.shape == (4, 2, tiny_model.config.hidden_size)
    with torch.no_grad():
        hs = hf_reference(tiny_model)(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
    # transformers: hidden_states[1] is layer 0's output, hidden_states[L] the final normed hidden.
    torch.testing.assert_close(out.features[:, 0], hs[1][0, -4:].float(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.features[:, 1], hs[L][0, -4:].float(), rtol=1e-4, atol=1e-4)


def test_features_are_batch_invariant_and_cost_the_plain_path_nothing(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=8, enable_prefix_cache=False)
    assert runner.kernels is Kernels.NATIVE
    L = tiny_model.config.num_layers
    alone = _run(runner, PROMPT, 3, (1, L, 0))
    batched = _run(runner, PROMPT, 3, (1, L, 0), others=3)
    assert batched.features is not None and alone.features is not None
    assert torch.equal(batched.features[:3], alone.features)  # bitwise, as the logits are
    plain = _run(runner, PROMPT, 3, ())
    assert plain.features is None
    assert torch.equal(plain.logits, alone.logits) and torch.equal(plain.argmax, alone.argmax)
    with pytest.raises(ValueError, match="feature layers"):
        _run(runner, PROMPT, 1, (L + 1,))
    runner.kv.check_no_leaks()


@pytest.mark.parametrize("kernels", [Kernels.NATIVE, Kernels.TORCH])
def test_feature_rows_need_not_be_logit_rows(tiny_model: LoadedModel, kernels: Kernels) -> None:
    """A prefill wants every row's features and one row's logits: the same values as asking for all logits."""
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=8, kernels=kernels, enable_prefix_cache=False)
    L, n = tiny_model.config.num_layers, len(PROMPT) - 1
    every = _run(runner, PROMPT, n, (0, L))  # logits and features of all n rows
    runner.prefill(0, PROMPT[:1])
    runner.prefill(1, [2, 6])
    items = [ForwardItem(0, PROMPT[1:], 1, n), ForwardItem(1, [3, 4, 5], 2)]  # the other item: its logit rows
    try:
        out = runner.forward_flat(items, (0, L))
    finally:
        runner.free(0)
        runner.free(1)
    assert out.features is not None and every.features is not None
    assert out.logits.shape[0] == 3 and out.features.shape[:2] == (n + 2, 2)
    torch.testing.assert_close(out.features[:n], every.features, rtol=0, atol=0 if kernels is Kernels.NATIVE else 1e-5)
    torch.testing.assert_close(out.logits[0], every.logits[-1], rtol=0, atol=0 if kernels is Kernels.NATIVE else 1e-5)
    runner.kv.check_no_leaks()
