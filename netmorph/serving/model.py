"""The project's GPT served from a paged KV cache (vLLM's PagedAttention, in torch).

The cache is one tensor per layer for keys and one for values, ``(num_blocks,
block_size, heads, head_dim)``. A forward pass takes any mix of sequences, each with
some new tokens (a whole prompt, a prefill chunk, or one decode token) at known
positions: every new token's key and value are written into its slot (block,
offset) from the block manager, then each sequence's queries attend over its keys and
values **gathered through its block table** -- positions 0..p of the sequence, wherever
their blocks lie. The layers are the training model's own (:class:`netmorph.models.gpt.Block`,
a mixture of experts included) with the attention backend swapped for the paged one; their
linear layers run on all new tokens of the batch at once (the iteration-level batch of Orca /
vLLM), the attention per sequence.

:func:`generate_alone` is the reference: the same weights run as the training model
(:class:`netmorph.models.gpt.GPTStage`, causal ``scaled_dot_product_attention`` over
the whole sequence, no cache at all) one token at a time -- what every served request
must equal, token for token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from netmorph.mesh.shape import ModelShape
from netmorph.models.gpt import Block, GPTStage, PlainLayers, full_weights
from netmorph.models.moe import Router


def sample(logits: torch.Tensor, temperature: float, seed: int) -> int:
    """Greedy at temperature 0; else a draw seeded by (request, sample, position) -- the same draw whatever
    batch the token was computed in."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(logits.double() / temperature, dim=-1)
    return int(torch.multinomial(p, 1, generator=g))


