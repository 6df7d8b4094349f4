"""Prefix cache: reuse the KV of full blocks whose whole token prefix matches.

A block is identified by a chained hash: ``h_i = H(h_{i-1} || tokens of block i)``
with ``h_{-1} = ROOT_HASH``. Equal hashes mean equal token prefixes, hence equal
KV (attention at position t depends only on tokens 0..t). H is SHA-256, not
Python's ``hash()``: a 64-bit collision would hand one request another request's
KV and silently break losslessness.

Ownership of references (the rule every caller needs):

* The cache holds exactly one reference to each cached block, taken in
  ``insert`` and dropped by eviction or ``clear``.
* ``lookup``/``match`` take one *extra* reference per returned block on behalf of
  the caller; the caller owns it and must ``decref`` it (KVManager does so in
  ``truncate``/``free``).
* A cached block whose refcount is 1 is held only by the cache: it is
  *evictable*, kept in LRU order (least recently released first), and the
  allocator reclaims it when its free list runs dry.

Only full blocks are ever cached; a partially written block may still change.
The "always leave the last prompt token to compute" rule is the KVManager's,
passed here as ``max_blocks``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from draftgate.kv.blocks import BlockAllocator

__all__ = ["ROOT_HASH", "BlockHash", "PrefixCache", "block_hash"]

BlockHash = bytes
ROOT_HASH: BlockHash = bytes(32)


def block_hash(parent: BlockHash, tokens: Sequence[int]) -> BlockHash:
    """Chained hash of one block: SHA-256 of the parent hash and the block's token ids."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


class PrefixCache:
    """Maps chained block hashes to physical blocks; the allocator's evictor."""

    def __init__(self, allocator: BlockAllocator) -> None:
        self._allocator = allocator
        self._block_of: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        # Cached blocks held only by the cache, least recently released first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        allocator.set_evictor(self)

    @property
    def num_cached(self) -> int:
        return len(self._hash_of)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._hash_of

    # -- lookups -------------------------------------------------------------

    def match(self, tokens: Sequence[int], max_blocks: int | None = None) -> tuple[list[int], list[BlockHash]]:
        """Longest cached run of full-block prefixes of ``tokens``: (block ids, their hashes).

        Takes one reference per returned block for the caller (see module docstring).
        """
        bs = self._allocator.block_size
        n_full = len(tokens) // bs
        if max_blocks is not None:
            n_full = min(n_full, max(max_blocks, 0))
        ids: list[int] = []
        hashes: list[BlockHash] = []
        parent = ROOT_HASH
        for i in range(n_full):
            h = block_hash(parent, tokens[i * bs : (i + 1) * bs])
            b = self._block_of.get(h)
            if b is None:
                break
            ids.append(b)
            hashes.append(h)
            parent = h
        for b in ids:
            self._allocator.incref(b)  # leaves the evictable set via refcount_changed
        return ids, hashes

    def lookup(self, tokens: Sequence[int], max_blocks: int | None = None) -> list[int]:
        """Block ids of the longest cached full-block prefix; the caller owns one ref to each."""
        return self.match(tokens, max_blocks)[0]

    # -- insertion and eviction ---------------------------------------------

    def insert(self, parent: BlockHash, tokens: Sequence[int], block_id: int) -> BlockHash:
        """Cache a completely written block whose prefix hashes to ``parent``.

        Returns the block's hash (the parent of the next block). The caller must
        hold a reference to ``block_id``; the cache takes its own. If an equal
        prefix is already cached under another block, nothing is cached and the
        caller keeps using its own copy.
        """
        if len(tokens) != self._allocator.block_size:
            raise ValueError(
                f"only full blocks are cached: got {len(tokens)} tokens, block_size is {self._allocator.block_size}"
            )
        h = block_hash(parent, tokens)
        cached_as = self._hash_of.get(block_id)
        if cached_as is not None:
            if cached_as != h:
                raise ValueError(
                    f"block {block_id} is already cached with different contents; "
                    "a cached block must never be written in place"
                )
            return h
        if h in self._block_of:
            return h
        if self._allocator.refcount(block_id) < 1:
            raise ValueError(f"cannot cache free block {block_id}")
        self._block_of[h] = block_id
        self._hash_of[block_id] = h
        self._allocator.incref(block_id)
        return h

    def evict_one(self) -> bool:
        """Drop the least recently released evictable block; False if there is none."""
        if not self._evictable:
            return False
        block_id, _ = self._evictable.popitem(last=False)
        del self._block_of[self._hash_of.pop(block_id)]
        self._allocator.decref(block_id)
        return True

    def clear(self) -> int:
        """Drop every cache reference; blocks still used by sequences stay with them."""
        blocks = list(self._hash_of)
        self._block_of.clear()
        self._hash_of.clear()
        self._evictable.clear()
        for b in blocks:
            self._allocator.decref(b)
        return len(blocks)

    def refcount_changed(self, block_id: int, refcount: int) -> None:
        """Allocator hook: a cached block at refcount 1 is held only by us, so evictable."""
        if block_id not in self._hash_of:
            return
        if refcount == 1:
            self._evictable[block_id] = None
            self._evictable.move_to_end(block_id)
        else:
            self._evictable.pop(block_id, None)
