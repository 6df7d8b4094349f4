"""KVManager: block tables, rollback, fork/COW, prefix reuse, and a randomized model check."""

from __future__ import annotations

import random

import pytest

from draftgate.kv import BlockCopy, KVManager, OutOfBlocks

BS = 4


def written(kv: KVManager, seq_id: int, tokens: list[int]) -> None:
    """Append KV for tokens[length:] and commit the whole history, as the runner would."""
    n = len(tokens) - kv.length(seq_id)
    kv.append_slots(seq_id, n)
    kv.commit(seq_id, tokens)


def test_append_slots_maps_positions_to_blocks() -> None:
    kv = KVManager(num_blocks=8, block_size=BS)
    assert kv.add_sequence(1, [5, 6, 7]) == 0
    slots, copies = kv.append_slots(1, 6)
    table = kv.block_table(1)
    assert copies == [] and len(table) == 2 and kv.length(1) == 6
    assert slots == [table[t // BS] * BS + t % BS for t in range(6)]
    assert kv.slot_mapping(1) == slots
    more, _ = kv.append_slots(1, 1)
    assert more == [table[1] * BS + 2]
    assert kv.append_slots(1, 0) == ([], [])
    assert kv.num_used_blocks == 2 and kv.num_free_blocks == 6


def test_out_of_blocks_changes_nothing() -> None:
    kv = KVManager(num_blocks=3, block_size=BS, enable_prefix_cache=False)
    kv.add_sequence(1, [1])
    kv.append_slots(1, 5)
    before = (kv.block_table(1), kv.slot_mapping(1), kv.length(1), kv.num_free_blocks)
    assert kv.blocks_needed(1, 8) == 2
    with pytest.raises(OutOfBlocks) as exc:
        kv.append_slots(1, 8)
    assert exc.value.needed == 2 and exc.value.available == 1
    assert (kv.block_table(1), kv.slot_mapping(1), kv.length(1), kv.num_free_blocks) == before
    kv.append_slots(1, 7)  # exactly fits
    assert kv.num_free_blocks == 0


@pytest.mark.parametrize(("n", "blocks_left"), [(6, 2), (5, 2), (4, 1), (1, 1), (0, 0), (10, 3)])
def test_truncate(n: int, blocks_left: int) -> None:
    kv = KVManager(num_blocks=4, block_size=BS)
    kv.add_sequence(1, [1])
    slots, _ = kv.append_slots(1, 10)
    kv.truncate(1, n)
    assert kv.length(1) == n and len(kv.block_table(1)) == blocks_left
    assert kv.slot_mapping(1) == slots[:n] and kv.num_free_blocks == 4 - blocks_left
    # Writes resume in place: an unshared partial block needs no copy.
    again, copies = kv.append_slots(1, 10 - n)
    assert copies == [] and kv.slot_mapping(1)[:n] == slots[:n] and len(again) == 10 - n
    kv.free(1)
    kv.check_no_leaks()


def test_truncate_beyond_length_raises() -> None:
    kv = KVManager(num_blocks=4, block_size=BS)
    kv.add_sequence(1, [1])
    kv.append_slots(1, 3)
    with pytest.raises(ValueError):
        kv.truncate(1, 4)
    with pytest.raises(ValueError):
        kv.truncate(1, -1)


def test_fork_then_copy_on_write_on_both_sides() -> None:
    kv = KVManager(num_blocks=8, block_size=BS, enable_prefix_cache=False)
    kv.add_sequence(1, [1])
    kv.append_slots(1, 6)  # blocks: one full, one half
    kv.fork(1, 2)
    shared = kv.block_table(1)
    assert kv.block_table(2) == shared and kv.slot_mapping(2) == kv.slot_mapping(1)

    slots1, copies1 = kv.append_slots(1, 1)  # parent writes first: it copies
    new1 = kv.block_table(1)[1]
    assert copies1 == [BlockCopy(src=shared[1], dst=new1)]
    assert kv.block_table(1)[0] == shared[0] and slots1 == [new1 * BS + 2]
    assert kv.slot_mapping(1)[4:6] == [new1 * BS, new1 * BS + 1]

    slots2, copies2 = kv.append_slots(2, 1)  # child now owns the original alone: no copy
    assert copies2 == [] and slots2 == [shared[1] * BS + 2]

    kv.truncate(2, 5)
    kv.fork(2, 3)
    _, c2 = kv.append_slots(2, 1)
    _, c3 = kv.append_slots(3, 1)
    assert len(c2) == 1 and c3 == []  # first writer copies, the last owner writes in place
    for s in (1, 2, 3):
        kv.free(s)
    kv.check_no_leaks()


def test_prefix_cache_hit_shares_blocks() -> None:
    kv = KVManager(num_blocks=8, block_size=BS)
    prompt = list(range(10))
    assert kv.add_sequence(1, prompt) == 0
    written(kv, 1, prompt)
    assert kv.stats()["cached_blocks"] == 2  # the half-filled third block is not cached
    assert kv.add_sequence(2, prompt) == 8
    assert kv.block_table(2) == kv.block_table(1)[:2] and kv.length(2) == 8
    _, copies = kv.append_slots(2, 2)
    assert copies == [] and kv.block_table(2)[2] != kv.block_table(1)[2]
    assert kv.stats()["prefix_hit_tokens"] == 8


@pytest.mark.parametrize(("prompt_len", "hit"), [(8, 4), (9, 8), (7, 4), (4, 0), (1, 0)])
def test_last_prompt_token_is_never_served_from_cache(prompt_len: int, hit: int) -> None:
    kv = KVManager(num_blocks=8, block_size=BS)
    history = list(range(12))
    kv.add_sequence(1, history)
    written(kv, 1, history)
    assert kv.add_sequence(2, history[:prompt_len]) == hit


def test_rollback_then_diverge_caches_the_new_branch_only() -> None:
    kv = KVManager(num_blocks=8, block_size=BS)
    kv.add_sequence(1, [1])
    written(kv, 1, [1, 1, 1, 1, 2, 2, 2, 2])
    kv.truncate(1, 4)  # reject the second block
    written(kv, 1, [1, 1, 1, 1, 3, 3, 3, 3, 4, 4, 4, 4])
    kv.free(1)
    assert kv.add_sequence(2, [1, 1, 1, 1, 3, 3, 3, 3, 4, 4, 4, 4, 0]) == 12
    # The old branch's block is still cached, but [4]*4 was only ever written after [3]*4.
    assert kv.add_sequence(3, [1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4, 0]) == 8


def test_partial_block_is_not_cached_until_full() -> None:
    kv = KVManager(num_blocks=8, block_size=BS)
    kv.add_sequence(1, [1, 2, 3])
    written(kv, 1, [1, 2, 3])
    assert kv.stats()["cached_blocks"] == 0
    written(kv, 1, [1, 2, 3, 4, 5])
    assert kv.stats()["cached_blocks"] == 1
    with pytest.raises(ValueError, match="only 5 slots"):
        kv.commit(1, [1, 2, 3, 4, 5, 6])


def test_write_into_cached_partial_block_copies() -> None:
    kv = KVManager(num_blocks=8, block_size=BS)
    kv.add_sequence(1, [1])
    written(kv, 1, [1, 2, 3, 4, 5])
    cached = kv.block_table(1)[0]
    kv.truncate(1, 2)  # rollback into a cached block
    _, copies = kv.append_slots(1, 1)
    assert copies == [BlockCopy(src=cached, dst=kv.block_table(1)[0])]
    kv.commit(1, [1, 2, 9])
    kv.free(1)
    assert kv.add_sequence(2, [1, 2, 3, 4, 5]) == 4  # the cached block kept its contents
    assert kv.block_table(2) == [cached]
    kv.free(2)
    kv.check_no_leaks()


def test_eviction_lets_new_sequences_in_and_spares_referenced_blocks() -> None:
    kv = KVManager(num_blocks=4, block_size=BS)
    kv.add_sequence(1, [1])
    written(kv, 1, [1, 1, 1, 1, 2, 2, 2, 2])
    kv.add_sequence(2, [3])
    written(kv, 2, [3, 3, 3, 3, 4, 4, 4, 4])
    kv.free(1)  # its blocks stay cached, held only by the cache
    assert kv.num_free_blocks == 0 and kv.num_available_blocks == 2
    kv.add_sequence(3, [5])
    kv.append_slots(3, 8)  # evicts seq 1's idle cached blocks, never seq 2's
    assert kv.stats()["cached_blocks"] == 2 and kv.stats()["evictable_blocks"] == 0
    kv.free(3)
    assert kv.add_sequence(4, [1, 1, 1, 1, 2]) == 0
    assert kv.add_sequence(5, [3, 3, 3, 3, 4]) == 4
    for s in (2, 4, 5):
        kv.free(s)
    kv.check_no_leaks()


def test_referenced_cached_blocks_survive_pressure() -> None:
    kv = KVManager(num_blocks=3, block_size=BS)
    kv.add_sequence(1, [1])
    written(kv, 1, [1, 1, 1, 1, 2, 2, 2, 2])
    kv.add_sequence(2, [0])
    with pytest.raises(OutOfBlocks):
        kv.append_slots(2, 8)
    assert kv.stats()["cached_blocks"] == 2 and kv.length(2) == 0


def test_free_unknown_and_double_free_raise() -> None:
    kv = KVManager(num_blocks=2, block_size=BS)
    with pytest.raises(KeyError):
        kv.free(7)
    kv.add_sequence(1, [1])
    kv.free(1)
    with pytest.raises(KeyError):
        kv.free(1)
    with pytest.raises(ValueError):
        kv.add_sequence(2, [])
    kv.add_sequence(2, [1])
    with pytest.raises(ValueError, match="already exists"):
        kv.add_sequence(2, [1])


def test_check_no_leaks_reports_live_sequences() -> None:
    kv = KVManager(num_blocks=2, block_size=BS)
    kv.add_sequence(9, [1])
    kv.append_slots(9, 1)
    with pytest.raises(AssertionError, match="sequences still registered"):
        kv.check_no_leaks()


def test_clear_prefix_cache_then_recommit() -> None:
    kv = KVManager(num_blocks=4, block_size=BS)
    kv.add_sequence(1, [1])
    written(kv, 1, [1, 2, 3, 4, 5])
    assert kv.clear_prefix_cache() == 1
    assert kv.stats()["cached_blocks"] == 0
    kv.commit(1, [1, 2, 3, 4, 5])
    assert kv.stats()["cached_blocks"] == 1
    kv.free(1)
    kv.check_no_leaks()


# -- randomized model check ---------------------------------------------------------


def content(tokens: list[int], t: int) -> tuple[int, ...]:
    """What the KV at position t 'is': a function of the whole prefix, like attention KV."""
    return tuple(tokens[: t + 1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_ops_against_reference_model(seed: int) -> None:
    rng = random.Random(seed)
    kv = KVManager(num_blocks=40, block_size=BS)
    mem: list[tuple[int, ...] | None] = [None] * (40 * BS)  # the fake KV tensor, by flat slot
    ref: dict[int, list[int]] = {}  # seq id -> tokens whose KV is written
    prefixes = [[rng.randrange(3) for _ in range(rng.randrange(1, 14))] for _ in range(4)]
    next_id = 0

    def write(seq_id: int, new_tokens: list[int]) -> bool:
        try:
            slots, copies = kv.append_slots(seq_id, len(new_tokens))
        except OutOfBlocks:
            return False
        for c in copies:
            mem[c.dst * BS : (c.dst + 1) * BS] = mem[c.src * BS : (c.src + 1) * BS]
        start = len(ref[seq_id])
        ref[seq_id].extend(new_tokens)
        for i, s in enumerate(slots):
            # A write must land in a block this sequence owns alone.
            assert kv._alloc.refcount(s // BS) == 1
            mem[s] = content(ref[seq_id], start + i)
        kv.commit(seq_id, ref[seq_id])
        return True

    for _ in range(1500):
        op = rng.random()
        live = sorted(ref)
        if op < 0.2 or not live:
            # Shared system prompts, or a live conversation continued (multi-turn reuse).
            base = rng.choice(prefixes) if rng.random() < 0.5 or not live else ref[rng.choice(live)]
            prompt = base + [rng.randrange(3) for _ in range(rng.randrange(1 if not base else 0, 6))]
            sid, next_id = next_id, next_id + 1
            hit = kv.add_sequence(sid, prompt)
            assert hit % BS == 0 and hit <= len(prompt) - 1
            ref[sid] = list(prompt[:hit])
            if not write(sid, prompt[hit:]):
                kv.free(sid)
                del ref[sid]
        elif op < 0.55:
            sid = rng.choice(live)
            before = (kv.block_table(sid), kv.length(sid), kv.num_free_blocks)
            if not write(sid, [rng.randrange(3) for _ in range(rng.randrange(1, 6))]):
                assert (kv.block_table(sid), kv.length(sid), kv.num_free_blocks) == before
                victim = rng.choice(live)  # preempt someone, as a scheduler would
                kv.free(victim)
                del ref[victim]
        elif op < 0.75:
            sid = rng.choice(live)
            n = rng.randrange(0, len(ref[sid]) + 1)
            kv.truncate(sid, n)
            del ref[sid][n:]
        elif op < 0.85:
            parent = rng.choice(live)
            sid, next_id = next_id, next_id + 1
            kv.fork(parent, sid)
            ref[sid] = list(ref[parent])
        else:
            sid = rng.choice(live)
            kv.free(sid)
            del ref[sid]

        # Every live sequence still reads exactly its own history.
        for sid, tokens in ref.items():
            slots = kv.slot_mapping(sid)
            table = kv.block_table(sid)
            assert kv.length(sid) == len(tokens) and len(table) == -(-len(tokens) // BS)
            assert slots == [table[t // BS] * BS + t % BS for t in range(len(tokens))]
            assert [mem[s] for s in slots] == [content(tokens, t) for t in range(len(tokens))]
        assert kv.num_sequences == len(ref)

    stats = kv.stats()
    assert stats["prefix_hit_tokens"] > 0
    for sid in list(ref):
        kv.free(sid)
    kv.check_no_leaks()
