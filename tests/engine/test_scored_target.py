"""verify_choices: greedy verification of drafts against a scoring target's own choices."""

from __future__ import annotations

from draftgate.engine import verify_choices


def test_verify_choices_is_greedy_matching_against_the_targets_own_choices() -> None:
    # every draft matches: all accepted, then the target's token after them (the bonus)
    assert verify_choices([5, 6, 7], [5, 6, 7], 9, 16) == ([5, 6, 7, 9], 3)
    # the first mismatch ends the round with the target's choice there (later choices unknown)
    assert verify_choices([5, 6, 7], [5, 8], None, 16) == ([5, 8], 1)
    assert verify_choices([5, 6, 7], [4], None, 16) == ([4], 0)


def test_without_the_token_after_the_drafts_none_is_made_up() -> None:
    assert verify_choices([4, 5], [4, 5], None, 8) == ([4, 5], 2)
    assert verify_choices([4, 5], [4, 6], None, 8) == ([4, 6], 1)
