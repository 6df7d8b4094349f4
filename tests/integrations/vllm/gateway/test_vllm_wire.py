"""vLLM's token wire, pure parts: read_row's checks on prompt-logprob rows, top1, sampling_body."""

from __future__ import annotations

import math

import pytest

from draftgate.integrations.vllm.gateway.wire import GarbageRow, RowError, Scored, margin, read_row, sampling_body, top1
from draftgate.types import SamplingParams

Row = dict[int, tuple[float, int]]
IDS = [5, 7, 9, 11]  # row m predicts IDS[m]


def _scored(rows: list[Row | None], cached: int | None = None) -> Scored:
    return Scored(rows=rows, token=3, cached=cached)


def _at(row: Row, m: int = 1, ids: list[int] = IDS, cached: int | None = None) -> Row:
    rows: list[Row | None] = [None] * len(ids)
    rows[m] = row
    return read_row(_scored(rows, cached), ids, m)


def _garbage(row: Row, m: int = 1, ids: list[int] = IDS) -> None:
    with pytest.raises(GarbageRow):
        _at(row, m, ids)


def test_well_formed_row_own_token_is_top1() -> None:
    row = {7: (-0.1, 1)}
    assert _at(row) == row
    assert top1(row) == 7


def test_well_formed_row_own_token_below_top1() -> None:
    row = {9: (-2.5, 3), 4: (-0.2, 1)}
    assert _at(row, m=2) == row
    assert top1(row) == 4


def test_row_past_the_cached_prefix_is_read() -> None:
    row = {11: (-0.3, 1)}
    assert _at(row, m=3, cached=2) == row
    assert _at(row, m=3, cached=0) == row


@pytest.mark.parametrize("token", [7, 0])
@pytest.mark.parametrize("rank", [1, 2])  # the last top-k rank vLLM writes over the zeroed token: 1 or 2 asked
def test_zero_filled_row_is_not_computed(token: int, rank: int) -> None:
    ids = [5, token, 9]
    with pytest.raises(RowError) as e:
        _at({0: (0.0, rank)}, m=1, ids=ids)
    assert not isinstance(e.value, GarbageRow)


def test_margin_is_the_lead_of_the_top1_over_the_runner_up() -> None:
    assert margin({4: (-0.2, 1), 9: (-0.7, 2)}) == pytest.approx(0.5)
    assert margin({4: (-0.2, 1), 9: (-0.2, 2)}) == 0.0  # a tie: vLLM still ranks one of them first
    assert margin({4: (-0.2, 1), 9: (-2.5, 3), 5: (-0.9, 2)}) == pytest.approx(0.7)  # the own token listed too
    assert margin({4: (-0.2, 1)}) == math.inf


@pytest.mark.parametrize("cached,m", [(2, 1), (2, 2), (1, 1), (0, 0)])
def test_row_in_the_cached_prefix_is_refused_even_if_well_formed(cached: int, m: int) -> None:
    ids = [5, 7, 9, 11]
    rows: list[Row | None] = [{t: (-0.1, 1)} for t in ids]
    with pytest.raises(RowError) as e:
        read_row(_scored(rows, cached), ids, m)
    assert not isinstance(e.value, GarbageRow)
    assert read_row(_scored(rows, cached), ids, cached + 1) == {ids[cached + 1]: (-0.1, 1)}


@pytest.mark.parametrize("m", [0, 4, 10, -1])
def test_missing_row_is_refused(m: int) -> None:
    rows: list[Row | None] = [None, {7: (-0.1, 1)}, {9: (-0.1, 1)}, {11: (-0.1, 1)}]
    ids = IDS + [13, 15, 17, 19, 21, 23, 25]
    with pytest.raises(RowError) as e:
        read_row(_scored(rows), ids, m)
    assert not isinstance(e.value, GarbageRow)


def test_own_token_missing_is_garbage() -> None:
    _garbage({4: (-0.1, 1)})


def test_own_token_without_rank_is_garbage() -> None:
    _garbage({7: (-0.5, 0), 4: (-0.1, 1)})  # rank 0: vLLM sent no rank


def test_tie_at_the_top_is_garbage() -> None:
    _garbage({7: (-math.log(2), 1), 4: (-math.log(2), 1)})
    _garbage({9: (-1.0, 2), 4: (-0.7, 1), 6: (-0.7, 1)}, m=2)


def test_no_rank1_entry_is_garbage() -> None:
    _garbage({7: (-1.0, 2)})


@pytest.mark.parametrize("lp", [0.1, math.inf, -math.inf, math.nan])
def test_bad_logprob_is_garbage(lp: float) -> None:
    _garbage({7: (lp, 1)})  # on the own token (the top-1)
    _garbage({7: (-1.0, 2), 4: (lp, 1)})  # on the top-1 entry


def test_own_rank1_while_another_is_top1_is_garbage() -> None:
    _garbage({7: (-0.5, 1), 4: (-0.3, 1)})


def test_own_logprob_above_top1_is_garbage() -> None:
    _garbage({7: (-0.1, 2), 4: (-0.5, 1)})


def test_sampling_body_greedy() -> None:
    body = sampling_body(SamplingParams(temperature=0.0, seed=7), max_tokens=16)
    assert body["max_tokens"] == 16
    assert body["temperature"] == 0.0
    assert body["ignore_eos"] is True
    assert body["detokenize"] is False
    assert body["skip_reading_prefix_cache"] is False
    assert "seed" not in body  # greedy: a seed means nothing
    assert "top_k" not in body  # 0 disables it


def test_sampling_body_sampled_carries_seed_and_top_k() -> None:
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=123)
    body = sampling_body(params, max_tokens=4)
    assert body["temperature"] == 0.8
    assert body["top_k"] == 40
    assert body["top_p"] == 0.9
    assert body["seed"] == 123
    assert body["max_tokens"] == 4
    assert body["ignore_eos"] is True  # the engine owns stop rules, whatever the request says
    assert sampling_body(SamplingParams(temperature=1.0, seed=0), 1)["seed"] == 0
    assert "seed" not in sampling_body(SamplingParams(temperature=1.0), 1)
