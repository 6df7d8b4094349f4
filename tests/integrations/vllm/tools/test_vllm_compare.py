"""The vLLM comparison's report: rates per category, ratios to vLLM alone, identical outputs."""

from __future__ import annotations

import pytest

from draftgate.integrations.vllm.tools.compare import ARMS, Tally, main, render


def test_render_gives_ratios_to_vllm_alone_and_identity() -> None:
    arms = [ARMS["vllm"], ARMS["dg-auto"]]
    tallies = {
        ("vllm", "code"): [Tally(100, 10.0, 1, 0, 0), Tally(100, 12.5, 1)],
        ("dg-auto", "code"): [Tally(100, 5.0, 1, 1, 1), Tally(100, 4.0, 1)],
        ("vllm", "chat"): [Tally(50, 5.0, 1, 0, 0), Tally(50, 5.0, 1)],
        ("dg-auto", "chat"): [Tally(50, 5.0, 1, 0, 1), Tally(50, 5.0, 1)],
    }
    table = render(tallies, arms, ["code", "chat"], 1)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "| 9.0 | 22.5 (2.50x), 1/1 same |" in rows["code"]  # medians of the two runs: 9.0 and 22.5 tok/s
    assert "(1.00x), 0/1 same" in rows["chat"]
    assert "1/2 same" in rows["all"]
    assert "grounded" not in rows  # no held-out category here


def test_render_sums_grounded_and_open_categories() -> None:
    arms = [ARMS["vllm"], ARMS["dg-auto"]]
    tallies = {
        ("vllm", "summarization"): [Tally(100, 10.0, 1, 0, 0)],
        ("dg-auto", "summarization"): [Tally(100, 5.0, 1, 1, 1)],
        ("vllm", "code_edit"): [Tally(100, 10.0, 1, 0, 0)],
        ("dg-auto", "code_edit"): [Tally(100, 5.0, 1, 1, 1)],
        ("vllm", "qa"): [Tally(50, 5.0, 1, 0, 0)],
        ("dg-auto", "qa"): [Tally(50, 5.0, 1, 1, 1)],
    }
    table = render(tallies, arms, ["summarization", "code_edit", "qa"], 1)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "| 10.0 | 20.0 (2.00x), 2/2 same |" in rows["grounded"]
    assert "| 10.0 | 10.0 (1.00x), 1/1 same |" in rows["open"]


def test_unknown_arm_is_refused_with_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--vllm-python", "python", "--model", "m", "--arms", "vllm,fast"])
    assert "unknown arm 'fast'" in capsys.readouterr().err
