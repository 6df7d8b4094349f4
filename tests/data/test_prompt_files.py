"""The shipped prompt files: training prompts never hold a prompt the benchmarks or the eval set measure."""

from __future__ import annotations

import json
from pathlib import Path

from draftgate.train.data import read_records

DATA = Path(__file__).resolve().parents[2] / "src" / "draftgate" / "data"
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts"


def _first_turns(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            d = json.loads(line)
            out.append(d["turns"][0] if "turns" in d else d["prompt"])
    return out


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def test_training_prompts_are_disjoint_from_every_measured_prompt() -> None:
    measured = {
        _norm(p)
        for f in (
            DATA / "chat_eval.jsonl",
            DATA / "prompts.jsonl",
            BENCH / "heldout.jsonl",
            BENCH / "heldout_translation.jsonl",
        )
        for p in _first_turns(f)
    }
    for name in ("chat_train.jsonl", "chat_written.jsonl", "translate_train.jsonl"):
        train = [_norm(p) for p in _first_turns(DATA / name)]
        assert train, name
        assert not set(train) & measured, name


def test_the_written_chat_prompts_are_distinct_labelled_and_readable() -> None:
    lines = [json.loads(x) for x in (DATA / "chat_written.jsonl").read_text(encoding="utf-8").splitlines()]
    prompts = [_norm(d["prompt"]) for d in lines]
    assert len(prompts) == len(set(prompts)) == 960
    assert not set(prompts) & {_norm(p) for p in _first_turns(DATA / "chat_train.jsonl")}
    cats = {d["category"] for d in lines}
    assert cats == {"advice", "explain", "writing", "lists", "translate_rewrite", "conversation"}
    assert len(read_records(DATA / "chat_written.jsonl")) == 960  # distill reads every line as a prompt


def test_held_out_translation_sentences_are_in_no_training_prompt() -> None:
    # The training file phrases each sentence several ways, so compare the sentences themselves.
    train = [
        _norm(p)
        for name in ("chat_train.jsonl", "chat_written.jsonl", "translate_train.jsonl")
        for p in _first_turns(DATA / name)
    ]
    held = _first_turns(BENCH / "heldout_translation.jsonl")
    assert len(held) == 10
    for p in held:
        sentence = _norm(p.split(":", 1)[1])
        assert len(sentence) > 20 and not any(sentence in t for t in train), sentence
