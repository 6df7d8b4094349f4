"""The stateless Score call on the tiny model: what it refuses, and that its rows are the model's own."""

from __future__ import annotations

import pytest
import torch

from draftgate.engine import scoring
from draftgate.engine.scoring import MAX_TOP_N, ScoredPosition, ScoreJob, score_positions
from draftgate.errors import BadRequestError
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, ModelRunner

V, CTX = 96, 256  # the tiny model's vocabulary and context (tests/conftest.py)
TOKENS = [1, 7, 9, 11, 13, 5, 8, 21, 30, 4, 17, 40, 63, 2, 9, 9, 77, 12, 50, 33]


@pytest.fixture(scope="module")
def runner(tiny_model: LoadedModel) -> ModelRunner:
    return ModelRunner(tiny_model, num_blocks=40, block_size=8)  # 320 slots: a full context fits


@pytest.fixture(scope="module")
def reference(tiny_model: LoadedModel) -> torch.Tensor:
    """log p over TOKENS from one plain forward with every row's logits ([n, V]; row i predicts i + 1)."""
    ref = ModelRunner(tiny_model, num_blocks=8, block_size=8, enable_prefix_cache=False)
    ref.add_sequence(1, TOKENS)
    logits = ref.forward([ForwardItem(1, TOKENS, len(TOKENS))])[0]
    ref.free(1)
    return logits.float().log_softmax(-1)


def _score(runner: ModelRunner, tokens: list[int], offset: int, top_n: int) -> list[ScoredPosition]:
    return score_positions(runner, ScoreJob.checked(runner, tokens, offset, top_n))


def _assert_idle(runner: ModelRunner) -> None:
    assert runner.kv.num_sequences == 0  # the scratch sequence is freed
    runner.kv.check_no_leaks()


@pytest.mark.parametrize(
    ("tokens", "offset", "top_n", "says"),
    [
        ([], 0, 1, f"tokens must be a non-empty list of ids in [0, {V})"),
        ([1, V, 2], 0, 1, f"ids in [0, {V})"),
        ([1, -1, 2], 0, 1, f"ids in [0, {V})"),
        ([1] * (CTX + 1), 0, 1, f"{CTX + 1} tokens exceed the model's context of {CTX}"),
        ([1, 2, 3, 4, 5], 6, 1, "validation_offset 6 is past the 5 tokens"),
        ([1, 2, 3], 1, MAX_TOP_N + 1, f"top_n must be in [0, {MAX_TOP_N}], got {MAX_TOP_N + 1}"),
        ([1, 2, 3], 1, -1, f"top_n must be in [0, {MAX_TOP_N}], got -1"),
    ],
)
def test_bad_calls_are_bad_requests_that_say_what_is_wrong(
    runner: ModelRunner, tokens: list[int], offset: int, top_n: int, says: str
) -> None:
    with pytest.raises(BadRequestError) as e:
        ScoreJob.checked(runner, tokens, offset, top_n)
    assert says in str(e.value)


def test_tokens_that_do_not_fit_the_kv_cache_are_a_bad_request(tiny_model: LoadedModel) -> None:
    small = ModelRunner(tiny_model, num_blocks=4, block_size=8)  # 32 slots
    assert ScoreJob.checked(small, [3] * 32, 0, 1).tokens == [3] * 32  # exactly full: fine
    with pytest.raises(BadRequestError, match="do not fit in the worker's KV cache"):
        ScoreJob.checked(small, [3] * 33, 0, 1)


def test_limits_themselves_are_accepted(runner: ModelRunner) -> None:
    job = ScoreJob.checked(runner, [V - 1] * CTX, CTX, MAX_TOP_N)  # full context, offset at the end, most top_n
    assert (len(job.tokens), job.start, job.top_n) == (CTX, CTX, MAX_TOP_N)
    assert ScoreJob.checked(runner, [0], 0, 0).start == 1  # position 0 has no prediction: scoring starts at 1
    assert ScoreJob.checked(runner, (torch.tensor(5), 6), 1, 0).tokens == [5, 6]  # ids become ints


