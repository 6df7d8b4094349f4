"""Host memory before loading: the estimate bounds what the native kernels pack, and a model that does not
fit is refused with the numbers before a byte of it is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.errors import ModelLoadError
from draftgate.modelinfo.host_memory import GIB, PROCESS_BYTES, HostNeed, available_bytes, check_fits, host_need
from draftgate.modelinfo.shapes import resolve_shape
from draftgate.models.loader import LoadedModel, load_model, resolve_model_path
from draftgate.models.runner import ModelRunner


def test_float_model_counts_its_tensors_and_packed_copy(tiny_model_dir: Path, tiny_model: LoadedModel) -> None:
    cfg = tiny_model.config
    need = host_need("t", tiny_model_dir, resolve_shape(str(tiny_model_dir)), "float32", kv_slots=100)
    assert need.weights == 2 * 4 * tiny_model.weights.numel()
    assert need.kv == 100 * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_gguf_estimate_bounds_what_is_packed(name: str) -> None:
    """The estimate reads the tensor table only; the packed model (its products and float32 norms) fits
    inside it, and it is not a wild overestimate."""
    path = resolve_model_path(name)
    loaded = load_model(name, quantized=True)
    need = host_need(name, path, loaded.config, "auto", kv_slots=0)
    runner = ModelRunner(loaded, num_blocks=4, block_size=16)
    packed = runner.model.packed_bytes + sum(t.numel() * 4 for t in loaded.weights.dense.values())
    assert packed <= need.weights <= 1.3 * packed, (packed, need.weights)


def test_refusal_names_every_part_and_what_to_do() -> None:
    needs = [HostNeed("target big", 3 * GIB, GIB), HostNeed("draft small", GIB // 2, GIB // 4)]
    with pytest.raises(ModelLoadError) as e:
        check_fits(needs, limit_gib=4.0)
    msg = str(e.value)
    assert "target big: 3.00 GiB weights + 1.00 GiB KV cache" in msg
    assert "draft small: 0.50 GiB weights + 0.25 GiB KV cache" in msg
    assert "= 5.25 GiB, more than the 4.00 GiB of --memory-limit 4 GiB" in msg
    assert "--kv-blocks" in msg
    check_fits(needs, limit_gib=(sum(n.total for n in needs) + PROCESS_BYTES) / GIB)  # exactly fits: no error


def test_build_engine_refuses_before_loading(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import draftgate.engine.factory as factory

    def no_load(*a: object, **k: object) -> None:
        raise AssertionError("the model was loaded before the memory check")

    monkeypatch.setattr(factory, "load_model", no_load)
    cfg = EngineConfig(model=str(tiny_model_dir), drafter=DrafterKind.NONE, memory_limit_gib=0.25)
    with pytest.raises(ModelLoadError, match="not enough memory"):
        build_engine(cfg)


@pytest.mark.real_model
def test_a_kv_cache_larger_than_the_machine_is_refused() -> None:
    avail = available_bytes()
    assert avail is not None  # Linux: /proc/meminfo
    slots_needed = avail // (2 * 30 * 3 * 64 * 4) + 1  # SmolLM2's KV per slot: more slots than memory holds
    cfg = EngineConfig(drafter=DrafterKind.NONE, num_blocks=slots_needed // 16 + 1)
    with pytest.raises(ModelLoadError, match=r"KV cache .* more than the .* GiB of available memory"):
        build_engine(cfg)


def test_memory_limit_is_validated() -> None:
    with pytest.raises(ValueError, match="memory limit"):
        EngineConfig(memory_limit_gib=0).validate()
