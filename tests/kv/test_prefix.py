"""PrefixCache: chained full-block hashes, reference ownership, LRU eviction."""

from __future__ import annotations

import pytest

from draftgate.kv import ROOT_HASH, BlockAllocator, OutOfBlocks, PrefixCache, block_hash

BS = 4


def make(num_blocks: int = 8) -> tuple[BlockAllocator, PrefixCache]:
    a = BlockAllocator(num_blocks, BS)
    return a, PrefixCache(a)


def cache_run(a: BlockAllocator, c: PrefixCache, tokens: list[int]) -> list[int]:
    """Allocate and cache the full blocks of ``tokens`` as a sequence would; returns block ids."""
    parent = ROOT_HASH
    blocks = []
    for i in range(len(tokens) // BS):
        b = a.allocate()
        parent = c.insert(parent, tokens[i * BS : (i + 1) * BS], b)
        blocks.append(b)
    return blocks


def release(a: BlockAllocator, blocks: list[int]) -> None:
    for b in reversed(blocks):
        a.decref(b)


def test_hash_is_chained_and_content_based() -> None:
    h1 = block_hash(ROOT_HASH, [1, 2, 3, 4])
    assert h1 == block_hash(ROOT_HASH, (1, 2, 3, 4))
    assert h1 != block_hash(ROOT_HASH, [1, 2, 3, 5])
    assert block_hash(h1, [5, 6, 7, 8]) != block_hash(ROOT_HASH, [5, 6, 7, 8])


def test_hit_returns_shared_blocks_and_caller_owns_a_reference() -> None:
    a, c = make()
    blocks = cache_run(a, c, list(range(8)))
    assert [a.refcount(b) for b in blocks] == [2, 2]  # sequence + cache
    release(a, blocks)
    assert c.num_cached == 2 and c.num_evictable == 2
    hit = c.lookup(list(range(10)))
    assert hit == blocks
    assert [a.refcount(b) for b in hit] == [2, 2] and c.num_evictable == 0
    release(a, hit)
    assert c.num_evictable == 2


def test_lookup_stops_at_first_miss_and_respects_max_blocks() -> None:
    a, c = make()
    blocks = cache_run(a, c, list(range(12)))
    release(a, blocks)
    assert c.lookup([0, 1, 2, 3, 9, 9, 9, 9, 8, 9, 10, 11]) == blocks[:1]
    release(a, blocks[:1])
    assert c.lookup(list(range(12)), max_blocks=2) == blocks[:2]
    release(a, blocks[:2])
    assert c.lookup(list(range(12)), max_blocks=0) == []
    assert c.lookup([0, 1, 2]) == []  # a partial block never matches
    assert c.lookup([9, 1, 2, 3, 4, 5, 6, 7]) == []  # same block 2 content, different parent
    assert c.num_evictable == 3


def test_partial_block_is_never_cached() -> None:
    a, c = make()
    b = a.allocate()
    with pytest.raises(ValueError, match="only full blocks"):
        c.insert(ROOT_HASH, [1, 2, 3], b)
    assert c.num_cached == 0 and a.refcount(b) == 1


def test_duplicate_content_keeps_first_block() -> None:
    a, c = make()
    first = cache_run(a, c, [1, 2, 3, 4])
    second = cache_run(a, c, [1, 2, 3, 4])
    assert c.num_cached == 1 and a.refcount(second[0]) == 1
    assert c.insert(ROOT_HASH, [1, 2, 3, 4], first[0]) == block_hash(ROOT_HASH, [1, 2, 3, 4])
    assert a.refcount(first[0]) == 2  # re-inserting the same block takes no extra reference
    with pytest.raises(ValueError, match="different contents"):
        c.insert(ROOT_HASH, [9, 9, 9, 9], first[0])


def test_lru_eviction_when_allocator_runs_dry() -> None:
    a, c = make(num_blocks=4)
    old = cache_run(a, c, [1, 1, 1, 1])
    new = cache_run(a, c, [2, 2, 2, 2])
    release(a, old)
    release(a, new)  # released after `old`: more recently used
    a.allocate_many(2)
    assert a.num_free == 0 and c.num_evictable == 2
    got = a.allocate()
    assert got == old[0] and c.num_cached == 1
    assert c.lookup([1, 1, 1, 1]) == []
    assert c.lookup([2, 2, 2, 2]) == new


def test_hit_refreshes_lru_position() -> None:
    a, c = make(num_blocks=2)
    x = cache_run(a, c, [1, 1, 1, 1])
    y = cache_run(a, c, [2, 2, 2, 2])
    release(a, x)
    release(a, y)
    release(a, c.lookup([1, 1, 1, 1]))  # x used again: now y is the oldest
    assert a.allocate() == y[0]


def test_referenced_cached_blocks_are_not_evicted() -> None:
    a, c = make(num_blocks=3)
    held = cache_run(a, c, [1, 1, 1, 1, 2, 2, 2, 2])  # a sequence still holds both
    a.allocate()
    with pytest.raises(OutOfBlocks):
        a.allocate()
    assert c.num_cached == 2 and [a.refcount(b) for b in held] == [2, 2]
    release(a, held[1:])
    assert a.allocate() == held[1]


def test_clear_drops_only_cache_references() -> None:
    a, c = make()
    held = cache_run(a, c, list(range(8)))
    release(a, held[1:])
    assert c.clear() == 2
    assert c.num_cached == 0 and c.num_evictable == 0
    assert a.refcount(held[0]) == 1 and a.refcount(held[1]) == 0
    assert c.lookup(list(range(8))) == []
    a.check_consistency()
