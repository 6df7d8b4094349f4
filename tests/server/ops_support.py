"""A gateway with operating hooks for the ops tests: its own routes, a small canary window, a seeded RNG."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from draftgate.drafters.base import Abilities, Draft, DraftRequest

ADMIN = "/admin/routes"
PROMPT = "hello world the an is of hello world the an is of hello world"


class GarbageDrafter:
    """Proposes k copies of a token and sleeps: acceptance ~0 and every round pays a draft."""

    name = "garbage"
    sampled_q = False
    abilities = Abilities()

    def __init__(self, token: int = 95, sleep_s: float = 0.004) -> None:
        self.token, self.sleep_s = token, sleep_s

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        time.sleep(self.sleep_s)
        return [Draft([self.token] * r.k) for r in requests]

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
