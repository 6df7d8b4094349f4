"""Prompt files: the three line shapes, multi-turn message building, filters, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftgate.bench.prompts import BenchPrompt, PromptFileError, builtin_prompts_path, load_prompts, parse_prompt_line


def write(tmp_path: Path, lines: list[object]) -> Path:
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return f


def test_mt_bench_shape():
    p = parse_prompt_line(json.dumps({"question_id": 81, "category": "writing", "turns": ["a", "b"]}))
    assert p == BenchPrompt("81", "writing", ("a", "b"))


def test_prompt_shape_defaults_category():
    p = parse_prompt_line('{"prompt": "hi"}', "f.jsonl:7")
    assert (p.category, p.turns, p.context, p.id) == ("default", ("hi",), (), "7")


def test_messages_shape_splits_context():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    p = parse_prompt_line(json.dumps({"messages": msgs, "id": "m1"}))
    assert p.turns == ("hi",) and p.context == ({"role": "system", "content": "be brief"},)
    assert p.messages(0, []) == msgs


def test_multi_turn_messages_include_own_answers():
    p = BenchPrompt("1", "c", ("q1", "q2"), ({"role": "system", "content": "s"},))
    assert p.messages(1, ["a1"]) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]


@pytest.mark.parametrize(
    ("line", "msg"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"foo": 1}', "'turns', 'prompt' or 'messages'"),
        ('{"turns": []}', "'turns' must be a non-empty list"),
        ('{"turns": ["ok", 3]}', "'turns' must be a non-empty list"),
        ('{"prompt": ""}', "'prompt' must be a non-empty string"),
        ('{"messages": [{"role": "user"}]}', "each message needs"),
        ('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}', "last message"),
        ('{"prompt": "x", "category": 5}', "'category' must be"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, line, msg):
    f = write(tmp_path, [{"prompt": "fine"}, "", line])
    with pytest.raises(PromptFileError) as e:
        load_prompts(f)
    assert f"{f}:3:" in str(e.value) and msg in str(e.value)


def test_load_filters_and_limits(tmp_path):
    rows = [{"prompt": f"p{i}", "category": c} for i, c in enumerate(["a", "b", "a", "a", "b"])]
    f = write(tmp_path, rows)
    assert [p.turns[0] for p in load_prompts(f, categories=["b"])] == ["p1", "p4"]
    assert [p.turns[0] for p in load_prompts(f, limit=2)] == ["p0", "p1"]
    assert [p.turns[0] for p in load_prompts(f, per_category=1)] == ["p0", "p1"]
    assert len(load_prompts(f, per_category=2)) == 4
    with pytest.raises(PromptFileError, match="no prompts in categories"):
        load_prompts(f, categories=["zzz"])
    with pytest.raises(PromptFileError, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl")


def test_builtin_prompts_parse():
    ps = load_prompts(builtin_prompts_path())
    assert len(ps) >= 4 and all(p.turns for p in ps)
    assert len({p.category for p in ps}) >= 2
