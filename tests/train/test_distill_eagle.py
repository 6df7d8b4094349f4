"""distill --kind eagle at toy size: trains, resumes, is seeded, and its head is lossless on the engine."""

from __future__ import annotations

import itertools
import json
import random
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.errors import ModelLoadError
from draftgate.models.eagle import EagleHead, default_feature_layers
from draftgate.models.loader import LoadedModel
from draftgate.train.eagle import train_eagle
from draftgate.train.eagle_budget import choose_precision, fit_steps
from draftgate.train.eagle_config import EagleConfig
from draftgate.train.eagle_objective import make_batch, rollout_loss
from draftgate.train.states import States
from draftgate.types import SamplingParams

WORDS = ["hello", "world", "the", "an", "is", "of", "and", *"abcdefghij", *"0123456789"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    lines = [json.dumps({"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))}) for _ in range(14)]
    f = tmp_path_factory.mktemp("data") / "chat.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


def _cfg(tiny_model_dir: Path, data: Path, out: Path, **kw: object) -> EagleConfig:
    base = EagleConfig(
        target=str(tiny_model_dir),
        data=data,
        out=out,
        vocab_subset=40,
        steps=8,
        batch=4,
        lr=3e-3,
        max_new_tokens=16,
        max_len=96,
        window=24,
        top_k=8,
        checkpoint_every=4,
        eval_fraction=0.2,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_eagle_trains_saves_and_resumes(tiny_model_dir: Path, data_file: Path, tmp_path: Path, precision: str) -> None:
    out = tmp_path / "head"
    logs: list[str] = []
    rep = train_eagle(
        _cfg(tiny_model_dir, data_file, out, steps=40, precision=precision), progress=False, log=logs.append
    )
    assert rep.steps == 40 and rep.vocab_subset == 40 and rep.feature_layers == [1, 2] and rep.precision == precision
    assert sum(rep.losses[-5:]) < sum(rep.losses[:5])  # it learns
    assert rep.agreement_after > rep.agreement_before
    assert len(rep.agreement_per_step) == 2  # the default rollout
    meta = json.loads((out / "head.json").read_text())
    assert meta["format"] == "draftgate-eagle-head/1" and meta["trained"]["seed"] == 0
    assert meta["trained"]["precision"] == precision
    assert load_file(str(out / "head.safetensors"))["vocab_ids"].numel() == 40
    # Killed during step 23 (last checkpoint: step 20) and resumed: the same run, loss for loss.
    import draftgate.train.eagle_objective as mod

    calls, real_loss = [0], mod.rollout_loss

    def crash_at_23(*a: object, **kw: object) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == 23:
            raise KeyboardInterrupt
        return real_loss(*a, **kw)  # type: ignore[arg-type]

    part = tmp_path / "part"
    mod.rollout_loss = crash_at_23  # type: ignore[assignment]
    try:
        with pytest.raises(KeyboardInterrupt):
            train_eagle(
                _cfg(tiny_model_dir, data_file, part, steps=40, precision=precision), progress=False, log=logs.append
            )
    finally:
        mod.rollout_loss = real_loss  # type: ignore[assignment]
    other = "fp32" if precision == "bf16" else "bf16"
    with pytest.raises(ValueError, match=f"trained with --precision {precision}"):  # a resume keeps its precision
        train_eagle(_cfg(tiny_model_dir, data_file, part, steps=40, resume=True, precision=other), progress=False)
    rep2 = train_eagle(_cfg(tiny_model_dir, data_file, part, steps=40, resume=True), progress=False, log=logs.append)
    assert any("resumed" in m and "step 20" in m for m in logs)
    assert rep2.steps == 40 and rep2.losses == rep.losses and rep2.precision == precision  # auto resumes as it ran


def test_eagle_is_seeded(tiny_model_dir: Path, data_file: Path, tmp_path: Path) -> None:
    quiet = lambda s: None  # noqa: E731
    a = train_eagle(_cfg(tiny_model_dir, data_file, tmp_path / "a"), progress=False, log=quiet)
    b = train_eagle(_cfg(tiny_model_dir, data_file, tmp_path / "b"), progress=False, log=quiet)
    c = train_eagle(_cfg(tiny_model_dir, data_file, tmp_path / "c", seed=1), progress=False, log=quiet)
    assert a.losses == b.losses and a.losses != c.losses
    wa, wb = (load_file(str(tmp_path / x / "head.safetensors")) for x in ("a", "b"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_trained_head_is_lossless_on_the_engine(
    tiny_model_dir: Path, tiny_draft_dir: Path, data_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "head"
    train_eagle(_cfg(tiny_model_dir, data_file, out, steps=30), progress=False, log=lambda s: None)
    plain = build_engine(EngineConfig(model=str(tiny_model_dir), drafter=DrafterKind.NONE))
    engines = [
        build_engine(EngineConfig(model=str(tiny_model_dir), drafter=kind, draft_head=str(out), k=k))
        for kind, k in ((DrafterKind.EAGLE, 3), (DrafterKind.EAGLE, None), (DrafterKind.AUTO, None))
    ]
    try:
        params = SamplingParams(max_new_tokens=40, ignore_eos=True)
        for prompt in ("hello world", "the a b c", "1 2 3 and"):
            want = plain.complete(prompt, params)
            for eng in engines:
                got = eng.complete(prompt, params)
                assert got.token_ids == want.token_ids  # greedy: token for token
        assert engines[0].stats.draft_tokens > 0 and engines[0].stats.accepted_tokens > 0
    finally:
        for eng in (plain, *engines):
            eng.shutdown()
    # A head trained for this target is refused for another one, with the reason.
    with pytest.raises(ModelLoadError, match="different target"):
        build_engine(EngineConfig(model=str(tiny_draft_dir), drafter=DrafterKind.EAGLE, draft_head=str(out)))


def test_precision_auto_measures_and_explicit_choices_stand() -> None:
    assert choose_precision("fp32") == "fp32" and choose_precision("bf16") == "bf16"
    assert choose_precision("auto") in ("fp32", "bf16")  # this CPU's measurement
    assert choose_precision("auto", torch.device("cuda")) == "bf16"  # tensor cores (nothing measured)


def test_feature_loss_regresses_each_step_onto_the_target_state_it_predicts(tiny_model: LoadedModel) -> None:
    """The feature loss adds w x smooth L1 between step j's predicted normed state at anchor t and the
    target's final normed hidden at row t + j (the row whose logits the step's logits match)."""
    cfg = tiny_model.config
    layers = default_feature_layers(cfg.num_layers)
    g = torch.Generator().manual_seed(0)
    seqs = []
    for n in (14, 9):
        tokens = torch.randint(0, cfg.vocab_size, (n,), generator=g)
        feats = torch.randn(n - 1, len(layers), cfg.hidden_size, generator=g).half()  # [n-1, nF, C]
        top_v, top_i = (
            torch.randn(n - 1, 4, generator=g).half(),
            torch.randint(0, cfg.vocab_size, (n - 1, 4), generator=g).int(),
        )
        seqs.append(States(tokens, 3, feats, top_v, top_i))
    vocab = torch.arange(0, cfg.vocab_size, 2)
    sub_of = torch.full((cfg.vocab_size,), -1, dtype=torch.int64)
    sub_of[vocab] = torch.arange(vocab.numel())
    torch.manual_seed(0)
    head = EagleHead(cfg, layers, vocab).attach_target(tiny_model.weights)
    head.init_weights(tiny_model.weights)
    head.eval()  # no feature noise: the two losses see the same forward
    S, w = 2, 0.7
    bt = make_batch(seqs, S, 64, sub_of, 0.25, torch.Generator().manual_seed(0))
    with torch.no_grad():
        base, withreg = rollout_loss(head, bt, S, 0.5, 0.8), rollout_loss(head, bt, S, 0.5, 0.8, feature_loss=w)
        states: list[torch.Tensor] = []
        head.rollout(bt["feats"], bt["nxt"], S, states)
    reg, norm = 0.0, 0.0
    for b, s in enumerate(seqs):
        n = s.feats.shape[0]
        for j in range(1, S + 1):
            for t in range(n):
                r = t + j  # the row step j at anchor t predicts
                if r >= n:
                    continue
                wt = (1.0 if r >= s.start - 1 else 0.25) * 0.8 ** (j - 1) * float(sub_of[s.tokens[r + 1]] >= 0)
                d = torch.nn.functional.smooth_l1_loss(states[j - 1][b, t], s.feats[r, -1].float())
                reg, norm = reg + wt * float(d), norm + wt
    assert float(withreg - base) == pytest.approx(w * reg / norm, rel=1e-4)


def test_max_minutes_leaves_training_its_share_and_a_cut_data_set_is_not_reused_without_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rng = random.Random(1)
    data = tmp_path / "many.jsonl"
    data.write_text("".join(json.dumps({"prompt": " ".join(rng.choices(WORDS, k=4))}) + "\n" for _ in range(40)))
    out, logs = tmp_path / "head", []
    # a budget spent at once: one batch of prompts (32 on the CPU) starts, the rest never do
    rep = train_eagle(_cfg(tiny_model_dir, data, out, max_minutes=1e-4), progress=False, log=logs.append)
    assert any("data budget reached" in m and "32 of 40 train sequences" in m for m in logs)
    assert rep.examples == 32 and rep.steps == 0 and (out / "head.json").is_file()
    assert json.loads((out / "head.json").read_text())["trained"]["data_share"] == 0.5
    again = train_eagle(_cfg(tiny_model_dir, data, out, max_minutes=1e-4), progress=False, log=logs.append)
    assert again.examples == 32  # a budgeted rerun reuses the cut set
    whole = train_eagle(_cfg(tiny_model_dir, data, out, steps=2), progress=False, log=logs.append)
    assert whole.examples == 40 and whole.steps == 2  # without a budget the whole set is generated


def test_fit_steps_counts_both_phases_the_evals_and_a_margin(tmp_path: Path) -> None:
    cfg = EagleConfig(
        target="x", data=tmp_path, out=tmp_path, steps=1000, rollout=2, rollout_warmup=0.85, checkpoint_every=50
    )
    # a step: 0.85 x 1 s + 0.15 x 2 s + 5 s / 50 = 1.25 s; room: 0.96 x 1000 s - 2 final evals x 5 s = 950 s
    assert fit_steps(cfg, 1000.0, 1.0, 2.0, 5.0) == 760
    assert fit_steps(cfg, 1e6, 1.0, 2.0, 5.0) == 1000  # never more than --steps
    assert fit_steps(cfg, 5.0, 1.0, 2.0, 5.0) == 0
    one = replace(cfg, rollout=1)  # no rollout phase: every step costs t_one
    assert fit_steps(one, 1000.0, 1.0, 99.0, 5.0) == int((960 - 5) / 1.1)


def test_a_time_budget_lays_the_schedule_over_the_steps_that_fit_and_a_resume_keeps_them(
    tiny_model_dir: Path, data_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import draftgate.train.eagle as mod
    import draftgate.train.eagle_objective as objective_mod
    import draftgate.train.states as states_mod

    # Steps priced at 0.5 s and 1 s (the tiny model's real ones take milliseconds): a 20-second budget fits
    # about 30 of --steps 200, and the run, far faster than priced, ends on its plan, not on the deadline.
    monkeypatch.setattr(mod, "step_seconds", lambda *a, **kw: (0.5, 1.0))
    # A clock that advances 1 ms a reading: the plan depends on the priced steps only, not on how long
    # data generation took on a loaded machine (the real clock made the plan, and this test, vary).
    ticks = itertools.count()
    clock = types.SimpleNamespace(perf_counter=lambda: 1000.0 + 0.001 * next(ticks))
    monkeypatch.setattr(mod, "time", clock)
    monkeypatch.setattr(states_mod, "time", clock)
    rollouts: list[int] = []
    real_loss = objective_mod.rollout_loss

    def counting(head: EagleHead, bt: dict, S: int, *a: object) -> torch.Tensor:
        rollouts.append(S)
        if len(rollouts) == 23 and crash[0]:
            raise KeyboardInterrupt
        return real_loss(head, bt, S, *a)  # type: ignore[arg-type]

    crash = [True]
    monkeypatch.setattr(objective_mod, "rollout_loss", counting)
    out, logs = tmp_path / "head", []
    cfg = _cfg(tiny_model_dir, data_file, out, steps=200, max_minutes=20 / 60)
    with pytest.raises(KeyboardInterrupt):
        train_eagle(cfg, progress=False, log=logs.append)
    planned = torch.load(out / "checkpoint.pt", weights_only=False)["planned"]
    assert 20 < planned < 40 and any(f"laid out over {planned}" in m for m in logs)
    crash[0] = False
    monkeypatch.setattr(mod, "step_seconds", lambda *a, **kw: pytest.fail("a resume re-measured the steps"))
    rep = train_eagle(replace(cfg, resume=True), progress=False, log=logs.append)
    assert rep.steps == planned and not any("reached" in m for m in logs)  # the plan ended the run
    assert json.loads((out / "head.json").read_text())["trained"]["schedule_steps"] == planned
    ck = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ck["opt"]["param_groups"][0]["lr"] == pytest.approx(0.1 * cfg.lr, rel=1e-3)  # the rate decayed in full
    assert rollouts[-1] == cfg.rollout and rollouts.count(1) > rollouts.count(cfg.rollout) > 0  # both phases ran


def test_bad_settings_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--precision"):
        EagleConfig(target="x", data=tmp_path, out=tmp_path, precision="fp16").validate()
    with pytest.raises(ValueError, match="--data-share"):
        EagleConfig(target="x", data=tmp_path, out=tmp_path, data_share=0).validate()
    with pytest.raises(ValueError, match="--feature-loss"):
        EagleConfig(target="x", data=tmp_path, out=tmp_path, feature_loss=-1).validate()
    with pytest.raises(ValueError, match="--rollout"):
        EagleConfig(target="x", data=tmp_path, out=tmp_path, rollout=0).validate()
    with pytest.raises(ValueError, match="--vocab-subset"):
        EagleConfig(target="x", data=tmp_path, out=tmp_path, vocab_subset=4).validate()
    with pytest.raises(ValueError, match="--device must be cpu or cuda"):
        EagleConfig(target="x", data=tmp_path, out=tmp_path, device="tpu").validate()
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device; use --device cpu"):
            EagleConfig(target="x", data=tmp_path, out=tmp_path, device="cuda").validate()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eagle_trains_on_cuda_from_the_same_initial_head(tiny_model_dir: Path, data_file: Path, tmp_path: Path) -> None:
    """Data on the GPU runner, steps on the GPU; the saved head loads on the CPU engine and is lossless there."""
    rep = train_eagle(
        _cfg(tiny_model_dir, data_file, tmp_path / "gpu", steps=40, device="cuda"), progress=False, log=lambda s: None
    )
    assert rep.precision == "bf16" and rep.agreement_after > rep.agreement_before
    assert sum(rep.losses[-5:]) < sum(rep.losses[:5])
    eng = build_engine(
        EngineConfig(model=str(tiny_model_dir), drafter=DrafterKind.EAGLE, draft_head=str(tmp_path / "gpu"))
    )
    plain = build_engine(EngineConfig(model=str(tiny_model_dir), drafter=DrafterKind.NONE))
    try:
        for prompt in ("hello world", "the a b c"):
            params = SamplingParams(max_new_tokens=24)
            assert eng.complete(prompt, params).token_ids == plain.complete(prompt, params).token_ids
    finally:
        eng.shutdown()
        plain.shutdown()
