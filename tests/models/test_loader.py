"""Loading: the bundled GGUF (config, weights and tokenizer against transformers), HF folders, errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from draftgate.errors import ModelLoadError
from draftgate.models.config import ModelConfig, RopeScaling
from draftgate.models.known import known_model_path
from draftgate.models.loader import LoadedModel, load_model, save_hf_folder
from draftgate.models.runner import ForwardItem, ModelRunner

TEXTS = [
    "What is 12345 + 6789?",
    "def add(a, b):\n    return a + b  # 3.14159\n\n\tprint(add(1, 2))",
    "naïve café — Ünïcödé: 日本語のテキスト, emoji 🙂👍🏽 and ✓",
    "  leading and trailing spaces  \n\n multiple\r\nnewlines ",
    "I'm sure they'll say it's 2024-12-31T23:59:59Z... isn't it?",
]
CHAT = [{"role": "user", "content": "What is 12345 + 6789?"}]
# transformers' GGUF tokenizer on SmolLM2's template for CHAT (checked in test_tokenizer_matches_transformers).
CHAT_IDS = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3511,
    308,
    34519,
    28,
    7018,
    411,
    407,
    19712,
    8182,
    2,
    198,
    1,
    4093,
    198,
    1780,
    314,
    216,
    33,
    34,
    35,
    36,
    37,
    1232,
    216,
    38,
    39,
    40,
    41,
    47,
    2,
    198,
    1,
    520,
    9531,
    198,
]


def gguf_location() -> tuple[Path, str]:
    path = known_model_path("smollm2-135m")
    return path.parent, path.name


# ------------------------------------------------------------------ the bundled model


@pytest.mark.real_model
def test_real_model_config(real_model: LoadedModel) -> None:
    c = real_model.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 9, 3, 64)
    assert (c.vocab_size, c.hidden_size, c.intermediate_size) == (49152, 576, 1536)
    assert c.tie_word_embeddings and "lm_head.weight" not in real_model.weights
    assert c.eos_token_ids == (2,) == real_model.tokenizer.eos_ids
    assert c.bos_token_id == 1 and c.rope_theta == 100000.0 and c.rope_scaling is None
    assert real_model.gguf_path is not None and real_model.gguf_path.suffix == ".gguf"


@pytest.mark.real_model
def test_chat_prompt_ids(real_model: LoadedModel) -> None:
    tok = real_model.tokenizer
    assert tok.encode_chat(CHAT) == CHAT_IDS
    assert tok.decode(CHAT_IDS, skip_special=False) == tok.apply_chat_template(CHAT)


@pytest.mark.real_model
def test_tokenizer_matches_transformers(real_model: LoadedModel) -> None:
    from transformers import AutoTokenizer

    folder, fname = gguf_location()
    ref = AutoTokenizer.from_pretrained(str(folder), gguf_file=fname)  # ~8 s: parses the GGUF
    tok = real_model.tokenizer
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert tok.decode(ids) == text
    chat = [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": TEXTS[1]},
        {"role": "assistant", "content": "It prints 3."},
        {"role": "user", "content": TEXTS[2]},
    ]
    for messages in (CHAT, chat):
        text = tok.apply_chat_template(messages)
        assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert tok.encode_chat(messages) == ref.encode(text, add_special_tokens=False)
    assert tok.encode_chat(CHAT) == CHAT_IDS
    assert tok.eos_token == ref.eos_token and tok.bos_token == ref.bos_token


@pytest.mark.real_model
@pytest.mark.slow
def test_gguf_weights_match_transformers_dequantization(real_model: LoadedModel, hf_reference) -> None:
    """Dequantization and the Q/K un-permutation agree with transformers' own GGUF reader (~20 s)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, fname = gguf_location()
    parsed = load_gguf_checkpoint(str(folder / fname), return_tensors=True, model_to_load=hf_reference(real_model))
    ref = parsed["tensors"]
    assert set(ref) == set(real_model.weights)
    for name, w in real_model.weights.items():
        assert torch.equal(w, ref[name].float()), name


# ------------------------------------------------------------------------ HF folders


def test_hf_folder_round_trip(tiny_model: LoadedModel, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy"
    save_hf_folder(tiny_model, out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, out / name)
    again = load_model(str(out))
    assert again.config == tiny_model.config
    assert again.config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
    assert set(again.weights) == set(tiny_model.weights)
    for name, w in tiny_model.weights.items():
        assert torch.equal(again.weights[name], w), name
    text = "hello world , the answer is 4 ?"
    assert again.tokenizer.encode(text) == tiny_model.tokenizer.encode(text)
    assert again.tokenizer.encode_chat(CHAT) == tiny_model.tokenizer.encode_chat(CHAT)


def test_tiny_tokenizer_and_template(tiny_model: LoadedModel) -> None:
    tok = tiny_model.tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "hello"}]) == "<s>user\nhello</s>\n<s>assistant\n"
    assert tok.encode_chat([{"role": "user", "content": "hello"}]) == [1, 4, 7, 2, 1, 5]
    assert tok.eos_ids == (2,) and tok.vocab_size == tiny_model.config.vocab_size == 96


