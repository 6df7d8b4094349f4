"""check_pair: each mismatch between a target and a draft, one variant folder per check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from draftgate.modelinfo.pairing import Finding, PairReport, check_pair
from draftgate.models.llama import VOCAB_SUBSET_KEY
from draftgate.models.loader import LoadedModel, load_model, load_model_info
from pair_support import make_variant, swapped_vocab_draft

TINY_TEMPLATE_TAIL = "{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}"


def _pair(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path, **edits: Any) -> PairReport:
    folder = str(make_variant(tiny_model_dir, tmp_path / "draft", **edits))
    report = check_pair(tiny_model, load_model(folder))
    # `draftgate check-pair` reads config, tokenizer and subset ids only: the same findings
    info = check_pair(load_model_info(str(tiny_model_dir)), load_model_info(folder))
    assert info.findings == report.findings
    return report


def _only(report: PairReport) -> Finding:
    assert len(report.findings) == 1, report.findings
    return report.findings[0]


def test_identical_pair_is_ok_with_no_findings(tiny_model: LoadedModel, tiny_model_dir: Path) -> None:
    report = check_pair(tiny_model, load_model(str(tiny_model_dir)), "t", "d")
    assert report.ok and report.findings == () and report.errors == []
    assert report.to_json() == {"target": "t", "draft": "d", "ok": True, "findings": []}


def test_same_size_vocab_with_swapped_ids_is_an_error(
    tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    report = check_pair(tiny_model, load_model(str(swapped_vocab_draft(tiny_model_dir, tmp_path / "d"))))
    f = _only(report)
    assert not report.ok and (f.severity, f.check) == ("error", "vocab")
    assert "target 96 tokens, draft 96 (+0), 2 entries differ" in f.reason
    assert "'hello' is id 7 in the target, 8 in the draft" in f.reason
    assert "'world' is id 8 in the target, 7 in the draft" in f.reason


def test_extra_token_reports_size_difference(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    def add_token(tok: dict[str, Any]) -> None:
        tok["added_tokens"].append(
            {
                "id": 96,
                "content": "<extra>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )

    f = _only(_pair(tiny_model, tiny_model_dir, tmp_path, tokenizer=add_token))
    assert f.check == "vocab" and "draft 97 (+1)" in f.reason and "'<extra>' (id 96) only in the draft" in f.reason


def test_different_logit_width_is_an_error(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    def pad(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for k in ("model.embed_tokens.weight", "lm_head.weight"):
            w[k] = torch.cat([w[k], torch.zeros(32, w[k].shape[1])])  # [96 + 32, C]
        return w

    report = _pair(tiny_model, tiny_model_dir, tmp_path, config=lambda c: c.update(vocab_size=128), weights=pad)
    f = _only(report)
    assert (f.severity, f.check) == ("error", "vocab_width") and "vocab_size 96, draft 128" in f.reason


def test_different_bos_is_an_error(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    report = _pair(tiny_model, tiny_model_dir, tmp_path, tokenizer_config=lambda t: t.update(bos_token="<pad>"))
    assert [f.check for f in report.errors] == ["bos"]
    assert "target 1 ('<s>'), draft 0 ('<pad>')" in report.errors[0].reason
    # The template writes bos_token, so the rendered prompts differ too: a warning, not a second error.
    assert [(f.severity, f.check) for f in report.findings[1:]] == [("warning", "chat_template")]


def test_disjoint_eos_is_an_error(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    report = _pair(
        tiny_model,
        tiny_model_dir,
        tmp_path,
        tokenizer_config=lambda t: t.update(eos_token="<pad>"),
        config=lambda c: c.update(eos_token_id=0),
        generation_config=lambda g: g.update(eos_token_id=0),
    )
    assert [f.check for f in report.errors] == ["eos"]
    assert "target 2 ('</s>'), draft 0 ('<pad>')" in report.errors[0].reason


def test_overlapping_eos_is_a_warning(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    # Like Llama 3.0 vs 3.2 instruct: the draft adds an end-of-turn id to the shared one.
    report = _pair(tiny_model, tiny_model_dir, tmp_path, generation_config=lambda g: g.update(eos_token_id=[2, 0]))
    f = _only(report)
    assert report.ok and (f.severity, f.check) == ("warning", "eos")
    assert "target 2 ('</s>'), draft 0 ('<pad>'), 2 ('</s>')" in f.reason


def test_template_text_differs_but_renders_same_ids(
    tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    def comment(t: dict[str, Any]) -> None:
        t["chat_template"] = "{# same output #}" + t["chat_template"]

    report = _pair(tiny_model, tiny_model_dir, tmp_path, tokenizer_config=comment)
    f = _only(report)
    assert report.ok and (f.severity, f.check) == ("info", "chat_template") and "same token ids" in f.reason


def test_template_rendering_differently_is_a_warning(
    tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    def other(t: dict[str, Any]) -> None:
        t["chat_template"] = t["chat_template"].replace("{{ m['role'] }}\n", "{{ m['role'] }} :\n")

    report = _pair(tiny_model, tiny_model_dir, tmp_path, tokenizer_config=other)
    f = _only(report)
    assert report.ok and (f.severity, f.check) == ("warning", "chat_template")
    assert "'user' sample differently (first difference at token 2: target '<unk>', draft ':')" in f.reason
    assert "lossless" in f.reason


def test_draft_template_failing_or_missing_is_a_warning(
    tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path
) -> None:
    broken = "{% for m in messages %}{{ m['missing'].x }}{% endfor %}" + TINY_TEMPLATE_TAIL
    report = _pair(
        tiny_model, tiny_model_dir, tmp_path / "a", tokenizer_config=lambda t: t.update(chat_template=broken)
    )
    f = _only(report)
    assert report.ok and f.severity == "warning" and "the draft's template fails on the 'user' sample" in f.reason
    report = _pair(tiny_model, tiny_model_dir, tmp_path / "b", tokenizer_config=lambda t: t.pop("chat_template"))
    f = _only(report)
    assert report.ok and f.severity == "warning" and "only the target has a chat template" in f.reason


def test_shorter_draft_context_is_a_warning(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    report = _pair(tiny_model, tiny_model_dir, tmp_path, config=lambda c: c.update(max_position_embeddings=128))
    f = _only(report)
    assert report.ok and (f.severity, f.check) == ("warning", "context") and "128 < target's 256" in f.reason


def _subset_weights(ids: list[int]) -> Any:
    def edit(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        subset = torch.tensor(ids, dtype=torch.int64)  # [Vs]
        w["lm_head.weight"] = w["lm_head.weight"][subset].clone()  # [Vs, C]
        w[VOCAB_SUBSET_KEY] = subset
        return w

    return edit


def test_vocab_subset_is_compatible_and_reported(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    report = _pair(tiny_model, tiny_model_dir, tmp_path / "a", weights=_subset_weights(list(range(40))))
    f = _only(report)
    assert report.ok and (f.severity, f.check) == ("info", "vocab_subset") and "subset of 40 of the 96" in f.reason
    # Without the end-of-sequence id the draft can never propose the end of a turn: a warning.
    report = _pair(tiny_model, tiny_model_dir, tmp_path / "b", weights=_subset_weights([0, 1, *range(3, 40)]))
    assert report.ok and [(f.severity, f.check) for f in report.findings] == [
        ("info", "vocab_subset"),
        ("warning", "vocab_subset"),
    ]
    assert "lacks end-of-sequence ids 2 ('</s>')" in report.findings[1].reason


def test_report_json_lists_every_finding(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    report = _pair(
        tiny_model,
        tiny_model_dir,
        tmp_path,
        tokenizer=lambda t: t["model"]["vocab"].update(hello=9, the=7),
        config=lambda c: c.update(max_position_embeddings=64),
    )
    js = report.to_json()
    assert js["ok"] is False
    assert [(f["severity"], f["check"]) for f in js["findings"]] == [("error", "vocab"), ("warning", "context")]


def test_info_load_holds_no_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    info = load_model_info(str(tiny_model_dir))
    assert info.weights == {} and info.config == load_model(str(tiny_model_dir)).config
    sub = make_variant(tiny_model_dir, tmp_path / "s", weights=_subset_weights(list(range(40))))
    assert list(load_model_info(str(sub)).weights) == [VOCAB_SUBSET_KEY]


@pytest.mark.real_model
def test_real_model_against_tiny_tokenizer(
    real_model: LoadedModel, tiny_model: LoadedModel, tiny_model_dir: Path
) -> None:
    report = check_pair(real_model, tiny_model)
    assert not report.ok
    # the GGUF read for metadata only (what `draftgate check-pair` does) finds the same
    info = load_model_info("smollm2-135m")
    assert info.weights == {} and info.config.vocab_size == real_model.config.vocab_size
    assert check_pair(info, load_model_info(str(tiny_model_dir))).findings == report.findings
    assert [f.check for f in report.errors] == ["vocab", "vocab_width"]
    assert "target 49152 tokens, draft 96" in report.errors[0].reason
    assert check_pair(real_model, real_model).ok
