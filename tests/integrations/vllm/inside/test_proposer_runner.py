"""The proposer's look-up of vLLM's model runner (its caller's frame), with fakes shaped like vLLM's.

vLLM's ``GPUModelRunner.propose_draft_token_ids`` calls ``Proposer.propose`` with token ids only;
the proposer reads which request each row is (``self.input_batch.req_ids``) and its ``vllm_xargs``
(``self.requests[req_id].sampling_params.extra_args``) from that caller, found once, at the first
call. A caller of another shape still gets drafts, rows told apart by batch position.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import torch

from draftgate.integrations.vllm import NgramProposer, Proposer

LOGGER = "draftgate.integrations.vllm"
TEXT = [5, 6, 7, 8, 9, 10, 11, 12] * 12  # repeats: lookup drafts K tokens from the first step
K = 3  # DRAFTGATE_VLLM_K: fixed, so a row's draft length shows its options


def _vllm_config(k_max: int = 4) -> Any:
    return types.SimpleNamespace(
        speculative_config=types.SimpleNamespace(num_speculative_tokens=k_max),
        model_config=types.SimpleNamespace(max_model_len=4096),
    )


@pytest.fixture
def proposer(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Proposer:
    for name in [v for v in os.environ if v.startswith("DRAFTGATE_VLLM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DRAFTGATE_VLLM_K", str(K))
    caplog.set_level(logging.INFO, logger=LOGGER)
    return NgramProposer(_vllm_config())


def _inputs(histories: Sequence[Sequence[int]]) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """What vLLM passes: sampled ids per row, each row's length, the padded token table [rows, max_len]."""
    width = max(len(h) for h in histories)
    table = torch.zeros((len(histories), width), dtype=torch.int64)
    for i, h in enumerate(histories):
        table[i, : len(h)] = torch.tensor(h)
    return [[h[-1]] for h in histories], torch.tensor([len(h) for h in histories]), table


class FakeModelRunner:
    """The attributes of vLLM's model runner that the proposer reads, and the method that calls it."""

    def __init__(self, drafter: Proposer, xargs: Mapping[str, Mapping[str, Any] | None]) -> None:
        self.drafter = drafter
        self.input_batch = types.SimpleNamespace(req_ids=list(xargs))
        self.requests = {
            r: types.SimpleNamespace(sampling_params=types.SimpleNamespace(extra_args=x)) for r, x in xargs.items()
        }

    def propose_draft_token_ids(self, histories: Sequence[Sequence[int]]) -> list[list[int]]:
        return self.drafter.propose(*_inputs(histories))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_rows_are_the_runners_requests_with_their_options(proposer: Proposer, caplog: pytest.LogCaptureFixture) -> None:
    runner = FakeModelRunner(proposer, {"a": None, "off": {"draftgate_speculate": "off"}, "one": {"draftgate_k": 1}})
    drafts = runner.propose_draft_token_ids([TEXT[:17], TEXT[:17], TEXT[:17]])
    assert [len(d) for d in drafts] == [K, 0, 1]  # each row got its own request's vllm_xargs
    assert drafts[0] == TEXT[17 : 17 + K]
    assert all(proposer.core.known(r) for r in ("a", "off", "one")) and not proposer.core.known("row-0")
    assert proposer.core.requests_off == 1
    assert not _warnings(caplog)


def test_each_step_follows_the_runners_batch_order(proposer: Proposer) -> None:
    runner = FakeModelRunner(proposer, {"a": None, "one": {"draftgate_k": 1}})
    runner.propose_draft_token_ids([TEXT[:17], TEXT[:20]])
    runner.input_batch.req_ids = ["one", "a"]  # vLLM reorders its batch between steps
    drafts = runner.propose_draft_token_ids([TEXT[:21], TEXT[:18]])
    assert drafts == [TEXT[21:22], TEXT[18 : 18 + K]]


def test_options_are_read_when_a_request_first_drafts(proposer: Proposer) -> None:
    runner = FakeModelRunner(proposer, {"a": None})
    assert len(runner.propose_draft_token_ids([TEXT[:17]])[0]) == K
    runner.requests["a"].sampling_params.extra_args = {"draftgate_speculate": "off"}  # too late: seen already
    assert len(runner.propose_draft_token_ids([TEXT[:18]])[0]) == K


def test_a_request_without_options_in_the_runner_drafts_with_the_defaults(proposer: Proposer) -> None:
    runner = FakeModelRunner(proposer, {"a": None, "b": None})
    runner.requests["a"].sampling_params = None  # a request with no sampling params
    del runner.requests["b"]  # a request the runner no longer tracks
    assert [len(d) for d in runner.propose_draft_token_ids([TEXT[:17], TEXT[:17]])] == [K, K]


def test_the_runner_is_looked_up_once_at_the_first_call(proposer: Proposer) -> None:
    runner = FakeModelRunner(proposer, {"a": None})
    runner.propose_draft_token_ids([TEXT[:17]])
    proposer.propose(*_inputs([TEXT[:18]]))  # a later call from elsewhere: still the runner's rows
    assert proposer.core.known("a") and not proposer.core.known("row-0")


class _BatchOnly:
    def __init__(self, drafter: Proposer) -> None:
        self.drafter = drafter
        self.input_batch = types.SimpleNamespace(req_ids=["x", "y"])

    def call(self, histories: Sequence[Sequence[int]]) -> list[list[int]]:
        return self.drafter.propose(*_inputs(histories))


class _RequestsOnly(_BatchOnly):
    def __init__(self, drafter: Proposer) -> None:
        self.drafter = drafter
        self.requests = {"x": None}


def _plain_function(drafter: Proposer, histories: Sequence[Sequence[int]]) -> list[list[int]]:
    return drafter.propose(*_inputs(histories))


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda p, h: _plain_function(p, h), id="not-a-method"),
        pytest.param(lambda p, h: _BatchOnly(p).call(h), id="input_batch-only"),
        pytest.param(lambda p, h: _RequestsOnly(p).call(h), id="requests-only"),
    ],
)
def test_an_unknown_caller_gets_drafts_by_batch_row(
    proposer: Proposer, caplog: pytest.LogCaptureFixture, call: Any
) -> None:
    drafts = call(proposer, [TEXT[:17], TEXT[:20]])
    assert drafts == [TEXT[17 : 17 + K], TEXT[20 : 20 + K]]
    assert proposer.core.known("row-0") and proposer.core.known("row-1") and not proposer.core.known("x")
    call(proposer, [TEXT[:18], TEXT[:21]])
    (warning,) = _warnings(caplog)  # said once, not every step
    assert "not vLLM's model runner" in warning and "vllm_xargs" in warning


def test_a_runner_whose_batch_does_not_match_costs_steps_their_drafts(
    proposer: Proposer, caplog: pytest.LogCaptureFixture
) -> None:
    runner = FakeModelRunner(proposer, {"a": None})  # one request id for a batch of two rows
    assert runner.propose_draft_token_ids([TEXT[:17], TEXT[:17]]) == [[], []]  # never raises into vLLM
    assert runner.propose_draft_token_ids([TEXT[:18], TEXT[:18]]) == [[], []]
    errors = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None  # logged once, with the traceback
    runner.input_batch.req_ids = ["a", "b"]
    runner.requests["b"] = runner.requests["a"]
    assert [len(d) for d in runner.propose_draft_token_ids([TEXT[:19], TEXT[:17]])] == [K, K]  # and recovers