def test_rope_settings_from_either_hf_config_style() -> None:
    """transformers >= 5 writes "rope_parameters"; older configs use rope_theta + rope_scaling."""
    base = {
        "model_type": "llama",
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    }
    scaling = {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    old = ModelConfig.from_hf({**base, "rope_theta": 500000.0, "rope_scaling": scaling})
    new = ModelConfig.from_hf({**base, "rope_parameters": {**scaling, "rope_theta": 500000.0}})
    assert old == new and new.rope_theta == 500000.0
    assert new.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)
    plain = ModelConfig.from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert plain.rope_theta == 1e6 and plain.rope_scaling is None


def test_bfloat16_load_runs_a_forward(tiny_model_dir: Path, tiny_model: LoadedModel) -> None:
    bf16 = load_model(str(tiny_model_dir), dtype=torch.bfloat16)
    assert all(w.dtype == torch.bfloat16 for w in bf16.weights.values())
    prompt = [1, 5, 9, 20, 33, 40, 2, 7, 60, 61]
    logits = {}
    for name, m in (("bf16", bf16), ("fp32", tiny_model)):
        runner = ModelRunner(m, num_blocks=8, block_size=4)
        runner.add_sequence(0, prompt)
        (logits[name],) = runner.forward([ForwardItem(0, prompt, num_logits=len(prompt))])
    assert logits["bf16"].dtype == torch.float32 and logits["bf16"].shape == (len(prompt), 96)
    assert torch.isfinite(logits["bf16"]).all()
    assert (logits["bf16"] - logits["fp32"]).abs().max() < 0.25  # bf16 rounding, not a broken model


# ----------------------------------------------------------------------------- errors


def _junk_gguf(tmp: Path) -> Path:
    p = tmp / "x.gguf"
    p.write_bytes(b"this is not a gguf file\n" * 40)
    return p


def _no_config(tmp: Path) -> Path:
    (tmp / "model.safetensors").write_bytes(b"")
    return tmp


def _gpt2_config(tmp: Path) -> Path:
    cfg = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": 50257,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
    }
    (tmp / "config.json").write_text(json.dumps(cfg))
    return tmp


def _truncated_gguf(tmp: Path) -> Path:
    folder, fname = gguf_location()
    p = tmp / fname
    p.write_bytes((folder / fname).read_bytes()[:100])  # an interrupted download: valid magic only
    return p


def _no_weights(tmp: Path, tiny_model_dir: Path) -> Path:
    shutil.copy(tiny_model_dir / "config.json", tmp / "config.json")
    return tmp


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda tmp, _: tmp / "missing", "not found"),
        (lambda tmp, _: _junk_gguf(tmp), "not a valid GGUF file"),
        (lambda tmp, _: _truncated_gguf(tmp), "not a valid GGUF file"),
        (lambda tmp, _: _no_config(tmp), "no config.json"),
        (lambda tmp, _: _gpt2_config(tmp), "unsupported architecture"),
        (_no_weights, "no *.safetensors"),
    ],
    ids=["missing-path", "junk-gguf", "truncated-gguf", "no-config", "gpt2-config", "no-weights"],
)
def test_load_errors_are_one_line(make, says: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    path = make(tmp_path, tiny_model_dir)
    with pytest.raises(ModelLoadError) as info:
        load_model(str(path))
    msg = str(info.value)
    assert says in msg and "\n" not in msg, msg


@pytest.mark.real_model
def test_gguf_tokenizer_saved_as_hf_folder_round_trips(real_model: LoadedModel, tmp_path: Path) -> None:
    from draftgate.models.tokenizer import TextTokenizer

    tok = real_model.tokenizer
    tok.save_hf(tmp_path)
    back = TextTokenizer.from_hf_folder(tmp_path)
    text = "Hello, world! 12345 naïve café\n\tdef f(x): return x**2"
    chat = [{"role": "user", "content": "What is 2+2?"}]
    assert back.encode(text) == tok.encode(text)
    assert back.encode_chat(chat) == tok.encode_chat(chat)
    assert back.vocab() == tok.vocab()
    assert back.eos_ids == tok.eos_ids
    assert back.decode(tok.encode(text)) == text
