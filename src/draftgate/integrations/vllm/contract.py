"""What the gateway and DraftGate's proposer inside vLLM agree on: per-request options and drafter names.

A ``vllm+http://`` route whose vLLM runs the proposer (``integrations.vllm.gateway.plugin_route``) writes the
options into each request's ``vllm_xargs``; the proposer (``integrations.vllm.inside.settings``) reads
them. Both take the names from here, so neither side can drift from the other.
"""

from __future__ import annotations

import enum

from draftgate.errors import DraftGateError

__all__ = ["DRAFTER", "K", "OPTIONS", "SPECULATE", "XARG_PREFIX", "DrafterName", "SettingsError"]

XARG_PREFIX = "draftgate_"  # vllm_xargs keys with it are ours (an unknown one is an error)
SPECULATE = "draftgate_speculate"  # 0/1: the route's switch, the admin kill switch, a canary's plain arm
DRAFTER = "draftgate_drafter"  # a DrafterName: the request's drafter
K = "draftgate_k"  # a fixed K for the request (0 .. num_speculative_tokens)
OPTIONS = (SPECULATE, DRAFTER, K)


class SettingsError(DraftGateError, ValueError):
    """A setting or a request option is invalid; the message names it and what it accepts."""


class DrafterName(str, enum.Enum):
    AUTO = "auto"  # suffix + n-gram lookup, the longer draft, under the goodput controller
    SUFFIX = "suffix"  # the suffix store: the request's own text and earlier requests' outputs
    NGRAM = "ngram"  # prompt lookup: the request's own text
    REMOTE = "remote"  # a `draftgate serve-draft` worker over HTTP

    @classmethod
    def parse(cls, value: object, what: str) -> DrafterName:
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            names = ", ".join(d.value for d in cls)
            raise SettingsError(f"{what} must be one of {names}, got {value!r}") from None
