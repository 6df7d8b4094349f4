"""Per-request state: position-keyed uniforms, stop rules, history bookkeeping."""

from __future__ import annotations

import random

import pytest
import torch

from draftgate.engine.sequence import PositionRandom, SequenceState, StopChecker
from draftgate.models.loader import LoadedModel
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams

EOS = 2  # the tiny tokenizer's </s>


@pytest.fixture(scope="module")
def tok(tiny_model: LoadedModel) -> TextTokenizer:
    assert tiny_model.tokenizer.eos_ids == (EOS,)
    return tiny_model.tokenizer


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ PositionRandom


def test_uniforms_depend_only_on_position() -> None:
    """However rounds slice the positions (any K, any acceptance), position t gets the same pair."""
    want = PositionRandom(_gen(7)).get(0, 300)  # [300, 2]
    assert want.shape == (300, 2) and want.dtype == torch.float64
    assert bool(((want >= 0) & (want < 1)).all())
    rng = random.Random(0)
    for _ in range(5):
        pr, t = PositionRandom(_gen(7)), 0
        while t < 280:
            k = rng.randint(0, 9)
            got = pr.get(t, k + 1)  # a round verifying k drafts looks at k + 1 positions
            assert torch.equal(got, want[t : t + k + 1])
            t += rng.randint(1, k + 1)  # it emits between 1 and k + 1 tokens


def test_uniforms_differ_by_seed_and_refuse_going_back() -> None:
    a, b = PositionRandom(_gen(1)), PositionRandom(_gen(2))
    assert not torch.equal(a.get(0, 10), b.get(0, 10))
    a.get(5, 3)
    with pytest.raises(AssertionError):
        a.get(4, 1)


# ------------------------------------------------------------------ StopChecker


def test_eos_cut_keeps_eos_and_drops_the_rest(tok: TextTokenizer) -> None:
    sc = StopChecker(tok, SamplingParams(max_new_tokens=100))
    assert sc.cut([10, 11], [12, EOS, 13, 14]) == (2, "stop")
    assert sc.cut([], [EOS]) == (1, "stop")
    assert sc.cut([10], [12, 13]) == (2, None)
    ignoring = StopChecker(tok, SamplingParams(max_new_tokens=100, ignore_eos=True))
    assert ignoring.cut([10], [12, EOS, 13]) == (3, None)


def test_max_new_tokens_cut_counts_earlier_output(tok: TextTokenizer) -> None:
    sc = StopChecker(tok, SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert sc.cut([], [10, 11, 12]) == (3, None)
    assert sc.cut([10, 11, 12], [13, 14, 15, 16]) == (2, "length")
    assert sc.cut([10, 11, 12, 13], [14]) == (1, "length")
    # EOS and the limit on the same token: EOS wins (plain decoding stops for EOS there too).
    assert StopChecker(tok, SamplingParams(max_new_tokens=2)).cut([10], [EOS]) == (1, "stop")


def test_stop_string_spanning_tokens(tok: TextTokenizer) -> None:
    hello, world, the = (tok.vocab()[w] for w in ("hello", "world", "the"))
    sc = StopChecker(tok, SamplingParams(max_new_tokens=100, stop=("hello world",)))
    assert sc.max_stop_len == len("hello world")
    assert sc.cut([the], [hello, the, hello, world, the]) == (4, "stop")
    assert sc.cut([the, hello], [world, the]) == (1, "stop")  # completed by the first new token
    assert sc.cut([the], [hello, the]) == (2, None)
    assert sc.trim_text("the hello world the") == "the "
    assert sc.trim_text("the hello") == "the hello"
    multi = StopChecker(tok, SamplingParams(stop=("xyz", "the")))
    assert multi.trim_text("hello the xyz") == "hello "


# ------------------------------------------------------------------ SequenceState


def test_sequence_state_history_and_pending(tok: TextTokenizer) -> None:
    params = SamplingParams(max_new_tokens=6)
    s = SequenceState([5, 6, 7], params, PositionRandom(_gen(0)), StopChecker(tok, params))
    other = SequenceState([5], params, PositionRandom(_gen(0)), StopChecker(tok, params))
    assert s.seq_id != other.seq_id
    assert s.history == [5, 6, 7] and s.pending == 7 and s.output == []
    assert s.append([20]) == [20] and s.pending == 20
    assert s.append([21, 22, EOS, 23]) == [21, 22, EOS]
    assert s.finish_reason == "stop"
    assert s.output == [20, 21, 22, EOS] and s.history == [5, 6, 7, 20, 21, 22, EOS]
    s.history.append(99)
    assert s.prompt == [5, 6, 7]  # the history is a copy, never the prompt itself