def test_scored_positions_are_the_models_own_log_probs(runner: ModelRunner, reference: torch.Tensor) -> None:
    offset, top_n = 12, 5
    got = _score(runner, TOKENS, offset, top_n)
    n = len(TOKENS)
    assert [p.position for p in got] == list(range(offset, n + 1))
    for p in got:
        row = reference[p.position - 1]  # the logits row that predicts this position
        top = row.topk(top_n)
        if p.position < n:
            assert p.token == TOKENS[p.position]
            assert p.logprob == pytest.approx(float(row[p.token]), abs=1e-4)
        else:  # the next-token distribution: no token of its own
            assert p.token is None and p.logprob is None
        assert p.top_ids == top.indices.tolist()
        assert p.top_ids[0] == int(row.argmax())  # the model's greedy choice comes first
        assert p.top_logprobs == pytest.approx(top.values.tolist(), abs=1e-4)
    _assert_idle(runner)


def test_top_n_is_how_many_alternatives_each_position_gets(runner: ModelRunner, reference: torch.Tensor) -> None:
    none = _score(runner, TOKENS, 15, 0)
    assert all(p.top_ids == [] and p.top_logprobs == [] for p in none)
    assert [p.logprob for p in none[:-1]] == pytest.approx(
        [float(reference[i - 1, TOKENS[i]]) for i in range(15, 20)], abs=1e-4
    )
    most = _score(runner, TOKENS, 15, MAX_TOP_N)
    for p in most:
        assert len(p.top_ids) == len(set(p.top_ids)) == MAX_TOP_N
        assert p.top_logprobs == sorted(p.top_logprobs, reverse=True)
    _assert_idle(runner)


def test_offset_zero_scores_every_position_after_the_first(runner: ModelRunner, reference: torch.Tensor) -> None:
    got = _score(runner, TOKENS, 0, 1)
    assert [p.position for p in got] == list(range(1, len(TOKENS) + 1))
    assert [p.top_ids[0] for p in got] == reference.argmax(-1).tolist()


def test_a_repeated_prefix_is_read_from_the_cache_with_the_same_result(
    runner: ModelRunner, tiny_model: LoadedModel
) -> None:
    tokens = [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77]  # not used elsewhere
    first = _score(runner, tokens, 4, 3)
    hits = runner.kv.stats()["prefix_hit_tokens"]
    again = _score(runner, tokens, 4, 3)  # the cached prefix covers rows that must be scored: recomputed
    assert runner.kv.stats()["prefix_hit_tokens"] > hits
    longer = _score(runner, [*tokens, 5, 6], 19, 3)  # context from the cache, only the new rows run
    for a, b in zip(first, again, strict=True):
        assert (a.position, a.token, a.top_ids) == (b.position, b.token, b.top_ids)
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
    assert [p.position for p in longer] == [19, 20]
    plain = ModelRunner(tiny_model, num_blocks=8, block_size=8, enable_prefix_cache=False)
    for p, q in zip(longer, _score(plain, [*tokens, 5, 6], 19, 3), strict=True):
        assert (p.token, p.top_ids) == (q.token, q.top_ids)
        assert p.logprob == pytest.approx(q.logprob, abs=1e-4)
    _assert_idle(runner)


@pytest.mark.parametrize("offset", [1, 8, 14])
def test_long_inputs_are_run_in_chunks_with_the_same_rows(
    tiny_model: LoadedModel, reference: torch.Tensor, monkeypatch: pytest.MonkeyPatch, offset: int
) -> None:
    monkeypatch.setattr(scoring, "_SCORE_CHUNK", 3)  # context and scored rows both span several chunks
    fresh = ModelRunner(tiny_model, num_blocks=8, block_size=8)  # nothing cached: the context runs too
    got = _score(fresh, TOKENS, offset, 2)
    assert [p.position for p in got] == list(range(offset, len(TOKENS) + 1))
    for p in got:
        assert p.top_ids == reference[p.position - 1].topk(2).indices.tolist()
        if p.token is not None:
            assert p.logprob == pytest.approx(float(reference[p.position - 1, p.token]), abs=1e-4)
    _assert_idle(fresh)
