"""The torch forward's index tensors (AttentionLayout), built from block tables, against their definition.

``AttentionLayout.build`` computes the flat KV slots from each sequence's block table with tensor
arithmetic (no Python work per context token); the reference here walks every position through
``RaggedBatch.slots``, the batch's own definition of where position t lives.
"""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from draftgate.models.batch import RaggedBatch
from draftgate.models.llama import AttentionLayout

CPU = torch.device("cpu")


@st.composite
def batches(draw: st.DrawFn) -> RaggedBatch:
    bs = draw(st.sampled_from([1, 4, 16]))
    B = draw(st.integers(1, 5))
    rng = random.Random(draw(st.integers(0, 2**16)))
    free = list(range(64 * B))
    contiguous = draw(st.booleans())
    if not contiguous:
        rng.shuffle(free)
    new_lens, ctx_lens, tables = [], [], []
    for _ in range(B):
        n = draw(st.integers(1, 6))
        S = n + draw(st.integers(0, 40))
        spare = draw(st.integers(0, 2))  # a table may hold blocks beyond the sequence's length
        nb = (S + bs - 1) // bs + spare
        tables.append([free.pop(0) for _ in range(nb)])
        new_lens.append(n)
        ctx_lens.append(S)
    return RaggedBatch(
        tokens=[1] * sum(new_lens),
        new_lens=new_lens,
        ctx_lens=ctx_lens,
        logits_per_seq=[draw(st.integers(1, n)) for n in new_lens],
        block_tables=tables,
        block_size=bs,
    )


@settings(max_examples=200, deadline=None)
@given(batches())
def test_layout_matches_slot_by_slot_definition(batch: RaggedBatch) -> None:
    lay = AttentionLayout.build(batch, CPU)
    slots = [batch.slots(b) for b in range(len(batch.new_lens))]
    want_write = [s for sl, n in zip(slots, batch.new_lens, strict=True) for s in sl[len(sl) - n :]]
    assert lay.write_slots.tolist() == want_write
    assert lay.positions.tolist() == batch.positions()
    assert lay.logit_rows.tolist() == batch.logit_rows()
    S_max = max(batch.ctx_lens)
    assert tuple(lay.kv_gather.shape) == (len(slots), S_max)
    for b, sl in enumerate(slots):  # past a sequence's length the entries are masked: any slot will do
        assert lay.kv_gather[b, : len(sl)].tolist() == sl
    if len(slots) == 1:
        contiguous = slots[0] == list(range(slots[0][0], slots[0][0] + len(slots[0])))
        assert lay.kv_span == ((slots[0][0], slots[0][0] + S_max) if contiguous else None)
    if lay.mask is not None:
        for b, (n, S) in enumerate(zip(batch.new_lens, batch.ctx_lens, strict=True)):
            for t in range(n):  # row t attends positions 0 .. S - n + t of its own sequence
                row = lay.mask[b, 0, t].tolist()
                assert row == [k <= S - n + t for k in range(S_max)]
