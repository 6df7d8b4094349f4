"""A GGUF file as the loaders read it: open it with the ``gguf`` package, its metadata fields, and
where what was parsed from it is cached (parsing a 49k vocabulary's metadata takes ~10 s).

``loader`` reads the config, tokenizer and float weights from it, ``gguf_blocks`` the quantized blocks.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from draftgate.errors import ModelLoadError

__all__ = ["open_gguf", "gguf_fields", "cache_file"]


def open_gguf(path: Path) -> Any:
    """The ``gguf`` package's reader of the file at ``path`` (ModelLoadError if it is not a GGUF file)."""
    from gguf import GGUFReader  # slow to import; only GGUF loads need it

    try:
        return GGUFReader(str(path))
    except Exception as e:  # the reader raises bare ValueError/struct errors on junk
        raise ModelLoadError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from e


def gguf_fields(reader: Any) -> dict[str, Any]:
    """The metadata fields of an open GGUF file by key (fields of types the loaders never read are left out)."""
    out: dict[str, Any] = {}
    for k, f in reader.fields.items():
        try:
            out[k] = f.contents()
        except Exception:  # exotic field types we do not need
            continue
    return out


def cache_file(path: Path, cache_dir: Path | None, version: str, suffix: str) -> Path | None:
    """Where something parsed from the file at ``path`` is cached: keyed by its path, size and mtime and
    by what was parsed (``version``); None without a cache folder."""
    if cache_dir is None:
        return None
    st = path.stat()
    key = hashlib.sha1(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{version}".encode()).hexdigest()[:16]
    return cache_dir / f"{path.stem}-{key}{suffix}"
