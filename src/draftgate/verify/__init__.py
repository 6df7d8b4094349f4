"""Verification of draft tokens against the target: greedy and exact rejection sampling."""

from draftgate.verify.rejection import VerifyResult, verify_greedy, verify_sampling
from draftgate.verify.round import RoundDraft, RoundOutcome, target_choice, verify_round

__all__ = [
    "VerifyResult",
    "verify_greedy",
    "verify_sampling",
    "RoundDraft",
    "RoundOutcome",
    "target_choice",
    "verify_round",
]