class PagedGPT:
    """The training GPT's own blocks (:class:`netmorph.models.gpt.Block`, its weights from the same seed)
    with vLLM's attention backend swapped in: each layer writes its new keys and values into the paged cache
    and attends over the cache through each sequence's block table.

    ``layers``: how the blocks are built -- :class:`~netmorph.models.gpt.PlainLayers` on one rank, or training's
    :class:`~netmorph.parallel.tensor_parallel.TensorParallel` for Megatron's split: this rank keeps heads
    ``rank·heads/tp ...`` (the QKV rows and the projection's input columns of those heads; its KV cache holds
    only them) and a 1/tp slice of the MLP, and the row-parallel layers all-reduce their partial sums (Megatron's
    g) twice per layer. The word embedding and the final norm stay whole on every rank (every rank computes the
    logits and samples the same token)."""

    def __init__(self, cfg: ModelShape, num_blocks: int, block_size: int, dtype=torch.float64, layers=None):
        self.cfg, self.block_size = cfg, block_size
        w = full_weights(cfg, dtype)
        self.blocks = [Block(w, i, cfg, layers or PlainLayers(), Router(dropless=True)) for i in range(cfg.layers)]
        self.wte, self.wpe = w["wte"], w["wpe"]
        self.ln_f = PlainLayers().layer_norm(w["ln_f.w"], w["ln_f.b"])
        self.nh, self.hd = self.blocks[0].nh, cfg.hidden // cfg.heads
        shape = (num_blocks, block_size, self.nh, self.hd)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(cfg.layers)]

    def bytes_per_block(self) -> int:
        return 2 * self.cfg.layers * self.block_size * self.nh * self.hd * self.k[0].element_size()

    def copy_block(self, src: int, dst: int) -> None:
        for layer in range(self.cfg.layers):
            self.k[layer][dst].copy_(self.k[layer][src])
            self.v[layer][dst].copy_(self.v[layer][src])

    def read_blocks(self, blocks) -> list:
        """The contents of ``blocks`` (to the host pool when swapping out)."""
        idx = torch.tensor(blocks, dtype=torch.long)
        return [(self.k[i][idx].clone(), self.v[i][idx].clone()) for i in range(self.cfg.layers)]

    def write_blocks(self, blocks, saved) -> None:
        idx = torch.tensor(blocks, dtype=torch.long)
        for i, (k, v) in enumerate(saved):
            self.k[i][idx] = k
            self.v[i][idx] = v

    def slots(self, table, n: int):
        """(block, offset) of a sequence's positions 0 .. n-1 through its block table: two (n,) index tensors."""
        pos = torch.arange(n)
        return torch.as_tensor(table, dtype=torch.long)[pos // self.block_size], pos % self.block_size

    def gather(self, layer: int, table, n: int):
        """Keys and values of a sequence's first ``n`` positions, through its block table: (n, heads, hd)."""
        blocks, off = self.slots(table, n)
        return self.k[layer][blocks, off], self.v[layer][blocks, off]

    def reads(self, items) -> list:
        """Per item of an iteration, what every layer's attention reads: (its new tokens' start in the batch,
        their count, the block and offset of each position 0 .. first + n through its block table, and the
        causal mask (n, first + n), or None for one new token, which sees every position)."""
        out, start = [], 0
        for tokens, first, _, table in items:
            n = len(tokens)
            mask = None if n == 1 else torch.arange(first + n)[None, :] <= (first + torch.arange(n))[:, None]
            out.append((start, n, *self.slots(table, first + n), mask))
            start += n
        return out

    def attend(self, layer: int, reads, sb, so):
        """Layer ``layer``'s attention backend for one iteration: write every new token's key and value into
        its slot (block ``sb``, offset ``so``), then each sequence's queries over its keys and values gathered
        through its block table (positions 0 .. first + n of that sequence, wherever their blocks lie)."""

        def attend(q, k, v):  # each (1, nh, N, hd)
            kc, vc = self.k[layer], self.v[layer]
            kc[sb, so] = k[0].transpose(0, 1)  # (N, nh, hd)
            vc[sb, so] = v[0].transpose(0, 1)
            out = [
                F.scaled_dot_product_attention(
                    q[0, :, start : start + n],
                    kc[blocks, off].transpose(0, 1),
                    vc[blocks, off].transpose(0, 1),
                    attn_mask=mask,
                )
                for start, n, blocks, off, mask in reads
            ]  # each (nh, n, hd)
            return torch.cat(out, dim=1).unsqueeze(0)  # (1, nh, N, hd)

        return attend

    @torch.no_grad()
    def forward(self, items) -> list:
        """``items``: [(tokens, first position, slots [(block, offset)] for those tokens, block table)] -- the
        iteration-level batch, every new token of every sequence in one pass of the linear layers. Returns each
        item's logits for its last token (V,)."""
        toks = torch.tensor([t for it in items for t in it[0]], dtype=torch.long)
        pos = torch.tensor([it[1] + j for it in items for j in range(len(it[0]))], dtype=torch.long)
        slots = [s for it in items for s in it[2]]
        sb = torch.tensor([b for b, _ in slots], dtype=torch.long)
        so = torch.tensor([o for _, o in slots], dtype=torch.long)
        x = (self.wte[toks] + self.wpe[pos]).unsqueeze(1)  # (N, 1, h): the batch is one sequence
        reads = self.reads(items)
        for i, blk in enumerate(self.blocks):
            x = blk(x, self.attend(i, reads, sb, so))  # (N, 1, h)
            if blk.moe is not None:
                blk.stats.clear()  # the router's log: training's, not ours
                blk.aux.clear()
        ends = torch.tensor(list(_ends(items)), dtype=torch.long)
        last = self.ln_f(x[ends, 0])  # (items, h)
        return list(last @ self.wte.t())  # each (V,)


def _ends(items):
    n = 0
    for it in items:
        n += len(it[0])
        yield n - 1


@torch.no_grad()
def generate_alone(cfg: ModelShape, prompt, n_out: int, temperature: float = 0.0, seed: int = 0) -> list:
    """The reference: the training model over the whole sequence at every step, no cache."""
    model = GPTStage(cfg)
    seq = list(prompt)
    for _ in range(n_out):
        x = torch.tensor(seq, dtype=torch.long).unsqueeze(1)  # (T, 1)
        h = model.L.embed(model.wte, x, model.wpe)
        for blk in model.blocks:
            h = blk(h)
        logits = model.ln_f(h[-1, 0]) @ model.wte.t()  # (V,)
        seq.append(sample(logits, temperature, seed + len(seq)))
    return seq[len(prompt) :]
