"""Peer implementations as arms, on the same model and prompt token ids as the engine.

- ``hf`` / ``hf-lookup``: transformers' ``LlamaForCausalLM.generate()`` built from
  our loaded weights in memory (no second download; same token ids from our
  tokenizer), plain or with prompt lookup decoding (``prompt_lookup_num_tokens``).
- ``llamacpp``: llama.cpp's own ``llama-server`` on the model's GGUF file, started for
  the run and streamed as an ``openai+http`` arm (:mod:`draftgate.bench.llama_server`;
  ``make llamacpp`` builds it). Its own quantized kernels, so its greedy output may
  legitimately differ from the fp32 engine's.

The hf arms run their blocking ``generate`` in a worker thread and stream tokens back to
the event loop; peers serve one request at a time (the runner only uses them at
concurrency 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch

from draftgate.bench.arm_spec import ArmError, ArmKind, ArmSpec, Piece
from draftgate.bench.llama_server import LlamaServerArm
from draftgate.models.loader import LoadedModel
from draftgate.models.tokenizer import Message
from draftgate.types import SamplingParams

__all__ = ["build_peer", "build_hf_model", "HFArm"]

_DONE = object()


def build_peer(spec: ArmSpec, loaded: LoadedModel, device: str) -> HFArm | LlamaServerArm:
    if spec.kind in (ArmKind.HF, ArmKind.HF_LOOKUP):
        return HFArm(spec, loaded, device)
    if spec.kind == ArmKind.LLAMACPP:
        return LlamaServerArm(spec, loaded)
    raise ArmError(f"arm {spec.name}: not a peer arm")


def build_hf_model(loaded: LoadedModel, device: str) -> Any:
    """transformers' LlamaForCausalLM holding our weights (tied embeddings tied, eval mode)."""
    try:
        import transformers
    except ImportError:
        raise ArmError("the hf arms need transformers: pip install transformers") from None
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        no_init_weights = contextlib.nullcontext  # older transformers: pay the random init
    if loaded.config.family.name not in ("llama", "mistral"):
        raise ArmError(f"the hf arms run Llama-family models; this one is {loaded.config.family.name}")
    cfg = transformers.LlamaConfig(**loaded.config.to_hf())
    with no_init_weights():
        hf = transformers.LlamaForCausalLM(cfg)
    result = hf.to(loaded.dtype).load_state_dict(dict(loaded.weights), strict=False)
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    missing = [k for k in result.missing_keys if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise ArmError(
            f"hf arm: weights do not fit LlamaForCausalLM: missing {missing}, unexpected {result.unexpected_keys}"
        )
    return hf.to(device).eval()


async def _stream_from_thread(produce: Callable[[Callable[[Any], None]], None]) -> AsyncIterator[Any]:
    """Run ``produce(emit)`` in a thread; yield what it emits, re-raising its exception here."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[Any] = asyncio.Queue()

    def emit(x: Any) -> None:
        loop.call_soon_threadsafe(q.put_nowait, x)

    def work() -> None:
        try:
            produce(emit)
            emit(_DONE)
        except BaseException as e:  # handed to the awaiting side
            emit(e)

    threading.Thread(target=work, name="draftgate-bench-peer", daemon=True).start()
    while True:
        x = await q.get()
        if x is _DONE:
            return
        if isinstance(x, BaseException):
            raise ArmError(f"peer failed: {type(x).__name__}: {x}") from x
        yield x


class _Streamer:
    """transformers' streamer protocol: put(ids) per step (the first call is the prompt), end()."""

    def __init__(self, emit: Callable[[Any], None]) -> None:
        self._emit = emit
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self._emit(value.reshape(-1).tolist())

    def end(self) -> None:
        pass


class HFArm:
    def __init__(self, spec: ArmSpec, loaded: LoadedModel, device: str) -> None:
        self.spec = spec
        self._tok = loaded.tokenizer
        self._device = device
        self._model = build_hf_model(loaded, device)
        self._lookup = spec.k if spec.kind == ArmKind.HF_LOOKUP else None

    def _kwargs(self, params: SamplingParams) -> dict[str, Any]:
        if params.stop:
            raise ArmError(f"arm {self.spec.name}: stop strings are not supported for hf arms")
        eos = list(self._tok.eos_ids)
        kw: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "do_sample": not params.greedy,
            "eos_token_id": None if params.ignore_eos or not eos else eos,
            "pad_token_id": eos[0] if eos else 0,
        }
        if not params.greedy:
            kw.update(temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p)
        if self._lookup is not None:
            kw["prompt_lookup_num_tokens"] = self._lookup
        return kw

    async def stream(self, messages: list[Message], params: SamplingParams) -> AsyncIterator[Piece]:
        ids = self._tok.encode_chat(messages)
        kw = self._kwargs(params)

        def produce(emit: Callable[[Any], None]) -> None:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            x = torch.tensor([ids], device=self._device)
            with torch.inference_mode():
                self._model.generate(x, attention_mask=torch.ones_like(x), streamer=_Streamer(emit), **kw)

        out: list[int] = []
        sent = ""  # text of ``out`` already streamed: decode the whole output, send the new suffix
        async for new in _stream_from_thread(produce):
            new = new[: params.max_new_tokens - len(out)]
            if new:
                out += new
                text = self._tok.decode(out).rstrip("\ufffd")  # hold back an incomplete UTF-8 character
                yield Piece(len(new), text[len(sent) :], new)
                sent = text
        rest = self._tok.decode(out)[len(sent) :]
        if rest:
            yield Piece(0, rest)

    def new_run(self) -> None:
        pass  # no drafter memory across requests

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        self._model = None
