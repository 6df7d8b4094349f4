"""Native CPU kernels for the Llama forward (C++, compiled for this CPU on first use, called via ctypes).

``build.load_library`` compiles and loads them; ``set_threads`` sizes their thread pool once,
at the edge (the pool is per process and independent of torch's OpenMP threads).
"""

from draftgate.models.native.build import (
    DEFAULT_SPIN_US,
    LEVELS,
    NativeLib,
    NativeUnavailable,
    cpu_level,
    levels_here,
    load_library,
)

__all__ = ["LEVELS", "NativeLib", "NativeUnavailable", "cpu_level", "levels_here", "load_library", "set_threads"]


def set_threads(lib: NativeLib, n: int, spin_us: int = DEFAULT_SPIN_US) -> None:
    """Size the native pool to ``n`` threads (the caller's thread included)."""
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    lib.cdll.dg_set_threads(n, spin_us)
