"""The vLLM plugin's patches against fake vLLM modules: each patch's decision, its effect, and register.

vLLM is not installed here: each test puts a minimal ``vllm`` package in ``sys.modules`` with
only what the plugin reads (``vllm.v1.outputs.LogprobsTensors``, ``vllm.utils.cpu_triton_utils``,
``vllm.platforms.current_platform``), in the shapes the plugin's docstring describes.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch

from draftgate.integrations.vllm.inside import plugin

LOGGER = "draftgate.integrations.vllm"


@dataclass
class _Buffers:
    """What ``LogprobsTensors.empty_cpu`` returns: three buffers per prompt position."""

    logprob_token_ids: torch.Tensor
    logprobs: torch.Tensor
    selected_token_ranks: torch.Tensor


def _buffers(n: int, m: int, fill: int) -> _Buffers:
    return _Buffers(
        torch.full((n, m), fill, dtype=torch.int64),
        torch.full((n, m), float(fill)),
        torch.full((n,), fill, dtype=torch.int64),
    )


def fake_empty(n: int, m: int) -> _Buffers:
    """An allocator named like ``torch.empty`` that happens to hand out clean memory."""
    return _buffers(n, m, 0)


def _tensors_class(empty_cpu: Callable[[int, int], _Buffers] | None) -> type:
    """A fresh LogprobsTensors class (each test patches its own), ``empty_cpu`` a staticmethod as in vLLM."""
    ns = {} if empty_cpu is None else {"empty_cpu": staticmethod(empty_cpu)}
    return type("LogprobsTensors", (), ns)


def _garbage_empty_cpu(n: int, m: int) -> _Buffers:
    return _buffers(n, m, 7)  # what the memory held before: the probe's sentinel


def _clean_empty_cpu(n: int, m: int) -> _Buffers:
    return _buffers(n, m, 0)  # like torch.zeros: nothing to patch


def _empty_by_source_cpu(n: int, m: int) -> _Buffers:
    return fake_empty(n, m)


def _sourceless(src: str, name: str, **names: object) -> Callable[..., object]:
    """A function whose source cannot be found (compiled from a string): an unknown layout."""
    ns: dict[str, object] = {"torch": torch, "_buffers": _buffers, **names}
    exec(compile(src, "<generated>", "exec"), ns)
    return ns[name]  # type: ignore[return-value]


def _ensure_int64(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64)


def _schema(replace_from: object, replace_to: object) -> None:
    """The C++ op's schema: replace values are ints (a float raises, as ``torch.ops._C.expand_kernel_impl`` does)."""
    if not (isinstance(replace_from, int) and isinstance(replace_to, int)):
        raise RuntimeError("_C::expand_kernel_impl() Expected a value of type 'int' for argument 'replace_from'")


def broken_expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # type: ignore[no-untyped-def]
    """vLLM 0.32's CPU fallback: the kernel writes an int64 copy, the float output stays unwritten."""
    _schema(replace_from, replace_to)
    out = _ensure_int64(output)
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64))
    out[: int(counts.sum())] = torch.repeat_interleave(input_val, counts).to(torch.int64)


def good_expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # type: ignore[no-untyped-def]
    _schema(replace_from, replace_to)
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64))
    vals = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    output[: int(counts.sum())] = torch.repeat_interleave(vals, counts).to(output.dtype)


class _FuncWrapper:
    """vLLM 0.30's ``cpu_triton_utils._FuncWrapper``: a kernel stand-in whose ``[grid]`` gives the function."""

    def __init__(self, func: Callable[..., object] | None) -> None:
        self.func = func

    def __getitem__(self, grid: object) -> Callable[..., object] | None:
        return self.func


