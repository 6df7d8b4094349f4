"""What a model takes in this machine's memory before it is loaded, and the refusal when it does not fit.

On the native CPU kernels a model's memory is its packed weights, its KV cache and the process
itself:

- packed weights: a GGUF file run in its own format (``--dtype auto``) packs each weight matrix from
  the file's blocks into the kernels' tiles (``PACKED_BYTES_PER_WEIGHT``; the file's pages are handed
  back once packed), plus its norms and biases as float32; a float model keeps its float tensors and
  packs a copy (``float32``/``bfloat16``/``float16``: twice its bytes a weight);
- KV cache: ``num_blocks * block_size`` slots of ``2 * layers * kv_heads * head_dim`` float32;
- the process: Python, PyTorch and the forward's buffers (``PROCESS_BYTES``).

``host_need`` reads only a GGUF file's tensor table or a config's shape, so a model too large is
refused in a second with the numbers, not after minutes of loading and a kill by the OOM killer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from draftgate.errors import ModelLoadError
from draftgate.models.config import ModelConfig

__all__ = ["HostNeed", "host_need", "available_bytes", "check_fits", "PACKED_BYTES_PER_WEIGHT"]

GIB = 1 << 30
PROCESS_BYTES = GIB // 2
# Bytes a weight in the native kernels' tiles, by the GGUF type it is packed from (models/native/qtiles.h:
# each format's own fields at their own width, so about the file's bytes; a product's columns are padded
# to a whole vector, which the 2% the test allows covers).
PACKED_BYTES_PER_WEIGHT = {
    "Q4_0": 0.5625,
    "Q4_1": 0.625,
    "Q5_0": 0.6875,
    "Q5_1": 0.75,
    "Q8_0": 1.0625,
    "Q4_K": 0.58,
    "Q5_K": 0.705,
    "Q6_K": 0.825,
    "F16": 2.0,
    "BF16": 2.0,
    "F32": 4.0,
}
_FLOAT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class HostNeed:
    """One model's memory on this machine, in bytes."""

    name: str
    weights: int
    kv: int

    @property
    def total(self) -> int:
        return self.weights + self.kv


def host_need(name: str, path: Path, config: ModelConfig, dtype: str, kv_slots: int) -> HostNeed:
    """``dtype``: "auto" (a GGUF file's own format; float32 for an HF folder) or a float dtype."""
    if dtype == "auto" and path.suffix == ".gguf":
        weights = _gguf_packed_bytes(path)
    else:
        per = _FLOAT_BYTES["float32" if dtype == "auto" else dtype]
        weights = 2 * config.num_params * per  # the loaded tensors and the packed copy
    kv = kv_slots * 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    return HostNeed(name, weights, kv)


def _gguf_packed_bytes(path: Path) -> int:
    from draftgate.models.gguf_file import GGUFFile

    total = 0.0
    for t in GGUFFile(path).tensors:
        n = math.prod(t.shape)
        if len(t.shape) < 2:
            total += 4 * n  # norms, biases: float32
        else:  # a type the packer does not read is refused at load with its name; count it as float32
            total += PACKED_BYTES_PER_WEIGHT.get(t.type_name, 4.0) * n
    return int(total)


def available_bytes() -> int | None:
    """The kernel's estimate of memory available to a new process (MemAvailable), None if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(needs: list[HostNeed], limit_gib: float | None) -> None:
    """Refuse (ModelLoadError, with the numbers) when the models, their KV and the process exceed the limit
    (``limit_gib``, else the memory available now); nothing is checked when neither is known."""
    limit = int(limit_gib * GIB) if limit_gib is not None else available_bytes()
    if limit is None:
        return
    need = sum(n.total for n in needs) + PROCESS_BYTES
    if need <= limit:
        return
    parts = ", ".join(f"{n.name}: {_gib(n.weights)} GiB weights + {_gib(n.kv)} GiB KV cache" for n in needs)
    where = f"--memory-limit {limit_gib:g} GiB" if limit_gib is not None else "available memory"
    raise ModelLoadError(
        f"not enough memory: {parts} + {_gib(PROCESS_BYTES)} GiB for the process = {_gib(need)} GiB, "
        f"more than the {_gib(limit)} GiB of {where}; use a smaller or more quantized model (--dtype auto runs "
        f"a GGUF file in its own format), fewer --kv-blocks, or free memory"
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"
