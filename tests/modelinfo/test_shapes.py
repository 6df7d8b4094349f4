"""Named shapes (against published parameter counts and the bundled model) and shapes from files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from draftgate.errors import ModelLoadError
from draftgate.modelinfo.shapes import NAMED_SHAPES, resolve_shape
from draftgate.models.config import ModelConfig
from draftgate.models.known import KNOWN_MODELS
from draftgate.models.loader import LoadedModel

# Parameter counts published with the weights (safetensors totals / 2 bytes for the bf16 ones).
PUBLISHED_PARAMS = {
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "smollm2-135m": 134_515_008,
    "smollm2-360m": 361_821_120,
    "smollm2-1.7b": 1_711_376_384,
    "mistral-7b": 7_248_023_552,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-7b": 7_615_616_512,  # q/k/v biases counted
    "qwen3-0.6b": 596_049_920,  # q/k norms counted
    "qwen3-8b": 8_190_735_360,
    "gemma-3-270m": 268_098_176,  # four norms a layer
    "gemma-3-1b": 999_885_952,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_named_shape_param_counts(name: str) -> None:
    assert NAMED_SHAPES[name].num_params == PUBLISHED_PARAMS[name]


def test_llama_3_70b_count_by_hand() -> None:
    # embed + lm_head (untied) + 80 x (q, k, v, o, gate/up/down, 2 norms) + final norm
    per_layer = 8192 * 8192 + 2 * 8192 * 1024 + 8192 * 8192 + 3 * 8192 * 28672 + 2 * 8192
    assert NAMED_SHAPES["llama-3-70b"].num_params == 2 * 128256 * 8192 + 80 * per_layer + 8192


def test_num_params_counts_every_weight(tiny_model: LoadedModel) -> None:
    assert not tiny_model.config.tie_word_embeddings
    assert tiny_model.config.num_params == sum(w.numel() for w in tiny_model.weights.values())


@pytest.mark.real_model
def test_named_smollm2_matches_the_bundled_model(real_model: LoadedModel) -> None:
    assert real_model.config.tie_word_embeddings  # tied: lm_head is not counted twice
    assert real_model.config.num_params == sum(w.numel() for w in real_model.weights.values())
    named, real = NAMED_SHAPES["smollm2-135m"], real_model.config
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "max_position_embeddings",
        "tie_word_embeddings",
        "rope_theta",
    ):
        assert getattr(named, field) == getattr(real, field), field
    assert resolve_shape(str(real_model.source)).num_params == named.num_params  # GGUF metadata only
    assert "smollm2-135m" in KNOWN_MODELS


def test_names_are_case_insensitive() -> None:
    assert resolve_shape(" Llama-3-70B ") is NAMED_SHAPES["llama-3-70b"]


def test_hf_config_file_and_folder(tiny_model_dir: Path, tiny_model: LoadedModel) -> None:
    assert resolve_shape(str(tiny_model_dir)) == resolve_shape(str(tiny_model_dir / "config.json"))
    assert resolve_shape(str(tiny_model_dir)).num_params == tiny_model.config.num_params


def _write_gguf(path: Path, with_output: bool) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(512)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_token_list([f"t{i}" for i in range(100)])
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    if with_output:
        w.add_tensor("output.weight", np.zeros((100, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("with_output", [False, True])
def test_gguf_metadata(tmp_path: Path, with_output: bool) -> None:
    path = tmp_path / "m.gguf"
    _write_gguf(path, with_output)
    cfg = resolve_shape(str(path))
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
        100,
        64,
        2,
        4,
        2,
        16,
    )
    assert cfg.max_position_embeddings == 512 and cfg.tie_word_embeddings is not with_output


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda p: str(p / "nope"), "one of: llama-3-8b, llama-3-70b"),
        (lambda p: str(p), "folder has no config.json"),
        (lambda p: (p / "c.json").write_text("[1]") and str(p / "c.json"), "not a usable HF config.json"),
        (
            lambda p: (p / "c.json").write_text(json.dumps({"model_type": "gpt2"})) and str(p / "c.json"),
            "'gpt2'.*supported: llama, mistral, qwen2",
        ),
        (lambda p: (p / "x.gguf").write_bytes(b"junk" * 10) and str(p / "x.gguf"), "not a valid GGUF"),
    ],
)
def test_bad_shapes_are_clear_errors(tmp_path: Path, make, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ModelLoadError, match=needle):
        resolve_shape(make(tmp_path))


def test_named_shapes_are_model_configs() -> None:
    assert all(isinstance(c, ModelConfig) for c in NAMED_SHAPES.values())
    required = {
        "llama-3-70b",
        "llama-3-8b",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "llama-3.1-405b",
        "smollm2-135m",
        "smollm2-360m",
        "smollm2-1.7b",
    }
    assert required <= set(NAMED_SHAPES)
