"""Starting vLLM from another Python: the command line, the environment, a start that fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from draftgate.integrations.vllm.tools.launch import VllmEnv, VllmLaunch, VllmStartError, draftgate_spec, vllm_server

ENV = VllmEnv(Path(sys.executable), Path("/models/smol"))


def test_command_carries_the_cpu_flags_and_the_proposer() -> None:
    cmd = VllmLaunch(ENV, speculative=draftgate_spec(6, "SuffixProposer")).command(8123)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--block-size") + 1] == "32"
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {
        "method": "custom_class",
        "model": "draftgate.integrations.vllm.SuffixProposer",
        "num_speculative_tokens": 6,
    }
    assert "--speculative-config" not in VllmLaunch(ENV).command(8123)


def test_environment_keeps_vllm_on_loopback() -> None:
    env = VllmLaunch(ENV, extra_env={"DRAFTGATE_VLLM_K": "4"}).environment()
    assert env["VLLM_HOST_IP"] == env["VLLM_LOOPBACK_IP"] == "127.0.0.1"
    assert env["DRAFTGATE_VLLM_K"] == "4" and env["HF_HUB_OFFLINE"] == "1"


def test_a_vllm_that_dies_while_starting_says_why(tmp_path: Path) -> None:
    # This interpreter has no vLLM: the process exits at once, and the error carries its log.
    launch = VllmLaunch(ENV, log=tmp_path / "vllm.log")
    with pytest.raises(VllmStartError, match="No module named"), vllm_server(launch, timeout_s=60):
        pass
