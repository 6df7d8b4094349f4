"""Random-weight GGUF files at real shapes (bench/real_shapes.py).

Without llama.cpp: the plan of every named shape has its parameter count, a tiny shape of each family
written as F16 loads with the loader and runs a forward, the writer frees each tensor before making
the next, the cache returns the same file unwritten, failures leave no partial file, and a missing
llama-quantize is an error naming `make llamacpp`. With it (`make llamacpp`): a tiny file quantized
by llama-quantize to Q4_K_M loads with its K-quant blocks.
"""

from __future__ import annotations

import stat
import sys
import tracemalloc
import weakref
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from draftgate.bench import real_shapes as rs
from draftgate.bench.llama_server import ENV_BINARY
from draftgate.bench.real_shapes import ENV_QUANTIZE, RealShapeError, find_llama_quantize, real_shape_gguf, tensor_plan
from draftgate.modelinfo.shapes import NAMED_SHAPES
from draftgate.models.config import FAMILIES, ModelConfig, RopeScaling, rope_inv_freq
from draftgate.models.loader import LoadedModel, load_model
from draftgate.models.runner import ForwardItem, ModelRunner

SMOL_VOCAB = 49152


def tiny(family: str, vocab: int = 384, **kw: object) -> ModelConfig:
    """A tiny shape of ``family``: hidden 64, 2 layers (Gemma 3: 6, five with a window of 8)."""
    extra: dict[str, object] = {}
    if family == "gemma3":
        extra = dict(num_layers=6, layer_windows=(8,) * 5 + (0,), rope_local_theta=10000.0, tie_word_embeddings=True)
    base: dict[str, object] = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rope_theta=1000000.0,
        max_position_embeddings=4096,
        family=FAMILIES[family],
    )
    return ModelConfig(**{**base, **extra, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module", autouse=True)
def smol_tokenizer() -> None:
    """The files take the bundled SmolLM2's tokenizer fields."""
    try:
        rs._smollm2_tokenizer()
    except Exception as e:  # the bundled model's package is missing
        pytest.skip(f"the bundled model smollm2-135m is not available: {e}")


def logits(model: LoadedModel, tokens: list[int]) -> torch.Tensor:  # [T, V]
    runner = ModelRunner(model, num_blocks=16, block_size=4)
    runner.add_sequence(0, tokens)
    (out,) = runner.forward([ForwardItem(0, tokens, num_logits=len(tokens))])
    return out


def stored_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("shape", sorted(NAMED_SHAPES))
def test_plan_of_every_named_shape_has_its_parameters(shape: str) -> None:
    cfg = NAMED_SHAPES[shape]
    plan = list(tensor_plan(cfg))
    names = {s.name for s in plan}
    assert len(names) == len(plan)
    assert sum(int(np.prod(s.shape)) for s in plan if s.kind != "rope") == cfg.num_params
    assert ("output.weight" in names) != cfg.tie_word_embeddings
    assert next(s for s in plan if s.name == "token_embd.weight").shape == (cfg.vocab_size, cfg.hidden_size)
    fam = cfg.family
    assert ("blk.0.attn_q.bias" in names) == fam.qkv_bias
    assert ("blk.0.attn_k_norm.weight" in names) == fam.qk_norm
    assert ("blk.0.post_ffw_norm.weight" in names) == fam.sandwich_norms
    scaled = cfg.rope_scaling is not None and cfg.rope_scaling.kind == "llama3"
    assert ("rope_freqs.weight" in names) == scaled


@pytest.mark.parametrize(
    "cfg",
    [
        # The SmolLM2 vocabulary padded with 64 reserved tokens; Llama 3.1's RoPE scaling as rope_freqs.
        tiny("llama", SMOL_VOCAB + 64, rope_scaling=RopeScaling("llama3", 8.0, original_max_position=64)),
        tiny("qwen2"),  # q/k/v biases; the vocabulary cut to 384 tokens
        tiny("qwen3", tie_word_embeddings=True),  # q/k norms
        tiny("gemma3"),  # q/k norms, sandwich norms, sliding windows
    ],
    ids=["llama", "qwen2", "qwen3", "gemma3"],
)
def test_tiny_f16_file_loads_and_runs(cfg: ModelConfig, tmp_path: Path) -> None:
    made = real_shape_gguf(cfg, "F16", tmp_path, name=f"tiny-{cfg.family.name}")
    assert not made.cached and made.size == made.path.stat().st_size > 0
    assert made.path.parent == tmp_path and made.path.name.startswith(f"tiny-{cfg.family.name}-F16-")
    assert [p.name for p in tmp_path.iterdir()] == [made.path.name]  # no temporary file left
    types = stored_types(made.path)
    assert all(types[s.name] == ("F16" if s.kind == "weight" else "F32") for s in tensor_plan(cfg))
    assert len(types) == len(list(tensor_plan(cfg)))

    model = load_model(str(made.path))
    got = model.config
    for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
        assert getattr(got, f) == getattr(cfg, f), f
    assert (got.head_dim, got.rope_theta, got.max_position_embeddings) == (16, 1000000.0, 4096)
    assert got.family == cfg.family and got.tie_word_embeddings == cfg.tie_word_embeddings
    assert got.layer_windows == cfg.layer_windows and got.rope_local_theta == cfg.rope_local_theta
    assert torch.allclose(rope_inv_freq(got), rope_inv_freq(cfg))  # llama: through the rope_freqs tensor
    assert model.weights["model.embed_tokens.weight"].shape == (cfg.vocab_size, 64)
    assert model.weights["model.layers.1.input_layernorm.weight"].eq(1.0).all()
    w = model.weights["model.layers.1.mlp.down_proj.weight"]
    assert w.shape == (64, 128) and 0.015 < w.std().item() < 0.025

    tok = model.tokenizer
    ids = tok.encode("Hello, world!")
    assert ids and max(ids) < min(cfg.vocab_size, SMOL_VOCAB) and tok.decode(ids) == "Hello, world!"
    out = logits(model, ids)
    assert out.shape == (len(ids), cfg.vocab_size) and torch.isfinite(out).all()
    assert out.std() > 0 and not torch.equal(out[0], out[-1])


def test_padding_tokens_are_reserved_control_tokens(tmp_path: Path) -> None:
    path = real_shape_gguf(tiny("llama", SMOL_VOCAB + 3), "F16", tmp_path).path
    fields = gguf.GGUFReader(str(path)).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    assert tokens[SMOL_VOCAB - 1 :] == [tokens[SMOL_VOCAB - 1], "<|reserved_0|>", "<|reserved_1|>", "<|reserved_2|>"]
    assert fields["tokenizer.ggml.token_type"].contents()[-3:] == [int(gguf.TokenType.CONTROL)] * 3
    assert fields["general.architecture"].contents() == "llama"
    assert fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert "im_start" in fields["tokenizer.chat_template"].contents()
    # A cut vocabulary keeps only merges of kept tokens.
    cut = gguf.GGUFReader(str(real_shape_gguf(tiny("qwen2", 300), "F16", tmp_path).path)).fields
    kept = set(cut["tokenizer.ggml.tokens"].contents())
    merges = cut["tokenizer.ggml.merges"].contents()
    assert len(kept) == 300 and merges and all(m.replace(" ", "") in kept for m in merges)


def test_mistral_is_written_as_llama(tmp_path: Path) -> None:
    path = real_shape_gguf(tiny("mistral"), "F16", tmp_path).path
    assert gguf.GGUFReader(str(path)).fields["general.architecture"].contents() == "llama"
    assert load_model(str(path)).config.family.name == "llama"


def test_writer_frees_each_tensor_before_making_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor handed to the writer is gone when the next one comes; memory stays about one tensor."""
    cfg = tiny("llama", 300, hidden_size=256, intermediate_size=1024, num_layers=8, head_dim=64)
    plan = list(tensor_plan(cfg))
    largest, total = max(s.nbytes for s in plan), sum(s.nbytes for s in plan)
    assert total > 12 * largest
    seen: list[weakref.ref[np.ndarray]] = []
    infos_before_data: list[int] = []
    real_write, real_info = gguf.GGUFWriter.write_tensor_data, gguf.GGUFWriter.add_tensor_info
    n_info = 0

    def info(self: gguf.GGUFWriter, *a: object, **k: object) -> None:
        nonlocal n_info
        n_info += 1
        real_info(self, *a, **k)  # type: ignore[arg-type]

    def write(self: gguf.GGUFWriter, tensor: np.ndarray, *a: object, **k: object) -> None:
        assert all(r() is None for r in seen), "an earlier tensor is still alive"
        if not seen:  # from here on: the tensors (the metadata's lists are freed by now)
            tracemalloc.reset_peak()
        infos_before_data.append(n_info)
        seen.append(weakref.ref(tensor))
        real_write(self, tensor, *a, **k)  # type: ignore[arg-type]

    rs.write_f16_gguf(tiny("qwen2"), tmp_path / "warm.gguf")  # imports (numpy.random...) done before measuring
    monkeypatch.setattr(gguf.GGUFWriter, "add_tensor_info", info)
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", write)
    chunk = 4096
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rs.write_f16_gguf(cfg, tmp_path / "s.gguf", chunk_elems=chunk)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert len(seen) == len(plan) and set(infos_before_data) == {len(plan)}
    # One tensor in F16 and a float32 chunk or two, plus the writer's own; never a whole tensor in float32.
    assert peak < largest + 2 * chunk * 4 + 200_000, (peak, largest, total)


def test_same_seeded_weights_whatever_the_chunk_size(tmp_path: Path) -> None:
    cfg = tiny("qwen2")
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    rs.write_f16_gguf(cfg, a, chunk_elems=100)
    rs.write_f16_gguf(cfg, b)
    assert a.read_bytes() == b.read_bytes()


def test_cache_returns_the_same_file_without_rewriting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny("qwen3")
    first = real_shape_gguf(cfg, "F16", tmp_path, name="t")
    assert set(first.seconds) == {"write_f16"} and not first.cached
    before = first.path.stat()

    def no_write(*a: object, **k: object) -> int:
        raise AssertionError("a cached file was written again")

    monkeypatch.setattr(rs, "write_f16_gguf", no_write)
    again = real_shape_gguf(cfg, "f16", tmp_path, name="t")
    assert again.cached and again.path == first.path and again.size == first.size
    assert again.path.stat().st_mtime_ns == before.st_mtime_ns and again.path.stat().st_ino == before.st_ino
    # Another shape, or another quantization, is another file.
    assert rs.cache_path(replace(cfg, num_layers=3), "t", "F16", tmp_path) != first.path
    assert rs.cache_path(cfg, "t", "Q4_K_M", tmp_path) != first.path


def test_named_shape_cli_uses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    cfg = NAMED_SHAPES["qwen2.5-0.5b"]
    path = rs.cache_path(cfg, "qwen2.5-0.5b", "F16", tmp_path)
    path.write_bytes(b"x" * 123)  # a cached file is returned as it is, never opened
    assert rs.main(["Qwen2.5-0.5B", "--quant", "f16", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == str(path) and "123 bytes" in out[0]
    with pytest.raises(RealShapeError, match="unknown shape 'llama-9'"):
        real_shape_gguf("llama-9", "F16", tmp_path)
    with pytest.raises(RealShapeError, match="quantization 'IQ2_XXS'"):
        real_shape_gguf("qwen2.5-0.5b", "IQ2_XXS", tmp_path)


def fake_quantize(tmp_path: Path, body: str) -> Path:
    exe = tmp_path / "llama-quantize"
    exe.write_text(f"#!{sys.executable}\nimport sys, pathlib\nargs = sys.argv[1:]\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_quantize_step_runs_llama_quantize_and_drops_the_f16(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "argv"
    body = f"pathlib.Path({str(log)!r}).write_text(' '.join(args))\n"
    body += "pathlib.Path(args[1]).write_bytes(pathlib.Path(args[0]).read_bytes()[:1000])"
    monkeypatch.setenv(ENV_QUANTIZE, str(fake_quantize(tmp_path, body)))
    out = tmp_path / "out"
    made = real_shape_gguf(tiny("llama"), "Q4_K_M", out, name="t", threads=2)
    assert made.size == 1000 and set(made.seconds) == {"write_f16", "quantize"}
    src, dst, quant, threads = log.read_text().split()
    assert Path(src).parent == out and not Path(src).exists() and quant == "Q4_K_M" and threads == "2"
    assert Path(dst).parent == out and not Path(dst).exists()
    assert [p.name for p in out.iterdir()] == [made.path.name]


def test_failures_leave_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    body = "pathlib.Path(args[1]).write_bytes(b'half'); print('cannot quantize this'); sys.exit(3)"
    monkeypatch.setenv(ENV_QUANTIZE, str(fake_quantize(tmp_path, body)))
    out = tmp_path / "out"
    with pytest.raises(RealShapeError, match=r"(?s)status 3.*cannot quantize this"):
        real_shape_gguf(tiny("llama"), "Q4_K_M", out)
    assert list(out.iterdir()) == []

    calls = 0
    real_make = rs.make_tensor

    def fail_late(*a: object, **k: object) -> np.ndarray:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise OSError("disk full")
        return real_make(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(rs, "make_tensor", fail_late)
    with pytest.raises(OSError, match="disk full"):
        real_shape_gguf(tiny("llama"), "F16", out)
    assert list(out.iterdir()) == []


@pytest.fixture
def no_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No $DRAFTGATE_LLAMA_SERVER nor $DRAFTGATE_LLAMA_QUANTIZE and an empty cache: nothing to find."""
    monkeypatch.delenv(ENV_BINARY, raising=False)
    monkeypatch.delenv(ENV_QUANTIZE, raising=False)
    monkeypatch.setenv("DRAFTGATE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_missing_llama_quantize_names_make_llamacpp(no_binary: Path) -> None:
    with pytest.raises(RealShapeError, match="make llamacpp"):
        find_llama_quantize()
    with pytest.raises(RealShapeError, match="make llamacpp"):
        real_shape_gguf(tiny("llama"), "Q4_K_M", no_binary / "out")
    assert not (no_binary / "out").exists()  # failed before writing anything
    assert rs.default_out_dir() == no_binary / "cache" / "real-shapes"


def test_env_llama_quantize_must_be_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_QUANTIZE, str(tmp_path / "nope"))
    with pytest.raises(RealShapeError, match=f"{ENV_QUANTIZE}.*make llamacpp"):
        find_llama_quantize()


@pytest.mark.real_model
def test_live_llama_quantize_makes_k_quants(tmp_path: Path) -> None:
    try:
        find_llama_quantize()
    except RealShapeError as e:
        pytest.skip(str(e))
    # K-quants need rows of a multiple of 256 weights: hidden and feed-forward sizes 256 and 512.
    cfg = tiny("llama", hidden_size=256, intermediate_size=512, head_dim=64)
    made = real_shape_gguf(cfg, "Q4_K_M", tmp_path, name="tiny")
    assert [p.name for p in tmp_path.iterdir()] == [made.path.name]  # the F16 intermediate is gone
    f16_size = sum(s.nbytes for s in tensor_plan(cfg))
    assert 0 < made.size < f16_size
    model = load_model(str(made.path), quantized=True)
    assert model.blocks is not None and len(model.blocks) == 7 * cfg.num_layers + 2  # every matrix
    formats = {b.format for b in model.blocks.values()}
    assert "Q4_K" in formats and formats <= {"Q4_K", "Q5_K", "Q6_K"}, formats
    ids = model.tokenizer.encode("Hello, world!")
    assert torch.isfinite(logits(model, ids)).all()
