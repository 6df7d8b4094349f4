"""What the vLLM proposer is told: deployment settings (environment) and per-request options.

Deployment settings are read once, when vLLM builds the proposer, from environment variables
(vLLM's speculative config accepts no fields of its own), and validated there:

=================================  ==========================================================
``DRAFTGATE_VLLM_DRAFTER``         default drafter: ``auto`` (default), ``suffix``, ``ngram``,
                                   ``remote`` (the proposer class may fix it instead)
``DRAFTGATE_VLLM_K``               ``auto`` (default: the goodput controller picks K per request
                                   and round, 0 included) or a fixed K
``DRAFTGATE_VLLM_DRAFT_URL``       a ``draftgate serve-draft`` worker (``http://HOST:PORT``),
                                   needed by the ``remote`` drafter
``DRAFTGATE_VLLM_DRAFT_TIMEOUT_MS`` a remote draft later than this is no draft (default 50)
``DRAFTGATE_VLLM_PREFETCH``        ``1`` (default): while vLLM verifies, ask the worker for the
                                   next round assuming every draft is accepted; ``0``: off
``DRAFTGATE_VLLM_CONTROL_PORT``    port of the proposer's side server on 127.0.0.1 (``/metrics``,
                                   ``/stats``, ``/control``); unset or ``0``: none
``DRAFTGATE_VLLM_CONTROL_HOST``    its address (default ``127.0.0.1``)
=================================  ==========================================================

The upper bound of K is vLLM's ``num_speculative_tokens``.

Per-request options travel in the request's ``vllm_xargs`` (vLLM's extra sampling arguments),
read by the proposer when the request first drafts:

* ``draftgate_speculate``: ``0``/``false``/``off`` turns speculation off for the request;
* ``draftgate_drafter``: one of the drafters above, for this request;
* ``draftgate_k``: a fixed K for this request (``0`` .. ``num_speculative_tokens``).

A bad option is a bad request: the request decodes without drafts and the proposer logs the
reason once; vLLM's engine is never affected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from draftgate.integrations.vllm.contract import DRAFTER, OPTIONS, SPECULATE, XARG_PREFIX, DrafterName, K, SettingsError

__all__ = ["ProposerSettings", "RequestOptions"]

DEFAULT_DRAFT_TIMEOUT_MS = 50.0


_TRUE = {"1", "true", "on", "yes"}
_FALSE = {"0", "false", "off", "no"}


def _flag(value: object, what: str) -> bool:
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SettingsError(f"{what} must be 1/true/on or 0/false/off, got {value!r}")


def _k(value: object, k_max: int, what: str) -> int:
    try:
        k = int(str(value).strip())
    except ValueError:
        raise SettingsError(f"{what} must be an integer in [0, {k_max}] or 'auto', got {value!r}") from None
    if not 0 <= k <= k_max:
        raise SettingsError(f"{what} must be in [0, {k_max}] (num_speculative_tokens), got {k}")
    return k


@dataclass(frozen=True)
class ProposerSettings:
    """One vLLM deployment's proposer, validated once (`from_env`)."""

    k_max: int  # vLLM's num_speculative_tokens
    drafter: DrafterName = DrafterName.AUTO
    k: int | None = None  # None: adaptive (the goodput controller)
    draft_url: str | None = None
    draft_timeout_s: float = DEFAULT_DRAFT_TIMEOUT_MS / 1000.0
    prefetch: bool = True
    control_host: str = "127.0.0.1"
    control_port: int = 0  # 0: no side server
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.k_max < 1:
            raise SettingsError(f"num_speculative_tokens must be >= 1, got {self.k_max}")
        if self.k is not None and not 0 <= self.k <= self.k_max:
            raise SettingsError(f"DRAFTGATE_VLLM_K must be in [0, {self.k_max}], got {self.k}")
        if self.draft_url is not None and not self.draft_url.startswith(("http://", "https://")):
            raise SettingsError(f"DRAFTGATE_VLLM_DRAFT_URL must start with http:// or https://, got {self.draft_url!r}")
        if self.drafter is DrafterName.REMOTE and self.draft_url is None:
            raise SettingsError(
                "the remote drafter needs DRAFTGATE_VLLM_DRAFT_URL=http://HOST:PORT (a draftgate serve-draft worker)"
            )
        if not self.draft_timeout_s > 0:
            raise SettingsError(f"DRAFTGATE_VLLM_DRAFT_TIMEOUT_MS must be > 0, got {self.draft_timeout_s * 1000:g}")
        if not 0 <= self.control_port <= 65535:
            raise SettingsError(f"DRAFTGATE_VLLM_CONTROL_PORT must be in [0, 65535], got {self.control_port}")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], k_max: int, drafter: DrafterName | None = None, max_model_len: int | None = None
    ) -> ProposerSettings:
        """Settings from ``DRAFTGATE_VLLM_*`` variables; ``drafter`` (a proposer class's own) wins over the variable."""
        get = env.get
        k_text = get("DRAFTGATE_VLLM_K", "auto").strip().lower()
        timeout_text = get("DRAFTGATE_VLLM_DRAFT_TIMEOUT_MS", str(DEFAULT_DRAFT_TIMEOUT_MS))
        try:
            timeout_ms = float(timeout_text)
        except ValueError:
            raise SettingsError(f"DRAFTGATE_VLLM_DRAFT_TIMEOUT_MS must be a number, got {timeout_text!r}") from None
        port_text = get("DRAFTGATE_VLLM_CONTROL_PORT", "0").strip() or "0"
        if not port_text.isdigit():
            raise SettingsError(f"DRAFTGATE_VLLM_CONTROL_PORT must be a port number, got {port_text!r}")
        return cls(
            k_max=k_max,
            drafter=drafter or DrafterName.parse(get("DRAFTGATE_VLLM_DRAFTER", "auto"), "DRAFTGATE_VLLM_DRAFTER"),
            k=None if k_text == "auto" else _k(k_text, k_max, "DRAFTGATE_VLLM_K"),
            draft_url=(get("DRAFTGATE_VLLM_DRAFT_URL") or "").strip().rstrip("/") or None,
            draft_timeout_s=timeout_ms / 1000.0,
            prefetch=_flag(get("DRAFTGATE_VLLM_PREFETCH", "1"), "DRAFTGATE_VLLM_PREFETCH"),
            control_host=get("DRAFTGATE_VLLM_CONTROL_HOST", "127.0.0.1").strip() or "127.0.0.1",
            control_port=int(port_text),
            max_model_len=max_model_len,
        )


@dataclass(frozen=True)
class RequestOptions:
    """One request's options from its ``vllm_xargs`` (keys ``draftgate_*``; others are not ours)."""

    speculate: bool = True
    drafter: DrafterName | None = None  # None: the deployment's
    k: int | None = None  # None: the deployment's (adaptive or fixed)

    @classmethod
    def parse(cls, extra_args: Mapping[str, Any] | None, k_max: int) -> RequestOptions:
        if not extra_args:
            return cls()
        ours = {key: v for key, v in extra_args.items() if isinstance(key, str) and key.startswith(XARG_PREFIX)}
        unknown = sorted(set(ours) - set(OPTIONS))
        if unknown:
            raise SettingsError(f"unknown option {unknown[0]!r}: vllm_xargs takes {', '.join(OPTIONS)}")
        return cls(
            speculate=_flag(ours[SPECULATE], SPECULATE) if SPECULATE in ours else True,
            drafter=DrafterName.parse(ours[DRAFTER], DRAFTER) if DRAFTER in ours else None,
            k=_k(ours[K], k_max, K) if K in ours else None,
        )
