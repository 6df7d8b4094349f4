"""Batch invariance: a position's logits are bitwise the same however many rows share its pass.

Greedy speculative output equals plain decoding only if the target's logits at a position do
not depend on the pass that computed them: one row (plain decoding), K+1 rows (verification) or
a ragged batch of several sequences (continuous batching). The native kernels guarantee it by
construction (models/native/gemm.h); these tests check it on the real model with torch.equal,
never a tolerance, for pass widths 1..17, mixes of sequences, and the KV a wide pass leaves
behind (what later positions read).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from levels_support import skip_unless_here

from draftgate.models import native
from draftgate.models.batch import ForwardOutput
from draftgate.models.gguf_blocks import load_blocks, quantize
from draftgate.models.loader import LoadedModel
from draftgate.models.native import LEVELS, NativeLib
from draftgate.models.native_llama import NativeLlama
from draftgate.models.runner import ForwardItem, Kernels, ModelRunner

WIDTHS = range(1, 18)  # K + 1 for K = 0..16


def _tokens(model: LoadedModel, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()


def _one_at_a_time(runner: ModelRunner, seq: int, tokens: list[int]) -> torch.Tensor:
    """Logits [n, V] of each token, computed by n one-row passes (plain decoding)."""
    rows = [runner.forward([ForwardItem(seq, [t])])[0] for t in tokens]
    return torch.cat(rows)


def check_invariance(runner: ModelRunner, model: LoadedModel) -> None:
    prompt, cont = _tokens(model, 40, seed=1), _tokens(model, max(WIDTHS) + 1, seed=2)
    runner.prefill(0, prompt)
    P = len(prompt)
    ref = _one_at_a_time(runner, 0, cont)  # [18, V]

    # 1. Every width 1..17 (a K+1-row verify pass) gives the one-row logits bitwise.
    for w in WIDTHS:
        runner.truncate(0, P)
        (logits,) = runner.forward([ForwardItem(0, cont[:w], num_logits=w)])
        bad = [i for i in range(w) if not torch.equal(logits[i], ref[i])]
        assert not bad, f"width {w}: positions {bad} differ from one-row decoding"
        # 2. The KV the wide pass wrote is the KV plain decoding writes: the next position agrees.
        (nxt,) = runner.forward([ForwardItem(0, [cont[w]])])
        assert torch.equal(nxt[0], ref[w]), f"position after a width-{w} pass differs"

    # 3. Ragged batches: the same sequence beside others of other widths and contexts.
    others = [(1, _tokens(model, 23, seed=3)), (2, _tokens(model, 7, seed=4)), (3, _tokens(model, 61, seed=5))]
    for sid, p in others:
        runner.prefill(sid, p)
    lens = {sid: len(p) for sid, p in others}
    for mix, w in [((1,), 5), ((1, 2), 9), ((3, 2, 1), 1), ((2,), 17), ((1, 2, 3), 4)]:
        runner.truncate(0, P)
        items = [ForwardItem(0, cont[:w], num_logits=w)]
        items += [ForwardItem(sid, _tokens(model, 1 + (sid * w) % 6, seed=sid + w), 1) for sid in mix]
        out = runner.forward(items)
        assert torch.equal(out[0], ref[:w]), f"width {w} beside sequences {mix} differs"
        for sid in mix:
            runner.truncate(sid, lens[sid])
    for sid in (0, 1, 2, 3):
        runner.free(sid)


@pytest.mark.real_model
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "gguf"])
def test_real_model_logits_are_batch_invariant(real_model: LoadedModel, dtype: torch.dtype | str) -> None:
    """Every weight format the model runs in: float32, bfloat16 and its own Q4_1/Q8_0 blocks."""
    model = real_model
    if dtype == "gguf":
        cfg = real_model.config
        assert real_model.gguf_path is not None
        model = replace(real_model, blocks=load_blocks(real_model.gguf_path, cfg))
    elif dtype != torch.float32:
        model = LoadedModel(
            model.config,
            {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.weights.items()},
            model.tokenizer,
            model.source,
        )
    runner = ModelRunner(model, num_blocks=64, block_size=16, enable_prefix_cache=False)
    assert runner.kernels is Kernels.NATIVE  # the CPU default
    assert isinstance(runner.model, NativeLlama)
    assert runner.model.weight_format == ("q4+q8" if dtype == "gguf" else str(dtype).removeprefix("torch."))
    check_invariance(runner, model)
    runner.kv.check_no_leaks()


@pytest.mark.parametrize("level", LEVELS)
def test_every_kernel_level_is_invariant_and_matches_torch(tiny_model: LoadedModel, level: str, tmp_path) -> None:
    """Each instruction-set build (AVX-512, AVX2, portable) is invariant and agrees with PyTorch."""
    skip_unless_here(level)
    lib = native.load_library(tmp_path, level=level)
    assert lib.cdll.dg_isa().decode() == level
    runner = _runner_on(tiny_model, lib)
    check_invariance(runner, tiny_model)
    torch_runner = ModelRunner(tiny_model, num_blocks=64, block_size=8, kernels=Kernels.TORCH)
    prompt = _tokens(tiny_model, 30, seed=9)
    a = runner.prefill(0, prompt)
    b = torch_runner.prefill(0, prompt)
    assert (a - b).abs().max().item() <= 1e-4


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_every_kernel_level_is_invariant_on_quantized_weights(
    tiny_model: LoadedModel, level: str, fmt: str, tmp_path
) -> None:
    """The whole forward on quantized blocks (every product, the tied-or-not head, the embedding
    lookup), at each instruction-set level; the products' own formats: tests/models/test_quant.py."""
    skip_unless_here(level)
    lib = native.load_library(tmp_path, level=level)
    blocks = {k: quantize(w, fmt) for k, w in tiny_model.weights.items() if w.ndim == 2}
    model = replace(tiny_model, blocks=blocks)
    runner = ModelRunner(model, num_blocks=64, block_size=8, enable_prefix_cache=False)
    runner.model = NativeLlama(model.config, model.weights, lib, blocks)
    assert runner.model.weight_format == fmt[:2]
    check_invariance(runner, model)


def _runner_on(model: LoadedModel, lib: NativeLib) -> ModelRunner:
    """A runner whose forward runs on ``lib`` (the default runner loads this CPU's level)."""
    runner = ModelRunner(model, num_blocks=64, block_size=8, enable_prefix_cache=False)
    runner.model = NativeLlama(model.config, model.weights, lib)
    return runner


class _WidthDependent(NativeLlama):
    """A planted defect: logits that move by one ulp-sized step per extra row in the pass."""

    def forward(self, batch, kv):  # type: ignore[no-untyped-def]
        out = super().forward(batch, kv)
        return ForwardOutput(out.logits + 1e-6 * (batch.num_rows - 1), out.argmax)


def test_the_check_catches_a_width_dependent_forward(tiny_model: LoadedModel) -> None:
    runner = ModelRunner(tiny_model, num_blocks=64, block_size=8, enable_prefix_cache=False)
    runner.model = _WidthDependent(tiny_model.config, tiny_model.weights, runner.model.lib)  # type: ignore[union-attr]
    with pytest.raises(AssertionError, match="width 2"):
        check_invariance(runner, tiny_model)
