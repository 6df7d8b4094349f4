"""The memory envelope, checked against numbers worked out by hand."""

from __future__ import annotations

import pytest

from draftgate.modelinfo.memory_plan import GIB, model_memory, plan_memory
from draftgate.modelinfo.shapes import NAMED_SHAPES

L70, L8, L1 = NAMED_SHAPES["llama-3-70b"], NAMED_SHAPES["llama-3-8b"], NAMED_SHAPES["llama-3.2-1b"]


def test_weights_and_kv_per_token_by_hand() -> None:
    m = model_memory(L70, "bf16", "bf16")
    assert m.weight_bytes == 70_553_706_496 * 2 == 141_107_412_992
    assert m.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert model_memory(L8, "bf16", "bf16").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert model_memory(L1, "bf16", "bf16").kv_bytes_per_token == 2 * 16 * 8 * 64 * 2
    assert model_memory(L70, "fp32", "fp32").kv_bytes_per_token == 655_360
    assert model_memory(L70, "int8", "fp8").weight_bytes == 70_553_706_496
    assert model_memory(L70, "int4", "bf16").weight_bytes == 35_276_853_248


def test_70b_with_8b_draft_on_192_gib() -> None:
    plan = plan_memory(L70, L8, 192)
    budget = 192 * GIB  # 206,158,430,208
    assert plan.budget_bytes == budget and plan.reserve_bytes == int(budget * 0.1)
    weights = 141_107_412_992 + 16_060_522_496
    assert plan.free_for_kv_bytes == budget - int(budget * 0.1) - weights == 28_374_651_700
    assert plan.kv_bytes_per_seq == 4096 * (327_680 + 131_072)  # target AND draft KV
    assert plan.seqs_fit == 15  # 28.37e9 / 1.879e9 = 15.1
    # The draft: 16.06e9 weights + 15 x 4096 x 131072 KV = 24.1e9, 11.7% of the budget.
    assert plan.draft_bytes == 16_060_522_496 + 15 * 4096 * 131_072
    assert plan.draft_share == pytest.approx(0.117, abs=1e-3)
    assert len(plan.warnings) == 1 and "over the 10% guideline" in plan.warnings[0]


def test_70b_with_1b_draft_has_no_warning() -> None:
    plan = plan_memory(L70, L1, 192, max_seqs=16)
    assert plan.warnings == () and plan.max_seqs_fit is True and plan.planned_seqs == 16
    assert plan.kv_bytes("target") == 16 * 4096 * 327_680 and plan.kv_bytes("draft") == 16 * 4096 * 32_768
    assert plan.draft_share < 0.10


def test_max_seqs_that_do_not_fit() -> None:
    plan = plan_memory(L70, L1, 192, max_seqs=64)
    assert plan.seqs_fit < 64 and plan.max_seqs_fit is False
    assert plan.to_json()["max_seqs_fit"] is False


def test_weights_that_do_not_fit_say_so() -> None:
    plan = plan_memory(L70, L1, 80)
    assert not plan.weights_fit and plan.seqs_fit == 0
    msg = plan.weights_problem()
    assert msg is not None and "do not fit" in msg and "smaller --dtype" in msg and "80.0 GiB" in msg
    # int4 weights (~34 GiB with the draft) fit in the same 80 GiB.
    small = plan_memory(L70, L1, 80, dtype="int4")
    assert small.weights_fit and small.weights_problem() is None and small.kv_dtype == "bf16"
    assert small.seqs_fit == (80 * GIB - int(80 * GIB * 0.1) - small.weight_bytes) // small.kv_bytes_per_seq


def test_target_alone_and_explicit_reserve() -> None:
    plan = plan_memory(L8, None, 24, reserve_gib=2, context=8192)
    assert plan.draft is None and plan.draft_bytes == 0 and plan.reserve_bytes == 2 * GIB
    assert plan.seqs_fit == (22 * GIB - 16_060_522_496) // (8192 * 131_072)
    assert plan.to_json()["draft"] is None


def test_context_beyond_the_models_is_a_warning() -> None:
    plan = plan_memory(L70, NAMED_SHAPES["smollm2-135m"], 400, context=16384)
    joined = " ".join(plan.warnings)
    assert "target's max_position_embeddings 8192" in joined and "draft's max_position_embeddings 8192" in joined


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"gpu_gib": 0}, "--gpu-memory must be a positive"),
        ({"gpu_gib": -4}, "--gpu-memory must be a positive"),
        ({"gpu_gib": float("nan")}, "--gpu-memory must be a positive"),
        ({"context": 0}, "--context"),
        ({"max_seqs": 0}, "--max-seqs"),
        ({"reserve_gib": 80}, "--reserve"),
        ({"reserve_gib": -1}, "--reserve"),
        ({"dtype": "fp8"}, "--dtype must be one of fp32, bf16, fp16, int8, int4"),
    ],
)
def test_bad_input(kw: dict, needle: str) -> None:  # type: ignore[type-arg]
    args = {"gpu_gib": 80.0, **kw}
    gpu = args.pop("gpu_gib")
    with pytest.raises(ValueError, match=needle):
        plan_memory(L8, L1, gpu, **args)
