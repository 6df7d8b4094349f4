"""Targets the gateway calls: where a route's target runs and where its drafts come from.

Target specs (``--target`` / a route's ``target`` key):

* ``embedded`` -- the in-process engine (the default);
* ``grpc://HOST:PORT[,grpc://HOST:PORT...]`` -- `draftgate serve-target` workers
  (a ``RemoteTargetEngine``; sessions pinned, least-loaded placement);
* ``openai+http://HOST:PORT`` -- an OpenAI-compatible completion server we do
  not own (llama.cpp's server), verified through its echoed prompt
  log-probabilities (``OpenAITargetEngine``; greedy only unless the route sets
  ``allow_approximate``);
* ``vllm+http://HOST:PORT`` -- a vLLM server, in the mode it offers (``integrations.vllm.gateway.checks.connect``):
  running DraftGate's proposer, vLLM drafts and verifies and the gateway switches speculation
  per request (``VllmPluginBackend``); started with ``--enable-scale-out``, the gateway drafts
  and verifies and vLLM scores the drafts and decodes the plain stretches (``VllmTargetEngine``).

Drafter specs (``--drafter`` / a route's ``drafter`` key): the built-in kinds
(none, ngram, suffix, model, quant, auto), ``http://HOST:PORT`` (a
`draftgate serve-draft` worker, ``HttpDrafter``) or ``llamacpp+http://HOST:PORT``
(a llama.cpp server as the draft engine, ``LlamaCppServerDrafter``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from draftgate.engine.config import DrafterKind

__all__ = [
    "TargetKind",
    "RemoteDrafterKind",
    "TargetSpec",
    "DrafterSpec",
    "parse_target",
    "parse_drafter",
    "DEFAULT_REMOTE_DRAFT_TIMEOUT_S",
]

DEFAULT_REMOTE_DRAFT_TIMEOUT_S = 0.05  # a remote drafter that takes longer costs its round's drafts, nothing else

_TARGETS = "'embedded', 'grpc://HOST:PORT[,grpc://...]', 'openai+http://HOST:PORT' or 'vllm+http://HOST:PORT'"
_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})$")


def _hostport(addr: str, what: str) -> str:
    m = _HOSTPORT.match(addr)
    if not m or not 0 < int(m.group(2)) <= 65535:
        raise ValueError(f"{what} {addr!r} must be HOST:PORT (port 1-65535)")
    return addr


class TargetKind(str, enum.Enum):
    EMBEDDED = "embedded"  # the in-process engine
    GRPC = "grpc"  # `draftgate serve-target` workers
    OPENAI = "openai"  # an OpenAI-compatible completion server
    VLLM = "vllm"  # a vLLM server: with DraftGate's proposer inside, or scoring the gateway's rounds


class RemoteDrafterKind(str, enum.Enum):
    HTTP = "http"  # a `draftgate serve-draft` worker
    LLAMACPP = "llamacpp"  # a llama.cpp server as the draft engine


@dataclass(frozen=True)
class TargetSpec:
    kind: TargetKind
    addresses: tuple[str, ...] = ()  # grpc://HOST:PORT each, or one http://HOST:PORT

    @property
    def text(self) -> str:
        if self.kind is TargetKind.EMBEDDED:
            return "embedded"
        if self.kind is TargetKind.GRPC:
            return ",".join(self.addresses)
        return f"{self.kind.value}+{self.addresses[0]}"


@dataclass(frozen=True)
class DrafterSpec:
    kind: DrafterKind | RemoteDrafterKind
    url: str | None = None  # http://HOST:PORT for the remote kinds
    timeout_s: float = field(default=DEFAULT_REMOTE_DRAFT_TIMEOUT_S)

    @property
    def remote(self) -> bool:
        return self.url is not None

    @property
    def text(self) -> str:
        if self.kind is RemoteDrafterKind.LLAMACPP:
            return "llamacpp+" + str(self.url)
        if self.kind is RemoteDrafterKind.HTTP:
            return str(self.url)
        assert isinstance(self.kind, DrafterKind)
        return self.kind.value


def parse_target(value: object) -> TargetSpec:
    """A target spec from a flag or a routes-file value (a string, or a list of grpc:// strings)."""
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"target must be {_TARGETS}, got {value!r}")
    v = value.strip()
    if v == "embedded":
        return TargetSpec(TargetKind.EMBEDDED)
    if v.startswith("grpc://"):
        addrs = [a.strip() for a in v.split(",")]
        for a in addrs:
            if not a.startswith("grpc://"):
                raise ValueError(f"every target in a list must be grpc://HOST:PORT, got {a!r}")
            _hostport(a[len("grpc://") :], "gRPC target")
        if len(set(addrs)) != len(addrs):
            raise ValueError(f"target {v!r} names a worker twice")
        return TargetSpec(TargetKind.GRPC, tuple(addrs))
    for kind, what in ((TargetKind.OPENAI, "OpenAI-compatible target"), (TargetKind.VLLM, "vLLM target")):
        if v.startswith(f"{kind.value}+http://"):
            url = v[len(kind.value) + 1 :].rstrip("/")
            _hostport(url[len("http://") :], what)
            return TargetSpec(kind, (url,))
    raise ValueError(f"unknown target {v!r}; use {_TARGETS}")


def parse_drafter(value: object, timeout_s: float = DEFAULT_REMOTE_DRAFT_TIMEOUT_S) -> DrafterSpec:
    kinds = [d.value for d in DrafterKind]
    if not isinstance(value, str):
        raise ValueError(f"drafter must be a string, got {value!r}")
    if value in kinds:
        return DrafterSpec(DrafterKind(value))
    if value.startswith("llamacpp+http://"):
        url = value[len("llamacpp+") :].rstrip("/")
        _hostport(url[len("http://") :], "llama.cpp drafter")
        return DrafterSpec(RemoteDrafterKind.LLAMACPP, url, timeout_s)
    if value.startswith("http://"):
        url = value.rstrip("/")
        _hostport(url[len("http://") :], "draft worker")
        return DrafterSpec(RemoteDrafterKind.HTTP, url, timeout_s)
    raise ValueError(
        f"unknown drafter {value!r}; choose from {', '.join(kinds)}, http://HOST:PORT, llamacpp+http://HOST:PORT"
    )
