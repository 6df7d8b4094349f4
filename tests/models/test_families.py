"""Every supported family runs as transformers runs it: logits, greedy output, speculation, GGUF.

Each family's tiny random model (family_models.py) is built with transformers' own class; our
native kernels and our PyTorch forward must give its logits within float32 noise (1e-4) over
prefill, decode and a speculative round trip; the same model written as a GGUF file the way
llama.cpp's converter writes it loads to the very same weights; speculation (n-gram, auto) on it
gives plain decoding's tokens exactly; and its logits are bitwise batch invariant. A Gemma 3 model
has sliding windows shorter than the prompts here, so its local layers' masks are exercised.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from family_models import FAMILIES, GGUF_ARCH, build_hf, hf_reference, noisy_copy, write_gguf

from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.errors import ModelLoadError
from draftgate.modelinfo.shapes import resolve_shape
from draftgate.models.loader import LoadedModel, load_model
from draftgate.models.runner import ForwardItem, Kernels, ModelRunner
from draftgate.types import SamplingParams

TOL = 1e-4
REL_TOL = 5e-6  # of the largest reference logit
NAMES = list(FAMILIES)


@pytest.fixture(scope="module", params=NAMES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def folder(family: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_hf(family, tmp_path_factory.mktemp(f"hf-{family}"))


@pytest.fixture(scope="module")
def hf(folder: Path):
    return hf_reference(folder)


@pytest.fixture(scope="module")
def loaded(folder: Path) -> LoadedModel:
    return load_model(str(folder))


def _tokens(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 96, (n,), generator=g).tolist()


def _hf_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def _assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    diff = (ours - ref).abs().max().item()
    tol = max(TOL, REL_TOL * ref.abs().max().item())
    assert diff <= tol, f"max abs logit difference {diff:.3g} > {tol:.3g}"


@pytest.fixture(params=[Kernels.NATIVE, Kernels.TORCH], ids=["native", "torch"])
def runner(loaded: LoadedModel, request: pytest.FixtureRequest) -> Iterator[ModelRunner]:
    r = ModelRunner(loaded, num_blocks=64, block_size=4, enable_prefix_cache=False, kernels=request.param)
    yield r
    for seq in range(4):
        r.free(seq)
    r.kv.check_no_leaks()


def test_prefill_decode_and_round_trip_match_transformers(hf, runner: ModelRunner) -> None:
    """29-token prefill (longer than Gemma's window of 8), two decode steps, then K+1 = 5 tokens of which
    2 are kept and 5 others verified: every logit as transformers computes it from scratch."""
    prompt, first, second = _tokens(29, 1), _tokens(5, 2), _tokens(5, 3)
    assert runner.add_sequence(0, prompt) == 0
    (logits,) = runner.forward([ForwardItem(0, prompt, num_logits=len(prompt))])
    _assert_close(logits, _hf_logits(hf, prompt))
    for t in (7, 11):
        prompt = prompt + [t]
        (logits,) = runner.forward([ForwardItem(0, [t])])
        _assert_close(logits, _hf_logits(hf, prompt)[-1:])
    (logits,) = runner.forward([ForwardItem(0, first, num_logits=5)])
    _assert_close(logits, _hf_logits(hf, prompt + first)[-5:])
    runner.truncate(0, len(prompt) + 2)
    (logits,) = runner.forward([ForwardItem(0, second, num_logits=5)])
    _assert_close(logits, _hf_logits(hf, prompt + first[:2] + second)[-5:])


def test_ragged_batch_matches_transformers(hf, runner: ModelRunner) -> None:
    prompts = [_tokens(n, 10 + n) for n in (5, 17, 11)]
    for i, p in enumerate(prompts):
        runner.add_sequence(i, p)
    out = runner.forward([ForwardItem(i, p, num_logits=len(p)) for i, p in enumerate(prompts)])
    for p, logits in zip(prompts, out, strict=True):
        _assert_close(logits, _hf_logits(hf, p))


def test_greedy_ids_equal_transformers_generate(hf, loaded: LoadedModel) -> None:
    prompt = _tokens(12, 4)
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None)
    engine = build_engine(EngineConfig(drafter=DrafterKind.NONE, num_blocks=64, block_size=8), loaded=loaded)
    try:
        params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
        assert engine.complete(prompt, params).token_ids == ref[0, len(prompt) :].tolist()
    finally:
        engine.shutdown()


@pytest.mark.parametrize("kind", [DrafterKind.NGRAM, DrafterKind.AUTO], ids=lambda d: d.value)
def test_speculation_equals_plain(loaded: LoadedModel, kind: DrafterKind) -> None:
    # Prompts that repeat themselves, so lookup drafts exist and some are accepted.
    prompts = [(_tokens(6, s) * 4)[:20] for s in range(4)]  # K fixed at 4: drafts are tried whatever they cost
    params = SamplingParams(temperature=0.0, max_new_tokens=32, ignore_eos=True)
    outs: dict[DrafterKind, list[list[int]]] = {}
    accepted = 0
    for k in (DrafterKind.NONE, kind):
        engine = build_engine(EngineConfig(drafter=k, k=4, num_blocks=128, block_size=8), loaded=loaded)
        try:
            results = [engine.complete(p, params) for p in prompts]
            outs[k] = [r.token_ids for r in results]
            if k is kind:
                accepted = sum(r.stats.accepted_tokens for r in results)
        finally:
            engine.shutdown()
    assert outs[kind] == outs[DrafterKind.NONE]
    assert accepted > 0, "no draft was ever accepted: the comparison proved nothing"


@pytest.mark.parametrize("k", [4, None], ids=["K4", "Kauto"])
def test_draft_model_of_the_family_is_exact(folder: Path, loaded: LoadedModel, tmp_path: Path, k: int | None) -> None:
    """A draft model of the same family (the target plus noise) passes check-pair and drafts exactly, under a
    fixed K and under the goodput controller."""
    from draftgate.modelinfo.pairing import check_pair

    draft_dir = noisy_copy(folder, tmp_path / "draft")
    assert check_pair(loaded, load_model(str(draft_dir))).ok
    prompts = [_tokens(9, 30 + s) for s in range(3)]
    params = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    outs, accepted = [], 0
    for cfg in (
        EngineConfig(drafter=DrafterKind.NONE, num_blocks=96, block_size=8),
        EngineConfig(drafter=DrafterKind.MODEL, draft_model=str(draft_dir), k=k, num_blocks=96, block_size=8),
    ):
        engine = build_engine(cfg, loaded=loaded)
        try:
            results = [engine.complete(p, params) for p in prompts]
        finally:
            engine.shutdown()
        outs.append([r.token_ids for r in results])
        accepted = sum(r.stats.accepted_tokens for r in results)
    assert outs[1] == outs[0]
    if k is not None:
        assert accepted > 0, "no draft token was accepted: the comparison proved nothing"


def test_native_logits_are_batch_invariant(loaded: LoadedModel) -> None:
    runner = ModelRunner(loaded, num_blocks=64, block_size=4, enable_prefix_cache=False, kernels=Kernels.NATIVE)
    prompt, cont = _tokens(21, 5), _tokens(9, 6)
    runner.prefill(0, prompt)
    one = torch.cat([runner.forward([ForwardItem(0, [t])])[0] for t in cont])
    runner.prefill(1, _tokens(13, 7))
    for w in (2, 5, 9):
        runner.truncate(0, len(prompt))
        out = runner.forward([ForwardItem(0, cont[:w], num_logits=w), ForwardItem(1, _tokens(3, w), num_logits=1)])
        assert torch.equal(out[0], one[:w]), f"width {w} beside another sequence differs from one-row decoding"
        runner.truncate(1, 13)
    runner.free(0)
    runner.free(1)
    runner.kv.check_no_leaks()


# ----------------------------------------------------------------------------- GGUF


def test_gguf_loads_the_same_weights(family: str, folder: Path, loaded: LoadedModel, tmp_path: Path) -> None:
    """llama.cpp's names, q/k permutation and Gemma's stored 1 + w all undone: bitwise the HF weights."""
    path = write_gguf(family, folder, tmp_path / "m.gguf")
    g = load_model(str(path))
    shape = resolve_shape(str(path))  # metadata only, as plan-memory reads it
    assert (shape.family, shape.num_params) == (g.config.family, loaded.config.num_params)
    assert g.config.family.name == GGUF_ARCH[family]  # llama.cpp writes Mistral as its llama architecture
    assert g.config.layer_windows == loaded.config.layer_windows
    assert g.config.head_dim == loaded.config.head_dim
    assert set(g.weights) - {"lm_head.weight"} == set(loaded.weights) - {"lm_head.weight"}
    for name, w in loaded.weights.items():
        assert torch.equal(g.weights[name], w), name


def test_gguf_q8_native_blocks_match_their_dequantized_weights(family: str, folder: Path, tmp_path: Path) -> None:
    """Q8_0 weights read as blocks by the native kernels against the PyTorch forward on the same weights
    dequantized: the only difference is the kernels' Q8 activations, a small fraction of the logits."""
    path = write_gguf(family, folder, tmp_path / "q8.gguf", quant="Q8_0")
    q = load_model(str(path), quantized=True)
    assert q.blocks and all(b.format == "Q8_0" for b in q.blocks.values())
    prompt = _tokens(25, 8)
    logits = []
    for kernels in (Kernels.NATIVE, Kernels.TORCH):
        r = ModelRunner(q, num_blocks=32, block_size=4, enable_prefix_cache=False, kernels=kernels)
        r.add_sequence(0, prompt)
        logits.append(r.forward([ForwardItem(0, prompt, num_logits=len(prompt))])[0])
        r.free(0)
    native, ref = logits
    rel = ((native - ref).abs().max() / ref.abs().max()).item()
    # Measured 2.3-4.4% on these random models; a dropped norm or bias moves the logits by tens of percent.
    assert rel < 0.08, f"Q8_0 native logits off by {rel:.2%} of the largest"
    assert (native.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


# -------------------------------------------------------------------------- refusals


def test_unknown_architecture_is_refused_by_name(tmp_path: Path) -> None:
    import json

    folder = build_hf("llama", tmp_path / "hf")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = "phi3"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=r"phi3.*(llama|qwen2|gemma3)"):
        load_model(str(folder))


def test_unknown_gguf_architecture_is_refused_by_name(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "x.gguf"
    wr = gguf.GGUFWriter(str(path), "falcon")
    wr.add_block_count(1)
    wr.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    with pytest.raises(ModelLoadError, match=r"falcon.*(llama|qwen2|gemma3)"):
        load_model(str(path))


def test_a_tensor_the_family_would_not_read_is_refused(tmp_path: Path) -> None:
    """A llama file carrying q/k/v biases is not a Llama: running it without them would be a different model."""
    from safetensors.torch import load_file, save_file

    folder = build_hf("llama", tmp_path / "hf")
    (f,) = folder.glob("*.safetensors")
    w = load_file(str(f))
    w["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(w, str(f), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="q_proj.bias"):
        load_model(str(folder))
