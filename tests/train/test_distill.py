"""distill at toy size: runs end to end, is seeded and resumable, and its draft is lossless on the engine."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.models.llama import VOCAB_SUBSET_KEY
from draftgate.train.data import data_bytes, read_records
from draftgate.train.distill import DistillConfig, distill
from draftgate.types import SamplingParams

WORDS = ["hello", "world", "the", "an", "is", "of", "and", *"abcdefghij", *"0123456789"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    lines = [json.dumps({"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))}) for _ in range(14)]
    lines.append(json.dumps({"text": "hello world is the a b c 1 2 3"}))
    lines.append(json.dumps({"messages": [{"role": "user", "content": "the world of a"}]}))
    f = tmp_path_factory.mktemp("data") / "chat.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


def _cfg(tiny_model_dir: Path, data: Path, out: Path, **kw: object) -> DistillConfig:
    base = DistillConfig(
        target=str(tiny_model_dir),
        data=data,
        out=out,
        layers=1,
        vocab_subset=40,
        steps=6,
        batch=4,
        lr=3e-3,
        max_new_tokens=12,
        max_len=96,
        top_k=8,
        checkpoint_every=3,
        eval_fraction=0.2,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_distill_trains_saves_and_resumes(tiny_model_dir: Path, data_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "draft"
    logs: list[str] = []
    rep = distill(_cfg(tiny_model_dir, data_file, out, steps=30), progress=False, log=logs.append)
    assert rep.steps == 30 and rep.examples == 16 and rep.vocab_subset == 40
    assert 0.0 <= rep.agreement_before <= 1.0 and 0.0 <= rep.agreement_after <= 1.0
    assert sum(rep.losses[-5:]) < sum(rep.losses[:5])  # it learns
    w = load_file(str(out / "model.safetensors"))
    assert w[VOCAB_SUBSET_KEY].numel() == 40 and w["lm_head.weight"].shape == (40, 64)
    assert (out / "tokenizer.json").is_file() and (out / "checkpoint.pt").is_file()
    report = json.loads((out / "distill.json").read_text())["report"]
    assert report["steps"] == 30 and len(report["losses"]) == 30
    # resume: picks up at step 30 and continues to 34
    rep2 = distill(_cfg(tiny_model_dir, data_file, out, steps=34, resume=True), progress=False, log=logs.append)
    assert any("resumed" in m and "step 30" in m for m in logs)
    assert rep2.steps == 34 and rep2.losses[:30] == rep.losses


def test_distill_is_seeded(tiny_model_dir: Path, data_file: Path, tmp_path: Path) -> None:
    a = distill(_cfg(tiny_model_dir, data_file, tmp_path / "a"), progress=False, log=lambda s: None)
    b = distill(_cfg(tiny_model_dir, data_file, tmp_path / "b"), progress=False, log=lambda s: None)
    c = distill(_cfg(tiny_model_dir, data_file, tmp_path / "c", seed=1), progress=False, log=lambda s: None)
    assert a.losses == b.losses and a.losses != c.losses
    wa, wb = (
        load_file(str(tmp_path / "a" / "model.safetensors")),
        load_file(str(tmp_path / "b" / "model.safetensors")),
    )
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_distilled_draft_is_lossless_on_the_engine(tiny_model_dir: Path, data_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "draft"
    distill(_cfg(tiny_model_dir, data_file, out), progress=False, log=lambda s: None)
    plain = build_engine(EngineConfig(model=str(tiny_model_dir), drafter=DrafterKind.NONE))
    spec = build_engine(EngineConfig(model=str(tiny_model_dir), drafter=DrafterKind.MODEL, draft_model=str(out), k=3))
    try:
        params = SamplingParams(max_new_tokens=40, ignore_eos=True)
        for prompt in ("hello world", "the a b c", "1 2 3 and"):
            want = plain.complete(prompt, params)
            got = spec.complete(prompt, params)
            assert got.token_ids == want.token_ids  # greedy: token for token
            assert got.stats.draft_tokens > 0
    finally:
        plain.shutdown()
        spec.shutdown()


def test_bad_data_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        read_records(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        read_records(bad)
    bad.write_text('{"what": 1}\n')
    with pytest.raises(ValueError, match="need one of"):
        read_records(bad)
    with pytest.raises(ValueError, match="--layers"):
        DistillConfig(target="x", data=bad, out=tmp_path, layers=0).validate()


def test_data_may_be_several_files_read_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"prompt": "one"}\n{"prompt": "two"}\n')
    b.write_text('{"text": "three four"}\n')
    got = read_records([a, b])
    assert [r.messages[0]["content"] for r in got[:2]] == ["one", "two"] and got[2].text == "three four"
    assert read_records((a,)) == read_records(a) == got[:2]
    assert data_bytes(a) == data_bytes((a,)) == a.read_bytes()  # one file: caches keyed before stay valid
    assert data_bytes((a, b)) != data_bytes((b, a))
    with pytest.raises(ValueError, match="no such file"):
        read_records([a, tmp_path / "nope.jsonl"])


def test_the_fused_kl_and_cross_entropy_mix_matches_the_plain_one_in_value_and_gradient() -> None:
    from draftgate.train.distill import kl_and_ce, kl_ce_mix

    g = torch.Generator().manual_seed(0)
    B, L, V, k, alpha = 3, 5, 40, 6, 0.3
    logits = torch.randn(B, L, V, generator=g, dtype=torch.float64)
    tv = torch.randn(B, L, k, generator=g, dtype=torch.float64)
    tv[0, 1, 2:] = float("-inf")  # some of the teacher's top-k outside the subset
    tv[1, 2] = float("-inf")  # none inside: no KL there
    ti = torch.randint(0, V, (B, L, k), generator=g)
    tgt = torch.randint(0, V, (B, L), generator=g)
    tgt[2, 0] = tgt[0, 3] = -1  # no token: no cross-entropy there
    w = torch.rand(B, L, generator=g, dtype=torch.float64)
    a = logits.clone().requires_grad_()
    kl, ce = kl_and_ce(a, tv, ti, tgt)
    want = alpha * kl + (1 - alpha) * ce  # [B, L]
    (want * w).sum().backward()
    b = logits.clone().requires_grad_()
    got = kl_ce_mix(b, tv, ti, tgt, alpha)
    (got * w).sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(b.grad, a.grad)
    assert float(got[1, 2]) == pytest.approx((1 - alpha) * float(ce[1, 2]))
    bad = logits.clone().requires_grad_()  # a control: a wrong mix weight must show in the comparison
    assert not torch.allclose(kl_ce_mix(bad, tv, ti, tgt, alpha + 0.1), want)
