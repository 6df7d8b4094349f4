"""engine.compare.first_difference: what the canary, check-lossless and the bench's lossless check compare with."""

from __future__ import annotations

from draftgate.engine.compare import first_difference


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference("abc", "abd") == 2
