"""draftgate.bench.check_lossless and `draftgate check-lossless` on the embedded engine (tiny model).

Every drafter passes: greedy identical to plain, seeded runs reproducible (and identical to plain
sampling for deterministic drafts), the distribution test. Two planted broken verifiers (fixtures
patched into the engine's round target) must fail it: one that keeps a rejected greedy draft,
one that accepts every sampled draft. (The back end kinds over gRPC and openai+http are in
tests/server/test_check_lossless_backends.py.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import draftgate.engine.local_target as local_target
from draftgate.bench.check_lossless import CheckConfig, CheckPrompt, check_lossless, render
from draftgate.cli.main import main
from draftgate.engine import DrafterKind, Engine, EngineConfig, build_engine
from draftgate.models.loader import LoadedModel
from draftgate.verify import RoundDraft, RoundOutcome, verify_round

PROMPTS = ["a b c a b c a b", "hello world the hello world", "x y z 1 2 3 x y z"]
SMALL = CheckConfig(max_new_tokens=24, seeds=(3, 4), samples=120, sample_tokens=3, ignore_eos=True)


def _cases(engine: Engine) -> list[CheckPrompt]:
    return [CheckPrompt(f"p{i}", engine.encode(p, raw=True)) for i, p in enumerate(PROMPTS)]


@pytest.fixture
def engine_with(tiny_model: LoadedModel, tiny_draft_dir: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[Engine] = []

    def make(drafter: DrafterKind, k: int | None) -> Engine:
        cfg = EngineConfig(
            model="tiny",
            drafter=drafter,
            k=k,
            num_blocks=256,
            block_size=8,
            draft_model=str(tiny_draft_dir) if drafter is DrafterKind.MODEL else None,
        )
        e = build_engine(cfg, loaded=tiny_model)
        made.append(e)
        return e

    yield make
    for e in made:
        e.shutdown()
        e.runner.kv.check_no_leaks()


@pytest.mark.parametrize(
    ("drafter", "k"),
    [
        (DrafterKind.NGRAM, 4),
        (DrafterKind.NGRAM, None),
        (DrafterKind.SUFFIX, None),
        (DrafterKind.AUTO, None),
        (DrafterKind.MODEL, 4),
        (DrafterKind.MODEL, None),
        (DrafterKind.NONE, None),
    ],
)
def test_every_drafter_passes(engine_with, drafter: DrafterKind, k: int | None) -> None:  # type: ignore[no-untyped-def]
    engine = engine_with(drafter, k)
    report = check_lossless(engine, drafter.value, _cases(engine), SMALL)
    assert report.passed, render(report)
    checks = {f.check for f in report.findings}
    assert checks == {"greedy", "seeded", "distribution"}
    seeded = [f for f in report.findings if f.check == "seeded"]
    if drafter is DrafterKind.MODEL:  # sampled q: reproducible, equal to plain only in distribution
        assert len(seeded) == len(PROMPTS) * 2 and all("twice" in f.detail for f in seeded)
    else:  # deterministic drafts: each seeded run also equals plain sampling with that seed
        assert len(seeded) == len(PROMPTS) * 2 * 2


# ------------------------------------------------------------------ planted broken verifiers


def _keeps_a_rejected_draft(logits: torch.Tensor, drafts: Sequence[RoundDraft], argmax=None) -> RoundOutcome:  # type: ignore[no-untyped-def]
    """Broken: where the target rejected a draft, emit the draft anyway."""
    out = verify_round(logits, drafts, argmax)
    emitted, accepted = [], []
    for d, e, a in zip(drafts, out.emitted, out.accepted, strict=True):
        if a < len(d.token_ids):
            e, a = [*e[:-1], d.token_ids[a]], a + 1
            e = e if a < len(d.token_ids) else e  # the round still ends here
        emitted.append(e)
        accepted.append(min(a, len(d.token_ids)))
    return RoundOutcome(emitted, accepted, [list(range(1, a + 1)) for a in accepted])


def _accepts_every_sampled_draft(logits: torch.Tensor, drafts: Sequence[RoundDraft], argmax=None) -> RoundOutcome:  # type: ignore[no-untyped-def]
    """Broken: a draft that came with its q is always accepted (p never consulted for it)."""
    out = verify_round(logits, drafts, argmax)
    emitted, accepted = list(out.emitted), list(out.accepted)
    for b, d in enumerate(drafts):
        if d.q is not None and d.temperature > 0 and d.token_ids:
            emitted[b] = (
                [*d.token_ids, out.emitted[b][-1]] if out.accepted[b] == len(d.token_ids) else list(d.token_ids)
            )
            accepted[b] = len(d.token_ids)
    return RoundOutcome(emitted, accepted, [list(range(1, a + 1)) for a in accepted])


def test_a_planted_greedy_bug_fails_with_the_first_difference(engine_with, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    engine = engine_with(DrafterKind.NGRAM, 4)
    monkeypatch.setattr(local_target, "verify_round", _keeps_a_rejected_draft)
    report = check_lossless(
        engine, "broken", _cases(engine), CheckConfig(max_new_tokens=24, sampling=False, ignore_eos=True)
    )
    assert not report.passed
    first = report.first_failure
    assert first is not None and first.check == "greedy" and first.position is not None
    assert first.expected != first.got
    assert "FAIL greedy" in render(report) and render(report).endswith("FAILED")


def test_a_planted_sampling_bug_fails_the_distribution_test(engine_with, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    engine = engine_with(DrafterKind.MODEL, 4)
    monkeypatch.setattr(local_target, "verify_round", _accepts_every_sampled_draft)
    report = check_lossless(engine, "broken", _cases(engine)[:1], replace(SMALL, samples=500))
    failed = [f.check for f in report.findings if not f.passed]
    assert failed == ["distribution"], render(report)  # greedy and reproducibility cannot see this bug
    assert "differ at output position" in report.first_failure.detail, render(report)  # type: ignore[union-attr]


# ------------------------------------------------------------------ the command


def test_the_command_passes_and_prints_json(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:2]) + "\n")
    rc = main(
        [
            "check-lossless",
            "--model",
            str(tiny_model_dir),
            "--drafter",
            "ngram",
            "--k",
            "4",
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "16",
            "--samples",
            "40",
            "--sample-tokens",
            "2",
            "--kv-blocks",
            "128",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["passed"], out
    assert {f["check"] for f in out["findings"]} == {"greedy", "seeded", "distribution"}


def test_the_command_picks_a_route_and_says_which_exist(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        f"routes:\n  - name: a\n    model: {tiny_model_dir}\n    drafter: suffix\n    kv_blocks: 128\n"
        f"  - name: b\n    model: {tiny_model_dir}\n    drafter: ngram\n    kv_blocks: 128\n"
    )
    assert main(["check-lossless", "--routes", str(routes)]) == 2
    assert "pick one with --route NAME (a, b)" in capsys.readouterr().err
    assert main(["check-lossless", "--routes", str(routes), "--route", "c"]) == 2
    assert "no route named 'c'" in capsys.readouterr().err
    rc = main(
        [
            "check-lossless",
            "--routes",
            str(routes),
            "--route",
            "b",
            "--limit",
            "2",
            "--max-new-tokens",
            "12",
            "--greedy-only",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (
        "route b (target embedded, drafter ngram" in out
        and "greedy        2/2 passed" in out
        and out.rstrip().endswith("PASSED")
    )
