"""Remote drafts for the vLLM proposer against a real draft worker on loopback: deadline, prefetch, failure."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gateway_support import serve_app

from draftgate.drafters.base import DraftRequest
from draftgate.drafters.http import HttpDrafter
from draftgate.drafters.ngram import NgramDrafter
from draftgate.integrations.vllm.inside.remote import PrefetchingDrafter
from draftgate.server.workers.draft_worker import DraftService, create_draft_app
from draftgate.types import SamplingParams

TEXT = [5, 6, 7, 8, 9, 10, 11, 12] * 12
GREEDY = SamplingParams()


@pytest.fixture()
def worker_url() -> Iterator[str]:
    with serve_app(create_draft_app(DraftService(NgramDrafter()))) as url:
        yield url


def _rounds(d: PrefetchingDrafter, steps: int = 12, k: int = 4) -> list[list[int]]:
    """Greedy rounds on TEXT: every correct draft accepted, then the true next token."""
    n, out = 17, []
    for _ in range(steps):
        (draft,) = d.propose([DraftRequest(1, TEXT[:n], k, GREEDY)])
        toks = list(draft.token_ids)
        a = 0
        while a < len(toks) and toks[a] == TEXT[n + a]:
            a += 1
        out.append(toks)
        n += a + 1
    return out


def test_prefetch_hides_round_trips(worker_url: str) -> None:
    d = PrefetchingDrafter(HttpDrafter(worker_url, timeout_s=5.0), timeout_s=5.0, k_max=4)
    drafts = _rounds(d)
    assert all(drafts[3:])  # the repeated text drafts every round
    c = d.counters
    assert c.prefetch_hits >= 8  # all-accepted rounds take the next draft from the guess
    assert c.calls + c.prefetch_hits == 12 and c.late == 0 and c.failures == 0
    d.release(1)
    d.close()


def test_without_prefetch_every_round_waits(worker_url: str) -> None:
    d = PrefetchingDrafter(HttpDrafter(worker_url, timeout_s=5.0), timeout_s=5.0, k_max=4, prefetch=False)
    assert all(_rounds(d)[3:])
    assert d.counters.prefetch_hits == 0 and d.counters.calls == 12
    d.close()


def test_a_dead_worker_costs_only_drafts() -> None:
    with serve_app(create_draft_app(DraftService(NgramDrafter()))) as url:
        pass  # the worker is gone: calls fail to connect
    d = PrefetchingDrafter(HttpDrafter(url, timeout_s=1.0), timeout_s=0.5, k_max=4)
    assert _rounds(d, steps=3) == [[], [], []]
    assert d.counters.failures + d.counters.late == 3
    d.close()
