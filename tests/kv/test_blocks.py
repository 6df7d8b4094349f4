"""BlockAllocator: free list, reference counts, eviction hook, misuse errors."""

from __future__ import annotations

import pytest

from draftgate.kv import BlockAllocator, OutOfBlocks


class FakeEvictor:
    """Holds one reference to each block it is given; evicts them FIFO."""

    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        self.held: list[int] = []
        self.changes: list[tuple[int, int]] = []

    @property
    def num_evictable(self) -> int:
        return len(self.held)

    def evict_one(self) -> bool:
        if not self.held:
            return False
        self.allocator.decref(self.held.pop(0))
        return True

    def refcount_changed(self, block_id: int, refcount: int) -> None:
        self.changes.append((block_id, refcount))


def test_allocate_free_refcounts() -> None:
    a = BlockAllocator(num_blocks=4, block_size=16)
    assert (a.num_blocks, a.block_size, a.num_free, a.num_used) == (4, 16, 4, 0)
    b = a.allocate()
    assert a.refcount(b) == 1 and a.num_free == 3 and a.num_used == 1
    assert a.incref(b) == 2
    assert a.decref(b) == 1 and a.num_free == 3
    assert a.decref(b) == 0 and a.num_free == 4 and a.refcount(b) == 0
    a.check_consistency()


def test_all_blocks_distinct_then_out_of_blocks() -> None:
    a = BlockAllocator(3, 2)
    got = {a.allocate() for _ in range(3)}
    assert got == {0, 1, 2}
    with pytest.raises(OutOfBlocks) as exc:
        a.allocate()
    assert "--kv-blocks" in str(exc.value) and "concurrency" in str(exc.value)
    assert exc.value.needed == 1 and exc.value.available == 0 and exc.value.total == 3


def test_freed_block_is_reused_last() -> None:
    a = BlockAllocator(3, 1)
    first = a.allocate()
    a.decref(first)
    assert [a.allocate() for _ in range(3)][-1] == first


def test_allocate_many_is_all_or_nothing() -> None:
    a = BlockAllocator(4, 8)
    a.allocate()
    with pytest.raises(OutOfBlocks) as exc:
        a.allocate_many(4)
    assert (exc.value.needed, exc.value.available) == (4, 3)
    assert a.num_free == 3
    assert len(set(a.allocate_many(3))) == 3
    assert a.allocate_many(0) == []
    with pytest.raises(ValueError):
        a.allocate_many(-1)


@pytest.mark.parametrize("verb", ["incref", "decref"])
def test_misuse_of_free_block_raises(verb: str) -> None:
    a = BlockAllocator(2, 4)
    with pytest.raises(ValueError, match="free block"):
        getattr(a, verb)(0)
    b = a.allocate()
    a.decref(b)
    with pytest.raises(ValueError, match="double free"):
        a.decref(b)
    a.check_consistency()


@pytest.mark.parametrize("bad", [-1, 2, 99])
def test_out_of_range_ids_raise(bad: int) -> None:
    a = BlockAllocator(2, 4)
    a.allocate_many(2)
    for verb in ("incref", "decref", "refcount"):
        with pytest.raises(ValueError, match="out of range"):
            getattr(a, verb)(bad)


@pytest.mark.parametrize("args", [(0, 4), (4, 0), (-1, 4)])
def test_bad_geometry(args: tuple[int, int]) -> None:
    with pytest.raises(ValueError):
        BlockAllocator(*args)


def test_evictor_is_asked_only_when_free_list_is_empty() -> None:
    a = BlockAllocator(2, 4)
    ev = FakeEvictor(a)
    a.set_evictor(ev)
    x, y = a.allocate(), a.allocate()
    a.incref(x)
    ev.held.append(x)  # the evictor owns one of x's two references
    a.decref(x)  # caller lets go: x now held only by the evictor
    assert a.num_free == 0 and a.num_available == 1
    z = a.allocate()  # evicts x and reuses it
    assert z == x and ev.held == [] and a.refcount(z) == 1
    with pytest.raises(OutOfBlocks):
        a.allocate()
    assert (x, 2) in ev.changes and (x, 1) in ev.changes and (x, 0) in ev.changes
    del y


def test_allocate_many_counts_evictable() -> None:
    a = BlockAllocator(3, 4)
    ev = FakeEvictor(a)
    a.set_evictor(ev)
    ev.held.extend(a.allocate_many(2))
    assert a.num_available == 3
    assert len(a.allocate_many(3)) == 3 and ev.held == []


def test_only_one_evictor() -> None:
    a = BlockAllocator(2, 4)
    a.set_evictor(FakeEvictor(a))
    with pytest.raises(ValueError, match="already has an evictor"):
        a.set_evictor(FakeEvictor(a))
