"""Distillation data: the target's own continuations and its soft labels.

``read_records`` accepts JSONL lines of three shapes: ``{"messages": [...]}``
(a chat), ``{"prompt": "..."}`` or ``{"turns": ["...", ...]}`` (the first turn
as a user message; the bench's prompt format), which the target continues
greedily; and ``{"text": "..."}``, used as it is. ``build_corpus`` runs the
target (batched, continuous batching on our engine) and ``teacher_topk``
stores the target's top-k logits at every position, so training never runs
the target again.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from draftgate.engine.backend import Chunk
from draftgate.engine.engine import Engine
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.types import SamplingParams

__all__ = [
    "Record",
    "Example",
    "read_records",
    "data_files",
    "data_bytes",
    "data_names",
    "build_corpus",
    "teacher_topk",
    "choose_vocab_subset",
]


@dataclass(frozen=True)
class Record:
    messages: tuple[dict[str, str], ...] = ()  # a prompt for the target to continue
    text: str | None = None  # or a finished text


@dataclass(frozen=True)
class Example:
    tokens: tuple[int, ...]
    start: int  # first position whose token the target produced (the draft's real job)


def data_files(data: Path | Sequence[Path]) -> tuple[Path, ...]:
    """``--data``: one JSONL file or several, in order."""
    return (Path(data),) if isinstance(data, (str, Path)) else tuple(Path(p) for p in data)


def data_bytes(data: Path | Sequence[Path]) -> bytes:
    """The files' contents, for cache keys (one file: its bytes as they are)."""
    return b"\0".join(p.read_bytes() for p in data_files(data))


def data_names(data: Path | Sequence[Path]) -> str:
    """The files' paths, space-separated (messages and head.json)."""
    return " ".join(map(str, data_files(data)))


def read_records(data: Path | Sequence[Path]) -> list[Record]:
    """The records of one JSONL file, or of several one after another."""
    files = data_files(data)
    if not files:
        raise ValueError("--data: give at least one JSONL file")
    return [r for f in files for r in _read_file(f)]


def _read_file(path: Path) -> list[Record]:
    if not path.is_file():
        raise ValueError(f"--data {path}: no such file (JSONL: messages, prompt, turns or text per line)")
    out: list[Record] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from e
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{n}: each line must be a JSON object")
        if isinstance(obj.get("text"), str) and obj["text"].strip():
            out.append(Record(text=obj["text"]))
        elif isinstance(obj.get("messages"), list) and obj["messages"]:
            msgs = obj["messages"]
            if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs):
                raise ValueError(f"{path}:{n}: messages must be objects with role and content")
            out.append(Record(messages=tuple({"role": m.get("role", "user"), "content": m["content"]} for m in msgs)))
        elif isinstance(obj.get("prompt"), str) or (isinstance(obj.get("turns"), list) and obj["turns"]):
            first = obj["prompt"] if isinstance(obj.get("prompt"), str) else obj["turns"][0]
            out.append(Record(messages=({"role": "user", "content": str(first)},)))
        else:
            raise ValueError(f"{path}:{n}: need one of 'messages', 'prompt', 'turns' or 'text'")
    if not out:
        raise ValueError(f"--data {path}: no records")
    return out


def build_corpus(
    target: LoadedModel,
    records: Sequence[Record],
    max_new_tokens: int,
    max_len: int,
    batch: int = 16,
    progress: bool = True,
) -> list[Example]:
    """Prompt + the target's greedy continuation for prompts; the text itself for texts."""
    tok = target.tokenizer
    examples: list[Example | None] = [None] * len(records)
    prompts: list[tuple[int, list[int]]] = []
    for i, r in enumerate(records):
        if r.text is not None:
            ids = tok.encode(r.text)[:max_len]
            if len(ids) >= 2:
                examples[i] = Example(tuple(ids), 1)
        else:
            ids = tok.encode_chat(list(r.messages))
            if len(ids) + max_new_tokens <= min(max_len, target.config.max_position_embeddings):
                prompts.append((i, ids))
    if prompts:
        runner = ModelRunner(target, num_blocks=max(64, batch * ((max_len + 15) // 16 + 2)), enable_prefix_cache=False)
        engine = Engine(runner, None, k=0, max_batch=batch, max_queue=len(prompts) + 1)
        done = threading.Semaphore(0)
        outs: dict[int, list[int]] = {i: [] for i, _ in prompts}
        errors: list[str] = []

        def sink_for(i: int):  # noqa: ANN202
            def sink(c: Chunk) -> None:
                outs[i].extend(c.token_ids)
                if c.finish_reason is not None:
                    if c.finish_reason == "error":
                        errors.append(c.error or "error")
                    done.release()

            return sink

        params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        for i, ids in prompts:
            engine.submit(ids, params, sink_for(i), speculate=False)
        try:
            for _ in tqdm(prompts, desc="target continuations", unit="prompt", disable=not progress):
                done.acquire()
        finally:
            engine.shutdown()
        if errors:
            raise RuntimeError(f"target generation failed: {errors[0]}")
        for i, ids in prompts:
            if outs[i]:
                examples[i] = Example(tuple(ids + outs[i]), len(ids))
    return [e for e in examples if e is not None]


@torch.inference_mode()
def teacher_topk(
    target: LoadedModel, examples: Sequence[Example], top_k: int, progress: bool = True
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per example: the target's top-k logits at positions 0..T-2 ([T-1, k] float16, [T-1, k] int32)."""
    longest = max(len(e.tokens) for e in examples)
    runner = ModelRunner(target, num_blocks=(longest + 15) // 16 + 1, enable_prefix_cache=False)
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    for e in tqdm(examples, desc="teacher logits", unit="seq", disable=not progress):
        runner.add_sequence(0, e.tokens)
        try:
            ids = list(e.tokens[:-1])
            logits = runner.forward([ForwardItem(0, ids, len(ids))])[0]  # [T-1, V]
        finally:
            runner.free(0)
        vals, idx = logits.topk(top_k, dim=-1)  # [T-1, k]
        out.append((vals.half(), idx.int()))
    return out


def choose_vocab_subset(
    examples: Sequence[Example], teacher: Sequence[tuple[torch.Tensor, torch.Tensor]], size: int, always: Sequence[int]
) -> tuple[torch.Tensor, float]:
    """The ``size`` tokens the target emits or ranks first most often (plus ``always``, e.g. EOS).

    Returns (sorted ids [Vs] int64, the share of continuation tokens the subset covers).
    """
    counts: Counter[int] = Counter()
    for e, (_, idx) in zip(examples, teacher, strict=True):
        counts.update(e.tokens[e.start :])
        counts.update(idx[:, :4].flatten().tolist())  # near-misses the draft should be able to say
    keep = list(dict.fromkeys([*always, *(t for t, _ in counts.most_common(size))]))[:size]
    ids = torch.tensor(sorted(keep), dtype=torch.int64)  # [Vs]
    kept = set(keep)
    cont = [t for e in examples for t in e.tokens[e.start :]]
    coverage = sum(t in kept for t in cont) / max(1, len(cont))
    return ids, coverage
