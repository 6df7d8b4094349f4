"""Paged-KV bookkeeping: block allocator, prefix cache, per-sequence block tables.

Plain Python, no tensors: the model runner owns KV tensors shaped
``[num_blocks, block_size, ...]`` and addresses them by flat slot
``block_id * block_size + offset``, which this package hands out.
"""

from draftgate.kv.blocks import BlockAllocator, Evictor, OutOfBlocks
from draftgate.kv.manager import BlockCopy, KVManager
from draftgate.kv.prefix import ROOT_HASH, BlockHash, PrefixCache, block_hash

__all__ = [
    "ROOT_HASH",
    "BlockAllocator",
    "BlockCopy",
    "BlockHash",
    "Evictor",
    "KVManager",
    "OutOfBlocks",
    "PrefixCache",
    "block_hash",
]
