"""Shared fixtures: a tiny random Llama saved as an HF folder, the bundled SmolLM2, an HF reference."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from draftgate.models.loader import LoadedModel, load_model
from tiny_support import write_tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]


def tiny_hf_config():  # -> transformers.LlamaConfig
    import transformers

    return transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers

    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(tiny_hf_config()).float()
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 2:  # HF's std 0.02 gives near-flat logits: widen so argmax never ties
                p.normal_(0.0, 0.15)
            else:  # norm weights != 1 so a dropped or misplaced norm shows up
                p.uniform_(0.5, 1.5)
    hf.save_pretrained(folder, safe_serialization=True)
    write_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_model_dir))


@pytest.fixture(scope="session")
def tiny_draft_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft for the tiny model: its weights plus noise (same tokenizer; agrees often, not always)."""
    import transformers

    folder = tmp_path_factory.mktemp("tiny-draft")
    hf = transformers.LlamaForCausalLM.from_pretrained(tiny_model_dir)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 2:
                p.add_(torch.randn(p.shape, generator=g) * 0.08)
    hf.save_pretrained(folder, safe_serialization=True)
    write_tiny_tokenizer(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_draft(tiny_draft_dir: Path) -> LoadedModel:
    return load_model(str(tiny_draft_dir))


@pytest.fixture(scope="session")
def real_model() -> LoadedModel:
    return load_model("smollm2-135m", cache_dir=REPO / ".cache" / "models")


def build_hf_reference(loaded: LoadedModel):  # -> transformers.LlamaForCausalLM
    """transformers' own Llama with our config and weights (float32, eval).

    Attention is HF's "sdpa" path: on SmolLM2 its "eager" path itself differs from
    "sdpa" by ~1e-4 in fp32 logits, which is the whole parity budget.
    """
    import transformers

    try:  # skipping the random init saves ~8 s for SmolLM2 (every weight is overwritten below)
        from transformers.initialization import no_init_weights
    except ImportError:
        no_init_weights = contextlib.nullcontext
    cfg = transformers.LlamaConfig(**loaded.config.to_hf())
    cfg._attn_implementation = "sdpa"
    with no_init_weights():
        hf = transformers.LlamaForCausalLM(cfg)
    # assign=True shares our tensors (no 0.5 GB copy); tie after it so lm_head follows the embedding.
    result = hf.load_state_dict({k: v.float() for k, v in loaded.weights.items()}, strict=False, assign=True)
    hf.tie_weights()  # also needed because post_init's tying is part of what no_init_weights skips
    hf.eval()
    # A tied model ships no lm_head.weight: HF ties it to the embedding itself.
    allowed_missing = ["lm_head.weight"] if cfg.tie_word_embeddings else []
    assert list(result.missing_keys) == allowed_missing and not result.unexpected_keys, result
    if cfg.tie_word_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    return hf


@pytest.fixture(scope="session")
def hf_reference() -> Callable[[LoadedModel], object]:
    """A factory (cached per model) so each test module pays the construction once."""
    built: dict[int, object] = {}

    def get(loaded: LoadedModel):
        if id(loaded) not in built:
            built[id(loaded)] = build_hf_reference(loaded)
        return built[id(loaded)]

    return get
