"""Per-sequence block tables on top of the allocator and the prefix cache.

Token position ``t`` of a sequence lives in flat slot
``block_table[t // block_size] * block_size + t % block_size`` of the runner's
KV tensors ``[num_blocks, block_size, ...]``. This module hands out slots; the
runner writes them. Invariant per sequence: ``len(block_table) ==
ceil(length / block_size)``.

Copy-on-write: a block with refcount > 1 (shared after ``fork``, or cached) is
read-only. ``append_slots`` into a shared partially filled last block first
moves the sequence to a fresh block and returns a ``BlockCopy`` that the runner
must apply before it writes any KV of the step. Apply the copies in the order
returned (or all at once, gather then scatter): a copy's source may be freed by
that same call and handed out as a later copy's destination.

Rollback is ``truncate(seq_id, n)``: positions >= n are forgotten, their KV is
garbage that later appends overwrite.

Prefix-cache rule (the "last token" rule): ``add_sequence`` never reuses the
cached KV of the whole prompt. At most ``len(tokens) - 1`` tokens, rounded down
to a full block, come from the cache, because the model must run on at least
the last prompt token to produce the logits for the first new token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from draftgate.kv.blocks import BlockAllocator
from draftgate.kv.prefix import ROOT_HASH, BlockHash, PrefixCache

__all__ = ["BlockCopy", "KVManager"]


@dataclass(frozen=True)
class BlockCopy:
    """Copy all ``block_size`` slots of block ``src`` into block ``dst`` before writing."""

    src: int
    dst: int


@dataclass
class _Seq:
    blocks: list[int] = field(default_factory=list)
    length: int = 0
    # Chained hashes of blocks[:len(hashes)]: full blocks already offered to the cache.
    hashes: list[BlockHash] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # slot of each position 0..length-1


class KVManager:
    """Block tables, rollback, fork and prefix reuse for many sequences (no tensors)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True) -> None:
        self._alloc = BlockAllocator(num_blocks, block_size)
        self._bs = block_size
        self._cache: PrefixCache | None = PrefixCache(self._alloc) if enable_prefix_cache else None
        self._seqs: dict[int, _Seq] = {}
        self._prefix_query_tokens = 0
        self._prefix_hit_tokens = 0

    # -- lifecycle -----------------------------------------------------------

    def add_sequence(self, seq_id: int, tokens: Sequence[int]) -> int:
        """Register a prompt; returns how many leading tokens already have KV (from the cache).

        The result is a multiple of block_size and at most ``len(tokens) - 1``.
        The sequence's length is that number; the caller appends the rest.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already exists")
        if len(tokens) == 0:
            raise ValueError("a prompt needs at least one token")
        seq = _Seq()
        if self._cache is not None:
            ids, hashes = self._cache.match(tokens, max_blocks=(len(tokens) - 1) // self._bs)
            seq.blocks, seq.hashes = ids, hashes
            seq.length = len(ids) * self._bs
            seq.slots = self._slots_of(ids, 0, seq.length)
            self._prefix_query_tokens += len(tokens)
            self._prefix_hit_tokens += seq.length
        self._seqs[seq_id] = seq
        return seq.length

    def fork(self, parent_id: int, child_id: int) -> None:
        """Child shares every parent block; whichever writes a shared partial block first copies it."""
        parent = self._get(parent_id)
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id} already exists")
        for b in parent.blocks:
            self._alloc.incref(b)
        self._seqs[child_id] = _Seq(list(parent.blocks), parent.length, list(parent.hashes), list(parent.slots))

    def free(self, seq_id: int) -> None:
        """Release all blocks of a sequence. Unknown ids raise KeyError: a double free is a bug."""
        seq = self._get(seq_id)
        self._release(seq.blocks)
        del self._seqs[seq_id]

    # -- writing and rollback -----------------------------------------------

    def blocks_needed(self, seq_id: int, n: int) -> int:
        """New blocks ``append_slots(seq_id, n)`` would take (for admission decisions)."""
        seq = self._get(seq_id)
        if n <= 0:
            return 0
        grow = -(-(seq.length + n) // self._bs) - len(seq.blocks)
        return grow + (1 if self._needs_cow(seq) else 0)

    def append_slots(self, seq_id: int, n: int) -> tuple[list[int], list[BlockCopy]]:
        """Reserve n positions at the end; returns their flat slots and copies to apply first.

        All or nothing: raises OutOfBlocks (nothing changed) if the blocks are not there.
        """
        if n < 0:
            raise ValueError(f"cannot append a negative number of slots ({n})")
        seq = self._get(seq_id)
        if n == 0:
            return [], []
        new = self._alloc.allocate_many(self.blocks_needed(seq_id, n))  # the only failure point
        copies: list[BlockCopy] = []
        start = seq.length
        if self._needs_cow(seq):
            src, dst = seq.blocks[-1], new.pop(0)
            copies.append(BlockCopy(src=src, dst=dst))
            seq.blocks[-1] = dst
            self._alloc.decref(src)
            kept = start % self._bs
            seq.slots[start - kept : start] = range(dst * self._bs, dst * self._bs + kept)
        seq.blocks.extend(new)
        slots = self._slots_of(seq.blocks, start, start + n)
        seq.slots.extend(slots)
        seq.length = start + n
        return slots, copies

    def commit(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Record the token ids whose KV is now written (history from position 0).

        Call after the forward pass that wrote them. Newly completed full blocks
        within ``tokens`` enter the prefix cache; a partial block never does.
        ``len(tokens)`` may be less than the length (e.g. the last sampled token
        has a slot but no KV yet) but not more.
        """
        seq = self._get(seq_id)
        if len(tokens) > seq.length:
            raise ValueError(f"commit of {len(tokens)} tokens but sequence {seq_id} has only {seq.length} slots")
        if self._cache is None:
            return
        bs = self._bs
        parent = seq.hashes[-1] if seq.hashes else ROOT_HASH
        for i in range(len(seq.hashes), len(tokens) // bs):
            parent = self._cache.insert(parent, tokens[i * bs : (i + 1) * bs], seq.blocks[i])
            seq.hashes.append(parent)

    def truncate(self, seq_id: int, n: int) -> None:
        """Rollback: keep positions 0..n-1. A kept partial block is reused (COW if shared)."""
        seq = self._get(seq_id)
        if not 0 <= n <= seq.length:
            raise ValueError(f"cannot truncate sequence {seq_id} of length {seq.length} to {n}")
        keep = -(-n // self._bs)
        self._release(seq.blocks[keep:])
        del seq.blocks[keep:]
        del seq.slots[n:]
        del seq.hashes[n // self._bs :]
        seq.length = n

    # -- queries ---------------------------------------------------------------

    def has(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def length(self, seq_id: int) -> int:
        return self._get(seq_id).length

    def slot_mapping(self, seq_id: int) -> list[int]:
        """Flat slots of positions 0..length-1 (a fresh list; maintained incrementally)."""
        return list(self._get(seq_id).slots)

    def block_table(self, seq_id: int) -> list[int]:
        return list(self._get(seq_id).blocks)

    @property
    def block_size(self) -> int:
        return self._bs

    @property
    def num_blocks(self) -> int:
        return self._alloc.num_blocks

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    @property
    def num_free_blocks(self) -> int:
        """Blocks on the free list (excludes evictable cached blocks)."""
        return self._alloc.num_free

    @property
    def num_available_blocks(self) -> int:
        """Blocks an allocation can get: free plus evictable cached blocks."""
        return self._alloc.num_available

    @property
    def num_used_blocks(self) -> int:
        """Blocks with any reference, including those held only by the prefix cache."""
        return self._alloc.num_used

    def clear_prefix_cache(self) -> int:
        """Drop all cache references (e.g. after weights change); returns blocks uncached."""
        if self._cache is None:
            return 0
        for seq in self._seqs.values():
            seq.hashes.clear()  # so the next commit offers their full blocks to the cache again
        return self._cache.clear()

    def stats(self) -> dict[str, int]:
        """Counters and gauges for metrics sinks."""
        return {
            "num_blocks": self._alloc.num_blocks,
            "block_size": self._bs,
            "free_blocks": self._alloc.num_free,
            "used_blocks": self._alloc.num_used,
            "cached_blocks": self._cache.num_cached if self._cache else 0,
            "evictable_blocks": self._cache.num_evictable if self._cache else 0,
            "sequences": len(self._seqs),
            "prefix_query_tokens": self._prefix_query_tokens,
            "prefix_hit_tokens": self._prefix_hit_tokens,
        }

    def check_no_leaks(self) -> None:
        """Assert no sequence is registered and every block is free or held only by the cache."""
        self._alloc.check_consistency()
        problems: list[str] = []
        if self._seqs:
            problems.append(f"sequences still registered: {sorted(self._seqs)[:20]}")
        for b in range(self._alloc.num_blocks):
            rc = self._alloc.refcount(b)
            cached = self._cache is not None and self._cache.is_cached(b)
            if rc != 0 and not (rc == 1 and cached):
                problems.append(f"block {b}: refcount {rc}, cached={cached}")
        if problems:
            raise AssertionError("KV leak: " + "; ".join(problems[:20]))

    # -- internals ---------------------------------------------------------------

    def _get(self, seq_id: int) -> _Seq:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise KeyError(f"unknown sequence {seq_id}") from None

    def _needs_cow(self, seq: _Seq) -> bool:
        return seq.length % self._bs != 0 and self._alloc.refcount(seq.blocks[-1]) > 1

    def _release(self, blocks: list[int]) -> None:
        # Tail first: deeper blocks become evictable earlier, and a cached child is
        # useless once its parent is gone, so LRU evicts from the tail of a prefix.
        for b in reversed(blocks):
            self._alloc.decref(b)

    def _slots_of(self, blocks: list[int], start: int, stop: int) -> list[int]:
        bs = self._bs
        return [blocks[t // bs] * bs + t % bs for t in range(start, stop)]
