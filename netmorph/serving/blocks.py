"""The KV-cache block manager, in vLLM's vocabulary (Kwon et al. 2023, PagedAttention).

The GPU's KV cache is a pool of fixed-size **blocks** of ``block_size`` token slots,
as an OS pages memory. Each sequence has a **block table**: its logical blocks in
order -> physical block numbers; a block is allocated only when the sequence's next
token needs a slot, so at most one partly filled block per sequence is wasted. Blocks
carry **reference counts**: sequences that share a prefix share its physical blocks
(parallel sampling: ``fork`` gives the n samples the prompt's blocks), and the first
write into a shared block copies it (**copy-on-write**, exactly one block).

**Prefix caching** is vLLM's automatic prefix caching: a full block is named by a
*chained* hash -- its parent block's hash and its own tokens, ``hash((parent, tokens))``
-- so equal hashes mean equal prefixes. A block whose last user finishes goes back to
the pool still holding its hash: it is *evictable*, not erased, and a later request with
the same prefix takes it back (``cached_prefix``), alive or not at the same time as the
first. The pool hands out plain free blocks first and evicts cached ones oldest-freed
first (vLLM's ``FreeKVCacheBlockQueue``, LRU), dropping the hash when it does. When the pool runs out the scheduler preempts a sequence:
**swap** moves its blocks to a host pool (bytes counted both ways) or **recompute**
frees them and prefills again later.

``contiguous=True`` is the pre-vLLM practice for comparison: a sequence reserves, at
admission, blocks for the model's whole context (the maximum length it might reach).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


class NoFreeBlocks(Exception):
    """The pool cannot supply a block: the scheduler must preempt."""


@dataclass
class Table:
    blocks: list = field(default_factory=list)  # physical block numbers, in logical order
    tokens: int = 0  # slots filled


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, max_context: int, contiguous: bool = False, prefix_caching: bool = True
    ):
        self.num_blocks, self.block_size, self.max_context = num_blocks, block_size, max_context
        self.contiguous, self.prefix_caching = contiguous, prefix_caching and not contiguous
        # free blocks: pop() takes from the right; plain ones are pushed right (handed out first, block 0 first),
        # cached ones left (evicted last, the oldest-freed first)
        self.free = deque(range(num_blocks - 1, -1, -1))
        self.ref = [0] * num_blocks
        self.tables: dict = {}  # seq id -> Table
        self.by_hash: dict = {}  # chained hash -> block (full blocks only)
        self.hash_of: dict = {}  # block -> its chained hash
        self.copies = []  # (src, dst) copy-on-write copies to apply
        self.cow_copies = 0

    # -- accounting ---------------------------------------------------------------------------------------
    def num_free(self) -> int:
        return len(self.free)

    def used_slots(self) -> int:
        """Slots holding a token, counting a shared block once."""
        seen, n = set(), 0
        for t in self.tables.values():
            for k, b in enumerate(t.blocks):
                if b not in seen:
                    seen.add(b)
                    n += min(self.block_size, max(0, t.tokens - k * self.block_size))
        return n

    def reserved_slots(self) -> int:
        return (self.num_blocks - len(self.free)) * self.block_size

    def blocks_needed(self, tokens: int) -> int:
        if self.contiguous:
            return -(-self.max_context // self.block_size)
        return -(-tokens // self.block_size)

    # -- allocation ---------------------------------------------------------------------------------------
    def _take(self) -> int:
        if not self.free:
            raise NoFreeBlocks
        b = self.free.pop()
        h = self.hash_of.pop(b, None)  # a cached block evicted: its prefix is gone
        if h is not None and self.by_hash.get(h) == b:
            del self.by_hash[h]
        self.ref[b] = 1
        return b

    def _release(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] == 0:
            if b in self.hash_of:
                self.free.appendleft(b)  # evictable: its prefix can still be found
            else:
                self.free.append(b)

    def _revive(self, b: int) -> None:
        """A cached block found by its hash: one more user (back out of the free pool if it had none)."""
        if self.ref[b] == 0:
            self.free.remove(b)
        self.ref[b] += 1

    @staticmethod
    def chained_hash(parent, tokens) -> int:
        """vLLM's block hash: the parent block's hash and this block's tokens."""
        return hash((parent, tuple(tokens)))

    def blocks_to_grow(self, seq: int, n: int) -> int:
        """Blocks the pool must supply for the sequence's next ``n`` tokens: new blocks past its table, plus one
        copy if its partly filled last block is shared (the copy-on-write its first write will make)."""
        t = self.tables[seq]
        need = max(0, -(-(t.tokens + n) // self.block_size) - len(t.blocks))
        k = t.tokens // self.block_size
        if k < len(t.blocks) and self.ref[t.blocks[k]] > 1:
            need += 1
        return need

    def can_allocate(self, tokens: int, token_ids=None) -> bool:
        shared = self.cached_prefix(token_ids or [])
        idle = sum(1 for b in shared if self.ref[b] == 0)  # cached blocks that come out of the free pool
        return self.blocks_needed(tokens) - len(shared) + idle <= len(self.free)

    def cached_prefix(self, token_ids) -> list:
        """Physical blocks already holding this prompt's leading full blocks (prefix caching), in use or
        evictable. The last token is never served from cache: its logits must be computed."""
        if not self.prefix_caching:
            return []
        out, h, bs = [], None, self.block_size
        for k in range((len(token_ids) - 1) // bs):
            h = self.chained_hash(h, token_ids[k * bs : (k + 1) * bs])
            b = self.by_hash.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def allocate(self, seq: int, token_ids) -> int:
        """Blocks for a new sequence's prompt; returns how many leading tokens are already cached."""
        shared = self.cached_prefix(token_ids)
        need = self.blocks_needed(len(token_ids)) - len(shared)
        if need + sum(1 for b in shared if self.ref[b] == 0) > len(self.free):
            raise NoFreeBlocks
        for b in shared:
            self._revive(b)
        t = Table(list(shared) + [self._take() for _ in range(need)], len(shared) * self.block_size)
        self.tables[seq] = t
        return t.tokens

    def slot(self, seq: int, token_ids) -> tuple[int, int]:
        """The (block, offset) where the sequence's next token goes, allocating or copying-on-write as
        needed; ``token_ids`` holds the sequence at least up to that token (to register full blocks' hashes)."""
        t = self.tables[seq]
        k, off = divmod(t.tokens, self.block_size)
        if k == len(t.blocks):
            t.blocks.append(self._take())
        b = t.blocks[k]
        if self.ref[b] > 1:  # shared: copy before the first write
            new = self._take()
            self.copies.append((b, new))
            self.cow_copies += 1
            self.ref[b] -= 1
            t.blocks[k] = b = new
        t.tokens += 1
        if self.prefix_caching and off == self.block_size - 1:  # the block just filled: cache it
            h = None
            for j in range(k + 1):  # the chain up to this block
                h = self.chained_hash(h, token_ids[j * self.block_size : (j + 1) * self.block_size])
            if h not in self.by_hash:
                self.by_hash[h], self.hash_of[b] = b, h
        return b, off

    def fork(self, parent: int, child: int) -> None:
        """Parallel sampling: the child shares every block of the parent."""
        t = self.tables[parent]
        for b in t.blocks:
            self.ref[b] += 1
        self.tables[child] = Table(list(t.blocks), t.tokens)

    def free_seq(self, seq: int) -> None:
        for b in self.tables.pop(seq).blocks:
            self._release(b)

    # -- swapping -----------------------------------------------------------------------------------------
    def swap_out(self, seq: int) -> list:
        """Give the sequence's blocks back to the pool; returns them (the caller copies their contents to the
        host first). Shared blocks stay for their other users."""
        t = self.tables[seq]
        blocks = list(t.blocks)
        for b in blocks:
            self._release(b)
        t.blocks = []
        return blocks

    def swap_in(self, seq: int, n: int) -> list:
        """Fresh blocks for a swapped-out sequence's ``n`` blocks (the caller copies the contents back)."""
        if n > len(self.free):
            raise NoFreeBlocks
        t = self.tables[seq]
        t.blocks = [self._take() for _ in range(n)]
        return t.blocks