class FakeVllm:
    """Installs a fake ``vllm`` in ``sys.modules`` (undone by monkeypatch at the test's end)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch
        self.root = self._module("vllm")
        self.root.__version__ = "0.0.fake"  # type: ignore[attr-defined]
        self.kernels_load = True
        self.mp.setitem(sys.modules, "vllm", self.root)

    def _module(self, name: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        self.mp.setitem(sys.modules, name, mod)
        return mod

    def logprobs(self, tensors: type) -> type:
        self._module("vllm.v1")
        self._module("vllm.v1.outputs").LogprobsTensors = tensors  # type: ignore[attr-defined]
        return tensors

    def expand(self, impl: Callable[..., object] | None, layout: str = "dispatcher") -> types.ModuleType:
        """``vllm.utils`` with ``cpu_triton_utils._expand_kernel_impl`` (None: a build without the module).

        ``layout``: how vLLM reaches it. "dispatcher" (0.31, 0.32): a kernel dispatcher that reads the
        attribute when the worker registers its kernels (``registered``: it did so already, before the
        plugin); "wrapper" (0.30): ``cpu_triton_utils.expand_kernel`` wraps the function at import;
        "unknown": neither."""
        utils = self._module("vllm.utils")
        platforms = self._module("vllm.platforms")

        def import_kernels() -> None:
            if not self.kernels_load:
                raise RuntimeError("no C++ kernels for this CPU")

        platforms.current_platform = types.SimpleNamespace(import_kernels=import_kernels)  # type: ignore[attr-defined]
        cpu_tl = types.ModuleType("vllm.utils.cpu_triton_utils")
        if impl is None:
            self.mp.delitem(sys.modules, cpu_tl.__name__, raising=False)  # importing it fails
        else:
            cpu_tl._expand_kernel_impl = impl  # type: ignore[attr-defined]
            utils.cpu_triton_utils = cpu_tl  # type: ignore[attr-defined]
            self.mp.setitem(sys.modules, cpu_tl.__name__, cpu_tl)
        self.registrations: list[dict[str, object]] = []
        if layout == "wrapper":
            cpu_tl.expand_kernel = _FuncWrapper(impl)  # type: ignore[attr-defined]
        if layout in ("dispatcher", "registered"):
            self._module("vllm.triton_utils")
            dispatcher = self._module("vllm.triton_utils.dispatcher")
            dispatcher._registry = {}  # type: ignore[attr-defined]
            if layout == "registered":
                dispatcher._registry[plugin.EXPAND_KERNEL] = (object(), impl)  # type: ignore[attr-defined]
            dispatcher.register_kernels = self.registrations.append  # type: ignore[attr-defined]
        else:
            self.mp.setitem(sys.modules, "vllm.triton_utils", None)  # importing it fails
        return cpu_tl


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> FakeVllm:
    caplog.set_level(logging.INFO, logger=LOGGER)
    return FakeVllm(monkeypatch)


def _messages(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == LOGGER)


# ------------------------------------------------------------------ zero-filled prompt log-probabilities


def test_buffers_seen_dirty_in_the_probe_are_zero_filled(fake: FakeVllm, caplog: pytest.LogCaptureFixture) -> None:
    tensors = fake.logprobs(_tensors_class(_garbage_empty_cpu))
    assert plugin.zero_fill_prompt_logprobs() is True
    t = tensors.empty_cpu(5, 3)  # type: ignore[attr-defined]
    assert t.logprobs.shape == (5, 3) and t.selected_token_ranks.shape == (5,)
    for buf in (t.logprob_token_ids, t.logprobs, t.selected_token_ranks):
        assert not buf.any()
    assert "0.0.fake" in _messages(caplog) and "seen in a probe" in _messages(caplog)


def test_an_allocator_using_empty_is_patched_by_its_source(fake: FakeVllm, caplog: pytest.LogCaptureFixture) -> None:
    fake.logprobs(_tensors_class(_empty_by_source_cpu))  # clean in the probe, but `empty(` in its source
    assert plugin.zero_fill_prompt_logprobs() is True
    assert "its allocator uses torch.empty" in _messages(caplog)


def test_initialised_buffers_are_left_alone(fake: FakeVllm, caplog: pytest.LogCaptureFixture) -> None:
    def zeroing_empty_cpu(n: int, m: int) -> _Buffers:
        return fake_empty(n, m)  # an allocator that zeros what it hands out

    for empty_cpu in (_clean_empty_cpu, zeroing_empty_cpu):
        tensors = fake.logprobs(_tensors_class(empty_cpu))
        assert plugin.zero_fill_prompt_logprobs() is False
        assert tensors.__dict__["empty_cpu"].__func__ is empty_cpu  # not replaced
    assert "no DraftGate patch needed" in _messages(caplog)


def test_an_allocator_without_source_is_judged_by_the_probe_alone(fake: FakeVllm) -> None:
    clean = _sourceless("def empty_cpu(n, m):\n    return _buffers(n, m, 0)  # torch.empty(...)\n", "empty_cpu")
    tensors = fake.logprobs(_tensors_class(clean))  # type: ignore[arg-type]
    assert plugin.zero_fill_prompt_logprobs() is False
    assert tensors.__dict__["empty_cpu"].__func__ is clean


def test_zero_fill_patches_once(fake: FakeVllm) -> None:
    tensors = fake.logprobs(_tensors_class(_garbage_empty_cpu))
    assert plugin.zero_fill_prompt_logprobs() is True
    patched = tensors.__dict__["empty_cpu"]
    assert plugin.zero_fill_prompt_logprobs() is True  # a second process-level call: already done
    assert tensors.__dict__["empty_cpu"] is patched  # not wrapped again


# ------------------------------------------------------------------ the CPU expand kernel


def test_an_expand_that_leaves_float_outputs_unwritten_is_replaced(
    fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    cpu_tl = fake.expand(broken_expand)
    assert plugin.repair_cpu_expand() is True
    impl = cpu_tl._expand_kernel_impl
    assert impl is not broken_expand
    out = torch.full((4,), -1.0)
    # Two requests with 1 and 2 drafts; -7 (replace_from) stands for "use replace_to".
    impl(out, torch.tensor([0.5, -7.0]), torch.tensor([1, 3], dtype=torch.int32), -7.0, 1.0, MAX_NUM_TOKENS=4)
    assert out.tolist() == [0.5, 1.0, 1.0, -1.0]  # written in place, past the drafts untouched
    ints = torch.zeros(3, dtype=torch.int32)
    impl(ints, torch.tensor([3, 5]), torch.tensor([2, 3]), -1, 0)
    assert ints.tolist() == [3, 3, 5]
    assert "repairs its expand kernel" in _messages(caplog)


def test_an_expand_that_writes_floats_is_left_alone(fake: FakeVllm, caplog: pytest.LogCaptureFixture) -> None:
    cpu_tl = fake.expand(good_expand)
    assert plugin.repair_cpu_expand() is False
    assert cpu_tl._expand_kernel_impl is good_expand
    assert "no DraftGate repair needed" in _messages(caplog)


@pytest.mark.parametrize("impl", [broken_expand, good_expand])
def test_without_cpu_kernels_nothing_is_patched_and_a_warning_says_so(
    fake: FakeVllm, impl: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    fake.kernels_load = False  # the probe cannot run: vLLM is left as it is, whatever its source says
    cpu_tl = fake.expand(impl)
    assert plugin.repair_cpu_expand() is False
    assert cpu_tl._expand_kernel_impl is impl
    assert "could not be probed" in _messages(caplog)


def test_the_probe_calls_the_kernel_as_vllm_does(fake: FakeVllm) -> None:
    """A kernel whose schema takes integer replace values and whose source says nothing: only a probe
    with integers finds it leaves float outputs unwritten."""
    strict = _sourceless(
        "def impl(output, input_val, cu, replace_from, replace_to, MAX_NUM_TOKENS=None):\n"
        "    _schema(replace_from, replace_to)\n"
        "    counts = torch.diff(cu.to(torch.int64), prepend=torch.zeros(1, dtype=torch.int64))\n"
        "    if not output.dtype.is_floating_point:\n"
        "        output[: int(counts.sum())] = torch.repeat_interleave(input_val, counts).to(output.dtype)\n",
        "impl",
        _schema=_schema,
    )
    cpu_tl = fake.expand(strict)
    assert plugin.repair_cpu_expand() is True
    assert cpu_tl._expand_kernel_impl is not strict


def test_a_kernel_bound_at_import_is_repaired_through_its_wrapper(
    fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    cpu_tl = fake.expand(broken_expand, layout="wrapper")  # vLLM 0.30
    assert plugin.repair_cpu_expand() is True
    fixed = cpu_tl._expand_kernel_impl
    assert cpu_tl.expand_kernel[(1,)] is fixed  # what the CPU model runner installs calls the repair
    assert "kernel wrapper" in _messages(caplog)


def test_a_kernel_already_registered_is_registered_again(fake: FakeVllm) -> None:
    cpu_tl = fake.expand(broken_expand, layout="registered")
    assert plugin.repair_cpu_expand() is True
    assert fake.registrations == [{plugin.EXPAND_KERNEL: cpu_tl._expand_kernel_impl}]


def test_a_kernel_reached_in_an_unknown_way_is_left_alone_with_a_warning(
    fake: FakeVllm, caplog: pytest.LogCaptureFixture
) -> None:
    cpu_tl = fake.expand(broken_expand, layout="unknown")
    assert plugin.repair_cpu_expand() is False
    assert cpu_tl._expand_kernel_impl is broken_expand  # the attribute swap undone: it would reach nothing
    assert "does not know" in _messages(caplog)


def test_an_expand_that_can_neither_run_nor_be_read_is_left_alone(fake: FakeVllm) -> None:
    fake.kernels_load = False
    unknown = _sourceless("def impl(output, *args, **kw):\n    output = _ensure_int64(output)\n", "impl")
    cpu_tl = fake.expand(unknown)
    assert plugin.repair_cpu_expand() is False
    assert cpu_tl._expand_kernel_impl is unknown


def test_a_build_without_cpu_fallbacks_needs_no_repair(fake: FakeVllm) -> None:
    fake.expand(None)  # vllm.utils has no cpu_triton_utils
    assert plugin.repair_cpu_expand() is False


def test_expand_is_repaired_once(fake: FakeVllm) -> None:
    cpu_tl = fake.expand(broken_expand)
    assert plugin.repair_cpu_expand() is True
    repaired = cpu_tl._expand_kernel_impl
    assert plugin.repair_cpu_expand() is True
    assert cpu_tl._expand_kernel_impl is repaired


# ------------------------------------------------------------------ register


@pytest.fixture
def loggers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[logging.Logger, logging.Logger]]:
    """DraftGate's and vLLM's loggers, restored afterwards (setLevel also clears the level caches)."""
    ours, theirs = logging.getLogger("draftgate"), logging.getLogger("vllm")
    level = ours.level
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "propagate", True)
    monkeypatch.setattr(theirs, "handlers", [])
    yield ours, theirs
    ours.setLevel(level)


def test_register_applies_both_patches_and_shares_vllms_log(
    fake: FakeVllm, loggers: tuple[logging.Logger, logging.Logger]
) -> None:
    ours, theirs = loggers
    handler = logging.NullHandler()
    theirs.handlers.append(handler)
    tensors = fake.logprobs(_tensors_class(_garbage_empty_cpu))
    cpu_tl = fake.expand(broken_expand)
    plugin.register()
    assert ours.handlers == [handler] and ours.propagate is False and ours.level == logging.INFO
    assert not tensors.empty_cpu(2, 2).logprobs.any()  # type: ignore[attr-defined]
    assert cpu_tl._expand_kernel_impl is not broken_expand


def test_register_keeps_draftgates_own_log_handlers(
    fake: FakeVllm, loggers: tuple[logging.Logger, logging.Logger]
) -> None:
    ours, theirs = loggers
    mine, vllms = logging.NullHandler(), logging.NullHandler()
    ours.handlers.append(mine)
    theirs.handlers.append(vllms)
    fake.logprobs(_tensors_class(_clean_empty_cpu))
    fake.expand(good_expand)
    plugin.register()
    assert ours.handlers == [mine] and ours.propagate is True


def test_register_never_raises_into_vllm_on_an_unknown_layout(
    fake: FakeVllm, loggers: tuple[logging.Logger, logging.Logger], caplog: pytest.LogCaptureFixture
) -> None:
    fake.logprobs(_tensors_class(None))  # a LogprobsTensors without empty_cpu
    fake.expand(broken_expand)
    plugin.register()  # must not raise
    (err,) = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR]
    assert "failed to register" in err.getMessage() and err.exc_info is not None


# ------------------------------------------------------------------ the expand dispatcher (vLLM 0.30)


class _Dispatch:
    """0.30's ``_expand``: launches ``kernel[grid]`` with the Triton kernel's argument names; a raw function
    (the Triton kernel where Triton is off) cannot be launched."""

    def __init__(self, kernel: object) -> None:
        self.kernel = kernel

    def __call__(self, output: torch.Tensor, input: torch.Tensor, cu: torch.Tensor, rf: int, rt: int) -> None:  # noqa: A002
        if not hasattr(self.kernel, "func"):
            raise TypeError("Cannot inspect kernel parameters for function")
        self.kernel[(input.shape[0],)](
            output_ptr=output, input_ptr=input, cu_num_tokens_ptr=cu, replace_from=rf, replace_to=rt, MAX_NUM_TOKENS=8
        )


def _sampler(fake: FakeVllm, dispatch: _Dispatch) -> types.ModuleType:
    fake._module("vllm.v1")
    fake._module("vllm.v1.sample")
    rs = fake._module("vllm.v1.sample.rejection_sampler")
    rs._expand = dispatch  # type: ignore[attr-defined]

    def expand_batch_to_tokens(x, cu, n, replace_from=0, replace_to=0):  # type: ignore[no-untyped-def]
        out = x.new_empty(n)
        dispatch(out, x, cu, replace_from, replace_to)
        return out

    rs.expand_batch_to_tokens = expand_batch_to_tokens  # type: ignore[attr-defined]
    return rs


def raw_triton_kernel(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS):  # type: ignore[no-untyped-def]
    raise AssertionError("a Triton kernel cannot run here")


def _cpu(fake: FakeVllm, cpu: bool = True) -> None:
    platforms = sys.modules["vllm.platforms"]
    platforms.current_platform.is_cpu = lambda: cpu  # type: ignore[attr-defined]


def test_a_cpu_build_whose_sampler_cannot_launch_is_named_and_the_proposer_refuses(
    fake: FakeVllm, caplog: pytest.LogCaptureFixture, loggers: tuple[logging.Logger, logging.Logger]
) -> None:
    fake.logprobs(_tensors_class(_clean_empty_cpu))
    fake.expand(broken_expand, layout="wrapper")  # vLLM 0.30's CPU layout
    _sampler(fake, _Dispatch(raw_triton_kernel))
    _cpu(fake)
    reason = plugin.cpu_drafts_unverifiable()
    assert reason is not None and "cannot verify drafts" in reason and "0.31 or newer" in reason
    plugin.register()
    assert "will not start here" in _messages(caplog)
    from draftgate.integrations.vllm import Proposer

    with pytest.raises(RuntimeError, match="cannot verify drafts"):
        Proposer(None)


def test_a_sampler_that_launches_or_another_layout_or_a_gpu_is_fine(fake: FakeVllm) -> None:
    fake.expand(good_expand, layout="wrapper")

    def cpu_kernel(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS=None):  # type: ignore[no-untyped-def]
        good_expand(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to)

    _sampler(fake, _Dispatch(_FuncWrapper(cpu_kernel)))  # a dispatcher that reaches a CPU kernel: it launches
    _cpu(fake)
    assert plugin.cpu_drafts_unverifiable() is None
    _sampler(fake, _Dispatch(raw_triton_kernel))
    _cpu(fake, cpu=False)  # a GPU build launches Triton itself
    assert plugin.cpu_drafts_unverifiable() is None
    fake.expand(good_expand, layout="dispatcher")  # 0.31/0.32: no import-time wrapper
    _sampler(fake, _Dispatch(raw_triton_kernel))
    _cpu(fake)
    assert plugin.cpu_drafts_unverifiable() is None
