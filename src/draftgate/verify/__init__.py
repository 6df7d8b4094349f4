"""Verification of draft tokens against the target: greedy and exact rejection sampling."""

from draftgate.verify.rejection import VerifyResult, verify_greedy, verify_sampling

__all__ = ["VerifyResult", "verify_greedy", "verify_sampling"]
