"""Draft trees in one forward: a tree node's logits are plain decoding's along its path, bitwise.

A tree's tokens take consecutive KV slots but attend only the context and their own ancestors, at
their path positions (``ForwardItem.parents``); ``keep_path`` moves one path's KV into place.
Greedy identity of a tree round rests on both, so these tests compare with ``torch.equal`` on the
native kernels (every level this CPU runs, and the real model), and with a tolerance on PyTorch's.
"""

from __future__ import annotations

import pytest
import torch
from levels_support import skip_unless_here
from test_invariance import _tokens

from draftgate.models import native
from draftgate.models.loader import LoadedModel
from draftgate.models.native import LEVELS
from draftgate.models.native_llama import NativeLlama
from draftgate.models.runner import ForwardItem, Kernels, ModelRunner


def _plain(runner: ModelRunner, seq: int, prompt: list[int], path: list[int]) -> torch.Tensor:
    """Logits [len(path), V] of each path token decoded one at a time after ``prompt``."""
    runner.prefill(seq, prompt)
    out = torch.cat([runner.forward([ForwardItem(seq, [t])])[0] for t in path])
    runner.free(seq)
    return out


def _tree(path: list[int], decoys: list[int]) -> tuple[list[int], list[int], list[int]]:
    """A tree holding ``path`` (its first token the root) among decoy branches: (tokens, parents, path rows).

    Decoys hang off every path node, some before and some after the path's next token, and one
    decoy has a child of its own, so path rows are not consecutive and other rows sit between them.
    """
    tokens, parents, rows = [path[0]], [-1], [0]
    for i, t in enumerate(path[1:]):
        up = rows[-1]
        if i % 2 == 0:  # a decoy sibling first, with a child
            tokens += [decoys[i], decoys[i] ^ 1]
            parents += [up, len(tokens) - 2]
        tokens.append(t)
        parents.append(up)
        rows.append(len(tokens) - 1)
        if i % 2 == 1:  # a decoy sibling after
            tokens.append(decoys[i])
            parents.append(up)
    return tokens, parents, rows


def check_tree(runner: ModelRunner, model: LoadedModel, exact: bool = True) -> None:
    prompt, path = _tokens(model, 37, seed=11), _tokens(model, 6, seed=12)
    decoys = [(t + 7) % model.config.vocab_size for t in _tokens(model, 6, seed=13)]
    ref = _plain(runner, 0, prompt, path + [path[0]])  # [7, V]: the path, then one token after it
    tokens, parents, rows = _tree(path, decoys)
    same = torch.equal if exact else (lambda a, b: bool((a - b).abs().max() <= 1e-4))

    # 1. Alone, and 2. beside another sequence's chain and another tree, in one forward.
    runner.prefill(1, prompt)
    runner.prefill(2, prompt[:20])
    runner.prefill(3, prompt)
    P = len(prompt)
    for beside in (False, True):
        items = [ForwardItem(1, tokens, len(tokens), parents=parents)]
        if beside:
            items += [ForwardItem(2, path[:3], 3), ForwardItem(3, tokens[::-1][:4], 4, parents=[-1, 0, 0, 1])]
        out = runner.forward(items)
        bad = [i for i, r in enumerate(rows) if not same(out[0][r], ref[i])]
        assert not bad, f"path tokens {bad} differ from plain decoding (beside others: {beside})"
        for sid, n in ((1, P), (2, 20), (3, P)):
            runner.truncate(sid, n)

    # 3. The kept path's KV is what plain decoding writes: the next token agrees, and so does a chain.
    runner.forward([ForwardItem(1, tokens, len(tokens), parents=parents)])
    runner.keep_path(1, P, rows)
    assert runner.length(1) == P + len(path)
    (nxt,) = runner.forward([ForwardItem(1, [path[0]])])
    assert same(nxt[0], ref[len(path)]), "the position after a kept path differs"
    for sid in (1, 2, 3):
        runner.free(sid)
    runner.kv.check_no_leaks()


@pytest.mark.real_model
def test_real_model_tree_nodes_are_plain_decoding(real_model: LoadedModel) -> None:
    runner = ModelRunner(real_model, num_blocks=64, block_size=16, enable_prefix_cache=False)
    assert runner.kernels is Kernels.NATIVE
    check_tree(runner, real_model)


@pytest.mark.parametrize("level", LEVELS)
def test_every_kernel_level_computes_tree_nodes_exactly(tiny_model: LoadedModel, level: str, tmp_path) -> None:
    skip_unless_here(level)
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=8, enable_prefix_cache=False)
    runner.model = NativeLlama(tiny_model.config, tiny_model.weights, native.load_library(tmp_path, level=level))
    check_tree(runner, tiny_model)


def test_torch_kernels_compute_the_same_tree(tiny_model: LoadedModel) -> None:
    check_tree(ModelRunner(tiny_model, num_blocks=64, block_size=8, kernels=Kernels.TORCH), tiny_model, exact=False)


def test_a_tree_that_ignores_its_mask_is_caught(tiny_model: LoadedModel) -> None:
    """Negative control: the same tokens run as a chain (each attending every earlier row) fail the check."""
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=8, enable_prefix_cache=False)
    forward = runner.forward

    def no_mask(items):  # type: ignore[no-untyped-def]
        return forward([ForwardItem(it.seq_id, it.tokens, it.num_logits) for it in items])

    runner.forward = no_mask  # type: ignore[method-assign]
    with pytest.raises(AssertionError, match="differ from plain decoding"):
        check_tree(runner, tiny_model)


def test_a_bad_tree_is_refused(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=16, block_size=8)
    runner.prefill(1, [3, 4, 5])
    for parents in ([0, 0], [-1, 1], [-1, -1], [-1, 0, 3]):
        with pytest.raises(AssertionError, match="bad tree"):
            runner.forward([ForwardItem(1, [6] * len(parents), 1, parents=parents)])
        assert runner.length(1) == 3
    runner.free(1)
    runner.kv.check_no_leaks()
