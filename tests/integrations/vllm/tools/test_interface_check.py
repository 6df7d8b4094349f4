"""interface_check on source trees shaped like vLLM's: the proposer's interface held, gone, or changed."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from draftgate.integrations.vllm.tools.interface_check import FILES, check_source, main, read_tree, read_wheel

RUNNER_033 = """
class GPUModelRunner:
    def __init__(self):
        self.requests: dict = {}

    def propose_draft_token_ids(self):
        if spec_config.method == "ngram":
            pass
        elif spec_config.method == "custom_class":
            assert isinstance(sampled_token_ids, list)
            draft_token_ids = cast(Any, self.drafter).propose(
                sampled_token_ids,
                self.input_batch.num_tokens_no_spec,
                self.input_batch.token_ids_cpu,
                slot_mappings=slot_mappings,
            )
"""
SOURCES = {
    "vllm/config/speculative.py": 'SpeculativeMethod = Literal["ngram", "custom_class"]\n',
    "vllm/v1/spec_decode/custom_class_proposer.py": (
        "def create_custom_proposer(vllm_config):\n    instance = user_class(vllm_config)\n"
        "    if not hasattr(instance, 'propose'):\n        raise AttributeError\n"
    ),
    "vllm/v1/worker/gpu_model_runner.py": RUNNER_033,
    "vllm/v1/worker/gpu_input_batch.py": "class InputBatch:\n    def __init__(self):\n        self.req_ids = []\n",
}


def _tree(tmp_path: Path, sources: dict[str, str]) -> Path:
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_vllm_with_the_interface_passes_every_check(tmp_path: Path) -> None:
    assert all(f.ok for f in check_source(read_tree(_tree(tmp_path, SOURCES))))


def test_a_vllm_without_custom_class_fails_each_check_it_lacks(tmp_path: Path) -> None:
    """vLLM 0.34's shape: the custom_class method, its factory and the old runner are gone."""
    tree = _tree(tmp_path, {"vllm/config/speculative.py": 'SpeculativeMethod = Literal["ngram", "suffix"]\n'})
    assert [f.ok for f in check_source(read_tree(tree))] == [False, False, False, False]


def test_a_changed_call_shape_is_caught(tmp_path: Path) -> None:
    runner = RUNNER_033.replace(
        "slot_mappings=slot_mappings,", "slot_mappings=slot_mappings,\n                spec_metadata=m,"
    )
    found = check_source(read_tree(_tree(tmp_path, {**SOURCES, "vllm/v1/worker/gpu_model_runner.py": runner})))
    assert [f.ok for f in found] == [True, True, False, True]
    assert "spec_metadata=m" in found[2].what


def test_wheels_are_read_without_unpacking_and_the_exit_code_says_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = tmp_path / "vllm-0.33.0-x.whl", tmp_path / "vllm-0.34.0-x.whl"
    with zipfile.ZipFile(good, "w") as z:
        for name, text in SOURCES.items():
            z.writestr(name, text)
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr(FILES[0], "nothing\n")
    assert all(f.ok for f in check_source(read_wheel(good)))
    assert main([str(good)]) == 0
    assert main([str(good), str(bad)]) == 1
    assert "vllm-0.34.0-x.whl: the proposer cannot load" in capsys.readouterr().out
