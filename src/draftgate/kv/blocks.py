"""Physical KV block allocator: a free list and reference counts, nothing else.

The model runner owns KV tensors shaped ``[num_blocks, block_size, ...]``; this
module only decides which block ids are in use. A block is shared by reference
counting (forked sequences, cached prefixes), so "free" means refcount 0.

Why a deque: allocate and free are O(1) and freed blocks go to the back, so a
just-freed block is reused last. That makes a stale read of a freed block (a
bug elsewhere) show up as wrong output in tests instead of hiding behind a
block that happens to still hold the right values.

Invalid use (decref of a free block, an id out of range) raises ValueError:
bookkeeping that silently corrupts would make two sequences write one slot.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

__all__ = ["BlockAllocator", "Evictor", "OutOfBlocks"]


class OutOfBlocks(Exception):
    """Not enough KV blocks, even after evicting unreferenced cached prefixes.

    Raised before anything changes, so the caller may free or preempt a
    sequence and retry.
    """

    def __init__(self, needed: int, available: int, total: int) -> None:
        self.needed = needed
        self.available = available
        self.total = total
        super().__init__(
            f"KV cache is full: needed {needed} block(s) but only {available} of {total} "
            "are free or evictable; raise --kv-blocks or lower concurrency"
        )


class Evictor(Protocol):
    """What the allocator asks of a cache that holds references to idle blocks.

    The prefix cache implements it. Blocks held *only* by the evictor are
    reclaimable; the allocator reclaims one at a time when its free list is empty.
    """

    @property
    def num_evictable(self) -> int:
        """Blocks whose only reference is the evictor's."""
        ...

    def evict_one(self) -> bool:
        """Drop the evictor's reference to one evictable block; False if none."""
        ...

    def refcount_changed(self, block_id: int, refcount: int) -> None:
        """Called after every incref/decref so the evictor can track evictability in O(1)."""
        ...


class BlockAllocator:
    """Hands out block ids ``0..num_blocks-1`` with reference counts."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._refcount: list[int] = [0] * num_blocks
        self._evictor: Evictor | None = None

    # -- configuration -----------------------------------------------------

    def set_evictor(self, evictor: Evictor | None) -> None:
        """Register the cache that allocate() may ask to give blocks back (at most one)."""
        if evictor is not None and self._evictor is not None and evictor is not self._evictor:
            raise ValueError("this allocator already has an evictor (one prefix cache per pool)")
        self._evictor = evictor

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_free(self) -> int:
        """Blocks on the free list (refcount 0); excludes evictable cached blocks."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        """Blocks with refcount >= 1, including those held only by the prefix cache."""
        return self._num_blocks - len(self._free)

    @property
    def num_available(self) -> int:
        """Blocks an allocation can get: free plus evictable cached blocks."""
        evictable = self._evictor.num_evictable if self._evictor is not None else 0
        return len(self._free) + evictable

    # -- reference counting ------------------------------------------------

    def allocate(self) -> int:
        """Take one block (refcount 1), evicting a cached idle block if the free list is empty."""
        if not self._free and (self._evictor is None or not self._evictor.evict_one()):
            raise OutOfBlocks(1, 0, self._num_blocks)
        if not self._free:  # an evictor that claims success but frees nothing is a bug
            raise AssertionError("evictor reported an eviction but no block was freed")
        block_id = self._free.popleft()
        self._refcount[block_id] = 1
        return block_id

    def allocate_many(self, n: int) -> list[int]:
        """Take n blocks, all or nothing: raises OutOfBlocks before changing anything."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        available = self.num_available
        if n > available:
            raise OutOfBlocks(n, available, self._num_blocks)
        return [self.allocate() for _ in range(n)]

    def incref(self, block_id: int) -> int:
        """Add a reference to an allocated block; returns the new count."""
        self._check_allocated(block_id, "incref")
        rc = self._refcount[block_id] + 1
        self._refcount[block_id] = rc
        if self._evictor is not None:
            self._evictor.refcount_changed(block_id, rc)
        return rc

    def decref(self, block_id: int) -> int:
        """Drop a reference; at 0 the block returns to the free list. Returns the new count."""
        self._check_allocated(block_id, "decref")
        rc = self._refcount[block_id] - 1
        self._refcount[block_id] = rc
        if rc == 0:
            self._free.append(block_id)
        if self._evictor is not None:
            self._evictor.refcount_changed(block_id, rc)
        return rc

    def refcount(self, block_id: int) -> int:
        self._check_id(block_id)
        return self._refcount[block_id]

    # -- validation --------------------------------------------------------

    def _check_id(self, block_id: int) -> None:
        # Explicit range check: a negative index into a list would silently hit another block.
        if not isinstance(block_id, int) or not 0 <= block_id < self._num_blocks:
            raise ValueError(f"block id {block_id!r} out of range [0, {self._num_blocks})")

    def _check_allocated(self, block_id: int, verb: str) -> None:
        self._check_id(block_id)
        if self._refcount[block_id] == 0:
            raise ValueError(f"{verb} of free block {block_id} (double free or use after free)")

    def check_consistency(self) -> None:
        """Assert the free list is exactly the set of refcount-0 blocks (for tests)."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("free list holds a block twice")
        zero = {b for b, rc in enumerate(self._refcount) if rc == 0}
        if free != zero:
            raise AssertionError(
                f"free list and refcounts disagree: free-but-referenced={sorted(free - zero)}, "
                f"unreferenced-but-not-free={sorted(zero - free)}"
            )
        if any(rc < 0 for rc in self._refcount):
            raise AssertionError("negative refcount")
