"""A model's weights by runner name, in the format they were loaded in.

Float tensors (an HF folder's, a float GGUF load's, a GGUF file's norms and biases) are held as
they are. A GGUF file's weight matrices run from its own blocks (``Blocks``, views of the file's
memory map) and have no float copy: reading one (the PyTorch forward, a draft head, a fingerprint)
dequantizes it to float32 then, a new tensor each time. Names, shapes and the float dtype never
dequantize anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch

from draftgate.models.gguf_blocks import Blocks

__all__ = ["ModelWeights"]

EMBED = "model.embed_tokens.weight"


class ModelWeights(Mapping[str, torch.Tensor]):
    """Float tensors (``dense``) and block-only matrices (``blocks``) under one set of names."""

    def __init__(self, dense: Mapping[str, torch.Tensor], blocks: Mapping[str, Blocks] | None = None) -> None:
        self._dense = dict(dense)
        self._blocks = {k: b for k, b in (blocks or {}).items() if k not in self._dense}

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self._dense.get(name)
        if t is not None:
            return t
        return self._blocks[name].dequantize()

    def __contains__(self, name: object) -> bool:
        return name in self._dense or name in self._blocks

    def __iter__(self) -> Iterator[str]:
        yield from self._dense
        yield from self._blocks

    def __len__(self) -> int:
        return len(self._dense) + len(self._blocks)

    @property
    def dense(self) -> Mapping[str, torch.Tensor]:
        """The tensors held as floats (reading them costs nothing)."""
        return self._dense

    @property
    def block_only(self) -> Mapping[str, Blocks]:
        """The matrices held only as GGUF blocks."""
        return self._blocks

    def shape(self, name: str) -> tuple[int, ...]:
        t = self._dense.get(name)
        if t is not None:
            return tuple(t.shape)
        b = self._blocks[name]
        return (b.N, b.K)

    def numel(self) -> int:
        """Weights in all (a parameter count)."""
        return sum(t.numel() for t in self._dense.values()) + sum(b.N * b.K for b in self._blocks.values())

    @property
    def dtype(self) -> torch.dtype:
        """The float dtype the model computes in: the float embedding's, float32 for block-only matrices."""
        emb = self._dense.get(EMBED)
        return emb.dtype if emb is not None else torch.float32

    def to(self, dtype: torch.dtype) -> ModelWeights:
        """Float tensors in ``dtype`` (blocks stay as they are)."""
        dense = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self._dense.items()}
        return ModelWeights(dense, self._blocks)
