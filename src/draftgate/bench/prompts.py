"""Benchmark prompt files: JSONL in three line shapes, one conversation per line.

- MT-bench / Spec-Bench: ``{"question_id": 81, "category": "writing", "turns": ["...", "..."]}``;
  the turns are answered one after another, each next turn seeing the model's own
  previous answers.
- ``{"prompt": "..."}``: one user turn.
- ``{"messages": [{"role": "...", "content": "..."}, ...]}``: a chat whose last
  message is the user's; earlier messages are context.

``category`` is optional on every shape (default ``"default"``); ``id`` or
``question_id`` names the conversation (default: its line number).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from draftgate.errors import DraftGateError
from draftgate.models.tokenizer import Message

__all__ = ["BenchPrompt", "PromptFileError", "parse_prompt_line", "load_prompts", "builtin_prompts_path"]

DEFAULT_CATEGORY = "default"
_ROLES = ("system", "user", "assistant")


class PromptFileError(DraftGateError, ValueError):
    """A prompt file line is not one of the supported shapes (the message names file and line)."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    turns: tuple[str, ...]  # user messages, answered in order
    context: tuple[Message, ...] = ()  # messages before the first turn (system prompt, earlier chat)

    def messages(self, turn: int, answers: list[str]) -> list[Message]:
        """The chat for ``turn``: context, then each earlier turn with the arm's own answer to it."""
        assert len(answers) >= turn, "earlier turns must be answered first"
        msgs = list(self.context)
        for i in range(turn):
            msgs += [{"role": "user", "content": self.turns[i]}, {"role": "assistant", "content": answers[i]}]
        return [*msgs, {"role": "user", "content": self.turns[turn]}]


def builtin_prompts_path() -> Path:
    return Path(str(resources.files("draftgate.data").joinpath("prompts.jsonl")))


def parse_prompt_line(line: str, where: str = "line") -> BenchPrompt:
    """One JSONL line to a BenchPrompt; ``where`` prefixes error messages (e.g. ``file.jsonl:3``)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptFileError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    category = obj.get("category", DEFAULT_CATEGORY)
    if not isinstance(category, str) or not category:
        raise PromptFileError(f"{where}: 'category' must be a non-empty string")
    pid = str(obj.get("question_id", obj.get("id", where.rsplit(":", 1)[-1])))
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise PromptFileError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        return BenchPrompt(pid, category, tuple(turns))
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise PromptFileError(f"{where}: 'prompt' must be a non-empty string")
        return BenchPrompt(pid, category, (obj["prompt"],))
    if "messages" in obj:
        return BenchPrompt(pid, category, *_split_messages(obj["messages"], where))
    raise PromptFileError(f"{where}: expected one of the keys 'turns', 'prompt' or 'messages'")


def _split_messages(msgs: object, where: str) -> tuple[tuple[str, ...], tuple[Message, ...]]:
    if not isinstance(msgs, list) or not msgs:
        raise PromptFileError(f"{where}: 'messages' must be a non-empty list")
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in _ROLES:
            raise PromptFileError(f"{where}: each message needs a 'role' ({', '.join(_ROLES)}) and a string 'content'")
    if msgs[-1]["role"] != "user":
        raise PromptFileError(f"{where}: the last message must be the user's (the one to answer)")
    context = tuple({"role": m["role"], "content": m["content"]} for m in msgs[:-1])
    return (msgs[-1]["content"],), context


def load_prompts(
    path: Path | str, categories: list[str] | None = None, limit: int | None = None, per_category: int | None = None
) -> list[BenchPrompt]:
    """Read a prompt file; keep ``categories`` (if given), the first ``per_category`` of each, then the
    first ``limit``."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise PromptFileError(f"cannot read prompt file {path}: {e.strerror or e}") from None
    prompts = [parse_prompt_line(s, f"{path}:{i}") for i, s in enumerate(lines, 1) if s.strip()]
    if categories:
        known = {p.category for p in prompts}
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise PromptFileError(f"{path}: no prompts in categories {unknown}; the file has {sorted(known)}")
        prompts = [p for p in prompts if p.category in categories]
    if per_category is not None:
        if per_category < 1:
            raise PromptFileError(f"--per-category must be >= 1, got {per_category}")
        seen: dict[str, int] = {}
        keep = []
        for p in prompts:
            seen[p.category] = seen.get(p.category, 0) + 1
            if seen[p.category] <= per_category:
                keep.append(p)
        prompts = keep
    if limit is not None:
        if limit < 1:
            raise PromptFileError(f"--limit must be >= 1, got {limit}")
        prompts = prompts[:limit]
    if not prompts:
        raise PromptFileError(f"{path}: no prompts found")
    return prompts
