"""Llama forward over paged KV == transformers' LlamaForCausalLM, in float32 (max abs logit diff <= 1e-4).

Every case runs through ModelRunner with small blocks, so sequences span several
blocks and the paged gather, the ragged layout and rollback are all exercised. The
runner is shared within the module, so later tests also run on reused blocks that
still hold earlier tests' KV.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, ModelRunner

# Measured: tiny model <= 6e-6; SmolLM2 <= 8.4e-5 (single-token decode; logits reach ~32).
# On SmolLM2 transformers' own "eager" and "sdpa" paths differ by 9.9e-5, so for the
# real model this budget is fp32 noise: a real bug (RoPE, masking, a stale slot) is >> 1e-3.
TOL = 1e-4
REL_TOL = 5e-6  # of the largest reference logit
MODELS = ["tiny", pytest.param("real", marks=pytest.mark.real_model)]


@pytest.fixture(scope="module", params=MODELS)
def model(request: pytest.FixtureRequest) -> LoadedModel:
    return request.getfixturevalue("tiny_model" if request.param == "tiny" else "real_model")


@pytest.fixture(scope="module")
def hf(model: LoadedModel, hf_reference):
    return hf_reference(model)


@pytest.fixture(scope="module")
def shared_runner(model: LoadedModel) -> Iterator[ModelRunner]:
    """One runner per model (building one copies SmolLM2's weights); no prefix cache here."""
    block_size = 4 if model.config.num_layers <= 2 else 8
    runner = ModelRunner(model, num_blocks=48, block_size=block_size, enable_prefix_cache=False)
    yield runner
    runner.kv.check_no_leaks()


@pytest.fixture
def runner(shared_runner: ModelRunner) -> Iterator[ModelRunner]:
    """The shared runner; each test's sequences (ids 0..9) are freed after it."""
    assert shared_runner.kv.num_sequences == 0
    yield shared_runner
    for seq_id in range(10):
        shared_runner.free(seq_id)


def random_tokens(model: LoadedModel, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    """transformers' logits [T, V] for a whole sequence, computed from scratch."""
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape and ours.dtype == torch.float32
    diff = (ours - ref).abs().max().item()
    # fp32 sums in another order (our kernels' FMA chains vs transformers' BLAS, 30 layers) differ by
    # a few ulps of the largest logits: measured 1.2e-4 on an AVX2 CPU with logits near 30; a real
    # error is orders of magnitude larger.
    tol = max(TOL, REL_TOL * ref.abs().max().item())
    assert diff <= tol, f"max abs logit difference {diff:.3g} > {tol:.3g}"


def test_prefill_all_positions(model: LoadedModel, hf, runner: ModelRunner) -> None:
    prompt = random_tokens(model, 29, seed=1)  # 8 blocks of 4 / 4 blocks of 8, last one partial
    assert runner.add_sequence(0, prompt) == 0
    (logits,) = runner.forward([ForwardItem(0, prompt, num_logits=len(prompt))])
    assert_close(logits, hf_logits(hf, prompt))
    assert runner.length(0) == len(prompt)


def test_decode_after_prefill(model: LoadedModel, hf, runner: ModelRunner) -> None:
    prompt = random_tokens(model, 15, seed=2)
    last = runner.prefill(0, prompt)
    ref = hf_logits(hf, prompt + [7, 11])
    assert_close(last[None], ref[-3:-2])
    tokens = list(prompt)
    for t in (7, 11):  # two single-token steps; the first crosses a block boundary at 16
        tokens.append(t)
        (logits,) = runner.forward([ForwardItem(0, [t])])
        assert_close(logits, ref[len(tokens) - 1 : len(tokens)])


def test_extend_truncate_extend(model: LoadedModel, hf, runner: ModelRunner) -> None:
    """A speculative round trip: K+1 = 5 tokens, reject 3, verify 5 other tokens."""
    prompt = random_tokens(model, 13, seed=3)
    first, second = random_tokens(model, 5, seed=4), random_tokens(model, 5, seed=5)
    runner.prefill(0, prompt)
    (logits,) = runner.forward([ForwardItem(0, first, num_logits=5)])
    assert_close(logits, hf_logits(hf, prompt + first)[-5:])
    runner.truncate(0, len(prompt) + 2)  # keep 2 of the 5: the cut lands inside a block
    (logits,) = runner.forward([ForwardItem(0, second, num_logits=5)])
    final = prompt + first[:2] + second
    assert runner.length(0) == len(final)
    assert_close(logits, hf_logits(hf, final)[-5:])


def test_ragged_batch_in_one_forward(model: LoadedModel, hf, runner: ModelRunner) -> None:
    prompt_lens, new_lens = [5, 17, 9, 2], [3, 1, 5, 2]
    prompts = [random_tokens(model, n, seed=10 + i) for i, n in enumerate(prompt_lens)]
    news = [random_tokens(model, n, seed=20 + i) for i, n in enumerate(new_lens)]
    tails = [[4, 5, 6], [], [8], []]  # a third step for two of the four sequences
    # One reference per sequence over its final history; each step compares against a slice.
    refs = [hf_logits(hf, p + n + t) for p, n, t in zip(prompts, news, tails, strict=True)]
    for i, p in enumerate(prompts):
        runner.add_sequence(i, p)
    # Ragged prefill: every position of four prompts of different lengths in one call.
    out = runner.forward([ForwardItem(i, p, num_logits=len(p)) for i, p in enumerate(prompts)])
    for p, ref, logits in zip(prompts, refs, out, strict=True):
        assert_close(logits, ref[: len(p)])
    # Ragged extension: 1..5 new tokens per sequence, again one call.
    out = runner.forward([ForwardItem(i, n, num_logits=len(n)) for i, n in enumerate(news)])
    for p, n, ref, logits in zip(prompts, news, refs, out, strict=True):
        assert_close(logits, ref[len(p) : len(p) + len(n)])
    # Fewer logits than tokens: only the last positions come back.
    out = runner.forward([ForwardItem(i, t, num_logits=1) for i, t in enumerate(tails) if t])
    for i, logits in zip([0, 2], out, strict=True):
        assert_close(logits, refs[i][-1:])
    assert [runner.length(i) for i in range(4)] == [len(r) for r in refs]
