"""ModelDrafter: a failed draft forward must not poison later drafts; seeded sampled drafts repeat.

The old ``_sync`` recorded the fed history before the forward ran: after a forward that
raised, the drafter believed its KV held tokens it never computed, and every later draft of
that sequence came from the wrong context.
"""

from __future__ import annotations

import pytest

from draftgate.drafters.base import DraftRequest
from draftgate.drafters.model import ModelDrafter
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ModelRunner
from draftgate.types import SamplingParams

GREEDY = SamplingParams(max_new_tokens=64)
HISTORY = [1, 7, 9, 11, 13, 5, 8, 21, 30, 4, 9, 11, 40, 41]


def _drafter(tiny_model: LoadedModel) -> ModelDrafter:
    return ModelDrafter(ModelRunner(tiny_model, num_blocks=64, block_size=8))


def _draft(d: ModelDrafter, hist: list[int], k: int = 4, params: SamplingParams = GREEDY, seq: int = 0) -> list[int]:
    (out,) = d.propose([DraftRequest(seq, hist, k, params)])
    return out.token_ids


@pytest.mark.parametrize("failing_call", [1, 2])  # the catch-up forward, or one inside the draft loop
def test_a_failed_forward_does_not_poison_later_drafts(tiny_model: LoadedModel, failing_call: int) -> None:
    d = _drafter(tiny_model)
    _draft(d, HISTORY[:6])  # the drafter holds KV for a prefix of the history
    runner = d._runner
    real, calls = runner.forward, [0]

    def flaky(items):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == failing_call:
            raise RuntimeError("planted forward failure")
        return real(items)

    runner.forward = flaky  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="planted"):
        _draft(d, HISTORY[:10])
    runner.forward = real  # type: ignore[method-assign]
    for n in (10, 12, 14):  # later rounds: the same drafts as a drafter that never failed
        assert _draft(d, HISTORY[:n]) == _draft(_drafter(tiny_model), HISTORY[:n])
    d.release(0)
    runner.kv.check_no_leaks()


def test_seeded_sampled_drafts_repeat_and_follow_the_seed(tiny_model: LoadedModel) -> None:
    params = [SamplingParams(temperature=1.0, seed=s, max_new_tokens=64) for s in (3, 3, 4)]
    runs = []
    for p in params:
        d = _drafter(tiny_model)
        runs.append([_draft(d, HISTORY[:n], params=p) for n in (6, 8, 10)])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
