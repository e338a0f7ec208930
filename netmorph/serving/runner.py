"""The model runner: carries a :class:`~netmorph.serving.scheduler.SchedulerOutput` out on the paged model.

vLLM's ``ModelRunner`` / ``Worker``: the blocks a preemption moved (out to a host pool, back in), the
copy-on-write copies, then one forward over every scheduled token, writing each new token's key and value into
the slot the scheduler chose and returning each sequence's last logits. It holds the KV cache and the host pool;
it decides nothing. The two roles of a disaggregated deployment (DistServe, Splitwise) are two runners: a
prefill runner reads a prompt's KV out (:meth:`read_kv`) and a decode runner writes it into its own pool
(:meth:`write_kv`).
"""

from __future__ import annotations

import torch

from netmorph.serving.model import PagedGPT
from netmorph.serving.scheduler import SchedulerOutput


class Runner:
    """``layers``: how the model's blocks are built (training's tensor-parallel layers for Megatron's split; see
    :class:`PagedGPT`); ``on_forward(items)``, when given, is told each iteration's work before it runs (the tp
    ranks tag their all-reduces by it)."""

    def __init__(self, model_cfg, num_blocks: int, block_size: int, layers=None, on_forward=None):
        # one intra-op thread, as its ranks under serve --tp / --disaggregate run (torchrun's OMP_NUM_THREADS=1):
        # this model's matmuls are too small to split, and an OpenMP pool spinning on every core of a busy
        # machine made one engine use 8-10x the CPU it needs
        torch.set_num_threads(1)
        self.model = PagedGPT(model_cfg, num_blocks, block_size, layers=layers)
        self.layers = model_cfg.layers
        self.host = {}  # request id -> its blocks' contents while swapped out
        self.on_forward = on_forward

    def bytes_per_block(self) -> int:
        return self.model.bytes_per_block()

    def forward(self, work: list) -> list:
        """[(tokens, first position, slots, block table)] -> each item's logits for its last token."""
        if self.on_forward is not None:
            self.on_forward(work)
        return self.model.forward(work) if work else []

    def execute(self, out: SchedulerOutput, tables) -> list:
        """The block moves in their order, the copy-on-write copies, then the forward; ``tables[rid]`` is a
        request's block table."""
        for kind, rid, blocks in out.block_ops:
            if kind == "out":
                self.host[rid] = self.model.read_blocks(blocks)
            else:
                self.model.write_blocks(blocks, self.host.pop(rid))
        for src, dst in out.copies:
            self.model.copy_block(src, dst)
        return self.forward(
            [
                (r.tokens[r.computed : r.computed + n], r.computed, slots, tables[r.rid].blocks)
                for r, n, slots in out.items
            ]
        )

    def read_kv(self, table, n: int):
        """A sequence's first ``n`` positions' keys and values: (layers, 2, n, heads, head_dim) on the host."""
        return torch.stack([torch.stack(self.model.gather(i, table, n)) for i in range(self.layers)]).numpy()

    def write_kv(self, slots, kv) -> None:
        """Keys and values computed elsewhere (``kv``: layers x 2 x n x heads x head_dim) into ``slots``."""
        sb = torch.tensor([b for b, _ in slots], dtype=torch.long)
        so = torch.tensor([o for _, o in slots], dtype=torch.long)
        for layer in range(self.layers):
            self.model.k[layer][sb, so] = torch.as_tensor(kv[layer, 0])
            self.model.v[layer][sb, so] = torch.as_tensor(kv[layer, 1])
