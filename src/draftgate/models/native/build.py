"""Compile the native kernels for this CPU once, cache the library, load it with ctypes.

The C++ sources beside this file are compiled on first use with the system C++ compiler (about
5 s) for the best instruction set this CPU has: ``avx512vnni`` (x86-64-v4 and AVX-512 VNNI: 8-bit
integer dot products on every quantized tile, not only the 4-bit ones), ``avx512`` (x86-64-v4), ``avx2`` (x86-64-v3:
AVX2, FMA, F16C) or ``portable`` (plain C++). The CPU of a machine can change between runs (a
cloud VM), so the level is detected every time and is part of the cache key with the sources,
the flags and the compiler's version. No flag may reorder floating-point sums
(``-ffp-contract=off``, no ``-ffast-math``): batch invariance rests on it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["NativeUnavailable", "NativeLib", "cpu_level", "levels_here", "load_library", "LEVELS", "DEFAULT_SPIN_US"]

# Pool workers spin this long after a job before they sleep: it covers the gap between the
# forwards of a decode loop (Python bookkeeping, ~0.2-1 ms), so the next forward pays no wake-up.
DEFAULT_SPIN_US = 1000

_SRC = Path(__file__).resolve().parent
# Every file the library is built from (the cache key hashes them): kernels.cpp and the headers it includes.
_SOURCES = (
    "kernels.cpp",
    "attention.h",
    "forward.h",
    "gemm.h",
    "gguf_decode.h",
    "head_step.h",
    "packed.h",
    "pool.h",
    "qgemm.h",
    "qtiles.h",
    "rows.h",
    "simd.h",
)
LEVELS = ("avx512vnni", "avx512", "avx2", "portable")
_MARCH = {
    "avx512vnni": ["-march=x86-64-v4", "-mavx512vnni"],
    "avx512": ["-march=x86-64-v4"],
    "avx2": ["-march=x86-64-v3"],
    "portable": [],
}
_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared", "-pthread"]
_FLAGS += ["-Wall", "-Wno-maybe-uninitialized", "-Wno-uninitialized"]  # gcc 12 false positives in intrinsics


class NativeUnavailable(RuntimeError):
    """The native kernels cannot be built or loaded here (no compiler, a failed build)."""


def cpu_level() -> str:
    """The best kernel level this CPU (and its OS) supports."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "portable"
    try:
        flags = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return "portable"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
        return "avx512vnni" if "avx512_vnni" in flags else "avx512"
    if {"avx2", "fma", "f16c", "bmi2"} <= flags:
        return "avx2"
    return "portable"


def levels_here() -> tuple[str, ...]:
    """Every kernel level this CPU can run, best first (a lower level runs where a higher one does)."""
    return LEVELS[LEVELS.index(cpu_level()) :]


def _compiler() -> str:
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    raise NativeUnavailable(
        "no C++ compiler found (g++, c++ or clang++): install one (Debian: apt install g++) or run with --kernels torch"
    )


def _cache_key(cxx: str, level: str) -> str:
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update((_SRC / name).read_bytes())
    h.update(" ".join(_FLAGS + _MARCH[level]).encode())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout
    h.update(version.encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class NativeLib:
    """The loaded library: its level and the C functions (prototypes declared)."""

    level: str
    path: Path
    cdll: ctypes.CDLL


_loaded: dict[str, NativeLib] = {}
_lock = threading.Lock()


def load_library(cache_dir: Path, level: str | None = None) -> NativeLib:
    """Build (once per cache key) and load the kernels for ``level`` (default: this CPU's)."""
    level = level or cpu_level()
    if level not in LEVELS:
        raise ValueError(f"unknown kernel level {level!r}; choose from {', '.join(LEVELS)}")
    if level not in levels_here():
        raise NativeUnavailable(
            f"kernel level {level!r} needs instructions this CPU lacks; it runs {', '.join(levels_here())}"
        )
    with _lock:
        if level in _loaded:
            return _loaded[level]
        cxx = _compiler()
        out = Path(cache_dir) / "native" / f"{level}-{_cache_key(cxx, level)}" / "libdraftgate_native.so"
        if not out.is_file():
            _compile(cxx, level, out)
        try:
            lib = NativeLib(level, out, _declare(ctypes.CDLL(str(out))))
        except OSError as e:
            raise NativeUnavailable(f"cannot load the native kernels {out}: {e}") from e
        # The pool starts as large as torch's intra-op setting (the CLI's --threads sets it first).
        lib.cdll.dg_set_threads(torch.get_num_threads(), DEFAULT_SPIN_US)
        _loaded[level] = lib
        return lib


def _compile(cxx: str, level: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build into a temporary name and rename: processes starting together never load a half-written file.
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, *_FLAGS, *_MARCH[level], "-o", tmp, str(_SRC / "kernels.cpp")]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise NativeUnavailable(
                f"building the native kernels failed ({' '.join(cmd)}):\n{res.stderr[-2000:]}\n"
                "run with --kernels torch to use PyTorch's kernels instead"
            )
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i, i64, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
    protos: dict[str, tuple[object, list[object]]] = {
        "dg_isa": (ctypes.c_char_p, []),
        "dg_last_error": (ctypes.c_char_p, []),
        "dg_set_threads": (None, [i, i]),
        "dg_threads": (i, []),
        "dg_pack": (p, [p, i, i, i]),
        "dg_pack_gguf": (p, [i, p, p, p, i]),
        "dg_unpack": (i, [p, p]),
        "dg_packed_dtype": (i, [p]),
        "dg_packed_free": (None, [p]),
        "dg_packed_bytes": (i64, [p]),
        "dg_linear": (i, [p, p, i, p, i]),
        "dg_model_new": (p, [i, i, i, i, i, i, f, p, p, f, f, i]),
        "dg_model_set_layer": (None, [p, i, p, p, p, p, p, p, p, p, p, p, p, i, i]),
        "dg_model_set_head": (None, [p, p, p, p, i, i, p]),
        "dg_model_free": (None, [p]),
        "dg_forward": (i, [p, i, p, p, p, p, p, i, p, p, i, p, p, i64, i, p, p, p, i, p, i, p, p]),
        "dg_profile": (i, [i, p]),
        "dg_head_new": (p, [i, i, i, i, i, i, f, *[p] * 15, i64]),
        "dg_head_free": (None, [p]),
        "dg_head_step": (i, [p, i, p, p, p, p, p, p, p, p, p, p, p, p]),
    }
    for name, (res, args) in protos.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib
