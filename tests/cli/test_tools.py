"""`draftgate check-pair` and `draftgate plan-memory`: reports, JSON, exit codes, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftgate.cli.main import main
from pair_support import make_variant, swapped_vocab_draft

REPO = Path(__file__).resolve().parents[2]
Capture = pytest.CaptureFixture[str]


def _run(capsys: Capture, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("draftgate: error:"), err
    return lines[0]


# ------------------------------------------------------------------ check-pair


def test_check_pair_compatible(tiny_model_dir: Path, capsys: Capture) -> None:
    rc, out, err = _run(capsys, "check-pair", str(tiny_model_dir), str(tiny_model_dir))
    assert rc == 0 and out.rstrip().endswith("compatible") and "NOT" not in out and err == ""


def test_check_pair_warning_still_exits_0(tiny_model_dir: Path, tmp_path: Path, capsys: Capture) -> None:
    draft = make_variant(tiny_model_dir, tmp_path / "d", config=lambda c: c.update(max_position_embeddings=64))
    rc, out, _ = _run(capsys, "check-pair", str(tiny_model_dir), str(draft))
    assert rc == 0 and "warning context: draft max_position_embeddings 64" in out


def test_check_pair_mismatch_exits_2_with_reason(tiny_model_dir: Path, tmp_path: Path, capsys: Capture) -> None:
    draft = swapped_vocab_draft(tiny_model_dir, tmp_path / "d")
    rc, out, err = _run(capsys, "check-pair", str(tiny_model_dir), str(draft))
    assert rc == 2 and "error   vocab:" in out and "NOT compatible" in out
    line = _one_error_line(err)
    assert "cannot draft for" in line and "'hello' is id 7 in the target, 8 in the draft" in line


def test_check_pair_json(tiny_model_dir: Path, tmp_path: Path, capsys: Capture) -> None:
    draft = swapped_vocab_draft(tiny_model_dir, tmp_path / "d")
    rc, out, _ = _run(capsys, "check-pair", str(tiny_model_dir), str(draft), "--json")
    report = json.loads(out)
    assert rc == 2 and report["ok"] is False and report["draft"] == str(draft)
    assert [(f["severity"], f["check"]) for f in report["findings"]] == [("error", "vocab")]


def test_check_pair_missing_model_is_one_line(tiny_model_dir: Path, capsys: Capture) -> None:
    rc, _, err = _run(capsys, "check-pair", str(tiny_model_dir), "/nonexistent/draft")
    assert rc == 2 and "not found" in _one_error_line(err)


def test_generate_refuses_a_mismatched_draft(tiny_model_dir: Path, tmp_path: Path, capsys: Capture) -> None:
    draft = swapped_vocab_draft(tiny_model_dir, tmp_path / "d")
    rc, _, err = _run(
        capsys,
        "generate",
        "hello",
        "--model",
        str(tiny_model_dir),
        "--drafter",
        "model",
        "--draft-model",
        str(draft),
        "--max-new-tokens",
        "2",
    )
    line = _one_error_line(err)
    assert rc == 2 and "cannot draft for" in line and "vocab:" in line


@pytest.mark.real_model
def test_check_pair_bundled_model_with_itself(capsys: Capture) -> None:
    cache = str(REPO / ".cache" / "models")
    rc, out, _ = _run(capsys, "check-pair", "smollm2-135m", "smollm2-135m", "--cache-dir", cache, "--json")
    assert rc == 0 and json.loads(out) == {
        "target": "smollm2-135m",
        "draft": "smollm2-135m",
        "ok": True,
        "findings": [],
    }


# ----------------------------------------------------------------- plan-memory


def test_plan_memory_table(capsys: Capture) -> None:
    rc, out, err = _run(
        capsys, "plan-memory", "--target", "llama-3-70b", "--draft", "llama-3-8b", "--gpu-memory", "192"
    )
    assert rc == 0 and err == ""
    assert "target weights (70.55B params)" in out and "131.42" in out  # 141.1e9 bytes
    assert "target KV: 15 seqs x 4096 x 327,680 B/token" in out
    assert "draft KV:  15 seqs x 4096 x 131,072 B/token" in out
    assert "system reserve" in out and "19.20" in out
    assert "fits 15 concurrent sequences of 4096 tokens" in out
    assert "warning: the draft takes" in out


def test_plan_memory_json_and_max_seqs(capsys: Capture) -> None:
    args = ["plan-memory", "--target", "llama-3-70b", "--draft", "llama-3.2-1b", "--gpu-memory", "192"]
    rc, out, _ = _run(capsys, *args, "--max-seqs", "16", "--json")
    plan = json.loads(out)
    assert rc == 0 and plan["max_seqs_fit"] is True and plan["warnings"] == []
    assert plan["target"]["kv_bytes_per_token"] == 327_680 and plan["draft"]["kv_bytes_per_token"] == 32_768
    assert plan["target_config"] == "llama-3-70b" and plan["seqs_fit"] > 16
    rc, out, err = _run(capsys, *args, "--max-seqs", "64")
    assert rc == 2 and "--max-seqs 64: does NOT fit" in out
    assert "lower --max-seqs" in _one_error_line(err)


def test_plan_memory_from_hf_folder(tiny_model_dir: Path, capsys: Capture) -> None:
    rc, out, _ = _run(capsys, "plan-memory", "--target", str(tiny_model_dir), "--gpu-memory", "1", "--json")
    plan = json.loads(out)
    assert rc == 0 and plan["draft"] is None and plan["target"]["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--target", "llama-3-70c"], "unknown model shape 'llama-3-70c'"),
        (["--target", "llama-3-70b", "--gpu-memory", "0"], "--gpu-memory must be a positive"),
        (["--target", "llama-3-70b", "--draft", "llama-3.2-1b", "--gpu-memory", "80"], "weights do not fit"),
        (["--target", "llama-3-8b", "--gpu-memory", "24", "--context", "0"], "--context"),
        (["--target", "llama-3-8b", "--gpu-memory", "24", "--reserve", "30"], "--reserve"),
    ],
)
def test_plan_memory_errors_are_one_line(capsys: Capture, args: list[str], needle: str) -> None:
    if "--gpu-memory" not in args:
        args = [*args, "--gpu-memory", "80"]
    rc, out, err = _run(capsys, "plan-memory", *args)
    assert rc == 2 and out == "" and needle in _one_error_line(err)


def test_plan_memory_unknown_shape_lists_known(capsys: Capture) -> None:
    _, _, err = _run(capsys, "plan-memory", "--target", "nope", "--gpu-memory", "8")
    assert "llama-3.1-405b" in err and "smollm2-1.7b" in err


def test_plan_memory_help(capsys: Capture) -> None:
    with pytest.raises(SystemExit) as e:
        main(["plan-memory", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "KV per token" in out and "llama-3.2-1b" in out and "10% of --gpu-memory" in out


# ------------------------------------------------------------- plan-memory, this machine


@pytest.mark.real_model
def test_plan_memory_on_this_machine_counts_the_gguf_as_packed(capsys: Capture) -> None:
    """A known GGUF name counts the file's own format (not float32 of its shape); a named shape alone float32."""
    rc, out, _ = _run(capsys, "plan-memory", "--target", "smollm2-135m", "--kv-blocks", "64", "--json")
    plan = json.loads(out)
    gguf = plan["models"]["target smollm2-135m"]
    assert rc == 0 and plan["fits"] and gguf["weights_gib"] < 0.2  # 135M weights at about 0.75 bytes
    assert gguf["kv_gib"] == pytest.approx(64 * 16 * 2 * 30 * 3 * 64 * 4 / 2**30)
    rc, out, _ = _run(capsys, "plan-memory", "--target", "smollm2-360m", "--kv-blocks", "64", "--json")
    assert json.loads(out)["models"]["target smollm2-360m"]["weights_gib"] > 2.5  # 2 x 362M x 4 bytes


def test_plan_memory_on_this_machine_refuses_what_does_not_fit(capsys: Capture) -> None:
    rc, out, err = _run(capsys, "plan-memory", "--target", "llama-3.1-8b", "--memory", "24")
    assert rc == 2 and "does NOT fit" in out
    assert "these models need 64.33 GiB" in _one_error_line(err)
