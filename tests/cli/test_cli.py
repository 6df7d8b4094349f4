"""The command line: main(argv) -> int, JSON output, one-line errors with a non-zero exit."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from draftgate.cli.demo import _speedup
from draftgate.cli.main import main

REPO = Path(__file__).resolve().parents[2]


def _gen(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["generate", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "generate" in out and "demo" in out


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_generate_json_plain_and_speculative_agree(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["hello world the", "--model", str(tiny_model_dir), "--max-new-tokens", "12", "--json", "--raw"]
    rc, out, _ = _gen(capsys, *common, "--drafter", "none")
    assert rc == 0
    plain = json.loads(out)
    assert set(plain) >= {
        "text",
        "token_ids",
        "prompt_tokens",
        "completion_tokens",
        "elapsed_s",
        "tokens_per_s",
        "spec",
    }
    assert plain["spec"]["drafter"] == "none" and plain["spec"]["draft_tokens"] == 0
    assert plain["spec"]["mean_accepted_length"] == 1.0
    assert plain["completion_tokens"] == len(plain["token_ids"]) > 0
    rc, out, _ = _gen(capsys, *common, "--drafter", "ngram", "--k", "4")
    spec = json.loads(out)
    assert rc == 0 and spec["token_ids"] == plain["token_ids"]
    assert set(spec["spec"]) == {
        "drafter",
        "rounds",
        "draft_tokens",
        "accepted_tokens",
        "acceptance_rate",
        "mean_accepted_length",
    }


def test_generate_streams_text(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _gen(capsys, "hello", "--model", str(tiny_model_dir), "--max-new-tokens", "5", "--drafter", "none")
    assert rc == 0 and out.endswith("\n")
    assert "tok/s" in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--model", "/nonexistent/model.gguf"], "not found"),
        (["--top-p", "2"], "top_p"),
        (["--temperature", "-1"], "temperature"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--drafter", "model"], "--draft-model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    base = ["hi", "--model", str(tiny_model_dir)]
    rc, _, err = _gen(capsys, *base, *args)
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("draftgate: error:") and needle in lines[0], err


def test_corrupt_gguf_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file" * 10)
    rc, _, err = _gen(capsys, "hi", "--model", str(junk), "--cache-dir", str(tmp_path))
    assert rc == 2 and "not a valid GGUF" in err and "Traceback" not in err


@pytest.mark.real_model
def test_console_script_on_bundled_model() -> None:
    exe = Path(sys.executable).parent / "draftgate"
    r = subprocess.run(
        # Not "What is the capital of France?": on the model's own Q4_1 weights (the default) SmolLM2 answers that
        # in French, as llama.cpp's llama-server does on the same file.
        [
            str(exe),
            "generate",
            "Name the capital city of France.",
            "--model",
            "smollm2-135m",
            "--drafter",
            "none",
            "--max-new-tokens",
            "12",
            "--json",
            "--cache-dir",
            str(REPO / ".cache" / "models"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert "Paris" in data["text"]
    assert data["token_ids"][-1] == 2 or data["completion_tokens"] == 12  # EOS from the model, not a constant


def test_distill_eagle_then_generate_with_the_head(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`distill --kind eagle` writes a head folder that `generate --drafter eagle --draft-head` runs, losslessly."""
    data, more = tmp_path / "d.jsonl", tmp_path / "e.jsonl"  # --data takes several files
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["hello world", "the a b", "1 2 3"]))
    more.write_text(json.dumps({"prompt": "is of"}) + "\n")
    out = tmp_path / "head"
    rc = main(
        [
            "distill",
            "--kind",
            "eagle",
            "--target",
            str(tiny_model_dir),
            "--data",
            str(data),
            str(more),
            "--out",
            str(out),
            "--steps",
            "4",
            "--batch",
            "2",
            "--vocab-subset",
            "32",
            "--max-new-tokens",
            "8",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and report["steps"] == 4 and (out / "head.json").is_file()
    assert (
        report["examples"] == 4 and json.loads((out / "head.json").read_text())["trained"]["data"] == f"{data} {more}"
    )
    common = ["hello world the", "--model", str(tiny_model_dir), "--max-new-tokens", "12", "--json", "--raw"]
    rc, plain, _ = _gen(capsys, *common, "--drafter", "none")
    rc2, spec, _ = _gen(capsys, *common, "--drafter", "eagle", "--draft-head", str(out), "--k", "3")
    assert rc == rc2 == 0 and json.loads(spec)["token_ids"] == json.loads(plain)["token_ids"]
    assert json.loads(spec)["spec"]["drafter"] == "eagle"


def test_demo_pairs_runs_and_reports_the_range(tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every built-in prompt, each run's ratio paired, identical outputs in every run."""
    rc = main(
        [
            "demo",
            "--model",
            str(tiny_model_dir),
            "--drafter",
            "ngram",
            "--k",
            "2",
            "--runs",
            "2",
            "--max-new-tokens",
            "6",
        ]
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "plain tok/s" not in line]
    assert rc == 0 and len(rows) == 6
    speedup = re.compile(r"\| \d+\.\d\dx( \[\d+\.\d\d-\d+\.\d\d\])? \|")  # the range unless the runs tied
    assert all(r.rstrip(" |").endswith("yes") and speedup.search(r) for r in rows), rows
    assert _speedup((1.2, 1.1, 1.3)) == "1.20x [1.10-1.30]" and _speedup((1.2, 1.2, 1.2)) == "1.20x"
    assert main(["demo", "--model", str(tiny_model_dir), "--runs", "0"]) == 2
    assert "--runs must be >= 1" in capsys.readouterr().err
