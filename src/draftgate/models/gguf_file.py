"""A GGUF file as the loaders read it: its metadata fields, its tensor table, and its tensors' bytes as
views of one memory map of the file (nothing is copied: a tensor's pages are read when touched, and
``GGUFFile.release`` hands them back once the kernels have packed them).

The header is parsed here, not by the ``gguf`` package's reader, which takes ~11 s on a 262k-token
vocabulary; this takes a fraction of a second. Layout (GGUF v2 and v3, little endian): magic, version,
tensor count, field count; the fields (key, type, value); the tensor infos (name, dims with the
fastest first, ggml type, offset); then the tensor data from the next ``general.alignment`` boundary.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftgate.errors import ModelLoadError

__all__ = ["GGUFFile", "GGUFTensor", "GGML_TYPE_NAMES", "cache_file"]

# ggml type id -> (name, weights a block, bytes a block): every type of ggml.h, so a refusal names it.
_GGML = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
GGML_TYPE_NAMES = {k: v[0] for k, v in _GGML.items()}

# Field value types: id -> struct format of a scalar (8: string, 9: array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the table: ``shape`` slowest dimension first (a weight is [N, K])."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPE_NAMES.get(self.ggml_type, f"type {self.ggml_type}")

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (the fastest dimension, ``shape[-1]`` weights)."""
        _, per, size = _GGML[self.ggml_type]
        return self.shape[-1] // per * size


class GGUFFile:
    """An open GGUF file: ``fields`` (key -> str, int, float, bool or list), ``tensors`` in file order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: never written back
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: cannot open ({e})") from e
        try:
            self.fields, self.tensors = _parse(self._map)
        except (struct.error, UnicodeDecodeError, KeyError, ValueError, IndexError) as e:
            raise ModelLoadError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from e
        end = max((t.offset + t.nbytes for t in self.tensors), default=0)
        if end > len(self._map):
            raise ModelLoadError(f"{path}: truncated ({len(self._map)} bytes, its tensors need {end})")

    def data(self, t: GGUFTensor) -> np.ndarray:
        """The tensor's bytes, uint8 [rows, row_bytes], a view of the map (no copy)."""
        rows = t.nbytes // t.row_bytes
        return np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.offset).reshape(rows, t.row_bytes)

    def floats(self, t: GGUFTensor) -> np.ndarray:
        """A float tensor (F32, F16, BF16) as float32 of its shape (a copy)."""
        raw = self.data(t).reshape(-1)
        if t.type_name == "F32":
            out = raw.view("<f4").astype(np.float32)
        elif t.type_name == "F16":
            out = raw.view("<f2").astype(np.float32)
        elif t.type_name == "BF16":
            out = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ModelLoadError(f"{self.path}: {t.name} is {t.type_name}, not a float tensor")
        return out.reshape(t.shape)

    def release(self, t: GGUFTensor) -> None:
        """Drop the tensor's pages from this process (they are read again from the file if touched)."""
        lo = t.offset - t.offset % mmap.PAGESIZE
        hi = t.offset + t.nbytes
        hi -= hi % mmap.PAGESIZE  # whole pages inside the tensor only: neighbours keep theirs
        if hi > lo:
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def _parse(buf: mmap.mmap) -> tuple[dict[str, Any], list[GGUFTensor]]:
    r = _Reader(buf)
    if r.take(4) != b"GGUF":
        raise ValueError("no GGUF magic")
    version = r.scalar("I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (this reads 2 and 3, little endian)")
    n_tensors, n_fields = r.scalar("Q"), r.scalar("Q")
    fields = {}
    for _ in range(n_fields):
        key = r.string()
        fields[key] = r.value(r.scalar("I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.scalar("Q") for _ in range(r.scalar("I"))]
        infos.append((name, dims, r.scalar("I"), r.scalar("Q")))
    align = int(fields.get("general.alignment", 32))
    start = -(-r.pos // align) * align
    tensors = []
    for name, dims, kind, off in infos:
        if kind not in _GGML:
            raise ValueError(f"tensor {name} has unknown ggml type {kind}")
        _, per, size = _GGML[kind]
        count = int(np.prod(dims)) if dims else 1
        tensors.append(GGUFTensor(name, kind, tuple(reversed(dims)), start + off, count // per * size))
    return fields, tensors


class _Reader:
    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, n: int) -> bytes:
        out = self.buf[self.pos : self.pos + n]
        if len(out) != n:
            raise ValueError("unexpected end of the header")
        self.pos += n
        return out

    def scalar(self, fmt: str) -> Any:
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        return self.take(self.scalar("Q")).decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, n = self.scalar("I"), self.scalar("Q")
            if inner == 8:
                return [self.string() for _ in range(n)]
            if inner == 9:
                raise ValueError("nested arrays")
            arr = np.frombuffer(self.buf, dtype=_NUMPY[inner], count=n, offset=self.pos)
            self.pos += arr.nbytes
            return arr.tolist()
        return self.scalar(_SCALARS[kind])


def cache_file(path: Path, cache_dir: Path | None, version: str, suffix: str) -> Path | None:
    """Where something parsed from the file at ``path`` is cached: keyed by its path, size and mtime and
    by what was parsed (``version``); None without a cache folder."""
    if cache_dir is None:
        return None
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{version}".encode()).hexdigest()[:16]
    return cache_dir / f"{path.stem}-{key}{suffix}"


def open_gguf(path: Path) -> GGUFFile:
    return GGUFFile(path)


def gguf_fields(f: GGUFFile) -> dict[str, Any]:
    return f.fields
