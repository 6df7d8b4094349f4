"""What an arm is: its spec parsed from the command line, the pieces it streams, its errors.

Arm names on the command line:

- ``plain`` (the engine with drafter none), ``ngram``, ``suffix``, ``auto``,
  ``model``, ``quant``, each optionally with ``:k=N`` or ``:k=auto``
  (e.g. ``ngram:k=4``; without it K is adaptive); ``model`` and ``auto`` also take
  ``:draft=DIR`` (a draft model for this arm only, e.g. two distilled drafts side by side),
  ``eagle`` and ``auto`` take ``:head=DIR`` (a draft head for this arm; auto has none without it)
  and ``:branch=P`` (``--draft-branch`` for this arm; 0: no draft tree);
- ``openai+http://HOST:PORT[/v1][?model=NAME]``: an external OpenAI-compatible
  server, streamed over SSE from ``/v1/completions`` (see :mod:`draftgate.bench.remote`);
- ``hf``, ``hf-lookup[:k=N]``, ``llamacpp``: peer implementations on the same
  model (see :mod:`draftgate.bench.peers`); they run one request at a time. ``llamacpp``
  is llama.cpp's ``llama-server`` on the model's GGUF file, started for the run and
  streamed like an ``openai+http`` arm (:mod:`draftgate.bench.llama_server`).

The arm implementations (``arms``, ``remote``, ``peers``, ``llama_server``) import this module;
it imports none of them.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from draftgate.engine import DrafterKind
from draftgate.errors import DraftGateError
from draftgate.models.tokenizer import Message
from draftgate.types import SamplingParams, SpecStats

__all__ = ["ArmError", "ArmKind", "ArmSpec", "Arm", "Piece", "parse_arm", "parse_arms", "HF_LOOKUP_DEFAULT"]

HF_LOOKUP_DEFAULT = 10  # prompt_lookup_num_tokens for hf-lookup (transformers' documented example value)


class ArmError(DraftGateError):
    """An arm cannot be built or a request on it failed."""


class ArmKind(str, enum.Enum):
    ENGINE = "engine"  # the in-process DraftGate engine
    OPENAI = "openai"  # an external OpenAI-compatible server
    HF = "hf"  # transformers generate(), plain
    HF_LOOKUP = "hf-lookup"  # transformers generate() with prompt lookup decoding
    LLAMACPP = "llamacpp"  # llama.cpp's llama-server on the GGUF file (make llamacpp)


_ENGINE_NAMES = {"plain": DrafterKind.NONE, **{d.value: d for d in DrafterKind if d != DrafterKind.NONE}}


@dataclass(frozen=True)
class ArmSpec:
    name: str  # as written on the command line; names the arm in every report
    kind: ArmKind
    drafter: DrafterKind | None = None  # engine arms
    k: int | None = None  # draft tokens per round; None = adaptive (engine) / default (hf-lookup)
    url: str | None = None  # openai arms: base URL ending in /v1
    served_model: str | None = None  # openai arms: the "model" field (None: ask /v1/models)
    draft_model: str | None = None  # engine arms: this arm's --draft-model
    draft_head: str | None = None  # engine arms: this arm's --draft-head
    draft_branch: float | None = None  # engine arms: this arm's --draft-branch

    @property
    def sequential(self) -> bool:
        """Peers run one request at a time, so they only take part at concurrency 1."""
        return self.kind in (ArmKind.HF, ArmKind.HF_LOOKUP, ArmKind.LLAMACPP)


@dataclass(frozen=True)
class Piece:
    """What an arm streams: new tokens (ids where known) and their text."""

    n_tokens: int
    text: str
    token_ids: list[int] | None = None  # None where the arm only returns text
    stats: SpecStats | None = None  # speculation counters, on an engine arm's last piece
    total_tokens: int | None = None  # the server's own count of all tokens so far (usage), if sent


class Arm(Protocol):
    spec: ArmSpec

    def stream(self, messages: list[Message], params: SamplingParams) -> AsyncIterator[Piece]: ...

    def new_run(self) -> None:
        """A run starts: drop what earlier runs left (a drafter's memory of their answers)."""
        ...

    async def aclose(self) -> None:
        """Release what the runner's event loop opened (HTTP clients); the runner calls it last."""
        ...

    def close(self) -> None: ...


def _parse_opts(name: str, opts: str) -> tuple[int | None, str | None, str | None, float | None]:
    """``k=N`` / ``k=auto``, ``draft=DIR``, ``head=DIR|none`` and ``branch=P``, separated by ':'."""
    k, draft, head, branch = None, None, None, None
    for opt in opts.split(":"):
        if opt.startswith("branch="):
            try:
                branch = float(opt[len("branch=") :])
            except ValueError:
                branch = -1.0
            if not 0.0 <= branch <= 1.0:
                raise ArmError(f"arm {name!r}: branch= needs a probability in [0, 1] (0: no draft tree)")
        elif opt.startswith("draft="):
            draft = opt[len("draft=") :] or None
            if draft is None:
                raise ArmError(f"arm {name!r}: draft= needs a model folder or file")
        elif opt.startswith("head="):
            head = opt[len("head=") :] or None
            if head is None:
                raise ArmError(f"arm {name!r}: head= needs a head folder")
        else:
            k = _parse_k(name, opt)
    return k, draft, head, branch


def _parse_k(name: str, opt: str) -> int | None:
    key, _, val = opt.partition("=")
    if key != "k" or not val:
        raise ArmError(f"arm {name!r}: unknown option {opt!r} (use :k=N, :k=auto, :draft=DIR, :head=DIR or :branch=P)")
    if val == "auto":
        return None
    if not val.isdigit():
        raise ArmError(f"arm {name!r}: K must be a non-negative integer or 'auto', got {val!r}")
    return int(val)


def parse_arm(text: str) -> ArmSpec:
    """One arm name (see the module docstring) to an ArmSpec; raises ArmError with the choices."""
    name = text.strip()
    if name.startswith("openai+"):
        url, _, query = name[len("openai+") :].partition("?")
        if not url.startswith(("http://", "https://")):
            raise ArmError(f"arm {name!r}: expected openai+http://HOST:PORT[/v1]")
        model = query[len("model=") :] if query.startswith("model=") else None
        if query and not model:
            raise ArmError(f"arm {name!r}: the only query option is ?model=NAME")
        url = url.rstrip("/")
        return ArmSpec(name, ArmKind.OPENAI, url=url if url.endswith("/v1") else url + "/v1", served_model=model)
    base, _, opt = name.partition(":")
    k, draft, head, branch = _parse_opts(name, opt) if opt else (None, None, None, None)
    if draft is not None and base not in ("model", "auto"):
        raise ArmError(f"arm {name!r}: only the model and auto arms take draft=DIR")
    if head is not None and base not in ("eagle", "auto"):
        raise ArmError(f"arm {name!r}: only the eagle and auto arms take head=DIR")
    if branch is not None and base not in ("eagle", "auto"):
        raise ArmError(f"arm {name!r}: only the eagle and auto arms take branch=P")
    if base in _ENGINE_NAMES:
        drafter = _ENGINE_NAMES[base]
        if drafter == DrafterKind.NONE:
            if opt:
                raise ArmError(f"arm {name!r}: plain decoding takes no K")
            k = 0
        return ArmSpec(
            name, ArmKind.ENGINE, drafter=drafter, k=k, draft_model=draft, draft_head=head, draft_branch=branch
        )
    if base == ArmKind.HF_LOOKUP.value:
        return ArmSpec(name, ArmKind.HF_LOOKUP, k=HF_LOOKUP_DEFAULT if k is None else k)
    if base in (ArmKind.HF.value, ArmKind.LLAMACPP.value) and not opt:
        return ArmSpec(name, ArmKind(base))
    choices = ", ".join([*_ENGINE_NAMES, "hf", "hf-lookup", "llamacpp", "openai+http://HOST:PORT"])
    raise ArmError(f"unknown arm {name!r}; choose from {choices} (engine arms take :k=N)")


def parse_arms(text: str) -> tuple[ArmSpec, ...]:
    specs = tuple(parse_arm(s) for s in text.split(",") if s.strip())
    if not specs:
        raise ArmError("--arms needs at least one arm")
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ArmError(f"arm names must be unique, repeated: {dup}")
    return specs
